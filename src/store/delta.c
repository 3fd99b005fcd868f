/* delta: a publish that carries only the rows its base entry does not hold
 * (store.h, "delta publish"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "check.h"
#include "env.h"
#include "prefix.h"
#include "record.h"
#include "xxh_dispatch.h"

/* Appends the pieces of bytes [off, off+len) of a restored layer (its views
 * in the map) to *out. -1 when the layer is shorter. */
static int view_range(const struct store_layer *l, uint64_t off, uint64_t len,
                      struct store_segment *out, uint32_t *n)
{
	for (uint32_t j = 0; j < l->n_segments && len; j++) {
		const struct store_segment *g = &l->segments[j];
		if (off >= g->len) {
			off -= g->len;
			continue;
		}
		size_t take = (size_t)(g->len - off) < len ? (size_t)(g->len - off) : (size_t)len;
		out[(*n)++] = (struct store_segment){g->data + off, take};
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
	for (uint32_t i = 0; d->pieces && i < d->n_blobs; i++)
		free(d->pieces[i]);
	free(d->pieces);
	free(d->rows);
	free(d->known);
	free(d->blobs);
	store_snapshot_release(d->base);
	memset(d, 0, sizeof(*d));
}

/* A copy of the base record's map (NULL when it shares nothing), its bytes
 * per MLA layer and its row block. 0, or -1 when out of memory. */
static int base_map(struct store *s, const uint8_t *base, unsigned char **map, uint32_t *per,
                    uint32_t *rb)
{
	*map = NULL;
	MDB_txn *txn;
	if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) != 0)
		return 0; /* no hint: every block is compared */
	struct store_record r;
	int rc = 0;
	if (store_record_read(s, txn, base, &r) == 0 && r.row_block && r.map_len) {
		*map = malloc(r.map_len);
		if (*map) {
			memcpy(*map, r.map, r.map_len);
			*per = store_record_map_bytes(r.prefix_len, r.row_block);
			*rb = r.row_block;
		} else {
			rc = -1;
		}
	}
	mdb_txn_abort(txn);
	return rc;
}

/* The XXH3 of an assembled layer, as checksum_blob() of its bytes whole. */
static uint64_t rows_sum(const struct store_rows *r, uint32_t layer, XXH3_state_t *hs)
{
	XXH3_64bits_reset_withSeed(hs, layer);
	XXH3_64bits_update(hs, r->head, sizeof(r->head));
	for (uint32_t j = 0; j < r->n_k; j++)
		XXH3_64bits_update(hs, r->k[j].data, r->k[j].len);
	XXH3_64bits_update(hs, r->vcount, sizeof(r->vcount));
	for (uint32_t j = 0; j < r->n_v; j++)
		XXH3_64bits_update(hs, r->v[j].data, r->v[j].len);
	return XXH3_64bits_digest(hs);
}

/* Refuses the delta: the worker publishes whole instead. */
#define REFUSE(...) (*refused = 1, status_set(st, __VA_ARGS__))

enum status_code store_delta_sum_refused(struct store *s, const uint8_t base[STORE_KEY_LEN],
                                         const char *message, struct status *st)
{
	/* the worker's rows, or the base's? A restore that checks every piece
	 * (not deferred) decides, and quarantines what it finds damaged */
	struct store_snapshot *chk = NULL;
	struct status cst;
	enum status_code code = store_restore_opt(s, base, 0, &chk, &cst);
	store_snapshot_release(chk);
	if (code == STATUS_OK)
		return status_set(st, STATUS_INVALID,
		                  "%.150s; the base entry's stored bytes hold their checksums, so "
		                  "these rows or their sum are wrong",
		                  message);
	if (code == STATUS_CORRUPT)
		return status_set(st, STATUS_CORRUPT,
		                  "delta publish: the base entry is damaged on disk: %.150s; "
		                  "publish the whole snapshot",
		                  cst.message);
	return status_set(st, STATUS_INVALID, "%.130s (the base entry could not be checked: %.80s)",
	                  message, cst.message);
}

/* Checks a fresh layer whose bytes are all in: its new rows finite, the
 * assembled blob's sum the given one (on a mismatch, sum_message says so
 * and *check_base is set: the base decides the answer). */
static enum status_code check_fresh(const struct store_rows *r, uint32_t i, uint64_t given,
                                    XXH3_state_t *hs, uint64_t *sum, int *refused, int *check_base,
                                    char sum_message[STATUS_MESSAGE_MAX], struct status *st)
{
	char message[STATUS_MESSAGE_MAX];
	if (store_check_rows_finite(r, i, 0, r->fresh, r->fresh_k / 4, 0, message) != 0 ||
	    store_check_rows_finite(r, i, 1, r->fresh + r->fresh_k, r->fresh_v / 4, 0, message) !=
	            0)
		return status_set(st, STATUS_INVALID, "%s", message);
	*sum = rows_sum(r, i, hs);
	if (store_check_delta_sum(i, *sum, given, sum_message) != 0) {
		*check_base = 1; /* the worker's rows, or the base's? */
		return REFUSE(STATUS_INVALID, "%s", sum_message);
	}
	return STATUS_OK;
}

static enum status_code assemble(struct store *s, const struct store_publish_req *req,
                                 const uint8_t base[STORE_KEY_LEN], uint32_t base_rows, int unread,
                                 struct store_delta *out, int *refused, struct status *st)
{
	memset(out, 0, sizeof(*out));
	*refused = 0;
	struct k3cache_model *m = store_get_model(s, req->fingerprint, st);
	if (!m)
		return st && st->code != STATUS_OK ? st->code : STATUS_UNKNOWN_MODEL;
	uint32_t p = req->n_tokens, n = req->n_blobs;
	struct store_snapshot *snap = NULL;
	XXH3_state_t *hs = NULL;
	enum status_code code = STATUS_OK;
	int check_base = 0;
	char sum_message[STATUS_MESSAGE_MAX] = "";
	if (n != m->n_layers) {
		code = status_set(st, STATUS_INVALID, "delta publish: %u layers; model %s has %u",
		                  n, m->name, m->n_layers);
		goto out;
	}
	struct status bst;
	/* deferred: no piece is checked here; the assembled blobs are, end to
	 * end, against the sums the worker computed over them */
	code = store_restore_opt(s, base, STORE_RESTORE_DEFER, &snap, &bst);
	if (code == STATUS_INTERNAL) { /* out of memory, say: nothing wrong with the delta */
		code = status_set(st, code, "delta publish: reading the base entry: %s",
		                  bst.message);
		goto out;
	}
	if (code != STATUS_OK && code != STATUS_NOT_FOUND) {
		code = REFUSE(code, "delta publish: the base entry cannot serve: %s", bst.message);
		goto out;
	}
	/* An entry that is not a prefix of this snapshot under its model and
	 * salt (so, with tenancy, any entry of another tenant) is answered as
	 * one that is not there, in the same words: nothing tells a publisher
	 * whether a key it guessed exists. */
	uint32_t pb = snap ? snap->prefix_len : 0;
	uint8_t key[STORE_KEY_LEN];
	int mine = snap && pb <= p;
	if (mine &&
	    prefix_key(req->fingerprint, req->salt, req->salt_len, req->tokens, pb, key) != 0) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	if (!mine || memcmp(key, base, STORE_KEY_LEN) != 0) {
		code = REFUSE(STATUS_NOT_FOUND,
		              "delta publish: no base entry with this key is a prefix of this "
		              "snapshot under this model and salt");
		goto out;
	}
	if (base_rows > pb) {
		code = REFUSE(
		        STATUS_INVALID,
		        "delta publish: the base holds %u tokens; this snapshot %u, from row %u",
		        pb, p, base_rows);
		goto out;
	}
	out->blobs = calloc(n ? n : 1, sizeof(*out->blobs));
	out->rows = calloc(n ? n : 1, sizeof(*out->rows));
	out->pieces = calloc(n ? n : 1, sizeof(*out->pieces));
	hs = XXH3_createState();
	if (!out->blobs || !out->rows || !out->pieces || !hs) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	out->n_blobs = n;
	memcpy(out->base_key, base, STORE_KEY_LEN);
	for (uint32_t i = 0; i < n; i++)
		if (m->layers[i].mixer == MODEL_MIXER_MLA &&
		    (uint64_t)p * (m->layers[i].k_row > m->layers[i].v_row ? m->layers[i].k_row
		                                                           : m->layers[i].v_row) >
		            UINT32_MAX) {
			code = status_set(st, STATUS_INVALID,
			                  "layer %u: %u rows do not fit the blob's 32-bit counts",
			                  i, p);
			goto out;
		}
	uint32_t known_per = 0, known_rb = 0;
	if (base_map(s, base, &out->known, &known_per, &known_rb) != 0) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	for (uint32_t i = 0, mla = 0; i < n; i++) {
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
		/* k: the base's first base_rows rows, then the new ones; v the same */
		struct store_segment *pc = calloc((size_t)bl->n_segments * 2 + 2, sizeof(*pc));
		if (!pc) {
			code = status_set(st, STATUS_INTERNAL, "out of memory");
			goto out;
		}
		out->pieces[i] = pc;
		struct store_rows *r = &out->rows[i];
		const unsigned char *d = req->blobs[i].data;
		uint64_t nk = (uint64_t)(p - base_rows) * krow;
		uint32_t c = 0;
		r->k = pc;
		if (view_range(bl, 9, (uint64_t)base_rows * krow, pc, &c) != 0)
			goto unreadable;
		if (nk)
			pc[c++] = (struct store_segment){d, (size_t)nk};
		r->n_k = c;
		r->v = pc + c;
		if (view_range(bl, 13 + (uint64_t)pb * krow, (uint64_t)base_rows * vrow, pc, &c) !=
		    0)
			goto unreadable;
		uint64_t nvb = (uint64_t)(p - base_rows) * vrow;
		if (nvb)
			pc[c++] = (struct store_segment){d + nk, (size_t)nvb};
		r->n_v = (uint32_t)(c - r->n_k);
		r->head[0] = BLOB_TAG_MLA;
		le32(r->head + 1, p);
		le32(r->head + 5, p * l->k_row);
		le32(r->vcount, p * l->v_row);
		if (out->known && known_rb) { /* the base's blocks wholly among its rows */
			r->base = base;
			r->known = out->known + (size_t)mla * known_per;
			r->n_known = base_rows / known_rb;
			r->row_block = known_rb;
			r->base_sum = bl->xxh3;
		}
		r->fresh = d;
		r->fresh_k = nk;
		r->fresh_v = nvb;
		r->first_row = base_rows;
		r->k_row = l->k_row;
		r->v_row = l->v_row;
		r->base_key = out->base_key;
		r->unread = unread;
		mla++;
		if (!req->blobs[i].xxh3) {
			code = REFUSE(
			        STATUS_INVALID,
			        "layer %u: a delta's MLA layer needs the whole blob's checksum", i);
			goto out;
		}
		/* the new rows are checked here (or, unread, by the staged scan);
		 * the base's were when it was stored, and any damage since fails
		 * the sum */
		uint64_t sum = req->blobs[i].xxh3;
		if (!unread && (code = check_fresh(r, i, req->blobs[i].xxh3, hs, &sum, refused,
		                                   &check_base, sum_message, st)) != STATUS_OK)
			goto out;
		out->blobs[i] = (struct store_blob){.data = NULL,
		                                    .size = 13 + (uint64_t)p * (krow + vrow),
		                                    .xxh3 = sum,
		                                    .rows = r};
		continue;
	unreadable:
		code = REFUSE(STATUS_CORRUPT, "layer %u: the base's rows cannot be read", i);
		goto out;
	}
	out->base = snap; /* its rows are the assembled layers' */
	snap = NULL;
out:
	XXH3_freeState(hs);
	store_snapshot_release(snap);
	/* the restore above checked nothing (deferred): the base's own sums
	 * tell whose bytes were wrong (and a damaged base goes out of service) */
	if (check_base)
		code = store_delta_sum_refused(s, base, sum_message, st);
	model_free(m);
	if (code != STATUS_OK)
		store_delta_free(out);
	return code;
}

enum status_code store_delta_assemble(struct store *s, const struct store_publish_req *req,
                                      const uint8_t base[STORE_KEY_LEN], uint32_t base_rows,
                                      struct store_delta *out, int *refused, struct status *st)
{
	return assemble(s, req, base, base_rows, 0, out, refused, st);
}

enum status_code store_delta_assemble_unread(struct store *s, const struct store_publish_req *req,
                                             const uint8_t base[STORE_KEY_LEN], uint32_t base_rows,
                                             struct store_delta *out, int *refused,
                                             struct status *st)
{
	return assemble(s, req, base, base_rows, 1, out, refused, st);
}
