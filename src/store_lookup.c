/* store_lookup: longest stored prefix of a prompt, and zero-copy restore. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "xxh_dispatch.h"

static int node_present(struct store *s, MDB_txn *txn, const uint8_t *node)
{
	MDB_val k = {PREFIX_NODE_LEN, (void *)node}, v;
	return mdb_get(txn, s->nodes, &k, &v) == 0;
}

/* Does the entry named by an attach row hold exactly the prompt's first P
 * tokens under this model and salt? Confirmed from the record and the stored
 * tokens, never from a hash. */
static int entry_matches(struct store *s, MDB_txn *txn, const struct store_lookup_req *req,
                         const uint8_t *key, uint32_t p)
{
	struct store_record r;
	if (store_read_record(s, txn, key, &r) != 0)
		return 0;
	if (r.flags & STORE_FLAG_QUARANTINED || r.prefix_len != p ||
	    memcmp(r.fingerprint, req->fingerprint, MODEL_FINGERPRINT_LEN) != 0 ||
	    r.salt_len != req->salt_len ||
	    (r.salt_len && memcmp(r.salt, req->salt, r.salt_len) != 0))
		return 0;
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	if (mdb_get(txn, s->tokens, &k, &v) != 0 || v.mv_size != (size_t)p * 4u)
		return 0;
	return memcmp(v.mv_data, req->tokens, (size_t)p * 4u) == 0;
}

/* Searches the entries attached at node `node` (depth d) for the largest
 * P <= limit that matches. Returns P (0: none) and fills key and bytes. */
static uint32_t search_node(struct store *s, MDB_txn *txn, MDB_cursor *cur,
                            const struct store_lookup_req *req, const uint8_t *node, uint32_t d,
                            uint32_t limit, struct store_lookup_res *res)
{
	MDB_val k = {PREFIX_NODE_LEN, (void *)node}, v;
	if (mdb_cursor_get(cur, &k, &v, MDB_SET) != 0)
		return 0;
	if (mdb_cursor_get(cur, &k, &v, MDB_LAST_DUP) != 0)
		return 0;
	uint32_t base = d * PREFIX_BLOCK;
	uint32_t tail_p = 0;
	uint64_t tail = 0;
	do {
		if (v.mv_size != STORE_ATTACH_LEN)
			continue;
		const unsigned char *a = v.mv_data;
		uint32_t p = store_get_be32(a);
		if (p > limit || p < base || p - base >= PREFIX_BLOCK)
			continue;
		if (p != tail_p) {
			tail = store_tail_hash(req->tokens, base, p);
			tail_p = p;
		}
		if (store_get_be64(a + 4) != tail)
			continue;
		if (!entry_matches(s, txn, req, a + 12, p))
			continue;
		memcpy(res->key, a + 12, STORE_KEY_LEN);
		struct store_record r;
		if (store_read_record(s, txn, res->key, &r) == 0)
			res->bytes = r.bytes;
		return p;
	} while (mdb_cursor_get(cur, &k, &v, MDB_PREV_DUP) == 0);
	return 0;
}

enum status_code store_lookup(struct store *s, const struct store_lookup_req *req,
                              struct store_lookup_res *res, struct status *st)
{
	memset(res, 0, sizeof(*res));
	uint32_t n = req->n_tokens;
	uint32_t limit = req->limit ? req->limit : (n ? n - 1 : 0);
	if (limit > n)
		limit = n;
	uint32_t kn = n / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(kn + 1) * PREFIX_NODE_LEN);
	if (!h)
		return status_set(st, STATUS_INTERNAL, "out of memory");
	prefix_block_hashes(req->fingerprint, req->salt, req->salt_len, req->tokens, n, h);

	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		free(h);
		return store_mdb_error(st, rc, "lookup");
	}
	if ((rc = mdb_cursor_open(txn, s->attach, &cur)) != 0) {
		mdb_txn_abort(txn);
		free(h);
		return store_mdb_error(st, rc, "lookup");
	}
	/* deepest node on the prompt's path: every stored entry records all the
	 * nodes of its path, so presence is monotone along the prompt */
	uint32_t lo = 0, hi = kn;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (node_present(s, txn, h[mid]))
			lo = mid;
		else
			hi = mid - 1;
	}
	res->hint = lo * PREFIX_BLOCK;
	uint32_t top = lo < limit / PREFIX_BLOCK ? lo : limit / PREFIX_BLOCK;
	for (uint32_t d = top + 1; limit > 0 && d-- > 0;) {
		uint32_t p = search_node(s, txn, cur, req, h[d], d, limit, res);
		if (p) {
			res->prefix_len = p;
			break;
		}
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	free(h);
	if (res->prefix_len) {
		atomic_fetch_add(&s->hits, 1);
		atomic_fetch_add(&s->hit_tokens, res->prefix_len);
		store_touch(s, res->key, 1);
	} else {
		atomic_fetch_add(&s->misses, 1);
		memset(res->key, 0, sizeof(res->key));
		res->bytes = 0;
	}
	return STATUS_OK;
}

/* ---- restore -------------------------------------------------------------- */

struct store_snapshot_priv {
	struct store *s;
	MDB_txn *txn;
	struct store_segment *segs;
	struct store_segment *chunks; /* whole chunk values, for a deferred check */
	uint64_t n_chunks;
};

void store_snapshot_release(struct store_snapshot *snap)
{
	if (!snap)
		return;
	if (snap->priv) {
		mdb_txn_abort(snap->priv->txn);
		atomic_fetch_sub(&snap->priv->s->open_snapshots, 1);
		free(snap->priv->segs);
		free(snap->priv->chunks);
		free(snap->priv);
	}
	free(snap->layers);
	free(snap);
}

/* A damaged chunk found by a restore. A deferred restore (the daemon's loop
 * thread) takes no write transaction: its caller quarantines. */
static enum status_code corrupt(struct store *s, struct store_snapshot *snap, struct status *st,
                                const char *why, uint64_t chunk, int defer)
{
	uint8_t key[STORE_KEY_LEN];
	memcpy(key, snap->key, STORE_KEY_LEN);
	store_snapshot_release(snap);
	atomic_fetch_add(&s->corrupt, 1);
	if (defer)
		return status_set(st, STATUS_CORRUPT, "chunk %llu %s", (unsigned long long)chunk,
		                  why);
	store_quarantine(s, key);
	return status_set(st, STATUS_CORRUPT, "chunk %llu %s; the entry is quarantined",
	                  (unsigned long long)chunk, why);
}

enum status_code store_restore(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_snapshot **out, struct status *st)
{
	return store_restore_opt(s, key, STORE_RESTORE_USE, out, st);
}

enum status_code store_snapshot_verify(struct store_snapshot *snap, struct status *st)
{
	struct store_snapshot_priv *priv = snap->priv;
	for (uint64_t c = 0; c < priv->n_chunks; c++) {
		const void *data;
		size_t len;
		if (store_snapshot_chunk(snap, c, &data, &len, st) != STATUS_OK) {
			atomic_fetch_add(&priv->s->corrupt, 1);
			store_quarantine(priv->s, snap->key);
			return status_set(st, STATUS_CORRUPT,
			                  "chunk %llu fails its checksum; the entry is quarantined",
			                  (unsigned long long)c);
		}
	}
	return STATUS_OK;
}

uint64_t store_snapshot_chunks(const struct store_snapshot *snap)
{
	return snap->priv->n_chunks;
}

enum status_code store_snapshot_chunk(const struct store_snapshot *snap, uint64_t i,
                                      const void **data, size_t *len, struct status *st)
{
	const struct store_snapshot_priv *priv = snap->priv;
	if (i >= priv->n_chunks) {
		*data = NULL;
		*len = 0;
		return status_set(st, STATUS_NOT_FOUND, "chunk %llu of %llu", (unsigned long long)i,
		                  (unsigned long long)priv->n_chunks);
	}
	const unsigned char *v = priv->chunks[i].data;
	*data = v + 8;
	*len = priv->chunks[i].len - 8;
	uint64_t sum;
	memcpy(&sum, v, 8);
	if (XXH3_64bits_withSeed(v + 8, *len, i) != sum)
		return status_set(st, STATUS_CORRUPT, "chunk %llu fails its checksum",
		                  (unsigned long long)i);
	return STATUS_OK;
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
	rc = store_read_record(s, priv->txn, key, &r);
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
		return status_set(st, STATUS_NOT_FOUND,
		                  "the entry is quarantined (a checksum failed); evict it");
	}
	memcpy(snap->fingerprint, r.fingerprint, MODEL_FINGERPRINT_LEN);
	snap->prefix_len = r.prefix_len;
	snap->n_layers = r.n_layers;
	snap->bytes = r.bytes;
	uint64_t nchunks = (r.bytes + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA;
	snap->layers = calloc(r.n_layers, sizeof(*snap->layers));
	priv->segs = calloc((size_t)(nchunks + r.n_layers), sizeof(*priv->segs));
	if (defer) {
		priv->chunks = calloc((size_t)nchunks + 1, sizeof(*priv->chunks));
		priv->n_chunks = nchunks;
	}
	if (!snap->layers || !priv->segs || (defer && !priv->chunks)) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	for (uint32_t i = 0; i < r.n_layers; i++) {
		struct store_layer *l = &snap->layers[i];
		l->index = i;
		store_record_layer(&r, i, &l->tag, &l->size, &l->xxh3);
	}

	/* walk the chunks in order, verifying each, and cut them into layers */
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	uint32_t li = 0;
	uint64_t left_in_layer = snap->layers[0].size;
	size_t nseg = 0;
	snap->layers[0].segments = priv->segs;
	for (uint64_t c = 0; c < nchunks; c++) {
		uint64_t want = r.bytes - c * STORE_CHUNK_DATA;
		if (want > STORE_CHUNK_DATA)
			want = STORE_CHUNK_DATA;
		store_be32(ck + STORE_KEY_LEN, (uint32_t)c);
		MDB_val k = {sizeof(ck), ck}, v;
		rc = mdb_get(priv->txn, s->chunks, &k, &v);
		if (rc == MDB_NOTFOUND)
			return corrupt(s, snap, st, "is missing", c, defer);
		if (rc) {
			store_snapshot_release(snap);
			return store_mdb_error(st, rc, "restore");
		}
		if (v.mv_size != want + 8)
			return corrupt(s, snap, st, "has the wrong size", c, defer);
		const unsigned char *data = (const unsigned char *)v.mv_data + 8;
		if (defer) {
			priv->chunks[c].data = v.mv_data;
			priv->chunks[c].len = v.mv_size;
		} else {
			uint64_t sum;
			memcpy(&sum, v.mv_data, 8);
			if (XXH3_64bits_withSeed(data, (size_t)want, c) != sum)
				return corrupt(s, snap, st, "fails its checksum", c, defer);
		}
		while (want) {
			while (left_in_layer == 0 && li + 1 < r.n_layers) {
				li++;
				left_in_layer = snap->layers[li].size;
				snap->layers[li].segments = priv->segs + nseg;
			}
			size_t take = (size_t)(want < left_in_layer ? want : left_in_layer);
			struct store_layer *l = &snap->layers[li];
			priv->segs[nseg].data = data;
			priv->segs[nseg].len = take;
			nseg++;
			l->n_segments++;
			data += take;
			want -= take;
			left_in_layer -= take;
		}
	}
	if (use) {
		atomic_fetch_add(&s->restores, 1);
		store_touch(s, key, 0); /* the lookup that found it counted the hit */
	}
	*out = snap;
	return STATUS_OK;
}
