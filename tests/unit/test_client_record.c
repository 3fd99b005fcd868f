/* The client's record helper (k3cache_record_*): how much of a prompt a live
 * state can keep, and refusing to publish a state that no longer matches its
 * tokens. None of these needs a daemon. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "k3cache/k3cache.h"

#define N 8

static const uint32_t rec_tokens[N] = {11, 22, 33, 44, 55, 66, 77, 88};

/* A record holding rec_tokens, appended in two pieces. */
static void record_filled(struct k3cache_record *r)
{
	k3cache_record_init(r);
	assert_int_equal(k3cache_record_append(r, rec_tokens, 3), 0);
	assert_int_equal(k3cache_record_append(r, rec_tokens + 3, N - 3), 0);
	assert_int_equal(r->n, N);
	assert_false(r->tainted);
}

static void test_init_append_free(void **state)
{
	(void)state;
	struct k3cache_record r;
	k3cache_record_init(&r);
	assert_null(r.tokens);
	assert_int_equal(r.n, 0);
	assert_int_equal(k3cache_record_append(&r, NULL, 0), 0); /* nothing fed */
	assert_int_equal(r.n, 0);
	assert_false(r.tainted);
	/* enough appends to grow the array several times */
	for (uint32_t i = 0; i < 5000; i++)
		assert_int_equal(k3cache_record_append(&r, &i, 1), 0);
	assert_int_equal(r.n, 5000);
	assert_true(r.cap >= r.n);
	for (uint32_t i = 0; i < 5000; i++)
		assert_int_equal(r.tokens[i], i);
	k3cache_record_free(&r);
	assert_null(r.tokens);
	assert_int_equal(r.n, 0);
	k3cache_record_free(&r); /* twice is harmless */
	k3cache_record_free(NULL);
	k3cache_record_init(NULL);
	k3cache_record_reset(NULL);
	k3cache_record_taint(NULL);
	assert_int_equal(k3cache_record_append(NULL, rec_tokens, 1), -1);
}

static void test_prompt_extends_record(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	uint32_t prompt[N + 4];
	memcpy(prompt, rec_tokens, sizeof(rec_tokens));
	prompt[N] = 99;
	prompt[N + 1] = 98;
	prompt[N + 2] = 97;
	prompt[N + 3] = 96;
	/* the whole record is reused: "continue" */
	assert_int_equal(k3cache_record_reusable(&r, prompt, N + 4), N);
	/* one token past the record: still the whole record, one to feed */
	assert_int_equal(k3cache_record_reusable(&r, prompt, N + 1), N);
	k3cache_record_free(&r);
}

static void test_divergence_first_token(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	uint32_t prompt[N + 2];
	memcpy(prompt, rec_tokens, sizeof(rec_tokens));
	prompt[N] = prompt[N + 1] = 5;
	prompt[0] = 12345;
	assert_int_equal(k3cache_record_reusable(&r, prompt, N + 2), 0);
	k3cache_record_free(&r);
}

static void test_divergence_last_token(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	uint32_t prompt[N + 2];
	memcpy(prompt, rec_tokens, sizeof(rec_tokens));
	prompt[N] = prompt[N + 1] = 5;
	prompt[N - 1] = 12345; /* the last recorded token differs */
	uint32_t keep = k3cache_record_reusable(&r, prompt, N + 2);
	assert_int_equal(keep, N - 1);
	assert_true(keep < r.n); /* less than the record: the state must be reset */
	k3cache_record_free(&r);
}

static void test_divergence_in_the_middle(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	uint32_t prompt[N + 1];
	memcpy(prompt, rec_tokens, sizeof(rec_tokens));
	prompt[N] = 1;
	prompt[4] = 0;
	assert_int_equal(k3cache_record_reusable(&r, prompt, N + 1), 4);
	k3cache_record_free(&r);
}

static void test_prompt_equal_to_record(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	/* at least one token must be fed to get logits: capped at N - 1 */
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), N - 1);
	k3cache_record_free(&r);
}

static void test_prompt_shorter_than_record(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	/* a prefix of the record: the common prefix is the prompt, minus one */
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, 5), 4);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, 2), 1);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, 1), 0);
	/* shorter and diverging */
	uint32_t prompt[5];
	memcpy(prompt, rec_tokens, sizeof(prompt));
	prompt[2] = 0;
	assert_int_equal(k3cache_record_reusable(&r, prompt, 5), 2);
	k3cache_record_free(&r);
}

static void test_null_and_empty(void **state)
{
	(void)state;
	struct k3cache_record r;
	assert_int_equal(k3cache_record_reusable(NULL, rec_tokens, N), 0);
	record_filled(&r);
	assert_int_equal(k3cache_record_reusable(&r, NULL, N), 0);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, 0), 0);
	k3cache_record_free(&r);
	k3cache_record_init(&r); /* empty record */
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), 0);
	k3cache_record_free(&r);
}

static void test_taint(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	k3cache_record_taint(&r);
	assert_true(r.tainted);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), 0);
	/* appending does not clear a taint */
	assert_int_equal(k3cache_record_append(&r, rec_tokens, 1), 0);
	assert_true(r.tainted);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), 0);
	/* reset starts over: clean and empty, the array kept */
	k3cache_record_reset(&r);
	assert_false(r.tainted);
	assert_int_equal(r.n, 0);
	assert_non_null(r.tokens);
	assert_int_equal(k3cache_record_append(&r, rec_tokens, N), 0);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), N - 1);
	k3cache_record_free(&r);
}

static void test_append_without_tokens_taints(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	/* tokens were fed but could not be recorded */
	assert_int_equal(k3cache_record_append(&r, NULL, 3), -1);
	assert_true(r.tainted);
	assert_int_equal(k3cache_record_reusable(&r, rec_tokens, N), 0);
	k3cache_record_free(&r);
}

static void test_publish_refuses_tainted_record(void **state)
{
	(void)state;
	struct k3cache_record r;
	record_filled(&r);
	k3cache_record_taint(&r);
	uint8_t fp[K3CACHE_FP_LEN] = {1};
	unsigned char blob[16] = {1};
	struct k3cache_buf bufs[1] = {{blob, sizeof(blob)}};
	struct k3cache_publish_result res;
	memset(&res, 0xff, sizeof(res));
	struct k3cache_error err;
	/* a NULL connection: the record is checked before the connection */
	int rc = k3cache_publish_record(NULL, fp, "", 0, &r, bufs, 1, &res, &err);
	assert_int_equal(rc, K3CACHE_INVALID);
	assert_int_equal(err.code, K3CACHE_INVALID);
	assert_false(err.unreachable);
	assert_non_null(strstr(err.message, "tainted"));
	assert_int_equal(res.created, 0);
	k3cache_record_free(&r);
}

static void test_publish_refuses_empty_or_null_record(void **state)
{
	(void)state;
	uint8_t fp[K3CACHE_FP_LEN] = {1};
	unsigned char blob[16] = {1};
	struct k3cache_buf bufs[1] = {{blob, sizeof(blob)}};
	struct k3cache_error err;
	assert_int_equal(k3cache_publish_record(NULL, fp, "", 0, NULL, bufs, 1, NULL, &err),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(err.message, "k3cache_publish_record: no record"));
	struct k3cache_record r;
	k3cache_record_init(&r);
	assert_int_equal(k3cache_publish_record(NULL, fp, "", 0, &r, bufs, 1, NULL, &err),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(err.message, "empty"));
	/* a good record gets past the record checks to the connection check */
	record_filled(&r);
	assert_int_equal(k3cache_publish_record(NULL, fp, "", 0, &r, bufs, 1, NULL, &err),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(err.message, "no connection"));
	k3cache_record_free(&r);
}

static void test_connect_failure_names_the_address(void **state)
{
	(void)state;
	struct k3cache *c = (struct k3cache *)&c; /* must be overwritten */
	struct k3cache_error err;
	const char *path = "/nonexistent-k3cache-dir/k3cached.sock";
	assert_int_equal(k3cache_connect(path, &c, &err), K3CACHE_INTERNAL);
	assert_null(c);
	assert_true(err.unreachable);
	assert_non_null(strstr(err.message, "cannot connect to unix:/nonexistent-k3cache-dir/"
	                                    "k3cached.sock: No such file or directory"));
	char buf[512];
	setenv("K3CACHE_SOCKET", "/tmp/elsewhere.sock", 1);
	assert_string_equal(k3cache_default_socket(buf, sizeof(buf)), "/tmp/elsewhere.sock");
	unsetenv("K3CACHE_SOCKET");
	assert_non_null(strstr(k3cache_default_socket(buf, sizeof(buf)), "k3cached.sock"));
	k3cache_close(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_init_append_free),
	        cmocka_unit_test(test_prompt_extends_record),
	        cmocka_unit_test(test_divergence_first_token),
	        cmocka_unit_test(test_divergence_last_token),
	        cmocka_unit_test(test_divergence_in_the_middle),
	        cmocka_unit_test(test_prompt_equal_to_record),
	        cmocka_unit_test(test_prompt_shorter_than_record),
	        cmocka_unit_test(test_null_and_empty),
	        cmocka_unit_test(test_taint),
	        cmocka_unit_test(test_append_without_tokens_taints),
	        cmocka_unit_test(test_publish_refuses_tainted_record),
	        cmocka_unit_test(test_publish_refuses_empty_or_null_record),
	        cmocka_unit_test(test_connect_failure_names_the_address),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
