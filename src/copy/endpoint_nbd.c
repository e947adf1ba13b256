/* endpoint_nbd.c: an NBD export as a copy endpoint, over one or more
 * client connections driven by the event loop. READ replies land directly
 * in the op's buffer; WRITE payloads go out from it. Reconnecting
 * (--retry) and sending error replies again (--retry-errors) are in
 * endpoint_nbd_retry.c. */
#include "copy/endpoint_nbd_priv.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "net/loop.h"
#include "net/sock.h"
#include "net/tcpinfo.h"
#include "net/tls.h"
#include "proto/nbd.h"
#include "util/log.h"
#include "proto/nbd_uri.h"

static void
nbd_update_interest(struct nbd_slot *s)
{
  if (!s->registered)
    return;
  if (s->c.fatal) {
    loop_del(s->e->env->loop, s->c.fd);
    s->registered = false;
    return;
  }
  bool out = client_wants_write(&s->c);
  if (out != s->want_out) {
    loop_mod(s->e->env->loop, s->c.fd, EPOLLIN | (out ? EPOLLOUT : 0));
    s->want_out = out;
  }
}

static void
nbd_on_fd(struct loop *l, int fd, uint32_t events, void *arg)
{
  struct nbd_slot *s = arg;
  (void)l;
  (void)fd;
  client_on_events(&s->c, events);
  nbd_update_interest(s);
  struct ep_env *env = s->e->env;
  if (env->kick)
    env->kick(env->kick_arg);
}

/* The op's message: why the connection failed. */
static void
nbd_conn_msg(struct ep_op *op, const struct client_conn *c)
{
  snprintf(op->errmsg, sizeof op->errmsg, "%.120s", c->errmsg);
}

static void
nbd_copy_msg(struct ep_op *op, const struct client_req *r,
             const struct client_conn *c)
{
  if (r->errmsg[0])
    snprintf(op->errmsg, sizeof op->errmsg, "%s", r->errmsg);
  else if (c->fatal && c->errmsg[0])
    nbd_conn_msg(op, c);
}

static void
nbd_status_done(struct ep_op *op, struct nbd_priv *p)
{
  uint64_t left = op->req.length;
  size_t i = 0;
  for (; i < op->req.nextents && left > 0 && op->nextents < op->max_extents;
       i++) {
    uint64_t len = p->status[i].length < left ? p->status[i].length : left;
    /* HOLE without ZERO is undefined content: it must be read. */
    bool zero = p->status[i].flags & NBD_STATE_ZERO;
    op->extents[op->nextents++] = (struct endpoint_extent){ len, zero };
    left -= len;
  }
  bool cut = op->req.extents_dropped || (left > 0 && i < op->req.nextents);
  bool roomy = op->req.nextents <= NBD_STATUS_BATCH / 2 &&
               op->nextents <= op->max_extents / 2;
  p->status_span = client_status_span(p->status_span, cut, roomy,
                                      op->req.length - left,
                                      p->slots[0].c.info.min_block,
                                      ENDPOINT_STATUS_SPAN);
  if (op->err == 0 && op->nextents == 0) {
    op->err = EPROTO;
    snprintf(op->errmsg, sizeof op->errmsg, "empty block status reply");
  }
}

static void nbd_join_ready(struct endpoint *e);

static struct nbd_slot *
nbd_pick(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  struct nbd_slot *best = NULL;
  unsigned seen = 0;
  if (p->connecting)
    nbd_join_ready(e);
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (!s->live || s->c.fatal)
      continue;
    if (p->spread && seen++ == p->spread)
      break;
    if (best == NULL || s->c.inflight_bytes < best->c.inflight_bytes ||
        (s->c.inflight_bytes == best->c.inflight_bytes &&
         s->c.inflight < best->c.inflight))
      best = s;
  }
  return best;
}

/* A zeroing sent again (plain after FAST_ZERO, or its next piece) could
 * not go out: the connection is dying. Its error is that, not the text
 * of the refusal that made it go again. Returns the errno. */
static int
nbd_resend_failed(struct client_req *r, int neg_err)
{
  snprintf(r->errmsg, sizeof r->errmsg,
           "the rest of the zeroing could not be sent: %s",
           strerror(-neg_err));
  return -neg_err;
}

/* What nbd_zero_next did, when it did not fail (it returns -errno then). */
enum nbd_zero_step { NBD_ZERO_OVER = 0, NBD_ZERO_RESENT = 1 };

/* Zeroing longer than the maximum payload: the spec lets a server answer
 * EOVERFLOW or EINVAL (it may need a scratch buffer of that size), so
 * such a refusal is not a failure: the same range goes on in pieces of
 * the maximum payload, one after another, and later zeroing starts that
 * way. After a piece succeeds the next is sent. Returns NBD_ZERO_RESENT
 * when a request went out again for this op, NBD_ZERO_OVER when the op
 * is over, -errno when the next piece could not be sent. */
static int
nbd_zero_next(struct nbd_priv *p, struct nbd_slot *s, struct client_req *r,
              int err)
{
  struct ep_op *op = (struct ep_op *)((char *)r - offsetof(struct ep_op, req));
  uint64_t end = op->offset + op->length;
  uint64_t cap = client_max_payload(&s->c);
  if (s->c.info.min_block > 1)
    cap -= cap % s->c.info.min_block;
  if (err == EOVERFLOW || err == EINVAL) {
    if (r->length <= cap || cap == 0)
      return NBD_ZERO_OVER; /* refused for another reason */
    if (p->zero_cap == 0 || cap < p->zero_cap) {
      p->zero_cap = cap;
      log_info("%s: zeroing in pieces of %llu bytes (a longer one was "
               "refused: %s)", s->e->name, (unsigned long long)cap,
               strerror(err));
    }
  } else if (err != 0 || r->offset + r->length >= end) {
    return NBD_ZERO_OVER;
  } else {
    r->offset += r->length;
  }
  s->e->t_answer_us = loop_now_us(); /* the watchdog sees an answer */
  r->length = end - r->offset;
  if (p->zero_cap && r->length > p->zero_cap)
    r->length = p->zero_cap;
  int e2 = client_submit(&s->c, r);
  nbd_update_interest(s);
  return e2 == 0 ? NBD_ZERO_RESENT : e2;
}

static void
nbd_req_done(struct client_req *r, int err)
{
  struct ep_op *op = (struct ep_op *)((char *)r - offsetof(struct ep_op, req));
  struct nbd_slot *s = r->arg;
  struct nbd_priv *p = s->e->priv;
  if (ep_nbd_retryable(p, &s->c, err)) {
    ep_nbd_park(s->e, op);
    ep_nbd_lost(s->e, err, s->c.fatal ? s->c.errmsg : r->errmsg);
    return;
  }
  if (!s->c.fatal)
    p->attempts = 0; /* an answer: the server is back for good */
  if (op->type == EP_ZERO && (r->flags & NBD_CMD_FLAG_FAST_ZERO) &&
      (err == ENOTSUP || err == EOPNOTSUPP) && !s->c.fatal) {
    /* Fast zeroing refused: fall back to a plain WRITE_ZEROES. */
    p->no_fast_zero = true;
    r->flags &= (uint16_t)~NBD_CMD_FLAG_FAST_ZERO;
    int e2 = client_submit(&s->c, r);
    nbd_update_interest(s);
    if (e2 == 0)
      return;
    err = nbd_resend_failed(r, e2);
  }
  if (op->type == EP_ZERO && !s->c.fatal) {
    int z = nbd_zero_next(p, s, r, err);
    if (z == NBD_ZERO_RESENT)
      return;
    if (z < 0)
      err = nbd_resend_failed(r, z);
  }
  if (err && ep_nbd_error_retryable(p, s, op, err)) {
    ep_nbd_hold_error(s->e, op, err, r->errmsg);
    return;
  }
  op->err = err;
  if (err && !s->c.fatal)
    s->e->peer_error = true; /* an error reply, not a lost connection */
  nbd_copy_msg(op, r, &s->c);
  if (err && op->err_tries) {
    size_t n = strlen(op->errmsg);
    snprintf(op->errmsg + n, sizeof op->errmsg - n,
             "%ssent %u times (--retry-errors)", n ? "; " : "",
             op->err_tries + 1);
  }
  if (op->type == EP_EXTENTS)
    nbd_status_done(op, p);
  op->done(op);
}

static void
nbd_flush_done(struct client_req *r, int err)
{
  struct nbd_slot *s = r->arg;
  struct nbd_priv *p = s->e->priv;
  if (ep_nbd_retryable(p, &s->c, err)) {
    p->flush_lost = true; /* flushed again once reconnected */
    ep_nbd_lost(s->e, err, s->c.fatal ? s->c.errmsg : r->errmsg);
  } else if (err && !p->flush_err) {
    p->flush_err = err;
    nbd_copy_msg(p->flush_op, r, &s->c);
  }
  if (--p->flush_pending == 0) {
    struct ep_op *op = p->flush_op;
    if (p->flush_lost && !p->flush_err && p->reconnecting) {
      p->flush_parked = true; /* p->flush_op stays: it is still busy */
      return;
    }
    p->flush_op = NULL;
    op->err = p->flush_err ? p->flush_err : p->flush_lost ? p->lost_err : 0;
    if (op->err && !p->flush_err)
      snprintf(op->errmsg, sizeof op->errmsg, "%s", p->lost_msg);
    op->done(op);
  }
}

/* FLUSH goes to every live connection: without multi-conn a flush covers
 * only its own connection's writes. */
int
ep_nbd_submit_flush(struct endpoint *e, struct ep_op *op)
{
  struct nbd_priv *p = e->priv;
  if (p->flush_op)
    return -EBUSY;
  p->flush_op = op;
  p->flush_err = 0;
  p->flush_lost = false;
  if (p->reconnecting) {
    p->flush_parked = true; /* sent once the server is back */
    return 0;
  }
  p->flush_pending = 1; /* held while submitting */
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    struct client_req *r = &p->flush_reqs[i];
    *r = (struct client_req){ .type = NBD_CMD_FLUSH, .done = nbd_flush_done,
                              .arg = s };
    if (!s->live)
      continue; /* still connecting: it carried no writes */
    if (s->c.fatal) {
      if (ep_nbd_retryable(p, &s->c, s->c.fatal)) {
        p->flush_lost = true;
        ep_nbd_lost(e, s->c.fatal, s->c.errmsg);
      } else if (!p->flush_err) {
        p->flush_err = s->c.fatal; /* with the connection's reason */
        nbd_conn_msg(op, &s->c);
      }
      continue;
    }
    p->flush_pending++;
    int err = client_submit(&s->c, r);
    nbd_update_interest(s);
    if (err < 0) {
      p->flush_pending--;
      if (!p->flush_err) {
        p->flush_err = -err;
        nbd_conn_msg(op, &s->c);
      }
    }
  }
  struct client_req last = { .arg = &p->slots[0] };
  nbd_flush_done(&last, 0); /* drops the hold; may complete the op */
  return 0;
}

/* Every connection is dead: the op is accepted and fails through its
 * callback, carrying the connection's reason ("reply to a request not in
 * flight", "server closed the connection"). Refused at once, it would
 * name only an errno, and the caller would report it ahead of the
 * failures already waiting to be called back, among them the one that
 * killed the connection. */
static int
nbd_fail_dead(struct endpoint *e, struct ep_op *op, const struct client_conn *c)
{
  struct nbd_priv *p = e->priv;
  if (ep_nbd_retryable(p, c, c->fatal)) {
    ep_nbd_park(e, op);
    ep_nbd_lost(e, c->fatal, c->errmsg);
    return 0;
  }
  if (p->gave_up) {
    op->err = p->lost_err;
    snprintf(op->errmsg, sizeof op->errmsg, "%s", p->lost_msg);
  } else {
    op->err = c->fatal ? c->fatal : EIO;
    nbd_conn_msg(op, c);
  }
  ep_env_complete(e->env, op);
  return 0;
}

int
ep_nbd_submit(struct endpoint *e, struct ep_op *op)
{
  struct nbd_priv *p = e->priv;
  if (op->type == EP_FLUSH)
    return ep_nbd_submit_flush(e, op);
  if (p->reconnecting) {
    op->req = (struct client_req){ 0 };
    ep_nbd_park(e, op); /* goes out once the server is back */
    return 0;
  }
  struct nbd_slot *s = nbd_pick(e);
  if (s == NULL)
    return nbd_fail_dead(e, op, &p->slots[0].c);
  struct client_req *r = &op->req;
  *r = (struct client_req){ .offset = op->offset, .length = op->length,
                            .buf = op->buf, .done = nbd_req_done, .arg = s };
  switch (op->type) {
  case EP_READ:
    r->type = NBD_CMD_READ;
    break;
  case EP_WRITE:
    r->type = NBD_CMD_WRITE;
    r->from_file = op->from_file;
    r->file_fd = op->file_fd;
    r->file_off = op->file_off;
    break;
  case EP_ZERO:
    r->type = NBD_CMD_WRITE_ZEROES;
    if (p->zero_cap && r->length > p->zero_cap)
      r->length = p->zero_cap; /* nbd_zero_next sends the rest */
    if ((s->c.info.tflags & NBD_FLAG_SEND_FAST_ZERO) && !p->no_fast_zero)
      r->flags = NBD_CMD_FLAG_FAST_ZERO;
    break;
  case EP_EXTENTS:
    if (!s->c.info.allocation) {
      op->extents[0] = (struct endpoint_extent){ op->length, false };
      op->nextents = 1;
      ep_env_complete(e->env, op);
      return 0;
    }
    r->type = NBD_CMD_BLOCK_STATUS;
    if (p->status_span == 0)
      p->status_span = ENDPOINT_STATUS_SPAN;
    if (r->length > p->status_span)
      r->length = p->status_span; /* the rest is asked for next */
    r->extents = p->status;
    r->max_extents = NBD_STATUS_BATCH;
    break;
  default:
    return -EINVAL;
  }
  int err = client_submit(&s->c, r);
  if (err < 0) /* refused before it went out: say why, if the client did */
    snprintf(op->errmsg, sizeof op->errmsg, "%s", r->errmsg);
  nbd_update_interest(s);
  return err;
}

static void
nbd_close(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  ep_nbd_join_all(e); /* a short copy can end before every handshake did */
  for (unsigned i = 0; p->slots && i < p->n; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (s->registered)
      loop_del(e->env->loop, s->c.fd);
    client_close(&s->c);
  }
  free(p->jobs);
  free(p->slots);
  free(p->flush_reqs);
  tls_creds_free(p->tls); /* after every session that used them */
  ep_http_free(p->http);
  uri_free(&p->uri);
  free(p);
}

/* Returns the smallest min_rtt the kernel measured on any TCP
 * connection, from the samples nbd_sample_tcp takes; 0 when none (Unix
 * sockets). */
static uint32_t
nbd_sample_rtt(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  uint32_t best = 0;
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (!s->tcp || s->ti.samples == 0)
      continue;
    if (s->ti.min_rtt_us && (best == 0 || s->ti.min_rtt_us < best))
      best = s->ti.min_rtt_us;
  }
  return best;
}

/* One TCP_INFO sample of every live TCP connection; the stall share of
 * all samples so far. */
static double
nbd_sample_tcp(struct endpoint *e, uint64_t *samples)
{
  struct nbd_priv *p = e->priv;
  uint64_t n = 0, stalled = 0;
  bool any = false;
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (!s->tcp)
      continue;
    any = true;
    if (!s->c.fatal)
      tcpinfo_sample(&s->ti, s->c.fd);
    n += s->ti.samples;
    stalled += s->ti.stall_samples;
  }
  *samples = n;
  if (!any)
    return -1;
  return n ? 100.0 * (double)stalled / (double)n : 0;
}

static int
nbd_tcp_json(struct endpoint *e, char *buf, size_t len)
{
  struct nbd_priv *p = e->priv;
  struct nbd_slot *s = &p->slots[0];
  if (!s->tcp)
    return -1;
  if (!s->c.fatal)
    tcpinfo_sample(&s->ti, s->c.fd);
  if (s->ti.samples == 0)
    return -1;
  return tcpinfo_format_json(&s->ti, buf, len) < 0 ? -1 : 0;
}

static int
nbd_tcp_json_each(struct endpoint *e, char *buf, size_t len)
{
  struct nbd_priv *p = e->priv;
  char one[1024];
  size_t used = 0;
  unsigned n = 0;
  if (len < 3)
    return -1;
  buf[used++] = '[';
  for (unsigned i = 0; i < p->started; i++) {
    struct nbd_slot *s = &p->slots[i];
    if (!s->tcp)
      continue;
    if (!s->c.fatal)
      tcpinfo_sample(&s->ti, s->c.fd);
    if (s->ti.samples == 0 ||
        tcpinfo_format_json(&s->ti, one, sizeof one) < 0)
      continue;
    size_t k = strlen(one);
    if (used + (n ? 2 : 0) + k + 2 > len)
      break;
    if (n++) {
      buf[used++] = ',';
      buf[used++] = ' ';
    }
    memcpy(buf + used, one, k);
    used += k;
  }
  buf[used++] = ']';
  buf[used] = '\0';
  return n ? 0 : -1;
}

static bool
nbd_tls_same(const struct tls_params *a, const struct tls_params *b)
{
  return strcmp(a->version, b->version) == 0 &&
         strcmp(a->cipher, b->cipher) == 0 && strcmp(a->auth, b->auth) == 0;
}

/* The first connection's TLS; every connection that joined is compared
 * with it. A server ought to negotiate the same each time, but nothing
 * makes it. */
static int
nbd_tls(struct endpoint *e, struct tls_params *out, bool *uniform)
{
  struct nbd_priv *p = e->priv;
  if (!p->slots[0].has_tls)
    return -1;
  *out = p->slots[0].tls;
  *uniform = true;
  for (unsigned i = 1; i < p->started; i++)
    if (p->slots[i].has_tls && !nbd_tls_same(out, &p->slots[i].tls))
      *uniform = false;
  return 0;
}

/* Starts connections until each carries at most conn_bytes of the
 * window: past that, the window waits in our queues instead of on the
 * wire. Only with the automatic count over TCP (conn_bytes set). */
static void
nbd_fit_window(struct endpoint *e, uint64_t bytes)
{
  struct nbd_priv *p = e->priv;
  if (p->conn_bytes == 0 || p->started >= p->n || p->closing)
    return;
  uint64_t want = (bytes + p->conn_bytes - 1) / p->conn_bytes;
  if (want <= p->started)
    return;
  unsigned upto = want < p->n ? (unsigned)want : p->n;
  log_debug("%s: window of %llu KiB, %llu KiB per connection: "
            "%u connections", e->name, (unsigned long long)(bytes >> 10),
            (unsigned long long)(p->conn_bytes >> 10), upto);
  ep_nbd_start_jobs(e, upto);
}

static bool
nbd_spread(struct endpoint *e, unsigned n)
{
  struct nbd_priv *p = e->priv;
  if (!p->auto_conns || p->n < 2)
    return false;
  p->spread = n;
  return true;
}

static const struct endpoint_ops nbd_ops = {
  .kind = "nbd",
  .submit = ep_nbd_submit,
  .close = nbd_close,
  .sample_rtt = nbd_sample_rtt,
  .tcp_json = nbd_tcp_json,
  .tcp_json_each = nbd_tcp_json_each,
  .tls = nbd_tls,
  .sample_tcp = nbd_sample_tcp,
  .fit_window = nbd_fit_window,
  .spread = nbd_spread,
  .tick = ep_nbd_tick,
  .lost = ep_nbd_lost_op,
};

/* Sleeps us in steps of 50 ms on a connect job's thread (or the opening
 * one, j NULL); false, at once, when the job is cancelled. */
bool
ep_nbd_job_sleep(struct nbd_connect_job *j, uint64_t us)
{
  while (us > 0) {
    if (j) {
      pthread_mutex_lock(&j->lock);
      bool cancel = j->cancel;
      pthread_mutex_unlock(&j->lock);
      if (cancel)
        return false;
    }
    uint64_t step = us < 50000 ? us : 50000;
    struct timespec ts = { 0, (long)step * 1000 };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
      ;
    us -= step;
  }
  return true;
}

static void
nbd_job_socket(void *arg, int fd)
{
  struct nbd_connect_job *j = arg;
  pthread_mutex_lock(&j->lock);
  j->fd = fd;
  if (j->cancel && fd >= 0)
    shutdown(fd, SHUT_RDWR); /* the next address of a name, say */
  pthread_mutex_unlock(&j->lock);
}

static void *
nbd_connect_thread(void *arg)
{
  struct nbd_connect_job *j = arg;
  j->r = client_connect(&j->s->c, &j->p->uri, &j->co);
  if (j->r == 0 && j->sample)
    j->r = ep_nbd_read_sample(j->p, j, &j->s->c, &j->digest);
  atomic_store_explicit(&j->done, true, memory_order_release);
  if (j->sample) /* a reconnection: the loop may be waiting in epoll */
    loop_wake(j->s->e->env->loop);
  return NULL;
}

/* Loop thread: puts a connected slot into the loop. */
int
ep_nbd_register(struct endpoint *e, struct nbd_slot *s)
{
  int r = loop_add(e->env->loop, s->c.fd, EPOLLIN, nbd_on_fd, s);
  if (r < 0)
    return r;
  s->registered = true;
  s->live = true;
  s->tcp = sock_is_tcp(s->c.fd);
  s->has_tls = tls_params_get(&s->c.tp, &s->tls) == 0;
  tcpinfo_init(&s->ti);
  if (s->tcp)
    tcpinfo_sample(&s->ti, s->c.fd); /* baseline for the counters */
  return 0;
}

/* Loop thread: joins connect job i, whose thread has finished. */
static void
nbd_join_one(struct endpoint *e, unsigned i)
{
  struct nbd_priv *p = e->priv;
  struct nbd_connect_job *j = &p->jobs[i];
  struct nbd_slot *s = &p->slots[i];
  const struct client_info *a = &p->slots[0].c.info, *b = &s->c.info;
  pthread_join(j->thread, NULL);
  pthread_mutex_destroy(&j->lock);
  int r = j->r; /* the thread's, now that it has ended */
  j->started = false;
  p->connecting--;
  if (r == 0 && (b->size != a->size || b->tflags != a->tflags ||
                 b->min_block != a->min_block ||
                 b->max_block != a->max_block ||
                 b->structured != a->structured)) {
    snprintf(s->c.errmsg, sizeof s->c.errmsg, "the server describes the "
             "export differently than to the first connection");
    r = -EPROTO;
  }
  if (r == 0 && (r = ep_nbd_register(e, s)) < 0)
    snprintf(s->c.errmsg, sizeof s->c.errmsg, "event loop: %s",
             strerror(-r));
  if (r == 0) {
    e->connections++;
    return;
  }
  if (i >= ENDPOINT_AUTO_CONNECTIONS && p->conn_bytes) {
    /* One added for the window: a server that caps its connections
     * (qemu-nbd -e N still advertises multi-conn) leaves it hanging or
     * refuses it. Not news; just add no more. */
    p->conn_bytes = 0;
    if (!p->closing)
      log_debug("%s: connection %u failed (%s); adding no more",
                e->name, i + 1, s->c.errmsg);
  } else if (!p->closing) {
    log_warn("%s: connection %u of %u failed, going on without it: %s",
             e->name, i + 1, p->started, s->c.errmsg);
  }
  client_close(&s->c);
}

static void
nbd_join_ready(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  for (unsigned i = 1; i < p->started; i++)
    if (p->jobs[i].started &&
        atomic_load_explicit(&p->jobs[i].done, memory_order_acquire))
      nbd_join_one(e, i);
}

/* At close: abandons the connects and handshakes still running (their
 * sockets are shut down, and a connect looks for that every 10 ms, a
 * wait between reads of a sample every 50 ms) and joins every thread. */
void
ep_nbd_join_all(struct endpoint *e)
{
  struct nbd_priv *p = e->priv;
  p->closing = true;
  for (unsigned i = 0; p->jobs && i < p->n; i++) {
    struct nbd_connect_job *j = &p->jobs[i];
    if (!j->started)
      continue;
    pthread_mutex_lock(&j->lock);
    j->cancel = true;
    if (j->fd >= 0)
      shutdown(j->fd, SHUT_RDWR);
    pthread_mutex_unlock(&j->lock);
    if (i > 0) {
      nbd_join_one(e, i);
      continue;
    }
    pthread_join(j->thread, NULL); /* a reconnection: close frees slot 0 */
    pthread_mutex_destroy(&j->lock);
    j->started = false;
  }
}

/* Loop thread: starts a thread that connects slot i (and, with sample,
 * reads the source's sample). False when no thread could be made. */
bool
ep_nbd_job_start(struct endpoint *e, unsigned i, bool sample)
{
  struct nbd_priv *p = e->priv;
  struct nbd_connect_job *j = &p->jobs[i];
  j->s = &p->slots[i];
  j->p = p;
  j->co = p->co;
  j->co.on_socket = nbd_job_socket;
  j->co.on_socket_arg = j;
  j->fd = -1;
  j->cancel = false;
  j->sample = sample;
  j->digest = 0;
  atomic_init(&j->done, false);
  p->slots[i].e = e;
  if (pthread_mutex_init(&j->lock, NULL) == 0) {
    j->started = pthread_create(&j->thread, NULL, nbd_connect_thread,
                                j) == 0;
    if (!j->started)
      pthread_mutex_destroy(&j->lock);
  }
  return j->started;
}

/* Loop thread: starts the connect jobs of slots started .. upto-1. */
void
ep_nbd_start_jobs(struct endpoint *e, unsigned upto)
{
  struct nbd_priv *p = e->priv;
  if (upto > p->n)
    upto = p->n;
  for (unsigned i = p->started; i < upto; i++) {
    if (ep_nbd_job_start(e, i, false)) {
      p->connecting++;
    } else {
      log_warn("%s: no thread for connection %u of %u, going on without it",
               e->name, i + 1, upto);
    }
  }
  if (upto > p->started)
    p->started = upto;
}

/* What one TCP connection can keep in flight: the sender's send buffer
 * holds every unacknowledged byte (ours for writes; for reads the
 * server's, assumed to be set as ours), and a receiver advertises at most
 * about half its receive buffer. 0 when the limits are unknown. */
static uint64_t
nbd_conn_bytes(void)
{
  uint64_t snd, rcv;
  if (sock_tcp_autotune_max(&snd, &rcv) < 0)
    return 0;
  return snd < rcv / 2 ? snd : rcv / 2;
}

/* Connects slot 0 (it tells whether the server allows several
 * connections, which sets the automatic count), then starts the others.
 * With the automatic count over TCP, room is made for
 * ENDPOINT_MAX_CONNECTIONS, of which ENDPOINT_AUTO_CONNECTIONS start now
 * and nbd_fit_window may start the rest. */
static int
nbd_connect_all(struct endpoint *e, const struct endpoint_opts *o, char *err,
                size_t errlen)
{
  struct nbd_priv *p = e->priv;
  p->co = (struct client_opts){ .export_name = p->uri.export_name,
                                /* only READ replies and block status
                                 * need them; a destination saves their
                                 * round trips */
                                .want_extended = !o->write,
                                .want_structured = !o->write,
                                .want_allocation = !o->write,
                                .timeout_ms = client_handshake_ms(o->timeout_s),
                                .nagle = o->nagle,
                                .split_writes = o->split_writes };
  char why[256];
  int r = client_tls_load(&p->uri, &p->tls, why, sizeof why);
  if (r < 0) {
    snprintf(err, errlen, "%s: %s", e->name, why);
    return r;
  }
  p->co.tls_creds = p->tls;
  if (p->http) { /* every connection starts with its own PUT */
    p->co.http = &p->http->h;
    p->co.tls_creds = p->http->creds;
  }
  p->slots[0].e = e;
  r = client_connect(&p->slots[0].c, &p->uri, &p->co);
  if (r < 0) {
    snprintf(err, errlen, "%s: %s", e->name, p->slots[0].c.errmsg);
    return r;
  }
  if (o->write && (p->slots[0].c.info.tflags & NBD_FLAG_READ_ONLY)) {
    snprintf(err, errlen, "%s: the export is read-only", e->name);
    return -EROFS; /* before any other connection is started */
  }
  p->info0 = p->slots[0].c.info; /* scalars: the strings stay the conn's */
  p->info0.name = p->info0.description = NULL;
  p->info0.exports = NULL;
  p->info0.nexports = 0;
  if (p->retry_max && !o->write) {
    r = ep_nbd_read_sample(p, NULL, &p->slots[0].c, &p->sample_digest);
    if (r < 0) {
      snprintf(err, errlen, "%s: %s", e->name, p->slots[0].c.errmsg);
      return r;
    }
    p->sampled = true;
  }
  unsigned first = p->n;
  if (o->connections == 0 &&
      (p->slots[0].c.info.tflags & NBD_FLAG_CAN_MULTI_CONN)) {
    /* Grow to the automatic count now that multi-conn is known. */
    bool tcp = sock_is_tcp(p->slots[0].c.fd);
    unsigned room = tcp ? ENDPOINT_MAX_CONNECTIONS
                        : ENDPOINT_AUTO_CONNECTIONS;
    struct nbd_slot *ns = realloc(p->slots, room * sizeof *ns);
    if (ns == NULL) {
      snprintf(err, errlen, "%s: out of memory", e->name);
      return -ENOMEM;
    }
    p->slots = ns;
    memset(ns + 1, 0, (room - 1) * sizeof *ns);
    for (unsigned k = 1; k < room; k++)
      ns[k].c.fd = -1;
    p->n = room;
    first = ENDPOINT_AUTO_CONNECTIONS;
    if (tcp)
      p->conn_bytes = nbd_conn_bytes();
  }
  /* The slots never move again: threads and the loop hold pointers. */
  if ((r = ep_nbd_register(e, &p->slots[0])) < 0) {
    snprintf(err, errlen, "%s: event loop: %s", e->name, strerror(-r));
    return r;
  }
  p->jobs = calloc(p->n, sizeof *p->jobs);
  if (p->jobs == NULL) {
    snprintf(err, errlen, "%s: out of memory", e->name);
    return -ENOMEM;
  }
  p->started = 1;
  p->first_conns = first;
  p->auto_conns = o->connections == 0;
  ep_nbd_start_jobs(e, first);
  return 0;
}

int
endpoint_open_nbd(struct ep_env *env, const char *spec,
                  const struct endpoint_opts *o, struct endpoint **out,
                  char *err, size_t errlen)
{
  struct nbd_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, spec, &nbd_ops, p) : NULL;
  if (e == NULL) {
    free(p);
    ep_http_free(o->http);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  int r = o->http ? nbd_uri_from_http(o->http, o->nbd_export, &p->uri, err,
                                      errlen)
                  : uri_parse(spec, &p->uri, err, errlen);
  p->http = o->http;
  if (r < 0) {
    ep_http_free(p->http);
    free(p);
    free(e);
    return r;
  }
  p->n = o->connections ? o->connections : 1;
  p->retry_max = o->retry;
  p->retry_delay_ms = o->retry_delay_ms;
  p->retry_errors = o->retry_errors && o->retry > 0;
  e->retries = o->retry > 0;
  p->slots = calloc(p->n, sizeof *p->slots);
  if (p->slots == NULL) {
    r = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  for (unsigned i = 0; i < p->n; i++)
    p->slots[i].c.fd = -1;
  r = nbd_connect_all(e, o, err, errlen);
  if (r == CLIENT_HTTP_BODY)
    p->http = NULL; /* the caller's again, with the connection */
  if (r < 0)
    goto fail;
  p->flush_reqs = calloc(p->n, sizeof *p->flush_reqs);
  if (p->flush_reqs == NULL) {
    r = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", spec);
    goto fail;
  }
  const struct client_info *in = &p->slots[0].c.info;
  if (p->n > 1 && !(in->tflags & NBD_FLAG_CAN_MULTI_CONN))
    log_warn("%s: server does not advertise multi-conn; using %u "
             "connections anyway, flushing each", spec, p->started);
  if (!(in->tflags_sent & NBD_FLAG_HAS_FLAGS))
    log_warn("%s: the server's transmission flags 0x%04x lack "
             "NBD_FLAG_HAS_FLAGS, which the spec requires: ignored (no "
             "flush, no zeroing requests, no multi-conn)", spec,
             in->tflags_sent);
  e->size = in->size;
  e->size_known = true;
  e->readable = true;
  e->writable = !(in->tflags & NBD_FLAG_READ_ONLY);
  e->has_extents = in->allocation;
  e->can_zero = in->tflags & NBD_FLAG_SEND_WRITE_ZEROES;
  e->can_flush = in->tflags & NBD_FLAG_SEND_FLUSH;
  /* Requests "SHOULD use integer multiples of any advertised preferred
   * block size where possible": pieces are aligned to it, up to a cap
   * that keeps holes worth finding. */
  e->align = in->pref_block < ENDPOINT_ALIGN_CAP ? in->pref_block
                                                 : ENDPOINT_ALIGN_CAP;
  if (e->align < in->min_block)
    e->align = in->min_block;
  e->min_block = in->min_block;
  e->max_request = in->max_block < (32u << 20) ? in->max_block : 32u << 20;
  e->opening_request = ENDPOINT_OPENING_REQUEST;
  e->connections = 1; /* nbd_join_one counts the later ones */
  e->multi_conn = in->tflags & NBD_FLAG_CAN_MULTI_CONN;
  /* every connection has the same transport and options as the first */
  e->can_send_file = client_can_send_file(&p->slots[0].c);
  e->loopback = sock_is_tcp_loopback(p->slots[0].c.fd);
  *out = e;
  return 0;
fail:
  nbd_close(e);
  free(e);
  return r;
}
