/* lru: last uses and the eviction policy (lru.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "chunks.h"
#include "entry.h"
#include "index.h"
#include "lru.h"
#include "txn.h"

#define TOUCH_CAP 65536u
/* Free space under which an I/O error on a write is taken for a full disk. */
#define STORE_DISK_LOW (UINT64_C(64) << 20)

void store_touch(struct store *s, const uint8_t key[STORE_KEY_LEN], uint64_t hits)
{
	if (s->opt.read_only)
		return;
	uint64_t seq = atomic_fetch_add(&s->lru_clock, 1) + 1;
	uint64_t now = store_now(s);
	pthread_mutex_lock(&s->mu);
	if (s->n_touches == s->cap_touches && s->cap_touches < TOUCH_CAP) {
		size_t ncap = s->cap_touches ? s->cap_touches * 2 : 64;
		struct store_touch *nt = realloc(s->touches, ncap * sizeof(*nt));
		if (nt) {
			s->touches = nt;
			s->cap_touches = ncap;
		}
	}
	if (s->n_touches < s->cap_touches) {
		struct store_touch *t = &s->touches[s->n_touches++];
		memcpy(t->key, key, STORE_KEY_LEN);
		t->seq = seq;
		t->when = now;
		t->hits = hits;
	}
	pthread_mutex_unlock(&s->mu);
}

int store_lru_apply_touches(struct store *s, MDB_txn *txn)
{
	pthread_mutex_lock(&s->mu);
	struct store_touch *list = s->touches;
	size_t n = s->n_touches;
	s->touches = NULL;
	s->n_touches = s->cap_touches = 0;
	pthread_mutex_unlock(&s->mu);
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		struct store_record r;
		int got = store_record_read(s, txn, list[i].key, &r);
		if (got)
			continue; /* evicted since, or damaged: nothing to touch */
		if (list[i].seq > r.lru_seq) {
			rc = store_index_lru_move(s, txn, &r, list[i].seq);
			r.lru_seq = list[i].seq;
			r.last_used = list[i].when;
		}
		r.hits += list[i].hits;
		if (!rc)
			rc = store_record_rewrite(s, txn, &r);
	}
	if (!rc && n) {
		struct store_totals t;
		rc = store_totals_get(s, txn, &t);
		uint64_t clock = atomic_load(&s->lru_clock);
		if (!rc && clock > t.lru_clock) {
			t.lru_clock = clock;
			rc = store_totals_put(s, txn, &t);
		}
	}
	free(list);
	return rc;
}

/* By key, the latest use of each entry first. */
static int touch_cmp(const void *a, const void *b)
{
	const struct store_touch *x = a, *y = b;
	int c = memcmp(x->key, y->key, STORE_KEY_LEN);
	if (c)
		return c;
	return x->seq == y->seq ? 0 : x->seq > y->seq ? -1 : 1;
}

int store_lru_dry_touches(struct store *s, MDB_txn *txn, struct store_dry *dry)
{
	_Static_assert(STORE_KEY_LEN == STORE_DRY_KEY_MAX, "a move is keyed by the entry's key");
	pthread_mutex_lock(&s->mu);
	size_t n = s->n_touches;
	struct store_touch *list = n ? malloc(n * sizeof(*list)) : NULL;
	if (list)
		memcpy(list, s->touches, n * sizeof(*list));
	pthread_mutex_unlock(&s->mu);
	if (!n)
		return 0; /* no moves */
	if (!list)
		return ENOMEM;
	qsort(list, n, sizeof(*list), touch_cmp);
	int rc = store_dry_moves_reserve(dry, n);
	for (size_t i = 0; i < n && !rc; i++) {
		if (i && !memcmp(list[i].key, list[i - 1].key, STORE_KEY_LEN))
			continue; /* an older use of the same entry: the latest decides */
		struct store_record r;
		/* as store_lru_apply_touches: an entry gone or damaged stays put */
		if (store_record_read(s, txn, list[i].key, &r) == 0 && list[i].seq > r.lru_seq)
			rc = store_dry_move_add(dry, r.key, r.lru_seq, list[i].seq, list[i].when);
	}
	free(list);
	return rc ? rc : store_dry_moves_done(dry);
}

int store_lru_begin(struct store *s, MDB_txn **txn, struct store_totals *t)
{
	*t = (struct store_totals){0};
	int rc = store_txn_write(s, txn);
	if (rc)
		return rc;
	if ((rc = store_lru_apply_touches(s, *txn)) || (rc = store_totals_get(s, *txn, t)))
		return store_txn_end(*txn, rc);
	return 0;
}

enum status_code store_flush(struct store *s, struct status *st)
{
	if (s->opt.read_only)
		return STATUS_OK;
	pthread_mutex_lock(&s->mu);
	size_t n = s->n_touches;
	pthread_mutex_unlock(&s->mu);
	if (!n)
		return STATUS_OK;
	MDB_txn *txn;
	int rc = store_txn_write(s, &txn);
	if (!rc)
		rc = store_txn_end(txn, store_lru_apply_touches(s, txn));
	return rc ? store_mdb_error(st, rc, "flush") : STATUS_OK;
}

int store_lru_end(struct store *s, MDB_txn *txn, struct store_totals *t, int rc)
{
	uint64_t clock = atomic_load(&s->lru_clock);
	if (clock > t->lru_clock)
		t->lru_clock = clock;
	if (!rc)
		rc = store_totals_put(s, txn, t);
	return store_txn_end(txn, rc);
}

int store_lru_evict_key(struct store *s, MDB_txn *txn, const uint8_t *key,
                        struct store_totals *totals, struct store_dry *dry, uint64_t *freed)
{
	*freed = 0;
	if (dry && store_dry_count(dry, key, STORE_KEY_LEN))
		return MDB_NOTFOUND; /* this dry run evicted it already */
	struct store_record r;
	int rc = store_record_read(s, txn, key, &r);
	if (rc == -1) { /* damaged: removed all the same, so eviction goes on */
		uint64_t b;
		if ((rc = store_chunks_bytes(s, txn, key, &b)) != 0)
			return rc;
		if (dry) { /* as the recount of a real one finds */
			totals->bytes = totals->bytes >= b ? totals->bytes - b : 0;
			totals->logical = totals->logical >= b ? totals->logical - b : 0;
			rc = store_dry_add(dry, key, STORE_KEY_LEN);
		} else {
			rc = store_entry_delete_damaged(s, txn, key, totals);
		}
		if (!rc)
			*freed = b;
	} else if (rc == 0) {
		uint64_t before = totals->bytes;
		if ((rc = store_entry_delete(s, txn, &r, totals, dry)) == 0)
			*freed = before - totals->bytes; /* blocks it was last to use included */
	}
	if (!rc && !dry)
		atomic_fetch_add(&s->evictions, 1);
	return rc;
}

/* A dry run's walk of the LRU, forward: its rows as the real evict finds
 * them once it has written the uses held in memory (dry->by_row), so a row
 * an entry leaves is passed over and the entry is met at its new row. */
struct dry_walk {
	MDB_cursor *cur;
	MDB_cursor_op op;
	int have, end; /* k: the cursor's row, not yet visited; end: no more */
	MDB_val k;
	size_t moved; /* moves visited */
	unsigned char row[8 + STORE_KEY_LEN];
};

/* The next row of the walk into *out (valid until the next call); 0,
 * MDB_NOTFOUND at the end, or an LMDB code. */
static int dry_next(struct dry_walk *w, const struct store_dry *dry, MDB_val *out)
{
	for (;;) {
		if (!w->have && !w->end) {
			MDB_val v;
			int rc = mdb_cursor_get(w->cur, &w->k, &v, w->op);
			w->op = MDB_NEXT;
			if (rc && rc != MDB_NOTFOUND)
				return rc;
			w->have = !rc;
			w->end = !!rc;
		}
		if (w->moved < dry->n_moves) {
			const struct store_dry_move *m = dry->by_row[w->moved];
			store_be64(w->row, m->to);
			memcpy(w->row + 8, m->key, STORE_KEY_LEN);
			int c = -1; /* the move's row against the cursor's, as LMDB orders keys */
			if (w->have) {
				size_t n = w->k.mv_size;
				c = memcmp(w->row, w->k.mv_data,
				           n < sizeof(w->row) ? n : sizeof(w->row));
				if (!c && n != sizeof(w->row))
					c = n < sizeof(w->row) ? 1 : -1;
			}
			if (c <= 0) {
				if (c == 0) /* the same row: met once */
					w->have = 0;
				w->moved++;
				*out = (MDB_val){sizeof(w->row), w->row};
				return 0;
			}
		}
		if (!w->have)
			return MDB_NOTFOUND;
		w->have = 0;
		if (w->k.mv_size == 8 + STORE_KEY_LEN) {
			const unsigned char *row = w->k.mv_data;
			const struct store_dry_move *m = store_dry_moved(dry, row + 8);
			if (m && m->from == store_get_be64(row))
				continue; /* the entry leaves this row */
		}
		*out = w->k;
		return 0;
	}
}

int store_lru_evict(struct store *s, MDB_txn *txn, struct store_totals *totals, uint64_t target,
                    struct store_dry *dry,
                    void (*fn)(const uint8_t *key, uint64_t bytes, void *ctx), void *ctx,
                    uint32_t *n_evicted)
{
	MDB_cursor *cur;
	int rc = mdb_cursor_open(txn, s->lru, &cur);
	if (rc)
		return rc;
	MDB_val k, v;
	/* Deleting takes the front row away, so a real eviction always reads the
	 * first row again; a dry run walks forward (dry_next). */
	struct dry_walk walk = {.cur = cur, .op = MDB_FIRST};
	while (totals->bytes > target && (rc = dry ? dry_next(&walk, dry, &k)
	                                           : mdb_cursor_get(cur, &k, &v, MDB_FIRST)) == 0) {
		if (k.mv_size != 8 + STORE_KEY_LEN) { /* not a row of ours: dropped */
			if (!dry && (rc = mdb_cursor_del(cur, 0)) != 0)
				break;
			continue;
		}
		unsigned char row[8 + STORE_KEY_LEN]; /* the row's bytes move as rows go */
		memcpy(row, k.mv_data, sizeof(row));
		uint64_t freed;
		int got = store_lru_evict_key(s, txn, row + 8, totals, dry, &freed);
		if (got && got != MDB_NOTFOUND) {
			rc = got;
			break;
		}
		if (!dry) { /* the row goes: with its entry, or stale (no such entry) */
			MDB_val rk = {sizeof(row), row};
			if ((rc = mdb_del(txn, s->lru, &rk, NULL)) != 0 && rc != MDB_NOTFOUND)
				break;
			rc = 0;
		}
		if (got)
			continue;
		if (fn)
			fn(row + 8, freed, ctx);
		if (n_evicted)
			(*n_evicted)++;
	}
	mdb_cursor_close(cur);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Makes room for `need` more bytes, evicting least-recently-used entries in
 * their own transaction and committing one more small transaction after it, so
 * that the pages they freed are reusable by the next one (LMDB reuses pages
 * freed by transaction N from N+2). */
int store_lru_make_room(struct store *s, uint64_t need, uint32_t *evicted, int force)
{
	MDB_txn *txn;
	struct store_totals t;
	int rc = store_lru_begin(s, &txn, &t);
	if (rc)
		return rc;
	uint64_t target = s->opt.max_bytes >= need ? s->opt.max_bytes - need : 0;
	if (force) /* after a MAP_FULL: free at least `need` more than now */
		target = t.bytes >= need ? t.bytes - need : 0;
	uint32_t n = 0;
	uint64_t was = t.bytes;
	if (t.bytes > target) {
		rc = store_lru_evict(s, txn, &t, target, NULL, NULL, NULL, &n);
		if (!rc)
			rc = store_totals_put(s, txn, &t);
	}
	if ((rc = store_txn_end(txn, rc)) != 0)
		return rc;
	atomic_fetch_add(&s->room_evictions, n);
	atomic_fetch_add(&s->room_evicted_bytes, was > t.bytes ? was - t.bytes : 0);
	if (evicted)
		*evicted += n;
	if (force && n == 0)
		return MDB_MAP_FULL; /* nothing left to evict */
	if (n && (rc = store_txn_write(s, &txn)) == 0) {
		if (!(rc = store_totals_get(s, txn, &t)))
			rc = store_totals_put(s, txn, &t);
		rc = store_txn_end(txn, rc);
	}
	return rc;
}

void store_room_evictions(struct store *s, uint64_t *entries, uint64_t *bytes)
{
	*entries = atomic_load(&s->room_evictions);
	*bytes = atomic_load(&s->room_evicted_bytes);
}

int store_lru_room_for(struct store *s, uint64_t need, uint32_t *evicted)
{
	MDB_txn *rtxn;
	struct store_totals t = {0};
	int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &rtxn);
	if (rc)
		return rc;
	rc = store_totals_get(s, rtxn, &t);
	mdb_txn_abort(rtxn);
	uint64_t staged = atomic_load(&s->staging_bytes); /* staged publishes' chunks */
	if (rc || t.bytes + staged + need <= s->opt.max_bytes)
		return rc;
	return store_lru_make_room(s, staged + need, evicted, 0);
}

/* Counts the reader table's lines (mdb_reader_list: "pid thread txnid",
 * txnid "-" for a slot not reading) of other processes that are reading. */
struct readers {
	int self, n;
};

static int count_reader(const char *msg, void *ctx)
{
	struct readers *r = ctx;
	char *end;
	long pid = strtol(msg, &end, 10);
	if (end == msg) /* the heading, or "(no active readers)" */
		return 0;
	const char *thread = end;
	(void)strtoull(thread, &end, 16);
	const char *p = end;
	while (*p == ' ')
		p++;
	if (end != thread && *p >= '0' && *p <= '9' && pid != r->self) /* txnid, not "-" */
		r->n++;
	return 0;
}

int store_lru_other_readers(struct store *s)
{
	int dead = 0;
	mdb_reader_check(s->env, &dead); /* a dead process's slot pins nothing */
	struct readers r = {(int)getpid(), 0};
	return mdb_reader_list(s->env, count_reader, &r) < 0 ? 0 : r.n;
}

int store_lru_pinned(struct store *s)
{
	return atomic_load(&s->open_snapshots) > 0 || store_lru_other_readers(s) > 0;
}

int store_lru_write(struct store *s, uint64_t need, int (*op)(struct store *s, void *ctx),
                    void *ctx, uint32_t *evicted)
{
	for (int tries = 0;; tries++) {
		int rc = op(s, ctx);
		if (rc != MDB_MAP_FULL || tries >= STORE_MAP_FULL_TRIES)
			return rc;
		atomic_fetch_add(&s->map_full_retries, 1);
		/* Pages freed while a read transaction is open (a restore here, a
		 * direct reader's view elsewhere) stay pinned until it ends:
		 * evicting more would empty the store and still not make room. Say
		 * BUSY; the caller retries. */
		if (tries > 0 && store_lru_pinned(s))
			return STORE_MAP_PINNED;
		if ((rc = store_lru_make_room(s, need, evicted, 1)) != 0)
			return rc;
	}
}

/* Whether the store has an entry (1 when it cannot be read: not empty as
 * far as is known). */
static int entries_left(struct store *s)
{
	MDB_txn *txn;
	MDB_stat ms;
	if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) != 0)
		return 1;
	int rc = mdb_stat(txn, s->entries, &ms);
	mdb_txn_abort(txn);
	return rc != 0 || ms.ms_entries > 0;
}

enum status_code store_lru_write_status(struct store *s, int rc, struct status *st)
{
	/* MAP_FULL while readers hold the pages eviction freed (its own write
	 * found no page, entries left): BUSY, a retry may find them let go */
	if (rc == STORE_MAP_PINNED || (rc == MDB_MAP_FULL && store_lru_pinned(s)))
		return status_set(st, STATUS_BUSY,
		                  "publish: the store's map is full, and readers pin the pages "
		                  "eviction would free (%d restore(s) in progress here, %d "
		                  "reader(s) in other processes, such as direct readers' views); "
		                  "retry shortly",
		                  (int)atomic_load(&s->open_snapshots), store_lru_other_readers(s));
	if (rc == MDB_MAP_FULL && entries_left(s))
		return status_set(st, STATUS_FULL,
		                  "publish: the store's map is full and evicting did not make "
		                  "room for this publish (no reader holds pages); evict entries "
		                  "(k3cachectl evict) or give the store a larger --max-bytes");
	if (rc == MDB_MAP_FULL)
		return status_set(st, STATUS_FULL,
		                  "publish: the store is full and nothing is left to evict");
	if (rc == ENOSPC || rc == EDQUOT || rc == EIO) {
		/* a write the disk refused: full when it says so, or when an I/O
		 * error comes with the disk all but full (a write-back failing) */
		struct statvfs fs;
		int known = statvfs(s->dir, &fs) == 0;
		uint64_t avail = known ? (uint64_t)fs.f_bavail * fs.f_frsize : 0;
		if (rc != EIO || (known && avail < STORE_DISK_LOW)) {
			char free_note[64] = "";
			if (known)
				snprintf(free_note, sizeof(free_note), " (%llu bytes free)",
				         (unsigned long long)avail);
			return status_set(
			        st, STATUS_FULL,
			        "publish: the disk holding the store (%s) is full%s: %s; "
			        "nothing was stored. Free space there, or lower --max-bytes",
			        s->dir, free_note, strerror(rc));
		}
	}
	return store_mdb_error(st, rc, "publish");
}
