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
	struct tier2_stats *stats;
	char *err;
	size_t errsz;
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

/* The record that key has now, if any: its generation and chunk count. */
static enum tier2_status old_record(struct put *p, int *have, uint64_t *gen, uint32_t *n_chunks)
{
	struct cmdbuf c;
	struct cluster_cmd cmd;
	*have = 0;
	c.argv[0] = "GET";
	c.len[0] = 3;
	cmd_of(&cmd, &c, tier2_name_record(c.name, p->ns, p->key), 2);
	enum tier2_status st =
	        tier2_io_pipeline(p->r, &cmd, 1, "reading the old record", p->err, p->errsz);
	if (st != TIER2_OK)
		return st;
	const redisReply *rep = cmd.reply;
	if (rep->type == REDIS_REPLY_STRING) {
		struct tier2_record rec;
		if (p->stats)
			p->stats->bytes_in += rep->len;
		/* a damaged old record: its chunks are left to expiry or eviction */
		if (tier2_record_decode(rep->str, rep->len, &rec, NULL, 0) == 0) {
			*have = 1;
			*gen = rec.generation;
			*n_chunks = rec.n_chunks;
			tier2_record_free(&rec);
		}
	} else if (rep->type != REDIS_REPLY_NIL) {
		st = tier2_io_want_ok(rep, "GET", cmd.key, p->err, p->errsz);
	}
	tier2_io_free_replies(&cmd, 1);
	return st;
}

/* Writes the chunks, window by window, and their sums to sums. */
static enum tier2_status put_chunks(struct put *p, const struct tier2_blob *blobs, uint32_t n_blobs,
                                    uint32_t cs, uint32_t n_chunks, uint32_t window, uint64_t gen,
                                    uint64_t *sums)
{
	struct cmdbuf *cb = calloc(window, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(window, sizeof(*cmds));
	unsigned char **scratch = calloc(window, sizeof(*scratch));
	enum tier2_status st = TIER2_OK;
	if (!cb || !cmds || !scratch) {
		tier2_io_err(p->err, p->errsz, "tier2: put: out of memory");
		st = TIER2_NOMEM;
	}
	uint32_t layer = 0;
	size_t off = 0; /* in blobs[layer] */
	for (uint32_t first = 0; first < n_chunks && st == TIER2_OK; first += window) {
		uint32_t n = n_chunks - first < window ? n_chunks - first : window;
		for (uint32_t j = 0; j < n && st == TIER2_OK; j++) {
			struct cmdbuf *c = &cb[j];
			size_t want = cs;
			const unsigned char *val;
			size_t len = 0;
			if (blobs[layer].size - off >= want || layer + 1 == n_blobs) {
				val = (const unsigned char *)blobs[layer].data + off;
				len = blobs[layer].size - off < want ? blobs[layer].size - off
				                                     : want;
				off += len;
			} else { /* the chunk spans layers: copied */
				if (!scratch[j] && !(scratch[j] = malloc(cs))) {
					tier2_io_err(p->err, p->errsz, "tier2: put: out of memory");
					st = TIER2_NOMEM;
					break;
				}
				while (len < want && layer < n_blobs) {
					size_t take = blobs[layer].size - off;
					if (take > want - len)
						take = want - len;
					if (take == 0)
						break;
					memcpy(scratch[j] + len,
					       (const unsigned char *)blobs[layer].data + off,
					       take);
					len += take;
					off += take;
					if (off == blobs[layer].size && layer + 1 < n_blobs) {
						layer++;
						off = 0;
					}
				}
				val = scratch[j];
			}
			if (off == blobs[layer].size && layer + 1 < n_blobs) {
				layer++;
				off = 0;
			}
			sums[first + j] = XXH3_64bits(val, len);
			c->argv[0] = "SET";
			c->len[0] = 3;
			c->argv[2] = (const char *)val;
			c->len[2] = len;
			cmd_of(&cmds[j], c,
			       tier2_name_chunk(c->name, p->ns, p->key, gen, first + j),
			       with_ttl(p, c, 3));
			if (p->stats)
				p->stats->bytes_out += len;
		}
		if (st == TIER2_OK)
			st = run(p, cmds, n, "writing chunks", 0);
	}
	if (scratch)
		for (uint32_t j = 0; j < window; j++)
			free(scratch[j]);
	free(scratch);
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

/* Deletes the chunks of a replaced generation (best effort). */
static void del_old(struct put *p, uint64_t gen, uint32_t n_chunks)
{
	struct cmdbuf *cb = calloc(INDEX_WINDOW, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(INDEX_WINDOW, sizeof(*cmds));
	for (uint32_t first = 0; cb && cmds && first < n_chunks; first += INDEX_WINDOW) {
		uint32_t n = n_chunks - first < INDEX_WINDOW ? n_chunks - first : INDEX_WINDOW;
		for (uint32_t j = 0; j < n; j++) {
			cb[j].argv[0] = "DEL";
			cb[j].len[0] = 3;
			cmd_of(&cmds[j], &cb[j],
			       tier2_name_chunk(cb[j].name, p->ns, p->key, gen, first + j), 2);
		}
		char ignored[256];
		if (tier2_io_pipeline(p->r, cmds, n, "deleting old chunks", ignored,
		                      sizeof(ignored)) == TIER2_OK &&
		    p->stats)
			for (uint32_t j = 0; j < n; j++)
				p->stats->old_chunks_del +=
				        cmds[j].reply->type == REDIS_REPLY_INTEGER &&
				        cmds[j].reply->integer == 1;
		tier2_io_free_replies(cmds, n);
	}
	free(cmds);
	free(cb);
}

static enum tier2_status check_args(const char *ns, size_t salt_len, uint32_t n_tokens,
                                    const struct tier2_blob *blobs, uint32_t n_blobs, uint32_t cs,
                                    char *err, size_t errsz)
{
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	if (n_tokens == 0 || n_tokens > TIER2_MAX_TOKENS || salt_len > TIER2_MAX_SALT ||
	    n_blobs == 0 || n_blobs > TIER2_MAX_LAYERS || cs == 0 || cs > TIER2_CHUNK_MAX) {
		tier2_io_err(err, errsz,
		             "tier2: put: %u tokens (1..%u), a salt of %zu bytes (<= %u), %u blobs "
		             "(1..%u), chunks of %u bytes (1..%u)",
		             n_tokens, TIER2_MAX_TOKENS, salt_len, TIER2_MAX_SALT, n_blobs,
		             TIER2_MAX_LAYERS, cs, TIER2_CHUNK_MAX);
		return TIER2_INVALID;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < n_blobs; i++) {
		if (blobs[i].size == 0 || blobs[i].size > TIER2_MAX_ENTRY_BYTES - total) {
			tier2_io_err(
			        err, errsz,
			        "tier2: put: blob %u of %zu bytes (empty, or the entry passes %llu "
			        "bytes)",
			        i, blobs[i].size, (unsigned long long)TIER2_MAX_ENTRY_BYTES);
			return TIER2_INVALID;
		}
		total += blobs[i].size;
	}
	if (tier2_chunk_count(total, cs) > TIER2_MAX_CHUNKS) {
		tier2_io_err(err, errsz, "tier2: put: %llu bytes in chunks of %u make more than %u",
		             (unsigned long long)total, cs, TIER2_MAX_CHUNKS);
		return TIER2_INVALID;
	}
	return TIER2_OK;
}

enum tier2_status tier2_put(struct cluster_router *r, const char *ns, const uint8_t fingerprint[32],
                            const void *salt, size_t salt_len, const uint32_t *tokens,
                            uint32_t n_tokens, const struct tier2_blob *blobs, uint32_t n_blobs,
                            const struct tier2_put_options *opt, struct tier2_stats *stats,
                            char *err, size_t errsz)
{
	struct tier2_put_options o = opt ? *opt : (struct tier2_put_options){0};
	uint32_t cs = o.chunk_size ? o.chunk_size : TIER2_CHUNK_MAX;
	uint32_t window = o.max_in_flight ? o.max_in_flight : DEFAULT_IN_FLIGHT;
	enum tier2_status st = check_args(ns, salt_len, n_tokens, blobs, n_blobs, cs, err, errsz);
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
	for (uint32_t i = 0; i < n_blobs; i++)
		total += blobs[i].size;
	uint32_t n_chunks = (uint32_t)tier2_chunk_count(total, cs);
	/* check_args ensures n_blobs >= 1; the analyzer cannot see it */
	struct tier2_layer *layers = calloc(n_blobs ? n_blobs : 1, sizeof(*layers));
	uint64_t *sums = malloc((size_t)n_chunks * sizeof(*sums));
	uint8_t *rec_bytes = NULL;
	size_t rec_len = 0;
	int have_old = 0;
	uint64_t old_gen = 0, gen = new_generation();
	uint32_t old_chunks = 0;
	if (!layers || !sums) {
		tier2_io_err(err, errsz, "tier2: put: out of memory");
		st = TIER2_NOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n_blobs; i++)
		layers[i] = (struct tier2_layer){blobs[i].size,
		                                 checksum_blob(blobs[i].data, blobs[i].size, i)};
	if ((st = old_record(&p, &have_old, &old_gen, &old_chunks)) != TIER2_OK)
		goto out;
	if (have_old && old_gen == gen)
		gen = ~gen; /* one in 2^64: never reuse the generation being replaced */
	if ((st = put_chunks(&p, blobs, n_blobs, cs, n_chunks, window, gen, sums)) != TIER2_OK)
		goto out;
	struct tier2_record rec = {.generation = gen,
	                           .salt_len = (uint32_t)salt_len,
	                           .salt = salt,
	                           .n_tokens = n_tokens,
	                           .tokens = tokens,
	                           .n_layers = n_blobs,
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
	if ((st = run(&p, &cmd, 1, "writing the record", 0)) != TIER2_OK)
		goto out;
	if ((st = put_index(&p, fingerprint, salt, salt_len, tokens, n_tokens)) != TIER2_OK)
		goto out;
	if (have_old)
		del_old(&p, old_gen, old_chunks);
out:
	if (stats) {
		stats->puts += st == TIER2_OK;
		stats->put_failures += st != TIER2_OK;
	}
	free(rec_bytes);
	free(sums);
	free(layers);
	return st;
}
