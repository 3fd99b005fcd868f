/* fault_mremap: an LD_PRELOAD fake of mremap(2) for the daemon's receive
 * windows (daemon/window.c), so that tests reach the paths a kernel or a
 * short memory takes. Test-only: built as a shared object, loaded into a
 * real k3cached by the test that needs it. K3FAULT_MREMAP says what fails:
 *   dontunmap  every move out with MREMAP_DONTUNMAP (kernels before 5.7):
 *              EINVAL;
 *   fixed:N    the N-th move in with MREMAP_FIXED (counted from 1): ENOMEM.
 * Every other call is the real one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);

void *mremap(void *old, size_t old_size, size_t new_size, int flags, ...)
{
	static mremap_fn real;
	static long fixed_calls;
	if (!real)
		real = (mremap_fn)dlsym(RTLD_NEXT, "mremap");
	void *to = NULL;
	if (flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) {
		va_list ap;
		va_start(ap, flags);
		to = va_arg(ap, void *);
		va_end(ap);
	}
	const char *f = getenv("K3FAULT_MREMAP");
	if (f && (flags & MREMAP_DONTUNMAP) && !strcmp(f, "dontunmap")) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (f && (flags & MREMAP_FIXED) && !strncmp(f, "fixed:", 6) &&
	    __atomic_add_fetch(&fixed_calls, 1, __ATOMIC_RELAXED) == strtol(f + 6, NULL, 10)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return real(old, old_size, new_size, flags, to);
}
