/* Layers as component arrays (k3cache_publish_arrays, k3cache_restore_arrays)
 * against the real daemon, through the public API only: the same entries and
 * bytes as the blob form, deltas, refusals before anything is sent, and
 * restores tampered on the wire refused by the shipped piecewise receive. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "k3cache/k3cache.h"
#include "tamperproxy.h"

static struct daemonutil d;
static struct k3cache_model *twin;

/* A state as the engine holds it: two float arrays per layer. */
struct state {
	uint32_t n, p;
	float *a[16], *b[16];
	size_t a_len[16], b_len[16];
};

static float value(uint32_t seed, uint32_t layer, uint32_t v, size_t j)
{
	uint32_t x = seed * 0x9E3779B1u + layer * 0x85EBCA77u + v * 0x27D4EB2Fu + (uint32_t)j;
	x ^= x >> 15;
	x *= 0x2C1B3C6Du;
	return (float)(x % 20001u) * 1e-4f - 1.0f;
}

/* MLA row r's values depend on (rows_seed, r) only, so that a longer state
 * of the same rows_seed extends a shorter one, as a conversation does. */
static struct state make_state(uint32_t p, uint32_t seed, uint32_t rows_seed)
{
	struct state s = {.n = k3cache_model_layers(twin), .p = p};
	assert_true(s.n <= 16);
	for (uint32_t i = 0; i < s.n; i++) {
		struct k3cache_layer l;
		assert_int_equal(k3cache_model_layer(twin, i, &l), 0);
		int kda = l.mixer == K3CACHE_MIXER_KDA;
		s.a_len[i] = kda ? l.conv_len : (size_t)p * l.k_row;
		s.b_len[i] = kda ? l.recurrent_len : (size_t)p * l.v_row;
		s.a[i] = malloc(s.a_len[i] * sizeof(float) + 1);
		s.b[i] = malloc(s.b_len[i] * sizeof(float) + 1);
		uint32_t sd = kda ? seed : rows_seed;
		for (size_t j = 0; j < s.a_len[i]; j++)
			s.a[i][j] = value(sd, i, 0, j);
		for (size_t j = 0; j < s.b_len[i]; j++)
			s.b[i][j] = value(sd, i, 1, j);
	}
	return s;
}

static void free_state(struct state *s)
{
	for (uint32_t i = 0; i < s->n; i++) {
		free(s->a[i]);
		free(s->b[i]);
	}
}

static void put32(unsigned char *p, uint32_t v)
{
	memcpy(p, &v, 4); /* little-endian hosts only (CMakeLists.txt) */
}

/* The seed's blob of layer i, packed by hand from the arrays (what the
 * library must produce without packing). */
static unsigned char *pack(const struct state *s, uint32_t i, size_t *len)
{
	struct k3cache_layer l;
	k3cache_model_layer(twin, i, &l);
	int kda = l.mixer == K3CACHE_MIXER_KDA;
	size_t head = kda ? 5 : 9;
	*len = head + s->a_len[i] * 4 + 4 + s->b_len[i] * 4;
	assert_int_equal(*len, k3cache_model_blob_size(twin, i, s->p));
	unsigned char *b = malloc(*len), *q = b;
	*q++ = kda ? 1 : 2;
	if (!kda) {
		put32(q, s->p);
		q += 4;
	}
	put32(q, (uint32_t)s->a_len[i]);
	memcpy(q + 4, s->a[i], s->a_len[i] * 4);
	q += 4 + s->a_len[i] * 4;
	put32(q, (uint32_t)s->b_len[i]);
	memcpy(q + 4, s->b[i], s->b_len[i] * 4);
	return b;
}

static void tokens_for(uint32_t *t, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = base + i * 5;
}

static struct k3cache *connect_to(const char *path)
{
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(path, &c, &e) != 0)
		fail_msg("connect: %s", e.message);
	return c;
}

static void arrays_of(const struct state *s, struct k3cache_arrays *in)
{
	for (uint32_t i = 0; i < s->n; i++)
		in[i] = (struct k3cache_arrays){s->a[i], s->a_len[i], s->b[i], s->b_len[i]};
}

static int publish_state(struct k3cache *c, const struct state *s, uint32_t base,
                         const uint8_t *base_key, uint32_t base_rows,
                         struct k3cache_publish_result *res, struct k3cache_error *e)
{
	uint32_t *t = malloc(s->p * sizeof(uint32_t));
	tokens_for(t, s->p, base);
	struct k3cache_arrays in[16];
	arrays_of(s, in);
	int rc = k3cache_publish_arrays(c, twin, "", 0, t, s->p, in, s->n, base_key, base_rows, res,
	                                e);
	free(t);
	return rc;
}

/* Fresh arrays of the state's shape, filled with a marker value. */
static struct state empty_like(const struct state *s)
{
	struct state o = *s;
	for (uint32_t i = 0; i < s->n; i++) {
		o.a[i] = malloc(s->a_len[i] * 4 + 1);
		o.b[i] = malloc(s->b_len[i] * 4 + 1);
		memset(o.a[i], 0x7f, s->a_len[i] * 4);
		memset(o.b[i], 0x7f, s->b_len[i] * 4);
	}
	return o;
}

static int restore_arrays(struct k3cache *c, const uint8_t *key, struct state *o, uint32_t *p,
                          struct k3cache_error *e)
{
	struct k3cache_arrays_out out[16];
	for (uint32_t i = 0; i < o->n; i++)
		out[i] = (struct k3cache_arrays_out){o->a[i], o->a_len[i], o->b[i], o->b_len[i]};
	return k3cache_restore_arrays(c, twin, key, out, o->n, p, e);
}

static void expect_equal(const struct state *want, const struct state *got)
{
	for (uint32_t i = 0; i < want->n; i++) {
		assert_memory_equal(got->a[i], want->a[i], want->a_len[i] * 4);
		assert_memory_equal(got->b[i], want->b[i], want->b_len[i] * 4);
	}
}

static uint64_t counter(struct k3cache *c, const char *name)
{
	uint64_t v = 0;
	struct k3cache_error e;
	if (k3cache_stat_counter(c, name, &v, &e) != 0)
		fail_msg("stat %s: %s", name, e.message);
	return v;
}

static int setup(void **state)
{
	(void)state;
	char path[1024];
	struct k3cache_error e;
	snprintf(path, sizeof(path), "%s/models/kimi-k3-0.40b-twin.json", K3_SHARED_DIR);
	twin = k3cache_model_load(path, &e);
	if (!twin || daemonutil_init(&d) ||
	    daemonutil_start(&d, "--max-inflight", "64M", (char *)NULL))
		return -1;
	struct k3cache *c = connect_to(d.sock);
	int rc = k3cache_put_model(c, twin, NULL, &e);
	k3cache_close(c);
	return rc;
}

static int teardown(void **state)
{
	(void)state;
	int rc = daemonutil_stop(&d, SIGTERM);
	daemonutil_cleanup(&d);
	k3cache_model_free(twin);
	return rc == 0 ? 0 : -1;
}

/* ---- tests ------------------------------------------------------------------ */

/* A publish from arrays stores the seed's blobs: the blob form restores them
 * byte for byte, a blob publish of the same state finds the entry stored,
 * and a restore into arrays gives the arrays back. */
static void test_arrays_match_the_blob_form(void **state)
{
	(void)state;
	struct k3cache *c = connect_to(d.sock);
	struct state s = make_state(700, 1, 1);
	struct k3cache_publish_result res, again;
	struct k3cache_error e;
	assert_int_equal(publish_state(c, &s, 100, NULL, 0, &res, &e), 0);
	assert_true(res.created);
	/* the blob form: the same bytes */
	void *bufs[16];
	size_t caps[16], lens[16];
	struct k3cache_buf blobs[16];
	for (uint32_t i = 0; i < s.n; i++) {
		blobs[i].data = pack(&s, i, &blobs[i].len);
		caps[i] = blobs[i].len;
		bufs[i] = malloc(caps[i]);
	}
	uint32_t p = 0;
	assert_int_equal(k3cache_restore_into(c, twin, res.key, bufs, caps, lens, &p, &e), 0);
	assert_int_equal(p, 700);
	for (uint32_t i = 0; i < s.n; i++) {
		assert_int_equal(lens[i], blobs[i].len);
		assert_memory_equal(bufs[i], blobs[i].data, lens[i]);
	}
	uint32_t t[700];
	tokens_for(t, 700, 100);
	assert_int_equal(k3cache_publish(c, k3cache_model_fingerprint(twin), "", 0, t, 700, blobs,
	                                 s.n, &again, &e),
	                 0);
	assert_false(again.created);
	assert_memory_equal(again.key, res.key, K3CACHE_KEY_LEN);
	/* arrays back, from an entry published as arrays and one as blobs */
	struct state o = empty_like(&s);
	p = 0;
	assert_int_equal(restore_arrays(c, res.key, &o, &p, &e), 0);
	assert_int_equal(p, 700);
	expect_equal(&s, &o);
	tokens_for(t, 700, 900000);
	assert_int_equal(k3cache_publish(c, k3cache_model_fingerprint(twin), "", 0, t, 700, blobs,
	                                 s.n, &again, &e),
	                 0);
	assert_true(again.created);
	free_state(&o);
	o = empty_like(&s);
	assert_int_equal(restore_arrays(c, again.key, &o, &p, &e), 0);
	expect_equal(&s, &o);
	for (uint32_t i = 0; i < s.n; i++) {
		free((void *)blobs[i].data);
		free(bufs[i]);
	}
	free_state(&o);
	free_state(&s);
	k3cache_close(c);
}

/* A delta from arrays sends the new rows only and restores whole. */
static void test_arrays_delta(void **state)
{
	(void)state;
	struct k3cache *c = connect_to(d.sock);
	struct state s600 = make_state(600, 2, 7), s900 = make_state(900, 3, 7);
	struct k3cache_publish_result a, b;
	struct k3cache_error e;
	assert_int_equal(publish_state(c, &s600, 5000, NULL, 0, &a, &e), 0);
	uint64_t in0 = counter(c, "bytes_in");
	assert_int_equal(publish_state(c, &s900, 5000, a.key, 600, &b, &e), 0);
	uint64_t in1 = counter(c, "bytes_in");
	assert_true(b.created);
	assert_int_equal(b.delta_rows, 600);
	uint64_t whole = 0, rows = 0;
	for (uint32_t i = 0; i < s900.n; i++) {
		whole += k3cache_model_blob_size(twin, i, 900);
		struct k3cache_layer l;
		k3cache_model_layer(twin, i, &l);
		if (l.mixer == K3CACHE_MIXER_MLA)
			rows += (uint64_t)(l.k_row + l.v_row) * 4 * 600;
	}
	assert_true(in1 - in0 < whole - rows + 65536);
	struct state o = empty_like(&s900);
	uint32_t p = 0;
	assert_int_equal(restore_arrays(c, b.key, &o, &p, &e), 0);
	assert_int_equal(p, 900);
	expect_equal(&s900, &o);
	free_state(&o);
	free_state(&s600);
	free_state(&s900);
	k3cache_close(c);
}

/* Arrays that disagree with the model are refused before a byte is sent,
 * and arrays too small for a restore before a byte is read into them; the
 * connection stays usable. */
static void test_arrays_refused_first(void **state)
{
	(void)state;
	struct k3cache *c = connect_to(d.sock);
	struct state s = make_state(300, 4, 4);
	uint32_t t[300];
	tokens_for(t, 300, 77000);
	struct k3cache_arrays in[16];
	struct k3cache_publish_result res;
	struct k3cache_error e;
	uint64_t in0 = counter(c, "bytes_in");
	arrays_of(&s, in);
	in[3].a_len--; /* an MLA k one float short */
	assert_int_equal(k3cache_publish_arrays(c, twin, "", 0, t, 300, in, s.n, NULL, 0, &res, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 3: k has"));
	arrays_of(&s, in);
	in[0].b = NULL;
	assert_int_equal(k3cache_publish_arrays(c, twin, "", 0, t, 300, in, s.n, NULL, 0, &res, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "recurrent array is NULL"));
	arrays_of(&s, in);
	assert_int_equal(
	        k3cache_publish_arrays(c, twin, "", 0, t, 300, in, s.n - 1, NULL, 0, &res, &e),
	        K3CACHE_INVALID);
	/* the same state at another P: every MLA length is wrong */
	assert_int_equal(k3cache_publish_arrays(c, twin, "", 0, t, 299, in, s.n, NULL, 0, &res, &e),
	                 K3CACHE_INVALID);
	assert_true(counter(c, "bytes_in") < in0 + 4096); /* requests, no payload */
	/* now stored, and restored into arrays too small */
	assert_int_equal(k3cache_publish_arrays(c, twin, "", 0, t, 300, in, s.n, NULL, 0, &res, &e),
	                 0);
	struct state o = empty_like(&s);
	struct k3cache_arrays_out out[16] = {{0}};
	for (uint32_t i = 0; i < o.n; i++)
		out[i] = (struct k3cache_arrays_out){o.a[i], o.a_len[i], o.b[i], o.b_len[i]};
	uint32_t p = 0;
	assert_int_equal(k3cache_restore_arrays(c, twin, res.key, out, o.n - 1, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layers given"));
	out[3].b_cap--; /* twin's layer 3 is MLA */
	assert_int_equal(k3cache_restore_arrays(c, twin, res.key, out, o.n, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 3: its v array holds"));
	assert_int_equal(p, 0);
	out[3].b_cap++;
	/* two arrays sharing memory: refused before a byte lands */
	float *kept = out[4].a;
	out[4].a = out[3].b + 1;
	assert_int_equal(k3cache_restore_arrays(c, twin, res.key, out, o.n, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 3's v array and layer 4's"));
	assert_non_null(strstr(e.message, "share memory"));
	out[4].a = kept;
	out[5].b = out[5].a; /* a layer's own two */
	assert_int_equal(k3cache_restore_arrays(c, twin, res.key, out, o.n, &p, &e),
	                 K3CACHE_INVALID);
	assert_non_null(strstr(e.message, "layer 5's"));
	out[5].b = o.b[5];
	assert_int_equal(p, 0);
	/* nothing was read into them, and the connection goes on */
	const unsigned char *q = (const unsigned char *)o.b[3];
	assert_int_equal(q[0], 0x7f);
	assert_int_equal(restore_arrays(c, res.key, &o, &p, &e), 0);
	expect_equal(&s, &o);
	free_state(&o);
	free_state(&s);
	k3cache_close(c);
}

static void flip_mla_value(uint32_t index, void *blob, size_t len)
{
	if (index == 3) /* a float deep in v, far from the header words */
		((unsigned char *)blob)[len - 1000] ^= 0x01;
}

static void nan_in_conv(uint32_t index, void *blob, size_t len)
{
	(void)len;
	if (index == 0) {
		uint32_t nan = 0x7fc00000u;
		memcpy((unsigned char *)blob + 5 + 40, &nan, 4);
	}
}

static void seq_len_off(uint32_t index, void *blob, size_t len)
{
	(void)len;
	if (index == 3)
		((unsigned char *)blob)[1] ^= 0x01;
}

/* Restores tampered on the wire are refused by the scattered receive, with
 * the layer named, and nothing is reported restored. */
static void test_arrays_tampered_refused(void **state)
{
	(void)state;
	struct tamperproxy proxy;
	assert_int_equal(tamperproxy_start(&proxy, d.dir, d.sock), 0);
	struct k3cache *c = connect_to(proxy.path);
	struct state s = make_state(400, 5, 5);
	struct k3cache_publish_result res;
	struct k3cache_error e;
	assert_int_equal(publish_state(c, &s, 33000, NULL, 0, &res, &e), 0);
	struct {
		tamperproxy_fn fn;
		const char *says;
	} cases[] = {
	        {flip_mla_value, "layer 3: checksum mismatch"},
	        {nan_in_conv, "layer 0: KDA conv[10] is NaN"},
	        {seq_len_off, "layer 3: MLA"},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		tamperproxy_set(&proxy, cases[k].fn);
		struct state o = empty_like(&s);
		uint32_t p = 99;
		assert_int_not_equal(restore_arrays(c, res.key, &o, &p, &e), 0);
		if (!strstr(e.message, cases[k].says))
			fail_msg("case %zu: \"%s\" does not say \"%s\"", k, e.message,
			         cases[k].says);
		assert_non_null(strstr(e.message, "must not be used"));
		assert_int_equal(p, 0);
		free_state(&o);
	}
	tamperproxy_set(&proxy, NULL);
	struct state o = empty_like(&s);
	uint32_t p = 0;
	assert_int_equal(restore_arrays(c, res.key, &o, &p, &e), 0);
	expect_equal(&s, &o);
	free_state(&o);
	free_state(&s);
	k3cache_close(c);
	tamperproxy_stop(&proxy);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_arrays_match_the_blob_form),
	        cmocka_unit_test(test_arrays_delta),
	        cmocka_unit_test(test_arrays_refused_first),
	        cmocka_unit_test(test_arrays_tampered_refused),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
