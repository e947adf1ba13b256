/* fuzz-header.c: the fixed-size headers of both directions: option
 * headers and option reply headers, compact and extended requests, and
 * the three reply forms (wire_reply_len, wire_decode_reply). A header
 * that decodes must encode back to the same bytes; a reply's length must
 * agree with its magic. */
#include <string.h>

#include "fuzz.h"
#include "proto/wire.h"

#define MAXHDR 32

/* A copy of the input's first n bytes in an allocation of exactly n, so
 * that a read past them is an overflow ASan sees. */
static uint8_t *
exact(const uint8_t *data, size_t n)
{
  uint8_t *p = malloc(n);
  CHECK(p);
  memcpy(p, data, n);
  return p;
}

static void
options(const uint8_t *data)
{
  uint8_t *in = exact(data, NBD_OPT_HDR_LEN);
  uint8_t out[MAXHDR];
  struct wire_opt o;
  if (wire_decode_opt(in, &o) == 0) {
    wire_encode_opt(out, o.option, o.length);
    CHECK(memcmp(out, in, NBD_OPT_HDR_LEN) == 0);
  }
  free(in);
  in = exact(data, NBD_OPT_REPLY_HDR_LEN);
  struct wire_opt_reply r;
  if (wire_decode_opt_reply(in, &r) == 0) {
    wire_encode_opt_reply(out, r.option, r.type, r.length);
    CHECK(memcmp(out, in, NBD_OPT_REPLY_HDR_LEN) == 0);
  }
  free(in);
}

static void
requests(const uint8_t *data)
{
  for (int ext = 0; ext <= 1; ext++) {
    struct wire_request r;
    uint8_t out[MAXHDR];
    uint8_t *in = exact(data, wire_request_len(ext));
    int rc = wire_decode_request(in, ext, &r);
    free(in);
    if (rc < 0)
      continue;
    CHECK(ext || r.length <= UINT32_MAX);
    size_t n = wire_encode_request(out, ext, &r);
    CHECK(n == wire_request_len(ext));
    CHECK(memcmp(out, data, n) == 0);
  }
}

static void
replies(const uint8_t *data)
{
  struct wire_reply r;
  uint8_t out[MAXHDR];
  uint8_t *magic = exact(data, 4);
  size_t n = wire_reply_len(magic);
  free(magic);
  CHECK(n <= MAXHDR);
  uint8_t *in = exact(data, n ? n : 4);
  int rc = wire_decode_reply(in, &r);
  free(in);
  CHECK((n == 0) == (rc < 0));
  if (rc < 0)
    return;
  size_t m;
  if (r.magic == NBD_SIMPLE_REPLY_MAGIC) {
    CHECK(r.flags == NBD_REPLY_FLAG_DONE && r.length == 0);
    m = wire_encode_simple_reply(out, r.cookie, r.error);
  } else {
    bool ext = r.magic == NBD_EXTENDED_REPLY_MAGIC;
    CHECK(r.error == 0 && (ext || r.offset == 0));
    m = wire_encode_chunk(out, ext, r.flags, r.type, r.cookie, r.offset,
                          r.length);
  }
  CHECK(m == n);
  CHECK(memcmp(out, data, n) == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < MAXHDR)
    return 0;
  options(data);
  requests(data);
  replies(data);
  return 0;
}
