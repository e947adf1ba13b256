/* log.c: see log.h. Each message is formatted into one buffer and written
 * with a single write(2), so lines from several threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

enum log_level log_threshold = LOG_INFO;

void
log_msg(enum log_level level, const char *fmt, ...)
{
  static const char *const tag[] = { "error: ", "warning: ", "", "debug: " };
  char line[1024];
  va_list ap;

  if (level > log_threshold)
    return;
  int n = snprintf(line, sizeof line, "nbdflow: %s", tag[level]);
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
