#include "snapfile.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "checksum.h"
#include "hexutil.h"
#include "model.h"
#include "prefix.h"

const char *snapfile_class_name(enum snapfile_class cls)
{
	static const char *const names[] = {
	        [SNAPFILE_OK] = "ok",
	        [SNAPFILE_ERR_MAGIC] = "magic",
	        [SNAPFILE_ERR_TRUNCATED] = "truncated",
	        [SNAPFILE_ERR_TOO_LARGE] = "too_large",
	        [SNAPFILE_ERR_HEADER] = "header",
	        [SNAPFILE_ERR_MODEL] = "model",
	        [SNAPFILE_ERR_KEY] = "key",
	        [SNAPFILE_ERR_LAYERS] = "layers",
	        [SNAPFILE_ERR_CHECKSUM] = "checksum",
	        [SNAPFILE_ERR_BLOB] = "blob",
	        [SNAPFILE_ERR_TRAILING] = "trailing",
	        [SNAPFILE_ERR_NOMEM] = "nomem",
	};
	return (unsigned)cls < sizeof(names) / sizeof(names[0]) ? names[cls] : "unknown";
}

__attribute__((format(printf, 3, 4))) static enum snapfile_class
fail(struct snapfile_error *err, enum snapfile_class cls, const char *fmt, ...)
{
	if (err) {
		err->cls = cls;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
	}
	return cls;
}

/* ---- writing ----------------------------------------------------------- */

/* The header's JSON document (NULL when out of memory). */
static json_t *header_doc(const struct snapfile *s)
{
	char *specjs = model_to_json(s->model);
	json_t *jspec = specjs ? json_loads(specjs, 0, NULL) : NULL;
	free(specjs);
	json_t *toks = json_array(), *jl = json_array();
	int ok = jspec && toks && jl;
	for (uint32_t i = 0; ok && i < s->n_tokens; i++)
		ok = json_array_append_new(toks, json_integer(s->tokens[i])) == 0;
	for (uint32_t i = 0; ok && i < s->n_layers; i++) {
		char sum[17];
		snprintf(sum, sizeof(sum), "%016" PRIx64, s->layers[i].xxh3);
		ok = json_array_append_new(jl, json_pack("{s:i,s:I,s:s}", "index", (int)i, "size",
		                                         (json_int_t)s->layers[i].size, "xxh3",
		                                         sum)) == 0;
	}
	if (!ok) {
		json_decref(jspec);
		json_decref(toks);
		json_decref(jl);
		return NULL;
	}
	char keyhex[65], fphex[65], salthex[2 * SNAPFILE_MAX_SALT + 1];
	hexutil_encode(s->key, 32, keyhex);
	hexutil_encode(s->model->fingerprint, 32, fphex);
	hexutil_encode(s->salt, s->salt_len, salthex);
	return json_pack("{s:i,s:s,s:s,s:o,s:s,s:I,s:o,s:o,s:I}", "format", 1, "key", keyhex,
	                 "fingerprint", fphex, "model", jspec, "salt", salthex, "prefix_len",
	                 (json_int_t)s->n_tokens, "tokens", toks, "layers", jl, "created",
	                 (json_int_t)s->created);
}

enum snapfile_class snapfile_encode_header(const struct snapfile *s, unsigned char **out,
                                           size_t *len, struct snapfile_error *err)
{
	*out = NULL;
	*len = 0;
	if (s->salt_len > SNAPFILE_MAX_SALT)
		return fail(err, SNAPFILE_ERR_TOO_LARGE,
		            "a salt of %zu bytes: over the %u bytes a store holds", s->salt_len,
		            SNAPFILE_MAX_SALT);
	json_t *doc = header_doc(s);
	char *hdr = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(doc);
	if (!hdr)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory writing the header");
	size_t hlen = strlen(hdr);
	if (hlen > SNAPFILE_MAX_HEADER) {
		free(hdr);
		return fail(err, SNAPFILE_ERR_TOO_LARGE,
		            "the header would take %zu bytes, over the %u MiB a reader accepts",
		            hlen, SNAPFILE_MAX_HEADER >> 20);
	}
	/* the prelude, then the header with its NUL (not part of the file) */
	unsigned char *buf = malloc(SNAPFILE_PRELUDE_LEN + hlen + 1);
	if (!buf) {
		free(hdr);
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory writing the header");
	}
	static const unsigned char magic[SNAPFILE_MAGIC_LEN] = SNAPFILE_MAGIC;
	for (unsigned i = 0; i < SNAPFILE_MAGIC_LEN; i++)
		buf[i] = magic[i];
	for (unsigned i = 0; i < 4; i++)
		buf[SNAPFILE_MAGIC_LEN + i] = (unsigned char)(hlen >> (8 * i));
	memcpy(buf + SNAPFILE_PRELUDE_LEN, hdr, hlen + 1);
	free(hdr);
	*out = buf;
	*len = SNAPFILE_PRELUDE_LEN + hlen;
	return SNAPFILE_OK;
}

/* ---- reading ----------------------------------------------------------- */

void snapfile_free(struct snapfile *s)
{
	model_free(s->model);
	free(s->salt);
	free(s->tokens);
	free(s->layers);
	memset(s, 0, sizeof(*s));
}

/* A whole number in [lo, hi] named `name` of object `obj`; 0 or -1. */
static int get_int(json_t *obj, const char *name, json_int_t lo, json_int_t hi, json_int_t *out)
{
	json_t *v = json_object_get(obj, name);
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return -1;
	*out = json_integer_value(v);
	return 0;
}

/* Exactly 2 * len hex digits in string `name` of `obj`, into out; 0 or -1. */
static int get_hex(json_t *obj, const char *name, uint8_t *out, size_t len)
{
	const char *s = json_string_value(json_object_get(obj, name));
	return s && hexutil_decode(s, out, len) == 0 ? 0 : -1;
}

/* The spec, checked against its fingerprint. */
static enum snapfile_class parse_model(json_t *doc, struct snapfile *s, struct snapfile_error *err)
{
	json_t *jspec = json_object_get(doc, "model");
	uint8_t fp[32];
	if (!json_is_object(jspec))
		return fail(err, SNAPFILE_ERR_HEADER, "the header has no \"model\" object");
	if (get_hex(doc, "fingerprint", fp, sizeof(fp)) != 0)
		return fail(err, SNAPFILE_ERR_HEADER,
		            "the header's \"fingerprint\" is not 64 hex digits");
	char *specjs = json_dumps(jspec, JSON_COMPACT);
	if (!specjs)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory reading the model spec");
	char merr[MODEL_ERROR_MAX];
	s->model = model_from_json(specjs, strlen(specjs), merr);
	free(specjs);
	if (!s->model)
		return fail(err, SNAPFILE_ERR_MODEL, "its model spec is invalid: %s", merr);
	if (memcmp(s->model->fingerprint, fp, sizeof(fp)) != 0)
		return fail(err, SNAPFILE_ERR_MODEL,
		            "its model spec does not match its fingerprint");
	return SNAPFILE_OK;
}

/* Salt, tokens and prefix_len, and the key they make with the spec. */
static enum snapfile_class parse_prefix(json_t *doc, struct snapfile *s, struct snapfile_error *err)
{
	const char *salthex = json_string_value(json_object_get(doc, "salt"));
	json_t *jtoks = json_object_get(doc, "tokens");
	json_int_t plen, created;
	if (!salthex)
		return fail(err, SNAPFILE_ERR_HEADER, "the header has no \"salt\" string");
	size_t hexlen = strlen(salthex);
	if (hexlen > 2 * (size_t)SNAPFILE_MAX_SALT)
		return fail(err, SNAPFILE_ERR_TOO_LARGE,
		            "its salt of %zu hex digits is over the %u bytes a store holds", hexlen,
		            SNAPFILE_MAX_SALT);
	s->salt_len = hexlen / 2;
	s->salt = malloc(s->salt_len + 1);
	if (!s->salt)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory reading the salt");
	if (hexutil_decode(salthex, s->salt, s->salt_len) != 0)
		return fail(err, SNAPFILE_ERR_HEADER,
		            "its salt is not hex (an even number of hex digits)");
	size_t ntok = json_array_size(jtoks);
	if (!json_is_array(jtoks) || ntok == 0 || ntok > UINT32_MAX)
		return fail(err, SNAPFILE_ERR_HEADER,
		            "the header's \"tokens\" is not a list of 1 or more tokens");
	s->tokens = malloc(ntok * sizeof(*s->tokens));
	if (!s->tokens)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory reading %zu tokens", ntok);
	for (size_t i = 0; i < ntok; i++) {
		json_t *t = json_array_get(jtoks, i);
		if (!json_is_integer(t) || json_integer_value(t) < 0 ||
		    json_integer_value(t) > (json_int_t)UINT32_MAX)
			return fail(err, SNAPFILE_ERR_HEADER,
			            "token %zu is not a whole number from 0 to %u", i, UINT32_MAX);
		s->tokens[i] = (uint32_t)json_integer_value(t);
	}
	s->n_tokens = (uint32_t)ntok;
	if (get_int(doc, "prefix_len", 0, UINT32_MAX, &plen) != 0 || (size_t)plen != ntok)
		return fail(err, SNAPFILE_ERR_HEADER,
		            "the header's \"prefix_len\" is missing or is not its %zu tokens",
		            ntok);
	if (get_int(doc, "created", 0, INT64_MAX, &created) != 0)
		return fail(err, SNAPFILE_ERR_HEADER,
		            "the header's \"created\" is not a time (seconds, 0 or more)");
	s->created = (uint64_t)created;
	uint8_t key[32];
	if (get_hex(doc, "key", s->key, sizeof(s->key)) != 0)
		return fail(err, SNAPFILE_ERR_HEADER, "the header's \"key\" is not 64 hex digits");
	if (prefix_key(s->model->fingerprint, s->salt, s->salt_len, s->tokens, s->n_tokens, key) !=
	    0)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory computing its key");
	if (memcmp(key, s->key, sizeof(key)) != 0)
		return fail(err, SNAPFILE_ERR_KEY,
		            "its key does not match its model, salt and tokens");
	return SNAPFILE_OK;
}

/* The layer list against the spec and the bytes after the header (body,
 * body_len): every record whole, the sizes adding up to exactly body_len. */
static enum snapfile_class parse_layers(json_t *doc, const unsigned char *body, size_t body_len,
                                        struct snapfile *s, struct snapfile_error *err)
{
	json_t *jlayers = json_object_get(doc, "layers");
	if (!json_is_array(jlayers))
		return fail(err, SNAPFILE_ERR_HEADER, "the header has no \"layers\" list");
	size_t nl = json_array_size(jlayers);
	if (nl != s->model->n_layers)
		return fail(err, SNAPFILE_ERR_LAYERS, "it has %zu layers for a model of %u", nl,
		            s->model->n_layers);
	s->layers = calloc(nl ? nl : 1, sizeof(*s->layers));
	if (!s->layers)
		return fail(err, SNAPFILE_ERR_NOMEM, "out of memory reading %zu layers", nl);
	s->n_layers = (uint32_t)nl;
	uint64_t off = 0;
	for (uint32_t i = 0; i < s->n_layers; i++) {
		json_t *jl = json_array_get(jlayers, i);
		json_int_t index, size;
		uint8_t sum[8];
		if (get_int(jl, "index", i, i, &index) != 0 ||
		    get_int(jl, "size", 1, INT64_MAX, &size) != 0 ||
		    get_hex(jl, "xxh3", sum, sizeof(sum)) != 0)
			return fail(
			        err, SNAPFILE_ERR_LAYERS,
			        "layer %u: bad layer record (it needs \"index\": %u, a \"size\" "
			        "of 1 or more and an \"xxh3\" of 16 hex digits)",
			        i, i);
		if ((uint64_t)size > body_len - off)
			return fail(
			        err, SNAPFILE_ERR_TRUNCATED,
			        "layer %u: truncated: the file ends before its bytes do (%" PRIu64
			        " of its %" PRIu64 " bytes are there)",
			        i, (uint64_t)body_len - off, (uint64_t)size);
		struct snapfile_layer *l = &s->layers[i];
		l->data = body + off;
		l->size = (uint64_t)size;
		for (unsigned b = 0; b < 8; b++)
			l->xxh3 = l->xxh3 << 8 | sum[b];
		off += (uint64_t)size;
	}
	if (off != body_len)
		return fail(err, SNAPFILE_ERR_TRAILING,
		            "it has trailing bytes after the last layer (%" PRIu64 " byte%s)",
		            (uint64_t)body_len - off, body_len - off == 1 ? "" : "s");
	return SNAPFILE_OK;
}

enum snapfile_class snapfile_check_layer(const struct snapfile *s, uint32_t i,
                                         struct snapfile_error *err)
{
	const struct snapfile_layer *l = &s->layers[i];
	if (checksum_blob(l->data, (size_t)l->size, i) != l->xxh3)
		return fail(err, SNAPFILE_ERR_CHECKSUM,
		            "layer %u: checksum mismatch: the file is damaged", i);
	struct blob_error berr;
	if (blob_check(l->data, (size_t)l->size, s->model, i, s->n_tokens, &berr) != BLOB_OK)
		return fail(err, SNAPFILE_ERR_BLOB, "%.250s (%s)", berr.message,
		            blob_class_name(berr.cls));
	return SNAPFILE_OK;
}

static enum snapfile_class parse_header(const unsigned char *p, size_t size, uint32_t hlen,
                                        struct snapfile *out, struct snapfile_error *err)
{
	json_error_t jerr;
	json_t *doc = json_loadb((const char *)p + SNAPFILE_PRELUDE_LEN, hlen,
	                         JSON_REJECT_DUPLICATES, &jerr);
	if (!doc)
		return fail(err, SNAPFILE_ERR_HEADER, "the header is not valid JSON: %s",
		            jerr.text);
	json_int_t format;
	enum snapfile_class rc = SNAPFILE_OK;
	if (!json_is_object(doc))
		rc = fail(err, SNAPFILE_ERR_HEADER, "the header is not a JSON object");
	else if (get_int(doc, "format", 1, 1, &format) != 0)
		rc = fail(err, SNAPFILE_ERR_HEADER,
		          "the header's \"format\" is not 1 (this k3cachectl reads format 1)");
	if (rc == SNAPFILE_OK)
		rc = parse_model(doc, out, err);
	if (rc == SNAPFILE_OK)
		rc = parse_prefix(doc, out, err);
	if (rc == SNAPFILE_OK)
		rc = parse_layers(doc, p + SNAPFILE_PRELUDE_LEN + hlen,
		                  size - SNAPFILE_PRELUDE_LEN - hlen, out, err);
	json_decref(doc);
	return rc;
}

enum snapfile_class snapfile_parse_layout(const void *data, size_t size, struct snapfile *out,
                                          struct snapfile_error *err)
{
	const unsigned char *p = data;
	memset(out, 0, sizeof(*out));
	if (size < SNAPFILE_MAGIC_LEN || memcmp(p, SNAPFILE_MAGIC, SNAPFILE_MAGIC_LEN) != 0)
		return fail(err, SNAPFILE_ERR_MAGIC,
		            "not a k3cache snapshot file (no K3SNAP1 header)");
	if (size < SNAPFILE_PRELUDE_LEN)
		return fail(err, SNAPFILE_ERR_TRUNCATED,
		            "truncated: the file ends inside its header's length");
	uint32_t hlen = 0;
	for (unsigned i = 0; i < 4; i++)
		hlen |= (uint32_t)p[SNAPFILE_MAGIC_LEN + i] << (8 * i);
	if (hlen > SNAPFILE_MAX_HEADER)
		return fail(err, SNAPFILE_ERR_TOO_LARGE,
		            "its header length (%" PRIu32 " bytes) is over the %u MiB limit: the "
		            "file is damaged",
		            hlen, SNAPFILE_MAX_HEADER >> 20);
	if (hlen > size - SNAPFILE_PRELUDE_LEN)
		return fail(err, SNAPFILE_ERR_TRUNCATED,
		            "truncated: the header (%" PRIu32 " bytes) runs past the end of the "
		            "file (%zu bytes)",
		            hlen, size);
	enum snapfile_class rc = parse_header(p, size, hlen, out, err);
	if (rc != SNAPFILE_OK)
		snapfile_free(out);
	return rc;
}

enum snapfile_class snapfile_parse(const void *data, size_t size, struct snapfile *out,
                                   struct snapfile_error *err)
{
	enum snapfile_class rc = snapfile_parse_layout(data, size, out, err);
	for (uint32_t i = 0; rc == SNAPFILE_OK && i < out->n_layers; i++)
		rc = snapfile_check_layer(out, i, err);
	if (rc != SNAPFILE_OK)
		snapfile_free(out);
	return rc;
}
