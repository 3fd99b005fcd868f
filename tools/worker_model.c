#include "worker_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"

/* The model's dimensions are small (at most a few hundred), so index products
 * in u32 cannot wrap; sizes that scale with tokens are computed in size_t. */
// NOLINTBEGIN(bugprone-implicit-widening-of-multiplication-result)

static const struct worker_geometry geometries[] = {
        {.name = "tiny",
         .hidden = 64,
         .kda_heads = 2,
         .kda_dim = 16,
         .mla_heads = 2,
         .mla_dim = 16,
         .mla_latent = 32,
         .mla_rope = 16,
         .mlp = 128},
        {.name = "twin",
         .hidden = 128,
         .kda_heads = 8,
         .kda_dim = 32,
         .mla_heads = 4,
         .mla_dim = 32,
         .mla_latent = 128,
         .mla_rope = 32,
         .mlp = 256},
};

const struct worker_geometry *worker_geometry(const char *name)
{
	for (size_t i = 0; i < sizeof(geometries) / sizeof(geometries[0]); i++)
		if (!strcmp(geometries[i].name, name))
			return &geometries[i];
	return NULL;
}

const char *worker_geometry_choices(void)
{
	static char list[64];
	if (!list[0]) {
		size_t n = sizeof(geometries) / sizeof(geometries[0]), at = 0;
		for (size_t i = 0; i < n; i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
			                       i == 0       ? ""
			                       : i + 1 == n ? " or "
			                                    : ", ",
			                       geometries[i].name);
	}
	return list;
}

static int is_mla(uint32_t layer)
{
	return layer == 3 || layer == 7;
}

/* ---- weights ----------------------------------------------------------------- */

struct kda_w {
	float *wq, *wk, *wv;         /* [HD x hidden] */
	float *cq, *ck, *cv;         /* [HD x W] depthwise conv */
	float *wb;                   /* [H x hidden] */
	float *wf, *dt_bias, *a_log; /* [HD x hidden], [HD], [HD] */
	float *wg;                   /* [HD x hidden] output gate */
	float *onorm;                /* [D] */
	float *wo;                   /* [hidden x HD] */
};

struct mla_w {
	float *wdkv; /* [L x hidden] */
	float *wkr;  /* [R x hidden] */
	float *wqn;  /* [Hm*Dm x hidden] */
	float *wqr;  /* [Hm*R x hidden] */
	float *wuk;  /* [Hm][Dm x L] */
	float *wuv;  /* [Hm][Dm x L] */
	float *wo;   /* [hidden x Hm*Dm] */
};

struct layer_w {
	float *norm1, *norm2;
	struct kda_w kda;
	struct mla_w mla;
	float *wgate, *wup; /* [mlp x hidden] */
	float *wdown;       /* [hidden x mlp] */
};

struct worker_model {
	struct worker_geometry g;
	uint64_t seed;
	uint64_t rng;
	float *embed; /* [vocab x hidden] */
	struct layer_w layers[WORKER_LAYERS];
	float *final_norm;
	float *lm_head; /* [vocab x hidden] */
	float **allocs;
	size_t n_allocs, cap_allocs;
	int failed;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float uniform(struct worker_model *m)
{
	return (float)((double)(splitmix64(&m->rng) >> 11) * (1.0 / 9007199254740992.0) * 2.0 -
	               1.0);
}

static float *alloc(struct worker_model *m, size_t n)
{
	if (m->failed)
		return NULL;
	float *p = calloc(n ? n : 1, sizeof(float));
	if (!p || (m->n_allocs == m->cap_allocs &&
	           !(m->allocs = realloc(m->allocs, (m->cap_allocs = m->cap_allocs * 2 + 64) *
	                                                    sizeof(float *))))) {
		free(p);
		m->failed = 1;
		return NULL;
	}
	m->allocs[m->n_allocs++] = p;
	return p;
}

/* A weight matrix [rows x cols] scaled by 1/sqrt(fan_in = cols). */
static float *matrix(struct worker_model *m, uint32_t rows, uint32_t cols)
{
	float *w = alloc(m, (size_t)rows * cols);
	float scale = 1.0f / sqrtf((float)cols);
	for (size_t i = 0; w && i < (size_t)rows * cols; i++)
		w[i] = uniform(m) * scale;
	return w;
}

static float *filled(struct worker_model *m, uint32_t n, float v)
{
	float *w = alloc(m, n);
	for (uint32_t i = 0; w && i < n; i++)
		w[i] = v;
	return w;
}

struct worker_model *worker_model_new(const struct worker_geometry *g, uint64_t seed)
{
	struct worker_model *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->g = *g;
	m->seed = seed;
	m->rng = seed;
	uint32_t h = g->hidden, hd = g->kda_heads * g->kda_dim;
	m->embed = alloc(m, (size_t)WORKER_VOCAB * h); /* unit-scale rows */
	for (size_t i = 0; m->embed && i < (size_t)WORKER_VOCAB * h; i++)
		m->embed[i] = uniform(m);
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		struct layer_w *L = &m->layers[l];
		L->norm1 = filled(m, h, 1.0f);
		L->norm2 = filled(m, h, 1.0f);
		if (is_mla(l)) {
			uint32_t hm = g->mla_heads, dm = g->mla_dim, lat = g->mla_latent,
			         r = g->mla_rope;
			L->mla.wdkv = matrix(m, lat, h);
			L->mla.wkr = matrix(m, r, h);
			L->mla.wqn = matrix(m, hm * dm, h);
			L->mla.wqr = matrix(m, hm * r, h);
			L->mla.wuk = matrix(m, hm * dm, lat);
			L->mla.wuv = matrix(m, hm * dm, lat);
			L->mla.wo = matrix(m, h, hm * dm);
		} else {
			L->kda.wq = matrix(m, hd, h);
			L->kda.wk = matrix(m, hd, h);
			L->kda.wv = matrix(m, hd, h);
			L->kda.cq = matrix(m, hd, WORKER_CONV_W);
			L->kda.ck = matrix(m, hd, WORKER_CONV_W);
			L->kda.cv = matrix(m, hd, WORKER_CONV_W);
			L->kda.wb = matrix(m, g->kda_heads, h);
			L->kda.wf = matrix(m, hd, h);
			L->kda.dt_bias = alloc(m, hd);
			L->kda.a_log = alloc(m, hd);
			for (uint32_t i = 0; L->kda.a_log && i < hd; i++) {
				/* slow decays: exp(g) mostly 0.9..0.99, a long memory */
				L->kda.a_log[i] = logf(0.02f + 0.08f * (uniform(m) + 1.0f) * 0.5f);
				L->kda.dt_bias[i] = 0.1f * uniform(m);
			}
			L->kda.wg = matrix(m, hd, h);
			L->kda.onorm = filled(m, g->kda_dim, 1.0f);
			L->kda.wo = matrix(m, h, hd);
		}
		L->wgate = matrix(m, g->mlp, h);
		L->wup = matrix(m, g->mlp, h);
		L->wdown = matrix(m, h, g->mlp);
	}
	m->final_norm = filled(m, h, 1.0f);
	m->lm_head = matrix(m, WORKER_VOCAB, h);
	if (m->failed) {
		worker_model_free(m);
		return NULL;
	}
	return m;
}

void worker_model_free(struct worker_model *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_allocs; i++)
		free(m->allocs[i]);
	free(m->allocs);
	free(m);
}

struct k3cache_model *worker_model_spec(const struct worker_model *m)
{
	const struct worker_geometry *g = &m->g;
	struct model_layer layers[WORKER_LAYERS];
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		memset(&layers[l], 0, sizeof(layers[l]));
		if (is_mla(l)) {
			layers[l].mixer = MODEL_MIXER_MLA;
			layers[l].k_row = g->mla_latent;
			layers[l].v_row = g->mla_rope;
		} else {
			layers[l].mixer = MODEL_MIXER_KDA;
			layers[l].conv_len = 3 * g->kda_heads * g->kda_dim * WORKER_CONV_W;
			layers[l].recurrent_len = g->kda_heads * g->kda_dim * g->kda_dim;
		}
	}
	char name[64], rev[64], err[MODEL_ERROR_MAX];
	snprintf(name, sizeof(name), "k3worker-%s", g->name);
	snprintf(rev, sizeof(rev), "seed-%llu", (unsigned long long)m->seed);
	return model_new(name, rev,
	                 "kda.recurrent=[H,K,V] kda.conv=[3*H*D,W] mla.k=[T,latent] mla.v=[T,rope]",
	                 layers, WORKER_LAYERS, err);
}

/* ---- state ------------------------------------------------------------------- */

struct worker_state {
	const struct worker_model *m;
	uint32_t pos, max;
	float *conv[WORKER_LAYERS]; /* KDA: [3*HD x W], q then k then v channels */
	float *S[WORKER_LAYERS];    /* KDA: [H x K x V] */
	float *ck[WORKER_LAYERS];   /* MLA: [max x latent] */
	float *cv[WORKER_LAYERS];   /* MLA: [max x rope] */
	/* scratch */
	float *x, *xn, *o, *t1, *t2, *t3, *t4, *scores;
};

struct worker_state *worker_state_new(const struct worker_model *m, uint32_t max_tokens)
{
	const struct worker_geometry *g = &m->g;
	struct worker_state *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->m = m;
	s->max = max_tokens;
	uint32_t hd = g->kda_heads * g->kda_dim;
	int bad = 0;
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		if (is_mla(l)) {
			s->ck[l] = calloc((size_t)max_tokens * g->mla_latent + 1, sizeof(float));
			s->cv[l] = calloc((size_t)max_tokens * g->mla_rope + 1, sizeof(float));
			bad |= !s->ck[l] || !s->cv[l];
		} else {
			s->conv[l] = calloc((size_t)3 * hd * WORKER_CONV_W, sizeof(float));
			s->S[l] = calloc((size_t)g->kda_heads * g->kda_dim * g->kda_dim,
			                 sizeof(float));
			bad |= !s->conv[l] || !s->S[l];
		}
	}
	size_t wide = g->mlp > 3 * hd ? g->mlp : 3 * hd;
	if (wide < g->mla_heads * (g->mla_latent + g->mla_dim + g->mla_rope))
		wide = g->mla_heads * (g->mla_latent + g->mla_dim + g->mla_rope);
	if (wide < g->hidden)
		wide = g->hidden;
	s->x = calloc(g->hidden, sizeof(float));
	s->xn = calloc(g->hidden, sizeof(float));
	s->o = calloc(wide, sizeof(float));
	s->t1 = calloc(wide, sizeof(float));
	s->t2 = calloc(wide, sizeof(float));
	s->t3 = calloc(wide, sizeof(float));
	s->t4 = calloc(wide, sizeof(float));
	s->scores = calloc((size_t)max_tokens + 1, sizeof(float));
	if (bad || !s->x || !s->xn || !s->o || !s->t1 || !s->t2 || !s->t3 || !s->t4 || !s->scores) {
		worker_state_free(s);
		return NULL;
	}
	return s;
}

void worker_state_free(struct worker_state *s)
{
	if (!s)
		return;
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		free(s->conv[l]);
		free(s->S[l]);
		free(s->ck[l]);
		free(s->cv[l]);
	}
	free(s->x);
	free(s->xn);
	free(s->o);
	free(s->t1);
	free(s->t2);
	free(s->t3);
	free(s->t4);
	free(s->scores);
	free(s);
}

void worker_state_reset(struct worker_state *s)
{
	const struct worker_geometry *g = &s->m->g;
	uint32_t hd = g->kda_heads * g->kda_dim;
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		if (!is_mla(l)) {
			memset(s->conv[l], 0, (size_t)3 * hd * WORKER_CONV_W * sizeof(float));
			memset(s->S[l], 0,
			       (size_t)g->kda_heads * g->kda_dim * g->kda_dim * sizeof(float));
		}
	}
	s->pos = 0;
}

uint32_t worker_state_pos(const struct worker_state *s)
{
	return s->pos;
}

/* ---- kernels ------------------------------------------------------------------- */

/* y = W x, W [rows x cols]. Eight independent accumulators in a fixed order:
 * vectorisable, and bit-for-bit repeatable. */
static void matvec(const float *w, const float *x, float *y, uint32_t rows, uint32_t cols)
{
	for (uint32_t r = 0; r < rows; r++) {
		const float *row = w + (size_t)r * cols;
		float acc[8] = {0};
		uint32_t c = 0;
		for (; c + 8 <= cols; c += 8)
			for (int j = 0; j < 8; j++)
				acc[j] += row[c + (uint32_t)j] * x[c + (uint32_t)j];
		float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
		            ((acc[4] + acc[5]) + (acc[6] + acc[7]));
		for (; c < cols; c++)
			sum += row[c] * x[c];
		y[r] = sum;
	}
}

static float dot(const float *a, const float *b, uint32_t n)
{
	float acc[8] = {0};
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[i + (uint32_t)j] * b[i + (uint32_t)j];
	float sum =
	        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; i < n; i++)
		sum += a[i] * b[i];
	return sum;
}

static void rmsnorm(const float *x, const float *w, float *y, uint32_t n)
{
	float ss = dot(x, x, n) / (float)n;
	float inv = 1.0f / sqrtf(ss + 1e-6f);
	for (uint32_t i = 0; i < n; i++)
		y[i] = x[i] * inv * w[i];
}

static float silu(float x)
{
	return x / (1.0f + expf(-x));
}

static float sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

static float softplus(float x)
{
	return x > 20.0f ? x : log1pf(expf(x));
}

static void rope(float *v, uint32_t n, uint32_t pos)
{
	uint32_t half = n / 2;
	for (uint32_t i = 0; i < half; i++) {
		float theta = (float)pos * powf(10000.0f, -2.0f * (float)i / (float)n);
		float c = cosf(theta), s = sinf(theta);
		float a = v[i], b = v[i + half];
		v[i] = a * c - b * s;
		v[i + half] = a * s + b * c;
	}
}

/* ---- layers ------------------------------------------------------------------ */

static void kda_step(const struct worker_model *m, struct worker_state *s, uint32_t l,
                     const float *xn, float *out)
{
	const struct worker_geometry *g = &m->g;
	const struct kda_w *w = &m->layers[l].kda;
	uint32_t H = g->kda_heads, D = g->kda_dim, hd = H * D, W = WORKER_CONV_W;
	float *u = s->t1; /* [3*hd]: q, k, v projections */
	matvec(w->wq, xn, u, hd, g->hidden);
	matvec(w->wk, xn, u + hd, hd, g->hidden);
	matvec(w->wv, xn, u + 2 * hd, hd, g->hidden);
	/* causal depthwise conv: push the new input into each channel's window */
	float *conv = s->conv[l], *qkv = s->t2;
	const float *cw[3] = {w->cq, w->ck, w->cv};
	for (uint32_t c = 0; c < 3 * hd; c++) {
		float *win = conv + (size_t)c * W;
		memmove(win, win + 1, (W - 1) * sizeof(float));
		win[W - 1] = u[c];
		const float *k = cw[c / hd] + (size_t)(c % hd) * W;
		float acc = 0;
		for (uint32_t j = 0; j < W; j++)
			acc += k[j] * win[j];
		qkv[c] = silu(acc);
	}
	float *q = qkv, *k = qkv + hd, *v = qkv + 2 * hd;
	float qscale = 1.0f / sqrtf((float)D);
	for (uint32_t h = 0; h < H; h++) {
		float nq = sqrtf(dot(q + h * D, q + h * D, D) + 1e-6f);
		float nk = sqrtf(dot(k + h * D, k + h * D, D) + 1e-6f);
		for (uint32_t d = 0; d < D; d++) {
			q[h * D + d] = q[h * D + d] / nq * qscale;
			k[h * D + d] /= nk;
		}
	}
	float *beta = s->t3, *gdec = s->t4;
	matvec(w->wb, xn, beta, H, g->hidden);
	for (uint32_t h = 0; h < H; h++)
		beta[h] = sigmoid(beta[h]);
	matvec(w->wf, xn, gdec, hd, g->hidden);
	for (uint32_t c = 0; c < hd; c++)
		gdec[c] = expf(-expf(w->a_log[c]) * softplus(gdec[c] + w->dt_bias[c]));
	float *o = s->o;
	for (uint32_t h = 0; h < H; h++) {
		float *S = s->S[l] + (size_t)h * D * D; /* S[k][v] */
		const float *kh = k + h * D, *vh = v + h * D, *qh = q + h * D, *gh = gdec + h * D;
		for (uint32_t a = 0; a < D; a++)
			for (uint32_t b = 0; b < D; b++)
				S[a * D + b] *= gh[a];
		float pred[64], err[64];
		for (uint32_t b = 0; b < D; b++) {
			float acc = 0;
			for (uint32_t a = 0; a < D; a++)
				acc += S[a * D + b] * kh[a];
			pred[b] = acc;
			err[b] = vh[b] - pred[b];
		}
		for (uint32_t a = 0; a < D; a++)
			for (uint32_t b = 0; b < D; b++)
				S[a * D + b] += beta[h] * kh[a] * err[b];
		for (uint32_t b = 0; b < D; b++) {
			float acc = 0;
			for (uint32_t a = 0; a < D; a++)
				acc += S[a * D + b] * qh[a];
			o[h * D + b] = acc;
		}
		rmsnorm(o + h * D, w->onorm, o + h * D, D);
	}
	float *gate = s->t1; /* u is no longer needed */
	matvec(w->wg, xn, gate, hd, g->hidden);
	for (uint32_t c = 0; c < hd; c++)
		o[c] *= sigmoid(gate[c]);
	matvec(w->wo, o, out, g->hidden, hd);
}

static void mla_step(const struct worker_model *m, struct worker_state *s, uint32_t l,
                     const float *xn, float *out)
{
	const struct worker_geometry *g = &m->g;
	const struct mla_w *w = &m->layers[l].mla;
	uint32_t Hm = g->mla_heads, Dm = g->mla_dim, L = g->mla_latent, R = g->mla_rope;
	uint32_t p = s->pos;
	float *c = s->ck[l] + (size_t)p * L, *kr = s->cv[l] + (size_t)p * R;
	matvec(w->wdkv, xn, c, L, g->hidden);
	matvec(w->wkr, xn, kr, R, g->hidden);
	rope(kr, R, p);
	float *qn = s->t1, *qr = s->t2, *qlat = s->t3, *ctx = s->t4, *o = s->o;
	matvec(w->wqn, xn, qn, Hm * Dm, g->hidden);
	matvec(w->wqr, xn, qr, Hm * R, g->hidden);
	float scale = 1.0f / sqrtf((float)(Dm + R));
	for (uint32_t h = 0; h < Hm; h++) {
		rope(qr + h * R, R, p);
		/* absorb: q_lat = W_uk^T q_nope */
		const float *wuk = w->wuk + (size_t)h * Dm * L;
		for (uint32_t j = 0; j < L; j++)
			qlat[j] = 0;
		for (uint32_t d = 0; d < Dm; d++)
			for (uint32_t j = 0; j < L; j++)
				qlat[j] += wuk[(size_t)d * L + j] * qn[h * Dm + d];
		float mx = -INFINITY;
		for (uint32_t t = 0; t <= p; t++) {
			float sc = (dot(qlat, s->ck[l] + (size_t)t * L, L) +
			            dot(qr + h * R, s->cv[l] + (size_t)t * R, R)) *
			           scale;
			s->scores[t] = sc;
			mx = sc > mx ? sc : mx;
		}
		float sum = 0;
		for (uint32_t t = 0; t <= p; t++) {
			s->scores[t] = expf(s->scores[t] - mx);
			sum += s->scores[t];
		}
		for (uint32_t j = 0; j < L; j++)
			ctx[j] = 0;
		for (uint32_t t = 0; t <= p; t++) {
			float pt = s->scores[t] / sum;
			const float *row = s->ck[l] + (size_t)t * L;
			for (uint32_t j = 0; j < L; j++)
				ctx[j] += pt * row[j];
		}
		matvec(w->wuv + (size_t)h * Dm * L, ctx, o + h * Dm, Dm, L);
	}
	matvec(w->wo, o, out, g->hidden, Hm * Dm);
}

static void mlp(const struct worker_model *m, struct worker_state *s, uint32_t l, const float *xn,
                float *out)
{
	const struct worker_geometry *g = &m->g;
	const struct layer_w *L = &m->layers[l];
	float *a = s->t1, *b = s->t2;
	matvec(L->wgate, xn, a, g->mlp, g->hidden);
	matvec(L->wup, xn, b, g->mlp, g->hidden);
	for (uint32_t i = 0; i < g->mlp; i++)
		a[i] = silu(a[i]) * b[i];
	matvec(L->wdown, a, out, g->hidden, g->mlp);
}

static void step(const struct worker_model *m, struct worker_state *s, uint32_t token)
{
	const struct worker_geometry *g = &m->g;
	uint32_t h = g->hidden;
	memcpy(s->x, m->embed + (size_t)(token % WORKER_VOCAB) * h, h * sizeof(float));
	float delta[512];
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		rmsnorm(s->x, m->layers[l].norm1, s->xn, h);
		if (is_mla(l))
			mla_step(m, s, l, s->xn, delta);
		else
			kda_step(m, s, l, s->xn, delta);
		for (uint32_t i = 0; i < h; i++)
			s->x[i] += delta[i];
		rmsnorm(s->x, m->layers[l].norm2, s->xn, h);
		mlp(m, s, l, s->xn, delta);
		for (uint32_t i = 0; i < h; i++)
			s->x[i] += delta[i];
	}
	s->pos++;
}

int worker_prefill(const struct worker_model *m, struct worker_state *s, const uint32_t *tokens,
                   uint32_t n, uint32_t chunk, float *logits)
{
	if (n == 0 || (uint64_t)s->pos + n > s->max)
		return -1;
	if (chunk == 0)
		chunk = n;
	/* chunk by chunk; each chunk continues the state the previous one left */
	for (uint32_t start = 0; start < n; start += chunk) {
		uint32_t end = start + chunk < n ? start + chunk : n;
		for (uint32_t i = start; i < end; i++)
			step(m, s, tokens[i]);
	}
	float *xn = s->xn;
	rmsnorm(s->x, m->final_norm, xn, m->g.hidden);
	matvec(m->lm_head, xn, logits, WORKER_VOCAB, m->g.hidden);
	return 0;
}

uint32_t worker_argmax(const float *logits)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < WORKER_VOCAB; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

/* ---- blobs --------------------------------------------------------------------- */

size_t worker_state_blob_size(const struct worker_state *s, uint32_t layer)
{
	const struct worker_geometry *g = &s->m->g;
	if (is_mla(layer))
		return 1 + 4 + 8 + (size_t)s->pos * (g->mla_latent + g->mla_rope) * 4u;
	uint32_t hd = g->kda_heads * g->kda_dim;
	return 1 + 8 +
	       ((size_t)3 * hd * WORKER_CONV_W + (size_t)g->kda_heads * g->kda_dim * g->kda_dim) *
	               4u;
}

void worker_state_encode(const struct worker_state *s, uint32_t layer, void *out)
{
	const struct worker_geometry *g = &s->m->g;
	struct blob_view v;
	if (is_mla(layer)) {
		v = (struct blob_view){
		        .tag = BLOB_TAG_MLA,
		        .seq_len = s->pos,
		        .v0 = {(const unsigned char *)s->ck[layer], s->pos * g->mla_latent},
		        .v1 = {(const unsigned char *)s->cv[layer], s->pos * g->mla_rope}};
	} else {
		uint32_t hd = g->kda_heads * g->kda_dim;
		v = (struct blob_view){
		        .tag = BLOB_TAG_KDA,
		        .v0 = {(const unsigned char *)s->conv[layer], 3 * hd * WORKER_CONV_W},
		        .v1 = {(const unsigned char *)s->S[layer],
		               g->kda_heads * g->kda_dim * g->kda_dim}};
	}
	blob_encode(&v, out);
}

int worker_state_load(struct worker_state *s, uint32_t layer, const void *blob, size_t len,
                      uint32_t p)
{
	struct blob_view v;
	if (blob_parse(blob, len, &v, NULL) != BLOB_OK || p > s->max)
		return -1;
	const struct worker_geometry *g = &s->m->g;
	uint32_t hd = g->kda_heads * g->kda_dim;
	if (is_mla(layer)) {
		if (v.tag != BLOB_TAG_MLA || v.seq_len != p || v.v0.count != p * g->mla_latent ||
		    v.v1.count != p * g->mla_rope)
			return -1;
		memcpy(s->ck[layer], v.v0.data, (size_t)v.v0.count * 4u);
		memcpy(s->cv[layer], v.v1.data, (size_t)v.v1.count * 4u);
	} else {
		if (v.tag != BLOB_TAG_KDA || v.v0.count != 3 * hd * WORKER_CONV_W ||
		    v.v1.count != g->kda_heads * g->kda_dim * g->kda_dim)
			return -1;
		memcpy(s->conv[layer], v.v0.data, (size_t)v.v0.count * 4u);
		memcpy(s->S[layer], v.v1.data, (size_t)v.v1.count * 4u);
	}
	s->pos = p;
	return 0;
}
// NOLINTEND(bugprone-implicit-widening-of-multiplication-result)
