#include "checksum.h"

#include <string.h>

#include "xxh_dispatch.h"

uint64_t checksum_blob(const void *bytes, size_t len, uint32_t layer)
{
	return XXH3_64bits_withSeed(bytes, len, layer);
}

struct checksum_state *checksum_begin(uint32_t layer)
{
	XXH3_state_t *st = XXH3_createState();
	if (st)
		XXH3_64bits_reset_withSeed(st, layer);
	return (struct checksum_state *)st;
}

void checksum_update(struct checksum_state *st, const void *bytes, size_t len)
{
	XXH3_64bits_update((XXH3_state_t *)st, bytes, len);
}

uint64_t checksum_end(struct checksum_state *st)
{
	uint64_t h = XXH3_64bits_digest((XXH3_state_t *)st);
	XXH3_freeState((XXH3_state_t *)st);
	return h;
}

void checksum_run_begin(struct checksum_run *r, uint32_t layer)
{
	/* a reset reads the state's seed and secret pointer to skip work: on
	 * the stack they hold whatever was there (xxhash.h: XXH3_INITSTATE) */
	memset(&r->xs, 0, sizeof(r->xs));
	XXH3_64bits_reset_withSeed(&r->xs, layer);
}

void checksum_run_update(struct checksum_run *r, const void *bytes, size_t len)
{
	XXH3_64bits_update(&r->xs, bytes, len);
}

uint64_t checksum_run_end(const struct checksum_run *r)
{
	return XXH3_64bits_digest(&r->xs);
}
