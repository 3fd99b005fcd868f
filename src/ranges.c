/* ranges: whether pieces of caller memory overlap (ranges.h). */
#include "ranges.h"

#include <stdlib.h>

static int by_start(const void *x, const void *y)
{
	const struct ranges_span *a = x, *b = y;
	return a->start < b->start ? -1 : a->start > b->start;
}

int ranges_overlap(struct ranges_span *spans, size_t n, const struct ranges_span **a,
                   const struct ranges_span **b)
{
	qsort(spans, n, sizeof(*spans), by_start);
	const struct ranges_span *last = NULL; /* the non-empty span reaching furthest */
	uintptr_t last_end = 0;                /* its last byte */
	for (size_t i = 0; i < n; i++) {
		const struct ranges_span *s = &spans[i];
		if (s->len == 0)
			continue;
		if (s->len - 1 > UINTPTR_MAX - s->start) {
			*a = *b = s;
			return 1;
		}
		uintptr_t end = s->start + (uintptr_t)(s->len - 1);
		if (last && s->start <= last_end) {
			*a = last;
			*b = s;
			return 1;
		}
		if (!last || end > last_end) {
			last = s;
			last_end = end;
		}
	}
	return 0;
}
