/* t2_estimate: the wait behind the fetches ahead (t2_estimate.h). */
#include "t2_estimate.h"

uint64_t t2_ahead_ms(uint64_t queued, int busy, uint64_t ran_ms, uint64_t avg_ms)
{
	uint64_t unit = avg_ms ? avg_ms : (busy ? ran_ms : 0);
	uint64_t now = busy ? (ran_ms > avg_ms ? ran_ms : avg_ms) : 0;
	if (unit && queued > (UINT64_MAX - now) / unit)
		return UINT64_MAX;
	return queued * unit + now;
}
