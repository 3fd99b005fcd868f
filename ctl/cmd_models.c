/* k3cachectl models: the model specs the store knows, with their
 * fingerprints. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd.h"
#include "hexutil.h"
#include "model.h"
#include "service.h"

static int cmd_models_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                           char **argv)
{
	int json;
	struct ctl_backend b;
	int rc = ctl_cmd_open(self, g, argc, argv, &json, &b);
	if (rc)
		return rc;
	frame_response *resp;
	if ((rc = ctl_fetch_models(&b, &resp, self->name)) != 0 || !resp) {
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
		ctl_print_json(stdout, arr);
	else
		printf("%zu model%s\n", resp->n_models, resp->n_models == 1 ? "" : "s");
	/* an answer that leaves damaged specs out says so: not the whole list */
	rc = CTL_EXIT_OK;
	if (resp->message && *resp->message) {
		fprintf(stderr, "k3cachectl %s: the list is not whole: %s\n", self->name,
		        resp->message);
		rc = CTL_EXIT_ERROR;
	}
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_models_entry = {
        .name = "models",
        .usage = "",
        .help = "the model specs stored\n"
                "Lists the model specs the store knows, with their fingerprints.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_models_exec,
};
