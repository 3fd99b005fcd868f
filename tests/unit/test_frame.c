/* The tokens fast path of the frame codec (src/frame_tokens.c) against
 * protobuf-c itself: encoding gives the same bytes, decoding the same
 * message, and every unusual form falls back to protobuf-c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frame.h"
#include "frame_tokens.h"
#include "ops.h"

static uint32_t *make_tokens(size_t n, uint32_t seed, uint32_t max)
{
	uint32_t *t = malloc(n * sizeof(*t));
	uint32_t x = seed;
	for (size_t i = 0; i < n; i++) {
		x = x * 1664525u + 1013904223u;
		/* every varint length: 1 to 5 bytes */
		uint32_t v = x >> (x % 5u * 7u);
		t[i] = max ? v % max : v;
	}
	return t;
}

/* protobuf-c's own frame of req */
static size_t plain_encode(const frame_request *req, unsigned char **out)
{
	size_t n = k3cache__v1__request__get_packed_size(req);
	*out = malloc(FRAME_PREFIX_LEN + n);
	frame_put_len(*out, (uint32_t)n);
	k3cache__v1__request__pack(req, *out + FRAME_PREFIX_LEN);
	return FRAME_PREFIX_LEN + n;
}

static void assert_same_encoding(const frame_request *req)
{
	unsigned char *fast = NULL, *plain = NULL;
	size_t nf = frame_tokens_encode_request(req, &fast);
	assert_true(nf > 0); /* the fast path was taken */
	size_t np = plain_encode(req, &plain);
	assert_int_equal(nf, np);
	assert_memory_equal(fast, plain, np);
	/* and the public encoder gives the same */
	unsigned char *pub = NULL;
	assert_int_equal(frame_encode_request(req, &pub), np);
	assert_memory_equal(pub, plain, np);
	free(fast);
	free(plain);
	free(pub);
}

static void assert_same_lookup(const K3cache__V1__Lookup *a, const K3cache__V1__Lookup *b)
{
	assert_int_equal(a->n_tokens, b->n_tokens);
	if (a->n_tokens)
		assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof(uint32_t));
	assert_int_equal(a->model.len, b->model.len);
	if (a->model.len)
		assert_memory_equal(a->model.data, b->model.data, a->model.len);
	assert_int_equal(a->salt.len, b->salt.len);
	if (a->salt.len)
		assert_memory_equal(a->salt.data, b->salt.data, a->salt.len);
	assert_int_equal(a->limit, b->limit);
	assert_int_equal(a->restore, b->restore);
}

static void assert_same_publish(const K3cache__V1__Publish *a, const K3cache__V1__Publish *b)
{
	assert_int_equal(a->n_tokens, b->n_tokens);
	if (a->n_tokens)
		assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof(uint32_t));
	assert_int_equal(a->model.len, b->model.len);
	assert_int_equal(a->salt.len, b->salt.len);
	if (a->salt.len)
		assert_memory_equal(a->salt.data, b->salt.data, a->salt.len);
	assert_int_equal(a->n_layers, b->n_layers);
	for (size_t i = 0; i < a->n_layers; i++) {
		assert_int_equal(a->layers[i]->index, b->layers[i]->index);
		assert_int_equal(a->layers[i]->size, b->layers[i]->size);
		assert_int_equal(a->layers[i]->xxh3, b->layers[i]->xxh3);
	}
}

/* Decodes header both ways; fast says whether the fast path must apply. */
static void assert_same_decoding(const unsigned char *header, size_t len, int fast)
{
	frame_request *f = frame_tokens_decode_request(header, len, NULL);
	frame_request *p = k3cache__v1__request__unpack(NULL, len, header);
	if (!fast) {
		assert_null(f);
		frame_request_free(p);
		return;
	}
	assert_non_null(f);
	assert_non_null(p);
	assert_int_equal(f->id, p->id);
	assert_int_equal(f->payload_len, p->payload_len);
	assert_int_equal(f->op_case, p->op_case);
	if (p->op_case == K3CACHE__V1__REQUEST__OP_LOOKUP)
		assert_same_lookup(f->lookup, p->lookup);
	else
		assert_same_publish(f->publish, p->publish);
	frame_request_free(f);
	frame_request_free(p);
}

/* Both checks on req; returns its frame (the caller frees it). */
static unsigned char *assert_round_trip(const frame_request *req, size_t *n)
{
	assert_same_encoding(req);
	unsigned char *buf;
	*n = frame_encode_request(req, &buf);
	assert_same_decoding(buf + FRAME_PREFIX_LEN, *n - FRAME_PREFIX_LEN, 1);
	return buf;
}

static void test_lookup_round_trips(void **state)
{
	(void)state;
	static const size_t counts[] = {256, 257, 1000, 131072};
	uint8_t fp[32], salt[5] = {1, 2, 3, 4, 5};
	memset(fp, 0xab, sizeof(fp));
	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		for (int variant = 0; variant < 4; variant++) {
			uint32_t *t = make_tokens(counts[c], (uint32_t)(c * 7 + (size_t)variant),
			                          variant == 1 ? 200000u : 0u);
			K3cache__V1__Lookup lk = K3CACHE__V1__LOOKUP__INIT;
			lk.model.data = fp;
			lk.model.len = sizeof(fp);
			if (variant & 1) {
				lk.salt.data = salt;
				lk.salt.len = sizeof(salt);
			}
			lk.tokens = t;
			lk.n_tokens = counts[c];
			lk.limit = variant >= 2 ? (uint32_t)counts[c] - 1 : 0;
			lk.restore = variant == 3;
			frame_request req = K3CACHE__V1__REQUEST__INIT;
			req.id = 1000 + (uint64_t)variant;
			req.op_case = K3CACHE__V1__REQUEST__OP_LOOKUP;
			req.lookup = &lk;
			size_t n;
			unsigned char *buf = assert_round_trip(&req, &n);
			/* through the public decoder: the same tokens */
			struct status st;
			frame_request *d = frame_decode_request(buf + FRAME_PREFIX_LEN,
			                                        n - FRAME_PREFIX_LEN, &st);
			assert_non_null(d);
			assert_int_equal(d->lookup->n_tokens, counts[c]);
			assert_memory_equal(d->lookup->tokens, t, counts[c] * sizeof(uint32_t));
			frame_request_free(d);
			free(buf);
			free(t);
		}
	}
}

static void test_publish_round_trips(void **state)
{
	(void)state;
	uint8_t fp[32] = {7};
	uint32_t *t = make_tokens(4096, 99, 0);
	K3cache__V1__LayerRef refs[3], *rp[3];
	for (int i = 0; i < 3; i++) {
		k3cache__v1__layer_ref__init(&refs[i]);
		refs[i].index = (uint32_t)i;
		refs[i].size = 1000u + (uint64_t)i;
		refs[i].xxh3 = 0x1234567890abcdefu + (uint64_t)i;
		rp[i] = &refs[i];
	}
	K3cache__V1__Publish pub = K3CACHE__V1__PUBLISH__INIT;
	pub.model.data = fp;
	pub.model.len = sizeof(fp);
	pub.tokens = t;
	pub.n_tokens = 4096;
	pub.layers = rp;
	pub.n_layers = 3;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.id = 5;
	req.payload_len = 3003;
	req.op_case = K3CACHE__V1__REQUEST__OP_PUBLISH;
	req.publish = &pub;
	size_t n;
	free(assert_round_trip(&req, &n));
	free(t);
}

/* A prompt whose header would pass the 16 MiB limit encodes to nothing, on
 * the fast path and through frame_encode_request(). */
static void test_over_header_limit_encodes_nothing(void **state)
{
	(void)state;
	const size_t n = 4u << 20; /* 5-byte varints: ~20 MiB */
	uint32_t *t = malloc(n * sizeof(*t));
	for (size_t i = 0; i < n; i++)
		t[i] = 0xF0000000u + (uint32_t)i;
	K3cache__V1__Lookup lk = K3CACHE__V1__LOOKUP__INIT;
	lk.tokens = t;
	lk.n_tokens = n;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lk;
	unsigned char *out = NULL;
	assert_int_equal(frame_tokens_encode_request(&req, &out), 0);
	assert_int_equal(frame_encode_request(&req, &out), 0);
	assert_null(out);
	/* just under the limit it still encodes */
	lk.n_tokens = (FRAME_MAX_HEADER - 64u) / 5u;
	size_t len = frame_tokens_encode_request(&req, &out);
	assert_true(len > FRAME_PREFIX_LEN && len <= FRAME_PREFIX_LEN + FRAME_MAX_HEADER);
	free(out);
	free(t);
}

static void test_small_requests_use_protobuf_c(void **state)
{
	(void)state;
	uint32_t t[FRAME_TOKENS_FAST_MIN - 1] = {0};
	K3cache__V1__Lookup lk = K3CACHE__V1__LOOKUP__INIT;
	lk.tokens = t;
	lk.n_tokens = FRAME_TOKENS_FAST_MIN - 1;
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_LOOKUP;
	req.lookup = &lk;
	unsigned char *out = NULL;
	assert_int_equal(frame_tokens_encode_request(&req, &out), 0);
	unsigned char *buf;
	size_t n = frame_encode_request(&req, &buf);
	assert_same_decoding(buf + FRAME_PREFIX_LEN, n - FRAME_PREFIX_LEN, 0);
	free(buf);
}

/* Hand-built headers: Request{ lookup (13) { ... } } */
static size_t put_varint(unsigned char *p, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80u) {
		p[n++] = (unsigned char)(v | 0x80u);
		v >>= 7;
	}
	p[n++] = (unsigned char)v;
	return n;
}

/* v as a varint of exactly width bytes (overlong when v needs fewer) */
static size_t put_varint_wide(unsigned char *p, uint64_t v, size_t width)
{
	for (size_t i = 0; i + 1 < width; i++) {
		p[i] = (unsigned char)((v & 0x7fu) | 0x80u);
		v >>= 7;
	}
	p[width - 1] = (unsigned char)v;
	return width;
}

static size_t wrap_lookup(unsigned char *out, const unsigned char *sub, size_t sub_len)
{
	size_t n = 0;
	out[n++] = 13u << 3 | 2u;
	n += put_varint(out + n, sub_len);
	memcpy(out + n, sub, sub_len);
	return n + sub_len;
}

/* Appends field 3, packed, holding n varints: i for i < n, except odd at
 * position n / 2 (when odd_value is not 0); cut: the last byte keeps its
 * continuation bit. Returns the new length. */
static size_t put_packed(unsigned char *sub, size_t s, uint32_t n, uint32_t base,
                         uint64_t odd_value, int cut)
{
	unsigned char *tmp = malloc((size_t)n * 10u);
	size_t t = 0;
	for (uint32_t i = 0; i < n; i++)
		t += put_varint(tmp + t, odd_value && i == n / 2 ? odd_value : (uint64_t)base + i);
	if (cut)
		tmp[t - 1] |= 0x80u;
	sub[s++] = 3u << 3 | 2u;
	s += put_varint(sub + s, t);
	memcpy(sub + s, tmp, t);
	free(tmp);
	return s + t;
}

static void test_unusual_forms_fall_back(void **state)
{
	(void)state;
	enum { N = 600 };
	unsigned char *sub = malloc((size_t)N * 32u), *hdr = malloc((size_t)N * 32u + 32u);
	size_t s, h;
	struct status st;

	/* the same tokens unpacked (one tag per token): protobuf-c's job */
	s = 0;
	for (uint32_t i = 0; i < N; i++) {
		sub[s++] = 3u << 3 | 0u;
		s += put_varint(sub + s, (uint64_t)i * 1000u);
	}
	h = wrap_lookup(hdr, sub, s);
	assert_same_decoding(hdr, h, 0);

	/* packed, but twice (protobuf-c concatenates them) */
	s = put_packed(sub, put_packed(sub, 0, N, 0, 0, 0), N, 0, 0, 0);
	h = wrap_lookup(hdr, sub, s);
	assert_same_decoding(hdr, h, 0);
	frame_request *p = k3cache__v1__request__unpack(NULL, h, hdr);
	assert_non_null(p);
	assert_int_equal(p->lookup->n_tokens, 2 * N);
	frame_request_free(p);

	/* a token of over 32 bits (protobuf-c truncates it), and one of 6 bytes */
	h = wrap_lookup(hdr, sub, put_packed(sub, 0, N, 0, 1ull << 33, 0));
	assert_same_decoding(hdr, h, 0);
	h = wrap_lookup(hdr, sub, put_packed(sub, 0, N, 0, 1ull << 36, 0));
	assert_same_decoding(hdr, h, 0);

	/* a last varint cut short: invalid for both */
	h = wrap_lookup(hdr, sub, put_packed(sub, 0, N, 300, 0, 1));
	assert_null(frame_tokens_decode_request(hdr, h, NULL));
	assert_null(frame_decode_request(hdr, h, &st));

	/* two op fields: protobuf-c keeps the last, a Hello */
	h = wrap_lookup(hdr, sub, put_packed(sub, 0, N, 0, 0, 0));
	hdr[h++] = 10u << 3 | 2u; /* hello {} */
	hdr[h++] = 0;
	assert_null(frame_tokens_decode_request(hdr, h, NULL));
	frame_request *r = frame_decode_request(hdr, h, &st);
	assert_non_null(r);
	assert_int_equal(r->op_case, K3CACHE__V1__REQUEST__OP_HELLO);
	frame_request_free(r);

	/* overlong encodings of the bytes the fast path would remove or rewrite:
	 * over 5 bytes protobuf-c refuses the header, so it must decide */
	for (int where = 0; where < 3; where++) {
		for (size_t width = 3; width <= 6; width += 3) {
			size_t t = put_packed(sub, 0, N, 300, 0, 0);
			unsigned char *wide = malloc(t + 16);
			size_t w = 0;
			if (where == 0) { /* the tokens tag */
				w += put_varint_wide(wide + w, 3u << 3 | 2u, width);
				memcpy(wide + w, sub + 1, t - 1);
				w += t - 1;
			} else if (where == 1) { /* the tokens length */
				const unsigned char *q = sub + 1;
				uint64_t len = 0;
				size_t lb = 0;
				do
					len |= (uint64_t)(q[lb] & 0x7fu) << (7 * lb);
				while (q[lb++] & 0x80u);
				wide[w++] = sub[0];
				w += put_varint_wide(wide + w, len, width);
				memcpy(wide + w, q + lb, (size_t)len);
				w += (size_t)len;
			} else { /* the Lookup's own length */
				memcpy(wide, sub, t);
				w = t;
			}
			h = 0;
			hdr[h++] = 13u << 3 | 2u;
			h += where == 2 ? put_varint_wide(hdr + h, w, width)
			                : put_varint(hdr + h, w);
			memcpy(hdr + h, wide, w);
			h += w;
			free(wide);
			assert_null(frame_tokens_decode_request(hdr, h, NULL));
			frame_request *pc = k3cache__v1__request__unpack(NULL, h, hdr);
			frame_request *mine = frame_decode_request(hdr, h, &st);
			assert_true((pc == NULL) == (mine == NULL));
			if (width > 5)
				assert_null(mine); /* protobuf-c's verdict, not a tidied copy's */
			else
				assert_int_equal(mine->lookup->n_tokens, N);
			frame_request_free(pc);
			frame_request_free(mine);
		}
	}

	/* and the plain case, built by hand, takes the fast path */
	h = wrap_lookup(hdr, sub, put_packed(sub, 0, N, 100000, 0, 0));
	assert_same_decoding(hdr, h, 1);
	free(sub);
	free(hdr);
}

/* The op table is the proto's: every case of the Request's op oneof has
 * exactly one row, which ops_of() finds, with a name of its own; only a
 * publish carries a payload; a request with no op is "unknown". */
static void test_ops_table_is_the_protos(void **state)
{
	(void)state;
	const ProtobufCMessageDescriptor *d = &k3cache__v1__request__descriptor;
	unsigned cases = 0;
	for (unsigned f = 0; f < d->n_fields; f++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[f];
		if (!(fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ||
		    fd->quantifier_offset != offsetof(frame_request, op_case))
			continue;
		cases++;
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		req.op_case = (K3cache__V1__Request__OpCase)fd->id;
		enum ops_id id = ops_of(&req);
		if (id == OPS_UNKNOWN)
			fail_msg("the proto's op %s (field %u) has no row in ops.h", fd->name,
			         fd->id);
		assert_int_equal(ops_table[id].op_case, (int)fd->id);
		assert_string_equal(ops_name(&req), fd->name);
		assert_int_equal(ops_table[id].payload, id == OPS_PUBLISH);
	}
	assert_int_equal(cases, OPS_UNKNOWN); /* no row the proto lacks */
	for (int i = 0; i < OPS_N; i++)
		for (int j = i + 1; j < OPS_N; j++)
			assert_string_not_equal(ops_table[i].name, ops_table[j].name);
	frame_request none = K3CACHE__V1__REQUEST__INIT;
	assert_int_equal(ops_of(&none), OPS_UNKNOWN);
	assert_string_equal(ops_name(&none), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_ops_table_is_the_protos),
	        cmocka_unit_test(test_lookup_round_trips),
	        cmocka_unit_test(test_publish_round_trips),
	        cmocka_unit_test(test_small_requests_use_protobuf_c),
	        cmocka_unit_test(test_over_header_limit_encodes_nothing),
	        cmocka_unit_test(test_unusual_forms_fall_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
