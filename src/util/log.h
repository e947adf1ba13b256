/* log.h: one-line diagnostics on stderr, prefixed with the program name. */
#ifndef NBDFLOW_UTIL_LOG_H
#define NBDFLOW_UTIL_LOG_H

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Set once at start-up, before any thread starts. */
extern enum log_level log_threshold;

void log_msg(enum log_level level, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
