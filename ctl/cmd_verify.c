/* k3cachectl verify: every entry's chunks and layer checksums checked
 * again; the daemon quarantines what is damaged (--db only reports it). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>

#include "cmd.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "progress.h"

static int cmd_verify_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                           char **argv)
{
	int json;
	struct ctl_backend b;
	int rc = ctl_cmd_open(self, g, argc, argv, &json, &b);
	if (rc)
		return rc;
	/* the daemon's Verify is one call that reports nothing until it is
	 * done: a note on a terminal, not a count */
	char note[160];
	snprintf(note, sizeof(note), "verify: checking every entry of %.100s ...", b.where);
	struct ctl_progress prog;
	ctl_progress_note(&prog, ctl_progress_wanted(json) ? stderr : NULL, note);
	if (b.conn)
		k3cache_set_timeout(b.conn, 0); /* a large store takes a while */
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Verify v = K3CACHE__V1__VERIFY__INIT;
	req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
	req.verify = &v;
	frame_response *resp;
	rc = ctl_call(&b, &req, &resp, self->name);
	ctl_progress_end(&prog);
	if (rc) {
		ctl_backend_close(&b);
		return rc;
	}
	if (resp->code != 0) {
		rc = ctl_answer_error(resp, self->name);
	} else if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < resp->n_damaged; i++)
			json_array_append_new(
			        arr,
			        resp->damaged[i]->key.len == 32
			                ? json_pack("{s:o,s:s}", "key",
			                            ctl_hex_json(resp->damaged[i]->key.data, 32),
			                            "why", resp->damaged[i]->why)
			                : json_pack("{s:n,s:s}", "key", "why",
			                            resp->damaged[i]->why));
		ctl_print_json(stdout,
		               json_pack("{s:I,s:I,s:o}", "checked", (json_int_t)resp->checked,
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

const struct ctl_cmd_entry ctl_cmd_verify_entry = {
        .name = "verify",
        .usage = "",
        .help = "re-check every entry\n"
                "Re-checks every entry's chunks and layer checksums. Damaged entries\n"
                "are quarantined (not with --db). Exit 1 if anything is damaged.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_verify_exec,
};
