/* tier2_ledger: a daemon's record of what it put in the cluster, for its
 * byte budget: a sorted set k3:NS:o:OWNER of key | generation | bytes, scored
 * by the caller's clock (tier2.h, "a daemon's ledger"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier2/tier2_io.h"

static void member_of(unsigned char m[TIER2_LEDGER_MEMBER_LEN], const struct tier2_owned *o)
{
	memcpy(m, o->key, TIER2_KEY_LEN);
	tier2_put_le64(m + TIER2_KEY_LEN, o->generation);
	tier2_put_le64(m + TIER2_KEY_LEN + 8, o->bytes);
}

/* The ledger's name, ns and owner checked: its length, or 0. */
static size_t ledger_name(char *name, const char *ns, const char *owner, char *err, size_t errsz)
{
	if (tier2_ns_check(ns, err, errsz) != 0 || tier2_owner_check(owner, err, errsz) != 0)
		return 0;
	return tier2_name_ledger(name, ns, owner);
}

/* One command on the ledger whose reply must be an integer: *value. */
static enum tier2_status ledger_int(struct cluster_router *r, const char *name, size_t name_len,
                                    int argc, const char **argv, size_t *lens, long long *value,
                                    char *err, size_t errsz)
{
	argv[1] = name;
	lens[1] = name_len;
	struct cluster_cmd cmd = {name, name_len, argc, argv, lens, NULL, 0};
	enum tier2_status st = tier2_io_pipeline(r, &cmd, 1, "ledger", err, errsz);
	if (st == TIER2_OK)
		st = tier2_io_want_int(cmd.reply, argv[0], name, err, errsz);
	if (st == TIER2_OK)
		*value = cmd.reply->integer;
	tier2_io_free_replies(&cmd, 1);
	return st;
}

enum tier2_status tier2_ledger_add(struct cluster_router *r, const char *ns, const char *owner,
                                   const struct tier2_owned *o, char *err, size_t errsz)
{
	char name[TIER2_NAME_MAX], score[40];
	size_t nl = ledger_name(name, ns, owner, err, errsz);
	if (!nl)
		return TIER2_INVALID;
	if (isnan(o->score)) {
		tier2_io_err(err, errsz, "tier2: ledger %s: a score that is not a number", name);
		return TIER2_INVALID;
	}
	unsigned char m[TIER2_LEDGER_MEMBER_LEN];
	member_of(m, o);
	int sl = snprintf(score, sizeof(score), "%.17g", o->score);
	const char *argv[4] = {"ZADD", NULL, score, (const char *)m};
	size_t lens[4] = {4, 0, (size_t)sl, sizeof(m)};
	long long added = 0;
	return ledger_int(r, name, nl, 4, argv, lens, &added, err, errsz);
}

enum tier2_status tier2_ledger_remove(struct cluster_router *r, const char *ns, const char *owner,
                                      const struct tier2_owned *o, char *err, size_t errsz)
{
	char name[TIER2_NAME_MAX];
	size_t nl = ledger_name(name, ns, owner, err, errsz);
	if (!nl)
		return TIER2_INVALID;
	unsigned char m[TIER2_LEDGER_MEMBER_LEN];
	member_of(m, o);
	const char *argv[3] = {"ZREM", NULL, (const char *)m};
	size_t lens[3] = {4, 0, sizeof(m)};
	long long removed = 0;
	enum tier2_status st = ledger_int(r, name, nl, 3, argv, lens, &removed, err, errsz);
	if (st == TIER2_OK && removed != 1) {
		tier2_io_err(err, errsz, "tier2: ledger %s: the member is not there", name);
		st = TIER2_MISSING;
	}
	return st;
}

/* A score as Redis writes it: the whole string a number, not NaN. */
static int parse_score(const redisReply *s, double *out)
{
	char buf[64];
	if (s->type != REDIS_REPLY_STRING || !s->str || s->len == 0 || s->len >= sizeof(buf))
		return -1;
	memcpy(buf, s->str, s->len);
	buf[s->len] = '\0';
	char *end = NULL;
	double v = strtod(buf, &end);
	if (end != buf + s->len || isnan(v))
		return -1;
	*out = v;
	return 0;
}

int tier2_ledger_parse(const redisReply *rep, struct tier2_owned *out, size_t cap, size_t *n_out,
                       size_t *n_pairs, char *err, size_t errsz)
{
	*n_out = 0;
	*n_pairs = 0;
	if (!rep || rep->type != REDIS_REPLY_ARRAY) {
		tier2_io_err(err, errsz, "tier2: ledger: the reply is of type %d, not an array",
		             rep ? rep->type : -1);
		return -1;
	}
	if (rep->elements % 2 != 0 || rep->elements / 2 > cap || (rep->elements && !rep->element)) {
		tier2_io_err(err, errsz,
		             "tier2: ledger: the reply has %zu elements (want pairs, at most %zu)",
		             rep->elements, cap);
		return -1;
	}
	size_t n = 0;
	for (size_t i = 0; i < rep->elements; i += 2) {
		const redisReply *m = rep->element[i], *s = rep->element[i + 1];
		double score = 0;
		if (!m || m->type != REDIS_REPLY_STRING || (m->len && !m->str) || !s ||
		    parse_score(s, &score) != 0) {
			tier2_io_err(err, errsz,
			             "tier2: ledger: pair %zu is not a member and a score", i / 2);
			*n_out = 0;
			return -1;
		}
		if (m->len != TIER2_LEDGER_MEMBER_LEN)
			continue; /* not one of ours */
		const unsigned char *b = (const unsigned char *)m->str;
		memcpy(out[n].key, b, TIER2_KEY_LEN);
		out[n].generation = tier2_get_le64(b + TIER2_KEY_LEN);
		out[n].bytes = tier2_get_le64(b + TIER2_KEY_LEN + 8);
		out[n].score = score;
		n++;
	}
	*n_out = n;
	*n_pairs = rep->elements / 2;
	return 0;
}

enum tier2_status tier2_ledger_load(struct cluster_router *r, const char *ns, const char *owner,
                                    struct tier2_owned **out, size_t *n, char *err, size_t errsz)
{
	*out = NULL;
	*n = 0;
	char name[TIER2_NAME_MAX];
	size_t nl = ledger_name(name, ns, owner, err, errsz);
	if (!nl)
		return TIER2_INVALID;
	struct tier2_owned *all = NULL;
	size_t have = 0, cap = 0;
	enum tier2_status st = TIER2_OK;
	for (size_t start = 0; start < TIER2_LEDGER_MAX && st == TIER2_OK;
	     start += TIER2_LEDGER_PAGE) {
		char from[24], to[24];
		int fl = snprintf(from, sizeof(from), "%zu", start);
		int tl = snprintf(to, sizeof(to), "%zu", start + TIER2_LEDGER_PAGE - 1);
		const char *argv[5] = {"ZRANGE", name, from, to, "WITHSCORES"};
		size_t lens[5] = {6, nl, (size_t)fl, (size_t)tl, 10};
		struct cluster_cmd cmd = {name, nl, 5, argv, lens, NULL, 0};
		if ((st = tier2_io_pipeline(r, &cmd, 1, "ledger", err, errsz)) != TIER2_OK)
			break;
		if (cmd.reply->type == REDIS_REPLY_ERROR) {
			st = tier2_io_want_ok(cmd.reply, "ZRANGE", name, err, errsz);
			tier2_io_free_replies(&cmd, 1);
			break;
		}
		if (cap - have < TIER2_LEDGER_PAGE) {
			size_t ncap = cap ? cap * 2 : TIER2_LEDGER_PAGE;
			struct tier2_owned *grown = realloc(all, ncap * sizeof(*all));
			if (!grown) {
				tier2_io_err(err, errsz, "tier2: ledger %s: out of memory", name);
				st = TIER2_NOMEM;
				tier2_io_free_replies(&cmd, 1);
				break;
			}
			all = grown;
			cap = ncap;
		}
		size_t got = 0, pairs = 0;
		char msg[200];
		if (tier2_ledger_parse(cmd.reply, all + have, TIER2_LEDGER_PAGE, &got, &pairs, msg,
		                       sizeof(msg)) != 0) {
			tier2_io_err(err, errsz, "%s (%s)", msg, name);
			st = TIER2_NODE_ERROR;
		}
		tier2_io_free_replies(&cmd, 1);
		have += got;
		if (pairs < TIER2_LEDGER_PAGE)
			break;
	}
	if (st != TIER2_OK || have == 0) {
		free(all);
		return st;
	}
	*out = all;
	*n = have;
	return st;
}
