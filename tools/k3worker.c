/* k3worker: a reference inference worker with a tiny real KDA+MLA model.
 *
 * For each turn of a conversation it builds the transcript, reuses what it
 * can (its live state when the prompt continues it, else the longest stored
 * prefix from k3cached, validated by libk3cache before use), prefills the
 * rest chunk by chunk, snapshots at the lookup's junction hint, at the end of
 * the system prompt and at the end of the turn, then generates a greedy reply.
 * It prints
 *   [PREFIX] reusing X of Y prompt tokens (Z%)
 *   logits sha256 HEX          (the final prompt position's logits)
 *   reply ID ID ...
 * With --no-cache it recomputes everything: both must print the same digests.
 * A cache problem (daemon down, a restore that fails validation or comes back
 * CORRUPT) prints one warning and recomputes; it never changes an answer. */
#include <errno.h>
#include <getopt.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "k3cache/k3cache.h"
#include "units.h"
#include "worker_model.h"

struct worker {
	const struct worker_model *m;
	struct k3cache_model *spec;
	struct worker_state *state;
	struct k3cache *cache; /* NULL: no cache (or it failed) */
	struct k3cache_record record;
	const char *salt;
	uint32_t chunk, max_new;
	int quiet;
	int mutant;  /* test builds only: 1 wrong KDA slot, 2 swapped MLA rows */
	int no_live; /* --no-cache: recompute every turn from the first token */
	/* the entry the live state was restored from or last published as: a
	 * publish sends only the MLA rows past it (0: none) */
	uint8_t base_key[32];
	uint32_t base_p;
	double prefill_seconds;
};

static void warn(struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(struct worker *w, const char *fmt, ...)
{
	(void)w;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "[CACHE] warning: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

static void drop_cache(struct worker *w, const char *why)
{
	warn(w, "%s; recomputing without the cache", why);
	k3cache_close(w->cache);
	w->cache = NULL;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- publishing --------------------------------------------------------------- */

static void publish(struct worker *w, const uint32_t *tokens, uint32_t p, const char *why)
{
	if (!w->cache || p == 0 || worker_state_pos(w->state) != p)
		return;
	struct k3cache_buf bufs[WORKER_LAYERS];
	int ok = 1;
	for (uint32_t l = 0; l < WORKER_LAYERS; l++) {
		size_t n = worker_state_blob_size(w->state, l);
		void *b = malloc(n);
		if (!b)
			ok = 0;
		else
			worker_state_encode(w->state, l, b);
		bufs[l].data = b;
		bufs[l].len = n;
	}
	struct k3cache_publish_result res;
	struct k3cache_error err;
	if (ok) {
		int has_base = w->base_p > 0 && w->base_p <= p;
		int rc = k3cache_publish_delta(w->cache, w->spec->fingerprint, w->salt,
		                               strlen(w->salt), tokens, p, bufs, WORKER_LAYERS,
		                               has_base ? w->base_key : NULL,
		                               has_base ? w->base_p : 0, &res, &err);
		if (rc != 0) {
			if (err.unreachable)
				drop_cache(w, err.message);
			else
				warn(w, "publish refused: %s", err.message);
		} else if (!w->quiet) {
			char key[65];
			for (int i = 0; i < 32; i++)
				sprintf(key + (size_t)i * 2, "%02x", res.key[i]);
			printf("[CACHE] published %s snapshot at %u tokens (%s, key %s)\n", why, p,
			       res.created ? "new" : "already stored", key);
		}
		if (rc == 0) { /* the next publish of this state starts from here */
			memcpy(w->base_key, res.key, sizeof(w->base_key));
			w->base_p = p;
		}
	}
	for (uint32_t l = 0; l < WORKER_LAYERS; l++)
		free((void *)bufs[l].data);
}

/* ---- restoring ---------------------------------------------------------------- */

struct load_ctx {
	struct worker *w;
	uint32_t p;
};

static int load_layer(uint32_t index, const void *blob, size_t len, void *arg)
{
	struct load_ctx *lc = arg;
	uint32_t slot = index;
#ifdef K3WORKER_MUTANTS
	/* the C4 mutant: KDA state written into the wrong slot */
	if (lc->w->mutant == 1 && (index == 0 || index == 1))
		slot = 1 - index;
#endif
	return worker_state_load(lc->w->state, slot, blob, len, lc->p) == 0 ? 0 : 1;
}

/* Restores the longest stored prefix into the (reset) state. Returns the
 * position restored (0 on a miss or any failure) and the junction hint. */
static uint32_t restore(struct worker *w, const uint32_t *prompt, uint32_t n, uint32_t *hint)
{
	*hint = 0;
	if (!w->cache)
		return 0;
	struct k3cache_lookup_result lr;
	struct k3cache_error err;
	if (k3cache_lookup(w->cache, w->spec->fingerprint, w->salt, strlen(w->salt), prompt, n, 0,
	                   &lr, &err) != 0) {
		if (err.unreachable)
			drop_cache(w, err.message);
		else
			warn(w, "lookup failed: %s; recomputing", err.message);
		return 0;
	}
	*hint = lr.hint;
	if (!lr.prefix_len)
		return 0;
	struct load_ctx lc = {w, lr.prefix_len};
	uint32_t p = 0;
	w->base_p = 0;
	if (k3cache_restore_each(w->cache, w->spec, lr.key, load_layer, &lc, &p, &err) != 0) {
		worker_state_reset(w->state);
		if (err.unreachable)
			drop_cache(w, err.message);
		else
			warn(w, "restore of %u tokens refused (%s: %s); recomputing", lr.prefix_len,
			     k3cache_code_name(err.code), err.message);
		return 0;
	}
	memcpy(w->base_key, lr.key, sizeof(w->base_key));
	w->base_p = p;
#ifdef K3WORKER_MUTANTS
	if (w->mutant == 2) {
		/* a swapped MLA row: the first two cached rows of layer 3 trade places */
		void *blob = malloc(worker_state_blob_size(w->state, 3));
		worker_state_encode(w->state, 3, blob);
		const struct worker_geometry *g =
		        worker_geometry(strstr(w->spec->name, "twin") ? "twin" : "tiny");
		size_t row = (size_t)g->mla_latent * 4u;
		unsigned char *k = (unsigned char *)blob + 1 + 4 + 4;
		if (p >= 2) {
			unsigned char tmp[512 * 4];
			memcpy(tmp, k, row);
			memcpy(k, k + row, row);
			memcpy(k + row, tmp, row);
		}
		worker_state_load(w->state, 3, blob, worker_state_blob_size(w->state, 3), p);
		free(blob);
	}
#endif
	return p;
}

/* ---- one turn --------------------------------------------------------------------- */

static void digest(const float *logits, char *hex)
{
	unsigned char md[32];
	unsigned int n = 0;
	EVP_Digest(logits, WORKER_VOCAB * sizeof(float), md, &n, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		sprintf(hex + (size_t)i * 2, "%02x", md[i]);
}

/* Runs a prompt: reuse, prefill (snapshotting at the marks), generate. The
 * reply (max_new tokens) goes to reply[]. `sys_end` is the end of the system
 * prompt (0: none). Returns 0 or -1. */
static int run_prompt(struct worker *w, const uint32_t *prompt, uint32_t n, uint32_t sys_end,
                      uint32_t *reply)
{
	float logits[WORKER_VOCAB];
	/* what can the live state keep? (seed 000: a continuation, or nothing) */
	uint32_t reuse = w->no_live ? 0 : k3cache_record_reusable(&w->record, prompt, n);
	uint32_t hint = 0, from;
	if (reuse > 0 && reuse == w->record.n && worker_state_pos(w->state) == reuse) {
		from = reuse;
		if (w->cache) {
			/* still ask for the junction, so that branch points get saved */
			struct k3cache_lookup_result lr;
			struct k3cache_error err;
			if (k3cache_lookup(w->cache, w->spec->fingerprint, w->salt, strlen(w->salt),
			                   prompt, n, 0, &lr, &err) == 0)
				hint = lr.hint;
		}
	} else {
		/* a new prompt for this state: reset, then the longest stored prefix */
		worker_state_reset(w->state);
		k3cache_record_reset(&w->record);
		w->base_p = 0;
		from = restore(w, prompt, n, &hint);
	}
	printf("[PREFIX] reusing %u of %u prompt tokens (%u%%)\n", from, n,
	       n ? (unsigned)((uint64_t)from * 100 / n) : 0);
	/* prefill the rest, stopping at the marks worth a snapshot */
	uint32_t marks[2] = {sys_end, hint};
	double t0 = now_s();
	uint32_t pos = from;
	while (pos < n) {
		uint32_t stop = n;
		for (int i = 0; i < 2; i++)
			if (marks[i] > pos && marks[i] < stop)
				stop = marks[i];
		if (worker_prefill(w->m, w->state, prompt + pos, stop - pos, w->chunk, logits) != 0)
			return -1;
		pos = stop;
		if (pos == sys_end)
			publish(w, prompt, pos, "system-prompt");
		if (pos == hint && pos < n)
			publish(w, prompt, pos, "junction");
	}
	w->prefill_seconds = now_s() - t0;
	char hex[65];
	digest(logits, hex);
	printf("logits sha256 %s\n", hex);
	/* greedy reply; every token, the last one too, is fed to the state */
	for (uint32_t i = 0; i < w->max_new; i++) {
		reply[i] = worker_argmax(logits);
		if (worker_prefill(w->m, w->state, &reply[i], 1, 1, logits) != 0)
			return -1;
	}
	printf("reply");
	for (uint32_t i = 0; i < w->max_new; i++)
		printf(" %u", reply[i]);
	printf("\n");
	fflush(stdout);
	k3cache_record_reset(&w->record);
	k3cache_record_append(&w->record, prompt, n);
	k3cache_record_append(&w->record, reply, w->max_new);
	return 0;
}

/* ---- conversations ---------------------------------------------------------------- */

struct convo {
	char **blocks;
	size_t n;
	int has_system;
};

static int read_convo(const char *path, struct convo *c)
{
	memset(c, 0, sizeof(*c));
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "k3worker: %s: %s\n", path, strerror(errno));
		return -1;
	}
	char *text = NULL;
	size_t len = 0;
	char buf[65536];
	size_t got;
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
		char *nt = realloc(text, len + got + 1);
		if (!nt) {
			free(text);
			fclose(f);
			return -1;
		}
		text = nt;
		memcpy(text + len, buf, got);
		len += got;
	}
	fclose(f);
	if (!text)
		return -1;
	text[len] = 0;
	/* blocks separated by blank lines */
	char *p = text;
	while (*p) {
		while (*p == '\n')
			p++;
		if (!*p)
			break;
		char *end = strstr(p, "\n\n");
		size_t blen = end ? (size_t)(end - p) : strlen(p);
		while (blen && p[blen - 1] == '\n')
			blen--;
		char **nb = realloc(c->blocks, (c->n + 1) * sizeof(*nb));
		if (!nb)
			break;
		c->blocks = nb;
		c->blocks[c->n] = strndup(p, blen);
		c->n++;
		p += end ? (size_t)(end - p) : strlen(p);
	}
	free(text);
	c->has_system = c->n > 0 && !strncmp(c->blocks[0], "System:", 7);
	return 0;
}

struct tokbuf {
	uint32_t *t;
	uint32_t n, cap;
};

static void push_text(struct tokbuf *b, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (b->n == b->cap) {
			b->cap = b->cap ? b->cap * 2 : 1024;
			b->t = realloc(b->t, b->cap * sizeof(uint32_t));
		}
		b->t[b->n++] = *p;
	}
}

static void push_ids(struct tokbuf *b, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (b->n == b->cap) {
			b->cap = b->cap ? b->cap * 2 : 1024;
			b->t = realloc(b->t, b->cap * sizeof(uint32_t));
		}
		b->t[b->n++] = ids[i];
	}
}

/* Replies of earlier turns, one line each ("id id id"), as a chat client
 * resends them. */
static int read_replies(const char *path, uint32_t **replies, size_t turns, uint32_t max_new)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return turns == 0 ? 0 : -1;
	char line[1 << 16];
	for (size_t t = 0; t < turns; t++) {
		if (!fgets(line, sizeof(line), f)) {
			fclose(f);
			return -1;
		}
		/* exactly max_new ids, one space apart, as this program writes them */
		line[strcspn(line, "\n")] = '\0';
		char *p = line;
		for (uint32_t i = 0; i < max_new; i++) {
			char *next = strchr(p, ' ');
			if (next)
				*next++ = '\0';
			uint64_t v;
			/* a space after every id but the last */
			if (units_parse_uint(p, 0, UINT32_MAX, &v) != 0 ||
			    (!next) != (i + 1 == max_new)) {
				fclose(f);
				return -1;
			}
			replies[t][i] = (uint32_t)v;
			p = next;
		}
	}
	fclose(f);
	return 0;
}

/* A numeric flag's value: a whole decimal number from min to max, or -1
 * after saying what the flag takes. */
static int number_flag(const char *flag, const char *val, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v;
	if (units_parse_uint(val, min, max, &v) == 0) {
		*out = v;
		return 0;
	}
	fprintf(stderr, "k3worker: %s takes a whole number from %llu to %llu, not \"%s\"\n", flag,
	        (unsigned long long)min, (unsigned long long)max, val);
	return -1;
}

/* --print-spec: the spec the worker puts, as k3cachectl model add reads it.
 * Returns the exit code. */
static int print_model_spec(const struct k3cache_model *spec)
{
	char *json = model_to_json(spec);
	int rc = json && printf("%s\n", json) >= 0 && fflush(stdout) == 0 ? 0 : 1;
	if (rc)
		fprintf(stderr, "k3worker: --print-spec: %s\n",
		        json ? "cannot write to stdout" : "out of memory");
	free(json);
	return rc;
}

/* The longest reply --max-new allows: a --replies line of that many ids
 * (up to 11 bytes each) fits read_replies' 64 KiB line. */
#define MAX_NEW_LIMIT 4096u

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: k3worker --conversation FILE [--turn K] [--replies FILE] [options]\n"
	        "       k3worker --prompt TEXT [options]\n"
	        "\n"
	        "A reference worker: a tiny real hybrid model (KDA + MLA) that reuses\n"
	        "prefill state through k3cached.\n"
	        "\n"
	        "  --socket ADDR      the daemon (default $K3CACHE_SOCKET or the default socket)\n"
	        "  --no-cache         recompute everything (the reference for identity)\n"
	        "  --model tiny|twin  geometry (default tiny)\n"
	        "  --seed N           weight seed (default 1): another seed is another model\n"
	        "  --salt S           tenant salt\n"
	        "  --chunk N          prefill chunk size (default 64; 0: the prompt at once)\n"
	        "  --max-new N        reply length (default 8, at most 4096)\n"
	        "  --turn K           run only turn K (1-based); earlier replies come from\n"
	        "                     --replies FILE (this turn's reply is appended to it),\n"
	        "                     or without it are regenerated quietly through the cache\n"
	        "  --quiet            no [CACHE] lines for publishes\n"
	        "  --print-spec       print the model spec of --model and --seed (JSON) and\n"
	        "                     exit: what an admin adds, k3cachectl model add FILE,\n"
	        "                     before workers that are not admins can use the cache\n"
	        "FILE: turns separated by blank lines; a first turn starting with \"System:\"\n"
	        "is the system prompt.\n");
}

int main(int argc, char **argv)
{
	enum {
		O_SOCK = 1,
		O_NOCACHE,
		O_MODEL,
		O_SEED,
		O_SALT,
		O_CHUNK,
		O_MAXNEW,
		O_CONV,
		O_TURN,
		O_REPLIES,
		O_PROMPT,
		O_QUIET,
		O_MUTANT,
		O_PRINT_SPEC,
		O_HELP
	};
	static const struct option opts[] = {
	        {"socket", required_argument, NULL, O_SOCK},
	        {"no-cache", no_argument, NULL, O_NOCACHE},
	        {"model", required_argument, NULL, O_MODEL},
	        {"seed", required_argument, NULL, O_SEED},
	        {"salt", required_argument, NULL, O_SALT},
	        {"chunk", required_argument, NULL, O_CHUNK},
	        {"max-new", required_argument, NULL, O_MAXNEW},
	        {"conversation", required_argument, NULL, O_CONV},
	        {"turn", required_argument, NULL, O_TURN},
	        {"replies", required_argument, NULL, O_REPLIES},
	        {"prompt", required_argument, NULL, O_PROMPT},
	        {"quiet", no_argument, NULL, O_QUIET},
	        {"print-spec", no_argument, NULL, O_PRINT_SPEC},
#ifdef K3WORKER_MUTANTS
	        {"mutant", required_argument, NULL, O_MUTANT},
#endif
	        {"help", no_argument, NULL, O_HELP},
	        {NULL, 0, NULL, 0},
	};
	const char *sock = NULL, *geom = "tiny", *conv = NULL, *replies_path = NULL,
	           *prompt_text = NULL;
	struct worker w = {.salt = "", .chunk = 64, .max_new = 8};
	/* --no-cache: the reference; it keeps no live state between turns either */
	int no_cache = 0, print_spec = 0, c;
	uint64_t turn = 0, seed = 1, num;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_SOCK:
			sock = optarg;
			break;
		case O_NOCACHE:
			no_cache = 1;
			w.no_live = 1;
			break;
		case O_MODEL:
			if (!worker_geometry(optarg)) {
				fprintf(stderr, "k3worker: --model is %s, not \"%s\"\n",
				        worker_geometry_choices(), optarg);
				return 2;
			}
			geom = optarg;
			break;
		case O_SEED:
			if (number_flag("--seed", optarg, 0, UINT64_MAX, &seed))
				return 2;
			break;
		case O_SALT:
			w.salt = optarg;
			break;
		case O_CHUNK:
			if (number_flag("--chunk", optarg, 0, UINT32_MAX, &num))
				return 2;
			w.chunk = (uint32_t)num;
			break;
		case O_MAXNEW:
			if (number_flag("--max-new", optarg, 1, MAX_NEW_LIMIT, &num))
				return 2;
			w.max_new = (uint32_t)num;
			break;
		case O_CONV:
			conv = optarg;
			break;
		case O_TURN:
			/* 1-based; 0 stays "every turn", the default */
			if (number_flag("--turn", optarg, 1, UINT32_MAX, &turn))
				return 2;
			break;
		case O_REPLIES:
			replies_path = optarg;
			break;
		case O_PROMPT:
			prompt_text = optarg;
			break;
		case O_QUIET:
			w.quiet = 1;
			break;
		case O_PRINT_SPEC:
			print_spec = 1;
			break;
		case O_MUTANT:
			w.mutant = !strcmp(optarg, "slot") ? 1 : !strcmp(optarg, "row") ? 2 : 0;
			if (!w.mutant) {
				fprintf(stderr, "k3worker: --mutant is slot or row, not \"%s\"\n",
				        optarg);
				return 2;
			}
			break;
		case O_HELP:
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr,
		        "k3worker: unexpected argument \"%s\" (a prompt with spaces is one "
		        "quoted --prompt)\n",
		        argv[optind]);
		return 2;
	}
	if (print_spec && (conv || prompt_text)) {
		fprintf(stderr, "k3worker: --print-spec runs no prompt: give it without "
		                "--conversation and --prompt\n");
		return 2;
	}
	if (!print_spec && !conv && !prompt_text) {
		fprintf(stderr, "k3worker: give --conversation FILE or --prompt TEXT (k3worker "
		                "--help for the rest)\n");
		return 2;
	}
	if (conv && prompt_text) {
		fprintf(stderr,
		        "k3worker: --conversation and --prompt both give the prompt: give one\n");
		return 2;
	}
	struct worker_model *model = worker_model_new(worker_geometry(geom), seed);
	w.m = model;
	w.spec = model ? worker_model_spec(model) : NULL;
	if (!model || !w.spec) {
		fprintf(stderr, "k3worker: out of memory\n");
		return 1;
	}
	if (print_spec) {
		int prc = print_model_spec(w.spec);
		model_free(w.spec);
		worker_model_free(model);
		return prc;
	}
	k3cache_record_init(&w.record);
	if (!no_cache) {
		struct k3cache_error err;
		if (k3cache_connect(sock, &w.cache, &err) != 0) {
			warn(&w, "%s; recomputing without the cache", err.message);
			k3cache_close(w.cache);
			w.cache = NULL;
		} else if (k3cache_put_model(w.cache, w.spec, NULL, &err) != 0) {
			/* a worker that is no admin of a daemon that lacks its model:
			 * say how an admin adds it */
			if (err.code == K3CACHE_DENIED)
				warn(&w,
				     "%s; recomputing without the cache. An admin adds this model "
				     "with: k3worker --model %s --seed %llu --print-spec > "
				     "%s-seed%llu.json && k3cachectl model add %s-seed%llu.json",
				     err.message, geom, (unsigned long long)seed, w.spec->name,
				     (unsigned long long)seed, w.spec->name,
				     (unsigned long long)seed);
			else
				warn(&w, "%s; recomputing without the cache", err.message);
			k3cache_close(w.cache);
			w.cache = NULL;
		}
	}

	int rc = 0;
	struct tokbuf tb = {0};
	uint32_t *reply = calloc(w.max_new, sizeof(uint32_t));
	if (prompt_text) {
		push_text(&tb, prompt_text);
		w.state = worker_state_new(model, tb.n + w.max_new + 1);
		rc = w.state ? run_prompt(&w, tb.t, tb.n, 0, reply) : -1;
	} else {
		struct convo cv;
		if (read_convo(conv, &cv) != 0) {
			rc = -1;
			goto out;
		}
		size_t first = cv.has_system ? 1 : 0, turns = cv.n - first;
		if (turns == 0 || turn > turns) {
			fprintf(stderr, "k3worker: %s has %zu turns\n", conv, turns);
			for (size_t i = 0; i < cv.n; i++)
				free(cv.blocks[i]);
			free(cv.blocks);
			rc = -1;
			goto out;
		}
		size_t lo = turn ? turn - 1 : 0, hi = turn ? turn : turns;
		/* --turn K without --replies: the earlier replies are regenerated
		 * quietly (through the cache), as a client that lost them would */
		size_t shown = lo;
		if (turn && !replies_path)
			lo = 0;
		uint32_t **replies = calloc(turns, sizeof(uint32_t *));
		for (size_t t = 0; t < turns; t++)
			replies[t] = calloc(w.max_new, sizeof(uint32_t));
		if (turn && replies_path &&
		    read_replies(replies_path, replies, lo, w.max_new) != 0) {
			fprintf(stderr,
			        "k3worker: %s lacks the replies of turns 1..%zu (a line of %u "
			        "token "
			        "ids each)\n",
			        replies_path, lo, w.max_new);
			rc = -1;
		}
		/* the state holds the longest transcript */
		size_t total = 0;
		for (size_t i = 0; i < cv.n; i++)
			total += strlen(cv.blocks[i]) + 32 + w.max_new;
		w.state = rc ? NULL : worker_state_new(model, (uint32_t)total + w.max_new + 16);
		for (size_t t = lo; !rc && t < hi; t++) {
			tb.n = 0;
			uint32_t sys_end = 0;
			if (cv.has_system) {
				push_text(&tb, cv.blocks[0]);
				push_text(&tb, "\n");
				sys_end = tb.n;
			}
			for (size_t i = 0; i <= t; i++) {
				push_text(&tb, "User: ");
				push_text(&tb, cv.blocks[first + i]);
				push_text(&tb, "\nAssistant:");
				if (i < t) {
					push_ids(&tb, replies[i], w.max_new);
					push_text(&tb, "\n");
				}
			}
			int silent = t < shown;
			FILE *saved = NULL;
			if (silent) {
				fflush(stdout);
				saved = stdout;
				stdout = fopen("/dev/null", "w");
				if (!stdout) {
					stdout = saved;
					saved = NULL;
				}
			}
			printf("== turn %zu\n", t + 1);
			rc = run_prompt(&w, tb.t, tb.n, sys_end, replies[t]);
			if (!rc)
				publish(&w, w.record.tokens, w.record.n, "end-of-turn");
			if (saved) {
				fclose(stdout);
				stdout = saved;
			}
			if (!rc && replies_path) {
				FILE *f = fopen(replies_path, turn ? "a" : (t == 0 ? "w" : "a"));
				if (f) {
					for (uint32_t i = 0; i < w.max_new; i++)
						fprintf(f, "%s%u", i ? " " : "", replies[t][i]);
					fprintf(f, "\n");
					fclose(f);
				}
			}
		}
		for (size_t t = 0; t < turns; t++)
			free(replies[t]);
		free(replies);
		for (size_t i = 0; i < cv.n; i++)
			free(cv.blocks[i]);
		free(cv.blocks);
	}
	if (!rc && prompt_text)
		publish(&w, w.record.tokens, w.record.n, "end-of-turn");
	if (rc == 0 && getenv("K3WORKER_TIMING"))
		fprintf(stderr, "prefill %.3f s\n", w.prefill_seconds);
out:
	free(reply);
	free(tb.t);
	k3cache_record_free(&w.record);
	k3cache_close(w.cache);
	worker_state_free(w.state);
	model_free(w.spec);
	worker_model_free(model);
	return rc ? 1 : 0;
}
