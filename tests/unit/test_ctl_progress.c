/* ctl/progress: the progress line's text (bytes, percent, rate, time left)
 * and what it writes: redrawn in place, always at 100%, cleared at the
 * end, nothing at all when off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"

static void expect_line(const char *what, uint64_t done, uint64_t total, double seconds,
                        const char *want)
{
	char line[192];
	ctl_progress_format(what, done, total, seconds, line, sizeof(line));
	if (strcmp(line, want) != 0)
		fail_msg("got  \"%s\"\nwant \"%s\"", line, want);
}

static void test_format(void **state)
{
	(void)state;
	const uint64_t MiB = 1u << 20;
	/* nothing done, or too soon: counts only */
	expect_line("export 0123456789abcdef: reading", 0, 64 * MiB, 3.0,
	            "export 0123456789abcdef: reading 0 B of 64 MiB (0%)");
	expect_line("x", 8 * MiB, 64 * MiB, 0.01, "x 8.0 MiB of 64 MiB (12%)");
	/* a rate, and the time left at that rate */
	expect_line("x", 16 * MiB, 64 * MiB, 2.0, "x 16 MiB of 64 MiB (25%), 8.0 MiB/s, ETA 6s");
	expect_line("x", 1 * MiB, 200 * MiB, 1.0,
	            "x 1.0 MiB of 200 MiB (0%), 1.0 MiB/s, ETA 3m19s");
	expect_line("x", 1 * MiB, 8000 * MiB, 1.0,
	            "x 1.0 MiB of 7.8 GiB (0%), 1.0 MiB/s, ETA 2h13m");
	/* done */
	expect_line("x", 64 * MiB, 64 * MiB, 4.0, "x 64 MiB of 64 MiB (100%), 16 MiB/s, done");
	expect_line("x", 0, 0, 1.0, "x 0 B of 0 B (100%)");
	/* a short buffer is cut, never overrun */
	char small[12];
	memset(small, 'Z', sizeof(small));
	ctl_progress_format("export", 16 * MiB, 64 * MiB, 2.0, small, sizeof(small) - 2);
	assert_int_equal(strlen(small), sizeof(small) - 3);
	assert_int_equal(small[sizeof(small) - 1], 'Z');
}

/* What a progress writes to `out`, as a string (caller frees). */
static char *written(FILE *out)
{
	long n = ftell(out);
	assert_true(n >= 0);
	char *s = calloc(1, (size_t)n + 1);
	rewind(out);
	assert_int_equal(fread(s, 1, (size_t)n, out), (size_t)n);
	return s;
}

static void test_draws_and_clears(void **state)
{
	(void)state;
	FILE *out = tmpfile();
	assert_non_null(out);
	struct ctl_progress p;
	ctl_progress_begin(&p, out, "import f: checking", 300);
	ctl_progress_add(&p, 100); /* drawn or not, as the clock says */
	ctl_progress_add(&p, 200); /* 100%: always drawn */
	ctl_progress_add(&p, 0);   /* nothing new: not again */
	ctl_progress_end(&p);
	char *s = written(out);
	const char *first = "\rimport f: checking 0 B of 300 B (0%)\033[K";
	if (strncmp(s, first, strlen(first)) != 0)
		fail_msg("wrote \"%s\"", s);
	const char *full = strstr(s, "\rimport f: checking 300 B of 300 B (100%)");
	if (!full) {
		fail_msg("no 100%% line in \"%s\"", s);
		return;
	}
	assert_null(strstr(strstr(full, "(100%)") + 1, "(100%)")); /* once */
	size_t len = strlen(s);
	assert_true(len > 4);
	assert_string_equal(s + len - 4, "\r\033[K"); /* the line is cleared */
	free(s);
	fclose(out);
}

static void test_note(void **state)
{
	(void)state;
	FILE *out = tmpfile();
	struct ctl_progress p;
	ctl_progress_note(&p, out, "verify: checking every entry ...");
	ctl_progress_add(&p, 12); /* a note counts nothing */
	ctl_progress_end(&p);
	char *s = written(out);
	assert_string_equal(s, "\rverify: checking every entry ...\033[K\r\033[K");
	free(s);
	fclose(out);
}

static void test_off(void **state)
{
	(void)state;
	struct ctl_progress p;
	ctl_progress_begin(&p, NULL, "x", 10);
	ctl_progress_add(&p, 10);
	ctl_progress_end(&p);
	ctl_progress_note(&p, NULL, "x");
	ctl_progress_end(&p);
	assert_null(p.out);
	/* --json never shows progress, whatever stderr is */
	assert_int_equal(ctl_progress_wanted(1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_format),
	        cmocka_unit_test(test_draws_and_clears),
	        cmocka_unit_test(test_note),
	        cmocka_unit_test(test_off),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
