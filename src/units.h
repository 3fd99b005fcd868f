/* units: sizes and durations as people write them ("64M", "1.5GiB", "90s",
 * "2h") and as tables print them ("1.4 GiB", "3m ago"). */
#ifndef K3_UNITS_H
#define K3_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes: decimal digits with an optional fraction ("1.5"), then an optional
 * B, K/M/G/T, KB/MB/GB/TB or KiB/MiB/GiB/TiB suffix (all binary),
 * case-insensitive, with no space, sign, exponent or hex; a fraction of a byte
 * is dropped. Returns 0, or -1 when s is not a size or exceeds 2^64 - 1. */
int units_parse_size(const char *s, uint64_t *out);

/* Seconds: the same syntax with an optional s/sec, m/min, h or d suffix.
 * Returns 0 or -1. */
int units_parse_duration(const char *s, uint64_t *out);

/* What the _nonzero parsers return for a size or duration that comes to 0. */
#define UNITS_ZERO (-2)

/* units_parse_size and units_parse_duration for a value that must be more
 * than 0: return 0, -1 when s is not a size (a duration) at all, or
 * UNITS_ZERO when it is one that comes to 0 ("0", "0s", or "0.4s", a
 * fraction dropped); *out is set only on 0. */
int units_parse_size_nonzero(const char *s, uint64_t *out);
int units_parse_duration_nonzero(const char *s, uint64_t *out);

/* Why s was refused with UNITS_ZERO, for the flag's message: "must be more
 * than 0", and for a value written as more that came to 0, what it counts
 * as: "must be more than 0 (0.4s counts as 0 whole seconds)", `unit` being
 * "bytes" or "seconds". Written into buf (cut to bufsz), which it returns. */
const char *units_zero_reason(const char *s, const char *unit, char *buf, size_t bufsz);

/* Milliseconds: the same syntax with an optional ms, s/sec or m/min suffix;
 * a bare number is milliseconds ("20", "20ms", "1.5s", "2m"). Returns 0 or
 * -1. */
int units_parse_ms(const char *s, uint64_t *out);

/* A whole number from min to max: decimal digits only (no sign, space,
 * fraction, exponent or hex). Returns 0, or -1 when s is anything else. */
int units_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* "512 B", "1.4 GiB". */
void units_format_size(uint64_t bytes, char *out, size_t outsz);

/* "12s", "3m", "5h", "2d". */
void units_format_duration(uint64_t seconds, char *out, size_t outsz);

#endif
