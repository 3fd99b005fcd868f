/* cluster: the tier-2 router's parsers against replies recorded from a real
 * Redis 7.0 cluster (bytes as redis-server sent them, fed through hiredis's
 * reader), and against broken ones: key slots, slot maps, MOVED and ASK,
 * seed lists, the bounded reader, and a router's refusals without a server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster_replies.h"
#include "tier2/cluster.h"

/* One reply from len bytes through a bounded hiredis reader; NULL when the
 * bytes hold no whole reply. */
static redisReply *resp(const char *bytes, size_t len)
{
	redisReader *rd = cluster_reader_new();
	assert_non_null(rd);
	assert_int_equal(redisReaderFeed(rd, bytes, len), REDIS_OK);
	void *rep = NULL;
	if (redisReaderGetReply(rd, &rep) != REDIS_OK)
		rep = NULL;
	redisReaderFree(rd);
	return rep;
}
#define RESP(lit) resp(lit, sizeof(lit) - 1)

static void test_key_slot(void **state)
{
	(void)state;
	/* values from CLUSTER KEYSLOT on redis-server 7.0 and the Redis docs */
	static const struct {
		const char *key;
		unsigned slot;
	} cases[] = {
	        {"foo", 12182},
	        {"somekey", 11058},
	        {"foo{hash_tag}", 2515},
	        {"bar{hash_tag}", 2515},
	        {"{user1000}.following", 3443},
	        {"{user1000}.followers", 3443},
	        {"foo{}{bar}", 8363},    /* empty first tag: the whole key */
	        {"foo{{bar}}zap", 4015}, /* the tag is "{bar" */
	        {"{bar", 4015},
	        {"foo{bar}{zap}", 5061}, /* the first tag only: "bar" */
	        {"bar", 5061},
	        {"123456789", 12739}, /* CRC16/XMODEM check value 0x31C3 */
	        {"", 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned got = cluster_key_slot(cases[i].key, strlen(cases[i].key));
		if (got != cases[i].slot)
			fail_msg("slot of \"%s\" is %u, want %u", cases[i].key, got, cases[i].slot);
	}
	/* binary keys: the length counts, not a NUL */
	assert_int_equal(cluster_key_slot("foo\0zz", 3), 12182);
	assert_int_not_equal(cluster_key_slot("foo\0zz", 6), 12182);
	/* a '}' before the '{' is no tag */
	assert_int_equal(cluster_key_slot("}{bar}", 6), 5061);
	assert_int_not_equal(cluster_key_slot("{bar", 4), 5061);
}

static void expect_slot(const struct cluster_map *m, unsigned slot, const char *host, int port)
{
	if (m->slot[slot] == CLUSTER_NO_NODE)
		fail_msg("slot %u has no node, want %s:%d", slot, host, port);
	const struct cluster_addr *a = &m->node[m->slot[slot]];
	if (strcmp(a->host, host) != 0 || a->port != port)
		fail_msg("slot %u is %s:%d, want %s:%d", slot, a->host, a->port, host, port);
}

static void test_map_recorded(void **state)
{
	(void)state;
	struct cluster_map *m = malloc(sizeof(*m));
	assert_non_null(m);
	char err[256] = "";

	redisReply *rep = RESP(slots_3masters);
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, "10.9.9.9", m, err, sizeof(err)), 0);
	assert_int_equal(m->n_nodes, 3);
	expect_slot(m, 0, "127.0.0.1", 17101);
	expect_slot(m, 5460, "127.0.0.1", 17101);
	expect_slot(m, 5461, "127.0.0.1", 17102);
	expect_slot(m, 10922, "127.0.0.1", 17102);
	expect_slot(m, 10923, "127.0.0.1", 17103);
	expect_slot(m, 12182, "127.0.0.1", 17103);
	expect_slot(m, 16383, "127.0.0.1", 17103);
	freeReplyObject(rep);

	/* replicas are not masters */
	rep = RESP(slots_replicas);
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), 0);
	assert_int_equal(m->n_nodes, 3);
	expect_slot(m, 0, "127.0.0.1", 17104);
	expect_slot(m, 6000, "127.0.0.1", 17105);
	expect_slot(m, 16383, "127.0.0.1", 17106);
	for (size_t k = 0; k < m->n_nodes; k++)
		assert_true(m->node[k].port >= 17104 && m->node[k].port <= 17106);
	freeReplyObject(rep);

	/* nil endpoints: the node asked */
	rep = RESP(slots_nil_hosts);
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, "10.0.0.5", m, err, sizeof(err)), 0);
	expect_slot(m, 0, "10.0.0.5", 17104);
	expect_slot(m, 10922, "10.0.0.5", 17105);
	expect_slot(m, 16383, "10.0.0.5", 17106);
	/* and without a node asked, refused */
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "empty host"));
	freeReplyObject(rep);

	/* "?": the metadata's IP, or no node */
	rep = RESP(slots_unknown_hosts);
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, "10.0.0.5", m, err, sizeof(err)), 0);
	expect_slot(m, 0, "node-a.example", 17104);
	expect_slot(m, 5461, "127.0.0.2", 17105);
	assert_int_equal(m->slot[10923], CLUSTER_NO_NODE);
	assert_int_equal(m->slot[16383], CLUSTER_NO_NODE);
	assert_int_equal(m->n_nodes, 2);
	freeReplyObject(rep);
	free(m);
}

#define MASTER(host, port) "*2\r\n" host port
#define H9                 "$9\r\n127.0.0.1\r\n"

static void test_map_refusals(void **state)
{
	(void)state;
	static const struct {
		const char *resp, *why;
	} bad[] = {
	        {"+OK\r\n", "want an array"},
	        {":3\r\n", "want an array"},
	        {"$-1\r\n", "want an array"},
	        {"-ERR This instance has cluster support disabled\r\n", "cluster support disabled"},
	        {"*0\r\n", "no slot is served"},
	        {"*1\r\n:5\r\n", "range 0 is an integer"},
	        {"*1\r\n*-1\r\n", "range 0 is nil"},
	        {"*1\r\n*2\r\n:0\r\n:5\r\n", "fewer than 3"},
	        {"*1\r\n*3\r\n:0\r\n:16384\r\n" MASTER(H9, ":7000\r\n"), "16384 is not 0..16383"},
	        {"*1\r\n*3\r\n:-1\r\n:5\r\n" MASTER(H9, ":7000\r\n"), "-1 is not 0..16383"},
	        {"*1\r\n*3\r\n:9\r\n:5\r\n" MASTER(H9, ":7000\r\n"), "first slot 9 after last 5"},
	        {"*1\r\n*3\r\n$1\r\n0\r\n:5\r\n" MASTER(H9, ":7000\r\n"), "slot is a string"},
	        {"*1\r\n*3\r\n:0\r\n$1\r\n5\r\n" MASTER(H9, ":7000\r\n"), "last slot is a string"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n:7000\r\n", "master is an integer"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n*1\r\n" H9, "fewer than 2"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER(H9, ":0\r\n"), "port 0 is not 1..65535"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER(H9, ":65536\r\n"), "port 65536 is not"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER(H9, ":-7000\r\n"), "port -7000 is not"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER(H9, "$4\r\n7000\r\n"), "port is a string"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER(":1\r\n", ":7000\r\n"), "host is an integer"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER("*0\r\n", ":7000\r\n"), "host is an array"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER("$9\r\n127.0 0.1\r\n", ":7000\r\n"),
	         "character"},
	        {"*1\r\n*3\r\n:0\r\n:5\r\n" MASTER("$9\r\n127.0\n0.1\r\n", ":7000\r\n"),
	         "character"},
	        {"*2\r\n*3\r\n:0\r\n:100\r\n" MASTER(
	                 H9, ":7000\r\n") "*3\r\n:100\r\n:200\r\n" MASTER(H9, ":7001\r\n"),
	         "overlaps an earlier range at slot 100"},
	        {"*2\r\n*3\r\n:0\r\n:100\r\n" MASTER(H9, ":7000\r\n") ":1\r\n",
	         "range 1 is an integer"},
	};
	struct cluster_map *m = malloc(sizeof(*m));
	assert_non_null(m);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		redisReply *rep = resp(bad[i].resp, strlen(bad[i].resp));
		if (!rep)
			fail_msg("case %zu: the reader gave no reply", i);
		char err[256] = "";
		int rc = cluster_map_parse(rep, "10.0.0.5", m, err, sizeof(err));
		freeReplyObject(rep);
		if (rc != -1)
			fail_msg("case %zu should be refused (%s)", i, bad[i].why);
		if (!strstr(err, bad[i].why))
			fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].why);
		assert_non_null(strstr(err, "CLUSTER SLOTS"));
	}
	/* a NUL inside the host */
	static const char nul_host[] =
	        "*1\r\n*3\r\n:0\r\n:5\r\n*2\r\n$9\r\n127.0\0000.1\r\n:7000\r\n";
	redisReply *rep = RESP(nul_host);
	assert_non_null(rep);
	char err[256] = "";
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "character"));
	freeReplyObject(rep);

	/* a host longer than 255 bytes */
	char longer[600];
	char host[257];
	memset(host, 'a', 256);
	host[256] = '\0';
	snprintf(longer, sizeof(longer), "*1\r\n*3\r\n:0\r\n:5\r\n*2\r\n$256\r\n%s\r\n:7000\r\n",
	         host);
	rep = resp(longer, strlen(longer));
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "longer than 255"));
	freeReplyObject(rep);
	/* 255 is fine */
	snprintf(longer, sizeof(longer),
	         "*1\r\n*3\r\n:0\r\n:5\r\n*2\r\n$255\r\n%.255s\r\n:7000\r\n", host);
	rep = resp(longer, strlen(longer));
	assert_non_null(rep);
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), 0);
	assert_int_equal(strlen(m->node[m->slot[5]].host), 255);
	assert_int_equal(m->slot[6], CLUSTER_NO_NODE);
	freeReplyObject(rep);

	/* a truncated recording is no reply at all, and no reply is refused */
	assert_null(resp(slots_3masters, sizeof(slots_3masters) - 10));
	assert_int_equal(cluster_map_parse(NULL, NULL, m, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "no reply"));
	free(m);
}

static void test_map_masters_bound(void **state)
{
	(void)state;
	/* one range per slot, each a different port: more masters than allowed */
	size_t cap = 16 + (size_t)(CLUSTER_MAX_NODES + 1) * 64;
	char *buf = malloc(cap);
	assert_non_null(buf);
	size_t n = (size_t)snprintf(buf, cap, "*%d\r\n", CLUSTER_MAX_NODES + 1);
	for (int i = 0; i <= CLUSTER_MAX_NODES; i++)
		n += (size_t)snprintf(buf + n, cap - n, "*3\r\n:%d\r\n:%d\r\n*2\r\n" H9 ":%d\r\n",
		                      i, i, 10000 + i);
	redisReply *rep = resp(buf, n);
	assert_non_null(rep);
	struct cluster_map *m = malloc(sizeof(*m));
	assert_non_null(m);
	char err[256] = "";
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "more than 1024 masters"));
	/* one fewer range fits */
	rep->elements--;
	assert_int_equal(cluster_map_parse(rep, NULL, m, err, sizeof(err)), 0);
	assert_int_equal(m->n_nodes, CLUSTER_MAX_NODES);
	rep->elements++;
	freeReplyObject(rep);
	free(m);
	free(buf);
}

static void expect_redirect(const char *text, const char *asked, int kind, unsigned slot,
                            const char *host, int port, int unknown)
{
	struct cluster_redirect rd;
	memset(&rd, 0x5a, sizeof(rd));
	char err[256] = "";
	int rc = cluster_redirect_parse(text, strlen(text), asked, &rd, err, sizeof(err));
	if (rc != 1)
		fail_msg("\"%s\" should be a redirection (rc %d: %s)", text, rc, err);
	if (rd.kind != kind || rd.slot != slot || rd.addr.port != port ||
	    rd.unknown_host != unknown || strcmp(rd.addr.host, host) != 0)
		fail_msg("\"%s\" is kind %d slot %u %s:%d unknown %d", text, rd.kind, rd.slot,
		         rd.addr.host, rd.addr.port, rd.unknown_host);
}

static void test_redirect(void **state)
{
	(void)state;
	/* the recorded replies */
	redisReply *rep = RESP(moved_reply);
	assert_non_null(rep);
	assert_int_equal(rep->type, REDIS_REPLY_ERROR);
	expect_redirect(rep->str, "h", CLUSTER_REDIRECT_MOVED, 12182, "127.0.0.1", 17103, 0);
	freeReplyObject(rep);
	rep = RESP(ask_reply);
	assert_non_null(rep);
	expect_redirect(rep->str, "h", CLUSTER_REDIRECT_ASK, 12182, "127.0.0.1", 17102, 0);
	freeReplyObject(rep);
	rep = RESP(moved_empty_host);
	assert_non_null(rep);
	expect_redirect(rep->str, "10.1.2.3", CLUSTER_REDIRECT_MOVED, 12182, "10.1.2.3", 17106, 0);
	freeReplyObject(rep);
	rep = RESP(moved_unknown_host);
	assert_non_null(rep);
	expect_redirect(rep->str, "10.1.2.3", CLUSTER_REDIRECT_MOVED, 12182, "", 17106, 1);
	freeReplyObject(rep);

	expect_redirect("MOVED 0 ::1:7000", NULL, CLUSTER_REDIRECT_MOVED, 0, "::1", 7000, 0);
	expect_redirect("ASK 16383 [::1]:7000", NULL, CLUSTER_REDIRECT_ASK, 16383, "::1", 7000, 0);
	expect_redirect("MOVED 3999 fe80::1%eth0:6381", NULL, CLUSTER_REDIRECT_MOVED, 3999,
	                "fe80::1%eth0", 6381, 0);
	expect_redirect("MOVED 7 redis-2.example:65535", NULL, CLUSTER_REDIRECT_MOVED, 7,
	                "redis-2.example", 65535, 0);
	expect_redirect("ASK 7 :1", "::1", CLUSTER_REDIRECT_ASK, 7, "::1", 1, 0);

	/* other errors: 0, out untouched */
	static const char *other[] = {"ERR unknown command 'FOO'",
	                              "MOVEDX 1 a:1",
	                              "moved 1 a:1",
	                              "ASKING",
	                              "CLUSTERDOWN Hash slot not served",
	                              "",
	                              "MOVED",
	                              "TRYAGAIN Multiple keys request during rehashing of slot"};
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
		struct cluster_redirect rd = {.kind = 99};
		char err[64] = "";
		if (cluster_redirect_parse(other[i], strlen(other[i]), "h", &rd, err,
		                           sizeof(err)) != 0)
			fail_msg("\"%s\" is no redirection", other[i]);
		assert_int_equal(rd.kind, 99);
	}
	assert_int_equal(cluster_redirect_parse(NULL, 0, "h", NULL, NULL, 0), 0);

	/* malformed: -1 and a reason */
	static const struct {
		const char *text, *asked, *why;
	} bad[] = {
	        {"MOVED 16384 h:1", "x", "slot 16384 is not 0..16383"},
	        {"MOVED 99999 h:1", "x", "slot 99999 is not"},
	        {"MOVED 123456 h:1", "x", "malformed MOVED"},
	        {"MOVED abc h:1", "x", "malformed MOVED"},
	        {"MOVED -1 h:1", "x", "malformed MOVED"},
	        {"MOVED  1 h:1", "x", "malformed MOVED"},
	        {"MOVED 1", "x", "malformed MOVED"},
	        {"MOVED 1 ", "x", "no port"},
	        {"MOVED 1 h", "x", "no port"},
	        {"MOVED 1 h:", "x", "port \"\" is not"},
	        {"MOVED 1 h:0", "x", "port \"0\" is not"},
	        {"MOVED 1 h:65536", "x", "port \"65536\" is not"},
	        {"MOVED 1 h:123456", "x", "port \"123456\" is not"},
	        {"MOVED 1 h:7x", "x", "port \"7x\" is not"},
	        {"MOVED 1 h:1 extra", "x", "text after the address"},
	        {"ASK 1 :1", NULL, "empty host"},
	        {"ASK 1 :1", "", "empty host"},
	        {"ASK 1 [::1:7000", "x", "want [ADDRESS]:PORT"},
	        {"ASK 1 []:7000", "x", "empty address"},
	        {"ASK 1 ?:", "x", "port \"\" is not"},
	        {"ASK 1 h\tx:1", "x", "character"},
	        {"ASK 1 h\x01:1", "x", "character"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct cluster_redirect rd = {.kind = 99};
		char err[256] = "";
		int rc = cluster_redirect_parse(bad[i].text, strlen(bad[i].text), bad[i].asked, &rd,
		                                err, sizeof(err));
		if (rc != -1)
			fail_msg("\"%s\" should be refused (rc %d)", bad[i].text, rc);
		if (!strstr(err, bad[i].why))
			fail_msg("\"%s\": \"%s\" does not say \"%s\"", bad[i].text, err,
			         bad[i].why);
		assert_int_equal(rd.kind, 99);
	}

	/* bounded by len, with no NUL: the port is cut to "171" */
	static const char cut[27] = "MOVED 12182 127.0.0.1:17103";
	struct cluster_redirect rd = {0};
	char err[512] = "";
	assert_int_equal(cluster_redirect_parse(cut, sizeof(cut), NULL, &rd, err, sizeof(err)), 1);
	assert_int_equal(rd.addr.port, 17103);
	assert_int_equal(cluster_redirect_parse(cut, sizeof(cut) - 2, NULL, &rd, err, sizeof(err)),
	                 1);
	assert_int_equal(rd.addr.port, 171);
	/* a host of 256 bytes */
	char lng[300];
	snprintf(lng, sizeof(lng), "MOVED 1 %0256d:1", 0);
	assert_int_equal(cluster_redirect_parse(lng, strlen(lng), NULL, &rd, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "longer than 255"));
}

static void test_seeds(void **state)
{
	(void)state;
	struct cluster_seeds s;
	char err[256] = "";
	assert_int_equal(
	        cluster_seeds_parse("redis://127.0.0.1:7000,127.0.0.1:7001", &s, err, sizeof(err)),
	        0);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.addr[0].host, "127.0.0.1");
	assert_int_equal(s.addr[0].port, 7000);
	assert_int_equal(s.addr[1].port, 7001);
	assert_int_equal(cluster_seeds_parse("localhost:6379", &s, err, sizeof(err)), 0);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.addr[0].host, "localhost");
	assert_int_equal(cluster_seeds_parse("redis://[::1]:7000,::1:7001,redis-a.example:1", &s,
	                                     err, sizeof(err)),
	                 0);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.addr[0].host, "::1");
	assert_string_equal(s.addr[1].host, "::1");
	assert_int_equal(s.addr[1].port, 7001);
	assert_string_equal(s.addr[2].host, "redis-a.example");
	/* given twice, kept once */
	assert_int_equal(cluster_seeds_parse("redis://a:1,a:1,a:2", &s, err, sizeof(err)), 0);
	assert_int_equal(s.n, 2);

	static const struct {
		const char *spec, *why;
	} bad[] = {
	        {"", "empty seed list"},
	        {"redis://", "seed 1 is empty"},
	        {"redis://,a:1", "seed 1 is empty"},
	        {"a:1,", "seed 2 is empty"},
	        {"a:1,,b:2", "seed 2 is empty"},
	        {"a", "has no port"},
	        {"a:", "port \"\" is not"},
	        {"a:0", "port \"0\" is not"},
	        {"a:65536", "port \"65536\" is not"},
	        {"a:12x", "port \"12x\" is not"},
	        {"a:-1", "port \"-1\" is not"},
	        {":7000", "empty host"},
	        {"redis://user:pw@h:1", "user or password"},
	        {"rediss://h:1", "TLS"},
	        {"redis://redis://h:1", "only one redis://"},
	        {"a:1,redis://h:1", "only one redis://"},
	        {"http://h:1", "only one redis://"},
	        {"h:1/0", "path"},
	        {"h:1?db=0", "path or options"},
	        {"[::1:7000", "want [ADDRESS]:PORT"},
	        {"[::1]7000", "want [ADDRESS]:PORT"},
	        {"[]:7000", "empty address"},
	        {"h h:1", "character"},
	        {"h:1, b:2", "character"},
	        {"h\n:1", "character"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		if (cluster_seeds_parse(bad[i].spec, &s, err, sizeof(err)) != -1)
			fail_msg("\"%s\" should be refused", bad[i].spec);
		if (!strstr(err, bad[i].why))
			fail_msg("\"%s\": \"%s\" does not say \"%s\"", bad[i].spec, err,
			         bad[i].why);
		assert_int_equal(s.n, 0);
	}
	assert_int_equal(cluster_seeds_parse(NULL, &s, err, sizeof(err)), -1);

	/* 64 seeds fit, 65 do not; a host of 256 bytes does not */
	char spec[2048];
	size_t n = 0;
	for (int i = 0; i < CLUSTER_MAX_SEEDS; i++)
		n += (size_t)snprintf(spec + n, sizeof(spec) - n, "%sh:%d", i ? "," : "", i + 1);
	assert_int_equal(cluster_seeds_parse(spec, &s, err, sizeof(err)), 0);
	assert_int_equal(s.n, CLUSTER_MAX_SEEDS);
	snprintf(spec + n, sizeof(spec) - n, ",h:999");
	assert_int_equal(cluster_seeds_parse(spec, &s, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "more than 64 seeds"));
	snprintf(spec, sizeof(spec), "%0256d:1", 0);
	assert_int_equal(cluster_seeds_parse(spec, &s, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "longer than 255"));
	spec[1] = ':';
	spec[2] = '\0';
	assert_int_equal(cluster_seeds_parse(spec, &s, err, sizeof(err)), -1);
}

static void test_bounded_reader(void **state)
{
	(void)state;
	char buf[64];
	/* a count over the bound fails the reply before any allocation */
	snprintf(buf, sizeof(buf), "*%d\r\n", CLUSTER_REPLY_MAX_ELEMENTS + 1);
	redisReader *rd = cluster_reader_new();
	assert_non_null(rd);
	assert_int_equal(redisReaderFeed(rd, buf, strlen(buf)), REDIS_OK);
	void *rep = NULL;
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
	assert_null(rep);
	redisReaderFree(rd);
	/* nested too */
	snprintf(buf, sizeof(buf), "*2\r\n:1\r\n*2000000000\r\n");
	rd = cluster_reader_new();
	assert_non_null(rd);
	assert_int_equal(redisReaderFeed(rd, buf, strlen(buf)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
	redisReaderFree(rd);
	/* a count at the bound is read (its elements have not come yet) */
	snprintf(buf, sizeof(buf), "*%d\r\n:1\r\n", CLUSTER_REPLY_MAX_ELEMENTS);
	rd = cluster_reader_new();
	assert_non_null(rd);
	assert_int_equal(redisReaderFeed(rd, buf, strlen(buf)), REDIS_OK);
	rep = NULL;
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
	assert_null(rep);
	redisReaderFree(rd);
	/* a context-less reader from hiredis, bounded afterwards */
	rd = redisReaderCreate();
	assert_non_null(rd);
	cluster_reader_bound(rd);
	snprintf(buf, sizeof(buf), "*%d\r\n", CLUSTER_REPLY_MAX_ELEMENTS + 1);
	assert_int_equal(redisReaderFeed(rd, buf, strlen(buf)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
	redisReaderFree(rd);
}

/* A reader charging its replies' objects to a budget: a reply that costs
 * what is left is read, a byte less fails it (over set), and the budget,
 * refilled, serves the next reply. */
static void test_reader_charged(void **state)
{
	(void)state;
	static const char three[] = "*3\r\n:1\r\n$2\r\nab\r\n$-1\r\n";
	/* the array and its 3 slots, an integer, "ab" and its NUL, a nil */
	size_t cost = 4 * CLUSTER_REPLY_OBJECT_COST + 3 * sizeof(redisReply *) + 3;
	struct cluster_reply_budget b = {cost, 0};
	redisReader *rd = cluster_reader_new();
	assert_non_null(rd);
	cluster_reader_charge(rd, &b);
	void *rep = NULL;
	assert_int_equal(redisReaderFeed(rd, three, strlen(three)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
	assert_non_null(rep);
	assert_int_equal(((redisReply *)rep)->elements, 3);
	freeReplyObject(rep);
	assert_int_equal(b.left, 0);
	assert_int_equal(b.over, 0);
	b = (struct cluster_reply_budget){cost - 1, 0};
	assert_int_equal(redisReaderFeed(rd, three, strlen(three)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
	assert_null(rep);
	assert_int_equal(b.over, 1);
	redisReaderFree(rd);
	/* an array's slots are charged when it is announced */
	char buf[64];
	snprintf(buf, sizeof(buf), "*%d\r\n", 1000);
	b = (struct cluster_reply_budget){1000 * sizeof(redisReply *), 0};
	rd = cluster_reader_new();
	cluster_reader_charge(rd, &b);
	assert_int_equal(redisReaderFeed(rd, buf, strlen(buf)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_ERR);
	assert_int_equal(b.over, 1);
	redisReaderFree(rd);
	/* no budget: nothing charged */
	rd = cluster_reader_new();
	cluster_reader_charge(rd, NULL);
	assert_int_equal(redisReaderFeed(rd, three, strlen(three)), REDIS_OK);
	assert_int_equal(redisReaderGetReply(rd, &rep), REDIS_OK);
	assert_non_null(rep);
	freeReplyObject(rep);
	redisReaderFree(rd);
}

/* A SCAN reply from bytes must be refused with a message containing want. */
static void scan_refused(const char *bytes, size_t len, const char *want)
{
	redisReply *rep = resp(bytes, len);
	assert_non_null(rep);
	char cursor[CLUSTER_CURSOR_MAX + 1] = "x", err[256] = "";
	const redisReply *keys = (const redisReply *)1;
	if (cluster_scan_parse(rep, cursor, &keys, err, sizeof(err)) == 0)
		fail_msg("SCAN reply %.*s accepted, want a refusal (%s)", (int)len, bytes, want);
	assert_null(keys);
	assert_string_equal(cursor, "");
	if (!strstr(err, want))
		fail_msg("message \"%s\" does not say \"%s\"", err, want);
	freeReplyObject(rep);
}
#define SCAN_REFUSED(lit, want) scan_refused(lit, sizeof(lit) - 1, want)

static void test_scan_reply(void **state)
{
	(void)state;
	char cursor[CLUSTER_CURSOR_MAX + 1], err[256] = "";
	const redisReply *keys = NULL;
	/* as a Redis 7 node answers SCAN 0 MATCH k3:t:e:* COUNT 512 */
	redisReply *rep = RESP("*2\r\n$4\r\n1792\r\n*2\r\n$5\r\nk3:a1\r\n$0\r\n\r\n");
	assert_int_equal(cluster_scan_parse(rep, cursor, &keys, err, sizeof(err)), 0);
	assert_string_equal(cursor, "1792");
	assert_int_equal(keys->elements, 2);
	assert_int_equal(keys->element[0]->len, 5);
	assert_int_equal(keys->element[1]->len, 0);
	freeReplyObject(rep);
	/* the last page: cursor 0, no keys; the largest cursor */
	rep = RESP("*2\r\n$1\r\n0\r\n*0\r\n");
	assert_int_equal(cluster_scan_parse(rep, cursor, &keys, err, sizeof(err)), 0);
	assert_string_equal(cursor, "0");
	assert_int_equal(keys->elements, 0);
	freeReplyObject(rep);
	rep = RESP("*2\r\n$20\r\n18446744073709551615\r\n*0\r\n");
	assert_int_equal(cluster_scan_parse(rep, cursor, &keys, err, sizeof(err)), 0);
	assert_string_equal(cursor, "18446744073709551615");
	freeReplyObject(rep);
	/* shapes refused */
	SCAN_REFUSED("-ERR unknown command\r\n", "an error");
	SCAN_REFUSED(":5\r\n", "an integer");
	SCAN_REFUSED("*1\r\n$1\r\n0\r\n", "want an array of 2");
	SCAN_REFUSED("*3\r\n$1\r\n0\r\n*0\r\n*0\r\n", "another length");
	SCAN_REFUSED("*2\r\n:0\r\n*0\r\n", "the cursor is an integer");
	SCAN_REFUSED("*2\r\n$0\r\n\r\n*0\r\n", "the cursor is a string of another length");
	SCAN_REFUSED("*2\r\n$21\r\n100000000000000000000\r\n*0\r\n", "another length");
	SCAN_REFUSED("*2\r\n$20\r\n18446744073709551616\r\n*0\r\n", "not a decimal u64");
	SCAN_REFUSED("*2\r\n$2\r\n-1\r\n*0\r\n", "not a decimal u64");
	SCAN_REFUSED("*2\r\n$2\r\n1 \r\n*0\r\n", "not a decimal u64");
	SCAN_REFUSED("*2\r\n$1\r\n0\r\n$3\r\nabc\r\n", "the keys are a string");
	SCAN_REFUSED("*2\r\n$1\r\n0\r\n*-1\r\n", "the keys are nil");
	SCAN_REFUSED("*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n:7\r\n", "key 1 is an integer");
	SCAN_REFUSED("*2\r\n$1\r\n0\r\n*1\r\n*0\r\n", "key 0 is an array");
	SCAN_REFUSED("*2\r\n$1\r\n0\r\n*1\r\n$-1\r\n", "key 0 is nil");
}

static void test_router_refusals(void **state)
{
	(void)state;
	char err[256] = "";
	assert_null(cluster_router_new("nohost", NULL, err, sizeof(err)));
	assert_non_null(strstr(err, "has no port"));
	struct cluster_options o = {.user = "k3"};
	assert_null(cluster_router_new("h:1", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "without a password"));
	o = (struct cluster_options){.command_timeout_ms = -1};
	assert_null(cluster_router_new("h:1", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "negative"));
	o = (struct cluster_options){.backoff_min_ms = 500, .backoff_max_ms = 100};
	assert_null(cluster_router_new("h:1", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "below backoff_min_ms"));

	/* nothing listens on port 1: a clear error, then a backoff */
	o = (struct cluster_options){.backoff_min_ms = 5000, .backoff_max_ms = 5000};
	struct cluster_router *r = cluster_router_new("redis://127.0.0.1:1", &o, err, sizeof(err));
	assert_non_null(r);
	assert_string_equal(cluster_error(r), "");
	struct cluster_addr a;
	assert_int_equal(cluster_slot_node(r, 0, &a), -1);
	assert_int_equal(cluster_slot_node(r, CLUSTER_SLOTS, &a), -1);
	assert_int_equal(cluster_refresh(r), -1);
	assert_non_null(strstr(cluster_error(r), "redis 127.0.0.1:1: connect: "));
	struct cluster_stats st = cluster_stats(r);
	assert_int_equal(st.connects, 1);
	assert_int_equal(st.node_errors, 1);
	const char *argv[] = {"GET", "foo"};
	const size_t lens[] = {3, 3};
	redisReply *rep = (redisReply *)1;
	assert_int_equal(cluster_command_argv(r, "foo", 3, 2, argv, lens, &rep), -1);
	assert_null(rep);
	assert_non_null(strstr(cluster_error(r), "not tried for another"));
	st = cluster_stats(r);
	assert_int_equal(st.connects, 1);
	assert_int_equal(st.backoff_skips, 1);
	assert_int_equal(cluster_command_argv(r, "foo", 3, 0, argv, lens, &rep), -1);
	assert_non_null(strstr(cluster_error(r), "no arguments"));
	struct cluster_cmd cmds[2] = {{"foo", 3, 2, argv, lens, NULL, 0},
	                              {"bar", 3, 2, argv, lens, NULL, 0}};
	assert_int_equal(cluster_pipeline(r, cmds, 2), 2);
	assert_null(cmds[0].reply);
	assert_int_equal(cluster_pipeline(r, cmds, 0), 0);
	/* no map: no masters, and no command for one */
	assert_int_equal(cluster_n_masters(r), 0);
	const char *scan[] = {"SCAN", "0"};
	const size_t scan_lens[] = {4, 1};
	rep = (redisReply *)1;
	assert_int_equal(cluster_command_node(r, 0, 2, scan, scan_lens, &rep), -1);
	assert_null(rep);
	assert_non_null(strstr(cluster_error(r), "no node gave a slot map"));
	cluster_router_free(r);
	cluster_router_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_key_slot),        cmocka_unit_test(test_map_recorded),
	        cmocka_unit_test(test_map_refusals),    cmocka_unit_test(test_map_masters_bound),
	        cmocka_unit_test(test_redirect),        cmocka_unit_test(test_seeds),
	        cmocka_unit_test(test_bounded_reader),  cmocka_unit_test(test_reader_charged),
	        cmocka_unit_test(test_router_refusals), cmocka_unit_test(test_scan_reply),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
