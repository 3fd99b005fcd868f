/* writer: the one thread that runs the store's write transactions. Jobs queue
 * in order; consecutive publishes share one commit. Finished jobs go back to
 * the loop thread, which answers them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon.h"
#include "hexutil.h"
#include "service.h"
#include "units.h"

#define BATCH_MAX K3D_PUBLISH_BATCH_MAX

struct k3d_writer {
	struct k3d_server *srv;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct k3d_job *head, *tail; /* queued */
	struct k3d_job *done_head, *done_tail;
	struct k3d_job *streams; /* streamed publishes begun (ingest.c) */
	int stop;
	uint64_t evicted_logged, evicted_bytes_logged; /* log_evictions() */
};

void k3d_job_free(struct k3d_job *job)
{
	k3d_ingest_free(job->ingest);
	k3d_t2_item_free(job->t2);
	k3d_t2_stage_unref(job->t2s);
	frame_request_free(job->req);
	if (!job->streamed) /* a streamed payload is its window, closed above */
		free(job->payload);
	service_response_clear(&job->resp);
	store_verify_end(job->verify);
	free(job);
}

static void finish(struct k3d_writer *w, struct k3d_job *job)
{
	pthread_mutex_lock(&w->mu);
	job->next = NULL;
	if (w->done_tail)
		w->done_tail->next = job;
	else
		w->done_head = job;
	w->done_tail = job;
	pthread_mutex_unlock(&w->mu);
	k3d_writer_wake_loop(w);
}

void k3d_writer_wake_loop(struct k3d_writer *w)
{
	/* An eventfd, not event_active(): that takes libevent's base lock, which
	 * the loop thread, busy with bulk reads, re-takes between callbacks so
	 * often that this thread could wait for it until the loop went idle
	 * (measured: a streamed publish's start waited 120 ms for its payload to
	 * finish arriving). */
	uint64_t one = 1;
	if (write(w->srv->done_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		k3d_log(K3D_LOG_ERROR, "writer: cannot wake the loop: %s", strerror(errno));
}

/* Measured with bench/wire on 2 vCPUs, writer at nice 0 / 5 / 10: publish
 * over the socket 0.75-0.76x / 0.74-0.79x / 0.60-0.76x the in-process
 * store; lookup p99 under two publishers 8.3-9.5 / 5.9-7.5 / 5.3-8.1 ms. At
 * 10 the loop's receive ran ahead and the writer's copy trailed it. */
#define WRITER_NICE 5

/* Under w->mu. */
static int any_kicked(struct k3d_writer *w)
{
	for (struct k3d_job *j = w->streams; j; j = j->snext)
		if (j->kicked)
			return 1;
	return 0;
}

/* Gives each kicked streamed publish one step (all of them when stopping);
 * hands back the finished ones. */
static void progress_streams(struct k3d_writer *w, int stopping)
{
	for (struct k3d_job **pj = &w->streams; *pj;) {
		struct k3d_job *job = *pj;
		pthread_mutex_lock(&w->mu);
		int kicked = job->kicked || stopping;
		job->kicked = 0;
		pthread_mutex_unlock(&w->mu);
		int done = kicked &&
		           (job->chore == K3D_CHORE_T2_STAGE ? k3d_t2_stage_progress(job, stopping)
		                                             : k3d_ingest_progress(job, stopping));
		if (done) {
			*pj = job->snext;
			finish(w, job);
			continue;
		}
		pj = &job->snext;
	}
}

/* A damaged entry a restore found on the loop thread, taken out of service. */
static void quarantine(struct store *s, const uint8_t *key)
{
	char hex[2 * STORE_KEY_LEN + 1];
	hexutil_encode(key, STORE_KEY_LEN, hex);
	switch (store_quarantine(s, key)) {
	case STORE_QUARANTINE_FLAGGED:
		k3d_log(K3D_LOG_WARN, "entry %.16s quarantined: a restore found it damaged", hex);
		break;
	case STORE_QUARANTINE_REMOVED:
		k3d_log(K3D_LOG_WARN, "entry %.16s removed: its record cannot be read", hex);
		break;
	default:
		break; /* gone, or quarantined already */
	}
}

/* A damaged entry a direct reader reported: a restore with every sum
 * checked quarantines it when it is damaged. */
static void check_entry(struct store *s, const uint8_t *key)
{
	struct store_snapshot *snap;
	struct status st;
	enum status_code code = store_restore_opt(s, key, 0, &snap, &st);
	if (code == STATUS_OK) {
		store_snapshot_release(snap);
		return;
	}
	if (code == STATUS_CORRUPT)
		k3d_log(K3D_LOG_WARN, "a direct reader's report: %s", st.message);
}

/* Logs the evictions made for room since the last call, one line a batch
 * (an operator sees the cache turn over, as memcached's evictions stat and
 * Redis's evicted_keys show it). */
static void log_evictions(struct k3d_writer *w)
{
	uint64_t n, bytes;
	store_room_evictions(w->srv->store, &n, &bytes);
	if (n == w->evicted_logged)
		return;
	char human[32];
	units_format_size(bytes - w->evicted_bytes_logged, human, sizeof(human));
	k3d_log(K3D_LOG_INFO, "evicted %llu least recently used entries (%s) to make room",
	        (unsigned long long)(n - w->evicted_logged), human);
	w->evicted_logged = n;
	w->evicted_bytes_logged = bytes;
}

static int stopping(struct k3d_writer *w)
{
	pthread_mutex_lock(&w->mu);
	int stop = w->stop;
	pthread_mutex_unlock(&w->mu);
	return stop;
}

static void *writer_main(void *arg)
{
	struct k3d_writer *w = arg;
	/* Commits are throughput work, requests on the loop are latency work: on
	 * a machine with few cores, a lookup must not queue behind a snapshot's
	 * scan and copy. A nicer writer (its helper threads inherit it) lets
	 * the loop thread run first. Lowering priority needs no privilege. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WRITER_NICE) != 0)
		k3d_log(K3D_LOG_DEBUG, "writer: setpriority: %s", strerror(errno));
	for (;;) {
		pthread_mutex_lock(&w->mu);
		while (!w->head && !w->stop && !any_kicked(w))
			pthread_cond_wait(&w->cv, &w->mu);
		if (!w->head && w->stop) {
			pthread_mutex_unlock(&w->mu);
			/* the loop is gone: finish or remove the streamed publishes */
			while (w->streams)
				progress_streams(w, 1);
			break;
		}
		/* take a run of publishes (one commit), or one other job */
		struct k3d_job *batch[BATCH_MAX] = {0};
		uint32_t n = 0;
		uint64_t bytes = 0;
		while (w->head && n < BATCH_MAX) {
			int pub = !w->head->chore &&
			          w->head->req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH;
			if (n > 0 && (!pub || w->head->streamed))
				break;
			/* a batch never needs more room than the store has */
			if (n > 0 && bytes + w->head->plen > w->srv->cfg.max_bytes)
				break;
			bytes += w->head->plen;
			batch[n++] = w->head;
			w->head = w->head->next;
			if (!w->head)
				w->tail = NULL;
			if (!pub || batch[0]->streamed)
				break;
		}
		pthread_mutex_unlock(&w->mu);
		progress_streams(w, 0);
		log_evictions(w);
		if (n == 0)
			continue;
		if (batch[0]->streamed) {
			/* begun now, written as its bytes arrive */
			if (batch[0]->chore == K3D_CHORE_T2_STAGE)
				k3d_t2_stage_begin(w, batch[0]);
			else
				k3d_ingest_begin(w, batch[0]);
			batch[0]->snext = w->streams;
			w->streams = batch[0];
			k3d_writer_kick(w, batch[0]);
			continue;
		}
		if (batch[0]->chore == K3D_CHORE_FLUSH)
			store_flush(w->srv->store, NULL);
		else if (batch[0]->chore == K3D_CHORE_SYNC)
			store_sync(w->srv->store, NULL);
		else if (batch[0]->chore == K3D_CHORE_VERIFY)
			store_snapshot_verify(batch[0]->stream->snap, &batch[0]->st);
		else if (batch[0]->chore == K3D_CHORE_QUARANTINE)
			quarantine(w->srv->store, batch[0]->key);
		else if (batch[0]->chore == K3D_CHORE_CHECK)
			check_entry(w->srv->store, batch[0]->key);
		else if (batch[0]->req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH)
			k3d_publish_batch(w->srv, batch, n);
		else if (k3d_writer_run_one(w->srv, batch[0], stopping(w))) {
			/* more to do: behind the jobs that came meanwhile */
			k3d_writer_submit(w, batch[0]);
			continue;
		}
		for (uint32_t i = 0; i < n; i++)
			finish(w, batch[i]);
		log_evictions(w);
	}
	return NULL;
}

struct k3d_writer *k3d_writer_start(struct k3d_server *srv)
{
	struct k3d_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->srv = srv;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
		free(w);
		return NULL;
	}
	return w;
}

int k3d_writer_stage_step(struct k3d_writer *w, struct k3d_job *job, struct store_stage *g,
                          int stopping, int whole, int gone,
                          void (*tell)(void *ctx, uint64_t consumed), void *ctx)
{
	int step;
	for (;;) {
		step = store_stage_step(g, 1);
		if (step == STORE_STAGE_MORE) {
			if (!stopping) {
				tell(ctx, store_stage_consumed(g));
				k3d_writer_kick(w, job); /* one stage, then other jobs */
				return 0;
			}
			continue;
		}
		if (step == STORE_STAGE_WAIT && stopping && whole) {
			store_stage_wait(g); /* shutting down: finish this one */
			continue;
		}
		break;
	}
	tell(ctx, store_stage_consumed(g));
	return step != STORE_STAGE_WAIT && (whole || gone);
}

void k3d_writer_kick(struct k3d_writer *w, struct k3d_job *job)
{
	pthread_mutex_lock(&w->mu);
	job->kicked = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

int k3d_writer_streaming(const struct k3d_writer *w)
{
	return w->streams != NULL;
}

void k3d_writer_submit(struct k3d_writer *w, struct k3d_job *job)
{
	pthread_mutex_lock(&w->mu);
	job->next = NULL;
	if (w->tail)
		w->tail->next = job;
	else
		w->head = job;
	w->tail = job;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static int chore_on_key(struct k3d_writer *w, enum k3d_chore chore,
                        const uint8_t key[STORE_KEY_LEN])
{
	struct k3d_job *job = calloc(1, sizeof(*job));
	if (!job) {
		k3d_log(K3D_LOG_ERROR,
		        "writer: out of memory: a damaged entry stays unquarantined");
		return -1;
	}
	k3cache__v1__response__init(&job->resp);
	job->chore = chore;
	memcpy(job->key, key, STORE_KEY_LEN);
	k3d_writer_submit(w, job);
	return 0;
}

void k3d_writer_quarantine(struct k3d_writer *w, const uint8_t key[STORE_KEY_LEN])
{
	(void)chore_on_key(w, K3D_CHORE_QUARANTINE, key);
}

int k3d_writer_check(struct k3d_writer *w, const uint8_t key[STORE_KEY_LEN])
{
	return chore_on_key(w, K3D_CHORE_CHECK, key);
}

struct k3d_job *k3d_writer_take_done(struct k3d_writer *w)
{
	pthread_mutex_lock(&w->mu);
	struct k3d_job *list = w->done_head;
	w->done_head = w->done_tail = NULL;
	pthread_mutex_unlock(&w->mu);
	return list;
}

void k3d_writer_stop(struct k3d_writer *w)
{
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
}

void k3d_writer_free(struct k3d_writer *w)
{
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
	free(w);
}
