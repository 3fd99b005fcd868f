/* ranges: overlapping destinations are found, adjacent and empty ones are not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ranges.h"

static int overlap(struct ranges_span *s, size_t n, uint32_t *a, uint32_t *b)
{
	const struct ranges_span *x = NULL, *y = NULL;
	int r = ranges_overlap(s, n, &x, &y);
	if (r) {
		*a = x->layer;
		*b = y->layer;
	}
	return r;
}

static void test_apart_and_adjacent(void **state)
{
	(void)state;
	struct ranges_span s[] = {{300, 100, 2, 0},
	                          {100, 100, 0, 0},
	                          {200, 100, 1, 0},
	                          {250, 0, 3, 0}}; /* empty, inside layer 1: nothing */
	uint32_t a = 9, b = 9;
	assert_int_equal(overlap(s, 4, &a, &b), 0);
}

static void test_one_byte_shared(void **state)
{
	(void)state;
	struct ranges_span s[] = {{300, 100, 2, 0}, {100, 100, 0, 0}, {199, 50, 1, 0}};
	uint32_t a = 9, b = 9;
	assert_int_equal(overlap(s, 3, &a, &b), 1);
	assert_int_equal(a, 0);
	assert_int_equal(b, 1);
}

static void test_inside_a_long_one(void **state)
{
	(void)state;
	/* layer 1 lies inside layer 0 but after layer 2 starts: found against 0 */
	struct ranges_span s[] = {{100, 1000, 0, 0}, {500, 10, 1, 0}, {1200, 10, 2, 0}};
	uint32_t a = 9, b = 9;
	assert_int_equal(overlap(s, 3, &a, &b), 1);
	assert_int_equal(a, 0);
	assert_int_equal(b, 1);
	struct ranges_span t[] = {{100, 1000, 0, 0}, {200, 10, 1, 0}, {1050, 10, 2, 0}};
	assert_int_equal(overlap(t, 3, &a, &b), 1);
}

static void test_same_start(void **state)
{
	(void)state;
	struct ranges_span s[] = {{100, 4, 5, 0}, {100, 4, 5, 1}};
	uint32_t a = 9, b = 9;
	assert_int_equal(overlap(s, 2, &a, &b), 1);
	assert_int_equal(a, 5);
	assert_int_equal(b, 5);
}

static void test_past_the_end(void **state)
{
	(void)state;
	struct ranges_span s[] = {{UINTPTR_MAX - 10, 12, 7, 0}};
	uint32_t a = 9, b = 9;
	assert_int_equal(overlap(s, 1, &a, &b), 1);
	assert_int_equal(a, 7);
	struct ranges_span t[] = {{UINTPTR_MAX - 10, 11, 7, 0}}; /* its last byte: fits */
	assert_int_equal(overlap(t, 1, &a, &b), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_apart_and_adjacent), cmocka_unit_test(test_one_byte_shared),
	        cmocka_unit_test(test_inside_a_long_one),  cmocka_unit_test(test_same_start),
	        cmocka_unit_test(test_past_the_end),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
