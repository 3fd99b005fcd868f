/* The LMDB store: publish, exact longest-prefix lookup, restore, eviction,
 * capacity, persistence, corruption. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <grp.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checksum.h"
#include "hashwrap.h"
#include "prefix.h"
#include "store/blocks.h"
#include "store/chunks.h" /* STORE_CHUNK_DATA */
#include "store/envshare.h"
#include "store/lru.h" /* store_touch */
#include "store/record.h"
#include "storeutil.h"
#include "xxh_dispatch.h"

struct fixture {
	char *dir;
	struct store *st;
	struct k3cache_model *m;
	struct k3cache_model *m2;
};

static uint64_t fake_now = 1000000;
static uint64_t fake_clock(void)
{
	return fake_now;
}

/* The stage size of the stores open_store() opens (0: the default). The
 * shared-block tests run twice: with every snapshot in one transaction, and
 * with every one staged, its blocks placed a few at a time. */
static uint64_t test_stage_bytes;

static int open_store(struct fixture *f, uint64_t max_bytes, uint64_t map_size)
{
	struct store_options o = {.max_bytes = max_bytes,
	                          .map_size = map_size,
	                          .durability = STORE_FAST,
	                          .stage_bytes = test_stage_bytes,
	                          .clock = fake_clock};
	struct status s;
	if (store_open(f->dir, &o, &f->st, &s) != STATUS_OK) {
		fprintf(stderr, "open: %s\n", s.message);
		return -1;
	}
	return 0;
}

static int setup(void **state)
{
	test_stage_bytes = 0;
	struct fixture *f = calloc(1, sizeof(*f));
	f->dir = storeutil_tmpdir();
	f->m = storeutil_model("test-a", 16);
	f->m2 = storeutil_model("test-b", 16);
	if (open_store(f, 0, 0))
		return -1;
	store_put_model(f->st, f->m, NULL, NULL);
	store_put_model(f->st, f->m2, NULL, NULL);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	store_close(f->st);
	model_free(f->m);
	model_free(f->m2);
	storeutil_rmdir(f->dir);
	free(f);
	return 0;
}

static void seq(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

/* ---- publish / restore ---------------------------------------------------- */

static void test_publish_restore_identical(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 100);
	struct storeutil_snap s = storeutil_snap(f->m, 40, 7);
	struct store_publish_req req = {f->m->fingerprint, "", 0, t, 40, s.blobs, s.n};
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	assert_true(res.created);
	uint8_t want[32];
	prefix_key(f->m->fingerprint, "", 0, t, 40, want);
	assert_memory_equal(res.key, want, 32);

	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	assert_int_equal(snap->prefix_len, 40);
	assert_int_equal(snap->n_layers, 4);
	for (uint32_t i = 0; i < 4; i++) {
		const struct store_layer *l = &snap->layers[i];
		assert_int_equal(l->size, s.blobs[i].size);
		assert_int_equal(l->xxh3, s.blobs[i].xxh3);
		size_t off = 0;
		for (uint32_t j = 0; j < l->n_segments; j++) {
			assert_memory_equal(l->segments[j].data, s.bufs[i] + off,
			                    l->segments[j].len);
			off += l->segments[j].len;
		}
		assert_int_equal(off, l->size);
	}
	store_snapshot_release(snap);

	/* the same key again stores nothing */
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	assert_false(res.created);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.publishes, 1);
	assert_int_equal(stats.publish_exists, 1);
	storeutil_snap_free(&s);
}

/* Asserts that every layer of snap is byte-identical to the published one;
 * returns the number of segments. */
static uint32_t expect_same_layers(const struct store_snapshot *snap,
                                   const struct storeutil_snap *s)
{
	uint32_t total_segments = 0;
	assert_int_equal(snap->n_layers, s->n);
	for (uint32_t i = 0; i < s->n; i++) {
		size_t off = 0;
		assert_int_equal(snap->layers[i].xxh3, s->blobs[i].xxh3);
		for (uint32_t j = 0; j < snap->layers[i].n_segments; j++) {
			assert_memory_equal(snap->layers[i].segments[j].data, s->bufs[i] + off,
			                    snap->layers[i].segments[j].len);
			off += snap->layers[i].segments[j].len;
		}
		assert_int_equal(off, s->blobs[i].size);
		total_segments += snap->layers[i].n_segments;
	}
	return total_segments;
}

/* Multi-chunk entries: layers cross chunk boundaries and come back whole. */
/* A chunk written with the sum its caller computed keeps that sum (the
 * staged scan's, for a chunk it copied aside): intact when it is the bytes'
 * XXH3, damaged when it is not. */
static void test_chunk_put_keeps_a_given_sum(void **state)
{
	struct fixture *f = *state;
	uint8_t key[STORE_KEY_LEN] = {7};
	const char data[] = "rows of a chunk copied aside";
	uint64_t good = XXH3_64bits_withSeed(data, sizeof(data), 3), bad = good ^ 1;
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	assert_int_equal(store_chunks_put(f->st, txn, key, 3, data, sizeof(data), &good), 0);
	assert_int_equal(store_chunks_put(f->st, txn, key, 4, data, sizeof(data), &bad), 0);
	MDB_val v;
	assert_int_equal(store_chunks_get(f->st, txn, key, 3, &v), 0);
	assert_int_equal(v.mv_size, sizeof(data) + 8);
	assert_memory_equal((const char *)v.mv_data + 8, data, sizeof(data));
	assert_true(store_chunks_intact(&v, 3));
	assert_int_equal(store_chunks_get(f->st, txn, key, 4, &v), 0);
	assert_false(store_chunks_intact(&v, 4));
	mdb_txn_abort(txn);
}

static void test_large_entry_spans_chunks(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *big = storeutil_model("big", 700000); /* 2.8 MB per KDA layer */
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 5);
	struct storeutil_snap s = storeutil_snap(big, 20, 3);
	struct store_publish_req req = {big->fingerprint, "", 0, t, 20, s.blobs, s.n};
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	assert_true(expect_same_layers(snap, &s) > 4);
	store_snapshot_release(snap);
	storeutil_snap_free(&s);
	model_free(big);
}

/* ---- staged publish (store_staged.c) ------------------------------------ */

static int reopen_staged(struct fixture *f, uint64_t max_bytes)
{
	store_close(f->st);
	struct store_options o = {.max_bytes = max_bytes,
	                          .durability = STORE_SAFE,
	                          .stage_bytes = 256u << 10,
	                          .clock = fake_clock};
	struct status s;
	if (store_open(f->dir, &o, &f->st, &s) != STATUS_OK) {
		fprintf(stderr, "open: %s\n", s.message);
		return -1;
	}
	return 0;
}

static uint64_t chunks_of(uint64_t bytes)
{
	return (bytes + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA;
}

/* An entry larger than the stage size goes in over several transactions and
 * comes back byte-identical; nothing of its staging is left behind. */
static void test_staged_publish_restores_identical(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *big = storeutil_model("big", 700000); /* ~8.4 MB entries */
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 5);
	struct storeutil_snap s = storeutil_snap(big, 20, 3);
	struct store_publish_req req = {big->fingerprint, "", 0, t, 20, s.blobs, s.n};
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	assert_true(res.created);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &s);
	store_snapshot_release(snap);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.bytes, res.bytes);
	assert_true(stats.chunks > 8);
	assert_int_equal(stats.chunks, chunks_of(res.bytes));
	assert_int_equal(stats.staging, 0);

	/* it is found by lookup like any entry, and a second publish stores nothing */
	uint32_t prompt[21];
	seq(prompt, 21, 5);
	struct store_lookup_req lq = {big->fingerprint, "", 0, prompt, 21, 0, 0};
	struct store_lookup_res lr;
	assert_int_equal(store_lookup(f->st, &lq, &lr, &st), STATUS_OK);
	assert_int_equal(lr.prefix_len, 20);
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	assert_false(res.created);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.chunks, chunks_of(res.bytes));
	assert_int_equal(stats.publish_exists, 1);
	storeutil_snap_free(&s);
	model_free(big);
}

/* A layer found bad while the stages are being written (a NaN deep in the
 * last layer, a wrong checksum) stores nothing: no entry, no chunk. */
static void test_staged_invalid_stores_nothing(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 5);
	struct storeutil_snap s = storeutil_snap(big, 20, 3);
	struct store_publish_req req = {big->fingerprint, "", 0, t, 20, s.blobs, s.n};
	struct store_publish_res res;
	struct status st;

	/* a NaN near the end of the last layer */
	float nan = __builtin_nanf("");
	uint64_t last = s.blobs[3].size;
	unsigned char saved[4];
	memcpy(saved, s.bufs[3] + last - 8, 4);
	memcpy(s.bufs[3] + last - 8, &nan, 4);
	s.blobs[3].xxh3 = 0;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_INVALID);
	if (!strstr(st.message, "layer 3"))
		fail_msg("message \"%s\" does not name layer 3", st.message);
	memcpy(s.bufs[3] + last - 8, saved, 4);

	/* a checksum that does not match the bytes */
	s.blobs[2].xxh3 ^= 1;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_INVALID);
	if (!strstr(st.message, "checksum"))
		fail_msg("message \"%s\" lacks \"checksum\"", st.message);

	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 0);
	assert_int_equal(stats.bytes, 0);
	assert_int_equal(stats.chunks, 0);
	assert_int_equal(stats.staging, 0);
	assert_int_equal(stats.publishes, 0);

	/* and the same snapshot, whole, then goes in */
	s.blobs[2].xxh3 ^= 1;
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_OK);
	assert_true(res.created);
	storeutil_snap_free(&s);
	model_free(big);
}

/* Staged publishes past the capacity evict the least recently used first. */
static void test_staged_capacity_evicts(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 20u << 20), 0); /* room for two */
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint8_t keys[4][STORE_KEY_LEN];
	for (uint32_t k = 0; k < 4; k++) {
		uint32_t t[20];
		seq(t, 20, 1000 * k);
		struct store_publish_res res;
		assert_int_equal(storeutil_publish(f->st, big, "", t, 20, k, &res), STATUS_OK);
		memcpy(keys[k], res.key, STORE_KEY_LEN);
		fake_now++;
	}
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 2);
	assert_true(stats.bytes <= (20u << 20));
	assert_int_equal(stats.evictions, 2);
	struct store_snapshot *snap;
	struct status st;
	assert_int_equal(store_restore(f->st, keys[0], &snap, &st), STATUS_NOT_FOUND);
	assert_int_equal(store_restore(f->st, keys[3], &snap, &st), STATUS_OK);
	store_snapshot_release(snap);
	model_free(big);
}

/* Publishing an entry that exists already, at capacity, evicts nothing: the
 * staged publish makes room stage by stage, not before it knows. */
static void test_staged_existing_evicts_nothing(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 20u << 20), 0); /* room for two */
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t a[20], b[20];
	seq(a, 20, 100);
	seq(b, 20, 200);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, big, "", a, 20, 1, &res), STATUS_OK);
	assert_int_equal(storeutil_publish(f->st, big, "", b, 20, 2, &res), STATUS_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(storeutil_publish(f->st, big, "", a, 20, 1, &res), STATUS_OK);
		assert_false(res.created);
		assert_int_equal(res.evicted, 0);
	}
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 2);
	assert_int_equal(stats.evictions, 0);
	assert_int_equal(stats.publish_exists, 3);
	model_free(big);
}

/* A pending row left by this very process (its cleanup failed, say) is not
 * taken for a publish in progress: the next publish of the key replaces it. */
static void test_own_dead_pending_row_is_replaced(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 300);
	uint8_t key[32];
	prefix_key(big->fingerprint, "", 0, t, 20, key);
	/* this process's identity, as store_staged.c writes it */
	char buf[1024];
	FILE *fp = fopen("/proc/self/stat", "r");
	assert_non_null(fp);
	size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	const char *q = strrchr(buf, ')');
	for (int field = 2; *q && field < 22; q++)
		if (*q == ' ')
			field++;
	unsigned long long start = strtoull(q, NULL, 10);
	unsigned char row[28] = {0};
	uint32_t pid = (uint32_t)getpid();
	for (int i = 0; i < 4; i++)
		row[i] = (unsigned char)(pid >> (24 - 8 * i));
	for (int i = 0; i < 8; i++)
		row[4 + i] = (unsigned char)(start >> (56 - 8 * i));
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_val k = {32, key}, v = {sizeof(row), row};
	assert_int_equal(mdb_put(txn, f->st->pending, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.staging, 1);

	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, big, "", t, 20, 4, &res), STATUS_OK);
	assert_true(res.created);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.staging, 0);
	model_free(big);
}

/* Gives staged publish g all of sn's bytes, runs it to its end, and
 * expects the entry created and restored byte for byte; frees sn. */
static void finish_staged(struct fixture *f, struct store_stage *g, struct storeutil_snap *sn)
{
	struct store_publish_res res;
	struct status st;
	store_stage_arrived(g, UINT64_MAX);
	int step;
	while ((step = store_stage_step(g, 0)) == STORE_STAGE_WAIT || step == STORE_STAGE_MORE)
		if (step == STORE_STAGE_WAIT)
			store_stage_wait(g);
	assert_int_equal(step, STORE_STAGE_READY);
	assert_int_equal(store_stage_end(g, &res, &st), STATUS_OK);
	assert_true(res.created);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, sn);
	store_snapshot_release(snap);
	storeutil_snap_free(sn);
}

/* A staged publish of a key in progress is this process's own, whatever
 * /proc says: a daemon out of file descriptors cannot read /proc/PID/stat,
 * and must still answer a second publish of the key BUSY rather than take
 * the first one's pending row for a dead writer's and delete its chunks. */
static void test_own_live_pending_row_without_proc(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 450);
	struct storeutil_snap sn = storeutil_snap(big, 20, 6);
	struct store_publish_req req = {big->fingerprint, "", 0, t, 20, sn.blobs, sn.n};
	struct store_publish_res res, res2;
	struct status st, st2;
	struct store_stage *g = NULL, *g2 = NULL;
	/* no descriptor left (fopen("/proc/self/stat") fails with EMFILE) from
	 * before the first publish begins: its row says no start time */
	struct rlimit was;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
	int fds[64], n = 0;
	int low = dup(0);
	assert_true(low >= 0);
	close(low);
	struct rlimit few = {(rlim_t)low + 16, was.rlim_max};
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &few), 0);
	for (int fd; n < 64 && (fd = dup(0)) >= 0;)
		fds[n++] = fd;
	enum status_code first = store_stage_begin(f->st, &req, 0, NULL, NULL, &g, &res, &st);
	enum status_code code = store_stage_begin(f->st, &req, 0, NULL, NULL, &g2, &res2, &st2);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
	if (g2) { /* the bug: end it, so that the store is left whole */
		store_stage_cancel(g2);
		(void)store_stage_end(g2, &res2, &st2);
	}
	assert_int_equal(first, STATUS_OK);
	assert_non_null(g);
	assert_int_equal(code, STATUS_BUSY);
	assert_null(g2);
	finish_staged(f, g, &sn);
	model_free(big);
}

/* While a staged publish of a key is in progress, a one-transaction publish
 * of the same key (another writer with another stage size) is told BUSY and
 * writes no chunk over the staged ones. */
static void test_one_commit_publish_waits_for_staged_key(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *big = storeutil_model("big", 700000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 400);
	struct storeutil_snap sn = storeutil_snap(big, 20, 5);
	struct store_publish_req req = {big->fingerprint, "", 0, t, 20, sn.blobs, sn.n};
	struct store_publish_res res;
	struct status st;
	struct store_stage *g;
	assert_int_equal(store_stage_begin(f->st, &req, 0, NULL, NULL, &g, &res, &st), STATUS_OK);
	assert_non_null(g);
	f->st->opt.stage_bytes = UINT64_MAX; /* the next publish takes one commit */
	assert_int_equal(store_publish(f->st, &req, &res, &st), STATUS_BUSY);
	f->st->opt.stage_bytes = 256u << 10;
	finish_staged(f, g, &sn);
	model_free(big);
}

/* A model whose MLA layer's k rows alone outgrow a window of three 1 MiB
 * stages: KDA, KDA, MLA (k_row 2048, v_row 256), KDA. */
static struct k3cache_model *wide_model(void)
{
	const struct model_layer layers[] = {
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 700000},
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 700000},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 2048, .v_row = 256},
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 700000},
	};
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_new("wide", "test", "test-layout", layers, 4, err);
	assert_non_null(m);
	return m;
}

/* The store reopened with 256 KiB stages and the wide model in it. */
static struct k3cache_model *wide_store(struct fixture *f)
{
	assert_int_equal(reopen_staged(f, 0), 0);
	struct k3cache_model *m = wide_model();
	assert_int_equal(store_put_model(f->st, m, NULL, NULL), STATUS_OK);
	return m;
}

/* Feeds a payload of `total` bytes (src) through a moving window, as
 * k3cached does: its bytes arrive in pieces into a buffer of their own,
 * never more than `window` bytes past what the store consumed; every page
 * consumed is made unreadable at once (as the daemon's window hands its
 * stages back) and the rest of a consumed page scribbled over. Bytes not
 * yet arrived are 0xff (a NaN): a read too early or too late shows. After
 * a failure the rest still arrives, as a client's upload goes on. req's
 * blobs point into src; with a base, req is a delta (rows from base_rows
 * on), assembled before any byte arrives. Returns what end() returns (or
 * the assembly's code, *refused set). */
static enum status_code window_run(struct store *st, const struct store_publish_req *req,
                                   const unsigned char *src, uint64_t total, uint64_t window,
                                   const uint8_t *base, uint32_t base_rows,
                                   struct store_publish_res *res, int *refused, struct status *err)
{
	const uint64_t pg = 4096;
	size_t maplen = (size_t)((total ? total : 1) + pg - 1) / pg * pg;
	unsigned char *buf =
	        mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(buf != MAP_FAILED);
	memset(buf, 0xff, total);
	struct store_blob *blobs = calloc(req->n_blobs ? req->n_blobs : 1, sizeof(*blobs));
	assert_non_null(blobs);
	for (uint32_t i = 0; i < req->n_blobs; i++) {
		blobs[i] = req->blobs[i];
		blobs[i].data = buf + ((const unsigned char *)req->blobs[i].data - src);
	}
	struct store_publish_req r = *req;
	r.blobs = blobs;
	struct store_delta a;
	memset(&a, 0, sizeof(a));
	*refused = 0;
	enum status_code code = STATUS_OK;
	if (base) {
		code = store_delta_assemble_unread(st, &r, base, base_rows, &a, refused, err);
		if (code != STATUS_OK)
			goto out;
		r.blobs = a.blobs;
	}
	struct store_stage *g;
	code = store_stage_begin(st, &r, window, NULL, NULL, &g, res, err);
	assert_int_equal(code, STATUS_OK);
	assert_non_null(g);
	uint64_t got = 0, gone = 0, shut = 0, piece = 77777; /* shut: pages unreadable */
	int idle = 0, step = STORE_STAGE_WAIT;
	while (got < total || (step != STORE_STAGE_READY && step != STORE_STAGE_FAILED)) {
		uint64_t consumed = store_stage_consumed(g);
		if (consumed == UINT64_MAX)
			consumed = got; /* nothing more is read: the rest may be dropped */
		assert_true(consumed <= got);
		if (consumed > gone) { /* the window moved: those bytes are gone */
			memset(buf + gone, 0xaa, (size_t)(consumed - gone));
			uint64_t to = consumed / pg * pg;
			if (to > shut)
				assert_int_equal(
				        mprotect(buf + shut, (size_t)(to - shut), PROT_NONE), 0);
			shut = to > shut ? to : shut;
			gone = consumed;
		}
		uint64_t room = gone + window > got ? gone + window - got : 0;
		if (room > total - got)
			room = total - got;
		if (room > piece)
			room = piece;
		piece = piece * 7 % 300007 + 4096;
		if (room) {
			memcpy(buf + got, src + got, room);
			got += room;
			store_stage_arrived(g, got);
		}
		if (step != STORE_STAGE_READY && step != STORE_STAGE_FAILED)
			step = store_stage_step(g, 1);
		if ((step == STORE_STAGE_WAIT || step == STORE_STAGE_FAILED) && !room) {
			/* the window is full: the scan must move it */
			usleep(2000);
			if (++idle > 5000)
				fail_msg("the window never moved: %llu arrived, %llu consumed",
				         (unsigned long long)got, (unsigned long long)gone);
		} else {
			idle = 0;
		}
	}
	code = store_stage_end(g, res, err);
out:
	store_delta_free(&a);
	munmap(buf, maplen);
	free(blobs);
	return code;
}

/* Publishes sn whole through a moving window (window_run). */
static enum status_code window_publish(struct store *st, const struct k3cache_model *m,
                                       const uint32_t *t, uint32_t p,
                                       const struct storeutil_snap *sn, uint64_t window,
                                       struct store_publish_res *res, struct status *err)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < sn->n; i++)
		total += sn->blobs[i].size;
	unsigned char *src = malloc(total ? total : 1);
	assert_non_null(src);
	struct store_blob *blobs = calloc(sn->n ? sn->n : 1, sizeof(*blobs));
	uint64_t off = 0;
	for (uint32_t i = 0; i < sn->n; i++) {
		memcpy(src + off, sn->bufs[i], sn->blobs[i].size);
		blobs[i] =
		        (struct store_blob){src + off, sn->blobs[i].size, sn->blobs[i].xxh3, NULL};
		off += sn->blobs[i].size;
	}
	struct store_publish_req req = {m->fingerprint, "", 0, t, p, blobs, sn->n};
	int refused;
	enum status_code code =
	        window_run(st, &req, src, total, window, NULL, 0, res, &refused, err);
	free(blobs);
	free(src);
	return code;
}

/* Publishes sn as a delta of base from row r through a moving window: the
 * payload is its KDA layers whole and, of each MLA layer, rows [r, p) (k
 * rows, then v rows), each MLA layer with the whole blob's sum. */
static enum status_code window_delta(struct store *st, const struct k3cache_model *m,
                                     const uint32_t *t, uint32_t p, const struct storeutil_snap *sn,
                                     const uint8_t *base, uint32_t r, uint64_t window,
                                     struct store_publish_res *res, int *refused,
                                     struct status *err)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < sn->n; i++) {
		const struct model_layer *l = &m->layers[i];
		total += l->mixer == MODEL_MIXER_MLA
		                 ? (uint64_t)(p - r) * ((uint64_t)l->k_row + l->v_row) * 4
		                 : sn->blobs[i].size;
	}
	unsigned char *src = malloc(total ? total : 1);
	assert_non_null(src);
	struct store_blob *blobs = calloc(sn->n ? sn->n : 1, sizeof(*blobs));
	uint64_t off = 0;
	for (uint32_t i = 0; i < sn->n; i++) {
		const struct model_layer *l = &m->layers[i];
		const unsigned char *w = sn->bufs[i];
		uint64_t size = sn->blobs[i].size;
		if (l->mixer == MODEL_MIXER_MLA) {
			size_t kb = (size_t)l->k_row * 4, vb = (size_t)l->v_row * 4;
			memcpy(src + off, w + 9 + (size_t)r * kb, (size_t)(p - r) * kb);
			memcpy(src + off + (size_t)(p - r) * kb,
			       w + 13 + (size_t)p * kb + (size_t)r * vb, (size_t)(p - r) * vb);
			size = (uint64_t)(p - r) * (kb + vb);
		} else {
			memcpy(src + off, w, size);
		}
		blobs[i] = (struct store_blob){src + off, size, sn->blobs[i].xxh3, NULL};
		off += size;
	}
	struct store_publish_req req = {m->fingerprint, "", 0, t, p, blobs, sn->n};
	enum status_code code =
	        window_run(st, &req, src, total, window, base, r, res, refused, err);
	free(blobs);
	free(src);
	return code;
}

/* A staged publish through a window of three 1 MiB stages, smaller than
 * one of its MLA layer's k rows: each byte is read only while it is in the
 * window, and the entry comes back byte for byte. */
static void test_window_publish_reads_each_byte_in_its_window(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = wide_store(f);
	uint32_t t[700];
	seq(t, 700, 900);
	struct storeutil_snap sn = storeutil_conv_snap(m, 650, 1, 3); /* 10 blocks and a tail */
	struct store_publish_res res;
	struct status st;
	assert_int_equal(window_publish(f->st, m, t, 650, &sn, 3u << 20, &res, &st), STATUS_OK);
	assert_true(res.created);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &sn);
	store_snapshot_release(snap);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 650 / STORE_DEFAULT_ROW_BLOCK);
	assert_int_equal(stats.staging, 0);

	/* a longer turn shares the blocks; one block's v rows differ from the
	 * stored ones (its k rows do not): that block alone is kept privately */
	struct storeutil_snap sn2 = storeutil_conv_snap(m, 700, 1, 4);
	struct blob_view v;
	assert_int_equal(blob_parse(sn2.bufs[2], sn2.blobs[2].size, &v, NULL), BLOB_OK);
	float x = 123.5f;
	memcpy(sn2.bufs[2] + (v.v1.data - sn2.bufs[2]) + (size_t)3 * 256 * 4, &x, 4); /* row 3 */
	sn2.blobs[2].xxh3 = checksum_blob(sn2.bufs[2], sn2.blobs[2].size, 2);
	struct store_publish_res res2;
	assert_int_equal(window_publish(f->st, m, t, 700, &sn2, 3u << 20, &res2, &st), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks_mismatched, 1);
	assert_int_equal(stats.blocks, 650 / STORE_DEFAULT_ROW_BLOCK);
	assert_int_equal(store_restore(f->st, res2.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &sn2);
	store_snapshot_release(snap);
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &sn);
	store_snapshot_release(snap);
	/* and after a restart */
	assert_int_equal(reopen_staged(f, 0), 0);
	assert_int_equal(store_restore(f->st, res2.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &sn2);
	store_snapshot_release(snap);
	storeutil_snap_free(&sn2);
	storeutil_snap_free(&sn);
	model_free(m);
}

/* A NaN in the last layer, found after most of the entry was written
 * through the window: refused with the layer named, and nothing stays. */
static void test_window_publish_bad_last_layer_stores_nothing(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = wide_store(f);
	uint32_t t[650];
	seq(t, 650, 900);
	struct storeutil_snap sn = storeutil_conv_snap(m, 650, 1, 3);
	uint32_t nan = 0x7fc00000u;
	memcpy(sn.bufs[3] + sn.blobs[3].size - 8, &nan, 4);
	sn.blobs[3].xxh3 = 0;
	struct store_publish_res res;
	struct status st;
	assert_int_equal(window_publish(f->st, m, t, 650, &sn, 3u << 20, &res, &st),
	                 STATUS_INVALID);
	if (!strstr(st.message, "layer 3: KDA recurrent[699998] is NaN"))
		fail_msg("message: %s", st.message);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 0);
	assert_int_equal(stats.bytes, 0);
	assert_int_equal(stats.blocks, 0);
	assert_int_equal(stats.staging, 0);
	storeutil_snap_free(&sn);
	model_free(m);
}

static void expect_rejected(struct fixture *f, struct store_publish_req *req, enum status_code code,
                            const char *part)
{
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_publish(f->st, req, &res, &st), code);
	if (!strstr(st.message, part))
		fail_msg("message \"%s\" lacks \"%s\"", st.message, part);
}

static void test_publish_rejects_bad_input(void **state)
{
	struct fixture *f = *state;
	uint32_t t[8];
	seq(t, 8, 1);
	struct storeutil_snap s = storeutil_snap(f->m, 8, 1);
	struct store_publish_req req = {f->m->fingerprint, "", 0, t, 8, s.blobs, s.n};

	req.n_blobs = 3;
	expect_rejected(f, &req, STATUS_INVALID, "3 layers");
	req.n_blobs = 4;

	/* C4: a KDA blob in the MLA slot */
	struct store_blob swapped[4] = {s.blobs[0], s.blobs[1], s.blobs[0], s.blobs[3]};
	swapped[2].xxh3 = 0;
	req.blobs = swapped;
	expect_rejected(f, &req, STATUS_INVALID, "layer 2: model says MLA, blob is KDA");
	/* two same-shape KDA layers swapped: caught by the checksum bound to the slot */
	struct store_blob kswap[4] = {s.blobs[1], s.blobs[0], s.blobs[2], s.blobs[3]};
	req.blobs = kswap;
	expect_rejected(f, &req, STATUS_INVALID, "layer 0: checksum mismatch");
	req.blobs = s.blobs;

	/* seq_len != P */
	req.n_tokens = 7;
	expect_rejected(f, &req, STATUS_INVALID, "(seq_len)");
	req.n_tokens = 8;

	/* NaN */
	unsigned char *b = s.bufs[1];
	unsigned char save[4];
	memcpy(save, b + s.blobs[1].size - 4, 4);
	uint32_t nan = 0x7fc00000u;
	memcpy(b + s.blobs[1].size - 4, &nan, 4);
	uint64_t sum = s.blobs[1].xxh3;
	s.blobs[1].xxh3 = 0;
	expect_rejected(f, &req, STATUS_INVALID, "(nonfinite)");
	memcpy(b + s.blobs[1].size - 4, save, 4);
	s.blobs[1].xxh3 = sum;

	/* truncated blob */
	s.blobs[3].size -= 1;
	expect_rejected(f, &req, STATUS_INVALID, "(truncated)");
	s.blobs[3].size += 1;

	req.n_tokens = 0;
	expect_rejected(f, &req, STATUS_INVALID, "P >= 1");
	req.n_tokens = 8;

	uint8_t unknown[32] = {9};
	req.fingerprint = unknown;
	expect_rejected(f, &req, STATUS_UNKNOWN_MODEL, "unknown model");

	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 0);
	assert_int_equal(stats.bytes, 0);
	storeutil_snap_free(&s);
}

/* ---- lookup semantics ----------------------------------------------------- */

static void test_default_limit_leaves_one_token(void **state)
{
	struct fixture *f = *state;
	uint32_t t[20];
	seq(t, 20, 1);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 20, 1, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 20, 0, NULL), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 20, 20, NULL), 20);
	/* one more token and the default limit reaches it */
	uint32_t u[21];
	seq(u, 21, 1);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", u, 21, 0, NULL), 20);
	/* a limit below P rules it out */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", u, 21, 19, NULL), 0);
}

static void test_divergence(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 1);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 40, 1, NULL), STATUS_OK);
	uint32_t p[50];
	seq(p, 50, 1);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 50, 0, NULL), 40);
	p[0] = 999; /* first token */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 50, 0, NULL), 0);
	p[0] = 1;
	p[39] = 999; /* last token of the stored prefix */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 50, 0, NULL), 0);
	p[39] = 40;
	p[20] = 999; /* middle */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 50, 0, NULL), 0);
	p[20] = 21;
	p[45] = 999; /* after the prefix: still a hit */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 50, 0, NULL), 40);
}

static void test_shorter_prompt_misses(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 1);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 40, 1, NULL), STATUS_OK);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 33, 1, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 30, 30, NULL), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 3, 0, NULL), 0);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.misses, 2);
}

static void test_longest_wins_and_hint(void **state)
{
	struct fixture *f = *state;
	uint32_t t[100];
	seq(t, 100, 1);
	static const uint32_t lens[] = {5, 16, 20, 37, 64, 70};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		assert_int_equal(storeutil_publish(f->st, f->m, "", t, lens[i], (uint32_t)i, NULL),
		                 STATUS_OK);
	struct store_lookup_res res;
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 100, 0, &res), 70);
	uint8_t want[32];
	prefix_key(f->m->fingerprint, "", 0, t, 70, want);
	assert_memory_equal(res.key, want, 32);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 69, 0, NULL), 64);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 64, 0, NULL), 37);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 37, 0, NULL), 20);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 17, 0, NULL), 16);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 16, 0, NULL), 5);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 100, 6, NULL), 5);
	/* the junction: a prompt that follows the stored path for 50 tokens, then
	 * leaves it, gets the block boundary 48 as its hint */
	uint32_t p[90];
	seq(p, 90, 1);
	p[50] = 7777;
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 90, 0, &res), 37);
	assert_int_equal(res.hint, 48);
	/* a prompt along the whole path: the hint is the deepest stored block */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 100, 0, &res), 70);
	assert_int_equal(res.hint, 64);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.hit_tokens, 70 + 64 + 37 + 20 + 16 + 5 + 5 + 37 + 70);
}

static void test_salts_and_models_never_cross(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 1);
	assert_int_equal(storeutil_publish(f->st, f->m, "tenant-a", t, 30, 1, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "tenant-a", t, 40, 0, NULL), 30);
	assert_int_equal(storeutil_lookup(f->st, f->m, "tenant-b", t, 40, 0, NULL), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 40, 0, NULL), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m2, "tenant-a", t, 40, 0, NULL), 0);
	assert_int_equal(storeutil_publish(f->st, f->m2, "tenant-a", t, 20, 1, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m2, "tenant-a", t, 40, 0, NULL), 20);
	assert_int_equal(storeutil_lookup(f->st, f->m, "tenant-a", t, 40, 0, NULL), 30);
}

static int next_rand(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return (int)(*x & 0x7fffffff);
}

/* With node hashes cut to a few bits, every path collides with every other;
 * token comparison must still keep every answer exact. */
static void check_collisions(struct fixture *f, unsigned bits)
{
	hashwrap_truncate(bits);
	uint32_t base[64];
	seq(base, 64, 1);
	const char *salts[] = {"", "x"};
	for (uint32_t v = 0; v < 6; v++) {
		uint32_t t[64];
		memcpy(t, base, sizeof(t));
		t[10 + v * 8] = 5000 + v; /* variant v diverges at 10 + 8v */
		for (int si = 0; si < 2; si++)
			assert_int_equal(storeutil_publish(f->st, si ? f->m2 : f->m, salts[si], t,
			                                   20 + v * 7, v, NULL),
			                 STATUS_OK);
	}
	uint32_t rng = bits * 2654435761u + 1u;
	for (int q = 0; q < 300; q++) {
		uint32_t p[64];
		memcpy(p, base, sizeof(p));
		uint32_t v = (uint32_t)next_rand(&rng) % 7;
		if (v < 6)
			p[10 + v * 8] = 5000 + v;
		if (next_rand(&rng) % 2)
			p[next_rand(&rng) % 64] = 9000;
		int si = next_rand(&rng) % 2;
		struct k3cache_model *m = si ? f->m2 : f->m;
		struct store_lookup_res res;
		uint32_t got = storeutil_lookup(f->st, m, salts[si], p, 64, 0, &res);
		if (!got)
			continue;
		struct store_entry_info *info;
		assert_int_equal(store_inspect(f->st, res.key, &info, NULL), STATUS_OK);
		assert_int_equal(info->prefix_len, got);
		assert_memory_equal(info->tokens, p, (size_t)got * 4);
		assert_memory_equal(info->fingerprint, m->fingerprint, 32);
		assert_int_equal(info->salt_len, strlen(salts[si]));
		store_entry_info_free(info);
	}
	hashwrap_truncate(0);
}

static void test_forced_collisions_16_bits(void **state)
{
	check_collisions(*state, 16);
}

static void test_forced_collisions_2_bits(void **state)
{
	check_collisions(*state, 2);
}

/* ---- persistence ---------------------------------------------------------- */

static void test_reopen_keeps_everything(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 1);
	assert_int_equal(storeutil_publish(f->st, f->m, "s", t, 33, 1, NULL), STATUS_OK);
	store_close(f->st);
	assert_int_equal(open_store(f, 0, 0), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m, "s", t, 40, 0, NULL), 33);
	struct k3cache_model *back = store_get_model(f->st, f->m->fingerprint, NULL);
	assert_non_null(back);
	assert_string_equal(back->name, "test-a");
	model_free(back);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.models, 2);
}

/* A store this user may not read: DENIED, naming what lacks which access
 * (not INTERNAL). As root the check runs as nobody; else with the
 * directory's mode 0. */
static void test_open_denied_names_the_file(void **state)
{
	struct fixture *f = *state;
	int root = geteuid() == 0;
	if (!root)
		assert_int_equal(chmod(f->dir, 0), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (root && (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
			_exit(3);
		struct store *s = NULL;
		struct store_options o = {.read_only = 1, .check = STORE_CHECK_NEVER};
		struct status st;
		enum status_code code = store_open(f->dir, &o, &s, &st);
		int ok = code == STATUS_DENIED && strstr(st.message, f->dir) &&
		         strstr(st.message, "needs read and search access");
		if (!ok)
			fprintf(stderr, "store_open: %d: %s\n", code, st.message);
		_exit(ok ? 0 : 1);
	}
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!root)
		assert_int_equal(chmod(f->dir, 0700), 0);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* A path that is a file: said so, not "no such store directory" */
static void test_open_file_not_directory(void **state)
{
	struct fixture *f = *state;
	char path[600];
	snprintf(path, sizeof(path), "%s/data.mdb", f->dir);
	struct store *s = NULL;
	struct store_options o = {.read_only = 1, .check = STORE_CHECK_NEVER};
	struct status st;
	assert_int_equal(store_open(path, &o, &s, &st), STATUS_INVALID);
	assert_non_null(strstr(st.message, "not a directory"));
	snprintf(path, sizeof(path), "%s/nothing", f->dir);
	assert_int_equal(store_open(path, &o, &s, &st), STATUS_NOT_FOUND);
	assert_non_null(strstr(st.message, "no such store directory"));
}

struct lock_holder {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int held, release;
};

static void *hold_share_lock(void *arg)
{
	struct lock_holder *h = arg;
	store_envshare_lock();
	pthread_mutex_lock(&h->mu);
	h->held = 1;
	pthread_cond_broadcast(&h->cv);
	while (!h->release)
		pthread_cond_wait(&h->cv, &h->mu);
	pthread_mutex_unlock(&h->mu);
	store_envshare_unlock();
	return NULL;
}

struct opener {
	char dir[600];
	enum status_code code;
	atomic_int done;
};

static void *open_and_close(void *arg)
{
	struct opener *o = arg;
	struct store *s = NULL;
	struct store_options opt = {.read_only = 1, .check = STORE_CHECK_NEVER};
	struct status st;
	o->code = store_open(o->dir, &opt, &s, &st);
	store_close(s);
	atomic_store(&o->done, 1);
	return NULL;
}

/* An open that fails before it looks for a shared environment (no such
 * directory) leaves the table's lock (store/envshare.h) as it found it.
 * Before, it released the lock while another thread held it, so that two
 * opens could each make an environment of one store. Here the table is
 * held by a thread; a failing open and then a good one must both wait. */
static void test_failed_open_leaves_the_share_lock(void **state)
{
	struct fixture *f = *state;
	struct lock_holder h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
	pthread_t holder, bad, good;
	assert_int_equal(pthread_create(&holder, NULL, hold_share_lock, &h), 0);
	pthread_mutex_lock(&h.mu);
	while (!h.held)
		pthread_cond_wait(&h.cv, &h.mu);
	pthread_mutex_unlock(&h.mu);
	struct opener o1 = {.code = STATUS_OK}, o2 = {.code = STATUS_INTERNAL};
	snprintf(o1.dir, sizeof(o1.dir), "%s/nothing", f->dir);
	snprintf(o2.dir, sizeof(o2.dir), "%s", f->dir);
	assert_int_equal(pthread_create(&bad, NULL, open_and_close, &o1), 0);
	struct timespec pause = {0, 200 * 1000000L};
	nanosleep(&pause, NULL);
	assert_int_equal(pthread_create(&good, NULL, open_and_close, &o2), 0);
	nanosleep(&pause, NULL);
	int good_waited = !atomic_load(&o2.done);
	pthread_mutex_lock(&h.mu);
	h.release = 1;
	pthread_cond_broadcast(&h.cv);
	pthread_mutex_unlock(&h.mu);
	pthread_join(holder, NULL);
	pthread_join(bad, NULL);
	pthread_join(good, NULL);
	assert_true(good_waited);
	assert_int_equal(o1.code, STATUS_NOT_FOUND);
	assert_int_equal(o2.code, STATUS_OK);
}

static double open_seconds(const char *dir)
{
	struct timespec a, b;
	double best = 1e9;
	for (int i = 0; i < 5; i++) {
		clock_gettime(CLOCK_MONOTONIC, &a);
		struct store *st;
		struct store_options o = {.durability = STORE_FAST};
		assert_int_equal(store_open(dir, &o, &st, NULL), STATUS_OK);
		store_close(st);
		clock_gettime(CLOCK_MONOTONIC, &b);
		double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
		best = s < best ? s : best;
	}
	return best;
}

static void fill(struct store *st, const struct k3cache_model *m, uint32_t n)
{
	enum { BATCH = 250 };
	struct storeutil_snap s = storeutil_snap(m, 3, 1); /* MLA seq_len 3 */
	uint32_t(*toks)[3] = malloc(sizeof(*toks) * BATCH);
	struct store_publish_req reqs[BATCH];
	struct store_publish_res res[BATCH];
	for (uint32_t done = 0; done < n; done += BATCH) {
		for (uint32_t i = 0; i < BATCH; i++) {
			toks[i][0] = done + i;
			toks[i][1] = 1;
			toks[i][2] = 2;
			reqs[i] = (struct store_publish_req){m->fingerprint, "", 0, toks[i], 3,
			                                     s.blobs,        s.n};
		}
		assert_int_equal(store_publish_batch(st, reqs, res, NULL, BATCH), STATUS_OK);
	}
	free(toks);
	storeutil_snap_free(&s);
}

/* No index is rebuilt at open: 10,000 entries open as fast as 10. The bound
 * is loose on purpose (these machines are noisy); a scan of 10,000 records
 * would still exceed it. */
static void test_open_cost_flat(void **state)
{
	struct fixture *f = *state;
	char *small = storeutil_tmpdir();
	struct store *st;
	struct store_options o = {.durability = STORE_FAST};
	assert_int_equal(store_open(small, &o, &st, NULL), STATUS_OK);
	store_put_model(st, f->m, NULL, NULL);
	fill(st, f->m, 250);
	store_close(st);
	fill(f->st, f->m, 10000);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 10000);
	store_close(f->st);
	double t_small = open_seconds(small), t_big = open_seconds(f->dir);
	printf("open: 250 entries %.3f ms, 10000 entries %.3f ms\n", t_small * 1e3, t_big * 1e3);
	assert_true(t_big < t_small * 4 + 0.005);
	assert_int_equal(open_store(f, 0, 0), 0);
	storeutil_rmdir(small);
}

/* Writes the format record of a store no handle of this process has open
 * (lmdb.h: an environment is never open twice in one process). */
static void set_format_version(const char *dir, uint32_t version)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	unsigned char b[4];
	store_be32(b, version);
	MDB_val k = {6, "format"}, v = {4, b};
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
	assert_int_equal(mdb_env_open(env, dir, MDB_NOTLS, 0640), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* A store of another format version is refused, read-write and read-only,
 * with a message naming both versions, and left exactly as it was: opening
 * it again at the right version finds every entry. */
static void test_format_version_checked(void **state)
{
	struct fixture *f = *state;
	uint32_t t[20];
	seq(t, 20, 300);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 20, 1, NULL), STATUS_OK);
	store_close(f->st);
	f->st = NULL;
	const uint32_t others[] = {0, STORE_FORMAT_VERSION + 1, 99};
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
		set_format_version(f->dir, others[i]);
		char want[64];
		snprintf(want, sizeof(want), "store format version %u; this build reads version %u",
		         others[i], STORE_FORMAT_VERSION);
		struct status st;
		struct store *s2 = NULL;
		struct store_options rw = {.durability = STORE_FAST};
		assert_int_equal(store_open(f->dir, &rw, &s2, &st), STATUS_UNSUPPORTED);
		assert_null(s2);
		assert_non_null(strstr(st.message, want));
		struct store_options ro = {.read_only = 1};
		assert_int_equal(store_open(f->dir, &ro, &s2, &st), STATUS_UNSUPPORTED);
		assert_non_null(strstr(st.message, want));
	}
	set_format_version(f->dir, STORE_FORMAT_VERSION);
	assert_int_equal(open_store(f, 0, 0), 0);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
	uint32_t p[21];
	memcpy(p, t, sizeof(t));
	p[20] = 0;
	assert_int_equal(storeutil_lookup(f->st, f->m, "", p, 21, 0, NULL), 20);
}

/* ---- corruption ----------------------------------------------------------- */

/* A verify in steps (the daemon's, so that publishes run between them):
 * each step checks entries until its budget is read, at least one; an
 * entry published after the walk began is not checked, one evicted
 * meanwhile not counted; the blocks and indexes end the last step. */
static void test_verify_in_steps(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = storeutil_model("steps", 4096);
	store_put_model(f->st, m, NULL, NULL);
	uint32_t t[5][8];
	struct store_publish_res res[5];
	for (int e = 0; e < 5; e++) {
		seq(t[e], 8, 100u * (uint32_t)e);
		assert_int_equal(storeutil_publish(f->st, m, "", t[e], 8, 3 + (uint32_t)e, &res[e]),
		                 STATUS_OK);
	}
	struct store_verify *v = NULL;
	struct status st;
	assert_int_equal(store_verify_begin(f->st, &v, &st), STATUS_OK);
	assert_int_equal(store_verify_left(v), 5);
	int done = -1;
	/* a budget of one byte: one entry a step */
	assert_int_equal(store_verify_step(v, 1, NULL, NULL, &done, &st), STATUS_OK);
	assert_int_equal(done, 0);
	assert_int_equal(store_verify_left(v), 4);
	/* meanwhile: one more published, one evicted */
	uint32_t t5[8];
	seq(t5, 8, 900);
	assert_int_equal(storeutil_publish(f->st, m, "", t5, 8, 9, NULL), STATUS_OK);
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])res[4].key,
	                              .n_keys = 1};
	struct store_evict_res er;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, NULL), STATUS_OK);
	uint64_t steps = 1;
	while (!done) {
		assert_int_equal(store_verify_step(v, 1, NULL, NULL, &done, &st), STATUS_OK);
		steps++;
	}
	assert_int_equal(steps, 5);
	assert_int_equal(store_verify_left(v), 0);
	uint64_t checked = 0, damaged = 0;
	store_verify_counts(v, &checked, &damaged);
	store_verify_end(v);
	assert_int_equal(checked, 4); /* 5 listed, one evicted meanwhile */
	assert_int_equal(damaged, 0);
	/* a budget that holds them all: one step, as store_verify() */
	assert_int_equal(store_verify_begin(f->st, &v, &st), STATUS_OK);
	assert_int_equal(store_verify_step(v, UINT64_MAX, NULL, NULL, &done, &st), STATUS_OK);
	assert_int_equal(done, 1);
	store_verify_counts(v, &checked, &damaged);
	assert_int_equal(checked, 5);
	store_verify_end(v);
	store_verify_end(NULL);
	model_free(m);
}

static void test_flipped_chunk_quarantines(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *big = storeutil_model("big", 300000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[3][20];
	struct store_publish_res res[3];
	for (int e = 0; e < 3; e++) {
		seq(t[e], 20, 1000u * (uint32_t)e);
		assert_int_equal(
		        storeutil_publish(f->st, big, "", t[e], 20, 11 + (uint32_t)e, &res[e]),
		        STATUS_OK);
	}
	/* find entry 1's bytes in the file: its layer 1 recurrent data */
	struct storeutil_snap s = storeutil_snap(big, 20, 12);
	const unsigned char *needle = s.bufs[1] + 1000;
	store_close(f->st);
	f->st = NULL;
	char path[512];
	snprintf(path, sizeof(path), "%s/data.mdb", f->dir);
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	fseek(fp, 0, SEEK_END);
	long size = ftell(fp);
	unsigned char *file = malloc((size_t)size);
	fseek(fp, 0, SEEK_SET);
	assert_int_equal(fread(file, 1, (size_t)size, fp), (size_t)size);
	long at = -1;
	for (long i = 0; i + 64 <= size; i++)
		if (file[i] == needle[0] && !memcmp(file + i, needle, 64)) {
			at = i;
			break;
		}
	assert_true(at >= 0);
	fseek(fp, at + 10, SEEK_SET);
	unsigned char flipped = (unsigned char)(file[at + 10] ^ 0x40);
	fwrite(&flipped, 1, 1, fp);
	fclose(fp);
	free(file);
	storeutil_snap_free(&s);

	assert_int_equal(open_store(f, 0, 0), 0);
	struct store_snapshot *snap;
	struct status st;
	/* chunk by chunk, as the daemon sends: the entry's bytes in layer order,
	 * and exactly the flipped chunk fails its check (nothing counted yet) */
	for (int e = 0; e < 2; e++) {
		assert_int_equal(
		        store_restore_opt(f->st, res[e].key, STORE_RESTORE_DEFER, &snap, &st),
		        STATUS_OK);
		struct storeutil_snap want = storeutil_snap(big, 20, 11 + (uint32_t)e);
		uint32_t layer = 0;
		uint64_t in_layer = 0;
		int bad = 0;
		assert_true(store_snapshot_chunks(snap) > 1);
		for (uint64_t c = 0; c < store_snapshot_chunks(snap); c++) {
			const void *data;
			size_t len;
			if (store_snapshot_chunk(snap, c, &data, &len, &st) != STATUS_OK) {
				assert_int_equal(st.code, STATUS_CORRUPT);
				bad++;
			}
			const unsigned char *b = data;
			while (len > 0 && e == 0) { /* entry 0 is whole: compare it */
				size_t take = (size_t)(want.blobs[layer].size - in_layer);
				take = take < len ? take : len;
				assert_memory_equal(b, want.bufs[layer] + in_layer, take);
				b += take;
				len -= take;
				in_layer += take;
				if (in_layer == want.blobs[layer].size) {
					layer++;
					in_layer = 0;
				}
			}
		}
		const void *none;
		size_t none_len;
		assert_int_equal(store_snapshot_chunk(snap, store_snapshot_chunks(snap), &none,
		                                      &none_len, &st),
		                 STATUS_NOT_FOUND);
		assert_int_equal(bad, e == 1 ? 1 : 0);
		if (e == 0)
			assert_int_equal(layer, big->n_layers);
		storeutil_snap_free(&want);
		store_snapshot_release(snap);
	}
	assert_int_equal(store_restore(f->st, res[1].key, &snap, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "quarantined"));
	/* quarantined: no longer served, by restore (CORRUPT, not NOT_FOUND) or by
	 * lookup */
	assert_int_equal(store_restore(f->st, res[1].key, &snap, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "the entry is quarantined"));
	uint32_t p[21];
	memcpy(p, t[1], sizeof(t[1]));
	p[20] = 1;
	assert_int_equal(storeutil_lookup(f->st, big, "", p, 21, 0, NULL), 0);
	/* the others still restore */
	for (int e = 0; e < 3; e += 2) {
		assert_int_equal(store_restore(f->st, res[e].key, &snap, &st), STATUS_OK);
		store_snapshot_release(snap);
	}
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(checked, 3);
	assert_int_equal(damaged, 1);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_true(stats.quarantined >= 1);
	assert_int_equal(stats.corrupt, 1);
	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, res[1].key, &info, NULL), STATUS_OK);
	assert_true(info->quarantined);
	store_entry_info_free(info);
	/* publishing the same snapshot again replaces the quarantined copy */
	struct store_publish_res again;
	assert_int_equal(storeutil_publish(f->st, big, "", t[1], 20, 12, &again), STATUS_OK);
	assert_true(again.created);
	assert_int_equal(storeutil_lookup(f->st, big, "", p, 21, 0, NULL), 20);
	assert_int_equal(store_restore(f->st, res[1].key, &snap, &st), STATUS_OK);
	store_snapshot_release(snap);
	model_free(big);
}

static void why_cb(const uint8_t *key, const char *why, void *ctx)
{
	(void)key;
	snprintf(ctx, STATUS_MESSAGE_MAX, "%s", why);
}

/* verify on a store open read-only cannot quarantine: it says so and what to
 * run, and the entry is served as before. Read-write, it quarantines; a
 * second verify reports the entry by its flag, not by a message's words. */
static void test_verify_read_only_and_quarantined(void **state)
{
	struct fixture *f = *state;
	uint32_t t[20];
	seq(t, 20, 4000);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, f->m, "", t, 20, 3, &res), STATUS_OK);
	/* flip a byte of the entry's chunk, keeping its stored sum */
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, res.key, STORE_KEY_LEN);
	MDB_val k = {sizeof(ck), ck}, v;
	assert_int_equal(mdb_get(txn, f->st->chunks, &k, &v), 0);
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[v.mv_size - 3] ^= 0x20;
	MDB_val nv = {v.mv_size, copy};
	assert_int_equal(mdb_put(txn, f->st->chunks, &k, &nv, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	free(copy);

	store_close(f->st);
	struct store_options ro = {.read_only = 1};
	assert_int_equal(store_open(f->dir, &ro, &f->st, NULL), STATUS_OK);
	char why[STATUS_MESSAGE_MAX] = "";
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, why_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_null(strstr(why, "is quarantined"));
	assert_non_null(strstr(why, "read-only"));
	assert_non_null(strstr(why, "k3cachectl verify"));
	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, res.key, &info, NULL), STATUS_OK);
	assert_false(info->quarantined);
	store_entry_info_free(info);
	store_close(f->st);

	assert_int_equal(open_store(f, 0, 0), 0);
	assert_int_equal(store_verify(f->st, why_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "the entry is quarantined"));
	assert_int_equal(store_inspect(f->st, res.key, &info, NULL), STATUS_OK);
	assert_true(info->quarantined);
	store_entry_info_free(info);
	/* already quarantined: still reported, from its flag */
	why[0] = 0;
	assert_int_equal(store_verify(f->st, why_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(checked, 1);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "quarantined earlier"));
}

static void damage_record(struct fixture *f, const uint8_t *key, uint32_t salt_len, size_t cut);

/* A flip in an entry's token list, or in its record's salt, leaves the entry
 * under a key no lookup computes: verify recomputes each key from the model,
 * salt and tokens, names the damage and quarantines the entry; the others
 * are untouched. */
static void test_verify_recomputes_keys(void **state)
{
	struct fixture *f = *state;
	uint32_t t[3][20];
	uint8_t keys[3][STORE_KEY_LEN];
	for (int e = 0; e < 3; e++) {
		struct store_publish_res res;
		seq(t[e], 20, 7000 + 100 * (uint32_t)e);
		assert_int_equal(storeutil_publish(f->st, f->m, "", t[e], 20, 1, &res), STATUS_OK);
		memcpy(keys[e], res.key, STORE_KEY_LEN);
	}
	/* entry 0: one token flipped */
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_val k = {STORE_KEY_LEN, keys[0]}, v;
	assert_int_equal(mdb_get(txn, f->st->tokens, &k, &v), 0);
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[28] ^= 0x01; /* token 7 */
	MDB_val nv = {v.mv_size, copy};
	assert_int_equal(mdb_put(txn, f->st->tokens, &k, &nv, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	free(copy);
	/* entry 1: a salt it was not published under */
	damage_record(f, keys[1], 3, 0);
	char why[4096] = "";
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, why_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(checked, 3);
	assert_int_equal(damaged, 2);
	assert_non_null(strstr(why, "key is not the SHA-256 of its model, salt and tokens"));
	for (int e = 0; e < 3; e++) {
		struct store_entry_info *info;
		assert_int_equal(store_inspect(f->st, keys[e], &info, NULL), STATUS_OK);
		assert_int_equal(info->quarantined, e < 2);
		store_entry_info_free(info);
	}
	struct store_snapshot *snap;
	struct status st;
	assert_int_equal(store_restore(f->st, keys[2], &snap, &st), STATUS_OK);
	store_snapshot_release(snap);
}

/* Collects every message (ctx: a 4096-byte buffer). */
static void why_all_cb(const uint8_t *key, const char *why, void *ctx)
{
	(void)key;
	size_t n = strlen(ctx);
	snprintf((char *)ctx + n, 4096 - n, "%s\n", why);
}

/* Deletes, through LMDB, the row of dbi whose key (at koff) or value (at
 * voff; -1: not the value) holds key. */
static void drop_index_row(struct fixture *f, MDB_dbi dbi, const uint8_t *key, int koff, int voff)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, dbi, &cur), 0);
	MDB_val k, v;
	int found = 0;
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && !found;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		const unsigned char *at = voff >= 0 ? (const unsigned char *)v.mv_data + voff
		                                    : (const unsigned char *)k.mv_data + koff;
		if (!memcmp(at, key, STORE_KEY_LEN)) {
			assert_int_equal(mdb_cursor_del(cur, 0), 0);
			found = 1;
		}
	}
	mdb_cursor_close(cur);
	assert_true(found);
	assert_int_equal(mdb_txn_commit(txn), 0);
}

/* verify walks the indexes against the entries: an entry with no LRU row
 * (eviction cannot reach it), one with no attach row, and a node counting
 * fewer entries than pass through it (lookups cannot find them) are named;
 * a clean store has no such line. */
static void test_verify_finds_index_damage(void **state)
{
	struct fixture *f = *state;
	uint32_t t[3][40];
	uint8_t keys[3][STORE_KEY_LEN];
	for (int e = 0; e < 3; e++) {
		struct store_publish_res res;
		seq(t[e], 40, 9000 + 100 * (uint32_t)e);
		assert_int_equal(storeutil_publish(f->st, f->m, "", t[e], 40, 1, &res), STATUS_OK);
		memcpy(keys[e], res.key, STORE_KEY_LEN);
	}
	char why[4096] = "";
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, why_all_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 0);
	drop_index_row(f, f->st->lru, keys[0], 8, -1);
	why[0] = 0;
	assert_int_equal(store_verify(f->st, why_all_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "the LRU index has no row for entry"));
	/* a store open to write is repaired as it is verified */
	assert_non_null(strstr(why, "repaired: the prefix and LRU indexes were made again"));
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 0);
	drop_index_row(f, f->st->attach, keys[1], 0, 12);
	uint32_t probe[41];
	memcpy(probe, t[1], sizeof(t[1]));
	probe[40] = 1;
	assert_int_equal(storeutil_lookup(f->st, f->m, "", probe, 41, 0, NULL), 0); /* lost */
	why[0] = 0;
	assert_int_equal(store_verify(f->st, why_all_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "no attach row for entry"));
	assert_int_equal(storeutil_lookup(f->st, f->m, "", probe, 41, 0, NULL), 40);
	/* entry 2's first node: counted 0 */
	uint8_t h[3][PREFIX_NODE_LEN];
	prefix_block_hashes(f->m->fingerprint, "", 0, t[2], 40, h);
	MDB_txn *txn;
	unsigned char zero[4] = {0};
	MDB_val nk = {PREFIX_NODE_LEN, h[1]}, nv = {4, zero};
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_put(txn, f->st->nodes, &nk, &nv, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	why[0] = 0;
	assert_int_equal(store_verify(f->st, why_all_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "1 count fewer entries than pass through them, 0 are missing"));
	assert_int_equal(checked, 3);
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 0);
	struct store_stats stats;
	assert_int_equal(store_get_stats(f->st, &stats, NULL), STATUS_OK);
	assert_int_equal(stats.indexes_rebuilt, 3);
}

/* A writer holding the lock for 3 s; the test's restore must not wait for it. */
struct held_writer {
	MDB_env *env;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int holding;
};

static void *hold_writer(void *arg)
{
	struct held_writer *h = arg;
	MDB_txn *txn;
	if (mdb_txn_begin(h->env, NULL, 0, &txn) != 0)
		return NULL;
	pthread_mutex_lock(&h->mu);
	h->holding = 1;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
	sleep(3);
	mdb_txn_abort(txn);
	return NULL;
}

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A chunk missing under a deferred restore (the daemon's loop thread) is
 * reported without taking a write transaction: the restore does not wait
 * for the writer, and the caller quarantines the entry where a write may
 * wait (store_quarantine). */
static void test_deferred_restore_takes_no_write(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *big = storeutil_model("big", 300000);
	store_put_model(f->st, big, NULL, NULL);
	uint32_t t[20];
	seq(t, 20, 7000);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, big, "", t, 20, 5, &res), STATUS_OK);
	/* remove chunk 1 */
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char ck[STORE_CHUNK_KEY_LEN];
	memcpy(ck, res.key, STORE_KEY_LEN);
	store_be32(ck + STORE_KEY_LEN, 1);
	MDB_val k = {sizeof(ck), ck};
	assert_int_equal(mdb_del(txn, f->st->chunks, &k, NULL), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);

	struct held_writer h = {.env = f->st->env};
	pthread_mutex_init(&h.mu, NULL);
	pthread_cond_init(&h.cv, NULL);
	pthread_t thr;
	assert_int_equal(pthread_create(&thr, NULL, hold_writer, &h), 0);
	pthread_mutex_lock(&h.mu);
	while (!h.holding)
		pthread_cond_wait(&h.cv, &h.mu);
	pthread_mutex_unlock(&h.mu);
	double t0 = now_seconds();
	struct store_snapshot *snap;
	struct status st;
	assert_int_equal(store_restore_opt(f->st, res.key, STORE_RESTORE_USE | STORE_RESTORE_DEFER,
	                                   &snap, &st),
	                 STATUS_CORRUPT);
	double waited = now_seconds() - t0;
	assert_non_null(strstr(st.message, "chunk 1 is missing"));
	pthread_join(thr, NULL);
	assert_true(waited < 1.0);
	/* not quarantined yet: that is the caller's write */
	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, res.key, &info, NULL), STATUS_OK);
	assert_false(info->quarantined);
	store_entry_info_free(info);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	uint64_t q0 = stats.quarantined;
	assert_int_equal(store_quarantine(f->st, res.key), STORE_QUARANTINE_FLAGGED);
	assert_int_equal(store_inspect(f->st, res.key, &info, NULL), STATUS_OK);
	assert_true(info->quarantined);
	store_entry_info_free(info);
	/* again, or of an entry that is gone: nothing done, nothing counted */
	assert_int_equal(store_quarantine(f->st, res.key), STORE_QUARANTINE_NONE);
	uint8_t gone[STORE_KEY_LEN] = {9};
	assert_int_equal(store_quarantine(f->st, gone), STORE_QUARANTINE_NONE);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.quarantined, q0 + 1);
	assert_int_equal(store_restore(f->st, res.key, &snap, &st), STATUS_CORRUPT);
	model_free(big);
}

/* ---- shared MLA row blocks ---------------------------------------------- */

static enum status_code conv_publish(struct fixture *f, const uint32_t *t, uint32_t p,
                                     uint32_t rows_seed, uint32_t seed,
                                     struct store_publish_res *res)
{
	struct storeutil_snap s = storeutil_conv_snap(f->m, p, rows_seed, seed);
	struct store_publish_req req = {f->m->fingerprint, "", 0, t, p, s.blobs, s.n};
	struct status st;
	enum status_code code = store_publish(f->st, &req, res, &st);
	if (code != STATUS_OK)
		fprintf(stderr, "publish: %s\n", st.message);
	storeutil_snap_free(&s);
	return code;
}

/* Restores key whole and deferred (piece by piece, as the daemon sends) and
 * compares both with the published bytes. */
static void expect_conv(struct fixture *f, const uint8_t *key, uint32_t p, uint32_t rows_seed,
                        uint32_t seed)
{
	struct storeutil_snap want = storeutil_conv_snap(f->m, p, rows_seed, seed);
	struct store_snapshot *snap;
	struct status st;
	assert_int_equal(store_restore(f->st, key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &want);
	store_snapshot_release(snap);
	assert_int_equal(store_restore_opt(f->st, key, STORE_RESTORE_DEFER, &snap, &st), STATUS_OK);
	uint32_t layer = 0;
	uint64_t in_layer = 0;
	for (uint64_t c = 0; c < store_snapshot_chunks(snap); c++) {
		const void *data;
		size_t len;
		assert_int_equal(store_snapshot_chunk(snap, c, &data, &len, &st), STATUS_OK);
		const unsigned char *b = data;
		while (len) {
			size_t take = (size_t)(want.blobs[layer].size - in_layer);
			take = take < len ? take : len;
			assert_memory_equal(b, want.bufs[layer] + in_layer, take);
			b += take;
			len -= take;
			in_layer += take;
			if (in_layer == want.blobs[layer].size) {
				layer++;
				in_layer = 0;
			}
		}
	}
	assert_int_equal(layer, want.n);
	store_snapshot_release(snap);
	storeutil_snap_free(&want);
}

/* What an entry keeps in its own chunks with every full block shared. */
static uint64_t own_bytes(const struct k3cache_model *m, uint32_t p, uint32_t rb)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		b += model_layer_blob_size(l, p);
		if (l->mixer == MODEL_MIXER_MLA)
			b -= (uint64_t)(p / rb) * rb * (l->k_row + l->v_row) * 4;
	}
	return b;
}

static uint64_t block_bytes(const struct k3cache_model *m, uint32_t rb)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < m->n_layers; i++)
		if (m->layers[i].mixer == MODEL_MIXER_MLA)
			b += (uint64_t)rb * (m->layers[i].k_row + m->layers[i].v_row) * 4;
	return b;
}

/* Three turns of one conversation share their rows: the store holds every
 * row once, every restore is byte-identical (whole and piece by piece),
 * after a restart too, and eviction frees exactly the blocks no entry uses
 * any more. */
static void test_blocks_shared_across_turns(void **state)
{
	struct fixture *f = *state;
	const uint32_t rb = STORE_DEFAULT_ROW_BLOCK;
	uint32_t t[400];
	seq(t, 400, 11);
	const uint32_t ps[3] = {70, 200, 330};
	struct store_publish_res res[3];
	uint64_t logical = 0, own = 0;
	for (int e = 0; e < 3; e++) {
		assert_int_equal(conv_publish(f, t, ps[e], 1, 10 + (uint32_t)e, &res[e]),
		                 STATUS_OK);
		assert_true(res[e].created);
		logical += res[e].bytes;
		own += own_bytes(f->m, ps[e], rb);
	}
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.row_block, rb);
	assert_int_equal(stats.blocks, 330 / rb);
	assert_int_equal(stats.blocks_mismatched, 0);
	assert_int_equal(stats.logical_bytes, logical);
	assert_int_equal(stats.bytes, own + (330 / rb) * block_bytes(f->m, rb));
	assert_true(stats.bytes < logical);
	for (int e = 0; e < 3; e++)
		expect_conv(f, res[e].key, ps[e], 1, 10 + (uint32_t)e);

	/* a restart */
	store_close(f->st);
	assert_int_equal(open_store(f, 0, 0), 0);
	for (int e = 0; e < 3; e++)
		expect_conv(f, res[e].key, ps[e], 1, 10 + (uint32_t)e);

	/* evict the turn that stored block 0 first: the others keep it */
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])res[0].key,
	                              .n_keys = 1};
	struct store_evict_res er;
	uint64_t before = stats.bytes;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 330 / rb);
	assert_int_equal(stats.bytes, before - own_bytes(f->m, 70, rb));
	for (int e = 1; e < 3; e++)
		expect_conv(f, res[e].key, ps[e], 1, 10 + (uint32_t)e);
	/* the longest: its last two blocks go with it, and only they */
	before = stats.bytes;
	req.keys = (const uint8_t(*)[STORE_KEY_LEN])res[2].key;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 200 / rb);
	assert_int_equal(stats.bytes, before - own_bytes(f->m, 330, rb) -
	                                      (330 / rb - 200 / rb) * block_bytes(f->m, rb));
	expect_conv(f, res[1].key, 200, 1, 11);
	struct store_evict_req all = {.all = 1};
	assert_int_equal(store_evict(f->st, &all, NULL, NULL, &er, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 0);
	assert_int_equal(stats.bytes, 0);
	assert_int_equal(stats.logical_bytes, 0);
}

/* What an eviction reported, entry by entry (the first EVICT_LOG_KEYS). */
#define EVICT_LOG_KEYS 32u
struct evict_log {
	uint8_t keys[EVICT_LOG_KEYS][STORE_KEY_LEN];
	uint64_t bytes[EVICT_LOG_KEYS];
	uint32_t n;
};

static void evict_log_cb(const uint8_t key[STORE_KEY_LEN], uint64_t bytes, void *ctx)
{
	struct evict_log *l = ctx;
	if (l->n < EVICT_LOG_KEYS) {
		memcpy(l->keys[l->n], key, STORE_KEY_LEN);
		l->bytes[l->n] = bytes;
	}
	l->n++;
}

/* The dry run named the same entries as the real evict, in the same order,
 * with the same bytes each and in all. */
static void expect_same_evictions(const struct evict_log *dry, const struct store_evict_res *dres,
                                  const struct evict_log *real, const struct store_evict_res *rres)
{
	assert_int_equal(dres->entries, rres->entries);
	assert_int_equal(dry->n, real->n);
	for (uint32_t i = 0; i < real->n && i < EVICT_LOG_KEYS; i++) {
		assert_memory_equal(dry->keys[i], real->keys[i], STORE_KEY_LEN);
		assert_int_equal(dry->bytes[i], real->bytes[i]);
	}
	assert_int_equal(dres->bytes, rres->bytes);
}

/* Runs req dry, then for real: the dry run must name the same entries in the
 * same order with the same bytes each and in all, and the real one must
 * free what it says and evict `want` entries. */
static void expect_dry_as_real(struct fixture *f, struct store_evict_req req, uint32_t want)
{
	struct evict_log dry = {0}, real = {0};
	struct store_evict_res dres, rres;
	struct store_stats before, after;
	struct status st;
	req.dry_run = 1;
	assert_int_equal(store_evict(f->st, &req, evict_log_cb, &dry, &dres, &st), STATUS_OK);
	store_get_stats(f->st, &before, NULL);
	req.dry_run = 0;
	assert_int_equal(store_evict(f->st, &req, evict_log_cb, &real, &rres, &st), STATUS_OK);
	store_get_stats(f->st, &after, NULL);
	assert_int_equal(rres.entries, want);
	assert_int_equal(real.n, want);
	assert_int_equal(rres.bytes, before.bytes - after.bytes);
	expect_same_evictions(&dry, &dres, &real, &rres);
}

/* A dry run reports what the real evict frees: the shared blocks that go
 * with the last entry using them too, for each selector, a key named twice
 * once, and uses not yet written taken into the LRU order. --to-size stops
 * as soon as the blocks freed bring the store down to its target. */
static void test_evict_dry_run_counts_shared_blocks(void **state)
{
	struct fixture *f = *state;
	const uint32_t rb = STORE_DEFAULT_ROW_BLOCK;
	uint32_t t[400];
	seq(t, 400, 21);
	const uint32_t ps[3] = {70, 200, 330}; /* blocks 0 | 0-2 | 0-4 */
	struct store_publish_res res[3];
	const uint64_t bb = block_bytes(f->m, rb);
	for (int e = 0; e < 3; e++)
		assert_int_equal(conv_publish(f, t, ps[e], 1, 10 + (uint32_t)e, &res[e]),
		                 STATUS_OK);
	/* keys, one of them twice */
	uint8_t named[4][STORE_KEY_LEN];
	memcpy(named[0], res[1].key, STORE_KEY_LEN);
	memcpy(named[1], res[0].key, STORE_KEY_LEN);
	memcpy(named[2], res[1].key, STORE_KEY_LEN);
	memcpy(named[3], res[2].key, STORE_KEY_LEN);
	expect_dry_as_real(f,
	                   (struct store_evict_req){.keys = (const uint8_t(*)[STORE_KEY_LEN])named,
	                                            .n_keys = 4},
	                   3);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.bytes, 0);

	/* every entry of the model */
	for (int e = 0; e < 3; e++)
		assert_int_equal(conv_publish(f, t, ps[e], 1, 10 + (uint32_t)e, &res[e]),
		                 STATUS_OK);
	expect_dry_as_real(f, (struct store_evict_req){.model = f->m->fingerprint}, 3);

	/* --to-size, the longest least recently used: evicting it alone frees
	 * its blocks 3 and 4, which is enough */
	for (int e = 2; e >= 0; e--)
		assert_int_equal(conv_publish(f, t, ps[e], 1, 10 + (uint32_t)e, &res[e]),
		                 STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	uint64_t target = stats.bytes - own_bytes(f->m, 330, rb) - 2 * bb;
	expect_dry_as_real(f, (struct store_evict_req){.to_bytes_set = 1, .to_bytes = target}, 1);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.bytes, target);
	assert_int_equal(stats.blocks, 3);

	/* a use held in memory, not yet written, moves the 200-token turn
	 * behind the 70-token one: the dry run evicts in that order too */
	store_touch(f->st, res[1].key, 1);
	target = stats.bytes - own_bytes(f->m, 70, rb);
	expect_dry_as_real(f, (struct store_evict_req){.to_bytes_set = 1, .to_bytes = target}, 1);
	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, res[0].key, &info, NULL), STATUS_NOT_FOUND);
	assert_int_equal(store_inspect(f->st, res[1].key, &info, NULL), STATUS_OK);
	store_entry_info_free(info);
}

/* A turn whose rows differ from the stored blocks under the same tokens
 * keeps its own copy (counted), and each entry restores its own bytes. */
static void test_blocks_mismatch_kept_private(void **state)
{
	struct fixture *f = *state;
	const uint32_t rb = STORE_DEFAULT_ROW_BLOCK;
	uint32_t t[300];
	seq(t, 300, 77);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 200, 1, 1, &a), STATUS_OK);
	assert_int_equal(conv_publish(f, t, 260, 2, 2, &b), STATUS_OK);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks_mismatched, 200 / rb);
	assert_int_equal(stats.blocks, 260 / rb); /* 0-2 from a, 3 from b */
	expect_conv(f, a.key, 200, 1, 1);
	expect_conv(f, b.key, 260, 2, 2);
	/* and once a is gone, b still holds its own rows */
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])a.key, .n_keys = 1};
	struct store_evict_res er;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, NULL), STATUS_OK);
	expect_conv(f, b.key, 260, 2, 2);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 1);
	/* its own copies of blocks 0-2 in its chunks, and the shared block 3 */
	assert_int_equal(stats.bytes, own_bytes(f->m, 260, rb) + 4 * block_bytes(f->m, rb));
}

/* A store whose every conversation snapshot is staged (1 KiB per stage):
 * each turn's blocks are placed, and held, stage by stage. */
static void reopen_tiny_stages(struct fixture *f)
{
	store_close(f->st);
	test_stage_bytes = 1024; /* under the smallest snapshot here (70 rows) */
	assert_int_equal(open_store(f, 0, 0), 0);
}

static void test_staged_blocks_shared_across_turns(void **state)
{
	reopen_tiny_stages(*state);
	test_blocks_shared_across_turns(state);
}

static void test_staged_blocks_mismatch_kept_private(void **state)
{
	reopen_tiny_stages(*state);
	test_blocks_mismatch_kept_private(state);
}

/* Bytes of blob layers [0, n) of s. */
static uint64_t layers_bytes(const struct storeutil_snap *s, uint32_t n)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < n; i++)
		b += s->blobs[i].size;
	return b;
}

/* A staged publish whose MLA layer has passed its check and whose blocks are
 * placed (held), its last layer not yet arrived: steps it until then. */
static struct store_stage *stage_past_mla(struct fixture *f, struct storeutil_snap *s,
                                          const uint32_t *t, uint32_t p,
                                          struct store_publish_req *req)
{
	*req = (struct store_publish_req){f->m->fingerprint, "", 0, t, p, s->blobs, s->n};
	struct store_stage *g;
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_stage_begin(f->st, req, 0, NULL, NULL, &g, &res, &st), STATUS_OK);
	assert_non_null(g);
	store_stage_arrived(g, layers_bytes(s, 3)); /* layers 0-2: the MLA one is 2 */
	struct store_stats stats;
	uint64_t blocks = 0;
	for (int i = 0; i < 2000 && blocks < p / STORE_DEFAULT_ROW_BLOCK; i++) {
		int step = store_stage_step(g, 0);
		assert_int_not_equal(step, STORE_STAGE_FAILED);
		store_get_stats(f->st, &stats, NULL);
		blocks = stats.blocks;
		if (blocks < p / STORE_DEFAULT_ROW_BLOCK)
			usleep(1000);
	}
	assert_int_equal(blocks, p / STORE_DEFAULT_ROW_BLOCK);
	return g;
}

/* A staged publish that fails after its blocks were placed gives back every
 * reference it held: the blocks it stored first go, the totals return,
 * verify finds every count exact, and the snapshot then publishes whole. */
static void test_staged_failure_gives_back_blocks(void **state)
{
	struct fixture *f = *state;
	reopen_tiny_stages(f);
	uint32_t t[300];
	seq(t, 300, 91);
	struct store_publish_res a;
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK); /* blocks 0, 1 */
	struct store_stats before, stats;
	store_get_stats(f->st, &before, NULL);
	assert_int_equal(before.blocks, 2);

	struct storeutil_snap s = storeutil_conv_snap(f->m, 290, 1, 2); /* blocks 0-3 */
	struct store_publish_req req;
	struct store_stage *g = stage_past_mla(f, &s, t, 290, &req);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 4); /* 0, 1 shared; 2, 3 stored, held */
	assert_true(stats.bytes > before.bytes);
	/* the last layer arrives with a NaN */
	float nan = __builtin_nanf("");
	memcpy(s.bufs[3] + s.blobs[3].size - 4, &nan, 4);
	store_stage_arrived(g, UINT64_MAX);
	while (store_stage_step(g, 0) == STORE_STAGE_WAIT)
		store_stage_wait(g);
	struct store_publish_res res;
	struct status st;
	assert_int_equal(store_stage_end(g, &res, &st), STATUS_INVALID);
	assert_false(res.created);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 2);
	assert_int_equal(stats.bytes, before.bytes);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.chunks, before.chunks);
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st), STATUS_OK);
	assert_int_equal(damaged, 0);
	storeutil_snap_free(&s);
	/* evicting a frees its blocks: no reference was left behind */
	struct store_evict_req all = {.all = 1};
	struct store_evict_res er;
	assert_int_equal(store_evict(f->st, &all, NULL, NULL, &er, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 0);
	assert_int_equal(stats.bytes, 0);
	assert_int_equal(conv_publish(f, t, 290, 1, 2, &res), STATUS_OK);
	expect_conv(f, res.key, 290, 1, 2);
}

/* A one-transaction publish of a key whose staged publish died in another
 * process (its pending row dead, a held reference and a chunk left under the
 * key, the store still open here) takes them back first: no reference
 * leaks, nothing of the dead publish stays under the entry. */
static void test_publish_reclaims_dead_staged_key(void **state)
{
	struct fixture *f = *state;
	uint32_t t[300];
	seq(t, 300, 97);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK); /* blocks 0, 1 */
	uint8_t key[STORE_KEY_LEN], h[5][PREFIX_NODE_LEN];
	assert_int_equal(prefix_key(f->m->fingerprint, "", 0, t, 200, key), 0);
	prefix_block_hashes(f->m->fingerprint, "", 0, t, 64, h);
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char row[28] = {0};
	store_be32(row, 999999999u); /* no such process */
	store_be64(row + 4, 1);
	MDB_val pk = {STORE_KEY_LEN, key}, pv = {sizeof(row), row};
	assert_int_equal(mdb_put(txn, f->st->pending, &pk, &pv, 0), 0);
	int shared = 0;
	assert_int_equal(store_blocks_addref(f->st, txn, h[64 / PREFIX_BLOCK], 2, &shared), 0);
	assert_true(shared);
	assert_int_equal(store_blocks_hold(f->st, txn, key, h[64 / PREFIX_BLOCK], 2), 0);
	assert_int_equal(
	        store_chunks_put(f->st, txn, key, STORE_CHUNK_PRIVATE + 40, "junk", 4, NULL), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);

	assert_int_equal(conv_publish(f, t, 200, 1, 2, &b), STATUS_OK);
	assert_true(b.created);
	expect_conv(f, b.key, 200, 1, 2);
	struct status st;
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st), STATUS_OK);
	assert_int_equal(damaged, 0);
	MDB_val cv;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(store_chunks_get(f->st, txn, key, STORE_CHUNK_PRIVATE + 40, &cv),
	                 MDB_NOTFOUND);
	mdb_txn_abort(txn);
	struct store_evict_req all = {.all = 1};
	struct store_evict_res er;
	assert_int_equal(store_evict(f->st, &all, NULL, NULL, &er, NULL), STATUS_OK);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 0);
	assert_int_equal(stats.chunks, 0);
}

/* A process that dies with a staged publish holding block references: the
 * next open gives them back (the blocks it stored first go, the others
 * count one fewer) before anything else runs. */
static void test_staged_crash_gives_back_blocks(void **state)
{
	struct fixture *f = *state;
	reopen_tiny_stages(f);
	uint32_t t[300];
	seq(t, 300, 93);
	struct store_publish_res a;
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	struct store_stats before, stats;
	store_get_stats(f->st, &before, NULL);
	store_close(f->st);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (open_store(f, 0, 0) != 0)
			_exit(2);
		struct storeutil_snap s = storeutil_conv_snap(f->m, 290, 1, 2);
		struct store_publish_req req;
		(void)stage_past_mla(f, &s, t, 290, &req);
		_exit(0); /* no end: as if killed */
	}
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(open_store(f, 0, 0), 0);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.swept, 1);
	assert_int_equal(stats.blocks, 2);
	assert_int_equal(stats.bytes, before.bytes);
	assert_int_equal(stats.chunks, before.chunks);
	MDB_txn *txn;
	MDB_stat ms;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_stat(txn, f->st->held, &ms), 0);
	assert_int_equal(ms.ms_entries, 0);
	mdb_txn_abort(txn);
	struct status st;
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st), STATUS_OK);
	assert_int_equal(damaged, 0);
	expect_conv(f, a.key, 130, 1, 1);
	/* a's blocks count one reference each: evicting it frees them */
	struct store_evict_req all = {.all = 1};
	struct store_evict_res er;
	assert_int_equal(store_evict(f->st, &all, NULL, NULL, &er, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 0);
	assert_int_equal(stats.bytes, 0);
}

/* Flips a bit of the byte `back` bytes before the end of part (0 k, 1 v)
 * of block 0 of layer 2 under tokens t, keeping the part's stored sum. */
static void flip_model_block_byte(struct fixture *f, const uint8_t *fingerprint, const uint32_t *t,
                                  unsigned part, size_t back)
{
	uint8_t h[5][PREFIX_NODE_LEN];
	prefix_block_hashes(fingerprint, "", 0, t, 64, h);
	unsigned char bk[STORE_BLOCK_KEY_LEN];
	memcpy(bk, h[64 / PREFIX_BLOCK], PREFIX_NODE_LEN);
	store_be32(bk + PREFIX_NODE_LEN, 2);
	bk[PREFIX_NODE_LEN + 4] = (unsigned char)part;
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_val k = {sizeof(bk), bk}, v;
	assert_int_equal(mdb_get(txn, f->st->blocks, &k, &v), 0);
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[v.mv_size - back] ^= 0x10;
	MDB_val nv = {v.mv_size, copy};
	assert_int_equal(mdb_put(txn, f->st->blocks, &k, &nv, 0), 0);
	free(copy);
	assert_int_equal(mdb_txn_commit(txn), 0);
}

static void flip_block_byte(struct fixture *f, const uint32_t *t, unsigned part, size_t back)
{
	flip_model_block_byte(f, f->m->fingerprint, t, part, back);
}

/* A delta of a conversation turn: its KDA layers whole and, of its MLA
 * layer, rows [r, p) (k rows, then v rows), with the whole blob's sum. */
struct delta_req {
	struct storeutil_snap whole;
	struct store_blob blobs[4];
	unsigned char *rows;
	struct store_publish_req req;
};

static void delta_make(struct fixture *f, struct delta_req *d, const uint32_t *t, uint32_t p,
                       uint32_t r, uint32_t rows_seed, uint32_t seed)
{
	d->whole = storeutil_conv_snap(f->m, p, rows_seed, seed);
	for (uint32_t i = 0; i < d->whole.n; i++) {
		d->blobs[i] = d->whole.blobs[i];
		const struct model_layer *l = &f->m->layers[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		size_t kb = (size_t)l->k_row * 4, vb = (size_t)l->v_row * 4;
		const unsigned char *w = d->whole.bufs[i];
		d->rows = malloc((size_t)(p - r) * (kb + vb) + 1);
		memcpy(d->rows, w + 9 + (size_t)r * kb, (size_t)(p - r) * kb);
		memcpy(d->rows + (size_t)(p - r) * kb, w + 13 + (size_t)p * kb + (size_t)r * vb,
		       (size_t)(p - r) * vb);
		d->blobs[i].data = d->rows;
		d->blobs[i].size = (uint64_t)(p - r) * (kb + vb);
		d->blobs[i].xxh3 = checksum_blob(w, d->whole.blobs[i].size, i);
	}
	d->req = (struct store_publish_req){f->m->fingerprint, "", 0, t, p, d->blobs, d->whole.n};
}

static void delta_free(struct delta_req *d)
{
	free(d->rows);
	storeutil_snap_free(&d->whole);
}

/* Assembles and publishes a delta. Returns the publish's code, or the
 * assembly's (with *refused) when it fails. */
static enum status_code delta_publish(struct fixture *f, const uint32_t *t, uint32_t p, uint32_t r,
                                      const uint8_t *base, uint32_t rows_seed, uint32_t seed,
                                      struct store_publish_res *res, int *refused,
                                      struct status *st)
{
	struct delta_req d;
	delta_make(f, &d, t, p, r, rows_seed, seed);
	struct store_delta a;
	enum status_code code = store_delta_assemble(f->st, &d.req, base, r, &a, refused, st);
	if (code == STATUS_OK) {
		struct store_publish_req whole = d.req;
		whole.blobs = a.blobs;
		code = store_publish(f->st, &whole, res, st);
		store_delta_free(&a);
	}
	delta_free(&d);
	return code;
}

/* Delta publish in the store: the base's rows are taken from the map, not
 * copied, whatever the rows named (at a block boundary or inside a block),
 * in one transaction and staged; every restore is byte-identical and the
 * rows are stored once. */
static void check_delta_publish(struct fixture *f)
{
	uint32_t t[300];
	seq(t, 300, 61);
	struct store_publish_res a = {0}, b = {0}, c = {0};
	struct status st;
	int refused = 0;
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	/* from the base's last row (inside block 2) */
	assert_int_equal(delta_publish(f, t, 290, 130, a.key, 1, 2, &b, &refused, &st), STATUS_OK);
	assert_true(b.created);
	expect_conv(f, b.key, 290, 1, 2);
	/* from fewer rows than the base holds, at a block boundary */
	assert_int_equal(delta_publish(f, t, 200, 64, a.key, 1, 3, &c, &refused, &st), STATUS_OK);
	expect_conv(f, c.key, 200, 1, 3);
	expect_conv(f, a.key, 130, 1, 1);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.blocks, 290 / STORE_DEFAULT_ROW_BLOCK);
	assert_int_equal(stats.blocks_mismatched, 0);
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st), STATUS_OK);
	assert_int_equal(damaged, 0);
	/* a NaN among the new rows: refused as invalid, nothing stored */
	struct delta_req d;
	delta_make(f, &d, t, 280, 130, 1, 4);
	float nan = __builtin_nanf("");
	memcpy(d.rows + 40, &nan, 4);
	struct store_delta asm_;
	assert_int_equal(store_delta_assemble(f->st, &d.req, a.key, 130, &asm_, &refused, &st),
	                 STATUS_INVALID);
	assert_false(refused);
	assert_non_null(strstr(st.message, "non-finite"));
	delta_free(&d);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 3);
}

static void test_delta_publish_in_store(void **state)
{
	check_delta_publish(*state);
}

static void test_staged_delta_publish_in_store(void **state)
{
	reopen_tiny_stages(*state);
	check_delta_publish(*state);
}

/* A delta naming more rows than the blob's 32-bit counts can hold is refused
 * before anything is read past the base's tokens. */
static void test_delta_over_32bit_counts_refused(void **state)
{
	struct fixture *f = *state;
	uint32_t t[300];
	seq(t, 300, 71);
	struct store_publish_res a = {0};
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	struct delta_req d;
	delta_make(f, &d, t, 200, 130, 1, 2);
	d.req.n_tokens = 0x30000000u; /* x 6 k floats a row: over 2^32 */
	struct store_delta asm_;
	struct status st;
	int refused = 0;
	assert_int_equal(store_delta_assemble(f->st, &d.req, a.key, 130, &asm_, &refused, &st),
	                 STATUS_INVALID);
	assert_non_null(strstr(st.message, "32-bit"));
	delta_free(&d);
}

/* A base whose rows are damaged on disk (a shared block's, its sum left as
 * it was): the assembled blob does not hash to the worker's sum, so the
 * delta is refused and nothing is stored; the worker publishes whole. The
 * base's pieces, checked against their own sums, tell whose bytes were
 * wrong: here the store's, so the answer is CORRUPT (counted as damage, the
 * base quarantined), not INVALID. Rows of the worker's that differ, on a
 * sound base, are INVALID, and the base stays in service. */
static void test_delta_of_damaged_base_refused(void **state)
{
	struct fixture *f = *state;
	uint32_t t[300];
	seq(t, 300, 67);
	struct store_publish_res a = {0}, b = {0};
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	struct status st;
	int refused = 0;
	/* the worker's rows are not the ones it hashed: its mistake */
	assert_int_equal(delta_publish(f, t, 250, 130, a.key, 2, 2, &b, &refused, &st),
	                 STATUS_INVALID);
	assert_true(refused);
	if (!strstr(st.message, "hashes to") || !strstr(st.message, "hold their checksums"))
		fail_msg("message: %s", st.message);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.corrupt, 0);
	assert_int_equal(stats.quarantined, 0);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, a.key, &snap, &st), STATUS_OK);
	store_snapshot_release(snap);

	flip_block_byte(f, t, 1, 3); /* block 0's v rows */
	assert_int_equal(delta_publish(f, t, 250, 130, a.key, 1, 2, &b, &refused, &st),
	                 STATUS_CORRUPT);
	assert_true(refused);
	if (!strstr(st.message, "damaged on disk") || !strstr(st.message, "block 0 of layer") ||
	    !strstr(st.message, "quarantined"))
		fail_msg("message: %s", st.message);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.corrupt, 1);
	assert_int_equal(stats.quarantined, 1);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.blocks, 2);
	/* and the base, found damaged by the check that followed, is out of service */
	assert_int_equal(store_restore(f->st, a.key, &snap, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "quarantined"));
}

/* A delta through a moving window smaller than its new rows, from a row
 * inside one of the base's blocks: the base's rows come from the map, each
 * new byte is read only while it is in the window, the entry comes back
 * byte for byte (after a restart too) and every row is stored once. */
static void test_window_delta_reads_each_byte_in_its_window(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = wide_store(f);
	uint32_t t[700];
	seq(t, 700, 300);
	struct storeutil_snap a = storeutil_conv_snap(m, 300, 1, 3);
	struct storeutil_snap b = storeutil_conv_snap(m, 700, 1, 4); /* a's rows, and more */
	struct storeutil_snap c = storeutil_conv_snap(m, 650, 1, 5);
	struct store_publish_res ra = {0}, rb = {0}, rc = {0};
	struct status st = {0};
	int refused = 1;
	assert_int_equal(window_publish(f->st, m, t, 300, &a, 3u << 20, &ra, &st), STATUS_OK);
	/* 400 new rows: 3.7 MB, the k rows alone more than the window */
	assert_int_equal(
	        window_delta(f->st, m, t, 700, &b, ra.key, 300, 3u << 20, &rb, &refused, &st),
	        STATUS_OK);
	assert_false(refused);
	assert_false(rb.delta_refused);
	assert_true(rb.created);
	/* from fewer rows than the base holds, inside its block 3 */
	assert_int_equal(
	        window_delta(f->st, m, t, 650, &c, ra.key, 200, 3u << 20, &rc, &refused, &st),
	        STATUS_OK);
	assert_true(rc.created);
	struct store_snapshot *snap;
	const struct store_publish_res *keys[] = {&ra, &rb, &rc};
	const struct storeutil_snap *want[] = {&a, &b, &c};
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 3; i++) {
			assert_int_equal(store_restore(f->st, keys[i]->key, &snap, &st), STATUS_OK);
			expect_same_layers(snap, want[i]);
			store_snapshot_release(snap);
		}
		struct store_stats stats;
		store_get_stats(f->st, &stats, NULL);
		assert_int_equal(stats.entries, 3);
		assert_int_equal(stats.blocks, 700 / STORE_DEFAULT_ROW_BLOCK);
		assert_int_equal(stats.blocks_mismatched, 0);
		assert_int_equal(stats.staging, 0);
		uint64_t checked, damaged;
		assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st),
		                 STATUS_OK);
		assert_int_equal(damaged, 0);
		assert_int_equal(reopen_staged(f, 0), 0); /* and after a restart */
	}
	storeutil_snap_free(&c);
	storeutil_snap_free(&b);
	storeutil_snap_free(&a);
	model_free(m);
}

/* The store holds this many entries and blocks, and no publish is staging. */
static void expect_entries_blocks(struct fixture *f, uint64_t entries, uint64_t blocks)
{
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, entries);
	assert_int_equal(stats.blocks, blocks);
	assert_int_equal(stats.staging, 0);
}

/* Deltas of many shapes through a 3 MiB window, all restored byte for
 * byte: MLA layers first, last and side by side; from row 0, from a block
 * boundary, from inside a block or the tail; bases and snapshots of fewer
 * rows than a block (from an independent review). */
static void test_window_delta_shapes(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(reopen_staged(f, 0), 0);
	const struct model_layer layers[] = {
	        {.mixer = MODEL_MIXER_MLA, .k_row = 512, .v_row = 64},
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 300000},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 1024, .v_row = 128},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 512, .v_row = 64},
	};
	char merr[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_new("shapes", "test", "test-layout", layers, 4, merr);
	assert_non_null(m);
	assert_int_equal(store_put_model(f->st, m, NULL, NULL), STATUS_OK);
	const struct {
		uint32_t pb, p, r;
	} cases[] = {
	        {300, 700, 300},  {300, 700, 0},   {300, 700, 256},  {300, 640, 300},
	        {650, 700, 650},  {660, 700, 645}, {64, 1000, 64},   {1, 1000, 1},
	        {300, 1300, 299}, {640, 700, 640}, {700, 1400, 700}, {130, 2000, 65},
	        {20, 50, 20},     {20, 50, 10},    {1, 63, 1},       {40, 63, 0},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		uint32_t t[2000];
		seq(t, 2000, 1000 + (uint32_t)c * 7);
		struct storeutil_snap a = storeutil_conv_snap(m, cases[c].pb, 1, 3);
		struct storeutil_snap b = storeutil_conv_snap(m, cases[c].p, 1, 4);
		struct store_publish_res ra = {0}, rb = {0};
		struct status st = {0};
		int refused = 0;
		assert_int_equal(window_publish(f->st, m, t, cases[c].pb, &a, 3u << 20, &ra, &st),
		                 STATUS_OK);
		enum status_code code = window_delta(f->st, m, t, cases[c].p, &b, ra.key,
		                                     cases[c].r, 3u << 20, &rb, &refused, &st);
		if (code != STATUS_OK || !rb.created)
			fail_msg("case %zu (base %u, %u rows from %u): code %d: %s", c, cases[c].pb,
			         cases[c].p, cases[c].r, code, st.message);
		struct store_snapshot *snap;
		assert_int_equal(store_restore(f->st, rb.key, &snap, &st), STATUS_OK);
		expect_same_layers(snap, &b);
		store_snapshot_release(snap);
		uint64_t checked, damaged;
		assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, &st),
		                 STATUS_OK);
		assert_int_equal(damaged, 0);
		storeutil_snap_free(&b);
		storeutil_snap_free(&a);
	}
	model_free(m);
}

/* A payload whose chunks lie apart in it (each MLA layer's header words and
 * tail around its blocks) more often than there are buffers to copy them
 * aside: the scan waits for a buffer while the writer waits for a whole
 * stage of hashed chunks. The writer must write what is hashed, so both
 * move; before, a whole publish and a delta never answered (from an
 * independent review). */
static void test_window_publish_many_chunks_apart(void **state)
{
	struct fixture *f = *state;
	store_close(f->st);
	struct store_options o = {
	        .durability = STORE_SAFE, .stage_bytes = 4u << 20, .clock = fake_clock};
	struct status s;
	assert_int_equal(store_open(f->dir, &o, &f->st, &s), STATUS_OK);
	const struct model_layer layers[] = {
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 300000},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 4096, .v_row = 4096},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 4096, .v_row = 4096},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 4096, .v_row = 4096},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 4096, .v_row = 4096},
	};
	char merr[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_new("apart", "test", "test-layout", layers, 5, merr);
	assert_non_null(m);
	assert_int_equal(store_put_model(f->st, m, NULL, NULL), STATUS_OK);
	uint32_t t[400];
	seq(t, 400, 4242);
	struct storeutil_snap a = storeutil_conv_snap(m, 127, 1, 3);
	struct storeutil_snap b = storeutil_conv_snap(m, 250, 1, 4);
	struct store_publish_res ra = {0}, rb = {0};
	struct status st = {0};
	int refused = 0;
	assert_int_equal(window_publish(f->st, m, t, 127, &a, 12u << 20, &ra, &st), STATUS_OK);
	assert_int_equal(
	        window_delta(f->st, m, t, 250, &b, ra.key, 100, 12u << 20, &rb, &refused, &st),
	        STATUS_OK);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, ra.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &a);
	store_snapshot_release(snap);
	assert_int_equal(store_restore(f->st, rb.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &b);
	store_snapshot_release(snap);
	storeutil_snap_free(&b);
	storeutil_snap_free(&a);
	model_free(m);
}

/* A windowed delta whose stage cannot be written (a map too small, and the
 * delta's own base holding the pages eviction would free) fails while its
 * payload still arrives. The bytes it hands back (made unreadable here, as
 * the daemon's window does) must never be read after: before, the scan
 * read on into them and the daemon crashed (from an independent review).
 * Nothing of it is stored. */
static void test_window_delta_write_failure_reads_nothing_after(void **state)
{
	struct fixture *f = *state;
	store_close(f->st);
	struct store_options o = {.max_bytes = UINT64_C(1) << 40,
	                          .map_size = 20u << 20,
	                          .durability = STORE_SAFE,
	                          .stage_bytes = 256u << 10,
	                          .clock = fake_clock};
	struct status s;
	assert_int_equal(store_open(f->dir, &o, &f->st, &s), STATUS_OK);
	struct k3cache_model *m = wide_model();
	assert_int_equal(store_put_model(f->st, m, NULL, NULL), STATUS_OK);
	uint32_t t[700];
	seq(t, 700, 900);
	struct storeutil_snap a = storeutil_conv_snap(m, 300, 1, 3);
	struct storeutil_snap b = storeutil_conv_snap(m, 700, 1, 4);
	struct store_publish_res ra = {0}, rb = {0};
	struct status st = {0};
	int refused = 0;
	struct store_publish_req req = {m->fingerprint, "", 0, t, 300, a.blobs, a.n};
	assert_int_equal(store_publish(f->st, &req, &ra, &st), STATUS_OK);
	enum status_code code =
	        window_delta(f->st, m, t, 700, &b, ra.key, 300, 3u << 20, &rb, &refused, &st);
	assert_int_not_equal(code, STATUS_OK);
	if (!strstr(st.message, "pin"))
		fail_msg("message: %s", st.message);
	assert_false(rb.created);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.staging, 0);
	struct store_snapshot *snap;
	uint8_t key[STORE_KEY_LEN];
	assert_int_equal(prefix_key(m->fingerprint, "", 0, t, 700, key), 0);
	assert_int_equal(store_restore(f->st, key, &snap, &st), STATUS_NOT_FOUND);
	/* the base was evicted for room (the library publishes whole next), or
	 * is served as it was */
	assert_true(stats.entries <= 1);
	if (stats.entries == 1) {
		assert_int_equal(store_restore(f->st, ra.key, &snap, &st), STATUS_OK);
		expect_same_layers(snap, &a);
		store_snapshot_release(snap);
	}
	storeutil_snap_free(&b);
	storeutil_snap_free(&a);
	model_free(m);
}

/* A delta assembled before its rows arrived can only go through a staged
 * publish, whose scan checks those rows: a whole publish of it is refused
 * and stores nothing. */
static void test_unread_delta_refused_by_whole_publish(void **state)
{
	struct fixture *f = *state;
	uint32_t t[300];
	seq(t, 300, 81);
	struct store_publish_res a = {0}, b = {0};
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	struct delta_req d;
	delta_make(f, &d, t, 250, 130, 1, 2);
	struct store_delta asm_;
	struct status st = {0};
	int refused = 0;
	assert_int_equal(
	        store_delta_assemble_unread(f->st, &d.req, a.key, 130, &asm_, &refused, &st),
	        STATUS_OK);
	struct store_publish_req whole = d.req;
	whole.blobs = asm_.blobs;
	assert_int_equal(store_publish(f->st, &whole, &b, &st), STATUS_INVALID);
	if (!strstr(st.message, "published staged only"))
		fail_msg("message: %s", st.message);
	store_delta_free(&asm_);
	delta_free(&d);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
}

/* Sets float `at` of an MLA layer's blob and, with resum, its sum. */
static void poke_row_float(struct storeutil_snap *s, uint32_t layer, size_t at, float x, int resum)
{
	memcpy(s->bufs[layer] + at, &x, 4);
	if (resum)
		s->blobs[layer].xxh3 = checksum_blob(s->bufs[layer], s->blobs[layer].size, layer);
}

/* A NaN among a windowed delta's new rows, k or v, found mid-stream: refused
 * as invalid with the row named (the worker's fault, not the base's), and
 * nothing of it stays. */
static void test_window_delta_nan_in_new_rows_stores_nothing(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = wide_store(f);
	uint32_t t[700];
	seq(t, 700, 400);
	struct storeutil_snap a = storeutil_conv_snap(m, 300, 1, 3);
	struct store_publish_res ra = {0}, rb = {0};
	struct status st = {0};
	int refused;
	assert_int_equal(window_publish(f->st, m, t, 300, &a, 3u << 20, &ra, &st), STATUS_OK);
	const struct {
		size_t at;
		const char *says;
	} cases[] = {
	        {9 + ((size_t)500 * 2048 + 3) * 4, "layer 2: k row 500 holds a NaN"},
	        {13 + (size_t)700 * 2048 * 4 + ((size_t)650 * 256 + 9) * 4,
	         "layer 2: v row 650 holds a NaN"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct storeutil_snap b = storeutil_conv_snap(m, 700, 1, 4);
		poke_row_float(&b, 2, cases[i].at, __builtin_nanf(""), 1);
		assert_int_equal(window_delta(f->st, m, t, 700, &b, ra.key, 300, 3u << 20, &rb,
		                              &refused, &st),
		                 STATUS_INVALID);
		if (!strstr(st.message, cases[i].says))
			fail_msg("message: %s", st.message);
		assert_false(refused);
		assert_false(rb.delta_refused);
		expect_entries_blocks(f, 1, 300 / STORE_DEFAULT_ROW_BLOCK);
		storeutil_snap_free(&b);
	}
	storeutil_snap_free(&a);
	model_free(m);
}

/* A windowed delta whose assembled layer does not hash to the sum given,
 * found only once its last row is in: refused for a whole publish
 * (res.delta_refused), nothing stored. A sound base stays in service; a
 * base whose shared block is damaged on disk is taken out of it. */
static void test_window_delta_wrong_sum_refused(void **state)
{
	struct fixture *f = *state;
	struct k3cache_model *m = wide_store(f);
	uint32_t t[700];
	seq(t, 700, 500);
	struct storeutil_snap a = storeutil_conv_snap(m, 300, 1, 3);
	struct store_publish_res ra = {0}, rb = {0};
	struct status st = {0};
	int refused;
	assert_int_equal(window_publish(f->st, m, t, 300, &a, 3u << 20, &ra, &st), STATUS_OK);
	struct storeutil_snap b = storeutil_conv_snap(m, 700, 1, 4);
	poke_row_float(&b, 2, 9 + (size_t)600 * 2048 * 4, 7.25f, 0); /* sum left as it was */
	assert_int_equal(
	        window_delta(f->st, m, t, 700, &b, ra.key, 300, 3u << 20, &rb, &refused, &st),
	        STATUS_INVALID);
	assert_true(rb.delta_refused);
	if (!strstr(st.message, "hashes to") || !strstr(st.message, "hold their checksums"))
		fail_msg("message: %s", st.message);
	expect_entries_blocks(f, 1, 300 / STORE_DEFAULT_ROW_BLOCK);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, ra.key, &snap, &st), STATUS_OK);
	expect_same_layers(snap, &a);
	store_snapshot_release(snap);
	storeutil_snap_free(&b);

	/* the base's block 0 damaged, its sum kept: the right rows hash wrong,
	 * and the base's own sums say it is the store's damage */
	flip_model_block_byte(f, m->fingerprint, t, 1, 3);
	b = storeutil_conv_snap(m, 700, 1, 4);
	assert_int_equal(
	        window_delta(f->st, m, t, 700, &b, ra.key, 300, 3u << 20, &rb, &refused, &st),
	        STATUS_CORRUPT);
	assert_true(rb.delta_refused);
	if (!strstr(st.message, "damaged on disk"))
		fail_msg("message: %s", st.message);
	assert_int_equal(store_restore(f->st, ra.key, &snap, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "quarantined"));
	storeutil_snap_free(&b);
	storeutil_snap_free(&a);
	model_free(m);
}

/* A shared block damaged on disk: each deferred restore finds exactly that
 * piece; the first restore that checks it quarantines every entry that uses
 * the block, so none is served. */
static void test_damaged_block_refused(void **state)
{
	struct fixture *f = *state;
	uint32_t t[200];
	seq(t, 200, 5);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 100, 1, 1, &a), STATUS_OK);
	assert_int_equal(conv_publish(f, t, 180, 1, 2, &b), STATUS_OK);
	/* flip a byte of block 0's k rows (layer 2), keeping its stored sum */
	flip_block_byte(f, t, 0, 1);
	struct store_snapshot *snap;
	struct status st;
	int refused = 0;
	for (int e = 0; e < 2; e++) {
		const uint8_t *key = e ? b.key : a.key;
		/* deferred, as the daemon sends: exactly that piece fails */
		assert_int_equal(store_restore_opt(f->st, key, STORE_RESTORE_DEFER, &snap, &st),
		                 STATUS_OK);
		int bad = 0;
		for (uint64_t c = 0; c < store_snapshot_chunks(snap); c++) {
			const void *data;
			size_t len;
			if (store_snapshot_chunk(snap, c, &data, &len, &st) != STATUS_OK) {
				assert_non_null(strstr(st.message, "block 0 of layer 2 (k rows)"));
				bad++;
			}
		}
		store_snapshot_release(snap);
		assert_int_equal(bad, 1);
		refused++;
	}
	assert_int_equal(refused, 2); /* both use block 0 */
	/* a restore that finds the damage takes every user out of service */
	assert_int_equal(store_restore(f->st, a.key, &snap, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "block 0 of layer 2"));
	assert_non_null(strstr(st.message, "quarantined, with 1 other entry that uses the block"));
	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, b.key, &info, NULL), STATUS_OK);
	assert_true(info->quarantined);
	store_entry_info_free(info);
	assert_int_equal(store_restore(f->st, b.key, &snap, &st), STATUS_CORRUPT);
	/* and neither is served any more */
	uint32_t q[200];
	memcpy(q, t, sizeof(q));
	assert_int_equal(storeutil_lookup(f->st, f->m, "", q, 200, 0, NULL), 0);
}

struct verify_log {
	int entries, blocks;
	char last_block[STATUS_MESSAGE_MAX];
};

static void verify_log_cb(const uint8_t *key, const char *why, void *ctx)
{
	struct verify_log *l = ctx;
	if (key) {
		l->entries++;
		return;
	}
	l->blocks++;
	snprintf(l->last_block, sizeof(l->last_block), "%s", why);
}

/* verify checks the shared blocks: a wrong reference count and an orphan
 * part are reported (with no entry key); a damaged block takes every entry
 * that uses it out of service. */
static void test_verify_checks_blocks(void **state)
{
	struct fixture *f = *state;
	uint32_t t[200];
	seq(t, 200, 900);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 100, 1, 1, &a), STATUS_OK);
	assert_int_equal(conv_publish(f, t, 180, 1, 2, &b), STATUS_OK);
	struct verify_log log = {0};
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal(damaged, 0);
	/* block 0 of layer 2 says 5 references (2 entries use it), and a part
	 * of a block nobody counts */
	uint8_t h[5][PREFIX_NODE_LEN];
	prefix_block_hashes(f->m->fingerprint, "", 0, t, 64, h);
	unsigned char rk[STORE_BLOCK_KEY_LEN];
	memcpy(rk, h[64 / PREFIX_BLOCK], PREFIX_NODE_LEN);
	store_be32(rk + PREFIX_NODE_LEN, 2);
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char five[4] = {0, 0, 0, 5};
	MDB_val k = {STORE_BLOCK_REF_LEN, rk}, v = {4, five};
	assert_int_equal(mdb_put(txn, f->st->blockrefs, &k, &v, 0), 0);
	unsigned char ok[STORE_BLOCK_KEY_LEN] = {0xee};
	unsigned char junk[16] = {0};
	MDB_val ok_k = {sizeof(ok), ok}, ok_v = {sizeof(junk), junk};
	assert_int_equal(mdb_put(txn, f->st->blocks, &ok_k, &ok_v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	memset(&log, 0, sizeof(log));
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal(log.entries, 0);
	assert_int_equal(log.blocks, 3);
	assert_int_equal(damaged, 2);
	/* and repaired: the count made again, the part of no block deleted */
	assert_non_null(strstr(log.last_block, "repaired: 2 shared blocks counted again"));
	memset(&log, 0, sizeof(log));
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal(damaged, 0);
	assert_int_equal(log.blocks, 0);
	expect_conv(f, a.key, 100, 1, 1);
	expect_conv(f, b.key, 180, 1, 2);
	/* block 0's k rows damaged: both entries use it, both are taken out */
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char bk[STORE_BLOCK_KEY_LEN];
	memcpy(bk, rk, STORE_BLOCK_REF_LEN);
	bk[STORE_BLOCK_REF_LEN] = 0;
	MDB_val bkv = {sizeof(bk), bk}, bv;
	assert_int_equal(mdb_get(txn, f->st->blocks, &bkv, &bv), 0);
	unsigned char *copy = malloc(bv.mv_size);
	memcpy(copy, bv.mv_data, bv.mv_size);
	copy[bv.mv_size - 2] ^= 1;
	MDB_val nv = {bv.mv_size, copy};
	assert_int_equal(mdb_put(txn, f->st->blocks, &bkv, &nv, 0), 0);
	free(copy);
	assert_int_equal(mdb_txn_commit(txn), 0);
	memset(&log, 0, sizeof(log));
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal(log.entries, 2);
	struct store_entry_info *info;
	for (int e = 0; e < 2; e++) {
		assert_int_equal(store_inspect(f->st, e ? b.key : a.key, &info, NULL), STATUS_OK);
		assert_true(info->quarantined);
		store_entry_info_free(info);
	}
}

/* Counts damaged in their length are repaired as well, among others changed
 * in the same transaction: the first count wrong (changed in place), every
 * other of 3 bytes (resized). Before, the resizing put took its key from the
 * page it moved, so another block's key could be written in its place. */
static void test_verify_repairs_damaged_counts(void **state)
{
	struct fixture *f = *state;
	uint32_t t[300];
	seq(t, 300, 7700);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 150, 1, 1, &a), STATUS_OK);
	assert_int_equal(conv_publish(f, t, 290, 1, 2, &b), STATUS_OK);
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_cursor *cur;
	assert_int_equal(mdb_cursor_open(txn, f->st->blockrefs, &cur), 0);
	MDB_val k, v;
	int n = 0;
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT), n++) {
		unsigned char wrong[4] = {0, 0, 0, 9}, shortv[3] = {0, 0, 1}, key[64];
		assert_true(k.mv_size <= sizeof(key));
		memcpy(key, k.mv_data, k.mv_size); /* a resizing put moves the page */
		MDB_val ck = {k.mv_size, key};
		MDB_val nv = n ? (MDB_val){3, shortv} : (MDB_val){4, wrong};
		assert_int_equal(mdb_cursor_put(cur, &ck, &nv, MDB_CURRENT), 0);
	}
	mdb_cursor_close(cur);
	assert_int_equal(mdb_txn_commit(txn), 0);
	assert_true(n > 2);
	struct verify_log log = {0};
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal((int)damaged, n);
	assert_non_null(strstr(log.last_block, "repaired:"));
	memset(&log, 0, sizeof(log));
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	if (damaged)
		print_message("after the repair: %s\n", log.last_block);
	assert_int_equal(damaged, 0);
	expect_conv(f, a.key, 150, 1, 1);
	expect_conv(f, b.key, 290, 1, 2);
	struct store_evict_req er = {.all = 1};
	struct store_evict_res eres;
	assert_int_equal(store_evict(f->st, &er, NULL, NULL, &eres, NULL), STATUS_OK);
	struct store_stats after;
	assert_int_equal(store_get_stats(f->st, &after, NULL), STATUS_OK);
	assert_int_equal(after.blocks, 0);
	assert_int_equal(after.bytes, 0);
}

/* An entry whose record is damaged is removed without giving back its
 * references to shared blocks (its map is in the record). Before, those
 * blocks stayed for ever: their bytes counted against the capacity after
 * every entry was evicted, and every verify reported their counts. Verify
 * now makes the counts again from the entries once none is unreadable. */
static void test_verify_repairs_counts_a_damaged_record_left(void **state)
{
	struct fixture *f = *state;
	uint32_t t[200];
	seq(t, 200, 4400);
	struct store_publish_res a, b;
	assert_int_equal(conv_publish(f, t, 130, 1, 1, &a), STATUS_OK);
	assert_int_equal(conv_publish(f, t, 180, 1, 2, &b), STATUS_OK); /* shares a's blocks */
	struct store_stats before;
	assert_int_equal(store_get_stats(f->st, &before, NULL), STATUS_OK);
	assert_true(before.blocks > 0);
	/* a's record damaged (its version word): restored, it is removed */
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_val k = {STORE_KEY_LEN, a.key}, v;
	assert_int_equal(mdb_get(txn, f->st->entries, &k, &v), 0);
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[0] = 9;
	MDB_val nv = {v.mv_size, copy};
	assert_int_equal(mdb_put(txn, f->st->entries, &k, &nv, 0), 0);
	free(copy);
	assert_int_equal(mdb_txn_commit(txn), 0);
	struct store_snapshot *snap;
	struct status st;
	assert_int_equal(store_restore(f->st, a.key, &snap, &st), STATUS_CORRUPT);
	assert_int_equal(store_quarantine(f->st, a.key), STORE_QUARANTINE_REMOVED);
	/* b still restores, its blocks now counted once too many */
	expect_conv(f, b.key, 180, 1, 2);
	struct verify_log log = {0};
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_true(damaged > 0);
	assert_non_null(strstr(log.last_block, "repaired:"));
	memset(&log, 0, sizeof(log));
	assert_int_equal(store_verify(f->st, verify_log_cb, &log, &checked, &damaged, NULL),
	                 STATUS_OK);
	assert_int_equal(damaged, 0);
	expect_conv(f, b.key, 180, 1, 2);
	/* b evicted: nothing is left */
	struct store_evict_req er = {.all = 1};
	struct store_evict_res eres;
	assert_int_equal(store_evict(f->st, &er, NULL, NULL, &eres, NULL), STATUS_OK);
	struct store_stats after;
	assert_int_equal(store_get_stats(f->st, &after, NULL), STATUS_OK);
	assert_int_equal(after.entries, 0);
	assert_int_equal(after.blocks, 0);
	assert_int_equal(after.bytes, 0);
	assert_int_equal(store_verify(f->st, NULL, NULL, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 0);
}

/* A format-1 store made by the code before blocks (tests/fixtures/store-v1,
 * see make.c there): read as it is when opened read-only, upgraded in place
 * when opened to write, never wiped, and every entry restores byte for byte
 * either way. */
static void check_v1_entries(struct store *st, const struct k3cache_model *m)
{
	uint32_t t[200];
	for (uint32_t i = 0; i < 200; i++)
		t[i] = 1000 + i * 7;
	const uint32_t ps[] = {40, 100, 170, 150};
	for (int e = 0; e < 4; e++) {
		const char *salt = e == 3 ? "tenant" : "";
		if (e == 3)
			t[120] = 5;
		uint8_t key[STORE_KEY_LEN];
		prefix_key(m->fingerprint, salt, strlen(salt), t, ps[e], key);
		struct storeutil_snap want = storeutil_snap(m, ps[e], 1);
		struct store_snapshot *snap;
		struct status status;
		if (store_restore_opt(st, key, 0, &snap, &status) != STATUS_OK)
			fail_msg("entry %d: %s", e, status.message);
		expect_same_layers(snap, &want);
		store_snapshot_release(snap);
		storeutil_snap_free(&want);
	}
}

static void test_v1_store_upgraded(void **state)
{
	struct fixture *f = *state;
	store_close(f->st);
	f->st = NULL;
	char from[1024], to[1024];
	snprintf(from, sizeof(from), "%s/store-v1/data.mdb", K3_FIXTURES);
	snprintf(to, sizeof(to), "%s/data.mdb", f->dir);
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	assert_non_null(in);
	assert_non_null(out);
	unsigned char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		assert_int_equal(fwrite(buf, 1, n, out), n);
	fclose(in);
	assert_int_equal(fclose(out), 0);
	struct k3cache_model *m = storeutil_model("v1-fixture", 16);
	struct store_options ro = {.read_only = 1};
	struct status st;
	assert_int_equal(store_open(f->dir, &ro, &f->st, &st), STATUS_OK);
	check_v1_entries(f->st, m);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 4);
	assert_int_equal(stats.logical_bytes, stats.bytes);
	store_close(f->st);
	/* read-write: upgraded */
	assert_int_equal(open_store(f, 0, 0), 0);
	check_v1_entries(f->st, m);
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, MDB_RDONLY, &txn), 0);
	MDB_val k = {6, "format"}, v;
	assert_int_equal(mdb_get(txn, f->st->meta, &k, &v), 0);
	assert_int_equal(store_get_be32(v.mv_data), STORE_FORMAT_VERSION);
	mdb_txn_abort(txn);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 4);
	uint64_t v1_bytes = stats.bytes;
	/* the conversation goes on: a new turn stores its blocks */
	uint32_t t[300];
	for (uint32_t i = 0; i < 300; i++)
		t[i] = 1000 + i * 7;
	assert_int_equal(storeutil_publish(f->st, m, "", t, 260, 1, NULL), STATUS_OK);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 5);
	assert_true(stats.blocks > 0);
	assert_true(stats.bytes > v1_bytes);
	/* and an upgraded store opens again as version 2 */
	store_close(f->st);
	assert_int_equal(open_store(f, 0, 0), 0);
	check_v1_entries(f->st, m);
	model_free(m);
}

/* ---- eviction and capacity ------------------------------------------------ */

static uint64_t entry_bytes(const struct k3cache_model *m, uint32_t p)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < m->n_layers; i++)
		b += model_layer_blob_size(&m->layers[i], p);
	return b;
}

static void test_lru_order_and_capacity(void **state)
{
	struct fixture *f = *state;
	uint64_t one = entry_bytes(f->m, 20);
	store_close(f->st);
	assert_int_equal(open_store(f, one * 3, 0), 0);
	uint32_t t[5][21];
	for (uint32_t e = 0; e < 5; e++) {
		seq(t[e], 21, 100 * e);
		t[e][20] = 1;
	}
	for (uint32_t e = 0; e < 3; e++)
		assert_int_equal(storeutil_publish(f->st, f->m, "", t[e], 20, e, NULL), STATUS_OK);
	/* use entry 0: entry 1 is now the least recently used */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[0], 21, 0, NULL), 20);
	struct store_publish_res res;
	assert_int_equal(storeutil_publish(f->st, f->m, "", t[3], 20, 3, &res), STATUS_OK);
	assert_int_equal(res.evicted, 1);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[1], 21, 0, NULL), 0);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[0], 21, 0, NULL), 20);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t[4], 20, 4, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[2], 21, 0, NULL), 0);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 3);
	assert_true(stats.bytes <= one * 3);
	assert_int_equal(stats.evictions, 2);
	/* an entry larger than the whole capacity is refused, and evicts nothing */
	struct k3cache_model *big = storeutil_model("big", 100000);
	store_put_model(f->st, big, NULL, NULL);
	assert_int_equal(storeutil_publish(f->st, big, "", t[0], 20, 1, NULL), STATUS_TOO_LARGE);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 3);
	model_free(big);
}

/* Rewrites the record of key in place through LMDB: with a salt of salt_len
 * bytes (the rest as stored), or cut to its first `cut` bytes. */
static void damage_record(struct fixture *f, const uint8_t *key, uint32_t salt_len, size_t cut)
{
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	assert_int_equal(mdb_get(txn, f->st->entries, &k, &v), 0);
	struct store_record r;
	assert_int_equal(store_record_decode(v.mv_data, v.mv_size, &r), 0);
	uint8_t tags[8];
	uint64_t sizes[8], sums[8];
	for (uint32_t i = 0; i < r.n_layers; i++)
		store_record_layer(&r, i, &tags[i], &sizes[i], &sums[i]);
	unsigned char *salt = calloc(1, salt_len + 1u);
	r.salt_len = salt_len;
	r.salt = salt;
	size_t len = store_record_size(salt_len, r.n_layers, r.map_len);
	unsigned char *enc = malloc(len);
	store_record_encode(&r, tags, sizes, sums, enc);
	MDB_val nv = {cut ? cut : len, enc};
	assert_int_equal(mdb_put(txn, f->st->entries, &k, &nv, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	free(enc);
	free(salt);
}

static uint64_t stored_chunks(struct fixture *f, const uint8_t *key)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, f->st->chunks, &cur), 0);
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, key, STORE_KEY_LEN);
	MDB_val k = {sizeof(ck), ck}, v;
	uint64_t n = 0;
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	     rc == 0 && !memcmp(k.mv_data, key, STORE_KEY_LEN);
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
		n++;
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return n;
}

/* Damaged records at the head of the LRU: one whose salt is longer than any
 * publish may have, one cut short. Eviction removes them (their chunks and
 * bytes too) and goes on; an explicit evict removes one as well. */
static void test_damaged_records_do_not_jam_eviction(void **state)
{
	struct fixture *f = *state;
	uint64_t one = entry_bytes(f->m, 20);
	store_close(f->st);
	assert_int_equal(open_store(f, one * 3, 0), 0);
	uint32_t t[6][20];
	struct store_publish_res res[6];
	for (uint32_t e = 0; e < 3; e++) {
		seq(t[e], 20, 1000 * e);
		assert_int_equal(storeutil_publish(f->st, f->m, "", t[e], 20, e, &res[e]),
		                 STATUS_OK);
	}
	damage_record(f, res[0].key, 2000, 0);
	damage_record(f, res[1].key, 0, 50);
	for (uint32_t e = 3; e < 5; e++) {
		seq(t[e], 20, 1000 * e);
		assert_int_equal(storeutil_publish(f->st, f->m, "", t[e], 20, e, &res[e]),
		                 STATUS_OK);
	}
	struct store_entry_info *info;
	for (uint32_t e = 0; e < 2; e++) {
		assert_int_equal(store_inspect(f->st, res[e].key, &info, NULL), STATUS_NOT_FOUND);
		assert_int_equal(stored_chunks(f, res[e].key), 0);
	}
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 3);
	assert_int_equal(stats.bytes, one * 3);
	assert_int_equal(stats.evictions, 2);
	/* an explicit evict of a damaged entry */
	damage_record(f, res[3].key, 4096, 0);
	struct store_evict_req req = {
	        .keys = (const uint8_t(*)[STORE_KEY_LEN])res[3].key, .n_keys = 1, .dry_run = 1};
	struct store_evict_res er;
	struct status st;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, &st), STATUS_OK);
	assert_int_equal(er.entries, 1);
	assert_int_equal(er.bytes, one); /* its chunks' bytes, as the real run frees */
	req.dry_run = 0;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, &st), STATUS_OK);
	assert_int_equal(er.entries, 1);
	assert_int_equal(er.bytes, one);
	assert_int_equal(store_inspect(f->st, res[3].key, &info, NULL), STATUS_NOT_FOUND);
	assert_int_equal(stored_chunks(f, res[3].key), 0);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 2);
	assert_int_equal(stats.bytes, one * 2);
	/* a damaged record whose chunk is gone too: its size is known nowhere,
	 * and evict --all leaves no byte of it counted */
	damage_record(f, res[4].key, 0, 60);
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(f->st->env, NULL, 0, &txn), 0);
	unsigned char ck[STORE_CHUNK_KEY_LEN] = {0};
	memcpy(ck, res[4].key, STORE_KEY_LEN);
	MDB_val ckv = {sizeof(ck), ck};
	assert_int_equal(mdb_del(txn, f->st->chunks, &ckv, NULL), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	/* verify takes an unreadable record out of service: it removes it */
	char why[STATUS_MESSAGE_MAX] = "";
	uint64_t checked, damaged;
	assert_int_equal(store_verify(f->st, why_cb, why, &checked, &damaged, NULL), STATUS_OK);
	assert_int_equal(damaged, 1);
	assert_non_null(strstr(why, "record is damaged; the entry is removed"));
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 1);
	assert_int_equal(stats.bytes, one);
	damage_record(f, res[2].key, 0, 60);
	struct store_evict_req all = {.all = 1};
	assert_int_equal(store_evict(f->st, &all, NULL, NULL, &er, &st), STATUS_OK);
	assert_int_equal(er.entries, 1);
	assert_int_equal(er.bytes, one);
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 0);
	assert_int_equal(stats.bytes, 0);
}

/* A map far smaller than the capacity fills up; publishes keep succeeding by
 * evicting, as long as anything can be evicted. */
static void map_full_evicts(struct fixture *f, uint64_t stage_bytes)
{
	store_close(f->st);
	struct store_options o = {.max_bytes = UINT64_C(1) << 40,
	                          .map_size = 6u << 20,
	                          .durability = STORE_FAST,
	                          .stage_bytes = stage_bytes,
	                          .clock = fake_clock};
	assert_int_equal(store_open(f->dir, &o, &f->st, NULL), STATUS_OK);
	struct k3cache_model *big = storeutil_model("big", 150000); /* ~1.8 MB per entry */
	store_put_model(f->st, big, NULL, NULL);
	for (uint32_t e = 0; e < 12; e++) {
		uint32_t t[20];
		seq(t, 20, 100 * e);
		assert_int_equal(storeutil_publish(f->st, big, "", t, 20, e, NULL), STATUS_OK);
		uint32_t p[21];
		memcpy(p, t, sizeof(t));
		p[20] = 0;
		assert_int_equal(storeutil_lookup(f->st, big, "", p, 21, 0, NULL), 20);
	}
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_true(stats.evictions > 0);
	assert_true(stats.map_full_retries > 0);
	assert_int_equal(stats.staging, 0);
	model_free(big);
}

static void test_map_full_evicts(void **state)
{
	map_full_evicts(*state, 0); /* one commit per entry */
}

/* The same with every entry staged (stages of 256 KiB): a stage that finds
 * the map full evicts and retries. */
static void test_map_full_evicts_staged(void **state)
{
	map_full_evicts(*state, 256u << 10);
}

/* A restore in progress pins the pages eviction frees: a publish that finds
 * the map full must say BUSY, not evict the whole store trying. */
static void test_pinned_map_is_busy_not_wiped(void **state)
{
	struct fixture *f = *state;
	store_close(f->st);
	assert_int_equal(open_store(f, UINT64_C(1) << 40, 6u << 20), 0);
	struct k3cache_model *big = storeutil_model("big", 150000); /* ~1.8 MB per entry */
	store_put_model(f->st, big, NULL, NULL);
	struct store_publish_res first;
	uint32_t t0[20];
	seq(t0, 20, 1);
	assert_int_equal(storeutil_publish(f->st, big, "", t0, 20, 0, &first), STATUS_OK);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, first.key, &snap, NULL), STATUS_OK);
	int busy = 0;
	for (uint32_t e = 1; e < 12 && !busy; e++) {
		uint32_t t[20];
		seq(t, 20, 100 * e);
		enum status_code c = storeutil_publish(f->st, big, "", t, 20, e, NULL);
		assert_true(c == STATUS_OK || c == STATUS_BUSY);
		busy = c == STATUS_BUSY;
	}
	assert_true(busy);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_true(stats.entries >= 1); /* not wiped */
	store_snapshot_release(snap);
	uint32_t t[20];
	seq(t, 20, 5000);
	assert_int_equal(storeutil_publish(f->st, big, "", t, 20, 99, NULL), STATUS_OK);
	model_free(big);
}

/* Small entries' tokens: entry e's 20, then one more (a lookup's). */
static void full_map_tokens(uint32_t t[21], uint32_t e)
{
	seq(t, 20, 1000000 + 100 * e);
	t[20] = 0;
}

/* A fresh store of a 6 MiB map with the models "big" (returned, ~1.2 MB an
 * entry) and f->m, and big's first entry (tokens 1..20) published: *first. */
static struct k3cache_model *small_map_store(struct fixture *f, struct store_publish_res *first)
{
	store_close(f->st);
	storeutil_rmdir(f->dir);
	f->dir = storeutil_tmpdir();
	assert_int_equal(open_store(f, UINT64_C(1) << 40, 6u << 20), 0);
	struct k3cache_model *big = storeutil_model("big", 150000);
	assert_int_equal(store_put_model(f->st, big, NULL, NULL), STATUS_OK);
	assert_int_equal(store_put_model(f->st, f->m, NULL, NULL), STATUS_OK);
	uint32_t t[20];
	seq(t, 20, 1);
	assert_int_equal(storeutil_publish(f->st, big, "", t, 20, 0, first), STATUS_OK);
	return big;
}

/* Fills the small map of small_map_store while readers hold the pages
 * eviction would free, until not even a small publish fits: big entries,
 * then small ones (full_map_tokens, *small of them tried). The last
 * publish's code, its message in *st. */
static enum status_code fill_pinned_map(struct fixture *f, const struct k3cache_model *big,
                                        uint32_t *small, struct status *st)
{
	uint32_t t[21];
	enum status_code c = STATUS_OK;
	for (uint32_t e = 1; e < 64 && c == STATUS_OK; e++) {
		seq(t, 20, 100 * e);
		c = storeutil_publish_st(f->st, big, "", t, 20, e, NULL, st);
	}
	c = STATUS_OK;
	for (*small = 0; c == STATUS_OK && *small < 4096; (*small)++) {
		full_map_tokens(t, *small);
		c = storeutil_publish_st(f->st, f->m, "", t, 20, *small, NULL, st);
	}
	return c;
}

/* A store whose map is full: a restore in progress pins the pages eviction
 * frees, and publishes, big then small, are refused for room until not even
 * a small one fits. There, with uses held in memory that reorder the LRU,
 * `evict --dry-run` must answer as the real evict then does (once the
 * restore has ended: while it pins the pages, the real one cannot delete
 * either), entries, order and bytes, and write nothing. Before, the dry run
 * first wrote those uses, and failed: "flush: the store's map is full". Then
 * --idle, whose uses held in memory say which entries were used lately. */
static void test_evict_dry_run_on_a_full_map(void **state)
{
	struct fixture *f = *state;
	uint32_t t[21];
	struct store_publish_res first;
	struct k3cache_model *big = small_map_store(f, &first);
	struct store_snapshot *snap;
	assert_int_equal(store_restore(f->st, first.key, &snap, NULL), STATUS_OK);
	uint32_t small;
	struct status fst;
	assert_int_equal(fill_pinned_map(f, big, &small, &fst), STATUS_BUSY);
	/* uses held in memory: the small entries, newest first, which turns
	 * their LRU order round */
	uint32_t hit = 0;
	for (uint32_t e = small; e-- > 0;) {
		full_map_tokens(t, e);
		hit += storeutil_lookup(f->st, f->m, "", t, 21, 0, NULL) == 20;
	}
	assert_true(hit >= 4);
	struct store_stats before, after;
	store_get_stats(f->st, &before, NULL);
	struct store_evict_req req = {
	        .to_bytes_set = 1, .to_bytes = before.bytes / 2, .dry_run = 1};
	struct evict_log dry = {0}, real = {0};
	struct store_evict_res dres, rres;
	struct status st = {0};
	if (store_evict(f->st, &req, evict_log_cb, &dry, &dres, &st) != STATUS_OK)
		fail_msg("evict --to-size --dry-run on a full map: %s", st.message);
	store_get_stats(f->st, &after, NULL);
	assert_int_equal(after.entries, before.entries);
	assert_int_equal(after.bytes, before.bytes);
	assert_int_equal(after.map_used_pages, before.map_used_pages);
	assert_int_equal(after.free_pages, before.free_pages);
	store_snapshot_release(snap);
	req.dry_run = 0;
	assert_int_equal(store_evict(f->st, &req, evict_log_cb, &real, &rres, &st), STATUS_OK);
	store_get_stats(f->st, &after, NULL);
	assert_true(rres.entries >= 2);
	assert_int_equal(rres.bytes, before.bytes - after.bytes);
	expect_same_evictions(&dry, &dres, &real, &rres);

	/* --idle: one entry used a moment ago, held in memory, the rest long
	 * before: a dry run names all but that one, as the real evict does */
	fake_now += 1000;
	uint32_t e = 0;
	for (full_map_tokens(t, e); storeutil_lookup(f->st, f->m, "", t, 21, 0, NULL) != 20;)
		full_map_tokens(t, ++e);
	fake_now += 10;
	expect_dry_as_real(f, (struct store_evict_req){.idle_seconds = 60},
	                   (uint32_t)after.entries - 1);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t, 21, 0, NULL), 20);
	model_free(big);
}

/* A publish refused because readers pin the pages eviction would free says
 * so and is BUSY (retry), whether the reader is a restore of this process
 * or one in another process (a direct reader's view): entries are still
 * there to evict. Before, once eviction's own write failed for want of
 * pages, it said FULL, "the store is full and nothing is left to evict". */
static void test_publish_refused_by_pinned_map_says_so(void **state)
{
	struct fixture *f = *state;
	for (int other = 0; other < 2; other++) {
		struct store_publish_res first;
		struct k3cache_model *big = small_map_store(f, &first);
		struct store_snapshot *snap = NULL;
		int to_child[2], from_child[2];
		pid_t pid = -1;
		if (!other) {
			assert_int_equal(store_restore(f->st, first.key, &snap, NULL), STATUS_OK);
		} else { /* a reader of its own environment, as a direct reader is */
			assert_int_equal(pipe(to_child), 0);
			assert_int_equal(pipe(from_child), 0);
			pid = fork();
			assert_true(pid >= 0);
			if (pid == 0) {
				struct store *ro;
				struct store_options o = {.read_only = 1};
				struct status s;
				char c = 'x';
				close(to_child[1]);
				if (store_open(f->dir, &o, &ro, &s) != STATUS_OK ||
				    store_restore(ro, first.key, &snap, &s) != STATUS_OK)
					c = 'e';
				if (write(from_child[1], &c, 1) != 1 ||
				    read(to_child[0], &c, 1) < 0)
					_exit(2);
				_exit(0); /* holding the snapshot to the end */
			}
			char c = 0;
			close(to_child[0]);
			assert_int_equal(read(from_child[0], &c, 1), 1);
			assert_int_equal(c, 'x');
		}
		struct status st = {0};
		uint32_t small;
		enum status_code c = fill_pinned_map(f, big, &small, &st);
		struct store_stats stats;
		store_get_stats(f->st, &stats, NULL);
		if (snap)
			store_snapshot_release(snap);
		if (pid > 0) {
			close(to_child[1]);
			int ws;
			assert_int_equal(waitpid(pid, &ws, 0), pid);
			close(from_child[0]);
			close(from_child[1]);
		}
		if (c != STATUS_BUSY || !strstr(st.message, "pin") ||
		    strstr(st.message, "nothing is left"))
			fail_msg("%s: %s: %s", other ? "a reader in another process" : "a restore",
			         status_code_name(c), st.message);
		if (stats.entries < 2) /* evicting more would not have made room */
			fail_msg("%s: the store was emptied trying (%llu entries left)",
			         other ? "a reader in another process" : "a restore",
			         (unsigned long long)stats.entries);
		model_free(big);
	}
}

/* A batch larger than the capacity is published one by one, and the store
 * stays within its capacity. */
static void test_batch_over_capacity(void **state)
{
	struct fixture *f = *state;
	uint64_t one = entry_bytes(f->m, 20);
	store_close(f->st);
	assert_int_equal(open_store(f, one * 2 + one / 2, 0), 0);
	struct storeutil_snap s = storeutil_snap(f->m, 20, 1);
	uint32_t toks[4][20];
	struct store_publish_req reqs[4];
	struct store_publish_res res[4];
	for (uint32_t i = 0; i < 4; i++) {
		seq(toks[i], 20, 1000 * i);
		reqs[i] = (struct store_publish_req){f->m->fingerprint, "", 0, toks[i], 20,
		                                     s.blobs,           s.n};
	}
	assert_int_equal(store_publish_batch(f->st, reqs, res, NULL, 4), STATUS_OK);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 2);
	assert_true(stats.bytes <= one * 2 + one / 2);
	/* the newest two are the ones kept */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", toks[3], 20, 20, NULL), 20);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", toks[0], 20, 20, NULL), 0);
	storeutil_snap_free(&s);
}

/* ---- administration ------------------------------------------------------- */

static void count_cb(const uint8_t *key, uint64_t bytes, void *ctx)
{
	(void)key;
	(void)bytes;
	(*(int *)ctx)++;
}

static int list_cb(const struct store_entry_info *info, void *ctx)
{
	(void)info;
	(*(int *)ctx)++;
	return 0;
}

static void test_evict_selectors(void **state)
{
	struct fixture *f = *state;
	uint32_t t[6][20];
	struct store_publish_res res[6];
	for (uint32_t e = 0; e < 6; e++) {
		seq(t[e], 20, 1000 * e);
		fake_now = 1000000 + e * 100;
		assert_int_equal(
		        storeutil_publish(f->st, e < 4 ? f->m : f->m2, "", t[e], 20, e, &res[e]),
		        STATUS_OK);
	}
	fake_now = 1000600;
	struct store_evict_res er;
	int seen = 0;
	/* dry run changes nothing */
	struct store_evict_req req = {.model = f->m2->fingerprint, .dry_run = 1};
	assert_int_equal(store_evict(f->st, &req, count_cb, &seen, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 2);
	assert_int_equal(seen, 2);
	int listed = 0;
	store_list(f->st, NULL, NULL, 0, list_cb, &listed, NULL);
	assert_int_equal(listed, 6);
	/* by model */
	req.dry_run = 0;
	assert_int_equal(store_evict(f->st, &req, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 2);
	/* by key */
	struct store_evict_req kreq = {.keys = (const uint8_t(*)[32])res[0].key, .n_keys = 1};
	assert_int_equal(store_evict(f->st, &kreq, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 1);
	assert_int_equal(store_evict(f->st, &kreq, NULL, NULL, &er, NULL), STATUS_NOT_FOUND);
	/* idle: entries 1..3 were last used at +100, +200, +300; now is +600 */
	struct store_evict_req ireq = {.idle_seconds = 450};
	assert_int_equal(store_evict(f->st, &ireq, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 1); /* entry 1 (idle 500); 2 and 3 are idle 400, 300 */
	/* to size: down to one entry's bytes */
	struct store_evict_req sreq = {.to_bytes_set = 1, .to_bytes = entry_bytes(f->m, 20)};
	assert_int_equal(store_evict(f->st, &sreq, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 1);
	assert_int_equal(er.bytes, entry_bytes(f->m, 20));
	listed = 0;
	store_list(f->st, NULL, NULL, 0, list_cb, &listed, NULL);
	assert_int_equal(listed, 1);
	/* all */
	struct store_evict_req areq = {.all = 1};
	assert_int_equal(store_evict(f->st, &areq, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 1);
	struct store_stats stats;
	store_get_stats(f->st, &stats, NULL);
	assert_int_equal(stats.entries, 0);
	assert_int_equal(stats.bytes, 0);
	/* an idle threshold near 2^64 does not wrap around and pick fresh entries */
	struct store_evict_req huge = {.idle_seconds = UINT64_MAX - 5, .dry_run = 1};
	assert_int_equal(store_evict(f->st, &huge, NULL, NULL, &er, NULL), STATUS_OK);
	assert_int_equal(er.entries, 0);
	/* two selectors at once are refused */
	struct store_evict_req both = {.all = 1, .idle_seconds = 5};
	assert_int_equal(store_evict(f->st, &both, NULL, NULL, &er, NULL), STATUS_INVALID);
	/* nothing dangles in the index: the prompts miss and a republish works */
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[3], 20, 20, NULL), 0);
	assert_int_equal(storeutil_publish(f->st, f->m, "", t[3], 20, 3, NULL), STATUS_OK);
	assert_int_equal(storeutil_lookup(f->st, f->m, "", t[3], 20, 20, NULL), 20);
}

static void test_list_inspect_resolve(void **state)
{
	struct fixture *f = *state;
	uint32_t t[40];
	seq(t, 40, 1);
	struct store_publish_res r1, r2;
	assert_int_equal(storeutil_publish(f->st, f->m, "salt", t, 30, 1, &r1), STATUS_OK);
	assert_int_equal(storeutil_publish(f->st, f->m2, "", t, 12, 1, &r2), STATUS_OK);
	int listed = 0;
	store_list(f->st, f->m->fingerprint, NULL, 0, list_cb, &listed, NULL);
	assert_int_equal(listed, 1);
	listed = 0;
	store_list(f->st, NULL, NULL, 1, list_cb, &listed, NULL);
	assert_int_equal(listed, 1);
	/* a cursor after the first key gives the second */
	const uint8_t *first = memcmp(r1.key, r2.key, 32) < 0 ? r1.key : r2.key;
	listed = 0;
	store_list(f->st, NULL, first, 0, list_cb, &listed, NULL);
	assert_int_equal(listed, 1);

	struct store_entry_info *info;
	assert_int_equal(store_inspect(f->st, r1.key, &info, NULL), STATUS_OK);
	assert_int_equal(info->prefix_len, 30);
	assert_int_equal(info->n_layers, 4);
	assert_int_equal(info->salt_len, 4);
	assert_memory_equal(info->salt, "salt", 4);
	assert_int_equal(info->tokens[29], 30);
	assert_int_equal(info->layers[2].tag, 2);
	assert_int_equal(info->bytes, entry_bytes(f->m, 30));
	store_entry_info_free(info);

	char hex[65];
	static const char digits[] = "0123456789abcdef";
	for (int i = 0; i < 32; i++) {
		hex[(size_t)i * 2] = digits[r1.key[i] >> 4];
		hex[(size_t)i * 2 + 1] = digits[r1.key[i] & 15];
	}
	hex[64] = 0;
	uint8_t got[32];
	hex[10] = 0;
	assert_int_equal(store_resolve_key(f->st, hex, got, NULL), STATUS_OK);
	assert_memory_equal(got, r1.key, 32);
	struct status st;
	assert_int_equal(store_resolve_key(f->st, "zz", got, &st), STATUS_INVALID);
	/* ambiguous: the empty-ish prefix of one digit may name both or one; a
	 * prefix that names no key is NOT_FOUND */
	char none[3] = {hex[0], hex[1], 0};
	none[1] = none[1] == '0' ? '1' : '0';
	enum status_code c = store_resolve_key(f->st, none, got, &st);
	assert_true(c == STATUS_NOT_FOUND || c == STATUS_OK);
	/* publish keys until two share a first digit; that digit is ambiguous */
	for (uint32_t e = 2; e < 40; e++) {
		uint32_t u[5] = {e, e, e, e, e};
		storeutil_publish(f->st, f->m, "", u, 5, e, NULL);
	}
	int ambiguous = 0;
	for (int d = 0; d < 16 && !ambiguous; d++) {
		char one[2] = {digits[d], 0};
		if (store_resolve_key(f->st, one, got, &st) == STATUS_INVALID) {
			ambiguous = 1;
			assert_non_null(strstr(st.message, "ambiguous"));
		}
	}
	assert_true(ambiguous);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_publish_restore_identical, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_large_entry_spans_chunks, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_chunk_put_keeps_a_given_sum, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_staged_publish_restores_identical, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_staged_invalid_stores_nothing, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_staged_capacity_evicts, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_staged_existing_evicts_nothing, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_own_dead_pending_row_is_replaced, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_own_live_pending_row_without_proc, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_one_commit_publish_waits_for_staged_key, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_publish_rejects_bad_input, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_default_limit_leaves_one_token, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_divergence, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_shorter_prompt_misses, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_longest_wins_and_hint, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_salts_and_models_never_cross, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_forced_collisions_16_bits, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_forced_collisions_2_bits, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_reopen_keeps_everything, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_open_cost_flat, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_format_version_checked, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_in_steps, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_flipped_chunk_quarantines, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_recomputes_keys, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_finds_index_damage, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_read_only_and_quarantined, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_deferred_restore_takes_no_write, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_blocks_shared_across_turns, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_evict_dry_run_counts_shared_blocks, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_evict_dry_run_on_a_full_map, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_publish_refused_by_pinned_map_says_so, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_v1_store_upgraded, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_blocks_mismatch_kept_private, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_staged_blocks_shared_across_turns, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_staged_blocks_mismatch_kept_private, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_staged_failure_gives_back_blocks, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_staged_crash_gives_back_blocks, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_publish_reclaims_dead_staged_key, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_delta_publish_in_store, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_staged_delta_publish_in_store, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_delta_of_damaged_base_refused, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_window_delta_reads_each_byte_in_its_window,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_window_delta_nan_in_new_rows_stores_nothing,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_window_delta_shapes, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_unread_delta_refused_by_whole_publish, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_window_publish_many_chunks_apart, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_window_delta_write_failure_reads_nothing_after,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_window_delta_wrong_sum_refused, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_delta_over_32bit_counts_refused, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_damaged_block_refused, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_checks_blocks, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_repairs_counts_a_damaged_record_left,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_verify_repairs_damaged_counts, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_lru_order_and_capacity, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_damaged_records_do_not_jam_eviction, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_map_full_evicts, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_map_full_evicts_staged, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_pinned_map_is_busy_not_wiped, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_batch_over_capacity, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_evict_selectors, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_list_inspect_resolve, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_open_denied_names_the_file, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_open_file_not_directory, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_failed_open_leaves_the_share_lock, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_window_publish_reads_each_byte_in_its_window,
	                                        setup, teardown),
	        cmocka_unit_test_setup_teardown(test_window_publish_bad_last_layer_stores_nothing,
	                                        setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
