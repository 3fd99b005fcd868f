/* model: model specs and their fingerprints (contract: DESIGN.md "Model spec
 * and fingerprint").
 *
 * A spec is JSON: name, revision, state_layout and layers, each layer
 * {"mixer":"kda","conv_len":N,"recurrent_len":N} or
 * {"mixer":"mla","k_row":N,"v_row":N}. Loading rejects anything else with a
 * message a person can act on. The fingerprint is SHA-256 over a fixed byte
 * layout, so two workers agree on it only when they agree on every field. */
#ifndef K3_MODEL_H
#define K3_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_FINGERPRINT_LEN 32
#define MODEL_MAX_LAYERS      65536u
#define MODEL_ERROR_MAX       256

enum model_mixer {
	MODEL_MIXER_KDA = 1,
	MODEL_MIXER_MLA = 2,
};

struct model_layer {
	enum model_mixer mixer;
	uint32_t conv_len;      /* KDA: floats in the conv window */
	uint32_t recurrent_len; /* KDA: floats in the recurrent state */
	uint32_t k_row;         /* MLA: floats of k per token */
	uint32_t v_row;         /* MLA: floats of v per token */
};

struct k3cache_model {
	char *name;
	char *revision;
	char *state_layout;
	uint32_t n_layers;
	struct model_layer *layers;
	uint8_t fingerprint[MODEL_FINGERPRINT_LEN];
};

/* Parses a spec from JSON text. Returns NULL with a message in err
 * (MODEL_ERROR_MAX bytes) when the text is not a valid spec, or when memory
 * ran out (model_error_is_nomem). */
struct k3cache_model *model_from_json(const char *text, size_t len, char *err);

/* 1 when a message of these functions says memory ran out (so nothing is
 * known of the text: a stored spec is not damaged for it). */
int model_error_is_nomem(const char *err);

/* Reads and parses a spec file. Returns NULL with a message in err. */
struct k3cache_model *model_load_file(const char *path, char *err);

/* Builds a spec from fields (copied); validates them like model_from_json().
 * Returns NULL with a message in err. */
struct k3cache_model *model_new(const char *name, const char *revision, const char *state_layout,
                                const struct model_layer *layers, uint32_t n_layers, char *err);

void model_free(struct k3cache_model *spec);

/* Computes the fingerprint of the spec's fields (also stored in
 * spec->fingerprint). 0, or -1 when OpenSSL cannot allocate its digest. */
int model_fingerprint(const struct k3cache_model *spec, uint8_t out[MODEL_FINGERPRINT_LEN]);

/* Serialises a spec to compact JSON (caller frees). NULL on allocation failure. */
char *model_to_json(const struct k3cache_model *spec);

/* Bytes of one layer's blob for an entry of prefix_len tokens. */
/* The float counts of a layer's two vectors at prefix_len: KDA conv and
 * recurrent, MLA k and v (prefix_len rows of k_row and v_row each). */
void model_layer_floats(const struct model_layer *layer, uint32_t prefix_len, uint64_t n[2]);

/* Vector v's name (0 or 1): "conv"/"recurrent" or "k"/"v". */
const char *model_layer_vector_name(const struct model_layer *layer, int v);

uint64_t model_layer_blob_size(const struct model_layer *layer, uint32_t prefix_len);

const char *model_mixer_name(enum model_mixer mixer);

#endif
