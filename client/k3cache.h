/* libk3cache: the C client of k3cached.
 *
 * One connection per thread: a `struct k3cache` is not shared between threads
 * without a lock of the caller's. The library never exits, never prints, and
 * reports every failure as a code (the wire's Code values, status.h) plus a
 * message a person can act on.
 *
 * The restore path is where a wrong answer would be born, so it checks every
 * blob before the worker sees any of it: no trailing bytes, nothing truncated,
 * the tag equal to the model's mixer for that slot, shapes, seq_len == P,
 * finite values, and the XXH3 checksum bound to the layer index. The worker
 * gets either the whole validated snapshot and the position P to resume
 * prefill from, or an error and nothing. */
#ifndef K3CACHE_H
#define K3CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

#define K3CACHE_KEY_LEN  32
#define K3CACHE_PROTOCOL 1

/* Client-side failures not answered by a daemon use these codes too:
 * STATUS_INTERNAL for I/O errors; k3cache_error.unreachable marks a daemon
 * that could not be reached or went away. */
struct k3cache_error {
	enum status_code code;
	int unreachable; /* connect failed or the connection broke */
	char message[STATUS_MESSAGE_MAX];
};

struct k3cache;

/* addr: "unix:PATH", "tcp:HOST:PORT", or a plain PATH (a Unix socket). NULL:
 * $K3CACHE_SOCKET, else the default socket path (k3cache_default_socket()). */
int k3cache_connect(const char *addr, struct k3cache **out, struct k3cache_error *err);
void k3cache_close(struct k3cache *c);

/* The default socket: $K3CACHE_SOCKET; else /run/k3cache/k3cached.sock for root;
 * else $XDG_RUNTIME_DIR/k3cache/k3cached.sock; else /tmp/k3cache-UID/k3cached.sock.
 * Writes into buf and returns it. */
const char *k3cache_default_socket(char *buf, size_t bufsz);

/* I/O timeout for each call in milliseconds (default 60000; 0: none). */
void k3cache_set_timeout(struct k3cache *c, int ms);

/* Hello: checks the daemon speaks our protocol. server (may be NULL) gets the
 * daemon's name and version. */
int k3cache_hello(struct k3cache *c, char *server, size_t serversz, struct k3cache_error *err);

/* Stores a model spec (idempotent). fp (may be NULL) gets its fingerprint. */
int k3cache_put_model(struct k3cache *c, const struct model_spec *spec,
                      uint8_t fp[MODEL_FINGERPRINT_LEN], struct k3cache_error *err);

/* One blob of a publish: the bytes stay the caller's and are sent as they are
 * (writev), never gathered into one big copy. */
struct k3cache_buf {
	const void *data;
	size_t len;
};

struct k3cache_publish_result {
	uint8_t key[K3CACHE_KEY_LEN];
	int created; /* 0: the entry was stored already */
	uint64_t bytes;
	uint32_t evicted;
	uint32_t delta_rows; /* MLA rows [0, delta_rows) were not sent: the base had them */
};

/* Publishes one snapshot: blobs[i] is layer i's LayerCache blob, for every
 * layer of the model, covering tokens[0..n_tokens). The library computes each
 * layer's XXH3 (seeded with the index) and sends it, so the daemon checks the
 * bytes arrived whole. It first asks whether the daemon holds the entry
 * already (served, not quarantined): then it sends no payload and answers
 * created 0, so re-publishing earlier turns costs a round trip, not an
 * upload; the blobs are then not checked by the daemon (it holds the entry
 * of these tokens under this model and salt already). */
int k3cache_publish(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                    size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                    const struct k3cache_buf *blobs, uint32_t n_blobs,
                    struct k3cache_publish_result *res, struct k3cache_error *err);

struct k3cache_lookup_result {
	uint32_t prefix_len; /* P; 0 on a miss */
	uint32_t hint;       /* the junction: snapshot here so the next prompt hits */
	uint8_t key[K3CACHE_KEY_LEN];
	uint64_t bytes;
};

/* Longest stored prefix of the prompt with P <= limit (0: N-1). */
int k3cache_lookup(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN], const void *salt,
                   size_t salt_len, const uint32_t *tokens, uint32_t n_tokens, uint32_t limit,
                   struct k3cache_lookup_result *res, struct k3cache_error *err);

/* Publishes a snapshot of a live state that was restored from, or last
 * published as, the entry base_key of base_rows tokens (a prefix of these
 * tokens, same model and salt): the MLA layers' rows [0, base_rows) are not
 * sent; the daemon takes them from the base and checks each whole blob
 * against its XXH3, computed here from blobs, which are the whole state as
 * for k3cache_publish. When the daemon refuses the base (gone, another
 * model or salt, not a prefix, other rows), the library publishes the whole
 * snapshot by itself; res->delta_rows says which happened. A NULL base_key
 * or base_rows of 0 is a plain k3cache_publish. */
int k3cache_publish_delta(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                          const void *salt, size_t salt_len, const uint32_t *tokens,
                          uint32_t n_tokens, const struct k3cache_buf *blobs, uint32_t n_blobs,
                          const uint8_t base_key[K3CACHE_KEY_LEN], uint32_t base_rows,
                          struct k3cache_publish_result *res, struct k3cache_error *err);

/* ---- restore: validated before the caller sees anything ---- */

/* Form 1: into caller buffers. bufs[i] must hold layer i's blob
 * (model_layer_blob_size(&model->layers[i], P) bytes; a smaller buffer is an
 * error before anything is read into it). On success lens[i] is layer i's
 * size and *prefix_len is P. On any failure the buffers' contents are
 * unspecified and must not be used. */
int k3cache_restore_into(struct k3cache *c, const struct model_spec *model,
                         const uint8_t key[K3CACHE_KEY_LEN], void *const *bufs, const size_t *caps,
                         size_t *lens, uint32_t *prefix_len, struct k3cache_error *err);

/* Form 2: a callback per layer, called only after every layer has been
 * received and validated; the data is valid during the call. A non-zero
 * return stops and is returned. */
typedef int (*k3cache_layer_fn)(uint32_t index, const void *blob, size_t len, void *ctx);
int k3cache_restore_each(struct k3cache *c, const struct model_spec *model,
                         const uint8_t key[K3CACHE_KEY_LEN], k3cache_layer_fn fn, void *ctx,
                         uint32_t *prefix_len, struct k3cache_error *err);

/* Lookup and restore in one round trip (Lookup with restore): a miss returns
 * 0 with *prefix_len 0 and calls nothing. */
int k3cache_lookup_restore(struct k3cache *c, const struct model_spec *model, const void *salt,
                           size_t salt_len, const uint32_t *tokens, uint32_t n_tokens,
                           uint32_t limit, k3cache_layer_fn fn, void *ctx,
                           struct k3cache_lookup_result *res, struct k3cache_error *err);

/* ---- the seed-000 record: how much of a prompt can my live state reuse ---- */

/* The tokens a worker's live state covers, recorded where they are fed. A
 * state is tainted when it no longer equals the prefill of its tokens (an
 * aborted chunk, sampled tokens not fed back): it must not be published or
 * reused. */
struct k3cache_record {
	uint32_t *tokens;
	uint32_t n, cap;
	int tainted;
};

void k3cache_record_init(struct k3cache_record *r);
void k3cache_record_free(struct k3cache_record *r);
void k3cache_record_reset(struct k3cache_record *r);
/* Appends tokens that were fed to the state. -1 on allocation failure
 * (the record is then tainted). */
int k3cache_record_append(struct k3cache_record *r, const uint32_t *tokens, uint32_t n);
void k3cache_record_taint(struct k3cache_record *r);

/* How many leading tokens of the prompt the live state can keep: the common
 * prefix of record and prompt, capped at n_prompt - 1 so that at least one
 * token is fed to get logits. 0 when the record is NULL, empty or tainted,
 * or the prompt is NULL or empty. A return equal to the record's length
 * means "continue"; anything less means the state must be reset (a recurrent
 * state cannot be rewound) unless it is 0. */
uint32_t k3cache_record_reusable(const struct k3cache_record *r, const uint32_t *prompt,
                                 uint32_t n_prompt);

/* Publishes the live state the record describes; refuses (INVALID) a tainted
 * or empty record. */
int k3cache_publish_record(struct k3cache *c, const uint8_t fp[MODEL_FINGERPRINT_LEN],
                           const void *salt, size_t salt_len, const struct k3cache_record *r,
                           const struct k3cache_buf *blobs, uint32_t n_blobs,
                           struct k3cache_publish_result *res, struct k3cache_error *err);

/* One counter of the daemon's Stat answer, by the name `k3cachectl stat`
 * shows (hits, misses, bytes_in, ingest_yields, ...); NOT_FOUND when the
 * daemon has no such counter. */
int k3cache_stat_counter(struct k3cache *c, const char *name, uint64_t *value,
                         struct k3cache_error *err);

/* ---- raw access for tools (k3cachectl) ---- */

/* Sends a request header (no payload) and returns the decoded response, which
 * the caller frees with k3cache_response_free(). The request and response are
 * the protobuf-c types of proto/k3cache.proto (frame.h). A daemon error answer
 * is returned as a response with its code, and the function returns 0. */
struct K3cache__V1__Request;
struct K3cache__V1__Response;
int k3cache_call(struct k3cache *c, struct K3cache__V1__Request *req,
                 struct K3cache__V1__Response **resp, struct k3cache_error *err);
void k3cache_response_free(struct K3cache__V1__Response *resp);

/* Reads `len` payload bytes that follow the last response into buf. */
int k3cache_read_payload(struct k3cache *c, void *buf, size_t len, struct k3cache_error *err);

#endif
