/* Helpers for the benchmarks: a monotonic clock and best-of-N timing. */
#ifndef K3_BENCHUTIL_H
#define K3_BENCHUTIL_H

#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double benchutil_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Keeps a value alive so the compiler cannot drop the work that made it. */
/* BENCH_RESTORE_ROUNDS=N: more rounds of a restore, for a profiler to
 * attach to; `def` when unset or not a positive number. */
static inline long benchutil_restore_rounds(long def)
{
	const char *env = getenv("BENCH_RESTORE_ROUNDS");
	long n = env ? strtol(env, NULL, 10) : 0;
	return n > 0 ? n : def;
}

static inline void benchutil_keep(const void *p)
{
	__asm__ volatile("" : : "r"(p) : "memory");
}

static inline int benchutil_rm_one(const char *path, const struct stat *sb, int flag,
                                   struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* Removes a directory tree (rm -rf), without a shell. */
static inline void benchutil_rm_rf(const char *dir)
{
	nftw(dir, benchutil_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
