/* t2_stage: an entry fetched from the second tier, written into the store
 * as it arrives (t2_priv.h, t2.h).
 *
 * The fetch thread reads the entry with a tier2_reader (tier2.h) into a
 * window of its own (window.h: a reserved range of the payload's length of
 * which at most K3D_WINDOW_STAGES stages are backed), and hands the writer
 * a job (K3D_CHORE_T2_STAGE) once the record is read. The writer begins a
 * staged publish over the window (store_stage_begin: the model's checks,
 * the pending row, and the scan thread that checks each layer, its checksum
 * against the record's, as its bytes come) and writes each stage whose
 * bytes have arrived, between its other jobs, as for a streamed publish
 * (ingest.c). It tells the fetch thread how far the store has consumed the
 * payload; that frees window stages for the next bytes, and a full window
 * makes the fetch thread wait. So the cluster's reads and the store's
 * writes overlap, and a fetch of any size holds a few stages, not the entry.
 *
 * The job comes back to the loop (k3d_t2_stored) once the entry is
 * committed or refused, or once the read failed (or the daemon stops) and
 * what was written is removed. Nothing is visible to lookups before every
 * layer has passed.
 *
 * Threads: the fetch thread writes arrived, complete, cancelled and the
 * read's status under mu, and owns the window and the reader; the writer
 * owns `stage` (set and cleared under mu) and writes consumed, refused and
 * job_done under mu; the loop reads the read's status once the job is back.
 * Two references, the fetch thread's and the job's; the last one frees. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "hexutil.h"
#include "t2_priv.h"
#include "units.h"
#include "window.h"

struct t2_stage {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* the fetch thread waits for room */
	int refs;
	struct k3d_writer *w;
	struct store *store;
	struct k3d_job *job;
	struct k3d_window win; /* the fetch thread's */
	uint64_t total;
	double started, read_s; /* k3d_now() as the job was handed over; the read's seconds */
	double waited_s;        /* of those, waiting for the store to free the window */
	/* the request, its own copy: the store reads it until the stage ends */
	uint8_t fingerprint[32];
	uint8_t *salt;
	uint32_t *tokens;
	struct store_blob *blobs;
	struct store_publish_req req;
	/* under mu */
	uint64_t arrived, consumed; /* consumed UINT64_MAX: the store failed */
	int complete, cancelled;    /* the fetch thread's */
	int refused;                /* the writer: read no more (refused, or done) */
	int job_done;               /* the writer has handed the job back */
	struct store_stage *stage;
	enum tier2_status read_st;
	char err[256];
	/* the read's outcome as the job went back (job_back): what the loop
	 * reads, though the fetch thread may still be reading then */
	enum tier2_status out_st;
	int out_complete;
	char out_err[256];
};

void k3d_t2_stage_unref(struct t2_stage *sg)
{
	if (!sg)
		return;
	pthread_mutex_lock(&sg->mu);
	int last = --sg->refs == 0;
	pthread_mutex_unlock(&sg->mu);
	if (!last)
		return;
	k3d_window_close(NULL, &sg->win);
	pthread_mutex_destroy(&sg->mu);
	pthread_cond_destroy(&sg->cv);
	free(sg->salt);
	free(sg->tokens);
	free(sg->blobs);
	free(sg);
}

enum tier2_status t2_stage_read_status(struct t2_stage *sg, char *err, size_t errsz)
{
	pthread_mutex_lock(&sg->mu);
	enum tier2_status st = sg->out_st;
	snprintf(err, errsz, "%s", sg->out_err);
	pthread_mutex_unlock(&sg->mu);
	return st;
}

void t2_stage_log(struct t2_stage *sg)
{
	char hex[2 * TIER2_KEY_LEN + 1], size[32];
	hexutil_encode(sg->job->pub.key, TIER2_KEY_LEN, hex);
	units_format_size(sg->total, size, sizeof(size));
	double all = k3d_now() - sg->started;
	pthread_mutex_lock(&sg->mu);
	double read = sg->read_s, waited = sg->waited_s; /* set before the job went back */
	pthread_mutex_unlock(&sg->mu);
	k3d_log(K3D_LOG_INFO,
	        "tier2: fetched %.16s into the store: %s in %.0f ms (%.2f GB/s; the cluster's "
	        "reads took %.0f ms, of which %.0f ms waiting for the store to free the window)",
	        hex, size, all * 1e3, all > 0 ? (double)sg->total / all / 1e9 : 0.0, read * 1e3,
	        waited * 1e3);
}

double t2_stage_seconds(const struct t2_stage *sg)
{
	return k3d_now() - sg->started; /* set before the job went to the writer */
}

int t2_stage_complete(struct t2_stage *sg)
{
	pthread_mutex_lock(&sg->mu);
	int whole = sg->out_complete;
	pthread_mutex_unlock(&sg->mu);
	return whole;
}

/* ---- the fetch thread's side ------------------------------------------------ */

/* Under mu: the writer has more to do (unless it has handed the job back,
 * which may be freed then). */
static void kick_locked(struct t2_stage *sg)
{
	if (!sg->job_done)
		k3d_writer_kick(sg->w, sg->job);
}

/* A stage and its job for the entry rd reads; NULL when out of memory. */
static struct t2_stage *stage_new(struct k3d_t2 *t, const struct tier2_reader *rd)
{
	const struct tier2_record *rec = tier2_read_record(rd);
	struct t2_stage *sg = calloc(1, sizeof(*sg));
	struct k3d_job *job = calloc(1, sizeof(*job));
	if (!sg || !job) {
		free(sg);
		free(job);
		return NULL;
	}
	sg->total = tier2_read_total(rd);
	/* the decoder ensures n_layers >= 1; the analyzer cannot see it */
	sg->blobs = calloc(rec->n_layers ? rec->n_layers : 1, sizeof(*sg->blobs));
	sg->tokens = malloc((size_t)rec->n_tokens * sizeof(uint32_t));
	sg->salt = rec->salt_len ? malloc(rec->salt_len) : NULL;
	if (!sg->blobs || !sg->tokens || (rec->salt_len && !sg->salt) ||
	    k3d_window_open_own(&sg->win, k3d_window_stage(t->srv), sg->total) != 0) {
		free(sg->blobs);
		free(sg->tokens);
		free(sg->salt);
		free(sg);
		free(job);
		return NULL;
	}
	memcpy(sg->fingerprint, rec->fingerprint, 32);
	memcpy(sg->tokens, rec->tokens, (size_t)rec->n_tokens * sizeof(uint32_t));
	if (rec->salt_len)
		memcpy(sg->salt, rec->salt, rec->salt_len);
	uint64_t off = 0;
	for (uint32_t i = 0; i < rec->n_layers; i++) {
		/* the record's sum: the store's scan checks each layer against it */
		sg->blobs[i] = (struct store_blob){sg->win.base + off, rec->layers[i].size,
		                                   rec->layers[i].xxh3, NULL};
		off += rec->layers[i].size;
	}
	sg->req = (struct store_publish_req){sg->fingerprint, sg->salt,  rec->salt_len, sg->tokens,
	                                     rec->n_tokens,   sg->blobs, rec->n_layers};
	pthread_mutex_init(&sg->mu, NULL);
	/* its timed wait (wait_room) on the monotonic clock: a step of the
	 * wall clock neither stretches nor cuts it */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&sg->cv, &ca);
	pthread_condattr_destroy(&ca);
	sg->refs = 2;
	sg->w = t->srv->writer;
	sg->store = t->srv->store;
	sg->job = job;
	k3cache__v1__response__init(&job->resp);
	job->chore = K3D_CHORE_T2_STAGE;
	job->streamed = 1;
	job->plen = sg->total;
	job->t2s = sg;
	return sg;
}

/* Waits (at most 100 ms) for the store to consume past `consumed`, or to
 * refuse, or the daemon to stop. */
static void wait_room(struct k3d_t2 *t, struct t2_stage *sg, uint64_t consumed)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	const long second = 1000000000L;
	until.tv_nsec += second / 10;
	if (until.tv_nsec >= second) {
		until.tv_sec++;
		until.tv_nsec -= second;
	}
	double t0 = k3d_now();
	pthread_mutex_lock(&sg->mu);
	while (sg->consumed == consumed && !sg->refused && !atomic_load(&t->stopping))
		if (pthread_cond_timedwait(&sg->cv, &sg->mu, &until) == ETIMEDOUT)
			break;
	sg->waited_s += k3d_now() - t0;
	pthread_mutex_unlock(&sg->mu);
}

/* Reads the entry into the window as the store consumes it. */
static void stream(struct k3d_t2 *t, struct t2_stage *sg, struct tier2_reader *rd)
{
	uint64_t arrived = 0;
	enum tier2_status st = TIER2_OK;
	char err[256] = "";
	for (;;) {
		pthread_mutex_lock(&sg->mu);
		uint64_t consumed = sg->consumed;
		int refused = sg->refused;
		pthread_mutex_unlock(&sg->mu);
		if (refused || consumed == UINT64_MAX)
			break; /* the writer's status says why */
		if (atomic_load(&t->stopping)) {
			st = TIER2_NODE_ERROR;
			snprintf(err, sizeof(err), "the daemon is stopping");
			break;
		}
		k3d_window_release(NULL, &sg->win, consumed);
		int grown;
		while ((grown = k3d_window_grow(NULL, &sg->win)) == 0)
			;
		if (grown < 0) {
			st = TIER2_NOMEM;
			snprintf(err, sizeof(err), "no memory for the fetch's window");
			break;
		}
		uint64_t limit = k3d_window_end(&sg->win);
		if (limit > sg->total)
			limit = sg->total;
		if (arrived == limit) { /* the window is full */
			wait_room(t, sg, consumed);
			continue;
		}
		st = tier2_read_next(rd, sg->win.base, limit, &arrived, err, sizeof(err));
		if (st != TIER2_OK)
			break;
		pthread_mutex_lock(&sg->mu);
		sg->arrived = arrived;
		if (sg->stage)
			store_stage_arrived(sg->stage, arrived);
		if (arrived == sg->total) {
			sg->complete = 1;
			sg->read_s = k3d_now() - sg->started;
			kick_locked(sg);
			pthread_mutex_unlock(&sg->mu);
			return;
		}
		pthread_mutex_unlock(&sg->mu);
	}
	pthread_mutex_lock(&sg->mu);
	sg->read_st = st;
	snprintf(sg->err, sizeof(sg->err), "%s", err);
	sg->cancelled = 1;
	if (sg->stage)
		store_stage_cancel(sg->stage);
	kick_locked(sg);
	pthread_mutex_unlock(&sg->mu);
}

int t2_stage_fetch(struct k3d_t2 *t, struct tier2_reader *rd, struct t2_item *it)
{
	struct t2_stage *sg = stage_new(t, rd);
	if (!sg) {
		it->st = TIER2_NOMEM;
		snprintf(it->err, sizeof(it->err), "out of memory for a fetch of %llu bytes",
		         (unsigned long long)tier2_read_total(rd));
		return -1;
	}
	char hex[2 * TIER2_KEY_LEN + 1], size[32];
	hexutil_encode(it->key, TIER2_KEY_LEN, hex);
	units_format_size(sg->total, size, sizeof(size));
	k3d_log(K3D_LOG_INFO, "tier2: fetching %.16s (%u tokens, %s) into the store", hex,
	        sg->req.n_tokens, size);
	sg->started = k3d_now();
	sg->job->t2 = it; /* the job's from now on */
	k3d_writer_submit(sg->w, sg->job);
	stream(t, sg, rd);
	k3d_t2_stage_unref(sg);
	return 0;
}

/* ---- the writer's side ---------------------------------------------------------- */

static void kick(void *ctx)
{
	struct k3d_job *job = ctx;
	k3d_writer_kick(job->t2s->w, job);
}

/* The store will not read payload bytes before consumed again. */
static void tell_consumed(void *ctx, uint64_t consumed)
{
	struct t2_stage *sg = ctx;
	pthread_mutex_lock(&sg->mu);
	if (consumed != sg->consumed) {
		sg->consumed = consumed;
		pthread_cond_broadcast(&sg->cv);
	}
	pthread_mutex_unlock(&sg->mu);
}

/* The job goes back: the fetch thread reads no more, and the loop reads the
 * read's outcome as it is now. */
static int job_back(struct t2_stage *sg)
{
	pthread_mutex_lock(&sg->mu);
	sg->refused = 1;
	sg->job_done = 1;
	sg->out_st = sg->read_st;
	sg->out_complete = sg->complete;
	snprintf(sg->out_err, sizeof(sg->out_err), "%s", sg->err);
	pthread_cond_broadcast(&sg->cv);
	pthread_mutex_unlock(&sg->mu);
	return 1;
}

void k3d_t2_stage_begin(struct k3d_writer *w, struct k3d_job *job)
{
	(void)w;
	struct t2_stage *sg = job->t2s;
	pthread_mutex_lock(&sg->mu);
	int cancelled = sg->cancelled;
	pthread_mutex_unlock(&sg->mu);
	if (cancelled) { /* the read failed before the writer came to it */
		status_set(&job->st, STATUS_INVALID,
		           "the fetch stopped before the entry was whole");
		return;
	}
	struct store_stage *g = NULL;
	job->st.code = STATUS_OK;
	job->st.message[0] = 0;
	store_stage_begin(sg->store, &sg->req, sg->win.stage * K3D_WINDOW_STAGES, kick, job, &g,
	                  &job->pub, &job->st);
	pthread_mutex_lock(&sg->mu);
	if (!g) { /* refused, or stored already: read no more */
		sg->refused = 1;
		pthread_cond_broadcast(&sg->cv);
	} else {
		sg->stage = g;
		store_stage_arrived(g, sg->arrived);
		if (sg->cancelled)
			store_stage_cancel(g);
	}
	pthread_mutex_unlock(&sg->mu);
}

int k3d_t2_stage_progress(struct k3d_job *job, int stopping)
{
	struct t2_stage *sg = job->t2s;
	pthread_mutex_lock(&sg->mu);
	int whole = sg->complete, gone = sg->cancelled;
	if (stopping && !whole && !gone) { /* the fetch thread has stopped */
		sg->cancelled = gone = 1;
		if (sg->read_st == TIER2_OK) {
			sg->read_st = TIER2_NODE_ERROR;
			snprintf(sg->err, sizeof(sg->err), "the daemon is stopping");
		}
		if (sg->stage)
			store_stage_cancel(sg->stage);
	}
	struct store_stage *g = sg->stage;
	pthread_mutex_unlock(&sg->mu);
	if (!g)
		return job_back(sg); /* nothing was begun */
	if (!k3d_writer_stage_step(sg->w, job, g, stopping, whole, gone, tell_consumed, sg))
		return 0; /* a kick comes when there is more to do */
	pthread_mutex_lock(&sg->mu);
	sg->stage = NULL;
	pthread_mutex_unlock(&sg->mu);
	store_stage_end(g, &job->pub, &job->st);
	if (gone && job->st.code == STATUS_OK)
		status_set(&job->st, STATUS_INVALID,
		           "the fetch stopped before the entry was whole");
	return job_back(sg);
}
