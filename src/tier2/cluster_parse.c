/* cluster_parse: what the cluster router reads and trusts nothing of: key
 * slots, seed lists, CLUSTER SLOTS replies, MOVED/ASK errors, and hiredis
 * readers bounded in the arrays they accept. No I/O (cluster.c does that). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tier2/cluster.h"

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis's crc16.c. */
static uint16_t crc16(const char *buf, size_t len)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)((uint16_t)(unsigned char)buf[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021)
			                     : (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned cluster_key_slot(const char *key, size_t len)
{
	/* as keyHashSlot: the first '{', then the first '}' after it; an empty
	 * tag, or none, hashes the whole key */
	size_t s = 0;
	while (s < len && key[s] != '{')
		s++;
	if (s < len) {
		size_t e = s + 1;
		while (e < len && key[e] != '}')
			e++;
		if (e < len && e > s + 1)
			return crc16(key + s + 1, e - s - 1) & (CLUSTER_SLOTS - 1);
	}
	return crc16(key, len) & (CLUSTER_SLOTS - 1);
}

static void seterr(char *err, size_t errsz, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errsz, const char *fmt, ...)
{
	if (!err || errsz == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errsz, fmt, ap);
	va_end(ap);
}

/* Up to 64 bytes of untrusted text for a message, with anything unprintable
 * shown as '?'. */
static const char *shown(char *dst, size_t dstsz, const char *src, size_t len)
{
	size_t n = 0;
	for (size_t i = 0; i < len && n + 4 < dstsz && i < 64; i++) {
		unsigned char c = (unsigned char)src[i];
		char ch = '?';
		if (c >= 0x20 && c < 0x7f)
			ch = src[i];
		dst[n++] = ch;
	}
	if (len > 64 && n + 4 < dstsz) {
		memcpy(dst + n, "...", 3);
		n += 3;
	}
	dst[n] = '\0';
	return dst;
}

static int host_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
}

/* Copies a host of len bytes into out->host, checked; an empty host is
 * asked_host (when there is one). */
static int set_host(struct cluster_addr *out, const char *host, size_t len, const char *asked_host,
                    char *err, size_t errsz)
{
	char sh[80];
	if (len == 0) {
		if (!asked_host || !asked_host[0]) {
			seterr(err, errsz, "empty host");
			return -1;
		}
		host = asked_host;
		len = strlen(asked_host);
	}
	if (len > CLUSTER_HOST_MAX) {
		seterr(err, errsz, "host \"%s\" is longer than %d bytes",
		       shown(sh, sizeof(sh), host, len), CLUSTER_HOST_MAX);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		if (!host_char(host[i])) {
			seterr(err, errsz,
			       "host \"%s\" has a character no host name or address has",
			       shown(sh, sizeof(sh), host, len));
			return -1;
		}
	}
	memcpy(out->host, host, len);
	out->host[len] = '\0';
	return 0;
}

static int parse_port(const char *s, size_t len, int *port, char *err, size_t errsz)
{
	char sh[80];
	long v = 0;
	if (len == 0 || len > 5)
		goto bad;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			goto bad;
		v = v * 10 + (s[i] - '0');
	}
	if (v < 1 || v > 65535)
		goto bad;
	*port = (int)v;
	return 0;
bad:
	seterr(err, errsz, "port \"%s\" is not a number 1..65535", shown(sh, sizeof(sh), s, len));
	return -1;
}

/* HOST:PORT, [HOST]:PORT or, bare, an IPv6 address and a port after its last
 * colon, in len bytes. */
static int parse_addr(const char *s, size_t len, const char *asked_host, struct cluster_addr *out,
                      char *err, size_t errsz)
{
	char sh[80];
	const char *host = s, *port;
	size_t hostlen;
	if (len > 0 && s[0] == '[') {
		const char *close = memchr(s, ']', len);
		if (!close || close + 1 == s + len || close[1] != ':') {
			seterr(err, errsz, "\"%s\": want [ADDRESS]:PORT",
			       shown(sh, sizeof(sh), s, len));
			return -1;
		}
		host = s + 1;
		hostlen = (size_t)(close - host);
		port = close + 2;
		if (hostlen == 0) {
			seterr(err, errsz, "\"%s\": empty address in brackets",
			       shown(sh, sizeof(sh), s, len));
			return -1;
		}
	} else {
		const char *colon = NULL;
		for (size_t i = len; i > 0; i--) {
			if (s[i - 1] == ':') {
				colon = s + i - 1;
				break;
			}
		}
		if (!colon) {
			seterr(err, errsz, "\"%s\" has no port: want HOST:PORT",
			       shown(sh, sizeof(sh), s, len));
			return -1;
		}
		hostlen = (size_t)(colon - s);
		port = colon + 1;
	}
	if (parse_port(port, (size_t)(s + len - port), &out->port, err, errsz) != 0)
		return -1;
	return set_host(out, host, hostlen, asked_host, err, errsz);
}

static int parse_seeds(const char *spec, struct cluster_seeds *out, char *err, size_t errsz)
{
	static const char want[] = "want redis://HOST:PORT[,HOST:PORT...]";
	char sh[80], why[200];
	out->n = 0;
	if (!spec || !spec[0]) {
		seterr(err, errsz, "empty seed list: %s", want);
		return -1;
	}
	const char *p = spec;
	if (strncmp(p, "redis://", 8) == 0)
		p += 8;
	else if (strncmp(p, "rediss://", 9) == 0) {
		seterr(err, errsz, "\"%s\": TLS (rediss://) is not supported",
		       shown(sh, sizeof(sh), spec, strlen(spec)));
		return -1;
	}
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		size_t i = out->n + 1;
		if (len == 0) {
			seterr(err, errsz, "seed %zu is empty: %s", i, want);
			return -1;
		}
		shown(sh, sizeof(sh), p, len);
		if (memchr(p, '@', len)) {
			seterr(err, errsz,
			       "seed %zu \"%s\" has a user or password: give them as options, not "
			       "in the seed list",
			       i, sh);
			return -1;
		}
		if (len >= 3 && memmem(p, len, "://", 3)) {
			seterr(err, errsz, "seed %zu \"%s\": only one redis:// at the start: %s", i,
			       sh, want);
			return -1;
		}
		if (memchr(p, '/', len) || memchr(p, '?', len)) {
			seterr(err, errsz, "seed %zu \"%s\" has a path or options: %s", i, sh,
			       want);
			return -1;
		}
		struct cluster_addr a;
		if (parse_addr(p, len, NULL, &a, why, sizeof(why)) != 0) {
			seterr(err, errsz, "seed %zu: %s", i, why);
			return -1;
		}
		int dup = 0;
		for (size_t k = 0; k < out->n && !dup; k++)
			dup = out->addr[k].port == a.port && strcmp(out->addr[k].host, a.host) == 0;
		if (!dup) {
			if (out->n == CLUSTER_MAX_SEEDS) {
				seterr(err, errsz, "more than %d seeds", CLUSTER_MAX_SEEDS);
				return -1;
			}
			out->addr[out->n++] = a;
		}
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

int cluster_seeds_parse(const char *spec, struct cluster_seeds *out, char *err, size_t errsz)
{
	if (parse_seeds(spec, out, err, errsz) == 0)
		return 0;
	out->n = 0;
	return -1;
}

static const char *type_name(int type)
{
	switch (type) {
	case REDIS_REPLY_STRING:
		return "a string";
	case REDIS_REPLY_ARRAY:
		return "an array";
	case REDIS_REPLY_INTEGER:
		return "an integer";
	case REDIS_REPLY_NIL:
		return "nil";
	case REDIS_REPLY_STATUS:
		return "a status";
	case REDIS_REPLY_ERROR:
		return "an error";
	default:
		return "an unknown type";
	}
}

/* An array of at least min elements. */
static int is_array(const redisReply *e, size_t min)
{
	return e && e->type == REDIS_REPLY_ARRAY && e->elements >= min && e->element;
}

/* What a reply that is_array refused is, for a message. */
static const char *shape(const redisReply *e, size_t min, char *buf, size_t bufsz)
{
	if (!e)
		return "missing";
	if (e->type != REDIS_REPLY_ARRAY)
		return type_name(e->type);
	snprintf(buf, bufsz, "an array of fewer than %zu elements", min);
	return buf;
}

static int slot_number(const redisReply *e, size_t range, const char *which, long long *out,
                       char *err, size_t errsz)
{
	if (!e || e->type != REDIS_REPLY_INTEGER) {
		seterr(err, errsz, "CLUSTER SLOTS: range %zu: the %s slot is %s, want an integer",
		       range, which, e ? type_name(e->type) : "missing");
		return -1;
	}
	if (e->integer < 0 || e->integer >= CLUSTER_SLOTS) {
		seterr(err, errsz, "CLUSTER SLOTS: range %zu: %s slot %lld is not 0..%d", range,
		       which, e->integer, CLUSTER_SLOTS - 1);
		return -1;
	}
	*out = e->integer;
	return 0;
}

static int is_string(const redisReply *e)
{
	return e && e->type == REDIS_REPLY_STRING && (e->str || e->len == 0);
}

/* The "ip" of a Redis 7 node's metadata (a flat array of names and values),
 * or NULL. */
static const redisReply *metadata_ip(const redisReply *m)
{
	if (m->elements < 4 || !m->element[3] || m->element[3]->type != REDIS_REPLY_ARRAY)
		return NULL;
	const redisReply *meta = m->element[3];
	for (size_t i = 0; i + 1 < meta->elements; i += 2) {
		const redisReply *k = meta->element[i], *v = meta->element[i + 1];
		if (is_string(k) && is_string(v) && k->len == 2 && memcmp(k->str, "ip", 2) == 0)
			return v;
	}
	return NULL;
}

int cluster_map_parse(const redisReply *reply, const char *asked_host, struct cluster_map *map,
                      char *err, size_t errsz)
{
	char sh[80], why[200];
	for (size_t s = 0; s < CLUSTER_SLOTS; s++)
		map->slot[s] = CLUSTER_NO_NODE;
	map->n_nodes = 0;
	if (!reply) {
		seterr(err, errsz, "CLUSTER SLOTS: no reply");
		return -1;
	}
	if (reply->type == REDIS_REPLY_ERROR) {
		seterr(err, errsz, "CLUSTER SLOTS: %s",
		       reply->str ? shown(sh, sizeof(sh), reply->str, reply->len) : "error");
		return -1;
	}
	if (reply->type != REDIS_REPLY_ARRAY) {
		seterr(err, errsz, "CLUSTER SLOTS: the reply is %s, want an array",
		       type_name(reply->type));
		return -1;
	}
	if (reply->elements == 0) {
		seterr(err, errsz, "CLUSTER SLOTS: no slot is served (is the cluster created?)");
		return -1;
	}
	if (reply->elements > CLUSTER_SLOTS || !reply->element) {
		seterr(err, errsz, "CLUSTER SLOTS: %zu ranges, more than there are slots",
		       reply->elements);
		return -1;
	}
	for (size_t i = 0; i < reply->elements; i++) {
		const redisReply *e = reply->element[i];
		if (!is_array(e, 3)) {
			seterr(err, errsz,
			       "CLUSTER SLOTS: range %zu is %s, want [start, end, master, "
			       "replicas...]",
			       i, shape(e, 3, sh, sizeof(sh)));
			return -1;
		}
		long long start = 0, end = 0;
		if (slot_number(e->element[0], i, "first", &start, err, errsz) != 0 ||
		    slot_number(e->element[1], i, "last", &end, err, errsz) != 0)
			return -1;
		if (start > end) {
			seterr(err, errsz,
			       "CLUSTER SLOTS: range %zu: first slot %lld after last %lld", i,
			       start, end);
			return -1;
		}
		const redisReply *m = e->element[2];
		if (!is_array(m, 2)) {
			seterr(err, errsz,
			       "CLUSTER SLOTS: range %zu: the master is %s, want [host, port, ...]",
			       i, shape(m, 2, sh, sizeof(sh)));
			return -1;
		}
		const redisReply *h = m->element[0], *p = m->element[1];
		if (!h || (h->type != REDIS_REPLY_NIL && !is_string(h))) {
			seterr(err, errsz, "CLUSTER SLOTS: range %zu: the master's host is %s", i,
			       h ? type_name(h->type) : "missing");
			return -1;
		}
		if (!p || p->type != REDIS_REPLY_INTEGER || p->integer < 1 || p->integer > 65535) {
			if (p && p->type == REDIS_REPLY_INTEGER)
				seterr(err, errsz,
				       "CLUSTER SLOTS: range %zu: the master's port %lld is not "
				       "1..65535",
				       i, p->integer);
			else
				seterr(err, errsz,
				       "CLUSTER SLOTS: range %zu: the master's port is %s, want an "
				       "integer",
				       i, p ? type_name(p->type) : "missing");
			return -1;
		}
		const char *host = h->type == REDIS_REPLY_NIL ? "" : h->str;
		size_t hostlen = h->type == REDIS_REPLY_NIL ? 0 : h->len;
		if (hostlen == 1 && host[0] == '?') {
			/* no known endpoint: the node's IP, when its metadata has one */
			const redisReply *ip = metadata_ip(m);
			if (!ip || ip->len == 0)
				continue; /* its slots stay unassigned */
			host = ip->str;
			hostlen = ip->len;
		}
		struct cluster_addr a;
		a.port = (int)p->integer;
		if (set_host(&a, host, hostlen, asked_host, why, sizeof(why)) != 0) {
			seterr(err, errsz, "CLUSTER SLOTS: range %zu: the master's %s", i, why);
			return -1;
		}
		size_t k = 0;
		while (k < map->n_nodes &&
		       !(map->node[k].port == a.port && strcmp(map->node[k].host, a.host) == 0))
			k++;
		if (k == map->n_nodes) {
			if (map->n_nodes == CLUSTER_MAX_NODES) {
				seterr(err, errsz, "CLUSTER SLOTS: more than %d masters",
				       CLUSTER_MAX_NODES);
				return -1;
			}
			map->node[map->n_nodes++] = a;
		}
		for (long long s = start; s <= end; s++) {
			if (map->slot[s] != CLUSTER_NO_NODE) {
				seterr(err, errsz,
				       "CLUSTER SLOTS: range %zu (%lld-%lld) overlaps an earlier "
				       "range at slot %lld",
				       i, start, end, s);
				return -1;
			}
			map->slot[s] = (uint16_t)k;
		}
	}
	return 0;
}

int cluster_scan_parse(const redisReply *reply, char cursor[CLUSTER_CURSOR_MAX + 1],
                       const redisReply **keys, char *err, size_t errsz)
{
	char sh[80];
	cursor[0] = '\0';
	*keys = NULL;
	if (!is_array(reply, 2) || reply->elements != 2) {
		seterr(err, errsz, "SCAN: the reply is %s, want an array of 2",
		       reply && reply->type == REDIS_REPLY_ARRAY ? "an array of another length"
		                                                 : shape(reply, 2, sh, sizeof(sh)));
		return -1;
	}
	const redisReply *c = reply->element[0], *k = reply->element[1];
	if (!is_string(c) || c->len == 0 || c->len > CLUSTER_CURSOR_MAX) {
		seterr(err, errsz, "SCAN: the cursor is %s%s, want 1..%d decimal digits",
		       c ? type_name(c->type) : "missing", is_string(c) ? " of another length" : "",
		       CLUSTER_CURSOR_MAX);
		return -1;
	}
	uint64_t v = 0;
	for (size_t i = 0; i < c->len; i++) {
		unsigned d = (unsigned char)c->str[i] - (unsigned)'0';
		if (d > 9 || v > (UINT64_MAX - d) / 10) {
			char shown_c[2 * CLUSTER_CURSOR_MAX + 1];
			seterr(err, errsz, "SCAN: the cursor \"%s\" is not a decimal u64",
			       shown(shown_c, sizeof(shown_c), c->str, c->len));
			return -1;
		}
		v = v * 10 + d;
	}
	if (!k || k->type != REDIS_REPLY_ARRAY || (k->elements && !k->element)) {
		seterr(err, errsz, "SCAN: the keys are %s, want an array",
		       k ? type_name(k->type) : "missing");
		return -1;
	}
	for (size_t i = 0; i < k->elements; i++) {
		if (!is_string(k->element[i])) {
			seterr(err, errsz, "SCAN: key %zu is %s, want a string", i,
			       k->element[i] ? type_name(k->element[i]->type) : "missing");
			return -1;
		}
	}
	memcpy(cursor, c->str, c->len);
	cursor[c->len] = '\0';
	*keys = k;
	return 0;
}

int cluster_redirect_parse(const char *str, size_t len, const char *asked_host,
                           struct cluster_redirect *out, char *err, size_t errsz)
{
	char sh[80], why[200];
	int kind;
	size_t p;
	if (!str)
		return 0;
	if (len >= 6 && memcmp(str, "MOVED ", 6) == 0) {
		kind = CLUSTER_REDIRECT_MOVED;
		p = 6;
	} else if (len >= 4 && memcmp(str, "ASK ", 4) == 0) {
		kind = CLUSTER_REDIRECT_ASK;
		p = 4;
	} else {
		return 0;
	}
	const char *what = kind == CLUSTER_REDIRECT_MOVED ? "MOVED" : "ASK";
	shown(sh, sizeof(sh), str, len);
	/* the slot: 1 to 5 digits, then one space */
	size_t d = p;
	long slot = 0;
	while (d < len && d - p < 6 && str[d] >= '0' && str[d] <= '9')
		slot = slot * 10 + (str[d++] - '0');
	if (d == p || d - p > 5 || d >= len || str[d] != ' ') {
		seterr(err, errsz, "malformed %s \"%s\": want %s <slot> <host>:<port>", what, sh,
		       what);
		return -1;
	}
	if (slot >= CLUSTER_SLOTS) {
		seterr(err, errsz, "%s \"%s\": slot %ld is not 0..%d", what, sh, slot,
		       CLUSTER_SLOTS - 1);
		return -1;
	}
	const char *addr = str + d + 1;
	size_t alen = len - d - 1;
	if (memchr(addr, ' ', alen)) {
		seterr(err, errsz, "malformed %s \"%s\": text after the address", what, sh);
		return -1;
	}
	struct cluster_redirect r = {.kind = kind, .slot = (unsigned)slot};
	if (alen >= 2 && addr[0] == '?' && addr[1] == ':') {
		r.unknown_host = 1;
		if (parse_port(addr + 2, alen - 2, &r.addr.port, why, sizeof(why)) != 0) {
			seterr(err, errsz, "%s \"%s\": %s", what, sh, why);
			return -1;
		}
	} else if (parse_addr(addr, alen, asked_host, &r.addr, why, sizeof(why)) != 0) {
		seterr(err, errsz, "%s \"%s\": %s", what, sh, why);
		return -1;
	}
	*out = r;
	return 1;
}

/* hiredis's own reply builders, with arrays bounded (hiredis allocates an
 * array of whatever count a peer announces before any element arrives) and
 * each object charged to the reply's budget, when the reader has one (its
 * privdata, which hiredis hands every task of a reply). */
static const redisReplyObjectFunctions *default_fns;
static redisReplyObjectFunctions bounded_fns;
static pthread_once_t fns_once = PTHREAD_ONCE_INIT;

/* 0 when task's reply may take cost bytes more (charged), -1 when not. */
static int charge(const redisReadTask *task, size_t cost)
{
	struct cluster_reply_budget *b = task->privdata;
	if (!b)
		return 0;
	if (b->over || cost > b->left) {
		b->over = 1;
		return -1;
	}
	b->left -= cost;
	return 0;
}

static void *bounded_array(const redisReadTask *task, int elements)
{
	if (elements < 0 || elements > CLUSTER_REPLY_MAX_ELEMENTS)
		return NULL; /* the reader fails the reply */
	if (charge(task, CLUSTER_REPLY_OBJECT_COST + (size_t)elements * sizeof(redisReply *)))
		return NULL;
	return default_fns->createArray(task, elements);
}

static void *bounded_string(const redisReadTask *task, char *str, size_t len)
{
	if (charge(task, CLUSTER_REPLY_OBJECT_COST + len + 1))
		return NULL;
	return default_fns->createString(task, str, len);
}

static void *bounded_integer(const redisReadTask *task, long long value)
{
	if (charge(task, CLUSTER_REPLY_OBJECT_COST))
		return NULL;
	return default_fns->createInteger(task, value);
}

static void *bounded_nil(const redisReadTask *task)
{
	if (charge(task, CLUSTER_REPLY_OBJECT_COST))
		return NULL;
	return default_fns->createNil(task);
}

static void fns_init(void)
{
	redisReader *r = redisReaderCreate();
	if (!r)
		return;
	default_fns = r->fn;
	redisReaderFree(r);
	if (default_fns) {
		bounded_fns = *default_fns;
		bounded_fns.createArray = bounded_array;
		bounded_fns.createString = bounded_string;
		bounded_fns.createInteger = bounded_integer;
		bounded_fns.createNil = bounded_nil;
	}
}

void cluster_reader_bound(redisReader *reader)
{
	pthread_once(&fns_once, fns_init);
	if (reader && default_fns && reader->fn == default_fns)
		reader->fn = &bounded_fns;
}

void cluster_reader_charge(redisReader *reader, struct cluster_reply_budget *budget)
{
	cluster_reader_bound(reader);
	if (reader)
		reader->privdata = budget;
}

redisReader *cluster_reader_new(void)
{
	pthread_once(&fns_once, fns_init);
	if (!default_fns)
		return NULL;
	redisReader *r = redisReaderCreate();
	cluster_reader_bound(r);
	return r;
}
