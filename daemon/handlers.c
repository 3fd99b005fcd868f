/* handlers: the daemon's dispatch, and the ops too small for a file of their
 * own. Reads of the store run on the loop thread (LMDB readers never wait
 * for the writer); writes go to the writer thread. A lookup or restore is
 * restore.c's, a publish publish.c's and ingest.c's. Every answer echoes the
 * request id. */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "service.h"

static void done(struct k3d_conn *c)
{
	/* a request answered on the loop thread: ready for the next one */
	k3d_conn_reset(c);
}

/* ---- ops on the loop thread ------------------------------------------------- */

static void op_hello(struct k3d_conn *c)
{
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	r.protocol = 1;
	r.server = (char *)K3D_VERSION;
	if (c->req->hello->protocol != 0 && c->req->hello->protocol != 1) {
		r.code = K3CACHE__V1__CODE__UNSUPPORTED;
		r.message = (char *)"this daemon speaks protocol 1";
	}
	struct status st;
	if (!r.code &&
	    k3d_peer_hello(&c->srv->tenancy, &c->who, c->req->hello->token, &st) != STATUS_OK) {
		k3d_conn_error(c, c->req->id, &st);
		k3d_conn_close_after_reply(c); /* one guess per connection */
		return;
	}
	r.namespace_.data = (uint8_t *)c->who.ns;
	r.namespace_.len = c->who.ns_len;
	/* which file it serves: a same-host direct reader checks it opened it */
	(void)store_file_id(c->srv->store, &r.store_dev, &r.store_ino);
	k3d_conn_respond(c, &r);
}

/* Restore by key serves a peer only its own entries (tenancy.h); to others
 * the key does not exist. */
int k3d_owns_entry(struct k3d_conn *c, const uint8_t *key, struct status *st)
{
	if (c->who.admin)
		return 1;
	struct store_entry_info *info = NULL;
	enum status_code code = store_inspect_record(c->srv->store, key, &info, st);
	if (code == STATUS_NOT_FOUND) /* absent: the restore says so, as for anyone */
		return 1;
	if (code == STATUS_INTERNAL) /* out of memory: not an answer about the entry */
		return -1;
	if (code != STATUS_OK) /* a damaged record: whose it is cannot be read */
		return 0;
	int own = k3d_peer_owns(&c->who, info->salt, info->salt_len);
	store_entry_info_free(info);
	return own;
}

/* Whether key's check (K3D_CHORE_CHECK) is queued; -1 when not. */
static int check_queued(const struct k3d_server *srv, const uint8_t *key)
{
	for (uint32_t i = 0; i < srv->n_checks; i++)
		if (!memcmp(srv->checks[i], key, STORE_KEY_LEN))
			return (int)i;
	return -1;
}

void k3d_report_checked(struct k3d_server *srv, const uint8_t key[STORE_KEY_LEN])
{
	int i = check_queued(srv, key);
	if (i >= 0)
		memcpy(srv->checks[i], srv->checks[--srv->n_checks], STORE_KEY_LEN);
}

/* A direct reader's report: its restores count as uses, and the entries it
 * found damaged are checked by the writer (a report alone quarantines
 * nothing). A tenant reports on its own entries only; others are skipped.
 * Each check reads a whole entry on the writer thread, ahead of the
 * publishes queued after it, so a key already queued is not queued again,
 * and at most K3D_CHECKS_MAX are queued at once: the rest are dropped and
 * counted (a reader that finds the entry damaged again reports it again).
 * Reports cannot fill the writer's queue, nor the daemon's memory. */
static void op_report(struct k3d_conn *c)
{
	const K3cache__V1__Report *r = c->req->report;
	struct k3d_server *srv = c->srv;
	struct status st;
	for (size_t i = 0; i < r->n_used; i++)
		if (k3d_owns_entry(c, r->used[i].data, &st) > 0) {
			store_note_use(srv->store, r->used[i].data);
			srv->reported_uses++;
		}
	for (size_t i = 0; i < r->n_damaged; i++) {
		const uint8_t *key = r->damaged[i].data;
		if (k3d_owns_entry(c, key, &st) <= 0 || check_queued(srv, key) >= 0)
			continue;
		srv->reported_damaged++;
		if (srv->n_checks == K3D_CHECKS_MAX) {
			srv->reports_dropped++;
			continue;
		}
		if (k3d_writer_check(srv->writer, key) == 0)
			memcpy(srv->checks[srv->n_checks++], key, STORE_KEY_LEN);
		else
			srv->reports_dropped++; /* out of memory (logged) */
	}
	frame_response resp = K3CACHE__V1__RESPONSE__INIT;
	resp.id = c->req->id;
	k3d_conn_respond(c, &resp);
}

/* A brief Inspect from a tenant: another's entry is absent (an empty
 * answer), as for a restore. */
static void op_inspect(struct k3d_conn *c, frame_response *r)
{
	struct status st;
	int own = c->req->inspect->key.len != 32
	                  ? 1
	                  : k3d_owns_entry(c, c->req->inspect->key.data, &st);
	if (own < 0)
		service_fail(r, &st);
	else if (own)
		(void)service_dispatch(c->srv->store, c->req, r);
}

/* List: the store's entries, or with tier2 the cluster's (t2.h), which c
 * waits for. */
static void answer(struct k3d_conn *c, void (*fill)(struct k3d_conn *, frame_response *));
static void op_list(struct k3d_conn *c)
{
	if (!c->req->list->tier2) {
		answer(c, NULL);
		return;
	}
	if (!c->srv->t2) {
		k3d_conn_errorf(c, STATUS_UNSUPPORTED,
		                "this daemon has no second tier (start it with --tier2)");
		return;
	}
	k3d_t2_list(c);
}

static void op_stat(struct k3d_conn *c, frame_response *r)
{
	k3d_fill_counters(c->srv, r);
}

/* Answers an op by fill, or else by service_dispatch(); an op neither
 * knows is unsupported. */
static void answer(struct k3d_conn *c, void (*fill)(struct k3d_conn *, frame_response *))
{
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	if (fill) {
		fill(c, &r);
	} else if (!service_dispatch(c->srv->store, c->req, &r)) {
		k3d_conn_errorf(c, STATUS_UNSUPPORTED, "unknown op");
		return;
	}
	k3d_conn_respond(c, &r);
	service_response_clear(&r);
}

/* ---- ops for the writer ------------------------------------------------------ */

static void to_writer(struct k3d_conn *c)
{
	struct k3d_job *job = calloc(1, sizeof(*job));
	if (!job) {
		k3d_conn_errorf(c, STATUS_BUSY, "out of memory; retry later");
		return;
	}
	k3cache__v1__response__init(&job->resp);
	job->conn = c;
	job->req = c->req;
	job->payload = c->payload;
	job->plen = c->plen;
	job->t_request = c->t_request;
	/* the job owns request and payload now; the reservation stays with the
	 * connection until the job is done */
	c->req = NULL;
	c->payload = NULL;
	k3d_conn_submit(c, job);
	k3d_conn_set_state(c, K3D_BUSY);
}

/* How the loop answers each op that is not the writer's (ops.h): by a
 * handler of its own, by one that fills an answer, or, with neither, by
 * service_dispatch() (the ops that need only the store). */
struct loop_op {
	void (*handle)(struct k3d_conn *c);
	void (*fill)(struct k3d_conn *c, frame_response *r);
};

static const struct loop_op loop_ops[OPS_N] = {
        [OPS_HELLO] = {.handle = op_hello},         [OPS_LOOKUP] = {.handle = k3d_op_lookup},
        [OPS_RESTORE] = {.handle = k3d_op_restore}, [OPS_REPORT] = {.handle = op_report},
        [OPS_INSPECT] = {.fill = op_inspect},       [OPS_STAT] = {.fill = op_stat},
        [OPS_LIST] = {.handle = op_list},
};

void k3d_handle(struct k3d_conn *c)
{
	enum ops_id op = ops_of(c->req);
	const struct loop_op *l = &loop_ops[op];
	if (ops_table[op].writer) {
		if (!c->srv->stopping) {
			to_writer(c);
			return; /* answered when the writer hands the job back */
		}
		k3d_conn_errorf(c, STATUS_BUSY, "the daemon is shutting down");
	} else if (l->handle) {
		l->handle(c);
		if (c->state == K3D_TIER2)
			return; /* a lookup answered when the second tier has (t2.h) */
	} else {
		answer(c, l->fill);
	}
	done(c);
}

/* ---- the writer's side: run in the writer thread ------------------------------ */

/* The writer's ops but a publish, which writer.c batches (ops.h): each by
 * service_dispatch(), but a verify, run in batches. One returns 1 when it
 * has more to do: the writer queues it again behind the jobs that came
 * meanwhile, unless the daemon is stopping (daemon.h). */
/* A verify reads the whole store: it runs K3D_VERIFY_BATCH bytes at a time,
 * so that publishes wait behind one batch, not the whole. A streamed publish
 * is written between the writer's jobs, a window at a time: while one is in
 * progress the batches are smaller, or its upload would crawl. */
static int run_verify(struct k3d_server *srv, struct k3d_job *job, int stopping)
{
	uint64_t budget =
	        k3d_writer_streaming(srv->writer) ? K3D_VERIFY_BATCH_STREAMING : K3D_VERIFY_BATCH;
	if (stopping && job->verify)
		service_verify_cancel(&job->verify, "the daemon is stopping", &job->resp);
	else if (service_verify_step(srv->store, &job->verify, budget, &job->resp)) {
		uint64_t done, total;
		store_verify_progress(job->verify, &done, &total);
		atomic_store(&srv->verify_total, total);
		atomic_store(&srv->verify_done, done);
		job->batches++;
		return 1;
	}
	atomic_store(&srv->verify_total, 0);
	atomic_store(&srv->verify_done, 0);
	if (job->resp.code != 0)
		k3d_log(K3D_LOG_WARN, "verify: stopped after %llu entries checked: %s",
		        (unsigned long long)job->resp.checked,
		        job->resp.message ? job->resp.message : "");
	else if (job->batches)
		k3d_log(K3D_LOG_INFO, "verify: %llu entries checked in %u batches",
		        (unsigned long long)job->resp.checked, job->batches + 1);
	return 0;
}

static int (*const writer_ops[OPS_N])(struct k3d_server *, struct k3d_job *, int) = {
        [OPS_VERIFY] = run_verify,
};

int k3d_writer_run_one(struct k3d_server *srv, struct k3d_job *job, int stopping)
{
	int (*run)(struct k3d_server *, struct k3d_job *, int) = writer_ops[ops_of(job->req)];
	if (run)
		return run(srv, job, stopping);
	(void)service_dispatch(srv->store, job->req, &job->resp);
	return 0;
}
