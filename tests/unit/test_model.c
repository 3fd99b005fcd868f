/* Model specs: loading, rejection of bad specs, fingerprints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "hexutil.h"
#include "model.h"
#include "testutil.h"

static void test_fingerprints_match_fixture(void **state)
{
	(void)state;
	char *rows[TESTUTIL_MAX_ROWS][TESTUTIL_MAX_COLS];
	int n, seen = 0;
	char *text = testutil_tsv("models/FINGERPRINTS.tsv", rows, &n);
	for (int i = 0; i < n; i++) {
		if (strcmp(rows[i][0], "fingerprint") != 0)
			continue;
		char path[1024], err[MODEL_ERROR_MAX], hex[65];
		snprintf(path, sizeof(path), "%s/models/%s", K3_SHARED_DIR, rows[i][1]);
		struct k3cache_model *m = model_load_file(path, err);
		assert_non_null(m);
		hexutil_encode(m->fingerprint, 32, hex);
		assert_string_equal(hex, rows[i][4]);
		seen++;
		model_free(m);
	}
	assert_int_equal(seen, 2);
	free(text);
}

static void test_twin_layout(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	struct k3cache_model *m = model_load_file(path, err);
	assert_non_null(m);
	assert_int_equal(m->n_layers, 8);
	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(m->layers[i].mixer,
		                 (i == 3 || i == 7) ? MODEL_MIXER_MLA : MODEL_MIXER_KDA);
	assert_int_equal(m->layers[3].k_row, 768);
	assert_int_equal(model_layer_blob_size(&m->layers[0], 9), 1 + 8 + (3072 + 8192) * 4);
	assert_int_equal(model_layer_blob_size(&m->layers[3], 2), 1 + 4 + 8 + 2 * (768 + 512) * 4);
	model_free(m);
}

/* A spec survives model_to_json -> model_from_json with the same fingerprint. */
static void test_json_roundtrip(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/tiny-hybrid.json", K3_SHARED_DIR);
	struct k3cache_model *m = model_load_file(path, err);
	assert_non_null(m);
	char *js = model_to_json(m);
	assert_non_null(js);
	struct k3cache_model *back = model_from_json(js, strlen(js), err);
	assert_non_null(back);
	assert_memory_equal(back->fingerprint, m->fingerprint, 32);
	free(js);
	model_free(back);
	model_free(m);
}

struct bad_spec {
	const char *json;
	const char *message_part;
};

#define HEAD "\"name\":\"m\",\"revision\":\"r\",\"state_layout\":\"s\","
#define KDA  "{\"mixer\":\"kda\",\"conv_len\":4,\"recurrent_len\":8}"

static void test_bad_specs_rejected(void **state)
{
	(void)state;
	static const struct bad_spec bad[] = {
	        {"not json", "not valid JSON"},
	        {"[1,2]", "must be a JSON object"},
	        {"{" HEAD "\"layers\":[]}", "no layers"},
	        {"{\"revision\":\"r\",\"state_layout\":\"s\",\"layers\":[" KDA "]}",
	         "missing field \"name\""},
	        {"{\"name\":\"m\",\"state_layout\":\"s\",\"layers\":[" KDA "]}",
	         "missing field \"revision\""},
	        {"{\"name\":\"m\",\"revision\":\"r\",\"layers\":[" KDA "]}",
	         "missing field \"state_layout\""},
	        {"{" HEAD "\"layers\":[" KDA "],\"extra\":1}", "unknown field \"extra\""},
	        {"{" HEAD "\"layers\":{}}", "must be an array"},
	        {"{\"name\":7,\"revision\":\"r\",\"state_layout\":\"s\",\"layers\":[" KDA "]}",
	         "must be a string"},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"gdn\",\"conv_len\":4}]}",
	         "unknown mixer \"gdn\""},
	        {"{" HEAD "\"layers\":[{\"conv_len\":4}]}", "\"mixer\""},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"kda\",\"conv_len\":4}]}",
	         "layer 0: missing field \"recurrent_len\""},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"kda\",\"conv_len\":0,\"recurrent_len\":8}]}",
	         "layer 0: \"conv_len\" is 0"},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"kda\",\"conv_len\":4,\"recurrent_len\":-1}]}",
	         "\"recurrent_len\" is -1"},
	        {"{" HEAD "\"layers\":[" KDA
	         ",{\"mixer\":\"mla\",\"k_row\":4294967296,\"v_row\":1}]}",
	         "layer 1: \"k_row\" is 4294967296"},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"mla\",\"k_row\":2.5,\"v_row\":1}]}",
	         "whole number"},
	        {"{" HEAD
	         "\"layers\":[{\"mixer\":\"mla\",\"k_row\":6,\"v_row\":4,\"conv_len\":12}]}",
	         "an MLA layer has no conv_len"},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"kda\",\"conv_len\":4,\"recurrent_len\":8,"
	         "\"v_row\":4}]}",
	         "a KDA layer has no k_row"},
	        {"{" HEAD "\"layers\":[{\"mixer\":\"mla\",\"k_row\":6,\"v_row\":4,\"bias\":true}]}",
	         "layer 0: unknown field \"bias\""},
	        {"{" HEAD "\"layers\":[" KDA "],\"name\":\"dup\"}", "duplicate"},
	        {"{\"name\":\"\",\"revision\":\"r\",\"state_layout\":\"s\",\"layers\":[" KDA "]}",
	         "\"name\" is empty"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[MODEL_ERROR_MAX] = "";
		struct k3cache_model *m = model_from_json(bad[i].json, strlen(bad[i].json), err);
		if (m)
			fail_msg("accepted: %s", bad[i].json);
		if (!strstr(err, bad[i].message_part))
			fail_msg("spec %s: message \"%s\" lacks \"%s\"", bad[i].json, err,
			         bad[i].message_part);
	}
	/* and a good one with the same head is accepted */
	const char *good = "{" HEAD "\"layers\":[" KDA "]}";
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_from_json(good, strlen(good), err);
	assert_non_null(m);
	model_free(m);
}

static void test_missing_file(void **state)
{
	(void)state;
	char err[MODEL_ERROR_MAX];
	assert_null(model_load_file("/nonexistent/spec.json", err));
	assert_non_null(strstr(err, "/nonexistent/spec.json"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_fingerprints_match_fixture),
	        cmocka_unit_test(test_twin_layout),
	        cmocka_unit_test(test_json_roundtrip),
	        cmocka_unit_test(test_bad_specs_rejected),
	        cmocka_unit_test(test_missing_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
