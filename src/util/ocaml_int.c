/* ocaml_int.c: see ocaml_int.h. The rules are those of the OCaml
 * runtime's parse_intnat and caml_int64_of_string. */
#include "ocaml_int.h"

#include <errno.h>
#include <stdbool.h>

#include "uri.h"

/* The base a prefix at p names (0x, 0o, 0b, 0u), or 0 without one. */
static unsigned
ocaml_int_prefix(const char *p)
{
  if (p[0] != '0')
    return 0;
  switch (p[1]) {
  case 'x':
  case 'X':
    return 16;
  case 'o':
  case 'O':
    return 8;
  case 'b':
  case 'B':
    return 2;
  case 'u':
  case 'U':
    return 10;
  default:
    return 0;
  }
}

/* u, below 2^bits, as a bits-bit two's complement number. */
static int64_t
ocaml_int_signed(uint64_t u, unsigned bits)
{
  uint64_t top = UINT64_C(1) << (bits - 1);
  if (u < top)
    return (int64_t)u;
  /* u - 2^bits, computed without leaving int64_t */
  return (int64_t)(u - top) - (int64_t)(top - 1) - 1;
}

int
ocaml_int_parse(const char *s, unsigned bits, int64_t *out)
{
  if (bits < 2 || bits > 64)
    return -EINVAL;
  const char *p = s;
  bool neg = *p == '-';
  if (*p == '-' || *p == '+')
    p++;
  unsigned base = ocaml_int_prefix(p);
  bool is_unsigned = base != 0;
  if (is_unsigned)
    p += 2;
  else
    base = 10;
  int d = uri_hexval(*p);
  if (d < 0 || (unsigned)d >= base)
    return -EINVAL;
  uint64_t v = 0;
  bool big = false;
  for (; *p; p++) {
    if (*p == '_')
      continue;
    d = uri_hexval(*p);
    if (d < 0 || (unsigned)d >= base)
      return -EINVAL;
    if (v > (UINT64_MAX - (unsigned)d) / base)
      big = true; /* said once the rest is known to be digits */
    else
      v = v * base + (unsigned)d;
  }
  if (big)
    return -ERANGE;
  uint64_t top = UINT64_C(1) << (bits - 1);
  if (!is_unsigned) {
    if (neg ? v > top : v >= top)
      return -ERANGE;
    /* -v, v up to 2^63, without leaving int64_t */
    *out = !neg ? (int64_t)v : v == 0 ? 0 : -(int64_t)(v - 1) - 1;
    return 0;
  }
  uint64_t mask = bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
  if (v > mask)
    return -ERANGE;
  *out = ocaml_int_signed((neg ? UINT64_C(0) - v : v) & mask, bits);
  return 0;
}
