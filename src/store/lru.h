/* lru: last uses and the eviction policy, in one file (lru.c).
 *
 * Uses are held in memory (store_touch) and written by the next write
 * transaction or store_flush(). When the store is over its capacity, or the
 * map is full, the least recently used entries are evicted until the bytes
 * fit; the LRU is per entry. */
#ifndef K3_STORE_LRU_H
#define K3_STORE_LRU_H

#include "dry.h"
#include "env.h"

/* Records a use. Held in memory and written by the next write transaction or
 * store_flush(); when the buffer is full, uses are dropped until then (the LRU
 * order is then approximate, never wrong about what exists). */
void store_touch(struct store *s, const uint8_t key[STORE_KEY_LEN], uint64_t hits);

/* Writes pending touches inside txn. */
int store_lru_apply_touches(struct store *s, MDB_txn *txn);

/* What writing the pending touches would do, worked out in txn (read-only
 * will do) and writing nothing: each entry they would move in the LRU is
 * added to dry's moves, with the last use they would give it. Leaves the
 * touches pending. 0, ENOMEM or an LMDB code. */
int store_lru_dry_touches(struct store *s, MDB_txn *txn, struct store_dry *dry);

/* Begins a write transaction, writes the pending touches in it and reads
 * the totals: how every write that changes entries starts. On failure the
 * transaction is gone (0 or an LMDB code). */
int store_lru_begin(struct store *s, MDB_txn **txn, struct store_totals *t);

/* Ends a write transaction begun with store_lru_begin: with rc 0, writes
 * the totals t (with the LRU clock as it now stands) and commits; otherwise
 * aborts. Returns as store_txn_end() does. */
int store_lru_end(struct store *s, MDB_txn *txn, struct store_totals *t, int rc);

/* Evicts the entry under key inside txn: *freed is what that frees (its
 * own chunks, and the shared blocks it was the last to use), taken off
 * *totals. An entry whose record does not decode is removed all the same
 * (its chunks' bytes). With dry (not NULL) nothing is written and the same
 * is worked out, counting the entries and references dry has taken away
 * as gone, and the entry is added to them. 0, MDB_NOTFOUND when there is no
 * such entry (or dry has it), or an LMDB code. */
int store_lru_evict_key(struct store *s, MDB_txn *txn, const uint8_t *key,
                        struct store_totals *totals, struct store_dry *dry, uint64_t *freed);

/* Evicts least-recently-used entries inside txn (store_lru_evict_key)
 * until totals->bytes <= target or nothing is left, so that what each
 * eviction frees decides whether another is needed. Reports each to fn.
 * With dry (not NULL), a dry run of it: nothing written, the same entries
 * and bytes reported, the LRU taken as dry's moves would leave it
 * (store_lru_dry_touches). Returns an LMDB code. */
int store_lru_evict(struct store *s, MDB_txn *txn, struct store_totals *totals, uint64_t target,
                    struct store_dry *dry,
                    void (*fn)(const uint8_t *key, uint64_t bytes, void *ctx), void *ctx,
                    uint32_t *n_evicted);

/* Evicts in its own transactions until `need` more bytes fit (force: after a
 * MAP_FULL, free `need` more than now; MDB_MAP_FULL when nothing is left). */
int store_lru_make_room(struct store *s, uint64_t need, uint32_t *evicted, int force);

/* Makes room, when needed, for `need` more bytes beside the committed
 * entries and every staged publish's chunks so far. */
int store_lru_room_for(struct store *s, uint64_t need, uint32_t *evicted);

/* How many reader slots of other processes hold a read transaction now
 * (dead processes' slots cleared first): each pins the pages freed after its
 * snapshot, as a direct reader's view does. */
int store_lru_other_readers(struct store *s);

/* Whether read transactions pin pages that eviction would free: restores
 * in progress in this process, or readers in others. */
int store_lru_pinned(struct store *s);

/* Runs op (a write transaction of its own) until it succeeds; after
 * MDB_MAP_FULL, evicts `need` bytes and tries again. STORE_MAP_PINNED when
 * the pages eviction frees stay pinned by readers (store_lru_pinned). */
int store_lru_write(struct store *s, uint64_t need, int (*op)(struct store *s, void *ctx),
                    void *ctx, uint32_t *evicted);

/* The status of a failed write: STORE_MAP_PINNED is BUSY, and so is
 * MDB_MAP_FULL while readers pin pages (store_lru_pinned); other
 * MDB_MAP_FULL is FULL, saying whether entries were left,
 * and so is a disk that refuses the write (ENOSPC, EDQUOT, or EIO with under
 * 64 MiB free), with the free space named. */
enum status_code store_lru_write_status(struct store *s, int rc, struct status *st);

#endif
