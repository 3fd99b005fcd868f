/* k3cached internals: the server, its connections, the writer thread and the
 * metrics. One libevent loop thread does all socket I/O and the reads of the
 * store; one writer thread runs the store's write transactions. */
#ifndef K3D_DAEMON_H
#define K3D_DAEMON_H

#include <event2/event.h>
#include <event2/listener.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

#include "frame.h"
#include "ops.h"
#include "pool.h"
#include "slots.h"
#include "status.h"
#include "store.h"
#include "t2.h"
#include "tenancy.h"
#include "window.h"

#define K3D_VERSION "k3cached " K3_VERSION
#define K3D_INBUF   65536u

enum k3d_log { K3D_LOG_ERROR, K3D_LOG_WARN, K3D_LOG_INFO, K3D_LOG_DEBUG };

/* A TCP address from --listen or --metrics, checked by main.c. */
struct k3d_addr {
	const char *text; /* as given, for messages; NULL: not set */
	struct sockaddr_storage sa;
	int len;
};

struct k3d_config {
	const char *db;
	const char *socket;
	/* what chose db and socket, for messages: "--db", "--socket",
	 * "$K3CACHE_SOCKET"; NULL: the default path, whose directories k3cached
	 * creates (an explicit path's parent must exist) */
	const char *db_origin;
	const char *socket_origin;
	struct k3d_addr listen;
	struct k3d_addr metrics;
	uint64_t max_bytes;
	uint64_t max_payload;
	uint64_t max_inflight;      /* payload bytes held for publishes in flight */
	uint64_t stage_bytes;       /* store_options.stage_bytes; 0: the store's default */
	uint32_t row_block;         /* store_options.row_block (a new store); 0: default */
	uint64_t yield_rate;        /* bytes/s per upload while lookups arrive; 0: no limit */
	uint64_t min_upload_rate;   /* bytes/s an upload keeps up over K3D_RATE_WINDOW; 0: any */
	uint64_t min_download_rate; /* bytes/s a client reads its answer at, the same way */
	uint32_t max_restores;      /* restores streaming at once */
	uint32_t max_restores_per_tenant; /* of those, one tenant's (slots.h) */
	uint64_t idle_timeout;            /* seconds without a request */
	uint64_t stall_timeout;           /* seconds without progress mid-frame or mid-send */
	uint64_t sync_interval;           /* seconds, durability fast */
	enum store_durability durability;
	enum store_check check; /* the structural walk at open */
	enum k3d_log log_level;
	/* tenancy (tenancy.h) */
	const char *admin_group;
	const char *token_file;
	int insecure_tcp;
	const char *share_uids[16]; /* each a --share-uids list */
	int n_share_uids;
	struct k3d_t2_config t2; /* the second tier (t2.h) */
};

/* Latency histogram bucket bounds, seconds. */
#define K3D_N_BUCKETS 12

struct k3d_hist {
	uint64_t counts[K3D_N_BUCKETS + 1]; /* last: +Inf */
	uint64_t n;
	double sum;
};

struct k3d_conn;
struct k3d_writer;
struct t2_item;

/* Damage reports' checks queued on the writer at once (handlers.c). */
#define K3D_CHECKS_MAX 8

struct k3d_server {
	struct k3d_config cfg;
	struct k3d_tenancy tenancy;
	struct event_base *base;
	struct store *store;
	struct k3d_writer *writer;
	struct k3d_t2 *t2; /* the second tier; NULL without --tier2 */
	double started;    /* k3d_now() at start: stat's uptime_seconds */
	struct evconnlistener *unix_listener, *tcp_listener;
	struct evhttp *http;
	char listen_bound[64], metrics_bound[80]; /* what getsockname says */
	struct event *sig_term, *sig_int, *sig_hup, *tick, *done_ev;
	struct k3d_conn *conns; /* doubly linked */
	uint64_t next_conn_id;
	uint64_t inflight_bytes;
	uint64_t header_bytes; /* charged for large headers (K3D_HEADER_FREE) */
	uint32_t restores_active;
	struct k3d_slots slots; /* restores_active by tenant */
	int stopping;
	uint64_t ticks;
	double bulk_turn; /* k3d_now() when a bulk callback last ran (conn.c) */

	/* counters (loop thread only) */
	uint64_t connections_total, connections_open, connections_refused;
	uint64_t requests[OPS_N];
	uint64_t errors[STATUS_N_CODES];
	uint64_t bytes_in, bytes_out;
	double last_lookup;     /* k3d_now() of the last lookup answered */
	uint64_t ingest_yields; /* pauses of uploads that let lookups run */
	uint64_t timeouts, closed_mid_frame, busy_pauses;
	uint64_t uploads_too_slow;     /* closed under --min-upload-rate */
	uint64_t downloads_too_slow;   /* closed under --min-download-rate */
	uint64_t restores_tenant_busy; /* BUSY: the tenant held its share of the slots */
	uint64_t waiting_trials;       /* in flight: trial windows waiting for their whole */
	uint64_t restores_cut;         /* restores ended mid-payload: a piece failed its check */
	uint64_t delta_publishes, delta_refused; /* publishes with a base; of them refused */
	int chore_pending;                       /* a housekeeping job is with the writer */
	int done_fd;                             /* eventfd: the writer has finished jobs */

	/* payload buffers kept for reuse: touching fresh memory is slow on a VM
	 * that hands freed pages back to its host */
	struct k3d_buf {
		unsigned char *data;
		uint64_t cap;
	} pool[16];
	int pool_n;
	/* stage buffers of receive windows (window.h), counted in pool_bytes */
	unsigned char *stage_pool[64];
	uint32_t stage_n;
	int window_fresh;      /* mremap cannot keep a range: stages use fresh pages */
	uint64_t window_bytes; /* stage memory backing receive windows now */
	uint64_t window_waits; /* uploads paused: their window full (K3D_WAIT_WINDOW) */
	uint64_t reported_uses, reported_damaged; /* direct readers' Reports */
	uint64_t reports_dropped;                 /* damage not checked: K3D_CHECKS_MAX queued */
	uint8_t checks[K3D_CHECKS_MAX][STORE_KEY_LEN]; /* reported keys the writer will check */
	uint32_t n_checks;
	/* the verify running now (the writer's; 0 when none): bytes of entries
	 * checked, of the total, for k3cachectl verify's progress */
	_Atomic uint64_t verify_done, verify_total;
	uint64_t pool_bytes;   /* pool + in flight <= --max-inflight */
	uint64_t payload_tick; /* when the last payload was reserved */
	int idle_trimmed;      /* the pools and heaps were handed back since */
	struct k3d_hist latency[OPS_N];
};

/* libevent priorities. server.c sets up three queues so that libevent's
 * default for a new event (the middle one, npriorities / 2) is the high
 * one: the listeners, signals, the tick, timers and evhttp's events, which
 * cannot all be given a priority, run beside small requests, never behind
 * bulk transfers or starved by a flood of small requests. 0 is unused. */
#define K3D_PRIO_QUEUES 3
#define K3D_PRIO_HIGH   1
#define K3D_PRIO_BULK   2

/* A connection's states (conn.c). Every change goes through
 * k3d_conn_set_state(), which traces it at debug level. CLOSING and DEAD are
 * final: the setter never leaves them (but CLOSING for DEAD). */
#define K3D_CONN_STATES(X)                                                                         \
	X(READ_LEN)     /* reading a frame's length prefix (or between frames) */                  \
	X(READ_HEADER)  /* reading its header */                                                   \
	X(WAIT_MEMORY)  /* header read; waiting for in-flight bytes to free */                     \
	X(READ_PAYLOAD) /* reading its payload into the buffer or window */                        \
	X(YIELD)        /* the same, paused while lookups arrive (--yield-rate) */                 \
	X(WAIT_WINDOW)  /* a streamed payload's window is full: the store consumes first */        \
	X(DISCARD)      /* skipping the payload of a refused request */                            \
	X(BUSY)         /* a request is with the writer thread */                                  \
	X(SENDING)      /* a restore's chunks are still to queue: no request is read */            \
	X(TIER2)        /* a lookup waits for the second tier's answer (t2.c) */                   \
	X(CLOSING)      /* reads no more; closes once the replies queued are out */                \
	X(DEAD)         /* closed, while the writer holds a job of ours: freed when it is back */

#define K3D_STATE_ID(s) K3D_##s,
enum k3d_conn_state { K3D_CONN_STATES(K3D_STATE_ID) };
#undef K3D_STATE_ID

struct k3d_conn {
	struct k3d_server *srv;
	struct k3d_conn *prev, *next;
	uint64_t id;
	int fd;
	struct event *rev, *wev;
	struct evbuffer *out;
	enum k3d_conn_state state; /* set by k3d_conn_set_state() only */
	/* Not a state: the client half-closed its side, so what is buffered is
	 * all that will come. It is answered in whatever states that takes,
	 * then READ_LEN with nothing buffered becomes CLOSING. */
	int input_ended;
	uint32_t jobs_out; /* jobs of ours the writer holds (k3d_conn_submit) */
	char peer[64];
	struct k3d_peer who; /* its namespace and rights (tenancy.h) */

	unsigned char in[K3D_INBUF];
	size_t in_start, in_end;

	unsigned char lenbuf[FRAME_PREFIX_LEN];
	uint32_t hlen, hgot;
	unsigned char *hdr;
	uint64_t hcharge; /* its share of header_bytes */
	frame_request *req;
	unsigned char *payload;
	uint64_t plen, pgot;
	int answered;               /* DISCARD: its error went before the payload */
	uint64_t reserved;          /* in-flight bytes charged to this connection */
	int waited;                 /* its request has waited for them (inflight_waits) */
	int trial;                  /* reading the payload's first K3D_TRIAL_BYTES into a
	                               buffer of that size; the whole is charged after */
	uint64_t rate_mark;         /* pgot when the current rate window began */
	unsigned rate_ticks;        /* seconds of that window the daemon was reading */
	uint64_t down_mark;         /* written when the current download window began */
	unsigned down_ticks;        /* seconds of that window the client's socket was full */
	uint64_t pcap;              /* capacity of the payload buffer */
	struct status pending;      /* the error to answer after a discard */
	uint64_t pending_id;        /* its request's id (the request is freed, or a job's) */
	int pending_op;             /* its op (enum ops_id), for the answer's latency */
	struct k3d_job *ingest;     /* a publish written while its payload arrives */
	struct k3d_window *win;     /* its receive window (the job's; window.h) */
	struct k3d_stream *sending; /* a restore whose chunks are still to queue */
	struct k3d_stream *cut;     /* a restore cut short: its queued chunks point into
	                             * the map, held until the output is freed */
	struct k3d_t2_wait *t2;     /* its lookup waits for the second tier (t2.c) */
	uint64_t send_chunk;        /* its next chunk */
	uint64_t send_id;           /* its request's id */
	uint64_t send_from;         /* where its answer starts, counted as written */
	uint64_t written;           /* bytes written to the socket, every answer */

	double t_request;       /* when the current request's header completed */
	struct event *yield_ev; /* ends a pause of this upload (--yield-rate) */
	uint64_t last_progress; /* tick count of the last byte moved */
	uint64_t last_request;  /* tick count of the last request */
	int demoted;            /* its next turn is at the bulk priority (conn.c: fairness) */
};

/* logging */
void k3d_log(enum k3d_log level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The level an error answer is logged at: warn for the daemon's own trouble
 * (FULL, CORRUPT, INTERNAL), info for a client's bad request (conn.c). */
enum k3d_log k3d_status_level(enum status_code code);
void k3d_set_log_level(enum k3d_log level);

/* The largest header a peer that has not authenticated (TCP with
 * --token-file, before its Hello) may announce. */
#define K3D_HELLO_HEADER_MAX (64u << 10)
/* A header over this is charged to --max-inflight (k3d_server.header_bytes)
 * while its request lives: k3d_header_charge(its length), all it may take:
 * its bytes, its decoding's budget (frame_decode_budget) and the tokens
 * path's array (4 bytes for a token of 1). */
#define K3D_HEADER_FREE (64u << 10)
static inline uint64_t k3d_header_charge(uint32_t hlen)
{
	return (uint64_t)hlen + (uint64_t)frame_decode_budget(hlen) + 4u * (uint64_t)hlen;
}
/* --min-upload-rate is averaged over this many seconds of reading. */
#define K3D_RATE_WINDOW 10u
/* A publish is charged --max-inflight for its whole payload only once this
 * much of it has arrived: an upload that never gets that far holds this
 * much, not the size it announced. */
#define K3D_TRIAL_BYTES (UINT64_C(1) << 20)

/* server.c */
/* The exit code of a daemon that will not open a damaged store (the unit's
 * RestartPreventExitStatus, so that systemd does not loop on it). */
#define K3D_EXIT_DAMAGED 3
/* Runs until SIGTERM or SIGINT. Returns the exit code: 0, 1 (a start-up
 * failure) or K3D_EXIT_DAMAGED. */
int k3d_server_run(const struct k3d_config *cfg);
double k3d_now(void);
/* The address a listening socket is bound to, as 127.0.0.1:PORT or
 * [::1]:PORT (getsockname). */
void k3d_bound_address(evutil_socket_t fd, char *out, size_t outsz);

/* conn.c */
/* The one way a connection changes state (traced at debug level). */
void k3d_conn_set_state(struct k3d_conn *c, enum k3d_conn_state state);
/* Hands a job for c to the writer; c is not freed until it is back
 * (k3d_conn_request_done, k3d_conn_orphan_done, k3d_conn_ingest_ended). */
void k3d_conn_submit(struct k3d_conn *c, struct k3d_job *job);
/* tcp: it came in on --listen (the listener's family says, not the peer's
 * text, which may not resolve) */
void k3d_conn_accept(struct k3d_server *srv, int fd, const char *peer, int tcp);
/* Reads no more from c; closes it once the replies queued are out. */
void k3d_conn_close_after_reply(struct k3d_conn *c);
void k3d_conn_close(struct k3d_conn *c);
/* Forgets the current request: frees it, returns its payload buffer to the
 * pool, releases its in-flight bytes; back to reading a length. */
void k3d_conn_reset(struct k3d_conn *c);
/* Queues a response (and no payload); counts errors. */
void k3d_conn_respond(struct k3d_conn *c, frame_response *resp);
/* Queues resp; 0 when a short TOO_LARGE or INTERNAL answer went in its
 * place, or none (out of memory: the connection then closes). */
int k3d_conn_queue(struct k3d_conn *c, frame_response *resp);
/* Has the write event run while replies wait to be written. */
void k3d_conn_want_write(struct k3d_conn *c);
/* Queues an error answer to c's current request, its message formatted. */
void k3d_conn_errorf(struct k3d_conn *c, enum status_code code, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
/* Queues an error response for request id (0 when unknown). */
void k3d_conn_error(struct k3d_conn *c, uint64_t id, const struct status *st);
/* c's request was answered after a wait off the writer (a lookup that
 * waited for the second tier): it reads its next request. */
void k3d_conn_answered(struct k3d_conn *c);
/* Called by the writer completion path when a queued request finished. */
void k3d_conn_request_done(struct k3d_conn *c);
/* The writer handed back a streamed publish the loop had given up on
 * (job->orphaned): c is freed if it is closed and holds nothing else. */
void k3d_conn_orphan_done(struct k3d_conn *c);
/* The writer handed back c's streamed publish before its payload was whole
 * (the daemon is stopping): there is nothing to answer; c closes. */
void k3d_conn_ingest_ended(struct k3d_conn *c);
/* Resumes connections waiting for in-flight memory. */
void k3d_conn_resume_waiting(struct k3d_server *srv);
/* The writer moved on: streamed payloads hand back the stages the store
 * consumed, and those waiting for their window read on. */
void k3d_conn_windows_moved(struct k3d_server *srv);
void k3d_conn_sweep_timeouts(struct k3d_server *srv);

/* restore.c: the ops that send a snapshot, on the loop thread. */
void k3d_op_lookup(struct k3d_conn *c);
void k3d_op_restore(struct k3d_conn *c);
/* A lookup that waited for the second tier (state TIER2): looked up again
 * in the local store, answered, and the connection reads on. Returns the
 * prefix answered (0: a miss, or an error answered). */
uint32_t k3d_lookup_resume(struct k3d_conn *c);
/* Queues the restore's next chunks (c->sending) until a few MiB wait to be
 * sent, each checked just before: called as the socket drains. */
void k3d_restore_feed(struct k3d_conn *c);

/* handlers.c: executes a complete request of connection c. */
/* Whether c's peer may see the entry (its namespace's, or an admin): 1 or
 * 0; an absent entry counts as its own, so that the op says it is absent;
 * -1 with *st when it cannot tell (out of memory). */
int k3d_owns_entry(struct k3d_conn *c, const uint8_t *key, struct status *st);
void k3d_handle(struct k3d_conn *c);
/* Builds the Stat counters into resp (freed by service_response_clear). */
void k3d_fill_counters(struct k3d_server *srv, frame_response *resp);

/* writer.c */
enum k3d_chore {
	K3D_CHORE_NONE = 0,   /* a client's request */
	K3D_CHORE_FLUSH,      /* write batched last-used times */
	K3D_CHORE_SYNC,       /* durability fast: sync the map */
	K3D_CHORE_VERIFY,     /* check the chunks of a restore being streamed */
	K3D_CHORE_QUARANTINE, /* quarantine a damaged entry a restore found */
	K3D_CHORE_CHECK,      /* check an entry a direct reader reported damaged */
	K3D_CHORE_T2_STAGE,   /* store an entry being fetched from the second tier */
};

/* A restore being streamed: the snapshot lives until the last byte is sent
 * and its deferred check is done (both counted on the loop thread). */
struct k3d_stream {
	struct k3d_server *srv;
	struct store_snapshot *snap;
	int refs;
	char ns[K3D_NS_MAX]; /* the tenant whose slot it holds (slots.h) */
	size_t ns_len;
};
void k3d_stream_unref(struct k3d_stream *st);

struct k3d_job {
	struct k3d_job *next;
	enum k3d_chore chore;       /* housekeeping jobs have no connection */
	struct k3d_stream *stream;  /* K3D_CHORE_VERIFY */
	uint8_t key[STORE_KEY_LEN]; /* K3D_CHORE_QUARANTINE */
	struct k3d_conn *conn;
	struct t2_item *t2;   /* K3D_CHORE_T2_STAGE: the lookup's item (t2_priv.h) */
	struct t2_stage *t2s; /* K3D_CHORE_T2_STAGE: the fetch (t2_stage.c) */
	frame_request *req;
	unsigned char *payload;
	uint64_t plen;
	double t_request;
	/* a publish streamed into the store while its payload arrives (ingest.c) */
	int streamed;
	int orphaned;  /* given up by the loop, which answers by itself: the
	                  writer hands it back only to be freed */
	uint64_t held; /* an orphan's in-flight bytes (its window): given back
	                  to --max-inflight when it is freed */
	struct k3d_ingest *ingest;
	struct k3d_job *snext; /* the writer's list of streamed publishes */
	int kicked;            /* under the writer's mutex */
	/* results */
	struct status st;             /* publish */
	int delta_refused;            /* publish: the delta's base cannot serve */
	struct store_publish_res pub; /* publish */
	struct store_verify *verify;  /* verify: its walk, between batches */
	uint32_t batches;             /* verify: batches run so far */
	frame_response resp;          /* other ops: filled by the service module */
};

/* Writer thread: steps the stage g of a streamed publish, job (ingest.c,
 * t2_stage.c): one stage, then back behind the other jobs (job kicked);
 * every stage when stopping, waiting for the scan once the payload is whole.
 * tell(ctx, consumed) with store_stage_consumed() after stepping. 1 when the
 * stage is to end now (ready; or failed, with the payload whole or gone),
 * 0 when a kick comes once there is more to do. */
int k3d_writer_stage_step(struct k3d_writer *w, struct k3d_job *job, struct store_stage *g,
                          int stopping, int whole, int gone,
                          void (*tell)(void *ctx, uint64_t consumed), void *ctx);
struct k3d_writer *k3d_writer_start(struct k3d_server *srv);
void k3d_writer_submit(struct k3d_writer *w, struct k3d_job *job);
/* Writer thread: whether streamed publishes are being written. */
int k3d_writer_streaming(const struct k3d_writer *w);
/* Asks the writer to quarantine an entry found damaged on the loop thread,
 * which takes no write transaction itself. */
void k3d_writer_quarantine(struct k3d_writer *w, const uint8_t key[STORE_KEY_LEN]);
/* Asks the writer to check an entry someone else found damaged (a direct
 * reader): every chunk and block against its sum; a damaged one is
 * quarantined, an intact one stays. -1 when out of memory (logged). */
int k3d_writer_check(struct k3d_writer *w, const uint8_t key[STORE_KEY_LEN]);
/* Loop thread: a reported key's check is done (its job came back), so a
 * new report of it is checked again (handlers.c). */
void k3d_report_checked(struct k3d_server *srv, const uint8_t key[STORE_KEY_LEN]);
/* Takes the finished jobs (loop thread). */
struct k3d_job *k3d_writer_take_done(struct k3d_writer *w);
/* Finishes every queued job (a verify under way ends at its next batch:
 * k3d_writer_run_one), then stops the thread (finished jobs stay to be
 * taken); k3d_writer_free() afterwards. */
void k3d_writer_stop(struct k3d_writer *w);
void k3d_writer_free(struct k3d_writer *w);
/* Runs a job of the writer's ops but a publish (handlers.c); 1 when it has
 * more to do and must be run again. With stopping (the daemon is), one run
 * before ends now, answered BUSY: a verify of a large store would hold the
 * stop for as long as it has left (past systemd's TimeoutStopSec, a
 * SIGKILL and an unclean store). */
int k3d_writer_run_one(struct k3d_server *srv, struct k3d_job *job, int stopping);
/* Bytes of entries a verify checks before the writer takes other jobs. */
#define K3D_VERIFY_BATCH           (UINT64_C(64) << 20)
#define K3D_VERIFY_BATCH_STREAMING (UINT64_C(4) << 20) /* while a publish streams */
void k3d_job_free(struct k3d_job *job);
/* Asks the writer to look at a streamed publish again (any thread). */
void k3d_writer_kick(struct k3d_writer *w, struct k3d_job *job);
/* Wakes the loop thread (done_fd): finished jobs, or a window that moved. */
void k3d_writer_wake_loop(struct k3d_writer *w);

/* publish.c */
/* The store request of a publish job: its layers point into job->payload.
 * Returns the layer array (the caller frees it), NULL when out of memory. */
struct store_blob *k3d_publish_request(const struct k3d_job *job, struct store_publish_req *req);
/* Loop thread, a publish's header in, its payload not: what the store
 * would refuse it for without reading a byte of it (store_publish_precheck),
 * so that a large payload it refuses is never uploaded. */
enum status_code k3d_publish_precheck(struct k3d_server *srv, const frame_request *req,
                                      struct status *st);
/* Writer thread: runs n publish jobs (at most K3D_PUBLISH_BATCH_MAX) in one
 * commit, deltas assembled first; each job's st and pub are set. */
#define K3D_PUBLISH_BATCH_MAX 64
void k3d_publish_batch(struct k3d_server *srv, struct k3d_job **jobs, uint32_t n);
/* Loop thread: fills a finished publish's answer (job->resp; its id is
 * set) and counts its delta. */
void k3d_publish_answer(struct k3d_job *job);

/* ingest.c: a publish larger than the store's stage size is handed to the
 * writer as soon as its header is in; the writer writes its stages as the
 * bytes arrive (store_stage_*), never waiting for them: a slow uploader holds
 * neither the writer thread nor LMDB's write lock. The answer goes out once
 * the whole payload is in and the entry committed (or refused).
 *
 * loop thread: */
/* Whether c's request (its header in) is a publish to stream. */
int k3d_ingest_wants(const struct k3d_conn *c);
/* Starts streaming c's publish into a window (c->win), its first stage
 * backed, with the c->pgot bytes c->payload holds (a trial's) copied in. 0,
 * or -1 when out of memory or address space (nothing changed). */
int k3d_ingest_start(struct k3d_conn *c);
/* Hands back the window's stages the store has consumed, then backs the
 * next stage: k3d_window_grow()'s answer. */
int k3d_ingest_window(struct k3d_conn *c);
/* c's payload grew to c->pgot bytes. */
void k3d_ingest_arrived(struct k3d_conn *c);
/* c's payload is whole: the connection waits for the answer. */
void k3d_ingest_complete(struct k3d_conn *c);
/* c closed mid-payload: the writer removes what was written. */
void k3d_ingest_cancel(struct k3d_conn *c);
/* writer thread: */
/* Begins the store side of a newly queued streamed publish. */
void k3d_ingest_begin(struct k3d_writer *w, struct k3d_job *job);
/* Writes what is ready; 1 when the job is finished (results set). `stopping`:
 * the loop is gone, bytes still missing never come. */
int k3d_ingest_progress(struct k3d_job *job, int stopping);
void k3d_ingest_free(struct k3d_ingest *in);

/* metrics.c */
/* Serves /metrics on cfg.metrics; 0, or -1 with the reason logged. */
int k3d_metrics_start(struct k3d_server *srv);
void k3d_metrics_observe(struct k3d_server *srv, int op, double seconds);

#endif
