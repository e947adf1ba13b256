/* http.h: the little HTTP/1.1 that xapi's transports need, over byte
 * buffers: http(s) URLs, the head of the PUT that starts an upload, the
 * parser of its response (on the sending side) and of the request (on
 * the receiving side).
 *
 * Pure functions: no I/O. Every length is bounded (HTTP_MAX_HEAD for a
 * whole head); a head that breaks the rules is refused with a sentence
 * that says where, never guessed at. The fuzz harness fuzz-http covers
 * the parsers. */
#ifndef NBDFLOW_PROTO_HTTP_H
#define NBDFLOW_PROTO_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_HEAD (16u << 10) /* request line or status, and headers */
#define HTTP_MAX_TARGET 4096      /* path and query of a request */

struct http_url {
  bool tls;        /* https */
  char *user;      /* userinfo, decoded, or NULL */
  char *password;  /* after the first ':' of the userinfo, or NULL */
  char *host;      /* name or IPv6 literal without brackets */
  char *port;      /* decimal text; 80 or 443 when absent */
  bool default_port;
  char *target;    /* path and query as written; "/" when empty */
};

/* Parses an http:// or https:// URL. 0, or -EINVAL with the reason in
 * err (which does not quote the URL: the caller shows it as it may,
 * without its password); on success free with http_url_free. */
int http_url_parse(const char *s, struct http_url *u, char *err,
                   size_t errlen);
void http_url_free(struct http_url *u);
bool http_url_is_http(const char *s);
/* s with its password and its query's session_id (if any) shown as
 * "***", for messages and reports: a new string, or NULL when s has
 * neither (or no memory). */
char *http_url_redacted(const char *s);

/* Writes the head of xapi's upload request into buf: PUT with the
 * target, Host, "Connection: close" (the receiver's close after the
 * body is how a Chunked sender learns that it was stored, as xapi's
 * sparse_dd asks), "Cookie: chunked=true" when chunked, Basic
 * authorization from the userinfo, and neither Content-Length nor
 * Transfer-Encoding.
 * Returns its length, or -ENOSPC when buf is too small. */
int http_put_head(char *buf, size_t len, const struct http_url *u,
                  bool chunked);

/* Length of the head at the start of buf (through its blank line), or 0
 * when buf holds no complete head yet. */
size_t http_head_end(const char *buf, size_t len);

struct http_response {
  int status;               /* 100 to 999 */
  char status_line[160];    /* printable, for messages */
  bool te_nbd;              /* "Transfer-Encoding: nbd" (any case) */
};

/* Parses a response head of len bytes (http_head_end's). 0, or -EPROTO
 * with the reason in err. */
int http_parse_response(const char *head, size_t len,
                        struct http_response *r, char *err, size_t errlen);

struct http_request {
  char method[16];
  char path[HTTP_MAX_TARGET];   /* decoded, without the query */
  char query[HTTP_MAX_TARGET];  /* raw, without the '?'; "" when none */
  bool chunked;                 /* a "chunked" key in the query or a
                                   cookie */
  bool has_te;                  /* any Transfer-Encoding header */
  bool has_length;
  uint64_t content_length;
  bool expect_continue;         /* "Expect: 100-continue" */
  char session[128];            /* session_id from query or cookie */
};

/* Parses a request head of len bytes. 0, or -EPROTO (malformed) or
 * -EMSGSIZE (a field over its bound) with the reason in err. */
int http_parse_request(const char *head, size_t len, struct http_request *r,
                       char *err, size_t errlen);

/* The value of key in a query string ("a=1&b=2"), percent-decoded into
 * out: 1 when found, 0 when not, -EINVAL when malformed or too long. */
int http_query_get(const char *query, const char *key, char *out,
                   size_t outlen);

#endif
