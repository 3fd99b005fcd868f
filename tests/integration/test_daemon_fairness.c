/* One client cannot hold the others, against the real daemon:
 * - a flood of small pipelined requests (libevent's high priority) leaves
 *   restores moving, new connections accepted and SIGTERM honoured;
 * - a whole publish whose client then half-closes is answered, even when it
 *   waited for --max-inflight memory (counted once in inflight_waits);
 * - damage reports queue each entry's check once, and at most
 *   K3D_CHECKS_MAX checks at a time: another client's publish does not
 *   wait behind them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemonutil.h"
#include "k3cache/k3cache.h"
#include "model.h"
#include "snaputil.h"

static struct k3cache_model *tiny;

static void tokens_for(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i;
}

/* The prefix length at which tiny's snapshot is at least `bytes`. */
static uint32_t p_for(uint64_t bytes)
{
	uint32_t p = 16;
	for (;;) {
		uint64_t total = 0;
		for (uint32_t i = 0; i < tiny->n_layers; i++)
			total += model_layer_blob_size(&tiny->layers[i], p);
		if (total >= bytes)
			return p;
		p += p / 8 + 1;
	}
}

static struct k3cache_buf *layers_at(uint32_t p, uint32_t seed)
{
	struct k3cache_buf *b = calloc(tiny->n_layers, sizeof(*b));
	for (uint32_t i = 0; i < tiny->n_layers; i++)
		b[i] = snaputil_layer(tiny, i, p, seed);
	return b;
}

static void free_layers(struct k3cache_buf *b)
{
	for (uint32_t i = 0; i < tiny->n_layers; i++)
		free((void *)b[i].data);
	free(b);
}

static struct k3cache *connect_to(const struct daemonutil *d)
{
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(d->sock, &c, &e) != 0)
		fail_msg("connect: %s", e.message);
	return c;
}

/* Starts a daemon with tiny's model put. */
static void start(struct daemonutil *d, const char *a1, const char *a2)
{
	assert_int_equal(daemonutil_init(d), 0);
	assert_int_equal(daemonutil_start(d, a1, a2, (char *)NULL), 0);
	struct k3cache *c = connect_to(d);
	struct k3cache_error e;
	assert_int_equal(k3cache_put_model(c, tiny, NULL, &e), 0);
	k3cache_close(c);
}

/* Publishes tiny's snapshot at P = p from base; its key in key. */
static void publish(const struct daemonutil *d, uint32_t p, uint32_t base, uint32_t seed,
                    uint8_t key[K3CACHE_KEY_LEN])
{
	struct k3cache *c = connect_to(d);
	struct k3cache_buf *b = layers_at(p, seed);
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, base);
	struct k3cache_publish_result res;
	struct k3cache_error e;
	if (k3cache_publish(c, tiny->fingerprint, "", 0, t, p, b, tiny->n_layers, &res, &e) != 0)
		fail_msg("publish: %s", e.message);
	memcpy(key, res.key, K3CACHE_KEY_LEN);
	free(t);
	free_layers(b);
	k3cache_close(c);
}

static uint64_t counter(const struct daemonutil *d, const char *name)
{
	struct k3cache *c = connect_to(d);
	struct k3cache_error e;
	uint64_t v = 0;
	if (k3cache_stat_counter(c, name, &v, &e) != 0)
		fail_msg("%s: %s", name, e.message);
	k3cache_close(c);
	return v;
}

/* ---- a flood of small requests ------------------------------------------------ */

struct flood {
	int fd;
	atomic_int stop;
	atomic_ullong answered; /* bytes of answers read */
	unsigned char *batch;
	size_t batch_len;
};

static void *flood_send(void *arg)
{
	struct flood *f = arg;
	while (!atomic_load(&f->stop))
		if (daemonutil_write_all(f->fd, f->batch, f->batch_len) != 0)
			break;
	return NULL;
}

static void *flood_read(void *arg)
{
	struct flood *f = arg;
	unsigned char buf[1 << 16];
	for (;;) {
		ssize_t n = recv(f->fd, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
		atomic_fetch_add(&f->answered, (unsigned long long)n);
	}
	return NULL;
}

/* 2,000 brief Inspects of keys that are not there, pipelined: each a small
 * answer at the high priority. */
static void flood_batch(struct flood *f)
{
	const size_t cap = (size_t)2000 * 256; /* a frame here is under 100 bytes */
	f->batch = malloc(cap);
	f->batch_len = 0;
	assert_non_null(f->batch);
	for (uint32_t i = 0; i < 2000; i++) {
		uint8_t key[32];
		memset(key, 0x5a, sizeof(key));
		memcpy(key, &i, sizeof(i));
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		K3cache__V1__Inspect in = K3CACHE__V1__INSPECT__INIT;
		in.key.data = key;
		in.key.len = 32;
		in.brief = 1;
		req.op_case = K3CACHE__V1__REQUEST__OP_INSPECT;
		req.inspect = &in;
		req.id = i + 1;
		unsigned char *buf;
		size_t n = frame_encode_request(&req, &buf);
		assert_true(n > 0 && n <= cap - f->batch_len);
		memcpy(f->batch + f->batch_len, buf, n);
		f->batch_len += n;
		free(buf);
	}
}

/* Before, every event left at libevent's default priority (the listeners,
 * the tick, the signals) and every bulk transfer waited for the flood to
 * stop: a 4 MB restore stalled half way, a new client got no answer, and
 * SIGTERM was not honoured. */
static void test_flood_of_small_requests_starves_nothing(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "--log-level", "info");
	uint32_t p = p_for(4u << 20);
	uint8_t key[K3CACHE_KEY_LEN];
	publish(&d, p, 1000, 1, key);
	struct k3cache *r = connect_to(&d); /* opened before the flood */
	k3cache_set_timeout(r, 10000);
	size_t *caps = calloc(tiny->n_layers, sizeof(size_t));
	size_t *lens = calloc(tiny->n_layers, sizeof(size_t));
	void **bufs = calloc(tiny->n_layers, sizeof(void *));
	for (uint32_t i = 0; i < tiny->n_layers; i++) {
		caps[i] = model_layer_blob_size(&tiny->layers[i], p);
		bufs[i] = malloc(caps[i]);
	}

	struct flood f = {.fd = daemonutil_connect_raw(d.sock)};
	assert_true(f.fd >= 0);
	flood_batch(&f);
	pthread_t ts, tr;
	assert_int_equal(pthread_create(&tr, NULL, flood_read, &f), 0);
	assert_int_equal(pthread_create(&ts, NULL, flood_send, &f), 0);
	daemonutil_sleep_ms(1000);
	unsigned long long before = atomic_load(&f.answered);
	assert_true(before > 0); /* the flood is being answered */

	/* a restore moves */
	double t0 = daemonutil_now();
	struct k3cache_error e;
	uint32_t got = 0;
	int rc = k3cache_restore_into(r, tiny, key, bufs, caps, lens, &got, &e);
	double restore_s = daemonutil_now() - t0;
	if (rc != 0)
		fail_msg("restore during the flood: %s (%.1f s)", e.message, restore_s);
	assert_int_equal(got, p);
	struct k3cache_buf *want = layers_at(p, 1);
	for (uint32_t i = 0; i < tiny->n_layers; i++) {
		assert_int_equal(lens[i], want[i].len);
		assert_memory_equal(bufs[i], want[i].data, want[i].len);
	}
	free_layers(want);
	print_message("a 4 MB restore during the flood: %.2f s\n", restore_s);
	assert_true(restore_s < 5.0);

	/* a new client is accepted and answered */
	t0 = daemonutil_now();
	struct k3cache *n;
	if (k3cache_connect(d.sock, &n, &e) != 0)
		fail_msg("connect during the flood: %s", e.message);
	k3cache_set_timeout(n, 5000);
	uint64_t v;
	if (k3cache_stat_counter(n, "entries", &v, &e) != 0)
		fail_msg("a new client during the flood: %s", e.message);
	double accept_s = daemonutil_now() - t0;
	print_message("a new client answered during the flood: %.2f s\n", accept_s);
	assert_true(accept_s < 3.0);

	/* the restore's client leaves: its connection closes. Before, it closed
	 * from its write event, left at the bulk priority by the restore and
	 * never pending (nothing to write), so it stayed open (its descriptor
	 * and buffers held) for as long as the flood went on */
	k3cache_close(r);

	uint64_t open_now = 0;
	t0 = daemonutil_now();
	for (int i = 0; i < 60; i++) {
		if (k3cache_stat_counter(n, "connections_open", &open_now, &e) != 0)
			fail_msg("connections_open during the flood: %s", e.message);
		if (open_now == 2) /* the flood's and n */
			break;
		daemonutil_sleep_ms(50);
	}
	print_message("the restore's connection closed during the flood: %.2f s (%llu open)\n",
	              daemonutil_now() - t0, (unsigned long long)open_now);
	assert_int_equal(open_now, 2);
	k3cache_close(n);
	assert_true(atomic_load(&f.answered) > before); /* and the flood still served */

	/* SIGTERM is honoured */
	kill(d.pid, SIGTERM);
	int status = 0, gone = 0;
	for (int i = 0; i < 100 && !gone; i++) {
		gone = waitpid(d.pid, &status, WNOHANG) == d.pid;
		if (!gone)
			daemonutil_sleep_ms(50);
	}
	if (gone)
		d.pid = 0;
	atomic_store(&f.stop, 1);
	shutdown(f.fd, SHUT_RDWR);
	pthread_join(ts, NULL);
	pthread_join(tr, NULL);
	close(f.fd);
	free(f.batch);
	assert_true(gone); /* within 5 s */
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	for (uint32_t i = 0; i < tiny->n_layers; i++)
		free(bufs[i]);
	free(bufs);
	free(caps);
	free(lens);
	daemonutil_cleanup(&d);
}

/* ---- SIGTERM during a verify ---------------------------------------------------- */

/* A verify runs on the writer in batches of 64 MiB. At SIGTERM the writer
 * finished every queued job, the verify's every remaining batch included:
 * a verify of a large store held the stop for as long as it had left (past
 * systemd's TimeoutStopSec, a SIGKILL and an unclean store). Now it stops
 * at its next batch, answered BUSY saying so. */
static void test_sigterm_stops_a_verify(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "--log-level", "info");
	uint32_t p = p_for(8u << 20);
	uint8_t key[K3CACHE_KEY_LEN];
	for (uint32_t i = 0; i < 40; i++) /* 320 MiB: 5 batches */
		publish(&d, p, 100000 * (i + 1), i + 1, key);
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Verify v = K3CACHE__V1__VERIFY__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
	req.verify = &v;
	req.id = 1;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	uint64_t done = 0;
	for (int i = 0; i < 400 && !done; i++) {
		done = counter(&d, "verify_done_bytes");
		if (!done)
			daemonutil_sleep_ms(5);
	}
	assert_true(done > 0); /* a batch checked, more to come */
	uint64_t total = counter(&d, "verify_total_bytes");
	assert_true(done < total);
	double t0 = daemonutil_now();
	kill(d.pid, SIGTERM);
	frame_response *r = daemonutil_read_response(fd, 20000);
	int status = 0;
	assert_int_equal(waitpid(d.pid, &status, 0), d.pid);
	double stop_s = daemonutil_now() - t0;
	d.pid = 0;
	close(fd);
	print_message("stopped %.2f s after SIGTERM, %llu of %llu bytes verified\n", stop_s,
	              (unsigned long long)done, (unsigned long long)total);
	assert_non_null(r); /* answered before the daemon went */
	assert_int_equal(r->code, STATUS_BUSY);
	if (!strstr(r->message, "stopping") || !strstr(r->message, "run it again"))
		fail_msg("the answer does not say why: %s", r->message);
	frame_response_free(r);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_false(daemonutil_log_has(&d, "entries checked in"));
	assert_true(daemonutil_log_has(&d, "stopped cleanly"));
	daemonutil_cleanup(&d);
}

/* ---- a half-closed client waiting for memory ---------------------------------- */

/* A raw Publish of tiny at P = p: its header, then the first `upto` bytes of
 * its layers (UINT64_MAX: all of them). 0, or -1 when a write failed. */
static int send_publish(int fd, uint32_t p, uint32_t base, uint64_t id, uint64_t upto)
{
	struct k3cache_buf *b = layers_at(p, 7);
	uint32_t *t = malloc(p * sizeof(uint32_t));
	tokens_for(t, p, base);
	K3cache__V1__LayerRef *refs = calloc(tiny->n_layers, sizeof(*refs));
	K3cache__V1__LayerRef **prefs = calloc(tiny->n_layers, sizeof(*prefs));
	uint64_t total = 0;
	for (uint32_t i = 0; i < tiny->n_layers; i++) {
		k3cache__v1__layer_ref__init(&refs[i]);
		refs[i].index = i;
		refs[i].size = b[i].len;
		prefs[i] = &refs[i];
		total += b[i].len;
	}
	K3cache__V1__Publish pub = K3CACHE__V1__PUBLISH__INIT;
	pub.model.data = tiny->fingerprint;
	pub.model.len = 32;
	pub.tokens = t;
	pub.n_tokens = p;
	pub.layers = prefs;
	pub.n_layers = tiny->n_layers;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	req.payload_len = total;
	req.id = id;
	int rc = daemonutil_send_request(fd, &req);
	for (uint32_t i = 0; !rc && upto && i < tiny->n_layers; i++) {
		size_t n = b[i].len < upto ? b[i].len : (size_t)upto;
		rc = daemonutil_write_all(fd, b[i].data, n);
		upto -= n;
	}
	free(refs);
	free(prefs);
	free(t);
	free_layers(b);
	return rc ? -1 : 0;
}

/* Before, the sweep took the end of input (POLLRDHUP) of a publish waiting
 * for memory for a client that had gone, and closed it unanswered; each
 * retry of the reservation also counted another inflight_wait. */
static void test_half_closed_publish_waiting_for_memory_is_answered(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "--max-inflight", "1100KiB");
	/* A: a 2 MiB publish whose first MiB (its trial) is reserved, then
	 * nothing sent: it holds that MiB */
	uint32_t pa = p_for(2u << 20);
	int a = daemonutil_connect_raw(d.sock);
	assert_true(a >= 0);
	assert_int_equal(send_publish(a, pa, 5000, 1, 0), 0);
	for (int i = 0; i < 100 && counter(&d, "inflight_bytes") < (1u << 20); i++)
		daemonutil_sleep_ms(50);
	assert_true(counter(&d, "inflight_bytes") >= (1u << 20)); /* A first */
	uint64_t waits = counter(&d, "inflight_waits");
	/* B: a whole publish of about 100 KB, which must wait, then its side
	 * shut (all of it in the socket: a Unix socket's sender holds at most
	 * net.core.wmem_default, 208 KiB by default, unread) */
	uint32_t pb = p_for(100u << 10);
	int b = daemonutil_connect_raw(d.sock);
	assert_true(b >= 0);
	assert_int_equal(send_publish(b, pb, 9000, 2, UINT64_MAX), 0);
	shutdown(b, SHUT_WR);
	daemonutil_sleep_ms(3500); /* three sweeps */
	close(a);                  /* A gives up: B's turn */
	frame_response *r = daemonutil_read_response(b, 5000);
	assert_non_null(r); /* answered, not dropped */
	assert_int_equal(r->id, 2);
	assert_int_equal(r->code, 0);
	frame_response_free(r);
	assert_true(daemonutil_closed(b, 5000));
	close(b);
	assert_int_equal(counter(&d, "inflight_waits") - waits, 1);
	daemonutil_cleanup(&d);
}

/* ---- damage reports ----------------------------------------------------------- */

static void send_report(int fd, uint64_t id, const uint8_t *keys, size_t n)
{
	ProtobufCBinaryData *bad = calloc(n, sizeof(*bad));
	for (size_t i = 0; i < n; i++)
		bad[i] = (ProtobufCBinaryData){K3CACHE_KEY_LEN, (uint8_t *)keys + 32 * i};
	K3cache__V1__Report rep = K3CACHE__V1__REPORT__INIT;
	rep.n_damaged = n;
	rep.damaged = bad;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_REPORT;
	req.report = &rep;
	req.id = id;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	free(bad);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, 0);
	frame_response_free(r);
}

/* Before, each damaged key of each Report became a check of the whole
 * entry queued on the writer, however many: a few Reports of one 4 MB
 * entry held another client's publish for 30 s, and their memory grew
 * without bound. */
static void test_damage_reports_are_bounded(void **state)
{
	(void)state;
	struct daemonutil d;
	start(&d, "--log-level", "info");
	uint8_t keys[12][K3CACHE_KEY_LEN];
	uint32_t p = p_for(4u << 20);
	publish(&d, p, 1000, 1, keys[0]);
	for (uint32_t i = 1; i < 12; i++)
		publish(&d, 100, 20000 + 1000 * i, i, keys[i]);
	uint64_t reported = counter(&d, "reported_damaged");
	uint64_t dropped = counter(&d, "reports_dropped");
	/* the large entry 4,096 times in each of 8 Reports, then the 12 */
	uint8_t *same = malloc((size_t)4096 * K3CACHE_KEY_LEN);
	for (size_t i = 0; i < 4096; i++)
		memcpy(same + 32 * i, keys[0], K3CACHE_KEY_LEN);
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	for (uint64_t i = 0; i < 8; i++)
		send_report(fd, 10 + i, same, 4096);
	send_report(fd, 20, &keys[0][0], 12);
	free(same);
	/* another client's publish is not held behind 32,768 checks */
	double t0 = daemonutil_now();
	uint8_t k[K3CACHE_KEY_LEN];
	publish(&d, 50, 900000, 99, k);
	double publish_s = daemonutil_now() - t0;
	print_message("a publish behind the reports: %.2f s\n", publish_s);
	assert_true(publish_s < 5.0);
	/* the large key's repeats are one check; of the 12 keys, at most
	 * K3D_CHECKS_MAX (8) are queued at once, the rest dropped and counted */
	uint64_t r1 = counter(&d, "reported_damaged") - reported;
	uint64_t d1 = counter(&d, "reports_dropped") - dropped;
	print_message("reported %llu, dropped %llu\n", (unsigned long long)r1,
	              (unsigned long long)d1);
	assert_true(r1 >= 12 && r1 <= 12 + 8);
	assert_int_equal(d1, 4);
	/* the entries were intact: nothing quarantined */
	assert_int_equal(counter(&d, "entries"), 13);
	/* and SIGTERM does not wait for a queue of checks */
	t0 = daemonutil_now();
	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	assert_true(daemonutil_now() - t0 < 5.0);
	close(fd);
	daemonutil_cleanup(&d);
}

/* ---- a publish refused for want of memory --------------------------------------- */

#ifdef K3_FAULT_ALLOC
/* How many lines of d's log hold text. */
static int log_count(const struct daemonutil *d, const char *text)
{
	FILE *f = fopen(d->log, "r");
	int n = 0;
	char line[4096];
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* A daemon whose allocations fault_alloc fails, one at a time (arm_at),
 * with tiny's model put. */
struct faulted {
	struct daemonutil d;
	char arm[1100], hit[1200];
};

static void start_faulted(struct faulted *f, const char *a1, const char *a2, const char *a3,
                          const char *a4, const char *a5, const char *a6)
{
	assert_int_equal(daemonutil_init(&f->d), 0);
	snprintf(f->arm, sizeof(f->arm), "%s/arm", f->d.dir);
	snprintf(f->hit, sizeof(f->hit), "%s.hit", f->arm);
	setenv("LD_PRELOAD", K3_FAULT_ALLOC, 1);
	setenv("K3FAULT_ALLOC_ARM", f->arm, 1);
	int rc = daemonutil_start(&f->d, a1, a2, a3, a4, a5, a6, (char *)NULL);
	unsetenv("LD_PRELOAD");
	unsetenv("K3FAULT_ALLOC_ARM");
	assert_int_equal(rc, 0);
	struct k3cache *c = connect_to(&f->d);
	struct k3cache_error e;
	assert_int_equal(k3cache_put_model(c, tiny, NULL, &e), 0);
	k3cache_close(c);
}

/* From now, the daemon's n-th allocation fails (once). */
static void arm_at(struct faulted *f, long n)
{
	unlink(f->hit);
	FILE *a = fopen(f->arm, "w");
	assert_non_null(a);
	fprintf(a, "%ld %ld\n", n, n);
	fclose(a);
}

/* Disarmed; whether the armed failure was given. */
static int disarm(struct faulted *f)
{
	int hit = access(f->hit, F_OK) == 0;
	unlink(f->arm);
	return hit;
}
#endif

/* A publish whose receive window (or payload buffer) cannot be allocated,
 * or cannot grow, is refused BUSY and its payload skipped. Before, it kept
 * its trial window's MiB of --max-inflight (and the buffer), or its whole
 * window's, while the rest was skipped, so other publishes waited for it,
 * and it was answered only once its whole payload had come, where every
 * other refusal of a payload over the stage size is answered at once. Each
 * allocation of the daemon's work for a publish is failed in turn
 * (fault_alloc, LD_PRELOAD; not under ASan). */
static void test_publish_refused_for_memory_holds_nothing(void **state)
{
	(void)state;
#ifndef K3_FAULT_ALLOC
	skip(); /* the sanitizers own malloc */
#else
	struct faulted f;
	start_faulted(&f, "--stage-size", "64KiB", "--max-inflight", "4MiB", NULL, NULL);
	struct daemonutil *d = &f.d;
	uint32_t p = p_for(3u << 20);
	int refused = 0;
	long n;
	for (n = 1; n < 2000; n++) {
		int before = log_count(d, "-> DISCARD");
		int granted = log_count(d, "WAIT_MEMORY -> READ_PAYLOAD");
		arm_at(&f, n);
		int fd = daemonutil_connect_raw(d->sock);
		assert_true(fd >= 0);
		/* the header and 1.5 MiB: the trial window (1 MiB) filled, then
		 * the receive window for the rest, grown a stage at a time */
		int sent = send_publish(fd, p, 7000, (uint64_t)n, (uint64_t)1536 << 10);
		/* until the daemon has refused it, granted it both windows, or
		 * answered or closed otherwise */
		for (int i = 0; sent == 0 && i < 300; i++) {
			struct pollfd pf = {.fd = fd, .events = POLLIN};
			int unread = 1; /* what the daemon has not read of it */
			if (ioctl(fd, SIOCOUTQ, &unread) != 0)
				unread = 1;
			if (log_count(d, "-> DISCARD") > before || poll(&pf, 1, 0) > 0 ||
			    (log_count(d, "WAIT_MEMORY -> READ_PAYLOAD") >= granted + 2 &&
			     unread == 0))
				break;
			daemonutil_sleep_ms(5);
		}
		int was_hit = disarm(&f);
		if (sent == 0 && log_count(d, "-> DISCARD") > before) {
			refused++;
			print_message("allocation %ld failing: the publish refused\n", n);
			/* answered at once, 1.5 MiB of its payload still to come */
			frame_response *r = daemonutil_read_response(fd, 3000);
			assert_non_null(r);
			assert_int_not_equal(r->code, 0);
			frame_response_free(r);
			/* and holding nothing meanwhile (a window, once the writer
			 * has handed it back) */
			uint64_t held = 1;
			for (int i = 0; i < 100 && (held = counter(d, "inflight_bytes")) != 0; i++)
				daemonutil_sleep_ms(10);
			assert_int_equal(held, 0);
		}
		close(fd);
		/* the next round's header is charged too (over 64 KiB): the
		 * daemon has let this one's go once it has seen the close, or
		 * that one would be BUSY against --max-inflight 4MiB */
		for (int i = 0; i < 200 && counter(d, "header_bytes") != 0; i++)
			daemonutil_sleep_ms(5);
		if (!was_hit)
			break; /* a round that failed nothing: every allocation was tried */
	}
	print_message("%ld allocations failed in turn, %d publishes refused for them\n", n - 1,
	              refused);
	assert_true(refused > 0);
	assert_true(daemonutil_alive(d));
	daemonutil_cleanup(d);
#endif
}

/* A streamed publish whose start on the writer fails for memory (its layer
 * list) is answered once its payload is in, as every refusal at the start
 * is. Before, its window was never let through: the upload stopped at the
 * window's 3 MiB, unanswered, until the stuck-window close (4 x
 * --stall-timeout, 2 minutes by default) cut the connection. Each
 * allocation of a whole streamed publish is failed in turn (fault_alloc):
 * every round ends at once. */
static void test_streamed_publish_out_of_memory_is_answered(void **state)
{
	(void)state;
#ifndef K3_FAULT_ALLOC
	skip(); /* the sanitizers own malloc */
#else
	struct faulted f;
	start_faulted(&f, "--stage-size", "64KiB", "--stall-timeout", "1s", "--durability", "fast");
	struct daemonutil *d = &f.d;
	uint32_t p = p_for(6u << 20); /* over the window's three 1 MiB stages */
	long n;
	for (n = 1; n < 3000; n++) {
		arm_at(&f, n);
		double t0 = daemonutil_now();
		int fd = daemonutil_connect_raw(d->sock);
		assert_true(fd >= 0);
		int sent =
		        send_publish(fd, p, 9000000 + (uint32_t)n * 1000, (uint64_t)n, UINT64_MAX);
		/* answered (or, where no answer can be queued, closed) at once,
		 * whether the upload went whole or was refused and cut */
		frame_response *r = daemonutil_read_response(fd, 8000);
		int closed = r ? 0 : daemonutil_closed(fd, 8000);
		double took = daemonutil_now() - t0;
		int was_hit = disarm(&f);
		/* the stuck window was closed after 4 to 5 s (4 x --stall-timeout
		 * 1s); a round takes milliseconds, and 3.5 s leaves a loaded
		 * machine room */
		if (took > 3.5)
			print_message("allocation %ld failing: %s after %.1f s (upload %s)\n", n,
			              r        ? "answered"
			              : closed ? "closed"
			                       : "nothing",
			              took, sent ? "cut" : "whole");
		assert_true(r || closed);
		assert_true(took < 3.5);
		frame_response_free(r);
		close(fd);
		if (!was_hit)
			break; /* a round that failed nothing: every allocation was tried */
	}
	print_message("%ld allocations failed in turn\n", n - 1);
	assert_true(daemonutil_alive(d));
	daemonutil_cleanup(d);
#endif
}

/* A Report whose check cannot be queued (out of memory) is counted in
 * reports_dropped, as one over the checks' bound is. Before, it was only
 * logged: every error path is counted. Each allocation of a Report's work
 * is failed in turn (fault_alloc, LD_PRELOAD; not under ASan). */
static void test_report_out_of_memory_is_counted(void **state)
{
	(void)state;
#ifndef K3_FAULT_ALLOC
	skip(); /* the sanitizers own malloc */
#else
	struct faulted f;
	start_faulted(&f, NULL, NULL, NULL, NULL, NULL, NULL);
	struct daemonutil *d = &f.d;
	uint8_t key[K3CACHE_KEY_LEN];
	publish(d, 100, 3000, 5, key);
	const char *lost = "a damaged entry stays unquarantined";
	int counted = 0;
	long n;
	for (n = 1; n < 500; n++) {
		int before = log_count(d, lost);
		uint64_t dropped = counter(d, "reports_dropped");
		arm_at(&f, n);
		int fd = daemonutil_connect_raw(d->sock);
		assert_true(fd >= 0);
		ProtobufCBinaryData bad = {K3CACHE_KEY_LEN, key};
		K3cache__V1__Report rep = K3CACHE__V1__REPORT__INIT;
		rep.n_damaged = 1;
		rep.damaged = &bad;
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		req.op_case = K3CACHE__V1__REQUEST__OP_REPORT;
		req.report = &rep;
		req.id = 1;
		frame_response *r = NULL;
		if (daemonutil_send_request(fd, &req) == 0)
			r = daemonutil_read_response(fd, 5000); /* none: the daemon closed it */
		frame_response_free(r);
		close(fd);
		daemonutil_sleep_ms(20); /* the check, if queued, done */
		int was_hit = disarm(&f);
		if (log_count(d, lost) > before) {
			print_message("allocation %ld failing: the check not queued\n", n);
			assert_int_equal(counter(d, "reports_dropped"), dropped + 1);
			counted++;
		}
		if (!was_hit)
			break; /* a round that failed nothing: every allocation was tried */
	}
	print_message("%ld allocations failed in turn, %d checks not queued\n", n - 1, counted);
	assert_true(counted > 0);
	assert_int_equal(counter(d, "entries"), 1); /* intact: nothing quarantined */
	daemonutil_cleanup(d);
#endif
}

static int setup(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/tiny-hybrid.json", K3_SHARED_DIR);
	tiny = model_load_file(path, err);
	return tiny ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	model_free(tiny);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_flood_of_small_requests_starves_nothing),
	        cmocka_unit_test(test_half_closed_publish_waiting_for_memory_is_answered),
	        cmocka_unit_test(test_damage_reports_are_bounded),
	        cmocka_unit_test(test_sigterm_stops_a_verify),
	        cmocka_unit_test(test_publish_refused_for_memory_holds_nothing),
	        cmocka_unit_test(test_streamed_publish_out_of_memory_is_answered),
	        cmocka_unit_test(test_report_out_of_memory_is_counted),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
