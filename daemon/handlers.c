/* handlers: one function per op. Reads of the store run here on the loop
 * thread (LMDB readers never wait for the writer); writes go to the writer
 * thread. Every answer echoes the request id. */
#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "daemon.h"
#include "hexutil.h"
#include "model.h"

#define LIST_DEFAULT 1000u
#define LIST_MAX     100000u

static void respond_status(struct k3d_conn *c, enum status_code code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void respond_status(struct k3d_conn *c, enum status_code code, const char *fmt, ...)
{
	struct status st;
	va_list ap;
	va_start(ap, fmt);
	st.code = code;
	vsnprintf(st.message, sizeof(st.message), fmt, ap);
	va_end(ap);
	k3d_conn_error(c, c->req->id, &st);
}

static void done(struct k3d_conn *c)
{
	/* a request answered on the loop thread: ready for the next one */
	free(c->payload);
	c->payload = NULL;
	frame_request_free(c->req);
	c->req = NULL;
	c->plen = c->pgot = 0;
	c->hlen = c->hgot = 0;
	c->state = K3D_READ_LEN;
}

/* ---- conversions ----------------------------------------------------------- */

static struct model_spec *spec_from_wire(const K3cache__V1__ModelSpec *w, char *err)
{
	if (!w->n_layers) {
		snprintf(err, MODEL_ERROR_MAX, "the model has no layers");
		return NULL;
	}
	if (w->n_layers > MODEL_MAX_LAYERS) {
		snprintf(err, MODEL_ERROR_MAX, "the model has %zu layers; at most %u", w->n_layers,
		         MODEL_MAX_LAYERS);
		return NULL;
	}
	struct model_layer *l = calloc(w->n_layers, sizeof(*l));
	if (!l) {
		snprintf(err, MODEL_ERROR_MAX, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < w->n_layers; i++) {
		const K3cache__V1__LayerSpec *ls = w->layers[i];
		l[i].mixer = (enum model_mixer)ls->mixer;
		l[i].conv_len = ls->conv_len;
		l[i].recurrent_len = ls->recurrent_len;
		l[i].k_row = ls->k_row;
		l[i].v_row = ls->v_row;
	}
	struct model_spec *m =
	        model_new(w->name, w->revision, w->state_layout, l, (uint32_t)w->n_layers, err);
	free(l);
	return m;
}

static K3cache__V1__ModelSpec *spec_to_wire(const struct model_spec *m)
{
	K3cache__V1__ModelSpec *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	k3cache__v1__model_spec__init(w);
	w->name = strdup(m->name);
	w->revision = strdup(m->revision);
	w->state_layout = strdup(m->state_layout);
	w->layers = calloc(m->n_layers, sizeof(*w->layers));
	if (w->layers)
		w->n_layers = m->n_layers;
	for (size_t i = 0; i < w->n_layers; i++) {
		K3cache__V1__LayerSpec *ls = calloc(1, sizeof(*ls));
		if (!ls)
			continue;
		k3cache__v1__layer_spec__init(ls);
		ls->mixer = (K3cache__V1__Mixer)m->layers[i].mixer;
		ls->conv_len = m->layers[i].conv_len;
		ls->recurrent_len = m->layers[i].recurrent_len;
		ls->k_row = m->layers[i].k_row;
		ls->v_row = m->layers[i].v_row;
		w->layers[i] = ls;
	}
	return w;
}

static void free_wire_spec(K3cache__V1__ModelSpec *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_layers; i++)
		free(w->layers[i]);
	free(w->layers);
	free(w->name);
	free(w->revision);
	free(w->state_layout);
	free(w);
}

static K3cache__V1__EntryInfo *entry_to_wire(struct k3d_server *srv,
                                             const struct store_entry_info *e, int with_tokens)
{
	K3cache__V1__EntryInfo *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	k3cache__v1__entry_info__init(w);
	w->key.data = malloc(32);
	w->model.data = malloc(32);
	w->salt.data = malloc(e->salt_len + 1u);
	if (w->key.data) {
		memcpy(w->key.data, e->key, 32);
		w->key.len = 32;
	}
	if (w->model.data) {
		memcpy(w->model.data, e->fingerprint, 32);
		w->model.len = 32;
	}
	if (w->salt.data) {
		memcpy(w->salt.data, e->salt, e->salt_len);
		w->salt.len = e->salt_len;
	}
	w->prefix_len = e->prefix_len;
	w->layer_count = e->n_layers;
	w->bytes = e->bytes;
	w->created = e->created;
	w->last_used = e->last_used;
	w->hits = e->hits;
	w->quarantined = e->quarantined;
	struct model_spec *m = store_get_model(srv->store, e->fingerprint, NULL);
	w->model_name = strdup(m ? m->name : "?");
	model_free(m);
	if (with_tokens) {
		w->layers = calloc(e->n_layers, sizeof(*w->layers));
		if (w->layers)
			w->n_layers = e->n_layers;
		for (uint32_t i = 0; i < w->n_layers; i++) {
			K3cache__V1__LayerInfo *li = calloc(1, sizeof(*li));
			if (!li)
				continue;
			k3cache__v1__layer_info__init(li);
			li->index = i;
			li->mixer = (K3cache__V1__Mixer)e->layers[i].tag;
			li->size = e->layers[i].size;
			li->xxh3 = e->layers[i].xxh3;
			w->layers[i] = li;
		}
		if (e->tokens && (w->tokens = malloc((size_t)e->prefix_len * 4u)) != NULL) {
			memcpy(w->tokens, e->tokens, (size_t)e->prefix_len * 4u);
			w->n_tokens = e->prefix_len;
		}
	}
	return w;
}

static void free_wire_entry(K3cache__V1__EntryInfo *w)
{
	if (!w)
		return;
	free(w->key.data);
	free(w->model.data);
	free(w->salt.data);
	free(w->model_name);
	for (size_t i = 0; i < w->n_layers; i++)
		free(w->layers[i]);
	free(w->layers);
	free(w->tokens);
	free(w);
}

static void free_entries(frame_response *r)
{
	for (size_t i = 0; i < r->n_entries; i++)
		free_wire_entry(r->entries[i]);
	free(r->entries);
	r->entries = NULL;
	r->n_entries = 0;
}

static int add_entry(frame_response *r, K3cache__V1__EntryInfo *e)
{
	if (!e)
		return -1;
	K3cache__V1__EntryInfo **n = realloc(r->entries, (r->n_entries + 1) * sizeof(*n));
	if (!n) {
		free_wire_entry(e);
		return -1;
	}
	r->entries = n;
	r->entries[r->n_entries++] = e;
	return 0;
}

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

/* Answers with the snapshot's layer list and streams its blobs. */
static void send_snapshot(struct k3d_conn *c, frame_response *resp, struct store_snapshot *snap)
{
	K3cache__V1__LayerRef *storage = calloc(snap->n_layers, sizeof(*storage));
	K3cache__V1__LayerRef **refs = storage ? snapshot_refs(snap, storage) : NULL;
	if (!refs) {
		free(storage);
		store_snapshot_release(snap);
		respond_status(c, STATUS_BUSY, "out of memory; retry later");
		return;
	}
	resp->layers = refs;
	resp->n_layers = snap->n_layers;
	resp->payload_len = snap->bytes;
	resp->model.data = snap->fingerprint;
	resp->model.len = 32;
	k3d_conn_stream_snapshot(c, resp, snap);
	free(refs);
	free(storage);
}

static int restore_slot(struct k3d_conn *c)
{
	if (c->srv->restores_active >= c->srv->cfg.max_restores) {
		respond_status(c, STATUS_BUSY, "%u restores are streaming already; retry shortly",
		               c->srv->restores_active);
		return 0;
	}
	return 1;
}

/* ---- ops on the loop thread ------------------------------------------------- */

static void op_hello(struct k3d_conn *c)
{
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.protocol = 1;
	r.server = (char *)K3D_VERSION;
	if (c->req->hello->protocol != 0 && c->req->hello->protocol != 1) {
		r.code = K3CACHE__V1__CODE__UNSUPPORTED;
		r.message = (char *)"this daemon speaks protocol 1";
	}
	k3d_conn_respond(c, &r);
}

static void op_lookup(struct k3d_conn *c)
{
	const K3cache__V1__Lookup *l = c->req->lookup;
	struct store_lookup_req q = {l->model.data, l->salt.data,          l->salt.len,
	                             l->tokens,     (uint32_t)l->n_tokens, l->limit};
	if (l->n_tokens > UINT32_MAX) {
		respond_status(c, STATUS_INVALID, "lookup: too many tokens");
		return;
	}
	struct store_lookup_res res;
	struct status st;
	if (store_lookup(c->srv->store, &q, &res, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.prefix_len = res.prefix_len;
	r.hint = res.hint;
	r.bytes = res.bytes;
	if (res.prefix_len) {
		r.key.data = res.key;
		r.key.len = 32;
	}
	if (!l->restore || !res.prefix_len) {
		k3d_conn_respond(c, &r);
		return;
	}
	if (!restore_slot(c))
		return;
	struct store_snapshot *snap;
	if (store_restore(c->srv->store, res.key, &snap, &st) != STATUS_OK) {
		if (st.code == STATUS_NOT_FOUND) {
			/* evicted between the lookup and the restore: a miss */
			r.prefix_len = 0;
			r.key.len = 0;
			r.bytes = 0;
			k3d_conn_respond(c, &r);
		} else {
			k3d_conn_error(c, c->req->id, &st);
		}
		return;
	}
	send_snapshot(c, &r, snap);
}

static void op_restore(struct k3d_conn *c)
{
	if (!restore_slot(c))
		return;
	struct store_snapshot *snap;
	struct status st;
	if (store_restore(c->srv->store, c->req->restore->key.data, &snap, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.key.data = snap->key;
	r.key.len = 32;
	r.prefix_len = snap->prefix_len;
	r.bytes = snap->bytes;
	send_snapshot(c, &r, snap);
}

struct list_ctx {
	struct k3d_server *srv;
	frame_response *r;
	int failed;
};

static int list_cb(const struct store_entry_info *info, void *arg)
{
	struct list_ctx *lc = arg;
	if (add_entry(lc->r, entry_to_wire(lc->srv, info, 0)) != 0) {
		lc->failed = 1;
		return 1;
	}
	return 0;
}

static void op_list(struct k3d_conn *c)
{
	const K3cache__V1__List *l = c->req->list;
	uint32_t limit = l->limit ? l->limit : LIST_DEFAULT;
	if (limit > LIST_MAX)
		limit = LIST_MAX;
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	struct list_ctx lc = {c->srv, &r, 0};
	struct status st;
	if (store_list(c->srv->store, l->model.len ? l->model.data : NULL,
	               l->after.len ? l->after.data : NULL, limit, list_cb, &lc,
	               &st) != STATUS_OK) {
		free_entries(&r);
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	if (lc.failed) {
		free_entries(&r);
		respond_status(c, STATUS_INTERNAL, "out of memory while listing");
		return;
	}
	k3d_conn_respond(c, &r);
	free_entries(&r);
}

static void op_inspect(struct k3d_conn *c)
{
	struct store_entry_info *info;
	struct status st;
	if (store_inspect(c->srv->store, c->req->inspect->key.data, &info, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	add_entry(&r, entry_to_wire(c->srv, info, 1));
	store_entry_info_free(info);
	k3d_conn_respond(c, &r);
	free_entries(&r);
}

static void op_resolve(struct k3d_conn *c)
{
	uint8_t key[32];
	struct status st;
	const char *prefix = c->req->resolve->prefix ? c->req->resolve->prefix : "";
	if (store_resolve_key(c->srv->store, prefix, key, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.key.data = key;
	r.key.len = 32;
	k3d_conn_respond(c, &r);
}

struct models_ctx {
	frame_response *r;
};

static int models_cb(const struct model_spec *spec, void *arg)
{
	frame_response *r = ((struct models_ctx *)arg)->r;
	K3cache__V1__ModelSpec **n = realloc(r->models, (r->n_models + 1) * sizeof(*n));
	if (!n)
		return 1;
	r->models = n;
	if ((r->models[r->n_models] = spec_to_wire(spec)) != NULL)
		r->n_models++;
	return 0;
}

static void op_list_models(struct k3d_conn *c)
{
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	struct models_ctx mc = {&r};
	struct status st;
	enum status_code code = store_list_models(c->srv->store, models_cb, &mc, &st);
	if (code != STATUS_OK)
		k3d_conn_error(c, c->req->id, &st);
	else
		k3d_conn_respond(c, &r);
	for (size_t i = 0; i < r.n_models; i++)
		free_wire_spec(r.models[i]);
	free(r.models);
}

static void op_stat(struct k3d_conn *c)
{
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	k3d_fill_counters(c->srv, &r);
	k3d_conn_respond(c, &r);
	k3d_free_counters(&r);
}

/* ---- ops for the writer ------------------------------------------------------ */

static void to_writer(struct k3d_conn *c)
{
	struct k3d_job *job = calloc(1, sizeof(*job));
	if (!job) {
		respond_status(c, STATUS_BUSY, "out of memory; retry later");
		return;
	}
	job->conn = c;
	job->req = c->req;
	job->payload = c->payload;
	job->plen = c->plen;
	job->t_request = c->t_request;
	/* the job owns request and payload now; the reservation stays with the
	 * connection until the job is done */
	c->req = NULL;
	c->payload = NULL;
	c->state = K3D_BUSY;
	k3d_writer_submit(c->srv->writer, job);
}

void k3d_handle(struct k3d_conn *c)
{
	switch (c->req->op_case) {
	case K3CACHE__V1__REQUEST__OP_PUT_MODEL:
	case K3CACHE__V1__REQUEST__OP_PUBLISH:
	case K3CACHE__V1__REQUEST__OP_EVICT:
	case K3CACHE__V1__REQUEST__OP_VERIFY:
		if (c->srv->stopping) {
			respond_status(c, STATUS_BUSY, "the daemon is shutting down");
			break;
		}
		to_writer(c);
		return; /* answered when the writer hands the job back */
	case K3CACHE__V1__REQUEST__OP_HELLO:
		op_hello(c);
		break;
	case K3CACHE__V1__REQUEST__OP_LOOKUP:
		op_lookup(c);
		break;
	case K3CACHE__V1__REQUEST__OP_RESTORE:
		op_restore(c);
		break;
	case K3CACHE__V1__REQUEST__OP_LIST:
		op_list(c);
		break;
	case K3CACHE__V1__REQUEST__OP_INSPECT:
		op_inspect(c);
		break;
	case K3CACHE__V1__REQUEST__OP_STAT:
		op_stat(c);
		break;
	case K3CACHE__V1__REQUEST__OP_LIST_MODELS:
		op_list_models(c);
		break;
	case K3CACHE__V1__REQUEST__OP_RESOLVE:
		op_resolve(c);
		break;
	default:
		respond_status(c, STATUS_UNSUPPORTED, "unknown op");
		break;
	}
	done(c);
}

/* ---- the writer's side: run in the writer thread ------------------------------ */

static void evicted_cb(const uint8_t key[32], uint64_t bytes, void *arg)
{
	struct k3d_job *job = arg;
	uint8_t(*nk)[32] = realloc(job->evicted_keys, (job->n_evicted + 1) * 32);
	uint64_t *nb = realloc(job->evicted_bytes, (job->n_evicted + 1) * sizeof(uint64_t));
	if (nk)
		job->evicted_keys = nk;
	if (nb)
		job->evicted_bytes = nb;
	if (!nk || !nb)
		return;
	memcpy(job->evicted_keys[job->n_evicted], key, 32);
	job->evicted_bytes[job->n_evicted++] = bytes;
}

void k3d_writer_run_one(struct k3d_server *srv, struct k3d_job *job);

void k3d_writer_run_one(struct k3d_server *srv, struct k3d_job *job)
{
	frame_request *req = job->req;
	job->st.code = STATUS_OK;
	job->st.message[0] = 0;
	switch (req->op_case) {
	case K3CACHE__V1__REQUEST__OP_PUT_MODEL: {
		char err[MODEL_ERROR_MAX];
		struct model_spec *m = spec_from_wire(req->put_model->model, err);
		if (!m) {
			status_set(&job->st, STATUS_INVALID, "model spec: %s", err);
			return;
		}
		memcpy(job->fingerprint, m->fingerprint, 32);
		store_put_model(srv->store, m, &job->created, &job->st);
		model_free(m);
		return;
	}
	case K3CACHE__V1__REQUEST__OP_EVICT: {
		const K3cache__V1__Evict *e = req->evict;
		uint8_t(*keys)[32] = e->n_keys ? calloc(e->n_keys, 32) : NULL;
		for (size_t i = 0; keys && i < e->n_keys; i++)
			memcpy(keys[i], e->keys[i].data, 32);
		struct store_evict_req q = {
		        .keys = (const uint8_t(*)[32])keys,
		        .n_keys = keys ? (uint32_t)e->n_keys : 0,
		        .model = e->model.len ? e->model.data : NULL,
		        .idle_seconds = e->idle_seconds,
		        .to_bytes_set = e->to_bytes != 0, /* down to 0 bytes is --all */
		        .to_bytes = e->to_bytes,
		        .all = e->all,
		        .dry_run = e->dry_run,
		};
		store_evict(srv->store, &q, evicted_cb, job, &job->ev, &job->st);
		free(keys);
		return;
	}
	case K3CACHE__V1__REQUEST__OP_VERIFY:
	default:
		return; /* verify and publish are run by the writer itself */
	}
}
