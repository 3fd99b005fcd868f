#include "blob.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "checksum.h"
#include "model.h"

static const char *const class_names[] = {
        [BLOB_OK] = "ok",
        [BLOB_ERR_EMPTY] = "empty",
        [BLOB_ERR_TAG] = "tag",
        [BLOB_ERR_TRUNCATED] = "truncated",
        [BLOB_ERR_TRAILING] = "trailing",
        [BLOB_ERR_SLOT] = "slot",
        [BLOB_ERR_SHAPE] = "shape",
        [BLOB_ERR_SEQ_LEN] = "seq_len",
        [BLOB_ERR_NONFINITE] = "nonfinite",
};

const char *blob_class_name(enum blob_class cls)
{
	if ((unsigned)cls < sizeof(class_names) / sizeof(class_names[0]))
		return class_names[cls];
	return "unknown";
}

const char *blob_tag_name(unsigned tag)
{
	switch (tag) {
	case BLOB_TAG_KDA:
		return "KDA";
	case BLOB_TAG_MLA:
		return "MLA";
	default:
		return "unknown";
	}
}

__attribute__((format(printf, 3, 4))) static enum blob_class
fail(struct blob_error *err, enum blob_class cls, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		err->cls = cls;
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return cls;
}

static uint32_t load_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

/* Where blob_parse() reads the words of a blob: the bytes whole (base), or
 * only the words a parse reads, kept by a caller that saw each byte once
 * (blob_parse_sparse). */
struct words {
	const unsigned char *base;
	const unsigned char *head; /* sparse: bytes [0, head_len) */
	size_t head_len;
	const unsigned char *c1; /* sparse: the 4 bytes at c1_pos */
	size_t c1_pos;
};

/* The word at pos (pos + 4 <= the blob's length); 0 for a sparse blob that
 * did not keep it (never for a parse of what blob_stream kept). */
static uint32_t word_at(const struct words *w, size_t pos)
{
	if (w->base)
		return load_u32(w->base + pos);
	if (pos + 4 <= w->head_len)
		return load_u32(w->head + pos);
	if (w->c1 && pos == w->c1_pos)
		return load_u32(w->c1);
	return 0;
}

/* Takes one f32vec from [*pos, len). `what` names it in messages. */
static enum blob_class take_vec(const struct words *w, size_t len, size_t *pos, const char *tag,
                                const char *what, struct blob_f32vec *out, struct blob_error *err)
{
	size_t left = len - *pos;
	if (left < 4)
		return fail(err, BLOB_ERR_TRUNCATED,
		            "%s %s count truncated: %zu of 4 bytes present", tag, what, left);
	uint32_t count = word_at(w, *pos);
	uint64_t need = (uint64_t)count * 4u; /* cannot wrap: count < 2^32 */
	left -= 4;
	if (need > left)
		return fail(err, BLOB_ERR_TRUNCATED,
		            "%s %s says %" PRIu32 " floats (%" PRIu64
		            " bytes), only %zu bytes follow",
		            tag, what, count, need, left);
	out->data = w->base ? w->base + *pos + 4 : NULL;
	out->count = count;
	*pos += 4 + (size_t)need;
	return BLOB_OK;
}

static enum blob_class parse_words(const struct words *w, unsigned tag, size_t len,
                                   struct blob_view *out, struct blob_error *err)
{
	if (len == 0)
		return fail(err, BLOB_ERR_EMPTY, "empty blob: zero bytes");
	struct blob_view v = {.tag = tag};
	size_t pos = 1;
	enum blob_class rc;
	switch (tag) {
	case BLOB_TAG_KDA:
		if ((rc = take_vec(w, len, &pos, "KDA", "conv", &v.v0, err)) != BLOB_OK)
			return rc;
		if ((rc = take_vec(w, len, &pos, "KDA", "recurrent", &v.v1, err)) != BLOB_OK)
			return rc;
		break;
	case BLOB_TAG_MLA:
		if (len - pos < 4)
			return fail(err, BLOB_ERR_TRUNCATED,
			            "MLA seq_len truncated: %zu of 4 bytes present", len - pos);
		v.seq_len = word_at(w, pos);
		pos += 4;
		if ((rc = take_vec(w, len, &pos, "MLA", "k", &v.v0, err)) != BLOB_OK)
			return rc;
		if ((rc = take_vec(w, len, &pos, "MLA", "v", &v.v1, err)) != BLOB_OK)
			return rc;
		break;
	default:
		return fail(err, BLOB_ERR_TAG, "unknown tag %u: expected 1 (KDA) or 2 (MLA)", tag);
	}
	if (pos != len)
		return fail(err, BLOB_ERR_TRAILING,
		            "%s blob has %zu trailing bytes after its last vector",
		            blob_tag_name(v.tag), len - pos);
	if (out)
		*out = v;
	return BLOB_OK;
}

enum blob_class blob_parse(const void *bytes, size_t len, struct blob_view *out,
                           struct blob_error *err)
{
	struct words w = {.base = bytes};
	return parse_words(&w, len ? ((const unsigned char *)bytes)[0] : 0, len, out, err);
}

size_t blob_second_count_at(const unsigned char *head, size_t head_len)
{
	size_t c0 = head_len >= 1 && head[0] == BLOB_TAG_MLA ? 5 : 1;
	if (head_len < c0 + 4)
		return SIZE_MAX;
	uint64_t at = c0 + 4 + (uint64_t)load_u32(head + c0) * 4u;
	return at > SIZE_MAX ? SIZE_MAX : (size_t)at;
}

enum blob_class blob_parse_sparse(const unsigned char *head, size_t head_len,
                                  const unsigned char c1[4], size_t len, struct blob_view *out,
                                  struct blob_error *err)
{
	struct words w = {.head = head,
	                  .head_len = head_len,
	                  .c1 = c1,
	                  .c1_pos = blob_second_count_at(head, head_len)};
	return parse_words(&w, len ? head[0] : 0, len, out, err);
}

size_t blob_encoded_size(const struct blob_view *view)
{
	size_t head = view->tag == BLOB_TAG_MLA ? 5 : 1;
	return head + 8 + ((size_t)view->v0.count + view->v1.count) * 4u;
}

static unsigned char *put_vec(unsigned char *p, const struct blob_f32vec *vec)
{
	store_u32(p, vec->count);
	if (vec->count)
		memcpy(p + 4, vec->data, (size_t)vec->count * 4u);
	return p + 4 + (size_t)vec->count * 4u;
}

size_t blob_encode(const struct blob_view *view, void *out)
{
	unsigned char *p = out;
	*p++ = (unsigned char)view->tag;
	if (view->tag == BLOB_TAG_MLA) {
		store_u32(p, view->seq_len);
		p += 4;
	}
	p = put_vec(p, &view->v0);
	p = put_vec(p, &view->v1);
	return (size_t)(p - (unsigned char *)out);
}

/* A float is non-finite when all its exponent bits are set. The inner loop is
 * branch-free over blocks so that the compiler vectorises it; only a block
 * with a hit is searched again for the index. */
#define EXP_MASK   0x7f800000u
#define SCAN_BLOCK 4096u

/* Counts the non-finite floats of exactly SCAN_BLOCK words. The fixed trip
 * count lets the compiler vectorise at -O2; on x86-64 an AVX2 clone is picked
 * at load time where the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SCAN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SCAN_CLONES
#endif

SCAN_CLONES static uint32_t count_nonfinite_block(const unsigned char *p)
{
	uint32_t hits = 0;
	for (size_t i = 0; i < SCAN_BLOCK; i++) {
		uint32_t w;
		memcpy(&w, p + i * 4u, 4);
		hits += (w & EXP_MASK) == EXP_MASK;
	}
	return hits;
}

static uint32_t count_nonfinite(const unsigned char *p, size_t n)
{
	if (n == SCAN_BLOCK)
		return count_nonfinite_block(p);
	uint32_t hits = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t w;
		memcpy(&w, p + i * 4u, 4);
		hits += (w & EXP_MASK) == EXP_MASK;
	}
	return hits;
}

int64_t blob_first_nonfinite(const struct blob_f32vec *vec)
{
	size_t n = vec->count;
	for (size_t start = 0; start < n; start += SCAN_BLOCK) {
		size_t m = n - start < SCAN_BLOCK ? n - start : SCAN_BLOCK;
		const unsigned char *p = vec->data + start * 4u;
		if (!count_nonfinite(p, m))
			continue;
		for (size_t i = 0; i < m; i++) {
			uint32_t w;
			memcpy(&w, p + i * 4u, 4);
			if ((w & EXP_MASK) == EXP_MASK)
				return (int64_t)(start + i);
		}
	}
	return -1;
}

static enum blob_class check_finite(const struct blob_f32vec *vec, uint32_t layer, const char *tag,
                                    const char *what, struct blob_error *err)
{
	int64_t at = blob_first_nonfinite(vec);
	if (at < 0 || !vec->data)
		return BLOB_OK;
	float f;
	memcpy(&f, vec->data + (size_t)at * 4u, 4);
	return fail(err, BLOB_ERR_NONFINITE, "layer %" PRIu32 ": %s %s[%" PRId64 "] is %s", layer,
	            tag, what, at, f != f ? "NaN" : (f > 0 ? "+Inf" : "-Inf"));
}

/* Slot, shape and position: everything but the finite scan. */
enum blob_class blob_validate_shape(const struct blob_view *view, const struct k3cache_model *model,
                                    uint32_t layer, uint32_t prefix_len, struct blob_error *err)
{
	if (layer >= model->n_layers)
		return fail(err, BLOB_ERR_SLOT,
		            "layer %" PRIu32 ": model %s has %" PRIu32 " layers (0..%" PRIu32 ")",
		            layer, model->name, model->n_layers, model->n_layers - 1);
	const struct model_layer *ml = &model->layers[layer];
	if ((unsigned)ml->mixer != (unsigned)view->tag)
		return fail(err, BLOB_ERR_SLOT, "layer %" PRIu32 ": model says %s, blob is %s",
		            layer, model_mixer_name(ml->mixer), blob_tag_name(view->tag));
	if (view->tag == BLOB_TAG_KDA) {
		if (view->v0.count != ml->conv_len)
			return fail(err, BLOB_ERR_SHAPE,
			            "layer %" PRIu32 ": KDA conv has %" PRIu32
			            " floats, model says %" PRIu32,
			            layer, view->v0.count, ml->conv_len);
		if (view->v1.count != ml->recurrent_len)
			return fail(err, BLOB_ERR_SHAPE,
			            "layer %" PRIu32 ": KDA recurrent has %" PRIu32
			            " floats, model says %" PRIu32,
			            layer, view->v1.count, ml->recurrent_len);
		return BLOB_OK;
	}
	uint64_t want_k = (uint64_t)view->seq_len * ml->k_row;
	uint64_t want_v = (uint64_t)view->seq_len * ml->v_row;
	if (view->v0.count != want_k)
		return fail(err, BLOB_ERR_SHAPE,
		            "layer %" PRIu32 ": MLA k has %" PRIu32 " floats, expected %" PRIu32
		            " tokens x %" PRIu32,
		            layer, view->v0.count, view->seq_len, ml->k_row);
	if (view->v1.count != want_v)
		return fail(err, BLOB_ERR_SHAPE,
		            "layer %" PRIu32 ": MLA v has %" PRIu32 " floats, expected %" PRIu32
		            " tokens x %" PRIu32,
		            layer, view->v1.count, view->seq_len, ml->v_row);
	if (prefix_len != BLOB_PREFIX_ANY && view->seq_len != prefix_len)
		return fail(err, BLOB_ERR_SEQ_LEN,
		            "layer %" PRIu32 ": MLA seq_len is %" PRIu32
		            ", the entry's prefix is %" PRIu32 " tokens",
		            layer, view->seq_len, prefix_len);
	return BLOB_OK;
}

static const char *vec_name(const struct blob_view *view, int second)
{
	if (view->tag == BLOB_TAG_KDA)
		return second ? "recurrent" : "conv";
	return second ? "v" : "k";
}

enum blob_class blob_validate(const struct blob_view *view, const struct k3cache_model *model,
                              uint32_t layer, uint32_t prefix_len, struct blob_error *err)
{
	enum blob_class rc = blob_validate_shape(view, model, layer, prefix_len, err);
	if (rc != BLOB_OK)
		return rc;
	const char *tag = blob_tag_name(view->tag);
	if ((rc = check_finite(&view->v0, layer, tag, vec_name(view, 0), err)) != BLOB_OK)
		return rc;
	return check_finite(&view->v1, layer, tag, vec_name(view, 1), err);
}

/* Scans one vector for non-finite floats in cache-sized blocks, feeding each
 * block to the checksum while it is still in cache. */
#define SUM_BLOCK ((size_t)SCAN_BLOCK * 16u)

static enum blob_class scan_and_sum(const struct blob_f32vec *vec, uint32_t layer, const char *tag,
                                    const char *what, struct checksum_run *cs,
                                    struct blob_error *err)
{
	for (size_t start = 0; start < vec->count; start += SUM_BLOCK) {
		size_t m = vec->count - start < SUM_BLOCK ? vec->count - start : SUM_BLOCK;
		struct blob_f32vec part = {vec->data + start * 4u, (uint32_t)m};
		int64_t at = blob_first_nonfinite(&part);
		if (at >= 0) {
			struct blob_f32vec one = {vec->data + (start + (size_t)at) * 4u, 1};
			enum blob_class rc = check_finite(&one, layer, tag, what, err);
			/* name the index within the whole vector */
			if (err)
				fail(err, rc, "layer %" PRIu32 ": %s %s[%zu] is %s", layer, tag,
				     what, start + (size_t)at,
				     strstr(err->message, "NaN")    ? "NaN"
				     : strstr(err->message, "+Inf") ? "+Inf"
				                                    : "-Inf");
			return rc;
		}
		checksum_run_update(cs, part.data, m * 4u);
	}
	return BLOB_OK;
}

enum blob_class blob_check_sum(const void *bytes, size_t len, const struct k3cache_model *model,
                               uint32_t layer, uint32_t prefix_len, uint64_t *xxh3,
                               struct blob_error *err)
{
	struct blob_view v = {0};
	enum blob_class rc = blob_check_shape(bytes, len, model, layer, prefix_len, &v, err);
	if (rc != BLOB_OK)
		return rc;
	const unsigned char *b = bytes;
	struct checksum_run cs;
	checksum_run_begin(&cs, layer);
	const char *tag = blob_tag_name(v.tag);
	/* in byte order: header and count, v0, count, v1 */
	checksum_run_update(&cs, b, (size_t)(v.v0.data - b));
	rc = scan_and_sum(&v.v0, layer, tag, vec_name(&v, 0), &cs, err);
	if (rc == BLOB_OK) {
		checksum_run_update(&cs, v.v0.data + (size_t)v.v0.count * 4u, 4);
		rc = scan_and_sum(&v.v1, layer, tag, vec_name(&v, 1), &cs, err);
	}
	uint64_t sum = checksum_run_end(&cs);
	if (rc == BLOB_OK && xxh3)
		*xxh3 = sum;
	return rc;
}

enum blob_class blob_check(const void *bytes, size_t len, const struct k3cache_model *model,
                           uint32_t layer, uint32_t prefix_len, struct blob_error *err)
{
	struct blob_view v = {0};
	enum blob_class rc = blob_check_shape(bytes, len, model, layer, prefix_len, &v, err);
	if (rc != BLOB_OK)
		return rc;
	const char *tag = blob_tag_name(v.tag);
	if ((rc = check_finite(&v.v0, layer, tag, vec_name(&v, 0), err)) != BLOB_OK)
		return rc;
	return check_finite(&v.v1, layer, tag, vec_name(&v, 1), err);
}

enum blob_class blob_check_shape(const void *bytes, size_t len, const struct k3cache_model *model,
                                 uint32_t layer, uint32_t prefix_len, struct blob_view *out,
                                 struct blob_error *err)
{
	struct blob_view v = {0};
	return blob_name_layer(blob_parse(bytes, len, &v, err), &v, model, layer, prefix_len, out,
	                       err);
}

enum blob_class blob_name_layer(enum blob_class rc, const struct blob_view *parsed,
                                const struct k3cache_model *model, uint32_t layer,
                                uint32_t prefix_len, struct blob_view *out, struct blob_error *err)
{
	struct blob_view v = *parsed;
	if (rc != BLOB_OK) {
		if (err) {
			char tmp[BLOB_MESSAGE_MAX];
			memcpy(tmp, err->message, sizeof(tmp));
			snprintf(err->message, sizeof(err->message), "layer %" PRIu32 ": %.*s",
			         layer, (int)sizeof(tmp) - 24, tmp);
		}
		return rc;
	}
	*out = v;
	return blob_validate_shape(&v, model, layer, prefix_len, err);
}
