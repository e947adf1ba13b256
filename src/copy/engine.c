/* engine.c: see engine.h and engine_priv.h. Everything here runs on the
 * loop thread. */
#include "copy/engine_priv.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "net/loop.h"
#include "util/zero.h"
#include "util/log.h"

/* An NBD server that went away, said in words a user can act on: errno's
 * own text for ESHUTDOWN ("Cannot send after transport endpoint
 * shutdown") misleads. Writes the line and returns true, or returns false
 * when err means something else. */
static bool
eng_fail_gone(struct engine *e, const char *what, const struct endpoint *ep,
              uint64_t off, uint64_t len, int err, const char *msg)
{
  if (ep == NULL || strcmp(ep->ops->kind, "nbd") != 0 ||
      (err != ESHUTDOWN && err != ECONNRESET && err != EPIPE))
    return false;
  char why[320];
  /* The client's own words may already say it: keep only what they add
   * ("... with requests in flight"), so the line does not repeat itself. */
  static const char closed[] = "server closed the connection";
  if (msg && strncmp(msg, closed, sizeof closed - 1) == 0) {
    const char *rest = msg + sizeof closed - 1;
    snprintf(why, sizeof why, "the server closed the connection%s", rest);
  } else if (err == ESHUTDOWN && !(msg && msg[0]))
    snprintf(why, sizeof why, "the server is shutting down (it refused "
             "the request with ESHUTDOWN)");
  else if (err == ESHUTDOWN)
    snprintf(why, sizeof why, "the server closed the connection (%s)", msg);
  else
    snprintf(why, sizeof why, "the server closed the connection (%s%s%s)",
             strerror(err), msg && msg[0] ? ": " : "", msg ? msg : "");
  char of[40] = "";
  if (e->size != UINT64_MAX)
    snprintf(of, sizeof of, " of %llu", (unsigned long long)e->size);
  /* Only a copy (one with a destination) can retry. */
  snprintf(e->err, e->errlen, "%s %s failed at offset %llu length %llu: %s, "
           "after %llu%s bytes%s", what, ep->name, (unsigned long long)off,
           (unsigned long long)len, why, (unsigned long long)e->st->done, of,
           e->dst && !ep->retries
               ? "; copy --retry=N[,DELAY] reconnects and carries on"
               : "");
  return true;
}

/* Records the first failure; later ones are consequences and stay quiet. */
void
eng_fail(struct engine *e, const char *what, const struct endpoint *ep,
         uint64_t off, uint64_t len, int err, const char *msg)
{
  if (e->failed)
    return;
  e->failed = err ? err : EIO;
  if (eng_fail_gone(e, what, ep, off, len, e->failed, msg))
    return;
  snprintf(e->err, e->errlen, "%s %s failed at offset %llu length %llu: %s%s%s",
           what, ep ? ep->name : "", (unsigned long long)off,
           (unsigned long long)len, strerror(e->failed),
           msg && msg[0] ? ": " : "", msg ? msg : "");
}

/* ---- buffers and pieces ---- */

static uint8_t *
eng_buf_take(struct engine *e)
{
  if (e->nfree_bufs > 0)
    return e->free_bufs[--e->nfree_bufs];
  if (e->nbufs >= e->max_bufs)
    return NULL;
  void *p;
  if (posix_memalign(&p, 4096, (size_t)e->rsize) != 0)
    return NULL;
  e->nbufs++;
  return p;
}

static void
eng_buf_put(struct engine *e, uint8_t *b)
{
  e->free_bufs[e->nfree_bufs++] = b;
}

static void
eng_gate_unlink(struct engine *e, struct cop *c)
{
  if (!c->in_order)
    return;
  if (c->prev)
    c->prev->next = c->next;
  else
    e->gate_head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    e->gate_tail = c->prev;
  c->prev = c->next = NULL;
  c->in_order = false;
}

/* The piece is finished (or abandoned): its buffer returns to the pool. */
static void
eng_cop_release(struct engine *e, struct cop *c)
{
  eng_gate_unlink(e, c);
  if (c->data) {
    if (c->own_buf) {
      free(c->buf);
    } else if (c->buf) {
      eng_buf_put(e, c->buf);
    }
    c->buf = NULL;
    e->inflight -= c->charge;
    e->data_active--;
  } else {
    e->zero_active--;
  }
  c->state = COP_FREE;
  e->active--;
  c->next = e->free_cops;
  e->free_cops = c;
}

static void
eng_op_done(struct ep_op *op)
{
  struct engine *e = ((struct cop *)op->arg)->eng;
  op->next_done = NULL;
  if (e->done_tail)
    e->done_tail->next_done = op;
  else
    e->done_head = op;
  e->done_tail = op;
}

void
eng_ctl_done(struct ep_op *op)
{
  struct engine *e = op->arg;
  op->next_done = NULL;
  if (e->done_tail)
    e->done_tail->next_done = op;
  else
    e->done_head = op;
  e->done_tail = op;
}

/* ---- writing and completion ---- */

static void
eng_account(struct engine *e, struct cop *c, bool zeroed, bool skipped)
{
  struct copy_stats *st = e->st;
  st->done += c->length;
  st->requests++;
  if (skipped)
    st->skipped += c->length;
  else if (zeroed)
    st->zeroed += c->length;
  else
    st->copied += c->length;
}

static void eng_gate_advance(struct engine *e);

/* Hands w, an op of piece c, to the destination. If it is refused at
 * once, the copy fails, naming what at off and len, and c is released. */
static void
eng_dst_submit(struct engine *e, struct cop *c, struct ep_op *w,
               const char *what, uint64_t off, uint64_t len)
{
  c->state = COP_WRITING;
  c->t_sub_us = loop_now_us();
  e->dst_busy++;
  int r = endpoint_submit(e->dst, w);
  if (r < 0) {
    e->dst_busy--;
    eng_fail(e, what, e->dst, off, len, -r, w->errmsg);
    eng_cop_release(e, c);
  }
}

/* Reads the destination's block that the piece ends in, so that the
 * write can cover all of it (§Size constraints: no request may end
 * inside a minimum block). Nothing else writes that block's bytes past
 * the copy's end, so they are the destination's own. */
static void
eng_pad_read(struct engine *e, struct cop *c)
{
  uint64_t end = c->offset + c->length;
  struct ep_op *w = &c->wop;
  *w = (struct ep_op){ .type = EP_READ, .offset = end / e->pad * e->pad,
                       .length = e->pad, .buf = e->pad_buf,
                       .done = eng_op_done, .arg = c };
  c->padding = true;
  eng_dst_submit(e, c, w, "read of the last block of", w->offset,
                 w->length);
}

static void eng_write(struct engine *e, struct cop *c);

static void
eng_pad_done(struct engine *e, struct cop *c)
{
  struct ep_op *w = &c->wop;
  e->dst_busy--;
  c->padding = false;
  if (e->failed || w->err) {
    eng_fail(e, "read of the last block of", e->dst, w->offset, w->length,
             w->err, w->errmsg);
    eng_cop_release(e, c);
    return;
  }
  uint64_t end = c->offset + c->length;
  uint64_t keep = end - w->offset; /* the block's bytes the copy writes */
  memcpy(c->buf + c->length, e->pad_buf + keep, (size_t)(e->pad - keep));
  c->padded = true;
  eng_write(e, c);
}

static void
eng_write(struct engine *e, struct cop *c)
{
  /* --destination-is-zero skips a zero piece only where the destination
   * already spans it: a stream or a file growing with the copy needs the
   * bytes, or the size, that the piece brings, and a destination written
   * in order (an image made as a stream) needs every piece in turn. */
  if (e->dst == NULL ||
      (c->zero && e->o->dst_is_zero && e->dst->size_known &&
       !e->dst->sequential)) {
    if (!c->replay)
      eng_account(e, c, false, true);
    eng_cop_release(e, c);
    return;
  }
  if (eng_needs_pad(e, c->offset, c->length) && !c->padded) {
    uint64_t whole = (c->offset + c->length + e->pad - 1) / e->pad * e->pad -
                     c->offset;
    if (c->offset % e->pad || whole > c->cap) {
      /* The piece starts inside a block too (the source described its
       * extents in pieces below the alignment): no write of it could
       * keep to the minimum. */
      eng_fail(e, "write to", e->dst, c->offset, c->length, EINVAL,
               "the last piece does not start on a block boundary of the "
               "destination");
      eng_cop_release(e, c);
      return;
    }
    eng_pad_read(e, c);
    return;
  }
  struct ep_op *w = &c->wop;
  *w = (struct ep_op){ .offset = c->offset, .length = c->length,
                       .done = eng_op_done, .arg = c };
  if (c->padded) {
    w->type = EP_WRITE;
    w->buf = c->buf;
    w->length = (c->offset + c->length) / e->pad * e->pad + e->pad -
                c->offset;
  } else if (c->from_file) {
    w->type = EP_WRITE;
    w->from_file = true;
    w->file_fd = c->file_fd;
    w->file_off = c->file_off;
  } else if (!c->zero || e->o->allocated || !e->dst->can_zero) {
    w->type = EP_WRITE;
    w->buf = c->buf ? c->buf : e->zero_buf;
  } else {
    w->type = EP_ZERO;
  }
  eng_dst_submit(e, c, w, w->type == EP_ZERO ? "zeroing" : "write to",
                 c->offset, c->length);
}

/* Passes pieces whose turn has come, in offset order. */
static void
eng_gate_advance(struct engine *e)
{
  while (e->gate_head && e->gate_head->state == COP_READY) {
    struct cop *c = e->gate_head;
    if (e->failed) {
      eng_cop_release(e, c);
      continue;
    }
    if (!c->hashed && (e->o->hash || e->o->chunks))
      eng_hash_piece(e, c);
    if (e->dst && e->dst->sequential && e->dst_busy)
      return;
    eng_gate_unlink(e, c);
    eng_write(e, c);
  }
}

static void
eng_ready(struct engine *e, struct cop *c)
{
  c->state = COP_READY;
  if (e->ordered)
    eng_gate_advance(e);
  else
    eng_write(e, c);
}

/* Marks the blocks of data_map in which the piece holds a non-zero byte. */
static void
eng_map_data(struct engine *e, struct cop *c)
{
  uint64_t bs = e->o->data_map_block;
  uint64_t off = c->offset, end = c->offset + c->length;
  while (off < end) {
    uint64_t b = off / bs;
    uint64_t n = (b + 1) * bs - off;
    if (n > end - off)
      n = end - off;
    if (!(e->o->data_map[b / 8] >> (b % 8) & 1) &&
        !buf_is_zero(c->buf + (off - c->offset), (size_t)n))
      e->o->data_map[b / 8] |= (uint8_t)(1u << (b % 8));
    off += n;
  }
}

static void
eng_read_done(struct engine *e, struct cop *c)
{
  struct ep_op *r = &c->rop;
  e->src_busy--;
  if (e->failed || r->err) {
    eng_fail(e, "read from", e->src, c->offset, c->length, r->err,
             r->errmsg);
    eng_cop_release(e, c);
    eng_gate_advance(e);
    return;
  }
  if (r->eof) {
    e->src_eof = true;
    e->size = c->offset + r->length;
    e->st->total = e->size;
    c->length = r->length;
    if (c->length == 0) {
      eng_cop_release(e, c);
      eng_gate_advance(e);
      return;
    }
  }
  if (e->o->data_map)
    eng_map_data(e, c);
  if (!e->o->allocated && !e->o->no_zero_detect &&
      buf_is_zero(c->buf, (size_t)c->length)) {
    c->zero = true;
    if (c->own_buf) {
      /* Zeroes go out as ZERO, not as the large WRITE: open again. */
      e->open_len = e->open_max;
      e->st->opening_request = 0;
    }
  }
  eng_ready(e, c);
}

static void
eng_write_done(struct engine *e, struct cop *c)
{
  struct ep_op *w = &c->wop;
  e->dst_busy--;
  if (w->err)
    eng_fail(e, w->type == EP_ZERO ? "zeroing" : "write to", e->dst,
             c->offset, c->length, w->err, w->errmsg);
  else if (c->replay)
    e->replayed += w->type == EP_WRITE ? c->length : 0;
  else
    eng_account(e, c, w->type == EP_ZERO, w->skipped);
  eng_cop_release(e, c);
  if (e->ordered)
    eng_gate_advance(e);
}

static void
eng_flush_done(struct engine *e)
{
  e->flushing = false;
  e->flushed = true;
  if (e->flush_op.err) {
    eng_fail(e, "flush of", e->dst, 0, e->size, e->flush_op.err,
             e->flush_op.errmsg);
    return;
  }
  /* Sent again on a new connection, it covers none of the lost one's
   * writes: the copy goes back and flushes once more at the end. */
  if (eng_rewind_if_lost(e) || !eng_flush_vouches(e, e->flush_lost))
    e->flushed = false;
  else
    e->durable = e->pos;
}

static void
eng_handle(struct engine *e, struct ep_op *op)
{
  int side = op->ep == e->src ? 0 : 1;
  if (e->watched[side])
    e->t_reply_us[side] = loop_now_us();
  if (op == &e->ext_op) {
    eng_extents_done(e);
    return;
  }
  if (op == &e->flush_op) {
    eng_flush_done(e);
    return;
  }
  if (op == &e->ckpt_op) {
    eng_ckpt_done(e);
    return;
  }
  struct cop *c = op->arg;
  if (op == &c->rop)
    eng_read_done(e, c);
  else if (c->padding)
    eng_pad_done(e, c);
  else
    eng_write_done(e, c);
}

/* ---- issuing ---- */

static struct cop *
eng_cop_take(struct engine *e, uint64_t len, bool zero)
{
  struct cop *c = e->free_cops;
  if (c)
    e->free_cops = c->next;
  else
    c = &e->cops[e->cops_used++];
  memset(c, 0, sizeof *c);
  c->eng = e;
  c->offset = e->pos;
  c->length = len;
  c->zero = zero;
  c->replay = c->offset < e->replay_end;
  c->hashed = c->replay; /* its bytes were hashed the first time */
  c->t0_us = loop_now_us();
  e->active++;
  if (e->ordered) {
    c->in_order = true;
    c->prev = e->gate_tail;
    if (e->gate_tail)
      e->gate_tail->next = c;
    else
      e->gate_head = c;
    e->gate_tail = c;
  }
  return c;
}

/* Issues one piece if the window, the pool and the planner allow it.
 * Returns true when something was issued, or when the plan changed and
 * it should be asked again. */
static bool
eng_issue_one(struct engine *e)
{
  uint64_t len;
  bool zero;
  if (e->failed || (e->free_cops == NULL && e->cops_used == ENG_MAX_COPS))
    return false;
  if (e->src->sequential && e->src_busy)
    return false;
  if (e->o->max_requests && e->active >= e->o->max_requests)
    return false;
  if (e->o->request_limit && e->active >= e->o->request_limit)
    return false;
  if (eng_plan(e, &len, &zero) != PLAN_OK)
    return false;
  if (e->pos < e->replay_end && len > e->replay_end - e->pos)
    len = e->replay_end - e->pos; /* a replay ends where the first run did:
                                     past it, bytes are new, counted and
                                     hashed (a piece boundary: aligned) */
  if (zero) {
    if (e->zero_active >= COPY_MAX_ZERO_INFLIGHT)
      return false;
    struct cop *c = eng_cop_take(e, len, true);
    e->zero_active++;
    eng_consume(e, len);
    eng_ready(e, c);
    return true;
  }
  if (e->inflight > 0 && e->inflight + len > e->window) {
    e->window_held = true;
    return false;
  }
  if (e->o->rate && !eng_rate_allows(e, len))
    return false;
  uint8_t *buf = NULL;
  size_t cap = (size_t)e->rsize; /* of buf */
  bool opening = len > e->rsize;
  if (e->probe.on)
    eng_probe_step(e, len); /* may switch send_file */
  /* A piece to read-modify-write needs its bytes in a buffer; one the
   * source maps only in part is cut to what it maps, if that keeps to the
   * destination's blocks. */
  struct endpoint_map map = { .fd = -1 };
  bool direct = e->send_file && !eng_needs_pad(e, e->pos, len) &&
                e->src->ops->map(e->src, e->pos, len, &map) == 0;
  if (direct && map.length < len) {
    uint32_t mb = e->dst->min_block > 1 ? e->dst->min_block : 1;
    if (map.length % mb == 0)
      len = map.length;
    else
      direct = false;
  }
  opening = len > e->rsize;
  if (opening && !direct) {
    void *p; /* room for a last block of either side too */
    uint64_t blk = e->pad > e->src->min_block ? e->pad : e->src->min_block;
    cap = (size_t)(blk > 1 ? (len + blk - 1) / blk * blk : len);
    if (posix_memalign(&p, 4096, cap) != 0) {
      e->open_len = 0; /* go on without: plan again on the grid */
      return true;
    }
    buf = p;
  } else if (!direct && (buf = eng_buf_take(e)) == NULL) {
    /* With no buffer at all, none will come back to wait for: the
     * first could not be had. */
    if (e->nbufs == 0)
      eng_fail(e, "read from", e->src, e->pos, len, ENOMEM,
               "no buffer of that length could be had (--request-size)");
    return false;
  }
  if (opening) {
    e->open_len = 0;
    e->st->opening_request = len;
  }
  struct cop *c = eng_cop_take(e, len, false);
  c->data = true;
  c->buf = buf; /* the piece owns it now */
  c->own_buf = opening && buf != NULL;
  c->charge = len;
  c->cap = buf ? cap : 0;
  e->inflight += len;
  if (e->o->rate)
    e->rate_tokens -= (double)len;
  e->data_active++;
  if (e->inflight > e->st->peak_inflight)
    e->st->peak_inflight = e->inflight;
  if (e->data_active > e->st->peak_depth)
    e->st->peak_depth = e->data_active;
  eng_consume(e, len);
  if (direct) {
    /* Nothing to read: the write carries the file range itself, and the
     * piece holds its window charge until the write is acknowledged. */
    c->from_file = true;
    c->file_fd = map.fd;
    c->file_off = map.host_off;
    eng_ready(e, c);
    return true;
  }
  c->state = COP_READING;
  c->t_sub_us = loop_now_us();
  c->rop = (struct ep_op){ .type = EP_READ, .offset = c->offset,
                           .length = len, .buf = buf, .done = eng_op_done,
                           .arg = c };
  /* A copy of less than the source (reading a destination back) may end
   * inside the source's minimum block: read all of it, use what is ours. */
  uint32_t smin = e->src->min_block;
  if (smin > 1 && (c->offset + len) % smin) {
    uint64_t whole = (c->offset + len + smin - 1) / smin * smin - c->offset;
    if (whole <= cap && c->offset + whole <= e->src->size)
      c->rop.length = whole;
  }
  e->src_busy++;
  int r = endpoint_submit(e->src, &c->rop);
  if (r < 0) {
    e->src_busy--;
    eng_fail(e, "read from", e->src, c->offset, len, -r, c->rop.errmsg);
    eng_cop_release(e, c);
  }
  return true;
}

/* ---- driving ---- */

/* True while a request to an unwatched endpoint (file, pipe, generated)
 * is in flight, or the checkpoint callback runs: a worker may still be
 * using its op and buffer. */
static bool
eng_local_busy(const struct engine *e)
{
  if ((e->ext_pending && !e->watched[0]) ||
      ((e->flushing || e->ckpt_busy) && !e->watched[1]) ||
      e->ckpt_committing)
    return true;
  for (size_t i = 0; i < e->cops_used; i++) {
    const struct cop *c = &e->cops[i];
    if ((c->state == COP_READING && !e->watched[0]) ||
        (c->state == COP_WRITING && !e->watched[1]))
      return true;
  }
  return false;
}

void
eng_check_finish(struct engine *e)
{
  uint64_t len;
  bool zero;
  if (e->abandoned) {
    /* The silent endpoint's requests are never awaited; local ones are,
     * since they end on their own and a worker borrows their memory. */
    if (!e->finished && !eng_local_busy(e)) {
      e->finished = true;
      loop_stop(e->env->loop);
    }
    return;
  }
  if (e->active > 0 || e->ext_pending || e->flushing || e->ckpt_busy ||
      e->finished)
    return;
  if (!e->failed && eng_plan(e, &len, &zero) != PLAN_DONE)
    return;
  if (!e->failed && e->dst && !e->o->no_flush && e->dst->can_flush &&
      !e->flushed) {
    e->flush_op = (struct ep_op){ .type = EP_FLUSH, .done = eng_ctl_done,
                                  .arg = e };
    e->flushing = true;
    e->t_flush_us = loop_now_us();
    e->flush_lost = e->dst->reconnects;
    int r = endpoint_submit(e->dst, &e->flush_op);
    if (r < 0) {
      e->flushing = false;
      e->flushed = true;
      eng_fail(e, "flush of", e->dst, 0, e->size, -r, NULL);
    } else {
      return;
    }
  }
  if (!e->failed && e->o->checkpoint && e->dst && e->size != UINT64_MAX &&
      e->ckpt_committed < e->size) {
    /* Everything landed, and is flushed: recorded before the end. */
    e->ckpt_below = e->size;
    eng_ckpt_commit(e);
    return;
  }
  e->finished = true;
  loop_stop(e->env->loop);
}

static void
eng_pump(void *arg)
{
  struct engine *e = arg;
  if (e->pumping)
    return;
  e->pumping = true;
  for (;;) {
    bool busy = false;
    eng_rewind_if_lost(e);
    while (e->done_head) {
      struct ep_op *op = e->done_head;
      e->done_head = op->next_done;
      if (e->done_head == NULL)
        e->done_tail = NULL;
      eng_handle(e, op);
      busy = true;
    }
    while (eng_issue_one(e))
      busy = true;
    if (!busy && e->done_head == NULL)
      break;
  }
  eng_check_finish(e);
  e->pumping = false;
}

/* SIGINT or SIGTERM during a run: the number, else 0. Set by the handler
 * on whichever thread the signal lands, read by the tick. */
static volatile sig_atomic_t eng_signal;

static void
eng_on_signal(int sig)
{
  eng_signal = sig;
}

int
copy_signal(void)
{
  return eng_signal;
}

#define ENG_SIGNAL_GRACE_US 1000000

/* A signal stops the run at the next tick: the pieces in flight are
 * abandoned (a stuck server must not keep the user waiting), and the
 * error says how far it got. Local work (a file on a hung mount, a pipe
 * nobody reads) cannot be abandoned: when it still holds the run a
 * second later, the process ends here with the same line. A second
 * signal finds the default action back (SA_RESETHAND) and ends it at
 * once. */
static void
eng_check_signal(struct engine *e)
{
  int sig = eng_signal;
  if (sig == 0 || e->finished)
    return;
  if (e->t_signal_us != 0) {
    if (loop_now_us() - e->t_signal_us < ENG_SIGNAL_GRACE_US)
      return;
    log_error("%s", e->err);
    /* Death by the signal itself, as after a normal stop (cmd.h). */
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
  }
  if (!e->failed && e->flushing) {
    /* Every byte was written and acknowledged; only the FLUSH that makes
     * them durable had not been answered. */
    e->failed = EINTR;
    snprintf(e->err, e->errlen, "interrupted by %s during the final flush "
             "of %s: all %llu bytes were written, but the flush was not "
             "confirmed (data may still be in a cache, not on stable "
             "storage)", sig == SIGINT ? "SIGINT" : "SIGTERM", e->dst->name,
             (unsigned long long)e->st->done);
  }
  if (!e->failed) {
    e->failed = EINTR;
    bool partial = e->dst && strcmp(e->dst->ops->kind, "null") != 0;
    char of[40] = "";
    if (e->size != UINT64_MAX)
      snprintf(of, sizeof of, " of %llu", (unsigned long long)e->size);
    snprintf(e->err, e->errlen, "interrupted by %s after %llu%s bytes%s",
             sig == SIGINT ? "SIGINT" : "SIGTERM",
             (unsigned long long)e->st->done, of,
             partial ? ": the destination is incomplete" : "");
  }
  e->t_signal_us = loop_now_us();
  e->abandoned = true;
  eng_check_finish(e);
}

static void
eng_tick(struct loop *l, void *arg)
{
  struct engine *e = arg;
  (void)l;
  eng_check_signal(e);
  if (e->finished)
    return;
  ep_env_drain(e->env);
  if (e->src->ops->tick)
    e->src->ops->tick(e->src);
  if (e->dst && e->dst->ops->tick)
    e->dst->ops->tick(e->dst);
  ep_env_drain(e->env); /* what a tick completed */
  eng_pump(e);
  eng_watchdog(e);
  eng_checkpoint(e);
  eng_sample_tcp(e);
  eng_adapt(e);
  if (!e->finished)
    eng_progress(e, false);
}

static uint64_t
eng_lcm_align(const struct endpoint *a, const struct endpoint *b)
{
  uint64_t x = a->align > 4096 ? a->align : 4096;
  if (b && b->align > x)
    x = b->align;
  return x; /* all powers of two: the largest is a multiple of the rest */
}

static int
eng_setup(struct engine *e)
{
  const struct copy_opts *o = e->o;
  e->align = eng_lcm_align(e->src, e->dst);
  uint64_t maxreq = e->src->max_request;
  if (e->dst && e->dst->max_request < maxreq)
    maxreq = e->dst->max_request;
  e->rsize = o->request_size ? o->request_size : COPY_DEFAULT_REQUEST;
  if (e->rsize > maxreq)
    e->rsize = maxreq;
  if (e->rsize >= e->align) {
    e->rsize = e->rsize / e->align * e->align;
  } else { /* tiny request sizes: trust the user, within the servers' minimum */
    uint64_t m = e->src->min_block > 1 ? e->src->min_block : 1;
    if (e->dst && e->dst->min_block > m)
      m = e->dst->min_block; /* powers of two: the larger covers both */
    e->rsize = (e->rsize + m - 1) / m * m;
    e->align = e->rsize;
  }
  e->adaptive = o->inflight == 0;
  e->window = o->inflight ? o->inflight
                          : COPY_WINDOW_FLOOR_REQUESTS * e->rsize;
  if (e->window < e->rsize)
    e->window = e->rsize;
  e->max_bufs = (size_t)((e->window + e->rsize - 1) / e->rsize) + 1;
  /* The opening piece: only when the request size is ours to choose and
   * requests are not limited for diagnosis; never above the window. */
  uint64_t open = e->src->opening_request;
  if (e->dst && e->dst->opening_request > open)
    open = e->dst->opening_request;
  if (open > maxreq)
    open = maxreq;
  if (open > e->window)
    open = e->window;
  open = open / e->align * e->align;
  if (open > e->rsize && !o->request_size && !o->max_requests &&
      !e->src->sequential && !(e->dst && e->dst->sequential))
    e->open_len = e->open_max = open;
  size_t pool_cap = (size_t)(COPY_WINDOW_CAP / e->rsize) + 2;
  if (pool_cap < e->max_bufs)
    pool_cap = e->max_bufs;
  e->free_bufs = calloc(pool_cap, sizeof *e->free_bufs);
  e->cops = calloc(ENG_MAX_COPS, sizeof *e->cops);
  if (e->free_bufs == NULL || e->cops == NULL)
    return -ENOMEM;
  if (e->dst && e->dst->min_block > 1) {
    e->pad = e->dst->min_block;
    if ((e->pad_buf = malloc(e->pad)) == NULL)
      return -ENOMEM;
  }
  bool zero_writes = e->dst && (o->allocated || !e->dst->can_zero);
  e->zero_max = zero_writes ? e->rsize : ENDPOINT_ZERO_MAX;
  if (zero_writes && (e->zero_buf = calloc(1, (size_t)e->rsize)) == NULL)
    return -ENOMEM;
  e->ordered = o->hash || o->chunks || (e->dst && e->dst->sequential);
  /* Zero copy needs no bytes in user space: nothing to hash, no pipe to
   * feed in order. Zero detection then only sees holes. */
  e->send_file = e->dst && !o->no_zero_copy && !e->ordered &&
                 e->dst->can_send_file && e->src->ops->map != NULL &&
                 !e->src->sequential &&
                 /* --no-extents hides the holes: only looking at the
                  * bytes finds the zeroes then */
                 !(o->no_extents && !o->no_zero_detect);
  if (e->send_file && e->dst->loopback && !o->zero_copy) {
    e->send_file = false;
    eng_probe_setup(e);
  }
  if (o->chunks) {
    e->chunk_state = XXH3_createState();
    if (e->chunk_state == NULL)
      return -ENOMEM;
    XXH3_64bits_reset(e->chunk_state);
    uint8_t *z = calloc(1, COPY_CHUNK);
    if (z == NULL)
      return -ENOMEM;
    e->zero_chunk_digest = XXH3_64bits(z, COPY_CHUNK);
    free(z);
    struct copy_chunks *ch = o->chunks;
    uint64_t want = e->size == UINT64_MAX ? 0 : e->size / COPY_CHUNK + 1;
    ch->n = 0;
    ch->cap = want;
    ch->d = want ? calloc(want, sizeof *ch->d) : NULL;
    if (want && ch->d == NULL)
      return -ENOMEM;
  }
  return 0;
}

static void
eng_teardown(struct engine *e)
{
  /* Abandoned pieces still hold buffers; only a silent endpoint, whose
   * connections are closed without calling done, borrows them. */
  for (size_t i = 0; e->abandoned && i < e->cops_used; i++)
    if (e->cops[i].state != COP_FREE)
      free(e->cops[i].buf);
  for (size_t i = 0; i < e->nfree_bufs; i++)
    free(e->free_bufs[i]);
  free(e->free_bufs);
  free(e->cops);
  free(e->zero_buf);
  free(e->pad_buf);
  if (e->chunk_state)
    XXH3_freeState(e->chunk_state);
}

/* What TLS ep (NULL: none) negotiated, for the report. */
static void
eng_tls(struct endpoint *ep, struct copy_tls *t)
{
  memset(t, 0, sizeof *t);
  t->on = ep && ep->ops->tls && ep->ops->tls(ep, &t->p, &t->uniform) == 0;
}

int
copy_run(struct ep_env *env, struct endpoint *src, struct endpoint *dst,
         const struct copy_opts *o, struct copy_stats *st, char *err,
         size_t errlen)
{
  struct engine *e = calloc(1, sizeof *e);
  if (e == NULL) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  memset(st, 0, sizeof *st);
  st->stall_pct = -1;
  e->env = env;
  e->src = src;
  e->dst = dst;
  e->o = o;
  e->st = st;
  e->err = err;
  e->errlen = errlen;
  e->size = src->size_known ? src->size
          : dst && dst->size_known ? dst->size : UINT64_MAX;
  if (o->max_bytes && (e->size == UINT64_MAX || e->size > o->max_bytes))
    e->size = o->max_bytes;
  e->tty = isatty(STDERR_FILENO);
  e->fd_percent = -1;
  int r = eng_setup(e);
  if (r < 0) {
    snprintf(err, errlen, "out of memory");
    eng_teardown(e);
    free(e);
    return r;
  }
  st->total = e->size == UINT64_MAX ? 0 : e->size;
  if (o->start) {
    uint64_t s0 = e->size != UINT64_MAX && o->start > e->size ? e->size
                                                              : o->start;
    e->pos = e->ext_end = e->ckpt_committed = e->durable = s0;
    st->done = st->resumed = s0;
  }
  st->request_size = e->rsize;
  st->data_path = e->send_file ? "sendfile" : "buffer";
  st->src_connections = src->connections;
  st->dst_connections = dst ? dst->connections : 0;
  e->t_start_us = e->t_last_print_us = e->t_last_adapt_us = loop_now_us();
  e->t_last_ckpt_us = e->t_watch_call_us = e->t_start_us;
  for (int i = 0; i < 2; i++) {
    const struct endpoint *ep = i == 0 ? src : dst;
    e->watched[i] = ep && strcmp(ep->ops->kind, "nbd") == 0;
    e->t_reply_us[i] = e->t_start_us;
  }
  e->adapt_period_us = ENG_ADAPT_MIN_US * 2; /* no RTT known yet */

  env->kick = eng_pump;
  env->kick_arg = e;
  struct sigaction sa = { .sa_handler = eng_on_signal,
                          .sa_flags = SA_RESETHAND | SA_RESTART };
  struct sigaction old_int, old_term;
  sigemptyset(&sa.sa_mask);
  eng_signal = 0;
  /* A signal ignored when we started (a background job of a script)
   * stays ignored. */
  sigaction(SIGINT, NULL, &old_int);
  sigaction(SIGTERM, NULL, &old_term);
  if (old_int.sa_handler != SIG_IGN)
    sigaction(SIGINT, &sa, NULL);
  if (old_term.sa_handler != SIG_IGN)
    sigaction(SIGTERM, &sa, NULL);
  loop_set_tick(env->loop, o->rate ? ENG_RATE_TICK_MS : 200, eng_tick, e);
  eng_pump(e);
  /* Run the loop even when the copy already finished (an empty source):
   * finishing stopped it, and that stop must be spent here, or the next
   * run of the loop (a copy after the walk of its source) would return at
   * once with its requests still in flight. */
  r = loop_run(env->loop);
  loop_set_tick(env->loop, 0, NULL, NULL);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  env->kick = NULL;

  st->seconds = (double)(loop_now_us() - e->t_start_us) / 1e6;
  st->window = e->window;
  if (e->probe.done || e->probe.on)
    eng_probe_report(e, st);
  st->src_connections = src->connections; /* later ones joined meanwhile */
  st->dst_connections = dst ? dst->connections : 0;
  st->reconnects = src->reconnects + (dst ? dst->reconnects : 0);
  st->resent = src->resent_bytes + (dst ? dst->resent_bytes : 0) +
               e->replayed;
  if (r < 0 && !e->failed)
    eng_fail(e, "event loop", NULL, 0, 0, -r, NULL);
  if (!e->failed && e->o->progress != COPY_PROGRESS_NONE)
    eng_progress(e, true);
  else if (e->failed && e->o->progress == COPY_PROGRESS_BAR && e->tty)
    fputc('\n', stderr);
  eng_finish_chunks(e);
  struct endpoint *nbd = dst && dst->ops->tcp_json ? dst : src;
  st->tcp_json[0] = '\0';
  if (nbd->ops->tcp_json &&
      nbd->ops->tcp_json(nbd, st->tcp_json, sizeof st->tcp_json) < 0)
    st->tcp_json[0] = '\0';
  st->tcp_json_each[0] = '\0';
  if (nbd->ops->tcp_json_each &&
      nbd->ops->tcp_json_each(nbd, st->tcp_json_each,
                              sizeof st->tcp_json_each) < 0)
    st->tcp_json_each[0] = '\0';
  eng_tls(src, &st->src_tls);
  eng_tls(dst, &st->dst_tls);
  r = e->failed ? -e->failed : 0;
  eng_teardown(e);
  free(e);
  return r;
}
