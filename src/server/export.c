/* export.c: export arguments and transmission flags. */
#include "export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto/nbd.h"
#include "util/log.h"
#include "util/size.h"

static int
export_open_target(struct export *e, const char *arg, const char *target)
{
  uint64_t size;
  const char *kind = NULL;

  if (strncmp(target, "memory:", 7) == 0)
    kind = "memory";
  else if (strncmp(target, "null:", 5) == 0)
    kind = "null";
  if (kind == NULL)
    return backend_file_open(e, target);

  const char *sz = target + strlen(kind) + 1;
  int r = size_parse(sz, &size);
  if (r < 0) {
    log_error("export \"%s\": bad size \"%s\"", arg, sz);
    return r;
  }
  if (size > (UINT64_C(1) << 62)) {
    log_error("export \"%s\": size %s too large", arg, sz);
    return -EFBIG;
  }
  if (kind[0] == 'm') {
    r = backend_memory_open(e, size);
    if (r < 0)
      log_error("export \"%s\": cannot reserve %s of memory: %s", arg, sz,
                strerror(-r));
    return r;
  }
  return backend_null_open(e, size);
}

int
export_open(const char *arg, bool read_only, struct export **out)
{
  struct export *e = calloc(1, sizeof *e);
  if (e == NULL)
    return -ENOMEM;
  e->fd = -1;
  e->read_only = read_only;
  pthread_mutex_init(&e->write_lock, NULL);

  /* NAME=TARGET, unless the '=' belongs to a path ("./a=b" is a path). */
  const char *eq = strchr(arg, '=');
  const char *target = arg;
  if (eq && memchr(arg, '/', (size_t)(eq - arg)) == NULL) {
    e->name = strndup(arg, (size_t)(eq - arg));
    target = eq + 1;
  } else {
    e->name = strdup(arg);
  }
  if (e->name == NULL) {
    free(e);
    return -ENOMEM;
  }
  if (strlen(e->name) > NBD_MAX_STRING) {
    log_error("export \"%.40s...\": name longer than %d bytes", e->name,
              NBD_MAX_STRING);
    export_close(e);
    return -ENAMETOOLONG;
  }
  int r = export_open_target(e, arg, target);
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
  pthread_mutex_destroy(&e->write_lock);
  free(e->name);
  free(e->description);
  free(e);
}

const char *
export_kind(const struct export *e)
{
  struct stat st;
  if (e->fd >= 0 && fstat(e->fd, &st) == 0 && S_ISBLK(st.st_mode))
    return "block device";
  return e->ops->kind;
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
