/* nbd_uri.h: parse NBD URIs (nbd://, nbds://, nbd+unix://, nbds+unix://) as
 * described by the NBD URI document, on top of RFC 3986 syntax.
 *
 * The parser is pure: it only reads the string and allocates the result.
 * It is exposed to untrusted input (command lines, scripts), so it checks
 * every length and percent escape. The percent-decoding itself, which
 * is RFC 3986's and not NBD's, is util/uri.h's. */
#ifndef NBDFLOW_PROTO_NBD_URI_H
#define NBDFLOW_PROTO_NBD_URI_H

#include <stdbool.h>
#include <stddef.h>

struct nbd_uri {
  bool tls;         /* nbds or nbds+unix */
  bool unix_socket; /* nbd+unix or nbds+unix */
  char *user;       /* userinfo, percent-decoded, or NULL */
  char *host;       /* TCP only: name or IPv6 literal without brackets */
  char *port;       /* TCP only: decimal text, "10809" when absent */
  char *socket;     /* Unix only: path from ?socket=, decoded */
  char *export_name; /* path without its leading '/', decoded; may be "" */
  char *tls_type;   /* tls-type=, or NULL */
  char *tls_hostname; /* tls-hostname=, or NULL */
  char *tls_certificates; /* tls-certificates= (libnbd's), a directory */
  char *tls_psk_file; /* tls-psk-file= (libnbd's), a psktool file */
  int tls_verify_peer; /* -1 when absent, else 0 or 1 */
};

/* True when s is to be read as a URI, not a file name: it starts with
 * "SCHEME://" for any scheme, or with "nbd:", "nbds:", "nbd+...:" or
 * "nbds+...:". uri_parse then accepts it or says what is wrong, so that
 * a mistyped URI is never taken for a local file (and created). */
bool uri_is_uri(const char *s);

/* Parses s into *u (which the caller zeroes or not; it is overwritten).
 * Returns 0, or -EINVAL with a message for the user in err (errlen bytes,
 * quoting the bad part). On success the caller frees with uri_free. On
 * failure nothing needs freeing. */
int uri_parse(const char *s, struct nbd_uri *u, char *err, size_t errlen);
void uri_free(struct nbd_uri *u);

/* uri (an NBD URI) with its export name replaced by name, percent-encoded
 * but for RFC 3986's unreserved characters and '/' (as libnbd writes
 * them). Returns a string to free, or NULL without memory. */
char *uri_with_export(const char *uri, const char *name);

#endif
