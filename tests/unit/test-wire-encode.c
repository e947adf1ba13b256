/* test-wire-encode.c: the encoders of whole reply chunks, block status
 * payloads and handshake payloads in src/proto/wire.c, and the small
 * decoders that go with them.
 *
 * As in test-wire.c, every expected byte string is written out by hand
 * from the layouts of the protocol spec, never produced by the code under
 * test. Each output buffer is filled with 0xee first, so that a byte
 * written past the layout shows. */
#include <errno.h>
#include <string.h>

#include "proto/wire.h"
#include "tap.h"

#define FILL 0xee

/* §NBD_REPLY_TYPE_NONE: a chunk header alone, DONE set, length 0. */
static void
test_none_chunk(void)
{
  uint8_t out[NBD_EXTENDED_REPLY_LEN + 4];
  static const uint8_t want_sr[NBD_STRUCTURED_REPLY_LEN]
      = "\x66\x8e\x33\xef"
        "\x00\x01"
        "\x00\x00"
        "\x00\x00\x00\x00\x00\x00\x00\x09"
        "\x00\x00\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_none_chunk(out, false, 9, 0x2000), 20,
     "NONE chunk, structured: 20 bytes");
  is_bytes(out, want_sr, 20, "NONE chunk, structured: bytes");
  is(out[20], FILL, "NONE chunk, structured: nothing past it");

  static const uint8_t want_ext[NBD_EXTENDED_REPLY_LEN]
      = "\x6e\x8a\x27\x8c"
        "\x00\x01"
        "\x00\x00"
        "\x00\x00\x00\x00\x00\x00\x00\x09"
        "\x00\x00\x00\x00\x00\x00\x20\x00"
        "\x00\x00\x00\x00\x00\x00\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_none_chunk(out, true, 9, 0x2000), 32,
     "NONE chunk, extended: 32 bytes");
  is_bytes(out, want_ext, 32, "NONE chunk, extended: bytes echo the offset");
  is(out[32], FILL, "NONE chunk, extended: nothing past it");
}

/* §NBD_REPLY_TYPE_OFFSET_DATA: header of length 8 + data, then u64 offset;
 * the data itself is not the encoder's. */
static void
test_data_chunk(void)
{
  uint8_t out[WIRE_DATA_CHUNK_HDR_MAX + 4];
  static const uint8_t want_sr[NBD_STRUCTURED_REPLY_LEN + 8]
      = "\x66\x8e\x33\xef"
        "\x00\x00"
        "\x00\x01"
        "\x01\x02\x03\x04\x05\x06\x07\x08"
        "\x00\x00\x10\x08"
        "\x00\x00\x00\x00\x00\x10\x02\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_data_chunk(out, false, 0, UINT64_C(0x0102030405060708),
                            0x100000, 0x100200, 0x1000),
     28, "OFFSET_DATA, structured: 28 header bytes");
  is_bytes(out, want_sr, 28, "OFFSET_DATA, structured: bytes");
  is(out[28], FILL, "OFFSET_DATA, structured: the data is not written");

  /* A data length over 32 bits fits only the extended header. */
  static const uint8_t want_ext[NBD_EXTENDED_REPLY_LEN + 8]
      = "\x6e\x8a\x27\x8c"
        "\x00\x01"
        "\x00\x01"
        "\x00\x00\x00\x00\x00\x00\x00\x2a"
        "\x00\x00\x00\x00\x00\x10\x00\x00"
        "\x00\x00\x00\x01\x00\x00\x00\x08"
        "\x00\x00\x00\x00\x00\x10\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_data_chunk(out, true, NBD_REPLY_FLAG_DONE, 42, 0x100000,
                            0x100000, UINT64_C(0x100000000)),
     WIRE_DATA_CHUNK_HDR_MAX, "OFFSET_DATA, extended: 40 header bytes");
  is_bytes(out, want_ext, 40, "OFFSET_DATA, extended: 64-bit length");
  is(out[40], FILL, "OFFSET_DATA, extended: the data is not written");
  is(wire_decode_data_offset(out + 32), 0x100000,
     "the offset that opens the payload decodes");
}

/* §NBD_REPLY_TYPE_OFFSET_HOLE: header of length 12, u64 offset, u32 size. */
static void
test_hole_chunk(void)
{
  uint8_t out[WIRE_HOLE_CHUNK_MAX + 4];
  static const uint8_t want_sr[NBD_STRUCTURED_REPLY_LEN + 12]
      = "\x66\x8e\x33\xef"
        "\x00\x00"
        "\x00\x02"
        "\x00\x00\x00\x00\x00\x00\x00\x05"
        "\x00\x00\x00\x0c"
        "\x00\x00\x00\x00\x00\x00\x30\x00"
        "\x00\x01\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_hole_chunk(out, false, 0, 5, 0x2000, 0x3000, 0x10000), 32,
     "OFFSET_HOLE, structured: 32 bytes");
  is_bytes(out, want_sr, 32, "OFFSET_HOLE, structured: bytes");
  is(out[32], FILL, "OFFSET_HOLE, structured: nothing past it");
  uint64_t off;
  uint32_t len;
  is(wire_decode_hole_chunk(out + 20, 12, &off, &len), 0,
     "its payload decodes");
  ok(off == 0x3000 && len == 0x10000, "to the same offset and size");

  static const uint8_t want_ext[NBD_EXTENDED_REPLY_LEN + 12]
      = "\x6e\x8a\x27\x8c"
        "\x00\x01"
        "\x00\x02"
        "\x00\x00\x00\x00\x00\x00\x00\x05"
        "\x00\x00\x00\x00\x00\x00\x20\x00"
        "\x00\x00\x00\x00\x00\x00\x00\x0c"
        "\x00\x00\x00\x00\x00\x00\x30\x00"
        "\xff\xff\xff\xff";
  memset(out, FILL, sizeof out);
  is(wire_encode_hole_chunk(out, true, NBD_REPLY_FLAG_DONE, 5, 0x2000, 0x3000,
                            UINT32_MAX),
     WIRE_HOLE_CHUNK_MAX, "OFFSET_HOLE, extended: 44 bytes");
  is_bytes(out, want_ext, 44, "OFFSET_HOLE, extended: bytes");
  is(out[44], FILL, "OFFSET_HOLE, extended: nothing past it");
}

/* §NBD_REPLY_TYPE_ERROR: header of length 6 + message, u32 error, u16
 * message length, message. */
static void
test_error_chunk(void)
{
  uint8_t out[NBD_EXTENDED_REPLY_LEN + 6 + 16];
  static const uint8_t want_sr[NBD_STRUCTURED_REPLY_LEN + 6 + 11]
      = "\x66\x8e\x33\xef"
        "\x00\x01"
        "\x80\x01"
        "\x00\x00\x00\x00\x00\x00\x00\x07"
        "\x00\x00\x00\x11"
        "\x00\x00\x00\x05"
        "\x00\x0b"
        "read failed";
  memset(out, FILL, sizeof out);
  is(wire_encode_error_chunk(out, false, NBD_REPLY_FLAG_DONE, 7, 512, NBD_EIO,
                             "read failed", 11),
     37, "ERROR, structured: 37 bytes");
  is_bytes(out, want_sr, 37, "ERROR, structured: bytes");
  is(out[37], FILL, "ERROR, structured: nothing past the message");
  struct wire_error_chunk e;
  is(wire_decode_error_chunk(out + 20, 17, false, &e), 0,
     "its payload decodes");
  ok(e.error == NBD_EIO && e.msg_len == 11
         && memcmp(e.msg, "read failed", 11) == 0,
     "to the same error and message");

  static const uint8_t want_ext[NBD_EXTENDED_REPLY_LEN + 6]
      = "\x6e\x8a\x27\x8c"
        "\x00\x01"
        "\x80\x01"
        "\x00\x00\x00\x00\x00\x00\x00\x07"
        "\x00\x00\x00\x00\x00\x00\x02\x00"
        "\x00\x00\x00\x00\x00\x00\x00\x06"
        "\x00\x00\x00\x16"
        "\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_error_chunk(out, true, NBD_REPLY_FLAG_DONE, 7, 512, NBD_EINVAL,
                             "", 0),
     38, "ERROR, extended, no message: 38 bytes");
  is_bytes(out, want_ext, 38, "ERROR, extended, no message: bytes");
  is(out[38], FILL, "ERROR, extended: nothing past it");
}

/* An error chunk of a type the client does not know: error and message
 * are read, the rest is left, and a message past the end is refused. */
static void
test_error_chunk_unknown(void)
{
  struct wire_error_chunk e;
  static const uint8_t p[] = "\x00\x00\x00\x1c"
                             "\x00\x02"
                             "no"
                             "\x01\x02";
  is(wire_decode_error_chunk_unknown(p, 10, &e), 0,
     "unknown error type with trailing fields decodes");
  ok(e.error == NBD_ENOSPC && e.msg_len == 2 && e.msg == p + 6 && e.offset == 0,
     "error, message, no offset");
  is(wire_decode_error_chunk_unknown(p, 8, &e), 0, "exact fit decodes");
  is(wire_decode_error_chunk_unknown(p, 7, &e), (uint64_t)(int64_t)-EINVAL,
     "message one past the end refused");
  for (size_t len = 0; len < 6; len++)
    is(wire_decode_error_chunk_unknown(p, len, &e), (uint64_t)(int64_t)-EINVAL,
       "%zu bytes refused", len);
}

/* §NBD_REPLY_TYPE_BLOCK_STATUS: u32 context ID, then (u32 length, u32
 * flags) descriptors; BLOCK_STATUS_EXT (extended headers): u32 context
 * ID, u32 count, then (u64 length, u64 flags). */
static void
test_status(void)
{
  uint8_t out[8 + 2 * 16 + 4];
  static const uint8_t want_c[4 + 2 * 8] = "\x00\x00\x00\x01"
                                           "\x00\x01\x00\x00"
                                           "\x00\x00\x00\x00"
                                           "\x00\x00\x02\x00"
                                           "\x00\x00\x00\x03";
  memset(out, FILL, sizeof out);
  size_t n = wire_encode_status_head(out, false, 1, 2);
  is(n, 4, "compact head: context ID only");
  n += wire_encode_status_desc(out + n, false, 0x10000, 0);
  is(n, wire_status_len(false, 1), "compact descriptor: 8 bytes");
  n += wire_encode_status_desc(out + n, false, 0x200,
                               NBD_STATE_HOLE | NBD_STATE_ZERO);
  is(n, 20, "compact payload of two: 20 bytes");
  is_bytes(out, want_c, 20, "compact status bytes");
  is(out[20], FILL, "compact: nothing past it");

  struct wire_status_chunk st;
  uint64_t len;
  uint32_t flags;
  is(wire_decode_status_chunk(out, n, false, &st), 0, "compact decodes");
  ok(st.context_id == 1 && st.count == 2, "context 1, two descriptors");
  ok(wire_status_next(&st, &len, &flags) && len == 0x10000 && flags == 0,
     "first descriptor");
  ok(wire_status_next(&st, &len, &flags) && len == 0x200 && flags == 3,
     "second descriptor");

  static const uint8_t want_e[8 + 2 * 16] = "\x00\x00\x00\x01"
                                            "\x00\x00\x00\x02"
                                            "\x00\x00\x00\x01\x00\x00\x00\x00"
                                            "\x00\x00\x00\x00\x00\x00\x00\x02"
                                            "\x00\x00\x00\x00\x00\x00\x10\x00"
                                            "\x00\x00\x00\x00\x00\x00\x00\x00";
  memset(out, FILL, sizeof out);
  n = wire_encode_status_head(out, true, 1, 2);
  is(n, 8, "extended head: context ID and count");
  n += wire_encode_status_desc(out + n, true, UINT64_C(0x100000000),
                               NBD_STATE_ZERO);
  is(n, wire_status_len(true, 1), "extended descriptor: 16 bytes");
  n += wire_encode_status_desc(out + n, true, 0x1000, 0);
  is(n, 40, "extended payload of two: 40 bytes");
  is_bytes(out, want_e, 40, "extended status bytes (64-bit length)");
  is(out[40], FILL, "extended: nothing past it");
  is(wire_decode_status_chunk(out, n, true, &st), 0, "extended decodes");
  ok(wire_status_next(&st, &len, &flags) && len == UINT64_C(0x100000000)
         && flags == NBD_STATE_ZERO,
     "first extended descriptor");
}

/* §Newstyle negotiation, §Oldstyle negotiation, §NBD_OPT_EXPORT_NAME. */
static void
test_handshake(void)
{
  static const uint8_t newstyle[16] = "NBDMAGIC"
                                      "IHAVEOPT";
  static const uint8_t oldstyle[16] = "NBDMAGIC"
                                      "\x00\x00\x42\x02\x81\x86\x12\x53";
  static const uint8_t other[16] = "NBDMAGIC"
                                   "IHAVEOPU";
  static const uint8_t http[16] = "HTTP/1.1 400 Bad";
  is(wire_decode_greeting(newstyle), WIRE_GREETING_NEWSTYLE, "newstyle");
  is(wire_decode_greeting(oldstyle), WIRE_GREETING_OLDSTYLE, "oldstyle");
  is(wire_decode_greeting(other), WIRE_GREETING_UNKNOWN,
     "another second magic");
  is(wire_decode_greeting(http), WIRE_GREETING_UNKNOWN, "not NBDMAGIC");
  ok(wire_greeting_prefix_ok((const uint8_t *)"NBDMAGIC", 8),
     "NBDMAGIC is the prefix");
  ok(wire_greeting_prefix_ok((const uint8_t *)"NBD", 3), "a part of it is too");
  ok(!wire_greeting_prefix_ok(http, 1), "'H' is not");
  ok(!wire_greeting_prefix_ok((const uint8_t *)"NBDMAGIX", 8),
     "a wrong eighth byte is not");

  uint8_t b[4];
  is(wire_decode_hflags((const uint8_t *)"\x00\x03"), 3, "handshake flags");
  wire_encode_cflags(b, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
  is_bytes(b, "\x00\x00\x00\x03", 4, "client flags bytes");
  is(wire_decode_cflags(b), 3, "client flags decode");

  uint8_t r[NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN + 1];
  static const uint8_t want_r[NBD_EXPORT_NAME_REPLY_LEN]
      = "\x00\x00\x00\x01\x00\x00\x00\x00"
        "\x01\x03";
  memset(r, FILL, sizeof r);
  is(wire_encode_export_name_reply(r, UINT64_C(0x100000000), 0x103, false), 10,
     "EXPORT_NAME reply with NO_ZEROES: 10 bytes");
  is_bytes(r, want_r, 10, "EXPORT_NAME reply bytes");
  is(r[10], FILL, "no zeroes written");
  memset(r, FILL, sizeof r);
  is(wire_encode_export_name_reply(r, UINT64_C(0x100000000), 0x103, true), 134,
     "EXPORT_NAME reply with zeroes: 134 bytes");
  bool zero = true;
  for (size_t i = 10; i < 134; i++)
    zero &= r[i] == 0;
  ok(zero, "124 zeroes after the flags");
  is(r[134], FILL, "nothing past them");
  uint64_t size;
  uint16_t tflags;
  wire_decode_export_name_reply(r, &size, &tflags);
  ok(size == UINT64_C(0x100000000) && tflags == 0x103,
     "EXPORT_NAME reply decodes");

  /* Oldstyle: u64 size, u32 flags (the low 16 are transmission flags). */
  static const uint8_t old[12] = "\x00\x00\x00\x00\x00\x10\x00\x00"
                                 "\x00\x00\x00\x03";
  wire_decode_oldstyle(old, &size, &tflags);
  ok(size == 0x100000 && tflags == 3, "oldstyle export data decodes");
}

/* §NBD_REP_INFO, §NBD_REP_SERVER, §NBD_REP_META_CONTEXT payloads. */
static void
test_rep_payloads(void)
{
  uint8_t out[32];
  static const uint8_t want_exp[12] = "\x00\x00"
                                      "\x00\x00\x00\x00\x40\x00\x00\x00"
                                      "\x00\x0d";
  memset(out, FILL, sizeof out);
  is(wire_encode_info_export(out, 1u << 30, 0x0d), 12, "INFO_EXPORT: 12 bytes");
  is_bytes(out, want_exp, 12, "INFO_EXPORT bytes");
  is(out[12], FILL, "INFO_EXPORT: nothing past it");
  struct wire_info_item it;
  is(wire_decode_info_item(out, 12, &it), 0, "INFO_EXPORT decodes");
  ok(it.size == 1u << 30 && it.tflags == 0x0d, "to the same size, flags");

  static const uint8_t want_bs[14] = "\x00\x03"
                                     "\x00\x00\x00\x01"
                                     "\x00\x00\x10\x00"
                                     "\x02\x00\x00\x00";
  memset(out, FILL, sizeof out);
  is(wire_encode_info_block_size(out, 1, 4096, 32u << 20), 14,
     "INFO_BLOCK_SIZE: 14 bytes");
  is_bytes(out, want_bs, 14, "INFO_BLOCK_SIZE bytes");
  is(out[14], FILL, "INFO_BLOCK_SIZE: nothing past it");

  memset(out, FILL, sizeof out);
  is(wire_encode_info_text(out, NBD_INFO_NAME, "disk", 4), 6,
     "INFO_NAME: 6 bytes");
  is_bytes(out,
           "\x00\x01"
           "disk",
           6, "INFO_NAME bytes");
  is(out[6], FILL, "INFO_NAME: nothing past it");
  memset(out, FILL, sizeof out);
  is(wire_encode_info_text(out, NBD_INFO_DESCRIPTION, "", 0), 2,
     "empty INFO_DESCRIPTION: the type alone");
  is_bytes(out, "\x00\x02", 2, "empty INFO_DESCRIPTION bytes");

  memset(out, FILL, sizeof out);
  is(wire_encode_rep_server(out, "a", 1, "bc", 2), 7, "REP_SERVER: 7 bytes");
  is_bytes(out,
           "\x00\x00\x00\x01"
           "a"
           "bc",
           7, "REP_SERVER bytes");
  is(out[7], FILL, "REP_SERVER: nothing past it");
  memset(out, FILL, sizeof out);
  is(wire_encode_rep_server(out, "a", 1, NULL, 0), 5,
     "REP_SERVER without a description: 5 bytes");
  is(out[5], FILL, "no description written");

  memset(out, FILL, sizeof out);
  is(wire_encode_rep_meta(out, 1, "base:allocation", 15), 19,
     "REP_META_CONTEXT: 19 bytes");
  is_bytes(out,
           "\x00\x00\x00\x01"
           "base:allocation",
           19, "REP_META_CONTEXT bytes");
  is(out[19], FILL, "REP_META_CONTEXT: nothing past it");
}

int
main(void)
{
  test_none_chunk();
  test_data_chunk();
  test_hole_chunk();
  test_error_chunk();
  test_error_chunk_unknown();
  test_status();
  test_handshake();
  test_rep_payloads();
  return tap_done();
}
