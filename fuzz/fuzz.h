/* fuzz.h: what the harnesses share. A broken invariant aborts, which
 * libFuzzer reports as a crash with the input that caused it. */
#ifndef NBDFLOW_FUZZ_H
#define NBDFLOW_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
