/* backend_memory.c: a RAM disk that tracks its own allocation.
 *
 * The image is one anonymous mapping, reserved lazily by the kernel, so an
 * untouched chunk costs nothing and reads as zeroes. A bitmap with one bit
 * per MEM_CHUNK says which chunks were written; it feeds BLOCK_STATUS and
 * the holes of structured READ replies. Bits change with atomic operations
 * because requests from several threads may touch one word.
 *
 * Requests run on several worker threads at once. Reads share and writes,
 * zeroes and trims exclude each other per 1 MiB region (MEM_LOCK_SHIFT),
 * through MEM_NLOCKS locks that the regions map onto round robin. So
 * two requests that touch the same bytes never copy at the same time (the
 * spec leaves their result open, but a C data race is undefined), and a
 * trim cannot clear a chunk's bit after a racing write has filled it
 * again, which would let later reads of the chunk disagree. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "export.h"
#include "proto/nbd.h"

#define MEM_CHUNK_SHIFT 16
#define MEM_CHUNK (UINT64_C(1) << MEM_CHUNK_SHIFT)
#define MEM_LOCK_SHIFT 20 /* 1 MiB regions */
#define MEM_NLOCKS 64     /* one bit each in a uint64_t mask */

struct mem_priv {
  uint8_t *base;   /* mapping of mapped_len bytes */
  size_t mapped_len;
  uint64_t *bits;  /* one bit per chunk: 1 = allocated */
  pthread_rwlock_t locks[MEM_NLOCKS]; /* set up first, so close may free */
};

/* The locks that cover [off, off + len), len > 0, as a mask. */
static uint64_t
mem_lock_mask(uint64_t off, uint64_t len)
{
  uint64_t first = off >> MEM_LOCK_SHIFT;
  uint64_t last = (off + len - 1) >> MEM_LOCK_SHIFT;
  if (last - first >= MEM_NLOCKS - 1)
    return UINT64_MAX;
  uint64_t mask = 0;
  for (uint64_t r = first; r <= last; r++)
    mask |= UINT64_C(1) << (r % MEM_NLOCKS);
  return mask;
}

/* Takes the locks in ascending order, so two requests never wait on each
 * other in a cycle. */
static void
mem_lock(struct mem_priv *m, uint64_t mask, bool exclusive)
{
  for (int i = 0; i < MEM_NLOCKS; i++)
    if (mask & (UINT64_C(1) << i)) {
      if (exclusive)
        pthread_rwlock_wrlock(&m->locks[i]);
      else
        pthread_rwlock_rdlock(&m->locks[i]);
    }
}

static void
mem_unlock(struct mem_priv *m, uint64_t mask)
{
  for (int i = 0; i < MEM_NLOCKS; i++)
    if (mask & (UINT64_C(1) << i))
      pthread_rwlock_unlock(&m->locks[i]);
}

static bool
mem_test(const struct mem_priv *m, uint64_t chunk)
{
  uint64_t w = __atomic_load_n(&m->bits[chunk / 64], __ATOMIC_RELAXED);
  return (w >> (chunk % 64)) & 1;
}

static void
mem_mark(struct mem_priv *m, uint64_t first, uint64_t last, bool set)
{
  for (uint64_t c = first; c <= last; c++) {
    uint64_t bit = UINT64_C(1) << (c % 64);
    if (set)
      __atomic_fetch_or(&m->bits[c / 64], bit, __ATOMIC_RELAXED);
    else
      __atomic_fetch_and(&m->bits[c / 64], ~bit, __ATOMIC_RELAXED);
  }
}

static int
mem_pread(struct export *e, void *buf, uint64_t len, uint64_t off)
{
  struct mem_priv *m = e->priv;
  if (len == 0)
    return 0;
  uint64_t mask = mem_lock_mask(off, len);
  mem_lock(m, mask, false);
  memcpy(buf, m->base + off, len);
  mem_unlock(m, mask);
  return 0;
}

static int
mem_pwrite(struct export *e, const void *buf, uint64_t len, uint64_t off,
           bool fua)
{
  struct mem_priv *m = e->priv;
  if (len == 0)
    return 0;
  uint64_t mask = mem_lock_mask(off, len);
  mem_lock(m, mask, true);
  memcpy(m->base + off, buf, len);
  mem_mark(m, off >> MEM_CHUNK_SHIFT, (off + len - 1) >> MEM_CHUNK_SHIFT,
           true);
  mem_unlock(m, mask);
  return 0;
}

/* Zeroes [off, off + len) with its locks held. */
static void
mem_zero_locked(struct export *e, uint64_t len, uint64_t off, bool may_trim)
{
  struct mem_priv *m = e->priv;
  uint64_t end = off + len;

  if (!may_trim) {
    memset(m->base + off, 0, len);
    mem_mark(m, off >> MEM_CHUNK_SHIFT, (end - 1) >> MEM_CHUNK_SHIFT, true);
    return;
  }
  /* Whole chunks go back to the kernel; partial edges are cleared. */
  uint64_t a = (off + MEM_CHUNK - 1) & ~(MEM_CHUNK - 1);
  uint64_t b = end & ~(MEM_CHUNK - 1);
  if (end == e->size)
    b = (end + MEM_CHUNK - 1) & ~(MEM_CHUNK - 1);
  if (a >= b) {
    memset(m->base + off, 0, len);
    return;
  }
  memset(m->base + off, 0, a - off);
  if (end > b)
    memset(m->base + b, 0, end - b);
  if (madvise(m->base + a, b - a, MADV_DONTNEED) < 0)
    memset(m->base + a, 0, (end < b ? end : b) - a);
  mem_mark(m, a >> MEM_CHUNK_SHIFT, (b >> MEM_CHUNK_SHIFT) - 1, false);
}

static int
mem_zero(struct export *e, uint64_t len, uint64_t off, bool may_trim,
         bool fast, bool fua)
{
  struct mem_priv *m = e->priv;
  if (len == 0)
    return 0;
  uint64_t mask = mem_lock_mask(off, len);
  mem_lock(m, mask, true);
  mem_zero_locked(e, len, off, may_trim);
  mem_unlock(m, mask);
  return 0;
}

static int
mem_trim(struct export *e, uint64_t len, uint64_t off, bool fua)
{
  return mem_zero(e, len, off, true, false, fua);
}

static int
mem_flush(struct export *e)
{
  return 0;
}

static int
mem_cache(struct export *e, uint64_t len, uint64_t off)
{
  return 0;
}

static int
mem_extents(struct export *e, uint64_t off, uint64_t len, struct extent *ext,
            int max)
{
  struct mem_priv *m = e->priv;
  uint64_t end = off + len;
  int n = 0;

  while (off < end && n < max) {
    uint64_t c = off >> MEM_CHUNK_SHIFT;
    bool alloc = mem_test(m, c);
    uint64_t next = (c + 1) << MEM_CHUNK_SHIFT;
    while (next < end && mem_test(m, next >> MEM_CHUNK_SHIFT) == alloc)
      next += MEM_CHUNK;
    if (next > end)
      next = end;
    ext[n++] = (struct extent){
      .length = next - off,
      .flags = alloc ? 0 : NBD_STATE_HOLE | NBD_STATE_ZERO,
    };
    off = next;
  }
  return n;
}

static void
mem_close(struct export *e)
{
  struct mem_priv *m = e->priv;
  if (m == NULL)
    return;
  if (m->base && m->base != MAP_FAILED)
    munmap(m->base, m->mapped_len);
  for (int i = 0; i < MEM_NLOCKS; i++)
    pthread_rwlock_destroy(&m->locks[i]);
  free(m->bits);
  free(m);
}

const struct backend_ops backend_memory_ops = {
  .kind = "memory",
  .pread = mem_pread,
  .pwrite = mem_pwrite,
  .zero = mem_zero,
  .trim = mem_trim,
  .flush = mem_flush,
  .cache = mem_cache,
  .extents = mem_extents,
  .close = mem_close,
};

int
backend_memory_open(struct export *e, uint64_t size)
{
  struct mem_priv *m = calloc(1, sizeof *m);
  if (m == NULL)
    return -ENOMEM;
  /* Writers first: with glibc's default, pipelined READs spanning many
   * regions could keep a WRITE or TRIM waiting for as long as they come.
   * Safe here because no request takes a lock twice. */
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  for (int i = 0; i < MEM_NLOCKS; i++)
    pthread_rwlock_init(&m->locks[i], &attr);
  pthread_rwlockattr_destroy(&attr);
  e->ops = &backend_memory_ops;
  e->priv = m;
  e->size = size;
  uint64_t chunks = (size + MEM_CHUNK - 1) >> MEM_CHUNK_SHIFT;
  m->mapped_len = (size_t)(chunks << MEM_CHUNK_SHIFT);
  m->bits = calloc((size_t)(chunks / 64 + 1), sizeof *m->bits);
  if (m->bits == NULL)
    return -ENOMEM;
  if (m->mapped_len) {
    m->base = mmap(NULL, m->mapped_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m->base == MAP_FAILED)
      return -errno;
  }
  e->can_trim = true;
  e->can_fast_zero = true;
  return 0;
}
