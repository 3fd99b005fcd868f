/* libk3cache: the C client of k3cached. Installed as <k3cache/k3cache.h>,
 * with libk3cache.so.0 and libk3cache.a (pkg-config: k3cache).
 *
 * This header is self-contained: every name in it is k3cache_ or K3CACHE_,
 * and the shared library exports nothing else.
 *
 * One connection per thread: a `struct k3cache` is not shared between threads
 * without a lock of the caller's. The library never exits, never aborts,
 * never prints, and reports every failure as a code (the wire's Code values,
 * enum k3cache_code) plus a message a person can act on.
 *
 * Calls that return int return 0 on success and otherwise the failure's code
 * (enum k3cache_code), with *err filled when err is not NULL (k3cache_model_layer
 * and k3cache_record_append return -1 instead). Constructors return NULL on
 * failure.
 *
 * A layer's state travels as a LayerCache blob ("the seed's format"), all
 * little-endian:
 *   KDA: u8 tag=1 | u32 n | n x f32 conv      | u32 m | m x f32 recurrent
 *   MLA: u8 tag=2 | u32 P | u32 n | n x f32 k | u32 m | m x f32 v
 * with n and m the model's counts (MLA: P x k_row and P x v_row, P the
 * tokens the entry covers); k3cache_model_blob_size() gives its length. The
 * _arrays calls take and give the two float vectors only.
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

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define K3CACHE_API __attribute__((visibility("default")))
#else
#define K3CACHE_API
#endif

#define K3CACHE_KEY_LEN     32  /* an entry's key */
#define K3CACHE_FP_LEN      32  /* a model's fingerprint (SHA-256 of its spec) */
#define K3CACHE_MESSAGE_MAX 256 /* an error message, with its NUL */
#define K3CACHE_PROTOCOL    1   /* the wire protocol's version (k3cache_hello) */

/* Result codes: the wire's Code values, unchanged. */
enum k3cache_code {
	K3CACHE_OK = 0,
	K3CACHE_NOT_FOUND = 1,
	K3CACHE_INVALID = 2,
	K3CACHE_CORRUPT = 3,
	K3CACHE_UNKNOWN_MODEL = 4,
	K3CACHE_TOO_LARGE = 5,
	K3CACHE_BUSY = 6,
	K3CACHE_FULL = 7,
	K3CACHE_UNSUPPORTED = 8,
	K3CACHE_INTERNAL = 9,
	K3CACHE_DENIED = 10, /* not allowed for this peer (its uid or token) */
};

/* "OK", "NOT_FOUND", ...; "UNKNOWN" for a value not listed above. */
K3CACHE_API const char *k3cache_code_name(int code);

/* Client-side failures not answered by a daemon use these codes too:
 * K3CACHE_INTERNAL for I/O errors; k3cache_error.unreachable marks a daemon
 * that could not be reached or went away. */
struct k3cache_error {
	enum k3cache_code code;
	int unreachable; /* connect failed, or the connection is closed (it broke, the
	                  * daemon hung up, or it broke the protocol): connect again */
	char message[K3CACHE_MESSAGE_MAX];
};

/* ---- model specs ----
 * A spec is JSON: {"name", "revision", "state_layout", "layers": [...]}, each
 * layer {"mixer":"kda","conv_len":N,"recurrent_len":N} or
 * {"mixer":"mla","k_row":N,"v_row":N}. Its fingerprint is a SHA-256 over all
 * of its fields: workers share entries only when they agree on every one. */

enum k3cache_mixer {
	K3CACHE_MIXER_KDA = 1, /* a recurrent state: conv window + recurrent state */
	K3CACHE_MIXER_MLA = 2, /* a KV cache: k_row + v_row floats per token */
};

struct k3cache_layer {
	enum k3cache_mixer mixer;
	uint32_t conv_len;      /* KDA: floats in the conv window */
	uint32_t recurrent_len; /* KDA: floats in the recurrent state */
	uint32_t k_row;         /* MLA: floats of k per token */
	uint32_t v_row;         /* MLA: floats of v per token */
};

/* A validated model spec (opaque). */
struct k3cache_model;

/* From a spec's JSON text (the shared/models form), a file holding it, or
 * fields (copied). NULL on any defect, with the reason in *err (INVALID;
 * INTERNAL when out of memory). */
K3CACHE_API struct k3cache_model *k3cache_model_parse(const char *json, size_t len,
                                                      struct k3cache_error *err);
K3CACHE_API struct k3cache_model *k3cache_model_load(const char *path, struct k3cache_error *err);
K3CACHE_API struct k3cache_model *k3cache_model_new(const char *name, const char *revision,
                                                    const char *state_layout,
                                                    const struct k3cache_layer *layers,
                                                    uint32_t n_layers, struct k3cache_error *err);
K3CACHE_API void k3cache_model_free(struct k3cache_model *model);
/* The K3CACHE_FP_LEN bytes of its fingerprint, valid while the model is. */
K3CACHE_API const uint8_t *k3cache_model_fingerprint(const struct k3cache_model *model);
K3CACHE_API uint32_t k3cache_model_layers(const struct k3cache_model *model);
/* Layer i's shape; -1 when there is no such layer. */
K3CACHE_API int k3cache_model_layer(const struct k3cache_model *model, uint32_t i,
                                    struct k3cache_layer *out);
/* Bytes of layer i's blob at prefix length P (0: no such layer). */
K3CACHE_API uint64_t k3cache_model_blob_size(const struct k3cache_model *model, uint32_t i,
                                             uint32_t prefix_len);

/* ---- connections ---- */

struct k3cache;

/* addr: "unix:PATH", "tcp:HOST:PORT", or a plain PATH (a Unix socket). NULL:
 * $K3CACHE_SOCKET, else the default socket path (k3cache_default_socket()).
 * Over TCP, with $K3CACHE_TOKEN set, it sends the token in a Hello at once
 * (a daemon with --token-file answers nothing else before it) and fails
 * with DENIED when the daemon does not know it. On the Unix socket the
 * daemon knows the peer by its uid, which is its namespace: entries are
 * shared by processes of one uid (or of uids the daemon's --share-uids
 * joins), never with others. */
K3CACHE_API int k3cache_connect(const char *addr, struct k3cache **out, struct k3cache_error *err);
/* k3cache_connect, waiting at most timeout_ms (0: no limit) for the connect
 * (a TCP handshake with a host that is down or drops packets, a Unix socket
 * whose listen queue is full) and the token's Hello, where k3cache_connect
 * waits up to its default 60 s; the connection then keeps timeout_ms as
 * k3cache_set_timeout's. Host names are resolved by the system resolver,
 * which has no deadline here. */
K3CACHE_API int k3cache_connect_timeout(const char *addr, int timeout_ms, struct k3cache **out,
                                        struct k3cache_error *err);
K3CACHE_API void k3cache_close(struct k3cache *c);

/* The default socket: $K3CACHE_SOCKET; else /run/k3cache/k3cached.sock for root;
 * else this user's daemon's ($XDG_RUNTIME_DIR/k3cache/k3cached.sock, else
 * /tmp/k3cache-UID/k3cached.sock) if it exists, else the system daemon's
 * /run/k3cache/k3cached.sock if that exists, else this user's path.
 * Writes into buf and returns it. */
K3CACHE_API const char *k3cache_default_socket(char *buf, size_t bufsz);

/* Timeout in milliseconds for each wait on the socket (default 60000; 0:
 * none): connecting, and each time a call waits to send or to receive, as
 * hiredis's redisSetTimeout. It bounds a daemon that stops answering, not
 * a whole call: a restore takes as long as its bytes take, and a peer that
 * sends a byte within each timeout keeps a call going. Set after
 * k3cache_connect, it applies from the next call (the connect itself waited
 * at most the default: k3cache_connect_timeout bounds the connect too). */
K3CACHE_API void k3cache_set_timeout(struct k3cache *c, int ms);

/* Hello: checks the daemon speaks our protocol. server (may be NULL) gets the
 * daemon's name and version. */
K3CACHE_API int k3cache_hello(struct k3cache *c, char *server, size_t serversz,
                              struct k3cache_error *err);

/* Stores a model spec (idempotent). fp (may be NULL) gets its fingerprint. */
K3CACHE_API int k3cache_put_model(struct k3cache *c, const struct k3cache_model *spec,
                                  uint8_t fp[K3CACHE_FP_LEN], struct k3cache_error *err);

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
K3CACHE_API int k3cache_publish(struct k3cache *c, const uint8_t fp[K3CACHE_FP_LEN],
                                const void *salt, size_t salt_len, const uint32_t *tokens,
                                uint32_t n_tokens, const struct k3cache_buf *blobs,
                                uint32_t n_blobs, struct k3cache_publish_result *res,
                                struct k3cache_error *err);

struct k3cache_lookup_result {
	uint32_t prefix_len; /* P; 0 on a miss */
	uint32_t hint;       /* the junction: where the prompt leaves the stored paths,
	                      * rounded down to a 16-token block; a snapshot
	                      * published at this position lets the next prompt
	                      * sharing it hit */
	uint8_t key[K3CACHE_KEY_LEN];
	uint64_t bytes;
};

/* Longest stored prefix of the prompt with P <= limit (0: N-1). */
K3CACHE_API int k3cache_lookup(struct k3cache *c, const uint8_t fp[K3CACHE_FP_LEN],
                               const void *salt, size_t salt_len, const uint32_t *tokens,
                               uint32_t n_tokens, uint32_t limit, struct k3cache_lookup_result *res,
                               struct k3cache_error *err);

/* Publishes a snapshot of a live state that was restored from, or last
 * published as, the entry base_key of base_rows tokens (a prefix of these
 * tokens, same model and salt): the MLA layers' rows [0, base_rows) are not
 * sent; the daemon takes them from the base and checks each whole blob
 * against its XXH3, computed here from blobs, which are the whole state as
 * for k3cache_publish. When the daemon refuses the base (gone, another
 * model or salt, not a prefix, other rows), the library publishes the whole
 * snapshot by itself; res->delta_rows says which happened. A NULL base_key
 * or base_rows of 0 is a plain k3cache_publish. */
K3CACHE_API int k3cache_publish_delta(struct k3cache *c, const uint8_t fp[K3CACHE_FP_LEN],
                                      const void *salt, size_t salt_len, const uint32_t *tokens,
                                      uint32_t n_tokens, const struct k3cache_buf *blobs,
                                      uint32_t n_blobs, const uint8_t base_key[K3CACHE_KEY_LEN],
                                      uint32_t base_rows, struct k3cache_publish_result *res,
                                      struct k3cache_error *err);

/* ---- restore: validated before the caller sees anything ---- */

/* Form 1: into caller buffers. bufs[i] must hold layer i's blob
 * (k3cache_model_blob_size(model, i, P) bytes; a smaller buffer, or two
 * buffers sharing a byte of what they receive, is an INVALID error before
 * anything is read into them). On success lens[i] is layer i's
 * size and *prefix_len is P. On any failure the buffers' contents are
 * unspecified and must not be used. */
K3CACHE_API int k3cache_restore_into(struct k3cache *c, const struct k3cache_model *model,
                                     const uint8_t key[K3CACHE_KEY_LEN], void *const *bufs,
                                     const size_t *caps, size_t *lens, uint32_t *prefix_len,
                                     struct k3cache_error *err);

/* Form 2: a callback per layer, called only after every layer has been
 * received and validated; the data is valid during the call. A non-zero
 * return stops and is returned. The callback may call the library on the
 * same handle, another restore included: that restore's bytes are its own
 * and leave the ones being handed over untouched. */
typedef int (*k3cache_layer_fn)(uint32_t index, const void *blob, size_t len, void *ctx);
K3CACHE_API int k3cache_restore_each(struct k3cache *c, const struct k3cache_model *model,
                                     const uint8_t key[K3CACHE_KEY_LEN], k3cache_layer_fn fn,
                                     void *ctx, uint32_t *prefix_len, struct k3cache_error *err);

/* Lookup and restore in one round trip (Lookup with restore): a miss returns
 * 0 with *prefix_len 0 and calls nothing. */
K3CACHE_API int k3cache_lookup_restore(struct k3cache *c, const struct k3cache_model *model,
                                       const void *salt, size_t salt_len, const uint32_t *tokens,
                                       uint32_t n_tokens, uint32_t limit, k3cache_layer_fn fn,
                                       void *ctx, struct k3cache_lookup_result *res,
                                       struct k3cache_error *err);

/* ---- the record: how much of a prompt can my live state reuse ---- */

/* The tokens a worker's live state covers, recorded where they are fed. A
 * state is tainted when it no longer equals the prefill of its tokens (an
 * aborted chunk, sampled tokens not fed back): it must not be published or
 * reused. */
struct k3cache_record {
	uint32_t *tokens;
	uint32_t n, cap;
	int tainted;
};

K3CACHE_API void k3cache_record_init(struct k3cache_record *r);
K3CACHE_API void k3cache_record_free(struct k3cache_record *r);
K3CACHE_API void k3cache_record_reset(struct k3cache_record *r);
/* Appends tokens that were fed to the state. -1 on allocation failure
 * (the record is then tainted). */
K3CACHE_API int k3cache_record_append(struct k3cache_record *r, const uint32_t *tokens, uint32_t n);
K3CACHE_API void k3cache_record_taint(struct k3cache_record *r);

/* How many leading tokens of the prompt the live state can keep: the common
 * prefix of record and prompt, capped at n_prompt - 1 so that at least one
 * token is fed to get logits. 0 when the record is NULL, empty or tainted,
 * or the prompt is NULL or empty. A return equal to the record's length
 * means "continue"; anything less means the state must be reset (a recurrent
 * state cannot be rewound) unless it is 0. */
K3CACHE_API uint32_t k3cache_record_reusable(const struct k3cache_record *r, const uint32_t *prompt,
                                             uint32_t n_prompt);

/* Publishes the live state the record describes; refuses (INVALID) a tainted
 * or empty record. */
K3CACHE_API int k3cache_publish_record(struct k3cache *c, const uint8_t fp[K3CACHE_FP_LEN],
                                       const void *salt, size_t salt_len,
                                       const struct k3cache_record *r,
                                       const struct k3cache_buf *blobs, uint32_t n_blobs,
                                       struct k3cache_publish_result *res,
                                       struct k3cache_error *err);

/* One counter of the daemon's Stat answer, by the name `k3cachectl stat`
 * shows (hits, misses, bytes_in, ingest_yields, ...); NOT_FOUND when the
 * daemon has no such counter. */
K3CACHE_API int k3cache_stat_counter(struct k3cache *c, const char *name, uint64_t *value,
                                     struct k3cache_error *err);

/* ---- layers as their component arrays (no packing copy) ---- */

/* One layer as the two float32 arrays of its blob, in the seed's order: KDA
 * conv then recurrent, MLA k then v (P rows each: P x k_row and P x v_row
 * floats). Lengths count floats. */
struct k3cache_arrays {
	const float *a;
	size_t a_len;
	const float *b;
	size_t b_len;
};

/* k3cache_publish_delta from arrays: layers[i] is layer i of the model, whose
 * tag and length words the library writes itself; the header words and the
 * caller's arrays go out by gather-write, with no copy. The blob the daemon
 * stores, and the XXH3 sent with it, are those of the seed's format, so a
 * snapshot published either way restores the same. Lengths that disagree
 * with the model at P = n_tokens are refused (INVALID) before anything is
 * sent. base_key NULL (or base_rows 0): a plain publish. */
K3CACHE_API int k3cache_publish_arrays(struct k3cache *c, const struct k3cache_model *model,
                                       const void *salt, size_t salt_len, const uint32_t *tokens,
                                       uint32_t n_tokens, const struct k3cache_arrays *layers,
                                       uint32_t n_layers, const uint8_t *base_key,
                                       uint32_t base_rows, struct k3cache_publish_result *res,
                                       struct k3cache_error *err);

/* Where a restore puts layer i: its two arrays, a_cap and b_cap floats long
 * (at least the model's shape at the entry's P). */
struct k3cache_arrays_out {
	float *a;
	size_t a_cap;
	float *b;
	size_t b_cap;
};

/* k3cache_restore_into, scattering each layer straight into the caller's
 * arrays (for example the engine's own tensors): the header words are
 * checked and dropped, the floats land in place, and every check of the
 * blob form (tag, shape, seq_len, finite, the layer's XXH3 over the seed's
 * bytes) runs before success. On success *prefix_len is P and layers[i]
 * hold the first (P x row or fixed) floats of each array. Arrays too short,
 * or two sharing a byte of what they receive, are INVALID before anything is
 * read. On any failure the arrays' contents are undefined and must not be
 * used. */
K3CACHE_API int k3cache_restore_arrays(struct k3cache *c, const struct k3cache_model *model,
                                       const uint8_t key[K3CACHE_KEY_LEN],
                                       const struct k3cache_arrays_out *layers, uint32_t n_layers,
                                       uint32_t *prefix_len, struct k3cache_error *err);

#ifdef __cplusplus
}
#endif

#endif
