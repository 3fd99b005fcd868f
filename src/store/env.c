/* env: the shared handle's helpers (env.h). */
#include <string.h>
#include <time.h>

#include "env.h"
#include "xxh_dispatch.h"

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
