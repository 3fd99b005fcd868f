/* env: the handle every layer of the store shares, and the small helpers
 * under all of them. Not for use outside src/store/.
 *
 * The store is built in layers, and calls only go down:
 *   top     open, publish, staged, lookup, restore, admin (the API of
 *           src/store.h, one section each)
 *   middle  check (a publish against its model), entry (an entry's rows as
 *           a whole), pending (staged publishes in progress), lru (last uses
 *           and the eviction policy, in one file), txn (write transactions)
 *   bottom  record, chunks, index (the prefix and LRU indexes), models, dry
 *           (what a dry run of an eviction has taken away, in memory)
 *   under   env
 * The MAP_FULL retry lives in lru.c, beside the eviction it needs, so that
 * txn stays below both. Whole-table scans for administration (admin.c) and
 * the stats walk the tables directly.
 * Each file has one header stating its contract. */
#ifndef K3_STORE_ENV_H
#define K3_STORE_ENV_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>

#include "store.h"

#define STORE_FLAG_QUARANTINED 1u
/* The record's private blocks are numbered by their place: block b of the
 * m-th MLA layer is chunks STORE_CHUNK_PRIVATE + 2 (m (P / B) + b) + part.
 * Without it (records written before), by the clear bits in order. */
#define STORE_FLAG_PRIVATE_AT 2u

/* The longest salt a publish may carry; a record with a longer one is
 * damaged. */
#define STORE_MAX_SALT 1024u

/* Not LMDB codes: the map is full of pages pinned by open restores. */
#define STORE_MAP_PINNED     (-30000)
#define STORE_MAP_FULL_TRIES 64

/* Rows per shared MLA block in a new store (store_options.row_block). */
#define STORE_DEFAULT_ROW_BLOCK 64u

struct store_touch {
	uint8_t key[STORE_KEY_LEN];
	uint64_t seq;
	uint64_t when;
	uint64_t hits;
};

struct model_cache_entry {
	uint8_t fp[MODEL_FINGERPRINT_LEN];
	struct k3cache_model *spec;
};

struct store {
	MDB_env *env;
	MDB_dbi meta, models, entries, tokens, chunks, nodes, attach, lru, pending, blocks,
	        blockrefs, held;
	int has_pending;    /* a read-only open of an older store may lack it */
	int has_blocks;     /* the same (a format-1 store) */
	int has_held;       /* the same */
	uint32_t row_block; /* B: rows per shared MLA block (meta "rowblock") */
	int upgraded;       /* this open upgraded a format-1 store */
	int unmapped;       /* store_remap failed: LMDB left no map (only store_close) */
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
	uint32_t swept_at_open;    /* unfinished staged publishes removed at open */
	char *marker;              /* DIR/running.PID of an open to write */
	int unclean_stop, checked; /* the open's structural check (store_stats) */
	uint64_t check_ms, checked_pages;
	atomic_uint_fast64_t staging_bytes; /* chunks written by staged publishes in progress */
	atomic_uint_fast64_t hits, misses, hit_tokens, publishes, publish_exists, evictions,
	        quarantined, restores, corrupt, map_full_retries, blocks_mismatched,
	        models_repaired, models_damaged, indexes_rebuilt;
	/* evictions to make room (lru.c), and the bytes they freed */
	atomic_uint_fast64_t room_evictions, room_evicted_bytes;
};

/* Now, in seconds (options.clock when set). */
uint64_t store_now(const struct store *s);

/* Maps an LMDB error to a status. */
enum status_code store_mdb_error(struct status *st, int rc, const char *what);

/* meta "totals": the bytes stored (the entries' own chunks and the shared
 * blocks: what capacity and eviction count), the LRU clock, and the bytes the
 * entries would take whole (logical). A format-1 store's 16-byte totals read
 * with logical = bytes. */
struct store_totals {
	uint64_t bytes;
	uint64_t lru_clock;
	uint64_t logical;
};
int store_totals_get(struct store *s, MDB_txn *txn, struct store_totals *t);
int store_totals_put(struct store *s, MDB_txn *txn, const struct store_totals *t);

/* Whether a value laid out as u64 XXH3(rest, seed) | rest holds its sum
 * (chunks and block parts). */
int store_value_intact(const MDB_val *v, uint64_t seed);

/* Writes such a value: data and its XXH3 (seed) under key in dbi, with
 * mdb_put flags (MDB_RESERVE is added). */
int store_value_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, const void *data, size_t len,
                    uint64_t seed, unsigned flags);

/* The named databases, in one table: open.c opens them, the walk (walk.h)
 * checks their flags and the sizes of their keys and values (for a DUPSORT
 * table, of each duplicate). A max of 0 is no limit; a value's size is
 * val_min plus a multiple of val_unit. The optional ones may be missing
 * from a store made by an older version. */
struct store_table {
	const char *name;
	size_t dbi;     /* offsetof(struct store, the table's handle) */
	unsigned flags; /* MDB_DUPSORT or 0 */
	size_t has;     /* optional: offsetof(struct store, its has_ flag); else STORE_REQUIRED */
	uint32_t key_min, key_max;
	uint32_t val_min, val_max;
	uint32_t val_unit;
};
#define STORE_REQUIRED SIZE_MAX
extern const struct store_table store_tables[];
extern const size_t store_n_tables;

/* Start time of a process (clock ticks since boot, /proc/PID/stat field 22),
 * or 0 when it does not exist: with the pid, it names a process for good. */
uint64_t store_process_start(long pid);

/* Big-endian helpers for keys that must sort. */
void store_be32(unsigned char *p, uint32_t v);
uint32_t store_get_be32(const unsigned char *p);
void store_be64(unsigned char *p, uint64_t v);
uint64_t store_get_be64(const unsigned char *p);

#endif
