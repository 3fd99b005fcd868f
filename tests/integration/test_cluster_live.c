/* cluster: the tier-2 router against a real 3-master Redis Cluster started
 * here (tests/integration/clusterutil.h), and against fake nodes that answer
 * with a huge array or not at all. Without redis-server and redis-cli on
 * PATH, the real-cluster part is skipped (exit 77). This program's own
 * setsockopt and poll (below) stand in for libc's, so that a test can make
 * them fail. */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "clusterutil.h"
#include "tier2/cluster.h"

static struct clusterutil cl;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct cluster_router *router(const struct cluster_options *o)
{
	char seeds[128], err[256] = "";
	/* the second node first: the map must not depend on which seed answers */
	snprintf(seeds, sizeof(seeds), "redis://127.0.0.1:%d,127.0.0.1:%d", cl.port[1], cl.port[0]);
	struct cluster_router *r = cluster_router_new(seeds, o, err, sizeof(err));
	if (!r)
		fail_msg("router: %s", err);
	return r;
}

/* A command with a key as its second argument; the reply, or a failure. */
static redisReply *cmd(struct cluster_router *r, const char *c, const char *key, const char *val)
{
	const char *argv[3] = {c, key, val};
	size_t lens[3] = {strlen(c), strlen(key), val ? strlen(val) : 0};
	redisReply *rep = NULL;
	if (cluster_command_argv(r, key, strlen(key), val ? 3 : 2, argv, lens, &rep) != 0)
		fail_msg("%s %s: %s", c, key, cluster_error(r));
	return rep;
}

static void want_str(redisReply *rep, const char *want)
{
	if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != strlen(want) ||
	    memcmp(rep->str, want, rep->len) != 0)
		fail_msg("reply is type %d \"%s\", want \"%s\"", rep ? rep->type : -1,
		         rep && rep->str ? rep->str : "", want);
	freeReplyObject(rep);
}

static void want_ok(redisReply *rep)
{
	if (!rep || rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "OK") != 0)
		fail_msg("reply is type %d \"%s\", want OK", rep ? rep->type : -1,
		         rep && rep->str ? rep->str : "");
	freeReplyObject(rep);
}

/* The router's message says want, printf-style. */
static void error_says(const struct cluster_router *r, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
static void error_says(const struct cluster_router *r, const char *fmt, ...)
{
	char want[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(want, sizeof(want), fmt, ap);
	va_end(ap);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
}

/* Keys in node i's DBSIZE. */
static long long dbsize(int i)
{
	char n[32] = "";
	if (clusterutil_cmd(&cl, i, n, sizeof(n), "DBSIZE") != 0)
		fail_msg("DBSIZE on node %d", cl.port[i]);
	return strtoll(n, NULL, 10);
}

static void test_set_get_spread(void **state)
{
	(void)state;
	struct cluster_router *r = router(NULL);
	char key[64], val[64];
	for (int i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "spread:%d", i);
		snprintf(val, sizeof(val), "value-%d", i * 7);
		want_ok(cmd(r, "SET", key, val));
	}
	for (int i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "spread:%d", i);
		snprintf(val, sizeof(val), "value-%d", i * 7);
		want_str(cmd(r, "GET", key, NULL), val);
	}
	/* every master holds some, and they hold them all */
	long long total = 0;
	for (int i = 0; i < cl.n; i++) {
		long long k = dbsize(i);
		if (k == 0)
			fail_msg("node %d holds none of the 200 keys", cl.port[i]);
		total += k;
	}
	assert_int_equal(total, 200);
	/* the map is the cluster's */
	struct cluster_addr a;
	assert_int_equal(cluster_slot_node(r, 0, &a), 0);
	assert_string_equal(a.host, "127.0.0.1");
	for (int i = 0; i < 200; i += 7) {
		/* the node the map gives holds the key itself */
		snprintf(key, sizeof(key), "spread:%d", i);
		assert_int_equal(cluster_slot_node(r, cluster_key_slot(key, strlen(key)), &a), 0);
		int node = clusterutil_index(&cl, a.port);
		assert_true(node >= 0);
		char one[16] = "";
		if (clusterutil_cmd(&cl, node, one, sizeof(one), "EXISTS %s", key) != 0 ||
		    strcmp(one, "1") != 0)
			fail_msg("%s is not on node %d, which the map gives", key, a.port);
	}
	/* a pipeline of 200 GETs and 10 SETs over all nodes */
	struct cluster_cmd cmds[210];
	char keys[210][32], vals[10][16];
	const char *argv[210][3];
	size_t lens[210][3];
	for (int i = 0; i < 210; i++) {
		if (i < 200) {
			snprintf(keys[i], sizeof(keys[i]), "spread:%d", i);
			argv[i][0] = "GET";
		} else {
			snprintf(keys[i], sizeof(keys[i]), "piped:%d", i);
			snprintf(vals[i - 200], sizeof(vals[i - 200]), "p%d", i);
			argv[i][0] = "SET";
			argv[i][2] = vals[i - 200];
			lens[i][2] = strlen(vals[i - 200]);
		}
		argv[i][1] = keys[i];
		lens[i][0] = 3;
		lens[i][1] = strlen(keys[i]);
		cmds[i] = (struct cluster_cmd){
		        keys[i], lens[i][1], i < 200 ? 2 : 3, argv[i], lens[i], NULL, 0};
	}
	assert_int_equal(cluster_pipeline(r, cmds, 210), 0);
	for (int i = 0; i < 210; i++) {
		if (i < 200) {
			snprintf(val, sizeof(val), "value-%d", i * 7);
			want_str(cmds[i].reply, val);
		} else {
			want_ok(cmds[i].reply);
			snprintf(val, sizeof(val), "p%d", i);
			want_str(cmd(r, "GET", keys[i], NULL), val);
		}
	}
	/* an error reply is a reply */
	redisReply *rep = cmd(r, "LPUSH", "spread:1", "x");
	assert_int_equal(rep->type, REDIS_REPLY_ERROR);
	assert_non_null(strstr(rep->str, "WRONGTYPE"));
	freeReplyObject(rep);
	/* the masters by number, in the order of their addresses (here their
	 * ports): each is the node that says so, and their keys are all 210 */
	assert_int_equal(cluster_n_masters(r), (size_t)cl.n);
	const char *dbs[] = {"DBSIZE"}, *myid[] = {"CLUSTER", "MYID"};
	const size_t dbs_len[] = {6}, myid_len[] = {7, 4};
	long long sum = 0;
	int last_port = 0;
	for (size_t m = 0; m < cluster_n_masters(r); m++) {
		assert_int_equal(cluster_command_node(r, m, 1, dbs, dbs_len, &rep), 0);
		assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
		sum += rep->integer;
		freeReplyObject(rep);
		assert_int_equal(cluster_command_node(r, m, 2, myid, myid_len, &rep), 0);
		assert_int_equal(rep->type, REDIS_REPLY_STRING);
		int node = -1;
		for (int i = 0; i < cl.n; i++)
			if (strcmp(rep->str, cl.id[i]) == 0)
				node = i;
		freeReplyObject(rep);
		int port = node >= 0 ? cl.port[node] : 0;
		assert_true(port > last_port);
		last_port = port;
	}
	assert_int_equal(sum, 210);
	assert_int_equal(cluster_command_node(r, (size_t)cl.n, 1, dbs, dbs_len, &rep), -1);
	assert_null(rep);
	assert_non_null(strstr(cluster_error(r), "no master 3 (the map has 3)"));
	struct cluster_stats st = cluster_stats(r);
	assert_int_equal(st.map_refreshes, 1);
	assert_int_equal(st.moved + st.asks, 0);
	assert_int_equal(st.node_errors, 0);
	assert_int_equal(st.connects, 3); /* the seed asked for the map, and the masters */
	cluster_router_free(r);
}

static void setslot(int i, unsigned slot, const char *how, int to)
{
	if (clusterutil_cmd(&cl, i, NULL, 0, "CLUSTER SETSLOT %u %s %s", slot, how, cl.id[to]) != 0)
		fail_msg("CLUSTER SETSLOT %u %s on node %d", slot, how, cl.port[i]);
}

static void test_ask_and_moved(void **state)
{
	(void)state;
	struct cluster_router *r = router(NULL);
	const char *key = "mig{slot-a}";
	unsigned slot = cluster_key_slot(key, strlen(key));
	assert_int_equal(cluster_refresh(r), 0);
	struct cluster_addr a;
	assert_int_equal(cluster_slot_node(r, slot, &a), 0);
	int from = clusterutil_index(&cl, a.port);
	assert_true(from >= 0);
	int to = (from + 1) % cl.n;

	/* migrating: a key the source does not hold is ASKed to the target */
	setslot(to, slot, "IMPORTING", from);
	setslot(from, slot, "MIGRATING", to);
	want_ok(cmd(r, "SET", key, "moved-value"));
	struct cluster_stats st = cluster_stats(r);
	assert_int_equal(st.asks, 1);
	assert_int_equal(st.moved, 0);
	want_str(cmd(r, "GET", key, NULL), "moved-value");
	st = cluster_stats(r);
	assert_int_equal(st.asks, 2);
	/* ASK leaves the map alone */
	assert_int_equal(cluster_slot_node(r, slot, &a), 0);
	assert_int_equal(a.port, cl.port[from]);
	/* the target holds it, the source does not */
	char n[16] = "";
	assert_int_equal(clusterutil_cmd(&cl, to, n, sizeof(n), "CLUSTER COUNTKEYSINSLOT %u", slot),
	                 0);
	assert_string_equal(n, "1");

	/* the slot given to the target: MOVED, followed, and the map refreshed */
	for (int i = 0; i < cl.n; i++)
		setslot(i, slot, "NODE", to);
	clusterutil_sleep_ms(150); /* past the refresh's rate limit */
	uint64_t refreshes = cluster_stats(r).map_refreshes;
	want_str(cmd(r, "GET", key, NULL), "moved-value");
	st = cluster_stats(r);
	assert_int_equal(st.moved, 1);
	assert_int_equal(st.map_refreshes, refreshes + 1);
	assert_int_equal(cluster_slot_node(r, slot, &a), 0);
	assert_int_equal(a.port, cl.port[to]);
	/* and the next command goes straight there */
	want_str(cmd(r, "GET", key, NULL), "moved-value");
	assert_int_equal(cluster_stats(r).moved, 1);

	/* a pipeline across a moved slot: the router's map still says `from` */
	struct cluster_router *r2 = router(NULL);
	assert_int_equal(cluster_refresh(r2), 0);
	const char *key2 = "mig{slot-b}";
	unsigned slot2 = cluster_key_slot(key2, strlen(key2));
	assert_int_equal(cluster_slot_node(r2, slot2, &a), 0);
	int from2 = clusterutil_index(&cl, a.port), to2 = (from2 + 2) % cl.n;
	want_ok(cmd(r2, "SET", key2, "second"));
	/* moved with its key: MIGRATE the key, then give the slot away */
	setslot(to2, slot2, "IMPORTING", from2);
	setslot(from2, slot2, "MIGRATING", to2);
	char ok[16] = "";
	if (clusterutil_cmd(&cl, from2, ok, sizeof(ok), "MIGRATE 127.0.0.1 %d %s 0 5000",
	                    cl.port[to2], key2) != 0)
		fail_msg("MIGRATE %s", key2);
	for (int i = 0; i < cl.n; i++)
		setslot(i, slot2, "NODE", to2);
	const char *argv[3][2] = {{"GET", key2}, {"GET", key}, {"GET", key2}};
	const size_t lens[3][2] = {{3, strlen(key2)}, {3, strlen(key)}, {3, strlen(key2)}};
	struct cluster_cmd cmds[3];
	for (int i = 0; i < 3; i++)
		cmds[i] =
		        (struct cluster_cmd){argv[i][1], lens[i][1], 2, argv[i], lens[i], NULL, 0};
	assert_int_equal(cluster_pipeline(r2, cmds, 3), 0);
	want_str(cmds[0].reply, "second");
	want_str(cmds[1].reply, "moved-value");
	want_str(cmds[2].reply, "second");
	st = cluster_stats(r2);
	assert_true(st.moved >= 2); /* each of key2's commands, and key's unless refreshed */
	assert_int_equal(cluster_slot_node(r2, slot2, &a), 0);
	assert_int_equal(a.port, cl.port[to2]);
	cluster_router_free(r2);
	cluster_router_free(r);
}

static void test_acl(void **state)
{
	(void)state;
	for (int i = 0; i < cl.n; i++)
		if (clusterutil_cmd(&cl, i, NULL, 0, "ACL SETUSER k3 on >right-secret ~* +@all") !=
		    0)
			fail_msg("ACL SETUSER on node %d", cl.port[i]);
	struct cluster_options o = {.user = "k3", .password = "wrong-secret"};
	struct cluster_router *r = router(&o);
	assert_int_equal(cluster_refresh(r), -1);
	/* both seeds were asked; the message names the last */
	char want[2][128];
	for (int i = 0; i < 2; i++)
		snprintf(want[i], sizeof(want[i]), "redis 127.0.0.1:%d: AUTH: WRONGPASS",
		         cl.port[i]);
	if (!strstr(cluster_error(r), want[0]) && !strstr(cluster_error(r), want[1]))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want[0]);
	assert_non_null(strstr(cluster_error(r), "cluster: no node gave a slot map (2 asked)"));
	assert_true(cluster_stats(r).auth_refused >= 1);
	redisReply *rep = (redisReply *)1;
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	assert_null(rep);
	assert_non_null(strstr(cluster_error(r), "not tried for another"));
	cluster_router_free(r);

	o.password = "right-secret";
	r = router(&o);
	assert_int_equal(cluster_refresh(r), 0);
	assert_int_equal(cluster_stats(r).auth_refused, 0);
	want_ok(cmd(r, "SET", "acl-key", "v"));
	want_str(cmd(r, "GET", "acl-key", NULL), "v");
	cluster_router_free(r);
	/* the password alone authenticates as the default user, which has none */
	o = (struct cluster_options){.password = "right-secret"};
	r = router(&o);
	assert_int_equal(cluster_refresh(r), -1);
	assert_non_null(strstr(cluster_error(r), ": AUTH: "));
	cluster_router_free(r);
}

/* A command on two keys of a slot being moved, one of them moved already:
 * TRYAGAIN, sent again after pauses; once the slot has moved whole, it is
 * answered (by MOVED, followed). */
static void test_tryagain(void **state)
{
	(void)state;
	struct cluster_router *r = router(NULL);
	const char *k1 = "{try}a", *k2 = "{try}b";
	unsigned slot = cluster_key_slot(k1, strlen(k1));
	want_ok(cmd(r, "SET", k1, "1"));
	want_ok(cmd(r, "SET", k2, "2"));
	struct cluster_addr a;
	assert_int_equal(cluster_slot_node(r, slot, &a), 0);
	int from = clusterutil_index(&cl, a.port), to = (from + 1) % cl.n;
	setslot(to, slot, "IMPORTING", from);
	setslot(from, slot, "MIGRATING", to);
	char ok[16] = "";
	if (clusterutil_cmd(&cl, from, ok, sizeof(ok), "MIGRATE 127.0.0.1 %d %s 0 5000",
	                    cl.port[to], k1) != 0)
		fail_msg("MIGRATE %s", k1);
	const char *argv[] = {"EVAL", "return redis.call('EXISTS', KEYS[1], KEYS[2])", "2", k1, k2};
	size_t lens[5];
	for (int i = 0; i < 5; i++)
		lens[i] = strlen(argv[i]);
	redisReply *rep = NULL;
	double t0 = clusterutil_now();
	assert_int_equal(cluster_command_argv(r, k1, strlen(k1), 5, argv, lens, &rep), -1);
	double took = clusterutil_now() - t0;
	assert_null(rep);
	assert_true(cluster_stats(r).tryagains >= 5);
	assert_true(took > 0.25); /* 10 + 20 + 40 + 80 + 160 ms of pauses */
	assert_non_null(strstr(cluster_error(r), "more than"));
	/* the rest moved and the slot given away: the same command is answered */
	if (clusterutil_cmd(&cl, from, ok, sizeof(ok), "MIGRATE 127.0.0.1 %d %s 0 5000",
	                    cl.port[to], k2) != 0)
		fail_msg("MIGRATE %s", k2);
	for (int i = 0; i < cl.n; i++)
		setslot(i, slot, "NODE", to);
	assert_int_equal(cluster_command_argv(r, k1, strlen(k1), 5, argv, lens, &rep), 0);
	assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
	assert_int_equal(rep->integer, 2);
	freeReplyObject(rep);
	/* and in a pipeline, mid-move again (back to `from`) */
	setslot(from, slot, "IMPORTING", to);
	setslot(to, slot, "MIGRATING", from);
	if (clusterutil_cmd(&cl, to, ok, sizeof(ok), "MIGRATE 127.0.0.1 %d %s 0 5000",
	                    cl.port[from], k1) != 0)
		fail_msg("MIGRATE %s back", k1);
	uint64_t before = cluster_stats(r).tryagains;
	struct cluster_cmd c = {k1, strlen(k1), 5, argv, lens, NULL, 0};
	assert_int_equal(cluster_pipeline(r, &c, 1), 1);
	assert_true(cluster_stats(r).tryagains > before);
	if (clusterutil_cmd(&cl, to, ok, sizeof(ok), "MIGRATE 127.0.0.1 %d %s 0 5000",
	                    cl.port[from], k2) != 0)
		fail_msg("MIGRATE %s back", k2);
	for (int i = 0; i < cl.n; i++)
		setslot(i, slot, "NODE", from);
	cluster_router_free(r);
}

static void test_stopped_and_killed_node(void **state)
{
	(void)state;
	struct cluster_options o = {.command_timeout_ms = 400,
	                            .connect_timeout_ms = 400,
	                            .backoff_min_ms = 300,
	                            .backoff_max_ms = 1200};
	struct cluster_router *r = router(&o);
	/* a key on each node, and a connection to each */
	char keys[CLUSTERUTIL_MAX][32];
	for (int i = 0; i < cl.n; i++) {
		struct cluster_addr a = {{0}, 0};
		for (int k = 0;; k++) {
			snprintf(keys[i], sizeof(keys[i]), "node%d:%d", i, k);
			assert_int_equal(cluster_refresh(r), 0);
			assert_int_equal(cluster_slot_node(
			                         r, cluster_key_slot(keys[i], strlen(keys[i])), &a),
			                 0);
			if (a.port == cl.port[i])
				break;
		}
		want_ok(cmd(r, "SET", keys[i], "here"));
	}
	const char *argv[2] = {"GET", NULL};
	size_t lens[2] = {3, 0};
	redisReply *rep = NULL;
	char want[64];

	/* node 2 stopped (SIGSTOP): its command times out, within the deadline */
	clusterutil_signal(&cl, 2, SIGSTOP);
	argv[1] = keys[2];
	lens[1] = strlen(keys[2]);
	double t0 = now_s();
	assert_int_equal(cluster_command_argv(r, keys[2], lens[1], 2, argv, lens, &rep), -1);
	double took = now_s() - t0;
	assert_null(rep);
	snprintf(want, sizeof(want), "redis 127.0.0.1:%d: GET: timed out after 400 ms", cl.port[2]);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
	if (took >= 0.8)
		fail_msg("the timed-out GET took %.3f s, want < 2 x 0.4 s", took);
	assert_int_equal(cluster_stats(r).timeouts, 1);
	/* the maps read after it (passing over node 2, backing off) leave the
	 * message naming the node and command that failed */
	for (int k = 0; k < 2 * cl.n; k++) {
		assert_int_equal(cluster_refresh(r), 0);
		if (!strstr(cluster_error(r), want))
			fail_msg("after a map read: \"%s\" does not say \"%s\"", cluster_error(r),
			         want);
	}
	/* so does a pipeline's, whose map is read again after the timeout */
	{
		clusterutil_sleep_ms(350); /* node 2's backoff passes: it is asked again */
		const char *pa[2][2] = {{"GET", keys[0]}, {"GET", keys[2]}};
		const size_t pl[2][2] = {{3, strlen(keys[0])}, {3, strlen(keys[2])}};
		struct cluster_cmd pc[2];
		for (int i = 0; i < 2; i++)
			pc[i] = (struct cluster_cmd){pa[i][1], pl[i][1], 2, pa[i], pl[i], NULL, 0};
		assert_int_equal(cluster_pipeline(r, pc, 2), 1);
		want_str(pc[0].reply, "here");
		assert_null(pc[1].reply);
		if (!strstr(cluster_error(r), want))
			fail_msg("after a pipeline: \"%s\" does not say \"%s\"", cluster_error(r),
			         want);
	}
	clusterutil_signal(&cl, 2, SIGCONT);
	clusterutil_sleep_ms(700); /* its backoff passes (600 ms after a second timeout) */
	want_str(cmd(r, "GET", keys[2], NULL), "here");

	/* every node stopped at once (for less than the cluster's node timeout,
	 * and frozen together, none judges another failed): a pipeline's GET
	 * times out, and the map read after it finds no node; the message
	 * still names the GET's node and cause, not the failed map read */
	clusterutil_sleep_ms(350); /* a map read is due again after a failure */
	for (int i = 0; i < cl.n; i++)
		clusterutil_signal(&cl, i, SIGSTOP);
	{
		const char *pa[2] = {"GET", keys[0]};
		const size_t pl[2] = {3, strlen(keys[0])};
		struct cluster_cmd pc = {pa[1], pl[1], 2, pa, pl, NULL, 0};
		uint64_t refreshes = cluster_stats(r).map_refreshes;
		size_t failed = cluster_pipeline(r, &pc, 1);
		for (int i = 0; i < cl.n; i++)
			clusterutil_signal(&cl, i, SIGCONT);
		assert_int_equal(failed, 1);
		assert_int_equal(cluster_stats(r).map_refreshes, refreshes); /* none read */
		snprintf(want, sizeof(want), "redis 127.0.0.1:%d: GET: timed out after 400 ms",
		         cl.port[0]);
		if (!strstr(cluster_error(r), want))
			fail_msg("after a pipeline whose map read failed: \"%s\" does not say "
			         "\"%s\"",
			         cluster_error(r), want);
	}
	clusterutil_sleep_ms(1300); /* every node's backoff passes (1200 ms at most) */
	for (int i = 0; i < cl.n; i++)
		want_str(cmd(r, "GET", keys[i], NULL), "here");

	/* node 2 killed: its commands fail at once, the others still work */
	clusterutil_signal(&cl, 2, SIGKILL);
	struct cluster_stats before = cluster_stats(r);
	t0 = now_s();
	assert_int_equal(cluster_command_argv(r, keys[2], lens[1], 2, argv, lens, &rep), -1);
	took = now_s() - t0;
	snprintf(want, sizeof(want), "redis 127.0.0.1:%d: GET: ", cl.port[2]);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
	if (took >= 0.8)
		fail_msg("the GET of a killed node took %.3f s, want < 2 x 0.4 s", took);
	struct cluster_stats st = cluster_stats(r);
	assert_int_equal(st.node_errors, before.node_errors + 1);
	for (int i = 0; i < 2; i++)
		want_str(cmd(r, "GET", keys[i], NULL), "here");
	/* not retried before its backoff passes: no new connection */
	before = cluster_stats(r);
	t0 = now_s();
	for (int k = 0; k < 20; k++) {
		assert_int_equal(cluster_command_argv(r, keys[2], lens[1], 2, argv, lens, &rep),
		                 -1);
		assert_non_null(strstr(cluster_error(r), "not tried for another"));
	}
	took = now_s() - t0;
	st = cluster_stats(r);
	assert_true(took < 0.25);
	assert_int_equal(st.connects, before.connects);
	assert_true(st.backoff_skips >= before.backoff_skips + 20);
	/* after it: one connection tried (by the command, or by the map's
	 * refresh just before it), refused, and a longer backoff */
	clusterutil_sleep_ms(650);
	before = cluster_stats(r);
	assert_int_equal(cluster_command_argv(r, keys[2], lens[1], 2, argv, lens, &rep), -1);
	snprintf(want, sizeof(want), "redis 127.0.0.1:%d: ", cl.port[2]);
	if (!strstr(cluster_error(r), want) ||
	    !strstr(cluster_error(r), "connect: Connection refused"))
		fail_msg("\"%s\" does not say \"%s...connect: Connection refused\"",
		         cluster_error(r), want);
	st = cluster_stats(r);
	assert_int_equal(st.connects, before.connects + 1);
	clusterutil_sleep_ms(350); /* past the first backoff, not the doubled one */
	assert_int_equal(cluster_command_argv(r, keys[2], lens[1], 2, argv, lens, &rep), -1);
	assert_non_null(strstr(cluster_error(r), "not tried for another"));
	assert_int_equal(cluster_stats(r).connects, st.connects);
	/* a pipeline over the three: the live nodes' commands get replies */
	const char *pargv[3][2] = {{"GET", keys[0]}, {"GET", keys[2]}, {"GET", keys[1]}};
	const size_t plens[3][2] = {
	        {3, strlen(keys[0])}, {3, strlen(keys[2])}, {3, strlen(keys[1])}};
	struct cluster_cmd cmds[3];
	for (int i = 0; i < 3; i++)
		cmds[i] = (struct cluster_cmd){pargv[i][1], plens[i][1], 2, pargv[i],
		                               plens[i],    NULL,        0};
	assert_int_equal(cluster_pipeline(r, cmds, 3), 1);
	want_str(cmds[0].reply, "here");
	assert_null(cmds[1].reply);
	want_str(cmds[2].reply, "here");
	cluster_router_free(r);
}

/* ---- failing system calls ----
 * hiredis (a shared library) and the router call these instead of libc's,
 * which they call unless a test armed them: no hook in the router. */

static int timeouts_to_fail; /* setsockopt SO_RCVTIMEO / SO_SNDTIMEO calls */
static int polls_to_fail;    /* poll calls waiting to read (POLLIN) */
static int poll_errno;       /* what they fail with */

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	typedef int (*fn_t)(int, int, int, const void *, socklen_t);
	static fn_t real;
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "setsockopt");
	if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) &&
	    timeouts_to_fail > 0) {
		timeouts_to_fail--;
		errno = ENOMEM;
		return -1;
	}
	return real(fd, level, name, val, len);
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	typedef int (*fn_t)(struct pollfd *, nfds_t, int);
	static fn_t real;
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "poll");
	if (n == 1 && (fds[0].events & POLLIN) && polls_to_fail > 0) {
		polls_to_fail--;
		errno = poll_errno;
		return -1;
	}
	return real(fds, n, timeout);
}

/* ---- fake nodes ---- */

struct fake {
	int fd;
	int port;
	const char *reply;         /* NULL: never answers */
	const char *const *script; /* else these, one per command, the last repeated */
	size_t n_script, at;
	long delay_ms;           /* a pause before each reply */
	long trickle_ms;         /* replies other than maps sent a byte at a time, this apart */
	size_t flood;            /* after each reply other than a map, this many bytes of 'x' */
	const char *const *maps; /* CLUSTER SLOTS answered with these, the last repeated */
	size_t n_maps, map_at;
	pthread_t thread;
};

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void fake_send(struct fake *f, int c, const char *reply)
{
	int map = reply[0] == '*';
	if (f->trickle_ms && !map) {
		for (size_t i = 0; reply[i]; i++) {
			if (send(c, reply + i, 1, MSG_NOSIGNAL) != 1)
				return;
			sleep_ms(f->trickle_ms);
		}
	} else {
		(void)send(c, reply, strlen(reply), MSG_NOSIGNAL);
	}
	static char block[1 << 16];
	memset(block, 'x', sizeof(block));
	for (size_t left = map ? 0 : f->flood; left;) {
		ssize_t w =
		        send(c, block, left < sizeof(block) ? left : sizeof(block), MSG_NOSIGNAL);
		if (w <= 0)
			return;
		left -= (size_t)w;
	}
}

static void *fake_run(void *arg)
{
	struct fake *f = arg;
	for (;;) {
		int c = accept(f->fd, NULL, NULL);
		if (c < 0)
			return NULL;
		char buf[512] = {0};
		while (recv(c, buf, sizeof(buf) - 1, 0) > 0) {
			const char *reply = f->reply;
			int slots = f->n_maps && strstr(buf, "SLOTS");
			memset(buf, 0, sizeof(buf));
			if (slots) {
				fake_send(f, c,
				          f->maps[f->map_at < f->n_maps ? f->map_at++
				                                        : f->n_maps - 1]);
				continue;
			}
			if (f->n_script)
				reply = f->script[f->at < f->n_script ? f->at++ : f->n_script - 1];
			if (f->delay_ms)
				sleep_ms(f->delay_ms);
			if (reply)
				fake_send(f, c, reply);
		}
		close(c);
	}
}

/* Listens on a port of its own (f->port); fake_go then answers. */
/* A listening socket on 127.0.0.1, a port of its own. */
static void listen_loopback(int *fd, int *port)
{
	*fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(a);
	assert_true(*fd >= 0);
	assert_int_equal(bind(*fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(*fd, 4), 0);
	assert_int_equal(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
}

static void fake_listen(struct fake *f)
{
	memset(f, 0, sizeof(*f));
	listen_loopback(&f->fd, &f->port);
}

static void fake_go(struct fake *f)
{
	assert_int_equal(pthread_create(&f->thread, NULL, fake_run, f), 0);
}

static void fake_start(struct fake *f, const char *reply)
{
	fake_listen(f);
	f->reply = reply;
	fake_go(f);
}

/* After the routers closed their connections: shutting the listening socket
 * down wakes the thread's accept, and it returns. */
static void fake_stop(struct fake *f)
{
	shutdown(f->fd, SHUT_RDWR);
	pthread_join(f->thread, NULL);
	close(f->fd);
}

/* A map of every slot on one node of port, in out. */
static void one_node_map(char *out, size_t cap, int port)
{
	snprintf(out, cap, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", port);
}

static struct cluster_router *router_at(int port, const struct cluster_options *o)
{
	char seeds[64], err[256] = "";
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", port);
	struct cluster_router *r = cluster_router_new(seeds, o, err, sizeof(err));
	if (!r)
		fail_msg("router: %s", err);
	return r;
}

static void test_fake_nodes(void **state)
{
	(void)state;
	struct fake huge, silent, junk;
	fake_start(&huge, "*2000000000\r\n");
	fake_start(&silent, NULL);
	fake_start(&junk, "*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n$1\r\nh\r\n:1\r\n");
	char seeds[128], err[256] = "", want[128];
	struct cluster_options o = {.command_timeout_ms = 300};

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", huge.port);
	struct cluster_router *r = cluster_router_new(seeds, &o, err, sizeof(err));
	assert_non_null(r);
	assert_int_equal(cluster_refresh(r), -1);
	snprintf(want, sizeof(want), "redis 127.0.0.1:%d: CLUSTER SLOTS: reply refused", huge.port);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
	cluster_router_free(r);

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", silent.port);
	r = cluster_router_new(seeds, &o, err, sizeof(err));
	assert_non_null(r);
	double t0 = now_s();
	assert_int_equal(cluster_refresh(r), -1);
	double took = now_s() - t0;
	snprintf(want, sizeof(want), "redis 127.0.0.1:%d: CLUSTER SLOTS: timed out after 300 ms",
	         silent.port);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
	assert_true(took < 0.6);
	assert_int_equal(cluster_stats(r).timeouts, 1);
	cluster_router_free(r);

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", junk.port);
	r = cluster_router_new(seeds, &o, err, sizeof(err));
	assert_non_null(r);
	assert_int_equal(cluster_refresh(r), -1);
	assert_non_null(strstr(cluster_error(r), "last slot 99999 is not 0..16383"));
	cluster_router_free(r);
	fake_stop(&huge);
	fake_stop(&silent);
	fake_stop(&junk);
}

/* GET k on a router over fake node f, whose replies are script: fails, with
 * a message containing want, the script read to its end. */
static void lost_slot_run(struct fake *f, const char *const *script, size_t n, const char *want)
{
	f->script = script;
	f->n_script = n;
	fake_go(f);
	struct cluster_options o = {.command_timeout_ms = 300};
	struct cluster_router *r = router_at(f->port, &o);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	assert_null(rep);
	if (!strstr(cluster_error(r), want))
		fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
	assert_int_equal(f->at, f->n_script);
	cluster_router_free(r);
	fake_stop(f);
}

/* A node whose redirection loses the command's slot from the map (a MOVED
 * to an unknown endpoint, the map read again giving the slot no master),
 * and one that says TRYAGAIN on the last hop allowed: the command fails
 * with a message (a TRYAGAIN that found the slot gone used to name the node
 * of index -1, read before the router's table; a MOVED can no longer lose
 * the command's slot before a TRYAGAIN, as it names that slot). */
static void test_fake_lost_slot(void **state)
{
	(void)state;
	struct fake f, g;
	fake_listen(&f);
	fake_listen(&g);
	unsigned s = cluster_key_slot("k", 1), x = (s + 1) % CLUSTER_SLOTS;
	char full_f[128], full_g[128], only_x[128], moved_unknown[64], moved[64], want[96];
	one_node_map(full_f, sizeof(full_f), f.port);
	one_node_map(full_g, sizeof(full_g), g.port);
	snprintf(only_x, sizeof(only_x),
	         "*1\r\n*3\r\n:%u\r\n:%u\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", x, x, f.port);
	snprintf(moved_unknown, sizeof(moved_unknown), "-MOVED %u ?:%d\r\n", s, f.port);
	const char *lost[] = {full_f, moved_unknown, only_x};
	lost_slot_run(&f, lost, 3, "no known master");
	snprintf(moved_unknown, sizeof(moved_unknown), "-MOVED %u ?:%d\r\n", s, g.port);
	snprintf(moved, sizeof(moved), "-MOVED %u 127.0.0.1:%d\r\n", s, g.port);
	const char *last_hop[] = {
	        full_g, moved_unknown,
	        full_g, moved,
	        moved,  moved,
	        moved,  "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"};
	snprintf(want, sizeof(want), "more than %d redirections for slot %u (last to 127.0.0.1:%d)",
	         CLUSTER_MAX_REDIRECTS, s, g.port);
	lost_slot_run(&g, last_hop, sizeof(last_hop) / sizeof(last_hop[0]), want);
}

/* A cluster whose 1024 masters change addresses at every map read (pods
 * restarted): the router forgets the old ones, so it never runs out of
 * room for nodes (it used to refuse every map after the first). */
static void test_fake_moving_nodes(void **state)
{
	(void)state;
	enum { MASTERS = 1024, READS = 4 };
	struct fake f;
	fake_listen(&f);
	static char maps[READS][MASTERS * 64 + 16];
	const char *script[READS];
	for (int m = 0; m < READS; m++) {
		size_t at = (size_t)snprintf(maps[m], sizeof(maps[m]), "*%d\r\n", MASTERS);
		for (int k = 0; k < MASTERS; k++) {
			int first = k * (CLUSTER_SLOTS / MASTERS);
			/* 127.0.0.3: nothing listens there (other tests' nodes are on
			 * 127.0.0.1), so every connect is refused at once */
			at += (size_t)snprintf(
			        maps[m] + at, sizeof(maps[m]) - at,
			        "*3\r\n:%d\r\n:%d\r\n*2\r\n$9\r\n127.0.0.3\r\n:%d\r\n", first,
			        first + CLUSTER_SLOTS / MASTERS - 1, 2000 + m * MASTERS + k);
		}
		script[m] = maps[m];
	}
	f.script = script;
	f.n_script = READS;
	fake_go(&f);
	char seeds[64], err[256] = "";
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", f.port);
	struct cluster_options o = {.command_timeout_ms = 1000};
	struct cluster_router *r = cluster_router_new(seeds, &o, err, sizeof(err));
	assert_non_null(r);
	for (int m = 0; m < READS; m++) {
		if (cluster_refresh(r) != 0)
			fail_msg("map read %d: %s", m + 1, cluster_error(r));
		assert_int_equal(cluster_n_masters(r), MASTERS);
		struct cluster_addr a;
		assert_int_equal(cluster_slot_node(r, 0, &a), 0);
		assert_int_equal(a.port, 2000 + m * MASTERS);
	}
	assert_int_equal(cluster_stats(r).nodes_forgotten, (READS - 1) * MASTERS);
	cluster_router_free(r);
	fake_stop(&f);
}

/* A map read while a slot had no master (a cluster still being made) is
 * read again once a command meets that slot: before, nothing made it stale
 * (no MOVED, no node failure), so the slot's commands failed for the
 * router's life. */
static void test_fake_partial_map_read_again(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	unsigned s = cluster_key_slot("k", 1);
	char partial[160], full[160];
	snprintf(partial, sizeof(partial),
	         "*1\r\n*3\r\n:0\r\n:%u\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", s - 1, f.port);
	one_node_map(full, sizeof(full), f.port);
	const char *script[] = {partial, full, "$1\r\nv\r\n"};
	f.script = script;
	f.n_script = 3;
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 500, .backoff_min_ms = 50};
	struct cluster_router *r = router_at(f.port, &o);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	assert_non_null(strstr(cluster_error(r), "no known master"));
	int ok = 0;
	for (int i = 0; i < 10 && !ok; i++) {
		sleep_ms(60); /* past backoff_min_ms, the refreshes' limit */
		ok = cluster_command_argv(r, "k", 1, 2, argv, lens, &rep) == 0;
	}
	if (!ok)
		fail_msg("the slot is still not served: %s", cluster_error(r));
	want_str(rep, "v");
	assert_int_equal(cluster_stats(r).map_refreshes, 2);
	cluster_router_free(r);
	fake_stop(&f);
}

/* A node that sends its reply a byte at a time, each byte well within the
 * socket's timeout: the round trip still ends at command_timeout_ms. Before,
 * the timeout bounded each system call, and this 47-byte reply took 9 s. */
static void test_fake_trickle_meets_the_deadline(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char full[160];
	one_node_map(full, sizeof(full), f.port);
	const char *script[] = {full, "$40\r\n0123456789012345678901234567890123456789\r\n"};
	f.script = script;
	f.n_script = 2;
	f.trickle_ms = 200;
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 500};
	struct cluster_router *r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	double t0 = now_s();
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	double took = now_s() - t0;
	print_message("a trickled reply, 500 ms deadline: failed after %.2f s: %s\n", took,
	              cluster_error(r));
	assert_non_null(strstr(cluster_error(r), "timed out after 500 ms"));
	assert_true(took < 0.75);
	assert_int_equal(cluster_stats(r).timeouts, 1);
	cluster_router_free(r);
	fake_stop(&f);
}

/* A reply longer than its command's bound (or the router's) is refused as
 * it arrives, the connection dropped: a peer announcing 512 MiB for a GET is
 * not buffered whole (it was, then refused for its content). */
static void test_fake_long_reply_refused(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char full[160];
	one_node_map(full, sizeof(full), f.port);
	const char *script[] = {full, "$536870912\r\n", full, "$536870912\r\n"};
	f.script = script;
	f.n_script = 4;
	f.flood = (size_t)512 << 20;
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 5000, .max_reply_bytes = (size_t)4 << 20};
	struct cluster_router *r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	if (!strstr(cluster_error(r), "reply refused: longer than 4194304 bytes"))
		fail_msg("\"%s\" does not say the reply was too long", cluster_error(r));
	cluster_router_free(r);
	/* a pipelined command's own bound */
	r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	struct cluster_cmd c = {"k", 1, 2, argv, lens, NULL, 1 << 20};
	assert_int_equal(cluster_pipeline(r, &c, 1), 1);
	assert_null(c.reply);
	if (!strstr(cluster_error(r), "reply refused: longer than 1048576 bytes"))
		fail_msg("\"%s\" does not say the reply was too long", cluster_error(r));
	cluster_router_free(r);
	fake_stop(&f);
}

/* A pipeline's commands reach every node before any reply is read, so that
 * the nodes work at once: two nodes taking 400 ms each answer in about
 * 400 ms. Before, hiredis wrote a node's commands only when its first reply
 * was read, and the nodes ran one after the other (800 ms). */
static void test_fake_pipeline_nodes_at_once(void **state)
{
	(void)state;
	struct fake a, b;
	fake_listen(&a);
	fake_listen(&b);
	char map[256];
	snprintf(map, sizeof(map),
	         "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
	         "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
	         a.port, b.port);
	const char *sa[] = {map, "$1\r\na\r\n"};
	const char *sb[] = {"$1\r\nb\r\n"};
	a.script = sa;
	a.n_script = 2;
	b.script = sb;
	b.n_script = 1;
	fake_go(&a);
	fake_go(&b);
	struct cluster_options o = {.command_timeout_ms = 2000};
	struct cluster_router *r = router_at(a.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	a.delay_ms = b.delay_ms = 400;
	assert_true(cluster_key_slot("k", 1) < 8192 && cluster_key_slot("a", 1) >= 8192);
	const char *argv0[] = {"GET", "k"}, *argv1[] = {"GET", "a"};
	const size_t lens[] = {3, 1};
	struct cluster_cmd cmds[2] = {{"k", 1, 2, argv0, lens, NULL, 0},
	                              {"a", 1, 2, argv1, lens, NULL, 0}};
	double t0 = now_s();
	assert_int_equal(cluster_pipeline(r, cmds, 2), 0);
	double took = now_s() - t0;
	print_message("a pipeline over 2 nodes of 400 ms each: %.2f s\n", took);
	want_str(cmds[0].reply, "a");
	want_str(cmds[1].reply, "b");
	assert_true(took < 0.7);
	cluster_router_free(r);
	fake_stop(&a);
	fake_stop(&b);
}

/* A pipeline over a node that answers nothing and one that answers at once:
 * the second's reply is read, its node not blamed. Once, with one deadline
 * for the round, the first node used it all and the second, read after it,
 * failed too (its reply waiting in the socket), and went into backoff. */
static void test_fake_silent_node_spares_the_other(void **state)
{
	(void)state;
	struct fake a, b;
	fake_listen(&a);
	fake_listen(&b);
	char map[256];
	snprintf(map, sizeof(map),
	         "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
	         "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
	         a.port, b.port);
	const char *sa[] = {map, NULL}; /* then silent */
	a.script = sa;
	a.n_script = 2;
	b.reply = "$1\r\nb\r\n";
	fake_go(&a);
	fake_go(&b);
	struct cluster_options o = {.command_timeout_ms = 300, .backoff_min_ms = 1000};
	struct cluster_router *r = router_at(a.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv0[] = {"GET", "k"}, *argv1[] = {"GET", "a"};
	const size_t lens[] = {3, 1};
	struct cluster_cmd cmds[2] = {{"k", 1, 2, argv0, lens, NULL, 0},
	                              {"a", 1, 2, argv1, lens, NULL, 0}};
	assert_int_equal(cluster_pipeline(r, cmds, 2), 1);
	assert_null(cmds[0].reply);
	want_str(cmds[1].reply, "b");
	assert_int_equal(cluster_stats(r).node_errors, 1);
	redisReply *rep = NULL; /* and b is not backing off */
	assert_int_equal(cluster_command_argv(r, "a", 1, 2, argv1, lens, &rep), 0);
	want_str(rep, "b");
	cluster_router_free(r);
	fake_stop(&a);
	fake_stop(&b);
}

/* A pipeline of SET_N SETs of 1 MiB each (keys c0..c7). */
enum { SET_N = 8, SET_VALUE = 1 << 20 };

struct set_batch {
	char *value;
	const char *argv[SET_N][3];
	size_t lens[SET_N][3];
	char keys[SET_N][8];
	struct cluster_cmd cmds[SET_N];
};

/* Fills b; the bytes its commands take on the wire. */
static size_t set_batch_make(struct set_batch *b)
{
	size_t wire = 0;
	b->value = malloc(SET_VALUE);
	memset(b->value, 'v', SET_VALUE);
	for (int i = 0; i < SET_N; i++) {
		snprintf(b->keys[i], sizeof(b->keys[i]), "c%d", i);
		b->argv[i][0] = "SET";
		b->argv[i][1] = b->keys[i];
		b->argv[i][2] = b->value;
		b->lens[i][0] = 3;
		b->lens[i][1] = strlen(b->keys[i]);
		b->lens[i][2] = SET_VALUE;
		b->cmds[i] = (struct cluster_cmd){b->keys[i], b->lens[i][1], 3, b->argv[i],
		                                  b->lens[i], NULL,          0};
		/* *3 $3 SET $n key $1048576 value */
		wire += 4 + 4 + 5 + 4 + b->lens[i][1] + 2 + 10 + SET_VALUE + 2;
	}
	return wire;
}

/* A node that takes a pipeline's 8 MiB at about 4 MiB/s (a slow link, a busy
 * node): each system call progresses, and the round goes through in about
 * 2 s against a 500 ms timeout, as it did when the timeout bounded each
 * call. Once a round had 500 ms in all, and every copy on such a link
 * failed. */
struct slow_sink {
	int fd, port;
	size_t expect; /* bytes of commands to take */
	int n_replies; /* +OK then, each */
	pthread_t thread;
};

static void *slow_sink_run(void *arg)
{
	struct slow_sink *k = arg;
	int c = accept(k->fd, NULL, NULL);
	if (c < 0)
		return NULL;
	static char buf[64 << 10];
	size_t got = 0;
	while (got < k->expect) {
		ssize_t n = recv(c, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
		got += (size_t)n;
		sleep_ms(16); /* about 4 MiB/s */
	}
	for (int i = 0; i < k->n_replies; i++)
		(void)send(c, "+OK\r\n", 5, MSG_NOSIGNAL);
	char drain[64];
	while (recv(c, drain, sizeof(drain), 0) > 0) {
	}
	close(c);
	return NULL;
}

static void test_fake_slow_link_goes_through(void **state)
{
	(void)state;
	struct fake m; /* the map only */
	fake_listen(&m);
	struct slow_sink k = {0};
	listen_loopback(&k.fd, &k.port);
	char map[160];
	one_node_map(map, sizeof(map), k.port);
	m.reply = map;
	fake_go(&m);
	struct set_batch b;
	k.expect = set_batch_make(&b);
	struct cluster_cmd *cmds = b.cmds;
	k.n_replies = SET_N;
	assert_int_equal(pthread_create(&k.thread, NULL, slow_sink_run, &k), 0);
	struct cluster_options o = {.command_timeout_ms = 500};
	struct cluster_router *r = router_at(m.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	double t0 = now_s();
	size_t failed = cluster_pipeline(r, cmds, SET_N);
	double took = now_s() - t0;
	print_message("8 MiB of SETs to a node taking 4 MiB/s, 500 ms timeout: %zu failed in "
	              "%.2f s%s%s\n",
	              failed, took, failed ? ": " : "", failed ? cluster_error(r) : "");
	assert_int_equal(failed, 0);
	for (int i = 0; i < SET_N; i++)
		want_ok(cmds[i].reply);
	cluster_router_free(r);
	pthread_join(k.thread, NULL);
	close(k.fd);
	fake_stop(&m);
	free(b.value);
}

/* The bound on a reply covers an array's elements too: hiredis moves past
 * each element as it is whole, so a bound on what it holds let a peer answer
 * a chunk's GET with any number of elements each under the bound. (The
 * strings it has made count against the bound too, so either count may
 * refuse the reply first.) */
static void test_fake_long_array_refused(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char full[160];
	one_node_map(full, sizeof(full), f.port);
	enum { ELEMS = 40, ELEM = 64 << 10 };
	size_t cap = 16 + (size_t)ELEMS * (ELEM + 16);
	char *arr = malloc(cap);
	size_t at = (size_t)snprintf(arr, cap, "*%d\r\n", ELEMS);
	for (int i = 0; i < ELEMS; i++) {
		at += (size_t)snprintf(arr + at, cap - at, "$%d\r\n", ELEM);
		memset(arr + at, 'x', ELEM);
		at += ELEM;
		memcpy(arr + at, "\r\n", 3); /* and the NUL */
		at += 2;
	}
	const char *script[] = {full, arr};
	f.script = script;
	f.n_script = 2;
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 2000};
	struct cluster_router *r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	struct cluster_cmd c = {"k", 1, 2, argv, lens, NULL, (1 << 20) + 64};
	assert_int_equal(cluster_pipeline(r, &c, 1), 1); /* 2.5 MiB against 1 MiB */
	assert_null(c.reply);
	if (!strstr(cluster_error(r), "reply refused: ") ||
	    !strstr(cluster_error(r), " than 1048640 bytes"))
		fail_msg("\"%s\" does not say the reply was too long", cluster_error(r));
	cluster_router_free(r);
	fake_stop(&f);
	free(arr);
}

/* The process's resident memory now and at its peak since the peak was
 * last reset (/proc/self/clear_refs), in bytes; 0 when unknown. */
static size_t vm_kib(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t kib = 0, n = strlen(field);
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			kib = strtoull(line + n + 1, NULL, 10);
	if (f)
		fclose(f);
	return kib << 10;
}

/* Resets the peak (VmHWM) to the resident memory now: 0, or -1 when the
 * system does not let it. */
static int peak_reset(void)
{
	malloc_trim(0); /* free memory given back, not reused unseen */
	FILE *f = fopen("/proc/self/clear_refs", "w");
	if (!f)
		return -1;
	int ok = fputs("5", f) >= 0;
	return fclose(f) == 0 && ok ? 0 : -1;
}

/* A reply of small elements (arrays of integers, 4 bytes each on the wire)
 * is refused for the memory its objects take, not only for its bytes:
 * hiredis makes a redisReply (48 bytes, 64 with malloc's) and an array slot
 * for each, so a peer within a 1 MiB bound of bytes made the router hold
 * some 20 MiB (at the 64 MiB default, over 1 GiB). */
static void test_fake_small_elements_bounded_in_memory(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char full[160];
	one_node_map(full, sizeof(full), f.port);
	enum { OUTER = 2048, INNER = 512 }; /* 1 M integers, 4 MiB on the wire */
	size_t cap = 16 + (size_t)OUTER * (16 + INNER * 4);
	char *arr = malloc(cap);
	size_t at = (size_t)snprintf(arr, cap, "*%d\r\n", OUTER);
	for (int i = 0; i < OUTER; i++) {
		at += (size_t)snprintf(arr + at, cap - at, "*%d\r\n", INNER);
		for (int j = 0; j < INNER; j++, at += 4)
			memcpy(arr + at, ":1\r\n", 4);
	}
	arr[at] = '\0';
	const char *script[] = {full, arr};
	f.script = script;
	f.n_script = 2;
	fake_go(&f);
	enum { BOUND = 1 << 20 };
	struct cluster_options o = {.command_timeout_ms = 2000, .max_reply_bytes = BOUND};
	struct cluster_router *r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	int measured = peak_reset() == 0;
	size_t before = vm_kib("VmRSS");
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
	size_t grew = vm_kib("VmHWM") - before;
	assert_null(rep);
	print_message("1 M integers against a 1 MiB bound: the peak grew %zu KiB: %s\n", grew >> 10,
	              cluster_error(r));
	if (measured && grew > (size_t)4 * BOUND)
		fail_msg("the router's memory grew %zu KiB for a reply bound to %d KiB", grew >> 10,
		         BOUND >> 10);
	if (!strstr(cluster_error(r), "reply refused: its objects take more than 1048576 bytes"))
		fail_msg("\"%s\" does not say the reply's objects were refused", cluster_error(r));
	if (!measured)
		print_message("(the peak could not be reset: memory not checked)\n");
	cluster_router_free(r);
	fake_stop(&f);
	free(arr);
}

/* A MOVED naming a slot other than the command's (a confused or hostile
 * node: Redis names the slot of the command's keys) is that node's protocol
 * error: the command fails, the node's error is counted, and neither the
 * named slot's owner nor the command's route changes. Before, the router set
 * that slot to the named node and sent the command there. An ASK for
 * another slot is refused the same way. */
static void test_fake_moved_for_another_slot_refused(void **state)
{
	(void)state;
	struct fake a, b;
	fake_listen(&a);
	fake_listen(&b);
	unsigned s = cluster_key_slot("k", 1), x = (s + 1234) % CLUSTER_SLOTS;
	char map[160], moved[64], ask[64], want[96];
	one_node_map(map, sizeof(map), a.port);
	snprintf(moved, sizeof(moved), "-MOVED %u 127.0.0.1:%d\r\n", x, b.port);
	snprintf(ask, sizeof(ask), "-ASK %u 127.0.0.1:%d\r\n", x, b.port);
	const char *maps[] = {map};
	const char *script[] = {moved, moved, ask}; /* a command, a pipeline, a command */
	a.maps = maps;
	a.n_maps = 1;
	a.script = script;
	a.n_script = 3;
	b.reply = "$1\r\nv\r\n"; /* what the redirection would have got */
	fake_go(&a);
	fake_go(&b);
	struct cluster_options o = {.command_timeout_ms = 500};
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	for (int pass = 0; pass < 3; pass++) {
		int pipelined = pass == 1;
		snprintf(want, sizeof(want), "%s for slot %u, not the command's slot %u",
		         pass == 2 ? "ASK" : "MOVED", x, s);
		struct cluster_router *r = router_at(a.port, &o);
		assert_int_equal(cluster_refresh(r), 0);
		redisReply *rep = NULL;
		struct cluster_cmd c = {"k", 1, 2, argv, lens, NULL, 0};
		if (pipelined) {
			assert_int_equal(cluster_pipeline(r, &c, 1), 1);
			rep = c.reply;
		} else {
			assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), -1);
		}
		assert_null(rep);
		if (!strstr(cluster_error(r), want))
			fail_msg("\"%s\" does not say \"%s\"", cluster_error(r), want);
		struct cluster_stats st = cluster_stats(r);
		assert_int_equal(st.node_errors, 1);
		assert_int_equal(st.moved, 0);
		assert_int_equal(st.asks, 0);
		assert_int_equal(st.connects, 1); /* b never reached */
		struct cluster_addr owner;
		assert_int_equal(cluster_slot_node(r, x, &owner), 0);
		assert_int_equal(owner.port, a.port);
		cluster_router_free(r);
	}
	fake_stop(&a);
	fake_stop(&b);
}

/* A poll that fails while the router waits for a reply fails the command,
 * the node's error counted, with poll's reason (it said "no reply", errno
 * lost); one interrupted (EINTR) is polled again and the reply read. */
static void test_fake_poll_failures(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char map[160];
	one_node_map(map, sizeof(map), f.port);
	const char *maps[] = {map};
	f.maps = maps;
	f.n_maps = 1;
	f.reply = "$1\r\nv\r\n";
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 500};
	struct cluster_router *r = router_at(f.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	redisReply *rep = NULL;
	poll_errno = EINTR;
	polls_to_fail = 3;
	assert_int_equal(cluster_command_argv(r, "k", 1, 2, argv, lens, &rep), 0);
	assert_int_equal(polls_to_fail, 0);
	want_str(rep, "v");
	poll_errno = ENOMEM;
	polls_to_fail = 1;
	int rc = cluster_command_argv(r, "k", 1, 2, argv, lens, &rep);
	polls_to_fail = 0;
	assert_int_equal(rc, -1);
	assert_null(rep);
	error_says(r, "redis 127.0.0.1:%d: GET: poll: %s", f.port, strerror(ENOMEM));
	assert_int_equal(cluster_stats(r).node_errors, 1);
	assert_int_equal(cluster_stats(r).timeouts, 0);
	cluster_router_free(r);
	fake_stop(&f);
}

/* A connection whose socket timeouts cannot be set (setsockopt failing) is
 * the node's failure, not a connection without deadlines; the node is used
 * again after its backoff. */
static void test_fake_timeouts_not_set(void **state)
{
	(void)state;
	struct fake f;
	fake_listen(&f);
	char map[160];
	one_node_map(map, sizeof(map), f.port);
	f.reply = map;
	fake_go(&f);
	struct cluster_options o = {.command_timeout_ms = 500, .backoff_min_ms = 20};
	struct cluster_router *r = router_at(f.port, &o);
	timeouts_to_fail = 1;
	int rc = cluster_refresh(r);
	timeouts_to_fail = 0;
	assert_int_equal(rc, -1);
	error_says(r, "redis 127.0.0.1:%d: connect: cannot set the socket timeouts", f.port);
	assert_int_equal(cluster_stats(r).node_errors, 1);
	sleep_ms(30); /* past the node's backoff */
	if (cluster_refresh(r) != 0)
		fail_msg("the node is not used again: %s", cluster_error(r));
	assert_int_equal(cluster_stats(r).connects, 2);
	cluster_router_free(r);
	fake_stop(&f);
}

/* A pipeline met by MOVED to a node of unknown endpoint ("?:port": Redis 7
 * when a node announces none; the map's metadata has its ip) just after the
 * map was read: the map is read again at once to learn the address, as
 * cluster_command_argv does. Before, the pipeline waited for the refresh
 * limit, sent the command back to the node that said MOVED, and failed after
 * five redirections. */
static void test_fake_pipeline_follows_moved_to_unknown_endpoint(void **state)
{
	(void)state;
	struct fake a, b;
	fake_listen(&a);
	fake_listen(&b);
	unsigned s = cluster_key_slot("k", 1);
	char map_a[160], map_b[400], moved[64];
	one_node_map(map_a, sizeof(map_a), a.port);
	snprintf(map_b, sizeof(map_b),
	         "*3\r\n*3\r\n:0\r\n:%u\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
	         "*3\r\n:%u\r\n:%u\r\n*4\r\n$1\r\n?\r\n:%d\r\n$2\r\nid\r\n*2\r\n$2\r\nip\r\n$9\r\n"
	         "127.0.0.1\r\n"
	         "*3\r\n:%u\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
	         s - 1, a.port, s, s, b.port, s + 1, a.port);
	snprintf(moved, sizeof(moved), "-MOVED %u ?:%d\r\n", s, b.port);
	const char *maps[] = {map_a, map_b};
	a.maps = maps;
	a.n_maps = 2;
	a.reply = moved;
	b.reply = "$1\r\nv\r\n";
	fake_go(&a);
	fake_go(&b);
	struct cluster_options o = {.command_timeout_ms = 500};
	struct cluster_router *r = router_at(a.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	const char *argv[] = {"GET", "k"};
	const size_t lens[] = {3, 1};
	struct cluster_cmd c = {"k", 1, 2, argv, lens, NULL, 0};
	if (cluster_pipeline(r, &c, 1) != 0)
		fail_msg("pipeline: %s (moved %llu, map reads %llu)", cluster_error(r),
		         (unsigned long long)cluster_stats(r).moved,
		         (unsigned long long)cluster_stats(r).map_refreshes);
	want_str(c.reply, "v");
	cluster_router_free(r);
	fake_stop(&a);
	fake_stop(&b);
}

/* A map read while a master had no slots (its slots unassigned, a failover
 * under way) is read again after backoff_max_ms even when no key command
 * meets the hole: the masters it numbers (cluster_n_masters, tier2's SCAN
 * of every master) would else leave that one out for good. */
static void test_fake_masters_of_a_partial_map_read_again(void **state)
{
	(void)state;
	struct fake a, b;
	fake_listen(&a);
	fake_listen(&b);
	char partial[160], full[256];
	snprintf(partial, sizeof(partial),
	         "*1\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", a.port);
	snprintf(full, sizeof(full),
	         "*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n"
	         "*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
	         a.port, b.port);
	const char *maps[] = {partial, full};
	a.maps = maps;
	a.n_maps = 2;
	a.reply = ":1\r\n";
	b.reply = ":1\r\n";
	fake_go(&a);
	fake_go(&b);
	struct cluster_options o = {
	        .command_timeout_ms = 500, .backoff_min_ms = 50, .backoff_max_ms = 200};
	struct cluster_router *r = router_at(a.port, &o);
	assert_int_equal(cluster_n_masters(r), 1);
	size_t n = 1;
	for (int i = 0; i < 10 && n == 1; i++) {
		sleep_ms(100);
		const char *argv[] = {"DBSIZE"};
		const size_t lens[] = {6};
		redisReply *rep = NULL;
		assert_int_equal(cluster_command_node(r, 0, 1, argv, lens, &rep), 0);
		freeReplyObject(rep);
		n = cluster_n_masters(r);
	}
	print_message("masters: %zu (the cluster has 2), map reads %llu\n", n,
	              (unsigned long long)cluster_stats(r).map_refreshes);
	assert_int_equal(n, 2);
	cluster_router_free(r);
	fake_stop(&a);
	fake_stop(&b);
}

/* A node that takes a pipeline's 8 MiB of SETs at once, then answers
 * nothing (hung): cut off at about the timeout once the bytes have left this
 * socket. Before, the bytes written long ago still granted their time
 * (8 s more). */
static void test_fake_silence_after_taking_the_bytes(void **state)
{
	(void)state;
	struct fake m, k;
	fake_listen(&m);
	fake_listen(&k);
	char map[160];
	one_node_map(map, sizeof(map), k.port);
	m.reply = map;
	k.reply = NULL; /* reads everything, answers nothing */
	fake_go(&m);
	fake_go(&k);
	struct set_batch b;
	(void)set_batch_make(&b);
	struct cluster_cmd *cmds = b.cmds;
	struct cluster_options o = {.command_timeout_ms = 300};
	struct cluster_router *r = router_at(m.port, &o);
	assert_int_equal(cluster_refresh(r), 0);
	double t0 = now_s();
	size_t failed = cluster_pipeline(r, cmds, SET_N);
	double took = now_s() - t0;
	print_message("8 MiB of SETs taken at once, then silence, 300 ms timeout: %zu failed "
	              "after %.2f s: %s\n",
	              failed, took, cluster_error(r));
	assert_int_equal(failed, SET_N);
	assert_true(took < 1.5);
	cluster_router_free(r);
	fake_stop(&m);
	fake_stop(&k);
	free(b.value);
}

static int cluster_up(void **state)
{
	(void)state;
	return clusterutil_start(&cl, 3);
}

static int cluster_down(void **state)
{
	(void)state;
	clusterutil_stop(&cl);
	return 0;
}

int main(void)
{
	const struct CMUnitTest fakes[] = {
	        cmocka_unit_test(test_fake_nodes),
	        cmocka_unit_test(test_fake_lost_slot),
	        cmocka_unit_test(test_fake_moving_nodes),
	        cmocka_unit_test(test_fake_partial_map_read_again),
	        cmocka_unit_test(test_fake_trickle_meets_the_deadline),
	        cmocka_unit_test(test_fake_long_reply_refused),
	        cmocka_unit_test(test_fake_pipeline_nodes_at_once),
	        cmocka_unit_test(test_fake_silent_node_spares_the_other),
	        cmocka_unit_test(test_fake_slow_link_goes_through),
	        cmocka_unit_test(test_fake_long_array_refused),
	        cmocka_unit_test(test_fake_small_elements_bounded_in_memory),
	        cmocka_unit_test(test_fake_moved_for_another_slot_refused),
	        cmocka_unit_test(test_fake_poll_failures),
	        cmocka_unit_test(test_fake_timeouts_not_set),
	        cmocka_unit_test(test_fake_pipeline_follows_moved_to_unknown_endpoint),
	        cmocka_unit_test(test_fake_masters_of_a_partial_map_read_again),
	        cmocka_unit_test(test_fake_silence_after_taking_the_bytes),
	};
	int rc = cmocka_run_group_tests_name("fake nodes", fakes, NULL, NULL);
	if (rc != 0)
		return rc;
	if (!clusterutil_on_path("redis-server") || !clusterutil_on_path("redis-cli")) {
		printf("test_cluster_live: skipped: no redis-server or redis-cli on PATH "
		       "(scripts/install-deps installs redis-server)\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_set_get_spread),
	        cmocka_unit_test(test_ask_and_moved),
	        cmocka_unit_test(test_tryagain),
	        cmocka_unit_test(test_acl),
	        cmocka_unit_test(test_stopped_and_killed_node), /* last: it kills a node */
	};
	return cmocka_run_group_tests_name("a real cluster", tests, cluster_up, cluster_down);
}
