/* staged: a large publish written in short transactions.
 *
 * One transaction per entry would hold the whole snapshot twice in memory
 * (the caller's bytes and LMDB's dirty copy) and keep the disk idle until the
 * last byte is copied. Instead, an entry larger than the stage size is written
 * in steps:
 *   1. one transaction records a pending row (who is writing, how much);
 *   2. as its bytes arrive, a helper thread checks each layer piecewise
 *      (blob_stream, read once) and hashes the stream's chunks, while the
 *      writer writes the chunks so hashed, a stage at a time, each stage its
 *      own commit, and places the full blocks of its MLA layers part by part
 *      (entry.h: the k rows when they are in, then the v rows), each shared
 *      (one more reference, held by a row under the key, blocks.h) or kept
 *      as a private block (record.h). Nothing waits for a whole layer: a
 *      window that holds a few stages of the payload is enough
 *      (store_stage_begin's window, store_stage_consumed). A chunk whose bytes lie
 *      apart in the payload (an MLA layer's words and tail rows around its
 *      blocks) is copied aside as it passes, so no window waits for it;
 *   3. a last transaction, once every layer passed its check, adds the
 *      record, tokens and index, turns the held references into the
 *      record's and removes the pending row, so the entry appears whole or
 *      not at all.
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

#include "blob_stream.h"
#include "blocks.h"
#include "check.h"
#include "chunks.h"
#include "entry.h"
#include "lru.h"
#include "pending.h"
#include "record.h"
#include "staged.h"
#include "txn.h"
#include "units.h"
#include "xxh_dispatch.h"

/* Chunks copied aside by the scan (a window): at most this many at once. */
#define CARRIES 2

struct store_stage {
	struct store *s;
	struct store_publish_req r; /* blobs, tokens, salt: the caller's, until end */
	struct k3cache_model *m;
	uint8_t key[STORE_KEY_LEN];
	uint64_t total;
	uint32_t n_chunks, per; /* chunks in all, per stage transaction */
	uint32_t n_parts;       /* block parts to place (entry.h) */
	uint64_t window;        /* the caller's window, bytes; 0: every byte stays */
	uint8_t *tags;
	uint64_t *sizes, *layer_sums, *chunk_sums;
	uint64_t pay_total;           /* the payload's bytes (store.h, "staged publish") */
	uint64_t *blob_at;            /* per layer: where its payload bytes start */
	uint64_t *seg_at, *seg_from;  /* per stream segment: payload offset, stream offset */
	unsigned char *seg_pay;       /* per stream segment: 1 if payload bytes */
	struct store_entry_plan plan; /* the stream and the blocks to place */
	struct store_stream stream;
	void (*notify)(void *ctx);
	void *notify_ctx;

	pthread_mutex_t mu; /* guards the fields below */
	pthread_cond_t cv;
	uint64_t avail;        /* payload bytes [0, avail) are in place */
	uint64_t scanned;      /* payload bytes [0, scanned) were read by the scan */
	uint32_t chunks_ready; /* chunk_sums[0, chunks_ready) are known */
	uint32_t layers_ready; /* layers [0, layers_ready) passed their check */
	int done;              /* every layer scanned (or one failed) */
	int scan_over;         /* the scan reads no more payload bytes */
	int carry_wait;        /* the scan waits for a carry: write what is hashed */
	int failed;
	int nomem;     /* failed for want of memory, not for the bytes */
	int refused;   /* a delta's layer did not hash to its sum */
	int stop;      /* end() or cancel(): the scan gives up waiting */
	int cancelled; /* the bytes will never all arrive */
	char message[STATUS_MESSAGE_MAX];
	struct {
		unsigned char *data; /* STORE_CHUNK_DATA bytes */
		uint32_t chunk;      /* the chunk it holds, or UINT32_MAX: free */
	} carry[CARRIES];

	/* the writer's side */
	int fd; /* the data file, to start its write-back early; -1: not */
	pthread_t th;
	int threaded;
	uint32_t next_chunk; /* chunks [0, next_chunk) are written */
	int write_rc;        /* an LMDB code (or STORE_MAP_PINNED) from a stage */
	uint32_t evicted;
	uint32_t from, to; /* the stage being written */
	uint32_t place_to; /* the parts being placed: [plan.done.placed, place_to) */
	uint64_t staged;   /* bytes written so far, counted in s->staging_bytes */
};

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

/* Waits until payload bytes [0, end) are in place; returns how many are (at
 * least end), or 0 when told to stop. */
static uint64_t wait_bytes(struct store_stage *g, uint64_t end)
{
	pthread_mutex_lock(&g->mu);
	while (g->avail < end && !g->stop)
		pthread_cond_wait(&g->cv, &g->mu);
	uint64_t got = g->stop ? 0 : g->avail;
	pthread_mutex_unlock(&g->mu);
	return got;
}

/* The scan's hashing of the stream: chunk by chunk, as the payload bytes
 * holding it are read. A chunk whose bytes are not one run of the payload
 * is copied aside too (a window: its first bytes are gone by its end). */
struct hasher {
	struct store_stage *g;
	XXH3_state_t *hs;
	XXH3_state_t *layer; /* a delta's layer's sum (scan_rows) */
	uint64_t done;       /* stream bytes [0, done) hashed */
	size_t seg;          /* the segment holding byte done */
	int carry;           /* the carry the current chunk goes to; -1: none */
};

/* Whether chunk c's bytes lie apart in the payload. */
static int chunk_apart(const struct store_stage *g, size_t seg, uint32_t c)
{
	uint64_t end = ((uint64_t)c + 1) * STORE_CHUNK_DATA;
	if (end > g->stream.total)
		end = g->stream.total;
	return g->seg_from[seg] + g->stream.segs[seg].len < end;
}

/* Takes a free carry for chunk c (waiting for the writer to free one);
 * -1 when told to stop. */
static int take_carry(struct store_stage *g, uint32_t c)
{
	pthread_mutex_lock(&g->mu);
	int got = -1;
	while (!g->stop) {
		for (int i = 0; i < CARRIES && got < 0; i++)
			if (g->carry[i].chunk == UINT32_MAX)
				got = i;
		if (got >= 0)
			break;
		if (!g->carry_wait) {
			/* the carries wait for the writer, which may wait for a
			 * whole stage of hashed chunks: tell it to write them */
			g->carry_wait = 1;
			pthread_cond_broadcast(&g->cv);
			pthread_mutex_unlock(&g->mu);
			poke(g);
			pthread_mutex_lock(&g->mu);
			continue;
		}
		pthread_cond_wait(&g->cv, &g->mu);
	}
	g->carry_wait = 0;
	if (got >= 0)
		g->carry[got].chunk = c;
	pthread_mutex_unlock(&g->mu);
	return got;
}

/* Hashes stream bytes up to `upto`. 0, or -1 when told to stop. */
static int hash_upto(struct hasher *h, uint64_t upto)
{
	struct store_stage *g = h->g;
	const struct store_stream *st = &g->stream;
	uint32_t ready = UINT32_MAX;
	while (h->done < upto && h->seg < st->n) {
		uint64_t seg_end = g->seg_from[h->seg] + st->segs[h->seg].len;
		if (h->done >= seg_end) {
			h->seg++;
			continue;
		}
		uint32_t c = (uint32_t)(h->done / STORE_CHUNK_DATA);
		uint64_t cstart = (uint64_t)c * STORE_CHUNK_DATA, cend = cstart + STORE_CHUNK_DATA;
		if (cend > st->total)
			cend = st->total;
		if (h->done == cstart) {
			XXH3_64bits_reset_withSeed(h->hs, c);
			h->carry = -1;
			if (g->window && g->threaded && chunk_apart(g, h->seg, c) &&
			    (h->carry = take_carry(g, c)) < 0)
				return -1;
		}
		uint64_t n = seg_end - h->done;
		if (n > cend - h->done)
			n = cend - h->done;
		if (n > upto - h->done)
			n = upto - h->done;
		const unsigned char *p = st->segs[h->seg].data + (h->done - g->seg_from[h->seg]);
		XXH3_64bits_update(h->hs, p, (size_t)n);
		if (h->carry >= 0)
			memcpy(g->carry[h->carry].data + (h->done - cstart), p, (size_t)n);
		h->done += n;
		if (h->done == cend) {
			g->chunk_sums[c] = XXH3_64bits_digest(h->hs);
			ready = c + 1;
		}
	}
	if (ready != UINT32_MAX) {
		pthread_mutex_lock(&g->mu);
		g->chunks_ready = ready;
		pthread_mutex_unlock(&g->mu);
	}
	return 0;
}

/* A segment's payload bytes: its length, or 0 for bytes always in place
 * (a delta's base rows in the map, its header words). */
static uint64_t seg_plen(const struct store_stage *g, size_t k)
{
	return g->seg_pay[k] ? g->stream.segs[k].len : 0;
}

/* The stream bytes in place once payload bytes [0, at) are. *seg follows
 * the first segment not wholly in (offsets only grow). */
static uint64_t stream_before(const struct store_stage *g, size_t *seg, uint64_t at)
{
	const struct store_stream *st = &g->stream;
	while (*seg < st->n && g->seg_at[*seg] + seg_plen(g, *seg) <= at)
		(*seg)++;
	if (*seg == st->n)
		return st->total;
	if (g->seg_at[*seg] >= at)
		return g->seg_from[*seg];
	return g->seg_from[*seg] + (at - g->seg_at[*seg]);
}

/* Layer i's payload bytes: its blob, or a delta's fresh rows. */
static const unsigned char *pay_span(const struct store_publish_req *r, uint32_t i, uint64_t *len)
{
	const struct store_blob *b = &r->blobs[i];
	if (b->rows) {
		*len = b->rows->fresh_k + b->rows->fresh_v;
		return b->rows->fresh;
	}
	*len = b->size;
	return b->data;
}

/* Where p, a byte of layer i, lies in the payload; UINT64_MAX when it is
 * not the payload's. */
static uint64_t pay_pos(const struct store_stage *g, uint32_t i, const unsigned char *p)
{
	uint64_t len;
	const unsigned char *d = pay_span(&g->r, i, &len);
	if (d && p >= d && p < d + len)
		return g->blob_at[i] + (uint64_t)(p - d);
	return UINT64_MAX;
}

/* A piece of the scan: at most this many bytes are read between updates. */
#define SCAN_PIECE ((uint64_t)1 << 20)

/* Says that the scan read payload bytes [0, at), and hashes the stream
 * bytes they complete. 0, or -1 when told to stop. */
static int scan_to(struct store_stage *g, struct hasher *h, size_t *at_seg, uint64_t at)
{
	if (hash_upto(h, stream_before(g, at_seg, at)) != 0)
		return -1;
	pthread_mutex_lock(&g->mu);
	g->scanned = at;
	pthread_mutex_unlock(&g->mu);
	poke(g);
	return 0;
}

/* A delta's assembled layer, piece by piece: the base's rows are in the map;
 * the fresh ones are read as they arrive. Unread (assembled before they
 * came), the fresh rows must be finite and the whole blob hash to its given
 * sum. 0, 1 (failed, message set; g->refused for a sum) or -1 (told to
 * stop). */
static int scan_rows(struct store_stage *g, struct hasher *h, size_t *at_seg, uint32_t i,
                     char message[STATUS_MESSAGE_MAX])
{
	const struct store_blob *b = &g->r.blobs[i];
	const struct store_rows *rw = b->rows;
	g->tags[i] = store_check_tag(b);
	g->layer_sums[i] = b->xxh3;
	XXH3_state_t *ls = rw->unread ? h->layer : NULL;
	if (ls) {
		XXH3_64bits_reset_withSeed(ls, i);
		XXH3_64bits_update(ls, rw->head, sizeof(rw->head));
	}
	for (unsigned part = 0; part < 2; part++) {
		const struct store_segment *pc = part ? rw->v : rw->k;
		uint32_t n = part ? rw->n_v : rw->n_k;
		uint64_t first = g->blob_at[i] + (part ? rw->fresh_k : 0); /* its fresh rows */
		if (ls && part)
			XXH3_64bits_update(ls, rw->vcount, sizeof(rw->vcount));
		for (uint32_t j = 0; j < n; j++) {
			const unsigned char *d = pc[j].data;
			uint64_t len = pc[j].len, pos = pay_pos(g, i, d);
			if (pos == UINT64_MAX) { /* the base's, in the map */
				if (ls)
					XXH3_64bits_update(ls, d, (size_t)len);
				continue;
			}
			for (uint64_t fed = 0; fed < len;) {
				uint64_t got =
				        wait_bytes(g, pos + fed + (len - fed < 4 ? len - fed : 4));
				if (!got)
					return -1;
				uint64_t upto = got - pos;
				if (upto > len)
					upto = len;
				if (upto > fed + SCAN_PIECE)
					upto = fed + SCAN_PIECE;
				upto -= (upto - fed) % 4; /* whole floats */
				if (ls) {
					if (store_check_rows_finite(
					            rw, i, part, d + fed, (upto - fed) / 4,
					            (pos + fed - first) / 4, message) != 0)
						return 1;
					XXH3_64bits_update(ls, d + fed, (size_t)(upto - fed));
				}
				fed = upto;
				if (scan_to(g, h, at_seg, pos + fed) != 0)
					return -1;
			}
		}
	}
	if (ls && store_check_delta_sum(i, XXH3_64bits_digest(ls), b->xxh3, message) != 0) {
		g->refused = 1;
		return 1;
	}
	uint64_t len;
	(void)pay_span(&g->r, i, &len);
	return scan_to(g, h, at_seg, g->blob_at[i] + len) != 0 ? -1 : 0;
}

/* Checks layer i piecewise as its bytes arrive. 0, 1 (failed, message
 * set), 2 (out of memory) or -1 (told to stop). */
static int scan_layer(struct store_stage *g, struct hasher *h, size_t *at_seg, uint32_t i,
                      char message[STATUS_MESSAGE_MAX])
{
	const struct store_publish_req *r = &g->r;
	const struct store_blob *b = &r->blobs[i];
	uint64_t start = g->blob_at[i];
	if (b->rows)
		return scan_rows(g, h, at_seg, i, message);
	struct blob_stream bs;
	if (blob_stream_begin_once(&bs, b->data, (size_t)b->size, g->m, i, r->n_tokens) != 0)
		return 2;
	for (uint64_t fed = 0; fed < b->size;) {
		uint64_t got = wait_bytes(g, start + fed + 1);
		if (!got) {
			blob_stream_abandon(&bs);
			return -1;
		}
		uint64_t upto = got - start;
		if (upto > b->size)
			upto = b->size;
		if (upto > fed + SCAN_PIECE)
			upto = fed + SCAN_PIECE;
		blob_stream_feed(&bs, (size_t)upto);
		fed = upto;
		if (hash_upto(h, stream_before(g, at_seg, start + fed)) != 0) {
			blob_stream_abandon(&bs);
			return -1;
		}
		pthread_mutex_lock(&g->mu);
		g->scanned = start + fed;
		pthread_mutex_unlock(&g->mu);
		poke(g);
	}
	struct blob_error berr;
	if (blob_stream_end(&bs, &g->layer_sums[i], &berr) != BLOB_OK) {
		snprintf(message, STATUS_MESSAGE_MAX, "%.200s (%s)", berr.message,
		         blob_class_name(berr.cls));
		return 1;
	}
	if (store_check_given_sum(b, i, g->layer_sums[i], message) != 0)
		return 1;
	g->tags[i] = bs.kept[0];
	return 0;
}

/* The scan: each layer piecewise as its bytes arrive (slot, shape, seq_len,
 * finiteness, checksum), and the stream's chunks hashed while the bytes are
 * in cache. */
static void *scan_run(void *arg)
{
	struct store_stage *g = arg;
	struct hasher h = {
	        .g = g, .hs = XXH3_createState(), .layer = XXH3_createState(), .carry = -1};
	size_t at_seg = 0;
	int nomem = !h.hs || !h.layer, failed = nomem, gaveup = 0;
	char message[STATUS_MESSAGE_MAX] = "out of memory";
	for (uint32_t i = 0; i < g->r.n_blobs && !failed && !gaveup; i++) {
		int rc = scan_layer(g, &h, &at_seg, i, message);
		nomem = rc == 2;
		failed = rc > 0;
		gaveup = rc < 0;
		if (rc)
			break;
		uint64_t plen;
		(void)pay_span(&g->r, i, &plen);
		pthread_mutex_lock(&g->mu);
		g->layers_ready = i + 1;
		g->scanned = g->blob_at[i] + plen;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
		poke(g);
		start_writeback(g);
	}
	if (!failed && !gaveup && hash_upto(&h, g->stream.total) != 0)
		gaveup = 1;
	XXH3_freeState(h.hs);
	XXH3_freeState(h.layer);
	pthread_mutex_lock(&g->mu);
	g->done = !gaveup;
	g->scan_over = 1;
	g->failed = failed;
	g->nomem = nomem;
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
		clock_gettime(CLOCK_MONOTONIC, &until);
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

/* The carry holding chunk c, or -1 (under mu). */
static int carried(const struct store_stage *g, uint32_t c)
{
	for (int i = 0; i < CARRIES; i++)
		if (g->carry[i].chunk == c)
			return i;
	return -1;
}

/* Writes chunks [from, to) in one transaction. */
static int op_stage(struct store *s, void *ctx)
{
	struct store_stage *g = ctx;
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return rc;
	for (uint32_t c = g->from; c < g->to && !rc; c++) {
		pthread_mutex_lock(&g->mu);
		int k = carried(g, c);
		pthread_mutex_unlock(&g->mu);
		if (k < 0) {
			rc = store_chunks_write(s, txn, g->key, &g->stream, c, c + 1,
			                        g->chunk_sums);
			continue;
		}
		uint64_t off = (uint64_t)c * STORE_CHUNK_DATA, left = g->stream.total - off;
		/* hashed by the scan as it was copied aside: not again here */
		rc = store_chunks_put(s, txn, g->key, c, g->carry[k].data,
		                      (size_t)(left < STORE_CHUNK_DATA ? left : STORE_CHUNK_DATA),
		                      &g->chunk_sums[c]);
	}
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
	store_entry_count_placed(&g->plan, &t.bytes);
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
		if ((rc = store_entry_delete(s, txn, &old, &t, NULL)) ||
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
	free(g->blob_at);
	free(g->seg_at);
	free(g->seg_from);
	free(g->seg_pay);
	for (int i = 0; i < CARRIES; i++)
		free(g->carry[i].data);
	store_entry_plan_free(&g->plan);
	free(g);
}

/* Where each layer's payload bytes start (blob_at: the layers' payload
 * bytes end to end) and where each stream segment lies in the payload
 * (seg_at) and in the stream (seg_from). A segment that is not payload (a
 * delta's base rows, its header words) is in place from the start; it is
 * placed where the payload before it in the stream ends, so that offsets
 * only grow along the stream. 0, or -1: no memory. */
static int lay_out(struct store_stage *g)
{
	const struct store_publish_req *r = &g->r;
	size_t n = g->stream.n;
	g->blob_at = calloc(r->n_blobs ? r->n_blobs : 1, sizeof(uint64_t));
	g->seg_at = calloc(n ? n : 1, sizeof(uint64_t));
	g->seg_from = calloc(n ? n : 1, sizeof(uint64_t));
	g->seg_pay = calloc(n ? n : 1, 1);
	if (!g->blob_at || !g->seg_at || !g->seg_from || !g->seg_pay)
		return -1;
	uint64_t len = 0;
	for (uint32_t i = 0; i < r->n_blobs; i++) {
		g->blob_at[i] = g->pay_total;
		(void)pay_span(r, i, &len);
		g->pay_total += len;
	}
	uint64_t from = 0, frontier = 0;
	uint32_t i = 0;
	for (size_t k = 0; k < n; k++) {
		while (i + 1 < r->n_blobs && g->plan.layer_end[i] <= from)
			i++;
		uint64_t at = pay_pos(g, i, g->stream.segs[k].data);
		g->seg_from[k] = from;
		g->seg_pay[k] = at != UINT64_MAX;
		g->seg_at[k] = g->seg_pay[k] ? at : frontier;
		if (g->seg_pay[k])
			frontier = at + g->stream.segs[k].len;
		from += g->stream.segs[k].len;
	}
	return 0;
}

/* Whether the layers' payload bytes lie end to end in one buffer (a window
 * over it). */
static int contiguous(const struct store_publish_req *r)
{
	uint64_t len = 0;
	const unsigned char *end = NULL;
	for (uint32_t i = 0; i < r->n_blobs; i++) {
		const unsigned char *d = pay_span(r, i, &len);
		if (!d || (i > 0 && d != end))
			return 0;
		end = d + len;
	}
	return 1;
}

static uint64_t part_at(const struct store_stage *g, uint32_t q, int end);

/* A part is placed once all its bytes are in, and the window cannot move
 * past its first byte before: one whose bytes span more than the window
 * less a stage (the window's stages are aligned; K3D_WINDOW_STAGES is 3)
 * would never be placed, and the publish would wait for ever. The first
 * such part (STATUS_INVALID, saying what to change), or STATUS_OK. */
static enum status_code parts_fit(const struct store_stage *g, struct status *st)
{
	uint64_t room = g->window - g->window / 3;
	for (uint32_t q = 0; q < g->n_parts; q++) {
		uint64_t lo = part_at(g, q, 0), hi = part_at(g, q, 1);
		if (hi <= lo || hi - lo <= room)
			continue;
		size_t len;
		uint32_t layer;
		(void)store_entry_part(&g->plan, q, &len, &layer);
		char part[32], fits[32], win[32], stage[32];
		units_format_size(hi - lo, part, sizeof(part));
		units_format_size(room, fits, sizeof(fits));
		units_format_size(g->window, win, sizeof(win));
		units_format_size((hi - lo + 1) / 2, stage, sizeof(stage));
		return status_set(
		        st, STATUS_INVALID,
		        "layer %u: a block part of %s (%u rows, the store's row block) is "
		        "larger than the receive window allows (%s of %s): give the "
		        "daemon stages of at least %s (--stage-size), or use a store made "
		        "with a smaller --row-block",
		        layer, part, g->plan.row_block, fits, win, stage);
	}
	return STATUS_OK;
}

enum status_code store_stage_begin(struct store *s, const struct store_publish_req *req,
                                   uint64_t window, void (*notify)(void *ctx), void *ctx,
                                   struct store_stage **out, struct store_publish_res *res,
                                   struct status *st)
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
	if (window && !contiguous(req)) {
		model_free(m);
		return status_set(st, STATUS_INTERNAL, "a window needs the blobs end to end");
	}
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
	g->n_parts = store_entry_parts(&g->plan);
	g->window = window;
	for (int i = 0; i < CARRIES; i++)
		g->carry[i].chunk = UINT32_MAX;
	int nomem = lay_out(g) != 0;
	for (int i = 0; i < CARRIES && window && !nomem; i++)
		nomem = (g->carry[i].data = malloc(STORE_CHUNK_DATA)) == NULL;
	if (nomem) {
		stage_free(g);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	if (window && parts_fit(g, st) != STATUS_OK) {
		stage_free(g);
		return st->code;
	}
	g->notify = notify;
	g->notify_ctx = ctx;
	g->fd = -1;
	pthread_mutex_init(&g->mu, NULL);
	/* its timed wait (the write-back loop) on the monotonic clock */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);

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
		if (tries > 0 && store_lru_pinned(s)) {
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
		if (verdict == 2) {
			res->in_progress = 1;
			return status_set(st, STATUS_BUSY,
			                  "another publish of this entry is in progress; retry "
			                  "shortly");
		}
		atomic_fetch_add(&s->publish_exists, 1);
		return STATUS_OK; /* it exists: nothing to write (created 0) */
	}
	/* in durability fast the operator chose not to force writes */
	mdb_filehandle_t fd;
	if (s->opt.durability != STORE_FAST && mdb_env_get_fd(s->env, &fd) == 0)
		g->fd = fd;
	if (pthread_create(&g->th, NULL, scan_run, g) == 0) {
		g->threaded = 1;
	} else if (window) { /* a window moves only with the scan */
		struct store_publish_res ignored;
		store_stage_cancel(g);
		store_stage_end(g, &ignored, st);
		return status_set(st, STATUS_BUSY, "cannot start a thread now; retry later");
	} else {
		g->fd = -1; /* no thread: the scan runs in step, without write-back */
	}
	*out = g;
	return STATUS_OK;
}

void store_stage_arrived(struct store_stage *g, uint64_t bytes)
{
	pthread_mutex_lock(&g->mu);
	if (bytes > g->avail)
		g->avail = bytes > g->pay_total ? g->pay_total : bytes;
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

/* Where part q's bytes start (or, with end, end) in the payload. A part
 * whose bytes are all in the map (a delta's base rows) is in place from the
 * start; it is placed at its layer's fresh k rows (or, for v rows, at its
 * fresh v rows), no later than the payload any later part needs. */
static uint64_t part_at(const struct store_stage *g, uint32_t q, int end)
{
	size_t len;
	uint32_t i;
	const unsigned char *p = store_entry_part(&g->plan, q, &len, &i);
	const struct store_plan_fill *f, whole = {NULL, p, len, 0};
	uint32_t nf = store_entry_part_fills(&g->plan, q, &f);
	if (!nf) { /* the part points into one piece */
		f = &whole;
		nf = 1;
	}
	uint64_t lo = UINT64_MAX, hi = 0;
	for (uint32_t j = 0; j < nf; j++) {
		uint64_t at = f[j].len ? pay_pos(g, i, f[j].src) : UINT64_MAX;
		if (at == UINT64_MAX)
			continue;
		if (at < lo)
			lo = at;
		if (at + f[j].len > hi)
			hi = at + f[j].len;
	}
	if (lo != UINT64_MAX)
		return end ? hi : lo;
	const struct store_rows *rw = g->r.blobs[i].rows;
	unsigned v = store_entry_part_is_v(&g->plan, q);
	return g->blob_at[i] + (rw && v ? rw->fresh_k : 0);
}

/* Where stream byte x lies in the payload (a byte always in place: where
 * the payload before it ends). */
static uint64_t stream_at(const struct store_stage *g, uint64_t x)
{
	size_t lo = 0, hi = g->stream.n;
	while (hi - lo > 1) { /* the last segment starting at or before x */
		size_t mid = lo + (hi - lo) / 2;
		if (g->seg_from[mid] <= x)
			lo = mid;
		else
			hi = mid;
	}
	if (!g->stream.n)
		return 0;
	return g->seg_at[lo] + (g->seg_pay[lo] ? x - g->seg_from[lo] : 0);
}

/* The parts the next placing stage takes: those whose bytes are in, up to
 * a stage's bytes (at least one); their bytes in *out. With `all`, only
 * when half a stage is waiting or every part is in. */
static uint32_t place_upto(const struct store_stage *g, uint64_t avail, int all, uint64_t *out)
{
	const struct store_entry_plan *p = &g->plan;
	uint32_t to = p->done.placed;
	uint64_t bytes = 0, stage = g->s->opt.stage_bytes;
	while (to < g->n_parts && part_at(g, to, 1) <= avail) {
		size_t len = store_entry_part_cost(p, to);
		if (to > p->done.placed && bytes + len > stage)
			break;
		bytes += len;
		to++;
	}
	if (!all && to < g->n_parts && bytes < stage / 2)
		to = p->done.placed; /* not worth a commit yet */
	*out = bytes;
	return to;
}

/* Places the next stage of parts, [done.placed, to) of `bytes`. 0, or an
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

/* Writes chunks [next_chunk, to): one stage. 0, or an LMDB code. */
static int write_stage(struct store_stage *g, uint32_t to)
{
	g->from = g->next_chunk;
	g->to = to;
	uint64_t bytes = stage_bytes_of(g, g->from, g->to);
	int rc = room_for_stage(g, bytes);
	if (!rc)
		rc = store_lru_write(g->s, bytes, op_stage, g, &g->evicted);
	if (rc)
		return rc;
	atomic_fetch_add(&g->s->staging_bytes, bytes);
	g->staged += bytes;
	g->next_chunk = to;
	pthread_mutex_lock(&g->mu); /* the carries written are free again */
	for (int i = 0; i < CARRIES; i++)
		if (g->carry[i].chunk != UINT32_MAX && g->carry[i].chunk < to)
			g->carry[i].chunk = UINT32_MAX;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	return 0;
}

int store_stage_step(struct store_stage *g, uint32_t max_stages)
{
	if (!g->threaded) {
		/* no scan thread: scan here, once every byte is in place */
		pthread_mutex_lock(&g->mu);
		int all = g->avail == g->pay_total || g->cancelled;
		pthread_mutex_unlock(&g->mu);
		if (!all)
			return STORE_STAGE_WAIT;
		if (!g->done && !g->failed)
			scan_run(g);
	}
	pthread_mutex_lock(&g->mu);
	uint32_t ready = g->chunks_ready;
	uint64_t avail = g->avail;
	int done = g->done, failed = g->failed || g->cancelled, squeezed = g->carry_wait;
	pthread_mutex_unlock(&g->mu);
	if (failed || g->write_rc)
		return STORE_STAGE_FAILED;
	/* Whole stages (each commit costs a sync), less only for the last, once
	 * the scan is done, or for a window two thirds full of bytes not yet
	 * consumed, so that it moves. Bytes all in place are no reason: the
	 * scan may still be hashing, and a commit per chunk it finishes would
	 * be the slowest way to write them. */
	int all_in = done || squeezed; /* the scan waits for a carry: write what is hashed */
	if (g->window && !all_in && avail + g->window / 3 >= store_stage_consumed(g) + g->window)
		all_in = 1;
	uint32_t written = 0;
	for (;;) {
		uint32_t want =
		        g->n_chunks - g->next_chunk < g->per ? g->n_chunks : g->next_chunk + g->per;
		uint32_t to = ready < want ? ready : want;
		/* a stage at a time; less only for the last, or for half a stage in
		 * a window (whose bytes wait for it) */
		int chunks = to > g->next_chunk && (to == want || all_in);
		uint64_t place_bytes = 0;
		uint32_t pto = chunks ? 0 : place_upto(g, avail, all_in, &place_bytes);
		if (!chunks && pto == g->plan.done.placed)
			break;
		if (max_stages && written == max_stages)
			return STORE_STAGE_MORE;
		written++;
		if (!chunks) {
			if ((g->write_rc = place_stage(g, pto, place_bytes)) != 0)
				return STORE_STAGE_FAILED;
			continue;
		}
		if ((g->write_rc = write_stage(g, to)) != 0)
			return STORE_STAGE_FAILED;
	}
	if (g->next_chunk == g->n_chunks && g->plan.done.placed == g->n_parts && done)
		return STORE_STAGE_READY;
	return STORE_STAGE_WAIT;
}

uint64_t store_stage_consumed(struct store_stage *g)
{
	pthread_mutex_lock(&g->mu);
	uint64_t at = g->scanned >= 4 ? g->scanned - 4 : 0; /* a float may straddle */
	int over = g->failed || g->cancelled || g->write_rc;
	if (over && g->threaded && !g->scan_over) {
		/* the scan may still be reading: stop it, and hand nothing back
		 * until it has stopped (it pokes then) */
		g->stop = 1;
		pthread_cond_broadcast(&g->cv);
		over = 0;
	}
	pthread_mutex_unlock(&g->mu);
	if (over)
		return UINT64_MAX; /* nothing more is read */
	for (uint32_t c = g->next_chunk; c < g->n_chunks; c++) {
		pthread_mutex_lock(&g->mu);
		int k = carried(g, c);
		pthread_mutex_unlock(&g->mu);
		if (k >= 0)
			continue; /* copied aside as it passed */
		uint64_t x = stream_at(g, (uint64_t)c * STORE_CHUNK_DATA);
		if (x < at)
			at = x;
		break;
	}
	if (g->plan.done.placed < g->n_parts) {
		uint64_t x = part_at(g, g->plan.done.placed, 0);
		if (x < at)
			at = x;
	}
	return at;
}

void store_stage_wait(struct store_stage *g)
{
	pthread_mutex_lock(&g->mu);
	uint32_t ready = g->chunks_ready, layers = g->layers_ready;
	while (g->threaded && g->chunks_ready == ready && g->layers_ready == layers && !g->done &&
	       !g->failed && !g->stop && !g->carry_wait && !g->scan_over)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

/* The base entry of a delta (a layer assembled from it names it). */
static const uint8_t *delta_base(const struct store_stage *g)
{
	for (uint32_t i = 0; i < g->r.n_blobs; i++)
		if (g->r.blobs[i].rows)
			return g->r.blobs[i].rows->base_key;
	return NULL;
}

enum status_code store_stage_end(struct store_stage *g, struct store_publish_res *res,
                                 struct status *st)
{
	struct store *s = g->s;
	pthread_mutex_lock(&g->mu);
	int ok = g->done && !g->failed && !g->cancelled && !g->write_rc &&
	         g->next_chunk == g->n_chunks && g->plan.done.placed == g->n_parts;
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
	res->delta_refused = g->failed && g->refused;
	enum status_code code = STATUS_OK;
	if (res->delta_refused && delta_base(g)) /* the worker's rows, or the base's? */
		code = store_delta_sum_refused(s, delta_base(g), g->message, st);
	else if (g->failed)
		code = status_set(st, g->nomem ? STATUS_INTERNAL : STATUS_INVALID, "%s",
		                  g->message);
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
	enum status_code code = store_stage_begin(s, r, 0, NULL, NULL, &g, res, st);
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
