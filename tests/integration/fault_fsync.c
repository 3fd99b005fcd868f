/* fault_fsync: an LD_PRELOAD fake of fdatasync(2) and fsync(2) that hangs
 * while the file K3FAULT_FSYNC_HANG names exists, as a disk that stops
 * answering would, for as long as a test wants. Test-only: built as a
 * shared object, loaded into a real k3cached by the test that needs it.
 * Every other call is the real one. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

static void hang_while_asked(void)
{
	const char *flag = getenv("K3FAULT_FSYNC_HANG");
	struct timespec pause = {0, 20000000L};
	while (flag && access(flag, F_OK) == 0)
		nanosleep(&pause, NULL);
}

int fdatasync(int fd)
{
	static sync_fn real;
	if (!real)
		real = (sync_fn)dlsym(RTLD_NEXT, "fdatasync");
	hang_while_asked();
	return real(fd);
}

int fsync(int fd)
{
	static sync_fn real;
	if (!real)
		real = (sync_fn)dlsym(RTLD_NEXT, "fsync");
	hang_while_asked();
	return real(fd);
}
