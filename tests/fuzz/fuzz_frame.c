/* libFuzzer target: the frame decoder on an untrusted byte stream, as the
 * daemon reads it: length prefix, header limits, Request decoding, the checks
 * made before a payload is read, then the payload skipped; repeated until the
 * bytes run out. Also decodes the same bytes as a Response (the client side).
 * Properties beyond "no crash, no sanitizer report": a rejected frame always
 * has a message; a request that passes the checks names a known op. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

#define MAX_PAYLOAD (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
		if (code == STATUS_OK && !strcmp(frame_op_name(req), "unknown"))
			abort();
		(void)frame_op_name(req);
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
