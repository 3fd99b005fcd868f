/* frame_tokens: the packed tokens field of Publish and Lookup without
 * protobuf-c's generic passes (see frame_tokens.h). */
#include "frame_tokens.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FIELD_PUBLISH 12u
#define FIELD_LOOKUP  13u
#define FIELD_TOKENS  3u
#define WIRE_VARINT   0u
#define WIRE_I64      1u
#define WIRE_LEN      2u
#define WIRE_I32      5u

/* ---- reading the wire format ----------------------------------------------- */

/* Reads a varint of at most 10 bytes at *p; 0 when truncated or too long. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;
	for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;
		x |= (uint64_t)(b & 0x7fu) << shift;
		if (!(b & 0x80u)) {
			*v = x;
			return 1;
		}
	}
	return 0;
}

/* One field of a message: its number, wire type, and (for WIRE_LEN) the
 * bytes it holds. *p moves past it; 0 when it cannot be read (groups are
 * not expected here either). */
struct field {
	const uint8_t *start;  /* the tag */
	const uint8_t *len_at; /* WIRE_LEN: the length varint */
	const uint8_t *data, *end;
	uint32_t number;
	uint32_t wire;
};

static int next_field(const uint8_t **p, const uint8_t *end, struct field *f)
{
	uint64_t tag, n;
	f->start = *p;
	if (!get_varint(p, end, &tag) || tag >> 3 > UINT32_MAX || (tag >> 3) == 0)
		return 0;
	f->number = (uint32_t)(tag >> 3);
	f->wire = (uint32_t)(tag & 7u);
	switch (f->wire) {
	case WIRE_VARINT:
		return get_varint(p, end, &n);
	case WIRE_I64:
		if (end - *p < 8)
			return 0;
		*p += 8;
		return 1;
	case WIRE_I32:
		if (end - *p < 4)
			return 0;
		*p += 4;
		return 1;
	case WIRE_LEN:
		f->len_at = *p;
		if (!get_varint(p, end, &n) || n > (uint64_t)(end - *p))
			return 0;
		f->data = *p;
		f->end = *p + n;
		*p += n;
		return 1;
	default:
		return 0;
	}
}

/* ---- writing ---------------------------------------------------------------- */

static size_t varint_size(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80u) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80u) {
		*p++ = (uint8_t)(v | 0x80u);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* The bytes of the packed tokens, without tag and length. */
static size_t tokens_packed_size(const uint32_t *t, size_t n)
{
	size_t bytes = n;
	for (size_t i = 0; i < n; i++) /* branch-free: the compiler vectorises it */
		bytes += (size_t)(t[i] >= (1u << 7)) + (size_t)(t[i] >= (1u << 14)) +
		         (size_t)(t[i] >= (1u << 21)) + (size_t)(t[i] >= (1u << 28));
	return bytes;
}

static uint8_t *put_tokens(uint8_t *p, const uint32_t *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p = put_varint(p, t[i]);
	return p;
}

/* ---- encoding ---------------------------------------------------------------- */

/* Points *slot and *count at the tokens of req's Publish or Lookup and
 * returns that op's Request field number; 0 for any other op. */
static uint32_t tokens_of(frame_request *req, uint32_t ***slot, size_t **count)
{
	if (req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH && req->publish) {
		*slot = &req->publish->tokens;
		*count = &req->publish->n_tokens;
		return FIELD_PUBLISH;
	}
	if (req->op_case == K3CACHE__V1__REQUEST__OP_LOOKUP && req->lookup) {
		*slot = &req->lookup->tokens;
		*count = &req->lookup->n_tokens;
		return FIELD_LOOKUP;
	}
	return 0;
}

size_t frame_tokens_encode_request(const frame_request *req, unsigned char **out)
{
	/* a shallow copy whose submessage holds no tokens */
	frame_request rq = *req;
	union {
		K3cache__V1__Publish pub;
		K3cache__V1__Lookup look;
	} sub_copy;
	if (rq.op_case == K3CACHE__V1__REQUEST__OP_PUBLISH && rq.publish) {
		sub_copy.pub = *rq.publish;
		rq.publish = &sub_copy.pub;
	} else if (rq.op_case == K3CACHE__V1__REQUEST__OP_LOOKUP && rq.lookup) {
		sub_copy.look = *rq.lookup;
		rq.lookup = &sub_copy.look;
	}
	uint32_t **slot = NULL;
	size_t *count = NULL;
	uint32_t field = tokens_of(&rq, &slot, &count);
	if (!field || *count < FRAME_TOKENS_FAST_MIN)
		return 0;
	const uint32_t *tokens = *slot;
	size_t n = *count;
	*slot = NULL;
	*count = 0;
	/* the request without its tokens, through protobuf-c */
	size_t base = k3cache__v1__request__get_packed_size(&rq);
	if (base > FRAME_MAX_HEADER)
		return 0;
	uint8_t *b = malloc(base ? base : 1);
	if (!b)
		return 0;
	protobuf_c_message_pack(&rq.base, b);

	/* find the submessage, and in it where field 3 goes */
	const uint8_t *p = b, *end = b + base;
	struct field f = {0}, sub = {0};
	while (p < end) {
		if (!next_field(&p, end, &f)) {
			free(b);
			return 0;
		}
		if (f.number == field && f.wire == WIRE_LEN)
			sub = f;
	}
	if (!sub.start) {
		free(b);
		return 0;
	}
	const uint8_t *insert = sub.end;
	for (const uint8_t *q = sub.data; q < sub.end;) {
		struct field g;
		if (!next_field(&q, sub.end, &g)) {
			free(b);
			return 0;
		}
		if (g.number > FIELD_TOKENS) {
			insert = g.start;
			break;
		}
	}

	size_t packed = tokens_packed_size(tokens, n);
	size_t tfield = 1 + varint_size(packed) + packed;
	size_t sub_len = (size_t)(sub.end - sub.data);
	size_t total = base - varint_size(sub_len) + varint_size(sub_len + tfield) + tfield;
	if (total > FRAME_MAX_HEADER) {
		free(b);
		return 0;
	}
	uint8_t *o = malloc(FRAME_PREFIX_LEN + total);
	if (!o) {
		free(b);
		return 0;
	}
	frame_put_len(o, (uint32_t)total);
	uint8_t *w = o + FRAME_PREFIX_LEN;
	memcpy(w, b, (size_t)(sub.len_at - b));
	w += sub.len_at - b;
	w = put_varint(w, sub_len + tfield);
	memcpy(w, sub.data, (size_t)(insert - sub.data));
	w += insert - sub.data;
	*w++ = (uint8_t)(FIELD_TOKENS << 3 | WIRE_LEN);
	w = put_varint(w, packed);
	w = put_tokens(w, tokens, n);
	memcpy(w, insert, (size_t)(end - insert));
	w += end - insert;
	free(b);
	*out = o;
	return (size_t)(w - o);
}

/* ---- decoding ---------------------------------------------------------------- */

/* A WIRE_LEN field whose length varint is in its shortest form. */
static int canonical(const struct field *f)
{
	return (size_t)(f->data - f->len_at) == varint_size((uint64_t)(f->end - f->data));
}

/* Decodes packed varints that are all at most 5 bytes and 32 bits, as
 * protobuf-c would; NULL otherwise (then protobuf-c decides). */
static uint32_t *get_tokens(const uint8_t *p, const uint8_t *end, size_t *n_out)
{
	size_t n = 0;
	for (const uint8_t *q = p; q < end; q++) /* each varint ends in one byte < 0x80 */
		n += !(*q & 0x80u);
	if (n == 0 || (end[-1] & 0x80u))
		return NULL;
	uint32_t *t = malloc(n * sizeof(*t));
	if (!t)
		return NULL;
	size_t i = 0;
	while (p < end) {
		uint32_t v = p[0] & 0x7fu;
		if (!(p[0] & 0x80u)) {
			p += 1;
		} else if (!(p[1] & 0x80u)) {
			v |= (uint32_t)p[1] << 7;
			p += 2;
		} else if (!(p[2] & 0x80u)) {
			v |= (uint32_t)(p[1] & 0x7fu) << 7 | (uint32_t)p[2] << 14;
			p += 3;
		} else if (!(p[3] & 0x80u)) {
			v |= (uint32_t)(p[1] & 0x7fu) << 7 | (uint32_t)(p[2] & 0x7fu) << 14 |
			     (uint32_t)p[3] << 21;
			p += 4;
		} else if (p[4] < 0x10u) {
			v |= (uint32_t)(p[1] & 0x7fu) << 7 | (uint32_t)(p[2] & 0x7fu) << 14 |
			     (uint32_t)(p[3] & 0x7fu) << 21 | (uint32_t)p[4] << 28;
			p += 5;
		} else {
			free(t); /* over 32 bits, or over 5 bytes */
			return NULL;
		}
		t[i++] = v;
	}
	*n_out = i;
	return t;
}

frame_request *frame_tokens_decode_request(const void *header, size_t len, ProtobufCAllocator *a)
{
	const uint8_t *h = header, *end = h + len, *p = h;
	struct field f, sub = {0}, tok = {0};
	int ops = 0;
	while (p < end) {
		if (!next_field(&p, end, &f))
			return NULL;
		if (f.number >= 10 && f.number < 100)
			ops++; /* an op field (a oneof member) */
		if ((f.number == FIELD_PUBLISH || f.number == FIELD_LOOKUP) && f.wire == WIRE_LEN)
			sub = f;
	}
	if (!sub.start || ops != 1)
		return NULL;
	for (const uint8_t *q = sub.data; q < sub.end;) {
		if (!next_field(&q, sub.end, &f))
			return NULL;
		if (f.number != FIELD_TOKENS)
			continue;
		if (f.wire != WIRE_LEN || tok.start)
			return NULL; /* unpacked, or more than once */
		tok = f;
	}
	if (!tok.start || (size_t)(tok.end - tok.data) < FRAME_TOKENS_FAST_MIN)
		return NULL;
	/* the bytes taken out or rewritten must be in their shortest form: an
	 * overlong tag or length that protobuf-c would refuse (over 5 bytes) must
	 * reach it, not be tidied away here */
	if (!canonical(&sub) || !canonical(&tok) || tok.len_at - tok.start != 1)
		return NULL;
	size_t n = 0;
	uint32_t *tokens = get_tokens(tok.data, tok.end, &n);
	if (!tokens)
		return NULL;

	/* the header without the tokens field, for protobuf-c */
	size_t sub_len = (size_t)(sub.end - sub.data);
	size_t tlen = (size_t)(tok.end - tok.start);
	size_t slen = len - tlen - varint_size(sub_len) + varint_size(sub_len - tlen);
	uint8_t *s = malloc(slen ? slen : 1);
	if (!s) {
		free(tokens);
		return NULL;
	}
	uint8_t *w = s;
	memcpy(w, h, (size_t)(sub.len_at - h));
	w += sub.len_at - h;
	w = put_varint(w, sub_len - tlen);
	memcpy(w, sub.data, (size_t)(tok.start - sub.data));
	w += tok.start - sub.data;
	memcpy(w, tok.end, (size_t)(end - tok.end));
	w += end - tok.end;
	frame_request *req = k3cache__v1__request__unpack(a, (size_t)(w - s), s);
	free(s);
	uint32_t **slot = NULL;
	size_t *count = NULL;
	if (!req || tokens_of(req, &slot, &count) != sub.number || *count != 0) {
		/* not what the scan said: let protobuf-c decide on the whole */
		if (req)
			k3cache__v1__request__free_unpacked(req, a);
		free(tokens);
		return NULL;
	}
	/* protobuf-c frees repeated fields with the system allocator */
	*slot = tokens;
	*count = n;
	return req;
}
