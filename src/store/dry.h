/* dry: what a dry run of an eviction has taken away, held in memory in
 * place of the writes it may not make (dry.c): the entries it has evicted
 * and the references to shared blocks it has given back. The calls that
 * evict (lru.h, entry.h, blocks.h) take one, or NULL to evict for real, so
 * that a dry run works out the same entries and the same bytes as the real
 * evict, by the same code. */
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

struct store_dry {
	struct store_dry_slot *slots;
	size_t n, cap; /* cap: 0, or a power of two */
};

/* How many times key (len bytes, 1 to STORE_DRY_KEY_MAX) was added: 1 for
 * an entry evicted, the references given back for a block. */
uint32_t store_dry_count(const struct store_dry *d, const void *key, size_t len);

/* Counts key once more. 0, or ENOMEM. */
int store_dry_add(struct store_dry *d, const void *key, size_t len);

void store_dry_free(struct store_dry *d);

#endif
