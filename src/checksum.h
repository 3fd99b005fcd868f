/* checksum: XXH3-64 of a blob's bytes seeded with its layer index
 * (contract: DESIGN.md, the `xxh3` field of LayerRef). Binding the checksum to
 * the slot means a blob moved to another layer fails its check even where two
 * layers have the same shape. */
#ifndef K3_CHECKSUM_H
#define K3_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t checksum_blob(const void *bytes, size_t len, uint32_t layer);

/* Streaming form, for blobs that arrive or are stored in pieces. */
struct checksum_state;
struct checksum_state *checksum_begin(uint32_t layer);
void checksum_update(struct checksum_state *st, const void *bytes, size_t len);
/* Returns the checksum and frees the state. */
uint64_t checksum_end(struct checksum_state *st);

#endif
