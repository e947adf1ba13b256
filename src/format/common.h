/* common.h: what the format readers and writers share; internal to
 * src/format/. */
#ifndef NBDFLOW_FORMAT_COMMON_H
#define NBDFLOW_FORMAT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "format/image.h"

/* Writes one sentence into err (when there is room) and returns r. */
int fmt_fail(char *err, size_t errlen, int r, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));

/* Exactly len bytes at off of an image file: io's when io is set, else
 * the local file fd's; -EIO past its end. */
int fmt_read(int fd, struct image_io *io, void *buf, size_t len,
             uint64_t off);
/* Up to len bytes, fewer at the end (*got says how many). */
int fmt_read_full(int fd, struct image_io *io, void *buf, size_t len,
                  uint64_t off, size_t *got);

/* A parent or backing file's path: name as it is when absolute, else
 * resolved against the directory of child (the image that names it),
 * leading "./" dropped. -ENOENT when no name is left, -ENAMETOOLONG when
 * it does not fit in out. */
int fmt_path_beside(const char *child, const char *name, char *out,
                    size_t outlen);

#endif
