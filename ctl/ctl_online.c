/* The k3cachectl commands that talk to a daemon (or read a store with --db):
 * ping, ls, inspect, evict, verify, models, model add (stat: ctl_stat.c). */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blob.h"
#include "checksum.h"
#include "ctl.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "model.h"
#include "service.h"
#include "units.h"

static int usage(const char *cmd, const char *msg, const char *text)
{
	fprintf(stderr, "k3cachectl %s: %s\nusage: %s\n", cmd, msg, text);
	return CTL_EXIT_USAGE;
}

static void print_json(json_t *doc)
{
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (s)
		puts(s);
	free(s);
	json_decref(doc);
}

static json_t *hexj(const uint8_t *b, size_t len)
{
	char h[129];
	hexutil_encode(b, len < 64 ? len : 64, h);
	return json_string(h);
}

static void fmt_time(uint64_t t, char *out, size_t outsz)
{
	time_t tt = (time_t)t;
	struct tm tm;
	gmtime_r(&tt, &tm);
	strftime(out, outsz, "%Y-%m-%d %H:%M:%SZ", &tm);
}

/* Parses the common "--help" and "--json" of a command with no other options.
 * Returns -1 to go on, or an exit code. */
static int simple_opts(int argc, char **argv, int *json, const char *cmd, const char *text,
                       const char *help)
{
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {NULL, 0, NULL, 0}};
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'j') {
			*json = 1;
		} else if (c == 'h') {
			printf("usage: %s\n%s", text, help);
			return CTL_EXIT_OK;
		} else {
			return usage(cmd, "unknown option", text);
		}
	}
	if (optind != argc)
		return usage(cmd, "unexpected argument", text);
	return -1;
}

/* ---- ping ------------------------------------------------------------------ */

int ctl_cmd_ping(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH | --db DIR] [--json] ping";
	int json = g->json;
	int rc = simple_opts(argc, argv, &json, "ping", text,
	                     "Checks that the daemon answers (or that --db opens). Exit 3 when "
	                     "it cannot be reached.\n");
	if (rc >= 0)
		return rc;
	struct ctl_backend b;
	if ((rc = ctl_backend_open(g, &b, "ping")) != 0)
		return rc;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char server[128] = "store";
	if (b.conn) {
		struct k3cache_error err;
		if (k3cache_hello(b.conn, server, sizeof(server), &err) != 0) {
			fprintf(stderr, "k3cachectl ping: %s\n", err.message);
			ctl_backend_close(&b);
			return err.unreachable ? CTL_EXIT_NODAEMON : CTL_EXIT_ERROR;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	if (json)
		print_json(json_pack("{s:b,s:s,s:s,s:f}", "ok", 1, "server", server, "at", b.where,
		                     "ms", ms));
	else
		printf("PONG from %s at %s in %.2f ms\n", server, b.where, ms);
	ctl_backend_close(&b);
	return CTL_EXIT_OK;
}

/* ---- models ---------------------------------------------------------------- */

/* Fetches every model spec. Returns 0 or an exit code; *resp must be freed. */
static int fetch_models(struct ctl_backend *b, frame_response **resp, const char *cmd)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__ListModels lm = K3CACHE__V1__LIST_MODELS__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_LIST_MODELS;
	req.list_models = &lm;
	int rc = ctl_call(b, &req, resp, cmd);
	if (rc)
		return rc;
	if (!*resp)
		return CTL_EXIT_ERROR;
	if ((*resp)->code != 0) {
		rc = ctl_answer_error(*resp, cmd);
		ctl_response_free(b, *resp);
		*resp = NULL;
	}
	return rc;
}

int ctl_cmd_models(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH | --db DIR] [--json] models";
	int json = g->json;
	int rc = simple_opts(argc, argv, &json, "models", text,
	                     "Lists the model specs the store knows, with their fingerprints.\n");
	if (rc >= 0)
		return rc;
	struct ctl_backend b;
	if ((rc = ctl_backend_open(g, &b, "models")) != 0)
		return rc;
	frame_response *resp;
	if ((rc = fetch_models(&b, &resp, "models")) != 0 || !resp) {
		ctl_backend_close(&b);
		return rc;
	}
	json_t *arr = json ? json_array() : NULL;
	if (!json)
		printf("%-24s %-12s %6s %4s %4s  %s\n", "NAME", "REVISION", "LAYERS", "KDA", "MLA",
		       "FINGERPRINT");
	for (size_t i = 0; i < resp->n_models; i++) {
		char err[MODEL_ERROR_MAX], fp[65];
		struct k3cache_model *m = service_spec_from_wire(resp->models[i], err);
		if (!m)
			continue;
		hexutil_encode(m->fingerprint, 32, fp);
		uint32_t kda = 0;
		for (uint32_t l = 0; l < m->n_layers; l++)
			kda += m->layers[l].mixer == MODEL_MIXER_KDA;
		if (json) {
			char *js = model_to_json(m);
			json_t *spec = js ? json_loads(js, 0, NULL) : NULL;
			free(js);
			json_array_append_new(arr,
			                      json_pack("{s:s,s:s,s:i,s:i,s:i,s:s,s:o}", "name",
			                                m->name, "revision", m->revision, "layers",
			                                (int)m->n_layers, "kda", (int)kda, "mla",
			                                (int)(m->n_layers - kda), "fingerprint", fp,
			                                "spec", spec ? spec : json_null()));
		} else {
			printf("%-24s %-12s %6u %4u %4u  %s\n", m->name, m->revision, m->n_layers,
			       kda, m->n_layers - kda, fp);
		}
		model_free(m);
	}
	if (json)
		print_json(arr);
	else
		printf("%zu model%s\n", resp->n_models, resp->n_models == 1 ? "" : "s");
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	return CTL_EXIT_OK;
}

int ctl_cmd_model_add(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH] [--json] model add FILE.json";
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: %s\nStores a model spec in the daemon (idempotent).\n", text);
		return CTL_EXIT_OK;
	}
	if (argc != 2)
		return usage("model add", "expects exactly one FILE.json", text);
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_load_file(argv[1], err);
	if (!m) {
		fprintf(stderr, "k3cachectl model add: %s\n", err);
		return CTL_EXIT_ERROR;
	}
	if (g->db) {
		fprintf(stderr,
		        "k3cachectl model add: changes the store: it needs the daemon (--db "
		        "opens the store read-only)\n");
		model_free(m);
		return CTL_EXIT_ERROR;
	}
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, "model add");
	if (rc) {
		model_free(m);
		return rc;
	}
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__PutModel pm = K3CACHE__V1__PUT_MODEL__INIT;
	pm.model = service_spec_to_wire(m);
	req.op_case = K3CACHE__V1__REQUEST__OP_PUT_MODEL;
	req.put_model = &pm;
	frame_response *resp = NULL;
	rc = pm.model ? ctl_call(&b, &req, &resp, "model add") : CTL_EXIT_ERROR;
	service_free_spec(pm.model);
	if (!rc && resp->code != 0) {
		rc = ctl_answer_error(resp, "model add");
	} else if (!rc) {
		char fp[65];
		hexutil_encode(m->fingerprint, 32, fp);
		if (g->json)
			print_json(json_pack("{s:s,s:s,s:b}", "name", m->name, "fingerprint", fp,
			                     "created", resp->created));
		else
			printf("%s %s (%s)\n", resp->created ? "added" : "exists", fp, m->name);
	}
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	model_free(m);
	return rc;
}

/* ---- ls -------------------------------------------------------------------- */

struct row {
	uint8_t key[32];
	char model[64];
	uint32_t prefix_len, layers;
	uint64_t bytes, stored, hits, created, last_used;
	int quarantined;
	uint8_t fp[32];
	uint32_t salt_len;
};

/* Descending order by one field. */
#define ROW_CMP(name, field)                                                                       \
	static int name(const void *a, const void *b)                                              \
	{                                                                                          \
		const struct row *x = a, *y = b;                                                   \
		return (x->field < y->field) - (x->field > y->field);                              \
	}
ROW_CMP(cmp_used, last_used)
ROW_CMP(cmp_size, bytes)
ROW_CMP(cmp_len, prefix_len)
ROW_CMP(cmp_created, created)
ROW_CMP(cmp_hits, hits)

/* Collects the entries of one model (or all) in pages. */
static int collect_rows(struct ctl_backend *b, const uint8_t *fp, struct row **rows, size_t *n,
                        size_t *cap)
{
	uint8_t after[32];
	int have_after = 0;
	for (;;) {
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		K3cache__V1__List l = K3CACHE__V1__LIST__INIT;
		l.limit = 1000;
		if (fp) {
			l.model.data = (uint8_t *)fp;
			l.model.len = 32;
		}
		if (have_after) {
			l.after.data = after;
			l.after.len = 32;
		}
		req.op_case = K3CACHE__V1__REQUEST__OP_LIST;
		req.list = &l;
		frame_response *resp;
		int rc = ctl_call(b, &req, &resp, "ls");
		if (rc)
			return rc;
		if (resp->code != 0) {
			rc = ctl_answer_error(resp, "ls");
			ctl_response_free(b, resp);
			return rc;
		}
		for (size_t i = 0; i < resp->n_entries; i++) {
			const K3cache__V1__EntryInfo *e = resp->entries[i];
			if (*n == *cap) {
				*cap = *cap ? *cap * 2 : 256;
				struct row *nr = realloc(*rows, *cap * sizeof(**rows));
				if (!nr) {
					ctl_response_free(b, resp);
					return CTL_EXIT_ERROR;
				}
				*rows = nr;
			}
			struct row *r = &(*rows)[(*n)++];
			memset(r, 0, sizeof(*r));
			if (e->key.len == 32)
				memcpy(r->key, e->key.data, 32);
			if (e->model.len == 32)
				memcpy(r->fp, e->model.data, 32);
			snprintf(r->model, sizeof(r->model), "%s", e->model_name);
			r->prefix_len = e->prefix_len;
			r->layers = e->layer_count;
			r->bytes = e->bytes;
			r->stored = e->stored;
			r->hits = e->hits;
			r->created = e->created;
			r->last_used = e->last_used;
			r->quarantined = e->quarantined;
			r->salt_len = (uint32_t)e->salt.len;
		}
		size_t got = resp->n_entries;
		if (got)
			memcpy(after, resp->entries[got - 1]->key.data, 32);
		ctl_response_free(b, resp);
		have_after = 1;
		if (got < 1000)
			return 0;
	}
}

int ctl_cmd_ls(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] =
	        "k3cachectl [--socket PATH | --db DIR] [--json] ls [--model NAME|FP] "
	        "[--sort used|size|len|created|hits] [--limit N]";
	static const struct option opts[] = {
	        {"model", required_argument, NULL, 'm'}, {"sort", required_argument, NULL, 's'},
	        {"limit", required_argument, NULL, 'l'}, {"json", no_argument, NULL, 'j'},
	        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0}};
	const char *model = NULL, *sort = "used";
	uint32_t limit = 0;
	int json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model = optarg;
			break;
		case 's':
			sort = optarg;
			break;
		case 'l':
			if (ctl_parse_u32(optarg, &limit) || !limit)
				return usage("ls", "--limit takes a whole number >= 1", text);
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: %s\nLists entries, most recently used first (or --sort). "
			       "Sizes are blob bytes.\n",
			       text);
			return CTL_EXIT_OK;
		default:
			return usage("ls", "unknown option", text);
		}
	}
	if (optind != argc)
		return usage("ls", "unexpected argument", text);
	int (*cmp)(const void *, const void *) = NULL;
	if (!strcmp(sort, "used"))
		cmp = cmp_used;
	else if (!strcmp(sort, "size"))
		cmp = cmp_size;
	else if (!strcmp(sort, "len"))
		cmp = cmp_len;
	else if (!strcmp(sort, "created"))
		cmp = cmp_created;
	else if (!strcmp(sort, "hits"))
		cmp = cmp_hits;
	else
		return usage("ls", "--sort takes used, size, len, created or hits", text);

	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, "ls");
	if (rc)
		return rc;
	struct row *rows = NULL;
	size_t n = 0, cap = 0;
	if (model) {
		uint8_t fp[32];
		if (strlen(model) == 64 && hexutil_decode(model, fp, 32) == 0) {
			rc = collect_rows(&b, fp, &rows, &n, &cap);
		} else {
			frame_response *models = NULL;
			rc = fetch_models(&b, &models, "ls");
			int found = 0;
			for (size_t i = 0; !rc && models && i < models->n_models; i++) {
				char err[MODEL_ERROR_MAX];
				struct k3cache_model *m =
				        service_spec_from_wire(models->models[i], err);
				if (m && !strcmp(m->name, model)) {
					found = 1;
					rc = collect_rows(&b, m->fingerprint, &rows, &n, &cap);
				}
				model_free(m);
			}
			if (!rc)
				ctl_response_free(&b, models);
			if (!rc && !found) {
				fprintf(stderr,
				        "k3cachectl ls: no model named \"%s\" (see k3cachectl "
				        "models)\n",
				        model);
				rc = CTL_EXIT_NOTFOUND;
			}
		}
	} else {
		rc = collect_rows(&b, NULL, &rows, &n, &cap);
	}
	if (rc) {
		free(rows);
		ctl_backend_close(&b);
		return rc;
	}
	if (n)
		qsort(rows, n, sizeof(*rows), cmp);
	size_t shown = limit && limit < n ? limit : n;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += rows[i].bytes;
	if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < shown; i++) {
			const struct row *r = &rows[i];
			json_array_append_new(
			        arr, json_pack("{s:o,s:s,s:o,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:b,s:i}",
			                       "key", hexj(r->key, 32), "model", r->model,
			                       "fingerprint", hexj(r->fp, 32), "prefix_len",
			                       (int)r->prefix_len, "layers", (int)r->layers,
			                       "bytes", (json_int_t)r->bytes, "stored",
			                       (json_int_t)r->stored, "hits", (json_int_t)r->hits,
			                       "last_used", (json_int_t)r->last_used, "created",
			                       (json_int_t)r->created, "quarantined",
			                       r->quarantined, "salt_len", (int)r->salt_len));
		}
		print_json(json_pack("{s:o,s:I,s:I}", "entries", arr, "total_entries",
		                     (json_int_t)n, "total_bytes", (json_int_t)total));
	} else {
		printf("%-16s %-20s %8s %6s %10s %10s %6s %10s %10s\n", "KEY", "MODEL", "PREFIX",
		       "LAYERS", "SIZE", "OWN", "HITS", "LAST-USED", "CREATED");
		for (size_t i = 0; i < shown; i++) {
			const struct row *r = &rows[i];
			char key[65], size[32], own[32], used[32], created[32];
			hexutil_encode(r->key, 32, key);
			key[16] = 0;
			ctl_size(r->bytes, size, sizeof(size));
			ctl_size(r->stored, own, sizeof(own));
			ctl_ago(r->last_used, used, sizeof(used));
			ctl_ago(r->created, created, sizeof(created));
			printf("%-16s %-20.20s %8u %6u %10s %10s %6" PRIu64 " %10s %10s%s\n", key,
			       r->model, r->prefix_len, r->layers, size, own, r->hits, used,
			       created, r->quarantined ? "  QUARANTINED" : "");
		}
		char tsize[32];
		ctl_size(total, tsize, sizeof(tsize));
		if (shown < n)
			printf("%zu of %zu entries shown; %zu entries, %s in all\n", shown, n, n,
			       tsize);
		else
			printf("%zu entr%s, %s\n", n, n == 1 ? "y" : "ies", tsize);
	}
	free(rows);
	ctl_backend_close(&b);
	return CTL_EXIT_OK;
}

/* ---- inspect --------------------------------------------------------------- */

struct vec_stats {
	double min, max, mean, l2;
	uint64_t nonfinite;
};

static void stats_of(const struct blob_f32vec *v, struct vec_stats *s)
{
	memset(s, 0, sizeof(*s));
	double sum = 0, sq = 0;
	s->min = INFINITY;
	s->max = -INFINITY;
	uint64_t n = 0;
	for (uint32_t i = 0; i < v->count; i++) {
		float f;
		memcpy(&f, v->data + (size_t)i * 4u, 4);
		if (!isfinite(f)) {
			s->nonfinite++;
			continue;
		}
		sum += f;
		sq += (double)f * f;
		s->min = f < s->min ? f : s->min;
		s->max = f > s->max ? f : s->max;
		n++;
	}
	if (!n)
		s->min = s->max = 0;
	s->mean = n ? sum / (double)n : 0;
	s->l2 = sqrt(sq);
}

static json_t *stats_json(const struct vec_stats *s)
{
	return json_pack("{s:f,s:f,s:f,s:f,s:I}", "min", s->min, "max", s->max, "mean", s->mean,
	                 "l2", s->l2, "nonfinite", (json_int_t)s->nonfinite);
}

static void print_tokens(const uint32_t *t, size_t n)
{
	size_t head = n < 8 ? n : 8;
	for (size_t i = 0; i < head; i++)
		printf("%s%u", i ? " " : "", t[i]);
	if (n > 16)
		printf(" ...");
	for (size_t i = n > 16 ? n - 8 : head; i < n; i++)
		printf(" %u", t[i]);
}

int ctl_cmd_inspect(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH | --db DIR] [--json] inspect KEY "
	                           "[--layer I] [--values]";
	static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
	                                     {"values", no_argument, NULL, 'v'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {NULL, 0, NULL, 0}};
	uint32_t only = UINT32_MAX;
	int values = 0, json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			if (ctl_parse_u32(optarg, &only))
				return usage("inspect", "--layer takes a layer index", text);
			break;
		case 'v':
			values = 1;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: %s\nShows one entry and a row per layer (mixer, counts, "
			       "seq_len,\n"
			       "bytes, checksum and whether it verifies). --values adds min, max, "
			       "mean\n"
			       "and L2 norm per vector: a state of zeros or one that exploded "
			       "shows.\n",
			       text);
			return CTL_EXIT_OK;
		default:
			return usage("inspect", "unknown option", text);
		}
	}
	if (optind + 1 != argc)
		return usage("inspect", "expects one KEY", text);
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, "inspect");
	if (rc)
		return rc;
	uint8_t key[32];
	frame_response *resp = NULL;
	struct ctl_layers layers = {0};
	struct k3cache_model *spec = NULL;
	if ((rc = ctl_resolve_key(&b, argv[optind], key, "inspect")) != 0)
		goto out;
	if ((rc = ctl_inspect_entry(&b, key, &resp, "inspect")) != 0)
		goto out;
	const K3cache__V1__EntryInfo *e = resp->entries[0];
	if (only != UINT32_MAX && only >= e->n_layers) {
		fprintf(stderr, "k3cachectl inspect: --layer %u: the entry has %zu layers\n", only,
		        e->n_layers);
		rc = CTL_EXIT_USAGE;
		goto out;
	}
	spec = e->model.len == 32 ? ctl_model_spec(&b, e->model.data, "inspect") : NULL;
	/* the bytes, to say whether each layer verifies (a quarantined entry is
	 * not served: its layers are reported unverified) */
	int have_bytes = 0;
	if (!e->quarantined) {
		struct ctl_backend *bb = &b;
		have_bytes = ctl_fetch_layers(bb, key, &layers, "inspect") == 0 &&
		             layers.n == e->n_layers;
	}

	char keyhex[65], fphex[65], size[32];
	hexutil_encode(key, 32, keyhex);
	hexutil_encode(e->model.data, 32, fphex);
	ctl_size(e->bytes, size, sizeof(size));
	json_t *doc = NULL, *jl = NULL;
	if (json) {
		json_t *toks = json_array();
		for (size_t i = 0; i < e->n_tokens; i++)
			json_array_append_new(toks, json_integer(e->tokens[i]));
		doc = json_pack("{s:s,s:s,s:s,s:o,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:o}", "key",
		                keyhex, "model", e->model_name, "fingerprint", fphex, "salt",
		                hexj(e->salt.data, e->salt.len), "prefix_len", (int)e->prefix_len,
		                "bytes", (json_int_t)e->bytes, "stored", (json_int_t)e->stored,
		                "mla_rows", (json_int_t)e->mla_rows, "shared_rows",
		                (json_int_t)e->shared_rows, "created", (json_int_t)e->created,
		                "last_used", (json_int_t)e->last_used, "hits", (json_int_t)e->hits,
		                "quarantined", e->quarantined, "tokens", toks);
		jl = json_array();
	} else {
		char created[64], used[64], ago1[32], ago2[32];
		fmt_time(e->created, created, sizeof(created));
		fmt_time(e->last_used, used, sizeof(used));
		ctl_ago(e->created, ago1, sizeof(ago1));
		ctl_ago(e->last_used, ago2, sizeof(ago2));
		printf("key          %s\n", keyhex);
		printf("model        %s\n", e->model_name);
		printf("fingerprint  %s\n", fphex);
		if (e->salt.len) {
			char salthex[129];
			hexutil_encode(e->salt.data, e->salt.len < 64 ? e->salt.len : 64, salthex);
			printf("salt         %zu bytes, %.16s%s\n", e->salt.len, salthex,
			       e->salt.len > 8 ? "..." : "");
		} else {
			printf("salt         (none)\n");
		}
		printf("prefix       %u tokens: ", e->prefix_len);
		print_tokens(e->tokens, e->n_tokens);
		char own[32];
		ctl_size(e->stored, own, sizeof(own));
		printf("\nsize         %s in %zu layers; %s in its own chunks\n", size, e->n_layers,
		       own);
		if (e->mla_rows)
			printf("mla rows     %" PRIu64 " of %" PRIu64 " in shared blocks (%" PRIu64
			       "%%)\n",
			       e->shared_rows, e->mla_rows, e->shared_rows * 100 / e->mla_rows);
		printf("created      %s (%s)\n", created, ago1);
		printf("last used    %s (%s)\n", used, ago2);
		printf("hits         %" PRIu64 "\n", e->hits);
		printf("state        %s\n",
		       e->quarantined ? "QUARANTINED (a checksum failed; evict it)" : "served");
		printf("\n%5s %-5s %10s %10s %8s %10s %-16s %s\n", "LAYER", "MIXER", "CONV|K",
		       "REC|V", "SEQ_LEN", "BYTES", "XXH3", "VERIFIES");
	}
	int damaged = 0;
	for (size_t i = 0; i < e->n_layers; i++) {
		if (only != UINT32_MAX && i != only)
			continue;
		const K3cache__V1__LayerInfo *li = e->layers[i];
		const char *verdict = "not checked";
		char why[BLOB_MESSAGE_MAX + 32] = "";
		struct blob_view v = {0};
		int parsed = 0;
		if (have_bytes) {
			struct blob_error berr;
			parsed = blob_parse(layers.data[i], layers.size[i], &v, &berr) == BLOB_OK;
			if (checksum_blob(layers.data[i], layers.size[i], (uint32_t)i) !=
			    li->xxh3) {
				verdict = "NO";
				snprintf(why, sizeof(why), "checksum mismatch");
			} else if (!spec) {
				verdict = parsed ? "checksum ok (model unknown)" : "NO";
			} else if (blob_check(layers.data[i], layers.size[i], spec, (uint32_t)i,
			                      e->prefix_len, &berr) != BLOB_OK) {
				verdict = "NO";
				snprintf(why, sizeof(why), "%s (%s)", berr.message,
				         blob_class_name(berr.cls));
			} else {
				verdict = "yes";
			}
			damaged |= !strcmp(verdict, "NO");
		}
		char sum[17];
		snprintf(sum, sizeof(sum), "%016" PRIx64, li->xxh3);
		const char *mixer = li->mixer == K3CACHE__V1__MIXER__MIXER_KDA ? "KDA" : "MLA";
		struct vec_stats s0, s1;
		if (values && parsed) {
			stats_of(&v.v0, &s0);
			stats_of(&v.v1, &s1);
		}
		if (json) {
			json_t *row = json_pack("{s:i,s:s,s:I,s:s,s:s}", "index", (int)i, "mixer",
			                        mixer, "bytes", (json_int_t)li->size, "xxh3", sum,
			                        "verifies", verdict);
			if (why[0])
				json_object_set_new(row, "problem", json_string(why));
			if (parsed) {
				const char *n0 = v.tag == BLOB_TAG_KDA ? "conv" : "k";
				const char *n1 = v.tag == BLOB_TAG_KDA ? "recurrent" : "v";
				json_object_set_new(row, n0, json_integer(v.v0.count));
				json_object_set_new(row, n1, json_integer(v.v1.count));
				if (v.tag == BLOB_TAG_MLA)
					json_object_set_new(row, "seq_len",
					                    json_integer(v.seq_len));
				if (values) {
					char k0[32], k1[32];
					snprintf(k0, sizeof(k0), "%s_values", n0);
					snprintf(k1, sizeof(k1), "%s_values", n1);
					json_object_set_new(row, k0, stats_json(&s0));
					json_object_set_new(row, k1, stats_json(&s1));
				}
			}
			json_array_append_new(jl, row);
		} else {
			char c0[16] = "-", c1[16] = "-", sl[16] = "-";
			if (parsed) {
				snprintf(c0, sizeof(c0), "%u", v.v0.count);
				snprintf(c1, sizeof(c1), "%u", v.v1.count);
				if (v.tag == BLOB_TAG_MLA)
					snprintf(sl, sizeof(sl), "%u", v.seq_len);
			}
			printf("%5zu %-5s %10s %10s %8s %10" PRIu64 " %-16s %s%s%s\n", i, mixer, c0,
			       c1, sl, li->size, sum, verdict, why[0] ? ": " : "", why);
			if (values && parsed) {
				const char *n0 = v.tag == BLOB_TAG_KDA ? "conv" : "k";
				const char *n1 = v.tag == BLOB_TAG_KDA ? "recurrent" : "v";
				printf("      %-10s min %-12.6g max %-12.6g mean %-12.6g L2 "
				       "%-12.6g%s\n",
				       n0, s0.min, s0.max, s0.mean, s0.l2,
				       s0.nonfinite ? " NONFINITE" : "");
				printf("      %-10s min %-12.6g max %-12.6g mean %-12.6g L2 "
				       "%-12.6g%s\n",
				       n1, s1.min, s1.max, s1.mean, s1.l2,
				       s1.nonfinite ? " NONFINITE" : "");
			}
		}
	}
	if (json) {
		json_object_set_new(doc, "layers", jl);
		print_json(doc);
	}
	rc = damaged ? CTL_EXIT_ERROR : CTL_EXIT_OK;
out:
	ctl_layers_free(&layers);
	model_free(spec);
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	return rc;
}

/* ---- evict ----------------------------------------------------------------- */

int ctl_cmd_evict(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] =
	        "k3cachectl [--socket PATH | --db DIR] [--json] evict KEY... | --model NAME|FP | "
	        "--idle DURATION | --to-size SIZE | --all [--dry-run] [--yes]";
	static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
	                                     {"idle", required_argument, NULL, 'i'},
	                                     {"to-size", required_argument, NULL, 's'},
	                                     {"all", no_argument, NULL, 'a'},
	                                     {"dry-run", no_argument, NULL, 'n'},
	                                     {"yes", no_argument, NULL, 'y'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {NULL, 0, NULL, 0}};
	const char *model = NULL;
	uint64_t idle = 0, to_size = 0;
	int have_idle = 0, have_size = 0, all = 0, dry = 0, yes = 0, json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model = optarg;
			break;
		case 'i':
			if (units_parse_duration(optarg, &idle) || !idle)
				return usage("evict", "--idle takes a duration such as 30m or 2d",
				             text);
			have_idle = 1;
			break;
		case 's':
			if (units_parse_size(optarg, &to_size))
				return usage("evict", "--to-size takes a size such as 10GiB", text);
			have_size = 1;
			break;
		case 'a':
			all = 1;
			break;
		case 'n':
			dry = 1;
			break;
		case 'y':
			yes = 1;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: %s\nEvicts by exactly one selector. --dry-run lists what "
			       "would go.\n"
			       "--to-size evicts least recently used first. --all asks on a "
			       "terminal\n"
			       "unless --yes; without a terminal on stdin it needs --yes.\n",
			       text);
			return CTL_EXIT_OK;
		default:
			return usage("evict", "unknown option", text);
		}
	}
	int nkeys = argc - optind;
	int selectors = (nkeys > 0) + (model != NULL) + have_idle + have_size + all;
	if (selectors != 1)
		return usage("evict",
		             "give exactly one of KEY..., --model, --idle, --to-size, --all", text);
	if (have_size && to_size == 0)
		return usage("evict", "--to-size 0 is --all", text);
	if (all && !yes && !dry) {
		/* nobody at a terminal to ask (a script, a pipe, cron): the
		 * command line itself must say so */
		if (!isatty(0))
			return usage("evict",
			             "--all evicts every entry and stdin is not a terminal to "
			             "confirm on: add --yes",
			             text);
		fprintf(stderr, "Evict every entry? Type 'yes' to go on: ");
		char line[16] = "";
		if (!fgets(line, sizeof(line), stdin) || strncmp(line, "yes", 3) != 0) {
			fprintf(stderr, "nothing evicted\n");
			return CTL_EXIT_ERROR;
		}
	}
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, "evict");
	if (rc)
		return rc;
	uint8_t(*keys)[32] = nkeys ? calloc((size_t)nkeys, 32) : NULL;
	ProtobufCBinaryData *kb = nkeys ? calloc((size_t)nkeys, sizeof(*kb)) : NULL;
	uint8_t fp[32];
	frame_response *resp = NULL;
	for (int i = 0; i < nkeys; i++) {
		if ((rc = ctl_resolve_key(&b, argv[optind + i], keys[i], "evict")) != 0)
			goto out;
		kb[i].data = keys[i];
		kb[i].len = 32;
	}
	if (model) {
		if (!(strlen(model) == 64 && hexutil_decode(model, fp, 32) == 0)) {
			frame_response *models = NULL;
			if ((rc = fetch_models(&b, &models, "evict")) != 0 || !models)
				goto out;
			int found = 0;
			for (size_t i = 0; i < models->n_models; i++) {
				char err[MODEL_ERROR_MAX];
				struct k3cache_model *m =
				        service_spec_from_wire(models->models[i], err);
				if (m && !strcmp(m->name, model)) {
					memcpy(fp, m->fingerprint, 32);
					found++;
				}
				model_free(m);
			}
			ctl_response_free(&b, models);
			if (found != 1) {
				fprintf(stderr,
				        "k3cachectl evict: %s model named \"%s\"; give its "
				        "fingerprint\n",
				        found ? "more than one" : "no", model);
				rc = found ? CTL_EXIT_ERROR : CTL_EXIT_NOTFOUND;
				goto out;
			}
		}
	}
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict ev = K3CACHE__V1__EVICT__INIT;
	ev.keys = kb;
	ev.n_keys = (size_t)nkeys;
	if (model) {
		ev.model.data = fp;
		ev.model.len = 32;
	}
	ev.idle_seconds = idle;
	ev.to_bytes = to_size;
	ev.all = all;
	ev.dry_run = dry;
	req.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	if ((rc = ctl_call(&b, &req, &resp, "evict")) != 0)
		goto out;
	if (resp->code != 0) {
		rc = ctl_answer_error(resp, "evict");
		goto out;
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < resp->n_entries; i++)
		bytes += resp->entries[i]->bytes;
	char size[32];
	ctl_size(bytes, size, sizeof(size));
	if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < resp->n_entries; i++)
			json_array_append_new(arr, json_pack("{s:o,s:I}", "key",
			                                     hexj(resp->entries[i]->key.data, 32),
			                                     "bytes",
			                                     (json_int_t)resp->entries[i]->bytes));
		print_json(json_pack("{s:b,s:I,s:I,s:o}", "dry_run", dry, "entries",
		                     (json_int_t)resp->n_entries, "bytes", (json_int_t)bytes,
		                     "evicted", arr));
	} else {
		for (size_t i = 0; i < resp->n_entries; i++) {
			char k[65], s[32];
			hexutil_encode(resp->entries[i]->key.data, 32, k);
			ctl_size(resp->entries[i]->bytes, s, sizeof(s));
			printf("%s %.16s  %s\n", dry ? "would evict" : "evicted", k, s);
		}
		printf("%s %zu entr%s, %s%s\n", dry ? "would evict" : "evicted", resp->n_entries,
		       resp->n_entries == 1 ? "y" : "ies", size,
		       dry ? " (dry run: nothing changed)" : " freed");
	}
out:
	ctl_response_free(&b, resp);
	free(keys);
	free(kb);
	ctl_backend_close(&b);
	return rc;
}

/* ---- verify ---------------------------------------------------------------- */

int ctl_cmd_verify(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH | --db DIR] [--json] verify";
	int json = g->json;
	int rc = simple_opts(argc, argv, &json, "verify", text,
	                     "Re-checks every entry's chunks and layer checksums. Damaged entries\n"
	                     "are quarantined (not with --db). Exit 1 if anything is damaged.\n");
	if (rc >= 0)
		return rc;
	struct ctl_backend b;
	if ((rc = ctl_backend_open(g, &b, "verify")) != 0)
		return rc;
	if (!json && ctl_is_tty()) {
		fprintf(stderr, "verifying every entry of %s ...", b.where);
		fflush(stderr);
	}
	if (b.conn)
		k3cache_set_timeout(b.conn, 0); /* a large store takes a while */
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Verify v = K3CACHE__V1__VERIFY__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
	req.verify = &v;
	frame_response *resp;
	if ((rc = ctl_call(&b, &req, &resp, "verify")) != 0) {
		ctl_backend_close(&b);
		return rc;
	}
	if (!json && ctl_is_tty())
		fprintf(stderr, "\r");
	if (resp->code != 0) {
		rc = ctl_answer_error(resp, "verify");
	} else if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < resp->n_damaged; i++)
			json_array_append_new(
			        arr, resp->damaged[i]->key.len == 32
			                     ? json_pack("{s:o,s:s}", "key",
			                                 hexj(resp->damaged[i]->key.data, 32),
			                                 "why", resp->damaged[i]->why)
			                     : json_pack("{s:n,s:s}", "key", "why",
			                                 resp->damaged[i]->why));
		print_json(json_pack("{s:I,s:I,s:o}", "checked", (json_int_t)resp->checked,
		                     "damaged", (json_int_t)resp->n_damaged, "entries", arr));
	} else {
		size_t blocks = 0;
		for (size_t i = 0; i < resp->n_damaged; i++) {
			if (resp->damaged[i]->key.len != 32) { /* blocks, indexes */
				printf("STORE    %s\n", resp->damaged[i]->why);
				blocks++;
				continue;
			}
			char k[65];
			hexutil_encode(resp->damaged[i]->key.data, 32, k);
			printf("DAMAGED %.16s  %s\n", k, resp->damaged[i]->why);
		}
		printf("verified %" PRIu64 " entr%s: %zu damaged", resp->checked,
		       resp->checked == 1 ? "y" : "ies", resp->n_damaged - blocks);
		if (blocks)
			printf(", %zu problem%s with the shared blocks or the indexes", blocks,
			       blocks == 1 ? "" : "s");
		printf("\n");
	}
	if (!rc && resp->n_damaged)
		rc = CTL_EXIT_ERROR;
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	return rc;
}
