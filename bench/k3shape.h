/* K3-shaped models and snapshots for the benchmarks: KDA layers of 147,456
 * conv + 1,572,864 recurrent floats (6.5625 MiB) and MLA layers of k_row 512,
 * v_row 64, in blocks of three KDA and one MLA. */
#ifndef K3_BENCH_K3SHAPE_H
#define K3_BENCH_K3SHAPE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define K3SHAPE_KDA_CONV 147456u
#define K3SHAPE_KDA_REC  1572864u
#define K3SHAPE_MLA_K    512u
#define K3SHAPE_MLA_V    64u

/* n_kda KDA layers and n_mla MLA layers, the MLA last in each block of four.
 * NULL with a message in err (MODEL_ERROR_MAX bytes). */
static inline struct k3cache_model *k3shape_model(const char *name, uint32_t n_kda, uint32_t n_mla,
                                                  char *err)
{
	uint32_t n = n_kda + n_mla;
	struct model_layer *l = calloc(n, sizeof(*l));
	if (!l)
		return NULL;
	uint32_t kda = 0, mla = 0;
	for (uint32_t i = 0; i < n; i++) {
		if ((i % 4 == 3 && mla < n_mla) || kda == n_kda) {
			l[i] = (struct model_layer){.mixer = MODEL_MIXER_MLA,
			                            .k_row = K3SHAPE_MLA_K,
			                            .v_row = K3SHAPE_MLA_V};
			mla++;
		} else {
			l[i] = (struct model_layer){.mixer = MODEL_MIXER_KDA,
			                            .conv_len = K3SHAPE_KDA_CONV,
			                            .recurrent_len = K3SHAPE_KDA_REC};
			kda++;
		}
	}
	struct k3cache_model *m = model_new(name, "bench", "bench", l, n, err);
	free(l);
	return m;
}

/* A malloc'd, valid blob for one layer at prefix length p; *len gets its size. */
static inline unsigned char *k3shape_blob(const struct model_layer *l, uint32_t layer, uint32_t p,
                                          uint32_t seed, size_t *len)
{
	uint64_t n0 = l->mixer == MODEL_MIXER_KDA ? l->conv_len : (uint64_t)p * l->k_row;
	uint64_t n1 = l->mixer == MODEL_MIXER_KDA ? l->recurrent_len : (uint64_t)p * l->v_row;
	*len = (size_t)model_layer_blob_size(l, p);
	unsigned char *b = malloc(*len);
	if (!b)
		return NULL;
	size_t off = 0;
	b[off++] = (unsigned char)l->mixer;
	if (l->mixer == MODEL_MIXER_MLA) {
		memcpy(b + off, &p, 4);
		off += 4;
	}
	uint32_t c0 = (uint32_t)n0, c1 = (uint32_t)n1;
	memcpy(b + off, &c0, 4);
	for (uint64_t j = 0; j < n0; j++) {
		float v = (float)((j + seed + layer) % 997) * 1e-3f;
		memcpy(b + off + 4 + j * 4, &v, 4);
	}
	off += 4 + (size_t)n0 * 4;
	memcpy(b + off, &c1, 4);
	for (uint64_t j = 0; j < n1; j++) {
		float v = (float)((j * 7 + seed + layer) % 991) * 1e-3f;
		memcpy(b + off + 4 + j * 4, &v, 4);
	}
	return b;
}

#endif
