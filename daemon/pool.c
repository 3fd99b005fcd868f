/* pool: payload buffers kept for reuse, within --max-inflight (pool.h). */
#include <malloc.h>
#include <stdlib.h>

#include "daemon.h"
#include "pool.h"

/* Gives freed heap pages back to the system: the daemon keeps freed memory in
 * its heap (M_TRIM_THRESHOLD), so dropping a pooled buffer alone would not
 * lower its footprint. */
static void pool_free(struct k3d_server *srv, int i)
{
	free(srv->pool[i].data);
	srv->pool_bytes -= srv->pool[i].cap;
	srv->pool[i] = srv->pool[--srv->pool_n];
}

/* Drops pooled buffers, largest first, until the pool, the payloads in
 * flight and `want` more bytes fit in --max-inflight together. */
static void pool_shrink(struct k3d_server *srv, uint64_t want)
{
	int freed = 0;
	while (srv->pool_n > 0 &&
	       srv->pool_bytes + srv->inflight_bytes + want > srv->cfg.max_inflight) {
		int big = 0;
		for (int i = 1; i < srv->pool_n; i++)
			if (srv->pool[i].cap > srv->pool[big].cap)
				big = i;
		pool_free(srv, big);
		freed = 1;
	}
	if (freed)
		malloc_trim(0);
}

unsigned char *k3d_pool_get(struct k3d_server *srv, uint64_t n, uint64_t *cap)
{
	*cap = n;
	int best = -1;
	/* best fit, but not a buffer more than twice the size: its pages would
	 * stay resident for a small payload */
	for (int i = 0; i < srv->pool_n; i++)
		if (srv->pool[i].cap >= n && srv->pool[i].cap / 2 <= n &&
		    (best < 0 || srv->pool[i].cap < srv->pool[best].cap))
			best = i;
	if (best < 0) {
		pool_shrink(srv, n);
		return malloc(n ? n : 1);
	}
	unsigned char *b = srv->pool[best].data;
	*cap = srv->pool[best].cap;
	srv->pool_bytes -= srv->pool[best].cap;
	srv->pool[best] = srv->pool[--srv->pool_n];
	return b;
}

void k3d_pool_put(struct k3d_server *srv, unsigned char *buf, uint64_t cap)
{
	if (!buf)
		return;
	const int slots = (int)(sizeof(srv->pool) / sizeof(srv->pool[0]));
	/* pooled buffers and payloads in flight share --max-inflight */
	if (srv->pool_n < slots &&
	    srv->pool_bytes + srv->inflight_bytes + cap <= srv->cfg.max_inflight) {
		srv->pool[srv->pool_n].data = buf;
		srv->pool[srv->pool_n++].cap = cap;
		srv->pool_bytes += cap;
	} else {
		free(buf);
		malloc_trim(0);
	}
}

void k3d_pool_release_idle(struct k3d_server *srv)
{
	if (srv->idle_trimmed || srv->inflight_bytes ||
	    srv->ticks - srv->payload_tick < K3D_POOL_IDLE_TICKS)
		return;
	while (srv->pool_n > 0)
		pool_free(srv, 0);
	k3d_window_pool_free(srv, 0);
	/* and what the heaps keep (M_TRIM_THRESHOLD): LMDB's dirty pages of
	 * the last commits, freed on the writer's arena */
	malloc_trim(0);
	srv->idle_trimmed = 1;
}
