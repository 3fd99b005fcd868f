/* units: what the size and duration parsers accept and refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "units.h"

static void expect_size(const char *s, uint64_t want)
{
	uint64_t v = 12345;
	if (units_parse_size(s, &v) != 0)
		fail_msg("\"%s\" should be a size", s);
	if (v != want)
		fail_msg("\"%s\" is %llu bytes, want %llu", s, (unsigned long long)v,
		         (unsigned long long)want);
}

static void expect_not_size(const char *s)
{
	uint64_t v = 12345;
	if (units_parse_size(s, &v) == 0)
		fail_msg("\"%s\" should not be a size (got %llu)", s, (unsigned long long)v);
	assert_int_equal(v, 12345); /* untouched */
}

static void expect_duration(const char *s, uint64_t want)
{
	uint64_t v = 12345;
	if (units_parse_duration(s, &v) != 0)
		fail_msg("\"%s\" should be a duration", s);
	if (v != want)
		fail_msg("\"%s\" is %llu s, want %llu", s, (unsigned long long)v,
		         (unsigned long long)want);
}

static void expect_not_duration(const char *s)
{
	uint64_t v = 12345;
	if (units_parse_duration(s, &v) == 0)
		fail_msg("\"%s\" should not be a duration (got %llu)", s, (unsigned long long)v);
	assert_int_equal(v, 12345);
}

static void test_ms(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t ms;
	} ok[] = {{"20", 20},      {"20ms", 20},   {"20MS", 20},    {"2s", 2000}, {"1.5s", 1500},
	          {"0.5sec", 500}, {"2m", 120000}, {"1min", 60000}, {"0", 0}};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 12345;
		if (units_parse_ms(ok[i].s, &v) != 0 || v != ok[i].ms)
			fail_msg("\"%s\": want %llu ms, got %llu", ok[i].s,
			         (unsigned long long)ok[i].ms, (unsigned long long)v);
	}
	static const char *const bad[] = {"", "ms", "2 s", "-1", "2h", "1e3", "0x10", "2sx"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 12345;
		if (units_parse_ms(bad[i], &v) == 0 || v != 12345)
			fail_msg("\"%s\" should not be milliseconds", bad[i]);
	}
}

static void test_size_accepts(void **state)
{
	(void)state;
	expect_size("0", 0);
	expect_size("512", 512);
	expect_size("512B", 512);
	expect_size("64K", 64ull << 10);
	expect_size("64kb", 64ull << 10);
	expect_size("64KiB", 64ull << 10);
	expect_size("10GiB", 10ull << 30);
	expect_size("8g", 8ull << 30);
	expect_size("2TiB", 2ull << 40);
	expect_size("1.5GiB", 3ull << 29);
	expect_size("0.5K", 512);
	expect_size("1.25M", 5ull << 18);
	expect_size("007M", 7ull << 20);
	/* a fraction of a byte is dropped, exactly (no binary rounding) */
	expect_size("1.9", 1);
	expect_size("0.1K", 102);
	expect_size("0.999999999999999999999T", (1ull << 40) - 1);
	/* the largest size, and one past it */
	expect_size("18446744073709551615", UINT64_MAX);
	expect_size("16777215.999999TiB", (16777215ull << 40) + 1099510528264ull);
}

static void test_size_refuses(void **state)
{
	(void)state;
	static const char *const bad[] = {
	        "",
	        "0x10",
	        "0x10KiB",
	        "1e3",
	        "1E3",
	        "1e3K",
	        "inf",
	        "nan",
	        "infinity",
	        "INF",
	        " 1",
	        "\t1",
	        "1 ",
	        "1 K",
	        "-1",
	        "+1",
	        "-0",
	        ".5",
	        "5.",
	        "5.K",
	        "1..5",
	        "1.5.2",
	        "K",
	        "KiB",
	        "1KiBx",
	        "1Kb2",
	        "1,000",
	        "1_000",
	        "1KiB ",
	        "\xd9\xa1",
	        "18446744073709551616",
	        "99999999999999999999999",
	        "16777216TiB",
	        "17179869184GiB",
	        "0x",
	        "0b101",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_not_size(bad[i]);
	uint64_t v;
	assert_int_not_equal(units_parse_size(NULL, &v), 0);
}

static void test_duration(void **state)
{
	(void)state;
	expect_duration("90", 90);
	expect_duration("90s", 90);
	expect_duration("30m", 1800);
	expect_duration("2h", 7200);
	expect_duration("2d", 172800);
	expect_duration("1.5h", 5400);
	expect_duration("10min", 600);
	static const char *const bad[] = {"",    "1e3", "0x10", "inf", "nan", " 1m", "-1s",
	                                  "+1s", "1 h", ".5h",  "1.h", "1w",  "h",   "1hh"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_not_duration(bad[i]);
}

static void test_uint(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t max, want;
	} good[] = {
	        {"0", 10, 0},
	        {"7", 10, 7},
	        {"10", 10, 10},
	        {"0042", 100, 42},
	        {"4294967295", UINT32_MAX, UINT32_MAX},
	        {"18446744073709551615", UINT64_MAX, UINT64_MAX},
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		uint64_t v = 12345;
		if (units_parse_uint(good[i].s, 0, good[i].max, &v) != 0 || v != good[i].want)
			fail_msg("\"%s\" (max %llu) should be %llu", good[i].s,
			         (unsigned long long)good[i].max, (unsigned long long)good[i].want);
	}
	static const struct {
		const char *s;
		uint64_t max;
	} bad[] = {
	        {"", UINT64_MAX},
	        {"abc", UINT64_MAX},
	        {"banana", UINT64_MAX},
	        {"3x", UINT64_MAX},
	        {"1.5", UINT64_MAX},
	        {"1e3", UINT64_MAX},
	        {"0x10", UINT64_MAX},
	        {" 5", UINT64_MAX},
	        {"5 ", UINT64_MAX},
	        {"-1", UINT64_MAX},
	        {"+1", UINT64_MAX},
	        {"11", 10},
	        {"4294967296", UINT32_MAX},
	        {"18446744073709551616", UINT64_MAX},
	        {"99999999999999999999999999", UINT64_MAX},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 12345;
		if (units_parse_uint(bad[i].s, 0, bad[i].max, &v) == 0)
			fail_msg("\"%s\" (max %llu) should be refused (got %llu)", bad[i].s,
			         (unsigned long long)bad[i].max, (unsigned long long)v);
		assert_int_equal(v, 12345);
	}
	uint64_t v = 7;
	assert_int_not_equal(units_parse_uint(NULL, 0, 10, &v), 0);
	/* the minimum */
	assert_int_not_equal(units_parse_uint("0", 1, 65535, &v), 0);
	assert_int_equal(v, 7);
	assert_int_equal(units_parse_uint("1", 1, 65535, &v), 0);
	assert_int_equal(v, 1);
}

/* a flag that needs more than 0: 0 is told apart from what is not a number,
 * and the message says that 0 is the trouble */
static void test_nonzero(void **state)
{
	(void)state;
	uint64_t v = 12345;
	static const char *const zero_sizes[] = {"0", "0B", "0KiB", "0.0G", "0.4"};
	for (size_t i = 0; i < sizeof(zero_sizes) / sizeof(zero_sizes[0]); i++) {
		if (units_parse_size_nonzero(zero_sizes[i], &v) != UNITS_ZERO)
			fail_msg("\"%s\" should be UNITS_ZERO", zero_sizes[i]);
		assert_int_equal(v, 12345);
	}
	static const char *const zero_durations[] = {"0", "0s", "0m", "0.0h", "0.4s"};
	for (size_t i = 0; i < sizeof(zero_durations) / sizeof(zero_durations[0]); i++) {
		if (units_parse_duration_nonzero(zero_durations[i], &v) != UNITS_ZERO)
			fail_msg("\"%s\" should be UNITS_ZERO", zero_durations[i]);
		assert_int_equal(v, 12345);
	}
	assert_int_equal(units_parse_size_nonzero("lots", &v), -1);
	assert_int_equal(units_parse_size_nonzero("-0", &v), -1);
	assert_int_equal(units_parse_duration_nonzero("0w", &v), -1);
	assert_int_equal(units_parse_duration_nonzero(NULL, &v), -1);
	assert_int_equal(v, 12345);
	assert_int_equal(units_parse_size_nonzero("1", &v), 0);
	assert_int_equal(v, 1);
	assert_int_equal(units_parse_duration_nonzero("1.5m", &v), 0);
	assert_int_equal(v, 90);

	char why[128];
	assert_string_equal(units_zero_reason("0", "bytes", why, sizeof(why)),
	                    "must be more than 0");
	assert_string_equal(units_zero_reason("0s", "seconds", why, sizeof(why)),
	                    "must be more than 0");
	assert_string_equal(units_zero_reason("0.00GiB", "bytes", why, sizeof(why)),
	                    "must be more than 0");
	assert_string_equal(units_zero_reason("0.4s", "seconds", why, sizeof(why)),
	                    "must be more than 0 (0.4s counts as 0 whole seconds)");
	/* cut to the buffer, never past it */
	char small[8];
	assert_string_equal(units_zero_reason("0", "bytes", small, sizeof(small)), "must be");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_size_accepts), cmocka_unit_test(test_size_refuses),
	        cmocka_unit_test(test_duration),     cmocka_unit_test(test_uint),
	        cmocka_unit_test(test_ms),           cmocka_unit_test(test_nonzero),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
