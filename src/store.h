/* store: the persistent snapshot store over LMDB. No sockets: the daemon and
 * the offline CLI both call it.
 *
 * An entry is one snapshot: a model fingerprint, a salt, the first P tokens
 * and one blob per layer of the model. Its key is prefix_key() (DESIGN.md).
 *
 * Layout (one LMDB environment, named databases):
 *   meta     "format" -> u32 version; "totals" -> entry bytes, LRU clock
 *   models   fingerprint -> model spec JSON
 *   entries  key -> entry record (store/record.h; checked on every decode)
 *   tokens   key -> P x u32 tokens
 *   chunks   key | u32 chunk (BE) -> u64 xxh3(chunk, seed chunk) | bytes
 *            the layers' blobs laid end to end and cut into equal chunks of
 *            256 pages, so freed runs fit new chunks exactly
 *   nodes    block-hash node -> u32 count of entries whose path passes it
 *   attach   node (DUPSORT) -> u32 P (BE) | u64 tail hash | key
 *   lru      u64 use sequence (BE) | key -> ""
 *   pending  key -> u32 pid | u64 process start | u64 created | u64 bytes:
 *            a staged publish in progress; its chunks exist, its record not yet
 *   blocks, blockrefs
 *            MLA rows stored once, shared by the entries whose prefix holds
 *            them, reference-counted (store/blocks.h); an entry's chunks hold
 *            the rest of its bytes, its record says which blocks it uses
 *
 * Format 2. A format-1 store (no blocks) is upgraded when opened to write,
 * in the open's transaction; its entries read as sharing nothing.
 *
 * Longest-prefix lookup hashes the prompt in blocks (prefix.h), binary-searches
 * the deepest node present, then checks the entries attached at and above it,
 * deepest first, comparing tokens one by one. Nothing is scanned or rebuilt
 * at open.
 *
 * The implementation is under src/store/, in layers that call only down
 * (store/env.h draws them): this header is the top layer's contract, one
 * section per file (open, models, publish, staged, lookup, restore, admin).
 *
 * Thread safety: any thread may call any function; LMDB serialises writers. */
#ifndef K3_STORE_H
#define K3_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

#define STORE_KEY_LEN        32
#define STORE_FORMAT_VERSION 2u
/* LMDB's reader table: each read transaction open at once in any process
 * (a lookup, a streaming restore, a direct reader's call or view, a
 * k3cachectl command) holds one slot; past it, reads fail. */
#define STORE_MAX_READERS 512

/* When store_open walks the data file's structure (store/walk.h) before
 * LMDB reads a page of it. */
enum store_check {
	STORE_CHECK_ALWAYS = 0, /* at every open */
	STORE_CHECK_UNCLEAN,    /* after an unclean stop only (a marker left behind) */
	STORE_CHECK_NEVER,      /* not at all: a damaged file can crash the process */
};

enum store_durability {
	STORE_SAFE = 0, /* MDB_NOMETASYNC: a power loss may drop the last commit */
	STORE_STRICT,   /* full sync on every commit */
	STORE_FAST,     /* MDB_NOSYNC; store_sync() from a timer */
};

struct store_options {
	uint64_t max_bytes; /* capacity for blob bytes; 0: 1 GiB */
	uint64_t map_size;  /* LMDB map size; 0: derived from max_bytes */
	enum store_durability durability;
	uint64_t stage_bytes;    /* a publish larger than this is written in stages of about
	                            this size (store/staged.c); 0: 16 MiB */
	int read_only;           /* open an existing store without writing */
	uint32_t row_block;      /* rows per shared MLA block of a new store (a multiple of
	                            16, at most 65536); 0: 64. A store keeps its own. */
	enum store_check check;  /* the structural walk at open */
	uint64_t (*clock)(void); /* unix seconds; NULL: the real clock (tests set it) */
};

struct store;

/* Parses "safe", "strict" or "fast". Returns 0 or -1. */
int store_durability_parse(const char *s, enum store_durability *out);
const char *store_durability_name(enum store_durability d);

/* Parses "always", "unclean" or "never". Returns 0 or -1. */
int store_check_parse(const char *s, enum store_check *out);

/* Opens (or, unless read_only, creates) the store in dir.
 *
 * Before LMDB reads a tree page, the structure of the snapshot it will open
 * is walked in a child process (options.check; store/walk.h). A damaged
 * file is refused with STATUS_CORRUPT and a message naming the problem and
 * `k3cachectl --db DIR salvage --to NEWDIR`; nothing is written to it.
 *
 * An open to write leaves a marker, DIR/running.PID, that store_close
 * removes. A marker of a process that is gone means an unclean stop: the
 * open removes it, and checks the structure even under STORE_CHECK_UNCLEAN.
 *
 * One process has one LMDB environment of a store (store/envshare.h): a
 * read-only open of a store the process has open already shares it and
 * runs no check of its own (the first open's options.check stands: a
 * direct reader's is STORE_CHECK_NEVER), and a read-write one is refused
 * (STATUS_INVALID).
 * The environment is closed by the last store_close. A child after fork()
 * must not use its parent's stores; its store_close of one frees memory
 * only, and its own opens make environments of its own. */
enum status_code store_open(const char *dir, const struct store_options *opt, struct store **out,
                            struct status *st);
/* Writes batched last-used times, then closes. NULL is a no-op. */
void store_close(struct store *s);

/* ---- models ---- */

/* Stores a spec (idempotent by fingerprint). *created (may be NULL) says
 * whether it was new. */
enum status_code store_put_model(struct store *s, const struct k3cache_model *spec, int *created,
                                 struct status *st);
/* Returns a copy of the spec (caller frees with model_free), or NULL with
 * UNKNOWN_MODEL. */
struct k3cache_model *store_get_model(struct store *s, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                                      struct status *st);
/* Whether a spec is stored under this fingerprint, readable or not (a put
 * of the spec repairs a damaged one). */
int store_model_stored(struct store *s, const uint8_t fp[MODEL_FINGERPRINT_LEN]);

/* Calls fn for every stored spec; stops early when fn returns non-zero. A
 * spec that no longer decodes to its fingerprint (damaged on disk) is
 * skipped, counted in *damaged and in models_damaged, so that one damaged
 * spec does not hide the others. */
enum status_code store_list_models(struct store *s,
                                   int (*fn)(const struct k3cache_model *spec, void *ctx),
                                   void *ctx, uint64_t *damaged, struct status *st);

/* ---- publish ---- */

struct store_segment {
	const unsigned char *data;
	size_t len;
};

/* An MLA layer made by store_delta_assemble() from its base entry's rows (in
 * the map) and the delta's, without copying either: the seed's blob is head,
 * the k rows' pieces, vcount, the v rows' pieces. */
struct store_rows {
	unsigned char head[9];   /* tag, seq_len, k count */
	unsigned char vcount[4]; /* v count */
	const struct store_segment *k, *v;
	uint32_t n_k, n_v;
	/* The base's shared blocks among these rows: block b < n_known (of
	 * row_block rows) with bit b of known set is a block the base entry
	 * uses, so while the base is stored it holds exactly these rows. */
	const uint8_t *base; /* the base entry's key */
	const unsigned char *known;
	uint32_t n_known, row_block;
	uint64_t base_sum; /* the base's layer, whole: the blocks are its */
	/* The request's own bytes of this layer: its new k rows, then its new
	 * v rows (fresh_k + fresh_v bytes at fresh), from row first_row on. */
	const unsigned char *fresh;
	uint64_t fresh_k, fresh_v;
	uint32_t first_row, k_row, v_row; /* k_row, v_row: floats a row */
	const uint8_t *base_key;          /* the base entry */
	/* Assembled before the fresh bytes arrived (store_delta_assemble_unread):
	 * a staged publish's scan checks them (finite, then the whole blob's sum
	 * against the store_blob's xxh3) as they come. */
	int unread;
};

struct store_blob {
	const void *data;
	uint64_t size;
	uint64_t xxh3; /* checksum_blob(data, size, layer); 0: not given, computed */
	/* NULL; or, from store_delta_assemble() only, the layer in pieces (data
	 * NULL), checked there already: its xxh3 is the whole blob's */
	const struct store_rows *rows;
};

struct store_publish_req {
	const uint8_t *fingerprint; /* 32 bytes */
	const void *salt;
	size_t salt_len;
	const uint32_t *tokens;
	uint32_t n_tokens;              /* P >= 1 */
	const struct store_blob *blobs; /* one per layer of the model, in index order */
	uint32_t n_blobs;
};

struct store_publish_res {
	uint8_t key[STORE_KEY_LEN];
	int created;      /* 0: the entry existed already; nothing was written */
	uint64_t bytes;   /* blob bytes of the entry */
	uint32_t evicted; /* entries evicted to make room */
	/* A delta's assembled layer did not hash to its given sum: the worker
	 * should publish whole (store_delta_assemble's *refused, found late). */
	int delta_refused;
	/* BUSY because another publish of the same entry is in progress (it
	 * may store the entry), not for want of a resource */
	int in_progress;
};

/* Validates every blob against the model (slot, shape, seq_len == P, finite,
 * checksum when given) and stores the entry whole, or nothing. An entry up to
 * options.stage_bytes is written in one transaction; a larger one in stages
 * under a pending row and made visible by a last transaction (see the staged
 * publish below), so that lookups see it whole or not at all either way.
 * Evicts least-recently-used entries first when over capacity. */
enum status_code store_publish(struct store *s, const struct store_publish_req *req,
                               struct store_publish_res *res, struct status *st);

/* The same for several requests sharing one commit. Each gets its own result
 * and status; returns OK when all succeeded, otherwise the first failure. */
enum status_code store_publish_batch(struct store *s, const struct store_publish_req *reqs,
                                     struct store_publish_res *res, struct status *sts, uint32_t n);

/* ---- staged publish, its bytes still arriving (store/staged.c) ----
 *
 * A snapshot larger than the stage size is written in short transactions
 * (each about options.stage_bytes of chunks) under a pending row, and made
 * visible whole by a last one; store_publish() does this by itself. A server
 * receiving such a snapshot can begin before its bytes are all in: a helper
 * thread checks each layer piecewise (slot, shape, seq_len, finite,
 * checksum) as its bytes arrive, and the writer writes the stages of bytes
 * so read. Nothing is visible to lookups before the end, and only once every
 * layer passed. A crash leaves a pending row and chunks, which the next open
 * removes.
 *
 * The payload is the bytes the caller supplies: each layer's blob, or for a
 * delta's assembled layer (store_blob.rows) only its fresh rows, layer after
 * layer; the base's rows come from the map and are always in place. With a
 * window (its size in bytes; 0: none) the payload lies end to end in one
 * buffer of which only that many bytes need be in memory: payload bytes
 * before store_stage_consumed() are never read again, so the caller may
 * drop them, and each byte is read only after `arrived` said it is in.
 * The writer writes whole stages while the window has room, and whatever
 * is ready once it is two thirds full, so a window of three stages (each at
 * least one chunk) always moves.
 *
 *   begin    on the writer's thread: checks P, salt, model, layer count and
 *            size; makes room; records the pending row. The request (its
 *            blobs pointing into the buffer being filled) must stay valid
 *            until end. *out is NULL when the entry exists (res->created 0).
 *            notify(ctx) is called from the helper thread whenever step may
 *            make progress.
 *   arrived  any thread: payload bytes [0, bytes) are in place.
 *   cancel   any thread: the rest will never arrive.
 *   step     the writer: writes up to max_stages ready stages (0: all).
 *   wait     blocks until step may make progress.
 *   end      the writer: commits the entry (when READY) or removes what was
 *            written; frees the stage. */
#define STORE_STAGE_WAIT   0 /* nothing to write until notify */
#define STORE_STAGE_MORE   1 /* more stages are ready: call again */
#define STORE_STAGE_READY  2 /* every stage written and every layer valid: end */
#define STORE_STAGE_FAILED 3 /* a layer failed, a write failed or cancelled: end */

struct store_stage;

/* window (0: every byte stays in place) is the caller's receive window in
 * bytes, K3D_WINDOW_STAGES (3) stages of window / 3 aligned on the payload:
 * a publish whose block part could not be placed through it (one spanning
 * more than two stages) is refused INVALID at begin, saying the stage size
 * it needs, as it would otherwise wait for ever. */
enum status_code store_stage_begin(struct store *s, const struct store_publish_req *req,
                                   uint64_t window, void (*notify)(void *ctx), void *ctx,
                                   struct store_stage **out, struct store_publish_res *res,
                                   struct status *st);
void store_stage_arrived(struct store_stage *g, uint64_t bytes);
void store_stage_cancel(struct store_stage *g);
int store_stage_step(struct store_stage *g, uint32_t max_stages);
void store_stage_wait(struct store_stage *g);
enum status_code store_stage_end(struct store_stage *g, struct store_publish_res *res,
                                 struct status *st);
/* The writer, after a step: blob bytes [0, consumed) are never read again
 * (UINT64_MAX once the publish has failed: none is). */
uint64_t store_stage_consumed(struct store_stage *g);
/* The store's stage size: a publish larger than this is staged. */
uint64_t store_stage_bytes(const struct store *s);
/* What a publish's header alone can be refused for, checked before its
 * payload arrives: P and the salt, the model (stored?) and its layer count,
 * and the layer sizes' sum against the capacity (of a delta, the sizes it
 * sends, which its entry only adds to). STATUS_OK or the code and message
 * store_publish would give for it later. Reads only; any thread. */
enum status_code store_publish_precheck(struct store *s, const struct store_publish_req *req,
                                        struct status *st);

/* Entries evicted since open to make room for publishes (least recently
 * used first), and the bytes that freed: for the daemon's log. */
void store_room_evictions(struct store *s, uint64_t *entries, uint64_t *bytes);

/* ---- delta publish (store/delta.c) ----
 *
 * A worker that resumed from a stored entry sends only what is new: its
 * request's MLA layers carry rows [base_rows, P) (k rows, then v rows, raw
 * floats, no header words), every other layer whole. store_delta_assemble()
 * makes the whole blobs from the base entry and the request, to publish
 * with store_publish(): the base must be stored (and served) under the same
 * model and salt, hold a prefix of the same tokens, and at least base_rows
 * rows; each assembled MLA blob must hash to the request's xxh3 (the whole
 * blob's, given for every MLA layer), and its new rows be finite. Otherwise
 * the delta is refused (*refused set, the status saying why): the worker
 * publishes whole. Nothing is copied: an assembled layer is its base's rows
 * in the map (a read transaction held until store_delta_free()) and the
 * request's, as pieces (store_blob.rows), so a delta's memory and work grow
 * with its new rows, not with the rows it did not send. A snapshot larger
 * than the stage size is then staged, sharing its blocks as any other. */
struct store_delta {
	struct store_blob *blobs; /* every layer (the request's own, or assembled) */
	uint32_t n_blobs;
	struct store_rows *rows;       /* the assembled layers' pieces */
	unsigned char *known;          /* the base's map, copied */
	struct store_segment **pieces; /* per layer, owned */
	struct store_snapshot *base;   /* the base's rows, in the map */
	uint8_t base_key[STORE_KEY_LEN];
};
enum status_code store_delta_assemble(struct store *s, const struct store_publish_req *req,
                                      const uint8_t base[STORE_KEY_LEN], uint32_t base_rows,
                                      struct store_delta *out, int *refused, struct status *st);
/* The same for a delta whose bytes have not arrived yet (a streamed publish
 * read through a window, store_stage_begin): the request's pointers and
 * sizes are used, never its bytes. Everything that needs only the base and
 * the request's header is checked here; each fresh layer is marked unread
 * (store_rows.unread), and the staged publish's scan checks its new rows
 * (finite) and the assembled blob's sum piecewise as they arrive. A sum
 * that does not match ends the publish with res->delta_refused set; the
 * base is then checked whole (and taken out of service if damaged), as
 * here. Such a delta can only be published staged, through
 * store_stage_begin(). */
enum status_code store_delta_assemble_unread(struct store *s, const struct store_publish_req *req,
                                             const uint8_t base[STORE_KEY_LEN], uint32_t base_rows,
                                             struct store_delta *out, int *refused,
                                             struct status *st);
/* The answer to a delta refused because an assembled layer did not hash to
 * its given sum (message: store_check_delta_sum's, naming the layer): the
 * worker's rows (or its sum) are wrong, or the base's stored rows are
 * damaged, and the sum alone cannot tell which. So every piece of the base
 * is checked against its own stored checksum, as a restore does: a damaged
 * one takes the base (and every entry that uses a damaged block) out of
 * service, is counted as damage (stats.corrupt, stats.quarantined), and the
 * answer is CORRUPT, naming it; when every piece holds its sum, INVALID
 * (the worker's mistake); when the base cannot be checked (gone meanwhile,
 * out of memory), INVALID saying so. Either way the delta stays refused:
 * the worker publishes whole. */
enum status_code store_delta_sum_refused(struct store *s, const uint8_t base[STORE_KEY_LEN],
                                         const char *message, struct status *st);
void store_delta_free(struct store_delta *d);

/* ---- lookup and restore ---- */

struct store_lookup_req {
	const uint8_t *fingerprint;
	const void *salt;
	size_t salt_len;
	const uint32_t *tokens;
	uint32_t n_tokens;
	uint32_t limit; /* largest usable P; 0: N-1 (one token left to feed) */
	int quiet;      /* neither counted nor a use: store_lookup_count() may follow */
};

struct store_lookup_res {
	uint32_t prefix_len; /* P; 0 on a miss */
	uint8_t key[STORE_KEY_LEN];
	uint64_t bytes;
	uint32_t hint; /* the junction: the largest block boundary at which the
	                  prompt still follows a stored path */
};

/* Longest stored prefix of the prompt with P <= limit, its tokens compared one
 * by one. A miss is OK with prefix_len 0. A hit counts as a use. */
enum status_code store_lookup(struct store *s, const struct store_lookup_req *req,
                              struct store_lookup_res *res, struct status *st);
/* Counts a quiet lookup's result as store_lookup() would have (a hit or a
 * miss; a hit is a use). */
void store_lookup_count(struct store *s, const struct store_lookup_res *res);

struct store_layer {
	uint32_t index;
	uint8_t tag; /* blob tag: 1 KDA, 2 MLA */
	uint64_t size;
	uint64_t xxh3;
	uint32_t n_segments;
	struct store_segment *segments; /* the blob, in order, inside the map */
};

/* A restored entry: zero-copy views inside a read transaction that lives until
 * store_snapshot_release(). Every chunk's checksum has been verified. */
struct store_snapshot {
	uint8_t key[STORE_KEY_LEN];
	uint8_t fingerprint[MODEL_FINGERPRINT_LEN];
	uint32_t prefix_len;
	uint32_t n_layers;
	uint64_t bytes;
	struct store_layer *layers;
	struct store_snapshot_priv *priv;
};

/* NOT_FOUND when absent or quarantined; CORRUPT (and the entry is
 * quarantined) when a chunk is missing, short or fails its checksum. */
enum status_code store_restore(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_snapshot **out, struct status *st);
void store_snapshot_release(struct store_snapshot *snap);

/* store_restore() with flags:
 *  STORE_RESTORE_USE    it counts as a use (LRU, counters); an operator's
 *                       inspect or export does not;
 *  STORE_RESTORE_DEFER  chunk checksums are not checked now: the caller
 *                       streams the views at once to a client that validates
 *                       every layer itself, and calls store_snapshot_verify()
 *                       (any thread) to find and quarantine damage. It takes
 *                       no write transaction, so it never waits for the
 *                       writer: a chunk missing or short is CORRUPT, and the
 *                       caller quarantines the entry with store_quarantine()
 *                       where a write may wait. */
#define STORE_RESTORE_USE   1u
#define STORE_RESTORE_DEFER 2u
enum status_code store_restore_opt(struct store *s, const uint8_t key[STORE_KEY_LEN],
                                   unsigned flags, struct store_snapshot **out, struct status *st);

/* A restore made elsewhere (a direct reader's, reported to the daemon):
 * one hit and one restore, and the entry's LRU place, as if served here.
 * An absent key is a no-op when the touches are applied. */
void store_note_use(struct store *s, const uint8_t key[STORE_KEY_LEN]);

/* Takes a damaged entry out of service: marks it quarantined (lookups and
 * restores no longer serve it, and a publish of the same snapshot replaces
 * it), or, when its record itself cannot be read (so there is no flag to
 * set), removes it. Takes a write transaction (it waits for the writer lock):
 * call it where a write may wait. Each one done is counted in
 * stats.quarantined. NONE when nothing was done: the store is read-only, the
 * entry is gone or already quarantined, or the write failed. */
enum store_quarantine_result {
	STORE_QUARANTINE_NONE = 0,
	STORE_QUARANTINE_FLAGGED,
	STORE_QUARANTINE_REMOVED,
};
enum store_quarantine_result store_quarantine(struct store *s, const uint8_t key[STORE_KEY_LEN]);

/* Checks every chunk of a snapshot taken with STORE_RESTORE_DEFER; on a
 * mismatch the entry is quarantined and CORRUPT returned. */
enum status_code store_snapshot_verify(struct store_snapshot *snap, struct status *st);

/* The bytes of a snapshot taken with STORE_RESTORE_DEFER as stored: chunk i
 * of store_snapshot_chunks() holds the next part of the blobs back to back,
 * in layer order (the restore payload). store_snapshot_chunk() points *data
 * and *len at chunk i in the map and checks it against its stored sum, so a
 * sender can check each chunk just before it sends it (the bytes are then in
 * the CPU's cache for the send). It takes no write transaction: on a mismatch
 * it returns CORRUPT with the data still set, counts nothing, and the caller
 * runs store_snapshot_verify() where a write may wait, to quarantine. */
uint64_t store_snapshot_chunks(const struct store_snapshot *snap);
enum status_code store_snapshot_chunk(const struct store_snapshot *snap, uint64_t i,
                                      const void **data, size_t *len, struct status *st);

/* ---- administration ---- */

struct store_layer_info {
	uint8_t tag;
	uint64_t size;
	uint64_t xxh3;
};

struct store_entry_info {
	uint8_t key[STORE_KEY_LEN];
	uint8_t fingerprint[MODEL_FINGERPRINT_LEN];
	uint8_t *salt;
	uint32_t salt_len;
	uint32_t prefix_len;
	uint32_t n_layers;
	uint64_t bytes;       /* the blobs whole (a restore's payload) */
	uint64_t stored;      /* in the entry's own chunks; the rest is shared blocks */
	uint64_t mla_rows;    /* MLA layers x P */
	uint64_t shared_rows; /* of them, rows in shared blocks */
	uint64_t created;     /* unix seconds */
	uint64_t last_used;   /* unix seconds */
	uint64_t hits;
	int quarantined;
	struct store_layer_info *layers;
	uint32_t *tokens; /* store_inspect only; NULL from store_list */
};

void store_entry_info_free(struct store_entry_info *info);

/* Entries in key order after `after` (NULL: from the start), optionally only
 * one model's; at most `limit` (0: all). fn gets an info it must not keep;
 * a non-zero return stops. */
enum status_code store_list(struct store *s, const uint8_t *model_fp, const uint8_t *after,
                            uint32_t limit,
                            int (*fn)(const struct store_entry_info *info, void *ctx), void *ctx,
                            struct status *st);

/* One entry with its tokens and layers (caller frees). NOT_FOUND if absent.
 * An entry whose tokens record is missing or of the wrong size (damaged) is
 * answered with tokens NULL. */
enum status_code store_inspect(struct store *s, const uint8_t key[STORE_KEY_LEN],
                               struct store_entry_info **out, struct status *st);
/* The same without the tokens (NULL): who an entry belongs to, and whether
 * it is there, without copying a token list of up to 400 KB. */
enum status_code store_inspect_record(struct store *s, const uint8_t key[STORE_KEY_LEN],
                                      struct store_entry_info **out, struct status *st);

/* Resolves a hex key prefix (at least 1 digit) to the one key it names.
 * NOT_FOUND when none does; INVALID when several do (the message lists them). */
enum status_code store_resolve_key(struct store *s, const char *hex, uint8_t key[STORE_KEY_LEN],
                                   struct status *st);

struct store_evict_req {
	const uint8_t (*keys)[STORE_KEY_LEN]; /* these entries */
	uint32_t n_keys;
	const uint8_t *model;  /* every entry of this model */
	uint64_t idle_seconds; /* unused for longer than this (0: not this selector) */
	int to_bytes_set;      /* least recently used first, down to to_bytes */
	uint64_t to_bytes;
	int all;
	int dry_run; /* report what would go, change no entry */
};

struct store_evict_res {
	uint32_t entries;
	uint64_t bytes; /* stored bytes freed (a dry run: that would be), the shared
	                   blocks that go with the last entry using them included */
};

/* Evicts by exactly one selector. fn (may be NULL) is told each key and the
 * bytes its eviction frees. A dry run reports the same entries, in the same
 * order, with the same bytes, as the real evict would at that moment, by the
 * same code (store/dry.h), and writes nothing: it reads in a read-only
 * transaction, so a map that is full does not stop it, and takes the uses
 * held in memory, which the real evict writes first, into the LRU order and
 * the last uses (--idle) as they would be written, leaving them pending. */
enum status_code store_evict(struct store *s, const struct store_evict_req *req,
                             void (*fn)(const uint8_t key[STORE_KEY_LEN], uint64_t bytes,
                                        void *ctx),
                             void *ctx, struct store_evict_res *res, struct status *st);

/* Re-checks every entry's record, tokens, chunk sums, shared blocks and layer
 * sums, then the shared blocks themselves: each reference count against the
 * entries that use the block, both parts whole, no part without a count. fn
 * (may be NULL) is told each damaged key with the reason, which ends with
 * what happened to it: damaged entries are quarantined (so a damaged shared
 * block takes every entry that uses it out of service), unless the store is
 * read-only (then the reason says so and what to run). Entries quarantined
 * earlier count as damaged. A problem of the blocks themselves goes to fn
 * with a NULL key and counts in *damaged too; it is reported, not repaired.
 * Takes write transactions (the quarantines). */
enum status_code store_verify(struct store *s,
                              void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why,
                                         void *ctx),
                              void *ctx, uint64_t *checked, uint64_t *damaged, struct status *st);

/* The same verify in steps, so that a daemon's other writes run between
 * them: store_verify_begin() lists the entries (one read transaction);
 * each store_verify_step() checks the next of them until about `budget`
 * bytes have been read (at least one entry), and once none are left the
 * shared blocks and the indexes, and sets *done. Entries published after
 * the begin are not checked; those evicted meanwhile are not counted.
 * fn is as for store_verify(). A step that cannot check an entry (memory
 * ran out) returns that error and quarantines nothing for it; the verify
 * ends there. store_verify_end() frees the walk (NULL: nothing). */
struct store_verify;
enum status_code store_verify_begin(struct store *s, struct store_verify **out, struct status *st);
enum status_code store_verify_step(struct store_verify *v, uint64_t budget,
                                   void (*fn)(const uint8_t key[STORE_KEY_LEN], const char *why,
                                              void *ctx),
                                   void *ctx, int *done, struct status *st);
void store_verify_counts(const struct store_verify *v, uint64_t *checked, uint64_t *damaged);
/* Entries still to check. */
uint64_t store_verify_left(const struct store_verify *v);
/* Bytes of the listed entries checked so far, of *total (their sizes). */
void store_verify_progress(const struct store_verify *v, uint64_t *done, uint64_t *total);
void store_verify_end(struct store_verify *v);

/* ---- salvage (store/salvage.c) ---- */

struct store_salvage_res {
	uint64_t txnid;          /* of the snapshot read */
	uint64_t problems;       /* damaged pages and nodes stepped around */
	char first_problem[256]; /* the first of them */
	uint64_t entries;        /* records found */
	uint64_t saved;          /* entries copied */
	uint64_t models;         /* model specs copied */
};

/* Copies every entry of the store in `from` that verifies (its record, its
 * tokens, its key as the SHA-256 of its model, salt and tokens, every
 * chunk's and block's XXH3, and each layer's checks as at publish) into a
 * new store in `to`, which must not hold one. The damaged store is read
 * without LMDB and never written. lost(key, why) is called for each record
 * found that is not saved, including one of 256 MiB or more that cannot be
 * held in memory whole (each is copied whole, then published). Running out of memory otherwise,
 * or failing to write the new store, stops it with that error instead: no
 * entry is given up for what is not its fault. Needs free space for about twice what is saved:
 * a scratch copy, to/salvage.tmp, is removed at the end. */
enum status_code store_salvage(const char *from, const char *to,
                               void (*lost)(const uint8_t *key, const char *why, void *ctx),
                               void *ctx, struct store_salvage_res *res, struct status *st);

struct store_stats {
	uint64_t entries;
	uint64_t bytes;             /* stored: the entries' own chunks and the shared blocks */
	uint64_t logical_bytes;     /* what the entries would take whole (restore payloads) */
	uint64_t blocks;            /* shared MLA row blocks */
	uint64_t blocks_mismatched; /* since open: blocks kept private, their bytes differing */
	uint64_t models_repaired;   /* since open: damaged specs replaced by a put of the same */
	uint64_t models_damaged;    /* since open: damaged specs found and skipped */
	uint64_t indexes_rebuilt;   /* since open: verify made the indexes again */
	uint32_t row_block;         /* rows per shared block */
	uint64_t models;
	uint64_t max_bytes;
	/* since open */
	uint64_t hits, misses, hit_tokens, publishes, publish_exists, evictions, quarantined,
	        restores, corrupt, map_full_retries;
	/* the map */
	uint64_t map_size, map_used_pages, free_pages, page_size, file_bytes;
	/* staged publishes (store/staged.c) */
	uint64_t staging; /* in progress now */
	uint64_t swept;   /* left unfinished by a dead process, removed at open */
	uint64_t chunks;  /* chunk rows, staged or committed */
	/* the open */
	int unclean_stop;       /* the last process to write it did not close it */
	int checked;            /* its structure was walked */
	uint64_t check_ms;      /* how long the walk took */
	uint64_t checked_pages; /* pages the snapshot has */
};

enum status_code store_get_stats(struct store *s, struct store_stats *out, struct status *st);

/* Writes batched last-used times and hit counts. */
enum status_code store_flush(struct store *s, struct status *st);

/* Forces the data to disk (for `fast` durability). */
enum status_code store_sync(struct store *s, struct status *st);

/* The identity of the store's data file on this host (st_dev, st_ino of
 * data.mdb, from the open file): two opens of one store give the same. 0, or
 * -1 when the file cannot be asked. */
int store_file_id(const struct store *s, uint64_t *dev, uint64_t *ino);

/* A read-only store whose file has grown past this process's map of it (a
 * daemon restarted with a larger --max-bytes writes beyond the map size it
 * had when the store was opened here; reads then fail with
 * MDB_MAP_RESIZED, answered BUSY) is mapped whole again. Only when nothing
 * else in the process reads through its environment: this open alone uses
 * it, with no snapshot held, and the caller holds no transaction. With
 * several opens of it in the process, every other one must be closed
 * first. 1: mapped again; 0: not needed (or a writer's store); -1: it
 * cannot be now; -2: the new map failed (out of address space, say), and
 * LMDB, which unmaps first, left none: nothing may read through the store
 * any more, only store_close it. */
int store_remap(struct store *s);

/* Checks for readers left by dead processes; returns how many were cleared. */
int store_reader_check(struct store *s);

#endif
