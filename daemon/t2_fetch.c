/* t2_fetch: the fetch thread of the second tier (t2.h). It takes the
 * entries the search thread found and claimed (t2_search.c), one at a time
 * and each once the writer has stored the last, and streams each into the
 * store as it arrives, every chunk and part checked (t2_stage.c). A fetch
 * that fails before the writer has it is posted back to the loop. */
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

static void fetch(struct fetcher *f, struct t2_item *it)
{
	struct k3d_t2 *t = f->t;
	/* one fetch at a time: the last is stored (or given up) first */
	if (t2_hold(t) != 0) {
		it->st = TIER2_NODE_ERROR;
		snprintf(it->err, sizeof(it->err), "the daemon is stopping");
	} else if (!f->r) {
		t2_release(t);
		it->st = TIER2_NOMEM;
		snprintf(it->err, sizeof(it->err), "no router (out of memory at start-up)");
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
		atomic_store(&f.t->fetch_began_ms, t2_now_ms());
		fetch(&f, it);
		atomic_store(&f.t->fetch_began_ms, 0);
		if (f.r)
			t2_count_router(f.t, f.r, &f.seen, &f.ts, &f.ts_seen);
	}
	cluster_router_free(f.r);
	return NULL;
}
