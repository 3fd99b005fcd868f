/* k3pub: a test helper that publishes a synthetic snapshot through
 * libk3cache, so the CLI tests have entries to list, inspect and evict.
 * usage: k3pub SOCKET SPEC.json TOKENS [SALT [SEED [--restore]]]   (TOKENS: 1,2,3 or N:COUNT)
 * --restore looks the tokens up instead and checks what it restores against
 * what a publish of the same arguments sends.
 * TOKENS "collide" publishes two 4-token entries whose keys share their first
 * 8 hex digits (found by a birthday search), for the ambiguous-prefix test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "k3cache/k3cache.h"
#include "model.h"
#include "prefix.h"
#include "units.h"

/* Deterministic blobs for n tokens of seed, one per layer (data NULL when
 * out of memory). */
static struct k3cache_buf *make_bufs(const struct k3cache_model *m, uint32_t n, uint32_t seed)
{
	struct k3cache_buf *bufs = calloc(m->n_layers, sizeof(*bufs));
	if (!bufs)
		return NULL;
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		size_t n0 = l->mixer == MODEL_MIXER_KDA ? l->conv_len : (size_t)n * l->k_row;
		size_t n1 = l->mixer == MODEL_MIXER_KDA ? l->recurrent_len : (size_t)n * l->v_row;
		float *f = malloc((n0 + n1 + 1) * sizeof(float));
		for (size_t j = 0; f && j < n0 + n1; j++)
			f[j] = (float)((j * 31u + (size_t)i * 7u + seed) % 1000u) * 0.001f - 0.5f;
		struct blob_view v = {
		        .tag = (enum blob_tag)l->mixer,
		        .seq_len = l->mixer == MODEL_MIXER_MLA ? n : 0,
		        .v0 = {(const unsigned char *)f, (uint32_t)n0},
		        .v1 = {(const unsigned char *)(f ? f + n0 : NULL), (uint32_t)n1}};
		void *b = f ? malloc(blob_encoded_size(&v)) : NULL;
		if (b)
			bufs[i].len = blob_encode(&v, b);
		bufs[i].data = b;
		free(f);
	}
	return bufs;
}

static void free_bufs(const struct k3cache_model *m, struct k3cache_buf *bufs)
{
	for (uint32_t i = 0; bufs && i < m->n_layers; i++)
		free((void *)bufs[i].data);
	free(bufs);
}

/* A connection to sock that knows m; NULL after saying why. */
static struct k3cache *connect_model(const char *sock, const struct k3cache_model *m)
{
	struct k3cache *c = NULL;
	struct k3cache_error e;
	if (k3cache_connect(sock, &c, &e) || k3cache_put_model(c, m, NULL, &e)) {
		fprintf(stderr, "k3pub: %s: %s\n", k3cache_code_name(e.code), e.message);
		k3cache_close(c);
		return NULL;
	}
	return c;
}

struct expect {
	const struct k3cache_buf *bufs;
	uint32_t wrong; /* layers whose bytes differ */
};

static int compare_layer(uint32_t index, const void *blob, size_t len, void *ctx)
{
	struct expect *x = ctx;
	if (len != x->bufs[index].len || memcmp(blob, x->bufs[index].data, len) != 0) {
		fprintf(stderr, "k3pub: layer %u: restored bytes differ from what was published\n",
		        index);
		x->wrong++;
	}
	return 0;
}

/* Publishes deterministic blobs for tokens and prints the key; or, with
 * restore, looks the tokens up (one token more in the prompt: tokens has
 * room for it) and restores what is found, checking every layer against the
 * bytes a publish sends, and prints "restored P". 0 when it all worked (the
 * whole prefix restored), else 1. */
static int run_one(const char *sock, const struct k3cache_model *m, uint32_t *tokens, uint32_t n,
                   const char *salt, uint32_t seed, int restore)
{
	struct k3cache_buf *bufs = make_bufs(m, n, seed);
	if (!bufs)
		return 1;
	struct k3cache *c = connect_model(sock, m);
	struct k3cache_error e;
	struct k3cache_publish_result pub;
	struct k3cache_lookup_result res;
	struct expect x = {bufs, 0};
	tokens[n] = 424242; /* the token to feed */
	int rc = 1;
	if (c && (restore ? k3cache_lookup_restore(c, m, salt, strlen(salt), tokens, n + 1, 0,
	                                           compare_layer, &x, &res, &e)
	                  : k3cache_publish(c, m->fingerprint, salt, strlen(salt), tokens, n, bufs,
	                                    m->n_layers, &pub, &e))) {
		fprintf(stderr, "k3pub: %s: %s\n", k3cache_code_name(e.code), e.message);
	} else if (c && restore) {
		printf("restored %u\n", res.prefix_len);
		rc = res.prefix_len != n || x.wrong != 0;
	} else if (c) {
		for (int i = 0; i < 32; i++)
			printf("%02x", pub.key[i]);
		printf("\n");
		rc = 0;
	}
	k3cache_close(c);
	free_bufs(m, bufs);
	return rc;
}

/* Finds two token lists {i,i,7,7} whose keys share their first 4 bytes. */
static int find_collision(const struct k3cache_model *m, uint32_t *a, uint32_t *b)
{
	enum { TRIES = 1 << 20 };
	const uint32_t slots = (uint32_t)TRIES * 2u;
	uint32_t *slot = calloc(slots, sizeof(uint32_t));
	if (!slot)
		return -1;
	*a = *b = 0;
	for (uint32_t i = 1; i < TRIES && !*a; i++) {
		uint32_t t[4] = {i, i, 7, 7};
		uint8_t k[32];
		prefix_key(m->fingerprint, "", 0, t, 4, k);
		uint32_t h =
		        (uint32_t)k[0] << 24 | (uint32_t)k[1] << 16 | (uint32_t)k[2] << 8 | k[3];
		uint32_t pos = h % slots;
		while (slot[pos]) {
			uint32_t j = slot[pos];
			uint32_t tj[4] = {j, j, 7, 7};
			uint8_t kj[32];
			prefix_key(m->fingerprint, "", 0, tj, 4, kj);
			if (!memcmp(k, kj, 4)) {
				*a = j;
				*b = i;
				break;
			}
			pos = (pos + 1) % slots;
		}
		if (!*a)
			slot[pos] = i;
	}
	free(slot);
	return *a ? 0 : -1;
}

/* "1,2,3": every item a whole number, none empty. Returns 0, or -1 after
 * saying why. */
static int parse_tokens(const char *list, uint32_t *tokens, uint32_t cap, uint32_t *n)
{
	*n = 0;
	for (const char *p = list;; p++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char item[32];
		uint64_t v;
		if (len == 0 || len >= sizeof(item) || *n == cap) {
			fprintf(stderr, "k3pub: TOKENS \"%s\": item %u is %s\n", list, *n,
			        len == 0    ? "empty"
			        : *n == cap ? "one too many"
			                    : "too long");
			return -1;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		if (units_parse_uint(item, 0, UINT32_MAX, &v) != 0) {
			fprintf(stderr, "k3pub: TOKENS \"%s\": item %u (\"%s\") is not a u32\n",
			        list, *n, item);
			return -1;
		}
		tokens[(*n)++] = (uint32_t)v;
		if (!end)
			return 0;
		p = end;
	}
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: k3pub SOCKET SPEC.json TOKENS [SALT [SEED [--restore]]]\n");
		return 2;
	}
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_load_file(argv[2], err);
	if (!m) {
		fprintf(stderr, "k3pub: %s\n", err);
		return 1;
	}
	static uint32_t tokens[65536 + 1];
	uint32_t n = 0;
	int rc;
	if (!strcmp(argv[3], "collide")) {
		uint32_t a, b;
		if (find_collision(m, &a, &b) != 0) {
			fprintf(stderr, "k3pub: no collision found\n");
			rc = 1;
		} else {
			uint32_t ta[5] = {a, a, 7, 7}, tb[5] = {b, b, 7, 7};
			rc = run_one(argv[1], m, ta, 4, "", 1, 0) ||
			     run_one(argv[1], m, tb, 4, "", 1, 0);
		}
		model_free(m);
		return rc;
	}
	uint64_t v;
	if (!strncmp(argv[3], "N:", 2)) {
		if (units_parse_uint(argv[3] + 2, 1, 65536, &v) != 0) {
			fprintf(stderr,
			        "k3pub: N:COUNT takes a COUNT from 1 to 65536, not \"%s\"\n",
			        argv[3] + 2);
			model_free(m);
			return 2;
		}
		n = (uint32_t)v;
		for (uint32_t i = 0; i < n; i++)
			tokens[i] = i + 1;
	} else if (parse_tokens(argv[3], tokens, 65536, &n) != 0) {
		model_free(m);
		return 2;
	}
	const char *salt = argc > 4 ? argv[4] : "";
	uint32_t seed = 1;
	if (argc > 5) {
		if (units_parse_uint(argv[5], 0, UINT32_MAX, &v) != 0) {
			fprintf(stderr, "k3pub: SEED takes a whole number, not \"%s\"\n", argv[5]);
			model_free(m);
			return 2;
		}
		seed = (uint32_t)v;
	}
	rc = run_one(argv[1], m, tokens, n, salt, seed, argc > 6 && !strcmp(argv[6], "--restore"));
	model_free(m);
	return rc;
}
