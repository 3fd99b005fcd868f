/* Helpers for the benchmarks: a monotonic clock and best-of-N timing. */
#ifndef K3_BENCHUTIL_H
#define K3_BENCHUTIL_H

#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static inline double benchutil_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* BENCH_RESTORE_ROUNDS=N: more rounds of a restore, for a profiler to
 * attach to; `def` when unset or not a positive number. */
static inline long benchutil_restore_rounds(long def)
{
	const char *env = getenv("BENCH_RESTORE_ROUNDS");
	long n = env ? strtol(env, NULL, 10) : 0;
	return n > 0 ? n : def;
}

/* A buffer of our own, never shared copy-on-write with a forked child. A
 * fork write-protects every page of an ordinary buffer in the parent too, and
 * the next write into each page faults, even once the child has exec'd: a
 * restore timed into such a buffer pays ~0.2 s per 669 MiB for the fork of a
 * daemon before it (bench/tier2 did until 2026-12-04). NULL on failure; free
 * with munmap. */
static inline void *benchutil_private_buffer(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (madvise(p, len, MADV_DONTFORK) != 0) {
		munmap(p, len);
		return NULL;
	}
	return p;
}

/* Keeps a value alive so the compiler cannot drop the work that made it. */
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

/* Writes a scratch file of `bytes` under dir into the page cache and
 * removes it, so that the page-cache pages a write timed next takes are
 * pages the guest has used, not fresh ones: on this project's VMs a write
 * into fresh pages runs at ~0.5 GB/s and one into pages freed a moment
 * before at 4-9 GB/s (dd), which would time the hypervisor, not the code.
 * Nothing reaches the disk: the file is removed before write-back. 0, or
 * -1 with errno. */
static inline int benchutil_warm_page_cache(const char *dir, uint64_t bytes)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/warm.tmp", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return -1;
	static char buf[1 << 20];
	memset(buf, 1, sizeof(buf));
	int rc = 0;
	for (uint64_t done = 0; done < bytes && rc == 0; done += sizeof(buf))
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			rc = -1;
	close(fd);
	unlink(path);
	return rc;
}

#endif
