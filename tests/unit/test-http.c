/* test-http.c: the HTTP and Chunked layouts of xapi's transports
 * (proto/http.c, proto/chunked.h): URLs, the PUT's head, the answers and
 * requests as xapi and vhd-tool write them, and frame headers. Prints one
 * ok / not ok line per case; exits non-zero when any fails. */
#include <stdio.h>
#include <string.h>

#include "proto/chunked.h"
#include "proto/http.h"

static int failures, count;

static void
check(bool cond, const char *what)
{
  count++;
  printf("%s %d - %s\n", cond ? "ok" : "not ok", count, what);
  if (!cond)
    failures++;
}

static void
url_ok(const char *s, bool tls, const char *user, const char *pw,
       const char *host, const char *port, const char *target)
{
  struct http_url u;
  char err[256], what[512];
  int r = http_url_parse(s, &u, err, sizeof err);
  snprintf(what, sizeof what, "%s parses%s%s", s, r ? ": " : "",
           r ? err : "");
  check(r == 0, what);
  if (r)
    return;
  snprintf(what, sizeof what, "%s: fields", s);
  check(u.tls == tls && (user ? u.user && !strcmp(u.user, user) : !u.user) &&
            (pw ? u.password && !strcmp(u.password, pw) : !u.password) &&
            !strcmp(u.host, host) && !strcmp(u.port, port) &&
            !strcmp(u.target, target),
        what);
  http_url_free(&u);
}

static void
url_bad(const char *s)
{
  struct http_url u;
  char err[256] = "", what[512];
  int r = http_url_parse(s, &u, err, sizeof err);
  snprintf(what, sizeof what, "'%s' refused (%s)", s, err);
  check(r < 0 && err[0], what);
  if (r == 0)
    http_url_free(&u);
}

int
main(void)
{
  url_ok("http://h/import_raw_vdi?vdi=a&format=raw", false, NULL, NULL, "h",
         "80", "/import_raw_vdi?vdi=a&format=raw");
  url_ok("https://root:p%40ss@10.0.0.1:8443/x", true, "root", "p@ss",
         "10.0.0.1", "8443", "/x");
  url_ok("HTTPS://[fe80::1]/", true, NULL, NULL, "fe80::1", "443", "/");
  url_ok("http://h?session_id=1", false, NULL, NULL, "h", "80",
         "/?session_id=1");
  url_ok("http://h", false, NULL, NULL, "h", "80", "/");
  url_bad("ftp://h/");
  url_bad("http:///path");
  url_bad("http://h:0/");
  url_bad("http://h:65536/");
  url_bad("http://h/a b");
  url_bad("http://h/a\r\nX-Injected: 1");
  url_bad("http://[::1/");
  url_bad("http://h/#frag");

  struct http_url u;
  char err[256], head[8192];
  http_url_parse("http://root:pw@h:81/import_raw_vdi?vdi=a", &u, err,
                 sizeof err);
  int n = http_put_head(head, sizeof head, &u, true);
  check(n > 0 && strncmp(head, "PUT /import_raw_vdi?vdi=a HTTP/1.1\r\n", 36)
                     == 0, "PUT request line");
  check(strstr(head, "\r\nHost: h:81\r\n") != NULL, "Host with the port");
  check(strstr(head, "\r\nCookie: chunked=true\r\n") != NULL,
        "the chunked cookie");
  check(strstr(head, "\r\nAuthorization: Basic cm9vdDpwdw==\r\n") != NULL,
        "Basic authorization of root:pw");
  check(strstr(head, "Content-Length") == NULL &&
            strstr(head, "Transfer-Encoding") == NULL,
        "neither Content-Length nor Transfer-Encoding");
  check(n > 4 && strcmp(head + n - 4, "\r\n\r\n") == 0, "ends the head");
  check(http_put_head(head, 40, &u, true) == -ENOSPC, "a small buffer");
  http_url_free(&u);

  struct http_response rsp;
  const char *a = "HTTP/1.1 200 OK\r\nTransfer-encoding: nbd\r\n\r\nNBDMAGIC";
  size_t end = http_head_end(a, strlen(a));
  check(end == strlen(a) - 8, "head end before the NBD greeting");
  check(http_parse_response(a, end, &rsp, err, sizeof err) == 0 &&
            rsp.status == 200 && rsp.te_nbd,
        "200 with Transfer-encoding: nbd");
  a = "HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n";
  check(http_parse_response(a, strlen(a), &rsp, err, sizeof err) == 0 &&
            !rsp.te_nbd,
        "200 without nbd");
  a = "HTTP/1.1 404 Not Found\n\n";
  check(http_parse_response(a, strlen(a), &rsp, err, sizeof err) == 0 &&
            rsp.status == 404 &&
            strcmp(rsp.status_line, "HTTP/1.1 404 Not Found") == 0,
        "404 with bare line ends");
  a = "SSH-2.0-OpenSSH\r\n\r\n";
  check(http_parse_response(a, strlen(a), &rsp, err, sizeof err) < 0,
        "not HTTP");
  a = "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n";
  check(http_parse_response(a, strlen(a), &rsp, err, sizeof err) < 0,
        "a header without a colon");
  check(http_head_end("HTTP/1.1 200 OK\r\n", 17) == 0, "no head end yet");

  struct http_request rq;
  a = "PUT /import_raw_vdi?vdi=OpaqueRef%3A1&format=raw HTTP/1.1\r\n"
      "Host: x\r\nCookie: session_id=abc; chunked=true\r\n\r\n";
  check(http_parse_request(a, strlen(a), &rq, err, sizeof err) == 0 &&
            !strcmp(rq.method, "PUT") && !strcmp(rq.path, "/import_raw_vdi") &&
            rq.chunked && !strcmp(rq.session, "abc") && !rq.has_te,
        "xapi's import request with a cookie");
  char v[64];
  check(http_query_get(rq.query, "vdi", v, sizeof v) == 1 &&
            !strcmp(v, "OpaqueRef:1"),
        "a decoded query value");
  check(http_query_get(rq.query, "nosuch", v, sizeof v) == 0, "no such key");
  a = "PUT /x?chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
      "Content-Length: 12\r\n\r\n";
  check(http_parse_request(a, strlen(a), &rq, err, sizeof err) == 0 &&
            rq.chunked && rq.has_te && rq.has_length &&
            rq.content_length == 12,
        "chunked key in the query, TE and length seen");
  a = "PUT /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
  check(http_parse_request(a, strlen(a), &rq, err, sizeof err) < 0,
        "two Content-Lengths");
  a = "PUT x HTTP/1.1\r\n\r\n";
  check(http_parse_request(a, strlen(a), &rq, err, sizeof err) < 0,
        "a target that is not a path");
  a = "\x16\x03\x01 binary\r\n\r\n";
  check(http_parse_request(a, strlen(a), &rq, err, sizeof err) < 0,
        "TLS at the HTTP port");

  uint8_t hdr[12];
  struct chunked_header h;
  chunked_put(hdr, 0x0102030405060708ull, 0x0a0b0c0d);
  check(hdr[0] == 8 && hdr[7] == 1 && hdr[8] == 0x0d && hdr[11] == 0x0a,
        "frame header little-endian");
  chunked_get(hdr, &h);
  check(h.offset == 0x0102030405060708ull && h.length == 0x0a0b0c0d,
        "frame header round trip");
  h = (struct chunked_header){ 0, 0 };
  check(chunked_is_end(&h), "the end marker");
  h = (struct chunked_header){ 1 << 20, 512 };
  check(chunked_check(&h, 1 << 20) == EFBIG, "a frame past the end");
  h = (struct chunked_header){ 0, 0x80000000u };
  check(chunked_check(&h, UINT64_MAX) == EMSGSIZE, "a length of 2^31");
  h = (struct chunked_header){ UINT64_MAX - 10, 512 };
  check(chunked_check(&h, UINT64_MAX) == EFBIG, "an offset that wraps");
  h = (struct chunked_header){ 512, 512 };
  check(chunked_check(&h, 1024) == 0, "a frame that ends at the end");
  printf("1..%d\n", count);
  return failures ? 1 : 0;
}
