/* libk3cache, and its direct reader, when memory runs out in the worker's
 * process, against the real daemon (which has all it needs). The test is linked with -Wl,--wrap for
 * the allocators (allocfail.h; tests/CMakeLists.txt), so the library's own
 * allocations in this binary can be made to fail: the 1st, 2nd, 3rd ... of
 * a round of calls a worker makes (connect, put the model, publish, publish
 * a delta, lookup and restore, restore into buffers and into arrays), until
 * a round fails none. After every round:
 *  - no call crashed, and under ASan nothing leaked;
 *  - a call that failed said INTERNAL (the worker's memory, not its data,
 *    not the daemon's bytes);
 *  - a restore that answered OK handed over exactly the published bytes;
 *  - the daemon is up, and a new connection publishes and restores.
 * The direct reader's round (open, lookup, restore into buffers, a view,
 * close) is swept the same way: a failure that said CORRUPT would also
 * report the entry damaged to the daemon. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "allocfail.h"
#include "daemonutil.h"
#include "k3cache/direct.h"
#include "k3cache/k3cache.h"

#define P_BASE 200 /* the held entry: three MLA row blocks */
#define P_TURN 260 /* a turn on from it, published whole or as a delta */

static struct daemonutil d;
static struct k3cache_model *twin;
static uint32_t toks[P_TURN + 1];

/* A snapshot's blobs, made by the test (never under a failing allocator). */
struct snap {
	uint32_t n;
	struct k3cache_buf *bufs;
};

static float value(uint32_t seed, uint32_t layer, int mla, size_t j)
{
	uint32_t x = (mla ? 7u : seed) * 0x9E3779B1u + layer * 0x85EBCA77u + (uint32_t)j;
	x ^= x >> 15;
	x *= 0x2C1B3C6Du;
	return (float)(x % 20001u) * 1e-4f - 1.0f;
}

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

/* Blobs of every layer at P = p. MLA rows depend on the row alone, so that
 * a longer snapshot extends a shorter one (a delta's base). */
static struct snap make_snap(uint32_t p, uint32_t seed)
{
	uint32_t n = k3cache_model_layers(twin);
	struct snap s = {n, calloc(n, sizeof(struct k3cache_buf))};
	for (uint32_t i = 0; i < n; i++) {
		struct k3cache_layer li;
		assert_int_equal(k3cache_model_layer(twin, i, &li), 0);
		int mla = li.mixer == K3CACHE_MIXER_MLA;
		size_t n0 = mla ? (size_t)p * li.k_row : li.conv_len;
		size_t n1 = mla ? (size_t)p * li.v_row : li.recurrent_len;
		size_t head = mla ? 9 : 5, len = head + n0 * 4 + 4 + n1 * 4;
		unsigned char *b = malloc(len);
		b[0] = mla ? 2 : 1;
		if (mla)
			put_le32(b + 1, p);
		put_le32(b + head - 4, (uint32_t)n0);
		for (size_t j = 0; j < n0; j++) {
			float f = value(seed, i, mla, j);
			memcpy(b + head + j * 4, &f, 4);
		}
		put_le32(b + head + n0 * 4, (uint32_t)n1);
		for (size_t j = 0; j < n1; j++) {
			float f = value(seed, i, mla, 1000000u + j);
			memcpy(b + head + n0 * 4 + 4 + j * 4, &f, 4);
		}
		s.bufs[i] = (struct k3cache_buf){b, len};
	}
	return s;
}

static void free_snap(struct snap *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		free((void *)s->bufs[i].data);
	free(s->bufs);
}

static struct snap base;
static uint8_t base_key[K3CACHE_KEY_LEN];

static int setup(void **state)
{
	(void)state;
	char path[1024];
	struct k3cache_error e;
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	twin = k3cache_model_load(path, &e);
	if (!twin || daemonutil_init(&d) || daemonutil_start(&d, (char *)NULL))
		return -1;
	for (uint32_t i = 0; i <= P_TURN; i++)
		toks[i] = 5000 + i;
	base = make_snap(P_BASE, 1);
	struct k3cache *c;
	struct k3cache_publish_result r;
	if (k3cache_connect(d.sock, &c, &e) || k3cache_put_model(c, twin, NULL, &e) ||
	    k3cache_publish(c, k3cache_model_fingerprint(twin), "", 0, toks, P_BASE, base.bufs,
	                    base.n, &r, &e)) {
		fprintf(stderr, "setup: %s\n", e.message);
		return -1;
	}
	memcpy(base_key, r.key, sizeof(base_key));
	k3cache_close(c);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	daemonutil_cleanup(&d);
	free_snap(&base);
	k3cache_model_free(twin);
	return 0;
}

/* What a round saw. */
struct seen {
	int failed; /* calls that failed */
	int wrong;  /* restores answered OK with other bytes */
	int blamed; /* failures that said something other than INTERNAL */
	char first[K3CACHE_MESSAGE_MAX + 64];
};

static void note(struct seen *s, const char *call, int rc, const struct k3cache_error *e)
{
	if (!rc)
		return;
	s->failed++;
	if (e->code != K3CACHE_INTERNAL && !s->blamed++)
		snprintf(s->first, sizeof(s->first), "%s: %s: %s", call, k3cache_code_name(e->code),
		         e->message);
}

static int same_as_base(uint32_t index, const void *blob, size_t len, void *ctx)
{
	int *wrong = ctx;
	if (index >= base.n || len != base.bufs[index].len ||
	    memcmp(blob, base.bufs[index].data, len) != 0)
		++*wrong;
	return 0;
}

/* Buffers for a restore of the held entry (made outside any failure). */
struct dest {
	void *bufs[64];
	size_t caps[64], lens[64];
};

static void new_dest(struct dest *t)
{
	memset(t, 0, sizeof(*t));
	for (uint32_t i = 0; i < base.n && i < 64; i++) {
		t->caps[i] = base.bufs[i].len;
		t->bufs[i] = malloc(t->caps[i]);
	}
}

/* 1 when a restore into t did not give the held entry's bytes. */
static int dest_differs(const struct dest *t)
{
	for (uint32_t i = 0; i < base.n; i++)
		if (!t->bufs[i] || t->lens[i] != base.bufs[i].len ||
		    memcmp(t->bufs[i], base.bufs[i].data, t->lens[i]) != 0)
			return 1;
	return 0;
}

static void free_dest(struct dest *t)
{
	for (uint32_t i = 0; i < 64; i++)
		free(t->bufs[i]);
}

/* One round of a worker's calls, the n-th allocation failing. */
static void client_round(long n, void *ctx, struct seen *s)
{
	const struct snap *turn = ctx;
	const uint8_t *fp = k3cache_model_fingerprint(twin);
	struct dest dst;
	new_dest(&dst);
	void **bufs = dst.bufs;
	size_t *caps = dst.caps, *lens = dst.lens;
	struct k3cache_error e;
	struct k3cache *c = NULL;
	allocfail_arm(n);
	int rc = k3cache_connect(d.sock, &c, &e);
	note(s, "connect", rc, &e);
	if (!rc) {
		note(s, "put_model", k3cache_put_model(c, twin, NULL, &e), &e);
		struct k3cache_publish_result pr;
		note(s, "publish",
		     k3cache_publish(c, fp, "round", 5, toks, P_TURN, turn->bufs, turn->n, &pr, &e),
		     &e);
		note(s, "publish_delta",
		     k3cache_publish_delta(c, fp, "", 0, toks, P_TURN, turn->bufs, turn->n,
		                           base_key, P_BASE, &pr, &e),
		     &e);
		struct k3cache_lookup_result lr;
		int wrong = 0;
		rc = k3cache_lookup_restore(c, twin, "", 0, toks, P_BASE + 1, P_BASE, same_as_base,
		                            &wrong, &lr, &e);
		note(s, "lookup_restore", rc, &e);
		if (!rc && lr.prefix_len != P_BASE)
			wrong++; /* a miss or another entry, answered OK */
		s->wrong += wrong;
		uint32_t p = 0;
		rc = k3cache_restore_into(c, twin, base_key, bufs, caps, lens, &p, &e);
		note(s, "restore_into", rc, &e);
		if (!rc)
			s->wrong += dest_differs(&dst);
		k3cache_close(c);
	}
	allocfail_disarm();
	free_dest(&dst);
}

/* Outside any failure: the daemon still publishes and restores. */
static void expect_daemon_serves(void)
{
	assert_true(daemonutil_alive(&d));
	struct k3cache *c;
	struct k3cache_error e;
	assert_int_equal(k3cache_connect(d.sock, &c, &e), 0);
	int wrong = 0;
	struct k3cache_lookup_result lr;
	assert_int_equal(k3cache_lookup_restore(c, twin, "", 0, toks, P_BASE + 1, P_BASE,
	                                        same_as_base, &wrong, &lr, &e),
	                 0);
	assert_int_equal(lr.prefix_len, P_BASE);
	assert_int_equal(wrong, 0);
	k3cache_close(c);
}

/* Runs round with its 1st, 2nd ... allocation failing until a round fails
 * none, checking each round (see the top); returns how many it made. */
static long sweep(const char *what, void (*round)(long n, void *ctx, struct seen *s), void *ctx)
{
	long n;
	int failed_calls = 0;
	for (n = 1; n < 5000; n++) {
		struct seen s = {0};
		round(n, ctx, &s);
		long hits = allocfail_hits();
		if (s.wrong)
			fail_msg("%s, allocation %ld failing: a read answered OK with other bytes",
			         what, n);
		if (s.blamed)
			fail_msg("%s, allocation %ld failing: %s (not INTERNAL)", what, n, s.first);
		if (s.failed && !hits)
			fail_msg("%s, allocation %ld: a call failed with no allocation failing",
			         what, n);
		failed_calls += s.failed;
		expect_daemon_serves();
		if (!hits)
			break;
	}
	printf("%s: a round makes %ld allocations; %d calls failed for them\n", what, n - 1,
	       failed_calls);
	assert_true(n < 5000);
	return n - 1;
}

static void test_client_out_of_memory(void **state)
{
	(void)state;
	struct snap turn = make_snap(P_TURN, 2);
	assert_true(sweep("libk3cache", client_round, &turn) > 20);
	free_snap(&turn);
}

/* One round of a same-host worker's direct reads, the n-th allocation
 * failing. */
static void direct_round(long n, void *ctx, struct seen *s)
{
	(void)ctx;
	const uint8_t *fp = k3cache_model_fingerprint(twin);
	uint32_t nl = base.n;
	struct dest dst;
	new_dest(&dst);
	void **bufs = dst.bufs;
	size_t *caps = dst.caps, *lens = dst.lens;
	struct k3cache_error e;
	struct k3cache_direct *dr = NULL;
	allocfail_arm(n);
	int rc = k3cache_direct_open(d.db, d.sock, &dr, &e);
	note(s, "direct_open", rc, &e);
	if (!rc) {
		struct k3cache_lookup_result lr;
		rc = k3cache_direct_lookup(dr, fp, "", 0, toks, P_BASE + 1, P_BASE, &lr, &e);
		note(s, "direct_lookup", rc, &e);
		if (!rc &&
		    (lr.prefix_len != P_BASE || memcmp(lr.key, base_key, sizeof(base_key)) != 0))
			s->wrong++;
		uint32_t p = 0;
		rc = k3cache_direct_restore_into(dr, twin, base_key, bufs, caps, lens, &p, &e);
		note(s, "direct_restore_into", rc, &e);
		if (!rc)
			s->wrong += dest_differs(&dst);
		struct k3cache_direct_view *v = NULL;
		rc = k3cache_direct_view(dr, twin, base_key, &v, &e);
		note(s, "direct_view", rc, &e);
		for (uint32_t i = 0; !rc && i < nl; i++) {
			size_t at = 0;
			const struct k3cache_view_layer *l = &v->layers[i];
			for (uint32_t j = 0; j < l->n_pieces; j++) {
				const struct k3cache_buf *pc = &l->pieces[j];
				if (at + pc->len > base.bufs[i].len ||
				    memcmp(pc->data, (const unsigned char *)base.bufs[i].data + at,
				           pc->len) != 0)
					s->wrong++;
				at += pc->len;
			}
			if (at != base.bufs[i].len)
				s->wrong++;
		}
		if (!rc)
			k3cache_direct_view_release(v);
		k3cache_direct_close(dr);
	}
	allocfail_disarm();
	free_dest(&dst);
}

/* The direct reader reports an entry damaged to the daemon only on CORRUPT,
 * which the sweep refuses (a failure must say INTERNAL). */
static void test_direct_out_of_memory(void **state)
{
	(void)state;
	assert_true(sweep("direct reader", direct_round, NULL) > 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_client_out_of_memory),
	        cmocka_unit_test(test_direct_out_of_memory),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
