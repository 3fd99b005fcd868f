/* fuzz_cluster: what the tier-2 router reads from the network and from its
 * operator (src/tier2/cluster_parse.c), on arbitrary bytes: RESP through a
 * bounded hiredis reader, every reply through the CLUSTER SLOTS and SCAN
 * parsers and every error reply through the MOVED/ASK parser; the bytes
 * themselves as a redirection, a seed list and a key. What the parsers accept
 * must hold their promises (slots in range, ports 1..65535, hosts of checked
 * bytes, a cursor of digits, keys that are strings). */
#include <stdlib.h>
#include <string.h>

#include "tier2/cluster.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_addr(const struct cluster_addr *a)
{
	size_t n = strlen(a->host);
	if (n > CLUSTER_HOST_MAX || a->port < 1 || a->port > 65535)
		abort();
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)a->host[i] <= 0x20 || (unsigned char)a->host[i] >= 0x7f)
			abort();
}

static void check_redirect(const char *s, size_t len)
{
	struct cluster_redirect rd;
	char err[256];
	int rc = cluster_redirect_parse(s, len, "asked.example", &rd, err, sizeof(err));
	if (rc == 1) {
		if (rd.slot >= CLUSTER_SLOTS ||
		    (rd.kind != CLUSTER_REDIRECT_MOVED && rd.kind != CLUSTER_REDIRECT_ASK))
			abort();
		if (!rd.unknown_host)
			check_addr(&rd.addr);
	} else if (rc == -1 && strlen(err) == 0) {
		abort(); /* a refusal says why */
	}
}

static struct cluster_map map;

static void check_reply(const redisReply *rep)
{
	char err[256];
	if (cluster_map_parse(rep, "asked.example", &map, err, sizeof(err)) == 0) {
		if (map.n_nodes == 0 || map.n_nodes > CLUSTER_MAX_NODES)
			abort();
		for (size_t k = 0; k < map.n_nodes; k++)
			check_addr(&map.node[k]);
		for (size_t s = 0; s < CLUSTER_SLOTS; s++)
			if (map.slot[s] != CLUSTER_NO_NODE && map.slot[s] >= map.n_nodes)
				abort();
	} else if (strlen(err) == 0) {
		abort();
	}
	if (rep->type == REDIS_REPLY_ERROR)
		check_redirect(rep->str, rep->len);
	char cursor[CLUSTER_CURSOR_MAX + 1];
	const redisReply *keys = NULL;
	if (cluster_scan_parse(rep, cursor, &keys, err, sizeof(err)) == 0) {
		size_t n = strlen(cursor);
		if (n == 0 || n > CLUSTER_CURSOR_MAX || !keys || keys->type != REDIS_REPLY_ARRAY)
			abort();
		for (size_t i = 0; i < keys->elements; i++)
			if (keys->element[i]->type != REDIS_REPLY_STRING)
				abort();
	} else if (strlen(err) == 0 || keys) {
		abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *s = (const char *)data;
	if (cluster_key_slot(s, size) >= CLUSTER_SLOTS)
		abort();
	check_redirect(s, size);

	char *spec = malloc(size + 1);
	if (!spec)
		abort();
	memcpy(spec, data, size);
	spec[size] = '\0';
	struct cluster_seeds seeds;
	char err[256];
	if (cluster_seeds_parse(spec, &seeds, err, sizeof(err)) == 0) {
		if (seeds.n == 0 || seeds.n > CLUSTER_MAX_SEEDS)
			abort();
		for (size_t i = 0; i < seeds.n; i++)
			check_addr(&seeds.addr[i]);
	}
	free(spec);

	redisReader *rd = cluster_reader_new();
	if (!rd)
		abort();
	if (redisReaderFeed(rd, s, size) == REDIS_OK) {
		for (int i = 0; i < 64; i++) {
			void *rep = NULL;
			if (redisReaderGetReply(rd, &rep) != REDIS_OK || !rep)
				break;
			check_reply(rep);
			freeReplyObject(rep);
		}
	}
	redisReaderFree(rd);
	return 0;
}
