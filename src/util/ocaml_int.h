/* ocaml_int.h: integers as OCaml's int_of_string and Int64.of_string
 * read them, for values written for xapi's OCaml tools (sparse_dd's
 * command line and configuration). Pure: no I/O, no allocation. */
#ifndef NBDFLOW_UTIL_OCAML_INT_H
#define NBDFLOW_UTIL_OCAML_INT_H

#include <stdint.h>

/* OCaml's int on a 64-bit host, and its Int64. */
#define OCAML_INT_BITS   63
#define OCAML_INT64_BITS 64

/* Parses the whole of s as OCaml reads an integer of bits bits (2 to
 * 64): an optional '-' or '+', then decimal digits, or 0x (0X), 0o (0O),
 * 0b (0B) or 0u (0U) and digits of base 16, 8, 2 or 10; '_' may follow
 * any digit. Decimal is signed: at most 2^(bits-1) - 1, or 2^(bits-1)
 * after '-'. The prefixed forms are unsigned, at most 2^bits - 1, and
 * wrap: bit bits-1 is the sign (0xff...f is -1), and a '-' before one
 * negates modulo 2^bits. Returns 0 with *out; -EINVAL when s is no such
 * number; -ERANGE when it is one beyond those bounds. *out is untouched
 * on error. */
int ocaml_int_parse(const char *s, unsigned bits, int64_t *out);

#endif
