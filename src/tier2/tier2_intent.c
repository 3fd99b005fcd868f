/* tier2_intent: a put's intent, k3:NS:i:KEY:GEN (tier2.h, "Intent"), and
 * tier2_undo, which takes back what a put stopped part-way had written. */
#include <stdlib.h>
#include <string.h>

#include "tier2/tier2_io.h"

#define INTENT_PAGE 1024u /* elements read per LRANGE */

static const unsigned char head_magic[4] = {'K', '3', 'T', 'I'};
static const unsigned char old_magic[4] = {'K', '3', 'T', 'O'};

void tier2_intent_head_encode(unsigned char out[TIER2_INTENT_HEAD_LEN], uint32_t chunk_size,
                              uint32_t n_chunks)
{
	memcpy(out, head_magic, sizeof(head_magic));
	tier2_put_le32(out + 4, chunk_size);
	tier2_put_le32(out + 8, n_chunks);
}

/* An element of `want` bytes starting with magic whose chunk size and
 * count are at `at` (the header's and the replaced generation's): 0 with
 * them, or -1. */
static int chunks_decode(const unsigned char *p, size_t len, size_t want,
                         const unsigned char magic[4], size_t at, uint32_t *chunk_size,
                         uint32_t *n_chunks)
{
	if (!p || len != want || memcmp(p, magic, 4) != 0)
		return -1;
	uint32_t cs = tier2_get_le32(p + at), n = tier2_get_le32(p + at + 4);
	if (cs == 0 || cs > TIER2_CHUNK_MAX || n > TIER2_MAX_CHUNKS)
		return -1;
	*chunk_size = cs;
	*n_chunks = n;
	return 0;
}

int tier2_intent_head_decode(const void *b, size_t len, uint32_t *chunk_size, uint32_t *n_chunks)
{
	return chunks_decode(b, len, TIER2_INTENT_HEAD_LEN, head_magic, 4, chunk_size, n_chunks);
}

void tier2_intent_part_encode(unsigned char out[TIER2_INTENT_PART_LEN],
                              const struct tier2_intent_part *ref)
{
	memcpy(out, ref->node, 16);
	tier2_put_le32(out + 16, ref->layer);
	tier2_put_le32(out + 20, ref->part);
	tier2_put_le64(out + 24, ref->xxh3);
	tier2_put_le64(out + 32, ref->size);
}

int tier2_intent_part_decode(const void *b, size_t len, struct tier2_intent_part *ref)
{
	const unsigned char *p = b;
	if (!p || len != TIER2_INTENT_PART_LEN)
		return -1;
	memset(ref, 0, sizeof(*ref));
	memcpy(ref->node, p, 16);
	ref->layer = tier2_get_le32(p + 16);
	ref->part = tier2_get_le32(p + 20);
	ref->xxh3 = tier2_get_le64(p + 24);
	ref->size = tier2_get_le64(p + 32);
	if (ref->layer >= TIER2_MAX_LAYERS || ref->part > 1 || ref->size == 0 ||
	    ref->size > TIER2_PART_MAX)
		return -1;
	return 0;
}

void tier2_intent_old_encode(unsigned char out[TIER2_INTENT_OLD_LEN], uint64_t old_gen,
                             uint32_t old_chunk_size, uint32_t old_n_chunks)
{
	memcpy(out, old_magic, sizeof(old_magic));
	tier2_put_le64(out + 4, old_gen);
	tier2_put_le32(out + 12, old_chunk_size);
	tier2_put_le32(out + 16, old_n_chunks);
}

int tier2_intent_old_decode(const void *b, size_t len, uint64_t *old_gen, uint32_t *old_chunk_size,
                            uint32_t *old_n_chunks)
{
	const unsigned char *p = b;
	if (chunks_decode(p, len, TIER2_INTENT_OLD_LEN, old_magic, 12, old_chunk_size,
	                  old_n_chunks) != 0)
		return -1;
	*old_gen = tier2_get_le64(p + 4);
	return 0;
}

/* Runs one command on the intent's key, whose reply must be an integer. */
static enum tier2_status intent_int(struct cluster_router *r, const char *name, size_t nl, int argc,
                                    const char **argv, size_t *lens, const char *what, char *err,
                                    size_t errsz)
{
	argv[1] = name;
	lens[1] = nl;
	struct cluster_cmd cmd = {name, nl, argc, argv, lens, NULL, 0};
	enum tier2_status st = tier2_io_pipeline(r, &cmd, 1, what, err, errsz);
	if (st == TIER2_OK)
		st = tier2_io_want_int(cmd.reply, argv[0], name, err, errsz);
	tier2_io_free_replies(&cmd, 1);
	return st;
}

enum tier2_status tier2_intent_begin(struct cluster_router *r, const char *ns,
                                     const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                                     uint32_t chunk_size, uint32_t n_chunks, const char *ttl,
                                     size_t ttl_len, char *err, size_t errsz)
{
	char name[TIER2_NAME_MAX];
	size_t nl = tier2_name_intent(name, ns, key, gen);
	unsigned char head[TIER2_INTENT_HEAD_LEN];
	tier2_intent_head_encode(head, chunk_size, n_chunks);
	const char *argv[3] = {"RPUSH", NULL, (const char *)head};
	size_t lens[3] = {5, 0, sizeof(head)};
	enum tier2_status st =
	        intent_int(r, name, nl, 3, argv, lens, "writing the put's intent", err, errsz);
	if (st == TIER2_OK && ttl_len) {
		const char *ev[3] = {"EXPIRE", NULL, ttl};
		size_t el[3] = {6, 0, ttl_len};
		st = intent_int(r, name, nl, 3, ev, el, "writing the put's intent", err, errsz);
	}
	return st;
}

enum tier2_status tier2_intent_parts(struct cluster_router *r, const char *ns,
                                     const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                                     const struct tier2_part_ref *const *refs, size_t n, char *err,
                                     size_t errsz)
{
	if (n == 0)
		return TIER2_OK;
	char name[TIER2_NAME_MAX];
	size_t nl = tier2_name_intent(name, ns, key, gen);
	const char **argv = calloc(n + 2, sizeof(*argv));
	size_t *lens = calloc(n + 2, sizeof(*lens));
	unsigned char *el = malloc(n * TIER2_INTENT_PART_LEN);
	if (!argv || !lens || !el) {
		free(argv);
		free(lens);
		free(el);
		tier2_io_err(err, errsz, "tier2: put: out of memory for its intent");
		return TIER2_NOMEM;
	}
	argv[0] = "RPUSH";
	lens[0] = 5;
	for (size_t i = 0; i < n; i++) {
		struct tier2_intent_part ip = {.layer = refs[i]->layer,
		                               .part = refs[i]->part,
		                               .xxh3 = refs[i]->xxh3,
		                               .size = refs[i]->size};
		memcpy(ip.node, refs[i]->node, sizeof(ip.node));
		tier2_intent_part_encode(el + i * TIER2_INTENT_PART_LEN, &ip);
		argv[i + 2] = (const char *)el + i * TIER2_INTENT_PART_LEN;
		lens[i + 2] = TIER2_INTENT_PART_LEN;
	}
	enum tier2_status st = intent_int(r, name, nl, (int)(n + 2), argv, lens,
	                                  "writing the put's intent", err, errsz);
	free(el);
	free(lens);
	free(argv);
	return st;
}

enum tier2_status tier2_intent_old(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t gen, uint64_t old_gen,
                                   uint32_t old_chunk_size, uint32_t old_n_chunks, char *err,
                                   size_t errsz)
{
	char name[TIER2_NAME_MAX];
	size_t nl = tier2_name_intent(name, ns, key, gen);
	unsigned char el[TIER2_INTENT_OLD_LEN];
	tier2_intent_old_encode(el, old_gen, old_chunk_size, old_n_chunks);
	const char *argv[3] = {"RPUSH", NULL, (const char *)el};
	size_t lens[3] = {5, 0, sizeof(el)};
	return intent_int(r, name, nl, 3, argv, lens, "writing the put's intent", err, errsz);
}

enum tier2_status tier2_intent_end(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t gen, char *err,
                                   size_t errsz)
{
	char name[TIER2_NAME_MAX];
	size_t nl = tier2_name_intent(name, ns, key, gen);
	const char *argv[2] = {"DEL", NULL};
	size_t lens[2] = {3, 0};
	return intent_int(r, name, nl, 2, argv, lens, "deleting the put's intent", err, errsz);
}

int tier2_intent_parse(const redisReply *rep, int first, struct tier2_intent_info *info,
                       struct tier2_intent_part *out, size_t cap, size_t *n_out, size_t *n_elems,
                       char *err, size_t errsz)
{
	*n_out = 0;
	*n_elems = 0;
	if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements > cap ||
	    (rep->elements && !rep->element)) {
		tier2_io_err(err, errsz, "tier2: intent: the reply is not a list of at most %zu",
		             cap);
		return -1;
	}
	size_t n = 0;
	for (size_t i = 0; i < rep->elements; i++) {
		const redisReply *e = rep->element[i];
		if (!e || e->type != REDIS_REPLY_STRING || (!e->str && e->len))
			continue; /* an element of another form names nothing to take back */
		uint64_t og;
		uint32_t oc, on;
		if (first && i == 0 &&
		    tier2_intent_head_decode(e->str, e->len, &info->chunk_size, &info->n_chunks) ==
		            0)
			info->have_head = 1;
		else if (tier2_intent_old_decode(e->str, e->len, &og, &oc, &on) == 0) {
			info->have_old = 1;
			info->old_gen = og;
			info->old_chunk_size = oc;
			info->old_n_chunks = on;
		} else if (tier2_intent_part_decode(e->str, e->len, &out[n]) == 0)
			n++;
	}
	*n_out = n;
	*n_elems = rep->elements;
	return 0;
}

/* Reads the intent a page at a time: what it says to *info (*have 0 when
 * there is no intent), and unreferences every part it names for member. */
static enum tier2_status undo_parts(struct cluster_router *r, const char *ns, const char *name,
                                    size_t nl, const unsigned char *member, int *have,
                                    struct tier2_intent_info *info, uint64_t *freed, char *err,
                                    size_t errsz)
{
	*have = 0;
	memset(info, 0, sizeof(*info));
	struct tier2_intent_part *got = calloc(INTENT_PAGE, sizeof(*got));
	struct tier2_part_ref *refs = calloc(INTENT_PAGE, sizeof(*refs));
	enum tier2_status st = TIER2_OK;
	if (!got || !refs) {
		tier2_io_err(err, errsz, "tier2: undo: out of memory");
		st = TIER2_NOMEM;
	}
	for (uint64_t start = 0; st == TIER2_OK && start <= TIER2_MAX_PARTS; start += INTENT_PAGE) {
		char from[24], to[24];
		int fl = snprintf(from, sizeof(from), "%llu", (unsigned long long)start);
		int tl = snprintf(to, sizeof(to), "%llu",
		                  (unsigned long long)(start + INTENT_PAGE - 1));
		const char *argv[4] = {"LRANGE", name, from, to};
		size_t lens[4] = {6, nl, (size_t)fl, (size_t)tl};
		struct cluster_cmd cmd = {name, nl, 4, argv, lens, NULL, 0};
		if ((st = tier2_io_pipeline(r, &cmd, 1, "undo: reading the intent", err, errsz)) !=
		    TIER2_OK)
			break;
		const redisReply *rep = cmd.reply;
		size_t n = 0, elems = 0;
		char msg[200];
		if (rep->type == REDIS_REPLY_ERROR) {
			tier2_io_err(err, errsz, "tier2: undo: LRANGE %s: %.*s", name,
			             (int)(rep->len > 200 ? 200 : rep->len),
			             rep->str ? rep->str : "");
			st = TIER2_NODE_ERROR;
		} else if (tier2_intent_parse(rep, start == 0, info, got, INTENT_PAGE, &n, &elems,
		                              msg, sizeof(msg)) != 0) {
			tier2_io_err(err, errsz, "%s (%s)", msg, name);
			st = TIER2_NODE_ERROR; /* not a list: another's key, not to delete */
		} else if (elems) {
			*have = 1;
		}
		tier2_io_free_replies(&cmd, 1);
		for (size_t i = 0; i < n; i++) {
			refs[i] = (struct tier2_part_ref){.layer = got[i].layer,
			                                  .part = got[i].part,
			                                  .xxh3 = got[i].xxh3,
			                                  .size = got[i].size};
			memcpy(refs[i].node, got[i].node, sizeof(refs[i].node));
		}
		if (st == TIER2_OK)
			st = tier2_parts_unref(r, ns, member, refs, n, freed, err, errsz);
		if (elems < INTENT_PAGE)
			break;
	}
	free(refs);
	free(got);
	return st;
}

enum tier2_status tier2_undo(struct cluster_router *r, const char *ns,
                             const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                             uint64_t *bytes_freed, char *err, size_t errsz)
{
	uint64_t freed = 0;
	if (bytes_freed)
		*bytes_freed = 0;
	if (tier2_ns_check(ns, err, errsz) != 0)
		return TIER2_INVALID;
	char name[TIER2_NAME_MAX];
	size_t nl = tier2_name_intent(name, ns, key, generation);
	unsigned char member[TIER2_MEMBER_LEN];
	tier2_member(member, key, generation);
	int have = 0, ours = 0;
	struct tier2_intent_info info;
	/* its references first: from the intent (the record, when there, names
	 * the same parts, and tier2_delete unreferences them again) */
	enum tier2_status st =
	        undo_parts(r, ns, name, nl, member, &have, &info, &freed, err, errsz);
	if (st == TIER2_OK)
		st = tier2_record_has(r, ns, key, generation, &ours, err, errsz);
	/* its record in place: the generation it replaced has no record left,
	 * so its chunks are this put's to delete, before the record that says so */
	if (st == TIER2_OK && ours && info.have_old && info.old_gen != generation)
		st = tier2_chunks_del(r, ns, key, info.old_gen, info.old_n_chunks,
		                      info.old_chunk_size, UINT64_MAX, &freed, NULL, err, errsz);
	if (st == TIER2_OK && ours) {
		st = tier2_delete_gen(r, ns, key, generation, 1, &freed, err, errsz);
		if (st == TIER2_MISSING || st == TIER2_DAMAGED)
			st = TIER2_OK; /* replaced meanwhile: the other put's */
	}
	if (st == TIER2_OK && info.have_head)
		st = tier2_chunks_del(r, ns, key, generation, info.n_chunks, info.chunk_size,
		                      UINT64_MAX, &freed, NULL, err, errsz);
	if (st == TIER2_OK && have)
		st = tier2_intent_end(r, ns, key, generation, err, errsz);
	if (st == TIER2_OK && have && !info.have_head) {
		tier2_io_err(
		        err, errsz,
		        "tier2: undo: %s had no header (evicted, then written again): its parts "
		        "were unreferenced, its chunks are left to expiry or eviction",
		        name);
		st = TIER2_DAMAGED;
	}
	if (bytes_freed)
		*bytes_freed = freed;
	return st;
}
