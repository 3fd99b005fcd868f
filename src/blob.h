/* blob: the LayerCache blob codec (contract: DESIGN.md "LayerCache blob").
 *
 *   KDA: u8 tag=1 | f32vec conv | f32vec recurrent
 *   MLA: u8 tag=2 | u32 seq_len | f32vec k | f32vec v
 *   f32vec: u32 count | count x f32        (all little-endian)
 *
 * blob_parse() turns bytes into a view that points into the input (no copy,
 * no allocation). Every count is checked against the bytes that remain, in
 * 64-bit arithmetic, before anything is indexed by it. blob_validate() checks
 * a view against one layer of a model spec and a prefix length. Each failure
 * has its own class (DESIGN.md) and a message naming the layer, the field and
 * the numbers. */
#ifndef K3_BLOB_H
#define K3_BLOB_H

#include <stddef.h>
#include <stdint.h>

struct k3cache_model;

enum blob_tag {
	BLOB_TAG_KDA = 1,
	BLOB_TAG_MLA = 2,
};

/* Error classes, one per defect kind. The words are a contract. */
enum blob_class {
	BLOB_OK = 0,
	BLOB_ERR_EMPTY,     /* zero bytes */
	BLOB_ERR_TAG,       /* tag is not 1 (KDA) or 2 (MLA) */
	BLOB_ERR_TRUNCATED, /* a count, seq_len or body cut short */
	BLOB_ERR_TRAILING,  /* bytes after the last vector */
	BLOB_ERR_SLOT,      /* tag differs from the model's mixer, or no such layer */
	BLOB_ERR_SHAPE,     /* counts differ from the model's */
	BLOB_ERR_SEQ_LEN,   /* MLA seq_len differs from the prefix length */
	BLOB_ERR_NONFINITE, /* a NaN or an Inf */
};

#define BLOB_MESSAGE_MAX 256

struct blob_error {
	enum blob_class cls;
	char message[BLOB_MESSAGE_MAX];
};

/* One length-prefixed f32 vector inside the blob. `data` points at
 * count * 4 bytes of little-endian floats; it is not necessarily aligned. */
struct blob_f32vec {
	const unsigned char *data;
	uint32_t count;
};

/* A parsed blob. KDA: v0 = conv, v1 = recurrent. MLA: v0 = k, v1 = v. */
struct blob_view {
	enum blob_tag tag;
	uint32_t seq_len; /* MLA only; 0 for KDA */
	struct blob_f32vec v0;
	struct blob_f32vec v1;
};

/* The prefix length to pass to blob_validate() when it is not known: skips the
 * MLA seq_len == prefix check. */
#define BLOB_PREFIX_ANY UINT32_MAX

/* Returns the class word ("empty", "tag", ...), or "ok". */
const char *blob_class_name(enum blob_class cls);

/* Returns "KDA", "MLA" or "unknown". */
const char *blob_tag_name(unsigned tag);

/* Parses `len` bytes. On success fills *out and returns BLOB_OK; otherwise
 * returns the class and, when err is not NULL, fills it. */
enum blob_class blob_parse(const void *bytes, size_t len, struct blob_view *out,
                           struct blob_error *err);

/* blob_parse() of a blob whose bytes were seen once and are gone: from the
 * words a parse reads, kept as they passed. head holds bytes [0, head_len)
 * (at least the tag, seq_len and first count: 9 bytes, or all of a shorter
 * blob); c1 the 4 bytes at blob_second_count_at(head) when they lie inside
 * the blob. The view's data pointers are NULL. Same class and message as
 * blob_parse() of the whole bytes. */
enum blob_class blob_parse_sparse(const unsigned char *head, size_t head_len,
                                  const unsigned char c1[4], size_t len, struct blob_view *out,
                                  struct blob_error *err);

/* Where the second vector's count lies, as the head's first count says;
 * SIZE_MAX when the head is too short to say. */
size_t blob_second_count_at(const unsigned char *head, size_t head_len);

/* Size in bytes of the encoding of a view. */
size_t blob_encoded_size(const struct blob_view *view);

/* Writes the encoding of a view to out, which must hold blob_encoded_size()
 * bytes. encode(parse(b)) == b for every well-formed b. Returns bytes written. */
size_t blob_encode(const struct blob_view *view, void *out);

/* Checks a parsed blob as layer `layer` of `model`, for an entry of
 * `prefix_len` tokens (or BLOB_PREFIX_ANY): slot, then shape, then seq_len,
 * then finiteness. Returns BLOB_OK or the class, with a message in err. */
enum blob_class blob_validate(const struct blob_view *view, const struct k3cache_model *model,
                              uint32_t layer, uint32_t prefix_len, struct blob_error *err);

/* blob_validate() without the finiteness scan: reads the view's tag,
 * seq_len and counts, never its floats. */
enum blob_class blob_validate_shape(const struct blob_view *view, const struct k3cache_model *model,
                                    uint32_t layer, uint32_t prefix_len, struct blob_error *err);

/* Parses and validates in one call. */
enum blob_class blob_check(const void *bytes, size_t len, const struct k3cache_model *model,
                           uint32_t layer, uint32_t prefix_len, struct blob_error *err);

/* Parses and checks slot, shape and seq_len, but not finiteness; fills *out. */
enum blob_class blob_check_shape(const void *bytes, size_t len, const struct k3cache_model *model,
                                 uint32_t layer, uint32_t prefix_len, struct blob_view *out,
                                 struct blob_error *err);

/* What blob_check_shape() does after its parse: given the parse's result
 * rc and view, prefixes a parse error with the layer, or checks slot, shape
 * and seq_len. */
enum blob_class blob_name_layer(enum blob_class rc, const struct blob_view *parsed,
                                const struct k3cache_model *model, uint32_t layer,
                                uint32_t prefix_len, struct blob_view *out, struct blob_error *err);

/* blob_check() and checksum_blob() in one pass over the bytes: each block is
 * scanned for non-finite floats and hashed while it is in cache. On success
 * *xxh3 is the blob's checksum seeded with `layer`. */
enum blob_class blob_check_sum(const void *bytes, size_t len, const struct k3cache_model *model,
                               uint32_t layer, uint32_t prefix_len, uint64_t *xxh3,
                               struct blob_error *err);

/* Index of the first non-finite float of a vector, or -1 when all are finite. */
int64_t blob_first_nonfinite(const struct blob_f32vec *vec);

#endif
