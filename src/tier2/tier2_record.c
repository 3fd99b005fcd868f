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

size_t tier2_record_size_v2(uint32_t salt_len, uint32_t n_tokens, uint32_t n_layers,
                            uint32_t n_chunks, uint32_t n_split, uint32_t n_parts)
{
	return tier2_record_size(salt_len, n_tokens, n_layers, n_chunks) + 4 + 4 +
	       (size_t)n_split * 16u + (size_t)n_parts * 8u;
}

uint64_t tier2_chunk_count(uint64_t total, uint32_t chunk_size)
{
	return total / chunk_size + (total % chunk_size != 0);
}

size_t tier2_stream_runs(const struct tier2_record *rec, struct tier2_run *out)
{
	size_t k = 0;
	uint32_t next = 0;
	for (uint32_t i = 0; i < rec->n_layers; i++) {
		uint64_t size = rec->layers[i].size;
		if (next < rec->n_split && rec->split[next].layer == i) {
			const struct tier2_split *sp = &rec->split[next++];
			uint64_t nb = sp->seq_len / rec->row_block;
			uint64_t kb = 4u * (uint64_t)sp->seq_len * sp->k_row;
			uint64_t kparts = nb * tier2_part_size(sp, rec->row_block, 0);
			uint64_t vparts = nb * tier2_part_size(sp, rec->row_block, 1);
			uint64_t vat = TIER2_MLA_HEAD + kb; /* the v count */
			out[k++] = (struct tier2_run){i, 0, TIER2_MLA_HEAD};
			out[k++] = (struct tier2_run){i, TIER2_MLA_HEAD + kparts, kb - kparts};
			out[k++] = (struct tier2_run){i, vat, 4};
			out[k++] = (struct tier2_run){i, vat + 4u + vparts,
			                              size - (vat + 4u + vparts)};
		} else {
			out[k++] = (struct tier2_run){i, 0, size};
		}
	}
	return k;
}

uint64_t tier2_stream_size(const struct tier2_record *rec)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < rec->n_layers; i++)
		total += rec->layers[i].size;
	for (uint32_t i = 0; i < rec->n_split; i++) {
		const struct tier2_split *sp = &rec->split[i];
		uint64_t nb = sp->seq_len / rec->row_block;
		total -= nb * (tier2_part_size(sp, rec->row_block, 0) +
		               tier2_part_size(sp, rec->row_block, 1));
	}
	return total;
}

/* Checks the split layers of a version-2 record against its layers, tokens
 * and limits; the number of parts to *n_parts. 0, or -1 with a message. */
static int check_splits(const struct tier2_record *rec, uint32_t *n_parts, char *err, size_t errsz)
{
	uint64_t parts = 0;
	*n_parts = 0;
	if (rec->row_block < 16 || rec->row_block > TIER2_ROW_BLOCK_MAX ||
	    rec->row_block % 16 != 0 || rec->n_split > rec->n_layers) {
		tier2_io_err(err, errsz,
		             "tier2 record: row block %u (a multiple of 16 in 16..%u), %u split "
		             "layers of %u",
		             rec->row_block, TIER2_ROW_BLOCK_MAX, rec->n_split, rec->n_layers);
		return -1;
	}
	for (uint32_t i = 0; i < rec->n_split; i++) {
		const struct tier2_split *sp = &rec->split[i];
		int order = sp->layer < rec->n_layers &&
		            (i == 0 || sp->layer > rec->split[i - 1].layer);
		/* seq_len <= 2^22, k_row + v_row < 2^33: no overflow in 64 bits */
		int shape = order && sp->seq_len >= rec->row_block &&
		            sp->seq_len <= rec->n_tokens && sp->k_row >= 1 && sp->v_row >= 1 &&
		            rec->layers[sp->layer].size ==
		                    TIER2_MLA_HEAD + 4u +
		                            4u * (uint64_t)sp->seq_len *
		                                    ((uint64_t)sp->k_row + sp->v_row) &&
		            tier2_part_size(sp, rec->row_block, 0) <= TIER2_PART_MAX &&
		            tier2_part_size(sp, rec->row_block, 1) <= TIER2_PART_MAX;
		if (!shape) {
			tier2_io_err(
			        err, errsz,
			        "tier2 record: split %u: layer %u (of %u, increasing), seq_len "
			        "%u (%u..%u tokens), rows of %u and %u floats (>= 1, parts of "
			        "at most %u bytes) do not make its size",
			        i, sp->layer, rec->n_layers, sp->seq_len, rec->row_block,
			        rec->n_tokens, sp->k_row, sp->v_row, TIER2_PART_MAX);
			return -1;
		}
		parts += 2u * (uint64_t)(sp->seq_len / rec->row_block);
		if (parts > TIER2_MAX_PARTS) {
			tier2_io_err(err, errsz, "tier2 record: more than %u parts at split %u",
			             TIER2_MAX_PARTS, i);
			return -1;
		}
	}
	*n_parts = (uint32_t)parts;
	return 0;
}

/* The checks of a record's sizes that encoder and decoder share: layer
 * sizes, splits (version 2), the chunk count of the stream. */
static int check_sizes(const struct tier2_record *rec, unsigned version, uint32_t *n_parts,
                       char *err, size_t errsz);

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

static int check_sizes(const struct tier2_record *rec, unsigned version, uint32_t *n_parts,
                       char *err, size_t errsz)
{
	uint32_t bad = 0;
	*n_parts = 0;
	uint64_t total = total_size(rec->layers, rec->n_layers, &bad);
	if (!total) {
		tier2_io_err(err, errsz,
		             "tier2 record: layer %u of %u has size %llu (empty, or the sizes pass "
		             "%llu bytes)",
		             bad, rec->n_layers, (unsigned long long)rec->layers[bad].size,
		             (unsigned long long)TIER2_MAX_ENTRY_BYTES);
		return -1;
	}
	if (version == 2 && check_splits(rec, n_parts, err, errsz) != 0)
		return -1;
	if (version != 2 && (rec->row_block || rec->n_split)) {
		tier2_io_err(err, errsz, "tier2 record: version 1 has no row block");
		return -1;
	}
	uint64_t stream = version == 2 ? tier2_stream_size(rec) : total;
	if (tier2_chunk_count(stream, rec->chunk_size) != rec->n_chunks) {
		tier2_io_err(err, errsz,
		             "tier2 record: %u chunks, but a stream of %llu bytes cut every %u "
		             "makes %llu",
		             rec->n_chunks, (unsigned long long)stream, rec->chunk_size,
		             (unsigned long long)tier2_chunk_count(stream, rec->chunk_size));
		return -1;
	}
	return 0;
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
	unsigned version = rec->version ? rec->version : 1u;
	uint32_t n_parts = 0;
	if (version > TIER2_RECORD_VERSION) {
		tier2_io_err(err, errsz, "tier2 record: version %u", version);
		return -1;
	}
	if (check_sizes(rec, version, &n_parts, err, errsz) != 0)
		return -1;
	size_t n = version == 2 ? tier2_record_size_v2(rec->salt_len, rec->n_tokens, rec->n_layers,
	                                               rec->n_chunks, rec->n_split, n_parts)
	                        : tier2_record_size(rec->salt_len, rec->n_tokens, rec->n_layers,
	                                            rec->n_chunks);
	unsigned char *b = malloc(n);
	if (!b) {
		tier2_io_err(err, errsz, "tier2 record: out of memory for %zu bytes", n);
		return -1;
	}
	unsigned char *p = b;
	memcpy(p, TIER2_RECORD_MAGIC, 4);
	le16(p + 4, (uint16_t)version);
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
	if (version == 2) {
		tier2_put_le32(p, rec->row_block);
		tier2_put_le32(p + 4, rec->n_split);
		p += 8;
		for (uint32_t i = 0; i < rec->n_split; i++, p += 16) {
			tier2_put_le32(p, rec->split[i].layer);
			tier2_put_le32(p + 4, rec->split[i].seq_len);
			tier2_put_le32(p + 8, rec->split[i].k_row);
			tier2_put_le32(p + 12, rec->split[i].v_row);
		}
		for (uint32_t i = 0; i < n_parts; i++, p += 8)
			tier2_put_le64(p, rec->part_xxh3[i]);
	}
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
	if (version < 1 || version > TIER2_RECORD_VERSION || flags != 0) {
		tier2_io_err(
		        err, errsz,
		        "tier2 record: version %u flags %#x (this reader knows versions 1..%u, "
		        "no flags)",
		        version, flags, TIER2_RECORD_VERSION);
		return -1;
	}
	uint64_t generation = tier2_get_le64(r.b + 8);
	r.off = REC_HEAD;
	uint32_t salt_len = 0, n_tokens = 0, n_layers = 0, chunk_size = 0, n_chunks = 0;
	uint32_t row_block = 0, n_split = 0;
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
	size_t split_off = 0, parts_off = 0;
	uint64_t n_parts_max = 0; /* what the bytes left can hold; checked below */
	if (version == 2) {
		if (u32_at(&r, "row_block", TIER2_ROW_BLOCK_MAX, 16, &row_block) != 0 ||
		    u32_at(&r, "the split count", n_layers, 0, &n_split) != 0 ||
		    need(&r, (uint64_t)n_split * 16u + 8u, "the split layers and the record sum") !=
		            0)
			return -1;
		split_off = r.off;
		r.off += (size_t)n_split * 16u;
		parts_off = r.off;
		n_parts_max = (r.len - r.off - 8) / 8;
		if (n_parts_max > TIER2_MAX_PARTS)
			n_parts_max = TIER2_MAX_PARTS;
	}
	/* the parts' count is known only from the split layers: their sums are
	 * the bytes between here and the record sum, checked once decoded */
	size_t n_part_bytes = r.len - r.off - 8;
	if (version == 1 && n_part_bytes != 0) {
		tier2_io_err(err, errsz,
		             "tier2 record: %zu trailing bytes after the record sum at offset %zu",
		             n_part_bytes, r.off + 8);
		return -1;
	}
	if (n_part_bytes % 8 != 0 || n_part_bytes / 8 > n_parts_max) {
		tier2_io_err(err, errsz,
		             "tier2 record: %zu bytes of part sums at offset %zu (a multiple of 8, "
		             "at most %u parts)",
		             n_part_bytes, r.off, TIER2_MAX_PARTS);
		return -1;
	}
	uint32_t n_parts = (uint32_t)(n_part_bytes / 8);
	r.off += n_part_bytes;
	uint64_t sum = XXH3_64bits(r.b, r.off);
	if (tier2_get_le64(r.b + r.off) != sum) {
		tier2_io_err(err, errsz, "tier2 record: record sum %016llx, its bytes give %016llx",
		             (unsigned long long)tier2_get_le64(r.b + r.off),
		             (unsigned long long)sum);
		return -1;
	}
	/* one allocation: layers, chunk and part sums, splits, tokens, salt
	 * (8-byte fields first) */
	size_t mem_len = (size_t)n_layers * sizeof(struct tier2_layer) + (size_t)n_chunks * 8u +
	                 (size_t)n_parts * 8u + (size_t)n_split * sizeof(struct tier2_split) +
	                 (size_t)n_tokens * 4u + salt_len;
	unsigned char *mem = calloc(1, mem_len); /* padding too: a decoded record compares whole */
	if (!mem) {
		tier2_io_err(err, errsz, "tier2 record: out of memory for %zu bytes", mem_len);
		return -2;
	}
	struct tier2_layer *layers = (struct tier2_layer *)(void *)mem;
	uint64_t *chunks = (uint64_t *)(void *)(mem + (size_t)n_layers * sizeof(*layers));
	uint64_t *parts = chunks + n_chunks;
	struct tier2_split *split = (struct tier2_split *)(void *)(parts + n_parts);
	uint32_t *tokens = (uint32_t *)(void *)(split + n_split);
	uint8_t *salt = (uint8_t *)(tokens + n_tokens);
	for (uint32_t i = 0; i < n_layers; i++) {
		layers[i].size = tier2_get_le64(r.b + lay_off + (size_t)i * 16u);
		layers[i].xxh3 = tier2_get_le64(r.b + lay_off + (size_t)i * 16u + 8);
		layers[i].tag = 0;
	}
	for (uint32_t i = 0; i < n_chunks; i++)
		chunks[i] = tier2_get_le64(r.b + chk_off + (size_t)i * 8u);
	for (uint32_t i = 0; i < n_parts; i++)
		parts[i] = tier2_get_le64(r.b + parts_off + (size_t)i * 8u);
	for (uint32_t i = 0; i < n_split; i++) {
		const unsigned char *q = r.b + split_off + (size_t)i * 16u;
		split[i] = (struct tier2_split){tier2_get_le32(q), tier2_get_le32(q + 4),
		                                tier2_get_le32(q + 8), tier2_get_le32(q + 12)};
	}
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
	out->version = (uint16_t)version;
	out->row_block = row_block;
	out->n_split = n_split;
	out->split = split;
	out->part_xxh3 = parts;
	out->mem = mem;
	uint32_t want_parts = 0;
	int bad = check_sizes(out, version, &want_parts, err, errsz) != 0;
	if (!bad && want_parts != n_parts) {
		tier2_io_err(err, errsz, "tier2 record: %u part sums, the split layers make %u",
		             n_parts, want_parts);
		bad = 1;
	}
	if (bad) {
		tier2_record_free(out);
		return -1;
	}
	for (uint32_t i = 0; i < n_split; i++)
		layers[split[i].layer].tag = 2;
	return 0;
}

void tier2_record_free(struct tier2_record *rec)
{
	if (!rec)
		return;
	free(rec->mem);
	memset(rec, 0, sizeof(*rec));
}
