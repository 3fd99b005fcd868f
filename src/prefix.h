/* prefix: entry keys (contract: DESIGN.md "Prefix key and lookup") and the
 * chained block hashes the store's longest-prefix lookup walks.
 *
 * Entry key = SHA-256("k3cache-prefix-v1\0" | fingerprint | u32 salt_len |
 * salt | u32 P | P x u32 token), integers little-endian.
 *
 * Block hashes: the prompt is cut into blocks of PREFIX_BLOCK tokens. Node d
 * (d >= 1) names the first d blocks under one model and salt:
 *   h_0 = XXH3-128("k3cache-block-v1\0" | fingerprint | u32 salt_len | salt | u32 B)
 *   h_d = XXH3-128(h_{d-1} | B x u32 token)
 * A node hash only locates candidates; a hit is always confirmed by comparing
 * the tokens themselves, so a hash collision can cost a lookup, never a wrong
 * answer. XXH3 keeps hashing a 131,072-token prompt well under a millisecond. */
#ifndef K3_PREFIX_H
#define K3_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#define PREFIX_KEY_LEN  32
#define PREFIX_NODE_LEN 16
#define PREFIX_BLOCK    16u

/* The entry key of the first n tokens. 0, or -1 when OpenSSL cannot allocate
 * its digest (out is then zeroed). */
int prefix_key(const uint8_t fingerprint[32], const void *salt, size_t salt_len,
               const uint32_t *tokens, uint32_t n, uint8_t out[PREFIX_KEY_LEN]);

/* Node hashes h_0..h_k for k = n / PREFIX_BLOCK full blocks of tokens, written
 * to out[0..k] (PREFIX_NODE_LEN bytes each; h_0 is the root of this model and
 * salt). Returns k. `out` must hold n / PREFIX_BLOCK + 1 entries. Allocates
 * nothing and cannot fail. */
uint32_t prefix_block_hashes(const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                             const uint32_t *tokens, uint32_t n, uint8_t (*out)[PREFIX_NODE_LEN]);

#endif
