/* fault_sndbuf: an LD_PRELOAD fake of setsockopt(2) that caps the send
 * buffer a process asks for, so that a test sees the daemon's writes to a
 * client fall short (partial writes, output left queued) as on a host whose
 * net.core.wmem_max is small, whatever this host's is. Test-only: built as a
 * shared object, loaded into a real k3cached by the test that needs it.
 * K3FAULT_SNDBUF=N: SO_SNDBUF is set to at most N bytes. Every other call is
 * the real one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);

int setsockopt(int fd, int level, int name, const void *value, socklen_t len)
{
	static setsockopt_fn real;
	if (!real)
		real = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
	const char *cap = getenv("K3FAULT_SNDBUF");
	if (cap && level == SOL_SOCKET && name == SO_SNDBUF && value && len == sizeof(int)) {
		int want = *(const int *)value, most = (int)strtol(cap, NULL, 10);
		if (most > 0 && want > most)
			return real(fd, level, name, &most, len);
	}
	return real(fd, level, name, value, len);
}
