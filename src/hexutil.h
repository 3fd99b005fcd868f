/* hexutil: lower-case hex encoding of hashes and keys, and parsing it back. */
#ifndef K3_HEXUTIL_H
#define K3_HEXUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Writes 2*len hex digits and a NUL to out. */
void hexutil_encode(const uint8_t *bytes, size_t len, char *out);

/* Parses exactly 2*len hex digits (either case). Returns 0, or -1 when s is
 * not that. */
int hexutil_decode(const char *s, uint8_t *out, size_t len);

#endif
