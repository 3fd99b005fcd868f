/* index: the store's two indexes (index.c).
 *
 * The prefix index finds the longest stored prefix of a prompt:
 *   tokens   key -> P x u32 tokens
 *   nodes    block-hash node -> u32 count of entries whose path passes it
 *   attach   node (DUPSORT) -> u32 P (BE) | u64 tail hash | key
 * The prompt is hashed in blocks (prefix.h); the deepest node present is
 * found by binary search, then the entries attached at and above it are
 * checked deepest first, their tokens compared one by one.
 *
 * The LRU index orders entries by last use:
 *   lru      u64 use sequence (BE) | key -> "" */
#ifndef K3_STORE_INDEX_H
#define K3_STORE_INDEX_H

#include "prefix.h"
#include "record.h"

/* Tail hash of an attach record: XXH3-64 of tokens [depth*B, P). */
#define STORE_ATTACH_LEN (4 + 8 + STORE_KEY_LEN)

uint64_t store_index_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to);

/* Adds an entry's tokens and prefix-index rows. */
int store_index_add(struct store *s, MDB_txn *txn, const uint8_t *fingerprint, const void *salt,
                    size_t salt_len, const uint32_t *tokens, uint32_t n, const uint8_t *key);

/* Removes the tokens and prefix-index rows of the entry of record r (found
 * again from its stored tokens; missing ones are skipped). r's salt must not
 * point into the map (copy it first): this writes. */
int store_index_remove(struct store *s, MDB_txn *txn, const struct store_record *r);

/* The longest entry that is a prefix of the request's prompt with P <= the
 * limit, not quarantined: its P (0 on a miss), key and bytes in res, and
 * the junction in res->hint. h holds the prompt's block hashes. */
uint32_t store_index_find(struct store *s, MDB_txn *txn, const struct store_lookup_req *req,
                          uint8_t (*h)[PREFIX_NODE_LEN], struct store_lookup_res *res);

/* The stored tokens of key (P x u32; the caller checks the length). */
int store_index_tokens(struct store *s, MDB_txn *txn, const uint8_t *key, MDB_val *v);

/* LRU rows. */
int store_index_lru_add(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key);
int store_index_lru_del(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key);
/* Moves the row of record old to sequence seq. */
int store_index_lru_move(struct store *s, MDB_txn *txn, const struct store_record *old,
                         uint64_t seq);

#endif
