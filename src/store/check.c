/* check: a publish against its model (check.h). */
#include <stdio.h>

#include "blob.h"
#include "check.h"
#include "models.h"
#include "prefix.h"

int store_check_layer(const struct store_publish_req *r, const struct k3cache_model *m, uint32_t i,
                      uint64_t *sum, char message[STATUS_MESSAGE_MAX])
{
	const struct store_blob *b = &r->blobs[i];
	if (b->rows && b->rows->unread) { /* its checks run in a staged scan only */
		snprintf(message, STATUS_MESSAGE_MAX,
		         "layer %u: a delta assembled unread is published staged only", i);
		return -1;
	}
	if (b->rows) { /* a delta's layer, checked when it was assembled (delta.c) */
		*sum = b->xxh3;
		return 0;
	}
	struct blob_error berr;
	if (blob_check_sum(b->data, b->size, m, i, r->n_tokens, sum, &berr) != BLOB_OK) {
		snprintf(message, STATUS_MESSAGE_MAX, "%.200s (%s)", berr.message,
		         blob_class_name(berr.cls));
		return -1;
	}
	return store_check_given_sum(b, i, *sum, message);
}

int store_check_given_sum(const struct store_blob *b, uint32_t i, uint64_t sum,
                          char message[STATUS_MESSAGE_MAX])
{
	if (b->xxh3 && b->xxh3 != sum) {
		snprintf(message, STATUS_MESSAGE_MAX,
		         "layer %u: checksum mismatch: given %016llx, the bytes hash to %016llx", i,
		         (unsigned long long)b->xxh3, (unsigned long long)sum);
		return -1;
	}
	return 0;
}

int store_check_rows_finite(const struct store_rows *r, uint32_t i, unsigned part,
                            const unsigned char *data, uint64_t n, uint64_t before,
                            char message[STATUS_MESSAGE_MAX])
{
	struct blob_f32vec v = {data, (uint32_t)n};
	int64_t bad = blob_first_nonfinite(&v);
	if (bad < 0)
		return 0;
	uint64_t row = r->first_row + (before + (uint64_t)bad) / (part ? r->v_row : r->k_row);
	snprintf(message, STATUS_MESSAGE_MAX,
	         "layer %u: %s row %llu holds a NaN or an Inf (non-finite)", i, part ? "v" : "k",
	         (unsigned long long)row);
	return -1;
}

int store_check_delta_sum(uint32_t i, uint64_t sum, uint64_t given,
                          char message[STATUS_MESSAGE_MAX])
{
	if (sum == given)
		return 0;
	snprintf(message, STATUS_MESSAGE_MAX,
	         "layer %u: the base's rows and these make a blob that hashes to %016llx, the "
	         "publish says %016llx",
	         i, (unsigned long long)sum, (unsigned long long)given);
	return -1;
}

enum status_code store_check_publish(struct store *s, const struct store_publish_req *r,
                                     struct k3cache_model **model, uint64_t *total_out,
                                     uint8_t key[STORE_KEY_LEN], struct status *st)
{
	*model = NULL;
	if (r->n_tokens == 0)
		return status_set(st, STATUS_INVALID,
		                  "a snapshot covers at least one token (P >= 1)");
	if (r->salt_len > STORE_MAX_SALT)
		return status_set(st, STATUS_INVALID,
		                  "the salt is %zu bytes; at most %u are allowed", r->salt_len,
		                  STORE_MAX_SALT);
	struct k3cache_model *m = store_get_model(s, r->fingerprint, st);
	if (!m)
		return st && st->code != STATUS_OK ? st->code : STATUS_UNKNOWN_MODEL;
	if (r->n_blobs != m->n_layers) {
		enum status_code code = status_set(
		        st, STATUS_INVALID,
		        "the publish has %u layers; model %s has %u (every layer, once, in "
		        "index order)",
		        r->n_blobs, m->name, m->n_layers);
		model_free(m);
		return code;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < r->n_blobs; i++)
		total += r->blobs[i].size;
	if (total > s->opt.max_bytes) {
		model_free(m);
		return status_set(st, STATUS_TOO_LARGE,
		                  "the snapshot is %llu bytes; the store's capacity is %llu",
		                  (unsigned long long)total, (unsigned long long)s->opt.max_bytes);
	}
	if (prefix_key(r->fingerprint, r->salt, r->salt_len, r->tokens, r->n_tokens, key) != 0) {
		model_free(m);
		return status_set(st, STATUS_INTERNAL, "out of memory (computing the key)");
	}
	*model = m;
	*total_out = total;
	return STATUS_OK;
}

enum status_code store_publish_precheck(struct store *s, const struct store_publish_req *r,
                                        struct status *st)
{
	struct k3cache_model *m = NULL;
	uint64_t total = 0;
	uint8_t key[STORE_KEY_LEN];
	enum status_code code = store_check_publish(s, r, &m, &total, key, st);
	model_free(m);
	return code;
}
