/* libFuzzer target: tier 2's entry-record decoder (src/tier2/tier2_record.c).
 * Any input must be refused or decoded without a fault or a leak, and what
 * decodes must encode back to the same bytes. Each input is tried as it is
 * and with its last 8 bytes replaced by the right record sum, so that the
 * checks after the sum (sizes, chunk count) are reached too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "tier2/tier2.h"

static void one(const uint8_t *data, size_t size)
{
	struct tier2_record rec;
	char err[320];
	if (tier2_record_decode(data, size, &rec, err, sizeof(err)) != 0)
		return;
	uint8_t *again = NULL;
	size_t len = 0;
	if (tier2_record_encode(&rec, &again, &len, err, sizeof(err)) != 0 || len != size ||
	    memcmp(again, data, size) != 0)
		abort(); /* a record that decodes is one that encodes */
	free(again);
	tier2_record_free(&rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	one(data, size);
	if (size < 8)
		return 0;
	uint8_t *copy = malloc(size);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	uint64_t sum = XXH3_64bits(copy, size - 8);
	for (int i = 0; i < 8; i++)
		copy[size - 8 + i] = (uint8_t)(sum >> (8 * i));
	one(copy, size);
	free(copy);
	return 0;
}
