/* test-ocaml-int.c: unit tests for src/util/ocaml_int.{h,c}: what OCaml's
 * int_of_string (63 bits) and Int64.of_string (64 bits) make of a string. */
#include <errno.h>

#include "tap.h"
#include "util/ocaml_int.h"

static void
parses(const char *s, unsigned bits, int64_t want)
{
  int64_t v = 0x5a5a;
  int rc = ocaml_int_parse(s, bits, &v);
  is((int64_t)rc, 0, "\"%s\" (%u bits) parses", s, bits);
  is(v, want, "\"%s\" (%u bits) is %lld", s, bits, (long long)want);
}

static void
refused(const char *s, unsigned bits, int err)
{
  int64_t v = 0x5a5a;
  int rc = ocaml_int_parse(s, bits, &v);
  is((int64_t)rc, (int64_t)-err, "\"%s\" (%u bits) refused with %s", s, bits,
     err == EINVAL ? "EINVAL" : "ERANGE");
  is(v, 0x5a5a, "\"%s\": output untouched on error", s);
}

#define MAX63 ((INT64_C(1) << 62) - 1)
#define MIN63 (-MAX63 - 1)

static void
test_forms(void)
{
  parses("0", OCAML_INT_BITS, 0);
  parses("42", OCAML_INT_BITS, 42);
  parses("-42", OCAML_INT_BITS, -42);
  parses("+7", OCAML_INT_BITS, 7);
  parses("-0", OCAML_INT_BITS, 0);
  parses("007", OCAML_INT_BITS, 7);
  parses("1_000", OCAML_INT_BITS, 1000);
  parses("1__0_", OCAML_INT_BITS, 10); /* '_' anywhere after a digit */
  parses("0x10", OCAML_INT_BITS, 16);
  parses("0X1f", OCAML_INT_BITS, 31);
  parses("0xAbC", OCAML_INT_BITS, 0xabc);
  parses("0o17", OCAML_INT_BITS, 15);
  parses("0O7", OCAML_INT_BITS, 7);
  parses("0b101", OCAML_INT_BITS, 5);
  parses("0B1_0", OCAML_INT_BITS, 2);
  parses("0u12", OCAML_INT_BITS, 12);
  parses("-0x10", OCAML_INT_BITS, -16);
  parses("+0b1", OCAML_INT_BITS, 1);
  parses("0x0_1", OCAML_INT_BITS, 1);

  refused("", OCAML_INT_BITS, EINVAL);
  refused("-", OCAML_INT_BITS, EINVAL);
  refused("+", OCAML_INT_BITS, EINVAL);
  refused("0x", OCAML_INT_BITS, EINVAL);
  refused("_1", OCAML_INT_BITS, EINVAL);
  refused("0x_1", OCAML_INT_BITS, EINVAL); /* a digit first */
  refused("-_1", OCAML_INT_BITS, EINVAL);
  refused(" 1", OCAML_INT_BITS, EINVAL);
  refused("1 ", OCAML_INT_BITS, EINVAL);
  refused("1.0", OCAML_INT_BITS, EINVAL);
  refused("1e3", OCAML_INT_BITS, EINVAL);
  refused("12a", OCAML_INT_BITS, EINVAL);
  refused("0xg", OCAML_INT_BITS, EINVAL);
  refused("0b2", OCAML_INT_BITS, EINVAL);
  refused("0o8", OCAML_INT_BITS, EINVAL);
  refused("0u1f", OCAML_INT_BITS, EINVAL);
  refused("00x1", OCAML_INT_BITS, EINVAL);
  refused("--1", OCAML_INT_BITS, EINVAL);
  refused("+-1", OCAML_INT_BITS, EINVAL);
  refused("0z1", OCAML_INT_BITS, EINVAL);
  refused("1M", OCAML_INT_BITS, EINVAL);
  refused("1", 1, EINVAL); /* no such width */
  refused("1", 65, EINVAL);
}

/* OCaml's 63-bit int: decimal is signed; 0x... is unsigned and wraps
 * into the sign bit, bit 62. */
static void
test_int63(void)
{
  parses("4611686018427387903", OCAML_INT_BITS, MAX63);
  refused("4611686018427387904", OCAML_INT_BITS, ERANGE);
  parses("-4611686018427387904", OCAML_INT_BITS, MIN63);
  refused("-4611686018427387905", OCAML_INT_BITS, ERANGE);
  parses("0x3fffffffffffffff", OCAML_INT_BITS, MAX63);
  parses("0x4000000000000000", OCAML_INT_BITS, MIN63);
  parses("0x7fffffffffffffff", OCAML_INT_BITS, -1);
  refused("0x8000000000000000", OCAML_INT_BITS, ERANGE);
  parses("-0x4000000000000000", OCAML_INT_BITS, MIN63);
  parses("-0x7fffffffffffffff", OCAML_INT_BITS, 1);
  parses("0u9223372036854775807", OCAML_INT_BITS, -1);
  refused("0u9223372036854775808", OCAML_INT_BITS, ERANGE);
  refused("99999999999999999999999", OCAML_INT_BITS, ERANGE);
  /* Junk after too many digits is junk. */
  refused("99999999999999999999999x", OCAML_INT_BITS, EINVAL);
}

/* Int64.of_string, as sparse_dd reads -size. */
static void
test_int64(void)
{
  parses("9223372036854775807", OCAML_INT64_BITS, INT64_MAX);
  refused("9223372036854775808", OCAML_INT64_BITS, ERANGE);
  parses("-9223372036854775808", OCAML_INT64_BITS, INT64_MIN);
  refused("-9223372036854775809", OCAML_INT64_BITS, ERANGE);
  parses("0x7fffffffffffffff", OCAML_INT64_BITS, INT64_MAX);
  parses("0x8000000000000000", OCAML_INT64_BITS, INT64_MIN);
  parses("0xffffffffffffffff", OCAML_INT64_BITS, -1);
  parses("0xFFFF_FFFF_FFFF_FFFF", OCAML_INT64_BITS, -1);
  refused("0x10000000000000000", OCAML_INT64_BITS, ERANGE);
  parses("-0xffffffffffffffff", OCAML_INT64_BITS, 1);
  parses("-0x8000000000000000", OCAML_INT64_BITS, INT64_MIN);
  parses("0u18446744073709551615", OCAML_INT64_BITS, -1);
  refused("0u18446744073709551616", OCAML_INT64_BITS, ERANGE);
  refused("18446744073709551616", OCAML_INT64_BITS, ERANGE);
  parses("0x1_0000_0000", OCAML_INT64_BITS, INT64_C(1) << 32);
  parses("0o1000", OCAML_INT64_BITS, 512);
  parses("0b1111111111111111111111111111111111111111111111111111111111111111",
         OCAML_INT64_BITS, -1);
  refused("0b11111111111111111111111111111111111111111111111111111111111111111",
          OCAML_INT64_BITS, ERANGE);
  parses("4611686018427387904", OCAML_INT64_BITS, INT64_C(1) << 62);
}

int
main(void)
{
  test_forms();
  test_int63();
  test_int64();
  return tap_done();
}
