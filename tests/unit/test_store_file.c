/* The store's file as a damaged disk hands it: the structural walk at open
 * (store/walk.h), the unclean-stop marker, and salvage. The black-box suite
 * against the daemon is tests/damage. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "store/env.h"
#include "store/walk.h"
#include "storeutil.h"

struct fixture {
	char *dir;
	char *newdir;
	struct k3cache_model *m;
	uint8_t keys[6][STORE_KEY_LEN];
};

static struct store *open_at(const char *dir, enum store_check check, struct status *st)
{
	struct store_options o = {.durability = STORE_FAST, .check = check};
	struct store *s = NULL;
	if (store_open(dir, &o, &s, st) != STATUS_OK)
		return NULL;
	return s;
}

/* A store of six entries: short ones, and long ones whose tokens and chunks
 * are on overflow pages. */
static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	f->dir = storeutil_tmpdir();
	f->newdir = storeutil_tmpdir();
	rmdir(f->newdir); /* salvage makes it */
	f->m = storeutil_model("file-test", 4000);
	struct status st;
	struct store *s = open_at(f->dir, STORE_CHECK_ALWAYS, &st);
	if (!s) {
		free(f);
		return -1;
	}
	store_put_model(s, f->m, NULL, NULL);
	uint32_t t[2000];
	for (uint32_t i = 0; i < 2000; i++)
		t[i] = 500 + 3 * i;
	for (uint32_t e = 0; e < 6; e++) {
		struct store_publish_res res;
		t[0] = e;
		if (storeutil_publish(s, f->m, e % 2 ? "tenant" : "", t, e < 3 ? 20 : 1500, e + 1,
		                      &res) != STATUS_OK) {
			store_close(s);
			free(f);
			return -1;
		}
		memcpy(f->keys[e], res.key, STORE_KEY_LEN);
	}
	store_close(s);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	model_free(f->m);
	storeutil_rmdir(f->dir);
	storeutil_rmdir(f->newdir);
	free(f);
	return 0;
}

/* The data file, mapped to write (to damage it) or read. */
struct file {
	unsigned char *p;
	size_t size;
	int fd;
};

static struct file map_file(const char *dir, int writable)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	struct file f = {.fd = open(path, writable ? O_RDWR : O_RDONLY)};
	assert_true(f.fd >= 0);
	struct stat sb;
	assert_int_equal(fstat(f.fd, &sb), 0);
	f.size = (size_t)sb.st_size;
	f.p = mmap(NULL, f.size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, f.fd, 0);
	assert_true(f.p != MAP_FAILED);
	return f;
}

static void unmap_file(struct file *f)
{
	msync(f->p, f->size, MS_SYNC);
	munmap(f->p, f->size);
	close(f->fd);
}

/* Offset of the live meta page (the one with the larger txnid). */
static size_t live_meta(const struct file *f)
{
	uint32_t psize;
	uint64_t t0, t1;
	memcpy(&psize, f->p + 16 + 24, 4);
	memcpy(&t0, f->p + 16 + 128, 8);
	memcpy(&t1, f->p + psize + 16 + 128, 8);
	return t1 > t0 ? psize : 0;
}

static int count_item(const char *table, const void *k, size_t kl, const void *v, size_t vl,
                      void *ctx)
{
	(void)table, (void)k, (void)kl, (void)v, (void)vl;
	(*(uint64_t *)ctx)++;
	return 0;
}

static void test_sound_store_walks_clean(void **state)
{
	struct fixture *f = *state;
	struct file file = map_file(f->dir, 0);
	struct store_walk_stats ws;
	char why[256];
	assert_int_equal(store_walk(file.p, file.size, 0, NULL, NULL, &ws, why, sizeof(why)), 0);
	assert_true(ws.leaf > 0 && ws.overflow > 0);
	uint64_t items = 0;
	assert_int_equal(
	        store_walk(file.p, file.size, 0, count_item, &items, &ws, why, sizeof(why)), 0);
	assert_int_equal(ws.problems, 0);
	assert_int_equal(items, ws.items);
	/* a file cut short is damaged, whatever the cut */
	for (size_t cut = 0; cut < file.size; cut += file.size / 7 + 1)
		assert_int_equal(store_walk(file.p, cut, 0, NULL, NULL, &ws, why, sizeof(why)), 1);
	unmap_file(&file);
	struct status st;
	struct store *s = open_at(f->dir, STORE_CHECK_ALWAYS, &st);
	assert_non_null(s);
	struct store_stats stats;
	assert_int_equal(store_get_stats(s, &stats, &st), STATUS_OK);
	assert_true(stats.checked);
	assert_int_equal(stats.unclean_stop, 0);
	store_close(s);
}

/* The main database's root page number, in the meta page LMDB opens:
 * LMDB itself reads past its pages. The open refuses it, naming salvage,
 * and writes nothing. */
static void test_damaged_root_refused(void **state)
{
	struct fixture *f = *state;
	struct file file = map_file(f->dir, 1);
	file.p[live_meta(&file) + 16 + 72 + 40 + 2] ^= 0x10;
	unmap_file(&file);
	struct file before = map_file(f->dir, 0);
	unsigned char *copy = malloc(before.size);
	memcpy(copy, before.p, before.size);
	unmap_file(&before);

	struct status st;
	assert_null(open_at(f->dir, STORE_CHECK_ALWAYS, &st));
	assert_int_equal(st.code, STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "salvage --to NEWDIR"));
	struct store_options ro = {.read_only = 1};
	struct store *s = NULL;
	assert_int_equal(store_open(f->dir, &ro, &s, &st), STATUS_CORRUPT);
	struct file after = map_file(f->dir, 0);
	assert_int_equal(after.size, before.size);
	assert_memory_equal(after.p, copy, after.size);
	unmap_file(&after);
	free(copy);

	/* salvage reads the older snapshot and saves every entry */
	struct store_salvage_res res;
	assert_int_equal(store_salvage(f->dir, f->newdir, NULL, NULL, &res, &st), STATUS_OK);
	assert_true(res.problems >= 1);
	assert_int_equal(res.saved, res.entries);
	assert_true(res.saved >= 5); /* the older snapshot may lack the last entry */
}

/* Both meta pages damaged: there is no snapshot to read, and salvage says
 * so without making anything of it. */
static void test_salvage_of_nothing(void **state)
{
	struct fixture *f = *state;
	struct file file = map_file(f->dir, 1);
	uint32_t psize;
	memcpy(&psize, file.p + 16 + 24, 4);
	file.p[16] ^= 0xff;         /* meta 0's magic */
	file.p[psize + 16] ^= 0xff; /* meta 1's */
	unmap_file(&file);
	struct store_salvage_res res;
	struct status st;
	assert_int_equal(store_salvage(f->dir, f->newdir, NULL, NULL, &res, &st), STATUS_CORRUPT);
	assert_non_null(strstr(st.message, "nothing can be read"));
	assert_int_equal(res.saved, 0);
}

/* A chunk's overflow run claiming more pages than its value takes: freeing
 * it would hand out pages still in use. */
static void test_overflow_count_refused(void **state)
{
	struct fixture *f = *state;
	struct file file = map_file(f->dir, 1);
	uint32_t psize;
	memcpy(&psize, file.p + 16 + 24, 4);
	int done = 0;
	for (size_t pg = 2; !done && (pg + 1) * psize <= file.size; pg++) {
		unsigned char *p = file.p + pg * psize;
		uint64_t no;
		uint16_t flags;
		uint32_t pages;
		memcpy(&no, p, 8);
		memcpy(&flags, p + 10, 2);
		memcpy(&pages, p + 12, 4);
		if (no == pg && flags == 4 && pages > 1) {
			pages *= 3;
			memcpy(p + 12, &pages, 4);
			done = 1;
		}
	}
	assert_true(done);
	unmap_file(&file);
	struct status st;
	assert_null(open_at(f->dir, STORE_CHECK_ALWAYS, &st));
	assert_non_null(strstr(st.message, "overflow run"));
}

/* LMDB overwrites a large value with a smaller one in place, keeping its
 * overflow run: a run longer than its value is sound. */
static void test_longer_overflow_run_is_sound(void **state)
{
	struct fixture *f = *state;
	struct status st;
	struct store *s = open_at(f->dir, STORE_CHECK_ALWAYS, &st);
	assert_non_null(s);
	static unsigned char big[20000];
	memset(big, 0x5a, sizeof(big));
	unsigned char key[36] = {7};
	MDB_txn *txn;
	assert_int_equal(mdb_txn_begin(s->env, NULL, 0, &txn), 0);
	MDB_val k = {sizeof(key), key}, v = {sizeof(big), big};
	assert_int_equal(mdb_put(txn, s->chunks, &k, &v, 0), 0);
	v.mv_size = 5000;
	assert_int_equal(mdb_put(txn, s->chunks, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	store_close(s);
	s = open_at(f->dir, STORE_CHECK_ALWAYS, &st);
	if (!s)
		fail_msg("refused: %s", st.message);
	store_close(s);
}

static void collect_lost(const uint8_t *key, const char *why, void *ctx)
{
	(void)key;
	size_t n = strlen(ctx);
	snprintf((char *)ctx + n, 1024 - n, "%s\n", why);
}

/* Salvage of a sound store saves everything, byte for byte; an entry whose
 * chunk is damaged is named and left out. */
static void test_salvage(void **state)
{
	struct fixture *f = *state;
	/* damage entry 4's bytes: its layer 0 as published, found in the file */
	struct storeutil_snap want = storeutil_snap(f->m, 1500, 5);
	struct file file = map_file(f->dir, 1);
	const unsigned char *needle = want.bufs[0] + 2000;
	unsigned char *at = memmem(file.p, file.size, needle, 64);
	assert_non_null(at);
	at[7] ^= 0x04;
	unmap_file(&file);
	storeutil_snap_free(&want);

	char lost[1024] = "";
	struct store_salvage_res res;
	struct status st;
	assert_int_equal(store_salvage(f->dir, f->newdir, collect_lost, lost, &res, &st),
	                 STATUS_OK);
	assert_int_equal(res.problems, 0);
	assert_int_equal(res.entries, 6);
	assert_int_equal(res.saved, 5);
	assert_int_equal(res.models, 1);
	assert_non_null(strstr(lost, "checksum"));
	/* a second salvage into the same directory is refused */
	assert_int_equal(store_salvage(f->dir, f->newdir, NULL, NULL, &res, &st), STATUS_INVALID);

	struct store *s = open_at(f->newdir, STORE_CHECK_ALWAYS, &st);
	assert_non_null(s);
	for (uint32_t e = 0; e < 6; e++) {
		struct store_snapshot *snap;
		enum status_code code = store_restore(s, f->keys[e], &snap, &st);
		if (e == 4) {
			assert_int_equal(code, STATUS_NOT_FOUND);
			continue;
		}
		assert_int_equal(code, STATUS_OK);
		struct storeutil_snap w = storeutil_snap(f->m, e < 3 ? 20 : 1500, e + 1);
		for (uint32_t i = 0; i < snap->n_layers; i++) {
			size_t off = 0;
			for (uint32_t j = 0; j < snap->layers[i].n_segments; j++) {
				assert_memory_equal(snap->layers[i].segments[j].data,
				                    w.bufs[i] + off,
				                    snap->layers[i].segments[j].len);
				off += snap->layers[i].segments[j].len;
			}
			assert_int_equal(off, w.blobs[i].size);
		}
		storeutil_snap_free(&w);
		store_snapshot_release(snap);
	}
	store_close(s);
	/* the scratch copy is gone */
	char scratch[4200];
	snprintf(scratch, sizeof(scratch), "%s/salvage.tmp", f->newdir);
	struct stat sb;
	assert_int_not_equal(stat(scratch, &sb), 0);
}

/* running.PID markers: one per open to write, gone at close; one of a
 * process that is gone is an unclean stop, which forces the walk. */
static void test_unclean_stop_marker(void **state)
{
	struct fixture *f = *state;
	struct status st;
	struct store *s = open_at(f->dir, STORE_CHECK_UNCLEAN, &st);
	assert_non_null(s);
	char mine[4200];
	snprintf(mine, sizeof(mine), "%s/running.%ld", f->dir, (long)getpid());
	struct stat sb;
	assert_int_equal(stat(mine, &sb), 0);
	struct store_stats stats;
	store_get_stats(s, &stats, &st);
	assert_int_equal(stats.unclean_stop, 0);
	assert_int_equal(stats.checked, 0);
	store_close(s);
	assert_int_not_equal(stat(mine, &sb), 0);

	/* the marker of a process that died (no such pid, or another start) */
	char dead[4200];
	snprintf(dead, sizeof(dead), "%s/running.%ld", f->dir, (long)getpid());
	FILE *fp = fopen(dead, "w");
	fputs("1\n", fp);
	fclose(fp);
	s = open_at(f->dir, STORE_CHECK_UNCLEAN, &st);
	assert_non_null(s);
	store_get_stats(s, &stats, &st);
	assert_int_equal(stats.unclean_stop, 1);
	assert_int_equal(stats.checked, 1);
	store_close(s);
	s = open_at(f->dir, STORE_CHECK_UNCLEAN, &st);
	store_get_stats(s, &stats, &st);
	assert_int_equal(stats.unclean_stop, 0);
	store_close(s);

	/* an unclean stop with damage: refused, and the marker stays, so the
	 * next open checks again */
	fp = fopen(dead, "w");
	fputs("1\n", fp);
	fclose(fp);
	struct file file = map_file(f->dir, 1);
	file.p[live_meta(&file) + 16 + 72 + 40 + 3] ^= 0x01;
	unmap_file(&file);
	for (int i = 0; i < 2; i++) {
		assert_null(open_at(f->dir, STORE_CHECK_UNCLEAN, &st));
		assert_int_equal(st.code, STATUS_CORRUPT);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test_setup_teardown(test_sound_store_walks_clean, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_damaged_root_refused, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_overflow_count_refused, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_longer_overflow_run_is_sound, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_salvage, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_salvage_of_nothing, setup, teardown),
	        cmocka_unit_test_setup_teardown(test_unclean_stop_marker, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
