/* Blob codec and validation against the shared conformance vectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "blob.h"
#include "blob_stream.h"
#include "checksum.h"
#include "model.h"
#include "testutil.h"

static void test_structural_vectors(void **state)
{
	(void)state;
	char *rows[TESTUTIL_MAX_ROWS][TESTUTIL_MAX_COLS];
	int n;
	char *text = testutil_tsv("vectors/structural.tsv", rows, &n);
	assert_true(n >= 18);
	for (int i = 0; i < n; i++) {
		size_t len;
		char rel[512];
		snprintf(rel, sizeof(rel), "vectors/%s", rows[i][0]);
		unsigned char *b = testutil_read(rel, &len);
		struct blob_view v;
		struct blob_error err = {0};
		enum blob_class rc = blob_parse(b, len, &v, &err);
		char got[64];
		if (rc == BLOB_OK)
			snprintf(got, sizeof(got), "ok:%s", v.tag == BLOB_TAG_KDA ? "kda" : "mla");
		else
			snprintf(got, sizeof(got), "error:%s", blob_class_name(rc));
		if (strcmp(got, rows[i][1]) != 0)
			fail_msg("%s: expected %s, got %s (%s)", rows[i][0], rows[i][1], got,
			         err.message);
		if (rc != BLOB_OK) {
			assert_int_equal(err.cls, rc);
			assert_true(strlen(err.message) > 10);
		}
		free(b);
	}
	free(text);
}

static void test_semantic_vectors(void **state)
{
	(void)state;
	char *rows[TESTUTIL_MAX_ROWS][TESTUTIL_MAX_COLS];
	int n;
	char *text = testutil_tsv("vectors/semantic.tsv", rows, &n);
	assert_true(n >= 12);
	for (int i = 0; i < n; i++) {
		char path[1024], merr[MODEL_ERROR_MAX];
		snprintf(path, sizeof(path), "%s/%s", K3_SHARED_DIR, rows[i][1]);
		struct k3cache_model *m = model_load_file(path, merr);
		assert_non_null(m);
		uint32_t layer = (uint32_t)strtoul(rows[i][2], NULL, 10);
		uint32_t plen = (uint32_t)strtoul(rows[i][3], NULL, 10);
		size_t len;
		char rel[512];
		snprintf(rel, sizeof(rel), "vectors/%s", rows[i][0]);
		unsigned char *b = testutil_read(rel, &len);
		struct blob_error err = {0};
		enum blob_class rc = blob_check(b, len, m, layer, plen, &err);
		char got[64];
		snprintf(got, sizeof(got), rc == BLOB_OK ? "ok" : "error:%s", blob_class_name(rc));
		if (strcmp(got, rows[i][4]) != 0)
			fail_msg("%s: expected %s, got %s (%s)", rows[i][0], rows[i][4], got,
			         err.message);
		if (rc != BLOB_OK) {
			/* every message names the layer */
			char want[32];
			snprintf(want, sizeof(want), "layer %u", layer);
			assert_non_null(strstr(err.message, want));
		}
		free(b);
		model_free(m);
	}
	free(text);
}

static void test_roundtrip_ok_vectors(void **state)
{
	(void)state;
	static const char *const ok[] = {"vectors/blobs/ok_kda.bin",
	                                 "vectors/blobs/ok_mla_3tok.bin",
	                                 "vectors/blobs/ok_mla_empty.bin",
	                                 "vectors/blobs/ok_kda_empty_vectors.bin",
	                                 "vectors/blobs/sem_ok_kda_layer0.bin",
	                                 "vectors/blobs/sem_ok_mla_layer3.bin"};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		size_t len;
		unsigned char *b = testutil_read(ok[i], &len);
		struct blob_view v;
		assert_int_equal(blob_parse(b, len, &v, NULL), BLOB_OK);
		assert_int_equal(blob_encoded_size(&v), len);
		unsigned char *out = malloc(len);
		assert_int_equal(blob_encode(&v, out), len);
		assert_memory_equal(out, b, len);
		free(out);
		free(b);
	}
}

static void test_messages_name_numbers(void **state)
{
	(void)state;
	char path[1024], merr[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/tiny-hybrid.json", K3_SHARED_DIR);
	struct k3cache_model *m = model_load_file(path, merr);
	assert_non_null(m);
	size_t len;
	struct blob_error err;
	unsigned char *b = testutil_read("vectors/blobs/sem_mla_k_row.bin", &len);
	assert_int_equal(blob_check(b, len, m, 3, 3, &err), BLOB_ERR_SHAPE);
	assert_string_equal(err.message, "layer 3: MLA k has 15 floats, expected 3 tokens x 6");
	free(b);
	b = testutil_read("vectors/blobs/sem_kda_in_mla_slot.bin", &len);
	assert_int_equal(blob_check(b, len, m, 3, 3, &err), BLOB_ERR_SLOT);
	assert_string_equal(err.message, "layer 3: model says MLA, blob is KDA");
	free(b);
	b = testutil_read("vectors/blobs/sem_kda_nan.bin", &len);
	assert_int_equal(blob_check(b, len, m, 0, 3, &err), BLOB_ERR_NONFINITE);
	assert_string_equal(err.message, "layer 0: KDA recurrent[5] is NaN");
	free(b);
	/* a structural failure through blob_check also names the layer */
	b = testutil_read("vectors/blobs/err_kda_trailing_1.bin", &len);
	assert_int_equal(blob_check(b, len, m, 2, 3, &err), BLOB_ERR_TRAILING);
	assert_non_null(strstr(err.message, "layer 2: "));
	free(b);
	model_free(m);
}

/* A count that cannot fit must be refused before anything reads its body,
 * including counts whose byte size wraps 32 bits. */
static void test_huge_counts(void **state)
{
	(void)state;
	unsigned char b[1 + 4 + 8] = {1, 0xff, 0xff, 0xff, 0xff};
	struct blob_error err;
	assert_int_equal(blob_parse(b, sizeof(b), NULL, &err), BLOB_ERR_TRUNCATED);
	/* 0x40000001 * 4 wraps to 4 in 32 bits: exactly the bytes that follow */
	unsigned char w[1 + 4 + 4 + 4] = {1, 0x01, 0x00, 0x00, 0x40};
	assert_int_equal(blob_parse(w, sizeof(w), NULL, &err), BLOB_ERR_TRUNCATED);
}

/* ---- the seed's known-bad mutants ---------------------------------------- */

static struct k3cache_model *twin(void)
{
	char path[1024], merr[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	struct k3cache_model *m = model_load_file(path, merr);
	assert_non_null(m);
	return m;
}

static unsigned char *make_kda(const struct model_layer *l, float base, size_t *len)
{
	float *conv = malloc(l->conv_len * sizeof(float));
	float *rec = malloc(l->recurrent_len * sizeof(float));
	for (uint32_t i = 0; i < l->conv_len; i++)
		conv[i] = base + (float)i * 0.001f;
	for (uint32_t i = 0; i < l->recurrent_len; i++)
		rec[i] = base - (float)i * 0.002f;
	struct blob_view v = {.tag = BLOB_TAG_KDA,
	                      .v0 = {(const unsigned char *)conv, l->conv_len},
	                      .v1 = {(const unsigned char *)rec, l->recurrent_len}};
	*len = blob_encoded_size(&v);
	unsigned char *b = malloc(*len);
	blob_encode(&v, b);
	free(conv);
	free(rec);
	return b;
}

static unsigned char *make_mla(const struct model_layer *l, uint32_t tokens, size_t *len)
{
	size_t nk = (size_t)tokens * l->k_row, nv = (size_t)tokens * l->v_row;
	float *k = malloc(nk * sizeof(float)), *v = malloc(nv * sizeof(float));
	for (size_t i = 0; i < nk; i++)
		k[i] = (float)i;
	for (size_t i = 0; i < nv; i++)
		v[i] = -(float)i;
	struct blob_view view = {.tag = BLOB_TAG_MLA,
	                         .seq_len = tokens,
	                         .v0 = {(const unsigned char *)k, (uint32_t)nk},
	                         .v1 = {(const unsigned char *)v, (uint32_t)nv}};
	*len = blob_encoded_size(&view);
	unsigned char *b = malloc(*len);
	blob_encode(&view, b);
	free(k);
	free(v);
	return b;
}

/* Leaves, below the caller's frame, what an earlier XXH3 state for `seed`
 * whose secret has since been written over looks like to a new one placed
 * there: at every 64-byte boundary, the state's last 64 bytes with that seed
 * and no external secret, and garbage where its secret would be. */
__attribute__((noinline)) static void dirty_stack(uint64_t seed)
{
	_Alignas(64) unsigned char area[64 * 1024];
	unsigned char chunk[64];
	memset(chunk, 0xa5, sizeof(chunk));
	memcpy(chunk + offsetof(XXH3_state_t, seed) % 64, &seed, sizeof(seed));
	memset(chunk + offsetof(XXH3_state_t, extSecret) % 64, 0, sizeof(void *));
	for (size_t i = 0; i < sizeof(area); i += sizeof(chunk))
		memcpy(area + i, chunk, sizeof(chunk));
	__asm__ volatile("" : : "r"(area) : "memory");
}

/* A layer's check hashes with a state in its own frame: what was on the
 * stack before (a state for the same layer, its secret since overwritten)
 * must not change the sum. XXH3's reset skips making the secret when the
 * state says it holds it already. */
static void test_sum_ignores_old_stack(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	for (uint32_t layer = 1; layer < m->n_layers; layer++) {
		if (m->layers[layer].mixer != MODEL_MIXER_KDA)
			continue;
		size_t len;
		unsigned char *b = make_kda(&m->layers[layer], 0.25f, &len);
		uint64_t want = checksum_blob(b, len, layer), got = 0;
		dirty_stack(layer);
		assert_int_equal(blob_check_sum(b, len, m, layer, 0, &got, NULL), BLOB_OK);
		assert_int_equal(got, want);
		free(b);
		break;
	}
	model_free(m);
}

/* C4: KDA state written into the MLA slot. */
static void test_mutant_kda_in_mla_slot(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	size_t len;
	unsigned char *b = make_kda(&m->layers[0], 0.5f, &len);
	struct blob_error err;
	assert_int_equal(blob_check(b, len, m, 0, 5, &err), BLOB_OK);
	assert_int_equal(blob_check(b, len, m, 3, 5, &err), BLOB_ERR_SLOT);
	assert_string_equal(err.message, "layer 3: model says MLA, blob is KDA");
	free(b);
	model_free(m);
}

/* Two MLA rows swapped: shapes still agree, the published checksum does not. */
static void test_mutant_swapped_mla_row(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	const struct model_layer *l = &m->layers[3];
	size_t len;
	unsigned char *b = make_mla(l, 4, &len);
	uint64_t published = checksum_blob(b, len, 3);
	/* swap k rows 0 and 3 (k starts after tag, seq_len and count) */
	size_t row = (size_t)l->k_row * 4u;
	unsigned char *k = b + 1 + 4 + 4;
	unsigned char *tmp = malloc(row);
	memcpy(tmp, k, row);
	memcpy(k, k + 3 * row, row);
	memcpy(k + 3 * row, tmp, row);
	free(tmp);
	struct blob_error err;
	assert_int_equal(blob_check(b, len, m, 3, 4, &err), BLOB_OK); /* shape alone can't see it */
	assert_int_not_equal(checksum_blob(b, len, 3), published);
	free(b);
	model_free(m);
}

/* Two same-shape KDA layers swapped: each blob is valid in either slot, but the
 * checksum is bound to the layer index. Even identical bytes differ by slot. */
static void test_mutant_swapped_kda_layers(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	size_t l0, l1;
	unsigned char *b0 = make_kda(&m->layers[0], 0.25f, &l0);
	unsigned char *b1 = make_kda(&m->layers[1], 0.75f, &l1);
	uint64_t sum0 = checksum_blob(b0, l0, 0), sum1 = checksum_blob(b1, l1, 1);
	struct blob_error err;
	assert_int_equal(blob_check(b1, l1, m, 0, 5, &err), BLOB_OK);
	assert_int_equal(blob_check(b0, l0, m, 1, 5, &err), BLOB_OK);
	assert_int_not_equal(checksum_blob(b1, l1, 0), sum0);
	assert_int_not_equal(checksum_blob(b0, l0, 1), sum1);
	assert_int_not_equal(checksum_blob(b0, l0, 0), checksum_blob(b0, l0, 1));
	/* the streaming form agrees with the one-shot form */
	struct checksum_state *st = checksum_begin(1);
	checksum_update(st, b1, 7);
	checksum_update(st, b1 + 7, l1 - 7);
	assert_int_equal(checksum_end(st), sum1);
	free(b0);
	free(b1);
	model_free(m);
}

static void test_nonfinite_positions(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	size_t len;
	unsigned char *b = make_kda(&m->layers[0], 0.1f, &len);
	struct blob_view v;
	assert_int_equal(blob_parse(b, len, &v, NULL), BLOB_OK);
	assert_int_equal(blob_first_nonfinite(&v.v1), -1);
	/* -Inf at the very last recurrent float, past several scan blocks */
	float ninf = -__builtin_inff();
	memcpy(b + len - 4, &ninf, 4);
	struct blob_error err;
	assert_int_equal(blob_validate(&v, m, 0, BLOB_PREFIX_ANY, &err), BLOB_ERR_NONFINITE);
	assert_string_equal(err.message, "layer 0: KDA recurrent[8191] is -Inf");
	free(b);
	model_free(m);
}

/* blob_stream over pieces of `step` bytes (0: random sizes) gives exactly
 * what blob_check_sum gives for the whole. */
static void expect_stream_same_as(const unsigned char *b, size_t len, const struct k3cache_model *m,
                                  uint32_t layer, uint32_t plen, size_t step, const char *what,
                                  int once)
{
	struct blob_error want_err = {0}, got_err = {0};
	uint64_t want_sum = 0, got_sum = 0;
	enum blob_class want = blob_check_sum(b, len, m, layer, plen, &want_sum, &want_err);
	/* fill a fresh buffer piece by piece, as a socket would */
	unsigned char *buf = malloc(len ? len : 1);
	memset(buf, 0xff, len); /* 0xffffffff is a NaN: unfilled bytes must not be scanned */
	struct blob_stream bs;
	assert_int_equal(once ? blob_stream_begin_once(&bs, buf, len, m, layer, plen)
	                      : blob_stream_begin(&bs, buf, len, m, layer, plen),
	                 0);
	uint32_t rng = (uint32_t)len * 2654435761u + (uint32_t)step + 1u;
	for (size_t off = 0; off < len;) {
		size_t n = step;
		if (!n) {
			rng ^= rng << 13;
			rng ^= rng >> 17;
			rng ^= rng << 5;
			n = 1 + rng % 9000;
		}
		if (n > len - off)
			n = len - off;
		if (once == 2) { /* a piece of its own, gone after the call */
			unsigned char *piece = malloc(n ? n : 1);
			memcpy(piece, b + off, n);
			blob_stream_feed_piece(&bs, piece, n);
			memset(piece, 0xaa, n);
			free(piece);
			off += n;
			continue;
		}
		memcpy(buf + off, b + off, n);
		off += n;
		blob_stream_feed(&bs, off);
		if (once && off > 3) /* gone: a window moved on (a float may straddle) */
			memset(buf, 0xaa, off - 3);
	}
	enum blob_class got = blob_stream_end(&bs, &got_sum, &got_err);
	if (got != want || (want == BLOB_OK && got_sum != want_sum) ||
	    (want != BLOB_OK && strcmp(got_err.message, want_err.message) != 0))
		fail_msg("%s, pieces of %zu%s: stream gave %s \"%s\" %016llx, whole gave %s \"%s\" "
		         "%016llx",
		         what, step, once ? ", read once" : "", blob_class_name(got),
		         got_err.message, (unsigned long long)got_sum, blob_class_name(want),
		         want_err.message, (unsigned long long)want_sum);
	free(buf);
}

/* ... both in one buffer and read once, every byte gone after its feed. */
static void expect_stream_same(const unsigned char *b, size_t len, const struct k3cache_model *m,
                               uint32_t layer, uint32_t plen, size_t step, const char *what)
{
	expect_stream_same_as(b, len, m, layer, plen, step, what, 0);
	if (plen != BLOB_PREFIX_ANY) { /* read once needs the floats' place */
		expect_stream_same_as(b, len, m, layer, plen, step, what, 1);
		expect_stream_same_as(b, len, m, layer, plen, step, what, 2);
	}
}

static void test_stream_matches_whole_on_vectors(void **state)
{
	(void)state;
	char *rows[TESTUTIL_MAX_ROWS][TESTUTIL_MAX_COLS];
	int n;
	char *text = testutil_tsv("vectors/semantic.tsv", rows, &n);
	assert_true(n >= 12);
	static const size_t steps[] = {1, 3, 4, 5, 64, 0};
	for (int i = 0; i < n; i++) {
		char path[1024], merr[MODEL_ERROR_MAX];
		snprintf(path, sizeof(path), "%s/%s", K3_SHARED_DIR, rows[i][1]);
		struct k3cache_model *m = model_load_file(path, merr);
		assert_non_null(m);
		uint32_t layer = (uint32_t)strtoul(rows[i][2], NULL, 10);
		uint32_t plen = (uint32_t)strtoul(rows[i][3], NULL, 10);
		size_t len;
		char rel[512];
		snprintf(rel, sizeof(rel), "vectors/%s", rows[i][0]);
		unsigned char *b = testutil_read(rel, &len);
		for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++)
			expect_stream_same(b, len, m, layer, plen, steps[k], rows[i][0]);
		/* and every layer and a wrong prefix length, wherever it fails */
		for (uint32_t l = 0; l < m->n_layers; l++)
			expect_stream_same(b, len, m, l, plen + 1, 0, rows[i][0]);
		free(b);
		model_free(m);
	}
	free(text);
}

/* Twin-size blobs with a bad float in each place a piece can split. */
static void test_stream_matches_whole_on_large_blobs(void **state)
{
	(void)state;
	struct k3cache_model *m = twin();
	size_t klen, mlen;
	unsigned char *k = make_kda(&m->layers[0], 0.25f, &klen);
	unsigned char *v = make_mla(&m->layers[3], 37, &mlen);
	static const size_t steps[] = {4096, 65536, 262144, 0};
	for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
		expect_stream_same(k, klen, m, 0, 37, steps[s], "kda ok");
		expect_stream_same(v, mlen, m, 3, 37, steps[s], "mla ok");
	}
	float nan = __builtin_nanf(""), inf = __builtin_inff();
	/* offsets (not float-aligned ones too) across 4 KiB and 64 KiB piece
	 * boundaries, in both vectors of both blobs */
	const size_t at[] = {5, 9, 4093, 4094, 12293, 32765, 65535, 65537, 131070, 188000};
	const unsigned char *src[2] = {k, v};
	const size_t lens[2] = {klen, mlen};
	const uint32_t slot[2] = {0, 3};
	for (int w = 0; w < 2; w++) {
		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			if (at[i] + 4 > lens[w])
				continue;
			unsigned char *b = malloc(lens[w]);
			memcpy(b, src[w], lens[w]);
			memcpy(b + at[i], i % 2 ? &nan : &inf, 4);
			for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++)
				expect_stream_same(b, lens[w], m, slot[w], 37, steps[s],
				                   "a bad float");
			free(b);
		}
		unsigned char *b = malloc(lens[w]);
		memcpy(b, src[w], lens[w]);
		memcpy(b + lens[w] - 4, &nan, 4);
		expect_stream_same(b, lens[w], m, slot[w], 37, 65536, "NaN as the last float");
		free(b);
	}
	assert_true(klen > 12293 + 4 && mlen > 188000 + 4); /* the offsets above are inside */
	/* a NaN in the MLA v vector, and a count changed so the layout shifts */
	unsigned char *b = malloc(mlen);
	memcpy(b, v, mlen);
	memcpy(b + mlen - 4, &nan, 4);
	expect_stream_same(b, mlen, m, 3, 37, 4096, "mla NaN at the end");
	memcpy(b, v, mlen);
	b[5] ^= 1; /* the k count */
	expect_stream_same(b, mlen, m, 3, 37, 4096, "mla count changed");
	expect_stream_same(v, mlen - 3, m, 3, 37, 4096, "mla truncated");
	expect_stream_same(v, mlen, m, 0, 37, 4096, "mla in a KDA slot");
	free(b);
	free(k);
	free(v);
	model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_structural_vectors),
	        cmocka_unit_test(test_semantic_vectors),
	        cmocka_unit_test(test_roundtrip_ok_vectors),
	        cmocka_unit_test(test_messages_name_numbers),
	        cmocka_unit_test(test_huge_counts),
	        cmocka_unit_test(test_mutant_kda_in_mla_slot),
	        cmocka_unit_test(test_mutant_swapped_mla_row),
	        cmocka_unit_test(test_mutant_swapped_kda_layers),
	        cmocka_unit_test(test_nonfinite_positions),
	        cmocka_unit_test(test_stream_matches_whole_on_vectors),
	        cmocka_unit_test(test_stream_matches_whole_on_large_blobs),
	        cmocka_unit_test(test_sum_ignores_old_stack),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
