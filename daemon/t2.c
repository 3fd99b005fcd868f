/* t2: the loop's side of the second tier (t2.h): start-up and stop, the
 * lookups that wait for the cluster and the answers the threads send back,
 * the counters. The copy thread is t2_copy.c, the search thread t2_search.c,
 * the fetch thread t2_fetch.c. */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon.h"
#include "hexutil.h"
#include "model.h"
#include "service.h"
#include "t2_priv.h"
#include "units.h"

/* A lookup waiting for the cluster (loop thread only). */
struct k3d_t2_wait {
	struct k3d_t2_wait *next;
	uint64_t id;
	struct k3d_conn *c;
	struct event *timer; /* --tier2-wait while the search runs; then
	                        --stall-timeout for the fetch (or a listing) */
	int on_key;          /* waits for the fetch of key */
	int found;           /* the cluster holds a longer entry: fetched, or being */
	int listing;         /* an ls --tier2, not a lookup */
	uint32_t local_p;    /* the local answer's prefix when it began */
	uint8_t key[TIER2_KEY_LEN];
};

/* ---- items and queues ------------------------------------------------------- */

void k3d_t2_item_free(struct t2_item *it)
{
	if (!it)
		return;
	free(it->salt);
	free(it->tokens);
	for (size_t i = 0; i < it->n_listed; i++)
		free((void *)it->listed[i].salt);
	free(it->listed);
	free(it);
}

static void queue_init(struct t2_queue *q, size_t max)
{
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	q->max = max;
}

int t2_queue_push(struct t2_queue *q, struct t2_item *it)
{
	pthread_mutex_lock(&q->mu);
	if (q->stop || (q->max && q->n >= q->max)) {
		pthread_mutex_unlock(&q->mu);
		return -1;
	}
	it->next = NULL;
	if (q->tail)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	q->n++;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return 0;
}

struct t2_item *t2_queue_pop(struct t2_queue *q)
{
	pthread_mutex_lock(&q->mu);
	while (!q->head && !q->stop)
		pthread_cond_wait(&q->cv, &q->mu);
	struct t2_item *it = q->stop ? NULL : q->head;
	if (it) {
		q->head = it->next;
		if (!q->head)
			q->tail = NULL;
		q->n--;
	}
	pthread_mutex_unlock(&q->mu);
	return it;
}

/* Takes every item (the loop's side of doneq). */
static struct t2_item *queue_take_all(struct t2_queue *q)
{
	pthread_mutex_lock(&q->mu);
	struct t2_item *all = q->head;
	q->head = q->tail = NULL;
	q->n = 0;
	pthread_mutex_unlock(&q->mu);
	return all;
}

static void queue_stop(struct t2_queue *q)
{
	pthread_mutex_lock(&q->mu);
	q->stop = 1;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

static void queue_free(struct t2_queue *q)
{
	struct t2_item *it = queue_take_all(q);
	while (it) {
		struct t2_item *next = it->next;
		k3d_t2_item_free(it);
		it = next;
	}
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
}

void t2_post(struct k3d_t2 *t, struct t2_item *it)
{
	(void)t2_queue_push(&t->doneq, it); /* unbounded; stopped only after the threads */
	uint64_t one = 1;
	if (write(t->done_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		k3d_log(K3D_LOG_ERROR, "tier2: cannot wake the loop: %s", strerror(errno));
}

/* ---- counters ----------------------------------------------------------------- */

void t2_count_router(struct k3d_t2 *t, struct cluster_router *r, struct cluster_stats *seen,
                     struct tier2_stats *ts, struct tier2_stats *ts_seen)
{
	struct cluster_stats now = cluster_stats(r);
	atomic_fetch_add(&t->n.node_errors, now.node_errors - seen->node_errors);
	atomic_fetch_add(&t->n.timeouts, now.timeouts - seen->timeouts);
	atomic_fetch_add(&t->n.router_no_memory, now.nomem - seen->nomem);
	atomic_fetch_add(&t->n.resent, now.resent - seen->resent);
	*seen = now;
	atomic_fetch_add(&t->n.bytes_in, ts->bytes_in - ts_seen->bytes_in);
	atomic_fetch_add(&t->n.bytes_out, ts->bytes_out - ts_seen->bytes_out);
	atomic_fetch_add(&t->n.stale, ts->stale - ts_seen->stale);
	atomic_fetch_add(&t->n.parts_new, ts->parts_new - ts_seen->parts_new);
	atomic_fetch_add(&t->n.parts_shared, ts->parts_shared - ts_seen->parts_shared);
	atomic_fetch_add(&t->n.part_bytes_saved, ts->part_bytes_saved - ts_seen->part_bytes_saved);
	*ts_seen = *ts;
}

void k3d_t2_counters(struct k3d_server *srv, frame_response *r)
{
	struct k3d_t2 *t = srv->t2;
	if (!t) /* nothing to say without a second tier (tier2_enabled is 0) */
		return;
#define T2_ADD(name, family, help) service_add_counter(r, "tier2_" #name, atomic_load(&t->n.name));
	K3D_T2_COUNTERS(T2_ADD)
#undef T2_ADD
#define T2_GAUGE_ADD(name, family, help, value) service_add_counter(r, "tier2_" #name, (value));
	K3D_T2_GAUGES(T2_GAUGE_ADD)
#undef T2_GAUGE_ADD
}

/* ---- lookups that wait --------------------------------------------------------- */

static struct k3d_t2_wait *find_waiter(struct k3d_t2 *t, uint64_t id)
{
	for (struct k3d_t2_wait *w = t->waiters; w; w = w->next)
		if (w->id == id)
			return w;
	return NULL;
}

static void unlink_waiter(struct k3d_t2 *t, struct k3d_t2_wait *w)
{
	for (struct k3d_t2_wait **p = &t->waiters; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	if (w->timer)
		event_free(w->timer);
	if (w->c)
		w->c->t2 = NULL;
	free(w);
}

/* The waiting lookup is answered from the local store, which now holds
 * whatever the cluster gave. */
/* Answers w's lookup from the local store. A hit (tier2_hits) is a lookup
 * that was told of a longer entry in the cluster and is answered with more
 * than the local store had when it began: counted by the answer, so
 * neither a fetch that ended before the lookup heard of it nor an entry
 * evicted (or refused) meanwhile is miscounted. */
static void resume(struct k3d_t2 *t, struct k3d_t2_wait *w)
{
	struct k3d_conn *c = w->c;
	int found = w->found;
	uint32_t local_p = w->local_p;
	unlink_waiter(t, w);
	if (c && k3d_lookup_resume(c) > local_p && found)
		atomic_fetch_add(&t->n.hits, 1);
}

static void on_wait_expired(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct k3d_t2_wait *w = arg;
	struct k3d_conn *c = w->c;
	struct k3d_t2 *t = c->srv->t2;
	if (w->listing) {
		unlink_waiter(t, w);
		k3d_conn_errorf(c, STATUS_BUSY, "the second tier did not answer in %llus",
		                (unsigned long long)c->srv->cfg.stall_timeout);
		k3d_conn_answered(c);
		return;
	}
	/* waiting for the search (--tier2-wait), or for a fetch (--stall-timeout) */
	atomic_fetch_add(w->on_key ? &t->n.fetch_waits_expired : &t->n.waits_expired, 1);
	resume(t, w); /* the search goes on: a longer entry found is fetched all the same */
}

/* Arms w's timer for seconds and milliseconds. */
static void arm(struct k3d_t2_wait *w, uint64_t s, uint32_t ms)
{
	struct timeval tv = {(time_t)(s + ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	evtimer_add(w->timer, &tv);
}

uint64_t t2_now_ms(void)
{
	return (uint64_t)(k3d_now() * 1e3) + 1; /* never 0: 0 is "not busy" */
}

/* ---- what one fetch holds ------------------------------------------------------ */

int t2_hold(struct k3d_t2 *t)
{
	pthread_mutex_lock(&t->fetchq.mu);
	while (t->holding && !t->fetchq.stop)
		pthread_cond_wait(&t->fetchq.cv, &t->fetchq.mu);
	int ok = !t->fetchq.stop;
	t->holding = ok;
	pthread_mutex_unlock(&t->fetchq.mu);
	return ok ? 0 : -1;
}

void t2_release(struct k3d_t2 *t)
{
	pthread_mutex_lock(&t->fetchq.mu);
	t->holding = 0;
	pthread_cond_broadcast(&t->fetchq.cv);
	pthread_mutex_unlock(&t->fetchq.mu);
}

int t2_refused_locked(struct k3d_t2 *t, const uint8_t *key)
{
	double now = k3d_now();
	int found = 0;
	for (size_t i = 0; i < T2_REFUSED && !found; i++)
		found = t->refused[i].until > now && !memcmp(t->refused[i].key, key, TIER2_KEY_LEN);
	return found;
}

/* The local store refused a fetched entry: not fetched again for a while. */
static void note_refused(struct k3d_t2 *t, const uint8_t *key)
{
	pthread_mutex_lock(&t->fetchq.mu);
	struct t2_refused *r = &t->refused[t->refused_next++ % T2_REFUSED];
	memcpy(r->key, key, TIER2_KEY_LEN);
	r->until = k3d_now() + T2_REFUSED_SECONDS;
	pthread_mutex_unlock(&t->fetchq.mu);
}

static int key_fetching(struct k3d_t2 *t, const uint8_t *key)
{
	pthread_mutex_lock(&t->fetchq.mu);
	int found = 0;
	for (struct t2_fetching *f = t->fetching; f && !found; f = f->next)
		found = !memcmp(f->key, key, TIER2_KEY_LEN);
	pthread_mutex_unlock(&t->fetchq.mu);
	return found;
}

/* Removes key from the keys being fetched (the loop only). */
static void unclaim(struct k3d_t2 *t, const uint8_t *key)
{
	pthread_mutex_lock(&t->fetchq.mu);
	for (struct t2_fetching **p = &t->fetching; *p; p = &(*p)->next)
		if (!memcmp((*p)->key, key, TIER2_KEY_LEN)) {
			struct t2_fetching *f = *p;
			*p = f->next;
			free(f);
			break;
		}
	pthread_mutex_unlock(&t->fetchq.mu);
}

/* The fetch of key is over (stored or failed): every lookup waiting for it
 * is answered (resume counts the hits). */
static void key_done(struct k3d_t2 *t, const uint8_t *key)
{
	unclaim(t, key);
	struct k3d_t2_wait *w = t->waiters;
	while (w) {
		struct k3d_t2_wait *next = w->next;
		if (w->on_key && !memcmp(w->key, key, TIER2_KEY_LEN))
			resume(t, w);
		w = next;
	}
}

int k3d_t2_lookup(struct k3d_conn *c, const struct store_lookup_res *local)
{
	struct k3d_t2 *t = c->srv->t2;
	const K3cache__V1__Lookup *l = c->req->lookup;
	if (!t || l->n_tokens == 0 || l->model.len != 32 || c->srv->stopping)
		return 0;
	/* an entry of a model this store lacks would be refused once fetched */
	if (!store_model_stored(c->srv->store, l->model.data))
		return 0;
	uint32_t n = (uint32_t)l->n_tokens;
	uint32_t limit = l->limit ? (l->limit < n ? l->limit : n) : n - 1;
	if (limit > TIER2_MAX_TOKENS) /* the cluster holds none longer */
		limit = TIER2_MAX_TOKENS;
	if (limit == 0 || local->prefix_len >= limit || l->salt.len > TIER2_MAX_SALT)
		return 0;
	/* the search thread is held up (a slow or stopped node) past what a
	 * lookup would wait: answer at once, not --tier2-wait later */
	uint64_t busy = atomic_load(&t->busy_since_ms);
	if (busy && t2_now_ms() - busy > t->cfg.wait_ms) {
		atomic_fetch_add(&t->n.lookups_skipped, 1);
		return 0;
	}
	struct t2_item *it = calloc(1, sizeof(*it));
	struct k3d_t2_wait *w = calloc(1, sizeof(*w));
	if (it) {
		it->tokens = malloc((size_t)limit * sizeof(uint32_t));
		it->salt = malloc(l->salt.len ? l->salt.len : 1);
	}
	if (w)
		w->timer = evtimer_new(c->srv->base, on_wait_expired, w);
	if (!it || !it->tokens || !it->salt || !w || !w->timer) {
		k3d_t2_item_free(it);
		if (w && w->timer)
			event_free(w->timer);
		free(w);
		return 0; /* out of memory: answered locally */
	}
	it->kind = T2_PROBE;
	memcpy(it->fingerprint, l->model.data, 32);
	if (l->salt.len)
		memcpy(it->salt, l->salt.data, l->salt.len);
	it->salt_len = l->salt.len;
	memcpy(it->tokens, l->tokens, (size_t)limit * sizeof(uint32_t));
	it->n_tokens = limit;
	it->local_p = w->local_p = local->prefix_len;
	it->waiter = w->id = ++t->next_waiter;
	if (t2_queue_push(&t->searchq, it) != 0) {
		atomic_fetch_add(&t->n.lookups_skipped, 1);
		k3d_t2_item_free(it);
		event_free(w->timer);
		free(w);
		return 0;
	}
	atomic_fetch_add(&t->n.lookups, 1);
	w->c = c;
	w->next = t->waiters;
	t->waiters = w;
	c->t2 = w;
	arm(w, 0, t->cfg.wait_ms);
	k3d_conn_set_state(c, K3D_TIER2);
	return 1;
}

void k3d_t2_list(struct k3d_conn *c)
{
	struct k3d_t2 *t = c->srv->t2;
	const K3cache__V1__List *l = c->req->list;
	if (l->after.len) { /* one page holds all there is */
		frame_response r = K3CACHE__V1__RESPONSE__INIT;
		r.id = c->req->id;
		k3d_conn_respond(c, &r);
		return;
	}
	struct t2_item *it = calloc(1, sizeof(*it));
	struct k3d_t2_wait *w = calloc(1, sizeof(*w));
	if (w)
		w->timer = evtimer_new(c->srv->base, on_wait_expired, w);
	if (!it || !w || !w->timer) {
		free(it);
		if (w && w->timer)
			event_free(w->timer);
		free(w);
		k3d_conn_errorf(c, STATUS_BUSY, "out of memory; retry later");
		return;
	}
	w->listing = 1;
	it->kind = T2_LIST;
	it->limit = l->limit && l->limit < K3D_T2_LIST_MAX ? l->limit : K3D_T2_LIST_MAX;
	it->has_model = l->model.len == 32;
	if (it->has_model)
		memcpy(it->fingerprint, l->model.data, 32);
	it->t = t;
	/* its waiter is answered then: the listing stops too */
	it->deadline_ms = t2_now_ms() + c->srv->cfg.stall_timeout * 1000u;
	it->waiter = w->id = ++t->next_waiter;
	/* on the copy thread, so that lookups' searches do not wait behind a
	 * scan of the cluster (in read-only mode there is none) */
	if (t2_queue_push(t->copy_started ? &t->copyq : &t->searchq, it) != 0) {
		k3d_t2_item_free(it);
		event_free(w->timer);
		free(w);
		k3d_conn_errorf(c, STATUS_BUSY, "the second tier's queue is full; retry shortly");
		return;
	}
	w->c = c;
	w->next = t->waiters;
	t->waiters = w;
	c->t2 = w;
	arm(w, c->srv->cfg.stall_timeout, 0);
	k3d_conn_set_state(c, K3D_TIER2);
}

static int collect(const struct tier2_listed *e, void *ctx)
{
	struct t2_item *it = ctx;
	if (it->has_model && memcmp(e->fingerprint, it->fingerprint, 32) != 0)
		return 0;
	if (it->n_listed >= it->limit)
		return 1;
	if (it->n_listed == it->cap_listed) {
		size_t cap = it->cap_listed ? 2 * it->cap_listed : 256;
		struct tier2_listed *grown = realloc(it->listed, cap * sizeof(*grown));
		if (!grown)
			return 1;
		it->listed = grown;
		it->cap_listed = cap;
	}
	uint8_t *salt = malloc(e->salt_len ? e->salt_len : 1);
	if (!salt)
		return 1;
	if (e->salt_len)
		memcpy(salt, e->salt, e->salt_len);
	it->listed[it->n_listed] = *e;
	it->listed[it->n_listed++].salt = salt;
	return 0;
}

/* Whether a listing is to stop: the daemon stops, or its waiter was answered. */
static int list_cancelled(void *ctx)
{
	const struct t2_item *it = ctx;
	return atomic_load(&it->t->stopping) || t2_now_ms() > it->deadline_ms;
}

void t2_list_run(struct k3d_t2 *t, struct cluster_router *r, struct tier2_stats *ts,
                 struct t2_item *it)
{
	if (r) {
		it->st = tier2_list(r, t->cfg.ns, it->has_model ? it->fingerprint : NULL, it->limit,
		                    collect, list_cancelled, it, ts, it->err, sizeof(it->err));
	} else {
		it->st = TIER2_NOMEM;
		snprintf(it->err, sizeof(it->err), "no router (out of memory at start-up)");
	}
	it->kind = T2_LISTED;
	t2_post(t, it);
}

/* Answers a List of the cluster's entries. */
static void answer_list(struct k3d_conn *c, struct t2_item *it)
{
	/* partial (some masters passed over): what the others hold, even none */
	if (it->st != TIER2_OK && it->st != TIER2_PARTIAL && !it->n_listed) {
		k3d_conn_errorf(c, it->st == TIER2_TIMEOUT ? STATUS_BUSY : STATUS_INTERNAL,
		                "the second tier: %s", it->err);
		return;
	}
	frame_response r = K3CACHE__V1__RESPONSE__INIT;
	r.id = c->req->id;
	/* some masters did not answer (or the listing was given up): what was
	 * listed, and why it is not whole */
	if (it->st != TIER2_OK)
		r.message = it->err;
	K3cache__V1__EntryInfo *infos = calloc(it->n_listed ? it->n_listed : 1, sizeof(*infos));
	K3cache__V1__EntryInfo **ptrs = calloc(it->n_listed ? it->n_listed : 1, sizeof(*ptrs));
	char(*names)[64] = calloc(it->n_listed ? it->n_listed : 1, sizeof(*names));
	if (!infos || !ptrs || !names) {
		free(infos);
		free(ptrs);
		free(names);
		k3d_conn_errorf(c, STATUS_BUSY, "out of memory; retry later");
		return;
	}
	for (size_t i = 0; i < it->n_listed; i++) {
		struct tier2_listed *e = &it->listed[i];
		k3cache__v1__entry_info__init(&infos[i]);
		infos[i].key.data = e->key;
		infos[i].key.len = 32;
		infos[i].model.data = e->fingerprint;
		infos[i].model.len = 32;
		infos[i].salt.data = (uint8_t *)e->salt;
		infos[i].salt.len = e->salt_len;
		infos[i].prefix_len = e->prefix_len;
		infos[i].layer_count = e->n_layers;
		infos[i].bytes = e->bytes;
		infos[i].stored = e->bytes;
		if (i && !memcmp(e->fingerprint, it->listed[i - 1].fingerprint, 32)) {
			memcpy(names[i], names[i - 1], sizeof(names[i]));
		} else {
			struct status st;
			struct k3cache_model *m =
			        store_get_model(c->srv->store, e->fingerprint, &st);
			snprintf(names[i], sizeof(names[i]), "%s", m && m->name ? m->name : "?");
			if (m)
				model_free(m);
		}
		infos[i].model_name = names[i];
		ptrs[i] = &infos[i];
	}
	r.entries = ptrs;
	r.n_entries = it->n_listed;
	k3d_conn_respond(c, &r);
	free(names);
	free(ptrs);
	free(infos);
}

void k3d_t2_forget(struct k3d_conn *c)
{
	if (!c->t2)
		return;
	struct k3d_t2_wait *w = c->t2;
	w->c = NULL;
	unlink_waiter(c->srv->t2, w);
}

/* ---- the threads' answers -------------------------------------------------------- */

static void count_miss(struct k3d_t2 *t, enum tier2_status st)
{
	switch (st) {
	case TIER2_MISSING:
		atomic_fetch_add(&t->n.misses_missing, 1);
		break;
	case TIER2_DAMAGED:
		atomic_fetch_add(&t->n.misses_damaged, 1);
		break;
	case TIER2_TIMEOUT:
		atomic_fetch_add(&t->n.misses_timeout, 1);
		break;
	case TIER2_TOO_LARGE:
		atomic_fetch_add(&t->n.misses_too_large, 1);
		break;
	case TIER2_NOMEM: /* this host's want, not the cluster's fault */
		atomic_fetch_add(&t->n.misses_no_memory, 1);
		break;
	default:
		atomic_fetch_add(&t->n.misses_node_error, 1);
		break;
	}
}

static void answer(struct k3d_t2 *t, struct t2_item *it)
{
	struct k3d_t2_wait *w = it->waiter ? find_waiter(t, it->waiter) : NULL;
	switch (it->kind) {
	case T2_NONE:
		if (it->st != TIER2_OK) {
			atomic_fetch_add(&t->n.lookup_errors, 1);
			k3d_log(K3D_LOG_DEBUG, "tier2: lookup: %s: %s", tier2_status_name(it->st),
			        it->err);
		}
		if (w)
			resume(t, w);
		break;
	case T2_FOUND:
	case T2_JOIN:
		if (it->kind == T2_JOIN && w)
			atomic_fetch_add(&t->n.fetch_joins, 1);
		if (w) { /* it waits for the fetch now, at most --stall-timeout */
			evtimer_del(w->timer);
			arm(w, t->srv->cfg.stall_timeout, 0);
			w->on_key = 1;
			w->found = 1;
			memcpy(w->key, it->key, TIER2_KEY_LEN);
			if (!key_fetching(t, it->key)) /* over already */
				resume(t, w);
		}
		break;
	case T2_LISTED:
		if (w && w->c) {
			struct k3d_conn *c = w->c;
			unlink_waiter(t, w);
			answer_list(c, it);
			k3d_conn_answered(c);
		}
		break;
	case T2_SKIPPED: /* the claim is the loop's to release (key_done) */
	case T2_RELEASE:
		if (it->kind == T2_SKIPPED)
			atomic_fetch_add(&t->n.fetches_skipped, 1);
		key_done(t, it->key);
		/* still waiting for its search (not told of the key) */
		if ((w = find_waiter(t, it->waiter)) != NULL) {
			w->found = it->kind == T2_RELEASE; /* stored meanwhile */
			resume(t, w);
		}
		break;
	case T2_FAILED:
		count_miss(t, it->st);
		k3d_log(K3D_LOG_INFO, "tier2: fetch: %s: %s", tier2_status_name(it->st), it->err);
		key_done(t, it->key);
		break;
	default:
		break;
	}
	k3d_t2_item_free(it);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct k3d_t2 *t = arg;
	uint64_t n;
	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		k3d_log(K3D_LOG_WARN, "tier2: read: %s", strerror(errno));
	struct t2_item *it = queue_take_all(&t->doneq);
	while (it) {
		struct t2_item *next = it->next;
		answer(t, it);
		it = next;
	}
}

void k3d_t2_stored(struct k3d_server *srv, struct k3d_job *job)
{
	struct k3d_t2 *t = srv->t2;
	struct t2_item *it = job->t2;
	char err[256];
	enum tier2_status read = t2_stage_read_status(job->t2s, err, sizeof(err));
	uint64_t took = (uint64_t)(t2_stage_seconds(job->t2s) * 1e3) + 1;
	t2_release(t);          /* the fetch thread may begin the next */
	if (read != TIER2_OK) { /* the cluster's bytes failed: a miss by cause */
		count_miss(t, read);
		k3d_log(K3D_LOG_INFO, "tier2: fetch: %s: %s", tier2_status_name(read), err);
		key_done(t, it->key);
		return;
	}
	int ok = job->st.code == STATUS_OK;
	if (t2_stage_complete(job->t2s))
		atomic_fetch_add(&t->n.fetches, 1);
	if (ok && job->pub.created) {
		/* what the search thread expects of the fetches ahead of a new one:
		 * whole ones only, as a refusal or a failure ends early */
		uint64_t avg = atomic_load(&t->fetch_ms);
		atomic_store(&t->fetch_ms, avg ? (3 * avg + took) / 4 : took);
	}
	if (ok && job->pub.created)
		t2_stage_log(job->t2s);
	if (job->st.code == STATUS_BUSY && job->pub.in_progress) {
		/* another publish of the entry is under way: it stores it */
		atomic_fetch_add(&t->n.fetch_busy, 1);
		k3d_log(K3D_LOG_INFO, "tier2: a fetch gave way to a publish of the same entry: %s",
		        job->st.message);
	} else if (!ok) {
		atomic_fetch_add(&t->n.store_refused, 1);
		if (job->st.code != STATUS_BUSY) /* BUSY: short of a resource now, not refused */
			note_refused(t, it->key);
		char hex[2 * TIER2_KEY_LEN + 1];
		hexutil_encode(it->key, TIER2_KEY_LEN, hex);
		k3d_log(K3D_LOG_WARN,
		        "tier2: entry %.16s fetched from the cluster was refused: %s: %s", hex,
		        status_code_name(job->st.code), job->st.message);
	}
	key_done(t, it->key);
}

/* ---- writing back ------------------------------------------------------------------ */

void k3d_t2_copy(struct k3d_server *srv, const uint8_t key[STORE_KEY_LEN])
{
	struct k3d_t2 *t = srv->t2;
	if (!t || t->cfg.mode == K3D_T2_READ_ONLY)
		return;
	struct t2_item *it = calloc(1, sizeof(*it));
	if (it) {
		it->kind = T2_COPY;
		memcpy(it->key, key, TIER2_KEY_LEN);
	}
	if (!it || t2_queue_push(&t->copyq, it) != 0) {
		atomic_fetch_add(&t->n.copies_skipped, 1);
		free(it);
	}
}

/* ---- start and stop ----------------------------------------------------------------- */

struct cluster_router *t2_router(struct k3d_t2 *t)
{
	struct cluster_options o = {.user = t->cfg.user,
	                            .password = t->password,
	                            .connect_timeout_ms = (int)t->cfg.timeout_ms,
	                            .command_timeout_ms = (int)t->cfg.timeout_ms};
	char err[512] = "";
	struct cluster_router *r = cluster_router_new(t->cfg.seeds, &o, err, sizeof(err));
	if (!r)
		k3d_log(K3D_LOG_ERROR, "--tier2 %s: %s", t->cfg.seeds, err);
	return r;
}

/* The first line of the password file, without its line end. */
static char *read_password(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		k3d_log(K3D_LOG_ERROR, "--tier2-password-file %s: %s", path, strerror(errno));
		return NULL;
	}
	char line[1024];
	char *pw = NULL;
	if (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (line[0])
			pw = strdup(line);
	} else if (ferror(f)) { /* a directory, say */
		int e = errno;
		fclose(f);
		k3d_log(K3D_LOG_ERROR, "--tier2-password-file %s: %s", path, strerror(e));
		return NULL;
	}
	explicit_bzero(line, sizeof(line));
	fclose(f);
	if (!pw)
		k3d_log(K3D_LOG_ERROR,
		        "--tier2-password-file %s: no password on its first line (the file holds "
		        "the password alone)",
		        path);
	return pw;
}

/* The owner name of this daemon's ledger: the host's name and a hash of the
 * store's path, as [A-Za-z0-9._-]. */
static void default_owner(struct k3d_t2 *t, const char *db)
{
	char host[64] = "host";
	gethostname(host, sizeof(host) - 1);
	host[sizeof(host) - 1] = 0;
	for (char *p = host; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
			*p = '_';
	char *real = realpath(db, NULL);
	uint64_t h = 1469598103934665603ull; /* FNV-1a of the store's path */
	for (const char *p = real ? real : db; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	free(real);
	snprintf(t->owner, sizeof(t->owner), "%.40s-%016llx", host, (unsigned long long)h);
}

static void t2_free(struct k3d_t2 *t)
{
	if (t->password) {
		explicit_bzero(t->password, strlen(t->password));
		free(t->password);
	}
	queue_free(&t->copyq);
	queue_free(&t->searchq);
	queue_free(&t->fetchq);
	queue_free(&t->doneq);
	while (t->fetching) {
		struct t2_fetching *f = t->fetching;
		t->fetching = f->next;
		free(f);
	}
	if (t->done_ev)
		event_free(t->done_ev);
	if (t->done_fd >= 0)
		close(t->done_fd);
	free(t);
}

int k3d_t2_start(struct k3d_server *srv)
{
	const struct k3d_t2_config *cfg = &srv->cfg.t2;
	if (!cfg->seeds)
		return 0;
	struct k3d_t2 *t = calloc(1, sizeof(*t));
	if (!t)
		return -1;
	t->srv = srv;
	t->cfg = *cfg;
	t->done_fd = -1;
	if (!t->cfg.max_bytes)
		t->cfg.max_bytes = srv->cfg.max_bytes;
	queue_init(&t->copyq, K3D_T2_COPY_QUEUE);
	queue_init(&t->searchq, K3D_T2_SEARCH_QUEUE);
	queue_init(&t->fetchq, K3D_T2_FETCH_QUEUE);
	queue_init(&t->doneq, 0);
	char err[512];
	if (tier2_ns_check(t->cfg.ns, err, sizeof(err)) != 0) {
		k3d_log(K3D_LOG_ERROR, "--tier2-namespace %s: %s", t->cfg.ns, err);
		goto fail;
	}
	if (t->cfg.owner) {
		if (tier2_ns_check(t->cfg.owner, err, sizeof(err)) != 0) {
			k3d_log(K3D_LOG_ERROR, "--tier2-owner %s: %s", t->cfg.owner, err);
			goto fail;
		}
		snprintf(t->owner, sizeof(t->owner), "%s", t->cfg.owner);
	} else {
		default_owner(t, srv->cfg.db);
	}
	if (cfg->password_file && !(t->password = read_password(cfg->password_file)))
		goto fail;
	struct cluster_router *r = t2_router(t);
	if (!r)
		goto fail;
	size_t masters = 0;
	if (t2_check_cluster(t, r, &masters) != 0) {
		cluster_router_free(r);
		goto fail;
	}
	cluster_router_free(r);
	t->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->done_fd < 0) {
		k3d_log(K3D_LOG_ERROR, "tier2: eventfd: %s", strerror(errno));
		goto fail;
	}
	t->done_ev = event_new(srv->base, t->done_fd, EV_READ | EV_PERSIST, on_done, t);
	if (!t->done_ev)
		goto fail;
	event_priority_set(t->done_ev, K3D_PRIO_HIGH);
	event_add(t->done_ev, NULL);
	srv->t2 = t;
	t->search_started = pthread_create(&t->search_thread, NULL, t2_search_main, t) == 0;
	if (t->search_started)
		t->fetch_started = pthread_create(&t->fetch_thread, NULL, t2_fetch_main, t) == 0;
	if (t->fetch_started && t->cfg.mode != K3D_T2_READ_ONLY)
		t->copy_started = pthread_create(&t->copy_thread, NULL, t2_copy_main, t) == 0;
	if (!t->fetch_started || (t->cfg.mode != K3D_T2_READ_ONLY && !t->copy_started)) {
		k3d_log(K3D_LOG_ERROR, "tier2: cannot start its threads");
		k3d_t2_stop(srv);
		return -1;
	}
	char cap[32];
	units_format_size(t->cfg.max_bytes, cap, sizeof(cap));
	char seen[48] = "not reached yet";
	if (masters)
		snprintf(seen, sizeof(seen), "%zu masters", masters);
	if (t->cfg.mode == K3D_T2_READ_ONLY) /* no copies: no owner, no budget */
		k3d_log(K3D_LOG_INFO, "tier2: cluster %s (%s), namespace %s, read-only", cfg->seeds,
		        seen, t->cfg.ns);
	else
		k3d_log(K3D_LOG_INFO,
		        "tier2: cluster %s (%s), namespace %s, write-back, owner %s, at most %s",
		        cfg->seeds, seen, t->cfg.ns, t->owner, cap);
	return 0;
fail:
	t2_free(t);
	return -1;
}

void k3d_t2_stop(struct k3d_server *srv)
{
	struct k3d_t2 *t = srv->t2;
	if (!t)
		return;
	atomic_store(&t->stopping, 1);
	queue_stop(&t->copyq);
	queue_stop(&t->searchq);
	queue_stop(&t->fetchq);
	if (t->search_started)
		pthread_join(t->search_thread, NULL);
	if (t->fetch_started)
		pthread_join(t->fetch_thread, NULL);
	if (t->copy_started)
		pthread_join(t->copy_thread, NULL);
	/* lookups waiting are answered from the local store (srv->stopping:
	 * none waits again); a listing is told */
	while (t->waiters) {
		struct k3d_t2_wait *w = t->waiters;
		struct k3d_conn *c = w->c;
		int listing = w->listing;
		unlink_waiter(t, w);
		if (c && listing) {
			k3d_conn_errorf(c, STATUS_BUSY, "the daemon is shutting down");
			k3d_conn_answered(c);
		} else if (c) {
			(void)k3d_lookup_resume(c);
		}
	}
	srv->t2 = NULL;
	t2_free(t);
}
