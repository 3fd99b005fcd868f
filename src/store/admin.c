/* admin: list, inspect, resolve key prefixes, evict, verify, stats
 * (store.h, "administration"). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blob.h"
#include "blocks.h"
#include "checksum.h"
#include "chunks.h"
#include "entry.h"
#include "hexutil.h"
#include "index.h"
#include "lru.h"
#include "models.h"
#include "prefix.h"
#include "record.h"
#include "restore.h"
#include "txn.h"

/* Fills an info from a record (salt and layers copied). */
static int info_from_record(const struct store_record *r, struct store_entry_info *info)
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
	info->stored = r->stored;
	info->created = r->created;
	info->last_used = r->last_used;
	info->hits = r->hits;
	info->quarantined = (r->flags & STORE_FLAG_QUARANTINED) != 0;
	for (uint32_t i = 0, mla = 0; i < r->n_layers; i++) {
		store_record_layer(r, i, &info->layers[i].tag, &info->layers[i].size,
		                   &info->layers[i].xxh3);
		if (info->layers[i].tag != BLOB_TAG_MLA)
			continue;
		info->mla_rows += r->prefix_len;
		for (uint32_t b = 0; r->row_block && b < r->prefix_len / r->row_block; b++)
			info->shared_rows += store_record_shared(r, mla, b) ? r->row_block : 0;
		mla++;
	}
	return 0;
}

enum status_code store_list(struct store *s, const uint8_t *model_fp, const uint8_t *after,
                            uint32_t limit,
                            int (*fn)(const struct store_entry_info *info, void *ctx), void *ctx,
                            struct status *st)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return store_mdb_error(st, rc, "list");
	if ((rc = mdb_cursor_open(txn, s->entries, &cur)) != 0) {
		mdb_txn_abort(txn);
		return store_mdb_error(st, rc, "list");
	}
	MDB_val k, v;
	if (after) {
		k.mv_size = STORE_KEY_LEN;
		k.mv_data = (void *)after;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
		if (rc == 0 && k.mv_size == STORE_KEY_LEN &&
		    !memcmp(k.mv_data, after, STORE_KEY_LEN))
			rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
	} else {
		rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
	}
	uint32_t n = 0;
	enum status_code code = STATUS_OK;
	for (; rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		if (store_record_decode(v.mv_data, v.mv_size, &r) != 0)
			continue; /* verify reports damaged records */
		if (model_fp && memcmp(r.fingerprint, model_fp, MODEL_FINGERPRINT_LEN) != 0)
			continue;
		struct store_entry_info info;
		if (info_from_record(&r, &info) != 0) {
			code = status_set(st, STATUS_INTERNAL, "out of memory");
			break;
		}
		int stop = fn(&info, ctx);
		free(info.salt);
		free(info.layers);
		if (stop || (limit && ++n >= limit))
			break;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return code;
}

static enum status_code inspect(struct store *s, const uint8_t key[STORE_KEY_LEN], int tokens,
                                struct store_entry_info **out, struct status *st)
{
	*out = NULL;
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return store_mdb_error(st, rc, "inspect");
	struct store_record r;
	rc = store_record_read(s, txn, key, &r);
	enum status_code code = STATUS_OK;
	struct store_entry_info *info = NULL;
	if (rc == MDB_NOTFOUND) {
		code = status_set(st, STATUS_NOT_FOUND, "no such entry");
	} else if (rc) {
		code = status_set(st, STATUS_CORRUPT, "the entry's record is damaged");
	} else if (!(info = malloc(sizeof(*info))) || info_from_record(&r, info) != 0) {
		free(info);
		info = NULL;
		code = status_set(st, STATUS_INTERNAL, "out of memory");
	} else {
		MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
		if (tokens && mdb_get(txn, s->tokens, &k, &v) == 0 &&
		    v.mv_size == (size_t)r.prefix_len * 4u) {
			if (!(info->tokens = malloc(v.mv_size))) {
				store_entry_info_free(info);
				info = NULL;
				code = status_set(st, STATUS_INTERNAL, "out of memory");
			} else {
				memcpy(info->tokens, v.mv_data, v.mv_size);
			}
		}
		*out = info;
	}
	mdb_txn_abort(txn);
	return code;
}

enum status_code store_inspect(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_entry_info **out, struct status *st)
{
	return inspect(s, key, 1, out, st);
}

enum status_code store_inspect_record(struct store *s, const uint8_t key[STORE_KEY_LEN],
                                      struct store_entry_info **out, struct status *st)
{
	return inspect(s, key, 0, out, st);
}

enum status_code store_resolve_key(struct store *s, const char *hex, uint8_t key[STORE_KEY_LEN],
                                   struct status *st)
{
	size_t n = strlen(hex);
	if (n == 0 || n > (size_t)2 * STORE_KEY_LEN)
		return status_set(st, STATUS_INVALID, "a key is 1 to 64 hex digits");
	uint8_t start[STORE_KEY_LEN] = {0};
	char norm[2 * STORE_KEY_LEN + 1] = {0};
	for (size_t i = 0; i < n; i++) {
		char c = hex[i];
		if (c >= 'A' && c <= 'F')
			c = (char)(c - 'A' + 'a');
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return status_set(st, STATUS_INVALID, "\"%s\" is not a hex key", hex);
		norm[i] = c;
		uint8_t nib = (uint8_t)(c <= '9' ? c - '0' : c - 'a' + 10);
		start[i / 2] |= (uint8_t)(i % 2 ? nib : nib << 4);
	}
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return store_mdb_error(st, rc, "resolve key");
	if ((rc = mdb_cursor_open(txn, s->entries, &cur)) != 0) {
		mdb_txn_abort(txn);
		return store_mdb_error(st, rc, "resolve key");
	}
	MDB_val k = {STORE_KEY_LEN, start}, v;
	int found = 0;
	char list[STATUS_MESSAGE_MAX - 64] = "";
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size != STORE_KEY_LEN)
			continue;
		char full[2 * STORE_KEY_LEN + 1];
		hexutil_encode(k.mv_data, STORE_KEY_LEN, full);
		if (strncmp(full, norm, n) != 0)
			break;
		if (found == 0)
			memcpy(key, k.mv_data, STORE_KEY_LEN);
		if (found < 4) {
			size_t used = strlen(list);
			snprintf(list + used, sizeof(list) - used, "%s%.16s", found ? ", " : "",
			         full);
		}
		found++;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (found == 0)
		return status_set(st, STATUS_NOT_FOUND, "no entry has a key starting with %s",
		                  norm);
	if (found > 1)
		return status_set(st, STATUS_INVALID,
		                  "key prefix %s is ambiguous: %d entries (%s%s)", norm, found,
		                  list, found > 4 ? ", ..." : "");
	return STATUS_OK;
}

struct keylist {
	uint8_t (*keys)[STORE_KEY_LEN];
	size_t n, cap;
};

static int keylist_add(struct keylist *l, const uint8_t *key)
{
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 64;
		uint8_t(*nk)[STORE_KEY_LEN] = realloc(l->keys, ncap * (size_t)STORE_KEY_LEN);
		if (!nk)
			return ENOMEM;
		l->keys = nk;
		l->cap = ncap;
	}
	memcpy(l->keys[l->n++], key, STORE_KEY_LEN);
	return 0;
}

/* Sums what an eviction reports, and passes each report on. */
struct tally {
	void (*fn)(const uint8_t *key, uint64_t bytes, void *ctx);
	void *ctx;
	uint64_t bytes;
};

static void tally_cb(const uint8_t *key, uint64_t bytes, void *ctx)
{
	struct tally *t = ctx;
	t->bytes += bytes;
	if (t->fn)
		t->fn(key, bytes, t->ctx);
}

/* Collects the keys of entries matching the model / idle / all selector;
 * for a dry run (dry), an entry's last use as the uses held in memory would
 * leave it (dry.h). */
static int select_keys(struct store *s, MDB_txn *txn, const struct store_evict_req *req,
                       const struct store_dry *dry, struct keylist *out)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	uint64_t now = store_now(s);
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		if (store_record_decode(v.mv_data, v.mv_size, &r) != 0) {
			/* damaged: --all removes it too */
			if (req->all && k.mv_size == STORE_KEY_LEN &&
			    (rc = keylist_add(out, k.mv_data)) != 0)
				break;
			continue;
		}
		int pick = req->all;
		if (req->model)
			pick = !memcmp(r.fingerprint, req->model, MODEL_FINGERPRINT_LEN);
		if (req->idle_seconds) {
			const struct store_dry_move *m = dry ? store_dry_moved(dry, r.key) : NULL;
			uint64_t last = m ? m->when : r.last_used;
			pick = now > last && now - last > req->idle_seconds;
		}
		if (pick && (rc = keylist_add(out, r.key)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

enum status_code store_evict(struct store *s, const struct store_evict_req *req,
                             void (*fn)(const uint8_t key[STORE_KEY_LEN], uint64_t bytes,
                                        void *ctx),
                             void *ctx, struct store_evict_res *res, struct status *st)
{
	memset(res, 0, sizeof(*res));
	int selectors = (req->n_keys > 0) + (req->model != NULL) + (req->idle_seconds > 0) +
	                (req->to_bytes_set != 0) + (req->all != 0);
	if (selectors != 1)
		return status_set(
		        st, STATUS_INVALID,
		        "evict takes exactly one selector: keys, model, idle, to-size or all");
	if (s->opt.read_only && !req->dry_run)
		return status_set(st, STATUS_UNSUPPORTED, "the store is open read-only");
	/* a dry run evicts by the same code, writing nothing (dry.h), in a
	 * read-only transaction: it needs no page of the map, so it answers on a
	 * full one too. The uses held in memory decide the LRU order and the
	 * last uses a real evict sees (it writes them first): a dry run takes
	 * them as they would be written, and leaves them pending. */
	enum status_code code = STATUS_OK;
	struct store_dry dry_run = {0}, *dry = req->dry_run ? &dry_run : NULL;
	MDB_txn *txn;
	int rc = dry ? mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) : store_txn_write(s, &txn);
	if (rc)
		return store_mdb_error(st, rc, "evict");
	struct store_totals t, before;
	rc = dry ? store_lru_dry_touches(s, txn, dry) : store_lru_apply_touches(s, txn);
	if (rc || (rc = store_totals_get(s, txn, &t)) != 0) {
		store_dry_free(&dry_run);
		return store_mdb_error(st, store_txn_end(txn, rc), "evict");
	}
	before = t;
	if (req->to_bytes_set) {
		struct tally tally = {fn, ctx, 0};
		rc = store_lru_evict(s, txn, &t, req->to_bytes, dry, tally_cb, &tally,
		                     &res->entries);
		res->bytes = tally.bytes; /* what goes (the totals are counted again) */
	} else {
		struct keylist keys = {0};
		if (req->n_keys) {
			for (uint32_t i = 0; i < req->n_keys && !rc; i++)
				rc = keylist_add(&keys, req->keys[i]);
		} else {
			rc = select_keys(s, txn, req, dry, &keys);
		}
		for (size_t i = 0; i < keys.n && !rc; i++) {
			uint64_t freed;
			int got = store_lru_evict_key(s, txn, keys.keys[i], &t, dry, &freed);
			if (got == MDB_NOTFOUND)
				continue;
			if (got) {
				rc = got;
				break;
			}
			if (fn)
				fn(keys.keys[i], freed, ctx);
			res->entries++;
			res->bytes += freed;
		}
		free(keys.keys);
		if (!rc && req->n_keys && res->entries == 0) {
			code = status_set(st, STATUS_NOT_FOUND, "no such entry");
			rc = STORE_TXN_NOTHING;
		}
	}
	store_dry_free(&dry_run);
	if (!rc && req->dry_run)
		rc = STORE_TXN_NOTHING; /* nothing is written */
	if (!rc && (t.bytes != before.bytes || res->entries))
		rc = store_totals_put(s, txn, &t);
	rc = store_txn_end(txn, rc);
	if (rc && rc != STORE_TXN_NOTHING)
		return store_mdb_error(st, rc, "evict");
	return code;
}

static const char *check_layers(const struct store_snapshot *snap, char *why, size_t whysz)
{
	for (uint32_t i = 0; i < snap->n_layers; i++) {
		const struct store_layer *l = &snap->layers[i];
		struct checksum_run cs;
		checksum_run_begin(&cs, i);
		uint64_t size = 0;
		for (uint32_t j = 0; j < l->n_segments; j++) {
			checksum_run_update(&cs, l->segments[j].data, l->segments[j].len);
			size += l->segments[j].len;
		}
		uint64_t sum = checksum_run_end(&cs);
		if (size != l->size || sum != l->xxh3) {
			snprintf(why, whysz, "layer %u fails its checksum", i);
			return why;
		}
	}
	return NULL;
}

#define QUARANTINED_EARLIER                                                                        \
	"the entry was quarantined earlier (found damaged); evict it, or publish it again"

/* Whether an entry exists now, and is quarantined (a fresh read). */
static int entry_state(struct store *s, const uint8_t *key, int *quarantined)
{
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return rc;
	struct store_record r;
	rc = store_record_read(s, txn, key, &r);
	*quarantined = rc == 0 && (r.flags & STORE_FLAG_QUARANTINED);
	mdb_txn_abort(txn);
	return rc;
}

/* A reference to a shared block: node | layer. */
struct block_ref {
	unsigned char k[STORE_BLOCK_REF_LEN];
};

static int block_ref_cmp(const void *a, const void *b)
{
	return memcmp(a, b, STORE_BLOCK_REF_LEN);
}

struct refs {
	struct block_ref *v;
	size_t n, cap;
};

static int add_ref(const uint8_t *key, const uint8_t *node, uint32_t layer, void *ctx)
{
	(void)key;
	struct refs *r = ctx;
	if (r->n == r->cap) {
		size_t nc = r->cap ? r->cap * 2 : 256;
		struct block_ref *nv = realloc(r->v, nc * sizeof(*nv));
		if (!nv)
			return ENOMEM;
		r->v = nv;
		r->cap = nc;
	}
	memcpy(r->v[r->n].k, node, PREFIX_NODE_LEN);
	store_be32(r->v[r->n].k + PREFIX_NODE_LEN, layer);
	r->n++;
	return 0;
}

/* The references to shared blocks, sorted: the records' and those staged
 * publishes in progress hold. */
static int collect_block_refs(struct store *s, MDB_txn *txn, struct block_ref **out, size_t *n_out)
{
	struct refs r = {0};
	int rc = store_entry_each_use(s, txn, add_ref, &r);
	if (!rc)
		rc = store_blocks_each_held(s, txn, add_ref, &r);
	if (rc) {
		free(r.v);
		return rc;
	}
	if (r.n)
		qsort(r.v, r.n, sizeof(*r.v), block_ref_cmp);
	*out = r.v;
	*n_out = r.n;
	return 0;
}

/* Checks the shared blocks: every count against the records that use the
 * block, both parts whole, and no part without a count. Each problem goes
 * to fn with a NULL key. */
static int verify_blocks(struct store *s,
                         void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why, void *ctx),
                         void *ctx, uint64_t *problems)
{
	if (!s->has_blocks)
		return 0;
	MDB_txn *txn;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		return rc;
	struct block_ref *refs = NULL;
	size_t n = 0, at = 0;
	uint64_t counted = 0;
	char why[STATUS_MESSAGE_MAX];
	MDB_cursor *cur = NULL;
	if ((rc = collect_block_refs(s, txn, &refs, &n)) != 0 ||
	    (rc = mdb_cursor_open(txn, s->blockrefs, &cur)) != 0)
		goto out;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size != STORE_BLOCK_REF_LEN)
			continue;
		uint32_t layer = store_get_be32((const unsigned char *)k.mv_data + PREFIX_NODE_LEN);
		uint32_t count = v.mv_size == 4 ? store_get_be32(v.mv_data) : 0, used = 0;
		while (at < n && memcmp(refs[at].k, k.mv_data, STORE_BLOCK_REF_LEN) < 0)
			at++; /* a record naming a missing block: its own check reports it */
		for (; at < n && !memcmp(refs[at].k, k.mv_data, STORE_BLOCK_REF_LEN); at++)
			used++;
		counted++;
		if (count != used) {
			(*problems)++;
			snprintf(why, sizeof(why),
			         "a shared block of layer %u counts %u references; %u entries use "
			         "it",
			         layer, count, used);
			if (fn)
				fn(NULL, why, ctx);
		}
		for (unsigned part = 0; part < 2; part++) {
			MDB_val pv;
			int g = store_blocks_get(s, txn, k.mv_data, layer, part, &pv);
			if (g == 0 && store_blocks_intact(&pv, layer))
				continue;
			if (g && g != MDB_NOTFOUND) {
				rc = g;
				goto out;
			}
			(*problems)++;
			snprintf(why, sizeof(why), "a shared block of layer %u: its %s rows %s",
			         layer, part ? "v" : "k",
			         g ? "are missing" : "fail their checksum");
			if (fn)
				fn(NULL, why, ctx);
		}
	}
	if (rc == MDB_NOTFOUND)
		rc = 0;
	MDB_stat ms;
	if (!rc && mdb_stat(txn, s->blocks, &ms) == 0 && ms.ms_entries > counted * 2) {
		(*problems)++;
		snprintf(why, sizeof(why), "%llu shared block parts belong to no counted block",
		         (unsigned long long)(ms.ms_entries - counted * 2));
		if (fn)
			fn(NULL, why, ctx);
	}
out:
	if (cur)
		mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	free(refs);
	return rc;
}

/* Repairs what the block check found, once every entry's uses are known:
 * each count made again from the records and held rows, in one
 * transaction (store_blocks_recount), and the totals with them. A record
 * whose damage was found only after its blocks' counts lost it (it was
 * removed, its map unreadable) left them counted for ever: their bytes
 * were never freed, and every verify said so. */
static enum status_code repair_blocks(struct store *s,
                                      void (*fn)(const uint8_t *key, const char *why, void *ctx),
                                      void *ctx, struct status *st)
{
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return store_mdb_error(st, rc, "verify: repairing the shared blocks");
	struct block_ref *refs = NULL;
	size_t n = 0;
	uint64_t fixed = 0, freed = 0;
	struct store_totals t;
	if ((rc = collect_block_refs(s, txn, &refs, &n)) == 0)
		rc = store_blocks_recount(s, txn, (const unsigned char *)refs, n, &fixed, &freed);
	free(refs);
	if (!rc && fixed && (rc = store_totals_get(s, txn, &t)) == 0 &&
	    (rc = store_entry_recount(s, txn, &t)) == 0)
		rc = store_totals_put(s, txn, &t);
	if ((rc = store_txn_end(txn, rc)) != 0)
		return store_mdb_error(st, rc, "verify: repairing the shared blocks");
	if (fn && fixed) {
		char why[STATUS_MESSAGE_MAX];
		snprintf(why, sizeof(why),
		         "repaired: %" PRIu64
		         " shared blocks counted again from the entries (%" PRIu64
		         " bytes of blocks no entry uses freed)",
		         fixed, freed);
		fn(NULL, why, ctx);
	}
	return STATUS_OK;
}

/* Repairs what the index check found: the touches batched in memory go
 * out first, then the prefix and LRU indexes are made again from the
 * entries, in one transaction. */
static enum status_code rebuild_indexes(struct store *s,
                                        void (*fn)(const uint8_t *key, const char *why, void *ctx),
                                        void *ctx, struct status *st)
{
	store_flush(s, NULL);
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (rc)
		return store_mdb_error(st, rc, "verify: rebuilding the indexes");
	uint64_t n = 0;
	if ((rc = store_txn_end(txn, store_index_rebuild(s, txn, &n))) != 0)
		return store_mdb_error(st, rc, "verify: rebuilding the indexes");
	atomic_fetch_add(&s->indexes_rebuilt, 1);
	if (fn) {
		char why[STATUS_MESSAGE_MAX];
		snprintf(why, sizeof(why),
		         "repaired: the prefix and LRU indexes were made again from the entries "
		         "(%" PRIu64 " served)",
		         n);
		fn(NULL, why, ctx);
	}
	return STATUS_OK;
}

/* What a verify step counts an entry as at least, in bytes read: a step of a
 * store of small entries takes about as long as one of large ones. */
#define VERIFY_ENTRY_COST (UINT64_C(256) << 10)

struct store_verify {
	struct store *s;
	struct keylist keys;       /* to check, chunk by chunk */
	struct keylist bad;        /* tokens missing or of the wrong length */
	struct keylist held;       /* quarantined before this verify */
	struct keylist unreadable; /* records that do not decode */
	struct keylist misnamed;   /* key != SHA-256(model, salt, tokens) */
	int reported;              /* the lists but keys have gone to fn */
	size_t next;               /* the next of keys to check */
	uint64_t checked, damaged;
	uint64_t bytes_total; /* of the entries in keys (their records' sizes) */
	uint64_t bytes_done;  /* of them, those checked so far */
};

enum status_code store_verify_begin(struct store *s, struct store_verify **out, struct status *st)
{
	*out = NULL;
	struct store_verify *v = calloc(1, sizeof(*v));
	if (!v)
		return status_set(st, STATUS_INTERNAL, "verify: out of memory");
	v->s = s;
	MDB_txn *txn;
	MDB_cursor *cur;
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		store_verify_end(v);
		return store_mdb_error(st, rc, "verify");
	}
	if ((rc = mdb_cursor_open(txn, s->entries, &cur)) != 0) {
		mdb_txn_abort(txn);
		store_verify_end(v);
		return store_mdb_error(st, rc, "verify");
	}
	MDB_val k, val;
	for (rc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
		struct store_record r;
		if (k.mv_size != STORE_KEY_LEN)
			continue;
		int added;
		if (store_record_decode(val.mv_data, val.mv_size, &r) != 0 ||
		    memcmp(r.key, k.mv_data, STORE_KEY_LEN) != 0) {
			added = keylist_add(&v->unreadable, k.mv_data);
		} else {
			MDB_val tv;
			if (r.flags & STORE_FLAG_QUARANTINED)
				added = keylist_add(&v->held, r.key);
			else if (mdb_get(txn, s->tokens, &k, &tv) != 0 ||
			         tv.mv_size != (size_t)r.prefix_len * 4u)
				added = keylist_add(&v->bad, r.key);
			else if (!store_index_key_matches(&r, &tv))
				added = keylist_add(&v->misnamed, r.key);
			else if ((added = keylist_add(&v->keys, r.key)) == 0)
				v->bytes_total += r.bytes;
		}
		if (added) {
			rc = added;
			break;
		}
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (rc != MDB_NOTFOUND) {
		store_verify_end(v);
		return store_mdb_error(st, rc, "verify");
	}
	*out = v;
	return STATUS_OK;
}

/* Reports (and quarantines) each key of l as damaged, for why. */
static void report_all(struct store_verify *v, const struct keylist *l, const char *reason,
                       void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why, void *ctx),
                       void *ctx, int quarantine)
{
	char why[STATUS_MESSAGE_MAX];
	for (size_t i = 0; i < l->n; i++) {
		v->checked++;
		v->damaged++;
		snprintf(why, sizeof(why), "%s", reason);
		if (quarantine)
			store_quarantine_say(v->s, l->keys[i], why, sizeof(why));
		if (fn)
			fn(l->keys[i], why, ctx);
	}
}

/* Checks one entry of the list: its chunks against their sums, then each
 * layer whole. Adds the bytes read to *bytes. */
/* Checks one entry and quarantines it when damaged. Not OK only when the
 * check could not run (out of memory, say): the entry is then neither
 * counted nor touched, and the verify stops with that error. */
static enum status_code verify_one(struct store_verify *v, const uint8_t *key,
                                   void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why,
                                              void *ctx),
                                   void *ctx, uint64_t *bytes, struct status *st)
{
	struct store *s = v->s;
	char why[STATUS_MESSAGE_MAX];
	struct store_snapshot *snap;
	struct status rst;
	/* no flags: a damaged chunk is not quarantined by the restore, here */
	enum status_code code = store_restore_opt(s, key, STORE_RESTORE_DEFER, &snap, &rst);
	if (code == STATUS_INTERNAL)
		return status_set(st, code, "verify: %s", rst.message);
	v->checked++;
	if (code == STATUS_OK) {
		*bytes += snap->bytes;
		v->bytes_done += snap->bytes;
		const char *bad_layer = NULL;
		for (uint64_t c = 0; c < store_snapshot_chunks(snap) && !bad_layer; c++) {
			const void *data;
			size_t len;
			if (store_snapshot_chunk(snap, c, &data, &len, &rst) != STATUS_OK)
				bad_layer = rst.message;
		}
		if (!bad_layer)
			bad_layer = check_layers(snap, why, sizeof(why));
		store_snapshot_release(snap);
		if (!bad_layer)
			return STATUS_OK;
		if (bad_layer != why)
			snprintf(why, sizeof(why), "%s", bad_layer);
	} else if (code == STATUS_CORRUPT) {
		snprintf(why, sizeof(why), "%.200s", rst.message);
	} else {
		int quarantined = 0;
		if (code == STATUS_NOT_FOUND && entry_state(s, key, &quarantined) == MDB_NOTFOUND) {
			v->checked--;
			return STATUS_OK; /* evicted meanwhile */
		}
		v->damaged++;
		if (fn)
			fn(key, quarantined ? "the entry was quarantined meanwhile" : rst.message,
			   ctx);
		return STATUS_OK;
	}
	v->damaged++;
	store_quarantine_say(s, key, why, sizeof(why));
	if (fn)
		fn(key, why, ctx);
	return STATUS_OK;
}

enum status_code store_verify_step(struct store_verify *v, uint64_t budget,
                                   void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why,
                                              void *ctx),
                                   void *ctx, int *done, struct status *st)
{
	struct store *s = v->s;
	*done = 0;
	if (!v->reported) {
		report_all(v, &v->unreadable, "the entry's record is damaged", fn, ctx, 1);
		report_all(v, &v->held, QUARANTINED_EARLIER, fn, ctx, 0);
		report_all(v, &v->misnamed,
		           "the entry's key is not the SHA-256 of its model, salt and tokens: its "
		           "record or token list is damaged",
		           fn, ctx, 1);
		report_all(v, &v->bad, "the entry's tokens are missing or damaged", fn, ctx, 1);
		v->reported = 1;
	}
	uint64_t bytes = 0;
	while (v->next < v->keys.n && (bytes < budget || bytes == 0)) {
		uint64_t read = 0;
		enum status_code code = verify_one(v, v->keys.keys[v->next], fn, ctx, &read, st);
		if (code != STATUS_OK)
			return code; /* unchecked, untouched: the verify ends here */
		v->next++;
		/* an entry costs its lookups and transactions whatever its size */
		bytes += read > VERIFY_ENTRY_COST ? read : VERIFY_ENTRY_COST;
	}
	if (v->next < v->keys.n)
		return STATUS_OK;
	/* the entries are done: the shared blocks (counts, parts, orphans),
	 * then the indexes */
	*done = 1;
	uint64_t problems = 0;
	int rc;
	if ((rc = verify_blocks(s, fn, ctx, &problems)) != 0)
		return store_mdb_error(st, rc, "verify: the shared blocks");
	/* every entry's uses known (none unreadable), the counts can be made
	 * again from them */
	enum status_code code;
	if (problems && !s->opt.read_only && !v->unreadable.n && !v->misnamed.n && !v->bad.n &&
	    (code = repair_blocks(s, fn, ctx, st)) != STATUS_OK)
		return code;
	MDB_txn *txn;
	if ((rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn)) != 0)
		return store_mdb_error(st, rc, "verify");
	uint64_t index_problems = 0, model_problems = 0;
	rc = store_index_verify(s, txn, fn, ctx, &index_problems);
	/* the specs: one damaged leaves its entries served, but not salvaged */
	int mrc = rc ? 0 : store_models_verify(s, txn, fn, ctx, &model_problems);
	mdb_txn_abort(txn);
	if (rc)
		return store_mdb_error(st, rc, "verify: the indexes");
	if (mrc)
		return store_mdb_error(st, mrc, "verify: the model specs");
	v->damaged += problems + index_problems + model_problems;
	if (index_problems && !s->opt.read_only)
		return rebuild_indexes(s, fn, ctx, st);
	return STATUS_OK;
}

void store_verify_counts(const struct store_verify *v, uint64_t *checked, uint64_t *damaged)
{
	*checked = v->checked;
	*damaged = v->damaged;
}

uint64_t store_verify_left(const struct store_verify *v)
{
	return v->keys.n - v->next;
}

void store_verify_progress(const struct store_verify *v, uint64_t *done, uint64_t *total)
{
	*total = v->bytes_total;
	/* an entry evicted or damaged meanwhile reads less than its size */
	*done = v->next == v->keys.n ? v->bytes_total : v->bytes_done;
}

void store_verify_end(struct store_verify *v)
{
	if (!v)
		return;
	free(v->keys.keys);
	free(v->bad.keys);
	free(v->held.keys);
	free(v->unreadable.keys);
	free(v->misnamed.keys);
	free(v);
}

enum status_code store_verify(struct store *s,
                              void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why,
                                         void *ctx),
                              void *ctx, uint64_t *checked, uint64_t *damaged, struct status *st)
{
	*checked = *damaged = 0;
	struct store_verify *v;
	enum status_code code = store_verify_begin(s, &v, st);
	int done = 0;
	while (code == STATUS_OK && v && !done)
		code = store_verify_step(v, UINT64_MAX, fn, ctx, &done, st);
	if (v)
		store_verify_counts(v, checked, damaged);
	store_verify_end(v);
	return code;
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
	out->unclean_stop = s->unclean_stop;
	out->checked = s->checked;
	out->check_ms = s->check_ms;
	out->checked_pages = s->checked_pages;
	struct store_totals t;
	if (store_totals_get(s, txn, &t) == 0) {
		out->bytes = t.bytes;
		out->logical_bytes = t.logical;
	}
	if (s->has_blocks && mdb_stat(txn, s->blockrefs, &ms) == 0)
		out->blocks = ms.ms_entries;
	out->row_block = s->row_block;
	out->blocks_mismatched = atomic_load(&s->blocks_mismatched);
	out->models_repaired = atomic_load(&s->models_repaired);
	out->models_damaged = atomic_load(&s->models_damaged);
	out->indexes_rebuilt = atomic_load(&s->indexes_rebuilt);
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
