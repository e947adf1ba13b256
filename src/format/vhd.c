/* vhd.c: reading VHD images (fixed, dynamic, differencing chains)
 * through the format layer. The structures are decoded by vhd_layout.c;
 * this file reads the file, follows parents and walks the BAT and the
 * sector bitmaps.
 *
 * Choices:
 * - The footer at the end of the file is the one trusted: it is the one
 *   the spec defines and every writer rewrites it last. The copy at
 *   offset 0 of a dynamic disk must agree with it on what defines the
 *   disk (type, size, header offset, UUID) when its own checksum holds;
 *   a disagreement means an interrupted update or a forged header, so
 *   the image is refused unless --ignore-checksums.
 * - The size is vhd_virtual_size's (current_size, or the CHS geometry
 *   for Virtual PC and old qemu images).
 * - XenServer's batmap is ignored: the BAT and the bitmaps say the same
 *   thing, and nothing may be trusted over them.
 * - A block whose bitmap was seen all set is remembered (full[]): reads
 *   skip its bitmap, and map() can place it without I/O.
 *
 * Thread safety: after open, everything is read-only but full[], whose
 * bytes are set with atomic stores (a lost update only costs a bitmap
 * read). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/common.h"
#include "format/image.h"
#include "format/vhd_layout.h"
#include "format/vhd_priv.h"
#include "util/fileio.h"

/* BAT entries read into memory per image (64 MiB): 2040 GiB of 128 KiB
 * blocks. A header that needs more is refused rather than trusted. */
#define VHD_MAX_ENTRIES (UINT32_C(1) << 24)

int
vhd_lv_read(const struct vhd_level *l, void *buf, size_t len, uint64_t off)
{
  return fmt_read(l->fd, l->io, buf, len, off);
}

/* Only the footer copy that starts a dynamic or differencing disk: a
 * fixed disk is raw bytes with a footer at the end, which a guest can
 * write into its own raw disk, and a probe that believed it would cut
 * the disk short. A fixed VHD is read as one when the format is named. */
static bool
vhd_probe(const uint8_t *head, size_t hl, const uint8_t *tail, size_t tl)
{
  (void)tail, (void)tl;
  return hl >= 8 && memcmp(head, VHD_FOOTER_COOKIE, 8) == 0;
}

/* Reads and checks the footer at the end of the file. */
static int
vhd_read_footer(struct vhd_level *l, const struct image_opts *o, char *err,
                size_t errlen)
{
  uint8_t buf[VHD_FOOTER_LEN];
  char why[160] = "";
  int r;
  if (l->file_size < VHD_OLD_FOOTER_LEN)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: not a VHD: %llu bytes is too short for a footer",
                    l->path, (unsigned long long)l->file_size);
  size_t n = l->file_size < VHD_FOOTER_LEN ? VHD_OLD_FOOTER_LEN
                                           : VHD_FOOTER_LEN;
  r = vhd_lv_read(l, buf, n, l->file_size - n);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: reading the footer: %s", l->path,
                    strerror(-r));
  l->footer_len = (uint32_t)n;
  r = vhd_footer_decode(buf, n, &l->f, why, sizeof why);
  /* The old 511-byte footer only when the cookie is not where a 512-byte
   * one has it: a footer with its cookie in place keeps its own error. */
  if (r < 0 && n == VHD_FOOTER_LEN &&
      memcmp(buf, VHD_FOOTER_COOKIE, 8) != 0) {
    l->footer_len = VHD_OLD_FOOTER_LEN;
    r = vhd_footer_decode(buf + 1, VHD_OLD_FOOTER_LEN, &l->f, why,
                          sizeof why);
  }
  if (r < 0) {
    /* A dynamic disk keeps a copy at 0: if it is there, the end is gone. */
    struct vhd_footer copy;
    char why0[160];
    if (vhd_lv_read(l, buf, VHD_FOOTER_LEN, 0) == 0 &&
        vhd_footer_decode(buf, VHD_FOOTER_LEN, &copy, why0,
                          sizeof why0) == 0)
      return fmt_fail(err, errlen, -EINVAL,
                      "%s: truncated VHD: no footer at the end of its %llu "
                      "bytes (the copy at offset 0 describes a %llu-byte "
                      "disk)", l->path, (unsigned long long)l->file_size,
                      (unsigned long long)copy.current_size);
    return fmt_fail(err, errlen, -EINVAL, "%s: not a VHD: %s", l->path, why);
  }
  if (!l->f.checksum_ok && !o->ignore_checksums && !o->check)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: VHD footer checksum 0x%08x is wrong "
                    "(--ignore-checksums reads it anyway)",
                    l->path, l->f.checksum);
  return 0;
}

/* The copy at offset 0 of a dynamic disk, when its checksum holds, must
 * describe the same disk as the footer at the end. */
static int
vhd_check_copy(struct vhd_level *l, const struct image_opts *o, char *err,
               size_t errlen)
{
  uint8_t buf[VHD_FOOTER_LEN];
  struct vhd_footer c;
  char why[160];
  if (o->ignore_checksums || o->check ||
      vhd_lv_read(l, buf, sizeof buf, 0) < 0 ||
      vhd_footer_decode(buf, sizeof buf, &c, why, sizeof why) < 0 ||
      !c.checksum_ok)
    return 0;
  const char *field = NULL;
  if (c.current_size != l->f.current_size)
    field = "current size";
  else if (c.disk_type != l->f.disk_type)
    field = "disk type";
  else if (c.data_offset != l->f.data_offset)
    field = "header offset";
  else if (memcmp(c.uuid, l->f.uuid, 16) != 0)
    field = "UUID";
  if (field == NULL)
    return 0;
  return fmt_fail(err, errlen, -EINVAL,
                  "%s: the footer copy at offset 0 disagrees with the "
                  "footer at the end on the %s (an interrupted update?); "
                  "--ignore-checksums trusts the one at the end", l->path,
                  field);
}

static int
vhd_read_header(struct vhd_level *l, const struct image_opts *o, char *err,
                size_t errlen)
{
  uint8_t buf[VHD_HEADER_LEN];
  char why[200] = "";
  if (l->f.data_offset == UINT64_MAX)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: VHD footer of a %s disk names no dynamic header "
                    "(data offset 0xffffffffffffffff, as a fixed disk's)",
                    l->path, l->f.disk_type == VHD_TYPE_DIFF ? "differencing"
                                                           : "dynamic");
  if (l->f.data_offset > l->file_size ||
      l->file_size - l->f.data_offset < VHD_HEADER_LEN)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: truncated VHD: its dynamic header at offset %llu "
                    "lies past the end of the %llu-byte file", l->path,
                    (unsigned long long)l->f.data_offset,
                    (unsigned long long)l->file_size);
  int r = vhd_lv_read(l, buf, sizeof buf, l->f.data_offset);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: reading the dynamic header: %s",
                    l->path, strerror(-r));
  r = vhd_header_decode(buf, &l->h, why, sizeof why);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: %s", l->path, why);
  if (!l->h.checksum_ok && !o->ignore_checksums && !o->check)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: VHD dynamic header checksum 0x%08x is wrong "
                    "(--ignore-checksums reads it anyway)",
                    l->path, l->h.checksum);
  return 0;
}

/* Reads the BAT entries that cover the disk and checks each block lies
 * inside the file. */
static int
vhd_read_bat(struct vhd_level *l, bool check, char *err, size_t errlen)
{
  uint64_t n = (l->size + l->block_size - 1) / l->block_size;
  if (n > VHD_MAX_ENTRIES)
    return fmt_fail(err, errlen, -EFBIG,
                    "%s: %llu blocks of %u bytes: more than the %u BAT "
                    "entries we read into memory", l->path,
                    (unsigned long long)n, l->block_size, VHD_MAX_ENTRIES);
  l->nblocks = (uint32_t)n;
  size_t bytes = 4 * (size_t)n;
  uint8_t *raw = malloc(bytes ? bytes : 1);
  l->bat = calloc(n ? n : 1, sizeof *l->bat);
  l->full = calloc(n ? n : 1, 1);
  if (raw == NULL || l->bat == NULL || l->full == NULL) {
    free(raw);
    return fmt_fail(err, errlen, -ENOMEM, "%s: no memory for the BAT",
                    l->path);
  }
  int r = vhd_lv_read(l, raw, bytes, l->h.table_offset);
  if (r < 0) {
    free(raw);
    return fmt_fail(err, errlen, r, "%s: reading the BAT: %s", l->path,
                    strerror(-r));
  }
  for (uint32_t i = 0; i < l->nblocks; i++) {
    uint32_t e = vhd_bat_entry(raw, i);
    if (e != VHD_BAT_UNUSED && !check &&
        !vhd_block_inside(e, l->block_size, l->file_size)) {
      free(raw);
      return fmt_fail(err, errlen, -EINVAL,
                      "%s: BAT entry %u points at sector %u, past the end "
                      "of the %llu-byte file", l->path, i, e,
                      (unsigned long long)l->file_size);
    }
    l->bat[i] = e;
  }
  free(raw);
  return 0;
}

/* Opens one image of a chain in l (fd already set). */
static int
vhd_open_level(struct vhd_level *l, const struct image_opts *o, char *err,
               size_t errlen)
{
  struct stat st;
  if (l->io) {
    l->file_size = l->io->size;
  } else if (fstat(l->fd, &st) < 0) {
    return fmt_fail(err, errlen, -errno, "%s: %s", l->path,
                    strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: a VHD must be a regular file", l->path);
  } else {
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    l->file_size = (uint64_t)st.st_size;
  }
  int r = vhd_read_footer(l, o, err, errlen);
  if (r < 0)
    return r;
  l->size = vhd_virtual_size(&l->f);
  bool fixed = l->f.disk_type == VHD_TYPE_FIXED;
  if (!fixed) {
    r = vhd_check_copy(l, o, err, errlen);
    if (r == 0)
      r = vhd_read_header(l, o, err, errlen);
    if (r < 0)
      return r;
  }
  char why[200] = "";
  r = vhd_check_layout(&l->f, fixed ? NULL : &l->h, l->file_size, why,
                       sizeof why);
  if (r < 0) {
    /* A file cut short is the common case: say so plainly. */
    bool cut = strstr(why, "past the end") != NULL;
    return fmt_fail(err, errlen, r, "%s: %s%s", l->path,
                    cut ? "truncated or damaged VHD: " : "", why);
  }
  if (fixed) {
    /* The check above allows for the old 511-byte footer; the data must
     * end where this file's footer starts, or its last byte would be the
     * footer's first. */
    uint64_t data = l->f.current_size > l->size ? l->f.current_size
                                                : l->size;
    if (l->file_size - l->footer_len < data)
      return fmt_fail(err, errlen, -EINVAL, "%s: truncated or damaged VHD: "
                      "fixed disk of %llu bytes and its %u-byte footer do "
                      "not fit in the %llu-byte file", l->path,
                      (unsigned long long)data, l->footer_len,
                      (unsigned long long)l->file_size);
    return 0;
  }
  l->block_size = l->h.block_size;
  l->bitmap_len = vhd_bitmap_len(l->block_size);
  return vhd_read_bat(l, o->check, err, errlen);
}

static void
vhd_close_level(struct vhd_level *l)
{
  if (l->fd >= 0)
    close(l->fd);
  if (l->io)
    l->io->close(l->io);
  l->io = NULL;
  free(l->path);
  free(l->bat);
  free(l->full);
  l->fd = -1;
  l->path = NULL;
  l->bat = NULL;
  l->full = NULL;
}

/* The parent candidates of child: each locator's path, relative ones
 * resolved against the child's directory. Returns 0 when the locator
 * gives a usable path in out. */
static int
vhd_locator_candidate(const struct vhd_level *child, int i, char *out,
                      size_t outlen)
{
  const struct vhd_locator *loc = &child->h.loc[i];
  char path[PATH_MAX];
  if (loc->code != VHD_LOC_MACX && loc->code != VHD_LOC_W2RU &&
      loc->code != VHD_LOC_W2KU)
    return -ENOENT;
  if (loc->length == 0 || loc->length > 4 * PATH_MAX ||
      loc->offset > child->file_size ||
      child->file_size - loc->offset < loc->length)
    return -EINVAL;
  uint8_t *data = malloc(loc->length);
  if (data == NULL)
    return -ENOMEM;
  int r = vhd_lv_read(child, data, loc->length, loc->offset);
  if (r == 0)
    r = vhd_locator_path(loc->code, data, loc->length, path, sizeof path);
  free(data);
  if (r < 0)
    return r;
  /* A Windows drive path cannot be opened here; its file name might,
   * next to the child, which is where copied chains keep their parents. */
  const char *p = path;
  if (p[0] && p[1] == ':' && p[2] == '/') {
    const char *slash = strrchr(p, '/');
    p = slash + 1;
  }
  return fmt_path_beside(child->path, p, out, outlen);
}

/* Finds, opens and checks the parent of p->lv[k] into p->lv[k + 1]. */
static int
vhd_open_parent(struct vhd_priv *p, int k, const struct image_opts *o,
                char *err, size_t errlen)
{
  struct vhd_level *child = &p->lv[k], *par = &p->lv[k + 1];
  char tried[512] = "";
  size_t tl = 0;
  bool uuid_wrong = false;
  char cand[PATH_MAX];
  if (k + 1 >= VHD_MAX_DEPTH)
    return fmt_fail(err, errlen, -ELOOP,
                    "%s: a chain of more than %d VHDs (a loop?)",
                    p->lv[0].path, VHD_MAX_DEPTH);
  for (int i = 0; i < VHD_LOCATORS; i++) {
    if (vhd_locator_candidate(child, i, cand, sizeof cand) < 0)
      continue;
    tl += (size_t)snprintf(tried + tl, tl < sizeof tried ? sizeof tried - tl
                                                        : 0,
                           "%s%s", tl ? ", " : "", cand);
    if (tl >= sizeof tried)
      tl = sizeof tried - 1;
    int fd = open(cand, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO */
    if (fd < 0)
      continue;
    struct stat st;
    if (fstat(fd, &st) == 0) {
      for (int j = 0; j <= k; j++)
        if (p->lv[j].dev == st.st_dev && p->lv[j].ino == st.st_ino) {
          close(fd);
          return fmt_fail(err, errlen, -ELOOP,
                          "%s: the chain of parents makes a loop: %s is "
                          "its own ancestor", p->lv[0].path, cand);
        }
    }
    *par = (struct vhd_level){ .fd = fd, .path = strdup(cand) };
    if (par->path == NULL) {
      vhd_close_level(par);
      return fmt_fail(err, errlen, -ENOMEM, "out of memory");
    }
    int r = vhd_open_level(par, o, err, errlen);
    if (r < 0)
      return r; /* a parent that is there but broken: say what */
    if (memcmp(par->f.uuid, child->h.parent_uuid, 16) == 0) {
      p->depth = k + 2;
      return 0;
    }
    uuid_wrong = true;
    vhd_close_level(par);
  }
  char want[37];
  vhd_uuid_str(child->h.parent_uuid, want);
  if (uuid_wrong)
    return fmt_fail(err, errlen, -EINVAL,
                    "%s: parent UUID mismatch: %s does not have the UUID %s "
                    "that %s records for its parent", p->lv[0].path, tried,
                    want, child->path);
  return fmt_fail(err, errlen, -ENOENT,
                  "%s: parent \"%s\" of %s not found (tried: %s)",
                  p->lv[0].path, child->h.parent_name, child->path,
                  tl ? tried : "no usable locator");
}

static int
vhd_open(struct image *img, int fd, struct image_io *io,
         const struct image_opts *o, char *err, size_t errlen)
{
  struct vhd_priv *p = calloc(1, sizeof *p);
  if (p == NULL) {
    if (fd >= 0)
      close(fd);
    else
      io->close(io);
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  }
  for (int i = 0; i < VHD_MAX_DEPTH; i++)
    p->lv[i].fd = -1;
  img->priv = p;
  p->depth = 1;
  p->lv[0].fd = fd;
  p->lv[0].io = fd < 0 ? io : NULL;
  p->lv[0].path = strdup(img->path);
  if (p->lv[0].path == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  int r = vhd_open_level(&p->lv[0], o, err, errlen);
  if (r < 0)
    return r;
  for (int k = 0; p->lv[k].f.disk_type == VHD_TYPE_DIFF; k++) {
    if (p->lv[k].io)
      return fmt_fail(err, errlen, -ENOTSUP,
                      "%s: a differencing VHD whose parent is \"%s\": a "
                      "parent is looked for beside a file, and this image "
                      "is not one", img->path, p->lv[k].h.parent_name);
    if (!o->format_given)
      return fmt_fail(err, errlen, -EPERM,
                      "%s: a differencing VHD whose parent is \"%s\"; a "
                      "probed image never opens its parent: name the "
                      "format (--src-format vhd, -f vhd or vhd:PATH) to "
                      "allow it", img->path, p->lv[k].h.parent_name);
    r = vhd_open_parent(p, k, o, err, errlen);
    if (r < 0)
      return r;
    p->parents[k] = p->lv[k + 1].path;
  }
  img->size = p->lv[0].size;
  if (o->writable && p->lv[0].fd >= 0 && !o->check) {
    r = vhd_rw_init(img, p, err, errlen);
    if (r < 0)
      return r;
    p->lv[0].writable = true;
    img->writable = true;
  }
  return 0;
}

static void
vhd_close(struct image *img)
{
  struct vhd_priv *p = img->priv;
  if (p == NULL)
    return;
  vhd_rw_free(p);
  for (int i = 0; i < VHD_MAX_DEPTH; i++)
    if (p->lv[i].fd >= 0 || p->lv[i].path || p->lv[i].io)
      vhd_close_level(&p->lv[i]);
  free(p);
  img->priv = NULL;
}

/* ---- reading ---- */

static uint32_t
vhd_bat_get(const struct vhd_level *l, uint32_t b)
{
  return __atomic_load_n(&l->bat[b], __ATOMIC_ACQUIRE);
}

static uint64_t
vhd_host_data(const struct vhd_level *l, uint32_t b)
{
  return (uint64_t)vhd_bat_get(l, b) * VHD_SECTOR + l->bitmap_len;
}

uint32_t
vhd_block_sectors(const struct vhd_level *l, uint32_t b)
{
  uint64_t left = l->size - (uint64_t)b * l->block_size;
  return left < l->block_size
           ? (uint32_t)((left + VHD_SECTOR - 1) / VHD_SECTOR)
           : l->block_size / VHD_SECTOR;
}

/* Reads block b's bitmap into a new buffer (the caller frees it), or
 * NULL with *r set. Marks the block full when every bit covering the
 * disk is set. */
static uint8_t *
vhd_bitmap(struct vhd_level *l, uint32_t b, int *r)
{
  uint8_t *bm = malloc(l->bitmap_len);
  if (bm == NULL) {
    *r = -ENOMEM;
    return NULL;
  }
  *r = vhd_lv_read(l, bm, l->bitmap_len,
                   (uint64_t)vhd_bat_get(l, b) * VHD_SECTOR);
  if (*r < 0) {
    free(bm);
    return NULL;
  }
  uint32_t lim = vhd_block_sectors(l, b);
  bool set;
  if (!l->writable && vhd_bitmap_run(bm, 0, lim, &set) == lim && set)
    __atomic_store_n(&l->full[b], 1, __ATOMIC_RELAXED);
  return bm;
}

static int vhd_read_level(struct vhd_priv *p, int k, uint8_t *buf,
                          uint64_t len, uint64_t off);

/* Bytes the image below level k supplies: its parent's, or zeroes. */
int
vhd_read_below(struct vhd_priv *p, int k, uint8_t *buf, uint64_t len,
               uint64_t off)
{
  if (p->lv[k].f.disk_type != VHD_TYPE_DIFF || k + 1 >= p->depth) {
    memset(buf, 0, len);
    return 0;
  }
  return vhd_read_level(p, k + 1, buf, len, off);
}

/* Reads [off, off + n) of block b of level k, n within the block. */
static int
vhd_read_block(struct vhd_priv *p, int k, uint32_t b, uint8_t *buf,
               uint64_t n, uint64_t off)
{
  struct vhd_level *l = &p->lv[k];
  uint64_t in = off - (uint64_t)b * l->block_size;
  if (vhd_bat_get(l, b) == VHD_BAT_UNUSED)
    return vhd_read_below(p, k, buf, n, off);
  if (__atomic_load_n(&l->full[b], __ATOMIC_RELAXED))
    return vhd_lv_read(l, buf, n, vhd_host_data(l, b) + in);
  int r;
  uint8_t *bm = vhd_bitmap(l, b, &r);
  if (bm == NULL)
    return r;
  uint64_t pos = in, end = in + n;
  while (pos < end && r == 0) {
    bool set;
    uint32_t s = (uint32_t)(pos / VHD_SECTOR);
    uint32_t lim = (uint32_t)((end + VHD_SECTOR - 1) / VHD_SECTOR);
    uint64_t run_end = (uint64_t)(s + vhd_bitmap_run(bm, s, lim, &set)) *
                       VHD_SECTOR;
    if (run_end > end)
      run_end = end;
    uint8_t *dst = buf + (pos - in);
    uint64_t len = run_end - pos;
    if (set)
      r = vhd_lv_read(l, dst, len, vhd_host_data(l, b) + pos);
    else
      r = vhd_read_below(p, k, dst, len, off + (pos - in));
    pos = run_end;
  }
  free(bm);
  return r;
}

static int
vhd_read_level(struct vhd_priv *p, int k, uint8_t *buf, uint64_t len,
               uint64_t off)
{
  struct vhd_level *l = &p->lv[k];
  /* A parent smaller than its child reads as zeroes past its end. */
  if (off >= l->size) {
    memset(buf, 0, len);
    return 0;
  }
  if (len > l->size - off) {
    memset(buf + (l->size - off), 0, len - (l->size - off));
    len = l->size - off;
  }
  if (l->block_size == 0) {
    int r = vhd_lv_read(l, buf, len, off);
    return r == -EIO ? -EIO : r;
  }
  while (len > 0) {
    uint32_t b = (uint32_t)(off / l->block_size);
    uint64_t n = (uint64_t)(b + 1) * l->block_size - off;
    if (n > len)
      n = len;
    int r = vhd_read_block(p, k, b, buf, n, off);
    if (r < 0)
      return r;
    buf += n;
    off += n;
    len -= n;
  }
  return 0;
}

static int
vhd_pread(struct image *img, void *buf, uint64_t len, uint64_t off,
          char *why, size_t wl)
{
  (void)why, (void)wl; /* every failure here is the file's errno */
  if (off > img->size || len > img->size - off)
    return -EINVAL;
  return vhd_read_level(img->priv, 0, buf, len, off);
}

/* ---- extents ---- */

struct vhd_ext_out {
  struct image_extent *ext;
  int n, max;
};

/* Appends a run, merged with the last one when alike; false when full. */
static bool
vhd_emit(struct vhd_ext_out *o, uint64_t len, uint32_t flags)
{
  if (len == 0)
    return true;
  if (o->n > 0 && o->ext[o->n - 1].flags == flags) {
    o->ext[o->n - 1].length += len;
    return true;
  }
  if (o->n == o->max)
    return false;
  o->ext[o->n++] = (struct image_extent){ len, flags };
  return true;
}

static int vhd_extents_level(struct vhd_priv *p, int k, uint64_t off,
                             uint64_t len, struct vhd_ext_out *o);

static int
vhd_extents_below(struct vhd_priv *p, int k, uint64_t off, uint64_t len,
                  struct vhd_ext_out *o)
{
  if (p->lv[k].f.disk_type != VHD_TYPE_DIFF || k + 1 >= p->depth)
    return vhd_emit(o, len, IMAGE_HOLE | IMAGE_ZERO) ? 0 : 1;
  return vhd_extents_level(p, k + 1, off, len, o);
}

/* Describes [off, off + len) of level k into o; returns 1 when o filled
 * up before the end (what it holds is still true), 0, or -errno. */
static int
vhd_extents_level(struct vhd_priv *p, int k, uint64_t off, uint64_t len,
                  struct vhd_ext_out *o)
{
  struct vhd_level *l = &p->lv[k];
  if (off >= l->size)
    return vhd_emit(o, len, IMAGE_HOLE | IMAGE_ZERO) ? 0 : 1;
  if (len > l->size - off) {
    uint64_t in = l->size - off;
    int r = vhd_extents_level(p, k, off, in, o);
    if (r != 0)
      return r;
    return vhd_emit(o, len - in, IMAGE_HOLE | IMAGE_ZERO) ? 0 : 1;
  }
  if (l->block_size == 0 && l->io) /* fixed, not a file: all data */
    return vhd_emit(o, len, 0) ? 0 : 1;
  if (l->block_size == 0) { /* fixed: the file's own holes */
    while (len > 0) {
      struct file_run run;
      int r = file_run_at(l->fd, off, off + len, &run);
      if (r < 0)
        return r;
      if (!vhd_emit(o, run.length, run.hole ? IMAGE_HOLE | IMAGE_ZERO : 0))
        return 1;
      off += run.length;
      len -= run.length;
    }
    return 0;
  }
  while (len > 0) {
    uint32_t b = (uint32_t)(off / l->block_size);
    uint64_t in = off - (uint64_t)b * l->block_size;
    uint64_t n = l->block_size - in;
    if (n > len)
      n = len;
    int r = 0;
    if (vhd_bat_get(l, b) == VHD_BAT_UNUSED) {
      r = vhd_extents_below(p, k, off, n, o);
    } else if (__atomic_load_n(&l->full[b], __ATOMIC_RELAXED)) {
      r = vhd_emit(o, n, 0) ? 0 : 1;
    } else {
      uint8_t *bm = vhd_bitmap(l, b, &r);
      if (bm == NULL)
        return r;
      uint64_t pos = in, end = in + n;
      while (pos < end && r == 0) {
        bool set;
        uint32_t s = (uint32_t)(pos / VHD_SECTOR);
        uint32_t lim = (uint32_t)((end + VHD_SECTOR - 1) / VHD_SECTOR);
        uint64_t re = (uint64_t)(s + vhd_bitmap_run(bm, s, lim, &set)) *
                      VHD_SECTOR;
        if (re > end)
          re = end;
        uint64_t voff = (uint64_t)b * l->block_size + pos;
        r = set ? (vhd_emit(o, re - pos, 0) ? 0 : 1)
                : vhd_extents_below(p, k, voff, re - pos, o);
        pos = re;
      }
      free(bm);
    }
    if (r != 0)
      return r;
    off += n;
    len -= n;
    /* Enough for one call: the caller asks again from where it ends. */
    if (o->n >= o->max && len > 0)
      return 1;
  }
  return 0;
}

static int
vhd_extents(struct image *img, uint64_t off, uint64_t len,
            struct image_extent *ext, int max, char *why, size_t wl)
{
  (void)why, (void)wl;
  if (off >= img->size || max <= 0)
    return -EINVAL;
  if (len > img->size - off)
    len = img->size - off;
  struct vhd_ext_out o = { ext, 0, max };
  int r = vhd_extents_level(img->priv, 0, off, len, &o);
  if (r < 0)
    return o.n > 0 ? o.n : r;
  return o.n;
}

/* ---- map ---- */

static int
vhd_map(struct image *img, uint64_t off, uint64_t len, struct image_map *m)
{
  struct vhd_priv *p = img->priv;
  if (off >= img->size || len == 0 || p->lv[0].fd < 0)
    return -EAGAIN; /* bytes not in a file cannot be sent from one */
  for (int k = 0; k < p->depth; k++) {
    struct vhd_level *l = &p->lv[k];
    if (off >= l->size)
      return -EAGAIN; /* zeroes past a parent's end: nothing to send */
    uint64_t lim = l->size - off < len ? l->size - off : len;
    if (l->block_size == 0) {
      *m = (struct image_map){ l->fd, off, lim };
      return 0;
    }
    uint32_t b = (uint32_t)(off / l->block_size);
    uint64_t in = off - (uint64_t)b * l->block_size;
    if (vhd_bat_get(l, b) != VHD_BAT_UNUSED) {
      if (!__atomic_load_n(&l->full[b], __ATOMIC_RELAXED))
        return -EAGAIN; /* only the bitmap can say: read instead */
      uint64_t run = l->block_size - in;
      *m = (struct image_map){ l->fd, vhd_host_data(l, b) + in,
                               run < lim ? run : lim };
      return 0;
    }
    if (l->f.disk_type != VHD_TYPE_DIFF)
      return -EAGAIN; /* a hole: nothing to send */
    /* Not here: the parent holds this block's sectors. */
    uint64_t run = l->block_size - in;
    if (run < len)
      len = run;
  }
  return -EAGAIN;
}

static void
vhd_info(struct image *img, struct image_info *out, bool allocation)
{
  (void)allocation; /* the BAT is in memory */
  struct vhd_priv *p = img->priv;
  const struct vhd_level *l = &p->lv[0];
  uint64_t allocated = l->block_size == 0 ? l->size : 0;
  for (uint32_t i = 0; l->block_size && i < l->nblocks; i++)
    if (vhd_bat_get(l, i) != VHD_BAT_UNUSED)
      allocated += l->block_size;
  bool diff = l->f.disk_type == VHD_TYPE_DIFF;
  *out = (struct image_info){
    .format = "vhd",
    .disk_type = l->f.disk_type == VHD_TYPE_FIXED     ? "fixed"
                 : l->f.disk_type == VHD_TYPE_DYNAMIC ? "dynamic"
                                                      : "differencing",
    .block_size = l->block_size,
    .allocated = allocated,
    .parents = p->parents,
    .nparents = p->depth - 1,
    .write_block = l->block_size ? VHD_SECTOR : 1,
    .can_trim = !diff,
    .can_fast_zero = !diff,
  };
  memcpy(out->creator, l->f.creator_app, sizeof out->creator);
  out->in_memory = true;
  for (int k = 0; k < p->depth; k++) {
    bool sw = false;
    out->in_memory = out->in_memory && p->lv[k].fd >= 0 &&
                     file_on_memory_fs(p->lv[k].fd, &sw);
    out->swappable = out->swappable || sw;
  }
}

/* The levels above the parent (dev, ino): every block any of them has
 * allocated is marked, whatever its bitmap says (a superset: a sector
 * whose bit is clear reads the parent, and is sent again anyway). */
static int
vhd_above(struct image *img, dev_t dev, ino_t ino, uint64_t block,
          uint8_t *bits)
{
  struct vhd_priv *p = img->priv;
  int k = 1;
  while (k < p->depth && !(p->lv[k].dev == dev && p->lv[k].ino == ino))
    k++;
  if (k >= p->depth || block == 0)
    return 0;
  for (int j = 0; j < k; j++) {
    const struct vhd_level *l = &p->lv[j];
    for (uint32_t b = 0; b < l->nblocks; b++) {
      if (vhd_bat_get(l, b) == VHD_BAT_UNUSED)
        continue;
      uint64_t lo = (uint64_t)b * l->block_size;
      uint64_t hi = lo + l->block_size;
      if (hi > img->size)
        hi = img->size;
      for (uint64_t i = lo / block; lo < hi && i <= (hi - 1) / block; i++)
        bits[i / 8] |= (uint8_t)(1u << (i % 8));
    }
  }
  return 1;
}

const struct image_ops image_vhd_ops = {
  .name = "vhd",
  .probe = vhd_probe,
  .open = vhd_open,
  .pread = vhd_pread,
  .extents = vhd_extents,
  .map = vhd_map,
  .info = vhd_info,
  .close = vhd_close,
  .pwrite = vhd_rw_pwrite,
  .zero = vhd_rw_zero,
  .trim = vhd_rw_trim,
  .flush = vhd_rw_flush,
  .check = vhd_check,
  .above = vhd_above,
};
