/* watchdog.c: --timeout. An NBD endpoint with requests in flight that
 * answers none of them for timeout_s fails the copy (or, with --retry,
 * is reconnected), and what is in flight there is abandoned. Called from
 * the engine's tick. See engine_priv.h. */
#include "copy/engine_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/loop.h"
#include "util/log.h"

/* The oldest request in flight on one endpoint, and how many there are. */
struct eng_oldest {
  unsigned n;
  uint64_t t_us;
  const char *what;
  uint64_t off, len;
};

static void
eng_oldest_note(struct eng_oldest *w, uint64_t t_us, const char *what,
                uint64_t off, uint64_t len)
{
  if (w->n++ == 0 || t_us < w->t_us)
    *w = (struct eng_oldest){ w->n, t_us, what, off, len };
}

static const char *
eng_op_name(enum ep_op_type t)
{
  switch (t) {
  case EP_READ: return "read";
  case EP_WRITE: return "write";
  case EP_ZERO: return "zeroing";
  case EP_FLUSH: return "flush";
  case EP_EXTENTS: return "block status";
  }
  return "request";
}

#define ENG_WATCH_US 190000 /* ~200 ms, tolerating tick jitter */
/* Between two ticks (200 ms apart, 20 ms under --rate) a longer gap means
 * the loop itself was deaf: busy hashing a long hole, or the process
 * stopped or starved of CPU. */
#define ENG_DEAF_US 1000000

/* --timeout: fails the copy with ETIMEDOUT when an NBD endpoint with
 * requests in flight has answered none of them for timeout_s, and
 * abandons everything in flight there. An endpoint's clock runs from the
 * later of its last reply and its oldest request's submission: time it
 * spent with nothing to answer (a slow pipe upstream, a busy other end)
 * never counts. File and pipe endpoints are not watched: their I/O ends
 * on its own, and a slow pipe is no failure. Runs about every 200 ms. */
void
eng_watchdog(struct engine *e)
{
  uint64_t now = loop_now_us();
  uint64_t limit = (uint64_t)e->o->timeout_s * 1000000;
  if (limit == 0 || e->abandoned || e->finished)
    return;
  /* While the loop was deaf, replies waited in the socket unread: that
   * time is not the server's silence. It is credited to each endpoint,
   * and the judging waits for a tick after the replies have been read. */
  uint64_t gap = now - e->t_watch_call_us; /* set at start: a stop before
                                              * the first tick counts too */
  e->t_watch_call_us = now;
  if (gap > ENG_DEAF_US) {
    for (int i = 0; i < 2; i++)
      e->t_reply_us[i] = e->t_reply_us[i] + gap < now ? e->t_reply_us[i] + gap
                                                      : now;
    e->t_last_watch_us = now;
    return;
  }
  if (now - e->t_last_watch_us < ENG_WATCH_US)
    return;
  e->t_last_watch_us = now;
  bool suspect = false;
  struct endpoint *eps[2] = { e->src, e->dst };
  for (int i = 0; i < 2; i++) {
    /* A piece of an op answered is a reply too (zeroing in pieces). */
    if (e->watched[i] && eps[i]->t_answer_us > e->t_reply_us[i])
      e->t_reply_us[i] = eps[i]->t_answer_us;
    if (e->watched[i] && now - e->t_reply_us[i] >= limit)
      suspect = true;
  }
  if (!suspect)
    return; /* every endpoint replied recently: the common case */
  struct eng_oldest w[2] = { { 0 }, { 0 } };
  for (size_t i = 0; i < e->cops_used; i++) {
    const struct cop *c = &e->cops[i];
    if (c->state == COP_READING)
      eng_oldest_note(&w[0], c->t_sub_us, eng_op_name(c->rop.type),
                      c->offset, c->length);
    else if (c->state == COP_WRITING)
      eng_oldest_note(&w[1], c->t_sub_us, eng_op_name(c->wop.type),
                      c->offset, c->length);
  }
  if (e->ext_pending)
    eng_oldest_note(&w[0], e->t_ext_us, "block status", e->ext_op.offset,
                    e->ext_op.length);
  if (e->flushing)
    eng_oldest_note(&w[1], e->t_flush_us, "flush", 0, e->size);
  if (e->ckpt_busy && !e->ckpt_committing)
    eng_oldest_note(&w[1], e->t_ckpt_us, "flush", 0, e->size);
  for (int i = 0; i < 2; i++) {
    if (!e->watched[i] || w[i].n == 0)
      continue;
    uint64_t since = w[i].t_us > e->t_reply_us[i] ? w[i].t_us
                                                  : e->t_reply_us[i];
    /* A FLUSH may rightly take long: it writes back what the server
     * cached, possibly gigabytes to slow storage. */
    bool flush = strcmp(w[i].what, "flush") == 0;
    uint64_t lim = flush ? limit * ENDPOINT_FLUSH_TIMEOUT_FACTOR : limit;
    if (now - since < lim)
      continue;
    struct endpoint *ep = i == 0 ? e->src : e->dst;
    char why[200];
    snprintf(why, sizeof why, "no reply for %u s with %u request%s in "
             "flight", (unsigned)(lim / 1000000), w[i].n,
             w[i].n == 1 ? "" : "s");
    if (!e->failed && ep->ops->lost && ep->ops->lost(ep, why) == 0) {
      e->t_reply_us[i] = now; /* reconnecting (--retry) */
      continue;
    }
    if (!e->failed) {
      /* Not eng_fail: the line also says how long and how many. */
      e->failed = ETIMEDOUT;
      snprintf(e->err, e->errlen, "%s: no reply for %u s with %u "
               "request%s in flight; oldest: %s at offset %llu length "
               "%llu: %s", (i == 0 ? e->src : e->dst)->name,
               (unsigned)(lim / 1000000), w[i].n, w[i].n == 1 ? "" : "s",
               w[i].what,
               (unsigned long long)w[i].off, (unsigned long long)w[i].len,
               strerror(ETIMEDOUT));
    }
    e->abandoned = true;
    eng_check_finish(e);
    return;
  }
}

int
copy_timeout_parse(const char *s, unsigned *out)
{
  char *end;
  if (s[0] < '0' || s[0] > '9')
    goto bad;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > COPY_MAX_TIMEOUT)
    goto bad;
  *out = (unsigned)v;
  return 0;
bad:
  log_error("--timeout: whole seconds, 0 to %d, not '%s'", COPY_MAX_TIMEOUT,
            s);
  return -1;
}
