/* size.c: see size.h. */
#include "size.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

int
count_parse(const char *s, uint64_t max, uint64_t *out)
{
  uint64_t v = 0;
  if (*s == '\0')
    return -EINVAL;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return -EINVAL;
    uint64_t d = (uint64_t)(*s - '0');
    if (d > max || v > (max - d) / 10)
      return -ERANGE;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int
size_parse(const char *s, uint64_t *out)
{
  static const char units[] = "KMGTPE";
  uint64_t v = 0;
  const char *p = s;

  if (!isdigit((unsigned char)*p))
    return -EINVAL;
  for (; isdigit((unsigned char)*p); p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -ERANGE;
    v = v * 10 + d;
  }
  if (*p) {
    const char *u = strchr(units, toupper((unsigned char)*p));
    if (u == NULL)
      return -EINVAL;
    unsigned shift = 10 * (unsigned)(u - units + 1);
    if (v > (UINT64_MAX >> shift))
      return -ERANGE;
    v <<= shift;
    p++;
    if (strcasecmp(p, "iB") == 0 || strcasecmp(p, "B") == 0)
      p += strlen(p);
    if (*p)
      return -EINVAL;
  }
  *out = v;
  return 0;
}

char *
size_format(uint64_t n, char *buf, size_t len)
{
  static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB",
                                       "PiB", "EiB" };
  double v = (double)n;
  unsigned i = 0;
  while (v >= 1024 && i < 6) {
    v /= 1024;
    i++;
  }
  if (i == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)n);
  else
    snprintf(buf, len, "%.1f %s", v, units[i]);
  return buf;
}

char *
size_format_exact(uint64_t n, char *buf, size_t len)
{
  static const char units[] = "KMGTPE";
  int i = -1;
  while (n != 0 && n % 1024 == 0 && i < 5) {
    n /= 1024;
    i++;
  }
  if (i < 0)
    snprintf(buf, len, "%llu", (unsigned long long)n);
  else
    snprintf(buf, len, "%llu%c", (unsigned long long)n, units[i]);
  return buf;
}
