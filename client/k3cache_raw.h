/* k3cache_raw: the raw request calls of libk3cache, for the project's own
 * tools (k3cachectl). Not installed and not exported by libk3cache.so: the
 * request and response are the protobuf-c types of proto/k3cache.proto
 * (frame.h), which are not part of the public API. */
#ifndef K3CACHE_RAW_H
#define K3CACHE_RAW_H

#include "k3cache/k3cache.h"

/* Sends a request header (no payload) and returns the decoded response, which
 * the caller frees with k3cache_response_free(). A daemon error answer is
 * returned as a response with its code, and the function returns 0. */
struct K3cache__V1__Request;
struct K3cache__V1__Response;
int k3cache_call(struct k3cache *c, struct K3cache__V1__Request *req,
                 struct K3cache__V1__Response **resp, struct k3cache_error *err);
void k3cache_response_free(struct K3cache__V1__Response *resp);

/* k3cache_connect with timeout_ms (k3cache_set_timeout's, 0: none) from the
 * start: the connect (a Unix socket waits while the daemon's listen queue
 * is full; a TCP one for the handshake) and a Hello with a token wait at
 * most that, where k3cache_connect's wait its default 60 s. */
int k3cache_connect_within(const char *addr, int timeout_ms, struct k3cache **out,
                           struct k3cache_error *err);

/* The namespace the daemon puts before this peer's salts (a Hello, once per
 * connection): *len bytes into out, which holds cap. */
int k3cache_namespace(struct k3cache *c, unsigned char *out, size_t cap, size_t *len,
                      struct k3cache_error *err);

/* The daemon's store file, as its Hello said (after k3cache_namespace):
 * st_dev and st_ino of its data.mdb, both 0 when it did not say. */
void k3cache_store_file(const struct k3cache *c, uint64_t *dev, uint64_t *ino);

/* Checks a lookup's arguments as k3cache_lookup does (the fingerprint, and
 * a salt or tokens NULL with a length): 0, or INVALID saying which. */
int k3cache_lookup_args(const uint8_t *fp, const void *salt, size_t salt_len,
                        const uint32_t *tokens, uint32_t n_tokens, struct k3cache_error *err);

/* Checks a restore's arrays against the model at P = p: each array present
 * and long enough for its floats, and no two sharing a byte of what the
 * restore writes (the message names the layers and arrays). */
struct k3cache_arrays_out;
int k3cache_arrays_fit(const struct k3cache_model *model, uint32_t p,
                       const struct k3cache_arrays_out *a, struct k3cache_error *err);
/* Checks that no two of a restore's buffers share a byte of what it writes
 * there: layer i's blob at P = p, model_layer_blob_size bytes at bufs[i]. */
int k3cache_bufs_apart(const struct k3cache_model *model, uint32_t p, void *const *bufs,
                       struct k3cache_error *err);

/* Calls fn(bytes, ctx) each time a request's bytes (header and payload) go
 * out, with the bytes of that send: k3cachectl's progress for a publish the
 * library sends whole. NULL: none. */
void k3cache_set_send_progress(struct k3cache *c, void (*fn)(uint64_t bytes, void *ctx), void *ctx);

/* Reads `len` payload bytes that follow the last response into buf. */
int k3cache_read_payload(struct k3cache *c, void *buf, size_t len, struct k3cache_error *err);

#endif
