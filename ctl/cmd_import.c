/* k3cachectl import FILE: a snapshot file (src/snapfile.h) stored through
 * the daemon. snapfile_parse() checks the file like the wire before
 * anything is sent; the daemon validates the publish again. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "model.h"
#include "progress.h"
#include "snapfile.h"

/* The file parsed and every layer checked (snapfile.h), with a progress line
 * over the layers' bytes. Returns 0, or -1 after saying why. */
/* The publish's bytes as the library sends them (its headers too: counted
 * up to the payload's size, which the line shows). */
struct sent_count {
	struct ctl_progress prog;
	uint64_t total, done;
};

static void count_sent(uint64_t bytes, void *ctx)
{
	struct sent_count *s = ctx;
	uint64_t add = bytes < s->total - s->done ? bytes : s->total - s->done;
	s->done += add;
	ctl_progress_add(&s->prog, add);
}

static int check_file(const char *path, const char *name, const struct ctl_file *f,
                      struct snapfile *snap, int show)
{
	struct snapfile_error serr;
	enum snapfile_class rc = snapfile_parse_layout(f->data, f->size, snap, &serr);
	if (rc == SNAPFILE_OK) {
		uint64_t total = 0;
		for (uint32_t i = 0; i < snap->n_layers; i++)
			total += snap->layers[i].size;
		char what[96];
		snprintf(what, sizeof(what), "import %.40s: checking", name);
		struct ctl_progress prog;
		ctl_progress_begin(&prog, show ? stderr : NULL, what, total);
		for (uint32_t i = 0; rc == SNAPFILE_OK && i < snap->n_layers; i++)
			if ((rc = snapfile_check_layer(snap, i, &serr)) == SNAPFILE_OK)
				ctl_progress_add(&prog, snap->layers[i].size);
		ctl_progress_end(&prog);
	}
	if (rc != SNAPFILE_OK) {
		fprintf(stderr, "k3cachectl import: %s: %s; nothing was stored\n", path,
		        serr.message);
		snapfile_free(snap);
		return -1;
	}
	return 0;
}

static int cmd_import_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                           char **argv)
{
	int first = 0, rc = ctl_cmd_operands(self, argc, argv, &first);
	if (rc)
		return rc;
	if (argc - first != 1)
		return ctl_cmd_usage_error(self, "expects exactly one FILE");
	const char *path = argv[first];
	char err[512];
	struct ctl_file f;
	if (ctl_file_open(path, &f, err, sizeof(err)) != 0) {
		fprintf(stderr, "k3cachectl import: %s\n", err);
		return CTL_EXIT_ERROR;
	}
	rc = CTL_EXIT_ERROR;
	struct snapfile snap;
	struct k3cache_buf *bufs = NULL;
	struct ctl_backend b = {0};
	int show = ctl_progress_wanted(g->json);
	const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	if (check_file(path, name, &f, &snap, show) != 0)
		goto out;
	bufs = calloc(snap.n_layers ? snap.n_layers : 1, sizeof(*bufs));
	if (!bufs) {
		fprintf(stderr, "k3cachectl import: %s: out of memory; nothing was stored\n", path);
		goto out;
	}
	for (uint32_t i = 0; i < snap.n_layers; i++)
		bufs[i] = (struct k3cache_buf){snap.layers[i].data, (size_t)snap.layers[i].size};
	if ((rc = ctl_backend_open(g, &b, self->name)) != 0)
		goto out;
	struct k3cache_error kerr;
	struct k3cache_publish_result res;
	uint64_t total = 0;
	for (uint32_t i = 0; i < snap.n_layers; i++)
		total += snap.layers[i].size;
	char what[96];
	snprintf(what, sizeof(what), "import %.40s: sending", name);
	struct sent_count sent = {.total = total};
	ctl_progress_begin(&sent.prog, show ? stderr : NULL, what, total);
	int failed = k3cache_put_model(b.conn, snap.model, NULL, &kerr) != 0;
	if (!failed) {
		k3cache_set_send_progress(b.conn, count_sent, &sent);
		failed = k3cache_publish(b.conn, snap.model->fingerprint, snap.salt, snap.salt_len,
		                         snap.tokens, snap.n_tokens, bufs, snap.n_layers, &res,
		                         &kerr) != 0;
		k3cache_set_send_progress(b.conn, NULL, NULL);
	}
	ctl_progress_end(&sent.prog);
	if (failed) {
		fprintf(stderr, "k3cachectl import: %s: %s: %s\n", path,
		        k3cache_code_name(kerr.code), kerr.message);
		rc = ctl_exit_of(&kerr);
		goto out;
	}
	char k[65];
	hexutil_encode(res.key, 32, k);
	if (g->json) {
		ctl_print_json(stdout, json_pack("{s:s,s:b,s:I}", "key", k, "created", res.created,
		                                 "bytes", (json_int_t)res.bytes));
	} else {
		printf("imported %.16s (%s, %u tokens): %s\n", k, snap.model->name, snap.n_tokens,
		       res.created ? "stored" : "already stored");
	}
	rc = CTL_EXIT_OK;
out:
	ctl_backend_close(&b);
	free(bufs);
	snapfile_free(&snap);
	ctl_file_close(&f);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_import_entry = {
        .name = "import",
        .usage = "FILE",
        .help = "a snapshot file, validated like a publish\n"
                "Stores a snapshot file written by `k3cachectl export`, validated\n"
                "like a publish: a damaged or foreign file stores nothing and says why.\n",
        .flags = CTL_CMD_DAEMON,
        .exec = cmd_import_exec,
};
