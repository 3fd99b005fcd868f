/* fuzz_walk: the structural walk of a store file (src/store/walk.c) on
 * arbitrary bytes, as a damaged disk would hand it: in check mode, and in
 * salvage mode, where every key and value it hands out must lie inside the
 * file (ASan checks each byte read here). */
#include <stdlib.h>
#include <string.h>

#include "store/walk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int touch(const char *table, const void *key, size_t klen, const void *val, size_t vlen,
                 void *ctx)
{
	volatile unsigned char sum = (unsigned char)table[0];
	for (size_t i = 0; i < klen; i++)
		sum ^= ((const unsigned char *)key)[i];
	for (size_t i = 0; i < vlen; i++)
		sum ^= ((const unsigned char *)val)[i];
	(void)sum;
	(*(size_t *)ctx)++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* a private copy: the walk must not rely on anything past size */
	unsigned char *map = malloc(size ? size : 1);
	if (!map)
		abort();
	memcpy(map, data, size);
	struct store_walk_stats st;
	char why[256];
	int rc = store_walk(map, size, 0, NULL, NULL, &st, why, sizeof(why));
	if (rc != 0 && rc != 1 && rc != STORE_WALK_GONE)
		abort();
	if (rc == 1 && !why[0])
		abort(); /* a refusal always says why */
	size_t items = 0;
	if (store_walk(map, size, 0, touch, &items, &st, why, sizeof(why)) == 0 && rc == 0 &&
	    items != st.items)
		abort(); /* a sound file hands out exactly the items it counts */
	free(map);
	return 0;
}
