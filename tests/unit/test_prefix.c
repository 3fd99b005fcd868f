/* Entry keys against the fixture, and the chained block hashes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <openssl/crypto.h>

#include "hashwrap.h"
#include "hexutil.h"
#include "model.h"
#include "prefix.h"
#include "testutil.h"
#include "units.h"

/* A fixture's "1,2,3": every item a u32, none empty (a malformed row fails
 * the test instead of being read as other tokens). */
static uint32_t parse_tokens(char *list, uint32_t *out, uint32_t cap)
{
	uint32_t n = 0;
	for (char *t = list, *next; t; t = next) {
		next = strchr(t, ',');
		if (next)
			*next++ = '\0';
		uint64_t v;
		if (units_parse_uint(t, 0, UINT32_MAX, &v) != 0)
			fail_msg("fixture token %u (\"%s\") is not a u32", n, t);
		assert_true(n < cap);
		out[n++] = (uint32_t)v;
	}
	return n;
}

static void test_keys_match_fixture(void **state)
{
	(void)state;
	char *rows[TESTUTIL_MAX_ROWS][TESTUTIL_MAX_COLS];
	int n, seen = 0;
	char *text = testutil_tsv("models/FINGERPRINTS.tsv", rows, &n);
	for (int i = 0; i < n; i++) {
		if (strcmp(rows[i][0], "key") != 0)
			continue;
		char path[1024], err[MODEL_ERROR_MAX], hex[65];
		snprintf(path, sizeof(path), "%s/models/%s", K3_SHARED_DIR, rows[i][1]);
		struct k3cache_model *m = model_load_file(path, err);
		assert_non_null(m);
		uint32_t toks[1024];
		uint32_t nt = parse_tokens(rows[i][3], toks, 1024);
		uint8_t key[PREFIX_KEY_LEN];
		prefix_key(m->fingerprint, rows[i][2], strlen(rows[i][2]), toks, nt, key);
		hexutil_encode(key, sizeof(key), hex);
		assert_string_equal(hex, rows[i][4]);
		seen++;
		model_free(m);
	}
	assert_int_equal(seen, 4);
	free(text);
}

static void test_block_hashes_chain(void **state)
{
	(void)state;
	uint8_t fp[32] = {1, 2, 3};
	uint32_t a[64], b[64];
	for (uint32_t i = 0; i < 64; i++)
		a[i] = b[i] = i * 7;
	b[40] = 999; /* diverges in block 2 */
	uint8_t ha[5][PREFIX_NODE_LEN], hb[5][PREFIX_NODE_LEN];
	assert_int_equal(prefix_block_hashes(fp, "", 0, a, 64, ha), 4);
	assert_int_equal(prefix_block_hashes(fp, "", 0, b, 63, hb), 3); /* only full blocks */
	assert_memory_equal(ha[0], hb[0], PREFIX_NODE_LEN);             /* the root */
	assert_memory_equal(ha[1], hb[1], PREFIX_NODE_LEN);
	assert_memory_equal(ha[2], hb[2], PREFIX_NODE_LEN);
	assert_memory_not_equal(ha[3], hb[3], PREFIX_NODE_LEN);
	/* chaining: block 4 is equal in both, but its node differs */
	prefix_block_hashes(fp, "", 0, b, 64, hb);
	assert_memory_not_equal(ha[4], hb[4], PREFIX_NODE_LEN);
	/* salt and model separate the chains */
	uint8_t hs[5][PREFIX_NODE_LEN];
	prefix_block_hashes(fp, "t", 1, a, 64, hs);
	assert_memory_not_equal(ha[0], hs[0], PREFIX_NODE_LEN);
	fp[0] = 9;
	prefix_block_hashes(fp, "", 0, a, 64, hs);
	assert_memory_not_equal(ha[0], hs[0], PREFIX_NODE_LEN);
}

static void test_truncated_hashes_collide(void **state)
{
	(void)state;
	uint8_t fp[32] = {0};
	uint32_t a[16] = {0};
	uint8_t h[2][PREFIX_NODE_LEN];
	hashwrap_truncate(16);
	prefix_block_hashes(fp, "", 0, a, 16, h);
	hashwrap_truncate(0);
	for (int d = 0; d < 2; d++)
		for (int i = 0; i < PREFIX_NODE_LEN - 2; i++)
			assert_int_equal(h[d][i], 0);
}

/* OpenSSL's allocations, made to fail on demand (CRYPTO_set_mem_functions
 * is OpenSSL's own interface for this; it must be set before any). */
static int crypto_oom;

static void *crypto_malloc(size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return crypto_oom ? NULL : malloc(n);
}

static void *crypto_realloc(void *p, size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return crypto_oom ? NULL : realloc(p, n);
}

static void crypto_free(void *p, const char *file, int line)
{
	(void)file;
	(void)line;
	free(p);
}

/* The client library runs this code: out of memory is an error it returns,
 * never an abort (k3cache.h: the library never exits). */
static void test_out_of_memory_is_an_error(void **state)
{
	(void)state;
	uint8_t fp[32] = {1}, key[PREFIX_KEY_LEN];
	uint32_t toks[40] = {0};
	uint8_t h[3][PREFIX_NODE_LEN];
	const struct model_layer layers[] = {{.mixer = MODEL_MIXER_MLA, .k_row = 2, .v_row = 2}};
	char err[MODEL_ERROR_MAX];
	crypto_oom = 1;
	assert_int_equal(prefix_key(fp, "", 0, toks, 40, key), -1);
	struct k3cache_model *m = model_new("oom", "r", "l", layers, 1, err);
	/* the chained block hashes allocate nothing, so they cannot fail */
	assert_int_equal(prefix_block_hashes(fp, "", 0, toks, 40, h), 2);
	crypto_oom = 0;
	assert_null(m);
	assert_non_null(strstr(err, "out of memory"));
	assert_int_equal(prefix_key(fp, "", 0, toks, 40, key), 0);
}

int main(void)
{
	if (!CRYPTO_set_mem_functions(crypto_malloc, crypto_realloc, crypto_free))
		return 1;
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_keys_match_fixture),
	        cmocka_unit_test(test_block_hashes_chain),
	        cmocka_unit_test(test_truncated_hashes_collide),
	        cmocka_unit_test(test_out_of_memory_is_an_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
