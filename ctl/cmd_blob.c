/* k3cachectl blob FILE: a LayerCache blob parsed (tag, counts, seq_len,
 * checksum) and, with --model, validated as one layer of that model. Needs
 * no daemon. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blob.h"
#include "checksum.h"
#include "cmd.h"
#include "model.h"

static int cmd_blob_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                         char **argv)
{
	static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
	                                     {"layer", required_argument, NULL, 'l'},
	                                     {"prefix-len", required_argument, NULL, 'p'},
	                                     {"json", no_argument, NULL, 'j'},
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
				return ctl_cmd_usage_error(self, "--layer takes a whole number");
			have_layer = 1;
			break;
		case 'p':
			if (ctl_parse_u32(optarg, &prefix_len) || prefix_len == BLOB_PREFIX_ANY)
				return ctl_cmd_usage_error(self,
				                           "--prefix-len takes a whole number");
			break;
		case 'j':
			json = 1;
			break;
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	if (optind + 1 != argc)
		return ctl_cmd_usage_error(self, "expects exactly one FILE");
	if (model_path && !have_layer)
		return ctl_cmd_usage_error(self, "--model needs --layer");
	if (prefix_len != BLOB_PREFIX_ANY && !model_path)
		return ctl_cmd_usage_error(self, "--prefix-len needs --model");
	const char *path = argv[optind];

	char err[512];
	struct k3cache_model *model = NULL;
	if (model_path) {
		char merr[MODEL_ERROR_MAX];
		if (!(model = model_load_file(model_path, merr))) {
			fprintf(stderr, "k3cachectl %s: %s\n", self->name, merr);
			return CTL_EXIT_ERROR;
		}
	}
	struct ctl_file f;
	if (ctl_file_open(path, &f, err, sizeof(err))) {
		fprintf(stderr, "k3cachectl %s: %s\n", self->name, err);
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
		ctl_print_json(stdout, doc);
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

const struct ctl_cmd_entry ctl_cmd_blob_entry = {
        .name = "blob",
        .usage = "FILE [--model SPEC.json --layer I [--prefix-len P]]",
        .help = "parse and validate a blob\n"
                "Parses a LayerCache blob and prints its tag, counts, seq_len and\n"
                "checksum (XXH3-64 seeded with --layer, 0 without). With --model it\n"
                "also validates the blob as layer I of that model (slot, shape,\n"
                "seq_len == --prefix-len when given, finiteness).\n"
                "Exit 0 when valid, 1 when not, 2 on a usage error.\n",
        .flags = 0,
        .exec = cmd_blob_exec,
};
