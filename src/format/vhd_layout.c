/* vhd_layout.c: the VHD on-disk structures. See vhd_layout.h for
 * contracts; the layouts are those of the Microsoft VHD specification 1.0,
 * cross-checked with qemu's block/vpc.c and ocaml-vhd. Every value read
 * from a file is hostile: sums of offsets and lengths are checked against
 * UINT64_MAX before they are formed, and products are of 32-bit values in
 * 64 bits. */
#include "vhd_layout.h"

#include "format/common.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/wire.h"
#include "util/text.h"
#include "util/uri.h"

/* Footer and header field offsets, named as in the spec. */
#define FOOTER_FEATURES        8
#define FOOTER_VERSION         12
#define FOOTER_DATA_OFFSET     16
#define FOOTER_TIMESTAMP       24
#define FOOTER_CREATOR_APP     28
#define FOOTER_CREATOR_VERSION 32
#define FOOTER_CREATOR_OS      36
#define FOOTER_ORIGINAL_SIZE   40
#define FOOTER_CURRENT_SIZE    48
#define FOOTER_GEOMETRY        56
#define FOOTER_DISK_TYPE       60
#define FOOTER_CHECKSUM        64
#define FOOTER_UUID            68
#define FOOTER_SAVED_STATE     84

#define HEADER_DATA_OFFSET      8
#define HEADER_TABLE_OFFSET     16
#define HEADER_VERSION          24
#define HEADER_MAX_ENTRIES      28
#define HEADER_BLOCK_SIZE       32
#define HEADER_CHECKSUM         36
#define HEADER_PARENT_UUID      40
#define HEADER_PARENT_TIMESTAMP 56
#define HEADER_PARENT_NAME      64
#define HEADER_PARENT_NAME_LEN  512u
#define LOCATOR_LEN             24u

/* Both structures are at format version 1.0; the spec bumps the major
 * number only for incompatible changes, so any 1.x is read. */
#define VHD_VERSION  0x00010000u
#define VHD_MAJOR(v) ((v) >> 16)

/* The largest geometry the footer holds: 65535 cylinders, 16 heads, 255
 * sectors per track. */
#define CHS_MAX_CYL     65535u
#define CHS_MAX_HEADS   16u
#define CHS_MAX_SECTORS 255u

/* A cookie as printable text for a message: '?' for what is not. */
static void
cookie_str(const uint8_t p[8], char out[9])
{
  for (int i = 0; i < 8; i++)
    out[i] = p[i] >= 0x20 && p[i] < 0x7f ? (char)p[i] : '?';
  out[8] = '\0';
}

uint32_t
vhd_checksum(const uint8_t *p, size_t len, size_t csum_off)
{
  uint32_t sum = 0;
  for (size_t i = 0; i < len; i++)
    if (i < csum_off || i - csum_off >= 4)
      sum += p[i];
  return ~sum;
}

int
vhd_footer_decode(const uint8_t *p, size_t len, struct vhd_footer *f, char *err,
                  size_t errlen)
{
  char cookie[9];
  if (len != VHD_FOOTER_LEN && len != VHD_OLD_FOOTER_LEN)
    return fmt_fail(err, errlen, -EINVAL, "VHD footer of %zu bytes, not 512 or 511", len);
  if (memcmp(p, VHD_FOOTER_COOKIE, 8) != 0) {
    cookie_str(p, cookie);
    return fmt_fail(err, errlen, -EINVAL, "VHD footer cookie \"%s\" is not \"%s\"", cookie,
                VHD_FOOTER_COOKIE);
  }
  memset(f, 0, sizeof *f);
  f->features = wire_get32(p + FOOTER_FEATURES);
  f->version = wire_get32(p + FOOTER_VERSION);
  f->data_offset = wire_get64(p + FOOTER_DATA_OFFSET);
  f->timestamp = wire_get32(p + FOOTER_TIMESTAMP);
  memcpy(f->creator_app, p + FOOTER_CREATOR_APP, 4);
  f->creator_app[4] = '\0';
  f->creator_version = wire_get32(p + FOOTER_CREATOR_VERSION);
  f->creator_os = wire_get32(p + FOOTER_CREATOR_OS);
  f->original_size = wire_get64(p + FOOTER_ORIGINAL_SIZE);
  f->current_size = wire_get64(p + FOOTER_CURRENT_SIZE);
  f->cylinders = wire_get16(p + FOOTER_GEOMETRY);
  f->heads = p[FOOTER_GEOMETRY + 2];
  f->sectors = p[FOOTER_GEOMETRY + 3];
  f->disk_type = wire_get32(p + FOOTER_DISK_TYPE);
  f->checksum = wire_get32(p + FOOTER_CHECKSUM);
  f->checksum_ok = f->checksum == vhd_checksum(p, len, FOOTER_CHECKSUM);
  memcpy(f->uuid, p + FOOTER_UUID, 16);
  f->saved_state = p[FOOTER_SAVED_STATE];

  if (VHD_MAJOR(f->version) != VHD_MAJOR(VHD_VERSION))
    return fmt_fail(err, errlen, -EINVAL, "VHD footer format version 0x%08x is not 1.x",
                f->version);
  if (f->disk_type != VHD_TYPE_FIXED && f->disk_type != VHD_TYPE_DYNAMIC &&
      f->disk_type != VHD_TYPE_DIFF)
    return fmt_fail(err, errlen, -EINVAL,
                "VHD disk type %u is none of 2 (fixed), 3 (dynamic) and 4 "
                "(differencing)",
                f->disk_type);
  return 0;
}

void
vhd_footer_encode(const struct vhd_footer *f, uint8_t out[VHD_FOOTER_LEN])
{
  memset(out, 0, VHD_FOOTER_LEN);
  memcpy(out, VHD_FOOTER_COOKIE, 8);
  wire_put32(out + FOOTER_FEATURES, f->features);
  wire_put32(out + FOOTER_VERSION, f->version);
  wire_put64(out + FOOTER_DATA_OFFSET, f->data_offset);
  wire_put32(out + FOOTER_TIMESTAMP, f->timestamp);
  memcpy(out + FOOTER_CREATOR_APP, f->creator_app, 4);
  wire_put32(out + FOOTER_CREATOR_VERSION, f->creator_version);
  wire_put32(out + FOOTER_CREATOR_OS, f->creator_os);
  wire_put64(out + FOOTER_ORIGINAL_SIZE, f->original_size);
  wire_put64(out + FOOTER_CURRENT_SIZE, f->current_size);
  wire_put16(out + FOOTER_GEOMETRY, f->cylinders);
  out[FOOTER_GEOMETRY + 2] = f->heads;
  out[FOOTER_GEOMETRY + 3] = f->sectors;
  wire_put32(out + FOOTER_DISK_TYPE, f->disk_type);
  memcpy(out + FOOTER_UUID, f->uuid, 16);
  out[FOOTER_SAVED_STATE] = f->saved_state;
  wire_put32(out + FOOTER_CHECKSUM,
             vhd_checksum(out, VHD_FOOTER_LEN, FOOTER_CHECKSUM));
}

static bool
block_size_ok(uint32_t b)
{
  return b >= VHD_MIN_BLOCK && b <= VHD_MAX_BLOCK && (b & (b - 1)) == 0;
}

int
vhd_header_decode(const uint8_t p[VHD_HEADER_LEN], struct vhd_header *h,
                  char *err, size_t errlen)
{
  char cookie[9];
  if (memcmp(p, VHD_HEADER_COOKIE, 8) != 0) {
    cookie_str(p, cookie);
    return fmt_fail(err, errlen, -EINVAL, "VHD dynamic header cookie \"%s\" is not \"%s\"",
                cookie, VHD_HEADER_COOKIE);
  }
  memset(h, 0, sizeof *h);
  h->data_offset = wire_get64(p + HEADER_DATA_OFFSET);
  h->table_offset = wire_get64(p + HEADER_TABLE_OFFSET);
  h->version = wire_get32(p + HEADER_VERSION);
  h->max_entries = wire_get32(p + HEADER_MAX_ENTRIES);
  h->block_size = wire_get32(p + HEADER_BLOCK_SIZE);
  h->checksum = wire_get32(p + HEADER_CHECKSUM);
  h->checksum_ok =
      h->checksum == vhd_checksum(p, VHD_HEADER_LEN, HEADER_CHECKSUM);
  memcpy(h->parent_uuid, p + HEADER_PARENT_UUID, 16);
  h->parent_timestamp = wire_get32(p + HEADER_PARENT_TIMESTAMP);
  /* A name that is not UTF-16 is no reason to refuse the disk: the
   * locators, not the name, find the parent. */
  if (vhd_utf16_to_utf8(p + HEADER_PARENT_NAME, HEADER_PARENT_NAME_LEN, true,
                        h->parent_name, sizeof h->parent_name) < 0)
    h->parent_name[0] = '\0';
  for (int i = 0; i < VHD_LOCATORS; i++) {
    const uint8_t *l = p + VHD_LOCATOR_OFF + LOCATOR_LEN * i;
    h->loc[i].code = wire_get32(l);
    h->loc[i].space = wire_get32(l + 4);
    h->loc[i].length = wire_get32(l + 8);
    h->loc[i].offset = wire_get64(l + 16);
  }

  if (VHD_MAJOR(h->version) != VHD_MAJOR(VHD_VERSION))
    return fmt_fail(err, errlen, -EINVAL, "VHD dynamic header version 0x%08x is not 1.x",
                h->version);
  if (!block_size_ok(h->block_size))
    return fmt_fail(err, errlen, -EINVAL,
                "VHD block size %u is not a power of two from %u to %u",
                h->block_size, VHD_MIN_BLOCK, VHD_MAX_BLOCK);
  if (h->max_entries == 0)
    return fmt_fail(err, errlen, -EINVAL, "VHD dynamic header has no BAT entries");
  return 0;
}

/* Writes the UTF-8 string s (at most srclen bytes) as UTF-16BE into
 * out[0..len), zero-padded; what does not fit is dropped at a character
 * boundary, and bytes that are not UTF-8 become U+FFFD. */
static void
utf8_to_utf16be(const char *s, size_t srclen, uint8_t *out, size_t len)
{
  /* A NUL-terminated copy: text_utf8_len reads up to 4 bytes. */
  unsigned char buf[sizeof((struct vhd_header *)0)->parent_name + 4];
  size_t n = strnlen(s, srclen < sizeof buf - 4 ? srclen : sizeof buf - 4);
  memset(buf, 0, sizeof buf);
  memcpy(buf, s, n);
  memset(out, 0, len);

  size_t o = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = buf[i] < 0x80 ? 1 : text_utf8_len(buf + i);
    if (k == 0) {
      cp = 0xFFFD;
      k = 1;
    } else if (k == 1) {
      cp = buf[i];
    } else {
      cp = buf[i] & (0x7Fu >> k);
      for (size_t j = 1; j < k; j++)
        cp = cp << 6 | (buf[i + j] & 0x3Fu);
    }
    i += k;
    if (cp < 0x10000) {
      if (len - o < 2)
        break;
      wire_put16(out + o, (uint16_t)cp);
      o += 2;
    } else {
      if (len - o < 4)
        break;
      cp -= 0x10000;
      wire_put16(out + o, (uint16_t)(0xD800 | cp >> 10));
      wire_put16(out + o + 2, (uint16_t)(0xDC00 | (cp & 0x3FF)));
      o += 4;
    }
  }
}

void
vhd_header_encode(const struct vhd_header *h, uint8_t out[VHD_HEADER_LEN])
{
  memset(out, 0, VHD_HEADER_LEN);
  memcpy(out, VHD_HEADER_COOKIE, 8);
  wire_put64(out + HEADER_DATA_OFFSET, h->data_offset);
  wire_put64(out + HEADER_TABLE_OFFSET, h->table_offset);
  wire_put32(out + HEADER_VERSION, h->version);
  wire_put32(out + HEADER_MAX_ENTRIES, h->max_entries);
  wire_put32(out + HEADER_BLOCK_SIZE, h->block_size);
  memcpy(out + HEADER_PARENT_UUID, h->parent_uuid, 16);
  wire_put32(out + HEADER_PARENT_TIMESTAMP, h->parent_timestamp);
  utf8_to_utf16be(h->parent_name, sizeof h->parent_name,
                  out + HEADER_PARENT_NAME, HEADER_PARENT_NAME_LEN);
  for (int i = 0; i < VHD_LOCATORS; i++) {
    uint8_t *l = out + VHD_LOCATOR_OFF + LOCATOR_LEN * i;
    wire_put32(l, h->loc[i].code);
    wire_put32(l + 4, h->loc[i].space);
    wire_put32(l + 8, h->loc[i].length);
    wire_put64(l + 16, h->loc[i].offset);
  }
  wire_put32(out + HEADER_CHECKSUM,
             vhd_checksum(out, VHD_HEADER_LEN, HEADER_CHECKSUM));
}

static bool
chs_is_max(const struct vhd_footer *f)
{
  return f->cylinders == CHS_MAX_CYL && f->heads == CHS_MAX_HEADS &&
         f->sectors == CHS_MAX_SECTORS;
}

uint64_t
vhd_virtual_size(const struct vhd_footer *f)
{
  /* Virtual PC sized its disks by geometry and left current_size
   * behind; a maximal geometry cannot hold a larger disk, so there the
   * footer's size is the one meant. */
  bool by_chs = memcmp(f->creator_app, "vpc ", 4) == 0 ||
                memcmp(f->creator_app, "qemu", 4) == 0;
  if (!by_chs || chs_is_max(f))
    return f->current_size;
  return (uint64_t)f->cylinders * f->heads * f->sectors * VHD_SECTOR;
}

void
vhd_geometry(uint64_t size, uint16_t *cyl, uint8_t *heads, uint8_t *sectors)
{
  /* The spec's appendix "CHS calculation", step by step. */
  uint64_t total = size / VHD_SECTOR;
  uint64_t spt, h, cth;
  if (total > (uint64_t)CHS_MAX_CYL * CHS_MAX_HEADS * CHS_MAX_SECTORS)
    total = (uint64_t)CHS_MAX_CYL * CHS_MAX_HEADS * CHS_MAX_SECTORS;
  if (total >= (uint64_t)CHS_MAX_CYL * 16 * 63) {
    spt = 255;
    h = 16;
    cth = total / spt;
  } else {
    spt = 17;
    cth = total / spt;
    h = (cth + 1023) / 1024;
    if (h < 4)
      h = 4;
    if (cth >= h * 1024 || h > 16) {
      spt = 31;
      h = 16;
      cth = total / spt;
    }
    if (cth >= h * 1024) {
      spt = 63;
      h = 16;
      cth = total / spt;
    }
  }
  *cyl = (uint16_t)(cth / h);
  *heads = (uint8_t)h;
  *sectors = (uint8_t)spt;
}

uint32_t
vhd_bitmap_len(uint32_t block_size)
{
  uint32_t sectors = block_size / VHD_SECTOR + (block_size % VHD_SECTOR != 0);
  uint32_t bytes = (sectors + 7) / 8;
  return (bytes + VHD_SECTOR - 1) / VHD_SECTOR * VHD_SECTOR;
}

uint64_t
vhd_bat_len(uint32_t entries)
{
  uint64_t bytes = (uint64_t)entries * 4;
  return (bytes + VHD_SECTOR - 1) / VHD_SECTOR * VHD_SECTOR;
}

/* Whether [off, off + len) lies after the footer copy at 0 and before the
 * file's last (possibly 511-byte) footer; what names the range for the
 * message. */
static int
check_range(const char *what, uint64_t off, uint64_t len, uint64_t file_size,
            char *err, size_t errlen)
{
  if (off < VHD_FOOTER_LEN)
    return fmt_fail(err, errlen, -EINVAL, "%s overlaps the footer copy at offset 0", what);
  if (file_size >= VHD_OLD_FOOTER_LEN &&
      off <= file_size - VHD_OLD_FOOTER_LEN &&
      file_size - VHD_OLD_FOOTER_LEN - off >= len)
    return 0;
  if (off > UINT64_MAX - len)
    return fmt_fail(err, errlen, -EINVAL, "%s ends beyond 2^64 bytes", what);
  if (off + len > file_size)
    return fmt_fail(err, errlen, -EINVAL,
                "%s ends at %llu, past the end of the %llu-byte file", what,
                (unsigned long long)(off + len), (unsigned long long)file_size);
  return fmt_fail(err, errlen, -EINVAL,
              "%s ends at %llu, inside the footer of the %llu-byte file", what,
              (unsigned long long)(off + len), (unsigned long long)file_size);
}

static int
check_fixed(const struct vhd_footer *f, uint64_t size, uint64_t file_size,
            char *err, size_t errlen)
{
  /* The data is read up to the larger of the two sizes. */
  uint64_t data = f->current_size > size ? f->current_size : size;
  if (file_size < VHD_OLD_FOOTER_LEN || file_size - VHD_OLD_FOOTER_LEN < data)
    return fmt_fail(err, errlen, -EINVAL,
                "fixed disk of %llu bytes and its footer do not fit in the "
                "%llu-byte file",
                (unsigned long long)data, (unsigned long long)file_size);
  return 0;
}

/* Enough BAT entries for a disk of size bytes, and not more than the
 * largest disk needs: refusing those bounds the BAT a reader loads. */
static int
check_entries(const struct vhd_header *h, uint64_t size, char *err,
              size_t errlen)
{
  if (!block_size_ok(h->block_size))
    return fmt_fail(err, errlen, -EINVAL,
                "VHD block size %u is not a power of two from %u to %u",
                h->block_size, VHD_MIN_BLOCK, VHD_MAX_BLOCK);
  /* Both 32-bit: the product fits in 64 bits. */
  uint64_t mapped = (uint64_t)h->max_entries * h->block_size;
  if (mapped < size)
    return fmt_fail(err, errlen, -EINVAL,
                "BAT of %u entries of %u-byte blocks maps %llu bytes, less "
                "than the disk's %llu",
                h->max_entries, h->block_size, (unsigned long long)mapped,
                (unsigned long long)size);
  uint64_t most = (VHD_MAX_SIZE + h->block_size - 1) / h->block_size;
  if (h->max_entries > most)
    return fmt_fail(err, errlen, -EINVAL,
                "BAT of %u entries of %u-byte blocks maps %llu bytes, more "
                "than the format's %llu bytes",
                h->max_entries, h->block_size, (unsigned long long)mapped,
                (unsigned long long)VHD_MAX_SIZE);
  return 0;
}

static int
check_dynamic(const struct vhd_footer *f, const struct vhd_header *h,
              uint64_t size, uint64_t file_size, char *err, size_t errlen)
{
  char what[128];
  int r;

  snprintf(what, sizeof what, "dynamic header at offset %llu",
           (unsigned long long)f->data_offset);
  r = check_range(what, f->data_offset, VHD_HEADER_LEN, file_size, err, errlen);
  if (r < 0)
    return r;
  r = check_entries(h, size, err, errlen);
  if (r < 0)
    return r;

  uint64_t bat_len = vhd_bat_len(h->max_entries);
  snprintf(what, sizeof what, "BAT at offset %llu of %u entries",
           (unsigned long long)h->table_offset, h->max_entries);
  r = check_range(what, h->table_offset, bat_len, file_size, err, errlen);
  if (r < 0)
    return r;
  /* Both ranges end inside the file: the sums cannot overflow. */
  if (h->table_offset < f->data_offset + VHD_HEADER_LEN &&
      f->data_offset < h->table_offset + bat_len)
    return fmt_fail(err, errlen, -EINVAL,
                "BAT at offset %llu of %u entries overlaps the dynamic "
                "header at offset %llu",
                (unsigned long long)h->table_offset, h->max_entries,
                (unsigned long long)f->data_offset);
  return 0;
}

int
vhd_check_layout(const struct vhd_footer *f, const struct vhd_header *h,
                 uint64_t file_size, char *err, size_t errlen)
{
  uint64_t size = vhd_virtual_size(f);
  if (size > VHD_MAX_SIZE)
    return fmt_fail(err, errlen, -EINVAL,
                "disk of %llu bytes is larger than the format's %llu bytes "
                "(2040 GiB)",
                (unsigned long long)size, (unsigned long long)VHD_MAX_SIZE);
  if (f->disk_type == VHD_TYPE_FIXED) {
    if (h != NULL)
      return fmt_fail(err, errlen, -EINVAL, "a fixed disk has no dynamic header");
    return check_fixed(f, size, file_size, err, errlen);
  }
  if (h == NULL)
    return fmt_fail(err, errlen, -EINVAL, "a disk of type %u needs its dynamic header",
                f->disk_type);
  return check_dynamic(f, h, size, file_size, err, errlen);
}

bool
vhd_block_inside(uint32_t entry, uint32_t block_size, uint64_t file_size)
{
  if (entry == VHD_BAT_UNUSED || file_size < VHD_OLD_FOOTER_LEN)
    return false;
  /* At most 2^41 + 2^20 + 2^32: no overflow. */
  uint64_t end =
      (uint64_t)entry * VHD_SECTOR + vhd_bitmap_len(block_size) + block_size;
  return end <= file_size - VHD_OLD_FOOTER_LEN;
}

int
vhd_batmap_decode(const uint8_t *p, size_t len, struct vhd_batmap *b)
{
  if (len < 24 || memcmp(p, VHD_BATMAP_COOKIE, 8) != 0)
    return -EINVAL;
  b->offset = wire_get64(p + 8);
  b->sectors = wire_get32(p + 16);
  b->version = wire_get32(p + 20);
  return 0;
}

static inline bool
bit_at(const uint8_t *b, uint32_t i)
{
  return b[i >> 3] & (0x80u >> (i & 7));
}

uint32_t
vhd_bitmap_run(const uint8_t *bitmap, uint32_t first, uint32_t limit, bool *set)
{
  if (first >= limit) {
    *set = false;
    return 0;
  }
  bool v = bit_at(bitmap, first);
  uint8_t fill = v ? 0xFF : 0x00;
  uint64_t fill64 = v ? UINT64_MAX : 0;
  uint32_t i = first + 1;

  /* Bit by bit to a byte boundary, then whole bytes to a 64-bit boundary,
   * whole words, whole bytes again and the last bits: a 2 MiB block's
   * 4096 sectors take 8 word compares when they are all alike. */
  while (i < limit && (i & 7) != 0 && bit_at(bitmap, i) == v)
    i++;
  if (i < limit && (i & 7) == 0) {
    while ((i & 63) != 0 && limit - i >= 8 && bitmap[i >> 3] == fill)
      i += 8;
    if ((i & 63) == 0) {
      uint64_t w;
      while (limit - i >= 64) {
        memcpy(&w, bitmap + (i >> 3), sizeof w);
        if (w != fill64)
          break;
        i += 64;
      }
    }
    while (limit - i >= 8 && bitmap[i >> 3] == fill)
      i += 8;
    while (i < limit && bit_at(bitmap, i) == v)
      i++;
  }
  *set = v;
  return i - first;
}

static size_t
utf8_put(uint32_t cp, char *o)
{
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

static uint32_t
utf16_unit(const uint8_t *p, bool big_endian)
{
  return big_endian ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0];
}

int
vhd_utf16_to_utf8(const uint8_t *p, size_t len, bool big_endian, char *out,
                  size_t outlen)
{
  if (outlen == 0)
    return -EINVAL;
  out[0] = '\0';
  if (len % 2 != 0)
    return -EINVAL;

  size_t o = 0;
  for (size_t i = 0; i < len; i += 2) {
    uint32_t cp = utf16_unit(p + i, big_endian);
    if (cp == 0)
      break;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
      goto bad;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (len - i < 4)
        goto bad;
      uint32_t lo = utf16_unit(p + i + 2, big_endian);
      if (lo < 0xDC00 || lo > 0xDFFF)
        goto bad;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      i += 2;
    }
    char u[4];
    size_t n = utf8_put(cp, u);
    /* Room for the character and the NUL, within an int's range. */
    if (outlen - o <= n || o + n > INT_MAX)
      goto bad;
    memcpy(out + o, u, n);
    o += n;
  }
  out[o] = '\0';
  return (int)o;

bad:
  out[0] = '\0';
  return -EINVAL;
}

/* A MacX locator: a file:// URL. After "file://" comes an absolute path,
 * a host and an absolute path (the host dropped), or a relative path:
 * ocaml-vhd writes "file://./name.vhd", old blktap "file://name.vhd". A
 * component that starts with '.', or one with no '/' after it, is a
 * relative path rather than a host. */
static int
macx_path(const uint8_t *data, size_t len, char *out, size_t outlen)
{
  static const char scheme[] = "file://";
  const size_t slen = sizeof scheme - 1;
  const uint8_t *nul = memchr(data, '\0', len);
  if (nul != NULL)
    len = (size_t)(nul - data);
  if (len < slen)
    return -EINVAL;
  for (size_t i = 0; i < slen; i++)
    if ((data[i] | (scheme[i] >= 'a' ? 0x20 : 0)) != (uint8_t)scheme[i])
      return -EINVAL;

  const uint8_t *s = data + slen, *end = data + len;
  if (s < end && *s != '/' && *s != '.') {
    const uint8_t *slash = memchr(s, '/', (size_t)(end - s));
    if (slash != NULL)
      s = slash;
  }
  size_t o = 0;
  while (s < end) {
    uint8_t c = *s++;
    if (c == '%') {
      if (end - s < 2)
        return -EINVAL;
      int hi = uri_hexval((char)s[0]), lo = uri_hexval((char)s[1]);
      if (hi < 0 || lo < 0)
        return -EINVAL;
      c = (uint8_t)(hi << 4 | lo);
      s += 2;
      if (c == '\0')
        return -EINVAL;
    }
    if (outlen - o < 2)
      return -EINVAL;
    out[o++] = (char)c;
  }
  out[o] = '\0';
  return 0;
}

/* W2ru and W2ku: UTF-16, little-endian unless a byte-order mark says. */
static int
windows_path(const uint8_t *data, size_t len, char *out, size_t outlen)
{
  bool big_endian = false;
  if (len % 2 != 0)
    return -EINVAL;
  if (len >= 2 && data[0] == 0xFE && data[1] == 0xFF) {
    big_endian = true;
    data += 2;
    len -= 2;
  } else if (len >= 2 && data[0] == 0xFF && data[1] == 0xFE) {
    data += 2;
    len -= 2;
  }
  int r = vhd_utf16_to_utf8(data, len, big_endian, out, outlen);
  if (r < 0)
    return r;
  for (char *c = out; *c != '\0'; c++)
    if (*c == '\\')
      *c = '/';
  return 0;
}

int
vhd_locator_path(uint32_t code, const uint8_t *data, size_t len, char *out,
                 size_t outlen)
{
  int r;
  if (outlen == 0)
    return -EINVAL;
  out[0] = '\0';
  switch (code) {
  case VHD_LOC_MACX:
    r = macx_path(data, len, out, outlen);
    break;
  case VHD_LOC_W2RU:
  case VHD_LOC_W2KU:
    r = windows_path(data, len, out, outlen);
    break;
  default:
    return -EINVAL;
  }
  if (r < 0 || out[0] == '\0') {
    out[0] = '\0';
    return -EINVAL;
  }
  return 0;
}

void
vhd_uuid_str(const uint8_t uuid[16], char out[37])
{
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10)
      out[o++] = '-';
    out[o++] = hex[uuid[i] >> 4];
    out[o++] = hex[uuid[i] & 15];
  }
  out[o] = '\0';
}
