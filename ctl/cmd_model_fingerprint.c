/* k3cachectl model fingerprint SPEC.json: a model's fingerprint (SHA-256
 * of its spec, DESIGN.md). Needs no daemon. */
#include <jansson.h>
#include <stdio.h>

#include "cmd.h"
#include "hexutil.h"
#include "model.h"

static int cmd_model_fingerprint_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g,
                                      int argc, char **argv)
{
	int first = 0, rc = ctl_cmd_operands(self, argc, argv, &first);
	if (rc)
		return rc;
	if (argc - first != 1)
		return ctl_cmd_usage_error(self, "expects exactly one SPEC.json");
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_load_file(argv[first], err);
	if (!m) {
		fprintf(stderr, "k3cachectl %s: %s\n", self->name, err);
		return CTL_EXIT_ERROR;
	}
	char hex[65];
	hexutil_encode(m->fingerprint, 32, hex);
	if (g->json)
		ctl_print_json(stdout,
		               json_pack("{s:s,s:s,s:s,s:i}", "fingerprint", hex, "name", m->name,
		                         "revision", m->revision, "layers", (int)m->n_layers));
	else
		puts(hex);
	model_free(m);
	return CTL_EXIT_OK;
}

const struct ctl_cmd_entry ctl_cmd_model_fingerprint_entry = {
        .name = "model fingerprint",
        .usage = "SPEC.json",
        .help = "print a model's fingerprint\n"
                "Prints the model's 64-hex fingerprint (SHA-256 of its spec, DESIGN.md).\n",
        .flags = 0,
        .exec = cmd_model_fingerprint_exec,
};
