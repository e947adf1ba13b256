/* vhd_check.c: `info --check` of a VHD. The image is opened in check
 * mode (image_opts.check: bad checksums, a footer copy that disagrees and
 * BAT entries outside the file are reported here instead of refused), and
 * everything the file holds is laid out as regions: the footer copy, the
 * dynamic header, the BAT, XenServer's batmap, the parent locators' data,
 * each block (bitmap and data) and the footer.
 *
 * Errors (the image is wrong: a reader could read wrong bytes, or a
 * writer overwrite one structure with another): a bad checksum, a footer
 * copy that differs from the footer, a block past the end of the file,
 * two regions that overlap (two BAT entries pointing at one block, a
 * block over the BAT). Notes (valid, but worth knowing): space that
 * nothing points at (what a crash during an allocation leaves), an
 * allocated block whose bitmap sets no sector, bits set past the end of
 * the disk, a used BAT entry past the blocks the disk needs. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/common.h"
#include "format/vhd_priv.h"

struct ck_region {
  uint64_t off, len;
  char what[48];
};

struct ck {
  struct image_check *c;
  const char *path;
  struct ck_region *r; /* owned */
  size_t n, cap;
};

static void __attribute__((format(printf, 3, 4)))
ck_say(struct ck *k, bool error, const char *fmt, ...)
{
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (error)
    k->c->errors++;
  else
    k->c->notes++;
  if (k->c->report)
    k->c->report(k->c->ctx, error, msg);
}

static void __attribute__((format(printf, 4, 5)))
ck_add(struct ck *k, uint64_t off, uint64_t len, const char *fmt, ...)
{
  if (len == 0 || k->n == k->cap)
    return;
  struct ck_region *r = &k->r[k->n++];
  r->off = off;
  r->len = len;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->what, sizeof r->what, fmt, ap);
  va_end(ap);
}

/* The footer copy at 0 against the footer at the end. */
static void
ck_footer_copy(struct ck *k, const struct vhd_level *l)
{
  uint8_t copy[VHD_FOOTER_LEN], end[VHD_FOOTER_LEN];
  struct vhd_footer c;
  char why[160];
  if (vhd_lv_read(l, copy, sizeof copy, 0) < 0 ||
      vhd_footer_decode(copy, sizeof copy, &c, why, sizeof why) < 0) {
    ck_say(k, true, "no footer copy at offset 0");
    return;
  }
  if (!c.checksum_ok)
    ck_say(k, true, "the footer copy at offset 0 has a wrong checksum "
           "(0x%08x)", c.checksum);
  bool have_end = l->footer_len == VHD_FOOTER_LEN &&
                  vhd_lv_read(l, end, sizeof end,
                              l->file_size - VHD_FOOTER_LEN) == 0;
  if (have_end && memcmp(copy, end, sizeof end) == 0)
    return;
  const char *field = c.current_size != l->f.current_size ? "current size"
                      : c.disk_type != l->f.disk_type     ? "disk type"
                      : c.data_offset != l->f.data_offset ? "header offset"
                      : memcmp(c.uuid, l->f.uuid, 16)     ? "UUID"
                      : c.timestamp != l->f.timestamp     ? "timestamp"
                                                          : NULL;
  char other[64];
  if (field == NULL && have_end) {
    /* Another field: name the first byte that differs (64-67: the
     * checksum, which differs when either copy was damaged). */
    size_t i = 0;
    while (i < sizeof end && copy[i] == end[i])
      i++;
    snprintf(other, sizeof other, "byte %zu of 512%s", i,
             i >= 64 && i < 68 ? " (the checksum)" : "");
    field = other;
  }
  if (field)
    ck_say(k, true, "the footer copy at offset 0 differs from the footer "
           "at the end: %s", field);
}

/* The BAT as on disk: every entry, past the disk's size too. */
static int
ck_bat(struct ck *k, const struct vhd_level *l)
{
  uint64_t len = vhd_bat_len(l->h.max_entries);
  uint8_t *raw = malloc(len ? len : 1);
  if (raw == NULL)
    return -ENOMEM;
  int r = vhd_lv_read(l, raw, len, l->h.table_offset);
  if (r < 0) {
    free(raw);
    return r;
  }
  uint64_t data_end = l->file_size - l->footer_len;
  uint64_t block = (uint64_t)l->bitmap_len + l->block_size;
  uint32_t past = 0;
  for (uint32_t i = 0; i < l->h.max_entries; i++) {
    uint32_t e = vhd_bat_entry(raw, i);
    if (e == VHD_BAT_UNUSED)
      continue;
    uint64_t off = (uint64_t)e * VHD_SECTOR;
    if (off > data_end || data_end - off < block)
      ck_say(k, true, "BAT entry %u points at sector %u: its block ends at "
             "%llu, past the end of the data (%llu bytes, then the "
             "footer)", i, e, (unsigned long long)(off + block),
             (unsigned long long)data_end);
    else
      ck_add(k, off, block, "block %u", i);
    past += i >= l->nblocks;
  }
  if (past)
    ck_say(k, false, "%u used BAT entries past the %u blocks the disk "
           "needs", past, l->nblocks);
  free(raw);
  return 0;
}

/* Every bitmap of an allocated block: one that sets nothing, and bits
 * past the end of the disk. */
static int
ck_bitmaps(struct ck *k, const struct vhd_level *l)
{
  uint8_t *bm = malloc(l->bitmap_len);
  if (bm == NULL)
    return -ENOMEM;
  uint32_t empty = 0, beyond = 0;
  uint32_t spb = l->block_size / VHD_SECTOR;
  for (uint32_t b = 0; b < l->nblocks; b++) {
    uint32_t e = l->bat[b];
    if (e == VHD_BAT_UNUSED ||
        !vhd_block_inside(e, l->block_size, l->file_size))
      continue;
    int r = vhd_lv_read(l, bm, l->bitmap_len, (uint64_t)e * VHD_SECTOR);
    if (r < 0) {
      free(bm);
      return r;
    }
    uint32_t lim = vhd_block_sectors(l, b);
    bool set;
    if (vhd_bitmap_run(bm, 0, lim, &set) == lim && !set)
      empty++;
    if (lim < spb && (vhd_bitmap_run(bm, lim, spb, &set) != spb - lim || set))
      beyond++;
  }
  if (empty)
    ck_say(k, false, "%u allocated blocks set no sector in their bitmap",
           empty);
  if (beyond)
    ck_say(k, false, "the last block's bitmap sets sectors past the end of "
           "the disk");
  free(bm);
  return 0;
}

static int
ck_region_cmp(const void *a, const void *b)
{
  const struct ck_region *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Overlaps are errors; space nothing points at is lost. */
static void
ck_layout(struct ck *k, uint64_t file_size)
{
  qsort(k->r, k->n, sizeof *k->r, ck_region_cmp);
  uint64_t hi = 0, lost = 0, pieces = 0;
  const struct ck_region *top = NULL;
  uint32_t overlaps = 0;
  for (size_t i = 0; i < k->n; i++) {
    const struct ck_region *r = &k->r[i];
    if (r->off < hi && top) {
      if (overlaps++ < 10)
        ck_say(k, true, "%s (bytes %llu-%llu) overlaps %s (bytes "
               "%llu-%llu)", r->what, (unsigned long long)r->off,
               (unsigned long long)(r->off + r->len - 1), top->what,
               (unsigned long long)top->off,
               (unsigned long long)(top->off + top->len - 1));
    } else if (r->off > hi) {
      lost += r->off - hi;
      pieces++;
    }
    if (r->off + r->len > hi) {
      hi = r->off + r->len;
      top = r;
    }
  }
  if (overlaps > 10)
    ck_say(k, true, "%u more overlaps", overlaps - 10);
  if (hi < file_size) {
    lost += file_size - hi;
    pieces++;
  }
  k->c->lost = lost;
  if (lost)
    ck_say(k, false, "%llu bytes in %llu pieces that nothing points at "
           "(lost space)", (unsigned long long)lost,
           (unsigned long long)pieces);
}

/* The space a locator reserves: its data space, in sectors or (from some
 * writers) in bytes, as ocaml-vhd and VirtualBox tell them apart (under
 * 512: sectors); its data length when that is more or the space would
 * run past the file. */
static uint64_t
ck_locator_space(const struct vhd_locator *loc, uint64_t fs)
{
  uint64_t space = loc->space < VHD_SECTOR
                     ? (uint64_t)loc->space * VHD_SECTOR
                     : loc->space;
  if (space < loc->length || fs - loc->offset < space)
    return loc->length;
  return space;
}

/* The regions of a dynamic or differencing disk besides its blocks. */
static void
ck_tables(struct ck *k, const struct vhd_level *l)
{
  uint64_t fs = l->file_size;
  ck_add(k, 0, VHD_FOOTER_LEN, "the footer copy");
  ck_add(k, l->f.data_offset, VHD_HEADER_LEN, "the dynamic header");
  uint64_t bat_end = l->h.table_offset + vhd_bat_len(l->h.max_entries);
  ck_add(k, l->h.table_offset, bat_end - l->h.table_offset, "the BAT");
  uint8_t sec[VHD_SECTOR];
  struct vhd_batmap bm;
  if (bat_end + VHD_SECTOR <= fs &&
      vhd_lv_read(l, sec, sizeof sec, bat_end) == 0 &&
      vhd_batmap_decode(sec, sizeof sec, &bm) == 0) {
    ck_add(k, bat_end, VHD_SECTOR, "the batmap header");
    uint64_t len = (uint64_t)bm.sectors * VHD_SECTOR;
    if (bm.offset <= fs && fs - bm.offset >= len)
      ck_add(k, bm.offset, len, "the batmap");
  }
  for (int i = 0; i < VHD_LOCATORS; i++) {
    const struct vhd_locator *loc = &l->h.loc[i];
    if (loc->code == VHD_LOC_NONE || loc->length == 0)
      continue;
    if (loc->offset > fs || fs - loc->offset < loc->length)
      ck_say(k, true, "parent locator %d's data (%u bytes at %llu) lies "
             "past the end of the file", i + 1, loc->length,
             (unsigned long long)loc->offset);
    else
      ck_add(k, loc->offset, ck_locator_space(loc, fs), "parent locator %d",
             i + 1);
  }
  ck_add(k, fs - l->footer_len, l->footer_len, "the footer");
}

int
vhd_check(struct image *img, struct image_check *c)
{
  struct vhd_priv *p = img->priv;
  const struct vhd_level *l = &p->lv[0];
  struct ck k = { .c = c, .path = img->path };
  int r = 0;
  if (!l->f.checksum_ok)
    ck_say(&k, true, "the footer's checksum 0x%08x is wrong", l->f.checksum);
  if (l->block_size == 0) {
    uint64_t lost = l->file_size - l->footer_len - l->size;
    c->lost = lost;
    if (lost)
      ck_say(&k, false, "%llu bytes between the disk and its footer",
             (unsigned long long)lost);
    return 0;
  }
  if (!l->h.checksum_ok)
    ck_say(&k, true, "the dynamic header's checksum 0x%08x is wrong",
           l->h.checksum);
  ck_footer_copy(&k, l);
  k.cap = (size_t)l->h.max_entries + 8 + VHD_LOCATORS;
  k.r = calloc(k.cap, sizeof *k.r);
  if (k.r == NULL)
    return -ENOMEM;
  ck_tables(&k, l);
  r = ck_bat(&k, l);
  if (r == 0)
    r = ck_bitmaps(&k, l);
  if (r == 0)
    ck_layout(&k, l->file_size);
  free(k.r);
  return r;
}
