/* text.h: strings from outside (a server, a command line) made safe to
 * print as JSON. */
#ifndef NBDFLOW_UTIL_TEXT_H
#define NBDFLOW_UTIL_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Length of the valid UTF-8 sequence at p (2 to 4), or 0 when p does not
 * start one (stray continuation, overlong form, surrogate, > U+10FFFF). */
size_t text_utf8_len(const unsigned char *p);

/* True when the NUL-terminated s is UTF-8 throughout. */
bool text_utf8_valid(const char *s);

/* Writes s as a JSON string, quotes included: control characters (DEL
 * and C1 too) escaped, bytes that are not UTF-8 replaced by U+FFFD, so the
 * output stays valid JSON whatever s holds. */
void text_json_str(FILE *out, const char *s);

#endif
