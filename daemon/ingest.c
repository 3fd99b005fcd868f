/* ingest: a large publish written into the store while its payload arrives.
 *
 * The loop thread receives the payload into a window (window.h): a reserved
 * range of the payload's length of which at most K3D_WINDOW_STAGES stages
 * are backed by memory. It hands the job to the writer as soon as the
 * header is in. The writer begins a staged publish (store_stage_begin with
 * the window's size: pending row, scan thread) and then writes each stage
 * whose bytes have arrived, interleaved with its other jobs; it never waits
 * for the socket. After each step it tells the loop how far the store has
 * consumed the payload (store_stage_consumed); the loop hands those stages
 * back and reads on, so a full window pauses the socket (K3D_WAIT_WINDOW)
 * until the writer catches up. The job comes back (and is answered) once
 * the payload is whole and the entry committed or refused, or once the
 * connection is gone and what was written is removed.
 *
 * Threads: the loop writes `arrived`, `complete`, `cancelled` under mu and
 * owns the window; the writer owns `stage` (set and cleared under mu, so
 * that the loop can pass arrivals and cancels to it) and writes `consumed`
 * under mu; the stage's scan thread only kicks the writer. */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "window.h"

struct k3d_ingest {
	struct k3d_writer *w;
	struct k3d_server *srv;
	struct k3d_job *job;
	struct k3d_window win; /* the loop's */
	pthread_mutex_t mu;
	uint64_t arrived;
	uint64_t consumed; /* payload bytes the store will not read again */
	uint64_t told;     /* the writer's: consumed when it last woke the loop */
	int complete, cancelled;
	struct store_stage *stage;
	/* the writer's */
	int begun;
	int retried; /* begun again after BUSY, once the payload was whole */
	struct store_blob *blobs;
	struct store_publish_req req;
	struct store_delta delta; /* a delta's layers, assembled unread */
};

/* ---- the loop's side ------------------------------------------------------- */

int k3d_ingest_wants(const struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	return !srv->stopping && c->req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH &&
	       c->plen > store_stage_bytes(srv->store);
}

int k3d_ingest_start(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	struct k3d_job *job = calloc(1, sizeof(*job));
	struct k3d_ingest *in = calloc(1, sizeof(*in));
	if (!job || !in || k3d_window_open(srv, &in->win, c->plen) != 0) {
		free(job);
		free(in);
		return -1;
	}
	if (k3d_window_grow(srv, &in->win) != 0) {
		k3d_window_close(srv, &in->win);
		free(job);
		free(in);
		return -1;
	}
	if (c->pgot) /* a trial's first bytes */
		memcpy(in->win.base, c->payload, (size_t)c->pgot);
	pthread_mutex_init(&in->mu, NULL);
	in->w = srv->writer;
	in->srv = srv;
	in->job = job;
	k3cache__v1__response__init(&job->resp);
	job->conn = c;
	job->req = c->req;
	job->payload = in->win.base; /* the window's, never freed as a buffer */
	job->plen = c->plen;
	job->t_request = c->t_request;
	job->streamed = 1;
	job->ingest = in;
	c->req = NULL;
	c->ingest = job;
	c->win = &in->win;
	k3d_conn_submit(c, job);
	return 0;
}

int k3d_ingest_window(struct k3d_conn *c)
{
	struct k3d_ingest *in = c->ingest->ingest;
	pthread_mutex_lock(&in->mu);
	uint64_t consumed = in->consumed;
	pthread_mutex_unlock(&in->mu);
	k3d_window_release(c->srv, &in->win, consumed < c->pgot ? consumed : c->pgot);
	return k3d_window_grow(c->srv, &in->win);
}

void k3d_ingest_arrived(struct k3d_conn *c)
{
	struct k3d_ingest *in = c->ingest->ingest;
	pthread_mutex_lock(&in->mu);
	in->arrived = c->pgot;
	if (in->stage)
		store_stage_arrived(in->stage, c->pgot);
	pthread_mutex_unlock(&in->mu);
}

void k3d_ingest_complete(struct k3d_conn *c)
{
	struct k3d_job *job = c->ingest;
	struct k3d_ingest *in = job->ingest;
	pthread_mutex_lock(&in->mu);
	in->arrived = c->pgot;
	in->complete = 1;
	if (in->stage)
		store_stage_arrived(in->stage, c->pgot);
	pthread_mutex_unlock(&in->mu);
	c->ingest = NULL;
	c->payload = NULL; /* the job's window, closed with it */
	c->win = NULL;
	k3d_conn_set_state(c, K3D_BUSY);
	k3d_writer_kick(in->w, job);
}

void k3d_ingest_cancel(struct k3d_conn *c)
{
	struct k3d_job *job = c->ingest;
	struct k3d_ingest *in = job->ingest;
	pthread_mutex_lock(&in->mu);
	in->cancelled = 1;
	if (in->stage)
		store_stage_cancel(in->stage);
	pthread_mutex_unlock(&in->mu);
	c->ingest = NULL;
	c->payload = NULL;
	c->win = NULL;
	k3d_writer_kick(in->w, job);
}

/* ---- the writer's side ------------------------------------------------------ */

static void kick(void *ctx)
{
	struct k3d_job *job = ctx;
	k3d_writer_kick(job->ingest->w, job);
}

static void tell_consumed(void *ctx, uint64_t consumed);

void k3d_ingest_begin(struct k3d_writer *w, struct k3d_job *job)
{
	(void)w;
	struct k3d_ingest *in = job->ingest;
	in->begun = 1;
	pthread_mutex_lock(&in->mu);
	int cancelled = in->cancelled;
	pthread_mutex_unlock(&in->mu);
	if (cancelled) {
		status_set(&job->st, STATUS_INVALID, "the connection closed mid-payload");
		return;
	}
	in->blobs = k3d_publish_request(job, &in->req);
	if (!in->blobs) {
		/* refused at the start: the window lets the payload through, to
		 * be answered once it is in (not begun again then) */
		status_set(&job->st, STATUS_BUSY, "out of memory; retry later");
		in->retried = 1;
		tell_consumed(in, UINT64_MAX);
		return;
	}
	struct store_stage *g = NULL;
	job->st.code = STATUS_OK;
	job->st.message[0] = 0;
	uint64_t window = (uint64_t)in->win.stage * K3D_WINDOW_STAGES;
	struct store *store = job->conn->srv->store;
	const K3cache__V1__Publish *p = job->req->publish;
	int refused = 0;
	if (p->base_key.len &&
	    store_delta_assemble_unread(store, &in->req, p->base_key.data, p->base_rows, &in->delta,
	                                &refused, &job->st) != STATUS_OK) {
		job->delta_refused = refused; /* the worker publishes whole */
		in->retried = 1;
		tell_consumed(in, UINT64_MAX);
		return;
	}
	if (p->base_key.len)
		in->req.blobs = in->delta.blobs; /* its rows read as they arrive */
	store_stage_begin(store, &in->req, window, kick, job, &g, &job->pub, &job->st);
	if (!g) {
		/* no stage reads the base: its read transaction ends now, not
		 * once the rest of the payload has drained */
		in->req.blobs = in->blobs;
		store_delta_free(&in->delta);
		/* refused, or stored already: answered once the payload is in. Its
		 * bytes are not read, so the window lets them through, unless the
		 * answer is BUSY (another publish of this prompt under way) and the
		 * window holds the whole payload: then it is begun again once the
		 * payload is in (k3d_ingest_progress). */
		if (job->st.code != STATUS_BUSY || job->plen > window) {
			in->retried = 1;
			tell_consumed(in, UINT64_MAX);
		}
		return;
	}
	pthread_mutex_lock(&in->mu);
	in->stage = g;
	store_stage_arrived(g, in->arrived);
	if (in->cancelled)
		store_stage_cancel(g);
	pthread_mutex_unlock(&in->mu);
}

/* The writer: the store will not read payload bytes before `consumed`
 * again; the loop is woken when that frees a stage of the window. */
static void tell_consumed(void *ctx, uint64_t consumed)
{
	struct k3d_ingest *in = ctx;
	if (consumed == UINT64_MAX) /* failed: nothing more is read */
		consumed = in->job->plen;
	pthread_mutex_lock(&in->mu);
	in->consumed = consumed;
	pthread_mutex_unlock(&in->mu);
	if (consumed / in->win.stage > in->told / in->win.stage) {
		in->told = consumed;
		k3d_writer_wake_loop(in->w);
	}
}

int k3d_ingest_progress(struct k3d_job *job, int stopping)
{
	struct k3d_ingest *in = job->ingest;
	pthread_mutex_lock(&in->mu);
	int whole = in->complete, gone = in->cancelled;
	if (stopping && !whole && !gone) {
		/* the loop has stopped: the rest never comes */
		in->cancelled = gone = 1;
		if (in->stage)
			store_stage_cancel(in->stage);
	}
	struct store_stage *g = in->stage;
	pthread_mutex_unlock(&in->mu);
	if (!g && whole && !gone && job->st.code == STATUS_BUSY && !in->retried) {
		/* another publish of this prompt was under way when the header came:
		 * look again now that the payload is whole; if it committed, the
		 * answer is "exists" rather than BUSY */
		in->retried = 1;
		free(in->blobs);
		in->blobs = NULL;
		store_delta_free(&in->delta);
		k3d_ingest_begin(in->w, job);
		pthread_mutex_lock(&in->mu);
		g = in->stage;
		pthread_mutex_unlock(&in->mu);
		if (g) {
			k3d_writer_kick(in->w, job);
			return 0;
		}
	}
	if (!g)
		return whole || gone; /* nothing was begun: answer when the payload is in */
	if (!k3d_writer_stage_step(in->w, job, g, stopping, whole, gone, tell_consumed, in))
		return 0; /* a kick comes when there is more to do */
	pthread_mutex_lock(&in->mu);
	in->stage = NULL;
	pthread_mutex_unlock(&in->mu);
	store_stage_end(g, &job->pub, &job->st);
	job->delta_refused = job->pub.delta_refused;
	store_delta_free(&in->delta); /* the base's read transaction ends */
	if (gone && job->st.code == STATUS_OK)
		status_set(&job->st, STATUS_INVALID, "the connection closed mid-payload");
	return 1;
}

void k3d_ingest_free(struct k3d_ingest *in)
{
	if (!in)
		return;
	pthread_mutex_destroy(&in->mu);
	k3d_window_close(in->srv, &in->win);
	store_delta_free(&in->delta);
	free(in->blobs);
	free(in);
}
