/* store: opening and closing, models, totals, batched touches, stats. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "store_internal.h"
#include "store_txn.h"
#include "xxh_dispatch.h"

#define DEFAULT_MAX_BYTES   (UINT64_C(1) << 30)
#define DEFAULT_STAGE_BYTES (UINT64_C(32) << 20)
#define TOUCH_CAP           65536u

static uint64_t real_clock(void)
{
	return (uint64_t)time(NULL);
}

uint64_t store_now(const struct store *s)
{
	return s->opt.clock ? s->opt.clock() : real_clock();
}

int store_durability_parse(const char *str, enum store_durability *out)
{
	if (!strcmp(str, "safe"))
		*out = STORE_SAFE;
	else if (!strcmp(str, "strict"))
		*out = STORE_STRICT;
	else if (!strcmp(str, "fast"))
		*out = STORE_FAST;
	else
		return -1;
	return 0;
}

const char *store_durability_name(enum store_durability d)
{
	switch (d) {
	case STORE_STRICT:
		return "strict";
	case STORE_FAST:
		return "fast";
	default:
		return "safe";
	}
}

enum status_code store_mdb_error(struct status *st, int rc, const char *what)
{
	if (rc == MDB_MAP_FULL)
		return status_set(st, STATUS_FULL, "%s: the store's map is full", what);
	if (rc == MDB_READERS_FULL)
		return status_set(st, STATUS_BUSY, "%s: too many concurrent readers", what);
	if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID)
		return status_set(st, STATUS_CORRUPT, "%s: %s", what, mdb_strerror(rc));
	return status_set(st, STATUS_INTERNAL, "%s: %s", what, mdb_strerror(rc));
}

void store_be32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (24 - 8 * i));
}

uint32_t store_get_be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void store_be64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (56 - 8 * i));
}

uint64_t store_get_be64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

uint64_t store_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to)
{
	return XXH3_64bits(tokens + from, (size_t)(to - from) * 4u);
}

/* ---- totals --------------------------------------------------------------- */

int store_totals_get(struct store *s, MDB_txn *txn, struct store_totals *t)
{
	MDB_val k = {6, "totals"}, v;
	memset(t, 0, sizeof(*t));
	int rc = mdb_get(txn, s->meta, &k, &v);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if (v.mv_size != 16)
		return MDB_CORRUPTED;
	t->bytes = store_get_be64(v.mv_data);
	t->lru_clock = store_get_be64((const unsigned char *)v.mv_data + 8);
	return 0;
}

int store_totals_put(struct store *s, MDB_txn *txn, const struct store_totals *t)
{
	unsigned char b[16];
	store_be64(b, t->bytes);
	store_be64(b + 8, t->lru_clock);
	MDB_val k = {6, "totals"}, v = {16, b};
	return mdb_put(txn, s->meta, &k, &v, 0);
}

/* ---- open / close --------------------------------------------------------- */

static int open_dbs(struct store *s, MDB_txn *txn, unsigned create)
{
	struct {
		const char *name;
		MDB_dbi *dbi;
		unsigned flags;
	} dbs[] = {
	        {"meta", &s->meta, 0},
	        {"models", &s->models, 0},
	        {"entries", &s->entries, 0},
	        {"tokens", &s->tokens, 0},
	        {"chunks", &s->chunks, 0},
	        {"nodes", &s->nodes, 0},
	        {"attach", &s->attach, MDB_DUPSORT},
	        {"lru", &s->lru, 0},
	};
	for (size_t i = 0; i < sizeof(dbs) / sizeof(dbs[0]); i++) {
		int rc = mdb_dbi_open(txn, dbs[i].name, dbs[i].flags | create, dbs[i].dbi);
		if (rc)
			return rc;
	}
	return 0;
}

static enum status_code check_format(struct store *s, MDB_txn *txn, struct status *st)
{
	MDB_val k = {6, "format"}, v;
	int rc = mdb_get(txn, s->meta, &k, &v);
	if (rc == MDB_NOTFOUND) {
		if (s->opt.read_only)
			return status_set(st, STATUS_INVALID,
			                  "%s: not a k3cache store (no format record)", s->dir);
		unsigned char b[4];
		store_be32(b, STORE_FORMAT_VERSION);
		MDB_val nv = {4, b};
		rc = mdb_put(txn, s->meta, &k, &nv, 0);
		return rc ? store_mdb_error(st, rc, "writing the format record") : STATUS_OK;
	}
	if (rc)
		return store_mdb_error(st, rc, "reading the format record");
	if (v.mv_size != 4)
		return status_set(st, STATUS_CORRUPT, "%s: damaged format record", s->dir);
	uint32_t ver = store_get_be32(v.mv_data);
	if (ver != STORE_FORMAT_VERSION)
		return status_set(st, STATUS_UNSUPPORTED,
		                  "%s: store format version %u; this build reads version %u",
		                  s->dir, ver, STORE_FORMAT_VERSION);
	return STATUS_OK;
}

/* Opens the named databases, checks the format and reads the LRU clock. */
static enum status_code open_tables(struct store *s, MDB_txn *txn, struct status *st)
{
	int rc = open_dbs(s, txn, s->opt.read_only ? 0 : MDB_CREATE);
	if (rc)
		return rc == MDB_NOTFOUND
		               ? status_set(st, STATUS_INVALID, "%s: not a k3cache store", s->dir)
		               : store_mdb_error(st, rc, "opening the databases");
	enum status_code code = check_format(s, txn, st);
	if (code != STATUS_OK)
		return code;
	rc = mdb_dbi_open(txn, "pending", s->opt.read_only ? 0 : MDB_CREATE, &s->pending);
	s->has_pending = rc == 0;
	if (rc && rc != MDB_NOTFOUND)
		return store_mdb_error(st, rc, "opening the databases");
	struct store_totals t;
	if ((rc = store_totals_get(s, txn, &t)) != 0)
		return store_mdb_error(st, rc, "reading the totals");
	atomic_store(&s->lru_clock, t.lru_clock);
	return STATUS_OK;
}

enum status_code store_open(const char *dir, const struct store_options *opt, struct store **out,
                            struct status *st)
{
	*out = NULL;
	struct store *s = calloc(1, sizeof(*s));
	if (!s)
		return status_set(st, STATUS_INTERNAL, "out of memory");
	if (opt)
		s->opt = *opt;
	if (!s->opt.max_bytes)
		s->opt.max_bytes = DEFAULT_MAX_BYTES;
	if (!s->opt.stage_bytes)
		s->opt.stage_bytes = DEFAULT_STAGE_BYTES;
	if (!s->opt.map_size)
		s->opt.map_size = s->opt.max_bytes * 2 + (UINT64_C(64) << 20);
	s->dir = strdup(dir);
	pthread_mutex_init(&s->mu, NULL);
	enum status_code code = STATUS_OK;
	int rc;

	if (!s->opt.read_only && mkdir(dir, 0750) != 0 && errno != EEXIST) {
		code = status_set(st, STATUS_INTERNAL, "%s: cannot create: %s", dir,
		                  strerror(errno));
		goto fail;
	}
	struct stat sb;
	if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
		code = status_set(st, STATUS_NOT_FOUND, "%s: no such store directory", dir);
		goto fail;
	}
	if ((rc = mdb_env_create(&s->env)) != 0) {
		code = store_mdb_error(st, rc, "mdb_env_create");
		goto fail;
	}
	mdb_env_set_maxdbs(s->env, 16);
	mdb_env_set_maxreaders(s->env, 512);
	if (!s->opt.read_only)
		mdb_env_set_mapsize(s->env, (size_t)s->opt.map_size);
	unsigned flags = MDB_NOTLS;
	if (s->opt.read_only)
		flags |= MDB_RDONLY;
	else if (s->opt.durability == STORE_SAFE)
		flags |= MDB_NOMETASYNC;
	else if (s->opt.durability == STORE_FAST)
		flags |= MDB_NOSYNC;
	if ((rc = mdb_env_open(s->env, dir, flags, 0640)) != 0) {
		if (rc == ENOENT && s->opt.read_only)
			code = status_set(st, STATUS_NOT_FOUND,
			                  "%s: not a k3cache store (no data.mdb)", dir);
		else
			code = status_set(st, STATUS_INTERNAL, "%s: cannot open the store: %s", dir,
			                  mdb_strerror(rc));
		goto fail;
	}
	int dead = 0;
	mdb_reader_check(s->env, &dead);

	MDB_txn *txn;
	rc = s->opt.read_only ? mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn)
	                      : store_txn_write(s, &txn);
	if (rc) {
		code = store_mdb_error(st, rc, "opening the store");
		goto fail;
	}
	code = open_tables(s, txn, st);
	/* a read-only transaction ends by commit as well */
	if ((rc = store_txn_end(txn, code ? STORE_TXN_NOTHING : 0)) != 0) {
		if (!code)
			code = store_mdb_error(st, rc, "opening the store");
		goto fail;
	}
	/* Unfinished staged publishes of dead processes: best effort, in a
	 * transaction of its own; what it cannot remove now (a full map, say)
	 * stays invisible and is tried again at the next open. */
	if (!s->opt.read_only && s->has_pending && store_txn_write(s, &txn) == 0) {
		uint32_t swept = 0;
		if (store_txn_end(txn, store_sweep_staged(s, txn, &swept)) == 0)
			s->swept_at_open = swept;
	}
	*out = s;
	return STATUS_OK;
fail:
	if (s->env)
		mdb_env_close(s->env);
	pthread_mutex_destroy(&s->mu);
	free(s->dir);
	free(s);
	return code;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (!s->opt.read_only)
		store_flush(s, NULL);
	if (s->opt.durability == STORE_FAST && !s->opt.read_only)
		mdb_env_sync(s->env, 1);
	mdb_env_close(s->env);
	for (size_t i = 0; i < s->n_models_cached; i++)
		model_free(s->model_cache[i].spec);
	free(s->model_cache);
	free(s->touches);
	free(s->live);
	pthread_mutex_destroy(&s->mu);
	free(s->dir);
	free(s);
}

int store_reader_check(struct store *s)
{
	int dead = 0;
	mdb_reader_check(s->env, &dead);
	return dead;
}

enum status_code store_sync(struct store *s, struct status *st)
{
	if (s->opt.read_only)
		return STATUS_OK;
	int rc = mdb_env_sync(s->env, 1);
	return rc ? store_mdb_error(st, rc, "sync") : STATUS_OK;
}

/* ---- models --------------------------------------------------------------- */

static struct model_spec *copy_spec(const struct model_spec *m)
{
	char err[MODEL_ERROR_MAX];
	return model_new(m->name, m->revision, m->state_layout, m->layers, m->n_layers, err);
}

enum status_code store_put_model(struct store *s, const struct model_spec *spec, int *created,
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
	rc = store_txn_end(txn, mdb_put(txn, s->models, &k, &v, MDB_NOOVERWRITE));
	free(js);
	if (created)
		*created = rc == 0;
	if (rc && rc != MDB_KEYEXIST)
		return store_mdb_error(st, rc, "put model");
	return STATUS_OK;
}

static struct model_spec *decode_model(const MDB_val *k, const MDB_val *v, struct status *st)
{
	char err[MODEL_ERROR_MAX];
	struct model_spec *m = model_from_json(v->mv_data, v->mv_size, err);
	if (!m) {
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

struct model_spec *store_get_model(struct store *s, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                                   struct status *st)
{
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_models_cached; i++) {
		if (!memcmp(s->model_cache[i].fp, fp, MODEL_FINGERPRINT_LEN)) {
			struct model_spec *m = copy_spec(s->model_cache[i].spec);
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
	struct model_spec *m = NULL;
	if (rc == MDB_NOTFOUND)
		status_set(st, STATUS_UNKNOWN_MODEL,
		           "unknown model fingerprint; put the model spec first (k3cachectl model "
		           "add)");
	else if (rc)
		store_mdb_error(st, rc, "get model");
	else
		m = decode_model(&k, &v, st);
	mdb_txn_abort(txn);
	if (!m)
		return NULL;

	struct model_spec *cached = copy_spec(m);
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
                                   int (*fn)(const struct model_spec *spec, void *ctx), void *ctx,
                                   struct status *st)
{
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
		struct model_spec *m = decode_model(&k, &v, st);
		if (!m) {
			code = STATUS_CORRUPT;
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

/* ---- touches -------------------------------------------------------------- */

void store_touch(struct store *s, const uint8_t key[STORE_KEY_LEN], uint64_t hits)
{
	if (s->opt.read_only)
		return;
	uint64_t seq = atomic_fetch_add(&s->lru_clock, 1) + 1;
	uint64_t now = store_now(s);
	pthread_mutex_lock(&s->mu);
	if (s->n_touches == s->cap_touches && s->cap_touches < TOUCH_CAP) {
		size_t ncap = s->cap_touches ? s->cap_touches * 2 : 64;
		struct store_touch *nt = realloc(s->touches, ncap * sizeof(*nt));
		if (nt) {
			s->touches = nt;
			s->cap_touches = ncap;
		}
	}
	if (s->n_touches < s->cap_touches) {
		struct store_touch *t = &s->touches[s->n_touches++];
		memcpy(t->key, key, STORE_KEY_LEN);
		t->seq = seq;
		t->when = now;
		t->hits = hits;
	}
	pthread_mutex_unlock(&s->mu);
}

int store_read_record(struct store *s, MDB_txn *txn, const uint8_t key[STORE_KEY_LEN],
                      struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	int rc = mdb_get(txn, s->entries, &k, &v);
	if (rc)
		return rc;
	if (store_record_decode(v.mv_data, v.mv_size, r) != 0 ||
	    memcmp(r->key, key, STORE_KEY_LEN) != 0)
		return -1;
	return 0;
}

static int rewrite_record(struct store *s, MDB_txn *txn, const struct store_record *r)
{
	MDB_val k = {STORE_KEY_LEN, (void *)r->key}, v;
	int rc = mdb_get(txn, s->entries, &k, &v);
	if (rc)
		return rc;
	size_t len = v.mv_size;
	unsigned char *copy = malloc(len);
	if (!copy)
		return ENOMEM;
	memcpy(copy, v.mv_data, len);
	store_record_patch(copy, r);
	MDB_val nv = {len, copy};
	rc = mdb_put(txn, s->entries, &k, &nv, 0);
	free(copy);
	return rc;
}

static int lru_key(unsigned char out[8 + STORE_KEY_LEN], uint64_t seq,
                   const uint8_t key[STORE_KEY_LEN])
{
	store_be64(out, seq);
	memcpy(out + 8, key, STORE_KEY_LEN);
	return 0;
}

static int move_lru(struct store *s, MDB_txn *txn, const struct store_record *old, uint64_t seq)
{
	unsigned char lk[8 + STORE_KEY_LEN];
	lru_key(lk, old->lru_seq, old->key);
	MDB_val k = {sizeof(lk), lk}, empty = {0, NULL};
	int rc = mdb_del(txn, s->lru, &k, NULL);
	if (rc && rc != MDB_NOTFOUND)
		return rc;
	lru_key(lk, seq, old->key);
	return mdb_put(txn, s->lru, &k, &empty, 0);
}

int store_apply_touches(struct store *s, MDB_txn *txn)
{
	pthread_mutex_lock(&s->mu);
	struct store_touch *list = s->touches;
	size_t n = s->n_touches;
	s->touches = NULL;
	s->n_touches = s->cap_touches = 0;
	pthread_mutex_unlock(&s->mu);
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		struct store_record r;
		int got = store_read_record(s, txn, list[i].key, &r);
		if (got)
			continue; /* evicted since, or damaged: nothing to touch */
		if (list[i].seq > r.lru_seq) {
			rc = move_lru(s, txn, &r, list[i].seq);
			r.lru_seq = list[i].seq;
			r.last_used = list[i].when;
		}
		r.hits += list[i].hits;
		if (!rc)
			rc = rewrite_record(s, txn, &r);
	}
	if (!rc && n) {
		struct store_totals t;
		rc = store_totals_get(s, txn, &t);
		uint64_t clock = atomic_load(&s->lru_clock);
		if (!rc && clock > t.lru_clock) {
			t.lru_clock = clock;
			rc = store_totals_put(s, txn, &t);
		}
	}
	free(list);
	return rc;
}

enum status_code store_flush(struct store *s, struct status *st)
{
	if (s->opt.read_only)
		return STATUS_OK;
	pthread_mutex_lock(&s->mu);
	size_t n = s->n_touches;
	pthread_mutex_unlock(&s->mu);
	if (!n)
		return STATUS_OK;
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (!rc)
		rc = store_txn_end(txn, store_apply_touches(s, txn));
	return rc ? store_mdb_error(st, rc, "flush") : STATUS_OK;
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
	int rc = store_read_record(s, txn, key, &r);
	if (rc == -1) {
		/* the record itself is damaged: there is no flag to set */
		struct store_totals t;
		done = STORE_QUARANTINE_REMOVED;
		if (!(rc = store_totals_get(s, txn, &t)) &&
		    !(rc = store_delete_damaged(s, txn, key, &t)))
			rc = store_totals_put(s, txn, &t);
	} else if (rc == 0 && (r.flags & STORE_FLAG_QUARANTINED)) {
		rc = STORE_TXN_NOTHING;
	} else if (rc == 0) {
		r.flags |= STORE_FLAG_QUARANTINED;
		rc = rewrite_record(s, txn, &r);
	}
	if (store_txn_end(txn, rc) != 0)
		return STORE_QUARANTINE_NONE;
	atomic_fetch_add(&s->quarantined, 1);
	return done;
}

/* ---- delete --------------------------------------------------------------- */

/* Deletes every chunk stored under key. */
int store_delete_chunks(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->chunks, &cur);
	if (rc)
		return rc;
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, key, STORE_KEY_LEN);
	for (;;) { /* seek again after each delete */
		MDB_val k = {sizeof(ck), ck}, v;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
		if (rc || k.mv_size < STORE_KEY_LEN || memcmp(k.mv_data, key, STORE_KEY_LEN) != 0)
			break;
		if (bytes && v.mv_size > 8)
			*bytes += v.mv_size - 8;
		if ((rc = mdb_cursor_del(cur, 0)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_delete_entry(struct store *s, MDB_txn *txn, const struct store_record *rec,
                       struct store_totals *totals)
{
	/* r's salt points into a page of this transaction: copy it before any
	 * update can move that page */
	struct store_record copy = *rec;
	uint8_t saltbuf[STORE_MAX_SALT];
	if (copy.salt_len > sizeof(saltbuf))
		return MDB_CORRUPTED;
	if (copy.salt_len)
		memcpy(saltbuf, copy.salt, copy.salt_len);
	copy.salt = saltbuf;
	const struct store_record *r = &copy;
	MDB_val k = {STORE_KEY_LEN, (void *)r->key}, v;
	int rc;
	unsigned char lk[8 + STORE_KEY_LEN];
	lru_key(lk, r->lru_seq, r->key);
	MDB_val lkv = {sizeof(lk), lk};
	if ((rc = mdb_del(txn, s->lru, &lkv, NULL)) && rc != MDB_NOTFOUND)
		return rc;

	/* the prefix index: recompute the path from the stored tokens */
	rc = mdb_get(txn, s->tokens, &k, &v);
	if (rc == 0 && v.mv_size == (size_t)r->prefix_len * 4u) {
		uint32_t *toks = malloc(v.mv_size);
		uint32_t depth = r->prefix_len / PREFIX_BLOCK;
		uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
		if (!toks || !h) {
			free(toks);
			free(h);
			return ENOMEM;
		}
		memcpy(toks, v.mv_data, v.mv_size);
		prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, toks, r->prefix_len, h);
		for (uint32_t d = 1; d <= depth && !rc; d++) {
			MDB_val nk = {PREFIX_NODE_LEN, h[d]}, nv;
			int g = mdb_get(txn, s->nodes, &nk, &nv);
			if (g == MDB_NOTFOUND || (g == 0 && nv.mv_size != 4))
				continue;
			if (g) {
				rc = g;
				break;
			}
			uint32_t count = store_get_be32(nv.mv_data);
			if (count <= 1) {
				rc = mdb_del(txn, s->nodes, &nk, NULL);
			} else {
				unsigned char b[4];
				store_be32(b, count - 1);
				MDB_val cv = {4, b};
				rc = mdb_put(txn, s->nodes, &nk, &cv, 0);
			}
		}
		if (!rc) {
			unsigned char av[STORE_ATTACH_LEN];
			store_be32(av, r->prefix_len);
			uint64_t tail = store_tail_hash(toks, depth * PREFIX_BLOCK, r->prefix_len);
			store_be64(av + 4, tail);
			memcpy(av + 12, r->key, STORE_KEY_LEN);
			MDB_val ak = {PREFIX_NODE_LEN, h[depth]}, avv = {sizeof(av), av};
			rc = mdb_del(txn, s->attach, &ak, &avv);
			if (rc == MDB_NOTFOUND)
				rc = 0;
		}
		free(toks);
		free(h);
		if (rc)
			return rc;
	} else if (rc && rc != MDB_NOTFOUND) {
		return rc;
	}
	if ((rc = mdb_del(txn, s->tokens, &k, NULL)) && rc != MDB_NOTFOUND)
		return rc;

	if ((rc = store_delete_chunks(s, txn, r->key, NULL)) != 0)
		return rc;
	if ((rc = mdb_del(txn, s->entries, &k, NULL)) && rc != MDB_NOTFOUND)
		return rc;
	if (totals)
		totals->bytes = totals->bytes >= r->bytes ? totals->bytes - r->bytes : 0;
	return 0;
}

int store_chunk_bytes(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes)
{
	*bytes = 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->chunks, &cur);
	if (rc)
		return rc;
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, key, STORE_KEY_LEN);
	MDB_val k = {sizeof(ck), ck}, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	     rc == 0 && k.mv_size >= STORE_KEY_LEN && !memcmp(k.mv_data, key, STORE_KEY_LEN);
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
		*bytes += v.mv_size > 8 ? v.mv_size - 8 : 0;
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* The bytes of every entry: its record's count, or for a record that does
 * not decode, the bytes of the chunks stored under its key. */
static int recount_bytes(struct store *s, MDB_txn *txn, uint64_t *bytes)
{
	*bytes = 0;
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		uint64_t b = 0;
		if (store_record_decode(v.mv_data, v.mv_size, &r) == 0)
			b = r.bytes;
		else if (k.mv_size == STORE_KEY_LEN &&
		         (rc = store_chunk_bytes(s, txn, k.mv_data, &b)) != 0)
			break;
		*bytes += b;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

int store_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                         struct store_totals *totals)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	int rc = store_delete_chunks(s, txn, key, NULL);
	if (!rc && (rc = mdb_del(txn, s->tokens, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && (rc = mdb_del(txn, s->entries, &k, NULL)) == MDB_NOTFOUND)
		rc = 0;
	if (!rc && totals)
		rc = recount_bytes(s, txn, &totals->bytes);
	return rc;
}

int store_info_from_record(const struct store_record *r, struct store_entry_info *info)
{
	memset(info, 0, sizeof(*info));
	memcpy(info->key, r->key, STORE_KEY_LEN);
	memcpy(info->fingerprint, r->fingerprint, MODEL_FINGERPRINT_LEN);
	info->salt_len = r->salt_len;
	info->salt = malloc(r->salt_len + 1u);
	info->layers = malloc((size_t)r->n_layers * sizeof(*info->layers));
	if (!info->salt || !info->layers) {
		free(info->salt);
		free(info->layers);
		return -1;
	}
	if (r->salt_len)
		memcpy(info->salt, r->salt, r->salt_len);
	info->salt[r->salt_len] = 0;
	info->prefix_len = r->prefix_len;
	info->n_layers = r->n_layers;
	info->bytes = r->bytes;
	info->created = r->created;
	info->last_used = r->last_used;
	info->hits = r->hits;
	info->quarantined = (r->flags & STORE_FLAG_QUARANTINED) != 0;
	for (uint32_t i = 0; i < r->n_layers; i++)
		store_record_layer(r, i, &info->layers[i].tag, &info->layers[i].size,
		                   &info->layers[i].xxh3);
	return 0;
}

void store_entry_info_free(struct store_entry_info *info)
{
	if (!info)
		return;
	free(info->salt);
	free(info->layers);
	free(info->tokens);
	free(info);
}

/* ---- stats ---------------------------------------------------------------- */

enum status_code store_get_stats(struct store *s, struct store_stats *out, struct status *st)
{
	memset(out, 0, sizeof(*out));
	out->max_bytes = s->opt.max_bytes;
	out->hits = atomic_load(&s->hits);
	out->misses = atomic_load(&s->misses);
	out->hit_tokens = atomic_load(&s->hit_tokens);
	out->publishes = atomic_load(&s->publishes);
	out->publish_exists = atomic_load(&s->publish_exists);
	out->evictions = atomic_load(&s->evictions);
	out->quarantined = atomic_load(&s->quarantined);
	out->restores = atomic_load(&s->restores);
	out->corrupt = atomic_load(&s->corrupt);
	out->map_full_retries = atomic_load(&s->map_full_retries);

	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return store_mdb_error(st, rc, "stat");
	MDB_stat ms;
	if (mdb_stat(txn, s->entries, &ms) == 0)
		out->entries = ms.ms_entries;
	if (mdb_stat(txn, s->models, &ms) == 0)
		out->models = ms.ms_entries;
	if (s->has_pending && mdb_stat(txn, s->pending, &ms) == 0)
		out->staging = ms.ms_entries;
	if (mdb_stat(txn, s->chunks, &ms) == 0)
		out->chunks = ms.ms_entries;
	out->swept = s->swept_at_open;
	struct store_totals t;
	if (store_totals_get(s, txn, &t) == 0)
		out->bytes = t.bytes;
	/* free pages: the free list (dbi 0) maps txn ids to page lists whose first
	 * word is their length */
	MDB_cursor *cur;
	if (mdb_cursor_open(txn, 0, &cur) == 0) {
		MDB_val k, v;
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
		     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
			if (v.mv_size >= sizeof(size_t)) {
				size_t n;
				memcpy(&n, v.mv_data, sizeof(n));
				out->free_pages += n;
			}
		}
		mdb_cursor_close(cur);
	}
	mdb_txn_abort(txn);
	MDB_envinfo info;
	mdb_env_info(s->env, &info);
	mdb_env_stat(s->env, &ms);
	out->page_size = ms.ms_psize;
	out->map_size = info.me_mapsize;
	out->map_used_pages = info.me_last_pgno + 1;
	char path[4096];
	snprintf(path, sizeof(path), "%s/data.mdb", s->dir);
	struct stat sb;
	if (stat(path, &sb) == 0)
		out->file_bytes = (uint64_t)sb.st_size;
	return STATUS_OK;
}
