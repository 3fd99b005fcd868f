/* k3cachectl inspect KEY: one entry and a row per layer, each layer's bytes
 * checked (checksum, then as its layer of the model); --values adds each
 * vector's min, max, mean and L2 norm. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blob.h"
#include "checksum.h"
#include "cmd.h"
#include "hexutil.h"
#include "model.h"

static void fmt_time(uint64_t t, char *out, size_t outsz)
{
	time_t tt = (time_t)t;
	struct tm tm;
	gmtime_r(&tt, &tm);
	strftime(out, outsz, "%Y-%m-%d %H:%M:%SZ", &tm);
}

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

static int cmd_inspect_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                            char **argv)
{
	static const struct option opts[] = {{"layer", required_argument, NULL, 'l'},
	                                     {"values", no_argument, NULL, 'v'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {NULL, 0, NULL, 0}};
	uint32_t only = UINT32_MAX;
	int values = 0, json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			if (ctl_parse_u32(optarg, &only))
				return ctl_cmd_usage_error(self, "--layer takes a layer index");
			break;
		case 'v':
			values = 1;
			break;
		case 'j':
			json = 1;
			break;
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	if (optind + 1 != argc)
		return ctl_cmd_usage_error(self, "expects one KEY");
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, self->name);
	if (rc)
		return rc;
	uint8_t key[32];
	frame_response *resp = NULL;
	struct ctl_layers layers = {0};
	struct k3cache_model *spec = NULL;
	if ((rc = ctl_resolve_key(&b, argv[optind], key, self->name)) != 0)
		goto out;
	if ((rc = ctl_inspect_entry(&b, key, &resp, self->name)) != 0)
		goto out;
	const K3cache__V1__EntryInfo *e = resp->entries[0];
	if (only != UINT32_MAX && only >= e->n_layers) {
		fprintf(stderr, "k3cachectl inspect: --layer %u: the entry has %zu layers\n", only,
		        e->n_layers);
		rc = CTL_EXIT_USAGE;
		goto out;
	}
	if (e->model.len == 32 && (rc = ctl_model_spec(&b, e->model.data, &spec, self->name)) != 0)
		goto out;
	/* the bytes, to say whether each layer verifies (a quarantined entry is
	 * not served: its layers are reported unverified). Bytes that cannot be
	 * read (a chunk fails its checksum, the connection breaks) leave the
	 * layers unchecked, and the exit code says so: never 0 */
	int have_bytes = 0, unread = 0;
	if (!e->quarantined) {
		unread = ctl_fetch_layers(&b, key, &layers, 0, self->name);
		if (!unread && layers.n != e->n_layers) {
			fprintf(stderr,
			        "k3cachectl inspect: the entry has %zu layers, %" PRIu32
			        " were sent\n",
			        e->n_layers, layers.n);
			unread = CTL_EXIT_ERROR;
		}
		have_bytes = !unread;
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
		doc = json_pack(
		        "{s:s,s:s,s:s,s:o,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:o}", "key", keyhex,
		        "model", e->model_name, "fingerprint", fphex, "salt",
		        ctl_hex_json(e->salt.data, e->salt.len), "prefix_len", (int)e->prefix_len,
		        "bytes", (json_int_t)e->bytes, "stored", (json_int_t)e->stored, "mla_rows",
		        (json_int_t)e->mla_rows, "shared_rows", (json_int_t)e->shared_rows,
		        "created", (json_int_t)e->created, "last_used", (json_int_t)e->last_used,
		        "hits", (json_int_t)e->hits, "quarantined", e->quarantined, "tokens", toks);
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
		ctl_print_json(stdout, doc);
	}
	rc = unread ? unread : damaged ? CTL_EXIT_ERROR : CTL_EXIT_OK;
out:
	ctl_layers_free(&layers);
	model_free(spec);
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_inspect_entry = {
        .name = "inspect",
        .usage = "KEY [--layer I] [--values]",
        .help = "one entry, layer by layer\n"
                "Shows one entry and a row per layer (mixer, counts, seq_len, bytes,\n"
                "checksum and whether it verifies). --values adds min, max, mean and L2\n"
                "norm per vector: a state of zeros or one that exploded shows. Exit 1 when\n"
                "a layer does not verify.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_inspect_exec,
};
