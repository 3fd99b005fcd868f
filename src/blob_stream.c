/* blob_stream: blob_check_sum() over a blob that arrives in pieces. */
#include "blob_stream.h"

#include <string.h>

#include "checksum.h"
#include "model.h"

int blob_stream_begin(struct blob_stream *s, const void *base, size_t len,
                      const struct model_spec *model, uint32_t layer, uint32_t prefix_len)
{
	memset(s, 0, sizeof(*s));
	s->base = base;
	s->len = len;
	s->model = model;
	s->layer = layer;
	s->prefix_len = prefix_len;
	/* the layout the model expects; end() checks the header says the same */
	if (layer < model->n_layers) {
		const struct model_layer *l = &model->layers[layer];
		uint64_t n0, n1, head;
		if (l->mixer == MODEL_MIXER_KDA) {
			head = 1 + 4; /* tag, count */
			n0 = (uint64_t)l->conv_len * 4u;
			n1 = (uint64_t)l->recurrent_len * 4u;
		} else {
			head = 1 + 4 + 4; /* tag, seq_len, count */
			n0 = (uint64_t)prefix_len * l->k_row * 4u;
			n1 = (uint64_t)prefix_len * l->v_row * 4u;
		}
		s->data_off[0] = (size_t)head;
		s->data_len[0] = (size_t)n0;
		s->data_off[1] = (size_t)(head + n0 + 4);
		s->data_len[1] = (size_t)n1;
	}
	s->cs = checksum_begin(layer);
	return s->cs ? 0 : -1;
}

void blob_stream_feed(struct blob_stream *s, size_t upto)
{
	if (upto > s->len)
		upto = s->len;
	if (upto <= s->fed)
		return;
	checksum_update(s->cs, s->base + s->fed, upto - s->fed);
	s->fed = upto;
	for (int v = 0; v < 2 && !s->nonfinite; v++) {
		size_t from = s->data_off[v] + s->scanned[v];
		size_t end = s->data_off[v] + s->data_len[v];
		if (end > upto)
			end = upto;
		if (end <= from)
			continue;
		size_t floats = (end - from) / 4u; /* whole floats; the rest next time */
		while (floats && !s->nonfinite) {
			uint32_t take = floats > UINT32_MAX ? UINT32_MAX : (uint32_t)floats;
			struct blob_f32vec part = {s->base + from, take};
			if (blob_first_nonfinite(&part) >= 0)
				s->nonfinite = 1;
			s->scanned[v] += (size_t)take * 4u;
			from += (size_t)take * 4u;
			floats -= take;
		}
	}
}

enum blob_class blob_stream_end(struct blob_stream *s, uint64_t *xxh3, struct blob_error *err)
{
	uint64_t sum = checksum_end(s->cs);
	s->cs = NULL;
	struct blob_view view;
	enum blob_class rc =
	        blob_check_shape(s->base, s->len, s->model, s->layer, s->prefix_len, &view, err);
	if (rc != BLOB_OK)
		return rc;
	/* the header matched the model, so the ranges scanned were the floats;
	 * a value found bad is named by the full check (rare: only then) */
	if (s->nonfinite || s->fed != s->len || s->scanned[0] != s->data_len[0] ||
	    s->scanned[1] != s->data_len[1]) {
		rc = blob_validate(&view, s->model, s->layer, s->prefix_len, err);
		if (rc != BLOB_OK)
			return rc;
		sum = checksum_blob(s->base, s->len, s->layer); /* not all was fed */
	}
	if (xxh3)
		*xxh3 = sum;
	return BLOB_OK;
}

void blob_stream_abandon(struct blob_stream *s)
{
	if (s->cs)
		checksum_end(s->cs);
	s->cs = NULL;
}
