/* backend_image.c: an image in a format (VHD...) served through the
 * format layer (format/image.h): READ by the format's pread, block
 * status from its allocation, READs of a block in memory sent from the
 * image file's pages by its map, and, for a format that writes in place
 * (a VHD opened writable), WRITE, WRITE_ZEROES, TRIM and FLUSH by its
 * write operations. Nothing here knows a format. */
#include <errno.h>
#include <stdlib.h>

#include "export.h"
#include "format/image.h"
#include "proto/nbd.h"
#include "util/log.h"

/* The format's flags are NBD's base:allocation bits. */
_Static_assert(IMAGE_HOLE == NBD_STATE_HOLE && IMAGE_ZERO == NBD_STATE_ZERO,
               "image extent flags must be NBD's");

#define IMG_EXTENTS_MAX 64

static int
img_pread(struct export *e, void *buf, uint64_t len, uint64_t off)
{
  struct image *img = e->priv;
  char why[200];
  return img->ops->pread(img, buf, len, off, why, sizeof why);
}

/* Writes go to the format (image_ops pwrite, zero, trim, flush), which
 * allocates, orders and locks; an image opened read-only never gets
 * here (the export is read-only, and transmission refuses writes). */
static int
img_pwrite(struct export *e, const void *buf, uint64_t len, uint64_t off,
           bool fua)
{
  struct image *img = e->priv;
  char why[200];
  return img->ops->pwrite(img, buf, len, off, fua ? IMAGE_FUA : 0, why,
                          sizeof why);
}

static int
img_zero(struct export *e, uint64_t len, uint64_t off, bool may_trim,
         bool fast, bool fua)
{
  struct image *img = e->priv;
  char why[200];
  unsigned flags = (may_trim ? IMAGE_MAY_TRIM : 0) | (fast ? IMAGE_FAST : 0) |
                   (fua ? IMAGE_FUA : 0);
  return img->ops->zero(img, len, off, flags, why, sizeof why);
}

static int
img_trim(struct export *e, uint64_t len, uint64_t off, bool fua)
{
  struct image *img = e->priv;
  char why[200];
  return img->ops->trim(img, len, off, fua ? IMAGE_FUA : 0, why,
                        sizeof why);
}

static int
img_flush(struct export *e)
{
  struct image *img = e->priv;
  return img->writable ? img->ops->flush(img) : 0;
}

static int
img_cache(struct export *e, uint64_t len, uint64_t off)
{
  (void)e, (void)len, (void)off;
  return 0; /* advisory */
}

static int
img_extents(struct export *e, uint64_t off, uint64_t len, struct extent *ext,
            int max)
{
  struct image *img = e->priv;
  struct image_extent x[IMG_EXTENTS_MAX];
  char why[200];
  int n = img->ops->extents(img, off, len, x,
                            max < IMG_EXTENTS_MAX ? max : IMG_EXTENTS_MAX,
                            why, sizeof why);
  for (int i = 0; i < n; i++)
    ext[i] = (struct extent){ x[i].length, x[i].flags };
  return n;
}

static int
img_map(struct export *e, uint64_t off, uint64_t len, int *fd,
        uint64_t *host_off, uint64_t *run)
{
  struct image *img = e->priv;
  struct image_map m;
  if (img->ops->map == NULL || img->ops->map(img, off, len, &m) < 0)
    return -EAGAIN;
  *fd = m.fd;
  *host_off = m.host_off;
  *run = m.length;
  return 0;
}

static void
img_close(struct export *e)
{
  image_close(e->priv);
}

const struct backend_ops backend_image_ops = {
  .kind = "image",
  .pread = img_pread,
  .pwrite = img_pwrite,
  .zero = img_zero,
  .trim = img_trim,
  .flush = img_flush,
  .cache = img_cache,
  .extents = img_extents,
  .map = img_map,
  .close = img_close,
};

int
backend_image_open(struct export *e, struct image *img)
{
  e->ops = &backend_image_ops;
  e->priv = img;
  e->kind = img->ops->name;
  e->size = img->size;
  e->read_only = !img->writable;
  struct image_info in;
  img->ops->info(img, &in, false);
  if (in.marked_corrupt)
    log_warn("export \"%s\": the image is marked corrupt (its writer may "
             "have been cut short): what it reads may not be its content",
             e->name);
  if (img->writable) {
    e->can_trim = in.can_trim;
    e->can_fast_zero = in.can_fast_zero;
    /* Whole sectors: a smaller write reads its sector first. */
    if (in.write_block > 1 && img->size % in.write_block == 0)
      e->min_block = in.write_block;
  }
  /* An image on tmpfs or ramfs: READs of its mapped blocks may leave from
   * its pages (req_from_file), as a raw file's do, and small WRITEs may
   * run on the loop: they copy into memory (an allocation's fdatasync
   * returns at once there). */
  if (in.in_memory && img->ops->map) {
    e->swappable = in.swappable;
    e->write_in_memory = !in.swappable || export_swap_active() == 0;
  }
  return 0;
}
