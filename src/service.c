#include "service.h"
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_DEFAULT 1000u
#define LIST_MAX     10000u /* keeps an answer well under the 16 MiB header limit */

void service_fail(frame_response *resp, const struct status *st)
{
	resp->code = (K3cache__V1__Code)st->code;
	if (resp->message && resp->message != protobuf_c_empty_string)
		free(resp->message);
	resp->message = strdup(st->message);
	if (!resp->message)
		resp->message = (char *)protobuf_c_empty_string;
}

static void fail_oom(frame_response *resp)
{
	struct status st;
	status_set(&st, STATUS_INTERNAL, "out of memory");
	service_fail(resp, &st);
}

/* ---- model specs ---------------------------------------------------------- */

struct k3cache_model *service_spec_from_wire(const K3cache__V1__ModelSpec *w, char *err)
{
	if (!w || !w->n_layers) {
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
	struct k3cache_model *m =
	        model_new(w->name, w->revision, w->state_layout, l, (uint32_t)w->n_layers, err);
	free(l);
	return m;
}

K3cache__V1__ModelSpec *service_spec_to_wire(const struct k3cache_model *m)
{
	K3cache__V1__ModelSpec *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	k3cache__v1__model_spec__init(w);
	w->name = strdup(m->name);
	w->revision = strdup(m->revision);
	w->state_layout = strdup(m->state_layout);
	w->layers = calloc(m->n_layers, sizeof(*w->layers));
	if (!w->name || !w->revision || !w->state_layout || !w->layers) {
		service_free_spec(w);
		return NULL;
	}
	for (size_t i = 0; i < m->n_layers; i++) {
		K3cache__V1__LayerSpec *ls = calloc(1, sizeof(*ls));
		if (!ls) {
			service_free_spec(w);
			return NULL;
		}
		k3cache__v1__layer_spec__init(ls);
		ls->mixer = (K3cache__V1__Mixer)m->layers[i].mixer;
		ls->conv_len = m->layers[i].conv_len;
		ls->recurrent_len = m->layers[i].recurrent_len;
		ls->k_row = m->layers[i].k_row;
		ls->v_row = m->layers[i].v_row;
		w->layers[w->n_layers++] = ls;
	}
	return w;
}

void service_free_spec(K3cache__V1__ModelSpec *w)
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

static void service_put_model(struct store *s, const K3cache__V1__PutModel *op,
                              frame_response *resp)
{
	char err[MODEL_ERROR_MAX];
	struct status st;
	struct k3cache_model *m = service_spec_from_wire(op->model, err);
	if (!m) {
		status_set(&st, STATUS_INVALID, "model spec: %s", err);
		service_fail(resp, &st);
		return;
	}
	int created = 0;
	if (store_put_model(s, m, &created, &st) != STATUS_OK) {
		service_fail(resp, &st);
	} else if ((resp->fingerprint.data = malloc(32)) != NULL) {
		memcpy(resp->fingerprint.data, m->fingerprint, 32);
		resp->fingerprint.len = 32;
		resp->created = created;
	}
	model_free(m);
}

/* ---- entries -------------------------------------------------------------- */

static int dup_bytes(ProtobufCBinaryData *b, const void *src, size_t len)
{
	b->data = malloc(len ? len : 1);
	if (!b->data)
		return -1;
	if (len)
		memcpy(b->data, src, len);
	b->len = len;
	return 0;
}

static void free_entry(K3cache__V1__EntryInfo *w)
{
	if (!w)
		return;
	free(w->key.data);
	free(w->model.data);
	free(w->salt.data);
	if (w->model_name != protobuf_c_empty_string)
		free(w->model_name);
	for (size_t i = 0; i < w->n_layers; i++)
		free(w->layers[i]);
	free(w->layers);
	free(w->tokens);
	free(w);
}

static K3cache__V1__EntryInfo *entry_to_wire(struct store *s, const struct store_entry_info *e,
                                             int full)
{
	K3cache__V1__EntryInfo *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	k3cache__v1__entry_info__init(w);
	if (dup_bytes(&w->key, e->key, 32) || dup_bytes(&w->model, e->fingerprint, 32) ||
	    dup_bytes(&w->salt, e->salt, e->salt_len)) {
		free_entry(w);
		return NULL;
	}
	w->prefix_len = e->prefix_len;
	w->layer_count = e->n_layers;
	w->bytes = e->bytes;
	w->stored = e->stored;
	w->mla_rows = e->mla_rows;
	w->shared_rows = e->shared_rows;
	w->created = e->created;
	w->last_used = e->last_used;
	w->hits = e->hits;
	w->quarantined = e->quarantined;
	struct k3cache_model *m = store_get_model(s, e->fingerprint, NULL);
	w->model_name = strdup(m ? m->name : "?");
	model_free(m);
	if (!w->model_name) {
		w->model_name = (char *)protobuf_c_empty_string;
		free_entry(w);
		return NULL;
	}
	if (!full)
		return w;
	w->layers = calloc(e->n_layers ? e->n_layers : 1, sizeof(*w->layers));
	if (!w->layers) {
		free_entry(w);
		return NULL;
	}
	for (uint32_t i = 0; i < e->n_layers; i++) {
		K3cache__V1__LayerInfo *li = calloc(1, sizeof(*li));
		if (!li) {
			free_entry(w);
			return NULL;
		}
		k3cache__v1__layer_info__init(li);
		li->index = i;
		li->mixer = (K3cache__V1__Mixer)e->layers[i].tag;
		li->size = e->layers[i].size;
		li->xxh3 = e->layers[i].xxh3;
		w->layers[w->n_layers++] = li;
	}
	if (e->tokens) {
		w->tokens = malloc((size_t)e->prefix_len * 4u + 1u);
		if (!w->tokens) {
			free_entry(w);
			return NULL;
		}
		memcpy(w->tokens, e->tokens, (size_t)e->prefix_len * 4u);
		w->n_tokens = e->prefix_len;
	}
	return w;
}

static int add_entry(frame_response *r, K3cache__V1__EntryInfo *e)
{
	if (!e)
		return -1;
	K3cache__V1__EntryInfo **n = realloc(r->entries, (r->n_entries + 1) * sizeof(*n));
	if (!n) {
		free_entry(e);
		return -1;
	}
	r->entries = n;
	r->entries[r->n_entries++] = e;
	return 0;
}

struct list_ctx {
	struct store *s;
	frame_response *r;
	int failed;
};

static int list_cb(const struct store_entry_info *info, void *arg)
{
	struct list_ctx *lc = arg;
	if (add_entry(lc->r, entry_to_wire(lc->s, info, 0)) != 0) {
		lc->failed = 1;
		return 1;
	}
	return 0;
}

static void service_list(struct store *s, const K3cache__V1__List *op, frame_response *resp)
{
	uint32_t limit = op->limit ? op->limit : LIST_DEFAULT;
	if (limit > LIST_MAX)
		limit = LIST_MAX;
	struct list_ctx lc = {s, resp, 0};
	struct status st;
	if (store_list(s, op->model.len ? op->model.data : NULL,
	               op->after.len ? op->after.data : NULL, limit, list_cb, &lc,
	               &st) != STATUS_OK)
		service_fail(resp, &st);
	else if (lc.failed)
		fail_oom(resp);
}

static void service_inspect(struct store *s, const K3cache__V1__Inspect *op, frame_response *resp)
{
	struct store_entry_info *info;
	struct status st;
	enum status_code code = op->brief ? store_inspect_record(s, op->key.data, &info, &st)
	                                  : store_inspect(s, op->key.data, &info, &st);
	if (code == STATUS_NOT_FOUND && op->brief)
		return; /* an existence check: no entry, and no error */
	if (code != STATUS_OK) {
		service_fail(resp, &st);
		return;
	}
	if (add_entry(resp, entry_to_wire(s, info, !op->brief)) != 0)
		fail_oom(resp);
	store_entry_info_free(info);
}

static void service_resolve(struct store *s, const K3cache__V1__Resolve *op, frame_response *resp)
{
	uint8_t key[32];
	struct status st;
	const char *prefix = op->prefix ? op->prefix : "";
	if (store_resolve_key(s, prefix, key, &st) != STATUS_OK)
		service_fail(resp, &st);
	else if (dup_bytes(&resp->key, key, 32) != 0)
		fail_oom(resp);
}

static int models_cb(const struct k3cache_model *spec, void *arg)
{
	frame_response *r = arg;
	K3cache__V1__ModelSpec **n = realloc(r->models, (r->n_models + 1) * sizeof(*n));
	if (!n)
		return 1;
	r->models = n;
	if ((r->models[r->n_models] = service_spec_to_wire(spec)) != NULL)
		r->n_models++;
	return 0;
}

static void service_list_models(struct store *s, frame_response *resp)
{
	struct status st;
	uint64_t damaged = 0;
	if (store_list_models(s, models_cb, resp, &damaged, &st) != STATUS_OK) {
		service_fail(resp, &st);
	} else if (damaged) { /* an OK answer, its message saying what it leaves out */
		status_set(&st, STATUS_CORRUPT,
		           "%llu stored model spec%s damaged (%s fingerprint) and not listed: "
		           "`k3cachectl model add SPEC.json` with the same spec repairs it",
		           (unsigned long long)damaged, damaged == 1 ? " is" : "s are",
		           damaged == 1 ? "it no longer matches its"
		                        : "they no longer match their");
		service_fail(resp, &st);
		resp->code = K3CACHE__V1__CODE__OK;
	}
}

/* ---- evict and verify ----------------------------------------------------- */

static void evicted_cb(const uint8_t key[32], uint64_t bytes, void *arg)
{
	frame_response *r = arg;
	K3cache__V1__EntryInfo *e = calloc(1, sizeof(*e));
	if (!e)
		return;
	k3cache__v1__entry_info__init(e);
	e->model_name = (char *)protobuf_c_empty_string;
	if (dup_bytes(&e->key, key, 32) != 0) {
		free(e);
		return;
	}
	e->bytes = bytes;
	add_entry(r, e);
}

static void service_evict(struct store *s, const K3cache__V1__Evict *op, frame_response *resp)
{
	uint8_t(*keys)[32] = op->n_keys ? calloc(op->n_keys, 32) : NULL;
	if (op->n_keys && !keys) {
		fail_oom(resp);
		return;
	}
	for (size_t i = 0; i < op->n_keys; i++)
		memcpy(keys[i], op->keys[i].data, 32);
	struct store_evict_req q = {
	        .keys = (const uint8_t(*)[32])keys,
	        .n_keys = (uint32_t)op->n_keys,
	        .model = op->model.len ? op->model.data : NULL,
	        .idle_seconds = op->idle_seconds,
	        .to_bytes_set = op->to_bytes != 0, /* down to 0 bytes is `all` */
	        .to_bytes = op->to_bytes,
	        .all = op->all,
	        .dry_run = op->dry_run,
	};
	struct store_evict_res res;
	struct status st;
	if (store_evict(s, &q, evicted_cb, resp, &res, &st) != STATUS_OK)
		service_fail(resp, &st);
	resp->evicted = res.entries;
	resp->bytes = res.bytes;
	if (q.to_bytes_set) {
		/* the store reports what went; sum them for a dry run too */
		uint64_t sum = 0;
		for (size_t i = 0; i < resp->n_entries; i++)
			sum += resp->entries[i]->bytes;
		resp->bytes = sum;
	}
	free(keys);
}

static void damaged_cb(const uint8_t key[32], const char *why, void *arg)
{
	frame_response *r = arg;
	K3cache__V1__Damaged **n = realloc(r->damaged, (r->n_damaged + 1) * sizeof(*n));
	if (!n)
		return;
	r->damaged = n;
	K3cache__V1__Damaged *d = calloc(1, sizeof(*d));
	if (!d)
		return;
	k3cache__v1__damaged__init(d);
	d->why = strdup(why);
	if (!d->why || (key && dup_bytes(&d->key, key, 32) != 0)) {
		free(d->why);
		free(d);
		return;
	}
	r->damaged[r->n_damaged++] = d;
}

int service_verify_step(struct store *s, struct store_verify **walk, uint64_t budget,
                        frame_response *resp)
{
	struct status st;
	int done = 0;
	enum status_code code = STATUS_OK;
	if (!*walk)
		code = store_verify_begin(s, walk, &st);
	if (code == STATUS_OK && *walk)
		code = store_verify_step(*walk, budget, damaged_cb, resp, &done, &st);
	if (code == STATUS_OK && !done && *walk)
		return 1;
	if (code != STATUS_OK)
		service_fail(resp, &st);
	uint64_t checked = 0, damaged = 0;
	if (*walk)
		store_verify_counts(*walk, &checked, &damaged);
	resp->checked = checked;
	store_verify_end(*walk);
	*walk = NULL;
	return 0;
}

void service_verify_cancel(struct store_verify **walk, const char *why, frame_response *resp)
{
	uint64_t checked = 0, damaged = 0;
	if (*walk)
		store_verify_counts(*walk, &checked, &damaged);
	struct status st;
	status_set(&st, STATUS_BUSY,
	           "%s: the verify stopped after %llu entries checked; run it again", why,
	           (unsigned long long)checked);
	service_fail(resp, &st);
	resp->checked = checked;
	store_verify_end(*walk);
	*walk = NULL;
}

static void service_verify(struct store *s, frame_response *resp)
{
	struct store_verify *walk = NULL;
	while (service_verify_step(s, &walk, UINT64_MAX, resp))
		;
}

/* ---- dispatch ------------------------------------------------------------- */

static void op_put_model(struct store *s, const frame_request *req, frame_response *r)
{
	service_put_model(s, req->put_model, r);
}

static void op_list(struct store *s, const frame_request *req, frame_response *r)
{
	service_list(s, req->list, r);
}

static void op_inspect(struct store *s, const frame_request *req, frame_response *r)
{
	service_inspect(s, req->inspect, r);
}

static void op_resolve(struct store *s, const frame_request *req, frame_response *r)
{
	service_resolve(s, req->resolve, r);
}

static void op_list_models(struct store *s, const frame_request *req, frame_response *r)
{
	(void)req;
	service_list_models(s, r);
}

static void op_evict(struct store *s, const frame_request *req, frame_response *r)
{
	service_evict(s, req->evict, r);
}

static void op_verify(struct store *s, const frame_request *req, frame_response *r)
{
	(void)req;
	service_verify(s, r);
}

/* The ops answered from the store alone (ops.h). */
static void (*const service_ops[OPS_N])(struct store *, const frame_request *, frame_response *) = {
        [OPS_PUT_MODEL] = op_put_model,     [OPS_LIST] = op_list,
        [OPS_INSPECT] = op_inspect,         [OPS_RESOLVE] = op_resolve,
        [OPS_LIST_MODELS] = op_list_models, [OPS_EVICT] = op_evict,
        [OPS_VERIFY] = op_verify,
};

int service_dispatch(struct store *s, const frame_request *req, frame_response *resp)
{
	void (*answer)(struct store *, const frame_request *, frame_response *) =
	        service_ops[ops_of(req)];
	if (!answer)
		return 0;
	answer(s, req, resp);
	return 1;
}

/* ---- counters ------------------------------------------------------------- */

void service_add_counter(frame_response *resp, const char *name, uint64_t value)
{
	K3cache__V1__Counter **n = realloc(resp->counters, (resp->n_counters + 1) * sizeof(*n));
	if (!n)
		return;
	resp->counters = n;
	K3cache__V1__Counter *c = calloc(1, sizeof(*c));
	if (!c)
		return;
	k3cache__v1__counter__init(c);
	c->name = strdup(name);
	if (!c->name) {
		free(c);
		return;
	}
	c->value = value;
	resp->counters[resp->n_counters++] = c;
}

void service_store_counters(struct store *s, frame_response *resp)
{
	struct store_stats st;
	struct status err;
	if (store_get_stats(s, &st, &err) != STATUS_OK) {
		service_fail(resp, &err);
		return;
	}
#define STORE_ADD(name, field, family, counter, help) service_add_counter(resp, name, st.field);
	SERVICE_STORE_COUNTERS(STORE_ADD)
#undef STORE_ADD
}

void service_response_clear(frame_response *resp)
{
	for (size_t i = 0; i < resp->n_entries; i++)
		free_entry(resp->entries[i]);
	free(resp->entries);
	for (size_t i = 0; i < resp->n_models; i++)
		service_free_spec(resp->models[i]);
	free(resp->models);
	for (size_t i = 0; i < resp->n_counters; i++) {
		free(resp->counters[i]->name);
		free(resp->counters[i]);
	}
	free(resp->counters);
	for (size_t i = 0; i < resp->n_damaged; i++) {
		free(resp->damaged[i]->key.data);
		free(resp->damaged[i]->why);
		free(resp->damaged[i]);
	}
	free(resp->damaged);
	if (resp->message && resp->message != protobuf_c_empty_string)
		free(resp->message);
	free(resp->key.data);
	free(resp->fingerprint.data);
	uint64_t id = resp->id;
	k3cache__v1__response__init(resp);
	resp->id = id;
}
