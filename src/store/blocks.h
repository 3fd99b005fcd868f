/* blocks: MLA rows stored once, shared by every entry whose prefix holds
 * them (blocks.c).
 *
 * An MLA layer's rows are cut into blocks of B rows (the store's row_block,
 * a multiple of PREFIX_BLOCK). Block b of layer i covers rows [bB, (b+1)B);
 * since row r depends on tokens [0, r], the block is named by the prefix
 * index's chained node hash of tokens [0, (b+1)B) under the model and salt
 * (so a salt still isolates tenants), plus the layer:
 *
 *   blocks     node[16] | u32 layer (BE) | u8 part (0 k, 1 v)
 *                -> u64 XXH3(rows, seed: layer) | the part's rows
 *   blockrefs  node[16] | u32 layer (BE) -> u32 references to the block
 *   held       key[32] | node[16] | u32 layer (BE) -> (empty)
 *
 * A reference is an entry's record naming the block in its map, or a held
 * row: a staged publish in progress (pending.h) places its blocks stage by
 * stage, before its record exists, and holds each shared one by a row under
 * its key. The last stage moves them to its record (the rows go, the counts
 * stay); a failed or abandoned publish gives them back.
 *
 * A block is shared only when its bytes equal the stored ones, compared
 * byte for byte; otherwise the publishing entry keeps a private copy. Each
 * part keeps its own checksum, checked when it is sent. Reference counts
 * change in the same write transaction as the records that use them. */
#ifndef K3_STORE_BLOCKS_H
#define K3_STORE_BLOCKS_H

#include "dry.h"
#include "env.h"
#include "prefix.h"

#define STORE_BLOCK_KEY_LEN  (PREFIX_NODE_LEN + 4 + 1)
#define STORE_BLOCK_REF_LEN  (PREFIX_NODE_LEN + 4)
#define STORE_BLOCK_HELD_LEN (STORE_KEY_LEN + STORE_BLOCK_REF_LEN)

/* A block is used in two steps, one per part, as a publish's bytes arrive
 * (an MLA layer's k rows come before its v rows):
 *
 * store_blocks_use_k: when the block is stored with these k rows, counts
 * one more reference and sets *shared; when it is stored with other k rows
 * (or its count is damaged), sets *shared to 0 (the caller keeps its own
 * copy); when it is not stored, stores its k part with a count of 1 (adding
 * klen to *added) and sets *shared. A block may then lack its v part, but
 * only while references held by publishes in progress keep it.
 *
 * store_blocks_use_v, for a block the caller holds a reference to: stores
 * the v part when it is missing (adding vlen to *added) and sets *same; else
 * sets *same when the stored v rows are these. When they are not, the
 * caller gives its reference back and keeps its own copy. */
int store_blocks_use_k(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       const void *k, size_t klen, int *shared, uint64_t *added);
int store_blocks_use_v(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       const void *v, size_t vlen, int *same, uint64_t *added);

/* Counts one more reference to the stored block (node, layer): *shared 1,
 * or 0 when it is not stored (or its count is damaged or full). */
int store_blocks_addref(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                        int *shared);

/* Counts one reference fewer; at none, deletes the block and adds its bytes
 * to *freed. A block that is missing counts nothing. With dry (not NULL)
 * nothing is written: the reference given back is counted in dry, and the
 * block's bytes are added to *freed when no reference is left once those
 * the dry run gave back before are taken off. */
int store_blocks_unuse(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                       uint64_t *freed, struct store_dry *dry);

/* Records that the staged publish of key holds a reference to (node, layer). */
int store_blocks_hold(struct store *s, MDB_txn *txn, const uint8_t *key, const uint8_t *node,
                      uint32_t layer);

/* Removes the held row of key for (node, layer), keeping the count. */
int store_blocks_unhold(struct store *s, MDB_txn *txn, const uint8_t *key, const uint8_t *node,
                        uint32_t layer);

/* Gives back every reference the publish of key holds (store_blocks_unuse,
 * adding what that frees to *freed) and removes its held rows. */
int store_blocks_release(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed);

/* Removes the held rows of key, keeping the counts: its record now makes
 * those references. */
int store_blocks_drop_held(struct store *s, MDB_txn *txn, const uint8_t *key);

/* Calls fn for every held reference (the key that holds it, the block's
 * node and layer). A nonzero return of fn stops the walk and is returned. */
int store_blocks_each_held(struct store *s, MDB_txn *txn,
                           int (*fn)(const uint8_t *key, const uint8_t *node, uint32_t layer,
                                     void *ctx),
                           void *ctx);

/* Makes every count again from the uses: refs holds n sorted
 * STORE_BLOCK_REF_LEN keys (node | layer), one per reference made (records
 * and held rows). A block no one uses is deleted, a count that differs (or
 * is damaged) is set to its uses, a part of no counted block is deleted, or
 * given its count when the block is used. *fixed: the blocks changed, *freed
 * the bytes deleted. For verify's repair, once every entry's uses are known
 * (a record that does not decode names blocks no one can count). */
int store_blocks_recount(struct store *s, MDB_txn *txn, const unsigned char *refs, size_t n,
                         uint64_t *fixed, uint64_t *freed);

/* A part of a block as stored (u64 sum, then the rows). */
int store_blocks_get(struct store *s, MDB_txn *txn, const uint8_t *node, uint32_t layer,
                     unsigned part, MDB_val *v);

/* Whether a part read with store_blocks_get holds its sum. */
int store_blocks_intact(const MDB_val *v, uint32_t layer);

#endif
