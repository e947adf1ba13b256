/* fileio.h: facts about files and block devices, and whole-length I/O on
 * them, shared by the server's file backend, the copy's file endpoint,
 * the format readers and info. Every function may block on a device.
 * All return 0 or -errno unless said otherwise. */
#ifndef NBDFLOW_UTIL_FILEIO_H
#define NBDFLOW_UTIL_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One run of a file from a given offset: data, or a hole (reads as
 * zeroes). */
struct file_run {
  uint64_t length;
  bool hole;
};

/* The size of a regular file or block device; -EISDIR for a directory,
 * -ESPIPE for anything else (pipes, sockets, character devices). */
int file_size(int fd, uint64_t *size);

/* The run at off (data or hole) up to size, by SEEK_DATA/SEEK_HOLE; a
 * file system without them says data. -ENXIO when a regular file is now
 * shorter than size: what is gone must not be copied as zeroes. */
int file_run_at(int fd, uint64_t off, uint64_t size, struct file_run *run);

/* pread until len bytes or end of file; *got says how many arrived. */
int file_pread_full(int fd, void *buf, size_t len, uint64_t off,
                    size_t *got);
/* pread of exactly len bytes: -EIO (a short file) when fewer exist. */
int file_pread_exact(int fd, void *buf, size_t len, uint64_t off);
/* pwrite of all len bytes. */
int file_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
/* write(2) of all len bytes to a pipe or stream. */
int file_write_stream(int fd, const void *buf, size_t len);
/* After EAGAIN on a stream another process left non-blocking (O_NONBLOCK
 * belongs to the open file, which it shares): waits until fd is ready
 * for events (POLLIN, POLLOUT). 0, or -errno. */
int file_wait_ready(int fd, short events);

/* Makes [off, off + len) of a regular file read as zeroes without
 * writing them: a punched hole, else a zeroed range. -EOPNOTSUPP when
 * the file system can do neither. */
int file_punch_or_zero(int fd, uint64_t off, uint64_t len);

/* Whether the file lies on tmpfs or ramfs (its pages are memory), and
 * whether swap could move them (tmpfs). */
bool file_on_memory_fs(int fd, bool *swappable);

#endif
