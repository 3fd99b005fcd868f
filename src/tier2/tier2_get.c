/* tier2_get: reads an entry from the cluster, every byte checked (tier2.h). */
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "prefix.h"
#include "tier2/tier2_io.h"
#include "xxh_dispatch.h"

#define CHUNKS_PER_TRIP 16u
#define PARTS_PER_TRIP  32u

/* The class of a reply that is not the string wanted. */
static enum tier2_status bad_reply(const redisReply *rep, const char *name, const char *what,
                                   char *err, size_t errsz)
{
	if (rep->type == REDIS_REPLY_NIL) {
		tier2_io_err(err, errsz, "tier2: get %s: %s is not in the cluster", name, what);
		return TIER2_MISSING;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		tier2_io_err(err, errsz, "tier2: get %s: %.*s", name,
		             (int)(rep->len > 200 ? 200 : rep->len), rep->str);
		return TIER2_NODE_ERROR;
	}
	tier2_io_err(err, errsz, "tier2: get %s: %s is a reply of type %d, not a string", name,
	             what, rep->type);
	return TIER2_DAMAGED;
}

/* Reads and decodes the record of key, bound to its key. */
static enum tier2_status get_record(struct cluster_router *r, const char *ns, const uint8_t *key,
                                    struct tier2_record *rec, struct tier2_stats *stats, char *err,
                                    size_t errsz)
{
	struct tier2_cmd2 c;
	struct cluster_cmd cmd;
	tier2_io_cmd2(&cmd, &c, "GET", tier2_name_record(c.name, ns, key));
	enum tier2_status st = tier2_io_pipeline(r, &cmd, 1, "reading a record", err, errsz);
	if (st != TIER2_OK)
		return st;
	const redisReply *rep = cmd.reply;
	char msg[320];
	if (rep->type != REDIS_REPLY_STRING) {
		st = bad_reply(rep, c.name, "the record", err, errsz);
	} else {
		if (stats)
			stats->bytes_in += rep->len;
		if (tier2_record_decode(rep->str, rep->len, rec, msg, sizeof(msg)) != 0) {
			tier2_io_err(err, errsz, "tier2: get %s: %s", c.name, msg);
			st = TIER2_DAMAGED;
		} else {
			uint8_t want[TIER2_KEY_LEN];
			if (prefix_key(rec->fingerprint, rec->salt, rec->salt_len, rec->tokens,
			               rec->n_tokens, want) != 0) {
				tier2_io_err(err, errsz, "tier2: get: no memory for a digest");
				st = TIER2_NOMEM;
			} else if (memcmp(want, key, TIER2_KEY_LEN) != 0) {
				tier2_io_err(
				        err, errsz,
				        "tier2: get %s: the record's model, salt and tokens are "
				        "another entry's",
				        c.name);
				st = TIER2_DAMAGED;
			}
			if (st != TIER2_OK)
				tier2_record_free(rec);
		}
	}
	tier2_io_free_replies(&cmd, 1);
	return st;
}

/* Reads every chunk of rec into the blobs, checking each one. */
static enum tier2_status get_chunks(struct cluster_router *r, const char *ns, const uint8_t *key,
                                    const struct tier2_record *rec, struct tier2_entry_blob *b,
                                    struct tier2_stats *stats, char *err, size_t errsz)
{
	struct tier2_cmd2 cb[CHUNKS_PER_TRIP];
	struct cluster_cmd cmds[CHUNKS_PER_TRIP];
	uint64_t total = tier2_stream_size(rec);
	size_t n_seg = 0, seg = 0;
	uint64_t off = 0; /* in the segment seg */
	/* the decoder ensures n_layers >= 1; the analyzer cannot see it */
	struct tier2_run *g = malloc((size_t)(rec->n_layers ? rec->n_layers : 1) * 4u * sizeof(*g));
	if (g)
		n_seg = tier2_stream_runs(rec, g);
	if (!g) {
		tier2_io_err(err, errsz, "tier2: get: out of memory");
		return TIER2_NOMEM;
	}
	enum tier2_status st = TIER2_OK;
	for (uint32_t first = 0; first < rec->n_chunks && st == TIER2_OK;
	     first += CHUNKS_PER_TRIP) {
		uint32_t k = rec->n_chunks - first < CHUNKS_PER_TRIP ? rec->n_chunks - first
		                                                     : CHUNKS_PER_TRIP;
		for (uint32_t j = 0; j < k; j++)
			tier2_io_cmd2(
			        &cmds[j], &cb[j], "GET",
			        tier2_name_chunk(cb[j].name, ns, key, rec->generation, first + j));
		st = tier2_io_pipeline(r, cmds, k, "reading chunks", err, errsz);
		for (uint32_t j = 0; j < k && st == TIER2_OK; j++) {
			const redisReply *rep = cmds[j].reply;
			uint64_t at = (uint64_t)(first + j) * rec->chunk_size;
			size_t want = total - at < rec->chunk_size ? (size_t)(total - at)
			                                           : rec->chunk_size;
			if (rep->type != REDIS_REPLY_STRING) {
				st = bad_reply(rep, cb[j].name, "the chunk", err, errsz);
				break;
			}
			if (stats)
				stats->bytes_in += rep->len;
			if (rep->len != want) {
				tier2_io_err(err, errsz,
				             "tier2: get %s: the chunk has %zu bytes, the record "
				             "says %zu",
				             cb[j].name, rep->len, want);
				st = TIER2_DAMAGED;
				break;
			}
			uint64_t sum = XXH3_64bits(rep->str, rep->len);
			if (sum != rec->chunk_xxh3[first + j]) {
				tier2_io_err(
				        err, errsz,
				        "tier2: get %s: its XXH3 is %016llx, the record's %016llx",
				        cb[j].name, (unsigned long long)sum,
				        (unsigned long long)rec->chunk_xxh3[first + j]);
				st = TIER2_DAMAGED;
				break;
			}
			for (size_t done = 0; done < rep->len;) {
				while (seg < n_seg && off == g[seg].len) {
					seg++;
					off = 0;
				}
				if (seg == n_seg) { /* cannot be: the runs make total */
					tier2_io_err(err, errsz,
					             "tier2: get %s: past the layers' end",
					             cb[j].name);
					st = TIER2_DAMAGED;
					break;
				}
				const struct tier2_run *q = &g[seg];
				if (!b[q->layer].data) { /* cannot be: every blob is allocated */
					tier2_io_err(err, errsz,
					             "tier2: get: layer %u has no buffer",
					             q->layer);
					st = TIER2_NOMEM;
					break;
				}
				uint64_t take = q->len - off;
				if (take > rep->len - done)
					take = rep->len - done;
				memcpy(b[q->layer].data + q->off + off, rep->str + done,
				       (size_t)take);
				done += (size_t)take;
				off += take;
			}
		}
		tier2_io_free_replies(cmds, k);
	}
	free(g);
	return st;
}

/* Reads every part of rec into the blobs (pipelined), each one's length and
 * sum checked. */
static enum tier2_status get_parts(struct cluster_router *r, const char *ns,
                                   const struct tier2_record *rec, struct tier2_entry_blob *b,
                                   struct tier2_stats *stats, char *err, size_t errsz)
{
	struct tier2_part_ref *refs = NULL;
	size_t n = 0;
	enum tier2_status st = tier2_parts_of(rec, &refs, &n, err, errsz);
	struct tier2_cmd2 cb[PARTS_PER_TRIP];
	struct cluster_cmd cmds[PARTS_PER_TRIP];
	for (size_t first = 0; first < n && st == TIER2_OK; first += PARTS_PER_TRIP) {
		size_t k = n - first < PARTS_PER_TRIP ? n - first : PARTS_PER_TRIP;
		for (size_t j = 0; j < k; j++) {
			const struct tier2_part_ref *q = &refs[first + j];
			tier2_io_cmd2(&cmds[j], &cb[j], "GET",
			              tier2_name_part(cb[j].name, ns, q->node, q->layer,
			                              (int)q->part, q->xxh3));
		}
		st = tier2_io_pipeline(r, cmds, k, "reading parts", err, errsz);
		for (size_t j = 0; j < k && st == TIER2_OK; j++) {
			const redisReply *rep = cmds[j].reply;
			const struct tier2_part_ref *q = &refs[first + j];
			if (rep->type != REDIS_REPLY_STRING) {
				st = bad_reply(rep, cb[j].name, "the part", err, errsz);
				break;
			}
			if (stats)
				stats->bytes_in += rep->len;
			uint64_t sum = XXH3_64bits_withSeed(rep->str, rep->len, q->layer);
			if (rep->len != q->size || sum != q->xxh3) {
				tier2_io_err(err, errsz,
				             "tier2: get %s: the part has %zu bytes and XXH3 "
				             "%016llx, the record says %llu and %016llx",
				             cb[j].name, rep->len, (unsigned long long)sum,
				             (unsigned long long)q->size,
				             (unsigned long long)q->xxh3);
				st = TIER2_DAMAGED;
				break;
			}
			/* the decoder's sizes put every part inside its blob */
			if (!b[q->layer].data) { /* cannot be: every blob is allocated */
				st = TIER2_NOMEM;
				break;
			}
			memcpy(b[q->layer].data + q->off, rep->str, rep->len);
		}
		tier2_io_free_replies(cmds, k);
	}
	free(refs);
	return st;
}

static void count(struct tier2_stats *stats, enum tier2_status st)
{
	if (!stats)
		return;
	stats->hits += st == TIER2_OK;
	stats->miss_missing += st == TIER2_MISSING;
	stats->miss_damaged += st == TIER2_DAMAGED;
	stats->miss_timeout += st == TIER2_TIMEOUT;
	stats->miss_node += st == TIER2_NODE_ERROR;
	stats->miss_too_large += st == TIER2_TOO_LARGE;
}

enum tier2_status tier2_get(struct cluster_router *r, const char *ns,
                            const uint8_t key[TIER2_KEY_LEN], struct tier2_entry *entry,
                            struct tier2_stats *stats, char *err, size_t errsz)
{
	return tier2_get_max(r, ns, key, 0, entry, stats, err, errsz);
}

enum tier2_status tier2_get_max(struct cluster_router *r, const char *ns,
                                const uint8_t key[TIER2_KEY_LEN], uint64_t max_bytes,
                                struct tier2_entry *entry, struct tier2_stats *stats, char *err,
                                size_t errsz)
{
	memset(entry, 0, sizeof(*entry));
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (stats)
		stats->gets++;
	struct tier2_record rec;
	enum tier2_status st = get_record(r, ns, key, &rec, stats, err, errsz);
	if (st != TIER2_OK) {
		count(stats, st);
		return st;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < rec.n_layers; i++)
		total += rec.layers[i].size; /* bounded by the decoder */
	if (max_bytes && total > max_bytes) {
		char name[TIER2_NAME_MAX];
		tier2_name_record(name, ns, key);
		tier2_io_err(err, errsz,
		             "tier2: get %s: the entry holds %llu bytes, over the %llu this caller "
		             "takes",
		             name, (unsigned long long)total, (unsigned long long)max_bytes);
		tier2_record_free(&rec);
		count(stats, TIER2_TOO_LARGE);
		return TIER2_TOO_LARGE;
	}
	struct tier2_entry e = {
	        .salt_len = rec.salt_len, .prefix_len = rec.n_tokens, .n_blobs = rec.n_layers};
	memcpy(e.fingerprint, rec.fingerprint, 32);
	/* the decoder ensures n_layers >= 1; the analyzer cannot see it */
	e.blobs = calloc(rec.n_layers ? rec.n_layers : 1, sizeof(*e.blobs));
	e.tokens = malloc((size_t)rec.n_tokens * 4u);
	e.salt = rec.salt_len ? malloc(rec.salt_len) : NULL;
	int oom = !e.blobs || !e.tokens || (rec.salt_len && !e.salt);
	for (uint32_t i = 0; e.blobs && i < rec.n_layers && !oom; i++) {
		e.blobs[i].size = rec.layers[i].size;
		e.blobs[i].xxh3 = rec.layers[i].xxh3;
		oom = !(e.blobs[i].data = malloc(rec.layers[i].size));
	}
	if (oom) {
		tier2_io_err(err, errsz, "tier2: get: out of memory for an entry of %llu bytes",
		             (unsigned long long)total);
		st = TIER2_NOMEM;
	}
	if (st == TIER2_OK)
		st = get_chunks(r, ns, key, &rec, e.blobs, stats, err, errsz);
	if (st == TIER2_OK)
		st = get_parts(r, ns, &rec, e.blobs, stats, err, errsz);
	for (uint32_t i = 0; i < rec.n_layers && st == TIER2_OK; i++) {
		uint64_t sum = checksum_blob(e.blobs[i].data, e.blobs[i].size, i);
		if (sum != e.blobs[i].xxh3) {
			char name[TIER2_NAME_MAX];
			tier2_name_record(name, ns, key);
			tier2_io_err(
			        err, errsz,
			        "tier2: get %s: layer %u's checksum is %016llx, the record says "
			        "%016llx",
			        name, i, (unsigned long long)sum,
			        (unsigned long long)e.blobs[i].xxh3);
			st = TIER2_DAMAGED;
		}
	}
	if (st == TIER2_OK) {
		memcpy(e.tokens, rec.tokens, (size_t)rec.n_tokens * 4u);
		if (rec.salt_len)
			memcpy(e.salt, rec.salt, rec.salt_len);
		*entry = e;
	} else {
		tier2_entry_free(&e);
	}
	tier2_record_free(&rec);
	if (st != TIER2_NOMEM)
		count(stats, st);
	return st;
}

void tier2_entry_free(struct tier2_entry *entry)
{
	if (!entry)
		return;
	for (uint32_t i = 0; entry->blobs && i < entry->n_blobs; i++)
		free(entry->blobs[i].data);
	free(entry->blobs);
	free(entry->tokens);
	free(entry->salt);
	memset(entry, 0, sizeof(*entry));
}
