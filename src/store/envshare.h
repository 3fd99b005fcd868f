/* envshare: one LMDB environment per store and process (under env.h).
 *
 * LMDB must not have a store open twice in one process. Its reader table
 * marks each read transaction's slot with the process's pid, and
 * mdb_env_close frees every slot of that pid, a second environment's too.
 * Closing any descriptor of lock.mdb also drops the process's fcntl locks
 * on it, by which other processes' mdb_reader_check tell a live reader
 * from a dead one. Either way a read transaction still open in the process
 * (a restore, a direct reader's view) loses its slot, and a writer reuses
 * the pages it reads: wrong bytes under a view that says it is valid.
 *
 * So opens share. The table maps a store directory (device, inode) to this
 * process's environment of it, with a count; store_open takes a count of
 * the environment there, and only the last store_close closes it. A
 * read-only open may share a read-write environment; a read-write open of
 * a store the process has open already is refused (store.h).
 *
 * After fork() the child inherits its parent's environments but may
 * neither use nor close them: LMDB does not support an environment across
 * fork, and closing one would free the parent's reader slots in the shared
 * lock file. So the table knows which process made each environment: the
 * child's opens make environments of their own, and its closes of the
 * parent's leave them alone.
 *
 * Calls are thread-safe: the table has a lock, which store_open and
 * store_close hold throughout (so that two threads opening one store make
 * one environment), and which a child after fork() finds unlocked. The
 * table itself is small: a node per store open in the process. */
#ifndef K3_STORE_ENVSHARE_H
#define K3_STORE_ENVSHARE_H

#include <lmdb.h>
#include <stdint.h>

void store_envshare_lock(void);
void store_envshare_unlock(void);

/* Under the lock: this process's environment of the store (dev, ino), its
 * count raised, and *read_only whether it was opened read-only; NULL when
 * this process has none. */
MDB_env *store_envshare_take(uint64_t dev, uint64_t ino, int *read_only);

/* Under the lock: env, just opened by this process, is the store's (dev,
 * ino), with a count of 1. -1 when out of memory (nothing added). */
int store_envshare_add(uint64_t dev, uint64_t ino, MDB_env *env, int read_only);

/* Under the lock: how many opens of this process use env (0: none, or not
 * this process's). */
unsigned store_envshare_users(MDB_env *env);

/* Under the lock: a count of env dropped. 1: it was the last, the caller
 * closes env (it is off the table); 0: others still use it; -1: env is
 * not this process's (inherited through fork(), or never added): the
 * caller must neither use nor close it. */
int store_envshare_drop(MDB_env *env);

#endif
