/* t2_fetch: the fetch thread of the second tier (t2.h). For each lookup the
 * loop hands it, it searches the cluster's longest prefix of the prompt;
 * when that is longer than the local answer it fetches the entry, each
 * chunk and part checked, into the store as it arrives (t2_stage.c), unless
 * another lookup's fetch of the same key is in progress, and posts each
 * step back to the loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "t2_priv.h"

struct fetcher {
	struct k3d_t2 *t;
	struct cluster_router *r;
	struct cluster_stats seen;
	struct tier2_stats ts, ts_seen;
};

/* Whether key is being fetched; if not, it is from now on. */
static int claim(struct k3d_t2 *t, const uint8_t *key)
{
	struct t2_fetching *mine = malloc(sizeof(*mine));
	pthread_mutex_lock(&t->fetchq.mu);
	int taken = 0;
	for (struct t2_fetching *f = t->fetching; f && !taken; f = f->next)
		taken = !memcmp(f->key, key, TIER2_KEY_LEN);
	if (!taken && mine) {
		memcpy(mine->key, key, TIER2_KEY_LEN);
		mine->next = t->fetching;
		t->fetching = mine;
		mine = NULL;
	}
	pthread_mutex_unlock(&t->fetchq.mu);
	free(mine); /* taken by another (or no memory: fetched unclaimed) */
	return taken;
}

static void probe(struct fetcher *f, struct t2_item *it)
{
	struct k3d_t2 *t = f->t;
	uint32_t p = 0;
	it->st = tier2_longest(f->r, t->cfg.ns, it->fingerprint, it->salt, it->salt_len, it->tokens,
	                       it->n_tokens, it->key, &p, &f->ts, it->err, sizeof(it->err));
	if (it->st != TIER2_OK || p <= it->local_p) {
		it->kind = T2_NONE;
		t2_post(t, it);
		return;
	}
	it->prefix_len = p;
	/* stored since the lookup looked (a fetch for an earlier lookup, done
	 * while this one queued): the local store answers it */
	struct store_entry_info *info = NULL;
	struct status st;
	int here = store_inspect(t->srv->store, it->key, &info, &st) == STATUS_OK &&
	           !info->quarantined;
	store_entry_info_free(info);
	if (here || t2_refused(t, it->key)) {
		it->kind = T2_NONE;
		t2_post(t, it);
		return;
	}
	if (claim(t, it->key)) {
		it->kind = T2_JOIN;
		t2_post(t, it);
		return;
	}
	/* the lookup waits for the fetch from now on */
	struct t2_item *found = calloc(1, sizeof(*found));
	if (found) {
		found->kind = T2_FOUND;
		found->waiter = it->waiter;
		memcpy(found->key, it->key, TIER2_KEY_LEN);
		t2_post(t, found);
	}
	/* one fetch at a time: the last is stored (or given up) first */
	if (t2_hold(t) != 0) {
		it->st = TIER2_NODE_ERROR;
		snprintf(it->err, sizeof(it->err), "the daemon is stopping");
	} else {
		/* no larger than a publish the daemon would take */
		uint64_t max = t->srv->cfg.max_payload < t->srv->cfg.max_bytes
		                       ? t->srv->cfg.max_payload
		                       : t->srv->cfg.max_bytes;
		struct tier2_reader *rd = NULL;
		it->st = tier2_read_open(f->r, t->cfg.ns, it->key, max, &f->ts, &rd, it->err,
		                         sizeof(it->err));
		/* streamed into the store (t2_stage.c); the job has it then */
		int handed = it->st == TIER2_OK && t2_stage_fetch(t, rd, it) == 0;
		tier2_read_close(rd);
		if (handed)
			return;
		t2_release(t);
	}
	it->kind = T2_FAILED;
	t2_post(t, it);
}

void *t2_fetch_main(void *arg)
{
	struct fetcher f = {.t = arg};
	f.r = t2_router(f.t);
	for (;;) {
		struct t2_item *it = t2_queue_pop(&f.t->fetchq);
		if (!it)
			break;
		if (it->kind == T2_LIST) { /* in read-only mode (t2.c, k3d_t2_list) */
			/* held up meanwhile, as by a fetch: lookups do not wait */
			atomic_store(&f.t->busy_since_ms, t2_now_ms());
			t2_list_run(f.t, f.r, &f.ts, it);
			atomic_store(&f.t->busy_since_ms, 0);
			if (f.r)
				t2_count_router(f.t, f.r, &f.seen, &f.ts, &f.ts_seen);
			continue;
		}
		if (!f.r) { /* no router (out of memory at start): every lookup answers locally */
			it->kind = T2_NONE;
			it->st = TIER2_NOMEM;
			t2_post(f.t, it);
			continue;
		}
		atomic_store(&f.t->busy_since_ms, t2_now_ms());
		probe(&f, it);
		atomic_store(&f.t->busy_since_ms, 0);
		t2_count_router(f.t, f.r, &f.seen, &f.ts, &f.ts_seen);
	}
	cluster_router_free(f.r);
	return NULL;
}
