/* check: what a publish must be before any of its bytes are written
 * (check.c): its prefix length, salt, model and layer count, its size
 * against the capacity, and each layer against the model. */
#ifndef K3_STORE_CHECK_H
#define K3_STORE_CHECK_H

#include "env.h"

/* Checks what a publish needs before its bytes: P, the salt, the model and
 * its layer count, the size against the capacity. Fills *model (the caller
 * frees it), *total and the key. */
enum status_code store_check_publish(struct store *s, const struct store_publish_req *r,
                                     struct k3cache_model **model, uint64_t *total,
                                     uint8_t key[STORE_KEY_LEN], struct status *st);

/* Checks layer i of a publish against the model (slot, shape, seq_len, finite;
 * blob_check_sum) and against its given checksum, if any. 0 with *sum set, or
 * -1 with the message naming the layer. A layer a delta assembled in pieces
 * (store_blob.rows) was checked then: its xxh3 is the sum; one assembled
 * unread is refused (only a staged scan checks it). */
int store_check_layer(const struct store_publish_req *r, const struct k3cache_model *m, uint32_t i,
                      uint64_t *sum, char message[STATUS_MESSAGE_MAX]);

/* Layer i's checksum, computed (sum), against the one its publish gave
 * (b->xxh3; 0: none given). 0, or -1 with the message. */
int store_check_given_sum(const struct store_blob *b, uint32_t i, uint64_t sum,
                          char message[STATUS_MESSAGE_MAX]);

/* A delta's new rows (store_rows: fresh_k bytes of k rows, then v rows,
 * from row first_row), as delta.c checks them whole and staged.c's scan
 * piece by piece: n floats of part (0 k, 1 v) at data, the first of them
 * float `before` of that part's new rows, must be finite. 0, or -1 with the
 * message naming the layer, the part and the row. */
int store_check_rows_finite(const struct store_rows *r, uint32_t i, unsigned part,
                            const unsigned char *data, uint64_t n, uint64_t before,
                            char message[STATUS_MESSAGE_MAX]);

/* A delta's assembled layer i (the base's rows and the new ones) hashes to
 * sum; the publish gave `given`. 0, or -1 with the message: the worker's
 * rows or the base's are not what the worker hashed. */
int store_check_delta_sum(uint32_t i, uint64_t sum, uint64_t given,
                          char message[STATUS_MESSAGE_MAX]);

/* A layer's tag (its first byte; a delta's assembled layer is MLA). */
static inline uint8_t store_check_tag(const struct store_blob *b)
{
	return b->rows ? 2 : ((const unsigned char *)b->data)[0];
}

#endif
