/* service: the store's read and admin operations as Request -> Response, with
 * no sockets. The daemon answers with them; k3cachectl --db calls them on a
 * store it opened read-only, so both print from the same answers. */
#ifndef K3_SERVICE_H
#define K3_SERVICE_H

#include "frame.h"
#include "model.h"
#include "store.h"

/* Model specs between the wire and model.h. */
struct k3cache_model *service_spec_from_wire(const K3cache__V1__ModelSpec *w, char *err);
K3cache__V1__ModelSpec *service_spec_to_wire(const struct k3cache_model *m);
void service_free_spec(K3cache__V1__ModelSpec *w);

/* Answers req when it needs only the store: put_model, list, inspect,
 * resolve, list_models, evict, verify. Fills resp's code, message and
 * results and returns 1; returns 0, resp untouched, for an op that needs
 * more (a connection, a payload, a daemon's counters). What it allocates is
 * freed by service_response_clear(). resp must start as
 * K3CACHE__V1__RESPONSE__INIT (its id is left alone). */
int service_dispatch(struct store *s, const frame_request *req, frame_response *resp);
/* A verify in steps (the daemon's): each call checks about `budget` bytes
 * of entries (store_verify_step), *walk holding its place between calls
 * (NULL at first). 1: call again; 0: resp is complete and *walk freed. */
int service_verify_step(struct store *s, struct store_verify **walk, uint64_t budget,
                        frame_response *resp);
/* Ends such a verify before it is done (the daemon is stopping): resp is
 * BUSY, saying why (`why`) and how many entries were checked (the damaged
 * ones found so far are in it); *walk freed. */
void service_verify_cancel(struct store_verify **walk, const char *why, frame_response *resp);
/* The store's counters, in the order stat sends them: X(name, field of
 * struct store_stats, Prometheus family (k3cache_ and this, with its unit
 * suffix), 1 counter / 0 gauge, HELP). The one list of them: the daemon's
 * /metrics reads its rows from here too. */
#define SERVICE_STORE_COUNTERS(X)                                                                  \
	X("entries", entries, "entries", 0, "Entries stored.")                                     \
	X("bytes", bytes, "stored_bytes", 0,                                                       \
	  "Bytes stored: what the capacity counts (shared blocks once).")                          \
	X("logical_bytes", logical_bytes, "logical_bytes", 0,                                      \
	  "Bytes of the entries whole, as if nothing were shared.")                                \
	X("blocks", blocks, "blocks", 0, "Shared MLA row blocks stored.")                          \
	X("blocks_mismatched", blocks_mismatched, "blocks_mismatched_total", 1,                    \
	  "Blocks kept privately because their bytes differed from the stored block.")             \
	X("models_repaired", models_repaired, "models_repaired_total", 1,                          \
	  "Damaged model specs replaced by a put of the same spec, since open.")                   \
	X("models_damaged", models_damaged, "models_damaged_total", 1,                             \
	  "Damaged model specs found (and skipped) while listing or reading them, since open.")    \
	X("indexes_rebuilt", indexes_rebuilt, "indexes_rebuilt_total", 1,                          \
	  "Times verify rebuilt the indexes, since open.")                                         \
	X("row_block", row_block, "row_block_rows", 0, "Token rows per shared MLA block.")         \
	X("max_bytes", max_bytes, "max_bytes", 0, "The store's capacity (--max-bytes).")           \
	X("models", models, "models", 0, "Model specs stored.")                                    \
	X("hits", hits, "hits_total", 1, "Lookups that found a stored prefix.")                    \
	X("misses", misses, "misses_total", 1, "Lookups that found none.")                         \
	X("hit_tokens", hit_tokens, "hit_tokens_total", 1,                                         \
	  "Prompt tokens covered by the prefixes found.")                                          \
	X("publishes", publishes, "publishes_total", 1, "Entries published.")                      \
	X("publishes_existing", publish_exists, "publishes_existing_total", 1,                     \
	  "Publishes of an entry that was stored already.")                                        \
	X("restores", restores, "restores_total", 1, "Restores served.")                           \
	X("evictions", evictions, "evictions_total", 1, "Entries evicted.")                        \
	X("quarantined", quarantined, "quarantined_total", 1,                                      \
	  "Entries taken out of service as damaged.")                                              \
	X("corrupt", corrupt, "corrupt_total", 1, "Checksum failures found on read.")              \
	X("map_full_retries", map_full_retries, "map_full_retries_total", 1,                       \
	  "Writes retried after LMDB's map was full.")                                             \
	X("map_size", map_size, "map_size_bytes", 0, "Size of LMDB's memory map.")                 \
	X("map_used_pages", map_used_pages, "map_used_pages", 0, "Pages of the map in use.")       \
	X("free_pages", free_pages, "free_pages", 0, "Pages on LMDB's free list.")                 \
	X("page_size", page_size, "page_size_bytes", 0, "LMDB's page size.")                       \
	X("file_bytes", file_bytes, "file_bytes", 0, "Size of the data file.")                     \
	X("chunks", chunks, "chunks", 0, "Chunk rows, staged or committed.")                       \
	X("staging", staging, "staging", 0, "Staged publishes in progress.")                       \
	X("staged_swept", swept, "staged_swept_total", 1,                                          \
	  "Staged publishes a dead process left, removed at open.")

/* Appends the store's counters (SERVICE_STORE_COUNTERS). */
void service_store_counters(struct store *s, frame_response *resp);
void service_add_counter(frame_response *resp, const char *name, uint64_t value);

/* Sets code and a copy of the message. */
void service_fail(frame_response *resp, const struct status *st);
void service_response_clear(frame_response *resp);

#endif
