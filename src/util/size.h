/* size.h: parse and print human sizes ("512M", "10G", "4096"). */
#ifndef NBDFLOW_UTIL_SIZE_H
#define NBDFLOW_UTIL_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* Parses a decimal number with an optional binary suffix (K, M, G, T, P,
 * E; an optional trailing "iB" or "B"). Returns 0 or -EINVAL on junk or
 * -ERANGE on overflow. */
int size_parse(const char *s, uint64_t *out);

/* Parses a count: decimal digits only (no sign, space or suffix: a
 * count of 1K is a mistake, not 1024), at most max. Returns 0, -EINVAL
 * on anything else or -ERANGE above max. */
int count_parse(const char *s, uint64_t max, uint64_t *out);

/* Formats n as "1.5 GiB" into buf; returns buf. */
char *size_format(uint64_t n, char *buf, size_t len);

/* Formats n exactly, in the largest unit it is a whole multiple of:
 * "1536K", "100M", "1000000" (no unit when it is not a multiple of 1024),
 * as nbdinfo prints export-size-str. Returns buf. */
char *size_format_exact(uint64_t n, char *buf, size_t len);

#endif
