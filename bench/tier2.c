/* bench/tier2: the second tier on a Redis Cluster (issue 17), its three
 * figures in one run, beside a 3-master Redis Cluster started here on
 * 127.0.0.1 (3 masters with a replica each, no persistence,
 * --cluster-require-full-coverage no) and daemons started with --tier2 on it:
 *
 * 1. Cold restore. Daemon A publishes one K3-shaped snapshot (69 KDA + 24 MLA
 *    layers at 4,096 tokens, ~669 MiB) and copies it to the cluster. Daemon B,
 *    started on an empty store each round (--tier2-wait 5000), is asked for a
 *    prompt extending it (k3cache_lookup: the cluster is searched, the entry
 *    fetched, each chunk and part checked, and written into the local store
 *    as it arrives, each layer checked) and the entry is restored into
 *    pre-touched caller buffers (k3cache_restore_into). The daemon copies
 *    it as a record of version 2 (tier2.h "Block parts"): its MLA rows in
 *    blocks of 64 are parts of their own, the chunks hold the rest. Baseline
 *    of the same run: every byte of the entry from the same cluster with
 *    hiredis GETs of its record (k3:k3cache:e:KEY), every chunk
 *    (k3:k3cache:c:KEY:GEN:I) and every part the record names
 *    (k3:k3cache:p:{NODE:L:P:XXH}, NODE from prefix_block_hashes of the
 *    record's tokens), named as tier2_get names them; each GET sent to the
 *    master owning the key by the project's router (cluster.h), 16 in flight
 *    (chunks, then parts; the daemon's reader sends them in payload order, 16
 *    at a time), each value copied into the caller's buffers; no checks of sums,
 *    but the bytes read must be the entry's and the record's. One untimed
 *    round of each first, then rounds alternating; ratio = GETs' time / cold
 *    restore's time. Each round also prints B's own times for the fetch from
 *    its log (info): record read to entry committed, and the cluster's reads
 *    alone. Daemon A's tier2_bytes_out and tier2_parts_new for the copy are
 *    printed.
 * 2. Hit ratio. A k3worker conversation (tiny model, a process per turn): on
 *    A alone; with turns alternating A and B; all turns on A, then replayed on
 *    a fresh B. Tokens reused / prompt tokens, from the worker's [PREFIX]
 *    lines. After each turn the bench waits until the daemon that served it
 *    has copied its new publishes (Stat tier2_copies and the other outcomes of
 *    a copy), so every turn finds the cluster as complete as it can be.
 * 3. Lookup latency with a master down. Small entries in the cluster from A;
 *    on B, lookups (no restore) of prompts its store lacks (each asks the
 *    cluster: half extend an entry of the cluster, half are new) interleaved
 *    with lookups its store answers whole (no cluster probe): every master
 *    up, right after SIGKILL of one (not node 0), and once its replica has
 *    taken over (node 0 sees three masters, none failed); p50, p99, max, and
 *    how many lookups found the cluster's entry.
 *
 * A benchmark: it prints figures and exits 0 whatever they are.
 * usage: bench_tier2 [DIR] [--quick]   (skipped, exit 0, without
 * redis-server or redis-cli on PATH) */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"
#include "checksum.h"
#include "k3cache/k3cache.h"
#include "k3shape.h"
#include "model.h"
#include "prefix.h"
#include "tier2/cluster.h"
#include "tier2/tier2.h"

#ifndef K3_DAEMON_PATH
#error "K3_DAEMON_PATH must name the k3cached binary"
#endif
#ifndef K3_WORKER_PATH
#error "K3_WORKER_PATH must name the k3worker binary"
#endif

#define SNAP_P     4096u
#define ROUNDS     3
#define NS         "k3cache" /* the daemons' default --tier2-namespace */
#define IN_FLIGHT  16u       /* GETs per pipeline, as tier2_get */
#define N_NODES    6         /* 3 masters, a replica each */
#define N_MASTERS  3
#define MAX_KIDS   32
#define ENTRY_P    512u /* part 3's entries */
#define ASK_TAIL   32u  /* tokens past an entry in a prompt that asks the cluster */
#define N_ENTRIES  8u   /* part 3: entries of the cluster per phase, and of B's store */
#define MAX_TURNS  8
#define WAIT_COPY  180.0 /* seconds a copy may take */
#define PATH_BYTES 768

static char dir[512];
static char seeds[256];
static int ports[N_NODES];
static pid_t node_pid[N_NODES];
static pid_t kids[MAX_KIDS];
static int n_kids;
static int quick;

static void stop_all(void)
{
	for (int i = 0; i < n_kids; i++)
		if (kids[i] > 0) {
			kill(kids[i], SIGTERM);
			waitpid(kids[i], NULL, 0);
			kids[i] = 0;
		}
}

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fflush(stdout);
	fprintf(stderr, "bench_tier2: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (logs in %s)\n", dir);
	va_end(ap);
	stop_all();
	exit(1);
}

static void redirect(const char *path, int fd, int flags)
{
	int f = open(path, flags, 0644);
	if (f >= 0) {
		dup2(f, fd);
		close(f);
	}
}

/* A child running argv, stdin from /dev/null, stdout to out (truncated when
 * trunc) and stderr to err (appended). */
static pid_t start(const char *const *argv, const char *out, int trunc, const char *err)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0) {
		redirect("/dev/null", 0, O_RDONLY);
		redirect(out, 1, O_WRONLY | O_CREAT | (trunc ? O_TRUNC : O_APPEND));
		redirect(err, 2, O_WRONLY | O_CREAT | O_APPEND);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* A long-lived child (a node, a daemon), stopped at the end or by fail(). */
static pid_t spawn(const char *const *argv, const char *log)
{
	if (n_kids == MAX_KIDS)
		fail("too many children");
	pid_t pid = start(argv, log, 0, log);
	kids[n_kids++] = pid;
	return pid;
}

static void stop_pid(pid_t pid, int sig)
{
	for (int i = 0; i < n_kids; i++)
		if (kids[i] == pid) {
			kill(pid, sig);
			waitpid(pid, NULL, 0);
			kids[i] = 0;
		}
}

/* Runs argv to its end: its exit status, or -1 when it did not exit. */
static int run(const char *const *argv, const char *out, int trunc, const char *err)
{
	pid_t pid = start(argv, out, trunc, err);
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static int on_path(const char *prog)
{
	const char *path = getenv("PATH");
	char *copy = strdup(path ? path : "/usr/bin:/bin"), *save = NULL;
	int found = 0;
	for (const char *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !found;
	     d = strtok_r(NULL, ":", &save)) {
		char full[4096];
		snprintf(full, sizeof(full), "%s/%s", d, prog);
		found = access(full, X_OK) == 0;
	}
	free(copy);
	return found;
}

static double ms(double s)
{
	return s * 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The nearest-rank percentile of n values (sorted in place). */
static double pct(double *v, size_t n, double p)
{
	qsort(v, n, sizeof(*v), cmp_double);
	size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	return v[rank ? rank - 1 : 0];
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* ---- the cluster ------------------------------------------------------------ */

static int port_free(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return 0;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int ok = bind(fd, (const struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

static redisContext *node_connect(int i)
{
	struct timeval tv = {1, 0};
	redisContext *r = redisConnectWithTimeout("127.0.0.1", ports[i], tv);
	if (r && r->err) {
		redisFree(r);
		r = NULL;
	}
	return r;
}

/* Whether node i answers cmd with a reply containing want. */
static int node_says(int i, const char *cmd, const char *want)
{
	redisContext *r = node_connect(i);
	if (!r)
		return 0;
	redisReply *rep = redisCommand(r, cmd);
	int ok = rep && (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_STRING) &&
	         strstr(rep->str, want);
	if (rep)
		freeReplyObject(rep);
	redisFree(r);
	return ok;
}

static void node_start(int i)
{
	char ndir[PATH_BYTES], conf[PATH_BYTES + 16], log[PATH_BYTES], port[16];
	snprintf(ndir, sizeof(ndir), "%s/n%d", dir, i);
	snprintf(conf, sizeof(conf), "%s/nodes.conf", ndir);
	snprintf(log, sizeof(log), "%s/redis-%d.log", dir, i);
	snprintf(port, sizeof(port), "%d", ports[i]);
	if (mkdir(ndir, 0755) != 0)
		fail("%s: %s", ndir, strerror(errno));
	const char *argv[] = {"redis-server",
	                      "--port",
	                      port,
	                      "--bind",
	                      "127.0.0.1",
	                      "--cluster-enabled",
	                      "yes",
	                      "--cluster-config-file",
	                      conf,
	                      "--cluster-node-timeout",
	                      "2000",
	                      "--cluster-require-full-coverage",
	                      "no",
	                      "--dir",
	                      ndir,
	                      "--save",
	                      "",
	                      "--appendonly",
	                      "no",
	                      "--daemonize",
	                      "no",
	                      "--protected-mode",
	                      "no",
	                      NULL};
	node_pid[i] = spawn(argv, log);
	for (int t = 0; t < 400; t++) {
		if (node_says(i, "PING", "PONG"))
			return;
		if (waitpid(node_pid[i], NULL, WNOHANG) == node_pid[i])
			fail("redis node %d exited at start-up", i);
		usleep(25000);
	}
	fail("redis node %d did not answer within 10 s", i);
}

static void cluster_start(void)
{
	int base = 20000 + (int)(mix((uint64_t)getpid()) % 20000u);
	for (int i = 0; i < N_NODES; i++) {
		int p = base + i * 7;
		while (!port_free(p) || !port_free(p + 10000))
			p++;
		ports[i] = p;
		node_start(i);
	}
	char addr[N_NODES][32], log[PATH_BYTES];
	for (int i = 0; i < N_NODES; i++)
		snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", ports[i]);
	snprintf(log, sizeof(log), "%s/create.log", dir);
	const char *argv[] = {"redis-cli", "--cluster",     "create", addr[0], addr[1],
	                      addr[2],     addr[3],         addr[4],  addr[5], "--cluster-replicas",
	                      "1",         "--cluster-yes", NULL};
	if (run(argv, log, 1, log) != 0)
		fail("redis-cli --cluster create failed");
	int up = 0;
	for (int t = 0; t < 400 && up < N_NODES; t++) {
		up = 0;
		for (int i = 0; i < N_NODES; i++)
			up += node_says(i, "CLUSTER INFO", "cluster_state:ok");
		if (up < N_NODES)
			usleep(50000);
	}
	if (up < N_NODES)
		fail("the cluster did not come up within 20 s");
	snprintf(seeds, sizeof(seeds), "redis://%s,%s,%s", addr[0], addr[1], addr[2]);
}

/* ---- daemons ---------------------------------------------------------------- */

struct daemon {
	char name[8];
	char db[PATH_BYTES], sock[PATH_BYTES], log[PATH_BYTES];
	pid_t pid;
	struct k3cache *c;
};

/* Starts daemon name on its store (emptied first when fresh). */
static void daemon_start(struct daemon *d, const char *name, int fresh)
{
	snprintf(d->name, sizeof(d->name), "%s", name);
	snprintf(d->db, sizeof(d->db), "%s/%s.db", dir, name);
	snprintf(d->sock, sizeof(d->sock), "%s/%s.sock", dir, name);
	snprintf(d->log, sizeof(d->log), "%s/%s.log", dir, name);
	if (fresh) { /* and its log: a round reads its own lines (fetch_times) */
		benchutil_rm_rf(d->db);
		unlink(d->log);
	}
	unlink(d->sock);
	const char *argv[] = {K3_DAEMON_PATH, "--db",
	                      d->db,          "--socket",
	                      d->sock,        "--max-bytes",
	                      "4GiB",         "--tier2",
	                      seeds,          "--tier2-max-bytes",
	                      "4GiB",         "--tier2-wait",
	                      "5000",         "--log-level",
	                      "info",         NULL};
	d->pid = spawn(argv, d->log);
	d->c = NULL;
	struct k3cache_error e;
	for (int i = 0; i < 1000 && !d->c; i++) {
		struct stat sb;
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid)
			fail("daemon %s exited at start-up", name);
		if (stat(d->sock, &sb) != 0 || k3cache_connect(d->sock, &d->c, &e) != 0) {
			d->c = NULL;
			usleep(10000);
		}
	}
	if (!d->c)
		fail("daemon %s did not come up within 10 s", name);
	k3cache_set_timeout(d->c, 300000);
}

static void daemon_stop(struct daemon *d)
{
	if (d->c)
		k3cache_close(d->c);
	d->c = NULL;
	stop_pid(d->pid, SIGTERM);
}

static uint64_t counter(const struct daemon *d, const char *name)
{
	uint64_t v = 0;
	struct k3cache_error e;
	if (k3cache_stat_counter(d->c, name, &v, &e) != 0)
		fail("daemon %s: stat %s: %s", d->name, name, e.message);
	return v;
}

/* Copies over, whatever their outcome; *bad gets the ones that did not
 * reach the cluster (failed, skipped, too large). */
static uint64_t copies_over(const struct daemon *d, uint64_t *bad)
{
	uint64_t ok = counter(d, "tier2_copies") + counter(d, "tier2_copies_existing");
	uint64_t b = counter(d, "tier2_copies_failed") + counter(d, "tier2_copies_skipped") +
	             counter(d, "tier2_copies_too_large");
	if (bad)
		*bad = b;
	return ok + b;
}

static uint64_t copies_bad; /* over the run */

/* Waits until daemon d's copies over reach target. */
static void wait_copies(const struct daemon *d, uint64_t target)
{
	uint64_t bad0 = 0, bad = 0;
	(void)copies_over(d, &bad0);
	double t0 = benchutil_now();
	while (copies_over(d, &bad) < target) {
		if (benchutil_now() - t0 > WAIT_COPY)
			fail("daemon %s: its copies to the cluster did not end within %.0f s",
			     d->name, WAIT_COPY);
		usleep(5000);
	}
	copies_bad += bad - bad0;
}

static void put_model(const struct daemon *d, const struct k3cache_model *m)
{
	struct k3cache_error e;
	if (k3cache_put_model(d->c, m, NULL, &e) != 0)
		fail("daemon %s: put_model: %s", d->name, e.message);
}

/* ---- 1. cold restore vs hiredis GETs ------------------------------------------ */

struct snap {
	struct k3cache_model *m;
	uint32_t n;
	size_t *sizes, *lens;
	uint64_t *sums;
	void **dst;
	uint64_t total;
	uint32_t *prompt; /* SNAP_P + 1 tokens */
	uint8_t key[32];
};

static void check_bytes(const struct snap *s, const char *what)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (checksum_blob(s->dst[i], s->sizes[i], i) != s->sums[i])
			fail("%s: layer %u differs from what was published", what, i);
}

static void clear_dst(const struct snap *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		memset(s->dst[i], 0, s->sizes[i]);
}

/* From daemon d's log, its line for the fetch it stored ("tier2: fetched
 * ... in X ms (... the cluster's reads took Y ms, of which Z ms waiting
 * ...)"): X, Y and Z, or -1. */
static void fetch_times(const struct daemon *d, double *all_ms, double *reads_ms, double *waited_ms)
{
	*all_ms = *reads_ms = *waited_ms = -1;
	FILE *f = fopen(d->log, "r");
	char line[1024];
	while (f && fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "tier2: fetched ");
		const char *in = p ? strstr(p, " in ") : NULL;
		const char *took = p ? strstr(p, "reads took ") : NULL;
		const char *of = p ? strstr(p, "of which ") : NULL;
		if (in && took && of) {
			*all_ms = strtod(in + 4, NULL);
			*reads_ms = strtod(took + 11, NULL);
			*waited_ms = strtod(of + 9, NULL);
		}
	}
	if (f)
		fclose(f);
}

/* Daemon B on an empty store: a lookup that fetches the entry from the
 * cluster, then its restore into the caller's buffers; the daemon's own
 * times for the fetch (from hand-over to stored, and its reads alone). */
static double cold_round(const struct snap *s, double *t_lookup, double *fetch_ms, double *reads_ms,
                         double *waited_ms)
{
	clear_dst(s);
	struct daemon b;
	daemon_start(&b, "b", 1);
	put_model(&b, s->m);
	const uint8_t *fp = k3cache_model_fingerprint(s->m);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	uint32_t p = 0;
	double t0 = benchutil_now();
	if (k3cache_lookup(b.c, fp, NULL, 0, s->prompt, SNAP_P + 1, 0, &lr, &e) != 0)
		fail("daemon b: lookup: %s", e.message);
	double t1 = benchutil_now();
	if (lr.prefix_len != SNAP_P)
		fail("daemon b: the lookup found %u tokens, not %u (tier2_fetches %llu, "
		     "tier2_misses_missing %llu, tier2_store_refused %llu, tier2_waits_expired "
		     "%llu)",
		     lr.prefix_len, SNAP_P, (unsigned long long)counter(&b, "tier2_fetches"),
		     (unsigned long long)counter(&b, "tier2_misses_missing"),
		     (unsigned long long)counter(&b, "tier2_store_refused"),
		     (unsigned long long)counter(&b, "tier2_waits_expired"));
	if (k3cache_restore_into(b.c, s->m, lr.key, s->dst, s->sizes, s->lens, &p, &e) != 0)
		fail("daemon b: restore: %s", e.message);
	double t2 = benchutil_now();
	check_bytes(s, "cold restore");
	if (counter(&b, "tier2_fetches") != 1 || counter(&b, "tier2_hits") != 1)
		fail("daemon b: expected one fetch and one hit from the cluster");
	fetch_times(&b, fetch_ms, reads_ms, waited_ms);
	if (*fetch_ms < 0)
		fail("daemon b: no \"tier2: fetched\" line in %s", b.log);
	daemon_stop(&b);
	*t_lookup = t1 - t0;
	return t2 - t0;
}

/* Where the bytes of chunks go: the runs of the stream end to end. */
struct sink {
	const struct snap *s;
	const struct tier2_run *g;
	size_t n_seg, seg;
	uint64_t off; /* in the run seg */
};

static void sink_put(struct sink *k, const char *data, size_t len)
{
	while (len) {
		while (k->seg < k->n_seg && k->off == k->g[k->seg].len) {
			k->seg++;
			k->off = 0;
		}
		if (k->seg == k->n_seg)
			fail("GET: the chunks hold more bytes than the entry's stream");
		const struct tier2_run *q = &k->g[k->seg];
		size_t take = q->len - k->off < len ? (size_t)(q->len - k->off) : len;
		memcpy((char *)k->s->dst[q->layer] + q->off + k->off, data, take);
		data += take;
		len -= take;
		k->off += take;
	}
}

/* The runs of rec's stream (tier2_stream_runs), into g (4 per layer); rec's
 * layers must be s's. */
static size_t stream_segs(const struct snap *s, const struct tier2_record *rec, struct tier2_run *g)
{
	for (uint32_t i = 0; i < rec->n_layers; i++)
		if (rec->layers[i].size != s->sizes[i])
			fail("record: layer %u has %llu bytes, not %zu", i,
			     (unsigned long long)rec->layers[i].size, s->sizes[i]);
	return tier2_stream_runs(rec, g);
}

/* One GET's buffers. */
struct get_cmd {
	char name[TIER2_NAME_MAX];
	const char *argv[2];
	size_t len[2];
};

static struct cluster_cmd get_cmd(struct get_cmd *c, size_t name_len)
{
	c->argv[0] = "GET";
	c->argv[1] = c->name;
	c->len[0] = 3;
	c->len[1] = name_len;
	return (struct cluster_cmd){c->name, name_len, 2, c->argv, c->len, NULL, 0};
}

/* A block part of the entry: where it goes, and its name's pieces. */
struct part_at {
	uint32_t layer;
	int part; /* 0 k, 1 v */
	uint64_t xxh3, off, size;
	const uint8_t *node; /* h_{(b+1)B/16} */
};

/* What a GET round read. */
struct get_stats {
	uint32_t n_chunks, n_parts, version, row_block, n_split;
	uint64_t record, chunks, parts; /* value bytes */
};

/* The same bytes with hiredis GETs through the router: the record, then
 * every chunk, then every block part it names (each named as tier2_get names
 * it), IN_FLIGHT GETs per pipeline, each value copied into the caller's
 * buffers where tier2_get puts it; no checks of sums. */
static double get_round(const struct snap *s, struct get_stats *gs)
{
	clear_dst(s);
	memset(gs, 0, sizeof(*gs));
	char err[512];
	struct cluster_options o = {0};
	double t0 = benchutil_now();
	struct cluster_router *r = cluster_router_new(seeds, &o, err, sizeof(err));
	if (!r)
		fail("router: %s", err);
	struct get_cmd c[IN_FLIGHT];
	struct cluster_cmd cmds[IN_FLIGHT];
	cmds[0] = get_cmd(&c[0], tier2_name_record(c[0].name, NS, s->key));
	if (cluster_pipeline(r, cmds, 1) != 0)
		fail("GET %s: %s", c[0].name, cluster_error(r));
	struct tier2_record rec;
	const redisReply *rep = cmds[0].reply;
	if (rep->type != REDIS_REPLY_STRING)
		fail("GET %s: not a string (type %d)", c[0].name, rep->type);
	if (tier2_record_decode(rep->str, rep->len, &rec, err, sizeof(err)) != 0)
		fail("%s: %s", c[0].name, err);
	gs->record = rep->len;
	freeReplyObject(cmds[0].reply);
	if (rec.n_layers != s->n)
		fail("record: %u layers, not %u", rec.n_layers, s->n);
	struct tier2_run *g = calloc((size_t)s->n * 4u, sizeof(*g));
	if (!g)
		fail("out of memory");
	struct sink k = {s, g, stream_segs(s, &rec, g), 0, 0};
	for (uint32_t first = 0; first < rec.n_chunks; first += IN_FLIGHT) {
		uint32_t n = rec.n_chunks - first < IN_FLIGHT ? rec.n_chunks - first : IN_FLIGHT;
		for (uint32_t j = 0; j < n; j++)
			cmds[j] = get_cmd(&c[j], tier2_name_chunk(c[j].name, NS, s->key,
			                                          rec.generation, first + j));
		if (cluster_pipeline(r, cmds, n) != 0)
			fail("GET of chunks: %s", cluster_error(r));
		for (uint32_t j = 0; j < n; j++) {
			if (cmds[j].reply->type != REDIS_REPLY_STRING)
				fail("GET %s: not a string", c[j].name);
			sink_put(&k, cmds[j].reply->str, cmds[j].reply->len);
			gs->chunks += cmds[j].reply->len;
			freeReplyObject(cmds[j].reply);
		}
	}
	while (k.seg < k.n_seg && k.off == g[k.seg].len) {
		k.seg++;
		k.off = 0;
	}
	if (k.seg != k.n_seg)
		fail("GET: the chunks end before the entry's stream");
	free(g);
	/* the parts: per split layer in order, per block b its k then its v
	 * part, named by node h_{(b+1)B/16} of the record's tokens */
	size_t n_parts = 0;
	for (uint32_t i = 0; rec.version == 2 && i < rec.n_split; i++)
		n_parts += 2u * (size_t)(rec.split[i].seq_len / rec.row_block);
	if (n_parts) {
		uint8_t(*h)[PREFIX_NODE_LEN] =
		        malloc(((size_t)rec.n_tokens / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
		struct part_at *pa = calloc(n_parts, sizeof(*pa));
		if (!h || !pa)
			fail("out of memory");
		prefix_block_hashes(rec.fingerprint, rec.salt, rec.salt_len, rec.tokens,
		                    rec.n_tokens, h);
		size_t at = 0;
		for (uint32_t i = 0; i < rec.n_split; i++) {
			const struct tier2_split *sp = &rec.split[i];
			uint32_t nb = sp->seq_len / rec.row_block;
			uint64_t kb = 4u * (uint64_t)sp->seq_len * sp->k_row;
			for (uint32_t b = 0; b < nb; b++)
				for (int part = 0; part < 2; part++, at++) {
					struct part_at *q = &pa[at];
					q->layer = sp->layer;
					q->part = part;
					q->xxh3 = rec.part_xxh3[at];
					q->size = tier2_part_size(sp, rec.row_block, part);
					q->off = TIER2_MLA_HEAD + (uint64_t)b * q->size +
					         (part ? kb + 4u : 0);
					q->node = h[(size_t)(b + 1u) *
					            (rec.row_block / PREFIX_BLOCK)];
				}
		}
		for (size_t first = 0; first < n_parts; first += IN_FLIGHT) {
			size_t n = n_parts - first < IN_FLIGHT ? n_parts - first : IN_FLIGHT;
			for (size_t j = 0; j < n; j++) {
				const struct part_at *q = &pa[first + j];
				cmds[j] =
				        get_cmd(&c[j], tier2_name_part(c[j].name, NS, q->node,
				                                       q->layer, q->part, q->xxh3));
			}
			if (cluster_pipeline(r, cmds, n) != 0)
				fail("GET of parts: %s", cluster_error(r));
			for (size_t j = 0; j < n; j++) {
				const struct part_at *q = &pa[first + j];
				rep = cmds[j].reply;
				if (rep->type != REDIS_REPLY_STRING)
					fail("GET %s: not a string (type %d)", c[j].name,
					     rep->type);
				if (rep->len != q->size || q->off + q->size > s->sizes[q->layer])
					fail("GET %s: %zu bytes at %llu of layer %u, the record "
					     "says %llu",
					     c[j].name, rep->len, (unsigned long long)q->off,
					     q->layer, (unsigned long long)q->size);
				memcpy((char *)s->dst[q->layer] + q->off, rep->str, rep->len);
				gs->parts += rep->len;
				freeReplyObject(cmds[j].reply);
			}
		}
		free(pa);
		free(h);
	}
	cluster_router_free(r);
	double t = benchutil_now() - t0;
	gs->n_chunks = rec.n_chunks;
	gs->n_parts = (uint32_t)n_parts;
	gs->version = rec.version;
	gs->row_block = rec.row_block;
	gs->n_split = rec.n_split;
	tier2_record_free(&rec);
	uint64_t bytes_read = gs->record + gs->chunks + gs->parts;
	if (bytes_read != s->total + gs->record)
		fail("GET: read %llu bytes (record %llu, chunks %llu, parts %llu), not the "
		     "entry's %llu + the record's %llu",
		     (unsigned long long)bytes_read, (unsigned long long)gs->record,
		     (unsigned long long)gs->chunks, (unsigned long long)gs->parts,
		     (unsigned long long)s->total, (unsigned long long)gs->record);
	check_bytes(s, "GET");
	return t;
}

static void part1(struct daemon *a)
{
	char err[MODEL_ERROR_MAX];
	struct snap s = {0};
	uint32_t n_kda = quick ? 6 : 69, n_mla = quick ? 2 : 24;
	s.m = k3shape_model("tier2-bench", n_kda, n_mla, err);
	if (!s.m)
		fail("model: %s", err);
	s.n = s.m->n_layers;
	s.sizes = calloc(s.n, sizeof(*s.sizes));
	s.lens = calloc(s.n, sizeof(*s.lens));
	s.sums = calloc(s.n, sizeof(*s.sums));
	s.dst = calloc(s.n, sizeof(*s.dst));
	s.prompt = calloc(SNAP_P + 1, sizeof(*s.prompt));
	struct k3cache_buf *bufs = calloc(s.n, sizeof(*bufs));
	if (!s.sizes || !s.lens || !s.sums || !s.dst || !s.prompt || !bufs)
		fail("out of memory");
	for (uint32_t i = 0; i < s.n; i++) {
		unsigned char *b = k3shape_blob(&s.m->layers[i], i, SNAP_P, 7, &s.sizes[i]);
		if (!b)
			fail("out of memory");
		s.sums[i] = checksum_blob(b, s.sizes[i], i);
		bufs[i] = (struct k3cache_buf){b, s.sizes[i]};
		s.total += s.sizes[i];
	}
	for (uint32_t i = 0; i <= SNAP_P; i++)
		s.prompt[i] = i * 31u + 7u;
	put_model(a, s.m);
	struct k3cache_publish_result res;
	struct k3cache_error e;
	uint64_t before = copies_over(a, NULL), out0 = counter(a, "tier2_bytes_out"),
	         parts0 = counter(a, "tier2_parts_new"), shared0 = counter(a, "tier2_parts_shared");
	double t0 = benchutil_now();
	if (k3cache_publish(a->c, k3cache_model_fingerprint(s.m), NULL, 0, s.prompt, SNAP_P, bufs,
	                    s.n, &res, &e) != 0)
		fail("daemon a: publish: %s", e.message);
	double t_pub = benchutil_now() - t0;
	wait_copies(a, before + 1);
	double t_copy = benchutil_now() - t0;
	if (counter(a, "tier2_copies") < 1)
		fail("daemon a: the snapshot was not copied to the cluster");
	uint64_t copy_out = counter(a, "tier2_bytes_out") - out0,
	         copy_parts = counter(a, "tier2_parts_new") - parts0,
	         copy_shared = counter(a, "tier2_parts_shared") - shared0;
	memcpy(s.key, res.key, sizeof(s.key));
	for (uint32_t i = 0; i < s.n; i++) {
		free((void *)bufs[i].data);
		/* never write-protected by the fork of a daemon or a worker: a
		 * timed write into them takes no fault (benchutil.h) */
		s.dst[i] = benchutil_private_buffer(s.sizes[i]);
		if (!s.dst[i])
			fail("out of memory");
		memset(s.dst[i], 1, s.sizes[i]); /* pre-touched */
	}
	free(bufs);

	printf("\n1. cold restore from the cluster vs hiredis GETs: %u KDA + %u MLA layers at %u "
	       "tokens, %.1f MiB\n",
	       n_kda, n_mla, SNAP_P, (double)s.total / 1048576.0);
	printf("   daemon A: publish %.0f ms; publish + copy to the cluster %.0f ms (%.2f GB/s)\n",
	       ms(t_pub), ms(t_copy), (double)s.total / t_copy / 1e9);
	printf("   daemon A's copy: tier2_bytes_out %llu, tier2_parts_new %llu, "
	       "tier2_parts_shared %llu\n",
	       (unsigned long long)copy_out, (unsigned long long)copy_parts,
	       (unsigned long long)copy_shared);
	/* one untimed round of each: the first fault of the heap's pages and the
	 * page cache's is then behind both */
	struct get_stats gs;
	double t_lookup = 0, f_all = 0, f_reads = 0, f_wait = 0;
	double w_cold = cold_round(&s, &t_lookup, &f_all, &f_reads, &f_wait);
	double w_get = get_round(&s, &gs);
	printf("   record version %u, row block %u, %u split MLA layers: %u chunks of at most "
	       "1 MiB (%.1f MiB) and %u parts (%.1f MiB)\n",
	       gs.version, gs.row_block, gs.n_split, gs.n_chunks, (double)gs.chunks / 1048576.0,
	       gs.n_parts, (double)gs.parts / 1048576.0);
	uint64_t gs_read = gs.record + gs.chunks + gs.parts;
	printf("   GETs read %llu bytes = the entry's %llu + the record's %llu (record %llu + "
	       "chunks %llu + parts %llu)\n",
	       (unsigned long long)gs_read, (unsigned long long)s.total,
	       (unsigned long long)gs.record, (unsigned long long)gs.record,
	       (unsigned long long)gs.chunks, (unsigned long long)gs.parts);
	printf("   warm-up (untimed): cold %.0f ms, GETs %.0f ms\n", ms(w_cold), ms(w_get));
	printf("   %-7s %10s %10s %10s %7s %10s %7s %8s %10s %10s %10s\n", "round", "cold ms",
	       "lookup ms", "restore ms", "GB/s", "GETs ms", "GB/s", "ratio", "fetch ms",
	       "reads ms", "waited ms");
	double ratio[ROUNDS];
	for (int r = 0; r < ROUNDS; r++) {
		double cold, get;
		if (r % 2 == 0) {
			cold = cold_round(&s, &t_lookup, &f_all, &f_reads, &f_wait);
			get = get_round(&s, &gs);
		} else {
			get = get_round(&s, &gs);
			cold = cold_round(&s, &t_lookup, &f_all, &f_reads, &f_wait);
		}
		ratio[r] = get / cold;
		printf("   %-7d %10.0f %10.0f %10.0f %7.2f %10.0f %7.2f %7.2fx %10.0f %10.0f "
		       "%10.0f\n",
		       r + 1, ms(cold), ms(t_lookup), ms(cold - t_lookup),
		       (double)s.total / cold / 1e9, ms(get), (double)s.total / get / 1e9, ratio[r],
		       f_all, f_reads, f_wait);
	}
	double sorted[ROUNDS];
	memcpy(sorted, ratio, sizeof(sorted));
	qsort(sorted, ROUNDS, sizeof(double), cmp_double);
	printf("   ratio GETs / cold restore: min %.2fx, median %.2fx, max %.2fx (target >= 0.8x: "
	       "%s)\n",
	       sorted[0], sorted[ROUNDS / 2], sorted[ROUNDS - 1],
	       sorted[ROUNDS / 2] >= 0.8 ? "met" : "NOT met");
	printf("   (cold: B started on an empty store, untimed; timed from its lookup, which "
	       "searches the cluster, fetches and checks the entry and stores it, to the end "
	       "of restore_into; GETs: a new router, the record, %u chunk and %u part GETs, %u in "
	       "flight, no checks; fetch: B's own time (its log) from the record read to the "
	       "entry committed, the store writing each stage as it arrived; reads: of that, "
	       "until the cluster's last byte was in; waited: of that, the fetch thread waiting "
	       "for "
	       "the store to free its window; the lookup's rest is the search and the "
	       "wake-ups)\n",
	       gs.n_chunks, gs.n_parts, IN_FLIGHT);
	for (uint32_t i = 0; i < s.n; i++)
		munmap(s.dst[i], s.sizes[i]);
	free(s.dst);
	free(s.sizes);
	free(s.lens);
	free(s.sums);
	free(s.prompt);
	k3cache_model_free(s.m);
}

/* ---- 2. hit ratio of a second daemon ----------------------------------------- */

static const char *const words[] = {
        "the",    "cache",     "keeps", "attention",    "state",      "warm",      "across",
        "worker", "processes", "and",   "restarts",     "so",         "that",      "a",
        "long",   "prompt",    "is",    "not",          "recomputed", "on",        "each",
        "turn",   "of",        "a",     "conversation", "while",      "recurrent", "layers",
        "resume", "exactly",   "where", "the",          "stored",     "prefix",    "ends"};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

static void text(FILE *f, unsigned n, unsigned seed)
{
	for (unsigned i = 0; i < n; i++)
		fprintf(f, "%s ", words[(i * 7u + seed) % N_WORDS]);
}

struct turn {
	uint32_t reused, prompt;
	uint64_t hits; /* the serving daemon's tier2_hits during the turn */
	char who;
};

static char conv[PATH_BYTES];
static int worker_warnings;

static void write_conversation(int turns)
{
	snprintf(conv, sizeof(conv), "%s/conversation.txt", dir);
	FILE *f = fopen(conv, "w");
	if (!f)
		fail("%s: %s", conv, strerror(errno));
	fprintf(f, "System: ");
	text(f, 150, 1);
	fprintf(f, "\n\n");
	for (int t = 1; t <= turns; t++) {
		text(f, 40, (unsigned)t + 1u);
		fprintf(f, "\n\n");
	}
	fclose(f);
}

/* One turn of the conversation in a new k3worker process on daemon d. */
static void run_turn(const struct daemon *d, int k, const char *run_name, const char *salt,
                     struct turn *out)
{
	char kbuf[16], replies[PATH_BYTES], outp[PATH_BYTES], errp[PATH_BYTES];
	snprintf(kbuf, sizeof(kbuf), "%d", k);
	snprintf(replies, sizeof(replies), "%s/%s.replies", dir, run_name);
	snprintf(outp, sizeof(outp), "%s/%s.out", dir, run_name);
	snprintf(errp, sizeof(errp), "%s/%s.err", dir, run_name);
	uint64_t before = copies_over(d, NULL), hits = counter(d, "tier2_hits");
	const char *argv[] = {K3_WORKER_PATH, "--socket", d->sock, "--conversation",
	                      conv,           "--turn",   kbuf,    "--replies",
	                      replies,        "--salt",   salt,    NULL};
	if (run(argv, outp, 1, errp) != 0)
		fail("k3worker turn %d on %s failed (see %s)", k, d->name, errp);
	FILE *f = fopen(outp, "r");
	if (!f)
		fail("%s: %s", outp, strerror(errno));
	char line[1024];
	uint64_t n_new = 0;
	int seen = 0;
	while (fgets(line, sizeof(line), f)) {
		const char *tag = "[PREFIX] reusing ";
		if (!strncmp(line, tag, strlen(tag))) {
			char *end = NULL;
			out->reused = (uint32_t)strtoul(line + strlen(tag), &end, 10);
			const char *of = end ? strstr(end, " of ") : NULL;
			out->prompt = of ? (uint32_t)strtoul(of + 4, NULL, 10) : 0;
			seen = 1;
		}
		n_new += strstr(line, "[CACHE] published") && strstr(line, "(new,");
	}
	fclose(f);
	if (!seen || !out->prompt)
		fail("k3worker turn %d on %s: no [PREFIX] line (see %s)", k, d->name, outp);
	f = fopen(errp, "r");
	if (f) {
		while (fgets(line, sizeof(line), f))
			worker_warnings += strstr(line, "warning") != NULL;
		fclose(f);
		f = fopen(errp, "w"); /* counted: start the next turn empty */
		if (f)
			fclose(f);
	}
	wait_copies(d, before + n_new);
	out->hits = counter(d, "tier2_hits") - hits;
	out->who = d->name[0] == 'a' ? 'A' : 'B';
}

static void ratio_of(const struct turn *t, int turns, int from, uint64_t *reused, uint64_t *total)
{
	*reused = *total = 0;
	for (int k = from; k < turns; k++) {
		*reused += t[k].reused;
		*total += t[k].prompt;
	}
}

static void part2(struct daemon *a)
{
	int turns = quick ? 4 : MAX_TURNS;
	write_conversation(turns);
	struct turn single[MAX_TURNS] = {0}, alt[MAX_TURNS] = {0}, warm[MAX_TURNS] = {0},
	            replay[MAX_TURNS] = {0};
	struct daemon b;
	daemon_start(&b, "b", 1);
	uint64_t exp0 = counter(a, "tier2_waits_expired") + counter(&b, "tier2_waits_expired");
	for (int k = 1; k <= turns; k++)
		run_turn(a, k, "single", "tier2-single", &single[k - 1]);
	for (int k = 1; k <= turns; k++)
		run_turn(k % 2 ? a : &b, k, "alt", "tier2-alt", &alt[k - 1]);
	for (int k = 1; k <= turns; k++)
		run_turn(a, k, "warm", "tier2-replay", &warm[k - 1]);
	uint64_t expired = counter(a, "tier2_waits_expired") + counter(&b, "tier2_waits_expired");
	daemon_stop(&b);
	daemon_start(&b, "b", 1);
	for (int k = 1; k <= turns; k++)
		run_turn(&b, k, "replay", "tier2-replay", &replay[k - 1]);
	expired += counter(&b, "tier2_waits_expired");
	daemon_stop(&b);

	printf("\n2. hit ratio: k3worker --model tiny, %d turns, a process per turn; tokens "
	       "reused / prompt tokens\n",
	       turns);
	printf("   %-5s %7s %14s %18s %22s\n", "turn", "prompt", "single (A)", "alternating A/B",
	       "replay on fresh B");
	for (int k = 0; k < turns; k++) {
		char c1[32], c2[32], c3[40];
		snprintf(c1, sizeof(c1), "%u", single[k].reused);
		snprintf(c2, sizeof(c2), "%u on %c%s", alt[k].reused, alt[k].who,
		         alt[k].hits ? " (t2)" : "");
		snprintf(c3, sizeof(c3), "%u%s", replay[k].reused, replay[k].hits ? " (t2)" : "");
		printf("   %-5d %7u %14s %18s %22s\n", k + 1, single[k].prompt, c1, c2, c3);
	}
	const struct turn *runs[3] = {single, alt, replay};
	const char *names[3] = {"single daemon (A)", "alternating A/B", "replay on fresh B"};
	for (int i = 0; i < 3; i++) {
		uint64_t r1, n1, r2, n2;
		ratio_of(runs[i], turns, 0, &r1, &n1);
		ratio_of(runs[i], turns, 1, &r2, &n2);
		printf("   %-20s all turns %6llu / %6llu = %5.1f%%   turns 2..%d %6llu / %6llu = "
		       "%5.1f%%\n",
		       names[i], (unsigned long long)r1, (unsigned long long)n1,
		       100.0 * (double)r1 / (double)n1, turns, (unsigned long long)r2,
		       (unsigned long long)n2, 100.0 * (double)r2 / (double)n2);
	}
	uint64_t rw, nw;
	ratio_of(warm, turns, 0, &rw, &nw);
	uint64_t rs, ns, ra, na;
	ratio_of(single, turns, 1, &rs, &ns);
	ratio_of(alt, turns, 1, &ra, &na);
	printf("   second daemon vs single, turns 2..%d: alternating %.3fx; (warming run on A: "
	       "%.1f%%)\n",
	       turns, ((double)ra / (double)na) / ((double)rs / (double)ns),
	       100.0 * (double)rw / (double)nw);
	printf("   (t2): the serving daemon answered that turn with an entry fetched from the "
	       "cluster; each turn waited for the serving daemon's copies; lookups that gave up "
	       "waiting (tier2_waits_expired): %llu; worker warnings: %d\n",
	       (unsigned long long)(expired - exp0), worker_warnings);
}

/* ---- 3. lookup latency with a master down ---------------------------------------- */

struct lookups {
	struct k3cache_model *m;
	uint32_t tokens[ENTRY_P + ASK_TAIL];
};

/* Entry e's tokens (seeded by e), ENTRY_P of them, then n - ENTRY_P tail
 * tokens seeded by tail (0: none). */
static void entry_tokens(uint32_t *t, uint32_t e, uint32_t n, uint64_t tail)
{
	for (uint32_t j = 0; j < n; j++)
		t[j] = (uint32_t)mix(j < ENTRY_P ? ((uint64_t)e << 32) | j : (tail << 20) | j);
}

static void publish_entries(const struct daemon *d, const struct k3cache_model *m, uint32_t from,
                            uint32_t n)
{
	uint32_t nl = m->n_layers;
	struct k3cache_buf *bufs = calloc(nl, sizeof(*bufs));
	uint32_t *t = calloc(ENTRY_P, sizeof(*t));
	if (!bufs || !t)
		fail("out of memory");
	for (uint32_t i = 0; i < nl; i++) {
		size_t len = 0;
		bufs[i].data = k3shape_blob(&m->layers[i], i, ENTRY_P, 3, &len);
		bufs[i].len = len;
		if (!bufs[i].data)
			fail("out of memory");
	}
	uint64_t before = copies_over(d, NULL);
	for (uint32_t e = from; e < from + n; e++) {
		struct k3cache_publish_result res;
		struct k3cache_error err;
		entry_tokens(t, e, ENTRY_P, 0);
		if (k3cache_publish(d->c, k3cache_model_fingerprint(m), NULL, 0, t, ENTRY_P, bufs,
		                    nl, &res, &err) != 0)
			fail("daemon %s: publish: %s", d->name, err.message);
	}
	wait_copies(d, before + n);
	for (uint32_t i = 0; i < nl; i++)
		free((void *)bufs[i].data);
	free(bufs);
	free(t);
}

#define P3_COUNTERS                                                                                \
	X(lookups)                                                                                 \
	X(hits)                                                                                    \
	X(fetches)                                                                                 \
	X(lookup_errors)                                                                           \
	X(misses_node_error)                                                                       \
	X(misses_timeout)                                                                          \
	X(node_errors)                                                                             \
	X(timeouts)                                                                                \
	X(waits_expired)                                                                           \
	X(resent)

struct p3_counts {
#define X(n) uint64_t n;
	P3_COUNTERS
#undef X
};

static void p3_read(const struct daemon *d, struct p3_counts *c)
{
#define X(n) c->n = counter(d, "tier2_" #n);
	P3_COUNTERS
#undef X
}

/* n lookups asking the cluster (entries from_entry.. of the cluster,
 * extended, and new prompts, alternately) interleaved with n answered whole
 * by B's store (entries local_from..); times in ask[] and local[]. */
static void lookup_phase(const struct daemon *b, const struct k3cache_model *m, uint32_t phase,
                         uint32_t from_entry, uint32_t local_from, size_t n, double *ask,
                         double *local, uint32_t *found)
{
	const uint8_t *fp = k3cache_model_fingerprint(m);
	uint32_t t[ENTRY_P + ASK_TAIL];
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	*found = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t tail = ((uint64_t)phase << 32) | i;
		if (i % 2 == 0)
			entry_tokens(t, from_entry + (uint32_t)(i / 2) % N_ENTRIES,
			             ENTRY_P + ASK_TAIL, tail + 1);
		else /* a prompt no entry starts */
			entry_tokens(t, 0x80000000u | phase << 24 | (uint32_t)i, ENTRY_P + ASK_TAIL,
			             tail + 1);
		double t0 = benchutil_now();
		if (k3cache_lookup(b->c, fp, NULL, 0, t, ENTRY_P + ASK_TAIL, 0, &lr, &e) != 0)
			fail("daemon b: lookup: %s", e.message);
		ask[i] = benchutil_now() - t0;
		*found += lr.prefix_len == ENTRY_P;
		entry_tokens(t, local_from + (uint32_t)i % N_ENTRIES, ENTRY_P + 1, tail + 1);
		t0 = benchutil_now();
		if (k3cache_lookup(b->c, fp, NULL, 0, t, ENTRY_P + 1, 0, &lr, &e) != 0)
			fail("daemon b: lookup: %s", e.message);
		local[i] = benchutil_now() - t0;
		if (lr.prefix_len != ENTRY_P)
			fail("daemon b: a lookup of its own entry found %u tokens", lr.prefix_len);
	}
}

static void p3_row(const char *what, double *v, size_t n)
{
	double p50 = pct(v, n, 50), p99 = pct(v, n, 99), max = pct(v, n, 100);
	printf("   %-46s %8.3f %8.3f %9.3f\n", what, ms(p50), ms(p99), ms(max));
}

/* Node i's answer to cmd as text (a string or status), or "" . */
static void node_text(int i, const char *cmd, char *out, size_t outsz)
{
	out[0] = 0;
	redisContext *r = node_connect(i);
	if (!r)
		return;
	redisReply *rep = redisCommand(r, cmd);
	if (rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS))
		snprintf(out, outsz, "%s", rep->str);
	if (rep)
		freeReplyObject(rep);
	redisFree(r);
}

/* A master other than node 0 (which answers the bench's questions). */
static int victim_master(void)
{
	char role[64];
	for (int i = 1; i < N_NODES; i++) {
		redisContext *r = node_connect(i);
		if (!r)
			continue;
		redisReply *rep = redisCommand(r, "ROLE");
		int master = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
		             rep->element[0]->type == REDIS_REPLY_STRING;
		if (master)
			snprintf(role, sizeof(role), "%s", rep->element[0]->str);
		if (rep)
			freeReplyObject(rep);
		redisFree(r);
		if (master && !strcmp(role, "master"))
			return i;
	}
	fail("no master besides node 0");
}

/* Whether node 0 sees the node of id `gone` failed (FAIL agreed, not PFAIL)
 * and N_MASTERS others serving slots: a replica has taken over from it. */
static int failed_over(const char *gone)
{
	static char nodes[1 << 16];
	node_text(0, "CLUSTER NODES", nodes, sizeof(nodes));
	int ok = 0, dead = 0;
	for (char *line = strtok(nodes, "\n"); line; line = strtok(NULL, "\n")) {
		int fields = 0;
		char flags[128] = "";
		int is_gone = !strncmp(line, gone, strlen(gone)) && line[strlen(gone)] == ' ';
		for (char *p = line; *p;) {
			while (*p == ' ')
				p++;
			if (!*p)
				break;
			fields++;
			char *end = strchr(p, ' ');
			size_t len = end ? (size_t)(end - p) : strlen(p);
			if (fields == 3 && len < sizeof(flags))
				snprintf(flags, sizeof(flags), "%.*s", (int)len, p);
			p += len;
		}
		ok += fields >= 9 && strstr(flags, "master") && !strstr(flags, "fail");
		dead |= is_gone && strstr(flags, "fail") && !strstr(flags, "fail?");
	}
	return dead && ok == N_MASTERS;
}

static void part3(struct daemon *a)
{
	size_t n = quick ? 200 : 2000;
	char err[MODEL_ERROR_MAX];
	struct model_layer l[4];
	for (int i = 0; i < 3; i++)
		l[i] = (struct model_layer){
		        .mixer = MODEL_MIXER_KDA, .conv_len = 256, .recurrent_len = 2048};
	l[3] = (struct model_layer){.mixer = MODEL_MIXER_MLA, .k_row = 64, .v_row = 16};
	struct k3cache_model *m = model_new("tier2-lookup", "bench", "bench", l, 4, err);
	if (!m)
		fail("model: %s", err);
	enum { PHASES = 3 };
	double *ask[PHASES], *local[PHASES], secs[PHASES];
	uint32_t found[PHASES];
	struct p3_counts c[PHASES + 1];
	for (int ph = 0; ph < PHASES; ph++) {
		ask[ph] = calloc(n, sizeof(double));
		local[ph] = calloc(n, sizeof(double));
		if (!ask[ph] || !local[ph])
			fail("out of memory");
	}
	put_model(a, m);
	publish_entries(a, m, 0, PHASES * N_ENTRIES); /* in the cluster: each phase's own */
	struct daemon b;
	daemon_start(&b, "b", 1);
	put_model(&b, m);
	publish_entries(&b, m, 1000, N_ENTRIES); /* in B's store (and the cluster) */
	double t_kill = 0, t_fail = 0;
	int victim = victim_master();
	char victim_id[64];
	node_text(victim, "CLUSTER MYID", victim_id, sizeof(victim_id));
	if (!victim_id[0])
		fail("node %d does not say its id", victim);
	for (int ph = 0; ph < PHASES; ph++) {
		if (ph == 1) {
			stop_pid(node_pid[victim], SIGKILL);
			t_kill = benchutil_now();
		}
		if (ph == 2) {
			while (!failed_over(victim_id) && benchutil_now() - t_kill < 30.0)
				usleep(50000);
			t_fail = benchutil_now() - t_kill;
		}
		p3_read(&b, &c[ph]);
		double t0 = benchutil_now();
		lookup_phase(&b, m, (uint32_t)ph + 1, (uint32_t)ph * N_ENTRIES, 1000, n, ask[ph],
		             local[ph], &found[ph]);
		secs[ph] = benchutil_now() - t0;
	}
	p3_read(&b, &c[PHASES]);

	static const char *const phase_name[PHASES] = {"all masters up", "a master SIGKILLed",
	                                               "its replica took over"};
	printf("\n3. lookup latency on daemon B (--tier2-wait 5000), %zu lookups of each kind "
	       "per phase, interleaved\n",
	       n);
	printf("   %-46s %8s %8s %9s\n", "lookups", "p50 ms", "p99 ms", "max ms");
	double p99_down = 0;
	for (int ph = 0; ph < PHASES; ph++) {
		char what[96];
		snprintf(what, sizeof(what), "%s: asks the cluster", phase_name[ph]);
		p3_row(what, ask[ph], n);
		if (ph > 0 && pct(ask[ph], n, 99) > p99_down)
			p99_down = pct(ask[ph], n, 99);
		snprintf(what, sizeof(what), "%s: local answer complete", phase_name[ph]);
		p3_row(what, local[ph], n);
	}
	printf("   target p99 < 5 ms with a master down: %s (worst phase %.3f ms)\n",
	       p99_down < 0.005 ? "met" : "NOT met", ms(p99_down));
	for (int ph = 0; ph < PHASES; ph++) {
		printf("   %s (%.2f s): prompts asking the cluster that found an entry: %u of "
		       "%zu (half extend one of %u cluster entries); B's tier2 counters:",
		       phase_name[ph], secs[ph], found[ph], n, N_ENTRIES);
#define X(f) printf(" %s %llu", #f, (unsigned long long)(c[ph + 1].f - c[ph].f));
		P3_COUNTERS
#undef X
		printf("\n");
	}
	printf("   (SIGKILL of a master (node %d); its replica had taken over %.1f s later "
	       "(cluster-node-timeout 2000 ms, cluster-require-full-coverage no); the second "
	       "down phase starts then)\n",
	       victim, t_fail);
	daemon_stop(&b);
	for (int ph = 0; ph < PHASES; ph++) {
		free(ask[ph]);
		free(local[ph]);
	}
	k3cache_model_free(m);
}

int main(int argc, char **argv)
{
	const char *d = "bench-tier2.tmp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else
			d = argv[i];
	}
	if (!on_path("redis-server") || !on_path("redis-cli")) {
		printf("bench/tier2: skipped: redis-server or redis-cli is not on PATH "
		       "(scripts/install-deps)\n");
		return 0;
	}
	/* absolute: redis-server enters its --dir before it opens its
	 * --cluster-config-file, which a relative path would then miss */
	char cwd[256];
	if (d[0] != '/' && getcwd(cwd, sizeof(cwd)))
		snprintf(dir, sizeof(dir), "%s/%s", cwd, d);
	else
		snprintf(dir, sizeof(dir), "%s", d);
	benchutil_rm_rf(dir);
	if (mkdir(dir, 0755) != 0)
		fail("%s: %s", dir, strerror(errno));
	signal(SIGPIPE, SIG_IGN);
	/* hiredis allocates each GET's value: keep freed memory in the heap, so
	 * that the GETs are not charged for faulting fresh pages in at every
	 * reply (as bench/redis) */
	mallopt(M_MMAP_MAX, 0);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	double t0 = benchutil_now();
	cluster_start();
	printf("bench/tier2%s: a Redis Cluster of 3 masters with a replica each on "
	       "127.0.0.1:%d,%d,%d...; daemons with "
	       "--tier2, --tier2-wait 5000, --max-bytes 4GiB, --tier2-max-bytes 4GiB\n",
	       quick ? " (quick)" : "", ports[0], ports[1], ports[2]);
	struct daemon a;
	daemon_start(&a, "a", 1);
	part1(&a);
	part2(&a);
	part3(&a);
	daemon_stop(&a);
	printf("\ncopies that did not reach the cluster: %llu; run time %.0f s\n",
	       (unsigned long long)copies_bad, benchutil_now() - t0);
	stop_all();
	benchutil_rm_rf(dir);
	return 0;
}
