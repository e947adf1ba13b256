/* vhd_priv.h: the state of an open VHD, shared by the files of the VHD
 * format (vhd.c reads, vhd_rw.c writes in place, vhd_check.c checks);
 * internal to src/format/. */
#ifndef NBDFLOW_FORMAT_VHD_PRIV_H
#define NBDFLOW_FORMAT_VHD_PRIV_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "format/image.h"
#include "format/vhd_layout.h"

/* XCP-ng coalesces chains longer than 30; a longer one is refused. */
#define VHD_MAX_DEPTH 64

struct vhd_level {
  int fd;                /* owned; -1 when io reads the image */
  struct image_io *io;   /* owned: the top image's bytes, not a file */
  char *path;            /* owned: as opened (resolved for parents) */
  struct vhd_footer f;
  struct vhd_header h;   /* dynamic and differencing only */
  uint64_t size;         /* virtual */
  uint64_t file_size;    /* at open; vhd_rw.c keeps it under its lock */
  uint32_t footer_len;   /* 512, or 511 for old Virtual PC images */
  uint32_t block_size;   /* 0: fixed */
  uint32_t bitmap_len;
  uint32_t nblocks;      /* BAT entries used: blocks covering size */
  /* Owned, host order. Read with atomic loads: a writable image sets an
   * entry (atomically) once its block is on disk. */
  uint32_t *bat;
  uint8_t *full;         /* per block: bitmap known all set (atomic) */
  /* The top image opened for writing: only the writer, which holds the
   * block's lock, may mark a block full (a reader that had seen the
   * bitmap full could otherwise mark it after a trim cleared it). */
  bool writable;
  dev_t dev;
  ino_t ino;
};

struct vhd_rw;

struct vhd_priv {
  struct vhd_level lv[VHD_MAX_DEPTH];
  int depth;
  const char *parents[VHD_MAX_DEPTH]; /* lv[1..].path, for info */
  struct vhd_rw *rw;  /* owned; NULL unless opened for writing */
};

/* Exactly len bytes of l at off: -EIO past its end. */
int vhd_lv_read(const struct vhd_level *l, void *buf, size_t len,
                uint64_t off);
/* Bytes the image below level k supplies at virtual off: its parent's,
 * or zeroes. */
int vhd_read_below(struct vhd_priv *p, int k, uint8_t *buf, uint64_t len,
                   uint64_t off);
/* Sectors of block b that lie inside the disk (fewer in the last). */
uint32_t vhd_block_sectors(const struct vhd_level *l, uint32_t b);

/* vhd_rw.c: prepares p (opened with its top level writable) for writing;
 * -errno with a sentence in err. */
int vhd_rw_init(struct image *img, struct vhd_priv *p, char *err,
                size_t errlen);
void vhd_rw_free(struct vhd_priv *p);
int vhd_rw_pwrite(struct image *img, const void *buf, uint64_t len,
                  uint64_t off, unsigned flags, char *why, size_t wl);
int vhd_rw_zero(struct image *img, uint64_t len, uint64_t off,
                unsigned flags, char *why, size_t wl);
int vhd_rw_trim(struct image *img, uint64_t len, uint64_t off,
                unsigned flags, char *why, size_t wl);
int vhd_rw_flush(struct image *img);

/* vhd_check.c */
int vhd_check(struct image *img, struct image_check *c);

#endif
