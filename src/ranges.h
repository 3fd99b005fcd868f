/* ranges: whether pieces of caller memory overlap. A restore writes each
 * layer into the caller's own buffers (or arrays) and checks it as it lands:
 * two destinations sharing bytes would let a later layer overwrite an
 * earlier one's checked bytes, and the restore would answer OK with state
 * it never checked. So destinations are refused before a byte is written. */
#ifndef K3_RANGES_H
#define K3_RANGES_H

#include <stddef.h>
#include <stdint.h>

struct ranges_span {
	uintptr_t start;
	uint64_t len;   /* bytes; an empty span overlaps nothing */
	uint32_t layer; /* whose it is, for the message */
	uint32_t part;  /* which of the layer's pieces (0 whole or first, 1 second) */
};

/* Sorts spans[0..n) by start and returns 1 when two of them share a byte,
 * with *a and *b (a starting first) pointing at such a pair; else 0. A span
 * reaching past the end of the address space counts as overlapping
 * itself (*a == *b). */
int ranges_overlap(struct ranges_span *spans, size_t n, const struct ranges_span **a,
                   const struct ranges_span **b);

#endif
