/* bench/k3conv: a K3-shape conversation (69 KDA x 6.5625 MiB, 24 MLA of
 * k_row 512 and v_row 64), 8 turns growing by 2,048 tokens to 16,384, each
 * turn published as a delta of the one before, against a real daemon.
 * Reports stored and received bytes against the ideal (every entry's KDA
 * layers and MLA header words, plus one copy of the MLA rows of every token
 * position), the publish time of the last turn against the first, and the
 * restore of the last turn.
 *
 * The daemon runs with its default stage size (16 MiB), so every snapshot
 * here is staged: its stream written a stage per commit, its blocks placed
 * a stage at a time. BENCH_STAGE_SIZE=SIZE sets another (4GiB: every
 * snapshot in one transaction, for comparison).
 * Each turn's publish time is the median over BENCH_ROUNDS conversations
 * (default 3), each on a fresh daemon and store.
 * usage: bench_k3conv DIR [ROW_BLOCK] */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchutil.h"
#include "k3cache/k3cache.h"
#include "k3shape.h"

#define TURNS      8
#define STEP       2048u
#define MAX_ROUNDS 16

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, long n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static pid_t daemon_pid;
static const char *row_block;
static const char *stage_size = "16MiB"; /* the daemon's default */
static const char *durability = "safe";  /* the daemon's default */

static void die(const char *what, const struct k3cache_error *e)
{
	fprintf(stderr, "bench_k3conv: %s: %s\n", what, e ? e->message : strerror(errno));
	if (daemon_pid > 0)
		kill(daemon_pid, SIGKILL);
	exit(1);
}

static struct k3cache *start(const char *dir, char *sock, size_t socksz)
{
	char db[4096], log[4096];
	snprintf(db, sizeof(db), "%s/db", dir);
	snprintf(sock, socksz, "%s/s.sock", dir);
	snprintf(log, sizeof(log), "%s/k3cached.log", dir);
	const char *args[] = {K3_DAEMON_PATH, "--db",           db,        "--socket",
	                      sock,           "--max-bytes",    "16GiB",   "--max-payload",
	                      "4GiB",         "--max-inflight", "2GiB",    "--stage-size",
	                      stage_size,     "--row-block",    row_block, "--durability",
	                      durability,     "--log-level",    "warn",    NULL};
	fflush(stdout);
	daemon_pid = fork();
	if (daemon_pid < 0)
		die("fork", NULL);
	if (daemon_pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execv(args[0], (char *const *)args);
		_exit(127);
	}
	struct k3cache_error e = {0};
	for (int i = 0; i < 1000; i++) {
		struct k3cache *c;
		if (k3cache_connect(sock, &c, &e) == 0) {
			k3cache_set_timeout(c, 600000);
			return c;
		}
		struct timespec ts = {0, 10000000L};
		nanosleep(&ts, NULL);
	}
	die("connect", &e);
	return NULL;
}

static uint64_t counter(struct k3cache *c, const char *name)
{
	uint64_t v = 0;
	struct k3cache_error e;
	if (k3cache_stat_counter(c, name, &v, &e) != 0)
		die(name, &e);
	return v;
}

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: bench_k3conv DIR [ROW_BLOCK]\n");
		return 2;
	}
	row_block = argc == 3 ? argv[2] : "64";
	if (getenv("BENCH_STAGE_SIZE"))
		stage_size = getenv("BENCH_STAGE_SIZE");
	if (getenv("BENCH_DURABILITY"))
		durability = getenv("BENCH_DURABILITY");
	const char *dir = argv[1];
	benchutil_rm_rf(dir);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		die(dir, NULL);
	char sock[4096], err[MODEL_ERROR_MAX];
	struct k3cache *c = start(dir, sock, sizeof(sock));
	struct k3cache_model *m = k3shape_model("k3-shape-conversation", 69, 24, err);
	struct k3cache_error e;
	if (!m || k3cache_put_model(c, m, NULL, &e) != 0)
		die("put model", &e);
	uint32_t *tokens = malloc((size_t)TURNS * STEP * sizeof(uint32_t));
	for (uint32_t i = 0; i < TURNS * STEP; i++)
		tokens[i] = 100 + (i * 2654435761u) % 150000u;
	struct k3cache_buf *bufs = calloc(m->n_layers, sizeof(*bufs));
	uint8_t key[TURNS][K3CACHE_KEY_LEN];
	/* BENCH_ROUNDS=N: the conversation N times, each on a fresh daemon and
	 * store; each turn's publish time is the median over the rounds (one
	 * turn's time varies by seconds with the disk's write-back) */
	const char *rounds_env_c = getenv("BENCH_ROUNDS");
	long n_rounds = rounds_env_c ? strtol(rounds_env_c, NULL, 10) : 3;
	if (n_rounds < 1 || n_rounds > MAX_ROUNDS)
		n_rounds = 3;
	double secs[MAX_ROUNDS][TURNS] = {{0}}, med[TURNS] = {0};
	uint32_t delta[TURNS] = {0};
	uint64_t whole_of[TURNS] = {0};
	uint64_t kda_bytes = 0, mla_row = 0, logical_last = 0;
	for (uint32_t i = 0; i < m->n_layers; i++) {
		if (m->layers[i].mixer == MODEL_MIXER_KDA)
			kda_bytes += model_layer_blob_size(&m->layers[i], 0);
		else
			mla_row += (uint64_t)(m->layers[i].k_row + m->layers[i].v_row) * 4;
	}
	uint32_t n_mla = 24;
	const char *warm_env = getenv("BENCH_WARM");
	int warm = !warm_env || strcmp(warm_env, "0") != 0;
	/* what a turn stores, and a quarter more */
	uint64_t warm_bytes = (kda_bytes + (uint64_t)STEP * mla_row) / 4 * 5;
	printf("bench/k3conv: K3 shape, %d turns of +%u tokens, each a delta of the last; row "
	       "block %s, stage size %s, durability %s; %ld rounds; page cache %s\n",
	       TURNS, STEP, row_block, stage_size, durability, n_rounds,
	       warm ? "warmed before each turn" : "cold (BENCH_WARM=0)");
	for (long round = 0; round < n_rounds; round++) {
		if (round) { /* a fresh daemon and store */
			k3cache_close(c);
			kill(daemon_pid, SIGTERM);
			int status;
			waitpid(daemon_pid, &status, 0);
			benchutil_rm_rf(dir);
			if (mkdir(dir, 0755) != 0 && errno != EEXIST)
				die(dir, NULL);
			c = start(dir, sock, sizeof(sock));
			if (k3cache_put_model(c, m, NULL, &e) != 0)
				die("put model", &e);
		}
		for (int t = 0; t < TURNS; t++) {
			uint32_t p = (uint32_t)(t + 1) * STEP;
			uint64_t whole = 0;
			for (uint32_t i = 0; i < m->n_layers; i++) {
				size_t len;
				unsigned char *b = k3shape_blob(&m->layers[i], i, p, 1, &len);
				if (!b)
					die("out of memory", NULL);
				bufs[i].data = b;
				bufs[i].len = len;
				whole += len;
			}
			struct k3cache_publish_result res;
			/* the turn's new bytes go into pages the guest has used
			 * (BENCH_WARM=0: fresh pages, as they come) */
			if (warm && benchutil_warm_page_cache(dir, warm_bytes) != 0)
				die("warming the page cache", NULL);
			double t0 = benchutil_now();
			int rc = t ? k3cache_publish_delta(c, m->fingerprint, "", 0, tokens, p,
			                                   bufs, m->n_layers, key[t - 1], p - STEP,
			                                   &res, &e)
			           : k3cache_publish(c, m->fingerprint, "", 0, tokens, p, bufs,
			                             m->n_layers, &res, &e);
			secs[round][t] = benchutil_now() - t0;
			if (rc)
				die("publish", &e);
			memcpy(key[t], res.key, K3CACHE_KEY_LEN);
			delta[t] = res.delta_rows;
			logical_last = whole;
			whole_of[t] = whole;
			for (uint32_t i = 0; i < m->n_layers; i++)
				free((void *)bufs[i].data);
		}
	}
	printf("%-6s %8s %10s %12s %10s %10s  %s\n", "turn", "tokens", "whole GiB",
	       "sent rows from", "publish s", "GB/s*", "each round, s");
	for (int t = 0; t < TURNS; t++) {
		double v[MAX_ROUNDS] = {0};
		for (long r = 0; r < n_rounds; r++)
			v[r] = secs[r][t];
		med[t] = median(v, n_rounds);
		printf("%-6d %8u %10.2f %12u %10.2f %10.2f ", t + 1, (t + 1) * STEP,
		       (double)whole_of[t] / (1 << 30), delta[t], med[t],
		       (double)whole_of[t] / med[t] / 1e9);
		for (long r = 0; r < n_rounds; r++)
			printf(" %.2f", secs[r][t]);
		printf("\n");
	}
	printf("(* the snapshot's whole bytes over the median publish time)\n");
	/* the restore of the last turn, into pre-touched buffers */
	void **out = calloc(m->n_layers, sizeof(void *));
	size_t *caps = calloc(m->n_layers, sizeof(size_t)),
	       *lens = calloc(m->n_layers, sizeof(size_t));
	for (uint32_t i = 0; i < m->n_layers; i++) {
		caps[i] = (size_t)model_layer_blob_size(&m->layers[i], TURNS * STEP);
		out[i] = malloc(caps[i]);
		memset(out[i], 0, caps[i]);
	}
	double best = 1e9;
	long rounds = benchutil_restore_rounds(3);
	for (long r = 0; r < rounds; r++) {
		uint32_t got = 0;
		double t0 = benchutil_now();
		if (k3cache_restore_into(c, m, key[TURNS - 1], out, caps, lens, &got, &e) != 0)
			die("restore", &e);
		double s = benchutil_now() - t0;
		best = s < best ? s : best;
	}
	uint64_t stored = counter(c, "bytes"), logical = counter(c, "logical_bytes");
	uint64_t in = counter(c, "bytes_in"), blocks = counter(c, "blocks");
	uint64_t mism = counter(c, "blocks_mismatched"), refused = counter(c, "delta_refused");
	uint64_t ideal = (uint64_t)TURNS * (kda_bytes + (uint64_t)13 * n_mla) +
	                 (uint64_t)TURNS * STEP * mla_row;
	printf("\n%-44s %10s  %s\n", "figure", "measured", "target");
	printf("%-44s %9.2fx  <= 1.1x\n", "stored bytes / ideal", (double)stored / (double)ideal);
	printf("%-44s %9.2fx  <= 1.3x\n", "bytes received over the socket / ideal",
	       (double)in / (double)ideal);
	printf("%-44s %9.2fx  <= 1.5x\n", "publish time, last turn / first (medians)",
	       med[TURNS - 1] / med[0]);
	printf("%-44s %9.2f   GB/s, %.2f GiB (no raw-socket baseline here: bench/wire)\n",
	       "restore of the last turn, validated", (double)logical_last / best / 1e9,
	       (double)logical_last / (1 << 30));
	printf("\nstored %.2f GiB, logical %.2f GiB, ideal %.2f GiB, received %.2f GiB; %llu "
	       "blocks, %llu mismatched, %llu deltas refused\n",
	       (double)stored / (1 << 30), (double)logical / (1 << 30), (double)ideal / (1 << 30),
	       (double)in / (1 << 30), (unsigned long long)blocks, (unsigned long long)mism,
	       (unsigned long long)refused);
	k3cache_close(c);
	kill(daemon_pid, SIGTERM);
	int status;
	waitpid(daemon_pid, &status, 0);
	benchutil_rm_rf(dir);
	return 0;
}
