/* t2_check: what the daemon asks of the cluster at start-up (t2_priv.h), so
 * that a mistake no retry mends stops it with the reason instead of every
 * copy failing later: credentials every master refuses, a user without a
 * right the second tier uses, a server that is not a cluster or not Redis.
 * A cluster that cannot be reached now is a warning: the daemon serves
 * locally and tries again.
 *
 * The rights are checked on every master (ACL users are per node in a
 * Redis Cluster), each with a probe key of its own slots: the commands the
 * library sends itself, one by one, and those its scripts run, in a script
 * that names the first one refused. The probe keys live under
 * k3:NS:r:{N}: and are deleted (or expire within a minute). In read-only
 * mode only what a lookup, a fetch and a listing send is checked, with
 * reads of probe keys that do not exist: such a daemon writes nothing, so
 * its user may have read rights alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "t2_priv.h"

/* Tags tried to find a probe key on every master: ample for hundreds. */
#define PROBE_TAGS 4096

/* The commands tier2 sends outside scripts, on a probe key of one slot:
 * %s is replaced by the key's stem (k3:NS:r:{N}). ASKING, which goes before
 * a command sent after an ASK, is sent alone. */
struct probe {
	const char *argv[8];
	int argc;
	int read; /* sent in read-only mode too */
};
static const struct probe probes[] = {
        {{"SET", "%s:str", "v", "EX", "60"}, 5, 0},
        {{"GET", "%s:str"}, 2, 1},
        {{"EXISTS", "%s:str"}, 2, 1},
        {{"EXPIRE", "%s:str", "60"}, 3, 0},
        {{"DEL", "%s:str"}, 2, 0},
        {{"HSET", "%s:hash", "f", "v"}, 4, 0},
        {{"EXPIRE", "%s:hash", "60"}, 3, 0}, /* gone in a minute whatever follows */
        {{"HGETALL", "%s:hash"}, 2, 1},
        {{"HDEL", "%s:hash", "f"}, 3, 0},
        {{"ZADD", "%s:zset", "1", "m"}, 4, 0},
        {{"EXPIRE", "%s:zset", "60"}, 3, 0},
        {{"ZRANGE", "%s:zset", "0", "-1"}, 4, 0}, /* the ledger: copies only */
        {{"ZREM", "%s:zset", "m"}, 3, 0},
        {{"RPUSH", "%s:list", "m"}, 3, 0},
        {{"EXPIRE", "%s:list", "60"}, 3, 0},
        {{"LRANGE", "%s:list", "0", "-1"}, 4, 0}, /* a put's intent: copies only */
        {{"DEL", "%s:list"}, 2, 0},
        {{"ASKING"}, 1, 1},
};

/* The commands the part scripts run (tier2_parts.c), each by pcall: the
 * first refused is answered with its name and Redis's reason. */
static const char script[] =
        "local s,k=KEYS[1],KEYS[2] "
        "local c={{'EXISTS',k},{'SET',k,'v','EX','60'},{'SADD',s,'m'},{'SCARD',s},"
        "{'TTL',k},{'PTTL',k},{'EXPIRE',k,'60'},{'PERSIST',s},{'PEXPIRE',s,'60000'},"
        "{'SREM',s,'m'},{'DEL',k},{'DEL',s}} "
        "for _,a in ipairs(c) do local r=redis.pcall(unpack(a)) "
        "if type(r)=='table' and r.err then redis.pcall('DEL',k,s) return {a[1],r.err} end end "
        "return 'OK'";

/* Whether an error's text is an ACL refusal (Redis 7.0 and 7.2 phrasings),
 * not a node's state: OOM, NOREPLICAS, MISCONF, CLUSTERDOWN, MOVED... pass. */
static int is_acl_text(const char *str, size_t len)
{
	char text[256];
	snprintf(text, sizeof(text), "%.*s", (int)(len < 255 ? len : 255), str);
	return !strncmp(text, "NOPERM", 6) || strstr(text, "can't run this command") ||
	       strstr(text, "no permissions") || strstr(text, "ACL failure");
}

static int is_noperm(const redisReply *rep)
{
	return rep->type == REDIS_REPLY_ERROR && rep->str && is_acl_text(rep->str, rep->len);
}

static void refused(const struct k3d_t2 *t, const char *at, const char *cmd, const char *why,
                    size_t len)
{
	k3d_log(K3D_LOG_ERROR,
	        "--tier2 %s: the cluster does not let --tier2-user %s run %s on the keys k3:%s:* "
	        "(master %s): %.*s (README, Second tier, lists the rights it needs; ACL users are "
	        "per node: create the user on every node)",
	        t->cfg.seeds, t->cfg.user ? t->cfg.user : "default", cmd, t->cfg.ns, at,
	        (int)(len < 240 ? len : 240), why);
}

/* Runs the probes on stem's slot: 0, 1 when a node did not answer (passed:
 * tried again as the daemon runs), -1 after logging a refusal. */
static int probe_master(const struct k3d_t2 *t, struct cluster_router *r, const char *stem,
                        const char *at)
{
	char keys[3][TIER2_NAME_MAX + 32];
	size_t nprobes = sizeof(probes) / sizeof(probes[0]);
	int read_only = t->cfg.mode == K3D_T2_READ_ONLY;
	/* the script's turn (i == nprobes) is write-back's alone */
	for (size_t i = 0; i < nprobes + !read_only; i++) {
		const char *argv[8];
		size_t lens[8];
		int argc;
		if (i < nprobes && read_only && !probes[i].read)
			continue;
		if (i < nprobes) {
			argc = probes[i].argc;
			for (int a = 0; a < argc; a++) {
				argv[a] = probes[i].argv[a];
				if (strstr(argv[a], "%s")) { /* the key: only argv[1] */
					snprintf(keys[0], sizeof(keys[0]), "%s%s", stem,
					         argv[a] + 2);
					argv[a] = keys[0];
				}
				lens[a] = strlen(argv[a]);
			}
		} else {
			snprintf(keys[1], sizeof(keys[1]), "%s:set", stem);
			snprintf(keys[2], sizeof(keys[2]), "%s:str", stem);
			argv[0] = "EVAL";
			argv[1] = script;
			argv[2] = "2";
			argv[3] = keys[1];
			argv[4] = keys[2];
			argc = 5;
			for (int a = 0; a < argc; a++)
				lens[a] = strlen(argv[a]);
		}
		/* ASKING has no key: routed by the stem's */
		const char *route = argc > 1 && i < nprobes ? argv[1] : stem;
		redisReply *rep = NULL;
		if (cluster_command_argv(r, route, strlen(route), argc, argv, lens, &rep) != 0)
			return 1;
		int bad = 0;
		if (is_noperm(rep)) {
			refused(t, at, argv[0], rep->str, rep->len);
			bad = 1;
		} else if (i == nprobes && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
		           rep->element[0]->type == REDIS_REPLY_STRING &&
		           rep->element[1]->type == REDIS_REPLY_STRING &&
		           is_acl_text(rep->element[1]->str, rep->element[1]->len)) {
			char cmd[64];
			snprintf(cmd, sizeof(cmd), "%.*s (in the scripts that keep MLA parts)",
			         (int)(rep->element[0]->len < 16 ? rep->element[0]->len : 16),
			         rep->element[0]->str);
			refused(t, at, cmd, rep->element[1]->str, rep->element[1]->len);
			bad = 1;
		}
		freeReplyObject(rep);
		if (bad)
			return -1;
	}
	return 0;
}

/* The rights on every master the map names, and SCAN on each. 0, or -1
 * after logging why. */
static int check_rights(const struct k3d_t2 *t, struct cluster_router *r, size_t masters)
{
	struct cluster_addr *done = calloc(masters ? masters : 1, sizeof(*done));
	if (!done)
		return 0; /* no memory to check with: the daemon's use will tell */
	size_t n_done = 0;
	int rc = 0;
	for (unsigned tag = 0; tag < PROBE_TAGS && n_done < masters && rc == 0; tag++) {
		char stem[TIER2_NAME_MAX + 16];
		int len = snprintf(stem, sizeof(stem), "k3:%s:r:{%u}", t->cfg.ns, tag);
		struct cluster_addr a;
		/* the slot is the tag's: {N} is the key's hash tag */
		if (cluster_slot_node(r, cluster_key_slot(stem, (size_t)len), &a) != 0)
			continue;
		int seen = 0;
		for (size_t i = 0; i < n_done && !seen; i++)
			seen = done[i].port == a.port && !strcmp(done[i].host, a.host);
		if (seen)
			continue;
		done[n_done++] = a;
		char at[CLUSTER_HOST_MAX + 16];
		snprintf(at, sizeof(at), "%s:%d", a.host, a.port);
		uint64_t refused_before = cluster_stats(r).auth_refused;
		rc = probe_master(t, r, stem, at) < 0 ? -1 : 0;
		if (rc == 0 && cluster_stats(r).auth_refused != refused_before) {
			k3d_log(K3D_LOG_ERROR,
			        "--tier2 %s: master %s refuses our credentials: %s (check "
			        "--tier2-user and --tier2-password-file; ACL users are per node: "
			        "create the user on every node)",
			        t->cfg.seeds, at, cluster_error(r));
			rc = -1;
		}
	}
	free(done);
	for (size_t m = 0; m < masters && rc == 0; m++) {
		char pattern[TIER2_NAME_MAX + 16];
		snprintf(pattern, sizeof(pattern), "k3:%s:r:*", t->cfg.ns);
		const char *argv[] = {"SCAN", "0", "MATCH", pattern, "COUNT", "1"};
		const size_t lens[] = {4, 1, 5, strlen(pattern), 5, 1};
		redisReply *rep = NULL;
		if (cluster_command_node(r, m, 6, argv, lens, &rep) != 0)
			continue;
		if (is_noperm(rep)) {
			char at[32];
			snprintf(at, sizeof(at), "number %zu", m);
			refused(t, at, "SCAN", rep->str, rep->len);
			rc = -1;
		}
		freeReplyObject(rep);
	}
	return rc;
}

int t2_check_cluster(struct k3d_t2 *t, struct cluster_router *r, size_t *masters)
{
	*masters = 0;
	const char *seeds = t->cfg.seeds;
	if (cluster_refresh(r) == 0) {
		*masters = cluster_n_masters(r);
		return check_rights(t, r, *masters);
	}
	const char *why = cluster_error(r);
	/* answers that no retry mends: what the router said, what to do */
	static const struct {
		const char *said; /* NULL: AUTH refused (the router counted it) */
		const char *what, *advice;
	} fatal[] = {
	        {NULL, "the cluster refuses our credentials",
	         "check --tier2-user and --tier2-password-file"},
	        {"cluster support disabled", "not a Redis Cluster",
	         "the second tier needs a cluster: cluster-enabled yes, made with redis-cli "
	         "--cluster create"},
	        {"NOPERM", "the cluster does not let --tier2-user read its slot map",
	         "it needs +cluster|slots; README, Second tier, lists the rights"},
	        {"protocol error", "not a Redis server",
	         "the seeds must be Redis Cluster nodes' HOST:PORT"},
	};
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++) {
		if (fatal[i].said ? !strstr(why, fatal[i].said) : !cluster_stats(r).auth_refused)
			continue;
		k3d_log(K3D_LOG_ERROR, "--tier2 %s: %s (%s): %s", seeds, fatal[i].what, why,
		        fatal[i].advice);
		return -1;
	}
	k3d_log(K3D_LOG_WARN,
	        "--tier2 %s: the cluster cannot be reached now (%s); serving from the local "
	        "store and trying again",
	        seeds, why);
	return 0;
}
