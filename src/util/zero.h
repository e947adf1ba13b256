/* zero.h: is a buffer all zero bytes? */
#ifndef NBDFLOW_UTIL_ZERO_H
#define NBDFLOW_UTIL_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* True when p[0..len) are all zero; true for len 0. Checks 16 bytes by
 * hand, then lets memcmp compare the buffer with itself shifted by 16,
 * which runs at memory speed. */
static inline bool
buf_is_zero(const uint8_t *p, size_t len)
{
  if (len == 0)
    return true;
  if (len < 16)
    return p[0] == 0 && memcmp(p, p + 1, len - 1) == 0;
  for (size_t i = 0; i < 16; i++)
    if (p[i])
      return false;
  return memcmp(p, p + 16, len - 16) == 0;
}

#endif
