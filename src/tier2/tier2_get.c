/* tier2_get: reads an entry from the cluster, every byte checked (tier2.h):
 * a reader that streams it in payload order, and tier2_get on top of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "prefix.h"
#include "tier2/tier2_io.h"
#include "xxh_dispatch.h"

#define GETS_PER_TRIP 16u
#define TRIP_BYTES    ((uint64_t)16 << 20) /* value bytes asked for in one trip */

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
		int drc = tier2_record_decode(rep->str, rep->len, rec, msg, sizeof(msg));
		if (drc != 0) {
			tier2_io_err(err, errsz, "tier2: get %s: %s", c.name, msg);
			st = drc == -2 ? TIER2_NOMEM : TIER2_DAMAGED;
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

/* ---- the reader ------------------------------------------------------------------- */

/* One GET of the read: chunk `index`, or part `index` of refs. */
struct rd_get {
	uint64_t first; /* the payload offset of its first byte */
	uint32_t index;
	uint32_t is_part;
};

/* A reply read and checked, its bytes placed up to `done`. */
struct rd_held {
	redisReply *rep;
	struct rd_get g;
	uint64_t done;
};

struct tier2_reader {
	struct cluster_router *r;
	char ns[TIER2_NS_MAX + 1];
	uint8_t key[TIER2_KEY_LEN];
	struct tier2_record rec;
	struct tier2_stats *stats;
	uint64_t total;      /* payload bytes */
	uint64_t *at;        /* per run of the stream: its payload offset */
	uint64_t *from;      /* per run: its stream offset */
	struct tier2_run *g; /* the stream's runs */
	size_t n_runs;
	struct tier2_part_ref *refs;
	size_t n_refs;
	struct rd_get *gets;
	size_t n_gets, next;
	struct rd_held *held;
	size_t n_held, cap_held;
	enum tier2_status failed; /* TIER2_OK until a call fails */
};

/* The run holding stream byte s (the last run starting at or before it
 * with bytes; runs of 0 bytes are passed over). */
static size_t run_of(const struct tier2_reader *rd, uint64_t s)
{
	size_t lo = 0, hi = rd->n_runs; /* the answer is in [lo, hi) */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (rd->from[mid] <= s)
			lo = mid;
		else
			hi = mid;
	}
	while (lo + 1 < rd->n_runs && rd->from[lo] + rd->g[lo].len <= s)
		lo++;
	return lo;
}

static int by_offset(const void *a, const void *b)
{
	uint64_t x = ((const struct tier2_part_ref *)a)->off,
	         y = ((const struct tier2_part_ref *)b)->off;
	return x < y ? -1 : x > y;
}

/* The plan: the runs' offsets, the parts (their offsets made payload
 * offsets) and every GET in the order of its first byte. */
static enum tier2_status plan(struct tier2_reader *rd, char *err, size_t errsz)
{
	const struct tier2_record *rec = &rd->rec;
	/* the decoder ensures n_layers >= 1; the analyzer cannot see it */
	size_t most = (size_t)(rec->n_layers ? rec->n_layers : 1) * 4u;
	uint64_t *layer_at =
	        malloc((size_t)(rec->n_layers ? rec->n_layers : 1) * sizeof(*layer_at));
	rd->g = malloc(most * sizeof(*rd->g));
	rd->at = malloc(most * sizeof(*rd->at));
	rd->from = malloc(most * sizeof(*rd->from));
	enum tier2_status st = TIER2_NOMEM;
	if (layer_at && rd->g && rd->at && rd->from)
		st = tier2_parts_of(rec, &rd->refs, &rd->n_refs, err, errsz);
	if (st == TIER2_OK)
		rd->gets = malloc(((size_t)rec->n_chunks + rd->n_refs) * sizeof(*rd->gets));
	if (st == TIER2_OK && !rd->gets)
		st = TIER2_NOMEM;
	if (st != TIER2_OK) {
		free(layer_at);
		if (st == TIER2_NOMEM)
			tier2_io_err(err, errsz, "tier2: get: out of memory for a read's plan");
		return st;
	}
	uint64_t sum = 0;
	for (uint32_t i = 0; i < rec->n_layers; i++) {
		layer_at[i] = sum;
		sum += rec->layers[i].size;
	}
	rd->total = sum;
	rd->n_runs = tier2_stream_runs(rec, rd->g);
	uint64_t s = 0;
	for (size_t i = 0; i < rd->n_runs; i++) {
		rd->at[i] = layer_at[rd->g[i].layer] + rd->g[i].off;
		rd->from[i] = s;
		s += rd->g[i].len;
	}
	for (size_t i = 0; i < rd->n_refs; i++)
		rd->refs[i].off += layer_at[rd->refs[i].layer]; /* a payload offset now */
	free(layer_at);
	if (rd->n_refs > 1)
		qsort(rd->refs, rd->n_refs, sizeof(*rd->refs), by_offset);
	/* merge: chunks' first bytes rise with their index, as do the parts' */
	size_t c = 0, p = 0;
	while (c < rec->n_chunks || p < rd->n_refs) {
		uint64_t cf = UINT64_MAX;
		if (c < rec->n_chunks) {
			uint64_t sb = (uint64_t)c * rec->chunk_size;
			size_t k = run_of(rd, sb);
			cf = rd->at[k] + (sb - rd->from[k]);
		}
		if (p < rd->n_refs && rd->refs[p].off < cf) {
			rd->gets[rd->n_gets++] = (struct rd_get){rd->refs[p].off, (uint32_t)p, 1};
			p++;
		} else {
			rd->gets[rd->n_gets++] = (struct rd_get){cf, (uint32_t)c, 0};
			c++;
		}
	}
	return TIER2_OK;
}

enum tier2_status tier2_read_open(struct cluster_router *r, const char *ns,
                                  const uint8_t key[TIER2_KEY_LEN], uint64_t max_bytes,
                                  struct tier2_stats *stats, struct tier2_reader **out, char *err,
                                  size_t errsz)
{
	*out = NULL;
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (stats)
		stats->gets++;
	struct tier2_reader *rd = calloc(1, sizeof(*rd));
	if (!rd) {
		tier2_io_err(err, errsz, "tier2: get: out of memory");
		return TIER2_NOMEM;
	}
	rd->r = r;
	rd->stats = stats;
	snprintf(rd->ns, sizeof(rd->ns), "%s", ns);
	memcpy(rd->key, key, TIER2_KEY_LEN);
	enum tier2_status st = get_record(r, ns, key, &rd->rec, stats, err, errsz);
	if (st != TIER2_OK) {
		free(rd);
		count(stats, st);
		return st;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < rd->rec.n_layers; i++) {
		total += rd->rec.layers[i].size; /* bounded by the decoder */
		/* a store takes a sum of 0 for "not given" and would not check it */
		if (rd->rec.layers[i].xxh3 == 0 && st == TIER2_OK) {
			char name[TIER2_NAME_MAX];
			tier2_name_record(name, ns, key);
			tier2_io_err(err, errsz,
			             "tier2: get %s: the record gives layer %u a checksum of 0",
			             name, i);
			st = TIER2_DAMAGED;
		}
	}
	if (st == TIER2_OK && max_bytes && total > max_bytes) {
		char name[TIER2_NAME_MAX];
		tier2_name_record(name, ns, key);
		tier2_io_err(err, errsz,
		             "tier2: get %s: the entry holds %llu bytes, over the %llu this caller "
		             "takes",
		             name, (unsigned long long)total, (unsigned long long)max_bytes);
		st = TIER2_TOO_LARGE;
	}
	if (st == TIER2_OK)
		st = plan(rd, err, errsz);
	if (st != TIER2_OK) {
		if (st != TIER2_NOMEM)
			count(stats, st);
		tier2_read_close(rd);
		return st;
	}
	*out = rd;
	return TIER2_OK;
}

const struct tier2_record *tier2_read_record(const struct tier2_reader *rd)
{
	return &rd->rec;
}

uint64_t tier2_read_total(const struct tier2_reader *rd)
{
	return rd->total;
}

/* Writes h's bytes from h->done on into dst while they lie below limit. */
static void place(const struct tier2_reader *rd, struct rd_held *h, unsigned char *dst,
                  uint64_t limit)
{
	const redisReply *rep = h->rep;
	if (h->g.is_part) {
		uint64_t at = h->g.first + h->done;
		if (at >= limit)
			return;
		uint64_t take = rep->len - h->done;
		if (take > limit - at)
			take = limit - at;
		memcpy(dst + at, rep->str + h->done, (size_t)take);
		h->done += take;
		return;
	}
	uint64_t base = (uint64_t)h->g.index * rd->rec.chunk_size; /* its stream offset */
	while (h->done < rep->len) {
		uint64_t s = base + h->done;
		size_t k = run_of(rd, s);
		uint64_t in = s - rd->from[k], at = rd->at[k] + in;
		if (at >= limit)
			return;
		uint64_t take = rd->g[k].len - in;
		if (take > rep->len - h->done)
			take = rep->len - h->done;
		if (take > limit - at)
			take = limit - at;
		memcpy(dst + at, rep->str + h->done, (size_t)take);
		h->done += take;
	}
}

/* The payload offset of h's first byte not placed. */
static uint64_t held_next(const struct tier2_reader *rd, const struct rd_held *h)
{
	if (h->g.is_part)
		return h->g.first + h->done;
	uint64_t s = (uint64_t)h->g.index * rd->rec.chunk_size + h->done;
	size_t k = run_of(rd, s);
	return rd->at[k] + (s - rd->from[k]);
}

/* Checks reply rep of GET q: its length and XXH3. */
static enum tier2_status check(struct tier2_reader *rd, const struct rd_get *q,
                               const redisReply *rep, const char *name, char *err, size_t errsz)
{
	const struct tier2_record *rec = &rd->rec;
	const char *what = q->is_part ? "the part" : "the chunk";
	if (rep->type != REDIS_REPLY_STRING)
		return bad_reply(rep, name, what, err, errsz);
	if (rd->stats)
		rd->stats->bytes_in += rep->len;
	if (q->is_part) {
		const struct tier2_part_ref *ref = &rd->refs[q->index];
		uint64_t sum = XXH3_64bits_withSeed(rep->str, rep->len, ref->layer);
		if (rep->len != ref->size || sum != ref->xxh3) {
			tier2_io_err(err, errsz,
			             "tier2: get %s: the part has %zu bytes and XXH3 %016llx, the "
			             "record says %llu and %016llx",
			             name, rep->len, (unsigned long long)sum,
			             (unsigned long long)ref->size, (unsigned long long)ref->xxh3);
			return TIER2_DAMAGED;
		}
		return TIER2_OK;
	}
	uint64_t stream = rd->from[rd->n_runs - 1] + rd->g[rd->n_runs - 1].len;
	uint64_t at = (uint64_t)q->index * rec->chunk_size;
	size_t want = stream - at < rec->chunk_size ? (size_t)(stream - at) : rec->chunk_size;
	if (rep->len != want) {
		tier2_io_err(err, errsz,
		             "tier2: get %s: the chunk has %zu bytes, the record says %zu", name,
		             rep->len, want);
		return TIER2_DAMAGED;
	}
	uint64_t sum = XXH3_64bits(rep->str, rep->len);
	if (sum != rec->chunk_xxh3[q->index]) {
		tier2_io_err(err, errsz, "tier2: get %s: its XXH3 is %016llx, the record's %016llx",
		             name, (unsigned long long)sum,
		             (unsigned long long)rec->chunk_xxh3[q->index]);
		return TIER2_DAMAGED;
	}
	return TIER2_OK;
}

static void name_of(const struct tier2_reader *rd, const struct rd_get *q, char *out)
{
	if (q->is_part) {
		const struct tier2_part_ref *ref = &rd->refs[q->index];
		tier2_name_part(out, rd->ns, ref->node, ref->layer, (int)ref->part, ref->xxh3);
	} else {
		tier2_name_chunk(out, rd->ns, rd->key, rd->rec.generation, q->index);
	}
}

/* Drops the held replies wholly placed. */
static void drop_placed(struct tier2_reader *rd)
{
	size_t k = 0;
	for (size_t i = 0; i < rd->n_held; i++) {
		if (rd->held[i].done == rd->held[i].rep->len)
			freeReplyObject(rd->held[i].rep);
		else
			rd->held[k++] = rd->held[i];
	}
	rd->n_held = k;
}

static enum tier2_status fail(struct tier2_reader *rd, enum tier2_status st)
{
	rd->failed = st;
	if (st != TIER2_NOMEM)
		count(rd->stats, st);
	return st;
}

enum tier2_status tier2_read_next(struct tier2_reader *rd, unsigned char *dst, uint64_t limit,
                                  uint64_t *arrived, char *err, size_t errsz)
{
	if (rd->failed != TIER2_OK) {
		tier2_io_err(err, errsz, "tier2: get: the read failed already");
		return rd->failed;
	}
	if (limit > rd->total)
		limit = rd->total;
	for (size_t i = 0; i < rd->n_held; i++)
		place(rd, &rd->held[i], dst, limit);
	drop_placed(rd);
	/* one trip of the GETs that begin below the limit */
	struct tier2_cmd2 cb[GETS_PER_TRIP];
	struct cluster_cmd cmds[GETS_PER_TRIP];
	size_t k = 0;
	uint64_t bytes = 0;
	while (k < GETS_PER_TRIP && rd->next + k < rd->n_gets && bytes < TRIP_BYTES &&
	       rd->gets[rd->next + k].first < limit) {
		const struct rd_get *q = &rd->gets[rd->next + k];
		uint64_t want = q->is_part ? rd->refs[q->index].size : rd->rec.chunk_size;
		bytes += want;
		name_of(rd, q, cb[k].name);
		tier2_io_cmd2(&cmds[k], &cb[k], "GET", strlen(cb[k].name));
		/* a longer reply is refused as it arrives, not buffered whole */
		cmds[k].max_reply = (size_t)want + 64;
		k++;
	}
	enum tier2_status st = TIER2_OK;
	if (k && rd->n_held + k > rd->cap_held) {
		size_t cap = rd->n_held + k + GETS_PER_TRIP;
		struct rd_held *h = realloc(rd->held, cap * sizeof(*h));
		if (!h) {
			tier2_io_err(err, errsz, "tier2: get: out of memory");
			return fail(rd, TIER2_NOMEM);
		}
		rd->held = h;
		rd->cap_held = cap;
	}
	if (k)
		st = tier2_io_pipeline(rd->r, cmds, k, "reading chunks and parts", err, errsz);
	for (size_t j = 0; j < k && st == TIER2_OK; j++) {
		const struct rd_get *q = &rd->gets[rd->next + j];
		st = check(rd, q, cmds[j].reply, cb[j].name, err, errsz);
		if (st != TIER2_OK)
			break;
		struct rd_held *h = &rd->held[rd->n_held++];
		*h = (struct rd_held){cmds[j].reply, *q, 0};
		cmds[j].reply = NULL; /* the held one's now */
		place(rd, h, dst, limit);
	}
	tier2_io_free_replies(cmds, k);
	if (st != TIER2_OK)
		return fail(rd, st);
	rd->next += k;
	drop_placed(rd);
	uint64_t a = rd->next < rd->n_gets ? rd->gets[rd->next].first : rd->total;
	for (size_t i = 0; i < rd->n_held; i++) {
		uint64_t n = held_next(rd, &rd->held[i]);
		if (n < a)
			a = n;
	}
	*arrived = a;
	return TIER2_OK;
}

void tier2_read_close(struct tier2_reader *rd)
{
	if (!rd)
		return;
	for (size_t i = 0; i < rd->n_held; i++)
		freeReplyObject(rd->held[i].rep);
	free(rd->held);
	free(rd->gets);
	free(rd->refs);
	free(rd->g);
	free(rd->at);
	free(rd->from);
	tier2_record_free(&rd->rec);
	free(rd);
}

/* ---- the entry whole ---------------------------------------------------------------- */

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
	struct tier2_reader *rd;
	enum tier2_status st = tier2_read_open(r, ns, key, max_bytes, stats, &rd, err, errsz);
	if (st != TIER2_OK)
		return st;
	const struct tier2_record *rec = &rd->rec;
	struct tier2_entry e = {
	        .salt_len = rec->salt_len, .prefix_len = rec->n_tokens, .n_blobs = rec->n_layers};
	memcpy(e.fingerprint, rec->fingerprint, 32);
	/* the decoder ensures n_layers >= 1; the analyzer cannot see it */
	e.blobs = calloc(rec->n_layers ? rec->n_layers : 1, sizeof(*e.blobs));
	e.tokens = malloc((size_t)rec->n_tokens * 4u);
	e.salt = rec->salt_len ? malloc(rec->salt_len) : NULL;
	e.mem = malloc(rd->total ? rd->total : 1);
	if (!e.blobs || !e.tokens || (rec->salt_len && !e.salt) || !e.mem) {
		tier2_io_err(err, errsz, "tier2: get: out of memory for an entry of %llu bytes",
		             (unsigned long long)rd->total);
		st = TIER2_NOMEM;
	}
	uint64_t arrived = 0;
	while (st == TIER2_OK && arrived < rd->total)
		st = tier2_read_next(rd, e.mem, rd->total, &arrived, err, errsz);
	uint64_t off = 0;
	for (uint32_t i = 0; i < rec->n_layers && st == TIER2_OK; i++) {
		e.blobs[i] = (struct tier2_entry_blob){e.mem + off, rec->layers[i].size,
		                                       rec->layers[i].xxh3};
		off += rec->layers[i].size;
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
			count(stats, st);
		}
	}
	if (st == TIER2_OK) {
		memcpy(e.tokens, rec->tokens, (size_t)rec->n_tokens * 4u);
		if (rec->salt_len)
			memcpy(e.salt, rec->salt, rec->salt_len);
		*entry = e;
		count(stats, st);
	} else {
		tier2_entry_free(&e);
	}
	tier2_read_close(rd);
	return st;
}

void tier2_entry_free(struct tier2_entry *entry)
{
	if (!entry)
		return;
	free(entry->mem);
	free(entry->blobs);
	free(entry->tokens);
	free(entry->salt);
	memset(entry, 0, sizeof(*entry));
}
