/* record: the entry record, its byte layout (record.c) and a decoder that
 * trusts nothing: every count read from disk is bounded before it is used.
 *
 *   u32 version | key[32] | fingerprint[32] | u32 prefix_len | u32 n_layers |
 *   u32 flags | u64 created | u64 last_used | u64 lru_seq | u64 hits |
 *   u64 bytes | u32 salt_len | salt | n_layers x (u8 tag | u64 size | u64 xxh3) |
 *   u64 stored | u32 row_block | u32 map_len | map
 * all little-endian. version 2; a version-1 record (a store made before
 * blocks) ends after the layers and reads as every row in the stream.
 *
 * bytes is what the entry's blobs take whole (the restore payload); stored
 * is what its own chunks hold. With row_block 0 that is the blobs whole, in
 * layer order (its stream). Otherwise each MLA layer's rows are cut into
 * full blocks of row_block rows and a tail. The stream then holds the KDA
 * layers whole and, of each MLA layer, its header words and tail rows only
 * (k words, k tail, v count, v tail), so its layout is known before any
 * block is looked at. map holds, per MLA layer in layer order,
 * ceil((P / row_block) / 8) bytes: bit b set when block b is a shared block
 * (blocks.h); clear when the entry keeps the block's rows itself, as two
 * private chunks (chunks.h, STORE_CHUNK_PRIVATE): numbered by place,
 * PRIVATE + 2 (m * P / row_block + b) + part, in a record with
 * STORE_FLAG_PRIVATE_AT (env.h), and by the clear bits in (layer, block)
 * order in one written before. stored counts the stream and the private
 * blocks. */
#ifndef K3_STORE_RECORD_H
#define K3_STORE_RECORD_H

#include "env.h"
#include "prefix.h"

/* The decoded entry record. */
struct store_record {
	uint8_t key[STORE_KEY_LEN];
	uint8_t fingerprint[MODEL_FINGERPRINT_LEN];
	uint32_t prefix_len;
	uint32_t n_layers;
	uint32_t flags;
	uint64_t created;
	uint64_t last_used;
	uint64_t lru_seq;
	uint64_t hits;
	uint64_t bytes;
	uint32_t salt_len;
	const uint8_t *salt;         /* points into the encoded record */
	const unsigned char *layers; /* n_layers x (u8 tag | u64 size | u64 xxh3) */
	uint64_t stored;             /* bytes in the entry's own chunks */
	uint32_t row_block;          /* B; 0: no shared blocks */
	uint32_t map_len;
	const unsigned char *map; /* points into the encoded record */
	uint64_t own_blocks;      /* of stored: the private blocks' rows (decoded) */
};

/* The largest row block a record may name. */
#define STORE_MAX_ROW_BLOCK 65536u

/* Bytes of the map per MLA layer for P tokens in blocks of row_block. */
uint32_t store_record_map_bytes(uint32_t prefix_len, uint32_t row_block);

/* Row bytes (k and v) of one full block of an MLA layer of `size` bytes. */
uint64_t store_record_block_bytes(const struct store_record *r, uint64_t size);

/* Whether block b of the record's mla-th MLA layer is a shared block. */
int store_record_shared(const struct store_record *r, uint32_t mla, uint32_t b);

#define STORE_RECORD_LAYER_LEN 17u
/* The smallest record: version 1, no salt, no layers. */
#define STORE_RECORD_MIN 124u

/* Encoded size of a record with these counts. */
size_t store_record_size(uint32_t salt_len, uint32_t n_layers, uint32_t map_len);
/* Encodes r (with layer triples from tags/sizes/sums) into out. */
void store_record_encode(const struct store_record *r, const uint8_t *tags, const uint64_t *sizes,
                         const uint64_t *sums, unsigned char *out);
/* Decodes and checks a record read from disk. -1 when damaged. */
int store_record_decode(const void *data, size_t len, struct store_record *r);
/* Layer i of a decoded record. */
void store_record_layer(const struct store_record *r, uint32_t i, uint8_t *tag, uint64_t *size,
                        uint64_t *sum);
/* Rewrites the mutable fields (flags, last_used, lru_seq, hits) of an encoded record in place. */
void store_record_patch(unsigned char *enc, const struct store_record *r);

/* Reads a record by key inside txn. MDB_NOTFOUND, 0, or -1 (damaged). r
 * points into the map: valid until the transaction writes or ends. */
int store_record_read(struct store *s, MDB_txn *txn, const uint8_t key[STORE_KEY_LEN],
                      struct store_record *r);

/* Writes a new record (encoded from r and the layer triples). MDB_KEYEXIST
 * when one exists under r->key. */
int store_record_put(struct store *s, MDB_txn *txn, const struct store_record *r,
                     const uint8_t *tags, const uint64_t *sizes, const uint64_t *sums);

/* Writes r's mutable fields over the stored record of r->key. */
int store_record_rewrite(struct store *s, MDB_txn *txn, const struct store_record *r);

#endif
