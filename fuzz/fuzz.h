/* fuzz.h: what the harnesses share. A broken invariant aborts, which
 * libFuzzer reports as a crash with the input that caused it. */
#ifndef NBDFLOW_FUZZ_H
#define NBDFLOW_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__,   \
              #cond);                                                        \
      abort();                                                               \
    }                                                                        \
  } while (0)

/* Inside [base, base + len). */
#define WITHIN(p, n, base, len)                                              \
  ((const uint8_t *)(p) >= (const uint8_t *)(base) &&                        \
   (size_t)((const uint8_t *)(p) - (const uint8_t *)(base)) + (size_t)(n) <= \
       (size_t)(len))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a C string (up to its first NUL byte), in a new
 * allocation of size + 1 bytes. The caller frees it. */
static inline char *
fuzz_cstr(const uint8_t *data, size_t size)
{
  char *s = malloc(size + 1);
  CHECK(s);
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

#endif
