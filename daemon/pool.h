/* pool: the payload buffers of publishes, kept for reuse (pool.c).
 *
 * Touching fresh memory is slow on a VM that hands freed pages back to its
 * host (DESIGN: 1-2 GB/s against ~4 GB/s into touched pages), so a payload's
 * buffer goes back to the pool when its request is done, and the next
 * payload of about its size takes it. The pool, the receive windows' stage
 * buffers (window.h) and the payloads in flight share --max-inflight: a
 * buffer is pooled only while they fit, else freed and the heap trimmed.
 * After K3D_POOL_IDLE_TICKS ticks with no payload the pools are emptied.
 *
 * Loop thread only. */
#ifndef K3D_POOL_H
#define K3D_POOL_H

#include <stdint.h>

struct k3d_server;

/* A payload buffer of at least n bytes: a pooled one of at most twice n, or
 * a new one. *cap is its size. NULL when out of memory. */
unsigned char *k3d_pool_get(struct k3d_server *srv, uint64_t n, uint64_t *cap);
/* Takes back a buffer of cap bytes (NULL: nothing). */
void k3d_pool_put(struct k3d_server *srv, unsigned char *buf, uint64_t cap);
/* Frees the pools and trims the heaps once no payload came for
 * K3D_POOL_IDLE_TICKS and none is in flight (a tick). */
#define K3D_POOL_IDLE_TICKS 10
void k3d_pool_release_idle(struct k3d_server *srv);

#endif
