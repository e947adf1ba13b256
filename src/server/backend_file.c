/* backend_file.c: regular files and block devices.
 *
 * One fd per export, shared by all connections and threads: pread/pwrite
 * at explicit offsets need no lock, and FLUSH (fdatasync) covers every
 * connection's writes, which is what makes multi-conn safe. */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "export.h"
#include "net/sock.h"
#include "proto/nbd.h"
#include "util/fileio.h"
#include "util/log.h"

/* Whether the file system preallocates (fallocate mode 0). Some punch
 * holes but cannot allocate (ext4 without extents): there a NO_HOLE
 * zeroing that punched first would zero the range and then fail. */
enum { FILE_ALLOC_UNKNOWN, FILE_ALLOC_YES, FILE_ALLOC_NO };

struct file_priv {
  int fd;              /* the file, shared by every thread */
  bool is_blockdev;
  /* A regular file on tmpfs or ramfs (read-only or not): its pages are
   * the data, so READs may leave from them (map) and its writers are
   * serialised by write_lock (struct export's write_serial). */
  bool memory_fs;
  pthread_mutex_t write_lock;
  bool no_fast_zero;   /* a block device that refused a fast zero (atomic) */
  uint32_t unit;       /* a block device's zeroing unit, see blk_inner */
  bool can_punch;      /* cleared once the file system says no */
  bool can_zero_range; /* likewise */
  int can_alloc;       /* FILE_ALLOC_*: preallocation, probed (atomic) */
  /* SEEK_HOLE on tmpfs walks the page cache page by page up to the next
   * hole: asked once per READ or BLOCK_STATUS, it would cost every
   * request the rest of a dense file (minutes for 2 GiB). So the last
   * answer is kept: [data_from, data_to) holds no hole. Writes only fill
   * holes, so it stays true; punching or zeroing clears it, and bumps
   * hint_gen so that an lseek that raced with it is not kept. */
  pthread_mutex_t hint_lock;
  uint64_t data_from, data_to;
  uint64_t hint_gen;
};

static inline int
file_fd(const struct export *e)
{
  return ((const struct file_priv *)e->priv)->fd;
}

/* True when the kept answer covers off: data from off to *hole. */
static bool
file_hint(struct file_priv *fp, uint64_t off, uint64_t *hole)
{
  pthread_mutex_lock(&fp->hint_lock);
  bool known = off >= fp->data_from && off < fp->data_to;
  if (known)
    *hole = fp->data_to;
  pthread_mutex_unlock(&fp->hint_lock);
  return known;
}

/* The first hole at or after off, which holds data (or the end of the
 * file); kept for the next request. */
static int
file_next_hole(struct export *e, uint64_t off, uint64_t *hole)
{
  struct file_priv *fp = e->priv;
  pthread_mutex_lock(&fp->hint_lock);
  uint64_t gen = fp->hint_gen;
  pthread_mutex_unlock(&fp->hint_lock);
  off_t h = lseek(file_fd(e), (off_t)off, SEEK_HOLE);
  if (h < 0)
    return -errno;
  *hole = (uint64_t)h;
  pthread_mutex_lock(&fp->hint_lock);
  if (*hole > off && gen == fp->hint_gen) {
    fp->data_from = off;
    fp->data_to = *hole;
  }
  pthread_mutex_unlock(&fp->hint_lock);
  return 0;
}

/* Holes may have appeared (called after punching or zeroing, whatever
 * its result): forget the kept answer and any answer still on its way. */
static void
file_forget_hint(struct export *e)
{
  struct file_priv *fp = e->priv;
  pthread_mutex_lock(&fp->hint_lock);
  fp->data_from = fp->data_to = 0;
  fp->hint_gen++;
  pthread_mutex_unlock(&fp->hint_lock);
}

static int
file_pread(struct export *e, void *buf, uint64_t len, uint64_t off)
{
  char *p = buf;
  while (len > 0) {
    ssize_t n = pread(file_fd(e), p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0) { /* a file shrunk under us: read zeroes, as a hole */
      memset(p, 0, len);
      return 0;
    }
    p += n;
    off += (uint64_t)n;
    len -= (uint64_t)n;
  }
  return 0;
}

static int
file_pwrite(struct export *e, const void *buf, uint64_t len, uint64_t off,
            bool fua)
{
  const char *p = buf;
  while (len > 0) {
    struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
    ssize_t n = pwritev2(file_fd(e), &iov, 1, (off_t)off, fua ? RWF_DSYNC : 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    off += (uint64_t)n;
    len -= (uint64_t)n;
  }
  return 0;
}

static int
file_flush(struct export *e)
{
  return fdatasync(file_fd(e)) < 0 ? -errno : 0;
}

static int
file_write_zeroes(struct export *e, uint64_t len, uint64_t off, bool fua)
{
  static const char zeroes[65536];
  while (len > 0) {
    uint64_t n = len < sizeof zeroes ? len : sizeof zeroes;
    int r = file_pwrite(e, zeroes, n, off, false);
    if (r < 0)
      return r;
    off += n;
    len -= n;
  }
  return fua ? file_flush(e) : 0;
}

/* A block device discards and zeroes whole logical blocks only (EINVAL
 * otherwise), while clients may ask for any byte range. [*a, *b) is the
 * part of off + len made of whole units, empty when there is none; a unit
 * is a logical block, but at least a page, so that no cached page is
 * shared between what the device zeroes and what is written around it. */
static void
blk_inner(const struct file_priv *fp, uint64_t off, uint64_t len,
          uint64_t *a, uint64_t *b)
{
  *a = (off + fp->unit - 1) / fp->unit * fp->unit;
  *b = (off + len) / fp->unit * fp->unit;
  if (*b < *a)
    *b = *a;
}

/* Zeroes a range of a block device: the device does the whole units
 * (BLKZEROOUT, where the kernel writes the zeroes itself if the device
 * has no zeroing command), and the partial units at the edges are
 * written as zeroes. A fast zero must not fall back: only a punch that
 * may unmap refuses to (no call from user space both keeps the blocks
 * provisioned and refuses to fall back, so NO_HOLE is never fast here). */
static int
blk_zero(struct export *e, uint64_t len, uint64_t off, bool may_trim,
         bool fast)
{
  struct file_priv *fp = e->priv;
  uint64_t a, b;
  int r;
  blk_inner(fp, off, len, &a, &b);
  if (fast) {
    if (!may_trim || b == a ||
        __atomic_load_n(&fp->no_fast_zero, __ATOMIC_RELAXED))
      return -ENOTSUP;
    /* The punch drops the range's cached pages, dirty ones too, before
     * it asks the device; should the device say no, their data would be
     * lost, so it reaches the device first. */
    r = sync_file_range(file_fd(e), (off_t)a, (off_t)(b - a),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER) == 0 ? 0 : -errno;
    if (r == 0)
      r = fallocate(file_fd(e), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)a, (off_t)(b - a)) == 0 ? 0 : -errno;
    if (r == -EOPNOTSUPP) { /* no zeroing command: do not ask again */
      __atomic_store_n(&fp->no_fast_zero, true, __ATOMIC_RELAXED);
      return -ENOTSUP;
    }
  } else if (b > a) {
    uint64_t range[2] = { a, b - a };
    r = ioctl(file_fd(e), BLKZEROOUT, range) == 0 ? 0 : -errno;
    if (r == -EOPNOTSUPP || r == -ENOTTY)
      r = file_write_zeroes(e, b - a, a, false);
  } else {
    return file_write_zeroes(e, len, off, false); /* all of it is edge */
  }
  if (r == 0 && a > off)
    r = file_write_zeroes(e, a - off, off, false);
  if (r == 0 && off + len > b)
    r = file_write_zeroes(e, off + len - b, b, false);
  return r;
}

static int
file_punch(struct export *e, uint64_t len, uint64_t off)
{
  struct file_priv *fp = e->priv;
  if (!fp->can_punch)
    return -EOPNOTSUPP;
  int r;
  if (fp->is_blockdev) {
    /* TRIM is advisory: partial units at the edges are left alone. */
    uint64_t a, b;
    blk_inner(fp, off, len, &a, &b);
    uint64_t range[2] = { a, b - a };
    r = b == a || ioctl(file_fd(e), BLKDISCARD, range) == 0 ? 0 : -errno;
  } else {
    r = fallocate(file_fd(e), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)off, (off_t)len) == 0 ? 0 : -errno;
  }
  file_forget_hint(e);
  if (r == -EOPNOTSUPP || r == -ENOTTY)
    fp->can_punch = false;
  return r;
}

static int
file_zero(struct export *e, uint64_t len, uint64_t off, bool may_trim,
          bool fast, bool fua)
{
  struct file_priv *fp = e->priv;
  int r;

  if (fp->is_blockdev) {
    r = blk_zero(e, len, off, may_trim, fast);
    return r == 0 && fua ? file_flush(e) : r;
  }
  /* A punched hole reads as zeroes on every Linux file system that
   * supports punching; without may_trim, it is allocated again after, on
   * a file system known to allocate. The first such zeroing finds out by
   * allocating its first block, which leaves the contents as they are. */
  int alloc = __atomic_load_n(&fp->can_alloc, __ATOMIC_RELAXED);
  if (!may_trim && alloc == FILE_ALLOC_UNKNOWN) {
    off_t probe = len < 4096 ? (off_t)len : 4096;
    if (fallocate(file_fd(e), FALLOC_FL_KEEP_SIZE, (off_t)off, probe) == 0)
      alloc = FILE_ALLOC_YES;
    else if (errno == EOPNOTSUPP)
      alloc = FILE_ALLOC_NO;
    else
      return -errno;
    __atomic_store_n(&fp->can_alloc, alloc, __ATOMIC_RELAXED);
  }
  if ((may_trim || alloc == FILE_ALLOC_YES) && file_punch(e, len, off) == 0) {
    if (!may_trim &&
        fallocate(file_fd(e), FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0)
      return -errno; /* out of space, say: the range reads as zeroes */
    return fua ? file_flush(e) : 0;
  }
  if (fp->can_zero_range) {
    r = fallocate(file_fd(e), FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                  (off_t)off, (off_t)len) == 0 ? 0 : -errno;
    file_forget_hint(e); /* ZERO_RANGE may leave unwritten extents */
    if (r == 0)
      return fua ? file_flush(e) : 0;
    if (r != -EOPNOTSUPP)
      return r;
    fp->can_zero_range = false;
  }
  if (fast)
    return -ENOTSUP;
  return file_write_zeroes(e, len, off, fua);
}

static int
file_trim(struct export *e, uint64_t len, uint64_t off, bool fua)
{
  int r = file_punch(e, len, off);
  if (r == -EOPNOTSUPP || r == -ENOTTY)
    return 0; /* TRIM is advisory */
  if (r < 0)
    return r;
  return fua ? file_flush(e) : 0;
}

static int
file_cache(struct export *e, uint64_t len, uint64_t off)
{
  int r = posix_fadvise(file_fd(e), (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
  return -r;
}

static int
file_extents(struct export *e, uint64_t off, uint64_t len, struct extent *ext,
             int max)
{
  struct file_priv *fp = e->priv;
  uint64_t end = off + len;
  int n = 0;

  if (fp->is_blockdev) {
    ext[0] = (struct extent){ .length = len, .flags = 0 };
    return 1;
  }
  while (off < end && n < max) {
    uint64_t h = end;
    bool known = file_hint(fp, off, &h);
    off_t data = known ? (off_t)off : lseek(file_fd(e), (off_t)off, SEEK_DATA);
    if (data < 0 && errno != ENXIO)
      return n > 0 ? n : -errno;
    uint64_t d = data < 0 ? end : (uint64_t)data;
    if (d > off) { /* a hole first */
      uint64_t l = (d < end ? d : end) - off;
      ext[n++] = (struct extent){ .length = l,
                                  .flags = NBD_STATE_HOLE | NBD_STATE_ZERO };
      off += l;
      continue;
    }
    int r = known ? 0 : file_next_hole(e, off, &h);
    if (r < 0)
      return n > 0 ? n : r;
    if (h > end)
      h = end;
    if (h <= off) /* racing truncation: call the rest data */
      h = end;
    ext[n++] = (struct extent){ .length = h - off, .flags = 0 };
    off = h;
  }
  return n;
}

/* Writes through a bounce buffer, for file systems that cannot splice. */
static int
file_copy_in(struct export *e, int pipefd, uint64_t len, uint64_t off)
{
  size_t cap = len < (1u << 20) ? (size_t)len : (1u << 20);
  char *buf = malloc(cap);
  int r = 0;
  if (buf == NULL) {
    sock_pipe_drain(pipefd);
    return -ENOMEM;
  }
  while (len > 0 && r == 0) {
    ssize_t n = read(pipefd, buf, len < cap ? (size_t)len : cap);
    if (n <= 0) {
      r = n < 0 && errno != EAGAIN ? -errno : -EIO;
      break;
    }
    r = file_pwrite(e, buf, (uint64_t)n, off, false);
    off += (uint64_t)n;
    len -= (uint64_t)n;
  }
  free(buf);
  if (r < 0)
    sock_pipe_drain(pipefd);
  return r;
}

static int
file_splice_in(struct export *e, int pipefd, uint64_t len, uint64_t off,
               bool fua)
{
  loff_t pos = (loff_t)off;
  bool moved = false;
  int r = 0;

  while (len > 0) {
    ssize_t n = splice(pipefd, NULL, file_fd(e), &pos, len, SPLICE_F_MOVE);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EINVAL && !moved) {
      r = file_copy_in(e, pipefd, len, (uint64_t)pos);
      break;
    }
    if (n <= 0) {
      r = n < 0 ? -errno : -EIO; /* n == 0: the payload was short */
      sock_pipe_drain(pipefd);
      break;
    }
    moved = true;
    len -= (uint64_t)n;
  }
  if (r == 0 && fua)
    r = file_flush(e);
  return r;
}

static void
file_close(struct export *e)
{
  struct file_priv *fp = e->priv;
  if (fp == NULL)
    return;
  if (fp->fd >= 0)
    close(fp->fd);
  pthread_mutex_destroy(&fp->hint_lock);
  pthread_mutex_destroy(&fp->write_lock);
  free(fp);
}

/* A file maps one to one: its READs may leave from its pages. */
static int
file_map(struct export *e, uint64_t off, uint64_t len, int *fd,
         uint64_t *host_off, uint64_t *run)
{
  struct file_priv *fp = e->priv;
  if (!fp->memory_fs || off >= e->size)
    return -EAGAIN;
  *fd = fp->fd;
  *host_off = off;
  *run = e->size - off < len ? e->size - off : len;
  return 0;
}

const struct backend_ops backend_file_ops = {
  .kind = "file",
  .pread = file_pread,
  .pwrite = file_pwrite,
  .zero = file_zero,
  .trim = file_trim,
  .flush = file_flush,
  .cache = file_cache,
  .extents = file_extents,
  .splice_in = file_splice_in,
  .map = file_map,
  .close = file_close,
};

int
backend_file_open(struct export *e, const char *path)
{
  struct file_priv *fp = calloc(1, sizeof *fp);
  struct stat st;

  if (fp == NULL)
    return -ENOMEM;
  pthread_mutex_init(&fp->hint_lock, NULL);
  pthread_mutex_init(&fp->write_lock, NULL);
  e->ops = &backend_file_ops;
  e->priv = fp;
  fp->fd = open(path, (e->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fp->fd < 0 && errno == EROFS && !e->read_only) {
    log_warn("export \"%s\": %s is on a read-only file system; serving it "
             "read-only", e->name, path);
    e->read_only = true;
    fp->fd = open(path, O_RDONLY | O_CLOEXEC);
  } else if (fp->fd < 0 && (errno == EACCES || errno == EPERM) &&
             !e->read_only) {
    /* As nbdkit does: a file we may read but not write is served for
     * reading, and the log says so (a -r makes it quiet). */
    int err = errno;
    fp->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fp->fd >= 0) {
      log_warn("export \"%s\": %s cannot be opened for writing (%s); "
               "serving it read-only", e->name, path, strerror(err));
      e->read_only = true;
    } else {
      errno = err;
    }
  }
  if (fp->fd < 0 || fstat(fp->fd, &st) < 0) {
    int err = errno;
    log_error("export \"%s\": cannot open %s: %s", e->name, path,
              strerror(err));
    return -err;
  }
  if (S_ISBLK(st.st_mode)) {
    int lbs = 0;
    long page = sysconf(_SC_PAGESIZE);
    fp->is_blockdev = true;
    e->kind = "block device";
    if (ioctl(fp->fd, BLKSSZGET, &lbs) < 0 || lbs <= 0)
      lbs = 512;
    fp->unit = page > lbs ? (uint32_t)page : (uint32_t)lbs;
    if (ioctl(fp->fd, BLKGETSIZE64, &e->size) < 0) {
      int err = errno;
      log_error("export \"%s\": cannot size block device %s: %s", e->name,
                path, strerror(err));
      return -err;
    }
  } else if (S_ISREG(st.st_mode)) {
    e->size = (uint64_t)st.st_size;
    fp->memory_fs = file_on_memory_fs(fp->fd, &e->swappable);
    if (fp->memory_fs)
      e->write_serial = &fp->write_lock;
    /* Swap that cannot be told counts as active. */
    e->write_in_memory = fp->memory_fs &&
                         (!e->swappable || export_swap_active() == 0);
  } else {
    log_error("export \"%s\": %s is neither a regular file nor a block "
              "device", e->name, path);
    return -EINVAL;
  }
  fp->can_punch = true;
  fp->can_zero_range = true;
  e->can_trim = true;
  e->can_fast_zero = true;
  return 0;
}
