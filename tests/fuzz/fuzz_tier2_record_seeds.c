/* Seeds for fuzz_tier2_record: records as tier2_put writes them, with and
 * without a salt, one chunk or many, one layer or several.
 * usage: fuzz_tier2_record_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier2/tier2.h"

static int write_seed(const char *dir, int i, const struct tier2_record *rec)
{
	uint8_t *b = NULL;
	size_t len = 0;
	char err[256], path[4096];
	if (tier2_record_encode(rec, &b, &len, err, sizeof(err)) != 0) {
		fprintf(stderr, "fuzz_tier2_record_seeds: %s\n", err);
		return 1;
	}
	snprintf(path, sizeof(path), "%s/tier2-record-%d", dir, i);
	FILE *f = fopen(path, "wb");
	int rc = !f || fwrite(b, 1, len, f) != len;
	if (f)
		fclose(f);
	free(b);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	uint32_t tokens[70];
	for (uint32_t i = 0; i < 70; i++)
		tokens[i] = 151643u + i * 13u;
	struct tier2_layer layers[4] = {{45069, 1, 0}, {45069, 2, 0}, {10249, 3, 0}, {45069, 4, 0}};
	uint64_t sums[146];
	for (int i = 0; i < 146; i++)
		sums[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	struct tier2_record rec = {.generation = 0x1122334455667788ull,
	                           .salt_len = 4,
	                           .salt = (const uint8_t *)"salt",
	                           .n_tokens = 70,
	                           .tokens = tokens,
	                           .n_layers = 4,
	                           .layers = layers,
	                           .chunk_size = TIER2_CHUNK_MAX,
	                           .n_chunks = 1,
	                           .chunk_xxh3 = sums};
	memset(rec.fingerprint, 0xab, sizeof(rec.fingerprint));
	int rc = write_seed(argv[1], 0, &rec);
	rec.chunk_size = 1000; /* 145456 bytes: 146 chunks */
	rec.n_chunks = 146;
	rc |= write_seed(argv[1], 1, &rec);
	rec.salt_len = 0;
	rec.salt = NULL;
	rec.n_tokens = 1;
	rec.n_layers = 1;
	rec.chunk_size = 4096;
	rec.n_chunks = 12; /* 45069 bytes */
	rc |= write_seed(argv[1], 2, &rec);
	return rc;
}
