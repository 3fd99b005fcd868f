/* k3cachectl ls: the entries, most recently used first (or --sort), in
 * pages of the store's List. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "hexutil.h"

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

/* Collects the entries of one model (or all) in pages; a listing of the
 * second tier that is not whole says why in partial. */
static int collect_rows(struct ctl_backend *b, const uint8_t *fp, int tier2, struct row **rows,
                        size_t *n, size_t *cap, char *partial, size_t partial_sz)
{
	uint8_t after[32];
	int have_after = 0;
	for (;;) {
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		K3cache__V1__List l = K3CACHE__V1__LIST__INIT;
		l.limit = tier2 ? 0 : 1000; /* the cluster's entries come in one page */
		l.tier2 = tier2;
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
		int rc = ctl_call_ok(b, &req, &resp, "ls");
		if (rc)
			return rc;
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
		if (tier2 && resp->message && resp->message[0] && !partial[0])
			snprintf(partial, partial_sz, "%s", resp->message);
		size_t got = resp->n_entries;
		if (got)
			memcpy(after, resp->entries[got - 1]->key.data, 32);
		ctl_response_free(b, resp);
		have_after = 1;
		if (got < 1000 || tier2)
			return 0;
	}
}

static int cmd_ls_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                       char **argv)
{
	static const struct option opts[] = {
	        {"model", required_argument, NULL, 'm'}, {"sort", required_argument, NULL, 's'},
	        {"limit", required_argument, NULL, 'l'}, {"json", no_argument, NULL, 'j'},
	        {"tier2", no_argument, NULL, 't'},       {NULL, 0, NULL, 0}};
	const char *model = NULL, *sort = NULL;
	int tier2 = 0;
	uint32_t limit = 0;
	int json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			tier2 = 1;
			break;
		case 'm':
			model = optarg;
			break;
		case 's':
			sort = optarg;
			break;
		case 'l':
			if (ctl_parse_u32(optarg, &limit) || !limit)
				return ctl_cmd_usage_error(self,
				                           "--limit takes a whole number >= 1");
			break;
		case 'j':
			json = 1;
			break;
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	if (optind != argc)
		return ctl_cmd_usage_error(self, "unexpected argument");
	int (*cmp)(const void *, const void *) = NULL;
	if (tier2 && g->db)
		return ctl_cmd_usage_error(self,
		                           "--tier2 asks the daemon's second tier: not with --db");
	/* the cluster keeps no uses, hits or times: longest first there */
	if (!sort)
		sort = tier2 ? "len" : "used";
	if (tier2 && strcmp(sort, "len") != 0 && strcmp(sort, "size") != 0)
		return ctl_cmd_usage_error(
		        self, "with --tier2, --sort takes len or size (the cluster keeps no uses, "
		              "hits or times)");
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
		return ctl_cmd_usage_error(self, "--sort takes used, size, len, created or hits");

	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, self->name);
	if (rc)
		return rc;
	struct row *rows = NULL;
	size_t n = 0, cap = 0;
	char partial[512] = ""; /* --tier2: why the listing is not whole */
	if (model) {
		uint8_t(*fps)[32];
		size_t nfp;
		int unlisted = 0;
		rc = ctl_models_named(&b, model, &unlisted, &fps, &nfp, self->name);
		for (size_t i = 0; !rc && i < nfp; i++)
			rc = collect_rows(&b, fps[i], tier2, &rows, &n, &cap, partial,
			                  sizeof(partial));
		free(fps);
		if (!rc && !nfp) {
			fprintf(stderr,
			        "k3cachectl ls: no model named \"%s\" (see k3cachectl models)\n",
			        model);
			rc = CTL_EXIT_NOTFOUND;
		} else if (!rc && unlisted && !n) {
			fprintf(stderr,
			        "k3cachectl ls: no model has fingerprint %s, and no entry "
			        "(see k3cachectl models)\n",
			        model);
			rc = CTL_EXIT_NOTFOUND;
		}
	} else {
		rc = collect_rows(&b, NULL, tier2, &rows, &n, &cap, partial, sizeof(partial));
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
	if (json && tier2) {
		json_t *arr = json_array();
		for (size_t i = 0; i < shown; i++) {
			const struct row *r = &rows[i];
			json_array_append_new(
			        arr,
			        json_pack("{s:o,s:s,s:o,s:i,s:i,s:I,s:i}", "key",
			                  ctl_hex_json(r->key, 32), "model", r->model,
			                  "fingerprint", ctl_hex_json(r->fp, 32), "prefix_len",
			                  (int)r->prefix_len, "layers", (int)r->layers, "bytes",
			                  (json_int_t)r->bytes, "salt_len", (int)r->salt_len));
		}
		json_t *o = json_pack("{s:o,s:I,s:I}", "entries", arr, "total_entries",
		                      (json_int_t)n, "total_bytes", (json_int_t)total);
		if (partial[0])
			json_object_set_new(o, "incomplete", json_string(partial));
		ctl_print_json(stdout, o);
	} else if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < shown; i++) {
			const struct row *r = &rows[i];
			json_array_append_new(
			        arr, json_pack("{s:o,s:s,s:o,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:b,s:i}",
			                       "key", ctl_hex_json(r->key, 32), "model", r->model,
			                       "fingerprint", ctl_hex_json(r->fp, 32), "prefix_len",
			                       (int)r->prefix_len, "layers", (int)r->layers,
			                       "bytes", (json_int_t)r->bytes, "stored",
			                       (json_int_t)r->stored, "hits", (json_int_t)r->hits,
			                       "last_used", (json_int_t)r->last_used, "created",
			                       (json_int_t)r->created, "quarantined",
			                       r->quarantined, "salt_len", (int)r->salt_len));
		}
		ctl_print_json(stdout, json_pack("{s:o,s:I,s:I}", "entries", arr, "total_entries",
		                                 (json_int_t)n, "total_bytes", (json_int_t)total));
	} else if (tier2) {
		printf("%-16s %-20s %8s %6s %10s\n", "KEY", "MODEL", "PREFIX", "LAYERS", "SIZE");
		for (size_t i = 0; i < shown; i++) {
			const struct row *r = &rows[i];
			char key[65], size[32];
			hexutil_encode(r->key, 32, key);
			key[16] = 0;
			ctl_size(r->bytes, size, sizeof(size));
			printf("%-16s %-20.20s %8u %6u %10s\n", key, r->model, r->prefix_len,
			       r->layers, size);
		}
		char tsize[32];
		ctl_size(total, tsize, sizeof(tsize));
		if (shown < n)
			printf("%zu of %zu entries shown; ", shown, n);
		printf("%zu entr%s in the cluster, %s whole (shared MLA parts counted in each)\n",
		       n, n == 1 ? "y" : "ies", tsize);
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
	if (partial[0]) {
		fprintf(stderr, "k3cachectl ls: the listing is not whole: %s\n", partial);
		return CTL_EXIT_ERROR;
	}
	return CTL_EXIT_OK;
}

const struct ctl_cmd_entry ctl_cmd_ls_entry = {
        .name = "ls",
        .usage = "[--model NAME|FP] [--sort used|size|len|created|hits] [--limit N] [--tier2]",
        .help = "the entries, most recently used first\n"
                "Lists entries, most recently used first (or --sort). Sizes are blob bytes;\n"
                "OWN is what an entry holds in its own chunks, not shared with others.\n"
                "--tier2 lists what the daemon's second tier (k3cached --tier2) holds in the\n"
                "Redis Cluster instead: of its namespace, the model's (--model) or all;\n"
                "hits and times are not kept there. When a master does not answer, the\n"
                "others' entries are listed and the reason goes to stderr (exit 1).\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_ls_exec,
};
