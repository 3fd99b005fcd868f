#include "status.h"

#include <stdarg.h>
#include <stdio.h>

enum status_code status_set(struct status *st, enum status_code code, const char *fmt, ...)
{
	if (st) {
		va_list ap;
		va_start(ap, fmt);
		st->code = code;
		vsnprintf(st->message, sizeof(st->message), fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *status_code_name(enum status_code code)
{
	static const char *const names[STATUS_N_CODES] = {
	        "OK",   "NOT_FOUND", "INVALID",     "CORRUPT",  "UNKNOWN_MODEL", "TOO_LARGE",
	        "BUSY", "FULL",      "UNSUPPORTED", "INTERNAL", "DENIED",
	};
	if ((unsigned)code < STATUS_N_CODES)
		return names[code];
	return "UNKNOWN";
}
