/* frame_tokens: a fast path for the one large field of a request header,
 * the packed `repeated uint32 tokens = 3` of Publish and Lookup.
 *
 * A 131,072-token prompt is ~380 KB of varints. protobuf-c encodes it in two
 * table-driven passes and decodes it in two more (~0.3 ms and ~0.4 ms here),
 * which made up most of a lookup's CPU time in the client and in the daemon.
 * These functions do that field with a plain varint loop and leave every
 * other field to protobuf-c:
 *
 *  - encoding packs the request without its tokens through protobuf-c and
 *    inserts the packed field where protobuf-c puts it (after fields 1 and
 *    2 of the submessage), fixing the submessage's length: the bytes are
 *    identical to protobuf-c's own (tests/unit/test_frame.c checks it);
 *  - decoding finds the field, decodes its varints, and has protobuf-c parse
 *    the header without it. Anything unusual (the field twice, unpacked
 *    tokens, a varint over 5 bytes or over 32 bits, two op fields) is left
 *    to protobuf-c whole, so the result is always protobuf-c's.
 *
 * Both return 0 (or NULL) when the fast path does not apply, and the caller
 * uses protobuf-c alone. */
#ifndef K3_FRAME_TOKENS_H
#define K3_FRAME_TOKENS_H

#include <stddef.h>

#include "frame.h"

/* Fewer tokens than this: protobuf-c alone. */
#define FRAME_TOKENS_FAST_MIN 256u

/* As frame_encode_request(); 0 when the fast path does not apply, or the
 * header would be over FRAME_MAX_HEADER (the caller's protobuf-c path then
 * finds that too). */
size_t frame_tokens_encode_request(const frame_request *req, unsigned char **out);

/* As frame_decode_request() for a valid header; NULL when the fast path does
 * not apply (including an invalid header: protobuf-c then says so). The rest
 * of the header is unpacked with allocator a (NULL: protobuf-c's default). */
frame_request *frame_tokens_decode_request(const void *header, size_t len, ProtobufCAllocator *a);

#endif
