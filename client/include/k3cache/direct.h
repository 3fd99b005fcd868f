/* k3cache/direct.h: direct reads of a k3cache store for a worker on the
 * daemon's host (libk3cache-direct).
 *
 * The store's LMDB environment is opened read-only in the worker's own
 * process, so a restore reads the snapshot from the page cache instead of
 * through the daemon's socket. Lookups follow the daemon's rules exactly
 * (the longest stored prefix, tokens compared one by one, the same
 * namespace: asked of the daemon once, at open), and a restore into caller
 * buffers checks every layer (slot, shape, seq_len, finite, and the
 * checksum the publish recorded) before it reports success.
 *
 * Trust: LMDB's lock file (DIR/lock.mdb) must be writable to register as a
 * reader, so its permissions decide who may read directly, and a direct
 * reader can read every entry of every tenant in the store. Grant it to
 * the workers of one trusted service only (the daemon's group).
 *
 * Restores and views made here reach the daemon as uses (LRU order, hit
 * counts) in batches of 256 and at close; an entry found damaged here is
 * reported at once, and the daemon checks it and quarantines it. Both go
 * over the connection opened at open, each waiting at most 0.5 s for the
 * daemon's answer. Reads never depend on the daemon: while it cannot be
 * reached or does not answer, reports are dropped, and it is connected to
 * again 1 s after the failure, then 2 s, 4 s ... up to 60 s (a restarted
 * daemon gets them again). */
#ifndef K3CACHE_DIRECT_H
#define K3CACHE_DIRECT_H

#include "k3cache.h"

#ifdef __cplusplus
extern "C" {
#endif

struct k3cache_direct;

/* Opens the store in dir read-only. daemon_addr is the daemon serving it
 * (as for k3cache_connect; NULL: the default), asked once for this
 * process's namespace and its store file: a daemon that serves another
 * store is refused (K3CACHE_INVALID); the connection stays open for the
 * reports.
 *
 * An entry of 32 MiB or more is checked on several threads, each taking whole
 * layers: XXH3 and the finite scan cost a core more than the copy itself,
 * so one thread runs at about half of memcpy. K3CACHE_DIRECT_THREADS (read
 * here; 1 to 16, default: the online CPUs, at most 4) sets how many; 1
 * keeps every check on the calling thread. Errors are the same either way:
 * of several damaged layers the first is named. So the destinations of one
 * restore (buffers, arrays) must not overlap. A k3cache_direct is used
 * from one thread at a time; several may be open on one store (a thread
 * each): they share the process's LMDB environment of it, which the last
 * close closes, so closing one never disturbs another's views.
 *
 * A k3cache_direct belongs to the process that opened it. After fork(),
 * the child's calls with it are refused (K3CACHE_INVALID): it opens its
 * own. Its k3cache_direct_close and view releases there free memory only,
 * leaving the parent's reads and views as they were.
 *
 * The model passed to these calls is libk3cache's (k3cache_model_load and
 * the like); libk3cache-direct must be of the same version as the
 * libk3cache loaded beside it (k3cache-direct.pc requires it). */
K3CACHE_API int k3cache_direct_open(const char *dir, const char *daemon_addr,
                                    struct k3cache_direct **out, struct k3cache_error *err);
K3CACHE_API void k3cache_direct_close(struct k3cache_direct *d);

/* k3cache_lookup() against the store itself. */
K3CACHE_API int k3cache_direct_lookup(struct k3cache_direct *d, const uint8_t fp[K3CACHE_FP_LEN],
                                      const void *salt, size_t salt_len, const uint32_t *tokens,
                                      uint32_t n_tokens, uint32_t limit,
                                      struct k3cache_lookup_result *out, struct k3cache_error *err);

/* k3cache_restore_into() from the store itself: each layer is copied into
 * bufs[i] and checked while it is in cache (buffers too small, or sharing
 * memory, are refused first). On failure the buffers' contents are
 * unspecified and must not be used. */
K3CACHE_API int k3cache_direct_restore_into(struct k3cache_direct *d,
                                            const struct k3cache_model *model,
                                            const uint8_t key[K3CACHE_KEY_LEN], void *const *bufs,
                                            const size_t *caps, size_t *lens, uint32_t *prefix_len,
                                            struct k3cache_error *err);

/* k3cache_restore_arrays() from the store itself: each layer scattered
 * straight into its two arrays (KDA conv and recurrent, MLA k and v at the
 * entry's P), with the same checks. */
K3CACHE_API int k3cache_direct_restore_arrays(struct k3cache_direct *d,
                                              const struct k3cache_model *model,
                                              const uint8_t key[K3CACHE_KEY_LEN],
                                              const struct k3cache_arrays_out *layers,
                                              uint32_t n_layers, uint32_t *prefix_len,
                                              struct k3cache_error *err);

/* Form 2: read-only views into the store's map, no copy. Each layer is
 * its blob as pieces in order (the seed's format once joined), every layer
 * checked (the same checks) before the call succeeds. Meanwhile LMDB keeps
 * the pages they show, so the file grows instead of reusing them: release
 * a view as soon as its layers are loaded. A view lives at most
 * K3CACHE_DIRECT_VIEW_SECONDS (read at open; default 30, 0: no limit):
 * the first call into the same k3cache_direct after that ends its read
 * transaction and sets every piece's data to NULL, so a view held too
 * long fails loudly instead of showing pages reused by later writes.
 * k3cache_direct_view_valid() says whether it still holds; release it
 * either way. k3cache_direct_close() ends every view. */
struct k3cache_view_layer {
	const struct k3cache_buf *pieces;
	uint32_t n_pieces;
	size_t len; /* the blob's bytes, all pieces */
};

struct k3cache_direct_view {
	uint32_t prefix_len;
	uint32_t n_layers;
	const struct k3cache_view_layer *layers;
	void *priv;
};

K3CACHE_API int k3cache_direct_view(struct k3cache_direct *d, const struct k3cache_model *model,
                                    const uint8_t key[K3CACHE_KEY_LEN],
                                    struct k3cache_direct_view **out, struct k3cache_error *err);
K3CACHE_API void k3cache_direct_view_release(struct k3cache_direct_view *v);
K3CACHE_API int k3cache_direct_view_valid(const struct k3cache_direct_view *v);

#ifdef __cplusplus
}
#endif

#endif
