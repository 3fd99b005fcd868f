/* t2_copy: the copy thread of the second tier (t2.h). It takes the keys of
 * entries committed locally, reads each from the store (every piece checked
 * against its stored sum on the way: bytes known bad are never sent),
 * writes it to the cluster unless a valid record is there already, and keeps
 * this daemon's share of the cluster within --tier2-max-bytes: the entries
 * it wrote are in its ledger (tier2_ledger_*), and the oldest go first.
 * Each copy is journaled in the ledger before its first write (a member of
 * negative score, with the generation the put then uses), so that a copy a
 * SIGKILL or a crash cut short is undone at the next start (tier2_undo):
 * its chunks and part references would otherwise stay in the cluster,
 * outside every budget. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "hexutil.h"
#include "t2_priv.h"

struct copier {
	struct k3d_t2 *t;
	struct cluster_router *r;
	struct cluster_stats seen;
	struct tier2_stats ts, ts_seen;
	struct tier2_owned *ledger; /* oldest first: [head, n) */
	size_t head, n, cap;
	uint64_t used;
	int loaded;
	struct tier2_owned *left; /* copies cut short, to undo: pending members */
	size_t n_left, cap_left;
	double warned;  /* t2_warn: when it last logged */
	uint64_t quiet; /* failures passed over since */
};

/* A failure of the copy thread's: at warn level, at most one line a minute
 * (with the number passed over), so that an operator sees a cluster that
 * stays down without a line per publish. */
static void t2_warn(struct copier *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void t2_warn(struct copier *c, const char *fmt, ...)
{
	double now = k3d_now();
	if (c->warned > 0 && now - c->warned < 60.0) {
		c->quiet++;
		return;
	}
	char line[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (c->quiet)
		k3d_log(K3D_LOG_WARN, "%s (and %llu more failures in the last minute)", line,
		        (unsigned long long)c->quiet);
	else
		k3d_log(K3D_LOG_WARN, "%s", line);
	c->warned = now;
	c->quiet = 0;
}

/* ---- the entry's bytes, from the map ---------------------------------------- */

struct snap_source {
	struct k3d_t2 *t;
	const struct store_snapshot *snap;
	uint64_t chunk, n_chunks;
	const unsigned char *cur;
	size_t left;
	int damaged;
};

static int snap_read(void *ctx, void *dst, size_t len, char *err, size_t errsz)
{
	struct snap_source *s = ctx;
	unsigned char *out = dst;
	while (len) {
		if (atomic_load(&s->t->stopping)) {
			snprintf(err, errsz, "the daemon is stopping");
			return -1;
		}
		if (!s->left) {
			const void *data;
			size_t n;
			struct status st;
			if (s->chunk >= s->n_chunks) {
				snprintf(err, errsz, "the entry's stored bytes end early");
				s->damaged = 1;
				return -1;
			}
			if (store_snapshot_chunk(s->snap, s->chunk, &data, &n, &st) != STATUS_OK) {
				snprintf(err, errsz, "%s", st.message);
				s->damaged = 1;
				return -1;
			}
			s->chunk++;
			s->cur = data;
			s->left = n;
		}
		size_t take = len < s->left ? len : s->left;
		memcpy(out, s->cur, take);
		out += take;
		len -= take;
		s->cur += take;
		s->left -= take;
	}
	return 0;
}

/* ---- the ledger ---------------------------------------------------------------- */

/* Whether the copy of pending member o was whole: the ledger has its entry
 * (the stop came between the two, or the pending member's removal failed). */
static int finished(const struct tier2_owned *all, size_t n, const struct tier2_owned *o)
{
	for (size_t i = 0; i < n; i++)
		if (all[i].score >= 0 && all[i].generation == o->generation &&
		    !memcmp(all[i].key, o->key, TIER2_KEY_LEN))
			return 1;
	return 0;
}

/* Appends o to the array *v of *n (room for *cap, grown by doubling from
 * first): 0, or -1 when out of memory. */
static int owned_push(struct tier2_owned **v, size_t *n, size_t *cap, size_t first,
                      const struct tier2_owned *o)
{
	if (*n == *cap) {
		size_t grow = *cap ? 2 * *cap : first;
		struct tier2_owned *grown = realloc(*v, grow * sizeof(*grown));
		if (!grown)
			return -1;
		*v = grown;
		*cap = grow;
	}
	(*v)[(*n)++] = *o;
	return 0;
}

static int left_add(struct copier *c, const struct tier2_owned *o)
{
	return owned_push(&c->left, &c->n_left, &c->cap_left, 8, o);
}

/* Undoes at most `most` copies cut short (their pending members), oldest
 * first; those whose undo fails stay for the next call. */
static void undo_left(struct copier *c, size_t most)
{
	struct k3d_t2 *t = c->t;
	size_t kept = 0, done = 0;
	uint64_t freed_all = 0;
	for (size_t i = 0; i < c->n_left; i++) {
		const struct tier2_owned *o = &c->left[i];
		char err[512] = "", hex[2 * TIER2_KEY_LEN + 1];
		uint64_t freed = 0;
		enum tier2_status st = TIER2_TIMEOUT;
		if (done < most && !atomic_load(&t->stopping)) {
			done++;
			st = tier2_undo(c->r, t->cfg.ns, o->key, o->generation, &freed, err,
			                sizeof(err));
			if (st == TIER2_DAMAGED) {
				/* as far as it can be: no retry does more */
				k3d_log(K3D_LOG_WARN, "tier2: %s", err);
				st = TIER2_OK;
			}
			if (st == TIER2_OK)
				st = tier2_ledger_remove(c->r, t->cfg.ns, t->owner, o, err,
				                         sizeof(err));
			if (st == TIER2_MISSING)
				st = TIER2_OK;
			if (st != TIER2_OK) {
				atomic_fetch_add(&t->n.cleanup_failed, 1);
				hexutil_encode(o->key, TIER2_KEY_LEN, hex);
				t2_warn(c, "tier2: undoing the copy of %.16s cut short: %s: %s",
				        hex, tier2_status_name(st), err);
			}
		}
		if (st == TIER2_OK) {
			atomic_fetch_add(&t->n.copies_undone, 1);
			freed_all += freed;
		} else {
			c->left[kept++] = *o;
		}
	}
	if (c->n_left > kept)
		k3d_log(K3D_LOG_INFO,
		        "tier2: undid %zu copies cut short by a stop (%llu bytes deleted); %zu "
		        "left",
		        c->n_left - kept, (unsigned long long)freed_all, kept);
	c->n_left = kept;
}

/* Reads the ledger back: 0, or -1 with why in err. */
static int load_ledger(struct copier *c, char *err, size_t errsz)
{
	struct tier2_owned *all = NULL;
	size_t n = 0;
	enum tier2_status st =
	        tier2_ledger_load(c->r, c->t->cfg.ns, c->t->owner, &all, &n, err, errsz);
	if (st != TIER2_OK)
		return -1;
	free(c->ledger);
	c->ledger = all;
	c->head = 0;
	c->used = 0;
	c->n_left = 0;
	size_t kept = 0;
	for (size_t i = 0; i < n; i++) {
		if (all[i].score < 0) { /* a copy under way when the daemon stopped */
			if (finished(all, n, &all[i])) /* only its journal is left */
				(void)tier2_ledger_remove(c->r, c->t->cfg.ns, c->t->owner, &all[i],
				                          err, errsz);
			else if (left_add(c, &all[i]) != 0)
				k3d_log(K3D_LOG_WARN, "tier2: ledger: out of memory");
			continue;
		}
		all[kept++] = all[i];
		c->used += all[i].bytes;
	}
	n = kept;
	c->n = c->cap = n;
	atomic_store(&c->t->used_bytes, c->used);
	c->loaded = 1;
	if (n)
		k3d_log(K3D_LOG_INFO, "tier2: this daemon's ledger holds %zu entries, %llu bytes",
		        n, (unsigned long long)c->used);
	return 0;
}

static int ledger_append(struct copier *c, const struct tier2_owned *o)
{
	if (c->n == c->cap && c->head && c->head >= c->cap / 2) { /* the deleted half: reused */
		memmove(c->ledger, c->ledger + c->head, (c->n - c->head) * sizeof(*c->ledger));
		c->n -= c->head;
		c->head = 0;
	}
	if (owned_push(&c->ledger, &c->n, &c->cap, 64, o) != 0)
		return -1;
	c->used += o->bytes;
	atomic_store(&c->t->used_bytes, c->used);
	return 0;
}

/* Deletes per copy at most: a budget cut by much (a restart with a smaller
 * --tier2-max-bytes) is caught up over the next copies, and a SIGTERM waits
 * for one delete, not thousands. */
#define ROOM_DELETES_PER_COPY 64

/* A pending member's bytes have it set. */
#define PENDING_BIT ((uint64_t)1 << 63)

/* Copies cut short undone per copy at most, after the start's (a cluster
 * that failed their undo then). */
#define UNDO_PER_COPY 4

/* Deletes this daemon's oldest entries from the cluster until what it holds
 * is within its budget; the newest (just written) stays. */
static void make_room(struct copier *c)
{
	struct k3d_t2 *t = c->t;
	for (int done = 0; c->used > t->cfg.max_bytes && c->n - c->head > 1 &&
	                   done < ROOM_DELETES_PER_COPY && !atomic_load(&t->stopping);
	     done++) {
		struct tier2_owned o = c->ledger[c->head];
		char err[512] = "";
		uint64_t freed = 0;
		enum tier2_status st = tier2_delete(c->r, t->cfg.ns, o.key, o.generation, &freed,
		                                    err, sizeof(err));
		/* MISSING: gone or re-published by another; DAMAGED: not a record
		 * of ours to delete. Either way it is off the ledger. */
		if (st != TIER2_OK && st != TIER2_MISSING && st != TIER2_DAMAGED) {
			atomic_fetch_add(&t->n.cleanup_failed, 1);
			t2_warn(c, "tier2: making room: %s", err);
			return; /* again after the next copy */
		}
		enum tier2_status rs =
		        tier2_ledger_remove(c->r, t->cfg.ns, t->owner, &o, err, sizeof(err));
		if (rs != TIER2_OK && rs != TIER2_MISSING) {
			atomic_fetch_add(&t->n.cleanup_failed, 1);
			t2_warn(c, "tier2: making room: %s", err);
			return;
		}
		atomic_fetch_add(&t->n.deleted, st == TIER2_OK);
		c->head++;
		c->used -= o.bytes;
		atomic_store(&t->used_bytes, c->used);
	}
}

/* ---- one copy ---------------------------------------------------------------------- */

static void copy_one(struct copier *c, const uint8_t *key)
{
	struct k3d_t2 *t = c->t;
	struct store *s = t->srv->store;
	char hex[2 * STORE_KEY_LEN + 1];
	hexutil_encode(key, STORE_KEY_LEN, hex);
	struct store_entry_info *info = NULL;
	struct status st;
	if (store_inspect(s, key, &info, &st) != STATUS_OK || info->quarantined) {
		store_entry_info_free(info); /* evicted or taken out of service since */
		return;
	}
	if (info->bytes > t->cfg.max_bytes) {
		atomic_fetch_add(&t->n.copies_too_large, 1);
		store_entry_info_free(info);
		return;
	}
	char err[512] = "";
	int late = !c->loaded;
	if (late && load_ledger(c, err, sizeof(err)) == 0 && c->n_left)
		undo_left(c, SIZE_MAX); /* read just now: all of them, before this copy */
	if (!c->loaded) {
		atomic_fetch_add(&t->n.copies_failed, 1);
		t2_warn(c,
		        "tier2: copy of %.16s: this daemon's ledger cannot be read from the "
		        "cluster: %s",
		        hex, err);
		store_entry_info_free(info);
		return;
	}
	struct store_snapshot *snap = NULL;
	if (store_restore_opt(s, key, STORE_RESTORE_DEFER, &snap, &st) != STATUS_OK) {
		if (st.code == STATUS_CORRUPT)
			k3d_writer_quarantine(t->srv->writer, key);
		if (st.code != STATUS_NOT_FOUND)
			atomic_fetch_add(&t->n.copies_failed, 1);
		store_entry_info_free(info);
		return;
	}
	if (c->n_left && !late)
		undo_left(c, UNDO_PER_COPY);
	/* the journal first: a copy cut short is undone at the next start */
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	struct tier2_owned pending = {
	        .generation = tier2_generation_new(),
	        .bytes = info->bytes | PENDING_BIT, /* never the member of the entry it becomes */
	        .score = -((double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6)};
	memcpy(pending.key, key, TIER2_KEY_LEN);
	if (tier2_ledger_add(c->r, t->cfg.ns, t->owner, &pending, err, sizeof(err)) != TIER2_OK) {
		atomic_fetch_add(&t->n.copies_failed, 1);
		t2_warn(c, "tier2: copy of %.16s: journaling it in the ledger: %s", hex, err);
		store_snapshot_release(snap);
		store_entry_info_free(info);
		return;
	}
	struct tier2_layer *layers = calloc(snap->n_layers ? snap->n_layers : 1, sizeof(*layers));
	enum tier2_status ts = TIER2_NOMEM;
	struct tier2_put_result res = {0};
	struct snap_source src = {.t = t, .snap = snap, .n_chunks = store_snapshot_chunks(snap)};
	if (layers) {
		for (uint32_t i = 0; i < snap->n_layers; i++)
			layers[i] = (struct tier2_layer){snap->layers[i].size, snap->layers[i].xxh3,
			                                 snap->layers[i].tag};
		struct tier2_source source = {snap_read, &src};
		/* MLA rows in blocks of 64 shared with the conversation's other turns */
		struct tier2_put_options o = {
		        .keep_existing = 1, .row_block = 64, .generation = pending.generation};
		ts = tier2_put_from(c->r, t->cfg.ns, info->fingerprint, info->salt, info->salt_len,
		                    info->tokens, info->prefix_len, layers, snap->n_layers, &source,
		                    &o, &res, &c->ts, err, sizeof(err));
	}
	free(layers);
	store_snapshot_release(snap);
	if (src.damaged)
		k3d_writer_quarantine(t->srv->writer, key);
	if (ts != TIER2_OK) {
		atomic_fetch_add(&t->n.copies_failed, 1);
		if (src.damaged)
			k3d_log(K3D_LOG_WARN, "tier2: copy of %.16s: %s: %s", hex,
			        tier2_status_name(ts), err);
		else
			t2_warn(c, "tier2: copy of %.16s: %s: %s", hex, tier2_status_name(ts), err);
	} else if (res.existed) {
		atomic_fetch_add(&t->n.copies_existing, 1);
	} else {
		atomic_fetch_add(&t->n.copies, 1);
		struct tier2_owned o = {.generation = res.generation,
		                        /* all it uses, shared parts too: a part
		                         * outlives the entry that wrote it while
		                         * later turns use it, so counting only
		                         * what each put created undercounts */
		                        .bytes = res.new_bytes + res.shared_bytes,
		                        .score = (double)now.tv_sec * 1e3 +
		                                 (double)now.tv_nsec / 1e6};
		memcpy(o.key, key, TIER2_KEY_LEN); /* counted here even when the cluster's copy of
		                                    * the ledger missed it: this daemon deletes it
		                                    * in turn all the same (a restart forgets it,
		                                    * and Redis's own eviction is then its end) */
		if (tier2_ledger_add(c->r, t->cfg.ns, t->owner, &o, err, sizeof(err)) != TIER2_OK) {
			atomic_fetch_add(&t->n.cleanup_failed, 1);
			t2_warn(c, "tier2: ledger: %s", err);
		}
		if (ledger_append(c, &o) != 0) {
			atomic_fetch_add(&t->n.cleanup_failed, 1);
			t2_warn(c, "tier2: ledger: out of memory");
		}
	}
	/* the journal's member goes once the copy is whole, found there or
	 * undone; a failure whose undo did not finish keeps it, to undo later */
	if (ts != TIER2_OK && res.undo_left) {
		if (left_add(c, &pending) != 0) {
			atomic_fetch_add(&t->n.cleanup_failed, 1);
			t2_warn(c, "tier2: ledger: out of memory");
		}
	} else if (tier2_ledger_remove(c->r, t->cfg.ns, t->owner, &pending, err, sizeof(err)) !=
	           TIER2_OK) {
		atomic_fetch_add(&t->n.cleanup_failed, 1);
		t2_warn(c, "tier2: ledger: %s", err);
	}
	if (ts == TIER2_OK && !res.existed)
		make_room(c);
	store_entry_info_free(info);
}

void *t2_copy_main(void *arg)
{
	struct copier c = {.t = arg};
	c.r = t2_router(c.t);
	char err[512] = "";
	if (c.r && load_ledger(&c, err, sizeof(err)) != 0)
		k3d_log(K3D_LOG_DEBUG, "tier2: the ledger is read before the first copy (%s)", err);
	if (c.r && c.n_left) /* copies a stop cut short: undone before any other */
		undo_left(&c, SIZE_MAX);
	for (;;) {
		struct t2_item *it = t2_queue_pop(&c.t->copyq);
		if (!it)
			break;
		if (it->kind == T2_LIST) { /* a listing runs here, off the lookups' thread */
			t2_list_run(c.t, c.r, &c.ts, it);
			if (c.r)
				t2_count_router(c.t, c.r, &c.seen, &c.ts, &c.ts_seen);
			continue;
		}
		if (c.r) {
			copy_one(&c, it->key);
			t2_count_router(c.t, c.r, &c.seen, &c.ts, &c.ts_seen);
		} else {
			atomic_fetch_add(&c.t->n.copies_failed, 1);
		}
		k3d_t2_item_free(it);
	}
	free(c.ledger);
	free(c.left);
	cluster_router_free(c.r);
	return NULL;
}
