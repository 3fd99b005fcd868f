/* chunks: an entry's bytes in equal chunks (chunks.h). */
#include <string.h>

#include "chunks.h"
#include "xxh_dispatch.h"

void store_chunks_copy_stream(const struct store_stream *st, uint64_t off, unsigned char *dst,
                              size_t len)
{
	size_t i = 0;
	while (i < st->n && off >= st->segs[i].len) {
		off -= st->segs[i].len;
		i++;
	}
	while (len && i < st->n) {
		size_t take = (size_t)(st->segs[i].len - off);
		if (take > len)
			take = len;
		memcpy(dst, st->segs[i].data + off, take);
		dst += take;
		len -= take;
		off = 0;
		i++;
	}
}

uint32_t store_chunks_count(uint64_t total)
{
	return (uint32_t)((total + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA);
}

int store_chunks_write(struct store *s, MDB_txn *txn, const uint8_t *key,
                       const struct store_stream *st, uint32_t from, uint32_t to,
                       const uint64_t *sums)
{
	uint64_t total = st->total;
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	for (uint32_t c = from; c < to; c++) {
		uint64_t off = (uint64_t)c * STORE_CHUNK_DATA;
		if (off >= total)
			break;
		size_t len =
		        (size_t)(total - off < STORE_CHUNK_DATA ? total - off : STORE_CHUNK_DATA);
		store_be32(ck + STORE_KEY_LEN, c);
		MDB_val k = {sizeof(ck), ck}, v = {len + 8, NULL};
		int rc = mdb_put(txn, s->chunks, &k, &v, MDB_RESERVE);
		if (rc)
			return rc;
		unsigned char *dst = v.mv_data;
		store_chunks_copy_stream(st, off, dst + 8, len);
		uint64_t sum = sums ? sums[c] : XXH3_64bits_withSeed(dst + 8, len, c);
		memcpy(dst, &sum, 8);
	}
	return 0;
}

int store_chunks_put(struct store *s, MDB_txn *txn, const uint8_t *key, uint32_t c,
                     const void *data, size_t len, const uint64_t *sum)
{
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	store_be32(ck + STORE_KEY_LEN, c);
	MDB_val k = {sizeof(ck), ck};
	if (!sum)
		return store_value_put(txn, s->chunks, &k, data, len, c, 0);
	MDB_val v = {len + 8, NULL};
	int rc = mdb_put(txn, s->chunks, &k, &v, MDB_RESERVE);
	if (rc)
		return rc;
	memcpy(v.mv_data, sum, 8);
	memcpy((unsigned char *)v.mv_data + 8, data, len);
	return 0;
}

int store_chunks_get(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t c, MDB_val *v)
{
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	store_be32(ck + STORE_KEY_LEN, (uint32_t)c);
	MDB_val k = {sizeof(ck), ck};
	return mdb_get(txn, s->chunks, &k, v);
}

int store_chunks_intact(const MDB_val *v, uint64_t c)
{
	return store_value_intact(v, c);
}

/* Deletes every chunk stored under key. */
int store_chunks_delete(struct store *s, MDB_txn *txn, const uint8_t *key)
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

int store_chunks_bytes(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes)
{
	*bytes = 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->chunks, &cur);
	if (rc)
		return rc;
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, key, STORE_KEY_LEN);
	MDB_val k = {sizeof(ck), ck}, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	     rc == 0 && k.mv_size >= STORE_KEY_LEN && !memcmp(k.mv_data, key, STORE_KEY_LEN);
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
		*bytes += v.mv_size > 8 ? v.mv_size - 8 : 0;
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}
