/* index_verify: the prefix and LRU indexes checked against the entries
 * (index.h, store_index_verify). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hexutil.h"
#include "index.h"
#include "prefix.h"

/* Past this many nodes on the entries' paths (16 bytes each) the node
 * counts are not checked: verify stays within memory on any store. */
#define NODE_CHECK_MAX (UINT64_C(1) << 24)

struct index_check {
	struct store *s;
	MDB_txn *txn;
	void (*fn)(const uint8_t *key, const char *why, void *ctx);
	void *ctx;
	uint64_t *problems;
	uint8_t (*nodes)[PREFIX_NODE_LEN]; /* every entry's path, for the counts */
	uint64_t n_nodes, cap_nodes;
	int too_many;
	uint64_t skipped; /* damaged entries, whose path is not known */
};

int store_index_key_matches(const struct store_record *r, const MDB_val *tokens)
{
	uint32_t *t = malloc(tokens->mv_size ? tokens->mv_size : 1);
	uint8_t want[PREFIX_KEY_LEN];
	if (!t)
		return 1;                            /* out of memory: not evidence of damage */
	memcpy(t, tokens->mv_data, tokens->mv_size); /* LMDB values are not aligned */
	int ok = prefix_key(r->fingerprint, r->salt, r->salt_len, t, r->prefix_len, want) != 0 ||
	         memcmp(want, r->key, STORE_KEY_LEN) == 0;
	free(t);
	return ok;
}

static void say(struct index_check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(struct index_check *c, const char *fmt, ...)
{
	char why[STATUS_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	(*c->problems)++;
	if (c->fn)
		c->fn(NULL, why, c->ctx);
}

static int add_nodes(struct index_check *c, uint8_t (*h)[PREFIX_NODE_LEN], uint32_t depth)
{
	if (c->too_many || !depth)
		return 0;
	if (c->n_nodes + depth > NODE_CHECK_MAX) {
		c->too_many = 1;
		return 0;
	}
	if (c->n_nodes + depth > c->cap_nodes) {
		uint64_t cap = c->cap_nodes ? c->cap_nodes * 2 : 4096;
		while (cap < c->n_nodes + depth)
			cap *= 2;
		void *p = realloc(c->nodes, (size_t)cap * PREFIX_NODE_LEN);
		if (!p)
			return ENOMEM;
		c->nodes = p;
		c->cap_nodes = cap;
	}
	memcpy(c->nodes + c->n_nodes, h + 1, (size_t)depth * PREFIX_NODE_LEN);
	c->n_nodes += depth;
	return 0;
}

/* One entry: its LRU row and its attach row, and its path's nodes kept. */
static int check_entry(struct index_check *c, const struct store_record *r)
{
	char hex[17];
	hexutil_encode(r->key, 8, hex);
	unsigned char lk[8 + STORE_KEY_LEN];
	store_be64(lk, r->lru_seq);
	memcpy(lk + 8, r->key, STORE_KEY_LEN);
	MDB_val k = {sizeof(lk), lk}, v;
	int rc = mdb_get(c->txn, c->s->lru, &k, &v);
	if (rc == MDB_NOTFOUND)
		say(c, "the LRU index has no row for entry %s...: eviction cannot reach it", hex);
	else if (rc)
		return rc;
	MDB_val tv;
	rc = store_index_tokens(c->s, c->txn, r->key, &tv);
	if (rc && rc != MDB_NOTFOUND)
		return rc;
	if (rc || tv.mv_size != (size_t)r->prefix_len * 4u || !store_index_key_matches(r, &tv)) {
		c->skipped++; /* the entry's own check reports it */
		return 0;
	}
	uint32_t *t = malloc(tv.mv_size ? tv.mv_size : 1);
	uint32_t depth = r->prefix_len / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	if (!t || !h) {
		free(t);
		free(h);
		return ENOMEM;
	}
	memcpy(t, tv.mv_data, tv.mv_size); /* LMDB values are not aligned */
	prefix_block_hashes(r->fingerprint, r->salt, r->salt_len, t, r->prefix_len, h);
	unsigned char av[STORE_ATTACH_LEN];
	store_be32(av, r->prefix_len);
	store_be64(av + 4, store_index_tail_hash(t, depth * PREFIX_BLOCK, r->prefix_len));
	memcpy(av + 12, r->key, STORE_KEY_LEN);
	MDB_val ak = {PREFIX_NODE_LEN, h[depth]}, avv = {sizeof(av), av};
	MDB_cursor *cur;
	rc = mdb_cursor_open(c->txn, c->s->attach, &cur);
	if (!rc) {
		rc = mdb_cursor_get(cur, &ak, &avv, MDB_GET_BOTH);
		mdb_cursor_close(cur);
		if (rc == MDB_NOTFOUND) {
			say(c,
			    "the prefix index has no attach row for entry %s...: lookups cannot "
			    "find it",
			    hex);
			rc = 0;
		}
	}
	if (!rc)
		rc = add_nodes(c, h, depth);
	free(t);
	free(h);
	return rc;
}

static int cmp_node(const void *a, const void *b)
{
	return memcmp(a, b, PREFIX_NODE_LEN);
}

/* The node counts against the paths: a node missing, or counting fewer
 * entries than pass through it, can hide entries from lookups (one line for
 * all). Counts above the paths, like rows of entries that are gone, are
 * left-overs lookups skip, and are not reported. */
static int check_nodes(struct index_check *c)
{
	if (c->too_many) {
		say(c,
		    "the prefix index's node counts were not checked: the entries' paths "
		    "have over %" PRIu64 " nodes",
		    NODE_CHECK_MAX);
		return 0;
	}
	if (c->n_nodes)
		qsort(c->nodes, (size_t)c->n_nodes, PREFIX_NODE_LEN, cmp_node);
	MDB_cursor *cur;
	int rc = mdb_cursor_open(c->txn, c->s->nodes, &cur);
	if (rc)
		return rc;
	uint64_t at = 0, wrong = 0, missing = 0;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size != PREFIX_NODE_LEN)
			continue;
		for (; at < c->n_nodes && memcmp(c->nodes[at], k.mv_data, PREFIX_NODE_LEN) < 0;
		     at++)
			if (!at || memcmp(c->nodes[at - 1], c->nodes[at], PREFIX_NODE_LEN) != 0)
				missing++;
		uint64_t used = 0;
		for (; at < c->n_nodes && !memcmp(c->nodes[at], k.mv_data, PREFIX_NODE_LEN); at++)
			used++;
		uint32_t count = v.mv_size == 4 ? store_get_be32(v.mv_data) : 0;
		wrong += count < used;
	}
	mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND)
		return rc;
	for (; at < c->n_nodes; at++)
		if (!at || memcmp(c->nodes[at - 1], c->nodes[at], PREFIX_NODE_LEN) != 0)
			missing++;
	if (wrong || missing)
		say(c,
		    "the prefix index's nodes: %" PRIu64 " count fewer entries than pass through "
		    "them, %" PRIu64 " are missing: lookups may miss entries",
		    wrong, missing);
	return 0;
}

/* Calls fn for every entry whose record decodes under its own key (the
 * entries' own check reports the others); a nonzero return stops the walk
 * and is returned. The entries table is only read: fn may write others. */
static int each_record(struct store *s, MDB_txn *txn,
                       int (*fn)(const struct store_record *r, void *ctx), void *ctx)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->entries, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		if (k.mv_size != STORE_KEY_LEN ||
		    store_record_decode(v.mv_data, v.mv_size, &r) != 0 ||
		    memcmp(r.key, k.mv_data, STORE_KEY_LEN) != 0)
			continue;
		if ((rc = fn(&r, ctx)) != 0)
			break;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

static int check_one(const struct store_record *r, void *ctx)
{
	return check_entry(ctx, r);
}

int store_index_verify(struct store *s, MDB_txn *txn,
                       void (*fn)(const uint8_t *key, const char *why, void *ctx), void *ctx,
                       uint64_t *problems)
{
	struct index_check c = {.s = s, .txn = txn, .fn = fn, .ctx = ctx, .problems = problems};
	int rc = each_record(s, txn, check_one, &c);
	if (!rc)
		rc = check_nodes(&c);
	free(c.nodes);
	return rc;
}

struct rebuild {
	struct store *s;
	MDB_txn *txn;
	uint64_t served;
};

/* One entry's LRU row, and its path when it is served. */
static int rebuild_one(const struct store_record *r, void *ctx)
{
	struct rebuild *b = ctx;
	int rc = store_index_lru_add(b->s, b->txn, r->lru_seq, r->key);
	if (rc)
		return rc;
	MDB_val k = {STORE_KEY_LEN, (void *)r->key}, tv;
	if (r->flags & STORE_FLAG_QUARANTINED || mdb_get(b->txn, b->s->tokens, &k, &tv) != 0 ||
	    tv.mv_size != (size_t)r->prefix_len * 4u || !store_index_key_matches(r, &tv))
		return 0; /* not served: no lookup needs to find it */
	uint32_t *tokens = malloc(tv.mv_size ? tv.mv_size : 1);
	if (!tokens)
		return ENOMEM;
	memcpy(tokens, tv.mv_data, tv.mv_size); /* the put below may move it */
	rc = store_index_add(b->s, b->txn, r->fingerprint, r->salt, r->salt_len, tokens,
	                     r->prefix_len, r->key);
	free(tokens);
	b->served += rc == 0;
	return rc;
}

int store_index_rebuild(struct store *s, MDB_txn *txn, uint64_t *entries)
{
	*entries = 0;
	int rc;
	if ((rc = mdb_drop(txn, s->nodes, 0)) != 0 || (rc = mdb_drop(txn, s->attach, 0)) != 0 ||
	    (rc = mdb_drop(txn, s->lru, 0)) != 0)
		return rc;
	/* a record that does not read gets no row: verify names it */
	struct rebuild b = {.s = s, .txn = txn};
	rc = each_record(s, txn, rebuild_one, &b);
	*entries = b.served;
	return rc;
}
