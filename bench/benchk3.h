/* Helpers for the benchmarks that talk to a daemon through libk3cache. */
#ifndef K3_BENCH_BENCHK3_H
#define K3_BENCH_BENCHK3_H

#include <stdio.h>

#include "frame.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "model.h"
#include "status.h"

/* Evicts every entry of the model (untimed, between rounds). Returns how
 * many went, or -1 with why. */
static inline long benchk3_evict_model(struct k3cache *c, const struct k3cache_model *m, char *why,
                                       size_t whysz)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict ev = K3CACHE__V1__EVICT__INIT;
	ev.model.data = (uint8_t *)m->fingerprint;
	ev.model.len = MODEL_FINGERPRINT_LEN;
	req.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	frame_response *r = NULL;
	struct k3cache_error e;
	if (k3cache_call(c, &req, &r, &e) != 0) {
		snprintf(why, whysz, "%s", e.message);
		return -1;
	}
	long n = (long)r->n_entries;
	if (r->code != 0) {
		snprintf(why, whysz, "%s: %s", status_code_name((enum status_code)r->code),
		         r->message);
		n = -1;
	}
	k3cache_response_free(r);
	return n;
}

#endif
