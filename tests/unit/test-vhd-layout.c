/* test-vhd-layout.c: unit tests for src/format/vhd_layout.{h,c}.
 *
 * The footers and the header below are bytes written by qemu-img 7.2
 * (`qemu-img create -f vpc -o subformat=dynamic x.vhd 100M`, and
 * `-o subformat=fixed,force_size=on`), so the decoder is checked against
 * a real writer and not only against our own encoder; the geometries are
 * those qemu-img wrote for each size. Inputs of the decoders of variable
 * length are heap allocated to their exact size so that AddressSanitizer
 * sees any read past them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/vhd_layout.h"
#include "proto/wire.h"
#include "tap.h"

#define EINVAL_RC ((uint64_t)(int64_t)-EINVAL)

/* The nonzero head of qemu-img's 100M dynamic footer; the other bytes up
 * to 512 are zero. */
static const uint8_t qemu_dyn_footer[96] = {
  0x63, 0x6f, 0x6e, 0x65, 0x63, 0x74, 0x69, 0x78, 0x00, 0x00, 0x00, 0x02,
  0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
  0x32, 0xa5, 0xb8, 0xe3, 0x71, 0x65, 0x6d, 0x75, 0x00, 0x05, 0x00, 0x03,
  0x57, 0x69, 0x32, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x06, 0x40, 0x20, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x06, 0x40, 0x20, 0x00, 0x03, 0xec, 0x0c, 0x11,
  0x00, 0x00, 0x00, 0x03, 0xff, 0xff, 0xee, 0x42, 0x81, 0x0b, 0x75, 0x13,
  0xaa, 0xd4, 0x4c, 0x85, 0x89, 0xfa, 0x23, 0x0a, 0x5b, 0x4c, 0x80, 0xb7,
};

/* The nonzero head of its dynamic header (at offset 512). */
static const uint8_t qemu_dyn_header[48] = {
  0x63, 0x78, 0x73, 0x70, 0x61, 0x72, 0x73, 0x65, 0xff, 0xff, 0xff, 0xff,
  0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00,
  0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x33, 0x00, 0x20, 0x00, 0x00,
  0xff, 0xff, 0xf4, 0x44, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* The nonzero head of the 100M fixed footer (force_size: creator "qem2",
 * maximal geometry, current_size exactly 100 MiB). */
static const uint8_t qemu_fixed_footer[96] = {
  0x63, 0x6f, 0x6e, 0x65, 0x63, 0x74, 0x69, 0x78, 0x00, 0x00, 0x00, 0x02,
  0x00, 0x01, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
  0x32, 0xa5, 0xb8, 0xe3, 0x71, 0x65, 0x6d, 0x32, 0x00, 0x05, 0x00, 0x03,
  0x57, 0x69, 0x32, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x06, 0x40, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x06, 0x40, 0x00, 0x00, 0xff, 0xff, 0x10, 0xff,
  0x00, 0x00, 0x00, 0x02, 0xff, 0xff, 0xe2, 0xa2, 0xed, 0xfd, 0x81, 0x70,
  0xe2, 0x50, 0x4e, 0xed, 0xb4, 0x53, 0x38, 0xb2, 0xde, 0x52, 0x09, 0xac,
};

static void
expand(uint8_t *out, size_t len, const uint8_t *head, size_t headlen)
{
  memset(out, 0, len);
  memcpy(out, head, headlen);
}

/* Copies n bytes into a fresh allocation of exactly n bytes (at least 1).
 * Caller frees. */
static uint8_t *
dup_exact(const void *p, size_t n)
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
test_checksum(void)
{
  /* Bytes 1..16: the sum is 136; without bytes 5..8 (the "checksum" at
   * offset 4) it is 136 - 26 = 110 = 0x6e, so ~0x6e. */
  uint8_t b[16];
  for (int i = 0; i < 16; i++)
    b[i] = (uint8_t)(i + 1);
  is(vhd_checksum(b, 16, 4), 0xffffff91u, "checksum of 1..16 skipping 4..7");
  is(vhd_checksum(b, 16, 100), ~(uint32_t)136, "field outside: all counted");
  is(vhd_checksum(b, 16, 14), ~(uint32_t)(136 - 15 - 16),
     "field cut by the end: the part inside skipped");
  is(vhd_checksum(b, 0, 0), 0xffffffffu, "nothing sums to 0");
  uint8_t ff[1024];
  memset(ff, 0xff, sizeof ff);
  is(vhd_checksum(ff, sizeof ff, 36), ~(uint32_t)(1020 * 255),
     "1020 bytes of 0xff");

  uint8_t f[VHD_FOOTER_LEN];
  expand(f, sizeof f, qemu_dyn_footer, sizeof qemu_dyn_footer);
  is(vhd_checksum(f, sizeof f, 64), 0xffffee42u, "qemu-img's footer checksum");
  uint8_t h[VHD_HEADER_LEN];
  expand(h, sizeof h, qemu_dyn_header, sizeof qemu_dyn_header);
  is(vhd_checksum(h, sizeof h, 36), 0xfffff444u, "qemu-img's header checksum");
}

static void
test_footer_qemu(void)
{
  uint8_t b[VHD_FOOTER_LEN], out[VHD_FOOTER_LEN];
  struct vhd_footer f;
  char err[256], uuid[37];

  expand(b, sizeof b, qemu_dyn_footer, sizeof qemu_dyn_footer);
  is(vhd_footer_decode(b, sizeof b, &f, err, sizeof err), 0,
     "qemu-img's dynamic footer decodes");
  is(f.features, 2, "features: the reserved bit");
  is(f.version, 0x00010000, "version 1.0");
  is(f.data_offset, 512, "header at 512");
  is(f.timestamp, 0x32a5b8e3, "timestamp");
  ok(strcmp(f.creator_app, "qemu") == 0, "creator app \"qemu\"");
  is(f.creator_version, 0x00050003, "creator version");
  is(f.creator_os, 0x5769326b, "creator OS Wi2k");
  is(f.original_size, 104865792, "original size");
  is(f.current_size, 104865792, "current size");
  is(f.cylinders, 1004, "cylinders");
  is(f.heads, 12, "heads");
  is(f.sectors, 17, "sectors");
  is(f.disk_type, VHD_TYPE_DYNAMIC, "dynamic");
  is(f.checksum, 0xffffee42u, "stored checksum");
  ok(f.checksum_ok, "checksum agrees");
  is(f.saved_state, 0, "not saved");
  vhd_uuid_str(f.uuid, uuid);
  ok(strcmp(uuid, "810b7513-aad4-4c85-89fa-230a5b4c80b7") == 0,
     "uuid as text: %s", uuid);
  is(vhd_virtual_size(&f), 104865792, "size from the geometry");
  memset(out, 0xaa, sizeof out);
  vhd_footer_encode(&f, out);
  is_bytes(out, b, sizeof b, "re-encoded footer is qemu-img's bytes");

  /* The pre-2004 511-byte footer: the same without the last byte. */
  uint8_t *old = dup_exact(b, VHD_OLD_FOOTER_LEN);
  struct vhd_footer f2;
  is(vhd_footer_decode(old, VHD_OLD_FOOTER_LEN, &f2, err, sizeof err), 0,
     "511-byte footer decodes");
  ok(f2.checksum_ok && f2.current_size == f.current_size &&
         f2.disk_type == f.disk_type && memcmp(f2.uuid, f.uuid, 16) == 0,
     "511-byte footer: same fields, checksum agrees");
  free(old);

  expand(b, sizeof b, qemu_fixed_footer, sizeof qemu_fixed_footer);
  is(vhd_footer_decode(b, sizeof b, &f, err, sizeof err), 0,
     "qemu-img's fixed footer decodes");
  is(f.disk_type, VHD_TYPE_FIXED, "fixed");
  is(f.data_offset, UINT64_MAX, "no header: data offset all ones");
  ok(strcmp(f.creator_app, "qem2") == 0, "creator app \"qem2\"");
  ok(f.cylinders == 65535 && f.heads == 16 && f.sectors == 255,
     "force_size: maximal geometry");
  ok(f.checksum_ok, "checksum agrees");
  is(vhd_virtual_size(&f), 100u << 20, "size from current_size: 100 MiB");
  vhd_footer_encode(&f, out);
  is_bytes(out, b, sizeof b, "re-encoded fixed footer is qemu-img's bytes");
}

static void
test_header_qemu(void)
{
  uint8_t b[VHD_HEADER_LEN], out[VHD_HEADER_LEN];
  struct vhd_header h;
  char err[256];

  expand(b, sizeof b, qemu_dyn_header, sizeof qemu_dyn_header);
  is(vhd_header_decode(b, &h, err, sizeof err), 0,
     "qemu-img's dynamic header decodes");
  is(h.data_offset, UINT64_MAX, "data offset all ones");
  is(h.table_offset, 1536, "BAT at 1536");
  is(h.version, 0x00010000, "version 1.0");
  is(h.max_entries, 51, "51 entries");
  is(h.block_size, 2u << 20, "2 MiB blocks");
  is(h.checksum, 0xfffff444u, "stored checksum");
  ok(h.checksum_ok, "checksum agrees");
  ok(h.parent_name[0] == '\0', "no parent name");
  is(h.loc[0].code, VHD_LOC_NONE, "no locator");
  vhd_header_encode(&h, out);
  is_bytes(out, b, sizeof b, "re-encoded header is qemu-img's bytes");
  is(vhd_bitmap_len(h.block_size), 512, "2 MiB blocks: 512-byte bitmaps");
  is(vhd_bat_len(h.max_entries), 512, "51 entries: one sector of BAT");

  /* The whole qemu-img file is 2560 bytes: footer copy, header, BAT,
   * footer. */
  struct vhd_footer f;
  uint8_t fb[VHD_FOOTER_LEN];
  expand(fb, sizeof fb, qemu_dyn_footer, sizeof qemu_dyn_footer);
  is(vhd_footer_decode(fb, sizeof fb, &f, err, sizeof err), 0,
     "footer decodes");
  is(vhd_check_layout(&f, &h, 2560, err, sizeof err), 0,
     "qemu-img's layout fits its 2560-byte file");
}

static void
sample_footer(struct vhd_footer *f, uint64_t size, uint32_t type)
{
  memset(f, 0, sizeof *f);
  f->features = 2;
  f->version = 0x00010000;
  f->data_offset = type == VHD_TYPE_FIXED ? UINT64_MAX : 512;
  f->timestamp = 0x2f3a1b00;
  memcpy(f->creator_app, "tap", 4);
  f->creator_version = 0x00010003;
  f->creator_os = 0;
  f->original_size = size;
  f->current_size = size;
  vhd_geometry(size, &f->cylinders, &f->heads, &f->sectors);
  f->disk_type = type;
  for (int i = 0; i < 16; i++)
    f->uuid[i] = (uint8_t)(0x10 * i + i);
}

static void
sample_header(struct vhd_header *h, uint32_t entries, uint32_t block)
{
  memset(h, 0, sizeof *h);
  h->data_offset = UINT64_MAX;
  h->table_offset = 1536;
  h->version = 0x00010000;
  h->max_entries = entries;
  h->block_size = block;
}

/* Field by field, so that the struct's padding stays as memset left it
 * and the structs compare with memcmp. */
static void
set_loc(struct vhd_locator *l, uint32_t code, uint32_t space, uint32_t length,
        uint64_t offset)
{
  l->code = code;
  l->space = space;
  l->length = length;
  l->offset = offset;
}

static void
test_round_trip(void)
{
  struct vhd_footer f, f2;
  struct vhd_header h, h2;
  uint8_t b[VHD_HEADER_LEN];
  char err[256];

  sample_footer(&f, 10u << 30, VHD_TYPE_DIFF);
  f.saved_state = 1;
  vhd_footer_encode(&f, b);
  is_bytes(b, "conectix", 8, "footer cookie");
  is(wire_get32(b + 64), vhd_checksum(b, 512, 64), "footer checksum written");
  is(vhd_footer_decode(b, 512, &f2, err, sizeof err), 0, "footer decodes");
  f.checksum = f2.checksum;
  f.checksum_ok = true;
  ok(memcmp(&f, &f2, sizeof f) == 0, "footer round trip");
  is(b[84], 1, "saved state at 84");
  is(wire_get64(b + 48), 10u << 30, "current size at 48");

  sample_header(&h, 5120, 2u << 20);
  /* A name with 2-, 3- and 4-byte UTF-8 characters. */
  strcpy(h.parent_name, "base \xc3\xbc \xe2\x82\xac \xf0\x9d\x84\x9e.vhd");
  memcpy(h.parent_uuid, "0123456789abcdef", 16);
  h.parent_timestamp = 0x12345678;
  set_loc(&h.loc[0], VHD_LOC_W2KU, 1, 100, 0x2000);
  set_loc(&h.loc[1], VHD_LOC_W2RU, 512, 30, 0x2200);
  set_loc(&h.loc[7], VHD_LOC_MACX, 1, 22, 0x2400);
  vhd_header_encode(&h, b);
  is_bytes(b, "cxsparse", 8, "header cookie");
  is(wire_get32(b + 36), vhd_checksum(b, 1024, 36), "header checksum");
  static const uint8_t name16[] = { 0, 'b', 0,    'a',  0,    's', 0,    'e',
                                    0, ' ', 0,    0xfc, 0,    ' ', 0x20, 0xac,
                                    0, ' ', 0xd8, 0x34, 0xdd, 0x1e };
  is_bytes(b + 64, name16, sizeof name16,
           "parent name as UTF-16BE, surrogate pair included");
  is(wire_get32(b + 576), VHD_LOC_W2KU, "locator 0 code at 576");
  is(wire_get64(b + 576 + 16), 0x2000, "locator 0 offset at 592");
  is(wire_get32(b + 576 + 7 * 24), VHD_LOC_MACX, "locator 7 code");
  is(wire_get32(b + 576 + 7 * 24 + 8), 22, "locator 7 length");
  is(vhd_header_decode(b, &h2, err, sizeof err), 0, "header decodes");
  h.checksum = h2.checksum;
  h.checksum_ok = true;
  ok(strcmp(h.parent_name, h2.parent_name) == 0, "parent name round trip");
  ok(memcmp(&h, &h2, sizeof h) == 0, "header round trip");

  /* A name that is not UTF-16BE: the header still decodes. */
  wire_put16(b + 64, 0xdc00);
  wire_put32(b + 36, vhd_checksum(b, 1024, 36));
  is(vhd_header_decode(b, &h2, err, sizeof err), 0,
     "header with an unpaired surrogate in the name decodes");
  ok(h2.parent_name[0] == '\0' && h2.checksum_ok, "its name is empty");

  /* 256 units with no terminating NUL: a full name field. */
  memset(h.parent_name, 'x', 300);
  h.parent_name[300] = '\0';
  vhd_header_encode(&h, b);
  is(vhd_header_decode(b, &h2, err, sizeof err), 0, "full-name header");
  is(strlen(h2.parent_name), 256, "a name is at most 256 units");

  /* A surrogate pair that would be cut by the field's end is dropped. */
  memset(h.parent_name, 'x', 255);
  strcpy(h.parent_name + 255, "\xf0\x9d\x84\x9e");
  vhd_header_encode(&h, b);
  is(wire_get16(b + 64 + 2 * 255), 0, "no half of a pair in the last unit");
  is(vhd_header_decode(b, &h2, err, sizeof err), 0, "and it decodes");
  is(strlen(h2.parent_name), 255, "to the 255 units before it");

  /* Bytes that are not UTF-8 are written as U+FFFD. */
  strcpy(h.parent_name, "a\xff\x62"); /* 0x62: 'b' */
  vhd_header_encode(&h, b);
  static const uint8_t fffd[] = { 0, 'a', 0xff, 0xfd, 0, 'b', 0, 0 };
  is_bytes(b + 64, fffd, sizeof fffd, "a stray byte becomes U+FFFD");
}

static void
test_bad(void)
{
  uint8_t b[VHD_HEADER_LEN];
  struct vhd_footer f;
  struct vhd_header h;
  char err[256];

  expand(b, VHD_FOOTER_LEN, qemu_dyn_footer, sizeof qemu_dyn_footer);
  for (size_t len = 509; len <= 514; len++) {
    if (len == 511 || len == 512)
      continue;
    is(vhd_footer_decode(b, len, &f, err, sizeof err), EINVAL_RC,
       "footer of %zu bytes refused", len);
  }
  b[0] = 'C';
  is(vhd_footer_decode(b, 512, &f, err, sizeof err), EINVAL_RC,
     "footer cookie \"Conectix\" refused");
  ok(strstr(err, "Conectix") != NULL, "message quotes it: %s", err);
  b[0] = 'c';
  b[70] ^= 1;
  is(vhd_footer_decode(b, 512, &f, err, sizeof err), 0,
     "footer with a bad checksum decodes");
  ok(!f.checksum_ok && f.checksum == 0xffffee42u,
     "checksum_ok false, stored checksum kept");
  b[70] ^= 1;
  for (uint32_t t = 0; t <= 6; t++) {
    if (t >= 2 && t <= 4)
      continue;
    wire_put32(b + 60, t);
    is(vhd_footer_decode(b, 512, &f, err, sizeof err), EINVAL_RC,
       "disk type %u refused", t);
  }
  ok(strstr(err, "type 6") != NULL, "message names the type: %s", err);
  wire_put32(b + 60, 3);
  wire_put32(b + 12, 0x00020000);
  is(vhd_footer_decode(b, 512, &f, err, sizeof err), EINVAL_RC,
     "footer version 2.0 refused");
  wire_put32(b + 12, 0x00010001);
  is(vhd_footer_decode(b, 512, &f, err, sizeof err), 0,
     "footer version 1.1 read");

  expand(b, VHD_HEADER_LEN, qemu_dyn_header, sizeof qemu_dyn_header);
  b[7] = 'E';
  is(vhd_header_decode(b, &h, err, sizeof err), EINVAL_RC,
     "header cookie \"cxsparsE\" refused");
  b[7] = 'e';
  b[100] = 1;
  is(vhd_header_decode(b, &h, err, sizeof err), 0,
     "header with a bad checksum decodes");
  ok(!h.checksum_ok, "checksum_ok false");
  static const uint32_t bad_blocks[] = { 0,        1,        256,
                                         511,      3000,     0x300000,
                                         1u << 29, 1u << 31, 0xffffffffu };
  for (size_t i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
    wire_put32(b + 32, bad_blocks[i]);
    is(vhd_header_decode(b, &h, err, sizeof err), EINVAL_RC,
       "block size %u refused", bad_blocks[i]);
  }
  ok(strstr(err, "4294967295") != NULL, "message names it: %s", err);
  static const uint32_t good_blocks[] = { 512, 4096, 2u << 20, 1u << 28 };
  for (size_t i = 0; i < sizeof good_blocks / sizeof good_blocks[0]; i++) {
    wire_put32(b + 32, good_blocks[i]);
    is(vhd_header_decode(b, &h, err, sizeof err), 0, "block size %u read",
       good_blocks[i]);
  }
  wire_put32(b + 28, 0);
  is(vhd_header_decode(b, &h, err, sizeof err), EINVAL_RC,
     "zero BAT entries refused");
  wire_put32(b + 28, 51);
  wire_put32(b + 24, 0x00000001);
  is(vhd_header_decode(b, &h, err, sizeof err), EINVAL_RC,
     "header version 0.1 refused");
  /* A NULL or empty err is allowed. */
  is(vhd_header_decode(b, &h, NULL, 0), EINVAL_RC, "no room for a message");
}

static void
test_geometry(void)
{
  /* current_size and geometry as qemu-img 7.2 wrote them for
   * "qemu-img create -f vpc <size>". */
  static const struct {
    const char *name;
    uint64_t size;
    uint16_t c;
    uint8_t h, s;
  } t[] = {
    { "1M", 0x107800, 31, 4, 17 },
    { "100M", 0x6402000, 1004, 12, 17 },
    { "127M", 0x7f00800, 1020, 15, 17 },
    { "200M", 0xc80c000, 826, 16, 31 },
    { "240M", 0xf002000, 991, 16, 31 },
    { "500M", 0x1f410000, 1016, 16, 63 },
    { "1G", 0x4003e000, 2081, 16, 63 },
    { "3G", 0xc003c000, 6242, 16, 63 },
    { "10G", 0x280074000, 20806, 16, 63 },
    { "40G", 0xa0015e000, 20561, 16, 255 },
    { "100G", 0x190006e000, 51401, 16, 255 },
    { "127G", 0x1fc0002000, 65279, 16, 255 },
    { "128G", 0x2000000000, 65535, 16, 255 },
    { "2040G", 0x1fe00000000, 65535, 16, 255 },
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    uint16_t c;
    uint8_t h, s;
    vhd_geometry(t[i].size, &c, &h, &s);
    ok(c == t[i].c && h == t[i].h && s == t[i].s,
       "geometry of qemu-img's %s: %u/%u/%u, want %u/%u/%u", t[i].name, c, h, s,
       t[i].c, t[i].h, t[i].s);
  }
  /* The spec's rounding down, for sizes qemu-img would round up. */
  uint16_t c;
  uint8_t h, s;
  vhd_geometry(100u << 20, &c, &h, &s);
  ok(c == 1003 && h == 12 && s == 17, "exactly 100 MiB: 1003/12/17");
  vhd_geometry(0, &c, &h, &s);
  ok(c == 0 && h == 4 && s == 17, "empty disk: 0/4/17");
  vhd_geometry(UINT64_MAX, &c, &h, &s);
  ok(c == 65535 && h == 16 && s == 255, "huge disk: the maximum");
}

static void
test_virtual_size(void)
{
  struct vhd_footer f;
  sample_footer(&f, 100u << 20, VHD_TYPE_DYNAMIC); /* 1003/12/17 */
  uint64_t chs = 1003ull * 12 * 17 * 512;
  static const struct {
    const char app[5];
    bool by_chs;
  } t[] = {
    { "vpc ", true },  { "qemu", true },  { "qem2", false }, { "tap", false },
    { "win ", false }, { "d2v ", false }, { "CTXS", false }, { "vpc", false },
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    memcpy(f.creator_app, t[i].app, 5);
    is(vhd_virtual_size(&f), t[i].by_chs ? chs : 100u << 20,
       "creator \"%s\": size from %s", t[i].app,
       t[i].by_chs ? "the geometry" : "current_size");
  }
  memcpy(f.creator_app, "vpc ", 5);
  f.cylinders = 65535;
  f.heads = 16;
  f.sectors = 255;
  f.current_size = 3ull << 40;
  is(vhd_virtual_size(&f), 3ull << 40,
     "\"vpc \" with the maximal geometry: current_size");
  f.sectors = 254;
  is(vhd_virtual_size(&f), 65535ull * 16 * 254 * 512,
     "\"vpc \" one sector short of it: the geometry");
}

static int
layout(const struct vhd_footer *f, const struct vhd_header *h,
       uint64_t file_size, const char *want, const char *what)
{
  char err[256] = "";
  int r = vhd_check_layout(f, h, file_size, err, sizeof err);
  if (want == NULL) {
    ok(r == 0, "%s: accepted%s%s", what, r ? ", but: " : "", err);
  } else {
    ok(r == -EINVAL && strstr(err, want) != NULL, "%s: refused (%s)", what,
       err);
  }
  return r;
}

static void
test_check_layout(void)
{
  struct vhd_footer f;
  struct vhd_header h;

  /* A 10 GiB dynamic disk as vhd-util lays it out: header at 512, 5120
   * entries (20 KiB of BAT) at 1536, footer at the end. */
  sample_footer(&f, 10ull << 30, VHD_TYPE_DYNAMIC);
  sample_header(&h, 5120, 2u << 20);
  uint64_t min = 1536 + 20480 + 511;
  layout(&f, &h, min, NULL, "10 GiB disk, BAT just before the old footer");
  layout(&f, &h, min - 1, "ends at 22016, inside the footer of the 22526",
         "BAT into the footer");
  layout(&f, &h, 9000,
         "BAT at offset 1536 of 5120 entries ends at 22016, "
         "past the end of the 9000-byte file",
         "BAT past the end");
  layout(&f, NULL, min, "needs its dynamic header", "no header");
  f.disk_type = VHD_TYPE_DIFF;
  layout(&f, &h, 1ull << 40, NULL, "differencing disk in a 1 TiB file");

  h.max_entries = 5119;
  layout(&f, &h, 1ull << 40,
         "maps 10735321088 bytes, less than the disk's "
         "10737418240",
         "one entry too few");
  h.max_entries = 0xffffffff;
  h.block_size = 1u << 28;
  layout(&f, &h, UINT64_MAX, "more than the format's",
         "4294967295 entries of 256 MiB in a 2^64-byte file");
  h.max_entries = 8160; /* exactly 2040 GiB of 256 MiB blocks */
  layout(&f, &h, UINT64_MAX, NULL, "8160 entries of 256 MiB");
  h.max_entries = 8161;
  layout(&f, &h, UINT64_MAX, "more than the format's", "8161 of them");
  sample_header(&h, 5120, 2u << 20);

  h.table_offset = UINT64_MAX - 100;
  layout(&f, &h, UINT64_MAX, "ends beyond 2^64", "BAT offset near 2^64");
  h.table_offset = 0;
  layout(&f, &h, 1ull << 40, "overlaps the footer copy at offset 0",
         "BAT at 0");
  h.table_offset = 1024;
  layout(&f, &h, 1ull << 40, "overlaps the dynamic header at offset 512",
         "BAT at 1024, inside the header");
  h.table_offset = 1536 - 512;
  h.max_entries = 128; /* 512 bytes, ending where the header does */
  h.block_size = 1u << 28;
  f.current_size = 32ull << 30;
  layout(&f, &h, 1ull << 40, "overlaps", "BAT ending at the header's end");
  h.table_offset = 0x10000;
  f.data_offset = 0x10000 - 1024;
  layout(&f, &h, 1ull << 40, NULL, "header just before the BAT");
  f.data_offset = 0x10000 + 256;
  layout(&f, &h, 1ull << 40, "overlaps", "header inside the BAT");
  f.data_offset = 0x10000 + 512;
  layout(&f, &h, 1ull << 40, NULL, "header just after the BAT");

  sample_footer(&f, 10ull << 30, VHD_TYPE_DYNAMIC);
  sample_header(&h, 5120, 2u << 20);
  f.data_offset = 0;
  layout(&f, &h, 1ull << 40, "dynamic header at offset 0 overlaps the footer",
         "header at 0");
  f.data_offset = 511;
  layout(&f, &h, 1ull << 40, "overlaps the footer copy", "header at 511");
  f.data_offset = UINT64_MAX;
  layout(&f, &h, UINT64_MAX, "ends beyond 2^64", "header at 2^64 - 1");
  f.data_offset = 1ull << 40;
  layout(&f, &h, (1ull << 40) + 1024 + 510,
         "dynamic header at offset 1099511627776 ends at 1099511628800, "
         "inside the footer",
         "header into the footer");
  layout(&f, &h, 1000, "past the end of the 1000-byte file",
         "header past the end");
  layout(&f, &h, 0, "past the end of the 0-byte file", "empty file");
  h.table_offset = (1ull << 40) + 1024;
  layout(&f, &h, (1ull << 40) + 1024 + 511,
         "BAT at offset 1099511628800 of 5120 entries ends at "
         "1099511649280, past the end",
         "header fits, BAT not");

  sample_footer(&f, 2040ull << 30, VHD_TYPE_DYNAMIC);
  sample_header(&h, 1044480, 2u << 20);
  layout(&f, &h, 1ull << 30, NULL, "2040 GiB disk");
  f.current_size = (2040ull << 30) + 512;
  h.max_entries = 1044481;
  layout(&f, &h, 1ull << 30, "larger than the format's", "2040 GiB + 512");
  f.current_size = UINT64_MAX;
  layout(&f, &h, UINT64_MAX, "larger than the format's", "2^64 - 1 bytes");
  /* A "vpc " footer takes its size from the geometry, not current_size. */
  memcpy(f.creator_app, "vpc ", 5);
  f.cylinders = 100;
  f.heads = 4;
  f.sectors = 17;
  h.max_entries = 1044480;
  layout(&f, &h, 1ull << 30, NULL, "\"vpc \" with a small geometry");

  /* Fixed disks: the data, then a footer of 511 bytes at least. */
  sample_footer(&f, 100u << 20, VHD_TYPE_FIXED);
  layout(&f, NULL, (100u << 20) + 512, NULL, "fixed disk");
  layout(&f, NULL, (100u << 20) + 511, NULL, "fixed disk, old footer");
  layout(&f, NULL, (100u << 20) + 510, "do not fit in the 104858110-byte",
         "fixed disk one byte short");
  layout(&f, NULL, 0, "do not fit", "fixed disk, empty file");
  layout(&f, &h, 1ull << 30, "a fixed disk has no dynamic header",
         "fixed disk with a header");
  f.current_size = UINT64_MAX - 10;
  memcpy(f.creator_app, "vpc ", 5);
  layout(&f, NULL, UINT64_MAX, "do not fit",
         "\"vpc \" fixed disk with current_size near 2^64");
  f.current_size = 1000;
  f.cylinders = 1000;
  layout(&f, NULL, 1512, "do not fit",
         "\"vpc \" fixed disk whose geometry is larger than the file");
}

static void
test_block_inside(void)
{
  /* 2 MiB block + 512-byte bitmap at sector 3: ends at 1536 + 2097664. */
  uint64_t end = 1536 + 512 + (2u << 20);
  ok(vhd_block_inside(3, 2u << 20, end + 511), "block before the footer");
  ok(vhd_block_inside(3, 2u << 20, end + 512), "and with a 512-byte one");
  ok(!vhd_block_inside(3, 2u << 20, end + 510), "one byte into the footer");
  ok(!vhd_block_inside(VHD_BAT_UNUSED, 512, UINT64_MAX), "unused entry");
  ok(vhd_block_inside(0xfffffffe, 1u << 28, UINT64_MAX),
     "the last sector number in a huge file");
  ok(!vhd_block_inside(0xfffffffe, 1u << 28,
                       0xfffffffeull * 512 + 65536 + (1u << 28) + 510),
     "the last sector number, one byte short");
  ok(!vhd_block_inside(0, 512, 0), "empty file");
  ok(!vhd_block_inside(0, 512, 100), "file shorter than a footer");
  is(vhd_bitmap_len(512), 512, "one-sector blocks: a sector of bitmap");
  is(vhd_bitmap_len(1u << 28), 65536, "256 MiB blocks: 64 KiB of bitmap");
  is(vhd_bitmap_len(4u << 20), 1024, "4 MiB blocks: 1 KiB of bitmap");
  is(vhd_bat_len(128), 512, "128 entries: one sector");
  is(vhd_bat_len(129), 1024, "129 entries: two");
  is(vhd_bat_len(0xffffffffu), 0x400000000ull, "2^32 - 1 entries: 16 GiB");
  uint8_t bat[8] = { 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff };
  is(vhd_bat_entry(bat, 0), 3, "BAT entry 0");
  is(vhd_bat_entry(bat, 1), VHD_BAT_UNUSED, "BAT entry 1 unused");
}

/* Walks the runs of bitmap[0..limit) and checks them against bit-by-bit
 * reading; returns the number of runs. */
static unsigned
walk_runs(const uint8_t *bm, uint32_t first, uint32_t limit, const char *what)
{
  unsigned runs = 0;
  bool good = true;
  uint32_t i = first;
  while (i < limit) {
    bool set;
    uint32_t n = vhd_bitmap_run(bm, i, limit, &set);
    if (n == 0 || n > limit - i) {
      good = false;
      break;
    }
    for (uint32_t j = i; j < i + n; j++)
      if (!!(bm[j / 8] & (0x80 >> (j % 8))) != set)
        good = false;
    if (i + n < limit && !!(bm[(i + n) / 8] & (0x80 >> ((i + n) % 8))) == set)
      good = false; /* not maximal */
    i += n;
    runs++;
  }
  ok(good && i == limit, "%s: runs agree with the bits", what);
  return runs;
}

static void
test_bitmap_run(void)
{
  uint8_t bm[512];
  bool set;

  memset(bm, 0, sizeof bm);
  is(vhd_bitmap_run(bm, 0, 4096, &set), 4096, "all clear: one run of 4096");
  ok(!set, "clear");
  memset(bm, 0xff, sizeof bm);
  is(vhd_bitmap_run(bm, 0, 4096, &set), 4096, "all set: one run of 4096");
  ok(set, "set");
  is(vhd_bitmap_run(bm, 4095, 4096, &set), 1, "last bit alone");
  is(vhd_bitmap_run(bm, 4096, 4096, &set), 0, "first == limit: empty");
  is(vhd_bitmap_run(bm, 3, 1000, &set), 997, "limit inside a byte");

  /* 0xF0 0x0F: set 0..3, clear 4..11, set 12..15. MSB first. */
  uint8_t two[2] = { 0xf0, 0x0f };
  is(vhd_bitmap_run(two, 0, 16, &set), 4, "0xF0: four set bits first");
  ok(set, "they are set");
  is(vhd_bitmap_run(two, 4, 16, &set), 8, "clear run across the byte edge");
  ok(!set, "it is clear");
  is(vhd_bitmap_run(two, 12, 16, &set), 4, "last four set");
  is(vhd_bitmap_run(two, 5, 9, &set), 4, "run cut by the limit");

  /* Whole bytes and words then a change deep inside: sector 3001. */
  memset(bm, 0, sizeof bm);
  bm[3001 / 8] |= 0x80 >> (3001 % 8);
  is(vhd_bitmap_run(bm, 0, 4096, &set), 3001, "clear up to sector 3001");
  is(vhd_bitmap_run(bm, 1, 4096, &set), 3000, "from an unaligned start");
  is(vhd_bitmap_run(bm, 3001, 4096, &set), 1, "the set bit");
  is(vhd_bitmap_run(bm, 3002, 4096, &set), 1094, "clear to the end");
  is(walk_runs(bm, 0, 4096, "one set bit"), 3, "three runs");

  memset(bm, 0xff, sizeof bm);
  bm[64] = 0xfe; /* sector 519 clear */
  is(vhd_bitmap_run(bm, 7, 4096, &set), 512, "set from 7 up to 519");
  is(walk_runs(bm, 0, 4096, "one clear bit"), 3, "three runs");

  for (size_t i = 0; i < sizeof bm; i++)
    bm[i] = (uint8_t)(i * 37 + (i >> 3));
  walk_runs(bm, 0, 4096, "mixed bytes");
  walk_runs(bm, 13, 4001, "mixed bytes, odd bounds");
  for (size_t i = 0; i < sizeof bm; i++)
    bm[i] = i % 24 < 8 ? 0x00 : i % 24 < 16 ? 0xff : 0x3c;
  walk_runs(bm, 0, 4096, "whole-byte stretches");
  walk_runs(bm, 5, 4093, "whole-byte stretches, odd bounds");
}

/* UTF-16LE (or BE) of an ASCII string, n units, zero-padded. */
static size_t
utf16_of(const char *s, bool be, uint8_t *out, size_t units)
{
  memset(out, 0, 2 * units);
  size_t n = strlen(s);
  for (size_t i = 0; i < n && i < units; i++)
    out[2 * i + (be ? 1 : 0)] = (uint8_t)s[i];
  return 2 * units;
}

static int
locator(uint32_t code, const void *data, size_t len, char *out, size_t outlen)
{
  uint8_t *b = dup_exact(data, len);
  int r = vhd_locator_path(code, b, len, out, outlen);
  free(b);
  return r;
}

static void
test_locator(void)
{
  char out[256];
  uint8_t u[128];

#define MACX(s) locator(VHD_LOC_MACX, s, strlen(s), out, sizeof out)
  is(MACX("file://./base.vhd"), 0, "MacX relative (ocaml-vhd)");
  ok(strcmp(out, "./base.vhd") == 0, "-> %s", out);
  is(MACX("file://../up/base.vhd"), 0, "MacX ../ relative (blktap)");
  ok(strcmp(out, "../up/base.vhd") == 0, "-> %s", out);
  is(MACX("file:///abs/dir/base%20x.vhd"), 0, "MacX absolute, escaped");
  ok(strcmp(out, "/abs/dir/base x.vhd") == 0, "-> %s", out);
  is(MACX("file://host/abs/base.vhd"), 0, "MacX with a host");
  ok(strcmp(out, "/abs/base.vhd") == 0, "-> %s", out);
  is(MACX("file://base.vhd"), 0, "MacX bare name (old blktap)");
  ok(strcmp(out, "base.vhd") == 0, "-> %s", out);
  is(MACX("FILE:///a%2fb%C3%BC"), 0, "scheme in capitals, escapes");
  ok(strcmp(out, "/a/b\xc3\xbc") == 0, "-> %s", out);
  is(locator(VHD_LOC_MACX, "file://./b.vhd\0\0\0", 17, out, sizeof out), 0,
     "MacX with trailing NULs");
  ok(strcmp(out, "./b.vhd") == 0, "-> %s", out);
  is(MACX("http://x/y"), EINVAL_RC, "not a file URL refused");
  is(MACX("/abs/base.vhd"), EINVAL_RC, "a plain path refused");
  is(MACX("file://"), EINVAL_RC, "empty path refused");
  is(MACX("file:/"), EINVAL_RC, "short scheme refused");
  is(MACX("file:///a%2"), EINVAL_RC, "cut escape refused");
  is(MACX("file:///a%zz"), EINVAL_RC, "bad escape refused");
  is(MACX("file:///a%00b"), EINVAL_RC, "escaped NUL refused");
  is(locator(VHD_LOC_MACX, "file:///abcdef", 14, out, 7), EINVAL_RC,
     "output one byte too small refused");
  ok(out[0] == '\0', "and left empty");
  is(locator(VHD_LOC_MACX, "file:///abcdef", 14, out, 8), 0,
     "exact fit accepted");
  is(locator(VHD_LOC_MACX, "file:///", 8, out, 0), EINVAL_RC, "no output room");
#undef MACX

  size_t n = utf16_of(".\\base.vhd", false, u, 20); /* 10 trailing NULs */
  is(locator(VHD_LOC_W2RU, u, n, out, sizeof out), 0,
     "W2ru UTF-16LE with trailing NULs");
  ok(strcmp(out, "./base.vhd") == 0, "-> %s", out);
  n = utf16_of("C:\\dir\\base.vhd", false, u, 15);
  is(locator(VHD_LOC_W2KU, u, n, out, sizeof out), 0, "W2ku, no NUL at all");
  ok(strcmp(out, "C:/dir/base.vhd") == 0, "-> %s", out);
  n = utf16_of("?C:\\x.vhd", true, u, 12);
  u[0] = 0xfe; /* the BOM's own bytes, big-endian */
  u[1] = 0xff;
  is(locator(VHD_LOC_W2KU, u, n, out, sizeof out), 0, "W2ku with a BE BOM");
  ok(strcmp(out, "C:/x.vhd") == 0, "-> %s", out);
  n = utf16_of("?a.vhd", false, u, 8);
  u[0] = 0xff;
  u[1] = 0xfe;
  is(locator(VHD_LOC_W2RU, u, n, out, sizeof out), 0, "W2ru with a LE BOM");
  ok(strcmp(out, "a.vhd") == 0, "-> %s", out);
  n = utf16_of("a.vhd", false, u, 8);
  is(locator(VHD_LOC_W2RU, u, n - 1, out, sizeof out), EINVAL_RC,
     "odd length refused");
  n = utf16_of("", false, u, 8);
  is(locator(VHD_LOC_W2RU, u, n, out, sizeof out), EINVAL_RC,
     "all NULs: empty path refused");
  is(locator(VHD_LOC_W2RU, u, 0, out, sizeof out), EINVAL_RC,
     "no data refused");
  n = utf16_of("ab", false, u, 2);
  wire_put16(u + 2, 0x00dc); /* LE 0xDC00: a lone low surrogate */
  is(locator(VHD_LOC_W2RU, u, n, out, sizeof out), EINVAL_RC,
     "unpaired surrogate refused");
  n = utf16_of("x.vhd", false, u, 5);
  is(locator(VHD_LOC_W2RU, u, n, out, 5), EINVAL_RC, "output too small");
  is(locator(VHD_LOC_W2RU, u, n, out, 6), 0, "output just big enough");
  is(locator(0x57693272 /* Wi2r */, u, n, out, sizeof out), EINVAL_RC,
     "deprecated Wi2r refused");
  is(locator(VHD_LOC_NONE, u, n, out, sizeof out), EINVAL_RC, "code 0 refused");
}

static int
utf16(const void *p, size_t len, bool be, char *out, size_t outlen)
{
  uint8_t *b = dup_exact(p, len);
  int r = vhd_utf16_to_utf8(b, len, be, out, outlen);
  free(b);
  return r;
}

static void
test_utf16(void)
{
  char out[64];
  /* U+1D11E (musical G clef) = D834 DD1E; U+00FC; U+20AC. */
  static const uint8_t be[] = { 0x00, 'a',  0x00, 0xfc, 0x20,
                                0xac, 0xd8, 0x34, 0xdd, 0x1e };
  static const uint8_t le[] = { 'a',  0x00, 0xfc, 0x00, 0xac,
                                0x20, 0x34, 0xd8, 0x1e, 0xdd };
  static const char want[] = "a\xc3\xbc\xe2\x82\xac\xf0\x9d\x84\x9e";
  is(utf16(be, sizeof be, true, out, sizeof out), 10, "BE: 10 UTF-8 bytes");
  ok(strcmp(out, want) == 0, "BE: 1-, 2-, 3- and 4-byte characters");
  is(utf16(le, sizeof le, false, out, sizeof out), 10, "LE: 10 bytes");
  ok(strcmp(out, want) == 0, "LE: same text");
  is(utf16(be, sizeof be, true, out, 11), 10, "exact room");
  is(utf16(be, sizeof be, true, out, 10), EINVAL_RC, "no room for the NUL");
  ok(out[0] == '\0', "failure leaves an empty string");
  is(utf16(be, sizeof be, true, out, 7), EINVAL_RC,
     "no room for the 4-byte character");
  is(utf16(be, sizeof be - 2, true, out, sizeof out), EINVAL_RC,
     "high surrogate at the end refused");
  is(utf16(be + 6, 2, true, out, sizeof out), EINVAL_RC,
     "high surrogate alone refused");
  is(utf16(be + 8, 2, true, out, sizeof out), EINVAL_RC,
     "low surrogate alone refused");
  static const uint8_t hi_hi[] = { 0xd8, 0x34, 0xd8, 0x34 };
  is(utf16(hi_hi, 4, true, out, sizeof out), EINVAL_RC,
     "two high surrogates refused");
  static const uint8_t hi_nul[] = { 0xd8, 0x34, 0x00, 0x00 };
  is(utf16(hi_nul, 4, true, out, sizeof out), EINVAL_RC,
     "high surrogate then NUL refused");
  static const uint8_t stop[] = { 0x00, 'a', 0x00, 0x00, 0xdc, 0x00 };
  is(utf16(stop, sizeof stop, true, out, sizeof out), 1,
     "stops at the NUL, before a bad unit");
  is(utf16(stop, 0, true, out, sizeof out), 0, "nothing: empty string");
  is(utf16(stop, 3, true, out, sizeof out), EINVAL_RC, "odd length refused");
  is(utf16(stop, 2, true, out, 0), EINVAL_RC, "outlen 0 refused");
  static const uint8_t maxcp[] = { 0xdb, 0xff, 0xdf, 0xff, 0xff, 0xff };
  is(utf16(maxcp, sizeof maxcp, true, out, sizeof out), 7,
     "U+10FFFF and U+FFFF");
  ok(strcmp(out, "\xf4\x8f\xbf\xbf\xef\xbf\xbf") == 0, "encoded right");
}

static void
test_uuid(void)
{
  uint8_t u[16];
  char s[37];
  for (int i = 0; i < 16; i++)
    u[i] = (uint8_t)(0xf0 + i);
  memset(s, 'x', sizeof s);
  vhd_uuid_str(u, s);
  ok(strcmp(s, "f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff") == 0, "uuid %s", s);
}

/* XenServer's batmap header: cookie, then offset and sectors. */
static void
test_batmap(void)
{
  uint8_t p[512] = "tdbatmap";
  p[8 + 6] = 0x0a; /* offset 0xa00 */
  p[16 + 3] = 2;   /* 2 sectors */
  p[20 + 1] = 1;   /* version 1.2 */
  p[20 + 3] = 2;
  struct vhd_batmap b;
  ok(vhd_batmap_decode(p, sizeof p, &b) == 0 && b.offset == 0xa00 &&
       b.sectors == 2 && b.version == 0x00010002,
     "batmap header: offset, sectors, version");
  ok(vhd_batmap_decode(p, 23, &b) == -EINVAL, "batmap: 23 bytes refused");
  p[0] = 'T';
  ok(vhd_batmap_decode(p, sizeof p, &b) == -EINVAL,
     "batmap: another cookie refused");
}

int
main(void)
{
  test_checksum();
  test_batmap();
  test_footer_qemu();
  test_header_qemu();
  test_round_trip();
  test_bad();
  test_geometry();
  test_virtual_size();
  test_check_layout();
  test_block_inside();
  test_bitmap_run();
  test_locator();
  test_utf16();
  test_uuid();
  return tap_done();
}
