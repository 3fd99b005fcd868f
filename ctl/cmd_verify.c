/* k3cachectl verify: every entry's chunks and layer checksums checked
 * again; the daemon quarantines what is damaged (--db only reports it).
 * On a terminal it shows progress: through the daemon, from its Stat
 * counters (verify_done_bytes of verify_total_bytes), read on a second
 * connection while the Verify runs; with --db, from the steps it runs
 * itself. */
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "progress.h"
#include "service.h"

#define POLL_MS 200

struct watch {
	const char *where;
	struct ctl_progress *prog;
	atomic_int stop;
};

/* Draws the daemon's verify progress until told to stop. A daemon that does
 * not count it (or a failed Stat) leaves the note on the screen. */
static void *watch_daemon(void *arg)
{
	struct watch *w = arg;
	struct k3cache *c;
	struct k3cache_error e;
	if (k3cache_connect(w->where, &c, &e) != 0)
		return NULL;
	k3cache_set_timeout(c, 2000);
	uint64_t shown = 0;
	int begun = 0;
	while (!atomic_load(&w->stop)) {
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		K3cache__V1__Stat st = K3CACHE__V1__STAT__INIT;
		req.op_case = K3CACHE__V1__REQUEST__OP_STAT;
		req.stat = &st;
		frame_response *r = NULL;
		if (k3cache_call(c, &req, &r, &e) != 0)
			break;
		uint64_t total = ctl_counter(r, "verify_total_bytes");
		uint64_t done = ctl_counter(r, "verify_done_bytes");
		k3cache_response_free(r);
		if (total && !begun) {
			ctl_progress_end(w->prog); /* the note */
			ctl_progress_begin(w->prog, stderr, "verify", total);
			begun = 1;
		}
		if (begun && done > shown) {
			ctl_progress_add(w->prog, done - shown);
			shown = done;
		}
		struct timespec ts = {0, POLL_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
	k3cache_close(c);
	return NULL;
}

/* --db: the verify in steps of one entry each (nothing else waits on this
 * store), the progress drawn after each. */
static frame_response *verify_here(struct store *s, struct ctl_progress *prog)
{
	frame_response *r = malloc(sizeof(*r));
	if (!r)
		return NULL;
	k3cache__v1__response__init(r);
	struct store_verify *walk = NULL;
	uint64_t shown = 0, total = 0;
	int begun = 0;
	while (service_verify_step(s, &walk, 1, r)) {
		uint64_t done;
		store_verify_progress(walk, &done, &total);
		if (!begun && prog->out) {
			ctl_progress_end(prog); /* the note */
			ctl_progress_begin(prog, stderr, "verify", total);
			begun = 1;
		}
		ctl_progress_add(prog, done - shown);
		shown = done;
	}
	if (begun)
		ctl_progress_add(prog, total - shown); /* and the last step's */
	return r;
}

/* Prints what the verify found damaged; returns how many of those are the
 * store's own (the shared blocks, the indexes). */
static size_t print_damaged(const frame_response *resp)
{
	size_t blocks = 0;
	for (size_t i = 0; i < resp->n_damaged; i++) {
		if (resp->damaged[i]->key.len != 32) { /* blocks, indexes, specs */
			printf("STORE    %s\n", resp->damaged[i]->why);
			blocks++;
			continue;
		}
		char k[65];
		hexutil_encode(resp->damaged[i]->key.data, 32, k);
		printf("DAMAGED %.16s  %s\n", k, resp->damaged[i]->why);
	}
	return blocks;
}

/* --json: what was checked and found damaged; a verify that stopped says
 * why in "error" (and, on stderr, as every command does). */
static void print_json(const frame_response *resp)
{
	json_t *arr = json_array();
	for (size_t i = 0; i < resp->n_damaged; i++)
		json_array_append_new(
		        arr, resp->damaged[i]->key.len == 32
		                     ? json_pack("{s:o,s:s}", "key",
		                                 ctl_hex_json(resp->damaged[i]->key.data, 32),
		                                 "why", resp->damaged[i]->why)
		                     : json_pack("{s:n,s:s}", "key", "why", resp->damaged[i]->why));
	json_t *doc = json_pack("{s:I,s:I,s:o}", "checked", (json_int_t)resp->checked, "damaged",
	                        (json_int_t)resp->n_damaged, "entries", arr);
	if (doc && resp->code != 0)
		json_object_set_new(doc, "error",
		                    json_pack("{s:s,s:s}", "code",
		                              status_code_name((enum status_code)resp->code),
		                              "message", resp->message ? resp->message : ""));
	ctl_print_json(stdout, doc);
}

static int cmd_verify_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                           char **argv)
{
	int json;
	struct ctl_backend b;
	int rc = ctl_cmd_open(self, g, argc, argv, &json, &b);
	if (rc)
		return rc;
	/* a note until the first count is known */
	char note[160];
	snprintf(note, sizeof(note), "verify: checking every entry of %.100s ...", b.where);
	struct ctl_progress prog;
	int show = ctl_progress_wanted(json);
	ctl_progress_note(&prog, show ? stderr : NULL, note);
	frame_response *resp = NULL;
	if (b.store) {
		resp = verify_here(b.store, &prog);
		if (!resp) {
			ctl_progress_end(&prog);
			fprintf(stderr, "k3cachectl %s: out of memory\n", self->name);
			ctl_backend_close(&b);
			return CTL_EXIT_ERROR;
		}
	} else {
		k3cache_set_timeout(b.conn, 0); /* a large store takes a while */
		struct watch w = {.where = b.where, .prog = &prog};
		pthread_t th;
		int watching = show && pthread_create(&th, NULL, watch_daemon, &w) == 0;
		frame_request req = K3CACHE__V1__REQUEST__INIT;
		K3cache__V1__Verify v = K3CACHE__V1__VERIFY__INIT;
		req.op_case = K3CACHE__V1__REQUEST__OP_VERIFY;
		req.verify = &v;
		rc = ctl_call(&b, &req, &resp, self->name);
		if (watching) {
			atomic_store(&w.stop, 1);
			pthread_join(th, NULL);
		}
	}
	ctl_progress_end(&prog);
	if (rc) {
		ctl_backend_close(&b);
		return rc;
	}
	if (resp->code != 0) {
		/* a verify that stopped (out of memory, say) may have taken entries
		 * out of service before: they are said too */
		if (json)
			print_json(resp);
		else
			print_damaged(resp);
		rc = ctl_answer_error(resp, self->name);
	} else if (json) {
		print_json(resp);
	} else {
		size_t blocks = print_damaged(resp);
		printf("verified %" PRIu64 " entr%s: %zu damaged", resp->checked,
		       resp->checked == 1 ? "y" : "ies", resp->n_damaged - blocks);
		if (blocks)
			printf(", %zu problem%s with the shared blocks, the indexes or the model "
			       "specs",
			       blocks, blocks == 1 ? "" : "s");
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
