/* index: the prefix index and the LRU index (index.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "prefix.h"
#include "xxh_dispatch.h"

uint64_t store_index_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to)
{
	return XXH3_64bits(tokens + from, (size_t)(to - from) * 4u);
}

static int bump_node(struct store *s, MDB_txn *txn, const uint8_t *node)
{
	MDB_val k = {PREFIX_NODE_LEN, (void *)node}, v;
	uint32_t count = 0;
	int rc = mdb_get(txn, s->nodes, &k, &v);
	if (rc == 0 && v.mv_size == 4)
		count = store_get_be32(v.mv_data);
	else if (rc && rc != MDB_NOTFOUND)
		return rc;
	unsigned char b[4];
	store_be32(b, count + 1);
	MDB_val nv = {4, b};
	return mdb_put(txn, s->nodes, &k, &nv, 0);
}

int store_index_add(struct store *s, MDB_txn *txn, const uint8_t *fingerprint, const void *salt,
                    size_t salt_len, const uint32_t *tokens, uint32_t n, const uint8_t *key)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	MDB_val tv = {(size_t)n * 4u, (void *)tokens};
	int rc = mdb_put(txn, s->tokens, &k, &tv, 0);
	if (rc)
		return rc;
	uint32_t depth = n / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	if (!h)
		return ENOMEM;
	prefix_block_hashes(fingerprint, salt, salt_len, tokens, n, h);
	for (uint32_t d = 1; d <= depth && !rc; d++)
		rc = bump_node(s, txn, h[d]);
	if (!rc) {
		unsigned char av[STORE_ATTACH_LEN];
		store_be32(av, n);
		store_be64(av + 4, store_index_tail_hash(tokens, depth * PREFIX_BLOCK, n));
		memcpy(av + 12, key, STORE_KEY_LEN);
		MDB_val ak = {PREFIX_NODE_LEN, h[depth]}, avv = {sizeof(av), av};
		rc = mdb_put(txn, s->attach, &ak, &avv, 0);
	}
	free(h);
	return rc;
}

/* Counts one entry fewer through node (deletes it at zero). */
static int drop_node(struct store *s, MDB_txn *txn, const uint8_t *node)
{
	MDB_val nk = {PREFIX_NODE_LEN, (void *)node}, nv;
	int rc = mdb_get(txn, s->nodes, &nk, &nv);
	if (rc == MDB_NOTFOUND || (rc == 0 && nv.mv_size != 4))
		return 0;
	if (rc)
		return rc;
	uint32_t count = store_get_be32(nv.mv_data);
	if (count <= 1)
		return mdb_del(txn, s->nodes, &nk, NULL);
	unsigned char b[4];
	store_be32(b, count - 1);
	MDB_val cv = {4, b};
	return mdb_put(txn, s->nodes, &nk, &cv, 0);
}

int store_index_remove(struct store *s, MDB_txn *txn, const struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)r->key}, v;
	/* the path, from the stored tokens */
	int rc = mdb_get(txn, s->tokens, &k, &v);
	if (rc == 0 && v.mv_size == (size_t)r->prefix_len * 4u) {
		uint32_t *toks = malloc(v.mv_size);
		uint32_t depth = r->prefix_len / PREFIX_BLOCK;
		uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
		if (!toks || !h) {
			free(toks);
			free(h);
			return ENOMEM;
		}
		memcpy(toks, v.mv_data, v.mv_size);
		prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, toks, r->prefix_len, h);
		for (uint32_t d = 1; d <= depth && !rc; d++)
			rc = drop_node(s, txn, h[d]);
		if (!rc) {
			unsigned char av[STORE_ATTACH_LEN];
			store_be32(av, r->prefix_len);
			store_be64(av + 4, store_index_tail_hash(toks, depth * PREFIX_BLOCK,
			                                         r->prefix_len));
			memcpy(av + 12, r->key, STORE_KEY_LEN);
			MDB_val ak = {PREFIX_NODE_LEN, h[depth]}, avv = {sizeof(av), av};
			if ((rc = mdb_del(txn, s->attach, &ak, &avv)) == MDB_NOTFOUND)
				rc = 0;
		}
		free(toks);
		free(h);
		if (rc)
			return rc;
	} else if (rc && rc != MDB_NOTFOUND) {
		return rc;
	}
	if ((rc = mdb_del(txn, s->tokens, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	return rc;
}

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
	if (store_record_read(s, txn, key, &r) != 0)
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
			tail = store_index_tail_hash(req->tokens, base, p);
			tail_p = p;
		}
		if (store_get_be64(a + 4) != tail)
			continue;
		if (!entry_matches(s, txn, req, a + 12, p))
			continue;
		memcpy(res->key, a + 12, STORE_KEY_LEN);
		struct store_record r;
		if (store_record_read(s, txn, res->key, &r) == 0)
			res->bytes = r.bytes;
		return p;
	} while (mdb_cursor_get(cur, &k, &v, MDB_PREV_DUP) == 0);
	return 0;
}

uint32_t store_index_find(struct store *s, MDB_txn *txn, const struct store_lookup_req *req,
                          uint8_t (*h)[PREFIX_NODE_LEN], struct store_lookup_res *res)
{
	uint32_t n = req->n_tokens;
	uint32_t limit = req->limit ? req->limit : (n ? n - 1 : 0);
	if (limit > n)
		limit = n;
	uint32_t kn = n / PREFIX_BLOCK;
	MDB_cursor *cur;
	if (mdb_cursor_open(txn, s->attach, &cur) != 0)
		return 0;
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
	uint32_t p = 0;
	for (uint32_t d = top + 1; limit > 0 && d-- > 0 && !p;)
		p = search_node(s, txn, cur, req, h[d], d, limit, res);
	mdb_cursor_close(cur);
	return p;
}

static void lru_key(unsigned char out[8 + STORE_KEY_LEN], uint64_t seq,
                    const uint8_t key[STORE_KEY_LEN])
{
	store_be64(out, seq);
	memcpy(out + 8, key, STORE_KEY_LEN);
}

int store_index_lru_add(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key)
{
	unsigned char lk[8 + STORE_KEY_LEN];
	lru_key(lk, seq, key);
	MDB_val k = {sizeof(lk), lk}, empty = {0, NULL};
	return mdb_put(txn, s->lru, &k, &empty, 0);
}

int store_index_lru_del(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key)
{
	unsigned char lk[8 + STORE_KEY_LEN];
	lru_key(lk, seq, key);
	MDB_val k = {sizeof(lk), lk};
	int rc = mdb_del(txn, s->lru, &k, NULL);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_index_lru_move(struct store *s, MDB_txn *txn, const struct store_record *old,
                         uint64_t seq)
{
	int rc = store_index_lru_del(s, txn, old->lru_seq, old->key);
	return rc ? rc : store_index_lru_add(s, txn, seq, old->key);
}

int store_index_tokens(struct store *s, MDB_txn *txn, const uint8_t *key, MDB_val *v)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	return mdb_get(txn, s->tokens, &k, v);
}
