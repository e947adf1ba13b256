/* tap.h: a tiny TAP producer for the unit tests.
 *
 * ok(cond, fmt, ...) and is(got, want, fmt, ...) print one TAP line each;
 * tap_done() prints the plan and returns the exit status (0 when every check
 * passed). Header-only on purpose: each unit test is one C file. */
#ifndef NBDFLOW_TESTS_TAP_H
#define NBDFLOW_TESTS_TAP_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static unsigned tap_count;
static unsigned tap_failed;

static inline int
tap_ok(int cond, const char *file, int line, const char *fmt, ...)
{
  va_list ap;
  tap_count++;
  if (!cond)
    tap_failed++;
  printf("%s %u - ", cond ? "ok" : "not ok", tap_count);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (!cond)
    printf("#   failed at %s:%d\n", file, line);
  return cond;
}

#define ok(cond, ...) tap_ok(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* Compares as unsigned 64-bit and prints both values on failure. */
#define is(got, want, ...)                                                   \
  do {                                                                       \
    unsigned long long tap_g_ = (unsigned long long)(got);                   \
    unsigned long long tap_w_ = (unsigned long long)(want);                  \
    if (!tap_ok(tap_g_ == tap_w_, __FILE__, __LINE__, __VA_ARGS__))          \
      printf("#   got 0x%llx (%llu), want 0x%llx (%llu)\n", tap_g_, tap_g_,   \
             tap_w_, tap_w_);                                                \
  } while (0)

/* Byte comparison with a hex dump of both sides on failure. */
#define is_bytes(got, want, n, ...)                                          \
  do {                                                                       \
    const uint8_t *tap_gb_ = (const uint8_t *)(got);                         \
    const uint8_t *tap_wb_ = (const uint8_t *)(want);                        \
    size_t tap_n_ = (n);                                                     \
    if (!tap_ok(memcmp(tap_gb_, tap_wb_, tap_n_) == 0, __FILE__, __LINE__,   \
                __VA_ARGS__)) {                                              \
      printf("#   got ");                                                    \
      for (size_t tap_i_ = 0; tap_i_ < tap_n_; tap_i_++)                     \
        printf("%02x", tap_gb_[tap_i_]);                                     \
      printf("\n#  want ");                                                  \
      for (size_t tap_i_ = 0; tap_i_ < tap_n_; tap_i_++)                     \
        printf("%02x", tap_wb_[tap_i_]);                                     \
      printf("\n");                                                          \
    }                                                                        \
  } while (0)

static inline int
tap_done(void)
{
  printf("1..%u\n", tap_count);
  if (tap_failed)
    printf("# %u of %u checks failed\n", tap_failed, tap_count);
  return tap_failed ? 1 : 0;
}

#endif
