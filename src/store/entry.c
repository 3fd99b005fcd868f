/* entry: an entry's rows as a whole (entry.h). */
#include <string.h>

#include "chunks.h"
#include "entry.h"
#include "index.h"

int store_entry_add(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                    const uint8_t *key, uint64_t bytes, const uint8_t *tags, const uint64_t *sizes,
                    const uint64_t *sums, struct store_totals *totals)
{
	uint64_t now = store_now(s);
	uint64_t seq = atomic_fetch_add(&s->lru_clock, 1) + 1;
	struct store_record rec = {
	        .prefix_len = r->n_tokens,
	        .n_layers = r->n_blobs,
	        .created = now,
	        .last_used = now,
	        .lru_seq = seq,
	        .bytes = bytes,
	        .salt_len = (uint32_t)r->salt_len,
	        .salt = r->salt,
	};
	memcpy(rec.key, key, STORE_KEY_LEN);
	memcpy(rec.fingerprint, r->fingerprint, MODEL_FINGERPRINT_LEN);
	int rc = store_record_put(s, txn, &rec, tags, sizes, sums);
	if (!rc)
		rc = store_index_add(s, txn, r->fingerprint, r->salt, r->salt_len, r->tokens,
		                     r->n_tokens, key);
	if (!rc)
		rc = store_index_lru_add(s, txn, seq, key);
	if (!rc)
		totals->bytes += bytes;
	return rc;
}

int store_entry_delete(struct store *s, MDB_txn *txn, const struct store_record *rec,
                       struct store_totals *totals)
{
	/* rec's salt points into a page of this transaction: copy it before any
	 * update can move that page */
	struct store_record copy = *rec;
	uint8_t salt[STORE_MAX_SALT];
	if (copy.salt_len > sizeof(salt))
		return MDB_CORRUPTED;
	if (copy.salt_len)
		memcpy(salt, copy.salt, copy.salt_len);
	copy.salt = salt;
	copy.layers = NULL;
	const struct store_record *r = &copy;
	uint64_t bytes = r->bytes;
	MDB_val k = {STORE_KEY_LEN, (void *)r->key};
	int rc = store_index_lru_del(s, txn, r->lru_seq, r->key);
	if (!rc)
		rc = store_index_remove(s, txn, r);
	if (!rc)
		rc = store_chunks_delete(s, txn, r->key, NULL);
	if (!rc && (rc = mdb_del(txn, s->entries, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && totals)
		totals->bytes = totals->bytes >= bytes ? totals->bytes - bytes : 0;
	return rc;
}

/* The bytes of every entry: its record's count, or for a record that does
 * not decode, the bytes of the chunks stored under its key. */
static int recount_bytes(struct store *s, MDB_txn *txn, uint64_t *bytes)
{
	*bytes = 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		uint64_t b = 0;
		if (store_record_decode(v.mv_data, v.mv_size, &r) == 0)
			b = r.bytes;
		else if (k.mv_size == STORE_KEY_LEN &&
		         (rc = store_chunks_bytes(s, txn, k.mv_data, &b)) != 0)
			break;
		*bytes += b;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_entry_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                               struct store_totals *totals)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	int rc = store_chunks_delete(s, txn, key, NULL);
	if (!rc && (rc = mdb_del(txn, s->tokens, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && (rc = mdb_del(txn, s->entries, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && totals)
		rc = recount_bytes(s, txn, &totals->bytes);
	return rc;
}