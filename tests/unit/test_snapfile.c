/* snapfile: a snapshot file round-trips, its header keeps the bytes
 * k3cachectl has always written, and the parser refuses truncated, trailing,
 * oversized and corrupted files, each with its own class. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "hexutil.h"
#include "prefix.h"
#include "snapfile.h"
#include "storeutil.h"

#define P 5

static const uint32_t tokens[P] = {1, 2, 3, 4, 5};

/* A whole file: the encoded header, then the snapshot's blobs. */
struct file {
	unsigned char *bytes;
	size_t len, hlen; /* hlen: the prelude and the header */
};

struct fixture {
	struct k3cache_model *model;
	struct storeutil_snap snap;
	struct snapfile_layer layers[4];
	struct snapfile s;
	struct file f;
};

static struct file file_of(const struct snapfile *s)
{
	struct file f;
	struct snapfile_error err;
	if (snapfile_encode_header(s, &f.bytes, &f.hlen, &err) != SNAPFILE_OK)
		fail_msg("encode: %s", err.message);
	f.len = f.hlen;
	for (uint32_t i = 0; i < s->n_layers; i++)
		f.len += s->layers[i].size;
	f.bytes = realloc(f.bytes, f.len);
	assert_non_null(f.bytes);
	size_t off = f.hlen;
	for (uint32_t i = 0; i < s->n_layers; i++) {
		memcpy(f.bytes + off, s->layers[i].data, s->layers[i].size);
		off += s->layers[i].size;
	}
	return f;
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	assert_non_null(fx);
	fx->model = storeutil_model("snapfile-test", 16);
	fx->snap = storeutil_snap(fx->model, P, 7);
	for (uint32_t i = 0; i < 4; i++)
		fx->layers[i] = (struct snapfile_layer){
		        fx->snap.blobs[i].data, fx->snap.blobs[i].size, fx->snap.blobs[i].xxh3};
	fx->s = (struct snapfile){.model = fx->model,
	                          .salt = (uint8_t *)"tenant",
	                          .salt_len = 6,
	                          .tokens = (uint32_t *)tokens,
	                          .n_tokens = P,
	                          .layers = fx->layers,
	                          .n_layers = 4,
	                          .created = 1764000000};
	assert_int_equal(prefix_key(fx->model->fingerprint, fx->s.salt, fx->s.salt_len, tokens, P,
	                            fx->s.key),
	                 0);
	fx->f = file_of(&fx->s);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	free(fx->f.bytes);
	storeutil_snap_free(&fx->snap);
	model_free(fx->model);
	free(fx);
	return 0;
}

/* Parses and expects class `want`; a refused parse leaves nothing behind. */
static void expect_class(const unsigned char *b, size_t len, enum snapfile_class want,
                         const char *words)
{
	struct snapfile s;
	struct snapfile_error err = {0};
	enum snapfile_class got = snapfile_parse(b, len, &s, &err);
	if (got != want)
		fail_msg("parse of %zu bytes: %s (%s), want %s", len, snapfile_class_name(got),
		         got ? err.message : "", snapfile_class_name(want));
	if (got == SNAPFILE_OK) {
		snapfile_free(&s);
		return;
	}
	assert_int_equal(err.cls, want);
	if (words && !strstr(err.message, words))
		fail_msg("message \"%s\" does not say \"%s\"", err.message, words);
	assert_null(s.model);
	assert_null(s.tokens);
	assert_null(s.salt);
	assert_null(s.layers);
}

/* The file with the first `from` of its header replaced by `to`, and the
 * header's length fixed. */
static struct file rewrite(const struct file *f, const char *from, const char *to)
{
	char *hdr = strndup((const char *)f->bytes + SNAPFILE_PRELUDE_LEN,
	                    f->hlen - SNAPFILE_PRELUDE_LEN);
	assert_non_null(hdr);
	char *at = strstr(hdr, from);
	if (!at) { /* the test's own mistake */
		print_error("the header has no \"%s\": %s\n", from, hdr);
		abort();
	}
	*at = '\0';
	char *text = NULL;
	int hlen = asprintf(&text, "%s%s%s", hdr, to, at + strlen(from));
	assert_true(hlen >= 0);
	struct file out = {.hlen = SNAPFILE_PRELUDE_LEN + (size_t)hlen};
	out.len = f->len - f->hlen + out.hlen;
	out.bytes = malloc(out.len);
	assert_non_null(out.bytes);
	memcpy(out.bytes, f->bytes, SNAPFILE_MAGIC_LEN);
	for (unsigned i = 0; i < 4; i++)
		out.bytes[SNAPFILE_MAGIC_LEN + i] = (unsigned char)((unsigned)hlen >> (8 * i));
	memcpy(out.bytes + SNAPFILE_PRELUDE_LEN, text, (size_t)hlen);
	free(text);
	memcpy(out.bytes + out.hlen, f->bytes + f->hlen, f->len - f->hlen);
	free(hdr);
	return out;
}

static void expect_rewritten(const struct file *f, const char *from, const char *to,
                             enum snapfile_class want, const char *words)
{
	struct file g = rewrite(f, from, to);
	expect_class(g.bytes, g.len, want, words);
	free(g.bytes);
}

static void test_round_trip(void **state)
{
	struct fixture *fx = *state;
	struct snapfile s;
	struct snapfile_error err;
	assert_int_equal(snapfile_parse(fx->f.bytes, fx->f.len, &s, &err), SNAPFILE_OK);
	assert_memory_equal(s.key, fx->s.key, 32);
	assert_memory_equal(s.model->fingerprint, fx->model->fingerprint, 32);
	assert_string_equal(s.model->name, "snapfile-test");
	assert_int_equal(s.salt_len, 6);
	assert_memory_equal(s.salt, "tenant", 6);
	assert_int_equal(s.n_tokens, P);
	assert_memory_equal(s.tokens, tokens, sizeof(tokens));
	assert_int_equal(s.created, 1764000000);
	assert_int_equal(s.n_layers, 4);
	size_t off = fx->f.hlen;
	for (uint32_t i = 0; i < 4; i++) {
		assert_ptr_equal(s.layers[i].data, fx->f.bytes + off); /* no copy */
		assert_int_equal(s.layers[i].size, fx->layers[i].size);
		assert_int_equal(s.layers[i].xxh3, fx->layers[i].xxh3);
		assert_memory_equal(s.layers[i].data, fx->layers[i].data, fx->layers[i].size);
		off += fx->layers[i].size;
	}
	/* what was read writes back to the same bytes */
	struct file again = file_of(&s);
	assert_int_equal(again.len, fx->f.len);
	assert_memory_equal(again.bytes, fx->f.bytes, fx->f.len);
	free(again.bytes);
	snapfile_free(&s);
	assert_null(s.model);
}

static void test_round_trip_without_salt(void **state)
{
	struct fixture *fx = *state;
	struct snapfile in = fx->s;
	in.salt = NULL;
	in.salt_len = 0;
	assert_int_equal(prefix_key(fx->model->fingerprint, "", 0, tokens, P, in.key), 0);
	struct file f = file_of(&in);
	struct snapfile s;
	assert_int_equal(snapfile_parse(f.bytes, f.len, &s, NULL), SNAPFILE_OK);
	assert_int_equal(s.salt_len, 0);
	assert_memory_equal(s.key, in.key, 32);
	snapfile_free(&s);
	free(f.bytes);
}

/* The layout k3cachectl has always written: magic, u32 LE length, compact
 * JSON with its keys in this order, layer records as {"index","size","xxh3"}. */
static void test_header_bytes(void **state)
{
	struct fixture *fx = *state;
	const unsigned char *b = fx->f.bytes;
	assert_memory_equal(b, "K3SNAP1\n", 8);
	uint32_t hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 |
	                (uint32_t)b[11] << 24;
	assert_int_equal(hlen, fx->f.hlen - 12);
	char *hdr = strndup((const char *)b + 12, hlen);
	assert_non_null(hdr);
	char key[65], want[256];
	hexutil_encode(fx->s.key, 32, key);
	snprintf(want, sizeof(want), "{\"format\":1,\"key\":\"%s\",\"fingerprint\":\"", key);
	assert_memory_equal(hdr, want, strlen(want));
	static const char *const order[] = {"\"model\":{\"name\":\"snapfile-test\"",
	                                    "\"salt\":\"74656e616e74\"",
	                                    "\"prefix_len\":5",
	                                    "\"tokens\":[1,2,3,4,5]",
	                                    "\"layers\":[{\"index\":0,\"size\":",
	                                    "\"created\":1764000000}"};
	const char *at = hdr;
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		const char *next = strstr(at, order[i]);
		if (!next) {
			fail_msg("\"%s\" is missing or out of order in %s", order[i], hdr);
			break;
		}
		at = next;
	}
	snprintf(want, sizeof(want), "{\"index\":3,\"size\":%zu,\"xxh3\":\"%016llx\"}]",
	         (size_t)fx->layers[3].size, (unsigned long long)fx->layers[3].xxh3);
	assert_non_null(strstr(hdr, want));
	assert_int_equal(hdr[hlen - 1], '}');
	free(hdr);
}

static void test_truncated(void **state)
{
	struct fixture *fx = *state;
	/* every cut, from nothing to one byte short */
	for (size_t len = 0; len < fx->f.len; len++)
		expect_class(fx->f.bytes, len,
		             len < SNAPFILE_MAGIC_LEN ? SNAPFILE_ERR_MAGIC : SNAPFILE_ERR_TRUNCATED,
		             NULL);
	expect_class(fx->f.bytes, 10, SNAPFILE_ERR_TRUNCATED, "inside its header's length");
	expect_class(fx->f.bytes, fx->f.hlen - 1, SNAPFILE_ERR_TRUNCATED,
	             "runs past the end of the file");
	expect_class(fx->f.bytes, fx->f.len - 1, SNAPFILE_ERR_TRUNCATED,
	             "layer 3: truncated: the file ends before its bytes do");
}

static void test_trailing(void **state)
{
	struct fixture *fx = *state;
	size_t extra = fx->layers[0].size;
	unsigned char *b = malloc(fx->f.len + extra);
	memcpy(b, fx->f.bytes, fx->f.len);
	memcpy(b + fx->f.len, fx->layers[0].data, extra);
	expect_class(b, fx->f.len + 1, SNAPFILE_ERR_TRAILING, "after the last layer (1 byte)");
	expect_class(b, fx->f.len + extra, SNAPFILE_ERR_TRAILING,
	             "trailing bytes after the last layer");
	free(b);
}

static void test_oversized(void **state)
{
	struct fixture *fx = *state;
	unsigned char *b = malloc(fx->f.len);
	memcpy(b, fx->f.bytes, fx->f.len);
	/* header lengths: over the limit, all ones, one past the file */
	static const uint32_t lens[] = {SNAPFILE_MAX_HEADER + 1, UINT32_MAX};
	for (size_t i = 0; i < 2; i++) {
		for (unsigned k = 0; k < 4; k++)
			b[8 + k] = (unsigned char)(lens[i] >> (8 * k));
		expect_class(b, fx->f.len, SNAPFILE_ERR_TOO_LARGE, "over the 64 MiB limit");
	}
	uint32_t past = (uint32_t)(fx->f.len - SNAPFILE_PRELUDE_LEN + 1);
	for (unsigned k = 0; k < 4; k++)
		b[8 + k] = (unsigned char)(past >> (8 * k));
	expect_class(b, fx->f.len, SNAPFILE_ERR_TRUNCATED, "runs past the end");
	free(b);

	/* absurd layer sizes: past the file, past what 64 bits subtract to,
	 * past json_int_t, zero, negative */
	char from[64], to[64], from2[64], to2[64];
	snprintf(from, sizeof(from), "{\"index\":1,\"size\":%zu,", (size_t)fx->layers[1].size);
	expect_rewritten(&fx->f, from, "{\"index\":1,\"size\":4611686018427387904,",
	                 SNAPFILE_ERR_TRUNCATED, "layer 1: truncated");
	expect_rewritten(&fx->f, from, "{\"index\":1,\"size\":9223372036854775807,",
	                 SNAPFILE_ERR_TRUNCATED, "layer 1: truncated");
	expect_rewritten(&fx->f, from, "{\"index\":1,\"size\":18446744073709551616,",
	                 SNAPFILE_ERR_HEADER, "not valid JSON");
	expect_rewritten(&fx->f, from, "{\"index\":1,\"size\":0,", SNAPFILE_ERR_LAYERS,
	                 "layer 1: bad layer record");
	expect_rewritten(&fx->f, from, "{\"index\":1,\"size\":-1,", SNAPFILE_ERR_LAYERS,
	                 "layer 1: bad layer record");
	/* one layer a byte longer, the next a byte shorter: the sizes add up,
	 * the checksums do not */
	snprintf(to, sizeof(to), "{\"index\":1,\"size\":%zu,", (size_t)fx->layers[1].size + 1);
	snprintf(from2, sizeof(from2), "{\"index\":2,\"size\":%zu,", (size_t)fx->layers[2].size);
	snprintf(to2, sizeof(to2), "{\"index\":2,\"size\":%zu,", (size_t)fx->layers[2].size - 1);
	struct file g = rewrite(&fx->f, from, to);
	expect_rewritten(&g, from2, to2, SNAPFILE_ERR_CHECKSUM, "layer 1: checksum mismatch");
	free(g.bytes);

	/* a salt over what a store holds, either way */
	char salt[2 * SNAPFILE_MAX_SALT + 16];
	snprintf(salt, sizeof(salt), "\"salt\":\"%0*d\"", 2 * SNAPFILE_MAX_SALT + 2, 0);
	expect_rewritten(&fx->f, "\"salt\":\"74656e616e74\"", salt, SNAPFILE_ERR_TOO_LARGE,
	                 "over the 1024 bytes");
	struct snapfile big = fx->s;
	uint8_t longsalt[SNAPFILE_MAX_SALT + 1] = {0};
	big.salt = longsalt;
	big.salt_len = sizeof(longsalt);
	unsigned char untouched = 0, *out = &untouched;
	size_t len = 1;
	struct snapfile_error err;
	assert_int_equal(snapfile_encode_header(&big, &out, &len, &err), SNAPFILE_ERR_TOO_LARGE);
	assert_null(out);
	assert_int_equal(len, 0);
}

static void test_corrupted_header(void **state)
{
	struct fixture *fx = *state;
	struct file *f = &fx->f;
	unsigned char *b = malloc(f->len);
	memcpy(b, f->bytes, f->len);
	b[3] ^= 1;
	expect_class(b, f->len, SNAPFILE_ERR_MAGIC, "no K3SNAP1 header");
	memcpy(b, f->bytes, f->len);
	b[SNAPFILE_PRELUDE_LEN] = '[';
	expect_class(b, f->len, SNAPFILE_ERR_HEADER, "not valid JSON");
	free(b);

	char key[65], keypat[80], other[80];
	hexutil_encode(fx->s.key, 32, key);
	expect_rewritten(f, "{\"format\":1,", "[", SNAPFILE_ERR_HEADER, "not valid JSON");
	expect_rewritten(f, "\"format\":1", "\"format\":2", SNAPFILE_ERR_HEADER, "not 1");
	expect_rewritten(f, "\"format\":1,", "", SNAPFILE_ERR_HEADER, "\"format\"");
	expect_rewritten(f, "\"format\":1,", "\"format\":1,\"format\":1,", SNAPFILE_ERR_HEADER,
	                 "duplicate");
	/* the key's last digit changed */
	snprintf(keypat, sizeof(keypat), "\"key\":\"%s\"", key);
	snprintf(other, sizeof(other), "\"key\":\"%.63s%c\"", key, key[63] == '0' ? '1' : '0');
	expect_rewritten(f, keypat, other, SNAPFILE_ERR_KEY, "its key does not match");
	expect_rewritten(f, keypat, "\"key\":\"abc\"", SNAPFILE_ERR_HEADER, "\"key\"");
	expect_rewritten(f, "\"fingerprint\":\"", "\"fingerprint\":\"0", SNAPFILE_ERR_HEADER,
	                 "\"fingerprint\" is not 64 hex digits");
	/* the spec changed under its fingerprint, or made invalid */
	expect_rewritten(f, "\"conv_len\":12", "\"conv_len\":13", SNAPFILE_ERR_MODEL,
	                 "does not match its fingerprint");
	expect_rewritten(f, "\"mixer\":\"kda\"", "\"mixer\":\"rnn\"", SNAPFILE_ERR_MODEL,
	                 "its model spec is invalid");
	expect_rewritten(f, "\"model\":{", "\"model\":[{", SNAPFILE_ERR_HEADER, "not valid JSON");
	/* salt, tokens, prefix_len, created */
	expect_rewritten(f, "\"salt\":\"74656e616e74\"", "\"salt\":\"74656e616e7\"",
	                 SNAPFILE_ERR_HEADER, "its salt is not hex");
	expect_rewritten(f, "\"salt\":\"74656e616e74\"", "\"salt\":\"74656e616e75\"",
	                 SNAPFILE_ERR_KEY, NULL);
	expect_rewritten(f, "\"tokens\":[1,", "\"tokens\":[-1,", SNAPFILE_ERR_HEADER, "token 0");
	expect_rewritten(f, "\"tokens\":[1,", "\"tokens\":[4294967296,", SNAPFILE_ERR_HEADER,
	                 "token 0 is not a whole number");
	expect_rewritten(f, "\"tokens\":[1,", "\"tokens\":[\"1\",", SNAPFILE_ERR_HEADER, "token 0");
	expect_rewritten(f, "\"tokens\":[1,2,3,4,5]", "\"tokens\":[]", SNAPFILE_ERR_HEADER,
	                 "1 or more tokens");
	expect_rewritten(f, "\"tokens\":[1,2,3,4,5]", "\"tokens\":[1,2,3,4,6]", SNAPFILE_ERR_KEY,
	                 NULL);
	expect_rewritten(f, "\"prefix_len\":5", "\"prefix_len\":4", SNAPFILE_ERR_HEADER,
	                 "\"prefix_len\"");
	expect_rewritten(f, "\"created\":1764000000", "\"created\":-1", SNAPFILE_ERR_HEADER,
	                 "\"created\"");
}

static void test_corrupted_layers(void **state)
{
	struct fixture *fx = *state;
	struct file *f = &fx->f;
	char from[96], to[96];
	expect_rewritten(f, "{\"index\":0,", "{\"index\":1,", SNAPFILE_ERR_LAYERS,
	                 "layer 0: bad layer record");
	snprintf(from, sizeof(from), "\"xxh3\":\"%016llx\"",
	         (unsigned long long)fx->layers[2].xxh3);
	expect_rewritten(f, from, "\"xxh3\":\"xyz\"", SNAPFILE_ERR_LAYERS, "layer 2: bad");
	snprintf(to, sizeof(to), "\"xxh3\":\"%016llx\"",
	         (unsigned long long)(fx->layers[2].xxh3 ^ 1));
	expect_rewritten(f, from, to, SNAPFILE_ERR_CHECKSUM, "layer 2: checksum mismatch");
	/* a layer record dropped: 3 layers for a model of 4 */
	snprintf(from, sizeof(from), ",{\"index\":3,\"size\":%zu,\"xxh3\":\"%016llx\"}",
	         (size_t)fx->layers[3].size, (unsigned long long)fx->layers[3].xxh3);
	expect_rewritten(f, from, "", SNAPFILE_ERR_LAYERS, "3 layers for a model of 4");
	expect_rewritten(f, "\"layers\":[", "\"layers\":{\"x\":[", SNAPFILE_ERR_HEADER,
	                 "not valid JSON");

	/* every byte of every blob flipped in turn: a checksum catches each */
	unsigned char *b = malloc(f->len);
	for (size_t at = f->hlen; at < f->len; at++) {
		memcpy(b, f->bytes, f->len);
		b[at] ^= 0x40;
		expect_class(b, f->len, SNAPFILE_ERR_CHECKSUM, "checksum mismatch");
	}
	free(b);
}

/* Blobs whose checksums match but that are not their layer of the spec. */
static void test_invalid_blobs(void **state)
{
	struct fixture *fx = *state;
	/* layer 0 from a model whose KDA state is larger: shape */
	struct k3cache_model *wide = storeutil_model("wide", 20);
	struct storeutil_snap ws = storeutil_snap(wide, P, 7);
	struct snapfile s = fx->s;
	struct snapfile_layer layers[4];
	memcpy(layers, fx->layers, sizeof(layers));
	layers[0] = (struct snapfile_layer){ws.blobs[0].data, ws.blobs[0].size, ws.blobs[0].xxh3};
	s.layers = layers;
	struct file g = file_of(&s);
	expect_class(g.bytes, g.len, SNAPFILE_ERR_BLOB, "(shape)");
	free(g.bytes);
	/* an MLA blob in a KDA slot: slot */
	layers[0] = (struct snapfile_layer){
	        fx->layers[2].data, fx->layers[2].size,
	        checksum_blob(fx->layers[2].data, (size_t)fx->layers[2].size, 0)};
	g = file_of(&s);
	expect_class(g.bytes, g.len, SNAPFILE_ERR_BLOB, "(slot)");
	free(g.bytes);
	/* a NaN in a recurrent state: nonfinite */
	unsigned char *nan = malloc(fx->layers[1].size);
	memcpy(nan, fx->layers[1].data, fx->layers[1].size);
	static const unsigned char qnan[4] = {0, 0, 0xc0, 0x7f};
	memcpy(nan + fx->layers[1].size - 4, qnan, 4);
	memcpy(layers, fx->layers, sizeof(layers));
	layers[1] = (struct snapfile_layer){nan, fx->layers[1].size,
	                                    checksum_blob(nan, (size_t)fx->layers[1].size, 1)};
	g = file_of(&s);
	expect_class(g.bytes, g.len, SNAPFILE_ERR_BLOB, "(nonfinite)");
	free(g.bytes);
	free(nan);
	storeutil_snap_free(&ws);
	model_free(wide);
}

/* parse_layout then check_layer: the layout accepts a file whose blob is
 * damaged; the layer's check refuses it; parse refuses it whole. */
static void test_two_steps(void **state)
{
	struct fixture *fx = *state;
	unsigned char *b = malloc(fx->f.len);
	memcpy(b, fx->f.bytes, fx->f.len);
	b[fx->f.len - 1] ^= 1; /* the last layer's last byte */
	struct snapfile s;
	struct snapfile_error err;
	assert_int_equal(snapfile_parse_layout(b, fx->f.len, &s, &err), SNAPFILE_OK);
	assert_int_equal(s.n_layers, 4);
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(snapfile_check_layer(&s, i, &err), SNAPFILE_OK);
	assert_int_equal(snapfile_check_layer(&s, 3, &err), SNAPFILE_ERR_CHECKSUM);
	assert_non_null(strstr(err.message, "layer 3: checksum mismatch"));
	snapfile_free(&s);
	expect_class(b, fx->f.len, SNAPFILE_ERR_CHECKSUM, "layer 3");
	/* the layout alone still refuses what is not about the blobs' bytes */
	expect_class(b, fx->f.len - 1, SNAPFILE_ERR_TRUNCATED, NULL);
	assert_int_equal(snapfile_parse_layout(b, fx->f.len - 1, &s, NULL), SNAPFILE_ERR_TRUNCATED);
	assert_null(s.layers);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_round_trip_without_salt, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_header_bytes, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_trailing, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_corrupted_header, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_corrupted_layers, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_invalid_blobs, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_two_steps, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
