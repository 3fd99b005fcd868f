/* models: the model specs a store knows (models.c), fingerprint -> spec
 * JSON, with decoded specs cached in memory. The functions are declared in
 * store.h ("models"); store_get_model is what publishes check against. */
#ifndef K3_STORE_MODELS_H
#define K3_STORE_MODELS_H

#include "env.h"

/* verify's check of the specs: fn(NULL, why, ctx) for each stored spec that
 * is damaged (it no longer decodes to its fingerprint), each counted in
 * *problems. 0, or ENOMEM / an LMDB error when the check could not run. */
int store_models_verify(struct store *s, MDB_txn *txn,
                        void (*fn)(const uint8_t *key, const char *why, void *ctx), void *ctx,
                        uint64_t *problems);

#endif
