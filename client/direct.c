/* direct: lookups and restores from the store's own file, in the worker's
 * process (k3cache/direct.h). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blob_stream.h"
#include "frame.h"
#include "k3cache/direct.h"
#include "k3cache_raw.h"
#include "model.h"
#include "status.h"
#include "store.h"
#include "store/env.h" /* STORE_MAX_SALT */

struct view_priv;

/* Threads that check the layers of one restore or view unless
 * K3CACHE_DIRECT_THREADS says otherwise: the checks (XXH3, the finite scan)
 * cost a core more than the copy, so one core cannot keep up with memcpy. */
#define THREADS_MAX     16
#define THREADS_DEFAULT 4
/* Below this many bytes an entry is checked on the calling thread alone. */
#define THREADS_MIN_BYTES ((uint64_t)32 << 20)

/* Uses reported to the daemon in one Report. */
#define REPORT_BATCH 256
/* A Report is advisory: the reader waits at most this for the daemon's
 * answer (a daemon stopped or hung would hold a restore for the client's
 * 60 s), and after a failure tries again no sooner than REPORT_RETRY_MIN
 * seconds, doubled after each failure up to REPORT_RETRY_MAX (a daemon
 * restarted is found again; one that stays hung costs a wait that rarely). */
#define REPORT_TIMEOUT_MS 500
#define REPORT_RETRY_MIN  1.0
#define REPORT_RETRY_MAX  60.0

struct k3cache_direct {
	struct store *s;
	struct k3cache *daemon; /* where uses and damage are reported; NULL: none now */
	char *daemon_addr;      /* to connect again (NULL: the default socket) */
	double retry_at;        /* when daemon is NULL: no connect before then */
	double retry_wait;      /* the wait after the next failure */
	uint8_t used[REPORT_BATCH][K3CACHE_KEY_LEN];
	uint32_t n_used;
	unsigned char ns[128]; /* the daemon's namespace for this process's salts */
	size_t ns_len;
	double view_seconds;     /* a view's life; 0: no limit */
	unsigned threads;        /* checking a restore or a view: layers on this many threads */
	struct view_priv *views; /* live views, oldest last */
	pid_t pid;               /* the process that opened it (after fork(), not the child) */
};

/* Bytes copied between two checks of a layer: the check reads them while
 * they are still in cache. */
#define COPY_PIECE ((size_t)64 << 10)

static double now(void);

/* The daemon did not answer, or could not be reached: none until the wait,
 * which doubles. */
static void lost(struct k3cache_direct *d)
{
	k3cache_close(d->daemon);
	d->daemon = NULL;
	d->retry_at = now() + d->retry_wait;
	d->retry_wait = d->retry_wait * 2 < REPORT_RETRY_MAX ? d->retry_wait * 2 : REPORT_RETRY_MAX;
}

/* The connection reports go down: connects again to a daemon that was lost
 * once the wait after the failure has passed. 0, or -1 (none now). */
static int report_conn(struct k3cache_direct *d)
{
	if (d->daemon)
		return 0;
	if (now() < d->retry_at)
		return -1;
	struct k3cache_error e;
	if (k3cache_connect_within(d->daemon_addr, REPORT_TIMEOUT_MS, &d->daemon, &e) != 0) {
		lost(d);
		return -1;
	}
	return 0;
}

/* Sends the uses batched so far and a damaged key (or none) to the daemon,
 * one round trip of at most REPORT_TIMEOUT_MS. A daemon that cannot be
 * reached or does not answer loses the report, not a read. */
static void report(struct k3cache_direct *d, const uint8_t *damaged)
{
	if (!d->n_used && !damaged)
		return;
	if (report_conn(d) != 0) {
		d->n_used = 0;
		return;
	}
	ProtobufCBinaryData used[REPORT_BATCH], bad = {K3CACHE_KEY_LEN, (uint8_t *)damaged};
	for (uint32_t i = 0; i < d->n_used; i++)
		used[i] = (ProtobufCBinaryData){K3CACHE_KEY_LEN, d->used[i]};
	K3cache__V1__Report rep = K3CACHE__V1__REPORT__INIT;
	rep.n_used = d->n_used;
	rep.used = used;
	rep.n_damaged = damaged ? 1 : 0;
	rep.damaged = &bad;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_REPORT;
	req.report = &rep;
	frame_response *resp;
	struct k3cache_error e;
	if (k3cache_call(d->daemon, &req, &resp, &e) != 0) {
		lost(d); /* broken or hung: connect again later */
	} else {
		k3cache_response_free(resp);
		d->retry_wait = REPORT_RETRY_MIN;
	}
	d->n_used = 0;
}

/* A restore or a view made here: a use, reported in batches. */
static void note_use(struct k3cache_direct *d, const uint8_t *key)
{
	memcpy(d->used[d->n_used++], key, K3CACHE_KEY_LEN);
	if (d->n_used == REPORT_BATCH)
		report(d, NULL);
}

/* After a restore or a view of key: a use, or damage the daemon is told of
 * at once (it checks the entry and quarantines it). */
static void settle(struct k3cache_direct *d, const uint8_t *key, int rc)
{
	if (rc == 0)
		note_use(d, key);
	else if (rc == STATUS_CORRUPT)
		report(d, key);
}

/* A view's life unless K3CACHE_DIRECT_VIEW_SECONDS says otherwise. */
#define VIEW_SECONDS 30.0

struct view_priv {
	struct k3cache_direct *d;
	struct k3cache_direct_view *view;
	struct store_snapshot *snap; /* NULL once expired */
	struct k3cache_view_layer *layers;
	struct k3cache_buf *pieces;
	size_t n_pieces;
	double born;
	struct view_priv *prev, *next;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Ends a view's read transaction: its pages may be reused from now on, so
 * its pieces' data are taken away (NULL; their lengths stay, so that a
 * copy through one faults rather than copying nothing), and it is off the
 * live list. */
static void expire(struct view_priv *pv)
{
	if (!pv->snap)
		return;
	/* a child after fork() must not end its parent's read transaction: its
	 * slot in the reader table is the parent's (the snapshot is left) */
	if (pv->d->pid == getpid())
		store_snapshot_release(pv->snap);
	pv->snap = NULL;
	for (size_t i = 0; i < pv->n_pieces; i++)
		pv->pieces[i].data = NULL;
	if (pv->prev)
		pv->prev->next = pv->next;
	else
		pv->d->views = pv->next;
	if (pv->next)
		pv->next->prev = pv->prev;
	pv->prev = pv->next = NULL;
}

/* Expires the views held past their life (every call into d does this
 * first): a view forgotten by its caller does not pin the file for ever. */
static void expire_old(struct k3cache_direct *d)
{
	if (d->view_seconds <= 0)
		return;
	double t = now();
	for (struct view_priv *pv = d->views, *next; pv; pv = next) {
		next = pv->next;
		if (t - pv->born >= d->view_seconds)
			expire(pv);
	}
}

__attribute__((format(printf, 3, 4))) static int fail(struct k3cache_error *err,
                                                      enum status_code code, const char *fmt, ...)
{
	if (code == STATUS_OK) /* a failure is never success */
		code = STATUS_INTERNAL;
	if (err) {
		memset(err, 0, sizeof(*err));
		err->code = (enum k3cache_code)code;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return (int)code;
}

/* The start of every call into d. A child after fork() is refused: LMDB's
 * environment does not survive a fork, its read transactions' slots are
 * the parent's, and the report connection is the parent's socket. Views
 * held past their life end. And while this reader holds nothing, the store
 * is mapped again if its file has grown past our map (a daemon restarted
 * with a larger --max-bytes writes beyond the map size it had at our open). */
static int begin_call(struct k3cache_direct *d, struct k3cache_error *err)
{
	if (!d)
		return fail(err, STATUS_INVALID,
		            "no direct reader (NULL): open one with k3cache_direct_open");
	if (d->pid != getpid())
		return fail(err, STATUS_INVALID,
		            "this direct reader was opened by process %ld: after fork() a child "
		            "opens its own (k3cache_direct_open)",
		            (long)d->pid);
	expire_old(d);
	if (!d->views && store_remap(d->s) == -2)
		return fail(err, STATUS_INTERNAL,
		            "the store grew past this reader's map and could not be mapped "
		            "again (out of address space?): close this reader and open it again");
	return 0;
}

int k3cache_direct_open(const char *dir, const char *daemon_addr, struct k3cache_direct **out,
                        struct k3cache_error *err)
{
	*out = NULL;
	struct k3cache_direct *d = calloc(1, sizeof(*d));
	if (!d)
		return fail(err, STATUS_INTERNAL, "out of memory");
	int rc = k3cache_connect(daemon_addr, &d->daemon, err);
	if (rc == 0 && (rc = k3cache_namespace(d->daemon, d->ns, sizeof(d->ns), &d->ns_len, err)))
		k3cache_close(d->daemon);
	if (rc) {
		free(d);
		return rc;
	}
	d->view_seconds = VIEW_SECONDS;
	const char *vs = getenv("K3CACHE_DIRECT_VIEW_SECONDS");
	if (vs && *vs) {
		char *end;
		double x = strtod(vs, &end);
		if (*end || x < 0) {
			k3cache_close(d->daemon);
			free(d);
			return fail(err, STATUS_INVALID,
			            "K3CACHE_DIRECT_VIEW_SECONDS is \"%s\": a number of seconds, 0 "
			            "for no limit",
			            vs);
		}
		d->view_seconds = x;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	d->threads = cpus > 0 && cpus < THREADS_DEFAULT ? (unsigned)cpus : THREADS_DEFAULT;
	const char *th = getenv("K3CACHE_DIRECT_THREADS");
	if (th && *th) {
		char *end;
		unsigned long x = strtoul(th, &end, 10);
		if (*end || x < 1 || x > THREADS_MAX) {
			k3cache_close(d->daemon);
			free(d);
			return fail(err, STATUS_INVALID,
			            "K3CACHE_DIRECT_THREADS is \"%s\": a number of threads from 1 "
			            "to %d",
			            th, THREADS_MAX);
		}
		d->threads = (unsigned)x;
	}
	d->pid = getpid();
	/* the daemon walked the file when it opened it, and writes it still */
	struct store_options o = {.read_only = 1, .check = STORE_CHECK_NEVER};
	struct status st;
	if (store_open(dir, &o, &d->s, &st) != STATUS_OK) {
		k3cache_close(d->daemon);
		free(d);
		return fail(err, st.code, "direct reads of %s: %s", dir, st.message);
	}
	/* the daemon must be the one that serves this store: uses and damage
	 * go to it (a daemon too old to say is taken at its word) */
	uint64_t dev = 0, ino = 0, mine_dev = 0, mine_ino = 0;
	k3cache_store_file(d->daemon, &dev, &ino);
	if ((dev || ino) && (store_file_id(d->s, &mine_dev, &mine_ino) != 0 || dev != mine_dev ||
	                     ino != mine_ino)) {
		k3cache_close(d->daemon);
		store_close(d->s);
		free(d);
		return fail(err, STATUS_INVALID,
		            "direct reads of %s: the daemon at %s serves another store (not "
		            "%s/data.mdb): give the address of the daemon that serves %s",
		            dir, daemon_addr ? daemon_addr : "the default socket", dir, dir);
	}
	if (daemon_addr && !(d->daemon_addr = strdup(daemon_addr))) {
		k3cache_close(d->daemon);
		store_close(d->s);
		free(d);
		return fail(err, STATUS_INTERNAL, "out of memory");
	}
	k3cache_set_timeout(d->daemon, REPORT_TIMEOUT_MS);
	d->retry_wait = REPORT_RETRY_MIN;
	*out = d;
	return 0;
}

void k3cache_direct_close(struct k3cache_direct *d)
{
	if (!d)
		return;
	while (d->views) /* their pages go with the store */
		expire(d->views);
	if (d->pid == getpid()) /* a child's would go down its parent's connection */
		report(d, NULL);
	k3cache_close(d->daemon); /* its socket closed in this process only */
	store_close(d->s);
	free(d->daemon_addr);
	free(d);
}

int k3cache_direct_lookup(struct k3cache_direct *d, const uint8_t fp[K3CACHE_FP_LEN],
                          const void *salt, size_t salt_len, const uint32_t *tokens,
                          uint32_t n_tokens, uint32_t limit, struct k3cache_lookup_result *out,
                          struct k3cache_error *err)
{
	if (out) /* optional, as k3cache_lookup's */
		memset(out, 0, sizeof(*out));
	int begun = begin_call(d, err);
	if (!begun)
		begun = k3cache_lookup_args(fp, salt, salt_len, tokens, n_tokens, err);
	if (begun)
		return begun;
	if (salt_len > STORE_MAX_SALT)
		return fail(err, STATUS_INVALID, "the salt is %zu bytes; at most %u are allowed",
		            salt_len, STORE_MAX_SALT);
	unsigned char full[128 + STORE_MAX_SALT];
	if (d->ns_len)
		memcpy(full, d->ns, d->ns_len);
	if (salt_len)
		memcpy(full + d->ns_len, salt, salt_len);
	struct store_lookup_req req = {fp, full, d->ns_len + salt_len, tokens, n_tokens, limit, 0};
	struct store_lookup_res res;
	struct status st;
	if (store_lookup(d->s, &req, &res, &st) != STATUS_OK)
		return fail(err, st.code, "%s", st.message);
	if (out) {
		out->prefix_len = res.prefix_len;
		out->hint = res.hint;
		out->bytes = res.bytes;
		memcpy(out->key, res.key, K3CACHE_KEY_LEN);
	}
	return 0;
}

/* What blob_stream_end() said of layer i, and its sum against the record. */
static int layer_verdict(struct blob_stream *bs, const struct store_layer *l, uint32_t i,
                         struct k3cache_error *err)
{
	struct blob_error be;
	uint64_t sum = 0;
	enum blob_class cls = blob_stream_end(bs, &sum, &be);
	if (cls != BLOB_OK)
		return fail(err, STATUS_CORRUPT, "stored entry damaged: %s (%s)", be.message,
		            blob_class_name(cls));
	if (sum != l->xxh3)
		return fail(err, STATUS_CORRUPT,
		            "stored entry damaged: layer %" PRIu32 " hashes to %016" PRIx64
		            ", its record says %016" PRIx64,
		            i, sum, l->xxh3);
	return 0;
}

/* One pass over the layers of an entry: fn(ctx, i, err) for each, on
 * d->threads threads taking layers in turn; the first failing layer's
 * error is the answer, as if they had run in order. */
typedef int (*layer_fn)(void *ctx, uint32_t i, struct k3cache_error *err);

struct layer_pass {
	layer_fn fn;
	void *ctx;
	uint32_t n;
	uint32_t next;   /* the next layer to take (atomic) */
	uint32_t failed; /* the lowest failing layer so far, n: none (under lock) */
	int rc;
	struct k3cache_error err;
	pthread_mutex_t lock;
};

static void *layer_pass_run(void *arg)
{
	struct layer_pass *lp = arg;
	for (;;) {
		uint32_t i = __atomic_fetch_add(&lp->next, 1, __ATOMIC_RELAXED);
		if (i >= lp->n)
			break;
		pthread_mutex_lock(&lp->lock);
		int skip = i > lp->failed; /* an earlier layer failed already */
		pthread_mutex_unlock(&lp->lock);
		if (skip)
			break;
		struct k3cache_error e;
		int rc = lp->fn(lp->ctx, i, &e);
		if (rc) {
			pthread_mutex_lock(&lp->lock);
			if (i < lp->failed) {
				lp->failed = i;
				lp->rc = rc;
				lp->err = e;
			}
			pthread_mutex_unlock(&lp->lock);
		}
	}
	return NULL;
}

static int each_layer(const struct k3cache_direct *d, const struct store_snapshot *snap,
                      layer_fn fn, void *ctx, struct k3cache_error *err)
{
	struct layer_pass lp = {
	        .fn = fn, .ctx = ctx, .n = snap->n_layers, .failed = snap->n_layers};
	pthread_mutex_init(&lp.lock, NULL);
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < snap->n_layers; i++)
		bytes += snap->layers[i].size;
	unsigned want = bytes < THREADS_MIN_BYTES ? 1 : d->threads;
	pthread_t th[THREADS_MAX];
	unsigned started = 0;
	while (started + 1 < want && started < snap->n_layers &&
	       pthread_create(&th[started], NULL, layer_pass_run, &lp) == 0)
		started++; /* a thread that cannot start leaves its share to the rest */
	layer_pass_run(&lp);
	for (unsigned k = 0; k < started; k++)
		pthread_join(th[k], NULL);
	pthread_mutex_destroy(&lp.lock);
	if (lp.rc && err)
		*err = lp.err;
	return lp.rc;
}

/* What a restore checks its layers with: into whole-blob buffers, or
 * scattered into each layer's two arrays. */
struct copy_ctx {
	const struct store_snapshot *snap;
	const struct k3cache_model *model;
	void *const *bufs;                       /* or */
	const struct k3cache_arrays_out *arrays; /* the header words are not written */
};

/* Copies layer i of the snapshot to its destination, checking it piece by
 * piece as it lands. */
static int copy_layer(void *arg, uint32_t i, struct k3cache_error *err)
{
	const struct copy_ctx *c = arg;
	const struct store_layer *l = &c->snap->layers[i];
	struct blob_stream bs;
	int rc = c->arrays ? blob_stream_begin_parts(&bs, c->arrays[i].a, c->arrays[i].b, c->model,
	                                             i, c->snap->prefix_len)
	                   : blob_stream_begin(&bs, c->bufs[i], (size_t)l->size, c->model, i,
	                                       c->snap->prefix_len);
	if (rc != 0)
		return fail(err, STATUS_INTERNAL, "out of memory");
	if (bs.len != l->size) { /* arrays: sized by the model at the entry's P */
		blob_stream_abandon(&bs);
		return fail(err, STATUS_CORRUPT,
		            "stored entry damaged: layer %" PRIu32 " is %" PRIu64
		            " bytes, the model's shape at P=%" PRIu32 " is %zu",
		            i, l->size, c->snap->prefix_len, bs.len);
	}
	size_t at = 0;
	for (uint32_t j = 0; j < l->n_segments; j++) {
		const unsigned char *p = l->segments[j].data;
		size_t left = l->segments[j].len; /* they add up to l->size (open_entry) */
		while (left) {
			size_t n = left < COPY_PIECE ? left : COPY_PIECE;
			for (size_t done = 0; done < n;) { /* a piece may span two arrays */
				size_t run;
				unsigned char *to = blob_stream_dest(&bs, at, &run);
				size_t k = run < n - done ? run : n - done;
				memcpy(to, p + done, k);
				at += k;
				done += k;
			}
			p += n;
			left -= n;
			blob_stream_feed(&bs, at);
		}
	}
	return layer_verdict(&bs, l, i, err);
}

/* What a view checks its layers with. */
struct view_ctx {
	const struct store_snapshot *snap;
	const struct k3cache_model *model;
};

/* Checks layer i of the snapshot where it lies, a piece at a time. */
static int check_layer(void *arg, uint32_t i, struct k3cache_error *err)
{
	const struct view_ctx *c = arg;
	const struct store_layer *l = &c->snap->layers[i];
	struct blob_stream bs;
	if (blob_stream_begin_once(&bs, NULL, (size_t)l->size, c->model, i, c->snap->prefix_len) !=
	    0)
		return fail(err, STATUS_INTERNAL, "out of memory");
	for (uint32_t j = 0; j < l->n_segments; j++) {
		const unsigned char *p = l->segments[j].data;
		size_t left = l->segments[j].len;
		while (left) { /* a piece at a time, read twice while in cache */
			size_t n = left < COPY_PIECE ? left : COPY_PIECE;
			blob_stream_feed_piece(&bs, p, n);
			p += n;
			left -= n;
		}
	}
	return layer_verdict(&bs, l, i, err);
}

/* Opens entry key for reading: the snapshot (its views, unchecked), or NULL
 * with the error in *rc (never 0) and err; the model must be the entry's. */
static struct store_snapshot *open_entry(struct k3cache_direct *d,
                                         const struct k3cache_model *model,
                                         const uint8_t key[K3CACHE_KEY_LEN], int *rc,
                                         struct k3cache_error *err)
{
	if ((*rc = begin_call(d, err)))
		return NULL;
	if (!model || model->n_layers == 0 || !model->layers) {
		*rc = fail(err, STATUS_INVALID, "restore: no model spec (or one without layers)");
		return NULL;
	}
	if (!key) {
		*rc = fail(err, STATUS_INVALID, "restore: the entry's key is required");
		return NULL;
	}
	struct status st;
	struct store_snapshot *snap = NULL;
	/* no chunk sums now: each layer's checksum, checked after, covers its bytes */
	if (store_restore_opt(d->s, key, STORE_RESTORE_DEFER, &snap, &st) != STATUS_OK) {
		*rc = fail(err, st.code, "%s", st.message);
		return NULL;
	}
	if (memcmp(snap->fingerprint, model->fingerprint, MODEL_FINGERPRINT_LEN) != 0)
		*rc = fail(err, STATUS_INVALID, "the entry is of another model than %s",
		           model->name);
	else if (snap->n_layers != model->n_layers)
		*rc = fail(err, STATUS_CORRUPT,
		           "stored entry damaged: %" PRIu32 " layers, model %s has %" PRIu32,
		           snap->n_layers, model->name, model->n_layers);
	for (uint32_t i = 0; i < snap->n_layers && !*rc; i++) {
		/* the pieces must make the layer, no more: a view hands them on */
		const struct store_layer *l = &snap->layers[i];
		uint64_t sum = 0;
		for (uint32_t j = 0; j < l->n_segments; j++)
			sum += l->segments[j].len;
		if (sum != l->size)
			*rc = fail(err, STATUS_CORRUPT,
			           "stored entry damaged: layer %" PRIu32 " is %" PRIu64
			           " bytes in pieces, its record says %" PRIu64,
			           i, sum, l->size);
	}
	if (*rc) {
		store_snapshot_release(snap);
		return NULL;
	}
	return snap;
}

int k3cache_direct_view(struct k3cache_direct *d, const struct k3cache_model *model,
                        const uint8_t key[K3CACHE_KEY_LEN], struct k3cache_direct_view **out,
                        struct k3cache_error *err)
{
	if (!out)
		return fail(err, STATUS_INVALID, "k3cache_direct_view: out is required");
	*out = NULL;
	int rc = 0;
	struct store_snapshot *snap = open_entry(d, model, key, &rc, err);
	if (!snap)
		return rc;
	size_t n_pieces = 0;
	for (uint32_t i = 0; i < snap->n_layers; i++)
		n_pieces += snap->layers[i].n_segments;
	struct k3cache_direct_view *v = calloc(1, sizeof(*v));
	struct view_priv *pv = calloc(1, sizeof(*pv));
	struct k3cache_view_layer *layers =
	        calloc(snap->n_layers ? snap->n_layers : 1, sizeof(*layers));
	struct k3cache_buf *pieces = calloc(n_pieces ? n_pieces : 1, sizeof(*pieces));
	if (!v || !pv || !layers || !pieces) {
		free(v);
		free(pv);
		free(layers);
		free(pieces);
		store_snapshot_release(snap);
		return fail(err, STATUS_INTERNAL, "out of memory");
	}
	size_t at = 0;
	for (uint32_t i = 0; i < snap->n_layers; i++) {
		const struct store_layer *l = &snap->layers[i];
		layers[i] =
		        (struct k3cache_view_layer){pieces + at, l->n_segments, (size_t)l->size};
		for (uint32_t j = 0; j < l->n_segments; j++)
			pieces[at + j] =
			        (struct k3cache_buf){l->segments[j].data, l->segments[j].len};
		at += l->n_segments;
	}
	struct view_ctx vc = {snap, model};
	rc = each_layer(d, snap, check_layer, &vc, err);
	if (rc) {
		free(v);
		free(pv);
		free(layers);
		free(pieces);
		store_snapshot_release(snap);
		settle(d, key, rc);
		return rc;
	}
	settle(d, key, 0);
	*pv = (struct view_priv){d, v, snap, layers, pieces, n_pieces, now(), NULL, d->views};
	if (d->views)
		d->views->prev = pv;
	d->views = pv;
	*v = (struct k3cache_direct_view){snap->prefix_len, snap->n_layers, layers, pv};
	*out = v;
	return 0;
}

void k3cache_direct_view_release(struct k3cache_direct_view *v)
{
	if (!v)
		return;
	struct view_priv *pv = v->priv;
	expire(pv);
	free(pv->layers);
	free(pv->pieces);
	free(pv);
	free(v);
}

int k3cache_direct_view_valid(const struct k3cache_direct_view *v)
{
	return v && ((const struct view_priv *)v->priv)->snap != NULL;
}

int k3cache_direct_restore_into(struct k3cache_direct *d, const struct k3cache_model *model,
                                const uint8_t key[K3CACHE_KEY_LEN], void *const *bufs,
                                const size_t *caps, size_t *lens, uint32_t *prefix_len,
                                struct k3cache_error *err)
{
	if (prefix_len) /* lens and prefix_len are optional, as k3cache_restore_into's */
		*prefix_len = 0;
	if (!bufs || !caps)
		return fail(err, STATUS_INVALID,
		            "k3cache_direct_restore_into: key, bufs and caps are required");
	int rc = 0;
	struct store_snapshot *snap = open_entry(d, model, key, &rc, err);
	if (!snap)
		return rc;
	for (uint32_t i = 0; i < snap->n_layers && !rc; i++)
		if (snap->layers[i].size > caps[i])
			rc = fail(err, STATUS_INVALID,
			          "layer %" PRIu32 ": needs %" PRIu64
			          " bytes, its buffer holds %zu",
			          i, snap->layers[i].size, caps[i]);
	if (!rc)
		rc = k3cache_bufs_apart(model, snap->prefix_len, bufs, err);
	if (!rc) {
		struct copy_ctx cc = {snap, model, bufs, NULL};
		rc = each_layer(d, snap, copy_layer, &cc, err);
	}
	for (uint32_t i = 0; lens && i < snap->n_layers && !rc; i++)
		lens[i] = (size_t)snap->layers[i].size;
	if (!rc && prefix_len)
		*prefix_len = snap->prefix_len;
	store_snapshot_release(snap);
	settle(d, key, rc);
	return rc;
}

int k3cache_direct_restore_arrays(struct k3cache_direct *d, const struct k3cache_model *model,
                                  const uint8_t key[K3CACHE_KEY_LEN],
                                  const struct k3cache_arrays_out *layers, uint32_t n_layers,
                                  uint32_t *prefix_len, struct k3cache_error *err)
{
	if (prefix_len)
		*prefix_len = 0;
	if (!model || !layers)
		return fail(err, STATUS_INVALID,
		            "k3cache_direct_restore_arrays: model and layers are required");
	if (n_layers != model->n_layers)
		return fail(err, STATUS_INVALID,
		            "k3cache_direct_restore_arrays: %" PRIu32
		            " layers given, model %s has %" PRIu32,
		            n_layers, model->name, model->n_layers);
	int rc = 0;
	struct store_snapshot *snap = open_entry(d, model, key, &rc, err);
	if (!snap)
		return rc;
	rc = k3cache_arrays_fit(model, snap->prefix_len, layers, err);
	if (!rc) {
		struct copy_ctx cc = {snap, model, NULL, layers};
		rc = each_layer(d, snap, copy_layer, &cc, err);
	}
	if (!rc && prefix_len)
		*prefix_len = snap->prefix_len;
	store_snapshot_release(snap);
	settle(d, key, rc);
	return rc;
}
