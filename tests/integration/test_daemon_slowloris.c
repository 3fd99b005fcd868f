/* Uploads too slow to finish cannot starve others (issue 14, item 3), against
 * the real daemon: 100 connections each announce a 30 MiB publish and send
 * 1 KiB now and then. They hold the first MiB of --max-inflight each, not
 * the 30 MiB they announced, so a real 20 MiB publish goes through at once;
 * after 10 s under --min-upload-rate they are closed, counted, and leave
 * nothing held. Connections trickling a header are closed the same way, and
 * ones trickling the payload of a publish refused at its header (skipped as
 * it comes), and one reading a restore at a trickle under
 * --min-download-rate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "daemonutil.h"
#include "k3cache/k3cache.h"

#define SLOW       100
#define HDRS       10 /* connections trickling a header instead */
#define REFUSED    5  /* and a publish refused (no such model), its payload skipped */
#define SLOW_BYTES (UINT64_C(30) << 20)
#define REAL_FLOAT (UINT32_C(5) << 20) /* 20 MiB of recurrent state */

static struct daemonutil d;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t counter(struct k3cache *c, const char *name)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat stat = K3CACHE__V1__STAT__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	req.stat = &stat;
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	req.id = 1;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	close(fd);
	(void)c;
	uint64_t v = UINT64_MAX;
	for (size_t i = 0; i < r->n_counters; i++)
		if (!strcmp(r->counters[i]->name, name))
			v = r->counters[i]->value;
	frame_response_free(r);
	assert_true(v != UINT64_MAX);
	return v;
}

/* A publish header announcing SLOW_BYTES for the model. */
static int slow_upload(const uint8_t *fp, uint32_t i)
{
	int fd = daemonutil_connect_raw(d.sock);
	if (fd < 0)
		return -1;
	uint32_t tokens[3] = {9, 9, i};
	K3cache__V1__LayerRef ref = K3CACHE__V1__LAYER_REF__INIT, *prefs[1] = {&ref};
	ref.index = 0;
	ref.size = SLOW_BYTES;
	K3cache__V1__Publish pub = K3CACHE__V1__PUBLISH__INIT;
	pub.model.data = (uint8_t *)fp;
	pub.model.len = 32;
	pub.tokens = tokens;
	pub.n_tokens = 3;
	pub.layers = prefs;
	pub.n_layers = 1;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	req.payload_len = SLOW_BYTES;
	req.id = 1000 + i;
	if (daemonutil_send_request(fd, &req) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void test_slow_uploads_do_not_starve(void **state)
{
	(void)state;
	assert_int_equal(daemonutil_init(&d), 0);
	/* the 100 announced uploads (3 GiB) are far over --max-inflight */
	assert_int_equal(daemonutil_start(&d, "--max-inflight", "512MiB", "--max-payload", "64MiB",
	                                  (char *)NULL),
	                 0);
	struct k3cache_error err;
	struct k3cache_layer layer = {
	        .mixer = K3CACHE_MIXER_KDA, .conv_len = 4, .recurrent_len = REAL_FLOAT};
	struct k3cache_model *m = k3cache_model_new("slowloris", "1", "", &layer, 1, &err);
	assert_non_null(m);
	struct k3cache *c;
	assert_int_equal(k3cache_connect(d.sock, &c, &err), 0);
	assert_int_equal(k3cache_put_model(c, m, NULL, &err), 0);

	int fds[SLOW];
	unsigned char kib[1024];
	memset(kib, 0x3f, sizeof(kib));
	for (uint32_t i = 0; i < SLOW; i++) {
		fds[i] = slow_upload(k3cache_model_fingerprint(m), i);
		assert_true(fds[i] >= 0);
		assert_int_equal(daemonutil_write_all(fds[i], kib, sizeof(kib)), 0);
	}
	/* and some trickle a 1 MiB header: each byte was progress, so they
	 * were never closed, each holding its header's buffer */
	int hfds[HDRS];
	unsigned char prefix[4] = {0, 0, 0x10, 0}; /* 1 MiB, little-endian */
	for (int i = 0; i < HDRS; i++) {
		hfds[i] = daemonutil_connect_raw(d.sock);
		assert_true(hfds[i] >= 0);
		assert_int_equal(daemonutil_write_all(hfds[i], prefix, sizeof(prefix)), 0);
		assert_int_equal(daemonutil_write_all(hfds[i], kib, sizeof(kib)), 0);
	}
	/* the payload of a refused publish is skipped as it comes, holding
	 * nothing: a byte now and then held its connection for ever */
	int rfds[REFUSED];
	uint8_t nobody[32];
	memset(nobody, 0xee, sizeof(nobody));
	for (uint32_t i = 0; i < REFUSED; i++) {
		rfds[i] = slow_upload(nobody, i);
		assert_true(rfds[i] >= 0);
		assert_int_equal(daemonutil_write_all(rfds[i], kib, sizeof(kib)), 0);
	}
	daemonutil_sleep_ms(300);
	/* each holds its trial window, not its announced payload */
	uint64_t held = counter(c, "inflight_bytes");
	assert_true(held <= (uint64_t)SLOW << 20);

	float conv[4] = {0.5f, -0.5f, 0.25f, 1.0f};
	float *rec = malloc((size_t)REAL_FLOAT * sizeof(float));
	assert_non_null(rec);
	for (uint32_t i = 0; i < REAL_FLOAT; i++)
		rec[i] = (float)(i % 1000) * 0.001f;
	struct k3cache_arrays arr = {conv, 4, rec, REAL_FLOAT};
	uint32_t tokens[4] = {1, 2, 3, 4};
	struct k3cache_publish_result res;
	double t0 = now();
	assert_int_equal(
	        k3cache_publish_arrays(c, m, NULL, 0, tokens, 4, &arr, 1, NULL, 0, &res, &err), 0);
	double took = now() - t0;
	print_message("a 20 MiB publish beside %d slow uploads: %.2f s\n", SLOW, took);
	assert_true(res.created);
	assert_true(took < 10.0); /* it once waited for the slow ones' budget and timed out */
	free(rec);

	/* a restore of it read at 1 KiB every 2 s: it held a slot of
	 * --max-restores and a read transaction for as long as it kept reading */
	int rfd = daemonutil_connect_raw(d.sock);
	assert_true(rfd >= 0);
	K3cache__V1__Restore restore = K3CACHE__V1__RESTORE__INIT;
	restore.key.data = res.key;
	restore.key.len = 32;
	frame_request rreq = K3CACHE__V1__REQUEST__INIT;
	rreq.op_case = K3CACHE__V1__REQUEST__OP_RESTORE;
	rreq.restore = &restore;
	rreq.id = 7;
	assert_int_equal(daemonutil_send_request(rfd, &rreq), 0);
	assert_int_equal(daemonutil_read_all(rfd, kib, sizeof(kib), 5000), 0);
	assert_int_equal(counter(c, "restores_streaming"), 1);

	/* keep trickling: 1 KiB every 2 s is far under 1 MiB/s; after the 10 s
	 * window each is closed, headers too */
	uint64_t before = counter(c, "uploads_too_slow"), timeouts0 = counter(c, "timeouts");
	for (int round = 0; round < 8; round++) {
		daemonutil_sleep_ms(2000);
		for (int i = 0; i < SLOW; i++)
			if (fds[i] >= 0 && daemonutil_write_all(fds[i], kib, sizeof(kib)) != 0) {
				close(fds[i]);
				fds[i] = -1;
			}
		for (int i = 0; i < HDRS; i++)
			if (hfds[i] >= 0 && daemonutil_write_all(hfds[i], kib, sizeof(kib)) != 0) {
				close(hfds[i]);
				hfds[i] = -1;
			}
		for (int i = 0; i < REFUSED; i++)
			if (rfds[i] >= 0 && daemonutil_write_all(rfds[i], kib, sizeof(kib)) != 0) {
				close(rfds[i]);
				rfds[i] = -1;
			}
		if (rfd >= 0 && daemonutil_read_all(rfd, kib, sizeof(kib), 1000) != 0) {
			close(rfd); /* closed by the daemon */
			rfd = -1;
		}
		if (counter(c, "uploads_too_slow") - before >= SLOW + HDRS + REFUSED &&
		    counter(c, "downloads_too_slow") >= 1)
			break;
	}
	assert_int_equal(counter(c, "uploads_too_slow") - before, SLOW + HDRS + REFUSED);
	assert_int_equal(counter(c, "downloads_too_slow"), 1);
	assert_int_equal(counter(c, "timeouts"), timeouts0); /* each close counted once */
	assert_int_equal(counter(c, "restores_streaming"), 0);
	if (rfd >= 0) {
		assert_true(daemonutil_closed(rfd, 5000));
		close(rfd);
	}
	assert_int_equal(counter(c, "inflight_bytes"), 0);
	for (int i = 0; i < SLOW; i++)
		if (fds[i] >= 0) {
			assert_true(daemonutil_closed(fds[i], 5000));
			close(fds[i]);
		}
	for (int i = 0; i < HDRS; i++)
		if (hfds[i] >= 0) {
			assert_true(daemonutil_closed(hfds[i], 5000));
			close(hfds[i]);
		}
	for (int i = 0; i < REFUSED; i++)
		if (rfds[i] >= 0) {
			assert_true(daemonutil_closed(rfds[i], 5000));
			close(rfds[i]);
		}
	k3cache_close(c);
	k3cache_model_free(m);
	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	daemonutil_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_slow_uploads_do_not_starve),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
