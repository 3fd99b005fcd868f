/* k3cache_model: the public face of model specs (<k3cache/k3cache.h>) over
 * the codec's model module, whose struct k3cache_model it shows opaque. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3cache/k3cache.h"
#include "model.h"
#include "status.h"

_Static_assert(K3CACHE_FP_LEN == MODEL_FINGERPRINT_LEN, "fingerprint length");
_Static_assert((int)K3CACHE_MIXER_KDA == (int)MODEL_MIXER_KDA, "mixer KDA");
_Static_assert((int)K3CACHE_MIXER_MLA == (int)MODEL_MIXER_MLA, "mixer MLA");
_Static_assert(MODEL_ERROR_MAX <= K3CACHE_MESSAGE_MAX, "model messages fit");

/* A model call's failure: its message, INVALID (INTERNAL when the model
 * module ran out of memory, which it says as "out of memory"). */
static struct k3cache_model *failed(const char *msg, struct k3cache_error *err)
{
	if (err) {
		err->code = strstr(msg, "out of memory") ? K3CACHE_INTERNAL : K3CACHE_INVALID;
		err->unreachable = 0;
		snprintf(err->message, sizeof(err->message), "%s", msg);
	}
	return NULL;
}

static void cleared(struct k3cache_error *err)
{
	if (err) {
		err->code = K3CACHE_OK;
		err->unreachable = 0;
		err->message[0] = '\0';
	}
}

struct k3cache_model *k3cache_model_parse(const char *json, size_t len, struct k3cache_error *err)
{
	char msg[MODEL_ERROR_MAX] = "";
	if (!json)
		return failed("model: no JSON text", err);
	struct k3cache_model *m = model_from_json(json, len, msg);
	if (!m)
		return failed(msg, err);
	cleared(err);
	return m;
}

struct k3cache_model *k3cache_model_load(const char *path, struct k3cache_error *err)
{
	char msg[MODEL_ERROR_MAX] = "";
	if (!path)
		return failed("model: no file name", err);
	struct k3cache_model *m = model_load_file(path, msg);
	if (!m)
		return failed(msg, err);
	cleared(err);
	return m;
}

struct k3cache_model *k3cache_model_new(const char *name, const char *revision,
                                        const char *state_layout,
                                        const struct k3cache_layer *layers, uint32_t n_layers,
                                        struct k3cache_error *err)
{
	if (!layers && n_layers)
		return failed("model: layers is NULL", err);
	struct model_layer *ml = calloc(n_layers ? n_layers : 1, sizeof(*ml));
	if (!ml)
		return failed("model: out of memory", err);
	for (uint32_t i = 0; i < n_layers; i++)
		ml[i] = (struct model_layer){.mixer = (enum model_mixer)layers[i].mixer,
		                             .conv_len = layers[i].conv_len,
		                             .recurrent_len = layers[i].recurrent_len,
		                             .k_row = layers[i].k_row,
		                             .v_row = layers[i].v_row};
	char msg[MODEL_ERROR_MAX] = "";
	struct k3cache_model *m = model_new(name, revision, state_layout, ml, n_layers, msg);
	free(ml);
	if (!m)
		return failed(msg, err);
	cleared(err);
	return m;
}

void k3cache_model_free(struct k3cache_model *model)
{
	model_free(model);
}

const uint8_t *k3cache_model_fingerprint(const struct k3cache_model *model)
{
	return model ? model->fingerprint : NULL;
}

uint32_t k3cache_model_layers(const struct k3cache_model *model)
{
	return model ? model->n_layers : 0;
}

int k3cache_model_layer(const struct k3cache_model *model, uint32_t i, struct k3cache_layer *out)
{
	if (!model || i >= model->n_layers || !out)
		return -1;
	const struct model_layer *l = &model->layers[i];
	*out = (struct k3cache_layer){.mixer = (enum k3cache_mixer)l->mixer,
	                              .conv_len = l->conv_len,
	                              .recurrent_len = l->recurrent_len,
	                              .k_row = l->k_row,
	                              .v_row = l->v_row};
	return 0;
}

uint64_t k3cache_model_blob_size(const struct k3cache_model *model, uint32_t i, uint32_t prefix_len)
{
	if (!model || i >= model->n_layers)
		return 0;
	return model_layer_blob_size(&model->layers[i], prefix_len);
}
