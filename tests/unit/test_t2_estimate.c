/* The queue-wait estimate (daemon/t2_estimate.c): what a lookup would wait
 * behind the fetches ahead of its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "t2_estimate.h"

static void test_nothing_ahead(void **state)
{
	(void)state;
	assert_int_equal(t2_ahead_ms(0, 0, 0, 0), 0);
	assert_int_equal(t2_ahead_ms(0, 0, 0, 800), 0);
}

static void test_measured(void **state)
{
	(void)state;
	/* each queued fetch at the average, the one under way at least that */
	assert_int_equal(t2_ahead_ms(3, 0, 0, 800), 2400);
	assert_int_equal(t2_ahead_ms(3, 1, 100, 800), 3200);
	/* the one under way longer than the average: as long as it has run */
	assert_int_equal(t2_ahead_ms(3, 1, 5000, 800), 2400 + 5000);
}

/* Before any whole fetch was measured (a fresh daemon's first fetch),
 * queued fetches are not free: each costs what the one under way has run */
static void test_unmeasured(void **state)
{
	(void)state;
	assert_int_equal(t2_ahead_ms(0, 1, 1500, 0), 1500);
	assert_int_equal(t2_ahead_ms(1, 1, 1500, 0), 3000);
	assert_int_equal(t2_ahead_ms(15, 1, 1500, 0), 16 * 1500);
	/* nothing under way and nothing measured: nothing to go by */
	assert_int_equal(t2_ahead_ms(4, 0, 0, 0), 0);
}

static void test_saturates(void **state)
{
	(void)state;
	assert_true(t2_ahead_ms(UINT64_MAX, 1, 10, 0) == UINT64_MAX);
	assert_true(t2_ahead_ms(2, 1, UINT64_MAX, 0) == UINT64_MAX);
	assert_true(t2_ahead_ms(UINT64_MAX / 2, 0, 0, 3) == UINT64_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_nothing_ahead),
	        cmocka_unit_test(test_measured),
	        cmocka_unit_test(test_unmeasured),
	        cmocka_unit_test(test_saturates),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
