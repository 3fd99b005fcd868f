/* k3cachectl export KEY -o FILE: an entry as a snapshot file (the format:
 * src/snapfile.h), to move it to another host (k3cachectl import) or keep
 * it as a backup. The file is written whole next to FILE, then renamed
 * over it; -o - writes it to stdout. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blob.h"
#include "cmd.h"
#include "hexutil.h"
#include "model.h"
#include "prefix.h"
#include "progress.h"
#include "snapfile.h"

/* The file export writes: stdout for "-", else a new temporary file next to
 * the target (so renaming it over the target is atomic), with the target's
 * mode when it exists, else what a new file gets. Returns NULL after saying
 * why; *tmp is the malloc'd temporary path (NULL for stdout). */
static FILE *export_open(const char *out, char **tmp)
{
	*tmp = NULL;
	if (!strcmp(out, "-"))
		return stdout;
	const char *slash = strrchr(out, '/');
	int dirlen = slash ? (int)(slash - out + 1) : 0;
	const char *base = slash ? slash + 1 : out;
	size_t n = strlen(out) + 16;
	char *path = malloc(n);
	if (!path) {
		fprintf(stderr, "k3cachectl export: out of memory\n");
		return NULL;
	}
	snprintf(path, n, "%.*s.%s.XXXXXX", dirlen, out, base);
	int fd = mkstemp(path);
	if (fd < 0) {
		fprintf(stderr, "k3cachectl export: cannot create a file next to %s: %s\n", out,
		        strerror(errno));
		free(path);
		return NULL;
	}
	struct stat st;
	mode_t mode;
	if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
		mode = st.st_mode & 07777;
	} else {
		mode = umask(0);
		umask(mode);
		mode = 0666 & ~mode;
	}
	FILE *f = fchmod(fd, mode) == 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		fprintf(stderr, "k3cachectl export: cannot create a file next to %s: %s\n", out,
		        strerror(errno));
		close(fd);
		unlink(path);
		free(path);
		return NULL;
	}
	*tmp = path;
	return f;
}

/* Says that writing out failed (never naming the temporary file). */
static void export_failed(const char *out, int err)
{
	const char *why = err ? strerror(err) : "short write";
	if (!strcmp(out, "-"))
		fprintf(stderr, "k3cachectl export: writing to stdout failed: %s\n", why);
	else
		fprintf(stderr, "k3cachectl export: writing %s failed: %s; %s was not changed\n",
		        out, why, out);
}

/* Finishes what export_open began: flushes (and for a file syncs, closes
 * and renames it over out); on any failure, or when !ok, the temporary file
 * is removed and the target left as it was. Returns 0 or -1 after saying
 * why. Frees tmp. */
static int export_close(FILE *f, char *tmp, const char *out, int ok)
{
	int err = 0;
	if (ok && fflush(f) != 0)
		err = errno;
	if (!tmp) {
		if (ok && err)
			export_failed(out, err);
		return ok && !err ? 0 : -1;
	}
	if (ok && !err && fsync(fileno(f)) != 0)
		err = errno;
	if (fclose(f) != 0 && !err)
		err = errno;
	if (ok && !err && rename(tmp, out) != 0)
		err = errno;
	if (!ok || err) {
		unlink(tmp);
		if (ok)
			export_failed(out, err);
	}
	free(tmp);
	return ok && !err ? 0 : -1;
}

/* Bytes written at a time, so that progress moves within a large layer. */
#define WRITE_PIECE (8u << 20)

/* Writes len bytes to f in pieces, counted on p. Returns 1, or 0 when a
 * write failed (errno says why). */
static int write_counted(FILE *f, const unsigned char *data, uint64_t len, struct ctl_progress *p)
{
	for (uint64_t off = 0; off < len; off += WRITE_PIECE) {
		size_t n = len - off < WRITE_PIECE ? (size_t)(len - off) : WRITE_PIECE;
		if (fwrite(data + off, 1, n, f) != n)
			return 0;
		ctl_progress_add(p, n);
	}
	return 1;
}

/* Checks what was fetched as the store would serve it (slot, shape, seq_len,
 * finite, the layer's checksum): a file is never written with bytes known
 * bad. 0, or -1 after saying which layer fails. */
static int export_check(const struct ctl_layers *l, const struct k3cache_model *spec)
{
	if (l->n != spec->n_layers) {
		fprintf(stderr,
		        "k3cachectl export: the entry has %" PRIu32 " layers, model %s has %" PRIu32
		        "; nothing written\n",
		        l->n, spec->name, spec->n_layers);
		return -1;
	}
	for (uint32_t i = 0; i < l->n; i++) {
		struct blob_error be;
		uint64_t sum = 0;
		if (blob_check_sum(l->data[i], (size_t)l->size[i], spec, i, l->prefix_len, &sum,
		                   &be) != BLOB_OK) {
			fprintf(stderr, "k3cachectl export: %s; nothing written\n", be.message);
			return -1;
		}
		if (sum != l->xxh3[i]) {
			fprintf(stderr,
			        "k3cachectl export: layer %" PRIu32 " hashes to %016" PRIx64
			        ", the entry says %016" PRIx64
			        ": damaged on the way; nothing written\n",
			        i, sum, l->xxh3[i]);
			return -1;
		}
	}
	return 0;
}

static int cmd_export_exec(const struct ctl_cmd_entry *self, const struct ctl_globals *g, int argc,
                           char **argv)
{
	static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
	                                     {NULL, 0, NULL, 0}};
	const char *out = NULL;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
		if (c == 'o') {
			out = optarg;
		} else {
			return ctl_cmd_option_error(self, argv, opts, "o:");
		}
	}
	if (optind + 1 != argc || !out)
		return ctl_cmd_usage_error(self, "expects KEY and -o FILE");
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, self->name);
	if (rc)
		return rc;
	uint8_t key[32];
	frame_response *info = NULL;
	struct ctl_layers layers = {0};
	struct k3cache_model *spec = NULL;
	FILE *f = NULL;
	unsigned char *hdr = NULL;
	char *tmp = NULL;
	if ((rc = ctl_resolve_key(&b, argv[optind], key, self->name)) != 0)
		goto done;
	if ((rc = ctl_inspect_entry(&b, key, &info, self->name)) != 0)
		goto done;
	const K3cache__V1__EntryInfo *e = info->entries[0];
	if (e->model.len == 32 && (rc = ctl_model_spec(&b, e->model.data, &spec, self->name)) != 0)
		goto done;
	if (!spec) {
		fprintf(stderr, "k3cachectl export: the entry's model spec is not in the store\n");
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	/* the file's key is checked against its model, salt and tokens when it
	 * is imported: one that would be refused then is not written now */
	uint8_t want[PREFIX_KEY_LEN];
	if (e->n_tokens == e->prefix_len &&
	    prefix_key(spec->fingerprint, e->salt.data, e->salt.len, e->tokens,
	               (uint32_t)e->n_tokens, want) != 0) {
		fprintf(stderr, "k3cachectl export: out of memory\n");
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	if (e->n_tokens != e->prefix_len || memcmp(want, key, sizeof(want)) != 0) {
		fprintf(stderr,
		        "k3cachectl export: the entry's model, salt and tokens (%zu sent for "
		        "P=%u) do not hash to its key: its record or token list is damaged; "
		        "`k3cachectl verify` takes it out of service\n",
		        e->n_tokens, e->prefix_len);
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	int show = ctl_progress_wanted(g->json);
	if ((rc = ctl_fetch_layers(&b, key, &layers, show, self->name)) != 0)
		goto done;
	if (export_check(&layers, spec) != 0) {
		rc = CTL_EXIT_ERROR;
		goto done;
	}

	struct snapfile_layer *sl = calloc(layers.n ? layers.n : 1, sizeof(*sl));
	if (!sl) {
		fprintf(stderr, "k3cachectl export: out of memory\n");
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	for (uint32_t i = 0; i < layers.n; i++)
		sl[i] = (struct snapfile_layer){layers.data[i], layers.size[i], layers.xxh3[i]};
	struct snapfile snap = {.model = spec,
	                        .salt = e->salt.data,
	                        .salt_len = e->salt.len,
	                        .tokens = e->tokens,
	                        .n_tokens = (uint32_t)e->n_tokens,
	                        .layers = sl,
	                        .n_layers = layers.n,
	                        .created = e->created};
	memcpy(snap.key, key, 32);
	struct snapfile_error serr;
	size_t hlen;
	enum snapfile_class sc = snapfile_encode_header(&snap, &hdr, &hlen, &serr);
	free(sl);
	if (sc != SNAPFILE_OK) {
		fprintf(stderr, "k3cachectl export: %s\n", serr.message);
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	char keyhex[65];
	hexutil_encode(key, 32, keyhex);
	f = export_open(out, &tmp);
	if (!f) {
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < layers.n; i++)
		total += layers.size[i];
	char what[96];
	snprintf(what, sizeof(what), "export %.16s: writing", keyhex);
	struct ctl_progress prog;
	ctl_progress_begin(&prog, show ? stderr : NULL, what, hlen + total);
	int ok = write_counted(f, hdr, hlen, &prog);
	for (uint32_t i = 0; ok && i < layers.n; i++)
		ok = write_counted(f, layers.data[i], layers.size[i], &prog);
	int werr = ok ? 0 : errno;
	ctl_progress_end(&prog);
	if (!ok)
		export_failed(out, werr);
	int closed = export_close(f, tmp, out, ok);
	f = NULL;
	tmp = NULL;
	if (closed != 0) {
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	/* with -o - stdout carries the snapshot: the report goes to stderr */
	FILE *report = strcmp(out, "-") ? stdout : stderr;
	char size[32];
	ctl_size(total, size, sizeof(size));
	if (g->json) {
		ctl_print_json(report,
		               json_pack("{s:s,s:s,s:I,s:i}", "key", keyhex, "file", out, "bytes",
		                         (json_int_t)total, "layers", (int)layers.n));
	} else {
		fprintf(report, "exported %.16s (%s, %u tokens, %u layers, %s) to %s\n", keyhex,
		        spec->name, e->prefix_len, layers.n, size,
		        strcmp(out, "-") ? out : "stdout");
	}
done:
	if (f)
		export_close(f, tmp, out, 0);
	free(hdr);
	ctl_layers_free(&layers);
	model_free(spec);
	ctl_response_free(&b, info);
	ctl_backend_close(&b);
	return rc;
}

const struct ctl_cmd_entry ctl_cmd_export_entry = {
        .name = "export",
        .usage = "KEY -o FILE|-",
        .help = "an entry to a snapshot file (-: stdout)\n"
                "Writes the entry (model spec, salt, tokens, layers and their\n"
                "checksums, blobs) to FILE, for `k3cachectl import` on another host.\n"
                "FILE is written whole and then renamed into place; - is stdout (the\n"
                "report then goes to stderr).\n",
        .flags = CTL_CMD_DAEMON | CTL_CMD_DB,
        .exec = cmd_export_exec,
};
