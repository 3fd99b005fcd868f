/* tier2_lookup: the longest stored prefix of a prompt in the cluster
 * (tier2.h, "Lookup"). */
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "tier2/tier2_io.h"

#define NODES_FIRST_TRIP 8u   /* HGETALLs in the first round trip of the walk */
#define NODES_MAX_TRIP   512u /* and at most this many in one: each trip doubles */
#define RECORDS_PER_TRIP 8u   /* candidate records per round trip */

struct cand {
	uint32_t p;
	uint8_t key[TIER2_KEY_LEN];
};

struct look {
	struct cluster_router *r;
	const char *ns;
	const uint8_t *fingerprint;
	const void *salt;
	size_t salt_len;
	const uint32_t *tokens;
	uint32_t n;
	uint8_t (*h)[PREFIX_NODE_LEN];
	enum tier2_status fail; /* the first round trip that failed, or TIER2_OK */
	struct tier2_stats *stats;
	char *err;
	size_t errsz;
};

/* A pipeline whose failure is remembered (the first one's message kept) and
 * otherwise ignored: a command without a reply reads as absent. */
static void run(struct look *l, struct cluster_cmd *cmds, size_t n, const char *what)
{
	char msg[512];
	if (l->stats)
		l->stats->lookup_trips++;
	enum tier2_status st = tier2_io_pipeline(l->r, cmds, n, what, msg, sizeof(msg));
	if (st != TIER2_OK && l->fail == TIER2_OK) {
		l->fail = st;
		tier2_io_err(l->err, l->errsz, "%s", msg);
	}
}

static void note_error_reply(struct look *l, const redisReply *rep, const char *cmd,
                             const char *key)
{
	if (rep->type == REDIS_REPLY_ERROR && l->fail == TIER2_OK) {
		l->fail = TIER2_NODE_ERROR;
		tier2_io_err(l->err, l->errsz, "tier2: %s %s: %.*s", cmd, key,
		             (int)(rep->len > 200 ? 200 : rep->len), rep->str);
	}
}

/* The deepest depth in 0..kn whose node exists, TIER2_PROBES depths per round
 * trip. Presence is monotone along a path unless Redis dropped a node; then
 * the answer is a depth whose node exists (or 0), which only shortens. */
static uint32_t deepest(struct look *l, uint32_t kn)
{
	struct tier2_cmd2 cb[TIER2_PROBES];
	struct cluster_cmd cmds[TIER2_PROBES];
	uint32_t q[TIER2_PROBES];
	uint32_t lo = 0, hi = kn;
	while (lo < hi) {
		uint32_t span = hi - lo, k = span < TIER2_PROBES ? span : TIER2_PROBES;
		for (uint32_t j = 0; j < k; j++) {
			q[j] = lo + (uint32_t)((uint64_t)span * (j + 1) / k);
			tier2_io_cmd2(&cmds[j], &cb[j], "EXISTS",
			              tier2_name_node(cb[j].name, l->ns, l->h[q[j]]));
		}
		run(l, cmds, k, "probing the prefix index");
		uint32_t new_lo = lo, new_hi = hi;
		for (uint32_t j = 0; j < k; j++) {
			const redisReply *rep = cmds[j].reply;
			int present = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
			if (rep)
				note_error_reply(l, rep, "EXISTS", cmds[j].key);
			if (!present) {
				new_hi = q[j] - 1;
				break;
			}
			new_lo = q[j];
		}
		tier2_io_free_replies(cmds, k);
		lo = new_lo;
		hi = new_hi;
	}
	return lo;
}

/* Appends the candidates of node reply rep at depth d to c (n of them). */
static size_t node_cands(struct look *l, const redisReply *rep, uint32_t d, struct cand *c,
                         size_t n, size_t cap)
{
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements % 2 != 0)
		return n;
	uint32_t base = d * PREFIX_BLOCK, tail_p = UINT32_MAX;
	uint64_t tail = 0;
	for (size_t i = 0; i + 1 < rep->elements && n < cap; i += 2) {
		const redisReply *f = rep->element[i], *v = rep->element[i + 1];
		if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		if (l->stats)
			l->stats->bytes_in += f->len + v->len;
		if (f->len != TIER2_KEY_LEN || v->len != TIER2_NODE_FIELD_LEN)
			continue; /* the path marker "+", or a field of another version */
		const unsigned char *b = (const unsigned char *)v->str;
		uint32_t p = tier2_get_le32(b);
		if (p == 0 || p > l->n || p < base || p - base >= PREFIX_BLOCK)
			continue;
		if (p != tail_p) {
			tail = tier2_tail_hash(l->tokens, base, p);
			tail_p = p;
		}
		if (tier2_get_le64(b + 4) != tail)
			continue;
		c[n].p = p;
		memcpy(c[n].key, f->str, TIER2_KEY_LEN);
		n++;
	}
	return n;
}

/* The walk's buffers, for trips of up to `room` nodes: grown with the
 * trips, so a short walk holds a few KiB, not a 512-node trip's. */
struct walk {
	uint32_t room;
	size_t cap; /* candidates: at most PREFIX_BLOCK a node pass the checks of
	             * node_cands, bar tail-hash collisions, which the cap bounds */
	struct cand *c;
	struct tier2_cmd2 *cb;
	struct cluster_cmd *cmds;
};

/* Makes room for a trip of k nodes: 0, or -1 when out of memory. */
static int walk_room(struct walk *w, uint32_t k)
{
	if (k <= w->room)
		return 0;
	size_t cap = (size_t)k * PREFIX_BLOCK * 4u;
	struct cand *c = realloc(w->c, cap * sizeof(*c));
	if (c)
		w->c = c;
	struct tier2_cmd2 *cb = realloc(w->cb, k * sizeof(*cb));
	if (cb)
		w->cb = cb;
	struct cluster_cmd *cmds = realloc(w->cmds, k * sizeof(*cmds));
	if (cmds)
		w->cmds = cmds;
	if (!c || !cb || !cmds)
		return -1;
	w->room = k;
	w->cap = cap;
	return 0;
}

static void walk_free(struct walk *w)
{
	free(w->c);
	free(w->cb);
	free(w->cmds);
}

static int by_p_desc(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return (x->p < y->p) - (x->p > y->p);
}

/* Whether record bytes are exactly the entry of candidate c for this prompt:
 * 1 or 0; -1 when memory ran out to tell. */
static int record_matches(const struct look *l, const redisReply *rep, const struct cand *c)
{
	struct tier2_record rec;
	if (rep->type != REDIS_REPLY_STRING)
		return 0;
	int drc = tier2_record_decode(rep->str, rep->len, &rec, NULL, 0);
	if (drc != 0)
		return drc == -2 ? -1 : 0;
	int ok = rec.n_tokens == c->p && memcmp(rec.fingerprint, l->fingerprint, 32) == 0 &&
	         rec.salt_len == l->salt_len &&
	         (!rec.salt_len || memcmp(rec.salt, l->salt, rec.salt_len) == 0) &&
	         memcmp(rec.tokens, l->tokens, (size_t)c->p * 4u) == 0;
	tier2_record_free(&rec);
	uint8_t key[TIER2_KEY_LEN];
	if (!ok)
		return 0;
	if (prefix_key(l->fingerprint, l->salt, l->salt_len, l->tokens, c->p, key) != 0)
		return -1;
	return memcmp(key, c->key, TIER2_KEY_LEN) == 0;
}

/* The first of n candidates (longest first) whose record matches: its
 * index, or -1. */
static long check_cands(struct look *l, const struct cand *c, size_t n)
{
	struct tier2_cmd2 cb[RECORDS_PER_TRIP];
	struct cluster_cmd cmds[RECORDS_PER_TRIP];
	for (size_t first = 0; first < n; first += RECORDS_PER_TRIP) {
		size_t k = n - first < RECORDS_PER_TRIP ? n - first : RECORDS_PER_TRIP;
		for (size_t j = 0; j < k; j++)
			tier2_io_cmd2(&cmds[j], &cb[j], "GET",
			              tier2_name_record(cb[j].name, l->ns, c[first + j].key));
		run(l, cmds, k, "reading candidate records");
		long found = -1;
		for (size_t j = 0; j < k && found < 0; j++) {
			const redisReply *rep = cmds[j].reply;
			if (!rep)
				continue;
			note_error_reply(l, rep, "GET", cmds[j].key);
			if (rep->type == REDIS_REPLY_STRING && l->stats)
				l->stats->bytes_in += rep->len;
			int m = record_matches(l, rep, &c[first + j]);
			if (m > 0) {
				found = (long)(first + j);
			} else if (m < 0) { /* unknown: a shorter match may still answer */
				if (l->fail == TIER2_OK) {
					l->fail = TIER2_NOMEM;
					tier2_io_err(l->err, l->errsz,
					             "tier2: lookup: out of memory");
				}
			} else if (l->stats) {
				l->stats->stale++;
			}
		}
		tier2_io_free_replies(cmds, k);
		if (found >= 0)
			return found;
	}
	return -1;
}

enum tier2_status tier2_longest(struct cluster_router *r, const char *ns,
                                const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                                const uint32_t *tokens, uint32_t n, uint8_t key[TIER2_KEY_LEN],
                                uint32_t *prefix_len, struct tier2_stats *stats, char *err,
                                size_t errsz)
{
	*prefix_len = 0;
	memset(key, 0, TIER2_KEY_LEN);
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (salt_len > TIER2_MAX_SALT) {
		tier2_io_err(err, errsz, "tier2: lookup: a salt of %zu bytes (at most %u)",
		             salt_len, TIER2_MAX_SALT);
		return TIER2_INVALID;
	}
	if (stats)
		stats->lookups++;
	if (n > TIER2_MAX_TOKENS)
		n = TIER2_MAX_TOKENS; /* no entry is longer */
	if (n == 0)
		return TIER2_OK;
	uint32_t kn = n / PREFIX_BLOCK;
	struct look l = {r, ns,   fingerprint, salt,  salt_len, tokens,
	                 n, NULL, TIER2_OK,    stats, err,      errsz};
	l.h = malloc((size_t)(kn + 1) * PREFIX_NODE_LEN);
	struct walk w = {0};
	if (!l.h || walk_room(&w, NODES_FIRST_TRIP) != 0) {
		free(l.h);
		walk_free(&w);
		tier2_io_err(err, errsz, "tier2: lookup: out of memory");
		return TIER2_NOMEM;
	}
	prefix_block_hashes(fingerprint, salt, salt_len, tokens, n, l.h);
	uint32_t top = deepest(&l, kn);
	/* down from the deepest node, in trips of 8, 16, 32 ... nodes: a prompt
	 * whose nearest entry lies far above (a prefix of a long entry, and
	 * nothing stored shorter) takes O(log) round trips, not one per 8 nodes */
	uint32_t trip = NODES_FIRST_TRIP;
	for (uint32_t d = top + 1; d > 0 && !*prefix_len;) {
		uint32_t k = d < trip ? d : trip;
		trip = trip < NODES_MAX_TRIP ? 2 * trip : NODES_MAX_TRIP;
		if (walk_room(&w, k) != 0) {
			if (l.fail == TIER2_OK) {
				l.fail = TIER2_NOMEM;
				tier2_io_err(err, errsz, "tier2: lookup: out of memory");
			}
			break;
		}
		struct cand *c = w.c;
		struct tier2_cmd2 *cb = w.cb;
		struct cluster_cmd *cmds = w.cmds;
		for (uint32_t j = 0; j < k; j++)
			tier2_io_cmd2(&cmds[j], &cb[j], "HGETALL",
			              tier2_name_node(cb[j].name, ns, l.h[d - 1 - j]));
		run(&l, cmds, k, "reading prefix-index nodes");
		size_t nc = 0;
		for (uint32_t j = 0; j < k; j++) {
			if (!cmds[j].reply)
				continue;
			note_error_reply(&l, cmds[j].reply, "HGETALL", cmds[j].key);
			nc = node_cands(&l, cmds[j].reply, d - 1 - j, c, nc, w.cap);
		}
		tier2_io_free_replies(cmds, k);
		qsort(c, nc, sizeof(*c), by_p_desc);
		long found = check_cands(&l, c, nc);
		if (found >= 0) {
			*prefix_len = c[found].p;
			memcpy(key, c[found].key, TIER2_KEY_LEN);
		}
		d -= k;
	}
	walk_free(&w);
	free(l.h);
	if (*prefix_len) {
		if (stats)
			stats->lookup_hits++;
		return TIER2_OK;
	}
	return l.fail;
}
