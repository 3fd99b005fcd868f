/* entry: an entry's rows as a whole (entry.c): its record, tokens, prefix
 * index rows, LRU row and chunks, added or removed together inside the
 * caller's write transaction, with the totals kept in step. */
#ifndef K3_STORE_ENTRY_H
#define K3_STORE_ENTRY_H

#include "dry.h"
#include "prefix.h"
#include "record.h"

/* A copy into a block whose rows span a delta's pieces (the base's in the
 * map, the request's), made when the block is placed: the request's bytes
 * may arrive only then. */
struct store_plan_fill {
	unsigned char *dst;
	const unsigned char *src;
	size_t len;
	int done;
};

/* A full block of an MLA layer's rows, to be placed: shared (blocks.h) or
 * kept by the entry as a private block (record.h). */
struct store_plan_block {
	uint32_t layer, block;
	uint32_t mla;        /* its layer's place among the MLA layers (the map's) */
	const uint8_t *node; /* its name: the chained node hash of its last row */
	const unsigned char *k, *v;
	size_t klen, vlen;
	int known;                   /* a block the delta's base uses (store_rows.known) */
	uint64_t base_sum;           /* the base's layer it was taken from */
	uint32_t fill[2], n_fill[2]; /* per part: its fills (k, v), or none */
};

/* What a plan has placed: a mark to go back to when a transaction that
 * placed more fails. */
struct store_plan_mark {
	uint32_t placed;     /* parts [0, placed) have their place (store_entry_part) */
	uint32_t n_private;  /* of them, kept as private blocks */
	uint64_t stored;     /* the stream and the private blocks' bytes */
	uint64_t added;      /* bytes of the blocks this entry stored first */
	uint32_t mismatched; /* stored already with other bytes */
	uint64_t freed;      /* bytes of blocks freed when a reference went back */
};

/* How an entry's bytes are stored (record.h): its stream, laid out from the
 * blobs alone, and its MLA layers' full blocks, each placed later inside a
 * write transaction. */
struct store_entry_plan {
	uint32_t row_block; /* 0: it shares nothing: the stream is the blobs whole */
	unsigned char *map;
	uint32_t map_len, map_per;  /* map_per: map bytes per MLA layer */
	struct store_segment *segs; /* the stream: pieces of the blobs */
	size_t n_segs;
	uint64_t stream;     /* the stream's bytes */
	uint64_t *layer_end; /* per layer: where its bytes in the stream end */
	struct store_plan_block *blocks;
	uint32_t n_blocks;
	uint32_t per_layer;          /* blocks per MLA layer that has them (P / row_block) */
	unsigned char *kst;          /* per block: what placing its k part did */
	struct store_plan_mark now;  /* what is placed in the current transaction */
	struct store_plan_mark done; /* what committed transactions placed */
	uint8_t (*nodes)[PREFIX_NODE_LEN];
	const uint8_t *base;   /* a delta's base entry (its known blocks) */
	unsigned char **owned; /* blocks whose rows span a delta's pieces */
	size_t n_owned, cap_owned;
	struct store_plan_fill *fills; /* the copies that fill them */
	uint32_t n_fills, cap_fills;
};

/* Lays out a publish from its model m and its blob sizes alone (a staged
 * publish's bytes may not have arrived): with the store's row block B, each
 * MLA layer of at least B rows keeps its header words and tail rows in the
 * stream and lists its full blocks to be placed. The stream points into the
 * blobs; the entry is stored only once every blob has passed its check. */
int store_entry_plan(struct store *s, const struct store_publish_req *r,
                     const struct k3cache_model *m, struct store_entry_plan *plan);
void store_entry_plan_free(struct store_entry_plan *plan);

/* A plan's blocks are placed part by part, in the order their bytes come
 * in a publish: of each MLA layer, every block's k rows, then every block's
 * v rows. 2 * n_blocks parts; part q is rows [0, *len) of a block of
 * layer *layer. */
uint32_t store_entry_parts(const struct store_entry_plan *plan);
const unsigned char *store_entry_part(const struct store_entry_plan *plan, uint32_t q, size_t *len,
                                      uint32_t *layer);
/* Whether part q is a block's v rows (1) or its k rows (0). */
unsigned store_entry_part_is_v(const struct store_entry_plan *plan, uint32_t q);
/* A part whose rows span a delta's pieces is a buffer of the plan's, filled
 * when it is placed: its fills (their sources are where its bytes come
 * from), or 0 for a part that points into one piece. */
uint32_t store_entry_part_fills(const struct store_entry_plan *plan, uint32_t q,
                                const struct store_plan_fill **fills);
/* What placing part q may write, for sizing a transaction: its rows, or
 * for a block a delta's base vouches for, only a count and a held row. */
size_t store_entry_part_cost(const struct store_entry_plan *plan, uint32_t q);

/* Places parts [plan->done.placed, to) inside txn (their bytes must be in
 * place: a part's fills are made here), first undoing whatever an aborted
 * transaction placed after done. A block's k part shares the
 * stored block when its k rows are the same, or stores them when none is
 * stored (one more reference; with hold, also a held row under key,
 * blocks.h, for a publish whose record comes in a later transaction);
 * otherwise the k rows are written as the entry's private chunk. Its v
 * part then completes the shared block (the map's bit), or, when the
 * stored v rows differ, gives the reference back and writes both parts as
 * private chunks (the stored k rows are the same). A private block's
 * chunks are numbered by its place (STORE_FLAG_PRIVATE_AT), so no part
 * waits for another block's outcome. A delta's block that its base uses is
 * not compared while the base is stored, unquarantined, with the same layer
 * (its sum) and still sharing the block: a stored block never changes, and
 * the base's reference keeps it, so it holds the very rows the delta took
 * from it. */
int store_entry_place(struct store *s, MDB_txn *txn, const uint8_t *key,
                      struct store_entry_plan *plan, uint32_t to, int hold);

/* Adds to *bytes what the parts placed since the last commit stored, less
 * what they freed. */
void store_entry_count_placed(const struct store_entry_plan *plan, uint64_t *bytes);

/* After the transaction that placed blocks commits: keeps what it placed. */
void store_entry_placed(struct store_entry_plan *plan);

/* Writes an entry's record (with the plan's map), tokens, prefix index and
 * LRU row (not its chunks, nor its blocks: every block must be placed) and
 * adds its bytes to *totals: the stream, the private blocks and the blocks
 * it stored first in this transaction (plan->now minus plan->done) to the
 * bytes stored, `bytes` (the blobs whole) to the logical bytes.
 * MDB_KEYEXIST when the record exists. */
int store_entry_add(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                    const uint8_t *key, uint64_t bytes, const uint8_t *tags, const uint64_t *sizes,
                    const uint64_t *sums, const struct store_entry_plan *plan,
                    struct store_totals *totals);

/* Deletes one entry and everything it owns (nodes, attach, lru, tokens,
 * chunks, record, and its references to shared blocks: a block it was last
 * to use goes too) and subtracts what that frees from *totals (when not
 * NULL). With dry (not NULL) nothing is written: what would be freed, the
 * blocks it would be last to use after the entries dry has evicted
 * included, is subtracted all the same, and the entry counted in dry. */
int store_entry_delete(struct store *s, MDB_txn *txn, const struct store_record *r,
                       struct store_totals *totals, struct store_dry *dry);

/* Deletes an entry whose record cannot be decoded (so neither its size nor
 * its prefix-index rows can be known): the record, its tokens and its chunks.
 * Then sets totals->bytes again from the records that decode (for one that
 * does not, the bytes of its chunks), so no byte of the damaged entry stays
 * counted. Its node counts, attach row and LRU row stay: they only locate
 * candidates, each confirmed against a record, and eviction drops a stale
 * LRU row when it meets one. */
int store_entry_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                               struct store_totals *totals);

/* The totals' bytes counted again: each entry's own stream (for a record
 * that does not decode, the bytes of the chunks under its key) and every
 * shared block, stored; each entry whole, logical. */
int store_entry_recount(struct store *s, MDB_txn *txn, struct store_totals *t);

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
