/* models: the model specs a store knows (models.h; store.h, "models"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hexutil.h"

#include "models.h"
#include "txn.h"

static struct k3cache_model *copy_spec(const struct k3cache_model *m)
{
	char err[MODEL_ERROR_MAX];
	return model_new(m->name, m->revision, m->state_layout, m->layers, m->n_layers, err);
}

static struct k3cache_model *decode_model(const MDB_val *k, const MDB_val *v, struct status *st);

enum status_code store_put_model(struct store *s, const struct k3cache_model *spec, int *created,
                                 struct status *st)
{
	if (s->opt.read_only)
		return status_set(st, STATUS_UNSUPPORTED, "the store is open read-only");
	char *js = model_to_json(spec);
	if (!js)
		return status_set(st, STATUS_INTERNAL, "out of memory");
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc) {
		free(js);
		return store_mdb_error(st, rc, "put model");
	}
	MDB_val k = {MODEL_FINGERPRINT_LEN, (void *)spec->fingerprint}, v = {strlen(js), js};
	MDB_val old = v; /* MDB_KEYEXIST points it at the stored spec */
	rc = mdb_put(txn, s->models, &k, &old, MDB_NOOVERWRITE);
	int repaired = 0;
	if (rc == MDB_KEYEXIST) {
		/* A stored spec that no longer decodes to its fingerprint is
		 * damaged: the caller's spec has that fingerprint, so it is the
		 * spec, and it takes the damaged one's place. */
		struct status why = {0};
		struct k3cache_model *m = decode_model(&k, &old, &why);
		if (!m && why.code == STATUS_CORRUPT)
			repaired = (rc = mdb_put(txn, s->models, &k, &v, 0)) == 0;
		model_free(m);
	}
	rc = store_txn_end(txn, rc);
	free(js);
	if (created)
		*created = rc == 0 && !repaired;
	if (rc && rc != MDB_KEYEXIST)
		return store_mdb_error(st, rc, "put model");
	if (repaired)
		atomic_fetch_add(&s->models_repaired, 1);
	return STATUS_OK;
}

static struct k3cache_model *decode_model(const MDB_val *k, const MDB_val *v, struct status *st)
{
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_from_json(v->mv_data, v->mv_size, err);
	if (!m) {
		if (model_error_is_nomem(err))
			status_set(st, STATUS_INTERNAL, "reading a stored model spec: %s", err);
		else
			status_set(st, STATUS_CORRUPT, "a stored model spec is damaged: %s", err);
		return NULL;
	}
	if (k->mv_size != MODEL_FINGERPRINT_LEN ||
	    memcmp(k->mv_data, m->fingerprint, MODEL_FINGERPRINT_LEN) != 0) {
		model_free(m);
		status_set(st, STATUS_CORRUPT,
		           "a stored model spec does not match its fingerprint");
		return NULL;
	}
	return m;
}

struct k3cache_model *store_get_model(struct store *s, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                                      struct status *st)
{
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_models_cached; i++) {
		if (!memcmp(s->model_cache[i].fp, fp, MODEL_FINGERPRINT_LEN)) {
			struct k3cache_model *m = copy_spec(s->model_cache[i].spec);
			pthread_mutex_unlock(&s->mu);
			if (!m)
				status_set(st, STATUS_INTERNAL, "out of memory");
			return m;
		}
	}
	pthread_mutex_unlock(&s->mu);

	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		store_mdb_error(st, rc, "get model");
		return NULL;
	}
	MDB_val k = {MODEL_FINGERPRINT_LEN, (void *)fp}, v;
	rc = mdb_get(txn, s->models, &k, &v);
	struct k3cache_model *m = NULL;
	if (rc == MDB_NOTFOUND)
		status_set(st, STATUS_UNKNOWN_MODEL,
		           "unknown model fingerprint; put the model spec first (k3cachectl model "
		           "add)");
	else if (rc)
		store_mdb_error(st, rc, "get model");
	else if (!(m = decode_model(&k, &v, st)) && st && st->code == STATUS_CORRUPT)
		atomic_fetch_add(&s->models_damaged, 1);
	mdb_txn_abort(txn);
	if (!m)
		return NULL;

	struct k3cache_model *cached = copy_spec(m);
	pthread_mutex_lock(&s->mu);
	struct model_cache_entry *nc =
	        cached ? realloc(s->model_cache, (s->n_models_cached + 1) * sizeof(*nc)) : NULL;
	if (nc) {
		s->model_cache = nc;
		memcpy(nc[s->n_models_cached].fp, fp, MODEL_FINGERPRINT_LEN);
		nc[s->n_models_cached++].spec = cached;
	} else {
		model_free(cached);
	}
	pthread_mutex_unlock(&s->mu);
	return m;
}

enum status_code store_list_models(struct store *s,
                                   int (*fn)(const struct k3cache_model *spec, void *ctx),
                                   void *ctx, uint64_t *damaged, struct status *st)
{
	*damaged = 0;
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return store_mdb_error(st, rc, "list models");
	if ((rc = mdb_cursor_open(txn, s->models, &cur)) != 0) {
		mdb_txn_abort(txn);
		return store_mdb_error(st, rc, "list models");
	}
	MDB_val k, v;
	enum status_code code = STATUS_OK;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct status why = {0};
		struct k3cache_model *m = decode_model(&k, &v, &why);
		if (!m && why.code == STATUS_CORRUPT) { /* the others are still good */
			(*damaged)++;
			atomic_fetch_add(&s->models_damaged, 1);
			continue;
		}
		if (!m) {
			code = status_set(st, why.code, "%s", why.message);
			break;
		}
		int stop = fn(m, ctx);
		model_free(m);
		if (stop)
			break;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return code;
}

int store_models_verify(struct store *s, MDB_txn *txn,
                        void (*fn)(const uint8_t *key, const char *why, void *ctx), void *ctx,
                        uint64_t *problems)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->models, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct status why = {0};
		struct k3cache_model *m = decode_model(&k, &v, &why);
		model_free(m);
		if (m)
			continue;
		if (why.code != STATUS_CORRUPT) {
			rc = ENOMEM;
			break;
		}
		(*problems)++;
		char fp[2 * MODEL_FINGERPRINT_LEN + 1] = "(of a malformed key)";
		if (k.mv_size == MODEL_FINGERPRINT_LEN)
			hexutil_encode(k.mv_data, MODEL_FINGERPRINT_LEN, fp);
		char msg[STATUS_MESSAGE_MAX];
		snprintf(msg, sizeof(msg),
		         "the model spec %.16s is damaged (%.64s): salvage cannot save its "
		         "entries; `k3cachectl model add SPEC.json` with the same spec repairs it",
		         fp, why.message);
		if (fn)
			fn(NULL, msg, ctx);
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_model_stored(struct store *s, const uint8_t fp[MODEL_FINGERPRINT_LEN])
{
	MDB_txn *txn;
	if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) != 0)
		return 0;
	MDB_val k = {MODEL_FINGERPRINT_LEN, (void *)fp}, v;
	int rc = mdb_get(txn, s->models, &k, &v);
	mdb_txn_abort(txn);
	return rc == 0;
}
