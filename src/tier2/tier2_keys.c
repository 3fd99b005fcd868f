/* tier2_keys: the names of tier 2's keys and the namespace's syntax
 * (tier2.h, "Layout"). */
#include <stdio.h>
#include <string.h>

#include "hexutil.h"
#include "tier2/tier2.h"
#include "xxh_dispatch.h"

int tier2_ns_check(const char *ns, char *err, size_t errsz)
{
	size_t n = ns ? strlen(ns) : 0;
	if (n == 0 || n > TIER2_NS_MAX) {
		snprintf(err, errsz, "tier2: namespace of %zu bytes (want 1..%u)", n, TIER2_NS_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)ns[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok) {
			snprintf(err, errsz,
			         "tier2: namespace \"%.64s\" has byte %#x at %zu (want "
			         "[A-Za-z0-9._-]: "
			         "no ':' and no hash tag)",
			         ns, c, i);
			return -1;
		}
	}
	return 0;
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

size_t tier2_name_node(char *out, const char *ns, const uint8_t node[16])
{
	char hex[33];
	hexutil_encode(node, 16, hex);
	return (size_t)snprintf(out, TIER2_NAME_MAX, "k3:%s:n:%s", ns, hex);
}

uint64_t tier2_tail_hash(const uint32_t *tokens, uint32_t from, uint32_t to)
{
	return XXH3_64bits(tokens + from, (size_t)(to - from) * 4u);
}
