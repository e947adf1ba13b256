/* text.c: see text.h. */
#include "text.h"

size_t
text_utf8_len(const unsigned char *p)
{
  unsigned char lo = 0x80, hi = 0xbf;
  size_t n;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    n = 2;
  else if (p[0] >= 0xe0 && p[0] <= 0xef)
    n = 3;
  else if (p[0] >= 0xf0 && p[0] <= 0xf4)
    n = 4;
  else
    return 0;
  if (p[0] == 0xe0)
    lo = 0xa0;
  else if (p[0] == 0xed)
    hi = 0x9f;
  else if (p[0] == 0xf0)
    lo = 0x90;
  else if (p[0] == 0xf4)
    hi = 0x8f;
  if (p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  return n;
}

bool
text_utf8_valid(const char *s)
{
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = *p < 0x80 ? 1 : text_utf8_len(p);
    if (n == 0)
      return false;
    p += n;
  }
  return true;
}

void
text_json_str(FILE *out, const char *s)
{
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = *p < 0x80 ? 1 : text_utf8_len(p);
    if (*p == '"' || *p == '\\')
      fprintf(out, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(out, "\\u%04x", *p);
    else if (n == 0)
      fprintf(out, "\\ufffd");
    else if (n == 2 && p[0] == 0xc2 && p[1] <= 0x9f)
      fprintf(out, "\\u%04x", p[1]); /* a C1 control */
    else
      fwrite(p, 1, n, out);
    p += n ? n : 1;
  }
  fputc('"', out);
}
