/* chunks: an entry's bytes, its layers' blobs laid end to end and cut into
 * equal chunks (chunks.c).
 *
 *   key | u32 chunk (BE) -> u64 XXH3(data, seed: chunk number) | data
 *
 * 1 MiB - 16 bytes of value fill 256 pages exactly (LMDB adds a 16-byte
 * header to an overflow run), so the runs freed by one entry fit the next. */
#ifndef K3_STORE_CHUNKS_H
#define K3_STORE_CHUNKS_H

#include "env.h"

#define STORE_CHUNK_VALUE   (1048576u - 16u)
#define STORE_CHUNK_DATA    (STORE_CHUNK_VALUE - 8u)
#define STORE_CHUNK_KEY_LEN (STORE_KEY_LEN + 4)

/* Chunk numbers from here on hold an entry's private blocks (record.h):
 * private block j's k rows are chunk STORE_CHUNK_PRIVATE + 2j, its v rows
 * the next. A stream never reaches 2^31 chunks (2 PiB). */
#define STORE_CHUNK_PRIVATE 0x80000000u

/* An entry's own bytes before they are cut into chunks: pieces of the
 * publish's blobs, in order. */
struct store_stream {
	const struct store_segment *segs;
	size_t n;
	uint64_t total;
};

/* Copies bytes [off, off+len) of the stream. */
void store_chunks_copy_stream(const struct store_stream *st, uint64_t off, unsigned char *dst,
                              size_t len);

/* Writes chunks [from, to) of the stream under key, each with sums[c], or
 * its XXH3 computed here when sums is NULL. */
int store_chunks_write(struct store *s, MDB_txn *txn, const uint8_t *key,
                       const struct store_stream *st, uint32_t from, uint32_t to,
                       const uint64_t *sums);

/* Writes one chunk c of len bytes (at most STORE_CHUNK_DATA) under key,
 * with its XXH3: *sum when the caller hashed the bytes already (seeded with
 * c), else computed here. */
int store_chunks_put(struct store *s, MDB_txn *txn, const uint8_t *key, uint32_t c,
                     const void *data, size_t len, const uint64_t *sum);

/* The number of chunks of `total` bytes. */
uint32_t store_chunks_count(uint64_t total);

/* Chunk c of key as stored (its 8-byte sum, then its data). */
int store_chunks_get(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t c, MDB_val *v);

/* Whether a chunk value read with store_chunks_get holds its sum. */
int store_chunks_intact(const MDB_val *v, uint64_t c);

/* Deletes every chunk stored under key (an entry's, or an unfinished staged
 * publish's), whatever their number. */
int store_chunks_delete(struct store *s, MDB_txn *txn, const uint8_t *key);

/* The data bytes of the chunks stored under key (what deleting them frees). */
int store_chunks_bytes(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *bytes);

#endif
