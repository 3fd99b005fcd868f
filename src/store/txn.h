/* txn: how the store begins and ends its write transactions.
 *
 * LMDB's rules (lmdb.h): a write transaction holds the environment's writer
 * lock until it is committed or aborted, and mdb_txn_commit() frees the
 * handle whether it succeeds or not, so a failed commit is never followed by
 * an abort. Every write path ends through store_txn_end(), so no error path
 * can leave the lock held or free a handle twice.
 */
#ifndef K3_STORE_TXN_H
#define K3_STORE_TXN_H

#include <lmdb.h>

struct store;

/* Begins a write transaction. 0 or an LMDB code (then *txn is NULL). */
int store_txn_write(struct store *s, MDB_txn **txn);

/* Ends a write transaction: commits it when rc is 0, aborts it otherwise.
 * Returns rc, or the commit's code when the commit fails. txn is gone
 * afterwards either way. */
int store_txn_end(MDB_txn *txn, int rc);

/* A code for store_txn_end() that aborts a transaction which found nothing
 * to write (not an error: the caller maps it back). */
#define STORE_TXN_NOTHING (-30001)

#endif
