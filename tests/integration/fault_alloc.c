/* fault_alloc: an LD_PRELOAD fake of malloc(3), calloc(3) and realloc(3)
 * that makes one allocation fail, as a process short of memory would see.
 * Test-only: built as a shared object, loaded into a real k3cached by the
 * test that needs it (not under ASan, which owns malloc).
 *
 * While the file K3FAULT_ALLOC_ARM names exists and holds "N GEN", the N-th
 * allocation counted since GEN was first seen fails (once per GEN), and the
 * file's name with ".hit" appended is written, holding GEN, so that the test
 * knows the failure was given. Everything else is the real allocator
 * (glibc's __libc_ entry points: no dlsym, which itself allocates). No call
 * here allocates. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);

static long gen_seen = -1; /* the GEN counted for */
static long counted;       /* allocations since it was first seen */
static int given;          /* its failure was given */

/* Reads "N GEN" from the arm file: 0 with them, or -1 (not armed). */
static int armed(const char *path, long *n, long *gen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char b[64];
	ssize_t got = read(fd, b, sizeof(b) - 1);
	close(fd);
	if (got <= 0)
		return -1;
	b[got] = 0;
	char *end;
	*n = strtol(b, &end, 10);
	*gen = strtol(end, NULL, 10);
	return *n > 0 ? 0 : -1;
}

static void say_hit(const char *path, long gen)
{
	char hit[4200], text[32];
	int len = snprintf(hit, sizeof(hit), "%s.hit", path);
	if (len < 0 || (size_t)len >= sizeof(hit))
		return;
	int fd = open(hit, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	len = snprintf(text, sizeof(text), "%ld\n", gen);
	if (len > 0)
		(void)!write(fd, text, (size_t)len);
	close(fd);
}

/* 1 when this allocation is the one to fail. errno is left as it was (the
 * arm file's open fails with ENOENT while the test does not arm). */
static int fail_now(void)
{
	/* getenv and snprintf do not allocate; be sure */
	static __thread __attribute__((tls_model("initial-exec"))) int inside;
	const char *path = getenv("K3FAULT_ALLOC_ARM");
	long n, gen;
	if (!path || inside)
		return 0;
	inside = 1;
	int saved = errno, fail = 0;
	if (armed(path, &n, &gen) == 0) {
		/* one process, a few threads: a lock would be the tidy way, but a
		 * lost count only moves which allocation fails */
		if (__atomic_exchange_n(&gen_seen, gen, __ATOMIC_SEQ_CST) != gen) {
			__atomic_store_n(&counted, 0, __ATOMIC_SEQ_CST);
			__atomic_store_n(&given, 0, __ATOMIC_SEQ_CST);
		}
		if (__atomic_add_fetch(&counted, 1, __ATOMIC_SEQ_CST) == n &&
		    !__atomic_exchange_n(&given, 1, __ATOMIC_SEQ_CST)) {
			say_hit(path, gen);
			fail = 1;
		}
	}
	errno = saved;
	inside = 0;
	return fail;
}

void *malloc(size_t n)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_realloc(p, n);
}
