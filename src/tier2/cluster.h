/* cluster: a thin Redis Cluster router over hiredis, for tier 2 (issue 17).
 *
 * Contract:
 * - A key goes to the master that owns its slot: CRC16 (XMODEM) of the key, or
 *   of its {hash tag}, mod 16384, exactly as Redis's keyHashSlot.
 * - The slot map comes from CLUSTER SLOTS, asked of any reachable node (seeds
 *   and known masters, in turn): when the router has no map, after a MOVED and
 *   after a node error; not more than once per backoff_min_ms unless it has
 *   none.
 * - MOVED sets that slot to the named node (and the map is refreshed); ASK
 *   sends ASKING then the command to the named node, leaving the map alone.
 *   A MOVED or ASK naming a slot other than the command's (Redis names the
 *   slot of the command's keys) is the node's protocol error: the command
 *   fails, the node's failure is recorded (node_errors, backoff, the map
 *   read again), and no slot or command moves.
 *   TRYAGAIN (a command on several keys of a slot being moved, some of them
 *   moved) sends it again, routed anew, after a pause of 10 ms doubling to
 *   160 ms. A command is redirected at most CLUSTER_MAX_REDIRECTS times.
 * - One blocking hiredis connection per node, opened on first use, with AUTH
 *   [user] password when a password is set. A connect has connect_timeout_ms;
 *   a round trip on a node (a command; a pipeline's commands to it written,
 *   then, from when its turn to be read comes, its replies read) ends
 *   command_timeout_ms after its bytes last moved (written, read, or taken
 *   by the node from this socket's queue: SIOCOUTQ), and moves them at 1 MiB/s
 *   or more after the first command_timeout_ms (a node trickling a byte at a
 *   time within the timeout ends at about it). Each system call's socket
 *   timeout is cut to what is left. A reply is refused once it has read more than its command's
 *   max_reply bytes (the router's max_reply_bytes otherwise), an array's
 *   elements included, or once the objects hiredis makes of it would take
 *   more than that (cluster_reader_charge: an array of small elements takes
 *   18 times its bytes, ":1\r\n" a redisReply and a slot of its array, 72),
 *   each give or take 64 KiB (hiredis reads 16 KiB a call).
 *   A timeout or a refused reply is the node's failure, never a hang. Host
 *   names are resolved by the system resolver, which has no deadline here.
 * - A command for a slot the map gives no master fails at once, and makes the
 *   map stale: it is read again before a later command (within the
 *   backoff_min_ms limit), so a map read while a cluster was being made, or
 *   a master failing over, does not stay; a map with such slots is read again
 *   after backoff_max_ms in any case (cluster_n_masters). A MOVED to a node
 *   of unknown endpoint has the map read at once, in a pipeline between its
 *   rounds.
 * - A node that failed (connect, AUTH, I/O, timeout, protocol) is not tried
 *   again before its backoff passes: backoff_min_ms after the first failure,
 *   doubling to backoff_max_ms; a good round trip resets it. Meanwhile the
 *   commands for its slots fail at once, unless the map names another node.
 * - A command whose node could not be reached, or dropped the connection
 *   before answering (not a timeout, nor after ASK), is sent once more when
 *   the map, refreshed then (within the backoff_min_ms limit), names another
 *   master for its slot: a replica a failover promoted. It may so reach a
 *   dead master and then its successor, so commands given to the router
 *   must be idempotent (tier2's are: GET, SET of a value named by its
 *   content or generation, SET NX of a record, which the put reads back
 *   when it is answered nil, DEL, sets, sorted sets, hashes, scripts that
 *   add or remove one member).
 * - Replies are hiredis redisReply trees that the caller frees
 *   (freeReplyObject). Error replies other than MOVED and ASK (WRONGTYPE,
 *   CLUSTERDOWN, OOM...) are replies, not failures.
 * - A failure returns -1 (or a count, for cluster_pipeline) and leaves one
 *   message in cluster_error(): what failed, where (host:port), the command
 *   and the reason, e.g. "redis 127.0.0.1:7001: AUTH: WRONGPASS invalid
 *   username-password pair".
 * - Replies are not trusted: the parsers check types, element counts, slot
 *   ranges, ports and string lengths, and the router's readers refuse arrays
 *   of more than CLUSTER_REPLY_MAX_ELEMENTS elements (hiredis would allocate
 *   whatever count a peer sends).
 * - Not here: reads from replicas, failover beyond following the map,
 *   multi-key commands across slots, pub/sub, TLS, threads (a router is used
 *   by one thread at a time).
 */
#ifndef K3_TIER2_CLUSTER_H
#define K3_TIER2_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#define CLUSTER_SLOTS              16384
#define CLUSTER_MAX_REDIRECTS      5
#define CLUSTER_HOST_MAX           255 /* a host name or address, without its NUL */
#define CLUSTER_MAX_SEEDS          64
#define CLUSTER_MAX_NODES          1024 /* distinct masters in one slot map */
#define CLUSTER_REPLY_MAX_ELEMENTS (1 << 20)
/* The bytes a reply may take, unless its command or the router says less: a
 * peer announces a string's length, and hiredis buffers it all. */
#define CLUSTER_REPLY_MAX_BYTES ((size_t)64 << 20)
#define CLUSTER_NO_NODE         UINT16_MAX

/* A node's address: a host name, IPv4 or IPv6 address (no brackets), and a
 * port 1..65535. */
struct cluster_addr {
	char host[CLUSTER_HOST_MAX + 1];
	int port;
};

/* The slot of a key: 0..16383. Never fails. */
unsigned cluster_key_slot(const char *key, size_t len);

/* ---- seed lists ---- */

struct cluster_seeds {
	size_t n;
	struct cluster_addr addr[CLUSTER_MAX_SEEDS];
};

/* Parses "redis://HOST:PORT[,HOST:PORT...]" (the "redis://" once, at the
 * start, may be left out; an IPv6 address as [ADDR]:PORT or ADDR:PORT, the
 * port after the last colon). A seed given twice is kept once. Returns 0, or
 * -1 with a message in err for an empty list or element, a missing or bad
 * port, an empty, long or odd host, a user, password, path or other scheme,
 * or more than CLUSTER_MAX_SEEDS seeds (out->n is then 0). */
int cluster_seeds_parse(const char *spec, struct cluster_seeds *out, char *err, size_t errsz);

/* ---- slot maps ---- */

struct cluster_map {
	uint16_t slot[CLUSTER_SLOTS]; /* index into node, or CLUSTER_NO_NODE */
	size_t n_nodes;
	struct cluster_addr node[CLUSTER_MAX_NODES];
};

/* Parses a CLUSTER SLOTS reply into map (every slot's master; replicas are
 * ignored). asked_host is the host of the node that answered: an empty or
 * nil endpoint means that host. An unknown endpoint ("?") takes the "ip" of
 * the node's metadata (Redis 7) when there is one, else its slots stay
 * CLUSTER_NO_NODE. Returns 0, or -1 with a message in err when the reply is
 * not an array of [start, end, [host, port, ...], ...] ranges with slots
 * 0..16383, start <= end, no overlaps, ports 1..65535, hosts of at most
 * CLUSTER_HOST_MAX name characters, and at most CLUSTER_MAX_NODES masters;
 * map is then undefined. */
int cluster_map_parse(const redisReply *reply, const char *asked_host, struct cluster_map *map,
                      char *err, size_t errsz);

/* ---- redirections ---- */

enum cluster_redirect_kind {
	CLUSTER_REDIRECT_MOVED = 1,
	CLUSTER_REDIRECT_ASK = 2,
};

struct cluster_redirect {
	int kind; /* enum cluster_redirect_kind */
	unsigned slot;
	int unknown_host;         /* "?:PORT": the node has no known endpoint */
	struct cluster_addr addr; /* host empty when unknown_host */
};

/* Parses the text of an error reply, len bytes (no NUL needed): "MOVED <slot>
 * <host>:<port>" or "ASK <slot> <host>:<port>". The port is after the last
 * colon ("::1:7000" is ::1 port 7000; "[::1]:7000" is accepted too); an empty
 * host means asked_host. Returns 1 with out set, 0 when str is another error
 * (out untouched), -1 with a message in err when it starts with MOVED or ASK
 * but is malformed (a slot outside 0..16383, a bad port or host, extra text). */
int cluster_redirect_parse(const char *str, size_t len, const char *asked_host,
                           struct cluster_redirect *out, char *err, size_t errsz);

/* ---- SCAN replies ---- */

#define CLUSTER_CURSOR_MAX 20 /* decimal digits of a SCAN cursor (a u64) */

/* Checks a SCAN reply: an array of exactly two elements, the cursor (a string
 * of 1..CLUSTER_CURSOR_MAX decimal digits, at most 2^64 - 1) and the keys (an
 * array whose every element is a string). Returns 0 with the cursor copied to
 * cursor (NUL-terminated; "0": the scan is over) and *keys the key array (in
 * reply), or -1 with a message in err. The keys' lengths are the caller's to
 * bound (a name it wants has a known length). */
int cluster_scan_parse(const redisReply *reply, char cursor[CLUSTER_CURSOR_MAX + 1],
                       const redisReply **keys, char *err, size_t errsz);

/* ---- bounded readers ---- */

/* A hiredis reader (redisReaderCreate) that refuses arrays of more than
 * CLUSTER_REPLY_MAX_ELEMENTS elements (redisReaderGetReply fails with an
 * "Out of memory" error). NULL when out of memory. Free with redisReaderFree. */
redisReader *cluster_reader_new(void);

/* Makes an existing hiredis reader (a redisContext's) refuse the same. */
void cluster_reader_bound(redisReader *reader);

/* What a reply's objects cost, in bytes, against a budget: each of them
 * (a string, integer, nil or array) a redisReply with malloc's overhead, a
 * string its bytes and NUL besides, an array a pointer per element. */
#define CLUSTER_REPLY_OBJECT_COST (sizeof(redisReply) + 2 * sizeof(void *))

/* The memory the objects of one reply may take: left counts down; over is
 * set once an object was refused for want of it. */
struct cluster_reply_budget {
	size_t left;
	int over;
};

/* Bounds reader (cluster_reader_bound) and charges the objects of the
 * replies it builds to *budget (NULL: to none) from the next reply on: an
 * object that would cost more than is left fails the reply as an array too
 * long does ("Out of memory", over set). The caller refills budget before
 * each reply; it must outlive the reader's use or be unset. */
void cluster_reader_charge(redisReader *reader, struct cluster_reply_budget *budget);

/* ---- the router ---- */

struct cluster_options {
	const char *user;       /* ACL user, or NULL (AUTH password alone) */
	const char *password;   /* NULL: no AUTH; copied */
	int connect_timeout_ms; /* 0: 1000 */
	int command_timeout_ms; /* 0: 1000 */
	int backoff_min_ms;     /* 0: 100 */
	int backoff_max_ms;     /* 0: 5000 */
	size_t max_reply_bytes; /* a reply's bytes, when its command sets no
	                           bound: 0: CLUSTER_REPLY_MAX_BYTES */
};

struct cluster_stats {
	uint64_t nomem;           /* the router's own allocations that failed: the
	                             commands failed, no node is blamed (no backoff) */
	uint64_t node_errors;     /* connects, AUTHs or round trips that failed */
	uint64_t timeouts;        /* of those, the ones that ran out of time */
	uint64_t connects;        /* connections tried */
	uint64_t backoff_skips;   /* connections not tried: the node was backing off */
	uint64_t moved;           /* MOVED redirections followed */
	uint64_t asks;            /* ASK redirections followed */
	uint64_t map_refreshes;   /* slot maps read and installed */
	uint64_t tryagains;       /* TRYAGAIN replies (multi-key commands on a moving slot),
	                             sent again after a pause */
	uint64_t resent;          /* commands sent again to the new master of their slot
	                             after theirs could not be reached (a failover) */
	uint64_t nodes_forgotten; /* addresses dropped: no longer in the map, not seeds */
	uint64_t auth_refused;    /* AUTHs a node refused the credentials of (WRONGPASS,
	                             invalid password, none configured), which waiting
	                             does not mend; not other errors (maxclients) */
};

struct cluster_router;

/* A router over the seeds (cluster_seeds_parse's syntax). Connects to nothing
 * yet. Returns NULL with a message in err for bad seeds or options (a user
 * without a password, negative or inverted durations) or no memory. */
struct cluster_router *cluster_router_new(const char *seeds, const struct cluster_options *opt,
                                          char *err, size_t errsz);

/* Closes every connection and wipes the password. NULL is ignored. */
void cluster_router_free(struct cluster_router *r);

/* Reads the slot map now, from the first node that gives one (for a check at
 * start-up: wrong password, nothing listening, not a cluster). 0, leaving
 * cluster_error() as it was (not the nodes it passed over), or -1 with it
 * set. */
int cluster_refresh(struct cluster_router *r);

/* Sends one command (argc >= 1 arguments, binary-safe) to the master of key's
 * slot, following redirections; key is one of the command's keys (or of
 * their slot). Returns 0 with *reply set (possibly an error reply other than
 * MOVED/ASK), or -1 with *reply NULL and cluster_error() set: no map, no
 * node for the slot, the node failing or backing off, a timeout, a malformed
 * redirection or one for another slot, too many redirections. */
int cluster_command_argv(struct cluster_router *r, const char *key, size_t keylen, int argc,
                         const char **argv, const size_t *argvlen, redisReply **reply);

/* One command of a pipeline: the caller fills key to argvlen, and max_reply
 * (0: the router's max_reply_bytes) when it knows how long the reply can
 * be; the router sets reply (NULL when that command failed). */
struct cluster_cmd {
	const char *key;
	size_t keylen;
	int argc;
	const char **argv;
	const size_t *argvlen;
	redisReply *reply;
	size_t max_reply;
};

/* Sends n commands grouped by node, each node's commands in one write and
 * read back in order; MOVED and ASK are followed per command (at most
 * CLUSTER_MAX_REDIRECTS rounds). Commands to different nodes may run in any
 * order relative to one another. Returns the number of commands that got no
 * reply (0: all did); cluster_error() then says why the last one failed. */
size_t cluster_pipeline(struct cluster_router *r, struct cluster_cmd *cmds, size_t n);

/* The message of the last failure ("" before any). */
const char *cluster_error(const struct cluster_router *r);

/* The counters. */
struct cluster_stats cluster_stats(const struct cluster_router *r);

/* The master the router's map gives for slot: 0 with *out set, or -1 when it
 * has none. */
int cluster_slot_node(const struct cluster_router *r, unsigned slot, struct cluster_addr *out);

/* The number of masters in the current map (read first when the router has
 * none, or refreshed when it is stale, as before a command), numbered
 * 0..n-1 in the order of their addresses (host, then port), so that the
 * numbers stay put while the map does. 0 when no map can be read
 * (cluster_error() says why). */
size_t cluster_n_masters(struct cluster_router *r);

/* Sends one command (argc >= 1 arguments) to master number `master` of the
 * current map (cluster_n_masters), for commands about a node rather than a
 * key (SCAN, DBSIZE, INFO). The node's connection, deadline and backoff are
 * the same as for cluster_command_argv; a redirection is not followed (it is
 * returned as the error reply it is). Returns 0 with *reply set (possibly an
 * error reply), or -1 with *reply NULL and cluster_error() set: no map, no
 * such master, the node failing or backing off, a timeout. */
int cluster_command_node(struct cluster_router *r, size_t master, int argc, const char **argv,
                         const size_t *argvlen, redisReply **reply);

#endif
