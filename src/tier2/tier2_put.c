/* tier2_put: writes an entry to the cluster: chunks, record, index nodes
 * (tier2.h, "Put order"). */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "checksum.h"
#include "prefix.h"
#include "tier2/tier2_io.h"
#include "xxh_dispatch.h"

#define DEFAULT_IN_FLIGHT 16u
#define INDEX_WINDOW      1024u /* index commands per pipeline */

/* One command's buffers: its key's name, up to 5 arguments. */
struct cmdbuf {
	char name[TIER2_NAME_MAX];
	const char *argv[5];
	size_t len[5];
};

struct put {
	struct cluster_router *r;
	const char *ns;
	uint8_t key[TIER2_KEY_LEN];
	char ttl[16];
	size_t ttl_len;
	uint64_t gen;  /* the generation written */
	uint32_t sent; /* its chunks sent so far (some may be written) */
	struct tier2_stats *stats;
	char *err;
	size_t errsz;
};

/* The record the key has before the put. */
struct old {
	int have; /* it decodes */
	int same; /* and is this entry's: model, salt and tokens */
	uint64_t gen;
	uint32_t n_chunks;
	uint64_t bytes; /* the sum of its layer sizes */
};

static uint64_t new_generation(void)
{
	uint64_t g = 0;
	if (getrandom(&g, sizeof(g), 0) == (ssize_t)sizeof(g))
		return g;
	/* no entropy source: the time, the pid and the address space, hashed */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t seed[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
	                    (uint64_t)(uintptr_t)&g};
	return XXH3_64bits(seed, sizeof(seed));
}

/* Adds " EX ttl" to a command of argc arguments when the put has a TTL. */
static int with_ttl(const struct put *p, struct cmdbuf *c, int argc)
{
	if (!p->ttl_len)
		return argc;
	c->argv[argc] = "EX";
	c->len[argc] = 2;
	c->argv[argc + 1] = p->ttl;
	c->len[argc + 1] = p->ttl_len;
	return argc + 2;
}

static void cmd_of(struct cluster_cmd *cmd, struct cmdbuf *c, size_t name_len, int argc)
{
	c->argv[1] = c->name;
	c->len[1] = name_len;
	*cmd = (struct cluster_cmd){c->name, name_len, argc, c->argv, c->len, NULL};
}

/* Runs a window of commands and checks every reply with want. */
static enum tier2_status run(struct put *p, struct cluster_cmd *cmds, size_t n, const char *what,
                             int want_int)
{
	enum tier2_status st = tier2_io_pipeline(p->r, cmds, n, what, p->err, p->errsz);
	for (size_t i = 0; i < n && st == TIER2_OK; i++)
		st = want_int ? tier2_io_want_int(cmds[i].reply, cmds[i].argv[0], cmds[i].key,
		                                  p->err, p->errsz)
		              : tier2_io_want_ok(cmds[i].reply, cmds[i].argv[0], cmds[i].key,
		                                 p->err, p->errsz);
	tier2_io_free_replies(cmds, n);
	return st;
}

/* The record that key has now, if any (one that does not decode: none; its
 * chunks are left to expiry or eviction). */
static enum tier2_status old_record(struct put *p, const uint8_t *fingerprint, const void *salt,
                                    size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                                    struct old *o)
{
	struct tier2_cmd2 c;
	struct cluster_cmd cmd;
	memset(o, 0, sizeof(*o));
	tier2_io_cmd2(&cmd, &c, "GET", tier2_name_record(c.name, p->ns, p->key));
	enum tier2_status st =
	        tier2_io_pipeline(p->r, &cmd, 1, "reading the old record", p->err, p->errsz);
	if (st != TIER2_OK)
		return st;
	const redisReply *rep = cmd.reply;
	if (rep->type == REDIS_REPLY_STRING) {
		struct tier2_record rec;
		if (p->stats)
			p->stats->bytes_in += rep->len;
		if (tier2_record_decode(rep->str, rep->len, &rec, NULL, 0) == 0) {
			o->have = 1;
			o->gen = rec.generation;
			o->n_chunks = rec.n_chunks;
			for (uint32_t i = 0; i < rec.n_layers; i++)
				o->bytes += rec.layers[i].size; /* bounded by the decoder */
			o->same = rec.n_tokens == n_tokens &&
			          memcmp(rec.fingerprint, fingerprint, 32) == 0 &&
			          rec.salt_len == salt_len &&
			          (!salt_len || memcmp(rec.salt, salt, salt_len) == 0) &&
			          memcmp(rec.tokens, tokens, (size_t)n_tokens * 4u) == 0;
			tier2_record_free(&rec);
		}
	} else if (rep->type != REDIS_REPLY_NIL) {
		st = tier2_io_want_ok(rep, "GET", cmd.key, p->err, p->errsz);
	}
	tier2_io_free_replies(&cmd, 1);
	return st;
}

/* Checks the bytes of each layer against its checksum as they pass. */
struct verify {
	const struct tier2_layer *layers;
	uint32_t n_layers;
	uint32_t layer;
	uint64_t off; /* in layers[layer] */
	struct checksum_state *cs;
};

/* Feeds len bytes; TIER2_OK, TIER2_DAMAGED or TIER2_NOMEM with a message. */
static enum tier2_status verify_feed(struct put *p, struct verify *v, const unsigned char *b,
                                     size_t len)
{
	while (len > 0 && v->layer < v->n_layers) {
		const struct tier2_layer *l = &v->layers[v->layer];
		if (!v->cs && !(v->cs = checksum_begin(v->layer))) {
			tier2_io_err(p->err, p->errsz, "tier2: put: out of memory");
			return TIER2_NOMEM;
		}
		size_t take = l->size - v->off < len ? (size_t)(l->size - v->off) : len;
		checksum_update(v->cs, b, take);
		b += take;
		len -= take;
		v->off += take;
		if (v->off == l->size) {
			uint64_t sum = checksum_end(v->cs);
			v->cs = NULL;
			if (sum != l->xxh3) {
				char name[TIER2_NAME_MAX];
				tier2_name_record(name, p->ns, p->key);
				tier2_io_err(p->err, p->errsz,
				             "tier2: put %s: layer %u's bytes have checksum "
				             "%016llx, the caller gave %016llx",
				             name, v->layer, (unsigned long long)sum,
				             (unsigned long long)l->xxh3);
				return TIER2_DAMAGED;
			}
			v->layer++;
			v->off = 0;
		}
	}
	return TIER2_OK;
}

/* Writes the chunks, window by window, each read from src into one of the
 * window's buffers, and their sums to sums. */
static enum tier2_status put_chunks(struct put *p, const struct tier2_source *src, struct verify *v,
                                    uint64_t total, uint32_t cs, uint32_t n_chunks, uint32_t window,
                                    uint64_t *sums)
{
	uint32_t slots = window < n_chunks ? window : n_chunks;
	size_t bufsz = total < cs ? (size_t)total : cs;
	struct cmdbuf *cb = calloc(slots, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(slots, sizeof(*cmds));
	unsigned char *buf = malloc((size_t)slots * bufsz);
	enum tier2_status st = TIER2_OK;
	if (!cb || !cmds || !buf) {
		tier2_io_err(p->err, p->errsz,
		             "tier2: put: out of memory for %u chunk buffers of %zu bytes", slots,
		             bufsz);
		st = TIER2_NOMEM;
	}
	for (uint32_t first = 0; first < n_chunks && st == TIER2_OK; first += window) {
		uint32_t n = n_chunks - first < window ? n_chunks - first : window;
		for (uint32_t j = 0; j < n && st == TIER2_OK; j++) {
			struct cmdbuf *c = &cb[j];
			uint64_t at = (uint64_t)(first + j) * cs;
			size_t len = total - at < cs ? (size_t)(total - at) : cs;
			unsigned char *val = buf + (size_t)j * bufsz;
			char msg[256] = "";
			if (src->read(src->ctx, val, len, msg, sizeof(msg)) != 0) {
				char name[TIER2_NAME_MAX];
				tier2_name_record(name, p->ns, p->key);
				tier2_io_err(p->err, p->errsz,
				             "tier2: put %s: the source failed at byte %llu of "
				             "%llu: %s",
				             name, (unsigned long long)at,
				             (unsigned long long)total,
				             msg[0] ? msg : "(no message)");
				st = TIER2_DAMAGED;
				break;
			}
			if (v && (st = verify_feed(p, v, val, len)) != TIER2_OK)
				break;
			sums[first + j] = XXH3_64bits(val, len);
			c->argv[0] = "SET";
			c->len[0] = 3;
			c->argv[2] = (const char *)val;
			c->len[2] = len;
			cmd_of(&cmds[j], c,
			       tier2_name_chunk(c->name, p->ns, p->key, p->gen, first + j),
			       with_ttl(p, c, 3));
			if (p->stats)
				p->stats->bytes_out += len;
		}
		if (st == TIER2_OK) {
			p->sent = first + n;
			st = run(p, cmds, n, "writing chunks", 0);
		}
	}
	free(buf);
	free(cmds);
	free(cb);
	return st;
}

/* Writes the entry's index nodes: "+" on its path, its field at its node. */
static enum tier2_status put_index(struct put *p, const uint8_t *fingerprint, const void *salt,
                                   size_t salt_len, const uint32_t *tokens, uint32_t n)
{
	uint32_t depth = n / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	size_t per = p->ttl_len ? 2 : 1; /* HSET, then EXPIRE */
	struct cmdbuf *cb = calloc(INDEX_WINDOW * per, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(INDEX_WINDOW * per, sizeof(*cmds));
	if (!h || !cb || !cmds) {
		free(h);
		free(cb);
		free(cmds);
		tier2_io_err(p->err, p->errsz, "tier2: put: out of memory");
		return TIER2_NOMEM;
	}
	prefix_block_hashes(fingerprint, salt, salt_len, tokens, n, h);
	unsigned char field[TIER2_NODE_FIELD_LEN];
	tier2_put_le32(field, n);
	tier2_put_le64(field + 4, tier2_tail_hash(tokens, depth * PREFIX_BLOCK, n));
	/* its path (h_1..h_{D-1}: h_0 carries no "+"), then its own node h_D */
	uint32_t m = depth ? depth : 1;
	enum tier2_status st = TIER2_OK;
	for (uint32_t first = 0; first < m && st == TIER2_OK; first += INDEX_WINDOW) {
		uint32_t n_cmd = m - first < INDEX_WINDOW ? m - first : INDEX_WINDOW;
		for (uint32_t j = 0; j < n_cmd; j++) {
			uint32_t d = depth ? first + j + 1 : 0;
			struct cmdbuf *c = &cb[j * per];
			size_t nl = tier2_name_node(c->name, p->ns, h[d]);
			c->argv[0] = "HSET";
			c->len[0] = 4;
			if (d == depth) {
				c->argv[2] = (const char *)p->key;
				c->len[2] = TIER2_KEY_LEN;
				c->argv[3] = (const char *)field;
				c->len[3] = sizeof(field);
			} else {
				c->argv[2] = "+";
				c->len[2] = 1;
				c->argv[3] = "";
				c->len[3] = 0;
			}
			cmd_of(&cmds[j * per], c, nl, 4);
			if (p->stats)
				p->stats->bytes_out += c->len[2] + c->len[3];
			if (per == 2) {
				struct cmdbuf *e = &cb[j * per + 1];
				memcpy(e->name, c->name, nl + 1);
				e->argv[0] = "EXPIRE";
				e->len[0] = 6;
				e->argv[2] = p->ttl;
				e->len[2] = p->ttl_len;
				cmd_of(&cmds[j * per + 1], e, nl, 3);
			}
		}
		st = run(p, cmds, (size_t)n_cmd * per, "writing the index", 1);
	}
	free(cmds);
	free(cb);
	free(h);
	return st;
}

/* Deletes chunks [0, n_chunks) of generation gen (best effort); the number
 * deleted. */
static uint64_t del_chunks(struct put *p, uint64_t gen, uint32_t n_chunks)
{
	struct cmdbuf *cb = calloc(INDEX_WINDOW, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(INDEX_WINDOW, sizeof(*cmds));
	uint64_t deleted = 0;
	for (uint32_t first = 0; cb && cmds && first < n_chunks; first += INDEX_WINDOW) {
		uint32_t n = n_chunks - first < INDEX_WINDOW ? n_chunks - first : INDEX_WINDOW;
		for (uint32_t j = 0; j < n; j++) {
			cb[j].argv[0] = "DEL";
			cb[j].len[0] = 3;
			cmd_of(&cmds[j], &cb[j],
			       tier2_name_chunk(cb[j].name, p->ns, p->key, gen, first + j), 2);
		}
		char ignored[256];
		(void)tier2_io_pipeline(p->r, cmds, n, "deleting chunks", ignored, sizeof(ignored));
		for (uint32_t j = 0; j < n; j++)
			deleted += cmds[j].reply && cmds[j].reply->type == REDIS_REPLY_INTEGER &&
			           cmds[j].reply->integer == 1;
		tier2_io_free_replies(cmds, n);
	}
	free(cmds);
	free(cb);
	return deleted;
}

/* After a failure: removes what the put wrote (best effort). When its record
 * may be in place, tier2_delete removes it if it is still its own (with its
 * chunks and index field), and then the generation it replaced is an orphan. */
static void undo(struct put *p, int record_sent, const struct old *old)
{
	char ignored[512];
	uint64_t freed = 0;
	if (record_sent && tier2_delete(p->r, p->ns, p->key, p->gen, &freed, ignored,
	                                sizeof(ignored)) == TIER2_OK) {
		if (old->have)
			(void)del_chunks(p, old->gen, old->n_chunks);
		if (p->stats)
			p->stats->undone_chunks_del += p->sent;
		return;
	}
	uint64_t n = del_chunks(p, p->gen, p->sent);
	if (p->stats)
		p->stats->undone_chunks_del += n;
}

static enum tier2_status check_args(const char *ns, size_t salt_len, uint32_t n_tokens,
                                    const struct tier2_layer *layers, uint32_t n_layers,
                                    uint32_t cs, char *err, size_t errsz)
{
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (n_tokens == 0 || n_tokens > TIER2_MAX_TOKENS || salt_len > TIER2_MAX_SALT ||
	    n_layers == 0 || n_layers > TIER2_MAX_LAYERS || !layers || cs == 0 ||
	    cs > TIER2_CHUNK_MAX) {
		tier2_io_err(err, errsz,
		             "tier2: put: %u tokens (1..%u), a salt of %zu bytes (<= %u), %u "
		             "layers (1..%u), chunks of %u bytes (1..%u)",
		             n_tokens, TIER2_MAX_TOKENS, salt_len, TIER2_MAX_SALT, n_layers,
		             TIER2_MAX_LAYERS, cs, TIER2_CHUNK_MAX);
		return TIER2_INVALID;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < n_layers; i++) {
		if (layers[i].size == 0 || layers[i].size > TIER2_MAX_ENTRY_BYTES - total) {
			tier2_io_err(err, errsz,
			             "tier2: put: layer %u of %llu bytes (empty, or the entry "
			             "passes %llu bytes)",
			             i, (unsigned long long)layers[i].size,
			             (unsigned long long)TIER2_MAX_ENTRY_BYTES);
			return TIER2_INVALID;
		}
		total += layers[i].size;
	}
	if (tier2_chunk_count(total, cs) > TIER2_MAX_CHUNKS) {
		tier2_io_err(err, errsz, "tier2: put: %llu bytes in chunks of %u make more than %u",
		             (unsigned long long)total, cs, TIER2_MAX_CHUNKS);
		return TIER2_INVALID;
	}
	return TIER2_OK;
}

/* tier2_put_from; verify: check each layer's bytes against its checksum
 * (tier2_put computed them itself). */
static enum tier2_status
put_impl(struct cluster_router *r, const char *ns, const uint8_t fingerprint[32], const void *salt,
         size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
         const struct tier2_layer *layers, uint32_t n_layers, const struct tier2_source *src,
         const struct tier2_put_options *opt, int verify, struct tier2_put_result *res,
         struct tier2_stats *stats, char *err, size_t errsz)
{
	struct tier2_put_options o = opt ? *opt : (struct tier2_put_options){0};
	uint32_t cs = o.chunk_size ? o.chunk_size : TIER2_CHUNK_MAX;
	uint32_t window = o.max_in_flight ? o.max_in_flight : DEFAULT_IN_FLIGHT;
	if (res)
		memset(res, 0, sizeof(*res));
	enum tier2_status st = check_args(ns, salt_len, n_tokens, layers, n_layers, cs, err, errsz);
	if (st == TIER2_OK && (!src || !src->read)) {
		tier2_io_err(err, errsz, "tier2: put: no source of bytes");
		st = TIER2_INVALID;
	}
	if (st != TIER2_OK)
		return st;
	struct put p = {.r = r, .ns = ns, .stats = stats, .err = err, .errsz = errsz};
	if (o.ttl_s)
		p.ttl_len = (size_t)snprintf(p.ttl, sizeof(p.ttl), "%u", o.ttl_s);
	if (prefix_key(fingerprint, salt, salt_len, tokens, n_tokens, p.key) != 0) {
		tier2_io_err(err, errsz, "tier2: put: no memory for the entry key's digest");
		return TIER2_NOMEM;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < n_layers; i++)
		total += layers[i].size;
	uint32_t n_chunks = (uint32_t)tier2_chunk_count(total, cs);
	uint64_t *sums = malloc((size_t)n_chunks * sizeof(*sums));
	uint8_t *rec_bytes = NULL;
	size_t rec_len = 0;
	struct old old;
	struct verify v = {.layers = layers, .n_layers = n_layers};
	int record_sent = 0, existed = 0;
	p.gen = new_generation();
	if (!sums) {
		tier2_io_err(err, errsz, "tier2: put: out of memory");
		st = TIER2_NOMEM;
		goto out;
	}
	if ((st = old_record(&p, fingerprint, salt, salt_len, tokens, n_tokens, &old)) != TIER2_OK)
		goto out;
	if (o.keep_existing && old.have && old.same) {
		existed = 1;
		if (res)
			*res = (struct tier2_put_result){old.gen, old.n_chunks, old.bytes, 1};
		goto out;
	}
	if (old.have && old.gen == p.gen)
		p.gen = ~p.gen; /* one in 2^64: never reuse the generation being replaced */
	st = put_chunks(&p, src, verify ? &v : NULL, total, cs, n_chunks, window, sums);
	if (st != TIER2_OK)
		goto out;
	struct tier2_record rec = {.generation = p.gen,
	                           .salt_len = (uint32_t)salt_len,
	                           .salt = salt,
	                           .n_tokens = n_tokens,
	                           .tokens = tokens,
	                           .n_layers = n_layers,
	                           .layers = layers,
	                           .chunk_size = cs,
	                           .n_chunks = n_chunks,
	                           .chunk_xxh3 = sums};
	memcpy(rec.fingerprint, fingerprint, 32);
	if (tier2_record_encode(&rec, &rec_bytes, &rec_len, err, errsz) != 0) {
		st = TIER2_NOMEM;
		goto out;
	}
	struct cmdbuf c;
	struct cluster_cmd cmd;
	c.argv[0] = "SET";
	c.len[0] = 3;
	c.argv[2] = (const char *)rec_bytes;
	c.len[2] = rec_len;
	cmd_of(&cmd, &c, tier2_name_record(c.name, ns, p.key), with_ttl(&p, &c, 3));
	if (stats)
		stats->bytes_out += rec_len;
	record_sent = 1;
	if ((st = run(&p, &cmd, 1, "writing the record", 0)) != TIER2_OK)
		goto out;
	if ((st = put_index(&p, fingerprint, salt, salt_len, tokens, n_tokens)) != TIER2_OK)
		goto out;
	if (old.have && stats)
		stats->old_chunks_del += del_chunks(&p, old.gen, old.n_chunks);
	else if (old.have)
		(void)del_chunks(&p, old.gen, old.n_chunks);
	if (res)
		*res = (struct tier2_put_result){p.gen, n_chunks, total, 0};
out:
	if (v.cs)
		(void)checksum_end(v.cs);
	if (st != TIER2_OK && p.sent)
		undo(&p, record_sent, &old);
	if (stats) {
		stats->puts += st == TIER2_OK && !existed;
		stats->put_existing += existed;
		stats->put_failures += st != TIER2_OK;
	}
	free(rec_bytes);
	free(sums);
	return st;
}

enum tier2_status tier2_put_from(struct cluster_router *r, const char *ns,
                                 const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                                 const uint32_t *tokens, uint32_t n_tokens,
                                 const struct tier2_layer *layers, uint32_t n_layers,
                                 const struct tier2_source *src,
                                 const struct tier2_put_options *opt, struct tier2_put_result *res,
                                 struct tier2_stats *stats, char *err, size_t errsz)
{
	return put_impl(r, ns, fingerprint, salt, salt_len, tokens, n_tokens, layers, n_layers, src,
	                opt, 1, res, stats, err, errsz);
}

/* A source over contiguous blobs. */
struct blobs_src {
	const struct tier2_blob *blobs;
	uint32_t n, i;
	size_t off; /* in blobs[i] */
};

static int blobs_read(void *ctx, void *dst, size_t len, char *err, size_t errsz)
{
	struct blobs_src *b = ctx;
	unsigned char *d = dst;
	while (len > 0) {
		if (b->i == b->n) {
			tier2_io_err(err, errsz, "past the blobs' end");
			return -1;
		}
		size_t take = b->blobs[b->i].size - b->off;
		if (take > len)
			take = len;
		memcpy(d, (const unsigned char *)b->blobs[b->i].data + b->off, take);
		d += take;
		len -= take;
		b->off += take;
		if (b->off == b->blobs[b->i].size) {
			b->i++;
			b->off = 0;
		}
	}
	return 0;
}

enum tier2_status tier2_put(struct cluster_router *r, const char *ns, const uint8_t fingerprint[32],
                            const void *salt, size_t salt_len, const uint32_t *tokens,
                            uint32_t n_tokens, const struct tier2_blob *blobs, uint32_t n_blobs,
                            const struct tier2_put_options *opt, struct tier2_stats *stats,
                            char *err, size_t errsz)
{
	if (n_blobs == 0 || n_blobs > TIER2_MAX_LAYERS || !blobs) {
		tier2_io_err(err, errsz, "tier2: put: %u blobs (1..%u)", n_blobs, TIER2_MAX_LAYERS);
		return TIER2_INVALID;
	}
	struct tier2_layer *layers = calloc(n_blobs, sizeof(*layers));
	if (!layers) {
		tier2_io_err(err, errsz, "tier2: put: out of memory");
		return TIER2_NOMEM;
	}
	struct tier2_put_options o = opt ? *opt : (struct tier2_put_options){0};
	uint32_t cs = o.chunk_size ? o.chunk_size : TIER2_CHUNK_MAX;
	for (uint32_t i = 0; i < n_blobs; i++)
		layers[i].size = blobs[i].size;
	/* the arguments checked before any checksum is computed */
	enum tier2_status st = check_args(ns, salt_len, n_tokens, layers, n_blobs, cs, err, errsz);
	if (st == TIER2_OK) {
		for (uint32_t i = 0; i < n_blobs; i++)
			layers[i].xxh3 = checksum_blob(blobs[i].data, blobs[i].size, i);
		struct blobs_src b = {blobs, n_blobs, 0, 0};
		struct tier2_source src = {blobs_read, &b};
		st = put_impl(r, ns, fingerprint, salt, salt_len, tokens, n_tokens, layers, n_blobs,
		              &src, opt, 0, NULL, stats, err, errsz);
	}
	free(layers);
	return st;
}
