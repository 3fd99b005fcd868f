/* tier2_keys: the names of tier 2's keys and the namespace's syntax
 * (tier2.h, "Layout"). */
#include <stdio.h>
#include <string.h>

#include "hexutil.h"
#include "tier2/tier2.h"
#include "xxh_dispatch.h"

/* Whether s is 1..TIER2_NS_MAX bytes of [A-Za-z0-9._-]. */
static int name_check(const char *what, const char *s, char *err, size_t errsz)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n > TIER2_NS_MAX) {
		snprintf(err, errsz, "tier2: %s of %zu bytes (want 1..%u)", what, n, TIER2_NS_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok) {
			snprintf(err, errsz,
			         "tier2: %s \"%.64s\" has byte %#x at %zu (want "
			         "[A-Za-z0-9._-]: "
			         "no ':' and no hash tag)",
			         what, s, c, i);
			return -1;
		}
	}
	return 0;
}

int tier2_ns_check(const char *ns, char *err, size_t errsz)
{
	return name_check("namespace", ns, err, errsz);
}

int tier2_owner_check(const char *owner, char *err, size_t errsz)
{
	return name_check("owner", owner, err, errsz);
}

size_t tier2_name_record(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN])
{
	char hex[2 * TIER2_KEY_LEN + 1];
	hexutil_encode(key, TIER2_KEY_LEN, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:e:%s", ns, hex);
}

size_t tier2_name_chunk(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN], uint64_t gen,
                        uint32_t i)
{
	char hex[2 * TIER2_KEY_LEN + 1];
	hexutil_encode(key, TIER2_KEY_LEN, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:c:%s:%016llx:%u", ns, hex,
	                        (unsigned long long)gen, i);
}

size_t tier2_name_intent(char *out, const char *ns, const uint8_t key[TIER2_KEY_LEN], uint64_t gen)
{
	char hex[2 * TIER2_KEY_LEN + 1];
	hexutil_encode(key, TIER2_KEY_LEN, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:i:%s:%016llx", ns, hex,
	                        (unsigned long long)gen);
}

size_t tier2_name_node(char *out, const char *ns, const uint8_t node[16])
{
	char hex[33];
	hexutil_encode(node, 16, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:n:%s", ns, hex);
}

size_t tier2_name_ledger(char *out, const char *ns, const char *owner)
{
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:o:%s", ns, owner);
}

int tier2_parse_record_name(const char *name, size_t len, const char *ns,
                            uint8_t key[TIER2_KEY_LEN])
{
	size_t nl = strlen(ns);
	if (len != 3 + nl + 3 + (size_t)2 * TIER2_KEY_LEN || memcmp(name, "k3:", 3) != 0 ||
	    memcmp(name + 3, ns, nl) != 0 || memcmp(name + 3 + nl, ":e:", 3) != 0)
		return -1;
	/* lower case only: the name must be the one tier2_name_record makes */
	const char *hex = name + 3 + nl + 3;
	uint8_t out[TIER2_KEY_LEN];
	for (size_t i = 0; i < (size_t)2 * TIER2_KEY_LEN; i++) {
		char c = hex[i];
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (v < 0)
			return -1;
		if (i % 2 == 0)
			out[i / 2] = (uint8_t)(v << 4);
		else
			out[i / 2] |= (uint8_t)v;
	}
	memcpy(key, out, TIER2_KEY_LEN);
	return 0;
}

uint64_t tier2_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to)
{
	return XXH3_64bits(tokens + from, (size_t)(to - from) * 4u);
}

static size_t name_part(char *out, const char *ns, char kind, const uint8_t node[16],
                        uint32_t layer, int part, uint64_t xxh3)
{
	char hex[33];
	hexutil_encode(node, 16, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:%c:{%s:%u:%c:%016llx}", ns, kind, hex,
	                        layer, part ? 'v' : 'k', (unsigned long long)xxh3);
}

size_t tier2_name_part(char *out, const char *ns, const uint8_t node[16], uint32_t layer, int part,
                       uint64_t xxh3)
{
	return name_part(out, ns, 'p', node, layer, part, xxh3);
}

size_t tier2_name_refs(char *out, const char *ns, const uint8_t node[16], uint32_t layer, int part,
                       uint64_t xxh3)
{
	return name_part(out, ns, 'q', node, layer, part, xxh3);
}
