/* allocfail: makes the n-th allocation from now fail, for the tests linked
 * with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,
 * --wrap=strndup,--wrap=XXH3_createState (tests/CMakeLists.txt): the
 * project's own code in the test binary calls these wrappers, nothing in
 * the shipped libraries does. Include it in one file of the test. The
 * counters are shared with the children the code forks (the store's
 * structure check runs in one), so that a failure given there counts. */
#ifndef K3_ALLOCFAIL_H
#define K3_ALLOCFAIL_H

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
XXH3_state_t *__real_XXH3_createState(void);

struct allocfail {
	long fail_at; /* the n-th allocation from now fails (0: none) */
	long seen;    /* allocations counted since armed */
	long hit;     /* failures given */
};
static struct allocfail *allocfail;

__attribute__((constructor)) static void allocfail_map(void)
{
	void *p = mmap(NULL, sizeof(struct allocfail), PROT_READ | PROT_WRITE,
	               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		abort();
	allocfail = p;
}

static inline int allocfail_now(void)
{
	long at = allocfail ? __atomic_load_n(&allocfail->fail_at, __ATOMIC_SEQ_CST) : 0;
	if (!at || __atomic_add_fetch(&allocfail->seen, 1, __ATOMIC_SEQ_CST) != at)
		return 0;
	__atomic_add_fetch(&allocfail->hit, 1, __ATOMIC_SEQ_CST);
	return 1;
}

void *__wrap_malloc(size_t n)
{
	return allocfail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return allocfail_now() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	return allocfail_now() ? NULL : __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
	return allocfail_now() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
	return allocfail_now() ? NULL : __real_strndup(s, n);
}

XXH3_state_t *__wrap_XXH3_createState(void)
{
	return allocfail_now() ? NULL : __real_XXH3_createState();
}

/* From now, the n-th allocation fails (n > 0); the counts start again. */
static inline void allocfail_arm(long n)
{
	__atomic_store_n(&allocfail->seen, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&allocfail->hit, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&allocfail->fail_at, n, __ATOMIC_SEQ_CST);
}

static inline void allocfail_disarm(void)
{
	__atomic_store_n(&allocfail->fail_at, 0, __ATOMIC_SEQ_CST);
}

/* Failures given since armed. */
static inline long allocfail_hits(void)
{
	return __atomic_load_n(&allocfail->hit, __ATOMIC_SEQ_CST);
}

#endif
