/* k3corrupt: a test helper that damages one stored entry the way a bad disk
 * would: it flips a byte inside one of the entry's chunks (the first unless
 * CHUNK says) through LMDB, leaving the chunk's stored checksum as it was,
 * or (drop) deletes that chunk, or (tokens) flips a byte of the entry's
 * token list. The daemon must not be running.
 * usage: k3corrupt DBDIR KEYHEX [flip|drop|tokens] [CHUNK] */
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hexutil.h"

int main(int argc, char **argv)
{
	uint8_t key[36] = {0};
	int drop = argc >= 4 && !strcmp(argv[3], "drop");
	int tokens = argc >= 4 && !strcmp(argv[3], "tokens");
	char *end = NULL;
	unsigned long chunk = argc == 5 ? strtoul(argv[4], &end, 10) : 0;
	if (argc < 3 || argc > 5 || hexutil_decode(argv[2], key, 32) != 0 ||
	    (argc >= 4 && !drop && !tokens && strcmp(argv[3], "flip") != 0) ||
	    (argc == 5 && (!*argv[4] || *end || chunk >= 0x80000000ul))) {
		fprintf(stderr, "usage: k3corrupt DBDIR KEYHEX [flip|drop|tokens] [CHUNK]\n");
		return 2;
	}
	key[32] = (uint8_t)(chunk >> 24); /* the chunk number, big-endian */
	key[33] = (uint8_t)(chunk >> 16);
	key[34] = (uint8_t)(chunk >> 8);
	key[35] = (uint8_t)chunk;
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	/* the tokens table is keyed by the entry's key alone */
	MDB_val k = {tokens ? 32 : 36, key}, v;
	if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) ||
	    mdb_env_set_mapsize(env, (size_t)4 << 30) || mdb_env_open(env, argv[1], 0, 0640) ||
	    mdb_txn_begin(env, NULL, 0, &txn) ||
	    mdb_dbi_open(txn, tokens ? "tokens" : "chunks", 0, &dbi) || mdb_get(txn, dbi, &k, &v)) {
		fprintf(stderr, "k3corrupt: cannot find %s of the entry\n",
		        tokens ? "the tokens" : "the chunk");
		return 1;
	}
	if (drop) {
		int rc = mdb_del(txn, dbi, &k, NULL) || mdb_txn_commit(txn);
		mdb_env_close(env);
		if (rc) {
			fprintf(stderr, "k3corrupt: delete failed\n");
			return 1;
		}
		printf("deleted chunk %lu of %s\n", chunk, argv[2]);
		return 0;
	}
	unsigned char *copy = malloc(v.mv_size);
	memcpy(copy, v.mv_data, v.mv_size);
	copy[v.mv_size / 2] ^= 0x5a; /* a chunk's: inside the data, past its 8-byte checksum */
	MDB_val nv = {v.mv_size, copy};
	int rc = mdb_put(txn, dbi, &k, &nv, 0) || mdb_txn_commit(txn);
	mdb_env_close(env);
	free(copy);
	if (rc) {
		fprintf(stderr, "k3corrupt: write failed\n");
		return 1;
	}
	if (tokens)
		printf("flipped a byte of the tokens of %s\n", argv[2]);
	else
		printf("flipped a byte of chunk %lu of %s\n", chunk, argv[2]);
	return 0;
}
