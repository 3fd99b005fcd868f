/* restore: an entry's bytes as zero-copy views in the map, checked chunk by
 * chunk, and taking damaged entries out of service (store.h, "restore"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "blocks.h"
#include "chunks.h"
#include "entry.h"
#include "index.h"
#include "lru.h"
#include "record.h"
#include "restore.h"
#include "txn.h"
#include "xxh_dispatch.h"

/* A piece of the restore payload, in payload order: a range of one value in
 * the map, a chunk of the entry's stream or a part of a shared block. The
 * first piece of each value carries the value, to check before it is sent. */
struct piece_check {
	const unsigned char *val; /* NULL: nothing to check at this piece */
	size_t len;
	uint64_t seed; /* chunk number, or layer */
	uint32_t what; /* chunk number, or block number */
	uint8_t block; /* 0: a chunk; 1, 2: the k or v part of a shared block; 3, 4: of a
	                  private block (a chunk past STORE_CHUNK_PRIVATE) */
	uint32_t layer;
	uint8_t node[PREFIX_NODE_LEN]; /* a block's */
};

struct users {
	const uint8_t *node;
	uint32_t layer;
	uint8_t (*keys)[STORE_KEY_LEN];
	size_t n, cap;
};

static int add_user(const uint8_t *key, const uint8_t *node, uint32_t layer, void *ctx)
{
	struct users *u = ctx;
	if (layer != u->layer || memcmp(node, u->node, PREFIX_NODE_LEN) != 0)
		return 0;
	if (u->n == u->cap) {
		size_t nc = u->cap ? u->cap * 2 : 16;
		void *nk = realloc(u->keys, nc * STORE_KEY_LEN);
		if (!nk)
			return ENOMEM;
		u->keys = nk;
		u->cap = nc;
	}
	memcpy(u->keys[u->n++], key, STORE_KEY_LEN);
	return 0;
}

/* A damaged shared block: every entry that uses it is taken out of service
 * (its own restore would fail too). Appends how many to why. Takes write
 * transactions: the writer's, or an offline tool's. */
static void quarantine_users(struct store *s, const uint8_t *node, uint32_t layer,
                             const uint8_t *key, char *why, size_t whysz)
{
	if (s->opt.read_only || !s->has_blocks)
		return;
	struct users u = {.node = node, .layer = layer};
	MDB_txn *txn;
	if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) != 0)
		return;
	int rc = store_entry_each_use(s, txn, add_user, &u);
	mdb_txn_abort(txn);
	size_t others = 0;
	for (size_t i = 0; !rc && i < u.n; i++)
		if (memcmp(u.keys[i], key, STORE_KEY_LEN) != 0 &&
		    store_quarantine(s, u.keys[i]) != STORE_QUARANTINE_NONE)
			others++;
	free(u.keys);
	size_t n = strlen(why);
	if (others)
		snprintf(why + n, whysz - n, ", with %zu other entr%s that use%s the block", others,
		         others == 1 ? "y" : "ies", others == 1 ? "s" : "");
}

struct store_snapshot_priv {
	struct store *s;
	MDB_txn *txn;
	struct store_segment *segs; /* the pieces */
	struct piece_check *checks;
	size_t n, cap;
};

void store_snapshot_release(struct store_snapshot *snap)
{
	if (!snap)
		return;
	if (snap->priv) {
		mdb_txn_abort(snap->priv->txn);
		atomic_fetch_sub(&snap->priv->s->open_snapshots, 1);
		free(snap->priv->segs);
		free(snap->priv->checks);
		free(snap->priv);
	}
	free(snap->layers);
	free(snap);
}

/* Why a value is damaged, for messages. */
static void piece_name(const struct piece_check *c, char *out, size_t outsz)
{
	if (c->block)
		snprintf(out, outsz, "%sblock %u of layer %u (%s rows)",
		         c->block > 2 ? "private " : "", c->what, c->layer,
		         c->block % 2 ? "k" : "v");
	else
		snprintf(out, outsz, "chunk %u", c->what);
}

static int piece_intact(const struct piece_check *c)
{
	MDB_val v = {c->len, (void *)c->val};
	return c->block == 1 || c->block == 2 ? store_blocks_intact(&v, (uint32_t)c->seed)
	                                      : store_chunks_intact(&v, c->seed);
}

/* A damaged value found by a restore. A deferred restore (the daemon's loop
 * thread) takes no write transaction: its caller quarantines. */
static enum status_code corrupt(struct store *s, struct store_snapshot *snap, struct status *st,
                                const char *what, const char *why, int defer,
                                const uint8_t *bad_node, uint32_t bad_layer)
{
	uint8_t key[STORE_KEY_LEN];
	memcpy(key, snap->key, STORE_KEY_LEN);
	store_snapshot_release(snap);
	atomic_fetch_add(&s->corrupt, 1);
	char msg[STATUS_MESSAGE_MAX];
	snprintf(msg, sizeof(msg), "%s %s", what, why);
	if (!defer) {
		store_quarantine_say(s, key, msg, sizeof(msg));
		if (bad_node) /* a damaged shared block: every entry that uses it */
			quarantine_users(s, bad_node, bad_layer, key, msg, sizeof(msg));
	}
	return status_set(st, STATUS_CORRUPT, "%s", msg);
}

enum status_code store_restore(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_snapshot **out, struct status *st)
{
	return store_restore_opt(s, key, STORE_RESTORE_USE, out, st);
}

enum status_code store_snapshot_verify(struct store_snapshot *snap, struct status *st)
{
	struct store_snapshot_priv *priv = snap->priv;
	for (size_t i = 0; i < priv->n; i++) {
		const struct piece_check *c = &priv->checks[i];
		if (!c->val || piece_intact(c))
			continue;
		atomic_fetch_add(&priv->s->corrupt, 1);
		char msg[STATUS_MESSAGE_MAX];
		piece_name(c, msg, sizeof(msg));
		size_t n = strlen(msg);
		snprintf(msg + n, sizeof(msg) - n, " fails its checksum");
		store_quarantine_say(priv->s, snap->key, msg, sizeof(msg));
		if (c->block)
			quarantine_users(priv->s, c->node, c->layer, snap->key, msg, sizeof(msg));
		return status_set(st, STATUS_CORRUPT, "%s", msg);
	}
	return STATUS_OK;
}

uint64_t store_snapshot_chunks(const struct store_snapshot *snap)
{
	return snap->priv->n;
}

enum status_code store_snapshot_chunk(const struct store_snapshot *snap, uint64_t i,
                                      const void **data, size_t *len, struct status *st)
{
	const struct store_snapshot_priv *priv = snap->priv;
	if (i >= priv->n) {
		*data = NULL;
		*len = 0;
		return status_set(st, STATUS_NOT_FOUND, "piece %llu of %llu", (unsigned long long)i,
		                  (unsigned long long)priv->n);
	}
	*data = priv->segs[i].data;
	*len = priv->segs[i].len;
	const struct piece_check *c = &priv->checks[i];
	if (c->val && !piece_intact(c)) {
		char name[96];
		piece_name(c, name, sizeof(name));
		return status_set(st, STATUS_CORRUPT, "%s fails its checksum", name);
	}
	return STATUS_OK;
}

/* Builds a restore's pieces: walks the entry's own stream chunk by chunk and
 * takes each shared block where the record's map says so. */
struct builder {
	struct store *s;
	MDB_txn *txn;
	struct store_snapshot_priv *priv;
	const uint8_t *key;
	int defer;
	uint64_t stored, taken; /* the stream's bytes, and those taken so far */
	uint32_t n_private;     /* private blocks taken so far */
	uint64_t chunk;         /* the chunk being cut; cur NULL: none yet */
	const unsigned char *cur;
	size_t cur_len, cur_off;
	char what[96], why[64]; /* a failure */
	int bad_block;          /* it is a shared block's: */
	uint8_t bad_node[PREFIX_NODE_LEN];
	uint32_t bad_layer;
};

static int add_piece(struct builder *b, const unsigned char *data, size_t len,
                     const struct piece_check *check)
{
	struct store_snapshot_priv *p = b->priv;
	if (p->n == p->cap) {
		size_t nc = p->cap ? p->cap * 2 : 64;
		struct store_segment *ns = realloc(p->segs, nc * sizeof(*ns));
		if (!ns)
			return ENOMEM;
		p->segs = ns;
		struct piece_check *nk = realloc(p->checks, nc * sizeof(*nk));
		if (!nk)
			return ENOMEM;
		p->checks = nk;
		p->cap = nc;
	}
	p->segs[p->n] = (struct store_segment){data, len};
	p->checks[p->n] = check ? *check : (struct piece_check){0};
	p->n++;
	return 0;
}

#define BUILD_DAMAGED (-30002) /* b->what, b->why say how */

static int damaged(struct builder *b, const char *why)
{
	snprintf(b->why, sizeof(b->why), "%s", why);
	return BUILD_DAMAGED;
}

/* Takes the next len bytes of the entry's stream. peek (when not NULL)
 * receives up to 16 of them. */
/* Moves to the next chunk of the entry's stream, checked (or, deferred,
 * to be checked by its first piece, *check). */
static int next_chunk(struct builder *b, struct piece_check *check)
{
	uint64_t c = b->cur ? b->chunk + 1 : 0;
	if (c * STORE_CHUNK_DATA >= b->stored) {
		snprintf(b->what, sizeof(b->what), "the entry's stream");
		return damaged(b, "is shorter than its layers");
	}
	uint64_t want = b->stored - c * STORE_CHUNK_DATA;
	if (want > STORE_CHUNK_DATA)
		want = STORE_CHUNK_DATA;
	MDB_val v;
	int rc = store_chunks_get(b->s, b->txn, b->key, c, &v);
	snprintf(b->what, sizeof(b->what), "chunk %llu", (unsigned long long)c);
	if (rc == MDB_NOTFOUND)
		return damaged(b, "is missing");
	if (rc)
		return rc;
	if (v.mv_size != want + 8)
		return damaged(b, "has the wrong size");
	*check = (struct piece_check){
	        .val = v.mv_data, .len = v.mv_size, .seed = c, .what = (uint32_t)c};
	if (!b->defer && !piece_intact(check))
		return damaged(b, "fails its checksum");
	b->chunk = c;
	b->cur = (const unsigned char *)v.mv_data;
	b->cur_len = v.mv_size;
	b->cur_off = 8;
	return 0;
}

/* Takes the next len bytes of the entry's stream. peek (when not NULL)
 * receives up to peek_len of them. */
static int take(struct builder *b, uint64_t len, unsigned char *peek, size_t peek_len)
{
	size_t peeked = 0;
	while (len) {
		struct piece_check check;
		int first = !b->cur || b->cur_off == b->cur_len;
		int rc = first ? next_chunk(b, &check) : 0;
		if (rc)
			return rc;
		size_t n = (size_t)(len < b->cur_len - b->cur_off ? len : b->cur_len - b->cur_off);
		/* a chunk's first piece checks it (deferred restores) */
		if ((rc = add_piece(b, b->cur + b->cur_off, n, first && b->defer ? &check : NULL)))
			return rc;
		if (peek && peeked < peek_len) {
			size_t pn = n < peek_len - peeked ? n : peek_len - peeked;
			memcpy(peek + peeked, b->cur + b->cur_off, pn);
			peeked += pn;
		}
		b->cur_off += n;
		b->taken += n;
		len -= n;
	}
	return 0;
}

/* Takes a value read for a part of a block (rc: how the read went), of len
 * row bytes after its sum, checked by check (a shared block's: node). */
static int take_part(struct builder *b, int rc, const MDB_val *v, size_t len,
                     struct piece_check *check, const uint8_t *node)
{
	if (rc == MDB_NOTFOUND)
		return damaged(b, "is missing");
	if (rc)
		return rc;
	if (v->mv_size != len + 8)
		return damaged(b, "has the wrong size");
	check->val = v->mv_data;
	check->len = v->mv_size;
	if (!b->defer && !piece_intact(check)) {
		if (node) {
			b->bad_block = 1;
			memcpy(b->bad_node, node, PREFIX_NODE_LEN);
			b->bad_layer = check->layer;
		}
		return damaged(b, "fails its checksum");
	}
	return add_piece(b, (const unsigned char *)v->mv_data + 8, len, b->defer ? check : NULL);
}

/* Takes part (0 k, 1 v) of shared block bl of layer i, of len row bytes. */
static int take_block(struct builder *b, const uint8_t *node, uint32_t i, uint32_t bl,
                      unsigned part, size_t len)
{
	MDB_val v;
	snprintf(b->what, sizeof(b->what), "block %u of layer %u (%s rows)", bl, i,
	         part ? "v" : "k");
	int rc = store_blocks_get(b->s, b->txn, node, i, part, &v);
	struct piece_check check = {
	        .seed = i, .what = bl, .block = (uint8_t)(part + 1), .layer = i};
	memcpy(check.node, node, PREFIX_NODE_LEN);
	return take_part(b, rc, &v, len, &check, node);
}

/* Takes part (0 k, 1 v) of private block j (block bl of layer i), of len
 * row bytes. */
static int take_private(struct builder *b, uint32_t j, uint32_t i, uint32_t bl, unsigned part,
                        size_t len)
{
	uint32_t c = STORE_CHUNK_PRIVATE + 2 * j + part;
	MDB_val v;
	snprintf(b->what, sizeof(b->what), "private block %u of layer %u (%s rows)", bl, i,
	         part ? "v" : "k");
	int rc = store_chunks_get(b->s, b->txn, b->key, c, &v);
	struct piece_check check = {
	        .seed = c, .what = bl, .block = (uint8_t)(part + 3), .layer = i};
	return take_part(b, rc, &v, len, &check, NULL);
}

static uint32_t le32_at(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* An MLA layer cut into blocks (record.h): its k rows then its v rows,
 * each full block shared or private, each tail from the stream. */
static int take_mla(struct builder *b, const struct store_record *r, uint32_t i, uint32_t mla,
                    uint64_t size, uint8_t (*h)[PREFIX_NODE_LEN])
{
	unsigned char head[9];
	int rc = take(b, 9, head, sizeof(head));
	if (rc)
		return rc;
	uint64_t p = r->prefix_len, kcount = le32_at(head + 5);
	snprintf(b->what, sizeof(b->what), "layer %u", i);
	if (head[0] != BLOB_TAG_MLA || le32_at(head + 1) != p || kcount % p ||
	    13 + kcount * 4 > size || (size - 13 - kcount * 4) % (4 * p))
		return damaged(b, "has damaged header words");
	size_t row[2] = {(size_t)(kcount / p * 4), (size_t)((size - 13 - kcount * 4) / p)};
	uint32_t rb = r->row_block, nb = r->prefix_len / rb, j = 0;
	/* private blocks by their place, or (older records) by the clear bits */
	int at = (r->flags & STORE_FLAG_PRIVATE_AT) != 0;
	for (unsigned part = 0; part < 2 && !rc; part++) {
		if (part)
			rc = take(b, 4, NULL, 0); /* v's count */
		j = b->n_private;
		for (uint32_t bl = 0; bl < nb && !rc; bl++)
			rc = store_record_shared(r, mla, bl)
			             ? take_block(b, h[(uint64_t)(bl + 1) * rb / PREFIX_BLOCK], i,
			                          bl, part, rb * row[part])
			             : take_private(b, at ? mla * nb + bl : j++, i, bl, part,
			                            rb * row[part]);
		if (!rc)
			rc = take(b, (uint64_t)(r->prefix_len - nb * rb) * row[part], NULL, 0);
	}
	b->n_private = j;
	return rc;
}

enum status_code store_restore_opt(struct store *s, const uint8_t key[STORE_KEY_LEN],
                                   unsigned flags, struct store_snapshot **out, struct status *st)
{
	int use = (flags & STORE_RESTORE_USE) != 0, defer = (flags & STORE_RESTORE_DEFER) != 0;
	*out = NULL;
	struct store_snapshot *snap = calloc(1, sizeof(*snap));
	struct store_snapshot_priv *priv = calloc(1, sizeof(*priv));
	if (!snap || !priv) {
		free(snap);
		free(priv);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	snap->priv = priv;
	priv->s = s;
	memcpy(snap->key, key, STORE_KEY_LEN);
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &priv->txn);
	if (rc) {
		snap->priv = NULL;
		free(priv);
		store_snapshot_release(snap);
		return store_mdb_error(st, rc, "restore");
	}
	atomic_fetch_add(&s->open_snapshots, 1);
	struct store_record r;
	rc = store_record_read(s, priv->txn, key, &r);
	if (rc == MDB_NOTFOUND) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_NOT_FOUND, "no such entry");
	}
	if (rc) {
		store_snapshot_release(snap);
		atomic_fetch_add(&s->corrupt, 1);
		return status_set(st, STATUS_CORRUPT, "the entry's record is damaged");
	}
	if (r.flags & STORE_FLAG_QUARANTINED) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_CORRUPT,
		                  "the entry is quarantined (a checksum failed); evict it");
	}
	memcpy(snap->fingerprint, r.fingerprint, MODEL_FINGERPRINT_LEN);
	snap->prefix_len = r.prefix_len;
	snap->n_layers = r.n_layers;
	snap->bytes = r.bytes;
	snap->layers = calloc(r.n_layers, sizeof(*snap->layers));
	uint8_t(*h)[PREFIX_NODE_LEN] = NULL;
	if (r.row_block && r.map_len) {
		/* the blocks are named by the entry's own tokens */
		MDB_val tv;
		rc = store_index_tokens(s, priv->txn, key, &tv);
		if (rc || tv.mv_size != (size_t)r.prefix_len * 4u) {
			store_snapshot_release(snap);
			atomic_fetch_add(&s->corrupt, 1);
			return status_set(st, STATUS_CORRUPT,
			                  "the entry's tokens are missing or damaged");
		}
		h = malloc(((size_t)r.prefix_len / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
		if (h)
			prefix_block_hashes(r.fingerprint, r.salt, r.salt_len, tv.mv_data,
			                    r.prefix_len, h);
	}
	if (!snap->layers || (r.row_block && r.map_len && !h)) {
		free(h);
		store_snapshot_release(snap);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	struct builder b = {.s = s,
	                    .txn = priv->txn,
	                    .priv = priv,
	                    .key = key,
	                    .defer = defer,
	                    .stored = r.stored - r.own_blocks};
	size_t *first = calloc(r.n_layers, sizeof(*first));
	rc = first ? 0 : ENOMEM;
	for (uint32_t i = 0, mla = 0; i < r.n_layers && !rc; i++) {
		struct store_layer *l = &snap->layers[i];
		l->index = i;
		store_record_layer(&r, i, &l->tag, &l->size, &l->xxh3);
		first[i] = priv->n;
		if (h && l->tag == BLOB_TAG_MLA)
			rc = take_mla(&b, &r, i, mla++, l->size, h);
		else
			rc = take(&b, l->size, NULL, 0);
	}
	if (!rc && b.taken != b.stored) {
		snprintf(b.what, sizeof(b.what), "the entry's stream");
		rc = damaged(&b, "is longer than its layers");
	}
	free(h);
	if (rc == BUILD_DAMAGED) {
		free(first);
		return corrupt(s, snap, st, b.what, b.why, defer, b.bad_block ? b.bad_node : NULL,
		               b.bad_layer);
	}
	if (rc) {
		free(first);
		store_snapshot_release(snap);
		return rc == ENOMEM ? status_set(st, STATUS_INTERNAL, "out of memory")
		                    : store_mdb_error(st, rc, "restore");
	}
	/* each layer's views: its pieces, now that the array will not move */
	for (uint32_t i = 0; i < r.n_layers; i++) {
		size_t end = i + 1 < r.n_layers ? first[i + 1] : priv->n;
		snap->layers[i].segments = priv->segs + first[i];
		snap->layers[i].n_segments = (uint32_t)(end - first[i]);
	}
	free(first);
	if (use) {
		atomic_fetch_add(&s->restores, 1);
		store_touch(s, key, 0); /* the lookup that found it counted the hit */
	}
	*out = snap;
	return STATUS_OK;
}

void store_note_use(struct store *s, const uint8_t key[STORE_KEY_LEN])
{
	atomic_fetch_add(&s->restores, 1);
	store_touch(s, key, 1); /* a direct reader's lookup counted nothing here */
}

enum store_quarantine_result store_quarantine(struct store *s, const uint8_t key[STORE_KEY_LEN])
{
	if (s->opt.read_only)
		return STORE_QUARANTINE_NONE;
	MDB_txn *txn;
	if (store_txn_write(s, &txn))
		return STORE_QUARANTINE_NONE;
	enum store_quarantine_result done = STORE_QUARANTINE_FLAGGED;
	struct store_record r;
	int rc = store_record_read(s, txn, key, &r);
	if (rc == -1) {
		/* the record itself is damaged: there is no flag to set */
		struct store_totals t;
		done = STORE_QUARANTINE_REMOVED;
		if (!(rc = store_totals_get(s, txn, &t)) &&
		    !(rc = store_entry_delete_damaged(s, txn, key, &t)))
			rc = store_totals_put(s, txn, &t);
	} else if (rc == 0 && (r.flags & STORE_FLAG_QUARANTINED)) {
		rc = STORE_TXN_NOTHING;
	} else if (rc == 0) {
		r.flags |= STORE_FLAG_QUARANTINED;
		rc = store_record_rewrite(s, txn, &r);
	}
	if (store_txn_end(txn, rc) != 0)
		return STORE_QUARANTINE_NONE;
	atomic_fetch_add(&s->quarantined, 1);
	return done;
}

void store_quarantine_say(struct store *s, const uint8_t *key, char *why, size_t whysz)
{
	size_t n = strlen(why);
	const char *done;
	if (s->opt.read_only)
		done = "; not quarantined (the store is open read-only): with the daemon running, "
		       "k3cachectl verify quarantines it";
	else
		switch (store_quarantine(s, key)) {
		case STORE_QUARANTINE_FLAGGED:
			done = "; the entry is quarantined";
			break;
		case STORE_QUARANTINE_REMOVED:
			done = "; the entry is removed (its record cannot be read)";
			break;
		default:
			done = "; it could not be quarantined: evict it (k3cachectl evict KEY)";
			break;
		}
	snprintf(why + n, whysz - n, "%s", done);
}
