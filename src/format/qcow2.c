/* qcow2.c: reading qcow2 images (versions 2 and 3, backing chains of
 * qcow2 and raw files, compressed clusters in deflate and zstd, extended
 * L2 entries) through the format layer. The structures are decoded by
 * qcow2_layout.c; this file reads the tables and follows backing files.
 *
 * Choices:
 * - The L1 table is read at open (bounded by QCOW2_MAX_L1_ENTRIES, and
 *   by the file: it must lie inside it) and every entry is checked then.
 *   L2 entries are read as a read needs them, only the slice that covers
 *   the range, so no L2 table is trusted before it is used.
 * - L2 tables that block status (extents) read whole are kept, up to
 *   QCOW2_MAP_CACHE bytes per image and never evicted, so that map can
 *   place a data cluster without I/O; a table not kept maps nothing and
 *   its clusters are read instead.
 * - Unallocated clusters read from the backing file, or as zeroes past
 *   its end or without one. Zero clusters (the v3 flag) are holes that
 *   read as zeroes, as qemu reports them.
 * - The dirty bit only concerns refcounts: reading ignores it. Encrypted
 *   images and external data files are refused by name.
 *
 * Thread safety: after open, all is read-only but the L2 cache, whose
 * slots are published once with atomic stores and freed at close. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "format/common.h"
#include "format/image.h"
#include "format/qcow2_layout.h"
#include "util/fileio.h"

#define QCOW2_MAX_DEPTH 64
#define QCOW2_MAP_CACHE (UINT64_C(16) << 20)

struct qcow2_level {
  int fd;                  /* owned; -1 when io reads the image */
  struct image_io *io;     /* owned: the top image's bytes, not a file */
  char *path;              /* owned */
  bool raw;                /* a raw backing file: no tables */
  bool probed;             /* a backing file whose format was probed */
  struct qcow2_header h;
  uint64_t size;           /* virtual (raw: the file's size) */
  uint64_t file_size;
  uint32_t cluster_bits;
  uint64_t cluster;
  uint64_t l2_entries;
  uint32_t entry_len;      /* 8, or 16 with extended L2 */
  uint64_t *l1;            /* owned: L2 offsets (0: unallocated) */
  uint8_t **l2cache;       /* owned: per L1 entry, a whole L2 table */
  uint64_t cached;         /* bytes in l2cache (atomic) */
  dev_t dev;
  ino_t ino;
};

struct qcow2_priv {
  struct qcow2_level lv[QCOW2_MAX_DEPTH];
  int depth;
  const char *parents[QCOW2_MAX_DEPTH];
  uint64_t allocated;
};

/* Exactly len bytes of l at off: -EIO past its end. */
static int
lv_read(const struct qcow2_level *l, void *buf, size_t len, uint64_t off)
{
  return fmt_read(l->fd, l->io, buf, len, off);
}

/* Up to len bytes of l at off, fewer at its end (*got says). */
static int
lv_read_full(const struct qcow2_level *l, void *buf, size_t len,
             uint64_t off, size_t *got)
{
  return fmt_read_full(l->fd, l->io, buf, len, off, got);
}

static bool
q_probe(const uint8_t *head, size_t hl, const uint8_t *tail, size_t tl)
{
  (void)tail, (void)tl;
  return hl >= 4 && head[0] == 'Q' && head[1] == 'F' && head[2] == 'I' &&
         head[3] == 0xFB;
}

/* ---- opening ---- */

struct q_names {
  char backing[QCOW2_MAX_BACKING_NAME + 1];
  char backing_fmt[64];
};

/* Reads the header cluster, decodes and checks the header, walks the
 * extensions. */
static int
q_read_header(struct qcow2_level *l, struct q_names *nm, char *err,
              size_t errlen)
{
  uint8_t small[QCOW2_V3_HEADER_LEN + 8];
  char why[200] = "";
  size_t n = l->file_size < sizeof small ? (size_t)l->file_size
                                         : sizeof small;
  int r = lv_read(l, small, n, 0);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: reading the qcow2 header: %s",
                  l->path, strerror(-r));
  r = qcow2_header_decode(small, n, &l->h, why, sizeof why);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: %s", l->path, why);
  l->cluster_bits = l->h.cluster_bits;
  l->cluster = UINT64_C(1) << l->cluster_bits;
  /* The whole first cluster: the header, its extensions, the name. */
  size_t clen = l->file_size < l->cluster ? (size_t)l->file_size
                                          : (size_t)l->cluster;
  uint8_t *c0 = malloc(clen);
  if (c0 == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", l->path);
  r = lv_read(l, c0, clen, 0);
  if (r == 0)
    r = qcow2_header_decode(c0, clen, &l->h, why, sizeof why);
  if (r == 0)
    r = qcow2_check_layout(&l->h, l->file_size, why, sizeof why);
  if (r < 0) {
    free(c0);
    if (why[0] == '\0')
      snprintf(why, sizeof why, "%s", strerror(-r));
    bool cut = strstr(why, "past the end") || strstr(why, "beyond");
    return fmt_fail(err, errlen, r, "%s: %s%s", l->path,
                  cut ? "truncated or damaged qcow2: " : "", why);
  }
  size_t pos = l->h.version >= 3 ? l->h.header_len : QCOW2_V2_HEADER_LEN;
  /* Extensions end at the backing name, if it is in the first cluster. */
  size_t end = clen;
  if (l->h.backing_offset && l->h.backing_offset < end)
    end = (size_t)l->h.backing_offset;
  while (pos + 8 <= end) {
    struct qcow2_ext x;
    if (qcow2_ext_decode(c0 + pos, end - pos, &x) < 0) {
      free(c0);
      return fmt_fail(err, errlen, -EINVAL,
                    "%s: header extension at offset %zu runs past the "
                    "header area", l->path, pos);
    }
    if (x.type == QCOW2_EXT_END)
      break;
    if (x.type == QCOW2_EXT_BACKING_FORMAT) {
      size_t k = x.len < sizeof nm->backing_fmt - 1
                   ? x.len : sizeof nm->backing_fmt - 1;
      memcpy(nm->backing_fmt, x.data, k);
      nm->backing_fmt[k] = '\0';
    }
    pos += x.total; /* unknown types (XCP-ng's 0x76617465) are skipped */
  }
  if (l->h.backing_offset) {
    memcpy(nm->backing, c0 + l->h.backing_offset, l->h.backing_len);
    nm->backing[l->h.backing_len] = '\0';
    if (strlen(nm->backing) != l->h.backing_len || nm->backing[0] == '\0') {
      free(c0);
      return fmt_fail(err, errlen, -EINVAL,
                    "%s: the backing file name holds a NUL byte or is "
                    "empty", l->path);
    }
  }
  free(c0);
  return 0;
}

static int
q_refuse_features(struct qcow2_level *l, char *err, size_t errlen)
{
  if (l->h.crypt_method != 0)
    return fmt_fail(err, errlen, -ENOTSUP,
                  "%s: an encrypted qcow2 image (method %u): encryption "
                  "is not supported", l->path, l->h.crypt_method);
  if (l->h.incompat & QCOW2_INCOMPAT_DATA_FILE)
    return fmt_fail(err, errlen, -ENOTSUP,
                  "%s: a qcow2 image with an external data file: not "
                  "supported", l->path);
  return 0;
}

/* Said after "past the end of the file" when the image carries the
 * corrupt bit, which our writer leaves set until its last byte is in. */
static const char *
q_cut_hint(const struct qcow2_level *l)
{
  return (l->h.incompat & QCOW2_INCOMPAT_CORRUPT)
           ? " (the image is marked corrupt: its writer may have been cut "
             "short)"
           : "";
}

static int
q_read_l1(struct qcow2_level *l, char *err, size_t errlen)
{
  uint32_t n = l->h.l1_entries;
  uint8_t *raw = malloc(n ? 8 * (size_t)n : 1);
  l->l1 = calloc(n ? n : 1, sizeof *l->l1);
  l->l2cache = calloc(n ? n : 1, sizeof *l->l2cache);
  if (raw == NULL || l->l1 == NULL || l->l2cache == NULL) {
    free(raw);
    return fmt_fail(err, errlen, -ENOMEM, "%s: no memory for the L1 table",
                  l->path);
  }
  int r = lv_read(l, raw, 8 * (size_t)n, l->h.l1_offset);
  if (r < 0) {
    free(raw);
    return fmt_fail(err, errlen, r, "%s: reading the L1 table: %s", l->path,
                  strerror(-r));
  }
  for (uint32_t i = 0; i < n && r == 0; i++) {
    char why[160];
    uint64_t off;
    r = qcow2_l1_decode(&l->h, qcow2_get64(raw + 8 * (size_t)i), &off, why,
                        sizeof why);
    if (r < 0)
      r = fmt_fail(err, errlen, r, "%s: L1 entry %u: %s", l->path, i, why);
    else if (off && (off > l->file_size ||
                     l->file_size - off < l->cluster))
      r = fmt_fail(err, errlen, -EINVAL,
                 "%s: L1 entry %u points at an L2 table at offset %llu, "
                 "past the end of the %llu-byte file%s", l->path, i,
                 (unsigned long long)off,
                 (unsigned long long)l->file_size, q_cut_hint(l));
    else
      l->l1[i] = off;
  }
  free(raw);
  return r;
}

static int
q_open_level(struct qcow2_level *l, struct q_names *nm, char *err,
             size_t errlen)
{
  struct stat st;
  int r = 0;
  if (l->io) {
    l->file_size = l->io->size;
  } else if (fstat(l->fd, &st) < 0) {
    return fmt_fail(err, errlen, -errno, "%s: %s", l->path, strerror(errno));
  } else if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    return fmt_fail(err, errlen, -EINVAL, "%s: not a file or device",
                  l->path);
  } else {
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    r = file_size(l->fd, &l->file_size);
  }
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: %s", l->path, strerror(-r));
  if (l->raw) {
    l->size = l->file_size;
    return 0;
  }
  r = q_read_header(l, nm, err, errlen);
  if (r == 0)
    r = q_refuse_features(l, err, errlen);
  if (r < 0)
    return r;
  l->size = l->h.size;
  l->l2_entries = qcow2_l2_entries(&l->h);
  l->entry_len = (l->h.incompat & QCOW2_INCOMPAT_EXTL2) ? 16 : 8;
  return q_read_l1(l, err, errlen);
}

static void
q_close_level(struct qcow2_level *l)
{
  if (l->fd >= 0)
    close(l->fd);
  if (l->io)
    l->io->close(l->io);
  if (l->l2cache)
    for (uint32_t i = 0; i < l->h.l1_entries; i++)
      free(l->l2cache[i]);
  free(l->l2cache);
  free(l->l1);
  free(l->path);
  memset(l, 0, sizeof *l);
  l->fd = -1;
}

static int
q_open_backing(struct qcow2_priv *p, int k, const struct q_names *nm,
               struct q_names *next, char *err, size_t errlen)
{
  struct qcow2_level *child = &p->lv[k], *b = &p->lv[k + 1];
  char path[PATH_MAX];
  if (k + 1 >= QCOW2_MAX_DEPTH)
    return fmt_fail(err, errlen, -ELOOP,
                  "%s: a chain of more than %d images (a loop?)",
                  p->lv[0].path, QCOW2_MAX_DEPTH);
  int r = fmt_path_beside(child->path, nm->backing, path, sizeof path);
  if (r < 0)
    return fmt_fail(err, errlen, r, "%s: backing file name \"%s\" %s",
                  child->path, nm->backing,
                  r == -ENOENT ? "names no file" : "too long");
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO */
  if (fd < 0)
    return fmt_fail(err, errlen, -errno,
                  "%s: backing file \"%s\" of %s: %s (looked for %s)",
                  p->lv[0].path, nm->backing, child->path, strerror(errno),
                  path);
  struct stat st;
  if (fstat(fd, &st) == 0)
    for (int j = 0; j <= k; j++)
      if (p->lv[j].dev == st.st_dev && p->lv[j].ino == st.st_ino) {
        close(fd);
        return fmt_fail(err, errlen, -ELOOP,
                      "%s: the chain of backing files makes a loop: %s "
                      "names %s as its backing file, which is %s already",
                      p->lv[0].path, child->path, path,
                      j == k ? "itself" : "higher in the chain");
      }
  *b = (struct qcow2_level){ .fd = fd, .path = strdup(path) };
  if (b->path == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "out of memory");
  if (strcmp(nm->backing_fmt, "raw") == 0) {
    b->raw = true;
  } else if (nm->backing_fmt[0] == '\0') {
    /* No backing format: probed, as qemu does. A probed image never opens
     * a backing file of its own (q_open checks). */
    uint8_t m[4];
    b->raw = file_pread_exact(fd, m, 4, 0) < 0 || !q_probe(m, 4, NULL, 0);
    b->probed = true;
  } else if (strcmp(nm->backing_fmt, "qcow2") != 0) {
    return fmt_fail(err, errlen, -ENOTSUP,
                  "%s: backing file %s is in format \"%s\": only qcow2 and "
                  "raw backing files are read", p->lv[0].path, path,
                  nm->backing_fmt);
  }
  r = q_open_level(b, next, err, errlen);
  if (r == 0)
    p->depth = k + 2;
  return r;
}

static int
q_open(struct image *img, int fd, struct image_io *io,
       const struct image_opts *o, char *err, size_t errlen)
{
  struct qcow2_priv *p = calloc(1, sizeof *p);
  if (p == NULL) {
    if (fd >= 0)
      close(fd);
    else
      io->close(io);
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  }
  for (int i = 0; i < QCOW2_MAX_DEPTH; i++)
    p->lv[i].fd = -1;
  img->priv = p;
  p->depth = 1;
  p->lv[0].fd = fd;
  p->lv[0].io = fd < 0 ? io : NULL;
  p->lv[0].path = strdup(img->path);
  if (p->lv[0].path == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  struct q_names *nm = calloc(2, sizeof *nm);
  if (nm == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "%s: out of memory", img->path);
  int r = q_open_level(&p->lv[0], &nm[0], err, errlen);
  for (int k = 0; r == 0 && !p->lv[k].raw && nm[k % 2].backing[0]; k++) {
    if (p->lv[k].io) {
      r = fmt_fail(err, errlen, -ENOTSUP,
                 "%s: a qcow2 image whose backing file is \"%s\": a "
                 "backing file is looked for beside a file, and this image "
                 "is not one", img->path, nm[k % 2].backing);
      break;
    }
    if (p->lv[k].probed) {
      r = fmt_fail(err, errlen, -EPERM,
                   "%s: backing file %s names a backing file \"%s\" of its "
                   "own, but its format was probed (%s names no backing "
                   "format), and a probed image never opens its backing "
                   "file: record the formats (qemu-img rebase -u -F)",
                   img->path, p->lv[k].path, nm[k % 2].backing,
                   p->lv[k - 1].path);
      break;
    }
    if (!o->format_given) {
      r = fmt_fail(err, errlen, -EPERM,
                 "%s: a qcow2 image whose backing file is \"%s\"; a probed "
                 "image never opens its backing file: name the format "
                 "(--src-format qcow2, -f qcow2 or qcow2:PATH) to allow it",
                 img->path, nm[k % 2].backing);
      break;
    }
    memset(&nm[(k + 1) % 2], 0, sizeof *nm);
    r = q_open_backing(p, k, &nm[k % 2], &nm[(k + 1) % 2], err, errlen);
    if (r == 0)
      p->parents[k] = p->lv[k + 1].path;
  }
  free(nm);
  if (r < 0)
    return r;
  img->size = p->lv[0].size;
  return 0;
}

static void
q_close(struct image *img)
{
  struct qcow2_priv *p = img->priv;
  if (p == NULL)
    return;
  for (int i = 0; i < QCOW2_MAX_DEPTH; i++)
    if (p->lv[i].fd >= 0 || p->lv[i].path || p->lv[i].io)
      q_close_level(&p->lv[i]);
  free(p);
  img->priv = NULL;
}

/* ---- the L2 walk ---- */

/* Entries [first, first + n) of the L2 table at l2_off, decoded. */
static int
q_l2_slice(struct qcow2_level *l, uint32_t l1i, uint64_t first, uint64_t n,
           struct qcow2_cluster *out, char *why, size_t wl)
{
  uint64_t l2_off = l->l1[l1i];
  uint8_t *t = __atomic_load_n(&l->l2cache[l1i], __ATOMIC_ACQUIRE);
  uint8_t *raw = NULL;
  const uint8_t *src;
  if (t) {
    src = t + first * l->entry_len;
  } else {
    raw = malloc(n * l->entry_len);
    if (raw == NULL)
      return -ENOMEM;
    int r = lv_read(l, raw, n * l->entry_len,
                             l2_off + first * l->entry_len);
    if (r < 0) {
      free(raw);
      snprintf(why, wl, "reading the L2 table at offset %llu: %s",
               (unsigned long long)l2_off, strerror(-r));
      return r;
    }
    src = raw;
  }
  int r = 0;
  for (uint64_t i = 0; i < n && r == 0; i++) {
    const uint8_t *e = src + i * l->entry_len;
    r = qcow2_l2_decode(&l->h, qcow2_get64(e),
                        l->entry_len == 16 ? qcow2_get64(e + 8) : 0, &out[i],
                        why, wl);
    if (r == 0 && out[i].kind == QCOW2_NORMAL &&
        out[i].host_off >= l->file_size) {
      snprintf(why, wl, "L2 entry points at offset %llu, past the end of "
               "the %llu-byte file%s", (unsigned long long)out[i].host_off,
               (unsigned long long)l->file_size, q_cut_hint(l));
      r = -EINVAL;
    }
    if (r == 0 && out[i].kind == QCOW2_COMPRESSED &&
        out[i].host_off >= l->file_size) {
      snprintf(why, wl, "compressed cluster at offset %llu, past the end "
               "of the %llu-byte file%s", (unsigned long long)out[i].host_off,
               (unsigned long long)l->file_size, q_cut_hint(l));
      r = -EINVAL;
    }
  }
  free(raw);
  return r;
}

/* Keeps the whole L2 table of L1 entry l1i for map, within the budget. */
static void
q_l2_keep(struct qcow2_level *l, uint32_t l1i)
{
  if (__atomic_load_n(&l->l2cache[l1i], __ATOMIC_ACQUIRE) != NULL ||
      __atomic_load_n(&l->cached, __ATOMIC_RELAXED) + l->cluster >
        QCOW2_MAP_CACHE)
    return;
  uint8_t *t = malloc(l->cluster);
  if (t == NULL)
    return;
  if (lv_read(l, t, l->cluster, l->l1[l1i]) < 0) {
    free(t);
    return;
  }
  uint8_t *none = NULL;
  if (__atomic_compare_exchange_n(&l->l2cache[l1i], &none, t, false,
                                  __ATOMIC_RELEASE, __ATOMIC_RELAXED))
    __atomic_fetch_add(&l->cached, l->cluster, __ATOMIC_RELAXED);
  else
    free(t);
}

/* Calls fn for each run of [off, off + len) of level l, in order, as
 * (offset, length, cluster descriptor or NULL for unallocated L1, byte
 * offset inside the cluster). A run never crosses a cluster. */
struct q_walk {
  int (*fn)(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
            const struct qcow2_cluster *c, uint64_t in, void *arg);
  void *arg;
  bool keep; /* keep the L2 tables walked, for map */
};

static int
q_walk(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
       const struct q_walk *w, char *why, size_t wl)
{
  struct qcow2_level *l = &p->lv[k];
  struct qcow2_cluster cl[256];
  while (len > 0) {
    uint64_t ci = off >> l->cluster_bits;
    uint64_t l1i = ci / l->l2_entries, l2i = ci % l->l2_entries;
    uint64_t in = off & (l->cluster - 1);
    uint64_t last = (off + len - 1) >> l->cluster_bits;
    uint64_t n = last - ci + 1;
    if (n > l->l2_entries - l2i)
      n = l->l2_entries - l2i;
    if (n > sizeof cl / sizeof cl[0])
      n = sizeof cl / sizeof cl[0];
    if (l1i >= l->h.l1_entries || l->l1[l1i] == 0) {
      /* A whole L2 table's worth is unallocated. */
      uint64_t span = (n << l->cluster_bits) - in;
      if (span > len)
        span = len;
      int r = w->fn(p, k, off, span, NULL, in, w->arg);
      if (r)
        return r;
      off += span;
      len -= span;
      continue;
    }
    if (w->keep)
      q_l2_keep(l, (uint32_t)l1i);
    int r = q_l2_slice(l, (uint32_t)l1i, l2i, n, cl, why, wl);
    if (r < 0)
      return r;
    for (uint64_t i = 0; i < n && len > 0; i++) {
      uint64_t span = l->cluster - in;
      /* Normal clusters that follow each other in the file too are one
       * run: one read for all of them. */
      uint64_t start = cl[i].host_off, next = start + l->cluster;
      while (cl[i].kind == QCOW2_NORMAL && l->entry_len == 8 && i + 1 < n &&
             span < len && cl[i + 1].kind == QCOW2_NORMAL &&
             cl[i + 1].host_off == next) {
        next += l->cluster;
        span += l->cluster;
        i++;
        cl[i].host_off = start; /* the run's start, for fn */
      }
      if (span > len)
        span = len;
      r = w->fn(p, k, off, span, &cl[i], in, w->arg);
      if (r)
        return r;
      off += span;
      len -= span;
      in = 0;
    }
  }
  return 0;
}

/* ---- reading ---- */

static int q_read_level(struct qcow2_priv *p, int k, uint8_t *buf,
                        uint64_t len, uint64_t off, char *why, size_t wl);

static int
q_read_below(struct qcow2_priv *p, int k, uint8_t *buf, uint64_t len,
             uint64_t off, char *why, size_t wl)
{
  if (k + 1 >= p->depth) {
    memset(buf, 0, len);
    return 0;
  }
  return q_read_level(p, k + 1, buf, len, off, why, wl);
}

/* Inflates a compressed cluster of level l into out (one cluster). */
static int
q_decompress(struct qcow2_level *l, const struct qcow2_cluster *c,
             uint8_t *out, char *why, size_t wl)
{
  uint64_t clen = c->comp_len;
  if (clen > l->file_size - c->host_off)
    clen = l->file_size - c->host_off; /* the last one may end early */
  uint8_t *in = malloc(clen ? clen : 1);
  if (in == NULL)
    return -ENOMEM;
  size_t got;
  int r = lv_read_full(l, in, (size_t)clen, c->host_off, &got);
  if (r < 0) {
    free(in);
    return r;
  }
  size_t produced = 0;
  if (l->h.compression == QCOW2_COMPRESSION_ZSTD) {
    ZSTD_DCtx *z = ZSTD_createDCtx();
    ZSTD_inBuffer ib = { in, got, 0 };
    ZSTD_outBuffer ob = { out, (size_t)l->cluster, 0 };
    size_t zr = 1;
    while (z && ob.pos < ob.size && ib.pos < ib.size && zr != 0) {
      zr = ZSTD_decompressStream(z, &ob, &ib);
      if (ZSTD_isError(zr))
        break;
    }
    produced = ob.pos;
    ZSTD_freeDCtx(z);
  } else {
    z_stream zs = { 0 };
    if (inflateInit2(&zs, -12) == Z_OK) {
      zs.next_in = in;
      zs.avail_in = (uInt)got;
      zs.next_out = out;
      zs.avail_out = (uInt)l->cluster;
      int zr = inflate(&zs, Z_FINISH);
      if (zr == Z_STREAM_END || zr == Z_OK || zr == Z_BUF_ERROR)
        produced = l->cluster - zs.avail_out;
      inflateEnd(&zs);
    }
  }
  free(in);
  if (produced != l->cluster) {
    snprintf(why, wl, "compressed cluster at offset %llu gives %zu of %llu "
             "bytes", (unsigned long long)c->host_off, produced,
             (unsigned long long)l->cluster);
    return -EIO;
  }
  return 0;
}

struct q_read_arg {
  uint8_t *buf;
  uint64_t base; /* the read's offset */
  char *why;
  size_t wl;
};

/* Reads len bytes at host offset host, zeroes past the file's end (a
 * last cluster may end early). */
static int
q_host_read(struct qcow2_level *l, uint8_t *dst, uint64_t len, uint64_t host)
{
  size_t got;
  int r = lv_read_full(l, dst, (size_t)len, host, &got);
  if (r == 0 && got < len)
    memset(dst + got, 0, len - got);
  return r;
}

static int
q_read_run(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
           const struct qcow2_cluster *c, uint64_t in, void *arg)
{
  struct q_read_arg *a = arg;
  struct qcow2_level *l = &p->lv[k];
  uint8_t *dst = a->buf + (off - a->base);
  /* Unallocated; with extended L2, its zero subclusters still read as
   * zeroes (the walk below). */
  if (c == NULL || (c->kind == QCOW2_UNALLOCATED &&
                    (l->entry_len == 8 || (c->sub_alloc | c->sub_zero) == 0)))
    return q_read_below(p, k, dst, len, off, a->why, a->wl);
  if (c->kind == QCOW2_ZERO) {
    memset(dst, 0, len);
    return 0;
  }
  if (c->kind == QCOW2_COMPRESSED) {
    uint8_t *tmp = malloc(l->cluster);
    if (tmp == NULL)
      return -ENOMEM;
    int r = q_decompress(l, c, tmp, a->why, a->wl);
    if (r == 0)
      memcpy(dst, tmp + in, len);
    free(tmp);
    return r;
  }
  if (l->entry_len == 8)
    return q_host_read(l, dst, len, c->host_off + in);
  /* Extended L2: subcluster by subcluster. */
  uint64_t sub = l->cluster / 32;
  uint64_t pos = in, end = in + len;
  while (pos < end) {
    uint32_t s = (uint32_t)(pos / sub);
    uint64_t n = (s + 1) * sub - pos;
    if (n > end - pos)
      n = end - pos;
    uint8_t *d = dst + (pos - in);
    int r = 0;
    if (c->sub_alloc >> s & 1)
      r = q_host_read(l, d, n, c->host_off + pos);
    else if (c->sub_zero >> s & 1)
      memset(d, 0, n);
    else
      r = q_read_below(p, k, d, n, off + (pos - in), a->why, a->wl);
    if (r < 0)
      return r;
    pos += n;
  }
  return 0;
}

static int
q_read_level(struct qcow2_priv *p, int k, uint8_t *buf, uint64_t len,
             uint64_t off, char *why, size_t wl)
{
  struct qcow2_level *l = &p->lv[k];
  if (off >= l->size) {
    memset(buf, 0, len);
    return 0;
  }
  if (len > l->size - off) {
    memset(buf + (l->size - off), 0, len - (l->size - off));
    len = l->size - off;
  }
  if (l->raw)
    return q_host_read(l, buf, len, off);
  struct q_read_arg a = { buf, off, why, wl };
  struct q_walk w = { q_read_run, &a, false };
  return q_walk(p, k, off, len, &w, why, wl);
}

static int
q_pread(struct image *img, void *buf, uint64_t len, uint64_t off, char *why,
        size_t wl)
{
  if (off > img->size || len > img->size - off)
    return -EINVAL;
  return q_read_level(img->priv, 0, buf, len, off, why, wl);
}

/* ---- extents ---- */

struct q_ext_arg {
  struct image_extent *ext;
  int n, max;
  uint64_t budget; /* table entries a call may still look at */
  char *why;
  size_t wl;
};

/* Table entries one extents call looks at, at most, beyond its max runs:
 * a bound on its L2 reads (128 KiB of tables), where unallocated L1
 * entries cost nothing, so that one call describes a hole of any size
 * and a run of many clusters alike. */
#define Q_EXTENTS_BUDGET 16384

static int
q_emit(struct q_ext_arg *o, uint64_t len, uint32_t flags)
{
  if (len == 0)
    return 0;
  if (o->n > 0 && o->ext[o->n - 1].flags == flags) {
    o->ext[o->n - 1].length += len;
    return 0;
  }
  if (o->n == o->max)
    return 1;
  o->ext[o->n++] = (struct image_extent){ len, flags };
  return 0;
}

static int q_extents_level(struct qcow2_priv *p, int k, uint64_t off,
                           uint64_t len, struct q_ext_arg *o);

static int
q_extents_below(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
                struct q_ext_arg *o)
{
  if (k + 1 >= p->depth)
    return q_emit(o, len, IMAGE_HOLE | IMAGE_ZERO);
  return q_extents_level(p, k + 1, off, len, o);
}

static int
q_ext_run(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
          const struct qcow2_cluster *c, uint64_t in, void *arg)
{
  struct q_ext_arg *o = arg;
  struct qcow2_level *l = &p->lv[k];
  if (c != NULL) {
    /* Entries of an L2 table: they cost a read. Stop (as a full array
     * does) once the budget is spent, with at least one run out. */
    uint64_t entries = ((in + len - 1) >> l->cluster_bits) + 1;
    if (entries > o->budget && o->n > 0)
      return 1;
    o->budget = entries > o->budget ? 0 : o->budget - entries;
  }
  if (c == NULL ||
      (c->kind == QCOW2_UNALLOCATED &&
       (l->entry_len == 8 || (c->sub_alloc | c->sub_zero) == 0)))
    return q_extents_below(p, k, off, len, o);
  if (c->kind == QCOW2_ZERO)
    return q_emit(o, len, IMAGE_HOLE | IMAGE_ZERO);
  if (c->kind == QCOW2_COMPRESSED || l->entry_len == 8)
    return q_emit(o, len, 0);
  uint64_t sub = l->cluster / 32;
  uint64_t pos = in, end = in + len;
  while (pos < end) {
    uint32_t s = (uint32_t)(pos / sub);
    uint64_t n = (s + 1) * sub - pos;
    if (n > end - pos)
      n = end - pos;
    int r;
    if (c->sub_alloc >> s & 1)
      r = q_emit(o, n, 0);
    else if (c->sub_zero >> s & 1)
      r = q_emit(o, n, IMAGE_HOLE | IMAGE_ZERO);
    else
      r = q_extents_below(p, k, off + (pos - in), n, o);
    if (r)
      return r;
    pos += n;
  }
  return 0;
}

static int
q_extents_level(struct qcow2_priv *p, int k, uint64_t off, uint64_t len,
                struct q_ext_arg *o)
{
  struct qcow2_level *l = &p->lv[k];
  if (off >= l->size)
    return q_emit(o, len, IMAGE_HOLE | IMAGE_ZERO);
  if (len > l->size - off) {
    uint64_t inside = l->size - off;
    int r = q_extents_level(p, k, off, inside, o);
    return r ? r : q_emit(o, len - inside, IMAGE_HOLE | IMAGE_ZERO);
  }
  if (l->raw) {
    while (len > 0) {
      struct file_run run;
      if (l->fd < 0)
        return q_emit(o, len, 0);
      int r = file_run_at(l->fd, off, off + len, &run);
      if (r < 0)
        return r;
      r = q_emit(o, run.length, run.hole ? IMAGE_HOLE | IMAGE_ZERO : 0);
      if (r)
        return r;
      off += run.length;
      len -= run.length;
    }
    return 0;
  }
  struct q_walk w = { q_ext_run, o, k == 0 };
  return q_walk(p, k, off, len, &w, o->why, o->wl);
}

static int
q_extents(struct image *img, uint64_t off, uint64_t len,
          struct image_extent *ext, int max, char *why, size_t wl)
{
  if (off >= img->size || max <= 0)
    return -EINVAL;
  if (len > img->size - off)
    len = img->size - off;
  struct qcow2_priv *p = img->priv;
  struct q_ext_arg o = { ext, 0, max, Q_EXTENTS_BUDGET + (uint64_t)max, why,
                         wl };
  int r = q_extents_level(p, 0, off, len, &o);
  if (r < 0)
    return o.n > 0 ? o.n : r;
  return o.n;
}

/* ---- map ---- */

static int
q_map(struct image *img, uint64_t off, uint64_t len, struct image_map *m)
{
  struct qcow2_priv *p = img->priv;
  struct qcow2_level *l = &p->lv[0];
  if (l->raw || l->fd < 0 || l->entry_len != 8 || off >= l->size ||
      len == 0)
    return -EAGAIN;
  uint64_t ci = off >> l->cluster_bits;
  uint64_t l1i = ci / l->l2_entries, l2i = ci % l->l2_entries;
  if (l1i >= l->h.l1_entries)
    return -EAGAIN;
  const uint8_t *t = __atomic_load_n(&l->l2cache[l1i], __ATOMIC_ACQUIRE);
  if (t == NULL)
    return -EAGAIN;
  uint64_t in = off & (l->cluster - 1);
  uint64_t host = 0, run = 0;
  for (uint64_t i = l2i; i < l->l2_entries && run < in + len; i++) {
    struct qcow2_cluster c;
    char why[8];
    if (qcow2_l2_decode(&l->h, qcow2_get64(t + 8 * i), 0, &c, why,
                        sizeof why) < 0 ||
        c.kind != QCOW2_NORMAL || c.host_off >= l->file_size ||
        l->file_size - c.host_off < l->cluster)
      break;
    if (run == 0)
      host = c.host_off;
    else if (c.host_off != host + run)
      break;
    run += l->cluster;
  }
  if (run <= in)
    return -EAGAIN;
  run -= in;
  *m = (struct image_map){ l->fd, host + in, run < len ? run : len };
  if (off + m->length > l->size)
    m->length = l->size - off;
  return 0;
}

static int
q_cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Data clusters of one L2 table (normal ones holding data, compressed). */
static uint64_t
q_count_table(struct qcow2_level *l, const uint8_t *t)
{
  uint64_t n = 0;
  char why[8];
  for (uint64_t j = 0; j < l->l2_entries; j++) {
    struct qcow2_cluster c;
    const uint8_t *e = t + j * l->entry_len;
    if (qcow2_l2_decode(&l->h, qcow2_get64(e),
                        l->entry_len == 16 ? qcow2_get64(e + 8) : 0, &c, why,
                        sizeof why) == 0 &&
        (c.kind == QCOW2_COMPRESSED ||
         (c.kind == QCOW2_NORMAL && (l->entry_len == 8 || c.sub_alloc))))
      n++;
  }
  return n;
}

/* Bytes of the data clusters the top image holds. Only the L1 entries
 * that the size needs count, and each L2 table is read once however many
 * entries name it, so the work is bounded by the file, not by what its
 * header claims. */
static uint64_t
q_allocated(struct qcow2_level *l)
{
  uint64_t need = (l->size + (l->cluster * l->l2_entries) - 1) /
                  (l->cluster * l->l2_entries);
  if (need > l->h.l1_entries)
    need = l->h.l1_entries;
  uint64_t *offs = malloc((need ? need : 1) * sizeof *offs);
  uint8_t *t = malloc(l->cluster);
  uint64_t n = 0, total = 0;
  if (offs == NULL || t == NULL)
    goto out;
  for (uint64_t i = 0; i < need; i++)
    if (l->l1[i])
      offs[n++] = l->l1[i];
  qsort(offs, n, sizeof *offs, q_cmp_u64);
  for (uint64_t i = 0, k; i < n; i = k) {
    for (k = i + 1; k < n && offs[k] == offs[i]; k++)
      ;
    if (lv_read(l, t, l->cluster, offs[i]) == 0)
      total += q_count_table(l, t) * (k - i) * l->cluster;
  }
out:
  free(offs);
  free(t);
  return total;
}

static void
q_info(struct image *img, struct image_info *out, bool allocation)
{
  struct qcow2_priv *p = img->priv;
  struct qcow2_level *l = &p->lv[0];
  *out = (struct image_info){
    .format = "qcow2",
    .disk_type = l->h.version < 3 ? "version 2"
                 : (l->h.incompat & QCOW2_INCOMPAT_CORRUPT)
                   ? "version 3, marked corrupt"
                   : "version 3",
    .block_size = (uint32_t)l->cluster,
    .allocated = allocation ? q_allocated(l) : 0,
    .parents = p->parents,
    .nparents = p->depth - 1,
    .in_memory = true,
    .marked_corrupt = (l->h.incompat & QCOW2_INCOMPAT_CORRUPT) != 0,
  };
  for (int k = 0; k < p->depth; k++) {
    bool sw = false;
    out->in_memory = out->in_memory && p->lv[k].fd >= 0 &&
                     file_on_memory_fs(p->lv[k].fd, &sw);
    out->swappable = out->swappable || sw;
  }
}

const struct image_ops image_qcow2_ops = {
  .name = "qcow2",
  .probe = q_probe,
  .open = q_open,
  .pread = q_pread,
  .extents = q_extents,
  .map = q_map,
  .info = q_info,
  .close = q_close,
};
