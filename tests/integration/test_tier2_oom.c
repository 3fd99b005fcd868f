/* The second tier when memory runs out in the daemon's process, against a
 * real 3-master Redis Cluster started here (clusterutil.h). The test is
 * linked with -Wl,--wrap for the allocators (allocfail.h), so the tier's own
 * allocations (not hiredis's) can be made to fail: each of a put's (of a
 * new entry, and of one the cluster has, as the daemon copies), a
 * longest-prefix search's, a get's, a delete's and an undo's in turn,
 * until a run fails none.
 * After every run:
 *  - nothing crashed, and under ASan nothing leaked;
 *  - the call said TIER2_NOMEM, or answered right: a get OK has exactly the
 *    published bytes, a search OK found the stored prefix; never DAMAGED or
 *    MISSING, on which the daemon would count or drop a healthy entry;
 *  - the cluster still serves the entry byte for byte.
 * Without redis-server and redis-cli on PATH: skipped (exit 77). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "allocfail.h"
#include "model.h"
#include "prefix.h"
#include "tier2util.h"

#define P_HELD 300 /* the entry every run reads: MLA rows in shared parts */

static struct clusterutil cl;
static struct k3cache_model *twin;
static uint8_t fp[32];
static uint32_t toks[P_HELD + 1];
static uint8_t held_key[TIER2_KEY_LEN];
static struct storeutil_snap held;

static struct cluster_router *router(void)
{
	return tier2util_router(&cl);
}

static struct tier2_blob *blobs_of(const struct storeutil_snap *s)
{
	return tier2util_blobs(s);
}

/* 1 when e holds exactly the held entry. */
static int is_held(const struct tier2_entry *e)
{
	if (e->prefix_len != P_HELD || e->n_blobs != held.n ||
	    memcmp(e->tokens, toks, (size_t)P_HELD * 4u) != 0)
		return 0;
	for (uint32_t i = 0; i < held.n; i++)
		if (e->blobs[i].size != held.blobs[i].size ||
		    memcmp(e->blobs[i].data, held.blobs[i].data, held.blobs[i].size) != 0)
			return 0;
	return 1;
}

/* Outside any failure: the held entry is found and read whole. */
static void expect_served(struct cluster_router *r, const char *what, long n)
{
	struct tier2_stats stats = {0};
	char err[512] = "";
	uint8_t key[TIER2_KEY_LEN];
	uint32_t p = 0;
	enum tier2_status st = tier2_longest(r, "oom", fp, "", 0, toks, P_HELD + 1, key, &p, &stats,
	                                     err, sizeof(err));
	if (st != TIER2_OK || p != P_HELD)
		fail_msg("after %s with allocation %ld failing: longest: %s, P=%u: %s", what, n,
		         tier2_status_name(st), p, err);
	struct tier2_entry e;
	st = tier2_get(r, "oom", held_key, &e, &stats, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("after %s with allocation %ld failing: get: %s: %s", what, n,
		         tier2_status_name(st), err);
	assert_true(is_held(&e));
	tier2_entry_free(&e);
}

/* What a call under failure n may answer. */
static void expect_nomem(enum tier2_status st, const char *what, long n, const char *err)
{
	if (st != TIER2_OK && st != TIER2_NOMEM)
		fail_msg("%s with allocation %ld failing: %s, not nomem: %s", what, n,
		         tier2_status_name(st), err);
}

/* A put of a new entry each run (a conversation's next turn: its MLA rows
 * share the held entry's parts). */
static enum tier2_status op_put(struct cluster_router *r, long n)
{
	static uint32_t seed = 100;
	uint32_t t[P_HELD + 40];
	memcpy(t, toks, sizeof(uint32_t) * P_HELD);
	for (uint32_t i = P_HELD; i < P_HELD + 40; i++)
		t[i] = 900000u + ++seed;
	struct storeutil_snap s = storeutil_conv_snap(twin, P_HELD + 40, 1, seed);
	struct tier2_blob *b = blobs_of(&s);
	struct tier2_put_options o = {0};
	struct tier2_stats stats = {0};
	char err[512] = "";
	allocfail_arm(n);
	enum tier2_status st = tier2_put(r, "oom", fp, "", 0, t, P_HELD + 40, b, s.n, &o, &stats,
	                                 err, sizeof(err));
	allocfail_disarm();
	expect_nomem(st, "put", n, err);
	free(b);
	storeutil_snap_free(&s);
	return st;
}

static enum tier2_status op_longest(struct cluster_router *r, long n)
{
	struct tier2_stats stats = {0};
	char err[512] = "";
	uint8_t key[TIER2_KEY_LEN];
	uint32_t p = 0;
	allocfail_arm(n);
	enum tier2_status st = tier2_longest(r, "oom", fp, "", 0, toks, P_HELD + 1, key, &p, &stats,
	                                     err, sizeof(err));
	allocfail_disarm();
	expect_nomem(st, "longest", n, err);
	if (st == TIER2_OK && (p != P_HELD || memcmp(key, held_key, sizeof(key)) != 0))
		fail_msg("longest with allocation %ld failing: OK with P=%u, not %u", n, p, P_HELD);
	return st;
}

static enum tier2_status op_get(struct cluster_router *r, long n)
{
	struct tier2_stats stats = {0};
	char err[512] = "";
	struct tier2_entry e;
	allocfail_arm(n);
	enum tier2_status st = tier2_get(r, "oom", held_key, &e, &stats, err, sizeof(err));
	allocfail_disarm();
	expect_nomem(st, "get", n, err);
	if (st == TIER2_OK) {
		if (!is_held(&e))
			fail_msg("get with allocation %ld failing: OK with other bytes", n);
		tier2_entry_free(&e);
	}
	return st;
}

/* The held entry's record's generation (outside any failure). */
static uint64_t held_generation(struct cluster_router *r)
{
	char name[TIER2_NAME_MAX], err[320] = "";
	tier2_name_record(name, "oom", held_key);
	const char *argv[] = {"GET", name};
	size_t lens[] = {3, strlen(name)};
	redisReply *rep = NULL;
	if (cluster_command_argv(r, name, strlen(name), 2, argv, lens, &rep) != 0 ||
	    rep->type != REDIS_REPLY_STRING)
		fail_msg("GET %s: %s", name, cluster_error(r));
	struct tier2_record rec;
	if (tier2_record_decode(rep->str, rep->len, &rec, err, sizeof(err)) != 0)
		fail_msg("record: %s", err);
	uint64_t gen = rec.generation;
	tier2_record_free(&rec);
	freeReplyObject(rep);
	return gen;
}

/* The daemon's copy of an entry the cluster has already (keep_existing):
 * OK with it kept, or NOMEM; never a record written over it, which would
 * leave the old generation's chunks and parts named by nothing. */
static enum tier2_status op_put_existing(struct cluster_router *r, long n)
{
	uint64_t gen = held_generation(r);
	struct tier2_blob *b = blobs_of(&held);
	struct tier2_put_options o = {.keep_existing = 1};
	struct tier2_stats stats = {0};
	char err[512] = "";
	allocfail_arm(n);
	enum tier2_status st = tier2_put(r, "oom", fp, "", 0, toks, P_HELD, b, held.n, &o, &stats,
	                                 err, sizeof(err));
	allocfail_disarm();
	free(b);
	expect_nomem(st, "put of an existing entry", n, err);
	if (held_generation(r) != gen)
		fail_msg("put of an existing entry with allocation %ld failing: its record was "
		         "written over (%s)",
		         n, tier2_status_name(st));
	return st;
}

/* A delete (the daemon's making room), or an undo, of an entry put just
 * before: OK, or NOMEM and then done by a second try; never DAMAGED or
 * MISSING, on which the daemon takes it off its ledger with its bytes still
 * in the cluster. */
static enum tier2_status take_back(struct cluster_router *r, long n, int undo)
{
	static uint32_t seed = 5000;
	uint32_t t[40];
	for (uint32_t i = 0; i < 40; i++)
		t[i] = 800000u + ++seed;
	struct storeutil_snap s = storeutil_snap(twin, 40, seed);
	struct tier2_blob *b = blobs_of(&s);
	struct tier2_put_options o = {.generation = seed};
	struct tier2_stats stats = {0};
	char err[512] = "";
	if (tier2_put(r, "oom", fp, "", 0, t, 40, b, s.n, &o, &stats, err, sizeof(err)) != TIER2_OK)
		fail_msg("put: %s", err);
	free(b);
	storeutil_snap_free(&s);
	uint8_t key[TIER2_KEY_LEN];
	assert_int_equal(prefix_key(fp, "", 0, t, 40, key), 0);
	const char *what = undo ? "undo" : "delete";
	allocfail_arm(n);
	enum tier2_status st = undo ? tier2_undo(r, "oom", key, seed, NULL, err, sizeof(err))
	                            : tier2_delete(r, "oom", key, seed, NULL, err, sizeof(err));
	allocfail_disarm();
	expect_nomem(st, what, n, err);
	if (st != TIER2_OK) {
		st = undo ? tier2_undo(r, "oom", key, seed, NULL, err, sizeof(err))
		          : tier2_delete(r, "oom", key, seed, NULL, err, sizeof(err));
		if (st != TIER2_OK)
			fail_msg("%s again after allocation %ld failed: %s: %s", what, n,
			         tier2_status_name(st), err);
		st = TIER2_NOMEM;
	}
	struct tier2_entry e;
	enum tier2_status gone = tier2_get(r, "oom", key, &e, &stats, err, sizeof(err));
	if (gone == TIER2_OK)
		tier2_entry_free(&e);
	assert_int_equal(gone, TIER2_MISSING);
	return st;
}

static enum tier2_status op_delete(struct cluster_router *r, long n)
{
	return take_back(r, n, 0);
}

/* The undo of a finished put (a daemon's journal after a crash): the same. */
static enum tier2_status op_undo(struct cluster_router *r, long n)
{
	return take_back(r, n, 1);
}

static void sweep(const char *what, enum tier2_status (*op)(struct cluster_router *, long))
{
	struct cluster_router *r = router();
	long n;
	int refused = 0;
	for (n = 1; n < 20000; n++) {
		enum tier2_status st = op(r, n);
		long hits = allocfail_hits();
		refused += st != TIER2_OK;
		expect_served(r, what, n);
		if (!hits)
			break;
	}
	printf("%s: %ld allocations, %d refused for them\n", what, n - 1, refused);
	assert_true(n > 1 && n < 20000);
	cluster_router_free(r);
}

static void test_put_out_of_memory(void **state)
{
	(void)state;
	sweep("put", op_put);
}

static void test_longest_out_of_memory(void **state)
{
	(void)state;
	sweep("longest", op_longest);
}

static void test_put_existing_out_of_memory(void **state)
{
	(void)state;
	sweep("put of an existing entry", op_put_existing);
}

static void test_undo_out_of_memory(void **state)
{
	(void)state;
	sweep("undo", op_undo);
}

static void test_delete_out_of_memory(void **state)
{
	(void)state;
	sweep("delete", op_delete);
}

static void test_get_out_of_memory(void **state)
{
	(void)state;
	sweep("get", op_get);
}

static int setup(void **state)
{
	(void)state;
	char err[MODEL_ERROR_MAX] = "";
	twin = model_load_file(K3_SHARED_DIR "/models/kimi-k3-0.40b-twin.json", err);
	if (!twin || model_fingerprint(twin, fp) != 0) {
		fprintf(stderr, "test_tier2_oom: the twin model: %s\n", err);
		return -1;
	}
	for (uint32_t i = 0; i <= P_HELD; i++)
		toks[i] = 70000u + i * 7u;
	if (clusterutil_start(&cl, 3) != 0)
		return -1;
	held = storeutil_conv_snap(twin, P_HELD, 1, 1);
	struct cluster_router *r = router();
	struct tier2_blob *b = blobs_of(&held);
	struct tier2_put_options o = {0};
	struct tier2_stats stats = {0};
	char perr[512] = "";
	enum tier2_status st = tier2_put(r, "oom", fp, "", 0, toks, P_HELD, b, held.n, &o, &stats,
	                                 perr, sizeof(perr));
	free(b);
	cluster_router_free(r);
	if (st != TIER2_OK) {
		fprintf(stderr, "test_tier2_oom: put: %s\n", perr);
		return -1;
	}
	return prefix_key(fp, "", 0, toks, P_HELD, held_key) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	clusterutil_stop(&cl);
	storeutil_snap_free(&held);
	model_free(twin);
	return 0;
}

int main(void)
{
	if (tier2util_skip("test_tier2_oom"))
		return 77;
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_longest_out_of_memory),
	        cmocka_unit_test(test_get_out_of_memory),
	        cmocka_unit_test(test_put_out_of_memory),
	        cmocka_unit_test(test_put_existing_out_of_memory),
	        cmocka_unit_test(test_delete_out_of_memory),
	        cmocka_unit_test(test_undo_out_of_memory),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
