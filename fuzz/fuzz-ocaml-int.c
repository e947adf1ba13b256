/* fuzz-ocaml-int.c: integers as OCaml reads them (ocaml_int_parse), as
 * sparse_dd's -size and -nice arrive. A 64-bit value printed in decimal
 * parses to itself; a 63-bit one lies in OCaml's int range and is also
 * a 64-bit one, the same one when written in decimal. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>

#include "fuzz.h"
#include "util/ocaml_int.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = fuzz_cstr(data, size);
  int64_t a = 0, b = 0, c = 0;
  int rc64 = ocaml_int_parse(s, OCAML_INT64_BITS, &a);
  CHECK(rc64 == 0 || rc64 == -EINVAL || rc64 == -ERANGE);
  if (rc64 == 0) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, a);
    CHECK(ocaml_int_parse(buf, OCAML_INT64_BITS, &b) == 0);
    CHECK(b == a);
  }
  int rc63 = ocaml_int_parse(s, OCAML_INT_BITS, &c);
  CHECK(rc63 == 0 || rc63 == -EINVAL || rc63 == -ERANGE);
  if (rc63 == 0) {
    CHECK(c >= -(INT64_C(1) << 62) && c < (INT64_C(1) << 62));
    CHECK(rc64 == 0);
    const char *p = s + (s[0] == '-' || s[0] == '+');
    bool prefixed = p[0] == '0' && p[1] && strchr("xXoObBuU", p[1]);
    if (!prefixed)
      CHECK(c == a);
  }
  free(s);
  return 0;
}
