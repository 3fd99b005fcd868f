/* frame: the wire framing (contract: DESIGN.md "Wire protocol").
 *
 *   u32 LE header_len | header | payload
 *
 * The header is a protobuf Request or Response (proto/k3cache.proto) whose
 * payload_len says how many raw bytes follow. This module checks and decodes
 * frames held in memory; it knows nothing of sockets. */
#ifndef K3_FRAME_H
#define K3_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "k3cache.pb-c.h"
#include "status.h"

#define FRAME_PREFIX_LEN 4u
#define FRAME_MAX_HEADER (16u << 20)
#define FRAME_KEY_LEN    32u
#define FRAME_REPORT_MAX 4096u /* keys in one Report */

typedef K3cache__V1__Request frame_request;
typedef K3cache__V1__Response frame_response;

/* Reads the u32 LE length prefix. */
uint32_t frame_get_len(const unsigned char prefix[FRAME_PREFIX_LEN]);
void frame_put_len(unsigned char prefix[FRAME_PREFIX_LEN], uint32_t len);

/* Checks a header length: 0 is INVALID, over FRAME_MAX_HEADER is TOO_LARGE.
 * Either way the stream cannot be trusted past it. */
enum status_code frame_check_header_len(uint32_t len, struct status *st);

/* A header's decoded request (its structs, lists and bytes, but the fast
 * path's token array, 4 bytes a token) is allowed at most
 * frame_decode_budget(len) = FRAME_DECODE_FLOOR + FRAME_DECODE_RATIO * len
 * bytes: a list of empty entries (2 bytes each on the wire, a 72-byte
 * struct and pointer each decoded) would otherwise make a 16 MiB header
 * hundreds of MiB. Real headers stay well under it (a layer ref of ~20
 * bytes decodes to 72, a token to 4). */
#define FRAME_DECODE_RATIO 8u
#define FRAME_DECODE_FLOOR (1u << 20)
size_t frame_decode_budget(size_t len);

/* Decodes a Request header. NULL with INVALID when it is not valid protobuf,
 * TOO_LARGE when it decodes to more than frame_decode_budget(len) (either
 * way the stream cannot be trusted: close it). Free with
 * frame_request_free(). */
frame_request *frame_decode_request(const void *header, size_t len, struct status *st);
void frame_request_free(frame_request *req);

/* Checks what a decoded request says before its payload is read:
 *  TOO_LARGE   payload_len over max_payload (close the connection);
 *  UNSUPPORTED no op set (an unknown op);
 *  INVALID     a field of the wrong size, a payload on an op that takes none,
 *              or a Publish whose layer list disagrees with payload_len.
 * For anything but TOO_LARGE the payload can still be skipped and the
 * connection kept. */
enum status_code frame_check_request(const frame_request *req, uint64_t max_payload,
                                     struct status *st);

/* Decodes a Response header (the client side). NULL when not valid protobuf. */
frame_response *frame_decode_response(const void *header, size_t len, struct status *st);
void frame_response_free(frame_response *resp);

/* Encodes prefix + header of a message into a malloc'd buffer; returns its
 * length (0 on allocation failure). */
size_t frame_encode_request(const frame_request *req, unsigned char **out);
size_t frame_encode_response(const frame_response *resp, unsigned char **out);
/* 1 when resp's header is over FRAME_MAX_HEADER (so that it cannot be
 * encoded whatever the memory). */
int frame_response_too_large(const frame_response *resp);

#endif
