/* checkpoint.c: --checkpoint. About every checkpoint_us the destination
 * is flushed, and then an offset below which every byte has landed is
 * handed to copy_opts.checkpoint on a worker (it syncs a journal: the
 * loop never waits for a device). See engine_priv.h. */
#include "copy/engine_priv.h"

#include <stddef.h>
#include <stdio.h>

#include "net/loop.h"

/* Worker: the checkpoint callback, then back to the loop. */
static void
eng_ckpt_work(struct work *w)
{
  struct ep_op *op = (struct ep_op *)((char *)w - offsetof(struct ep_op,
                                                          work));
  struct engine *e = op->arg;
  int r = e->o->checkpoint(e->o->checkpoint_arg, e->ckpt_below, op->errmsg,
                           sizeof op->errmsg);
  op->err = r < 0 ? -r : 0;
  ep_env_complete(e->env, op);
}

/* Hands ckpt_below to the callback on a worker. */
void
eng_ckpt_commit(struct engine *e)
{
  e->ckpt_op = (struct ep_op){ .done = eng_ctl_done, .arg = e,
                               .ep = e->dst };
  e->ckpt_op.work.fn = eng_ckpt_work;
  e->ckpt_busy = e->ckpt_committing = true;
  workq_push(e->env->wq, &e->ckpt_op.work);
}

void
eng_ckpt_done(struct engine *e)
{
  struct ep_op *op = &e->ckpt_op;
  bool commit = e->ckpt_committing;
  e->ckpt_busy = e->ckpt_committing = false;
  if (op->err && !commit) {
    eng_fail(e, "flush of", e->dst, 0, e->size, op->err, op->errmsg);
    return;
  }
  if (op->err && !e->failed) {
    /* Not eng_fail: the callback's sentence says it all. */
    e->failed = op->err;
    snprintf(e->err, e->errlen, "%s", op->errmsg);
  }
  if (op->err)
    return;
  if (commit)
    e->ckpt_committed = e->ckpt_below;
  else if (!e->failed)
    eng_ckpt_commit(e); /* flushed: now it may be recorded */
}

/* Below this offset every byte has landed: the lowest piece still in
 * flight, or the planner's position. Rounded down to COPY_CHUNK, so
 * that a resumed --verify joins its digests. */
static uint64_t
eng_low_water(const struct engine *e)
{
  uint64_t w = e->pos;
  for (size_t i = 0; i < e->cops_used; i++) {
    const struct cop *c = &e->cops[i];
    if (c->state != COP_FREE && c->offset < w)
      w = c->offset;
  }
  if (e->size != UINT64_MAX && w >= e->size)
    return e->size;
  return w / COPY_CHUNK * COPY_CHUNK;
}

/* Starts a checkpoint for `below`: a FLUSH of the destination (where it
 * has one), and the commit once that succeeded, so that a journal never
 * names a byte that a crash of the server could still lose. */
static void
eng_ckpt_start(struct engine *e, uint64_t below)
{
  e->ckpt_below = below;
  e->t_ckpt_us = loop_now_us();
  if (!e->dst->can_flush) {
    eng_ckpt_commit(e);
    return;
  }
  e->ckpt_op = (struct ep_op){ .type = EP_FLUSH, .done = eng_ctl_done,
                               .arg = e };
  e->ckpt_busy = true;
  int r = endpoint_submit(e->dst, &e->ckpt_op);
  if (r < 0) {
    e->ckpt_busy = false;
    eng_fail(e, "flush of", e->dst, 0, e->size, -r, e->ckpt_op.errmsg);
  }
}

/* About every checkpoint_us while the copy runs. */
void
eng_checkpoint(struct engine *e)
{
  uint64_t now = loop_now_us();
  if (e->o->checkpoint == NULL || e->dst == NULL || e->failed ||
      e->abandoned || e->finished || e->ckpt_busy || e->flushing ||
      now - e->t_last_ckpt_us < e->o->checkpoint_us)
    return;
  e->t_last_ckpt_us = now;
  uint64_t below = eng_low_water(e);
  if (below > e->ckpt_committed)
    eng_ckpt_start(e, below);
}
