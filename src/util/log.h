/* log.h: one-line diagnostics on stderr, prefixed with the program name. */
#ifndef NBDFLOW_UTIL_LOG_H
#define NBDFLOW_UTIL_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Set once at start-up, before any thread starts. */
extern enum log_level log_threshold;
/* What every line starts with: "nbdflow COMMAND" once the command is
 * known (main sets it before running it), "nbdflow" before. Not copied:
 * the string must live as long as the process. */
extern const char *log_prefix;

/* Set by whoever leaves a line without its newline on stderr (a
 * percentage redrawn in place with '\r'): the next message ends that
 * line first, rather than being glued to it. Any thread; atomic. */
extern bool log_line_open;

void log_msg(enum log_level level, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

/* Bytes of a peer's string log_escape shows; the rest becomes "...". */
#define LOG_ESCAPE_MAX 128
/* Room log_escape needs: each byte may become \xNN, plus "..." and NUL. */
#define LOG_ESCAPE_BUF (4 * LOG_ESCAPE_MAX + 4)

/* Makes len bytes from a peer (an export name, a username) safe to log:
 * printable ASCII other than '\' is kept, every other byte is
 * written as \xNN (so a newline cannot forge a line and an escape cannot
 * reach a terminal), and past LOG_ESCAPE_MAX bytes the text ends with
 * "...". out must hold LOG_ESCAPE_BUF bytes; returns out, NUL-terminated. */
const char *log_escape(char out[LOG_ESCAPE_BUF], const void *p, size_t len);

/* A flood guard: *count lines taken so far (atomically, so any thread
 * may take), at most cap of them logged. LOG_TAKE_LINE: log this one;
 * LOG_TAKE_LAST: the cap is reached now, log once that the rest are not
 * logged; LOG_TAKE_NONE: stay silent (the count then stops growing). */
enum log_take { LOG_TAKE_NONE, LOG_TAKE_LINE, LOG_TAKE_LAST };
enum log_take log_take(int *count, int cap);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
