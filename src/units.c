#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static int parse_scaled(const char *s, const char *const *suffixes, const uint64_t *scales,
                        size_t n, uint64_t *out)
{
	if (!s || !*s || *s == '-' || isspace((unsigned char)*s))
		return -1;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v < 0)
		return -1;
	while (*end == ' ')
		end++;
	uint64_t scale = 1;
	if (*end) {
		size_t i;
		for (i = 0; i < n; i++)
			if (!strcasecmp(end, suffixes[i]))
				break;
		if (i == n)
			return -1;
		scale = scales[i];
	}
	double total = v * (double)scale;
	if (total >= 18446744073709551615.0)
		return -1;
	*out = (uint64_t)total;
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
