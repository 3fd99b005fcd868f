/* walk: the structural check of a data file, without LMDB (walk.h).
 *
 * The layout read here is LMDB 0.9's (mdb.c, MDB_DATA_VERSION 1), in host
 * byte order: a page starts with u64 pgno | u16 pad | u16 flags | u16 lower
 * | u16 upper (an overflow page: u32 pages in place of lower and upper),
 * then lower - 16 bytes of u16 node offsets; a node is u16 lo | u16 hi |
 * u16 flags | u16 ksize | key | data, where lo | hi is the data size on a
 * leaf and, with flags, the child's page number on a branch. Pages 0 and 1
 * are the meta pages. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "env.h"
#include "walk.h"

#define PAGEHDRSZ     16u
#define NODESIZE      8u
#define NUM_METAS     2u
#define DB_LEN        48u
#define MAGIC         0xBEEFC0DEu
#define DATA_VERSION  1u
#define MIN_PAGESIZE  512u
#define MAX_PAGESIZE  0x8000u
#define MAX_DEPTH     32u /* LMDB's cursor stack */
#define MAX_KEYSIZE   511u
#define P_INVALID     UINT64_MAX
#define P_BRANCH      0x01u
#define P_LEAF        0x02u
#define P_OVERFLOW    0x04u
#define P_META        0x08u
#define P_DIRTY       0x10u
#define P_SUBP        0x40u
#define F_BIGDATA     0x01u
#define F_SUBDATA     0x02u
#define F_DUPDATA     0x04u
#define OVPAGES(n, p) ((PAGEHDRSZ - 1 + (n)) / (p) + 1)

/* MDB_db: u32 pad | u16 flags | u16 depth | u64 branch, leaf, overflow,
 * entries, root */
struct wdb {
	uint32_t pad;
	uint16_t flags, depth;
	uint64_t branch, leaf, overflow, entries, root;
};

enum tree_kind { TREE_FREE, TREE_MAIN, TREE_TABLE, TREE_DUPS };

struct tree {
	enum tree_kind kind;
	const char *name;
	const struct store_table *t; /* TREE_TABLE and TREE_DUPS */
	const unsigned char *dupkey; /* TREE_DUPS: the key the duplicates are of */
	size_t dupklen;
	uint64_t branch, leaf, overflow, entries;
	unsigned leaf_level;
};

struct walker {
	const unsigned char *map;
	size_t size;
	uint32_t psize;
	uint64_t last_pg;
	uint64_t *seen; /* a bit per page up to last_pg */
	store_walk_item_fn item;
	void *ctx;
	struct store_walk_stats *st;
	char *why;
	size_t whysz;
	int stopped; /* item's nonzero return */
	int fd;      /* the file, to read overflow headers from; -1: the map */
};

static uint16_t u16at(const unsigned char *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

static uint32_t u32at(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static uint64_t u64at(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static void get_db(const unsigned char *p, struct wdb *d)
{
	d->pad = u32at(p);
	d->flags = u16at(p + 4);
	d->depth = u16at(p + 6);
	d->branch = u64at(p + 8);
	d->leaf = u64at(p + 16);
	d->overflow = u64at(p + 24);
	d->entries = u64at(p + 32);
	d->root = u64at(p + 40);
}

/* Records a problem (the first one's text is kept). Returns -1. */
__attribute__((format(printf, 3, 4))) static int problem(struct walker *w, uint64_t pgno,
                                                         const char *fmt, ...)
{
	if (w->st->problems++ == 0 && w->why && w->whysz) {
		int n = snprintf(w->why, w->whysz, "page %llu: ", (unsigned long long)pgno);
		if (n < 0 || (size_t)n >= w->whysz)
			n = 0;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(w->why + n, w->whysz - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* The page pgno, or NULL when it is not in the snapshot or the file. */
static const unsigned char *page_at(const struct walker *w, uint64_t pgno, uint64_t npages)
{
	if (pgno < NUM_METAS || pgno > w->last_pg || npages > w->last_pg - pgno + 1)
		return NULL;
	if (pgno + npages > w->size / w->psize)
		return NULL;
	return w->map + pgno * w->psize;
}

/* Marks pages [pgno, pgno + n) as reached; -1 when one was reached before. */
static int mark(struct walker *w, uint64_t pgno, uint64_t n, const char *what)
{
	for (uint64_t i = pgno; i < pgno + n; i++) {
		uint64_t bit = UINT64_C(1) << (i % 64);
		if (w->seen[i / 64] & bit)
			return problem(w, i, "%s reaches a page that is already in use", what);
		w->seen[i / 64] |= bit;
	}
	return 0;
}

/* LMDB's default order (mdb_cmp_memn): bytes, then length. */
static int cmp_memn(const unsigned char *a, size_t alen, const unsigned char *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;
	return c ? c : (alen > blen) - (alen < blen);
}

static int in_shape(uint64_t n, uint32_t min, uint32_t max, uint32_t unit)
{
	return n >= min && (!max || n <= max) && (n - min) % unit == 0;
}

/* A node's key and data on a page of `room` bytes at base. */
struct node {
	unsigned flags;
	const unsigned char *key, *data;
	size_t ksize;
	uint64_t dsize; /* a leaf's data size (the value's, with F_BIGDATA) */
	uint64_t child; /* a branch's child page */
	size_t inpage;  /* bytes of the node on the page */
};

/* Checks a page's header and node table (of a page of room bytes: a whole
 * page, or a sub-page inside a node) and reads node i. */
static int page_bounds(struct walker *w, uint64_t pgno, const unsigned char *p, size_t room,
                       unsigned *nkeys, const char *name)
{
	unsigned lower = u16at(p + 12), upper = u16at(p + 14);
	if (lower < PAGEHDRSZ || (lower - PAGEHDRSZ) % 2 || lower > upper || upper > room)
		return problem(w, pgno, "(%s) bounds %u..%u are outside the page", name, lower,
		               upper);
	*nkeys = (lower - PAGEHDRSZ) / 2;
	return 0;
}

static int read_node(struct walker *w, uint64_t pgno, const unsigned char *p, size_t room,
                     unsigned i, int branch, struct node *nd, const char *name)
{
	unsigned upper = u16at(p + 14);
	unsigned off = u16at(p + PAGEHDRSZ + 2 * (size_t)i);
	if (off % 2 || off < upper || (size_t)off + NODESIZE > room)
		return problem(w, pgno, "(%s) node %u is outside the page", name, i);
	const unsigned char *n = p + off;
	unsigned lo = u16at(n), hi = u16at(n + 2), fl = u16at(n + 4);
	nd->ksize = u16at(n + 6);
	nd->key = n + NODESIZE;
	nd->flags = fl;
	size_t body;
	if (branch) {
		nd->child = (uint64_t)lo | (uint64_t)hi << 16 | (uint64_t)fl << 32;
		nd->dsize = 0;
		body = 0;
	} else {
		nd->dsize = (uint64_t)lo | (uint64_t)hi << 16;
		if (fl & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA))
			return problem(w, pgno, "(%s) node %u has unknown flags 0x%x", name, i, fl);
		body = fl & F_BIGDATA ? 8 : nd->dsize;
	}
	if (nd->ksize > MAX_KEYSIZE)
		return problem(w, pgno, "(%s) node %u has a key of %zu bytes", name, i, nd->ksize);
	nd->inpage = NODESIZE + nd->ksize + body;
	if (nd->inpage > room - off)
		return problem(w, pgno, "(%s) node %u runs past the end of the page", name, i);
	nd->data = nd->key + nd->ksize;
	return 0;
}

static int walk_page(struct walker *w, struct tree *tr, uint64_t pgno, unsigned level);

/* The value of an F_BIGDATA node: its overflow run, checked. */
static const unsigned char *overflow(struct walker *w, struct tree *tr, uint64_t pgno,
                                     const struct node *nd)
{
	uint64_t ov = u64at(nd->data);
	uint64_t n = OVPAGES(nd->dsize, w->psize);
	const unsigned char *p = page_at(w, ov, 1);
	if (!p) {
		problem(w, pgno, "(%s) overflow page %llu is outside the file", tr->name,
		        (unsigned long long)ov);
		return NULL;
	}
	unsigned char hdr[PAGEHDRSZ];
	/* a read of the header costs a tenth of a fault on the map (the walk
	 * reads one per overflow run, scattered over the file) */
	if (w->fd < 0 || pread(w->fd, hdr, sizeof(hdr), (off_t)(ov * w->psize)) != sizeof(hdr))
		memcpy(hdr, p, sizeof(hdr));
	p = hdr;
	if (u64at(p) != ov || u16at(p + 10) != P_OVERFLOW) {
		problem(w, ov, "(%s) is not the overflow page its node names", tr->name);
		return NULL;
	}
	/* LMDB keeps a run when it overwrites its value with a shorter one in
	 * place, so a run may be longer than its value; never shorter */
	if (u32at(p + 12) < n) {
		problem(w, ov,
		        "(%s) overflow run of %u pages holds a value of %llu bytes (%llu pages)",
		        tr->name, u32at(p + 12), (unsigned long long)nd->dsize,
		        (unsigned long long)n);
		return NULL;
	}
	n = u32at(p + 12); /* a run too long reaches pages in use: mark() says so */
	if (!page_at(w, ov, n)) {
		problem(w, ov, "(%s) overflow run of %llu pages is outside the file", tr->name,
		        (unsigned long long)n);
		return NULL;
	}
	if (mark(w, ov, n, "an overflow run"))
		return NULL;
	tr->overflow += n;
	w->st->overflow += n;
	return w->map + ov * w->psize + PAGEHDRSZ;
}

static int call_item(struct walker *w, const struct tree *tr, const unsigned char *k, size_t kl,
                     const unsigned char *v, size_t vl)
{
	if (!w->item || w->stopped)
		return 0;
	w->stopped = w->item(tr->t->name, k, kl, v, vl, w->ctx);
	return w->stopped;
}

/* The free list's items: u64 txnid -> u64 n | n page numbers. */
static int free_item(struct walker *w, struct tree *tr, uint64_t pgno, const struct node *nd,
                     const unsigned char *v)
{
	/* u64 n | n page numbers; a record LMDB reserved larger than it
	 * filled has slack after them */
	if (nd->ksize != 8 || nd->dsize < 8 || nd->dsize % 8 || u64at(v) > nd->dsize / 8 - 1)
		return problem(w, pgno, "(free list) a record of %zu and %llu bytes is malformed",
		               nd->ksize, (unsigned long long)nd->dsize);
	for (uint64_t i = 1; i <= u64at(v); i++) {
		uint64_t f = u64at(v + 8 * i);
		if (f < NUM_METAS || f > w->last_pg)
			return problem(w, pgno, "(free list) lists page %llu, outside the file",
			               (unsigned long long)f);
		if (mark(w, f, 1, "the free list"))
			return -1;
		w->st->free++;
	}
	tr->entries++;
	return 0;
}

static int walk_tree(struct walker *w, struct tree *tr, const struct wdb *db, uint64_t pgno);

/* A named database: its MDB_db in the main database. */
/* NOLINTNEXTLINE(misc-no-recursion): bounded by MAX_DEPTH per tree, three trees deep */
static int main_item(struct walker *w, struct tree *tr, uint64_t pgno, const struct node *nd)
{
	tr->entries++;
	if (nd->flags != F_SUBDATA || nd->dsize != DB_LEN)
		return problem(w, pgno, "(main) node %.*s is not a named database", (int)nd->ksize,
		               (const char *)nd->key);
	const struct store_table *t = NULL;
	for (size_t i = 0; i < store_n_tables; i++)
		if (strlen(store_tables[i].name) == nd->ksize &&
		    !memcmp(store_tables[i].name, nd->key, nd->ksize))
			t = &store_tables[i];
	if (!t)
		return problem(w, pgno, "(main) \"%.*s\" is not a database k3cache has",
		               (int)nd->ksize, (const char *)nd->key);
	struct wdb db;
	get_db(nd->data, &db);
	if ((db.flags & 0x7fff) != t->flags)
		return problem(w, pgno, "(main) database %s has flags 0x%x, not 0x%x", t->name,
		               db.flags, t->flags);
	struct tree sub = {.kind = TREE_TABLE, .name = t->name, .t = t};
	return walk_tree(w, &sub, &db, pgno);
}

/* The duplicates of one key in a sub-page: a leaf page inside the node. */
static int sub_page(struct walker *w, struct tree *tr, uint64_t pgno, const struct node *nd)
{
	const unsigned char *p = nd->data;
	size_t room = (size_t)nd->dsize;
	unsigned nkeys = 0;
	if (room < PAGEHDRSZ || (u16at(p + 10) & ~P_DIRTY) != (P_LEAF | P_SUBP))
		return problem(w, pgno, "(%s) a sub-page of duplicates is malformed", tr->name);
	if (page_bounds(w, pgno, p, room, &nkeys, tr->name))
		return -1;
	size_t used = 0;
	const unsigned char *prev = NULL;
	size_t prevlen = 0;
	for (unsigned i = 0; i < nkeys; i++) {
		struct node d = {0};
		if (read_node(w, pgno, p, room, i, 0, &d, tr->name))
			return -1;
		if (d.flags || d.dsize)
			return problem(w, pgno, "(%s) duplicate %u of a sub-page has data",
			               tr->name, i);
		if (!in_shape(d.ksize, tr->t->val_min, tr->t->val_max, tr->t->val_unit))
			return problem(w, pgno, "(%s) a value of %zu bytes", tr->name, d.ksize);
		if (prev && cmp_memn(prev, prevlen, d.key, d.ksize) >= 0)
			return problem(w, pgno, "(%s) duplicates out of order", tr->name);
		prev = d.key;
		prevlen = d.ksize;
		used += (d.inpage + 1) & ~(size_t)1;
		if (call_item(w, tr, nd->key, nd->ksize, d.key, d.ksize))
			return -1;
	}
	if (used != room - u16at(p + 14))
		return problem(w, pgno, "(%s) a sub-page's nodes take %zu bytes, not %zu", tr->name,
		               used, room - u16at(p + 14));
	tr->entries += nkeys;
	return 0;
}

/* An item of a k3cache table (or of a sub-database of duplicates). */
/* NOLINTNEXTLINE(misc-no-recursion): bounded by MAX_DEPTH per tree, three trees deep */
static int table_item(struct walker *w, struct tree *tr, uint64_t pgno, const struct node *nd)
{
	const struct store_table *t = tr->t;
	if (tr->kind == TREE_DUPS) {
		if (nd->flags || nd->dsize)
			return problem(w, pgno, "(%s) a duplicate has data", tr->name);
		if (!in_shape(nd->ksize, t->val_min, t->val_max, t->val_unit))
			return problem(w, pgno, "(%s) a value of %zu bytes", tr->name, nd->ksize);
		tr->entries++;
		return call_item(w, tr, tr->dupkey, tr->dupklen, nd->key, nd->ksize) ? -1 : 0;
	}
	if (nd->ksize < t->key_min || nd->ksize > t->key_max)
		return problem(w, pgno, "(%s) a key of %zu bytes", tr->name, nd->ksize);
	if (nd->flags & F_DUPDATA) {
		if (!(t->flags & MDB_DUPSORT) || (nd->flags & F_BIGDATA))
			return problem(w, pgno, "(%s) a node has duplicates", tr->name);
		if (!(nd->flags & F_SUBDATA))
			return sub_page(w, tr, pgno, nd);
		if (nd->dsize != DB_LEN)
			return problem(w, pgno, "(%s) a sub-database of %llu bytes", tr->name,
			               (unsigned long long)nd->dsize);
		struct wdb db;
		get_db(nd->data, &db);
		struct tree dups = {.kind = TREE_DUPS,
		                    .name = t->name,
		                    .t = t,
		                    .dupkey = nd->key,
		                    .dupklen = nd->ksize};
		if (walk_tree(w, &dups, &db, pgno))
			return -1;
		tr->entries += dups.entries;
		return 0;
	}
	if (nd->flags & F_SUBDATA)
		return problem(w, pgno, "(%s) a node is marked as a database", tr->name);
	if (!in_shape(nd->dsize, t->val_min, t->val_max, t->val_unit))
		return problem(w, pgno, "(%s) a value of %llu bytes", tr->name,
		               (unsigned long long)nd->dsize);
	const unsigned char *v = nd->data;
	if ((nd->flags & F_BIGDATA) && !(v = overflow(w, tr, pgno, nd)))
		return -1;
	tr->entries++;
	return call_item(w, tr, nd->key, nd->ksize, v, (size_t)nd->dsize) ? -1 : 0;
}

/* NOLINTNEXTLINE(misc-no-recursion): bounded by MAX_DEPTH per tree, three trees deep */
static int leaf_item(struct walker *w, struct tree *tr, uint64_t pgno, const struct node *nd)
{
	switch (tr->kind) {
	case TREE_FREE: {
		const unsigned char *v = nd->data;
		if (nd->flags & ~F_BIGDATA)
			return problem(w, pgno, "(free list) a node has flags 0x%x", nd->flags);
		if ((nd->flags & F_BIGDATA) && !(v = overflow(w, tr, pgno, nd)))
			return -1;
		if (!(nd->flags & F_BIGDATA) && nd->dsize > w->psize)
			return problem(w, pgno, "(free list) a node runs past the page");
		return free_item(w, tr, pgno, nd, v);
	}
	case TREE_MAIN:
		return main_item(w, tr, pgno, nd);
	default:
		return table_item(w, tr, pgno, nd);
	}
}

static int key_order(const struct tree *tr, const struct node *a, const struct node *b)
{
	if (tr->kind == TREE_FREE) /* MDB_INTEGERKEY: native u64 */
		return a->ksize == 8 && b->ksize == 8 && u64at(a->key) < u64at(b->key);
	return cmp_memn(a->key, a->ksize, b->key, b->ksize) < 0;
}

/* NOLINTNEXTLINE(misc-no-recursion): bounded by MAX_DEPTH per tree, three trees deep */
static int walk_page(struct walker *w, struct tree *tr, uint64_t pgno, unsigned level)
{
	if (level > MAX_DEPTH)
		return problem(w, pgno, "(%s) the tree is deeper than %u", tr->name, MAX_DEPTH);
	const unsigned char *p = page_at(w, pgno, 1);
	if (!p)
		return problem(w, pgno, "(%s) is outside the file", tr->name);
	if (mark(w, pgno, 1, tr->name))
		return -1;
	unsigned flags = u16at(p + 10), nkeys = 0;
	if (u64at(p) != pgno)
		return problem(w, pgno, "(%s) says it is page %llu", tr->name,
		               (unsigned long long)u64at(p));
	if (flags != P_BRANCH && flags != P_LEAF)
		return problem(w, pgno, "(%s) has page flags 0x%x", tr->name, flags);
	int branch = flags == P_BRANCH;
	if (page_bounds(w, pgno, p, w->psize, &nkeys, tr->name))
		return -1;
	if (nkeys == 0 || (branch && nkeys < 2 && level > 1))
		return problem(w, pgno, "(%s) has %u nodes", tr->name, nkeys);
	if (branch)
		tr->branch++, w->st->branch++;
	else
		tr->leaf++, w->st->leaf++;
	if (!branch) {
		if (tr->leaf_level && tr->leaf_level != level)
			return problem(w, pgno, "(%s) leaves at depths %u and %u", tr->name,
			               tr->leaf_level, level);
		tr->leaf_level = level;
	}
	size_t used = 0;
	struct node prev = {0};
	for (unsigned i = 0; i < nkeys; i++) {
		struct node nd = {0};
		if (read_node(w, pgno, p, w->psize, i, branch, &nd, tr->name))
			return -1;
		used += (nd.inpage + 1) & ~(size_t)1;
		if ((i > 0 && !branch) || i > 1) {
			if (!key_order(tr, &prev, &nd))
				return problem(w, pgno, "(%s) keys out of order at node %u",
				               tr->name, i);
		}
		prev = nd;
	}
	if (used != w->psize - u16at(p + 14))
		return problem(w, pgno, "(%s) nodes take %zu bytes, the page says %u", tr->name,
		               used, w->psize - u16at(p + 14));
	/* children and items after the page itself is known sound; in salvage
	 * mode a damaged child or item is stepped around */
	for (unsigned i = 0; i < nkeys; i++) {
		struct node nd = {0};
		read_node(w, pgno, p, w->psize, i, branch, &nd, tr->name);
		int rc = branch ? walk_page(w, tr, nd.child, level + 1)
		                : leaf_item(w, tr, pgno, &nd);
		if (rc && (!w->item || w->stopped))
			return -1;
	}
	return 0;
}

/* NOLINTNEXTLINE(misc-no-recursion): bounded by MAX_DEPTH per tree, three trees deep */
static int walk_tree(struct walker *w, struct tree *tr, const struct wdb *db, uint64_t from)
{
	if (db->root == P_INVALID) {
		if (db->branch || db->leaf || db->overflow || db->entries || db->depth)
			return problem(w, from, "(%s) an empty database counts pages or items",
			               tr->name);
		return 0;
	}
	int rc = walk_page(w, tr, db->root, 1);
	if (rc || w->st->problems) /* counts are meaningless past a problem */
		return rc;
	if (tr->branch != db->branch || tr->leaf != db->leaf || tr->overflow != db->overflow ||
	    tr->entries != db->entries || tr->leaf_level != db->depth)
		return problem(
		        w, from,
		        "(%s) the tree holds %llu branch, %llu leaf and %llu overflow pages, "
		        "%llu items and depth %u; its record says %llu, %llu, %llu, %llu and %u",
		        tr->name, (unsigned long long)tr->branch, (unsigned long long)tr->leaf,
		        (unsigned long long)tr->overflow, (unsigned long long)tr->entries,
		        tr->leaf_level, (unsigned long long)db->branch,
		        (unsigned long long)db->leaf, (unsigned long long)db->overflow,
		        (unsigned long long)db->entries, db->depth);
	if (tr->kind == TREE_TABLE || tr->kind == TREE_DUPS)
		w->st->items += tr->kind == TREE_TABLE ? tr->entries : 0;
	return 0;
}

/* The meta page i, if it reads as one; its page size in *psize. */
struct meta {
	uint32_t psize;
	uint64_t last_pg, txnid, mapsize;
	struct wdb free, main;
};

static int read_meta(const unsigned char *map, size_t size, uint32_t psize, unsigned i,
                     struct meta *m, char *why, size_t whysz)
{
	memset(m, 0, sizeof(*m));
	size_t off = (size_t)i * psize;
	if (off + PAGEHDRSZ + 136 > size)
		return snprintf(why, whysz, "meta page %u is outside the file", i), -1;
	const unsigned char *p = map + off;
	const unsigned char *mm = p + PAGEHDRSZ;
	m->mapsize = u64at(mm + 16);
	get_db(mm + 24, &m->free);
	get_db(mm + 72, &m->main);
	m->psize = m->free.pad;
	m->last_pg = u64at(mm + 120);
	m->txnid = u64at(mm + 128);
	if (u64at(p) != i || u16at(p + 10) != P_META || u32at(mm) != MAGIC ||
	    u32at(mm + 4) != DATA_VERSION)
		return snprintf(why, whysz, "meta page %u is not an LMDB meta page", i), -1;
	if (m->psize != psize)
		return snprintf(why, whysz, "meta page %u has page size %u, not %u", i, m->psize,
		                psize),
		       -1;
	/* The file holds every page up to the last that was ever written; the
	 * slack allows a tail of free pages (mdb.c) without trusting a huge
	 * number. */
	uint64_t in_file = size / psize;
	if (m->last_pg < NUM_METAS - 1 || m->last_pg >= in_file + (UINT64_C(1) << 16) ||
	    (m->mapsize && m->last_pg >= m->mapsize / psize))
		return snprintf(why, whysz, "meta page %u names last page %llu of a %llu-page file",
		                i, (unsigned long long)m->last_pg, (unsigned long long)in_file),
		       -1;
	if ((m->free.root != P_INVALID && m->free.root > m->last_pg) ||
	    (m->main.root != P_INVALID && m->main.root > m->last_pg))
		return snprintf(why, whysz, "meta page %u names a root past its last page", i), -1;
	return 0;
}

/* The meta page of the snapshot to walk: txnid's, or the newer one (which
 * LMDB opens). Salvage falls back to the older when the newer is damaged. */
static int pick_meta(const unsigned char *map, size_t size, uint64_t txnid, int salvage,
                     struct meta *out, struct store_walk_stats *st, char *why, size_t whysz)
{
	if (size < PAGEHDRSZ + 136)
		return snprintf(why, whysz, "the file is too short for a meta page"), -1;
	uint32_t psize = u32at(map + PAGEHDRSZ + 24);
	if (psize < MIN_PAGESIZE || psize > MAX_PAGESIZE || (psize & (psize - 1)))
		return snprintf(why, whysz, "meta page 0 has page size %u", psize), -1;
	struct meta m[2];
	char e[2][160];
	int ok[2];
	for (unsigned i = 0; i < 2; i++)
		ok[i] = read_meta(map, size, psize, i, &m[i], e[i], sizeof(e[i])) == 0;
	unsigned pick = m[0].txnid < m[1].txnid;
	if (txnid) {
		pick = m[1].txnid == txnid;
		if (m[pick].txnid != txnid)
			return snprintf(why, whysz, "no snapshot of transaction %llu in the file",
			                (unsigned long long)txnid),
			       STORE_WALK_GONE;
	}
	if (!ok[pick]) {
		if (!salvage || !ok[!pick])
			return snprintf(why, whysz, "%s", e[pick]), -1;
		st->problems++;
		snprintf(why, whysz, "%s (the older snapshot is used)", e[pick]);
		pick = !pick;
	}
	*out = m[pick];
	return 0;
}

static int walk_file(const unsigned char *map, size_t size, int fd, uint64_t txnid,
                     store_walk_item_fn item, void *ctx, struct store_walk_stats *stats, char *why,
                     size_t whysz)
{
	memset(stats, 0, sizeof(*stats));
	if (why && whysz)
		why[0] = 0;
	struct meta m;
	char tmp[1];
	int rc = pick_meta(map, size, txnid, item != NULL, &m, stats, why ? why : tmp,
	                   why ? whysz : sizeof(tmp));
	if (rc)
		return rc == STORE_WALK_GONE ? rc : 1;
	struct walker w = {.map = map,
	                   .size = size,
	                   .psize = m.psize,
	                   .last_pg = m.last_pg,
	                   .item = item,
	                   .ctx = ctx,
	                   .st = stats,
	                   .why = why,
	                   .whysz = whysz,
	                   .fd = fd};
	stats->txnid = m.txnid;
	stats->pages = m.last_pg + 1;
	w.seen = calloc((size_t)(m.last_pg / 64 + 1), sizeof(uint64_t));
	if (!w.seen) {
		/* not the file's fault: it is not called damaged */
		snprintf(why ? why : tmp, why ? whysz : sizeof(tmp), "out of memory");
		return -1;
	}
	w.seen[0] = 3; /* the meta pages */
	struct tree fr = {.kind = TREE_FREE, .name = "free list"};
	struct tree mn = {.kind = TREE_MAIN, .name = "main"};
	if (item) {
		/* salvage: the trees first, so that a damaged free-list record
		 * naming a live page cannot hide the subtree under it */
		walk_tree(&w, &mn, &m.main, 1);
		walk_tree(&w, &fr, &m.free, 0);
	} else if (walk_tree(&w, &fr, &m.free, 0) == 0) {
		walk_tree(&w, &mn, &m.main, 1);
	}
	/* every page reached once: by a tree or by the free list */
	if (!stats->problems) {
		for (uint64_t i = 0; i <= m.last_pg; i++)
			if (!(w.seen[i / 64] & UINT64_C(1) << (i % 64))) {
				problem(&w, i, "is neither in use nor free");
				break;
			}
	}
	free(w.seen);
	if (w.stopped)
		return w.stopped;
	return item ? 0 : stats->problems != 0;
}

int store_walk_meta(int fd, char *why, size_t whysz)
{
	struct stat sb;
	if (fstat(fd, &sb) != 0 || sb.st_size == 0)
		return 0; /* a new file: LMDB writes its meta pages */
	size_t size = (size_t)sb.st_size;
	void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return snprintf(why, whysz, "cannot map the data file: %s", strerror(errno)), 1;
	struct meta m;
	struct store_walk_stats st = {0};
	int rc = pick_meta(map, size, 0, 0, &m, &st, why, whysz) ? 1 : 0;
	munmap(map, size);
	return rc;
}

int store_walk(const unsigned char *map, size_t size, uint64_t txnid, store_walk_item_fn item,
               void *ctx, struct store_walk_stats *stats, char *why, size_t whysz)
{
	return walk_file(map, size, -1, txnid, item, ctx, stats, why, whysz);
}

struct child_report {
	int rc;
	struct store_walk_stats stats;
	char why[512];
};

static void child_walk(int fd, uint64_t txnid, int out)
{
	struct child_report r = {.rc = -1};
	struct stat sb;
	void *map = MAP_FAILED;
	if (fstat(fd, &sb) != 0 || sb.st_size <= 0)
		snprintf(r.why, sizeof(r.why), "cannot read the data file");
	else if ((map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
		snprintf(r.why, sizeof(r.why), "cannot map the data file: %s", strerror(errno));
	if (map != MAP_FAILED) {
		madvise(map, (size_t)sb.st_size, MADV_RANDOM);
		r.rc = walk_file(map, (size_t)sb.st_size, fd, txnid, NULL, NULL, &r.stats, r.why,
		                 sizeof(r.why));
	}
	const char *p = (const char *)&r;
	for (size_t left = sizeof(r); left;) {
		ssize_t n = write(out, p, left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		p += n;
		left -= (size_t)n;
	}
	_exit(0);
}

int store_walk_child(int fd, uint64_t txnid, struct store_walk_stats *stats, char *why,
                     size_t whysz)
{
	memset(stats, 0, sizeof(*stats));
	int p[2];
	if (pipe(p) != 0)
		return snprintf(why, whysz, "cannot start the check: %s", strerror(errno)), -1;
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return snprintf(why, whysz, "cannot start the check: %s", strerror(errno)), -1;
	}
	if (pid == 0) {
		close(p[0]);
		child_walk(fd, txnid, p[1]);
	}
	close(p[1]);
	struct child_report r = {.rc = -1};
	size_t got = 0;
	while (got < sizeof(r)) {
		ssize_t n = read(p[0], (char *)&r + got, sizeof(r) - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(p[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (got != sizeof(r)) {
		if (!WIFSIGNALED(status))
			return snprintf(why, whysz, "the check ended without a report"), -1;
		int sig = WTERMSIG(status);
		snprintf(why, whysz, "the check stopped on signal %d", sig);
		/* a fault is the file's doing (or the walk's bug); a kill (the OOM
		 * killer, say) is not */
		return sig == SIGSEGV || sig == SIGBUS || sig == SIGABRT || sig == SIGFPE ||
		                       sig == SIGILL
		               ? -2
		               : -1;
	}
	r.why[sizeof(r.why) - 1] = 0;
	*stats = r.stats;
	snprintf(why, whysz, "%s", r.why);
	return r.rc;
}
