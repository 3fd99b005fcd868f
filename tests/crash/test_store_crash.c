/* Crash safety: a child process publishes in a loop and is SIGKILLed at a
 * random moment, 200 times. After each kill the store opens, verify finds
 * nothing damaged, and every entry present restores whole. The big entries
 * are larger than the stage size, so they are written in several
 * transactions (store_staged.c): a kill between them leaves chunks under a
 * pending row, which the next open must remove, leaving no chunk that no
 * entry owns. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "../unit/storeutil.h"
#include "store/chunks.h" /* STORE_CHUNK_DATA */

#define KILLS 200

static void child(const char *dir, uint32_t iter)
{
	struct store *st;
	struct store_options o = {
	        .max_bytes = 48u << 20, .durability = STORE_SAFE, .stage_bytes = 1u << 20};
	if (store_open(dir, &o, &st, NULL) != STATUS_OK)
		_exit(2);
	struct model_spec *small = storeutil_model("small", 64);
	struct model_spec *big = storeutil_model("big", 400000); /* multi-chunk entries */
	store_put_model(st, small, NULL, NULL);
	store_put_model(st, big, NULL, NULL);
	for (uint32_t k = 0;; k++) {
		uint32_t t[40];
		for (uint32_t i = 0; i < 40; i++)
			t[i] = iter * 1000 + k * 7 + i;
		struct model_spec *m = (k % 3 == 0) ? big : small;
		storeutil_publish(st, m, "", t, 20 + k % 20, iter + k, NULL);
		if (k % 5 == 4) {
			struct store_evict_req req = {.to_bytes_set = 1, .to_bytes = 24u << 20};
			struct store_evict_res res;
			store_evict(st, &req, NULL, NULL, &res, NULL);
		}
	}
}

static void damaged_cb(const uint8_t *key, const char *why, void *ctx)
{
	(void)ctx;
	fprintf(stderr, "damaged entry %02x%02x%02x%02x: %s\n", key[0], key[1], key[2], key[3],
	        why);
}

static int chunks_cb(const struct store_entry_info *info, void *ctx)
{
	*(uint64_t *)ctx += (info->bytes + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA;
	return 0;
}

static void test_sigkill_during_publish(void **state)
{
	(void)state;
	char *dir = storeutil_tmpdir();
	uint32_t rng = (uint32_t)time(NULL) | 1u;
	uint64_t max_entries = 0, total_checked = 0, swept = 0;
	for (uint32_t iter = 0; iter < KILLS; iter++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			child(dir, iter);
		rng ^= rng << 13;
		rng ^= rng >> 17;
		rng ^= rng << 5;
		/* up to 120 ms: a staged 4.8 MB publish takes 30-90 ms in safe mode on
		 * the 2-vCPU VMs, and kills must land after some commit too */
		struct timespec ts = {0, (long)(1 + rng % 120) * 1000000L};
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		int status;
		waitpid(pid, &status, 0);
		assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));

		struct store *st;
		struct status s;
		struct store_options o = {.durability = STORE_SAFE, .max_bytes = 48u << 20};
		if (store_open(dir, &o, &st, &s) != STATUS_OK)
			fail_msg("kill %u: open failed: %s", iter, s.message);
		uint64_t checked, damaged;
		assert_int_equal(store_verify(st, damaged_cb, NULL, &checked, &damaged, &s),
		                 STATUS_OK);
		if (damaged)
			fail_msg("kill %u: %llu of %llu entries damaged", iter,
			         (unsigned long long)damaged, (unsigned long long)checked);
		struct store_stats stats;
		store_get_stats(st, &stats, NULL);
		assert_int_equal(stats.entries, checked);
		assert_true(stats.bytes <= (48u << 20));
		uint64_t owned = 0;
		assert_int_equal(store_list(st, NULL, NULL, 0, chunks_cb, &owned, NULL), STATUS_OK);
		if (stats.staging != 0 || stats.chunks != owned)
			fail_msg("kill %u: %llu staged publishes left, %llu chunks for %llu owned",
			         iter, (unsigned long long)stats.staging,
			         (unsigned long long)stats.chunks, (unsigned long long)owned);
		swept += stats.swept;
		max_entries = checked > max_entries ? checked : max_entries;
		total_checked += checked;
		store_close(st);
	}
	printf("%d kills; up to %llu entries present, %llu entry checks, none damaged; %llu "
	       "unfinished staged publishes swept\n",
	       KILLS, (unsigned long long)max_entries, (unsigned long long)total_checked,
	       (unsigned long long)swept);
	assert_true(max_entries > 0);
	assert_true(swept > 0); /* the kills did land between stages */
	storeutil_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_sigkill_during_publish),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
