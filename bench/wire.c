/* bench/wire: the real daemon over its Unix socket, against baselines
 * measured in the same run.
 *
 *  1. Baseline: a raw Unix-socket transfer of the snapshot's bytes between two
 *     processes (1 MiB writes from a pre-built buffer into a pre-touched one).
 *  2. Publish of a K3-size snapshot (69 KDA layers of 6.5625 MiB + 24 MLA
 *     layers of 4,096 tokens x 2,304 bytes, ~669 MiB) through k3cache_publish,
 *     next to store_publish of the same bytes on a store opened here (safe);
 *     then k3cache_publish_arrays (the layers as their float arrays, views of
 *     the same bytes) next to k3cache_publish, rounds alternating.
 *  3. Restore of it through k3cache_restore_into into pre-touched caller
 *     buffers, validation included, and through k3cache_restore_arrays into
 *     the layers' arrays; its rounds alternate with rounds of the raw socket
 *     with 4 MiB buffers (best of 5 each).
 *  4. Lookup latency p50/p99 of a 131,072-token prompt, idle and while two
 *     other processes publish K3-size snapshots in a loop (at nice 0, at nice
 *     10, and at nice 0 again with the daemon restarted with --yield-rate 0).
 *  5. The daemon's anonymous RSS while it ingests a 1 GiB snapshot.
 *
 * usage: bench_wire [DIR] [--quick] [--direct]   (DIR defaults to ./bench-wire.tmp;
 * --direct: one publish, then only the direct reads against memcpy) */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchk3.h"
#include "benchutil.h"
#include "frame.h"
#include "k3cache/direct.h"
#include "k3cache/k3cache.h"
#include "k3cache_raw.h"
#include "k3shape.h"
#include "model.h"
#include "store.h"

#ifndef K3_DAEMON_PATH
#error "K3_DAEMON_PATH must name the k3cached binary"
#endif

#define SNAP_P    4096u
#define CAPACITY  (UINT64_C(8) << 30)
#define INFLIGHT  (UINT64_C(1) << 30)
#define RSS_SLACK (UINT64_C(64) << 20)
#define CHUNK     (1u << 20)
#define MIB       1048576.0

static int quick;
static int direct_only; /* --direct: one publish, then the direct reads only */
static pid_t main_pid, daemon_pid;
static pid_t kids[2];
static char bench_dir[512], db_path[600], sock_path[600], log_path[600];

/* ---- failing loudly -------------------------------------------------------- */

static void show_log(void)
{
	FILE *f = fopen(log_path, "r");
	if (!f)
		return;
	char buf[4097];
	if (fseek(f, 0, SEEK_END) == 0) {
		long n = ftell(f);
		fseek(f, n > 4096 ? n - 4096 : 0, SEEK_SET);
	}
	size_t r = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[r] = '\0';
	if (r)
		fprintf(stderr, "--- last lines of the daemon's log (%s):\n%s", log_path, buf);
}

__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "bench_wire: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	if (getpid() != main_pid)
		_exit(1);
	for (int i = 0; i < 2; i++)
		if (kids[i] > 0) {
			kill(kids[i], SIGKILL);
			waitpid(kids[i], NULL, 0);
		}
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGKILL);
		waitpid(daemon_pid, NULL, 0);
	}
	show_log();
	benchutil_rm_rf(bench_dir);
	exit(1);
}

__attribute__((noreturn)) static void die_k3(const char *what, const struct k3cache_error *e)
{
	fail("%s: %s: %s%s", what, k3cache_code_name(e->code), e->message,
	     e->unreachable ? " (the daemon could not be reached)" : "");
}

__attribute__((noreturn)) static void die_st(const char *what, const struct status *st)
{
	fail("%s: %s: %s", what, status_code_name(st->code), st->message);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		fail("out of memory for %zu bytes", n);
	return p;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* ---- models and snapshots (as bench/store.c) ------------------------------- */

static struct k3cache_model *k3_model(const char *name, uint32_t n_kda, uint32_t n_mla)
{
	char err[MODEL_ERROR_MAX];
	struct k3cache_model *m = k3shape_model(name, n_kda, n_mla, err);
	if (!m)
		fail("model %s: %s", name, err);
	return m;
}

struct snap {
	uint32_t n;
	unsigned char **bufs;
	struct store_blob *blobs; /* for store_publish */
	struct k3cache_buf *k3;   /* for k3cache_publish: the same bytes */
	size_t *sizes;
	uint64_t bytes;
};

static struct snap make_snap(const struct k3cache_model *m, uint32_t p, uint32_t seed)
{
	struct snap s = {m->n_layers,
	                 calloc(m->n_layers, sizeof(void *)),
	                 calloc(m->n_layers, sizeof(struct store_blob)),
	                 calloc(m->n_layers, sizeof(struct k3cache_buf)),
	                 calloc(m->n_layers, sizeof(size_t)),
	                 0};
	if (!s.bufs || !s.blobs || !s.k3 || !s.sizes)
		fail("out of memory");
	for (uint32_t i = 0; i < m->n_layers; i++) {
		size_t len;
		unsigned char *b = k3shape_blob(&m->layers[i], i, p, seed, &len);
		if (!b)
			fail("out of memory");
		s.bufs[i] = b;
		s.blobs[i].data = b;
		s.blobs[i].size = len;
		s.k3[i].data = b;
		s.k3[i].len = len;
		s.sizes[i] = len;
		s.bytes += len;
	}
	return s;
}

static void free_snap(struct snap *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		free(s->bufs[i]);
	free(s->bufs);
	free(s->blobs);
	free(s->k3);
	free(s->sizes);
	memset(s, 0, sizeof(*s));
}

/* The layers of blobs laid out at base (sizes[i] bytes each) as their two
 * float arrays, views into the same bytes (k3cache_publish_arrays and
 * k3cache_restore_arrays; no copy is made here either). */
static void arrays_at(const struct k3cache_model *m, uint32_t p, unsigned char *const *base,
                      struct k3cache_arrays *in, struct k3cache_arrays_out *out)
{
	for (uint32_t i = 0; i < m->n_layers; i++) {
		const struct model_layer *l = &m->layers[i];
		int kda = l->mixer == MODEL_MIXER_KDA;
		size_t head = kda ? 5 : 9;
		uint64_t n[2];
		model_layer_floats(l, p, n);
		size_t n0 = (size_t)n[0], n1 = (size_t)n[1];
		float *a = (float *)(void *)(base[i] + head);
		float *b = (float *)(void *)(base[i] + head + n0 * 4 + 4);
		if (in)
			in[i] = (struct k3cache_arrays){a, n0, b, n1};
		if (out)
			out[i] = (struct k3cache_arrays_out){a, n0, b, n1};
	}
}

/* Distinct token sequences per seed (the multiplier is odd: a bijection). */
static void fill_tokens(uint32_t *t, uint32_t p, uint32_t seed)
{
	for (uint32_t i = 0; i < p; i++)
		t[i] = seed * 2654435761u + i * 31u + 7u;
}

/* A buffer of our own (benchutil_private_buffer), or the run fails. */
static unsigned char *private_buffer(size_t len)
{
	unsigned char *p = benchutil_private_buffer(len);
	if (!p)
		fail("mmap %zu bytes (MADV_DONTFORK): %s", len, strerror(errno));
	return p;
}

static double gbps(uint64_t bytes, double secs)
{
	return (double)bytes / secs / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Reads a /proc file whole (one read may stop short). */
static int read_proc(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == cap - 1)
			break;
	}
	close(fd);
	buf[len] = '\0';
	return len ? 0 : -1;
}

/* CPU seconds (user + system, all threads) of a process, from /proc. */
static double proc_cpu(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (read_proc(path, buf, sizeof(buf)) != 0)
		return 0;
	/* after "pid (comm) ": state, then utime and stime are fields 14 and 15 */
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p += 2;
	for (int field = 3; field < 14; field++) {
		p = strchr(p, ' ');
		if (!p)
			return 0;
		p++;
	}
	char *end;
	unsigned long ut = strtoul(p, &end, 10);
	unsigned long st = strtoul(end, NULL, 10);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* ---- the daemon ------------------------------------------------------------ */

/* yield_rate: the daemon's --yield-rate (NULL: its default) */
static struct k3cache *daemon_start(const char *yield_rate)
{
	const char *args[] = {K3_DAEMON_PATH, "--db",
	                      db_path,        "--socket",
	                      sock_path,      "--max-bytes",
	                      "8GiB",         "--max-payload",
	                      "2GiB",         "--max-inflight",
	                      "1GiB",         "--durability",
	                      "safe",         "--log-level",
	                      "warn",         NULL,
	                      NULL,           NULL};
	if (yield_rate) {
		args[15] = "--yield-rate";
		args[16] = yield_rate;
	}
	fflush(stdout);
	fflush(stderr);
	daemon_pid = fork();
	if (daemon_pid < 0)
		fail("fork: %s", strerror(errno));
	if (daemon_pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execv(args[0], (char *const *)args);
		fprintf(stderr, "exec %s: %s\n", args[0], strerror(errno));
		_exit(127);
	}
	struct k3cache_error e = {0};
	for (int i = 0; i < 1000; i++) {
		int status;
		if (waitpid(daemon_pid, &status, WNOHANG) == daemon_pid) {
			daemon_pid = 0;
			fail("k3cached exited at start-up (status %d)",
			     WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		}
		struct k3cache *c;
		if (k3cache_connect(sock_path, &c, &e) == 0) {
			char server[128];
			if (k3cache_hello(c, server, sizeof(server), &e) == 0) {
				k3cache_set_timeout(c, 300000);
				printf("daemon: %s, pid %d, %s\n", server, (int)daemon_pid,
				       sock_path);
				return c;
			}
			k3cache_close(c);
		}
		sleep_ms(10);
	}
	fail("k3cached did not answer hello within 10 s: %s", e.message);
}

static int daemon_stop(void)
{
	kill(daemon_pid, SIGTERM);
	int status = 0;
	for (int i = 0; i < 6000; i++) { /* 60 s */
		pid_t r = waitpid(daemon_pid, &status, WNOHANG);
		if (r == daemon_pid) {
			daemon_pid = 0;
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		}
		sleep_ms(10);
	}
	fail("k3cached did not exit within 60 s of SIGTERM");
}

static void put_model(struct k3cache *c, const struct k3cache_model *m)
{
	uint8_t fp[MODEL_FINGERPRINT_LEN];
	struct k3cache_error e;
	if (k3cache_put_model(c, m, fp, &e) != 0)
		die_k3("put_model", &e);
	if (memcmp(fp, m->fingerprint, MODEL_FINGERPRINT_LEN) != 0)
		fail("put_model %s: the daemon's fingerprint differs from ours", m->name);
}

/* Evicts every entry of a model; returns how many went. */
static size_t evict_model(struct k3cache *c, const struct k3cache_model *m)
{
	char why[512];
	long n = benchk3_evict_model(c, m, why, sizeof(why));
	if (n < 0)
		fail("evict: %s", why);
	return (size_t)n;
}

/* ---- 1: the raw socket baseline ------------------------------------------- */

static void write_all(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("socket write: %s", n < 0 ? strerror(errno) : "0 bytes");
		p += n;
		len -= (size_t)n;
	}
}

static void read_all(int fd, void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("socket read: %s", n < 0 ? strerror(errno) : "EOF");
		p += n;
		len -= (size_t)n;
	}
}

/* A raw Unix-socket transfer: another process sends s->bytes in 1 MiB writes
 * from one pre-built buffer; raw_round() reads them into dst (memset first)
 * and returns the seconds it took. bufsize: SO_SNDBUF/SO_RCVBUF asked for (0:
 * the system default). */
struct raw_sender {
	pid_t pid;
	int fd;
};

static struct raw_sender raw_open(const struct snap *s, int bufsize)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		fail("socketpair: %s", strerror(errno));
	if (bufsize) {
		for (int i = 0; i < 2; i++) {
			setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
			setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
		}
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		unsigned char *src = malloc(s->bytes ? s->bytes : 1);
		if (!src)
			_exit(2);
		size_t off = 0;
		for (uint32_t i = 0; i < s->n; i++) {
			memcpy(src + off, s->bufs[i], s->sizes[i]);
			off += s->sizes[i];
		}
		char cmd = 'r';
		write_all(sv[1], &cmd, 1);
		while (read(sv[1], &cmd, 1) == 1 && cmd == 'g')
			for (off = 0; off < s->bytes; off += CHUNK)
				write_all(sv[1], src + off,
				          s->bytes - off < CHUNK ? s->bytes - off : CHUNK);
		_exit(0);
	}
	close(sv[1]);
	kids[0] = pid;
	char cmd;
	read_all(sv[0], &cmd, 1); /* the sender's buffer is built */
	return (struct raw_sender){pid, sv[0]};
}

static double raw_round(struct raw_sender *r, const struct snap *s, unsigned char *dst)
{
	memset(dst, 0, s->bytes);
	char cmd = 'g';
	double t0 = benchutil_now();
	write_all(r->fd, &cmd, 1);
	read_all(r->fd, dst, s->bytes);
	double t = benchutil_now() - t0;
	size_t off = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		if (memcmp(dst + off, s->bufs[i], s->sizes[i]) != 0)
			fail("raw socket: the received bytes differ from the sent ones");
		off += s->sizes[i];
	}
	return t;
}

static void raw_close(struct raw_sender *r)
{
	close(r->fd); /* the sender sees EOF and exits */
	int status;
	waitpid(r->pid, &status, 0);
	kids[0] = 0;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail("raw socket sender failed (status %d)", status);
}

/* ---- 4: load from other processes ----------------------------------------- */

struct load {
	atomic_int stop;
	atomic_int running;   /* children inside their publish loop */
	atomic_int published; /* publishes completed */
	atomic_int failed;
	char message[STATUS_MESSAGE_MAX + 64];
};

static void load_child(struct load *ld, int idx, const struct snap *s, const uint8_t *fp, int max,
                       int nice_to)
{
	if (nice_to && setpriority(PRIO_PROCESS, 0, nice_to) != 0)
		_exit(3);
	struct k3cache *c;
	struct k3cache_error e;
	uint32_t *tok = malloc(SNAP_P * sizeof(uint32_t));
	if (!tok)
		_exit(2);
	if (k3cache_connect(sock_path, &c, &e) != 0) {
		snprintf(ld->message, sizeof(ld->message), "child %d: connect: %s", idx, e.message);
		atomic_store(&ld->failed, 1);
		_exit(1);
	}
	k3cache_set_timeout(c, 300000);
	atomic_fetch_add(&ld->running, 1);
	for (int n = 0; n < max && !atomic_load(&ld->stop); n++) {
		fill_tokens(tok, SNAP_P, 5000u + (uint32_t)idx * 1000u + (uint32_t)n);
		struct k3cache_publish_result res;
		if (k3cache_publish(c, fp, NULL, 0, tok, SNAP_P, s->k3, s->n, &res, &e) != 0) {
			snprintf(ld->message, sizeof(ld->message), "child %d: publish: %s: %s", idx,
			         k3cache_code_name(e.code), e.message);
			atomic_store(&ld->failed, 1);
			atomic_fetch_sub(&ld->running, 1);
			_exit(1);
		}
		atomic_fetch_add(&ld->published, 1);
	}
	atomic_fetch_sub(&ld->running, 1);
	k3cache_close(c);
	_exit(0);
}

/* Q lookups of the prompt; every answer must be the hit at want. Counts in
 * *loaded the lookups made while two publishers were running. */
static void run_lookups(struct k3cache *c, const uint8_t *fp, uint32_t *prompt, uint32_t n,
                        uint32_t want, int q, double *lat, struct load *ld, int *loaded)
{
	*loaded = 0;
	for (int i = 0; i < q; i++) {
		if (i % 2)
			prompt[n - 1 - (uint32_t)i % 1000] ^= 1; /* vary the tail */
		int both = ld && atomic_load(&ld->running) == 2;
		struct k3cache_lookup_result res;
		struct k3cache_error e;
		double a = benchutil_now();
		if (k3cache_lookup(c, fp, NULL, 0, prompt, n, 0, &res, &e) != 0)
			die_k3("lookup", &e);
		lat[i] = benchutil_now() - a;
		if (res.prefix_len != want)
			fail("lookup: hit at P=%u, the deepest stored prefix is %u", res.prefix_len,
			     want);
		if (both && atomic_load(&ld->running) == 2)
			(*loaded)++;
	}
	qsort(lat, (size_t)q, sizeof(double), cmp_double);
}

/* ---- 5: the daemon's RSS --------------------------------------------------- */

struct sampler {
	pid_t pid;
	atomic_int stop;
	long peak_anon_kb, peak_file_kb;
	int samples;
};

static long status_kb(const char *buf, const char *key)
{
	const char *p = strstr(buf, key);
	return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static int read_rss(pid_t pid, long *anon, long *file)
{
	char path[64], buf[8192];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (read_proc(path, buf, sizeof(buf)) != 0)
		return -1;
	long a = status_kb(buf, "RssAnon:"), f = status_kb(buf, "RssFile:");
	if (a < 0 || f < 0)
		return -1;
	*anon = a;
	*file = f;
	return 0;
}

static void *sampler_main(void *arg)
{
	struct sampler *sp = arg;
	while (!atomic_load(&sp->stop)) {
		long anon, file;
		if (read_rss(sp->pid, &anon, &file) == 0) {
			sp->samples++;
			sp->peak_anon_kb = anon > sp->peak_anon_kb ? anon : sp->peak_anon_kb;
			sp->peak_file_kb = file > sp->peak_file_kb ? file : sp->peak_file_kb;
		}
		sleep_ms(10);
	}
	return NULL;
}

static void sampler_start(struct sampler *sp, pthread_t *th)
{
	if (pthread_create(th, NULL, sampler_main, sp) != 0)
		fail("pthread_create failed");
	sleep_ms(30);
}

static void sampler_stop(struct sampler *sp, pthread_t th)
{
	sleep_ms(30);
	atomic_store(&sp->stop, 1);
	pthread_join(th, NULL);
	if (sp->samples == 0)
		fail("could not read /proc/%d/status", (int)sp->pid);
}

/* One of the burst's publishers: its own connection, its own snapshot. */
struct burst {
	const struct k3cache_model *m;
	const struct snap *s;
	const uint32_t *tokens;
	uint32_t p;
	double secs;
	int rc;
	char message[256];
};

static void *burst_main(void *arg)
{
	struct burst *b = arg;
	struct k3cache *c;
	struct k3cache_error e = {0};
	if (k3cache_connect(sock_path, &c, &e) != 0) {
		b->rc = -1;
		snprintf(b->message, sizeof(b->message), "%s", e.message);
		return NULL;
	}
	struct k3cache_publish_result res;
	double t0 = benchutil_now();
	b->rc = k3cache_publish(c, b->m->fingerprint, NULL, 0, b->tokens, b->p, b->s->k3, b->s->n,
	                        &res, &e);
	b->secs = benchutil_now() - t0;
	if (b->rc != 0)
		snprintf(b->message, sizeof(b->message), "%s", e.message);
	else if (!res.created)
		snprintf(b->message, sizeof(b->message), "stored already"), b->rc = -1;
	k3cache_close(c);
	return NULL;
}

/* ---- the run --------------------------------------------------------------- */

static void row(const char *label, double secs, uint64_t bytes, const char *r1, const char *r2,
                double cpu_client, double cpu_daemon)
{
	char cc[16] = "-", cd[16] = "-";
	if (cpu_client >= 0)
		snprintf(cc, sizeof(cc), "%.0f", cpu_client * 1e3);
	if (cpu_daemon >= 0)
		snprintf(cd, sizeof(cd), "%.0f", cpu_daemon * 1e3);
	printf("%-46s %8.1f %7.2f %11s %11s %8s %8s\n", label, secs * 1e3, gbps(bytes, secs), r1,
	       r2, cc, cd);
}

struct loaded_run {
	int loaded, pubs, pubs_total, per_child;
	double seconds;
	uint64_t bytes_in, yields; /* the daemon's, during the lookups */
};

/* A counter of the daemon's Stat answer. */
static uint64_t stat_counter(struct k3cache *c, const char *name)
{
	uint64_t v = 0;
	struct k3cache_error e;
	if (k3cache_stat_counter(c, name, &v, &e) != 0)
		die_k3("stat", &e);
	return v;
}

/* q lookups while two other processes publish K3 snapshots (at nice_to). */
static void loaded_lookups(struct k3cache *c, const struct snap *s, const struct k3cache_model *m,
                           const struct k3cache_model *tiny, uint32_t *prompt, uint32_t n_prompt,
                           uint32_t want, int q, double *busy, int nice_to, struct loaded_run *out)
{
	struct load *ld =
	        mmap(NULL, sizeof(*ld), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (ld == MAP_FAILED)
		fail("mmap: %s", strerror(errno));
	memset(ld, 0, sizeof(*ld));
	/* stay under the capacity: no eviction may touch the lookup path */
	int per_child = (int)((CAPACITY - CAPACITY / 16) / s->bytes / 2);
	per_child = per_child > 50 ? 50 : per_child;
	fflush(stdout);
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		if (kids[k] < 0)
			fail("fork: %s", strerror(errno));
		if (kids[k] == 0)
			load_child(ld, k + 2 * (nice_to != 0), s, m->fingerprint, per_child,
			           nice_to);
	}
	double w0 = benchutil_now();
	while (atomic_load(&ld->running) < 2) {
		if (atomic_load(&ld->failed))
			fail("%s", ld->message);
		if (benchutil_now() - w0 > 30)
			fail("the publishing children did not start within 30 s");
		sleep_ms(1);
	}
	sleep_ms(50); /* the first upload is under way */
	int pub0 = atomic_load(&ld->published);
	uint64_t in0 = stat_counter(c, "bytes_in"), y0 = stat_counter(c, "ingest_yields");
	double l0 = benchutil_now();
	run_lookups(c, tiny->fingerprint, prompt, n_prompt, want, q, busy, ld, &out->loaded);
	out->seconds = benchutil_now() - l0;
	out->bytes_in = stat_counter(c, "bytes_in") - in0;
	out->yields = stat_counter(c, "ingest_yields") - y0;
	out->pubs = atomic_load(&ld->published) - pub0;
	atomic_store(&ld->stop, 1);
	for (int k = 0; k < 2; k++) {
		int status;
		waitpid(kids[k], &status, 0);
		kids[k] = 0;
		if (atomic_load(&ld->failed))
			fail("%s", ld->message);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			fail("publishing child %d failed (status %d)", k, status);
	}
	out->pubs_total = atomic_load(&ld->published);
	out->per_child = per_child;
	munmap(ld, sizeof(*ld));
}

/* Every layer in bufs is what s published. */
static void same_as_published(const struct snap *s, void **bufs, const size_t *lens,
                              const char *what)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (lens[i] != s->sizes[i] || memcmp(bufs[i], s->bufs[i], s->sizes[i]) != 0)
			fail("%s: layer %u differs from what was published", what, i);
}

/* Direct reads (k3cache/direct.h): restore_into and views of entry key
 * from the store's file in this process, rounds alternating with memcpy of
 * the same bytes into the same buffers; the best of each. The first restore
 * is compared with what was published. */
static void direct_rounds(const struct k3cache_model *m, const uint8_t *key, const struct snap *s,
                          void **bufs, size_t *lens, double *best_direct, double *best_view,
                          double *best_copy, double *best_mapcopy, double *best_direct1)
{
	struct k3cache_error e;
	/* direct reads: the same restore from the store's file in this
	 * process, against memcpy of the same bytes into the same buffers,
	 * rounds alternating */
	struct k3cache_direct *dr, *dr1;
	if (k3cache_direct_open(db_path, sock_path, &dr, &e) != 0)
		die_k3("direct open", &e);
	/* the same on the calling thread alone, for comparison */
	const char *was = getenv("K3CACHE_DIRECT_THREADS");
	char saved[32] = "";
	if (was)
		snprintf(saved, sizeof(saved), "%s", was);
	setenv("K3CACHE_DIRECT_THREADS", "1", 1);
	if (k3cache_direct_open(db_path, sock_path, &dr1, &e) != 0)
		die_k3("direct open (one thread)", &e);
	if (was)
		setenv("K3CACHE_DIRECT_THREADS", saved, 1);
	else
		unsetenv("K3CACHE_DIRECT_THREADS");
	*best_direct = *best_view = *best_copy = *best_mapcopy = *best_direct1 = 1e9;
	long rounds = benchutil_restore_rounds(5);
	for (long round = 0; round < rounds; round++) {
		uint32_t p = 0;
		double t0 = benchutil_now();
		if (k3cache_direct_restore_into(dr, m, key, bufs, s->sizes, lens, &p, &e) != 0)
			die_k3("direct restore_into", &e);
		double t = benchutil_now() - t0;
		*best_direct = t < *best_direct ? t : *best_direct;
		if (round == 0)
			same_as_published(s, bufs, lens, "direct restore_into");
		memset(bufs[0], 0, s->sizes[0]); /* what the next restore must write again */
		t0 = benchutil_now();
		if (k3cache_direct_restore_into(dr1, m, key, bufs, s->sizes, lens, &p, &e) != 0)
			die_k3("direct restore_into (one thread)", &e);
		t = benchutil_now() - t0;
		*best_direct1 = t < *best_direct1 ? t : *best_direct1;
		if (round == 0)
			same_as_published(s, bufs, lens, "direct restore_into (one thread)");
		t0 = benchutil_now();
		for (uint32_t i = 0; i < s->n; i++)
			memcpy(bufs[i], s->bufs[i], s->sizes[i]);
		t = benchutil_now() - t0;
		*best_copy = t < *best_copy ? t : *best_copy;
	}
	/* views with every layer checked, against the same memcpy */
	for (long round = 0; round < rounds; round++) {
		struct k3cache_direct_view *v;
		double t0 = benchutil_now();
		if (k3cache_direct_view(dr, m, key, &v, &e) != 0)
			die_k3("direct view", &e);
		double t = benchutil_now() - t0;
		*best_view = t < *best_view ? t : *best_view;
		/* memcpy of the same bytes from where they are: the map */
		t0 = benchutil_now();
		for (uint32_t i = 0; i < v->n_layers; i++) {
			unsigned char *to = bufs[i];
			for (uint32_t j = 0; j < v->layers[i].n_pieces; j++) {
				memcpy(to, v->layers[i].pieces[j].data, v->layers[i].pieces[j].len);
				to += v->layers[i].pieces[j].len;
			}
		}
		t = benchutil_now() - t0;
		*best_mapcopy = t < *best_mapcopy ? t : *best_mapcopy;
		k3cache_direct_view_release(v);
		t0 = benchutil_now();
		for (uint32_t i = 0; i < s->n; i++)
			memcpy(bufs[i], s->bufs[i], s->sizes[i]);
		t = benchutil_now() - t0;
		*best_copy = t < *best_copy ? t : *best_copy;
	}
	k3cache_direct_close(dr);
	k3cache_direct_close(dr1);
}

static void print_direct(const struct snap *s, double best_direct, double best_view,
                         double best_copy, double best_mapcopy, double best_direct1)
{
	printf("memcpy of the snapshot from the store's map (a view's pieces) into the same "
	       "buffers: %.1f ms, %.2f GB/s; direct restore: %.2fx that\n",
	       best_mapcopy * 1e3, gbps(s->bytes, best_mapcopy), best_mapcopy / best_direct);
	printf("direct restore into caller buffers (k3cache/direct.h, every layer checked): "
	       "%.1f ms, %.2f GB/s; memcpy of the same bytes into the same buffers: %.1f ms, "
	       "%.2f GB/s: %.2fx memcpy (target >= 0.8x: %s)\n",
	       best_direct * 1e3, gbps(s->bytes, best_direct), best_copy * 1e3,
	       gbps(s->bytes, best_copy), best_copy / best_direct,
	       best_copy / best_direct >= 0.8 ? "met" : "NOT met");
	printf("direct restore on the calling thread alone (K3CACHE_DIRECT_THREADS=1): %.1f ms, "
	       "%.2f GB/s: %.2fx memcpy\n",
	       best_direct1 * 1e3, gbps(s->bytes, best_direct1), best_copy / best_direct1);
	printf("direct views (every layer checked, no copy): %.1f ms, %.2f GB/s: %.2fx memcpy "
	       "(target >= 0.5x: %s)\n",
	       best_view * 1e3, gbps(s->bytes, best_view), best_copy / best_view,
	       best_copy / best_view >= 0.5 ? "met" : "NOT met");
}

int main(int argc, char **argv)
{
	const char *dir = "bench-wire.tmp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--direct"))
			direct_only = 1;
		else if (argv[i][0] == '-') {
			fprintf(stderr, "usage: bench_wire [DIR] [--quick] [--direct]\n");
			return 2;
		} else
			dir = argv[i];
	}
	main_pid = getpid();
	signal(SIGPIPE, SIG_IGN);
	/* As the daemon does: keep freed memory in the heap instead of handing it
	 * back to the kernel and faulting it in again for the next large put. */
	mallopt(M_MMAP_MAX, 0);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	snprintf(bench_dir, sizeof(bench_dir), "%s", dir);
	snprintf(db_path, sizeof(db_path), "%s/db", dir);
	snprintf(sock_path, sizeof(sock_path), "%s/s.sock", dir);
	snprintf(log_path, sizeof(log_path), "%s/k3cached.log", dir);
	if (mkdir(dir, 0750) != 0 && errno != EEXIST)
		fail("mkdir %s: %s", dir, strerror(errno));
	char store_dir[600];
	snprintf(store_dir, sizeof(store_dir), "%s/store", dir);
	benchutil_rm_rf(db_path);
	benchutil_rm_rf(store_dir);
	unlink(sock_path);
	unlink(log_path);
	printf("bench/wire%s: daemon and store in %s\n", quick ? " (quick)" : "", dir);

	uint32_t n_kda = quick ? 9 : 69, n_mla = quick ? 3 : 24;
	struct k3cache_model *m = k3_model("k3-wire", n_kda, n_mla);
	struct snap s = make_snap(m, SNAP_P, 1);
	uint32_t *tokens = xmalloc(SNAP_P * sizeof(uint32_t));
	unsigned char *dst = private_buffer(s.bytes);

	struct k3cache *c = daemon_start(NULL);
	put_model(c, m);
	struct k3cache_error e;
	if (direct_only) {
		fill_tokens(tokens, SNAP_P, 1);
		struct k3cache_publish_result res;
		if (k3cache_publish(c, m->fingerprint, NULL, 0, tokens, SNAP_P, s.k3, s.n, &res,
		                    &e) != 0)
			die_k3("publish", &e);
		void **bufs = xmalloc(s.n * sizeof(void *));
		size_t *lens = xmalloc(s.n * sizeof(size_t));
		size_t off = 0;
		for (uint32_t i = 0; i < s.n; off += s.sizes[i], i++)
			bufs[i] = dst + off;
		double best_direct, best_view, best_copy, best_mapcopy, best_direct1;
		direct_rounds(m, res.key, &s, bufs, lens, &best_direct, &best_view, &best_copy,
		              &best_mapcopy, &best_direct1);
		print_direct(&s, best_direct, best_view, best_copy, best_mapcopy, best_direct1);
		free(bufs);
		free(lens);
		free(tokens);
		free_snap(&s);
		model_free(m);
		k3cache_close(c);
		if (daemon_stop() != 0)
			fail("k3cached did not stop cleanly on SIGTERM");
		if (!getenv("BENCH_KEEP"))
			benchutil_rm_rf(dir);
		return 0;
	}

	printf("\n== snapshot: %u KDA + %u MLA layers at %u tokens, %.1f MiB (best of 3; 5 for the "
	       "restore)\n",
	       n_kda, n_mla, SNAP_P, (double)s.bytes / MIB);

	/* 1. the raw socket with the default buffers here; with the 4 MiB ones the
	 * client and the daemon ask for, next to the restore (3.). The faster is
	 * the baseline. (The receive buffer is pre-touched, so the VM's fault-in
	 * cost stays out of it.) */
	double raw_def = 1e9, raw_4m_first = 1e9, raw_4m = 1e9;
	for (int b = 0; b < 2; b++) {
		struct raw_sender rs = raw_open(&s, b ? 4 << 20 : 0);
		for (int r = 0; r < 3; r++) {
			double t = raw_round(&rs, &s, dst);
			double *best = b ? &raw_4m_first : &raw_def;
			*best = t < *best ? t : *best;
		}
		raw_close(&rs);
	}

	/* 2. publish: store_publish in this process (safe) and k3cache_publish
	 * through the daemon (safe), rounds interleaved with the order alternating,
	 * so both meet the same memory conditions (this VM faults fresh memory in
	 * at 1-2 GB/s: whichever runs right after memory was freed is favoured).
	 * The restore below reads the daemon's last snapshot. */
	double best_store = 1e9, cpu_store = 0;
	double best_pub = 1e9, pub_cc = 0, pub_cd = 0, t_store[3], t_pub[3];
	uint8_t key[K3CACHE_KEY_LEN];
	struct store_options so = {.max_bytes = CAPACITY, .durability = STORE_SAFE};
	struct store *st;
	struct status stt;
	if (store_open(store_dir, &so, &st, &stt) != STATUS_OK)
		die_st("store_open", &stt);
	if (store_put_model(st, m, NULL, &stt) != STATUS_OK)
		die_st("store_put_model", &stt);
	for (uint32_t i = 0; i < 6; i++) {
		uint32_t r = i / 2;
		int daemon_side = (int)((i % 2) ^ (r % 2));
		/* Steady state, as a cache at capacity runs: the previous snapshot
		 * is evicted first, so the publish reuses its pages (and their page
		 * cache) instead of growing the file into memory this VM must fault
		 * in from its host. Both sides alike. */
		if (!daemon_side) {
			struct store_evict_req er = {.model = m->fingerprint};
			struct store_evict_res eres;
			if (store_evict(st, &er, NULL, NULL, &eres, &stt) != STATUS_OK)
				die_st("store_evict", &stt);
		} else {
			evict_model(c, m);
		}
		if (!daemon_side) {
			fill_tokens(tokens, SNAP_P, 100 + r);
			struct store_publish_req req = {m->fingerprint, "",      0,  tokens,
			                                SNAP_P,         s.blobs, s.n};
			struct store_publish_res res;
			double c0 = self_cpu(), t0 = benchutil_now();
			if (store_publish(st, &req, &res, &stt) != STATUS_OK)
				die_st("store_publish", &stt);
			double t = benchutil_now() - t0;
			if (!res.created)
				fail("store_publish: entry %u existed already", r);
			t_store[r] = t;
			if (t < best_store) {
				best_store = t;
				cpu_store = self_cpu() - c0;
			}
			continue;
		}
		fill_tokens(tokens, SNAP_P, 200 + r);
		struct k3cache_publish_result res;
		double c0 = self_cpu(), d0 = proc_cpu(daemon_pid), t0 = benchutil_now();
		if (k3cache_publish(c, m->fingerprint, NULL, 0, tokens, SNAP_P, s.k3, s.n, &res,
		                    &e) != 0)
			die_k3("publish", &e);
		double t = benchutil_now() - t0;
		if (!res.created || res.bytes != s.bytes || res.evicted)
			fail("publish %u: created %d, %llu bytes, %u evicted: expected a new entry "
			     "of %llu bytes and no eviction",
			     r, res.created, (unsigned long long)res.bytes, res.evicted,
			     (unsigned long long)s.bytes);
		t_pub[r] = t;
		if (t < best_pub) {
			best_pub = t;
			pub_cc = self_cpu() - c0;
			pub_cd = proc_cpu(daemon_pid) - d0;
		}
		memcpy(key, res.key, sizeof(key));
	}
	store_close(st);
	benchutil_rm_rf(store_dir);

	/* 2b. publish from component arrays (views into the same bytes) against
	 * the whole-blob publish, rounds alternating, each after evicting the
	 * previous one; the last (from arrays) is the entry restored below */
	double best_blobpub = 1e9, best_arrpub = 1e9;
	struct k3cache_arrays *arr_in = xmalloc(s.n * sizeof(*arr_in));
	arrays_at(m, SNAP_P, s.bufs, arr_in, NULL);
	for (uint32_t i = 0; i < 6; i++) {
		int arrays = (int)((i % 2) ^ ((i / 2) % 2));
		evict_model(c, m);
		fill_tokens(tokens, SNAP_P, 300 + i);
		struct k3cache_publish_result res;
		double t0 = benchutil_now();
		int rc = arrays ? k3cache_publish_arrays(c, m, NULL, 0, tokens, SNAP_P, arr_in, s.n,
		                                         NULL, 0, &res, &e)
		                : k3cache_publish(c, m->fingerprint, NULL, 0, tokens, SNAP_P, s.k3,
		                                  s.n, &res, &e);
		double t = benchutil_now() - t0;
		if (rc != 0)
			die_k3(arrays ? "publish_arrays" : "publish", &e);
		if (!res.created || res.bytes != s.bytes)
			fail("publish round %u: created %d, %llu bytes", i, res.created,
			     (unsigned long long)res.bytes);
		double *best = arrays ? &best_arrpub : &best_blobpub;
		*best = t < *best ? t : *best;
		memcpy(key, res.key, sizeof(key));
	}
	free(arr_in);

	/* 3. restore into pre-touched caller buffers */
	void **bufs = xmalloc(s.n * sizeof(void *));
	size_t *lens = xmalloc(s.n * sizeof(size_t));
	{
		size_t off = 0;
		for (uint32_t i = 0; i < s.n; i++) {
			bufs[i] = dst + off;
			off += s.sizes[i];
		}
	}
	/* rounds of the raw socket (4 MiB buffers) and of the restore alternate,
	 * so that both meet the same moments of this VM; best of each */
	double best_rst = 1e9, rst_cc = 0, rst_cd = 0, best_arr = 1e9;
	struct k3cache_arrays_out *arr_out = xmalloc(s.n * sizeof(*arr_out));
	struct k3cache_arrays *arr_in_check = xmalloc(s.n * sizeof(*arr_in_check));
	arrays_at(m, SNAP_P, (unsigned char *const *)bufs, NULL, arr_out);
	arrays_at(m, SNAP_P, s.bufs, arr_in_check, NULL);
	long rounds = benchutil_restore_rounds(5);
	struct raw_sender rs = raw_open(&s, 4 << 20);
	for (long r = 0; r < rounds; r++) {
		double traw = raw_round(&rs, &s, dst);
		raw_4m = traw < raw_4m ? traw : raw_4m;
		/* into the layers' arrays (the header words are not written: the
		 * bytes between the arrays stay zero), checked in the first round */
		memset(dst, 0, s.bytes);
		double ta = benchutil_now();
		if (k3cache_restore_arrays(c, m, key, arr_out, s.n, NULL, &e) != 0)
			die_k3("restore_arrays", &e);
		ta = benchutil_now() - ta;
		best_arr = ta < best_arr ? ta : best_arr;
		for (uint32_t i = 0; r == 0 && i < s.n; i++)
			if (memcmp(arr_out[i].a, arr_in_check[i].a, arr_in_check[i].a_len * 4) !=
			            0 ||
			    memcmp(arr_out[i].b, arr_in_check[i].b, arr_in_check[i].b_len * 4) != 0)
				fail("restore_arrays: layer %u differs from what was published", i);
		memset(dst, 0, s.bytes);
		uint32_t p = 0;
		double c0 = self_cpu(), d0 = proc_cpu(daemon_pid), t0 = benchutil_now();
		if (k3cache_restore_into(c, m, key, bufs, s.sizes, lens, &p, &e) != 0)
			die_k3("restore_into", &e);
		double t = benchutil_now() - t0;
		if (p != SNAP_P)
			fail("restore_into: P=%u, published %u", p, SNAP_P);
		if (t < best_rst) {
			best_rst = t;
			rst_cc = self_cpu() - c0;
			rst_cd = proc_cpu(daemon_pid) - d0;
		}
	}
	free(arr_out);
	free(arr_in_check);
	raw_close(&rs);
	/* the baseline: the raw rounds run beside the restore, in the same
	 * conditions; the first ones are shown, and compared, too */
	double raw = raw_4m;
	double raw_fastest = raw_def < raw_4m_first ? raw_def : raw_4m_first;
	raw_fastest = raw_4m < raw_fastest ? raw_4m : raw_fastest;
	for (uint32_t i = 0; i < s.n; i++)
		if (lens[i] != s.sizes[i] || memcmp(bufs[i], s.bufs[i], s.sizes[i]) != 0)
			fail("restore_into: layer %u differs from what was published", i);

	/* direct reads: the same restore from the store's file in this
	 * process, against memcpy of the same bytes into the same buffers */
	double best_direct, best_view, best_copy, best_mapcopy, best_direct1;
	direct_rounds(m, key, &s, bufs, lens, &best_direct, &best_view, &best_copy, &best_mapcopy,
	              &best_direct1);
	free(bufs);
	free(lens);

	double pub_ratio = best_store / best_pub, rst_ratio = raw / best_rst;
	double arr_ratio = raw / best_arr, arrpub_ratio = best_blobpub / best_arrpub;
	char r1[32], r2[32];
	printf("%-46s %8s %7s %11s %11s %8s %8s\n", "operation", "ms", "GB/s", "vs socket",
	       "vs store", "cpu ms", "daemon");
	snprintf(r1, sizeof(r1), "%.2fx", raw / raw_def);
	row("raw Unix socket, default buffers, first", raw_def, s.bytes, r1, "", -1, -1);
	snprintf(r1, sizeof(r1), "%.2fx", raw / raw_4m_first);
	row("raw Unix socket, 4 MiB buffers, first", raw_4m_first, s.bytes, r1, "", -1, -1);
	row("raw Unix socket, 4 MiB, beside the restore", raw_4m, s.bytes, "baseline", "", -1, -1);
	snprintf(r1, sizeof(r1), "%.2fx", raw / best_store);
	row("store_publish in process, safe", best_store, s.bytes, r1, "baseline", cpu_store, -1);
	snprintf(r1, sizeof(r1), "%.2fx", raw / best_pub);
	snprintf(r2, sizeof(r2), "%.2fx", pub_ratio);
	row("k3cache_publish over the socket, safe", best_pub, s.bytes, r1, r2, pub_cc, pub_cd);
	snprintf(r1, sizeof(r1), "%.2fx", rst_ratio);
	row("k3cache_restore_into (validated)", best_rst, s.bytes, r1, "", rst_cc, rst_cd);
	snprintf(r1, sizeof(r1), "%.2fx", arr_ratio);
	row("k3cache_restore_arrays (validated)", best_arr, s.bytes, r1, "", -1, -1);
	snprintf(r2, sizeof(r2), "%.2fx", arrpub_ratio);
	row("k3cache_publish, whole blobs", best_blobpub, s.bytes, "", "", -1, -1);
	row("k3cache_publish_arrays (vs whole blobs)", best_arrpub, s.bytes, "", r2, -1, -1);
	printf("(cpu ms: this process during the best run; daemon: k3cached's, all threads, "
	       "10 ms ticks)\n");
	printf("(\"first\": measured first, on a quiet machine; \"beside the restore\": its rounds "
	       "alternate with the restore's, after the publishes)\n");
	printf("restore vs the fastest raw run of all: %.2fx\n", raw_fastest / best_rst);
	print_direct(&s, best_direct, best_view, best_copy, best_mapcopy, best_direct1);
	printf("publish rounds, ms: store %.0f / %.0f / %.0f; daemon %.0f / %.0f / %.0f "
	       "(interleaved: store first in rounds 1 and 3)\n",
	       t_store[0] * 1e3, t_store[1] * 1e3, t_store[2] * 1e3, t_pub[0] * 1e3, t_pub[1] * 1e3,
	       t_pub[2] * 1e3);

	/* 4. lookup latency, idle and under publishes */
	size_t evicted = evict_model(c, m);
	const uint32_t n_prompt = 131072, n_path = 16;
	const struct model_layer tiny_layers[] = {
	        {.mixer = MODEL_MIXER_KDA, .conv_len = 12, .recurrent_len = 16},
	        {.mixer = MODEL_MIXER_MLA, .k_row = 2, .v_row = 2},
	};
	char merr[MODEL_ERROR_MAX];
	struct k3cache_model *tiny =
	        model_new("wire-lookup", "bench", "bench", tiny_layers, 2, merr);
	if (!tiny)
		fail("model: %s", merr);
	put_model(c, tiny);
	uint32_t *prompt = xmalloc(n_prompt * sizeof(uint32_t));
	for (uint32_t i = 0; i < n_prompt; i++)
		prompt[i] = (i * 2654435761u) >> 12;
	uint32_t want = 0;
	for (uint32_t i = 0; i < n_path; i++) {
		uint32_t p = 4096u * (i + 1) - i; /* 4096 .. 65521, off block boundaries */
		struct snap ts = make_snap(tiny, p, i);
		struct k3cache_publish_result res;
		if (k3cache_publish(c, tiny->fingerprint, NULL, 0, prompt, p, ts.k3, ts.n, &res,
		                    &e) != 0)
			die_k3("publish (lookup path)", &e);
		free_snap(&ts);
		want = p;
	}
	/* BENCH_LOOKUPS=N: another count, e.g. for a profiler to attach */
	const char *q_env = getenv("BENCH_LOOKUPS");
	long q_set = q_env ? strtol(q_env, NULL, 10) : 0;
	const int Q = q_set > 0 && q_set < 1000000 ? (int)q_set : quick ? 200 : 500;
	double *idle = xmalloc(sizeof(double) * (size_t)Q);
	double *busy = xmalloc(sizeof(double) * (size_t)Q);
	int loaded = 0;
	run_lookups(c, tiny->fingerprint, prompt, n_prompt, want, Q, idle, NULL, &loaded);

	struct loaded_run runs[2];
	struct loaded_run runs3[1];
	double *busy_nice = xmalloc(Q * sizeof(double));
	double *busy_noyield = xmalloc(Q * sizeof(double));
	loaded_lookups(c, &s, m, tiny, prompt, n_prompt, want, Q, busy, 0, &runs[0]);
	evict_model(c, m); /* room for the second run's snapshots */
	loaded_lookups(c, &s, m, tiny, prompt, n_prompt, want, Q, busy_nice, 10, &runs[1]);
	/* the first run again with a daemon whose uploads never yield */
	evict_model(c, m);
	k3cache_close(c);
	if (daemon_stop() != 0)
		fail("k3cached did not stop cleanly for its restart");
	c = daemon_start("0");
	loaded_lookups(c, &s, m, tiny, prompt, n_prompt, want, Q, busy_noyield, 0, &runs3[0]);
	printf("\n== lookup over the socket: %u-token prompt, default limit, %u entries on its "
	       "path (P up to %u), %d lookups\n",
	       n_prompt, n_path, want, Q);
	printf("%-46s %8s %8s %8s %8s %8s\n", "lookup", "p50 ms", "p90 ms", "p95 ms", "p99 ms",
	       "max ms");
	const char *names[4] = {"idle", "2 processes publishing K3 snapshots",
	                        "the same, the publishing processes at nice 10",
	                        "as row 2, uploads not yielding (--yield-rate 0)"};
	const double *lats[4] = {idle, busy, busy_nice, busy_noyield};
	for (int k = 0; k < 4; k++)
		printf("%-46s %8.3f %8.3f %8.3f %8.3f %8.3f\n", names[k], lats[k][Q / 2] * 1e3,
		       lats[k][Q * 90 / 100] * 1e3, lats[k][Q * 95 / 100] * 1e3,
		       lats[k][Q * 99 / 100] * 1e3, lats[k][Q - 1] * 1e3);
	for (int r = 0; r < 3; r++) {
		const struct loaded_run *lr = r < 2 ? &runs[r] : &runs3[0];
		printf("row %d: hit P = %u every time; %d of %d lookups ran with both publishers "
		       "active; the daemon received %.2f GB/s of uploads in the %.2f s window "
		       "(%llu yields); %d publishes of %.0f MiB completed in it (%d in all, %d per "
		       "child at most)\n",
		       r + 2, want, lr->loaded, Q, (double)lr->bytes_in / lr->seconds / 1e9,
		       lr->seconds, (unsigned long long)lr->yields, lr->pubs, (double)s.bytes / MIB,
		       lr->pubs_total, lr->per_child);
	}
	printf("(%zu entries evicted beforehand. On 2 cores the publishing processes compete with "
	       "the lookup client itself; at nice 10 they yield to it, which isolates what the "
	       "daemon adds. While lookups arrive the daemon reads each upload at most "
	       "--yield-rate per second, 1 GiB by default; row 4 turns that off.)\n",
	       evicted);
	double p99_busy = busy[Q * 99 / 100];
	free(idle);
	free(busy);
	free(busy_nice);
	free(busy_noyield);
	free(prompt);
	munmap(dst, s.bytes);
	free_snap(&s);
	model_free(tiny);

	/* 5. daemon anonymous RSS while it ingests a 1 GiB snapshot */
	evict_model(c, m);
	struct k3cache_model *big = k3_model("k3-wire-1gib", 69, 24);
	uint64_t kda_bytes = 0, mla_hdr = 0, per_token = 0;
	for (uint32_t i = 0; i < big->n_layers; i++) {
		if (big->layers[i].mixer == MODEL_MIXER_KDA) {
			kda_bytes += model_layer_blob_size(&big->layers[i], 0);
		} else {
			mla_hdr += model_layer_blob_size(&big->layers[i], 0);
			per_token += model_layer_blob_size(&big->layers[i], 1) -
			             model_layer_blob_size(&big->layers[i], 0);
		}
	}
	uint32_t p_big = (uint32_t)(((UINT64_C(1) << 30) - kda_bytes - mla_hdr) / per_token);
	put_model(c, big);
	struct snap bs = make_snap(big, p_big, 3);
	uint32_t *btok = xmalloc(p_big * sizeof(uint32_t));
	fill_tokens(btok, p_big, 9000);
	struct sampler sp = {.pid = daemon_pid};
	long anon_before = 0, file_before = 0;
	if (read_rss(daemon_pid, &anon_before, &file_before) != 0)
		fail("cannot read /proc/%d/status", (int)daemon_pid);
	pthread_t th;
	sampler_start(&sp, &th);
	struct k3cache_publish_result bres;
	double d0 = proc_cpu(daemon_pid), t0 = benchutil_now();
	int prc =
	        k3cache_publish(c, big->fingerprint, NULL, 0, btok, p_big, bs.k3, bs.n, &bres, &e);
	double tb = benchutil_now() - t0, cpu_b = proc_cpu(daemon_pid) - d0;
	sampler_stop(&sp, th);
	if (prc != 0)
		die_k3("publish (1 GiB)", &e);
	if (!bres.created || bres.bytes != bs.bytes)
		fail("publish (1 GiB): created %d, %llu bytes: expected a new entry of %llu",
		     bres.created, (unsigned long long)bres.bytes, (unsigned long long)bs.bytes);
	long anon_after = -1024, file_after = 0;
	read_rss(daemon_pid, &anon_after, &file_after);

	/* the same bytes through store_publish in this process, for comparison:
	 * its time, and this process's RssAnon growth (LMDB's dirty pages) */
	double ts;
	struct sampler self = {.pid = getpid()};
	long self_before = 0, self_file = 0;
	if (read_rss(getpid(), &self_before, &self_file) != 0)
		fail("cannot read /proc/self/status");
	{
		struct store_options o = {.max_bytes = CAPACITY, .durability = STORE_SAFE};
		struct store *st;
		struct status stt;
		if (store_open(store_dir, &o, &st, &stt) != STATUS_OK)
			die_st("store_open", &stt);
		if (store_put_model(st, big, NULL, &stt) != STATUS_OK)
			die_st("store_put_model", &stt);
		struct store_publish_req req = {big->fingerprint, "",  0, btok, p_big,
		                                bs.blobs,         bs.n};
		struct store_publish_res res;
		sampler_start(&self, &th);
		t0 = benchutil_now();
		prc = store_publish(st, &req, &res, &stt);
		ts = benchutil_now() - t0;
		sampler_stop(&self, th);
		if (prc != STATUS_OK)
			die_st("store_publish (1 GiB)", &stt);
		store_close(st);
		benchutil_rm_rf(store_dir);
	}

	double bound = (double)(RSS_SLACK + INFLIGHT) / MIB;
	double peak = (double)sp.peak_anon_kb / 1024.0;
	printf("\n== daemon RSS while it ingests a %.1f MiB snapshot (69 KDA + 24 MLA at P=%u; "
	       "%d samples, every 10 ms)\n",
	       (double)bs.bytes / MIB, p_big, sp.samples);
	printf("%-46s %8s %7s %8s\n", "publish", "ms", "GB/s", "cpu ms");
	printf("%-46s %8.1f %7.2f %8.0f\n", "k3cache_publish over the socket (daemon cpu)",
	       tb * 1e3, gbps(bs.bytes, tb), cpu_b * 1e3);
	printf("%-46s %8.1f %7.2f %8s\n", "store_publish in process, same bytes", ts * 1e3,
	       gbps(bs.bytes, ts), "-");
	printf("%-46s %10s\n", "measure", "MiB");
	printf("%-46s %10.1f\n", "daemon RssAnon before the publish", (double)anon_before / 1024.0);
	printf("%-46s %10.1f\n", "daemon RssAnon peak during the publish", peak);
	printf("%-46s %10.1f\n", "daemon RssAnon after the publish", (double)anon_after / 1024.0);
	printf("%-46s %10.1f\n", "daemon RssFile peak (LMDB map, page cache)",
	       (double)sp.peak_file_kb / 1024.0);
	printf("%-46s %10.1f\n", "in-process store_publish: RssAnon growth",
	       (double)(self.peak_anon_kb - self_before) / 1024.0);
	printf("%-46s %10.1f\n", "bound: 64 MiB + --max-inflight", bound);
	printf("daemon peak RssAnon %.1f MiB is %s the bound of %.1f MiB\n", peak,
	       peak <= bound ? "within" : "over", bound);
	/* 6. two workers publish a 1 GiB snapshot each at once: the daemon's
	 * anonymous RSS while they do, and once it has been idle for its
	 * pool's idle time */
	struct snap bs2[2] = {make_snap(big, p_big, 11), make_snap(big, p_big, 12)};
	uint32_t *btok2[2] = {xmalloc(p_big * sizeof(uint32_t)), xmalloc(p_big * sizeof(uint32_t))};
	fill_tokens(btok2[0], p_big, 11000);
	fill_tokens(btok2[1], p_big, 12000);
	struct burst bu[2];
	pthread_t bth[2];
	struct sampler sb = {.pid = daemon_pid};
	long burst_before = 0, burst_file = 0;
	read_rss(daemon_pid, &burst_before, &burst_file);
	sampler_start(&sb, &th);
	double tburst = benchutil_now();
	for (int i = 0; i < 2; i++) {
		bu[i] = (struct burst){.m = big, .s = &bs2[i], .tokens = btok2[i], .p = p_big};
		if (pthread_create(&bth[i], NULL, burst_main, &bu[i]) != 0)
			fail("pthread_create failed");
	}
	for (int i = 0; i < 2; i++)
		pthread_join(bth[i], NULL);
	tburst = benchutil_now() - tburst;
	sampler_stop(&sb, th);
	for (int i = 0; i < 2; i++)
		if (bu[i].rc != 0)
			fail("burst publish %d: %s", i, bu[i].message);
	long burst_after = 0;
	read_rss(daemon_pid, &burst_after, &burst_file);
	/* the daemon hands its pooled buffers back after K3D_POOL_IDLE_TICKS */
	sleep_ms(12000);
	long idle_anon = 0;
	read_rss(daemon_pid, &idle_anon, &burst_file);
	double burst_peak = (double)sb.peak_anon_kb / 1024.0, idle_mib = (double)idle_anon / 1024.0;
	printf("\n== two workers publish a %.1f MiB snapshot each at once (%d samples)\n",
	       (double)bs.bytes / MIB, sb.samples);
	printf("%-46s %10.1f\n", "daemon RssAnon before", (double)burst_before / 1024.0);
	printf("%-46s %10.1f\n", "daemon RssAnon peak during both", burst_peak);
	printf("%-46s %10.1f\n", "daemon RssAnon when both are answered",
	       (double)burst_after / 1024.0);
	printf("%-46s %10.1f\n", "daemon RssAnon after 12 s idle", idle_mib);
	printf("%-46s %10.2f\n", "both publishes, GB/s together", gbps(2 * bs.bytes, tburst));
	for (int i = 0; i < 2; i++) {
		free(btok2[i]);
		free_snap(&bs2[i]);
	}
	free(btok);
	free_snap(&bs);
	model_free(big);

	k3cache_close(c);
	int rc = daemon_stop();
	if (rc != 0)
		fail("k3cached exited with status %d on SIGTERM, expected 0", rc);
	printf("daemon stopped on SIGTERM with status 0\n");
	fflush(stdout);
	show_log(); /* warnings it logged, if any */

	printf("targets: burst of 2 x 1 GiB: daemon RssAnon peak < 160 MiB: %s (%.1f MiB); "
	       "idle after it < 96 MiB: %s (%.1f MiB); 1 GiB publish over the socket >= 0.7x "
	       "store publish: %s (%.2fx)\n",
	       burst_peak < 160 ? "met" : "NOT met", burst_peak, idle_mib < 96 ? "met" : "NOT met",
	       idle_mib, ts / tb >= 0.7 ? "met" : "NOT met", ts / tb);
	printf("targets: publish over socket >= 0.7x store publish: %s (%.2fx); restore >= 0.8x "
	       "raw socket: %s (%.2fx); lookup p99 < 5 ms under publishes: %s (%.3f ms); daemon "
	       "RssAnon peak within 64 MiB + inflight: %s (%.0f of %.0f MiB); publish from arrays "
	       ">= 0.95x whole blobs: %s (%.2fx); restore into arrays >= 0.8x raw socket: %s "
	       "(%.2fx)\n",
	       pub_ratio >= 0.7 ? "met" : "NOT met", pub_ratio,
	       rst_ratio >= 0.8 ? "met" : "NOT met", rst_ratio,
	       p99_busy < 0.005 ? "met" : "NOT met", p99_busy * 1e3,
	       peak <= bound ? "met" : "NOT met", peak, bound,
	       arrpub_ratio >= 0.95 ? "met" : "NOT met", arrpub_ratio,
	       arr_ratio >= 0.8 ? "met" : "NOT met", arr_ratio);
	free(tokens);
	model_free(m);
	if (!getenv("BENCH_KEEP")) /* BENCH_KEEP=1 keeps the daemon's log and store */
		benchutil_rm_rf(dir);
	return 0;
}
