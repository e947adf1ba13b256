/* test-wire.c: unit tests for src/proto/wire.{h,c}.
 *
 * Byte layouts are written out by hand from the protocol spec (not produced
 * by the encoder under test), so an encoder and decoder that agree with each
 * other but not with the spec still fail here. Hostile lengths check that no
 * decoder ever reads past the bytes it was given: the buffers are heap
 * allocated to their exact size so AddressSanitizer catches an overrun. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"
#include "tap.h"

/* Copies n bytes into a fresh allocation of exactly n bytes (at least 1),
 * so reads past the end are visible to ASan. Caller frees. */
static uint8_t *
dup_exact(const uint8_t *p, size_t n)
{
  uint8_t *b = malloc(n ? n : 1);
  if (b == NULL) {
    perror("malloc");
    exit(2);
  }
  if (n)
    memcpy(b, p, n);
  return b;
}

static void
test_endian(void)
{
  uint8_t b[8];
  wire_put16(b, 0x1234);
  is_bytes(b, "\x12\x34", 2, "put16 is big-endian");
  is(wire_get16(b), 0x1234, "get16 round trip");
  wire_put32(b, 0xdeadbeef);
  is_bytes(b, "\xde\xad\xbe\xef", 4, "put32 is big-endian");
  is(wire_get32(b), 0xdeadbeef, "get32 round trip");
  wire_put64(b, UINT64_C(0x0102030405060708));
  is_bytes(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8, "put64 is big-endian");
  is(wire_get64(b), UINT64_C(0x0102030405060708), "get64 round trip");
  wire_put64(b, UINT64_MAX);
  is(wire_get64(b), UINT64_MAX, "get64 of all ones");
  wire_put16(b, 0xffff);
  is(wire_get16(b), 0xffff, "get16 of all ones (no sign extension)");
  wire_put32(b, 0x80000000u);
  is(wire_get32(b), 0x80000000u, "get32 high bit (no sign extension)");
}

static void
test_greeting(void)
{
  /* §Newstyle negotiation: "NBDMAGIC", "IHAVEOPT", u16 handshake flags. */
  static const uint8_t want[NBD_GREETING_LEN] =
    "NBDMAGIC" "IHAVEOPT" "\x00\x03";
  uint8_t out[NBD_GREETING_LEN];
  memset(out, 0xaa, sizeof out);
  wire_encode_greeting(out, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  is(NBD_GREETING_LEN, 18, "greeting is 18 bytes");
  is_bytes(out, want, sizeof want, "greeting bytes match the spec");
}

static void
test_opt(void)
{
  static const uint8_t want[NBD_OPT_HDR_LEN] =
    "IHAVEOPT" "\x00\x00\x00\x07" "\x00\x00\x01\x02";
  uint8_t out[NBD_OPT_HDR_LEN];
  struct wire_opt o;

  wire_encode_opt(out, NBD_OPT_GO, 0x102);
  is_bytes(out, want, sizeof want, "option header bytes (GO, length 258)");
  memset(&o, 0, sizeof o);
  is(wire_decode_opt(out, &o), 0, "option header decodes");
  is(o.option, NBD_OPT_GO, "option code round trip");
  is(o.length, 0x102, "option length round trip");

  wire_encode_opt(out, 0xffffffffu, 0xffffffffu);
  is(wire_decode_opt(out, &o), 0, "all-ones option header decodes");
  is(o.option, 0xffffffffu, "option 0xffffffff kept");
  is(o.length, 0xffffffffu, "length 0xffffffff kept (caller must bound it)");

  for (int i = 0; i < 8; i++) {
    wire_encode_opt(out, NBD_OPT_LIST, 0);
    out[i] ^= 0x01;
    is(wire_decode_opt(out, &o), (uint64_t)(int64_t)-EPROTO,
       "option header with magic byte %d flipped is refused", i);
  }
  /* The NBDMAGIC password where IHAVEOPT belongs. */
  memcpy(out, "NBDMAGIC", 8);
  is(wire_decode_opt(out, &o), (uint64_t)(int64_t)-EPROTO,
     "NBDMAGIC instead of IHAVEOPT is refused");
}

static void
test_opt_reply(void)
{
  static const uint8_t want[NBD_OPT_REPLY_HDR_LEN] =
    "\x00\x03\xe8\x89\x04\x55\x65\xa9" "\x00\x00\x00\x06"
    "\x80\x00\x00\x06" "\x00\x00\x00\x00";
  uint8_t out[NBD_OPT_REPLY_HDR_LEN];
  struct wire_opt_reply r;

  wire_encode_opt_reply(out, NBD_OPT_INFO, NBD_REP_ERR_UNKNOWN, 0);
  is_bytes(out, want, sizeof want, "option reply bytes (INFO, ERR_UNKNOWN)");
  is(wire_decode_opt_reply(out, &r), 0, "option reply decodes");
  is(r.option, NBD_OPT_INFO, "reply option");
  is(r.type, NBD_REP_ERR_UNKNOWN, "reply type");
  is(r.length, 0, "reply length");

  wire_encode_opt_reply(out, NBD_OPT_LIST, NBD_REP_SERVER, 0xfffffff0u);
  is(wire_decode_opt_reply(out, &r), 0, "large reply length decodes");
  is(r.length, 0xfffffff0u, "large reply length kept");

  out[7] ^= 0x80;
  is(wire_decode_opt_reply(out, &r), (uint64_t)(int64_t)-EPROTO,
     "option reply with wrong magic is refused");
  /* An option reply magic is not a request magic either way round. */
  wire_encode_opt(out, NBD_OPT_LIST, 0);
  is(wire_decode_opt_reply(out, &r), (uint64_t)(int64_t)-EPROTO,
     "IHAVEOPT is not an option reply magic");
}

static int
decode_info(const uint8_t *bytes, size_t len, struct wire_info_req *r)
{
  uint8_t *b = dup_exact(bytes, len);
  int rc = wire_decode_info_req(b, len, r);
  /* Pointers into b are dead after free; callers only check fields that
   * are plain values, or compare offsets computed before. */
  if (rc == 0) {
    r->name = bytes + (r->name - b);
    r->reqs = bytes + (r->reqs - b);
  }
  free(b);
  return rc;
}

static void
test_info_req(void)
{
  uint8_t buf[64];
  struct wire_info_req r;
  const uint16_t reqs[] = { NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE };
  static const uint8_t want[] =
    "\x00\x00\x00\x04" "disk" "\x00\x02" "\x00\x01" "\x00\x03";

  size_t n = wire_encode_info_req(buf, "disk", 4, reqs, 2);
  is(n, 14, "INFO request for \"disk\" with 2 requests is 14 bytes");
  is_bytes(buf, want, 14, "INFO request bytes");
  memset(&r, 0, sizeof r);
  is(decode_info(buf, n, &r), 0, "INFO request decodes");
  is(r.name_len, 4, "name length");
  ok(r.name == buf + 4 && memcmp(r.name, "disk", 4) == 0,
     "name points into the buffer");
  is(r.nreqs, 2, "request count");
  ok(r.reqs == buf + 10, "requests point after the count");
  is(wire_get16(r.reqs + 2), NBD_INFO_BLOCK_SIZE, "second request code");

  /* Empty name, no requests: the smallest valid form, an exact fit. */
  n = wire_encode_info_req(buf, "", 0, NULL, 0);
  is(n, 6, "empty INFO request is 6 bytes");
  is_bytes(buf, "\0\0\0\0\0\0", 6, "empty INFO request bytes");
  is(decode_info(buf, n, &r), 0, "empty INFO request decodes");
  is(r.name_len, 0, "empty name");
  is(r.nreqs, 0, "no requests");

  /* Too short for the fixed fields. */
  for (size_t len = 0; len < 6; len++)
    is(decode_info((const uint8_t *)"\0\0\0\0\0\0", len, &r),
       (uint64_t)(int64_t)-EINVAL, "INFO request of %zu bytes refused", len);

  /* Name length overruns by one byte, and by a lot. */
  n = wire_encode_info_req(buf, "disk", 4, NULL, 0); /* 10 bytes */
  wire_put32(buf, 5);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "name length one past the end refused");
  wire_put32(buf, 0xffffffffu);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "name length 0xffffffff refused");
  wire_put32(buf, 0xfffffffau); /* n + 6 wraps in 32 bits */
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "name length 0xfffffffa (wraps with +6) refused");
  wire_put32(buf, 0x80000000u);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "name length 2^31 refused");
  wire_put32(buf, 4);
  is(decode_info(buf, n, &r), 0, "name length restored: exact fit accepted");

  /* Request count disagrees with the bytes left. */
  n = wire_encode_info_req(buf, "disk", 4, reqs, 2);
  wire_put16(buf + 8, 3);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "request count one more than the bytes hold refused");
  wire_put16(buf + 8, 0xffff);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "request count 0xffff refused");
  wire_put16(buf + 8, 1);
  is(decode_info(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "trailing bytes after the requests refused");
  wire_put16(buf + 8, 2);
  is(decode_info(buf, n - 1, &r), (uint64_t)(int64_t)-EINVAL,
     "odd length (half a request code) refused");

  /* A 4096-byte name, the spec's maximum, decodes (policy is the
   * server's); the decoder itself has no small limit. */
  size_t big = 4 + 4096 + 2;
  uint8_t *bb = calloc(1, big);
  if (bb == NULL)
    exit(2);
  memset(bb + 4, 'x', 4096);
  wire_put32(bb, 4096);
  is(wire_decode_info_req(bb, big, &r), 0, "4096-byte name decodes");
  is(r.name_len, 4096, "4096-byte name length kept");
  free(bb);
}

static int
decode_meta(const uint8_t *bytes, size_t len, struct wire_meta_req *r)
{
  uint8_t *b = dup_exact(bytes, len);
  int rc = wire_decode_meta_req(b, len, r);
  free(b);
  return rc;
}

static void
test_meta_req(void)
{
  uint8_t buf[128];
  struct wire_meta_req r;
  const char *const qs[] = { "base:allocation", "qemu:" };
  static const uint8_t want[] =
    "\x00\x00\x00\x01" "e"
    "\x00\x00\x00\x02"
    "\x00\x00\x00\x0f" "base:allocation"
    "\x00\x00\x00\x05" "qemu:";

  size_t n = wire_encode_meta_req(buf, "e", 1, qs, 2);
  is(n, sizeof want - 1, "meta request length");
  is_bytes(buf, want, sizeof want - 1, "meta request bytes");

  memset(&r, 0, sizeof r);
  is(wire_decode_meta_req(buf, n, &r), 0, "meta request decodes");
  is(r.name_len, 1, "meta name length");
  ok(r.name == buf + 4 && r.name[0] == 'e', "meta name points into buffer");
  is(r.nqueries, 2, "query count");
  const uint8_t *q;
  uint32_t ql;
  is(wire_meta_next(&r, &q, &ql), 1, "first query");
  ok(ql == 15 && memcmp(q, "base:allocation", 15) == 0,
     "first query is base:allocation");
  is(wire_meta_next(&r, &q, &ql), 1, "second query");
  ok(ql == 5 && memcmp(q, "qemu:", 5) == 0, "second query is qemu:");
  is(wire_meta_next(&r, &q, &ql), 0, "no third query");
  is(wire_meta_next(&r, &q, &ql), 0, "still no third query");

  /* No queries, empty name: 8 bytes, exact fit. */
  n = wire_encode_meta_req(buf, "", 0, NULL, 0);
  is(n, 8, "empty meta request is 8 bytes");
  is(decode_meta(buf, n, &r), 0, "empty meta request decodes");
  is(r.nqueries, 0, "zero queries");
  for (size_t len = 0; len < 8; len++)
    is(decode_meta(buf, len, &r), (uint64_t)(int64_t)-EINVAL,
       "meta request of %zu bytes refused", len);

  /* Hostile name lengths. */
  n = wire_encode_meta_req(buf, "e", 1, qs, 1);
  wire_put32(buf, 0xffffffffu);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "meta name length 0xffffffff refused");
  wire_put32(buf, 0xfffffff8u);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "meta name length 0xfffffff8 (wraps with +8) refused");
  wire_put32(buf, (uint32_t)(n - 8 + 1));
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "meta name length one past the end refused");
  wire_put32(buf, 1);
  is(decode_meta(buf, n, &r), 0, "restored meta request decodes");

  /* Hostile query counts and lengths. Layout: 4+1 name, 4 count, 4 qlen. */
  size_t cnt = 5, qlen = 9;
  wire_put32(buf + cnt, 0xffffffffu);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query count 0xffffffff with one query refused");
  wire_put32(buf + cnt, 2);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query count one more than present refused");
  wire_put32(buf + cnt, 0);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query count 0 with a query's bytes trailing refused");
  wire_put32(buf + cnt, 1);
  wire_put32(buf + qlen, 0xffffffffu);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query length 0xffffffff refused");
  wire_put32(buf + qlen, 0xfffffffcu);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query length 0xfffffffc (wraps with +4) refused");
  wire_put32(buf + qlen, 16);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query length one past the end refused");
  wire_put32(buf + qlen, 14);
  is(decode_meta(buf, n, &r), (uint64_t)(int64_t)-EINVAL,
     "query length one short (trailing byte) refused");
  wire_put32(buf + qlen, 15);
  is(decode_meta(buf, n, &r), 0, "query length exact fit accepted");
  is(decode_meta(buf, n - 1, &r), (uint64_t)(int64_t)-EINVAL,
     "truncated last query refused");
  is(decode_meta(buf, 11, &r), (uint64_t)(int64_t)-EINVAL,
     "truncated query length field refused");

  /* A zero-length query is well-formed (the spec lets the server decide). */
  n = wire_encode_meta_req(buf, "", 0, (const char *const[]){ "" }, 1);
  is(n, 12, "meta request with one empty query is 12 bytes");
  is(wire_decode_meta_req(buf, n, &r), 0, "empty query decodes");
  is(wire_meta_next(&r, &q, &ql), 1, "empty query iterates");
  is(ql, 0, "empty query length 0");
  is(wire_meta_next(&r, &q, &ql), 0, "then the end");
}

static void
test_request(void)
{
  /* §Request message: magic, u16 flags, u16 type, u64 cookie, u64 offset,
   * u32 length. */
  static const uint8_t want[NBD_REQUEST_LEN] =
    "\x25\x60\x95\x13" "\x00\x01" "\x00\x01"
    "\x11\x22\x33\x44\x55\x66\x77\x88"
    "\x00\x00\x00\x01\x00\x00\x02\x00"
    "\x00\x01\x00\x00";
  struct wire_request rq = {
    .flags = NBD_CMD_FLAG_FUA,
    .type = NBD_CMD_WRITE,
    .cookie = UINT64_C(0x1122334455667788),
    .offset = UINT64_C(0x100000200),
    .length = 0x10000,
  };
  uint8_t out[NBD_EXTENDED_REQUEST_LEN + 4];
  struct wire_request d;

  memset(out, 0xee, sizeof out);
  is(wire_encode_request(out, false, &rq), 28, "compact request is 28 bytes");
  is_bytes(out, want, 28, "compact request bytes");
  is(out[28], 0xee, "compact encoder writes nothing past 28 bytes");
  is(wire_request_len(false), 28, "wire_request_len(compact)");
  is(wire_request_len(true), 32, "wire_request_len(extended)");
  memset(&d, 0, sizeof d);
  is(wire_decode_request(out, false, &d), 0, "compact request decodes");
  is(d.flags, rq.flags, "flags");
  is(d.type, rq.type, "type");
  is(d.cookie, rq.cookie, "cookie");
  is(d.offset, rq.offset, "offset");
  is(d.length, rq.length, "length");

  /* Compact length is 32 bits on the wire. */
  rq.length = 0xffffffffu;
  wire_encode_request(out, false, &rq);
  is(wire_decode_request(out, false, &d), 0, "length 0xffffffff decodes");
  is(d.length, 0xffffffffu, "length 0xffffffff kept");
  rq.offset = UINT64_MAX;
  wire_encode_request(out, false, &rq);
  wire_decode_request(out, false, &d);
  is(d.offset, UINT64_MAX, "offset 2^64-1 kept (bounds are the server's)");

  /* Extended: 32 bytes, 64-bit length. */
  static const uint8_t wantx[NBD_EXTENDED_REQUEST_LEN] =
    "\x21\xe4\x1c\x71" "\x00\x20" "\x00\x07"
    "\x00\x00\x00\x00\x00\x00\x00\x09"
    "\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x01\x00\x00\x00\x00";
  struct wire_request rx = {
    .flags = NBD_CMD_FLAG_PAYLOAD_LEN,
    .type = NBD_CMD_BLOCK_STATUS,
    .cookie = 9,
    .offset = 0,
    .length = UINT64_C(0x100000000),
  };
  memset(out, 0xee, sizeof out);
  is(wire_encode_request(out, true, &rx), 32, "extended request is 32 bytes");
  is_bytes(out, wantx, 32, "extended request bytes");
  is(out[32], 0xee, "extended encoder writes nothing past 32 bytes");
  is(wire_decode_request(out, true, &d), 0, "extended request decodes");
  is(d.length, UINT64_C(0x100000000), "extended 64-bit length kept");
  is(d.type, NBD_CMD_BLOCK_STATUS, "extended type");

  /* Magic checks, both ways round. */
  is(wire_decode_request(out, false, &d), (uint64_t)(int64_t)-EPROTO,
     "extended magic refused in compact mode");
  wire_encode_request(out, false, &rq);
  is(wire_decode_request(out, true, &d), (uint64_t)(int64_t)-EPROTO,
     "compact magic refused in extended mode");
  for (int i = 0; i < 4; i++) {
    wire_encode_request(out, false, &rq);
    out[i] ^= 0x10;
    is(wire_decode_request(out, false, &d), (uint64_t)(int64_t)-EPROTO,
       "request magic byte %d flipped refused", i);
  }
  /* Reserved historic magics are no request. */
  wire_put32(out, 0x25609514u);
  is(wire_decode_request(out, false, &d), (uint64_t)(int64_t)-EPROTO,
     "reserved magic 0x25609514 refused");
  wire_put32(out, NBD_SIMPLE_REPLY_MAGIC);
  is(wire_decode_request(out, false, &d), (uint64_t)(int64_t)-EPROTO,
     "reply magic refused as a request");
}

static void
test_replies(void)
{
  uint8_t out[NBD_EXTENDED_REPLY_LEN + 4];
  struct wire_reply r;

  /* Simple reply: magic, u32 error, u64 cookie. */
  static const uint8_t want_simple[NBD_SIMPLE_REPLY_LEN] =
    "\x67\x44\x66\x98" "\x00\x00\x00\x16" "\xca\xfe\x00\x00\x00\x00\x00\x01";
  memset(out, 0xee, sizeof out);
  is(wire_encode_simple_reply(out, UINT64_C(0xcafe000000000001), NBD_EINVAL),
     16, "simple reply is 16 bytes");
  is_bytes(out, want_simple, 16, "simple reply bytes");
  is(out[16], 0xee, "simple reply encoder stops at 16 bytes");
  is(wire_reply_len(out), 16, "wire_reply_len(simple)");
  is(wire_decode_reply(out, &r), 0, "simple reply decodes");
  is(r.magic, NBD_SIMPLE_REPLY_MAGIC, "simple magic");
  is(r.error, NBD_EINVAL, "simple error");
  is(r.cookie, UINT64_C(0xcafe000000000001), "simple cookie");
  is(r.flags, NBD_REPLY_FLAG_DONE, "simple reply reads as DONE");
  is(r.type, NBD_REPLY_TYPE_NONE, "simple reply reads as type NONE");
  is(r.length, 0, "simple reply has no chunk length");

  /* Structured chunk: magic, u16 flags, u16 type, u64 cookie, u32 length. */
  static const uint8_t want_sr[NBD_STRUCTURED_REPLY_LEN] =
    "\x66\x8e\x33\xef" "\x00\x01" "\x80\x01"
    "\x00\x00\x00\x00\x00\x00\x00\x2a" "\x00\x00\x00\x0a";
  memset(out, 0xee, sizeof out);
  is(wire_encode_chunk(out, false, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR,
                       42, 12345, 10),
     20, "structured chunk header is 20 bytes");
  is_bytes(out, want_sr, 20, "structured chunk bytes (offset not sent)");
  is(out[20], 0xee, "structured encoder stops at 20 bytes");
  is(wire_reply_len(out), 20, "wire_reply_len(structured)");
  is(wire_decode_reply(out, &r), 0, "structured chunk decodes");
  is(r.flags, NBD_REPLY_FLAG_DONE, "structured flags");
  is(r.type, NBD_REPLY_TYPE_ERROR, "structured type");
  is(r.cookie, 42, "structured cookie");
  is(r.length, 10, "structured length");
  is(r.error, 0, "structured chunk has no header error");
  is(r.offset, 0, "structured chunk has no offset");

  /* Extended chunk: magic, flags, type, cookie, u64 offset, u64 length. */
  static const uint8_t want_ext[NBD_EXTENDED_REPLY_LEN] =
    "\x6e\x8a\x27\x8c" "\x00\x00" "\x00\x01"
    "\x00\x00\x00\x00\x00\x00\x00\x07"
    "\x00\x00\x00\x00\x00\x10\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x10\x08";
  memset(out, 0xee, sizeof out);
  is(wire_encode_chunk(out, true, 0, NBD_REPLY_TYPE_OFFSET_DATA, 7, 0x100000,
                       0x1008),
     32, "extended chunk header is 32 bytes");
  is_bytes(out, want_ext, 32, "extended chunk bytes");
  is(out[32], 0xee, "extended encoder stops at 32 bytes");
  is(wire_reply_len(out), 32, "wire_reply_len(extended)");
  is(wire_decode_reply(out, &r), 0, "extended chunk decodes");
  is(r.offset, 0x100000, "extended offset");
  is(r.length, 0x1008, "extended length");
  is(r.type, NBD_REPLY_TYPE_OFFSET_DATA, "extended type");

  /* Unknown magics. */
  wire_put32(out, NBD_REQUEST_MAGIC);
  is(wire_reply_len(out), 0, "request magic has no reply length");
  is(wire_decode_reply(out, &r), (uint64_t)(int64_t)-EPROTO,
     "request magic refused as a reply");
  wire_put32(out, 0);
  is(wire_reply_len(out), 0, "zero magic has no reply length");
  is(wire_decode_reply(out, &r), (uint64_t)(int64_t)-EPROTO,
     "zero magic refused");
  wire_put32(out, 0x96744668u);
  is(wire_decode_reply(out, &r), (uint64_t)(int64_t)-EPROTO,
     "historic reserved magic refused");
}

static int
decode_err(const uint8_t *bytes, size_t len, bool off,
           struct wire_error_chunk *e)
{
  uint8_t *b = dup_exact(bytes, len);
  int rc = wire_decode_error_chunk(b, len, off, e);
  if (rc == 0)
    e->msg = bytes + (e->msg - b);
  free(b);
  return rc;
}

static void
test_error_chunk(void)
{
  struct wire_error_chunk e;
  static const uint8_t plain[] = "\x00\x00\x00\x1c" "\x00\x04" "full";
  memset(&e, 0, sizeof e);
  is(decode_err(plain, 10, false, &e), 0, "error chunk decodes");
  is(e.error, NBD_ENOSPC, "error value");
  is(e.msg_len, 4, "message length");
  ok(e.msg == plain + 6 && memcmp(e.msg, "full", 4) == 0, "message bytes");
  is(e.offset, 0, "no offset without ERROR_OFFSET");

  static const uint8_t withoff[] =
    "\x00\x00\x00\x05" "\x00\x02" "io" "\x00\x00\x00\x00\x00\x00\x10\x00";
  is(decode_err(withoff, 16, true, &e), 0, "ERROR_OFFSET chunk decodes");
  is(e.error, NBD_EIO, "ERROR_OFFSET value");
  is(e.offset, 0x1000, "ERROR_OFFSET offset");
  is(decode_err(withoff, 16, false, &e), (uint64_t)(int64_t)-EINVAL,
     "ERROR_OFFSET bytes read as plain ERROR have trailing bytes: refused");
  is(decode_err(withoff, 15, true, &e), (uint64_t)(int64_t)-EINVAL,
     "ERROR_OFFSET missing a byte of offset refused");

  static const uint8_t empty[] = "\x00\x00\x00\x16" "\x00\x00";
  is(decode_err(empty, 6, false, &e), 0, "error with empty message decodes");
  is(e.msg_len, 0, "empty message");
  for (size_t len = 0; len < 6; len++)
    is(decode_err(empty, len, false, &e), (uint64_t)(int64_t)-EINVAL,
       "error chunk of %zu bytes refused", len);

  uint8_t hostile[16] = { 0, 0, 0, 5, 0xff, 0xff, 'x', 'x' };
  is(decode_err(hostile, 8, false, &e), (uint64_t)(int64_t)-EINVAL,
     "message length 0xffff overrunning the chunk refused");
  wire_put16(hostile + 4, 3);
  is(decode_err(hostile, 8, false, &e), (uint64_t)(int64_t)-EINVAL,
     "message length one past the end refused");
  wire_put16(hostile + 4, 2);
  is(decode_err(hostile, 8, false, &e), 0, "message length exact fit");
  wire_put16(hostile + 4, 2);
  is(decode_err(hostile, 8, true, &e), (uint64_t)(int64_t)-EINVAL,
     "ERROR_OFFSET without room for the offset refused");
}

/* §NBD_REP_INFO: u16 type, then 10 bytes (size, flags) for
 * NBD_INFO_EXPORT, 12 (three u32) for NBD_INFO_BLOCK_SIZE, text for NAME
 * and DESCRIPTION. */
static void
test_info_item(void)
{
  struct wire_info_item it;
  static const uint8_t exp[] = "\x00\x00" "\x00\x00\x00\x01\x00\x00\x00\x00"
                               "\x00\x0d";
  uint8_t *b = dup_exact(exp, 12);
  is(wire_decode_info_item(b, 12, &it), 0, "NBD_INFO_EXPORT decodes");
  is(it.type, NBD_INFO_EXPORT, "its type");
  is(it.size, UINT64_C(0x100000000), "its size");
  is(it.tflags, 0x0d, "its transmission flags");
  free(b);
  for (size_t len = 0; len < 16; len++) {
    if (len == 12)
      continue;
    uint8_t buf[16] = { 0 };
    b = dup_exact(buf, len);
    is(wire_decode_info_item(b, len, &it), (uint64_t)(int64_t)-EINVAL,
       "NBD_INFO_EXPORT of %zu bytes refused", len);
    free(b);
  }

  static const uint8_t bs[] = "\x00\x03" "\x00\x00\x02\x00" "\x00\x00\x10\x00"
                              "\x02\x00\x00\x00";
  b = dup_exact(bs, 14);
  is(wire_decode_info_item(b, 14, &it), 0, "NBD_INFO_BLOCK_SIZE decodes");
  ok(it.minimum == 512 && it.preferred == 4096 && it.maximum == 32u << 20,
     "its minimum, preferred and maximum");
  free(b);
  b = dup_exact(bs, 13);
  is(wire_decode_info_item(b, 13, &it), (uint64_t)(int64_t)-EINVAL,
     "NBD_INFO_BLOCK_SIZE of 13 bytes refused");
  is(it.type, NBD_INFO_BLOCK_SIZE, "the refused item's type is still set");
  free(b);

  static const uint8_t name[] = "\x00\x01" "disk";
  b = dup_exact(name, 6);
  is(wire_decode_info_item(b, 6, &it), 0, "NBD_INFO_NAME decodes");
  ok(it.text == b + 2 && it.text_len == 4, "its text is the rest");
  free(b);
  b = dup_exact(name, 2);
  is(wire_decode_info_item(b, 2, &it), 0, "an empty NBD_INFO_NAME decodes");
  is(it.text_len, 0, "with no text");
  free(b);
  static const uint8_t unknown[] = "\x12\x34" "xyz";
  b = dup_exact(unknown, 5);
  is(wire_decode_info_item(b, 5, &it), 0, "an unknown type decodes");
  is(it.type, 0x1234, "its type");
  free(b);
}

/* §NBD_REP_SERVER: u32 name length, name, description to the end.
 * §NBD_REP_META_CONTEXT: u32 context ID, name to the end. */
static void
test_rep_payloads(void)
{
  struct wire_rep_server srv;
  static const uint8_t list[] = "\x00\x00\x00\x03" "abc" "a disk";
  uint8_t *b = dup_exact(list, 13);
  is(wire_decode_rep_server(b, 13, &srv), 0, "LIST reply decodes");
  ok(srv.name == b + 4 && srv.name_len == 3, "its name");
  ok(srv.desc == b + 7 && srv.desc_len == 6, "its description");
  is(wire_decode_rep_server(b, 7, &srv), 0, "LIST reply without description");
  is(srv.desc_len, 0, "empty description");
  is(wire_decode_rep_server(b, 6, &srv), (uint64_t)(int64_t)-EINVAL,
     "a name one byte past the payload refused");
  is(wire_decode_rep_server(b, 3, &srv), (uint64_t)(int64_t)-EINVAL,
     "a LIST reply shorter than its length field refused");
  free(b);
  static const uint8_t huge[] = "\xff\xff\xff\xff" "x";
  b = dup_exact(huge, 5);
  is(wire_decode_rep_server(b, 5, &srv), (uint64_t)(int64_t)-EINVAL,
     "a name length of 2^32-1 refused");
  free(b);

  struct wire_rep_meta m;
  static const uint8_t meta[] = "\x00\x00\x00\x07" "base:allocation";
  b = dup_exact(meta, 19);
  is(wire_decode_rep_meta(b, 19, &m), 0, "META_CONTEXT reply decodes");
  is(m.id, 7, "its context ID");
  ok(m.name == b + 4 && m.name_len == 15, "its name");
  is(wire_decode_rep_meta(b, 3, &m), (uint64_t)(int64_t)-EINVAL,
     "a META_CONTEXT reply without a whole ID refused");
  free(b);
}

/* §NBD_REPLY_TYPE_OFFSET_HOLE: u64 offset, u32 hole size.
 * §NBD_REPLY_TYPE_BLOCK_STATUS: u32 context ID, then (u32 length, u32
 * flags) descriptors; _EXT: u32 context ID, u32 count, then (u64 length,
 * u64 flags). */
static void
test_data_chunks(void)
{
  uint64_t off = 0, len = 0;
  uint32_t hole = 0, flags = 0;
  static const uint8_t h[] = "\x00\x00\x00\x00\x00\x10\x00\x00"
                             "\x00\x00\x20\x00";
  uint8_t *b = dup_exact(h, 12);
  is(wire_decode_hole_chunk(b, 12, &off, &hole), 0, "hole chunk decodes");
  ok(off == 0x100000 && hole == 0x2000, "its offset and size");
  is(wire_decode_hole_chunk(b, 11, &off, &hole), (uint64_t)(int64_t)-EINVAL,
     "a hole chunk of 11 bytes refused");
  free(b);

  struct wire_status_chunk st;
  static const uint8_t cs[] = "\x00\x00\x00\x02"
                              "\x00\x00\x10\x00" "\x00\x00\x00\x03"
                              "\x00\x01\x00\x00" "\x00\x00\x00\x00";
  b = dup_exact(cs, 20);
  is(wire_decode_status_chunk(b, 20, false, &st), 0, "status chunk decodes");
  ok(st.context_id == 2 && st.count == 2, "its context and count");
  ok(wire_status_next(&st, &len, &flags) == 1 && len == 0x1000 && flags == 3,
     "first descriptor");
  ok(wire_status_next(&st, &len, &flags) == 1 && len == 0x10000 &&
         flags == 0,
     "second descriptor");
  is(wire_status_next(&st, &len, &flags), 0, "then none");
  for (size_t n = 0; n < 20; n++)
    if (n != 12)
      is(wire_decode_status_chunk(b, n, false, &st),
         (uint64_t)(int64_t)-EINVAL, "status chunk of %zu bytes refused", n);
  free(b);

  static const uint8_t xs[] = "\x00\x00\x00\x02" "\x00\x00\x00\x01"
                              "\x00\x00\x00\x01\x00\x00\x00\x00"
                              "\x00\x00\x00\x00\x00\x00\x00\x01";
  b = dup_exact(xs, 24);
  is(wire_decode_status_chunk(b, 24, true, &st), 0,
     "extended status chunk decodes");
  ok(wire_status_next(&st, &len, &flags) == 1 &&
         len == UINT64_C(0x100000000) && flags == 1,
     "its 64-bit length and flags");
  is(wire_status_next(&st, &len, &flags), 0, "then none");
  wire_put32(b + 4, 2);
  is(wire_decode_status_chunk(b, 24, true, &st), (uint64_t)(int64_t)-EINVAL,
     "a count that disagrees with the length refused");
  wire_put32(b + 4, 0);
  is(wire_decode_status_chunk(b, 8, true, &st), (uint64_t)(int64_t)-EINVAL,
     "an extended chunk with no descriptor refused");
  is(wire_decode_status_chunk(b, 23, true, &st), (uint64_t)(int64_t)-EINVAL,
     "an extended chunk with a partial descriptor refused");
  free(b);
}

static void
test_errno(void)
{
  static const struct {
    int host;
    uint32_t nbd;
  } pairs[] = {
    { 0, 0 },
    { EPERM, NBD_EPERM },
    { EIO, NBD_EIO },
    { ENOMEM, NBD_ENOMEM },
    { EINVAL, NBD_EINVAL },
    { ENOSPC, NBD_ENOSPC },
    { EOVERFLOW, NBD_EOVERFLOW },
    { ENOTSUP, NBD_ENOTSUP },
    { ESHUTDOWN, NBD_ESHUTDOWN },
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    is(wire_errno_to_nbd(pairs[i].host), pairs[i].nbd,
       "errno %d maps to NBD %u", pairs[i].host, pairs[i].nbd);
    is(wire_nbd_to_errno(pairs[i].nbd), pairs[i].host,
       "NBD %u maps back to errno %d", pairs[i].nbd, pairs[i].host);
  }
  /* Spec values are fixed numbers, whatever the host's errno values. */
  is(NBD_EPERM, 1, "NBD_EPERM is 1");
  is(NBD_EIO, 5, "NBD_EIO is 5");
  is(NBD_ENOMEM, 12, "NBD_ENOMEM is 12");
  is(NBD_EINVAL, 22, "NBD_EINVAL is 22");
  is(NBD_ENOSPC, 28, "NBD_ENOSPC is 28");
  is(NBD_EOVERFLOW, 75, "NBD_EOVERFLOW is 75");
  is(NBD_ENOTSUP, 95, "NBD_ENOTSUP is 95");
  is(NBD_ESHUTDOWN, 108, "NBD_ESHUTDOWN is 108");

  is(wire_errno_to_nbd(EROFS), NBD_EPERM, "EROFS maps to NBD_EPERM");
  is(wire_errno_to_nbd(EDQUOT), NBD_ENOSPC, "EDQUOT maps to NBD_ENOSPC");
  is(wire_errno_to_nbd(EFBIG), NBD_ENOSPC, "EFBIG maps to NBD_ENOSPC");
  is(wire_errno_to_nbd(EBADF), NBD_EIO, "an unlisted errno maps to NBD_EIO");
  is(wire_errno_to_nbd(ECONNRESET), NBD_EIO, "ECONNRESET maps to NBD_EIO");
  /* A raw host errno that is not a spec value must never leak. */
  is(wire_errno_to_nbd(ENOENT), NBD_EIO, "ENOENT maps to NBD_EIO");
  is(wire_nbd_to_errno(2), EINVAL, "unknown NBD value 2 reads as EINVAL");
  is(wire_nbd_to_errno(0xffffffffu), EINVAL,
     "unknown NBD value 0xffffffff reads as EINVAL");
  is(wire_nbd_to_errno(NBD_EINVAL), EINVAL, "NBD_EINVAL is EINVAL");
}

static void
test_names(void)
{
  ok(strcmp(wire_opt_name(NBD_OPT_GO), "GO") == 0, "opt name GO");
  ok(strcmp(wire_opt_name(NBD_OPT_EXTENDED_HEADERS), "EXTENDED_HEADERS") == 0,
     "opt name EXTENDED_HEADERS");
  ok(wire_opt_name(0) != NULL && wire_opt_name(12) != NULL &&
       wire_opt_name(0xffffffffu) != NULL,
     "opt names for 0, 12 and 0xffffffff are non-NULL");
  ok(strcmp(wire_cmd_name(NBD_CMD_BLOCK_STATUS), "BLOCK_STATUS") == 0,
     "cmd name BLOCK_STATUS");
  ok(wire_cmd_name(9) != NULL && wire_cmd_name(0xffff) != NULL,
     "cmd names for 9 and 0xffff are non-NULL");
  ok(strcmp(wire_rep_name(NBD_REP_ERR_TOO_BIG), "ERR_TOO_BIG") == 0,
     "rep name ERR_TOO_BIG");
  ok(strcmp(wire_rep_name(NBD_REP_ACK), "ACK") == 0, "rep name ACK");
  ok(wire_rep_name(0x80000077u) != NULL && wire_rep_name(77) != NULL,
     "rep names for unknown values are non-NULL");
}

int
main(void)
{
  test_endian();
  test_greeting();
  test_opt();
  test_opt_reply();
  test_info_req();
  test_meta_req();
  test_request();
  test_replies();
  test_error_chunk();
  test_info_item();
  test_rep_payloads();
  test_data_chunks();
  test_errno();
  test_names();
  return tap_done();
}
