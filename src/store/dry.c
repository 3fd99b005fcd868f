/* dry: what a dry run of an eviction has taken away (dry.h): an open
 * addressing table, kept at most half full, and the moves sorted twice. */
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

int store_dry_moves_reserve(struct store_dry *d, size_t n)
{
	if (n <= d->cap_moves - d->n_moves)
		return 0;
	struct store_dry_move *nm = realloc(d->moves, (d->n_moves + n) * sizeof(*nm));
	if (!nm)
		return ENOMEM;
	d->moves = nm;
	d->cap_moves = d->n_moves + n;
	return 0;
}

int store_dry_move_add(struct store_dry *d, const uint8_t *key, uint64_t from, uint64_t to,
                       uint64_t when)
{
	if (d->n_moves == d->cap_moves)
		return EINVAL; /* past the room reserved */
	struct store_dry_move *m = &d->moves[d->n_moves++];
	memcpy(m->key, key, STORE_DRY_KEY_MAX);
	m->from = from;
	m->to = to;
	m->when = when;
	return 0;
}

static int by_key(const void *a, const void *b)
{
	return memcmp(((const struct store_dry_move *)a)->key,
	              ((const struct store_dry_move *)b)->key, STORE_DRY_KEY_MAX);
}

static int by_row(const void *a, const void *b)
{
	const struct store_dry_move *x = *(const struct store_dry_move *const *)a;
	const struct store_dry_move *y = *(const struct store_dry_move *const *)b;
	if (x->to != y->to)
		return x->to < y->to ? -1 : 1;
	return by_key(x, y);
}

int store_dry_moves_done(struct store_dry *d)
{
	free(d->by_row);
	d->by_row = NULL;
	if (!d->n_moves)
		return 0;
	qsort(d->moves, d->n_moves, sizeof(*d->moves), by_key);
	if (!(d->by_row = malloc(d->n_moves * sizeof(*d->by_row))))
		return ENOMEM;
	for (size_t i = 0; i < d->n_moves; i++)
		d->by_row[i] = &d->moves[i];
	qsort(d->by_row, d->n_moves, sizeof(*d->by_row), by_row);
	return 0;
}

const struct store_dry_move *store_dry_moved(const struct store_dry *d, const uint8_t *key)
{
	struct store_dry_move want = {0};
	if (!d->by_row) /* none, or not yet ordered */
		return NULL;
	memcpy(want.key, key, STORE_DRY_KEY_MAX);
	return bsearch(&want, d->moves, d->n_moves, sizeof(*d->moves), by_key);
}

void store_dry_free(struct store_dry *d)
{
	free(d->slots);
	free(d->moves);
	free(d->by_row);
	memset(d, 0, sizeof(*d));
}
