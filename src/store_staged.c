/* store_staged: a large publish written in short transactions.
 *
 * One transaction per entry would hold the whole snapshot twice in memory
 * (the caller's bytes and LMDB's dirty copy) and keep the disk idle until the
 * last byte is copied. Instead, an entry larger than the stage size is written
 * in steps:
 *   1. one transaction records a pending row (who is writing, how much);
 *   2. its chunks go in, a stage at a time, each stage its own commit, while a
 *      helper thread scans and hashes the layers ahead of the writer (the scan
 *      overlaps the disk writes);
 *   3. a last transaction adds the record, tokens and index and removes the
 *      pending row, so the entry appears whole or not at all.
 * Invisible until step 3: lookups find entries only through their records. A
 * failure (invalid layer, full store) deletes the chunks and the pending row.
 * A crash leaves them; store_sweep_staged() removes them at the next open. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "blob.h"
#include "store_internal.h"

/* pending row: u32 pid | u64 process start time | u64 created | u64 bytes */
#define PENDING_LEN 28u

/* ---- who is writing ------------------------------------------------------- */

/* Start time of a process (clock ticks since boot, /proc/PID/stat field 22),
 * or 0 when it does not exist. */
static uint64_t process_start(long pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
	if (!p)
		return 0;
	/* after ") " come fields 3.. ; the start time is field 22 */
	int field = 2;
	for (; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	return strtoull(p, NULL, 10);
}

static void pending_encode(unsigned char *b, uint64_t created, uint64_t bytes)
{
	long pid = (long)getpid();
	store_be32(b, (uint32_t)pid);
	store_be64(b + 4, process_start(pid));
	store_be64(b + 12, created);
	store_be64(b + 20, bytes);
}

/* Whether a pending row belongs to a publish that may still be running: its
 * process exists (same pid, same start time) and is not this one, or it is
 * this one and `self_live` says this process has it in progress. */
static int pending_alive(const MDB_val *v, int self_live)
{
	if (v->mv_size != PENDING_LEN)
		return 0;
	long pid = (long)store_get_be32(v->mv_data);
	uint64_t start = store_get_be64((const unsigned char *)v->mv_data + 4);
	if (pid == (long)getpid())
		return self_live && start == process_start(pid);
	return start != 0 && process_start(pid) == start;
}

/* Deletes every chunk stored under key. */
static int delete_chunks(struct store *s, MDB_txn *txn, const uint8_t *key)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->chunks, &cur);
	if (rc)
		return rc;
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, key, STORE_KEY_LEN);
	for (;;) { /* seek again after each delete */
		MDB_val k = {sizeof(ck), ck}, v;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
		if (rc || k.mv_size < STORE_KEY_LEN || memcmp(k.mv_data, key, STORE_KEY_LEN) != 0)
			break;
		if ((rc = mdb_cursor_del(cur, 0)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_sweep_staged(struct store *s, MDB_txn *txn, uint32_t *swept)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->pending, &cur);
	if (rc)
		return rc;
	/* collect first: deleting under a cursor while walking is fragile */
	uint8_t(*keys)[STORE_KEY_LEN] = NULL;
	size_t n = 0, cap = 0;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size == STORE_KEY_LEN && pending_alive(&v, 0))
			continue;
		if (k.mv_size != STORE_KEY_LEN) { /* not ours to interpret: drop it */
			if ((rc = mdb_cursor_del(cur, 0)) != 0)
				break;
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			void *nk = realloc(keys, nc * STORE_KEY_LEN);
			if (!nk) {
				rc = ENOMEM;
				break;
			}
			keys = nk;
			cap = nc;
		}
		memcpy(keys[n++], k.mv_data, STORE_KEY_LEN);
	}
	mdb_cursor_close(cur);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		MDB_val pk = {STORE_KEY_LEN, keys[i]}, ev;
		if ((rc = mdb_del(txn, s->pending, &pk, NULL)) != 0)
			break;
		/* a record under this key means the entry was committed (the
		 * pending row of an older publish): the chunks are its own */
		rc = mdb_get(txn, s->entries, &pk, &ev);
		if (rc == MDB_NOTFOUND)
			rc = delete_chunks(s, txn, keys[i]);
		if (swept && !rc)
			(*swept)++;
	}
	free(keys);
	return rc;
}

/* ---- the scan running ahead ----------------------------------------------- */

struct ahead {
	const struct store_publish_req *r;
	const struct model_spec *m;
	uint64_t *layer_sums;
	uint64_t *chunk_sums;
	uint32_t n_chunks;
	uint64_t total;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t chunks_ready; /* chunk_sums[0, chunks_ready) are known */
	int done;              /* every layer checked (or one failed) */
	int failed;
	int stop; /* the writer is done or gave up */
	int fd;   /* the data file, to start its write-back early; -1: not */
	char message[STATUS_MESSAGE_MAX];
};

/* XXH3 of stream bytes [off, off+len), seeded with the chunk number, the way
 * a chunk's stored sum is computed over its contiguous value. */
static uint64_t hash_stream(const struct store_publish_req *r, XXH3_state_t *hs, uint32_t *li,
                            uint64_t *lstart, uint64_t off, size_t len, uint64_t seed)
{
	while (*li < r->n_blobs && off >= *lstart + r->blobs[*li].size) {
		*lstart += r->blobs[*li].size;
		(*li)++;
	}
	const unsigned char *p = (const unsigned char *)r->blobs[*li].data + (off - *lstart);
	if (off + len <= *lstart + r->blobs[*li].size)
		return XXH3_64bits_withSeed(p, len, seed);
	XXH3_64bits_reset_withSeed(hs, seed);
	uint32_t i = *li;
	uint64_t o = off - *lstart;
	while (len && i < r->n_blobs) {
		size_t take = (size_t)(r->blobs[i].size - o);
		if (take > len)
			take = len;
		XXH3_64bits_update(hs, (const unsigned char *)r->blobs[i].data + o, take);
		len -= take;
		o = 0;
		i++;
	}
	return XXH3_64bits_digest(hs);
}

/* Starts write-back of the data file's dirty pages without waiting for it. */
static void start_writeback(struct ahead *a)
{
	if (a->fd >= 0)
		(void)sync_file_range(a->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

static void *ahead_run(void *arg)
{
	struct ahead *a = arg;
	const struct store_publish_req *r = a->r;
	XXH3_state_t *hs = XXH3_createState();
	uint64_t end = 0, hstart = 0;
	uint32_t next = 0, hli = 0;
	int failed = hs == NULL;
	char message[STATUS_MESSAGE_MAX] = "out of memory";
	for (uint32_t i = 0; i < r->n_blobs && !failed; i++) {
		pthread_mutex_lock(&a->mu);
		int stop = a->stop;
		pthread_mutex_unlock(&a->mu);
		if (stop)
			break;
		const struct store_blob *b = &r->blobs[i];
		struct blob_error berr;
		if (blob_check_sum(b->data, b->size, a->m, i, r->n_tokens, &a->layer_sums[i],
		                   &berr) != BLOB_OK) {
			snprintf(message, sizeof(message), "%.200s (%s)", berr.message,
			         blob_class_name(berr.cls));
			failed = 1;
			break;
		}
		if (b->xxh3 && b->xxh3 != a->layer_sums[i]) {
			snprintf(message, sizeof(message),
			         "layer %u: checksum mismatch: given %016llx, the bytes hash to "
			         "%016llx",
			         i, (unsigned long long)b->xxh3,
			         (unsigned long long)a->layer_sums[i]);
			failed = 1;
			break;
		}
		/* hash the chunks this layer completes while it is still in cache */
		end += b->size;
		uint32_t from = next;
		for (; next < a->n_chunks; next++) {
			uint64_t off = (uint64_t)next * STORE_CHUNK_DATA;
			size_t len = (size_t)(a->total - off < STORE_CHUNK_DATA ? a->total - off
			                                                        : STORE_CHUNK_DATA);
			if (off + len > end)
				break;
			a->chunk_sums[next] = hash_stream(r, hs, &hli, &hstart, off, len, next);
		}
		if (next != from) {
			pthread_mutex_lock(&a->mu);
			a->chunks_ready = next;
			pthread_cond_broadcast(&a->cv);
			pthread_mutex_unlock(&a->mu);
		}
		start_writeback(a);
	}
	XXH3_freeState(hs);
	pthread_mutex_lock(&a->mu);
	a->done = 1;
	a->failed = failed;
	if (failed)
		memcpy(a->message, message, sizeof(message));
	pthread_cond_broadcast(&a->cv);
	/* Then keep the disk busy while the writer copies: each commit's
	 * fdatasync finds most of its pages already written. Write-back started
	 * early changes no order LMDB relies on: a commit writes its meta page
	 * only after its data pages are synced. */
	while (!a->stop && !failed && a->fd >= 0) {
		pthread_mutex_unlock(&a->mu);
		start_writeback(a);
		pthread_mutex_lock(&a->mu);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 2000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		if (!a->stop)
			pthread_cond_timedwait(&a->cv, &a->mu, &until);
	}
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

/* Waits until chunk sums [0, want) are known or the scan ended. Returns 0, or
 * -1 when a layer failed. */
static int ahead_wait(struct ahead *a, uint32_t want)
{
	pthread_mutex_lock(&a->mu);
	while (!a->failed && a->chunks_ready < want && !a->done)
		pthread_cond_wait(&a->cv, &a->mu);
	int failed = a->failed;
	pthread_mutex_unlock(&a->mu);
	return failed ? -1 : 0;
}

/* ---- the writer ------------------------------------------------------------ */

/* Writes chunks [from, to) in one transaction. */
static int write_stage(struct store *s, const struct store_publish_req *r, const uint8_t *key,
                       const uint64_t *sums, uint64_t total, uint32_t from, uint32_t to)
{
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
	if (rc)
		return rc;
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	for (uint32_t c = from; c < to && !rc; c++) {
		uint64_t off = (uint64_t)c * STORE_CHUNK_DATA;
		size_t len =
		        (size_t)(total - off < STORE_CHUNK_DATA ? total - off : STORE_CHUNK_DATA);
		store_be32(ck + STORE_KEY_LEN, c);
		MDB_val k = {sizeof(ck), ck}, v = {len + 8, NULL};
		if ((rc = mdb_put(txn, s->chunks, &k, &v, MDB_RESERVE)) != 0)
			break;
		memcpy(v.mv_data, &sums[c], 8);
		store_copy_stream(r, off, (unsigned char *)v.mv_data + 8, len);
	}
	if (rc) {
		mdb_txn_abort(txn);
		return rc;
	}
	return mdb_txn_commit(txn);
}

/* Runs op (a write step) until it succeeds, making room after MAP_FULL the
 * way a one-transaction publish does. */
static int with_room(struct store *s, uint64_t need, uint32_t *evicted,
                     int (*op)(struct store *s, void *ctx), void *ctx)
{
	int rc;
	for (int tries = 0;; tries++) {
		rc = op(s, ctx);
		if (rc != MDB_MAP_FULL || tries >= STORE_MAP_FULL_TRIES)
			return rc;
		atomic_fetch_add(&s->map_full_retries, 1);
		if (tries > 0 && atomic_load(&s->open_snapshots) > 0)
			return STORE_MAP_PINNED;
		if ((rc = store_make_room(s, need, evicted, 1)) != 0)
			return rc;
	}
}

struct staged {
	const struct store_publish_req *r;
	const uint8_t *key;
	const uint8_t *tags;
	const uint64_t *sizes;
	uint64_t total;
	struct ahead *a;
	uint32_t from, to;
	int exists; /* begin: a live entry exists already */
	int busy;   /* begin: another publish of this key is in progress */
	const uint64_t *layer_sums;
};

static int op_begin(struct store *s, void *ctx)
{
	struct staged *g = ctx;
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
	if (rc)
		return rc;
	g->exists = g->busy = 0;
	struct store_totals t;
	struct store_record old;
	MDB_val k = {STORE_KEY_LEN, (void *)g->key}, v;
	if ((rc = store_apply_touches(s, txn)) || (rc = store_totals_get(s, txn, &t)))
		goto out;
	rc = store_read_record(s, txn, g->key, &old);
	if (rc == 0 && !(old.flags & STORE_FLAG_QUARANTINED)) {
		g->exists = 1;
		goto out;
	}
	if (rc == 0) { /* a quarantined copy is replaced */
		if ((rc = store_delete_entry(s, txn, &old, &t)) ||
		    (rc = store_totals_put(s, txn, &t)))
			goto out;
	} else if (rc != MDB_NOTFOUND) {
		goto out;
	}
	rc = mdb_get(txn, s->pending, &k, &v);
	if (rc == 0 && pending_alive(&v, 1)) {
		g->busy = 1;
		goto out;
	}
	if (rc && rc != MDB_NOTFOUND)
		goto out;
	if ((rc = delete_chunks(s, txn, g->key)) != 0) /* a dead writer's leftovers */
		goto out;
	unsigned char b[PENDING_LEN];
	pending_encode(b, store_now(s), g->total);
	MDB_val pv = {sizeof(b), b};
	rc = mdb_put(txn, s->pending, &k, &pv, 0);
out:
	if (rc || g->exists || g->busy) {
		mdb_txn_abort(txn);
		return rc;
	}
	return mdb_txn_commit(txn);
}

static int op_stage(struct store *s, void *ctx)
{
	struct staged *g = ctx;
	return write_stage(s, g->r, g->key, g->a->chunk_sums, g->total, g->from, g->to);
}

static int op_finish(struct store *s, void *ctx)
{
	struct staged *g = ctx;
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
	if (rc)
		return rc;
	struct store_totals t;
	MDB_val k = {STORE_KEY_LEN, (void *)g->key};
	if ((rc = store_apply_touches(s, txn)) || (rc = store_totals_get(s, txn, &t)) ||
	    (rc = store_write_index(s, txn, g->r, g->key, g->total, g->tags, g->sizes,
	                            g->layer_sums, &t)) != 0 ||
	    (rc = mdb_del(txn, s->pending, &k, NULL)) != 0) {
		mdb_txn_abort(txn);
		return rc;
	}
	uint64_t clock = atomic_load(&s->lru_clock);
	if (clock > t.lru_clock)
		t.lru_clock = clock;
	if ((rc = store_totals_put(s, txn, &t)) != 0) {
		mdb_txn_abort(txn);
		return rc;
	}
	return mdb_txn_commit(txn);
}

static int op_cleanup(struct store *s, void *ctx)
{
	struct staged *g = ctx;
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
	if (rc)
		return rc;
	MDB_val k = {STORE_KEY_LEN, (void *)g->key};
	if ((rc = delete_chunks(s, txn, g->key)) ||
	    ((rc = mdb_del(txn, s->pending, &k, NULL)) && rc != MDB_NOTFOUND)) {
		mdb_txn_abort(txn);
		return rc;
	}
	return mdb_txn_commit(txn);
}

int store_publish_staged(struct store *s, const struct store_publish_req *r,
                         const struct model_spec *m, const uint8_t *key, uint64_t total,
                         const uint8_t *tags, const uint64_t *sizes, uint64_t *layer_sums,
                         int *created, uint32_t *evicted, struct status *st)
{
	*created = 0;
	uint32_t n_chunks = (uint32_t)((total + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA);
	uint64_t *chunk_sums = malloc((size_t)n_chunks * sizeof(uint64_t));
	if (!chunk_sums) {
		status_set(st, STATUS_INTERNAL, "out of memory");
		return -1;
	}
	struct ahead a = {.r = r,
	                  .m = m,
	                  .layer_sums = layer_sums,
	                  .chunk_sums = chunk_sums,
	                  .n_chunks = n_chunks,
	                  .total = total};
	struct staged g = {.r = r,
	                   .key = key,
	                   .tags = tags,
	                   .sizes = sizes,
	                   .total = total,
	                   .a = &a,
	                   .layer_sums = layer_sums};
	a.fd = -1;
	mdb_filehandle_t fd;
	if (mdb_env_get_fd(s->env, &fd) == 0)
		a.fd = fd;
	pthread_mutex_init(&a.mu, NULL);
	pthread_cond_init(&a.cv, NULL);
	pthread_t th;
	int threaded = 0, bad = 0;

	/* room first, as a one-transaction publish makes it */
	int rc = 0;
	MDB_txn *rtxn;
	struct store_totals t;
	if ((rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &rtxn)) == 0) {
		rc = store_totals_get(s, rtxn, &t);
		mdb_txn_abort(rtxn);
	}
	if (!rc && t.bytes + total > s->opt.max_bytes)
		rc = store_make_room(s, total, evicted, 0);
	if (!rc)
		rc = with_room(s, total, evicted, op_begin, &g);
	if (rc || g.exists || g.busy)
		goto done;
	if (pthread_create(&th, NULL, ahead_run, &a) == 0)
		threaded = 1;
	else {
		a.fd = -1; /* inline: no write-back loop after the scan */
		ahead_run(&a);
	}

	uint32_t per = (uint32_t)(s->opt.stage_bytes / STORE_CHUNK_DATA);
	if (per == 0)
		per = 1;
	for (uint32_t c = 0; c < n_chunks && !rc;) {
		uint32_t want = n_chunks - c < per ? n_chunks : c + per;
		if (ahead_wait(&a, want) != 0) {
			bad = 1;
			break;
		}
		g.from = c;
		g.to = want;
		rc = with_room(s, total, evicted, op_stage, &g);
		c = want;
	}
	if (!rc && !bad)
		bad = ahead_wait(&a, n_chunks) != 0;
	if (!rc && !bad)
		rc = with_room(s, total, evicted, op_finish, &g);
	pthread_mutex_lock(&a.mu);
	a.stop = 1;
	pthread_cond_broadcast(&a.cv);
	pthread_mutex_unlock(&a.mu);
	if (rc || bad) {
		int crc = op_cleanup(s, &g); /* what is left is swept at the next open */
		(void)crc;
	} else {
		*created = 1;
	}
	if (threaded)
		pthread_join(th, NULL);
	if (bad)
		status_set(st, STATUS_INVALID, "%s", a.message);
done:
	if (!rc && g.busy)
		status_set(st, STATUS_BUSY,
		           "another publish of this entry is in progress; retry shortly");
	pthread_cond_destroy(&a.cv);
	pthread_mutex_destroy(&a.mu);
	free(chunk_sums);
	if (bad || (!rc && g.busy))
		return -1;
	return rc;
}
