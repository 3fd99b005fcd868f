/* staged: a large publish written in short transactions.
 *
 * One transaction per entry would hold the whole snapshot twice in memory
 * (the caller's bytes and LMDB's dirty copy) and keep the disk idle until the
 * last byte is copied. Instead, an entry larger than the stage size is written
 * in steps:
 *   1. one transaction records a pending row (who is writing, how much);
 *   2. its stream's chunks go in, a stage at a time, each stage its own
 *      commit, while a helper thread scans and hashes the layers ahead of the
 *      writer (the scan overlaps the disk writes); so do the full blocks of
 *      its MLA layers, a stage of them at a time once their layer has passed
 *      its check: each shared (one more reference, held by a row under the
 *      key, blocks.h) or kept as a private block (record.h). The stream's
 *      layout depends on no block's place, so the scan can hash it ahead;
 *   3. a last transaction adds the record, tokens and index, turns the held
 *      references into the record's and removes the pending row, so the
 *      entry appears whole or not at all.
 * Invisible until step 3: lookups find entries only through their records. A
 * failure (invalid layer, full store) deletes the chunks, gives back the held
 * references and removes the pending row. A crash leaves them;
 * store_pending_sweep() does the same at the next open. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blocks.h"
#include "check.h"
#include "chunks.h"
#include "entry.h"
#include "lru.h"
#include "pending.h"
#include "record.h"
#include "staged.h"
#include "txn.h"
#include "xxh_dispatch.h"

struct store_stage {
	struct store *s;
	struct store_publish_req r; /* blobs, tokens, salt: the caller's, until end */
	struct k3cache_model *m;
	uint8_t key[STORE_KEY_LEN];
	uint64_t total;
	uint32_t n_chunks, per; /* chunks in all, per stage transaction */
	uint8_t *tags;
	uint64_t *sizes, *layer_sums, *chunk_sums;
	struct store_entry_plan plan; /* the stream and the blocks to place */
	struct store_stream stream;
	void (*notify)(void *ctx);
	void *notify_ctx;

	pthread_mutex_t mu; /* guards the fields below */
	pthread_cond_t cv;
	uint64_t avail;        /* blob bytes [0, avail) are in place */
	uint32_t chunks_ready; /* chunk_sums[0, chunks_ready) are known */
	uint32_t layers_ready; /* layers [0, layers_ready) passed their check */
	int done;              /* every layer scanned (or one failed) */
	int failed;
	int stop;      /* end() or cancel(): the scan gives up waiting */
	int cancelled; /* the bytes will never all arrive */
	char message[STATUS_MESSAGE_MAX];

	/* the writer's side */
	int fd; /* the data file, to start its write-back early; -1: not */
	pthread_t th;
	int threaded;
	uint32_t next_chunk; /* chunks [0, next_chunk) are written */
	int write_rc;        /* an LMDB code (or STORE_MAP_PINNED) from a stage */
	uint32_t evicted;
	uint32_t from, to; /* the stage being written */
	uint32_t place_to; /* the blocks being placed: [plan.done.placed, place_to) */
	uint64_t staged;   /* bytes written so far, counted in s->staging_bytes */
};

/* XXH3 of stream bytes [off, off+len), seeded with the chunk number, the way
 * a chunk's stored sum is computed over its contiguous value. *si and
 * *sstart follow the segment that holds off (offsets only grow). */
static uint64_t hash_stream(const struct store_stream *st, XXH3_state_t *hs, size_t *si,
                            uint64_t *sstart, uint64_t off, size_t len, uint64_t seed)
{
	while (*si < st->n && off >= *sstart + st->segs[*si].len) {
		*sstart += st->segs[*si].len;
		(*si)++;
	}
	const unsigned char *p = st->segs[*si].data + (off - *sstart);
	if (off + len <= *sstart + st->segs[*si].len)
		return XXH3_64bits_withSeed(p, len, seed);
	XXH3_64bits_reset_withSeed(hs, seed);
	size_t i = *si;
	uint64_t o = off - *sstart;
	while (len && i < st->n) {
		size_t take = (size_t)(st->segs[i].len - o);
		if (take > len)
			take = len;
		XXH3_64bits_update(hs, st->segs[i].data + o, take);
		len -= take;
		o = 0;
		i++;
	}
	return XXH3_64bits_digest(hs);
}

/* Starts write-back of the data file's dirty pages without waiting for it. */
static void start_writeback(struct store_stage *g)
{
	if (g->fd >= 0)
		(void)sync_file_range(g->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

static void poke(struct store_stage *g)
{
	if (g->notify)
		g->notify(g->notify_ctx);
}

/* Waits until stream bytes [0, end) are in place. 0, or -1 when told to stop. */
static int wait_bytes(struct store_stage *g, uint64_t end)
{
	pthread_mutex_lock(&g->mu);
	while (g->avail < end && !g->stop)
		pthread_cond_wait(&g->cv, &g->mu);
	int ok = g->avail >= end && !g->stop;
	pthread_mutex_unlock(&g->mu);
	return ok ? 0 : -1;
}

/* The scan: each layer as soon as its bytes are in place (slot, shape,
 * seq_len, finiteness, checksum), then the sums of the stream's chunks it
 * completes, while they are still in cache. */
static void *scan_run(void *arg)
{
	struct store_stage *g = arg;
	const struct store_publish_req *r = &g->r;
	XXH3_state_t *hs = XXH3_createState();
	uint64_t end = 0, hstart = 0;
	uint32_t next = 0;
	size_t hsi = 0;
	int failed = hs == NULL, gaveup = 0;
	char message[STATUS_MESSAGE_MAX] = "out of memory";
	for (uint32_t i = 0; i < r->n_blobs && !failed; i++) {
		const struct store_blob *b = &r->blobs[i];
		if (wait_bytes(g, end + b->size) != 0) {
			gaveup = 1;
			break;
		}
		if (store_check_layer(r, g->m, i, &g->layer_sums[i], message) != 0) {
			failed = 1;
			break;
		}
		g->tags[i] = store_check_tag(b);
		end += b->size;
		uint64_t send = g->plan.layer_end[i], stotal = g->stream.total;
		for (; next < g->n_chunks; next++) {
			uint64_t off = (uint64_t)next * STORE_CHUNK_DATA;
			size_t len = (size_t)(stotal - off < STORE_CHUNK_DATA ? stotal - off
			                                                      : STORE_CHUNK_DATA);
			if (off + len > send)
				break;
			g->chunk_sums[next] =
			        hash_stream(&g->stream, hs, &hsi, &hstart, off, len, next);
		}
		pthread_mutex_lock(&g->mu);
		g->chunks_ready = next;
		g->layers_ready = i + 1;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
		poke(g);
		start_writeback(g);
	}
	XXH3_freeState(hs);
	pthread_mutex_lock(&g->mu);
	g->done = !gaveup;
	g->failed = failed;
	if (failed)
		memcpy(g->message, message, sizeof(message));
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	poke(g);
	/* Then keep the disk busy while the writer copies: each commit's
	 * fdatasync finds most of its pages already written. Write-back started
	 * early changes no order LMDB relies on: a commit writes its meta page
	 * only after its data pages are synced. */
	pthread_mutex_lock(&g->mu);
	while (!g->stop && !failed && !gaveup && g->fd >= 0) {
		pthread_mutex_unlock(&g->mu);
		start_writeback(g);
		pthread_mutex_lock(&g->mu);
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 2000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		if (!g->stop)
			pthread_cond_timedwait(&g->cv, &g->mu, &until);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

/* Writes chunks [from, to) in one transaction. */
static int op_stage(struct store *s, void *ctx)
{
	struct store_stage *g = ctx;
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return rc;
	rc = store_chunks_write(s, txn, g->key, &g->stream, g->from, g->to, g->chunk_sums);
	return store_txn_end(txn, rc);
}

/* Places blocks [plan.done.placed, place_to) in one transaction: the new
 * shared blocks count in the totals at once (held rows keep them), the
 * private ones with the staged chunks. */
static int op_place(struct store *s, void *ctx)
{
	struct store_stage *g = ctx;
	MDB_txn *txn;
	struct store_totals t;
	int rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	if ((rc = store_entry_place(s, txn, g->key, &g->plan, g->place_to, 1)) != 0)
		return store_txn_end(txn, rc);
	t.bytes += g->plan.now.added - g->plan.done.added;
	return store_lru_end(s, txn, &t, 0);
}

/* Before a stage of `bytes`: evicts least-recently-used entries until the
 * committed entries, every staged publish's chunks so far and this stage fit
 * the capacity. Room is made stage by stage, never for a whole snapshot whose
 * bytes may never come. */
static int room_for_stage(struct store_stage *g, uint64_t bytes)
{
	return store_lru_room_for(g->s, bytes, &g->evicted);
}

/* The pending row: 1 when the entry exists already, 2 when another publish
 * of it is in progress, else 0 or an LMDB code. */
static int op_begin_txn(struct store_stage *g)
{
	struct store *s = g->s;
	MDB_txn *txn;
	struct store_totals t;
	int verdict = 0, rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	struct store_record old;
	rc = store_record_read(s, txn, g->key, &old);
	if (rc == 0 && !(old.flags & STORE_FLAG_QUARANTINED)) {
		verdict = 1;
		goto out;
	}
	if (rc == 0) { /* a quarantined copy is replaced */
		if ((rc = store_entry_delete(s, txn, &old, &t)) ||
		    (rc = store_totals_put(s, txn, &t)))
			goto out;
	} else if (rc != MDB_NOTFOUND) {
		goto out;
	}
	uint64_t freed = 0;
	if ((rc = store_pending_claim(s, txn, g->key, g->total, &freed)) == 1) {
		verdict = 2;
		rc = 0;
	} else if (!rc && freed) {
		t.bytes = t.bytes >= freed ? t.bytes - freed : 0;
		rc = store_totals_put(s, txn, &t);
	}
out:
	rc = store_txn_end(txn, rc ? rc : verdict ? STORE_TXN_NOTHING : 0);
	return rc == STORE_TXN_NOTHING ? verdict : rc;
}

static int op_finish(struct store *s, void *ctx)
{
	struct store_stage *g = ctx;
	MDB_txn *txn;
	struct store_totals t;
	int rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	if ((rc = store_entry_add(s, txn, &g->r, g->key, g->total, g->tags, g->sizes, g->layer_sums,
	                          &g->plan, &t)) == 0 &&
	    (rc = store_blocks_drop_held(s, txn, g->key)) == 0)
		rc = store_pending_drop(s, txn, g->key);
	return store_lru_end(s, txn, &t, rc);
}

static int op_cleanup(struct store *s, void *ctx)
{
	struct store_stage *g = ctx;
	MDB_txn *txn;
	struct store_totals t;
	int rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	/* a record under the key (committed by another writer meanwhile) owns
	 * the chunks under it; the held references are this publish's alone */
	struct store_record r;
	uint64_t freed = 0;
	if (store_record_read(s, txn, g->key, &r) == MDB_NOTFOUND)
		rc = store_chunks_delete(s, txn, g->key);
	if (!rc)
		rc = store_blocks_release(s, txn, g->key, &freed);
	if (!rc)
		rc = store_pending_drop(s, txn, g->key);
	t.bytes = t.bytes >= freed ? t.bytes - freed : 0;
	return store_lru_end(s, txn, &t, rc);
}

static void stage_free(struct store_stage *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	model_free(g->m);
	free(g->tags);
	free(g->sizes);
	free(g->layer_sums);
	free(g->chunk_sums);
	store_entry_plan_free(&g->plan);
	free(g);
}

enum status_code store_stage_begin(struct store *s, const struct store_publish_req *req,
                                   void (*notify)(void *ctx), void *ctx, struct store_stage **out,
                                   struct store_publish_res *res, struct status *st)
{
	*out = NULL;
	memset(res, 0, sizeof(*res));
	if (s->opt.read_only)
		return status_set(st, STATUS_UNSUPPORTED, "the store is open read-only");
	struct k3cache_model *m = NULL;
	uint64_t total = 0;
	enum status_code code = store_check_publish(s, req, &m, &total, res->key, st);
	if (code != STATUS_OK)
		return code;
	res->bytes = total;
	struct store_stage *g = calloc(1, sizeof(*g));
	uint32_t n = req->n_blobs, n_chunks = 0;
	if (g && store_entry_plan(s, req, m, &g->plan) == 0) {
		n_chunks = store_chunks_count(g->plan.stream);
		g->tags = calloc(n ? n : 1, 1);
		g->sizes = calloc(n ? n : 1, sizeof(uint64_t));
		g->layer_sums = calloc(n ? n : 1, sizeof(uint64_t));
		g->chunk_sums = calloc(n_chunks ? n_chunks : 1, sizeof(uint64_t));
	}
	if (!g || !g->plan.layer_end || !g->tags || !g->sizes || !g->layer_sums || !g->chunk_sums) {
		if (g) {
			store_entry_plan_free(&g->plan);
			free(g->tags);
			free(g->sizes);
			free(g->layer_sums);
			free(g->chunk_sums);
			free(g);
		}
		model_free(m);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	g->s = s;
	g->r = *req;
	g->m = m;
	memcpy(g->key, res->key, STORE_KEY_LEN);
	g->total = total;
	g->n_chunks = n_chunks;
	g->per = (uint32_t)(s->opt.stage_bytes / STORE_CHUNK_DATA);
	if (g->per == 0)
		g->per = 1;
	for (uint32_t i = 0; i < n; i++)
		g->sizes[i] = req->blobs[i].size;
	g->stream = (struct store_stream){g->plan.segs, g->plan.n_segs, g->plan.stream};
	g->notify = notify;
	g->notify_ctx = ctx;
	g->fd = -1;
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);

	/* The pending row: no room is made here. Each stage makes its own
	 * (room_for_stage), so a publish that exists already, or whose bytes
	 * never come, evicts nothing. */
	int rc, verdict = 0;
	for (int tries = 0;; tries++) {
		rc = op_begin_txn(g);
		if (rc == 1 || rc == 2) {
			verdict = rc;
			rc = 0;
			break;
		}
		if (rc != MDB_MAP_FULL || tries >= STORE_MAP_FULL_TRIES)
			break;
		atomic_fetch_add(&s->map_full_retries, 1);
		if (tries > 0 && atomic_load(&s->open_snapshots) > 0) {
			rc = STORE_MAP_PINNED;
			break;
		}
		if ((rc = store_lru_make_room(s, STORE_CHUNK_VALUE, &g->evicted, 1)) != 0)
			break;
	}
	if (!rc && !verdict && store_pending_live_add(s, g->key) != 0) {
		int crc = op_cleanup(s, g);
		(void)crc;
		rc = ENOMEM;
	}
	if (rc || verdict) {
		res->evicted = g->evicted;
		stage_free(g);
		if (rc)
			return store_lru_write_status(s, rc, st);
		if (verdict == 2)
			return status_set(st, STATUS_BUSY,
			                  "another publish of this entry is in progress; retry "
			                  "shortly");
		atomic_fetch_add(&s->publish_exists, 1);
		return STATUS_OK; /* it exists: nothing to write (created 0) */
	}
	/* in durability fast the operator chose not to force writes */
	mdb_filehandle_t fd;
	if (s->opt.durability != STORE_FAST && mdb_env_get_fd(s->env, &fd) == 0)
		g->fd = fd;
	if (pthread_create(&g->th, NULL, scan_run, g) == 0) {
		g->threaded = 1;
	} else {
		g->fd = -1; /* no thread: the scan runs in end(), without write-back */
	}
	*out = g;
	return STATUS_OK;
}

void store_stage_arrived(struct store_stage *g, uint64_t bytes)
{
	pthread_mutex_lock(&g->mu);
	if (bytes > g->avail)
		g->avail = bytes > g->total ? g->total : bytes;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

void store_stage_cancel(struct store_stage *g)
{
	pthread_mutex_lock(&g->mu);
	g->stop = 1;
	g->cancelled = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* Blob bytes of chunks [from, to). */
static uint64_t stage_bytes_of(const struct store_stage *g, uint32_t from, uint32_t to)
{
	uint64_t end = (uint64_t)to * STORE_CHUNK_DATA;
	if (end > g->stream.total)
		end = g->stream.total;
	return end - (uint64_t)from * STORE_CHUNK_DATA;
}

/* The blocks the next placing stage takes: those of layers that passed their
 * check, up to a stage's bytes (at least one); their bytes in *bytes. */
static uint32_t place_upto(const struct store_stage *g, uint32_t layers_ready, uint64_t *out)
{
	const struct store_entry_plan *p = &g->plan;
	uint32_t to = p->done.placed;
	uint64_t bytes = 0;
	while (to < p->n_blocks && p->blocks[to].layer < layers_ready &&
	       (to == p->done.placed ||
	        bytes + p->blocks[to].klen + p->blocks[to].vlen <= g->s->opt.stage_bytes)) {
		bytes += p->blocks[to].klen + p->blocks[to].vlen;
		to++;
	}
	*out = bytes;
	return to;
}

/* Places the next stage of blocks, [done.placed, to) of `bytes`. 0, or an
 * LMDB code. */
static int place_stage(struct store_stage *g, uint32_t to, uint64_t bytes)
{
	struct store_entry_plan *p = &g->plan;
	g->place_to = to;
	int rc = room_for_stage(g, bytes);
	if (!rc)
		rc = store_lru_write(g->s, bytes, op_place, g, &g->evicted);
	if (rc)
		return rc;
	/* the private blocks are the entry's own chunks: staged until the end */
	uint64_t own = p->now.stored - p->done.stored;
	atomic_fetch_add(&g->s->staging_bytes, own);
	g->staged += own;
	if (p->now.mismatched > p->done.mismatched)
		atomic_fetch_add(&g->s->blocks_mismatched, p->now.mismatched - p->done.mismatched);
	store_entry_placed(p);
	return 0;
}

int store_stage_step(struct store_stage *g, uint32_t max_stages)
{
	if (!g->threaded) {
		/* no scan thread: scan here, once every byte is in place */
		pthread_mutex_lock(&g->mu);
		int all = g->avail == g->total || g->cancelled;
		pthread_mutex_unlock(&g->mu);
		if (!all)
			return STORE_STAGE_WAIT;
		if (!g->done && !g->failed)
			scan_run(g);
	}
	pthread_mutex_lock(&g->mu);
	uint32_t ready = g->chunks_ready, layers = g->layers_ready;
	int done = g->done, failed = g->failed || g->cancelled;
	pthread_mutex_unlock(&g->mu);
	if (failed || g->write_rc)
		return STORE_STAGE_FAILED;
	uint32_t written = 0;
	for (;;) {
		uint32_t want =
		        g->n_chunks - g->next_chunk < g->per ? g->n_chunks : g->next_chunk + g->per;
		int chunks = g->next_chunk < g->n_chunks && ready >= want;
		uint64_t place_bytes = 0;
		uint32_t to = chunks ? 0 : place_upto(g, layers, &place_bytes);
		if (!chunks && to == g->plan.done.placed)
			break;
		if (max_stages && written == max_stages)
			return STORE_STAGE_MORE;
		written++;
		if (!chunks) {
			if ((g->write_rc = place_stage(g, to, place_bytes)) != 0)
				return STORE_STAGE_FAILED;
			continue;
		}
		g->from = g->next_chunk;
		g->to = want;
		uint64_t bytes = stage_bytes_of(g, g->from, g->to);
		if ((g->write_rc = room_for_stage(g, bytes)) != 0 ||
		    (g->write_rc = store_lru_write(g->s, bytes, op_stage, g, &g->evicted)) != 0)
			return STORE_STAGE_FAILED;
		atomic_fetch_add(&g->s->staging_bytes, bytes);
		g->staged += bytes;
		g->next_chunk = want;
	}
	if (g->next_chunk == g->n_chunks && g->plan.done.placed == g->plan.n_blocks && done)
		return STORE_STAGE_READY;
	return STORE_STAGE_WAIT;
}

void store_stage_wait(struct store_stage *g)
{
	pthread_mutex_lock(&g->mu);
	uint32_t ready = g->chunks_ready, layers = g->layers_ready;
	while (g->threaded && g->chunks_ready == ready && g->layers_ready == layers && !g->done &&
	       !g->failed && !g->stop)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

enum status_code store_stage_end(struct store_stage *g, struct store_publish_res *res,
                                 struct status *st)
{
	struct store *s = g->s;
	pthread_mutex_lock(&g->mu);
	int ok = g->done && !g->failed && !g->cancelled && !g->write_rc &&
	         g->next_chunk == g->n_chunks && g->plan.done.placed == g->plan.n_blocks;
	pthread_mutex_unlock(&g->mu);
	int rc = ok ? store_lru_write(g->s, STORE_CHUNK_VALUE, op_finish, g, &g->evicted) : 0;
	/* the scan and the write-back loop stop here */
	pthread_mutex_lock(&g->mu);
	g->stop = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	if (g->threaded)
		pthread_join(g->th, NULL);
	if (!ok || rc) {
		/* a failure here leaves a row of ours that store_pending_live_remove() below makes
		 * dead: the next publish of the key or the next open removes it */
		int crc = op_cleanup(s, g);
		(void)crc;
	}
	atomic_fetch_sub(&s->staging_bytes, g->staged);
	store_pending_live_remove(s, g->key);
	memcpy(res->key, g->key, STORE_KEY_LEN);
	res->bytes = g->total;
	res->evicted = g->evicted;
	res->created = ok && !rc;
	enum status_code code = STATUS_OK;
	if (g->failed)
		code = status_set(st, STATUS_INVALID, "%s", g->message);
	else if (g->cancelled)
		code = status_set(st, STATUS_INVALID,
		                  "the publish ended before all of its bytes arrived");
	else if (g->write_rc || rc)
		code = store_lru_write_status(s, g->write_rc ? g->write_rc : rc, st);
	else if (!ok)
		code = status_set(st, STATUS_INTERNAL, "the staged publish ended unfinished");
	else
		atomic_fetch_add(&s->publishes, 1);
	stage_free(g);
	return code;
}

enum status_code store_publish_staged(struct store *s, const struct store_publish_req *r,
                                      struct store_publish_res *res, struct status *st)
{
	struct store_stage *g;
	enum status_code code = store_stage_begin(s, r, NULL, NULL, &g, res, st);
	if (code != STATUS_OK || !g)
		return code;
	store_stage_arrived(g, UINT64_MAX); /* every byte is in place */
	for (;;) {
		int step = store_stage_step(g, 0);
		if (step == STORE_STAGE_READY || step == STORE_STAGE_FAILED)
			break;
		if (step == STORE_STAGE_WAIT)
			store_stage_wait(g);
	}
	return store_stage_end(g, res, st);
}

uint64_t store_stage_bytes(const struct store *s)
{
	return s->opt.stage_bytes;
}
