/* common.c: see common.h. */
#include "format/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/fileio.h"

int
fmt_fail(char *err, size_t errlen, int r, const char *fmt, ...)
{
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return r;
}

int
fmt_read(int fd, struct image_io *io, void *buf, size_t len, uint64_t off)
{
  if (io)
    return io->pread(io, buf, len, off);
  return file_pread_exact(fd, buf, len, off);
}

int
fmt_read_full(int fd, struct image_io *io, void *buf, size_t len,
              uint64_t off, size_t *got)
{
  if (io == NULL)
    return file_pread_full(fd, buf, len, off, got);
  *got = off >= io->size          ? 0
         : io->size - off < len ? (size_t)(io->size - off)
                                  : len;
  return *got ? io->pread(io, buf, *got, off) : 0;
}

int
fmt_path_beside(const char *child, const char *name, char *out,
                size_t outlen)
{
  int n;
  /* "./base.vhd" (a W2ru locator, a qcow2 backing name) is beside the
   * child: drop the "./" so that the path shown reads dir/base.vhd, not
   * dir/./base.vhd or ././base.vhd. */
  while (name[0] == '.' && name[1] == '/') {
    name++;
    while (name[0] == '/')
      name++;
  }
  if (name[0] == '\0')
    return -ENOENT;
  if (name[0] == '/') {
    n = snprintf(out, outlen, "%s", name);
  } else {
    const char *slash = strrchr(child, '/');
    if (slash == NULL) /* the child is in the working directory */
      n = snprintf(out, outlen, "./%s", name);
    else
      n = snprintf(out, outlen, "%.*s/%s", (int)(slash - child), child,
                   name);
  }
  return n >= 0 && (size_t)n < outlen ? 0 : -ENAMETOOLONG;
}
