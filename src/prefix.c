#include "prefix.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
/* XXH3_state_t on the stack: the chained hashes allocate nothing */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static void le32(unsigned char b[4], uint32_t v)
{
	b[0] = (unsigned char)v;
	b[1] = (unsigned char)(v >> 8);
	b[2] = (unsigned char)(v >> 16);
	b[3] = (unsigned char)(v >> 24);
}

int prefix_key(const uint8_t fingerprint[32], const void *salt, size_t salt_len,
               const uint32_t *tokens, uint32_t n, uint8_t out[PREFIX_KEY_LEN])
{
	static const char magic[] = "k3cache-prefix-v1"; /* hashed with its NUL */
	unsigned char b[4], salt_le[4];
	le32(salt_le, (uint32_t)salt_len);
	le32(b, n);
	unsigned int len = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	/* Tokens are u32 little-endian; the host is little-endian (CMake checks). */
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
	         EVP_DigestUpdate(ctx, magic, sizeof(magic)) &&
	         EVP_DigestUpdate(ctx, fingerprint, 32) && EVP_DigestUpdate(ctx, salt_le, 4) &&
	         (!salt_len || EVP_DigestUpdate(ctx, salt, salt_len)) &&
	         EVP_DigestUpdate(ctx, b, 4) &&
	         (!n || EVP_DigestUpdate(ctx, tokens, (size_t)n * 4u)) &&
	         EVP_DigestFinal_ex(ctx, out, &len) && len == PREFIX_KEY_LEN;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		memset(out, 0, PREFIX_KEY_LEN);
	return ok ? 0 : -1;
}

static void put_hash(XXH128_hash_t h, uint8_t out[PREFIX_NODE_LEN])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h);
	memcpy(out, c.digest, PREFIX_NODE_LEN);
}

uint32_t prefix_block_hashes(const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                             const uint32_t *tokens, uint32_t n, uint8_t (*out)[PREFIX_NODE_LEN])
{
	static const char magic[] = "k3cache-block-v1";
	unsigned char b[4];
	XXH3_state_t state;
	XXH3_state_t *st = &state;
	XXH3_INITSTATE(st);
	XXH3_128bits_reset(st);
	XXH3_128bits_update(st, magic, sizeof(magic));
	XXH3_128bits_update(st, fingerprint, 32);
	le32(b, (uint32_t)salt_len);
	XXH3_128bits_update(st, b, 4);
	if (salt_len)
		XXH3_128bits_update(st, salt, salt_len);
	le32(b, PREFIX_BLOCK);
	XXH3_128bits_update(st, b, 4);
	XXH128_hash_t h = XXH3_128bits_digest(st);

	uint32_t k = n / PREFIX_BLOCK;
	unsigned char buf[16 + PREFIX_BLOCK * 4];
	put_hash(h, out[0]);
	for (uint32_t d = 0; d < k; d++) {
		XXH128_canonical_t c;
		XXH128_canonicalFromHash(&c, h);
		memcpy(buf, c.digest, 16);
		memcpy(buf + 16, tokens + (size_t)d * PREFIX_BLOCK, (size_t)PREFIX_BLOCK * 4u);
		h = XXH3_128bits(buf, sizeof(buf));
		put_hash(h, out[d + 1]);
	}
	return k;
}
