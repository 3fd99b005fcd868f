/* env: the shared handle's helpers (env.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blocks.h"
#include "chunks.h"
#include "env.h"
#include "index.h"
#include "pending.h"
#include "record.h"
#include "xxh_dispatch.h"

#define T(name, flags, opt, kmin, kmax, vmin, vmax, unit)                                          \
	{                                                                                          \
#name, offsetof(struct store, name), flags, opt, kmin, kmax, vmin, vmax, unit      \
	}

#define HAS(flag) offsetof(struct store, flag)

const struct store_table store_tables[] = {
        T(meta, 0, STORE_REQUIRED, 1, 64, 0, 4096, 1),
        T(models, 0, STORE_REQUIRED, MODEL_FINGERPRINT_LEN, MODEL_FINGERPRINT_LEN, 2, 0, 1),
        T(entries, 0, STORE_REQUIRED, STORE_KEY_LEN, STORE_KEY_LEN, STORE_RECORD_MIN, 0, 1),
        T(tokens, 0, STORE_REQUIRED, STORE_KEY_LEN, STORE_KEY_LEN, 4, 0, 4),
        T(chunks, 0, STORE_REQUIRED, STORE_CHUNK_KEY_LEN, STORE_CHUNK_KEY_LEN, 8, 0, 1),
        T(nodes, 0, STORE_REQUIRED, PREFIX_NODE_LEN, PREFIX_NODE_LEN, 4, 4, 1),
        T(attach, MDB_DUPSORT, STORE_REQUIRED, PREFIX_NODE_LEN, PREFIX_NODE_LEN, STORE_ATTACH_LEN,
          STORE_ATTACH_LEN, 1),
        T(lru, 0, STORE_REQUIRED, 8 + STORE_KEY_LEN, 8 + STORE_KEY_LEN, 0, 0, 1),
        T(pending, 0, HAS(has_pending), STORE_KEY_LEN, STORE_KEY_LEN, PENDING_LEN, PENDING_LEN, 1),
        T(blocks, 0, HAS(has_blocks), STORE_BLOCK_KEY_LEN, STORE_BLOCK_KEY_LEN, 8, 0, 1),
        T(blockrefs, 0, HAS(has_blocks), STORE_BLOCK_REF_LEN, STORE_BLOCK_REF_LEN, 4, 4, 1),
        T(held, 0, HAS(has_held), STORE_BLOCK_HELD_LEN, STORE_BLOCK_HELD_LEN, 0, 0, 1),
};
const size_t store_n_tables = sizeof(store_tables) / sizeof(store_tables[0]);

static uint64_t real_clock(void)
{
	return (uint64_t)time(NULL);
}

uint64_t store_now(const struct store *s)
{
	return s->opt.clock ? s->opt.clock() : real_clock();
}

enum status_code store_mdb_error(struct status *st, int rc, const char *what)
{
	if (rc == MDB_MAP_FULL)
		return status_set(st, STATUS_FULL, "%s: the store's map is full", what);
	if (rc == MDB_READERS_FULL)
		return status_set(st, STATUS_BUSY, "%s: too many concurrent readers", what);
	if (rc == MDB_MAP_RESIZED) /* a read-only open's map (store_remap) */
		return status_set(st, STATUS_BUSY,
		                  "%s: the store's file has grown past this process's map of it "
		                  "(its daemon was restarted with a larger --max-bytes); a direct "
		                  "reader maps it again at its next call once nothing in this "
		                  "process reads it: its views released and every other direct "
		                  "reader of this store closed",
		                  what);
	if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID)
		return status_set(st, STATUS_CORRUPT, "%s: %s", what, mdb_strerror(rc));
	return status_set(st, STATUS_INTERNAL, "%s: %s", what, mdb_strerror(rc));
}

void store_be32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (24 - 8 * i));
}

uint32_t store_get_be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void store_be64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (56 - 8 * i));
}

uint64_t store_get_be64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

int store_totals_get(struct store *s, MDB_txn *txn, struct store_totals *t)
{
	MDB_val k = {6, "totals"}, v;
	memset(t, 0, sizeof(*t));
	int rc = mdb_get(txn, s->meta, &k, &v);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if (v.mv_size != 16 && v.mv_size != 24)
		return MDB_CORRUPTED;
	t->bytes = store_get_be64(v.mv_data);
	t->lru_clock = store_get_be64((const unsigned char *)v.mv_data + 8);
	t->logical =
	        v.mv_size == 24 ? store_get_be64((const unsigned char *)v.mv_data + 16) : t->bytes;
	return 0;
}

int store_totals_put(struct store *s, MDB_txn *txn, const struct store_totals *t)
{
	unsigned char b[24];
	store_be64(b, t->bytes);
	store_be64(b + 8, t->lru_clock);
	store_be64(b + 16, t->logical);
	MDB_val k = {6, "totals"}, v = {24, b};
	return mdb_put(txn, s->meta, &k, &v, 0);
}

int store_value_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, const void *data, size_t len,
                    uint64_t seed, unsigned flags)
{
	MDB_val v = {len + 8, NULL};
	int rc = mdb_put(txn, dbi, key, &v, flags | MDB_RESERVE);
	if (rc)
		return rc;
	uint64_t sum = XXH3_64bits_withSeed(data, len, seed);
	memcpy(v.mv_data, &sum, 8);
	memcpy((unsigned char *)v.mv_data + 8, data, len);
	return 0;
}

int store_value_intact(const MDB_val *v, uint64_t seed)
{
	if (v->mv_size < 8)
		return 0;
	uint64_t sum;
	memcpy(&sum, v->mv_data, 8);
	return XXH3_64bits_withSeed((const unsigned char *)v->mv_data + 8, v->mv_size - 8, seed) ==
	       sum;
}

/* Start time of a process (clock ticks since boot, /proc/PID/stat field 22),
 * or 0 when it does not exist. */
uint64_t store_process_start(long pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
	if (!p)
		return 0;
	/* after ") " come fields 3.. ; the start time is field 22 */
	int field = 2;
	for (; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	return strtoull(p, NULL, 10);
}
