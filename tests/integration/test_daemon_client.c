/* The real daemon through libk3cache: publish in one process and restore in
 * another, byte for byte; restarts; concurrent clients; a stalled client;
 * SIGTERM during a publish; in-flight memory backpressure; and the client's
 * own validation of what a daemon sends (the C4 mutant caught at the client). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <lmdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "blob.h"
#include "checksum.h"
#include "daemonutil.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "model.h"
#include "prefix.h"
#include "snaputil.h"
#include "tamperproxy.h"

static struct daemonutil d;
static struct k3cache_model *twin;
static const char *stage_size; /* argv: --stage-size SIZE streams publishes */

struct snap {
	uint32_t n;
	struct k3cache_buf *bufs;
};

static struct snap make_snap(const struct k3cache_model *m, uint32_t p, uint32_t seed)
{
	struct snap s = {m->n_layers, calloc(m->n_layers, sizeof(struct k3cache_buf))};
	for (uint32_t i = 0; i < m->n_layers; i++)
		s.bufs[i] = snaputil_layer(m, i, p, seed);
	return s;
}

static void free_snap(struct snap *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		free((void *)s->bufs[i].data);
	free(s->bufs);
}

static void tokens_for(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 3;
}

static struct k3cache *connect_ok(void)
{
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(d.sock, &c, &e) != 0)
		fail_msg("connect: %s", e.message);
	return c;
}

/* Publishes a snapshot made beforehand (make_snap) of tokens_for(p, base). */
static int publish_snap(struct k3cache *c, uint32_t p, uint32_t base, const struct snap *s,
                        struct k3cache_publish_result *res)
{
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, base);
	struct k3cache_error e;
	struct k3cache_publish_result local;
	int rc = k3cache_publish(c, twin->fingerprint, "", 0, t, p, s->bufs, s->n,
	                         res ? res : &local, &e);
	if (rc)
		fprintf(stderr, "publish: %s\n", e.message);
	free(t);
	return rc;
}

static int publish(struct k3cache *c, uint32_t p, uint32_t base, uint32_t seed,
                   struct k3cache_publish_result *res)
{
	struct snap s = make_snap(twin, p, seed);
	int rc = publish_snap(c, p, base, &s, res);
	free_snap(&s);
	return rc;
}

/* Restores by lookup and compares every byte with a fresh make_snap(). */
static void expect_restore(struct k3cache *c, uint32_t p, uint32_t base, uint32_t seed)
{
	uint32_t *t = malloc((p + 5) * sizeof(uint32_t));
	tokens_for(t, p + 5, base);
	struct snap want = make_snap(twin, p, seed);
	void **bufs = calloc(twin->n_layers, sizeof(void *));
	size_t *caps = calloc(twin->n_layers, sizeof(size_t));
	size_t *lens = calloc(twin->n_layers, sizeof(size_t));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = model_layer_blob_size(&twin->layers[i], p);
		bufs[i] = malloc(caps[i]);
	}
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	if (k3cache_lookup(c, twin->fingerprint, "", 0, t, p + 5, 0, &lr, &e) != 0)
		fail_msg("lookup: %s", e.message);
	assert_int_equal(lr.prefix_len, p);
	uint32_t got_p = 0;
	if (k3cache_restore_into(c, twin, lr.key, bufs, caps, lens, &got_p, &e) != 0)
		fail_msg("restore: %s", e.message);
	assert_int_equal(got_p, p);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		assert_int_equal(lens[i], want.bufs[i].len);
		assert_memory_equal(bufs[i], want.bufs[i].data, lens[i]);
		free(bufs[i]);
	}
	free(bufs);
	free(caps);
	free(lens);
	free_snap(&want);
	free(t);
}

static int start_daemon(void)
{
	if (stage_size)
		return daemonutil_start(&d, "--max-inflight", "4M", "--stall-timeout", "3s",
		                        "--stage-size", stage_size, (char *)NULL);
	return daemonutil_start(&d, "--max-inflight", "4M", "--stall-timeout", "3s", (char *)NULL);
}

static int setup(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	twin = model_load_file(path, err);
	if (!twin || daemonutil_init(&d) || start_daemon())
		return -1;
	struct k3cache *c = connect_ok();
	struct k3cache_error e;
	int rc = k3cache_put_model(c, twin, NULL, &e);
	k3cache_close(c);
	return rc;
}

static int teardown(void **state)
{
	(void)state;
	int rc = daemonutil_stop(&d, SIGTERM);
	daemonutil_cleanup(&d);
	model_free(twin);
	return rc == 0 ? 0 : -1;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_publish_in_one_process_restore_in_another(void **state)
{
	(void)state;
	pid_t pid = fork();
	if (pid == 0) {
		struct k3cache *c;
		struct k3cache_error e;
		if (k3cache_connect(d.sock, &c, &e) != 0)
			_exit(2);
		int rc = publish(c, 37, 1000, 5, NULL);
		k3cache_close(c);
		_exit(rc ? 1 : 0);
	}
	int status;
	waitpid(pid, &status, 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	struct k3cache *c = connect_ok();
	expect_restore(c, 37, 1000, 5);
	k3cache_close(c);
}

static int collect_layer(uint32_t index, const void *blob, size_t len, void *ctx)
{
	uint64_t *sums = ctx;
	sums[index] = checksum_blob(blob, len, index);
	return 0;
}

static void test_lookup_restore_one_round_trip(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	assert_int_equal(publish(c, 20, 5000, 9, NULL), 0);
	uint32_t t[30];
	tokens_for(t, 30, 5000);
	uint64_t sums[8] = {0};
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_equal(
	        k3cache_lookup_restore(c, twin, "", 0, t, 30, 0, collect_layer, sums, &lr, &e), 0);
	assert_int_equal(lr.prefix_len, 20);
	struct snap want = make_snap(twin, 20, 9);
	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(sums[i], checksum_blob(want.bufs[i].data, want.bufs[i].len, i));
	free_snap(&want);
	/* a miss calls nothing */
	t[0] = 424242;
	memset(sums, 0, sizeof(sums));
	assert_int_equal(
	        k3cache_lookup_restore(c, twin, "", 0, t, 30, 0, collect_layer, sums, &lr, &e), 0);
	assert_int_equal(lr.prefix_len, 0);
	assert_int_equal(sums[0], 0);
	k3cache_close(c);
}

/* A callback that restores another entry on the same handle (a prefetch,
 * say) gets that entry's bytes in its own call, and the outer restore goes
 * on delivering its own entry's. Before, both restores shared the handle's
 * buffer: the outer one went on to hand over the inner entry's layers 1 to
 * N-1 as its own and answered success. */
struct nested {
	struct k3cache *c;
	const uint8_t *other_key; /* restored from layer 0's call */
	uint32_t p, seed, other_p, other_seed;
	int wrong, inner_rc, inner_wrong, outer_calls;
};

static int check_layer_of(uint32_t index, const void *blob, size_t len, uint32_t p, uint32_t seed)
{
	struct k3cache_buf want = snaputil_layer(twin, index, p, seed);
	int same = want.len == len && memcmp(want.data, blob, len) == 0;
	free((void *)want.data);
	return same;
}

static int inner_layer(uint32_t index, const void *blob, size_t len, void *ctx)
{
	struct nested *x = ctx;
	x->inner_wrong += !check_layer_of(index, blob, len, x->other_p, x->other_seed);
	return 0;
}

static int outer_layer(uint32_t index, const void *blob, size_t len, void *ctx)
{
	struct nested *x = ctx;
	x->outer_calls++;
	if (index == 0) {
		struct k3cache_error e;
		uint32_t p = 0;
		x->inner_rc =
		        k3cache_restore_each(x->c, twin, x->other_key, inner_layer, x, &p, &e);
		if (x->inner_rc)
			print_message("inner restore: %s\n", e.message);
	}
	x->wrong += !check_layer_of(index, blob, len, x->p, x->seed);
	return 0;
}

static void test_restore_from_a_layer_callback(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result a, b, big;
	assert_int_equal(publish(c, 40, 61000, 17, &a), 0);
	assert_int_equal(publish(c, 40, 62000, 18, &b), 0);    /* the same size */
	assert_int_equal(publish(c, 300, 63000, 19, &big), 0); /* a larger one */
	const uint8_t *others[] = {b.key, big.key};
	const uint32_t other_p[] = {40, 300}, other_seed[] = {18, 19};
	for (int k = 0; k < 2; k++) {
		struct k3cache_error e;
		struct nested x = {c, others[k], 40, 17, other_p[k], other_seed[k], 0, -1, 0, 0};
		uint32_t p = 0;
		int rc = k3cache_restore_each(c, twin, a.key, outer_layer, &x, &p, &e);
		if (rc)
			fail_msg("restore_each: %s", e.message);
		assert_int_equal(p, 40);
		assert_int_equal(x.outer_calls, (int)twin->n_layers);
		assert_int_equal(x.inner_rc, 0);
		assert_int_equal(x.inner_wrong, 0);
		assert_int_equal(x.wrong, 0); /* before: all 8 layers the other entry's */
		/* the same through lookup_restore */
		x = (struct nested){c, others[k], 40, 17, other_p[k], other_seed[k], 0, -1, 0, 0};
		uint32_t t[41];
		tokens_for(t, 41, 61000);
		struct k3cache_lookup_result lr;
		rc = k3cache_lookup_restore(c, twin, "", 0, t, 41, 0, outer_layer, &x, &lr, &e);
		if (rc)
			fail_msg("lookup_restore: %s", e.message);
		assert_int_equal(lr.prefix_len, 40);
		assert_int_equal(x.inner_rc, 0);
		assert_int_equal(x.inner_wrong, 0);
		assert_int_equal(x.wrong, 0);
	}
	/* the handle goes on as before */
	expect_restore(c, 40, 61000, 17);
	k3cache_close(c);
}

/* A TCP listener whose accept queue is full drops new handshakes, as a
 * host that is down or behind a firewall does: k3cache_connect_timeout gives
 * up after its time, where k3cache_connect waits its 60 s. The daemon
 * itself, through it, is reached as through k3cache_connect. */
static void test_connect_timeout_bounds_the_connect(void **state)
{
	(void)state;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t alen = sizeof(a);
	assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(lfd, 0), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
	int fill[4];
	for (int i = 0; i < 4; i++) { /* never accepted: the queue stays full */
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		(void)connect(fill[i], (struct sockaddr *)&a, sizeof(a));
	}
	char addr[64];
	snprintf(addr, sizeof(addr), "tcp:127.0.0.1:%d", ntohs(a.sin_port));
	struct k3cache *c = NULL;
	struct k3cache_error e;
	double t0 = daemonutil_now();
	int rc = k3cache_connect_timeout(addr, 300, &c, &e);
	double took = daemonutil_now() - t0;
	print_message("a connect to a full queue, 300 ms: code %d after %.2f s: %s\n", rc, took,
	              e.message);
	assert_int_not_equal(rc, 0);
	assert_null(c);
	assert_true(e.unreachable);
	assert_true(took < 2.0);
	for (int i = 0; i < 4; i++)
		close(fill[i]);
	close(lfd);
	assert_int_equal(k3cache_connect_timeout(d.sock, 300, &c, &e), 0);
	assert_int_equal(k3cache_hello(c, NULL, 0, &e), 0);
	k3cache_close(c);
}

/* The C4 mutant at the client: bytes that a faulty daemon (here, a test hook)
 * hands over with a KDA tag in the MLA slot, or a swapped MLA row, are
 * refused and nothing reaches the worker. */
static void tag_to_kda(uint32_t index, void *blob, size_t len)
{
	(void)len;
	if (index == 3)
		((unsigned char *)blob)[0] = BLOB_TAG_KDA;
}

static void swap_mla_rows(uint32_t index, void *blob, size_t len)
{
	(void)len;
	if (index != 3)
		return;
	unsigned char *k = (unsigned char *)blob + 1 + 4 + 4;
	unsigned char tmp[768 * 4];
	memcpy(tmp, k, sizeof(tmp));
	memcpy(k, k + sizeof(tmp), sizeof(tmp));
	memcpy(k + sizeof(tmp), tmp, sizeof(tmp));
}

/* A client connected through the tampering proxy. */
static struct k3cache *connect_tampered(struct tamperproxy *proxy)
{
	assert_int_equal(tamperproxy_start(proxy, d.dir, d.sock), 0);
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(proxy->path, &c, &e) != 0)
		fail_msg("connect through the proxy: %s", e.message);
	return c;
}

static void test_client_refuses_tampered_restore(void **state)
{
	(void)state;
	struct tamperproxy proxy;
	struct k3cache *c = connect_tampered(&proxy);
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 12, 7000, 3, &res), 0);
	uint64_t sums[8] = {0};
	uint32_t p = 99;
	struct k3cache_error e;
	tamperproxy_set(&proxy, tag_to_kda);
	assert_int_not_equal(k3cache_restore_each(c, twin, res.key, collect_layer, sums, &p, &e),
	                     0);
	assert_non_null(strstr(e.message, "layer 3"));
	assert_int_equal(sums[0], 0); /* no callback ran */
	tamperproxy_set(&proxy, swap_mla_rows);
	assert_int_not_equal(k3cache_restore_each(c, twin, res.key, collect_layer, sums, &p, &e),
	                     0);
	assert_non_null(strstr(e.message, "checksum"));
	assert_int_equal(sums[0], 0);
	/* the connection still works, and an honest restore passes */
	tamperproxy_set(&proxy, NULL);
	assert_int_equal(k3cache_restore_each(c, twin, res.key, collect_layer, sums, &p, &e), 0);
	assert_int_equal(p, 12);
	/* and a worker that asks with another model's spec gets nothing */
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/tiny-hybrid.json", K3_SHARED_DIR);
	struct k3cache_model *tiny = model_load_file(path, err);
	memset(sums, 0, sizeof(sums));
	assert_int_not_equal(k3cache_restore_each(c, tiny, res.key, collect_layer, sums, &p, &e),
	                     0);
	assert_int_equal(sums[0], 0);
	model_free(tiny);
	k3cache_close(c);
	tamperproxy_stop(&proxy);
}

/* The same with a restore of many pieces (over 32 MiB): the tampered bytes
 * arrive over the socket and go through the piecewise check (blob_stream),
 * 256 KiB at a time, as any received ones. */
static void test_large_restore_checked_while_received(void **state)
{
	(void)state;
	struct tamperproxy proxy;
	struct k3cache *c = connect_tampered(&proxy);
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 4000, 1200000, 21, &res), 0);
	uint64_t sums[8] = {0};
	uint32_t p = 0;
	struct k3cache_error e;
	tamperproxy_set(&proxy, swap_mla_rows);
	assert_int_not_equal(k3cache_restore_each(c, twin, res.key, collect_layer, sums, &p, &e),
	                     0);
	assert_non_null(strstr(e.message, "layer 3: checksum mismatch"));
	assert_int_equal(sums[0], 0);
	tamperproxy_set(&proxy, tag_to_kda);
	assert_int_not_equal(k3cache_restore_each(c, twin, res.key, collect_layer, sums, &p, &e),
	                     0);
	assert_int_equal(sums[0], 0);
	tamperproxy_set(&proxy, NULL);
	expect_restore(c, 4000, 1200000, 21);
	k3cache_close(c);
	tamperproxy_stop(&proxy);
}

/* Every change of a connection's state goes through one setter, which
 * traces it at debug level (as memcached's conn_set_state): a publish and a
 * restore show each step of their way. */
static void test_state_transitions_traced(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 4000, 1300000, 23, &res), 0);
	expect_restore(c, 4000, 1300000, 23);
	k3cache_close(c);
	static const char *const steps[] = {
	        ": READ_LEN -> READ_HEADER",
	        ": READ_HEADER -> WAIT_MEMORY",
	        ": WAIT_MEMORY -> READ_PAYLOAD",
	        ": READ_PAYLOAD -> BUSY",
	        ": BUSY -> READ_LEN",
	        ": READ_HEADER -> SENDING",
	        ": SENDING -> READ_LEN",
	};
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
		if (!daemonutil_log_has(&d, steps[i]))
			fail_msg("the daemon's log has no \"conn N%s\"", steps[i]);
}

static uint64_t counter(struct k3cache *c, const char *name);

struct verify_call {
	atomic_int sent; /* the request is about to go */
	atomic_int over; /* its answer came */
	double answered; /* when its answer came (daemonutil_now) */
	uint64_t checked;
	int rc;
};

static void *verify_all(void *arg)
{
	struct verify_call *v = arg;
	struct k3cache *c = connect_ok();
	K3cache__V1__Request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Verify op = K3CACHE__V1__VERIFY__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
	req.verify = &op;
	K3cache__V1__Response *resp = NULL;
	struct k3cache_error e;
	atomic_store(&v->sent, 1);
	v->rc = k3cache_call(c, &req, &resp, &e);
	v->answered = daemonutil_now();
	atomic_store(&v->over, 1);
	if (!v->rc)
		v->checked = resp->checked;
	k3cache_response_free(resp);
	k3cache_close(c);
	return NULL;
}

/* A verify reads the whole store; it runs in batches, so that a publish
 * sent while it runs is answered before it is done (a verify run whole
 * kept every publish waiting until its end). Meanwhile Stat says how far
 * it is (k3cachectl verify's progress). */
static void test_publish_interleaves_with_verify(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	const uint32_t n = 120;
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct k3cache_publish_result res;
		assert_int_equal(publish(c, 250, 2000000 + i * 10000, 40 + i, &res), 0);
		bytes += res.bytes;
	}
	assert_true(bytes > 4 * (UINT64_C(64) << 20)); /* several of the daemon's batches */
	struct verify_call v = {0};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, verify_all, &v), 0);
	while (!atomic_load(&v.sent))
		daemonutil_sleep_ms(1);
	uint64_t total = 0, done = 0;
	for (int i = 0; i < 2000 && !total && !atomic_load(&v.over); i++) {
		daemonutil_sleep_ms(1);
		total = counter(c, "verify_total_bytes");
		done = counter(c, "verify_done_bytes");
	}
	assert_true(total >= bytes); /* every entry listed, the 120 among them */
	assert_true(done > 0 && done < total);
	assert_int_equal(publish(c, 250, 3900000, 7, NULL), 0);
	double published = daemonutil_now();
	pthread_join(th, NULL);
	assert_int_equal(v.rc, 0);
	assert_true(v.checked >= n);
	assert_int_equal(counter(c, "verify_total_bytes"), 0); /* none running */
	if (!(published < v.answered))
		fail_msg(
		        "the publish was answered %.3f s after the verify: it waited for the whole "
		        "verify",
		        published - v.answered);
	k3cache_close(c);
}

/* A restore is queued a chunk at a time as the socket drains: an answer to
 * a request pipelined behind it must still come after its whole payload. */
static void test_pipelined_request_after_large_restore(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 1500, 2400000, 23, &res), 0);
	k3cache_close(c);
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Restore rst = K3CACHE__V1__RESTORE__INIT;
	rst.key.data = res.key;
	rst.key.len = sizeof(res.key);
	req.op_case = K3CACHE__V1__REQUEST__OP_RESTORE;
	req.restore = &rst;
	req.id = 40;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	assert_int_equal(daemonutil_send_hello(fd, 41), 0);

	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->id, 40);
	assert_int_equal(r->code, 0);
	struct snap want = make_snap(twin, 1500, 23);
	uint64_t total = 0;
	for (uint32_t i = 0; i < want.n; i++)
		total += want.bufs[i].len;
	assert_true(total > (4u << 20)); /* several chunks */
	assert_int_equal(r->payload_len, total);
	frame_response_free(r);
	for (uint32_t i = 0; i < want.n; i++) {
		unsigned char *got = malloc(want.bufs[i].len);
		assert_int_equal(daemonutil_read_all(fd, got, want.bufs[i].len, 5000), 0);
		assert_memory_equal(got, want.bufs[i].data, want.bufs[i].len);
		free(got);
	}
	free_snap(&want);
	r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->id, 41);
	assert_int_equal(r->code, 0);
	frame_response_free(r);
	close(fd);
}

/* A prompt whose Lookup header would pass the 16 MiB frame limit is refused
 * by the library before anything is sent; the connection stays usable. */
static void test_lookup_over_header_limit(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	const uint32_t n = 4u << 20; /* 5-byte varints: ~20 MiB */
	uint32_t *t = malloc(n * sizeof(uint32_t));
	for (uint32_t i = 0; i < n; i++)
		t[i] = 0xF0000000u + i;
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	assert_int_not_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, n, 0, &lr, &e), 0);
	assert_int_equal(e.code, STATUS_TOO_LARGE);
	assert_non_null(strstr(e.message, "16 MiB"));
	free(t);
	assert_int_equal(publish(c, 9, 3100000, 2, NULL), 0);
	expect_restore(c, 9, 3100000, 2);
	k3cache_close(c);
}

static uint64_t stat_counter(struct k3cache *c, const char *name)
{
	uint64_t v = 0;
	struct k3cache_error e;
	if (k3cache_stat_counter(c, name, &v, &e) != 0)
		fail_msg("stat %s: %s", name, e.message);
	return v;
}

/* --yield-rate: an upload that arrives while lookups do is read in paced
 * slices (counted as ingest_yields) and still stored whole; with no lookup
 * in the last 50 ms it is read at full speed. */
/* Looks up, on its own connection, until told to stop. */
struct lookup_loop {
	atomic_int stop;
	int n;
	const char *sock; /* NULL: the suite's daemon */
};

static void *lookups_until_stopped(void *arg)
{
	struct lookup_loop *loop = arg;
	struct k3cache *c;
	struct k3cache_error ce;
	if (k3cache_connect(loop->sock ? loop->sock : d.sock, &c, &ce) != 0)
		fail_msg("connect: %s", ce.message);
	uint32_t t[8];
	tokens_for(t, 8, 3600000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	while (!atomic_load(&loop->stop)) {
		if (k3cache_lookup(c, twin->fingerprint, "", 0, t, 8, 0, &lr, &e) == 0)
			loop->n++;
		daemonutil_sleep_ms(5);
	}
	k3cache_close(c);
	return NULL;
}

static void test_upload_yields_to_lookups(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	uint32_t t[8];
	tokens_for(t, 8, 3300000);
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	uint64_t y0 = stat_counter(c, "ingest_yields");
	/* made first: under ASan making it takes longer than the 50 ms window */
	struct snap s = make_snap(twin, 1000, 31); /* ~3 MiB */
	assert_int_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, 8, 0, &lr, &e), 0);
	/* lookups keep arriving from another client while the upload runs, so
	 * that a busy machine stretching the gap past the window cannot hide
	 * the yields */
	struct lookup_loop loop = {.stop = 0};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, lookups_until_stopped, &loop), 0);
	assert_int_equal(publish_snap(c, 1000, 3400000, &s, NULL), 0);
	atomic_store(&loop.stop, 1);
	pthread_join(th, NULL);
	assert_true(loop.n > 0);
	free_snap(&s);
	uint64_t y1 = stat_counter(c, "ingest_yields");
	assert_true(y1 > y0);
	expect_restore(c, 1000, 3400000, 31);
	daemonutil_sleep_ms(150); /* no lookup for three windows */
	assert_int_equal(publish(c, 1000, 3500000, 32, NULL), 0);
	assert_int_equal(stat_counter(c, "ingest_yields"), y1);
	/* a counter the daemon does not have */
	uint64_t v = 7;
	assert_int_not_equal(k3cache_stat_counter(c, "no_such_counter", &v, &e), 0);
	assert_int_equal(e.code, STATUS_NOT_FOUND);
	assert_int_equal(v, 7);
	k3cache_close(c);
}

/* The daemon's own pause of an upload (--yield-rate) is not the client
 * stalling: a pause longer than --stall-timeout closed a healthy publish
 * mid-frame ("stalled mid-frame", counted in timeouts), as the pause made
 * no progress and the sweep took it for the client's. */
static void test_yield_pause_is_not_a_stall(void **state)
{
	(void)state;
	struct daemonutil y;
	assert_int_equal(daemonutil_init(&y), 0);
	assert_int_equal(daemonutil_start(&y, "--yield-rate", "512KiB", "--stall-timeout", "1s",
	                                  "--min-upload-rate", "0", (char *)NULL),
	                 0);
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(y.sock, &c, &e), 0);
	assert_int_equal(k3cache_put_model(c, twin, NULL, &e), 0);
	struct snap s = make_snap(twin, 400, 33); /* ~1.2 MiB: pauses of 2 s or so */
	struct lookup_loop loop = {.stop = 0, .sock = y.sock};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, lookups_until_stopped, &loop), 0);
	daemonutil_sleep_ms(50);
	int rc = publish_snap(c, 400, 3700000, &s, NULL);
	atomic_store(&loop.stop, 1);
	pthread_join(th, NULL);
	free_snap(&s);
	assert_int_equal(rc, 0);
	struct k3cache *q;
	assert_int_equal(k3cache_connect(y.sock, &q, &e), 0);
	assert_true(stat_counter(q, "ingest_yields") > 0); /* it was paused */
	assert_int_equal(stat_counter(q, "timeouts"), 0);
	assert_int_equal(stat_counter(q, "closed_mid_frame"), 0);
	expect_restore(q, 400, 3700000, 33);
	k3cache_close(q);
	k3cache_close(c);
	daemonutil_cleanup(&y);
}

/* A publish of a snapshot the daemon holds already sends no payload: the
 * library asks first, and answers "exists". */
static void test_publish_of_stored_entry_sends_nothing(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 600, 8800000, 41, &res), 0); /* ~1.8 MiB */
	assert_true(res.created);
	uint64_t in0 = stat_counter(c, "bytes_in");
	struct k3cache_publish_result again;
	assert_int_equal(publish(c, 600, 8800000, 41, &again), 0);
	uint64_t in1 = stat_counter(c, "bytes_in");
	assert_false(again.created);
	assert_memory_equal(again.key, res.key, K3CACHE_KEY_LEN);
	assert_int_equal(again.bytes, res.bytes);
	assert_true(in1 - in0 < 16384); /* the question and a stat, not 1.8 MiB */
	k3cache_close(c);
}

/* Bytes a client's socket holds unread here: a Unix socket pair with the
 * buffers both ends ask for (4 MiB; the kernel doubles what it grants, up
 * to net.core.wmem_max), filled until it would block. */
static size_t socket_holds(void)
{
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int big = 4 << 20;
	for (int i = 0; i < 2; i++) {
		setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
		setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	}
	static unsigned char chunk[64 << 10];
	size_t held = 0;
	for (;;) {
		ssize_t n = send(sv[0], chunk, sizeof(chunk), MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n <= 0)
			break;
		held += (size_t)n;
	}
	close(sv[0]);
	close(sv[1]);
	return held;
}

/* A publish its header alone refuses (an unknown model; over the capacity)
 * is answered before its payload is uploaded, not after: the daemon answers
 * and skips what comes, and the client stops sending once it sees the
 * answer and closes, reporting the daemon's answer. What reaches the daemon
 * is what the socket held before the answer (the client sends 1 MiB at a
 * time and looks for an answer between) and what the daemon read in the
 * callback that answered (2 MiB at most): 10.9 MiB here, so a bound of
 * 8 MiB failed on a loaded machine. */
static void test_refused_publish_is_not_uploaded(void **state)
{
	(void)state;
	struct daemonutil small;
	assert_int_equal(daemonutil_init(&small), 0);
	assert_int_equal(daemonutil_start(&small, "--max-bytes", "4MiB", "--stage-size", "1MiB",
	                                  (char *)NULL),
	                 0);
	struct snap s = make_snap(twin, 2000, 7); /* ~20 MiB */
	size_t payload = 0;
	for (uint32_t i = 0; i < s.n; i++)
		payload += s.bufs[i].len;
	const size_t bound = socket_holds() + (2u << 20) + (1u << 20) + (64u << 10);
	print_message("the payload %zu bytes; at most %zu may be read before the answer\n", payload,
	              bound);
	assert_true(bound < payload / 3 * 2); /* the test still means "not uploaded" */
	uint32_t *t = malloc(2000 * sizeof(uint32_t));
	tokens_for(t, 2000, 9100000);
	struct k3cache *c, *q;
	struct k3cache_error e;
	struct k3cache_publish_result res;
	assert_int_equal(k3cache_connect(small.sock, &q, &e), 0);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(k3cache_connect(small.sock, &c, &e), 0);
		uint64_t in0 = 0, in1 = 0;
		assert_int_equal(k3cache_stat_counter(q, "bytes_in", &in0, &e), 0);
		int rc = k3cache_publish(c, twin->fingerprint, "", 0, t, 2000, s.bufs, s.n, &res,
		                         &e);
		assert_int_equal(rc, round == 0 ? STATUS_UNKNOWN_MODEL : STATUS_TOO_LARGE);
		assert_non_null(strstr(e.message, round == 0 ? "unknown model" : "capacity"));
		assert_true(e.unreachable); /* closed: connect again */
		assert_int_equal(k3cache_stat_counter(q, "bytes_in", &in1, &e), 0);
		/* the header and what the socket took before the answer: not 20 MiB */
		if (in1 - in0 >= bound)
			fail_msg("%llu bytes read before the refusal (bound %zu)",
			         (unsigned long long)(in1 - in0), bound);
		k3cache_close(c);
		if (round == 0)
			assert_int_equal(k3cache_put_model(q, twin, NULL, &e), 0);
	}
	/* refused payloads the socket may take whole before the answer comes:
	 * either the client saw the answer and closed (unreachable), or the
	 * daemon skipped the rest and the connection goes on; never an open
	 * handle on a connection the daemon closed */
	uint64_t cut0 = 0;
	assert_int_equal(k3cache_stat_counter(q, "closed_mid_frame", &cut0, &e), 0);
	for (uint32_t p = 110; p <= 1010; p += 100) {
		struct snap big = make_snap(twin, p, 8);
		assert_int_equal(k3cache_connect(small.sock, &c, &e), 0);
		/* P up to 510 with a model never put: UNKNOWN_MODEL; from 610
		 * (over 6 MB) with the twin: over the 4 MiB capacity */
		int known = p > 510;
		uint8_t unknown[32];
		memcpy(unknown, twin->fingerprint, 32);
		if (!known)
			unknown[0] ^= 0xff;
		/* a delta too: the daemon's reason, not a resend of the whole on a
		 * connection the client has closed */
		uint8_t base[32] = {7};
		int rc = p % 200 == 110 ? k3cache_publish(c, unknown, "", 0, t, p, big.bufs, big.n,
		                                          &res, &e)
		                        : k3cache_publish_delta(c, unknown, "", 0, t, p, big.bufs,
		                                                big.n, base, 64, &res, &e);
		if (rc != (known ? STATUS_TOO_LARGE : STATUS_UNKNOWN_MODEL))
			fail_msg("P=%u: code %d: %s", p, rc, e.message);
		int closed = e.unreachable;
		uint64_t v;
		rc = k3cache_stat_counter(c, "bytes_in", &v, &e);
		if (closed)
			assert_int_not_equal(rc, 0);
		else if (rc != 0)
			fail_msg("P=%u: the connection was kept but fails: %s", p, e.message);
		k3cache_close(c);
		free_snap(&big);
	}
	/* refusals answered, the rest not sent: nothing cut mid-frame */
	uint64_t cut1 = 0;
	assert_int_equal(k3cache_stat_counter(q, "closed_mid_frame", &cut1, &e), 0);
	assert_int_equal(cut1, cut0);
	/* what fits is stored as before */
	struct snap small_snap = make_snap(twin, 100, 7);
	assert_int_equal(k3cache_publish(q, twin->fingerprint, "", 0, t, 100, small_snap.bufs,
	                                 small_snap.n, &res, &e),
	                 0);
	assert_true(res.created);
	k3cache_close(q);
	free_snap(&small_snap);
	free_snap(&s);
	free(t);
	assert_int_equal(daemonutil_stop(&small, SIGTERM), 0);
	daemonutil_cleanup(&small);
}

/* Buffers that share memory are refused before a byte of the restore is
 * read into them: one layer written over another's checked bytes would be
 * an OK with state never checked. The connection goes on. */
static void test_restore_into_aliased_buffers(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 100, 9300000, 3, &res), 0);
	void **bufs = calloc(twin->n_layers, sizeof(void *));
	size_t *caps = calloc(twin->n_layers, sizeof(size_t));
	size_t *lens = calloc(twin->n_layers, sizeof(size_t));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = model_layer_blob_size(&twin->layers[i], 100);
		bufs[i] = malloc(caps[i]);
	}
	void *kept = bufs[6];
	bufs[6] = (unsigned char *)bufs[3] + caps[3] - 4; /* its last float */
	uint32_t p = 0;
	struct k3cache_error e;
	assert_int_equal(k3cache_restore_into(c, twin, res.key, bufs, caps, lens, &p, &e),
	                 STATUS_INVALID);
	assert_non_null(strstr(e.message, "layer 3's buffer and layer 6's buffer share memory"));
	assert_int_equal(p, 0);
	/* end to end in one allocation: apart, restored */
	unsigned char *both = malloc(caps[3] + caps[6] + 1);
	assert_non_null(both);
	void *kept3 = bufs[3];
	bufs[3] = both;
	bufs[6] = both + caps[3];
	assert_int_equal(k3cache_restore_into(c, twin, res.key, bufs, caps, lens, &p, &e), 0);
	assert_int_equal(p, 100);
	bufs[3] = kept3;
	bufs[6] = kept;
	free(both);
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free(bufs[i]);
	free(bufs);
	free(caps);
	free(lens);
	k3cache_close(c);
}

/* A buffer too small is refused naming the public call that gives the size
 * (k3cache_model_blob_size with the layer and P), not an internal one; a
 * call's missing arguments are refused under the call's public name. */
static void test_restore_into_small_buffer_names_public_calls(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 32, 9400000, 5, &res), 0);
	void **bufs = calloc(twin->n_layers, sizeof(void *));
	size_t *caps = calloc(twin->n_layers, sizeof(size_t));
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = k3cache_model_blob_size(twin, i, 32);
		bufs[i] = malloc(caps[i]);
	}
	caps[3]--;
	uint32_t p = 0;
	struct k3cache_error e;
	assert_int_equal(k3cache_restore_into(c, twin, res.key, bufs, caps, NULL, &p, &e),
	                 STATUS_INVALID);
	char want[128];
	snprintf(want, sizeof(want),
	         "layer 3: its buffer holds %zu bytes, the blob is %zu "
	         "(k3cache_model_blob_size(model, 3, 32))",
	         caps[3], caps[3] + 1);
	if (!strstr(e.message, want))
		fail_msg("want \"%s\" in: %s", want, e.message);
	assert_null(strstr(e.message, "model_layer_blob_size"));
	assert_int_equal(k3cache_restore_into(c, twin, res.key, NULL, caps, NULL, &p, &e),
	                 STATUS_INVALID);
	assert_non_null(strstr(e.message, "k3cache_restore_into: key, bufs and caps"));
	assert_int_equal(k3cache_restore_arrays(c, twin, res.key, NULL, 0, &p, &e), STATUS_INVALID);
	assert_non_null(strstr(e.message, "k3cache_restore_arrays: key and layers"));
	assert_int_equal(k3cache_restore_each(c, twin, res.key, NULL, NULL, &p, &e),
	                 STATUS_INVALID);
	assert_non_null(strstr(e.message, "k3cache_restore_each: key and fn"));
	assert_int_equal(k3cache_put_model(c, NULL, NULL, &e), STATUS_INVALID);
	assert_non_null(strstr(e.message, "k3cache_put_model: no model spec"));
	for (uint32_t i = 0; i < twin->n_layers; i++)
		free(bufs[i]);
	free(bufs);
	free(caps);
	k3cache_close(c);
}

/* Announces a header of hlen bytes and sends `some` of them (zeros). */
static int raw_header_begun(uint32_t hlen, size_t some)
{
	int fd = daemonutil_connect_raw(d.sock);
	/* in one write: a daemon that refuses at the prefix may close before a
	 * second write */
	unsigned char buf[4 + 4096] = {(unsigned char)hlen, (unsigned char)(hlen >> 8),
	                               (unsigned char)(hlen >> 16), (unsigned char)(hlen >> 24)};
	assert_true(some <= 4096);
	assert_int_equal(daemonutil_write_all(fd, buf, 4 + some), 0);
	return fd;
}

/* Large headers (over 64 KiB), and what they decode to, are charged to
 * --max-inflight (4M here) while their requests live: a second one past the
 * cap is BUSY at its length prefix; one alone goes through whatever its
 * size. Before, every authenticated peer could hold 16 MiB of header and 64
 * MiB of tokens, uncounted. The charge is what a header may take: its bytes,
 * its decoding's budget (frame_decode_budget) and the fast path's tokens, 4
 * bytes a byte (it was 5 times its length, under the 8 times and 1 MiB the
 * decoding may take). */
static void test_large_headers_are_charged(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	int a = raw_header_begun(2u << 20, 100); /* 27 MiB charged: alone, taken */
	daemonutil_sleep_ms(200);
	assert_int_equal(counter(c, "header_bytes"), (1u << 20) + 13u * (2u << 20));
	int b = raw_header_begun(100u << 10, 100);
	frame_response *r = daemonutil_read_response(b, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_BUSY);
	assert_non_null(strstr(r->message, "large headers"));
	frame_response_free(r);
	assert_true(daemonutil_closed(b, 5000));
	close(b);
	/* small headers are not charged: a lookup goes on */
	struct k3cache_lookup_result lr;
	struct k3cache_error e;
	uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	assert_int_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, 8, 0, &lr, &e), 0);
	close(a);
	for (int i = 0; i < 100 && counter(c, "header_bytes") != 0; i++)
		daemonutil_sleep_ms(20);
	assert_int_equal(counter(c, "header_bytes"), 0);
	b = raw_header_begun(100u << 10, 100); /* now taken */
	daemonutil_sleep_ms(200);
	assert_int_equal(counter(c, "header_bytes"), (1u << 20) + 13u * (100u << 10));
	close(b);
	k3cache_close(c);
}

/* A conversation turn: the MLA rows depend only on (layer, row, column,
 * rows), so turns share them; the KDA state depends on seed. */
static struct snap make_turn(uint32_t p, uint32_t rows, uint32_t seed)
{
	struct snap s = make_snap(twin, p, seed);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		const struct model_layer *l = &twin->layers[i];
		if (l->mixer != MODEL_MIXER_MLA)
			continue;
		struct blob_view v;
		assert_int_equal(blob_parse(s.bufs[i].data, s.bufs[i].len, &v, NULL), BLOB_OK);
		unsigned char *b = (unsigned char *)s.bufs[i].data;
		if (!b)
			abort(); /* snaputil_layer ran out of memory */
		unsigned char *part[2] = {b + (v.v0.data - b), b + (v.v1.data - b)};
		for (uint32_t r = 0; r < p; r++)
			for (uint32_t k = 0; k < 2; k++) {
				uint32_t w = k ? l->v_row : l->k_row;
				for (uint32_t c = 0; c < w; c++) {
					uint32_t x = rows * 2654435761u + i * 40503u + r * 131u +
					             c * 7u + k;
					x ^= x >> 13;
					x *= 0x5bd1e995u;
					float f = (float)(x % 20001u) * 1e-4f - 1.0f;
					memcpy(part[k] + ((size_t)r * w + c) * 4, &f, 4);
				}
			}
	}
	return s;
}

static int publish_turn(struct k3cache *c, const uint32_t *t, uint32_t p, uint32_t rows,
                        uint32_t seed, const char *salt, const uint8_t *base, uint32_t base_rows,
                        struct k3cache_publish_result *res)
{
	struct snap s = make_turn(p, rows, seed);
	struct k3cache_error e;
	int rc = k3cache_publish_delta(c, twin->fingerprint, salt, strlen(salt), t, p, s.bufs, s.n,
	                               base, base_rows, res, &e);
	if (rc)
		fprintf(stderr, "publish: %s\n", e.message);
	free_snap(&s);
	return rc;
}

/* The restore of key is byte-identical to make_turn(p, rows, seed). */
static void expect_turn(struct k3cache *c, const uint8_t *key, uint32_t p, uint32_t rows,
                        uint32_t seed)
{
	struct snap want = make_turn(p, rows, seed);
	void *bufs[16];
	size_t caps[16], lens[16];
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		caps[i] = want.bufs[i].len;
		if (!caps[i])
			abort(); /* no layer is empty */
		bufs[i] = malloc(caps[i]);
	}
	uint32_t got = 0;
	struct k3cache_error e;
	if (k3cache_restore_into(c, twin, key, bufs, caps, lens, &got, &e) != 0)
		fail_msg("restore: %s", e.message);
	assert_int_equal(got, p);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		assert_int_equal(lens[i], want.bufs[i].len);
		assert_memory_equal(bufs[i], want.bufs[i].data, lens[i]);
		free(bufs[i]);
	}
	free_snap(&want);
}

/* Delta publish: a turn that resumed from a stored entry sends only its new
 * MLA rows, and restores byte for byte (staged too); every refusal (a base that is gone,
 * under another salt, not a prefix, shorter than the rows named, or with
 * other rows) ends in a whole publish that the library makes by itself. */
static void test_delta_publish(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	uint32_t t[1100];
	tokens_for(t, 1100, 7700000);
	struct k3cache_publish_result a, b, r;
	assert_int_equal(publish_turn(c, t, 600, 1, 1, "", NULL, 0, &a), 0);
	assert_true(a.created);
	uint64_t in0 = stat_counter(c, "bytes_in"), d0 = stat_counter(c, "delta_publishes");
	uint64_t r0 = stat_counter(c, "delta_refused");
	assert_int_equal(publish_turn(c, t, 900, 1, 2, "", a.key, 600, &b), 0);
	uint64_t in1 = stat_counter(c, "bytes_in");
	assert_true(b.created);
	/* under --stage-size 64KiB it is staged: its blocks placed, and held,
	 * stage by stage, the base's shared */
	assert_int_equal(b.delta_rows, 600);
	assert_int_equal(stat_counter(c, "delta_refused"), r0);
	assert_int_equal(stat_counter(c, "delta_publishes"), d0 + 1);
	/* what went over the socket: the KDA layers and 300 rows, not 900 */
	uint64_t whole = 0, mla_row = 0;
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		whole += model_layer_blob_size(&twin->layers[i], 900);
		if (twin->layers[i].mixer == MODEL_MIXER_MLA)
			mla_row += (uint64_t)(twin->layers[i].k_row + twin->layers[i].v_row) * 4;
	}
	assert_true(in1 - in0 < whole - 600 * mla_row + 65536);
	expect_turn(c, b.key, 900, 1, 2);

	uint64_t refused0 = stat_counter(c, "delta_refused");
	uint8_t gone[K3CACHE_KEY_LEN];
	memset(gone, 0x42, sizeof(gone));
	/* a base that is not stored */
	assert_int_equal(publish_turn(c, t, 950, 1, 3, "", gone, 600, &r), 0);
	assert_true(r.created);
	assert_int_equal(r.delta_rows, 0);
	expect_turn(c, r.key, 950, 1, 3);
	/* under another salt */
	assert_int_equal(publish_turn(c, t, 960, 1, 4, "x", b.key, 900, &r), 0);
	assert_int_equal(r.delta_rows, 0);
	expect_turn(c, r.key, 960, 1, 4);
	/* more rows named than the base holds */
	assert_int_equal(publish_turn(c, t, 1000, 1, 5, "", b.key, 950, &r), 0);
	assert_int_equal(r.delta_rows, 0);
	/* other rows than the base's */
	assert_int_equal(publish_turn(c, t, 1010, 2, 6, "", b.key, 900, &r), 0);
	assert_int_equal(r.delta_rows, 0);
	expect_turn(c, r.key, 1010, 2, 6);
	/* tokens that are not the base's */
	uint32_t u[1100];
	memcpy(u, t, sizeof(u));
	u[10] = 1;
	assert_int_equal(publish_turn(c, u, 1020, 1, 7, "", b.key, 900, &r), 0);
	assert_int_equal(r.delta_rows, 0);
	expect_turn(c, r.key, 1020, 1, 7);
	assert_int_equal(stat_counter(c, "delta_refused"), refused0 + 5);
	k3cache_close(c);
}

static void expect_verify_clean(struct k3cache *c);

/* Flips a byte of the v rows of block 0 of layer 3 (the first MLA layer)
 * under tokens t, as a bad disk would, leaving its stored sum: through LMDB,
 * with the daemon stopped. */
static void flip_block0(const uint32_t *t)
{
	uint8_t h[5][PREFIX_NODE_LEN];
	prefix_block_hashes(twin->fingerprint, "", 0, t, 64, h);
	unsigned char bk[PREFIX_NODE_LEN + 5] = {0};
	memcpy(bk, h[64 / PREFIX_BLOCK], PREFIX_NODE_LEN);
	bk[PREFIX_NODE_LEN + 3] = 3; /* the layer, big-endian */
	bk[PREFIX_NODE_LEN + 4] = 1; /* its v rows */
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = {sizeof(bk), bk}, v;
	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
	assert_int_equal(mdb_env_set_mapsize(env, (size_t)4 << 30), 0);
	assert_int_equal(mdb_env_open(env, d.db, 0, 0640), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "blocks", 0, &dbi), 0);
	assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[v.mv_size - 3] ^= 0x10;
	MDB_val nv = {v.mv_size, copy};
	assert_int_equal(mdb_put(txn, dbi, &k, &nv, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
	free(copy);
}

/* Whether one line of the daemon's log holds both texts. */
static int log_line_has(const char *a, const char *b)
{
	FILE *f = fopen(d.log, "r");
	char line[4096];
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, a) && strstr(line, b);
	if (f)
		fclose(f);
	return found;
}

/* A delta onto a base whose shared block was damaged on disk: the assembled
 * layer does not hash to the worker's sum because of the store's damage,
 * not the worker's rows. The daemon answers CORRUPT (a warning, counted with
 * the errors of damage, the base quarantined), not INVALID (a client's
 * mistake, at info), and the library publishes whole, so the turn is stored
 * all the same. Rows of the worker's that differ stay INVALID. */
static void test_delta_on_damaged_base_is_corrupt(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	uint32_t t[1000];
	tokens_for(t, 1000, 8800000);
	struct k3cache_publish_result a, b;
	assert_int_equal(publish_turn(c, t, 600, 1, 1, "", NULL, 0, &a), 0);
	uint64_t inv0 = stat_counter(c, "errors_invalid"), cor0 = stat_counter(c, "errors_corrupt");
	/* the worker's rows differ from the base's: its mistake */
	assert_int_equal(publish_turn(c, t, 700, 2, 2, "", a.key, 600, &b), 0);
	assert_int_equal(b.delta_rows, 0);
	assert_int_equal(stat_counter(c, "errors_invalid"), inv0 + 1);
	assert_int_equal(stat_counter(c, "errors_corrupt"), cor0);
	assert_true(log_line_has("info: ", "publish: INVALID: layer 3: the base's rows"));
	assert_true(log_line_has("info: ", "stored bytes hold their checksums"));
	k3cache_close(c);

	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	flip_block0(t);
	assert_int_equal(start_daemon(), 0);
	c = connect_ok();
	inv0 = stat_counter(c, "errors_invalid");
	cor0 = stat_counter(c, "errors_corrupt");
	uint64_t q0 = stat_counter(c, "quarantined"), r0 = stat_counter(c, "delta_refused");
	assert_int_equal(publish_turn(c, t, 900, 1, 3, "", a.key, 600, &b), 0);
	assert_true(b.created);
	assert_int_equal(b.delta_rows, 0); /* published whole */
	expect_turn(c, b.key, 900, 1, 3);
	assert_int_equal(stat_counter(c, "delta_refused"), r0 + 1);
	assert_int_equal(stat_counter(c, "errors_corrupt"), cor0 + 1);
	assert_int_equal(stat_counter(c, "errors_invalid"), inv0);
	assert_int_equal(stat_counter(c, "quarantined"), q0 + 1);
	if (!log_line_has("warn: ", "publish: CORRUPT: delta publish: the base entry is damaged"))
		fail_msg("no warning of the damaged base in %s", d.log);
	/* the damaged base goes (and its block with it): the store is clean
	 * again for the tests after this one */
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict ev = K3CACHE__V1__EVICT__INIT;
	ProtobufCBinaryData kb = {K3CACHE_KEY_LEN, a.key};
	ev.keys = &kb;
	ev.n_keys = 1;
	req.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	frame_response *resp;
	struct k3cache_error e;
	assert_int_equal(k3cache_call(c, &req, &resp, &e), 0);
	assert_int_equal(resp->code, 0);
	k3cache_response_free(resp);
	expect_verify_clean(c);
	k3cache_close(c);
}

static void test_restart_keeps_entries(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	assert_int_equal(publish(c, 25, 9000, 4, NULL), 0);
	k3cache_close(c);
	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	assert_int_equal(start_daemon(), 0);
	c = connect_ok();
	expect_restore(c, 25, 9000, 4);
	k3cache_close(c);
	/* and after a SIGKILL: every committed entry is still served */
	assert_int_equal(daemonutil_stop(&d, SIGKILL), 128 + SIGKILL);
	assert_int_equal(start_daemon(), 0);
	c = connect_ok();
	expect_restore(c, 25, 9000, 4);
	expect_restore(c, 37, 1000, 5);
	k3cache_close(c);
}

static void test_concurrent_clients(void **state)
{
	(void)state;
	pid_t kids[3];
	for (int k = 0; k < 3; k++) {
		kids[k] = fork();
		if (kids[k] == 0) {
			struct k3cache *c;
			struct k3cache_error e;
			if (k3cache_connect(d.sock, &c, &e) != 0)
				_exit(2);
			for (uint32_t i = 0; i < 8; i++) {
				uint32_t base = 100000u * (uint32_t)(k + 1) + i * 1000;
				if (publish(c, 16 + i, base, i + 1, NULL) != 0)
					_exit(3);
				uint32_t t[40];
				tokens_for(t, 40, base);
				struct k3cache_lookup_result lr;
				if (k3cache_lookup(c, twin->fingerprint, "", 0, t, 40, 0, &lr,
				                   &e) != 0 ||
				    lr.prefix_len != 16 + i)
					_exit(4);
			}
			k3cache_close(c);
			_exit(0);
		}
	}
	for (int k = 0; k < 3; k++) {
		int status;
		waitpid(kids[k], &status, 0);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	struct k3cache *c = connect_ok();
	expect_restore(c, 17, 200000 + 1000, 2);
	k3cache_close(c);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A client stalled mid-frame, and one that does not read a large restore,
 * do not delay anyone; the stalled one is closed after --stall-timeout. */
static void test_stalled_clients_do_not_block_others(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result big;
	assert_int_equal(publish(c, 2000, 300000, 7, &big), 0); /* ~10 MiB of MLA KV */
	/* stalled mid-header */
	int stalled = daemonutil_connect_raw(d.sock);
	unsigned char two[2] = {40, 0};
	daemonutil_write_all(stalled, two, 2);
	/* a reader that asks for the big entry and never reads */
	int lazy = daemonutil_connect_raw(d.sock);
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Restore rs = K3CACHE__V1__RESTORE__INIT;
	rs.key.data = big.key;
	rs.key.len = 32;
	req.op_case = K3CACHE__V1__REQUEST__OP_RESTORE;
	req.restore = &rs;
	req.id = 1;
	assert_int_equal(daemonutil_send_request(lazy, &req), 0);
	/* meanwhile others are served at once */
	double worst = 0;
	for (int i = 0; i < 20; i++) {
		double t0 = now_s();
		uint32_t t[30];
		tokens_for(t, 30, 5000);
		struct k3cache_lookup_result lr;
		struct k3cache_error e;
		assert_int_equal(k3cache_lookup(c, twin->fingerprint, "", 0, t, 30, 0, &lr, &e), 0);
		assert_int_equal(lr.prefix_len, 20);
		double dt = now_s() - t0;
		worst = dt > worst ? dt : worst;
	}
	assert_true(worst < 1.0);
	expect_restore(c, 20, 5000, 9);
	/* the stalled one is closed by the daemon after the stall timeout (3 s) */
	assert_true(daemonutil_closed(stalled, 8000));
	close(stalled);
	close(lazy);
	k3cache_close(c);
}

/* Two publishes larger together than --max-inflight (4M): the second waits
 * for memory instead of growing it, and both land. */
static void test_inflight_cap_waits(void **state)
{
	(void)state;
	pid_t kids[2];
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		if (kids[k] == 0) {
			struct k3cache *c;
			struct k3cache_error e;
			if (k3cache_connect(d.sock, &c, &e) != 0)
				_exit(2);
			int rc = publish(c, 600, 700000u + 10000u * (uint32_t)k, 11,
			                 NULL); /* ~3 MiB */
			k3cache_close(c);
			_exit(rc ? 1 : 0);
		}
	}
	for (int k = 0; k < 2; k++) {
		int status;
		waitpid(kids[k], &status, 0);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	struct k3cache *c = connect_ok();
	expect_restore(c, 600, 710000, 11);
	k3cache_close(c);
}

static uint64_t counter(struct k3cache *c, const char *name)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat st = K3CACHE__V1__STAT__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	req.stat = &st;
	frame_response *r;
	struct k3cache_error e;
	assert_int_equal(k3cache_call(c, &req, &r, &e), 0);
	uint64_t v = UINT64_MAX;
	for (size_t i = 0; i < r->n_counters; i++)
		if (!strcmp(r->counters[i]->name, name))
			v = r->counters[i]->value;
	k3cache_response_free(r);
	return v;
}

/* A publish header the daemon takes in (the model's layer count: its
 * header alone is not refused), all its bytes in layer 0. */
static int raw_publish_header(uint64_t bytes)
{
	int fd = daemonutil_connect_raw(d.sock);
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Publish pub = K3CACHE__V1__PUBLISH__INIT;
	K3cache__V1__LayerRef *ref = calloc(twin->n_layers, sizeof(*ref));
	K3cache__V1__LayerRef **refs = calloc(twin->n_layers, sizeof(*refs));
	assert_non_null(ref);
	assert_non_null(refs);
	for (uint32_t i = 0; i < twin->n_layers; i++) {
		k3cache__v1__layer_ref__init(&ref[i]);
		ref[i].index = i;
		refs[i] = &ref[i];
	}
	uint32_t tokens[2] = {1, 2};
	ref[0].size = bytes;
	pub.model.data = twin->fingerprint;
	pub.model.len = 32;
	pub.tokens = tokens;
	pub.n_tokens = 2;
	pub.layers = refs;
	pub.n_layers = twin->n_layers;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	req.payload_len = bytes;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	free(refs);
	free(ref);
	return fd;
}

/* A publish waiting for in-flight memory whose client goes away is closed by
 * the daemon without waiting for the memory, and counted as closed mid-frame
 * (its header is in, its payload is not). */
static void test_waiting_publish_client_leaves(void **state)
{
	(void)state;
	struct k3cache *c = connect_ok();
	/* the last test's connections closed: a connection whose client has
	 * gone is closed once its answer is out, by its write event, which
	 * after a restore is at the bulk priority and so runs after the
	 * small requests of this one (the listener's among them) */
	uint64_t before = counter(c, "connections_open");
	for (int i = 0; i < 50; i++) {
		daemonutil_sleep_ms(100);
		uint64_t now = counter(c, "connections_open");
		if (now == before)
			break;
		before = now;
	}
	uint64_t mid_before = counter(c, "closed_mid_frame");
	int a = raw_publish_header(3u << 20); /* holds 3 of the 4 MiB in flight */
	unsigned char mib[1 << 20];
	memset(mib, 0, sizeof(mib));
	assert_int_equal(daemonutil_write_all(a, mib, sizeof(mib)), 0);
	int b = raw_publish_header(3u << 20); /* must wait */
	daemonutil_sleep_ms(300);
	assert_int_equal(counter(c, "connections_open"), before + 2);
	close(b);
	/* the sweep runs every second; a keeps trickling so it is not stalled */
	int gone = 0;
	for (int i = 0; i < 20 && !gone; i++) {
		daemonutil_sleep_ms(150);
		assert_int_equal(daemonutil_write_all(a, mib, 1), 0);
		gone = counter(c, "connections_open") == before + 1;
	}
	assert_true(gone);
	assert_int_equal(counter(c, "closed_mid_frame"), mid_before + 1);
	close(a);
	k3cache_close(c);
}

/* The daemon's verify finds nothing wrong: every chunk and block sum,
 * every reference count against the references, no orphan block. */
static void expect_verify_clean(struct k3cache *c)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Verify v = K3CACHE__V1__VERIFY__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
	req.verify = &v;
	frame_response *resp;
	struct k3cache_error e;
	assert_int_equal(k3cache_call(c, &req, &resp, &e), 0);
	if (resp->code != 0)
		fail_msg("verify: %s", resp->message);
	assert_true(resp->checked > 0);
	assert_int_equal(resp->n_damaged, 0);
	k3cache_response_free(resp);
}

/* SIGTERM while a large publish streams in: the daemon exits 0, and after a
 * restart every entry is whole or absent. */
static void test_sigterm_during_publish(void **state)
{
	(void)state;
	pid_t pid = fork();
	if (pid == 0) {
		struct k3cache *c;
		struct k3cache_error e;
		if (k3cache_connect(d.sock, &c, &e) != 0)
			_exit(2);
		for (uint32_t i = 0;; i++)
			if (publish(c, 3000, 900000u + i * 10000u, i, NULL) != 0)
				_exit(0); /* the daemon went away */
	}
	daemonutil_sleep_ms(300);
	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	int status;
	waitpid(pid, &status, 0);
	assert_int_equal(start_daemon(), 0);
	struct k3cache *c = connect_ok();
	expect_verify_clean(c);
	k3cache_close(c);
}

/* ---- streamed publishes (run with --stage-size) ------------------------------ */

/* Sends a publish header for snapshot s of prompt t[0, p), then its payload
 * bytes [0, upto); returns the raw connection. With a base, s is a delta's
 * payload (delta_payload) from row base_rows, each layer's sum in sums. */
static int raw_publish_delta_partial(const struct snap *s, const uint32_t *t, uint32_t p,
                                     size_t upto, const uint8_t *base, uint32_t base_rows,
                                     const uint64_t *sums)
{
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	frame_request req;
	K3cache__V1__Publish pub;
	k3cache__v1__request__init(&req);
	k3cache__v1__publish__init(&pub);
	K3cache__V1__LayerRef *refs = calloc(s->n, sizeof(*refs));
	K3cache__V1__LayerRef **prefs = calloc(s->n, sizeof(*prefs));
	uint64_t total = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		k3cache__v1__layer_ref__init(&refs[i]);
		refs[i].index = i;
		refs[i].size = s->bufs[i].len;
		refs[i].xxh3 = sums ? sums[i] : 0;
		prefs[i] = &refs[i];
		total += s->bufs[i].len;
	}
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	req.id = 77;
	req.payload_len = total;
	pub.model.data = twin->fingerprint;
	pub.model.len = 32;
	pub.tokens = (uint32_t *)t;
	pub.n_tokens = p;
	pub.layers = prefs;
	pub.n_layers = s->n;
	if (base) {
		pub.base_key.data = (uint8_t *)base;
		pub.base_key.len = K3CACHE_KEY_LEN;
		pub.base_rows = base_rows;
	}
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	free(refs);
	free(prefs);
	size_t sent = 0;
	for (uint32_t i = 0; i < s->n && sent < upto; i++) {
		size_t take = s->bufs[i].len < upto - sent ? s->bufs[i].len : upto - sent;
		assert_int_equal(daemonutil_write_all(fd, s->bufs[i].data, take), 0);
		sent += take;
	}
	return fd;
}

static int raw_publish_partial(const struct snap *s, const uint32_t *t, uint32_t p, size_t upto)
{
	return raw_publish_delta_partial(s, t, p, upto, NULL, 0, NULL);
}

/* A delta's payload of snapshot whole (p rows) from row r: its KDA layers
 * whole and, of each MLA layer, rows [r, p) (k rows, then v rows); sums
 * gets each layer's whole blob's checksum. */
static struct snap delta_payload(const struct snap *whole, uint32_t p, uint32_t r, uint64_t *sums)
{
	struct snap s = {whole->n, calloc(whole->n, sizeof(struct k3cache_buf))};
	for (uint32_t i = 0; i < whole->n; i++) {
		const struct model_layer *l = &twin->layers[i];
		const unsigned char *w = whole->bufs[i].data;
		size_t len = whole->bufs[i].len;
		sums[i] = checksum_blob(w, len, i);
		unsigned char *b;
		if (l->mixer == MODEL_MIXER_MLA) {
			size_t kb = (size_t)l->k_row * 4, vb = (size_t)l->v_row * 4;
			len = (size_t)(p - r) * (kb + vb);
			b = malloc(len);
			memcpy(b, w + 9 + (size_t)r * kb, (size_t)(p - r) * kb);
			memcpy(b + (size_t)(p - r) * kb, w + 13 + (size_t)p * kb + (size_t)r * vb,
			       (size_t)(p - r) * vb);
		} else {
			b = malloc(len);
			memcpy(b, w, len);
		}
		s.bufs[i] = (struct k3cache_buf){b, len};
	}
	return s;
}

static uint64_t snap_bytes(const struct snap *s)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < s->n; i++)
		total += s->bufs[i].len;
	return total;
}

/* Writes the rest of s (from byte `from`) on fd. */
/* Sends the rest of a partial publish (from byte `from`), reads its answer,
 * expects OK with `created`, and closes fd. */
static void finish_raw_publish(int fd, const struct snap *s, size_t from, int created)
{
	size_t off = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		size_t len = s->bufs[i].len;
		if (off + len > from) {
			size_t skip = from > off ? from - off : 0;
			assert_int_equal(daemonutil_write_all(
			                         fd, (const unsigned char *)s->bufs[i].data + skip,
			                         len - skip),
			                 0);
		}
		off += len;
	}
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	if (r->code != 0)
		fail_msg("publish: %s", r->message);
	assert_int_equal(!!r->created, !!created);
	frame_response_free(r);
	close(fd);
}

/* A streamed publish whose client leaves mid-payload stores nothing: the
 * stages already written are removed, no pending row is left, and the
 * daemon serves the next publish of the same prompt. */
static void test_streamed_publish_client_leaves(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	struct k3cache *c = connect_ok();
	uint64_t entries = counter(c, "entries"), chunks = counter(c, "chunks"),
	         blocks = counter(c, "blocks"), bytes = counter(c, "bytes");
	uint32_t t[2000];
	tokens_for(t, 2000, 7000000);
	struct snap s = make_snap(twin, 2000, 41); /* ~10 MiB: many stages of 64 KiB */
	int fd = raw_publish_partial(&s, t, 2000, (size_t)(snap_bytes(&s) * 3 / 4));
	/* the stages of what arrived are written meanwhile: the shared blocks
	 * (held by the publish) of layers that passed their check */
	for (int i = 0; i < 100 && counter(c, "blocks") == blocks; i++)
		daemonutil_sleep_ms(20);
	assert_true(counter(c, "blocks") > blocks);
	assert_int_equal(counter(c, "staging"), 1);
	/* 7.5 MiB have arrived, held in a window of three 1 MiB stages (the
	 * least a stage may be), which is all --max-inflight is charged */
	assert_true(counter(c, "window_bytes") > 0);
	assert_true(counter(c, "window_bytes") <= 3u << 20);
	assert_true(counter(c, "inflight_bytes") <= 3u << 20);
	close(fd);
	for (int i = 0; i < 100 && counter(c, "staging") != 0; i++)
		daemonutil_sleep_ms(20);
	assert_int_equal(counter(c, "staging"), 0);
	assert_int_equal(counter(c, "chunks"), chunks);
	assert_int_equal(counter(c, "blocks"), blocks); /* the held references given back */
	assert_int_equal(counter(c, "bytes"), bytes);
	assert_int_equal(counter(c, "entries"), entries);
	assert_int_equal(counter(c, "inflight_bytes"), 0);
	assert_int_equal(counter(c, "window_bytes"), 0);
	/* the same prompt publishes whole afterwards */
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 2000, 7000000, 41, &res), 0);
	assert_true(res.created);
	expect_restore(c, 2000, 7000000, 41);
	free_snap(&s);
	k3cache_close(c);
}

/* A streamed delta under way: a turn of 2600 rows (make_turn(2600, 1, 2))
 * of prompt t as a delta of base from row 600, three quarters of its
 * payload sent on fd. */
struct streamed_delta {
	struct snap whole, payload;
	uint64_t sums[16];
	size_t sent;
	int fd;
};

static void start_streamed_delta(struct streamed_delta *sd, const uint32_t *t, const uint8_t *base)
{
	sd->whole = make_turn(2600, 1, 2);
	sd->payload = delta_payload(&sd->whole, 2600, 600, sd->sums);
	sd->sent = (size_t)(snap_bytes(&sd->payload) * 3 / 4);
	sd->fd = raw_publish_delta_partial(&sd->payload, t, 2600, sd->sent, base, 600, sd->sums);
}

static void free_streamed_delta(struct streamed_delta *sd)
{
	free_snap(&sd->payload);
	free_snap(&sd->whole);
}

/* A delta larger than the window streams through it as a whole publish
 * does: 20 MB of new rows are held at most three 1 MiB stages at a time
 * (all --max-inflight is charged), the base's rows come from the map, and
 * the entry restores byte for byte. */
static void test_streamed_delta_through_window(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	struct k3cache *c = connect_ok();
	uint32_t t[2600];
	tokens_for(t, 2600, 9100000);
	struct k3cache_publish_result a;
	assert_int_equal(publish_turn(c, t, 600, 1, 1, "", NULL, 0, &a), 0);
	uint64_t d0 = stat_counter(c, "delta_publishes"), r0 = stat_counter(c, "delta_refused");
	struct streamed_delta sd;
	start_streamed_delta(&sd, t, a.key);
	for (int i = 0; i < 100 && counter(c, "window_bytes") == 0; i++)
		daemonutil_sleep_ms(20);
	assert_int_equal(counter(c, "staging"), 1);
	assert_true(counter(c, "window_bytes") > 0);
	assert_true(counter(c, "window_bytes") <= 3u << 20);
	assert_true(counter(c, "inflight_bytes") <= 3u << 20);
	finish_raw_publish(sd.fd, &sd.payload, sd.sent, 1);
	assert_int_equal(stat_counter(c, "delta_publishes"), d0 + 1);
	assert_int_equal(stat_counter(c, "delta_refused"), r0);
	assert_int_equal(counter(c, "window_bytes"), 0);
	uint8_t key[K3CACHE_KEY_LEN];
	prefix_key(twin->fingerprint, "", 0, t, 2600, key);
	expect_turn(c, key, 2600, 1, 2);
	free_streamed_delta(&sd);
	k3cache_close(c);
}

/* A streamed publish with a bad layer near its end (found after earlier
 * stages were written): INVALID naming the layer, nothing stored. */
static void test_streamed_publish_bad_layer(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	struct k3cache *c = connect_ok();
	uint64_t entries = counter(c, "entries"), chunks = counter(c, "chunks");
	uint32_t t[2000];
	tokens_for(t, 2000, 8000000);
	struct snap s = make_snap(twin, 2000, 42);
	uint32_t last = s.n - 1;
	float nan = __builtin_nanf("");
	memcpy((unsigned char *)s.bufs[last].data + s.bufs[last].len - 4, &nan, 4);
	struct k3cache_publish_result res;
	struct k3cache_error e;
	assert_int_not_equal(
	        k3cache_publish(c, twin->fingerprint, "", 0, t, 2000, s.bufs, s.n, &res, &e), 0);
	assert_int_equal(e.code, STATUS_INVALID);
	char want[32];
	snprintf(want, sizeof(want), "layer %u", last);
	if (!strstr(e.message, want))
		fail_msg("message \"%s\" does not name %s", e.message, want);
	assert_int_equal(counter(c, "entries"), entries);
	assert_int_equal(counter(c, "chunks"), chunks);
	assert_int_equal(counter(c, "staging"), 0);
	free_snap(&s);
	k3cache_close(c);
}

/* A streamed uploader that stalls holds neither the writer nor LMDB: other
 * publishes (streamed ones too) land meanwhile. */
static void test_stalled_streamed_upload_does_not_block_writes(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	/* 1.2 + 1.7 + 0.4 MiB: within --max-inflight (4M) together, so nothing
	 * waits for memory (the cap's own waiting is test_inflight_cap_waits) */
	uint32_t t[100];
	tokens_for(t, 100, 9000000);
	struct snap s = make_snap(twin, 100, 43);
	assert_true(snap_bytes(&s) < (3u << 19) && snap_bytes(&s) > (1u << 20));
	int fd = raw_publish_partial(&s, t, 100, (size_t)(snap_bytes(&s) / 2));
	daemonutil_sleep_ms(100);
	struct k3cache *c = connect_ok();
	double t0 = now_s();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 150, 9100000, 44, &res), 0); /* streamed too */
	assert_true(res.created);
	assert_int_equal(publish(c, 20, 9200000, 45, &res), 0); /* one commit */
	assert_true(res.created);
	assert_true(now_s() - t0 < 2.0);
	expect_restore(c, 150, 9100000, 44);
	/* the stalled one finishes later and lands whole */
	finish_raw_publish(fd, &s, (size_t)(snap_bytes(&s) / 2), 1);
	expect_restore(c, 100, 9000000, 43);
	free_snap(&s);
	k3cache_close(c);
}

/* Two workers publish the same prompt at once: the second header arrives
 * while the first is being written, yet the second gets "exists" (created
 * 0) once the first has committed, not BUSY. */
static void test_same_prompt_streamed_twice(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	uint32_t t[100];
	tokens_for(t, 100, 6800000);
	struct snap s = make_snap(twin, 100, 53);
	size_t half = (size_t)(snap_bytes(&s) / 2);
	int first = raw_publish_partial(&s, t, 100, half);
	daemonutil_sleep_ms(100);
	int second = raw_publish_partial(&s, t, 100, half);
	daemonutil_sleep_ms(100);
	finish_raw_publish(first, &s, half, 1);
	finish_raw_publish(second, &s, half, 0); /* exists: not BUSY */
	struct k3cache *c = connect_ok();
	expect_restore(c, 100, 6800000, 53);
	assert_int_equal(counter(c, "staging"), 0);
	k3cache_close(c);
	free_snap(&s);
}

/* The daemon SIGKILLed while a streamed publish has stages on disk: the
 * restarted daemon sweeps them (its predecessor is gone), serves everything
 * committed before, and the same prompt publishes whole again. */
static void test_sigkill_mid_streamed_publish(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	struct k3cache *c = connect_ok();
	struct k3cache_publish_result res;
	assert_int_equal(publish(c, 30, 6600000, 51, &res), 0);
	uint64_t entries = counter(c, "entries"), chunks = counter(c, "chunks"),
	         blocks = counter(c, "blocks"), bytes = counter(c, "bytes");
	uint32_t t[2000];
	tokens_for(t, 2000, 6700000);
	struct snap s = make_snap(twin, 2000, 52);
	int fd = raw_publish_partial(&s, t, 2000, (size_t)(snap_bytes(&s) * 3 / 4));
	for (int i = 0; i < 100 && counter(c, "blocks") == blocks; i++)
		daemonutil_sleep_ms(20);
	assert_true(counter(c, "blocks") > blocks);
	k3cache_close(c);
	assert_int_equal(daemonutil_stop(&d, SIGKILL), 128 + SIGKILL);
	close(fd);
	assert_int_equal(start_daemon(), 0);
	c = connect_ok();
	assert_int_equal(counter(c, "staged_swept"), 1);
	assert_int_equal(counter(c, "staging"), 0);
	assert_int_equal(counter(c, "chunks"), chunks);
	assert_int_equal(counter(c, "blocks"), blocks); /* the held references swept */
	assert_int_equal(counter(c, "bytes"), bytes);
	assert_int_equal(counter(c, "entries"), entries);
	expect_restore(c, 30, 6600000, 51);
	assert_int_equal(publish(c, 2000, 6700000, 52, &res), 0);
	assert_true(res.created);
	expect_restore(c, 2000, 6700000, 52);
	free_snap(&s);
	k3cache_close(c);
}

/* The daemon SIGKILLed while a streamed delta has stages and held blocks
 * on disk: the restarted daemon sweeps them, its verify finds every
 * reference count equal to the references, the base is served, and the
 * delta publishes again. */
static void test_sigkill_mid_streamed_delta(void **state)
{
	(void)state;
	if (!stage_size)
		skip();
	struct k3cache *c = connect_ok();
	uint32_t t[2600];
	tokens_for(t, 2600, 9300000);
	struct k3cache_publish_result a, b;
	assert_int_equal(publish_turn(c, t, 600, 1, 1, "", NULL, 0, &a), 0);
	uint64_t entries = counter(c, "entries"), chunks = counter(c, "chunks"),
	         blocks = counter(c, "blocks"), bytes = counter(c, "bytes");
	struct streamed_delta sd;
	start_streamed_delta(&sd, t, a.key);
	for (int i = 0; i < 100 && counter(c, "blocks") == blocks; i++)
		daemonutil_sleep_ms(20);
	assert_true(counter(c, "blocks") > blocks); /* new blocks held by the delta */
	k3cache_close(c);
	assert_int_equal(daemonutil_stop(&d, SIGKILL), 128 + SIGKILL);
	close(sd.fd);
	assert_int_equal(start_daemon(), 0);
	c = connect_ok();
	assert_int_equal(counter(c, "staged_swept"), 1);
	assert_int_equal(counter(c, "staging"), 0);
	assert_int_equal(counter(c, "chunks"), chunks);
	assert_int_equal(counter(c, "blocks"), blocks);
	assert_int_equal(counter(c, "bytes"), bytes);
	assert_int_equal(counter(c, "entries"), entries);
	expect_verify_clean(c);
	expect_turn(c, a.key, 600, 1, 1);
	assert_int_equal(publish_turn(c, t, 2600, 1, 2, "", a.key, 600, &b), 0);
	assert_true(b.created);
	assert_int_equal(b.delta_rows, 600);
	expect_turn(c, b.key, 2600, 1, 2);
	expect_verify_clean(c);
	free_streamed_delta(&sd);
	k3cache_close(c);
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--stage-size"))
		stage_size = argv[2];
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_publish_in_one_process_restore_in_another),
	        cmocka_unit_test(test_lookup_restore_one_round_trip),
	        cmocka_unit_test(test_restore_from_a_layer_callback),
	        cmocka_unit_test(test_connect_timeout_bounds_the_connect),
	        cmocka_unit_test(test_client_refuses_tampered_restore),
	        cmocka_unit_test(test_large_restore_checked_while_received),
	        cmocka_unit_test(test_pipelined_request_after_large_restore),
	        cmocka_unit_test(test_state_transitions_traced),
	        cmocka_unit_test(test_lookup_over_header_limit),
	        cmocka_unit_test(test_upload_yields_to_lookups),
	        cmocka_unit_test(test_yield_pause_is_not_a_stall),
	        cmocka_unit_test(test_publish_of_stored_entry_sends_nothing),
	        cmocka_unit_test(test_refused_publish_is_not_uploaded),
	        cmocka_unit_test(test_restore_into_aliased_buffers),
	        cmocka_unit_test(test_restore_into_small_buffer_names_public_calls),
	        cmocka_unit_test(test_large_headers_are_charged),
	        cmocka_unit_test(test_delta_publish),
	        cmocka_unit_test(test_delta_on_damaged_base_is_corrupt),
	        cmocka_unit_test(test_streamed_delta_through_window),
	        cmocka_unit_test(test_restart_keeps_entries),
	        cmocka_unit_test(test_concurrent_clients),
	        cmocka_unit_test(test_stalled_clients_do_not_block_others),
	        cmocka_unit_test(test_inflight_cap_waits),
	        cmocka_unit_test(test_waiting_publish_client_leaves),
	        cmocka_unit_test(test_sigterm_during_publish),
	        cmocka_unit_test(test_streamed_publish_client_leaves),
	        cmocka_unit_test(test_streamed_publish_bad_layer),
	        cmocka_unit_test(test_stalled_streamed_upload_does_not_block_writes),
	        cmocka_unit_test(test_sigkill_mid_streamed_publish),
	        cmocka_unit_test(test_sigkill_mid_streamed_delta),
	        cmocka_unit_test(test_same_prompt_streamed_twice),
	        /* last: it fills a quarter of the store */
	        cmocka_unit_test(test_publish_interleaves_with_verify),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
