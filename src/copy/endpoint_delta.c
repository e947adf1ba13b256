/* endpoint_delta.c: a source seen against a base (copy --base, sparse_dd's
 * -base): the destination already holds the base, so only the blocks in
 * which the source differs from it need sending.
 *
 * Opening compares the two, block by block (DELTA_BLOCK), reading both
 * with a few pairs in flight on the environment's loop, and keeps one bit
 * per block. The endpoint then forwards every READ (and map) to the
 * source, and answers EXTENTS from the bits: a changed block is data
 * (even if it reads as zeroes: the base may not), an unchanged one a
 * "zero" extent, which the engine skips because the copy runs with
 * --target-is-zero semantics (cmd_copy sets them). Nothing of the base is
 * read after opening. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "copy/endpoint.h"
#include "format/image.h"
#include "net/loop.h"

#define DELTA_BLOCK (1u << 20)
#define DELTA_PAIRS 8

struct delta_priv {
  struct endpoint *src, *base; /* owned */
  uint8_t *changed;            /* one bit per block, LSB first */
  uint64_t nblocks, nchanged;
  bool by_chain; /* from SRC's image chain; BASE never read */
};

/* ---- the comparison ---- */

struct delta_pair {
  struct delta_scan *ds;
  struct ep_op a, b;
  uint8_t *buf_a, *buf_b;
  uint64_t block;
  int pending;
};

struct delta_scan {
  struct ep_env *env;
  struct delta_priv *p;
  struct delta_pair pairs[DELTA_PAIRS];
  uint64_t next;   /* next block to read */
  unsigned busy;   /* pairs in flight */
  int err;
  const char *err_what;
  uint64_t err_off;
  char errmsg[128];
};

static void delta_issue(struct delta_scan *ds, struct delta_pair *pr);

static void
delta_done(struct ep_op *op)
{
  struct delta_pair *pr = op->arg;
  struct delta_scan *ds = pr->ds;
  if (op->err && ds->err == 0) {
    ds->err = op->err;
    ds->err_what = op == &pr->a ? ds->p->src->name : ds->p->base->name;
    ds->err_off = op->offset;
    memcpy(ds->errmsg, op->errmsg, sizeof ds->errmsg);
  }
  if (--pr->pending > 0)
    return;
  if (ds->err == 0 &&
      (pr->a.length != pr->b.length ||
       memcmp(pr->buf_a, pr->buf_b, pr->a.length) != 0)) {
    ds->p->changed[pr->block / 8] |= (uint8_t)(1u << (pr->block % 8));
    ds->p->nchanged++;
  }
  ds->busy--;
  delta_issue(ds, pr);
}

static void
delta_issue(struct delta_scan *ds, struct delta_pair *pr)
{
  struct delta_priv *p = ds->p;
  if (ds->err || ds->next >= p->nblocks) {
    if (ds->busy == 0)
      loop_stop(ds->env->loop);
    return;
  }
  uint64_t off = ds->next * DELTA_BLOCK;
  uint64_t len = p->src->size - off < DELTA_BLOCK ? p->src->size - off
                                                   : DELTA_BLOCK;
  pr->block = ds->next++;
  pr->pending = 2;
  ds->busy++;
  pr->a = (struct ep_op){ .type = EP_READ, .offset = off, .length = len,
                          .buf = pr->buf_a, .done = delta_done, .arg = pr };
  pr->b = pr->a;
  pr->b.buf = pr->buf_b;
  int r = endpoint_submit(p->src, &pr->a);
  if (r < 0) {
    pr->a.err = -r;
    delta_done(&pr->a);
  }
  r = endpoint_submit(p->base, &pr->b);
  if (r < 0) {
    pr->b.err = -r;
    delta_done(&pr->b);
  }
}

static void
delta_tick(struct loop *l, void *arg)
{
  struct delta_scan *ds = arg;
  (void)l;
  ep_env_drain(ds->env);
}

static int
delta_compare(struct ep_env *env, struct delta_priv *p, char *err,
              size_t errlen)
{
  struct delta_scan *ds = calloc(1, sizeof *ds);
  if (ds == NULL) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  ds->env = env;
  ds->p = p;
  int r = 0;
  for (int i = 0; i < DELTA_PAIRS; i++) {
    ds->pairs[i].ds = ds;
    ds->pairs[i].buf_a = malloc(DELTA_BLOCK);
    ds->pairs[i].buf_b = malloc(DELTA_BLOCK);
    if (!ds->pairs[i].buf_a || !ds->pairs[i].buf_b)
      r = -ENOMEM;
  }
  if (r == 0) {
    loop_set_tick(env->loop, 100, delta_tick, ds);
    for (int i = 0; i < DELTA_PAIRS; i++)
      delta_issue(ds, &ds->pairs[i]);
    if (ds->busy > 0)
      r = loop_run(env->loop);
    loop_set_tick(env->loop, 0, NULL, NULL);
    if (r == 0 && ds->err)
      r = -ds->err;
  }
  if (r == -ENOMEM)
    snprintf(err, errlen, "out of memory");
  else if (r < 0)
    snprintf(err, errlen, "comparing with the base: read of %s at offset "
             "%llu: %s%s%s", ds->err_what ? ds->err_what : "?",
             (unsigned long long)ds->err_off, strerror(-r),
             ds->errmsg[0] ? ": " : "", ds->errmsg);
  for (int i = 0; i < DELTA_PAIRS; i++) {
    free(ds->pairs[i].buf_a);
    free(ds->pairs[i].buf_b);
  }
  free(ds);
  return r;
}

/* ---- the endpoint ---- */

static bool
delta_changed(const struct delta_priv *p, uint64_t block)
{
  return p->changed[block / 8] & (1u << (block % 8));
}

static int
delta_submit(struct endpoint *e, struct ep_op *op)
{
  struct delta_priv *p = e->priv;
  if (op->type != EP_EXTENTS)
    return endpoint_submit(p->src, op); /* its done is the caller's */
  op->ep = e;
  uint64_t off = op->offset, end = op->offset + op->length;
  size_t n = 0;
  while (off < end && n < op->max_extents) {
    uint64_t b = off / DELTA_BLOCK;
    bool ch = delta_changed(p, b);
    uint64_t run_end = (b + 1) * DELTA_BLOCK;
    while (run_end < end && run_end / DELTA_BLOCK < p->nblocks &&
           delta_changed(p, run_end / DELTA_BLOCK) == ch)
      run_end += DELTA_BLOCK;
    if (run_end > end)
      run_end = end;
    op->extents[n++] = (struct endpoint_extent){ .length = run_end - off,
                                                 .zero = !ch };
    off = run_end;
  }
  op->nextents = n;
  op->err = 0;
  op->done(op);
  return 0;
}

static int
delta_map(struct endpoint *e, uint64_t off, uint64_t len,
          struct endpoint_map *m)
{
  struct delta_priv *p = e->priv;
  if (p->src->ops->map == NULL)
    return -EAGAIN;
  return p->src->ops->map(p->src, off, len, m);
}

static bool
delta_inner_peer_error(const struct endpoint *e)
{
  const struct delta_priv *p = e->priv;
  return p && (endpoint_peer_error(p->src) || endpoint_peer_error(p->base));
}

static void
delta_close(struct endpoint *e)
{
  struct delta_priv *p = e->priv;
  if (p == NULL)
    return;
  endpoint_close(p->src);
  endpoint_close(p->base);
  free(p->changed);
  free(p);
  e->priv = NULL;
}

static const struct endpoint_ops delta_ops = {
  .kind = "delta",
  .submit = delta_submit,
  .close = delta_close,
  .map = delta_map,
  .inner_peer_error = delta_inner_peer_error,
};

int
endpoint_open_delta(struct ep_env *env, struct endpoint *src,
                    struct endpoint *base, const char *base_path,
                    struct endpoint **out, char *err, size_t errlen)
{
  *out = NULL;
  if (!src->size_known || !base->size_known || src->size != base->size) {
    snprintf(err, errlen, "--base %s: %s", base->name,
             !src->size_known || !base->size_known
                 ? "the source and the base must have known sizes"
                 : "the base's size differs from the source's");
    return -EINVAL;
  }
  struct delta_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, src->name, &delta_ops, p) : NULL;
  if (p)
    p->nblocks = (src->size + DELTA_BLOCK - 1) / DELTA_BLOCK;
  if (e == NULL ||
      (p->changed = calloc(1, (size_t)(p->nblocks / 8 + 1))) == NULL) {
    free(p ? p->changed : NULL);
    free(p);
    free(e);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  p->src = src;
  p->base = base;
  struct image *img = endpoint_image(src);
  struct stat st;
  int r = 0;
  if (img && img->ops->above && base_path && stat(base_path, &st) == 0)
    r = img->ops->above(img, st.st_dev, st.st_ino, DELTA_BLOCK, p->changed);
  if (r == 1) {
    p->by_chain = true;
    for (uint64_t b = 0; b < p->nblocks; b++)
      p->nchanged += delta_changed(p, b);
    r = 0;
  } else {
    r = delta_compare(env, p, err, errlen);
  }
  if (r < 0) {
    free(p->changed);
    free(p);
    free(e); /* src and base stay the caller's */
    return r;
  }
  e->size = src->size;
  e->size_known = true;
  e->readable = true;
  e->has_extents = true;
  e->align = src->align;
  e->min_block = src->min_block;
  e->max_request = src->max_request;
  e->opening_request = src->opening_request;
  e->connections = src->connections;
  e->multi_conn = src->multi_conn;
  *out = e;
  return 0;
}

bool
endpoint_delta_by_chain(const struct endpoint *e)
{
  const struct delta_priv *p = e->priv;
  return p->by_chain;
}

uint64_t
endpoint_delta_changed(const struct endpoint *e)
{
  const struct delta_priv *p = e->priv;
  return p->nchanged * DELTA_BLOCK;
}
