/* store_publish: validate outside any transaction, make room, then write each
 * entry whole in one transaction; entries larger than the stage size go to
 * store_staged.c instead. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "checksum.h"
#include "store_internal.h"
#include "store_txn.h"
#include "xxh_dispatch.h"

/* One request after validation. */
struct pending {
	const struct store_publish_req *req;
	struct store_publish_res *res;
	struct status *st;
	int ok;
	uint64_t *sums;
	uint8_t *tags;
	uint64_t *sizes;
	int staged; /* larger than the stage size: store_staged.c */
	int busy;   /* a staged publish of the same key is in progress */
};

int store_check_layer(const struct store_publish_req *r, const struct model_spec *m, uint32_t i,
                      uint64_t *sum, char message[STATUS_MESSAGE_MAX])
{
	const struct store_blob *b = &r->blobs[i];
	struct blob_error berr;
	if (blob_check_sum(b->data, b->size, m, i, r->n_tokens, sum, &berr) != BLOB_OK) {
		snprintf(message, STATUS_MESSAGE_MAX, "%.200s (%s)", berr.message,
		         blob_class_name(berr.cls));
		return -1;
	}
	if (b->xxh3 && b->xxh3 != *sum) {
		snprintf(message, STATUS_MESSAGE_MAX,
		         "layer %u: checksum mismatch: given %016llx, the bytes hash to %016llx", i,
		         (unsigned long long)b->xxh3, (unsigned long long)*sum);
		return -1;
	}
	return 0;
}

enum status_code store_check_publish(struct store *s, const struct store_publish_req *r,
                                     struct model_spec **model, uint64_t *total_out,
                                     uint8_t key[STORE_KEY_LEN], struct status *st)
{
	*model = NULL;
	if (r->n_tokens == 0)
		return status_set(st, STATUS_INVALID,
		                  "a snapshot covers at least one token (P >= 1)");
	if (r->salt_len > STORE_MAX_SALT)
		return status_set(st, STATUS_INVALID,
		                  "the salt is %zu bytes; at most %u are allowed", r->salt_len,
		                  STORE_MAX_SALT);
	struct model_spec *m = store_get_model(s, r->fingerprint, st);
	if (!m)
		return st && st->code != STATUS_OK ? st->code : STATUS_UNKNOWN_MODEL;
	if (r->n_blobs != m->n_layers) {
		enum status_code code = status_set(
		        st, STATUS_INVALID,
		        "the publish has %u layers; model %s has %u (every layer, once, in "
		        "index order)",
		        r->n_blobs, m->name, m->n_layers);
		model_free(m);
		return code;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < r->n_blobs; i++)
		total += r->blobs[i].size;
	if (total > s->opt.max_bytes) {
		model_free(m);
		return status_set(st, STATUS_TOO_LARGE,
		                  "the snapshot is %llu bytes; the store's capacity is %llu",
		                  (unsigned long long)total, (unsigned long long)s->opt.max_bytes);
	}
	if (prefix_key(r->fingerprint, r->salt, r->salt_len, r->tokens, r->n_tokens, key) != 0) {
		model_free(m);
		return status_set(st, STATUS_INTERNAL, "out of memory (computing the key)");
	}
	*model = m;
	*total_out = total;
	return STATUS_OK;
}

static enum status_code validate(struct store *s, struct pending *p)
{
	const struct store_publish_req *r = p->req;
	struct status *st = p->st;
	struct model_spec *m = NULL;
	uint64_t total = 0;
	enum status_code code = store_check_publish(s, r, &m, &total, p->res->key, st);
	if (code != STATUS_OK)
		return code;
	p->staged = total > s->opt.stage_bytes;
	if (p->staged) {
		/* checked whole by the stage's scan, beside the staged writes; the
		 * structure now, so that a malformed publish writes nothing */
		for (uint32_t i = 0; i < r->n_blobs; i++) {
			struct blob_view view;
			struct blob_error berr;
			if (blob_check_shape(r->blobs[i].data, r->blobs[i].size, m, i, r->n_tokens,
			                     &view, &berr) != BLOB_OK) {
				code = status_set(st, STATUS_INVALID, "%.200s (%s)", berr.message,
				                  blob_class_name(berr.cls));
				goto out;
			}
		}
		p->res->bytes = total;
		p->ok = 1;
		goto out;
	}
	p->sums = calloc(r->n_blobs ? r->n_blobs : 1, sizeof(*p->sums));
	p->tags = calloc(r->n_blobs ? r->n_blobs : 1, 1);
	p->sizes = calloc(r->n_blobs ? r->n_blobs : 1, sizeof(*p->sizes));
	if (!p->sums || !p->tags || !p->sizes) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < r->n_blobs; i++) {
		char message[STATUS_MESSAGE_MAX];
		if (store_check_layer(r, m, i, &p->sums[i], message) != 0) {
			code = status_set(st, STATUS_INVALID, "%s", message);
			goto out;
		}
		const struct store_blob *b = &r->blobs[i];
		p->tags[i] = ((const unsigned char *)b->data)[0];
		p->sizes[i] = b->size;
	}
	p->res->bytes = total;
	p->ok = 1;
out:
	model_free(m);
	return code;
}

void store_copy_stream(const struct store_publish_req *r, uint64_t off, unsigned char *dst,
                       size_t len)
{
	uint32_t i = 0;
	while (i < r->n_blobs && off >= r->blobs[i].size) {
		off -= r->blobs[i].size;
		i++;
	}
	while (len && i < r->n_blobs) {
		size_t take = (size_t)(r->blobs[i].size - off);
		if (take > len)
			take = len;
		memcpy(dst, (const unsigned char *)r->blobs[i].data + off, take);
		dst += take;
		len -= take;
		off = 0;
		i++;
	}
}

static int bump_node(struct store *s, MDB_txn *txn, const uint8_t *node)
{
	MDB_val k = {PREFIX_NODE_LEN, (void *)node}, v;
	uint32_t count = 0;
	int rc = mdb_get(txn, s->nodes, &k, &v);
	if (rc == 0 && v.mv_size == 4)
		count = store_get_be32(v.mv_data);
	else if (rc && rc != MDB_NOTFOUND)
		return rc;
	unsigned char b[4];
	store_be32(b, count + 1);
	MDB_val nv = {4, b};
	return mdb_put(txn, s->nodes, &k, &nv, 0);
}

int store_write_index(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                      const uint8_t *key, uint64_t bytes, const uint8_t *tags,
                      const uint64_t *sizes, const uint64_t *sums, struct store_totals *totals)
{
	uint64_t now = store_now(s);
	uint64_t seq = atomic_fetch_add(&s->lru_clock, 1) + 1;
	struct store_record rec = {
	        .prefix_len = r->n_tokens,
	        .n_layers = r->n_blobs,
	        .created = now,
	        .last_used = now,
	        .lru_seq = seq,
	        .bytes = bytes,
	        .salt_len = (uint32_t)r->salt_len,
	        .salt = r->salt,
	};
	memcpy(rec.key, key, STORE_KEY_LEN);
	memcpy(rec.fingerprint, r->fingerprint, MODEL_FINGERPRINT_LEN);
	size_t rlen = store_record_size(rec.salt_len, rec.n_layers);
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v = {rlen, NULL};
	int rc = mdb_put(txn, s->entries, &k, &v, MDB_NOOVERWRITE | MDB_RESERVE);
	if (rc)
		return rc;
	store_record_encode(&rec, tags, sizes, sums, v.mv_data);

	MDB_val tv = {(size_t)r->n_tokens * 4u, (void *)r->tokens};
	if ((rc = mdb_put(txn, s->tokens, &k, &tv, 0)) != 0)
		return rc;

	/* the prefix index */
	uint32_t depth = r->n_tokens / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	if (!h)
		return ENOMEM;
	prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, r->tokens, r->n_tokens, h);
	for (uint32_t d = 1; d <= depth && !rc; d++)
		rc = bump_node(s, txn, h[d]);
	if (!rc) {
		unsigned char av[STORE_ATTACH_LEN];
		store_be32(av, r->n_tokens);
		store_be64(av + 4, store_tail_hash(r->tokens, depth * PREFIX_BLOCK, r->n_tokens));
		memcpy(av + 12, key, STORE_KEY_LEN);
		MDB_val ak = {PREFIX_NODE_LEN, h[depth]}, avv = {sizeof(av), av};
		rc = mdb_put(txn, s->attach, &ak, &avv, 0);
	}
	free(h);
	if (rc)
		return rc;

	unsigned char lk[8 + STORE_KEY_LEN];
	store_be64(lk, seq);
	memcpy(lk + 8, key, STORE_KEY_LEN);
	MDB_val lkv = {sizeof(lk), lk}, empty = {0, NULL};
	if ((rc = mdb_put(txn, s->lru, &lkv, &empty, 0)) != 0)
		return rc;
	totals->bytes += bytes;
	return 0;
}

/* Writes one validated entry. MDB_KEYEXIST when it is already stored. */
static int write_entry(struct store *s, MDB_txn *txn, struct pending *p,
                       struct store_totals *totals)
{
	const struct store_publish_req *r = p->req;
	const uint8_t *key = p->res->key;
	int rc = store_write_index(s, txn, r, key, p->res->bytes, p->tags, p->sizes, p->sums,
	                           totals);
	if (rc)
		return rc;
	/* chunks: the layers end to end, cut into equal chunks */
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, key, STORE_KEY_LEN);
	uint64_t total = p->res->bytes;
	for (uint64_t off = 0, c = 0; off < total; off += STORE_CHUNK_DATA, c++) {
		size_t len =
		        (size_t)(total - off < STORE_CHUNK_DATA ? total - off : STORE_CHUNK_DATA);
		store_be32(ck + STORE_KEY_LEN, (uint32_t)c);
		MDB_val cvk = {sizeof(ck), ck}, cv = {len + 8, NULL};
		if ((rc = mdb_put(txn, s->chunks, &cvk, &cv, MDB_RESERVE)) != 0)
			return rc;
		unsigned char *dst = cv.mv_data;
		store_copy_stream(r, off, dst + 8, len);
		uint64_t sum = XXH3_64bits_withSeed(dst + 8, len, c);
		memcpy(dst, &sum, 8);
	}
	return 0;
}

int store_evict_lru(struct store *s, MDB_txn *txn, struct store_totals *totals, uint64_t target,
                    int dry_run, void (*fn)(const uint8_t *key, uint64_t bytes, void *ctx),
                    void *ctx, uint32_t *n_evicted)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->lru, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	uint64_t bytes = totals->bytes;
	/* Deleting takes the front row away, so a real eviction always reads the
	 * first row again; a dry run walks forward. */
	MDB_cursor_op op = MDB_FIRST;
	while (bytes > target && (rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
		op = dry_run ? MDB_NEXT : MDB_FIRST;
		uint8_t key[STORE_KEY_LEN];
		struct store_record r;
		int got =
		        k.mv_size == 8 + STORE_KEY_LEN
		                ? (memcpy(key, (const unsigned char *)k.mv_data + 8, STORE_KEY_LEN),
		                   store_read_record(s, txn, key, &r))
		                : MDB_NOTFOUND;
		if (got == -1) { /* damaged: removed all the same, so eviction goes on */
			uint64_t freed;
			if ((rc = store_chunk_bytes(s, txn, key, &freed)) != 0)
				break;
			if (fn)
				fn(key, freed, ctx);
			if (n_evicted)
				(*n_evicted)++;
			if (dry_run) {
				bytes = bytes >= freed ? bytes - freed : 0;
				continue;
			}
			if ((rc = store_delete_damaged(s, txn, key, totals)) != 0 ||
			    (rc = mdb_cursor_del(cur, 0)) != 0)
				break;
			bytes = totals->bytes; /* counted again from the records */
			atomic_fetch_add(&s->evictions, 1);
			continue;
		}
		if (got) {
			if (got != MDB_NOTFOUND) {
				rc = got;
				break;
			}
			if (!dry_run && (rc = mdb_cursor_del(cur, 0)) != 0)
				break; /* a stale LRU row: drop it */
			continue;
		}
		bytes = bytes >= r.bytes ? bytes - r.bytes : 0;
		if (fn)
			fn(key, r.bytes, ctx);
		if (n_evicted)
			(*n_evicted)++;
		if (dry_run)
			continue;
		if ((rc = store_delete_entry(s, txn, &r, totals)) != 0)
			break;
		atomic_fetch_add(&s->evictions, 1);
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Makes room for `need` more bytes, evicting least-recently-used entries in
 * their own transaction and committing one more small transaction after it, so
 * that the pages they freed are reusable by the next one (LMDB reuses pages
 * freed by transaction N from N+2). */
int store_make_room(struct store *s, uint64_t need, uint32_t *evicted, int force)
{
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return rc;
	struct store_totals t;
	if ((rc = store_apply_touches(s, txn)) || (rc = store_totals_get(s, txn, &t)))
		return store_txn_end(txn, rc);
	uint64_t target = s->opt.max_bytes >= need ? s->opt.max_bytes - need : 0;
	if (force) /* after a MAP_FULL: free at least `need` more than now */
		target = t.bytes >= need ? t.bytes - need : 0;
	uint32_t n = 0;
	if (t.bytes > target) {
		rc = store_evict_lru(s, txn, &t, target, 0, NULL, NULL, &n);
		if (!rc)
			rc = store_totals_put(s, txn, &t);
	}
	if ((rc = store_txn_end(txn, rc)) != 0)
		return rc;
	if (evicted)
		*evicted += n;
	if (force && n == 0)
		return MDB_MAP_FULL; /* nothing left to evict */
	if (n && (rc = store_txn_write(s, &txn)) == 0) {
		if (!(rc = store_totals_get(s, txn, &t)))
			rc = store_totals_put(s, txn, &t);
		rc = store_txn_end(txn, rc);
	}
	return rc;
}

enum status_code store_write_status(struct store *s, int rc, struct status *st)
{
	if (rc == STORE_MAP_PINNED)
		return status_set(st, STATUS_BUSY,
		                  "publish: the store's map is full and %d restore(s) in progress "
		                  "pin the pages eviction would free; retry shortly",
		                  (int)atomic_load(&s->open_snapshots));
	if (rc == MDB_MAP_FULL)
		return status_set(st, STATUS_FULL,
		                  "publish: the store is full and nothing is left to evict");
	return store_mdb_error(st, rc, "publish");
}

/* Records the outcome of a write for one request. */
static void set_outcome(struct store *s, struct pending *p, int rc, uint32_t evicted)
{
	if (!rc && p->busy) {
		status_set(p->st, STATUS_BUSY,
		           "another publish of this entry is in progress; retry shortly");
	} else if (rc) {
		store_write_status(s, rc, p->st);
	} else {
		p->res->evicted = evicted;
		atomic_fetch_add(p->res->created ? &s->publishes : &s->publish_exists, 1);
	}
}

static int write_all(struct store *s, struct pending *ps, uint32_t n)
{
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return rc;
	struct store_totals t;
	if ((rc = store_apply_touches(s, txn)) || (rc = store_totals_get(s, txn, &t)))
		return store_txn_end(txn, rc);
	for (uint32_t i = 0; i < n && !rc; i++) {
		if (!ps[i].ok || ps[i].staged)
			continue;
		if ((ps[i].busy = store_key_staging(s, txn, ps[i].res->key)) != 0)
			continue;
		rc = write_entry(s, txn, &ps[i], &t);
		if (rc == MDB_KEYEXIST) {
			/* stored already; but a quarantined copy is replaced */
			struct store_record old;
			if (store_read_record(s, txn, ps[i].res->key, &old) == 0 &&
			    (old.flags & STORE_FLAG_QUARANTINED) &&
			    (rc = store_delete_entry(s, txn, &old, &t)) == 0)
				rc = write_entry(s, txn, &ps[i], &t);
		}
		ps[i].res->created = rc == 0;
		if (rc == MDB_KEYEXIST)
			rc = 0;
	}
	uint64_t clock = atomic_load(&s->lru_clock);
	if (clock > t.lru_clock)
		t.lru_clock = clock;
	if (!rc)
		rc = store_totals_put(s, txn, &t);
	return store_txn_end(txn, rc);
}

/* Makes room for and writes a group of validated requests in one commit,
 * then records each one's outcome. */
static void write_group(struct store *s, struct pending *ps, uint32_t n)
{
	uint64_t need = 0;
	for (uint32_t i = 0; i < n; i++)
		if (ps[i].ok && !ps[i].staged)
			need += ps[i].res->bytes;
	int rc = 0;
	uint32_t evicted = 0;
	struct store_totals t;
	MDB_txn *rtxn;
	rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &rtxn);
	if (!rc) {
		/* entries already stored need no room */
		for (uint32_t i = 0; i < n; i++) {
			MDB_val k = {STORE_KEY_LEN, ps[i].res->key}, v;
			if (ps[i].ok && !ps[i].staged && mdb_get(rtxn, s->entries, &k, &v) == 0)
				need -= ps[i].res->bytes;
		}
		rc = store_totals_get(s, rtxn, &t);
		mdb_txn_abort(rtxn);
	}
	uint64_t staged = atomic_load(&s->staging_bytes); /* staged publishes' chunks */
	if (!rc && t.bytes + staged + need > s->opt.max_bytes)
		rc = store_make_room(s, staged + need, &evicted, 0);
	for (int tries = 0; !rc; tries++) {
		rc = write_all(s, ps, n);
		if (rc != MDB_MAP_FULL || tries >= STORE_MAP_FULL_TRIES)
			break;
		atomic_fetch_add(&s->map_full_retries, 1);
		/* Pages freed while a restore's read transaction is open stay pinned
		 * until it ends: evicting more would empty the store and still not
		 * make room. Say BUSY; the caller retries. */
		if (tries > 0 && atomic_load(&s->open_snapshots) > 0) {
			rc = STORE_MAP_PINNED;
			break;
		}
		rc = store_make_room(s, need, &evicted, 1);
	}
	for (uint32_t i = 0; i < n; i++)
		if (ps[i].ok && !ps[i].staged)
			set_outcome(s, &ps[i], rc, evicted);
}

/* A snapshot larger than the stage size, written in stages (store_staged.c). */
static void write_staged(struct store *s, struct pending *p)
{
	store_publish_staged(s, p->req, p->res, p->st);
}

enum status_code store_publish_batch(struct store *s, const struct store_publish_req *reqs,
                                     struct store_publish_res *res, struct status *sts, uint32_t n)
{
	enum status_code first = STATUS_OK;
	struct status dummy = {0};
	struct pending *ps = calloc(n ? n : 1, sizeof(*ps));
	if (!ps) {
		for (uint32_t i = 0; i < n; i++)
			status_set(sts ? &sts[i] : NULL, STATUS_INTERNAL, "out of memory");
		return STATUS_INTERNAL;
	}
	uint64_t need = 0;
	uint32_t valid = 0;
	for (uint32_t i = 0; i < n; i++) {
		memset(&res[i], 0, sizeof(res[i]));
		ps[i].req = &reqs[i];
		ps[i].res = &res[i];
		ps[i].st = sts ? &sts[i] : &dummy;
		ps[i].st->code = STATUS_OK;
		ps[i].st->message[0] = 0;
		if (s->opt.read_only) {
			status_set(ps[i].st, STATUS_UNSUPPORTED, "the store is open read-only");
			continue;
		}
		if (validate(s, &ps[i]) == STATUS_OK && !ps[i].staged) {
			need += res[i].bytes;
			valid++;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		if (ps[i].ok && ps[i].staged)
			write_staged(s, &ps[i]);
	if (valid > 1 && need > s->opt.max_bytes) {
		/* together they do not fit: one commit each, each making its own
		 * room, rather than evicting everything for a batch that cannot fit */
		for (uint32_t i = 0; i < n; i++)
			if (ps[i].ok && !ps[i].staged)
				write_group(s, &ps[i], 1);
	} else if (valid) {
		write_group(s, ps, n);
	}
	for (uint32_t i = 0; i < n; i++) {
		free(ps[i].sums);
		free(ps[i].tags);
		free(ps[i].sizes);
		if (ps[i].st->code != STATUS_OK && first == STATUS_OK)
			first = ps[i].st->code;
	}
	free(ps);
	return first;
}

enum status_code store_publish(struct store *s, const struct store_publish_req *req,
                               struct store_publish_res *res, struct status *st)
{
	struct status local;
	enum status_code code = store_publish_batch(s, req, res, &local, 1);
	if (st)
		*st = local;
	return code;
}
