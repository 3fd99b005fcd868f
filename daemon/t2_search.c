/* t2_search: the search thread of the second tier (t2.h). For each lookup
 * the loop hands it, it searches the cluster's longest prefix of the
 * prompt; when that is longer than the local answer, and the entry is not
 * being fetched already for another lookup, it claims the key and hands it
 * to the fetch thread (t2_fetch.c), posting each step back to the loop. It
 * never reads an entry's bytes, so a large fetch does not hold up the
 * searches of the lookups that arrive meanwhile. In read-only mode (no copy
 * thread) it also runs the listings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "t2_estimate.h"
#include "t2_priv.h"

struct searcher {
	struct k3d_t2 *t;
	struct cluster_router *r;
	struct cluster_stats seen;
	struct tier2_stats ts, ts_seen;
};

enum claim { CLAIMED, TAKEN, REFUSED, NOMEM };

/* Claims key for a fetch, unless it is being fetched already (TAKEN) or
 * the store refused it lately (REFUSED): both under fetchq.mu, where the
 * loop releases a claim after noting a refusal, so a refusal that ends a
 * fetch meanwhile is seen. Only the loop releases claims (key_done, which
 * also answers the lookups waiting on them): the search thread posts
 * T2_RELEASE or T2_SKIPPED for a claim it will not fetch. */
static enum claim claim(struct k3d_t2 *t, const uint8_t *key)
{
	struct t2_fetching *mine = malloc(sizeof(*mine));
	pthread_mutex_lock(&t->fetchq.mu);
	enum claim c = t2_refused_locked(t, key) ? REFUSED : CLAIMED;
	for (struct t2_fetching *f = t->fetching; f && c == CLAIMED; f = f->next)
		if (!memcmp(f->key, key, TIER2_KEY_LEN))
			c = TAKEN;
	if (c == CLAIMED && !mine)
		c = NOMEM; /* not fetched: an unclaimed fetch's end could end another's claim */
	if (c == CLAIMED) {
		memcpy(mine->key, key, TIER2_KEY_LEN);
		mine->next = t->fetching;
		t->fetching = mine;
		mine = NULL;
	}
	pthread_mutex_unlock(&t->fetchq.mu);
	free(mine);
	return c;
}

/* Whether the store holds key's entry, in service. */
static int stored(struct k3d_t2 *t, const uint8_t *key)
{
	struct store_entry_info *info = NULL;
	struct status st;
	int here = store_inspect(t->srv->store, key, &info, &st) == STATUS_OK && !info->quarantined;
	store_entry_info_free(info);
	return here;
}

static void probe(struct searcher *s, struct t2_item *it)
{
	struct k3d_t2 *t = s->t;
	uint32_t p = 0;
	it->st = tier2_longest(s->r, t->cfg.ns, it->fingerprint, it->salt, it->salt_len, it->tokens,
	                       it->n_tokens, it->key, &p, &s->ts, it->err, sizeof(it->err));
	if (it->st != TIER2_OK || p <= it->local_p) {
		it->kind = T2_NONE;
		t2_post(t, it);
		return;
	}
	it->prefix_len = p;
	enum claim c = claim(t, it->key);
	if (c == TAKEN) {
		it->kind = T2_JOIN;
		t2_post(t, it);
		return;
	}
	/* stored since the lookup looked (a fetch for an earlier lookup, done
	 * while this one queued): the local store answers it. Asked once the
	 * key is claimed, as a fetch ends by storing before its claim goes. */
	if (c != CLAIMED) {
		it->kind = T2_NONE;
		t2_post(t, it);
		return;
	}
	if (stored(t, it->key)) {
		it->kind = T2_RELEASE;
		t2_post(t, it);
		return;
	}
	/* the fetches ahead of this one (t2_estimate.h): past
	 * --tier2-queue-wait the lookup is answered locally at once, as
	 * recomputing may be sooner */
	uint64_t avg = atomic_load(&t->fetch_ms);
	uint64_t began = atomic_load(&t->fetch_began_ms), now = t2_now_ms();
	uint64_t ran = began && now > began ? now - began : 0;
	pthread_mutex_lock(&t->fetchq.mu);
	uint64_t queued = t->fetchq.n;
	int busy = began || t->holding;
	pthread_mutex_unlock(&t->fetchq.mu);
	uint64_t ahead_ms = t2_ahead_ms(queued, busy, ran, avg);
	if (ahead_ms > t->cfg.queue_wait_ms) {
		k3d_log(K3D_LOG_DEBUG,
		        "tier2: %llu fetches ahead, about %llu ms: a longer entry not fetched",
		        (unsigned long long)queued + (unsigned long long)busy,
		        (unsigned long long)ahead_ms);
		it->kind = T2_SKIPPED;
		t2_post(t, it);
		return;
	}
	/* the lookup waits for the fetch from now on; without memory to tell
	 * it so, the entry is not fetched (else the lookup would wait out
	 * --tier2-wait unaware) */
	struct t2_item *found = calloc(1, sizeof(*found));
	if (!found) {
		it->kind = T2_SKIPPED;
		t2_post(t, it);
		return;
	}
	found->kind = T2_FOUND;
	found->waiter = it->waiter;
	memcpy(found->key, it->key, TIER2_KEY_LEN);
	t2_post(t, found);
	/* the prompt is not needed past here */
	free(it->tokens);
	free(it->salt);
	it->tokens = NULL;
	it->salt = NULL;
	it->kind = T2_FETCH;
	if (t2_queue_push(&t->fetchq, it) != 0) {
		/* K3D_T2_FETCH_QUEUE entries wait already (or the daemon stops) */
		it->kind = T2_SKIPPED;
		t2_post(t, it);
	}
}

void *t2_search_main(void *arg)
{
	struct searcher s = {.t = arg};
	s.r = t2_router(s.t);
	for (;;) {
		struct t2_item *it = t2_queue_pop(&s.t->searchq);
		if (!it)
			break;
		/* held up while it works: lookups then answer locally at once */
		atomic_store(&s.t->busy_since_ms, t2_now_ms());
		if (it->kind == T2_LIST) { /* in read-only mode (t2.c, k3d_t2_list) */
			t2_list_run(s.t, s.r, &s.ts, it);
		} else if (!s.r) { /* no router (out of memory at start): answered locally */
			it->kind = T2_NONE;
			it->st = TIER2_NOMEM;
			t2_post(s.t, it);
		} else {
			probe(&s, it);
		}
		atomic_store(&s.t->busy_since_ms, 0);
		if (s.r)
			t2_count_router(s.t, s.r, &s.seen, &s.ts, &s.ts_seen);
	}
	cluster_router_free(s.r);
	return NULL;
}
