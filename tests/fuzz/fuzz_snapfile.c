/* fuzz_snapfile: the snapshot file parser (src/snapfile.c, k3cachectl
 * import) on arbitrary bytes. Beyond "no crash, no sanitizer report":
 *  - every refusal has a class and a non-empty message;
 *  - a file that parses is safe to read in full (every layer's bytes);
 *  - written again (snapfile_encode_header, then its blobs) it parses to the
 *    same entry, and writing that gives the same header bytes again. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "snapfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The header written for s, then s's blobs: a whole file (caller frees). */
static unsigned char *rewrite(const struct snapfile *s, size_t *len, size_t *hlen)
{
	unsigned char *h;
	if (snapfile_encode_header(s, &h, hlen, NULL) != SNAPFILE_OK)
		abort();
	*len = *hlen;
	for (uint32_t i = 0; i < s->n_layers; i++)
		*len += s->layers[i].size;
	unsigned char *f = realloc(h, *len);
	if (!f)
		abort();
	size_t off = *hlen;
	for (uint32_t i = 0; i < s->n_layers; i++) {
		memcpy(f + off, s->layers[i].data, s->layers[i].size);
		off += s->layers[i].size;
	}
	return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct snapfile s;
	struct snapfile_error err = {0};
	if (snapfile_parse(data, size, &s, &err) != SNAPFILE_OK) {
		if (err.cls == SNAPFILE_OK || !err.message[0] || s.model || s.layers)
			abort();
		return 0;
	}
	volatile unsigned char sink = 0;
	for (uint32_t i = 0; i < s.n_layers; i++)
		for (uint64_t b = 0; b < s.layers[i].size; b++)
			sink ^= s.layers[i].data[b];
	(void)sink;
	size_t len, hlen, len2, hlen2;
	unsigned char *f = rewrite(&s, &len, &hlen);
	struct snapfile t;
	if (snapfile_parse(f, len, &t, &err) != SNAPFILE_OK)
		abort();
	if (memcmp(t.key, s.key, 32) || memcmp(t.model->fingerprint, s.model->fingerprint, 32) ||
	    t.salt_len != s.salt_len || memcmp(t.salt, s.salt, s.salt_len) ||
	    t.n_tokens != s.n_tokens ||
	    memcmp(t.tokens, s.tokens, s.n_tokens * sizeof(*s.tokens)) || t.created != s.created ||
	    t.n_layers != s.n_layers)
		abort();
	for (uint32_t i = 0; i < s.n_layers; i++)
		if (t.layers[i].size != s.layers[i].size || t.layers[i].xxh3 != s.layers[i].xxh3 ||
		    memcmp(t.layers[i].data, s.layers[i].data, s.layers[i].size))
			abort();
	unsigned char *g = rewrite(&t, &len2, &hlen2);
	if (hlen2 != hlen || memcmp(g, f, hlen))
		abort();
	free(g);
	free(f);
	snapfile_free(&t);
	snapfile_free(&s);
	return 0;
}
