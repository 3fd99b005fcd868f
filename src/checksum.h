/* checksum: XXH3-64 of a blob's bytes seeded with its layer index
 * (contract: DESIGN.md, the `xxh3` field of LayerRef). Binding the checksum to
 * the slot means a blob moved to another layer fails its check even where two
 * layers have the same shape. */
#ifndef K3_CHECKSUM_H
#define K3_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's size, for checksum_run */
#include <xxhash.h>

uint64_t checksum_blob(const void *bytes, size_t len, uint32_t layer);

/* Streaming form, for blobs that arrive or are stored in pieces, with a
 * state on the heap (for one that outlives the caller's frame). NULL when
 * out of memory. */
struct checksum_state;
struct checksum_state *checksum_begin(uint32_t layer);
void checksum_update(struct checksum_state *st, const void *bytes, size_t len);
/* Returns the checksum and frees the state. */
uint64_t checksum_end(struct checksum_state *st);

/* The same with the state in the caller's frame, which cannot fail: a
 * check of bytes in hand never reports running out of memory as something
 * wrong with them. (The state needs 64-byte alignment: a local variable has
 * it, malloc's memory does not.) */
struct checksum_run {
	XXH3_state_t xs;
};
void checksum_run_begin(struct checksum_run *r, uint32_t layer);
void checksum_run_update(struct checksum_run *r, const void *bytes, size_t len);
uint64_t checksum_run_end(const struct checksum_run *r);

#endif
