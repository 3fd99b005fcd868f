/* publish: validate outside any transaction, make room, then write each
 * entry whole in one transaction; entries larger than the stage size go to
 * staged.c instead (store.h, "publish"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "check.h"
#include "chunks.h"
#include "entry.h"
#include "lru.h"
#include "pending.h"
#include "staged.h"
#include "txn.h"

/* One request after validation. */
struct pending {
	const struct store_publish_req *req;
	struct store_publish_res *res;
	struct status *st;
	int ok;
	uint64_t *sums;
	uint8_t *tags;
	uint64_t *sizes;
	int staged;          /* larger than the stage size: store_staged.c */
	int busy;            /* a staged publish of the same key is in progress */
	uint32_t mismatched; /* blocks stored already with other bytes */
	struct k3cache_model *m;
};

static enum status_code validate(struct store *s, struct pending *p)
{
	const struct store_publish_req *r = p->req;
	struct status *st = p->st;
	struct k3cache_model *m = NULL;
	uint64_t total = 0;
	enum status_code code = store_check_publish(s, r, &m, &total, p->res->key, st);
	if (code != STATUS_OK)
		return code;
	p->staged = total > s->opt.stage_bytes;
	if (p->staged) {
		/* checked whole by the stage's scan, beside the staged writes; the
		 * structure now, so that a malformed publish writes nothing */
		for (uint32_t i = 0; i < r->n_blobs; i++) {
			if (r->blobs[i].rows) /* assembled by a delta: checked then */
				continue;
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
		p->tags[i] = store_check_tag(b);
		p->sizes[i] = b->size;
	}
	p->res->bytes = total;
	p->ok = 1;
	p->m = m; /* to lay out its blocks */
	m = NULL;
out:
	model_free(m);
	return code;
}

/* Writes one validated entry. MDB_KEYEXIST when it is already stored. */
static int write_entry(struct store *s, MDB_txn *txn, struct pending *p,
                       struct store_totals *totals)
{
	const struct store_publish_req *r = p->req;
	const uint8_t *key = p->res->key;
	struct store_record old;
	int rc = store_record_read(s, txn, key, &old);
	if (rc == -1) /* a damaged record under the key: the new entry replaces it */
		rc = store_entry_delete_damaged(s, txn, key, totals);
	else if (rc != MDB_NOTFOUND) /* stored: take no block reference */
		return rc == 0 ? MDB_KEYEXIST : rc;
	if (rc && rc != MDB_NOTFOUND)
		return rc;
	/* a staged publish of it whose process died (write_all saw no live one)
	 * may have left chunks and held references under the key */
	uint64_t freed = 0;
	if ((rc = store_pending_reclaim(s, txn, key, &freed)) != 0)
		return rc;
	totals->bytes = totals->bytes >= freed ? totals->bytes - freed : 0;
	/* which rows are shared blocks, and what the entry's own chunks hold */
	struct store_entry_plan plan;
	if ((rc = store_entry_plan(s, r, p->m, &plan)) != 0)
		return rc;
	rc = store_entry_place(s, txn, key, &plan, store_entry_parts(&plan), 0);
	if (!rc)
		rc = store_entry_add(s, txn, r, key, p->res->bytes, p->tags, p->sizes, p->sums,
		                     &plan, totals);
	if (!rc) {
		struct store_stream stream = {plan.segs, plan.n_segs, plan.stream};
		rc = store_chunks_write(s, txn, key, &stream, 0, store_chunks_count(plan.stream),
		                        NULL);
	}
	p->mismatched = rc ? 0 : plan.now.mismatched;
	store_entry_plan_free(&plan);
	return rc;
}

/* Records the outcome of a write for one request. */
static void set_outcome(struct store *s, struct pending *p, int rc, uint32_t evicted)
{
	if (!rc && p->busy) {
		status_set(p->st, STATUS_BUSY,
		           "another publish of this entry is in progress; retry shortly");
	} else if (rc) {
		store_lru_write_status(s, rc, p->st);
	} else {
		p->res->evicted = evicted;
		atomic_fetch_add(p->res->created ? &s->publishes : &s->publish_exists, 1);
		if (p->res->created && p->mismatched)
			atomic_fetch_add(&s->blocks_mismatched, p->mismatched);
	}
}

static int write_all(struct store *s, struct pending *ps, uint32_t n)
{
	MDB_txn *txn;
	struct store_totals t;
	int rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n && !rc; i++) {
		if (!ps[i].ok || ps[i].staged)
			continue;
		if ((ps[i].busy = store_pending_busy(s, txn, ps[i].res->key)) != 0)
			continue;
		rc = write_entry(s, txn, &ps[i], &t);
		if (rc == MDB_KEYEXIST) {
			/* stored already; but a quarantined copy is replaced */
			struct store_record old;
			if (store_record_read(s, txn, ps[i].res->key, &old) == 0 &&
			    (old.flags & STORE_FLAG_QUARANTINED) &&
			    (rc = store_entry_delete(s, txn, &old, &t, NULL)) == 0)
				rc = write_entry(s, txn, &ps[i], &t);
		}
		ps[i].res->created = rc == 0;
		if (rc == MDB_KEYEXIST)
			rc = 0;
	}
	return store_lru_end(s, txn, &t, rc);
}

struct group {
	struct pending *ps;
	uint32_t n;
};

static int write_group_op(struct store *s, void *ctx)
{
	const struct group *g = ctx;
	return write_all(s, g->ps, g->n);
}

/* Makes room for and writes a group of validated requests in one commit,
 * then records each one's outcome. */
static void write_group(struct store *s, struct pending *ps, uint32_t n)
{
	uint64_t need = 0;
	for (uint32_t i = 0; i < n; i++)
		if (ps[i].ok && !ps[i].staged)
			need += ps[i].res->bytes;
	uint32_t evicted = 0;
	MDB_txn *rtxn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &rtxn);
	if (!rc) {
		/* entries already stored need no room */
		for (uint32_t i = 0; i < n; i++) {
			MDB_val k = {STORE_KEY_LEN, ps[i].res->key}, v;
			if (ps[i].ok && !ps[i].staged && mdb_get(rtxn, s->entries, &k, &v) == 0)
				need -= ps[i].res->bytes;
		}
		mdb_txn_abort(rtxn);
		rc = store_lru_room_for(s, need, &evicted);
	}
	struct group g = {ps, n};
	if (!rc)
		rc = store_lru_write(s, need, write_group_op, &g, &evicted);
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
		model_free(ps[i].m);
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
