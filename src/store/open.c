/* open: opening and closing a store, its durability and its sync (store.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lru.h"
#include "pending.h"
#include "record.h"
#include "txn.h"

#define DEFAULT_MAX_BYTES   (UINT64_C(1) << 30)
#define DEFAULT_STAGE_BYTES (UINT64_C(32) << 20)
#define TOUCH_CAP           65536u

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
	if (ver != 1 && ver != STORE_FORMAT_VERSION)
		return status_set(st, STATUS_UNSUPPORTED,
		                  "%s: store format version %u; this build reads version %u "
		                  "(and upgrades version 1)",
		                  s->dir, ver, STORE_FORMAT_VERSION);
	if (ver == 1 && !s->opt.read_only) {
		/* Format 2 adds the shared blocks and a record tail; a format-1
		 * record reads as an entry that shares nothing, so the upgrade is
		 * this one write, inside the open's transaction: after a crash the
		 * store is version 1 or 2, whole. */
		unsigned char b[4];
		store_be32(b, STORE_FORMAT_VERSION);
		MDB_val nv = {4, b};
		if ((rc = mdb_put(txn, s->meta, &k, &nv, 0)) != 0)
			return store_mdb_error(st, rc, "upgrading the format record");
		s->upgraded = 1;
	}
	return STATUS_OK;
}

/* The store's row block (meta "rowblock"), fixed when the store is made. */
static enum status_code check_row_block(struct store *s, MDB_txn *txn, struct status *st)
{
	MDB_val k = {8, "rowblock"}, v;
	int rc = mdb_get(txn, s->meta, &k, &v);
	uint32_t want = s->opt.row_block ? s->opt.row_block : STORE_DEFAULT_ROW_BLOCK;
	if (rc == MDB_NOTFOUND) {
		s->row_block = want;
		if (s->opt.read_only)
			return STATUS_OK;
		unsigned char b[4];
		store_be32(b, want);
		MDB_val nv = {4, b};
		rc = mdb_put(txn, s->meta, &k, &nv, 0);
		return rc ? store_mdb_error(st, rc, "writing the row block") : STATUS_OK;
	}
	if (rc)
		return store_mdb_error(st, rc, "reading the row block");
	uint32_t b = v.mv_size == 4 ? store_get_be32(v.mv_data) : 0;
	if (!b || b % PREFIX_BLOCK || b > STORE_MAX_ROW_BLOCK)
		return status_set(st, STATUS_CORRUPT, "%s: damaged row block record", s->dir);
	s->row_block = b;
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
	if (code == STATUS_OK)
		code = check_row_block(s, txn, st);
	if (code != STATUS_OK)
		return code;
	/* tables a read-only open of an older store may lack */
	struct {
		const char *name;
		MDB_dbi *dbi;
		int *has;
	} optional[] = {
	        {"pending", &s->pending, &s->has_pending},
	        {"blocks", &s->blocks, &s->has_blocks},
	        {"blockrefs", &s->blockrefs, &s->has_blocks},
	        {"held", &s->held, &s->has_held},
	};
	for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++) {
		rc = mdb_dbi_open(txn, optional[i].name, s->opt.read_only ? 0 : MDB_CREATE,
		                  optional[i].dbi);
		if (rc && rc != MDB_NOTFOUND)
			return store_mdb_error(st, rc, "opening the databases");
		*optional[i].has = rc == 0 && (i != 2 || *optional[i].has);
	}
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
		if (store_txn_end(txn, store_pending_sweep(s, txn, &swept)) == 0)
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
