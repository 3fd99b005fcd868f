/* envshare: one LMDB environment per store and process (envshare.h). */
#include "store/envshare.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

struct shared_env {
	uint64_t dev, ino;
	MDB_env *env;
	pid_t pid; /* the process that opened it */
	int read_only;
	unsigned refs;
	struct shared_env *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct shared_env *table;

/* A fork while a thread of the parent holds the lock (an open runs its
 * structure check in a child, for one): the child's copy of the lock is
 * held by a thread the child does not have, so the child starts with it
 * unlocked. Taking it across the fork instead would deadlock that check.
 * The table itself is consistent at any instant (a node is linked or
 * unlinked by one store), and the child only reads it for its own pid. */
static void in_child(void)
{
	pthread_mutex_init(&mu, NULL);
}

static void register_fork(void)
{
	pthread_atfork(NULL, NULL, in_child);
}

void store_envshare_lock(void)
{
	pthread_once(&once, register_fork);
	pthread_mutex_lock(&mu);
}

void store_envshare_unlock(void)
{
	pthread_mutex_unlock(&mu);
}

MDB_env *store_envshare_take(uint64_t dev, uint64_t ino, int *read_only)
{
	pid_t me = getpid();
	for (struct shared_env *e = table; e; e = e->next)
		if (e->dev == dev && e->ino == ino && e->pid == me) {
			e->refs++;
			*read_only = e->read_only;
			return e->env;
		}
	return NULL;
}

int store_envshare_add(uint64_t dev, uint64_t ino, MDB_env *env, int read_only)
{
	struct shared_env *e = malloc(sizeof(*e));
	if (!e)
		return -1;
	*e = (struct shared_env){dev, ino, env, getpid(), read_only, 1, table};
	table = e;
	return 0;
}

unsigned store_envshare_users(MDB_env *env)
{
	pid_t me = getpid();
	for (const struct shared_env *e = table; e; e = e->next)
		if (e->env == env)
			return e->pid == me ? e->refs : 0;
	return 0;
}

int store_envshare_drop(MDB_env *env)
{
	for (struct shared_env **p = &table; *p; p = &(*p)->next) {
		struct shared_env *e = *p;
		if (e->env != env)
			continue;
		if (e->pid != getpid())
			return -1; /* the parent's: left as it is */
		if (--e->refs > 0)
			return 0;
		*p = e->next;
		free(e);
		return 1;
	}
	return -1;
}
