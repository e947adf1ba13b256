/* conn.c: an NBD connection on its loop: its lifecycle (reference
 * counting, closing, resuming), the reading state machine that feeds
 * handshake.c and transmission.c from inbuf, the request's payload
 * buffer or its pipes, and the taking up of a socket that listen.c has
 * handed to the loop. See server.h for the threading rules. */
#include "server.h"
#include "server_priv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/sock.h"
#include "net/tls.h"
#include "util/log.h"

void
conn_log(struct conn *c, const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  enum log_take t = log_take(&c->nlogged, CONN_LOG_CAP);
  if (t == LOG_TAKE_LAST)
    log_warn("%s: further problems on this connection are not logged",
             c->peer);
  if (t != LOG_TAKE_LINE)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log_warn("%s: %s", c->peer, msg);
}

/* ---- reference counting and closing ---- */

void
req_destroy(struct req *q)
{
  req_close_pipes(q);
  free(q->buf);
  free(q->ext);
  free(q);
}

static void
conn_free(struct conn *c)
{
  struct req *q, *next;
  for (q = c->free_reqs; q; q = next) {
    next = q->next;
    req_destroy(q);
  }
  if (c->cur)
    req_destroy(c->cur);
  if (c->t.ops)
    c->t.ops->free(&c->t);
  close(c->fd);
  free(c->opt_buf);
  free(c->hs_out);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void
conn_put(struct conn *c)
{
  pthread_mutex_lock(&c->lock);
  int refs = --c->refs;
  pthread_mutex_unlock(&c->lock);
  if (refs == 0)
    conn_free(c);
}

void
conn_update_events(struct conn *c)
{
  if (c->dead)
    return;
  uint32_t ev = 0;
  bool reading = !c->paused && c->state != CS_CLOSING &&
                 c->state != CS_REQ_PART && c->hs_out_len == 0;
  /* A TLS handshake waiting to write needs no read events (level
   * triggered, they would spin the loop). */
  if (c->state == CS_TLS_HANDSHAKE && c->want_out)
    reading = false;
  if (reading)
    ev |= EPOLLIN;
  if (c->want_out)
    ev |= EPOLLOUT;
  loop_mod(c->loop, c->fd, ev);
}

/* A socket counted to sl (nconns, sl->nowned) is gone. */
static void
sloop_uncount(struct sloop *sl)
{
  pthread_mutex_lock(&sl->srv->lock);
  sl->srv->nconns--;
  sl->nowned--;
  pthread_mutex_unlock(&sl->srv->lock);
}

/* --stats: a connection's summary as it closes: its TCP figures, and
 * what its TLS session negotiated. Loop thread. */
static void
conn_log_stats(struct conn *c)
{
  char line[512];
  if (c->is_tcp) {
    tcpinfo_sample(&c->tcp, c->fd);
    tcpinfo_format_line(&c->tcp, line, sizeof line);
    log_info("%s: tcp: %s", c->peer, line);
  }
  if (c->tls) {
    char esc[LOG_ESCAPE_BUF];
    tls_describe(&c->t, line, sizeof line); /* holds the client's username */
    log_info("%s: tls: %s", c->peer, log_escape(esc, line, strlen(line)));
  }
}

void
conn_close(struct conn *c, const char *why)
{
  struct server *s = c->srv;
  if (why)
    log_warn("%s: %s; closing the connection", c->peer, why);
  if (s->cfg.stats && !c->dead)
    conn_log_stats(c);
  pthread_mutex_lock(&c->lock);
  if (c->dead) {
    pthread_mutex_unlock(&c->lock);
    return;
  }
  c->dead = true;
  /* Replies that never left die with the connection. */
  struct req *q = c->sendq;
  c->sendq = c->sendq_tail = NULL;
  pthread_mutex_unlock(&c->lock);
  while (q) {
    struct req *next = q->next;
    req_destroy(q);
    q = next;
    conn_put(c); /* the request's reference */
  }
  loop_del(c->loop, c->fd);
  if (c->t.ops && !why)
    c->t.ops->shutdown(&c->t);
  shutdown(c->fd, SHUT_RDWR);
  if (c->prev)
    c->prev->next = c->next;
  else
    c->sl->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  sloop_uncount(c->sl);
  conn_put(c);
}

void
conn_resume(struct conn *c)
{
  struct server *s = c->srv;
  bool wake = false;
  pthread_mutex_lock(&s->lock);
  if (!c->in_resume) {
    c->in_resume = true;
    pthread_mutex_lock(&c->lock);
    c->refs++;
    pthread_mutex_unlock(&c->lock);
    c->resume_next = c->sl->resume;
    c->sl->resume = c;
    wake = true;
  }
  pthread_mutex_unlock(&s->lock);
  if (wake)
    loop_wake(c->loop);
}

/* ---- reading ---- */

void
conn_expect(struct conn *c, enum conn_state st, void *dst, size_t need)
{
  c->state = st;
  c->dst = dst;
  c->need = need;
  c->have = 0;
}

static void
conn_expect_discard(struct conn *c, enum conn_state st)
{
  size_t n = c->discard_left < sizeof c->discard_buf ? (size_t)c->discard_left
                                                      : sizeof c->discard_buf;
  conn_expect(c, st, c->discard_buf, n);
}

/* A complete target buffer: move the state machine on. */
static int
conn_step(struct conn *c)
{
  switch (c->state) {
  case CS_CLIENT_FLAGS:
    return handshake_flags(c);
  case CS_OPT_HDR:
    if (wire_decode_opt(c->msg, &c->opt) < 0) {
      log_warn("%s: bad option magic 0x%016llx", c->peer,
               (unsigned long long)wire_get64(c->msg));
      return -1;
    }
    if (c->opt.length == 0)
      return handshake_option(c);
    if (c->opt.length > SERVER_MAX_OPTION_DROP)
      return handshake_option_oversized(c);
    if (c->opt.length > SERVER_MAX_OPTION) {
      /* Never buffer a length a client made up: drop it as it comes
       * and answer with an error once it is gone. */
      c->discard_left = c->opt.length;
      conn_expect_discard(c, CS_OPT_DISCARD);
      return 0;
    }
    free(c->opt_buf);
    c->opt_buf = malloc(c->opt.length);
    if (c->opt_buf == NULL)
      return -1;
    conn_expect(c, CS_OPT_DATA, c->opt_buf, c->opt.length);
    return 0;
  case CS_OPT_DATA:
    return handshake_option(c);
  case CS_OPT_DISCARD:
  case CS_REQ_DISCARD:
    c->discard_left -= c->need;
    if (c->discard_left > 0) {
      conn_expect_discard(c, c->state);
      return 0;
    }
    return c->state == CS_OPT_DISCARD ? handshake_option(c)
                                      : transmission_payload(c);
  case CS_REQ_HDR:
    return transmission_header(c);
  case CS_REQ_PAYLOAD:
  case CS_REQ_SPLICE:
    return transmission_payload(c);
  case CS_CLOSING:
  case CS_TLS_HANDSHAKE: /* never reads through conn_step */
  case CS_REQ_PART:
    return 0;
  }
  return -1;
}

/* What moving a WRITE payload into pipes came to (conn_read_splice). */
enum splice_result {
  SPLICE_FAILED = -1, /* logged: close the connection */
  SPLICE_WAIT = 0,    /* the socket is empty: wait for EPOLLIN */
  SPLICE_DONE = 1,    /* the whole payload is in the pipes */
  SPLICE_COPIED = 2,  /* fell back to the buffer: go on reading into it */
  SPLICE_TURN = 3,    /* the turn's limit is reached: yield */
};

/* The pipe filled up before the payload was in (its slots hold partial
 * pages): take this payload back into the request's buffer and read the
 * rest of it the ordinary way. Returns SPLICE_COPIED or SPLICE_FAILED. */
static enum splice_result
conn_splice_fallback(struct conn *c)
{
  struct req *q = c->cur;
  if (req_reserve(q, c->need) < 0) {
    log_warn("%s: out of memory for a %zu-byte payload", c->peer, c->need);
    return SPLICE_FAILED;
  }
  size_t got = 0;
  for (unsigned i = 0; i <= q->pipe_cur; i++) {
    size_t end = got + q->pipe_len[i];
    while (got < end) {
      ssize_t n = read(q->pipe[i][0], q->buf + got, end - got);
      if (n <= 0) {
        log_warn("%s: cannot drain a payload pipe: %s", c->peer,
                 n < 0 ? strerror(errno) : "short read");
        return SPLICE_FAILED;
      }
      got += (size_t)n;
    }
    q->pipe_len[i] = 0;
  }
  q->spliced = false;
  q->part_len = c->need; /* run_write writes part_len bytes from buf */
  log_debug("%s: payload pipe full after %zu of %zu bytes; copying the rest",
            c->peer, c->have, c->need);
  size_t have = c->have;
  conn_expect(c, CS_REQ_PAYLOAD, q->buf, c->need);
  c->have = have;
  return SPLICE_COPIED;
}

/* The socket is empty. A client with Nagle on (the stock sparse_dd
 * shape: header and payload in two writes) holds its next small segment
 * until what it sent is acknowledged, and a delayed ACK makes it wait
 * ~40 ms per request. So what arrived since the last forced ACK is
 * acknowledged now (TCP_QUICKACK sends a pending ACK at once). Once per
 * emptied socket, not after every read: a pipelined client gains
 * nothing from an ACK per read, and each costs its sender CPU. */
static void
conn_drained(struct conn *c)
{
  if (c->is_tcp && c->unacked) {
    sock_set_quickack(c->fd);
    c->unacked = false;
  }
}

/* Moves a WRITE payload from the socket into its request's pipes, the
 * next one when one is full, at most about limit bytes of it this call.
 * Returns what it came to (enum splice_result). */
static enum splice_result
conn_read_splice(struct conn *c, size_t limit)
{
  struct req *q = c->cur;
  if (c->in_off < c->in_len) { /* bytes that came with the header */
    size_t n = c->in_len - c->in_off;
    if (n > c->need - c->have)
      n = c->need - c->have;
    ssize_t w = write(q->pipe[q->pipe_cur][1], c->inbuf + c->in_off, n);
    if (w < 0 && errno != EAGAIN) {
      log_warn("%s: cannot fill a payload pipe: %s", c->peer,
               strerror(errno));
      return SPLICE_FAILED;
    }
    if (w > 0) {
      c->in_off += (size_t)w;
      c->have += (size_t)w;
      q->pipe_len[q->pipe_cur] += (size_t)w;
    }
    if (w < (ssize_t)n) /* the rest must come first: copy it all */
      return conn_splice_fallback(c);
  }
  size_t moved = 0;
  while (c->have < c->need) {
    if (moved >= limit)
      return SPLICE_TURN;
    size_t want = c->need - c->have;
    ssize_t n = sock_splice_to_pipe(c->fd, q->pipe[q->pipe_cur][1],
                                    want < limit - moved ? want
                                                         : limit - moved);
    if (n == -EAGAIN && sock_readable_bytes(c->fd) > 0) {
      /* The pipe is full, not the socket: on to the next one. */
      if (q->pipe_cur + 1 >= q->npipes && req_add_pipe(q) < 0)
        return conn_splice_fallback(c);
      q->pipe_cur++;
      continue;
    }
    if (n == -EAGAIN) {
      conn_drained(c);
      return SPLICE_WAIT;
    }
    if (n <= 0) {
      log_warn("%s: %s in the middle of a WRITE payload", c->peer,
               n == 0 ? "client disconnected" : strerror((int)-n));
      return SPLICE_FAILED;
    }
    c->have += (size_t)n;
    moved += (size_t)n;
    q->pipe_len[q->pipe_cur] += (size_t)n;
    c->unacked = true;
  }
  return SPLICE_DONE;
}

static bool
conn_may_read(struct conn *c)
{
  if (c->dead || c->state == CS_CLOSING || c->state == CS_TLS_HANDSHAKE ||
      c->state == CS_REQ_PART || c->hs_out_len > 0)
    return false;
  /* Written under c->lock by workers; a stale read only delays reading
   * until the resume that follows every change. */
  return !__atomic_load_n(&c->paused, __ATOMIC_ACQUIRE);
}

void
conn_read(struct conn *c)
{
  size_t turn = 0;
  /* Over TLS the turn counts the records' bytes too: a flood of tiny
   * records costs a record's work per byte. */
  uint64_t wire0 = transport_wire_in(&c->t);
  if (c->state == CS_REQ_PART && !c->dead && transmission_part_next(c) < 0) {
    conn_close(c, NULL);
    return;
  }
  while (conn_may_read(c)) {
    uint64_t wire = transport_wire_in(&c->t) - wire0;
    if (turn >= SERVER_TURN_BYTES || wire >= SERVER_TURN_BYTES) {
      c->yielded = true;
      conn_resume(c);
      return;
    }
    if (c->state == CS_REQ_SPLICE) {
      size_t before = c->have;
      enum splice_result r = conn_read_splice(c, SERVER_TURN_BYTES - turn);
      turn += c->have > before ? c->have - before : 0;
      if (r == SPLICE_WAIT)
        return;
      if (r == SPLICE_TURN)
        continue; /* the turn is over: yield above */
      if (r == SPLICE_COPIED)
        continue; /* now an ordinary payload read */
      if (r == SPLICE_FAILED || transmission_payload(c) < 0) {
        conn_close(c, NULL);
        return;
      }
      continue;
    }
    if (c->in_off < c->in_len && c->have < c->need) {
      size_t n = c->in_len - c->in_off;
      if (n > c->need - c->have)
        n = c->need - c->have;
      memcpy(c->dst + c->have, c->inbuf + c->in_off, n);
      c->in_off += n;
      c->have += n;
    }
    if (c->have == c->need) {
      turn += SERVER_TURN_MSG;
      if (conn_step(c) < 0) {
        conn_close(c, NULL);
        return;
      }
      continue;
    }
    /* Large payloads go straight into their buffer; small messages are
     * read in bulk so that one recv serves many headers. */
    size_t want = c->need - c->have;
    if (want > SERVER_TURN_BYTES - turn)
      want = SERVER_TURN_BYTES - turn; /* a turn ends inside a payload */
    ssize_t n;
    /* After a spliced payload, the next header is read on its own, so
     * that the next payload stays in the socket for splice to move. */
    bool exact = want >= sizeof c->inbuf / 2 ||
                 (c->last_spliced && c->state == CS_REQ_HDR);
    if (exact) {
      n = c->t.ops->recv(&c->t, c->dst + c->have, want);
      if (n > 0) {
        c->have += (size_t)n;
        turn += (size_t)n;
      }
    } else {
      c->in_off = c->in_len = 0;
      n = c->t.ops->recv(&c->t, c->inbuf, sizeof c->inbuf);
      if (n > 0) {
        c->in_len = (size_t)n;
        turn += (size_t)n;
      }
    }
    if (n == -EAGAIN) {
      conn_drained(c);
      return;
    }
    if (n == 0) {
      if (c->state <= CS_OPT_DISCARD && conn_nlogged(c) > 0)
        log_debug("%s: client disconnected during the handshake", c->peer);
      else if (c->state <= CS_OPT_DISCARD)
        log_warn("%s: client disconnected during the handshake", c->peer);
      else if (c->cur)
        log_warn("%s: client disconnected in the middle of a %s request",
                 c->peer, wire_cmd_name(c->cur->r.type));
      else if (c->have > 0)
        log_warn("%s: client disconnected after %zu of %zu bytes of a "
                 "request header", c->peer, c->have, c->need);
      else {
        /* Between two requests: as NBD_CMD_DISC, those in flight are
         * answered first (a client may shut only its sending side). */
        log_debug("%s: client disconnected without NBD_CMD_DISC", c->peer);
        if (c->state == CS_REQ_HDR && !transmission_end(c))
          return;
      }
      conn_close(c, NULL);
      return;
    }
    if (n < 0) {
      log_warn("%s: receive failed: %s", c->peer, strerror((int)-n));
      conn_close(c, NULL);
      return;
    }
    c->unacked = true;
  }
}

static void
conn_on_event(struct loop *l, int fd, uint32_t events, void *arg)
{
  struct conn *c = arg;

  if (c->state == CS_TLS_HANDSHAKE) {
    enum hs_progress r = handshake_tls_step(c);
    if (r == HS_CLOSE) {
      conn_close(c, NULL);
      return;
    }
    if (r == HS_WAIT)
      return;
  } else if ((events & (EPOLLERR | EPOLLHUP)) && !conn_may_read(c)) {
    /* Not reading (paused, or closing after DISC) and the socket can no
     * longer send: the replies have nowhere to go, and the HUP, always
     * reported, would spin the loop until they were done. */
    log_debug("%s: client gone with requests in flight", c->peer);
    conn_close(c, NULL);
    return;
  } else if (events & EPOLLOUT) {
    /* The handshake's last reply may still be queued when transmission
     * has begun: it goes first. Before an export is chosen it is all
     * handshake, even with nothing left queued here: a TLS session may
     * hold the last records (its flush said EAGAIN), and only
     * handshake_flush closes after ABORT once they are out. */
    int r = c->hs_out_len || c->exp == NULL ? handshake_flush(c)
                                            : transmission_flush(c);
    if (r < 0) {
      conn_close(c, NULL);
      return;
    }
  }
  /* Also after EPOLLOUT: bytes already in inbuf wait for no event. A
   * connection whose turn ran out is read by the tick, behind the rest. */
  if (!c->yielded)
    conn_read(c);
}

/* ---- a new connection ---- */

static void
conn_setup_socket(struct server *s, struct conn *c)
{
  c->is_tcp = sock_is_tcp(c->fd);
  c->loopback = c->is_tcp && sock_is_tcp_loopback(c->fd);
  if (c->is_tcp) {
    sock_set_nodelay(c->fd, true);
    sock_set_keepalive(c->fd);
    return;
  }
  /* Unix sockets default to a 208 KiB send buffer, which caps a 2 MiB
   * reply at a fraction of its speed. */
  int eff = 0;
  if (sock_set_sndbuf(c->fd, SERVER_UNIX_SNDBUF, &eff) == 0 &&
      eff < SERVER_UNIX_SNDBUF &&
      !__atomic_exchange_n(&s->warned_sndbuf, true, __ATOMIC_RELAXED)) {
    log_warn("unix socket send buffer clipped to %d bytes (asked %d); "
             "raise net.core.wmem_max", eff, SERVER_UNIX_SNDBUF);
  }
  log_debug("unix socket send buffer %d bytes", eff);
}

void
conn_create(struct sloop *sl, int fd, const struct transport *tls,
            struct export *dflt)
{
  struct server *s = sl->srv;
  struct conn *c = calloc(1, sizeof *c);
  if (c == NULL) {
    if (tls && tls->ops) {
      struct transport t = *tls;
      t.ops->free(&t);
    }
    close(fd);
    sloop_uncount(sl);
    return;
  }
  c->srv = s;
  c->sl = sl;
  c->loop = sl->loop;
  c->fd = fd;
  c->dflt_export = dflt;
  c->refs = 1;
  tcpinfo_init(&c->tcp);
  sock_peer_name(fd, c->peer, sizeof c->peer);
  pthread_mutex_init(&c->lock, NULL);
  if (tls && tls->ops) {
    c->t = *tls; /* TLS already runs: the handshake is inside it */
    c->tls = true;
  } else {
    transport_init_plain(&c->t, fd);
  }
  conn_setup_socket(s, c);
  /* --stats: counters are deltas from the first sample, which a
   * connection shorter than the loop's tick would otherwise not get. */
  if (s->cfg.stats && c->is_tcp)
    tcpinfo_sample(&c->tcp, c->fd);
  c->next = sl->conns;
  if (sl->conns)
    sl->conns->prev = c;
  sl->conns = c;
  if (loop_add(c->loop, fd, EPOLLIN, conn_on_event, c) < 0) {
    conn_close(c, "cannot watch the socket");
    return;
  }
  if (s->cfg.handshake_timeout > 0)
    c->deadline_ms =
      loop_now_ms() + (uint64_t)s->cfg.handshake_timeout * 1000;
  log_debug("%s: connected (event loop %d)", c->peer, (int)(sl - s->loops));
  handshake_start(c);
}
