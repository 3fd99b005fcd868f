/* bench/blob: validation throughput of one K3 KDA layer blob (parse + shape +
 * finite scan) against memcpy and a plain float sum of the same bytes, all
 * measured in this run. Prints a table; the figure to watch is the ratio. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "blob.h"
#include "model.h"

#define CONV   147456u
#define REC    1572864u
#define ROUNDS 200

static float sum_floats(const unsigned char *p, size_t n)
{
	const float *f = (const float *)(const void *)p;
	float acc[8] = {0};
	for (size_t i = 0; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += f[i + (size_t)j];
	return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

int main(void)
{
	struct model_layer l = {.mixer = MODEL_MIXER_KDA, .conv_len = CONV, .recurrent_len = REC};
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = model_new("k3-kda", "bench", "bench", &l, 1, err);
	if (!m) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	size_t nfloats = (size_t)CONV + REC;
	float *vals = malloc(nfloats * sizeof(float));
	for (size_t i = 0; i < nfloats; i++)
		vals[i] = (float)(i % 1000) * 0.001f - 0.5f;
	struct blob_view v = {.tag = BLOB_TAG_KDA,
	                      .v0 = {(const unsigned char *)vals, CONV},
	                      .v1 = {(const unsigned char *)(vals + CONV), REC}};
	size_t len = blob_encoded_size(&v);
	unsigned char *blob = malloc(len), *dst = malloc(len);
	blob_encode(&v, blob);
	memset(dst, 1, len);

	double best_cpy = 1e9, best_sum = 1e9, best_val = 1e9;
	float sink = 0;
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = benchutil_now();
		memcpy(dst, blob, len);
		benchutil_keep(dst);
		double t1 = benchutil_now();
		sink += sum_floats(blob + 9, nfloats);
		double t2 = benchutil_now();
		struct blob_error berr;
		if (blob_check(blob, len, m, 0, BLOB_PREFIX_ANY, &berr) != BLOB_OK) {
			fprintf(stderr, "bench blob invalid: %s\n", berr.message);
			return 1;
		}
		double t3 = benchutil_now();
		best_cpy = t1 - t0 < best_cpy ? t1 - t0 : best_cpy;
		best_sum = t2 - t1 < best_sum ? t2 - t1 : best_sum;
		best_val = t3 - t2 < best_val ? t3 - t2 : best_val;
	}
	double gb = (double)len / 1e9;
	printf("bench/blob: one K3 KDA layer blob, %zu bytes (%.4f MiB), best of %d rounds\n", len,
	       (double)len / 1048576.0, ROUNDS);
	printf("%-32s %10s %12s\n", "operation", "GB/s", "x memcpy");
	printf("%-32s %10.2f %12.2f\n", "memcpy (baseline)", gb / best_cpy, 1.0);
	printf("%-32s %10.2f %12.2f\n", "plain float sum", gb / best_sum, best_cpy / best_sum);
	printf("%-32s %10.2f %12.2f\n", "validate (parse+shape+finite)", gb / best_val,
	       best_cpy / best_val);
	printf("target: validate >= 0.5x memcpy: %s   (sum %g)\n",
	       best_cpy / best_val >= 0.5 ? "met" : "NOT met", (double)sink);
	/* the scan really looks at every float: a NaN in the last one is found */
	uint32_t nan_bits = 0x7fc00000u;
	memcpy(blob + len - 4, &nan_bits, 4);
	struct blob_error berr;
	if (blob_check(blob, len, m, 0, BLOB_PREFIX_ANY, &berr) != BLOB_ERR_NONFINITE) {
		fprintf(stderr, "bench: a NaN in the last float was not found\n");
		return 1;
	}
	free(vals);
	free(blob);
	free(dst);
	model_free(m);
	return 0;
}
