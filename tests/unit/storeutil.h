/* Helpers for the store tests: models, deterministic snapshots, temp dirs. */
#ifndef K3_STOREUTIL_H
#define K3_STOREUTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmdb.h>

#include "blob.h"
#include "checksum.h"
#include "model.h"
#include "store.h"
#include "store/env.h"

/* A small hybrid: KDA, KDA, MLA, KDA of the given KDA recurrent size. */
static inline struct k3cache_model *storeutil_model(const char *name, uint32_t recurrent)
{
	const struct model_layer layers[] = {
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = recurrent},
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = recurrent},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 6, .v_row = 4},
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = recurrent},
	};
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_new(name, "test", "test-layout", layers, 4, err);
	if (!m)
		abort();
	return m;
}

struct storeutil_snap {
	uint32_t n;
	unsigned char **bufs;
	struct store_blob *blobs;
};

/* Blobs for every layer of m at prefix length p; values depend on seed. */
static inline struct storeutil_snap storeutil_snap(const struct k3cache_model *m, uint32_t p,
                                                   uint32_t seed)
{
	struct storeutil_snap s = {m->n_layers, calloc(m->n_layers, sizeof(unsigned char *)),
	                           calloc(m->n_layers, sizeof(struct store_blob))};
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		size_t n0 = l->mixer == MODEL_MIXER_KDA ? l->conv_len : (size_t)p * l->k_row;
		size_t n1 = l->mixer == MODEL_MIXER_KDA ? l->recurrent_len : (size_t)p * l->v_row;
		float *f = malloc((n0 + n1 + 1) * sizeof(float));
		for (size_t j = 0; j < n0 + n1; j++) {
			/* a mix, so no run of values repeats across seeds or layers */
			uint32_t x = seed * 0x9E3779B1u + i * 0x85EBCA77u + (uint32_t)j;
			x ^= x >> 15;
			x *= 0x2C1B3C6Du;
			x ^= x >> 12;
			f[j] = (float)(x % 100003u) * 1e-3f;
		}
		struct blob_view v = {.tag = (enum blob_tag)l->mixer,
		                      .seq_len = l->mixer == MODEL_MIXER_MLA ? p : 0,
		                      .v0 = {(const unsigned char *)f, (uint32_t)n0},
		                      .v1 = {(const unsigned char *)(f + n0), (uint32_t)n1}};
		size_t len = blob_encoded_size(&v);
		s.bufs[i] = malloc(len);
		blob_encode(&v, s.bufs[i]);
		s.blobs[i].data = s.bufs[i];
		s.blobs[i].size = len;
		s.blobs[i].xxh3 = checksum_blob(s.bufs[i], len, i);
		free(f);
	}
	return s;
}

/* A turn of a conversation: MLA rows depend only on (rows_seed, layer, row,
 * column), so turns of one prompt hold the same rows and share blocks; the
 * KDA state depends on the seed. */
static inline struct storeutil_snap storeutil_conv_snap(const struct k3cache_model *m, uint32_t p,
                                                        uint32_t rows_seed, uint32_t seed)
{
	struct storeutil_snap s = storeutil_snap(m, p, seed);
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		struct blob_view v;
		if (blob_parse(s.bufs[i], s.blobs[i].size, &v, NULL) != BLOB_OK)
			abort();
		unsigned char *rows[2] = {s.bufs[i] + (v.v0.data - s.bufs[i]),
		                          s.bufs[i] + (v.v1.data - s.bufs[i])};
		for (uint32_t r = 0; r < p; r++)
			for (uint32_t part = 0; part < 2; part++) {
				uint32_t w = part ? l->v_row : l->k_row;
				for (uint32_t c = 0; c < w; c++) {
					uint32_t x = rows_seed * 0x9E3779B1u + i * 0x85EBCA77u +
					             r * 131u + c * 7u + part * 0x27d4eb2du;
					x ^= x >> 15;
					x *= 0x2C1B3C6Du;
					float f = (float)(x % 100003u) * 1e-3f;
					memcpy(rows[part] + ((size_t)r * w + c) * 4, &f, 4);
				}
			}
		s.blobs[i].xxh3 = checksum_blob(s.bufs[i], s.blobs[i].size, i);
	}
	return s;
}

static inline void storeutil_snap_free(struct storeutil_snap *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		free(s->bufs[i]);
	free(s->bufs);
	free(s->blobs);
}

static inline char *storeutil_tmpdir(void)
{
	char tmpl[] = "/tmp/k3store-test-XXXXXX";
	char *d = mkdtemp(tmpl);
	if (!d)
		abort();
	return strdup(d);
}

static inline int storeutil_rm_one(const char *path, const struct stat *sb, int flag,
                                   struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* Removes a temporary store (rm -rf, without a shell) and frees the name. */
static inline void storeutil_rmdir(char *dir)
{
	nftw(dir, storeutil_rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(dir);
}

/* Publishes a snapshot of tokens[0..p) (seed = seed). Returns the status
 * code, and its message in *status. */
static inline enum status_code storeutil_publish_st(struct store *st, const struct k3cache_model *m,
                                                    const char *salt, const uint32_t *tokens,
                                                    uint32_t p, uint32_t seed,
                                                    struct store_publish_res *res,
                                                    struct status *status)
{
	struct storeutil_snap s = storeutil_snap(m, p, seed);
	struct store_publish_req req = {m->fingerprint, salt, strlen(salt), tokens, p,
	                                s.blobs,        s.n};
	struct store_publish_res local;
	enum status_code code = store_publish(st, &req, res ? res : &local, status);
	if (code != STATUS_OK)
		fprintf(stderr, "publish: %s\n", status->message);
	storeutil_snap_free(&s);
	return code;
}

/* Publishes a snapshot of tokens[0..p) (seed = seed). Returns the status code. */
static inline enum status_code storeutil_publish(struct store *st, const struct k3cache_model *m,
                                                 const char *salt, const uint32_t *tokens,
                                                 uint32_t p, uint32_t seed,
                                                 struct store_publish_res *res)
{
	struct status status;
	return storeutil_publish_st(st, m, salt, tokens, p, seed, res, &status);
}

static inline uint32_t storeutil_lookup(struct store *st, const struct k3cache_model *m,
                                        const char *salt, const uint32_t *tokens, uint32_t n,
                                        uint32_t limit, struct store_lookup_res *res)
{
	struct store_lookup_req req = {m->fingerprint, salt, strlen(salt), tokens, n, limit, 0};
	struct store_lookup_res local = {0};
	struct store_lookup_res *r = res ? res : &local;
	if (store_lookup(st, &req, r, NULL) != STATUS_OK)
		abort();
	return r->prefix_len;
}

/* The shared-block references held now (by staged publishes under way):
 * none once every publish has ended, however it ended; UINT64_MAX when the
 * store cannot be read. */
static inline uint64_t storeutil_refs_held(struct store *st)
{
	MDB_txn *txn;
	MDB_stat ms = {0};
	if (mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn) != 0)
		return UINT64_MAX;
	int rc = mdb_stat(txn, st->held, &ms);
	mdb_txn_abort(txn);
	return rc ? UINT64_MAX : ms.ms_entries;
}

#endif
