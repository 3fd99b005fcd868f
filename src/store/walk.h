/* walk: a structural check of a store's data file that reads it without
 * LMDB (walk.c), so that no byte of the file can crash the process that
 * checks it. Under env.h: it calls nothing else of the store.
 *
 * LMDB trusts its file. A flipped page number, node size or overflow count
 * sends it outside its pages (SIGSEGV), into an assertion (SIGABRT), or,
 * worse, frees pages that another value still uses, so that the next write
 * aborts or overwrites live data. The walk reads one committed snapshot the
 * way LMDB would and checks, before LMDB touches a tree page:
 *   - the meta page: magic, version, page size, roots and last page in range;
 *   - every branch and leaf page of the free list and of every database:
 *     page number, flags, bounds, node offsets and sizes, the bytes the
 *     nodes take (LMDB packs them exactly), key order within the page,
 *     depth, and each tree's page and item counts as its MDB_db states them;
 *   - every overflow run's header: its page number, its flag, and a page
 *     count that covers its value (LMDB keeps a longer run when it rewrites
 *     a value shorter in place; the run's pages are all marked, so one that
 *     claims pages in use is caught); the data itself has its own XXH3,
 *     which store verify checks;
 *   - that every page up to the last is reached exactly once, by a tree or
 *     by the free list (a page reached twice is one LMDB would give out
 *     while it is still in use);
 *   - the named databases k3cache opens, their flags, and the sizes of
 *     their keys and values (STORE_TABLES in env.h).
 * It reads only branch, leaf and overflow header pages, so it takes time in
 * proportion to the number of records, not to the bytes stored.
 *
 * What no check inside the file can see (DESIGN.md, "The store's file"): a
 * flipped meta txnid that makes LMDB pick the older of the two snapshots,
 * which is a silent roll-back to the previous commit. */
#ifndef K3_STORE_WALK_H
#define K3_STORE_WALK_H

#include <stddef.h>
#include <stdint.h>

#define STORE_WALK_GONE 2

struct store_walk_stats {
	uint64_t txnid;  /* of the snapshot walked */
	uint64_t pages;  /* last page + 1 */
	uint64_t branch; /* pages of each kind reached */
	uint64_t leaf;
	uint64_t overflow;
	uint64_t free;     /* pages the free list holds */
	uint64_t items;    /* items of the k3cache databases */
	uint64_t problems; /* salvage mode: problems found and stepped around */
};

/* Called, in salvage mode, for every item of a k3cache database on a sound
 * page: the table's name, the key and the value (each duplicate of a
 * DUPSORT table is one item). The pointers are into the mapped file. A
 * nonzero return stops the walk and is returned by store_walk(). */
typedef int (*store_walk_item_fn)(const char *table, const void *key, size_t klen, const void *val,
                                  size_t vlen, void *ctx);

/* Checks the snapshot of the file (map, size bytes) committed by txnid; 0
 * means the newer of its two snapshots, the one LMDB opens. Returns 0 when
 * it is sound; STORE_WALK_GONE when the file no longer holds that snapshot
 * (two commits since: take a newer one); otherwise 1 with the first problem
 * in why ("page 812: (lru) node 3 runs past the end of the page"); -1 when
 * it could not run (out of memory: why says so), which says nothing of the
 * file.
 *
 * With item set (salvage mode) it does not stop at a problem: it steps
 * around the damaged page or node, counts it in stats->problems (why keeps
 * the first), and calls item for every item it can reach; when the newer
 * snapshot's meta page itself is damaged it walks the older one. It then
 * returns 0 unless item stopped it. */
int store_walk(const unsigned char *map, size_t size, uint64_t txnid, store_walk_item_fn item,
               void *ctx, struct store_walk_stats *stats, char *why, size_t whysz);

/* Checks only the meta page LMDB will open in the data file at fd: LMDB
 * maps the file at the size the meta page states, so one flip there is
 * enough to make it fail, or worse, before the walk can run. Returns 0
 * (sound, or a new empty file) or 1 with why. */
int store_walk_meta(int fd, char *why, size_t whysz);

/* Walks the data file open at fd (as store_walk, without item) in a child
 * process, so that a fault in the walk cannot reach the caller. Returns as
 * store_walk; -2 when the walk faulted (SIGSEGV, SIGBUS, ...); -1 when it
 * could not run or was killed (why says how). */
int store_walk_child(int fd, uint64_t txnid, struct store_walk_stats *stats, char *why,
                     size_t whysz);

#endif
