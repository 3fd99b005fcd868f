/* entry: an entry's rows as a whole (entry.c): its record, tokens, prefix
 * index rows, LRU row and chunks, added or removed together inside the
 * caller's write transaction, with the totals kept in step. */
#ifndef K3_STORE_ENTRY_H
#define K3_STORE_ENTRY_H

#include "record.h"

/* How an entry's bytes are stored: which blocks of its MLA layers it shares
 * (blocks.h; the map of its record) and its own stream, everything else in
 * layer order, which its chunks hold. */
struct store_entry_plan {
	uint32_t row_block; /* 0: it shares nothing */
	unsigned char *map;
	uint32_t map_len;
	struct store_segment *segs; /* the entry's own stream: pieces of its blobs */
	size_t n_segs;
	uint64_t stored;     /* the stream's bytes */
	uint64_t added;      /* bytes of the blocks this entry stored first */
	uint32_t mismatched; /* blocks stored with other bytes: its own copy kept */
};

/* Plans a validated publish. With share, uses (and counts references to)
 * the shared block of every full block of rows of each MLA layer, inside
 * txn, so the caller must then add the entry in the same transaction; the
 * store's row block B decides the blocks. Without share, the stream is the
 * blobs whole and txn may be NULL. */
int store_entry_plan(struct store *s, MDB_txn *txn, const struct store_publish_req *r, int share,
                     struct store_entry_plan *plan);
void store_entry_plan_free(struct store_entry_plan *plan);

/* Writes an entry's record (with the plan's map), tokens, prefix index and
 * LRU row (not its chunks) and adds its bytes to *totals: the plan's stream
 * and new blocks to the bytes stored, `bytes` (the blobs whole) to the
 * logical bytes. MDB_KEYEXIST when the record exists. */
int store_entry_add(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                    const uint8_t *key, uint64_t bytes, const uint8_t *tags, const uint64_t *sizes,
                    const uint64_t *sums, const struct store_entry_plan *plan,
                    struct store_totals *totals);

/* Deletes one entry and everything it owns (nodes, attach, lru, tokens,
 * chunks, record, and its references to shared blocks: a block it was last
 * to use goes too) and subtracts what that frees from *totals (when not
 * NULL). */
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

/* Calls fn for every reference an entry makes to a shared block: its key,
 * the block's node and layer, inside txn. Entries whose record does not
 * decode, or whose tokens are missing, are skipped (verify reports them). A
 * nonzero return of fn stops the walk and is returned; otherwise 0 or an
 * LMDB code. */
int store_entry_each_use(struct store *s, MDB_txn *txn,
                         int (*fn)(const uint8_t *key, const uint8_t *node, uint32_t layer,
                                   void *ctx),
                         void *ctx);

#endif
