/* staged: a publish larger than the stage size, written in short
 * transactions under a pending row (staged.c). Its streaming interface is
 * in store.h ("staged publish"); this is what publish.c hands it. */
#ifndef K3_STORE_STAGED_H
#define K3_STORE_STAGED_H

#include "env.h"

/* The whole of a staged publish, every byte in place. */
enum status_code store_publish_staged(struct store *s, const struct store_publish_req *r,
                                      struct store_publish_res *res, struct status *st);

#endif
