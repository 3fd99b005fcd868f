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

/* Answers req when it needs only the store: put_model, list, inspect,
 * resolve, list_models, evict, verify. Fills resp's code, message and
 * results and returns 1; returns 0, resp untouched, for an op that needs
 * more (a connection, a payload, a daemon's counters). What it allocates is
 * freed by service_response_clear(). resp must start as
 * K3CACHE__V1__RESPONSE__INIT (its id is left alone). */
int service_dispatch(struct store *s, const frame_request *req, frame_response *resp);
/* A verify in steps (the daemon's): each call checks about `budget` bytes
 * of entries (store_verify_step), *walk holding its place between calls
 * (NULL at first). 1: call again; 0: resp is complete and *walk freed. */
int service_verify_step(struct store *s, struct store_verify **walk, uint64_t budget,
                        frame_response *resp);
/* Appends the store's counters (entries, bytes, hits, ...). */
void service_store_counters(struct store *s, frame_response *resp);
void service_add_counter(frame_response *resp, const char *name, uint64_t value);

/* Sets code and a copy of the message. */
void service_fail(frame_response *resp, const struct status *st);
void service_response_clear(frame_response *resp);

#endif
