/* nbd_uri.c: see nbd_uri.h. Follows the NBD URI document: scheme, optional
 * authority (userinfo@host:port), path = '/' + export name, query
 * parameters socket, tls-type, tls-hostname, tls-verify-peer, libnbd's
 * tls-certificates and tls-psk-file, and any x-*. */
#include "nbd_uri.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nbd.h"
#include "util/text.h"
#include "util/uri.h"

static const struct {
  const char *prefix;
  bool tls, unix_socket;
} uri_schemes[] = {
  /* Longest first, so "nbd+unix" is not taken for "nbd". */
  { "nbds+unix://", true, true },
  { "nbd+unix://", false, true },
  { "nbds://", true, false },
  { "nbd://", false, false },
};

/* Length of the RFC 3986 scheme at the start of s (ALPHA *( ALPHA /
 * DIGIT / "+" / "-" / "." )) when a ':' follows it, else 0. */
static size_t
uri_scheme_len(const char *s)
{
  size_t n = 0;
  if (!isalpha((unsigned char)s[0]))
    return 0;
  while (isalnum((unsigned char)s[n]) || s[n] == '+' || s[n] == '-' ||
         s[n] == '.')
    n++;
  return s[n] == ':' ? n : 0;
}

/* True when the scheme of length n at s is nbd or nbds, alone or with a
 * "+transport" suffix. */
static bool
uri_scheme_nbdish(const char *s, size_t n)
{
  size_t base = n >= 4 && (s[3] == 's' || s[3] == 'S') ? 4 : 3;
  return n >= 3 && strncasecmp(s, "nbd", 3) == 0 &&
         (n == base || (n > base && s[base] == '+'));
}

bool
uri_is_uri(const char *s)
{
  size_t n = uri_scheme_len(s);
  if (n == 0)
    return false;
  return strncmp(s + n, "://", 3) == 0 || uri_scheme_nbdish(s, n);
}

static int
uri_fail(char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* The inside of an IP literal's brackets: an IPv6 address (hex digits,
 * ':' and '.', no escapes), optionally followed by "%25" and a zone
 * (RFC 6874, "[fe80::1%25eth0]"), which may itself be percent-encoded.
 * Returns "address" or "address%zone" as getaddrinfo takes it, or NULL
 * when s is not that (a raw '%', an escape in the address, a control
 * byte in the zone). */
static char *
uri_ipv6_host(const char *s, size_t len)
{
  size_t alen = 0;
  while (alen < len && s[alen] != '%') {
    char ch = s[alen];
    if (!(uri_hexval(ch) >= 0 || ch == ':' || ch == '.'))
      return NULL;
    alen++;
  }
  if (alen == 0)
    return NULL;
  if (alen == len)
    return strndup(s, len);
  if (len - alen < 4 || strncmp(s + alen, "%25", 3) != 0)
    return NULL;
  size_t zlen;
  char *zone = uri_decode(s + alen + 3, len - alen - 3, false, &zlen);
  if (zone == NULL)
    return NULL;
  for (size_t i = 0; i < zlen; i++)
    if ((unsigned char)zone[i] < 0x20 || zone[i] == 0x7f ||
        zone[i] == '%') {
      free(zone);
      return NULL;
    }
  char *host = malloc(alen + 1 + zlen + 1);
  if (host != NULL)
    snprintf(host, alen + 1 + zlen + 1, "%.*s%%%s", (int)alen, s, zone);
  free(zone);
  return host;
}

/* A host name (RFC 3986 reg-name), percent-decoded. NULL when it decodes
 * to a byte no host name holds: a control byte, a space, or a delimiter
 * of the URI itself (":/?#[]@") or a '%', as in "nbd://%3a/", which would
 * otherwise reach the resolver as a name it could never mean. */
static char *
uri_reg_name(const char *s, size_t len)
{
  size_t n;
  char *host = uri_decode(s, len, false, &n);
  if (host == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)host[i];
    if (ch <= 0x20 || ch == 0x7f || strchr(":/?#[]@%", ch) != NULL) {
      free(host);
      return NULL;
    }
  }
  return host;
}

/* Splits the authority [userinfo@]host[:port] of length len. */
static int
uri_parse_authority(const char *a, size_t len, struct nbd_uri *u, char *err,
                    size_t errlen)
{
  const char *at = memchr(a, '@', len);
  if (at) {
    u->user = uri_decode(a, (size_t)(at - a), false, NULL);
    if (u->user == NULL)
      return uri_fail(err, errlen, "bad escape in user name '%.*s'",
                      (int)(at - a), a);
    len -= (size_t)(at + 1 - a);
    a = at + 1;
  }
  const char *hend;
  const char *rest;
  if (len > 0 && a[0] == '[') {
    hend = memchr(a, ']', len);
    if (hend == NULL)
      return uri_fail(err, errlen, "unterminated IPv6 literal '%.*s'",
                      (int)len, a);
    u->host = uri_ipv6_host(a + 1, (size_t)(hend - a - 1));
    if (u->host == NULL)
      return uri_fail(err, errlen, "bad IPv6 literal '%.*s' (a zone is "
                      "written %%25zone)", (int)(hend - a + 1), a);
    rest = hend + 1;
  } else {
    hend = memchr(a, ':', len);
    if (hend == NULL)
      hend = a + len;
    u->host = uri_reg_name(a, (size_t)(hend - a));
    rest = hend;
  }
  if (u->host == NULL)
    return uri_fail(err, errlen, "bad host in '%.*s'", (int)len, a);
  size_t rlen = len - (size_t)(rest - a);
  if (rlen == 0)
    return 0;
  if (rest[0] != ':')
    return uri_fail(err, errlen, "junk after host: '%.*s'", (int)rlen, rest);
  rest++;
  rlen--;
  if (rlen == 0)
    return 0; /* "host:" means the default port (RFC 3986 §3.2.3) */
  unsigned long port = 0;
  for (size_t i = 0; i < rlen; i++) {
    if (rest[i] < '0' || rest[i] > '9' || port > 65535)
      return uri_fail(err, errlen, "bad port '%.*s'", (int)rlen, rest);
    port = port * 10 + (unsigned long)(rest[i] - '0');
  }
  if (port == 0 || port > 65535)
    return uri_fail(err, errlen, "port out of range: '%.*s'", (int)rlen,
                    rest);
  free(u->port);
  u->port = strndup(rest, rlen);
  return u->port ? 0 : -ENOMEM;
}

/* Handles one key=value query parameter. */
static int
uri_parse_param(const char *p, size_t len, struct nbd_uri *u, char *err,
                size_t errlen)
{
  const char *eq = memchr(p, '=', len);
  size_t klen = eq ? (size_t)(eq - p) : len;
  const char *v = eq ? eq + 1 : p + len;
  size_t vlen = len - (size_t)(v - p);
  size_t dlen = 0;
  char *val = uri_decode(v, vlen, true, &dlen);
  if (val == NULL)
    return uri_fail(err, errlen, "bad escape in query '%.*s'", (int)len, p);
  char **slot = NULL;
  if (klen == 6 && memcmp(p, "socket", 6) == 0) {
    if (dlen > 0 && val[0] == '\0') {
      free(val);
      return uri_fail(err, errlen,
                      "abstract Unix sockets are not supported: '%.*s'",
                      (int)len, p);
    }
    slot = &u->socket;
  } else if (klen == 8 && memcmp(p, "tls-type", 8) == 0)
    slot = &u->tls_type;
  else if (klen == 12 && memcmp(p, "tls-hostname", 12) == 0)
    slot = &u->tls_hostname;
  else if (klen == 16 && memcmp(p, "tls-certificates", 16) == 0)
    slot = &u->tls_certificates;
  else if (klen == 12 && memcmp(p, "tls-psk-file", 12) == 0)
    slot = &u->tls_psk_file;
  else if (klen == 15 && memcmp(p, "tls-verify-peer", 15) == 0) {
    if (u->tls_verify_peer >= 0) {
      free(val);
      return uri_fail(err, errlen, "query parameter 'tls-verify-peer' "
                      "given twice");
    }
    bool ok = dlen == 1 && (val[0] == '0' || val[0] == '1');
    u->tls_verify_peer = val[0] == '1';
    free(val);
    if (!ok)
      return uri_fail(err, errlen, "tls-verify-peer must be 0 or 1: '%.*s'",
                      (int)len, p);
    return 0;
  } else if (klen >= 2 && memcmp(p, "x-", 2) == 0) {
    free(val); /* experimental parameters of other clients: ignored */
    return 0;
  } else {
    free(val);
    return uri_fail(err, errlen, "unknown query parameter '%.*s'", (int)klen,
                    p);
  }
  if (memchr(val, '\0', dlen)) {
    free(val);
    return uri_fail(err, errlen, "NUL byte in query '%.*s'", (int)len, p);
  }
  if (*slot) {
    /* Which one a reader would take is a guess: say so instead. */
    free(val);
    return uri_fail(err, errlen, "query parameter '%.*s' given twice",
                    (int)klen, p);
  }
  *slot = val;
  return 0;
}

static int
uri_parse_query(const char *q, struct nbd_uri *u, char *err, size_t errlen)
{
  while (*q) {
    size_t len = strcspn(q, "&;");
    if (len > 0) {
      int r = uri_parse_param(q, len, u, err, errlen);
      if (r < 0)
        return r;
    }
    q += len;
    if (*q)
      q++;
  }
  return 0;
}

static int
uri_parse_parts(const char *s, struct nbd_uri *u, char *err, size_t errlen)
{
  size_t i;
  for (i = 0; i < sizeof uri_schemes / sizeof uri_schemes[0]; i++)
    if (strncasecmp(s, uri_schemes[i].prefix,
                    strlen(uri_schemes[i].prefix)) == 0)
      break; /* schemes are case-insensitive (RFC 3986, 3.1) */
  if (i == sizeof uri_schemes / sizeof uri_schemes[0]) {
    size_t n = uri_scheme_len(s);
    if (n > 0 && strncmp(s + n, "://", 3) != 0)
      return uri_fail(err, errlen, "'%.*s:' must be followed by '//' "
                      "(nbd://HOST/EXPORT, nbd+unix:///EXPORT?socket=PATH)",
                      (int)n, s);
    if (n > 0)
      return uri_fail(err, errlen, "unknown scheme '%.*s' (NBD URIs start "
                      "nbd://, nbds://, nbd+unix:// or nbds+unix://)",
                      (int)n, s);
    return uri_fail(err, errlen, "not an NBD URI (nbd://, nbds://, "
                    "nbd+unix:// or nbds+unix://)");
  }
  u->tls = uri_schemes[i].tls;
  u->unix_socket = uri_schemes[i].unix_socket;
  const char *p = s + strlen(uri_schemes[i].prefix);

  if (strchr(p, '#'))
    return uri_fail(err, errlen, "fragments are not allowed");
  /* RFC 3986 has no spaces or control characters in a URI (qemu and
   * libnbd refuse them too): a name that holds them is written with
   * escapes, and taking one raw would hide a quoting mistake. */
  for (const char *c = p; *c; c++)
    if ((unsigned char)*c <= ' ' || *c == 0x7f)
      return uri_fail(err, errlen, "byte 0x%02x at offset %zu is not "
                      "allowed in a URI: percent-encode it (%%%02X)",
                      (unsigned char)*c, (size_t)(c - s), (unsigned char)*c);
  size_t alen = strcspn(p, "/?");
  if (u->unix_socket && alen > 0 && p[alen - 1] == '@' &&
      memchr(p, '@', alen - 1) == NULL) {
    /* Only a user (nbds+unix://alice@/?socket=...): the PSK identity. */
    u->user = uri_decode(p, alen - 1, false, NULL);
    if (u->user == NULL)
      return uri_fail(err, errlen, "bad escape in user '%.*s'",
                      (int)alen - 1, p);
    p += alen;
    alen = 0;
  }
  if (u->unix_socket && alen > 0)
    return uri_fail(err, errlen,
                    "a Unix socket URI takes no host: '%.*s'", (int)alen,
                    p);
  if (!u->unix_socket && alen > 0) {
    int r = uri_parse_authority(p, alen, u, err, errlen);
    if (r < 0)
      return r;
  }
  p += alen;

  size_t plen = strcspn(p, "?");
  if (plen > 0) { /* starts with '/' by construction */
    size_t n = 0;
    u->export_name = uri_decode(p + 1, plen - 1, false, &n);
    if (u->export_name == NULL)
      return uri_fail(err, errlen, "bad escape in export name '%.*s'",
                      (int)plen, p);
    if (n > NBD_MAX_STRING)
      return uri_fail(err, errlen, "export name longer than %d bytes",
                      NBD_MAX_STRING);
    /* The protocol's strings are UTF-8 (§Conventions). A NUL byte cannot
     * be sent either: it would end the name early. */
    if (strlen(u->export_name) != n || !text_utf8_valid(u->export_name))
      return uri_fail(err, errlen, "export name '%.*s' is not UTF-8 text, "
                      "as NBD requires", (int)plen - 1, p + 1);
  } else {
    u->export_name = strdup("");
  }
  p += plen;
  if (*p == '?') {
    int r = uri_parse_query(p + 1, u, err, errlen);
    if (r < 0)
      return r;
  }
  if (u->unix_socket && (u->socket == NULL || u->socket[0] == '\0'))
    return uri_fail(err, errlen, "a Unix socket URI needs ?socket=PATH");
  if (!u->unix_socket && u->socket)
    return uri_fail(err, errlen, "?socket= needs the nbd+unix scheme");
  if (!u->unix_socket && (u->host == NULL || u->host[0] == '\0')) {
    free(u->host);
    u->host = strdup("localhost");
  }
  if (!u->unix_socket && u->port == NULL) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", NBD_DEFAULT_PORT);
    u->port = strdup(buf);
  }
  if (u->export_name == NULL || (!u->unix_socket && (!u->host || !u->port)))
    return -ENOMEM;
  return 0;
}

int
uri_parse(const char *s, struct nbd_uri *u, char *err, size_t errlen)
{
  memset(u, 0, sizeof *u);
  u->tls_verify_peer = -1;
  if (errlen)
    err[0] = '\0';
  int r = uri_parse_parts(s, u, err, errlen);
  if (r < 0) {
    if (r == -ENOMEM)
      uri_fail(err, errlen, "out of memory");
    if (errlen) { /* name the URI: a copy has two */
      char why[256];
      snprintf(why, sizeof why, "%s", err);
      snprintf(err, errlen, "%.100s%s: %s", s, strlen(s) > 100 ? "..." : "",
               why);
    }
    uri_free(u);
    return -EINVAL;
  }
  return 0;
}

void
uri_free(struct nbd_uri *u)
{
  free(u->user);
  free(u->host);
  free(u->port);
  free(u->socket);
  free(u->export_name);
  free(u->tls_type);
  free(u->tls_hostname);
  free(u->tls_certificates);
  free(u->tls_psk_file);
  memset(u, 0, sizeof *u);
  u->tls_verify_peer = -1;
}

char *
uri_with_export(const char *uri, const char *name)
{
  const char *p = strstr(uri, "://");
  p = p ? p + 3 : uri;
  const char *path = p + strcspn(p, "/?");
  const char *query = strchr(path, '?');
  size_t head = (size_t)(path - uri);
  size_t cap = head + 2 + 3 * strlen(name) + (query ? strlen(query) : 0);
  char *out = malloc(cap);
  if (out == NULL)
    return NULL;
  memcpy(out, uri, head);
  size_t n = head;
  out[n++] = '/';
  for (const unsigned char *q = (const unsigned char *)name; *q; q++) {
    if ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
        (*q >= '0' && *q <= '9') || strchr("-._~/", *q))
      out[n++] = (char)*q;
    else
      n += (size_t)sprintf(out + n, "%%%02X", *q);
  }
  out[n] = '\0';
  if (query)
    strcat(out, query);
  return out;
}
