/* export.h: what the server serves, behind a table of backend functions.
 *
 * Backends are file (regular files and block devices), memory and null.
 * Every function may block (file I/O) and is called from worker threads,
 * concurrently for different requests of one or several connections; on
 * an export with write_in_memory, pwrite and splice_in are also called
 * from event-loop threads. Each backend is responsible for its own thread
 * safety. Offsets and lengths have been checked against the export size
 * before any call. All return 0 or -errno. */
#ifndef NBDFLOW_SERVER_EXPORT_H
#define NBDFLOW_SERVER_EXPORT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct export;

/* One run of equal allocation state; flags are NBD_STATE_* bits. */
struct extent {
  uint64_t length;
  uint32_t flags;
};

struct backend_ops {
  const char *kind;
  int (*pread)(struct export *e, void *buf, uint64_t len, uint64_t off);
  int (*pwrite)(struct export *e, const void *buf, uint64_t len, uint64_t off,
                bool fua);
  /* Makes the range read as zeroes. may_trim: a hole is allowed; fast:
   * fail with -ENOTSUP, leaving data untouched, unless it is cheaper than
   * writing zeroes. */
  int (*zero)(struct export *e, uint64_t len, uint64_t off, bool may_trim,
              bool fast, bool fua);
  int (*trim)(struct export *e, uint64_t len, uint64_t off, bool fua);
  int (*flush)(struct export *e);
  int (*cache)(struct export *e, uint64_t len, uint64_t off);
  /* Describes [off, off+len) from off on, in at most max extents that
   * together cover at least one byte and at most the range. Returns the
   * number of extents or -errno. */
  int (*extents)(struct export *e, uint64_t off, uint64_t len,
                 struct extent *ext, int max);
  /* Optional: writes len bytes waiting in the pipe pipefd at off, moving
   * pages instead of copying them where the kernel can. On return the
   * pipe is empty, whatever the result. NULL when unsupported. */
  int (*splice_in)(struct export *e, int pipefd, uint64_t len, uint64_t off,
                   bool fua);
  /* Optional, never blocks: where [off, off + len) lies in a file, as
   * (fd, host offset, run of 1 to len bytes), so that a READ's data may
   * leave by sendfile(2) from the file's pages. -EAGAIN when the start of
   * the range cannot be mapped without I/O. Only exports whose data is
   * in memory (write_in_memory) are sent this way. */
  int (*map)(struct export *e, uint64_t off, uint64_t len, int *fd,
             uint64_t *host_off, uint64_t *run);
  void (*close)(struct export *e);
};

struct export {
  char *name;        /* owned; "" never: the default export is exports[0] */
  char *description; /* owned, may be NULL */
  const struct backend_ops *ops;
  uint64_t size;
  bool read_only;
  bool can_trim;      /* TRIM does something */
  bool can_fast_zero; /* zeroing is cheaper than writing */
  /* The minimum block size to advertise (NBD_INFO_BLOCK_SIZE); 0: 1. An
   * image whose smaller writes cost a read (a VHD's 512-byte sectors)
   * asks clients for whole blocks; it still takes smaller ones from a
   * client that did not ask for the sizes (req_check). */
  uint32_t min_block;
  /* A WRITE only copies into memory and never waits for a device: a
   * file on tmpfs or ramfs while no swap is active, or null. The event
   * loop runs small ones itself (SERVER_INLINE_WRITE), and a file's READ
   * replies are sent from its pages (req_from_file). Read by every
   * thread and, on a swappable export, changed by the first loop as swap
   * comes and goes: access it atomically. */
  bool write_in_memory;
  /* Data in memory whose pages swap may move out (a file on tmpfs): in
   * memory only while no swap is active (export_swap_active). */
  bool swappable;
  /* Set by a backend whose writers the kernel serialises (a file in
   * memory: the kernel lets one writer of a file in at a time and makes
   * the others spin on its inode's lock). Held by a worker around each
   * WRITE, and tried by a loop reading a TCP connection (a loop reading a
   * Unix socket writes without it; TRIM and zeroing do not take it): a
   * TCP loop that finds it busy hands its write to a worker and reads on
   * (SERVER_INLINE_WRITE), and a worker that waits sleeps instead. NULL:
   * writers run side by side. Owned by the backend. */
  pthread_mutex_t *write_serial;
  /* What the export is, for the log ("file", "block device", "vhd"...);
   * NULL: ops->kind. */
  const char *kind;
  void *priv;         /* backend state, owned by the backend */
};

/* How files are opened: the image format and checksum rule (serve's
 * --ignore-checksums). */
struct export_opts {
  bool read_only;
  bool ignore_checksums;
};

/* What the command line alone shows is wrong with an export argument
 * (NAME=TARGET or TARGET): a name too long or not UTF-8, no TARGET, a bad
 * memory: or null: size, a format prefix before a URI. Its NBD name goes
 * into name (namecap bytes). 0, or -errno with one line in err. */
int export_check(const char *arg, char *name, size_t namecap, char *err,
                 size_t errlen);
/* Parses "[NAME=]TARGET" (TARGET: path, vhd:PATH, raw:PATH, memory:SIZE,
 * null:SIZE) and opens it; a path is probed for its format. On failure
 * logs one line naming the argument and returns -errno. */
int export_open(const char *arg, const struct export_opts *o,
                struct export **out);
void export_close(struct export *e);

/* Whether any swap area is active: then tmpfs pages may be swapped out,
 * and writing to them may wait for the swap device. Reads /proc/swaps:
 * 1 when one is, 0 when none is, -errno when that cannot be told. */
int export_swap_active(void);

/* What e is, for the log: "file", "block device", "memory" or "null". */
const char *export_kind(const struct export *e);
/* Transmission flags for e, given whether structured replies are on. */
uint16_t export_tflags(const struct export *e, bool structured);

extern const struct backend_ops backend_file_ops;
extern const struct backend_ops backend_memory_ops;
extern const struct backend_ops backend_null_ops;
int backend_file_open(struct export *e, const char *path);
int backend_memory_open(struct export *e, uint64_t size);
int backend_null_open(struct export *e, uint64_t size);
struct image;
extern const struct backend_ops backend_image_ops;
/* Serves img (owned from the call on): read-write when img->writable. */
int backend_image_open(struct export *e, struct image *img);

#endif
