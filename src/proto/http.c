/* http.c: see http.h. */
#include "proto/http.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <nettle/base64.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/uri.h"

static int
http_fail(char *err, size_t errlen, int r, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return r;
}

char *
http_url_redacted(const char *s)
{
  const char *p = strstr(s, "://");
  if (!http_url_is_http(s) || p == NULL)
    return NULL;
  p += 3;
  size_t alen = strcspn(p, "/?#");
  const char *at = memrchr(p, '@', alen);
  const char *colon = at ? memchr(p, ':', (size_t)(at - p)) : NULL;
  /* xapi's session_id (a bearer token) is hidden as the password is. */
  const char *sid = strstr(p + alen, "session_id=");
  if (sid && sid[-1] != '?' && sid[-1] != '&')
    sid = NULL;
  if (colon == NULL && sid == NULL)
    return NULL;
  size_t n = strlen(s);
  char *out = malloc(n + 7);
  if (out == NULL)
    return NULL;
  size_t o = 0;
  for (const char *q = s; *q;) {
    if (colon && q == colon + 1) {
      memcpy(out + o, "***", 3), o += 3;
      q = at;
    } else if (sid && q == sid + 11) {
      memcpy(out + o, "***", 3), o += 3;
      q += strcspn(q, "&#");
    } else {
      out[o++] = *q++;
    }
  }
  out[o] = '\0';
  return out;
}

bool
http_url_is_http(const char *s)
{
  return strncasecmp(s, "http://", 7) == 0 ||
         strncasecmp(s, "https://", 8) == 0;
}

void
http_url_free(struct http_url *u)
{
  free(u->user);
  free(u->password);
  free(u->host);
  free(u->port);
  free(u->target);
  memset(u, 0, sizeof *u);
}

/* Bytes that may not appear in a URL we put on a request line. */
static bool
http_bad_char(unsigned char c)
{
  return c <= ' ' || c == 0x7f;
}

int
http_url_parse(const char *s, struct http_url *u, char *err, size_t errlen)
{
  memset(u, 0, sizeof *u);
  const char *p;
  if (strncasecmp(s, "https://", 8) == 0) {
    u->tls = true;
    p = s + 8;
  } else if (strncasecmp(s, "http://", 7) == 0) {
    p = s + 7;
  } else {
    return http_fail(err, errlen, -EINVAL, "not an http:// or "
                     "https:// URL");
  }
  for (const char *q = s; *q; q++)
    if (http_bad_char((unsigned char)*q))
      return http_fail(err, errlen, -EINVAL, "a space or control "
                       "character at position %zu", (size_t)(q - s));
  size_t alen = strcspn(p, "/?#");
  const char *auth = p, *rest = p + alen;
  if (strchr(p, '#'))
    return http_fail(err, errlen, -EINVAL, "a fragment has no "
                     "place in an upload URL");
  const char *at = memrchr(auth, '@', alen);
  const char *hp = auth;
  if (at) {
    const char *colon = memchr(auth, ':', (size_t)(at - auth));
    size_t ulen = colon ? (size_t)(colon - auth) : (size_t)(at - auth);
    u->user = uri_decode(auth, ulen, false, NULL);
    if (colon)
      u->password = uri_decode(colon + 1, (size_t)(at - colon - 1), false,
                               NULL);
    if (u->user == NULL || (colon && u->password == NULL)) {
      http_url_free(u);
      return http_fail(err, errlen, -EINVAL, "bad escape in the "
                       "user name or password");
    }
    hp = at + 1;
  }
  size_t hplen = (size_t)(rest - hp);
  const char *port = NULL;
  size_t hlen;
  if (hplen && hp[0] == '[') {
    const char *close = memchr(hp, ']', hplen);
    if (close == NULL) {
      http_url_free(u);
      return http_fail(err, errlen, -EINVAL, "'[' without ']'");
    }
    u->host = strndup(hp + 1, (size_t)(close - hp - 1));
    hlen = (size_t)(close - hp - 1);
    if (close + 1 < rest) {
      if (close[1] != ':') {
        http_url_free(u);
        return http_fail(err, errlen, -EINVAL, "junk after ']'");
      }
      port = close + 2;
    }
  } else {
    const char *colon = memchr(hp, ':', hplen);
    hlen = colon ? (size_t)(colon - hp) : hplen;
    u->host = strndup(hp, hlen);
    if (colon)
      port = colon + 1;
  }
  if (u->host == NULL || hlen == 0) {
    http_url_free(u);
    return http_fail(err, errlen, -EINVAL, "no host");
  }
  if (port && port < rest) {
    size_t plen = (size_t)(rest - port);
    unsigned long v = 0;
    for (size_t i = 0; i < plen; i++) {
      if (!isdigit((unsigned char)port[i]) || (v = v * 10 + (unsigned long)
                                               (port[i] - '0')) > 65535) {
        http_url_free(u);
        return http_fail(err, errlen, -EINVAL, "bad port");
      }
    }
    if (v == 0) {
      http_url_free(u);
      return http_fail(err, errlen, -EINVAL, "bad port");
    }
    u->port = strndup(port, plen);
  } else {
    u->port = strdup(u->tls ? "443" : "80");
    u->default_port = true;
  }
  if (*rest == '?') {
    u->target = malloc(strlen(rest) + 2);
    if (u->target)
      sprintf(u->target, "/%s", rest);
  } else {
    u->target = strdup(*rest ? rest : "/");
  }
  if (u->port == NULL || u->target == NULL) {
    http_url_free(u);
    return http_fail(err, errlen, -ENOMEM, "out of memory");
  }
  if (strlen(u->target) >= HTTP_MAX_TARGET) {
    http_url_free(u);
    return http_fail(err, errlen, -EINVAL, "the path and query are "
                     "longer than %u bytes", HTTP_MAX_TARGET - 1);
  }
  return 0;
}

int
http_put_head(char *buf, size_t len, const struct http_url *u, bool chunked)
{
  char auth[512] = "";
  if (u->user) {
    char plain[256];
    int n = snprintf(plain, sizeof plain, "%s:%s", u->user,
                     u->password ? u->password : "");
    if (n < 0 || (size_t)n >= sizeof plain)
      return -ENOSPC;
    char b64[BASE64_ENCODE_RAW_LENGTH(sizeof plain) + 1];
    base64_encode_raw(b64, (size_t)n, (const uint8_t *)plain);
    b64[BASE64_ENCODE_RAW_LENGTH(n)] = '\0';
    snprintf(auth, sizeof auth, "Authorization: Basic %s\r\n", b64);
  }
  bool v6 = strchr(u->host, ':') != NULL;
  int n = snprintf(buf, len,
                   "PUT %s HTTP/1.1\r\n"
                   "Host: %s%s%s%s%s\r\n"
                   "User-Agent: nbdflow\r\n"
                   "Connection: close\r\n"
                   "%s"
                   "%s"
                   "\r\n",
                   u->target, v6 ? "[" : "", u->host, v6 ? "]" : "",
                   u->default_port ? "" : ":",
                   u->default_port ? "" : u->port,
                   chunked ? "Cookie: chunked=true\r\n" : "", auth);
  if (n < 0 || (size_t)n >= len)
    return -ENOSPC;
  return n;
}

size_t
http_head_end(const char *buf, size_t len)
{
  for (size_t i = 0; i < len; i++) {
    if (buf[i] != '\n')
      continue;
    if (i >= 1 && buf[i - 1] == '\n')
      return i + 1;
    if (i >= 2 && buf[i - 1] == '\r' && buf[i - 2] == '\n')
      return i + 1;
  }
  return 0;
}

/* Walks the lines of a head: the next line starts at *pos; returns its
 * length without the line end and advances *pos, or -1 at the end. */
static ssize_t
http_line(const char *head, size_t len, size_t *pos, const char **start)
{
  if (*pos >= len)
    return -1;
  const char *p = head + *pos;
  *start = p;
  const char *nl = memchr(p, '\n', len - *pos);
  if (nl == NULL)
    return -1;
  size_t l = (size_t)(nl - p);
  *pos += l + 1;
  if (l && p[l - 1] == '\r')
    l--;
  return (ssize_t)l;
}

/* Splits a header line into name and value (trimmed). false when the
 * line is not "NAME: value" with a token name. */
static bool
http_header(const char *line, size_t l, const char **name, size_t *nlen,
            const char **val, size_t *vlen)
{
  const char *colon = memchr(line, ':', l);
  if (colon == NULL || colon == line)
    return false;
  for (const char *q = line; q < colon; q++)
    if (http_bad_char((unsigned char)*q) || *q == '"' || *q == '(' ||
        *q == ')' || *q == ',' || *q == '/' || *q == ';' || *q == '<' ||
        *q == '=' || *q == '>' || *q == '@' || *q == '[' || *q == ']' ||
        *q == '{' || *q == '}' || *q == '\\' || *q == '?')
      return false;
  for (const char *q = colon + 1; q < line + l; q++)
    if ((unsigned char)*q < ' ' && *q != '\t')
      return false;
  *name = line;
  *nlen = (size_t)(colon - line);
  const char *v = colon + 1, *end = line + l;
  while (v < end && (*v == ' ' || *v == '\t'))
    v++;
  while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
    end--;
  *val = v;
  *vlen = (size_t)(end - v);
  return true;
}

static bool
http_is(const char *name, size_t nlen, const char *want)
{
  return strlen(want) == nlen && strncasecmp(name, want, nlen) == 0;
}

/* A printable copy of at most n bytes of s, for messages. */
static void
http_printable(char *out, size_t outlen, const char *s, size_t n)
{
  size_t j = 0;
  for (size_t i = 0; i < n && j + 1 < outlen; i++)
    out[j++] = (s[i] >= ' ' && s[i] < 0x7f) ? s[i] : '?';
  out[j] = '\0';
}

int
http_parse_response(const char *head, size_t len, struct http_response *r,
                    char *err, size_t errlen)
{
  memset(r, 0, sizeof *r);
  size_t pos = 0;
  const char *line, *name, *val;
  ssize_t l = http_line(head, len, &pos, &line);
  if (l < 0)
    return http_fail(err, errlen, -EPROTO, "no status line");
  http_printable(r->status_line, sizeof r->status_line, head, (size_t)l);
  if (l < 12 || strncmp(head, "HTTP/1.", 7) != 0 ||
      !isdigit((unsigned char)head[7]) || head[8] != ' ' ||
      !isdigit((unsigned char)head[9]) || !isdigit((unsigned char)head[10]) ||
      !isdigit((unsigned char)head[11]) || (l > 12 && head[12] != ' '))
    return http_fail(err, errlen, -EPROTO, "not an HTTP/1.x status line: "
                     "'%s'", r->status_line);
  r->status = (head[9] - '0') * 100 + (head[10] - '0') * 10 + (head[11] - '0');
  if (r->status < 100)
    return http_fail(err, errlen, -EPROTO, "bad status in '%s'",
                     r->status_line);
  while ((l = http_line(head, len, &pos, &line)) > 0) {
    size_t nlen, vlen;
    if (!http_header(line, (size_t)l, &name, &nlen, &val, &vlen)) {
      char shown[64];
      http_printable(shown, sizeof shown, line, (size_t)l);
      return http_fail(err, errlen, -EPROTO, "malformed header line '%s'",
                       shown);
    }
    if (http_is(name, nlen, "Transfer-Encoding") && vlen == 3 &&
        strncasecmp(val, "nbd", 3) == 0)
      r->te_nbd = true;
  }
  return 0;
}

/* Percent-decodes s[0..n) into out (NUL-terminated); false when an
 * escape is bad, it decodes to NUL, or it does not fit. */
static bool
http_decode(const char *s, size_t n, char *out, size_t outlen, bool plus)
{
  size_t dl;
  char *d = uri_decode(s, n, false, &dl);
  if (d == NULL || dl >= outlen) {
    free(d);
    return false;
  }
  for (size_t i = 0; i < dl; i++)
    out[i] = plus && d[i] == '+' ? ' ' : d[i];
  out[dl] = '\0';
  free(d);
  return true;
}

int
http_query_get(const char *query, const char *key, char *out, size_t outlen)
{
  size_t klen = strlen(key);
  const char *p = query;
  while (*p) {
    size_t n = strcspn(p, "&;");
    const char *eq = memchr(p, '=', n);
    size_t kl = eq ? (size_t)(eq - p) : n;
    if (kl == klen && memcmp(p, key, klen) == 0) {
      if (eq == NULL) {
        if (outlen)
          out[0] = '\0';
        return 1;
      }
      return http_decode(eq + 1, n - kl - 1, out, outlen, true) ? 1
                                                                 : -EINVAL;
    }
    p += n;
    if (*p)
      p++;
  }
  return 0;
}

/* Finds key in a Cookie header's "a=b; c=d"; copies its value. */
static int
http_cookie_get(const char *v, size_t vlen, const char *key, char *out,
                size_t outlen)
{
  size_t klen = strlen(key);
  const char *p = v, *end = v + vlen;
  while (p < end) {
    while (p < end && (*p == ' ' || *p == ';'))
      p++;
    const char *semi = memchr(p, ';', (size_t)(end - p));
    size_t n = semi ? (size_t)(semi - p) : (size_t)(end - p);
    const char *eq = memchr(p, '=', n);
    size_t kl = eq ? (size_t)(eq - p) : n;
    if (kl == klen && memcmp(p, key, klen) == 0) {
      size_t vl = eq ? n - kl - 1 : 0;
      if (vl >= outlen)
        return -EINVAL;
      if (eq)
        memcpy(out, eq + 1, vl);
      out[vl] = '\0';
      return 1;
    }
    p += n;
  }
  return 0;
}

int
http_parse_request(const char *head, size_t len, struct http_request *r,
                   char *err, size_t errlen)
{
  memset(r, 0, sizeof *r);
  size_t pos = 0;
  const char *line, *name, *val;
  ssize_t l = http_line(head, len, &pos, &line);
  char shown[80];
  if (l <= 0)
    return http_fail(err, errlen, -EPROTO, "no request line");
  http_printable(shown, sizeof shown, head, (size_t)l);
  const char *sp1 = memchr(head, ' ', (size_t)l);
  const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(head + l - sp1 - 1))
                        : NULL;
  if (sp1 == NULL || sp2 == NULL || sp1 == head ||
      head + l - sp2 - 1 != 8 || strncmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
      !isdigit((unsigned char)sp2[8]))
    return http_fail(err, errlen, -EPROTO, "not an HTTP/1.x request line: "
                     "'%s'", shown);
  size_t mlen = (size_t)(sp1 - head);
  if (mlen >= sizeof r->method)
    return http_fail(err, errlen, -EPROTO, "method too long in '%s'", shown);
  memcpy(r->method, head, mlen);
  for (size_t i = 0; i < mlen; i++)
    if (!isupper((unsigned char)r->method[i]))
      return http_fail(err, errlen, -EPROTO, "bad method in '%s'", shown);
  const char *tgt = sp1 + 1;
  size_t tlen = (size_t)(sp2 - tgt);
  if (tlen == 0 || tgt[0] != '/')
    return http_fail(err, errlen, -EPROTO, "the target must be a path, in "
                     "'%s'", shown);
  const char *q = memchr(tgt, '?', tlen);
  size_t plen = q ? (size_t)(q - tgt) : tlen;
  if (!http_decode(tgt, plen, r->path, sizeof r->path, false))
    return plen >= sizeof r->path
             ? http_fail(err, errlen, -EMSGSIZE, "a path over %zu bytes in "
                         "'%s'", sizeof r->path - 1, shown)
             : http_fail(err, errlen, -EPROTO, "a bad escape (%%XX, or "
                         "%%00) in the path of '%s'", shown);
  if (q) {
    size_t qlen = tlen - plen - 1;
    if (qlen >= sizeof r->query)
      return http_fail(err, errlen, -EMSGSIZE, "query over %zu bytes",
                       sizeof r->query - 1);
    memcpy(r->query, q + 1, qlen);
  }
  char tmp[8];
  r->chunked = http_query_get(r->query, "chunked", tmp, sizeof tmp) != 0;
  if (http_query_get(r->query, "session_id", r->session,
                     sizeof r->session) < 0)
    r->session[0] = '\0';
  while ((l = http_line(head, len, &pos, &line)) > 0) {
    size_t nlen, vlen;
    if (!http_header(line, (size_t)l, &name, &nlen, &val, &vlen)) {
      http_printable(shown, sizeof shown, line, (size_t)l);
      return http_fail(err, errlen, -EPROTO, "malformed header line '%s'",
                       shown);
    }
    if (http_is(name, nlen, "Transfer-Encoding")) {
      r->has_te = true;
    } else if (http_is(name, nlen, "Content-Length")) {
      uint64_t v = 0;
      if (vlen == 0 || vlen > 19 || r->has_length)
        return http_fail(err, errlen, -EPROTO, "bad Content-Length");
      for (size_t i = 0; i < vlen; i++) {
        if (!isdigit((unsigned char)val[i]))
          return http_fail(err, errlen, -EPROTO, "bad Content-Length");
        v = v * 10 + (uint64_t)(val[i] - '0');
      }
      r->has_length = true;
      r->content_length = v;
    } else if (http_is(name, nlen, "Expect")) {
      r->expect_continue = vlen == 12 && strncasecmp(val, "100-continue",
                                                     12) == 0;
    } else if (http_is(name, nlen, "Cookie")) {
      if (http_cookie_get(val, vlen, "chunked", tmp, sizeof tmp) != 0)
        r->chunked = true;
      if (r->session[0] == '\0' &&
          http_cookie_get(val, vlen, "session_id", r->session,
                          sizeof r->session) < 0)
        return http_fail(err, errlen, -EMSGSIZE, "session_id too long");
    }
  }
  if (l < 0)
    return http_fail(err, errlen, -EPROTO, "the head does not end with an "
                     "empty line");
  return 0;
}
