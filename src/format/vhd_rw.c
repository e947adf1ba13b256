/* vhd_rw.c: writing a VHD in place (fixed, dynamic, differencing), as
 * tapdisk does on a host that receives a disk: `serve` of a VHD read-
 * write and `copy` into an existing VHD both come here, through the
 * format layer's pwrite, zero, trim and flush.
 *
 * - A WRITE into an unallocated block allocates it at the end of the
 *   file, where the footer was: the footer moves past the new block, the
 *   block's bitmap gets the bits of the sectors written, and the BAT
 *   entry points at it. The order (docs/internals.md, "Writing a VHD in
 *   place", says why each state a crash can leave is a valid VHD):
 *   1. the footer at the new end of the file, then fdatasync: the file
 *      always ends with a footer, and the old one is overwritten only
 *      once the new one is durable;
 *   2. the block's bitmap (over the old footer) and data, then
 *      fdatasync: both are durable before anything points at them;
 *   3. the BAT entry (4 bytes of one sector). FLUSH or FUA makes it
 *      durable; until then a crash loses the block, never shows it
 *      wrong: space the BAT does not point at is lost space.
 *   The footer's bytes do not change, only its place.
 * - A write into an allocated block writes the data first, then sets the
 *   bits (a set bit never covers bytes not yet written). Whole sectors
 *   are written without the block's lock (no other request's bytes share
 *   them), which is then held only to change the bitmap.
 * - A partial sector whose bit is clear is read from below (zeroes in a
 *   dynamic disk, the parent in a differencing one) and written whole; a
 *   differencing disk copies nothing else from its parent.
 * - Zeroing: nothing in an unallocated block of a dynamic disk; in an
 *   allocated one whole sectors are punched out of the file, then lose
 *   their bit (a clear bit reads as zeroes; qemu, which reads blocks
 *   without their bitmaps, reads the punched zeroes), unless the caller
 *   forbids a hole; partial sectors whose bit is set get zeroes. A
 *   differencing disk writes zeroes (a clear bit would read the parent).
 *   Trim does the same as zeroing where it is cheap, nothing elsewhere.
 * - Blocks are never freed: a block whose every bit is clear stays
 *   allocated (freeing one would move others or leave lost space).
 *
 * Locks: a block's writers take turns on its stripe of block_lock to
 * allocate it (so that two writers of one new block allocate it once),
 * to change its bitmap (read, changed and written under it) and to write
 * a partial sector; allocation also takes alloc_lock, which guards the
 * end of the file. Order: block, then alloc. Readers take neither: the
 * BAT entry is stored (atomically) after its block is on disk, and a bit
 * is set after its sector is. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/common.h"
#include "format/vhd_priv.h"
#include "util/fileio.h"

/* Locks for blocks: writers of blocks b and b + 64 wait for each other
 * now and then, which costs less than a mutex per block of a 2 TiB disk. */
#define VHD_RW_STRIPES 64

struct vhd_rw {
  pthread_mutex_t alloc_lock;
  uint64_t next;                  /* where the next block goes: the
                                     footer's place (sector-aligned) */
  uint8_t footer[VHD_FOOTER_LEN]; /* the footer, rewritten as it is */
  pthread_mutex_t block_lock[VHD_RW_STRIPES];
};

static const uint8_t rw_zeroes[64 << 10];

static bool
rw_bit(const uint8_t *bm, uint32_t s)
{
  return bm[s / 8] & (0x80u >> (s % 8));
}

static uint32_t
rw_bat(const struct vhd_level *l, uint32_t b)
{
  return __atomic_load_n(&l->bat[b], __ATOMIC_ACQUIRE);
}

static bool
rw_full(const struct vhd_level *l, uint32_t b)
{
  return __atomic_load_n(&l->full[b], __ATOMIC_RELAXED);
}

static int
rw_sync(int fd)
{
  return fdatasync(fd) < 0 ? -errno : 0;
}

/* len bytes from buf, or zeroes when buf is NULL, at host offset off. */
static int
rw_put(int fd, const uint8_t *buf, uint64_t len, uint64_t off)
{
  if (buf)
    return file_pwrite_full(fd, buf, len, off);
  while (len > 0) {
    size_t n = len < sizeof rw_zeroes ? (size_t)len : sizeof rw_zeroes;
    int r = file_pwrite_full(fd, rw_zeroes, n, off);
    if (r < 0)
      return r;
    off += n;
    len -= n;
  }
  return 0;
}

/* Makes len bytes at host offset off read as zeroes: punched where the
 * file system can, else written. */
static int
rw_punch(int fd, uint64_t len, uint64_t off)
{
  int r = file_punch_or_zero(fd, off, len);
  return r == -EOPNOTSUPP ? rw_put(fd, NULL, len, off) : r;
}

static int
rw_sector_cmp(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Whether [off, off + len) meets [o2, o2 + l2). */
static bool
rw_meets(uint64_t off, uint64_t len, uint64_t o2, uint64_t l2)
{
  return off < o2 + l2 && o2 < off + len;
}

/* A writer puts bitmap bits and data where the BAT says; where that is
 * the header, the BAT, a parent locator or another block, it would
 * write over them (info --check calls these errors; a reader only reads
 * wrong bytes). So an image open for writing must have none. */
static int
rw_check_overlaps(const struct image *img, const struct vhd_level *l,
                  char *err, size_t errlen)
{
  uint32_t *s = malloc(((size_t)l->nblocks + 1) * sizeof *s);
  if (s == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  size_t n = 0;
  for (uint32_t b = 0; b < l->nblocks; b++)
    if (l->bat[b] != VHD_BAT_UNUSED)
      s[n++] = l->bat[b];
  qsort(s, n, sizeof *s, rw_sector_cmp);
  uint64_t blk = (uint64_t)l->bitmap_len + l->block_size;
  struct { uint64_t off, len; const char *what; } t[4 + VHD_LOCATORS] = {
    { 0, VHD_FOOTER_LEN, "the footer copy" },
    { l->f.data_offset, VHD_HEADER_LEN, "the dynamic header" },
    { l->h.table_offset, vhd_bat_len(l->h.max_entries), "the BAT" },
    { l->file_size - l->footer_len, l->footer_len, "the footer" },
  };
  int nt = 4;
  for (int i = 0; i < VHD_LOCATORS; i++)
    if (l->h.loc[i].code != VHD_LOC_NONE && l->h.loc[i].length > 0)
      t[nt++] = (typeof(t[0])){ l->h.loc[i].offset, l->h.loc[i].length,
                                "a parent locator's data" };
  int r = 0;
  for (size_t i = 0; i < n && r == 0; i++) {
    uint64_t off = (uint64_t)s[i] * VHD_SECTOR;
    const char *what = NULL;
    if (i > 0 && off < (uint64_t)s[i - 1] * VHD_SECTOR + blk)
      what = "another block";
    for (int j = 0; j < nt && what == NULL; j++)
      if (rw_meets(off, blk, t[j].off, t[j].len))
        what = t[j].what;
    if (what)
      r = fmt_fail(err, errlen, -EINVAL, "%s: the block at sector %u "
                   "overlaps %s: writing it would damage the image "
                   "(nbdflow info --check %s says more); it can be read, "
                   "not written", img->path, s[i], what, img->path);
  }
  free(s);
  return r;
}

int
vhd_rw_init(struct image *img, struct vhd_priv *p, char *err, size_t errlen)
{
  struct vhd_level *l = &p->lv[0];
  struct vhd_rw *rw = calloc(1, sizeof *rw);
  if (rw == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  pthread_mutex_init(&rw->alloc_lock, NULL);
  for (int i = 0; i < VHD_RW_STRIPES; i++)
    pthread_mutex_init(&rw->block_lock[i], NULL);
  p->rw = rw;
  if (l->block_size == 0)
    return 0; /* fixed: raw bytes before the footer */
  /* The footer keeps its bytes as they are; an old 511-byte one is
   * written in today's 512. */
  if (l->footer_len == VHD_FOOTER_LEN) {
    int r = vhd_lv_read(l, rw->footer, VHD_FOOTER_LEN,
                        l->file_size - VHD_FOOTER_LEN);
    if (r < 0)
      return fmt_fail(err, errlen, r, "%s: reading the footer: %s",
                      img->path, strerror(-r));
  } else {
    vhd_footer_encode(&l->f, rw->footer);
  }
  uint64_t at = l->file_size - l->footer_len;
  rw->next = (at + VHD_SECTOR - 1) / VHD_SECTOR * VHD_SECTOR;
  return rw_check_overlaps(img, l, err, errlen);
}

void
vhd_rw_free(struct vhd_priv *p)
{
  struct vhd_rw *rw = p->rw;
  if (rw == NULL)
    return;
  pthread_mutex_destroy(&rw->alloc_lock);
  for (int i = 0; i < VHD_RW_STRIPES; i++)
    pthread_mutex_destroy(&rw->block_lock[i]);
  free(rw);
  p->rw = NULL;
}

/* Block b's bitmap into a new buffer: all clear for an unallocated block
 * (entry e unused), else as on disk. NULL with *r set on failure. */
static uint8_t *
rw_bitmap(const struct vhd_level *l, uint32_t e, int *r)
{
  uint8_t *bm = calloc(1, l->bitmap_len);
  if (bm == NULL) {
    *r = -ENOMEM;
    return NULL;
  }
  *r = e == VHD_BAT_UNUSED
         ? 0
         : vhd_lv_read(l, bm, l->bitmap_len, (uint64_t)e * VHD_SECTOR);
  if (*r < 0) {
    free(bm);
    return NULL;
  }
  return bm;
}

/* Marks block b full when bm sets every sector of the disk in it. */
static void
rw_mark_full(struct vhd_level *l, uint32_t b, const uint8_t *bm)
{
  uint32_t lim = vhd_block_sectors(l, b);
  bool set;
  if (vhd_bitmap_run(bm, 0, lim, &set) == lim && set)
    __atomic_store_n(&l->full[b], 1, __ATOMIC_RELAXED);
}

/* Sets (or clears) the bits of sectors [s0, s1) in bm and writes the
 * bytes that changed to block entry e's bitmap on disk. */
static int
rw_bits(struct vhd_level *l, uint32_t b, uint32_t e, uint8_t *bm,
        uint32_t s0, uint32_t s1, bool set)
{
  bool changed = false;
  for (uint32_t s = s0; s < s1; s++) {
    uint8_t m = (uint8_t)(0x80u >> (s % 8));
    if (((bm[s / 8] & m) != 0) != set) {
      bm[s / 8] = (uint8_t)(set ? bm[s / 8] | m : bm[s / 8] & ~m);
      changed = true;
    }
  }
  if (!changed)
    return 0;
  if (!set) /* before the bits go: a reader of a full block skips them */
    __atomic_store_n(&l->full[b], 0, __ATOMIC_RELAXED);
  uint32_t first = s0 / 8, last = (s1 - 1) / 8;
  int r = file_pwrite_full(l->fd, bm + first, last - first + 1,
                           (uint64_t)e * VHD_SECTOR + first);
  if (r == 0 && set)
    rw_mark_full(l, b, bm);
  return r;
}

/* Allocates block b at the end of the file with bitmap bm and len bytes
 * of data (src; NULL: zeroes, which the new block holds already) at ws
 * in it. Called with the block's lock held. */
static int
rw_allocate(struct vhd_priv *p, uint32_t b, const uint8_t *bm,
            const uint8_t *src, uint64_t len, uint64_t ws)
{
  struct vhd_level *l = &p->lv[0];
  struct vhd_rw *rw = p->rw;
  int r;
  pthread_mutex_lock(&rw->alloc_lock);
  uint64_t pos = rw->next;
  uint64_t end = pos + l->bitmap_len + l->block_size;
  if (end / VHD_SECTOR >= VHD_BAT_UNUSED) {
    r = -EFBIG; /* the BAT's sector numbers are 32-bit */
    goto out;
  }
  /* 1. The footer at the new end, durable before the old one goes. */
  r = file_pwrite_full(l->fd, rw->footer, VHD_FOOTER_LEN, end);
  if (r == 0)
    r = rw_sync(l->fd);
  bool moved = r == 0; /* the image now ends at end */
  /* 2. Bitmap and data (the rest of the block is past the old end of
   * the file, so it reads as zeroes), durable before the BAT entry. */
  if (r == 0)
    r = file_pwrite_full(l->fd, bm, l->bitmap_len, pos);
  if (r == 0 && src)
    r = file_pwrite_full(l->fd, src, len, pos + l->bitmap_len + ws);
  if (r == 0)
    r = rw_sync(l->fd);
  /* 3. The BAT entry. */
  uint8_t be[4] = { (uint8_t)(pos / VHD_SECTOR >> 24),
                    (uint8_t)(pos / VHD_SECTOR >> 16),
                    (uint8_t)(pos / VHD_SECTOR >> 8),
                    (uint8_t)(pos / VHD_SECTOR) };
  if (r == 0)
    r = file_pwrite_full(l->fd, be, sizeof be,
                         l->h.table_offset + 4 * (uint64_t)b);
  if (r < 0) {
    /* Once the footer has moved, [pos, end) may hold this write's bytes:
     * the next block must not be put there, where its unwritten sectors
     * are taken to read as zeroes. The space is lost, as after a crash
     * at this step (info --check counts it). Before that, nothing
     * moved, and the next allocation rewrites the same footer. */
    if (moved) {
      rw->next = end;
      l->file_size = end + VHD_FOOTER_LEN;
    }
    goto out;
  }
  rw->next = end;
  l->file_size = end + VHD_FOOTER_LEN;
  rw_mark_full(l, b, bm);
  __atomic_store_n(&l->bat[b], (uint32_t)(pos / VHD_SECTOR),
                   __ATOMIC_RELEASE);
out:
  pthread_mutex_unlock(&rw->alloc_lock);
  return r;
}

/* Whole sectors into allocated block entry e: the data needs no lock
 * (no other request's bytes share its sectors), only the bits do; a full
 * block takes no lock at all. */
static int
rw_write_whole(struct vhd_priv *p, uint32_t b, uint32_t e,
               const uint8_t *buf, uint64_t n, uint64_t in)
{
  struct vhd_level *l = &p->lv[0];
  int r = rw_put(l->fd, buf, n, (uint64_t)e * VHD_SECTOR + l->bitmap_len +
                                  in);
  /* After the data, and ordered with it: see rw_clear_block. */
  if (r < 0 || __atomic_load_n(&l->full[b], __ATOMIC_SEQ_CST))
    return r;
  pthread_mutex_t *lk = &p->rw->block_lock[b % VHD_RW_STRIPES];
  pthread_mutex_lock(lk);
  uint8_t *bm = rw_full(l, b) ? NULL : rw_bitmap(l, e, &r);
  if (bm)
    r = rw_bits(l, b, e, bm, (uint32_t)(in / VHD_SECTOR),
                (uint32_t)((in + n) / VHD_SECTOR), true);
  pthread_mutex_unlock(lk);
  free(bm);
  return r;
}

/* Writes [off, off + n), inside block b, from buf (NULL: zeroes). */
static int
rw_write_block(struct vhd_priv *p, uint32_t b, const uint8_t *buf,
               uint64_t n, uint64_t off)
{
  struct vhd_level *l = &p->lv[0];
  pthread_mutex_t *lk = &p->rw->block_lock[b % VHD_RW_STRIPES];
  uint64_t base = (uint64_t)b * l->block_size;
  uint64_t in = off - base, ws = in, we = in + n;
  uint8_t *bm = NULL, *tmp = NULL;
  const uint8_t *src = buf;
  int r = 0;
  uint32_t e = rw_bat(l, b);
  if (e != VHD_BAT_UNUSED && in % VHD_SECTOR == 0 && n % VHD_SECTOR == 0)
    return rw_write_whole(p, b, e, buf, n, in);
  pthread_mutex_lock(lk);
  e = rw_bat(l, b);
  bool full = e != VHD_BAT_UNUSED && rw_full(l, b);
  if (!full && (bm = rw_bitmap(l, e, &r)) == NULL)
    goto out;
  /* A partial sector whose bit is clear: the rest of it comes from
   * below, and the sector is written whole. */
  if (ws % VHD_SECTOR && !full && !rw_bit(bm, (uint32_t)(ws / VHD_SECTOR)))
    ws -= ws % VHD_SECTOR;
  if (we % VHD_SECTOR && !full && !rw_bit(bm, (uint32_t)(we / VHD_SECTOR)))
    we += VHD_SECTOR - we % VHD_SECTOR;
  if (ws != in || we != in + n) {
    if ((tmp = malloc(we - ws)) == NULL) {
      r = -ENOMEM;
      goto out;
    }
    if (ws != in)
      r = vhd_read_below(p, 0, tmp, VHD_SECTOR, base + ws);
    if (r == 0 && we != in + n)
      r = vhd_read_below(p, 0, tmp + (we - ws - VHD_SECTOR), VHD_SECTOR,
                         base + we - VHD_SECTOR);
    if (r < 0)
      goto out;
    if (buf)
      memcpy(tmp + (in - ws), buf, n);
    else
      memset(tmp + (in - ws), 0, n);
    src = tmp;
  }
  uint32_t s0 = (uint32_t)(ws / VHD_SECTOR);
  uint32_t s1 = (uint32_t)((we + VHD_SECTOR - 1) / VHD_SECTOR);
  if (e == VHD_BAT_UNUSED) {
    for (uint32_t s = s0; s < s1; s++)
      bm[s / 8] = (uint8_t)(bm[s / 8] | (0x80u >> (s % 8)));
    r = rw_allocate(p, b, bm, src, we - ws, ws);
    goto out;
  }
  r = rw_put(l->fd, src, we - ws,
             (uint64_t)e * VHD_SECTOR + l->bitmap_len + ws);
  if (r == 0 && !full)
    r = rw_bits(l, b, e, bm, s0, s1, true);
out:
  pthread_mutex_unlock(lk);
  free(bm);
  free(tmp);
  return r;
}

/* In an allocated block b of a dynamic disk, makes [off, off + n) read
 * as zeroes: its whole sectors are punched out of the file and lose
 * their bits (a clear bit reads as zeroes, and the file's bytes under it
 * are zeroes too, for readers that ignore bitmaps); partial sectors whose
 * bit is set get zeroes when edges (else, a trim, they stay). */
static int
rw_clear_block(struct vhd_priv *p, uint32_t b, uint64_t n, uint64_t off,
               bool edges)
{
  struct vhd_level *l = &p->lv[0];
  pthread_mutex_t *lk = &p->rw->block_lock[b % VHD_RW_STRIPES];
  uint64_t in = off - (uint64_t)b * l->block_size, end = in + n;
  uint8_t *bm = NULL;
  int r = 0;
  pthread_mutex_lock(lk);
  uint32_t e = rw_bat(l, b);
  if (e == VHD_BAT_UNUSED || (bm = rw_bitmap(l, e, &r)) == NULL)
    goto out;
  uint64_t data = (uint64_t)e * VHD_SECTOR + l->bitmap_len;
  uint64_t c0 = (in + VHD_SECTOR - 1) / VHD_SECTOR, c1 = end / VHD_SECTOR;
  if (c0 > c1) { /* inside one sector */
    if (edges && rw_bit(bm, (uint32_t)(in / VHD_SECTOR)))
      r = rw_put(l->fd, NULL, n, data + in);
    goto out;
  }
  if (edges && in % VHD_SECTOR && rw_bit(bm, (uint32_t)(in / VHD_SECTOR)))
    r = rw_put(l->fd, NULL, c0 * VHD_SECTOR - in, data + in);
  if (r == 0 && edges && end % VHD_SECTOR && rw_bit(bm, (uint32_t)c1))
    r = rw_put(l->fd, NULL, end - c1 * VHD_SECTOR, data + c1 * VHD_SECTOR);
  /* The data first, then the bits: every state between reads as zeroes,
   * to a reader that ignores bitmaps (qemu) too. The block stops being
   * full before the punch: a write of whole sectors that still finds it
   * full afterwards (rw_write_whole, no lock) put its data before the
   * punch, which removes it; one that finds it not full waits for this
   * lock and sets its bits after these are cleared. Else such a write
   * could land after the punch, skip its bits, and leave its data under
   * bits cleared here: zeroes to us, the data to qemu. */
  if (r == 0 && c0 < c1) {
    __atomic_store_n(&l->full[b], 0, __ATOMIC_SEQ_CST);
    r = rw_punch(l->fd, (c1 - c0) * VHD_SECTOR, data + c0 * VHD_SECTOR);
  }
  if (r == 0 && c0 < c1)
    r = rw_bits(l, b, e, bm, (uint32_t)c0, (uint32_t)c1, false);
out:
  pthread_mutex_unlock(lk);
  free(bm);
  return r;
}

enum rw_kind { RW_WRITE, RW_ZERO_WRITE, RW_CLEAR, RW_TRIM };

/* Runs kind over [off, off + len) block by block. */
static int
rw_blocks(struct vhd_priv *p, enum rw_kind kind, const uint8_t *buf,
          uint64_t len, uint64_t off)
{
  struct vhd_level *l = &p->lv[0];
  while (len > 0) {
    uint32_t b = (uint32_t)(off / l->block_size);
    uint64_t n = (uint64_t)(b + 1) * l->block_size - off;
    if (n > len)
      n = len;
    int r;
    if (kind == RW_WRITE || kind == RW_ZERO_WRITE)
      r = rw_write_block(p, b, buf, n, off);
    else
      r = rw_clear_block(p, b, n, off, kind == RW_CLEAR);
    if (r < 0)
      return r;
    if (buf)
      buf += n;
    off += n;
    len -= n;
  }
  return 0;
}

static int
rw_check(struct image *img, uint64_t len, uint64_t off)
{
  if (!img->writable)
    return -EROFS;
  if (off > img->size || len > img->size - off)
    return -EINVAL;
  return 0;
}

static int
rw_done(struct image *img, int r, unsigned flags)
{
  if (r == 0 && (flags & IMAGE_FUA))
    r = vhd_rw_flush(img);
  return r;
}

int
vhd_rw_pwrite(struct image *img, const void *buf, uint64_t len, uint64_t off,
              unsigned flags, char *why, size_t wl)
{
  (void)why, (void)wl; /* every failure here is the file's errno */
  struct vhd_priv *p = img->priv;
  int r = rw_check(img, len, off);
  if (r < 0)
    return r;
  if (p->lv[0].block_size == 0)
    r = file_pwrite_full(p->lv[0].fd, buf, len, off);
  else
    r = rw_blocks(p, RW_WRITE, buf, len, off);
  return rw_done(img, r, flags);
}

int
vhd_rw_zero(struct image *img, uint64_t len, uint64_t off, unsigned flags,
            char *why, size_t wl)
{
  (void)why, (void)wl;
  struct vhd_priv *p = img->priv;
  struct vhd_level *l = &p->lv[0];
  bool may_trim = flags & IMAGE_MAY_TRIM;
  int r = rw_check(img, len, off);
  if (r < 0)
    return r;
  /* Cheaper than writing only where nothing need be written. */
  if ((flags & IMAGE_FAST) &&
      (!may_trim || l->f.disk_type == VHD_TYPE_DIFF))
    return -ENOTSUP;
  if (l->block_size == 0) {
    r = may_trim ? file_punch_or_zero(l->fd, off, len) : -EOPNOTSUPP;
    if (r == -EOPNOTSUPP)
      r = rw_put(l->fd, NULL, len, off);
  } else if (l->f.disk_type == VHD_TYPE_DIFF) {
    r = rw_blocks(p, RW_ZERO_WRITE, NULL, len, off);
  } else if (may_trim) {
    r = rw_blocks(p, RW_CLEAR, NULL, len, off);
  } else {
    /* No hole: the range must be provisioned (the spec's NO_HOLE), so
     * an unallocated block is allocated first, its sectors' bits set,
     * and then every block gets zeroes written over the range, so that
     * the file holds them too. */
    while (len > 0 && r == 0) {
      uint32_t b = (uint32_t)(off / l->block_size);
      uint64_t n = (uint64_t)(b + 1) * l->block_size - off;
      if (n > len)
        n = len;
      if (rw_bat(l, b) == VHD_BAT_UNUSED)
        r = rw_write_block(p, b, NULL, n, off);
      if (r == 0)
        r = rw_write_block(p, b, NULL, n, off);
      off += n;
      len -= n;
    }
  }
  return rw_done(img, r, flags);
}

int
vhd_rw_trim(struct image *img, uint64_t len, uint64_t off, unsigned flags,
            char *why, size_t wl)
{
  (void)why, (void)wl;
  struct vhd_priv *p = img->priv;
  struct vhd_level *l = &p->lv[0];
  int r = rw_check(img, len, off);
  if (r < 0)
    return r;
  if (l->block_size == 0) {
    r = file_punch_or_zero(l->fd, off, len);
    if (r == -EOPNOTSUPP)
      r = 0; /* advisory */
  } else if (l->f.disk_type != VHD_TYPE_DIFF) {
    r = rw_blocks(p, RW_TRIM, NULL, len, off);
  } /* differencing: a clear bit would read the parent */
  return rw_done(img, r, flags);
}

int
vhd_rw_flush(struct image *img)
{
  struct vhd_priv *p = img->priv;
  if (!img->writable)
    return 0; /* nothing was written */
  return rw_sync(p->lv[0].fd);
}
