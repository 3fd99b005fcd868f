/* blob_stream: blob_check_sum() over a blob that arrives in pieces, in one
 * buffer or scattered over two arrays. */
#include "blob_stream.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "checksum.h"
#include "model.h"

/* The layout the model expects; end() checks that the header says the same. */
static int layout(struct blob_stream *s, size_t len, const struct k3cache_model *model,
                  uint32_t layer, uint32_t prefix_len)
{
	s->len = len;
	s->model = model;
	s->layer = layer;
	s->prefix_len = prefix_len;
	if (layer < model->n_layers) {
		const struct model_layer *l = &model->layers[layer];
		uint64_t n[2];
		model_layer_floats(l, prefix_len, n);
		/* tag[, seq_len], count */
		uint64_t head = l->mixer == MODEL_MIXER_KDA ? 1 + 4 : 1 + 4 + 4;
		s->data_off[0] = (size_t)head;
		s->data_len[0] = (size_t)(n[0] * 4u);
		s->data_off[1] = (size_t)(head + n[0] * 4u + 4);
		s->data_len[1] = (size_t)(n[1] * 4u);
	}
	s->cs = checksum_begin(layer);
	return s->cs ? 0 : -1;
}

int blob_stream_begin(struct blob_stream *s, const void *base, size_t len,
                      const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len)
{
	memset(s, 0, sizeof(*s));
	s->base = base;
	return layout(s, len, model, layer, prefix_len);
}

int blob_stream_begin_once(struct blob_stream *s, const void *base, size_t len,
                           const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len)
{
	if (prefix_len == BLOB_PREFIX_ANY) /* the floats' place must be known */
		return -1;
	int rc = blob_stream_begin(s, base, len, model, layer, prefix_len);
	s->once = 1;
	s->c1_at = SIZE_MAX;
	s->bad_vec = -1;
	return rc;
}

/* Once: keeps the words of [from, to) that a parse reads. */
static void keep_words(struct blob_stream *s, const unsigned char *p, size_t from, size_t to)
{
	for (size_t o = from; o < to && o < sizeof(s->kept); o++)
		s->kept[o] = p[o - from];
	if (s->c1_at == SIZE_MAX && to >= 9)
		s->c1_at =
		        blob_second_count_at(s->kept, to < sizeof(s->kept) ? to : sizeof(s->kept));
	if (s->c1_at != SIZE_MAX && s->c1_at < to && s->c1_at + 4 > from)
		for (size_t o = s->c1_at > from ? s->c1_at : from; o < to && o < s->c1_at + 4; o++)
			s->c1[o - s->c1_at] = p[o - from];
}

int blob_stream_begin_parts(struct blob_stream *s, void *a, void *b,
                            const struct k3cache_model *model, uint32_t layer, uint32_t prefix_len)
{
	memset(s, 0, sizeof(*s));
	s->part[0] = a;
	s->part[1] = b;
	s->scattered = 1;
	uint64_t len = layer < model->n_layers
	                       ? model_layer_blob_size(&model->layers[layer], prefix_len)
	                       : 0;
	if (len > SIZE_MAX)
		len = 0;
	return layout(s, (size_t)len, model, layer, prefix_len);
}

unsigned char *blob_stream_dest(struct blob_stream *s, size_t off, size_t *run)
{
	if (off >= s->len) {
		*run = 0;
		return NULL;
	}
	if (!s->scattered) {
		*run = s->len - off;
		return (unsigned char *)s->base + off;
	}
	size_t end0 = s->data_off[0] + s->data_len[0];
	if (off < s->data_off[0]) { /* tag, seq_len, count */
		*run = s->data_off[0] - off;
		return s->head + off;
	}
	if (off < end0) {
		*run = end0 - off;
		return s->part[0] + (off - s->data_off[0]);
	}
	if (off < s->data_off[1]) { /* the second count */
		*run = s->data_off[1] - off;
		return s->head + s->data_off[0] + (off - end0);
	}
	*run = s->len - off;
	return s->part[1] + (off - s->data_off[1]);
}

static void scan_floats(struct blob_stream *s, int v, const unsigned char *p, size_t floats);

void blob_stream_feed(struct blob_stream *s, size_t upto)
{
	if (upto > s->len)
		upto = s->len;
	if (upto <= s->fed)
		return;
	while (s->fed < upto) {
		size_t run;
		const unsigned char *p = blob_stream_dest(s, s->fed, &run);
		if (run > upto - s->fed)
			run = upto - s->fed;
		checksum_update(s->cs, p, run);
		if (s->once &&
		    (s->fed < sizeof(s->kept) || s->c1_at == SIZE_MAX || s->fed + run > s->c1_at))
			keep_words(s, p, s->fed, s->fed + run);
		s->fed += run;
	}
	for (int v = 0; v < 2 && !s->nonfinite; v++) {
		size_t from = s->data_off[v] + s->scanned[v];
		size_t end = s->data_off[v] + s->data_len[v];
		if (end > upto)
			end = upto;
		if (end <= from)
			continue;
		size_t floats = (end - from) / 4u; /* whole floats; the rest next time */
		size_t run;
		const unsigned char *p = blob_stream_dest(s, from, &run);
		if (p)
			scan_floats(s, v, p, floats);
	}
}

/* Scans `floats` whole floats of vector v at p for a non-finite one. */
static void scan_floats(struct blob_stream *s, int v, const unsigned char *p, size_t floats)
{
	while (floats && !s->nonfinite) {
		uint32_t take = floats > UINT32_MAX ? UINT32_MAX : (uint32_t)floats;
		struct blob_f32vec part = {p, take};
		int64_t at = blob_first_nonfinite(&part);
		if (at >= 0) {
			s->nonfinite = 1;
			s->bad_vec = v;
			s->bad_index = s->scanned[v] / 4u + (size_t)at;
			memcpy(&s->bad_bits, p + (size_t)at * 4u, 4);
		}
		s->scanned[v] += (size_t)take * 4u;
		p += (size_t)take * 4u;
		floats -= take;
	}
}

void blob_stream_feed_piece(struct blob_stream *s, const void *data, size_t n)
{
	const unsigned char *p = data;
	size_t from = s->fed, to = n > s->len - from ? s->len : from + n;
	if (!s->once || to <= from)
		return;
	checksum_update(s->cs, p, to - from);
	keep_words(s, p, from, to);
	for (int v = 0; v < 2 && !s->nonfinite; v++) {
		size_t lo = s->data_off[v], hi = lo + s->data_len[v];
		size_t a = from > lo ? from : lo, b = to < hi ? to : hi;
		if (a >= b)
			continue;
		const unsigned char *q = p + (a - from);
		size_t len = b - a;
		if (s->pend_n) { /* a float begun in the last piece */
			size_t k = 4 - s->pend_n < len ? 4 - s->pend_n : len;
			memcpy(s->pend + s->pend_n, q, k);
			s->pend_n += k;
			q += k;
			len -= k;
			if (s->pend_n < 4)
				continue;
			s->pend_n = 0;
			scan_floats(s, v, s->pend, 1);
		}
		scan_floats(s, v, q, len / 4u);
		s->pend_n = len % 4u;
		memcpy(s->pend, q + len / 4u * 4u, s->pend_n);
	}
	s->fed = to;
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The scattered blob's view: its header words from head, its floats in the
 * arrays. The arrays hold the model's counts only, so the view is checked
 * for shape before a float of it is read. */
static enum blob_class scattered_view(struct blob_stream *s, struct blob_view *v,
                                      struct blob_error *err)
{
	unsigned tag = s->head[0];
	if (s->layer >= s->model->n_layers || s->fed != s->len) {
		if (err) {
			err->cls = BLOB_ERR_TRUNCATED;
			snprintf(err->message, sizeof(err->message),
			         "layer %" PRIu32 ": %zu of %zu bytes arrived", s->layer, s->fed,
			         s->len);
		}
		return BLOB_ERR_TRUNCATED;
	}
	if (tag != BLOB_TAG_KDA && tag != BLOB_TAG_MLA) {
		if (err) {
			err->cls = BLOB_ERR_TAG;
			snprintf(err->message, sizeof(err->message),
			         "layer %" PRIu32 ": tag %u is neither 1 (KDA) nor 2 (MLA)",
			         s->layer, tag);
		}
		return BLOB_ERR_TAG;
	}
	size_t c0 = s->data_off[0] - 4, c1 = s->data_off[0];
	*v = (struct blob_view){
	        .tag = (enum blob_tag)tag,
	        .seq_len = s->data_off[0] == 9 ? le32(s->head + 1) : 0,
	        .v0 = {s->part[0], le32(s->head + c0)},
	        .v1 = {s->part[1], le32(s->head + c1)},
	};
	/* a tag other than the model's: the words were read in the wrong
	 * places, and the slot check says so first */
	return blob_validate_shape(v, s->model, s->layer, s->prefix_len, err);
}

enum blob_class blob_stream_end(struct blob_stream *s, uint64_t *xxh3, struct blob_error *err)
{
	uint64_t sum = checksum_end(s->cs);
	s->cs = NULL;
	struct blob_view view;
	enum blob_class rc;
	if (s->scattered) {
		rc = scattered_view(s, &view, err);
	} else if (s->once) {
		struct blob_view parsed = {0};
		size_t head = s->fed < sizeof(s->kept) ? s->fed : sizeof(s->kept);
		rc = s->fed != s->len
		             ? BLOB_ERR_TRUNCATED
		             : blob_parse_sparse(s->kept, head, s->c1, s->len, &parsed, err);
		if (rc == BLOB_ERR_TRUNCATED && s->fed != s->len && err) {
			err->cls = rc;
			snprintf(err->message, sizeof(err->message), "%zu of %zu bytes arrived",
			         s->fed, s->len);
		}
		rc = blob_name_layer(rc, &parsed, s->model, s->layer, s->prefix_len, &view, err);
	} else {
		rc = blob_check_shape(s->base, s->len, s->model, s->layer, s->prefix_len, &view,
		                      err);
	}
	if (rc != BLOB_OK)
		return rc;
	if (s->once &&
	    (s->nonfinite || s->scanned[0] != s->data_len[0] || s->scanned[1] != s->data_len[1])) {
		/* the header matched the model: the floats scanned were the vectors' */
		float f;
		memcpy(&f, &s->bad_bits, 4);
		if (err && s->nonfinite) {
			err->cls = BLOB_ERR_NONFINITE;
			snprintf(err->message, sizeof(err->message),
			         "layer %" PRIu32 ": %s %s[%zu] is %s", s->layer,
			         blob_tag_name(view.tag),
			         view.tag == BLOB_TAG_KDA ? (s->bad_vec ? "recurrent" : "conv")
			                                  : (s->bad_vec ? "v" : "k"),
			         s->bad_index, f != f ? "NaN" : (f > 0 ? "+Inf" : "-Inf"));
		}
		return s->nonfinite ? BLOB_ERR_NONFINITE : BLOB_ERR_TRUNCATED;
	}
	/* the header matched the model, so the ranges scanned were the floats;
	 * a value found bad is named by the full check (rare: only then) */
	if (s->nonfinite || s->fed != s->len || s->scanned[0] != s->data_len[0] ||
	    s->scanned[1] != s->data_len[1]) {
		rc = blob_validate(&view, s->model, s->layer, s->prefix_len, err);
		if (rc != BLOB_OK)
			return rc;
		if (s->scattered) /* every byte was fed (scattered_view) */
			return BLOB_ERR_TRUNCATED;
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
