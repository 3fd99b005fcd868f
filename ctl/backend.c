/* k3cachectl's two backends: a daemon over its socket, or a store opened
 * read-only (--db) and answered by the same service module the daemon uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "hexutil.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "ops.h"
#include "progress.h"
#include "service.h"
#include "store.h"

int ctl_backend_open(const struct ctl_globals *g, struct ctl_backend *b, const char *cmd)
{
	memset(b, 0, sizeof(*b));
	if (g->db) {
		struct store_options o = {.read_only = 1};
		struct status st;
		b->where = g->db;
		if (store_open(g->db, &o, &b->store, &st) != STATUS_OK) {
			fprintf(stderr, "k3cachectl %s: --db %s: %s\n", cmd, g->db, st.message);
			return CTL_EXIT_ERROR;
		}
		return 0;
	}
	struct k3cache_error err;
	static char defbuf[4096];
	b->where = g->socket ? g->socket : k3cache_default_socket(defbuf, sizeof(defbuf));
	if (k3cache_connect(b->where, &b->conn, &err) != 0) {
		if (!err.unreachable && err.code == K3CACHE_INVALID) { /* a bad address */
			fprintf(stderr, "k3cachectl %s: --socket: %s\n", cmd, err.message);
			return CTL_EXIT_USAGE;
		}
		if (err.code == K3CACHE_DENIED) { /* reached, and refused: a wrong token */
			fprintf(stderr, "k3cachectl %s: DENIED: %s\n", cmd, err.message);
			return CTL_EXIT_ERROR;
		}
		fprintf(stderr,
		        "k3cachectl %s: %s\n  (name the daemon's socket with --socket PATH or "
		        "$K3CACHE_SOCKET, or read a store without a daemon with --db DIR)\n",
		        cmd, err.message);
		return CTL_EXIT_NODAEMON;
	}
	return 0;
}

void ctl_backend_close(struct ctl_backend *b)
{
	if (b->conn)
		k3cache_close(b->conn);
	if (b->store)
		store_close(b->store);
	memset(b, 0, sizeof(*b));
}

/* What k3cachectl --db answers from the store it opens read-only: the ops
 * ops.h marks db, by service_dispatch() but for these two, which the daemon
 * answers from its own state. An evict only dry-runs. */
static void off_hello(struct store *s, const frame_request *req, frame_response *r)
{
	(void)s;
	(void)req;
	r->protocol = 1;
	r->server = (char *)protobuf_c_empty_string;
}

static void off_stat(struct store *s, const frame_request *req, frame_response *r)
{
	(void)req;
	service_store_counters(s, r);
}

static void off_dispatch(struct store *s, const frame_request *req, frame_response *r)
{
	(void)service_dispatch(s, req, r);
}

static void (*const offline_ops[OPS_N])(struct store *, const frame_request *, frame_response *) = {
        [OPS_HELLO] = off_hello,
        [OPS_STAT] = off_stat,
};

int ctl_exit_of(const struct k3cache_error *err)
{
	return err->unreachable && err->code == K3CACHE_INTERNAL ? CTL_EXIT_NODAEMON
	                                                         : CTL_EXIT_ERROR;
}

int ctl_call(struct ctl_backend *b, frame_request *req, frame_response **resp, const char *cmd)
{
	*resp = NULL;
	if (b->conn) {
		struct k3cache_error err;
		if (k3cache_call(b->conn, req, resp, &err) != 0) {
			fprintf(stderr, "k3cachectl %s: %s\n", cmd, err.message);
			return ctl_exit_of(&err);
		}
		return 0;
	}
	frame_response *r = malloc(sizeof(*r));
	if (!r) {
		fprintf(stderr, "k3cachectl %s: out of memory\n", cmd);
		return CTL_EXIT_ERROR;
	}
	k3cache__v1__response__init(r);
	r->id = req->id;
	enum ops_id op = ops_of(req);
	void (*answer)(struct store *, const frame_request *, frame_response *) = NULL;
	if (ops_table[op].db)
		answer = offline_ops[op] ? offline_ops[op] : off_dispatch;
	if (req->op_case == K3CACHE__V1__REQUEST__OP_EVICT && !req->evict->dry_run)
		answer = NULL;
	if (answer) {
		answer(b->store, req, r);
	} else {
		struct status st;
		status_set(&st, STATUS_UNSUPPORTED,
		           "%s changes the store: it needs the daemon (--db opens the store "
		           "read-only)",
		           cmd);
		service_fail(r, &st);
	}
	*resp = r;
	return 0;
}

void ctl_response_free(struct ctl_backend *b, frame_response *resp)
{
	if (!resp)
		return;
	if (b->conn) {
		k3cache_response_free(resp);
		return;
	}
	service_response_clear(resp);
	free(resp);
}

int ctl_call_ok(struct ctl_backend *b, frame_request *req, frame_response **resp, const char *cmd)
{
	int rc = ctl_call(b, req, resp, cmd);
	if (rc)
		return rc;
	if (!*resp)
		return CTL_EXIT_ERROR;
	if ((*resp)->code != 0) {
		rc = ctl_answer_error(*resp, cmd);
		ctl_response_free(b, *resp);
		*resp = NULL;
		return rc;
	}
	/* every entry an answer lists is named by its key (ls pages on by the
	 * last one, evict and inspect print them): one without is an answer
	 * out of step, refused here rather than read past its end */
	for (size_t i = 0; i < (*resp)->n_entries; i++)
		if (!(*resp)->entries[i] || (*resp)->entries[i]->key.len != 32) {
			fprintf(stderr,
			        "k3cachectl %s: the answer's entry %zu has no 32-byte key (the "
			        "daemon "
			        "is out of step)\n",
			        cmd, i);
			ctl_response_free(b, *resp);
			*resp = NULL;
			return CTL_EXIT_ERROR;
		}
	return rc;
}

int ctl_answer_error(const frame_response *resp, const char *cmd)
{
	fprintf(stderr, "k3cachectl %s: %s: %s\n", cmd,
	        status_code_name((enum status_code)resp->code), resp->message);
	return resp->code == K3CACHE__V1__CODE__NOT_FOUND ? CTL_EXIT_NOTFOUND : CTL_EXIT_ERROR;
}

int ctl_resolve_key(struct ctl_backend *b, const char *hex, uint8_t key[32], const char *cmd)
{
	size_t n = strlen(hex);
	if (n < 8 || n > 64 || strspn(hex, "0123456789abcdefABCDEF") != n) {
		fprintf(stderr,
		        "k3cachectl %s: \"%s\": a key is 8 to 64 hex digits (a unique prefix)\n",
		        cmd, hex);
		return CTL_EXIT_USAGE;
	}
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Resolve rs = K3CACHE__V1__RESOLVE__INIT;
	rs.prefix = (char *)hex;
	req.op_case = K3CACHE__V1__REQUEST__OP_RESOLVE;
	req.resolve = &rs;
	frame_response *resp;
	int rc = ctl_call_ok(b, &req, &resp, cmd);
	if (rc)
		return rc;
	if (resp->key.len != 32) {
		fprintf(stderr, "k3cachectl %s: the answer carries no key\n", cmd);
		rc = CTL_EXIT_ERROR;
	} else {
		memcpy(key, resp->key.data, 32);
	}
	ctl_response_free(b, resp);
	return rc;
}

int ctl_inspect_entry(struct ctl_backend *b, const uint8_t key[32], frame_response **resp,
                      const char *cmd)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Inspect ins = K3CACHE__V1__INSPECT__INIT;
	ins.key.data = (uint8_t *)key;
	ins.key.len = 32;
	req.op_case = K3CACHE__V1__REQUEST__OP_INSPECT;
	req.inspect = &ins;
	int rc = ctl_call_ok(b, &req, resp, cmd);
	if (rc)
		return rc;
	if ((*resp)->n_entries != 1 || (*resp)->entries[0]->model.len != 32) {
		if ((*resp)->n_entries != 1)
			fprintf(stderr, "k3cachectl %s: the answer carries %zu entries, not one\n",
			        cmd, (*resp)->n_entries);
		else
			fprintf(stderr,
			        "k3cachectl %s: the answer's entry has no 32-byte model "
			        "fingerprint "
			        "(the daemon is out of step)\n",
			        cmd);
		rc = CTL_EXIT_ERROR;
		ctl_response_free(b, *resp);
		*resp = NULL;
	}
	return rc;
}

void ctl_layers_free(struct ctl_layers *l)
{
	for (uint32_t i = 0; i < l->n && l->data; i++)
		free(l->data[i]);
	free(l->data);
	free(l->size);
	free(l->xxh3);
	memset(l, 0, sizeof(*l));
}

static int alloc_layers(struct ctl_layers *l, uint32_t n)
{
	l->n = n;
	l->data = calloc(n ? n : 1, sizeof(*l->data));
	l->size = calloc(n ? n : 1, sizeof(*l->size));
	l->xxh3 = calloc(n ? n : 1, sizeof(*l->xxh3));
	return l->data && l->size && l->xxh3 ? 0 : -1;
}

/* Bytes read from the daemon at a time, so that progress moves within a
 * large layer. */
#define FETCH_PIECE (8u << 20)

/* "CMD KEY: reading", on stderr when show, for `total` bytes. */
static void begin_reading(struct ctl_progress *p, int show, const uint8_t key[32], uint64_t total,
                          const char *cmd)
{
	char k[65], what[96];
	hexutil_encode(key, 32, k);
	snprintf(what, sizeof(what), "%s %.16s: reading", cmd, k);
	ctl_progress_begin(p, show ? stderr : NULL, what, total);
}

/* --db: the layers copied out of the store's map. */
static int fetch_from_store(struct ctl_backend *b, const uint8_t key[32], struct ctl_layers *out,
                            int progress, const char *cmd)
{
	struct store_snapshot *snap;
	struct status st;
	if (store_restore_opt(b->store, key, 0, &snap, &st) != STATUS_OK) {
		fprintf(stderr, "k3cachectl %s: %s: %s\n", cmd, status_code_name(st.code),
		        st.message);
		return st.code == STATUS_NOT_FOUND ? CTL_EXIT_NOTFOUND : CTL_EXIT_ERROR;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < snap->n_layers; i++)
		total += snap->layers[i].size;
	struct ctl_progress prog;
	begin_reading(&prog, progress, key, total, cmd);
	int rc = alloc_layers(out, snap->n_layers);
	out->prefix_len = snap->prefix_len;
	memcpy(out->model, snap->fingerprint, 32);
	for (uint32_t i = 0; !rc && i < snap->n_layers; i++) {
		const struct store_layer *l = &snap->layers[i];
		out->size[i] = l->size;
		out->xxh3[i] = l->xxh3;
		out->data[i] = malloc(l->size ? l->size : 1);
		if (!out->data[i]) {
			rc = -1;
			break;
		}
		size_t off = 0;
		for (uint32_t j = 0; j < l->n_segments; j++) {
			memcpy(out->data[i] + off, l->segments[j].data, l->segments[j].len);
			off += l->segments[j].len;
			ctl_progress_add(&prog, l->segments[j].len);
		}
	}
	ctl_progress_end(&prog);
	store_snapshot_release(snap);
	if (rc) {
		ctl_layers_free(out);
		fprintf(stderr, "k3cachectl %s: out of memory\n", cmd);
		return CTL_EXIT_ERROR;
	}
	return 0;
}

/* The daemon's restore (a peek), read in pieces. */
static int fetch_from_daemon(struct ctl_backend *b, const uint8_t key[32], struct ctl_layers *out,
                             int progress, const char *cmd)
{
	frame_request req = K3CACHE__V1__REQUEST__INIT;
	K3cache__V1__Restore rs = K3CACHE__V1__RESTORE__INIT;
	rs.key.data = (uint8_t *)key;
	rs.key.len = 32;
	rs.peek = 1; /* looking is not using: no LRU refresh, no restore counted */
	req.op_case = K3CACHE__V1__REQUEST__OP_RESTORE;
	req.restore = &rs;
	frame_response *resp;
	int rc = ctl_call_ok(b, &req, &resp, cmd);
	if (rc)
		return rc;
	uint64_t sum = 0;
	for (size_t i = 0; i < resp->n_layers; i++)
		sum += resp->layers[i]->size;
	if (sum != resp->payload_len || alloc_layers(out, (uint32_t)resp->n_layers) != 0) {
		fprintf(stderr, "k3cachectl %s: the daemon's layer list does not add up\n", cmd);
		ctl_response_free(b, resp);
		ctl_layers_free(out);
		return CTL_EXIT_ERROR;
	}
	out->prefix_len = resp->prefix_len;
	if (resp->model.len == 32)
		memcpy(out->model, resp->model.data, 32);
	struct ctl_progress prog;
	begin_reading(&prog, progress, key, sum, cmd);
	for (size_t i = 0; i < resp->n_layers; i++) {
		struct k3cache_error err;
		out->size[i] = resp->layers[i]->size;
		out->xxh3[i] = resp->layers[i]->xxh3;
		out->data[i] = malloc(out->size[i] ? out->size[i] : 1);
		int failed = !out->data[i];
		for (uint64_t off = 0; !failed && off < out->size[i]; off += FETCH_PIECE) {
			size_t n = out->size[i] - off < FETCH_PIECE ? (size_t)(out->size[i] - off)
			                                            : FETCH_PIECE;
			failed = k3cache_read_payload(b->conn, out->data[i] + off, n, &err) != 0;
			ctl_progress_add(&prog, failed ? 0 : n);
		}
		if (failed) {
			ctl_progress_end(&prog);
			int lost = out->data[i] != NULL;
			fprintf(stderr, "k3cachectl %s: reading layer %zu: %s%s\n", cmd, i,
			        lost ? err.message : "out of memory",
			        lost ? " (a daemon ends a restore early for a reader under its "
			               "--min-download-rate, or at a damaged chunk: see its log)"
			             : "");
			ctl_response_free(b, resp);
			ctl_layers_free(out);
			return lost ? ctl_exit_of(&err) : CTL_EXIT_ERROR;
		}
	}
	ctl_progress_end(&prog);
	ctl_response_free(b, resp);
	return 0;
}

int ctl_fetch_layers(struct ctl_backend *b, const uint8_t key[32], struct ctl_layers *out,
                     int progress, const char *cmd)
{
	memset(out, 0, sizeof(*out));
	return b->store ? fetch_from_store(b, key, out, progress, cmd)
	                : fetch_from_daemon(b, key, out, progress, cmd);
}
