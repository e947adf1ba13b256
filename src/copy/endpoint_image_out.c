/* endpoint_image_out.c: a copy destination written as an image (a
 * dynamic VHD, a qcow2) in one forward pass (format/image.h's writer),
 * into a new file or stdout. It takes its ops one at a time in offset
 * order (sequential), and runs them on the worker pool, since the writes
 * may block. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "copy/endpoint.h"
#include "format/image.h"

struct image_out {
  struct image_writer *w;
  int fd;
  bool own_fd;   /* a file we opened (else stdout) */
  bool syncable; /* a file or a block device: fdatasync means something */
};

static void
image_out_work(struct work *wk)
{
  struct ep_op *op = (struct ep_op *)((char *)wk - offsetof(struct ep_op, work));
  struct endpoint *e = op->ep;
  struct image_out *v = e->priv;
  int r = 0;
  switch (op->type) {
  case EP_WRITE:
  case EP_ZERO:
    r = image_writer_put(v->w, v->fd, op->offset,
                         op->type == EP_WRITE ? op->buf : NULL, op->length,
                         op->errmsg, sizeof op->errmsg);
    break;
  case EP_FLUSH:
    if (!image_writer_done(v->w)) {
      r = -EIO;
      snprintf(op->errmsg, sizeof op->errmsg,
               "flush before the whole disk was written: the image is "
               "incomplete");
    } else if (v->syncable && fdatasync(v->fd) < 0) {
      r = -errno;
    }
    break;
  default:
    r = -EBADF;
    break;
  }
  op->err = -r;
  ep_env_complete(e->env, op);
}

static int
image_out_submit(struct endpoint *e, struct ep_op *op)
{
  if (op->type != EP_WRITE && op->type != EP_ZERO && op->type != EP_FLUSH)
    return -EBADF;
  if (op->type == EP_WRITE && op->from_file)
    return -EINVAL;
  op->work.fn = image_out_work;
  workq_push(e->env->wq, &op->work);
  return 0;
}

static void
image_out_free(struct image_out *v)
{
  image_writer_free(v->w);
  if (v->own_fd)
    close(v->fd);
  free(v);
}

static void
image_out_close(struct endpoint *e)
{
  image_out_free(e->priv);
}

static const struct endpoint_ops image_out_ops = {
  .kind = "image",
  .submit = image_out_submit,
  .close = image_out_close,
};

int
endpoint_image_out_check(const char *spec, const char *path,
                         enum image_format f, char *err, size_t errlen)
{
  struct stat dev;
  if (f == IMAGE_FORMAT_VHD && path && stat(path, &dev) == 0 &&
      S_ISBLK(dev.st_mode)) {
    /* A reader finds a VHD's footer at the end of the file: on a
     * device larger than the image it would find the device's old
     * bytes there. */
    snprintf(err, errlen, "%s: a block device: a VHD is written to a file "
             "or '-' (its footer must end the file); a qcow2 may go onto "
             "a device, or copy it raw", spec);
    return -ENOTSUP;
  }
  return 0;
}

int
endpoint_open_image_out(struct ep_env *env, const char *spec,
                        const char *path, enum image_format f,
                        const struct endpoint_opts *o, struct endpoint **out,
                        char *err, size_t errlen)
{
  if (o->create_size == UINT64_MAX) {
    snprintf(err, errlen, "%s: a %s image starts with its size and its "
             "tables: the source's size must be known (not a pipe)", spec,
             image_format_name(f));
    return -EINVAL;
  }
  if (o->alloc && o->alloc_block != image_writer_block(f)) {
    snprintf(err, errlen, "%s: allocation map in %u-byte blocks for a "
             "writer of %u-byte blocks", spec, o->alloc_block,
             image_writer_block(f));
    return -EINVAL;
  }
  int r0 = endpoint_image_out_check(spec, path, f, err, errlen);
  if (r0 < 0)
    return r0;
  struct image_out *v = calloc(1, sizeof *v);
  if (v == NULL) {
    snprintf(err, errlen, "%s: out of memory", spec);
    return -ENOMEM;
  }
  char why[200];
  /* The size is checked before the file is created or truncated. */
  int r = image_writer_new(f, o->create_size, o->alloc, &v->w, why,
                           sizeof why);
  if (r < 0) {
    free(v);
    snprintf(err, errlen, "%s: %s", spec, why);
    return r;
  }
  v->fd = STDOUT_FILENO;
  if (path) {
    v->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (v->fd < 0) {
      r = -errno;
      snprintf(err, errlen, "open %s: %s", path, strerror(errno));
      image_out_free(v);
      return r;
    }
    v->own_fd = true;
  }
  /* An empty disk gets no write to complete it: it is whole at once,
   * with or without a final flush (--no-flush). */
  if (o->create_size == 0 &&
      (r = image_writer_put(v->w, v->fd, 0, NULL, 0, why, sizeof why)) < 0) {
    snprintf(err, errlen, "%s: %s", spec, why);
    image_out_free(v);
    return r;
  }
  struct stat st;
  v->syncable = fstat(v->fd, &st) == 0 &&
                (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode));
  struct endpoint *e = endpoint_new(env, spec, &image_out_ops, v);
  if (e == NULL) {
    image_out_free(v);
    snprintf(err, errlen, "%s: out of memory", spec);
    return -ENOMEM;
  }
  e->size = o->create_size;
  e->writable = e->can_zero = e->can_flush = true;
  e->sequential = true;
  *out = e;
  return 0;
}
