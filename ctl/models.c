/* The store's model specs as k3cachectl's commands need them: all of them,
 * the one of a fingerprint, or those a --model argument names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "hexutil.h"
#include "model.h"
#include "service.h"

int ctl_fetch_models(struct ctl_backend *b, frame_response **resp, const char *cmd)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__ListModels lm = K3CACHE__V1__LIST_MODELS__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_LIST_MODELS;
	req.list_models = &lm;
	return ctl_call_ok(b, &req, resp, cmd);
}

int ctl_model_spec(struct ctl_backend *b, const uint8_t fp[32], struct k3cache_model **spec,
                   const char *cmd)
{
	*spec = NULL;
	frame_response *resp = NULL;
	int rc = ctl_fetch_models(b, &resp, cmd);
	if (rc)
		return rc;
	for (size_t i = 0; i < resp->n_models && !*spec; i++) {
		char err[MODEL_ERROR_MAX];
		struct k3cache_model *m = service_spec_from_wire(resp->models[i], err);
		if (m && !memcmp(m->fingerprint, fp, 32))
			*spec = m;
		else
			model_free(m);
	}
	ctl_response_free(b, resp);
	return 0;
}

int ctl_models_named(struct ctl_backend *b, const char *arg, int *unlisted, uint8_t (**fps)[32],
                     size_t *n, const char *cmd)
{
	*fps = NULL;
	*n = 0;
	if (unlisted)
		*unlisted = 0;
	uint8_t fp[32];
	int is_fp = strlen(arg) == 64 && hexutil_decode(arg, fp, 32) == 0;
	frame_response *models;
	int rc = ctl_fetch_models(b, &models, cmd);
	if (rc)
		return rc;
	*fps = malloc((models->n_models ? models->n_models : 1) * 32);
	int listed = 0;
	for (size_t i = 0; *fps && i < models->n_models; i++) {
		char err[MODEL_ERROR_MAX];
		struct k3cache_model *m = service_spec_from_wire(models->models[i], err);
		if (m && !is_fp && !strcmp(m->name, arg))
			memcpy((*fps)[(*n)++], m->fingerprint, 32);
		listed |= m && is_fp && !memcmp(m->fingerprint, fp, 32);
		model_free(m);
	}
	if (*fps && is_fp) { /* as it is, listed or not */
		memcpy((*fps)[0], fp, 32);
		*n = 1;
		if (unlisted)
			*unlisted = !listed;
	}
	ctl_response_free(b, models);
	if (*fps)
		return 0;
	fprintf(stderr, "k3cachectl %s: out of memory\n", cmd);
	return CTL_EXIT_ERROR;
}
