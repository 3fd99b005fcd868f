/* snapfile: the snapshot file of `k3cachectl export` and `import`: one entry,
 * self-describing, to move it between hosts or keep it as a backup.
 *
 *   "K3SNAP1\n" | u32 LE header_len | header | blob 0 | blob 1 | ... | blob n-1
 *
 * The header is compact JSON, its keys in this order:
 *   {"format":1, "key":"<64 hex>", "fingerprint":"<64 hex>", "model":{the spec},
 *    "salt":"<hex, up to 1024 bytes>", "prefix_len":P, "tokens":[P u32],
 *    "layers":[{"index":i, "size":N, "xxh3":"<16 hex>"}, ...], "created":T}
 * and the blobs follow it in layer order, each exactly its "size" bytes,
 * nothing after the last. "xxh3" is the layer's XXH3-64 seeded with its
 * index (DESIGN.md, the wire's LayerRef); "created" is the entry's creation
 * time (Unix seconds).
 *
 * Contract: DESIGN.md does not list this format among its contracts, but a
 * snapshot file outlives the program that wrote it. snapfile_encode_header()
 * writes exactly the bytes k3cachectl has written since the format began,
 * and snapfile_parse() reads every such file. Another layout is another
 * magic or "format".
 *
 * snapfile_parse() trusts none of the bytes: it checks the header length
 * against the bytes there before reading it, every field's type and range,
 * the spec against its fingerprint, the key against spec, salt and tokens,
 * the layer list against the spec, the layers' sizes against the bytes that
 * follow (in 64-bit arithmetic, none cut short, none left over), and every
 * blob against its checksum and its layer of the spec at P tokens (blob.h).
 * Each failure has its own class and a message a person can act on. */
#ifndef K3_SNAPFILE_H
#define K3_SNAPFILE_H

#include <stddef.h>
#include <stdint.h>

#define SNAPFILE_MAGIC       "K3SNAP1\n"
#define SNAPFILE_MAGIC_LEN   8u
#define SNAPFILE_PRELUDE_LEN 12u         /* the magic and the header's length */
#define SNAPFILE_MAX_HEADER  (64u << 20) /* a header's length, at most */
#define SNAPFILE_MAX_SALT    1024u       /* the store's limit (STORE_MAX_SALT) */
#define SNAPFILE_MESSAGE_MAX 320

struct k3cache_model;

enum snapfile_class {
	SNAPFILE_OK = 0,
	SNAPFILE_ERR_MAGIC,     /* not a snapshot file: no K3SNAP1 magic */
	SNAPFILE_ERR_TRUNCATED, /* the header or a layer runs past the end of the file */
	SNAPFILE_ERR_TOO_LARGE, /* a header or salt over its limit */
	SNAPFILE_ERR_HEADER,    /* the header is not JSON, or a field is missing or malformed */
	SNAPFILE_ERR_MODEL,     /* the spec is invalid or does not match its fingerprint */
	SNAPFILE_ERR_KEY,       /* the key does not match the spec, salt and tokens */
	SNAPFILE_ERR_LAYERS,    /* the layer list does not fit the spec */
	SNAPFILE_ERR_CHECKSUM,  /* a layer's bytes do not match its xxh3 */
	SNAPFILE_ERR_BLOB,      /* a layer's blob is not valid as that layer of the spec */
	SNAPFILE_ERR_TRAILING,  /* bytes after the last layer */
	SNAPFILE_ERR_NOMEM,     /* out of memory */
};

struct snapfile_error {
	enum snapfile_class cls;
	char message[SNAPFILE_MESSAGE_MAX];
};

struct snapfile_layer {
	const unsigned char *data; /* size bytes (parse: inside the file's bytes) */
	uint64_t size;
	uint64_t xxh3;
};

/* One entry. After snapfile_parse() it owns model, salt, tokens and layers
 * (free with snapfile_free()); the layers' data point into the parsed bytes,
 * which must outlive it. For snapfile_encode_header() every field is the
 * caller's, only read. */
struct snapfile {
	struct k3cache_model *model;
	uint8_t key[32];
	uint8_t *salt;
	size_t salt_len;
	uint32_t *tokens; /* n_tokens of them: the prefix, P = n_tokens */
	uint32_t n_tokens;
	struct snapfile_layer *layers; /* n_layers == model->n_layers */
	uint32_t n_layers;
	uint64_t created;
};

/* "magic", "truncated", ...; "ok" for SNAPFILE_OK. */
const char *snapfile_class_name(enum snapfile_class cls);

/* The first part of the file: the magic, the header's length and the header,
 * in one malloc'd buffer of *len bytes (caller frees); the blobs, written
 * after it in layer order, complete the file. Returns SNAPFILE_OK, or
 * SNAPFILE_ERR_TOO_LARGE (a salt over SNAPFILE_MAX_SALT, a header over
 * SNAPFILE_MAX_HEADER) or SNAPFILE_ERR_NOMEM with a message in err. */
enum snapfile_class snapfile_encode_header(const struct snapfile *s, unsigned char **out,
                                           size_t *len, struct snapfile_error *err);

/* Parses and checks a whole file of `size` bytes (see the top of this file).
 * On success fills *out and returns SNAPFILE_OK; otherwise returns the class
 * with a message in err (when not NULL), and *out holds nothing to free. */
enum snapfile_class snapfile_parse(const void *data, size_t size, struct snapfile *out,
                                   struct snapfile_error *err);

/* snapfile_parse() in two steps, for a caller that shows progress over the
 * blobs' bytes: snapfile_parse_layout() does every check but the blobs'
 * (their checksums, and each as its layer of the spec), which
 * snapfile_check_layer() then does for layer i. A file is accepted only
 * when the layout and every layer are. */
enum snapfile_class snapfile_parse_layout(const void *data, size_t size, struct snapfile *out,
                                          struct snapfile_error *err);
enum snapfile_class snapfile_check_layer(const struct snapfile *s, uint32_t i,
                                         struct snapfile_error *err);

/* Frees what snapfile_parse() or snapfile_parse_layout() allocated; safe on
 * a zeroed struct. */
void snapfile_free(struct snapfile *s);

#endif
