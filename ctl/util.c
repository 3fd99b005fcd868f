/* Helpers of k3cachectl's commands: files, token lists, numbers, and the
 * formats of their output. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "hexutil.h"
#include "units.h"

int ctl_file_open(const char *path, struct ctl_file *f, char *err, size_t errsz)
{
	memset(f, 0, sizeof(*f));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errsz, "%s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errsz, "%s: not a regular file", path);
		close(fd);
		return -1;
	}
	/* read, not mapped: a file truncated meanwhile would be SIGBUS in a
	 * map, and one rewritten meanwhile would send other bytes than those
	 * checked */
	if ((uint64_t)st.st_size > SIZE_MAX - 1) {
		snprintf(err, errsz, "%s: too large for this address space", path);
		close(fd);
		return -1;
	}
	size_t want = (size_t)st.st_size;
	unsigned char *buf = malloc(want ? want : 1);
	if (!buf) {
		snprintf(err, errsz, "%s: out of memory for its %zu bytes", path, want);
		close(fd);
		return -1;
	}
	size_t got = 0;
	while (got < want) {
		ssize_t n = read(fd, buf + got, want - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n < 0)
				snprintf(err, errsz, "%s: %s", path, strerror(errno));
			else
				snprintf(err, errsz,
				         "%s: it shrank while being read (%zu of %zu bytes): "
				         "is something writing it?",
				         path, got, want);
			free(buf);
			close(fd);
			return -1;
		}
		got += (size_t)n;
	}
	close(fd);
	f->buf = buf;
	f->data = buf;
	f->size = want;
	return 0;
}

void ctl_file_close(struct ctl_file *f)
{
	free(f->buf);
	memset(f, 0, sizeof(*f));
}

int ctl_parse_u32(const char *s, uint32_t *out)
{
	uint64_t v;
	if (units_parse_uint(s, 0, UINT32_MAX, &v) != 0)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

int ctl_parse_tokens(const char *list, uint32_t **out, uint32_t *n, char *err, size_t errsz)
{
	if (!*list) {
		snprintf(err, errsz, "no tokens given");
		return -1;
	}
	size_t cap = 1;
	for (const char *p = list; *p; p++)
		cap += *p == ',';
	if (cap > UINT32_MAX) {
		snprintf(err, errsz, "more than %u tokens", UINT32_MAX);
		return -1;
	}
	uint32_t *t = malloc(cap * sizeof(*t));
	char *copy = strdup(list);
	if (!t || !copy) {
		free(t);
		free(copy);
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	/* every item between commas is a token: an empty one (",,", or a
	 * leading or trailing comma) is a mistake, not something to skip */
	uint32_t k = 0;
	int ok = 1;
	for (char *tok = copy, *next; ok && tok; tok = next, k++) {
		next = strchr(tok, ',');
		if (next)
			*next++ = '\0';
		if (!*tok) {
			snprintf(err, errsz,
			         "item %u of the list is empty: \"%s\" has a doubled, leading or "
			         "trailing comma",
			         k + 1, list);
			ok = 0;
		} else if (ctl_parse_u32(tok, &t[k]) != 0) {
			snprintf(err, errsz,
			         "item %u of the list (\"%s\") is not a whole number from 0 to %u",
			         k + 1, tok, UINT32_MAX);
			ok = 0;
		}
	}
	free(copy);
	if (!ok) {
		free(t);
		return -1;
	}
	*out = t;
	*n = k;
	return 0;
}

uint64_t ctl_counter(const frame_response *r, const char *name)
{
	for (size_t i = 0; i < r->n_counters; i++)
		if (!strcmp(r->counters[i]->name, name))
			return r->counters[i]->value;
	return 0;
}

void ctl_print_json(FILE *out, json_t *doc)
{
	char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	if (s)
		fprintf(out, "%s\n", s);
	free(s);
	json_decref(doc);
}

json_t *ctl_hex_json(const uint8_t *bytes, size_t len)
{
	char h[129];
	hexutil_encode(bytes, len < 64 ? len : 64, h);
	return json_string(h);
}

void ctl_size(uint64_t bytes, char *out, size_t outsz)
{
	units_format_size(bytes, out, outsz);
}

void ctl_ago(uint64_t when, char *out, size_t outsz)
{
	uint64_t now = (uint64_t)time(NULL);
	if (!when) {
		snprintf(out, outsz, "never");
		return;
	}
	char d[32];
	units_format_duration(now > when ? now - when : 0, d, sizeof(d));
	snprintf(out, outsz, "%s ago", d);
}
