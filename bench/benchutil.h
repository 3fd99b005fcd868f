/* Helpers for the benchmarks: a monotonic clock and best-of-N timing. */
#ifndef K3_BENCHUTIL_H
#define K3_BENCHUTIL_H

#include <stdint.h>
#include <time.h>

static inline double benchutil_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Keeps a value alive so the compiler cannot drop the work that made it. */
static inline void benchutil_keep(const void *p)
{
	__asm__ volatile("" : : "r"(p) : "memory");
}

#endif
