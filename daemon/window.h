/* window: the receive window of a streamed publish (window.c).
 *
 * A publish larger than the stage size is not held whole. Its payload is a
 * reserved virtual range (PROT_NONE, no memory) of which at most
 * K3D_WINDOW_STAGES stages are backed at once, in the order the bytes come.
 * Each stage's memory is a pooled, already touched buffer moved into place
 * with mremap (page tables move; no byte is copied, no page faults in), and
 * moved out again once the store has consumed its bytes
 * (store_stage_consumed). So a snapshot of any size holds a few stages of
 * memory, and the pages a VM hands back to its host are never faulted in
 * again per publish (DESIGN: 1-2 GB/s for fresh pages against ~4 GB/s into
 * touched ones).
 *
 * Where mremap cannot keep the source range (MREMAP_DONTUNMAP, Linux 5.7),
 * a stage is backed by fresh pages and dropped with MADV_DONTNEED instead:
 * the same bound, slower.
 *
 * Loop thread only: the buffers come from and go back to the server's
 * pool, which --max-inflight bounds with the payloads in flight.
 *
 * A window of its own (k3d_window_open_own; a tier-2 fetch's, t2_stage.c)
 * takes no buffer from the pool and touches nothing of the server's: any
 * one thread may use it, passing NULL for srv. Its stages are backed by
 * fresh pages (huge pages where the kernel gives them) and dropped with
 * MADV_DONTNEED. */
#ifndef K3D_WINDOW_H
#define K3D_WINDOW_H

#include <stdint.h>

/* Stages a streamed publish may hold at once. */
#define K3D_WINDOW_STAGES 3u
/* A publish whose full window the store has taken nothing of for this many
 * --stall-timeout is closed (K3D_WAIT_WINDOW's own limit). */
#define K3D_WINDOW_STUCK_FACTOR 4u

struct k3d_server;

struct k3d_window {
	unsigned char *base; /* the reserved range: the payload's bytes */
	uint64_t len;        /* its length: the payload rounded up to whole stages */
	uint64_t stage;      /* bytes per stage (a page multiple) */
	uint32_t n_slots;    /* stages in the range */
	uint32_t first;      /* slots [first, next) are backed */
	uint32_t next;
	int own; /* k3d_window_open_own: no pool, no server */
};

/* The stage size of the server's windows: the store's, at least 1 MiB (a chunk),
 * in whole pages. */
uint64_t k3d_window_stage(const struct k3d_server *srv);

/* The bytes a window for a payload of plen holds at most. */
uint64_t k3d_window_bytes(const struct k3d_server *srv, uint64_t plen);

/* Reserves the range for a payload of plen bytes. 0, or -1 (no address
 * space). */
int k3d_window_open(struct k3d_server *srv, struct k3d_window *w, uint64_t plen);

/* The same for a window of its own, of stages of `stage` bytes (a page
 * multiple; k3d_window_stage()). */
int k3d_window_open_own(struct k3d_window *w, uint64_t stage, uint64_t plen);

/* Backs the next slot, so that bytes up to its end can be received. 0; 1
 * when the window holds K3D_WINDOW_STAGES already (wait for the store); -1
 * when out of memory. */
int k3d_window_grow(struct k3d_server *srv, struct k3d_window *w);

/* Where the backed bytes end (received bytes go up to here). */
uint64_t k3d_window_end(const struct k3d_window *w);

/* Hands back the slots wholly before `consumed` (payload bytes). */
void k3d_window_release(struct k3d_server *srv, struct k3d_window *w, uint64_t consumed);

/* Hands back every slot and the range. */
void k3d_window_close(struct k3d_server *srv, struct k3d_window *w);

/* The server's pool of stage buffers (server.c frees it). */
void k3d_window_pool_free(struct k3d_server *srv, uint32_t keep);

#endif
