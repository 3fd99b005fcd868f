/* status: result codes and messages shared by the store, the daemon and the
 * client. The codes equal the wire's `Code` enum (DESIGN.md), so an answer
 * carries them unchanged. */
#ifndef K3_STATUS_H
#define K3_STATUS_H

#define STATUS_MESSAGE_MAX 256

enum status_code {
	STATUS_OK = 0,
	STATUS_NOT_FOUND = 1,
	STATUS_INVALID = 2,
	STATUS_CORRUPT = 3,
	STATUS_UNKNOWN_MODEL = 4,
	STATUS_TOO_LARGE = 5,
	STATUS_BUSY = 6,
	STATUS_FULL = 7,
	STATUS_UNSUPPORTED = 8,
	STATUS_INTERNAL = 9,
	STATUS_DENIED = 10, /* the peer may not do this (tenancy) */
};
#define STATUS_N_CODES 11

struct status {
	enum status_code code;
	char message[STATUS_MESSAGE_MAX];
};

/* Sets *st (when not NULL) and returns code. */
__attribute__((format(printf, 3, 4))) enum status_code
status_set(struct status *st, enum status_code code, const char *fmt, ...);

/* "OK", "NOT_FOUND", ... */
const char *status_code_name(enum status_code code);

#endif
