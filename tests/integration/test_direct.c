/* Direct reads (k3cache/direct.h) against a store the real daemon writes:
 * the same answers as the daemon, every byte, and damage refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blob.h"
#include "daemonutil.h"
#include "k3cache/direct.h"
#include "model.h"
#include "snaputil.h"

static struct daemonutil d;
static struct k3cache_model *twin;

/* Layer i of snapshot `seed` at P = p. */
static struct k3cache_buf make_layer(uint32_t i, uint32_t p, uint32_t seed)
{
	return snaputil_layer(twin, i, p, seed);
}

static void tokens_for(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 3;
}

static void publish_to(const char *sock, uint32_t p, uint32_t base, uint32_t seed)
{
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(sock, &c, &e) != 0)
		fail_msg("connect: %s", e.message);
	struct k3cache_buf *bufs = calloc(twin->n_layers, sizeof(*bufs));
	for (uint32_t i = 0; i < twin->n_layers; i++)
		bufs[i] = make_layer(i, p, seed);
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, base);
	struct k3cache_publish_result res;
	if (k3cache_publish(c, twin->fingerprint, "", 0, t, p, bufs, twin->n_layers, &res, &e) != 0)
		fail_msg("publish: %s", e.message);
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free((void *)bufs[i].data);
	free(bufs);
	free(t);
	k3cache_close(c);
}

static void publish(uint32_t p, uint32_t base, uint32_t seed)
{
	publish_to(d.sock, p, base, seed);
}

/* Buffers for every layer at P = p. */
static void **buffers(uint32_t p, size_t *caps)
{
	void **bufs = calloc(twin->n_layers, sizeof(void *));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = model_layer_blob_size(&twin->layers[i], p);
		bufs[i] = malloc(caps[i]);
	}
	return bufs;
}

static void free_buffers(void **bufs)
{
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free(bufs[i]);
	free(bufs);
}

/* Every layer restored into bufs is snapshot seed's at P = p, byte for
 * byte. */
static void assert_layers(void *const *bufs, const size_t *lens, uint32_t p, uint32_t seed)
{
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		struct k3cache_buf want = make_layer(i, p, seed);
		assert_int_equal(lens[i], want.len);
		assert_memory_equal(bufs[i], want.data, want.len);
		free((void *)want.data);
	}
}

/* Each layer's two arrays at P = p, zeroed. */
static struct k3cache_arrays_out *new_arrays(uint32_t p)
{
	struct k3cache_arrays_out *arr = calloc(twin->n_layers, sizeof(*arr));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		uint64_t n[2];
		model_layer_floats(&twin->layers[i], p, n);
		arr[i] = (struct k3cache_arrays_out){calloc(n[0], 4), n[0], calloc(n[1], 4), n[1]};
	}
	return arr;
}

static void free_arrays(struct k3cache_arrays_out *arr)
{
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		free(arr[i].a);
		free(arr[i].b);
	}
	free(arr);
}

/* One of the daemon's counters. */
static uint64_t counter(const char *name)
{
	struct k3cache *c;
	struct k3cache_error e;
	uint64_t v = 0;
	if (k3cache_connect(d.sock, &c, &e) != 0 || k3cache_stat_counter(c, name, &v, &e) != 0)
		fail_msg("%s: %s", name, e.message);
	k3cache_close(c);
	return v;
}

static struct k3cache_direct *open_direct(void)
{
	struct k3cache_direct *dr;
	struct k3cache_error e;
	if (k3cache_direct_open(d.db, d.sock, &dr, &e) != 0)
		fail_msg("direct open: %s", e.message);
	return dr;
}

/* Lookups and restores in this process give what the daemon gives. */
static void test_direct_restores_what_was_published(void **state)
{
	(void)state;
	publish(300, 1000, 1);
	publish(2000, 1000, 2); /* the same prompt, longer: streamed, with blocks */
	uint64_t uses = counter("reported_uses");
	struct k3cache_direct *dr = open_direct();
	uint32_t t[2100];
	tokens_for(t, 2100, 1000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 1500, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 300);
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 2100, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 2000);
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	void **bufs = buffers(2000, caps);
	uint32_t p = 0;
	if (k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e) != 0)
		fail_msg("restore: %s", e.message);
	assert_int_equal(p, 2000);
	assert_layers(bufs, lens, 2000, 2);
	/* into each layer's two arrays: the same floats, no header words */
	struct k3cache_arrays_out *arr = new_arrays(2000);
	arr[3].b_cap--; /* one float short: refused before a byte is copied */
	assert_int_equal(
	        k3cache_direct_restore_arrays(dr, twin, lr.key, arr, twin->n_layers, &p, &e),
	        K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 3: its "));
	arr[3].b_cap++;
	p = 0;
	if (k3cache_direct_restore_arrays(dr, twin, lr.key, arr, twin->n_layers, &p, &e) != 0)
		fail_msg("restore_arrays: %s", e.message);
	assert_int_equal(p, 2000);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		struct k3cache_buf want = make_layer(i, 2000, 2);
		size_t head = twin->layers[i].mixer == MODEL_MIXER_KDA ? 5 : 9;
		const unsigned char *w = want.data;
		assert_memory_equal(arr[i].a, w + head, arr[i].a_cap * 4);
		assert_memory_equal(arr[i].b, w + head + arr[i].a_cap * 4 + 4, arr[i].b_cap * 4);
		free((void *)want.data);
	}
	free_arrays(arr);
	/* views: the same bytes in pieces of the map, checked the same way */
	struct k3cache_direct_view *v;
	if (k3cache_direct_view(dr, twin, lr.key, &v, &e) != 0)
		fail_msg("view: %s", e.message);
	assert_int_equal(v->prefix_len, 2000);
	assert_int_equal(v->n_layers, twin->n_layers);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		struct k3cache_buf want = make_layer(i, 2000, 2);
		assert_int_equal(v->layers[i].len, want.len);
		size_t off = 0;
		for (uint32_t j = 0; j < v->layers[i].n_pieces; j++) {
			const struct k3cache_buf *pc = &v->layers[i].pieces[j];
			assert_true(off + pc->len <= want.len);
			assert_memory_equal(pc->data, (const unsigned char *)want.data + off,
			                    pc->len);
			off += pc->len;
		}
		assert_int_equal(off, want.len);
		free((void *)want.data);
	}
	k3cache_direct_view_release(v);
	/* another prompt misses; the salt is part of the key */
	uint32_t other[50];
	tokens_for(other, 50, 777);
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, other, 50, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 0);
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "s", 1, t, 2100, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 0);
	free_buffers(bufs);
	free(caps);
	free(lens);
	k3cache_direct_close(dr);
	/* the restores and the view reached the daemon as uses, at the close */
	assert_int_equal(counter("reported_uses"), uses + 3);
}

/* Flips one byte of layer i's floats (of snapshot seed at P = p) where
 * data.mdb holds them. */
static void flip_in_file(uint32_t i, uint32_t p, uint32_t seed)
{
	struct k3cache_buf l = make_layer(i, p, seed);
	char path[400];
	snprintf(path, sizeof(path), "%s/data.mdb", d.db);
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	off_t size = lseek(fd, 0, SEEK_END);
	unsigned char *file = malloc((size_t)size);
	assert_int_equal(pread(fd, file, (size_t)size, 0), size);
	const unsigned char *needle = (const unsigned char *)l.data + 4096;
	unsigned char *at = memmem(file, (size_t)size, needle, 64);
	assert_non_null(at);
	unsigned char flipped = (unsigned char)(at[10] ^ 0x01);
	assert_int_equal(pwrite(fd, &flipped, 1, (off_t)(at - file) + 10), 1);
	close(fd);
	free(file);
	free((void *)l.data);
}

/* A buffer too small, or the wrong model, is refused before a byte is
 * copied; a flipped byte in the file is refused as damage. */
static void test_direct_refuses_bad_requests_and_damage(void **state)
{
	(void)state;
	publish(400, 50000, 7);
	struct k3cache_direct *dr = open_direct();
	uint32_t t[401];
	tokens_for(t, 401, 50000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 401, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 400);
	/* arguments the socket's lookup refuses are refused here too, not
	 * dereferenced */
	struct k3cache_lookup_result no;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, NULL, 401, 0, &no, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "tokens is NULL"));
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, NULL, 4, t, 401, 0, &no, &e),
	                 K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_lookup(dr, NULL, "", 0, t, 401, 0, &no, &e),
	                 K3CACHE_INVALID);
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	void **bufs = buffers(400, caps);
	uint32_t p = 0;
	caps[1]--;
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 1: needs"));
	caps[1]++;
	/* two layers' buffers sharing memory: refused before a byte is copied */
	void *kept = bufs[2];
	bufs[2] = (unsigned char *)bufs[1] + 8;
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 1's buffer and layer 2's buffer share memory"));
	bufs[2] = kept;

	flip_in_file(0, 400, 7);
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e),
	                 K3CACHE_CORRUPT);
	assert_non_null(strstr(e.message, "stored entry damaged: layer 0"));
	struct k3cache_direct_view *v = NULL;
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), K3CACHE_CORRUPT);
	assert_null(v);
	assert_non_null(strstr(e.message, "stored entry damaged: layer 0"));
	/* reported at once: the daemon checks the entry and takes it out of
	 * service, so it is a miss for every reader */
	assert_true(counter("reported_damaged") >= 1);
	struct k3cache *c;
	assert_int_equal(k3cache_connect(d.sock, &c, &e), 0);
	int gone = 0;
	for (int i = 0; i < 100 && !gone; i++) {
		assert_int_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, 401, 0, &lr, &e),
		                 0);
		gone = lr.prefix_len == 0;
		if (!gone)
			daemonutil_sleep_ms(20);
	}
	assert_true(gone);
	k3cache_close(c);
	free_buffers(bufs);
	free(caps);
	free(lens);
	k3cache_direct_close(dr);
}

/* What the socket's calls take as optional (lens, prefix_len, the lookup's
 * result) is optional here too, and what they require is refused INVALID,
 * not dereferenced: before, a NULL lens, prefix_len or lookup result was
 * written through (SIGSEGV), as was a NULL model, key, bufs or caps. */
static void test_direct_arguments_as_the_socket_takes_them(void **state)
{
	(void)state;
	publish(60, 52000, 9);
	struct k3cache_direct *dr = open_direct();
	uint32_t t[61];
	tokens_for(t, 61, 52000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 61, 0, NULL, &e),
	                 0);
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 61, 0, &lr, &e), 0);
	assert_int_equal(lr.prefix_len, 60);
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	void **bufs = buffers(60, caps);
	uint32_t p = 0;
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, NULL, &p, &e),
	                 0);
	assert_int_equal(p, 60);
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, NULL, &e),
	                 0);
	assert_layers(bufs, lens, 60, 9);
	assert_int_equal(k3cache_direct_restore_into(dr, NULL, lr.key, bufs, caps, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "model"));
	assert_int_equal(k3cache_direct_restore_into(dr, twin, NULL, bufs, caps, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, NULL, caps, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, NULL, lens, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "required"));
	struct k3cache_arrays_out *arr = new_arrays(60);
	assert_int_equal(
	        k3cache_direct_restore_arrays(dr, NULL, lr.key, arr, twin->n_layers, &p, &e),
	        K3CACHE_INVALID);
	assert_int_equal(
	        k3cache_direct_restore_arrays(dr, twin, lr.key, NULL, twin->n_layers, &p, &e),
	        K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_restore_arrays(dr, twin, NULL, arr, twin->n_layers, &p, &e),
	                 K3CACHE_INVALID);
	free_arrays(arr);
	struct k3cache_direct_view *v = NULL;
	assert_int_equal(k3cache_direct_view(dr, NULL, lr.key, &v, &e), K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_view(dr, twin, NULL, &v, &e), K3CACHE_INVALID);
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, NULL, &e), K3CACHE_INVALID);
	assert_null(v);
	struct k3cache_lookup_result no;
	assert_int_equal(k3cache_direct_lookup(NULL, twin->fingerprint, "", 0, t, 61, 0, &no, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "k3cache_direct_open"));
	/* and the reader goes on */
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), 0);
	k3cache_direct_view_release(v);
	free_buffers(bufs);
	free(caps);
	free(lens);
	k3cache_direct_close(dr);
}

/* An entry over 32 MiB is checked on several threads: the same bytes, and
 * of two damaged layers the first is named, as one thread would. */
static void test_large_entry_checked_on_threads(void **state)
{
	(void)state;
	const uint32_t P = 4000; /* two MLA layers of 20 MB */
	publish(P, 200000, 11);
	struct k3cache_error e;
	struct k3cache_direct *dr;
	const char *bad[] = {"0", "17", "abc", "4x"};
	for (int i = 0; i < 4; i++) {
		setenv("K3CACHE_DIRECT_THREADS", bad[i], 1);
		assert_int_equal(k3cache_direct_open(d.db, d.sock, &dr, &e), K3CACHE_INVALID);
		assert_non_null(strstr(e.message, "K3CACHE_DIRECT_THREADS"));
	}
	setenv("K3CACHE_DIRECT_THREADS", "4", 1);
	dr = open_direct();
	unsetenv("K3CACHE_DIRECT_THREADS");
	uint32_t t[4001]; /* a token past the entry's: a lookup leaves one to prefill */
	tokens_for(t, P + 1, 200000);
	struct k3cache_lookup_result lr;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, P + 1, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, P);
	assert_true(lr.bytes > (32u << 20));
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	void **bufs = buffers(P, caps);
	uint32_t p = 0;
	if (k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e) != 0)
		fail_msg("restore: %s", e.message);
	assert_int_equal(p, P);
	assert_layers(bufs, lens, P, 11);
	struct k3cache_direct_view *v;
	if (k3cache_direct_view(dr, twin, lr.key, &v, &e) != 0)
		fail_msg("view: %s", e.message);
	k3cache_direct_view_release(v);
	/* MLA layer 3 (20 MB) and KDA layer 6 (45 KB, checked long before
	 * layer 3 ends) damaged: layer 3 is the answer, as on one thread */
	flip_in_file(6, P, 11);
	flip_in_file(3, P, 11);
	assert_int_equal(k3cache_direct_restore_into(dr, twin, lr.key, bufs, caps, lens, &p, &e),
	                 K3CACHE_CORRUPT);
	if (!strstr(e.message, "stored entry damaged: layer 3 "))
		fail_msg("restore: %s", e.message);
	/* the report may have reached the daemon already: then it is quarantined */
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), K3CACHE_CORRUPT);
	if (!strstr(e.message, "stored entry damaged: layer 3 ") &&
	    !strstr(e.message, "quarantined"))
		fail_msg("view: %s", e.message);
	struct k3cache_arrays_out *arr = new_arrays(P);
	assert_int_equal(
	        k3cache_direct_restore_arrays(dr, twin, lr.key, arr, twin->n_layers, &p, &e),
	        K3CACHE_CORRUPT);
	if (!strstr(e.message, "stored entry damaged: layer 3 ") &&
	    !strstr(e.message, "quarantined"))
		fail_msg("restore_arrays: %s", e.message);
	free_arrays(arr);
	free_buffers(bufs);
	free(caps);
	free(lens);
	k3cache_direct_close(dr);
}

/* A direct reader killed while it holds a view leaves its LMDB reader slot
 * taken (the slot pins the pages of its snapshot); the daemon clears the
 * slots of dead processes every 10 s. */
static void test_killed_reader_slot_is_reclaimed(void **state)
{
	(void)state;
	publish(100, 90000, 9);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct k3cache_direct *dr;
		struct k3cache_direct_view *v;
		struct k3cache_lookup_result lr;
		struct k3cache_error e;
		uint32_t t[101];
		tokens_for(t, 101, 90000);
		if (k3cache_direct_open(d.db, d.sock, &dr, &e) != 0 ||
		    k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 101, 0, &lr, &e) != 0 ||
		    lr.prefix_len != 100 || k3cache_direct_view(dr, twin, lr.key, &v, &e) != 0)
			_exit(1);
		if (write(ready[1], "r", 1) != 1)
			_exit(1);
		for (;;)
			pause(); /* holding the view */
	}
	char c;
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	close(ready[1]);
	kill(pid, SIGKILL);
	int status;
	waitpid(pid, &status, 0);
	int cleared = 0;
	for (int i = 0; i < 150 && !cleared; i++) {
		daemonutil_sleep_ms(100);
		cleared = daemonutil_log_has(&d, "cleared 1 reader slots of dead processes");
	}
	assert_true(cleared);
}

struct readers {
	long pid;
	int active;
};

static int count_reader(const char *msg, void *ctx)
{
	struct readers *r = ctx;
	char *end;
	long pid = strtol(msg, &end, 10); /* "pid thread txnid", txnid "-" when idle */
	char thread[32], txn[32];
	if (end != msg && pid == r->pid && sscanf(end, "%31s %31s", thread, txn) == 2 &&
	    strcmp(txn, "-") != 0)
		r->active++;
	return 0;
}

/* Read transactions that process pid holds on the store, as LMDB's reader
 * table shows them after a reader check (the daemon runs one every 10 s:
 * it frees the slots of processes that no longer hold their lock on
 * lock.mdb), listed by a child (a second environment on the same file in
 * this process would drop this process's locks on it when closed). */
static int active_readers(pid_t pid)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		MDB_env *env;
		struct readers r = {(long)pid, 0};
		int dead = 0;
		if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 32) ||
		    mdb_env_open(env, d.db, MDB_RDONLY | MDB_NOTLS, 0) ||
		    mdb_reader_check(env, &dead) || mdb_reader_list(env, count_reader, &r) < 0)
			_exit(1);
		if (write(fds[1], &r.active, sizeof(r.active)) != (ssize_t)sizeof(r.active))
			_exit(1);
		_exit(0);
	}
	close(fds[1]);
	int n = -1;
	assert_int_equal(read(fds[0], &n, sizeof(n)), (ssize_t)sizeof(n));
	close(fds[0]);
	int status;
	waitpid(child, &status, 0);
	return n;
}

/* A view held past K3CACHE_DIRECT_VIEW_SECONDS ends at the next call: its
 * read transaction is gone from the reader table (so it no longer pins the
 * file's pages) and its pieces are NULL. */
static void test_view_held_too_long_expires(void **state)
{
	(void)state;
	publish(120, 95000, 10);
	setenv("K3CACHE_DIRECT_VIEW_SECONDS", "1", 1);
	struct k3cache_direct *dr = open_direct();
	unsetenv("K3CACHE_DIRECT_VIEW_SECONDS");
	uint32_t t[121];
	tokens_for(t, 121, 95000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 121, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 120);
	struct k3cache_direct_view *v;
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), 0);
	assert_true(k3cache_direct_view_valid(v));
	size_t len0 = v->layers[0].pieces[0].len;
	assert_true(len0 > 0);
	assert_int_equal(active_readers(getpid()), 1);
	daemonutil_sleep_ms(1300);
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 121, 0, &lr, &e),
	                 0);
	assert_false(k3cache_direct_view_valid(v));
	/* data NULL, its length kept: a copy through it faults (loudly), where
	 * a length of 0 copied nothing and left stale state in the caller's
	 * buffers */
	assert_null(v->layers[0].pieces[0].data);
	assert_int_equal(v->layers[0].pieces[0].len, len0);
	assert_int_equal(active_readers(getpid()), 0);
	k3cache_direct_view_release(v);
	/* a view released in time is simply released */
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), 0);
	k3cache_direct_view_release(v);
	assert_int_equal(active_readers(getpid()), 0);
	k3cache_direct_close(dr);
}

/* A daemon that serves another store: refused at open, saying so (its uses
 * and damage reports would reach the wrong daemon) */
static void test_daemon_of_another_store_refused(void **state)
{
	(void)state;
	struct daemonutil other;
	assert_int_equal(daemonutil_init(&other), 0);
	assert_int_equal(daemonutil_start(&other, (char *)NULL), 0);
	struct k3cache_direct *dr = NULL;
	struct k3cache_error e;
	int rc = k3cache_direct_open(d.db, other.sock, &dr, &e);
	daemonutil_cleanup(&other);
	assert_int_equal(rc, K3CACHE_INVALID);
	assert_null(dr);
	if (!strstr(e.message, "serves another store") || !strstr(e.message, d.db))
		fail_msg("the message does not say the daemon serves another store: %s", e.message);
	/* its own daemon: opened */
	dr = open_direct();
	k3cache_direct_close(dr);
}

/* A view of the entry of `n` tokens from `base`, held: checked valid. */
static struct k3cache_direct_view *hold_view(struct k3cache_direct *dr, uint32_t n, uint32_t base)
{
	uint32_t *t = malloc((n + 1) * sizeof(uint32_t));
	tokens_for(t, n + 1, base);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	struct k3cache_direct_view *v = NULL;
	if (k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, n + 1, 0, &lr, &e) != 0 ||
	    lr.prefix_len != n || k3cache_direct_view(dr, twin, lr.key, &v, &e) != 0)
		fail_msg("view of %u tokens: %s", n, e.message);
	free(t);
	assert_true(k3cache_direct_view_valid(v));
	return v;
}

/* Its first layer's bytes, as the view shows them now. */
static void view_equals(const struct k3cache_direct_view *v, uint32_t p, uint32_t seed)
{
	struct k3cache_buf want = make_layer(0, p, seed);
	const struct k3cache_view_layer *l = &v->layers[0];
	assert_int_equal(l->len, want.len);
	size_t at = 0;
	for (size_t j = 0; j < l->n_pieces; j++) {
		assert_memory_equal(l->pieces[j].data, (const char *)want.data + at,
		                    l->pieces[j].len);
		at += l->pieces[j].len;
	}
	free((void *)want.data);
}

/* Two handles on one store in one process share its LMDB environment: a
 * second handle closed, or refused at open after the store was opened
 * (a daemon of another store), leaves the first's view held in the reader
 * table. Before, each had its own environment, and closing one freed every
 * reader slot of the process and dropped its locks on lock.mdb: the view's
 * pages could be reused under it while it said it was valid. */
static void test_second_handle_keeps_views(void **state)
{
	(void)state;
	publish(140, 97000, 11);
	struct k3cache_direct *a = open_direct();
	struct k3cache_direct_view *v = hold_view(a, 140, 97000);
	assert_int_equal(active_readers(getpid()), 1);
	struct k3cache_direct *b = open_direct();
	struct k3cache_direct_view *w = hold_view(b, 140, 97000);
	assert_int_equal(active_readers(getpid()), 2);
	k3cache_direct_view_release(w);
	k3cache_direct_close(b);
	assert_int_equal(active_readers(getpid()), 1);
	/* refused after opening the store: a daemon of another store */
	struct daemonutil other;
	assert_int_equal(daemonutil_init(&other), 0);
	assert_int_equal(daemonutil_start(&other, (char *)NULL), 0);
	struct k3cache_error e;
	b = NULL;
	assert_int_equal(k3cache_direct_open(d.db, other.sock, &b, &e), K3CACHE_INVALID);
	daemonutil_cleanup(&other);
	assert_null(b);
	assert_int_equal(active_readers(getpid()), 1);
	assert_true(k3cache_direct_view_valid(v));
	view_equals(v, 140, 11);
	k3cache_direct_view_release(v);
	assert_int_equal(active_readers(getpid()), 0);
	k3cache_direct_close(a);
}

/* A handle is its process's: a child after fork() is refused with it
 * (saying to open its own), and its close there leaves the parent's view
 * held; the child's own handle reads. Before, the child read through its
 * parent's environment, and closing it freed the parent's reader slots. */
static void test_handle_refused_after_fork(void **state)
{
	(void)state;
	publish(150, 98000, 12);
	struct k3cache_direct *dr = open_direct();
	struct k3cache_direct_view *v = hold_view(dr, 150, 98000);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		uint32_t t[151];
		tokens_for(t, 151, 98000);
		struct k3cache_lookup_result lr;
		struct k3cache_error e;
		int rc = k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 151, 0, &lr, &e);
		if (rc != K3CACHE_INVALID || !strstr(e.message, "after fork()"))
			_exit(1);
		k3cache_direct_view_release(v);
		k3cache_direct_close(dr);
		struct k3cache_direct *own;
		if (k3cache_direct_open(d.db, d.sock, &own, &e) != 0 ||
		    k3cache_direct_lookup(own, twin->fingerprint, "", 0, t, 151, 0, &lr, &e) != 0 ||
		    lr.prefix_len != 150)
			_exit(2);
		k3cache_direct_close(own);
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(active_readers(getpid()), 1);
	assert_true(k3cache_direct_view_valid(v));
	view_equals(v, 150, 12);
	k3cache_direct_view_release(v);
	k3cache_direct_close(dr);
}

/* n restores of key by dr, each checked; the slowest one's seconds. */
static double restores_of(struct k3cache_direct *dr, const uint8_t *key, uint32_t p, uint32_t seed,
                          int n)
{
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	void **bufs = buffers(p, caps);
	struct k3cache_error e;
	double worst = 0;
	for (int i = 0; i < n; i++) {
		double t0 = daemonutil_now();
		uint32_t got = 0;
		if (k3cache_direct_restore_into(dr, twin, key, bufs, caps, lens, &got, &e) != 0)
			fail_msg("restore %d: %s", i, e.message);
		double dt = daemonutil_now() - t0;
		worst = dt > worst ? dt : worst;
		assert_int_equal(got, p);
	}
	assert_layers(bufs, lens, p, seed);
	free_buffers(bufs);
	free(caps);
	free(lens);
	return worst;
}

/* A daemon of the test's own (arguments: a1 a2, or NULL), twin's model put. */
static void start_own(struct daemonutil *g, const char *a1, const char *a2)
{
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(daemonutil_init(g), 0);
	assert_int_equal(daemonutil_start(g, a1, a2, (char *)NULL), 0);
	assert_int_equal(k3cache_connect(g->sock, &c, &e), 0);
	assert_int_equal(k3cache_put_model(c, twin, NULL, &e), 0);
	k3cache_close(c);
}

static uint64_t snapshot_bytes(uint32_t p)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < twin->n_layers; i++)
		n += model_layer_blob_size(&twin->layers[i], p);
	return n;
}

/* A daemon restarted with a larger --max-bytes writes the store's file past
 * the map a reader made of it at open (the writer's map size then): the
 * reader maps it again at its next call, as nothing of it is held, where
 * every call failed (MDB_MAP_RESIZED) until it was opened again. */
static void test_reader_follows_a_grown_store(void **state)
{
	(void)state;
	struct daemonutil g;
	struct k3cache_error e;
	start_own(&g, "--max-bytes", "4MiB");
	publish_to(g.sock, 100, 120000, 21);
	struct k3cache_direct *dr;
	setenv("K3CACHE_DIRECT_VIEW_SECONDS", "0", 1); /* the view lives through the restart */
	int opened = k3cache_direct_open(g.db, g.sock, &dr, &e);
	unsetenv("K3CACHE_DIRECT_VIEW_SECONDS");
	if (opened != 0)
		fail_msg("direct open: %s", e.message);
	uint32_t t0[101];
	tokens_for(t0, 101, 120000);
	struct k3cache_lookup_result lr;
	struct k3cache_direct_view *v;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t0, 101, 0, &lr, &e),
	                 0);
	assert_int_equal(k3cache_direct_view(dr, twin, lr.key, &v, &e), 0);
	/* its map: 2 x 4 MiB + 64 MiB; the daemon again, with room for more */
	assert_int_equal(daemonutil_stop(&g, SIGTERM), 0);
	assert_int_equal(daemonutil_start(&g, "--max-bytes", "512MiB", (char *)NULL), 0);
	uint32_t p = 2000, n = 0;
	for (uint64_t bytes = 0; bytes < (UINT64_C(100) << 20); bytes += snapshot_bytes(p)) {
		n++;
		publish_to(g.sock, p, 200000 + 10000 * n, 30 + n);
	}
	uint32_t t[2001];
	tokens_for(t, p + 1, 200000 + 10000 * n);
	/* while the view is held the map cannot move: refused, saying why */
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, p + 1, 0, &lr, &e),
	                 K3CACHE_BUSY);
	if (!strstr(e.message, "grown past") || !strstr(e.message, "--max-bytes"))
		fail_msg("the refusal does not say why: %s", e.message);
	assert_true(k3cache_direct_view_valid(v));
	view_equals(v, 100, 21); /* its pages where they were */
	k3cache_direct_view_release(v);
	if (k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, p + 1, 0, &lr, &e) != 0)
		fail_msg("lookup after the store grew: %s", e.message);
	assert_int_equal(lr.prefix_len, p);
	(void)restores_of(dr, lr.key, p, 30 + n, 1);
	k3cache_direct_close(dr);
	daemonutil_cleanup(&g);
}

/* Uses are reported in batches, one round trip each. A daemon stopped
 * (SIGSTOP: hung) held the restore that sent a batch for the connection's
 * 60 s, and after that failure the reader never reported again, even to the
 * daemon restarted: its entries aged in the LRU as if unused. */
static void test_reports_neither_block_nor_stop(void **state)
{
	(void)state;
	struct daemonutil g;
	struct k3cache *c;
	struct k3cache_error e;
	start_own(&g, NULL, NULL);
	publish_to(g.sock, 100, 130000, 41);
	struct k3cache_direct *dr;
	if (k3cache_direct_open(g.db, g.sock, &dr, &e) != 0)
		fail_msg("direct open: %s", e.message);
	uint32_t t[101];
	tokens_for(t, 101, 130000);
	struct k3cache_lookup_result lr;
	assert_int_equal(k3cache_direct_lookup(dr, twin->fingerprint, "", 0, t, 101, 0, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, 100);
	/* the daemon hangs: a batch of 256 uses is sent, and not answered */
	kill(g.pid, SIGSTOP);
	double worst = restores_of(dr, lr.key, 100, 41, 300);
	print_message("the slowest of 300 restores with the daemon stopped: %.2f s\n", worst);
	assert_true(worst < 3.0);
	/* still hung, and its listen queue full (other clients queued): the
	 * connect of the retry waits for room, bounded the same */
	int queued[256], nq = 0;
	for (; nq < 256; nq++) {
		queued[nq] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		assert_true(strlen(g.sock) < sizeof(sa.sun_path));
		memcpy(sa.sun_path, g.sock, strlen(g.sock) + 1);
		if (connect(queued[nq], (struct sockaddr *)&sa, sizeof(sa)) != 0) {
			close(queued[nq]);
			break;
		}
	}
	daemonutil_sleep_ms(1100); /* the wait after the failure */
	worst = restores_of(dr, lr.key, 100, 41, 300);
	print_message("%d connections queued; the slowest of 300 restores then: %.2f s\n", nq,
	              worst);
	assert_true(worst < 3.0);
	for (int i = 0; i < nq; i++)
		close(queued[i]);
	kill(g.pid, SIGCONT);
	/* the daemon restarted: the reader reports to it again */
	assert_int_equal(daemonutil_stop(&g, SIGTERM), 0);
	assert_int_equal(daemonutil_start(&g, (char *)NULL), 0);
	daemonutil_sleep_ms(2100); /* the wait after the second failure: 2 s */
	(void)restores_of(dr, lr.key, 100, 41, 300);
	k3cache_direct_close(dr);
	assert_int_equal(k3cache_connect(g.sock, &c, &e), 0);
	uint64_t uses = 0;
	assert_int_equal(k3cache_stat_counter(c, "reported_uses", &uses, &e), 0);
	k3cache_close(c);
	print_message("uses reported to the restarted daemon: %llu\n", (unsigned long long)uses);
	assert_true(uses >= 256);
	daemonutil_cleanup(&g);
}

static int setup(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	twin = model_load_file(path, err);
	if (!twin || daemonutil_init(&d) ||
	    daemonutil_start(&d, "--stage-size", "1MiB", (char *)NULL) != 0)
		return -1;
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(d.sock, &c, &e) != 0)
		return -1;
	int rc = k3cache_put_model(c, twin, NULL, &e);
	k3cache_close(c);
	return rc;
}

static int teardown(void **state)
{
	(void)state;
	daemonutil_cleanup(&d);
	model_free(twin);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_direct_restores_what_was_published),
	        cmocka_unit_test(test_direct_refuses_bad_requests_and_damage),
	        cmocka_unit_test(test_direct_arguments_as_the_socket_takes_them),
	        cmocka_unit_test(test_killed_reader_slot_is_reclaimed),
	        cmocka_unit_test(test_view_held_too_long_expires),
	        cmocka_unit_test(test_large_entry_checked_on_threads),
	        cmocka_unit_test(test_daemon_of_another_store_refused),
	        cmocka_unit_test(test_second_handle_keeps_views),
	        cmocka_unit_test(test_handle_refused_after_fork),
	        cmocka_unit_test(test_reader_follows_a_grown_store),
	        cmocka_unit_test(test_reports_neither_block_nor_stop),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
