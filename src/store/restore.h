/* restore: what restore.c offers the other top files beside store.h's
 * "restore" section. */
#ifndef K3_STORE_RESTORE_H
#define K3_STORE_RESTORE_H

#include "env.h"

/* Takes a damaged entry out of service (store_quarantine) and appends to
 * why, for the operator, what happened: quarantined, removed, or on a
 * read-only store nothing, and what to run instead. */
void store_quarantine_say(struct store *s, const uint8_t *key, char *why, size_t whysz);

#endif
