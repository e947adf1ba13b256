/* uri.h: RFC 3986 pieces that any URI parser needs: hex digits and
 * percent-decoding. The parsers of particular URIs sit with their
 * protocol (NBD's in proto/nbd_uri.h, HTTP's in proto/http.h).
 *
 * Pure: it only reads the string and allocates the result. */
#ifndef NBDFLOW_UTIL_URI_H
#define NBDFLOW_UTIL_URI_H

#include <stdbool.h>
#include <stddef.h>

/* The value of a hex digit (RFC 3986 HEXDIG, either case), or -1. */
int uri_hexval(char c);

/* Percent-decodes len bytes of s into a new NUL-terminated string. Returns
 * NULL on a bad escape, on an encoded NUL when allow_nul is false, or on
 * allocation failure. *outlen (may be NULL) receives the decoded length. */
char *uri_decode(const char *s, size_t len, bool allow_nul, size_t *outlen);

#endif
