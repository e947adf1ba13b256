/* log.c: see log.h. Each message is formatted into one buffer and written
 * with a single write(2), so lines from several threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum log_level log_threshold = LOG_INFO;
const char *log_prefix = "nbdflow";

void
log_msg(enum log_level level, const char *fmt, ...)
{
  static const char *const tag[] = { "error: ", "warning: ", "", "debug: " };
  char line[1024];
  va_list ap;

  if (level > log_threshold)
    return;
  int n = snprintf(line, sizeof line, "%.64s: %s", log_prefix, tag[level]);
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0)
    m = 0;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof line - 2)
    len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t r = write(STDERR_FILENO, line, len);
  (void)r;
}

const char *
log_escape(char out[LOG_ESCAPE_BUF], const void *p, size_t len)
{
  static const char hex[] = "0123456789abcdef";
  const unsigned char *s = p;
  size_t n = len < LOG_ESCAPE_MAX ? len : LOG_ESCAPE_MAX;
  char *o = out;

  for (size_t i = 0; i < n; i++) {
    if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\') {
      *o++ = (char)s[i];
    } else {
      *o++ = '\\';
      *o++ = 'x';
      *o++ = hex[s[i] >> 4];
      *o++ = hex[s[i] & 15];
    }
  }
  if (n < len) {
    memcpy(o, "...", 3);
    o += 3;
  }
  *o = '\0';
  return out;
}

enum log_take
log_take(int *count, int cap)
{
  if (__atomic_load_n(count, __ATOMIC_RELAXED) > cap)
    return LOG_TAKE_NONE;
  int n = __atomic_fetch_add(count, 1, __ATOMIC_RELAXED);
  if (n < cap)
    return LOG_TAKE_LINE;
  return n == cap ? LOG_TAKE_LAST : LOG_TAKE_NONE;
}
