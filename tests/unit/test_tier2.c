/* tier2: the entry record's encoding and its refusals (truncated, trailing,
 * oversized counts, overflowing sizes, corrupted bytes), key names and the
 * namespace's syntax, without a server (tests/integration/test_tier2_live.c
 * has the cluster). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "tier2/tier2.h"

/* A record of 3 layers (sizes 5000, 1, 3000) in chunks of 4096 bytes. */
struct sample {
	uint32_t tokens[40];
	struct tier2_layer layers[3];
	uint64_t chunks[2];
	struct tier2_record rec;
};

static void sample(struct sample *s)
{
	memset(s, 0, sizeof(*s));
	for (uint32_t i = 0; i < 40; i++)
		s->tokens[i] = 1000u + i * 7u;
	s->layers[0] = (struct tier2_layer){5000, 0x1111, 0};
	s->layers[1] = (struct tier2_layer){1, 0x2222, 0};
	s->layers[2] = (struct tier2_layer){3000, 0x3333, 0};
	s->chunks[0] = 0xaaaa;
	s->chunks[1] = 0xbbbb;
	s->rec = (struct tier2_record){.generation = 0x0123456789abcdefull,
	                               .salt_len = 5,
	                               .salt = (const uint8_t *)"tenant",
	                               .n_tokens = 40,
	                               .tokens = s->tokens,
	                               .n_layers = 3,
	                               .layers = s->layers,
	                               .chunk_size = 4096,
	                               .n_chunks = 2,
	                               .chunk_xxh3 = s->chunks};
	for (int i = 0; i < 32; i++)
		s->rec.fingerprint[i] = (uint8_t)(0xc0 + i);
}

static uint8_t *encoded(const struct tier2_record *rec, size_t *len)
{
	uint8_t *b = NULL;
	char err[256] = "";
	if (tier2_record_encode(rec, &b, len, err, sizeof(err)) != 0)
		fail_msg("encode: %s", err);
	return b;
}

/* Offsets in the sample's encoding. */
#define OFF_SALT_LEN 48u
#define OFF_NTOK     (OFF_SALT_LEN + 4u + 5u)
#define OFF_NLAY     (OFF_NTOK + 4u + 40u * 4u)
#define OFF_LAYERS   (OFF_NLAY + 4u)
#define OFF_CS       (OFF_LAYERS + 3u * 16u)
#define OFF_NCHUNK   (OFF_CS + 4u)

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the final sum, so that a refusal is for what the test changed. */
static void resum(uint8_t *b, size_t len)
{
	put64(b + len - 8, XXH3_64bits(b, len - 8));
}

/* Decoding must fail with a message containing want. */
static void refused(const uint8_t *b, size_t len, const char *want)
{
	struct tier2_record out;
	char err[320] = "";
	if (tier2_record_decode(b, len, &out, err, sizeof(err)) == 0) {
		tier2_record_free(&out);
		fail_msg("decoded %zu bytes, want a refusal (%s)", len, want);
	}
	assert_null(out.mem);
	if (want && !strstr(err, want))
		fail_msg("message \"%s\" does not say \"%s\"", err, want);
}

static void test_round_trip(void **state)
{
	(void)state;
	struct sample s;
	sample(&s);
	size_t len = 0;
	uint8_t *b = encoded(&s.rec, &len);
	assert_int_equal(len, tier2_record_size(5, 40, 3, 2));
	assert_memory_equal(b, "K3T2\1\0\0\0", 8);
	struct tier2_record out;
	char err[320] = "";
	assert_int_equal(tier2_record_decode(b, len, &out, err, sizeof(err)), 0);
	assert_int_equal(out.generation, s.rec.generation);
	assert_memory_equal(out.fingerprint, s.rec.fingerprint, 32);
	assert_int_equal(out.salt_len, 5);
	assert_memory_equal(out.salt, "tenan", 5);
	assert_int_equal(out.n_tokens, 40);
	assert_memory_equal(out.tokens, s.tokens, sizeof(s.tokens));
	assert_int_equal(out.n_layers, 3);
	assert_memory_equal(out.layers, s.layers, sizeof(s.layers));
	assert_int_equal(out.chunk_size, 4096);
	assert_int_equal(out.n_chunks, 2);
	assert_memory_equal(out.chunk_xxh3, s.chunks, sizeof(s.chunks));
	/* encode(decode(b)) == b */
	size_t len2 = 0;
	uint8_t *b2 = encoded(&out, &len2);
	assert_int_equal(len2, len);
	assert_memory_equal(b2, b, len);
	free(b2);
	tier2_record_free(&out);
	assert_null(out.mem);
	/* no salt */
	s.rec.salt_len = 0;
	s.rec.salt = NULL;
	free(b);
	b = encoded(&s.rec, &len);
	assert_int_equal(tier2_record_decode(b, len, &out, err, sizeof(err)), 0);
	assert_int_equal(out.salt_len, 0);
	assert_null(out.salt);
	tier2_record_free(&out);
	free(b);
}

static void test_truncated_and_trailing(void **state)
{
	(void)state;
	struct sample s;
	sample(&s);
	size_t len = 0;
	uint8_t *b = encoded(&s.rec, &len);
	for (size_t cut = 0; cut < len; cut++)
		refused(b, cut, NULL);
	refused(b, 10, "truncated");
	refused(b, OFF_NTOK + 2, "truncated: the token count");
	refused(b, OFF_NTOK + 20, "truncated: the tokens");
	uint8_t *longer = malloc(len + 1);
	memcpy(longer, b, len);
	longer[len] = 0;
	refused(longer, len + 1, "record sum"); /* the sum is read where it was */
	resum(longer, len + 1);
	refused(longer, len + 1, "trailing");
	free(longer);
	free(b);
}

static void test_counts_refused(void **state)
{
	(void)state;
	struct sample s;
	sample(&s);
	size_t len = 0;
	uint8_t *b = encoded(&s.rec, &len);
	uint8_t *c = malloc(len);
	const struct {
		size_t off;
		uint32_t v;
		const char *want;
	} cases[] = {
	        {OFF_SALT_LEN, TIER2_MAX_SALT + 1, "salt_len"},
	        {OFF_SALT_LEN, UINT32_MAX, "salt_len"},
	        {OFF_NTOK, 0, "the token count 0"},
	        {OFF_NTOK, TIER2_MAX_TOKENS + 1, "the token count"},
	        {OFF_NTOK, 41, "truncated"}, /* within the limit, past the bytes */
	        {OFF_NLAY, 0, "the layer count 0"},
	        {OFF_NLAY, TIER2_MAX_LAYERS + 1, "the layer count"},
	        {OFF_NLAY, 4, NULL}, /* the rest read shifted */
	        {OFF_CS, 0, "chunk_size 0"},
	        {OFF_CS, TIER2_CHUNK_MAX + 1, "chunk_size"},
	        {OFF_NCHUNK, 0, "the chunk count 0"},
	        {OFF_NCHUNK, TIER2_MAX_CHUNKS + 1, "the chunk count"},
	        {OFF_NCHUNK, 3, "truncated"},
	        {OFF_NCHUNK, 1, "trailing"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(c, b, len);
		put32(c + cases[i].off, cases[i].v);
		resum(c, len);
		refused(c, len, cases[i].want);
	}
	/* the chunk count must be the sizes' */
	memcpy(c, b, len);
	put32(c + OFF_CS, 8192); /* 8001 bytes in chunks of 8192: 1, not 2 */
	resum(c, len);
	refused(c, len, "2 chunks, but a stream of 8001 bytes cut every 8192 makes 1");
	/* an empty layer */
	memcpy(c, b, len);
	put64(c + OFF_LAYERS + 16, 0);
	resum(c, len);
	refused(c, len, "layer 1 of 3 has size 0");
	/* sizes whose sum overflows 64 bits, and sums past the entry limit */
	memcpy(c, b, len);
	put64(c + OFF_LAYERS, UINT64_MAX - 10);
	put64(c + OFF_LAYERS + 32, 100);
	resum(c, len);
	refused(c, len, "layer 0 of 3");
	memcpy(c, b, len);
	put64(c + OFF_LAYERS, TIER2_MAX_ENTRY_BYTES - 1000);
	put64(c + OFF_LAYERS + 32, 0x8000000000000000ull);
	resum(c, len);
	refused(c, len, "layer 2 of 3");
	/* a version, flags or magic this reader does not know */
	memcpy(c, b, len);
	c[4] = 3;
	resum(c, len);
	refused(c, len, "version 3");
	memcpy(c, b, len);
	c[4] = 0;
	resum(c, len);
	refused(c, len, "version 0");
	/* a version-1 record read as version 2: its sum is no row block */
	memcpy(c, b, len);
	c[4] = 2;
	resum(c, len);
	refused(c, len, "row_block");
	memcpy(c, b, len);
	c[6] = 1;
	resum(c, len);
	refused(c, len, "flags");
	memcpy(c, b, len);
	c[0] = 'X';
	resum(c, len);
	refused(c, len, "magic");
	free(c);
	free(b);
}

static void test_corrupted(void **state)
{
	(void)state;
	struct sample s;
	sample(&s);
	size_t len = 0;
	uint8_t *b = encoded(&s.rec, &len);
	/* any bit flipped anywhere: refused (by a check or by the sum) */
	for (size_t i = 0; i < len; i++) {
		for (int bit = 0; bit < 8; bit += 3) {
			b[i] ^= (uint8_t)(1u << bit);
			refused(b, len, NULL);
			b[i] ^= (uint8_t)(1u << bit);
		}
	}
	b[OFF_NTOK + 8] ^= 1; /* a token */
	refused(b, len, "record sum");
	free(b);
}

static void test_encode_refusals(void **state)
{
	(void)state;
	struct sample s;
	sample(&s);
	uint8_t *b = NULL;
	size_t len = 1;
	char err[256] = "";
	s.rec.n_chunks = 3;
	assert_int_equal(tier2_record_encode(&s.rec, &b, &len, err, sizeof(err)), -1);
	assert_null(b);
	assert_int_equal(len, 0);
	assert_non_null(strstr(err, "3 chunks, but a stream of 8001 bytes"));
	sample(&s);
	s.layers[1].size = 0;
	assert_int_equal(tier2_record_encode(&s.rec, &b, &len, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "layer 1 of 3 has size 0"));
	sample(&s);
	s.rec.chunk_size = TIER2_CHUNK_MAX + 1;
	assert_int_equal(tier2_record_encode(&s.rec, &b, &len, err, sizeof(err)), -1);
	sample(&s);
	s.rec.n_tokens = 0;
	assert_int_equal(tier2_record_encode(&s.rec, &b, &len, err, sizeof(err)), -1);
	assert_int_equal(tier2_chunk_count(0, 7), 0);
	assert_int_equal(tier2_chunk_count(7, 7), 1);
	assert_int_equal(tier2_chunk_count(8, 7), 2);
	assert_int_equal(tier2_chunk_count(669ull << 20, TIER2_CHUNK_MAX), 669);
}

/* ---- version 2: split MLA layers and their parts ---- */

/* The sample as version 2, row block 16: layer 1 MLA of 40 rows of 3 + 2
 * floats (813 bytes, 2 blocks), layer 2 MLA of 33 rows of 1 + 4 (673 bytes,
 * 2 blocks): 8 parts of 1280 bytes, a stream of 5206 bytes in 2 chunks. */
struct sample2 {
	struct sample s;
	struct tier2_split split[2];
	uint64_t parts[8];
};

static void sample2(struct sample2 *v)
{
	sample(&v->s);
	v->s.layers[1].size = 813;
	v->s.layers[2].size = 673;
	v->split[0] = (struct tier2_split){1, 40, 3, 2};
	v->split[1] = (struct tier2_split){2, 33, 1, 4};
	for (int i = 0; i < 8; i++)
		v->parts[i] = 0x5000u + (uint64_t)i;
	v->s.rec.version = 2;
	v->s.rec.row_block = 16;
	v->s.rec.n_split = 2;
	v->s.rec.split = v->split;
	v->s.rec.part_xxh3 = v->parts;
}

#define OFF_V2    (OFF_NCHUNK + 4u + 2u * 8u) /* row_block */
#define OFF_SPLIT (OFF_V2 + 8u)
#define OFF_PARTS (OFF_SPLIT + 2u * 16u)

static void test_v2_round_trip(void **state)
{
	(void)state;
	struct sample2 v;
	sample2(&v);
	size_t len = 0;
	uint8_t *b = encoded(&v.s.rec, &len);
	assert_int_equal(len, tier2_record_size_v2(5, 40, 3, 2, 2, 8));
	assert_int_equal(len, OFF_PARTS + 8u * 8u + 8u);
	assert_memory_equal(b, "K3T2\2\0\0\0", 8);
	assert_int_equal(tier2_stream_size(&v.s.rec), 5206);
	struct tier2_record out;
	char err[320] = "";
	if (tier2_record_decode(b, len, &out, err, sizeof(err)) != 0)
		fail_msg("decode: %s", err);
	assert_int_equal(out.version, 2);
	assert_int_equal(out.row_block, 16);
	assert_int_equal(out.n_split, 2);
	assert_memory_equal(out.split, v.split, sizeof(v.split));
	assert_memory_equal(out.part_xxh3, v.parts, sizeof(v.parts));
	assert_int_equal(out.layers[0].tag, 0);
	assert_int_equal(out.layers[1].tag, 2);
	assert_int_equal(out.layers[2].tag, 2);
	assert_int_equal(out.n_chunks, 2);
	assert_memory_equal(out.tokens, v.s.tokens, sizeof(v.s.tokens));
	size_t len2 = 0;
	uint8_t *b2 = encoded(&out, &len2);
	assert_int_equal(len2, len);
	assert_memory_equal(b2, b, len);
	free(b2);
	tier2_record_free(&out);
	/* no split layer (none as long as a block): version 2 all the same */
	v.s.rec.row_block = 64;
	v.s.rec.n_split = 0;
	assert_int_equal(tier2_stream_size(&v.s.rec), 6486); /* still 2 chunks */
	free(b);
	b = encoded(&v.s.rec, &len);
	if (tier2_record_decode(b, len, &out, err, sizeof(err)) != 0)
		fail_msg("decode: %s", err);
	assert_int_equal(out.version, 2);
	assert_int_equal(out.n_split, 0);
	tier2_record_free(&out);
	free(b);
}

static void test_v2_refusals(void **state)
{
	(void)state;
	struct sample2 v;
	sample2(&v);
	size_t len = 0;
	uint8_t *b = encoded(&v.s.rec, &len);
	/* cut at every length, with and without the sum made right */
	uint8_t *c = malloc(len + 16);
	for (size_t l = 0; l < len; l++) {
		memcpy(c, b, l);
		refused(c, l, NULL);
		if (l >= 8) {
			resum(c, l);
			refused(c, l, NULL);
		}
	}
	/* every byte changed: refused (by a check of its field, or the sum) */
	for (size_t k = 0; k < len; k++) {
		memcpy(c, b, len);
		c[k] ^= 0x10;
		refused(c, len, NULL);
	}
	struct {
		size_t off;
		uint32_t val;
		const char *want;
	} bad[] = {
	        {OFF_V2, 24, "row block 24"},
	        {OFF_V2, 8, "row_block 8"},
	        {OFF_V2, 65552, "row_block 65552"},
	        {OFF_V2, 32, "the split layers make 4"}, /* 1 block each */
	        {OFF_V2 + 4, 4, "split count 4"},
	        {OFF_V2 + 4, 1, "10 part sums, the split layers make 4"},
	        {OFF_SPLIT, 3, "split 0"},      /* no such layer */
	        {OFF_SPLIT + 16, 1, "split 1"}, /* not increasing */
	        {OFF_SPLIT + 16, 0, "split 1"},
	        {OFF_SPLIT + 4, 41, "split 0"}, /* more rows than tokens */
	        {OFF_SPLIT + 4, 8, "split 0"},  /* fewer than a block */
	        {OFF_SPLIT + 8, 4, "split 0"},  /* rows that do not make the size */
	        {OFF_SPLIT + 8, 0, "split 0"},
	        {OFF_SPLIT + 12, 0, "split 0"},
	        {OFF_SPLIT + 8, 0x80000000u, "split 0"}, /* no overflow */
	        {OFF_CS, 8192, "stream of 5206 bytes cut every 8192 makes 1"},
	        {OFF_NCHUNK, 2, NULL}, /* itself: accepted */
	};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		memcpy(c, b, len);
		put32(c + bad[k].off, bad[k].val);
		resum(c, len);
		if (!bad[k].want) {
			struct tier2_record out;
			assert_int_equal(tier2_record_decode(c, len, &out, NULL, 0), 0);
			tier2_record_free(&out);
			continue;
		}
		refused(c, len, bad[k].want);
	}
	/* a part sum more or fewer than the splits make */
	memcpy(c, b, len - 8);
	put64(c + len - 8, 0x77);
	resum(c, len + 8);
	refused(c, len + 8, "9 part sums, the split layers make 8");
	memcpy(c, b, len - 16);
	resum(c, len - 8);
	refused(c, len - 8, "7 part sums, the split layers make 8");
	memcpy(c, b, len - 8);
	resum(c, len - 5);
	refused(c, len - 5, "bytes of part sums");
	/* a version-2 record claimed as version 1: its tail is trailing */
	memcpy(c, b, len);
	c[4] = 1;
	resum(c, len);
	refused(c, len, "trailing");
	free(c);
	free(b);
}

static void test_v2_encode_refusals(void **state)
{
	(void)state;
	struct sample2 v;
	sample2(&v);
	uint8_t *b = NULL;
	size_t len = 0;
	char err[256] = "";
	v.s.rec.version = 1; /* version 1 has no row block */
	assert_int_equal(tier2_record_encode(&v.s.rec, &b, &len, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "version 1 has no row block"));
	v.s.rec.version = 3;
	assert_int_equal(tier2_record_encode(&v.s.rec, &b, &len, err, sizeof(err)), -1);
	sample2(&v);
	v.split[1].k_row = 2;
	assert_int_equal(tier2_record_encode(&v.s.rec, &b, &len, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "split 1"));
	/* more than TIER2_MAX_PARTS parts: 9 layers of 2^22 rows in blocks of
	 * 16 make 2^19 parts each */
	uint32_t n = TIER2_MAX_TOKENS;
	uint32_t *tokens = calloc(n, sizeof(*tokens));
	struct tier2_layer layers[9];
	struct tier2_split split[9];
	for (uint32_t i = 0; i < 9; i++) {
		layers[i] = (struct tier2_layer){13u + 4u * (uint64_t)n * 2u, 0, 2};
		split[i] = (struct tier2_split){i, n, 1, 1};
	}
	struct tier2_record rec = {.n_tokens = n,
	                           .tokens = tokens,
	                           .n_layers = 9,
	                           .layers = layers,
	                           .chunk_size = TIER2_CHUNK_MAX,
	                           .n_chunks = 1,
	                           .version = 2,
	                           .row_block = 16,
	                           .n_split = 9,
	                           .split = split};
	assert_int_equal(tier2_record_encode(&rec, &b, &len, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "more than 4194304 parts"));
	assert_null(b);
	free(tokens);
}

static void test_names(void **state)
{
	(void)state;
	uint8_t key[32], node[16];
	for (int i = 0; i < 32; i++)
		key[i] = (uint8_t)((i % 16) * 17);
	for (int i = 0; i < 16; i++)
		node[i] = (uint8_t)(0xf0 + i);
	char name[TIER2_NAME_MAX];
	size_t n = tier2_name_record(name, "fleet-a", key);
	assert_string_equal(name, "k3:fleet-a:e:"
	                          "00112233445566778899aabbccddeeff"
	                          "00112233445566778899aabbccddeeff");
	assert_int_equal(n, strlen(name));
	n = tier2_name_chunk(name, "fleet-a", key, 0x00000000deadbeefull, 668);
	assert_string_equal(name, "k3:fleet-a:c:"
	                          "00112233445566778899aabbccddeeff"
	                          "00112233445566778899aabbccddeeff:00000000deadbeef:668");
	assert_int_equal(n, strlen(name));
	n = tier2_name_node(name, "fleet-a", node);
	assert_string_equal(name, "k3:fleet-a:n:f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
	assert_int_equal(n, strlen(name));
	/* the longest name fits */
	char ns[TIER2_NS_MAX + 1];
	memset(ns, 'n', TIER2_NS_MAX);
	ns[TIER2_NS_MAX] = '\0';
	char err[256] = "";
	assert_int_equal(tier2_ns_check(ns, err, sizeof(err)), 0);
	n = tier2_name_chunk(name, ns, key, UINT64_MAX, UINT32_MAX);
	assert_int_equal(n, TIER2_NAME_MAX - 1);
	assert_int_equal(strlen(name), n);
	/* the chunks of one entry spread over slots: no hash tag */
	unsigned slots[64];
	int distinct = 0;
	for (uint32_t i = 0; i < 64; i++) {
		n = tier2_name_chunk(name, "fleet-a", key, 1, i);
		assert_null(strchr(name, '{'));
		slots[i] = cluster_key_slot(name, n);
		int seen = 0;
		for (uint32_t j = 0; j < i; j++)
			seen |= slots[j] == slots[i];
		distinct += !seen;
	}
	assert_true(distinct > 56);
}

static void test_namespaces(void **state)
{
	(void)state;
	char err[256] = "";
	assert_int_equal(tier2_ns_check("a", err, sizeof(err)), 0);
	assert_int_equal(tier2_ns_check("Uid-1000_x.y", err, sizeof(err)), 0);
	const char *bad[] = {"", "a:b", "{tag}", "a}", "sp ace", "nl\n", "\xc3\xa9"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(tier2_ns_check(bad[i], err, sizeof(err)), -1);
		assert_non_null(strstr(err, "namespace"));
	}
	assert_int_equal(tier2_ns_check(NULL, err, sizeof(err)), -1);
	char ns[TIER2_NS_MAX + 2];
	memset(ns, 'n', TIER2_NS_MAX + 1);
	ns[TIER2_NS_MAX + 1] = '\0';
	assert_int_equal(tier2_ns_check(ns, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "65 bytes"));
}

static void test_tail_hash(void **state)
{
	(void)state;
	uint32_t t[40];
	for (uint32_t i = 0; i < 40; i++)
		t[i] = i * 3u;
	assert_int_equal(tier2_tail_hash(t, 32, 40), XXH3_64bits(t + 32, 32));
	assert_int_equal(tier2_tail_hash(t, 32, 32), XXH3_64bits(NULL, 0));
	assert_int_not_equal(tier2_tail_hash(t, 32, 39), tier2_tail_hash(t, 32, 40));
	assert_string_equal(tier2_status_name(TIER2_DAMAGED), "damaged");
	assert_string_equal(tier2_status_name(TIER2_MISSING), "missing");
	assert_string_equal(tier2_status_name(TIER2_TIMEOUT), "timeout");
}

static void test_record_names_and_owners(void **state)
{
	(void)state;
	uint8_t key[32], back[32];
	for (int i = 0; i < 32; i++)
		key[i] = (uint8_t)(i * 37 + 5);
	char name[TIER2_NAME_MAX];
	size_t n = tier2_name_record(name, "fleet-a", key);
	assert_int_equal(tier2_parse_record_name(name, n, "fleet-a", back), 0);
	assert_memory_equal(back, key, 32);
	/* another namespace, a prefix of it, other kinds of key, lengths */
	assert_int_equal(tier2_parse_record_name(name, n, "fleet", back), -1);
	assert_int_equal(tier2_parse_record_name(name, n, "fleet-ab", back), -1);
	assert_int_equal(tier2_parse_record_name(name, n - 1, "fleet-a", back), -1);
	char longer[TIER2_NAME_MAX + 1];
	memcpy(longer, name, n);
	longer[n] = '0';
	assert_int_equal(tier2_parse_record_name(longer, n + 1, "fleet-a", back), -1);
	char other[TIER2_NAME_MAX];
	memcpy(other, name, n + 1);
	other[11] = 'c';
	assert_int_equal(tier2_parse_record_name(other, n, "fleet-a", back), -1);
	/* upper case or a stray byte in the hex: not a name tier2 makes */
	const size_t at[] = {13, 40, n - 1};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		const char subst[] = {'A', 'F', 'g', ':', '\0', '*'};
		for (size_t j = 0; j < sizeof(subst); j++) {
			memcpy(other, name, n + 1);
			if (other[at[i]] == subst[j])
				continue;
			other[at[i]] = subst[j];
			assert_int_equal(tier2_parse_record_name(other, n, "fleet-a", back), -1);
		}
	}
	assert_int_equal(tier2_parse_record_name("", 0, "fleet-a", back), -1);
	/* owners: the syntax of a namespace; the ledger's name */
	char err[256] = "";
	assert_int_equal(tier2_owner_check("host-7.dc_1", err, sizeof(err)), 0);
	const char *bad[] = {"", "a:b", "{x}", "sp ace", NULL};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(tier2_owner_check(bad[i], err, sizeof(err)), -1);
		assert_non_null(strstr(err, "owner"));
	}
	n = tier2_name_ledger(name, "fleet-a", "host-7");
	assert_string_equal(name, "k3:fleet-a:o:host-7");
	assert_int_equal(n, strlen(name));
	char ns[TIER2_NS_MAX + 1];
	memset(ns, 'n', TIER2_NS_MAX);
	ns[TIER2_NS_MAX] = '\0';
	n = tier2_name_ledger(name, ns, ns);
	assert_int_equal(n, 3 + 2 * TIER2_NS_MAX + 3);
	assert_int_equal(strlen(name), n);
}

/* One reply from RESP bytes (a bounded reader). */
static redisReply *resp(const char *bytes, size_t len)
{
	redisReader *rd = cluster_reader_new();
	assert_non_null(rd);
	assert_int_equal(redisReaderFeed(rd, bytes, len), REDIS_OK);
	void *rep = NULL;
	if (redisReaderGetReply(rd, &rep) != REDIS_OK)
		rep = NULL;
	redisReaderFree(rd);
	assert_non_null(rep);
	return rep;
}

/* A ZRANGE WITHSCORES reply: a member of 48 bytes (key of k, generation g,
 * bytes b) and its score, then extra as it is. */
static size_t zrange(char *out, uint8_t k, uint64_t g, uint64_t b, const char *score,
                     const char *extra)
{
	uint8_t m[48];
	memset(m, k, 32);
	put64(m + 32, g);
	put64(m + 40, b);
	size_t n = (size_t)sprintf(out, "$48\r\n");
	memcpy(out + n, m, 48);
	n += 48;
	n += (size_t)sprintf(out + n, "\r\n$%zu\r\n%s\r\n%s", strlen(score), score, extra);
	return n;
}

static void test_ledger_page(void **state)
{
	(void)state;
	struct tier2_owned o[4];
	size_t n = 9, pairs = 9;
	char err[256] = "", buf[512];
	/* two of ours, one member of another length (skipped) */
	size_t len = (size_t)sprintf(buf, "*6\r\n");
	len += zrange(buf + len, 0x11, 7, 1000, "1700000000000", "");
	len += (size_t)sprintf(buf + len, "$5\r\nshort\r\n$1\r\n2\r\n");
	len += zrange(buf + len, 0x22, UINT64_MAX, 1, "1.7000000000005e+12", "");
	redisReply *rep = resp(buf, len);
	assert_int_equal(tier2_ledger_parse(rep, o, 4, &n, &pairs, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_int_equal(pairs, 3);
	assert_int_equal(o[0].key[31], 0x11);
	assert_int_equal(o[0].generation, 7);
	assert_int_equal(o[0].bytes, 1000);
	assert_true(o[0].score == 1700000000000.0);
	assert_int_equal(o[1].key[0], 0x22);
	assert_int_equal(o[1].generation, UINT64_MAX);
	assert_true(o[1].score == 1700000000000.5);
	/* more pairs than the page may hold */
	assert_int_equal(tier2_ledger_parse(rep, o, 2, &n, &pairs, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "at most 2"));
	freeReplyObject(rep);
	/* empty */
	rep = resp("*0\r\n", 4);
	assert_int_equal(tier2_ledger_parse(rep, o, 4, &n, &pairs, err, sizeof(err)), 0);
	assert_int_equal(n + pairs, 0);
	freeReplyObject(rep);
	/* refusals */
	const struct {
		const char *resp, *want;
	} bad[] = {
	        {"-WRONGTYPE Operation\r\n", "not an array"},
	        {":3\r\n", "not an array"},
	        {"*1\r\n$1\r\na\r\n", "want pairs"},
	        {"*2\r\n:1\r\n$1\r\n2\r\n", "pair 0"},
	        {"*2\r\n$1\r\na\r\n:2\r\n", "pair 0"},
	        {"*2\r\n$1\r\na\r\n$0\r\n\r\n", "pair 0"},
	        {"*2\r\n$1\r\na\r\n$3\r\nnan\r\n", "pair 0"},
	        {"*2\r\n$1\r\na\r\n$2\r\n1x\r\n", "pair 0"},
	        {"*2\r\n$1\r\na\r\n$-1\r\n", "pair 0"},
	        {"*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n*0\r\n", "pair 1"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rep = resp(bad[i].resp, strlen(bad[i].resp));
		err[0] = '\0';
		n = pairs = 9;
		if (tier2_ledger_parse(rep, o, 4, &n, &pairs, err, sizeof(err)) != -1)
			fail_msg("reply %zu accepted", i);
		if (!strstr(err, bad[i].want))
			fail_msg("reply %zu: \"%s\" does not say \"%s\"", i, err, bad[i].want);
		assert_int_equal(n, 0);
		freeReplyObject(rep);
	}
	assert_int_equal(tier2_ledger_parse(NULL, o, 4, &n, &pairs, err, sizeof(err)), -1);
	/* a score too long to be one */
	len = (size_t)sprintf(buf, "*2\r\n$1\r\na\r\n$70\r\n");
	memset(buf + len, '1', 70);
	len += 70;
	len += (size_t)sprintf(buf + len, "\r\n");
	rep = resp(buf, len);
	assert_int_equal(tier2_ledger_parse(rep, o, 4, &n, &pairs, err, sizeof(err)), -1);
	freeReplyObject(rep);
}

/* RESP of one bulk string of len bytes at out. */
static size_t bulk(char *out, const void *b, size_t len)
{
	size_t n = (size_t)sprintf(out, "$%zu\r\n", len);
	memcpy(out + n, b, len);
	n += len;
	return n + (size_t)sprintf(out + n, "\r\n");
}

static void test_intent(void **state)
{
	(void)state;
	unsigned char head[TIER2_INTENT_HEAD_LEN], el[TIER2_INTENT_PART_LEN];
	uint32_t cs = 0, n = 0;
	tier2_intent_head_encode(head, 65536, 669);
	assert_memory_equal(head, "K3TI", 4);
	assert_int_equal(tier2_intent_head_decode(head, sizeof(head), &cs, &n), 0);
	assert_int_equal(cs, 65536);
	assert_int_equal(n, 669);
	assert_int_equal(tier2_intent_head_decode(head, sizeof(head) - 1, &cs, &n), -1);
	assert_int_equal(tier2_intent_head_decode(NULL, sizeof(head), &cs, &n), -1);
	const uint32_t bad_head[][2] = {
	        {0, 1}, {TIER2_CHUNK_MAX + 1, 1}, {4096, TIER2_MAX_CHUNKS + 1}};
	for (size_t i = 0; i < sizeof(bad_head) / sizeof(bad_head[0]); i++) {
		tier2_intent_head_encode(head, bad_head[i][0], bad_head[i][1]);
		if (tier2_intent_head_decode(head, sizeof(head), &cs, &n) != -1)
			fail_msg("header %zu accepted", i);
	}
	tier2_intent_head_encode(head, 65536, 669);
	head[0] = 'X';
	assert_int_equal(tier2_intent_head_decode(head, sizeof(head), &cs, &n), -1);

	struct tier2_intent_part p = {.layer = 7, .part = 1, .xxh3 = UINT64_MAX - 3, .size = 65536},
	                         q;
	memset(p.node, 0xa5, sizeof(p.node));
	tier2_intent_part_encode(el, &p);
	assert_int_equal(tier2_intent_part_decode(el, sizeof(el), &q), 0);
	assert_memory_equal(&p, &q, sizeof(p));
	assert_int_equal(tier2_intent_part_decode(el, sizeof(el) + 1, &q), -1);
	const struct tier2_intent_part bad_part[] = {
	        {.layer = TIER2_MAX_LAYERS, .part = 0, .size = 1},
	        {.layer = 0, .part = 2, .size = 1},
	        {.layer = 0, .part = 0, .size = 0},
	        {.layer = 0, .part = 0, .size = (uint64_t)TIER2_PART_MAX + 1}};
	for (size_t i = 0; i < sizeof(bad_part) / sizeof(bad_part[0]); i++) {
		tier2_intent_part_encode(el, &bad_part[i]);
		if (tier2_intent_part_decode(el, sizeof(el), &q) != -1)
			fail_msg("part %zu accepted", i);
	}

	/* the replaced generation */
	unsigned char old[TIER2_INTENT_OLD_LEN];
	uint64_t og = 0;
	uint32_t oc = 0, on = 0;
	tier2_intent_old_encode(old, 0x1122334455667788ull, 65536, 77);
	assert_int_equal(tier2_intent_old_decode(old, sizeof(old), &og, &oc, &on), 0);
	assert_true(og == 0x1122334455667788ull && oc == 65536 && on == 77);
	assert_int_equal(tier2_intent_old_decode(old, sizeof(old) - 1, &og, &oc, &on), -1);
	tier2_intent_old_encode(old, 1, 65536, TIER2_MAX_CHUNKS + 1);
	assert_int_equal(tier2_intent_old_decode(old, sizeof(old), &og, &oc, &on), -1);
	tier2_intent_old_encode(old, 1, 0, 1);
	assert_int_equal(tier2_intent_old_decode(old, sizeof(old), &og, &oc, &on), -1);
	tier2_intent_old_encode(old, 1, TIER2_CHUNK_MAX + 1, 1);
	assert_int_equal(tier2_intent_old_decode(old, sizeof(old), &og, &oc, &on), -1);
	tier2_intent_old_encode(old, 0x1122334455667788ull, 65536, 77);

	/* a first page: the header, a part, an element of another form
	 * (skipped), the replaced generation, another part */
	struct tier2_intent_part got[5];
	struct tier2_intent_info info = {0};
	size_t gn = 9, elems = 9;
	char err[256] = "", buf[1024];
	tier2_intent_head_encode(head, 4096, 30);
	tier2_intent_part_encode(el, &p);
	size_t len = (size_t)sprintf(buf, "*5\r\n");
	len += bulk(buf + len, head, sizeof(head));
	len += bulk(buf + len, el, sizeof(el));
	len += bulk(buf + len, "odd", 3);
	len += bulk(buf + len, old, sizeof(old));
	len += bulk(buf + len, el, sizeof(el));
	redisReply *rep = resp(buf, len);
	assert_int_equal(tier2_intent_parse(rep, 1, &info, got, 5, &gn, &elems, err, sizeof(err)),
	                 0);
	assert_true(info.have_head && info.chunk_size == 4096 && info.n_chunks == 30);
	assert_true(info.have_old && info.old_gen == 0x1122334455667788ull &&
	            info.old_chunk_size == 65536 && info.old_n_chunks == 77);
	assert_int_equal(gn, 2);
	assert_int_equal(elems, 5);
	assert_memory_equal(&got[1], &p, sizeof(p));
	/* the same as a later page: a header there is not one */
	memset(&info, 0, sizeof(info));
	assert_int_equal(tier2_intent_parse(rep, 0, &info, got, 5, &gn, &elems, err, sizeof(err)),
	                 0);
	assert_int_equal(gn, 2);
	assert_false(info.have_head);
	assert_true(info.have_old);
	/* more than the page holds */
	assert_int_equal(tier2_intent_parse(rep, 1, &info, got, 4, &gn, &elems, err, sizeof(err)),
	                 -1);
	assert_int_equal(gn, 0);
	assert_non_null(strstr(err, "at most 4"));
	freeReplyObject(rep);
	/* a first page without a header (the intent evicted, then appended to):
	 * its parts all the same */
	memset(&info, 0, sizeof(info));
	len = (size_t)sprintf(buf, "*2\r\n");
	len += bulk(buf + len, el, sizeof(el));
	len += bulk(buf + len, el, sizeof(el));
	rep = resp(buf, len);
	assert_int_equal(tier2_intent_parse(rep, 1, &info, got, 5, &gn, &elems, err, sizeof(err)),
	                 0);
	assert_false(info.have_head);
	assert_int_equal(gn, 2);
	freeReplyObject(rep);
	/* elements that are not strings are passed over */
	rep = resp("*2\r\n:1\r\n*0\r\n", 12);
	assert_int_equal(tier2_intent_parse(rep, 1, &info, got, 5, &gn, &elems, err, sizeof(err)),
	                 0);
	assert_int_equal(gn, 0);
	assert_int_equal(elems, 2);
	freeReplyObject(rep);
	const char *bad[] = {"-WRONGTYPE Operation\r\n", ":3\r\n", "$3\r\nabc\r\n", "$-1\r\n"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rep = resp(bad[i], strlen(bad[i]));
		if (tier2_intent_parse(rep, 1, &info, got, 5, &gn, &elems, err, sizeof(err)) != -1)
			fail_msg("reply %zu accepted", i);
		freeReplyObject(rep);
	}
	assert_int_equal(tier2_intent_parse(NULL, 1, &info, got, 5, &gn, &elems, err, sizeof(err)),
	                 -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_round_trip),
	        cmocka_unit_test(test_truncated_and_trailing),
	        cmocka_unit_test(test_counts_refused),
	        cmocka_unit_test(test_corrupted),
	        cmocka_unit_test(test_encode_refusals),
	        cmocka_unit_test(test_v2_round_trip),
	        cmocka_unit_test(test_v2_refusals),
	        cmocka_unit_test(test_v2_encode_refusals),
	        cmocka_unit_test(test_names),
	        cmocka_unit_test(test_namespaces),
	        cmocka_unit_test(test_tail_hash),
	        cmocka_unit_test(test_record_names_and_owners),
	        cmocka_unit_test(test_ledger_page),
	        cmocka_unit_test(test_intent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
