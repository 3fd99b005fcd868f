/* export and import: an entry as a self-describing snapshot file, to move it
 * between hosts or keep it as a backup.
 *
 *   "K3SNAP1\n" | u32 LE header_len | header (JSON) | the blobs, layer order
 *
 * The header holds the model spec and fingerprint, the salt (hex), the tokens,
 * the entry key and each layer's size and XXH3. Import trusts none of it: it
 * checks the file like the wire (sizes before reading, checksums, every blob
 * against the model), then publishes, which the daemon validates again. */
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
#include "checksum.h"
#include "ctl.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "model.h"
#include "prefix.h"
#include "service.h"

#define SNAP_MAGIC      "K3SNAP1\n"
#define SNAP_MAGIC_LEN  8u
#define SNAP_MAX_HEADER (64u << 20)

static int usage(const char *cmd, const char *msg, const char *text)
{
	fprintf(stderr, "k3cachectl %s: %s\nusage: %s\n", cmd, msg, text);
	return CTL_EXIT_USAGE;
}

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

int ctl_cmd_export(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH | --db DIR] export KEY -o FILE|-";
	static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {NULL, 0, NULL, 0}};
	const char *out = NULL;
	int c;
	optind = 0;
	while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
		if (c == 'o') {
			out = optarg;
		} else if (c == 'h') {
			printf("usage: %s\nWrites the entry (model spec, salt, tokens, layers and "
			       "their\n"
			       "checksums, blobs) to FILE, for `k3cachectl import` on another "
			       "host.\n"
			       "FILE is written whole and then renamed into place; - is stdout "
			       "(the\n"
			       "report then goes to stderr).\n",
			       text);
			return CTL_EXIT_OK;
		} else {
			return usage("export", "unknown option", text);
		}
	}
	if (optind + 1 != argc || !out)
		return usage("export", "expects KEY and -o FILE", text);
	struct ctl_backend b;
	int rc = ctl_backend_open(g, &b, "export");
	if (rc)
		return rc;
	uint8_t key[32];
	frame_response *info = NULL;
	struct ctl_layers layers = {0};
	struct k3cache_model *spec = NULL;
	FILE *f = NULL;
	char *hdr = NULL, *tmp = NULL;
	if ((rc = ctl_resolve_key(&b, argv[optind], key, "export")) != 0)
		goto done;
	if ((rc = ctl_inspect_entry(&b, key, &info, "export")) != 0)
		goto done;
	const K3cache__V1__EntryInfo *e = info->entries[0];
	if (e->model.len == 32)
		spec = ctl_model_spec(&b, e->model.data, "export");
	if (!spec) {
		fprintf(stderr, "k3cachectl export: the entry's model spec is not in the store\n");
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	if ((rc = ctl_fetch_layers(&b, key, &layers, "export")) != 0)
		goto done;

	char *specjs = model_to_json(spec);
	json_t *jspec = specjs ? json_loads(specjs, 0, NULL) : NULL;
	free(specjs);
	json_t *toks = json_array(), *jl = json_array();
	for (size_t i = 0; i < e->n_tokens; i++)
		json_array_append_new(toks, json_integer(e->tokens[i]));
	for (uint32_t i = 0; i < layers.n; i++) {
		char sum[17];
		snprintf(sum, sizeof(sum), "%016" PRIx64, layers.xxh3[i]);
		json_array_append_new(jl, json_pack("{s:i,s:I,s:s}", "index", (int)i, "size",
		                                    (json_int_t)layers.size[i], "xxh3", sum));
	}
	char keyhex[65], fphex[65], salthex[2 * 1024 + 1];
	hexutil_encode(key, 32, keyhex);
	hexutil_encode(spec->fingerprint, 32, fphex);
	hexutil_encode(e->salt.data, e->salt.len <= 1024 ? e->salt.len : 0, salthex);
	json_t *doc = json_pack("{s:i,s:s,s:s,s:o,s:s,s:i,s:o,s:o,s:I}", "format", 1, "key", keyhex,
	                        "fingerprint", fphex, "model", jspec ? jspec : json_null(), "salt",
	                        salthex, "prefix_len", (int)e->prefix_len, "tokens", toks, "layers",
	                        jl, "created", (json_int_t)e->created);
	hdr = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(doc);
	if (!hdr) {
		fprintf(stderr, "k3cachectl export: out of memory\n");
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	f = export_open(out, &tmp);
	if (!f) {
		rc = CTL_EXIT_ERROR;
		goto done;
	}
	uint32_t hlen = (uint32_t)strlen(hdr);
	unsigned char pre[4];
	frame_put_len(pre, hlen);
	int ok = fwrite(SNAP_MAGIC, 1, SNAP_MAGIC_LEN, f) == SNAP_MAGIC_LEN &&
	         fwrite(pre, 1, 4, f) == 4 && fwrite(hdr, 1, hlen, f) == hlen;
	uint64_t total = 0;
	for (uint32_t i = 0; ok && i < layers.n; i++) {
		ok = fwrite(layers.data[i], 1, layers.size[i], f) == layers.size[i];
		total += layers.size[i];
	}
	if (!ok)
		export_failed(out, errno);
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
		json_t *r = json_pack("{s:s,s:s,s:I,s:i}", "key", keyhex, "file", out, "bytes",
		                      (json_int_t)total, "layers", (int)layers.n);
		char *s = json_dumps(r, JSON_INDENT(2));
		fprintf(report, "%s\n", s);
		free(s);
		json_decref(r);
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

/* ---- import ---------------------------------------------------------------- */

static int bad_file(const char *path, const char *fmt, const char *detail)
{
	fprintf(stderr, "k3cachectl import: %s: ", path);
	fprintf(stderr, fmt, detail);
	fprintf(stderr, "; nothing was stored\n");
	return CTL_EXIT_ERROR;
}

int ctl_cmd_import(const struct ctl_globals *g, int argc, char **argv)
{
	static const char text[] = "k3cachectl [--socket PATH] [--json] import FILE";
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: %s\nStores a snapshot file written by `k3cachectl export`, "
		       "validated\n"
		       "like a publish: a damaged or foreign file stores nothing and says why.\n",
		       text);
		return CTL_EXIT_OK;
	}
	if (argc != 2)
		return usage("import", "expects exactly one FILE", text);
	const char *path = argv[1];
	if (g->db) {
		fprintf(stderr,
		        "k3cachectl import: changes the store: it needs the daemon (--db opens "
		        "the store read-only)\n");
		return CTL_EXIT_ERROR;
	}
	char err[512];
	struct ctl_file f;
	if (ctl_file_open(path, &f, err, sizeof(err)) != 0) {
		fprintf(stderr, "k3cachectl import: %s\n", err);
		return CTL_EXIT_ERROR;
	}
	int rc = CTL_EXIT_ERROR;
	json_t *doc = NULL;
	struct k3cache_model *spec = NULL;
	uint32_t *tokens = NULL;
	uint8_t *salt = NULL;
	struct k3cache_buf *bufs = NULL;
	struct ctl_backend b = {0};
	if (f.size < SNAP_MAGIC_LEN + 4 || memcmp(f.data, SNAP_MAGIC, SNAP_MAGIC_LEN) != 0) {
		rc = bad_file(path, "%s", "not a k3cache snapshot file (no K3SNAP1 header)");
		goto out;
	}
	uint32_t hlen = frame_get_len(f.data + SNAP_MAGIC_LEN);
	size_t body = SNAP_MAGIC_LEN + 4 + (size_t)hlen;
	if (hlen > SNAP_MAX_HEADER || hlen > f.size - SNAP_MAGIC_LEN - 4) {
		rc = bad_file(path, "%s", "truncated: the header runs past the end of the file");
		goto out;
	}
	json_error_t jerr;
	doc = json_loadb((const char *)f.data + SNAP_MAGIC_LEN + 4, hlen, JSON_REJECT_DUPLICATES,
	                 &jerr);
	if (!doc) {
		rc = bad_file(path, "the header is not valid JSON: %s", jerr.text);
		goto out;
	}
	json_t *jspec = json_object_get(doc, "model"), *jtoks = json_object_get(doc, "tokens"),
	       *jlayers = json_object_get(doc, "layers");
	const char *fphex = json_string_value(json_object_get(doc, "fingerprint"));
	const char *keyhex = json_string_value(json_object_get(doc, "key"));
	const char *salthex = json_string_value(json_object_get(doc, "salt"));
	if (json_integer_value(json_object_get(doc, "format")) != 1 || !jspec ||
	    !json_is_array(jtoks) || !json_is_array(jlayers) || !fphex || !keyhex || !salthex) {
		rc = bad_file(path, "%s",
		              "the header lacks format 1, model, tokens, layers, key or salt");
		goto out;
	}
	char *specjs = json_dumps(jspec, JSON_COMPACT);
	char merr[MODEL_ERROR_MAX];
	spec = specjs ? model_from_json(specjs, strlen(specjs), merr) : NULL;
	free(specjs);
	if (!spec) {
		rc = bad_file(path, "its model spec is invalid: %s", merr);
		goto out;
	}
	char fpcheck[65];
	hexutil_encode(spec->fingerprint, 32, fpcheck);
	if (strcmp(fpcheck, fphex) != 0) {
		rc = bad_file(path, "%s", "its model spec does not match its fingerprint");
		goto out;
	}
	size_t ntok = json_array_size(jtoks);
	size_t salt_len = strlen(salthex) / 2;
	tokens = malloc((ntok ? ntok : 1) * sizeof(*tokens));
	salt = malloc(salt_len + 1);
	if (!tokens || !salt || ntok == 0 || ntok > UINT32_MAX ||
	    hexutil_decode(salthex, salt, salt_len) != 0) {
		rc = bad_file(path, "%s", "its tokens or salt are malformed");
		goto out;
	}
	for (size_t i = 0; i < ntok; i++) {
		json_int_t t = json_integer_value(json_array_get(jtoks, i));
		if (!json_is_integer(json_array_get(jtoks, i)) || t < 0 ||
		    t > (json_int_t)UINT32_MAX) {
			rc = bad_file(path, "%s", "a token is not a u32");
			goto out;
		}
		tokens[i] = (uint32_t)t;
	}
	uint8_t key[32], want[32];
	if (prefix_key(spec->fingerprint, salt, salt_len, tokens, (uint32_t)ntok, key) != 0) {
		rc = bad_file(path, "%s", "out of memory computing its key");
		goto out;
	}
	if (hexutil_decode(keyhex, want, 32) != 0 || memcmp(key, want, 32) != 0) {
		rc = bad_file(path, "%s", "its key does not match its model, salt and tokens");
		goto out;
	}
	size_t nl = json_array_size(jlayers);
	if (nl != spec->n_layers) {
		char d[96];
		snprintf(d, sizeof(d), "%zu layers for a model of %u", nl, spec->n_layers);
		rc = bad_file(path, "it has %s", d);
		goto out;
	}
	bufs = calloc(nl, sizeof(*bufs));
	uint64_t off = body;
	for (size_t i = 0; bufs && i < nl; i++) {
		json_t *jl = json_array_get(jlayers, i);
		json_int_t size = json_integer_value(json_object_get(jl, "size"));
		const char *sumhex = json_string_value(json_object_get(jl, "xxh3"));
		char d[256];
		if (size <= 0 || !sumhex || (uint64_t)size > f.size - off) {
			snprintf(d, sizeof(d), "layer %zu: truncated: the file ends %s", i,
			         size <= 0 || !sumhex ? "(bad layer record)"
			                              : "before its bytes do");
			rc = bad_file(path, "%s", d);
			goto out;
		}
		uint64_t sum = strtoull(sumhex, NULL, 16);
		const unsigned char *blob = f.data + off;
		if (checksum_blob(blob, (size_t)size, (uint32_t)i) != sum) {
			snprintf(d, sizeof(d), "layer %zu: checksum mismatch: the file is damaged",
			         i);
			rc = bad_file(path, "%s", d);
			goto out;
		}
		struct blob_error berr;
		if (blob_check(blob, (size_t)size, spec, (uint32_t)i, (uint32_t)ntok, &berr) !=
		    BLOB_OK) {
			snprintf(d, sizeof(d), "%.200s (%s)", berr.message,
			         blob_class_name(berr.cls));
			rc = bad_file(path, "%s", d);
			goto out;
		}
		bufs[i].data = blob;
		bufs[i].len = (size_t)size;
		off += (uint64_t)size;
	}
	if (!bufs) {
		rc = bad_file(path, "%s", "out of memory");
		goto out;
	}
	if (off != f.size) {
		rc = bad_file(path, "%s", "it has trailing bytes after the last layer");
		goto out;
	}
	if ((rc = ctl_backend_open(g, &b, "import")) != 0)
		goto out;
	struct k3cache_error kerr;
	struct k3cache_publish_result res;
	if (k3cache_put_model(b.conn, spec, NULL, &kerr) != 0 ||
	    k3cache_publish(b.conn, spec->fingerprint, salt, salt_len, tokens, (uint32_t)ntok, bufs,
	                    (uint32_t)nl, &res, &kerr) != 0) {
		fprintf(stderr, "k3cachectl import: %s: %s: %s\n", path,
		        k3cache_code_name(kerr.code), kerr.message);
		rc = kerr.unreachable ? CTL_EXIT_NODAEMON : CTL_EXIT_ERROR;
		goto out;
	}
	char k[65];
	hexutil_encode(res.key, 32, k);
	if (g->json) {
		json_t *r = json_pack("{s:s,s:b,s:I}", "key", k, "created", res.created, "bytes",
		                      (json_int_t)res.bytes);
		char *s = json_dumps(r, JSON_INDENT(2));
		puts(s);
		free(s);
		json_decref(r);
	} else {
		printf("imported %.16s (%s, %zu tokens): %s\n", k, spec->name, ntok,
		       res.created ? "stored" : "already stored");
	}
	rc = CTL_EXIT_OK;
out:
	ctl_backend_close(&b);
	free(bufs);
	free(tokens);
	free(salt);
	model_free(spec);
	json_decref(doc);
	ctl_file_close(&f);
	return rc;
}
