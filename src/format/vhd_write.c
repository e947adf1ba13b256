/* vhd_write.c: see vhd_write.h. Layout written: footer copy at 0,
 * dynamic header at 512, BAT at 1536, blocks from the first sector after
 * the BAT, footer last. */
#include "format/vhd_write.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "format/common.h"
#include "format/vhd_layout.h"
#include "util/fileio.h"
#include "util/zero.h"

#define VHD_W_HEADER_OFF 512u
#define VHD_W_BAT_OFF 1536u
#define VHD_EPOCH 946684800 /* 2000-01-01 00:00:00 UTC */

struct vhd_writer {
  int fd;                 /* borrowed: the one of the current put */
  uint64_t size;          /* virtual, a multiple of the sector */
  uint64_t end;           /* the source's size: size may be rounded up */
  uint32_t block;
  uint32_t nblocks;
  uint32_t bitmap_len;
  uint8_t *alloc;         /* owned copy, one bit per block; NULL: all */
  uint8_t *bitmap;        /* owned: the bitmap of a whole block */
  struct vhd_footer footer;
  uint64_t pos;           /* next virtual offset expected */
  bool started, done;
};

static bool
vw_allocated(const struct vhd_writer *w, uint32_t b)
{
  return w->alloc == NULL || (w->alloc[b / 8] >> (b % 8) & 1);
}

int
vhd_writer_new(uint64_t size, uint32_t block, const uint8_t *alloc,
               struct vhd_writer **out, char *err, size_t errlen)
{
  if (size > VHD_MAX_SIZE)
    return fmt_fail(err, errlen, -EFBIG,
                   "a disk of %llu bytes is larger than a VHD can hold "
                   "(2040 GiB); copy it as raw",
                   (unsigned long long)size);
  if (block < VHD_MIN_BLOCK || (block & (block - 1)) != 0)
    return fmt_fail(err, errlen, -EINVAL,
                   "VHD block size %u is not a power of two of at least "
                   "512", block);
  struct vhd_writer *w = calloc(1, sizeof *w);
  if (w == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "out of memory");
  w->fd = -1;
  w->end = size;
  w->size = (size + VHD_SECTOR - 1) / VHD_SECTOR * VHD_SECTOR;
  w->block = block;
  /* At least one entry: a header with none is not a VHD to any reader. */
  w->nblocks = (uint32_t)((w->size + block - 1) / block);
  if (w->nblocks == 0)
    w->nblocks = 1;
  w->bitmap_len = vhd_bitmap_len(block);
  w->bitmap = calloc(1, w->bitmap_len);
  size_t abytes = (size_t)w->nblocks / 8 + 1;
  if (alloc != NULL && (w->alloc = malloc(abytes)) != NULL)
    memcpy(w->alloc, alloc, abytes);
  if (w->bitmap == NULL || (alloc != NULL && w->alloc == NULL)) {
    vhd_writer_free(w);
    return fmt_fail(err, errlen, -ENOMEM, "out of memory");
  }
  struct vhd_footer *f = &w->footer;
  f->features = 2;
  f->version = 0x00010000;
  f->data_offset = VHD_W_HEADER_OFF;
  time_t now = time(NULL);
  f->timestamp = now > VHD_EPOCH ? (uint32_t)(now - VHD_EPOCH) : 0;
  /* The creator decides how readers size the disk: qemu takes the CHS
   * geometry (rounded down to whole cylinders) for any creator it does
   * not know, and current_size for XenServer's "tap\0". The disks we
   * write are XenServer's kind (a dynamic VHD for xapi's import), and
   * version 1.0 says no batmap follows the BAT. */
  memcpy(f->creator_app, "tap", 4);
  f->creator_version = 0x00010000;
  f->creator_os = 0x4C6E7578; /* "Lnux" */
  f->original_size = f->current_size = w->size;
  vhd_geometry(w->size, &f->cylinders, &f->heads, &f->sectors);
  f->disk_type = VHD_TYPE_DYNAMIC;
  if (getrandom(f->uuid, sizeof f->uuid, 0) != sizeof f->uuid) {
    vhd_writer_free(w);
    return fmt_fail(err, errlen, -EIO, "no random bytes for the VHD's UUID");
  }
  f->uuid[6] = (uint8_t)((f->uuid[6] & 0x0F) | 0x40); /* version 4 */
  f->uuid[8] = (uint8_t)((f->uuid[8] & 0x3F) | 0x80);
  *out = w;
  return 0;
}

static const uint8_t vw_zeroes[64 << 10];

/* Writes len bytes of p, or of zeroes when p is NULL. */
static int
vw_write(struct vhd_writer *w, const uint8_t *p, uint64_t len)
{
  while (len > 0) {
    size_t n = len > (1u << 20) ? (1u << 20) : (size_t)len;
    if (p == NULL && n > sizeof vw_zeroes)
      n = sizeof vw_zeroes;
    int r = file_write_stream(w->fd, p ? p : vw_zeroes, n);
    if (r < 0)
      return r;
    if (p)
      p += n;
    len -= n;
  }
  return 0;
}

/* Footer copy, header and BAT. */
static int
vw_start(struct vhd_writer *w)
{
  uint8_t foot[VHD_FOOTER_LEN], head[VHD_HEADER_LEN];
  vhd_footer_encode(&w->footer, foot);
  struct vhd_header h = {
    .data_offset = UINT64_MAX,
    .table_offset = VHD_W_BAT_OFF,
    .version = 0x00010000,
    .max_entries = w->nblocks,
    .block_size = w->block,
  };
  vhd_header_encode(&h, head);
  uint64_t bat_len = vhd_bat_len(w->nblocks);
  uint8_t *bat = malloc(bat_len);
  if (bat == NULL)
    return -ENOMEM;
  memset(bat, 0xFF, bat_len);
  uint64_t sector = (VHD_W_BAT_OFF + bat_len) / VHD_SECTOR;
  uint64_t per = (w->bitmap_len + (uint64_t)w->block) / VHD_SECTOR;
  for (uint32_t b = 0; b < w->nblocks; b++) {
    if (!vw_allocated(w, b))
      continue;
    uint32_t s = (uint32_t)sector;
    bat[4 * (size_t)b] = (uint8_t)(s >> 24);
    bat[4 * (size_t)b + 1] = (uint8_t)(s >> 16);
    bat[4 * (size_t)b + 2] = (uint8_t)(s >> 8);
    bat[4 * (size_t)b + 3] = (uint8_t)s;
    sector += per;
  }
  int r = vw_write(w, foot, sizeof foot);
  if (r == 0)
    r = vw_write(w, head, sizeof head);
  if (r == 0)
    r = vw_write(w, bat, bat_len);
  free(bat);
  return r;
}

/* The bitmap of block b: a bit for each sector inside the disk. */
static int
vw_bitmap(struct vhd_writer *w, uint32_t b)
{
  uint64_t left = w->size - (uint64_t)b * w->block;
  uint32_t n = left < w->block ? (uint32_t)(left / VHD_SECTOR)
                               : w->block / VHD_SECTOR;
  memset(w->bitmap, 0, w->bitmap_len);
  memset(w->bitmap, 0xFF, n / 8);
  if (n % 8)
    w->bitmap[n / 8] = (uint8_t)(0xFF << (8 - n % 8));
  return vw_write(w, w->bitmap, w->bitmap_len);
}

int
vhd_writer_put(struct vhd_writer *w, int fd, uint64_t off,
               const uint8_t *buf, uint64_t len, char *err, size_t errlen)
{
  int r;
  w->fd = fd;
  if (off != w->pos || w->done || len > w->end - off)
    return fmt_fail(err, errlen, -EINVAL,
                   "VHD writer: %llu bytes at offset %llu out of order "
                   "(expected offset %llu)", (unsigned long long)len,
                   (unsigned long long)off, (unsigned long long)w->pos);
  if (!w->started) {
    w->started = true;
    if ((r = vw_start(w)) < 0)
      return fmt_fail(err, errlen, r, "writing the VHD's tables");
  }
  while (len > 0) {
    uint32_t b = (uint32_t)(off / w->block);
    uint64_t in = off - (uint64_t)b * w->block;
    uint64_t n = w->block - in < len ? w->block - in : len;
    if (!vw_allocated(w, b)) {
      if (buf && !buf_is_zero(buf, (size_t)n))
        return fmt_fail(err, errlen, -EIO,
                       "data at offset %llu, in a block the source's map "
                       "called empty: the source changed during the copy",
                       (unsigned long long)off);
    } else {
      r = in == 0 ? vw_bitmap(w, b) : 0;
      if (r == 0)
        r = vw_write(w, buf, n);
      /* The last block is whole in the file, past the disk's end too
       * (and past the source's end, when its size was rounded up). */
      if (r == 0 && off + n == w->end && in + n < w->block)
        r = vw_write(w, NULL, w->block - (in + n));
      if (r < 0)
        return fmt_fail(err, errlen, r, "writing block %u", b);
    }
    off += n;
    len -= n;
    if (buf)
      buf += n;
  }
  w->pos = off;
  if (w->pos == w->end) {
    uint8_t foot[VHD_FOOTER_LEN];
    vhd_footer_encode(&w->footer, foot);
    if ((r = vw_write(w, foot, sizeof foot)) < 0)
      return fmt_fail(err, errlen, r, "writing the VHD footer");
    w->done = true;
  }
  return 0;
}

bool
vhd_writer_done(const struct vhd_writer *w)
{
  return w->done;
}

void
vhd_writer_free(struct vhd_writer *w)
{
  if (w == NULL)
    return;
  free(w->alloc);
  free(w->bitmap);
  free(w);
}
