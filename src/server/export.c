/* export.c: export arguments and transmission flags. */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/image.h"
#include "format/target.h"
#include "proto/nbd.h"
#include "util/log.h"
#include "util/size.h"
#include "util/text.h"

/* A path: an image in a format is served through the format layer
 * (read-write when the format writes in place), a raw file or device as
 * it is. */
static int
export_open_path(struct export *e, const struct target *t,
                 const struct export_opts *o)
{
  struct image_opts io = { .format = t->format,
                           .format_given = t->format_given,
                           .ignore_checksums = o->ignore_checksums,
                           .writable = !e->read_only };
  struct image *img;
  char err[512];
  int r = image_open(t->arg, &io, &img, err, sizeof err);
  if (r < 0) {
    log_error("export \"%s\": %s", e->name, err);
    return r;
  }
  if (img == NULL)
    return backend_file_open(e, t->arg);
  if (!e->read_only && !img->writable)
    log_info("export \"%s\": %s is a %s image this server cannot write "
             "(or a file it may not): serving it read-only", e->name, t->arg,
             img->ops->name);
  return backend_image_open(e, img);
}

/* NBD's name and the target in an export argument: NAME=TARGET, unless
 * the '=' belongs to a path ("./a=b" is a path, named as it is). */
static const char *
export_split(const char *arg, size_t *namelen)
{
  const char *eq = strchr(arg, '=');
  if (eq && memchr(arg, '/', (size_t)(eq - arg)) == NULL) {
    *namelen = (size_t)(eq - arg);
    return eq + 1;
  }
  *namelen = strlen(arg);
  return arg;
}

int
export_check(const char *arg, char *name, size_t namecap, char *err,
             size_t errlen)
{
  size_t nl;
  const char *target = export_split(arg, &nl);
  if (nl > NBD_MAX_STRING) {
    snprintf(err, errlen, "export \"%.40s...\": name longer than %d bytes",
             arg, NBD_MAX_STRING);
    return -ENAMETOOLONG;
  }
  if (nl + 1 > namecap)
    return -ENAMETOOLONG;
  memcpy(name, arg, nl);
  name[nl] = '\0';
  if (!text_utf8_valid(name)) {
    char shown[128];
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)name;
         *p && k + 5 < sizeof shown; p++)
      k += (size_t)snprintf(shown + k, sizeof shown - k,
                            *p >= 0x20 && *p < 0x7f ? "%c" : "\\x%02x", *p);
    snprintf(err, errlen, "export \"%s\": the name is not UTF-8 text (NBD "
             "names are)", shown);
    return -EINVAL;
  }
  if (target[0] == '\0') {
    snprintf(err, errlen, "export \"%s\": names no file or TARGET", arg);
    return -EINVAL;
  }
  struct target t;
  target_parse(target, false, &t);
  if (t.kind == TARGET_FILE && t.format_given && t.arg[0] == '\0') {
    snprintf(err, errlen, "export \"%s\": %s names no file after its "
             "format", arg, target);
    return -EINVAL;
  }
  if (target_check_prefix(&t, target, err, errlen) < 0)
    return -EINVAL;
  if (t.kind != TARGET_MEMORY && t.kind != TARGET_NULL)
    return 0;
  uint64_t size;
  if (size_parse(t.arg, &size) < 0) {
    snprintf(err, errlen, "export \"%s\": bad size \"%s\" (a number below "
             "2^64 with an optional K, M, G, T, P or E)", arg, t.arg);
    return -EINVAL;
  }
  if (size > (UINT64_C(1) << 62)) {
    snprintf(err, errlen, "export \"%s\": size %s too large (4E at most)",
             arg, t.arg);
    return -EFBIG;
  }
  return 0;
}

static int
export_open_target(struct export *e, const char *arg, const char *target,
                   const struct export_opts *o)
{
  uint64_t size;
  struct target t;
  target_parse(target, false, &t);
  if (t.kind != TARGET_MEMORY && t.kind != TARGET_NULL) {
    if (t.kind != TARGET_FILE)
      t.arg = target; /* "-" or a URI-looking name: a path here */
    const char *eq = strchr(target, '=');
    struct stat st;
    if (target == arg && eq && memchr(target, '/', (size_t)(eq - target)) &&
        stat(target, &st) < 0 && errno == ENOENT) {
      /* "x/y=disk.img" is one path: a name never holds a '/'. */
      log_error("export \"%s\": no such file (a '/' before '=' makes the "
                "whole argument a path: export names hold no '/')", arg);
      return -ENOENT;
    }
    return export_open_path(e, &t, o);
  }
  const char *sz = t.arg;
  (void)size_parse(sz, &size); /* export_check took it */
  if (t.kind == TARGET_MEMORY) {
    int r = backend_memory_open(e, size);
    if (r < 0)
      log_error("export \"%s\": cannot reserve %s of memory: %s", arg, sz,
                strerror(-r));
    return r;
  }
  return backend_null_open(e, size);
}

int
export_open(const char *arg, const struct export_opts *o, struct export **out)
{
  char name[NBD_MAX_STRING + 1], err[512];
  int r = export_check(arg, name, sizeof name, err, sizeof err);
  if (r < 0) {
    log_error("%s", err);
    return r;
  }
  struct export *e = calloc(1, sizeof *e);
  if (e == NULL)
    return -ENOMEM;
  e->read_only = o->read_only;
  size_t nl;
  const char *target = export_split(arg, &nl);
  if ((e->name = strdup(name)) == NULL) {
    free(e);
    return -ENOMEM;
  }
  r = export_open_target(e, arg, target, o);
  if (r < 0) {
    export_close(e);
    return r;
  }
  *out = e;
  return 0;
}

void
export_close(struct export *e)
{
  if (e == NULL)
    return;
  if (e->ops && e->ops->close)
    e->ops->close(e);
  free(e->name);
  free(e->description);
  free(e);
}

const char *
export_kind(const struct export *e)
{
  return e->kind ? e->kind : e->ops->kind;
}

uint16_t
export_tflags(const struct export *e, bool structured)
{
  /* One backing object is shared by every connection and FLUSH reaches
   * all of it, so connections are consistent: multi-conn is safe. */
  uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |
               NBD_FLAG_SEND_CACHE | NBD_FLAG_CAN_MULTI_CONN;
  if (structured)
    f |= NBD_FLAG_SEND_DF;
  if (e->read_only)
    return f | NBD_FLAG_READ_ONLY;
  f |= NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
  if (e->can_trim)
    f |= NBD_FLAG_SEND_TRIM;
  return f;
}

int
export_swap_active(void)
{
  FILE *f = fopen("/proc/swaps", "re");
  if (f == NULL)
    return -errno;
  char line[256];
  int lines = 0;
  while (fgets(line, sizeof line, f) != NULL)
    lines++;
  /* A read that failed part-way counts as no answer, not as no swap. */
  int err = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (err)
    return -err;
  return lines > 1; /* the first line is the header */
}
