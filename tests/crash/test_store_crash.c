/* Crash safety: a child process publishes in a loop and is SIGKILLed at a
 * random moment, 200 times. Its conversation turns share MLA blocks, some
 * are deltas of the turn before (their base's rows taken in place) and some
 * are staged. After each kill the store opens, verify finds
 * nothing damaged, and every entry present restores whole. The big entries
 * are larger than the stage size, so they are written in several
 * transactions (store_staged.c): a kill between them leaves chunks under a
 * pending row, which the next open must remove, leaving no chunk that no
 * entry owns. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "../unit/storeutil.h"
#include "store/blocks.h"
#include "store/chunks.h" /* STORE_CHUNK_DATA */
#include "store/index.h"
#include "store/record.h"

#define KILLS 200

/* The last turn this child published of a conversation (under a model). */
struct last_turn {
	uint32_t p;
	uint8_t key[STORE_KEY_LEN];
};

/* Publishes req as a delta of the turn lt: its KDA layers whole and its MLA
 * rows past lt->p. 0 when it was stored (lt then names it). */
static int publish_delta(struct store *st, const struct k3cache_model *m,
                         const struct store_publish_req *req, const struct storeutil_snap *s,
                         struct last_turn *lt)
{
	struct store_blob blobs[8];
	unsigned char *rows[8] = {0};
	uint32_t p = req->n_tokens, r = lt->p;
	for (uint32_t i = 0; i < s->n && i < 8; i++) {
		blobs[i] = s->blobs[i];
		const struct model_layer *l = &m->layers[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		size_t kb = (size_t)l->k_row * 4, vb = (size_t)l->v_row * 4;
		rows[i] = malloc((size_t)(p - r) * (kb + vb));
		memcpy(rows[i], s->bufs[i] + 9 + (size_t)r * kb, (size_t)(p - r) * kb);
		memcpy(rows[i] + (size_t)(p - r) * kb,
		       s->bufs[i] + 13 + (size_t)p * kb + (size_t)r * vb, (size_t)(p - r) * vb);
		blobs[i].data = rows[i];
		blobs[i].size = (uint64_t)(p - r) * (kb + vb);
	}
	struct store_publish_req dreq = *req;
	dreq.blobs = blobs;
	struct store_delta d;
	int refused = 0, rc = -1;
	if (store_delta_assemble(st, &dreq, lt->key, r, &d, &refused, NULL) == STATUS_OK) {
		dreq.blobs = d.blobs;
		struct store_publish_res res;
		if (store_publish(st, &dreq, &res, NULL) == STATUS_OK) {
			lt->p = p;
			memcpy(lt->key, res.key, STORE_KEY_LEN);
			rc = 0;
		}
		store_delta_free(&d);
	}
	for (uint32_t i = 0; i < 8; i++)
		free(rows[i]);
	return rc;
}

static void child(const char *dir, uint32_t iter)
{
	struct last_turn last[3][2] = {0};
	struct store *st;
	struct store_options o = {
	        .max_bytes = 48u << 20, .durability = STORE_SAFE, .stage_bytes = 1u << 20};
	if (store_open(dir, &o, &st, NULL) != STATUS_OK)
		_exit(2);
	struct k3cache_model *small = storeutil_model("small", 64);
	struct k3cache_model *big = storeutil_model("big", 400000); /* multi-chunk entries */
	store_put_model(st, small, NULL, NULL);
	store_put_model(st, big, NULL, NULL);
	for (uint32_t k = 0;; k++) {
		uint32_t t[40];
		for (uint32_t i = 0; i < 40; i++)
			t[i] = iter * 1000 + k * 7 + i;
		/* small first: an entry exists within ms even in a sanitizer build */
		struct k3cache_model *m = (k % 3 == 2) ? big : small;
		storeutil_publish(st, m, "", t, 20 + k % 20, iter + k, NULL);
		/* turns of a few conversations, every kill's child going on with
		 * them: their MLA rows are shared blocks (64 rows each). Under the
		 * big model they are staged: their blocks are placed, and held,
		 * stage by stage before the record exists */
		uint32_t conv[320];
		uint32_t c = (iter + k) % 3;
		for (uint32_t i = 0; i < 320; i++)
			conv[i] = c * 100000 + i;
		uint32_t p = 64 + ((iter * 7 + k * 13) % 256);
		struct k3cache_model *cm = (k % 2) ? big : small;
		struct storeutil_snap s = storeutil_conv_snap(cm, p, c, iter + k);
		struct store_publish_req req = {cm->fingerprint, "", 0, conv, p, s.blobs, s.n};
		struct store_publish_res res;
		/* a longer turn than this conversation's last: a delta of it,
		 * taking the last one's rows in place */
		struct last_turn *lt = &last[c][k % 2];
		if (lt->p && lt->p < p && publish_delta(st, cm, &req, &s, lt) == 0) {
			/* published */
		} else if (store_publish(st, &req, &res, NULL) == STATUS_OK) {
			lt->p = p;
			memcpy(lt->key, res.key, STORE_KEY_LEN);
		}
		storeutil_snap_free(&s);
		if (k % 5 == 4) {
			struct store_evict_req req = {.to_bytes_set = 1, .to_bytes = 24u << 20};
			struct store_evict_res res;
			store_evict(st, &req, NULL, NULL, &res, NULL);
		}
	}
}

/* A reference to a shared block: node | layer. */
struct ref {
	unsigned char k[STORE_BLOCK_REF_LEN];
};

static int ref_cmp(const void *a, const void *b)
{
	return memcmp(a, b, STORE_BLOCK_REF_LEN);
}

/* Every block's reference count equals the records that use it, every
 * count has both parts, and no part is without a count. Returns the number
 * of blocks checked. */
static uint64_t check_block_refs(struct store *st, uint32_t iter)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	struct ref *refs = NULL;
	size_t n = 0, cap = 0;
	assert_int_equal(mdb_cursor_open(txn, st->entries, &cur), 0);
	MDB_val k, v;
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct store_record r;
		assert_int_equal(store_record_decode(v.mv_data, v.mv_size, &r), 0);
		if (!r.row_block || !r.map_len)
			continue;
		MDB_val tv;
		assert_int_equal(store_index_tokens(st, txn, r.key, &tv), 0);
		uint8_t(*h)[PREFIX_NODE_LEN] =
		        malloc(((size_t)r.prefix_len / PREFIX_BLOCK + 1) * PREFIX_NODE_LEN);
		prefix_block_hashes(r.fingerprint, r.salt, r.salt_len, tv.mv_data, r.prefix_len, h);
		for (uint32_t i = 0, mla = 0; i < r.n_layers; i++) {
			uint8_t tag;
			uint64_t size, sum;
			store_record_layer(&r, i, &tag, &size, &sum);
			if (tag != 2)
				continue;
			for (uint32_t b = 0; b < r.prefix_len / r.row_block; b++) {
				if (!store_record_shared(&r, mla, b))
					continue;
				if (n == cap) {
					cap = cap ? cap * 2 : 256;
					struct ref *nr = realloc(refs, cap * sizeof(*refs));
					assert_non_null(nr);
					refs = nr;
				}
				memcpy(refs[n].k, h[(b + 1) * r.row_block / PREFIX_BLOCK],
				       PREFIX_NODE_LEN);
				store_be32(refs[n].k + PREFIX_NODE_LEN, i);
				n++;
			}
			mla++;
		}
		free(h);
	}
	mdb_cursor_close(cur);
	if (n)
		qsort(refs, n, sizeof(*refs), ref_cmp);
	uint64_t blocks = 0;
	size_t at = 0;
	assert_int_equal(mdb_cursor_open(txn, st->blockrefs, &cur), 0);
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		assert_int_equal(k.mv_size, STORE_BLOCK_REF_LEN);
		assert_int_equal(v.mv_size, 4);
		uint32_t count = store_get_be32(v.mv_data), used = 0;
		while (at < n && memcmp(refs[at].k, k.mv_data, STORE_BLOCK_REF_LEN) < 0)
			fail_msg("kill %u: a record uses a block that has no count", iter);
		while (at < n && memcmp(refs[at].k, k.mv_data, STORE_BLOCK_REF_LEN) == 0) {
			used++;
			at++;
		}
		if (count != used)
			fail_msg("kill %u: a block counts %u references, %u records use it", iter,
			         count, used);
		for (unsigned part = 0; part < 2; part++) {
			MDB_val pv;
			if (store_blocks_get(st, txn, k.mv_data,
			                     store_get_be32((const unsigned char *)k.mv_data +
			                                    PREFIX_NODE_LEN),
			                     part, &pv) != 0 ||
			    !store_blocks_intact(&pv,
			                         store_get_be32((const unsigned char *)k.mv_data +
			                                        PREFIX_NODE_LEN)))
				fail_msg("kill %u: a counted block lacks a whole part", iter);
		}
		blocks++;
	}
	mdb_cursor_close(cur);
	if (at != n)
		fail_msg("kill %u: records use blocks that have no count", iter);
	MDB_stat ms;
	assert_int_equal(mdb_stat(txn, st->blocks, &ms), 0);
	if (ms.ms_entries != blocks * 2)
		fail_msg("kill %u: %llu block parts for %llu blocks (orphans)", iter,
		         (unsigned long long)ms.ms_entries, (unsigned long long)blocks);
	/* the killed publisher's held references were given back at open */
	assert_int_equal(mdb_stat(txn, st->held, &ms), 0);
	if (ms.ms_entries != 0)
		fail_msg("kill %u: %llu held references left", iter,
		         (unsigned long long)ms.ms_entries);
	mdb_txn_abort(txn);
	free(refs);
	return blocks;
}

static void damaged_cb(const uint8_t *key, const char *why, void *ctx)
{
	(void)ctx;
	if (!key)
		fprintf(stderr, "shared blocks: %s\n", why);
	else
		fprintf(stderr, "damaged entry %02x%02x%02x%02x: %s\n", key[0], key[1], key[2],
		        key[3], why);
}

static int chunks_cb(const struct store_entry_info *info, void *ctx)
{
	/* no block is private here: what an entry stores is its stream */
	*(uint64_t *)ctx += (info->stored + STORE_CHUNK_DATA - 1) / STORE_CHUNK_DATA;
	return 0;
}

static void test_sigkill_during_publish(void **state)
{
	(void)state;
	char *dir = storeutil_tmpdir();
	uint32_t rng = (uint32_t)time(NULL) | 1u;
	uint64_t max_entries = 0, total_checked = 0, swept = 0, max_blocks = 0, held_kills = 0;
	for (uint32_t iter = 0; iter < KILLS; iter++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0)
			child(dir, iter);
		rng ^= rng << 13;
		rng ^= rng >> 17;
		rng ^= rng << 5;
		/* up to 120 ms: a staged 4.8 MB publish takes 30-90 ms in safe mode on
		 * the 2-vCPU VMs, and kills must land after some commit too */
		struct timespec ts = {0, (long)(1 + rng % 120) * 1000000L};
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		int status;
		waitpid(pid, &status, 0);
		assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));

		struct store *st;
		struct status s;
		/* before the sweep: did the kill leave references held? */
		struct store_options ro = {.read_only = 1};
		if (store_open(dir, &ro, &st, &s) == STATUS_OK) {
			MDB_txn *txn;
			MDB_stat ms;
			if (st->has_held && mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn) == 0) {
				if (mdb_stat(txn, st->held, &ms) == 0 && ms.ms_entries)
					held_kills++;
				mdb_txn_abort(txn);
			}
			store_close(st);
		} else {
			fprintf(stderr, "kill %u: read-only open: %s\n", iter, s.message);
		}
		struct store_options o = {.durability = STORE_SAFE, .max_bytes = 48u << 20};
		if (store_open(dir, &o, &st, &s) != STATUS_OK)
			fail_msg("kill %u: open failed: %s", iter, s.message);
		uint64_t checked, damaged;
		assert_int_equal(store_verify(st, damaged_cb, NULL, &checked, &damaged, &s),
		                 STATUS_OK);
		if (damaged)
			fail_msg("kill %u: %llu of %llu entries damaged", iter,
			         (unsigned long long)damaged, (unsigned long long)checked);
		struct store_stats stats;
		store_get_stats(st, &stats, NULL);
		assert_int_equal(stats.entries, checked);
		assert_true(stats.bytes <= (48u << 20));
		uint64_t owned = 0;
		assert_int_equal(store_list(st, NULL, NULL, 0, chunks_cb, &owned, NULL), STATUS_OK);
		if (stats.staging != 0 || stats.chunks != owned)
			fail_msg("kill %u: %llu staged publishes left, %llu chunks for %llu owned",
			         iter, (unsigned long long)stats.staging,
			         (unsigned long long)stats.chunks, (unsigned long long)owned);
		swept += stats.swept;
		uint64_t nb = check_block_refs(st, iter);
		max_blocks = nb > max_blocks ? nb : max_blocks;
		max_entries = checked > max_entries ? checked : max_entries;
		total_checked += checked;
		store_close(st);
	}
	printf("%d kills; up to %llu entries present, %llu entry checks, none damaged; %llu "
	       "unfinished staged publishes swept (%llu holding block references); up to %llu "
	       "shared blocks, their reference counts exact after every kill\n",
	       KILLS, (unsigned long long)max_entries, (unsigned long long)total_checked,
	       (unsigned long long)swept, (unsigned long long)held_kills,
	       (unsigned long long)max_blocks);
	assert_true(max_entries > 0);
	assert_true(max_blocks > 0);
	assert_true(swept > 0); /* the kills did land between stages */
	storeutil_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_sigkill_during_publish),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
