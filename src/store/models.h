/* models: the model specs a store knows (models.c), fingerprint -> spec
 * JSON, with decoded specs cached in memory. The functions are declared in
 * store.h ("models"); store_get_model is what publishes check against. */
#ifndef K3_STORE_MODELS_H
#define K3_STORE_MODELS_H

#include "env.h"

#endif
