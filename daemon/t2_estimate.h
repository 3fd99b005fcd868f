/* t2_estimate: how long a lookup would wait behind the fetches ahead of its
 * own, for --tier2-queue-wait (t2_search.c). Pure arithmetic, no state.
 *
 * Contract: queued fetches wait in the fetch queue; busy says one is in the
 * fetch thread's hand (or being stored), which has run ran_ms so far;
 * avg_ms is the average time of the last whole fetches, 0 before the
 * first. Each queued fetch is costed at avg_ms, or, before any fetch has
 * been measured, at the time the one under way has run (so that a fresh
 * daemon's first large fetch does not make every queued one look free);
 * the one under way at least as long as it has run. An estimate per fetch,
 * not per byte. Saturates at UINT64_MAX. */
#ifndef K3D_T2_ESTIMATE_H
#define K3D_T2_ESTIMATE_H

#include <stdint.h>

uint64_t t2_ahead_ms(uint64_t queued, int busy, uint64_t ran_ms, uint64_t avg_ms);

#endif
