/* entry: an entry's rows as a whole (entry.c): its record, tokens, prefix
 * index rows, LRU row and chunks, added or removed together inside the
 * caller's write transaction, with the totals kept in step. */
#ifndef K3_STORE_ENTRY_H
#define K3_STORE_ENTRY_H

#include "record.h"

/* Writes an entry's record, tokens, prefix index and LRU row (not its chunks)
 * and adds its bytes to *totals. MDB_KEYEXIST when the record exists. */
int store_entry_add(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                    const uint8_t *key, uint64_t bytes, const uint8_t *tags, const uint64_t *sizes,
                    const uint64_t *sums, struct store_totals *totals);

/* Deletes one entry and everything it owns (nodes, attach, lru, tokens,
 * chunks, record) and subtracts its bytes from *totals (when not NULL). */
int store_entry_delete(struct store *s, MDB_txn *txn, const struct store_record *r,
                       struct store_totals *totals);

/* Deletes an entry whose record cannot be decoded (so neither its size nor
 * its prefix-index rows can be known): the record, its tokens and its chunks.
 * Then sets totals->bytes again from the records that decode (for one that
 * does not, the bytes of its chunks), so no byte of the damaged entry stays
 * counted. Its node counts, attach row and LRU row stay: they only locate
 * candidates, each confirmed against a record, and eviction drops a stale
 * LRU row when it meets one. */
int store_entry_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                               struct store_totals *totals);

#endif
