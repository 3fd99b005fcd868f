/* fuzz_record: the entry record decoder (src/store/record.c) on arbitrary
 * bytes, as a damaged store would hand it. A record that decodes must be
 * safe to read in full (every layer, every bit of its map) and encode back
 * to the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "store/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct store_record r;
	if (store_record_decode(data, size, &r) != 0)
		return 0;
	uint8_t *tags = malloc(r.n_layers);
	uint64_t *sizes = malloc(r.n_layers * sizeof(uint64_t));
	uint64_t *sums = malloc(r.n_layers * sizeof(uint64_t));
	if (!tags || !sizes || !sums)
		abort();
	uint32_t n_mla = 0;
	for (uint32_t i = 0; i < r.n_layers; i++) {
		store_record_layer(&r, i, &tags[i], &sizes[i], &sums[i]);
		n_mla += tags[i] == 2;
	}
	volatile int bits = 0;
	if (r.row_block)
		for (uint32_t m = 0; m < n_mla; m++)
			for (uint32_t b = 0; b < r.prefix_len / r.row_block; b++)
				bits += store_record_shared(&r, m, b);
	(void)bits;
	/* a version-2 record encodes back to its own bytes */
	uint32_t version = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
	                   (uint32_t)data[3] << 24;
	if (version == 2) {
		size_t len = store_record_size(r.salt_len, r.n_layers, r.map_len);
		if (len != size)
			abort();
		unsigned char *out = malloc(len);
		if (!out)
			abort();
		store_record_encode(&r, tags, sizes, sums, out);
		if (memcmp(out, data, len) != 0)
			abort();
		free(out);
	}
	free(tags);
	free(sizes);
	free(sums);
	return 0;
}
