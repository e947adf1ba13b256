/* backend_null.c: reads zeroes, discards writes. For benchmarks and for
 * testing clients without storage in the way. */
#include <string.h>

#include "export.h"
#include "proto/nbd.h"

static int
null_pread(struct export *e, void *buf, uint64_t len, uint64_t off)
{
  memset(buf, 0, len);
  return 0;
}

static int
null_pwrite(struct export *e, const void *buf, uint64_t len, uint64_t off,
            bool fua)
{
  return 0;
}

static int
null_zero(struct export *e, uint64_t len, uint64_t off, bool may_trim,
          bool fast, bool fua)
{
  return 0;
}

static int
null_trim(struct export *e, uint64_t len, uint64_t off, bool fua)
{
  return 0;
}

static int
null_noop(struct export *e)
{
  return 0;
}

static int
null_cache(struct export *e, uint64_t len, uint64_t off)
{
  return 0;
}

static int
null_extents(struct export *e, uint64_t off, uint64_t len, struct extent *ext,
             int max)
{
  ext[0] = (struct extent){ .length = len,
                            .flags = NBD_STATE_HOLE | NBD_STATE_ZERO };
  return 1;
}

static void
null_close(struct export *e)
{
}

const struct backend_ops backend_null_ops = {
  .kind = "null",
  .pread = null_pread,
  .pwrite = null_pwrite,
  .zero = null_zero,
  .trim = null_trim,
  .flush = null_noop,
  .cache = null_cache,
  .extents = null_extents,
  .close = null_close,
};

int
backend_null_open(struct export *e, uint64_t size)
{
  e->ops = &backend_null_ops;
  e->size = size;
  e->can_trim = true;
  e->can_fast_zero = true;
  e->write_in_memory = true;
  return 0;
}
