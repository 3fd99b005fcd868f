/* Helpers for tests against a real Redis Cluster: masters started on free
 * ports of 127.0.0.1 in a temporary directory (each dies with the test),
 * joined with redis-cli --cluster create, and waited for until every node
 * says cluster_state:ok and knows all the others. */
#ifndef K3_CLUSTERUTIL_H
#define K3_CLUSTERUTIL_H

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#define CLUSTERUTIL_MAX 6

struct clusterutil {
	char dir[256];
	int n;
	int port[CLUSTERUTIL_MAX];
	pid_t pid[CLUSTERUTIL_MAX];
	char id[CLUSTERUTIL_MAX][41];
};

static inline void clusterutil_sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* 1 when prog is an executable on PATH. */
static inline double clusterutil_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int clusterutil_on_path(const char *prog)
{
	const char *path = getenv("PATH");
	char dir[1024], file[1200];
	while (path && *path) {
		size_t len = strcspn(path, ":");
		snprintf(dir, sizeof(dir), "%.*s", (int)len, path);
		snprintf(file, sizeof(file), "%s/%s", dir[0] ? dir : ".", prog);
		if (access(file, X_OK) == 0)
			return 1;
		path += len + (path[len] == ':');
	}
	return 0;
}

static inline int clusterutil_port_free(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* A port whose cluster bus port (+10000) is free too. */
static inline int clusterutil_pick_port(const struct clusterutil *c)
{
	for (int tries = 0; tries < 1000; tries++) {
		int p = 20000 + (int)(((unsigned)rand()) % 20000u);
		int taken = 0;
		for (int i = 0; i < c->n; i++)
			taken |= c->port[i] == p;
		if (!taken && clusterutil_port_free(p) && clusterutil_port_free(p + 10000))
			return p;
	}
	return -1;
}

/* A direct connection to node i (no cluster routing), or NULL. */
static inline redisContext *clusterutil_connect(const struct clusterutil *c, int i)
{
	struct timeval tv = {2, 0};
	redisContext *ctx = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
	if (ctx && (ctx->err || redisSetTimeout(ctx, tv) != REDIS_OK)) {
		redisFree(ctx);
		return NULL;
	}
	return ctx;
}

/* A command on node i whose reply is a status or string: copies it into out
 * (when out) and returns 0, or -1. */
static inline int clusterutil_cmd(const struct clusterutil *c, int i, char *out, size_t outsz,
                                  const char *fmt, ...)
{
	redisContext *ctx = clusterutil_connect(c, i);
	if (!ctx)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	redisReply *rep = redisvCommand(ctx, fmt, ap);
	va_end(ap);
	int rc = -1;
	if (rep && (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_STRING)) {
		if (out)
			snprintf(out, outsz, "%.*s", (int)rep->len, rep->str);
		rc = 0;
	} else if (rep && rep->type == REDIS_REPLY_INTEGER) {
		if (out)
			snprintf(out, outsz, "%lld", rep->integer);
		rc = 0;
	} else if (rep && rep->type == REDIS_REPLY_ERROR) {
		fprintf(stderr, "clusterutil: node %d: %s\n", c->port[i], rep->str);
	}
	if (rep)
		freeReplyObject(rep);
	redisFree(ctx);
	return rc;
}

static inline void clusterutil_stop(struct clusterutil *c)
{
	for (int i = 0; i < c->n; i++) {
		if (c->pid[i] > 0) {
			kill(c->pid[i], SIGKILL);
			waitpid(c->pid[i], NULL, 0);
			c->pid[i] = 0;
		}
	}
	if (c->dir[0] && !getenv("K3_KEEP_TEST_DIRS")) {
		char cmd[600];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "clusterutil: could not remove %s\n", c->dir);
	}
	c->dir[0] = '\0';
}

/* Kills node i with sig (SIGKILL: and reaps it). */
static inline void clusterutil_signal(struct clusterutil *c, int i, int sig)
{
	if (c->pid[i] <= 0)
		return;
	kill(c->pid[i], sig);
	if (sig == SIGKILL) {
		waitpid(c->pid[i], NULL, 0);
		c->pid[i] = 0;
	}
}

static inline int clusterutil_start_node(struct clusterutil *c, int i)
{
	char port[16], conf[400], log[400];
	snprintf(port, sizeof(port), "%d", c->port[i]);
	snprintf(conf, sizeof(conf), "%s/nodes-%d.conf", c->dir, c->port[i]);
	snprintf(log, sizeof(log), "%s/redis-%d.log", c->dir, c->port[i]);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the test */
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
		       "--cluster-enabled", "yes", "--cluster-config-file", conf,
		       "--cluster-node-timeout", "2000", "--dir", c->dir, "--save", "",
		       "--appendonly", "no", "--daemonize", "no", (char *)NULL);
		_exit(127);
	}
	c->pid[i] = pid;
	for (int t = 0; t < 500; t++) {
		char pong[16];
		if (clusterutil_cmd(c, i, pong, sizeof(pong), "PING") == 0)
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			c->pid[i] = 0;
			return -1;
		}
		clusterutil_sleep_ms(10);
	}
	return -1;
}

/* 1 when node i says the cluster is ok with all n nodes and slots. */
static inline int clusterutil_node_ok(const struct clusterutil *c, int i)
{
	char info[4096];
	if (clusterutil_cmd(c, i, info, sizeof(info), "CLUSTER INFO") != 0)
		return 0;
	char known[64];
	snprintf(known, sizeof(known), "cluster_known_nodes:%d\r", c->n);
	return strstr(info, "cluster_state:ok\r") && strstr(info, "cluster_slots_ok:16384\r") &&
	       strstr(info, known);
}

/* Starts n masters and makes them a cluster. 0, or -1 (everything started
 * is stopped; the reason on stderr). */
static inline int clusterutil_start(struct clusterutil *c, int n)
{
	memset(c, 0, sizeof(*c));
	srand((unsigned)getpid() ^ (unsigned)time(NULL));
	snprintf(c->dir, sizeof(c->dir), "/tmp/k3-cluster-XXXXXX");
	if (!mkdtemp(c->dir)) {
		c->dir[0] = '\0';
		return -1;
	}
	for (int i = 0; i < n; i++) {
		c->port[i] = clusterutil_pick_port(c);
		c->n = i + 1;
		if (c->port[i] < 0 || clusterutil_start_node(c, i) != 0) {
			fprintf(stderr, "clusterutil: redis-server on port %d did not start\n",
			        c->port[i]);
			clusterutil_stop(c);
			return -1;
		}
	}
	char cmd[1024];
	size_t len = (size_t)snprintf(cmd, sizeof(cmd), "timeout 60 redis-cli --cluster create");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " 127.0.0.1:%d", c->port[i]);
	snprintf(cmd + len, sizeof(cmd) - len,
	         " --cluster-replicas 0 --cluster-yes > '%s/create.log' 2>&1", c->dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "clusterutil: redis-cli --cluster create failed (%s/create.log)\n",
		        c->dir);
		clusterutil_stop(c);
		return -1;
	}
	for (int t = 0; t < 300; t++) {
		int ok = 1;
		for (int i = 0; i < n && ok; i++)
			ok = clusterutil_node_ok(c, i);
		if (ok) {
			for (int i = 0; i < n; i++)
				if (clusterutil_cmd(c, i, c->id[i], sizeof(c->id[i]),
				                    "CLUSTER MYID") != 0)
					ok = 0;
			if (ok)
				return 0;
		}
		clusterutil_sleep_ms(100);
	}
	fprintf(stderr, "clusterutil: the cluster never reached cluster_state:ok\n");
	clusterutil_stop(c);
	return -1;
}

/* The node that serves port, or -1. */
static inline int clusterutil_index(const struct clusterutil *c, int port)
{
	for (int i = 0; i < c->n; i++)
		if (c->port[i] == port)
			return i;
	return -1;
}

#endif
