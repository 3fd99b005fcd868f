#include "units.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* A number as people write it: decimal digits, optionally a '.' and more
 * digits, then optionally one of the suffixes, nothing else (no sign, space,
 * exponent, hex, inf or nan). Exact: the fraction is scaled digit by digit in
 * integers and what falls below 1 is dropped. */
static int parse_scaled(const char *s, const char *const *suffixes, const uint64_t *scales,
                        size_t n, uint64_t *out)
{
	if (!s)
		return -1;
	const char *p = s;
	uint64_t whole = 0;
	while (*p >= '0' && *p <= '9') {
		unsigned d = (unsigned)(*p - '0');
		if (whole > (UINT64_MAX - d) / 10)
			return -1;
		whole = whole * 10 + d;
		p++;
	}
	if (p == s)
		return -1;
	const char *frac = NULL, *frac_end = NULL;
	if (*p == '.') {
		frac = ++p;
		while (*p >= '0' && *p <= '9')
			p++;
		if (p == frac)
			return -1;
		frac_end = p;
	}
	uint64_t scale = 1;
	if (*p) {
		size_t i;
		for (i = 0; i < n; i++)
			if (!strcasecmp(p, suffixes[i]))
				break;
		if (i == n)
			return -1;
		scale = scales[i];
	}
	if (whole > UINT64_MAX / scale)
		return -1;
	uint64_t total = whole * scale;
	/* floor(scale * 0.d1..dk), from the last digit: acc = (scale * d + acc) / 10
	 * stays below scale, so nothing overflows for any scale < 2^60 */
	uint64_t part = 0;
	for (const char *q = frac_end; frac && q > frac; q--)
		part = (scale * (uint64_t)(q[-1] - '0') + part) / 10;
	if (part > UINT64_MAX - total)
		return -1;
	*out = total + part;
	return 0;
}

int units_parse_size(const char *s, uint64_t *out)
{
	static const char *const suf[] = {"b", "k",  "kb",  "kib", "m",  "mb", "mib",
	                                  "g", "gb", "gib", "t",   "tb", "tib"};
	static const uint64_t sc[] = {1,          1ull << 10, 1ull << 10, 1ull << 10, 1ull << 20,
	                              1ull << 20, 1ull << 20, 1ull << 30, 1ull << 30, 1ull << 30,
	                              1ull << 40, 1ull << 40, 1ull << 40};
	return parse_scaled(s, suf, sc, sizeof(sc) / sizeof(sc[0]), out);
}

int units_parse_duration(const char *s, uint64_t *out)
{
	static const char *const suf[] = {"s", "m", "h", "d", "sec", "min"};
	static const uint64_t sc[] = {1, 60, 3600, 86400, 1, 60};
	return parse_scaled(s, suf, sc, sizeof(sc) / sizeof(sc[0]), out);
}

/* v, parsed with rc, as a _nonzero parser returns it */
static int nonzero(int rc, uint64_t v, uint64_t *out)
{
	if (rc)
		return -1;
	if (v == 0)
		return UNITS_ZERO;
	*out = v;
	return 0;
}

int units_parse_size_nonzero(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int rc = units_parse_size(s, &v);
	return nonzero(rc, v, out);
}

int units_parse_duration_nonzero(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int rc = units_parse_duration(s, &v);
	return nonzero(rc, v, out);
}

const char *units_zero_reason(const char *s, const char *unit, char *buf, size_t bufsz)
{
	/* written as 0 when no digit but 0 comes before the unit */
	size_t digits = strspn(s, "0123456789.");
	int written_as_zero = strspn(s, "0.") >= digits;
	if (written_as_zero)
		snprintf(buf, bufsz, "must be more than 0");
	else
		snprintf(buf, bufsz, "must be more than 0 (%s counts as 0 whole %s)", s, unit);
	return buf;
}

int units_parse_ms(const char *s, uint64_t *out)
{
	static const char *const suf[] = {"ms", "s", "sec", "m", "min"};
	static const uint64_t sc[] = {1, 1000, 1000, 60000, 60000};
	return parse_scaled(s, suf, sc, sizeof(sc) / sizeof(sc[0]), out);
}

int units_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	if (!s || !*s)
		return -1;
	uint64_t v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		unsigned d = (unsigned)(*p - '0');
		if (d > max || v > (max - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (v < min)
		return -1;
	*out = v;
	return 0;
}

void units_format_size(uint64_t bytes, char *out, size_t outsz)
{
	static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	int i = 0;
	while (v >= 1024.0 && i < 5) {
		v /= 1024.0;
		i++;
	}
	if (i == 0)
		snprintf(out, outsz, "%llu B", (unsigned long long)bytes);
	else
		snprintf(out, outsz, v < 10 ? "%.1f %s" : "%.0f %s", v, names[i]);
}

void units_format_duration(uint64_t seconds, char *out, size_t outsz)
{
	if (seconds < 60)
		snprintf(out, outsz, "%llus", (unsigned long long)seconds);
	else if (seconds < 3600)
		snprintf(out, outsz, "%llum", (unsigned long long)(seconds / 60));
	else if (seconds < 86400)
		snprintf(out, outsz, "%lluh", (unsigned long long)(seconds / 3600));
	else
		snprintf(out, outsz, "%llud", (unsigned long long)(seconds / 86400));
}
