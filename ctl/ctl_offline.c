/* The k3cachectl commands that need no daemon: blob, model fingerprint, key. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "checksum.h"
#include "ctl.h"
#include "hexutil.h"
#include "model.h"
#include "prefix.h"

static int usage_error(const char *cmd, const char *msg, const char *usage)
{
	fprintf(stderr, "k3cachectl %s: %s\nusage: %s\n", cmd, msg, usage);
	return CTL_EXIT_USAGE;
}

static const char blob_usage[] =
        "k3cachectl [--json] blob FILE [--model SPEC.json --layer I [--prefix-len P]]";

static void print_json(json_t *doc)
{
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (s)
		puts(s);
	free(s);
	json_decref(doc);
}

int ctl_cmd_blob(const struct ctl_globals *g, int argc, char **argv)
{
	static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
	                                     {"layer", required_argument, NULL, 'l'},
	                                     {"prefix-len", required_argument, NULL, 'p'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {NULL, 0, NULL, 0}};
	const char *model_path = NULL;
	uint32_t layer = 0, prefix_len = BLOB_PREFIX_ANY;
	int have_layer = 0, json = g->json, c;
	optind = 0; /* 0: GNU getopt re-initialises, permuting again */
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model_path = optarg;
			break;
		case 'l':
			if (ctl_parse_u32(optarg, &layer))
				return usage_error("blob", "--layer takes a whole number",
				                   blob_usage);
			have_layer = 1;
			break;
		case 'p':
			if (ctl_parse_u32(optarg, &prefix_len) || prefix_len == BLOB_PREFIX_ANY)
				return usage_error("blob", "--prefix-len takes a whole number",
				                   blob_usage);
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: %s\n"
			       "Parses a LayerCache blob and prints its tag, counts, seq_len and\n"
			       "checksum (XXH3-64 seeded with --layer, 0 without). With --model "
			       "it\n"
			       "also validates the blob as layer I of that model (slot, shape,\n"
			       "seq_len == --prefix-len when given, finiteness).\n"
			       "Exit 0 when valid, 1 when not, 2 on a usage error.\n",
			       blob_usage);
			return CTL_EXIT_OK;
		default:
			return usage_error("blob", "unknown option", blob_usage);
		}
	}
	if (optind + 1 != argc)
		return usage_error("blob", "expects exactly one FILE", blob_usage);
	if (model_path && !have_layer)
		return usage_error("blob", "--model needs --layer", blob_usage);
	if (prefix_len != BLOB_PREFIX_ANY && !model_path)
		return usage_error("blob", "--prefix-len needs --model", blob_usage);
	const char *path = argv[optind];

	char err[512];
	struct k3cache_model *model = NULL;
	if (model_path) {
		char merr[MODEL_ERROR_MAX];
		if (!(model = model_load_file(model_path, merr))) {
			fprintf(stderr, "k3cachectl blob: %s\n", merr);
			return CTL_EXIT_ERROR;
		}
	}
	struct ctl_file f;
	if (ctl_file_open(path, &f, err, sizeof(err))) {
		fprintf(stderr, "k3cachectl blob: %s\n", err);
		model_free(model);
		return CTL_EXIT_ERROR;
	}

	struct blob_view v;
	struct blob_error berr = {0};
	enum blob_class rc = blob_parse(f.data, f.size, &v, &berr);
	int parsed = rc == BLOB_OK;
	if (parsed && model)
		rc = blob_validate(&v, model, layer, prefix_len, &berr);
	uint64_t sum = checksum_blob(f.data, f.size, layer);
	char sumhex[17];
	snprintf(sumhex, sizeof(sumhex), "%016" PRIx64, sum);

	const char *n0 = parsed && v.tag == BLOB_TAG_MLA ? "k" : "conv";
	const char *n1 = parsed && v.tag == BLOB_TAG_MLA ? "v" : "recurrent";
	if (json) {
		json_t *doc = json_object();
		json_object_set_new(doc, "file", json_string(path));
		json_object_set_new(doc, "valid", json_boolean(rc == BLOB_OK));
		if (rc != BLOB_OK) {
			json_object_set_new(doc, "class", json_string(blob_class_name(rc)));
			json_object_set_new(doc, "message", json_string(berr.message));
		}
		json_object_set_new(doc, "bytes", json_integer((json_int_t)f.size));
		if (parsed) {
			json_object_set_new(doc, "tag",
			                    json_string(v.tag == BLOB_TAG_KDA ? "kda" : "mla"));
			if (v.tag == BLOB_TAG_MLA)
				json_object_set_new(doc, "seq_len", json_integer(v.seq_len));
			json_object_set_new(doc, n0, json_integer(v.v0.count));
			json_object_set_new(doc, n1, json_integer(v.v1.count));
		}
		json_object_set_new(doc, "layer", json_integer(layer));
		json_object_set_new(doc, "xxh3", json_string(sumhex));
		if (model) {
			json_object_set_new(doc, "model", json_string(model->name));
			if (prefix_len != BLOB_PREFIX_ANY)
				json_object_set_new(doc, "prefix_len", json_integer(prefix_len));
		}
		print_json(doc);
	} else {
		printf("file       %s\n", path);
		printf("bytes      %zu\n", f.size);
		if (parsed) {
			printf("tag        %s (%u)\n", blob_tag_name(v.tag), (unsigned)v.tag);
			if (v.tag == BLOB_TAG_MLA)
				printf("seq_len    %" PRIu32 "\n", v.seq_len);
			printf("%-10s %" PRIu32 " floats\n", n0, v.v0.count);
			printf("%-10s %" PRIu32 " floats\n", n1, v.v1.count);
		}
		printf("xxh3       %s (seed %" PRIu32 ")\n", sumhex, layer);
		if (model)
			printf("model      %s, layer %" PRIu32 " (%s)\n", model->name, layer,
			       layer < model->n_layers
			               ? model_mixer_name(model->layers[layer].mixer)
			               : "no such layer");
		printf("verdict    %s\n",
		       rc == BLOB_OK ? (model ? "valid" : "well-formed") : "invalid");
	}
	if (rc != BLOB_OK)
		fprintf(stderr, "invalid (%s): %s\n", blob_class_name(rc), berr.message);
	ctl_file_close(&f);
	model_free(model);
	return rc == BLOB_OK ? CTL_EXIT_OK : CTL_EXIT_ERROR;
}

static const char model_usage[] = "k3cachectl [--json] model fingerprint SPEC.json";

int ctl_cmd_model(const struct ctl_globals *g, int argc, char **argv)
{
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: %s\n"
		       "Prints the model's 64-hex fingerprint (SHA-256 of its spec, DESIGN.md).\n",
		       model_usage);
		return CTL_EXIT_OK;
	}
	if (argc < 2)
		return usage_error("model", "expects a subcommand", model_usage);
	if (strcmp(argv[1], "fingerprint") != 0)
		return usage_error("model", "unknown subcommand (this build has: fingerprint)",
		                   model_usage);
	if (argc != 3)
		return usage_error("model fingerprint", "expects exactly one SPEC.json",
		                   model_usage);
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_load_file(argv[2], err);
	if (!m) {
		fprintf(stderr, "k3cachectl model fingerprint: %s\n", err);
		return CTL_EXIT_ERROR;
	}
	char hex[65];
	hexutil_encode(m->fingerprint, 32, hex);
	if (g->json) {
		json_t *doc = json_pack("{s:s,s:s,s:s,s:i}", "fingerprint", hex, "name", m->name,
		                        "revision", m->revision, "layers", (int)m->n_layers);
		print_json(doc);
	} else {
		puts(hex);
	}
	model_free(m);
	return CTL_EXIT_OK;
}

static const char key_usage[] =
        "k3cachectl [--json] key --model SPEC.json [--salt S] --tokens 1,2,3";

int ctl_cmd_key(const struct ctl_globals *g, int argc, char **argv)
{
	static const struct option opts[] = {
	        {"model", required_argument, NULL, 'm'},  {"salt", required_argument, NULL, 's'},
	        {"tokens", required_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'},
	        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
	const char *model_path = NULL, *salt = "", *tokens = NULL;
	int json = g->json, c;
	optind = 0; /* 0: GNU getopt re-initialises, permuting again */
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model_path = optarg;
			break;
		case 's':
			salt = optarg;
			break;
		case 't':
			tokens = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: %s\n"
			       "Prints the 64-hex entry key of the model, salt and token prefix.\n",
			       key_usage);
			return CTL_EXIT_OK;
		default:
			return usage_error("key", "unknown option", key_usage);
		}
	}
	if (!model_path || !tokens || optind != argc)
		return usage_error("key", "needs --model and --tokens", key_usage);
	char err[MODEL_ERROR_MAX];
	uint32_t *toks = NULL, n = 0;
	if (ctl_parse_tokens(tokens, &toks, &n, err, sizeof(err)))
		return usage_error("key", err, key_usage);
	struct k3cache_model *m = model_load_file(model_path, err);
	if (!m) {
		fprintf(stderr, "k3cachectl key: %s\n", err);
		free(toks);
		return CTL_EXIT_ERROR;
	}
	uint8_t key[PREFIX_KEY_LEN];
	if (prefix_key(m->fingerprint, salt, strlen(salt), toks, n, key) != 0) {
		fprintf(stderr, "k3cachectl key: out of memory\n");
		model_free(m);
		free(toks);
		return CTL_EXIT_ERROR;
	}
	char hex[65];
	hexutil_encode(key, sizeof(key), hex);
	if (json) {
		char fp[65];
		hexutil_encode(m->fingerprint, 32, fp);
		print_json(json_pack("{s:s,s:s,s:s,s:i}", "key", hex, "fingerprint", fp, "salt",
		                     salt, "prefix_len", (int)n));
	} else {
		puts(hex);
	}
	free(toks);
	model_free(m);
	return CTL_EXIT_OK;
}
