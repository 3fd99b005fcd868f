/* worker_model: a tiny but real hybrid language model for k3worker.
 *
 * Byte-level tokens (vocab 256). Layers laid out like Kimi K3's 0.40B twin:
 * KDA at 0-2 and 4-6, MLA at 3 and 7, each followed by an RMSNorm + SiLU-gated
 * MLP, with a final norm and an LM head. Weights are seeded random numbers
 * (splitmix64, scaled by 1/sqrt(fan_in)); f32, single-threaded, deterministic:
 * the same tokens give the same logits bit for bit, whatever the chunking.
 *
 * KDA (Kimi Delta Attention): q, k, v projections, each through a causal
 * depthwise short conv (kernel 4) and SiLU; q and k L2-normalised per head, q
 * scaled by 1/sqrt(dk); beta = sigmoid(W_b x) per head; a per-channel decay
 * g = -exp(A_log) * softplus(W_f x + dt_bias). Per step:
 *   S <- diag(exp g) S;  S <- S + beta k (v - S^T k)^T;  o = S^T q
 * then per-head RMSNorm, a sigmoid output gate and o_proj. The state is the
 * conv window and S.
 *
 * MLA: a low-rank latent KV. Each token caches its latent row c = W_dkv x and
 * its rope row k_r = RoPE(W_kr x); queries are absorbed into the latent space
 * (q_lat = W_uk^T q_nope), scored against every cached row with causal softmax,
 * and the weighted latent is expanded by W_uv. The cache is the latent rows
 * (the blob's k) and the rope rows (the blob's v).
 *
 * Prefill runs in chunks that carry the state across boundaries explicitly:
 * a new prompt and a continuation are told apart by the caller (seed 003). */
#ifndef K3_WORKER_MODEL_H
#define K3_WORKER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define WORKER_VOCAB  256
#define WORKER_LAYERS 8
#define WORKER_CONV_W 4

struct worker_geometry {
	const char *name; /* "tiny" or "twin" */
	uint32_t hidden;
	uint32_t kda_heads, kda_dim;   /* KDA: heads x head dim (dk = dv) */
	uint32_t mla_heads, mla_dim;   /* MLA: heads x nope dim */
	uint32_t mla_latent, mla_rope; /* MLA: cached rows */
	uint32_t mlp;                  /* MLP inner width */
};

/* "tiny" or "twin"; NULL when unknown. */
const struct worker_geometry *worker_geometry(const char *name);

/* The geometries' names as a message lists them: "tiny or twin". */
const char *worker_geometry_choices(void);

struct worker_model;

/* Builds a model with weights from `seed`. NULL on allocation failure. */
struct worker_model *worker_model_new(const struct worker_geometry *g, uint64_t seed);
void worker_model_free(struct worker_model *m);

/* The model spec the cache sees: name, revision (the weight seed) and the
 * state layout; two workers share state only when all of it agrees. */
struct k3cache_model *worker_model_spec(const struct worker_model *m);

/* The sequence state: per layer the KDA conv window and S, or the MLA cache. */
struct worker_state;

struct worker_state *worker_state_new(const struct worker_model *m, uint32_t max_tokens);
void worker_state_free(struct worker_state *s);
/* A new prompt: empties every layer. */
void worker_state_reset(struct worker_state *s);
/* Tokens the state covers. */
uint32_t worker_state_pos(const struct worker_state *s);

/* Feeds tokens as a continuation of the state, `chunk` tokens at a time
 * (0: all at once), and leaves the last position's logits in `logits`
 * (WORKER_VOCAB floats). Returns 0, or -1 past max_tokens. */
int worker_prefill(const struct worker_model *m, struct worker_state *s, const uint32_t *tokens,
                   uint32_t n, uint32_t chunk, float *logits);

/* Greedy choice from logits. */
uint32_t worker_argmax(const float *logits);

/* ---- state <-> LayerCache blobs (the cache's contract format) ---- */

/* Bytes of layer i's blob for the current state. */
size_t worker_state_blob_size(const struct worker_state *s, uint32_t layer);
/* Encodes layer i's state into out (worker_state_blob_size bytes). */
void worker_state_encode(const struct worker_state *s, uint32_t layer, void *out);
/* Loads layer i's state from a blob already validated against the model's
 * spec for a prefix of p tokens; sets the position to p. Returns 0 or -1. */
int worker_state_load(struct worker_state *s, uint32_t layer, const void *blob, size_t len,
                      uint32_t p);

#endif
