/* service: the store's read and admin operations as Request -> Response, with
 * no sockets. The daemon answers with them; k3cachectl --db calls them on a
 * store it opened read-only, so both print from the same answers. */
#ifndef K3_SERVICE_H
#define K3_SERVICE_H

#include "frame.h"
#include "model.h"
#include "store.h"

/* Model specs between the wire and model.h. */
struct k3cache_model *service_spec_from_wire(const K3cache__V1__ModelSpec *w, char *err);
K3cache__V1__ModelSpec *service_spec_to_wire(const struct k3cache_model *m);
void service_free_spec(K3cache__V1__ModelSpec *w);

/* Each fills resp's code, message and results; what they allocate is freed by
 * service_response_clear(). resp must start as K3CACHE__V1__RESPONSE__INIT
 * (its id is left alone). */
void service_put_model(struct store *s, const K3cache__V1__PutModel *op, frame_response *resp);
void service_list(struct store *s, const K3cache__V1__List *op, frame_response *resp);
void service_inspect(struct store *s, const K3cache__V1__Inspect *op, frame_response *resp);
void service_resolve(struct store *s, const K3cache__V1__Resolve *op, frame_response *resp);
void service_list_models(struct store *s, frame_response *resp);
void service_evict(struct store *s, const K3cache__V1__Evict *op, frame_response *resp);
void service_verify(struct store *s, frame_response *resp);
/* The same in steps: each call checks about `budget` bytes of entries
 * (store_verify_step), *walk holding its place between calls (NULL at
 * first). 1: call again; 0: resp is complete and *walk freed. */
int service_verify_step(struct store *s, struct store_verify **walk, uint64_t budget,
                        frame_response *resp);
/* Appends the store's counters (entries, bytes, hits, ...). */
void service_store_counters(struct store *s, frame_response *resp);
void service_add_counter(frame_response *resp, const char *name, uint64_t value);

/* Sets code and a copy of the message. */
void service_fail(frame_response *resp, const struct status *st);
void service_response_clear(frame_response *resp);

#endif
