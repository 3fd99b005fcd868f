/* restore: the read path. Lookup finds the longest stored prefix, and with
 * restore set sends it in the same round trip; Restore sends an entry by
 * key. Both answer with the snapshot's layer list, then stream its blobs
 * from the map by reference, a chunk at a time, each checked against its
 * stored sum just before it is queued (DESIGN: restores at the socket's
 * limit, never a byte known bad). Loop thread; a damaged entry is
 * quarantined by the writer. */
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

#define FEED_AHEAD (1u << 20) /* restore bytes queued ahead of the socket */

static int stream_snapshot(struct k3d_conn *c, frame_response *resp, struct store_snapshot *snap);

/* ---- answering ------------------------------------------------------------- */

/* Layer refs of a snapshot, for a restore's answer. */
static K3cache__V1__LayerRef **snapshot_refs(const struct store_snapshot *snap,
                                             K3cache__V1__LayerRef *storage)
{
	K3cache__V1__LayerRef **refs = calloc(snap->n_layers, sizeof(*refs));
	if (!refs)
		return NULL;
	for (uint32_t i = 0; i < snap->n_layers; i++) {
		k3cache__v1__layer_ref__init(&storage[i]);
		storage[i].index = i;
		storage[i].size = snap->layers[i].size;
		storage[i].xxh3 = snap->layers[i].xxh3;
		refs[i] = &storage[i];
	}
	return refs;
}

/* Answers with the snapshot's layer list and streams its blobs: 0, or -1
 * after answering BUSY. */
static int send_snapshot(struct k3d_conn *c, frame_response *resp, struct store_snapshot *snap)
{
	K3cache__V1__LayerRef *storage = calloc(snap->n_layers, sizeof(*storage));
	K3cache__V1__LayerRef **refs = storage ? snapshot_refs(snap, storage) : NULL;
	if (!refs) {
		free(storage);
		store_snapshot_release(snap);
		k3d_conn_errorf(c, STATUS_BUSY, "out of memory; retry later");
		return -1;
	}
	resp->layers = refs;
	resp->n_layers = snap->n_layers;
	resp->payload_len = snap->bytes;
	resp->model.data = snap->fingerprint;
	resp->model.len = 32;
	int rc = stream_snapshot(c, resp, snap);
	free(refs);
	free(storage);
	return rc;
}

static int restore_slot(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	if (srv->restores_active >= srv->cfg.max_restores) {
		k3d_conn_errorf(c, STATUS_BUSY, "%u restores are streaming already; retry shortly",
		                srv->restores_active);
		return 0;
	}
	uint32_t held = k3d_slots_held(&srv->slots, c->who.ns, c->who.ns_len);
	if (held >= srv->cfg.max_restores_per_tenant) {
		srv->restores_tenant_busy++;
		k3d_conn_errorf(
		        c, STATUS_BUSY,
		        "%s %s %u restore%s streaming, its share (--max-restores-per-tenant "
		        "%u of %u); retry shortly",
		        c->who.ns_len ? c->who.who : "the admins (one tenant)",
		        c->who.ns_len ? "has" : "have", held, held == 1 ? "" : "s",
		        srv->cfg.max_restores_per_tenant, srv->cfg.max_restores);
		return 0;
	}
	return 1;
}

/* A restore that failed on the loop thread: a damaged entry is quarantined by
 * the writer (a write may wait there, not here). */
static void restore_failed(struct k3d_conn *c, const uint8_t *key, struct status *st)
{
	if (st->code == STATUS_CORRUPT) {
		k3d_writer_quarantine(c->srv->writer, key);
		size_t n = strlen(st->message);
		snprintf(st->message + n, sizeof(st->message) - n,
		         "; the daemon takes the entry out of service");
	}
	k3d_conn_error(c, c->req->id, st);
}

/* The lookup of c's request in the local store: OK with res, or answered
 * with the error. */
static int lookup_local(struct k3d_conn *c, struct store_lookup_res *res, int quiet)
{
	const K3cache__V1__Lookup *l = c->req->lookup;
	struct store_lookup_req q = {l->model.data,         l->salt.data, l->salt.len, l->tokens,
	                             (uint32_t)l->n_tokens, l->limit,     quiet};
	if (l->n_tokens > UINT32_MAX) {
		k3d_conn_errorf(c, STATUS_INVALID, "lookup: too many tokens");
		return 0;
	}
	struct status st;
	if (store_lookup(c->srv->store, &q, res, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		return 0;
	}
	return 1;
}

/* Answers c's lookup with what the local store found, and the snapshot when
 * the request asks for it: the prefix answered (0: a miss, or an error). */
static uint32_t lookup_answer(struct k3d_conn *c, const struct store_lookup_res *res)
{
	const K3cache__V1__Lookup *l = c->req->lookup;
	struct status st;
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.prefix_len = res->prefix_len;
	r.hint = res->hint;
	r.bytes = res->bytes;
	if (res->prefix_len) {
		r.key.data = (uint8_t *)res->key;
		r.key.len = 32;
	}
	if (!l->restore || !res->prefix_len)
		return k3d_conn_queue(c, &r) ? res->prefix_len : 0; /* 0: a short answer went */
	if (!restore_slot(c))
		return 0;
	struct store_snapshot *snap;
	if (store_restore_opt(c->srv->store, res->key, STORE_RESTORE_USE | STORE_RESTORE_DEFER,
	                      &snap, &st) != STATUS_OK) {
		if (st.code == STATUS_NOT_FOUND) {
			/* evicted between the lookup and the restore: a miss */
			r.prefix_len = 0;
			r.key.len = 0;
			r.bytes = 0;
			k3d_conn_respond(c, &r);
		} else {
			restore_failed(c, res->key, &st);
		}
		return 0;
	}
	return send_snapshot(c, &r, snap) == 0 ? res->prefix_len : 0;
}

void k3d_op_lookup(struct k3d_conn *c)
{
	c->srv->last_lookup = k3d_now(); /* uploads yield for a while (--yield-rate) */
	struct store_lookup_res res;
	/* with a second tier the lookup counts once answered */
	int quiet = c->srv->t2 != NULL;
	if (!lookup_local(c, &res, quiet))
		return;
	/* a longer prefix may be in the second tier: c waits for it (t2.h) */
	if (k3d_t2_lookup(c, &res))
		return;
	if (quiet)
		store_lookup_count(c->srv->store, &res);
	(void)lookup_answer(c, &res);
}

uint32_t k3d_lookup_resume(struct k3d_conn *c)
{
	struct store_lookup_res res;
	uint32_t p = 0;
	if (lookup_local(c, &res, 0))
		p = lookup_answer(c, &res);
	k3d_conn_answered(c);
	return p;
}

void k3d_op_restore(struct k3d_conn *c)
{
	if (!restore_slot(c))
		return;
	struct store_snapshot *snap;
	struct status st;
	int own = c->req->restore->key.len == 32 ? k3d_owns_entry(c, c->req->restore->key.data, &st)
	                                         : 1;
	if (own < 0) {
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	if (!own) {
		k3d_conn_errorf(c, STATUS_NOT_FOUND, "no such entry"); /* the store's words */
		return;
	}
	unsigned flags = STORE_RESTORE_DEFER | (c->req->restore->peek ? 0u : STORE_RESTORE_USE);
	if (store_restore_opt(c->srv->store, c->req->restore->key.data, flags, &snap, &st) !=
	    STATUS_OK) {
		restore_failed(c, c->req->restore->key.data, &st);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.key.data = snap->key;
	r.key.len = 32;
	r.prefix_len = snap->prefix_len;
	r.bytes = snap->bytes;
	(void)send_snapshot(c, &r, snap);
}

/* ---- streaming the blobs ---------------------------------------------------- */

void k3d_stream_unref(struct k3d_stream *st)
{
	if (--st->refs > 0)
		return;
	st->srv->restores_active--;
	k3d_slots_give(&st->srv->slots, st->ns, st->ns_len);
	store_snapshot_release(st->snap);
	free(st);
}

/* A chunk failed its check on the way out: the writer thread verifies the
 * whole restore again (a write may wait there, not here) and quarantines the
 * entry and, for a shared block, every entry that uses it. */
static void verify_later(struct k3d_conn *c, struct k3d_stream *ref)
{
	struct k3d_job *job = calloc(1, sizeof(*job));
	if (!job)
		return; /* the entry is damaged all the same: the next restore finds it */
	k3cache__v1__response__init(&job->resp);
	job->chore = K3D_CHORE_VERIFY;
	job->stream = ref;
	ref->refs++;
	k3d_writer_submit(c->srv->writer, job);
}

/* The restore being sent has no more chunks to queue: requests are read
 * again (once its last bytes are out). */
static void end_sending(struct k3d_conn *c)
{
	c->sending = NULL;
	if (c->state == K3D_SENDING)
		k3d_conn_set_state(c, K3D_READ_LEN);
}

static void release_snapshot(const void *data, size_t len, void *arg)
{
	(void)data;
	(void)len;
	k3d_stream_unref(arg);
}

/* A restore cut short keeps its snapshot (the read transaction) until the
 * connection's output is freed: the chunks queued before the cut point into
 * the map by reference, with no cleanup of their own, and must not be sent
 * from pages the writer has reused meanwhile. */
static void hold_cut(struct k3d_conn *c, struct k3d_stream *ref)
{
	if (c->cut) /* one cut per connection: it closes */
		k3d_stream_unref(c->cut);
	c->cut = ref;
}

/* A piece of the restore failed its check: nothing known bad is sent. When
 * no byte of the answer has gone out yet, the queued answer is taken back and
 * CORRUPT goes instead. Otherwise the connection ends once the pieces queued
 * before this one (all checked) are out, so that the client sees the payload
 * cut short, never an OK with bad bytes. The writer quarantines the entry
 * either way. */
static void refuse_damaged(struct k3d_conn *c, struct k3d_stream *ref, struct status *st)
{
	verify_later(c, ref);
	end_sending(c);
	if (c->written <= c->send_from) {
		uint64_t earlier = c->send_from - c->written; /* bytes of earlier answers */
		struct evbuffer *head = evbuffer_new();
		if (head && evbuffer_remove_buffer(c->out, head, (size_t)earlier) == (int)earlier) {
			evbuffer_drain(c->out, evbuffer_get_length(c->out));
			evbuffer_add_buffer(c->out, head);
			evbuffer_free(head);
			k3d_stream_unref(ref);
			size_t n = strlen(st->message);
			snprintf(st->message + n, sizeof(st->message) - n,
			         "; the daemon takes the entry out of service");
			k3d_conn_error(c, c->send_id, st);
			return;
		}
		if (head)
			evbuffer_free(head);
	}
	c->srv->restores_cut++;
	k3d_log(K3D_LOG_WARN,
	        "conn %llu (%s): restore: %s, after %llu bytes of the answer went out: "
	        "closing the connection",
	        (unsigned long long)c->id, c->peer, st->message,
	        (unsigned long long)(c->written - c->send_from));
	hold_cut(c, ref);
	k3d_conn_set_state(c, K3D_CLOSING);
}

/* Queues the restore's next chunks until FEED_AHEAD bytes wait to be sent,
 * checking each just before it is queued: the check reads the chunk from the
 * map into the cache, and the send then copies it from there. A chunk that
 * fails is never queued (refuse_damaged). When the last chunk is queued the
 * connection's reference goes with it, to be dropped once it has been sent. */
void k3d_restore_feed(struct k3d_conn *c)
{
	while (c->sending && evbuffer_get_length(c->out) < FEED_AHEAD) {
		struct k3d_stream *ref = c->sending;
		uint64_t n = store_snapshot_chunks(ref->snap);
		if (c->send_chunk >= n) { /* nothing (more) to queue */
			end_sending(c);
			k3d_stream_unref(ref);
			return;
		}
		uint64_t i = c->send_chunk++;
		const void *data;
		size_t len;
		struct status st;
		if (store_snapshot_chunk(ref->snap, i, &data, &len, &st) != STATUS_OK) {
			refuse_damaged(c, ref, &st);
			return;
		}
		int last = c->send_chunk == n;
		if (last)
			end_sending(c);
		if (evbuffer_add_reference(c->out, data, len, last ? release_snapshot : NULL,
		                           last ? ref : NULL) != 0) {
			/* out of memory: the answer cannot be finished; the client
			 * sees the connection close mid-payload */
			k3d_log(K3D_LOG_WARN, "conn %llu (%s): restore: out of memory",
			        (unsigned long long)c->id, c->peer);
			end_sending(c);
			hold_cut(c, ref);
			k3d_conn_set_state(c, K3D_CLOSING);
			return;
		}
	}
}

/* Answers resp (for c), then streams the blobs of snap (taken with
 * STORE_RESTORE_DEFER) from the map, a chunk at a time: each chunk is checked
 * against its stored sum just before it is queued. A chunk that fails is
 * never sent: if no byte of the answer has gone, CORRUPT goes instead;
 * otherwise the connection ends after the checked chunks (restores_cut).
 * The writer thread quarantines the entry. The snapshot is released when
 * the last byte has been sent. 0 once the answer is queued, -1 when an error
 * (or nothing) went instead. */
static int stream_snapshot(struct k3d_conn *c, frame_response *resp, struct store_snapshot *snap)
{
	struct k3d_stream *ref = malloc(sizeof(*ref));
	if (ref && k3d_slots_take(&c->srv->slots, c->who.ns, c->who.ns_len) != 0) {
		free(ref);
		ref = NULL;
	}
	if (!ref) {
		store_snapshot_release(snap);
		struct status st;
		status_set(&st, STATUS_BUSY, "out of memory; retry later");
		k3d_conn_error(c, resp->id, &st);
		return -1;
	}
	ref->srv = c->srv;
	ref->snap = snap;
	ref->refs = 1; /* the connection's, until the last chunk is queued */
	memcpy(ref->ns, c->who.ns, c->who.ns_len);
	ref->ns_len = c->who.ns_len;
	c->srv->restores_active++;
	if (snap->bytes && !store_snapshot_chunks(snap)) {
		/* not taken with STORE_RESTORE_DEFER: no chunks to send */
		k3d_stream_unref(ref);
		struct status st;
		status_set(&st, STATUS_INTERNAL, "restore: the snapshot has no chunk list");
		k3d_conn_error(c, resp->id, &st);
		return -1;
	}
	c->send_from = c->written + evbuffer_get_length(c->out);
	if (!k3d_conn_queue(c, resp)) {
		k3d_stream_unref(ref); /* a short answer went instead: no payload */
		return -1;
	}
	c->sending = ref;
	c->send_chunk = 0;
	c->send_id = resp->id;
	k3d_conn_set_state(c, K3D_SENDING);
	k3d_restore_feed(c);
	k3d_conn_want_write(c);
	return 0;
}
