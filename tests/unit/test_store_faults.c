/* The store under failing LMDB calls. This test is linked with
 * -Wl,--wrap for mdb_put, mdb_txn_begin, mdb_txn_commit and mdb_txn_abort
 * (tests/CMakeLists.txt), so the store's own calls reach the wrappers below
 * and any one of them can be made to fail; production code has no hook.
 *
 * For every write path, each of its mdb_put calls and each of its commits is
 * made to fail in turn. After every failure the test asserts LMDB's rules:
 *  - the writer lock is free again (another thread can begin a write at
 *    once), so no error path leaks a transaction;
 *  - a handle whose commit failed is never aborted (mdb_txn_commit frees it
 *    whatever happens);
 * and that the store still works. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <time.h>

#include "prefix.h"
#include "store/env.h"
#include "store/lru.h" /* store_touch */
#include "storeutil.h"

/* ---- the wrappers --------------------------------------------------------- */

int __real_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data, unsigned flags);
int __real_mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **txn);
int __real_mdb_txn_commit(MDB_txn *txn);
void __real_mdb_txn_abort(MDB_txn *txn);

static int fail_put_at;    /* the n-th mdb_put from now fails (0: none) */
static int fail_commit_at; /* the n-th commit from now fails (0: none) */
static int puts_seen, commits_seen, faults_hit;
static MDB_txn *failed_commit; /* freed by its failed commit */
static int abort_after_failed_commit;

int __wrap_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data, unsigned flags)
{
	if (fail_put_at && ++puts_seen == fail_put_at) {
		faults_hit++;
		return EIO;
	}
	return __real_mdb_put(txn, dbi, key, data, flags);
}

int __wrap_mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned flags, MDB_txn **txn)
{
	int rc = __real_mdb_txn_begin(env, parent, flags, txn);
	if (rc == 0 && *txn == failed_commit)
		failed_commit = NULL; /* the address is reused: a new handle */
	return rc;
}

int __wrap_mdb_txn_commit(MDB_txn *txn)
{
	if (fail_commit_at && ++commits_seen == fail_commit_at) {
		faults_hit++;
		__real_mdb_txn_abort(txn); /* what a failed commit does: the handle is gone */
		failed_commit = txn;
		return EIO;
	}
	return __real_mdb_txn_commit(txn);
}

void __wrap_mdb_txn_abort(MDB_txn *txn)
{
	if (txn && txn == failed_commit) {
		abort_after_failed_commit++;
		return; /* the real call would touch freed memory */
	}
	__real_mdb_txn_abort(txn);
}

static void faults_off(void)
{
	fail_put_at = fail_commit_at = 0;
	puts_seen = commits_seen = 0;
}

/* ---- the writer lock is free ---------------------------------------------- */

struct probe {
	MDB_env *env;
	int rc;
	int done;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void *probe_main(void *arg)
{
	struct probe *p = arg;
	MDB_txn *txn;
	int rc = __real_mdb_txn_begin(p->env, NULL, 0, &txn);
	if (rc == 0)
		__real_mdb_txn_abort(txn);
	pthread_mutex_lock(&p->mu);
	p->rc = rc;
	p->done = 1;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* 1 when another thread can begin a write transaction within two seconds. A
 * leaked transaction holds the lock for ever: the probe thread then stays
 * blocked and is left behind (the test has failed). */
static int writer_lock_free(struct store *s)
{
	static struct probe p; /* outlives a stuck probe thread */
	p = (struct probe){.env = s->env};
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	pthread_t t;
	if (pthread_create(&t, NULL, probe_main, &p) != 0)
		return 0;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&p.mu);
	while (!p.done && pthread_cond_timedwait(&p.cv, &p.mu, &until) != ETIMEDOUT)
		;
	int done = p.done, rc = p.rc;
	pthread_mutex_unlock(&p.mu);
	if (!done) {
		pthread_detach(t);
		return 0;
	}
	pthread_join(t, NULL);
	return rc == 0;
}

/* ---- the operations ------------------------------------------------------- */

struct fixture {
	char *dir;
	struct store *st;
	struct k3cache_model *m;     /* entries of a few KiB: one commit */
	struct k3cache_model *big;   /* ~1.8 MB entries: staged (stage 256 KiB) */
	uint32_t next;               /* makes every publish a new entry */
	uint8_t last[STORE_KEY_LEN]; /* the key of the last publish */
};

static int open_store(struct fixture *f, uint64_t max_bytes)
{
	struct store_options o = {
	        .max_bytes = max_bytes, .durability = STORE_FAST, .stage_bytes = 256u << 10};
	struct status s;
	if (store_open(f->dir, &o, &f->st, &s) != STATUS_OK) {
		fprintf(stderr, "open: %s\n", s.message);
		return -1;
	}
	return 0;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	f->dir = storeutil_tmpdir();
	f->m = storeutil_model("faults-small", 16);
	f->big = storeutil_model("faults-big", 150000);
	if (open_store(f, 0))
		return -1;
	store_put_model(f->st, f->m, NULL, NULL);
	store_put_model(f->st, f->big, NULL, NULL);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	faults_off();
	store_close(f->st);
	model_free(f->m);
	model_free(f->big);
	storeutil_rmdir(f->dir);
	free(f);
	return 0;
}

static void toks(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

static enum status_code publish(struct fixture *f, const struct k3cache_model *m,
                                struct store_publish_res *res)
{
	uint32_t t[40];
	toks(t, 40, 100000u * ++f->next);
	prefix_key(m->fingerprint, "", 0, t, 40, f->last);
	return storeutil_publish(f->st, m, "", t, 40, f->next, res);
}

static enum status_code op_put_model(struct fixture *f)
{
	char name[32];
	snprintf(name, sizeof(name), "faults-%u", ++f->next);
	struct k3cache_model *m = storeutil_model(name, 8);
	enum status_code code = store_put_model(f->st, m, NULL, NULL);
	model_free(m);
	return code;
}

static enum status_code op_publish(struct fixture *f)
{
	return publish(f, f->m, NULL);
}

static enum status_code op_publish_staged(struct fixture *f)
{
	return publish(f, f->big, NULL);
}

/* A conversation turn of 200 rows, staged: its three shared blocks are
 * placed, and held, stage by stage before its record is written. */
static enum status_code op_publish_staged_blocks(struct fixture *f)
{
	uint32_t t[200];
	toks(t, 200, 7u << 24);
	struct storeutil_snap s = storeutil_conv_snap(f->big, 200, 1, 2);
	struct store_publish_req req = {f->big->fingerprint, "", 0, t, 200, s.blobs, s.n};
	struct store_publish_res res;
	enum status_code code = store_publish(f->st, &req, &res, NULL);
	storeutil_snap_free(&s);
	return code;
}

static enum status_code op_evict_key(struct fixture *f)
{
	struct store_evict_req req = {.keys = (const uint8_t(*)[STORE_KEY_LEN])f->last,
	                              .n_keys = 1};
	struct store_evict_res res;
	return store_evict(f->st, &req, NULL, NULL, &res, NULL);
}

static enum status_code op_evict_all(struct fixture *f)
{
	struct store_evict_req req = {.all = 1};
	struct store_evict_res res;
	return store_evict(f->st, &req, NULL, NULL, &res, NULL);
}

static enum status_code op_evict_to_size(struct fixture *f)
{
	struct store_evict_req req = {.to_bytes_set = 1, .to_bytes = 0};
	struct store_evict_res res;
	return store_evict(f->st, &req, NULL, NULL, &res, NULL);
}

static enum status_code op_flush(struct fixture *f)
{
	store_touch(f->st, f->last, 1);
	return store_flush(f->st, NULL);
}

static enum status_code op_quarantine(struct fixture *f)
{
	store_quarantine(f->st, f->last);
	return STATUS_OK;
}

/* A publish into a full store evicts first (its own transactions). */
static enum status_code op_publish_evicting(struct fixture *f)
{
	return publish(f, f->m, NULL);
}

struct op {
	const char *name;
	enum status_code (*run)(struct fixture *f);
	uint64_t max_bytes; /* 0: the default */
	int seed_entries;   /* entries published before each run */
};

/* Counts verify's store-wide findings (the shared blocks'); entries it
 * names may be quarantined on purpose here. */
static void count_problem(const uint8_t *key, const char *why, void *ctx)
{
	(void)why;
	*(int *)ctx += key == NULL;
}

/* What any failure must leave: every shared block's reference count exact,
 * no orphan block, and no reference held. */
static void expect_consistent(struct fixture *f, const struct op *op, int commits, int n)
{
	int problems = 0;
	uint64_t checked, damaged;
	struct status st;
	assert_int_equal(store_verify(f->st, count_problem, &problems, &checked, &damaged, &st),
	                 STATUS_OK);
	uint64_t held = storeutil_refs_held(f->st);
	if (problems || held)
		fail_msg("%s: with %s %d failing, verify finds %d problems, %llu references held",
		         op->name, commits ? "commit" : "mdb_put", n, problems,
		         (unsigned long long)held);
}

/* Runs op with its n-th put (or commit) failing, for n = 1, 2, ... until a
 * run hits no fault; checks the rules after every run. */
static void sweep(struct fixture *f, const struct op *op, int commits)
{
	int n;
	for (n = 1; n < 200; n++) {
		if (op->max_bytes || op->seed_entries) {
			store_close(f->st);
			storeutil_rmdir(f->dir);
			f->dir = storeutil_tmpdir();
			assert_int_equal(open_store(f, op->max_bytes), 0);
			store_put_model(f->st, f->m, NULL, NULL);
			store_put_model(f->st, f->big, NULL, NULL);
			for (int e = 0; e < op->seed_entries; e++)
				assert_int_equal(publish(f, f->m, NULL), STATUS_OK);
		}
		faults_off();
		faults_hit = 0;
		abort_after_failed_commit = 0;
		if (commits)
			fail_commit_at = n;
		else
			fail_put_at = n;
		enum status_code code = op->run(f);
		faults_off();
		if (!writer_lock_free(f->st))
			fail_msg("%s: with %s %d failing, the writer lock stays held", op->name,
			         commits ? "commit" : "mdb_put", n);
		if (abort_after_failed_commit)
			fail_msg("%s: with commit %d failing, the freed handle was aborted",
			         op->name, n);
		expect_consistent(f, op, commits, n);
		if (!faults_hit) {
			assert_int_equal(code, STATUS_OK);
			break;
		}
		/* still usable */
		assert_int_equal(publish(f, f->m, NULL), STATUS_OK);
	}
	printf("%s: %d %s\n", op->name, n - 1, commits ? "commits" : "puts");
	assert_true(n > 1);   /* the op wrote something */
	assert_true(n < 200); /* and a run without a fault was checked */
}

static const struct op ops[] = {
        {"put model", op_put_model, 0, 0},
        {"publish", op_publish, 0, 0},
        {"staged publish", op_publish_staged, 0, 0},
        {"staged publish with blocks", op_publish_staged_blocks, 0, 1},
        {"evict key", op_evict_key, 0, 2},
        {"evict all", op_evict_all, 0, 3},
        {"evict to size", op_evict_to_size, 0, 3},
        {"flush", op_flush, 0, 1},
        {"quarantine", op_quarantine, 0, 1},
        {"publish evicting", op_publish_evicting, 5000, 2},
};

static void test_failed_puts_release_the_writer(void **state)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		sweep(*state, &ops[i], 0);
}

static void test_failed_commits_are_not_aborted(void **state)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		sweep(*state, &ops[i], 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_failed_puts_release_the_writer, setup,
	                                        teardown),
	        cmocka_unit_test_setup_teardown(test_failed_commits_are_not_aborted, setup,
	                                        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
