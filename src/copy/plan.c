/* plan.c: the planner. It walks the source's extents (asking for them a
 * batch ahead) and cuts them into pieces: data pieces of at most the
 * request size on a grid of that size (the opening piece's while that is
 * still to be sent), zero pieces up to zero_max, both rounded to the
 * alignment of both endpoints and kept whole within the destination's
 * minimum block. See engine_priv.h. */
#include "copy/engine_priv.h"

#include <string.h>

#include "net/loop.h"

/* The piece is the copy's last and ends inside the destination's minimum
 * block. Only the last: other pieces' blocks are written by their
 * neighbours too, and reading them here would race with that. */
bool
eng_needs_pad(const struct engine *e, uint64_t off, uint64_t len)
{
  return e->pad && off + len == e->size && e->size % e->pad != 0;
}

static void
eng_request_extents(struct engine *e, uint64_t from)
{
  struct ep_op *op = &e->ext_op;
  *op = (struct ep_op){ .type = EP_EXTENTS, .offset = from,
                        .length = eng_min(e->size - from, ENDPOINT_STATUS_SPAN),
                        .extents = e->ext_batch, .max_extents = ENG_EXT_BATCH,
                        .done = eng_ctl_done, .arg = e };
  uint32_t smin = e->src->min_block; /* as for reads: whole blocks */
  uint64_t end = op->offset + op->length;
  if (smin > 1 && end % smin && end / smin * smin + smin <= e->src->size)
    op->length = end / smin * smin + smin - op->offset;
  e->ext_pending = true;
  e->t_ext_us = loop_now_us();
  int r = endpoint_submit(e->src, op);
  if (r < 0) {
    e->ext_pending = false;
    eng_fail(e, "extents of", e->src, from, op->length, -r, NULL);
  }
}

void
eng_extents_done(struct engine *e)
{
  struct ep_op *op = &e->ext_op;
  e->ext_pending = false;
  if (e->ext_discard && !op->err) {
    e->ext_discard = false; /* of before a rewind: asked again from pos */
    return;
  }
  e->ext_discard = false;
  if (op->err || op->nextents == 0) {
    eng_fail(e, "extents of", e->src, op->offset, op->length,
             op->err ? op->err : EPROTO, op->errmsg);
    return;
  }
  if (e->ext_head + e->ext_count + op->nextents > ENG_EXT_CAP) {
    memmove(e->ext, e->ext + e->ext_head, e->ext_count * sizeof e->ext[0]);
    e->ext_head = 0;
  }
  for (size_t i = 0; i < op->nextents; i++) {
    struct endpoint_extent x = op->extents[i];
    if (x.length > e->size - e->ext_end)
      x.length = e->size - e->ext_end;
    if (x.length == 0)
      break;
    e->ext[e->ext_head + e->ext_count++] = x;
    e->ext_end += x.length;
  }
}

/* The grid data pieces are cut on: the request size, or the opening
 * piece's length while that is still to be sent (it is as large as the
 * window at most, so it waits until nothing else is in flight). */
static uint64_t
eng_step(const struct engine *e)
{
  return e->open_len ? e->open_len : e->rsize;
}

/* Length of a data piece at pos that may end no later than end. */
static uint64_t
eng_data_len(struct engine *e, uint64_t end)
{
  uint64_t step = eng_step(e);
  uint64_t grid = step - e->pos % step;
  uint64_t len = eng_min(end - e->pos, grid);
  if (e->size != UINT64_MAX)
    len = eng_min(len, e->size - e->pos);
  return len;
}

static uint64_t
eng_round_up(struct engine *e, uint64_t x)
{
  uint64_t r = (x + e->align - 1) / e->align * e->align;
  return e->size != UINT64_MAX && r > e->size ? e->size : r;
}

enum plan
eng_plan(struct engine *e, uint64_t *len, bool *zero)
{
  if (e->src_eof || (e->size != UINT64_MAX && e->pos >= e->size))
    return PLAN_DONE;
  *zero = false;
  if (!e->src->has_extents || e->o->no_extents) {
    *len = eng_data_len(e, e->pos + eng_step(e));
    return PLAN_OK;
  }
  if (!e->ext_pending && e->ext_end < e->size &&
      e->ext_count < ENG_EXT_BATCH)
    eng_request_extents(e, e->ext_end);
  if (e->ext_count == 0)
    return PLAN_WAIT;
  const struct endpoint_extent *x = &e->ext[e->ext_head];
  uint64_t xend = e->pos + x->length;
  if (x->zero) {
    uint64_t zend = xend == e->size ? xend : xend / e->align * e->align;
    if (eng_needs_pad(e, 0, zend)) /* the last block goes as data */
      zend = zend / e->pad * e->pad;
    if (zend > e->pos && e->pos % e->align == 0) {
      *zero = true;
      *len = eng_min(zend - e->pos, e->zero_max);
      return PLAN_OK;
    }
  }
  /* Data, rounded out to the alignment so the next piece starts aligned;
   * never past the extents we know. Those may end off the alignment (a
   * server may describe less than was asked): then the piece stops at the
   * last aligned point, or waits for the next extents. */
  uint64_t end = eng_min(eng_round_up(e, xend), e->ext_end);
  if (end < e->size && end % e->align) {
    uint64_t down = end / e->align * e->align;
    if (down > e->pos)
      end = down;
    else if (e->ext_pending)
      return PLAN_WAIT;
    /* else the extent table is full of pieces smaller than the
     * alignment: the piece ends where the extents do, which the
     * server's minimum may still allow (if not, the request is refused
     * before it goes out and the copy fails, rather than hanging) */
  }
  *len = eng_data_len(e, end);
  return PLAN_OK;
}

void
eng_consume(struct engine *e, uint64_t len)
{
  e->pos += len;
  while (len > 0 && e->ext_count > 0) {
    struct endpoint_extent *x = &e->ext[e->ext_head];
    if (x->length <= len) {
      len -= x->length;
      e->ext_head++;
      e->ext_count--;
    } else {
      x->length -= len;
      len = 0;
    }
  }
  if (e->ext_count == 0)
    e->ext_head = 0;
}
