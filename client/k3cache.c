/* libk3cache: the C client of k3cached (client/k3cache.h).
 *
 * One connection is one stream socket, set non-blocking: every read and write
 * is tried first and, when the socket is not ready, waited for with poll() and
 * the connection's timeout. Payloads travel straight between the socket and
 * the caller's memory: a publish is one gather write of the header and the
 * caller's blobs (sendmsg, at most IOV_MAX pieces per call), a restore reads
 * each layer straight into its destination.
 *
 * A connection whose stream can no longer be trusted (an I/O error, a timeout,
 * a frame that does not decode, an answer to another request) is closed at
 * once; every later call on it fails fast with unreachable set. A restore that
 * fails validation reads and drops the rest of its payload, so the connection
 * stays usable. */
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "model.h"
#include "paths.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "blob.h"
#include "blob_stream.h"
#include "checksum.h"
#include "frame.h"
#include "hexutil.h"
#include "ops.h"
#include "prefix.h"
#include "ranges.h"
#include "units.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

#define DEFAULT_TIMEOUT_MS 60000
/* Bytes per sendmsg. One call with a whole snapshot's iovecs copies hundreds
 * of MiB inside the kernel while the daemon drains the socket, and a kernel
 * built with preemption "none" (common on servers, and this VM's) switches
 * tasks only when the call returns: every other process on that CPU, other
 * workers' lookups included, waited up to 46 ms (measured with perf sched).
 * A bounded call returns to user space, where the scheduler can switch. */
#define SEND_SLICE    ((size_t)1 << 20)
#define SOCKET_BUFFER (4 << 20) /* SO_SNDBUF / SO_RCVBUF asked for */
#define DRAIN_CHUNK   (64u << 10)
#define HEADER_SMALL  4096u /* response headers up to this need no malloc */
#define ADDR_MAX      300
#define CLIENT_NAME   "libk3cache"

struct k3cache {
	int fd;              /* -1 once the connection is closed */
	int timeout_ms;      /* for each wait; 0: none */
	uint64_t last_id;    /* id of the last request sent */
	uint64_t pending;    /* payload bytes of the last response not read yet */
	unsigned char *snap; /* restore buffer (restore_each, lookup_restore), reused */
	size_t snap_cap;
	char addr[ADDR_MAX];   /* "unix:PATH" or "tcp:HOST:PORT", for messages */
	char token[128];       /* TCP: $K3CACHE_TOKEN, sent in every Hello */
	unsigned char ns[128]; /* the daemon's prefix for our salts (Hello's namespace) */
	size_t ns_len;
	int ns_known;                  /* a Hello has told it */
	int hung_up;                   /* the last read met the daemon's end of the stream */
	uint64_t store_dev, store_ino; /* the Hello's: the daemon's store file (0: not said) */
	unsigned char hdr[HEADER_SMALL];
	void (*on_sent)(uint64_t bytes, void *ctx); /* k3cache_set_send_progress */
	void *on_sent_ctx;
};

/* ---- errors ---- */

/* The public codes are the wire's, as status.h's are. */
#define SAME_CODE(x)                                                                               \
	_Static_assert((int)K3CACHE_##x == (int)STATUS_##x &&                                      \
	                       (int)K3CACHE_##x == (int)K3CACHE__V1__CODE__##x,                    \
	               "code " #x)
SAME_CODE(OK);
SAME_CODE(NOT_FOUND);
SAME_CODE(INVALID);
SAME_CODE(CORRUPT);
SAME_CODE(UNKNOWN_MODEL);
SAME_CODE(TOO_LARGE);
SAME_CODE(BUSY);
SAME_CODE(FULL);
SAME_CODE(UNSUPPORTED);
SAME_CODE(INTERNAL);
SAME_CODE(DENIED);
_Static_assert(STATUS_N_CODES == K3CACHE_DENIED + 1, "every code is listed");
_Static_assert(K3CACHE_MESSAGE_MAX == STATUS_MESSAGE_MAX, "message length");

const char *k3cache_code_name(int code)
{
	return status_code_name((enum status_code)code);
}

static void err_clear(struct k3cache_error *err)
{
	if (err) {
		err->code = K3CACHE_OK;
		err->unreachable = 0;
		err->message[0] = '\0';
	}
}

/* Fills *err (when not NULL). */
__attribute__((format(printf, 4, 5))) static void
set_error(struct k3cache_error *err, enum status_code code, int unreachable, const char *fmt, ...)
{
	if (!err)
		return;
	err->code = (enum k3cache_code)code;
	err->unreachable = unreachable;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
}

/* Fills *err and yields code. (Macros, not functions, so that static analysis
 * sees the code returned.) */
#define FAIL(err, code, unreachable, ...)                                                          \
	(set_error((err), (code), (unreachable), __VA_ARGS__), (int)(code))

/* Appends text to the message already in *err. */
static void err_append(struct k3cache_error *err, const char *text)
{
	if (!err)
		return;
	size_t used = strnlen(err->message, sizeof(err->message));
	if (used + 1 < sizeof(err->message))
		snprintf(err->message + used, sizeof(err->message) - used, "%s", text);
}

static const char *errno_text(int e, char *buf, size_t bufsz)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
	return strerror_r(e, buf, bufsz);
#else
	if (strerror_r(e, buf, bufsz) != 0)
		snprintf(buf, bufsz, "error %d", e);
	return buf;
#endif
}

static void drop(struct k3cache *c)
{
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	c->pending = 0;
}

/* The daemon cannot be talked to any more: closes the connection, reports an
 * unreachable INTERNAL error. */
#define LOST(c, err, ...)                                                                          \
	(drop(c), set_error((err), STATUS_INTERNAL, 1, __VA_ARGS__), (int)STATUS_INTERNAL)

/* The daemon broke the protocol: the stream cannot be trusted past this point,
 * so the connection is closed, and reported unreachable as every closed
 * connection is (the caller connects again). */
#define BROKEN(c, err, ...)                                                                        \
	(drop(c), set_error((err), STATUS_INTERNAL, 1, __VA_ARGS__), (int)STATUS_INTERNAL)

static int lost_errno(struct k3cache *c, struct k3cache_error *err, int e, const char *doing)
{
	char eb[128];
	return LOST(c, err, "lost the connection to %s while %s: %s", c->addr, doing,
	            errno_text(e, eb, sizeof(eb)));
}

static int usable(struct k3cache *c, struct k3cache_error *err)
{
	if (!c)
		return FAIL(err, STATUS_INVALID, 0,
		            "no connection (NULL): call k3cache_connect first");
	if (c->fd < 0)
		return FAIL(err, STATUS_INTERNAL, 1,
		            "connection is closed: an earlier call on %s failed; connect again",
		            c->addr);
	return 0;
}

/* ---- socket I/O ---- */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or timeout_ms (0: forever) has passed,
 * with what it is ready for in *ready. Returns 0, ETIMEDOUT, or the errno
 * of poll(). */
static int wait_events(int fd, short events, int timeout_ms, short *ready)
{
	struct pollfd p = {.fd = fd, .events = events};
	int64_t deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
	for (;;) {
		int wait = -1;
		if (deadline) {
			int64_t left = deadline - now_ms();
			wait = left > 0 ? (int)left : 0;
		}
		int n = poll(&p, 1, wait);
		if (n > 0) {
			*ready = p.revents;
			return 0; /* POLLERR / POLLHUP: the I/O call that follows says what */
		}
		if (n == 0)
			return ETIMEDOUT;
		if (errno != EINTR)
			return errno;
	}
}

static int wait_ready(int fd, short events, int timeout_ms)
{
	short ready;
	return wait_events(fd, events, timeout_ms, &ready);
}

/* Whether the daemon has said something (or hung up): an answer waiting. */
static int answer_waiting(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

static int wait_io(struct k3cache *c, short events, struct k3cache_error *err)
{
	int e = wait_ready(c->fd, events, c->timeout_ms);
	if (e == ETIMEDOUT)
		return LOST(c, err,
		            "%s %s timed out after %d ms (k3cache_set_timeout); the connection is "
		            "closed",
		            events == POLLIN ? "waiting for an answer from" : "sending to", c->addr,
		            c->timeout_ms);
	if (e)
		return lost_errno(c, err, e, "waiting for the socket");
	return 0;
}

static int recv_all(struct k3cache *c, void *buf, size_t len, struct k3cache_error *err)
{
	unsigned char *p = buf;
	while (len > 0) {
		ssize_t n = recv(c->fd, p, len, 0);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0) {
			c->hung_up = 1;
			return LOST(c, err, "the daemon at %s closed the connection", c->addr);
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int rc = wait_io(c, POLLIN, err);
			if (rc)
				return rc;
			continue;
		}
		return lost_errno(c, err, errno, "reading");
	}
	return 0;
}

/* send_iov: the daemon answered while the payload was going out. */
#define EARLY_ANSWER (-1)

/* Sends iov[0..n) whole, IOV_MAX pieces at a time, resuming after partial
 * writes. Consumes (modifies) the array. Returns 0, or an errno with the
 * connection still open so that the caller can look for an answer that
 * explains why the daemon hung up; a timeout is reported as ETIMEDOUT.
 * With watch (a request with a payload) it stops at EARLY_ANSWER when the
 * daemon answers before the payload is all out: a refusal at the header,
 * whose payload the daemon only skips. It looks before each slice (a poll
 * per MiB, a microsecond against the slice's 200), as a socket the daemon
 * drains as it skips may never fill. */
static int send_iov(struct k3cache *c, struct iovec *iov, size_t n, int watch)
{
	while (n > 0) {
		if (watch && answer_waiting(c->fd))
			return EARLY_ANSWER;
		if (iov->iov_len == 0) {
			iov++;
			n--;
			continue;
		}
		/* at most SEND_SLICE bytes per call: see its definition */
		size_t cnt = 0, bytes = 0;
		while (cnt < n && cnt < (size_t)IOV_MAX && bytes < SEND_SLICE)
			bytes += iov[cnt++].iov_len;
		size_t last_len = iov[cnt - 1].iov_len;
		if (bytes > SEND_SLICE)
			iov[cnt - 1].iov_len -= bytes - SEND_SLICE;
		struct msghdr msg;
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = cnt;
		ssize_t k = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
		iov[cnt - 1].iov_len = last_len;
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				short ready = 0;
				int e = wait_events(c->fd, watch ? POLLOUT | POLLIN : POLLOUT,
				                    c->timeout_ms, &ready);
				if (e)
					return e;
				if (watch && (ready & POLLIN)) /* nothing else is due */
					return EARLY_ANSWER;
				continue;
			}
			return errno;
		}
		size_t done = (size_t)k;
		if (c->on_sent)
			c->on_sent((uint64_t)k, c->on_sent_ctx);
		while (n > 0 && done >= iov->iov_len) {
			done -= iov->iov_len;
			iov++;
			n--;
		}
		if (done) {
			iov->iov_base = (unsigned char *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	return 0;
}

/* Reads len bytes of the pending payload into buf. */
static int read_payload(struct k3cache *c, void *buf, size_t len, struct k3cache_error *err)
{
	int rc = recv_all(c, buf, len, err);
	if (rc == 0)
		c->pending -= len;
	return rc;
}

/* Reads and drops the rest of the pending payload. */
static int drain(struct k3cache *c, struct k3cache_error *err)
{
	unsigned char junk[DRAIN_CHUNK];
	while (c->pending > 0) {
		size_t n = c->pending < sizeof(junk) ? (size_t)c->pending : sizeof(junk);
		int rc = read_payload(c, junk, n, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* Drains after a failure already reported in *err; the report stays. When
 * the drain itself fails the connection is closed and the message says so. */
static void drain_after_failure(struct k3cache *c, struct k3cache_error *err)
{
	if (c->fd < 0 || c->pending == 0)
		return;
	struct k3cache_error tmp;
	if (drain(c, &tmp) != 0)
		err_append(err, " (the connection was then lost skipping the rest of the payload)");
}

/* Reads one response frame, checks it answers the last request, and leaves
 * its payload pending. */
static int read_response(struct k3cache *c, frame_response **out, struct k3cache_error *err)
{
	unsigned char prefix[FRAME_PREFIX_LEN];
	int rc = recv_all(c, prefix, sizeof(prefix), err);
	if (rc)
		return rc;
	uint32_t hlen = frame_get_len(prefix);
	struct status st;
	if (frame_check_header_len(hlen, &st) != STATUS_OK)
		return BROKEN(c, err,
		              "the daemon at %s sent a bad frame (%s); the connection is closed",
		              c->addr, st.message);
	unsigned char *hdr = c->hdr;
	if (hlen > sizeof(c->hdr) && !(hdr = malloc(hlen)))
		return LOST(c, err, "out of memory reading a %u-byte answer from %s", hlen,
		            c->addr);
	rc = recv_all(c, hdr, hlen, err);
	frame_response *r = rc ? NULL : frame_decode_response(hdr, hlen, &st);
	if (hdr != c->hdr)
		free(hdr);
	if (rc)
		return rc;
	if (!r && st.code == STATUS_INTERNAL) /* ours, not the daemon's */
		return LOST(c, err, "%s from %s", st.message, c->addr);
	if (!r)
		return BROKEN(c, err, "the daemon at %s sent an answer that does not decode (%s)",
		              c->addr, st.message);
	if (r->id == 0 && r->code != 0) {
		/* a request the daemon could not read (it lacked the memory to
		 * decode it, say): it answers without an id, then closes */
		enum status_code code = (enum status_code)r->code;
		set_error(err, code, 1, "the daemon at %s could not read the request: %s", c->addr,
		          r->message ? r->message : "");
		frame_response_free(r);
		drop(c);
		return (int)code;
	}
	if (r->id != c->last_id) {
		uint64_t got = r->id;
		frame_response_free(r);
		return BROKEN(c, err,
		              "response id %" PRIu64 " does not match request id %" PRIu64
		              " (the daemon at %s is out of step); the connection is closed",
		              got, c->last_id, c->addr);
	}
	c->pending = r->payload_len;
	*out = r;
	return 0;
}

/* After the daemon hung up on a request (it refuses a frame that way:
 * TOO_LARGE), its error answer may be waiting: returns it, or NULL. */
static frame_response *hangup_answer(struct k3cache *c)
{
	frame_response *r = NULL;
	struct k3cache_error tmp;
	int saved = c->timeout_ms;
	c->timeout_ms = 1000;
	int rc = read_response(c, &r, &tmp);
	c->timeout_ms = saved;
	if (rc == 0 && r->code == K3CACHE__V1__CODE__OK) {
		frame_response_free(r);
		r = NULL;
	}
	return rc == 0 ? r : NULL;
}

/* The send failed with errno e: reports the daemon's answer when it hung up
 * with one, else the error; closes the connection. */
static int send_failed(struct k3cache *c, int e, struct k3cache_error *err)
{
	if (e == ETIMEDOUT)
		return LOST(c, err,
		            "sending to %s timed out after %d ms (k3cache_set_timeout); the "
		            "connection is closed",
		            c->addr, c->timeout_ms);
	frame_response *r = e == EPIPE || e == ECONNRESET ? hangup_answer(c) : NULL;
	if (r && r->code != K3CACHE__V1__CODE__OK) {
		enum status_code code = (enum status_code)r->code;
		set_error(err, code, 1, "%s (the daemon closed the connection)",
		          r->message && *r->message ? r->message : "no message");
		frame_response_free(r);
		drop(c);
		return (int)code;
	}
	frame_response_free(r);
	return lost_errno(c, err, e, "sending");
}

/* The daemon answered a request before its payload was all sent: the rest
 * is not sent (the daemon would skip it), so the connection is out of step
 * and closed; its answer is the error reported. */
static int early_answer(struct k3cache *c, struct k3cache_error *err)
{
	frame_response *r = NULL;
	int rc = read_response(c, &r, err);
	if (rc)
		return rc;
	enum status_code code = (enum status_code)r->code;
	if (code == STATUS_OK) {
		frame_response_free(r);
		return BROKEN(c, err,
		              "the daemon at %s answered OK before the request's payload was "
		              "sent; the connection is closed",
		              c->addr);
	}
	set_error(err, code, 1,
	          "%s (answered before the payload was all sent; the connection is closed: "
	          "connect again)",
	          r->message && *r->message ? r->message : "no message");
	frame_response_free(r);
	drop(c);
	return (int)code;
}

/* Sends req (its id set here) and, when n_iov > 1, the payload in iov[1..n_iov)
 * (iov[0] is filled here with the header), then reads the answer. With
 * keep_errors a daemon error answer is returned in *out like any other;
 * without, it is returned as its code and message and *out is NULL. */
static int exchange(struct k3cache *c, frame_request *req, struct iovec *iov, size_t n_iov,
                    int keep_errors, frame_response **out, struct k3cache_error *err)
{
	*out = NULL;
	if (c->pending) { /* a raw caller left a payload unread */
		int rc = drain(c, err);
		if (rc)
			return rc;
	}
	req->id = ++c->last_id;
	unsigned char *hdr = NULL;
	size_t hlen = frame_encode_request(req, &hdr);
	if (hlen == 0) {
		/* sized only now: a long prompt's size costs a pass over its tokens */
		size_t packed = k3cache__v1__request__get_packed_size(req);
		if (packed > FRAME_MAX_HEADER)
			return FAIL(
			        err, STATUS_TOO_LARGE, 0,
			        "the %s request header would be %zu bytes, over the 16 MiB frame "
			        "limit (too many tokens?)",
			        ops_name(req), packed);
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory encoding a %zu-byte request",
		            packed);
	}
	struct iovec one;
	if (!iov) {
		iov = &one;
		n_iov = 1;
	}
	iov[0].iov_base = hdr;
	iov[0].iov_len = hlen;
	int e = send_iov(c, iov, n_iov, n_iov > 1);
	free(hdr);
	if (e == EARLY_ANSWER) {
		int rc = early_answer(c, err);
		return rc ? rc : (int)STATUS_INTERNAL; /* never 0: *out is NULL */
	}
	if (e) {
		int rc = send_failed(c, e, err);
		return rc ? rc : (int)STATUS_INTERNAL; /* never 0: *out is NULL */
	}

	frame_response *r = NULL;
	int rc = read_response(c, &r, err);
	if (rc)
		return rc;
	/* a payload where the protocol has none (an error, or an op that never
	 * carries one) is a daemon out of step: never drained, as its length
	 * is the daemon's word alone and could keep a call waiting for ever */
	int may_carry = r->code == K3CACHE__V1__CODE__OK &&
	                (req->op_case == K3CACHE__V1__REQUEST__OP_RESTORE ||
	                 (req->op_case == K3CACHE__V1__REQUEST__OP_LOOKUP && req->lookup->restore));
	if (r->payload_len && !may_carry) {
		uint64_t plen = r->payload_len;
		enum status_code code = (enum status_code)r->code;
		frame_response_free(r);
		return BROKEN(c, err,
		              "the daemon at %s answered %s (%s) with a %" PRIu64
		              "-byte payload, which that answer never has; the connection is "
		              "closed",
		              c->addr, ops_name(req), status_code_name(code), plen);
	}
	if (!keep_errors && r->code != K3CACHE__V1__CODE__OK) {
		enum status_code code = (enum status_code)r->code;
		if (r->message && *r->message)
			set_error(err, code, 0, "%s", r->message);
		else
			set_error(err, code, 0, "the daemon at %s answered %s with no message",
			          c->addr, status_code_name(code));
		frame_response_free(r);
		drain_after_failure(c, err);
		return (int)code;
	}
	*out = r;
	return 0;
}

/* Frees an answer whose op carries no payload; drops a stray one. */
static int finish(struct k3cache *c, frame_response *r, struct k3cache_error *err)
{
	frame_response_free(r);
	return c->pending ? drain(c, err) : 0;
}

/* ---- connecting ---- */

static void set_socket_options(int fd, int tcp)
{
	int size = SOCKET_BUFFER;
	/* best effort: the kernel caps these at its rmem_max / wmem_max */
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
	if (tcp) {
		int one = 1;
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
}

/* connect() on a non-blocking socket, waiting at most timeout_ms. Returns 0
 * or an errno. */
static int connect_wait(int fd, const struct sockaddr *sa, socklen_t salen, int timeout_ms)
{
	if (connect(fd, sa, salen) == 0)
		return 0;
	int e = errno;
	if (e != EINPROGRESS && e != EINTR)
		return e;
	e = wait_ready(fd, POLLOUT, timeout_ms);
	if (e)
		return e;
	int soerr = 0;
	socklen_t len = sizeof(soerr);
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
		return errno;
	return soerr;
}

/* What a failed connect to a Unix socket means, for a person to act on. */
static void unix_failure(const char *path, int e, char *out, size_t cap)
{
	struct stat st;
	if (e == ENOENT) {
		snprintf(out, cap,
		         "no socket there: is k3cached running, and is this its --socket?");
	} else if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		snprintf(out, cap, "that is not a socket: is this k3cached's --socket?");
	} else if (e == ECONNREFUSED) {
		snprintf(out, cap, "nothing listens there: the daemon that made it has stopped");
	} else if ((e == EACCES || e == EPERM) && stat(path, &st) == 0) {
		char gbuf[1024];
		struct group g, *gr = NULL;
		(void)getgrgid_r(st.st_gid, &g, gbuf, sizeof(gbuf), &gr);
		char gname[64];
		if (gr)
			snprintf(gname, sizeof(gname), "%s", gr->gr_name);
		else
			snprintf(gname, sizeof(gname), "%u", (unsigned)st.st_gid);
		snprintf(out, cap,
		         "the socket is mode %04o, group %s: connecting needs write access to "
		         "the socket; add this user to that group (and log in again)",
		         (unsigned)(st.st_mode & 07777), gname);
	} else if (e == EACCES || e == EPERM) {
		snprintf(out, cap, "a directory on the way is closed to this user");
	} else if (e == EAGAIN) {
		snprintf(out, cap, "the daemon's listen queue is full");
	} else {
		snprintf(out, cap, "k3cached's socket");
	}
}

static int connect_unix(struct k3cache *c, const char *path, struct k3cache_error *err)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	size_t len = strlen(path);
	if (len == 0)
		return FAIL(err, STATUS_INVALID, 0,
		            "empty socket path: use unix:PATH or tcp:HOST:PORT");
	if (len >= sizeof(sa.sun_path))
		return FAIL(err, STATUS_INVALID, 0,
		            "socket path %s is %zu bytes, over the %zu a Unix socket address holds",
		            path, len, sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, len);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		char eb[128];
		return FAIL(err, STATUS_INTERNAL, 1, "cannot connect to %s: socket: %s", c->addr,
		            errno_text(errno, eb, sizeof(eb)));
	}
	set_socket_options(fd, 0);
	/* A Unix connect completes at once unless the daemon's listen queue is
	 * full; then a non-blocking one fails with EAGAIN, a blocking one waits
	 * for room: wait, bounded by the timeout. */
	struct timeval tv = {.tv_sec = c->timeout_ms / 1000,
	                     .tv_usec = (suseconds_t)(c->timeout_ms % 1000) * 1000};
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	int rc;
	do
		rc = connect(fd, (const struct sockaddr *)&sa, (socklen_t)sizeof(sa));
	while (rc != 0 && errno == EINTR);
	int e = rc ? errno : 0;
	struct timeval none = {0};
	if (!e && (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none)) != 0 ||
	           fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0))
		e = errno;
	if (e) {
		close(fd);
		char eb[128], why[256];
		unix_failure(path, e, why, sizeof(why));
		return FAIL(err, STATUS_INTERNAL, 1, "cannot connect to %s: %s (%s)", c->addr,
		            errno_text(e, eb, sizeof(eb)), why);
	}
	c->fd = fd;
	return 0;
}

static int connect_tcp(struct k3cache *c, const char *hostport, struct k3cache_error *err)
{
	const char *colon = strrchr(hostport, ':');
	if (!colon || colon == hostport || colon[1] == '\0')
		return FAIL(err, STATUS_INVALID, 0, "bad address %s: expected tcp:HOST:PORT",
		            c->addr);
	char host[256];
	const char *h = hostport;
	size_t hlen = (size_t)(colon - hostport);
	if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') { /* tcp:[::1]:7000 */
		h++;
		hlen -= 2;
	}
	if (hlen == 0 || hlen >= sizeof(host))
		return FAIL(err, STATUS_INVALID, 0, "bad address %s: expected tcp:HOST:PORT",
		            c->addr);
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	uint64_t port;
	if (units_parse_uint(colon + 1, 1, 65535, &port) != 0)
		return FAIL(err, STATUS_INVALID, 0,
		            "bad address %s: the port is a whole number from 1 to 65535", c->addr);

	struct addrinfo hints;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	struct addrinfo *res = NULL;
	int g = getaddrinfo(host, colon + 1, &hints, &res);
	if (g != 0) {
		char eb[128];
		return FAIL(err, STATUS_INTERNAL, 1, "cannot resolve %s: %s", c->addr,
		            g == EAI_SYSTEM ? errno_text(errno, eb, sizeof(eb)) : gai_strerror(g));
	}
	int e = ECONNREFUSED;
	for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
		                ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		set_socket_options(fd, 1);
		e = connect_wait(fd, ai->ai_addr, ai->ai_addrlen, c->timeout_ms);
		if (e == 0) {
			c->fd = fd;
			break;
		}
		close(fd);
	}
	freeaddrinfo(res);
	if (c->fd < 0) {
		char eb[128];
		return FAIL(err, STATUS_INTERNAL, 1, "cannot connect to %s: %s", c->addr,
		            errno_text(e, eb, sizeof(eb)));
	}
	return 0;
}

const char *k3cache_default_socket(char *buf, size_t bufsz)
{
	if (!buf || bufsz == 0)
		return buf;
	return paths_client_socket(buf, bufsz);
}

int k3cache_connect(const char *addr, struct k3cache **out, struct k3cache_error *err)
{
	return k3cache_connect_within(addr, DEFAULT_TIMEOUT_MS, out, err);
}

int k3cache_connect_within(const char *addr, int timeout_ms, struct k3cache **out,
                           struct k3cache_error *err)
{
	err_clear(err);
	if (!out)
		return FAIL(err, STATUS_INVALID, 0, "k3cache_connect: out is NULL");
	*out = NULL;
	char defbuf[PATH_MAX];
	if (!addr)
		addr = k3cache_default_socket(defbuf, sizeof(defbuf));
	struct k3cache *c = calloc(1, sizeof(*c));
	if (!c)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory connecting to %s", addr);
	c->fd = -1;
	c->timeout_ms = timeout_ms;
	int rc;
	if (strncmp(addr, "tcp:", 4) == 0) {
		snprintf(c->addr, sizeof(c->addr), "%s", addr);
		rc = connect_tcp(c, addr + 4, err);
	} else {
		const char *path = strncmp(addr, "unix:", 5) == 0 ? addr + 5 : addr;
		snprintf(c->addr, sizeof(c->addr), "unix:%s", path);
		rc = connect_unix(c, path, err);
	}
	if (rc) {
		free(c);
		return rc;
	}
	/* a TCP listener with --token-file answers nothing but Hello until a
	 * Hello carries a token of it; the Unix socket knows the peer's uid */
	const char *token = getenv("K3CACHE_TOKEN");
	if (strncmp(c->addr, "tcp:", 4) == 0 && token && *token) {
		if (strlen(token) >= sizeof(c->token)) {
			k3cache_close(c);
			return FAIL(err, STATUS_INVALID, 0, "$K3CACHE_TOKEN is over %zu bytes",
			            sizeof(c->token) - 1);
		}
		snprintf(c->token, sizeof(c->token), "%s", token);
		if ((rc = k3cache_hello(c, NULL, 0, err)) != 0) {
			k3cache_close(c);
			return rc;
		}
	}
	*out = c;
	return 0;
}

int k3cache_connect_timeout(const char *addr, int timeout_ms, struct k3cache **out,
                            struct k3cache_error *err)
{
	return k3cache_connect_within(addr, timeout_ms > 0 ? timeout_ms : 0, out, err);
}

void k3cache_close(struct k3cache *c)
{
	if (!c)
		return;
	drop(c);
	free(c->snap);
	free(c);
}

void k3cache_set_timeout(struct k3cache *c, int ms)
{
	if (c)
		c->timeout_ms = ms > 0 ? ms : 0;
}

/* ---- hello, models ---- */

int k3cache_hello(struct k3cache *c, char *server, size_t serversz, struct k3cache_error *err)
{
	err_clear(err);
	if (server && serversz)
		server[0] = '\0';
	int rc = usable(c, err);
	if (rc)
		return rc;
	K3cache__V1__Hello hello = K3CACHE__V1__HELLO__INIT;
	hello.protocol = K3CACHE_PROTOCOL;
	hello.client = (char *)CLIENT_NAME;
	if (c->token[0])
		hello.token = c->token;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	frame_response *r = NULL;
	if ((rc = exchange(c, &req, NULL, 0, 0, &r, err)))
		return rc;
	if (r->protocol != K3CACHE_PROTOCOL) {
		rc = FAIL(err, STATUS_UNSUPPORTED, 0,
		          "the daemon at %s (%s) speaks protocol %u, this library speaks %u: use a "
		          "matching libk3cache",
		          c->addr, r->server && *r->server ? r->server : "unnamed", r->protocol,
		          K3CACHE_PROTOCOL);
		finish(c, r, NULL);
		return rc;
	}
	if (server && serversz)
		snprintf(server, serversz, "%s", r->server ? r->server : "");
	if (r->code == K3CACHE__V1__CODE__OK && r->namespace_.len <= sizeof(c->ns)) {
		if (r->namespace_.len)
			memcpy(c->ns, r->namespace_.data, r->namespace_.len);
		c->ns_len = r->namespace_.len;
		c->ns_known = 1;
		c->store_dev = r->store_dev;
		c->store_ino = r->store_ino;
	}
	return finish(c, r, err);
}

/* The key of an entry as the daemon stores it: over the namespace it puts
 * before this peer's salts (asked once per connection, by a Hello) and the
 * salt. Returns 0 or an error code. */
static int entry_key(struct k3cache *c, const uint8_t *fp, const void *salt, size_t salt_len,
                     const uint32_t *tokens, uint32_t n, uint8_t key[K3CACHE_KEY_LEN],
                     struct k3cache_error *err)
{
	int rc;
	if (!c->ns_known && (rc = k3cache_hello(c, NULL, 0, err)) != 0)
		return rc;
	if (!c->ns_len)
		return prefix_key(fp, salt, salt_len, tokens, n, key) != 0
		               ? FAIL(err, STATUS_INTERNAL, 0, "out of memory computing a key")
		               : 0;
	unsigned char *full = malloc(c->ns_len + salt_len);
	if (!full)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory computing a key");
	memcpy(full, c->ns, c->ns_len);
	if (salt_len)
		memcpy(full + c->ns_len, salt, salt_len);
	rc = prefix_key(fp, full, c->ns_len + salt_len, tokens, n, key);
	free(full);
	return rc ? FAIL(err, STATUS_INTERNAL, 0, "out of memory computing a key") : 0;
}

int k3cache_namespace(struct k3cache *c, unsigned char *out, size_t cap, size_t *len,
                      struct k3cache_error *err)
{
	int rc;
	if (!c->ns_known && (rc = k3cache_hello(c, NULL, 0, err)) != 0)
		return rc;
	if (c->ns_len > cap)
		return FAIL(err, STATUS_INTERNAL, 0, "the daemon's namespace is %zu bytes",
		            c->ns_len);
	if (c->ns_len)
		memcpy(out, c->ns, c->ns_len);
	*len = c->ns_len;
	return 0;
}

void k3cache_store_file(const struct k3cache *c, uint64_t *dev, uint64_t *ino)
{
	*dev = c->store_dev;
	*ino = c->store_ino;
}

int k3cache_put_model(struct k3cache *c, const struct k3cache_model *spec,
                      uint8_t fp[MODEL_FINGERPRINT_LEN], struct k3cache_error *err)
{
	err_clear(err);
	int rc = usable(c, err);
	if (rc)
		return rc;
	if (!spec || (spec->n_layers && !spec->layers))
		return FAIL(err, STATUS_INVALID, 0, "k3cache_put_model: no model spec");
	K3cache__V1__LayerSpec *ls = calloc(spec->n_layers ? spec->n_layers : 1, sizeof(*ls));
	K3cache__V1__LayerSpec **lp =
	        calloc(spec->n_layers ? spec->n_layers : 1, sizeof(K3cache__V1__LayerSpec *));
	if (!ls || !lp) {
		free(ls);
		free(lp);
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory for a %u-layer model spec",
		            spec->n_layers);
	}
	for (uint32_t i = 0; i < spec->n_layers; i++) {
		const struct model_layer *l = &spec->layers[i];
		k3cache__v1__layer_spec__init(&ls[i]);
		ls[i].mixer = l->mixer == MODEL_MIXER_KDA ? K3CACHE__V1__MIXER__MIXER_KDA
		                                          : K3CACHE__V1__MIXER__MIXER_MLA;
		ls[i].conv_len = l->conv_len;
		ls[i].recurrent_len = l->recurrent_len;
		ls[i].k_row = l->k_row;
		ls[i].v_row = l->v_row;
		lp[i] = &ls[i];
	}
	K3cache__V1__ModelSpec ms = K3CACHE__V1__MODEL_SPEC__INIT;
	ms.name = spec->name ? spec->name : (char *)"";
	ms.revision = spec->revision ? spec->revision : (char *)"";
	ms.state_layout = spec->state_layout ? spec->state_layout : (char *)"";
	ms.n_layers = spec->n_layers;
	ms.layers = lp;
	K3cache__V1__PutModel pm = K3CACHE__V1__PUT_MODEL__INIT;
	pm.model = &ms;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUT_MODEL;
	req.put_model = &pm;
	frame_response *r = NULL;
	rc = exchange(c, &req, NULL, 0, 0, &r, err);
	free(ls);
	free(lp);
	if (rc)
		return rc;
	if (r->fingerprint.len != MODEL_FINGERPRINT_LEN ||
	    memcmp(r->fingerprint.data, spec->fingerprint, MODEL_FINGERPRINT_LEN) != 0) {
		char mine[2 * MODEL_FINGERPRINT_LEN + 1], theirs[2 * MODEL_FINGERPRINT_LEN + 1];
		hexutil_encode(spec->fingerprint, MODEL_FINGERPRINT_LEN, mine);
		if (r->fingerprint.len == MODEL_FINGERPRINT_LEN)
			hexutil_encode(r->fingerprint.data, MODEL_FINGERPRINT_LEN, theirs);
		else
			snprintf(theirs, sizeof(theirs), "%zu bytes", r->fingerprint.len);
		rc = FAIL(err, STATUS_INTERNAL, 0,
		          "model %s: the daemon computed another fingerprint (%.16s...) than this "
		          "library (%.16s...): the daemon and the library disagree on the spec",
		          spec->name ? spec->name : "", theirs, mine);
		finish(c, r, NULL);
		return rc;
	}
	if (fp)
		memcpy(fp, spec->fingerprint, MODEL_FINGERPRINT_LEN);
	return finish(c, r, err);
}

/* ---- publish ---- */

static void short_hex(const uint8_t *bytes, size_t len, char out[17])
{
	char full[2 * 32 + 1];
	memset(full, '0', sizeof(full));
	if (len > 32)
		len = 32;
	hexutil_encode(bytes, len, full);
	memcpy(out, full, 16);
	out[16] = '\0';
}

/* Whether the daemon holds the entry of key, not quarantined: 1 (res filled
 * as for a publish that found it), 0 (publish it), or minus an error code. */
static int stored_already(struct k3cache *c, const uint8_t key[K3CACHE_KEY_LEN],
                          struct k3cache_publish_result *res, struct k3cache_error *err)
{
	K3cache__V1__Inspect in = K3CACHE__V1__INSPECT__INIT;
	in.key.data = (uint8_t *)key;
	in.key.len = K3CACHE_KEY_LEN;
	in.brief = 1;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_INSPECT;
	req.inspect = &in;
	frame_response *r = NULL;
	int rc = exchange(c, &req, NULL, 0, 0, &r, err); /* absent: OK, no entry */
	if (rc == STATUS_NOT_FOUND) {                    /* a daemon from before Inspect.brief */
		err_clear(err);
		return 0;
	}
	if (rc)
		return -rc;
	int found = r->code == K3CACHE__V1__CODE__OK && r->n_entries == 1 &&
	            !r->entries[0]->quarantined && r->entries[0]->key.len == K3CACHE_KEY_LEN &&
	            memcmp(r->entries[0]->key.data, key, K3CACHE_KEY_LEN) == 0;
	if (found && res) {
		memcpy(res->key, key, K3CACHE_KEY_LEN);
		res->created = 0;
		res->bytes = r->entries[0]->bytes;
	}
	rc = finish(c, r, err);
	return rc ? -rc : found;
}

/* One layer to publish: a blob given whole, or its header words and its two
 * float vectors (from the caller's arrays, or found in its blob by a parse,
 * for a delta), which go out by gather-write. */
struct layer_src {
	const unsigned char *blob; /* whole: blob_len bytes, sent as they are */
	size_t blob_len;
	unsigned char head[9]; /* tag, [seq_len,] count of the first vector */
	size_t head_len;
	unsigned char mid[4]; /* count of the second vector */
	const unsigned char *vec[2];
	size_t vec_len[2]; /* bytes */
	int mla;           /* an MLA layer of seq_len = n_tokens: a delta may cut it */
	uint64_t xxh3;
};

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

/* The pieces layer l sends: whole, or rows [base_rows, P) of an MLA layer's
 * vectors (base_key set). Fills out (at most 4) and returns how many; *size
 * gets their bytes. */
static size_t layer_pieces(const struct layer_src *l, int delta, uint32_t base_rows,
                           uint32_t n_tokens, struct iovec *out, uint64_t *size)
{
	if (delta && l->mla) {
		size_t n = 0;
		*size = 0;
		for (int v = 0; v < 2; v++) {
			size_t row = l->vec_len[v] / n_tokens;
			out[n].iov_base = (void *)(l->vec[v] + (size_t)base_rows * row);
			out[n].iov_len = (size_t)(n_tokens - base_rows) * row;
			*size += out[n++].iov_len;
		}
		return n;
	}
	if (l->blob) {
		out[0].iov_base = (void *)l->blob;
		out[0].iov_len = l->blob_len;
		*size = l->blob_len;
		return 1;
	}
	out[0] = (struct iovec){(void *)l->head, l->head_len};
	out[1] = (struct iovec){(void *)l->vec[0], l->vec_len[0]};
	out[2] = (struct iovec){(void *)l->mid, 4};
	out[3] = (struct iovec){(void *)l->vec[1], l->vec_len[1]};
	*size = l->head_len + l->vec_len[0] + 4 + l->vec_len[1];
	return 4;
}

/* One publish; base_key (NULL: none) names the entry whose MLA rows
 * [0, base_rows) the daemon takes instead of receiving them. */
static int publish_one(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                       size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                       const struct layer_src *src, uint32_t n_blobs, const uint8_t *base_key,
                       uint32_t base_rows, int *refused, struct k3cache_publish_result *res,
                       struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	int rc = usable(c, err);
	if (rc)
		return rc;
	K3cache__V1__LayerRef *refs = calloc(n_blobs, sizeof(*refs));
	K3cache__V1__LayerRef **rp = calloc(n_blobs, sizeof(K3cache__V1__LayerRef *));
	struct iovec *iov = calloc((size_t)n_blobs * 4 + 1, sizeof(*iov));
	if (!refs || !rp || !iov) {
		rc = FAIL(err, STATUS_INTERNAL, 0, "out of memory for a %u-layer publish", n_blobs);
		goto out;
	}
	size_t n_iov = 1;
	uint64_t total = 0;
	for (uint32_t i = 0; i < n_blobs; i++) {
		k3cache__v1__layer_ref__init(&refs[i]);
		refs[i].index = i;
		refs[i].xxh3 = src[i].xxh3;
		rp[i] = &refs[i];
		n_iov += layer_pieces(&src[i], base_key != NULL, base_rows, n_tokens, iov + n_iov,
		                      &refs[i].size);
		total += refs[i].size;
	}
	K3cache__V1__Publish pub = K3CACHE__V1__PUBLISH__INIT;
	pub.model.data = (uint8_t *)fp;
	pub.model.len = MODEL_FINGERPRINT_LEN;
	pub.salt.data = (uint8_t *)salt;
	pub.salt.len = salt_len;
	pub.tokens = (uint32_t *)tokens;
	pub.n_tokens = n_tokens;
	pub.layers = rp;
	pub.n_layers = n_blobs;
	if (base_key) {
		pub.base_key.data = (uint8_t *)base_key;
		pub.base_key.len = K3CACHE_KEY_LEN;
		pub.base_rows = base_rows;
	}
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	req.payload_len = total;
	frame_response *r = NULL;
	uint8_t key[K3CACHE_KEY_LEN];
	if ((rc = entry_key(c, fp, salt, salt_len, tokens, n_tokens, key, err)) != 0)
		goto out;
	/* stored already (and served): nothing to send */
	if ((rc = stored_already(c, key, res, err)) != 0) {
		rc = rc > 0 ? 0 : -rc;
		goto out;
	}
	rc = exchange(c, &req, iov, n_iov, base_key != NULL, &r, err);
	if (rc)
		goto out;
	if (base_key && r->code != K3CACHE__V1__CODE__OK) {
		/* refused (or a daemon that does not know deltas): publish whole */
		*refused = 1;
		rc = finish(c, r, err);
		goto out;
	}
	if (r->key.len != K3CACHE_KEY_LEN || memcmp(r->key.data, key, K3CACHE_KEY_LEN) != 0) {
		char mine[17], theirs[17] = "none";
		short_hex(key, sizeof(key), mine);
		if (r->key.len)
			short_hex(r->key.data, r->key.len, theirs);
		rc = FAIL(err, STATUS_INTERNAL, 0,
		          "publish: the daemon stored the snapshot under key %s..., this library "
		          "computes %s...: the two disagree on the key layout",
		          theirs, mine);
		finish(c, r, NULL);
		goto out;
	}
	if (res) {
		memcpy(res->key, key, K3CACHE_KEY_LEN);
		res->created = r->created ? 1 : 0;
		res->bytes = r->bytes;
		res->evicted = r->evicted;
		res->delta_rows = base_key ? base_rows : 0;
	}
	rc = finish(c, r, err);
out:
	free(refs);
	free(rp);
	free(iov);
	return rc;
}

/* A publish of these layers, as a delta from base_key when one is given:
 * when the daemon refuses the base, the whole snapshot. */
static int publish_layers(struct k3cache *c, const uint8_t *fp, const void *salt, size_t salt_len,
                          const uint32_t *tokens, uint32_t n_tokens, const struct layer_src *src,
                          uint32_t n, const uint8_t *base_key, uint32_t base_rows,
                          struct k3cache_publish_result *res, struct k3cache_error *err)
{
	int refused = 0;
	if (!base_key || base_rows == 0 || base_rows > n_tokens)
		base_key = NULL;
	int rc = publish_one(c, fp, salt, salt_len, tokens, n_tokens, src, n, base_key,
	                     base_key ? base_rows : 0, &refused, res, err);
	if (rc == 0 && refused) /* the base cannot serve: the whole snapshot */
		rc = publish_one(c, fp, salt, salt_len, tokens, n_tokens, src, n, NULL, 0, &refused,
		                 res, err);
	return rc;
}

/* The arguments every publish checks before it reads a layer. */
static int check_publish_args(const uint8_t *fp, const void *salt, size_t salt_len,
                              const uint32_t *tokens, uint32_t n_tokens, const void *layers,
                              uint32_t n_layers, struct k3cache_error *err)
{
	if (!fp)
		return FAIL(err, STATUS_INVALID, 0, "publish: no model fingerprint");
	if (n_tokens == 0 || !tokens)
		return FAIL(err, STATUS_INVALID, 0,
		            "publish: no tokens: a snapshot covers at least one token");
	if (salt_len && !salt)
		return FAIL(err, STATUS_INVALID, 0, "publish: salt is NULL but salt_len is %zu",
		            salt_len);
	if (n_layers == 0 || !layers)
		return FAIL(err, STATUS_INVALID, 0,
		            "publish: no layers: a snapshot carries every layer of the model");
	return 0;
}

int k3cache_publish_delta(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                          const void *salt, size_t salt_len, const uint32_t *tokens,
                          uint32_t n_tokens, const struct k3cache_buf *blobs, uint32_t n_blobs,
                          const uint8_t base_key[K3CACHE_KEY_LEN], uint32_t base_rows,
                          struct k3cache_publish_result *res, struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	int rc = check_publish_args(fp, salt, salt_len, tokens, n_tokens, blobs, n_blobs, err);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n_blobs; i++) {
		if (blobs[i].len == 0)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: empty blob: zero bytes (empty)", i);
		if (!blobs[i].data)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: blob data is NULL (%zu bytes)", i, blobs[i].len);
	}
	struct layer_src *src = calloc(n_blobs, sizeof(*src));
	if (!src)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory for a %u-layer publish",
		            n_blobs);
	for (uint32_t i = 0; i < n_blobs; i++) {
		struct layer_src *l = &src[i];
		l->blob = blobs[i].data;
		l->blob_len = blobs[i].len;
		l->xxh3 = checksum_blob(blobs[i].data, blobs[i].len, i);
		struct blob_view v;
		/* a delta sends an MLA layer's rows from base_rows on: find them */
		if (base_key && blob_parse(blobs[i].data, blobs[i].len, &v, NULL) == BLOB_OK &&
		    v.tag == BLOB_TAG_MLA && v.seq_len == n_tokens) {
			l->mla = 1;
			l->vec[0] = v.v0.data;
			l->vec_len[0] = (size_t)v.v0.count * 4u;
			l->vec[1] = v.v1.data;
			l->vec_len[1] = (size_t)v.v1.count * 4u;
		}
	}
	rc = publish_layers(c, fp, salt, salt_len, tokens, n_tokens, src, n_blobs, base_key,
	                    base_rows, res, err);
	free(src);
	return rc;
}

int k3cache_publish(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                    size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                    const struct k3cache_buf *blobs, uint32_t n_blobs,
                    struct k3cache_publish_result *res, struct k3cache_error *err)
{
	return k3cache_publish_delta(c, fp, salt, salt_len, tokens, n_tokens, blobs, n_blobs, NULL,
	                             0, res, err);
}

/* Layer i of a publish from arrays: its lengths against the model at P, its
 * header words, and its checksum over the seed's bytes. */
static int array_layer(const struct k3cache_model *model, uint32_t i, uint32_t p,
                       const struct k3cache_arrays *in, struct layer_src *l,
                       struct k3cache_error *err)
{
	const struct model_layer *ml = &model->layers[i];
	int kda = ml->mixer == MODEL_MIXER_KDA;
	uint64_t want[2];
	model_layer_floats(ml, p, want);
	size_t have[2] = {in->a_len, in->b_len};
	const float *ptr[2] = {in->a, in->b};
	for (int v = 0; v < 2; v++) {
		const char *name = model_layer_vector_name(ml, v);
		if (have[v] != want[v])
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: %s has %zu floats, the model's %s layer at P=%u has "
			            "%" PRIu64 " (shape)",
			            i, name, have[v], model_mixer_name(ml->mixer), p, want[v]);
		if (want[v] > UINT32_MAX)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: %s has %" PRIu64 " floats; a blob vector holds at "
			            "most 2^32-1",
			            i, name, want[v]);
		if (want[v] && !ptr[v])
			return FAIL(err, STATUS_INVALID, 0, "layer %u: its %s array is NULL", i,
			            name);
		l->vec[v] = (const unsigned char *)ptr[v];
		l->vec_len[v] = (size_t)want[v] * 4u;
	}
	l->head[0] = kda ? BLOB_TAG_KDA : BLOB_TAG_MLA;
	l->head_len = kda ? 5 : 9;
	if (!kda)
		put_le32(l->head + 1, p);
	put_le32(l->head + l->head_len - 4, (uint32_t)want[0]);
	put_le32(l->mid, (uint32_t)want[1]);
	l->mla = !kda;
	struct checksum_run cs;
	checksum_run_begin(&cs, i);
	checksum_run_update(&cs, l->head, l->head_len);
	checksum_run_update(&cs, l->vec[0], l->vec_len[0]);
	checksum_run_update(&cs, l->mid, 4);
	checksum_run_update(&cs, l->vec[1], l->vec_len[1]);
	l->xxh3 = checksum_run_end(&cs);
	return 0;
}

int k3cache_publish_arrays(struct k3cache *c, const struct k3cache_model *model, const void *salt,
                           size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                           const struct k3cache_arrays *layers, uint32_t n_layers,
                           const uint8_t *base_key, uint32_t base_rows,
                           struct k3cache_publish_result *res, struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	if (!model || !model->layers)
		return FAIL(err, STATUS_INVALID, 0, "publish: no model spec");
	int rc = check_publish_args(model->fingerprint, salt, salt_len, tokens, n_tokens, layers,
	                            n_layers, err);
	if (rc)
		return rc;
	if (n_layers != model->n_layers)
		return FAIL(err, STATUS_INVALID, 0, "publish: %u layers given, model %s has %u",
		            n_layers, model->name ? model->name : "", model->n_layers);
	struct layer_src *src = calloc(n_layers, sizeof(*src));
	if (!src)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory for a %u-layer publish",
		            n_layers);
	for (uint32_t i = 0; i < n_layers && !rc; i++)
		rc = array_layer(model, i, n_tokens, &layers[i], &src[i], err);
	if (!rc)
		rc = publish_layers(c, model->fingerprint, salt, salt_len, tokens, n_tokens, src,
		                    n_layers, base_key, base_rows, res, err);
	free(src);
	return rc;
}

/* ---- lookup ---- */

/* Sends a Lookup and checks the answer against the prompt: P within the
 * limit, and on a hit the key naming exactly the prompt's first P tokens. */
static int do_lookup(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                     size_t salt_len, const uint32_t *tokens, uint32_t n_tokens, uint32_t limit,
                     int restore, frame_response **out, struct k3cache_error *err)
{
	K3cache__V1__Lookup lk = K3CACHE__V1__LOOKUP__INIT;
	lk.model.data = (uint8_t *)fp;
	lk.model.len = MODEL_FINGERPRINT_LEN;
	lk.salt.data = (uint8_t *)salt;
	lk.salt.len = salt_len;
	lk.tokens = (uint32_t *)tokens;
	lk.n_tokens = n_tokens;
	lk.limit = limit;
	lk.restore = restore ? 1 : 0;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lk;
	frame_response *r = NULL;
	/* the hit's key is checked against ours, over our namespace: know it
	 * before the answer (and a restore's payload) is in flight */
	int rc = c->ns_known ? 0 : k3cache_hello(c, NULL, 0, err);
	if (rc || (rc = exchange(c, &req, NULL, 0, 0, &r, err)) != 0)
		return rc;
	uint32_t max = limit ? limit : n_tokens - 1;
	if (max > n_tokens)
		max = n_tokens;
	if (r->prefix_len > max) {
		rc = FAIL(
		        err, STATUS_INVALID, 0,
		        "lookup: the daemon answered a prefix of %u tokens for a prompt of %u with "
		        "limit %u",
		        r->prefix_len, n_tokens, max);
		goto bad;
	}
	if (r->prefix_len > 0) {
		uint8_t key[K3CACHE_KEY_LEN];
		if ((rc = entry_key(c, fp, salt, salt_len, tokens, r->prefix_len, key, err)) != 0)
			goto bad;
		if (r->key.len != K3CACHE_KEY_LEN ||
		    memcmp(r->key.data, key, K3CACHE_KEY_LEN) != 0) {
			char mine[17], theirs[17] = "none";
			short_hex(key, sizeof(key), mine);
			if (r->key.len)
				short_hex(r->key.data, r->key.len, theirs);
			rc = FAIL(err, STATUS_INVALID, 0,
			          "lookup: the daemon's hit (key %s...) is not the entry of this "
			          "prompt's first %u tokens (key %s...)",
			          theirs, r->prefix_len, mine);
			goto bad;
		}
	} else if (r->payload_len) {
		uint64_t plen = r->payload_len;
		frame_response_free(r);
		return BROKEN(c, err,
		              "lookup: the daemon at %s answered a miss with a %" PRIu64
		              "-byte payload; the connection is closed",
		              c->addr, plen);
	}
	*out = r;
	return 0;
bad:
	frame_response_free(r);
	drain_after_failure(c, err);
	return rc;
}

static void fill_lookup_result(const frame_response *r, struct k3cache_lookup_result *res)
{
	if (!res)
		return;
	res->prefix_len = r->prefix_len;
	res->hint = r->hint;
	res->bytes = r->bytes;
	if (r->prefix_len > 0 && r->key.len == K3CACHE_KEY_LEN)
		memcpy(res->key, r->key.data, K3CACHE_KEY_LEN);
}

int k3cache_lookup_args(const uint8_t *fp, const void *salt, size_t salt_len,
                        const uint32_t *tokens, uint32_t n_tokens, struct k3cache_error *err)
{
	if (!fp)
		return FAIL(err, STATUS_INVALID, 0, "lookup: no model fingerprint");
	if (salt_len && !salt)
		return FAIL(err, STATUS_INVALID, 0, "lookup: salt is NULL but salt_len is %zu",
		            salt_len);
	if (n_tokens && !tokens)
		return FAIL(err, STATUS_INVALID, 0, "lookup: tokens is NULL but n_tokens is %u",
		            n_tokens);
	return 0;
}

int k3cache_lookup(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                   size_t salt_len, const uint32_t *tokens, uint32_t n_tokens, uint32_t limit,
                   struct k3cache_lookup_result *res, struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	int rc = usable(c, err);
	if (rc || (rc = k3cache_lookup_args(fp, salt, salt_len, tokens, n_tokens, err)))
		return rc;
	if (n_tokens == 0)
		return 0; /* an empty prompt: nothing to reuse */
	frame_response *r = NULL;
	if ((rc = do_lookup(c, fp, salt, salt_len, tokens, n_tokens, limit, 0, &r, err)))
		return rc;
	fill_lookup_result(r, res);
	rc = finish(c, r, err);
	if (rc && res)
		memset(res, 0, sizeof(*res));
	return rc;
}

/* ---- restore ---- */

/* Checks the layer list of a restore answer against the model before a byte
 * of payload is read: the entry's model, one layer per slot in order, each of
 * the size the model gives at P, adding up to payload_len, each fitting its
 * caller buffer (caps) when there are some. */
static int check_layer_list(const struct k3cache_model *model, const frame_response *r,
                            void *const *bufs, const size_t *caps, struct k3cache_error *err)
{
	uint32_t p = r->prefix_len;
	if (r->model.len != MODEL_FINGERPRINT_LEN ||
	    memcmp(r->model.data, model->fingerprint, MODEL_FINGERPRINT_LEN) != 0) {
		char theirs[17] = "none", mine[17];
		if (r->model.len)
			short_hex(r->model.data, r->model.len, theirs);
		short_hex(model->fingerprint, MODEL_FINGERPRINT_LEN, mine);
		return FAIL(err, STATUS_INVALID, 0,
		            "entry belongs to another model: its fingerprint is %s..., model %s is "
		            "%s...",
		            theirs, model->name ? model->name : "", mine);
	}
	if (p == 0)
		return FAIL(err, STATUS_INVALID, 0, "the daemon sent a snapshot of 0 tokens");
	if (r->n_layers != model->n_layers)
		return FAIL(err, STATUS_INVALID, 0,
		            "the entry has %zu layers, model %s has %u: it is not a whole snapshot",
		            r->n_layers, model->name ? model->name : "", model->n_layers);
	uint64_t sum = 0;
	for (uint32_t i = 0; i < model->n_layers; i++) {
		const K3cache__V1__LayerRef *l = r->layers[i];
		if (l->index != i)
			return FAIL(err, STATUS_INVALID, 0,
			            "the daemon's layer list has layer %u in place %u: "
			            "layers must come once each, in index order",
			            l->index, i);
		const struct model_layer *ml = &model->layers[i];
		uint64_t want = model_layer_blob_size(ml, p);
		if (l->size != want)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: the daemon sends %" PRIu64 " bytes, "
			            "the model's %s layer at P=%u is %" PRIu64 " (shape)",
			            i, l->size, model_mixer_name(ml->mixer), p, want);
		if (want > SIZE_MAX)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: %" PRIu64 " bytes do not fit this address space", i,
			            want);
		if (bufs && !bufs[i])
			return FAIL(err, STATUS_INVALID, 0, "layer %u: bufs[%u] is NULL", i, i);
		if (caps && caps[i] < want)
			return FAIL(err, STATUS_INVALID, 0,
			            "layer %u: its buffer holds %zu bytes, the blob is %" PRIu64
			            " (k3cache_model_blob_size(model, %u, %u))",
			            i, caps[i], want, i, p);
		if (sum + want < sum)
			return FAIL(err, STATUS_INVALID, 0, "the layer sizes overflow 64 bits");
		sum += want;
	}
	if (sum != r->payload_len)
		return FAIL(err, STATUS_INVALID, 0,
		            "the layer list adds up to %" PRIu64 " bytes, "
		            "payload_len says %" PRIu64,
		            sum, r->payload_len);
	return bufs ? k3cache_bufs_apart(model, p, bufs, err) : 0;
}

/* Refuses spans[0..n) (freed here) when two share a byte: names them. */
static int spans_apart(const struct k3cache_model *model, struct ranges_span *spans, size_t n,
                       int arrays, struct k3cache_error *err)
{
	const struct ranges_span *a, *b;
	int rc = 0;
	if (ranges_overlap(spans, n, &a, &b)) {
		char what[2][64];
		const struct ranges_span *s[2] = {a, b};
		for (int k = 0; k < 2; k++)
			if (arrays)
				snprintf(what[k], sizeof(what[k]), "layer %u's %s array",
				         s[k]->layer,
				         model_layer_vector_name(&model->layers[s[k]->layer],
				                                 (int)s[k]->part));
			else
				snprintf(what[k], sizeof(what[k]), "layer %u's buffer",
				         s[k]->layer);
		if (a == b)
			rc = FAIL(err, STATUS_INVALID, 0,
			          "%s runs past the end of the address space", what[0]);
		else
			rc = FAIL(err, STATUS_INVALID, 0,
			          "%s and %s share memory: each needs its own, or one would be "
			          "written over the other's checked bytes",
			          what[0], what[1]);
	}
	free(spans);
	return rc;
}

int k3cache_bufs_apart(const struct k3cache_model *model, uint32_t p, void *const *bufs,
                       struct k3cache_error *err)
{
	struct ranges_span *spans = calloc(model->n_layers ? model->n_layers : 1, sizeof(*spans));
	if (!spans)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory checking the buffers");
	for (uint32_t i = 0; i < model->n_layers; i++)
		spans[i] = (struct ranges_span){(uintptr_t)bufs[i],
		                                model_layer_blob_size(&model->layers[i], p), i, 0};
	return spans_apart(model, spans, model->n_layers, 0, err);
}

static int arrays_apart(const struct k3cache_model *model, uint32_t p,
                        const struct k3cache_arrays_out *a, struct k3cache_error *err)
{
	struct ranges_span *spans =
	        calloc(model->n_layers ? (size_t)model->n_layers * 2 : 1, sizeof(*spans));
	if (!spans)
		return FAIL(err, STATUS_INTERNAL, 0, "out of memory checking the arrays");
	for (uint32_t i = 0; i < model->n_layers; i++) {
		uint64_t n[2];
		model_layer_floats(&model->layers[i], p, n);
		struct ranges_span *two = spans + (size_t)i * 2;
		two[0] = (struct ranges_span){(uintptr_t)a[i].a, n[0] * 4, i, 0};
		two[1] = (struct ranges_span){(uintptr_t)a[i].b, n[1] * 4, i, 1};
	}
	return spans_apart(model, spans, (size_t)model->n_layers * 2, 1, err);
}

int k3cache_arrays_fit(const struct k3cache_model *model, uint32_t p,
                       const struct k3cache_arrays_out *a, struct k3cache_error *err)
{
	for (uint32_t i = 0; i < model->n_layers; i++) {
		const struct model_layer *ml = &model->layers[i];
		uint64_t n[2];
		model_layer_floats(ml, p, n);
		const void *ptr[2] = {a[i].a, a[i].b};
		size_t cap[2] = {a[i].a_cap, a[i].b_cap};
		for (int v = 0; v < 2; v++) {
			const char *name = model_layer_vector_name(ml, v);
			if (n[v] && !ptr[v])
				return FAIL(err, STATUS_INVALID, 0,
				            "layer %u: its %s array is NULL", i, name);
			if (cap[v] < n[v])
				return FAIL(
				        err, STATUS_INVALID, 0,
				        "layer %u: its %s array holds %zu floats, the entry's %s "
				        "(P=%u) has %" PRIu64,
				        i, name, cap[v], model_mixer_name(ml->mixer), p, n[v]);
		}
	}
	return arrays_apart(model, p, a, err);
}

/* Ends the checks of one received layer: the blob against the model's slot,
 * shape, seq_len and finiteness, and its checksum against the daemon's. */
static int finish_layer(struct blob_stream *bs, const frame_response *r, uint32_t i,
                        struct k3cache_error *err)
{
	struct blob_error be;
	uint64_t sum = 0;
	enum blob_class cls = blob_stream_end(bs, &sum, &be);
	if (cls != BLOB_OK)
		return FAIL(err, STATUS_INVALID, 0, "%s (%s)", be.message, blob_class_name(cls));
	if (sum != r->layers[i]->xxh3)
		return FAIL(err, STATUS_CORRUPT, 0,
		            "layer %u: checksum mismatch: the daemon said %016" PRIx64
		            ", the bytes hash to %016" PRIx64,
		            i, r->layers[i]->xxh3, sum);
	return 0;
}

/* Each layer is received in pieces small enough to stay in cache, and each
 * piece is scanned and hashed as soon as it lands: the check costs little
 * more than the copy out of the socket, on the same thread. */
#define PIECE_BYTES (256u << 10)

/* Receives one layer into where bs puts it (begun by the caller) and checks
 * it. */
static int receive_layer(struct k3cache *c, struct blob_stream *bs, const frame_response *r,
                         uint32_t i, struct k3cache_error *err)
{
	size_t len = (size_t)r->layers[i]->size;
	int rc = 0;
	for (size_t off = 0; off < len && !rc;) {
		size_t run;
		unsigned char *dst = blob_stream_dest(bs, off, &run);
		size_t n = run < PIECE_BYTES ? run : PIECE_BYTES;
		if (!dst || n > len - off) { /* the stream's length is the model's */
			rc = FAIL(err, STATUS_INTERNAL, 0, "layer %u: the receive lost its place",
			          i);
			break;
		}
		rc = read_payload(c, dst, n, err);
		off += n;
		if (!rc)
			blob_stream_feed(bs, off);
	}
	if (rc) { /* the connection is gone */
		blob_stream_abandon(bs);
		char where[64];
		snprintf(where, sizeof(where), " mid-restore (layer %u of %zu)", i, r->n_layers);
		err_append(err, where);
		if (c->hung_up) /* not told why: the daemon cannot answer mid-payload */
			err_append(err, ": a reader under its --min-download-rate, or a damaged "
			                "chunk (see the daemon's log)");
		return rc;
	}
	if ((rc = finish_layer(bs, r, i, err)) != 0)
		drain_after_failure(c, err);
	return rc;
}

/* Where a restore puts each layer: whole blobs in buffers (the caller's, or
 * the connection's own when bufs is NULL), or scattered into arrays. */
struct restore_dest {
	void *const *bufs;
	const size_t *caps;
	const struct k3cache_arrays_out *arrays;
};

/* Receives and validates the payload of a restore answer. Every layer is
 * checked as it arrives; on a failure the rest of the payload is drained. */
static int receive_snapshot(struct k3cache *c, const struct k3cache_model *model,
                            const frame_response *r, const struct restore_dest *d,
                            struct k3cache_error *err)
{
	int rc = check_layer_list(model, r, d->bufs, d->caps, err);
	if (!rc && d->arrays)
		rc = k3cache_arrays_fit(model, r->prefix_len, d->arrays, err);
	if (rc) {
		drain_after_failure(c, err);
		return rc;
	}
	if (!d->bufs && !d->arrays && r->payload_len > c->snap_cap) {
		if (r->payload_len > SIZE_MAX) {
			rc = FAIL(err, STATUS_INVALID, 0,
			          "a %" PRIu64 "-byte snapshot does not fit", r->payload_len);
			drain_after_failure(c, err);
			return rc;
		}
		/* the old bytes are not needed: no realloc copy */
		free(c->snap);
		c->snap_cap = 0;
		c->snap = malloc((size_t)r->payload_len);
		if (!c->snap) {
			rc = FAIL(err, STATUS_INTERNAL, 0,
			          "out of memory for a %" PRIu64 "-byte snapshot", r->payload_len);
			drain_after_failure(c, err);
			return rc;
		}
		c->snap_cap = (size_t)r->payload_len;
	}
	size_t off = 0;
	for (uint32_t i = 0; i < model->n_layers && !rc; i++) {
		size_t len = (size_t)r->layers[i]->size;
		struct blob_stream bs;
		int bad = d->arrays ? blob_stream_begin_parts(&bs, d->arrays[i].a, d->arrays[i].b,
		                                              model, i, r->prefix_len)
		                    : blob_stream_begin(&bs, d->bufs ? d->bufs[i] : c->snap + off,
		                                        len, model, i, r->prefix_len);
		off += len;
		if (bad) {
			blob_stream_abandon(&bs);
			rc = FAIL(err, STATUS_INTERNAL, 0, "out of memory");
			drain_after_failure(c, err);
			break;
		}
		rc = receive_layer(c, &bs, r, i, err);
	}
	return rc;
}

/* Calls fn for each layer of the validated snapshot in c->snap. The buffer
 * is taken from the handle meanwhile: a restore that fn makes on the same
 * handle receives into a buffer of its own, not over the bytes still being
 * handed over. The larger of the two is kept for the next restore. */
static int deliver(struct k3cache *c, const frame_response *r, k3cache_layer_fn fn, void *ctx,
                   struct k3cache_error *err)
{
	uint8_t *snap = c->snap;
	size_t cap = c->snap_cap;
	c->snap = NULL;
	c->snap_cap = 0;
	int rc = 0;
	size_t off = 0;
	for (size_t i = 0; i < r->n_layers && !rc; i++) {
		size_t len = (size_t)r->layers[i]->size;
		rc = fn((uint32_t)i, snap + off, len, ctx);
		if (rc)
			set_error(err, STATUS_INTERNAL, 0,
			          "the layer callback stopped the restore at layer %zu "
			          "(it returned %d): the state is not whole",
			          i, rc);
		off += len;
	}
	if (c->snap_cap > cap) {
		free(snap);
	} else {
		free(c->snap);
		c->snap = snap;
		c->snap_cap = cap;
	}
	return rc;
}

static int check_model_arg(const struct k3cache_model *model, struct k3cache_error *err)
{
	if (!model || model->n_layers == 0 || !model->layers)
		return FAIL(err, STATUS_INVALID, 0,
		            "restore: no model spec (or one without layers)");
	return 0;
}

/* Sends a Restore of key and checks the answer names that key. */
static int do_restore(struct k3cache *c, const uint8_t key[K3CACHE_KEY_LEN], frame_response **out,
                      struct k3cache_error *err)
{
	K3cache__V1__Restore rs = K3CACHE__V1__RESTORE__INIT;
	rs.key.data = (uint8_t *)key;
	rs.key.len = K3CACHE_KEY_LEN;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_RESTORE;
	req.restore = &rs;
	frame_response *r = NULL;
	int rc = exchange(c, &req, NULL, 0, 0, &r, err);
	if (rc)
		return rc;
	/* the answer names the entry it is: one that names none, or another,
	 * is a daemon out of step, whose payload is never taken (nor drained) */
	if (r->key.len != K3CACHE_KEY_LEN || memcmp(r->key.data, key, K3CACHE_KEY_LEN) != 0) {
		char want[17], got[17] = "none";
		short_hex(key, K3CACHE_KEY_LEN, want);
		if (r->key.len)
			short_hex(r->key.data, r->key.len, got);
		frame_response_free(r);
		return BROKEN(
		        c, err,
		        "restore: asked for entry %s..., the daemon at %s answered with entry "
		        "%s...; the connection is closed",
		        want, c->addr, got);
	}
	*out = r;
	return 0;
}

/* A restore of key into d (the caller's buffers or arrays): *prefix_len is
 * P on success; on a failure the destination must not be used. */
static int restore_to(struct k3cache *c, const struct k3cache_model *model,
                      const uint8_t key[K3CACHE_KEY_LEN], const struct restore_dest *d,
                      size_t *lens, uint32_t *prefix_len, struct k3cache_error *err)
{
	frame_response *r = NULL;
	int rc = do_restore(c, key, &r, err);
	if (rc)
		return rc;
	rc = receive_snapshot(c, model, r, d, err);
	if (rc) {
		err_append(err, d->arrays ? "; the arrays' contents must not be used"
		                          : "; the buffers' contents must not be used");
		frame_response_free(r);
		return rc;
	}
	for (uint32_t i = 0; lens && i < model->n_layers; i++)
		lens[i] = (size_t)r->layers[i]->size;
	if (prefix_len)
		*prefix_len = r->prefix_len;
	return finish(c, r, err);
}

/* What every restore checks before it sends a request. */
static int restore_args(struct k3cache *c, const struct k3cache_model *model, uint32_t *prefix_len,
                        struct k3cache_error *err)
{
	err_clear(err);
	if (prefix_len)
		*prefix_len = 0;
	int rc = usable(c, err);
	return rc ? rc : check_model_arg(model, err);
}

int k3cache_restore_into(struct k3cache *c, const struct k3cache_model *model,
                         const uint8_t key[K3CACHE_KEY_LEN], void *const *bufs, const size_t *caps,
                         size_t *lens, uint32_t *prefix_len, struct k3cache_error *err)
{
	int rc = restore_args(c, model, prefix_len, err);
	if (rc)
		return rc;
	if (!key || !bufs || !caps)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_restore_into: key, bufs and caps are required");
	struct restore_dest d = {.bufs = bufs, .caps = caps};
	return restore_to(c, model, key, &d, lens, prefix_len, err);
}

int k3cache_restore_arrays(struct k3cache *c, const struct k3cache_model *model,
                           const uint8_t key[K3CACHE_KEY_LEN],
                           const struct k3cache_arrays_out *layers, uint32_t n_layers,
                           uint32_t *prefix_len, struct k3cache_error *err)
{
	int rc = restore_args(c, model, prefix_len, err);
	if (rc)
		return rc;
	if (!key || !layers)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_restore_arrays: key and layers are required");
	if (n_layers != model->n_layers)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_restore_arrays: %u layers given, model %s has %u", n_layers,
		            model->name ? model->name : "", model->n_layers);
	struct restore_dest d = {.arrays = layers};
	return restore_to(c, model, key, &d, NULL, prefix_len, err);
}

int k3cache_restore_each(struct k3cache *c, const struct k3cache_model *model,
                         const uint8_t key[K3CACHE_KEY_LEN], k3cache_layer_fn fn, void *ctx,
                         uint32_t *prefix_len, struct k3cache_error *err)
{
	int rc = restore_args(c, model, prefix_len, err);
	if (rc)
		return rc;
	if (!key || !fn)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_restore_each: key and fn are required");
	frame_response *r = NULL;
	if ((rc = do_restore(c, key, &r, err)))
		return rc;
	if ((rc = receive_snapshot(c, model, r, &(struct restore_dest){0}, err)) ||
	    (rc = deliver(c, r, fn, ctx, err))) {
		frame_response_free(r);
		return rc;
	}
	if (prefix_len)
		*prefix_len = r->prefix_len;
	return finish(c, r, err);
}

int k3cache_lookup_restore(struct k3cache *c, const struct k3cache_model *model, const void *salt,
                           size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                           uint32_t limit, k3cache_layer_fn fn, void *ctx,
                           struct k3cache_lookup_result *res, struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	int rc = usable(c, err);
	if (rc || (rc = check_model_arg(model, err)))
		return rc;
	if (!fn)
		return FAIL(err, STATUS_INVALID, 0, "k3cache_lookup_restore: fn is required");
	if ((rc = k3cache_lookup_args(model->fingerprint, salt, salt_len, tokens, n_tokens, err)))
		return rc;
	if (n_tokens == 0)
		return 0;
	frame_response *r = NULL;
	rc = do_lookup(c, model->fingerprint, salt, salt_len, tokens, n_tokens, limit, 1, &r, err);
	if (rc)
		return rc;
	if (r->prefix_len == 0) { /* a miss; the hint still helps */
		fill_lookup_result(r, res);
		return finish(c, r, err);
	}
	if ((rc = receive_snapshot(c, model, r, &(struct restore_dest){0}, err)) ||
	    (rc = deliver(c, r, fn, ctx, err))) {
		frame_response_free(r);
		return rc;
	}
	fill_lookup_result(r, res);
	return finish(c, r, err);
}

/* ---- raw access ---- */

int k3cache_call(struct k3cache *c, struct K3cache__V1__Request *req,
                 struct K3cache__V1__Response **resp, struct k3cache_error *err)
{
	err_clear(err);
	if (resp)
		*resp = NULL;
	int rc = usable(c, err);
	if (rc)
		return rc;
	if (!req || !resp)
		return FAIL(err, STATUS_INVALID, 0, "k3cache_call: req and resp are required");
	if (req->payload_len)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_call sends no payload, but payload_len is %" PRIu64,
		            req->payload_len);
	return exchange(c, req, NULL, 0, 1, resp, err);
}

int k3cache_stat_counter(struct k3cache *c, const char *name, uint64_t *value,
                         struct k3cache_error *err)
{
	if (!name || !value)
		return FAIL(err, STATUS_INVALID, 0, "stat: name and value are required");
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat stat = K3CACHE__V1__STAT__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	req.stat = &stat;
	frame_response *r = NULL;
	int rc = k3cache_call(c, &req, &r, err);
	if (rc)
		return rc;
	if (r->code != K3CACHE__V1__CODE__OK) {
		rc = FAIL(err, (enum status_code)r->code, 0, "stat: %s", r->message);
		frame_response_free(r);
		return rc;
	}
	rc = FAIL(err, STATUS_NOT_FOUND, 0, "stat: the daemon has no counter \"%s\"", name);
	for (size_t i = 0; i < r->n_counters; i++)
		if (r->counters[i]->name && !strcmp(r->counters[i]->name, name)) {
			*value = r->counters[i]->value;
			err_clear(err);
			rc = 0;
			break;
		}
	frame_response_free(r);
	return rc;
}

void k3cache_response_free(struct K3cache__V1__Response *resp)
{
	frame_response_free(resp);
}

void k3cache_set_send_progress(struct k3cache *c, void (*fn)(uint64_t bytes, void *ctx), void *ctx)
{
	c->on_sent = fn;
	c->on_sent_ctx = ctx;
}

int k3cache_read_payload(struct k3cache *c, void *buf, size_t len, struct k3cache_error *err)
{
	err_clear(err);
	int rc = usable(c, err);
	if (rc)
		return rc;
	if (len > c->pending)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_read_payload: %zu bytes asked, %" PRIu64
		            " pending from the last answer",
		            len, c->pending);
	if (len && !buf)
		return FAIL(err, STATUS_INVALID, 0, "k3cache_read_payload: buf is NULL");
	return read_payload(c, buf, len, err);
}

/* ---- the record ---- */

void k3cache_record_init(struct k3cache_record *r)
{
	if (r)
		memset(r, 0, sizeof(*r));
}

void k3cache_record_free(struct k3cache_record *r)
{
	if (!r)
		return;
	free(r->tokens);
	memset(r, 0, sizeof(*r));
}

void k3cache_record_reset(struct k3cache_record *r)
{
	if (!r)
		return;
	r->n = 0;
	r->tainted = 0;
}

int k3cache_record_append(struct k3cache_record *r, const uint32_t *tokens, uint32_t n)
{
	if (!r)
		return -1;
	if (n == 0)
		return 0;
	/* the tokens were fed but cannot be recorded: the record no longer
	 * describes the state */
	if (!tokens || n > UINT32_MAX - r->n) {
		r->tainted = 1;
		return -1;
	}
	uint32_t need = r->n + n;
	if (need > r->cap || !r->tokens) {
		uint64_t cap = r->cap ? r->cap : 256;
		while (cap < need)
			cap *= 2;
		if (cap > UINT32_MAX)
			cap = UINT32_MAX;
		uint32_t *t = realloc(r->tokens, (size_t)cap * sizeof(*t));
		if (!t) {
			r->tainted = 1;
			return -1;
		}
		r->tokens = t;
		r->cap = (uint32_t)cap;
	}
	memcpy(r->tokens + r->n, tokens, (size_t)n * sizeof(*tokens));
	r->n = need;
	return 0;
}

void k3cache_record_taint(struct k3cache_record *r)
{
	if (r)
		r->tainted = 1;
}

uint32_t k3cache_record_reusable(const struct k3cache_record *r, const uint32_t *prompt,
                                 uint32_t n_prompt)
{
	if (!r || r->tainted || r->n == 0 || !r->tokens || !prompt || n_prompt == 0)
		return 0;
	uint32_t max = r->n < n_prompt - 1 ? r->n : n_prompt - 1;
	uint32_t i = 0;
	while (i < max && r->tokens[i] == prompt[i])
		i++;
	return i;
}

int k3cache_publish_record(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                           const void *salt, size_t salt_len, const struct k3cache_record *r,
                           const struct k3cache_buf *blobs, uint32_t n_blobs,
                           struct k3cache_publish_result *res, struct k3cache_error *err)
{
	err_clear(err);
	if (res)
		memset(res, 0, sizeof(*res));
	if (!r)
		return FAIL(err, STATUS_INVALID, 0, "k3cache_publish_record: no record (NULL)");
	if (r->tainted)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_publish_record: the record is tainted (the live state no "
		            "longer equals "
		            "the prefill of its tokens): reset the state and the record, prefill "
		            "again, then publish");
	if (r->n == 0 || !r->tokens)
		return FAIL(err, STATUS_INVALID, 0,
		            "k3cache_publish_record: the record is empty: no token was fed to the "
		            "state");
	return k3cache_publish(c, fp, salt, salt_len, r->tokens, r->n, blobs, n_blobs, res, err);
}
