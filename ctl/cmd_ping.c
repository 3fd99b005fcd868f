/* k3cachectl ping: does the daemon answer (or does --db open the store)? */
#include <jansson.h>
#include <stdio.h>
#include <time.h>

#include "cmd.h"
#include "k3cache/k3cache.h"

static int cmd_ping_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                         char **argv)
{
	int json;
	struct ctl_backend b;
	int rc = ctl_cmd_open(self, g, argc, argv, &json, &b);
	if (rc)
		return rc;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char server[128] = "store";
	if (b.conn) {
		struct k3cache_error err;
		if (k3cache_hello(b.conn, server, sizeof(server), &err) != 0) {
			fprintf(stderr, "k3cachectl %s: %s\n", self->name, err.message);
			ctl_backend_close(&b);
			return ctl_exit_of(&err);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	if (json)
		ctl_print_json(stdout, json_pack("{s:b,s:s,s:s,s:f}", "ok", 1, "server", server,
		                                 "at", b.where, "ms", ms));
	else
		printf("PONG from %s at %s in %.2f ms\n", server, b.where, ms);
	ctl_backend_close(&b);
	return CTL_EXIT_OK;
}

const struct ctl_cmd_entry ctl_cmd_ping_entry = {
        .name = "ping",
        .usage = "",
        .help = "is the daemon there?\n"
                "Checks that the daemon answers (or that --db opens). Exit 3 when it\n"
                "cannot be reached.\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_ping_exec,
};
