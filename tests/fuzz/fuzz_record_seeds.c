/* Seeds for fuzz_record: a few real records, version 1 and 2, with and
 * without a salt and a map. usage: fuzz_record_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/record.h"

static void put(const char *dir, int i, const unsigned char *b, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/record-%d", dir, i);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(b, 1, n, f) != n)
		exit(1);
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	const uint8_t tags[4] = {1, 1, 2, 1};
	const uint64_t sizes[4] = {113, 113, 1013, 113};
	const uint64_t sums[4] = {1, 2, 3, 4};
	unsigned char map[2] = {0x0b, 0};
	struct store_record r = {.prefix_len = 200,
	                         .n_layers = 4,
	                         .created = 1,
	                         .last_used = 2,
	                         .lru_seq = 3,
	                         .bytes = 113 * 3 + 1013,
	                         .salt_len = 6,
	                         .salt = (const uint8_t *)"tenant"};
	memset(r.key, 7, sizeof(r.key));
	memset(r.fingerprint, 9, sizeof(r.fingerprint));
	for (int i = 0; i < 3; i++) {
		r.stored = i ? r.bytes - 500 : r.bytes;
		r.row_block = i ? 64 : 0;
		r.map = i ? map : NULL;
		r.map_len = i ? 1 : 0;
		r.salt_len = i == 2 ? 0 : 6;
		size_t n = store_record_size(r.salt_len, r.n_layers, r.map_len);
		unsigned char *b = malloc(n);
		store_record_encode(&r, tags, sizes, sums, b);
		put(argv[1], i, b, n);
		if (i == 0) { /* and as version 1: no tail */
			b[0] = 1;
			put(argv[1], 9, b, n - 16);
		}
		free(b);
	}
	return 0;
}
