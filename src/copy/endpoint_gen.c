/* endpoint_gen.c: generated sources, for tests and benchmarks that need
 * large images without large files. Content is a pure function of the
 * offset, so any byte can be regenerated and checked.
 *
 *   pattern:SIZE                  every aligned 8-byte word holds its own
 *                                 offset, big-endian (as nbdkit's pattern
 *                                 plugin does)
 *   random:SIZE[:SEED]            pseudo-random bytes, reproducible per
 *                                 4 KiB block from SEED (default 0)
 *   zero:SIZE                     all zeroes, reported as one hole
 *   sparse:SIZE[:PERIOD[:DATA]]   DATA bytes of random content (seed 0) at
 *                                 the start of every PERIOD, holes
 *                                 elsewhere; defaults 32M and 1M, so the
 *                                 image is 1/32 data
 * SIZE, PERIOD and DATA take the usual suffixes (K, M, G, ...). */
#include "copy/endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "proto/wire.h"
#include "util/size.h"

#define GEN_BLOCK 4096

enum gen_kind { GEN_PATTERN, GEN_RANDOM, GEN_ZERO, GEN_SPARSE };

struct gen_priv {
  enum gen_kind kind;
  uint64_t seed;
  uint64_t period, data; /* sparse */
};

/* One 4 KiB block of random content: a xorshift64* stream seeded from
 * the block number and the seed by XXH3. */
static void
gen_random_block(uint64_t seed, uint64_t blk, uint8_t out[GEN_BLOCK])
{
  uint64_t x = XXH3_64bits_withSeed(&blk, sizeof blk, seed) | 1;
  for (size_t i = 0; i < GEN_BLOCK; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t v = x * UINT64_C(2685821657736338717);
    memcpy(out + i, &v, 8);
  }
}

static void
gen_fill_random(uint64_t seed, uint8_t *buf, uint64_t off, uint64_t len)
{
  uint8_t blk[GEN_BLOCK];
  while (len > 0) {
    uint64_t b = off / GEN_BLOCK, in = off % GEN_BLOCK;
    uint64_t n = GEN_BLOCK - in < len ? GEN_BLOCK - in : len;
    if (in == 0 && n == GEN_BLOCK) {
      gen_random_block(seed, b, buf);
    } else {
      gen_random_block(seed, b, blk);
      memcpy(buf, blk + in, (size_t)n);
    }
    buf += n;
    off += n;
    len -= n;
  }
}

static void
gen_fill_pattern(uint8_t *buf, uint64_t off, uint64_t len)
{
  for (uint64_t i = 0; i < len;) {
    uint64_t word = (off + i) & ~UINT64_C(7);
    uint8_t w[8];
    wire_put64(w, word);
    uint64_t in = (off + i) - word;
    uint64_t n = 8 - in < len - i ? 8 - in : len - i;
    memcpy(buf + i, w + in, (size_t)n);
    i += n;
  }
}

static void
gen_fill(const struct gen_priv *p, uint8_t *buf, uint64_t off, uint64_t len)
{
  switch (p->kind) {
  case GEN_PATTERN:
    gen_fill_pattern(buf, off, len);
    break;
  case GEN_RANDOM:
    gen_fill_random(p->seed, buf, off, len);
    break;
  case GEN_ZERO:
    memset(buf, 0, (size_t)len);
    break;
  case GEN_SPARSE:
    while (len > 0) {
      uint64_t in = off % p->period;
      uint64_t run = in < p->data ? p->data - in : p->period - in;
      if (run > len)
        run = len;
      if (in < p->data)
        gen_fill_random(p->seed, buf, off, run);
      else
        memset(buf, 0, (size_t)run);
      buf += run;
      off += run;
      len -= run;
    }
    break;
  }
}

static void
gen_work(struct work *w)
{
  struct ep_op *op = (struct ep_op *)((char *)w - offsetof(struct ep_op, work));
  gen_fill(op->ep->priv, op->buf, op->offset, op->length);
  ep_env_complete(op->ep->env, op);
}

static void
gen_extents(struct endpoint *e, struct ep_op *op)
{
  const struct gen_priv *p = e->priv;
  uint64_t off = op->offset, end = op->offset + op->length;
  if (end > e->size)
    end = e->size;
  while (off < end && op->nextents < op->max_extents) {
    struct endpoint_extent x = { end - off, false };
    if (p->kind == GEN_ZERO)
      x.zero = true;
    if (p->kind == GEN_SPARSE) {
      uint64_t in = off % p->period;
      x.zero = in >= p->data;
      uint64_t run = x.zero ? p->period - in : p->data - in;
      if (run < x.length)
        x.length = run;
    }
    op->extents[op->nextents++] = x;
    off += x.length;
  }
}

static int
gen_submit(struct endpoint *e, struct ep_op *op)
{
  if (op->type == EP_EXTENTS) {
    gen_extents(e, op);
    ep_env_complete(e->env, op);
    return 0;
  }
  if (op->type != EP_READ)
    return -EBADF;
  op->work.fn = gen_work;
  workq_push(e->env->wq, &op->work);
  return 0;
}

static void
gen_close(struct endpoint *e)
{
  free(e->priv);
}

static const struct endpoint_ops gen_ops = {
  .kind = "generated",
  .submit = gen_submit,
  .close = gen_close,
};

/* Splits "a:b:c" after the prefix into up to 3 size fields. */
/* A generated source's name, parsed and checked. */
struct gen_spec {
  enum gen_kind kind;
  uint64_t size, seed, period, data;
};

/* Fields after the prefix, ':'-separated; an empty one (a doubled or a
 * trailing ':') is an error, not a field skipped. */
static int
gen_fields(const char *args, uint64_t *v, int max, int *n)
{
  *n = 0;
  for (const char *f = args;; f++) {
    const char *end = strchr(f, ':');
    size_t len = end ? (size_t)(end - f) : strlen(f);
    char tok[64];
    if (*n == max || len == 0 || len >= sizeof tok)
      return -EINVAL;
    memcpy(tok, f, len);
    tok[len] = '\0';
    if (size_parse(tok, &v[*n]) < 0)
      return -EINVAL;
    (*n)++;
    if (end == NULL)
      return 0;
    f = end;
  }
}

/* Parses spec into g: -ENOENT (nothing written) when it names no
 * generator, -EINVAL with why in err when its fields are wrong. */
static int
gen_spec_parse(const char *spec, struct gen_spec *g, char *err,
               size_t errlen)
{
  static const struct {
    const char *prefix;
    enum gen_kind kind;
    int maxargs;
    const char *form;
  } kinds[] = { { "pattern:", GEN_PATTERN, 1, "pattern:SIZE" },
                { "random:", GEN_RANDOM, 2, "random:SIZE[:SEED]" },
                { "zero:", GEN_ZERO, 1, "zero:SIZE" },
                { "sparse:", GEN_SPARSE, 3, "sparse:SIZE[:PERIOD[:DATA]]" } };
  size_t k;
  for (k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    if (strncmp(spec, kinds[k].prefix, strlen(kinds[k].prefix)) == 0)
      break;
  if (k == sizeof kinds / sizeof kinds[0])
    return -ENOENT;
  uint64_t v[3] = { 0, 0, 0 };
  int n;
  if (gen_fields(spec + strlen(kinds[k].prefix), v, kinds[k].maxargs, &n) <
      0) {
    snprintf(err, errlen, "bad generated source '%s': the form is %s, each "
             "a number below 2^64 with an optional suffix (K, M, G, T, P "
             "or E)", spec, kinds[k].form);
    return -EINVAL;
  }
  *g = (struct gen_spec){ .kind = kinds[k].kind, .size = v[0] };
  if (g->kind == GEN_RANDOM)
    g->seed = v[1];
  if (g->kind == GEN_SPARSE) {
    g->period = n > 1 ? v[1] : 32u << 20;
    g->data = n > 2 ? v[2] : 1u << 20;
    if (g->period == 0 || g->data == 0 || g->data > g->period) {
      snprintf(err, errlen, "'%s': need 0 < DATA <= PERIOD (PERIOD %llu, "
               "DATA %llu%s)", spec, (unsigned long long)g->period,
               (unsigned long long)g->data,
               n > 2 ? "" : n > 1 ? ": 1M unless given" : ": 32M and 1M "
                                                          "unless given");
      return -EINVAL;
    }
  }
  return 0;
}

int
endpoint_gen_check(const char *spec, char *err, size_t errlen)
{
  struct gen_spec g;
  return gen_spec_parse(spec, &g, err, errlen);
}

int
endpoint_open_gen(struct ep_env *env, const char *spec, struct endpoint **out,
                  char *err, size_t errlen)
{
  struct gen_spec g;
  int r = gen_spec_parse(spec, &g, err, errlen);
  if (r < 0)
    return r;
  struct gen_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, spec, &gen_ops, p) : NULL;
  if (e == NULL) {
    free(p);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  p->kind = g.kind;
  p->seed = g.seed;
  p->period = g.period;
  p->data = g.data;
  e->size = g.size;
  e->readable = true;
  e->has_extents = p->kind == GEN_ZERO || p->kind == GEN_SPARSE;
  *out = e;
  return 0;
}
