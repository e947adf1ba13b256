/* image.c: choosing and opening a format (see image.h). */
#include "format/image.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/qcow2_write.h"
#include "format/vhd_layout.h"
#include "format/vhd_write.h"
#include "util/fileio.h"

static const struct image_ops *const formats[] = { &image_qcow2_ops,
                                                   &image_vhd_ops };

/* The first and last 512 bytes of fd (fewer for a smaller file). */
static int
image_ends(int fd, uint8_t head[512], size_t *hl, uint8_t tail[512],
           size_t *tl)
{
  uint64_t size;
  int r = file_size(fd, &size);
  if (r < 0)
    return r;
  size_t n = size < 512 ? (size_t)size : 512;
  r = file_pread_full(fd, head, n, 0, hl);
  if (r == 0)
    r = file_pread_full(fd, tail, n, size - n, tl);
  return r;
}

static const struct image_ops *
image_probe_ops(int fd, int *err)
{
  uint8_t head[512], tail[512];
  size_t hl = 0, tl = 0;
  *err = image_ends(fd, head, &hl, tail, &tl);
  if (*err < 0)
    return NULL;
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
    if (formats[i]->probe(head, hl, tail, tl))
      return formats[i];
  return NULL;
}

int
image_probe(int fd)
{
  int err;
  const struct image_ops *ops = image_probe_ops(fd, &err);
  if (err < 0)
    return err;
  return ops == &image_vhd_ops     ? IMAGE_FORMAT_VHD
         : ops == &image_qcow2_ops ? IMAGE_FORMAT_QCOW2
                                   : IMAGE_FORMAT_RAW;
}

int
image_open(const char *path, const struct image_opts *o, struct image **out,
           char *err, size_t errlen)
{
  *out = NULL;
  if (o->format == IMAGE_FORMAT_RAW)
    return 0;
  /* O_NONBLOCK: a FIFO must not hold the probe up (it is raw anyway); it
   * changes nothing for files and devices. */
  int fd = open(path, (o->writable ? O_RDWR : O_RDONLY) | O_CLOEXEC |
                          O_NONBLOCK);
  struct image_opts oo = *o;
  if (fd < 0 && o->writable && (errno == EROFS || errno == EACCES ||
                                errno == EPERM)) {
    oo.writable = false; /* served read-only: img->writable says so */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  }
  if (fd < 0 && o->format == IMAGE_FORMAT_AUTO)
    return 0; /* the caller opens it as a plain file and says why not */
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "open %.200s: %s", path, strerror(e));
    return -e;
  }
  const struct image_ops *ops = NULL;
  int r = 0;
  if (o->format == IMAGE_FORMAT_VHD) {
    ops = &image_vhd_ops;
  } else if (o->format == IMAGE_FORMAT_QCOW2) {
    ops = &image_qcow2_ops;
  } else {
    /* Only regular files are probed: a device or pipe is raw (an image
     * on a device is read as one when its format is named). */
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
      ops = image_probe_ops(fd, &r);
    if (r < 0) {
      snprintf(err, errlen, "reading %s: %s", path, strerror(-r));
      close(fd);
      return r;
    }
  }
  if (ops == NULL) {
    close(fd);
    return 0;
  }
  struct image *img = calloc(1, sizeof *img);
  if (img == NULL || (img->path = strdup(path)) == NULL) {
    free(img);
    close(fd);
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  img->ops = ops;
  r = ops->open(img, fd, NULL, &oo, err, errlen);
  if (r < 0) {
    image_close(img);
    return r;
  }
  /* One writer per image: each open keeps its own idea of where the file
   * ends and which blocks are allocated, so two (two processes, or two
   * exports of one file) would allocate the same space. A lock of the
   * open file, released when the format closes it. */
  if (img->writable && flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno == EWOULDBLOCK ? EBUSY : errno;
    snprintf(err, errlen, "%s: %s", path,
             e == EBUSY ? "another writer has this image open (a second "
                          "one would corrupt it)"
                        : strerror(e));
    image_close(img);
    return -e;
  }
  *out = img;
  return 1;
}

int
image_open_io(struct image_io *io, const char *name,
               const struct image_opts *o, struct image **out, char *err,
               size_t errlen)
{
  const struct image_ops *ops = o->format == IMAGE_FORMAT_VHD
                                  ? &image_vhd_ops
                                : o->format == IMAGE_FORMAT_QCOW2
                                  ? &image_qcow2_ops
                                  : NULL;
  *out = NULL;
  struct image *img = ops ? calloc(1, sizeof *img) : NULL;
  if (img == NULL || (img->path = strdup(name)) == NULL) {
    free(img);
    io->close(io);
    snprintf(err, errlen, "%s: %s", name,
             ops ? "out of memory" : "no format named to read it in");
    return ops ? -ENOMEM : -EINVAL;
  }
  img->ops = ops;
  int r = ops->open(img, -1, io, o, err, errlen);
  if (r < 0) {
    image_close(img);
    return r;
  }
  *out = img;
  return 1;
}

void
image_close(struct image *img)
{
  if (img == NULL)
    return;
  if (img->ops)
    img->ops->close(img);
  free(img->path);
  free(img);
}

int
image_format_parse(const char *s, enum image_format *f)
{
  if (strcmp(s, "raw") == 0)
    *f = IMAGE_FORMAT_RAW;
  else if (strcmp(s, "vhd") == 0 || strcmp(s, "vpc") == 0)
    *f = IMAGE_FORMAT_VHD;
  else if (strcmp(s, "qcow2") == 0)
    *f = IMAGE_FORMAT_QCOW2;
  else if (strcmp(s, "auto") == 0)
    *f = IMAGE_FORMAT_AUTO;
  else
    return -EINVAL;
  return 0;
}

const char *
image_format_name(enum image_format f)
{
  switch (f) {
  case IMAGE_FORMAT_RAW:
    return "raw";
  case IMAGE_FORMAT_VHD:
    return "vhd";
  case IMAGE_FORMAT_QCOW2:
    return "qcow2";
  default:
    return "auto";
  }
}

/* ---- writers ---- */

struct image_writer {
  enum image_format format;
  struct vhd_writer *vhd;
  struct qcow2_writer *qcow2;
};

uint32_t
image_writer_block(enum image_format f)
{
  switch (f) {
  case IMAGE_FORMAT_VHD:
    return VHD_DEFAULT_BLOCK;
  case IMAGE_FORMAT_QCOW2:
    return QCOW2_WRITE_CLUSTER;
  default:
    return 0;
  }
}

int
image_writer_new(enum image_format f, uint64_t size, const uint8_t *alloc,
                 struct image_writer **out, char *err, size_t errlen)
{
  struct image_writer *w = calloc(1, sizeof *w);
  if (w == NULL) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  w->format = f;
  int r;
  if (f == IMAGE_FORMAT_VHD)
    r = vhd_writer_new(size, VHD_DEFAULT_BLOCK, alloc, &w->vhd, err, errlen);
  else if (f == IMAGE_FORMAT_QCOW2)
    r = qcow2_writer_new(size, alloc, &w->qcow2, err, errlen);
  else
    r = -EINVAL, snprintf(err, errlen, "no writer for format %s",
                          image_format_name(f));
  if (r < 0) {
    free(w);
    return r;
  }
  *out = w;
  return 0;
}

int
image_writer_put(struct image_writer *w, int fd, uint64_t off,
                 const uint8_t *buf, uint64_t len, char *err, size_t errlen)
{
  if (w->vhd)
    return vhd_writer_put(w->vhd, fd, off, buf, len, err, errlen);
  return qcow2_writer_put(w->qcow2, fd, off, buf, len, err, errlen);
}

bool
image_writer_done(const struct image_writer *w)
{
  return w->vhd ? vhd_writer_done(w->vhd) : qcow2_writer_done(w->qcow2);
}

void
image_writer_free(struct image_writer *w)
{
  if (w == NULL)
    return;
  vhd_writer_free(w->vhd);
  qcow2_writer_free(w->qcow2);
  free(w);
}
