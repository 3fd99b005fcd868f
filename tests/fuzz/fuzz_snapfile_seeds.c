/* Seeds for fuzz_snapfile: real snapshot files of a small hybrid model,
 * with and without a salt, at a few prefix lengths. usage:
 * fuzz_snapfile_seeds DIR */
#include <stdio.h>
#include <stdlib.h>

#include "prefix.h"
#include "snapfile.h"
#include "storeutil.h"

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	struct k3cache_model *m = storeutil_model("seed", 4);
	static const uint32_t lens[3] = {1, 2, 5};
	static const uint32_t tokens[5] = {7, 0, 4294967295u, 3, 1};
	for (int i = 0; i < 6; i++) {
		uint32_t p = lens[i % 3];
		struct storeutil_snap snap = storeutil_snap(m, p, (uint32_t)i);
		struct snapfile_layer layers[4];
		for (uint32_t l = 0; l < 4; l++)
			layers[l] = (struct snapfile_layer){snap.blobs[l].data, snap.blobs[l].size,
			                                    snap.blobs[l].xxh3};
		struct snapfile s = {.model = m,
		                     .salt = (uint8_t *)"t1",
		                     .salt_len = i < 3 ? 0 : 2,
		                     .tokens = (uint32_t *)tokens,
		                     .n_tokens = p,
		                     .layers = layers,
		                     .n_layers = 4,
		                     .created = (uint64_t)i * 1000};
		unsigned char *h;
		size_t hlen;
		if (prefix_key(m->fingerprint, s.salt, s.salt_len, tokens, p, s.key) != 0 ||
		    snapfile_encode_header(&s, &h, &hlen, NULL) != SNAPFILE_OK)
			return 1;
		char path[4096];
		snprintf(path, sizeof(path), "%s/snap-%d", argv[1], i);
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(h, 1, hlen, f) != hlen)
			return 1;
		for (uint32_t l = 0; l < 4; l++)
			if (fwrite(layers[l].data, 1, layers[l].size, f) != layers[l].size)
				return 1;
		fclose(f);
		free(h);
		storeutil_snap_free(&snap);
	}
	model_free(m);
	return 0;
}
