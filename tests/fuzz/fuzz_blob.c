/* libFuzzer target: the blob parser and validator on untrusted bytes.
 * The first input byte picks the layer and the prefix length; the rest is the
 * blob. Properties checked beyond "no crash, no sanitizer report":
 *  - a blob that parses re-encodes to exactly its input;
 *  - every rejection has a class and a non-empty message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "model.h"

static struct model_spec *fuzz_model(void)
{
	static struct model_spec *m;
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
	return 0;
}
