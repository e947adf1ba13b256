/* server.c: listeners, the connection lifecycle, and the reading side of
 * every connection. See server.h for the threading rules. */
#include "server.h"
#include "server/xapi.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/sock.h"
#include "util/log.h"

void
conn_log(struct conn *c, const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  if (conn_nlogged(c) > CONN_LOG_CAP) /* and the count stops growing */
    return;
  int n = __atomic_fetch_add(&c->nlogged, 1, __ATOMIC_RELAXED);
  if (n > CONN_LOG_CAP)
    return;
  if (n == CONN_LOG_CAP) {
    log_warn("%s: further problems on this connection are not logged",
             c->peer);
    return;
  }
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

void
conn_close(struct conn *c, const char *why)
{
  struct server *s = c->srv;
  if (why)
    log_warn("%s: %s; closing the connection", c->peer, why);
  if (s->cfg.stats && c->is_tcp && !c->dead) {
    char line[512];
    tcpinfo_sample(&c->tcp, c->fd);
    tcpinfo_format_line(&c->tcp, line, sizeof line);
    log_info("%s: tcp: %s", c->peer, line);
  }
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

uint64_t
server_stopping(struct server *s)
{
  return __atomic_load_n(&s->stop_deadline_ms, __ATOMIC_ACQUIRE);
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

/* The pipe filled up before the payload was in (its slots hold partial
 * pages): take this payload back into the request's buffer and read the
 * rest of it the ordinary way. Returns 2 to say "go on reading". */
static int
conn_splice_fallback(struct conn *c)
{
  struct req *q = c->cur;
  if (req_reserve(q, c->need) < 0) {
    log_warn("%s: out of memory for a %zu-byte payload", c->peer, c->need);
    return -1;
  }
  size_t got = 0;
  for (unsigned i = 0; i <= q->pipe_cur; i++) {
    size_t end = got + q->pipe_len[i];
    while (got < end) {
      ssize_t n = read(q->pipe[i][0], q->buf + got, end - got);
      if (n <= 0) {
        log_warn("%s: cannot drain a payload pipe: %s", c->peer,
                 n < 0 ? strerror(errno) : "short read");
        return -1;
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
  return 2;
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
 * Returns 1 when all of it is there, 0 when the socket is empty, 2 when it
 * fell back to the buffer, 3 when limit is reached, -1 to close. */
static int
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
      return -1;
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
      return 3;
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
      return 0;
    }
    if (n <= 0) {
      log_warn("%s: %s in the middle of a WRITE payload", c->peer,
               n == 0 ? "client disconnected" : strerror((int)-n));
      return -1;
    }
    c->have += (size_t)n;
    moved += (size_t)n;
    q->pipe_len[q->pipe_cur] += (size_t)n;
    c->unacked = true;
  }
  return 1;
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

/* Reads and handles what the socket has, without blocking, for one turn
 * (SERVER_TURN_BYTES); a connection with more to read then queues itself
 * behind the loop's other work (yielded), and its tick reads on. */
static void
conn_read(struct conn *c)
{
  size_t turn = 0;
  if (c->state == CS_REQ_PART && !c->dead && transmission_part_next(c) < 0) {
    conn_close(c, NULL);
    return;
  }
  while (conn_may_read(c)) {
    if (turn >= SERVER_TURN_BYTES) {
      c->yielded = true;
      conn_resume(c);
      return;
    }
    if (c->state == CS_REQ_SPLICE) {
      size_t before = c->have;
      int r = conn_read_splice(c, SERVER_TURN_BYTES - turn);
      turn += c->have > before ? c->have - before : 0;
      if (r == 0)
        return;
      if (r == 3)
        continue; /* the turn is over: yield above */
      if (r == 2)
        continue; /* now an ordinary payload read */
      if (r < 0 || transmission_payload(c) < 0) {
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
      else
        log_debug("%s: client disconnected without NBD_CMD_DISC", c->peer);
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
    int r = handshake_tls_step(c);
    if (r < 0) {
      conn_close(c, NULL);
      return;
    }
    if (r == 0)
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
     * has begun: it goes first. */
    int r = c->hs_out_len ? handshake_flush(c) : transmission_flush(c);
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

/* ---- accepting ---- */

static void
conn_setup_socket(struct server *s, struct conn *c)
{
  c->is_tcp = sock_is_tcp(c->fd);
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

/* Takes up an accepted socket on the loop sl, from sl's thread. Its
 * place in nconns and sl->nowned was taken by the accepting loop. */
static void
conn_create(struct sloop *sl, int fd, const struct transport *tls)
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

/* Counts an accepted socket in and picks the loop with the fewest
 * connections for it. Returns NULL, the socket closed, when
 * --max-connections is reached or the handoff cannot grow. */
static struct sloop *
server_assign(struct server *s, int fd)
{
  struct sloop *sl = NULL;
  int was = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cfg.max_connections && s->nconns >= s->cfg.max_connections) {
    was = s->nconns;
  } else {
    sl = &s->loops[0];
    for (int i = 1; i < s->nloops; i++)
      if (s->loops[i].nowned < sl->nowned)
        sl = &s->loops[i];
    if (sl != &s->loops[0] && sl->nhandoff == sl->handoff_cap) {
      int cap = sl->handoff_cap ? 2 * sl->handoff_cap : 16;
      struct handoff *h = realloc(sl->handoff, (size_t)cap * sizeof *h);
      if (h == NULL) {
        sl = NULL;
      } else {
        sl->handoff = h;
        sl->handoff_cap = cap;
      }
    }
    if (sl) {
      if (sl != &s->loops[0])
        sl->handoff[sl->nhandoff++] = (struct handoff){ .fd = fd };
      sl->nowned++;
      s->nconns++;
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (sl == NULL) {
    char peer[80];
    sock_peer_name(fd, peer, sizeof peer);
    if (was)
      log_warn("%s: refused: %d connections already (--max-connections)",
               peer, was);
    else
      log_warn("%s: refused: out of memory", peer);
    close(fd);
  }
  return sl;
}

int
server_take_slot(struct server *s)
{
  int r = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cfg.max_connections && s->nconns >= s->cfg.max_connections)
    r = -EBUSY;
  else
    s->nconns++;
  pthread_mutex_unlock(&s->lock);
  return r;
}

void
server_release_slot(struct server *s)
{
  pthread_mutex_lock(&s->lock);
  s->nconns--;
  pthread_mutex_unlock(&s->lock);
}

int
server_adopt(struct server *s, int fd, const struct transport *tls)
{
  pthread_mutex_lock(&s->lock);
  struct sloop *sl = &s->loops[0];
  for (int i = 1; i < s->nloops; i++)
    if (s->loops[i].nowned < sl->nowned)
      sl = &s->loops[i];
  if (sl->nhandoff == sl->handoff_cap) {
    int cap = sl->handoff_cap ? 2 * sl->handoff_cap : 16;
    struct handoff *h = realloc(sl->handoff, (size_t)cap * sizeof *h);
    if (h == NULL) {
      pthread_mutex_unlock(&s->lock);
      return -ENOMEM;
    }
    sl->handoff = h;
    sl->handoff_cap = cap;
  }
  sl->handoff[sl->nhandoff++] = (struct handoff){ .fd = fd };
  if (tls)
    sl->handoff[sl->nhandoff - 1].tls = *tls;
  sl->nowned++;
  pthread_mutex_unlock(&s->lock);
  loop_wake(sl->loop);
  return 0;
}

static void
server_accept(struct loop *l, int lfd, uint32_t events, void *arg)
{
  struct server *s = arg;

  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS ||
          err == ENOMEM) {
        /* The listener stays readable: without a pause the loop would
         * spin here. The tick turns it back on. Another listener of
         * the same batch finds them paused already. */
        if (!s->accept_starved)
          log_warn("accept: %s; pausing new connections until fds are "
                   "free", strerror(err));
        s->accept_starved = true;
        if (s->accept_paused_ms == 0) {
          for (int i = 0; i < s->nlisten; i++)
            loop_mod(l, s->listen_fds[i], 0);
          s->accept_paused_ms = loop_now_ms();
        }
      } else if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
        log_warn("accept: %s", strerror(err));
      }
      return;
    }
    if (s->accept_starved) {
      s->accept_starved = false;
      log_info("accepting connections again");
    }
    struct sloop *sl = server_assign(s, fd);
    if (sl == &s->loops[0])
      conn_create(sl, fd, NULL);
    else if (sl)
      loop_wake(sl->loop);
  }
}

/* ---- the loop's periodic work ---- */

/* Shutting down (§Terminating the transmission phase): a connection in
 * transmission is closed once it is between requests with every reply
 * out; new requests meanwhile get ESHUTDOWN and new options
 * ERR_SHUTDOWN. Each loop drains its own connections and stops when
 * none is left, or at the deadline; server_cleanup closes the rest. */
static void
sloop_drain(struct sloop *sl)
{
  struct conn *c, *next;
  for (c = sl->conns; c; c = next) {
    next = c->next;
    if (c->exp == NULL || c->state != CS_REQ_HDR || c->have > 0 ||
        c->in_off < c->in_len)
      continue;
    /* Requests already sent but not yet read get their ESHUTDOWN first
     * ("subsequently received requests SHOULD" get it), instead of a
     * reset. */
    if (sock_readable_bytes(c->fd) > 0 ||
        (c->t.ops->pending && c->t.ops->pending(&c->t) > 0))
      continue;
    pthread_mutex_lock(&c->lock);
    bool idle = c->inflight == 0 && c->sendq == NULL && !c->want_out;
    pthread_mutex_unlock(&c->lock);
    if (idle)
      conn_close(c, NULL);
  }
  /* loops[0] stays up until every loop's connections are gone, so that
   * a second signal is still heard while the others drain. Another loop
   * counts the sockets handed to it and not yet taken up, too (nowned):
   * one accepted just before the signal may still be on its way. */
  pthread_mutex_lock(&sl->srv->lock);
  bool empty = sl == &sl->srv->loops[0] ? sl->srv->nconns == 0
                                        : sl->nowned == 0;
  pthread_mutex_unlock(&sl->srv->lock);
  if (empty || loop_now_ms() >= server_stopping(sl->srv))
    loop_stop(sl->loop);
}

/* Swap switched on after start-up lets tmpfs pages wait for the swap
 * device, and an event loop must not wait for a device: loops[0] looks
 * again at each sweep and moves the writes of swappable exports to the
 * workers while swap is active, and back when it is gone. When
 * /proc/swaps cannot be read (out of file descriptors, say), nothing
 * changes. */
static void
server_watch_swap(struct server *s)
{
  bool any = false;
  for (int i = 0; i < s->nexports; i++)
    any = any || s->exports[i]->swappable;
  if (!any)
    return;
  int swap = export_swap_active();
  if (swap < 0) {
    if (!s->swaps_unreadable)
      log_warn("cannot read /proc/swaps: %s; writes stay where they run "
               "until it can be read", strerror(-swap));
    s->swaps_unreadable = true;
    return;
  }
  if (s->swaps_unreadable)
    log_info("/proc/swaps can be read again");
  s->swaps_unreadable = false;
  bool in_memory = swap == 0;
  for (int i = 0; i < s->nexports; i++) {
    struct export *e = s->exports[i];
    if (!e->swappable ||
        __atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED) == in_memory)
      continue;
    __atomic_store_n(&e->write_in_memory, in_memory, __ATOMIC_RELAXED);
    if (in_memory && e->read_only)
      log_info("export \"%s\": no swap is active now: READ data leaves "
               "from the file's pages again", e->name);
    else if (in_memory)
      log_info("export \"%s\": no swap is active now: writes up to %u MiB "
               "run on the event loop again", e->name,
               SERVER_INLINE_WRITE >> 20);
    else
      log_info("export \"%s\": swap is active now: %s", e->name,
               e->read_only ? "READ data is read into buffers"
                            : "its writes go to the workers");
  }
}

/* Every loop's periodic work, and its work on being woken: sockets
 * handed over, connections a worker asked about, TCP_INFO samples,
 * handshake deadlines and the shutdown drain; and on loops[0] the
 * listeners' pause and the swap watch. */
static void
sloop_tick(struct loop *l, void *arg)
{
  struct sloop *sl = arg;
  struct server *s = sl->srv;
  struct handoff *fds = NULL;
  int nfds = 0;

  pthread_mutex_lock(&s->lock);
  struct conn *list = sl->resume;
  sl->resume = NULL;
  if (sl->nhandoff > 0) {
    fds = sl->handoff;
    nfds = sl->nhandoff;
    sl->handoff = NULL;
    sl->nhandoff = sl->handoff_cap = 0;
  }
  pthread_mutex_unlock(&s->lock);

  for (int i = 0; i < nfds; i++)
    conn_create(sl, fds[i].fd, &fds[i].tls);
  free(fds);

  while (list) {
    struct conn *c = list;
    /* Take the link before c may be queued again: conn_resume rewrites
     * resume_next as soon as in_resume is false. */
    pthread_mutex_lock(&s->lock);
    list = c->resume_next;
    c->in_resume = false;
    pthread_mutex_unlock(&s->lock);
    if (!c->dead) {
      pthread_mutex_lock(&c->lock);
      bool done = c->closing && c->inflight == 0 && c->sendq == NULL &&
                  !c->want_out; /* TLS may still hold bytes */
      bool failed = c->send_failed;
      pthread_mutex_unlock(&c->lock);
      if (failed) {
        conn_close(c, "sending a reply failed");
      } else if (done) {
        conn_close(c, NULL);
      } else {
        /* A worker resumed reading or wants EPOLLOUT, or the
         * connection's last turn ran out. */
        pthread_mutex_lock(&c->lock);
        conn_update_events(c);
        pthread_mutex_unlock(&c->lock);
        c->yielded = false;
        conn_read(c);
      }
    }
    conn_put(c);
  }

  if (s->cfg.stats)
    for (struct conn *c = sl->conns; c; c = c->next)
      if (c->is_tcp)
        tcpinfo_sample(&c->tcp, c->fd);

  if (server_stopping(s))
    sloop_drain(sl);
  uint64_t now = loop_now_ms();
  if (sl == &s->loops[0] && s->accept_paused_ms &&
      now - s->accept_paused_ms >= 1000) {
    s->accept_paused_ms = 0;
    for (int i = 0; i < s->nlisten; i++)
      loop_mod(l, s->listen_fds[i], EPOLLIN);
  }
  if (now - sl->last_sweep_ms < 500)
    return;
  sl->last_sweep_ms = now;
  if (sl == &s->loops[0])
    server_watch_swap(s);
  struct conn *c, *next;
  for (c = sl->conns; c; c = next) {
    next = c->next;
    if (c->deadline_ms && now > c->deadline_ms) {
      char why[96];
      snprintf(why, sizeof why, "handshake not finished within %d s",
               s->cfg.handshake_timeout);
      conn_close(c, why);
    }
  }
}

/* Removes our Unix socket's file, once, and only while it is still ours:
 * a successor that bound the path after our listeners closed keeps its
 * socket. */
static void
server_unlink_unix(struct server *s)
{
  struct stat st;
  if (s->bound_unix && lstat(s->cfg.unix_path, &st) == 0 &&
      st.st_dev == s->unix_dev && st.st_ino == s->unix_ino)
    unlink(s->cfg.unix_path);
  s->bound_unix = false;
}

static void
server_on_signal(struct loop *l, int fd, uint32_t events, void *arg)
{
  struct server *s = arg;
  struct signalfd_siginfo si;
  ssize_t n = read(fd, &si, sizeof si);
  unsigned sig = n == (ssize_t)sizeof si ? si.ssi_signo : 0;

  if (server_stopping(s)) {
    log_info("signal %u again: stopping now", sig);
    for (int i = 0; i < s->nloops; i++)
      loop_stop(s->loops[i].loop);
    return;
  }
  log_info("signal %u: shutting down; requests in flight get %d s",
           sig, SERVER_STOP_GRACE_MS / 1000);
  for (int i = 0; i < s->nlisten; i++) {
    loop_del(l, s->listen_fds[i]);
    close(s->listen_fds[i]);
  }
  s->nlisten = 0;
  server_unlink_unix(s); /* the path is free for a successor now */
  __atomic_store_n(&s->stop_deadline_ms, loop_now_ms() + SERVER_STOP_GRACE_MS,
                   __ATOMIC_RELEASE);
  /* Each loop drains its own connections, from its tick. */
  for (int i = 1; i < s->nloops; i++)
    loop_wake(s->loops[i].loop);
  sloop_drain(&s->loops[0]);
}

struct export *
server_find_export(struct server *s, const uint8_t *name, size_t len)
{
  if (len == 0)
    return s->nexports ? s->exports[0] : NULL;
  for (int i = 0; i < s->nexports; i++)
    if (strlen(s->exports[i]->name) == len &&
        memcmp(s->exports[i]->name, name, len) == 0)
      return s->exports[i];
  return NULL;
}

static int
server_listen(struct server *s)
{
  int n = sock_activation_fds(s->listen_fds, SERVER_MAX_LISTEN);
  if (n > 0) {
    s->nlisten = n;
    if (s->cfg.listen || s->cfg.unix_path)
      log_warn("ignoring %s %s: listening on the socket(s) passed by the "
               "service manager instead",
               s->cfg.listen ? "--listen" : "--unix",
               s->cfg.listen ? s->cfg.listen : s->cfg.unix_path);
    log_info("listening on %d socket(s) passed by the service manager", n);
    return 0;
  }
  if (s->cfg.unix_path) {
    int fd = sock_listen_unix(s->cfg.unix_path);
    if (fd < 0) {
      log_error("cannot listen on unix socket %s: %s", s->cfg.unix_path,
                strerror(-fd));
      return fd;
    }
    s->listen_fds[s->nlisten++] = fd;
    struct stat st;
    if (lstat(s->cfg.unix_path, &st) == 0) {
      s->bound_unix = true;
      s->unix_dev = st.st_dev;
      s->unix_ino = st.st_ino;
    }
    log_info("listening on unix socket %s", s->cfg.unix_path);
    return 0;
  }
  const char *spec = s->cfg.listen ? s->cfg.listen : "127.0.0.1";
  char host[256], port[32];
  if (sock_split_hostport(spec, host, port, "10809") < 0) {
    log_error("bad --listen address \"%s\": want HOST:PORT, [IPV6]:PORT "
              "or HOST", spec);
    return -EINVAL;
  }
  char *end;
  unsigned long pn = strtoul(port, &end, 10);
  if (!isdigit((unsigned char)port[0]) || *end || pn > 65535) {
    log_error("bad --listen address \"%s\": the port must be a number "
              "from 0 to 65535 (0: any free port)", spec);
    return -EINVAL;
  }
  n = sock_listen_tcp(host, port, s->listen_fds, SERVER_MAX_LISTEN);
  if (n < 0) {
    /* "::1:20004" is one IPv6 address with the default port, which is
     * rarely what was meant. */
    bool bare_v6 = strchr(host, ':') != NULL && spec[0] != '[';
    const char *hint = bare_v6 ? " (an IPv6 address with a port is written "
                                 "[ADDRESS]:PORT)" : "";
    if (sock_err_is_resolve(n)) {
      log_error("cannot resolve %s: %s%s", host, sock_strerror(n), hint);
      return -EADDRNOTAVAIL;
    }
    log_error("cannot listen on %s port %s: %s%s", host, port, strerror(-n),
              hint);
    return n;
  }
  s->nlisten = n;
  for (int i = 0; i < n; i++) { /* the real port, also for port 0 */
    char name[64];
    sock_local_name(s->listen_fds[i], name, sizeof name);
    log_info("listening on %s", name);
  }
  return 0;
}

/* Each request in flight may hold up to REQ_PIPES pipes (two fds each)
 * for spliced payloads: raise the soft fd limit to the hard one, so that
 * a few busy clients do not starve accept(2) at the usual 1024. */
static void
server_raise_fd_limit(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      log_debug("open file limit raised from %llu to %llu",
                (unsigned long long)was, (unsigned long long)rl.rlim_max);
  }
}

static int
server_write_pidfile(const char *path)
{
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int err = 0;
  if (f == NULL)
    err = errno;
  else {
    if (fprintf(f, "%ld\n", (long)getpid()) < 0)
      err = errno ? errno : EIO;
    if (fclose(f) != 0 && err == 0)
      err = errno;
    if (err == 0 && rename(tmp, path) < 0)
      err = errno;
    if (err)
      unlink(tmp);
  }
  if (err) {
    log_error("cannot write pid file %s: %s", path, strerror(err));
    return -err;
  }
  return 0;
}

static void *
sloop_thread(void *arg)
{
  struct sloop *sl = arg;
  prctl(PR_SET_NAME, "nbdflow-loop");
  if (loop_run(sl->loop) < 0)
    log_error("event loop failed: %s", strerror(errno));
  return NULL;
}

/* Sets up the loops, each with its tick; loops[0] runs on the caller. */
static int
server_start_loops(struct server *s)
{
  int n = s->cfg.loops;
  if (n <= 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    n = cpus < 1 ? 1 : cpus > SERVER_MAX_LOOPS ? SERVER_MAX_LOOPS : (int)cpus;
  }
  s->loops = calloc((size_t)n, sizeof *s->loops);
  if (s->loops == NULL)
    return -ENOMEM;
  for (int i = 0; i < n; i++) {
    struct sloop *sl = &s->loops[i];
    sl->srv = s;
    sl->loop = loop_new();
    if (sl->loop == NULL)
      return -ENOMEM;
    s->nloops++;
    loop_set_tick(sl->loop, SERVER_TICK_MS, sloop_tick, sl);
  }
  for (int i = 1; i < n; i++) {
    int r = pthread_create(&s->loops[i].thread, NULL, sloop_thread,
                           &s->loops[i]);
    if (r != 0) {
      log_error("cannot start event-loop thread %d: %s", i, strerror(r));
      return -r;
    }
    s->loops[i].running = true;
  }
  log_debug("%d event loop%s", n, n == 1 ? "" : "s");
  return 0;
}

/* After loops[0] has stopped: waits for the others, which have stopped
 * or will at the deadline when shutting down, and are stopped here
 * otherwise (start-up failed). */
static void
server_join_loops(struct server *s)
{
  for (int i = 1; i < s->nloops; i++) {
    struct sloop *sl = &s->loops[i];
    if (!sl->running)
      continue;
    if (!server_stopping(s))
      loop_stop(sl->loop);
    pthread_join(sl->thread, NULL);
    sl->running = false;
  }
}

static void
server_cleanup(struct server *s)
{
  xapi_stop(s); /* its sessions write into exports and hand over fds */
  server_join_loops(s);
  for (int i = 0; i < s->nloops; i++) {
    struct sloop *sl = &s->loops[i];
    while (sl->conns)
      conn_close(sl->conns, NULL);
    for (int j = 0; j < sl->nhandoff; j++) {
      struct handoff *ho = &sl->handoff[j];
      if (ho->tls.ops)
        ho->tls.ops->free(&ho->tls);
      close(ho->fd);
    }
    free(sl->handoff);
  }
  workq_free(s->workq); /* finishes queued requests first */
  for (int i = 0; i < s->nlisten; i++)
    close(s->listen_fds[i]);
  server_unlink_unix(s);
  if (s->wrote_pidfile)
    unlink(s->cfg.pidfile);
  for (int i = 0; i < s->nexports; i++)
    export_close(s->exports[i]);
  free(s->exports);
  tls_creds_free(s->tls);
  for (int i = 0; i < s->nloops; i++) {
    /* Requests the workers just finished may have queued their
     * connection here, each holding a reference. */
    struct conn *c = s->loops[i].resume, *next;
    for (; c; c = next) {
      next = c->resume_next;
      conn_put(c);
    }
    loop_free(s->loops[i].loop);
  }
  free(s->loops);
  pthread_mutex_destroy(&s->lock);
}

int
server_run(struct server_config *cfg, char **export_args, int nexports)
{
  struct server s = { .cfg = *cfg };
  int ret = 1, sfd = -1;
  sigset_t mask;

  pthread_mutex_init(&s.lock, NULL);
  server_raise_fd_limit();
  s.pipe_max = sock_pipe_max_size();
  s.exports = calloc((size_t)nexports, sizeof *s.exports);
  if (s.exports == NULL)
    goto cleanup;
  for (int i = 0; i < nexports; i++) {
    struct export_opts eo = { .read_only = cfg->read_only,
                              .ignore_checksums = cfg->ignore_checksums };
    if (export_open(export_args[i], &eo, &s.exports[i]) < 0)
      goto cleanup;
    s.nexports++;
    if (cfg->description &&
        (s.exports[i]->description = strdup(cfg->description)) == NULL)
      goto cleanup;
    for (int j = 0; j < i; j++)
      if (strcmp(s.exports[j]->name, s.exports[i]->name) == 0) {
        log_error("export name \"%s\" given twice", s.exports[i]->name);
        goto cleanup;
      }
  }
  if (cfg->tls_mode != TLS_OFF) {
    char err[512];
    if (tls_creds_server_new(&cfg->tls, &s.tls, err, sizeof err) < 0) {
      log_error("%s", err);
      goto cleanup;
    }
    log_info("TLS %s (%s%s%s)%s",
             cfg->tls_mode == TLS_REQUIRE ? "required" : "offered",
             cfg->tls.certs_dir ? "X.509" : "",
             cfg->tls.certs_dir && cfg->tls.psk_file ? ", " : "",
             cfg->tls.psk_file ? "PSK" : "",
             !cfg->tls.verify_peer ? ""
             : cfg->tls.psk_file ? "; X.509 clients need a certificate from "
                                   "the CA, PSK clients prove their key"
                                 : "; clients need a certificate from the CA");
    if (cfg->tls.verify_peer && cfg->tls_mode == TLS_ON)
      log_warn("--tls-verify-peer with --tls=on: a client that stays in "
               "plaintext needs no certificate; --tls=require demands TLS");
  }
  /* Block the stop signals before any thread starts, so that only the
   * first loop's signalfd sees them. */
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &mask, NULL);
  s.workq = workq_new(cfg->threads);
  if (s.workq == NULL) {
    log_error("cannot start %d worker threads: %s", cfg->threads,
              strerror(errno));
    goto cleanup;
  }
  if (server_listen(&s) < 0)
    goto cleanup;
  int r = server_start_loops(&s);
  if (r < 0) {
    log_error("cannot start the event loops: %s", strerror(-r));
    goto cleanup;
  }
  struct loop *main_loop = s.loops[0].loop;
  for (int i = 0; i < s.nlisten; i++) {
    r = loop_add(main_loop, s.listen_fds[i], EPOLLIN, server_accept, &s);
    if (r < 0) {
      log_error("cannot watch the listening socket: %s", strerror(-r));
      goto cleanup;
    }
  }
  if (xapi_start(&s, main_loop) < 0)
    goto cleanup;
  /* The stop signals are blocked: without this descriptor SIGTERM would
   * never reach the server. */
  sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  r = sfd < 0 ? -errno
              : loop_add(main_loop, sfd, EPOLLIN, server_on_signal, &s);
  if (r < 0) {
    log_error("cannot watch SIGINT and SIGTERM: %s", strerror(-r));
    goto cleanup;
  }

  if (cfg->pidfile) {
    if (server_write_pidfile(cfg->pidfile) < 0)
      goto cleanup;
    s.wrote_pidfile = true;
  }
  for (int i = 0; i < s.nexports; i++) {
    const struct export *e = s.exports[i];
    char mem[64] = "";
    bool in_memory = e->ops->map != NULL &&
                     __atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED);
    if (in_memory && e->read_only)
      snprintf(mem, sizeof mem, ", in memory");
    else if (in_memory)
      snprintf(mem, sizeof mem,
               ", in memory (writes up to %u MiB on the event loop)",
               SERVER_INLINE_WRITE >> 20);
    log_info("export \"%s\": %s, %llu bytes%s%s", e->name, export_kind(e),
             (unsigned long long)e->size, e->read_only ? ", read-only" : "",
             mem);
  }
  ret = loop_run(main_loop) < 0 ? 1 : 0;
cleanup:
  if (sfd >= 0)
    close(sfd);
  server_cleanup(&s);
  return ret;
}
