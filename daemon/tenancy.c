/* tenancy: peers' namespaces and rights (tenancy.h). */
#include <errno.h>
#include <grp.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon.h"
#include "tenancy.h"
#include "units.h"

#define NS_TAG "\0k3ns:"

static int parse_token_line(char *line, struct k3d_token *tok)
{
	char *save = NULL;
	const char *name = strtok_r(line, " \t\r\n", &save);
	const char *token = name ? strtok_r(NULL, " \t\r\n", &save) : NULL;
	const char *flag = token ? strtok_r(NULL, " \t\r\n", &save) : NULL;
	if (!token || strlen(name) >= sizeof(tok->name) || strlen(token) >= sizeof(tok->token) ||
	    strlen(token) < 16 || (flag && strcmp(flag, "admin") != 0) ||
	    (flag && strtok_r(NULL, " \t\r\n", &save)))
		return -1;
	memset(tok, 0, sizeof(*tok));
	snprintf(tok->name, sizeof(tok->name), "%s", name);
	memcpy(tok->token, token, strlen(token));
	tok->len = strlen(token);
	tok->admin = flag != NULL;
	return 0;
}

static int load_tokens(struct k3d_tenancy *t, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		k3d_log(K3D_LOG_ERROR, "--token-file %s: %s", path, strerror(errno));
		return -1;
	}
	char line[512];
	unsigned no = 0;
	int rc = 0;
	while (fgets(line, sizeof(line), f)) {
		no++;
		if (!strchr(line, '\n') && !feof(f)) {
			/* its tail must not be read as a line of its own */
			k3d_log(K3D_LOG_ERROR, "--token-file %s:%u: a line longer than %zu bytes",
			        path, no, sizeof(line) - 2);
			rc = -1;
			break;
		}
		const char *p = line + strspn(line, " \t\r\n");
		if (!*p || *p == '#')
			continue;
		struct k3d_token tok;
		if (parse_token_line(line, &tok) != 0) {
			k3d_log(K3D_LOG_ERROR,
			        "--token-file %s:%u: expected NAME TOKEN [admin], a name under 64 "
			        "bytes and a token of 16 to 127",
			        path, no);
			rc = -1;
			break;
		}
		size_t same = t->n_tokens;
		for (size_t i = 0; i < t->n_tokens && same == t->n_tokens; i++)
			if (t->tokens[i].len == tok.len &&
			    !memcmp(t->tokens[i].token, tok.token, tok.len))
				same = i;
		if (same < t->n_tokens) { /* a client would be the first line's only */
			k3d_log(K3D_LOG_ERROR,
			        "--token-file %s:%u: the token of line %u again: one token per "
			        "name",
			        path, no, t->tokens[same].line);
			rc = -1;
			break;
		}
		tok.line = no;
		struct k3d_token *n = realloc(t->tokens, (t->n_tokens + 1) * sizeof(*n));
		if (!n) {
			rc = -1;
			break;
		}
		t->tokens = n;
		t->tokens[t->n_tokens++] = tok;
	}
	fclose(f);
	if (!rc && !t->n_tokens) {
		k3d_log(K3D_LOG_ERROR, "--token-file %s: no token in it", path);
		rc = -1;
	}
	if (!t->tokens) /* set, even empty: TCP peers need a token */
		t->tokens = calloc(1, sizeof(*t->tokens));
	return rc;
}

int k3d_tenancy_load(struct k3d_tenancy *t, const char *token_file, const char *admin_group)
{
	if (admin_group) {
		struct group gr, *res = NULL;
		char buf[4096];
		if (getgrnam_r(admin_group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
			k3d_log(K3D_LOG_ERROR, "--admin-group %s: no such group", admin_group);
			return -1;
		}
		t->has_admin_gid = 1;
		t->admin_gid = (uint32_t)res->gr_gid;
	}
	return token_file ? load_tokens(t, token_file) : 0;
}

int k3d_tenancy_share(struct k3d_tenancy *t, const char *list, uint32_t *twice)
{
	char *copy = strdup(list), *save = NULL;
	if (!copy)
		return -1;
	uint32_t first = 0;
	int n = 0, rc = 0;
	for (const char *u = strtok_r(copy, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
		uint64_t v;
		struct k3d_share *s = realloc(t->share, (t->n_share + 1) * sizeof(*s));
		if (units_parse_uint(u, 0, UINT32_MAX - 1, &v) || !s) {
			if (s)
				t->share = s;
			rc = -1;
			break;
		}
		t->share = s;
		for (size_t i = 0; i < t->n_share && !rc; i++)
			if (t->share[i].uid == (uint32_t)v) {
				*twice = (uint32_t)v;
				rc = K3D_SHARE_TWICE;
			}
		if (rc)
			break;
		if (n++ == 0)
			first = (uint32_t)v;
		t->share[t->n_share++] = (struct k3d_share){(uint32_t)v, first};
	}
	free(copy);
	return rc ? rc : n < 2 ? -1 : 0;
}

void k3d_tenancy_free(struct k3d_tenancy *t)
{
	free(t->share);
	free(t->tokens);
	memset(t, 0, sizeof(*t));
}

static void set_ns(struct k3d_peer *p, const char *kind, const char *name)
{
	/* "\0k3ns:" KIND "=" NAME "\0": NAME holds no NUL, so no namespace is
	 * a prefix of another */
	int n = snprintf(p->ns + 6, sizeof(p->ns) - 6, "%s=%s", kind, name);
	memcpy(p->ns, NS_TAG, 6);
	p->ns_len = 6 + (size_t)n + 1; /* with the final NUL */
}

static int in_admin_group(const struct k3d_tenancy *t, int fd, uint32_t gid)
{
	if (!t->has_admin_gid)
		return 0;
	if (gid == t->admin_gid)
		return 1;
	gid_t groups[256];
	socklen_t len = sizeof(groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0)
		return 0;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == t->admin_gid)
			return 1;
	return 0;
}

void k3d_peer_identify(const struct k3d_tenancy *t, int fd, int tcp, struct k3d_peer *p)
{
	memset(p, 0, sizeof(*p));
	if (tcp) {
		snprintf(p->who, sizeof(p->who), "tcp");
		if (!t->tokens && t->insecure_tcp) { /* every TCP peer is trusted */
			p->authed = p->admin = 1;
			return;
		}
		return; /* until its Hello carries a token */
	}
	struct ucred cred;
	socklen_t len = sizeof(cred);
	p->authed = 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		snprintf(p->who, sizeof(p->who), "unknown uid");
		set_ns(p, "uid", "unknown");
		return;
	}
	snprintf(p->who, sizeof(p->who), "uid %u", (unsigned)cred.uid);
	if (cred.uid == 0 || cred.uid == geteuid() || in_admin_group(t, fd, cred.gid)) {
		p->admin = 1;
		return;
	}
	uint32_t as = cred.uid;
	for (size_t i = 0; i < t->n_share; i++)
		if (t->share[i].uid == cred.uid)
			as = t->share[i].as;
	char name[16];
	snprintf(name, sizeof(name), "%u", (unsigned)as);
	set_ns(p, "uid", name);
}

enum status_code k3d_peer_hello(const struct k3d_tenancy *t, struct k3d_peer *p, const char *token,
                                struct status *st)
{
	if (!token || !*token || !t->tokens)
		return STATUS_OK; /* a plain Hello (Unix, or no token yet) */
	size_t len = strlen(token);
	const struct k3d_token *hit = NULL;
	char padded[sizeof(t->tokens[0].token)] = {0};
	memcpy(padded, token, len < sizeof(padded) ? len : sizeof(padded) - 1);
	/* every line is compared, in full, in constant time */
	for (size_t i = 0; i < t->n_tokens; i++) {
		int same = CRYPTO_memcmp(padded, t->tokens[i].token, sizeof(padded)) == 0 &&
		           len == t->tokens[i].len;
		if (same && !hit)
			hit = &t->tokens[i];
	}
	if (!hit)
		return status_set(
		        st, STATUS_DENIED,
		        "the token is not in the daemon's --token-file (set K3CACHE_TOKEN)");
	p->authed = 1;
	p->admin = hit->admin;
	set_ns(p, "name", hit->name);
	snprintf(p->who, sizeof(p->who), "token %s", hit->name);
	return STATUS_OK;
}

/* Puts the namespace in front of a salt (the request owns it). */
static int prefix_salt(const struct k3d_peer *p, ProtobufCBinaryData *salt)
{
	if (!p->ns_len)
		return 0;
	unsigned char *b = malloc(p->ns_len + salt->len);
	if (!b)
		return -1;
	memcpy(b, p->ns, p->ns_len);
	if (salt->len)
		memcpy(b + p->ns_len, salt->data, salt->len);
	free(salt->data);
	salt->data = b;
	salt->len += p->ns_len;
	return 0;
}

enum status_code k3d_peer_admit(const struct k3d_peer *p, frame_request *req, int model_stored,
                                struct status *st)
{
	const char *admin_op = NULL;
	switch (req->op_case) {
	case K3CACHE__V1__REQUEST__OP_HELLO:
		return STATUS_OK;
	case K3CACHE__V1__REQUEST__OP_LIST:
		admin_op = "listing the entries (ls)";
		break;
	case K3CACHE__V1__REQUEST__OP_INSPECT:
		/* brief: the library's "is it stored?" before a publish, which
		 * the handler answers for the peer's own entries only */
		if (!req->inspect->brief)
			admin_op = "inspecting an entry (inspect, export)";
		break;
	case K3CACHE__V1__REQUEST__OP_RESOLVE:
		admin_op = "resolving a key prefix";
		break;
	case K3CACHE__V1__REQUEST__OP_EVICT:
		admin_op = "evicting";
		break;
	case K3CACHE__V1__REQUEST__OP_VERIFY:
		admin_op = "verify";
		break;
	case K3CACHE__V1__REQUEST__OP_PUT_MODEL:
		if (!model_stored)
			admin_op = "adding a model the store does not hold (k3cachectl model add)";
		break;
	default:
		break;
	}
	if (!p->authed)
		return status_set(st, STATUS_DENIED,
		                  "this TCP listener needs a token: send one in Hello (set "
		                  "K3CACHE_TOKEN to a token of the daemon's --token-file)");
	if (admin_op && !p->admin)
		return status_set(st, STATUS_DENIED,
		                  "%s needs an admin: root, the daemon's user, a member of its "
		                  "--admin-group, or an admin token (this is %s)",
		                  admin_op, p->who);
	int rc = 0;
	if (req->op_case == K3CACHE__V1__REQUEST__OP_PUBLISH)
		rc = prefix_salt(p, &req->publish->salt);
	else if (req->op_case == K3CACHE__V1__REQUEST__OP_LOOKUP)
		rc = prefix_salt(p, &req->lookup->salt);
	return rc ? status_set(st, STATUS_BUSY, "out of memory; retry later") : STATUS_OK;
}

int k3d_peer_owns(const struct k3d_peer *p, const void *salt, size_t salt_len)
{
	return p->admin || (salt_len >= p->ns_len && !memcmp(salt, p->ns, p->ns_len));
}
