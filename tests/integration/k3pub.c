/* k3pub: a test helper that publishes a synthetic snapshot through
 * libk3cache, so the CLI tests have entries to list, inspect and evict.
 * usage: k3pub SOCKET SPEC.json TOKENS [SALT [SEED]]   (TOKENS: 1,2,3 or N:COUNT) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "k3cache.h"
#include "model.h"

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: k3pub SOCKET SPEC.json TOKENS [SALT [SEED]]\n");
		return 2;
	}
	char err[MODEL_ERROR_MAX];
	struct model_spec *m = model_load_file(argv[2], err);
	if (!m) {
		fprintf(stderr, "k3pub: %s\n", err);
		return 1;
	}
	uint32_t tokens[65536], n = 0;
	if (!strncmp(argv[3], "N:", 2)) {
		n = (uint32_t)strtoul(argv[3] + 2, NULL, 10);
		for (uint32_t i = 0; i < n && i < 65536; i++)
			tokens[i] = i + 1;
	} else {
		for (char *p = argv[3]; *p && n < 65536;) {
			tokens[n++] = (uint32_t)strtoul(p, &p, 10);
			if (*p == ',')
				p++;
		}
	}
	const char *salt = argc > 4 ? argv[4] : "";
	uint32_t seed = argc > 5 ? (uint32_t)strtoul(argv[5], NULL, 10) : 1;
	struct k3cache_buf *bufs = calloc(m->n_layers, sizeof(*bufs));
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		size_t n0 = l->mixer == MODEL_MIXER_KDA ? l->conv_len : (size_t)n * l->k_row;
		size_t n1 = l->mixer == MODEL_MIXER_KDA ? l->recurrent_len : (size_t)n * l->v_row;
		float *f = malloc((n0 + n1 + 1) * sizeof(float));
		for (size_t j = 0; j < n0 + n1; j++)
			f[j] = (float)((j * 31 + i * 7 + seed) % 1000) * 0.001f - 0.5f;
		struct blob_view v = {.tag = (enum blob_tag)l->mixer,
		                      .seq_len = l->mixer == MODEL_MIXER_MLA ? n : 0,
		                      .v0 = {(const unsigned char *)f, (uint32_t)n0},
		                      .v1 = {(const unsigned char *)(f + n0), (uint32_t)n1}};
		void *b = malloc(blob_encoded_size(&v));
		bufs[i].len = blob_encode(&v, b);
		bufs[i].data = b;
		free(f);
	}
	struct k3cache *c;
	struct k3cache_error e;
	struct k3cache_publish_result res;
	if (k3cache_connect(argv[1], &c, &e) || k3cache_put_model(c, m, NULL, &e) ||
	    k3cache_publish(c, m->fingerprint, salt, strlen(salt), tokens, n, bufs, m->n_layers,
	                    &res, &e)) {
		fprintf(stderr, "k3pub: %s\n", e.message);
		return 1;
	}
	for (int i = 0; i < 32; i++)
		printf("%02x", res.key[i]);
	printf("\n");
	k3cache_close(c);
	for (uint32_t i = 0; i < m->n_layers; i++)
		free((void *)bufs[i].data);
	free(bufs);
	model_free(m);
	return 0;
}
