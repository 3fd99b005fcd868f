/* k3cachectl key --model SPEC --tokens LIST: the entry key of a model,
 * salt and token prefix (DESIGN.md "Prefix key"). Needs no daemon. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "hexutil.h"
#include "model.h"
#include "prefix.h"

static int cmd_key_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                        char **argv)
{
	static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
	                                     {"salt", required_argument, NULL, 's'},
	                                     {"tokens", required_argument, NULL, 't'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {NULL, 0, NULL, 0}};
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
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	if (!model_path || !tokens || optind != argc)
		return ctl_cmd_usage_error(self, "needs --model and --tokens");
	char err[MODEL_ERROR_MAX];
	uint32_t *toks = NULL, n = 0;
	if (ctl_parse_tokens(tokens, &toks, &n, err, sizeof(err)))
		return ctl_cmd_usage_error(self, "%s", err);
	struct k3cache_model *m = model_load_file(model_path, err);
	if (!m) {
		fprintf(stderr, "k3cachectl %s: %s\n", self->name, err);
		free(toks);
		return CTL_EXIT_ERROR;
	}
	uint8_t key[PREFIX_KEY_LEN];
	if (prefix_key(m->fingerprint, salt, strlen(salt), toks, n, key) != 0) {
		fprintf(stderr, "k3cachectl %s: out of memory\n", self->name);
		model_free(m);
		free(toks);
		return CTL_EXIT_ERROR;
	}
	char hex[65];
	hexutil_encode(key, sizeof(key), hex);
	if (json) {
		char fp[65];
		hexutil_encode(m->fingerprint, 32, fp);
		ctl_print_json(stdout, json_pack("{s:s,s:s,s:s,s:i}", "key", hex, "fingerprint", fp,
		                                 "salt", salt, "prefix_len", (int)n));
	} else {
		puts(hex);
	}
	free(toks);
	model_free(m);
	return CTL_EXIT_OK;
}

const struct ctl_cmd_entry ctl_cmd_key_entry = {
        .name = "key",
        .usage = "--model SPEC.json [--salt S] --tokens 1,2,3",
        .help = "print an entry key\n"
                "Prints the 64-hex entry key of the model, salt and token prefix.\n"
                "--tokens takes whole numbers separated by single commas.\n",
        .flags = 0,
        .exec = cmd_key_exec,
};
