/* blocks: MLA rows stored once (blocks.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"

static void ref_key(unsigned char out[STORE_BLOCK_REF_LEN], const uint8_t *node, uint32_t layer)
{
	memcpy(out, node, PREFIX_NODE_LEN);
	store_be32(out + PREFIX_NODE_LEN, layer);
}

static void block_key(unsigned char out[STORE_BLOCK_KEY_LEN], const uint8_t *node, uint32_t layer,
                      unsigned part)
{
	ref_key(out, node, layer);
	out[STORE_BLOCK_REF_LEN] = (unsigned char)part;
}

int store_blocks_get(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                     unsigned part, MDB_val *v)
{
	unsigned char bk[STORE_BLOCK_KEY_LEN];
	block_key(bk, node, layer, part);
	MDB_val k = {sizeof(bk), bk};
	return mdb_get(txn, s->blocks, &k, v);
}

int store_blocks_intact(const MDB_val *v, uint32_t layer)
{
	return store_value_intact(v, layer);
}

static int put_part(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                    unsigned part, const void *rows, size_t len)
{
	unsigned char bk[STORE_BLOCK_KEY_LEN];
	block_key(bk, node, layer, part);
	MDB_val k = {sizeof(bk), bk};
	return store_value_put(txn, s->blocks, &k, rows, len, layer, MDB_NOOVERWRITE);
}

/* Whether the stored part holds exactly these rows. */
static int same_part(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                     unsigned part, const void *rows, size_t len, int *same)
{
	MDB_val v;
	int rc = store_blocks_get(s, txn, node, layer, part, &v);
	if (rc == MDB_NOTFOUND) {
		*same = 0;
		return 0;
	}
	if (rc)
		return rc;
	*same = v.mv_size == len + 8 &&
	        memcmp((const unsigned char *)v.mv_data + 8, rows, len) == 0;
	return 0;
}

static int put_count(struct store *s, MDB_txn *txn, const unsigned char *rk, uint32_t count)
{
	unsigned char b[4];
	store_be32(b, count);
	MDB_val k = {STORE_BLOCK_REF_LEN, (void *)rk}, v = {4, b};
	return count ? mdb_put(txn, s->blockrefs, &k, &v, 0) : mdb_del(txn, s->blockrefs, &k, NULL);
}

/* The reference count of (node, layer), its key in rk: 0 with *count,
 * MDB_NOTFOUND, MDB_CORRUPTED when the stored count is damaged, or an LMDB
 * code. */
static int get_count(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                     unsigned char rk[STORE_BLOCK_REF_LEN], uint32_t *count)
{
	ref_key(rk, node, layer);
	MDB_val key = {STORE_BLOCK_REF_LEN, rk}, cv;
	int rc = mdb_get(txn, s->blockrefs, &key, &cv);
	if (!rc && cv.mv_size != 4)
		return MDB_CORRUPTED;
	if (!rc)
		*count = store_get_be32(cv.mv_data);
	return rc;
}

int store_blocks_addref(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                        int *shared)
{
	unsigned char rk[STORE_BLOCK_REF_LEN];
	uint32_t count;
	*shared = 0;
	int rc = get_count(s, txn, node, layer, rk, &count);
	if (rc == MDB_NOTFOUND || rc == MDB_CORRUPTED || (!rc && count == UINT32_MAX))
		return 0; /* absent, damaged or full */
	if (rc)
		return rc;
	*shared = 1;
	return put_count(s, txn, rk, count + 1);
}

int store_blocks_use_k(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       const void *k, size_t klen, int *shared, uint64_t *added)
{
	unsigned char rk[STORE_BLOCK_REF_LEN];
	uint32_t count;
	int rc = get_count(s, txn, node, layer, rk, &count);
	*shared = 0;
	if (rc == MDB_CORRUPTED)
		return 0; /* a damaged count: never write over rows others may use */
	if (rc == 0) {
		int same = 0;
		if ((rc = same_part(s, txn, node, layer, 0, k, klen, &same)) != 0)
			return rc;
		*shared = same && count < UINT32_MAX;
		return *shared ? put_count(s, txn, rk, count + 1) : 0;
	}
	if (rc != MDB_NOTFOUND)
		return rc;
	/* parts left without a count (damage): not ours to write over */
	for (unsigned part = 0; part < 2; part++) {
		MDB_val pv;
		rc = store_blocks_get(s, txn, node, layer, part, &pv);
		if (rc == 0)
			return 0;
		if (rc != MDB_NOTFOUND)
			return rc;
	}
	if ((rc = put_part(s, txn, node, layer, 0, k, klen)) != 0 ||
	    (rc = put_count(s, txn, rk, 1)) != 0)
		return rc;
	*shared = 1;
	*added += klen;
	return 0;
}

int store_blocks_use_v(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       const void *v, size_t vlen, int *same, uint64_t *added)
{
	MDB_val pv;
	int rc = store_blocks_get(s, txn, node, layer, 1, &pv);
	if (rc == MDB_NOTFOUND) {
		if ((rc = put_part(s, txn, node, layer, 1, v, vlen)) != 0)
			return rc;
		*same = 1;
		*added += vlen;
		return 0;
	}
	if (rc)
		return rc;
	*same = pv.mv_size == vlen + 8 &&
	        memcmp((const unsigned char *)pv.mv_data + 8, v, vlen) == 0;
	return 0;
}

int store_blocks_unuse(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       uint64_t *freed, struct store_dry *dry)
{
	unsigned char rk[STORE_BLOCK_REF_LEN];
	uint32_t count;
	int rc = get_count(s, txn, node, layer, rk, &count);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc == MDB_CORRUPTED) { /* a damaged count: the block goes with its user */
		count = 1;
		rc = 0;
	}
	if (rc)
		return rc;
	if (dry) { /* the references this dry run gave back before */
		uint32_t given = store_dry_count(dry, rk, sizeof(rk));
		if (given >= count)
			return 0; /* gone already: as a missing block */
		count -= given;
	}
	if (count > 1)
		return dry ? store_dry_add(dry, rk, sizeof(rk)) : put_count(s, txn, rk, count - 1);
	for (unsigned part = 0; part < 2; part++) {
		MDB_val v;
		rc = store_blocks_get(s, txn, node, layer, part, &v);
		if (rc == MDB_NOTFOUND)
			continue;
		if (rc)
			return rc;
		*freed += v.mv_size >= 8 ? v.mv_size - 8 : 0;
		if (dry)
			continue;
		unsigned char bk[STORE_BLOCK_KEY_LEN];
		block_key(bk, node, layer, part);
		MDB_val pk = {sizeof(bk), bk};
		if ((rc = mdb_del(txn, s->blocks, &pk, NULL)) != 0)
			return rc;
	}
	return dry ? store_dry_add(dry, rk, sizeof(rk)) : put_count(s, txn, rk, 0);
}

int store_blocks_hold(struct store *s, MDB_txn *txn, const uint8_t *key, const uint8_t *node,
                      uint32_t layer)
{
	unsigned char hk[STORE_BLOCK_HELD_LEN];
	memcpy(hk, key, STORE_KEY_LEN);
	ref_key(hk + STORE_KEY_LEN, node, layer);
	MDB_val k = {sizeof(hk), hk}, v = {0, NULL};
	/* one row per reference: a second one under the key is a second
	 * publish of it, which must not happen (MDB_KEYEXIST fails it) */
	return mdb_put(txn, s->held, &k, &v, MDB_NOOVERWRITE);
}

int store_blocks_unhold(struct store *s, MDB_txn *txn, const uint8_t *key, const uint8_t *node,
                        uint32_t layer)
{
	unsigned char hk[STORE_BLOCK_HELD_LEN];
	memcpy(hk, key, STORE_KEY_LEN);
	ref_key(hk + STORE_KEY_LEN, node, layer);
	MDB_val k = {sizeof(hk), hk};
	int rc = mdb_del(txn, s->held, &k, NULL);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* The held rows of key, copied out (deleting under a cursor is fragile). */
static int held_of(struct store *s, MDB_txn *txn, const uint8_t *key, unsigned char **out,
                   size_t *n_out)
{
	*out = NULL;
	*n_out = 0;
	if (!s->has_held)
		return 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->held, &cur);
	if (rc)
		return rc;
	unsigned char *v = NULL;
	size_t n = 0, cap = 0;
	MDB_val k = {STORE_KEY_LEN, (void *)key}, d;
	for (rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
		if (k.mv_size < STORE_KEY_LEN || memcmp(k.mv_data, key, STORE_KEY_LEN) != 0)
			break;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			unsigned char *nv = realloc(v, nc * STORE_BLOCK_HELD_LEN);
			if (!nv) {
				rc = ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		/* a row of another length is damage, not a reference: left alone */
		if (k.mv_size == STORE_BLOCK_HELD_LEN)
			memcpy(v + n++ * STORE_BLOCK_HELD_LEN, k.mv_data, STORE_BLOCK_HELD_LEN);
	}
	mdb_cursor_close(cur);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n_out = n;
	return 0;
}

static int release_or_drop(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed)
{
	unsigned char *rows;
	size_t n;
	int rc = held_of(s, txn, key, &rows, &n);
	for (size_t i = 0; i < n && !rc; i++) {
		unsigned char *row = rows + i * STORE_BLOCK_HELD_LEN;
		if (freed)
			rc = store_blocks_unuse(
			        s, txn, row + STORE_KEY_LEN,
			        store_get_be32(row + STORE_KEY_LEN + PREFIX_NODE_LEN), freed, NULL);
		MDB_val k = {STORE_BLOCK_HELD_LEN, row};
		if (!rc && (rc = mdb_del(txn, s->held, &k, NULL)) == MDB_NOTFOUND)
			rc = 0;
	}
	free(rows);
	return rc;
}

int store_blocks_release(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed)
{
	return release_or_drop(s, txn, key, freed);
}

int store_blocks_drop_held(struct store *s, MDB_txn *txn, const uint8_t *key)
{
	return release_or_drop(s, txn, key, NULL);
}

int store_blocks_each_held(struct store *s, MDB_txn *txn,
                           int (*fn)(const uint8_t *key, const uint8_t *node, uint32_t layer,
                                     void *ctx),
                           void *ctx)
{
	if (!s->has_held)
		return 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->held, &cur);
	if (rc)
		return rc;
	MDB_val k, d;
	for (rc = mdb_cursor_get(cur, &k, &d, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
		if (k.mv_size != STORE_BLOCK_HELD_LEN)
			continue;
		const unsigned char *row = k.mv_data;
		if ((rc = fn(row, row + STORE_KEY_LEN,
		             store_get_be32(row + STORE_KEY_LEN + PREFIX_NODE_LEN), ctx)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* How many of refs[0..n) (sorted) are rk. */
static uint32_t uses_of(const unsigned char *refs, size_t n, const unsigned char *rk)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (memcmp(refs + mid * STORE_BLOCK_REF_LEN, rk, STORE_BLOCK_REF_LEN) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	uint32_t used = 0;
	for (; lo < n && !memcmp(refs + lo * STORE_BLOCK_REF_LEN, rk, STORE_BLOCK_REF_LEN); lo++)
		if (used < UINT32_MAX)
			used++;
	return used;
}

int store_blocks_recount(struct store *s, MDB_txn *txn, const unsigned char *refs, size_t n,
                         uint64_t *fixed, uint64_t *freed)
{
	if (!s->has_blocks)
		return 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->blockrefs, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		unsigned char rk[STORE_BLOCK_REF_LEN];
		if (k.mv_size != STORE_BLOCK_REF_LEN) { /* not a count of ours */
			(*fixed)++;
			if ((rc = mdb_cursor_del(cur, 0)) != 0)
				break;
			continue;
		}
		memcpy(rk, k.mv_data, STORE_BLOCK_REF_LEN);
		uint32_t used = uses_of(refs, n, rk);
		if (v.mv_size == 4 && store_get_be32(v.mv_data) == used)
			continue;
		(*fixed)++;
		if (used) {
			/* the key from rk: a put that resizes a damaged value moves
			 * the page's nodes, k's bytes among them */
			unsigned char b[4];
			store_be32(b, used);
			MDB_val ck = {STORE_BLOCK_REF_LEN, rk}, nv = {4, b};
			if ((rc = mdb_cursor_put(cur, &ck, &nv, MDB_CURRENT)) != 0)
				break;
			continue;
		}
		for (unsigned part = 0; part < 2 && !rc; part++) {
			unsigned char bk[STORE_BLOCK_KEY_LEN];
			memcpy(bk, rk, STORE_BLOCK_REF_LEN);
			bk[STORE_BLOCK_REF_LEN] = (unsigned char)part;
			MDB_val pk = {sizeof(bk), bk}, pv;
			if ((rc = mdb_get(txn, s->blocks, &pk, &pv)) == MDB_NOTFOUND) {
				rc = 0;
				continue;
			}
			if (!rc) {
				*freed += pv.mv_size >= 8 ? pv.mv_size - 8 : 0;
				rc = mdb_del(txn, s->blocks, &pk, NULL);
			}
		}
		if (rc || (rc = mdb_cursor_del(cur, 0)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND)
		return rc;
	/* parts of no counted block */
	if ((rc = mdb_cursor_open(txn, s->blocks, &cur)) != 0)
		return rc;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size == STORE_BLOCK_KEY_LEN) {
			MDB_val rk = {STORE_BLOCK_REF_LEN, k.mv_data}, cv;
			if ((rc = mdb_get(txn, s->blockrefs, &rk, &cv)) == 0)
				continue; /* counted above */
			if (rc != MDB_NOTFOUND)
				break;
			uint32_t used = uses_of(refs, n, k.mv_data);
			(*fixed)++;
			if (used) {
				unsigned char b[4];
				store_be32(b, used);
				MDB_val nv = {4, b};
				if ((rc = mdb_put(txn, s->blockrefs, &rk, &nv, 0)) != 0)
					break;
				continue;
			}
		} else {
			(*fixed)++; /* not a part of ours */
		}
		*freed += v.mv_size >= 8 ? v.mv_size - 8 : 0;
		if ((rc = mdb_cursor_del(cur, 0)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}
