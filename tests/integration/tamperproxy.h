/* A man in the middle for the client's validation tests: a Unix socket that
 * forwards a client's requests to the real daemon as they are, and each
 * answer back with its restore payload changed by a tamper function, the
 * way a bad daemon or a bad wire would. The client library receives the bytes
 * through its shipped path (piece by piece); it has no hook of its own. */
#ifndef K3_TAMPERPROXY_H
#define K3_TAMPERPROXY_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "daemonutil.h"

/* Changes layer `index` of a restore payload in place. */
typedef void (*tamperproxy_fn)(uint32_t index, void *blob, size_t len);

struct tamperproxy {
	char path[320];
	const char *daemon_sock;
	int lfd;
	pthread_t thread;
	_Atomic(tamperproxy_fn) tamper; /* NULL: forward unchanged */
};

struct tamperproxy_conn {
	struct tamperproxy *p;
	int cfd, dfd;
};

/* Client to daemon, byte for byte, until either side closes. */
static inline void *tamperproxy_up(void *arg)
{
	struct tamperproxy_conn *pc = arg;
	unsigned char buf[1 << 16];
	for (;;) {
		ssize_t n = recv(pc->cfd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || daemonutil_write_all(pc->dfd, buf, (size_t)n) != 0)
			break;
	}
	shutdown(pc->dfd, SHUT_WR);
	return NULL;
}

/* Daemon to client, a frame at a time: the header as it is, the payload
 * read whole, tampered layer by layer, then sent. */
static inline void tamperproxy_down(struct tamperproxy_conn *pc)
{
	for (;;) {
		unsigned char pre[FRAME_PREFIX_LEN];
		if (daemonutil_read_all(pc->dfd, pre, sizeof(pre), 60000) != 0)
			break;
		uint32_t hlen = frame_get_len(pre);
		unsigned char *h = malloc(hlen ? hlen : 1);
		if (!h || daemonutil_read_all(pc->dfd, h, hlen, 60000) != 0) {
			free(h);
			break;
		}
		frame_response *r = frame_decode_response(h, hlen, NULL);
		int ok = r && daemonutil_write_all(pc->cfd, pre, sizeof(pre)) == 0 &&
		         daemonutil_write_all(pc->cfd, h, hlen) == 0;
		free(h);
		unsigned char *payload = NULL;
		if (ok && r->payload_len) {
			payload = malloc((size_t)r->payload_len);
			ok = payload && daemonutil_read_all(pc->dfd, payload,
			                                    (size_t)r->payload_len, 60000) == 0;
			tamperproxy_fn fn = atomic_load(&pc->p->tamper);
			uint64_t off = 0;
			for (size_t i = 0; ok && fn && i < r->n_layers; i++) {
				if (off + r->layers[i]->size > r->payload_len)
					break;
				fn((uint32_t)i, payload + off, (size_t)r->layers[i]->size);
				off += r->layers[i]->size;
			}
			ok = ok &&
			     daemonutil_write_all(pc->cfd, payload, (size_t)r->payload_len) == 0;
		}
		free(payload);
		frame_response_free(r);
		if (!ok)
			break;
	}
}

static inline void *tamperproxy_main(void *arg)
{
	struct tamperproxy *p = arg;
	for (;;) {
		int cfd = accept(p->lfd, NULL, NULL);
		if (cfd < 0) {
			if (errno == EINTR)
				continue;
			break; /* closed: the proxy stops */
		}
		struct tamperproxy_conn pc = {p, cfd, daemonutil_connect_raw(p->daemon_sock)};
		pthread_t up;
		if (pc.dfd >= 0 && pthread_create(&up, NULL, tamperproxy_up, &pc) == 0) {
			tamperproxy_down(&pc);
			shutdown(pc.cfd, SHUT_RDWR);
			shutdown(pc.dfd, SHUT_RDWR);
			pthread_join(up, NULL);
		}
		if (pc.dfd >= 0)
			close(pc.dfd);
		close(cfd);
	}
	return NULL;
}

/* Listens at dir/tamper.sock, in front of daemon_sock; serves one client
 * connection at a time. 0 or -1. */
static inline int tamperproxy_start(struct tamperproxy *p, const char *dir, const char *daemon_sock)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->path, sizeof(p->path), "%s/tamper.sock", dir);
	p->daemon_sock = daemon_sock;
	p->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%.100s", p->path);
	unlink(p->path);
	if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sun, sizeof(sun)) != 0 ||
	    listen(p->lfd, 4) != 0 || pthread_create(&p->thread, NULL, tamperproxy_main, p) != 0)
		return -1;
	return 0;
}

static inline void tamperproxy_set(struct tamperproxy *p, tamperproxy_fn fn)
{
	atomic_store(&p->tamper, fn);
}

static inline void tamperproxy_stop(struct tamperproxy *p)
{
	shutdown(p->lfd, SHUT_RDWR); /* wakes accept() */
	close(p->lfd);
	pthread_join(p->thread, NULL);
	unlink(p->path);
}

#endif
