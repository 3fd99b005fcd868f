/* pending: staged publishes in progress (pending.c).
 *
 *   pending  key -> u32 pid | u64 process start | u64 created | u64 bytes
 *
 * A staged publish writes its chunks, and takes references to shared
 * blocks (held rows, blocks.h), before its record; the pending row says who
 * is writing them. A row whose process is gone (a crash) is swept with its
 * chunks and held references at the next open. */
#ifndef K3_STORE_PENDING_H
#define K3_STORE_PENDING_H

#include "env.h"

#define PENDING_LEN 28u

/* Encodes this process's pending row. */
void store_pending_encode(unsigned char *b, uint64_t created, uint64_t bytes);

/* Whether the pending row v of key belongs to a publish that may still be
 * running: its process exists (same pid, same start time) and, when it is
 * this process, has the key in progress. */
int store_pending_alive(struct store *s, const uint8_t *key, const MDB_val *v);

/* The keys this process has staged publishes in progress for. */
int store_pending_live_add(struct store *s, const uint8_t *key);
void store_pending_live_remove(struct store *s, const uint8_t *key);

/* 1 when a staged publish of key is in progress (its pending row is live):
 * a one-transaction publish of the same key must not write its chunks. */
int store_pending_busy(struct store *s, MDB_txn *txn, const uint8_t *key);

/* Claims key for a staged publish of `bytes` by this process: 1 when a live
 * publish of it holds the row already; else removes what a dead writer left
 * under the key (its chunks; its held block references, adding what that
 * frees to *freed), records this process's row and returns 0 (or an LMDB
 * code). */
int store_pending_claim(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t bytes,
                        uint64_t *freed);

/* Before a one-transaction publish of key, which has no record: removes
 * what a dead staged publish of it left (its chunks, its held references,
 * adding what they free to *freed, its pending row). */
int store_pending_reclaim(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed);

/* Removes key's pending row (absent: nothing to do). */
int store_pending_drop(struct store *s, MDB_txn *txn, const uint8_t *key);

/* Removes the pending rows of staged publishes whose process is gone, with
 * their chunks and held block references (the totals kept in step). Counts
 * them in *swept. */
int store_pending_sweep(struct store *s, MDB_txn *txn, uint32_t *swept);

#endif
