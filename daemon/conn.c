/* conn: one client connection as an explicit state machine (as memcached's
 * conn_states): read the length, read the header, wait for memory, read the
 * payload (straight into its buffer), hand the request over, write the reply
 * (restores stream from the map by reference), and back.
 *
 * Backpressure: a connection whose replies are not drained is not read, and a
 * publish waits before its payload is read while the daemon holds more than
 * --max-inflight bytes for publishes. */
#include <errno.h>
#include <event2/buffer.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"
#include "model.h"
#include "service.h"
#include "window.h"

#define OUT_HIGH_WATER (8u << 20)
#define READ_SLICE     (2u << 20)
#define BULK_BYTES     (1u << 20) /* a transfer this large is bulk */
#define WRITE_SLICE    (2u << 20) /* bytes written per write callback */
#define YIELD_WINDOW   0.05       /* s: lookups count as arriving this long */

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void process(struct k3d_conn *c);

/* Whether c's read event is enabled. */
static int reading(const struct k3d_conn *c)
{
	return event_pending(c->rev, EV_READ, NULL) != 0;
}

static void set_reading(struct k3d_conn *c, int on)
{
	/* a paused upload is read again when its pause ends; a closing or a
	 * closed connection never */
	if (on && (c->state == K3D_YIELD || c->state == K3D_CLOSING || c->state == K3D_DEAD))
		return;
	if (on == reading(c))
		return;
	if (on)
		event_add(c->rev, NULL);
	else
		event_del(c->rev);
}

/* Bulk transfers (a payload coming in, a restore going out) run at the low
 * priority: libevent runs every ready high-priority event (a lookup, a small
 * answer) before the next slice of a bulk one. A demoted connection's run at
 * the low one too (take_turn). event_priority_set refuses an event that is
 * active; then it keeps its priority until the next call. */
static void set_prio(const struct k3d_conn *c, struct event *ev, int bulk)
{
	(void)event_priority_set(ev, bulk || c->demoted ? K3D_PRIO_BULK : K3D_PRIO_HIGH);
}

static int reading_bulk(const struct k3d_conn *c)
{
	return (c->state == K3D_READ_PAYLOAD || c->state == K3D_DISCARD) && c->plen >= BULK_BYTES;
}

/* Fairness between the priorities. libevent runs every ready high-priority
 * event before any bulk one, so a client keeping its connection busy with
 * small pipelined requests would hold every upload and restore still for as
 * long as it went on. So when no bulk callback has run for FAIR_SECONDS while
 * high-priority ones kept running, and another connection has a transfer in
 * progress (bulk_waits: not an upload paused by --yield-rate, whose reading
 * is off), the connection whose callback runs takes its next turn at the
 * bulk priority, behind the bulk events ready then (libevent runs that
 * queue whole once the high one is empty); that turn gives it its priority
 * back. So each transfer moves a slice (2 MiB) about every FAIR_SECONDS
 * (the look comes at the start of a callback, which may itself take a
 * slice's time). A transfer whose socket is not ready (a slow reader) makes
 * a demoted connection wait for nothing: it runs once the high queue is
 * empty. */
#define FAIR_SECONDS 0.02

/* A transfer in progress: an event added at the bulk priority. A demoted
 * connection's events are at the bulk priority for its turn whatever it
 * does (and stay so if it goes idle then): it counts only for an upload
 * being read or an answer being sent (a restore streaming, or 1 MiB or more
 * queued), which may have begun since it was demoted. */
static int bulk_waits(const struct k3d_conn *o)
{
	int rev = event_pending(o->rev, EV_READ, NULL) != 0;
	int wev = event_pending(o->wev, EV_WRITE, NULL) != 0;
	if (o->demoted)
		return (rev && reading_bulk(o)) ||
		       (wev && (o->sending || evbuffer_get_length(o->out) >= BULK_BYTES));
	return (rev && event_get_priority(o->rev) == K3D_PRIO_BULK) ||
	       (wev && event_get_priority(o->wev) == K3D_PRIO_BULK);
}

static int others_wait(const struct k3d_conn *c)
{
	for (const struct k3d_conn *o = c->srv->conns; o; o = o->next)
		if (o != c && bulk_waits(o))
			return 1;
	return 0;
}

/* First in each of c's callbacks; ev is the one running. */
static void take_turn(struct k3d_conn *c, struct event *ev)
{
	struct k3d_server *srv = c->srv;
	double t = k3d_now();
	if (event_get_priority(ev) == K3D_PRIO_BULK) {
		srv->bulk_turn = t;
		if (c->demoted) {
			c->demoted = 0;
			set_prio(c, c->rev, reading_bulk(c));
			set_prio(c, c->wev, evbuffer_get_length(c->out) >= BULK_BYTES);
		}
		return;
	}
	if (t - srv->bulk_turn < FAIR_SECONDS)
		return;
	srv->bulk_turn = t; /* one look (and demotion) per interval */
	if (!others_wait(c))
		return;
	c->demoted = 1;
	set_prio(c, c->rev, 1);
	set_prio(c, c->wev, 1);
}

#define K3D_STATE_NAME(s) [K3D_##s] = #s,
static const char *const state_names[] = {K3D_CONN_STATES(K3D_STATE_NAME)};
#undef K3D_STATE_NAME

/* As memcached's conn_set_state: every change of state comes through here,
 * and is traced at debug level. */
void k3d_conn_set_state(struct k3d_conn *c, enum k3d_conn_state state)
{
	enum k3d_conn_state from = c->state;
	/* final: a closing connection is never read again, a dead one is only
	 * waiting to be freed */
	if (from == K3D_DEAD || (from == K3D_CLOSING && state != K3D_DEAD))
		return;
	if (from != state) {
		k3d_log(K3D_LOG_DEBUG, "conn %llu: %s -> %s", (unsigned long long)c->id,
		        state_names[from], state_names[state]);
		c->state = state;
	}
	if (state == K3D_YIELD || state == K3D_CLOSING || state == K3D_DEAD)
		set_reading(c, 0);
	set_prio(c, c->rev, reading_bulk(c));
}

void k3d_conn_submit(struct k3d_conn *c, struct k3d_job *job)
{
	c->jobs_out++;
	k3d_writer_submit(c->srv->writer, job);
}

void k3d_conn_want_write(struct k3d_conn *c)
{
	if (evbuffer_get_length(c->out) > 0) {
		set_prio(c, c->wev, evbuffer_get_length(c->out) >= BULK_BYTES);
		event_add(c->wev, NULL);
	}
}

void k3d_conn_close_after_reply(struct k3d_conn *c)
{
	c->in_start = c->in_end = 0;
	k3d_conn_set_state(c, K3D_CLOSING);
	event_active(c->wev, EV_WRITE, 0);
}

void k3d_conn_accept(struct k3d_server *srv, int fd, const char *peer, int tcp)
{
	struct k3d_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		srv->connections_refused++; /* accept_errors */
		k3d_log(K3D_LOG_WARN, "accept (%s): out of memory: connection closed", peer);
		close(fd);
		return;
	}
	evutil_make_socket_nonblocking(fd);
	int big = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	c->srv = srv;
	c->fd = fd;
	c->id = ++srv->next_conn_id;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	k3d_peer_identify(&srv->tenancy, fd, tcp, &c->who);
	c->out = evbuffer_new();
	c->rev = event_new(srv->base, fd, EV_READ | EV_PERSIST, on_read, c);
	c->wev = event_new(srv->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
	if (c->rev)
		set_prio(c, c->rev, 0);
	if (c->wev)
		set_prio(c, c->wev, 0);
	if (!c->out || !c->rev || !c->wev) {
		if (c->out)
			evbuffer_free(c->out);
		if (c->rev)
			event_free(c->rev);
		if (c->wev)
			event_free(c->wev);
		free(c);
		srv->connections_refused++; /* accept_errors */
		k3d_log(K3D_LOG_WARN, "accept (%s): out of memory: connection closed", peer);
		close(fd);
		return;
	}
	c->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = c;
	srv->conns = c;
	c->last_progress = c->last_request = srv->ticks;
	srv->connections_total++;
	srv->connections_open++;
	set_reading(c, 1);
	k3d_log(K3D_LOG_DEBUG, "conn %llu: open (%s)", (unsigned long long)c->id, peer);
}

/* A connection whose trial window is in and that waits for its whole
 * payload's reservation stops waiting. */
static void end_trial_wait(struct k3d_conn *c)
{
	if (c->trial && c->state == K3D_WAIT_MEMORY)
		c->srv->waiting_trials -= c->reserved;
}

static void release_reservation(struct k3d_conn *c)
{
	end_trial_wait(c);
	if (c->reserved) {
		c->srv->inflight_bytes -= c->reserved;
		c->reserved = 0;
	}
}

/* Frees the current request (decoded: its tokens and layer list) and gives
 * back the share of header_bytes its header was charged. */
static void drop_request(struct k3d_conn *c)
{
	c->srv->header_bytes -= c->hcharge;
	c->hcharge = 0;
	frame_request_free(c->req);
	c->req = NULL;
}

void k3d_conn_reset(struct k3d_conn *c)
{
	free(c->hdr);
	c->hdr = NULL;
	drop_request(c);
	release_reservation(c); /* first: the pool may keep what it frees */
	k3d_pool_put(c->srv, c->payload, c->pcap);
	c->payload = NULL;
	c->pcap = 0;
	c->win = NULL;
	c->hlen = c->hgot = 0;
	c->plen = c->pgot = 0;
	c->answered = 0;
	c->trial = 0;
	c->rate_mark = c->rate_ticks = 0;
	/* a restore still queueing its chunks is answered first */
	k3d_conn_set_state(c, c->sending ? K3D_SENDING : K3D_READ_LEN);
}

static void conn_free(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	k3d_conn_reset(c);
	event_free(c->rev);
	event_free(c->wev);
	if (c->yield_ev)
		event_free(c->yield_ev);
	evbuffer_free(c->out); /* drops the queued chunks of a restore */
	if (c->sending)        /* and the chunks not yet queued */
		k3d_stream_unref(c->sending);
	if (c->cut) /* a cut restore's map pages: no queued chunk points there now */
		k3d_stream_unref(c->cut);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
	k3d_conn_resume_waiting(srv);
}

/* Whether the connection is inside a frame: part of it has been taken in and
 * the rest has not (the one test for the closed_mid_frame count, end of input
 * and time-outs). A publish waiting for in-flight memory is mid-frame: its
 * header is in. Bytes received but not yet parsed are not: they may be whole
 * requests, which end of input still answers. */
static int mid_frame(const struct k3d_conn *c)
{
	switch (c->state) {
	case K3D_READ_HEADER:
	case K3D_WAIT_MEMORY:
	case K3D_READ_PAYLOAD:
	case K3D_YIELD:
	case K3D_WAIT_WINDOW:
	case K3D_DISCARD:
		return 1;
	case K3D_READ_LEN:
		return c->hgot > 0;
	case K3D_BUSY:
	case K3D_SENDING:
	case K3D_TIER2:
	case K3D_CLOSING: /* none of its input is awaited; close_cut() counted a cut frame */
	case K3D_DEAD:
		return 0;
	}
	return 0;
}

/* A refused payload skipped after its answer went (c->answered): a client
 * that stops sending it and closes has cut nothing it was owed. */
static int answered_discard(const struct k3d_conn *c)
{
	return c->state == K3D_DISCARD && c->answered;
}

void k3d_conn_close(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	if (c->state == K3D_DEAD)
		return;
	if (mid_frame(c) && !answered_discard(c))
		srv->closed_mid_frame++;
	if (c->prev)
		c->prev->next = c->next;
	else
		srv->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	srv->connections_open--;
	k3d_log(K3D_LOG_DEBUG, "conn %llu: closed", (unsigned long long)c->id);
	event_del(c->rev);
	event_del(c->wev);
	k3d_t2_forget(c);             /* a lookup waiting for the second tier */
	if (c->ingest)                /* the writer has our streamed publish */
		k3d_ingest_cancel(c); /* it removes what it wrote, then hands it back */
	if (c->jobs_out) {
		/* the writer holds jobs of ours: free us when the last is back;
		 * a trial window waiting for its whole stops waiting now (the
		 * state that says so is gone). The socket goes now: its client
		 * learns at once, not when the writer is done (a store that
		 * hangs would keep it waiting as long) */
		end_trial_wait(c);
		k3d_conn_set_state(c, K3D_DEAD);
		close(c->fd);
		c->fd = -1;
		return;
	}
	conn_free(c);
}

/* A job of c's is back from the writer: whether c is dead and held only by
 * it (then it has been freed). */
static int job_back(struct k3d_conn *c)
{
	c->jobs_out--;
	if (c->state != K3D_DEAD)
		return 0;
	if (!c->jobs_out)
		conn_free(c);
	return 1;
}

void k3d_conn_request_done(struct k3d_conn *c)
{
	if (job_back(c))
		return;
	k3d_conn_reset(c);
	k3d_conn_resume_waiting(c->srv);
	process(c);
}

void k3d_conn_answered(struct k3d_conn *c)
{
	k3d_conn_reset(c);
	process(c);
}

void k3d_conn_orphan_done(struct k3d_conn *c)
{
	(void)job_back(c);
}

void k3d_conn_ingest_ended(struct k3d_conn *c)
{
	c->ingest = NULL;
	c->win = NULL;
	c->payload = NULL; /* the job's window, closed with it */
	if (!job_back(c))
		k3d_conn_close(c);
}

/* The answer cannot be queued (out of memory): the connection closes once
 * what is queued before it has gone, so that the client is told at once
 * instead of waiting for an answer that will never come. */
static void lost_answer(struct k3d_conn *c)
{
	c->srv->errors[STATUS_INTERNAL]++;
	k3d_log(K3D_LOG_WARN, "conn %llu (%s): out of memory queueing an answer: closing it",
	        (unsigned long long)c->id, c->peer);
	k3d_conn_set_state(c, K3D_CLOSING);
	event_active(c->wev, EV_WRITE, 0);
}

int k3d_conn_queue(struct k3d_conn *c, frame_response *resp)
{
	struct k3d_server *srv = c->srv;
	unsigned char *buf = NULL;
	size_t n = frame_encode_response(resp, &buf);
	if (!n) {
		/* over the 16 MiB header limit, or out of memory: a short answer
		 * that says which instead, so the client is not left waiting */
		int large = frame_response_too_large(resp);
		frame_response small = K3CACHE__V1__RESPONSE__INIT;
		small.id = resp->id;
		small.code = large ? K3CACHE__V1__CODE__TOO_LARGE : K3CACHE__V1__CODE__INTERNAL;
		small.message =
		        large ? (char *)"the answer would be over the 16 MiB header limit; ask for "
		                        "fewer (a smaller --limit, or a narrower selector)"
		              : (char *)"out of memory encoding the answer";
		k3d_log(K3D_LOG_WARN, "conn %llu: %s", (unsigned long long)c->id, small.message);
		n = frame_encode_response(&small, &buf);
		if (!n || evbuffer_add(c->out, buf, n) != 0) {
			free(buf);
			lost_answer(c);
			return 0;
		}
		free(buf);
		srv->errors[large ? STATUS_TOO_LARGE : STATUS_INTERNAL]++;
		k3d_conn_want_write(c);
		return 0;
	}
	if (evbuffer_add(c->out, buf, n) != 0) {
		free(buf);
		lost_answer(c);
		return 0;
	}
	free(buf);
	if ((unsigned)resp->code < STATUS_N_CODES && resp->code != 0)
		srv->errors[resp->code]++;
	if (c->req && c->t_request > 0) {
		k3d_metrics_observe(srv, ops_of(c->req), k3d_now() - c->t_request);
		c->t_request = 0;
	}
	k3d_conn_want_write(c);
	return 1;
}

void k3d_conn_respond(struct k3d_conn *c, frame_response *resp)
{
	(void)k3d_conn_queue(c, resp);
}

enum k3d_log k3d_status_level(enum status_code code)
{
	/* the daemon's own trouble (a full disk or store, damage, a failure) is
	 * the operator's business; a client's bad request is not */
	return code == STATUS_FULL || code == STATUS_CORRUPT || code == STATUS_INTERNAL
	               ? K3D_LOG_WARN
	               : K3D_LOG_INFO;
}

void k3d_conn_error(struct k3d_conn *c, uint64_t id, const struct status *st)
{
	frame_response resp = K3CACHE__V1__RESPONSE__INIT;
	resp.id = id;
	resp.code = (K3cache__V1__Code)st->code;
	resp.message = (char *)st->message;
	k3d_log(k3d_status_level(st->code), "conn %llu (%s): %s: %s", (unsigned long long)c->id,
	        c->peer, status_code_name(st->code), st->message);
	(void)k3d_conn_queue(c, &resp);
}

void k3d_conn_errorf(struct k3d_conn *c, enum status_code code, const char *fmt, ...)
{
	struct status st;
	va_list ap;
	va_start(ap, fmt);
	st.code = code;
	vsnprintf(st.message, sizeof(st.message), fmt, ap);
	va_end(ap);
	k3d_conn_error(c, c->req->id, &st);
}

/* ---- reading --------------------------------------------------------------- */

static int take(struct k3d_conn *c, unsigned char *dst, size_t want)
{
	size_t have = c->in_end - c->in_start;
	size_t n = have < want ? have : want;
	if (n) {
		if (dst)
			memcpy(dst, c->in + c->in_start, n);
		c->in_start += n;
		if (c->in_start == c->in_end)
			c->in_start = c->in_end = 0;
	}
	return (int)n;
}

/* Closes c after its replies because its input cannot be read on, counted
 * in closed_mid_frame when that leaves a frame unfinished (CLOSING itself
 * is never mid-frame: the count is taken here). */
static void close_cut(struct k3d_conn *c)
{
	if (mid_frame(c) && !answered_discard(c))
		c->srv->closed_mid_frame++;
	k3d_conn_set_state(c, K3D_CLOSING);
}

static void fatal_frame(struct k3d_conn *c, const struct status *st)
{
	/* the stream cannot be trusted past this point: answer, then close */
	k3d_conn_error(c, 0, st);
	c->in_start = c->in_end = 0;
	close_cut(c);
	k3d_conn_want_write(c);
}

/* Refuses the request whose payload is coming, for st: its payload is
 * skipped as it comes (DISCARD), holding no memory meanwhile (a trial
 * window taken is given back). One over the stage size is answered now: a
 * client that sees the answer while it sends stops, and closes (the library
 * does), instead of uploading hundreds of MiB to be refused; one that sends
 * on keeps its connection. */
static void refuse_payload(struct k3d_conn *c, const struct status *st)
{
	c->pending = *st;
	c->pending_id = c->req->id;
	c->pending_op = (int)ops_of(c->req);
	release_reservation(c);
	k3d_pool_put(c->srv, c->payload, c->pcap);
	c->payload = NULL;
	c->pcap = 0;
	c->trial = 0;
	if (c->plen > store_stage_bytes(c->srv->store)) {
		k3d_conn_error(c, c->pending_id, &c->pending);
		c->answered = 1;
	}
	/* skipping the payload needs none of the request: its decoded header
	 * (a layer list many times the header's size) is not kept, uncharged,
	 * for as long as the client takes to send what is skipped */
	drop_request(c);
	k3d_conn_set_state(c, K3D_DISCARD);
}

/* For a PutModel from a peer that is not an admin: whether the store holds
 * the model already (a put of it is then answered as before). */
static int model_stored(const struct k3d_conn *c)
{
	if (c->req->op_case != K3CACHE__V1__REQUEST__OP_PUT_MODEL || c->who.admin)
		return 0;
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = service_spec_from_wire(c->req->put_model->model, err);
	if (!m)
		return 1; /* let the put say what is wrong with it */
	int stored = store_model_stored(c->srv->store, m->fingerprint);
	model_free(m);
	return stored;
}

static void header_done(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	struct status st;
	c->req = frame_decode_request(c->hdr, c->hlen, &st);
	free(c->hdr);
	c->hdr = NULL;
	c->rate_mark = c->rate_ticks = 0; /* the payload's rate is measured afresh */
	if (!c->req) {
		fatal_frame(c, &st);
		return;
	}
	c->t_request = k3d_now();
	c->last_request = srv->ticks;
	c->plen = c->req->payload_len; /* k3d_ingest_wants, DISCARD and WAIT_MEMORY read it */
	c->pgot = 0;
	c->waited = 0;
	srv->requests[ops_of(c->req)]++;
	enum status_code code = frame_check_request(c->req, srv->cfg.max_payload, &st);
	if (code == STATUS_TOO_LARGE) { /* over --max-payload: never read */
		st.code = code;
		k3d_conn_error(c, c->req->id, &st);
		c->in_start = c->in_end = 0;
		close_cut(c);
		return;
	}
	if (code == STATUS_OK)
		code = k3d_peer_admit(&c->who, c->req, model_stored(c), &st);
	/* a publish the daemon would stream: what its header alone is refused
	 * for (an unknown model, a wrong layer count, over the capacity) */
	if (code == STATUS_OK && k3d_ingest_wants(c))
		code = k3d_publish_precheck(srv, c->req, &st);
	if (code != STATUS_OK) {
		refuse_payload(c, &st);
		return;
	}
	if (c->req->payload_len == 0) {
		k3d_handle(c);
		return;
	}
	k3d_conn_set_state(c, K3D_WAIT_MEMORY);
}

/* Reserves in-flight bytes and allocates the payload buffer; 0 when it must
 * wait. A payload larger than the whole cap is let through alone. A payload
 * over K3D_TRIAL_BYTES is reserved in two steps: its first K3D_TRIAL_BYTES
 * into a buffer of that size, then, once they are in, the whole (those bytes
 * copied over), so that uploads which send little hold little. */
static int reserve_payload(struct k3d_conn *c)
{
	struct k3d_server *srv = c->srv;
	int trial = !c->trial && c->pgot == 0 && c->plen > K3D_TRIAL_BYTES;
	/* a large publish is received through a window of a few stages */
	int windowed = !trial && k3d_ingest_wants(c);
	uint64_t want = trial      ? K3D_TRIAL_BYTES
	                : windowed ? k3d_window_bytes(srv, c->plen)
	                           : c->plen;
	uint64_t others = srv->inflight_bytes - c->reserved;
	/* Trial windows that wait for their whole do not count against one
	 * another: each would wait for the others for ever. (So the cap can
	 * be passed by a trial window per waiting publish.) */
	if (c->trial)
		others -= srv->waiting_trials - c->reserved;
	if (others > 0 && others + want > srv->cfg.max_inflight) {
		if (!c->waited) { /* a request that waits, once (it is tried again and again) */
			c->waited = 1;
			srv->busy_pauses++;
		}
		return 0;
	}
	if (windowed) {
		if (k3d_ingest_start(c) != 0) {
			struct status st;
			status_set(&st, STATUS_BUSY,
			           "cannot hold a receive window now; retry later");
			refuse_payload(c, &st);
			return 1;
		}
		release_reservation(c); /* the trial's, and ends its wait */
		k3d_pool_put(srv, c->payload, c->pcap);
		c->payload = c->win->base;
		c->pcap = 0;
		c->trial = 0;
		c->reserved = want;
		srv->inflight_bytes += want;
		srv->payload_tick = srv->ticks;
		srv->idle_trimmed = 0;
		k3d_conn_set_state(c, K3D_READ_PAYLOAD);
		return 1;
	}
	uint64_t cap;
	unsigned char *buf = k3d_pool_get(srv, want, &cap);
	if (!buf) {
		struct status st;
		status_set(&st, STATUS_BUSY, "cannot hold a payload of %llu bytes now; retry later",
		           (unsigned long long)c->plen);
		refuse_payload(c, &st);
		return 1;
	}
	if (c->trial) { /* its first bytes are in: move them to the whole */
		memcpy(buf, c->payload, (size_t)c->pgot);
		release_reservation(c); /* and ends the wait */
		k3d_pool_put(srv, c->payload, c->pcap);
	}
	c->payload = buf;
	c->pcap = cap;
	c->trial = trial;
	c->reserved = cap; /* what is held, when a pooled buffer is larger */
	srv->inflight_bytes += cap;
	srv->payload_tick = srv->ticks;
	srv->idle_trimmed = 0;
	k3d_conn_set_state(c, K3D_READ_PAYLOAD);
	return 1;
}

/* Where the payload buffer ends now: the trial's, the window's, or the
 * whole. */
static uint64_t payload_end(const struct k3d_conn *c)
{
	if (c->trial)
		return K3D_TRIAL_BYTES;
	if (c->win && k3d_window_end(c->win) < c->plen)
		return k3d_window_end(c->win);
	return c->plen;
}

/* A streamed payload whose window is full backs its next stage, or waits
 * for the store to consume the first (K3D_WAIT_WINDOW). A window that
 * cannot grow for want of memory ends the publish: BUSY, answered at once
 * (a streamed payload is over the stage size: refuse_payload), the rest
 * discarded. Its window stays counted in --max-inflight until the writer
 * hands the job back and it is freed (job->held), not while the rest is
 * skipped. */
static void window_next(struct k3d_conn *c)
{
	int rc = k3d_ingest_window(c);
	if (rc == 0) {
		k3d_conn_set_state(c, K3D_READ_PAYLOAD);
	} else if (rc > 0) {
		if (c->state != K3D_WAIT_WINDOW)
			c->srv->window_waits++;
		k3d_conn_set_state(c, K3D_WAIT_WINDOW);
	} else {
		/* the writer hands the job back later (k3d_conn_orphan_done);
		 * this connection discards the rest and answers by itself */
		c->ingest->orphaned = 1; /* still one of c->jobs_out */
		c->ingest->held = c->reserved;
		c->reserved = 0;
		c->pending_id = c->ingest->req->id;
		k3d_ingest_cancel(c);
		status_set(&c->pending, STATUS_BUSY,
		           "out of memory for a receive window; retry later");
		k3d_conn_error(c, c->pending_id, &c->pending);
		c->answered = 1;
		k3d_conn_set_state(c, K3D_DISCARD);
	}
}

void k3d_conn_windows_moved(struct k3d_server *srv)
{
	for (struct k3d_conn *c = srv->conns; c; c = c->next) {
		if (!c->win || c->state == K3D_DEAD)
			continue;
		if (c->state == K3D_WAIT_WINDOW) {
			window_next(c);
			if (c->state != K3D_WAIT_WINDOW)
				process(c);
		} else {
			(void)k3d_ingest_window(c); /* hands back what was consumed */
		}
	}
}

/* After payload bytes arrived: the request is whole, the trial is over, or
 * a streamed publish has more to write. */
static void payload_arrived(struct k3d_conn *c)
{
	if (c->pgot == c->plen) {
		if (c->ingest)
			k3d_ingest_complete(c);
		else
			k3d_handle(c);
	} else if (c->trial && c->pgot == K3D_TRIAL_BYTES) {
		k3d_conn_set_state(c, K3D_WAIT_MEMORY);
		c->srv->waiting_trials += c->reserved;
	} else if (c->ingest) {
		k3d_ingest_arrived(c);
		if (c->pgot == payload_end(c))
			window_next(c);
	}
}

void k3d_conn_resume_waiting(struct k3d_server *srv)
{
	for (struct k3d_conn *c = srv->conns; c; c = c->next)
		if (c->state == K3D_WAIT_MEMORY)
			process(c);
}

/* Parses what is buffered, as far as the state allows. */
static void process(struct k3d_conn *c)
{
	for (;;) {
		/* backpressure: do not take new requests while replies pile up */
		if (c->state == K3D_READ_LEN && evbuffer_get_length(c->out) > OUT_HIGH_WATER) {
			set_reading(c, 0);
			return;
		}
		switch (c->state) {
		case K3D_READ_LEN:
			if (c->in_end == c->in_start) {
				if (c->input_ended) {
					/* all it sent is answered or queued: close once the
					 * replies are out (on_write does the closing) */
					k3d_conn_set_state(c, K3D_CLOSING);
					event_active(c->wev, EV_WRITE, 0);
					return;
				}
				set_reading(c, 1);
				return;
			}
			c->hgot +=
			        (uint32_t)take(c, c->lenbuf + c->hgot, FRAME_PREFIX_LEN - c->hgot);
			if (c->hgot < FRAME_PREFIX_LEN)
				continue;
			c->hlen = frame_get_len(c->lenbuf);
			c->hgot = 0;
			{
				struct status st;
				if (frame_check_header_len(c->hlen, &st) != STATUS_OK) {
					fatal_frame(c, &st);
					return;
				}
				/* a peer that has not said who it is sends a Hello, a few
				 * bytes: it holds no more of the daemon's memory than that */
				if (!c->who.authed && c->hlen > K3D_HELLO_HEADER_MAX) {
					status_set(
					        &st, STATUS_DENIED,
					        "a header of %u bytes before a Hello with a valid "
					        "token: at most %u until then",
					        c->hlen, K3D_HELLO_HEADER_MAX);
					fatal_frame(c, &st);
					return;
				}
			}
			/* a large header, and the tokens it decodes to, is charged to
			 * --max-inflight while its request lives; alone it goes
			 * through whatever its size, as a payload does */
			if (c->hlen > K3D_HEADER_FREE) {
				uint64_t charge = k3d_header_charge(c->hlen);
				if (c->srv->header_bytes > 0 &&
				    c->srv->header_bytes + charge > c->srv->cfg.max_inflight) {
					struct status st;
					status_set(
					        &st, STATUS_BUSY,
					        "a %u-byte header: the daemon holds %llu bytes of "
					        "large headers already (--max-inflight); retry "
					        "shortly",
					        c->hlen, (unsigned long long)c->srv->header_bytes);
					fatal_frame(c, &st);
					return;
				}
				c->srv->header_bytes += charge;
				c->hcharge = charge;
			}
			c->hdr = malloc(c->hlen);
			if (!c->hdr) {
				struct status st;
				status_set(&st, STATUS_BUSY, "out of memory for a header");
				fatal_frame(c, &st);
				return;
			}
			k3d_conn_set_state(c, K3D_READ_HEADER);
			break;
		case K3D_READ_HEADER:
			if (c->in_end == c->in_start) {
				set_reading(c, 1);
				return;
			}
			c->hgot += (uint32_t)take(c, c->hdr + c->hgot, c->hlen - c->hgot);
			if (c->hgot == c->hlen)
				header_done(c);
			break;
		case K3D_WAIT_MEMORY:
			if (!reserve_payload(c)) {
				set_reading(c, 0);
				return;
			}
			break;
		case K3D_READ_PAYLOAD:
			if (c->in_end == c->in_start) {
				set_reading(c, 1);
				return;
			}
			c->pgot += (uint64_t)take(c, c->payload + c->pgot,
			                          (size_t)(payload_end(c) - c->pgot));
			payload_arrived(c);
			break;
		case K3D_WAIT_WINDOW:
			window_next(c);
			if (c->state == K3D_WAIT_WINDOW) {
				set_reading(c, 0);
				return;
			}
			break;
		case K3D_DISCARD:
			if (c->pgot == c->plen) {
				if (!c->answered && c->t_request > 0) {
					k3d_metrics_observe(c->srv, c->pending_op,
					                    k3d_now() - c->t_request);
					c->t_request = 0;
				}
				if (!c->answered)
					k3d_conn_error(c, c->pending_id, &c->pending);
				c->pending_id = 0;
				/* what it held (a trial window) goes to those waiting
				 * at the next tick (on_tick): not from here, inside
				 * another connection's processing */
				k3d_conn_reset(c);
				break;
			}
			if (c->in_end == c->in_start) {
				set_reading(c, 1);
				return;
			}
			c->pgot += (uint64_t)take(c, NULL, (size_t)(c->plen - c->pgot));
			break;
		case K3D_BUSY:    /* the writer answers it */
		case K3D_SENDING: /* an answer would land among the restore's chunks */
		case K3D_TIER2:   /* its lookup is answered when the second tier has */
			set_reading(c, 0);
			return;
		case K3D_YIELD: /* read again when its pause ends */
		case K3D_CLOSING:
		case K3D_DEAD:
			return;
		}
	}
}

static void on_yield_end(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct k3d_conn *c = arg;
	if (c->state != K3D_YIELD)
		return;                   /* closed meanwhile */
	c->last_progress = c->srv->ticks; /* the client's time starts again */
	k3d_conn_set_state(c, K3D_READ_PAYLOAD);
	process(c); /* reads again, unless something else holds it */
}

/* --yield-rate: while lookups arrive, an upload that has just been read
 * pauses for as long as its bytes take at that rate. The uploading process
 * then blocks on its full socket buffer instead of competing for the CPU
 * with the lookup's client and the loop (on two cores, two full-speed
 * uploads put the lookup p99 at 6-14 ms; yielding, 3.8-4.8 ms). Restores
 * are never paused: a worker waits on them. */
static void maybe_yield(struct k3d_conn *c, size_t just_read)
{
	struct k3d_server *srv = c->srv;
	if (!srv->cfg.yield_rate || just_read == 0 || c->state != K3D_READ_PAYLOAD ||
	    c->plen < BULK_BYTES || k3d_now() - srv->last_lookup > YIELD_WINDOW)
		return;
	if (!c->yield_ev && !(c->yield_ev = evtimer_new(srv->base, on_yield_end, c)))
		return;
	double pause = (double)just_read / (double)srv->cfg.yield_rate;
	struct timeval tv = {(time_t)pause, (suseconds_t)((pause - (double)(time_t)pause) * 1e6)};
	if (evtimer_add(c->yield_ev, &tv) != 0)
		return;
	k3d_conn_set_state(c, K3D_YIELD);
	srv->ingest_yields++;
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct k3d_conn *c = arg;
	struct k3d_server *srv = c->srv;
	take_turn(c, c->rev);
	/* at most READ_SLICE bytes per callback, so that one uploader cannot
	 * hold the loop while a lookup waits */
	size_t budget = READ_SLICE;
	for (int rounds = 0; rounds < 64 && budget > 0; rounds++) {
		ssize_t n;
		if (c->state == K3D_READ_PAYLOAD && c->in_end == c->in_start &&
		    payload_end(c) - c->pgot >= K3D_INBUF) {
			/* large payloads go straight into their buffer */
			size_t want = (size_t)(payload_end(c) - c->pgot);
			if (want > budget)
				want = budget;
			n = recv(fd, c->payload + c->pgot, want, 0);
			if (n > 0) {
				budget -= (size_t)n;
				c->pgot += (uint64_t)n;
				srv->bytes_in += (uint64_t)n;
				c->last_progress = srv->ticks;
				int whole = c->pgot == c->plen;
				payload_arrived(c);
				if (whole || c->state == K3D_WAIT_MEMORY ||
				    c->state == K3D_WAIT_WINDOW || c->state == K3D_DISCARD)
					process(c);
				else
					maybe_yield(c, (size_t)n);
				if (!reading(c))
					return; /* waiting, paused, closing or closed */
				continue;
			}
		} else {
			if (c->in_end == sizeof(c->in)) {
				process(c);
				if (c->in_end == sizeof(c->in))
					return; /* buffered input is waiting for a reply to drain */
				continue;
			}
			n = recv(fd, c->in + c->in_end, sizeof(c->in) - c->in_end, 0);
			if (n > 0) {
				budget = budget > (size_t)n ? budget - (size_t)n : 0;
				c->in_end += (size_t)n;
				srv->bytes_in += (uint64_t)n;
				c->last_progress = srv->ticks;
				process(c);
				if (!reading(c))
					return; /* waiting, paused, closing or closed */
				continue;
			}
		}
		if (n == 0) {
			/* end of input: finish what was asked (a half-closed client
			 * still reads its answers), then close */
			if (mid_frame(c)) {
				k3d_conn_close(c);
				return;
			}
			c->input_ended = 1;
			set_reading(c, 0);
			process(c); /* requests still buffered get their answers */
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK) {
			k3d_log(K3D_LOG_DEBUG, "conn %llu: read: %s", (unsigned long long)c->id,
			        strerror(errno));
			k3d_conn_close(c);
		}
		return;
	}
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct k3d_conn *c = arg;
	struct k3d_server *srv = c->srv;
	take_turn(c, c->wev);
	/* at most WRITE_SLICE bytes per callback, a syscall each MiB: a restore
	 * that the client drains as fast as it is written would otherwise keep
	 * the loop (and, in the kernel, the CPU) for its whole length */
	size_t budget = WRITE_SLICE;
	for (;;) {
		k3d_restore_feed(c);
		if (evbuffer_get_length(c->out) == 0)
			break;
		if (budget == 0)
			return; /* still writable: the loop comes back after other events */
		int n = evbuffer_write_atmost(c->out, fd, (ev_ssize_t)(1u << 20));
		if (n > 0) {
			srv->bytes_out += (uint64_t)n;
			c->written += (uint64_t)n;
			c->last_progress = srv->ticks;
			budget = budget > (size_t)n ? budget - (size_t)n : 0;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		k3d_conn_close(c); /* EPIPE, ECONNRESET */
		return;
	}
	event_del(c->wev);
	if (c->state == K3D_CLOSING) {
		k3d_conn_close(c);
		return;
	}
	/* drained: take the next pipelined request */
	process(c);
}

/* --min-upload-rate, once a second: a publish's upload is measured over
 * K3D_RATE_WINDOW seconds in which the daemon was reading it (not while it
 * waited for in-flight memory or was paused by --yield-rate), the payload
 * of a refused request too, skipped as it comes (a byte now and then held
 * its connection for ever). */
static int upload_too_slow(struct k3d_conn *c)
{
	uint64_t rate = c->srv->cfg.min_upload_rate;
	if (!rate || (c->state != K3D_READ_PAYLOAD && c->state != K3D_READ_HEADER &&
	              c->state != K3D_DISCARD))
		return 0;
	/* a header too: one trickled in a byte at a time would hold its
	 * buffer for ever, as each byte counts as progress */
	uint64_t got = c->state == K3D_READ_HEADER ? c->hgot : c->pgot;
	if (++c->rate_ticks < K3D_RATE_WINDOW)
		return 0;
	int slow = got - c->rate_mark < rate * K3D_RATE_WINDOW;
	c->rate_mark = got;
	c->rate_ticks = 0;
	return slow;
}

/* --min-download-rate, once a second: a restore's client is measured over
 * K3D_RATE_WINDOW seconds in which the restore was streaming and its socket
 * took no more bytes (not writable: the client's to drain), not while the
 * daemon was the slow side. A restore holds a slot of --max-restores and a
 * read transaction that pins the map's pages: a client reading a trickle
 * must not hold them for hours. Other answers are small, and a restore's
 * last MiBs (nothing left to queue) are --stall-timeout's. */
static int download_too_slow(struct k3d_conn *c)
{
	uint64_t rate = c->srv->cfg.min_download_rate;
	if (!rate || !c->sending) {
		c->down_mark = c->written;
		c->down_ticks = 0;
		return 0;
	}
	struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
	if (poll(&pfd, 1, 0) != 0 || ++c->down_ticks < K3D_RATE_WINDOW)
		return 0; /* writable (or gone): the daemon's turn, or the close's */
	int slow = c->written - c->down_mark < rate * K3D_RATE_WINDOW;
	c->down_mark = c->written;
	c->down_ticks = 0;
	return slow;
}

/* A publish waiting (for memory or its window) is not read meanwhile: has
 * its client gone? Its end of input (POLLRDHUP) alone does not say so: a
 * client that sent the whole request and then shut its side (what it sent
 * is answered: input_ended) shows the same. Once input has ended, all the
 * client will send is in the socket, so it left only if that cannot finish
 * the payload (or the socket is gone: POLLHUP, POLLERR). */
static int left_waiting(const struct k3d_conn *c)
{
	struct pollfd pfd = {.fd = c->fd, .events = POLLRDHUP};
	if (poll(&pfd, 1, 0) <= 0)
		return 0;
	if (pfd.revents & (POLLHUP | POLLERR))
		return 1;
	if (!(pfd.revents & POLLRDHUP))
		return 0;
	int queued = 0;
	if (ioctl(c->fd, FIONREAD, &queued) != 0 || queued < 0)
		return 1;
	uint64_t have = c->pgot + (uint64_t)(c->in_end - c->in_start) + (uint64_t)queued;
	return have < c->plen;
}

void k3d_conn_sweep_timeouts(struct k3d_server *srv)
{
	struct k3d_conn *next;
	for (struct k3d_conn *c = srv->conns; c; c = next) {
		next = c->next;
		/* ticks are whole seconds: a count of N ticks since the last
		 * progress is anything from N - 1 to N seconds, so a time-out of N
		 * seconds is passed only once more than N ticks have (with
		 * --stall-timeout 1s, a reply queued just after a tick closed a
		 * healthy client as stalled) */
		uint64_t still = srv->ticks - c->last_progress;
		uint64_t idle = srv->ticks - c->last_request;
		/* a publish waiting for memory waits for the daemon, not the
		 * client: never stalled, only gone (above). One paused by
		 * --yield-rate waits for the daemon too, for a moment: a client
		 * gone is seen when it is read again (on_yield_end) */
		int waiting = c->state == K3D_WAIT_MEMORY || c->state == K3D_WAIT_WINDOW;
		int stalled_mid = mid_frame(c) && !waiting && c->state != K3D_YIELD;
		int sending = evbuffer_get_length(c->out) > 0;
		const char *why = NULL;
		if (waiting && left_waiting(c))
			why = c->state == K3D_WAIT_MEMORY
			              ? "left while waiting for in-flight memory"
			              : "left while its upload waited for the store";
		if (!why && (stalled_mid || sending) && still > srv->cfg.stall_timeout)
			why = sending ? "stalled reading its reply" : "stalled mid-frame";
		/* the store has taken nothing of its window for that long: the
		 * daemon's trouble (a disk that hangs, a publish it cannot place),
		 * said at warning level; its upload is cancelled, not kept for ever */
		int store_stuck = !why && c->state == K3D_WAIT_WINDOW &&
		                  still > K3D_WINDOW_STUCK_FACTOR * srv->cfg.stall_timeout;
		char stuck[96];
		if (store_stuck) {
			snprintf(stuck, sizeof(stuck),
			         "its upload waited %llu s for the store to take a stage of its "
			         "window",
			         (unsigned long long)still);
			why = stuck;
		}
		if (!why && c->state == K3D_READ_LEN && !sending && idle > srv->cfg.idle_timeout)
			why = "idle";
		/* timeouts counts the rest: each close is counted once */
		int rate = 0;
		if (!why && upload_too_slow(c)) {
			why = "its upload is under --min-upload-rate";
			srv->uploads_too_slow++;
			rate = 1;
		}
		if (!why && download_too_slow(c)) {
			why = "it reads its answer under --min-download-rate";
			srv->downloads_too_slow++;
			rate = 1;
		}
		if (why) {
			k3d_log(store_stuck ? K3D_LOG_WARN : K3D_LOG_INFO,
			        "conn %llu (%s): closed: %s", (unsigned long long)c->id, c->peer,
			        why);
			if (!rate)
				srv->timeouts++;
			k3d_conn_close(c);
		}
	}
}
