/* window: a streamed publish's payload, a few stages of it in memory
 * (window.h). */
#include "window.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

/* Transparent huge pages move as one page-table entry each. */
#define HUGE ((uint64_t)2 << 20)

static uint64_t round_up(uint64_t n, uint64_t to)
{
	return (n + to - 1) / to * to;
}

uint64_t k3d_window_stage(const struct k3d_server *srv)
{
	/* a chunk's bytes wait in the window until it is written: a stage
	 * holds one at least (store_stage_consumed) */
	uint64_t s = store_stage_bytes(srv->store);
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	if (s < ((uint64_t)1 << 20))
		s = (uint64_t)1 << 20;
	return round_up(s, s >= HUGE ? HUGE : page);
}

uint64_t k3d_window_bytes(const struct k3d_server *srv, uint64_t plen)
{
	uint64_t stage = k3d_window_stage(srv), whole = round_up(plen, stage);
	uint64_t most = stage * K3D_WINDOW_STAGES;
	return whole < most ? whole : most;
}

/* A range of len bytes reserved at an address aligned to `align`: no
 * access, no memory. NULL when the address space is short. */
static unsigned char *reserve(uint64_t len, uint64_t align)
{
	unsigned char *p = mmap(NULL, len + align, PROT_NONE,
	                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	unsigned char *at = p + (round_up((uint64_t)(uintptr_t)p, align) - (uint64_t)(uintptr_t)p);
	if (at > p)
		munmap(p, (size_t)(at - p));
	if (at + len < p + len + align)
		munmap(at + len, (size_t)(p + len + align - (at + len)));
	return at;
}

/* A stage buffer: one from the pool, or a new one, touched. */
static unsigned char *stage_get(struct k3d_server *srv, uint64_t stage)
{
	if (srv->stage_n > 0) {
		srv->pool_bytes -= stage;
		return srv->stage_pool[--srv->stage_n];
	}
	unsigned char *p = reserve(stage, stage >= HUGE ? HUGE : stage);
	if (!p)
		return NULL;
	if (mprotect(p, stage, PROT_READ | PROT_WRITE) != 0) {
		munmap(p, stage);
		return NULL;
	}
	if (stage >= HUGE)
		(void)madvise(p, stage, MADV_HUGEPAGE);
	memset(p, 0, stage); /* fault it in once, here, not under the socket */
	return p;
}

/* Gives a stage buffer back to the pool, or to the system when the pool and
 * the payloads in flight fill --max-inflight. */
static void stage_put(struct k3d_server *srv, unsigned char *p, uint64_t stage)
{
	const uint32_t slots = sizeof(srv->stage_pool) / sizeof(srv->stage_pool[0]);
	if (srv->stage_n < slots &&
	    srv->pool_bytes + srv->inflight_bytes + stage <= srv->cfg.max_inflight) {
		srv->stage_pool[srv->stage_n++] = p;
		srv->pool_bytes += stage;
		return;
	}
	munmap(p, stage);
}

void k3d_window_pool_free(struct k3d_server *srv, uint32_t keep)
{
	uint64_t stage = k3d_window_stage(srv);
	while (srv->stage_n > keep) {
		munmap(srv->stage_pool[--srv->stage_n], stage);
		srv->pool_bytes -= stage;
	}
}

int k3d_window_open(struct k3d_server *srv, struct k3d_window *w, uint64_t plen)
{
	if (k3d_window_open_own(w, k3d_window_stage(srv), plen) != 0)
		return -1;
	w->own = 0; /* its stages come from the server's pool */
	return 0;
}

int k3d_window_open_own(struct k3d_window *w, uint64_t stage, uint64_t plen)
{
	memset(w, 0, sizeof(*w));
	w->own = 1;
	w->stage = stage;
	w->len = round_up(plen ? plen : 1, w->stage);
	w->n_slots = (uint32_t)(w->len / w->stage);
	w->base = reserve(w->len, w->stage >= HUGE ? HUGE : w->stage);
	if (!w->base)
		return -1;
	if (w->stage >= HUGE)
		(void)madvise(w->base, w->len, MADV_HUGEPAGE);
	return 0;
}

uint64_t k3d_window_end(const struct k3d_window *w)
{
	return (uint64_t)w->next * w->stage;
}

int k3d_window_grow(struct k3d_server *srv, struct k3d_window *w)
{
	if (w->next >= w->n_slots || w->next - w->first >= K3D_WINDOW_STAGES)
		return 1;
	unsigned char *at = w->base + (uint64_t)w->next * w->stage;
	if (w->own || srv->window_fresh) { /* no moving: fresh pages */
		if (mprotect(at, w->stage, PROT_READ | PROT_WRITE) != 0)
			return -1;
		w->next++;
		if (!w->own)
			srv->window_bytes += w->stage;
		return 0;
	}
	unsigned char *p = stage_get(srv, w->stage);
	if (!p)
		return -1;
	if (mremap(p, w->stage, w->stage, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
		munmap(p, w->stage);
		return -1;
	}
	w->next++;
	srv->window_bytes += w->stage;
	return 0;
}

/* Takes slot i's memory out of the range, leaving it reserved. */
static void slot_release(struct k3d_server *srv, struct k3d_window *w, uint32_t i)
{
	unsigned char *at = w->base + (uint64_t)i * w->stage;
	if (!w->own)
		srv->window_bytes -= w->stage;
	if (!w->own && !srv->window_fresh) {
		void *p = mremap(at, w->stage, w->stage, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
		if (p != MAP_FAILED) {
			stage_put(srv, p, w->stage);
			(void)mprotect(at, w->stage, PROT_NONE);
			return;
		}
		if (errno == EINVAL) { /* an older kernel: fresh pages from now on */
			k3d_log(K3D_LOG_INFO, "receive windows: mremap cannot keep a range here "
			                      "(MREMAP_DONTUNMAP); stages use fresh pages");
			srv->window_fresh = 1;
			k3d_window_pool_free(srv, 0);
		}
	}
	(void)madvise(at, w->stage, MADV_DONTNEED);
	(void)mprotect(at, w->stage, PROT_NONE);
}

void k3d_window_release(struct k3d_server *srv, struct k3d_window *w, uint64_t consumed)
{
	uint64_t whole = consumed / w->stage;
	while (w->first < w->next && w->first < whole)
		slot_release(srv, w, w->first++);
}

void k3d_window_close(struct k3d_server *srv, struct k3d_window *w)
{
	if (!w->base)
		return;
	while (w->first < w->next)
		slot_release(srv, w, w->first++);
	munmap(w->base, w->len);
	w->base = NULL;
}
