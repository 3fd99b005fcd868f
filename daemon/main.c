/* k3cached: the k3cache daemon. Runs in the foreground, logs to stderr, stops
 * cleanly on SIGTERM/SIGINT. */
#include <event2/util.h>
#include <getopt.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "paths.h"
#include "tier2/tier2.h"
#include "units.h"

/* Streaming restores at most: half the store's reader slots, the rest left
 * to lookups, direct readers and k3cachectl (store.h). */
#define MAX_RESTORES      (STORE_MAX_READERS / 2)
#define MAX_RESTORES_TEXT "256"
_Static_assert(MAX_RESTORES == 256, "MAX_RESTORES_TEXT says MAX_RESTORES");

static void usage(FILE *f, const char *db, const char *sock)
{
	fprintf(f,
	        "usage: k3cached [--db DIR] [--socket PATH] [options]\n"
	        "\n"
	        "A prefix-cache daemon with a persistent LMDB store of KDA/MLA layer state.\n"
	        "\n"
	        "  --db DIR              store directory (default %s),\n"
	        "                        created if missing; the directory it is in must\n"
	        "                        exist, unless DIR is the default\n"
	        "  --socket PATH         Unix socket, mode 0660 (default %s);\n"
	        "                        its directory must exist, unless PATH is the default\n"
	        "  --listen HOST:PORT    also listen on TCP. HOST is numeric (127.0.0.1,\n"
	        "                        0.0.0.0, [::1], [::]) or localhost; :PORT is\n"
	        "                        127.0.0.1. PORT is 1 to 65535\n"
	        "  --max-bytes SIZE      capacity for snapshot bytes; LRU eviction past it\n"
	        "                        (default 1GiB). A store over it at start-up is\n"
	        "                        brought under it by the next publish\n"
	        "  --durability MODE     safe (default: a power loss may drop the last commit),\n"
	        "                        strict (sync every commit), fast (sync every\n"
	        "                        --sync-interval; survives process crashes)\n"
	        "  --max-payload SIZE    largest publish payload accepted (default 2GiB)\n"
	        "  --max-inflight SIZE   payload bytes held for publishes at once (a large\n"
	        "                        one holds its window); past it, connections wait\n"
	        "                        (default 2GiB); it bounds large request headers\n"
	        "                        apart (past it: BUSY)\n"
	        "  --max-restores N      restores streaming at once, 1 to " MAX_RESTORES_TEXT
	        "; past it BUSY\n"
	        "                        (default 64)\n"
	        "  --max-restores-per-tenant N  of those, what one tenant (a uid, a token's\n"
	        "                        name; admins are one) may hold, 1 to --max-restores\n"
	        "                        (default: all but a quarter, at least 1)\n"
	        "  --stage-size SIZE     a publish larger than this is written as it arrives,\n"
	        "                        a stage of this size per commit, through a window\n"
	        "                        of 3 such stages (each at least 1MiB) (default 16MiB)\n"
	        "  --row-block N         rows per shared MLA block of a new store, a multiple\n"
	        "                        of 16 up to 65536 (default 64; a store keeps its own)\n"
	        "  --yield-rate SIZE     while lookups arrive, read each publish upload at\n"
	        "                        most SIZE per second, so that uploads do not crowd\n"
	        "                        lookups off the CPU (default 1GiB; 0: no limit)\n"
	        "  --min-upload-rate SIZE  close a publish whose upload (or a header) falls under\n"
	        "                        SIZE per second, averaged over 10 s of reading\n"
	        "                        (default 1MiB; 0: never)\n"
	        "  --min-download-rate SIZE  close a connection that reads its restore slower\n"
	        "                        than SIZE per second, averaged over 10 s in which it\n"
	        "                        waited on the client (default 1MiB; 0: never)\n"
	        "  --idle-timeout DUR    close connections idle this long (default 300s)\n"
	        "  --stall-timeout DUR   close connections stalled mid-frame or mid-reply\n"
	        "                        this long (default 30s), and publishes that waited\n"
	        "                        4 times as long for the store to take any of their\n"
	        "                        receive window (a disk that hangs)\n"
	        "  --sync-interval DUR   with --durability fast (default 1s)\n"
	        "  --admin-group GROUP   its members may run admin ops (ls, inspect, export,\n"
	        "                        evict, verify, model add), as root and the daemon's\n"
	        "                        own user may; other peers get DENIED for them\n"
	        "  --share-uids U1,U2,.. these uids share one namespace (U1's): each sees\n"
	        "                        the others' entries (repeatable, one group each)\n"
	        "  --token-file FILE     lines \"NAME TOKEN [admin]\": a TCP client sends its\n"
	        "                        TOKEN in Hello ($K3CACHE_TOKEN) and gets namespace NAME;\n"
	        "                        required with --listen\n"
	        "  --insecure-tcp        allow --listen without --token-file on a loopback\n"
	        "                        address: every TCP client is then an admin\n"
	        "  --check-at-open WHEN  walk the store file's structure before opening it:\n"
	        "                        always (default), unclean (only after a stop that\n"
	        "                        was not clean) or never (a damaged file can then\n"
	        "                        crash the daemon)\n"
	        "  --metrics HOST:PORT   serve Prometheus text at http://HOST:PORT/metrics\n"
	        "                        (HOST and PORT as for --listen)\n"
	        "  --tier2 redis://HOST:PORT[,HOST:PORT...]\n"
	        "                        a second tier on a Redis Cluster (seed nodes): each\n"
	        "                        publish is copied there in the background, and a\n"
	        "                        lookup fetches a longer prefix from there\n"
	        "  --tier2-user NAME     the cluster's ACL user (default: AUTH with the\n"
	        "                        password alone)\n"
	        "  --tier2-password-file FILE  the cluster's password, alone on the file's\n"
	        "                        first line (never on the command line)\n"
	        "  --tier2-max-bytes SIZE  what this daemon may occupy in the cluster; its\n"
	        "                        oldest entries there go first (default --max-bytes)\n"
	        "  --tier2-mode MODE     write-back (default: copy publishes, fetch on\n"
	        "                        lookups) or read-only (fetch only)\n"
	        "  --tier2-namespace NS  key prefix in the cluster, [A-Za-z0-9._-], so that\n"
	        "                        fleets can share one (default k3cache)\n"
	        "  --tier2-owner NAME    this daemon's name for its budget's ledger in the\n"
	        "                        cluster (default: host name and store path hash)\n"
	        "  --tier2-timeout MS    deadline of each cluster round trip, 1ms to 60s\n"
	        "                        (a bare number: ms; default 500)\n"
	        "  --tier2-wait MS       how long a lookup waits for the cluster's answer\n"
	        "                        before answering from the local store, 1ms to 60s\n"
	        "                        (a bare number: ms; default 20);\n"
	        "                        once a longer entry is found it waits for its fetch\n"
	        "                        (at most --stall-timeout)\n"
	        "  --tier2-queue-wait MS how long a lookup may wait, by the last fetches'\n"
	        "                        times, for fetches ahead of its own, 1ms to 600s\n"
	        "                        (a bare number: ms; default 5s); past it,\n"
	        "                        answered locally at once\n"
	        "  --log-level LEVEL     error, warn, info (default) or debug (also each\n"
	        "                        connection's changes of state)\n"
	        "  --help                this text\n"
	        "  --version             print k3cached's version\n"
	        "\n"
	        "SIZE takes K/M/G/T or KiB/MiB/GiB/TiB; DUR takes s/m/h/d. SIGTERM or SIGINT\n"
	        "stops the daemon cleanly; SIGHUP is logged and ignored (no configuration file\n"
	        "to reload). A bad flag exits 2; a start-up failure exits 1; a damaged store\n"
	        "exits 3 (see k3cachectl salvage). On the Unix socket each client's uid is\n"
	        "its namespace: its entries are not seen by other uids (admins see all).\n",
	        db, sock);
}

/* 127.0.0.0/8 or ::1 */
static int is_loopback(const struct k3d_addr *a)
{
	if (a->sa.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&a->sa;
		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (a->sa.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->sa;
		return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
	}
	return 0;
}

static int bad(const char *flag, const char *val, const char *want)
{
	fprintf(stderr, "k3cached: %s %s: expected %s\n", flag, val, want);
	return 2;
}

/* A size or duration flag that needs more than 0, refused with rc (-1 or
 * UNITS_ZERO from a _nonzero parser): says so when the value came to 0. */
static int bad_nonzero(const char *flag, const char *val, int rc, const char *unit,
                       const char *want)
{
	char why[160];
	if (rc != UNITS_ZERO)
		return bad(flag, val, want);
	fprintf(stderr, "k3cached: %s %s: %s; expected %s\n", flag, val,
	        units_zero_reason(val, unit, why, sizeof(why)), want);
	return 2;
}

/* The largest --max-bytes: the store maps twice the capacity (and 64 MiB), a
 * size that must not wrap around 2^64. */
#define MAX_CAPACITY (UINT64_C(1) << 60)

/* --listen and --metrics: HOST:PORT, [IPV6]:PORT, or :PORT (or a PORT alone)
 * for 127.0.0.1. HOST is a numeric address or "localhost" (127.0.0.1): names
 * are not resolved. PORT is 1 to 65535. 0, or 2 after saying what is wrong. */
static int parse_addr(const char *flag, const char *s, struct k3d_addr *a)
{
	char host[128];
	const char *port;
	const char *colon = strrchr(s, ':');
	size_t n;
	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			return bad(flag, s, "[IPV6]:PORT, such as [::1]:9100");
		n = (size_t)(rb + 1 - s);
		port = rb + 2;
	} else if (colon) {
		n = (size_t)(colon - s);
		if (memchr(s, ':', n))
			return bad(flag, s, "an IPv6 address in brackets, such as [::1]:9100");
		port = colon + 1;
	} else {
		n = 0;
		port = s;
	}
	uint64_t p;
	if (units_parse_uint(port, 1, 65535, &p))
		return bad(flag, s, "HOST:PORT or :PORT with a PORT from 1 to 65535");
	if (n >= sizeof(host))
		return bad(flag, s, "a numeric HOST such as 127.0.0.1");
	memcpy(host, s, n);
	host[n] = 0;
	if (n == 0 || !strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	memset(&a->sa, 0, sizeof(a->sa));
	a->len = (int)sizeof(a->sa);
	if (evutil_parse_sockaddr_port(host, (struct sockaddr *)&a->sa, &a->len) != 0)
		return bad(flag, s,
		           "a numeric HOST such as 127.0.0.1, 0.0.0.0, [::1] or [::] "
		           "(or localhost; names are not resolved)");
	if (a->sa.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&a->sa)->sin6_port = htons((uint16_t)p);
	else
		((struct sockaddr_in *)&a->sa)->sin_port = htons((uint16_t)p);
	a->text = s;
	return 0;
}

int main(int argc, char **argv)
{
	static char dbbuf[4096], sockbuf[4096];
	struct k3d_config cfg = {
	        .db = paths_default_db(dbbuf, sizeof(dbbuf)),
	        .socket = paths_default_socket(sockbuf, sizeof(sockbuf)),
	        .max_bytes = 1ull << 30,
	        .max_payload = 2ull << 30,
	        .max_inflight = 2ull << 30,
	        .yield_rate = 1ull << 30,
	        .min_upload_rate = 1ull << 20,
	        .min_download_rate = 1ull << 20,
	        .max_restores = 64,
	        .idle_timeout = 300,
	        .stall_timeout = 30,
	        .sync_interval = 1,
	        .durability = STORE_SAFE,
	        .log_level = K3D_LOG_INFO,
	        .t2 = {.ns = K3D_T2_NS_DEFAULT,
	               .timeout_ms = 500,
	               .wait_ms = 20,
	               .queue_wait_ms = 5000},
	};
	const char *t2_flag = NULL; /* a --tier2-* flag given, for the check below */
	enum {
		O_DB = 1,
		O_SOCK,
		O_LISTEN,
		O_MAXB,
		O_DUR,
		O_METRICS,
		O_MAXP,
		O_INFL,
		O_STAGE,
		O_ROWB,
		O_YIELD,
		O_MAXR,
		O_MAXR_TENANT,
		O_IDLE,
		O_STALL,
		O_SYNC,
		O_LOG,
		O_CHECK,
		O_MINRATE,
		O_MINDOWN,
		O_ADMIN,
		O_SHARE,
		O_TOKENS,
		O_INSECURE,
		O_T2,
		O_T2_USER,
		O_T2_PASS,
		O_T2_MAXB,
		O_T2_MODE,
		O_T2_NS,
		O_T2_OWNER,
		O_T2_TIMEOUT,
		O_T2_WAIT,
		O_T2_QUEUE_WAIT,
		O_HELP,
		O_VERSION
	};
	static const struct option opts[] = {
	        {"db", required_argument, NULL, O_DB},
	        {"socket", required_argument, NULL, O_SOCK},
	        {"listen", required_argument, NULL, O_LISTEN},
	        {"max-bytes", required_argument, NULL, O_MAXB},
	        {"durability", required_argument, NULL, O_DUR},
	        {"metrics", required_argument, NULL, O_METRICS},
	        {"max-payload", required_argument, NULL, O_MAXP},
	        {"max-inflight", required_argument, NULL, O_INFL},
	        {"stage-size", required_argument, NULL, O_STAGE},
	        {"row-block", required_argument, NULL, O_ROWB},
	        {"yield-rate", required_argument, NULL, O_YIELD},
	        {"max-restores", required_argument, NULL, O_MAXR},
	        {"max-restores-per-tenant", required_argument, NULL, O_MAXR_TENANT},
	        {"idle-timeout", required_argument, NULL, O_IDLE},
	        {"stall-timeout", required_argument, NULL, O_STALL},
	        {"sync-interval", required_argument, NULL, O_SYNC},
	        {"log-level", required_argument, NULL, O_LOG},
	        {"check-at-open", required_argument, NULL, O_CHECK},
	        {"min-upload-rate", required_argument, NULL, O_MINRATE},
	        {"min-download-rate", required_argument, NULL, O_MINDOWN},
	        {"admin-group", required_argument, NULL, O_ADMIN},
	        {"share-uids", required_argument, NULL, O_SHARE},
	        {"token-file", required_argument, NULL, O_TOKENS},
	        {"insecure-tcp", no_argument, NULL, O_INSECURE},
	        {"tier2", required_argument, NULL, O_T2},
	        {"tier2-user", required_argument, NULL, O_T2_USER},
	        {"tier2-password-file", required_argument, NULL, O_T2_PASS},
	        {"tier2-max-bytes", required_argument, NULL, O_T2_MAXB},
	        {"tier2-mode", required_argument, NULL, O_T2_MODE},
	        {"tier2-namespace", required_argument, NULL, O_T2_NS},
	        {"tier2-owner", required_argument, NULL, O_T2_OWNER},
	        {"tier2-timeout", required_argument, NULL, O_T2_TIMEOUT},
	        {"tier2-wait", required_argument, NULL, O_T2_WAIT},
	        {"tier2-queue-wait", required_argument, NULL, O_T2_QUEUE_WAIT},
	        {"help", no_argument, NULL, O_HELP},
	        {"version", no_argument, NULL, O_VERSION},
	        {NULL, 0, NULL, 0},
	};
	const char *env = getenv("K3CACHE_SOCKET"); /* paths_default_socket() takes it */
	if (env && *env)
		cfg.socket_origin = "$K3CACHE_SOCKET";
	int c, rc; /* rc: a _nonzero parser's answer */
	uint64_t v;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_DB:
			cfg.db = optarg;
			cfg.db_origin = "--db";
			break;
		case O_SOCK:
			cfg.socket = optarg;
			cfg.socket_origin = "--socket";
			break;
		case O_LISTEN:
			if (parse_addr("--listen", optarg, &cfg.listen))
				return 2;
			break;
		case O_METRICS:
			if (parse_addr("--metrics", optarg, &cfg.metrics))
				return 2;
			break;
		case O_MAXB:
			if ((rc = units_parse_size_nonzero(optarg, &cfg.max_bytes)) ||
			    cfg.max_bytes > MAX_CAPACITY)
				return bad_nonzero("--max-bytes", optarg, rc, "bytes",
				                   "a size such as 64GiB, at most 1048576TiB");
			break;
		case O_MAXP:
			if ((rc = units_parse_size_nonzero(optarg, &cfg.max_payload)))
				return bad_nonzero("--max-payload", optarg, rc, "bytes",
				                   "a size such as 1GiB");
			break;
		case O_STAGE:
			if ((rc = units_parse_size_nonzero(optarg, &cfg.stage_bytes)))
				return bad_nonzero("--stage-size", optarg, rc, "bytes",
				                   "a size such as 32MiB");
			break;
		case O_ROWB: {
			uint64_t v;
			if (units_parse_uint(optarg, 16, 65536, &v) || v % 16)
				return bad("--row-block", optarg,
				           "a multiple of 16 from 16 to 65536");
			cfg.row_block = (uint32_t)v;
			break;
		}
		case O_YIELD:
			if (units_parse_size(optarg, &cfg.yield_rate))
				return bad("--yield-rate", optarg,
				           "a size per second such as 1GiB, or 0");
			break;
		case O_INFL:
			if ((rc = units_parse_size_nonzero(optarg, &cfg.max_inflight)))
				return bad_nonzero("--max-inflight", optarg, rc, "bytes",
				                   "a size such as 2GiB");
			break;
		case O_MAXR:
			if (units_parse_uint(optarg, 1, UINT64_MAX, &v))
				return bad("--max-restores", optarg,
				           "a number from 1 to " MAX_RESTORES_TEXT);
			if (v > MAX_RESTORES)
				return bad(
				        "--max-restores", optarg,
				        "a number from 1 to " MAX_RESTORES_TEXT
				        ": each streaming restore holds one of the store's reader "
				        "slots, which lookups, direct readers and k3cachectl "
				        "share");
			cfg.max_restores = (uint32_t)v;
			break;
		case O_MAXR_TENANT:
			if (units_parse_uint(optarg, 1, 100000, &v))
				return bad("--max-restores-per-tenant", optarg,
				           "a number from 1 to --max-restores");
			cfg.max_restores_per_tenant = (uint32_t)v;
			break;
		case O_IDLE:
			if ((rc = units_parse_duration_nonzero(optarg, &cfg.idle_timeout)))
				return bad_nonzero("--idle-timeout", optarg, rc, "seconds",
				                   "a duration such as 5m");
			break;
		case O_STALL:
			if ((rc = units_parse_duration_nonzero(optarg, &cfg.stall_timeout)))
				return bad_nonzero("--stall-timeout", optarg, rc, "seconds",
				                   "a duration such as 30s");
			break;
		case O_SYNC:
			if ((rc = units_parse_duration_nonzero(optarg, &cfg.sync_interval)))
				return bad_nonzero("--sync-interval", optarg, rc, "seconds",
				                   "a duration such as 1s");
			break;
		case O_DUR:
			if (store_durability_parse(optarg, &cfg.durability))
				return bad("--durability", optarg, "safe, strict or fast");
			break;
		case O_ADMIN:
			cfg.admin_group = optarg;
			break;
		case O_SHARE: {
			/* this list after the earlier ones: a uid in two of them
			 * would keep only the last one's namespace */
			struct k3d_tenancy probe = {0};
			uint32_t twice = 0;
			int list_rc = 0;
			for (int i = 0; !list_rc && i < cfg.n_share_uids; i++)
				list_rc = k3d_tenancy_share(&probe, cfg.share_uids[i], &twice);
			if (!list_rc)
				list_rc = k3d_tenancy_share(&probe, optarg, &twice);
			k3d_tenancy_free(&probe);
			if (list_rc == K3D_SHARE_TWICE) {
				fprintf(stderr,
				        "k3cached: --share-uids %s: uid %u is in an earlier list "
				        "or "
				        "twice in this one: a uid goes in one list only (one "
				        "namespace)\n",
				        optarg, (unsigned)twice);
				return 2;
			}
			int bad_list = list_rc != 0;
			if (bad_list || cfg.n_share_uids == 16)
				return bad(
				        "--share-uids", optarg,
				        "two or more uids separated by commas (at most 16 lists)");
			cfg.share_uids[cfg.n_share_uids++] = optarg;
			break;
		}
		case O_TOKENS:
			cfg.token_file = optarg;
			break;
		case O_INSECURE:
			cfg.insecure_tcp = 1;
			break;
		case O_MINRATE:
			if (units_parse_size(optarg, &cfg.min_upload_rate))
				return bad("--min-upload-rate", optarg,
				           "a size per second such as 1MiB, or 0");
			break;
		case O_MINDOWN:
			if (units_parse_size(optarg, &cfg.min_download_rate))
				return bad("--min-download-rate", optarg,
				           "a size per second such as 1MiB, or 0");
			break;
		case O_CHECK:
			if (store_check_parse(optarg, &cfg.check))
				return bad("--check-at-open", optarg, "always, unclean or never");
			break;
		case O_LOG:
			if (!strcmp(optarg, "error"))
				cfg.log_level = K3D_LOG_ERROR;
			else if (!strcmp(optarg, "warn"))
				cfg.log_level = K3D_LOG_WARN;
			else if (!strcmp(optarg, "info"))
				cfg.log_level = K3D_LOG_INFO;
			else if (!strcmp(optarg, "debug"))
				cfg.log_level = K3D_LOG_DEBUG;
			else
				return bad("--log-level", optarg, "error, warn, info or debug");
			break;
		case O_T2: {
			struct cluster_seeds seeds;
			char err[256];
			if (strchr(optarg, '@')) { /* never echo a password */
				fprintf(stderr, "k3cached: --tier2: a seed holds a user or "
				                "password (\"...@\"): "
				                "give them with --tier2-user and "
				                "--tier2-password-file, never "
				                "in the seed list\n");
				return 2;
			}
			if (cluster_seeds_parse(optarg, &seeds, err, sizeof(err)) != 0) {
				fprintf(stderr, "k3cached: --tier2 %s: %s\n", optarg, err);
				return 2;
			}
			cfg.t2.seeds = optarg;
			break;
		}
		case O_T2_USER:
			cfg.t2.user = optarg;
			t2_flag = "--tier2-user";
			break;
		case O_T2_PASS:
			cfg.t2.password_file = optarg;
			t2_flag = "--tier2-password-file";
			break;
		case O_T2_MAXB:
			if ((rc = units_parse_size_nonzero(optarg, &cfg.t2.max_bytes)))
				return bad_nonzero("--tier2-max-bytes", optarg, rc, "bytes",
				                   "a size such as 64GiB");
			t2_flag = "--tier2-max-bytes";
			break;
		case O_T2_MODE:
			if (!strcmp(optarg, "write-back"))
				cfg.t2.mode = K3D_T2_WRITE_BACK;
			else if (!strcmp(optarg, "read-only"))
				cfg.t2.mode = K3D_T2_READ_ONLY;
			else
				return bad("--tier2-mode", optarg, "write-back or read-only");
			t2_flag = "--tier2-mode";
			break;
		case O_T2_NS:
		case O_T2_OWNER: {
			char err[256];
			const char *flag = c == O_T2_NS ? "--tier2-namespace" : "--tier2-owner";
			if (tier2_ns_check(optarg, err, sizeof(err)) != 0)
				return bad(flag, optarg, "1 to 64 characters of A-Z a-z 0-9 . _ -");
			*(c == O_T2_NS ? &cfg.t2.ns : &cfg.t2.owner) = optarg;
			t2_flag = flag;
			break;
		}
		case O_T2_TIMEOUT:
		case O_T2_WAIT: {
			const char *flag = c == O_T2_TIMEOUT ? "--tier2-timeout" : "--tier2-wait";
			if (units_parse_ms(optarg, &v) || v < 1 || v > 60000)
				return bad(flag, optarg,
				           "a time from 1ms to 60s (a bare number: ms)");
			*(c == O_T2_TIMEOUT ? &cfg.t2.timeout_ms : &cfg.t2.wait_ms) = (uint32_t)v;
			t2_flag = flag;
			break;
		}
		case O_T2_QUEUE_WAIT:
			if (units_parse_ms(optarg, &v) || v < 1 || v > 600000)
				return bad("--tier2-queue-wait", optarg,
				           "a time from 1ms to 600s (a bare number: ms)");
			cfg.t2.queue_wait_ms = (uint32_t)v;
			t2_flag = "--tier2-queue-wait";
			break;
		case O_HELP:
		case 'h':
			usage(stdout, cfg.db, cfg.socket);
			return 0;
		case O_VERSION:
			puts(K3D_VERSION);
			return 0;
		default: /* getopt said which */
			fputs("k3cached: run 'k3cached --help' for its flags\n", stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr,
		        "k3cached: unexpected argument \"%s\" (it takes flags only); run 'k3cached "
		        "--help' for them\n",
		        argv[optind]);
		return 2;
	}
	if (!cfg.max_restores_per_tenant) /* a quarter left for the others */
		cfg.max_restores_per_tenant =
		        cfg.max_restores - (cfg.max_restores >= 8 ? cfg.max_restores / 4 : 1);
	if (!cfg.max_restores_per_tenant)
		cfg.max_restores_per_tenant = 1;
	if (cfg.max_restores_per_tenant > cfg.max_restores) {
		fprintf(stderr,
		        "k3cached: --max-restores-per-tenant %u is over --max-restores %u: a "
		        "tenant "
		        "holds at most what all may\n",
		        cfg.max_restores_per_tenant, cfg.max_restores);
		return 2;
	}
	if (t2_flag && !cfg.t2.seeds) {
		fprintf(stderr,
		        "k3cached: %s needs --tier2 redis://HOST:PORT (the cluster's seed nodes)\n",
		        t2_flag);
		return 2;
	}
	if (cfg.t2.user && !cfg.t2.password_file) {
		fprintf(stderr, "k3cached: --tier2-user needs --tier2-password-file\n");
		return 2;
	}
	if (cfg.listen.text && !cfg.token_file && !(cfg.insecure_tcp && is_loopback(&cfg.listen))) {
		fprintf(stderr,
		        "k3cached: --listen %s: TCP clients have no uid to tell them apart: give "
		        "--token-file FILE (lines NAME TOKEN [admin]), or, on a loopback address "
		        "only, --insecure-tcp\n",
		        cfg.listen.text);
		return 2;
	}
	/* Keep freed payload memory in the heap: the VM hands pages back to the
	 * host, and faulting 600 MiB in again for the next publish is slow. */
	mallopt(M_MMAP_MAX, 0);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	return k3d_server_run(&cfg);
}
