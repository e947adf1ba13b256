/* qcow2_write.c: see qcow2_write.h. Host layout, in clusters:
 *   0                header (112 bytes), the end-of-extensions marker
 *   1 ..             L1 table
 *   then             refcount table, refcount blocks
 *   then             one L2 table per L1 entry that has data
 *   then             data clusters, in guest order
 * Every cluster of the file is used once: its refcount is 1, and every L1
 * and L2 entry carries the COPIED flag, as qemu expects of refcount 1. */
#include "format/qcow2_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/common.h"
#include "format/qcow2_layout.h"
#include "util/fileio.h"
#include "util/zero.h"

#define QW_BITS 16u
#define QW_CLUSTER (UINT64_C(1) << QW_BITS)
#define QW_L2_ENTRIES (QW_CLUSTER / 8)
#define QW_REFS_PER_BLOCK (QW_CLUSTER / 2) /* 16-bit refcounts */
#define QW_HEADER_LEN 112u
/* The L1 table holds at most QCOW2_MAX_L1_ENTRIES (qemu's limit too), each
 * covering QW_L2_ENTRIES clusters: 2 PiB in 64 KiB clusters. */
#define QW_MAX_SIZE ((uint64_t)QCOW2_MAX_L1_ENTRIES * QW_L2_ENTRIES * QW_CLUSTER)

struct qcow2_writer {
  int fd;                 /* borrowed: the current put's */
  uint64_t size;          /* virtual, a multiple of the sector */
  uint64_t end;           /* the source's size */
  uint64_t nclusters;     /* guest clusters */
  uint8_t *alloc;         /* owned copy; NULL: all allocated */
  uint64_t l1_entries, l1_clusters;
  uint64_t rt_clusters, rb_clusters;
  uint64_t l2_tables;     /* L1 entries that have data */
  uint64_t data_clusters;
  uint64_t total;         /* clusters in the file */
  uint64_t data_start;    /* host cluster of the first data cluster */
  uint8_t *table;         /* owned: one cluster, to build tables in */
  uint64_t pos;
  bool started, done;
  /* Into a regular file, the header goes out with the corrupt bit set
   * and loses it once the disk's last byte is in, at header + 72: an
   * image cut short is not taken for a whole one. */
  bool marked;
  uint64_t header;
};

/* Whether fd is a regular file or a block device that this writer may
 * mark: not in append mode (where pwrite would append), its offset
 * known. */
static bool
qw_may_mark(struct qcow2_writer *w, int fd)
{
  struct stat st;
  int fl = fcntl(fd, F_GETFL);
  off_t at = lseek(fd, 0, SEEK_CUR);
  if (fstat(fd, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) ||
      fl < 0 || (fl & O_APPEND) || at < 0)
    return false;
  w->header = (uint64_t)at;
  return true;
}

static bool
qw_allocated(const struct qcow2_writer *w, uint64_t c)
{
  return w->alloc == NULL || (w->alloc[c / 8] >> (c % 8) & 1);
}

static uint64_t
qw_div_up(uint64_t a, uint64_t b)
{
  return a / b + (a % b != 0);
}

/* Allocated clusters under L1 entry i, a byte of the map at a time (a
 * table's clusters start on a byte: QW_L2_ENTRIES is a multiple of 8). */
static uint64_t
qw_table_count(const struct qcow2_writer *w, uint64_t i)
{
  uint64_t first = i * QW_L2_ENTRIES;
  uint64_t end = first + QW_L2_ENTRIES < w->nclusters ? first + QW_L2_ENTRIES
                                                      : w->nclusters;
  if (w->alloc == NULL)
    return end - first;
  uint64_t n = 0, c = first;
  for (; c + 8 <= end; c += 8)
    n += (uint64_t)__builtin_popcount(w->alloc[c / 8]);
  for (; c < end; c++)
    n += qw_allocated(w, c);
  return n;
}

/* Counts the tables and settles how many refcount clusters the file
 * needs, which counts them too. */
static void
qw_plan(struct qcow2_writer *w)
{
  w->l1_entries = qw_div_up(w->nclusters, QW_L2_ENTRIES);
  if (w->l1_entries == 0)
    w->l1_entries = 1;
  w->l1_clusters = qw_div_up(w->l1_entries * 8, QW_CLUSTER);
  for (uint64_t i = 0; i < w->l1_entries; i++) {
    uint64_t n = qw_table_count(w, i);
    w->data_clusters += n;
    w->l2_tables += n > 0;
  }
  uint64_t fixed = 1 + w->l1_clusters + w->l2_tables + w->data_clusters;
  w->rb_clusters = 1;
  w->rt_clusters = 1;
  for (;;) {
    uint64_t total = fixed + w->rt_clusters + w->rb_clusters;
    uint64_t rb = qw_div_up(total, QW_REFS_PER_BLOCK);
    uint64_t rt = qw_div_up(rb * 8, QW_CLUSTER);
    if (rb <= w->rb_clusters && rt <= w->rt_clusters)
      break;
    w->rb_clusters = rb > w->rb_clusters ? rb : w->rb_clusters;
    w->rt_clusters = rt > w->rt_clusters ? rt : w->rt_clusters;
  }
  w->total = fixed + w->rt_clusters + w->rb_clusters;
  w->data_start = 1 + w->l1_clusters + w->rt_clusters + w->rb_clusters +
                  w->l2_tables;
}

int
qcow2_writer_new(uint64_t size, const uint8_t *alloc,
                 struct qcow2_writer **out, char *err, size_t errlen)
{
  if (size > QW_MAX_SIZE)
    return fmt_fail(err, errlen, -EFBIG,
                    "a disk of %llu bytes is larger than a qcow2 of 64 KiB "
                    "clusters holds (2 PiB)", (unsigned long long)size);
  struct qcow2_writer *w = calloc(1, sizeof *w);
  if (w == NULL)
    return fmt_fail(err, errlen, -ENOMEM, "out of memory");
  w->fd = -1;
  w->end = size;
  w->size = (size + 511) / 512 * 512;
  w->nclusters = qw_div_up(w->size, QW_CLUSTER);
  size_t abytes = (size_t)(w->nclusters / 8 + 1);
  w->table = malloc(QW_CLUSTER);
  if (alloc && (w->alloc = malloc(abytes)) != NULL)
    memcpy(w->alloc, alloc, abytes);
  if (w->table == NULL || (alloc && w->alloc == NULL)) {
    qcow2_writer_free(w);
    return fmt_fail(err, errlen, -ENOMEM, "out of memory");
  }
  qw_plan(w);
  *out = w;
  return 0;
}

static int
qw_out(struct qcow2_writer *w, const uint8_t *p, uint64_t len)
{
  static const uint8_t zeroes[64 << 10];
  while (len > 0) {
    size_t n = len > sizeof zeroes ? sizeof zeroes : (size_t)len;
    int r = file_write_stream(w->fd, p ? p : zeroes, n);
    if (r < 0)
      return r;
    if (p)
      p += n;
    len -= n;
  }
  return 0;
}

static int
qw_header(struct qcow2_writer *w)
{
  struct qcow2_header h = {
    .version = 3,
    .cluster_bits = QW_BITS,
    .size = w->size,
    .l1_entries = (uint32_t)w->l1_entries,
    .l1_offset = QW_CLUSTER,
    .refcount_offset = (1 + w->l1_clusters) * QW_CLUSTER,
    .refcount_clusters = (uint32_t)w->rt_clusters,
    .refcount_order = 4,
    .header_len = QW_HEADER_LEN,
    .compression = QCOW2_COMPRESSION_DEFLATE,
    .incompat = w->marked ? QCOW2_INCOMPAT_CORRUPT : 0,
  };
  memset(w->table, 0, QW_CLUSTER);
  qcow2_header_encode(&h, w->table);
  /* The end of the extensions: eight zero bytes, already there. */
  return qw_out(w, w->table, QW_CLUSTER);
}

/* The L1 table: entry i points at the i-th L2 table written, if any. */
static int
qw_l1(struct qcow2_writer *w)
{
  uint64_t l2 = 1 + w->l1_clusters + w->rt_clusters + w->rb_clusters;
  uint64_t i = 0;
  for (uint64_t c = 0; c < w->l1_clusters; c++) {
    memset(w->table, 0, QW_CLUSTER);
    for (uint64_t j = 0; j < QW_L2_ENTRIES && i < w->l1_entries; j++, i++) {
      if (qw_table_count(w, i) > 0)
        qcow2_put64(w->table + 8 * j,
                    (l2++ * QW_CLUSTER) | QCOW2_OFLAG_COPIED);
    }
    int r = qw_out(w, w->table, QW_CLUSTER);
    if (r < 0)
      return r;
  }
  return 0;
}

/* The refcount table and blocks: every cluster of the file counts 1. */
static int
qw_refcounts(struct qcow2_writer *w)
{
  uint64_t rb0 = 1 + w->l1_clusters + w->rt_clusters;
  uint64_t b = 0;
  for (uint64_t c = 0; c < w->rt_clusters; c++) {
    memset(w->table, 0, QW_CLUSTER);
    for (uint64_t j = 0; j < QW_CLUSTER / 8 && b < w->rb_clusters; j++, b++)
      qcow2_put64(w->table + 8 * j, (rb0 + b) * QW_CLUSTER);
    int r = qw_out(w, w->table, QW_CLUSTER);
    if (r < 0)
      return r;
  }
  for (b = 0; b < w->rb_clusters; b++) {
    memset(w->table, 0, QW_CLUSTER);
    for (uint64_t j = 0; j < QW_REFS_PER_BLOCK; j++) {
      if (b * QW_REFS_PER_BLOCK + j >= w->total)
        break;
      w->table[2 * j + 1] = 1; /* big-endian 16-bit 1 */
    }
    int r = qw_out(w, w->table, QW_CLUSTER);
    if (r < 0)
      return r;
  }
  return 0;
}

/* The L2 tables, in L1 order: allocated clusters take the data clusters
 * in guest order. */
static int
qw_l2(struct qcow2_writer *w)
{
  uint64_t data = w->data_start;
  for (uint64_t i = 0; i < w->l1_entries; i++) {
    uint64_t first = i * QW_L2_ENTRIES;
    bool any = false;
    memset(w->table, 0, QW_CLUSTER);
    for (uint64_t j = 0; j < QW_L2_ENTRIES && first + j < w->nclusters;
         j++) {
      if (!qw_allocated(w, first + j))
        continue;
      qcow2_put64(w->table + 8 * j,
                  (data++ * QW_CLUSTER) | QCOW2_OFLAG_COPIED);
      any = true;
    }
    if (!any)
      continue;
    int r = qw_out(w, w->table, QW_CLUSTER);
    if (r < 0)
      return r;
  }
  return 0;
}

int
qcow2_writer_put(struct qcow2_writer *w, int fd, uint64_t off,
                 const uint8_t *buf, uint64_t len, char *err, size_t errlen)
{
  int r;
  w->fd = fd;
  if (off != w->pos || w->done || len > w->end - off)
    return fmt_fail(err, errlen, -EINVAL,
                   "qcow2 writer: %llu bytes at offset %llu out of order "
                   "(expected offset %llu)", (unsigned long long)len,
                   (unsigned long long)off, (unsigned long long)w->pos);
  if (!w->started) {
    w->started = true;
    w->marked = qw_may_mark(w, fd);
    r = qw_header(w);
    if (r == 0)
      r = qw_l1(w);
    if (r == 0)
      r = qw_refcounts(w);
    if (r == 0)
      r = qw_l2(w);
    if (r < 0)
      return fmt_fail(err, errlen, r, "writing the qcow2 tables");
  }
  while (len > 0) {
    uint64_t c = off / QW_CLUSTER, in = off % QW_CLUSTER;
    uint64_t n = QW_CLUSTER - in < len ? QW_CLUSTER - in : len;
    if (!qw_allocated(w, c)) {
      if (buf && !buf_is_zero(buf, (size_t)n))
        return fmt_fail(err, errlen, -EIO,
                       "data at offset %llu, in a cluster the source's map "
                       "called empty: the source changed during the copy",
                       (unsigned long long)off);
    } else {
      r = qw_out(w, buf, n);
      /* The last cluster is whole in the file. */
      if (r == 0 && off + n == w->end && in + n < QW_CLUSTER)
        r = qw_out(w, NULL, QW_CLUSTER - (in + n));
      if (r < 0)
        return fmt_fail(err, errlen, r, "writing cluster %llu",
                       (unsigned long long)c);
    }
    off += n;
    len -= n;
    if (buf)
      buf += n;
  }
  w->pos = off;
  if (w->pos == w->end && w->marked) {
    /* Whole: the incompatible features field goes back to none, once
     * the rest is durable (else a power loss could keep the header and
     * lose the data it vouches for). */
    static const uint8_t none[8];
    r = fdatasync(fd) < 0 ? -errno : 0;
    if (r == 0)
      r = file_pwrite_full(fd, none, sizeof none,
                           w->header + QCOW2_HEADER_INCOMPAT_OFFSET);
    if (r < 0)
      return fmt_fail(err, errlen, r, "clearing the qcow2 header's corrupt "
                      "bit at the end");
  }
  w->done = w->pos == w->end;
  return 0;
}

bool
qcow2_writer_done(const struct qcow2_writer *w)
{
  return w->done;
}

void
qcow2_writer_free(struct qcow2_writer *w)
{
  if (w == NULL)
    return;
  free(w->alloc);
  free(w->table);
  free(w);
}
