/* record: the entry record (record.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

#define REC_VERSION 2u /* 1: no tail (read as: every row in the stream) */
#define OFF_FLAGS   (4 + 32 + 32 + 4 + 4)
#define REC_FIXED   (OFF_FLAGS + 4 + 8 * 5 + 4)
_Static_assert(REC_FIXED == STORE_RECORD_MIN, "the smallest record is a version-1 one");

static void le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

#define REC_TAIL 16u /* u64 stored | u32 row_block | u32 map_len */

size_t store_record_size(uint32_t salt_len, uint32_t n_layers, uint32_t map_len)
{
	return REC_FIXED + (size_t)salt_len + (size_t)n_layers * STORE_RECORD_LAYER_LEN + REC_TAIL +
	       map_len;
}

uint32_t store_record_map_bytes(uint32_t prefix_len, uint32_t row_block)
{
	return row_block ? (prefix_len / row_block + 7) / 8 : 0;
}

uint64_t store_record_block_bytes(const struct store_record *r, uint64_t size)
{
	/* size = 13 header bytes + P rows of (k + v) floats */
	return size >= 13 ? (size - 13) / r->prefix_len * r->row_block : 0;
}

int store_record_shared(const struct store_record *r, uint32_t mla, uint32_t b)
{
	if (!r->map || !r->row_block)
		return 0;
	const unsigned char *m =
	        r->map + (size_t)mla * store_record_map_bytes(r->prefix_len, r->row_block);
	return (m[b / 8] >> (b % 8)) & 1;
}

void store_record_patch(unsigned char *enc, const struct store_record *r)
{
	unsigned char *p = enc + OFF_FLAGS;
	le32(p, r->flags);
	le64(p + 4, r->created);
	le64(p + 12, r->last_used);
	le64(p + 20, r->lru_seq);
	le64(p + 28, r->hits);
	le64(p + 36, r->bytes);
}

void store_record_encode(const struct store_record *r, const uint8_t *tags, const uint64_t *sizes,
                         const uint64_t *sums, unsigned char *out)
{
	unsigned char *p = out;
	le32(p, REC_VERSION);
	memcpy(p + 4, r->key, 32);
	memcpy(p + 36, r->fingerprint, 32);
	le32(p + 68, r->prefix_len);
	le32(p + 72, r->n_layers);
	store_record_patch(out, r);
	p = out + REC_FIXED - 4;
	le32(p, r->salt_len);
	p += 4;
	if (r->salt_len)
		memcpy(p, r->salt, r->salt_len);
	p += r->salt_len;
	for (uint32_t i = 0; i < r->n_layers; i++) {
		p[0] = tags[i];
		le64(p + 1, sizes[i]);
		le64(p + 9, sums[i]);
		p += STORE_RECORD_LAYER_LEN;
	}
	le64(p, r->stored);
	le32(p + 8, r->row_block);
	le32(p + 12, r->map_len);
	if (r->map_len)
		memcpy(p + 16, r->map, r->map_len);
}

int store_record_decode(const void *data, size_t len, struct store_record *r)
{
	const unsigned char *p = data;
	uint32_t version = len >= 4 ? get32(p) : 0;
	if (len < REC_FIXED || (version != 1 && version != REC_VERSION))
		return -1;
	memcpy(r->key, p + 4, 32);
	memcpy(r->fingerprint, p + 36, 32);
	r->prefix_len = get32(p + 68);
	r->n_layers = get32(p + 72);
	r->flags = get32(p + OFF_FLAGS);
	r->created = get64(p + OFF_FLAGS + 4);
	r->last_used = get64(p + OFF_FLAGS + 12);
	r->lru_seq = get64(p + OFF_FLAGS + 20);
	r->hits = get64(p + OFF_FLAGS + 28);
	r->bytes = get64(p + OFF_FLAGS + 36);
	r->salt_len = get32(p + REC_FIXED - 4);
	if (r->n_layers == 0 || r->n_layers > MODEL_MAX_LAYERS || r->prefix_len == 0 ||
	    r->salt_len > STORE_MAX_SALT)
		return -1;
	/* 64-bit sums: no count read from disk can wrap the check */
	uint64_t head =
	        (uint64_t)REC_FIXED + r->salt_len + (uint64_t)r->n_layers * STORE_RECORD_LAYER_LEN;
	if (version == 1 ? head != len : head + REC_TAIL > len)
		return -1;
	r->salt = p + REC_FIXED;
	r->layers = p + REC_FIXED + r->salt_len;
	uint64_t total = 0;
	uint32_t n_mla = 0;
	for (uint32_t i = 0; i < r->n_layers; i++) {
		const unsigned char *l = r->layers + (size_t)i * STORE_RECORD_LAYER_LEN;
		if (l[0] != 1 && l[0] != 2)
			return -1;
		n_mla += l[0] == 2;
		uint64_t sz = get64(l + 1);
		if (sz > (UINT64_C(1) << 40))
			return -1;
		total += sz;
	}
	if (total != r->bytes)
		return -1;
	if (version == 1) { /* every row in the entry's own stream */
		r->stored = r->bytes;
		r->row_block = 0;
		r->map_len = 0;
		r->map = NULL;
		r->own_blocks = 0;
		return 0;
	}
	const unsigned char *t = p + head;
	r->stored = get64(t);
	r->row_block = get32(t + 8);
	r->map_len = get32(t + 12);
	r->map = r->map_len ? t + REC_TAIL : NULL;
	if (r->stored > r->bytes || head + REC_TAIL + r->map_len != len)
		return -1;
	if (r->row_block && (r->row_block % PREFIX_BLOCK || r->row_block > STORE_MAX_ROW_BLOCK))
		return -1;
	if ((uint64_t)r->map_len !=
	    (uint64_t)n_mla * store_record_map_bytes(r->prefix_len, r->row_block))
		return -1;
	/* the private blocks: each MLA layer whole rows, every clear bit */
	r->own_blocks = 0;
	for (uint32_t i = 0, mla = 0; r->map_len && i < r->n_layers; i++) {
		const unsigned char *l = r->layers + (size_t)i * STORE_RECORD_LAYER_LEN;
		if (l[0] != 2)
			continue;
		uint64_t sz = get64(l + 1);
		if (sz < 13 || (sz - 13) % r->prefix_len)
			return -1;
		uint64_t per = store_record_block_bytes(r, sz);
		for (uint32_t b = 0; b < r->prefix_len / r->row_block; b++)
			r->own_blocks += store_record_shared(r, mla, b) ? 0 : per;
		mla++;
	}
	if (r->own_blocks > r->stored)
		return -1;
	return 0;
}

void store_record_layer(const struct store_record *r, uint32_t i, uint8_t *tag, uint64_t *size,
                        uint64_t *sum)
{
	const unsigned char *l = r->layers + (size_t)i * STORE_RECORD_LAYER_LEN;
	*tag = l[0];
	*size = get64(l + 1);
	*sum = get64(l + 9);
}

int store_record_read(struct store *s, MDB_txn *txn, const uint8_t key[STORE_KEY_LEN],
                      struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	int rc = mdb_get(txn, s->entries, &k, &v);
	if (rc)
		return rc;
	if (store_record_decode(v.mv_data, v.mv_size, r) != 0 ||
	    memcmp(r->key, key, STORE_KEY_LEN) != 0)
		return -1;
	return 0;
}

int store_record_put(struct store *s, MDB_txn *txn, const struct store_record *r,
                     const uint8_t *tags, const uint64_t *sizes, const uint64_t *sums)
{
	MDB_val k = {STORE_KEY_LEN, (void *)r->key};
	MDB_val v = {store_record_size(r->salt_len, r->n_layers, r->map_len), NULL};
	int rc = mdb_put(txn, s->entries, &k, &v, MDB_NOOVERWRITE | MDB_RESERVE);
	if (!rc)
		store_record_encode(r, tags, sizes, sums, v.mv_data);
	return rc;
}

int store_record_rewrite(struct store *s, MDB_txn *txn, const struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)r->key}, v;
	int rc = mdb_get(txn, s->entries, &k, &v);
	if (rc)
		return rc;
	size_t len = v.mv_size;
	unsigned char *copy = malloc(len);
	if (!copy)
		return ENOMEM;
	memcpy(copy, v.mv_data, len);
	store_record_patch(copy, r);
	MDB_val nv = {len, copy};
	rc = mdb_put(txn, s->entries, &k, &nv, 0);
	free(copy);
	return rc;
}
