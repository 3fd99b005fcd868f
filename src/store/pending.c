/* pending: staged publishes in progress (pending.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blocks.h"
#include "chunks.h"
#include "pending.h"

void store_pending_encode(unsigned char *b, uint64_t created, uint64_t bytes)
{
	long pid = (long)getpid();
	store_be32(b, (uint32_t)pid);
	store_be64(b + 4, store_process_start(pid));
	store_be64(b + 12, created);
	store_be64(b + 20, bytes);
}

/* The keys this process has staged publishes in progress for (s->mu). */
static int live_has(struct store *s, const uint8_t *key)
{
	pthread_mutex_lock(&s->mu);
	int found = 0;
	for (size_t i = 0; i < s->n_live && !found; i++)
		found = !memcmp(s->live[i], key, STORE_KEY_LEN);
	pthread_mutex_unlock(&s->mu);
	return found;
}

int store_pending_live_add(struct store *s, const uint8_t *key)
{
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	if (s->n_live == s->cap_live) {
		size_t nc = s->cap_live ? s->cap_live * 2 : 8;
		void *nl = realloc(s->live, nc * STORE_KEY_LEN);
		if (nl) {
			s->live = nl;
			s->cap_live = nc;
		}
	}
	if (s->n_live < s->cap_live)
		memcpy(s->live[s->n_live++], key, STORE_KEY_LEN);
	else
		rc = -1;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void store_pending_live_remove(struct store *s, const uint8_t *key)
{
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_live; i++)
		if (!memcmp(s->live[i], key, STORE_KEY_LEN)) {
			memcpy(s->live[i], s->live[--s->n_live], STORE_KEY_LEN);
			break;
		}
	pthread_mutex_unlock(&s->mu);
}

/* Whether the pending row v of key belongs to a publish that may still be
 * running: its process exists (same pid, same start time) and, when it is
 * this process, has the key in progress (a row of ours whose cleanup failed
 * is dead). A row with this process's pid is judged by the keys in progress
 * alone: /proc cannot always be read (a daemon out of file descriptors; its
 * own rows then say no start time), and a publish of ours taken for a dead
 * one would have its chunks deleted under it. An older process with this
 * pid has no key in progress here: a publish of ours of that key replaced
 * its row when it began. */
int store_pending_alive(struct store *s, const uint8_t *key, const MDB_val *v)
{
	if (v->mv_size != PENDING_LEN)
		return 0;
	long pid = (long)store_get_be32(v->mv_data);
	uint64_t start = store_get_be64((const unsigned char *)v->mv_data + 4);
	if (pid == (long)getpid())
		return live_has(s, key);
	return start != 0 && store_process_start(pid) == start;
}

int store_pending_busy(struct store *s, MDB_txn *txn, const uint8_t *key)
{
	if (!s->has_pending)
		return 0;
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	return mdb_get(txn, s->pending, &k, &v) == 0 && store_pending_alive(s, key, &v);
}

int store_pending_sweep(struct store *s, MDB_txn *txn, uint32_t *swept)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->pending, &cur);
	if (rc)
		return rc;
	/* collect first: deleting under a cursor while walking is fragile */
	uint8_t(*keys)[STORE_KEY_LEN] = NULL;
	size_t n = 0, cap = 0;
	MDB_val k, v;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (k.mv_size == STORE_KEY_LEN && store_pending_alive(s, k.mv_data, &v))
			continue;
		if (k.mv_size != STORE_KEY_LEN) { /* not ours to interpret: drop it */
			if ((rc = mdb_cursor_del(cur, 0)) != 0)
				break;
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			void *nk = realloc(keys, nc * STORE_KEY_LEN);
			if (!nk) {
				rc = ENOMEM;
				break;
			}
			keys = nk;
			cap = nc;
		}
		memcpy(keys[n++], k.mv_data, STORE_KEY_LEN);
	}
	mdb_cursor_close(cur);
	if (rc == MDB_NOTFOUND)
		rc = 0;
	uint64_t freed = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		MDB_val pk = {STORE_KEY_LEN, keys[i]}, ev;
		if ((rc = mdb_del(txn, s->pending, &pk, NULL)) != 0)
			break;
		/* a record under this key means the entry was committed (the
		 * pending row of an older publish): the chunks are its own */
		rc = mdb_get(txn, s->entries, &pk, &ev);
		if (rc == MDB_NOTFOUND)
			rc = store_chunks_delete(s, txn, keys[i]);
		if (!rc)
			rc = store_blocks_release(s, txn, keys[i], &freed);
		if (swept && !rc)
			(*swept)++;
	}
	free(keys);
	struct store_totals t;
	if (!rc && freed && (rc = store_totals_get(s, txn, &t)) == 0) {
		t.bytes = t.bytes >= freed ? t.bytes - freed : 0;
		rc = store_totals_put(s, txn, &t);
	}
	return rc;
}

/* Removes what a staged publish of key wrote before its record: its chunks
 * and its held block references (what they free added to *freed). */
static int leftovers(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed)
{
	int rc = store_chunks_delete(s, txn, key);
	return rc ? rc : store_blocks_release(s, txn, key, freed);
}

int store_pending_claim(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t bytes,
                        uint64_t *freed)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	int rc = mdb_get(txn, s->pending, &k, &v);
	if (rc == 0 && store_pending_alive(s, key, &v))
		return 1;
	if (rc && rc != MDB_NOTFOUND)
		return rc;
	if ((rc = leftovers(s, txn, key, freed)) != 0) /* a dead writer's */
		return rc;
	unsigned char b[PENDING_LEN];
	store_pending_encode(b, store_now(s), bytes);
	MDB_val pv = {sizeof(b), b};
	return mdb_put(txn, s->pending, &k, &pv, 0);
}

int store_pending_reclaim(struct store *s, MDB_txn *txn, const uint8_t *key, uint64_t *freed)
{
	if (!s->has_pending)
		return 0;
	MDB_val k = {STORE_KEY_LEN, (void *)key}, v;
	int rc = mdb_get(txn, s->pending, &k, &v);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if ((rc = leftovers(s, txn, key, freed)) != 0)
		return rc;
	return store_pending_drop(s, txn, key);
}

int store_pending_drop(struct store *s, MDB_txn *txn, const uint8_t *key)
{
	MDB_val k = {STORE_KEY_LEN, (void *)key};
	int rc = mdb_del(txn, s->pending, &k, NULL);
	return rc == MDB_NOTFOUND ? 0 : rc;
}
