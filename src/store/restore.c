/* restore: an entry's bytes as zero-copy views in the map, checked chunk by
 * chunk, and taking damaged entries out of service (store.h, "restore"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunks.h"
#include "entry.h"
#include "lru.h"
#include "record.h"
#include "restore.h"
#include "txn.h"
#include "xxh_dispatch.h"

struct store_snapshot_priv {
	struct store *s;
	MDB_txn *txn;
	struct store_segment *segs;
	struct store_segment *chunks; /* whole chunk values, for a deferred check */
	uint64_t n_chunks;
};

void store_snapshot_release(struct store_snapshot *snap)
{
	if (!snap)
		return;
	if (snap->priv) {
		mdb_txn_abort(snap->priv->txn);
		atomic_fetch_sub(&snap->priv->s->open_snapshots, 1);
		free(snap->priv->segs);
		free(snap->priv->chunks);
		free(snap->priv);
	}
	free(snap->layers);
	free(snap);
}

/* A damaged chunk found by a restore. A deferred restore (the daemon's loop
 * thread) takes no write transaction: its caller quarantines. */
static enum status_code corrupt(struct store *s, struct store_snapshot *snap, struct status *st,
                                const char *why, uint64_t chunk, int defer)
{
	uint8_t key[STORE_KEY_LEN];
	memcpy(key, snap->key, STORE_KEY_LEN);
	store_snapshot_release(snap);
	atomic_fetch_add(&s->corrupt, 1);
	if (defer)
		return status_set(st, STATUS_CORRUPT, "chunk %llu %s", (unsigned long long)chunk,
		                  why);
	char msg[STATUS_MESSAGE_MAX];
	snprintf(msg, sizeof(msg), "chunk %llu %s", (unsigned long long)chunk, why);
	store_quarantine_say(s, key, msg, sizeof(msg));
	return status_set(st, STATUS_CORRUPT, "%s", msg);
}

enum status_code store_restore(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_snapshot **out, struct status *st)
{
	return store_restore_opt(s, key, STORE_RESTORE_USE, out, st);
}

enum status_code store_snapshot_verify(struct store_snapshot *snap, struct status *st)
{
	struct store_snapshot_priv *priv = snap->priv;
	for (uint64_t c = 0; c < priv->n_chunks; c++) {
		const void *data;
		size_t len;
		if (store_snapshot_chunk(snap, c, &data, &len, st) != STATUS_OK) {
			atomic_fetch_add(&priv->s->corrupt, 1);
			char msg[STATUS_MESSAGE_MAX];
			snprintf(msg, sizeof(msg), "chunk %llu fails its checksum",
			         (unsigned long long)c);
			store_quarantine_say(priv->s, snap->key, msg, sizeof(msg));
			return status_set(st, STATUS_CORRUPT, "%s", msg);
		}
	}
	return STATUS_OK;
}

uint64_t store_snapshot_chunks(const struct store_snapshot *snap)
{
	return snap->priv->n_chunks;
}

enum status_code store_snapshot_chunk(const struct store_snapshot *snap, uint64_t i,
                                      const void **data, size_t *len, struct status *st)
{
	const struct store_snapshot_priv *priv = snap->priv;
	if (i >= priv->n_chunks) {
		*data = NULL;
		*len = 0;
		return status_set(st, STATUS_NOT_FOUND, "chunk %llu of %llu", (unsigned long long)i,
		                  (unsigned long long)priv->n_chunks);
	}
	const unsigned char *v = priv->chunks[i].data;
	*data = v + 8;
	*len = priv->chunks[i].len - 8;
	uint64_t sum;
	memcpy(&sum, v, 8);
	if (XXH3_64bits_withSeed(v + 8, *len, i) != sum)
		return status_set(st, STATUS_CORRUPT, "chunk %llu fails its checksum",
		                  (unsigned long long)i);
	return STATUS_OK;
}

enum status_code store_restore_opt(struct store *s, const uint8_t key[STORE_KEY_LEN],
                                   unsigned flags, struct store_snapshot **out, struct status *st)
{
	int use = (flags & STORE_RESTORE_USE) != 0, defer = (flags & STORE_RESTORE_DEFER) != 0;
	*out = NULL;
	struct store_snapshot *snap = calloc(1, sizeof(*snap));
	struct store_snapshot_priv *priv = calloc(1, sizeof(*priv));
	if (!snap || !priv) {
		free(snap);
		free(priv);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	snap->priv = priv;
	priv->s = s;
	memcpy(snap->key, key, STORE_KEY_LEN);
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &priv->txn);
	if (rc) {
		snap->priv = NULL;
		free(priv);
		store_snapshot_release(snap);
		return store_mdb_error(st, rc, "restore");
	}
	atomic_fetch_add(&s->open_snapshots, 1);
	struct store_record r;
	rc = store_record_read(s, priv->txn, key, &r);
	if (rc == MDB_NOTFOUND) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_NOT_FOUND, "no such entry");
	}
	if (rc) {
		store_snapshot_release(snap);
		atomic_fetch_add(&s->corrupt, 1);
		return status_set(st, STATUS_CORRUPT, "the entry's record is damaged");
	}
	if (r.flags & STORE_FLAG_QUARANTINED) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_NOT_FOUND,
		                  "the entry is quarantined (a checksum failed); evict it");
	}
	memcpy(snap->fingerprint, r.fingerprint, MODEL_FINGERPRINT_LEN);
	snap->prefix_len = r.prefix_len;
	snap->n_layers = r.n_layers;
	snap->bytes = r.bytes;
	uint64_t nchunks = (r.bytes + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA;
	snap->layers = calloc(r.n_layers, sizeof(*snap->layers));
	priv->segs = calloc((size_t)(nchunks + r.n_layers), sizeof(*priv->segs));
	if (defer) {
		priv->chunks = calloc((size_t)nchunks + 1, sizeof(*priv->chunks));
		priv->n_chunks = nchunks;
	}
	if (!snap->layers || !priv->segs || (defer && !priv->chunks)) {
		store_snapshot_release(snap);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	for (uint32_t i = 0; i < r.n_layers; i++) {
		struct store_layer *l = &snap->layers[i];
		l->index = i;
		store_record_layer(&r, i, &l->tag, &l->size, &l->xxh3);
	}

	/* walk the chunks in order, verifying each, and cut them into layers */
	uint32_t li = 0;
	uint64_t left_in_layer = snap->layers[0].size;
	size_t nseg = 0;
	snap->layers[0].segments = priv->segs;
	for (uint64_t c = 0; c < nchunks; c++) {
		uint64_t want = r.bytes - c * STORE_CHUNK_DATA;
		if (want > STORE_CHUNK_DATA)
			want = STORE_CHUNK_DATA;
		MDB_val v;
		rc = store_chunks_get(s, priv->txn, key, c, &v);
		if (rc == MDB_NOTFOUND)
			return corrupt(s, snap, st, "is missing", c, defer);
		if (rc) {
			store_snapshot_release(snap);
			return store_mdb_error(st, rc, "restore");
		}
		if (v.mv_size != want + 8)
			return corrupt(s, snap, st, "has the wrong size", c, defer);
		const unsigned char *data = (const unsigned char *)v.mv_data + 8;
		if (defer) {
			priv->chunks[c].data = v.mv_data;
			priv->chunks[c].len = v.mv_size;
		} else if (!store_chunks_intact(&v, c)) {
			return corrupt(s, snap, st, "fails its checksum", c, defer);
		}
		while (want) {
			while (left_in_layer == 0 && li + 1 < r.n_layers) {
				li++;
				left_in_layer = snap->layers[li].size;
				snap->layers[li].segments = priv->segs + nseg;
			}
			size_t take = (size_t)(want < left_in_layer ? want : left_in_layer);
			struct store_layer *l = &snap->layers[li];
			priv->segs[nseg].data = data;
			priv->segs[nseg].len = take;
			nseg++;
			l->n_segments++;
			data += take;
			want -= take;
			left_in_layer -= take;
		}
	}
	if (use) {
		atomic_fetch_add(&s->restores, 1);
		store_touch(s, key, 0); /* the lookup that found it counted the hit */
	}
	*out = snap;
	return STATUS_OK;
}

enum store_quarantine_result store_quarantine(struct store *s, const uint8_t key[STORE_KEY_LEN])
{
	if (s->opt.read_only)
		return STORE_QUARANTINE_NONE;
	MDB_txn *txn;
	if (store_txn_write(s, &txn))
		return STORE_QUARANTINE_NONE;
	enum store_quarantine_result done = STORE_QUARANTINE_FLAGGED;
	struct store_record r;
	int rc = store_record_read(s, txn, key, &r);
	if (rc == -1) {
		/* the record itself is damaged: there is no flag to set */
		struct store_totals t;
		done = STORE_QUARANTINE_REMOVED;
		if (!(rc = store_totals_get(s, txn, &t)) &&
		    !(rc = store_entry_delete_damaged(s, txn, key, &t)))
			rc = store_totals_put(s, txn, &t);
	} else if (rc == 0 && (r.flags & STORE_FLAG_QUARANTINED)) {
		rc = STORE_TXN_NOTHING;
	} else if (rc == 0) {
		r.flags |= STORE_FLAG_QUARANTINED;
		rc = store_record_rewrite(s, txn, &r);
	}
	if (store_txn_end(txn, rc) != 0)
		return STORE_QUARANTINE_NONE;
	atomic_fetch_add(&s->quarantined, 1);
	return done;
}

void store_quarantine_say(struct store *s, const uint8_t *key, char *why, size_t whysz)
{
	size_t n = strlen(why);
	const char *done;
	if (s->opt.read_only)
		done = "; not quarantined (the store is open read-only): with the daemon running, "
		       "k3cachectl verify quarantines it";
	else
		switch (store_quarantine(s, key)) {
		case STORE_QUARANTINE_FLAGGED:
			done = "; the entry is quarantined";
			break;
		case STORE_QUARANTINE_REMOVED:
			done = "; the entry is removed (its record cannot be read)";
			break;
		default:
			done = "; it could not be quarantined: evict it (k3cachectl evict KEY)";
			break;
		}
	snprintf(why + n, whysz - n, "%s", done);
}
