/* Receive windows (daemon/window.c) on the paths a kernel or a short memory
 * takes, reached through an LD_PRELOAD fake of mremap (fault_mremap.c) in a
 * real daemon: without MREMAP_DONTUNMAP the stages use fresh pages and the
 * publish still stores every byte; a window that cannot be opened, or
 * cannot grow mid-upload, is answered BUSY, stores nothing, and the next
 * publish goes through; a publish the store refuses at its start drains
 * its window and is answered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemonutil.h"
#include "k3cache/k3cache.h"
#include "model.h"
#include "snaputil.h"

static struct k3cache_model *twin;

/* A daemon with 1 MiB stages (3 MiB windows) and K3FAULT_MREMAP=fault. */
static void start(struct daemonutil *d, const char *fault)
{
	assert_int_equal(daemonutil_init(d), 0);
	setenv("LD_PRELOAD", K3_FAULT_MREMAP, 1);
	setenv("K3FAULT_MREMAP", fault, 1);
	/* an ASan daemon wants its runtime first; the fake may come before it */
	setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
	int rc = daemonutil_start(d, "--stage-size", "1MiB", (char *)NULL);
	unsetenv("LD_PRELOAD");
	unsetenv("K3FAULT_MREMAP");
	unsetenv("ASAN_OPTIONS");
	assert_int_equal(rc, 0);
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(d->sock, &c, &e), 0);
	assert_int_equal(k3cache_put_model(c, twin, NULL, &e), 0);
	k3cache_close(c);
}

static void tokens_for(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 7;
}

/* Publishes snapshot seed at P = p (about 10 KB a token: streamed); its
 * answer's code, with the message in e. */
static int publish(struct daemonutil *d, uint32_t p, uint32_t seed, struct k3cache_error *e)
{
	struct k3cache *c;
	assert_int_equal(k3cache_connect(d->sock, &c, e), 0);
	struct k3cache_buf *bufs = calloc(twin->n_layers, sizeof(*bufs));
	for (uint32_t i = 0; i < twin->n_layers; i++)
		bufs[i] = snaputil_layer(twin, i, p, seed);
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, seed * 100000);
	struct k3cache_publish_result res;
	int rc = k3cache_publish(c, twin->fingerprint, "", 0, t, p, bufs, twin->n_layers, &res, e);
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free((void *)bufs[i].data);
	free(bufs);
	free(t);
	k3cache_close(c);
	return rc;
}

/* Whether snapshot seed at P = p is stored and restores byte for byte. */
static int restores(struct daemonutil *d, uint32_t p, uint32_t seed)
{
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(d->sock, &c, &e), 0);
	uint32_t *t = malloc((p + 1) * sizeof(uint32_t));
	tokens_for(t, p + 1, seed * 100000);
	struct k3cache_lookup_result lr;
	assert_int_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, p + 1, 0, &lr, &e), 0);
	free(t);
	if (lr.prefix_len != p) {
		k3cache_close(c);
		return 0;
	}
	void **bufs = calloc(twin->n_layers, sizeof(void *));
	size_t *caps = calloc(twin->n_layers, sizeof(size_t)),
	       *lens = calloc(twin->n_layers, sizeof(size_t));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = model_layer_blob_size(&twin->layers[i], p);
		bufs[i] = malloc(caps[i]);
	}
	uint32_t got = 0;
	int ok = k3cache_restore_into(c, twin, lr.key, bufs, caps, lens, &got, &e) == 0 && got == p;
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		struct k3cache_buf want = snaputil_layer(twin, i, p, seed);
		ok = ok && lens[i] == want.len && memcmp(bufs[i], want.data, want.len) == 0;
		free((void *)want.data);
		free(bufs[i]);
	}
	free(bufs);
	free(caps);
	free(lens);
	k3cache_close(c);
	return ok;
}

static uint64_t counter(struct daemonutil *d, const char *name)
{
	struct k3cache *c;
	struct k3cache_error e;
	uint64_t v = 0;
	assert_int_equal(k3cache_connect(d->sock, &c, &e), 0);
	assert_int_equal(k3cache_stat_counter(c, name, &v, &e), 0);
	k3cache_close(c);
	return v;
}

/* A kernel without MREMAP_DONTUNMAP: stages are fresh pages, dropped after
 * use, and every byte is still stored. */
static void test_without_dontunmap_stages_are_fresh_pages(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "dontunmap");
	struct k3cache_error e;
	for (uint32_t seed = 1; seed <= 2; seed++) {
		if (publish(&d, 2000, seed, &e) != 0)
			fail_msg("publish %u: %s", seed, e.message);
		assert_true(restores(&d, 2000, seed));
	}
	assert_true(daemonutil_log_has(&d, "stages use fresh pages"));
	assert_true(counter(&d, "window_waits") > 0); /* 20 MB through 3 MiB windows */
	assert_int_equal(counter(&d, "window_bytes"), 0);
	daemonutil_cleanup(&d);
}

/* The first stage cannot be moved in: no window, BUSY before any byte is
 * stored; the next publish opens one. */
static void test_window_that_cannot_open_is_busy(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "fixed:1");
	struct k3cache_error e;
	assert_int_equal(publish(&d, 2000, 3, &e), K3CACHE_BUSY);
	assert_non_null(strstr(e.message, "receive window"));
	assert_false(restores(&d, 2000, 3));
	if (publish(&d, 2000, 3, &e) != 0)
		fail_msg("publish after: %s", e.message);
	assert_true(restores(&d, 2000, 3));
	daemonutil_cleanup(&d);
}

/* A stage cannot be moved in mid-upload: BUSY, answered at once (the
 * client stops sending), the rest discarded, nothing of it stored, the
 * window's memory given back; the next publish goes through. Before, the
 * answer came once the whole payload had been skipped, and the window's
 * MiBs stayed counted in --max-inflight until then. */
static void test_window_that_cannot_grow_is_busy(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "fixed:5");
	struct k3cache_error e;
	uint64_t payload = 0;
	for (uint32_t i = 0; i < twin->n_layers; i++)
		payload += model_layer_blob_size(&twin->layers[i], 2000);
	uint64_t in0 = counter(&d, "bytes_in");
	int rc = publish(&d, 2000, 4, &e);
	if (rc != K3CACHE_BUSY) /* before: the daemon hung up mid-upload (broken pipe) */
		fail_msg("publish: code %d: %s", rc, e.message);
	assert_non_null(strstr(e.message, "out of memory for a receive window"));
	uint64_t in1 = counter(&d, "bytes_in");
	print_message("%llu of the payload's %llu bytes read\n", (unsigned long long)(in1 - in0),
	              (unsigned long long)payload);
	assert_true(in1 - in0 < payload);
	assert_false(restores(&d, 2000, 4));
	/* the answer goes out at once; the window goes once the writer hands
	 * the cancelled job back */
	for (int i = 0; i < 250 && counter(&d, "window_bytes") != 0; i++)
		daemonutil_sleep_ms(20);
	assert_int_equal(counter(&d, "window_bytes"), 0);
	assert_int_equal(counter(&d, "inflight_bytes"), 0);
	if (publish(&d, 2000, 4, &e) != 0)
		fail_msg("publish after: %s", e.message);
	assert_true(restores(&d, 2000, 4));
	daemonutil_cleanup(&d);
}

/* A streamed publish the store refuses at its start (a model the daemon does
 * not know, with 20 MB through a 3 MiB window) is answered and stores
 * nothing, its window given back. Once, the window never drained and the
 * client waited until its timeout; then it drained the whole upload; now the
 * header is checked against the store and answered before the payload,
 * which the client then stops sending. */
static void test_refused_at_start_drains_the_window(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "none");
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(d.sock, &c, &e), 0);
	k3cache_set_timeout(c, 20000);
	const uint32_t p = 2000;
	struct k3cache_buf *bufs = calloc(twin->n_layers, sizeof(*bufs));
	for (uint32_t i = 0; i < twin->n_layers; i++)
		bufs[i] = snaputil_layer(twin, i, p, 5);
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, 500000);
	uint8_t fp[K3CACHE_FP_LEN];
	memcpy(fp, twin->fingerprint, sizeof(fp));
	fp[0] ^= 0xff; /* a model never put */
	struct k3cache_publish_result res;
	int rc = k3cache_publish(c, fp, "", 0, t, p, bufs, twin->n_layers, &res, &e);
	if (rc != K3CACHE_UNKNOWN_MODEL)
		fail_msg("publish: code %d: %s", rc, e.message);
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free((void *)bufs[i].data);
	free(bufs);
	free(t);
	k3cache_close(c);
	assert_int_equal(counter(&d, "window_bytes"), 0);
	assert_int_equal(counter(&d, "entries"), 0);
	daemonutil_cleanup(&d);
}

/* The disk stops answering mid-publish (a fake fdatasync hangs): the
 * upload fills its window and waits for the store, which takes nothing of
 * it. After K3D_WINDOW_STUCK_FACTOR (4) x --stall-timeout it is closed, said
 * at warning level and counted, not kept for ever; once the disk answers,
 * nothing of it is stored and the next publish goes through. */
static void test_window_the_store_never_takes_is_closed(void **state)
{
	(void)state;
	struct daemonutil d;
	assert_int_equal(daemonutil_init(&d), 0);
	char hang[1100];
	snprintf(hang, sizeof(hang), "%s.hang", d.db);
	setenv("LD_PRELOAD", K3_FAULT_FSYNC, 1);
	setenv("K3FAULT_FSYNC_HANG", hang, 1);
	setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
	int rc =
	        daemonutil_start(&d, "--stage-size", "1MiB", "--stall-timeout", "1s", (char *)NULL);
	unsetenv("LD_PRELOAD");
	unsetenv("K3FAULT_FSYNC_HANG");
	unsetenv("ASAN_OPTIONS");
	assert_int_equal(rc, 0);
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(d.sock, &c, &e), 0);
	assert_int_equal(k3cache_put_model(c, twin, NULL, &e), 0);
	k3cache_close(c);
	uint64_t timeouts = counter(&d, "timeouts");
	FILE *f = fopen(hang, "w");
	assert_non_null(f);
	fclose(f);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = publish(&d, 2000, 6, &e);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_not_equal(rc, 0);
	assert_true(e.unreachable); /* closed by the daemon mid-upload */
	/* told when it is closed (about 4 s), not once the writer is done with
	 * its job: its socket stayed open until then, here until the client's
	 * own timeout (60 s) */
	assert_true(t1.tv_sec - t0.tv_sec < 20);
	assert_true(daemonutil_log_has(&d, "for the store to take a stage of its window"));
	assert_true(daemonutil_log_has(&d, "warn"));
	assert_int_equal(counter(&d, "timeouts"), timeouts + 1);
	unlink(hang);
	assert_false(restores(&d, 2000, 6));
	if (publish(&d, 2000, 7, &e) != 0)
		fail_msg("publish after: %s", e.message);
	assert_true(restores(&d, 2000, 7));
	daemonutil_cleanup(&d);
}

static int setup(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	twin = model_load_file(path, err);
	return twin ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	model_free(twin);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_without_dontunmap_stages_are_fresh_pages),
	        cmocka_unit_test(test_window_that_cannot_open_is_busy),
	        cmocka_unit_test(test_window_that_cannot_grow_is_busy),
	        cmocka_unit_test(test_refused_at_start_drains_the_window),
	        cmocka_unit_test(test_window_the_store_never_takes_is_closed),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
