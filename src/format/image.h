/* image.h: the format layer. A disk image in a container format (VHD)
 * is opened here and read through a small table of operations; the copy
 * endpoints and the server's backends use it, so that neither the engine
 * nor the server knows a format. Raw files are not images here: they are
 * the file endpoint and backend themselves, and image_probe says "raw"
 * for them.
 *
 * Every operation is synchronous and thread-safe: the server's workers
 * and the copy's workers call pread and extents concurrently. map never
 * blocks (it answers from memory) and may be called from a loop thread.
 * All return 0 or -errno; a failure to open comes with one sentence in
 * err that names the file and what is wrong.
 *
 * A format that can write in place (VHD) offers pwrite, zero, trim and
 * flush; they are synchronous and thread-safe too, and may run
 * concurrently with each other and with reads. Only an image opened with
 * image_opts.writable (img->writable) is written. */
#ifndef NBDFLOW_FORMAT_IMAGE_H
#define NBDFLOW_FORMAT_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum image_format {
  IMAGE_FORMAT_AUTO, /* probe the magic: never opens a parent */
  IMAGE_FORMAT_RAW,
  IMAGE_FORMAT_VHD,
  IMAGE_FORMAT_QCOW2,
};

/* Extent flags; the values are NBD's base:allocation bits. */
#define IMAGE_HOLE 1u /* not allocated in the image (nor its parents) */
#define IMAGE_ZERO 2u /* reads as zeroes */

struct image_extent {
  uint64_t length;
  uint32_t flags; /* IMAGE_* */
};

/* [virtual off, off + length) lies at host_off of fd (owned by the
 * image). */
struct image_map {
  int fd;
  uint64_t host_off;
  uint64_t length;
};

struct image_opts {
  enum image_format format;
  /* The format was named by the user: parents may be opened. A probed
   * image never opens a parent (a guest can write a VHD footer into a
   * raw disk and name any file on the host as its parent). */
  bool format_given;
  bool ignore_checksums;
  /* Open the image (the top of a chain; parents never) for writing. An
   * image whose format cannot write, or whose file cannot be opened for
   * writing, opens read-only: img->writable says which. */
  bool writable;
  /* Open it to be checked (image_ops.check): checksums, the footer copy
   * and BAT entries outside the file are reported by check rather than
   * refused. Such an image is only checked, never read. */
  bool check;
};

/* Flags of the writing operations. */
#define IMAGE_FUA 1u      /* durable on the medium when it returns */
#define IMAGE_MAY_TRIM 2u /* zero: may deallocate (a hole reads as zeroes) */
#define IMAGE_FAST 4u     /* zero: -ENOTSUP, changing nothing, unless it is
                             cheaper than writing zeroes */

/* What check found: each finding goes to report (error: the image is
 * wrong: a reader could read wrong bytes, or a writer could overwrite
 * one structure with another; else a note: a valid image with, say,
 * lost space) and is counted. */
struct image_check {
  void (*report)(void *ctx, bool error, const char *msg);
  void *ctx;
  uint64_t errors, notes;
  uint64_t lost;    /* bytes of the file that nothing points at */
};

/* What info shows. */
struct image_info {
  const char *format;      /* "vhd" */
  const char *disk_type;   /* "fixed", "dynamic", "differencing" */
  uint32_t block_size;     /* 0 for a fixed disk */
  uint64_t allocated;      /* bytes of data blocks this file holds */
  char creator[5];
  const char *const *parents; /* nearest first, nparents of them */
  int nparents;
  /* Every file of the image lies on tmpfs or ramfs, and swap could move
   * some of its pages (tmpfs). */
  bool in_memory;
  bool swappable;
  /* A writable image: the smallest write that needs no read-modify-
   * write (a VHD's sector, 1 for a fixed disk), and whether trim does
   * anything. */
  uint32_t write_block;
  bool can_trim;
  bool can_fast_zero;
  /* The image says its content may be wrong (qcow2's corrupt bit: its
   * writer was cut short, or qemu found its tables inconsistent). */
  bool marked_corrupt;
};

/* Where an image's bytes are when they are not a local file: an NBD
 * export, say. pread reads all of len bytes or fails (-EIO past the
 * end); it is synchronous and thread-safe. Such an image has no map (no
 * descriptor to send from) and opens no parent (there is no directory
 * to look for it in). */
struct image_io {
  uint64_t size;
  int (*pread)(struct image_io *io, void *buf, size_t len, uint64_t off);
  void (*close)(struct image_io *io);
  void *priv;
};

struct image;

struct image_ops {
  const char *name;
  /* Pure: whether the file's first and last bytes (head: up to 512 from
   * offset 0, tail: up to 512 ending at its end) look like this format. */
  bool (*probe)(const uint8_t *head, size_t head_len, const uint8_t *tail,
                size_t tail_len);
  /* Opens the image in fd, or when fd is -1 in io (either owned by img
   * from the call on, whatever the result), and sets img->size. */
  int (*open)(struct image *img, int fd, struct image_io *io,
              const struct image_opts *o, char *err, size_t errlen);
  /* pread and extents say what they found wrong (a table entry past the
   * end of the file, a cluster that does not inflate) in why, when they
   * know more than the errno. */
  int (*pread)(struct image *img, void *buf, uint64_t len, uint64_t off,
               char *why, size_t whylen);
  /* Describes [off, off + len) from off on in at most max extents that
   * cover at least one byte; returns how many or -errno. */
  int (*extents)(struct image *img, uint64_t off, uint64_t len,
                 struct image_extent *ext, int max, char *why,
                 size_t whylen);
  /* Optional, never blocks: see struct image_map; -EAGAIN when the start
   * of the range cannot be mapped without I/O or not at all. */
  int (*map)(struct image *img, uint64_t off, uint64_t len,
             struct image_map *m);
  /* allocation: count the bytes of data blocks too, which may read every
   * table of the image (info does; serve and copy do not ask). */
  void (*info)(struct image *img, struct image_info *out, bool allocation);
  void (*close)(struct image *img);
  /* Optional (NULL: read-only format); called only when img->writable.
   * pwrite writes [off, off + len), within the disk, from buf; zero makes
   * it read as zeroes (IMAGE_MAY_TRIM, IMAGE_FAST); trim says the range
   * is no longer needed (it reads as anything after, zeroes or not: the
   * format does what is cheap); flush makes every write that has
   * returned durable; IMAGE_FUA makes this one durable. */
  int (*pwrite)(struct image *img, const void *buf, uint64_t len,
                uint64_t off, unsigned flags, char *why, size_t whylen);
  int (*zero)(struct image *img, uint64_t len, uint64_t off, unsigned flags,
              char *why, size_t whylen);
  int (*trim)(struct image *img, uint64_t len, uint64_t off, unsigned flags,
              char *why, size_t whylen);
  int (*flush)(struct image *img);
  /* Optional: checks the image's structures (an image opened with
   * image_opts.check), reporting into c; 0, or -errno when the file
   * could not be read. */
  int (*check)(struct image *img, struct image_check *c);
  /* Optional: when the file (dev, ino) is a parent somewhere in img's
   * chain (never img itself), sets in bits (one per `block` bytes of the
   * virtual disk, LSB first, zeroed by the caller) every block in which
   * a level above that parent holds data, and returns 1: the rest reads
   * as the parent does. 0 when the file is not in the chain. */
  int (*above)(struct image *img, dev_t dev, ino_t ino, uint64_t block,
               uint8_t *bits);
};

struct image {
  const struct image_ops *ops;
  char *path;     /* owned, for messages */
  uint64_t size;  /* virtual size in bytes */
  bool writable;  /* opened for writing, by a format that can */
  void *priv;     /* the format's state */
};

/* Which format the file in fd holds (by its magic): IMAGE_FORMAT_RAW,
 * _VHD or _QCOW2, or -errno when it cannot be read. */
int image_probe(int fd);

/* Opens path as format o->format (AUTO: probed). Returns 1 with *out set
 * for an image in a format, 0 with *out NULL when the file is raw (the
 * caller opens it as a plain file), or -errno with a sentence in err. */
int image_open(const char *path, const struct image_opts *o,
               struct image **out, char *err, size_t errlen);
/* The same for an image whose bytes io reads (owned from the call on,
 * whatever the result), named name in messages; o->format must name a
 * format (an export is not probed). */
int image_open_io(struct image_io *io, const char *name,
                  const struct image_opts *o, struct image **out, char *err,
                  size_t errlen);
void image_close(struct image *img);

/* Parses "raw", "vhd" (or qemu's "vpc"), "qcow2" or "auto"; -EINVAL
 * otherwise. */
int image_format_parse(const char *s, enum image_format *f);
const char *image_format_name(enum image_format f);

/* An image written in one forward pass, as a stream (a pipe, or a new
 * file): its tables first, so which blocks hold data is known before the
 * first byte (alloc: one bit per block of image_writer_block bytes, LSB
 * first, set for data; NULL: all). Data then arrives in offset order;
 * data into a block called empty must be zeroes. The image is complete
 * (done) once the disk's last byte is in; a writer stopped before leaves
 * a file no reader takes for a whole image. Not thread-safe. */
struct image_writer;
/* The allocation granularity of format f's writer; 0 when f has none. */
uint32_t image_writer_block(enum image_format f);
/* Checks that a disk of size bytes fits format f and prepares the tables;
 * writes nothing yet. -errno with a sentence in err. */
int image_writer_new(enum image_format f, uint64_t size, const uint8_t *alloc,
                     struct image_writer **out, char *err, size_t errlen);
/* The next len bytes of the disk at off (where the last put ended) into
 * fd (borrowed); buf NULL: zeroes. */
int image_writer_put(struct image_writer *w, int fd, uint64_t off,
                     const uint8_t *buf, uint64_t len, char *err,
                     size_t errlen);
bool image_writer_done(const struct image_writer *w);
void image_writer_free(struct image_writer *w);

extern const struct image_ops image_vhd_ops;
extern const struct image_ops image_qcow2_ops;

#endif
