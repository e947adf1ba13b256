/* endpoint_nbd_retry.c: --retry and --retry-errors for the NBD endpoint.
 *
 * A connection lost to its transport parks the ops it carried (and every
 * op submitted meanwhile); the next tick drops every connection, and a
 * thread on slot 0's connect job reconnects, waiting longer before each
 * attempt. The new connection must show the same export (and, for a
 * source, the same sample of its content) before the parked ops go out
 * again. An error reply worth another try (--retry-errors) holds just
 * its op until its wait has passed. The request path (endpoint_nbd.c)
 * decides what may be retried through ep_nbd_retryable and
 * ep_nbd_error_retryable. See endpoint_nbd_priv.h. */
#include "copy/endpoint_nbd_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "net/loop.h"
#include "proto/nbd.h"
#include "util/log.h"

/* The wait before attempt n (1, 2, ...): the delay, doubled for each
 * attempt after the first, ENDPOINT_RETRY_MAX_DELAY_MS at most. */
static uint64_t
nbd_retry_wait_us(const struct nbd_priv *p, unsigned n)
{
  uint64_t ms = p->retry_delay_ms;
  for (unsigned k = 1; k < n && ms < ENDPOINT_RETRY_MAX_DELAY_MS; k++)
    ms *= 2;
  if (ms > ENDPOINT_RETRY_MAX_DELAY_MS)
    ms = ENDPOINT_RETRY_MAX_DELAY_MS;
  return ms * 1000;
}

/* ---- what may go again, and holding ops ---- */

/* A failure that a new connection may undo: the connection died of its
 * transport (reset, EOF, TLS, a timeout), or the server said it is
 * shutting down. An error reply (EIO, ENOSPC) is not one. */
bool
ep_nbd_retryable(const struct nbd_priv *p, const struct client_conn *c, int err)
{
  if (p->retry_max == 0 || p->gave_up || p->closing || err == 0)
    return false;
  return (c->fatal && c->lost) || err == ESHUTDOWN;
}

/* --retry-errors: an error reply that the server's storage may get over
 * (a path failing over, space freed), to a request that changes nothing
 * when sent again; never one that says the request itself is wrong. Each
 * op gets as many tries as --retry allows reconnections. */
bool
ep_nbd_error_retryable(const struct nbd_priv *p, const struct nbd_slot *s,
                       const struct ep_op *op, int err)
{
  if (!p->retry_errors || p->gave_up || p->closing || s->c.fatal)
    return false;
  if (err != EIO && err != ENOMEM && err != ENOSPC)
    return false;
  if (op->type != EP_READ && op->type != EP_WRITE && op->type != EP_ZERO)
    return false;
  return op->err_tries < p->retry_max;
}

/* Appends op to the list from *head to *tail, chained by next_parked
 * (the lists of ops held for --retry and --retry-errors). */
static void
nbd_list_append(struct ep_op **head, struct ep_op **tail, struct ep_op *op)
{
  op->next_parked = NULL;
  if (*tail)
    (*tail)->next_parked = op;
  else
    *head = op;
  *tail = op;
}

/* Warnings of requests sent again, per endpoint: storage that fails a
 * share of the requests would otherwise put a line per request in the
 * log (a 16 MiB copy in 32 KiB requests with a quarter failing: 144).
 * As many as the server logs of failed requests per connection. */
#define NBD_AGAIN_LOG_MAX 16

/* Holds op (its reply was err) until the tick after its wait, saying so
 * (the first NBD_AGAIN_LOG_MAX times; then once that the rest are not
 * logged; the report's bytes_resent counts the writes' payloads). */
void
ep_nbd_hold_error(struct endpoint *e, struct ep_op *op, int err,
                  const char *msg)
{
  struct nbd_priv *p = e->priv;
  op->err_tries++;
  uint64_t at = loop_now_us() + nbd_retry_wait_us(p, op->err_tries);
  enum log_take t = log_take(&p->again_logged, NBD_AGAIN_LOG_MAX);
  if (t == LOG_TAKE_LINE)
    log_warn("%s: %s at offset %llu length %llu failed: %s; sending it again "
             "in %.1f s (try %u of %u, --retry-errors)", e->name,
             op->type == EP_READ ? "read" : op->type == EP_WRITE ? "write"
                                                                   : "zeroing",
             (unsigned long long)op->offset, (unsigned long long)op->length,
             msg && msg[0] ? msg : strerror(err),
             (double)(at - loop_now_us()) / 1e6, op->err_tries,
             p->retry_max);
  else if (t == LOG_TAKE_LAST)
    log_warn("%s: more requests failed and are sent again; not logged one "
             "by one (--retry-errors)", e->name);
  if (at > p->again_at_us)
    p->again_at_us = at;
  nbd_list_append(&p->again, &p->again_tail, op);
}

/* Holds op until the endpoint has reconnected. A WRITE whose payload had
 * left counts as sent twice once it goes again. */
void
ep_nbd_park(struct endpoint *e, struct ep_op *op)
{
  struct nbd_priv *p = e->priv;
  if (op->type == EP_WRITE && op->req.sent)
    e->resent_bytes += op->length;
  nbd_list_append(&p->parked, &p->parked_tail, op);
}

/* ---- a source's sample ---- */

/* Reads a source's sample: up to 3 pieces of ENDPOINT_SAMPLE_LEN at its
 * start, middle and end, on whole minimum blocks, hashed together.
 * Blocking: on slot 0 before it joins the loop, or on the thread of a
 * reconnection. Returns 0, or -errno with c->errmsg set. */
int
ep_nbd_read_sample(const struct nbd_priv *p, struct nbd_connect_job *j,
                   struct client_conn *c, uint64_t *digest)
{
  const struct client_info *in = &c->info;
  uint64_t mb = in->min_block > 1 ? in->min_block : 1;
  uint64_t len = ENDPOINT_SAMPLE_LEN;
  if (len > in->max_block)
    len = in->max_block;
  if (len > in->size)
    len = in->size;
  len = len / mb * mb;
  *digest = 0;
  if (len == 0)
    return 0;
  uint64_t offs[3] = { 0, in->size / 2 / mb * mb,
                       (in->size - len) / mb * mb };
  uint8_t *buf = malloc(len);
  XXH3_state_t *st = XXH3_createState();
  int r = buf && st ? 0 : -ENOMEM;
  if (st)
    XXH3_64bits_reset(st);
  for (int i = 0; r == 0 && i < 3; i++) {
    if (offs[i] + len > in->size)
      offs[i] = (in->size - len) / mb * mb;
    /* --retry-errors covers these reads as it does the copy's, within
     * the handshake's limit for all the waits (30 s when there is none),
     * and a close cancels the wait. */
    uint64_t waited = 0, limit = p->co.timeout_ms >= 0
                                     ? (uint64_t)p->co.timeout_ms * 1000
                                     : 30000000;
    for (unsigned t = 0;; t++) {
      struct client_req q = { .type = NBD_CMD_READ, .offset = offs[i],
                              .length = len, .buf = buf };
      r = client_run(c, &q, p->co.timeout_ms);
      uint64_t us = nbd_retry_wait_us(p, t + 1);
      if (!(p->retry_errors && t < p->retry_max && !c->fatal &&
            (r == -EIO || r == -ENOMEM || r == -ENOSPC)) ||
          waited + us > limit || !ep_nbd_job_sleep(j, us))
        break;
      waited += us;
      c->errmsg[0] = '\0';
    }
    if (r < 0 && c->errmsg[0] == '\0')
      snprintf(c->errmsg, sizeof c->errmsg, "reading a sample at offset "
               "%llu: %s", (unsigned long long)offs[i], strerror(-r));
    if (r == 0)
      XXH3_64bits_update(st, buf, (size_t)len);
  }
  if (r == 0)
    *digest = XXH3_64bits_digest(st);
  if (st)
    XXH3_freeState(st);
  free(buf);
  return r;
}

/* ---- reconnecting ---- */

/* No more attempts: every parked op fails with the loss that started
 * them, and later losses fail as without --retry. */
static void
nbd_give_up(struct endpoint *e, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
static void
nbd_give_up(struct endpoint *e, const char *fmt, ...)
{
  struct nbd_priv *p = e->priv;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->lost_msg, sizeof p->lost_msg, fmt, ap);
  va_end(ap);
  p->gave_up = true;
  p->reconnecting = false;
  struct ep_op *op = p->parked;
  p->parked = p->parked_tail = NULL;
  while (op) {
    struct ep_op *next = op->next_parked;
    op->err = p->lost_err;
    snprintf(op->errmsg, sizeof op->errmsg, "%s", p->lost_msg);
    ep_env_complete(e->env, op);
    op = next;
  }
  if (p->flush_parked) {
    p->flush_parked = false;
    op = p->flush_op;
    p->flush_op = NULL;
    op->err = p->lost_err;
    snprintf(op->errmsg, sizeof op->errmsg, "%s", p->lost_msg);
    ep_env_complete(e->env, op);
  }
}

/* A connection was lost (err, why): the ops it carried are parked. The
 * first loss of an outage schedules the reconnection; the connections
 * are dropped at the next tick, not here, since this runs inside a
 * connection's own callbacks. */
void
ep_nbd_lost(struct endpoint *e, int err, const char *why)
{
  struct nbd_priv *p = e->priv;
  if (p->reconnecting || p->gave_up)
    return;
  p->lost_err = err;
  /* ESHUTDOWN is the client's word for an end of stream: its text
   * ("Cannot send after transport endpoint shutdown") would mislead. */
  snprintf(p->lost_msg, sizeof p->lost_msg, "%s",
           why && why[0]         ? why
           : err == ESHUTDOWN ? "the server closed the connection"
                              : strerror(err));
  p->reconnecting = true;
  p->drop_pending = true;
  if (p->attempts >= p->retry_max) {
    /* Reconnected, but lost again before any reply: the budget is
     * spent. Failed from the tick, after the drop. */
    p->retry_at_us = 0;
  } else {
    uint64_t wait = nbd_retry_wait_us(p, p->attempts + 1);
    p->retry_at_us = loop_now_us() + wait;
    const char *what = err == ESHUTDOWN ||
                               strcmp(strerror(err), p->lost_msg) == 0
                           ? ""
                           : strerror(err);
    log_warn("%s: connection lost (%s%s%s); reconnecting in %.1f s "
             "(attempt %u of %u)", e->name, what, what[0] ? ": " : "",
             p->lost_msg, (double)wait / 1e6, p->attempts + 1,
             p->retry_max);
  }
  loop_wake(e->env->loop);
}

/* Loop thread: closes every connection. Requests still in flight on
 * them are called back (and parked); connects still running are
 * abandoned. */
static void
nbd_drop_all(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  p->closing = true; /* quiet: joined connections are dropped at once */
  ep_nbd_join_all(e);
  p->closing = false;
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (s->live && !s->c.fatal)
      client_abort(&s->c, p->lost_err, "dropped to reconnect");
  }
  for (unsigned i = 0; i < p->n; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (s->registered)
      loop_del(e->env->loop, s->c.fd);
    client_close(&s->c);
    s->registered = s->live = s->want_out = false;
  }
  p->started = 0;
  p->connecting = 0;
  e->connections = 0;
}

/* The reconnected slot 0 must show the same export: what the engine
 * planned with (size, block sizes, the commands it uses) and, for a
 * source, the same sample. Returns 0, or -1 with why. */
static int
nbd_same_export(struct endpoint *e, const struct client_info *b,
                uint64_t digest, char *why, size_t len)
{
  struct nbd_priv *p = e->priv;
  const struct client_info *a = &p->info0;
  if (b->size != a->size)
    snprintf(why, len, "its size is %llu bytes, was %llu",
             (unsigned long long)b->size, (unsigned long long)a->size);
  else if (b->min_block != a->min_block)
    snprintf(why, len, "its minimum block size is %u, was %u",
             b->min_block, a->min_block);
  else if (b->max_block < e->max_request)
    snprintf(why, len, "its maximum block size is %u, below the %llu "
             "in use", b->max_block, (unsigned long long)e->max_request);
  else if (e->writable && (b->tflags & NBD_FLAG_READ_ONLY) &&
           !(a->tflags & NBD_FLAG_READ_ONLY))
    snprintf(why, len, "it is read-only now");
  else if ((e->can_zero && !(b->tflags & NBD_FLAG_SEND_WRITE_ZEROES)) ||
           (e->can_flush && !(b->tflags & NBD_FLAG_SEND_FLUSH)) ||
           (e->has_extents && !b->allocation))
    snprintf(why, len, "it no longer offers a command in use (flags "
             "0x%04x, were 0x%04x)", b->tflags, a->tflags);
  else if (p->sampled && digest != p->sample_digest)
    snprintf(why, len, "its content differs (a sample of its start, "
             "middle and end)");
  else
    return 0;
  return -1;
}

static void nbd_resubmit(struct endpoint *e);

/* Loop thread: the reconnection job ended. */
static void
nbd_reconnect_done(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  struct nbd_connect_job *j = &p->jobs[0];
  struct nbd_slot *s = &p->slots[0];
  pthread_join(j->thread, NULL);
  pthread_mutex_destroy(&j->lock);
  j->started = false;
  int r = j->r;
  char why[200];
  if (r == 0 && nbd_same_export(e, &s->c.info, j->digest, why,
                                sizeof why) < 0) {
    client_close(&s->c);
    nbd_give_up(e, "after reconnecting: %s: not the same disk", why);
    return;
  }
  if (r == 0 && (r = ep_nbd_register(e, s)) < 0)
    snprintf(s->c.errmsg, sizeof s->c.errmsg, "event loop: %s",
             strerror(-r));
  if (r < 0) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", s->c.errmsg[0] ? s->c.errmsg
                                                   : strerror(-r));
    client_close(&s->c);
    if (p->attempts >= p->retry_max) {
      nbd_give_up(e, "gave up after %u reconnection attempt%s (the last: "
                  "%s)", p->attempts, p->attempts == 1 ? "" : "s", msg);
      return;
    }
    uint64_t wait = nbd_retry_wait_us(p, p->attempts + 1);
    p->retry_at_us = loop_now_us() + wait;
    log_warn("%s: reconnection attempt %u of %u failed: %s; next in %.1f s",
             e->name, p->attempts, p->retry_max, msg, (double)wait / 1e6);
    return;
  }
  p->reconnecting = false;
  p->started = 1;
  e->connections = 1;
  e->reconnects++;
  /* The count is recomputed: the server may allow more or fewer now. */
  unsigned first = p->first_conns;
  if (p->auto_conns && !(s->c.info.tflags & NBD_FLAG_CAN_MULTI_CONN))
    first = 1;
  ep_nbd_start_jobs(e, first);
  nbd_resubmit(e);
}

/* Submits the ops chained by next_parked, in order; one refused at once
 * fails through its callback. */
static void
nbd_submit_list(struct endpoint *e, struct ep_op *op)
{
  while (op) {
    struct ep_op *next = op->next_parked;
    int rc = ep_nbd_submit(e, op);
    if (rc < 0) {
      op->err = -rc;
      ep_env_complete(e->env, op);
    }
    op = next;
  }
}

/* Loop thread, once reconnected: sends the parked ops again, in the
 * order they were parked, and a parked FLUSH last. */
static void
nbd_resubmit(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  struct ep_op *op = p->parked;
  p->parked = p->parked_tail = NULL;
  unsigned n = 0;
  for (struct ep_op *q = op; q; q = q->next_parked)
    n++;
  log_warn("%s: reconnected (attempt %u); sending %u request%s again",
           e->name, p->attempts, n, n == 1 ? "" : "s");
  nbd_submit_list(e, op);
  if (p->flush_parked) {
    p->flush_parked = false;
    op = p->flush_op;
    p->flush_op = NULL;
    ep_nbd_submit_flush(e, op);
  }
}

/* --retry-errors: the held ops go out again (a reconnection that began
 * meanwhile parks them). */
static void
nbd_send_again(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  struct ep_op *op = p->again;
  p->again = p->again_tail = NULL;
  p->again_at_us = 0;
  for (struct ep_op *q = op; q; q = q->next_parked)
    if (q->type == EP_WRITE)
      e->resent_bytes += q->length; /* its payload goes a second time */
  nbd_submit_list(e, op);
}

/* Engine tick: sends the ops held by --retry-errors once their wait is
 * over, and drives a reconnection. While either waits, the engine's
 * watchdog is told the endpoint is answering: the waits are bounded on
 * their own (the handshake limit each attempt, --retry of them). */
void
ep_nbd_tick(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  uint64_t now = loop_now_us();
  if (p->again) {
    e->t_answer_us = now; /* held on purpose, not waiting for a reply */
    if (!p->reconnecting && now >= p->again_at_us)
      nbd_send_again(e);
  }
  if (!p->reconnecting)
    return;
  e->t_answer_us = now;
  if (p->drop_pending) {
    p->drop_pending = false;
    nbd_drop_all(e);
    if (!p->reconnecting)
      return; /* the drop's callbacks ended it */
  }
  if (p->attempts >= p->retry_max && p->retry_at_us == 0) {
    char was[256];
    snprintf(was, sizeof was, "%s", p->lost_msg);
    nbd_give_up(e, "lost again after %u reconnection%s, before any reply: "
                "%s", p->attempts, p->attempts == 1 ? "" : "s", was);
    return;
  }
  struct nbd_connect_job *j = &p->jobs[0];
  if (j->started) {
    if (atomic_load_explicit(&j->done, memory_order_acquire))
      nbd_reconnect_done(e);
    return;
  }
  if (now < p->retry_at_us)
    return;
  p->attempts++;
  if (!ep_nbd_job_start(e, 0, p->sampled)) {
    nbd_give_up(e, "no thread to reconnect");
    return;
  }
}

/* The engine's watchdog: a silent server is a lost connection too. */
int
ep_nbd_lost_op(struct endpoint *e, const char *why)
{
  struct nbd_priv *p = e->priv;
  if (p->retry_max == 0 || p->gave_up)
    return -1;
  if (p->reconnecting)
    return 0;
  ep_nbd_lost(e, ETIMEDOUT, why);
  return 0;
}
