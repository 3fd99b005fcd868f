/* k3forge: a test helper that writes a forged entry into the second tier, as
 * a buggy or hostile writer with the cluster's credentials could: its chunk
 * and part sums all right, so that only the fetching daemon's store can
 * refuse it.
 * usage: k3forge SEEDS SPEC.json COUNT SALT FAULT
 *   the entry of the tokens 1..COUNT (k3pub's N:COUNT) of model SPEC and
 *   SALT, in the namespace k3cache, written with the default user;
 *   FAULT nan: the last float of the last layer is a NaN, every sum computed
 *              over the bytes as they are (the store's finite scan refuses
 *              it);
 *   FAULT sum: a valid entry whose record then gives the last layer another
 *              sum (every chunk and part still matches its own: the store's
 *              layer check refuses it once the layer has arrived).
 * Prints the key's first 16 hex digits; exits 0, or 1 saying why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "prefix.h"
#include "storeutil.h"
#include "tier2/cluster.h"
#include "tier2/tier2.h"
#include "units.h"

#define NS "k3cache"

/* Gives the record of key another sum for its last layer. 0, or -1. */
static int resum(struct cluster_router *r, const uint8_t *key, char *err, size_t errsz)
{
	char name[TIER2_NAME_MAX];
	size_t name_len = tier2_name_record(name, NS, key);
	const char *get[2] = {"GET", name};
	size_t get_len[2] = {3, name_len};
	redisReply *rep = NULL;
	if (cluster_command_argv(r, name, name_len, 2, get, get_len, &rep) != 0 ||
	    rep->type != REDIS_REPLY_STRING) {
		snprintf(err, errsz, "GET %s: %s", name, rep ? "not a string" : cluster_error(r));
		freeReplyObject(rep);
		return -1;
	}
	struct tier2_record rec;
	if (tier2_record_decode(rep->str, rep->len, &rec, err, errsz) != 0) {
		freeReplyObject(rep);
		return -1;
	}
	freeReplyObject(rep);
	struct tier2_layer *layers = malloc(rec.n_layers * sizeof(*layers));
	if (!layers) {
		snprintf(err, errsz, "out of memory");
		tier2_record_free(&rec);
		return -1;
	}
	memcpy(layers, rec.layers, rec.n_layers * sizeof(*layers));
	layers[rec.n_layers - 1].xxh3 ^= 1;
	rec.layers = layers;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = tier2_record_encode(&rec, &buf, &len, err, errsz);
	free(layers);
	tier2_record_free(&rec);
	if (rc != 0)
		return -1;
	const char *set[3] = {"SET", name, (const char *)buf};
	size_t set_len[3] = {3, name_len, len};
	rc = cluster_command_argv(r, name, name_len, 3, set, set_len, &rep);
	free(buf);
	if (rc != 0 || rep->type != REDIS_REPLY_STATUS) {
		snprintf(err, errsz, "SET %s: %s", name, rep ? "refused" : cluster_error(r));
		rc = -1;
	}
	freeReplyObject(rep);
	return rc;
}

int main(int argc, char **argv)
{
	uint64_t count;
	if (argc != 6 || units_parse_uint(argv[3], 1, 65536, &count) != 0 ||
	    (strcmp(argv[5], "nan") != 0 && strcmp(argv[5], "sum") != 0)) {
		fprintf(stderr, "usage: k3forge SEEDS SPEC.json COUNT SALT nan|sum\n");
		return 2;
	}
	char err[512] = "";
	struct k3cache_model *m = model_load_file(argv[2], err);
	if (!m) {
		fprintf(stderr, "k3forge: %s\n", err);
		return 1;
	}
	uint32_t n = (uint32_t)count;
	uint32_t *tokens = malloc(n * sizeof(*tokens));
	struct tier2_blob *blobs = calloc(m->n_layers, sizeof(*blobs));
	if (!tokens || !blobs) {
		fprintf(stderr, "k3forge: out of memory\n");
		free(tokens);
		free(blobs);
		model_free(m);
		return 1;
	}
	for (uint32_t i = 0; i < n; i++)
		tokens[i] = i + 1;
	struct storeutil_snap snap = storeutil_snap(m, n, 7);
	for (uint32_t i = 0; i < m->n_layers; i++)
		blobs[i] = (struct tier2_blob){snap.blobs[i].data, snap.blobs[i].size};
	if (!strcmp(argv[5], "nan")) {
		static const unsigned char nan_le[4] = {0x00, 0x00, 0xc0, 0x7f};
		struct tier2_blob *last = &blobs[m->n_layers - 1];
		memcpy((unsigned char *)last->data + last->size - 4, nan_le, 4);
	}
	struct cluster_options o = {.command_timeout_ms = 5000};
	struct cluster_router *r = cluster_router_new(argv[1], &o, err, sizeof(err));
	const char *salt = argv[4];
	struct tier2_put_options po = {.row_block = 64};
	enum tier2_status st = TIER2_NODE_ERROR;
	if (r)
		st = tier2_put(r, NS, m->fingerprint, salt, strlen(salt), tokens, n, blobs,
		               m->n_layers, &po, NULL, err, sizeof(err));
	uint8_t key[PREFIX_KEY_LEN];
	int rc = st == TIER2_OK &&
	         prefix_key(m->fingerprint, salt, strlen(salt), tokens, n, key) == 0 &&
	         (strcmp(argv[5], "sum") != 0 || resum(r, key, err, sizeof(err)) == 0);
	if (rc) {
		for (int i = 0; i < 8; i++)
			printf("%02x", key[i]);
		printf("\n");
	} else {
		fprintf(stderr, "k3forge: %s: %s\n", tier2_status_name(st), err);
	}
	cluster_router_free(r);
	storeutil_snap_free(&snap);
	free(blobs);
	free(tokens);
	model_free(m);
	return rc ? 0 : 1;
}
