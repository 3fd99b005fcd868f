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

/* Whether record r's key is the SHA-256 of its model, salt and tokens (its
 * stored token list, P x u32): a flip in the record's fingerprint or salt,
 * or in the token list, leaves the entry under a key no lookup computes. */
int store_index_key_matches(const struct store_record *r, const MDB_val *tokens);

/* Checks the indexes against the entries, in txn (read-only), for what hides
 * an entry: a missing LRU row (eviction cannot reach it), a missing attach
 * row, or a node missing or counting fewer entries than pass through it
 * (lookups cannot find it). Left-overs that lookups and eviction skip (rows
 * of entries that are gone, counts too high) are not reported. Entries whose
 * record, tokens or key are damaged are left to the entries' own check.
 * Each problem goes to fn with a NULL key and is counted in *problems
 * (index_verify.c). Returns an LMDB code. */
int store_index_verify(struct store *s, MDB_txn *txn,
                       void (*fn)(const uint8_t *key, const char *why, void *ctx), void *ctx,
                       uint64_t *problems);

/* Rebuilds the prefix index (nodes, attach) and the LRU index from the
 * entries, in txn (a write): every readable record gets its LRU row, and
 * every one served (not quarantined, its tokens and key sound) its path.
 * *entries counts those. How verify repairs what store_index_verify finds
 * (index_verify.c). Returns an LMDB code. */
int store_index_rebuild(struct store *s, MDB_txn *txn, uint64_t *entries);

/* LRU rows. */
int store_index_lru_add(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key);
int store_index_lru_del(struct store *s, MDB_txn *txn, uint64_t seq, const uint8_t *key);
/* Moves the row of record old to sequence seq. */
int store_index_lru_move(struct store *s, MDB_txn *txn, const struct store_record *old,
                         uint64_t seq);

#endif
