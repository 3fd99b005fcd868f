/* cluster: the router itself: a connection and a backoff per node, the slot
 * map, commands routed by slot with MOVED and ASK followed, pipelines grouped
 * by node. The parsers it trusts nothing to are in cluster_parse.c; the
 * contract is in cluster.h. */
#include <errno.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include "tier2/cluster.h"

/* nodes the router knows: seeds, the map's masters, redirections' targets */
#define ROUTER_MAX_NODES (CLUSTER_MAX_NODES + CLUSTER_MAX_SEEDS + 256)
/* a redirection's target to be read from the map once it is refreshed */
#define RESOLVE (-2)
/* a command whose node could not be reached or dropped its connection (not
 * a timeout): sent once more if the refreshed map names another node */
#define GONE (-3)

/* A round trip's time on one node (time_left). */
struct trip {
	uint64_t start;  /* ms, monotonic */
	uint64_t moved;  /* bytes written and read so far */
	uint64_t last;   /* ms: when a byte last moved (or the trip began) */
	uint64_t queued; /* bytes of its commands in this socket's queue (reading) */
};

struct node {
	struct cluster_addr addr;
	redisContext *ctx;
	unsigned failures;  /* in a row */
	uint64_t retry_at;  /* ms, monotonic: not tried before */
	unsigned mark;      /* cluster_pipeline's round */
	char last_err[200]; /* why it failed last */
	int used;           /* 0: a free entry (an address no map names any more) */
	unsigned gen;       /* bumped when the entry is reused for another address */
	int timeout_ms;     /* the socket's timeouts now (shortened near a deadline) */
	struct trip trip;   /* cluster_pipeline's round on it */
	struct cluster_reply_budget budget; /* the reply being read: its objects' memory */
};

struct cluster_router {
	char *user, *password;
	int connect_ms, command_ms, backoff_min_ms, backoff_max_ms;
	size_t max_reply; /* bytes of a reply whose command sets no bound */
	size_t n_seeds;   /* nodes[0..n_seeds) */
	struct node *nodes;
	size_t n_nodes;
	uint16_t slot[CLUSTER_SLOTS];       /* index into nodes, or CLUSTER_NO_NODE */
	uint16_t master[CLUSTER_MAX_NODES]; /* the map's masters, by address */
	size_t n_masters;
	int have_map, map_stale;
	int map_holes;    /* the map gives some slot no master */
	int must_refresh; /* a MOVED to an unknown endpoint: read the map at once */
	uint64_t refreshed_at;
	size_t refresh_next; /* the node a refresh asks first */
	unsigned round;
	int pause;          /* a reply said TRYAGAIN: pause before the next round */
	int fail_timed_out; /* the last node failure ran out of time */
	struct cluster_map *scratch;
	struct cluster_stats stats;
	char err[512];
};

static void seterr(struct cluster_router *r, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
static void seterr(struct cluster_router *r, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->err, sizeof(r->err), fmt, ap);
	va_end(ap);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct timeval tv_ms(int ms)
{
	struct timeval tv = {ms / 1000, (long)(ms % 1000) * 1000};
	return tv;
}

/* "host:port", "[v6]:port" */
static const char *addr_text(const struct cluster_addr *a, char *buf, size_t bufsz)
{
	if (strchr(a->host, ':'))
		snprintf(buf, bufsz, "[%s]:%d", a->host, a->port);
	else
		snprintf(buf, bufsz, "%s:%d", a->host, a->port);
	return buf;
}

/* A command's name for messages: argv[0], printable, at most 32 bytes. */
static const char *cmd_name(const char *arg, size_t len, char *buf, size_t bufsz)
{
	size_t n = 0;
	for (size_t i = 0; i < len && i < 32 && n + 1 < bufsz; i++) {
		unsigned char c = (unsigned char)arg[i];
		char ch = '?';
		if (c > 0x20 && c < 0x7f)
			ch = arg[i];
		buf[n++] = ch;
	}
	buf[n] = '\0';
	return buf;
}

static void node_close(struct node *n)
{
	if (n->ctx)
		redisFree(n->ctx);
	n->ctx = NULL;
}

static int find_node(const struct cluster_router *r, const struct cluster_addr *a)
{
	for (size_t i = 0; i < r->n_nodes; i++)
		if (r->nodes[i].used && r->nodes[i].addr.port == a->port &&
		    strcmp(r->nodes[i].addr.host, a->host) == 0)
			return (int)i;
	return -1;
}

/* The node's index, added when new (in a free entry if there is one); -1
 * when the router knows too many. */
static int node_index(struct cluster_router *r, const struct cluster_addr *a)
{
	int i = find_node(r, a);
	if (i >= 0)
		return i;
	size_t at = r->n_seeds;
	while (at < r->n_nodes && r->nodes[at].used)
		at++;
	if (at == ROUTER_MAX_NODES) {
		char txt[272];
		seterr(r, "cluster: cannot add node %s: the router knows %d nodes already",
		       addr_text(a, txt, sizeof(txt)), ROUTER_MAX_NODES);
		return -1;
	}
	struct node *n = &r->nodes[at];
	unsigned gen = n->gen + 1;
	node_close(n); /* (a free entry has none; never leak one) */
	memset(n, 0, sizeof(*n));
	n->addr = *a;
	n->used = 1;
	n->gen = gen;
	if (at == r->n_nodes)
		r->n_nodes++;
	return (int)at;
}

/* Records a failure of node n in `what` (a command's name, "connect"...):
 * the router's message, the node's backoff, the counters. */
static void node_fail(struct cluster_router *r, struct node *n, const char *what,
                      const char *reason, int timed_out)
{
	char at[272];
	seterr(r, "redis %s: %s: %s", addr_text(&n->addr, at, sizeof(at)), what, reason);
	snprintf(n->last_err, sizeof(n->last_err), "%s: %s", what, reason);
	r->stats.node_errors++;
	r->fail_timed_out = timed_out;
	if (timed_out)
		r->stats.timeouts++;
	node_close(n);
	if (n->failures < 32)
		n->failures++;
	uint64_t delay = (uint64_t)r->backoff_min_ms
	                 << (n->failures - 1 < 16 ? n->failures - 1 : 16);
	if (delay > (uint64_t)r->backoff_max_ms)
		delay = (uint64_t)r->backoff_max_ms;
	n->retry_at = now_ms() + delay;
	r->map_stale = 1; /* its slots may have moved (failover) */
}

/* After a hiredis call on n->ctx failed: why, in words, and whether it ran
 * out of time. err_no is errno right after the call. */
static void node_io_fail(struct cluster_router *r, struct node *n, const char *what, int err_no)
{
	redisContext *c = n->ctx;
	char reason[200];
	int timed_out = 0;
	if (!c) {
		snprintf(reason, sizeof(reason), "no connection");
	} else if (c->err == REDIS_ERR_IO &&
	           (err_no == EAGAIN || err_no == EWOULDBLOCK || err_no == ETIMEDOUT)) {
		timed_out = 1;
		snprintf(reason, sizeof(reason), "timed out after %d ms", r->command_ms);
	} else if (c->err == REDIS_ERR_OOM) {
		snprintf(reason, sizeof(reason),
		         "reply refused (an array of more than %d elements, or out of memory)",
		         CLUSTER_REPLY_MAX_ELEMENTS);
	} else if (c->err == REDIS_ERR_PROTOCOL) {
		snprintf(reason, sizeof(reason), "protocol error: %s", c->errstr);
	} else {
		snprintf(reason, sizeof(reason), "%s", c->err ? c->errstr : "no reply");
	}
	node_fail(r, n, what, reason, timed_out);
}

/* Replies are read a buffer at a time (hiredis reads 16 KiB a call): what a
 * reply may have read beyond its bound before it is refused. */
#define READ_SLACK (64u << 10)

/* A round trip on one node may take command_ms, and a millisecond more for
 * each MIN_BYTES_PER_MS bytes it has moved: a node that takes or sends its
 * bytes at 1 MiB/s or more is never cut off however many they are (a
 * pipeline's 16 MiB of chunks), and one that trickles them (a byte at a
 * time, each within the socket's timeout) ends at about command_ms. */
#define MIN_BYTES_PER_MS 1024u

/* A round trip on n begun now, the socket's timeouts back at command_ms. */
static struct trip trip_begin(struct cluster_router *r, struct node *n)
{
	if (n->ctx && n->timeout_ms != r->command_ms) {
		if (redisSetTimeout(n->ctx, tv_ms(r->command_ms)) == REDIS_OK)
			n->timeout_ms = r->command_ms;
		else /* hiredis keeps the error (c->err): the trip's first
		      * write fails with it, the node's failure */
			n->timeout_ms = 0;
	}
	uint64_t now = now_ms();
	return (struct trip){now, 0, now, 0};
}

/* Bytes in n's socket queue that the node has yet to take (SIOCOUTQ); 0
 * when it cannot say. */
static uint64_t queued_bytes(const struct node *n)
{
	int q = 0;
	return n->ctx && ioctl(n->ctx->fd, SIOCOUTQ, &q) == 0 && q > 0 ? (uint64_t)q : 0;
}

/* Where trip t's reading begins: its time starts again (a node read after
 * another that was slow has its own), and the bytes of its commands still
 * queued are watched: the node taking them is progress while it has not
 * answered yet (the socket's buffers hold MiBs). */
static void trip_reading(struct node *n, struct trip *t)
{
	t->start = t->last = now_ms();
	t->moved = 0;
	t->queued = queued_bytes(n);
}

/* What is left of trip t on n, in ms: until command_ms after a byte last
 * moved, and within command_ms plus a millisecond per MIN_BYTES_PER_MS
 * moved since it began; 0 (the node failed, timed out, recorded) when
 * nothing is. */
static uint64_t trip_left(struct cluster_router *r, struct node *n, const char *what,
                          const struct trip *t)
{
	uint64_t pace = t->start + (uint64_t)r->command_ms + t->moved / MIN_BYTES_PER_MS;
	uint64_t idle = t->last + (uint64_t)r->command_ms;
	uint64_t deadline = pace < idle ? pace : idle, now = now_ms();
	if (now < deadline)
		return deadline - now;
	char reason[160];
	if (deadline == idle || t->moved < MIN_BYTES_PER_MS) /* nothing, or next to nothing */
		snprintf(reason, sizeof(reason), "timed out after %d ms", r->command_ms);
	else
		snprintf(reason, sizeof(reason),
		         "timed out after %llu ms: %llu bytes moved, under 1 MiB/s",
		         (unsigned long long)(now - t->start), (unsigned long long)t->moved);
	node_fail(r, n, what, reason, 1);
	return 0;
}

/* Before a write of trip t on n: the socket's timeouts cut to what is left
 * of it, so that no system call outlasts it. 0, or -1 (the node failed,
 * timed out) once it has none left. */
static int time_left(struct cluster_router *r, struct node *n, const char *what,
                     const struct trip *t)
{
	uint64_t left = trip_left(r, n, what, t);
	if (!left)
		return -1;
	if (left > INT_MAX)
		left = INT_MAX;
	if (left != (uint64_t)n->timeout_ms) {
		if (redisSetTimeout(n->ctx, tv_ms((int)left)) != REDIS_OK) {
			node_fail(r, n, what, "cannot set the socket timeouts", 0);
			return -1;
		}
		n->timeout_ms = (int)left;
	}
	return 0;
}

/* Writes what is appended to n's connection within trip t: 0, or -1 after
 * the node's failure is recorded. */
static int flush_node(struct cluster_router *r, struct node *n, const char *what, struct trip *t)
{
	int done = 0;
	while (!done) {
		if (time_left(r, n, what, t) != 0)
			return -1;
		size_t before = sdslen(n->ctx->obuf);
		errno = 0;
		if (redisBufferWrite(n->ctx, &done) != REDIS_OK) {
			node_io_fail(r, n, what, errno);
			return -1;
		}
		size_t wrote = before - sdslen(n->ctx->obuf);
		t->moved += wrote;
		if (wrote)
			t->last = now_ms();
	}
	return 0;
}

/* Waits until n's socket has bytes to read, within trip t, counting the node
 * taking its commands' queued bytes as progress: 0, or -1 (the node failed,
 * recorded). */
static int wait_readable(struct cluster_router *r, struct node *n, const char *what, struct trip *t)
{
	for (;;) {
		uint64_t left = trip_left(r, n, what, t);
		if (!left)
			return -1;
		struct pollfd p = {.fd = n->ctx->fd, .events = POLLIN};
		int rc = poll(&p, 1, left < 50 ? (int)left : 50);
		if (rc > 0)
			return 0; /* readable, or an error or hang-up the read reports */
		if (rc < 0 && errno != EINTR) { /* (no hiredis call failed: say why) */
			char reason[160];
			snprintf(reason, sizeof(reason), "poll: %s", strerror(errno));
			node_fail(r, n, what, reason, 0);
			return -1;
		}
		uint64_t q = queued_bytes(n);
		if (q < t->queued) {
			t->moved += t->queued - q;
			t->last = now_ms();
		}
		t->queued = q;
	}
}

/* The next reply on n's connection, whole within trip t, and refused once
 * it has read more than max bytes (a peer may announce a string of any
 * length, or an array of many, and hiredis keeps all of it), or once its
 * objects would take more than max bytes (an array of small elements takes
 * 18 times its bytes: a redisReply each); NULL after the node's failure is
 * recorded. Its commands must have been written (flush_node), and no reply
 * be begun (a failed one closes the connection). */
static redisReply *read_reply(struct cluster_router *r, struct node *n, const char *what,
                              struct trip *t, size_t max)
{
	redisContext *c = n->ctx;
	uint64_t fed = 0; /* bytes read while this reply was incomplete */
	n->budget.left = max < SIZE_MAX - READ_SLACK ? max + READ_SLACK : SIZE_MAX;
	n->budget.over = 0;
	for (;;) {
		void *rep = NULL;
		if (redisGetReplyFromReader(c, &rep) != REDIS_OK) {
			if (n->budget.over) {
				char reason[120];
				snprintf(reason, sizeof(reason),
				         "reply refused: its objects take more than %zu bytes",
				         max);
				node_fail(r, n, what, reason, 0);
				return NULL;
			}
			node_io_fail(r, n, what, 0);
			return NULL;
		}
		if (rep)
			return rep;
		if (fed > (uint64_t)max + READ_SLACK) {
			char reason[120];
			snprintf(reason, sizeof(reason), "reply refused: longer than %zu bytes",
			         max);
			node_fail(r, n, what, reason, 0);
			return NULL;
		}
		if (wait_readable(r, n, what, t) != 0)
			return NULL;
		/* hiredis appends what it reads to the reader's buffer, which
		 * only a reply taken out of it moves */
		size_t before = c->reader->len;
		errno = 0;
		if (redisBufferRead(c) != REDIS_OK) {
			node_io_fail(r, n, what, errno);
			return NULL;
		}
		size_t got = c->reader->len >= before ? c->reader->len - before : c->reader->len;
		fed += got;
		t->moved += got;
		if (got)
			t->last = now_ms();
	}
}

/* One round trip on a connected node (ASKING first when asking); NULL
 * after the node's failure is recorded. */
static redisReply *roundtrip_max(struct cluster_router *r, struct node *n, const char *what,
                                 int asking, int argc, const char **argv, const size_t *argvlen,
                                 size_t max)
{
	errno = 0;
	if ((asking && redisAppendCommand(n->ctx, "ASKING") != REDIS_OK) ||
	    redisAppendCommandArgv(n->ctx, argc, argv, argvlen) != REDIS_OK) {
		node_io_fail(r, n, what, errno);
		return NULL;
	}
	struct trip t = trip_begin(r, n); /* once the commands are copied */
	if (flush_node(r, n, what, &t) != 0)
		return NULL;
	trip_reading(n, &t);
	if (asking) {
		redisReply *ok = read_reply(r, n, "ASKING", &t, max);
		if (!ok)
			return NULL;
		freeReplyObject(ok);
	}
	return read_reply(r, n, what, &t, max);
}

static redisReply *roundtrip(struct cluster_router *r, struct node *n, const char *what, int argc,
                             const char **argv, const size_t *argvlen)
{
	return roundtrip_max(r, n, what, 0, argc, argv, argvlen, r->max_reply);
}

/* The node's connection, opened (and authenticated) when it has none; NULL
 * with the message set when it cannot be, or is backing off. */
static redisContext *node_ready(struct cluster_router *r, int idx)
{
	struct node *n = &r->nodes[idx];
	char at[272];
	if (n->ctx)
		return n->ctx;
	r->fail_timed_out = 0; /* a node backing off costs no time */
	uint64_t now = now_ms();
	if (n->retry_at > now) {
		r->stats.backoff_skips++;
		seterr(r, "redis %s: not tried for another %llu ms after a failure (%s)",
		       addr_text(&n->addr, at, sizeof(at)), (unsigned long long)(n->retry_at - now),
		       n->last_err);
		return NULL;
	}
	r->stats.connects++;
	errno = 0;
	n->ctx = redisConnectWithTimeout(n->addr.host, n->addr.port, tv_ms(r->connect_ms));
	int err_no = errno;
	if (!n->ctx) { /* hiredis could not allocate its context: not the node's doing */
		r->stats.nomem++;
		seterr(r, "redis %s: connect: out of memory", addr_text(&n->addr, at, sizeof(at)));
		return NULL;
	}
	if (n->ctx->err) {
		char reason[200];
		int timed_out = err_no == ETIMEDOUT || err_no == EINPROGRESS;
		if (timed_out)
			snprintf(reason, sizeof(reason), "timed out after %d ms", r->connect_ms);
		else
			snprintf(reason, sizeof(reason), "%s", n->ctx->errstr);
		node_fail(r, n, "connect", reason, timed_out);
		return NULL;
	}
	if (redisSetTimeout(n->ctx, tv_ms(r->command_ms)) != REDIS_OK) {
		node_fail(r, n, "connect", "cannot set the socket timeouts", 0);
		return NULL;
	}
	n->timeout_ms = r->command_ms;
	cluster_reader_charge(n->ctx->reader, &n->budget); /* (entries never move) */
	if (r->password) {
		const char *argv[3] = {"AUTH", r->user, r->password};
		size_t lens[3] = {4, r->user ? strlen(r->user) : 0, strlen(r->password)};
		int argc = 3;
		if (!r->user) {
			argv[1] = r->password;
			lens[1] = lens[2];
			argc = 2;
		}
		redisReply *rep = roundtrip(r, n, "AUTH", argc, argv, lens);
		if (!rep)
			return NULL;
		int ok = rep->type == REDIS_REPLY_STATUS && rep->len == 2 &&
		         memcmp(rep->str, "OK", 2) == 0;
		if (!ok) {
			char reason[200];
			int err = rep->type == REDIS_REPLY_ERROR && rep->str;
			if (err)
				snprintf(reason, sizeof(reason), "%.*s",
				         (int)(rep->len < 150 ? rep->len : 150), rep->str);
			else
				snprintf(reason, sizeof(reason), "unexpected reply (type %d)",
				         rep->type);
			/* credentials refused, which waiting does not mend; not, say,
			 * "max number of clients reached", which a node at maxclients
			 * answers whatever comes first */
			if (err &&
			    (strstr(reason, "WRONGPASS") || strstr(reason, "invalid password") ||
			     strstr(reason, "invalid username-password") ||
			     strstr(reason, "without any password configured")))
				r->stats.auth_refused++;
			freeReplyObject(rep);
			node_fail(r, n, "AUTH", reason, 0);
			return NULL;
		}
		freeReplyObject(rep);
	}
	return n->ctx;
}

static void node_ok(struct node *n)
{
	n->failures = 0;
	n->retry_at = 0;
}

struct cluster_router *cluster_router_new(const char *seeds, const struct cluster_options *opt,
                                          char *err, size_t errsz)
{
	static const struct cluster_options none = {0};
	if (!opt)
		opt = &none;
	struct cluster_seeds s;
	if (cluster_seeds_parse(seeds, &s, err, errsz) != 0)
		return NULL;
	if (opt->user && !opt->password) {
		snprintf(err, errsz, "cluster: ACL user \"%.64s\" without a password", opt->user);
		return NULL;
	}
	if (opt->connect_timeout_ms < 0 || opt->command_timeout_ms < 0 || opt->backoff_min_ms < 0 ||
	    opt->backoff_max_ms < 0) {
		snprintf(err, errsz, "cluster: a negative timeout or backoff");
		return NULL;
	}
	struct cluster_router *r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errsz, "cluster: out of memory");
		return NULL;
	}
	r->connect_ms = opt->connect_timeout_ms ? opt->connect_timeout_ms : 1000;
	r->command_ms = opt->command_timeout_ms ? opt->command_timeout_ms : 1000;
	r->backoff_min_ms = opt->backoff_min_ms ? opt->backoff_min_ms : 100;
	r->backoff_max_ms = opt->backoff_max_ms ? opt->backoff_max_ms : 5000;
	r->max_reply = opt->max_reply_bytes ? opt->max_reply_bytes : CLUSTER_REPLY_MAX_BYTES;
	if (r->backoff_max_ms < r->backoff_min_ms) {
		snprintf(err, errsz, "cluster: backoff_max_ms %d is below backoff_min_ms %d",
		         r->backoff_max_ms, r->backoff_min_ms);
		free(r);
		return NULL;
	}
	r->nodes = calloc(ROUTER_MAX_NODES, sizeof(*r->nodes));
	r->scratch = malloc(sizeof(*r->scratch));
	r->user = opt->user ? strdup(opt->user) : NULL;
	r->password = opt->password ? strdup(opt->password) : NULL;
	if (!r->nodes || !r->scratch || (opt->user && !r->user) ||
	    (opt->password && !r->password)) {
		cluster_router_free(r);
		snprintf(err, errsz, "cluster: out of memory");
		return NULL;
	}
	for (size_t i = 0; i < s.n; i++) {
		r->nodes[i].addr = s.addr[i];
		r->nodes[i].used = 1;
	}
	r->n_nodes = r->n_seeds = s.n;
	for (size_t i = 0; i < CLUSTER_SLOTS; i++)
		r->slot[i] = CLUSTER_NO_NODE;
	return r;
}

void cluster_router_free(struct cluster_router *r)
{
	if (!r)
		return;
	for (size_t i = 0; r->nodes && i < r->n_nodes; i++)
		node_close(&r->nodes[i]);
	if (r->password) {
		explicit_bzero(r->password, strlen(r->password));
		free(r->password);
	}
	free(r->user);
	free(r->nodes);
	free(r->scratch);
	free(r);
}

static int addr_cmp(const struct cluster_addr *a, const struct cluster_addr *b)
{
	int c = strcmp(a->host, b->host);
	return c ? c : (a->port > b->port) - (a->port < b->port);
}

/* Installs r->scratch (parsed from node `from`) as the map. */
static int install_map(struct cluster_router *r)
{
	const struct cluster_map *m = r->scratch;
	uint16_t idx[CLUSTER_MAX_NODES] = {0};
	/* addresses neither a seed nor in the new map are forgotten (their
	 * entries reused), so that a cluster whose nodes change addresses
	 * (restarted pods) never fills the table and dead ones leave the
	 * refreshes' rotation. A command still headed for a freed entry is
	 * routed anew (`used`), and a node that is not the slot's answers MOVED. */
	unsigned char *keep = calloc(r->n_nodes ? r->n_nodes : 1, 1);
	if (!keep) {
		r->stats.nomem++;
		seterr(r, "cluster: out of memory for a slot map");
		return -1;
	}
	for (size_t k = 0; k < m->n_nodes; k++) {
		int i = find_node(r, &m->node[k]);
		if (i >= 0)
			keep[i] = 1;
	}
	for (size_t i = r->n_seeds; i < r->n_nodes; i++) {
		if (r->nodes[i].used && !keep[i]) {
			node_close(&r->nodes[i]);
			r->nodes[i].used = 0;
			r->stats.nodes_forgotten++;
		}
	}
	free(keep);
	for (size_t k = 0; k < m->n_nodes; k++) {
		int i = node_index(r, &m->node[k]);
		if (i < 0)
			return -1;
		idx[k] = (uint16_t)i;
	}
	r->map_holes = 0;
	for (size_t s = 0; s < CLUSTER_SLOTS; s++) {
		r->slot[s] = m->slot[s] == CLUSTER_NO_NODE ? CLUSTER_NO_NODE : idx[m->slot[s]];
		r->map_holes |= r->slot[s] == CLUSTER_NO_NODE;
	}
	/* the masters by address (an insertion sort: at most CLUSTER_MAX_NODES) */
	r->n_masters = 0;
	for (size_t k = 0; k < m->n_nodes; k++) {
		size_t j = r->n_masters++;
		while (j > 0 &&
		       addr_cmp(&r->nodes[r->master[j - 1]].addr, &r->nodes[idx[k]].addr) > 0) {
			r->master[j] = r->master[j - 1];
			j--;
		}
		r->master[j] = idx[k];
	}
	r->have_map = 1;
	r->map_stale = 0;
	r->stats.map_refreshes++;
	return 0;
}

int cluster_refresh(struct cluster_router *r)
{
	static const char *argv[] = {"CLUSTER", "SLOTS"};
	static const size_t lens[] = {7, 5};
	char last[sizeof(r->err)] = "no node to ask";
	/* a refresh that succeeds leaves the message of the failure before it
	 * (the command that made the map stale), not a node it passed over */
	char before[sizeof(r->err)];
	memcpy(before, r->err, sizeof(before));
	size_t tried = 0;
	r->refreshed_at = now_ms();
	size_t n = r->n_nodes;
	for (size_t k = 0; k < n; k++) {
		size_t i = (r->refresh_next + k) % n;
		if (!r->nodes[i].used)
			continue;
		tried++;
		if (!node_ready(r, (int)i)) {
			snprintf(last, sizeof(last), "%s", r->err);
			continue;
		}
		struct node *nd = &r->nodes[i];
		redisReply *rep = roundtrip(r, nd, "CLUSTER SLOTS", 2, argv, lens);
		if (!rep) {
			snprintf(last, sizeof(last), "%s", r->err);
			continue;
		}
		char why[200], at[272];
		int rc = cluster_map_parse(rep, nd->addr.host, r->scratch, why, sizeof(why));
		freeReplyObject(rep);
		if (rc != 0) {
			/* the node answered: not a connection's failure, but no map */
			snprintf(last, sizeof(last), "redis %s: %s",
			         addr_text(&nd->addr, at, sizeof(at)), why);
			continue;
		}
		node_ok(nd);
		r->refresh_next = (i + 1) % n;
		memcpy(r->err, before, sizeof(before));
		return install_map(r);
	}
	seterr(r, "cluster: no node gave a slot map (%zu asked); last: %s", tried, last);
	return -1;
}

/* Refreshes the map when there is none, when it is stale and the last
 * refresh is older than backoff_min_ms, or when it gives some slot no
 * master and the last is older than backoff_max_ms (a master whose slots
 * were unassigned when it was read, which no command on a key may meet);
 * a failed refresh keeps the old map. */
static int maybe_refresh(struct cluster_router *r)
{
	if (!r->have_map)
		return cluster_refresh(r);
	uint64_t since = now_ms() - r->refreshed_at;
	if ((r->map_stale && since >= (uint64_t)r->backoff_min_ms) ||
	    (r->map_holes && since >= (uint64_t)r->backoff_max_ms))
		(void)cluster_refresh(r);
	return 0;
}

/* The node for slot, from the map; -1 with the message set. */
static int slot_target(struct cluster_router *r, unsigned slot)
{
	if (r->slot[slot] == CLUSTER_NO_NODE) {
		/* a map read while the slot had none (a cluster being made, a
		 * master failing over): read again, within the refresh limit */
		r->map_stale = 1;
		seterr(r, "cluster: slot %u has no known master", slot);
		return -1;
	}
	return r->slot[slot];
}

/* What a redirection means for a command: its next node (and whether ASKING
 * goes first); the map updated on MOVED, and refreshed when can_refresh (no
 * connection has replies pending). -1 with the message set; RESOLVE when the
 * map must be read again first and cannot be now. */
static int follow(struct cluster_router *r, const struct node *from, const char *name,
                  const struct cluster_redirect *rd, int can_refresh, int *asking)
{
	char at[272];
	if (rd->kind == CLUSTER_REDIRECT_ASK) {
		r->stats.asks++;
		*asking = 1;
		if (rd->unknown_host) {
			seterr(r, "redis %s: %s: ASK for slot %u to a node of unknown endpoint",
			       addr_text(&from->addr, at, sizeof(at)), name, rd->slot);
			return -1;
		}
		return node_index(r, &rd->addr);
	}
	r->stats.moved++;
	*asking = 0;
	r->map_stale = 1;
	if (rd->unknown_host) {
		/* the map may know its address: read it at once (a pipeline
		 * does so between rounds) */
		if (!can_refresh) {
			r->must_refresh = 1;
			return RESOLVE;
		}
		(void)cluster_refresh(r);
		return slot_target(r, rd->slot);
	}
	/* the map read first: it may forget addresses, the target's among them */
	if (can_refresh)
		(void)maybe_refresh(r);
	int i = node_index(r, &rd->addr);
	if (i < 0)
		return -1;
	r->slot[rd->slot] = (uint16_t)i; /* newer than any map */
	return i;
}

/* A reply from node `from` to a command for slot: 1 when it is final (kept
 * in *reply), 0 when it redirected the command to *target, -1 on failure
 * (message set). Frees a redirection's reply. */
static int judge(struct cluster_router *r, struct node *from, const char *name, unsigned slot,
                 redisReply *rep, int can_refresh, int *target, int *asking)
{
	node_ok(from);
	if (rep->type != REDIS_REPLY_ERROR)
		return 1;
	if (rep->len >= 8 && !memcmp(rep->str, "TRYAGAIN", 8)) {
		/* a command on several keys of a slot that is moving, some of
		 * them moved: sent again, routed anew, after a pause */
		freeReplyObject(rep);
		r->stats.tryagains++;
		r->pause = 1;
		*target = RESOLVE;
		*asking = 0;
		return 0;
	}
	struct cluster_redirect rd;
	char why[200], at[272];
	int rc = cluster_redirect_parse(rep->str, rep->len, from->addr.host, &rd, why, sizeof(why));
	if (rc == 0)
		return 1;
	freeReplyObject(rep);
	if (rc < 0) {
		seterr(r, "redis %s: %s: %s", addr_text(&from->addr, at, sizeof(at)), name, why);
		return -1;
	}
	if (rd.slot != slot) {
		/* Redis names the slot of the command's keys: another is from a
		 * confused or hostile node, whose word moves no slot and no
		 * command (it fails, as on a protocol error, and makes the map
		 * stale) */
		snprintf(why, sizeof(why),
		         "protocol error: %s for slot %u, not the command's slot %u",
		         rd.kind == CLUSTER_REDIRECT_ASK ? "ASK" : "MOVED", rd.slot, slot);
		node_fail(r, from, name, why, 0);
		return -1;
	}
	*target = follow(r, from, name, &rd, can_refresh, asking);
	return *target == -1 ? -1 : 0;
}

/* Before a command that met TRYAGAIN is sent again: 10 ms, doubling with
 * each attempt (at most 160 ms; CLUSTER_MAX_REDIRECTS attempts). */
static void tryagain_pause(struct cluster_router *r, int attempt)
{
	r->pause = 0;
	long ms = 10L << (attempt < 4 ? attempt : 4);
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* After node `failed` could not be reached, or dropped its connection,
 * while a command for slot was on its way (not a timeout: a call's time
 * stays bounded): the node the refreshed map names for slot when that is
 * another (a replica promoted by a failover), where the command is sent
 * once more; -1 otherwise, with the failure's message kept. The commands
 * sent here may thus reach a node twice (the first time unanswered): the
 * callers' commands are idempotent (cluster.h). */
static int failed_over(struct cluster_router *r, unsigned slot, int failed, unsigned failed_gen)
{
	if (r->fail_timed_out)
		return -1;
	char why[sizeof(r->err)];
	memcpy(why, r->err, sizeof(why));
	(void)maybe_refresh(r);
	int t = r->slot[slot] == CLUSTER_NO_NODE ? -1 : r->slot[slot];
	memcpy(r->err, why, sizeof(why));
	if (t < 0 || (t == failed && r->nodes[t].gen == failed_gen))
		return -1; /* (an entry reused by the map just read is another node) */
	r->stats.resent++;
	return t;
}

int cluster_command_argv(struct cluster_router *r, const char *key, size_t keylen, int argc,
                         const char **argv, const size_t *argvlen, redisReply **reply)
{
	char name[40];
	*reply = NULL;
	if (argc < 1 || !argv || !argvlen) {
		seterr(r, "cluster: a command with no arguments");
		return -1;
	}
	cmd_name(argv[0], argvlen[0], name, sizeof(name));
	unsigned slot = cluster_key_slot(key, keylen);
	if (maybe_refresh(r) != 0)
		return -1;
	int target = slot_target(r, slot);
	int asking = 0, resent = 0;
	for (int hop = 0; target >= 0; hop++) {
		if (!r->nodes[target].used) { /* forgotten by a map read meanwhile */
			asking = 0;
			if ((target = slot_target(r, slot)) < 0)
				return -1;
		}
		struct node *n = &r->nodes[target];
		if (!node_ready(r, target)) {
			if (asking || resent ||
			    (target = failed_over(r, slot, target, r->nodes[target].gen)) < 0)
				return -1;
			resent = 1;
			continue;
		}
		redisReply *rep =
		        roundtrip_max(r, n, name, asking, argc, argv, argvlen, r->max_reply);
		if (!rep) {
			if (asking || resent ||
			    (target = failed_over(r, slot, target, r->nodes[target].gen)) < 0)
				return -1;
			resent = 1;
			continue;
		}
		int rc = judge(r, n, name, slot, rep, 1, &target, &asking);
		if (rc > 0) {
			*reply = rep;
			return 0;
		}
		if (rc < 0)
			return -1;
		if (target == RESOLVE) { /* TRYAGAIN */
			tryagain_pause(r, hop);
			target = slot_target(r, slot);
			if (target < 0) /* the map lost the slot: the message is set */
				return -1;
		}
		if (hop + 1 > CLUSTER_MAX_REDIRECTS) {
			char at[272];
			seterr(r, "cluster: %s: more than %d redirections for slot %u (last to %s)",
			       name, CLUSTER_MAX_REDIRECTS, slot,
			       addr_text(&r->nodes[target].addr, at, sizeof(at)));
			return -1;
		}
	}
	return -1;
}

/* A pipelined command's state between rounds. */
struct pstate {
	int target;          /* node index, RESOLVE, GONE (with `failed`), or -1: done or failed */
	int asking;          /* ASKING goes first */
	int sent;            /* the node it was appended to this round, or -1 */
	int failed;          /* GONE: the node that failed it */
	unsigned failed_gen; /* and its entry's generation then */
	int resent;          /* sent again after its node failed (once at most) */
};

/* The command's node failed: GONE (sent once more after the map is
 * refreshed, when it names another node) or failed for good. */
static void pipeline_lost(struct pstate *st, int t, unsigned gen, int timed_out)
{
	st->target = timed_out || st->resent || st->asking ? -1 : GONE;
	st->failed = t;
	st->failed_gen = gen;
	st->sent = -1;
}

/* Appends every command of node t this round and writes them (a trip);
 * on failure none of them gets a reply. */
static void pipeline_append(struct cluster_router *r, int t, struct cluster_cmd *cmds,
                            struct pstate *st, size_t n)
{
	struct node *nd = &r->nodes[t];
	int ok = node_ready(r, t) != NULL;
	for (size_t i = 0; ok && i < n; i++) {
		if (st[i].target != t)
			continue;
		errno = 0;
		if (st[i].asking)
			ok = redisAppendCommand(nd->ctx, "ASKING") == REDIS_OK;
		if (ok)
			ok = redisAppendCommandArgv(nd->ctx, cmds[i].argc, cmds[i].argv,
			                            cmds[i].argvlen) == REDIS_OK;
		if (ok)
			st[i].sent = t;
		else
			node_io_fail(r, nd, "pipeline", errno);
	}
	/* written now, so that every node of the round works at once */
	if (ok) {
		nd->trip = trip_begin(r, nd); /* once the commands are copied */
		ok = flush_node(r, nd, "pipeline", &nd->trip) == 0;
	}
	if (!ok) { /* its connection is closed: no command of it gets a reply */
		int timed_out = r->fail_timed_out;
		for (size_t i = 0; i < n; i++)
			if (st[i].target == t)
				pipeline_lost(&st[i], t, nd->gen, timed_out);
	}
}

/* Reads the replies of node t's commands, in the order they were appended.
 * Its trip's reading begins now (trip_reading): a node read after another
 * that was slow has its own time, its replies perhaps waiting in the
 * socket. */
static void pipeline_read(struct cluster_router *r, int t, struct cluster_cmd *cmds,
                          struct pstate *st, size_t n)
{
	struct node *nd = &r->nodes[t];
	trip_reading(nd, &nd->trip);
	char name[40];
	int timed_out = 0; /* the node's failure this round */
	for (size_t i = 0; i < n; i++) {
		if (st[i].sent != t)
			continue;
		st[i].sent = -1;
		cmd_name(cmds[i].argv[0], cmds[i].argvlen[0], name, sizeof(name));
		size_t max = cmds[i].max_reply ? cmds[i].max_reply : r->max_reply;
		redisReply *rep = NULL;
		if (nd->ctx) { /* NULL: failed on an earlier reply */
			int ok = 1;
			if (st[i].asking) {
				redisReply *a = read_reply(r, nd, "ASKING", &nd->trip, max);
				ok = a != NULL;
				freeReplyObject(a);
			}
			if (ok)
				rep = read_reply(r, nd, name, &nd->trip, max);
			if (!rep)
				timed_out = r->fail_timed_out;
		}
		if (!rep) {
			pipeline_lost(&st[i], t, nd->gen, timed_out);
			continue;
		}
		int target = t, asking = 0;
		int rc = judge(r, nd, name, cluster_key_slot(cmds[i].key, cmds[i].keylen), rep, 0,
		               &target, &asking);
		if (rc > 0) {
			cmds[i].reply = rep;
			st[i].target = -1;
		} else {
			st[i].target = rc < 0 ? -1 : target;
			st[i].asking = asking;
		}
	}
}

size_t cluster_pipeline(struct cluster_router *r, struct cluster_cmd *cmds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cmds[i].reply = NULL;
	if (n == 0)
		return 0;
	struct pstate *st = calloc(n, sizeof(*st));
	int *order = calloc(ROUTER_MAX_NODES, sizeof(*order)); /* the nodes of a round */
	if (!st || !order) {
		free(st);
		free(order);
		r->stats.nomem++;
		seterr(r, "cluster: pipeline of %zu commands: out of memory", n);
		return n;
	}
	int have_map = maybe_refresh(r) == 0;
	for (size_t i = 0; i < n; i++) {
		st[i].target = -1;
		st[i].sent = -1;
		if (cmds[i].argc < 1 || !cmds[i].argv || !cmds[i].argvlen)
			seterr(r, "cluster: pipeline: command %zu has no arguments", i);
		else if (have_map)
			st[i].target =
			        slot_target(r, cluster_key_slot(cmds[i].key, cmds[i].keylen));
	}
	for (int round = 0; round <= CLUSTER_MAX_REDIRECTS; round++) {
		size_t k = 0;
		r->round++;
		for (size_t i = 0; i < n; i++) {
			if (st[i].target >= 0 && !r->nodes[st[i].target].used) {
				/* forgotten by a map read meanwhile: routed anew */
				st[i].asking = 0;
				st[i].target = slot_target(
				        r, cluster_key_slot(cmds[i].key, cmds[i].keylen));
			}
			int t = st[i].target;
			if (t < 0 || r->nodes[t].mark == r->round)
				continue;
			r->nodes[t].mark = r->round;
			order[k++] = t;
		}
		if (k == 0)
			break;
		/* everything written first, so that the nodes work at once */
		for (size_t j = 0; j < k; j++)
			pipeline_append(r, order[j], cmds, st, n);
		for (size_t j = 0; j < k; j++)
			pipeline_read(r, order[j], cmds, st, n);
		/* every connection is drained: the map may be read now */
		if (r->pause)
			tryagain_pause(r, round);
		/* the message stays the failed command's (its node, its cause),
		 * whatever the map's read meets */
		char why[sizeof(r->err)];
		memcpy(why, r->err, sizeof(why));
		if (r->must_refresh)
			(void)cluster_refresh(r);
		else
			(void)maybe_refresh(r);
		r->must_refresh = 0;
		memcpy(r->err, why, sizeof(why));
		for (size_t i = 0; i < n; i++) {
			unsigned slot = cluster_key_slot(cmds[i].key, cmds[i].keylen);
			if (st[i].target == RESOLVE) {
				st[i].target = slot_target(r, slot);
			} else if (st[i].target == GONE && round == CLUSTER_MAX_REDIRECTS) {
				st[i].target = -1; /* no round left to send it in */
			} else if (st[i].target == GONE) {
				r->fail_timed_out = 0;
				st[i].target = failed_over(r, slot, st[i].failed, st[i].failed_gen);
				st[i].resent = st[i].target >= 0;
			}
		}
	}
	size_t failed = 0;
	for (size_t i = 0; i < n; i++) {
		if (st[i].target >= 0)
			seterr(r, "cluster: pipeline: more than %d redirections for slot %u",
			       CLUSTER_MAX_REDIRECTS,
			       cluster_key_slot(cmds[i].key, cmds[i].keylen));
		failed += cmds[i].reply == NULL;
	}
	free(st);
	free(order);
	return failed;
}

const char *cluster_error(const struct cluster_router *r)
{
	return r->err;
}

struct cluster_stats cluster_stats(const struct cluster_router *r)
{
	return r->stats;
}

int cluster_slot_node(const struct cluster_router *r, unsigned slot, struct cluster_addr *out)
{
	if (slot >= CLUSTER_SLOTS || r->slot[slot] == CLUSTER_NO_NODE)
		return -1;
	*out = r->nodes[r->slot[slot]].addr;
	return 0;
}

size_t cluster_n_masters(struct cluster_router *r)
{
	if (maybe_refresh(r) != 0)
		return 0;
	return r->n_masters;
}

int cluster_command_node(struct cluster_router *r, size_t master, int argc, const char **argv,
                         const size_t *argvlen, redisReply **reply)
{
	char name[40];
	*reply = NULL;
	if (argc < 1 || !argv || !argvlen) {
		seterr(r, "cluster: a command with no arguments");
		return -1;
	}
	cmd_name(argv[0], argvlen[0], name, sizeof(name));
	if (maybe_refresh(r) != 0)
		return -1;
	if (master >= r->n_masters) {
		seterr(r, "cluster: %s: no master %zu (the map has %zu)", name, master,
		       r->n_masters);
		return -1;
	}
	int t = r->master[master];
	if (!node_ready(r, t))
		return -1;
	redisReply *rep = roundtrip(r, &r->nodes[t], name, argc, argv, argvlen);
	if (!rep)
		return -1;
	node_ok(&r->nodes[t]);
	*reply = rep;
	return 0;
}
