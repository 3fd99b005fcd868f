/* tier2: the data layout of tier 2 in a Redis Cluster, and the blocking
 * put / longest-prefix / get / delete / list over the router (cluster.h), with
 * a daemon's ledger for its byte budget. Issue 17, item 3.
 *
 * Layout (contract). NS is the caller's namespace, 1..TIER2_NS_MAX bytes of
 * [A-Za-z0-9._-] (no ':' and no '{' or '}': only a part and its referrers
 * have a hash tag, which keeps them in one slot; the keys spread over every
 * slot). KEY is the entry key of DESIGN.md "Prefix key
 * and lookup" (SHA-256 of model fingerprint, salt and tokens) in 64 lower-case
 * hex digits; it already isolates models and salts exactly as the local store
 * does, and NS isolates tenants whatever the salt.
 *
 *   k3:NS:e:KEY            the entry record (string, below)
 *   k3:NS:c:KEY:GEN:I      chunk I (decimal, from 0) of the entry's bytes:
 *                          the layer blobs end to end, cut every chunk_size
 *                          (at most TIER2_CHUNK_MAX = 1 MiB) bytes; GEN is the
 *                          record's generation in 16 hex digits
 *   k3:NS:n:NODE           a prefix-index node (hash, below); NODE is a node
 *                          hash h_d of prefix.h (model, salt and the first d
 *                          blocks of 16 tokens) in 32 hex digits
 *   k3:NS:o:OWNER          a daemon's ledger (sorted set, below); OWNER has
 *                          the syntax of NS
 *   k3:NS:p:{NODE:L:P:XXH} a block part of MLA rows (string, version 2,
 *                          below): NODE the node h_{(b+1)B/16} of the
 *                          block's last token in 32 hex digits, L the layer
 *                          (decimal), P "k" or "v", XXH the XXH3-64 of the
 *                          part's bytes seeded with L (16 hex digits)
 *   k3:NS:q:{NODE:L:P:XXH} its referrers (set), in the part's slot (the
 *                          hash tag)
 *   k3:NS:i:KEY:GEN        a put's intent (list, below): what a put of
 *                          generation GEN may have written, for its undo
 *
 * Entry record, little-endian, exactly this long:
 *   "K3T2" | u16 version = 1 | u16 flags = 0 | u64 generation
 *   | fingerprint (32) | u32 salt_len (<= 1024) | salt
 *   | u32 P (1..TIER2_MAX_TOKENS) | P x u32 token
 *   | u32 n_layers (1..65536) | n_layers x (u64 size >= 1 | u64 xxh3)
 *   | u32 chunk_size (1..1 MiB) | u32 n_chunks (= ceil(sum of sizes / chunk_size))
 *   | n_chunks x u64 chunk xxh3
 *   [version 2: | u32 row_block B (a multiple of 16, 16..65536)
 *   | u32 n_split (<= n_layers) | n_split x (u32 layer | u32 seq_len
 *   | u32 k_row | u32 v_row) | per split layer in order, seq_len / B x
 *   (u64 k part xxh3 | u64 v part xxh3)]
 *   | u64 XXH3-64 of every byte before
 * A layer's xxh3 is checksum_blob (checksum.h: seeded with the layer index,
 * as locally); a chunk's is XXH3-64 of its bytes, seed 0. The sum of sizes is
 * at most TIER2_MAX_ENTRY_BYTES and n_chunks at most TIER2_MAX_CHUNKS. The
 * generation is random (getrandom) per put: a re-publish writes new chunk
 * keys, so a reader never mixes old and new chunks. A record is valid only
 * when its KEY is the entry key of its own fingerprint, salt and tokens.
 *
 * Block parts (version 2, issue 17 item 3: a conversation's turns store and
 * send their MLA rows once, as the local store's blocks). A put with a row
 * block B splits each MLA layer (tag 2, the caller's) whose header (tag,
 * seq_len, k count; then the v count) fits its size, with at least one block
 * (seq_len >= B), seq_len <= P and rows of >= 1 float: block b, its rows
 * [bB, (b+1)B), b < seq_len / B, is a k part (B k rows) and a v part (B v
 * rows), each a key of its own named by position and content, so two
 * entries of one token prefix share a part exactly when its bytes are
 * equal. The entry's stream (what its chunks hold, cut every chunk_size) is
 * then the KDA and unsplit layers whole and, of each split layer, tag |
 * seq_len | k count | its k tail rows | v count | its v tail rows (the rows
 * from (seq_len / B) B on); the split layers are in the record, so a reader
 * knows the layout. Each part is written by an EVAL that adds the entry's
 * member (its key's 32 bytes | u64 generation) to the referrers when the
 * part exists (pipelined, one small round trip: a part there is not sent
 * again); for those absent, an EVAL that SETs the part if still absent and
 * adds the member. A referrer set rather than a counter: adding and removing
 * a member is idempotent, so an undo or a delete run twice never takes
 * another entry's reference; removing the last member deletes the part.
 * Both keys' expiry becomes the longer of theirs and the put's TTL, none
 * when the put has none. Parts are read from the source as it streams (at
 * most max_in_flight parts and 64 MiB buffered), never a whole layer.
 * Limits: a part at most TIER2_PART_MAX bytes, at most TIER2_MAX_PARTS
 * parts an entry (layers beyond either are stored whole).
 *
 * Intent k3:NS:i:KEY:GEN, a list, so that a put stopped part-way (its
 * process killed) can be undone by whoever knows its key and generation
 * (tier2_undo; the daemon journals both in its ledger first). The put
 * writes it, and waits for the answer, before any chunk or part: element 0
 * is "K3TI" | u32 chunk_size | u32 n_chunks at most (12 bytes); before each
 * round of part references it appends, and waits for, one element per part:
 * NODE (16 raw bytes) | u32 layer | u32 part | u64 xxh3 | u64 size (40
 * bytes, LE); before it overwrites a record of another generation, "K3TO" |
 * u64 that generation | u32 its chunk_size | u32 its n_chunks (20 bytes),
 * whose chunks are then the put's to delete (not its part references: a
 * put that replaces a record of the same entry, keep_existing off, killed
 * between its record and their unreference leaves them; the daemon keeps
 * such a record instead). Chunks need no element: their names follow from the
 * key, GEN and the count. A put deletes its intent once it is whole (after the
 * replaced generation's cleanup) or undone; a delete of the generation
 * deletes it too. It has the put's expiry.
 *
 * Prefix-index node k3:NS:n:h_d, for an entry of P tokens, D = P / 16:
 *   - at d = 1..D-1 (the blocks its prefix passes): field "+" = "" (the node
 *     exists: a lookup's binary search probes existence);
 *   - at d = D (h_0, the model's and salt's root, when P < 16): field = the
 *     32 raw bytes of the entry key, value = u32 P | u64 XXH3-64 of tokens
 *     [16 D, P) (the tail that is not a full block), 12 bytes.
 * So a node holds the entries that end in its block, not every entry that
 * passes it (a node near the root would otherwise list a whole fleet's
 * conversations), like the local store's nodes and attach rows.
 *
 * Put order: chunks and parts as the source streams (pipelined, at most
 * max_in_flight at once), then the record, then the index nodes. A reader
 * that finds a node or a record finds the chunks, or a missing one (a miss).
 * A re-publish deletes the chunks of the generation it replaced, after its
 * own record is in place; a reader still on the old one then misses; the
 * replaced generation's parts are unreferenced. A put that fails part-way
 * deletes what it wrote (best effort: a node that failed keeps its part until
 * an expiry or an eviction): its chunks, its references to parts (a part it
 * alone referred to is deleted), and when its record was in place, that
 * record (if still its own), its index field and the replaced generation's
 * chunks.
 *
 * Delete of a generation: its parts unreferenced, its chunks, its field in
 * node h_D, then its record (the handle: a delete that failed part-way can be
 * run again); the "+" fields of its path stay, shared with other entries. A
 * record of another generation is another put's and is left alone.
 *
 * Ledger k3:NS:o:OWNER, for a daemon's byte budget in the cluster: members
 * are the 32 raw bytes of an entry key | u64 generation | u64 bytes (LE, 48
 * bytes), scored by the caller's clock (oldest lowest). The daemon adds what
 * it put and removes what it deleted; it survives the daemon's restart. It
 * is one key, so one master holds it. A member with a negative score is a
 * put under way: the daemon adds it, with the generation it then passes to
 * the put, before the put writes anything, and replaces it when the put
 * returns; one found when the ledger is read back is a put that a stop
 * interrupted, to undo (tier2_undo).
 *
 * Lookup of a prompt of n tokens: its block hashes h_1..h_{n/16}; the deepest
 * node present is found by a search that probes TIER2_PROBES depths per
 * round trip (pipelined EXISTS): ceil(log_17(n/16 + 1)) round trips, 4 for
 * 131,072 tokens. Then the nodes at and above it are read (HGETALL, deepest
 * first, 8 in the first round trip and twice as many in each next, up to
 * 512: O(log) round trips when the nearest entry lies far above); fields whose P <= n, whose P is
 * in the node's block and whose tail hash is the prompt's are candidates; their records are read,
 * longest first, and the first whose key, fingerprint, salt and every token equal the prompt's
 * wins. A hash locates, only tokens confirm.
 *
 * Redis may evict or lose any key at any time. A node lost from a path makes
 * a lookup shorter, never wrong; a field whose record is gone or does not
 * match is skipped (counted as stale); a record whose chunk is missing,
 * short, long or fails its sum, or whose layer fails its checksum, is a miss
 * by cause, and no byte of it is returned.
 *
 * Listing: SCAN MATCH k3:NS:e:* on every master, each key's name parsed
 * back (only names of the form above), each record read and checked.
 *
 * Redis evicting a part makes the entries naming it miss (TIER2_MISSING);
 * evicting a referrer set loses the references: the next unreference of the
 * part deletes it, and the others naming it miss. Never a wrong byte, never
 * a count below zero.
 *
 * Not here: a delta publish (a put reads every byte of its source, the
 * parts it finds there only hashed), the model-spec checks of a blob (the daemon validates what
 * it fetches as every publish), the background queue, the budget's policy
 * (the daemon's: the ledger is its memory), and threads (a router, hence
 * every call here, is used by one thread at a time). */
#ifndef K3_TIER2_H
#define K3_TIER2_H

#include <stddef.h>
#include <stdint.h>

#include "tier2/cluster.h"

#define TIER2_NS_MAX          64u
#define TIER2_CHUNK_MAX       (1u << 20)
#define TIER2_MAX_SALT        1024u
#define TIER2_MAX_TOKENS      (1u << 22)
#define TIER2_MAX_LAYERS      65536u
#define TIER2_MAX_CHUNKS      (1u << 20)
#define TIER2_MAX_ENTRY_BYTES (16ull << 30)
#define TIER2_PROBES          16u /* existence probes per search round trip */
#define TIER2_RECORD_MAGIC    "K3T2"
#define TIER2_RECORD_VERSION  2u /* the newest; version 1 is read too */
#define TIER2_ROW_BLOCK_MAX   65536u
#define TIER2_MAX_PARTS       (1u << 22)   /* block parts of one entry */
#define TIER2_PART_MAX        (256u << 20) /* bytes of one block part */
#define TIER2_MLA_HEAD        9u           /* tag, seq_len, k count */
#define TIER2_KEY_LEN         32u
#define TIER2_NODE_FIELD_LEN  12u /* u32 P | u64 tail hash */

/* ---- results ---- */

enum tier2_status {
	TIER2_OK = 0,
	TIER2_MISSING,    /* the record or a chunk is not in the cluster */
	TIER2_DAMAGED,    /* the record or a chunk failed a check */
	TIER2_TIMEOUT,    /* a round trip ran out of time */
	TIER2_NODE_ERROR, /* a node refused, is backing off, or answered an error */
	TIER2_INVALID,    /* the caller's arguments */
	TIER2_NOMEM,
	TIER2_TOO_LARGE, /* tier2_get_max: the entry is larger than the caller takes */
	TIER2_PARTIAL,   /* tier2_list: some masters did not answer, the others listed */
};

/* "ok", "missing", "damaged", "timeout", "node-error", "invalid", "nomem",
 * "too-large", "partial". */
const char *tier2_status_name(enum tier2_status st);

/* Counters that the calls add to (the caller zeroes them once). */
struct tier2_stats {
	uint64_t bytes_out;         /* value bytes written: chunks, records, node fields */
	uint64_t bytes_in;          /* value bytes read: chunks, records, node fields */
	uint64_t puts;              /* entries written whole */
	uint64_t put_failures;      /* puts that failed */
	uint64_t old_chunks_del;    /* chunks of a replaced generation deleted */
	uint64_t put_existing;      /* keep_existing puts that found the entry there */
	uint64_t undone_chunks_del; /* chunks of a failed put deleted */
	uint64_t lookups;           /* tier2_longest calls */
	uint64_t lookup_hits;       /* of those, a prefix found */
	uint64_t lookup_trips;      /* their round trips (pipelines) to the cluster */
	uint64_t stale;             /* index fields whose record was gone or did not match */
	uint64_t gets;              /* tier2_get calls and readers opened */
	uint64_t hits;              /* of tier2_get calls, an entry returned */
	uint64_t miss_missing;      /* gets that missed: a key gone */
	uint64_t miss_damaged;      /* a check failed */
	uint64_t miss_timeout;      /* a round trip timed out */
	uint64_t miss_node;         /* a node failed otherwise */
	uint64_t miss_too_large;    /* tier2_get_max: the entry was over the caller's limit */
	uint64_t parts_new;         /* block parts a put wrote (absent before) */
	uint64_t parts_shared;      /* block parts a put found there and referenced */
	uint64_t part_bytes_saved;  /* the bytes of those shared parts (not sent) */
};

/* ---- the entry record (tier2_record.c) ---- */

struct tier2_layer {
	uint64_t size;
	uint64_t xxh3; /* checksum_blob(bytes, size, layer index) */
	uint8_t tag;   /* the blob's tag: 1 KDA, 2 MLA, 0 unknown (not MLA); a
	                * put splits MLA layers only; not in the record (a
	                * decoded record has 2 for its split layers, else 0) */
};

/* An MLA layer whose first seq_len / row_block blocks of rows are parts
 * (record version 2). */
struct tier2_split {
	uint32_t layer; /* index, increasing in the record */
	uint32_t seq_len;
	uint32_t k_row; /* floats per row, >= 1 */
	uint32_t v_row;
};

struct tier2_record {
	uint64_t generation;
	uint8_t fingerprint[32];
	uint32_t salt_len;
	const uint8_t *salt;
	uint32_t n_tokens;
	const uint32_t *tokens;
	uint32_t n_layers;
	const struct tier2_layer *layers;
	uint32_t chunk_size;
	uint32_t n_chunks;
	const uint64_t *chunk_xxh3;
	uint16_t version;   /* 1 or 2 (0 is taken as 1 by the encoder) */
	uint32_t row_block; /* version 2: B, a multiple of 16 in 16..65536 */
	uint32_t n_split;
	const struct tier2_split *split;
	/* per split layer in order, seq_len / B blocks of (k part, v part):
	 * XXH3-64 of the part's bytes seeded with the layer index */
	const uint64_t *part_xxh3;
	void *mem; /* tier2_record_decode's one allocation; NULL otherwise */
};

/* Bytes of the encoding of a record of these counts. */
size_t tier2_record_size(uint32_t salt_len, uint32_t n_tokens, uint32_t n_layers,
                         uint32_t n_chunks);

/* Bytes of the encoding of a version-2 record of these counts. */
size_t tier2_record_size_v2(uint32_t salt_len, uint32_t n_tokens, uint32_t n_layers,
                            uint32_t n_chunks, uint32_t n_split, uint32_t n_parts);

/* The number of chunks of total bytes cut every chunk_size (>= 1). */
uint64_t tier2_chunk_count(uint64_t total, uint32_t chunk_size);

/* The bytes of one k (part 0) or v (part 1) part of a split layer: B rows. */
static inline uint64_t tier2_part_size(const struct tier2_split *s, uint32_t row_block, int part)
{
	return (uint64_t)row_block * (part ? s->v_row : s->k_row) * 4u;
}

/* The bytes of an entry's stream (what its chunks hold): the layer sizes
 * less the bytes of every part. rec must be valid (encoded or decoded). */
uint64_t tier2_stream_size(const struct tier2_record *rec);

/* A run of a layer's blob that the stream holds. */
struct tier2_run {
	uint32_t layer;
	uint64_t off, len;
};

/* The runs of rec's stream, in stream order, into out (room for 4 per
 * layer): a layer whole is one; a split MLA layer has its header, its k tail
 * rows, its v count and its v tail rows. rec must be valid (encoded or
 * decoded: its splits fit their layers). Returns the number of runs. */
size_t tier2_stream_runs(const struct tier2_record *rec, struct tier2_run *out);

/* Encodes rec (its counts within the limits above, n_chunks consistent with
 * its sizes) into a malloc'd buffer: 0 with *out and *len set, or -1 with a
 * message in err (a limit exceeded, no memory). */
int tier2_record_encode(const struct tier2_record *rec, uint8_t **out, size_t *len, char *err,
                        size_t errsz);

/* Decodes len bytes, trusting none of them: magic, version, flags, every
 * count against its limit and against the bytes left (64-bit arithmetic,
 * before any allocation), sizes >= 1 and their sum, n_chunks against the sizes
 * and chunk_size, the final checksum, and no trailing bytes. 0 with *out set
 * (its arrays in out->mem: free with tier2_record_free), or -1 with a message
 * naming the field, the offset and the numbers, or -2 when out of memory
 * (which says nothing of the bytes); *out then holds nothing. */
int tier2_record_decode(const void *buf, size_t len, struct tier2_record *out, char *err,
                        size_t errsz);

void tier2_record_free(struct tier2_record *rec);

/* ---- key names (tier2_keys.c) ---- */

/* Whether ns is a valid namespace; -1 with a message when not. */
int tier2_ns_check(const char *ns, char *err, size_t errsz);

#define TIER2_NAME_MAX (3 + TIER2_NS_MAX + 3 + 64 + 1 + 16 + 1 + 10 + 1)

/* Each writes the key's name and a NUL to out (TIER2_NAME_MAX bytes) and
 * returns its length; ns must have passed tier2_ns_check. */
size_t tier2_name_record(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN]);
size_t tier2_name_chunk(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                        uint32_t i);
size_t tier2_name_node(char *out, const char *ns, const uint8_t node[16]);
size_t tier2_name_intent(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN], uint64_t gen);

/* A block part, k3:NS:p:{NODE:L:P:XXH}, and its referrers' set,
 * k3:NS:q:{NODE:L:P:XXH} (part 0 is k, 1 is v). */
size_t tier2_name_part(char *out, const char *ns, const uint8_t node[16], uint32_t layer, int part,
                       uint64_t xxh3);
size_t tier2_name_refs(char *out, const char *ns, const uint8_t node[16], uint32_t layer, int part,
                       uint64_t xxh3);

/* Whether owner is a valid ledger owner (the syntax of a namespace); -1 with a
 * message when not. */
int tier2_owner_check(const char *owner, char *err, size_t errsz);

/* The ledger's name, k3:NS:o:OWNER (owner checked). */
size_t tier2_name_ledger(char *out, const char *ns, const char *owner);

/* Whether name (len bytes, untrusted: a SCAN's) is the record name of an
 * entry of ns, "k3:NS:e:" and 64 lower-case hex digits: 0 with its key in
 * key, or -1. */
int tier2_parse_record_name(const char *name, size_t len, const char *ns,
                            uint8_t key[TIER2_KEY_LEN]);

/* The tail hash of a node field: XXH3-64 of tokens [from, to). */
uint64_t tier2_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to);

/* ---- put, longest, get (tier2_put.c, tier2_lookup.c, tier2_get.c) ---- */

struct tier2_blob {
	const void *data;
	size_t size;
};

struct tier2_put_options {
	uint32_t ttl_s;         /* 0: no expiry; else EX ttl_s on every key written
	                         * (shared keys, index nodes and block parts, only
	                         * ever get a longer expiry; 0 takes theirs away) */
	uint32_t chunk_size;    /* 0: TIER2_CHUNK_MAX */
	uint32_t max_in_flight; /* chunks written per pipeline; 0: 16 */
	int keep_existing;      /* when the key has a record that decodes and is
	                         * the same entry's (model, salt, tokens): write
	                         * nothing (its chunks are not checked). A record
	                         * written by another put while this one ran is
	                         * kept too (SET NX): this one's writes are undone
	                         * and res->existed set */
	uint32_t row_block;     /* B: 0, a version-1 record (blobs whole); else a
	                         * multiple of 16 up to 65536: MLA rows in parts */
	uint64_t generation;    /* 0: a random one; else this one (the caller's,
	                         * journaled first so that it can undo the put
	                         * if it is killed: tier2_undo). TIER2_INVALID
	                         * when it is the key's record's already */
};

/* The entry's bytes in order (the layer blobs end to end), pulled by the put. */
struct tier2_source {
	/* Copies the next len bytes to dst: 0, or -1 with a message in err (the
	 * put then fails with TIER2_DAMAGED: the source's bytes failed a check). */
	int (*read)(void *ctx, void *dst, size_t len, char *err, size_t errsz);
	void *ctx;
};

struct tier2_put_result {
	uint64_t generation; /* the record's generation written (or found, when existed) */
	uint32_t n_chunks;
	uint64_t bytes;     /* the sum of the layer sizes */
	int existed;        /* keep_existing: a valid record was already there; nothing written */
	uint64_t new_bytes; /* written by this put: chunks, parts it created, record */
	uint64_t shared_bytes; /* parts already in the cluster, referenced, not sent */
	int undo_left;         /* set on a failure whose undo did not finish (a node
	                        * failed): the intent stays, for tier2_undo later */
};

/* Writes the entry of model fingerprint, salt and tokens [0, n_tokens) whose
 * layers have the sizes, checksums (checksum_blob) and tags in layers,
 * reading its bytes from src in order (into max_in_flight buffers of
 * chunk_size bytes, and with opt->row_block into part buffers; each read one
 * call of at most chunk_size bytes): a version-1 record with row_block 0, a
 * version-2 one with block parts otherwise ("Block parts" above). An MLA
 * layer whose header does not fit its size (tag, k or v count not a
 * multiple of seq_len, sizes not adding up) is TIER2_DAMAGED.
 * Each layer's bytes are checked against its checksum as they pass; the
 * record is written only when all of them match. With keep_existing, a
 * record already there of the same entry is kept: res->existed, nothing
 * read from src. res and stats may be NULL.
 *
 * Returns TIER2_OK (res filled: new_bytes what this put wrote, its chunks,
 * the parts it created and its record; shared_bytes the parts it found),
 * or TIER2_INVALID (a bad namespace, no tokens or layers, an empty layer, a
 * limit exceeded, a row block that is not a multiple of 16 up to 65536), TIER2_DAMAGED (src failed,
 * or a layer's bytes do not match its checksum), TIER2_TIMEOUT,
 * TIER2_NODE_ERROR or TIER2_NOMEM with a message in err naming the key and
 * the reason. A put that fails after writing leaves nothing of its
 * generation (best effort): its chunks written so far are deleted, and when
 * its record was written, the record (if still its own), its index field and
 * the chunks of the generation it replaced. */
enum tier2_status tier2_put_from(struct cluster_router *r, const char *ns,
                                 const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                                 const uint32_t *tokens, uint32_t n_tokens,
                                 const struct tier2_layer *layers, uint32_t n_layers,
                                 const struct tier2_source *src,
                                 const struct tier2_put_options *opt, struct tier2_put_result *res,
                                 struct tier2_stats *stats, char *err, size_t errsz);

/* tier2_put_from with one contiguous blob per layer, whose checksums it
 * computes and whose tags are their first bytes (TIER2_INVALID also for an
 * empty blob). */
enum tier2_status tier2_put(struct cluster_router *r, const char *ns, const uint8_t fingerprint[32],
                            const void *salt, size_t salt_len, const uint32_t *tokens,
                            uint32_t n_tokens, const struct tier2_blob *blobs, uint32_t n_blobs,
                            const struct tier2_put_options *opt, struct tier2_stats *stats,
                            char *err, size_t errsz);

/* Deletes the entry of key when its record decodes, is bound to key and has
 * this generation: its references to parts (a part left with none is
 * deleted), its chunks, its field in its index node h_D (the "+"
 * fields of its path stay: other entries share them), then its record, last
 * (and an intent of the generation its put left),
 * so that a delete that fails part-way can be done again. TIER2_OK with
 * *bytes_freed (may be NULL) the bytes of the record, chunks and parts that
 * DEL removed (keys already evicted add nothing); TIER2_MISSING when the record
 * is not there or has another generation (another put replaced it: nothing
 * deleted); TIER2_DAMAGED when it does not decode or is another entry's
 * (nothing deleted); TIER2_INVALID, TIER2_TIMEOUT, TIER2_NODE_ERROR,
 * TIER2_NOMEM. A put of the same key between the read and the DELs can lose
 * its record or field (a miss later, never a wrong entry). */
enum tier2_status tier2_delete(struct cluster_router *r, const char *ns,
                               const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                               uint64_t *bytes_freed, char *err, size_t errsz);

/* A random generation for tier2_put_options.generation (never 0). */
uint64_t tier2_generation_new(void);

/* Undoes what a put of key and generation wrote and did not take back
 * itself (its process was killed, or its undo met a failing node): from
 * the put's intent, its references to parts (a part left with none is
 * deleted); when the key's record has that generation, the chunks of the
 * generation it replaced (named in the intent) and then tier2_delete of
 * it; the put's chunks; the intent, last, so that an undo that failed can
 * be run again. A put that had finished is deleted too. Nothing of another
 * generation is touched but the one the put itself replaced; undoing
 * twice, or a put that wrote nothing, is TIER2_OK. TIER2_OK with
 * *bytes_freed (may be NULL) what DEL removed (a chunk counted at
 * chunk_size); TIER2_DAMAGED when the intent has no header (evicted and
 * written again): its parts are unreferenced and it is deleted, but its
 * chunks are left to expiry or eviction; TIER2_INVALID, TIER2_TIMEOUT,
 * TIER2_NODE_ERROR, TIER2_NOMEM: to run again later. */
enum tier2_status tier2_undo(struct cluster_router *r, const char *ns,
                             const uint8_t key[TIER2_KEY_LEN], uint64_t generation,
                             uint64_t *bytes_freed, char *err, size_t errsz);

/* The longest stored entry whose tokens are tokens [0, P) with 1 <= P <= n
 * (pass the prompt cut at the caller's limit). TIER2_OK with *prefix_len P and
 * key set, or *prefix_len 0 when there is none. When nothing was found and a
 * round trip failed, TIER2_TIMEOUT or TIER2_NODE_ERROR (the answer may have
 * been longer), or TIER2_NOMEM when memory ran out (to read a candidate's
 * record, say); when something was found despite such a failure, TIER2_OK
 * with it, though a longer one may have been missed; TIER2_INVALID. */
enum tier2_status tier2_longest(struct cluster_router *r, const char *ns,
                                const uint8_t fingerprint[32], const void *salt, size_t salt_len,
                                const uint32_t *tokens, uint32_t n, uint8_t key[TIER2_KEY_LEN],
                                uint32_t *prefix_len, struct tier2_stats *stats, char *err,
                                size_t errsz);

struct tier2_entry_blob {
	uint8_t *data; /* in the entry's mem */
	size_t size;
	uint64_t xxh3;
};

struct tier2_entry {
	uint8_t fingerprint[32];
	uint32_t salt_len;
	uint8_t *salt; /* malloc'd (NULL when salt_len is 0) */
	uint32_t prefix_len;
	uint32_t *tokens; /* malloc'd, prefix_len tokens */
	uint32_t n_blobs;
	struct tier2_entry_blob *blobs; /* malloc'd */
	uint8_t *mem;                   /* malloc'd: the layers end to end */
};

/* Reads the entry of key whole (a tier2_reader, below, into one buffer),
 * each layer's checksum checked once every chunk and part is in.
 * TIER2_OK with *entry filled (free with tier2_entry_free), or a miss:
 * TIER2_MISSING, TIER2_DAMAGED, TIER2_TIMEOUT or TIER2_NODE_ERROR, counted in
 * stats by cause, with a message in err; *entry is then empty. Never returns
 * a byte that failed a check. */
enum tier2_status tier2_get(struct cluster_router *r, const char *ns,
                            const uint8_t key[TIER2_KEY_LEN], struct tier2_entry *entry,
                            struct tier2_stats *stats, char *err, size_t errsz);
/* tier2_get of an entry of at most max_bytes (the sum of its layers; 0: no
 * limit): a larger one is TIER2_TOO_LARGE (counted in miss_too_large) once
 * its record is read, before any memory is taken for its bytes or a chunk
 * is read. */
enum tier2_status tier2_get_max(struct cluster_router *r, const char *ns,
                                const uint8_t key[TIER2_KEY_LEN], uint64_t max_bytes,
                                struct tier2_entry *entry, struct tier2_stats *stats, char *err,
                                size_t errsz);

void tier2_entry_free(struct tier2_entry *entry);

/* An entry read as it streams. Its bytes are the payload of a publish: the
 * layers end to end, layer i at the sum of the sizes before it. The reader
 * GETs the chunks and parts (pipelined, at most 16 and about 16 MiB a round
 * trip) in the order of the first payload byte each holds, checks each one's
 * length and XXH3 against the record, and writes its bytes into the
 * caller's buffer, only below the caller's limit: what lies beyond is kept
 * until a later call's limit covers it (a chunk's bytes past an MLA layer's
 * parts, a part across the limit: a chunk and a part at most). So an entry
 * of any size streams through a window of a few MiB plus one part.
 *
 * Every byte below *arrived is in place and came from a chunk or part that
 * passed its checks, and no call writes below the *arrived of the call
 * before: a caller may drop what lies below it. The layers' checksums
 * (tier2_read_record()->layers, never 0: a record with a 0 is damaged) are
 * NOT checked here: the caller checks them (a store publish does,
 * piecewise, given them as the blobs' sums), as tier2_get does.
 *
 *   open   reads the record (bound to key) and plans the read. TIER2_OK with
 *          *out set, or a miss as tier2_get (TIER2_TOO_LARGE over max_bytes,
 *          0: no limit), counted in stats.
 *   next   one round trip at most: *arrived rises, up to total when done;
 *          when it equals limit (less than total), nothing more fits: call
 *          again with a higher limit. dst is the caller's payload buffer
 *          (bytes from the last *arrived up to limit writable). A failure is
 *          counted in stats and is
 *          final (every later call returns it).
 *   close  frees what the reader holds.
 * stats (may be NULL) must outlive the reader; its hits are the caller's. */
struct tier2_reader;
enum tier2_status tier2_read_open(struct cluster_router *r, const char *ns,
                                  const uint8_t key[TIER2_KEY_LEN], uint64_t max_bytes,
                                  struct tier2_stats *stats, struct tier2_reader **out, char *err,
                                  size_t errsz);
const struct tier2_record *tier2_read_record(const struct tier2_reader *rd);
uint64_t tier2_read_total(const struct tier2_reader *rd);
enum tier2_status tier2_read_next(struct tier2_reader *rd, unsigned char *dst, uint64_t limit,
                                  uint64_t *arrived, char *err, size_t errsz);
void tier2_read_close(struct tier2_reader *rd);

/* ---- listing (tier2_list.c) ---- */

struct tier2_listed {
	uint8_t key[TIER2_KEY_LEN];
	uint8_t fingerprint[32];
	uint32_t prefix_len;
	uint32_t n_layers;
	uint64_t bytes; /* sum of layer sizes */
	uint64_t generation;
	uint32_t salt_len;
	const uint8_t *salt; /* valid during the callback */
};

#define TIER2_SCAN_COUNT 512u /* SCAN's COUNT */

/* Every entry record under ns (SCAN MATCH k3:NS:e:* COUNT 512 on every master
 * of cluster_n_masters, each to its end; the records read pipelined), of model
 * fingerprint (NULL: all), each passed to fn (non-zero stops). Keys that are
 * not record names of ns are passed over; records that are gone are skipped;
 * records that do not decode, are not bound to their key or are not strings
 * are skipped and counted in stats->stale (stats may be NULL). At most limit
 * entries (0: no limit). As SCAN, an entry may be passed twice, and one put
 * or moved during the listing may be missed; so may a master's entries when
 * the slot map changes during the listing (a failover or resharding: the
 * masters are numbered anew by address). cancelled (NULL: never) is
 * asked before each SCAN page and each batch of records: non-zero ends the
 * listing with TIER2_TIMEOUT (a caller's deadline or shutdown: a namespace
 * of millions of entries, or a node whose SCAN never ends, takes as long as
 * the caller lets it). A master that does not answer (a timeout, a node
 * error, also a SCAN reply of another shape) is passed over and the others
 * listed: TIER2_PARTIAL at the end, err saying how many masters were passed
 * over and why (the listing is not whole, even with no entry listed).
 * TIER2_OK (also when fn or limit stopped it), TIER2_PARTIAL, or
 * TIER2_INVALID, TIER2_TIMEOUT (no slot map in time, or given up),
 * TIER2_NODE_ERROR (no slot map) or TIER2_NOMEM with a message in err (what
 * was listed before it stays listed). */
enum tier2_status tier2_list(struct cluster_router *r, const char *ns, const uint8_t *fingerprint,
                             uint32_t limit, int (*fn)(const struct tier2_listed *e, void *ctx),
                             int (*cancelled)(void *ctx), void *ctx, struct tier2_stats *stats,
                             char *err, size_t errsz);

/* ---- a put's intent (tier2_intent.c; layout above, "Intent") ---- */

#define TIER2_INTENT_HEAD_LEN 12u
#define TIER2_INTENT_PART_LEN 40u

#define TIER2_INTENT_OLD_LEN 20u

/* What an intent's pages say besides its parts (tier2_intent_parse fills
 * it in, page after page; zero it first). */
struct tier2_intent_info {
	int have_head; /* the header, first element of the first page */
	uint32_t chunk_size, n_chunks;
	int have_old; /* the generation the put replaced, when it had begun to */
	uint64_t old_gen;
	uint32_t old_chunk_size, old_n_chunks;
};

/* A part a put referenced, as its intent names it. */
struct tier2_intent_part {
	uint8_t node[16];
	uint32_t layer;
	uint32_t part; /* 0 k, 1 v */
	uint64_t xxh3;
	uint64_t size;
};

void tier2_intent_head_encode(unsigned char out[TIER2_INTENT_HEAD_LEN], uint32_t chunk_size,
                              uint32_t n_chunks);

/* 0 with the header's fields when b (len bytes, untrusted: a reply's) is
 * one (its magic, a chunk size of 1..TIER2_CHUNK_MAX, at most
 * TIER2_MAX_CHUNKS chunks); -1 when not. */
int tier2_intent_head_decode(const void *b, size_t len, uint32_t *chunk_size, uint32_t *n_chunks);

void tier2_intent_part_encode(unsigned char out[TIER2_INTENT_PART_LEN],
                              const struct tier2_intent_part *p);

/* 0 with the part when b (len bytes, untrusted) is one (layer below
 * TIER2_MAX_LAYERS, part 0 or 1, size 1..TIER2_PART_MAX); -1 when not. */
int tier2_intent_part_decode(const void *b, size_t len, struct tier2_intent_part *p);

/* "K3TO" | u64 old_gen | u32 old_chunk_size | u32 old_n_chunks; decode: 0,
 * or -1 when b (len bytes, untrusted) is not one (a chunk size of
 * 1..TIER2_CHUNK_MAX, at most TIER2_MAX_CHUNKS chunks). */
void tier2_intent_old_encode(unsigned char out[TIER2_INTENT_OLD_LEN], uint64_t old_gen,
                             uint32_t old_chunk_size, uint32_t old_n_chunks);
int tier2_intent_old_decode(const void *b, size_t len, uint64_t *old_gen, uint32_t *old_chunk_size,
                            uint32_t *old_n_chunks);

/* Parses one page of LRANGE of an intent (RESP2, at most cap elements;
 * first: the page from element 0, where the header may be, as its first
 * element only): 0 with the parts named in out[0..*n_out), the header and
 * an old generation noted in *info, elements of another form skipped, and
 * *n_elems the page's elements; -1 with a message when the reply is not a
 * page of a list. */
int tier2_intent_parse(const redisReply *rep, int first, struct tier2_intent_info *info,
                       struct tier2_intent_part *out, size_t cap, size_t *n_out, size_t *n_elems,
                       char *err, size_t errsz);

/* ---- a daemon's ledger (tier2_ledger.c) ---- */

struct tier2_owned {
	uint8_t key[TIER2_KEY_LEN];
	uint64_t generation;
	uint64_t bytes;
	double score;
};

#define TIER2_LEDGER_MEMBER_LEN 48u        /* key | u64 generation | u64 bytes */
#define TIER2_LEDGER_PAGE       4096u      /* members per ZRANGE */
#define TIER2_LEDGER_MAX        (1u << 22) /* members loaded at most */

/* ZADD k3:NS:o:OWNER o->score MEMBER (the member's score updated when it is
 * there). TIER2_OK, or TIER2_INVALID (ns, owner, a NaN score), TIER2_TIMEOUT,
 * TIER2_NODE_ERROR, with a message in err. */
enum tier2_status tier2_ledger_add(struct cluster_router *r, const char *ns, const char *owner,
                                   const struct tier2_owned *o, char *err, size_t errsz);

/* ZREM of o's member (its score is not used): TIER2_OK when it was there,
 * TIER2_MISSING when not, or a failure as tier2_ledger_add. */
enum tier2_status tier2_ledger_remove(struct cluster_router *r, const char *ns, const char *owner,
                                      const struct tier2_owned *o, char *err, size_t errsz);

/* Every member, oldest (lowest score) first, into a malloc'd array (*out, *n;
 * *out NULL when there are none), read by ZRANGE WITHSCORES in pages of
 * TIER2_LEDGER_PAGE; members of a wrong length are skipped. At most
 * TIER2_LEDGER_MAX members are read: *n == TIER2_LEDGER_MAX may mean more.
 * TIER2_OK, or a failure as tier2_ledger_add (also a reply of another shape:
 * TIER2_NODE_ERROR) or TIER2_NOMEM, *out then NULL and *n 0. */
enum tier2_status tier2_ledger_load(struct cluster_router *r, const char *ns, const char *owner,
                                    struct tier2_owned **out, size_t *n, char *err, size_t errsz);

/* Parses one page of ZRANGE ... WITHSCORES (RESP2: member, score, ...; no
 * more than cap pairs): 0 with the members of the right length in out[0..
 * *n_out) and the pairs the reply had in *n_pairs, or -1 with a message
 * (not an array, an odd count, more than cap pairs, a member that is not a
 * string, a score that is not a number). */
int tier2_ledger_parse(const redisReply *rep, struct tier2_owned *out, size_t cap, size_t *n_out,
                       size_t *n_pairs, char *err, size_t errsz);

#endif
