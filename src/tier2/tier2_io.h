/* tier2_io: what tier2's put, lookup and get share (tier2.c): messages, a
 * pipeline whose failures are classed, and checks of replies. Internal to
 * src/tier2. */
#ifndef K3_TIER2_IO_H
#define K3_TIER2_IO_H

#include <stdarg.h>
#include <stdint.h>

#include "tier2/tier2.h"

/* Little-endian integers in records and index fields. */
static inline void tier2_put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void tier2_put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t tier2_get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t tier2_get_le64(const unsigned char *p)
{
	return (uint64_t)tier2_get_le32(p) | (uint64_t)tier2_get_le32(p + 4) << 32;
}

/* Writes a message to err (err may be NULL). */
void tier2_io_err(char *err, size_t errsz, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* Runs n commands as one cluster_pipeline. TIER2_OK when every command got a
 * reply (error replies are the caller's to check); else TIER2_TIMEOUT when a
 * round trip ran out of time, TIER2_NODE_ERROR otherwise, with "what: " and
 * the router's message in err. The replies that came are left in cmds. */
enum tier2_status tier2_io_pipeline(struct cluster_router *r, struct cluster_cmd *cmds, size_t n,
                                    const char *what, char *err, size_t errsz);

/* cluster_command_node, its failure classed as tier2_io_pipeline's. */
enum tier2_status tier2_io_node(struct cluster_router *r, size_t master, int argc,
                                const char **argv, const size_t *argvlen, redisReply **reply,
                                const char *what, char *err, size_t errsz);

/* A command of two words, VERB NAME, with room for the name: fill c->name,
 * then tier2_io_cmd2() points cmd at it for cluster_pipeline. */
struct tier2_cmd2 {
	char name[TIER2_NAME_MAX];
	const char *argv[2];
	size_t len[2];
};
void tier2_io_cmd2(struct cluster_cmd *cmd, struct tier2_cmd2 *c, const char *verb,
                   size_t name_len);

/* Frees every reply of cmds[0..n) and sets them NULL. */
void tier2_io_free_replies(struct cluster_cmd *cmds, size_t n);

/* TIER2_OK when rep is the status "OK"; else TIER2_NODE_ERROR with a message
 * naming the command, the key and the reply. */
enum tier2_status tier2_io_want_ok(const redisReply *rep, const char *cmd, const char *key,
                                   char *err, size_t errsz);

/* The same for an integer reply. */
enum tier2_status tier2_io_want_int(const redisReply *rep, const char *cmd, const char *key,
                                    char *err, size_t errsz);

/* ---- block parts (tier2_parts.c) ---- */

/* One block part of an entry: its name's pieces, its size and where it
 * goes in its layer's blob. */
struct tier2_part_ref {
	uint8_t node[16]; /* h_{(b+1)B/16} */
	uint32_t layer;
	uint32_t part; /* 0 k, 1 v */
	uint64_t xxh3; /* seeded with the layer index */
	uint64_t size;
	uint64_t off; /* in the layer's blob */
};

/* A referrer of a part: the entry key and the generation, 40 bytes. */
#define TIER2_MEMBER_LEN (TIER2_KEY_LEN + 8u)
void tier2_member(unsigned char out[TIER2_MEMBER_LEN], const uint8_t key[TIER2_KEY_LEN],
                  uint64_t gen);

/* The parts a valid version-2 record names, in its order, into a malloc'd
 * array (*out NULL when there are none). TIER2_OK or TIER2_NOMEM. */
enum tier2_status tier2_parts_of(const struct tier2_record *rec, struct tier2_part_ref **out,
                                 size_t *n, char *err, size_t errsz);

/* The scripts. REF: KEYS part, refs; ARGV member, ttl (0: none), bytes,
 * mode ("0": only when the part exists, "1": SET it when absent): adds the
 * member to the refs and sets both keys' expiry (the longer of theirs and
 * ttl, none when ttl is 0). 0: absent (mode 0), 1: referenced, 2: created.
 * UNREF: KEYS part, refs; ARGV member: removes the member; when no referrer
 * is left, DELs both: 0 referenced still, 1 no referrer (the part was gone),
 * 2 the part deleted. Both are idempotent for one member. */
extern const char tier2_script_ref[];
extern const char tier2_script_unref[];

/* UNREF of refs[0..n) for member (pipelined); the bytes of parts deleted
 * added to *freed (may be NULL). TIER2_OK, or how a round trip or a reply
 * failed (the rest are still tried). */
enum tier2_status tier2_parts_unref(struct cluster_router *r, const char *ns,
                                    const unsigned char member[TIER2_MEMBER_LEN],
                                    const struct tier2_part_ref *refs, size_t n, uint64_t *freed,
                                    char *err, size_t errsz);

/* ---- a put's intent (tier2_intent.c) ---- */

/* Writes the intent's header (RPUSH), and its expiry when ttl_len. */
enum tier2_status tier2_intent_begin(struct cluster_router *r, const char *ns,
                                     const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                                     uint32_t chunk_size, uint32_t n_chunks, const char *ttl,
                                     size_t ttl_len, char *err, size_t errsz);

/* Appends refs[0..n) to the intent (one RPUSH, answered before it returns). */
enum tier2_status tier2_intent_parts(struct cluster_router *r, const char *ns,
                                     const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                                     const struct tier2_part_ref *const *refs, size_t n, char *err,
                                     size_t errsz);

/* Appends the generation a put replaces (its record is about to be
 * overwritten): "K3TO" | u64 generation | u32 chunk_size | u32 n_chunks. */
enum tier2_status tier2_intent_old(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t gen, uint64_t old_gen,
                                   uint32_t old_chunk_size, uint32_t old_n_chunks, char *err,
                                   size_t errsz);

/* Whether the key's record decodes, is bound to key and has generation
 * gen: *yes (tier2_delete.c). */
enum tier2_status tier2_record_has(struct cluster_router *r, const char *ns, const uint8_t *key,
                                   uint64_t gen, int *yes, char *err, size_t errsz);

/* DELs chunks [0, n_chunks) of generation gen (tier2_delete.c); *freed grows
 * by the bytes of each removed, chunk_size each but the last below total
 * (UINT64_MAX: unknown), and *n_deleted (may be NULL) by one. Stops at the
 * first round trip that fails. */
enum tier2_status tier2_chunks_del(struct cluster_router *r, const char *ns, const uint8_t *key,
                                   uint64_t gen, uint32_t n_chunks, uint32_t chunk_size,
                                   uint64_t total, uint64_t *freed, uint64_t *n_deleted, char *err,
                                   size_t errsz);

/* tier2_delete, which also DELs the generation's intent unless keep_intent
 * (tier2_undo reads it, and deletes it last). */
enum tier2_status tier2_delete_gen(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                                   int keep_intent, uint64_t *bytes_freed, char *err, size_t errsz);

/* DELs the intent. */
enum tier2_status tier2_intent_end(struct cluster_router *r, const char *ns,
                                   const uint8_t key[TIER2_KEY_LEN], uint64_t gen, char *err,
                                   size_t errsz);

#endif
