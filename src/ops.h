/* ops: every request op of the protocol, in one list (ops.c).
 *
 * Each op's name (for messages, metrics labels and counters), whether its
 * header is followed by a payload, which of the daemon's threads runs it,
 * and its index among the daemon's per-op counters and handler tables come
 * from OPS_LIST alone. Adding an op is the proto change, one line here, and
 * its handler in the table of the module that runs it. */
#ifndef K3_OPS_H
#define K3_OPS_H

#include "frame.h"

/* X(NAME, name, payload, writer, db): NAME is the proto's oneof case
 * (K3CACHE__V1__REQUEST__OP_NAME), name its lower-case name; payload 1 when
 * the header is followed by payload_len bytes; writer 1 when the daemon runs
 * it on its writer thread (it may change the store), 0 when its loop
 * answers it; db 1 when k3cachectl --db answers it from a store it opens
 * read-only, without a daemon (an evict there only dry-runs, a verify
 * reports without quarantining). The ops that need only the store are
 * answered by service_dispatch() (service.h) wherever they run; the others
 * by a handler in the table of the module that runs them (daemon/handlers.c,
 * k3cachectl --db's, ctl/backend.c). */
#define OPS_LIST(X)                                                                                \
	X(HELLO, hello, 0, 0, 1)                                                                   \
	X(PUT_MODEL, put_model, 0, 1, 0)                                                           \
	X(PUBLISH, publish, 1, 1, 0)                                                               \
	X(LOOKUP, lookup, 0, 0, 0)                                                                 \
	X(RESTORE, restore, 0, 0, 0)                                                               \
	X(LIST, list, 0, 0, 1)                                                                     \
	X(INSPECT, inspect, 0, 0, 1)                                                               \
	X(EVICT, evict, 0, 1, 1)                                                                   \
	X(STAT, stat, 0, 0, 1)                                                                     \
	X(LIST_MODELS, list_models, 0, 0, 1)                                                       \
	X(VERIFY, verify, 0, 1, 1)                                                                 \
	X(RESOLVE, resolve, 0, 0, 1)                                                               \
	X(REPORT, report, 0, 0, 0)

/* Each op's index, then OPS_UNKNOWN for a request with none this build
 * knows, and OPS_N rows in all. */
#define OPS_ID(NAME, name, payload, writer, db) OPS_##NAME,
enum ops_id { OPS_LIST(OPS_ID) OPS_UNKNOWN, OPS_N };
#undef OPS_ID

struct ops_row {
	int op_case;      /* K3cache__V1__Request__OpCase; 0 for OPS_UNKNOWN */
	const char *name; /* "publish", ...; "unknown" */
	int payload;      /* a payload follows the header */
	int writer;       /* run on the daemon's writer thread */
	int db;           /* answered by k3cachectl --db, from a read-only store */
};

extern const struct ops_row ops_table[OPS_N];

/* The op of a request: its row's index, OPS_UNKNOWN when none. */
enum ops_id ops_of(const frame_request *req);
/* The op's name ("publish", ...; "unknown"). */
const char *ops_name(const frame_request *req);

#endif
