/* open: opening and closing a store, its durability and its sync (store.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "envshare.h"
#include "lru.h"
#include "pending.h"
#include "record.h"
#include "txn.h"
#include "walk.h"

#define DEFAULT_MAX_BYTES   (UINT64_C(1) << 30)
#define DEFAULT_STAGE_BYTES (UINT64_C(16) << 20)
#define TOUCH_CAP           65536u

int store_durability_parse(const char *str, enum store_durability *out)
{
	if (!strcmp(str, "safe"))
		*out = STORE_SAFE;
	else if (!strcmp(str, "strict"))
		*out = STORE_STRICT;
	else if (!strcmp(str, "fast"))
		*out = STORE_FAST;
	else
		return -1;
	return 0;
}

int store_check_parse(const char *str, enum store_check *out)
{
	if (!strcmp(str, "always"))
		*out = STORE_CHECK_ALWAYS;
	else if (!strcmp(str, "unclean"))
		*out = STORE_CHECK_UNCLEAN;
	else if (!strcmp(str, "never"))
		*out = STORE_CHECK_NEVER;
	else
		return -1;
	return 0;
}

const char *store_durability_name(enum store_durability d)
{
	switch (d) {
	case STORE_STRICT:
		return "strict";
	case STORE_FAST:
		return "fast";
	default:
		return "safe";
	}
}

/* Opens the named tables of store_tables (env.c) that are required, or with
 * optional the optional ones, which a read-only open of an older store may
 * lack: their has_ flags say which are there (blocks and blockrefs share
 * one, set when both are). */
static int open_dbs(struct store *s, MDB_txn *txn, int optional)
{
	unsigned create = s->opt.read_only ? 0 : MDB_CREATE;
	for (size_t i = 0; i < store_n_tables; i++) {
		const struct store_table *t = &store_tables[i];
		if ((t->has != STORE_REQUIRED) != optional)
			continue;
		int rc = mdb_dbi_open(txn, t->name, t->flags | create,
		                      (MDB_dbi *)(void *)((char *)s + t->dbi));
		if (optional && rc == MDB_NOTFOUND)
			*(int *)(void *)((char *)s + t->has) = 0;
		else if (rc)
			return rc;
	}
	return 0;
}

static enum status_code check_format(struct store *s, MDB_txn *txn, struct status *st)
{
	MDB_val k = {6, "format"}, v;
	int rc = mdb_get(txn, s->meta, &k, &v);
	if (rc == MDB_NOTFOUND) {
		if (s->opt.read_only)
			return status_set(st, STATUS_INVALID,
			                  "%s: not a k3cache store (no format record)", s->dir);
		unsigned char b[4];
		store_be32(b, STORE_FORMAT_VERSION);
		MDB_val nv = {4, b};
		rc = mdb_put(txn, s->meta, &k, &nv, 0);
		return rc ? store_mdb_error(st, rc, "writing the format record") : STATUS_OK;
	}
	if (rc)
		return store_mdb_error(st, rc, "reading the format record");
	if (v.mv_size != 4)
		return status_set(st, STATUS_CORRUPT, "%s: damaged format record", s->dir);
	uint32_t ver = store_get_be32(v.mv_data);
	if (ver != 1 && ver != STORE_FORMAT_VERSION)
		return status_set(st, STATUS_UNSUPPORTED,
		                  "%s: store format version %u; this build reads version %u "
		                  "(and upgrades version 1)",
		                  s->dir, ver, STORE_FORMAT_VERSION);
	if (ver == 1 && !s->opt.read_only) {
		/* Format 2 adds the shared blocks and a record tail; a format-1
		 * record reads as an entry that shares nothing, so the upgrade is
		 * this one write, inside the open's transaction: after a crash the
		 * store is version 1 or 2, whole. */
		unsigned char b[4];
		store_be32(b, STORE_FORMAT_VERSION);
		MDB_val nv = {4, b};
		if ((rc = mdb_put(txn, s->meta, &k, &nv, 0)) != 0)
			return store_mdb_error(st, rc, "upgrading the format record");
		s->upgraded = 1;
	}
	return STATUS_OK;
}

/* The store's row block (meta "rowblock"), fixed when the store is made. */
static enum status_code check_row_block(struct store *s, MDB_txn *txn, struct status *st)
{
	MDB_val k = {8, "rowblock"}, v;
	int rc = mdb_get(txn, s->meta, &k, &v);
	uint32_t want = s->opt.row_block ? s->opt.row_block : STORE_DEFAULT_ROW_BLOCK;
	if (rc == MDB_NOTFOUND) {
		s->row_block = want;
		if (s->opt.read_only)
			return STATUS_OK;
		unsigned char b[4];
		store_be32(b, want);
		MDB_val nv = {4, b};
		rc = mdb_put(txn, s->meta, &k, &nv, 0);
		return rc ? store_mdb_error(st, rc, "writing the row block") : STATUS_OK;
	}
	if (rc)
		return store_mdb_error(st, rc, "reading the row block");
	uint32_t b = v.mv_size == 4 ? store_get_be32(v.mv_data) : 0;
	if (!b || b % PREFIX_BLOCK || b > STORE_MAX_ROW_BLOCK)
		return status_set(st, STATUS_CORRUPT, "%s: damaged row block record", s->dir);
	s->row_block = b;
	return STATUS_OK;
}

/* ---- the unclean-stop marker: DIR/running.PID, holding the process's
 * start time (store_process_start), from an open to write to its close ---- */

#define MARKER "running."

/* This boot's id (/proc/sys/kernel/random/boot_id) with a newline, or 0. */
static int boot_id(char out[40])
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (!f)
		return 0;
	int ok = fgets(out, 40, f) != NULL;
	fclose(f);
	return ok;
}

/* Whether a marker of a process that is gone is in dir; with remove, removes
 * those markers. */
static int stale_markers(const char *dir, int remove)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int unclean = 0;
	const struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, MARKER, strlen(MARKER)) != 0)
			continue;
		char *end;
		long pid = strtol(e->d_name + strlen(MARKER), &end, 10);
		if (*end || pid <= 0)
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		char b[96] = "", boot[40];
		FILE *f = fopen(path, "r");
		if (f) {
			if (!fgets(b, sizeof(b), f))
				b[0] = 0;
			fclose(f);
		}
		char *rest;
		uint64_t start = strtoull(b, &rest, 10);
		/* the same pid and start tick can come back after a reboot: the
		 * boot id tells them apart */
		if (start && store_process_start(pid) == start && boot_id(boot) &&
		    !strcmp(rest + strspn(rest, " "), boot))
			continue; /* a live process has it open */
		unclean = 1;
		if (remove)
			unlink(path);
	}
	closedir(d);
	return unclean;
}

/* Leaves this process's marker, on disk before the first write: -1 when
 * its path cannot be kept (out of memory; the file is removed), as a clean
 * close could not remove it and the next open would take this stop for an
 * unclean one. A marker that cannot be written is best effort. */
static int put_marker(struct store *s)
{
	char path[4096];
	long pid = (long)getpid();
	snprintf(path, sizeof(path), "%s/" MARKER "%ld", s->dir, pid);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0)
		return 0;
	char b[96], boot[40];
	if (!boot_id(boot))
		snprintf(boot, sizeof(boot), "-\n");
	int n = snprintf(b, sizeof(b), "%" PRIu64 " %s", store_process_start(pid), boot);
	int ok = write(fd, b, (size_t)n) == n && fsync(fd) == 0;
	close(fd);
	int dfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	if (ok && (s->marker = strdup(path)))
		return 0;
	unlink(path);
	return ok ? -1 : 0;
}

static void drop_marker(struct store *s)
{
	if (s->marker)
		unlink(s->marker);
	free(s->marker);
	s->marker = NULL;
}

static enum status_code damaged(struct store *s, struct status *st, const char *why)
{
	/* the hint first: a long directory must not cut it off (the message's
	 * room is fixed) */
	return status_set(st, STATUS_CORRUPT,
	                  "damaged, not opened; copy what verifies with `k3cachectl --db %s "
	                  "salvage --to NEWDIR`: %s",
	                  s->dir, why);
}

/* The meta page, before LMDB maps the file at the size it states. */
static enum status_code check_meta(struct store *s, struct status *st)
{
	char path[4096], why[256];
	snprintf(path, sizeof(path), "%s/data.mdb", s->dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return STATUS_OK; /* none yet, or LMDB says why */
	int bad = store_walk_meta(fd, why, sizeof(why));
	close(fd);
	return bad ? damaged(s, st, why) : STATUS_OK;
}

/* Walks the structure of the snapshot LMDB is about to open (walk.h), in a
 * child process, pinned by a read transaction so that a writer in another
 * process cannot reuse its pages meanwhile. */
static enum status_code check_structure(struct store *s, struct status *st)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int fd, r = STORE_WALK_GONE;
	struct store_walk_stats ws;
	char why[512] = "";
	if (mdb_env_get_fd(s->env, &fd) != 0)
		return status_set(st, STATUS_INTERNAL, "%s: no data file to check", s->dir);
	/* a snapshot can be gone by the time the child reads the file only when
	 * another process commits twice meanwhile: take the newer one */
	for (int tries = 0; tries < 8 && r == STORE_WALK_GONE; tries++) {
		MDB_txn *txn;
		int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
		if (rc)
			return store_mdb_error(st, rc, "checking the store");
		r = store_walk_child(fd, mdb_txn_id(txn), &ws, why, sizeof(why));
		mdb_txn_abort(txn);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	s->check_ms = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000u +
	              (uint64_t)((t1.tv_nsec - t0.tv_nsec) / 1000000);
	if (r == STORE_WALK_GONE)
		return STATUS_OK; /* another process is writing it, fast: it opened it */
	s->checked = 1;
	s->checked_pages = ws.pages;
	if (r == 0)
		return STATUS_OK;
	if (r == -1) /* could not run: not the file's fault; a restart may do */
		return status_set(st, STATUS_INTERNAL, "%s: the structure check could not run: %s",
		                  s->dir, why);
	if (r < 0)
		return status_set(st, STATUS_CORRUPT,
		                  "not opened: its structure could not be checked; if it is "
		                  "damaged, copy what verifies with `k3cachectl --db %s salvage "
		                  "--to NEWDIR`: %s",
		                  s->dir, why);
	return damaged(s, st, why);
}

/* Opens the named databases, checks the format and reads the LRU clock. */
static enum status_code open_tables(struct store *s, MDB_txn *txn, struct status *st)
{
	int rc = open_dbs(s, txn, 0);
	if (rc)
		return rc == MDB_NOTFOUND
		               ? status_set(st, STATUS_INVALID, "%s: not a k3cache store", s->dir)
		               : store_mdb_error(st, rc, "opening the databases");
	enum status_code code = check_format(s, txn, st);
	if (code == STATUS_OK)
		code = check_row_block(s, txn, st);
	if (code != STATUS_OK)
		return code;
	/* tables a read-only open of an older store may lack */
	s->has_pending = s->has_blocks = s->has_held = 1;
	if ((rc = open_dbs(s, txn, 1)) != 0)
		return store_mdb_error(st, rc, "opening the databases");
	struct store_totals t;
	if ((rc = store_totals_get(s, txn, &t)) != 0)
		return store_mdb_error(st, rc, "reading the totals");
	atomic_store(&s->lru_clock, t.lru_clock);
	return STATUS_OK;
}

/* The open was refused for want of a permission: which file lacks which. A
 * reader (a direct one too) needs the directory and data.mdb readable and
 * lock.mdb writable (LMDB's reader table); the daemon needs all writable. */
static enum status_code denied(const char *dir, int read_only, struct status *st)
{
	char data[4200], lock[4200];
	snprintf(data, sizeof(data), "%s/data.mdb", dir);
	snprintf(lock, sizeof(lock), "%s/lock.mdb", dir);
	const char *what = NULL, *need = NULL;
	if (access(dir, R_OK | X_OK | (read_only ? 0 : W_OK)) != 0)
		what = dir, need = read_only ? "read and search" : "read, write and search";
	else if (access(data, R_OK | (read_only ? 0 : W_OK)) != 0)
		what = data, need = read_only ? "read" : "read and write";
	else if (access(lock, R_OK | W_OK) != 0)
		what = lock, need = "read and write (its reader table, even to read)";
	if (!what)
		return status_set(st, STATUS_DENIED, "%s: cannot open the store: permission denied",
		                  dir);
	return status_set(st, STATUS_DENIED,
	                  "%s: cannot open the store: permission denied: %s needs %s access", dir,
	                  what, need);
}

/* Reads the store's tables in a transaction of their own: a write one for a
 * read-write open (open_tables creates what is missing), a read-only one
 * otherwise, including the open of a store this process has open already,
 * whose environment s shares (the first open checked the file). */
static enum status_code read_tables(struct store *s, struct status *st)
{
	MDB_txn *txn;
	int rc = s->opt.read_only ? mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn)
	                          : store_txn_write(s, &txn);
	if (rc)
		return store_mdb_error(st, rc, "opening the store");
	enum status_code code = open_tables(s, txn, st);
	/* a read-only transaction ends by commit as well */
	if ((rc = store_txn_end(txn, code ? STORE_TXN_NOTHING : 0)) != 0 && !code)
		code = store_mdb_error(st, rc, "opening the store");
	return code;
}

enum status_code store_open(const char *dir, const struct store_options *opt, struct store **out,
                            struct status *st)
{
	*out = NULL;
	struct store *s = calloc(1, sizeof(*s));
	if (!s)
		return status_set(st, STATUS_INTERNAL, "out of memory");
	if (opt)
		s->opt = *opt;
	if (!s->opt.max_bytes)
		s->opt.max_bytes = DEFAULT_MAX_BYTES;
	if (!s->opt.stage_bytes)
		s->opt.stage_bytes = DEFAULT_STAGE_BYTES;
	if (!s->opt.map_size)
		s->opt.map_size = s->opt.max_bytes * 2 + (UINT64_C(64) << 20);
	if (!(s->dir = strdup(dir))) {
		free(s);
		return status_set(st, STATUS_INTERNAL, "out of memory");
	}
	pthread_mutex_init(&s->mu, NULL);
	enum status_code code = STATUS_OK;
	int rc;
	/* held throughout, released at the end or at fail: (envshare.h) */
	store_envshare_lock();

	if (!s->opt.read_only && mkdir(dir, 0750) != 0 && errno != EEXIST) {
		code = status_set(st, STATUS_INTERNAL, "%s: cannot create: %s", dir,
		                  strerror(errno));
		goto fail;
	}
	struct stat sb;
	if (stat(dir, &sb) != 0) {
		code = errno == EACCES ? denied(dir, s->opt.read_only, st)
		                       : status_set(st, STATUS_NOT_FOUND,
		                                    "%s: no such store directory", dir);
		goto fail;
	}
	if (!S_ISDIR(sb.st_mode)) {
		code = status_set(
		        st, STATUS_INVALID,
		        "%s: not a directory (a store is the directory that holds data.mdb "
		        "and lock.mdb)",
		        dir);
		goto fail;
	}
	/* a store this process has open already: its environment (envshare.h) */
	int shared_ro = 0;
	if ((s->env = store_envshare_take((uint64_t)sb.st_dev, (uint64_t)sb.st_ino, &shared_ro))) {
		if (!s->opt.read_only) {
			code = status_set(
			        st, STATUS_INVALID,
			        "%s: this process has the store open already%s; close it "
			        "first (LMDB allows one environment of a store per process)",
			        dir, shared_ro ? " (read-only: a direct reader?)" : "");
			goto fail;
		}
		if ((code = read_tables(s, st)) != STATUS_OK)
			goto fail;
		store_envshare_unlock();
		*out = s;
		return STATUS_OK;
	}
	if ((rc = mdb_env_create(&s->env)) != 0) {
		s->env = NULL;
		code = store_mdb_error(st, rc, "creating the LMDB environment");
		goto fail;
	}
	if (store_envshare_add((uint64_t)sb.st_dev, (uint64_t)sb.st_ino, s->env,
	                       s->opt.read_only) != 0) {
		mdb_env_close(s->env);
		s->env = NULL;
		code = status_set(st, STATUS_INTERNAL, "out of memory");
		goto fail;
	}
	mdb_env_set_maxdbs(s->env, 16);
	mdb_env_set_maxreaders(s->env, STORE_MAX_READERS);
	if (!s->opt.read_only)
		mdb_env_set_mapsize(s->env, (size_t)s->opt.map_size);
	unsigned flags = MDB_NOTLS;
	if (s->opt.read_only)
		flags |= MDB_RDONLY;
	else if (s->opt.durability == STORE_SAFE)
		flags |= MDB_NOMETASYNC;
	else if (s->opt.durability == STORE_FAST)
		flags |= MDB_NOSYNC;
	if (s->opt.check != STORE_CHECK_NEVER && (code = check_meta(s, st)) != STATUS_OK)
		goto fail;
	if ((rc = mdb_env_open(s->env, dir, flags, 0640)) != 0) {
		if (rc == ENOENT && s->opt.read_only)
			code = status_set(st, STATUS_NOT_FOUND,
			                  "%s: not a k3cache store (no data.mdb)", dir);
		else if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED)
			code = damaged(s, st, mdb_strerror(rc));
		else if (rc == EACCES || rc == EPERM)
			code = denied(dir, s->opt.read_only, st);
		else
			code = status_set(st, STATUS_INTERNAL, "%s: cannot open the store: %s", dir,
			                  mdb_strerror(rc));
		goto fail;
	}
	int dead = 0;
	mdb_reader_check(s->env, &dead);
	/* the markers of a stop that was unclean stay until a check passes */
	s->unclean_stop = stale_markers(dir, 0);
	if (s->opt.check == STORE_CHECK_ALWAYS ||
	    (s->opt.check == STORE_CHECK_UNCLEAN && s->unclean_stop)) {
		if ((code = check_structure(s, st)) != STATUS_OK)
			goto fail;
	}
	if (!s->opt.read_only) {
		if (s->checked) /* an unclean stop's markers go once a walk has passed */
			stale_markers(dir, 1);
		if (put_marker(s) != 0) {
			code = status_set(st, STATUS_INTERNAL, "out of memory");
			goto fail;
		}
	}

	if ((code = read_tables(s, st)) != STATUS_OK)
		goto fail;
	/* Unfinished staged publishes of dead processes: best effort, in a
	 * transaction of its own; what it cannot remove now (a full map, say)
	 * stays invisible and is tried again at the next open. */
	MDB_txn *txn;
	if (!s->opt.read_only && s->has_pending && store_txn_write(s, &txn) == 0) {
		uint32_t swept = 0;
		if (store_txn_end(txn, store_pending_sweep(s, txn, &swept)) == 0)
			s->swept_at_open = swept;
	}
	store_envshare_unlock();
	*out = s;
	return STATUS_OK;
fail:
	if (s->env && store_envshare_drop(s->env) == 1)
		mdb_env_close(s->env);
	drop_marker(s);
	store_envshare_unlock();
	pthread_mutex_destroy(&s->mu);
	free(s->dir);
	free(s);
	return code;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	store_envshare_lock();
	int last = store_envshare_drop(s->env);
	if (last >= 0) { /* not a parent's, inherited through fork(): that is left alone */
		if (!s->opt.read_only)
			store_flush(s, NULL);
		if (s->opt.durability == STORE_FAST && !s->opt.read_only)
			mdb_env_sync(s->env, 1);
		if (last == 1) /* read-only opens sharing it may outlive a writer's */
			mdb_env_close(s->env);
		drop_marker(s); /* a clean stop: every commit is in the file */
	} else {
		free(s->marker);
	}
	store_envshare_unlock();
	for (size_t i = 0; i < s->n_models_cached; i++)
		model_free(s->model_cache[i].spec);
	free(s->model_cache);
	free(s->touches);
	free(s->live);
	pthread_mutex_destroy(&s->mu);
	free(s->dir);
	free(s);
}

int store_remap(struct store *s)
{
	if (!s->opt.read_only)
		return 0; /* a writer's map is the size it set: the file never outgrows it */
	if (s->unmapped)
		return -2;
	MDB_envinfo info;
	MDB_stat ms;
	if (mdb_env_info(s->env, &info) != 0 || mdb_env_stat(s->env, &ms) != 0)
		return -1;
	if (((uint64_t)info.me_last_pgno + 1) * ms.ms_psize <= (uint64_t)info.me_mapsize)
		return 0;
	/* mdb_env_set_mapsize moves the map: nothing of this process may be
	 * reading through it */
	store_envshare_lock();
	int rc = -1;
	if (store_envshare_users(s->env) == 1 && atomic_load(&s->open_snapshots) == 0) {
		/* LMDB unmaps first: when the new map fails, there is none */
		rc = mdb_env_set_mapsize(s->env, 0) == 0 ? 1 : -2;
		s->unmapped = rc == -2;
	}
	store_envshare_unlock();
	return rc;
}

int store_reader_check(struct store *s)
{
	int dead = 0;
	mdb_reader_check(s->env, &dead);
	return dead;
}

int store_file_id(const struct store *s, uint64_t *dev, uint64_t *ino)
{
	int fd = -1;
	struct stat sb;
	if (mdb_env_get_fd(s->env, &fd) != 0 || fd < 0 || fstat(fd, &sb) != 0)
		return -1;
	*dev = (uint64_t)sb.st_dev;
	*ino = (uint64_t)sb.st_ino;
	return 0;
}

enum status_code store_sync(struct store *s, struct status *st)
{
	if (s->opt.read_only)
		return STATUS_OK;
	int rc = mdb_env_sync(s->env, 1);
	return rc ? store_mdb_error(st, rc, "sync") : STATUS_OK;
}
