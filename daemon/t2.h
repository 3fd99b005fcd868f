/* t2: the daemon's second tier on a Redis Cluster (issue 17), over the
 * router and the data layout of src/tier2. The local store stays the first
 * tier; without --tier2 nothing here runs and the daemon works as before.
 *
 * Contract:
 * - Write-back. After a publish commits locally, its key is queued for the
 *   copy thread (at most K3D_T2_COPY_QUEUE keys). A full queue skips the
 *   copy, counted; the worker's publish never waits for Redis. The copy
 *   thread reads the entry from the store (every piece checked against its
 *   stored sum: bytes known bad are never sent) and writes it to the cluster
 *   unless a valid record of the key is there already. It keeps what this
 *   daemon wrote within --tier2-max-bytes by deleting its own oldest entries
 *   first, from a ledger kept in the cluster (tier2_ledger_*), so a restart
 *   keeps the budget. In read-only mode nothing is copied.
 * - Lookups. A lookup whose local answer is shorter than it could be asks the
 *   search thread for the cluster's longest prefix and waits at most
 *   --tier2-wait for that answer; past it, or when the cluster has nothing
 *   longer, it is answered from the local store as always. A longer entry is
 *   handed to the fetch thread (at most K3D_T2_FETCH_QUEUE wait for it besides
 *   the one it fetches, and only while the fetches ahead are expected to
 *   end within --tier2-queue-wait, by the average of the last fetches'
 *   times; else it is not fetched, counted, and its lookup answered locally), which
 *   fetches one entry at a time, so searches go on during a large fetch. It
 *   is fetched (every chunk's and part's sum checked) into the writer as it
 *   arrives, which stores it as a streamed publish (validated against the
 *   model, each layer against the record's sum; t2_stage.c), and the lookup
 *   is then answered from the local store: a local hit. Every
 *   lookup that finds the same key while it is fetched waits for that one
 *   fetch. A failed fetch is a miss by cause (missing, damaged, timeout, node
 *   error), counted; the lookup is answered locally.
 * - The router's round trips have deadlines (--tier2-timeout) and a failed
 *   node backs off (cluster.h), so no lookup blocks on a dead node.
 * - Each thread has its own router (a router serves one thread).
 *
 * Threads: the loop thread calls everything here but k3d_t2_stage_* (the
 * writer's). The copy, search and fetch threads touch the store only through its
 * read calls (store_inspect, store_restore_opt), and the fetch thread through
 * store_stage_arrived and store_stage_cancel of the stage the writer began
 * for it (t2_stage.c); all are thread-safe. */
#ifndef K3D_T2_H
#define K3D_T2_H

#include <stdint.h>

#include "frame.h"
#include "store.h"

#define K3D_T2_COPY_QUEUE   64u  /* keys waiting to be copied */
#define K3D_T2_SEARCH_QUEUE 256u /* lookups waiting for the search thread */
#define K3D_T2_FETCH_QUEUE  16u  /* entries found, waiting for the fetch thread */
#define K3D_T2_NS_DEFAULT   "k3cache"

/* The counters the second tier's threads add to and the loop reads: each
 * is Stat's tier2_NAME and /metrics' k3cache_FAMILY. */
#define K3D_T2_COUNTERS(X)                                                                         \
	X(lookups, "tier2_lookups_total", "Lookups that asked the cluster.")                       \
	X(lookups_skipped, "tier2_lookups_skipped_total",                                          \
	  "Lookups answered locally at once: the search thread was busy past --tier2-wait, or "    \
	  "its "                                                                                   \
	  "queue full.")                                                                           \
	X(waits_expired, "tier2_waits_expired_total",                                              \
	  "Lookups answered locally: no answer within --tier2-wait.")                              \
	X(fetch_waits_expired, "tier2_fetch_waits_expired_total",                                  \
	  "Lookups answered locally: the fetch they waited for took over --stall-timeout.")        \
	X(lookup_errors, "tier2_lookup_errors_total",                                              \
	  "Longest-prefix searches that failed (a timeout or a node error).")                      \
	X(hits, "tier2_hits_total",                                                                \
	  "Lookups told of a longer entry in the cluster and answered with more than the local "   \
	  "store had when they began.")                                                            \
	X(fetches, "tier2_fetches_total",                                                          \
	  "Entries read whole from the cluster, each chunk and part checked (the store checks "    \
	  "the layers).")                                                                          \
	X(fetch_busy, "tier2_fetch_busy_total",                                                    \
	  "Fetches given up: a publish of the same entry was under way, which stores it.")         \
	X(fetch_joins, "tier2_fetch_joins_total",                                                  \
	  "Lookups that waited for a fetch another lookup began.")                                 \
	X(fetches_skipped, "tier2_fetches_skipped_total",                                          \
	  "Longer entries found but not fetched, the fetches ahead of them too long or too "       \
	  "many (or no memory to wait with): answered locally.")                                   \
	X(misses_missing, "tier2_misses_missing_total",                                            \
	  "Fetches that missed: a record or chunk was gone.")                                      \
	X(misses_damaged, "tier2_misses_damaged_total",                                            \
	  "Fetches that missed: a record, chunk or part failed its check.")                        \
	X(misses_timeout, "tier2_misses_timeout_total",                                            \
	  "Fetches that missed: a round trip ran out of time.")                                    \
	X(misses_node_error, "tier2_misses_node_error_total",                                      \
	  "Fetches that missed: a node failed or refused.")                                        \
	X(misses_too_large, "tier2_misses_too_large_total",                                        \
	  "Fetches not made: the entry is over --max-payload or --max-bytes.")                     \
	X(misses_no_memory, "tier2_misses_no_memory_total",                                        \
	  "Fetches given up: this daemon had no memory for the read or its window.")               \
	X(parts_new, "tier2_parts_new_total", "MLA block parts this daemon wrote to the cluster.") \
	X(parts_shared, "tier2_parts_shared_total",                                                \
	  "MLA block parts the cluster held already: referenced, not sent again.")                 \
	X(part_bytes_saved, "tier2_part_bytes_saved_total",                                        \
	  "Bytes of MLA block parts not sent because the cluster held them.")                      \
	X(store_refused, "tier2_store_refused_total",                                              \
	  "Fetched entries the local store refused (validation, a layer's sum, room, busy).")      \
	X(copies, "tier2_copies_total", "Entries copied to the cluster.")                          \
	X(copies_existing, "tier2_copies_existing_total",                                          \
	  "Copies skipped: the cluster held the entry already.")                                   \
	X(copies_skipped, "tier2_copies_skipped_total",                                            \
	  "Copies skipped: the copy queue was full.")                                              \
	X(copies_failed, "tier2_copies_failed_total",                                              \
	  "Copies that failed (the cluster down, a timeout, a damaged local entry).")              \
	X(copies_too_large, "tier2_copies_too_large_total",                                        \
	  "Copies skipped: the entry alone is over --tier2-max-bytes.")                            \
	X(copies_undone, "tier2_copies_undone_total",                                              \
	  "Copies cut short by a stop (SIGKILL, a crash), undone from the ledger's journal.")      \
	X(deleted, "tier2_deleted_total",                                                          \
	  "Entries this daemon deleted from the cluster to stay within its budget.")               \
	X(cleanup_failed, "tier2_cleanup_failed_total",                                            \
	  "Deletes from the cluster (making room, undoing a copy cut short) and ledger updates "   \
	  "that failed, tried again later; the log says why.")                                     \
	X(bytes_in, "tier2_received_bytes_total", "Value bytes read from the cluster.")            \
	X(bytes_out, "tier2_sent_bytes_total", "Value bytes written to the cluster.")              \
	X(node_errors, "tier2_node_errors_total",                                                  \
	  "Round trips or connections to a node that failed.")                                     \
	X(timeouts, "tier2_timeouts_total", "Of those, the ones that ran out of time.")            \
	X(router_no_memory, "tier2_router_no_memory_total",                                        \
	  "Commands that failed for want of this daemon's memory (no node blamed).")               \
	X(resent, "tier2_resent_total",                                                            \
	  "Commands sent again to the new master of their slot after theirs failed (a failover).") \
	X(stale, "tier2_stale_total", "Index fields whose record was gone or did not match.")

/* Its gauges, read from the daemon's struct k3d_t2 *t: X(name, family,
 * HELP, value). (tier2_enabled is the daemon's: said without a second
 * tier too.) */
#define K3D_T2_GAUGES(X)                                                                           \
	X(used_bytes, "tier2_used_bytes",                                                          \
	  "Bytes of the entries this daemon wrote to the cluster and has not deleted.",            \
	  atomic_load(&t->used_bytes))                                                             \
	X(max_bytes, "tier2_max_bytes",                                                            \
	  "What this daemon may occupy in the cluster (--tier2-max-bytes).", t->cfg.max_bytes)

enum k3d_t2_mode { K3D_T2_WRITE_BACK = 0, K3D_T2_READ_ONLY };

struct k3d_t2_config {
	const char *seeds;         /* --tier2; NULL: no second tier */
	const char *user;          /* --tier2-user */
	const char *password_file; /* --tier2-password-file */
	const char *ns;            /* --tier2-namespace */
	const char *owner;         /* --tier2-owner; NULL: host name and store */
	uint64_t max_bytes;        /* --tier2-max-bytes; 0: --max-bytes */
	enum k3d_t2_mode mode;     /* --tier2-mode */
	uint32_t timeout_ms;       /* --tier2-timeout: each round trip */
	uint32_t wait_ms;          /* --tier2-wait: a lookup's wait for an answer */
	uint32_t queue_wait_ms;    /* --tier2-queue-wait: for fetches ahead of its own */
};

struct k3d_server;
struct k3d_conn;
struct k3d_job;
struct k3d_t2;

/* Reads the password file, checks the cluster (a wrong password or user is
 * an error; an unreachable cluster a warning: the daemon serves locally and
 * retries), loads the ledger and starts the threads. 0, or -1 after logging
 * why. Nothing is started without --tier2. */
int k3d_t2_start(struct k3d_server *srv);
/* Stops the threads (a copy, search or fetch in progress finishes its round
 * trip). */
void k3d_t2_stop(struct k3d_server *srv);

/* A publish of key committed locally: queue its copy (write-back only). */
void k3d_t2_copy(struct k3d_server *srv, const uint8_t key[STORE_KEY_LEN]);
/* A lookup found local->prefix_len locally (req's salt already carries the
 * tenant's namespace). 1 when c now waits for tier 2 (state TIER2; answered
 * later through k3d_lookup_resume), 0 when it is to be answered now. */
int k3d_t2_lookup(struct k3d_conn *c, const struct store_lookup_res *local);
/* A List with tier2 set: the entries of this daemon's namespace in the
 * cluster (of the request's model, when given; at most K3D_T2_LIST_MAX, or
 * its limit), answered once the copy thread (the search thread in read-only
 * mode) has read them; c waits (state
 * TIER2). A page after the first is empty. */
#define K3D_T2_LIST_MAX 50000u
void k3d_t2_list(struct k3d_conn *c);
/* c closes while it waits: it is forgotten. */
void k3d_t2_forget(struct k3d_conn *c);
/* The writer is done with a fetched entry (K3D_CHORE_T2_STAGE). */
void k3d_t2_stored(struct k3d_server *srv, struct k3d_job *job);
/* The counters for Stat and /metrics: with --tier2, the tier2_* of
 * K3D_T2_COUNTERS and K3D_T2_GAUGES (nothing without). */
void k3d_t2_counters(struct k3d_server *srv, frame_response *r);

/* A fetched entry's item (job->t2; NULL is ignored). */
struct t2_item;
void k3d_t2_item_free(struct t2_item *it);

/* writer thread: a fetched entry, stored as a staged publish while it
 * arrives (job->t2s; t2_stage.c), as k3d_ingest_begin and
 * k3d_ingest_progress do for a client's. progress returns 1 once the job is
 * done (committed, refused, or removed). */
struct t2_stage;
struct k3d_writer;
void k3d_t2_stage_begin(struct k3d_writer *w, struct k3d_job *job);
int k3d_t2_stage_progress(struct k3d_job *job, int stopping);
/* The job's reference (k3d_job_free; NULL is ignored). */
void k3d_t2_stage_unref(struct t2_stage *sg);

#endif
