/* libFuzzer target: the blob parser and validator on untrusted bytes.
 * The first input byte picks the layer and the prefix length; the rest is the
 * blob. Properties checked beyond "no crash, no sanitizer report":
 *  - a blob that parses re-encodes to exactly its input;
 *  - every rejection has a class and a non-empty message;
 *  - blob_stream, fed the blob in pieces (sizes drawn from the selector),
 *    gives exactly what blob_check_sum gives for the whole;
 *  - read once (blob_stream_begin_once), with every byte behind the
 *    feed scribbled over, it gives the same answer again;
 *  - scattered into two arrays (blob_stream_begin_parts, the client's
 *    restore into component arrays), a blob of the model's length is
 *    accepted exactly when the whole check accepts it, with the same
 *    checksum and the floats in place; a refusal has a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "blob_stream.h"
#include "model.h"

static struct k3cache_model *fuzz_model(void)
{
	static struct k3cache_model *m;
	if (!m) {
		const struct model_layer layers[] = {
		        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 16},
		        {.mixer = MODEL_MIXER_KDA, .conv_len = 1, .recurrent_len = 2},
		        {.mixer = MODEL_MIXER_MLA, .k_row = 6, .v_row = 4},
		        {.mixer = MODEL_MIXER_MLA, .k_row = 1, .v_row = 1},
		};
		char err[MODEL_ERROR_MAX];
		m = model_new("fuzz", "r", "l", layers, 4, err);
		if (!m)
			abort();
	}
	return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t sel = size ? data[0] : 0;
	const uint8_t *blob = size ? data + 1 : data;
	size_t len = size ? size - 1 : 0;
	uint32_t layer = sel & 7u; /* 4..7 are out of range: the slot check */
	uint32_t prefix = (sel >> 3) == 31 ? BLOB_PREFIX_ANY : (uint32_t)(sel >> 3);

	struct blob_view v;
	struct blob_error err = {0};
	enum blob_class rc = blob_parse(blob, len, &v, &err);
	if (rc == BLOB_OK) {
		size_t n = blob_encoded_size(&v);
		if (n != len)
			abort();
		uint8_t *out = malloc(n ? n : 1);
		if (!out || blob_encode(&v, out) != n || memcmp(out, blob, n) != 0)
			abort();
		free(out);
		rc = blob_validate(&v, fuzz_model(), layer, prefix, &err);
	}
	if (rc != BLOB_OK && (err.cls != rc || err.message[0] == '\0'))
		abort();

	/* the piecewise check agrees with the whole one */
	struct blob_error whole_err = {0}, stream_err = {0};
	uint64_t whole_sum = 0, stream_sum = 0;
	enum blob_class whole =
	        blob_check_sum(blob, len, fuzz_model(), layer, prefix, &whole_sum, &whole_err);
	uint8_t *buf = malloc(len ? len : 1);
	struct blob_stream bs;
	if (!buf || blob_stream_begin(&bs, buf, len, fuzz_model(), layer, prefix) != 0)
		abort();
	memset(buf, 0xff, len);
	size_t piece = 1u + (sel % 13u);
	for (size_t off = 0; off < len;) {
		size_t n = len - off < piece ? len - off : piece;
		memcpy(buf + off, blob + off, n);
		off += n;
		blob_stream_feed(&bs, off);
		piece = piece * 3u % 29u + 1u;
	}
	enum blob_class streamed = blob_stream_end(&bs, &stream_sum, &stream_err);
	if (streamed != whole || (whole == BLOB_OK && stream_sum != whole_sum) ||
	    (whole != BLOB_OK && strcmp(stream_err.message, whole_err.message) != 0))
		abort();

	/* read once (a moving window): every byte more than 3 behind what was
	 * fed is scribbled over, and the answer is still the same (the prefix
	 * must be known: the store's always is) */
	if (prefix == BLOB_PREFIX_ANY) {
		free(buf);
		buf = NULL;
	} else if (blob_stream_begin_once(&bs, buf, len, fuzz_model(), layer, prefix) != 0) {
		abort();
	}
	if (buf)
		memset(buf, 0xff, len);
	piece = 1u + (sel % 11u);
	for (size_t off = 0; buf && off < len;) {
		size_t n = len - off < piece ? len - off : piece;
		memcpy(buf + off, blob + off, n);
		off += n;
		blob_stream_feed(&bs, off);
		if (off > 3)
			memset(buf, 0xaa, off - 3);
		piece = piece * 5u % 31u + 1u;
	}
	if (buf) {
		streamed = blob_stream_end(&bs, &stream_sum, &stream_err);
		if (streamed != whole || (whole == BLOB_OK && stream_sum != whole_sum) ||
		    (whole != BLOB_OK && strcmp(stream_err.message, whole_err.message) != 0))
			abort();
		free(buf);
	}

	if (layer >= 4 || prefix == BLOB_PREFIX_ANY ||
	    len != model_layer_blob_size(&fuzz_model()->layers[layer], prefix))
		return 0;
	const struct model_layer *l = &fuzz_model()->layers[layer];
	uint64_t counts[2];
	model_layer_floats(l, prefix, counts);
	size_t n0 = (size_t)counts[0], n1 = (size_t)counts[1];
	float *a = malloc(n0 * 4 + 1), *b = malloc(n1 * 4 + 1);
	if (!a || !b || blob_stream_begin_parts(&bs, a, b, fuzz_model(), layer, prefix) != 0)
		abort();
	piece = 1u + (sel % 7u);
	for (size_t off = 0; off < len;) {
		size_t run;
		unsigned char *dst = blob_stream_dest(&bs, off, &run);
		size_t n = run < piece ? run : piece;
		if (!dst || n == 0 || n > len - off)
			abort();
		memcpy(dst, blob + off, n);
		off += n;
		blob_stream_feed(&bs, off);
		piece = piece * 5u % 23u + 1u;
	}
	struct blob_error parts_err = {0};
	uint64_t parts_sum = 0;
	enum blob_class parts = blob_stream_end(&bs, &parts_sum, &parts_err);
	if ((parts == BLOB_OK) != (whole == BLOB_OK) ||
	    (parts != BLOB_OK && (parts_err.cls != parts || parts_err.message[0] == '\0')))
		abort();
	if (parts == BLOB_OK) {
		size_t head = l->mixer == MODEL_MIXER_KDA ? 5 : 9;
		if (parts_sum != whole_sum || memcmp(a, blob + head, n0 * 4) != 0 ||
		    memcmp(b, blob + head + n0 * 4 + 4, n1 * 4) != 0)
			abort();
	}
	free(a);
	free(b);
	return 0;
}
