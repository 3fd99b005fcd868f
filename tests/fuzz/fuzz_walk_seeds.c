/* Seeds for fuzz_walk: the data files of small real stores (an empty one,
 * one entry, and entries with tokens and chunks on overflow pages, shared
 * blocks and evictions). usage: fuzz_walk_seeds DIR */
#include <stdio.h>
#include <stdlib.h>

#include "storeutil.h"

static void keep(const char *store, const char *dir, int i)
{
	char from[4096], to[4096];
	snprintf(from, sizeof(from), "%s/data.mdb", store);
	snprintf(to, sizeof(to), "%s/store-%d", dir, i);
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	if (!in || !out)
		exit(1);
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			exit(1);
	fclose(in);
	fclose(out);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	const uint32_t sizes[3] = {0, 1, 6};
	for (int i = 0; i < 3; i++) {
		char *dir = storeutil_tmpdir();
		struct store *st;
		struct store_options o = {.max_bytes = 96 << 10, .check = STORE_CHECK_NEVER};
		struct status s;
		if (store_open(dir, &o, &st, &s) != STATUS_OK)
			return 1;
		struct k3cache_model *m = storeutil_model("fuzz-walk", 16);
		store_put_model(st, m, NULL, NULL);
		uint32_t t[1200];
		for (uint32_t j = 0; j < 1200; j++)
			t[j] = 1000 + j * 7;
		for (uint32_t k = 0; k < sizes[i]; k++) {
			t[5] = k;
			if (storeutil_publish(st, m, k % 2 ? "tenant" : "", t,
			                      k ? 100 + 200 * k : 20, 1, NULL) != STATUS_OK)
				return 1;
		}
		store_close(st);
		keep(dir, argv[1], i);
		storeutil_rmdir(dir);
		model_free(m);
	}
	return 0;
}
