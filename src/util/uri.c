/* uri.c: see uri.h. */
#include "uri.h"

#include <stdlib.h>

int
uri_hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

char *
uri_decode(const char *s, size_t len, bool allow_nul, size_t *outlen)
{
  char *out = malloc(len + 1);
  size_t o = 0;
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < len; i++) {
    if (s[i] != '%') {
      out[o++] = s[i];
      continue;
    }
    if (len - i < 3 || uri_hexval(s[i + 1]) < 0 || uri_hexval(s[i + 2]) < 0) {
      free(out);
      return NULL;
    }
    char c = (char)(uri_hexval(s[i + 1]) * 16 + uri_hexval(s[i + 2]));
    if (c == '\0' && !allow_nul) {
      free(out);
      return NULL;
    }
    out[o++] = c;
    i += 2;
  }
  out[o] = '\0';
  if (outlen)
    *outlen = o;
  return out;
}
