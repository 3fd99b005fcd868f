/* Hostile input against the real daemon: each bad frame gets its code (or a
 * clean close when the frame cannot be trusted), nothing is stored, the
 * daemon stays up, other clients are served, and the error counters rise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "blob.h"
#include "checksum.h"
#include "daemonutil.h"
#include "model.h"

static struct daemonutil d;
static int good = -1; /* a well-behaved client, kept open throughout */
static uint64_t next_id = 1;

static frame_response *call(int fd, frame_request *req)
{
	req->id = next_id++;
	if (daemonutil_send_request(fd, req) != 0)
		return NULL;
	return daemonutil_read_response(fd, 5000);
}

static uint64_t counter(const char *name)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat stat = K3CACHE__V1__STAT__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	req.stat = &stat;
	frame_response *r = call(good, &req);
	assert_non_null(r);
	uint64_t v = UINT64_MAX;
	for (size_t i = 0; i < r->n_counters; i++)
		if (!strcmp(r->counters[i]->name, name))
			v = r->counters[i]->value;
	frame_response_free(r);
	assert_true(v != UINT64_MAX);
	return v;
}

/* The daemon is up and still serves the good client. */
static void assert_served(void)
{
	assert_true(daemonutil_alive(&d));
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Hello hello = K3CACHE__V1__HELLO__INIT;
	hello.protocol = 1;
	req.op_case = K3CACHE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	frame_response *r = call(good, &req);
	assert_non_null(r);
	assert_int_equal(r->code, 0);
	assert_int_equal(r->protocol, 1);
	frame_response_free(r);
}

static int setup(void **state)
{
	(void)state;
	if (daemonutil_init(&d) || daemonutil_start(&d, "--max-payload", "1M", (char *)NULL))
		return -1;
	good = daemonutil_connect_raw(d.sock);
	return good < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	close(good);
	assert_int_equal(daemonutil_stop(&d, SIGTERM), 0);
	daemonutil_cleanup(&d);
	return 0;
}

static void raw_frame_then_close(const unsigned char *bytes, size_t len, int want_code)
{
	int fd = daemonutil_connect_raw(d.sock);
	assert_true(fd >= 0);
	assert_int_equal(daemonutil_write_all(fd, bytes, len), 0);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, want_code);
	assert_true(strlen(r->message) > 10);
	frame_response_free(r);
	assert_true(daemonutil_closed(fd, 5000));
	close(fd);
	assert_served();
}

static void test_header_len_zero(void **state)
{
	(void)state;
	uint64_t before = counter("errors_invalid");
	uint64_t mid = counter("closed_mid_frame");
	unsigned char zero[4] = {0, 0, 0, 0};
	raw_frame_then_close(zero, 4, STATUS_INVALID);
	assert_int_equal(counter("errors_invalid"), before + 1);
	/* a bad length ends the frame where it began: not mid-frame */
	assert_int_equal(counter("closed_mid_frame"), mid);
}

static void test_header_len_over_16mib(void **state)
{
	(void)state;
	uint64_t before = counter("errors_too_large");
	unsigned char big[4];
	frame_put_len(big, (16u << 20) + 1);
	raw_frame_then_close(big, 4, STATUS_TOO_LARGE);
	assert_int_equal(counter("errors_too_large"), before + 1);
}

static void test_header_not_protobuf(void **state)
{
	(void)state;
	uint64_t mid = counter("closed_mid_frame");
	unsigned char junk[4 + 6] = {6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	raw_frame_then_close(junk, sizeof(junk), STATUS_INVALID);
	/* a header that does not decode: its frame is cut short */
	assert_int_equal(counter("closed_mid_frame"), mid + 1);
}

static void publish_header(frame_request *req, K3cache__V1__Publish *pub,
                           K3cache__V1__LayerRef *refs, K3cache__V1__LayerRef **prefs,
                           uint8_t fp[32], uint32_t *tokens, const uint64_t *sizes, size_t n)
{
	k3cache__v1__request__init(req);
	k3cache__v1__publish__init(pub);
	req->op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req->publish = pub;
	pub->model.data = fp;
	pub->model.len = 32;
	pub->tokens = tokens;
	pub->n_tokens = 3;
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++) {
		k3cache__v1__layer_ref__init(&refs[i]);
		refs[i].index = (uint32_t)i;
		refs[i].size = sizes[i];
		prefs[i] = &refs[i];
		sum += sizes[i];
	}
	pub->layers = prefs;
	pub->n_layers = n;
	req->payload_len = sum;
}

static void test_payload_over_max(void **state)
{
	(void)state;
	uint8_t fp[32] = {1};
	uint32_t tokens[3] = {1, 2, 3};
	uint64_t sizes[2] = {1u << 20, 1u << 20}; /* 2 MiB > --max-payload 1M */
	frame_request req;
	K3cache__V1__Publish pub;
	K3cache__V1__LayerRef refs[2], *prefs[2];
	publish_header(&req, &pub, refs, prefs, fp, tokens, sizes, 2);
	req.id = 77;
	uint64_t mid = counter("closed_mid_frame");
	int fd = daemonutil_connect_raw(d.sock);
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_TOO_LARGE);
	assert_int_equal(r->id, 77);
	frame_response_free(r);
	assert_true(daemonutil_closed(fd, 5000));
	close(fd);
	assert_served();
	/* closed with its payload unread: mid-frame */
	assert_int_equal(counter("closed_mid_frame"), mid + 1);
}

/* The layer list disagrees with payload_len: INVALID, the payload is skipped,
 * and the same connection carries on. */
static void test_payload_len_disagrees(void **state)
{
	(void)state;
	uint8_t fp[32] = {1};
	uint32_t tokens[3] = {1, 2, 3};
	uint64_t sizes[2] = {40, 60};
	frame_request req;
	K3cache__V1__Publish pub;
	K3cache__V1__LayerRef refs[2], *prefs[2];
	publish_header(&req, &pub, refs, prefs, fp, tokens, sizes, 2);
	req.payload_len = 50;
	req.id = 5;
	int fd = daemonutil_connect_raw(d.sock);
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	unsigned char pad[50] = {0};
	assert_int_equal(daemonutil_write_all(fd, pad, sizeof(pad)), 0);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_INVALID);
	assert_non_null(strstr(r->message, "payload_len"));
	frame_response_free(r);
	/* same connection: an unknown op gets UNSUPPORTED and the connection stays */
	frame_request none = K3CACHE__V1__REQUEST__INIT;
	r = call(fd, &none);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_UNSUPPORTED);
	frame_response_free(r);
	/* a payload on an op that takes none: INVALID, skipped */
	frame_request st = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Stat stat = K3CACHE__V1__STAT__INIT;
	st.op_case = K3CACHE__V1__REQUEST__OP_STAT;
	st.stat = &stat;
	st.payload_len = 10;
	st.id = next_id++;
	assert_int_equal(daemonutil_send_request(fd, &st), 0);
	assert_int_equal(daemonutil_write_all(fd, pad, 10), 0);
	r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_INVALID);
	frame_response_free(r);
	st.payload_len = 0;
	r = call(fd, &st);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_OK);
	frame_response_free(r);
	close(fd);
	assert_served();
}

static void test_closed_mid_payload(void **state)
{
	(void)state;
	uint64_t before = counter("closed_mid_frame");
	uint8_t fp[32] = {1};
	uint32_t tokens[3] = {1, 2, 3};
	uint64_t sizes[1] = {1000};
	frame_request req;
	K3cache__V1__Publish pub;
	K3cache__V1__LayerRef refs[1], *prefs[1];
	publish_header(&req, &pub, refs, prefs, fp, tokens, sizes, 1);
	int fd = daemonutil_connect_raw(d.sock);
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	unsigned char half[500] = {0};
	assert_int_equal(daemonutil_write_all(fd, half, sizeof(half)), 0);
	daemonutil_sleep_ms(50);
	close(fd);
	daemonutil_sleep_ms(100);
	assert_served();
	assert_int_equal(counter("closed_mid_frame"), before + 1);
	assert_int_equal(counter("entries"), 0);
	assert_int_equal(counter("inflight_bytes"), 0);
}

/* Well-framed publishes with bad content: the store refuses them whole. */
static void test_bad_publish_content(void **state)
{
	(void)state;
	char path[1024], err[MODEL_ERROR_MAX];
	snprintf(path, sizeof(path), "%s/models/tiny-hybrid.json", K3_SHARED_DIR);
	struct k3cache_model *m = model_load_file(path, err);
	assert_non_null(m);
	uint32_t tokens[3] = {1, 2, 3};
	/* unknown model */
	unsigned char kda[121], mla[5 + 8 + 18 * 4 + 4 * 12];
	size_t kda_len, mla_len;
	{
		FILE *f;
		snprintf(path, sizeof(path), "%s/vectors/blobs/sem_ok_kda_layer0.bin",
		         K3_SHARED_DIR);
		f = fopen(path, "rb");
		kda_len = fread(kda, 1, sizeof(kda), f);
		fclose(f);
		snprintf(path, sizeof(path), "%s/vectors/blobs/sem_ok_mla_layer3.bin",
		         K3_SHARED_DIR);
		f = fopen(path, "rb");
		mla_len = fread(mla, 1, sizeof(mla), f);
		fclose(f);
	}
	uint64_t sizes[4] = {kda_len, kda_len, kda_len, mla_len};
	frame_request req;
	K3cache__V1__Publish pub;
	K3cache__V1__LayerRef refs[4], *prefs[4];
	publish_header(&req, &pub, refs, prefs, m->fingerprint, tokens, sizes, 4);
	int fd = daemonutil_connect_raw(d.sock);
	req.id = 9;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	for (int i = 0; i < 3; i++)
		daemonutil_write_all(fd, kda, kda_len);
	daemonutil_write_all(fd, mla, mla_len);
	frame_response *r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_UNKNOWN_MODEL);
	frame_response_free(r);

	/* put the model, then publish a KDA blob into the MLA slot (C4) */
	frame_request pm = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__PutModel put = K3CACHE__V1__PUT_MODEL__INIT;
	K3cache__V1__ModelSpec spec = K3CACHE__V1__MODEL_SPEC__INIT;
	K3cache__V1__LayerSpec ls[4], *pls[4];
	for (int i = 0; i < 4; i++) {
		k3cache__v1__layer_spec__init(&ls[i]);
		ls[i].mixer = (K3cache__V1__Mixer)m->layers[i].mixer;
		ls[i].conv_len = m->layers[i].conv_len;
		ls[i].recurrent_len = m->layers[i].recurrent_len;
		ls[i].k_row = m->layers[i].k_row;
		ls[i].v_row = m->layers[i].v_row;
		pls[i] = &ls[i];
	}
	spec.name = m->name;
	spec.revision = m->revision;
	spec.state_layout = m->state_layout;
	spec.layers = pls;
	spec.n_layers = 4;
	put.model = &spec;
	pm.op_case = K3CACHE__V1__REQUEST__OP_PUT_MODEL;
	pm.put_model = &put;
	r = call(fd, &pm);
	assert_non_null(r);
	assert_int_equal(r->code, 0);
	assert_int_equal(r->fingerprint.len, 32);
	assert_memory_equal(r->fingerprint.data, m->fingerprint, 32);
	frame_response_free(r);

	uint64_t sizes2[4] = {kda_len, kda_len, kda_len, kda_len};
	publish_header(&req, &pub, refs, prefs, m->fingerprint, tokens, sizes2, 4);
	req.id = 10;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	for (int i = 0; i < 4; i++)
		daemonutil_write_all(fd, kda, kda_len);
	r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_INVALID);
	assert_non_null(strstr(r->message, "layer 3: model says MLA, blob is KDA"));
	frame_response_free(r);

	/* a wrong checksum is caught too */
	publish_header(&req, &pub, refs, prefs, m->fingerprint, tokens, sizes, 4);
	refs[1].xxh3 = checksum_blob(kda, kda_len, 0); /* layer 0's checksum on layer 1 */
	req.id = 11;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	for (int i = 0; i < 3; i++)
		daemonutil_write_all(fd, kda, kda_len);
	daemonutil_write_all(fd, mla, mla_len);
	r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_INVALID);
	assert_non_null(strstr(r->message, "layer 1: checksum mismatch"));
	frame_response_free(r);
	assert_int_equal(counter("entries"), 0);

	/* and the good one is stored */
	publish_header(&req, &pub, refs, prefs, m->fingerprint, tokens, sizes, 4);
	req.id = 12;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	for (int i = 0; i < 3; i++)
		daemonutil_write_all(fd, kda, kda_len);
	daemonutil_write_all(fd, mla, mla_len);
	r = daemonutil_read_response(fd, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, STATUS_OK);
	assert_int_equal(r->id, 12);
	assert_true(r->created);
	frame_response_free(r);
	assert_int_equal(counter("entries"), 1);
	close(fd);
	model_free(m);
	assert_served();
}

/* A client that pipelines requests and half-closes still gets every answer,
 * in order, including one that goes through the writer thread. */
static void test_half_close_gets_answer(void **state)
{
	(void)state;
	int fd = daemonutil_connect_raw(d.sock);
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict ev = K3CACHE__V1__EVICT__INIT;
	ev.idle_seconds = 3600;
	ev.dry_run = 1;
	req.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	req.id = 30;
	assert_int_equal(daemonutil_send_request(fd, &req), 0);
	assert_int_equal(daemonutil_send_hello(fd, 31), 0);
	shutdown(fd, SHUT_WR);
	for (uint64_t id = 30; id <= 31; id++) {
		frame_response *r = daemonutil_read_response(fd, 5000);
		assert_non_null(r);
		assert_int_equal(r->id, id);
		assert_int_equal(r->code, 0);
		frame_response_free(r);
	}
	assert_true(daemonutil_closed(fd, 5000));
	close(fd);
	assert_served();
}

/* A field of the daemon's /proc status ("VmRSS:", "VmHWM:"), KiB. */
static uint64_t daemon_kib(const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)d.pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	uint64_t kib = 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)))
			kib = strtoull(line + strlen(field), NULL, 10);
	fclose(f);
	return kib;
}

/* A publish frame (prefix and header) of n empty layer refs: index 0 and no
 * size, 2 bytes each on the wire (so out of order: INVALID), a 72-byte
 * struct and pointer each decoded; *len its length. */
static unsigned char *empty_refs_frame(size_t n, uint64_t payload_len, size_t *len)
{
	uint8_t fp[32] = {1};
	uint32_t tokens[3] = {1, 2, 3};
	frame_request req;
	K3cache__V1__Publish pub;
	K3cache__V1__LayerRef *refs = calloc(n, sizeof(*refs));
	K3cache__V1__LayerRef **prefs = calloc(n, sizeof(*prefs));
	uint64_t *sizes = calloc(n, sizeof(*sizes));
	assert_non_null(refs);
	assert_non_null(prefs);
	assert_non_null(sizes);
	publish_header(&req, &pub, refs, prefs, fp, tokens, sizes, n);
	for (size_t i = 0; i < n; i++)
		refs[i].index = 0;
	req.payload_len = payload_len;
	unsigned char *wire;
	*len = frame_encode_request(&req, &wire);
	assert_true(*len > 0);
	free(sizes);
	free(prefs);
	free(refs);
	return wire;
}

/* A refused request whose payload is being skipped holds none of its decoded
 * header: a 20 KB header of empty layer refs (under the free 64 KiB, and
 * within frame_decode_budget()'s 1 MiB floor) decodes to ~0.9 MB, and
 * clients that stop sending the skipped payload must not park that memory,
 * uncharged, for as long as they trickle (40 of them held 30 MB). */
static void test_refused_request_holds_no_header(void **state)
{
	(void)state;
#ifdef K3_SANITIZED
	skip(); /* resident memory is the sanitizers' */
#endif
	enum { CONNS = 40 };
	size_t n;
	unsigned char *wire = empty_refs_frame(10000, 1000, &n);
	assert_true(n < 64u << 10);
	uint64_t before = daemon_kib("VmRSS:");
	int fds[CONNS];
	for (int i = 0; i < CONNS; i++) {
		fds[i] = daemonutil_connect_raw(d.sock);
		assert_true(fds[i] >= 0);
		assert_int_equal(daemonutil_write_all(fds[i], wire, n), 0);
	}
	assert_served();
	daemonutil_sleep_ms(300); /* every header above is in and decoded */
	uint64_t held = daemon_kib("VmRSS:");
	for (int i = 0; i < CONNS; i++)
		close(fds[i]);
	assert_served();
	free(wire);
	/* each connection holds its 64 KiB input buffer; not 1 MB of refs */
	fprintf(stderr, "rss %llu KiB -> %llu KiB\n", (unsigned long long)before,
	        (unsigned long long)held);
	assert_true(held < before + UINT64_C(16) * 1024);
}

/* A header of empty layer refs is refused once its decoding passes
 * frame_decode_budget(), not decoded whole: a 4 MiB header (charged 20 MiB
 * to --max-inflight) took the daemon's peak memory up by ~200 MiB, a 16 MiB
 * one by 830 MiB. The stream cannot be trusted past it: TOO_LARGE, closed. */
static void test_header_decoding_is_bounded(void **state)
{
	(void)state;
	size_t n;
	unsigned char *wire = empty_refs_frame(2u << 20, 0, &n);
	assert_true(n > (4u << 20) && n < (5u << 20));
	uint64_t before = daemon_kib("VmHWM:");
	raw_frame_then_close(wire, n, STATUS_TOO_LARGE);
	uint64_t peak = daemon_kib("VmHWM:");
	free(wire);
#ifndef K3_SANITIZED /* resident memory is the sanitizers' */
	assert_true(peak < before + UINT64_C(48) * 1024);
#else
	(void)peak;
	(void)before;
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_header_len_zero),
	        cmocka_unit_test(test_header_len_over_16mib),
	        cmocka_unit_test(test_header_not_protobuf),
	        cmocka_unit_test(test_payload_over_max),
	        cmocka_unit_test(test_payload_len_disagrees),
	        cmocka_unit_test(test_closed_mid_payload),
	        cmocka_unit_test(test_bad_publish_content),
	        cmocka_unit_test(test_half_close_gets_answer),
	        cmocka_unit_test(test_refused_request_holds_no_header),
	        cmocka_unit_test(test_header_decoding_is_bounded),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
