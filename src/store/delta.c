/* delta: a publish that carries only the rows its base entry does not hold
 * (store.h, "delta publish"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "env.h"
#include "prefix.h"
#include "xxh_dispatch.h"

/* Copies bytes [off, off+len) of a restored layer (its views in the map). */
static int copy_range(const struct store_layer *l, uint64_t off, unsigned char *dst, size_t len)
{
	for (uint32_t j = 0; j < l->n_segments && len; j++) {
		const struct store_segment *g = &l->segments[j];
		if (off >= g->len) {
			off -= g->len;
			continue;
		}
		size_t take = (size_t)(g->len - off) < len ? (size_t)(g->len - off) : len;
		memcpy(dst, g->data + off, take);
		dst += take;
		len -= take;
		off = 0;
	}
	return len ? -1 : 0;
}

static void le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

void store_delta_free(struct store_delta *d)
{
	for (uint32_t i = 0; d->owned && i < d->n_owned; i++)
		free(d->owned[i]);
	free(d->owned);
	free(d->blobs);
	memset(d, 0, sizeof(*d));
}

/* Refuses the delta: the worker publishes whole instead. */
#define REFUSE(...) (*refused = 1, status_set(st, __VA_ARGS__))

enum status_code store_delta_assemble(struct store *s, const struct store_publish_req *req,
                                      const uint8_t base[STORE_KEY_LEN], uint32_t base_rows,
                                      struct store_delta *out, int *refused, struct status *st)
{
	memset(out, 0, sizeof(*out));
	*refused = 0;
	struct model_spec *m = store_get_model(s, req->fingerprint, st);
	if (!m)
		return st && st->code != STATUS_OK ? st->code : STATUS_UNKNOWN_MODEL;
	uint32_t p = req->n_tokens, n = req->n_blobs;
	struct store_snapshot *snap = NULL;
	enum status_code code = STATUS_OK;
	if (n != m->n_layers) {
		code = status_set(st, STATUS_INVALID, "delta publish: %u layers; model %s has %u",
		                  n, m->name, m->n_layers);
		goto out;
	}
	struct status bst;
	code = store_restore_opt(s, base, 0, &snap, &bst);
	if (code != STATUS_OK) {
		code = REFUSE(code == STATUS_NOT_FOUND ? STATUS_NOT_FOUND : code,
		              "delta publish: the base entry cannot serve: %s", bst.message);
		goto out;
	}
	uint32_t pb = snap->prefix_len;
	uint8_t key[STORE_KEY_LEN];
	if (pb > p || base_rows > pb) {
		code = REFUSE(
		        STATUS_INVALID,
		        "delta publish: the base holds %u tokens; this snapshot %u, from row %u",
		        pb, p, base_rows);
		goto out;
	}
	if (prefix_key(req->fingerprint, req->salt, req->salt_len, req->tokens, pb, key) != 0) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	if (memcmp(key, base, STORE_KEY_LEN) != 0) {
		code = REFUSE(
		        STATUS_INVALID,
		        "delta publish: the base is not this snapshot's first %u tokens under "
		        "this model and salt",
		        pb);
		goto out;
	}
	/* the whole MLA blobs are assembled in memory: bounded */
	uint64_t whole = 0;
	for (uint32_t i = 0; i < n; i++)
		if (m->layers[i].mixer == MODEL_MIXER_MLA)
			whole += 13 + (uint64_t)p * (m->layers[i].k_row + m->layers[i].v_row) * 4;
	if (whole > s->opt.delta_bytes) {
		code = REFUSE(STATUS_TOO_LARGE,
		              "delta publish: its MLA layers would be %llu bytes whole, over the "
		              "%llu a delta may assemble: publish whole",
		              (unsigned long long)whole, (unsigned long long)s->opt.delta_bytes);
		goto out;
	}
	out->blobs = calloc(n ? n : 1, sizeof(*out->blobs));
	out->owned = calloc(n ? n : 1, sizeof(*out->owned));
	if (!out->blobs || !out->owned) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	out->n_blobs = n;
	for (uint32_t i = 0; i < n; i++) {
		const struct model_layer *l = &m->layers[i];
		out->blobs[i] = req->blobs[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		uint64_t krow = (uint64_t)l->k_row * 4, vrow = (uint64_t)l->v_row * 4;
		const struct store_layer *bl = &snap->layers[i];
		if (req->blobs[i].size != (uint64_t)(p - base_rows) * (krow + vrow)) {
			code = REFUSE(
			        STATUS_INVALID,
			        "layer %u: a delta of rows %u to %u is %llu bytes, not %llu", i,
			        base_rows, p, (unsigned long long)req->blobs[i].size,
			        (unsigned long long)((uint64_t)(p - base_rows) * (krow + vrow)));
			goto out;
		}
		if (bl->tag != BLOB_TAG_MLA || bl->size != 13 + (uint64_t)pb * (krow + vrow)) {
			code = REFUSE(STATUS_INVALID,
			              "layer %u: the base's layer is not MLA of %u rows", i, pb);
			goto out;
		}
		uint64_t size = 13 + (uint64_t)p * (krow + vrow);
		unsigned char *b = malloc(size);
		if (!b) {
			code = status_set(st, STATUS_INTERNAL, "out of memory");
			goto out;
		}
		out->owned[out->n_owned++] = b;
		const unsigned char *d = req->blobs[i].data;
		uint64_t rk = (uint64_t)base_rows * krow, rv = (uint64_t)base_rows * vrow;
		b[0] = BLOB_TAG_MLA;
		le32(b + 1, p);
		le32(b + 5, p * l->k_row);
		unsigned char *k = b + 9, *v = b + 13 + (uint64_t)p * krow;
		le32(v - 4, p * l->v_row);
		if (copy_range(bl, 9, k, (size_t)rk) != 0 ||
		    copy_range(bl, 13 + (uint64_t)pb * krow, v, (size_t)rv) != 0) {
			code = REFUSE(STATUS_CORRUPT, "layer %u: the base's rows cannot be read",
			              i);
			goto out;
		}
		memcpy(k + rk, d, (size_t)((uint64_t)(p - base_rows) * krow));
		memcpy(v + rv, d + (uint64_t)(p - base_rows) * krow,
		       (size_t)((uint64_t)(p - base_rows) * vrow));
		uint64_t sum = XXH3_64bits_withSeed(b, (size_t)size, i);
		if (!req->blobs[i].xxh3 || sum != req->blobs[i].xxh3) {
			code = REFUSE(
			        STATUS_INVALID,
			        "layer %u: the base's rows and these make a blob that hashes to "
			        "%016llx, the publish says %016llx",
			        i, (unsigned long long)sum, (unsigned long long)req->blobs[i].xxh3);
			goto out;
		}
		out->blobs[i].data = b;
		out->blobs[i].size = size;
	}
out:
	store_snapshot_release(snap);
	model_free(m);
	if (code != STATUS_OK)
		store_delta_free(out);
	return code;
}
