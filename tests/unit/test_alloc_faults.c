/* The store and the client's checks when memory runs out. This test is linked
 * with -Wl,--wrap for malloc, calloc, realloc, strdup, strndup and
 * XXH3_createState (tests/CMakeLists.txt), so every allocation made by the
 * project's own code in this binary reaches the wrappers (allocfail.h), and any one
 * of them can be made to fail; production code has no hook. (LMDB's,
 * jansson's and libc's own allocations are not ours and are not failed.)
 *
 * Each operation runs with its 1st, 2nd, 3rd ... allocation failing, until a
 * run fails none. After every run the test asserts:
 *  - the operation returned (no crash, no hang) and, under ASan, leaked
 *    nothing;
 *  - an answer given despite the failure is right: a lookup that answers OK
 *    found the stored prefix or nothing, a restore that answers OK has the
 *    published bytes;
 *  - the store is consistent (verify finds nothing, no reference held) and
 *    still takes a publish and serves it. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <lmdb.h>

#include "allocfail.h"
#include "k3cache_raw.h"
#include "model.h"
#include "prefix.h"
#include "slots.h"
#include "store/env.h"
#include "store/lru.h" /* store_touch */
#include "storeutil.h"

static void arm(long n)
{
	allocfail_arm(n);
}

static void disarm(void)
{
	allocfail_disarm();
}

/* ---- the fixture ---------------------------------------------------------- */

#define P_SMALL 40  /* a small entry: one transaction */
#define P_BASE  130 /* a conversation's first turn: two shared blocks */
#define P_TURN  290 /* its next turn, as a delta from the first */

struct fixture {
	char *dir;
	struct store *st;
	struct k3cache_model *m;   /* entries of a few KiB */
	struct k3cache_model *big; /* ~1.8 MB entries: staged (stage 256 KiB) */
	uint32_t next;             /* makes every publish a new entry */
	uint32_t t[P_TURN + 1];    /* the conversation's tokens */
	uint8_t small_key[STORE_KEY_LEN], base_key[STORE_KEY_LEN];
};

static void toks(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

static int open_store(struct fixture *f)
{
	struct store_options o = {.durability = STORE_FAST, .stage_bytes = 256u << 10};
	struct status s;
	if (store_open(f->dir, &o, &f->st, &s) != STATUS_OK) {
		fprintf(stderr, "open: %s\n", s.message);
		return -1;
	}
	return 0;
}

static enum status_code conv_publish(struct fixture *f, uint32_t p, uint32_t seed,
                                     struct store_publish_res *res)
{
	struct storeutil_snap s = storeutil_conv_snap(f->m, p, 1, seed);
	struct store_publish_req req = {f->m->fingerprint, "", 0, f->t, p, s.blobs, s.n};
	struct status st;
	enum status_code code = store_publish(f->st, &req, res, &st);
	storeutil_snap_free(&s);
	return code;
}

/* A store holding a small entry (tokens 1000..) and a conversation's first
 * turn (f->t[0..P_BASE)), both known to the fixture. */
static void seed(struct fixture *f)
{
	f->dir = storeutil_tmpdir();
	assert_int_equal(open_store(f), 0);
	assert_int_equal(store_put_model(f->st, f->m, NULL, NULL), STATUS_OK);
	assert_int_equal(store_put_model(f->st, f->big, NULL, NULL), STATUS_OK);
	uint32_t t[P_SMALL];
	toks(t, P_SMALL, 1000);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, P_SMALL, 1, &res), STATUS_OK);
	memcpy(f->small_key, res.key, STORE_KEY_LEN);
	assert_int_equal(conv_publish(f, P_BASE, 1, &res), STATUS_OK);
	memcpy(f->base_key, res.key, STORE_KEY_LEN);
}

static void unseed(struct fixture *f)
{
	store_close(f->st);
	f->st = NULL;
	storeutil_rmdir(f->dir);
	f->dir = NULL;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	f->m = storeutil_model("alloc-small", 16);
	f->big = storeutil_model("alloc-big", 150000);
	toks(f->t, P_TURN + 1, 7u << 20);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	disarm();
	if (f->st)
		unseed(f);
	model_free(f->m);
	model_free(f->big);
	free(f);
	return 0;
}

/* The blobs of snap, each its segments back to back, against want's. */
static int snap_is(const struct store_snapshot *snap, const struct storeutil_snap *want)
{
	if (snap->n_layers != want->n)
		return 0;
	for (uint32_t i = 0; i < want->n; i++) {
		const struct store_layer *l = &snap->layers[i];
		if (l->size != want->blobs[i].size)
			return 0;
		uint64_t at = 0;
		for (uint32_t g = 0; g < l->n_segments; g++) {
			if (at + l->segments[g].len > l->size ||
			    memcmp(l->segments[g].data, want->bufs[i] + at, l->segments[g].len) !=
			            0)
				return 0;
			at += l->segments[g].len;
		}
		if (at != l->size)
			return 0;
	}
	return 1;
}

/* ---- the operations ------------------------------------------------------- */

/* Each returns the operation's code; a result given despite a failure is
 * checked here (a wrong answer fails the test at once). */

static enum status_code op_open(struct fixture *f, long n)
{
	char *dir = storeutil_tmpdir();
	struct store_options o = {.durability = STORE_FAST};
	struct store *s = NULL;
	struct status st;
	arm(n);
	enum status_code code = store_open(dir, &o, &s, &st);
	disarm();
	if (code != STATUS_OK) {
		fprintf(stderr, "open: %s\n", st.message);
	} else {
		/* an open answered OK knows its directory: its markers, its
		 * checks and its messages are made from it */
		assert_non_null(s->dir);
		assert_string_equal(s->dir, dir);
		store_close(s);
		/* and its clean close leaves no marker of an unclean stop, which
		 * would have the next open check the whole file */
		DIR *d = opendir(dir);
		assert_non_null(d);
		for (struct dirent *e; (e = readdir(d));)
			if (strncmp(e->d_name, "running.", 8) == 0)
				fail_msg("open with allocation %ld failing: %s left after a clean "
				         "close",
				         n, e->d_name);
		closedir(d);
	}
	storeutil_rmdir(dir);
	(void)f;
	return code;
}

/* A read-only open of the fixture's store, which this process has open
 * already: it shares that environment (envshare.h), and a failed open
 * leaves the share as it was (the fixture's handle still works, checked
 * after every run, and the shared one closes cleanly). */
static enum status_code op_open_shared(struct fixture *f, long n)
{
	struct store_options o = {.read_only = 1};
	struct store *s = NULL;
	struct status st;
	arm(n);
	enum status_code code = store_open(f->dir, &o, &s, &st);
	disarm();
	if (code != STATUS_OK) {
		fprintf(stderr, "shared open: %s\n", st.message);
		return code;
	}
	assert_non_null(s->dir);
	assert_string_equal(s->dir, f->dir);
	assert_int_equal(storeutil_lookup(s, f->m, "", f->t, P_SMALL, P_SMALL, NULL),
	                 storeutil_lookup(f->st, f->m, "", f->t, P_SMALL, P_SMALL, NULL));
	store_close(s);
	return code;
}

static enum status_code op_put_model(struct fixture *f, long n)
{
	char name[32];
	snprintf(name, sizeof(name), "alloc-%u", ++f->next);
	struct k3cache_model *m = storeutil_model(name, 8);
	int created = 0;
	struct status st;
	arm(n);
	enum status_code code = store_put_model(f->st, m, &created, &st);
	disarm();
	if (code == STATUS_OK) {
		assert_true(created);
		assert_true(store_model_stored(f->st, m->fingerprint));
	}
	model_free(m);
	return code;
}

/* Publishes snap at tokens t[0..p) under failure n; a publish answered OK
 * is restored and compared. */
static enum status_code publish_at(struct fixture *f, const struct k3cache_model *m,
                                   const uint32_t *t, uint32_t p, struct storeutil_snap *snap,
                                   long n)
{
	struct store_publish_req req = {m->fingerprint, "", 0, t, p, snap->blobs, snap->n};
	struct store_publish_res res;
	struct status st;
	arm(n);
	enum status_code code = store_publish(f->st, &req, &res, &st);
	disarm();
	if (code == STATUS_CORRUPT)
		fprintf(stderr, "publish: %s\n", st.message);
	if (code == STATUS_OK) {
		struct store_snapshot *out;
		assert_int_equal(store_restore(f->st, res.key, &out, &st), STATUS_OK);
		assert_true(snap_is(out, snap));
		store_snapshot_release(out);
	}
	storeutil_snap_free(snap);
	return code;
}

static enum status_code op_publish(struct fixture *f, long n)
{
	uint32_t t[P_SMALL];
	toks(t, P_SMALL, 100000u * ++f->next);
	struct storeutil_snap s = storeutil_snap(f->m, P_SMALL, f->next);
	return publish_at(f, f->m, t, P_SMALL, &s, n);
}

static enum status_code op_publish_staged(struct fixture *f, long n)
{
	uint32_t t[P_SMALL];
	toks(t, P_SMALL, 100000u * ++f->next);
	struct storeutil_snap s = storeutil_snap(f->big, P_SMALL, f->next);
	return publish_at(f, f->big, t, P_SMALL, &s, n);
}

/* The conversation's next turn, whole: its rows share the first turn's
 * blocks. */
static enum status_code op_publish_blocks(struct fixture *f, long n)
{
	struct storeutil_snap s = storeutil_conv_snap(f->m, P_TURN, 1, 2);
	return publish_at(f, f->m, f->t, P_TURN, &s, n);
}

/* The same turn as a delta from the first: the base's rows from the map. */
static enum status_code op_publish_delta(struct fixture *f, long n)
{
	struct storeutil_snap whole = storeutil_conv_snap(f->m, P_TURN, 1, 3);
	struct store_blob blobs[4];
	unsigned char *rows = NULL;
	for (uint32_t i = 0; i < whole.n; i++) {
		blobs[i] = whole.blobs[i];
		const struct model_layer *l = &f->m->layers[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		size_t kb = (size_t)l->k_row * 4, vb = (size_t)l->v_row * 4, r = P_TURN - P_BASE;
		const unsigned char *w = whole.bufs[i];
		rows = malloc(r * (kb + vb));
		memcpy(rows, w + 9 + (size_t)P_BASE * kb, r * kb);
		memcpy(rows + r * kb, w + 13 + (size_t)P_TURN * kb + (size_t)P_BASE * vb, r * vb);
		blobs[i].data = rows;
		blobs[i].size = r * (kb + vb);
		blobs[i].xxh3 = checksum_blob(w, whole.blobs[i].size, i);
	}
	struct store_publish_req req = {f->m->fingerprint, "", 0, f->t, P_TURN, blobs, whole.n};
	struct store_delta d;
	struct store_publish_res res;
	struct status st;
	int refused = 0;
	arm(n);
	enum status_code code =
	        store_delta_assemble(f->st, &req, f->base_key, P_BASE, &d, &refused, &st);
	if (code == STATUS_OK) {
		struct store_publish_req asm_ = req;
		asm_.blobs = d.blobs;
		code = store_publish(f->st, &asm_, &res, &st);
		store_delta_free(&d);
	}
	disarm();
	assert_false(refused); /* a failed allocation is not the worker's bad sum */
	if (code == STATUS_OK) {
		struct store_snapshot *snap;
		assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
		assert_true(snap_is(snap, &whole));
		store_snapshot_release(snap);
	}
	free(rows);
	storeutil_snap_free(&whole);
	return code;
}

/* The conversation's prompt one turn on: the longest stored prefix is the
 * first turn, found by the walk over the node hashes. */
static enum status_code op_lookup(struct fixture *f, long n)
{
	struct store_lookup_req req = {f->m->fingerprint, "", 0, f->t, P_TURN + 1, 0, 0};
	struct store_lookup_res res = {0};
	struct status st;
	arm(n);
	enum status_code code = store_lookup(f->st, &req, &res, &st);
	disarm();
	if (code == STATUS_OK) { /* a miss would send the worker to recompute */
		assert_int_equal(res.prefix_len, P_BASE);
		assert_memory_equal(res.key, f->base_key, STORE_KEY_LEN);
	}
	return code;
}

static enum status_code op_restore(struct fixture *f, long n)
{
	struct store_snapshot *snap = NULL;
	struct status st;
	arm(n);
	enum status_code code =
	        store_restore_opt(f->st, f->base_key, STORE_RESTORE_USE, &snap, &st);
	disarm();
	if (code == STATUS_OK) {
		struct storeutil_snap want = storeutil_conv_snap(f->m, P_BASE, 1, 1);
		assert_true(snap_is(snap, &want));
		storeutil_snap_free(&want);
		store_snapshot_release(snap);
	}
	return code;
}

/* The daemon's restore: deferred, each chunk checked as it is sent, then the
 * whole verified. */
static enum status_code op_restore_deferred(struct fixture *f, long n)
{
	struct store_snapshot *snap = NULL;
	struct status st;
	arm(n);
	enum status_code code =
	        store_restore_opt(f->st, f->base_key, STORE_RESTORE_DEFER, &snap, &st);
	for (uint64_t c = 0; code == STATUS_OK && c < store_snapshot_chunks(snap); c++) {
		const void *data;
		size_t len;
		code = store_snapshot_chunk(snap, c, &data, &len, &st);
	}
	if (code == STATUS_OK)
		code = store_snapshot_verify(snap, &st);
	if (snap)
		store_snapshot_release(snap);
	disarm();
	return code;
}

static int count_entry(const struct store_entry_info *info, void *ctx)
{
	(void)info;
	++*(int *)ctx;
	return 0;
}

static enum status_code op_list(struct fixture *f, long n)
{
	int entries = 0;
	struct status st;
	arm(n);
	enum status_code code = store_list(f->st, NULL, NULL, 0, count_entry, &entries, &st);
	disarm();
	if (code == STATUS_OK)
		assert_true(entries >= 2);
	return code;
}

static enum status_code op_inspect(struct fixture *f, long n)
{
	struct store_entry_info *info = NULL;
	struct status st;
	arm(n);
	enum status_code code = store_inspect(f->st, f->base_key, &info, &st);
	disarm();
	if (code == STATUS_OK) {
		assert_int_equal(info->prefix_len, P_BASE);
		assert_memory_equal(info->tokens, f->t, P_BASE * sizeof(uint32_t));
		store_entry_info_free(info);
	}
	return code;
}

/* Opens the store again: its cache of model specs is empty, so that specs
 * are decoded from the store. */
static void reopen(struct fixture *f)
{
	store_close(f->st);
	assert_int_equal(open_store(f), 0);
}

/* A spec decoded from the store. */
static enum status_code op_model(struct fixture *f, long n)
{
	reopen(f);
	arm(n);
	struct k3cache_model *m = store_get_model(f->st, f->m->fingerprint, NULL);
	disarm();
	if (!m)
		return STATUS_INTERNAL;
	assert_memory_equal(m->fingerprint, f->m->fingerprint, MODEL_FINGERPRINT_LEN);
	model_free(m);
	return STATUS_OK;
}

/* A spec the store holds, put again: the stored one is read to compare, and
 * is not "repaired" for want of memory to read it. */
static enum status_code op_put_model_again(struct fixture *f, long n)
{
	reopen(f);
	struct status st;
	arm(n);
	enum status_code code = store_put_model(f->st, f->m, NULL, &st);
	disarm();
	struct store_stats stats;
	assert_int_equal(store_get_stats(f->st, &stats, &st), STATUS_OK);
	assert_int_equal(stats.models_repaired, 0);
	return code;
}

static enum status_code evict(struct fixture *f, const struct store_evict_req *req, long n)
{
	struct store_evict_res res;
	struct status st;
	arm(n);
	enum status_code code = store_evict(f->st, req, NULL, NULL, &res, &st);
	disarm();
	return code;
}

static enum status_code op_evict_key(struct fixture *f, long n)
{
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])f->base_key,
	                              .n_keys = 1};
	return evict(f, &req, n);
}

static enum status_code op_evict_all(struct fixture *f, long n)
{
	struct store_evict_req req = {.all = 1};
	return evict(f, &req, n);
}

/* A dry run, with a use held in memory that it takes into the LRU order
 * without writing it. */
static enum status_code op_evict_dry(struct fixture *f, long n)
{
	store_touch(f->st, f->base_key, 1);
	struct store_evict_req req = {.to_bytes_set = 1, .to_bytes = 1, .dry_run = 1};
	return evict(f, &req, n);
}

static enum status_code op_verify(struct fixture *f, long n)
{
	uint64_t checked = 0, damaged = 0;
	struct status st;
	arm(n);
	enum status_code code = store_verify(f->st, NULL, NULL, &checked, &damaged, &st);
	disarm();
	/* running out of memory is not damage: nothing is quarantined for it */
	assert_int_equal(damaged, 0);
	return code;
}

static enum status_code op_stats(struct fixture *f, long n)
{
	struct store_stats s;
	struct status st;
	arm(n);
	enum status_code code = store_get_stats(f->st, &s, &st);
	disarm();
	if (code == STATUS_OK)
		assert_true(s.entries >= 2);
	return code;
}

/* Only an entry of 256 MiB or more is given up for want of memory (so that
 * the rest are saved); these are tiny: none is. */
static void count_lost(const uint8_t *key, const char *why, void *ctx)
{
	(void)key;
	fprintf(stderr, "salvage lost an entry: %s\n", why);
	++*(int *)ctx;
}

static enum status_code op_salvage(struct fixture *f, long n)
{
	char *to = storeutil_tmpdir();
	char path[300];
	snprintf(path, sizeof(path), "%s/new", to);
	int lost = 0;
	struct store_salvage_res res;
	struct status st;
	struct store_stats stats;
	assert_int_equal(store_get_stats(f->st, &stats, &st), STATUS_OK);
	arm(n);
	enum status_code code = store_salvage(f->dir, path, count_lost, &lost, &res, &st);
	disarm();
	if (code == STATUS_OK && (res.saved != stats.entries || lost))
		fail_msg("salvage: with allocation %ld failing, answered OK with %llu of %llu "
		         "entries "
		         "saved (%llu found, %d said lost, %llu problems: %s)",
		         n, (unsigned long long)res.saved, (unsigned long long)stats.entries,
		         (unsigned long long)res.entries, lost, (unsigned long long)res.problems,
		         res.first_problem);
	storeutil_rmdir(to);
	return code;
}

/* The client's check that a restore's destinations do not overlap. */
static enum status_code op_bufs_apart(struct fixture *f, long n)
{
	void *bufs[4];
	for (int i = 0; i < 4; i++)
		bufs[i] = malloc(model_layer_blob_size(&f->m->layers[i], P_SMALL));
	void *same[4] = {bufs[0], bufs[1], bufs[1], bufs[3]};
	struct k3cache_error err;
	arm(n);
	int rc = k3cache_bufs_apart(f->m, P_SMALL, bufs, &err);
	disarm();
	arm(n);
	int rc_same = k3cache_bufs_apart(f->m, P_SMALL, same, &err);
	disarm();
	for (int i = 0; i < 4; i++)
		free(bufs[i]);
	/* refused when two share memory, whatever failed: never let through for
	 * want of memory to check */
	assert_int_not_equal(rc_same, 0);
	return rc ? STATUS_INTERNAL : STATUS_OK;
}

/* The daemon's count of the restores each tenant streams: a tenant that
 * cannot be listed is not counted (its restore is refused), and the others'
 * counts stay. */
static enum status_code op_tenant_slots(struct fixture *f, long n)
{
	(void)f;
	struct k3d_slots slots = {0};
	enum status_code code = STATUS_OK;
	char ns[2] = {0};
	arm(n);
	for (int i = 0; i < 12; i++) {
		ns[0] = (char)('a' + i);
		uint32_t before = k3d_slots_held(&slots, ns, 1);
		if (k3d_slots_take(&slots, ns, 1) != 0) {
			assert_int_equal(k3d_slots_held(&slots, ns, 1), before);
			code = STATUS_INTERNAL;
		}
	}
	disarm();
	for (int i = 0; i < 12; i++) {
		ns[0] = (char)('a' + i);
		uint32_t held = k3d_slots_held(&slots, ns, 1);
		assert_true(held <= 1);
		if (held)
			k3d_slots_give(&slots, ns, 1);
		assert_int_equal(k3d_slots_held(&slots, ns, 1), 0);
	}
	k3d_slots_free(&slots);
	return code;
}

struct op {
	const char *name;
	enum status_code (*run)(struct fixture *f, long n);
	int mutates; /* the store is seeded again before each run */
};

static const struct op ops[] = {
        {"open", op_open, 0},
        {"open sharing the environment", op_open_shared, 0},
        {"publish", op_publish, 1},
        {"staged publish", op_publish_staged, 1},
        {"publish sharing blocks", op_publish_blocks, 1},
        {"delta publish", op_publish_delta, 1},
        {"lookup", op_lookup, 0},
        {"restore", op_restore, 0},
        {"deferred restore", op_restore_deferred, 0},
        {"list", op_list, 0},
        {"inspect", op_inspect, 0},
        {"put model", op_put_model, 1},
        {"model", op_model, 0},
        {"put model again", op_put_model_again, 0},
        {"evict key", op_evict_key, 1},
        {"evict all", op_evict_all, 1},
        {"evict --to-size --dry-run", op_evict_dry, 0},
        {"verify", op_verify, 0},
        {"stats", op_stats, 0},
        {"salvage", op_salvage, 0},
        {"bufs apart", op_bufs_apart, 0},
        {"tenant slots", op_tenant_slots, 0},
};

/* Counts verify's findings, and that nothing is quarantined. */
static void count_problem(const uint8_t *key, const char *why, void *ctx)
{
	(void)key;
	fprintf(stderr, "verify: %s\n", why);
	++*(int *)ctx;
}

static void expect_consistent(struct fixture *f, const struct op *op, long n)
{
	int problems = 0;
	uint64_t checked, damaged;
	struct status st;
	assert_int_equal(store_verify(f->st, count_problem, &problems, &checked, &damaged, &st),
	                 STATUS_OK);
	uint64_t held = storeutil_refs_held(f->st);
	if (problems || damaged || held)
		fail_msg("%s: with allocation %ld failing, verify finds %d problems, %llu damaged, "
		         "%llu references held",
		         op->name, n, problems, (unsigned long long)damaged,
		         (unsigned long long)held);
	/* and it still works */
	uint32_t t[P_SMALL];
	toks(t, P_SMALL, 100000u * ++f->next);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, P_SMALL, f->next, &res), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, P_SMALL, P_SMALL, NULL), P_SMALL);
	/* and is left as it was, so that the next run makes the same calls */
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])res.key,
	                              .n_keys = 1};
	struct store_evict_res evicted;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &evicted, NULL), STATUS_OK);
}

#define MAX_ALLOCS 2000

static void sweep(struct fixture *f, const struct op *op)
{
	long n;
	int refused = 0;
	for (n = 1; n < MAX_ALLOCS; n++) {
		if (!f->st || op->mutates || n == 1) {
			if (f->st)
				unseed(f);
			seed(f);
		}
		enum status_code code = op->run(f, n);
		disarm();
		long failed = allocfail_hits();
		if (code != STATUS_OK && !failed)
			fail_msg("%s: failed (code %d) with allocation %ld failing, which it never "
			         "made",
			         op->name, (int)code, n);
		/* running out of memory says nothing of the store or the input:
		 * calling it damage would quarantine entries, or send an operator
		 * to salvage; calling it invalid would blame the worker */
		if (code != STATUS_OK && code != STATUS_INTERNAL)
			fail_msg("%s: with allocation %ld failing, answered %s, not INTERNAL",
			         op->name, n, status_code_name(code));
		refused += code != STATUS_OK;
		expect_consistent(f, op, n);
		if (!failed)
			break;
	}
	printf("%s: %ld allocations, %d refused for them\n", op->name, n - 1, refused);
	assert_true(n < MAX_ALLOCS); /* a run without a fault was checked */
}

static void test_out_of_memory_is_an_error(void **state)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		sweep(*state, &ops[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_out_of_memory_is_an_error, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
