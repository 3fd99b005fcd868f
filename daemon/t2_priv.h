/* t2_priv: what the daemon's tier-2 files share (t2.c, the loop's side;
 * t2_copy.c, t2_search.c, t2_fetch.c and t2_stage.c, the threads): the work items, the queues that
 * carry them and the module's state. Internal to daemon/t2*.c. */
#ifndef K3D_T2_PRIV_H
#define K3D_T2_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "t2.h"
#include "tier2/tier2.h"

/* What an item asks or answers. */
enum t2_kind {
	T2_COPY,    /* loop -> copy thread: copy entry key to the cluster */
	T2_PROBE,   /* loop -> search thread: the cluster's longest prefix of a prompt */
	T2_NONE,    /* search -> loop: nothing longer than the local answer (or it failed) */
	T2_FOUND,   /* search -> loop: a longer entry, key, claimed for its fetch */
	T2_JOIN,    /* search -> loop: a longer entry, key, fetched already for another */
	T2_FETCH,   /* search -> fetch thread: fetch key (claimed; its lookups wait) */
	T2_SKIPPED, /* search -> loop: key claimed, not fetched (queue full or too long) */
	T2_RELEASE, /* search -> loop: key claimed, but the store holds it now */
	T2_FAILED,  /* fetch -> loop: the fetch missed before it began (st says why) */
	T2_LIST,    /* loop -> copy or search thread: list the cluster's entries */
	T2_LISTED,  /* -> loop: the entries listed (or st says why not) */
};

struct t2_item {
	struct t2_item *next;
	enum t2_kind kind;
	uint64_t waiter; /* the lookup waiting for this (t2_wait.id); 0: none */
	uint8_t key[TIER2_KEY_LEN];
	/* a probe: the prompt, cut at the lookup's limit */
	uint8_t fingerprint[32];
	uint8_t *salt;
	size_t salt_len;
	uint32_t *tokens;
	uint32_t n_tokens;
	uint32_t local_p; /* what the local store found */
	/* an answer */
	uint32_t prefix_len;
	enum tier2_status st;
	struct tier2_listed *listed; /* T2_LISTED: each salt malloc'd */
	size_t n_listed, cap_listed;
	uint32_t limit;       /* T2_LIST */
	int has_model;        /* T2_LIST: of fingerprint only */
	uint64_t deadline_ms; /* T2_LIST: given up after (t2_now_ms), its waiter gone */
	struct k3d_t2 *t;     /* T2_LIST: for the listing's deadline and the stop */
	char err[256];
};

/* A queue of items between two threads; max 0: unbounded. */
struct t2_queue {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct t2_item *head, *tail;
	size_t n, max;
	int stop;
};

/* 0 when queued, -1 when the queue is full or stopped (it is the caller's). */
int t2_queue_push(struct t2_queue *q, struct t2_item *it);
/* The next item, waiting for one; NULL once the queue is stopped. */
struct t2_item *t2_queue_pop(struct t2_queue *q);

struct t2_counters {
#define T2_FIELD(name, family, help) _Atomic uint64_t name;
	K3D_T2_COUNTERS(T2_FIELD)
#undef T2_FIELD
};

/* A thread's router counters, added to the shared ones after each call. */
void t2_count_router(struct k3d_t2 *t, struct cluster_router *r, struct cluster_stats *seen,
                     struct tier2_stats *ts, struct tier2_stats *ts_seen);

/* Keys whose fetched entry the local store refused, not fetched again for
 * T2_REFUSED_SECONDS (the last T2_REFUSED of them). */
#define T2_REFUSED         64
#define T2_REFUSED_SECONDS 60.0
struct t2_refused {
	uint8_t key[TIER2_KEY_LEN];
	double until;
};

struct t2_fetching {
	struct t2_fetching *next;
	uint8_t key[TIER2_KEY_LEN];
};

struct k3d_t2 {
	struct k3d_server *srv;
	struct k3d_t2_config cfg;
	char *password;
	char owner[TIER2_NS_MAX + 1];
	struct t2_queue copyq, searchq, fetchq, doneq;
	pthread_t copy_thread, search_thread, fetch_thread;
	int copy_started, search_started, fetch_started;
	_Atomic int stopping;
	int done_fd;
	struct event *done_ev;
	/* keys being fetched: added by the search thread, removed by the loop
	 * once the writer has stored (or the fetch failed, or was skipped),
	 * under fetchq.mu */
	struct t2_fetching *fetching;
	/* a fetch is under way (until the writer has stored its entry or
	 * given up): one at a time, under fetchq.mu */
	int holding;
	struct t2_refused refused[T2_REFUSED]; /* under fetchq.mu */
	/* t2_now_ms() when the search thread took the item it works on; 0 while
	 * it waits for one */
	_Atomic uint64_t busy_since_ms;
	/* t2_now_ms() when the fetch thread took the item in its hand (from its
	 * pop to the end of its read); 0: none */
	_Atomic uint64_t fetch_began_ms;
	/* the last whole fetches' time, a moving average in ms (0: none yet; the
	 * loop writes it as each is stored) */
	_Atomic uint64_t fetch_ms;
	unsigned refused_next;
	/* lookups waiting (loop thread only) */
	struct k3d_t2_wait *waiters;
	uint64_t next_waiter;
	struct t2_counters n;
	_Atomic uint64_t used_bytes; /* the ledger's sum (copy thread writes) */
};

/* A router for one thread, with the daemon's options. NULL after logging. */
struct cluster_router *t2_router(struct k3d_t2 *t);

/* At start-up (t2_check.c): reads the slot map and checks, on every master,
 * the credentials and every right the second tier uses. 0 (masters: how many
 * answered; 0 when the cluster cannot be reached now, a warning logged), or
 * -1 after logging a mistake no retry mends: credentials refused, a right
 * missing, not a cluster, not Redis. */
int t2_check_cluster(struct k3d_t2 *t, struct cluster_router *r, size_t *masters);
/* The fetch thread, before it fetches: waits until no fetch is under way,
 * then holds; -1 when stopping. t2_release: the fetch held is over (its
 * entry stored, refused, or the fetch failed). */
int t2_hold(struct k3d_t2 *t);
void t2_release(struct k3d_t2 *t);
/* Whether the store refused key's entry lately (search thread, under
 * fetchq.mu). */
int t2_refused_locked(struct k3d_t2 *t, const uint8_t *key);

/* Milliseconds of k3d_now(), never 0. */
uint64_t t2_now_ms(void);

/* Wakes the loop: an item is on doneq. */
void t2_post(struct k3d_t2 *t, struct t2_item *it);

/* Runs a T2_LIST item with router r (NULL: fails it) and posts it back as
 * T2_LISTED; on the copy thread, or the search thread in read-only mode. */
void t2_list_run(struct k3d_t2 *t, struct cluster_router *r, struct tier2_stats *ts,
                 struct t2_item *it);

/* The fetch thread, once rd has read the record: streams the entry into
 * the store (t2_stage.c). 0 when the writer has the job, which owns it from
 * then on and reports the outcome to the loop (k3d_t2_stored) once this has
 * returned or before; -1 (it->st, it->err set, it still the caller's) when
 * out of memory. */
struct t2_stage;
int t2_stage_fetch(struct k3d_t2 *t, struct tier2_reader *rd, struct t2_item *it);
/* The loop, once the job is back: how the read ended (TIER2_OK: it was not
 * the read that failed) and its message; whether every byte arrived. */
enum tier2_status t2_stage_read_status(struct t2_stage *sg, char *err, size_t errsz);
int t2_stage_complete(struct t2_stage *sg);
/* The loop, once a fetch's entry is stored: logs its size and times. */
void t2_stage_log(struct t2_stage *sg);
/* The loop, once the job is back: the fetch's seconds so far. */
double t2_stage_seconds(const struct t2_stage *sg);

void *t2_copy_main(void *arg);
void *t2_search_main(void *arg);
void *t2_fetch_main(void *arg);

#endif
