/* fileio.c: see fileio.h. */
#include "util/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

int
file_size(int fd, uint64_t *size)
{
  struct stat st;
  if (fstat(fd, &st) < 0)
    return -errno;
  if (S_ISREG(st.st_mode)) {
    *size = (uint64_t)st.st_size;
    return 0;
  }
  if (S_ISBLK(st.st_mode))
    return ioctl(fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
  return S_ISDIR(st.st_mode) ? -EISDIR : -ESPIPE;
}

int
file_run_at(int fd, uint64_t off, uint64_t size, struct file_run *run)
{
  off_t d = lseek(fd, (off_t)off, SEEK_DATA);
  if (d < 0) {
    if (errno == ENXIO) { /* only a hole remains, or the file shrank */
      struct stat st;
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
          (uint64_t)st.st_size < size)
        return -ENXIO;
      *run = (struct file_run){ size - off, true };
      return 0;
    }
    if (errno == EINVAL || errno == ENOTSUP || errno == EOPNOTSUPP) {
      *run = (struct file_run){ size - off, false };
      return 0;
    }
    return -errno;
  }
  if ((uint64_t)d > off) {
    uint64_t end = (uint64_t)d < size ? (uint64_t)d : size;
    *run = (struct file_run){ end - off, true };
    return 0;
  }
  off_t h = lseek(fd, (off_t)off, SEEK_HOLE);
  uint64_t end = h < 0 || (uint64_t)h > size ? size : (uint64_t)h;
  if (end <= off)
    end = size;
  *run = (struct file_run){ end - off, false };
  return 0;
}

int
file_pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *got)
{
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, (char *)buf + done, len - done,
                      (off_t)(off + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      break;
    done += (size_t)n;
  }
  *got = done;
  return 0;
}

int
file_pread_exact(int fd, void *buf, size_t len, uint64_t off)
{
  size_t got;
  int r = file_pread_full(fd, buf, len, off, &got);
  if (r < 0)
    return r;
  return got == len ? 0 : -EIO;
}

int
file_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
  const char *p = buf;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

int
file_wait_ready(int fd, short events)
{
  struct pollfd p = { .fd = fd, .events = events };
  while (poll(&p, 1, -1) < 0)
    if (errno != EINTR)
      return -errno;
  return 0;
}

int
file_write_stream(int fd, const void *buf, size_t len)
{
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      int r = file_wait_ready(fd, POLLOUT);
      if (r < 0)
        return r;
      continue;
    }
    if (n < 0)
      return -errno;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int
file_punch_or_zero(int fd, uint64_t off, uint64_t len)
{
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                (off_t)len) == 0)
    return 0;
  if (fallocate(fd, FALLOC_FL_ZERO_RANGE, (off_t)off, (off_t)len) == 0)
    return 0;
  return errno == EOPNOTSUPP || errno == ENOTSUP ? -EOPNOTSUPP : -errno;
}

bool
file_on_memory_fs(int fd, bool *swappable)
{
  struct statfs sf;
  unsigned long fs = fstatfs(fd, &sf) < 0 ? 0 : (unsigned long)sf.f_type;
  if (swappable)
    *swappable = fs == TMPFS_MAGIC;
  return fs == TMPFS_MAGIC || fs == RAMFS_MAGIC;
}
