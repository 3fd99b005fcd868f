/* txn: the one place write transactions begin and end (txn.h). */
#include "txn.h"

#include "env.h"

int store_txn_write(struct store *s, MDB_txn **txn)
{
	*txn = NULL;
	return mdb_txn_begin(s->env, NULL, 0, txn);
}

int store_txn_end(MDB_txn *txn, int rc)
{
	if (rc) {
		mdb_txn_abort(txn);
		return rc;
	}
	return mdb_txn_commit(txn); /* frees txn, committed or not */
}
