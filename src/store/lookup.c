/* lookup: the longest stored prefix of a prompt (store.h, "lookup"). */
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "lru.h"
#include "prefix.h"

enum status_code store_lookup(struct store *s, const struct store_lookup_req *req,
                              struct store_lookup_res *res, struct status *st)
{
	memset(res, 0, sizeof(*res));
	uint32_t kn = req->n_tokens / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(kn + 1) * PREFIX_NODE_LEN);
	if (!h)
		return status_set(st, STATUS_INTERNAL, "out of memory");
	prefix_block_hashes(req->fingerprint, req->salt, req->salt_len, req->tokens, req->n_tokens,
	                    h);
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		free(h);
		return store_mdb_error(st, rc, "lookup");
	}
	res->prefix_len = store_index_find(s, txn, req, h, res);
	mdb_txn_abort(txn);
	free(h);
	if (!res->prefix_len) {
		memset(res->key, 0, sizeof(res->key));
		res->bytes = 0;
	}
	if (!req->quiet)
		store_lookup_count(s, res);
	return STATUS_OK;
}

void store_lookup_count(struct store *s, const struct store_lookup_res *res)
{
	if (res->prefix_len) {
		atomic_fetch_add(&s->hits, 1);
		atomic_fetch_add(&s->hit_tokens, res->prefix_len);
		store_touch(s, res->key, 1);
	} else {
		atomic_fetch_add(&s->misses, 1);
	}
}
