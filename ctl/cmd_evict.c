/* k3cachectl evict: entries evicted by exactly one selector (keys, a model,
 * idleness, a size to shrink to, or all), or listed with --dry-run. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "hexutil.h"
#include "units.h"

static int cmd_evict_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                          char **argv)
{
	static const struct option opts[] = {
	        {"model", required_argument, NULL, 'm'},   {"idle", required_argument, NULL, 'i'},
	        {"to-size", required_argument, NULL, 's'}, {"all", no_argument, NULL, 'a'},
	        {"dry-run", no_argument, NULL, 'n'},       {"yes", no_argument, NULL, 'y'},
	        {"json", no_argument, NULL, 'j'},          {NULL, 0, NULL, 0}};
	const char *model = NULL;
	uint64_t idle = 0, to_size = 0;
	int have_idle = 0, have_size = 0, all = 0, dry = 0, yes = 0, json = g->json, c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model = optarg;
			break;
		case 'i': {
			int prc = units_parse_duration_nonzero(optarg, &idle);
			if (prc == UNITS_ZERO) {
				char why[160];
				return ctl_cmd_usage_error(
				        self,
				        "--idle %s: %s; --idle takes a duration such as 30m or 2d",
				        optarg,
				        units_zero_reason(optarg, "seconds", why, sizeof(why)));
			}
			if (prc)
				return ctl_cmd_usage_error(
				        self, "--idle takes a duration such as 30m or 2d");
			have_idle = 1;
			break;
		}
		case 's':
			if (units_parse_size(optarg, &to_size))
				return ctl_cmd_usage_error(self,
				                           "--to-size takes a size such as 10GiB");
			have_size = 1;
			break;
		case 'a':
			all = 1;
			break;
		case 'n':
			dry = 1;
			break;
		case 'y':
			yes = 1;
			break;
		case 'j':
			json = 1;
			break;
		default:
			return ctl_cmd_option_error(self, argv, opts, "");
		}
	}
	int nkeys = argc - optind;
	int selectors = (nkeys > 0) + (model != NULL) + have_idle + have_size + all;
	if (selectors != 1)
		return ctl_cmd_usage_error(
		        self, "give exactly one of KEY..., --model, --idle, --to-size, --all");
	if (have_size && to_size == 0)
		return ctl_cmd_usage_error(self, "--to-size 0 is --all");
	if (all && !yes && !dry) {
		/* nobody at a terminal to ask (a script, a pipe, cron): the
		 * command line itself must say so */
		if (!isatty(0))
			return ctl_cmd_usage_error(
			        self, "--all evicts every entry and stdin is not a terminal to "
			              "confirm on: add --yes");
		fprintf(stderr, "Evict every entry? Type 'yes' to go on: ");
		char line[16] = "";
		/* exactly "yes": not "yesterday", nor "yes, wait" */
		if (!fgets(line, sizeof(line), stdin) ||
		    (strcmp(line, "yes\n") != 0 && strcmp(line, "yes") != 0)) {
			fprintf(stderr, "nothing evicted\n");
			return CTL_EXIT_ERROR;
		}
	}
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, self->name);
	if (rc)
		return rc;
	uint8_t(*keys)[32] = nkeys ? calloc((size_t)nkeys, 32) : NULL;
	ProtobufCBinaryData *kb = nkeys ? calloc((size_t)nkeys, sizeof(*kb)) : NULL;
	uint8_t fp[32];
	int unlisted = 0;
	frame_response *resp = NULL;
	for (int i = 0; i < nkeys; i++) {
		if ((rc = ctl_resolve_key(&b, argv[optind + i], keys[i], self->name)) != 0)
			goto out;
		kb[i].data = keys[i];
		kb[i].len = 32;
	}
	if (model) {
		uint8_t(*fps)[32];
		size_t found;
		if ((rc = ctl_models_named(&b, model, &unlisted, &fps, &found, self->name)) != 0)
			goto out;
		if (found == 1)
			memcpy(fp, fps[0], 32);
		free(fps);
		if (found != 1) {
			fprintf(stderr,
			        "k3cachectl evict: %s model named \"%s\"; give its fingerprint\n",
			        found ? "more than one" : "no", model);
			rc = found ? CTL_EXIT_ERROR : CTL_EXIT_NOTFOUND;
			goto out;
		}
	}
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Evict ev = K3CACHE__V1__EVICT__INIT;
	ev.keys = kb;
	ev.n_keys = (size_t)nkeys;
	if (model) {
		ev.model.data = fp;
		ev.model.len = 32;
	}
	ev.idle_seconds = idle;
	ev.to_bytes = to_size;
	ev.all = all;
	ev.dry_run = dry;
	req.op_case = K3CACHE__V1__REQUEST__OP_EVICT;
	req.evict = &ev;
	if ((rc = ctl_call_ok(&b, &req, &resp, self->name)) != 0)
		goto out;
	if (unlisted && resp->n_entries == 0) { /* a typo, as a name no model has */
		fprintf(stderr,
		        "k3cachectl evict: no model has fingerprint %s, and no entry (see "
		        "k3cachectl models)\n",
		        model);
		rc = CTL_EXIT_NOTFOUND;
		goto out;
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < resp->n_entries; i++)
		bytes += resp->entries[i]->bytes;
	char size[32];
	ctl_size(bytes, size, sizeof(size));
	if (json) {
		json_t *arr = json_array();
		for (size_t i = 0; i < resp->n_entries; i++)
			json_array_append_new(
			        arr, json_pack("{s:o,s:I}", "key",
			                       ctl_hex_json(resp->entries[i]->key.data, 32),
			                       "bytes", (json_int_t)resp->entries[i]->bytes));
		ctl_print_json(stdout, json_pack("{s:b,s:I,s:I,s:o}", "dry_run", dry, "entries",
		                                 (json_int_t)resp->n_entries, "bytes",
		                                 (json_int_t)bytes, "evicted", arr));
	} else {
		for (size_t i = 0; i < resp->n_entries; i++) {
			char k[65], s[32];
			hexutil_encode(resp->entries[i]->key.data, 32, k);
			ctl_size(resp->entries[i]->bytes, s, sizeof(s));
			printf("%s %.16s  %s\n", dry ? "would evict" : "evicted", k, s);
		}
		printf("%s %zu entr%s, %s%s\n", dry ? "would evict" : "evicted", resp->n_entries,
		       resp->n_entries == 1 ? "y" : "ies", size,
		       dry ? " (dry run: nothing changed)" : " freed");
	}
out:
	ctl_response_free(&b, resp);
	free(keys);
	free(kb);
	ctl_backend_close(&b);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_evict_entry = {
        .name = "evict",
        .usage = "KEY... | --model NAME|FP | --idle DURATION | --to-size SIZE | --all "
                 "[--dry-run] [--yes]",
        .help = "evict entries (--db: --dry-run only)\n"
                "Evicts by exactly one selector. --dry-run lists what would go.\n"
                "--to-size evicts least recently used first. --all asks on a terminal\n"
                "unless --yes; without a terminal on stdin it needs --yes. With --db the\n"
                "store is read-only: only --dry-run works.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_evict_exec,
};
