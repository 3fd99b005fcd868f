/* libFuzzer target: the frame decoder on an untrusted byte stream, as the
 * daemon reads it: length prefix, header limits, Request decoding, the checks
 * made before a payload is read, then the payload skipped; repeated until the
 * bytes run out. Also decodes the same bytes as a Response (the client side).
 * Properties beyond "no crash, no sanitizer report": a rejected frame always
 * has a message; a request that passes the checks names a known op; the
 * tokens fast path (frame_tokens.c) decodes to what protobuf-c decodes, and
 * frame_encode_request() writes what protobuf-c writes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "frame_tokens.h"
#include "ops.h"

#define MAX_PAYLOAD (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same_tokens(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
	if (na != nb || (na && memcmp(a, b, na * sizeof(*a)) != 0))
		abort();
}

static void same_bytes(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
	if (a.len != b.len || (a.len && memcmp(a.data, b.data, a.len) != 0))
		abort();
}

/* The fast path against protobuf-c on one header. */
static void check_tokens_path(const uint8_t *h, size_t len)
{
	frame_request *f = frame_tokens_decode_request(h, len, NULL);
	frame_request *p = k3cache__v1__request__unpack(NULL, len, h);
	if (f) {
		if (!p || f->id != p->id || f->payload_len != p->payload_len ||
		    f->op_case != p->op_case)
			abort();
		if (p->op_case == K3CACHE__V1__REQUEST__OP_LOOKUP) {
			const K3cache__V1__Lookup *a = f->lookup, *b = p->lookup;
			same_tokens(a->tokens, a->n_tokens, b->tokens, b->n_tokens);
			same_bytes(a->model, b->model);
			same_bytes(a->salt, b->salt);
			if (a->limit != b->limit || a->restore != b->restore)
				abort();
		} else if (p->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH) {
			const K3cache__V1__Publish *a = f->publish, *b = p->publish;
			same_tokens(a->tokens, a->n_tokens, b->tokens, b->n_tokens);
			same_bytes(a->model, b->model);
			same_bytes(a->salt, b->salt);
			if (a->n_layers != b->n_layers)
				abort();
		} else {
			abort();
		}
	}
	if (p) {
		/* re-encoded: the same bytes as protobuf-c's */
		unsigned char *mine = NULL;
		size_t n = frame_encode_request(p, &mine);
		size_t want = k3cache__v1__request__get_packed_size(p);
		if (want <= FRAME_MAX_HEADER) {
			unsigned char *theirs = malloc(want ? want : 1);
			if (!theirs)
				abort();
			k3cache__v1__request__pack(p, theirs);
			if (n != FRAME_PREFIX_LEN + want ||
			    memcmp(mine + FRAME_PREFIX_LEN, theirs, want) != 0)
				abort();
			free(theirs);
		}
		free(mine);
	}
	frame_request_free(f);
	frame_request_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t pos = 0;
	while (size - pos >= FRAME_PREFIX_LEN) {
		uint32_t hlen = frame_get_len(data + pos);
		pos += FRAME_PREFIX_LEN;
		struct status st = {0};
		if (frame_check_header_len(hlen, &st) != STATUS_OK) {
			if (!st.message[0])
				abort();
			return 0; /* the daemon closes here */
		}
		if (size - pos < hlen)
			return 0; /* waits for more */
		check_tokens_path(data + pos, hlen);
		frame_request *req = frame_decode_request(data + pos, hlen, &st);
		frame_response *resp = frame_decode_response(data + pos, hlen, NULL);
		frame_response_free(resp);
		pos += hlen;
		if (!req) {
			if (!st.message[0])
				abort();
			return 0;
		}
		enum status_code code = frame_check_request(req, MAX_PAYLOAD, &st);
		if (code != STATUS_OK && !st.message[0])
			abort();
		/* a request that passes names a known op */
		if (code == STATUS_OK && !strcmp(ops_name(req), "unknown"))
			abort();
		(void)ops_name(req);
		uint64_t plen = req->payload_len;
		frame_request_free(req);
		if (code == STATUS_TOO_LARGE)
			return 0;
		if (plen > size - pos)
			return 0;
		pos += (size_t)plen;
	}
	return 0;
}
