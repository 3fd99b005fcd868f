/* tier2_list: every entry record of a namespace, master by master, by SCAN
 * (tier2.h, "listing"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "tier2/tier2_io.h"

#define RECORDS_PER_TRIP 16u /* records can be MiBs (tokens): a few per trip */

struct lister {
	struct cluster_router *r;
	const char *ns;
	const uint8_t *fingerprint;
	uint32_t limit, listed;
	int stop, gave_up;
	int (*fn)(const struct tier2_listed *e, void *ctx);
	int (*cancelled)(void *ctx);
	void *ctx;
	struct tier2_stats *stats;
	char *err;
	size_t errsz;
};

/* One record reply of key: passed to fn when it is a good record of the
 * model asked for. */
static enum tier2_status one(struct lister *l, const uint8_t *key, const redisReply *rep,
                             const char *name)
{
	if (rep->type == REDIS_REPLY_NIL)
		return TIER2_OK; /* gone since the SCAN */
	if (rep->type == REDIS_REPLY_ERROR &&
	    !(rep->len >= 9 && memcmp(rep->str, "WRONGTYPE", 9) == 0))
		return tier2_io_want_ok(rep, "GET", name, l->err, l->errsz);
	struct tier2_record rec;
	int drc = rep->type == REDIS_REPLY_STRING
	                  ? tier2_record_decode(rep->str, rep->len, &rec, NULL, 0)
	                  : -1;
	if (drc == -2) {
		tier2_io_err(l->err, l->errsz, "tier2: list: out of memory");
		return TIER2_NOMEM;
	}
	if (drc != 0) {
		if (l->stats)
			l->stats->stale++;
		return TIER2_OK;
	}
	if (l->stats)
		l->stats->bytes_in += rep->len;
	uint8_t want[TIER2_KEY_LEN];
	if (prefix_key(rec.fingerprint, rec.salt, rec.salt_len, rec.tokens, rec.n_tokens, want) !=
	    0) {
		tier2_record_free(&rec);
		tier2_io_err(l->err, l->errsz, "tier2: list: no memory for a digest");
		return TIER2_NOMEM;
	}
	if (memcmp(want, key, TIER2_KEY_LEN) != 0) {
		if (l->stats)
			l->stats->stale++;
	} else if (!l->fingerprint || memcmp(rec.fingerprint, l->fingerprint, 32) == 0) {
		struct tier2_listed e = {.prefix_len = rec.n_tokens,
		                         .n_layers = rec.n_layers,
		                         .generation = rec.generation,
		                         .salt_len = rec.salt_len,
		                         .salt = rec.salt};
		memcpy(e.key, key, TIER2_KEY_LEN);
		memcpy(e.fingerprint, rec.fingerprint, 32);
		for (uint32_t i = 0; i < rec.n_layers; i++)
			e.bytes += rec.layers[i].size; /* bounded by the decoder */
		l->listed++;
		if (l->fn(&e, l->ctx) != 0 || (l->limit && l->listed >= l->limit))
			l->stop = 1;
	}
	tier2_record_free(&rec);
	return TIER2_OK;
}

/* TIER2_TIMEOUT with the message set when the caller has given up. */
static enum tier2_status given_up(struct lister *l)
{
	if (!l->cancelled || !l->cancelled(l->ctx))
		return TIER2_OK;
	l->gave_up = 1;
	tier2_io_err(l->err, l->errsz, "tier2: list: given up by the caller after %u entries",
	             l->listed);
	return TIER2_TIMEOUT;
}

/* Reads the records of keys[0..n) and lists them. */
static enum tier2_status records(struct lister *l, const uint8_t (*keys)[TIER2_KEY_LEN], size_t n)
{
	struct tier2_cmd2 cb[RECORDS_PER_TRIP];
	struct cluster_cmd cmds[RECORDS_PER_TRIP];
	enum tier2_status st = TIER2_OK;
	for (size_t first = 0; first < n && st == TIER2_OK && !l->stop; first += RECORDS_PER_TRIP) {
		size_t k = n - first < RECORDS_PER_TRIP ? n - first : RECORDS_PER_TRIP;
		if ((st = given_up(l)) != TIER2_OK)
			break;
		for (size_t j = 0; j < k; j++)
			tier2_io_cmd2(&cmds[j], &cb[j], "GET",
			              tier2_name_record(cb[j].name, l->ns, keys[first + j]));
		st = tier2_io_pipeline(l->r, cmds, k, "list: reading records", l->err, l->errsz);
		for (size_t j = 0; j < k && st == TIER2_OK && !l->stop; j++)
			st = one(l, keys[first + j], cmds[j].reply, cb[j].name);
		tier2_io_free_replies(cmds, k);
	}
	return st;
}

/* SCANs master m to its end. */
static enum tier2_status scan_master(struct lister *l, size_t m, const char *pattern,
                                     size_t pattern_len)
{
	char cursor[CLUSTER_CURSOR_MAX + 1] = "0", count[16];
	int count_len = snprintf(count, sizeof(count), "%u", TIER2_SCAN_COUNT);
	enum tier2_status st = TIER2_OK;
	do {
		const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", count};
		size_t lens[6] = {4, strlen(cursor), 5, pattern_len, 5, (size_t)count_len};
		redisReply *rep = NULL;
		if ((st = given_up(l)) != TIER2_OK)
			return st;
		st = tier2_io_node(l->r, m, 6, argv, lens, &rep, "list: SCAN", l->err, l->errsz);
		if (st != TIER2_OK)
			return st;
		const redisReply *keys = NULL;
		char msg[256], next[CLUSTER_CURSOR_MAX + 1];
		if (rep->type == REDIS_REPLY_ERROR) {
			st = tier2_io_want_ok(rep, "SCAN", pattern, l->err, l->errsz);
		} else if (cluster_scan_parse(rep, next, &keys, msg, sizeof(msg)) != 0) {
			tier2_io_err(l->err, l->errsz, "tier2: list: master %zu: %s", m, msg);
			st = TIER2_NODE_ERROR;
		}
		uint8_t(*k)[TIER2_KEY_LEN] = NULL;
		size_t n = 0;
		if (st == TIER2_OK && keys && keys->elements) {
			k = malloc(keys->elements * TIER2_KEY_LEN);
			if (!k) {
				tier2_io_err(l->err, l->errsz, "tier2: list: out of memory");
				st = TIER2_NOMEM;
			}
			for (size_t i = 0; k && i < keys->elements; i++) {
				const redisReply *e = keys->element[i];
				n += tier2_parse_record_name(e->str, e->len, l->ns, k[n]) == 0;
			}
		}
		if (st == TIER2_OK)
			memcpy(cursor, next, sizeof(next));
		freeReplyObject(rep);
		if (st == TIER2_OK)
			st = records(l, (const uint8_t(*)[TIER2_KEY_LEN])k, n);
		free(k);
	} while (st == TIER2_OK && !l->stop && strspn(cursor, "0") != strlen(cursor));
	/* (a cursor of zeros ends the scan: "00" too, which the parser takes) */
	return st;
}

enum tier2_status tier2_list(struct cluster_router *r, const char *ns, const uint8_t *fingerprint,
                             uint32_t limit, int (*fn)(const struct tier2_listed *e, void *ctx),
                             int (*cancelled)(void *ctx), void *ctx, struct tier2_stats *stats,
                             char *err, size_t errsz)
{
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (!fn) {
		tier2_io_err(err, errsz, "tier2: list: no function to call");
		return TIER2_INVALID;
	}
	struct lister l = {.r = r,
	                   .ns = ns,
	                   .fingerprint = fingerprint,
	                   .limit = limit,
	                   .fn = fn,
	                   .cancelled = cancelled,
	                   .ctx = ctx,
	                   .stats = stats,
	                   .err = err,
	                   .errsz = errsz};
	struct cluster_stats before = cluster_stats(r);
	size_t masters = cluster_n_masters(r);
	if (masters == 0) {
		tier2_io_err(err, errsz, "tier2: list: no slot map: %s", cluster_error(r));
		struct cluster_stats after = cluster_stats(r);
		return after.nomem != before.nomem         ? TIER2_NOMEM
		       : after.timeouts != before.timeouts ? TIER2_TIMEOUT
		                                           : TIER2_NODE_ERROR;
	}
	char pattern[TIER2_NAME_MAX];
	size_t pattern_len = (size_t)snprintf(pattern, sizeof(pattern), "k3:%s:e:*", ns);
	/* a master that does not answer is passed over: the others are listed,
	 * and TIER2_PARTIAL with the message says the listing is not whole */
	char why[512] = "";
	size_t failed = 0;
	static const char own[] = "tier2: list: ";
	for (size_t m = 0; m < masters && !l.stop; m++) {
		enum tier2_status st = scan_master(&l, m, pattern, pattern_len);
		if (st == TIER2_OK)
			continue;
		if (l.gave_up || (st != TIER2_TIMEOUT && st != TIER2_NODE_ERROR)) {
			/* given up by the caller, no memory: no further */
			if (failed && err && errsz) {
				char said[512];
				snprintf(said, sizeof(said), "%s", err);
				tier2_io_err(err, errsz,
				             "%s (and %zu of %zu masters did not answer: %s)", said,
				             failed, masters, why);
			}
			return st;
		}
		if (!failed++) {
			const char *e = err ? err : "";
			snprintf(why, sizeof(why), "%s",
			         strncmp(e, own, sizeof(own) - 1) ? e : e + sizeof(own) - 1);
		}
	}
	if (!failed)
		return TIER2_OK;
	tier2_io_err(err, errsz,
	             "tier2: list: %zu of %zu masters did not answer (their entries are not "
	             "listed, or not all): %s",
	             failed, masters, why);
	return TIER2_PARTIAL;
}
