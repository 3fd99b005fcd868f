/* tier2_delete: removes one generation of an entry from the cluster: its
 * chunks, its index field, then its record (tier2.h). */
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "tier2/tier2_io.h"

#define DELS_PER_TRIP 1024u

/* One command of up to 3 arguments: VERB NAME [FIELD]. */
struct cmd3 {
	char name[TIER2_NAME_MAX];
	const char *argv[3];
	size_t len[3];
};

static void cmd3(struct cluster_cmd *cmd, struct cmd3 *c, const char *verb, size_t name_len,
                 const void *field, size_t field_len)
{
	c->argv[0] = verb;
	c->len[0] = strlen(verb);
	c->argv[1] = c->name;
	c->len[1] = name_len;
	c->argv[2] = field;
	c->len[2] = field_len;
	*cmd = (struct cluster_cmd){c->name, name_len, field ? 3 : 2, c->argv, c->len, NULL, 0};
}

/* Runs n commands whose replies must be integers; adds to *ones those that
 * are 1 (deleted). */
static enum tier2_status run_ints(struct cluster_router *r, struct cluster_cmd *cmds, size_t n,
                                  const char *what, uint64_t *ones, uint8_t *which, char *err,
                                  size_t errsz)
{
	enum tier2_status st = tier2_io_pipeline(r, cmds, n, what, err, errsz);
	for (size_t i = 0; i < n && st == TIER2_OK; i++) {
		st = tier2_io_want_int(cmds[i].reply, cmds[i].argv[0], cmds[i].key, err, errsz);
		int one = st == TIER2_OK && cmds[i].reply->integer == 1;
		*ones += (uint64_t)one;
		if (which)
			which[i] = (uint8_t)one;
	}
	tier2_io_free_replies(cmds, n);
	return st;
}

/* Reads the record of key for `what` ("delete", "undo"): TIER2_OK with rec
 * decoded and bound to key and *len its bytes, or why not. */
static enum tier2_status read_record(struct cluster_router *r, const char *ns, const uint8_t *key,
                                     const char *what, struct tier2_record *rec, size_t *len,
                                     char *err, size_t errsz)
{
	struct tier2_cmd2 c;
	struct cluster_cmd cmd;
	tier2_io_cmd2(&cmd, &c, "GET", tier2_name_record(c.name, ns, key));
	enum tier2_status st = tier2_io_pipeline(r, &cmd, 1, "reading the record", err, errsz);
	if (st != TIER2_OK)
		return st;
	const redisReply *rep = cmd.reply;
	char msg[320];
	int drc;
	uint8_t want[TIER2_KEY_LEN];
	if (rep->type == REDIS_REPLY_NIL) {
		tier2_io_err(err, errsz, "tier2: %s %s: not in the cluster", what, c.name);
		st = TIER2_MISSING;
	} else if (rep->type == REDIS_REPLY_ERROR) {
		tier2_io_err(err, errsz, "tier2: %s %s: %.*s", what, c.name,
		             (int)(rep->len > 200 ? 200 : rep->len), rep->str);
		st = TIER2_NODE_ERROR;
	} else if (rep->type != REDIS_REPLY_STRING) {
		tier2_io_err(err, errsz, "tier2: %s %s: the record is a reply of type %d", what,
		             c.name, rep->type);
		st = TIER2_DAMAGED;
	} else if ((drc = tier2_record_decode(rep->str, rep->len, rec, msg, sizeof(msg))) != 0) {
		tier2_io_err(err, errsz, "tier2: %s %s: %s", what, c.name, msg);
		st = drc == -2 ? TIER2_NOMEM : TIER2_DAMAGED;
	} else if (prefix_key(rec->fingerprint, rec->salt, rec->salt_len, rec->tokens,
	                      rec->n_tokens, want) != 0) {
		tier2_record_free(rec);
		tier2_io_err(err, errsz, "tier2: %s: no memory for a digest", what);
		st = TIER2_NOMEM;
	} else if (memcmp(want, key, TIER2_KEY_LEN) != 0) {
		tier2_record_free(rec);
		tier2_io_err(err, errsz,
		             "tier2: %s %s: the record's model, salt and tokens are another "
		             "entry's",
		             what, c.name);
		st = TIER2_DAMAGED;
	} else {
		*len = rep->len;
	}
	tier2_io_free_replies(&cmd, 1);
	return st;
}

enum tier2_status tier2_chunks_del(struct cluster_router *r, const char *ns, const uint8_t *key,
                                   uint64_t gen, uint32_t n_chunks, uint32_t chunk_size,
                                   uint64_t total, uint64_t *freed, uint64_t *n_deleted, char *err,
                                   size_t errsz)
{
	struct cmd3 *cb = calloc(DELS_PER_TRIP, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(DELS_PER_TRIP, sizeof(*cmds));
	uint8_t *one = calloc(DELS_PER_TRIP, 1);
	enum tier2_status st = TIER2_OK;
	if (!cb || !cmds || !one) {
		tier2_io_err(err, errsz, "tier2: deleting chunks: out of memory");
		st = TIER2_NOMEM;
	}
	for (uint32_t first = 0; first < n_chunks && st == TIER2_OK; first += DELS_PER_TRIP) {
		uint32_t n = n_chunks - first < DELS_PER_TRIP ? n_chunks - first : DELS_PER_TRIP;
		for (uint32_t j = 0; j < n; j++)
			cmd3(&cmds[j], &cb[j], "DEL",
			     tier2_name_chunk(cb[j].name, ns, key, gen, first + j), NULL, 0);
		uint64_t ignored = 0;
		st = run_ints(r, cmds, n, "deleting chunks", &ignored, one, err, errsz);
		for (uint32_t j = 0; j < n && st == TIER2_OK; j++) {
			uint64_t at = (uint64_t)(first + j) * chunk_size;
			if (one[j] && n_deleted)
				++*n_deleted;
			if (one[j] && at < total)
				*freed += total - at < chunk_size ? total - at : chunk_size;
		}
	}
	free(one);
	free(cmds);
	free(cb);
	return st;
}

enum tier2_status tier2_record_has(struct cluster_router *r, const char *ns, const uint8_t *key,
                                   uint64_t gen, int *yes, char *err, size_t errsz)
{
	struct tier2_record rec;
	size_t len = 0;
	*yes = 0;
	enum tier2_status st = read_record(r, ns, key, "undo", &rec, &len, err, errsz);
	if (st == TIER2_MISSING || st == TIER2_DAMAGED)
		return TIER2_OK; /* none, or none of this key's: not gen's */
	if (st != TIER2_OK)
		return st;
	*yes = rec.generation == gen;
	tier2_record_free(&rec);
	return TIER2_OK;
}

/* HDEL the entry's field from its node h_D. */
static enum tier2_status del_field(struct cluster_router *r, const char *ns, const uint8_t *key,
                                   const struct tier2_record *rec, char *err, size_t errsz)
{
	uint32_t depth = rec->n_tokens / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	if (!h) {
		tier2_io_err(err, errsz, "tier2: delete: out of memory");
		return TIER2_NOMEM;
	}
	prefix_block_hashes(rec->fingerprint, rec->salt, rec->salt_len, rec->tokens, rec->n_tokens,
	                    h);
	struct cmd3 c;
	struct cluster_cmd cmd;
	cmd3(&cmd, &c, "HDEL", tier2_name_node(c.name, ns, h[depth]), key, TIER2_KEY_LEN);
	free(h);
	uint64_t ignored = 0;
	return run_ints(r, &cmd, 1, "deleting the index field", &ignored, NULL, err, errsz);
}

enum tier2_status tier2_delete(struct cluster_router *r, const char *ns,
                               const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                               uint64_t *bytes_freed, char *err, size_t errsz)
{
	return tier2_delete_gen(r, ns, key, generation, 0, bytes_freed, err, errsz);
}

enum tier2_status tier2_delete_gen(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                                   int keep_intent, uint64_t *bytes_freed, char *err, size_t errsz)
{
	uint64_t freed = 0;
	if (bytes_freed)
		*bytes_freed = 0;
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	struct tier2_record rec;
	size_t rec_len = 0;
	enum tier2_status st = read_record(r, ns, key, "delete", &rec, &rec_len, err, errsz);
	if (st != TIER2_OK)
		return st;
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, ns, key);
	if (rec.generation != generation) {
		tier2_io_err(err, errsz,
		             "tier2: delete %s: the record has generation %016llx, not %016llx "
		             "(it was put again)",
		             name, (unsigned long long)rec.generation,
		             (unsigned long long)generation);
		tier2_record_free(&rec);
		return TIER2_MISSING;
	}
	/* its parts first: unreferencing is idempotent, so a delete that failed
	 * can be run again with the record, its handle, still in place */
	struct tier2_part_ref *parts = NULL;
	size_t n_parts = 0;
	st = tier2_parts_of(&rec, &parts, &n_parts, err, errsz);
	if (st == TIER2_OK) {
		unsigned char member[TIER2_MEMBER_LEN];
		tier2_member(member, key, generation);
		st = tier2_parts_unref(r, ns, member, parts, n_parts, &freed, err, errsz);
	}
	free(parts);
	if (st == TIER2_OK)
		st = tier2_chunks_del(r, ns, key, rec.generation, rec.n_chunks, rec.chunk_size,
		                      tier2_stream_size(&rec), &freed, NULL, err, errsz);
	if (st == TIER2_OK)
		st = del_field(r, ns, key, &rec, err, errsz);
	tier2_record_free(&rec);
	if (st == TIER2_OK) {
		struct cmd3 c;
		struct cluster_cmd cmd;
		uint64_t gone = 0;
		cmd3(&cmd, &c, "DEL", tier2_name_record(c.name, ns, key), NULL, 0);
		st = run_ints(r, &cmd, 1, "deleting the record", &gone, NULL, err, errsz);
		freed += gone ? rec_len : 0;
	}
	if (st == TIER2_OK && !keep_intent) {
		/* an intent its put left (its DEL failed): nothing in it is
		 * needed once the generation is gone */
		char ignored[256];
		(void)tier2_intent_end(r, ns, key, generation, ignored, sizeof(ignored));
	}
	if (bytes_freed)
		*bytes_freed = freed;
	return st;
}
