/* snaputil: the integration tests' snapshots: valid blobs whose floats
 * depend on the layer, the prefix length and a seed. */
#ifndef K3_SNAPUTIL_H
#define K3_SNAPUTIL_H

#include <stdint.h>
#include <stdlib.h>

#include "blob.h"
#include "k3cache/k3cache.h"
#include "model.h"

/* Layer i of model m at P = p (a malloc'd blob). */
static inline struct k3cache_buf snaputil_layer(const struct k3cache_model *m, uint32_t i,
                                                uint32_t p, uint32_t seed)
{
	const struct model_layer *l = &m->layers[i];
	size_t n0 = l->mixer == MODEL_MIXER_KDA ? l->conv_len : (size_t)p * l->k_row;
	size_t n1 = l->mixer == MODEL_MIXER_KDA ? l->recurrent_len : (size_t)p * l->v_row;
	float *f = malloc((n0 + n1 + 1) * sizeof(float));
	for (size_t j = 0; j < n0 + n1; j++) {
		uint32_t x = seed * 0x9E3779B1u + i * 0x85EBCA77u + (uint32_t)j;
		x ^= x >> 15;
		x *= 0x2C1B3C6Du;
		f[j] = (float)(x % 20001u) * 1e-4f - 1.0f;
	}
	struct blob_view v = {.tag = (enum blob_tag)l->mixer,
	                      .seq_len = l->mixer == MODEL_MIXER_MLA ? p : 0,
	                      .v0 = {(const unsigned char *)f, (uint32_t)n0},
	                      .v1 = {(const unsigned char *)(f + n0), (uint32_t)n1}};
	void *b = malloc(blob_encoded_size(&v));
	struct k3cache_buf out = {b, blob_encode(&v, b)};
	free(f);
	return out;
}

#endif
