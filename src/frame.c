#include "frame.h"
#include "ops.h"

#include <stdint.h>
#include <stdlib.h>

#include "frame_tokens.h"

uint32_t frame_get_len(const unsigned char p[FRAME_PREFIX_LEN])
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void frame_put_len(unsigned char p[FRAME_PREFIX_LEN], uint32_t len)
{
	p[0] = (unsigned char)len;
	p[1] = (unsigned char)(len >> 8);
	p[2] = (unsigned char)(len >> 16);
	p[3] = (unsigned char)(len >> 24);
}

enum status_code frame_check_header_len(uint32_t len, struct status *st)
{
	if (len == 0)
		return status_set(st, STATUS_INVALID, "frame header_len is 0: not a k3cache frame");
	if (len > FRAME_MAX_HEADER)
		return status_set(st, STATUS_TOO_LARGE,
		                  "frame header_len %u is over the 16 MiB limit", len);
	return STATUS_OK;
}

/* protobuf-c's unpack answers NULL both for bytes it refuses and for memory
 * it could not get: this allocator (malloc and free, so that what it gives
 * is freed as usual) tells the two apart, and refuses to give more than
 * `left` bytes in all (a header is decoded within FRAME_DECODE_RATIO times
 * its length). */
struct watch {
	int failed, over;
	size_t left;
};

static void *watch_alloc(void *data, size_t size)
{
	struct watch *w = data;
	if (size > w->left) {
		w->over = 1;
		return NULL;
	}
	void *p = malloc(size);
	if (!p)
		w->failed = 1;
	else
		w->left -= size;
	return p;
}

static void watch_free(void *data, void *p)
{
	(void)data;
	free(p);
}

size_t frame_decode_budget(size_t len)
{
	return (size_t)FRAME_DECODE_FLOOR + (size_t)FRAME_DECODE_RATIO * len;
}

frame_request *frame_decode_request(const void *header, size_t len, struct status *st)
{
	struct watch w = {.left = frame_decode_budget(len)};
	ProtobufCAllocator a = {watch_alloc, watch_free, &w};
	frame_request *req = frame_tokens_decode_request(header, len, &a);
	if (req)
		return req;
	if (!w.over) { /* the fast path did not apply: protobuf-c, within the same budget */
		w = (struct watch){.left = frame_decode_budget(len)};
		req = k3cache__v1__request__unpack(&a, len, header);
	}
	if (!req && w.over)
		status_set(st, STATUS_TOO_LARGE,
		           "the frame header of %zu bytes decodes to more than %zu bytes (%u "
		           "times its length): too many list entries for their size",
		           len, frame_decode_budget(len), FRAME_DECODE_RATIO);
	else if (!req && w.failed)
		status_set(st, STATUS_INTERNAL, "out of memory decoding the frame header");
	else if (!req)
		status_set(st, STATUS_INVALID, "the frame header is not a valid Request message");
	return req;
}

void frame_request_free(frame_request *req)
{
	if (req)
		k3cache__v1__request__free_unpacked(req, NULL);
}

frame_response *frame_decode_response(const void *header, size_t len, struct status *st)
{
	struct watch w = {.left = SIZE_MAX};
	ProtobufCAllocator a = {watch_alloc, watch_free, &w};
	frame_response *r = k3cache__v1__response__unpack(&a, len, header);
	if (!r && w.failed)
		status_set(st, STATUS_INTERNAL, "out of memory decoding the answer's header");
	else if (!r)
		status_set(st, STATUS_INVALID, "the frame header is not a valid Response message");
	return r;
}

void frame_response_free(frame_response *resp)
{
	if (resp)
		k3cache__v1__response__free_unpacked(resp, NULL);
}

static size_t encode(size_t packed, const ProtobufCMessage *msg, unsigned char **out)
{
	if (packed > FRAME_MAX_HEADER)
		return 0;
	unsigned char *b = malloc(FRAME_PREFIX_LEN + packed);
	if (!b)
		return 0;
	frame_put_len(b, (uint32_t)packed);
	protobuf_c_message_pack(msg, b + FRAME_PREFIX_LEN);
	*out = b;
	return FRAME_PREFIX_LEN + packed;
}

size_t frame_encode_request(const frame_request *req, unsigned char **out)
{
	size_t n = frame_tokens_encode_request(req, out);
	if (n)
		return n;
	return encode(k3cache__v1__request__get_packed_size(req), &req->base, out);
}

size_t frame_encode_response(const frame_response *resp, unsigned char **out)
{
	return encode(k3cache__v1__response__get_packed_size(resp), &resp->base, out);
}

int frame_response_too_large(const frame_response *resp)
{
	return k3cache__v1__response__get_packed_size(resp) > FRAME_MAX_HEADER;
}

static int bad_len(const ProtobufCBinaryData *b, int optional)
{
	return !(b->len == FRAME_KEY_LEN || (optional && b->len == 0));
}

enum status_code frame_check_request(const frame_request *req, uint64_t max_payload,
                                     struct status *st)
{
	if (req->payload_len > max_payload)
		return status_set(
		        st, STATUS_TOO_LARGE,
		        "payload of %llu bytes is over this daemon's --max-payload (%llu)",
		        (unsigned long long)req->payload_len, (unsigned long long)max_payload);
	if (req->op_case == K3CACHE__V1__REQUEST__OP__NOT_SET)
		return status_set(st, STATUS_UNSUPPORTED,
		                  "unknown or missing op (this daemon speaks protocol 1)");
	if (!ops_table[ops_of(req)].payload && req->payload_len != 0)
		return status_set(st, STATUS_INVALID, "%s takes no payload, %llu bytes were sent",
		                  ops_name(req), (unsigned long long)req->payload_len);
	switch (req->op_case) {
	case K3CACHE__V1__REQUEST__OP_PUBLISH: {
		const K3cache__V1__Publish *p = req->publish;
		if (bad_len(&p->model, 0))
			return status_set(st, STATUS_INVALID,
			                  "publish: model must be a 32-byte fingerprint");
		if (p->n_tokens == 0)
			return status_set(st, STATUS_INVALID, "publish: no tokens (P >= 1)");
		if (bad_len(&p->base_key, 1))
			return status_set(st, STATUS_INVALID,
			                  "publish: base_key must be a 32-byte entry key");
		if (p->base_rows && !p->base_key.len)
			return status_set(st, STATUS_INVALID,
			                  "publish: base_rows without a base_key");
		if (p->base_rows > p->n_tokens)
			return status_set(st, STATUS_INVALID,
			                  "publish: base_rows %u is past the snapshot's %zu tokens",
			                  p->base_rows, p->n_tokens);
		uint64_t sum = 0;
		for (size_t i = 0; i < p->n_layers; i++) {
			if (p->layers[i]->index != i)
				return status_set(
				        st, STATUS_INVALID,
				        "publish: layer list entry %zu has index %u; every layer, "
				        "once, in index order",
				        i, p->layers[i]->index);
			if (p->layers[i]->size > max_payload)
				return status_set(st, STATUS_INVALID,
				                  "publish: layer %zu is too large", i);
			sum += p->layers[i]->size;
		}
		if (sum != req->payload_len)
			return status_set(
			        st, STATUS_INVALID,
			        "publish: the layer list adds up to %llu bytes, payload_len says "
			        "%llu",
			        (unsigned long long)sum, (unsigned long long)req->payload_len);
		return STATUS_OK;
	}
	case K3CACHE__V1__REQUEST__OP_LOOKUP:
		if (bad_len(&req->lookup->model, 0))
			return status_set(st, STATUS_INVALID,
			                  "lookup: model must be a 32-byte fingerprint");
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_REPORT: {
		const K3cache__V1__Report *r = req->report;
		if (r->n_used + r->n_damaged > FRAME_REPORT_MAX)
			return status_set(st, STATUS_INVALID,
			                  "report: %zu keys; at most %u in one report",
			                  r->n_used + r->n_damaged, FRAME_REPORT_MAX);
		for (size_t i = 0; i < r->n_used + r->n_damaged; i++)
			if ((i < r->n_used ? r->used[i] : r->damaged[i - r->n_used]).len != 32)
				return status_set(st, STATUS_INVALID,
				                  "report: every key must be 32 bytes");
		return STATUS_OK;
	}
	case K3CACHE__V1__REQUEST__OP_RESTORE:
		if (bad_len(&req->restore->key, 0))
			return status_set(st, STATUS_INVALID, "restore: key must be 32 bytes");
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_INSPECT:
		if (bad_len(&req->inspect->key, 0))
			return status_set(st, STATUS_INVALID, "inspect: key must be 32 bytes");
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_LIST:
		if (bad_len(&req->list->model, 1) || bad_len(&req->list->after, 1))
			return status_set(st, STATUS_INVALID,
			                  "list: model and after must be 32 bytes");
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_EVICT:
		for (size_t i = 0; i < req->evict->n_keys; i++)
			if (bad_len(&req->evict->keys[i], 0))
				return status_set(st, STATUS_INVALID,
				                  "evict: keys must be 32 bytes");
		if (bad_len(&req->evict->model, 1))
			return status_set(st, STATUS_INVALID, "evict: model must be 32 bytes");
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_PUT_MODEL:
		if (!req->put_model->model)
			return status_set(st, STATUS_INVALID, "put_model: no model spec");
		return STATUS_OK;
	default:
		return STATUS_OK;
	}
}
