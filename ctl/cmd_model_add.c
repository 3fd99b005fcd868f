/* k3cachectl model add FILE.json: a model spec stored in the daemon. */
#include <jansson.h>
#include <stdio.h>

#include "cmd.h"
#include "hexutil.h"
#include "model.h"
#include "service.h"

static int cmd_model_add_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g,
                              int argc, char **argv)
{
	int first = 0, rc = ctl_cmd_operands(self, argc, argv, &first);
	if (rc)
		return rc;
	if (argc - first != 1)
		return ctl_cmd_usage_error(self, "expects exactly one FILE.json");
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_load_file(argv[first], err);
	if (!m) {
		fprintf(stderr, "k3cachectl %s: %s\n", self->name, err);
		return CTL_EXIT_ERROR;
	}
	struct ctl_backend b;
	rc = ctl_backend_open(g, &b, self->name);
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
	rc = pm.model ? ctl_call(&b, &req, &resp, self->name) : CTL_EXIT_ERROR;
	service_free_spec(pm.model);
	if (!rc && resp->code != 0) {
		rc = ctl_answer_error(resp, self->name);
	} else if (!rc) {
		char fp[65];
		hexutil_encode(m->fingerprint, 32, fp);
		if (g->json)
			ctl_print_json(stdout,
			               json_pack("{s:s,s:s,s:b}", "name", m->name, "fingerprint",
			                         fp, "created", resp->created));
		else
			printf("%s %s (%s)\n", resp->created ? "added" : "exists", fp, m->name);
	}
	ctl_response_free(&b, resp);
	ctl_backend_close(&b);
	model_free(m);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_model_add_entry = {
        .name = "model add",
        .usage = "FILE.json",
        .help = "store a model spec\n"
                "Stores a model spec in the daemon (idempotent).\n",
        .flags = CTL_CMD_DAEMON,
        .exec = cmd_model_add_exec,
};
