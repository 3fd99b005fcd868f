/* libFuzzer target: tier 2's entry-record decoder (src/tier2/tier2_record.c).
 * Any input must be refused or decoded without a fault or a leak, and what
 * decodes must encode back to the same bytes. Each input is tried as it is
 * and with its last 8 bytes replaced by the right record sum, so that the
 * checks after the sum (sizes, chunk count) are reached too. The other
 * untrusted bytes tier 2 reads are tried on the same input: as a key name
 * from a SCAN (a record name parsed back must be the name it makes), and as
 * RESP replies through a bounded reader into the ledger's page parser; and
 * as a put's intent, its header and part elements (what decodes encodes
 * back) and RESP pages of it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "tier2/tier2.h"

static void name(const uint8_t *data, size_t size)
{
	uint8_t key[TIER2_KEY_LEN];
	if (tier2_parse_record_name((const char *)data, size, "fz", key) != 0)
		return;
	char again[TIER2_NAME_MAX];
	if (tier2_name_record(again, "fz", key) != size || memcmp(again, data, size) != 0)
		abort(); /* only the names tier2 makes are accepted */
}

/* Calls fn on each of the first 16 RESP replies in data (a bounded reader). */
static void each_reply(const uint8_t *data, size_t size, void (*fn)(const redisReply *rep, int i))
{
	redisReader *rd = cluster_reader_new();
	if (!rd)
		abort();
	if (redisReaderFeed(rd, (const char *)data, size) == REDIS_OK) {
		for (int i = 0; i < 16; i++) {
			void *rep = NULL;
			if (redisReaderGetReply(rd, &rep) != REDIS_OK || !rep)
				break;
			fn(rep, i);
			freeReplyObject(rep);
		}
	}
	redisReaderFree(rd);
}

static void ledger_page(const redisReply *rep, int i)
{
	(void)i;
	static struct tier2_owned page[TIER2_LEDGER_PAGE];
	size_t n = 0, pairs = 0;
	char err[200] = "";
	int rc = tier2_ledger_parse(rep, page, TIER2_LEDGER_PAGE, &n, &pairs, err, sizeof(err));
	if ((rc == 0 && (n > pairs || pairs > TIER2_LEDGER_PAGE)) ||
	    (rc != 0 && (n != 0 || err[0] == '\0')))
		abort();
}

/* A page of an intent (the first page from element 0, the others after). */
static void intent_page(const redisReply *rep, int i)
{
	static struct tier2_intent_part page[64];
	struct tier2_intent_info info = {0};
	size_t got = 0, elems = 0;
	char err[200] = "";
	int rc = tier2_intent_parse(rep, i == 0, &info, page, 64, &got, &elems, err, sizeof(err));
	if ((rc == 0 && (got > elems || elems > 64)) || (rc != 0 && (got != 0 || err[0] == '\0')))
		abort();
}

/* A put's intent: its elements as they are, and RESP pages of LRANGE. */
static void intent(const uint8_t *data, size_t size)
{
	uint32_t cs = 0, n = 0;
	if (tier2_intent_head_decode(data, size, &cs, &n) == 0) {
		unsigned char again[TIER2_INTENT_HEAD_LEN];
		tier2_intent_head_encode(again, cs, n);
		if (size != sizeof(again) || memcmp(again, data, size) != 0)
			abort(); /* a header that decodes is one that encodes */
	}
	uint64_t og = 0;
	if (tier2_intent_old_decode(data, size, &og, &cs, &n) == 0) {
		unsigned char again[TIER2_INTENT_OLD_LEN];
		tier2_intent_old_encode(again, og, cs, n);
		if (size != sizeof(again) || memcmp(again, data, size) != 0)
			abort();
	}
	struct tier2_intent_part part;
	if (tier2_intent_part_decode(data, size, &part) == 0) {
		unsigned char again[TIER2_INTENT_PART_LEN];
		tier2_intent_part_encode(again, &part);
		if (size != sizeof(again) || memcmp(again, data, size) != 0)
			abort();
	}
	each_reply(data, size, intent_page);
}

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
	name(data, size);
	each_reply(data, size, ledger_page);
	intent(data, size);
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
