/* fuzz-vhd.c: the VHD layout decoders (format/vhd_layout.h) over hostile
 * bytes. The input is read as a VHD file would be: a footer at 0 (512 and
 * 511 bytes), a dynamic header at 512 or, for a header alone, at 0, its
 * BAT and locator data where it says; the file's size is the input's and
 * the big-endian u64 of its last 8 bytes. The whole input is also a
 * sector bitmap, UTF-16 text in both byte orders and locator data of
 * every kind.
 *
 * What decodes must re-encode to itself; what vhd_check_layout accepts
 * must lie inside the file by a recomputation in 128-bit arithmetic; runs
 * of bits must tile the bitmap and be maximal; UTF-8 out must be valid,
 * NUL-terminated within its buffer, and encode back to the UTF-16 in. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "format/vhd_layout.h"
#include "fuzz.h"

typedef unsigned __int128 u128;

/* A copy of exactly n bytes, so that ASan sees a read past them. */
static uint8_t *
dup_exact(const uint8_t *p, size_t n)
{
  uint8_t *b = malloc(n ? n : 1);
  CHECK(b);
  memcpy(b, p, n);
  return b;
}

static uint64_t
be64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static uint32_t
be32(const uint8_t *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

static bool
all_zero(const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return false;
  return true;
}

/* Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF)
 * of exactly n bytes with no NUL: the code points go to cps (room for n),
 * their count to *ncp. */
static bool
utf8_decode(const char *s, size_t n, uint32_t *cps, size_t *ncp)
{
  const uint8_t *p = (const uint8_t *)s;
  size_t i = 0, k = 0;
  while (i < n) {
    uint32_t c = p[i], min;
    size_t len;
    if (c == 0)
      return false;
    if (c < 0x80) {
      len = 1;
      min = 0;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      c &= 0x1F;
      min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      c &= 0x0F;
      min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      c &= 0x07;
      min = 0x10000;
    } else {
      return false;
    }
    if (n - i < len)
      return false;
    for (size_t j = 1; j < len; j++) {
      if ((p[i + j] & 0xC0) != 0x80)
        return false;
      c = c << 6 | (p[i + j] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      return false;
    cps[k++] = c;
    i += len;
  }
  *ncp = k;
  return true;
}

static uint32_t
unit_at(const uint8_t *p, bool big_endian)
{
  return big_endian ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0];
}

/* Whether the UTF-16 in p[0..len) up to its first NUL unit has no
 * unpaired surrogate: the independent statement of what is decodable. */
static bool
utf16_valid(const uint8_t *p, size_t len, bool big_endian)
{
  for (size_t i = 0; i + 1 < len; i += 2) {
    uint32_t u = unit_at(p + i, big_endian);
    if (u == 0)
      return true;
    if (u >= 0xDC00 && u <= 0xDFFF)
      return false;
    if (u >= 0xD800 && u <= 0xDBFF) {
      if (i + 3 >= len)
        return false;
      uint32_t lo = unit_at(p + i + 2, big_endian);
      if (lo < 0xDC00 || lo > 0xDFFF)
        return false;
      i += 2;
    }
  }
  return true;
}

/* out (r bytes) encodes back, code point by code point, to the units of
 * p up to its first NUL. */
static void
check_utf16_back(const uint8_t *p, size_t len, bool big_endian, const char *out,
                 size_t r)
{
  uint32_t *cps = malloc((r ? r : 1) * sizeof *cps);
  size_t ncp = 0, i = 0;
  CHECK(cps);
  CHECK(utf8_decode(out, r, cps, &ncp));
  for (size_t k = 0; k < ncp; k++) {
    uint32_t c = cps[k];
    CHECK(i + 1 < len);
    if (c >= 0x10000) {
      CHECK(i + 3 < len);
      CHECK(unit_at(p + i, big_endian) == (0xD800 | (c - 0x10000) >> 10));
      CHECK(unit_at(p + i + 2, big_endian) ==
            (0xDC00 | ((c - 0x10000) & 0x3FF)));
      i += 4;
    } else {
      CHECK(unit_at(p + i, big_endian) == c);
      i += 2;
    }
  }
  /* Then the NUL, or the end of the input. */
  CHECK(i + 1 >= len || unit_at(p + i, big_endian) == 0);
  free(cps);
}

static void
utf16(const uint8_t *p, size_t n)
{
  size_t outlen = n / 2 * 3 + 1; /* 3 bytes a unit at most, and the NUL */
  char *out = malloc(outlen);
  CHECK(out);
  for (int be = 0; be <= 1; be++) {
    int r = vhd_utf16_to_utf8(p, n, be, out, outlen);
    if (n % 2 != 0) {
      CHECK(r == -EINVAL);
      continue;
    }
    CHECK((r >= 0) == utf16_valid(p, n, be));
    if (r < 0)
      continue;
    CHECK((size_t)r < outlen && out[r] == '\0' && strlen(out) == (size_t)r);
    check_utf16_back(p, n, be, out, (size_t)r);
    /* The exact room is enough, one byte less is not. */
    char *tight = malloc((size_t)r + 1);
    CHECK(tight);
    CHECK(vhd_utf16_to_utf8(p, n, be, tight, (size_t)r + 1) == r);
    CHECK(memcmp(tight, out, (size_t)r + 1) == 0);
    if (r > 0)
      CHECK(vhd_utf16_to_utf8(p, n, be, tight, (size_t)r) == -EINVAL);
    free(tight);
  }
  free(out);
}

static void
locator(uint32_t code, const uint8_t *data, size_t len)
{
  char out[4096];
  uint8_t *d = dup_exact(data, len);
  int r = vhd_locator_path(code, d, len, out, sizeof out);
  size_t l = strnlen(out, sizeof out);
  CHECK(l < sizeof out);
  if (r == 0) {
    CHECK(code == VHD_LOC_MACX || code == VHD_LOC_W2RU || code == VHD_LOC_W2KU);
    CHECK(l > 0);
    if (code != VHD_LOC_MACX)
      CHECK(memchr(out, '\\', l) == NULL);
    /* The exact room gives the same path; one byte less fails. */
    char *tight = malloc(l + 1);
    CHECK(tight);
    CHECK(vhd_locator_path(code, d, len, tight, l + 1) == 0);
    CHECK(strcmp(tight, out) == 0);
    CHECK(vhd_locator_path(code, d, len, tight, l) == -EINVAL);
    free(tight);
  } else {
    CHECK(r == -EINVAL);
  }
  free(d);
}

static void
bitmap_walk(const uint8_t *p, uint32_t first, uint32_t limit)
{
  bool set;
  uint32_t i = first;
  while (i < limit) {
    uint32_t r = vhd_bitmap_run(p, i, limit, &set);
    CHECK(r >= 1 && r <= limit - i);
    for (uint32_t j = i; j < i + r; j++)
      CHECK(!!(p[j >> 3] & (0x80u >> (j & 7))) == set);
    /* Maximal: the next bit differs. */
    if (i + r < limit)
      CHECK(!!(p[(i + r) >> 3] & (0x80u >> ((i + r) & 7))) != set);
    i += r;
  }
  CHECK(i == (first > limit ? first : limit));
  CHECK(vhd_bitmap_run(p, limit, limit, &set) == 0);
}

static void
bitmap(const uint8_t *p, size_t n)
{
  if (n == 0 || n > UINT32_MAX / 8)
    return;
  uint32_t limit = (uint32_t)(n * 8);
  bitmap_walk(p, 0, limit);
  bitmap_walk(p, p[0] % 64, limit - p[n - 1] % 8);
}

static bool
footer_eq(const struct vhd_footer *a, const struct vhd_footer *b)
{
  return a->features == b->features && a->version == b->version &&
         a->data_offset == b->data_offset && a->timestamp == b->timestamp &&
         memcmp(a->creator_app, b->creator_app, 5) == 0 &&
         a->creator_version == b->creator_version &&
         a->creator_os == b->creator_os &&
         a->original_size == b->original_size &&
         a->current_size == b->current_size && a->cylinders == b->cylinders &&
         a->heads == b->heads && a->sectors == b->sectors &&
         a->disk_type == b->disk_type && memcmp(a->uuid, b->uuid, 16) == 0 &&
         a->saved_state == b->saved_state;
}

static bool
header_eq(const struct vhd_header *a, const struct vhd_header *b)
{
  if (a->data_offset != b->data_offset || a->table_offset != b->table_offset ||
      a->version != b->version || a->max_entries != b->max_entries ||
      a->block_size != b->block_size ||
      memcmp(a->parent_uuid, b->parent_uuid, 16) != 0 ||
      a->parent_timestamp != b->parent_timestamp ||
      strcmp(a->parent_name, b->parent_name) != 0)
    return false;
  for (int i = 0; i < VHD_LOCATORS; i++)
    if (a->loc[i].code != b->loc[i].code ||
        a->loc[i].space != b->loc[i].space ||
        a->loc[i].length != b->loc[i].length ||
        a->loc[i].offset != b->loc[i].offset)
      return false;
  return true;
}

static void
check_err(int r, const char *err, size_t errlen)
{
  CHECK(r == 0 || r == -EINVAL);
  CHECK(strnlen(err, errlen) < errlen);
  if (r < 0)
    CHECK(err[0] != '\0');
}

/* Decodes the footer in the first len bytes; returns whether it did. */
static bool
footer(const uint8_t *p, size_t n, size_t len, struct vhd_footer *f)
{
  char err[256] = "";
  if (n < len)
    return false;
  uint8_t *b = dup_exact(p, len);
  int r = vhd_footer_decode(b, len, f, err, sizeof err);
  check_err(r, err, sizeof err);
  if (r == 0) {
    uint8_t out[VHD_FOOTER_LEN];
    struct vhd_footer g;
    CHECK(f->checksum == be32(b + 64));
    vhd_footer_encode(f, out);
    CHECK(vhd_footer_decode(out, sizeof out, &g, err, sizeof err) == 0);
    CHECK(g.checksum_ok && footer_eq(f, &g));
    /* Bytes 85 on are not kept: only a footer with them zero is the
     * encoder's own. */
    if (f->checksum_ok && all_zero(b + 85, len - 85))
      CHECK(memcmp(out, b, len) == 0);
    if (memcmp(f->creator_app, "vpc ", 4) != 0 &&
        memcmp(f->creator_app, "qemu", 4) != 0)
      CHECK(vhd_virtual_size(f) == f->current_size);
    char uuid[37];
    vhd_uuid_str(f->uuid, uuid);
    CHECK(strlen(uuid) == 36 && uuid[8] == '-' && uuid[13] == '-' &&
          uuid[18] == '-' && uuid[23] == '-');
  }
  free(b);
  return r == 0;
}

/* The input as a parent name: it is written as UTF-16BE and read back as
 * valid UTF-8, the same name when it was UTF-8 of at most 256 units. */
static void
parent_name(const uint8_t *p, size_t n)
{
  struct vhd_header h, g;
  uint8_t out[VHD_HEADER_LEN];
  uint32_t cps[sizeof h.parent_name];
  size_t ncp, units = 0;
  memset(&h, 0, sizeof h);
  h.version = 0x00010000;
  h.max_entries = 1;
  h.block_size = VHD_DEFAULT_BLOCK;
  size_t len = n < sizeof h.parent_name - 1 ? n : sizeof h.parent_name - 1;
  memcpy(h.parent_name, p, len);
  vhd_header_encode(&h, out);
  CHECK(vhd_header_decode(out, &g, NULL, 0) == 0 && g.checksum_ok);
  size_t gl = strlen(g.parent_name);
  CHECK(utf8_decode(g.parent_name, gl, cps, &ncp));
  size_t hl = strlen(h.parent_name);
  if (!utf8_decode(h.parent_name, hl, cps, &ncp))
    return;
  for (size_t i = 0; i < ncp; i++)
    units += cps[i] >= 0x10000 ? 2 : 1;
  if (units <= 256)
    CHECK(strcmp(g.parent_name, h.parent_name) == 0);
  else
    CHECK(gl < hl && memcmp(g.parent_name, h.parent_name, gl) == 0);
}

static bool
header(const uint8_t *p, size_t n, size_t off, struct vhd_header *h)
{
  char err[256] = "";
  if (n < off || n - off < VHD_HEADER_LEN)
    return false;
  uint8_t *b = dup_exact(p + off, VHD_HEADER_LEN);
  int r = vhd_header_decode(b, h, err, sizeof err);
  check_err(r, err, sizeof err);
  if (r == 0) {
    uint8_t out[VHD_HEADER_LEN];
    struct vhd_header g;
    uint32_t cps[sizeof h->parent_name];
    size_t ncp;
    uint32_t bs = h->block_size;
    CHECK(bs >= VHD_MIN_BLOCK && bs <= VHD_MAX_BLOCK && (bs & (bs - 1)) == 0);
    CHECK(h->max_entries > 0);
    size_t nl = strnlen(h->parent_name, sizeof h->parent_name);
    CHECK(nl < sizeof h->parent_name);
    CHECK(utf8_decode(h->parent_name, nl, cps, &ncp));
    vhd_header_encode(h, out);
    CHECK(vhd_header_decode(out, &g, err, sizeof err) == 0);
    CHECK(g.checksum_ok && header_eq(h, &g));
    if (h->checksum_ok && h->parent_name[0] == '\0' &&
        all_zero(b + 60, 4 + 512) && all_zero(b + 768, 256)) {
      bool reserved_zero = true;
      for (int i = 0; i < VHD_LOCATORS; i++)
        reserved_zero &= all_zero(b + VHD_LOCATOR_OFF + 24 * i + 12, 4);
      if (reserved_zero)
        CHECK(memcmp(out, b, VHD_HEADER_LEN) == 0);
    }
  }
  free(b);
  return r == 0;
}

static void
layout(const struct vhd_footer *f, const struct vhd_header *h,
       uint64_t file_size)
{
  char err[256] = "";
  int r = vhd_check_layout(f, h, file_size, err, sizeof err);
  check_err(r, err, sizeof err);
  if (r < 0)
    return;
  u128 fs = file_size, size = vhd_virtual_size(f);
  CHECK(size <= VHD_MAX_SIZE);
  if (h == NULL) {
    u128 data = f->current_size > size ? f->current_size : size;
    CHECK(f->disk_type == VHD_TYPE_FIXED);
    CHECK(data + VHD_OLD_FOOTER_LEN <= fs);
    return;
  }
  CHECK(f->disk_type != VHD_TYPE_FIXED);
  u128 d = f->data_offset, t = h->table_offset;
  u128 bat = ((u128)h->max_entries * 4 + 511) / 512 * 512;
  CHECK(vhd_bat_len(h->max_entries) == bat);
  CHECK(d >= VHD_FOOTER_LEN && d + VHD_HEADER_LEN + VHD_OLD_FOOTER_LEN <= fs);
  CHECK(t >= VHD_FOOTER_LEN && t + bat + VHD_OLD_FOOTER_LEN <= fs);
  CHECK(t + bat <= d || d + VHD_HEADER_LEN <= t);
  CHECK((u128)h->max_entries * h->block_size >= size);
}

/* Every BAT entry the input holds, against a recomputation. */
static void
blocks(const uint8_t *p, size_t n, const struct vhd_header *h)
{
  if (h->table_offset >= n)
    return;
  size_t avail = (n - (size_t)h->table_offset) / 4;
  size_t count = avail < h->max_entries ? avail : h->max_entries;
  uint32_t bl = vhd_bitmap_len(h->block_size);
  CHECK(bl % 512 == 0 && (u128)bl * 8 * 512 >= h->block_size);
  for (size_t i = 0; i < count && i < 4096; i++) {
    uint32_t e = vhd_bat_entry(p + h->table_offset, (uint32_t)i);
    bool in = vhd_block_inside(e, h->block_size, n);
    u128 end = (u128)e * 512 + bl + h->block_size;
    CHECK(in == (e != VHD_BAT_UNUSED && end + VHD_OLD_FOOTER_LEN <= n));
  }
}

static void
locators(const uint8_t *p, size_t n, const struct vhd_header *h)
{
  for (int i = 0; i < VHD_LOCATORS; i++) {
    const struct vhd_locator *l = &h->loc[i];
    if (l->offset <= n && l->length <= n - l->offset)
      locator(l->code, p + l->offset, l->length);
  }
}

static void
geometry(const uint8_t *p, size_t n)
{
  if (n < 8)
    return;
  uint64_t size = be64(p);
  uint16_t c;
  uint8_t hd, s;
  vhd_geometry(size, &c, &hd, &s);
  CHECK(hd >= 4 && hd <= 16);
  CHECK(s == 17 || s == 31 || s == 63 || s == 255);
  uint64_t total = size / 512;
  if (total > 65535ull * 16 * 255)
    total = 65535ull * 16 * 255;
  CHECK((uint64_t)c * hd * s <= total);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint8_t *p = malloc(size ? size : 1);
  CHECK(p);
  memcpy(p, data, size);

  struct vhd_footer f, f_old;
  struct vhd_header h;
  bool have_f = footer(p, size, VHD_FOOTER_LEN, &f);
  bool have_old = footer(p, size, VHD_OLD_FOOTER_LEN, &f_old);
  if (have_f) {
    CHECK(have_old && footer_eq(&f, &f_old));
  }
  bool have_h = header(p, size, VHD_FOOTER_LEN, &h);
  if (!have_h)
    have_h = header(p, size, 0, &h);

  uint64_t tail = size >= 8 ? be64(p + size - 8) : 0;
  if (have_old) {
    layout(&f_old, NULL, size);
    layout(&f_old, NULL, tail);
    if (have_h) {
      layout(&f_old, &h, size);
      layout(&f_old, &h, tail);
    }
  }
  if (have_h) {
    blocks(p, size, &h);
    locators(p, size, &h);
  }

  static const uint32_t codes[] = { VHD_LOC_MACX, VHD_LOC_W2RU, VHD_LOC_W2KU,
                                    VHD_LOC_NONE };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    locator(codes[i], p, size);
  struct vhd_batmap bm;
  if (vhd_batmap_decode(p, size, &bm) == 0)
    CHECK(size >= 24 && be64(p + 8) == bm.offset &&
          be32(p + 16) == bm.sectors);
  utf16(p, size);
  parent_name(p, size);
  bitmap(p, size);
  geometry(p, size);
  free(p);
  return 0;
}
