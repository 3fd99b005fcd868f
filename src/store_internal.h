/* store_internal: what the store's files share. Not for use outside src/store*. */
#ifndef K3_STORE_INTERNAL_H
#define K3_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>

#include "prefix.h"
#include "store.h"

/* A chunk value is an 8-byte XXH3 of its data (seed: chunk number) followed by
 * the data. 1 MiB - 16 bytes of value fill 256 pages exactly (LMDB adds a
 * 16-byte header to an overflow run). */
#define STORE_CHUNK_VALUE   (1048576u - 16u)
#define STORE_CHUNK_DATA    (STORE_CHUNK_VALUE - 8u)
#define STORE_CHUNK_KEY_LEN (STORE_KEY_LEN + 4)

/* Tail hash of an attach record: XXH3-64 of tokens [depth*B, P). */
#define STORE_ATTACH_LEN (4 + 8 + STORE_KEY_LEN)

#define STORE_FLAG_QUARANTINED 1u

/* The longest salt a publish may carry; a record with a longer one is
 * damaged. */
#define STORE_MAX_SALT 1024u

/* The decoded entry record. */
struct store_record {
	uint8_t key[STORE_KEY_LEN];
	uint8_t fingerprint[MODEL_FINGERPRINT_LEN];
	uint32_t prefix_len;
	uint32_t n_layers;
	uint32_t flags;
	uint64_t created;
	uint64_t last_used;
	uint64_t lru_seq;
	uint64_t hits;
	uint64_t bytes;
	uint32_t salt_len;
	const uint8_t *salt;         /* points into the encoded record */
	const unsigned char *layers; /* n_layers x (u8 tag | u64 size | u64 xxh3) */
};

#define STORE_RECORD_LAYER_LEN 17u

/* Encoded size of a record with these counts. */
size_t store_record_size(uint32_t salt_len, uint32_t n_layers);
/* Encodes r (with layer triples from tags/sizes/sums) into out. */
void store_record_encode(const struct store_record *r, const uint8_t *tags, const uint64_t *sizes,
                         const uint64_t *sums, unsigned char *out);
/* Decodes and checks a record read from disk. -1 when damaged. */
int store_record_decode(const void *data, size_t len, struct store_record *r);
/* Layer i of a decoded record. */
void store_record_layer(const struct store_record *r, uint32_t i, uint8_t *tag, uint64_t *size,
                        uint64_t *sum);
/* Rewrites the mutable fields (flags, last_used, lru_seq, hits) of an encoded record in place. */
void store_record_patch(unsigned char *enc, const struct store_record *r);

struct store_touch {
	uint8_t key[STORE_KEY_LEN];
	uint64_t seq;
	uint64_t when;
	uint64_t hits;
};

struct store {
	MDB_env *env;
	MDB_dbi meta, models, entries, tokens, chunks, nodes, attach, lru, pending;
	int has_pending; /* a read-only open of an older store may lack it */
	struct store_options opt;
	char *dir;

	pthread_mutex_t mu; /* guards the fields below */
	struct store_touch *touches;
	size_t n_touches, cap_touches;
	struct model_cache_entry *model_cache;
	size_t n_models_cached;
	uint8_t (*live)[STORE_KEY_LEN]; /* keys with a staged publish in progress here */
	size_t n_live, cap_live;

	atomic_uint_fast64_t lru_clock;
	atomic_int open_snapshots;
	uint32_t swept_at_open;             /* unfinished staged publishes removed at open */
	atomic_uint_fast64_t staging_bytes; /* chunks written by staged publishes in progress */
	atomic_uint_fast64_t hits, misses, hit_tokens, publishes, publish_exists, evictions,
	        quarantined, restores, corrupt, map_full_retries;
};

struct model_cache_entry {
	uint8_t fp[MODEL_FINGERPRINT_LEN];
	struct model_spec *spec;
};

uint64_t store_now(const struct store *s);

/* Maps an LMDB error to a status. */
enum status_code store_mdb_error(struct status *st, int rc, const char *what);

/* meta "totals": entry bytes and the LRU clock. */
struct store_totals {
	uint64_t bytes;
	uint64_t lru_clock;
};
int store_totals_get(struct store *s, MDB_txn *txn, struct store_totals *t);
int store_totals_put(struct store *s, MDB_txn *txn, const struct store_totals *t);

/* Big-endian helpers for keys that must sort. */
void store_be32(unsigned char *p, uint32_t v);
uint32_t store_get_be32(const unsigned char *p);
void store_be64(unsigned char *p, uint64_t v);
uint64_t store_get_be64(const unsigned char *p);

/* Deletes every chunk stored under key (an entry's, or an unfinished staged
 * publish's), whatever their number. Adds their data bytes to *bytes when
 * bytes is not NULL. */
int store_delete_chunks(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes);

/* Deletes one entry and everything it owns inside txn (nodes, attach, lru,
 * tokens, chunks) and subtracts its bytes from *totals. */
int store_delete_entry(struct store *s, MDB_txn *txn, const struct store_record *r,
                       struct store_totals *totals);

/* The data bytes of the chunks stored under key (what deleting them frees). */
int store_chunk_bytes(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes);

/* Deletes an entry whose record cannot be decoded (so neither its size nor
 * its prefix-index rows can be known): the record, its tokens and its chunks.
 * Then sets totals->bytes again from the records that decode, so no byte of
 * the damaged entry stays counted. Its node counts and attach row stay: they
 * only locate candidates, and a lookup confirms each against a record. */
int store_delete_damaged(struct store *s, MDB_txn *txn, const uint8_t *key,
                         struct store_totals *totals);

/* Records a use. Held in memory and written by the next write transaction or
 * store_flush(); when the buffer is full, uses are dropped until then (the LRU
 * order is then approximate, never wrong about what exists). */
void store_touch(struct store *s, const uint8_t key[STORE_KEY_LEN], uint64_t hits);

/* Evicts least-recently-used entries inside txn until totals->bytes <= target
 * or nothing is left. Reports each to fn. Returns an LMDB code. */
int store_evict_lru(struct store *s, MDB_txn *txn, struct store_totals *totals, uint64_t target,
                    int dry_run, void (*fn)(const uint8_t *key, uint64_t bytes, void *ctx),
                    void *ctx, uint32_t *n_evicted);

/* Writes pending touches inside txn. */
int store_apply_touches(struct store *s, MDB_txn *txn);

/* Reads a record by key inside txn. MDB_NOTFOUND, 0, or -1 (damaged). */
int store_read_record(struct store *s, MDB_txn *txn, const uint8_t key[STORE_KEY_LEN],
                      struct store_record *r);

/* Tail hash for attach records. */
uint64_t store_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to);

/* Not LMDB codes: the map is full of pages pinned by open restores. */
#define STORE_MAP_PINNED     (-30000)
#define STORE_MAP_FULL_TRIES 64

/* Copies bytes [off, off+len) of the request's layers laid end to end. */
void store_copy_stream(const struct store_publish_req *r, uint64_t off, unsigned char *dst,
                       size_t len);

/* Writes an entry's record, tokens, prefix index and LRU row (not its chunks)
 * and adds its bytes to *totals. MDB_KEYEXIST when the record exists. */
int store_write_index(struct store *s, MDB_txn *txn, const struct store_publish_req *r,
                      const uint8_t *key, uint64_t bytes, const uint8_t *tags,
                      const uint64_t *sizes, const uint64_t *sums, struct store_totals *totals);

/* Evicts in its own transactions until `need` more bytes fit (force: after a
 * MAP_FULL, free `need` more than now; MDB_MAP_FULL when nothing is left). */
int store_make_room(struct store *s, uint64_t need, uint32_t *evicted, int force);

/* Checks what a publish needs before its bytes: P, the salt, the model and
 * its layer count, the size against the capacity. Fills *model (the caller
 * frees it), *total and the key. */
enum status_code store_check_publish(struct store *s, const struct store_publish_req *r,
                                     struct model_spec **model, uint64_t *total,
                                     uint8_t key[STORE_KEY_LEN], struct status *st);

/* Checks layer i of a publish against the model (slot, shape, seq_len, finite;
 * blob_check_sum) and against its given checksum, if any. 0 with *sum set, or
 * -1 with the message naming the layer. */
int store_check_layer(const struct store_publish_req *r, const struct model_spec *m, uint32_t i,
                      uint64_t *sum, char message[STATUS_MESSAGE_MAX]);

/* The status of a failed write: STORE_MAP_PINNED is BUSY, MDB_MAP_FULL FULL. */
enum status_code store_write_status(struct store *s, int rc, struct status *st);

/* store_staged.c: the whole of a staged publish, every byte in place. */
enum status_code store_publish_staged(struct store *s, const struct store_publish_req *r,
                                      struct store_publish_res *res, struct status *st);

/* 1 when a staged publish of key is in progress (its pending row is live):
 * a one-transaction publish of the same key must not write its chunks. */
int store_key_staging(struct store *s, MDB_txn *txn, const uint8_t *key);

/* Removes the pending rows (and their chunks) of staged publishes whose
 * process is gone. Counts them in *swept. */
int store_sweep_staged(struct store *s, MDB_txn *txn, uint32_t *swept);

/* Fills an info from a record (salt and layers copied). */
int store_info_from_record(const struct store_record *r, struct store_entry_info *info);

#endif
