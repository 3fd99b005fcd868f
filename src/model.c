#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* how every message about memory running out begins */
#define NOMEM "out of memory"

int model_error_is_nomem(const char *err)
{
	return strncmp(err, NOMEM, sizeof(NOMEM) - 1) == 0;
}

__attribute__((format(printf, 2, 3))) static void seterr(char *err, const char *fmt, ...)
{
	if (!err)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, MODEL_ERROR_MAX, fmt, ap);
	va_end(ap);
}

const char *model_mixer_name(enum model_mixer mixer)
{
	switch (mixer) {
	case MODEL_MIXER_KDA:
		return "KDA";
	case MODEL_MIXER_MLA:
		return "MLA";
	default:
		return "unknown";
	}
}

void model_free(struct k3cache_model *spec)
{
	if (!spec)
		return;
	free(spec->name);
	free(spec->revision);
	free(spec->state_layout);
	free(spec->layers);
	free(spec);
}

/* ---- fingerprint ---------------------------------------------------------- */

/* Each returns 1 on success, as EVP_DigestUpdate does. */
static int put_u32(EVP_MD_CTX *ctx, uint32_t v)
{
	unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
	                      (unsigned char)(v >> 24)};
	return EVP_DigestUpdate(ctx, b, 4);
}

static int put_str(EVP_MD_CTX *ctx, const char *s)
{
	size_t n = strlen(s);
	return put_u32(ctx, (uint32_t)n) && EVP_DigestUpdate(ctx, s, n);
}

int model_fingerprint(const struct k3cache_model *spec, uint8_t out[MODEL_FINGERPRINT_LEN])
{
	static const char magic[] = "k3cache-model-v1"; /* hashed with its NUL */
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
	         EVP_DigestUpdate(ctx, magic, sizeof(magic)) && put_str(ctx, spec->name) &&
	         put_str(ctx, spec->revision) && put_str(ctx, spec->state_layout) &&
	         put_u32(ctx, spec->n_layers);
	for (uint32_t i = 0; ok && i < spec->n_layers; i++) {
		const struct model_layer *l = &spec->layers[i];
		unsigned char mixer = (unsigned char)l->mixer;
		ok = EVP_DigestUpdate(ctx, &mixer, 1) && put_u32(ctx, l->conv_len) &&
		     put_u32(ctx, l->recurrent_len) && put_u32(ctx, l->k_row) &&
		     put_u32(ctx, l->v_row);
	}
	unsigned int n = 0;
	ok = ok && EVP_DigestFinal_ex(ctx, out, &n) && n == MODEL_FINGERPRINT_LEN;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		memset(out, 0, MODEL_FINGERPRINT_LEN);
	return ok ? 0 : -1;
}

/* ---- construction and checks ---------------------------------------------- */

static int check_layer(const struct model_layer *l, uint32_t i, char *err)
{
	switch (l->mixer) {
	case MODEL_MIXER_KDA:
		if (l->conv_len == 0 || l->recurrent_len == 0) {
			seterr(err, "layer %u: KDA %s must be at least 1", i,
			       l->conv_len == 0 ? "conv_len" : "recurrent_len");
			return -1;
		}
		if (l->k_row || l->v_row) {
			seterr(err, "layer %u: a KDA layer has no k_row or v_row", i);
			return -1;
		}
		return 0;
	case MODEL_MIXER_MLA:
		if (l->k_row == 0 || l->v_row == 0) {
			seterr(err, "layer %u: MLA %s must be at least 1", i,
			       l->k_row == 0 ? "k_row" : "v_row");
			return -1;
		}
		if (l->conv_len || l->recurrent_len) {
			seterr(err, "layer %u: an MLA layer has no conv_len or recurrent_len", i);
			return -1;
		}
		return 0;
	default:
		seterr(err, "layer %u: unknown mixer %d (expected kda or mla)", i, (int)l->mixer);
		return -1;
	}
}

static char *dup_checked(const char *s, const char *field, char *err, int *bad)
{
	if (!s) {
		seterr(err, "missing field \"%s\"", field);
		*bad = 1;
		return NULL;
	}
	char *d = strdup(s);
	if (!d) {
		seterr(err, NOMEM);
		*bad = 1;
	}
	return d;
}

struct k3cache_model *model_new(const char *name, const char *revision, const char *state_layout,
                                const struct model_layer *layers, uint32_t n_layers, char *err)
{
	if (n_layers == 0) {
		seterr(err, "the model has no layers");
		return NULL;
	}
	if (n_layers > MODEL_MAX_LAYERS) {
		seterr(err, "the model has %u layers; at most %u are supported", n_layers,
		       MODEL_MAX_LAYERS);
		return NULL;
	}
	if (name && name[0] == '\0') {
		seterr(err, "\"name\" is empty");
		return NULL;
	}
	for (uint32_t i = 0; i < n_layers; i++)
		if (check_layer(&layers[i], i, err))
			return NULL;
	struct k3cache_model *m = calloc(1, sizeof(*m));
	if (!m) {
		seterr(err, NOMEM);
		return NULL;
	}
	int bad = 0;
	m->name = dup_checked(name, "name", err, &bad);
	if (!bad)
		m->revision = dup_checked(revision, "revision", err, &bad);
	if (!bad)
		m->state_layout = dup_checked(state_layout, "state_layout", err, &bad);
	if (!bad && !(m->layers = malloc(sizeof(*layers) * n_layers))) {
		seterr(err, NOMEM);
		bad = 1;
	}
	if (bad) {
		model_free(m);
		return NULL;
	}
	memcpy(m->layers, layers, sizeof(*layers) * n_layers);
	m->n_layers = n_layers;
	if (model_fingerprint(m, m->fingerprint) != 0) {
		seterr(err, NOMEM " (computing the fingerprint)");
		model_free(m);
		return NULL;
	}
	return m;
}

/* ---- JSON ----------------------------------------------------------------- */

static const char *get_string(json_t *obj, const char *key, char *err)
{
	json_t *v = json_object_get(obj, key);
	if (!v) {
		seterr(err, "missing field \"%s\"", key);
		return NULL;
	}
	if (!json_is_string(v)) {
		seterr(err, "field \"%s\" must be a string", key);
		return NULL;
	}
	if (strlen(json_string_value(v)) != json_string_length(v)) {
		seterr(err, "field \"%s\" contains a NUL character", key);
		return NULL;
	}
	return json_string_value(v);
}

static int get_count(json_t *layer, uint32_t i, const char *key, uint32_t *out, char *err)
{
	json_t *v = json_object_get(layer, key);
	if (!v) {
		seterr(err, "layer %u: missing field \"%s\"", i, key);
		return -1;
	}
	if (!json_is_integer(v)) {
		seterr(err, "layer %u: \"%s\" must be a whole number", i, key);
		return -1;
	}
	json_int_t n = json_integer_value(v);
	if (n < 1 || n > (json_int_t)UINT32_MAX) {
		seterr(err, "layer %u: \"%s\" is %lld; it must be from 1 to %u", i, key,
		       (long long)n, UINT32_MAX);
		return -1;
	}
	*out = (uint32_t)n;
	return 0;
}

static int only_keys(json_t *obj, const char *const *allowed, const char *where, char *err)
{
	const char *key;
	json_t *val;
	json_object_foreach (obj, key, val) {
		(void)val;
		int ok = 0;
		for (const char *const *a = allowed; *a; a++)
			ok |= strcmp(*a, key) == 0;
		if (!ok) {
			seterr(err, "%s: unknown field \"%s\"", where, key);
			return -1;
		}
	}
	return 0;
}

static int parse_layer(json_t *jl, uint32_t i, struct model_layer *out, char *err)
{
	char where[32];
	snprintf(where, sizeof(where), "layer %u", i);
	if (!json_is_object(jl)) {
		seterr(err, "layer %u: must be an object", i);
		return -1;
	}
	json_t *jm = json_object_get(jl, "mixer");
	if (!jm || !json_is_string(jm)) {
		seterr(err, "layer %u: missing string field \"mixer\" (\"kda\" or \"mla\")", i);
		return -1;
	}
	const char *mixer = json_string_value(jm);
	memset(out, 0, sizeof(*out));
	if (strcmp(mixer, "kda") == 0) {
		static const char *const allowed[] = {"mixer", "conv_len", "recurrent_len", NULL};
		if (json_object_get(jl, "k_row") || json_object_get(jl, "v_row")) {
			seterr(err, "layer %u: a KDA layer has no k_row or v_row", i);
			return -1;
		}
		out->mixer = MODEL_MIXER_KDA;
		if (only_keys(jl, allowed, where, err) ||
		    get_count(jl, i, "conv_len", &out->conv_len, err) ||
		    get_count(jl, i, "recurrent_len", &out->recurrent_len, err))
			return -1;
		return 0;
	}
	if (strcmp(mixer, "mla") == 0) {
		static const char *const allowed[] = {"mixer", "k_row", "v_row", NULL};
		if (json_object_get(jl, "conv_len") || json_object_get(jl, "recurrent_len")) {
			seterr(err, "layer %u: an MLA layer has no conv_len or recurrent_len", i);
			return -1;
		}
		out->mixer = MODEL_MIXER_MLA;
		if (only_keys(jl, allowed, where, err) ||
		    get_count(jl, i, "k_row", &out->k_row, err) ||
		    get_count(jl, i, "v_row", &out->v_row, err))
			return -1;
		return 0;
	}
	seterr(err, "layer %u: unknown mixer \"%s\" (expected \"kda\" or \"mla\")", i, mixer);
	return -1;
}

struct k3cache_model *model_from_json(const char *text, size_t len, char *err)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (json_error_code(&jerr) == json_error_out_of_memory)
			seterr(err, NOMEM " (parsing JSON)");
		else
			seterr(err, "not valid JSON: line %d column %d: %s", jerr.line, jerr.column,
			       jerr.text);
		return NULL;
	}
	struct k3cache_model *spec = NULL;
	struct model_layer *layers = NULL;
	static const char *const allowed[] = {"name", "revision", "state_layout", "layers", NULL};
	if (!json_is_object(root)) {
		seterr(err, "a model spec must be a JSON object");
		goto out;
	}
	if (only_keys(root, allowed, "model spec", err))
		goto out;
	const char *name = get_string(root, "name", err);
	if (!name)
		goto out;
	const char *revision = get_string(root, "revision", err);
	if (!revision)
		goto out;
	const char *layout = get_string(root, "state_layout", err);
	if (!layout)
		goto out;
	json_t *jlayers = json_object_get(root, "layers");
	if (!jlayers) {
		seterr(err, "missing field \"layers\"");
		goto out;
	}
	if (!json_is_array(jlayers)) {
		seterr(err, "field \"layers\" must be an array");
		goto out;
	}
	size_t n = json_array_size(jlayers);
	if (n == 0) {
		seterr(err, "the model has no layers");
		goto out;
	}
	if (n > MODEL_MAX_LAYERS) {
		seterr(err, "the model has %zu layers; at most %u are supported", n,
		       MODEL_MAX_LAYERS);
		goto out;
	}
	layers = calloc(n, sizeof(*layers));
	if (!layers) {
		seterr(err, NOMEM);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (parse_layer(json_array_get(jlayers, i), (uint32_t)i, &layers[i], err))
			goto out;
	spec = model_new(name, revision, layout, layers, (uint32_t)n, err);
out:
	free(layers);
	json_decref(root);
	return spec;
}

struct k3cache_model *model_load_file(const char *path, char *err)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		seterr(err, "%s: %s", path, strerror(errno));
		return NULL;
	}
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (len == cap) {
			cap = cap ? cap * 2 : 4096;
			if (cap > (64u << 20)) {
				seterr(err, "%s: larger than 64 MiB; not a model spec", path);
				goto fail;
			}
			char *nb = realloc(buf, cap);
			if (!nb) {
				seterr(err, NOMEM);
				goto fail;
			}
			buf = nb;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		seterr(err, "%s: read error", path);
		goto fail;
	}
	fclose(f);
	char inner[MODEL_ERROR_MAX];
	struct k3cache_model *spec = model_from_json(buf, len, inner);
	free(buf);
	if (!spec)
		seterr(err, "%s: %s", path, inner);
	return spec;
fail:
	free(buf);
	fclose(f);
	return NULL;
}

char *model_to_json(const struct k3cache_model *spec)
{
	json_t *layers = json_array();
	for (uint32_t i = 0; layers && i < spec->n_layers; i++) {
		const struct model_layer *l = &spec->layers[i];
		json_t *jl =
		        l->mixer == MODEL_MIXER_KDA
		                ? json_pack("{s:s,s:I,s:I}", "mixer", "kda", "conv_len",
		                            (json_int_t)l->conv_len, "recurrent_len",
		                            (json_int_t)l->recurrent_len)
		                : json_pack("{s:s,s:I,s:I}", "mixer", "mla", "k_row",
		                            (json_int_t)l->k_row, "v_row", (json_int_t)l->v_row);
		if (!jl || json_array_append_new(layers, jl)) {
			json_decref(layers);
			return NULL;
		}
	}
	json_t *root =
	        json_pack("{s:s,s:s,s:s,s:o}", "name", spec->name, "revision", spec->revision,
	                  "state_layout", spec->state_layout, "layers", layers);
	if (!root)
		return NULL;
	char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return s;
}

void model_layer_floats(const struct model_layer *layer, uint32_t prefix_len, uint64_t n[2])
{
	int kda = layer->mixer == MODEL_MIXER_KDA;
	n[0] = kda ? layer->conv_len : (uint64_t)prefix_len * layer->k_row;
	n[1] = kda ? layer->recurrent_len : (uint64_t)prefix_len * layer->v_row;
}

const char *model_layer_vector_name(const struct model_layer *layer, int v)
{
	if (layer->mixer == MODEL_MIXER_KDA)
		return v ? "recurrent" : "conv";
	return v ? "v" : "k";
}

uint64_t model_layer_blob_size(const struct model_layer *layer, uint32_t prefix_len)
{
	uint64_t n[2];
	model_layer_floats(layer, prefix_len, n);
	uint64_t head = layer->mixer == MODEL_MIXER_KDA ? 1 : 1 + 4; /* tag[, seq_len] */
	return head + 8 + (n[0] + n[1]) * 4u;
}
