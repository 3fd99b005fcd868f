/* tier2_parts: block parts of version-2 entries, shared by put, get and
 * delete (tier2_io.h, tier2.h "Block parts"). */
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "tier2/tier2_io.h"

#define UNREFS_PER_TRIP 1024u

/* The expiry of both keys: none when the put has none (another referrer may
 * have none either), else the longer of theirs and ttl; the refs key follows
 * the part's. */
#define TTL_LUA                                                                                    \
	"local t=tonumber(ARGV[2]) "                                                               \
	"if t==0 then redis.call('PERSIST',KEYS[1]) else "                                         \
	"local c=redis.call('TTL',KEYS[1]) "                                                       \
	"if c>=0 and c<t then redis.call('EXPIRE',KEYS[1],t) end end "                             \
	"local pt=redis.call('PTTL',KEYS[1]) "                                                     \
	"if pt>0 then redis.call('PEXPIRE',KEYS[2],pt) else redis.call('PERSIST',KEYS[2]) end "

const char tier2_script_ref[] =
        "local made=0 "
        "if redis.call('EXISTS',KEYS[1])==0 then "
        "if ARGV[4]~='1' then return 0 end "
        "if tonumber(ARGV[2])>0 then redis.call('SET',KEYS[1],ARGV[3],'EX',ARGV[2]) "
        "else redis.call('SET',KEYS[1],ARGV[3]) end "
        "made=1 end "
        "redis.call('SADD',KEYS[2],ARGV[1]) " TTL_LUA "return 1+made";

const char tier2_script_unref[] = "redis.call('SREM',KEYS[2],ARGV[1]) "
                                  "if redis.call('SCARD',KEYS[2])>0 then return 0 end "
                                  "local had=redis.call('DEL',KEYS[1]) "
                                  "redis.call('DEL',KEYS[2]) "
                                  "return 1+had";

void tier2_member(unsigned char out[TIER2_MEMBER_LEN], const uint8_t key[TIER2_KEY_LEN],
                  uint64_t gen)
{
	memcpy(out, key, TIER2_KEY_LEN);
	tier2_put_le64(out + TIER2_KEY_LEN, gen);
}

enum tier2_status tier2_parts_of(const struct tier2_record *rec, struct tier2_part_ref **out,
                                 size_t *n, char *err, size_t errsz)
{
	*out = NULL;
	*n = 0;
	if (rec->version != 2 || rec->n_split == 0)
		return TIER2_OK;
	size_t total = 0;
	for (uint32_t i = 0; i < rec->n_split; i++)
		total += 2u * (size_t)(rec->split[i].seq_len / rec->row_block);
	if (total == 0)
		return TIER2_OK;
	uint32_t depth = rec->n_tokens / PREFIX_BLOCK;
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(depth + 1) * PREFIX_NODE_LEN);
	struct tier2_part_ref *refs = calloc(total, sizeof(*refs));
	if (!h || !refs) {
		free(h);
		free(refs);
		tier2_io_err(err, errsz, "tier2: out of memory for %zu parts", total);
		return TIER2_NOMEM;
	}
	prefix_block_hashes(rec->fingerprint, rec->salt, rec->salt_len, rec->tokens, rec->n_tokens,
	                    h);
	size_t k = 0;
	for (uint32_t i = 0; i < rec->n_split; i++) {
		const struct tier2_split *sp = &rec->split[i];
		uint32_t nb = sp->seq_len / rec->row_block;
		uint64_t kbytes = 4u * (uint64_t)sp->seq_len * sp->k_row;
		for (uint32_t part = 0; part < 2; part++)
			for (uint32_t b = 0; b < nb; b++) {
				/* the decoder keeps seq_len <= n_tokens: the node exists */
				struct tier2_part_ref *ref = &refs[k + 2u * (size_t)b + part];
				uint64_t size = tier2_part_size(sp, rec->row_block, (int)part);
				memcpy(ref->node,
				       h[(size_t)(b + 1u) * (rec->row_block / PREFIX_BLOCK)],
				       PREFIX_NODE_LEN);
				ref->layer = sp->layer;
				ref->part = part;
				ref->xxh3 = rec->part_xxh3[k + 2u * (size_t)b + part];
				ref->size = size;
				ref->off = part ? TIER2_MLA_HEAD + kbytes + 4u + (uint64_t)b * size
				                : TIER2_MLA_HEAD + (uint64_t)b * size;
			}
		k += 2u * (size_t)nb;
	}
	free(h);
	*out = refs;
	*n = total;
	return TIER2_OK;
}

/* EVAL script 2 part refs member: its buffers. */
struct unref_cmd {
	char part[TIER2_NAME_MAX];
	char refs[TIER2_NAME_MAX];
	const char *argv[6];
	size_t len[6];
};

enum tier2_status tier2_parts_unref(struct cluster_router *r, const char *ns,
                                    const unsigned char member[TIER2_MEMBER_LEN],
                                    const struct tier2_part_ref *refs, size_t n, uint64_t *freed,
                                    char *err, size_t errsz)
{
	if (n == 0)
		return TIER2_OK;
	size_t win = n < UNREFS_PER_TRIP ? n : UNREFS_PER_TRIP;
	struct unref_cmd *cb = calloc(win, sizeof(*cb));
	struct cluster_cmd *cmds = calloc(win, sizeof(*cmds));
	enum tier2_status first_bad = TIER2_OK;
	if (!cb || !cmds) {
		free(cb);
		free(cmds);
		tier2_io_err(err, errsz, "tier2: out of memory");
		return TIER2_NOMEM;
	}
	for (size_t at = 0; at < n; at += win) {
		size_t k = n - at < win ? n - at : win;
		for (size_t j = 0; j < k; j++) {
			const struct tier2_part_ref *ref = &refs[at + j];
			struct unref_cmd *c = &cb[j];
			size_t pl = tier2_name_part(c->part, ns, ref->node, ref->layer,
			                            (int)ref->part, ref->xxh3);
			size_t ql = tier2_name_refs(c->refs, ns, ref->node, ref->layer,
			                            (int)ref->part, ref->xxh3);
			c->argv[0] = "EVAL";
			c->len[0] = 4;
			c->argv[1] = tier2_script_unref;
			c->len[1] = strlen(tier2_script_unref);
			c->argv[2] = "2";
			c->len[2] = 1;
			c->argv[3] = c->part;
			c->len[3] = pl;
			c->argv[4] = c->refs;
			c->len[4] = ql;
			c->argv[5] = (const char *)member;
			c->len[5] = TIER2_MEMBER_LEN;
			cmds[j] = (struct cluster_cmd){c->part, pl, 6, c->argv, c->len, NULL, 0};
		}
		char msg[512] = "";
		enum tier2_status st =
		        tier2_io_pipeline(r, cmds, k, "unreferencing parts", msg, sizeof(msg));
		for (size_t j = 0; j < k; j++) {
			const redisReply *rep = cmds[j].reply;
			if (!rep)
				continue;
			enum tier2_status one =
			        tier2_io_want_int(rep, "EVAL unref", cb[j].part, msg, sizeof(msg));
			if (one == TIER2_OK && rep->integer == 2 && freed)
				*freed += refs[at + j].size;
			if (one != TIER2_OK && st == TIER2_OK)
				st = one;
		}
		tier2_io_free_replies(cmds, k);
		if (st != TIER2_OK && first_bad == TIER2_OK) {
			first_bad = st;
			tier2_io_err(err, errsz, "%s", msg);
		}
	}
	free(cmds);
	free(cb);
	return first_bad;
}
