/* tenancy: who a peer is and what it may do (tenancy.c).
 *
 * Every connection has a namespace: on the Unix socket the peer's uid
 * (SO_PEERCRED), or the uid that --share-uids maps it to; on TCP the NAME of
 * the --token-file line whose token it sent in Hello. The namespace is part
 * of every key the peer makes: the daemon puts it in front of the salt of
 * each Publish and Lookup ("\0k3ns:uid=1000\0" + salt; no namespace is a
 * prefix of another), so one tenant's entries are never found, restored or
 * listed for another, whatever salts they choose.
 *
 * Admins have no namespace (their salts are taken as they are, as before
 * tenancy: a store made by workers running as root, or as the daemon's own
 * user, keeps working) and may run every op: root, the daemon's own uid,
 * members of --admin-group, TCP peers with an `admin` token line, and, with
 * --insecure-tcp, every TCP peer. Others get DENIED for List, Inspect,
 * Resolve, Evict and Verify (so for ls, inspect, export, evict and verify;
 * a brief Inspect, the library's "is it stored?", answers for their own
 * entries only),
 * and for PutModel of a model the store does not hold (k3cachectl model
 * add); a put of a stored model is answered as before. Restore by key serves
 * only the peer's own entries (NOT_FOUND otherwise). Stat, ListModels and
 * Hello are open to all; on TCP with --token-file every other op is DENIED
 * until Hello carries a valid token. */
#ifndef K3_DAEMON_TENANCY_H
#define K3_DAEMON_TENANCY_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "status.h"

#define K3D_NS_MAX 96

struct k3d_peer {
	int authed;          /* may make requests beyond Hello */
	int admin;           /* may run every op; no namespace */
	char ns[K3D_NS_MAX]; /* the salt prefix ("" for admins) */
	size_t ns_len;
	char who[80]; /* "uid 1000", "token alice": for messages */
};

struct k3d_token {
	char name[64];
	char token[128];
	size_t len;
	int admin;
	unsigned line; /* of the --token-file, for messages */
};

struct k3d_share {
	uint32_t uid, as; /* uid's namespace is that of uid `as` */
};

struct k3d_tenancy {
	int has_admin_gid;
	uint32_t admin_gid;
	struct k3d_share *share;
	size_t n_share;
	struct k3d_token *tokens; /* NULL: no --token-file */
	size_t n_tokens;
	int insecure_tcp;
};

/* Reads --token-file (lines "NAME TOKEN [admin]"; # comments and blank lines
 * skipped) and resolves --admin-group. 0, or -1 after logging why. */
int k3d_tenancy_load(struct k3d_tenancy *t, const char *token_file, const char *admin_group);
/* Parses a --share-uids list ("1000,1001": all in the first one's
 * namespace) into t. 0; -1 for a malformed list or one of fewer than two
 * uids; K3D_SHARE_TWICE when a uid is in an earlier list of t or twice in
 * this one (*twice is that uid): a uid has one namespace. */
#define K3D_SHARE_TWICE (-2)
int k3d_tenancy_share(struct k3d_tenancy *t, const char *list, uint32_t *twice);
void k3d_tenancy_free(struct k3d_tenancy *t);

/* Who the peer on fd is: tcp says whether it came in on --listen. */
void k3d_peer_identify(const struct k3d_tenancy *t, int fd, int tcp, struct k3d_peer *p);
/* A Hello's token: OK (the peer is now NAME), or DENIED. */
enum status_code k3d_peer_hello(const struct k3d_tenancy *t, struct k3d_peer *p, const char *token,
                                struct status *st);

/* Whether the peer may make this request; when it may, puts its namespace
 * in front of the request's salt. OK or DENIED (with the message). */
enum status_code k3d_peer_admit(const struct k3d_peer *p, frame_request *req, int model_stored,
                                struct status *st);
/* Whether an entry stored under this salt is the peer's. */
int k3d_peer_owns(const struct k3d_peer *p, const void *salt, size_t salt_len);

#endif
