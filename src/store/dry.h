/* dry: what a dry run of an eviction has taken away, held in memory in
 * place of the writes it may not make (dry.c): the entries it has evicted
 * and the references to shared blocks it has given back, and the moves of
 * entries in the LRU that the uses held in memory make when the real evict
 * writes them first. The calls that evict (lru.h, entry.h, blocks.h) take
 * one, or NULL to evict for real, so that a dry run works out the same
 * entries and the same bytes as the real evict, by the same code, without
 * writing anything (so it runs on a store whose map is full too). */
#ifndef K3_STORE_DRY_H
#define K3_STORE_DRY_H

#include <stddef.h>
#include <stdint.h>

/* Keys of up to STORE_DRY_KEY_MAX bytes, each with a count; keys of
 * different lengths never match. Zeroed: empty. */
#define STORE_DRY_KEY_MAX 32u

struct store_dry_slot {
	uint8_t len; /* 0: a free slot */
	uint8_t key[STORE_DRY_KEY_MAX];
	uint32_t count;
};

/* An entry that the uses held in memory move in the LRU: from its row at
 * seq `from` to one at seq `to`, last used at `when`. */
struct store_dry_move {
	uint8_t key[STORE_DRY_KEY_MAX];
	uint64_t from, to, when;
};

struct store_dry {
	struct store_dry_slot *slots;
	size_t n, cap;                        /* cap: 0, or a power of two */
	struct store_dry_move *moves;         /* by key */
	const struct store_dry_move **by_row; /* the same, by (to, key) */
	size_t n_moves, cap_moves;
};

/* How many times key (len bytes, 1 to STORE_DRY_KEY_MAX) was added: 1 for
 * an entry evicted, the references given back for a block. */
uint32_t store_dry_count(const struct store_dry *d, const void *key, size_t len);

/* Counts key once more. 0, or ENOMEM. */
int store_dry_add(struct store_dry *d, const void *key, size_t len);

/* Makes room for n more moves. 0, or ENOMEM. */
int store_dry_moves_reserve(struct store_dry *d, size_t n);

/* Adds a move (keys of STORE_DRY_KEY_MAX bytes, each key once), for
 * store_dry_moves_done() to order. 0, or EINVAL past the room reserved. */
int store_dry_move_add(struct store_dry *d, const uint8_t *key, uint64_t from, uint64_t to,
                       uint64_t when);

/* Orders the moves added, by key and by row; 0, or ENOMEM. */
int store_dry_moves_done(struct store_dry *d);

/* The move of the entry under key (STORE_DRY_KEY_MAX bytes), or NULL. */
const struct store_dry_move *store_dry_moved(const struct store_dry *d, const uint8_t *key);

void store_dry_free(struct store_dry *d);

#endif
