/* checkpoint.c: --checkpoint. About every checkpoint_us the destination
 * is flushed, and then an offset below which every byte has landed is
 * handed to copy_opts.checkpoint on a worker (it syncs a journal: the
 * loop never waits for a device). The same flushes bound what a lost
 * destination connection can cost under --retry: the copy goes back to
 * the last offset one vouched for (eng_rewind_if_lost). See
 * engine_priv.h. */
#include "copy/engine_priv.h"

#include <stddef.h>
#include <stdio.h>

#include "net/loop.h"
#include "util/log.h"

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

bool
eng_flush_vouches(const struct engine *e, uint64_t lost)
{
  return e->dst->reconnects == lost;
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
  if (commit) {
    e->ckpt_committed = e->ckpt_below;
    return;
  }
  /* A FLUSH that went out again on a new connection covers that one's
   * writes, not those the lost one acknowledged: it vouches for nothing,
   * and the copy goes back instead. */
  if (eng_rewind_if_lost(e) || !eng_flush_vouches(e, e->ckpt_lost))
    return;
  if (e->ckpt_below > e->durable)
    e->durable = e->ckpt_below;
  if (!e->failed && e->o->checkpoint)
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
    /* Nothing to flush: what was acknowledged is all there is. */
    if (below > e->durable)
      e->durable = below;
    if (e->o->checkpoint)
      eng_ckpt_commit(e);
    return;
  }
  e->ckpt_op = (struct ep_op){ .type = EP_FLUSH, .done = eng_ctl_done,
                               .arg = e };
  e->ckpt_busy = true;
  e->ckpt_lost = e->dst->reconnects;
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
  bool journal = e->o->checkpoint != NULL;
  /* --retry alone flushes to bound a rewind, unless --no-flush says no
   * FLUSH at all: a loss then rewinds to the start. */
  if (e->dst == NULL ||
      (!journal && (!e->dst->retries || e->o->no_flush)) || e->failed ||
      e->abandoned || e->finished || e->ckpt_busy || e->flushing ||
      now - e->t_last_ckpt_us < (journal ? e->o->checkpoint_us
                                         : ENG_DURABLE_US))
    return;
  e->t_last_ckpt_us = now;
  uint64_t below = eng_low_water(e);
  if (below > (journal ? e->ckpt_committed : e->durable))
    eng_ckpt_start(e, below);
}

bool
eng_rewind_if_lost(struct engine *e)
{
  if (e->dst == NULL || e->dst->reconnects == e->dst_lost_seen)
    return false;
  e->dst_lost_seen = e->dst->reconnects;
  if (e->failed || e->abandoned || e->pos <= e->durable)
    return false;
  if (e->src->sequential) {
    eng_fail(e, "write to", e->dst, e->durable, e->pos - e->durable, EIO,
             "the connection was lost with writes acknowledged but not "
             "flushed, which the server may not hold, and a source read "
             "in order cannot be read again to send them");
    return false;
  }
  log_warn("%s: writes from offset %llu to %llu were acknowledged on the "
           "lost connection but not flushed: writing them again",
           e->dst->name, (unsigned long long)e->durable,
           (unsigned long long)e->pos);
  if (e->pos > e->replay_end)
    e->replay_end = e->pos;
  e->pos = e->durable;
  e->ext_head = e->ext_count = 0;
  e->ext_end = e->durable;
  e->ext_discard = e->ext_pending;
  e->open_len = 0;
  e->flushed = false; /* the final FLUSH, if it came, covered too little */
  return true;
}
