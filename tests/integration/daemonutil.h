/* Helpers for the integration tests: run the real k3cached on a temporary
 * socket and store (as memcached's t/ does), and talk raw frames to it. */
#ifndef K3_DAEMONUTIL_H
#define K3_DAEMONUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"

struct daemonutil {
	char dir[256];
	char db[300];
	char sock[300];
	char log[300];
	pid_t pid;
};

static inline void daemonutil_sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Seconds on the monotonic clock. */
static inline double daemonutil_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int daemonutil_connect_raw(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%.100s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* Whether the daemon's log holds a line with `text`. */
static inline int daemonutil_log_has(const struct daemonutil *d, const char *text)
{
	FILE *f = fopen(d->log, "r");
	if (!f)
		return 0;
	char line[4096];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, text) != NULL;
	fclose(f);
	return found;
}

/* Starts k3cached with extra arguments (NULL-terminated); waits until its
 * socket answers. Returns 0 or -1. */
static inline int daemonutil_start(struct daemonutil *d, ...)
{
	const char *args[32];
	int n = 0;
	args[n++] = K3_DAEMON_PATH;
	args[n++] = "--db";
	args[n++] = d->db;
	args[n++] = "--socket";
	args[n++] = d->sock;
	args[n++] = "--log-level";
	args[n++] = "debug";
	va_list ap;
	va_start(ap, d);
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && n < 30)
		args[n++] = a;
	va_end(ap);
	args[n] = NULL;
	d->pid = fork();
	if (d->pid < 0)
		return -1;
	if (d->pid == 0) {
		/* dies with the test, and holds none of the test's output pipes:
		 * a crashed test must not leave ctest waiting on an orphan */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execv(args[0], (char *const *)args);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		int fd = daemonutil_connect_raw(d->sock);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		int status;
		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = 0;
			return -1;
		}
		daemonutil_sleep_ms(10);
	}
	return -1;
}

/* Creates the temporary directory and starts the daemon in it. */
static inline int daemonutil_init(struct daemonutil *d)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/k3d-test-XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	snprintf(d->db, sizeof(d->db), "%s/db", d->dir);
	snprintf(d->sock, sizeof(d->sock), "%s/k3cached.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/k3cached.log", d->dir);
	return 0;
}

/* Sends a signal and waits for the exit. Returns the exit status (or 128+sig). */
static inline int daemonutil_stop(struct daemonutil *d, int sig)
{
	if (d->pid <= 0)
		return -1;
	kill(d->pid, sig);
	int status = 0;
	waitpid(d->pid, &status, 0);
	d->pid = 0;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

/* 1 when the daemon process is still running. */
static inline int daemonutil_alive(struct daemonutil *d)
{
	int status;
	return d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == 0;
}

static inline void daemonutil_cleanup(struct daemonutil *d)
{
	if (d->pid > 0)
		daemonutil_stop(d, SIGKILL);
	if (getenv("K3_KEEP_TEST_DIRS"))
		return;
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
}

static inline int daemonutil_write_all(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static inline int daemonutil_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
	unsigned char *p = buf;
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while (len) {
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads one response frame; NULL on EOF/timeout. */
static inline frame_response *daemonutil_read_response(int fd, int timeout_ms)
{
	unsigned char pre[4];
	if (daemonutil_read_all(fd, pre, 4, timeout_ms) != 0)
		return NULL;
	uint32_t n = frame_get_len(pre);
	unsigned char *h = malloc(n ? n : 1);
	if (daemonutil_read_all(fd, h, n, timeout_ms) != 0) {
		free(h);
		return NULL;
	}
	frame_response *r = frame_decode_response(h, n, NULL);
	free(h);
	return r;
}

/* 1 when the peer closed the connection (EOF) within timeout. */
static inline int daemonutil_closed(int fd, int timeout_ms)
{
	unsigned char b;
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		ssize_t n = recv(fd, &b, 1, 0);
		if (n == 0)
			return 1;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ECONNRESET)
			return 1;
		if (n < 0)
			return 0;
		/* data: keep reading until EOF */
	}
}

/* Sends one request frame (header only). */
static inline int daemonutil_send_request(int fd, frame_request *req)
{
	unsigned char *buf;
	size_t n = frame_encode_request(req, &buf);
	if (!n)
		return -1;
	int rc = daemonutil_write_all(fd, buf, n);
	free(buf);
	return rc;
}

/* Sends a Hello request with this id. */
static inline int daemonutil_send_hello(int fd, uint64_t id)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Hello hello = K3CACHE__V1__HELLO__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	req.id = id;
	return daemonutil_send_request(fd, &req);
}

#endif
