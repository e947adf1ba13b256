/* log.c: see log.h. Each message is formatted into one buffer and written
 * with a single write(2), so lines from several threads never interleave;
 * control bytes in it are escaped, so a message is always one line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum log_level log_threshold = LOG_INFO;
bool log_line_open;
const char *log_prefix = "nbdflow";

void
log_msg(enum log_level level, const char *fmt, ...)
{
  static const char *const tag[] = { "error: ", "warning: ", "", "debug: " };
  char line[1024];
  va_list ap;

  if (level > log_threshold)
    return;
  static const char hex[] = "0123456789abcdef";
  char msg[1024];
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m < 0)
    m = 0;
  size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
  bool open_line = __atomic_exchange_n(&log_line_open, false,
                                       __ATOMIC_ACQ_REL);
  size_t len = (size_t)snprintf(line, sizeof line, "%s%.64s: %s",
                                open_line ? "\n" : "", log_prefix,
                                tag[level]);
  /* One message, one line: a control byte that reached the text (a file
   * name with a newline, say) is shown as \xNN and cannot start a line
   * of its own or reach a terminal. */
  for (size_t i = 0; i < mlen && len < sizeof line - 5; i++) {
    unsigned char c = (unsigned char)msg[i];
    if (c >= 0x20 && c != 0x7f) {
      line[len++] = (char)c;
    } else {
      line[len++] = '\\';
      line[len++] = 'x';
      line[len++] = hex[c >> 4];
      line[len++] = hex[c & 15];
    }
  }
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
