/* k3cachectl --db DIR salvage --to NEWDIR: what verifies of a damaged store,
 * copied into a new one (store_salvage, store.h). It needs no daemon and
 * never writes to DIR. */
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "hexutil.h"
#include "store.h"

struct lost_list {
	int json;
	json_t *arr;
	uint64_t n;
};

static void on_lost(const uint8_t *key, const char *why, void *ctx)
{
	struct lost_list *l = ctx;
	char k[65];
	hexutil_encode(key, 32, k);
	l->n++;
	if (l->json)
		json_array_append_new(l->arr, json_pack("{s:s,s:s}", "key", k, "why", why));
	else
		printf("LOST %.16s  %s\n", k, why);
}

static int cmd_salvage_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                            char **argv)
{
	static const struct option opts[] = {{"to", required_argument, NULL, 't'},
	                                     {"json", no_argument, NULL, 'j'},
	                                     {NULL, 0, NULL, 0}};
	const char *to = NULL;
	int json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 't')
			to = optarg;
		else if (c == 'j')
			json = 1;
		else
			return ctl_cmd_option_error(self, argv, opts, "");
	}
	if (!to)
		return ctl_cmd_usage_error(self, "name the new store with --to NEWDIR");
	if (optind != argc)
		return ctl_cmd_usage_error(self, "unexpected argument");
	struct lost_list lost = {.json = json, .arr = json ? json_array() : NULL};
	struct store_salvage_res res;
	struct status st;
	enum status_code code = store_salvage(g->db, to, on_lost, &lost, &res, &st);
	if (code != STATUS_OK) {
		json_decref(lost.arr);
		fprintf(stderr, "k3cachectl %s: %s: %s\n", self->name, status_code_name(code),
		        st.message);
		return CTL_EXIT_ERROR;
	}
	if (json) {
		json_t *doc = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:o}", "from", g->db, "to",
		                        to, "snapshot", (json_int_t)res.txnid, "problems",
		                        (json_int_t)res.problems, "entries",
		                        (json_int_t)res.entries, "saved", (json_int_t)res.saved,
		                        "models", (json_int_t)res.models, "lost", lost.arr);
		if (res.problems)
			json_object_set_new(doc, "first_problem", json_string(res.first_problem));
		ctl_print_json(stdout, doc);
		return CTL_EXIT_OK;
	}
	if (res.problems)
		printf("read transaction %" PRIu64 " of %s, stepping around %" PRIu64
		       " damaged page%s or node%s; the first: %s\n",
		       res.txnid, g->db, res.problems, res.problems == 1 ? "" : "s",
		       res.problems == 1 ? "" : "s", res.first_problem);
	else
		printf("read transaction %" PRIu64 " of %s: its structure is sound\n", res.txnid,
		       g->db);
	printf("saved %" PRIu64 " of %" PRIu64 " entr%s and %" PRIu64 " model%s into %s; %" PRIu64
	       " lost\n",
	       res.saved, res.entries, res.entries == 1 ? "y" : "ies", res.models,
	       res.models == 1 ? "" : "s", to, lost.n);
	return CTL_EXIT_OK;
}

const struct ctl_cmd_entry ctl_cmd_salvage_entry = {
        .name = "salvage",
        .usage = "--to NEWDIR",
        .help = "copy what verifies of a damaged store into a new one\n"
                "Copies every entry of the store in DIR that verifies (its record, tokens,\n"
                "key, and every chunk's and block's checksum) into a new store in NEWDIR,\n"
                "reading DIR without LMDB, so a store the daemon refuses as damaged can be\n"
                "read. DIR is never written. Each entry that cannot be saved is listed with\n"
                "the reason. Needs free space for about twice what is saved. Then start the\n"
                "daemon on NEWDIR. Exit 0 when the salvage ran (whatever it lost), 1 when it\n"
                "could not.\n",
        .flags = CTL_CMD_DB,
        .exec = cmd_salvage_exec,
};
