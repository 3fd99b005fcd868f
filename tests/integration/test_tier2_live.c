/* tier2: put, longest prefix and get against a real 3-master Redis Cluster
 * started here (clusterutil.h), with blobs of the twin model: shared
 * prefixes found exactly (a prompt that diverges mid-block, one of none),
 * exact bytes back, a 30 MB entry's chunks on every node, a chunk
 * overwritten (damaged) or deleted (missing), a re-publish, other salts and
 * namespaces blind to the entry, expiries. Without redis-server and
 * redis-cli on PATH: skipped (exit 77). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checksum.h"
#include "model.h"
#include "prefix.h"
#include "tier2util.h"

static struct clusterutil cl;
static struct k3cache_model *twin;
static uint8_t fp[32];

#define CONV_LEN 4000u
static uint32_t conv[CONV_LEN]; /* one conversation's tokens */

static struct cluster_router *router(void)
{
	return tier2util_router(&cl);
}

/* The twin's blobs at prefix p, as tier2 blobs (s owns the bytes). */
static struct tier2_blob *blobs_of(struct storeutil_snap *s, uint32_t p, uint32_t seed)
{
	*s = storeutil_snap(twin, p, seed);
	return tier2util_blobs(s);
}

static void put(struct cluster_router *r, const char *ns, const char *salt, const uint32_t *tok,
                uint32_t p, uint32_t seed, const struct tier2_put_options *o,
                struct tier2_stats *stats)
{
	struct storeutil_snap s;
	struct tier2_blob *b = blobs_of(&s, p, seed);
	char err[512] = "";
	enum tier2_status st = tier2_put(r, ns, fp, salt, strlen(salt), tok, p, b, s.n, o, stats,
	                                 err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("put %u tokens: %s: %s", p, tier2_status_name(st), err);
	free(b);
	storeutil_snap_free(&s);
}

static uint32_t longest(struct cluster_router *r, const char *ns, const char *salt,
                        const uint32_t *tok, uint32_t n, uint8_t key[32], struct tier2_stats *st)
{
	char err[512] = "";
	uint32_t p = UINT32_MAX;
	enum tier2_status rc =
	        tier2_longest(r, ns, fp, salt, strlen(salt), tok, n, key, &p, st, err, sizeof(err));
	if (rc != TIER2_OK)
		fail_msg("longest of %u tokens: %s: %s", n, tier2_status_name(rc), err);
	return p;
}

/* get must return exactly the twin's blobs at p with seed. */
static void get_exact(struct cluster_router *r, const char *ns, const uint8_t key[32],
                      const uint32_t *tok, uint32_t p, uint32_t seed, struct tier2_stats *stats)
{
	struct tier2_entry e;
	char err[512] = "";
	enum tier2_status st = tier2_get(r, ns, key, &e, stats, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("get of %u tokens: %s: %s", p, tier2_status_name(st), err);
	struct storeutil_snap s = storeutil_snap(twin, p, seed);
	assert_int_equal(e.prefix_len, p);
	assert_memory_equal(e.tokens, tok, (size_t)p * 4u);
	assert_memory_equal(e.fingerprint, fp, 32);
	assert_int_equal(e.n_blobs, s.n);
	for (uint32_t i = 0; i < s.n; i++) {
		assert_int_equal(e.blobs[i].size, s.blobs[i].size);
		assert_memory_equal(e.blobs[i].data, s.blobs[i].data, s.blobs[i].size);
		assert_int_equal(e.blobs[i].xxh3, s.blobs[i].xxh3);
	}
	storeutil_snap_free(&s);
	tier2_entry_free(&e);
}

static enum tier2_status get_status(struct cluster_router *r, const char *ns, const uint8_t key[32],
                                    struct tier2_stats *stats, char *err, size_t errsz)
{
	struct tier2_entry e;
	enum tier2_status st = tier2_get(r, ns, key, &e, stats, err, errsz);
	if (st == TIER2_OK)
		tier2_entry_free(&e);
	else
		assert_null(e.blobs);
	return st;
}

/* A command on the cluster through the router: its reply (the caller frees). */
static redisReply *cmd(struct cluster_router *r, int argc, const char **argv)
{
	size_t lens[8];
	for (int i = 0; i < argc; i++)
		lens[i] = strlen(argv[i]);
	redisReply *rep = NULL;
	if (cluster_command_argv(r, argv[1], lens[1], argc, argv, lens, &rep) != 0)
		fail_msg("%s %s: %s", argv[0], argv[1], cluster_error(r));
	return rep;
}

/* The record of key, decoded. */
static void record_of(struct cluster_router *r, const char *ns, const uint8_t key[32],
                      struct tier2_record *rec)
{
	char name[TIER2_NAME_MAX], err[320] = "";
	tier2_name_record(name, ns, key);
	const char *argv[] = {"GET", name};
	redisReply *rep = cmd(r, 2, argv);
	assert_int_equal(rep->type, REDIS_REPLY_STRING);
	if (tier2_record_decode(rep->str, rep->len, rec, err, sizeof(err)) != 0)
		fail_msg("record: %s", err);
	freeReplyObject(rep);
}

static void test_shared_prefixes(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	put(r, "live", "salt-a", conv, 40, 40, NULL, &st);
	put(r, "live", "salt-a", conv, 100, 100, NULL, &st);
	put(r, "live", "salt-a", conv, 250, 250, NULL, &st);
	assert_int_equal(st.puts, 3);
	assert_true(st.bytes_out > (uint64_t)3 * 6 * 45000);
	const struct {
		uint32_t n, want;
	} cases[] = {{0, 0},     {1, 0},     {10, 0},    {16, 0},    {39, 0},    {40, 40},
	             {41, 40},   {47, 40},   {48, 40},   {99, 40},   {100, 100}, {101, 100},
	             {249, 100}, {250, 250}, {251, 250}, {4000, 250}};
	uint8_t key[32], k40[32], k100[32], k250[32];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint32_t p = longest(r, "live", "salt-a", conv, cases[i].n, key, &st);
		if (p != cases[i].want)
			fail_msg("prompt of %u tokens: longest %u, want %u", cases[i].n, p,
			         cases[i].want);
	}
	assert_int_equal(longest(r, "live", "salt-a", conv, 40, k40, &st), 40);
	assert_int_equal(longest(r, "live", "salt-a", conv, 100, k100, &st), 100);
	assert_int_equal(longest(r, "live", "salt-a", conv, 250, k250, &st), 250);
	uint8_t want[32];
	assert_int_equal(prefix_key(fp, "salt-a", 6, conv, 250, want), 0);
	assert_memory_equal(k250, want, 32);
	/* prompts that diverge from the conversation mid-block */
	uint32_t *alt = malloc(sizeof(conv));
	const struct {
		uint32_t at, want;
	} div[] = {{105, 100}, {100, 100}, {99, 40}, {45, 40},
	           {40, 40},   {20, 0},    {0, 0},   {249, 100}};
	for (size_t i = 0; i < sizeof(div) / sizeof(div[0]); i++) {
		memcpy(alt, conv, sizeof(conv));
		alt[div[i].at] ^= 0x5a5a5a;
		uint32_t p = longest(r, "live", "salt-a", alt, 300, key, &st);
		if (p != div[i].want)
			fail_msg("diverging at %u: longest %u, want %u", div[i].at, p, div[i].want);
	}
	free(alt);
	/* exact bytes back */
	get_exact(r, "live", k40, conv, 40, 40, &st);
	get_exact(r, "live", k100, conv, 100, 100, &st);
	get_exact(r, "live", k250, conv, 250, 250, &st);
	assert_int_equal(st.hits, 3);
	/* another salt, another namespace: blind to the entries */
	assert_int_equal(longest(r, "live", "salt-b", conv, 300, key, &st), 0);
	assert_int_equal(longest(r, "live", "", conv, 300, key, &st), 0);
	assert_int_equal(longest(r, "other", "salt-a", conv, 300, key, &st), 0);
	char err[512] = "";
	assert_int_equal(get_status(r, "other", k250, &st, err, sizeof(err)), TIER2_MISSING);
	assert_non_null(strstr(err, "k3:other:e:"));
	assert_int_equal(st.miss_missing, 1);
	/* the namespace is checked */
	assert_int_equal(get_status(r, "a{b}", k250, &st, err, sizeof(err)), TIER2_INVALID);
	/* an entry shorter than a block, and one on a block boundary */
	put(r, "live", "salt-a", conv, 7, 7, NULL, &st);
	put(r, "live", "salt-a", conv, 32, 32, NULL, &st);
	assert_int_equal(longest(r, "live", "salt-a", conv, 6, key, &st), 0);
	assert_int_equal(longest(r, "live", "salt-a", conv, 7, key, &st), 7);
	assert_int_equal(longest(r, "live", "salt-a", conv, 31, key, &st), 7);
	assert_int_equal(longest(r, "live", "salt-a", conv, 32, key, &st), 32);
	assert_int_equal(longest(r, "live", "salt-a", conv, 39, key, &st), 32);
	get_exact(r, "live", key, conv, 32, 32, &st);
	cluster_router_free(r);
}

/* A prompt whose nearest entry lies far above its deepest index node (a
 * prefix of a 2,048-token entry; the only shorter entry is 40 tokens): the
 * walk up reads the nodes in growing trips, so the lookup takes a few round
 * trips, where it took one per 8 nodes (16 for these 124 nodes). */
static void test_walk_trips(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	put(r, "walk", "w", conv, 40, 40, NULL, &st);
	put(r, "walk", "w", conv, 2048, 41, NULL, &st);
	uint8_t key[32], want[32];
	st.lookup_trips = 0;
	assert_int_equal(longest(r, "walk", "w", conv, 2000, key, &st), 40);
	assert_int_equal(prefix_key(fp, "w", 1, conv, 40, want), 0);
	assert_memory_equal(key, want, 32);
	print_message("a lookup walking 124 nodes: %llu round trips\n",
	              (unsigned long long)st.lookup_trips);
	assert_true(st.lookup_trips <= 10);
	/* and nothing at all below: the walk reaches the root */
	st.lookup_trips = 0;
	assert_int_equal(longest(r, "walk", "other", conv, 2000, key, &st), 0);
	put(r, "walk", "v", conv, 2048, 42, NULL, &st);
	st.lookup_trips = 0;
	assert_int_equal(longest(r, "walk", "v", conv, 2000, key, &st), 0);
	assert_true(st.lookup_trips <= 10);
	cluster_router_free(r);
}

static void test_big_entry_spreads(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	/* 3000 tokens of the twin: 2 MLA layers of 5120 bytes a token, 30 chunks */
	put(r, "big", "s", conv, 3000, 3, NULL, &st);
	uint8_t key[32];
	assert_int_equal(longest(r, "big", "s", conv, 3500, key, &st), 3000);
	struct tier2_record rec;
	record_of(r, "big", key, &rec);
	assert_int_equal(rec.chunk_size, TIER2_CHUNK_MAX);
	assert_true(rec.n_chunks >= 29);
	int on[CLUSTERUTIL_MAX] = {0};
	for (uint32_t i = 0; i < rec.n_chunks; i++) {
		char name[TIER2_NAME_MAX];
		size_t n = tier2_name_chunk(name, "big", key, rec.generation, i);
		struct cluster_addr a;
		assert_int_equal(cluster_slot_node(r, cluster_key_slot(name, n), &a), 0);
		int node = clusterutil_index(&cl, a.port);
		assert_true(node >= 0);
		on[node]++;
	}
	for (int i = 0; i < cl.n; i++)
		if (!on[i])
			fail_msg("no chunk of %u on node %d", rec.n_chunks, cl.port[i]);
	uint64_t in = st.bytes_in;
	get_exact(r, "big", key, conv, 3000, 3, &st);
	assert_true(st.bytes_in - in > (uint64_t)(rec.n_chunks - 1) << 20);
	tier2_record_free(&rec);
	cluster_router_free(r);
}

static void test_damage_and_eviction(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	put(r, "dmg", "s", conv, 400, 9, NULL, &st); /* ~4 MB: 4 chunks */
	uint8_t key[32];
	assert_int_equal(longest(r, "dmg", "s", conv, 400, key, &st), 400);
	struct tier2_record rec;
	record_of(r, "dmg", key, &rec);
	assert_true(rec.n_chunks >= 3);
	char name[TIER2_NAME_MAX], err[512] = "";
	/* a chunk overwritten in place: same length, wrong sum */
	tier2_name_chunk(name, "dmg", key, rec.generation, 1);
	const char *setrange[] = {"SETRANGE", name, "1000", "XXXX"};
	freeReplyObject(cmd(r, 4, setrange));
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_DAMAGED);
	assert_non_null(strstr(err, name));
	assert_non_null(strstr(err, "XXH3"));
	assert_int_equal(st.miss_damaged, 1);
	/* made longer */
	const char *append[] = {"APPEND", name, "!"};
	freeReplyObject(cmd(r, 3, append));
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_DAMAGED);
	assert_non_null(strstr(err, "bytes, the record says"));
	/* a re-publish: a new generation, the old chunks deleted */
	put(r, "dmg", "s", conv, 400, 9, NULL, &st);
	assert_int_equal(st.old_chunks_del, rec.n_chunks);
	const char *exists[] = {"EXISTS", name};
	redisReply *rep = cmd(r, 2, exists);
	assert_int_equal(rep->integer, 0);
	freeReplyObject(rep);
	get_exact(r, "dmg", key, conv, 400, 9, &st);
	tier2_record_free(&rec);
	record_of(r, "dmg", key, &rec);
	/* the last chunk cut short */
	tier2_name_chunk(name, "dmg", key, rec.generation, rec.n_chunks - 1);
	const char *getv[] = {"GET", name};
	rep = cmd(r, 2, getv);
	assert_int_equal(rep->type, REDIS_REPLY_STRING);
	const char *set[] = {"SET", name, rep->str};
	size_t set_len[] = {3, strlen(name), rep->len - 1};
	redisReply *ok = NULL;
	assert_int_equal(cluster_command_argv(r, name, strlen(name), 3, set, set_len, &ok), 0);
	assert_int_equal(ok->type, REDIS_REPLY_STATUS);
	freeReplyObject(ok);
	freeReplyObject(rep);
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_DAMAGED);
	/* a chunk deleted (an eviction) */
	put(r, "dmg", "s", conv, 400, 9, NULL, &st);
	tier2_record_free(&rec);
	record_of(r, "dmg", key, &rec);
	tier2_name_chunk(name, "dmg", key, rec.generation, 0);
	const char *del[] = {"DEL", name};
	freeReplyObject(cmd(r, 2, del));
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_MISSING);
	assert_non_null(strstr(err, "not in the cluster"));
	assert_int_equal(st.miss_missing, 1);
	/* the record damaged: a miss; the lookup skips it */
	put(r, "dmg", "s", conv, 400, 9, NULL, &st);
	tier2_name_record(name, "dmg", key);
	const char *rdmg[] = {"SETRANGE", name, "60", "\x7f"};
	freeReplyObject(cmd(r, 4, rdmg));
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_DAMAGED);
	assert_non_null(strstr(err, "tier2 record"));
	uint64_t stale = st.stale;
	assert_int_equal(longest(r, "dmg", "s", conv, 400, key, &st), 0);
	assert_int_equal(st.stale, stale + 1);
	/* the record gone: lookups miss, gets miss */
	freeReplyObject(cmd(r, 2, (const char *[]){"DEL", name}));
	assert_int_equal(longest(r, "dmg", "s", conv, 400, key, &st), 0);
	assert_int_equal(prefix_key(fp, "s", 1, conv, 400, key), 0);
	assert_int_equal(get_status(r, "dmg", key, &st, err, sizeof(err)), TIER2_MISSING);
	assert_int_equal(st.miss_damaged, 4);
	assert_int_equal(st.miss_missing, 2);
	tier2_record_free(&rec);
	cluster_router_free(r);
}

/* The integer VERB NAME answers (TTL, SCARD, LLEN...). */
static long long int_reply(struct cluster_router *r, const char *verb, const char *name)
{
	const char *argv[] = {verb, name};
	redisReply *rep = cmd(r, 2, argv);
	assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
	long long v = rep->integer;
	freeReplyObject(rep);
	return v;
}

static long long ttl_of(struct cluster_router *r, const char *name)
{
	return int_reply(r, "TTL", name);
}

static void test_expiry_and_small_chunks(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	/* chunks of 1000 bytes (spanning layers), 3 in flight, an expiry */
	struct tier2_put_options o = {.ttl_s = 600, .chunk_size = 1000, .max_in_flight = 3};
	put(r, "ttl", "s", conv, 50, 5, &o, &st);
	uint8_t key[32];
	assert_int_equal(longest(r, "ttl", "s", conv, 60, key, &st), 50);
	get_exact(r, "ttl", key, conv, 50, 5, &st);
	struct tier2_record rec;
	record_of(r, "ttl", key, &rec);
	assert_int_equal(rec.chunk_size, 1000);
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, "ttl", key);
	assert_true(ttl_of(r, name) > 500);
	tier2_name_chunk(name, "ttl", key, rec.generation, rec.n_chunks - 1);
	assert_true(ttl_of(r, name) > 500);
	uint8_t h[4][16];
	prefix_block_hashes(fp, "s", 1, conv, 50, h);
	for (int d = 1; d <= 3; d++) {
		tier2_name_node(name, "ttl", h[d]);
		assert_true(ttl_of(r, name) > 500);
	}
	/* the index nodes are shared: a put with a shorter expiry whose path
	 * crosses them leaves them theirs (it cut them to 60 s); one without
	 * an expiry takes theirs away, and a later expiry gives none back */
	struct tier2_put_options brief = {.ttl_s = 60, .chunk_size = 1000};
	put(r, "ttl", "s", conv, 49, 5, &brief, &st);
	for (int d = 1; d <= 3; d++) {
		tier2_name_node(name, "ttl", h[d]);
		assert_true(ttl_of(r, name) > 500);
	}
	put(r, "ttl", "s", conv, 48, 5, NULL, &st);
	put(r, "ttl", "s", conv, 49, 6, &brief, &st);
	for (int d = 1; d <= 3; d++) {
		tier2_name_node(name, "ttl", h[d]);
		assert_int_equal(ttl_of(r, name), -1);
	}
	assert_int_equal(longest(r, "ttl", "s", conv, 60, key, &st), 50);
	/* a caller that takes at most one byte less than the entry: refused
	 * before a chunk is read; exactly its size: served */
	uint64_t total = 0;
	for (uint32_t i = 0; i < rec.n_layers; i++)
		total += rec.layers[i].size;
	struct tier2_stats before = st;
	struct tier2_entry e;
	char err[512] = "";
	assert_int_equal(tier2_get_max(r, "ttl", key, total - 1, &e, &st, err, sizeof(err)),
	                 TIER2_TOO_LARGE);
	assert_null(e.blobs);
	assert_non_null(strstr(err, "over the"));
	assert_int_equal(st.miss_too_large, before.miss_too_large + 1);
	assert_true(st.bytes_in - before.bytes_in < total / 10); /* the record alone */
	uint64_t in_before = st.bytes_in;
	assert_int_equal(tier2_get_max(r, "ttl", key, total, &e, &st, err, sizeof(err)), TIER2_OK);
	assert_true(st.bytes_in - in_before >= total);
	tier2_entry_free(&e);
	tier2_record_free(&rec);
	/* without an expiry: none */
	put(r, "ttl", "s", conv, 20, 5, NULL, &st);
	assert_int_equal(longest(r, "ttl", "s", conv, 20, key, &st), 20);
	tier2_name_record(name, "ttl", key);
	assert_int_equal(ttl_of(r, name), -1);
	cluster_router_free(r);
}

static void test_cluster_unreachable(void **state)
{
	(void)state;
	int port = clusterutil_pick_port(&cl);
	char seeds[64], err[512] = "";
	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", port);
	struct cluster_options o = {.connect_timeout_ms = 200, .command_timeout_ms = 200};
	struct cluster_router *r = cluster_router_new(seeds, &o, err, sizeof(err));
	assert_non_null(r);
	struct tier2_stats st = {0};
	uint8_t key[32] = {0};
	uint32_t p = 1;
	enum tier2_status rc = tier2_longest(r, "live", fp, "salt-a", 6, conv, 300, key, &p, &st,
	                                     err, sizeof(err));
	assert_int_equal(rc, TIER2_NODE_ERROR);
	assert_int_equal(p, 0);
	assert_non_null(strstr(err, "tier2: probing the prefix index"));
	assert_int_equal(get_status(r, "live", key, &st, err, sizeof(err)), TIER2_NODE_ERROR);
	assert_int_equal(st.miss_node, 1);
	struct storeutil_snap s;
	struct tier2_blob *b = blobs_of(&s, 20, 1);
	assert_int_equal(
	        tier2_put(r, "live", fp, "s", 1, conv, 20, b, s.n, NULL, &st, err, sizeof(err)),
	        TIER2_NODE_ERROR);
	assert_int_equal(st.put_failures, 1);
	free(b);
	storeutil_snap_free(&s);
	cluster_router_free(r);
}

/* Keys matching pattern on every master (SCAN through the router). */
static size_t count_keys(struct cluster_router *r, const char *pattern)
{
	size_t total = 0, masters = cluster_n_masters(r);
	assert_int_equal(masters, (size_t)cl.n);
	for (size_t m = 0; m < masters; m++) {
		char cursor[CLUSTER_CURSOR_MAX + 1] = "0", err[256] = "";
		do {
			const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
			size_t lens[6] = {4, strlen(cursor), 5, strlen(pattern), 5, 4};
			redisReply *rep = NULL;
			if (cluster_command_node(r, m, 6, argv, lens, &rep) != 0)
				fail_msg("SCAN on master %zu: %s", m, cluster_error(r));
			const redisReply *keys = NULL;
			char next[CLUSTER_CURSOR_MAX + 1];
			if (cluster_scan_parse(rep, next, &keys, err, sizeof(err)) != 0)
				fail_msg("SCAN on master %zu: %s", m, err);
			total += keys->elements;
			memcpy(cursor, next, sizeof(next));
			freeReplyObject(rep);
		} while (strcmp(cursor, "0") != 0);
	}
	return total;
}

/* A source over a snapshot's blobs that copies in odd-sized pieces and can
 * fail at a byte. */
struct odd_src {
	const struct storeutil_snap *s;
	uint32_t layer;
	size_t off;
	uint64_t pos, fail_at; /* fail_at 0: never */
	unsigned reads;
};

static int odd_read(void *ctx, void *dst, size_t len, char *err, size_t errsz)
{
	static const size_t steps[] = {7, 13, 1, 1001, 64, 333, 4096};
	struct odd_src *o = ctx;
	unsigned char *d = dst;
	o->reads++;
	if (o->fail_at && o->pos + len > o->fail_at) {
		snprintf(err, errsz, "the store says no at byte %llu",
		         (unsigned long long)o->fail_at);
		return -1;
	}
	for (size_t k = 0; len > 0; k++) {
		if (o->layer == o->s->n) {
			snprintf(err, errsz, "past the end");
			return -1;
		}
		size_t take = steps[k % (sizeof(steps) / sizeof(steps[0]))];
		size_t left = o->s->blobs[o->layer].size - o->off;
		take = take < left ? take : left;
		take = take < len ? take : len;
		memcpy(d, o->s->bufs[o->layer] + o->off, take);
		d += take;
		len -= take;
		o->off += take;
		o->pos += take;
		if (o->off == o->s->blobs[o->layer].size) {
			o->layer++;
			o->off = 0;
		}
	}
	return 0;
}

/* put_from of the twin's blobs at p with seed through an odd source. */
static enum tier2_status put_from(struct cluster_router *r, const char *ns, const uint32_t *tok,
                                  uint32_t p, uint32_t seed, uint64_t fail_at, uint32_t bad_layer,
                                  const struct tier2_put_options *o, struct tier2_put_result *res,
                                  struct tier2_stats *stats, unsigned *reads, char *err,
                                  size_t errsz)
{
	struct storeutil_snap s = storeutil_snap(twin, p, seed);
	struct tier2_layer *layers = calloc(s.n, sizeof(*layers));
	for (uint32_t i = 0; i < s.n; i++)
		layers[i] = (struct tier2_layer){s.blobs[i].size, s.blobs[i].xxh3, 0};
	if (bad_layer < s.n)
		layers[bad_layer].xxh3 ^= 1;
	struct odd_src os = {.s = &s, .fail_at = fail_at};
	struct tier2_source src = {odd_read, &os};
	enum tier2_status st = tier2_put_from(r, ns, fp, "s", 1, tok, p, layers, s.n, &src, o, res,
	                                      stats, err, errsz);
	if (reads)
		*reads = os.reads;
	free(layers);
	storeutil_snap_free(&s);
	return st;
}

static void test_put_from_source(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	struct tier2_put_result res;
	char err[512] = "";
	unsigned reads = 0;
	/* chunks of an odd size, so they straddle layers, 3 in flight */
	struct tier2_put_options o = {.chunk_size = 4099, .max_in_flight = 3};
	enum tier2_status rc = put_from(r, "src", conv, 60, 6, 0, UINT32_MAX, &o, &res, &st, &reads,
	                                err, sizeof(err));
	if (rc != TIER2_OK)
		fail_msg("put_from: %s: %s", tier2_status_name(rc), err);
	uint8_t key[32];
	assert_int_equal(longest(r, "src", "s", conv, 100, key, &st), 60);
	get_exact(r, "src", key, conv, 60, 6, &st);
	struct tier2_record rec;
	record_of(r, "src", key, &rec);
	assert_int_equal(res.existed, 0);
	assert_int_equal(res.generation, rec.generation);
	assert_int_equal(res.n_chunks, rec.n_chunks);
	assert_int_equal(rec.chunk_size, 4099);
	uint64_t total = 0;
	for (uint32_t i = 0; i < rec.n_layers; i++)
		total += rec.layers[i].size;
	assert_int_equal(res.bytes, total);
	assert_int_equal(reads, rec.n_chunks); /* one read a chunk */
	assert_int_equal(st.puts, 1);

	/* keep_existing: the same entry is there: nothing read, nothing written */
	o.keep_existing = 1;
	rc = put_from(r, "src", conv, 60, 6, 0, UINT32_MAX, &o, &res, &st, &reads, err,
	              sizeof(err));
	assert_int_equal(rc, TIER2_OK);
	assert_int_equal(res.existed, 1);
	assert_int_equal(res.generation, rec.generation);
	assert_int_equal(res.n_chunks, rec.n_chunks);
	assert_int_equal(res.bytes, total);
	assert_int_equal(reads, 0);
	assert_int_equal(st.put_existing, 1);
	assert_int_equal(st.puts, 1);
	struct tier2_record again;
	record_of(r, "src", key, &again);
	assert_int_equal(again.generation, rec.generation);
	tier2_record_free(&again);
	/* without it, a re-publish: a new generation */
	o.keep_existing = 0;
	assert_int_equal(put_from(r, "src", conv, 60, 6, 0, UINT32_MAX, &o, &res, &st, NULL, err,
	                          sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(res.existed, 0);
	assert_true(res.generation != rec.generation);
	assert_int_equal(st.old_chunks_del, rec.n_chunks);
	get_exact(r, "src", key, conv, 60, 6, &st);
	uint64_t live_gen = res.generation;
	tier2_record_free(&rec);

	/* a source that fails midway: nothing of the new generation is left,
	 * and the entry already there is untouched */
	size_t before = count_keys(r, "k3:src:*");
	uint64_t undone = st.undone_chunks_del, failures = st.put_failures;
	rc = put_from(r, "src", conv, 60, 7, total / 2, UINT32_MAX, &o, &res, &st, NULL, err,
	              sizeof(err));
	assert_int_equal(rc, TIER2_DAMAGED);
	assert_non_null(strstr(err, "the source failed at byte"));
	assert_non_null(strstr(err, "the store says no"));
	assert_int_equal(res.generation, 0);
	assert_true(st.undone_chunks_del - undone >= 3); /* at least a window was written */
	assert_int_equal(st.put_failures, failures + 1);
	assert_int_equal(count_keys(r, "k3:src:*"), before);
	record_of(r, "src", key, &rec);
	assert_int_equal(rec.generation, live_gen);
	tier2_record_free(&rec);
	get_exact(r, "src", key, conv, 60, 6, &st);
	/* a new entry whose source fails: no chunk, no record */
	uint8_t key70[32];
	assert_int_equal(prefix_key(fp, "s", 1, conv, 70, key70), 0);
	before = count_keys(r, "k3:src:c:*");
	rc = put_from(r, "src", conv, 70, 7, total / 2, UINT32_MAX, &o, &res, &st, NULL, err,
	              sizeof(err));
	assert_int_equal(rc, TIER2_DAMAGED);
	assert_int_equal(count_keys(r, "k3:src:c:*"), before);
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, "src", key70);
	redisReply *rep = cmd(r, 2, (const char *[]){"EXISTS", name});
	assert_int_equal(rep->integer, 0);
	freeReplyObject(rep);
	/* bytes that do not match their layer's checksum: refused before the
	 * record, nothing left */
	rc = put_from(r, "src", conv, 70, 7, 0, 1, &o, &res, &st, NULL, err, sizeof(err));
	assert_int_equal(rc, TIER2_DAMAGED);
	assert_non_null(strstr(err, "layer 1's bytes have checksum"));
	assert_int_equal(count_keys(r, "k3:src:c:*"), before);
	assert_int_equal(longest(r, "src", "s", conv, 100, key, &st), 60);
	/* no source */
	struct tier2_layer one = {10, 0, 0};
	assert_int_equal(tier2_put_from(r, "src", fp, "s", 1, conv, 5, &one, 1, NULL, NULL, NULL,
	                                &st, err, sizeof(err)),
	                 TIER2_INVALID);
	cluster_router_free(r);
}

static void test_delete(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	put(r, "del", "s", conv, 40, 40, NULL, &st);
	put(r, "del", "s", conv, 100, 100, NULL, &st);
	uint8_t key[32], k40[32];
	assert_int_equal(longest(r, "del", "s", conv, 100, key, &st), 100);
	assert_int_equal(longest(r, "del", "s", conv, 40, k40, &st), 40);
	struct tier2_record rec;
	record_of(r, "del", key, &rec);
	char name[TIER2_NAME_MAX], err[512] = "", pattern[TIER2_NAME_MAX + 2];
	size_t rec_len = tier2_record_size(rec.salt_len, rec.n_tokens, rec.n_layers, rec.n_chunks);
	uint64_t total = 0, freed = 1;
	for (uint32_t i = 0; i < rec.n_layers; i++)
		total += rec.layers[i].size;
	/* another generation: refused, nothing deleted */
	assert_int_equal(tier2_delete(r, "del", key, rec.generation + 1, &freed, err, sizeof(err)),
	                 TIER2_MISSING);
	assert_non_null(strstr(err, "it was put again"));
	assert_int_equal(freed, 0);
	assert_int_equal(longest(r, "del", "s", conv, 100, key, &st), 100);
	/* this generation: chunks, the node's field, the record */
	tier2_name_chunk(name, "del", key, rec.generation, 0);
	snprintf(pattern, sizeof(pattern), "%.*s*", (int)(strlen(name) - 1), name);
	assert_int_equal(count_keys(r, pattern), rec.n_chunks);
	assert_int_equal(tier2_delete(r, "del", key, rec.generation, &freed, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(freed, rec_len + total);
	assert_int_equal(count_keys(r, pattern), 0);
	tier2_name_record(name, "del", key);
	redisReply *rep = cmd(r, 2, (const char *[]){"EXISTS", name});
	assert_int_equal(rep->integer, 0);
	freeReplyObject(rep);
	uint8_t h[7][16];
	prefix_block_hashes(fp, "s", 1, conv, 100, h);
	tier2_name_node(name, "del", h[6]);
	const char *hexists[] = {"HEXISTS", name, (const char *)key};
	size_t hl[] = {7, strlen(name), 32};
	assert_int_equal(cluster_command_argv(r, name, strlen(name), 3, hexists, hl, &rep), 0);
	assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
	assert_int_equal(rep->integer, 0);
	freeReplyObject(rep);
	/* the lookup now finds the shorter entry on the same path; get misses */
	uint8_t found[32];
	assert_int_equal(longest(r, "del", "s", conv, 100, found, &st), 40);
	assert_memory_equal(found, k40, 32);
	assert_int_equal(get_status(r, "del", key, &st, err, sizeof(err)), TIER2_MISSING);
	/* gone: missing; the other entry still whole */
	assert_int_equal(tier2_delete(r, "del", key, rec.generation, &freed, err, sizeof(err)),
	                 TIER2_MISSING);
	assert_non_null(strstr(err, "not in the cluster"));
	get_exact(r, "del", k40, conv, 40, 40, &st);
	/* the last entry: no lookup finds anything */
	struct tier2_record r40;
	record_of(r, "del", k40, &r40);
	assert_int_equal(tier2_delete(r, "del", k40, r40.generation, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(longest(r, "del", "s", conv, 100, found, &st), 0);
	assert_int_equal(count_keys(r, "k3:del:c:*"), 0);
	assert_int_equal(count_keys(r, "k3:del:e:*"), 0);
	/* a damaged record is not deleted */
	put(r, "del", "s", conv, 40, 40, NULL, &st);
	tier2_record_free(&r40);
	record_of(r, "del", k40, &r40);
	tier2_name_record(name, "del", k40);
	freeReplyObject(cmd(r, 4, (const char *[]){"SETRANGE", name, "60", "\x7f"}));
	assert_int_equal(tier2_delete(r, "del", k40, r40.generation, NULL, err, sizeof(err)),
	                 TIER2_DAMAGED);
	assert_true(count_keys(r, "k3:del:c:*") > 0);
	assert_int_equal(tier2_delete(r, "a:b", k40, 1, NULL, err, sizeof(err)), TIER2_INVALID);
	tier2_record_free(&r40);
	tier2_record_free(&rec);
	cluster_router_free(r);
}

struct seen {
	size_t n;
	struct tier2_listed e[16];
	uint8_t salt[16][8];
	size_t stop_after; /* 0: never */
	size_t give_up_at; /* gave_up says so when asked this many times (0: never) */
	size_t asked;
};

static int gave_up(void *ctx)
{
	struct seen *s = ctx;
	return ++s->asked == s->give_up_at;
}

static int on_listed(const struct tier2_listed *e, void *ctx)
{
	struct seen *s = ctx;
	if (s->n < 16) {
		s->e[s->n] = *e;
		memcpy(s->salt[s->n], e->salt, e->salt_len < 8 ? e->salt_len : 8);
	}
	s->n++;
	return s->stop_after && s->n >= s->stop_after;
}

static const struct tier2_listed *listed(const struct seen *s, const uint8_t key[32])
{
	const struct tier2_listed *hit = NULL;
	for (size_t i = 0; i < s->n && i < 16; i++) {
		if (memcmp(s->e[i].key, key, 32) == 0) {
			if (hit)
				fail_msg("an entry listed twice");
			hit = &s->e[i];
		}
	}
	return hit;
}

static void test_list(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	struct tier2_stats st = {0};
	const uint32_t ps[] = {30, 64, 200};
	uint8_t keys[3][32];
	for (int i = 0; i < 3; i++) {
		put(r, "lst", "s", conv, ps[i], ps[i], NULL, &st);
		assert_int_equal(longest(r, "lst", "s", conv, ps[i], keys[i], &st), ps[i]);
	}
	/* another model in the namespace, the same model in another one */
	uint8_t saved[32];
	memcpy(saved, fp, 32);
	fp[0] ^= 0xff;
	put(r, "lst", "s", conv, 50, 50, NULL, &st);
	uint8_t other[32];
	assert_int_equal(longest(r, "lst", "s", conv, 50, other, &st), 50);
	memcpy(fp, saved, 32);
	put(r, "lst2", "s", conv, 50, 50, NULL, &st);
	/* keys that look like records and are not */
	freeReplyObject(cmd(r, 3, (const char *[]){"SET", "k3:lst:e:nothex", "x"}));
	char junk[TIER2_NAME_MAX];
	uint8_t jk[32];
	memset(jk, 0xab, sizeof(jk));
	tier2_name_record(junk, "lst", jk);
	freeReplyObject(cmd(r, 3, (const char *[]){"SET", junk, "not a record"}));
	tier2_name_record(junk, "lst", (const uint8_t *)"0123456789abcdef0123456789abcdef");
	freeReplyObject(cmd(r, 4, (const char *[]){"HSET", junk, "f", "v"}));

	struct seen s = {0};
	char err[512] = "";
	uint64_t stale = st.stale;
	enum tier2_status rc =
	        tier2_list(r, "lst", fp, 0, on_listed, NULL, &s, &st, err, sizeof(err));
	if (rc != TIER2_OK)
		fail_msg("list: %s: %s", tier2_status_name(rc), err);
	assert_int_equal(s.n, 3);
	assert_int_equal(st.stale, stale + 2); /* the string and the hash */
	for (int i = 0; i < 3; i++) {
		const struct tier2_listed *e = listed(&s, keys[i]);
		if (!e) {
			fail_msg("the entry of %u tokens is not listed", ps[i]);
			return;
		}
		struct tier2_record rec;
		record_of(r, "lst", keys[i], &rec);
		assert_int_equal(e->prefix_len, ps[i]);
		assert_int_equal(e->generation, rec.generation);
		assert_int_equal(e->n_layers, rec.n_layers);
		uint64_t total = 0;
		for (uint32_t j = 0; j < rec.n_layers; j++)
			total += rec.layers[j].size;
		assert_int_equal(e->bytes, total);
		assert_memory_equal(e->fingerprint, fp, 32);
		assert_int_equal(e->salt_len, 1);
		assert_memory_equal(s.salt[e - s.e], "s", 1);
		tier2_record_free(&rec);
	}
	assert_null(listed(&s, other));
	/* every model: the other one too */
	memset(&s, 0, sizeof(s));
	assert_int_equal(tier2_list(r, "lst", NULL, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(s.n, 4);
	assert_non_null(listed(&s, other));
	/* a limit; a function that stops */
	memset(&s, 0, sizeof(s));
	assert_int_equal(tier2_list(r, "lst", NULL, 2, on_listed, NULL, &s, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(s.n, 2);
	memset(&s, 0, sizeof(s));
	s.stop_after = 1;
	assert_int_equal(tier2_list(r, "lst", fp, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(s.n, 1);
	/* a caller that gives up: at once, then when asked the second time (a
	 * SCAN page or a batch of records later) */
	for (size_t after = 0; after < 2; after++) {
		memset(&s, 0, sizeof(s));
		s.give_up_at = after + 1;
		assert_int_equal(tier2_list(r, "lst", NULL, 0, on_listed, gave_up, &s, NULL, err,
		                            sizeof(err)),
		                 TIER2_TIMEOUT);
		assert_int_equal(s.asked, after + 1);
		if (after == 0)
			assert_int_equal(s.n, 0);
		assert_non_null(strstr(err, "given up by the caller after"));
	}
	/* the other namespace holds its one entry; an empty one none */
	memset(&s, 0, sizeof(s));
	assert_int_equal(tier2_list(r, "lst2", fp, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(s.n, 1);
	memset(&s, 0, sizeof(s));
	assert_int_equal(
	        tier2_list(r, "none", NULL, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	        TIER2_OK);
	assert_int_equal(s.n, 0);
	assert_int_equal(
	        tier2_list(r, "a{b}", NULL, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	        TIER2_INVALID);

	/* a master that does not answer: passed over, the others' entries
	 * listed, and the status and message say the listing is not whole */
	uint8_t lk[12][32];
	int node_of[12];
	for (uint32_t i = 0; i < 12; i++) {
		put(r, "lsx", "s", conv, 20 + i, 20 + i, NULL, &st);
		assert_int_equal(longest(r, "lsx", "s", conv, 20 + i, lk[i], &st), 20 + i);
		char name[TIER2_NAME_MAX];
		size_t nl = tier2_name_record(name, "lsx", lk[i]);
		struct cluster_addr a;
		assert_int_equal(cluster_slot_node(r, cluster_key_slot(name, nl), &a), 0);
		node_of[i] = clusterutil_index(&cl, a.port);
		assert_true(node_of[i] >= 0);
	}
	/* the node of the first entry, and one entry elsewhere at least */
	int down = node_of[0], elsewhere = 0;
	for (int i = 0; i < 12; i++)
		elsewhere += node_of[i] != down;
	assert_true(elsewhere > 0);
	char seeds[128];
	snprintf(seeds, sizeof(seeds), "redis://127.0.0.1:%d", cl.port[(down + 1) % cl.n]);
	struct cluster_options fo = {.command_timeout_ms = 300, .connect_timeout_ms = 300};
	struct cluster_router *fr = cluster_router_new(seeds, &fo, err, sizeof(err));
	assert_non_null(fr);
	assert_int_equal(cluster_refresh(fr), 0);
	clusterutil_signal(&cl, down, SIGSTOP); /* < cluster-node-timeout: not failed over */
	memset(&s, 0, sizeof(s));
	rc = tier2_list(fr, "lsx", NULL, 0, on_listed, NULL, &s, NULL, err, sizeof(err));
	/* none of a model's entries on the masters that answer: none, and still
	 * not whole */
	struct seen none = {0};
	uint8_t nofp[32];
	memset(nofp, 0x5a, sizeof(nofp));
	char err2[512] = "";
	enum tier2_status rc2 =
	        tier2_list(fr, "lsx", nofp, 0, on_listed, NULL, &none, NULL, err2, sizeof(err2));
	clusterutil_signal(&cl, down, SIGCONT);
	assert_int_equal(rc2, TIER2_PARTIAL);
	assert_int_equal(none.n, 0);
	assert_non_null(strstr(err2, "masters did not answer"));
	assert_int_equal(rc, TIER2_PARTIAL);
	char want[128];
	snprintf(want, sizeof(want), "1 of %d masters did not answer", cl.n);
	if (!strstr(err, want) || !strstr(err, "timed out"))
		fail_msg("\"%s\" does not say \"%s\" and why", err, want);
	assert_int_equal(s.n, (size_t)elsewhere);
	for (int i = 0; i < 12; i++)
		if ((listed(&s, lk[i]) != NULL) != (node_of[i] != down))
			fail_msg("entry %d (on node %d, %d stopped) %s", i, node_of[i], down,
			         node_of[i] != down ? "not listed" : "listed");
	cluster_router_free(fr);
	/* answered again: the whole listing */
	memset(&s, 0, sizeof(s));
	assert_int_equal(tier2_list(r, "lsx", NULL, 0, on_listed, NULL, &s, NULL, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(s.n, 12);
	cluster_router_free(r);
}

static void test_ledger(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	char err[512] = "";
	struct tier2_owned o[3];
	const double scores[3] = {1700000003000.0, 1700000001000.0, 1700000002000.5};
	for (int i = 0; i < 3; i++) {
		memset(o[i].key, 0x10 * (i + 1), 32);
		o[i].generation = 0x0102030405060708ull * (uint64_t)(i + 1);
		o[i].bytes = 1000000u * (uint64_t)(i + 1);
		o[i].score = scores[i];
		enum tier2_status rc =
		        tier2_ledger_add(r, "led", "host-a.1", &o[i], err, sizeof(err));
		if (rc != TIER2_OK)
			fail_msg("ledger add: %s: %s", tier2_status_name(rc), err);
	}
	/* another owner's, and a member of another length: not loaded */
	assert_int_equal(tier2_ledger_add(r, "led", "host-b", &o[0], err, sizeof(err)), TIER2_OK);
	char name[TIER2_NAME_MAX];
	tier2_name_ledger(name, "led", "host-a.1");
	assert_string_equal(name, "k3:led:o:host-a.1");
	freeReplyObject(cmd(r, 4, (const char *[]){"ZADD", name, "5", "short"}));
	struct tier2_owned *got = NULL;
	size_t n = 0;
	assert_int_equal(tier2_ledger_load(r, "led", "host-a.1", &got, &n, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(n, 3);
	const int order[3] = {1, 2, 0}; /* oldest first */
	for (int i = 0; i < 3; i++) {
		const struct tier2_owned *w = &o[order[i]];
		assert_memory_equal(got[i].key, w->key, 32);
		assert_int_equal(got[i].generation, w->generation);
		assert_int_equal(got[i].bytes, w->bytes);
		assert_true(got[i].score == w->score);
	}
	free(got);
	/* one removed; again: missing */
	assert_int_equal(tier2_ledger_remove(r, "led", "host-a.1", &o[2], err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(tier2_ledger_remove(r, "led", "host-a.1", &o[2], err, sizeof(err)),
	                 TIER2_MISSING);
	assert_int_equal(tier2_ledger_load(r, "led", "host-a.1", &got, &n, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(n, 2);
	assert_int_equal(got[0].generation, o[1].generation);
	assert_int_equal(got[1].generation, o[0].generation);
	free(got);
	/* none: an empty array */
	got = (struct tier2_owned *)1;
	assert_int_equal(tier2_ledger_load(r, "led", "nobody", &got, &n, err, sizeof(err)),
	                 TIER2_OK);
	assert_null(got);
	assert_int_equal(n, 0);
	/* not a sorted set: a node error, said */
	freeReplyObject(cmd(r, 3, (const char *[]){"SET", "k3:led:o:str", "x"}));
	assert_int_equal(tier2_ledger_load(r, "led", "str", &got, &n, err, sizeof(err)),
	                 TIER2_NODE_ERROR);
	assert_non_null(strstr(err, "WRONGTYPE"));
	/* the owner is checked */
	assert_int_equal(tier2_ledger_add(r, "led", "a:b", &o[0], err, sizeof(err)), TIER2_INVALID);
	assert_non_null(strstr(err, "owner"));
	assert_int_equal(tier2_ledger_add(r, "led", "", &o[0], err, sizeof(err)), TIER2_INVALID);
	cluster_router_free(r);
}

static void test_ledger_pages(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	char err[512] = "";
	/* more than a page: 4096 + 905 members */
	const uint32_t total = TIER2_LEDGER_PAGE + 905;
	for (uint32_t i = 0; i < total; i++) {
		struct tier2_owned o = {
		        .generation = i, .bytes = (uint64_t)i * 3u, .score = (double)i};
		memcpy(o.key, &i, sizeof(i));
		assert_int_equal(tier2_ledger_add(r, "led", "pages", &o, err, sizeof(err)),
		                 TIER2_OK);
	}
	struct tier2_owned *got = NULL;
	size_t n = 0;
	assert_int_equal(tier2_ledger_load(r, "led", "pages", &got, &n, err, sizeof(err)),
	                 TIER2_OK);
	assert_int_equal(n, total);
	for (uint32_t i = 0; i < total; i++)
		if (got[i].generation != i || got[i].bytes != (uint64_t)i * 3u)
			fail_msg("member %u: generation %llu", i,
			         (unsigned long long)got[i].generation);
	free(got);
	cluster_router_free(r);
}

/* The twin model, a conversation, and three masters. */
/* ---- MLA row blocks shared between a conversation's turns ---- */

/* Keys of ns of one kind ('p' parts, 'q' their referrers, ...) on every
 * master. */
static size_t count_kind(struct cluster_router *r, const char *ns, char kind)
{
	char match[TIER2_NAME_MAX];
	snprintf(match, sizeof(match), "k3:%s:%c:*", ns, kind);
	size_t n = 0;
	for (size_t m = 0; m < cluster_n_masters(r); m++) {
		char cursor[32] = "0";
		do {
			const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", "1000"};
			size_t lens[6];
			for (int k = 0; k < 6; k++)
				lens[k] = strlen(argv[k]);
			redisReply *rep = NULL;
			if (cluster_command_node(r, m, 6, argv, lens, &rep) != 0)
				fail_msg("SCAN: %s", cluster_error(r));
			assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
			assert_int_equal(rep->elements, 2);
			snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
			n += rep->element[1]->elements;
			freeReplyObject(rep);
		} while (strcmp(cursor, "0") != 0);
	}
	return n;
}

/* A turn of the conversation: rows of rows_seed (the same in every turn), KDA
 * of seed; with one float of layer 3's row 10 of k changed when tweak. */
static struct storeutil_snap conv_turn(uint32_t p, uint32_t seed, int tweak)
{
	struct storeutil_snap s = storeutil_conv_snap(twin, p, 5, seed);
	if (tweak) {
		assert_int_equal(s.bufs[3][0], 2); /* the twin's layer 3 is MLA */
		s.bufs[3][TIER2_MLA_HEAD + 10 * 4] ^= 0x40;
		s.blobs[3].xxh3 = checksum_blob(s.bufs[3], s.blobs[3].size, 3);
	}
	return s;
}

static uint32_t turn_ttl; /* put_turn's TTL (0: none) */

static enum tier2_status put_turn(struct cluster_router *r, const char *ns,
                                  const struct storeutil_snap *s, uint32_t p, uint32_t row_block,
                                  uint64_t fail_at, struct tier2_put_result *res,
                                  struct tier2_stats *stats, char *err, size_t errsz)
{
	struct tier2_layer *layers = calloc(s->n, sizeof(*layers));
	for (uint32_t i = 0; i < s->n; i++)
		layers[i] = (struct tier2_layer){s->blobs[i].size, s->blobs[i].xxh3, s->bufs[i][0]};
	struct odd_src os = {.s = s, .fail_at = fail_at};
	struct tier2_source src = {odd_read, &os};
	struct tier2_put_options o = {
	        .row_block = row_block, .chunk_size = 65536, .ttl_s = turn_ttl};
	enum tier2_status st = tier2_put_from(r, ns, fp, "c", 1, conv, p, layers, s->n, &src, &o,
	                                      res, stats, err, errsz);
	free(layers);
	return st;
}

static uint64_t blob_sum(const struct storeutil_snap *s)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < s->n; i++)
		n += s->blobs[i].size;
	return n;
}

static void key_of(uint32_t p, uint8_t key[32])
{
	assert_int_equal(prefix_key(fp, "c", 1, conv, p, key), 0);
}

static void get_turn_exact(struct cluster_router *r, const char *ns, uint32_t p,
                           const struct storeutil_snap *s)
{
	uint8_t key[32];
	key_of(p, key);
	struct tier2_entry e;
	char err[512] = "";
	enum tier2_status st = tier2_get(r, ns, key, &e, NULL, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("get of turn %u: %s: %s", p, tier2_status_name(st), err);
	assert_int_equal(e.n_blobs, s->n);
	for (uint32_t i = 0; i < s->n; i++) {
		assert_int_equal(e.blobs[i].size, s->blobs[i].size);
		assert_memory_equal(e.blobs[i].data, s->bufs[i], s->blobs[i].size);
	}
	tier2_entry_free(&e);
}

static void delete_turn(struct cluster_router *r, const char *ns, uint32_t p)
{
	uint8_t key[32];
	key_of(p, key);
	struct tier2_record rec;
	record_of(r, ns, key, &rec);
	char err[512] = "";
	uint64_t freed = 0;
	enum tier2_status st = tier2_delete(r, ns, key, rec.generation, &freed, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("delete of turn %u: %s: %s", p, tier2_status_name(st), err);
	assert_true(freed > 0);
	tier2_record_free(&rec);
}

/* Part (0 k, 1 v) of block b of the entry's first split layer, as an
 * intent names it. */
static void part_of(struct cluster_router *r, const char *ns, uint32_t p, uint32_t b, int part,
                    struct tier2_intent_part *out)
{
	uint8_t key[32];
	key_of(p, key);
	struct tier2_record rec;
	record_of(r, ns, key, &rec);
	assert_int_equal(rec.version, 2);
	assert_true(rec.n_split >= 1);
	assert_true(b < rec.split[0].seq_len / rec.row_block);
	uint8_t(*h)[PREFIX_NODE_LEN] = malloc((size_t)(p / 16 + 1) * PREFIX_NODE_LEN);
	prefix_block_hashes(fp, "c", 1, conv, p, h);
	uint32_t d = (b + 1) * rec.row_block / 16;
	*out = (struct tier2_intent_part){.layer = rec.split[0].layer,
	                                  .part = (uint32_t)part,
	                                  .xxh3 = rec.part_xxh3[2 * b + (uint32_t)part],
	                                  .size = (uint64_t)rec.row_block * 4u *
	                                          (part ? rec.split[0].v_row : rec.split[0].k_row)};
	memcpy(out->node, h[d], sizeof(out->node));
	free(h);
	tier2_record_free(&rec);
}

/* The name of that part ('p'), or of its referrers ('q'). */
static void part_name(struct cluster_router *r, const char *ns, uint32_t p, uint32_t b, int part,
                      char *name, char kind)
{
	struct tier2_intent_part ip;
	part_of(r, ns, p, b, part, &ip);
	if (kind == 'p')
		tier2_name_part(name, ns, ip.node, ip.layer, part, ip.xxh3);
	else
		tier2_name_refs(name, ns, ip.node, ip.layer, part, ip.xxh3);
}

static void test_conversation_blocks(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	const char *ns = "blk";
	static const uint32_t turns[3] = {200, 400, 700};
	struct storeutil_snap s[3];
	struct tier2_stats st = {0};
	char err[512] = "";
	uint64_t sum_out = 0, sum_blobs = 0;
	for (int t = 0; t < 3; t++) {
		s[t] = conv_turn(turns[t], 100 + (uint32_t)t, 0);
		struct tier2_put_result res;
		uint64_t before = st.bytes_out;
		enum tier2_status rc =
		        put_turn(r, ns, &s[t], turns[t], 64, 0, &res, &st, err, sizeof(err));
		if (rc != TIER2_OK)
			fail_msg("put turn %u: %s: %s", turns[t], tier2_status_name(rc), err);
		uint64_t out = st.bytes_out - before, blobs = blob_sum(&s[t]);
		print_message(
		        "turn of %u tokens: blobs %llu bytes, bytes_out %llu, new_bytes %llu, "
		        "shared_bytes %llu\n",
		        turns[t], (unsigned long long)blobs, (unsigned long long)out,
		        (unsigned long long)res.new_bytes, (unsigned long long)res.shared_bytes);
		assert_int_equal(res.bytes, blobs);
		if (t == 0) {
			assert_int_equal(res.shared_bytes, 0);
		} else {
			assert_true(res.shared_bytes > 0);
			assert_true(out < blobs);
			/* what this put sent: all but the rows the earlier turns hold */
			assert_true(res.new_bytes + res.shared_bytes > blobs);
			assert_true(res.new_bytes < blobs);
		}
		sum_out += out;
		sum_blobs += blobs;
	}
	print_message("three turns: blobs %llu bytes, bytes_out %llu\n",
	              (unsigned long long)sum_blobs, (unsigned long long)sum_out);
	/* turn 1 (200: 3 blocks a layer), 2 (400: 6), 3 (700: 10); two MLA
	 * layers of two parts: turn 2 shares 3 blocks, turn 3 6 */
	assert_int_equal(st.parts_new, 2 * 2 * 10);
	assert_int_equal(st.parts_shared, 2 * 2 * (3 + 6));
	assert_int_equal(count_kind(r, ns, 'p'), 2 * 2 * 10);
	assert_int_equal(count_kind(r, ns, 'q'), 2 * 2 * 10);
	for (int t = 0; t < 3; t++)
		get_turn_exact(r, ns, turns[t], &s[t]);
	uint8_t key[32];
	struct tier2_record rec;
	key_of(400, key);
	record_of(r, ns, key, &rec);
	assert_int_equal(rec.version, 2);
	assert_int_equal(rec.row_block, 64);
	assert_int_equal(rec.n_split, 2);
	assert_int_equal(rec.split[0].layer, 3);
	assert_int_equal(rec.split[1].layer, 7);
	tier2_record_free(&rec);

	/* other bytes at a block's position: a part of its own, the rest shared */
	struct storeutil_snap v = conv_turn(416, 9, 1);
	struct tier2_stats vs = {0};
	struct tier2_put_result res;
	if (put_turn(r, ns, &v, 416, 64, 0, &res, &vs, err, sizeof(err)) != TIER2_OK)
		fail_msg("put of the variant: %s", err);
	assert_int_equal(vs.parts_new, 1);
	assert_int_equal(vs.parts_shared, 2 * 2 * 6 - 1);
	get_turn_exact(r, ns, 416, &v);
	get_turn_exact(r, ns, 400, &s[1]);
	char vk[TIER2_NAME_MAX], tk[TIER2_NAME_MAX];
	part_name(r, ns, 416, 0, 0, vk, 'p');
	part_name(r, ns, 400, 0, 0, tk, 'p');
	assert_string_not_equal(vk, tk);

	/* turn 1 deleted: the others keep their rows */
	delete_turn(r, ns, 200);
	get_turn_exact(r, ns, 400, &s[1]);
	get_turn_exact(r, ns, 700, &s[2]);
	get_turn_exact(r, ns, 416, &v);

	/* the variant's own part overwritten (damaged), then gone (missing) */
	const char *setrange[] = {"SETRANGE", vk, "5", "x"};
	freeReplyObject(cmd(r, 4, setrange));
	key_of(416, key);
	assert_int_equal(get_status(r, ns, key, NULL, err, sizeof(err)), TIER2_DAMAGED);
	assert_non_null(strstr(err, "part"));
	get_turn_exact(r, ns, 400, &s[1]);
	const char *del[] = {"DEL", vk};
	freeReplyObject(cmd(r, 2, del));
	assert_int_equal(get_status(r, ns, key, NULL, err, sizeof(err)), TIER2_MISSING);

	/* a referrers' set evicted: the delete still leaves nothing behind */
	char q[TIER2_NAME_MAX];
	part_name(r, ns, 700, 8, 1, q, 'q');
	const char *delq[] = {"DEL", q};
	redisReply *rep = cmd(r, 2, delq);
	assert_int_equal(rep->integer, 1);
	freeReplyObject(rep);

	delete_turn(r, ns, 416);
	get_turn_exact(r, ns, 400, &s[1]);
	delete_turn(r, ns, 400);
	get_turn_exact(r, ns, 700, &s[2]);
	delete_turn(r, ns, 700);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);
	assert_int_equal(count_kind(r, ns, 'c'), 0);
	assert_int_equal(count_kind(r, ns, 'e'), 0);

	/* a source failing amid the second MLA layer's v parts: nothing left */
	uint64_t at = 0;
	for (uint32_t i = 0; i < 7; i++)
		at += s[2].blobs[i].size;
	at += s[2].blobs[7].size - 20000;
	assert_int_equal(put_turn(r, ns, &s[2], 700, 64, at, NULL, NULL, err, sizeof(err)),
	                 TIER2_DAMAGED);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);
	assert_int_equal(count_kind(r, ns, 'c'), 0);

	/* row_block 0: a version-1 record, blobs whole, read as before */
	struct tier2_stats v1 = {0};
	if (put_turn(r, ns, &s[1], 400, 0, 0, &res, &v1, err, sizeof(err)) != TIER2_OK)
		fail_msg("put v1: %s", err);
	key_of(400, key);
	record_of(r, ns, key, &rec);
	assert_int_equal(rec.version, 1);
	assert_int_equal(rec.n_split, 0);
	tier2_record_free(&rec);
	assert_int_equal(v1.parts_new + v1.parts_shared, 0);
	assert_int_equal(res.shared_bytes, 0);
	assert_true(res.new_bytes > blob_sum(&s[1]));
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	get_turn_exact(r, ns, 400, &s[1]);
	/* and re-published with blocks: the version-1 chunks replaced */
	if (put_turn(r, ns, &s[1], 400, 64, 0, &res, NULL, err, sizeof(err)) != TIER2_OK)
		fail_msg("put v2 over v1: %s", err);
	get_turn_exact(r, ns, 400, &s[1]);
	/* and again with other KDA: the old generation's parts unreferenced */
	if (put_turn(r, ns, &s[1], 400, 64, 0, &res, NULL, err, sizeof(err)) != TIER2_OK)
		fail_msg("put v2 over v2: %s", err);
	assert_int_equal(count_kind(r, ns, 'p'), 2 * 2 * 6);
	delete_turn(r, ns, 400);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);
	assert_int_equal(count_kind(r, ns, 'c'), 0);

	/* expiries: a part takes the longest of its referrers', none if one has none */
	turn_ttl = 100;
	if (put_turn(r, ns, &s[0], 200, 64, 0, &res, NULL, err, sizeof(err)) != TIER2_OK)
		fail_msg("put with a TTL: %s", err);
	char pk[TIER2_NAME_MAX], pq[TIER2_NAME_MAX];
	part_name(r, ns, 200, 1, 1, pk, 'p');
	part_name(r, ns, 200, 1, 1, pq, 'q');
	const char *ttl_p[] = {"TTL", pk}, *ttl_q[] = {"TTL", pq};
	rep = cmd(r, 2, ttl_p);
	assert_true(rep->integer > 0 && rep->integer <= 100);
	freeReplyObject(rep);
	rep = cmd(r, 2, ttl_q);
	assert_true(rep->integer > 0 && rep->integer <= 100);
	freeReplyObject(rep);
	turn_ttl = 0;
	if (put_turn(r, ns, &s[1], 400, 64, 0, &res, NULL, err, sizeof(err)) != TIER2_OK)
		fail_msg("put without a TTL: %s", err);
	rep = cmd(r, 2, ttl_p);
	assert_int_equal(rep->integer, -1);
	freeReplyObject(rep);
	rep = cmd(r, 2, ttl_q);
	assert_int_equal(rep->integer, -1);
	freeReplyObject(rep);
	delete_turn(r, ns, 200);
	delete_turn(r, ns, 400);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);

	storeutil_snap_free(&v);
	for (int t = 0; t < 3; t++)
		storeutil_snap_free(&s[t]);
	cluster_router_free(r);
}

/* A source that kills its own process once `at` of its bytes have been read:
 * a daemon SIGKILLed in the middle of a copy. */
struct kill_src {
	struct odd_src o;
	uint64_t at;
};

static int kill_read(void *ctx, void *dst, size_t len, char *err, size_t errsz)
{
	struct kill_src *k = ctx;
	if (k->o.pos + len > k->at)
		raise(SIGKILL);
	return odd_read(&k->o, dst, len, err, errsz);
}

/* RPUSH calls answered by every master so far (INFO commandstats). */
static long long rpushes(struct cluster_router *r)
{
	long long n = 0;
	for (size_t m = 0; m < cluster_n_masters(r); m++) {
		const char *argv[] = {"INFO", "commandstats"};
		size_t lens[2] = {4, 12};
		redisReply *rep = NULL;
		if (cluster_command_node(r, m, 2, argv, lens, &rep) != 0)
			fail_msg("INFO: %s", cluster_error(r));
		assert_int_equal(rep->type, REDIS_REPLY_STRING);
		const char *at = strstr(rep->str, "cmdstat_rpush:calls=");
		if (at)
			n += strtoll(at + strlen("cmdstat_rpush:calls="), NULL, 10);
		freeReplyObject(rep);
	}
	return n;
}

/* VERB NAME VALUE with a binary value; the integer answered. */
static long long bin_cmd(struct cluster_router *r, const char *verb, const char *name,
                         const void *value, size_t len)
{
	const char *argv[] = {verb, name, value};
	size_t lens[] = {strlen(verb), strlen(name), len};
	redisReply *rep = NULL;
	assert_int_equal(cluster_command_argv(r, name, lens[1], 3, argv, lens, &rep), 0);
	assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
	long long v = rep->integer;
	freeReplyObject(rep);
	return v;
}

/* Writes an intent of key and generation gen by hand: head, then old. */
static void push_intent(struct cluster_router *r, const char *ns, const uint8_t key[32],
                        uint64_t gen, const unsigned char *head, const unsigned char *old)
{
	char name[TIER2_NAME_MAX];
	tier2_name_intent(name, ns, key, gen);
	(void)bin_cmd(r, "RPUSH", name, head, TIER2_INTENT_HEAD_LEN);
	(void)bin_cmd(r, "RPUSH", name, old, TIER2_INTENT_OLD_LEN);
}

/* A put killed part-way leaves its chunks, its parts and its references to
 * shared parts, which nothing else would ever delete (its record was never
 * written): tier2_undo of its key and generation takes back every one of
 * them from its intent, and leaves the entry whose parts it shared whole. */
static void test_undo_after_kill(void **state)
{
	(void)state;
	const char *ns = "undo";
	struct cluster_router *r = router();
	char err[512] = "";
	struct tier2_put_result res;
	struct storeutil_snap a = conv_turn(256, 31, 0), b = conv_turn(1024, 31, 0);
	enum tier2_status st = put_turn(r, ns, &a, 256, 64, 0, &res, NULL, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("put of turn 256: %s: %s", tier2_status_name(st), err);
	assert_int_equal(count_kind(r, ns, 'i'), 0); /* a put that is whole keeps no intent */
	size_t parts = count_kind(r, ns, 'p'), refs = count_kind(r, ns, 'q'),
	       chunks = count_kind(r, ns, 'c');
	assert_true(parts > 0);
	char shared[TIER2_NAME_MAX];
	part_name(r, ns, 256, 0, 0, shared, 'q');
	assert_int_equal(int_reply(r, "SCARD", shared), 1);

	/* turn 1024, which shares turn 256's blocks, killed at three quarters */
	uint8_t key[32];
	key_of(1024, key);
	uint64_t gen = tier2_generation_new();
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct cluster_router *cr = router(); /* connections of its own */
		struct tier2_layer *layers = calloc(b.n, sizeof(*layers));
		for (uint32_t i = 0; i < b.n; i++)
			layers[i] = (struct tier2_layer){b.blobs[i].size, b.blobs[i].xxh3,
			                                 b.bufs[i][0]};
		struct kill_src ks = {.o = {.s = &b}, .at = blob_sum(&b) / 4 * 3};
		struct tier2_source src = {kill_read, &ks};
		struct tier2_put_options o = {.row_block = 64,
		                              .chunk_size = 65536,
		                              .max_in_flight = 2,
		                              .generation = gen};
		(void)tier2_put_from(cr, ns, fp, "c", 1, conv, 1024, layers, b.n, &src, &o, NULL,
		                     NULL, err, sizeof(err));
		_exit(3); /* not reached: the source kills it first */
	}
	int ws = 0;
	assert_int_equal(waitpid(pid, &ws, 0), pid);
	assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
	char intent[TIER2_NAME_MAX];
	tier2_name_intent(intent, ns, key, gen);
	/* it had written: its intent, naming parts; chunks; a reference to a
	 * part of turn 256's; parts of its own */
	assert_true(int_reply(r, "LLEN", intent) > 1);
	assert_true(count_kind(r, ns, 'c') > chunks);
	assert_int_equal(int_reply(r, "SCARD", shared), 2);
	assert_true(count_kind(r, ns, 'p') > parts);
	assert_int_equal(count_kind(r, ns, 'e'), 1);

	uint64_t freed = 0;
	st = tier2_undo(r, ns, key, gen, &freed, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("undo: %s: %s", tier2_status_name(st), err);
	assert_true(freed > 0);
	assert_int_equal(count_kind(r, ns, 'i'), 0);
	assert_int_equal(count_kind(r, ns, 'c'), chunks);
	assert_int_equal(count_kind(r, ns, 'p'), parts);
	assert_int_equal(count_kind(r, ns, 'q'), refs);
	assert_int_equal(int_reply(r, "SCARD", shared), 1);
	get_turn_exact(r, ns, 256, &a);
	/* again: nothing left to take back */
	st = tier2_undo(r, ns, key, gen, &freed, err, sizeof(err));
	assert_int_equal(st, TIER2_OK);
	assert_int_equal(freed, 0);
	/* a generation the key's record has is refused as a put's choice */
	uint8_t ka[32];
	key_of(256, ka);
	struct tier2_record rec;
	record_of(r, ns, ka, &rec);
	struct tier2_layer *la = calloc(a.n, sizeof(*la));
	for (uint32_t i = 0; i < a.n; i++)
		la[i] = (struct tier2_layer){a.blobs[i].size, a.blobs[i].xxh3, a.bufs[i][0]};
	struct odd_src os = {.s = &a};
	struct tier2_source src = {odd_read, &os};
	struct tier2_put_options o = {.row_block = 64, .generation = rec.generation};
	st = tier2_put_from(r, ns, fp, "c", 1, conv, 256, la, a.n, &src, &o, &res, NULL, err,
	                    sizeof(err));
	assert_int_equal(st, TIER2_INVALID);
	assert_non_null(strstr(err, "the key's record's already"));
	free(la);
	tier2_record_free(&rec);
	/* an undo of a put that finished deletes it, intent and all */
	record_of(r, ns, ka, &rec);
	st = tier2_undo(r, ns, ka, rec.generation, &freed, err, sizeof(err));
	assert_int_equal(st, TIER2_OK);
	tier2_record_free(&rec);
	assert_int_equal(count_kind(r, ns, 'e'), 0);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);
	assert_int_equal(count_kind(r, ns, 'c'), 0);

	/* a put that replaced a record of another generation, stopped after
	 * its own record and before the replaced generation's cleanup (the
	 * state made by hand: the replaced chunks written back, the intent as
	 * the put leaves it): the undo deletes the replaced chunks too */
	long long r0 = rpushes(r);
	st = put_turn(r, ns, &a, 256, 64, 0, &res, NULL, err, sizeof(err));
	assert_int_equal(st, TIER2_OK);
	uint64_t g1 = res.generation;
	uint32_t n1 = res.n_chunks;
	long long r1 = rpushes(r);
	st = put_turn(r, ns, &a, 256, 64, 0, &res, NULL, err, sizeof(err)); /* replaces it */
	assert_int_equal(st, TIER2_OK);
	uint64_t g2 = res.generation;
	assert_true(g2 != g1);
	/* the same rounds of parts, and one more element: the replaced
	 * generation, named before the record was overwritten */
	assert_int_equal(rpushes(r) - r1, (r1 - r0) + 1);
	assert_int_equal(count_kind(r, ns, 'c'), res.n_chunks); /* g1's deleted */
	for (uint32_t i = 0; i < n1; i++) {
		char name[TIER2_NAME_MAX];
		tier2_name_chunk(name, ns, ka, g1, i);
		const char *argv[] = {"SET", name, "x"};
		freeReplyObject(cmd(r, 3, argv));
	}
	unsigned char head[TIER2_INTENT_HEAD_LEN], old[TIER2_INTENT_OLD_LEN];
	tier2_intent_head_encode(head, 65536, res.n_chunks);
	/* first, another put's intent naming the live generation as replaced:
	 * the record is not that put's, so nothing of the live one goes */
	tier2_intent_old_encode(old, g2, 65536, res.n_chunks);
	push_intent(r, ns, ka, g2 ^ 1, head, old);
	assert_int_equal(count_kind(r, ns, 'c'), res.n_chunks + n1);
	st = tier2_undo(r, ns, ka, g2 ^ 1, &freed, err, sizeof(err));
	assert_int_equal(st, TIER2_OK);
	assert_int_equal(count_kind(r, ns, 'c'), res.n_chunks + n1);
	assert_int_equal(count_kind(r, ns, 'i'), 0);
	get_turn_exact(r, ns, 256, &a);
	/* an intent without its header (evicted mid-put, then appended to):
	 * the part it names loses its generation's referrer, the intent goes,
	 * and DAMAGED says its chunks are left */
	struct tier2_intent_part ip;
	unsigned char el[TIER2_INTENT_PART_LEN], member[40];
	char refs_name[TIER2_NAME_MAX];
	uint64_t g9 = g2 ^ 2;
	part_of(r, ns, 256, 0, 0, &ip);
	part_name(r, ns, 256, 0, 0, refs_name, 'q');
	memcpy(member, ka, 32);
	for (int i = 0; i < 8; i++)
		member[32 + i] = (unsigned char)(g9 >> (8 * i));
	assert_int_equal(bin_cmd(r, "SADD", refs_name, member, sizeof(member)), 1);
	assert_int_equal(int_reply(r, "SCARD", refs_name), 2);
	tier2_intent_part_encode(el, &ip);
	tier2_name_intent(intent, ns, ka, g9);
	(void)bin_cmd(r, "RPUSH", intent, el, sizeof(el));
	st = tier2_undo(r, ns, ka, g9, &freed, err, sizeof(err));
	assert_int_equal(st, TIER2_DAMAGED);
	assert_non_null(strstr(err, "had no header"));
	assert_int_equal(int_reply(r, "SCARD", refs_name), 1);
	assert_int_equal(count_kind(r, ns, 'i'), 0);
	get_turn_exact(r, ns, 256, &a);
	tier2_intent_old_encode(old, g1, 65536, n1);
	push_intent(r, ns, ka, g2, head, old);
	assert_int_equal(count_kind(r, ns, 'c'), res.n_chunks + n1);
	st = tier2_undo(r, ns, ka, g2, &freed, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("undo of the replacing put: %s: %s", tier2_status_name(st), err);
	assert_int_equal(count_kind(r, ns, 'c'), 0);
	assert_int_equal(count_kind(r, ns, 'i'), 0);
	assert_int_equal(count_kind(r, ns, 'e'), 0);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	storeutil_snap_free(&a);
	storeutil_snap_free(&b);
	cluster_router_free(r);
}

/* A source whose first read lets another put of the same entry run whole
 * first (another host copying the same snapshot at the same time). */
struct race_src {
	struct odd_src o;
	struct cluster_router *r;
	const char *ns;
	uint32_t p;
	struct tier2_layer *layers;
	uint64_t gen; /* the generation both puts use (0: each its own) */
	int fired;
	enum tier2_status inner_st;
	struct tier2_put_result inner;
};

static enum tier2_status put_keep(struct cluster_router *r, const char *ns,
                                  struct tier2_layer *layers, uint32_t p, uint64_t gen,
                                  struct tier2_source *src, struct tier2_put_result *res, char *err,
                                  size_t errsz)
{
	struct tier2_put_options o = {
	        .row_block = 64, .chunk_size = 65536, .keep_existing = 1, .generation = gen};
	return tier2_put_from(r, ns, fp, "c", 1, conv, p, layers, twin->n_layers, src, &o, res,
	                      NULL, err, errsz);
}

static int race_read(void *ctx, void *dst, size_t len, char *err, size_t errsz)
{
	struct race_src *k = ctx;
	if (!k->fired) {
		k->fired = 1;
		struct odd_src o = {.s = k->o.s};
		struct tier2_source src = {odd_read, &o};
		char e[512] = "";
		k->inner_st = put_keep(k->r, k->ns, k->layers, k->p, k->gen, &src, &k->inner, e,
		                       sizeof(e));
		if (k->inner_st != TIER2_OK)
			fail_msg("the other put: %s: %s", tier2_status_name(k->inner_st), e);
	}
	return odd_read(&k->o, dst, len, err, errsz);
}

/* Two puts of one entry, keep_existing, that overlap: the one whose record
 * goes second finds the other's there, undoes its own writes and reports
 * the entry as existing. Before, it overwrote the record, and the first
 * put's chunks and part references were left with no record, ledger or
 * intent naming them: nothing was left to delete them. */
static void test_two_puts_at_once(void **state)
{
	(void)state;
	const char *ns = "race";
	struct cluster_router *r = router();
	struct storeutil_snap a = conv_turn(512, 41, 0);
	struct tier2_layer *layers = calloc(a.n, sizeof(*layers));
	assert_non_null(layers);
	for (uint32_t i = 0; i < a.n; i++)
		layers[i] = (struct tier2_layer){a.blobs[i].size, a.blobs[i].xxh3, a.bufs[i][0]};
	struct race_src k = {.o = {.s = &a}, .r = r, .ns = ns, .p = 512, .layers = layers};
	struct tier2_source src = {race_read, &k};
	struct tier2_put_result res;
	char err[512] = "";
	enum tier2_status st = put_keep(r, ns, layers, 512, 0, &src, &res, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("the second put: %s: %s", tier2_status_name(st), err);
	assert_true(k.fired);
	assert_true(res.existed);
	assert_true(res.generation == k.inner.generation);
	assert_int_equal(res.n_chunks, k.inner.n_chunks);
	/* only the first put's bytes: its chunks, no intent, one record */
	assert_int_equal(count_kind(r, ns, 'c'), k.inner.n_chunks);
	assert_int_equal(count_kind(r, ns, 'i'), 0);
	assert_int_equal(count_kind(r, ns, 'e'), 1);
	char q0[TIER2_NAME_MAX];
	part_name(r, ns, 512, 0, 0, q0, 'q');
	assert_int_equal(int_reply(r, "SCARD", q0), 1); /* the first put's reference alone */
	get_turn_exact(r, ns, 512, &a);
	/* deleting the entry leaves nothing of either put */
	delete_turn(r, ns, 512);
	assert_int_equal(count_kind(r, ns, 'c'), 0);
	assert_int_equal(count_kind(r, ns, 'p'), 0);
	assert_int_equal(count_kind(r, ns, 'q'), 0);
	assert_int_equal(count_kind(r, ns, 'e'), 0);

	/* a record that does not decode is replaced, keep_existing or not (SET
	 * NX only where there was none): the put writes, and the entry reads */
	uint8_t key[32];
	key_of(512, key);
	char name[TIER2_NAME_MAX];
	tier2_name_record(name, ns, key);
	const char *junk[] = {"SET", name, "twenty bytes of junk"};
	freeReplyObject(cmd(r, 3, junk));
	struct odd_src o = {.s = &a};
	struct tier2_source plain = {odd_read, &o};
	st = put_keep(r, ns, layers, 512, 0, &plain, &res, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("the put over junk: %s: %s", tier2_status_name(st), err);
	assert_false(res.existed);
	assert_true(res.n_chunks > 0);
	get_turn_exact(r, ns, 512, &a);
	delete_turn(r, ns, 512);

	/* SET NX answered nil for the put's own record: the router sends a
	 * command once more to the master a failover promoted, which may hold
	 * the first SET already. Made here by a put of the same generation that
	 * runs whole first: the record is this put's, read back, and kept with
	 * its chunks (before, the put undid its chunks under its own record) */
	struct race_src same = {.o = {.s = &a},
	                        .r = r,
	                        .ns = ns,
	                        .p = 512,
	                        .layers = layers,
	                        .gen = tier2_generation_new()};
	struct tier2_source src2 = {race_read, &same};
	st = put_keep(r, ns, layers, 512, same.gen, &src2, &res, err, sizeof(err));
	if (st != TIER2_OK)
		fail_msg("the put whose SET NX found its own record: %s: %s", tier2_status_name(st),
		         err);
	assert_true(same.fired);
	assert_false(res.existed);
	assert_true(res.generation == same.gen);
	get_turn_exact(r, ns, 512, &a);
	delete_turn(r, ns, 512);
	assert_int_equal(count_kind(r, ns, 'c'), 0);
	free(layers);
	storeutil_snap_free(&a);
	cluster_router_free(r);
}

/* The reader streams an entry through a window: every byte below *arrived
 * is the entry's, none at or past the limit is written, and the bytes a
 * chunk holds past an MLA layer's parts wait for a later limit. Windows far
 * under a part and a chunk, under a chunk, and of a few chunks. */
static void test_read_window(void **state)
{
	(void)state;
	struct cluster_router *r = router();
	const char *ns = "win";
	const uint32_t p = 700; /* 10 blocks of 64 and a tail of 60 rows a split layer */
	struct storeutil_snap s = conv_turn(p, 300, 0);
	struct tier2_put_result res;
	char err[512] = "";
	enum tier2_status rc = put_turn(r, ns, &s, p, 64, 0, &res, NULL, err, sizeof(err));
	if (rc != TIER2_OK)
		fail_msg("put: %s: %s", tier2_status_name(rc), err);
	uint64_t total = blob_sum(&s);
	assert_true(total > 0);
	unsigned char *want = malloc((size_t)total + 1), *dst = malloc((size_t)total + 1);
	assert_non_null(want);
	assert_non_null(dst);
	for (uint32_t i = 0, off = 0; i < s.n; off += (uint32_t)s.blobs[i].size, i++)
		memcpy(want + off, s.bufs[i], s.blobs[i].size);
	uint8_t key[32];
	key_of(p, key);
	static const uint64_t windows[] = {257, 4093, 65536 * 3 + 7, 0};
	for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++) {
		struct tier2_stats st = {0};
		struct tier2_reader *rd = NULL;
		rc = tier2_read_open(r, ns, key, 0, &st, &rd, err, sizeof(err));
		if (rc != TIER2_OK)
			fail_msg("open: %s: %s", tier2_status_name(rc), err);
		assert_int_equal(tier2_read_total(rd), total);
		assert_int_equal(tier2_read_record(rd)->n_split, 2);
		memset(dst, 0xA5, total);
		uint64_t arrived = 0, calls = 0;
		while (arrived < total) {
			uint64_t limit = windows[w] ? arrived + windows[w] : total;
			if (limit > total)
				limit = total;
			uint64_t before = arrived;
			rc = tier2_read_next(rd, dst, limit, &arrived, err, sizeof(err));
			if (rc != TIER2_OK)
				fail_msg("window %llu: next: %s: %s",
				         (unsigned long long)windows[w], tier2_status_name(rc),
				         err);
			assert_true(arrived >= before);
			assert_true(arrived <= limit);
			/* compared as they arrive, then marked: nothing below an
			 * arrived is written again (checked whole at the end) */
			assert_memory_equal(dst + before, want + before, arrived - before);
			memset(dst + before, 0x5A, (size_t)(arrived - before));
			for (uint64_t i = limit; i < total && i < limit + 64; i++)
				if (dst[i] != 0xA5)
					fail_msg("window %llu: byte %llu past the limit %llu was "
					         "written",
					         (unsigned long long)windows[w],
					         (unsigned long long)i, (unsigned long long)limit);
			assert_true(++calls < 10 * total + 100);
		}
		for (uint64_t i = 0; i < total; i++)
			if (dst[i] != 0x5A)
				fail_msg("window %llu: byte %llu was written after it arrived",
				         (unsigned long long)windows[w], (unsigned long long)i);
		assert_int_equal(st.gets, 1);
		assert_int_equal(st.hits, 0); /* the caller's */
		assert_int_equal(st.miss_damaged + st.miss_missing, 0);
		print_message("window %llu: %llu calls for %llu bytes\n",
		              (unsigned long long)windows[w], (unsigned long long)calls,
		              (unsigned long long)total);
		tier2_read_close(rd);
	}
	/* a record giving a layer the sum 0 (a store's "not given"): damaged */
	char name[TIER2_NAME_MAX];
	struct tier2_record rec;
	record_of(r, ns, key, &rec);
	struct tier2_layer *zl = malloc(rec.n_layers * sizeof(*zl));
	assert_non_null(zl);
	memcpy(zl, rec.layers, rec.n_layers * sizeof(*zl));
	zl[1].xxh3 = 0;
	struct tier2_record zero = rec;
	zero.layers = zl;
	uint8_t *enc = NULL;
	size_t enc_len = 0;
	assert_int_equal(tier2_record_encode(&zero, &enc, &enc_len, err, sizeof(err)), 0);
	size_t name_len = tier2_name_record(name, ns, key);
	const char *set[] = {"SET", name, (const char *)enc};
	size_t set_len[] = {3, name_len, enc_len};
	redisReply *ok = NULL;
	assert_int_equal(cluster_command_argv(r, name, name_len, 3, set, set_len, &ok), 0);
	assert_int_equal(ok->type, REDIS_REPLY_STATUS);
	freeReplyObject(ok);
	struct tier2_reader *zrd = NULL;
	struct tier2_stats zst = {0};
	assert_int_equal(tier2_read_open(r, ns, key, 0, &zst, &zrd, err, sizeof(err)),
	                 TIER2_DAMAGED);
	assert_null(zrd);
	assert_non_null(strstr(err, "layer 1 a checksum of 0"));
	assert_int_equal(zst.miss_damaged, 1);
	/* the record as it was */
	free(enc);
	assert_int_equal(tier2_record_encode(&rec, &enc, &enc_len, err, sizeof(err)), 0);
	set[2] = (const char *)enc;
	set_len[2] = enc_len;
	assert_int_equal(cluster_command_argv(r, name, name_len, 3, set, set_len, &ok), 0);
	freeReplyObject(ok);
	free(enc);
	free(zl);
	/* a chunk overwritten: the read fails there, and stays failed */
	tier2_name_chunk(name, ns, key, rec.generation, rec.n_chunks - 1);
	tier2_record_free(&rec);
	const char *argv[] = {"SETRANGE", name, "0", "x"};
	freeReplyObject(cmd(r, 4, argv));
	struct tier2_stats st = {0};
	struct tier2_reader *rd = NULL;
	assert_int_equal(tier2_read_open(r, ns, key, 0, &st, &rd, err, sizeof(err)), TIER2_OK);
	uint64_t arrived = 0;
	while (rc == TIER2_OK && arrived < total)
		rc = tier2_read_next(rd, dst, total, &arrived, err, sizeof(err));
	assert_int_equal(rc, TIER2_DAMAGED);
	assert_non_null(strstr(err, "XXH3"));
	assert_true(arrived < total);
	assert_int_equal(tier2_read_next(rd, dst, total, &arrived, err, sizeof(err)),
	                 TIER2_DAMAGED);
	assert_int_equal(st.miss_damaged, 1);
	tier2_read_close(rd);
	free(want);
	free(dst);
	storeutil_snap_free(&s);
	cluster_router_free(r);
}

static int setup(void **state)
{
	(void)state;
	char err[MODEL_ERROR_MAX] = "";
	twin = model_load_file(K3_SHARED_DIR "/models/kimi-k3-0.40b-twin.json", err);
	if (!twin || model_fingerprint(twin, fp) != 0) {
		fprintf(stderr, "test_tier2_live: the twin model: %s\n", err);
		return -1;
	}
	for (uint32_t i = 0; i < CONV_LEN; i++)
		conv[i] = (i * 2654435761u) % 163840u;
	return clusterutil_start(&cl, 3);
}

static int teardown(void **state)
{
	(void)state;
	clusterutil_stop(&cl);
	model_free(twin);
	return 0;
}

int main(void)
{
	if (tier2util_skip("test_tier2_live"))
		return 77;
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_shared_prefixes),
	        cmocka_unit_test(test_walk_trips),
	        cmocka_unit_test(test_big_entry_spreads),
	        cmocka_unit_test(test_damage_and_eviction),
	        cmocka_unit_test(test_expiry_and_small_chunks),
	        cmocka_unit_test(test_put_from_source),
	        cmocka_unit_test(test_delete),
	        cmocka_unit_test(test_list),
	        cmocka_unit_test(test_ledger),
	        cmocka_unit_test(test_ledger_pages),
	        cmocka_unit_test(test_conversation_blocks),
	        cmocka_unit_test(test_read_window),
	        cmocka_unit_test(test_undo_after_kill),
	        cmocka_unit_test(test_two_puts_at_once),
	        cmocka_unit_test(test_cluster_unreachable),
	};
	return cmocka_run_group_tests_name("tier 2 on a real cluster", tests, setup, teardown);
}
