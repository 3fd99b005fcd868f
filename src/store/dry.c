/* dry: what a dry run of an eviction has taken away (dry.h): an open
 * addressing table, kept at most half full. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dry.h"

static size_t hash(const void *key, size_t len)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (size_t i = 0; i < len; i++)
		h = (h ^ ((const unsigned char *)key)[i]) * 1099511628211ull;
	return (size_t)(h ^ (h >> 32));
}

/* The slot of key, or the free one where it would go (cap > 0). */
static struct store_dry_slot *slot_of(struct store_dry_slot *slots, size_t cap, const void *key,
                                      size_t len)
{
	for (size_t i = hash(key, len) & (cap - 1);; i = (i + 1) & (cap - 1)) {
		struct store_dry_slot *sl = &slots[i];
		if (!sl->len || (sl->len == len && !memcmp(sl->key, key, len)))
			return sl;
	}
}

uint32_t store_dry_count(const struct store_dry *d, const void *key, size_t len)
{
	if (!d->cap || !len || len > STORE_DRY_KEY_MAX)
		return 0;
	const struct store_dry_slot *sl = slot_of(d->slots, d->cap, key, len);
	return sl->len ? sl->count : 0;
}

static int grow(struct store_dry *d)
{
	size_t ncap = d->cap ? d->cap * 2 : 256;
	struct store_dry_slot *ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return ENOMEM;
	for (size_t i = 0; i < d->cap; i++)
		if (d->slots[i].len)
			*slot_of(ns, ncap, d->slots[i].key, d->slots[i].len) = d->slots[i];
	free(d->slots);
	d->slots = ns;
	d->cap = ncap;
	return 0;
}

int store_dry_add(struct store_dry *d, const void *key, size_t len)
{
	if (!len || len > STORE_DRY_KEY_MAX)
		return EINVAL;
	if ((d->n + 1) * 2 > d->cap && grow(d) != 0)
		return ENOMEM;
	struct store_dry_slot *sl = slot_of(d->slots, d->cap, key, len);
	if (!sl->len) {
		sl->len = (uint8_t)len;
		memcpy(sl->key, key, len);
		d->n++;
	}
	if (sl->count < UINT32_MAX)
		sl->count++;
	return 0;
}

void store_dry_free(struct store_dry *d)
{
	free(d->slots);
	memset(d, 0, sizeof(*d));
}
