/* entry: an entry's rows as a whole (entry.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "blocks.h"
#include "chunks.h"
#include "entry.h"
#include "index.h"
#include "prefix.h"

/* Appends a piece of a blob to the plan's stream, joined to the last piece
 * when they touch. */
static int add_seg(struct store_entry_plan *p, size_t *cap, const unsigned char *data, size_t len)
{
	if (!len)
		return 0;
	p->stream += len;
	if (p->n_segs && p->segs[p->n_segs - 1].data + p->segs[p->n_segs - 1].len == data) {
		p->segs[p->n_segs - 1].len += len;
		return 0;
	}
	if (p->n_segs == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		struct store_segment *ns = realloc(p->segs, nc * sizeof(*ns));
		if (!ns)
			return ENOMEM;
		p->segs = ns;
		*cap = nc;
	}
	p->segs[p->n_segs++] = (struct store_segment){data, len};
	return 0;
}

/* Bytes of an MLA layer of n rows laid out as the model says. */
static uint64_t mla_size(const struct model_layer *l, uint32_t n)
{
	return 13 + (uint64_t)n * ((uint64_t)l->k_row + l->v_row) * 4;
}

/* A layer's rows of one part (k or v) as pieces: the blob's own, or those a
 * delta assembled (store_blob.rows). */
struct rows_view {
	const struct store_segment *pieces;
	uint32_t n;
	uint32_t at;    /* the piece the last lookup ended in */
	uint64_t start; /* its first byte's offset */
};

/* Adds a copy to make before a part is placed. */
static int add_fill(struct store_entry_plan *p, unsigned char *dst, const unsigned char *src,
                    size_t len)
{
	if (p->n_fills == p->cap_fills) {
		uint32_t nc = p->cap_fills ? p->cap_fills * 2 : 8;
		struct store_plan_fill *nf = realloc(p->fills, nc * sizeof(*nf));
		if (!nf)
			return -1;
		p->fills = nf;
		p->cap_fills = nc;
	}
	p->fills[p->n_fills++] = (struct store_plan_fill){dst, src, len, 0};
	return 0;
}

/* Rows bytes [off, off+len) as one pointer: inside their piece, or, when
 * they span pieces, a buffer the plan owns, filled from the pieces only
 * when the part is placed (its bytes may not have arrived yet): its fills
 * are plan->fills[*fill, *fill + *n_fill). NULL: no memory. */
static const unsigned char *rows_at(struct store_entry_plan *p, struct rows_view *w, uint64_t off,
                                    size_t len, uint32_t *fill, uint32_t *n_fill)
{
	*fill = p->n_fills;
	*n_fill = 0;
	while (w->at < w->n && off >= w->start + w->pieces[w->at].len) {
		w->start += w->pieces[w->at].len;
		w->at++;
	}
	if (w->at < w->n && off + len <= w->start + w->pieces[w->at].len)
		return w->pieces[w->at].data + (off - w->start);
	if (p->n_owned == p->cap_owned) {
		size_t nc = p->cap_owned ? p->cap_owned * 2 : 8;
		unsigned char **no = realloc(p->owned, nc * sizeof(*no));
		if (!no)
			return NULL;
		p->owned = no;
		p->cap_owned = nc;
	}
	unsigned char *buf = malloc(len ? len : 1);
	if (!buf)
		return NULL;
	p->owned[p->n_owned++] = buf;
	uint64_t start = w->start, done = 0;
	for (uint32_t j = w->at; j < w->n && done < len; j++) {
		uint64_t from = off + done - start;
		size_t take = (size_t)(w->pieces[j].len - from);
		if (take > len - done)
			take = (size_t)(len - done);
		if (add_fill(p, buf + done, w->pieces[j].data + from, take) != 0)
			return NULL;
		(*n_fill)++;
		done += take;
		start += w->pieces[j].len;
	}
	return buf;
}

/* Adds rows bytes [off, off+len) to the stream, piece by piece. */
static int add_rows(struct store_entry_plan *p, size_t *cap, const struct rows_view *w,
                    uint64_t off, uint64_t len)
{
	uint64_t start = 0;
	for (uint32_t j = 0; j < w->n && len; j++) {
		const struct store_segment *g = &w->pieces[j];
		if (off >= start + g->len) {
			start += g->len;
			continue;
		}
		size_t take = (size_t)(start + g->len - off);
		if (take > len)
			take = (size_t)len;
		int rc = add_seg(p, cap, g->data + (off - start), take);
		if (rc)
			return rc;
		off += take;
		len -= take;
		start += g->len;
	}
	return 0;
}

/* Adds a delta's layer whole to the stream (no blocks). */
static int add_pieces(struct store_entry_plan *p, size_t *cap, const struct store_rows *rw)
{
	int rc = add_seg(p, cap, rw->head, sizeof(rw->head));
	for (uint32_t j = 0; j < rw->n_k && !rc; j++)
		rc = add_seg(p, cap, rw->k[j].data, rw->k[j].len);
	if (!rc)
		rc = add_seg(p, cap, rw->vcount, sizeof(rw->vcount));
	for (uint32_t j = 0; j < rw->n_v && !rc; j++)
		rc = add_seg(p, cap, rw->v[j].data, rw->v[j].len);
	return rc;
}

/* Lays out one MLA layer, from the model alone (its bytes may not have
 * arrived yet): its header words and tail rows to the stream, its full
 * blocks to the list. */
static int plan_mla(const struct store_publish_req *r, const struct model_layer *l, uint32_t i,
                    uint32_t mla, struct store_entry_plan *p, size_t *cap)
{
	const struct store_blob *blob = &r->blobs[i];
	uint32_t n = r->n_tokens, rb = p->row_block, nb = n / rb;
	size_t row[2] = {(size_t)l->k_row * 4, (size_t)l->v_row * 4};
	struct store_segment own[2];
	struct rows_view w[2];
	const unsigned char *head, *vcount;
	if (blob->rows) {
		const struct store_rows *rw = blob->rows;
		w[0] = (struct rows_view){rw->k, rw->n_k, 0, 0};
		w[1] = (struct rows_view){rw->v, rw->n_v, 0, 0};
		head = rw->head;
		vcount = rw->vcount;
	} else {
		const unsigned char *d = blob->data;
		own[0] = (struct store_segment){d + 9, (size_t)n * row[0]};
		own[1] = (struct store_segment){d + 13 + (size_t)n * row[0], (size_t)n * row[1]};
		w[0] = (struct rows_view){&own[0], 1, 0, 0};
		w[1] = (struct rows_view){&own[1], 1, 0, 0};
		head = d;
		vcount = d + 9 + (size_t)n * row[0];
	}
	for (uint32_t b = 0; b < nb; b++) {
		uint32_t fill[2], n_fill[2];
		const unsigned char *k = rows_at(p, &w[0], (uint64_t)b * rb * row[0], rb * row[0],
		                                 &fill[0], &n_fill[0]);
		const unsigned char *v = k ? rows_at(p, &w[1], (uint64_t)b * rb * row[1],
		                                     rb * row[1], &fill[1], &n_fill[1])
		                           : NULL;
		if (!k || !v)
			return ENOMEM;
		const struct store_rows *rw = blob->rows;
		int known = rw && rw->known && rw->row_block == rb && b < rw->n_known &&
		            ((rw->known[b / 8] >> (b % 8)) & 1);
		if (known)
			p->base = rw->base;
		p->blocks[p->n_blocks++] = (struct store_plan_block){
		        .layer = i,
		        .block = b,
		        .mla = mla,
		        .node = p->nodes[(uint64_t)(b + 1) * rb / PREFIX_BLOCK],
		        .k = k,
		        .v = v,
		        .klen = rb * row[0],
		        .vlen = rb * row[1],
		        .known = known,
		        .base_sum = known ? rw->base_sum : 0,
		        .fill = {fill[0], fill[1]},
		        .n_fill = {n_fill[0], n_fill[1]},
		};
	}
	/* k: the words before its rows, then its tail; v: its count, its tail */
	uint64_t tail = (uint64_t)nb * rb;
	int rc = add_seg(p, cap, head, 9);
	if (!rc)
		rc = add_rows(p, cap, &w[0], tail * row[0], (n - tail) * row[0]);
	if (!rc)
		rc = add_seg(p, cap, vcount, 4);
	if (!rc)
		rc = add_rows(p, cap, &w[1], tail * row[1], (n - tail) * row[1]);
	return rc;
}

int store_entry_plan(struct store *s, const struct store_publish_req *r,
                     const struct k3cache_model *m, struct store_entry_plan *plan)
{
	memset(plan, 0, sizeof(*plan));
	size_t cap = 0;
	uint32_t n_mla = 0;
	plan->layer_end = calloc(r->n_blobs ? r->n_blobs : 1, sizeof(*plan->layer_end));
	if (!plan->layer_end)
		return ENOMEM;
	for (uint32_t i = 0; i < r->n_blobs && i < m->n_layers; i++)
		n_mla += m->layers[i].mixer == MODEL_MIXER_MLA;
	if (s->has_blocks && s->row_block && r->n_tokens >= s->row_block && n_mla &&
	    r->n_blobs == m->n_layers) {
		plan->row_block = s->row_block;
		plan->map_per = store_record_map_bytes(r->n_tokens, s->row_block);
		plan->map_len = n_mla * plan->map_per;
		plan->map = calloc(plan->map_len, 1);
		plan->per_layer = r->n_tokens / s->row_block;
		plan->blocks = calloc((size_t)n_mla * plan->per_layer, sizeof(*plan->blocks));
		plan->kst = calloc((size_t)n_mla * plan->per_layer, 1);
		plan->nodes = malloc(((size_t)r->n_tokens / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
		if (!plan->map || !plan->blocks || !plan->kst || !plan->nodes) {
			store_entry_plan_free(plan);
			return ENOMEM;
		}
		prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, r->tokens, r->n_tokens,
		                    plan->nodes);
	}
	int rc = 0;
	for (uint32_t i = 0, mla = 0; i < r->n_blobs && !rc; i++) {
		const struct model_layer *l = plan->row_block ? &m->layers[i] : NULL;
		/* a blob not of the model's size fails its check: laid out whole */
		if (l && l->mixer == MODEL_MIXER_MLA &&
		    r->blobs[i].size == mla_size(l, r->n_tokens))
			rc = plan_mla(r, l, i, mla, plan, &cap);
		else if (r->blobs[i].rows) /* a delta's layer, whole: its pieces in order */
			rc = add_pieces(plan, &cap, r->blobs[i].rows);
		else
			rc = add_seg(plan, &cap, r->blobs[i].data, (size_t)r->blobs[i].size);
		mla += l && l->mixer == MODEL_MIXER_MLA;
		plan->layer_end[i] = plan->stream;
	}
	plan->done.stored = plan->now.stored = plan->stream;
	if (rc)
		store_entry_plan_free(plan);
	return rc;
}

void store_entry_plan_free(struct store_entry_plan *plan)
{
	free(plan->map);
	free(plan->segs);
	free(plan->blocks);
	free(plan->kst);
	free(plan->nodes);
	free(plan->layer_end);
	for (size_t i = 0; i < plan->n_owned; i++)
		free(plan->owned[i]);
	free(plan->owned);
	free(plan->fills);
	memset(plan, 0, sizeof(*plan));
}

/* Whether the stored base record still uses block b with the rows the
 * delta took: the same layer (by its sum) and the block shared. */
static int base_vouches(const struct store_record *base, const struct store_plan_block *b)
{
	uint8_t tag;
	uint64_t size, sum;
	if (b->layer >= base->n_layers || base->row_block == 0)
		return 0;
	store_record_layer(base, b->layer, &tag, &size, &sum);
	return sum == b->base_sum && b->block < base->prefix_len / base->row_block &&
	       store_record_shared(base, b->mla, b->block);
}

uint32_t store_entry_parts(const struct store_entry_plan *plan)
{
	return 2 * plan->n_blocks;
}

/* Part q's block and part (0 k, 1 v). */
static uint32_t part_of(const struct store_entry_plan *p, uint32_t q, unsigned *part)
{
	uint32_t nb = p->per_layer, r = q % (2 * nb);
	*part = r >= nb;
	return q / (2 * nb) * nb + (r < nb ? r : r - nb);
}

const unsigned char *store_entry_part(const struct store_entry_plan *plan, uint32_t q, size_t *len,
                                      uint32_t *layer)
{
	unsigned part;
	const struct store_plan_block *b = &plan->blocks[part_of(plan, q, &part)];
	*len = part ? b->vlen : b->klen;
	*layer = b->layer;
	return part ? b->v : b->k;
}

unsigned store_entry_part_is_v(const struct store_entry_plan *plan, uint32_t q)
{
	unsigned part;
	(void)part_of(plan, q, &part);
	return part;
}

uint32_t store_entry_part_fills(const struct store_entry_plan *plan, uint32_t q,
                                const struct store_plan_fill **fills)
{
	unsigned part;
	const struct store_plan_block *b = &plan->blocks[part_of(plan, q, &part)];
	*fills = plan->fills ? plan->fills + b->fill[part] : NULL;
	return b->n_fill[part];
}

/* Makes the copies part q's rows wait for (rows_at). */
static void fill_part(struct store_entry_plan *plan, uint32_t q)
{
	unsigned part;
	const struct store_plan_block *b = &plan->blocks[part_of(plan, q, &part)];
	for (uint32_t j = 0; j < b->n_fill[part]; j++) {
		struct store_plan_fill *f = &plan->fills[b->fill[part] + j];
		if (!f->done)
			memcpy(f->dst, f->src, f->len);
		f->done = 1;
	}
}

size_t store_entry_part_cost(const struct store_entry_plan *plan, uint32_t q)
{
	unsigned part;
	const struct store_plan_block *b = &plan->blocks[part_of(plan, q, &part)];
	if (b->known)
		return 64;
	return part ? b->vlen : b->klen;
}

/* What placing a block's k part did (plan->kst). */
enum { KST_NONE, KST_HELD, KST_VOUCHED, KST_PRIVATE };

static void set_shared(struct store_entry_plan *p, const struct store_plan_block *b, int on)
{
	unsigned char bit = (unsigned char)(1u << (b->block % 8));
	unsigned char *m = &p->map[(size_t)b->mla * p->map_per + b->block / 8];
	*m = on ? (unsigned char)(*m | bit) : (unsigned char)(*m & ~bit);
}

/* Writes part `part` of block bi as the entry's private chunk. */
static int put_private(struct store *s, MDB_txn *txn, const uint8_t *key,
                       struct store_entry_plan *p, uint32_t bi, unsigned part, const void *rows,
                       size_t len)
{
	p->now.stored += len;
	return store_chunks_put(s, txn, key, STORE_CHUNK_PRIVATE + 2 * bi + part, rows, len, NULL);
}

static int place_k(struct store *s, MDB_txn *txn, const uint8_t *key, struct store_entry_plan *p,
                   uint32_t bi, const struct store_record *base, int hold)
{
	const struct store_plan_block *b = &p->blocks[bi];
	int shared = 0, rc = 0;
	unsigned char st = KST_HELD;
	if (b->known && base && base_vouches(base, b)) {
		rc = store_blocks_addref(s, txn, b->node, b->layer, &shared);
		st = KST_VOUCHED;
	}
	if (!rc && !shared) {
		rc = store_blocks_use_k(s, txn, b->node, b->layer, b->k, b->klen, &shared,
		                        &p->now.added);
		st = KST_HELD;
	}
	if (!rc && shared && hold)
		rc = store_blocks_hold(s, txn, key, b->node, b->layer);
	if (!rc && !shared) {
		st = KST_PRIVATE;
		p->now.n_private++;
		p->now.mismatched++;
		rc = put_private(s, txn, key, p, bi, 0, b->k, b->klen);
	}
	p->kst[bi] = st;
	return rc;
}

static int place_v(struct store *s, MDB_txn *txn, const uint8_t *key, struct store_entry_plan *p,
                   uint32_t bi, int hold)
{
	const struct store_plan_block *b = &p->blocks[bi];
	if (p->kst[bi] == KST_PRIVATE)
		return put_private(s, txn, key, p, bi, 1, b->v, b->vlen);
	int same = 1, rc = 0;
	if (p->kst[bi] == KST_HELD && (rc = store_blocks_use_v(s, txn, b->node, b->layer, b->v,
	                                                       b->vlen, &same, &p->now.added)) != 0)
		return rc;
	if (same) {
		set_shared(p, b, 1);
		return 0;
	}
	/* the same k rows, other v rows: the stored k rows are copied out (the
	 * block may go when the reference does), then both parts kept here */
	MDB_val kv;
	if ((rc = store_blocks_get(s, txn, b->node, b->layer, 0, &kv)) != 0)
		return rc == MDB_NOTFOUND ? MDB_CORRUPTED : rc;
	if (kv.mv_size != b->klen + 8)
		return MDB_CORRUPTED;
	unsigned char *k = malloc(b->klen ? b->klen : 1);
	if (!k)
		return ENOMEM;
	memcpy(k, (const unsigned char *)kv.mv_data + 8, b->klen);
	p->now.n_private++;
	p->now.mismatched++;
	rc = put_private(s, txn, key, p, bi, 0, k, b->klen);
	free(k);
	if (!rc)
		rc = put_private(s, txn, key, p, bi, 1, b->v, b->vlen);
	if (!rc && hold)
		rc = store_blocks_unhold(s, txn, key, b->node, b->layer);
	if (!rc)
		rc = store_blocks_unuse(s, txn, b->node, b->layer, &p->now.freed, NULL);
	return rc;
}

int store_entry_place(struct store *s, MDB_txn *txn, const uint8_t *key,
                      struct store_entry_plan *plan, uint32_t to, int hold)
{
	struct store_plan_mark *now = &plan->now;
	*now = plan->done;
	if (to > store_entry_parts(plan))
		to = store_entry_parts(plan);
	for (uint32_t q = now->placed; q < to; q++) { /* what an aborted try placed */
		unsigned part;
		uint32_t bi = part_of(plan, q, &part);
		if (part)
			set_shared(plan, &plan->blocks[bi], 0);
		else
			plan->kst[bi] = KST_NONE;
	}
	/* a delta's base, still stored, vouches for the blocks it uses */
	struct store_record base;
	int base_stored = plan->base && store_record_read(s, txn, plan->base, &base) == 0 &&
	                  !(base.flags & STORE_FLAG_QUARANTINED);
	for (; now->placed < to; now->placed++) {
		unsigned part;
		uint32_t bi = part_of(plan, now->placed, &part);
		fill_part(plan, now->placed);
		int rc = part ? place_v(s, txn, key, plan, bi, hold)
		              : place_k(s, txn, key, plan, bi, base_stored ? &base : NULL, hold);
		if (rc)
			return rc;
	}
	return 0;
}

void store_entry_count_placed(const struct store_entry_plan *plan, uint64_t *bytes)
{
	uint64_t freed = plan->now.freed - plan->done.freed;
	*bytes += plan->now.added - plan->done.added;
	*bytes = *bytes >= freed ? *bytes - freed : 0;
}

void store_entry_placed(struct store_entry_plan *plan)
{
	plan->done = plan->now;
}

int store_entry_add(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                    const uint8_t *key, uint64_t bytes, const uint8_t *tags, const uint64_t *sizes,
                    const uint64_t *sums, const struct store_entry_plan *plan,
                    struct store_totals *totals)
{
	uint64_t now = store_now(s);
	uint64_t seq = atomic_fetch_add(&s->lru_clock, 1) + 1;
	struct store_record rec = {
	        .prefix_len = r->n_tokens,
	        .n_layers = r->n_blobs,
	        .flags = plan->row_block ? STORE_FLAG_PRIVATE_AT : 0,
	        .created = now,
	        .last_used = now,
	        .lru_seq = seq,
	        .bytes = bytes,
	        .salt_len = (uint32_t)r->salt_len,
	        .salt = r->salt,
	        .stored = plan->now.stored,
	        .row_block = plan->row_block,
	        .map_len = plan->map_len,
	        .map = plan->map,
	};
	memcpy(rec.key, key, STORE_KEY_LEN);
	memcpy(rec.fingerprint, r->fingerprint, MODEL_FINGERPRINT_LEN);
	int rc = store_record_put(s, txn, &rec, tags, sizes, sums);
	if (!rc)
		rc = store_index_add(s, txn, r->fingerprint, r->salt, r->salt_len, r->tokens,
		                     r->n_tokens, key);
	if (!rc)
		rc = store_index_lru_add(s, txn, seq, key);
	if (!rc) {
		totals->bytes += plan->now.stored;
		store_entry_count_placed(plan, &totals->bytes);
		totals->logical += bytes;
	}
	return rc;
}

/* The shared blocks an entry uses, gathered before the entry is touched:
 * the record and its tokens point into pages its deletion may move. */
/* Calls fn for each shared block the record r uses, given its tokens. */
static int record_uses(const struct store_record *r, const uint32_t *tokens,
                       int (*fn)(const uint8_t *key, const uint8_t *node, uint32_t layer,
                                 void *ctx),
                       void *ctx)
{
	uint8_t(*h)[PREFIX_NODE_LEN] =
	        malloc(((size_t)r->prefix_len / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
	if (!h)
		return ENOMEM;
	prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, tokens, r->prefix_len, h);
	int rc = 0;
	for (uint32_t i = 0, mla = 0; i < r->n_layers && !rc; i++) {
		uint8_t tag;
		uint64_t size, sum;
		store_record_layer(r, i, &tag, &size, &sum);
		if (tag != BLOB_TAG_MLA)
			continue;
		for (uint32_t b = 0; b < r->prefix_len / r->row_block && !rc; b++)
			if (store_record_shared(r, mla, b))
				rc = fn(r->key, h[(uint64_t)(b + 1) * r->row_block / PREFIX_BLOCK],
				        i, ctx);
		mla++;
	}
	free(h);
	return rc;
}

/* The shared blocks an entry uses, gathered before the entry is touched:
 * the record and its tokens point into pages its deletion may move. */
struct uses {
	struct {
		uint8_t node[PREFIX_NODE_LEN];
		uint32_t layer;
	} * v;
	size_t n, cap;
};

static int add_use(const uint8_t *key, const uint8_t *node, uint32_t layer, void *ctx)
{
	(void)key;
	struct uses *u = ctx;
	if (u->n == u->cap) {
		size_t nc = u->cap ? u->cap * 2 : 64;
		void *nv = realloc(u->v, nc * sizeof(*u->v));
		if (!nv)
			return ENOMEM;
		u->v = nv;
		u->cap = nc;
	}
	memcpy(u->v[u->n].node, node, PREFIX_NODE_LEN);
	u->v[u->n++].layer = layer;
	return 0;
}

static int gather_uses(struct store *s, MDB_txn *txn, const struct store_record *r, struct uses *u)
{
	memset(u, 0, sizeof(*u));
	if (!r->row_block || !r->map_len)
		return 0;
	MDB_val v;
	int rc = store_index_tokens(s, txn, r->key, &v);
	if (rc == MDB_NOTFOUND || (rc == 0 && v.mv_size != (size_t)r->prefix_len * 4u))
		return 0; /* cannot be found again: verify reports the counts */
	return rc ? rc : record_uses(r, v.mv_data, add_use, u);
}

/* An entry's rows but its references to blocks: its LRU row, its prefix
 * index rows, its chunks, its record. */
static int delete_rows(struct store *s, MDB_txn *txn, const struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)r->key};
	int rc = store_index_lru_del(s, txn, r->lru_seq, r->key);
	if (!rc)
		rc = store_index_remove(s, txn, r);
	if (!rc)
		rc = store_chunks_delete(s, txn, r->key);
	if (!rc && (rc = mdb_del(txn, s->entries, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	return rc;
}

int store_entry_delete(struct store *s, MDB_txn *txn, const struct store_record *rec,
                       struct store_totals *totals, struct store_dry *dry)
{
	/* rec's salt, layers and map point into a page of this transaction:
	 * copy what is needed before any update can move that page */
	struct store_record copy = *rec;
	uint8_t salt[STORE_MAX_SALT];
	if (copy.salt_len > sizeof(salt))
		return MDB_CORRUPTED;
	if (copy.salt_len)
		memcpy(salt, copy.salt, copy.salt_len);
	copy.salt = salt;
	struct uses u;
	int rc = gather_uses(s, txn, &copy, &u);
	if (rc)
		return rc;
	copy.layers = NULL;
	copy.map = NULL;
	const struct store_record *r = &copy;
	uint64_t freed = r->stored;
	for (size_t i = 0; i < u.n && !rc; i++)
		rc = store_blocks_unuse(s, txn, u.v[i].node, u.v[i].layer, &freed, dry);
	free(u.v);
	if (!rc) /* a dry run writes nothing: the entry is gone for the rest of it */
		rc = dry ? store_dry_add(dry, r->key, STORE_KEY_LEN) : delete_rows(s, txn, r);
	if (!rc && totals) {
		totals->bytes = totals->bytes >= freed ? totals->bytes - freed : 0;
		totals->logical = totals->logical >= r->bytes ? totals->logical - r->bytes : 0;
	}
	return rc;
}

int store_entry_recount(struct store *s, MDB_txn *txn, struct store_totals *t)
{
	t->bytes = t->logical = 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		uint64_t b = 0;
		if (store_record_decode(v.mv_data, v.mv_size, &r) == 0) {
			t->bytes += r.stored;
			t->logical += r.bytes;
			continue;
		}
		if (k.mv_size == STORE_KEY_LEN &&
		    (rc = store_chunks_bytes(s, txn, k.mv_data, &b)) != 0)
			break;
		t->bytes += b;
		t->logical += b;
	}
	mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND)
		return rc;
	rc = 0;
	if (s->has_blocks && (rc = mdb_cursor_open(txn, s->blocks, &cur)) == 0) {
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
		     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
			t->bytes += v.mv_size > 8 ? v.mv_size - 8 : 0;
		mdb_cursor_close(cur);
		if (rc == MDB_NOTFOUND)
			rc = 0;
	}
	return rc;
}

int store_entry_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                               struct store_totals *totals)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	int rc = store_chunks_delete(s, txn, key);
	if (!rc && (rc = mdb_del(txn, s->tokens, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && (rc = mdb_del(txn, s->entries, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && totals)
		rc = store_entry_recount(s, txn, totals);
	return rc;
}
int store_entry_each_use(struct store *s, MDB_txn *txn,
                         int (*fn)(const uint8_t *key, const uint8_t *node, uint32_t layer,
                                   void *ctx),
                         void *ctx)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		MDB_val tv;
		if (store_record_decode(v.mv_data, v.mv_size, &r) != 0 || !r.row_block ||
		    !r.map_len)
			continue;
		/* tokens missing or of the wrong length: skipped (verify reports
		 * them); a read that fails is not "no uses" (verify's repair
		 * counts from here) */
		int got = store_index_tokens(s, txn, r.key, &tv);
		if (got && got != MDB_NOTFOUND) {
			rc = got;
			break;
		}
		if (got || tv.mv_size != (size_t)r.prefix_len * 4u)
			continue;
		if ((rc = record_uses(&r, tv.mv_data, fn, ctx)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}
