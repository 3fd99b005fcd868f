/* Seeds for fuzz_tier2_record: records as tier2_put writes them, with and
 * without a salt, one chunk or many, one layer or several, versions 1 and 2
 * (MLA layers split in blocks of 16 or 32 rows, or none); and a put's intent
 * as LRANGE answers it.
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

/* An intent as LRANGE answers it: its header and two parts, as RESP. */
static int intent_seed(const char *dir)
{
	unsigned char head[TIER2_INTENT_HEAD_LEN], part[2][TIER2_INTENT_PART_LEN];
	tier2_intent_head_encode(head, 65536, 30);
	for (uint32_t i = 0; i < 2; i++) {
		struct tier2_intent_part p = {
		        .layer = 3, .part = i, .xxh3 = 0x9e37ull + i, .size = 16384};
		memset(p.node, 0x5a + (int)i, sizeof(p.node));
		tier2_intent_part_encode(part[i], &p);
	}
	char path[4096];
	snprintf(path, sizeof(path), "%s/tier2-intent-0", dir);
	FILE *f = fopen(path, "wb");
	if (!f)
		return 1;
	int rc = fprintf(f, "*3\r\n$%u\r\n", TIER2_INTENT_HEAD_LEN) < 0 ||
	         fwrite(head, 1, sizeof(head), f) != sizeof(head);
	for (int i = 0; i < 2; i++)
		rc |= fprintf(f, "\r\n$%u\r\n", TIER2_INTENT_PART_LEN) < 0 ||
		      fwrite(part[i], 1, sizeof(part[i]), f) != sizeof(part[i]);
	rc |= fprintf(f, "\r\n") < 0;
	return fclose(f) != 0 || rc;
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
	/* version 2: the twin's shape, MLA layers 1 and 3 of 70 rows (k 3, v 2
	 * floats) in blocks of 16 (4 blocks, 8 parts each) and of 32 */
	struct tier2_layer v2l[4] = {{45069, 1, 1}, {1413, 2, 2}, {10249, 3, 1}, {1413, 4, 2}};
	struct tier2_split split[2] = {{1, 70, 3, 2}, {3, 70, 3, 2}};
	uint64_t parts[16];
	for (int i = 0; i < 16; i++)
		parts[i] = 0x2545f4914f6cdd1dull * (uint64_t)(i + 1);
	rec = (struct tier2_record){.generation = 0x8877665544332211ull,
	                            .salt_len = 4,
	                            .salt = (const uint8_t *)"salt",
	                            .n_tokens = 70,
	                            .tokens = tokens,
	                            .n_layers = 4,
	                            .layers = v2l,
	                            .chunk_size = 4096,
	                            .n_chunks = 14, /* 58144 - 2 x 1280 bytes: 55584 */
	                            .chunk_xxh3 = sums,
	                            .version = 2,
	                            .row_block = 16,
	                            .n_split = 2,
	                            .split = split,
	                            .part_xxh3 = parts};
	memset(rec.fingerprint, 0xcd, sizeof(rec.fingerprint));
	rc |= write_seed(argv[1], 3, &rec);
	rec.row_block = 32; /* 2 blocks each: 8 parts */
	rec.n_chunks = 14;  /* 58144 - 2 x 640 bytes: 56864 */
	rc |= write_seed(argv[1], 4, &rec);
	rec.row_block = 128; /* none as long as a block */
	rec.n_split = 0;
	rec.n_chunks = 15; /* 58144 bytes */
	rc |= write_seed(argv[1], 5, &rec);
	rc |= intent_seed(argv[1]);
	return rc;
}
