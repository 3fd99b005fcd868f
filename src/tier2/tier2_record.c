/* tier2_record: the entry record of tier 2 (tier2.h, "Entry record"). */
#include <stdlib.h>
#include <string.h>

#include "tier2/tier2_io.h"
#include "xxh_dispatch.h"

#define REC_HEAD 48u /* magic, version, flags, generation, fingerprint */

static void le16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

size_t tier2_record_size(uint32_t salt_len, uint32_t n_tokens, uint32_t n_layers, uint32_t n_chunks)
{
	return (size_t)REC_HEAD + 4 + salt_len + 4 + (size_t)n_tokens * 4u + 4 +
	       (size_t)n_layers * 16u + 4 + 4 + (size_t)n_chunks * 8u + 8;
}

uint64_t tier2_chunk_count(uint64_t total, uint32_t chunk_size)
{
	return total / chunk_size + (total % chunk_size != 0);
}

/* The sum of the layers' sizes, or 0 when one is 0 or the sum passes the
 * limit. */
static uint64_t total_size(const struct tier2_layer *layers, uint32_t n, uint32_t *bad)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (layers[i].size == 0 || layers[i].size > TIER2_MAX_ENTRY_BYTES - total) {
			*bad = i;
			return 0;
		}
		total += layers[i].size;
	}
	return total;
}

int tier2_record_encode(const struct tier2_record *rec, uint8_t **out, size_t *len, char *err,
                        size_t errsz)
{
	*out = NULL;
	*len = 0;
	if (rec->salt_len > TIER2_MAX_SALT || rec->n_tokens == 0 ||
	    rec->n_tokens > TIER2_MAX_TOKENS || rec->n_layers == 0 ||
	    rec->n_layers > TIER2_MAX_LAYERS || rec->chunk_size == 0 ||
	    rec->chunk_size > TIER2_CHUNK_MAX || rec->n_chunks > TIER2_MAX_CHUNKS) {
		tier2_io_err(
		        err, errsz,
		        "tier2 record: counts outside the limits (salt %u, tokens %u, layers %u, "
		        "chunk size %u, chunks %u)",
		        rec->salt_len, rec->n_tokens, rec->n_layers, rec->chunk_size,
		        rec->n_chunks);
		return -1;
	}
	uint32_t bad = 0;
	uint64_t total = total_size(rec->layers, rec->n_layers, &bad);
	if (!total) {
		tier2_io_err(err, errsz,
		             "tier2 record: layer %u is empty or the sizes pass %llu bytes", bad,
		             (unsigned long long)TIER2_MAX_ENTRY_BYTES);
		return -1;
	}
	if (tier2_chunk_count(total, rec->chunk_size) != rec->n_chunks) {
		tier2_io_err(err, errsz, "tier2 record: %u chunks for %llu bytes cut every %u",
		             rec->n_chunks, (unsigned long long)total, rec->chunk_size);
		return -1;
	}
	size_t n = tier2_record_size(rec->salt_len, rec->n_tokens, rec->n_layers, rec->n_chunks);
	unsigned char *b = malloc(n);
	if (!b) {
		tier2_io_err(err, errsz, "tier2 record: out of memory for %zu bytes", n);
		return -1;
	}
	unsigned char *p = b;
	memcpy(p, TIER2_RECORD_MAGIC, 4);
	le16(p + 4, TIER2_RECORD_VERSION);
	le16(p + 6, 0);
	tier2_put_le64(p + 8, rec->generation);
	memcpy(p + 16, rec->fingerprint, 32);
	p += REC_HEAD;
	tier2_put_le32(p, rec->salt_len);
	if (rec->salt_len)
		memcpy(p + 4, rec->salt, rec->salt_len);
	p += 4 + rec->salt_len;
	tier2_put_le32(p, rec->n_tokens);
	p += 4;
	for (uint32_t i = 0; i < rec->n_tokens; i++, p += 4)
		tier2_put_le32(p, rec->tokens[i]);
	tier2_put_le32(p, rec->n_layers);
	p += 4;
	for (uint32_t i = 0; i < rec->n_layers; i++, p += 16) {
		tier2_put_le64(p, rec->layers[i].size);
		tier2_put_le64(p + 8, rec->layers[i].xxh3);
	}
	tier2_put_le32(p, rec->chunk_size);
	tier2_put_le32(p + 4, rec->n_chunks);
	p += 8;
	for (uint32_t i = 0; i < rec->n_chunks; i++, p += 8)
		tier2_put_le64(p, rec->chunk_xxh3[i]);
	tier2_put_le64(p, XXH3_64bits(b, (size_t)(p - b)));
	*out = b;
	*len = n;
	return 0;
}

/* A cursor over the record's bytes that refuses to read past them. */
struct rd {
	const unsigned char *b;
	size_t len, off;
	char *err;
	size_t errsz;
};

static int need(struct rd *r, uint64_t n, const char *what)
{
	if (n > r->len - r->off) {
		tier2_io_err(r->err, r->errsz,
		             "tier2 record: truncated: %s needs %llu bytes at offset %zu, %zu left",
		             what, (unsigned long long)n, r->off, r->len - r->off);
		return -1;
	}
	return 0;
}

static int u32_at(struct rd *r, const char *what, uint32_t max, uint32_t min, uint32_t *v)
{
	if (need(r, 4, what) != 0)
		return -1;
	*v = tier2_get_le32(r->b + r->off);
	if (*v > max || *v < min) {
		tier2_io_err(r->err, r->errsz,
		             "tier2 record: %s %u at offset %zu is outside %u..%u", what, *v,
		             r->off, min, max);
		return -1;
	}
	r->off += 4;
	return 0;
}

int tier2_record_decode(const void *buf, size_t len, struct tier2_record *out, char *err,
                        size_t errsz)
{
	memset(out, 0, sizeof(*out));
	struct rd r = {buf, len, 0, err, errsz};
	if (need(&r, REC_HEAD, "the header") != 0)
		return -1;
	if (memcmp(r.b, TIER2_RECORD_MAGIC, 4) != 0) {
		tier2_io_err(err, errsz, "tier2 record: bad magic (not \"%s\")",
		             TIER2_RECORD_MAGIC);
		return -1;
	}
	unsigned version = (unsigned)r.b[4] | (unsigned)r.b[5] << 8;
	unsigned flags = (unsigned)r.b[6] | (unsigned)r.b[7] << 8;
	if (version != TIER2_RECORD_VERSION || flags != 0) {
		tier2_io_err(err, errsz,
		             "tier2 record: version %u flags %#x (this reader knows version %u, "
		             "no flags)",
		             version, flags, TIER2_RECORD_VERSION);
		return -1;
	}
	uint64_t generation = tier2_get_le64(r.b + 8);
	r.off = REC_HEAD;
	uint32_t salt_len = 0, n_tokens = 0, n_layers = 0, chunk_size = 0, n_chunks = 0;
	if (u32_at(&r, "salt_len", TIER2_MAX_SALT, 0, &salt_len) != 0 ||
	    need(&r, salt_len, "the salt") != 0)
		return -1;
	size_t salt_off = r.off;
	r.off += salt_len;
	if (u32_at(&r, "the token count", TIER2_MAX_TOKENS, 1, &n_tokens) != 0 ||
	    need(&r, (uint64_t)n_tokens * 4u, "the tokens") != 0)
		return -1;
	size_t tok_off = r.off;
	r.off += (size_t)n_tokens * 4u;
	if (u32_at(&r, "the layer count", TIER2_MAX_LAYERS, 1, &n_layers) != 0 ||
	    need(&r, (uint64_t)n_layers * 16u, "the layers") != 0)
		return -1;
	size_t lay_off = r.off;
	r.off += (size_t)n_layers * 16u;
	if (u32_at(&r, "chunk_size", TIER2_CHUNK_MAX, 1, &chunk_size) != 0 ||
	    u32_at(&r, "the chunk count", TIER2_MAX_CHUNKS, 1, &n_chunks) != 0 ||
	    need(&r, (uint64_t)n_chunks * 8u + 8u, "the chunk sums and the record sum") != 0)
		return -1;
	size_t chk_off = r.off;
	r.off += (size_t)n_chunks * 8u;
	if (r.len - r.off != 8) {
		tier2_io_err(err, errsz,
		             "tier2 record: %zu trailing bytes after the record sum at offset %zu",
		             r.len - r.off - 8, r.off + 8);
		return -1;
	}
	uint64_t sum = XXH3_64bits(r.b, r.off);
	if (tier2_get_le64(r.b + r.off) != sum) {
		tier2_io_err(err, errsz, "tier2 record: record sum %016llx, its bytes give %016llx",
		             (unsigned long long)tier2_get_le64(r.b + r.off),
		             (unsigned long long)sum);
		return -1;
	}
	/* one allocation: layers, chunk sums, tokens, salt (8-byte fields first) */
	size_t mem_len = (size_t)n_layers * sizeof(struct tier2_layer) + (size_t)n_chunks * 8u +
	                 (size_t)n_tokens * 4u + salt_len;
	unsigned char *mem = malloc(mem_len);
	if (!mem) {
		tier2_io_err(err, errsz, "tier2 record: out of memory for %zu bytes", mem_len);
		return -1;
	}
	struct tier2_layer *layers = (struct tier2_layer *)(void *)mem;
	uint64_t *chunks = (uint64_t *)(void *)(mem + (size_t)n_layers * sizeof(*layers));
	uint32_t *tokens = (uint32_t *)(void *)(chunks + n_chunks);
	uint8_t *salt = (uint8_t *)(tokens + n_tokens);
	for (uint32_t i = 0; i < n_layers; i++) {
		layers[i].size = tier2_get_le64(r.b + lay_off + (size_t)i * 16u);
		layers[i].xxh3 = tier2_get_le64(r.b + lay_off + (size_t)i * 16u + 8);
	}
	uint32_t bad = 0;
	uint64_t total = total_size(layers, n_layers, &bad);
	if (!total || tier2_chunk_count(total, chunk_size) != n_chunks) {
		if (!total)
			tier2_io_err(
			        err, errsz,
			        "tier2 record: layer %u of %u has size %llu (empty, or the sizes "
			        "pass "
			        "%llu bytes)",
			        bad, n_layers, (unsigned long long)layers[bad].size,
			        (unsigned long long)TIER2_MAX_ENTRY_BYTES);
		else
			tier2_io_err(
			        err, errsz,
			        "tier2 record: %u chunks, but %llu bytes cut every %u make %llu",
			        n_chunks, (unsigned long long)total, chunk_size,
			        (unsigned long long)tier2_chunk_count(total, chunk_size));
		free(mem);
		return -1;
	}
	for (uint32_t i = 0; i < n_chunks; i++)
		chunks[i] = tier2_get_le64(r.b + chk_off + (size_t)i * 8u);
	for (uint32_t i = 0; i < n_tokens; i++)
		tokens[i] = tier2_get_le32(r.b + tok_off + (size_t)i * 4u);
	if (salt_len)
		memcpy(salt, r.b + salt_off, salt_len);
	out->generation = generation;
	memcpy(out->fingerprint, r.b + 16, 32);
	out->salt_len = salt_len;
	out->salt = salt_len ? salt : NULL;
	out->n_tokens = n_tokens;
	out->tokens = tokens;
	out->n_layers = n_layers;
	out->layers = layers;
	out->chunk_size = chunk_size;
	out->n_chunks = n_chunks;
	out->chunk_xxh3 = chunks;
	out->mem = mem;
	return 0;
}

void tier2_record_free(struct tier2_record *rec)
{
	if (!rec)
		return;
	free(rec->mem);
	memset(rec, 0, sizeof(*rec));
}
