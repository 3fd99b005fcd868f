/* Forced node-hash collisions for the prefix-index tests, with no hook in the
 * library: a test linked with -Wl,--wrap=XXH3_128bits and
 * -Wl,--wrap=XXH3_128bits_digest (tests/CMakeLists.txt) gets prefix.c's calls
 * here. hashwrap_truncate(bits) keeps only the low `bits` bits of every
 * 128-bit hash (the last bytes of its canonical form), so block hashes
 * collide; 0 restores full hashes. */
#ifndef K3_HASHWRAP_H
#define K3_HASHWRAP_H

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static unsigned hashwrap_bits;

XXH128_hash_t __real_XXH3_128bits(const void *data, size_t len);
XXH128_hash_t __real_XXH3_128bits_digest(const XXH3_state_t *state);

static inline XXH128_hash_t hashwrap_cut(XXH128_hash_t h)
{
	if (!hashwrap_bits)
		return h;
	h.high64 = hashwrap_bits >= 128 ? h.high64
	           : hashwrap_bits > 64 ? h.high64 & ((UINT64_C(1) << (hashwrap_bits - 64)) - 1)
	                                : 0;
	if (hashwrap_bits < 64)
		h.low64 &= (UINT64_C(1) << hashwrap_bits) - 1;
	return h;
}

XXH128_hash_t __wrap_XXH3_128bits(const void *data, size_t len);
XXH128_hash_t __wrap_XXH3_128bits(const void *data, size_t len)
{
	return hashwrap_cut(__real_XXH3_128bits(data, len));
}

XXH128_hash_t __wrap_XXH3_128bits_digest(const XXH3_state_t *state);
XXH128_hash_t __wrap_XXH3_128bits_digest(const XXH3_state_t *state)
{
	return hashwrap_cut(__real_XXH3_128bits_digest(state));
}

static inline void hashwrap_truncate(unsigned bits)
{
	hashwrap_bits = bits;
}

#endif
