/* fuzz-http.c: the HTTP of xapi's transports (proto/http.c) and the
 * Chunked header (proto/chunked.h), as a peer or a user sends them. The
 * first byte picks the parser: a URL, a response head, a request head, a
 * query string, or frame headers checked against an export size. What
 * parses must be within its bounds; what fails must say why. */
#include <string.h>

#include "fuzz.h"
#include "proto/chunked.h"
#include "proto/http.h"

static void
fuzz_url(const char *s)
{
  struct http_url u;
  char err[256];
  memset(err, 0x55, sizeof err);
  if (http_url_parse(s, &u, err, sizeof err) == 0) {
    CHECK(http_url_is_http(s));
    CHECK(u.host && u.host[0] && u.port && u.target && u.target[0] == '/');
    CHECK(strlen(u.target) < HTTP_MAX_TARGET);
    for (const char *p = u.target; *p; p++)
      CHECK((unsigned char)*p > ' ' && *p != 0x7f);
    char head[HTTP_MAX_TARGET + 1024];
    int n = http_put_head(head, sizeof head, &u, true);
    if (n > 0) {
      /* Our own head parses as a request, with its chunked key. */
      struct http_request rq;
      CHECK(http_head_end(head, (size_t)n) == (size_t)n);
      if (http_parse_request(head, (size_t)n, &rq, err, sizeof err) == 0)
        CHECK(rq.chunked && strcmp(rq.method, "PUT") == 0);
    }
    http_url_free(&u);
  } else {
    size_t n = strnlen(err, sizeof err);
    CHECK(n > 0 && n < sizeof err);
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  uint8_t mode = data[0] % 5;
  data++;
  size--;
  char err[256];
  memset(err, 0x55, sizeof err);
  if (mode == 0) {
    char *s = fuzz_cstr(data, size);
    fuzz_url(s);
    free(s);
  } else if (mode == 1 || mode == 2) {
    size_t end = http_head_end((const char *)data, size);
    CHECK(end <= size);
    if (end == 0)
      return 0;
    int r;
    if (mode == 1) {
      struct http_response rsp;
      r = http_parse_response((const char *)data, end, &rsp, err, sizeof err);
      if (r == 0)
        CHECK(rsp.status >= 100 && rsp.status <= 999 &&
              strlen(rsp.status_line) < sizeof rsp.status_line);
    } else {
      struct http_request rq;
      r = http_parse_request((const char *)data, end, &rq, err, sizeof err);
      if (r == 0)
        CHECK(rq.path[0] == '/' && strlen(rq.query) < sizeof rq.query &&
              strlen(rq.method) < sizeof rq.method);
    }
    if (r != 0) {
      size_t n = strnlen(err, sizeof err);
      CHECK(n > 0 && n < sizeof err);
    }
  } else if (mode == 3) {
    char *s = fuzz_cstr(data, size);
    char out[64];
    int r = http_query_get(s, "vdi", out, sizeof out);
    CHECK(r >= -22 && r <= 1);
    if (r == 1)
      CHECK(strlen(out) < sizeof out);
    free(s);
  } else {
    for (size_t i = 0; i + CHUNKED_HEADER_LEN + 8 <= size;
         i += CHUNKED_HEADER_LEN + 8) {
      struct chunked_header h;
      uint64_t disk = 0;
      for (int k = 0; k < 8; k++)
        disk = (disk << 8) | data[i + CHUNKED_HEADER_LEN + (size_t)k];
      chunked_get(data + i, &h);
      uint8_t again[CHUNKED_HEADER_LEN];
      chunked_put(again, h.offset, h.length);
      CHECK(memcmp(again, data + i, sizeof again) == 0);
      if (chunked_check(&h, disk) == 0)
        CHECK(h.length < CHUNKED_LIMIT_LEN && h.offset <= disk &&
              h.length <= disk - h.offset);
    }
  }
  return 0;
}
