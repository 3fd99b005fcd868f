/* salvage: every entry of a damaged store that verifies, copied into a new
 * store (store.h).
 *
 * The damaged file is only ever mapped read-only, and LMDB never opens it:
 * the walk (walk.h) reads what it can reach on sound pages, stepping around
 * damaged ones. That raw copy goes into a scratch store, NEWDIR/salvage.tmp,
 * which LMDB wrote and can therefore read safely. Each entry found there is
 * checked as verify checks it (record, tokens, its key recomputed from
 * model, salt and tokens, every chunk's and block's XXH3), restored whole
 * and published into the new store by the ordinary publish, whose checks
 * (shape, finiteness, each layer's XXH3 as its record states it) it passes
 * again. So the new store's indexes, shared blocks and reference counts are
 * made by the same code as any other store's, not patched from a damaged
 * one. Entries go in least recently used first, so the LRU order is kept.
 * The scratch store is removed at the end; it needs about the old store's
 * size again on disk. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "record.h"
#include "walk.h"

#define SCRATCH     "salvage.tmp"
#define BATCH_BYTES (UINT64_C(256) << 20)
/* Each entry is copied whole before it is published. One at least this
 * large that cannot be held is given up (listed, with its size), so that a
 * salvage on a small machine saves the rest instead of stopping at it on
 * every run; a smaller one failing means memory is short: it stops. */
#define LARGE_ENTRY (UINT64_C(256) << 20)

struct copy {
	struct store *tmp;
	MDB_txn *txn;
	uint64_t batch;
	int rc;
	uint32_t row_block;
};

/* The walk's item: the tables an entry is made of go to the scratch store
 * as they are; the indexes are made again by the publishes. */
static int copy_item(const char *table, const void *key, size_t klen, const void *val, size_t vlen,
                     void *ctx)
{
	struct copy *c = ctx;
	if (!strcmp(table, "meta")) {
		if (klen == 8 && !memcmp(key, "rowblock", 8) && vlen == 4) {
			uint32_t b = store_get_be32(val);
			/* a damaged value leaves the default */
			c->row_block =
			        b && b % PREFIX_BLOCK == 0 && b <= STORE_MAX_ROW_BLOCK ? b : 0;
		}
		return 0;
	}
	static const char *const keep[] = {"models", "entries", "tokens", "chunks", "blocks"};
	const struct store_table *t = NULL;
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		if (!strcmp(table, keep[i]))
			for (size_t j = 0; j < store_n_tables; j++)
				if (!strcmp(store_tables[j].name, table))
					t = &store_tables[j];
	if (!t)
		return 0;
	MDB_dbi dbi = *(const MDB_dbi *)((const char *)c->tmp + t->dbi);
	MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
	if ((c->rc = mdb_put(c->txn, dbi, &k, &v, 0)) != 0)
		return 1;
	if ((c->batch += klen + vlen) >= BATCH_BYTES) {
		c->batch = 0;
		if ((c->rc = mdb_txn_commit(c->txn)) != 0 ||
		    (c->rc = mdb_txn_begin(c->tmp->env, NULL, 0, &c->txn)) != 0) {
			c->txn = NULL;
			return 1;
		}
	}
	return 0;
}

struct found {
	uint64_t seq;
	uint8_t key[STORE_KEY_LEN];
};

static int by_seq(const void *a, const void *b)
{
	const struct found *x = a, *y = b;
	return (x->seq > y->seq) - (x->seq < y->seq);
}

struct salvage {
	struct store *tmp, *out;
	void (*lost)(const uint8_t *key, const char *why, void *ctx);
	void *ctx;
	struct store_salvage_res *res;
};

__attribute__((format(printf, 3, 4))) static void lose(struct salvage *sv, const uint8_t *key,
                                                       const char *fmt, ...)
{
	char why[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (sv->lost)
		sv->lost(key, why, sv->ctx);
}

/* The entries of the scratch store whose records read, oldest use first. */
static int list_entries(struct salvage *sv, struct found **out, size_t *n)
{
	*out = NULL;
	*n = 0;
	MDB_txn *txn;
	int rc = mdb_txn_begin(sv->tmp->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return rc;
	MDB_cursor *cur;
	if ((rc = mdb_cursor_open(txn, sv->tmp->entries, &cur)) != 0) {
		mdb_txn_abort(txn);
		return rc;
	}
	size_t cap = 0;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		sv->res->entries++;
		struct store_record r;
		if (store_record_decode(v.mv_data, v.mv_size, &r) != 0 ||
		    memcmp(r.key, k.mv_data, STORE_KEY_LEN) != 0) {
			lose(sv, k.mv_data, "its record is damaged");
			continue;
		}
		if (*n == cap) {
			cap = cap ? cap * 2 : 1024;
			struct found *f = realloc(*out, cap * sizeof(**out));
			if (!f) {
				rc = ENOMEM;
				break;
			}
			*out = f;
		}
		(*out)[*n].seq = r.lru_seq;
		memcpy((*out)[*n].key, r.key, STORE_KEY_LEN);
		(*n)++;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	if (!rc && *n)
		qsort(*out, *n, sizeof(**out), by_seq);
	return rc;
}

/* What the publish of one entry needs, read and checked in the scratch
 * store: its fingerprint, salt and tokens (copied). Returns 0, or -1 after
 * saying why it is lost. */
struct identity {
	uint8_t fp[MODEL_FINGERPRINT_LEN];
	uint8_t *salt;
	uint32_t salt_len;
	uint32_t *tokens;
	uint32_t n;
};

static int read_identity(struct salvage *sv, const uint8_t *key, struct identity *id,
                         struct status *st)
{
	memset(id, 0, sizeof(*id));
	MDB_txn *txn;
	if (mdb_txn_begin(sv->tmp->env, NULL, MDB_RDONLY, &txn) != 0)
		return status_set(st, STATUS_INTERNAL, "cannot read the scratch store"), -1;
	struct store_record r;
	MDB_val tv;
	int ok = 0;
	if (store_record_read(sv->tmp, txn, key, &r) != 0)
		lose(sv, key, "its record is damaged");
	else if (r.flags & STORE_FLAG_QUARANTINED)
		lose(sv, key, "it was quarantined: found damaged while it was served");
	else if (store_index_tokens(sv->tmp, txn, key, &tv) != 0 ||
	         tv.mv_size != (size_t)r.prefix_len * 4u)
		lose(sv, key, "its token list is missing or damaged");
	else if (!store_index_key_matches(&r, &tv))
		lose(sv, key, "its key is not the SHA-256 of its model, salt and tokens");
	else if (!(id->tokens = malloc(tv.mv_size)) ||
	         !(id->salt = malloc(r.salt_len ? r.salt_len : 1)))
		status_set(st, STATUS_INTERNAL, "out of memory");
	else {
		memcpy(id->fp, r.fingerprint, sizeof(id->fp));
		memcpy(id->tokens, tv.mv_data, tv.mv_size);
		if (r.salt_len)
			memcpy(id->salt, r.salt, r.salt_len);
		id->salt_len = r.salt_len;
		id->n = r.prefix_len;
		ok = 1;
	}
	mdb_txn_abort(txn);
	if (!ok) {
		free(id->tokens);
		free(id->salt);
		return -1;
	}
	return 0;
}

/* Restores one entry from the scratch store (every chunk and block checked)
 * and publishes it into the new store. An entry that fails a check is lost
 * (said to sv->lost); not OK when the salvage cannot go on (memory ran out,
 * the new store cannot be written), which says nothing of the entry. */
static enum status_code save_entry(struct salvage *sv, const uint8_t *key, struct status *st)
{
	struct identity id;
	st->code = STATUS_OK;
	if (read_identity(sv, key, &id, st) != 0)
		return st->code;
	struct status est;
	enum status_code code = STATUS_OK;
	struct store_snapshot *snap = NULL;
	struct store_blob *blobs = NULL;
	struct k3cache_model *m = store_get_model(sv->tmp, id.fp, &est);
	if (!m) {
		if (est.code == STATUS_INTERNAL)
			code = status_set(st, est.code, "%s", est.message);
		else if (est.code == STATUS_CORRUPT) /* there, but not readable */
			lose(sv, key, "its model spec is damaged (%s)", est.message);
		else
			lose(sv, key, "its model is not in the store");
		goto out;
	}
	int created = 0;
	if ((code = store_put_model(sv->out, m, &created, st)) != STATUS_OK)
		goto out;
	sv->res->models += created != 0;
	/* deferred: a damage found is said as found, not with the scratch
	 * store's quarantine (nothing of DIR is quarantined), and a damaged
	 * shared block loses each entry that uses it for that reason, when
	 * its turn comes; every piece is checked here before it is copied */
	if (store_restore_opt(sv->tmp, key, STORE_RESTORE_DEFER, &snap, &est) != STATUS_OK) {
		if (est.code == STATUS_INTERNAL)
			code = status_set(st, est.code, "%s", est.message);
		else
			lose(sv, key, "%s", est.message);
		goto out;
	}
	for (uint64_t c = 0; c < store_snapshot_chunks(snap); c++) {
		const void *data;
		size_t len;
		if (store_snapshot_chunk(snap, c, &data, &len, &est) != STATUS_OK) {
			lose(sv, key, "%s", est.message);
			goto out;
		}
	}
	blobs = calloc(snap->n_layers ? snap->n_layers : 1, sizeof(*blobs));
	for (uint32_t i = 0; blobs && i < snap->n_layers; i++) {
		const struct store_layer *l = &snap->layers[i];
		unsigned char *b = malloc(l->size ? (size_t)l->size : 1);
		if (!b && snap->bytes >= LARGE_ENTRY) {
			lose(sv, key,
			     "out of memory for its %llu bytes (layer %u): run the salvage again "
			     "with more memory to save it",
			     (unsigned long long)snap->bytes, i);
			goto out;
		}
		if (!b) {
			code = status_set(st, STATUS_INTERNAL, "out of memory for layer %u", i);
			goto out;
		}
		size_t at = 0;
		for (uint32_t j = 0; j < l->n_segments; j++) {
			memcpy(b + at, l->segments[j].data, l->segments[j].len);
			at += l->segments[j].len;
		}
		blobs[i] = (struct store_blob){.data = b, .size = l->size, .xxh3 = l->xxh3};
	}
	if (!blobs) {
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto out;
	}
	struct store_publish_req req = {.fingerprint = id.fp,
	                                .salt = id.salt,
	                                .salt_len = id.salt_len,
	                                .tokens = id.tokens,
	                                .n_tokens = id.n,
	                                .blobs = blobs,
	                                .n_blobs = snap->n_layers};
	struct store_publish_res pr;
	enum status_code pc = store_publish(sv->out, &req, &pr, &est);
	if (pc == STATUS_INVALID) /* it fails a check of the publish */
		lose(sv, key, "%s", est.message);
	else if (pc != STATUS_OK) /* NEWDIR cannot take it: nor the next */
		code = status_set(st, pc, "writing the new store: %s", est.message);
	else if (memcmp(pr.key, key, STORE_KEY_LEN) != 0)
		lose(sv, key, "it was stored under another key"); /* cannot happen: checked */
	else
		sv->res->saved++;
out:
	for (uint32_t i = 0; blobs && snap && i < snap->n_layers; i++)
		free((void *)blobs[i].data);
	free(blobs);
	store_snapshot_release(snap);
	model_free(m);
	free(id.tokens);
	free(id.salt);
	return code;
}

/* Every spec of the scratch store that decodes to its fingerprint goes to
 * the new store, used by a saved entry or not: a tenant's workers may not
 * add a model (tenancy), so one an admin added before they publish must
 * not be lost with the old store. */
struct spec_copy {
	struct salvage *sv;
	enum status_code code;
	struct status st;
};

static int copy_spec(const struct k3cache_model *spec, void *ctx)
{
	struct spec_copy *c = ctx;
	int created = 0;
	c->code = store_put_model(c->sv->out, spec, &created, &c->st);
	c->sv->res->models += created != 0;
	return c->code != STATUS_OK;
}

static enum status_code save_models(struct salvage *sv, struct status *st)
{
	struct spec_copy c = {.sv = sv};
	uint64_t damaged = 0; /* their entries were lost, and said so */
	enum status_code code = store_list_models(sv->tmp, copy_spec, &c, &damaged, st);
	if (code == STATUS_OK && c.code != STATUS_OK)
		code = status_set(st, c.code, "writing the new store: %s", c.st.message);
	return code;
}

static void remove_scratch(const char *dir)
{
	char p[4096 + 16];
	const char *files[] = {"data.mdb", "lock.mdb"};
	for (size_t i = 0; i < 2; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
		unlink(p);
	}
	rmdir(dir);
}

/* Copies what the walk reaches into the scratch store. */
static enum status_code copy_raw(const char *from, struct store *tmp, const unsigned char *map,
                                 size_t size, uint32_t *row_block, struct store_salvage_res *res,
                                 struct status *st)
{
	struct copy c = {.tmp = tmp};
	int rc = mdb_txn_begin(tmp->env, NULL, 0, &c.txn);
	if (rc)
		return store_mdb_error(st, rc, "salvage: the scratch store");
	struct store_walk_stats ws;
	rc = store_walk(map, size, 0, copy_item, &c, &ws, res->first_problem,
	                sizeof(res->first_problem));
	res->problems = ws.problems;
	res->txnid = ws.txnid;
	if (c.txn && !c.rc && rc == 0)
		c.rc = mdb_txn_commit(c.txn);
	else if (c.txn)
		mdb_txn_abort(c.txn);
	if (c.rc)
		return store_mdb_error(st, c.rc, "salvage: writing the scratch store");
	if (rc == -1)
		return status_set(st, STATUS_INTERNAL, "salvage: %s", res->first_problem);
	if (rc)
		return status_set(st, STATUS_CORRUPT, "%s: nothing can be read: %s", from,
		                  res->first_problem);
	*row_block = c.row_block;
	return STATUS_OK;
}

static int dir_is_empty(const char *dir)
{
	char p[4096];
	snprintf(p, sizeof(p), "%s/data.mdb", dir);
	struct stat sb;
	return stat(p, &sb) != 0 && errno == ENOENT;
}

enum status_code store_salvage(const char *from, const char *to,
                               void (*lost)(const uint8_t *key, const char *why, void *ctx),
                               void *ctx, struct store_salvage_res *res, struct status *st)
{
	memset(res, 0, sizeof(*res));
	char path[4096], scratch[4096];
	snprintf(path, sizeof(path), "%s/data.mdb", from);
	snprintf(scratch, sizeof(scratch), "%s/" SCRATCH, to);
	if (!dir_is_empty(to))
		return status_set(st, STATUS_INVALID,
		                  "%s already holds a store: name a new directory", to);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return status_set(st, STATUS_NOT_FOUND, "%s: %s", path, strerror(errno));
	struct stat sb;
	void *map = MAP_FAILED;
	if (fstat(fd, &sb) == 0 && sb.st_size > 0)
		map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return status_set(st, STATUS_CORRUPT, "%s: cannot map it", path);
	size_t size = (size_t)sb.st_size;
	madvise(map, size, MADV_SEQUENTIAL);

	enum status_code code;
	struct store *tmp = NULL, *out = NULL;
	struct found *found = NULL;
	size_t n = 0;
	if (mkdir(to, 0750) != 0 && errno != EEXIST) {
		code = status_set(st, STATUS_INTERNAL, "%s: cannot create: %s", to,
		                  strerror(errno));
		goto done;
	}
	/* room for everything the old file holds; nothing is evicted */
	uint64_t room = (uint64_t)size + (UINT64_C(1) << 30);
	struct store_options so = {.max_bytes = room,
	                           .map_size = room + (UINT64_C(256) << 20),
	                           .durability = STORE_FAST,
	                           .check = STORE_CHECK_NEVER};
	if ((code = store_open(scratch, &so, &tmp, st)) != STATUS_OK)
		goto done;
	uint32_t row_block = 0;
	if ((code = copy_raw(from, tmp, map, size, &row_block, res, st)) != STATUS_OK)
		goto done;
	so.row_block = row_block;
	so.map_size = 0;
	so.max_bytes = room * 2; /* blocks shared by no entry left are not copied */
	if ((code = store_open(to, &so, &out, st)) != STATUS_OK)
		goto done;
	struct salvage sv = {.tmp = tmp, .out = out, .lost = lost, .ctx = ctx, .res = res};
	int rc = list_entries(&sv, &found, &n);
	if (rc) {
		code = store_mdb_error(st, rc, "salvage: listing the entries");
		goto done;
	}
	for (size_t i = 0; i < n; i++) {
		struct status est;
		if (save_entry(&sv, found[i].key, &est) != STATUS_OK) {
			code = status_set(st, est.code,
			                  "salvage stopped at entry %zu of %zu: %s. No entry was "
			                  "given up for it: remove %s and run the salvage again",
			                  i + 1, n, est.message, to);
			goto done;
		}
	}
	if ((code = save_models(&sv, st)) != STATUS_OK)
		goto done;
	code = store_sync(out, st);
done:
	free(found);
	store_close(out);
	store_close(tmp);
	remove_scratch(scratch);
	munmap(map, size);
	return code;
}
