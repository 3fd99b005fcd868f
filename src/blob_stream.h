/* blob_stream: the checks of blob_check_sum() for a blob that arrives in
 * pieces, each piece scanned and hashed as it lands (while it is in cache).
 *
 * The caller owns one contiguous buffer of the blob's final length and fills
 * it front to back; after each piece it calls blob_stream_feed() with how much
 * is in place. Or, scattered (blob_stream_begin_parts), the blob's two float
 * vectors land in two arrays of the caller's and its header words in the
 * stream itself; blob_stream_dest() says where each byte goes. The float ranges are taken from the
 * model's layout for the layer; blob_stream_end() then parses the header (tag, counts, seq_len,
 * trailing bytes) and gives exactly what blob_check_sum() would give for the
 * same bytes: the same class, the same message, the same checksum. */
#ifndef K3_BLOB_STREAM_H
#define K3_BLOB_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "blob.h"

struct k3cache_model;
struct checksum_state;

struct blob_stream {
	const unsigned char *base; /* contiguous */
	unsigned char *part[2];    /* scattered: where each vector's floats go */
	unsigned char head[16];    /* scattered: the header words, then the second count */
	int scattered;
	size_t len;
	const struct k3cache_model *model;
	uint32_t layer, prefix_len;
	size_t fed;         /* bytes [0, fed) seen */
	size_t data_off[2]; /* where each vector's floats start, per the model */
	size_t data_len[2]; /* and their byte length */
	size_t scanned[2];  /* bytes of each vector's floats scanned */
	int nonfinite;      /* a NaN or an Inf was seen */
	/* read once (blob_stream_begin_once): the words a parse reads, kept as
	 * they pass, and the first non-finite float (its vector, index, bits) */
	int once;
	unsigned char kept[16], c1[4];
	size_t c1_at; /* where the head says the second count is; SIZE_MAX: not yet known */
	int bad_vec;
	size_t bad_index;
	uint32_t bad_bits;
	unsigned char pend[4]; /* pieces: a float begun in the last piece */
	size_t pend_n;
	struct checksum_state *cs;
};

/* Starts the checks of a blob for `layer` of `model` at prefix length
 * `prefix_len` that will occupy base[0, len). Returns 0, or -1 when out of
 * memory. */
int blob_stream_begin(struct blob_stream *s, const void *base, size_t len,
                      const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len);
/* blob_stream_begin() for bytes that may be gone once fed (a window that
 * moves on): each byte of base[0, len) is read only while it is fed, and
 * blob_stream_end() gives its answer from what it kept then. The prefix
 * length must be known (not BLOB_PREFIX_ANY): -1. */
int blob_stream_begin_once(struct blob_stream *s, const void *base, size_t len,
                           const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len);
/* Starts the checks of a blob for `layer` of `model` at `prefix_len` whose
 * floats go to a (conv or k) and b (recurrent or v), which must hold the
 * model's counts. The blob's length is the model's
 * (model_layer_blob_size()); the header words are kept here. Returns 0, or
 * -1 when out of memory. */
int blob_stream_begin_parts(struct blob_stream *s, void *a, void *b,
                            const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len);
/* Where the blob's byte `off` goes: the address, and in *run how many bytes
 * from there are contiguous (0 and NULL past the end). */
unsigned char *blob_stream_dest(struct blob_stream *s, size_t off, size_t *run);
/* base[0, upto) is in place (upto never decreases). */
void blob_stream_feed(struct blob_stream *s, size_t upto);
/* Read once, the blob's bytes in pieces anywhere (base unused): the next n
 * bytes are data[0, n), read only during the call. */
void blob_stream_feed_piece(struct blob_stream *s, const void *data, size_t n);
/* Every byte must have been fed (scattered: else TRUNCATED). Returns the class (BLOB_OK with *xxh3
 * set) and frees the state. */
enum blob_class blob_stream_end(struct blob_stream *s, uint64_t *xxh3, struct blob_error *err);
/* Frees the state of a stream that will not be ended. */
void blob_stream_abandon(struct blob_stream *s);

#endif
