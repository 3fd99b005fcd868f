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

/* One command's buffers: its key's name, up to 6 arguments. */
struct cmdbuf {
	char name[TIER2_NAME_MAX];
	const char *argv[7];
	size_t len[7];
};

/* An index node's field for a put with an expiry (ARGV[3] seconds): the
 * node's expiry becomes the longer of its own and the put's, or the put's
 * when this put made the node; never shorter, as the node is shared by
 * every entry whose path crosses it (as a block part's, TTL_LUA). */
static const char node_script[] = "local new=redis.call('EXISTS',KEYS[1])==0 "
                                  "redis.call('HSET',KEYS[1],ARGV[1],ARGV[2]) "
                                  "local t=tonumber(ARGV[3]) "
                                  "local c=redis.call('TTL',KEYS[1]) "
                                  "if new or (c>=0 and c<t) then "
                                  "redis.call('EXPIRE',KEYS[1],t) end "
                                  "return 1";

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
	int absent; /* the key has no record at all (not one that fails to decode) */
	int have;   /* it decodes */
	int same;   /* and is this entry's: model, salt and tokens */
	uint64_t gen;
	uint32_t chunk_size, n_chunks;
	uint64_t bytes;               /* the sum of its layer sizes */
	struct tier2_part_ref *parts; /* its parts (version 2), malloc'd */
	size_t n_parts;
};

uint64_t tier2_generation_new(void)
{
	uint64_t g = 0;
	if (getrandom(&g, sizeof(g), 0) != (ssize_t)sizeof(g)) {
		/* no entropy source: the time, the pid and the address space, hashed */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t seed[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
		                    (uint64_t)(uintptr_t)&g};
		g = XXH3_64bits(seed, sizeof(seed));
	}
	return g ? g : 1; /* 0 means "choose one" to a put */
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
	*cmd = (struct cluster_cmd){c->name, name_len, argc, c->argv, c->len, NULL, 0};
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
 * chunks are left to expiry or eviction). TIER2_NOMEM when memory ran out
 * to decode it: what is there is then unknown, and nothing may be written
 * over it. */
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
		int drc = tier2_record_decode(rep->str, rep->len, &rec, NULL, 0);
		if (drc == -2) {
			tier2_io_err(p->err, p->errsz,
			             "tier2: put: out of memory reading the record");
			st = TIER2_NOMEM;
		} else if (drc == 0) {
			o->have = 1;
			o->gen = rec.generation;
			o->chunk_size = rec.chunk_size;
			o->n_chunks = rec.n_chunks;
			for (uint32_t i = 0; i < rec.n_layers; i++)
				o->bytes += rec.layers[i].size; /* bounded by the decoder */
			o->same = rec.n_tokens == n_tokens &&
			          memcmp(rec.fingerprint, fingerprint, 32) == 0 &&
			          rec.salt_len == salt_len &&
			          (!salt_len || memcmp(rec.salt, salt, salt_len) == 0) &&
			          memcmp(rec.tokens, tokens, (size_t)n_tokens * 4u) == 0;
			/* its parts, to unreference once replaced (only a record of this
			 * key: another's names another entry's parts) */
			if (o->same)
				st = tier2_parts_of(&rec, &o->parts, &o->n_parts, p->err, p->errsz);
			tier2_record_free(&rec);
		}
	} else if (rep->type == REDIS_REPLY_NIL) {
		o->absent = 1;
	} else {
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

/* ---- the stream: chunks and parts as the source's bytes pass ---- */

#define PART_BYTES_IN_FLIGHT (64u << 20) /* part bytes buffered at most (one part more) */

/* One part waiting to be written, with its EVAL's buffers. */
struct pend {
	unsigned char *buf;
	size_t cap;
	size_t ref; /* index in the stream's refs */
	char part[TIER2_NAME_MAX];
	char refs[TIER2_NAME_MAX];
	const char *argv[9];
	size_t len[9];
};

struct stream {
	struct put *p;
	const struct tier2_source *src;
	struct verify *v; /* NULL: the caller's sums are the put's own */
	uint32_t cs, window;
	uint64_t total;      /* the layers' bytes */
	uint64_t read_at;    /* bytes read from src */
	uint32_t max_chunks; /* of the whole layers: the stream is not longer */
	uint64_t *sums;
	/* chunks: the window's buffers, the one being filled is in_win */
	struct cmdbuf *cb;
	struct cluster_cmd *cmds;
	unsigned char *buf;
	size_t bufsz;
	uint32_t slots, in_win, n_chunks;
	size_t fill;
	uint64_t stream_bytes;
	/* parts */
	const uint8_t *fingerprint;
	const void *salt;
	size_t salt_len;
	const uint32_t *tokens;
	uint32_t n_tokens;
	uint8_t (*h)[PREFIX_NODE_LEN];
	uint32_t row_block;
	unsigned char member[TIER2_MEMBER_LEN];
	struct tier2_split *split;
	uint32_t n_split;
	struct tier2_part_ref *refs; /* the record's order: per split, per block, k then v */
	size_t n_refs, cap_refs;
	struct pend *pend;
	uint32_t n_pend;
	size_t pend_bytes;
	struct cluster_cmd *pcmds;
	uint32_t *idx, *absent; /* window entries each */
	const struct tier2_part_ref **named;
	int64_t *codes;
	uint64_t new_part_bytes, shared_bytes;
};

static enum tier2_status src_fail(struct stream *s, const char *msg)
{
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, s->p->ns, s->p->key);
	tier2_io_err(s->p->err, s->p->errsz,
	             "tier2: put %s: the source failed at byte %llu of %llu: %s", name,
	             (unsigned long long)s->read_at, (unsigned long long)s->total,
	             msg[0] ? msg : "(no message)");
	return TIER2_DAMAGED;
}

/* Reads len bytes of the source to dst (in calls of at most chunk_size
 * bytes), each checked against its layer's checksum. */
static enum tier2_status src_read(struct stream *s, unsigned char *dst, uint64_t len)
{
	while (len > 0) {
		size_t take = len < s->cs ? (size_t)len : s->cs;
		char msg[256] = "";
		if (s->read_at + take > s->total)
			return src_fail(s, "past the layers' end");
		if (s->src->read(s->src->ctx, dst, take, msg, sizeof(msg)) != 0)
			return src_fail(s, msg);
		enum tier2_status st = s->v ? verify_feed(s->p, s->v, dst, take) : TIER2_OK;
		if (st != TIER2_OK)
			return st;
		s->read_at += take;
		dst += take;
		len -= take;
	}
	return TIER2_OK;
}

/* Sends the window's finished chunks. */
static enum tier2_status flush_chunks(struct stream *s)
{
	uint32_t n = s->in_win;
	if (n == 0)
		return TIER2_OK;
	s->p->sent = s->n_chunks;
	s->in_win = 0;
	return run(s->p, s->cmds, n, "writing chunks", 0);
}

/* The chunk being filled is done: its sum and its SET. */
static enum tier2_status end_chunk(struct stream *s)
{
	if (s->n_chunks >= s->max_chunks) { /* cannot be: the stream is not longer */
		tier2_io_err(s->p->err, s->p->errsz, "tier2: put: more chunks than %u",
		             s->max_chunks);
		return TIER2_INVALID;
	}
	struct cmdbuf *c = &s->cb[s->in_win];
	unsigned char *val = s->buf + (size_t)s->in_win * s->bufsz;
	s->sums[s->n_chunks] = XXH3_64bits(val, s->fill);
	c->argv[0] = "SET";
	c->len[0] = 3;
	c->argv[2] = (const char *)val;
	c->len[2] = s->fill;
	cmd_of(&s->cmds[s->in_win], c,
	       tier2_name_chunk(c->name, s->p->ns, s->p->key, s->p->gen, s->n_chunks),
	       with_ttl(s->p, c, 3));
	if (s->p->stats)
		s->p->stats->bytes_out += s->fill;
	s->stream_bytes += s->fill;
	s->n_chunks++;
	s->in_win++;
	s->fill = 0;
	return s->in_win == s->slots ? flush_chunks(s) : TIER2_OK;
}

/* Puts len bytes in the stream: from bytes, or read from the source when
 * bytes is NULL. */
static enum tier2_status stream_add(struct stream *s, const unsigned char *bytes, uint64_t len)
{
	enum tier2_status st = TIER2_OK;
	while (len > 0 && st == TIER2_OK) {
		unsigned char *at = s->buf + (size_t)s->in_win * s->bufsz + s->fill;
		size_t take = s->cs - s->fill < len ? s->cs - s->fill : (size_t)len;
		if (bytes) {
			memcpy(at, bytes, take);
			bytes += take;
		} else {
			st = src_read(s, at, take);
		}
		s->fill += take;
		len -= take;
		if (st == TIER2_OK && s->fill == s->cs)
			st = end_chunk(s);
	}
	return st;
}

static void eval_args(struct pend *e, size_t pl, size_t ql, const struct put *p,
                      const unsigned char *member, const void *bytes, size_t len, const char *mode)
{
	e->argv[0] = "EVAL";
	e->len[0] = 4;
	e->argv[1] = tier2_script_ref;
	e->len[1] = strlen(tier2_script_ref);
	e->argv[2] = "2";
	e->len[2] = 1;
	e->argv[3] = e->part;
	e->len[3] = pl;
	e->argv[4] = e->refs;
	e->len[4] = ql;
	e->argv[5] = (const char *)member;
	e->len[5] = TIER2_MEMBER_LEN;
	e->argv[6] = p->ttl_len ? p->ttl : "0";
	e->len[6] = p->ttl_len ? p->ttl_len : 1;
	e->argv[7] = bytes ? (const char *)bytes : "";
	e->len[7] = bytes ? len : 0;
	e->argv[8] = mode;
	e->len[8] = 1;
}

/* Runs the REF EVALs of the pending parts given by idx[0..n); the reply of
 * each to codes (0 absent, 1 referenced, 2 created). */
static enum tier2_status run_refs(struct stream *s, const uint32_t *idx, uint32_t n,
                                  const char *mode, int64_t *codes)
{
	for (uint32_t j = 0; j < n; j++) {
		struct pend *e = &s->pend[idx[j]];
		const struct tier2_part_ref *ref = &s->refs[e->ref];
		size_t pl = tier2_name_part(e->part, s->p->ns, ref->node, ref->layer,
		                            (int)ref->part, ref->xxh3);
		size_t ql = tier2_name_refs(e->refs, s->p->ns, ref->node, ref->layer,
		                            (int)ref->part, ref->xxh3);
		int send = mode[0] == '1';
		eval_args(e, pl, ql, s->p, s->member, send ? e->buf : NULL, (size_t)ref->size,
		          mode);
		s->pcmds[j] = (struct cluster_cmd){e->part, pl, 9, e->argv, e->len, NULL, 0};
		if (send && s->p->stats)
			s->p->stats->bytes_out += ref->size;
	}
	enum tier2_status st =
	        tier2_io_pipeline(s->p->r, s->pcmds, n, "writing parts", s->p->err, s->p->errsz);
	for (uint32_t j = 0; j < n && st == TIER2_OK; j++) {
		const redisReply *rep = s->pcmds[j].reply;
		st = tier2_io_want_int(rep, "EVAL ref", s->pcmds[j].key, s->p->err, s->p->errsz);
		if (st == TIER2_OK && (rep->integer < 0 || rep->integer > 2 ||
		                       (mode[0] == '1' && rep->integer == 0))) {
			tier2_io_err(s->p->err, s->p->errsz, "tier2: EVAL ref %s: answered %lld",
			             s->pcmds[j].key, (long long)rep->integer);
			st = TIER2_NODE_ERROR;
		}
		if (st == TIER2_OK)
			codes[j] = rep->integer;
	}
	tier2_io_free_replies(s->pcmds, n);
	return st;
}

/* Writes the pending parts: first a reference to those already there (a
 * small round trip), then the bytes of the others. */
static enum tier2_status flush_parts(struct stream *s)
{
	uint32_t n = s->n_pend;
	if (n == 0)
		return TIER2_OK;
	s->n_pend = 0;
	s->pend_bytes = 0;
	uint32_t *idx = s->idx, *absent = s->absent;
	int64_t *codes = s->codes;
	const struct tier2_part_ref **named = s->named;
	for (uint32_t j = 0; j < n; j++) {
		idx[j] = j;
		named[j] = &s->refs[s->pend[j].ref];
	}
	/* the intent names them before any is referenced, for an undo after a
	 * kill (tier2.h, "Intent") */
	enum tier2_status st = tier2_intent_parts(s->p->r, s->p->ns, s->p->key, s->p->gen, named, n,
	                                          s->p->err, s->p->errsz);
	if (st == TIER2_OK)
		st = run_refs(s, idx, n, "0", codes);
	uint32_t n_absent = 0;
	for (uint32_t j = 0; j < n && st == TIER2_OK; j++) {
		uint64_t size = s->refs[s->pend[j].ref].size;
		if (codes[j] == 0) {
			absent[n_absent++] = j;
			continue;
		}
		s->shared_bytes += size;
		if (s->p->stats) {
			s->p->stats->parts_shared++;
			s->p->stats->part_bytes_saved += size;
		}
	}
	if (st != TIER2_OK || n_absent == 0)
		return st;
	st = run_refs(s, absent, n_absent, "1", codes);
	for (uint32_t j = 0; j < n_absent && st == TIER2_OK; j++) {
		uint64_t size = s->refs[s->pend[absent[j]].ref].size;
		int made = codes[j] == 2;
		if (made)
			s->new_part_bytes += size;
		else
			s->shared_bytes += size; /* another put wrote it meanwhile */
		if (s->p->stats) {
			s->p->stats->parts_new += (uint64_t)made;
			s->p->stats->parts_shared += (uint64_t)!made;
			s->p->stats->part_bytes_saved += made ? 0 : size;
		}
	}
	return st;
}

/* Reads part (0 k, 1 v) of block b of the split layer being read from the
 * source, and queues its write. The part's ref is at index at. */
static enum tier2_status take_part(struct stream *s, size_t at, uint32_t layer, uint32_t b,
                                   uint32_t part, uint64_t size, uint64_t off)
{
	if (s->n_pend == s->window || (s->n_pend && s->pend_bytes + size > PART_BYTES_IN_FLIGHT)) {
		enum tier2_status st = flush_parts(s);
		if (st != TIER2_OK)
			return st;
	}
	struct pend *e = &s->pend[s->n_pend];
	if (e->cap < size) {
		unsigned char *grown = realloc(e->buf, (size_t)size);
		if (!grown) {
			tier2_io_err(s->p->err, s->p->errsz,
			             "tier2: put: out of memory for a part of %llu bytes",
			             (unsigned long long)size);
			return TIER2_NOMEM;
		}
		e->buf = grown;
		e->cap = (size_t)size;
	}
	enum tier2_status st = src_read(s, e->buf, size);
	if (st != TIER2_OK)
		return st;
	struct tier2_part_ref *ref = &s->refs[at];
	memcpy(ref->node, s->h[(size_t)(b + 1u) * (s->row_block / PREFIX_BLOCK)], PREFIX_NODE_LEN);
	ref->layer = layer;
	ref->part = part;
	ref->xxh3 = XXH3_64bits_withSeed(e->buf, (size_t)size, layer);
	ref->size = size;
	ref->off = off;
	e->ref = at;
	s->n_pend++;
	s->pend_bytes += (size_t)size;
	return TIER2_OK;
}

static enum tier2_status mla_damaged(struct stream *s, uint32_t layer, const char *what,
                                     unsigned long long a, unsigned long long b)
{
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, s->p->ns, s->p->key);
	tier2_io_err(s->p->err, s->p->errsz, "tier2: put %s: MLA layer %u: %s (%llu, %llu)", name,
	             layer, what, a, b);
	return TIER2_DAMAGED;
}

/* One MLA layer of the source: header, then its block parts and tail rows
 * (split) or its bytes whole. */
static enum tier2_status put_mla(struct stream *s, uint32_t i, uint64_t size)
{
	unsigned char head[TIER2_MLA_HEAD] = {0}, vc[4] = {0};
	if (size < TIER2_MLA_HEAD + 4u)
		return mla_damaged(s, i, "fewer bytes than a header: size, minimum", size,
		                   TIER2_MLA_HEAD + 4u);
	enum tier2_status st = src_read(s, head, sizeof(head));
	if (st == TIER2_OK)
		st = stream_add(s, head, sizeof(head));
	if (st != TIER2_OK)
		return st;
	uint32_t seq = tier2_get_le32(head + 1), kc = tier2_get_le32(head + 5);
	uint64_t rest = size - TIER2_MLA_HEAD - 4u;
	if (head[0] != 2)
		return mla_damaged(s, i, "the blob's tag is not 2: tag, layer", head[0], i);
	if (4u * (uint64_t)kc > rest || (rest - 4u * (uint64_t)kc) % 4u != 0 ||
	    (rest - 4u * (uint64_t)kc) / 4u > UINT32_MAX)
		return mla_damaged(s, i, "k count does not fit the layer's size: k count, size", kc,
		                   size);
	uint32_t vcount = (uint32_t)((rest - 4u * (uint64_t)kc) / 4u);
	if (seq == 0 ? kc != 0 || vcount != 0 : kc % seq != 0 || vcount % seq != 0)
		return mla_damaged(s, i,
		                   "k or v count is not a multiple of seq_len: k count, seq_len",
		                   kc, seq);
	uint32_t k_row = seq ? kc / seq : 0, v_row = seq ? vcount / seq : 0;
	uint32_t B = s->row_block, nb = seq / B;
	struct tier2_split sp = {i, seq, k_row, v_row};
	int split = nb >= 1 && k_row >= 1 && v_row >= 1 && seq <= s->n_tokens &&
	            tier2_part_size(&sp, B, 0) <= TIER2_PART_MAX &&
	            tier2_part_size(&sp, B, 1) <= TIER2_PART_MAX &&
	            s->n_refs + 2u * (uint64_t)nb <= TIER2_MAX_PARTS;
	if (!split)
		return stream_add(s, NULL, size - TIER2_MLA_HEAD);
	if (s->n_refs + 2u * (size_t)nb > s->cap_refs) {
		size_t cap = s->cap_refs ? s->cap_refs : 256;
		while (cap < s->n_refs + 2u * (size_t)nb)
			cap *= 2;
		struct tier2_part_ref *grown = realloc(s->refs, cap * sizeof(*grown));
		if (!grown) {
			tier2_io_err(s->p->err, s->p->errsz, "tier2: put: out of memory");
			return TIER2_NOMEM;
		}
		s->refs = grown;
		s->cap_refs = cap;
	}
	size_t base = s->n_refs;
	/* a ref of size 0 is not taken yet (an undo passes it over) */
	memset(s->refs + base, 0, 2u * (size_t)nb * sizeof(*s->refs));
	s->n_refs = base + 2u * (size_t)nb;
	s->split[s->n_split++] = sp;
	uint64_t kp = tier2_part_size(&sp, B, 0), vp = tier2_part_size(&sp, B, 1);
	uint64_t kbytes = 4u * (uint64_t)kc;
	uint32_t tail = seq - nb * B;
	for (uint32_t b = 0; b < nb && st == TIER2_OK; b++)
		st = take_part(s, base + 2u * (size_t)b, i, b, 0, kp,
		               TIER2_MLA_HEAD + (uint64_t)b * kp);
	if (st == TIER2_OK)
		st = stream_add(s, NULL, 4u * (uint64_t)tail * k_row);
	if (st == TIER2_OK)
		st = src_read(s, vc, sizeof(vc));
	if (st == TIER2_OK && tier2_get_le32(vc) != vcount)
		st = mla_damaged(s, i, "v count does not fit the layer's size: v count, expected",
		                 tier2_get_le32(vc), vcount);
	if (st == TIER2_OK)
		st = stream_add(s, vc, sizeof(vc));
	for (uint32_t b = 0; b < nb && st == TIER2_OK; b++)
		st = take_part(s, base + 2u * (size_t)b + 1u, i, b, 1, vp,
		               TIER2_MLA_HEAD + kbytes + 4u + (uint64_t)b * vp);
	if (st == TIER2_OK)
		st = stream_add(s, NULL, 4u * (uint64_t)tail * v_row);
	return st;
}

/* Reads every layer from the source into chunks (and, with a row block,
 * MLA block parts), writing them window by window. */
static enum tier2_status put_stream(struct stream *s, const struct tier2_layer *layers,
                                    uint32_t n_layers)
{
	uint32_t slots = s->window < s->max_chunks ? s->window : s->max_chunks;
	s->slots = slots;
	s->bufsz = s->total < s->cs ? (size_t)s->total : s->cs;
	s->cb = calloc(slots, sizeof(*s->cb));
	s->cmds = calloc(slots, sizeof(*s->cmds));
	s->buf = malloc((size_t)slots * s->bufsz);
	if (!s->cb || !s->cmds || !s->buf) {
		tier2_io_err(s->p->err, s->p->errsz,
		             "tier2: put: out of memory for %u chunk buffers of %zu bytes", slots,
		             s->bufsz);
		return TIER2_NOMEM;
	}
	if (s->row_block) {
		s->split = calloc(n_layers ? n_layers : 1, sizeof(*s->split));
		s->pend = calloc(s->window, sizeof(*s->pend));
		s->pcmds = calloc(s->window, sizeof(*s->pcmds));
		s->idx = calloc(s->window, sizeof(*s->idx));
		s->absent = calloc(s->window, sizeof(*s->absent));
		s->codes = calloc(s->window, sizeof(*s->codes));
		s->named = calloc(s->window, sizeof(*s->named));
		s->h = malloc((size_t)(s->n_tokens / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
		if (!s->split || !s->pend || !s->pcmds || !s->idx || !s->absent || !s->codes ||
		    !s->named || !s->h) {
			tier2_io_err(s->p->err, s->p->errsz, "tier2: put: out of memory");
			return TIER2_NOMEM;
		}
		prefix_block_hashes(s->fingerprint, s->salt, s->salt_len, s->tokens, s->n_tokens,
		                    s->h);
	}
	enum tier2_status st = TIER2_OK;
	uint64_t whole = 0; /* bytes of whole layers not read yet: read as one run, so
	                     * that the source is read a chunk at a time */
	for (uint32_t i = 0; i < n_layers && st == TIER2_OK; i++) {
		if (!s->row_block || layers[i].tag != 2) {
			whole += layers[i].size;
			continue;
		}
		st = stream_add(s, NULL, whole);
		whole = 0;
		if (st == TIER2_OK)
			st = put_mla(s, i, layers[i].size);
	}
	if (st == TIER2_OK)
		st = stream_add(s, NULL, whole);
	if (st == TIER2_OK)
		st = flush_parts(s);
	if (st == TIER2_OK && s->fill)
		st = end_chunk(s);
	if (st == TIER2_OK)
		st = flush_chunks(s);
	return st;
}

static void stream_free(struct stream *s)
{
	for (uint32_t i = 0; s->pend && i < s->window; i++)
		free(s->pend[i].buf);
	free(s->pend);
	free(s->pcmds);
	free(s->idx);
	free(s->absent);
	free(s->codes);
	free(s->named);
	free(s->split);
	free(s->refs);
	free(s->h);
	free(s->buf);
	free(s->cmds);
	free(s->cb);
}

/* Writes the entry's index nodes: "+" on its path, its field at its node.
 * Without an expiry each node then loses any it had (PERSIST: an entry
 * that never expires must stay findable); with one, node_script. */
static enum tier2_status put_index(struct put *p, const uint8_t *fingerprint, const void *salt,
                                   size_t salt_len, const uint32_t *tokens, uint32_t n)
{
	uint32_t depth = n / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	size_t per = p->ttl_len ? 1 : 2; /* the script, or HSET then PERSIST */
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
			const char *f = d == depth ? (const char *)p->key : "+";
			size_t fl = d == depth ? TIER2_KEY_LEN : 1;
			const char *v = d == depth ? (const char *)field : "";
			size_t vl = d == depth ? sizeof(field) : 0;
			if (p->stats)
				p->stats->bytes_out += fl + vl;
			if (p->ttl_len) {
				const char *argv[7] = {"EVAL", node_script, "1",   c->name,
				                       f,      v,           p->ttl};
				size_t len[7] = {4, strlen(node_script), 1, nl, fl, vl, p->ttl_len};
				memcpy(c->argv, argv, sizeof(argv));
				memcpy(c->len, len, sizeof(len));
				cmds[j] = (struct cluster_cmd){c->name, nl,   7, c->argv,
				                               c->len,  NULL, 0};
				continue;
			}
			c->argv[0] = "HSET";
			c->len[0] = 4;
			c->argv[2] = f;
			c->len[2] = fl;
			c->argv[3] = v;
			c->len[3] = vl;
			cmd_of(&cmds[j * per], c, nl, 4);
			struct cmdbuf *e = &cb[j * per + 1];
			memcpy(e->name, c->name, nl + 1);
			e->argv[0] = "PERSIST";
			e->len[0] = 7;
			cmd_of(&cmds[j * per + 1], e, nl, 2);
		}
		st = run(p, cmds, (size_t)n_cmd * per, "writing the index", 1);
	}
	free(cmds);
	free(cb);
	free(h);
	return st;
}

/* Deletes chunks [0, n_chunks) of generation gen (best effort); the number
 * deleted. *failed (may be NULL) is set when a round trip failed. */
static uint64_t del_chunks(struct put *p, uint64_t gen, uint32_t n_chunks, int *failed)
{
	char ignored[256];
	uint64_t freed = 0, deleted = 0;
	if (tier2_chunks_del(p->r, p->ns, p->key, gen, n_chunks, 1, UINT64_MAX, &freed, &deleted,
	                     ignored, sizeof(ignored)) != TIER2_OK &&
	    failed)
		*failed = 1;
	return deleted;
}

/* Unreferences the old generation's parts once the put replaced it: 0, or
 * -1 when a round trip failed. */
static int unref_old(struct put *p, const struct old *old)
{
	char ignored[512];
	unsigned char member[TIER2_MEMBER_LEN];
	tier2_member(member, p->key, old->gen);
	enum tier2_status st = tier2_parts_unref(p->r, p->ns, member, old->parts, old->n_parts,
	                                         NULL, ignored, sizeof(ignored));
	return st == TIER2_OK ? 0 : -1;
}

/* After a failure: removes what the put wrote (best effort). When its record
 * may be in place, tier2_delete removes it if it is still its own (with its
 * chunks, parts and index field), and then the generation it replaced is an
 * orphan. The parts it referenced are unreferenced again in any case (an
 * unreference is idempotent). 0 when all of it was taken back; -1 when a
 * round trip failed (the intent then stays, for tier2_undo). */
static int undo(struct put *p, int record_sent, const struct old *old, const struct stream *s)
{
	char ignored[512];
	uint64_t freed = 0;
	int failed = 0;
	unsigned char member[TIER2_MEMBER_LEN];
	tier2_member(member, p->key, p->gen);
	for (size_t i = 0; i < s->n_refs;) {
		size_t k = i;
		while (k < s->n_refs && s->refs[k].size) /* a run of refs taken */
			k++;
		if (tier2_parts_unref(p->r, p->ns, member, s->refs + i, k - i, NULL, ignored,
		                      sizeof(ignored)) != TIER2_OK)
			failed = 1;
		for (i = k; i < s->n_refs && !s->refs[i].size;)
			i++;
	}
	if (record_sent) {
		/* its record in place: the generation it replaced is an orphan, to
		 * delete first, while the record (and the intent) say so; then the
		 * record with its chunks and field. A failure keeps both for
		 * tier2_undo, which does the same in the same order. */
		int ours = 0;
		enum tier2_status st = tier2_record_has(p->r, p->ns, p->key, p->gen, &ours, ignored,
		                                        sizeof(ignored));
		if (st != TIER2_OK)
			return -1;
		if (ours) {
			if (old->have) {
				(void)del_chunks(p, old->gen, old->n_chunks, &failed);
				if (unref_old(p, old) != 0)
					failed = 1;
			}
			if (failed)
				return -1;
			st = tier2_delete_gen(p->r, p->ns, p->key, p->gen, 1, &freed, ignored,
			                      sizeof(ignored));
			if (st == TIER2_OK) {
				if (p->stats)
					p->stats->undone_chunks_del += p->sent;
				return 0;
			}
			if (st != TIER2_MISSING && st != TIER2_DAMAGED)
				return -1; /* the record may be there still */
		}
	}
	uint64_t n = del_chunks(p, p->gen, p->sent, &failed);
	if (p->stats)
		p->stats->undone_chunks_del += n;
	return failed ? -1 : 0;
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
	if (st == TIER2_OK && o.row_block &&
	    (o.row_block % PREFIX_BLOCK != 0 || o.row_block > TIER2_ROW_BLOCK_MAX)) {
		tier2_io_err(err, errsz,
		             "tier2: put: row block %u (0, or a multiple of %u up to %u)",
		             o.row_block, PREFIX_BLOCK, TIER2_ROW_BLOCK_MAX);
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
	uint32_t max_chunks = (uint32_t)tier2_chunk_count(total, cs);
	uint64_t *sums = malloc((size_t)max_chunks * sizeof(*sums));
	uint64_t *part_sums = NULL;
	uint8_t *rec_bytes = NULL;
	size_t rec_len = 0;
	struct old old = {0};
	struct verify v = {.layers = layers, .n_layers = n_layers};
	int record_sent = 0, existed = 0, intent = 0, lost = 0;
	uint64_t won_gen = 0; /* lost: the record there, which the result names */
	uint32_t won_chunks = 0;
	p.gen = o.generation ? o.generation : tier2_generation_new();
	struct stream s = {.p = &p,
	                   .src = src,
	                   .v = verify ? &v : NULL,
	                   .cs = cs,
	                   .window = window,
	                   .total = total,
	                   .max_chunks = max_chunks,
	                   .sums = sums,
	                   .fingerprint = fingerprint,
	                   .salt = salt,
	                   .salt_len = salt_len,
	                   .tokens = tokens,
	                   .n_tokens = n_tokens,
	                   .row_block = o.row_block};
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
			*res = (struct tier2_put_result){.generation = old.gen,
			                                 .n_chunks = old.n_chunks,
			                                 .bytes = old.bytes,
			                                 .existed = 1};
		goto out;
	}
	if (old.have && old.gen == p.gen) {
		if (o.generation) {
			tier2_io_err(err, errsz,
			             "tier2: put: generation %016llx is the key's record's already",
			             (unsigned long long)p.gen);
			st = TIER2_INVALID;
			goto out;
		}
		p.gen = ~p.gen; /* one in 2^64: never reuse the generation being replaced */
	}
	tier2_member(s.member, p.key, p.gen);
	intent = 1; /* before it is asked for: one that timed out may be there */
	if ((st = tier2_intent_begin(r, ns, p.key, p.gen, cs, max_chunks, p.ttl, p.ttl_len, err,
	                             errsz)) != TIER2_OK)
		goto out;
	if ((st = put_stream(&s, layers, n_layers)) != TIER2_OK)
		goto out;
	if (s.n_refs) {
		part_sums = malloc(s.n_refs * sizeof(*part_sums));
		if (!part_sums) {
			tier2_io_err(err, errsz, "tier2: put: out of memory");
			st = TIER2_NOMEM;
			goto out;
		}
		for (size_t i = 0; i < s.n_refs; i++)
			part_sums[i] = s.refs[i].xxh3;
	}
	struct tier2_record rec = {.generation = p.gen,
	                           .salt_len = (uint32_t)salt_len,
	                           .salt = salt,
	                           .n_tokens = n_tokens,
	                           .tokens = tokens,
	                           .n_layers = n_layers,
	                           .layers = layers,
	                           .chunk_size = cs,
	                           .n_chunks = s.n_chunks,
	                           .chunk_xxh3 = sums,
	                           .version = o.row_block ? 2 : 1,
	                           .row_block = o.row_block,
	                           .n_split = s.n_split,
	                           .split = s.split,
	                           .part_xxh3 = part_sums};
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
	int argc = with_ttl(&p, &c, 3);
	/* keeping what is there, and nothing was: only if still nothing is. A
	 * put of the same entry that wrote its record since (two hosts copying
	 * one snapshot at once) keeps it, and this one is undone; else the
	 * record it replaced would leave its chunks and references with no
	 * record, ledger or intent naming them. (A record there that does not
	 * decode is replaced, as without keep_existing.) */
	int nx = o.keep_existing && old.absent;
	if (nx) {
		c.argv[argc] = "NX";
		c.len[argc++] = 2;
	}
	cmd_of(&cmd, &c, tier2_name_record(c.name, ns, p.key), argc);
	if (stats)
		stats->bytes_out += rec_len;
	/* the generation it replaces, in the intent: once the record is ours,
	 * its chunks are this put's to delete, even after a kill */
	if (old.have && (st = tier2_intent_old(r, ns, p.key, p.gen, old.gen, old.chunk_size,
	                                       old.n_chunks, err, errsz)) != TIER2_OK)
		goto out;
	record_sent = 1;
	int taken = 0; /* SET NX answered nil: a record is there */
	if ((st = tier2_io_pipeline(r, &cmd, 1, "writing the record", err, errsz)) == TIER2_OK) {
		if (nx && cmd.reply->type == REDIS_REPLY_NIL)
			taken = 1;
		else
			st = tier2_io_want_ok(cmd.reply, "SET", cmd.key, err, errsz);
	}
	tier2_io_free_replies(&cmd, 1);
	if (taken) {
		/* another put's, or this one's: the router sends a command once more
		 * to the master a failover promoted (cluster.h), which may have the
		 * first SET NX already and answer nil to the second. Read it back;
		 * when it cannot be read, the undo below finds out whose the record
		 * is before it deletes one. */
		struct old now;
		st = old_record(&p, fingerprint, salt, salt_len, tokens, n_tokens, &now);
		free(now.parts);
		if (st == TIER2_OK && !(now.have && now.gen == p.gen)) {
			lost = 1; /* not written: another put's record is there */
			won_gen = now.gen;
			won_chunks = now.n_chunks;
		}
	}
	if (lost) {
		record_sent = 0;
		st = TIER2_NODE_ERROR; /* undone below, then said to have existed */
		tier2_io_err(err, errsz,
		             "tier2: put: another put of the entry wrote its record first; "
		             "undoing this one's writes failed");
	}
	if (st != TIER2_OK)
		goto out;
	if ((st = put_index(&p, fingerprint, salt, salt_len, tokens, n_tokens)) != TIER2_OK)
		goto out;
	if (old.have) {
		uint64_t n = del_chunks(&p, old.gen, old.n_chunks, NULL);
		if (stats)
			stats->old_chunks_del += n;
		(void)unref_old(&p, &old);
	}
	/* whole: the intent has nothing left to undo (one left behind is taken
	 * by the generation's delete) */
	{
		char ignored[256];
		(void)tier2_intent_end(r, ns, p.key, p.gen, ignored, sizeof(ignored));
	}
	if (res)
		*res = (struct tier2_put_result){.generation = p.gen,
		                                 .n_chunks = s.n_chunks,
		                                 .bytes = total,
		                                 .new_bytes = s.stream_bytes + s.new_part_bytes +
		                                              rec_len,
		                                 .shared_bytes = s.shared_bytes};
out:
	if (v.cs)
		(void)checksum_end(v.cs);
	if (st != TIER2_OK && intent) {
		/* undone whole: the intent goes too; else it stays for tier2_undo */
		char ignored[256];
		int left = (p.sent || s.n_refs) && undo(&p, record_sent, &old, &s) != 0;
		if (!left &&
		    tier2_intent_end(r, ns, p.key, p.gen, ignored, sizeof(ignored)) != TIER2_OK)
			left = 1;
		if (res)
			res->undo_left = left;
		if (lost && !left) { /* undone whole: the entry is there, as keep_existing asks */
			st = TIER2_OK;
			existed = 1;
			if (res)
				*res = (struct tier2_put_result){.generation = won_gen,
				                                 .n_chunks = won_chunks,
				                                 .bytes = total,
				                                 .existed = 1};
			if (err && errsz)
				err[0] = 0;
		}
	}
	if (stats) {
		stats->puts += st == TIER2_OK && !existed;
		stats->put_existing += existed;
		stats->put_failures += st != TIER2_OK;
	}
	stream_free(&s);
	free(old.parts);
	free(part_sums);
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
	for (uint32_t i = 0; i < n_blobs; i++) {
		layers[i].size = blobs[i].size;
		layers[i].tag = blobs[i].size ? *(const uint8_t *)blobs[i].data : 0;
	}
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
