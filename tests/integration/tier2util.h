/* Helpers for the tests of src/tier2 against a real Redis Cluster
 * (clusterutil.h): a router to it, a snapshot's blobs as tier2 blobs, and
 * the skip when Redis is not installed. Include after <cmocka.h>. */
#ifndef K3_TIER2UTIL_H
#define K3_TIER2UTIL_H

#include "clusterutil.h"
#include "storeutil.h"
#include "tier2/tier2.h"

/* A router seeded with the cluster's first node (5 s per command). */
static inline struct cluster_router *tier2util_router(const struct clusterutil *cl)
{
	char seeds[128], err[256] = "";
	snprintf(seeds, sizeof(seeds), "redis://127.0.0.1:%d", cl->port[0]);
	struct cluster_options o = {.command_timeout_ms = 5000};
	struct cluster_router *r = cluster_router_new(seeds, &o, err, sizeof(err));
	if (!r)
		fail_msg("router: %s", err);
	return r;
}

/* s's blobs as tier2 blobs (the caller frees the array; s keeps the bytes). */
static inline struct tier2_blob *tier2util_blobs(const struct storeutil_snap *s)
{
	struct tier2_blob *b = calloc(s->n, sizeof(*b));
	for (uint32_t i = 0; b && i < s->n; i++)
		b[i] = (struct tier2_blob){s->blobs[i].data, s->blobs[i].size};
	return b;
}

/* 1 (after saying so) when redis-server or redis-cli is not on PATH: the
 * test then exits 77, skipped. */
static inline int tier2util_skip(const char *test)
{
	if (clusterutil_on_path("redis-server") && clusterutil_on_path("redis-cli"))
		return 0;
	printf("%s: skipped: no redis-server or redis-cli on PATH "
	       "(scripts/install-deps installs redis-server)\n",
	       test);
	return 1;
}

#endif
