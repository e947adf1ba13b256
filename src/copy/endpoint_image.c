/* endpoint_image.c: a copy source in an image format (VHD...), read
 * through the format layer (format/image.h), or a destination that is
 * an existing image written in place through the same layer (the
 * format's pwrite, zero and flush, as `serve` writes it). Reads, writes
 * and extents may block on the file, so they run on the worker pool,
 * like a file's, in parallel (the format is thread-safe); map answers
 * from memory on the loop thread, so the engine can send a mapped range
 * straight from the image file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "copy/endpoint.h"
#include "format/image.h"
#include "util/log.h"

/* Extents asked of the image per EXTENTS op: the engine's batch is the
 * bound, this only sizes the scratch array. */
#define IMG_EXTENTS_MAX 1024

static void
image_work(struct work *w)
{
  struct ep_op *op = (struct ep_op *)((char *)w - offsetof(struct ep_op, work));
  struct endpoint *e = op->ep;
  struct image *img = e->priv;
  int r = 0;
  char why[200] = "";
  if (op->type == EP_READ) {
    r = img->ops->pread(img, op->buf, op->length, op->offset, why,
                        sizeof why);
  } else if (op->type == EP_WRITE) {
    r = img->ops->pwrite(img, op->buf, op->length, op->offset, 0, why,
                         sizeof why);
  } else if (op->type == EP_ZERO) {
    r = img->ops->zero(img, op->length, op->offset, IMAGE_MAY_TRIM, why,
                       sizeof why);
  } else if (op->type == EP_FLUSH) {
    r = img->ops->flush(img);
  } else {
    struct image_extent x[IMG_EXTENTS_MAX];
    int max = op->max_extents < IMG_EXTENTS_MAX ? (int)op->max_extents
                                                : IMG_EXTENTS_MAX;
    r = img->ops->extents(img, op->offset, op->length, x, max, why,
                          sizeof why);
    for (int i = 0; i < r; i++)
      op->extents[op->nextents++] = (struct endpoint_extent){
        x[i].length, (x[i].flags & IMAGE_ZERO) != 0 };
  }
  if (r < 0) {
    op->err = -r;
    snprintf(op->errmsg, sizeof op->errmsg, "%s image %s%s%s",
             img->ops->name, img->path, why[0] ? ": " : "", why);
  }
  ep_env_complete(e->env, op);
}

static int
image_submit(struct endpoint *e, struct ep_op *op)
{
  bool wr = op->type == EP_WRITE || op->type == EP_ZERO ||
            op->type == EP_FLUSH;
  if (wr ? !e->writable : op->type != EP_READ && op->type != EP_EXTENTS)
    return -EBADF;
  if (op->type == EP_WRITE && op->from_file)
    return -EINVAL;
  op->work.fn = image_work;
  workq_push(e->env->wq, &op->work);
  return 0;
}

static int
image_map_range(struct endpoint *e, uint64_t off, uint64_t len,
                struct endpoint_map *m)
{
  struct image *img = e->priv;
  struct image_map im;
  if (img->ops->map == NULL)
    return -EAGAIN;
  int r = img->ops->map(img, off, len, &im);
  if (r < 0)
    return r;
  *m = (struct endpoint_map){ im.fd, im.host_off, im.length };
  return 0;
}

static void
image_ep_close(struct endpoint *e)
{
  image_close(e->priv);
}

static const struct endpoint_ops image_ep_ops = {
  .kind = "image",
  .submit = image_submit,
  .close = image_ep_close,
  .map = image_map_range,
};

int
endpoint_open_image(struct ep_env *env, const char *spec, struct image *img,
                    struct endpoint **out, char *err, size_t errlen)
{
  struct endpoint *e = endpoint_new(env, spec, &image_ep_ops, img);
  if (e == NULL) {
    image_close(img);
    snprintf(err, errlen, "%s: out of memory", spec);
    return -ENOMEM;
  }
  e->size = img->size;
  e->readable = true;
  e->has_extents = true;
  struct image_info in;
  img->ops->info(img, &in, false);
  if (in.marked_corrupt)
    /* Read all the same, as qemu does read-only: it may be all there
     * is. A cut-short write to a device reads its old bytes. */
    log_warn("%s: the image is marked corrupt (its writer may have been "
             "cut short): what it reads may not be its content", spec);
  *out = e;
  return 0;
}

struct image *
endpoint_image(const struct endpoint *e)
{
  return e->ops == &image_ep_ops ? e->priv : NULL;
}

bool
endpoint_image_exists(const char *path, enum image_format f)
{
  struct stat st;
  if (f <= IMAGE_FORMAT_RAW || stat(path, &st) < 0 || !S_ISREG(st.st_mode) ||
      st.st_size == 0)
    return false;
  struct image_opts io = { .format = f, .format_given = true };
  struct image *img;
  char err[512];
  if (image_open(path, &io, &img, err, sizeof err) == 1) {
    bool can = img->ops->pwrite != NULL;
    image_close(img);
    return can;
  }
  /* Damaged: its own open says what is wrong, rather than a stream
   * writing over it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool is = image_probe(fd) == (int)f && f == IMAGE_FORMAT_VHD;
  /* A fixed disk has no footer copy at the start: its footer at the
   * end (512 bytes, or the oldest writers' 511) says it is one. */
  char tail[8];
  for (off_t k = 512; !is && f == IMAGE_FORMAT_VHD && k >= 511; k--)
    is = st.st_size >= k &&
         pread(fd, tail, sizeof tail, st.st_size - k) == (ssize_t)sizeof tail &&
         memcmp(tail, "conectix", sizeof tail) == 0;
  close(fd);
  return is;
}

int
endpoint_open_image_dst(struct ep_env *env, const char *spec,
                        const char *path, enum image_format f,
                        struct endpoint **out, char *err, size_t errlen)
{
  struct image_opts io = { .format = f, .format_given = true,
                           .writable = true };
  struct image *img;
  int r = image_open(path, &io, &img, err, errlen);
  if (r < 0) {
    /* A stream cut short (an interrupted copy) is the usual such file. */
    size_t n = strlen(err);
    if (r == -EINVAL && strstr(err, "truncated") && n < errlen)
      snprintf(err + n, errlen - n, " (to write a new image over it, "
               "delete it first)");
    return r;
  }
  if (r == 0 || !img->writable) {
    snprintf(err, errlen, "%s: cannot write this %s image in place (%s)",
             spec, image_format_name(f),
             r == 0 ? "not one" : "no permission to write it");
    image_close(img);
    return r == 0 ? -EINVAL : -EACCES;
  }
  r = endpoint_open_image(env, spec, img, out, err, errlen);
  if (r < 0)
    return r;
  (*out)->readable = (*out)->has_extents = false;
  (*out)->writable = (*out)->can_zero = (*out)->can_flush = true;
  return 0;
}
