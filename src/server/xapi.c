/* xapi.c: see xapi.h. */
#include "server/xapi.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/loop.h"
#include "net/sock.h"
#include "net/tls.h"
#include "net/transport.h"
#include "proto/chunked.h"
#include "proto/http.h"
#include "server/server.h"
#include "util/log.h"

enum xapi_kind { XAPI_HTTP, XAPI_CHUNKED };

/* Payloads are spliced socket -> pipe on the session's thread, and each
 * full pipe is written into the export by a worker (pipe -> file), so that
 * several writes run while the socket is read on: one thread allocating
 * the file's pages was the stream's ceiling. */
#define XAPI_PIPES 4

struct xsess;
struct xpipe {
  struct work work;       /* first: the worker's handle */
  struct xsess *ss;
  int fd[2];
  uint64_t off;
  size_t len;
  bool busy;              /* under ss->wlock */
};

struct xsess {
  struct xapi *x;
  int fd;
  enum xapi_kind kind;
  struct transport tp;
  char peer[80];
  bool handed_over;       /* the fd became an NBD connection */
  bool failed;            /* a body not stored whole: close with a reset */
  int npipes;             /* 0: no splicing (TLS, a backend without it) */
  struct xpipe pipes[XAPI_PIPES];
  size_t pipe_size;
  struct export *exp;     /* what the pipes write into */
  pthread_mutex_t wlock;
  pthread_cond_t wcond;
  unsigned wbusy;         /* pipes a worker holds, under wlock */
  int werr;               /* the first write error, under wlock */
  char werrmsg[160];
  struct xsess *prev, *next;
};

struct xapi {
  struct server *s;
  int fds[2 * SERVER_MAX_LISTEN];
  enum xapi_kind kinds[2 * SERVER_MAX_LISTEN];
  int nfds;
  struct loop *loop;
  pthread_mutex_t lock;
  pthread_cond_t idle;
  struct xsess *sessions; /* under lock */
  int active;             /* under lock */
  bool stopping;          /* under lock */
  /* Out of fds (or memory) at accept: the listeners rest a second, or
   * the level-triggered loop would spin on them. Loop thread. */
  uint64_t paused_ms;
  bool starved;
};

/* ---- reading and answering ---- */

/* How long a body may send nothing (--body-timeout): ms, -1 for ever. */
static int
xs_idle_ms(const struct xsess *ss)
{
  int t = ss->x->s->cfg.body_timeout;
  return t > 0 ? t * 1000 : -1;
}

static int
xs_left(uint64_t deadline)
{
  uint64_t now = loop_now_ms();
  return now >= deadline ? 0 : (int)(deadline - now);
}

static void
xs_answer(struct xsess *ss, int status, const char *reason,
          const char *extra, const char *body)
{
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "HTTP/1.1 %d %s\r\nConnection: close\r\n%s"
                   "Content-Length: %zu\r\n\r\n%s",
                   status, reason, extra ? extra : "",
                   body ? strlen(body) + 1 : 0, body ? body : "");
  if (n > 0 && (size_t)n < sizeof buf - 1 && body)
    buf[n++] = '\n';
  if (n > 0 && (size_t)n <= sizeof buf)
    (void)transport_send_buf(&ss->tp, buf, (size_t)n, 0, 5000);
}

/* Refuses the request: the status to the client, one line to the log. */
static void
xs_refuse(struct xsess *ss, int status, const char *reason, const char *fmt,
          ...) __attribute__((format(printf, 4, 5)));
static void
xs_refuse(struct xsess *ss, int status, const char *reason, const char *fmt,
          ...)
{
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  log_warn("%s: http: %d %s: %s", ss->peer, status, reason, why);
  xs_answer(ss, status, reason, NULL, why);
}

/* Reads the request head a byte at a time (so that nothing of the body
 * or of an NBD session is taken). Its length, or -errno after logging. */
static ssize_t
xs_read_head(struct xsess *ss, char *buf, size_t cap, uint64_t deadline)
{
  size_t have = 0, end = 0;
  while (end == 0) {
    if (have == cap) {
      xs_refuse(ss, 431, "Request Header Fields Too Large",
                "the request head is over %zu bytes", cap);
      return -EMSGSIZE;
    }
    int r = transport_recv_all(&ss->tp, buf + have, 1, xs_left(deadline));
    if (r < 0) {
      if (have || r != -ECONNRESET)
        log_warn("%s: http: %s after %zu bytes of the request head",
                 ss->peer, r == -ETIMEDOUT ? "timed out" : strerror(-r),
                 have);
      return r;
    }
    if (have == 0 && (unsigned char)buf[0] == 0 && ss->kind == XAPI_HTTP) {
      /* Not text: an NBD client or a Chunked stream at the wrong port. */
      log_warn("%s: http: the first byte is not HTTP (a binary protocol "
               "at the HTTP port?)", ss->peer);
      return -EPROTO;
    }
    if (have == 0 && (unsigned char)buf[0] == 0x16 &&
        ss->tp.ops == &transport_plain_ops) {
      /* A TLS ClientHello holds no end of head: without this, the client
       * would wait out the handshake timeout for an answer. */
      log_warn("%s: http: a TLS handshake at a plain HTTP port (HTTPS "
               "needs --tls and a certificate or PSK)", ss->peer);
      return -EPROTO;
    }
    have++;
    end = http_head_end(buf, have);
  }
  return (ssize_t)end;
}

/* ---- writing into an export ---- */

static int
xs_pwrite(struct export *e, const void *buf, uint64_t len, uint64_t off)
{
  if (e->write_serial)
    pthread_mutex_lock(e->write_serial);
  int r = e->ops->pwrite(e, buf, len, off, false);
  if (e->write_serial)
    pthread_mutex_unlock(e->write_serial);
  return r;
}

/* Moves up to n bytes of body from the socket into pipe fd: the bytes
 * moved, fewer than n when the pipe filled first (each segment that
 * arrived takes one of its slots, so small ones fill it early), or
 * -errno (-ECONNRESET at EOF). */
static ssize_t
xs_splice_pipe(struct xsess *ss, int fd, size_t n)
{
  size_t moved = 0;
  bool ready = false; /* poll said the socket is readable */
  while (moved < n) {
    ssize_t k = splice(ss->fd, NULL, fd, NULL, n - moved,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (k > 0) {
      moved += (size_t)k;
      ready = false;
    } else if (k == 0) {
      return -ECONNRESET;
    } else if (errno == EAGAIN) {
      /* The socket has bytes, or said it was readable (an EOF or an
       * error, which a full pipe hides from splice): then the pipe is
       * the one that is full. The next, empty, meets what waits. */
      if (moved > 0 && (ready || sock_readable_bytes(ss->fd) > 0))
        break;
      struct pollfd pfd = { .fd = ss->fd, .events = POLLIN };
      int pr = poll(&pfd, 1, xs_idle_ms(ss));
      if (pr == 0)
        return -ETIMEDOUT;
      if (pr < 0 && errno != EINTR)
        return -errno;
      ready = pr > 0;
    } else if (errno != EINTR) {
      return -errno;
    }
  }
  return (ssize_t)moved;
}

/* Worker: writes one full pipe into the export. */
static void
xs_pipe_write(struct work *w)
{
  struct xpipe *xp = (struct xpipe *)w;
  struct xsess *ss = xp->ss;
  struct export *e = ss->exp;
  if (e->write_serial)
    pthread_mutex_lock(e->write_serial);
  int r = e->ops->splice_in(e, xp->fd[0], xp->len, xp->off, false);
  if (e->write_serial)
    pthread_mutex_unlock(e->write_serial);
  pthread_mutex_lock(&ss->wlock);
  if (r < 0 && ss->werr == 0) {
    ss->werr = r;
    snprintf(ss->werrmsg, sizeof ss->werrmsg, "writing %zu bytes at offset "
             "%llu of export \"%s\": %s", xp->len,
             (unsigned long long)xp->off, e->name, strerror(-r));
  }
  xp->busy = false;
  ss->wbusy--;
  pthread_cond_broadcast(&ss->wcond);
  pthread_mutex_unlock(&ss->wlock);
}

/* Waits until no worker holds a pipe; the first write error, or 0. */
static int
xs_wait_writes(struct xsess *ss, char *why, size_t whylen)
{
  if (ss->npipes == 0)
    return 0;
  pthread_mutex_lock(&ss->wlock);
  while (ss->wbusy > 0)
    pthread_cond_wait(&ss->wcond, &ss->wlock);
  int r = ss->werr;
  if (r && why)
    snprintf(why, whylen, "%s", ss->werrmsg);
  pthread_mutex_unlock(&ss->wlock);
  return r;
}

/* A free pipe whose write cannot overlap [off, off + len) of one still
 * running (a later frame may rewrite an earlier one's bytes), or NULL
 * after a write failed. */
static struct xpipe *
xs_take_pipe(struct xsess *ss, uint64_t off, size_t len)
{
  struct xpipe *free_one = NULL;
  pthread_mutex_lock(&ss->wlock);
  for (;;) {
    bool overlap = false;
    free_one = NULL;
    for (int i = 0; i < ss->npipes; i++) {
      struct xpipe *xp = &ss->pipes[i];
      if (!xp->busy)
        free_one = free_one ? free_one : xp;
      else if (xp->off < off + len && off < xp->off + xp->len)
        overlap = true;
    }
    if (ss->werr || (free_one && !overlap))
      break;
    pthread_cond_wait(&ss->wcond, &ss->wlock);
  }
  if (ss->werr)
    free_one = NULL;
  pthread_mutex_unlock(&ss->wlock);
  return free_one;
}

/* Says why a frame's payload stopped DONE bytes into its LEN at OFF. */
static void
xs_short_body(char *why, size_t whylen, int r, uint64_t done, uint64_t len,
              uint64_t off)
{
  snprintf(why, whylen, "%s %llu bytes into the %llu at offset %llu",
           r == -ECONNRESET ? "the sender closed the connection"
           : r == -ETIMEDOUT ? "nothing came for --body-timeout"
                             : strerror(-r),
           (unsigned long long)done, (unsigned long long)len,
           (unsigned long long)off);
}

/* Reads len bytes of body into e at off, in pieces of at most buf's
 * size (of a pipe's, spliced and written by workers, where the session
 * has pipes: the last of them may still be running on return). 0, or
 * -errno with what failed in why. */
static int
xs_body_into(struct xsess *ss, struct export *e, uint8_t *buf, size_t cap,
             uint64_t off, uint64_t len, char *why, size_t whylen)
{
  if (ss->npipes > 0) {
    for (uint64_t done = 0; done < len;) {
      size_t n = len - done < ss->pipe_size ? (size_t)(len - done)
                                            : ss->pipe_size;
      struct xpipe *xp = xs_take_pipe(ss, off + done, n);
      if (xp == NULL)
        return xs_wait_writes(ss, why, whylen);
      ssize_t got = xs_splice_pipe(ss, xp->fd[1], n);
      if (got < 0) {
        /* What reached the pipe is dropped with it: nothing of a frame
         * that did not arrive whole is written from this piece on. It
         * did arrive, and the message counts it. */
        char drain[4096];
        ssize_t k;
        uint64_t arrived = done;
        while ((k = read(xp->fd[0], drain, sizeof drain)) > 0)
          arrived += (uint64_t)k;
        xs_short_body(why, whylen, (int)got, arrived, len, off);
        return (int)got;
      }
      n = (size_t)got;
      xp->off = off + done;
      xp->len = n;
      pthread_mutex_lock(&ss->wlock);
      xp->busy = true;
      ss->wbusy++;
      pthread_mutex_unlock(&ss->wlock);
      xp->work.fn = xs_pipe_write;
      workq_push(ss->x->s->workq, &xp->work);
      done += n;
    }
    return 0;
  }
  for (uint64_t done = 0; done < len;) {
    size_t n = len - done < cap ? (size_t)(len - done) : cap, got;
    /* Only silence ends it: a slow sender that keeps sending is read
     * for as long as it takes. */
    int r = transport_recv_idle(&ss->tp, buf, n, xs_idle_ms(ss), &got);
    if (r < 0) {
      xs_short_body(why, whylen, r, done + got, len, off);
      return r;
    }
    r = xs_pwrite(e, buf, n, off + done);
    if (r < 0) {
      snprintf(why, whylen, "writing %zu bytes at offset %llu of export "
               "\"%s\": %s", n, (unsigned long long)(off + done), e->name,
               strerror(-r));
      return r;
    }
    done += n;
  }
  return 0;
}

/* One Chunked stream into e, to its end marker; then a flush. */
/* Splicing needs a plain socket and a backend that takes pipes. */
static void
xs_pipe_setup(struct xsess *ss, struct export *e)
{
  ss->exp = e;
  if (ss->tp.ops != &transport_plain_ops || e->ops->splice_in == NULL)
    return;
  for (int i = 0; i < XAPI_PIPES; i++) {
    struct xpipe *xp = &ss->pipes[i];
    if (pipe2(xp->fd, O_CLOEXEC | O_NONBLOCK) < 0)
      break;
    int sz = fcntl(xp->fd[1], F_SETPIPE_SZ, 1 << 20);
    size_t got = sz > 0 ? (size_t)sz : 65536;
    if (ss->pipe_size == 0 || got < ss->pipe_size)
      ss->pipe_size = got;
    xp->ss = ss;
    ss->npipes++;
  }
}

static int
xs_chunked(struct xsess *ss, struct export *e)
{
  xs_pipe_setup(ss, e);
  uint8_t *buf = malloc(CHUNKED_MAX_FRAME);
  if (buf == NULL) {
    log_error("%s: chunked: out of memory", ss->peer);
    return -ENOMEM;
  }
  uint64_t frames = 0, bytes = 0;
  char why[256];
  int r;
  for (;;) {
    uint8_t hdr[CHUNKED_HEADER_LEN];
    size_t got;
    r = transport_recv_idle(&ss->tp, hdr, sizeof hdr, xs_idle_ms(ss), &got);
    if (r == -ECONNRESET) {
      char part[64] = "";
      if (got > 0)
        snprintf(part, sizeof part, " and %zu of the next header's %zu "
                 "bytes", got, sizeof hdr);
      log_warn("%s: chunked into \"%s\": the stream ended without its end "
               "marker after %llu frames (%llu bytes)%s: incomplete, not "
               "flushed", ss->peer, e->name, (unsigned long long)frames,
               (unsigned long long)bytes, part);
      break;
    }
    if (r < 0) {
      log_warn("%s: chunked into \"%s\": reading frame %llu's header: %s",
               ss->peer, e->name, (unsigned long long)frames,
               r == -ETIMEDOUT ? "nothing came for --body-timeout"
                               : strerror(-r));
      break;
    }
    struct chunked_header h;
    chunked_get(hdr, &h);
    if (chunked_is_end(&h)) {
      r = xs_wait_writes(ss, why, sizeof why);
      if (r < 0) {
        log_warn("%s: chunked into \"%s\": %s; not flushed", ss->peer,
                 e->name, why);
        break;
      }
      r = e->ops->flush(e);
      if (r < 0)
        log_warn("%s: chunked into \"%s\": flush after %llu bytes: %s",
                 ss->peer, e->name, (unsigned long long)bytes,
                 strerror(-r));
      else
        log_info("%s: chunked into \"%s\": %llu bytes in %llu frames, "
                 "flushed", ss->peer, e->name, (unsigned long long)bytes,
                 (unsigned long long)frames);
      break;
    }
    int bad = chunked_check(&h, e->size);
    if (bad) {
      r = -bad;
      log_warn("%s: chunked into \"%s\": frame %llu at offset %llu, length "
               "%lu: %s; stopped, nothing of it written", ss->peer, e->name,
               (unsigned long long)frames, (unsigned long long)h.offset,
               (unsigned long)h.length,
               bad == EMSGSIZE ? "a length of 2^31 or more"
                               : "beyond the export's end");
      break;
    }
    r = xs_body_into(ss, e, buf, CHUNKED_MAX_FRAME, h.offset, h.length, why,
                     sizeof why);
    if (r < 0) {
      log_warn("%s: chunked into \"%s\": frame %llu: %s", ss->peer, e->name,
               (unsigned long long)frames, why);
      break;
    }
    frames++;
    bytes += h.length;
  }
  free(buf);
  return r;
}

/* ---- HTTP requests ---- */

static struct export *
xs_export(struct xsess *ss, const char *name)
{
  return server_find_export(ss->x->s, (const uint8_t *)name, strlen(name));
}

/* The answer after the body, to a client that sent "Expect:
 * 100-continue": 200 when it was stored whole, else 500 (the log says
 * why); the status is then its signal, and the close a plain one. */
static void
xs_final(struct xsess *ss)
{
  if (!ss->failed) {
    xs_answer(ss, 200, "OK", NULL, NULL);
    return;
  }
  xs_answer(ss, 500, "Internal Server Error", NULL,
            "the body was not stored whole: the server's log says why");
  /* The rest of the body may still come: a close with it unread would
   * be a reset, which can take the answer with it. Answered, the
   * session closes in order (xs_linger). */
  ss->failed = false;
}

static void
xs_import(struct xsess *ss, const struct http_request *rq)
{
  char vdi[256], fmt[32];
  int r = http_query_get(rq->query, "vdi", vdi, sizeof vdi);
  if (r <= 0) {
    xs_refuse(ss, 400, "Bad Request", r == 0
              ? "import_raw_vdi needs vdi=NAME"
              : "vdi= has a bad escape (%%XX, or %%00) or is over %zu "
                "bytes", sizeof vdi - 1);
    return;
  }
  r = http_query_get(rq->query, "format", fmt, sizeof fmt);
  if (r > 0 && strcmp(fmt, "raw") != 0) {
    xs_refuse(ss, 400, "Bad Request", "format=%s: only format=raw is "
              "received here", fmt);
    return;
  }
  struct export *e = xs_export(ss, vdi);
  if (e == NULL) {
    xs_refuse(ss, 404, "Not Found", "no export \"%s\"", vdi);
    return;
  }
  if (e->read_only) {
    xs_refuse(ss, 403, "Forbidden", "export \"%s\" is read-only", vdi);
    return;
  }
  if (!rq->chunked && !rq->has_length) {
    xs_refuse(ss, 411, "Length Required", "a raw body needs a "
              "Content-Length (or send Chunked with a 'chunked' key)");
    return;
  }
  if (!rq->chunked && rq->content_length > e->size) {
    xs_refuse(ss, 413, "Content Too Large", "a body of %llu bytes into "
              "export \"%s\" of %llu", (unsigned long long)rq->content_length,
              vdi, (unsigned long long)e->size);
    return;
  }
  /* xapi answers before the body, and its senders wait for that answer;
   * a client that asks to be told to go on (curl does) gets "100
   * Continue" instead, and the real answer once the body is stored. */
  bool later = rq->expect_continue;
  if (later) {
    static const char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
    (void)transport_send_buf(&ss->tp, go_on, sizeof go_on - 1, 0, 5000);
  } else {
    xs_answer(ss, 200, "OK", NULL, NULL);
  }
  if (rq->chunked) {
    ss->failed = xs_chunked(ss, e) < 0;
    if (later)
      xs_final(ss);
    return;
  }
  uint8_t *buf = malloc(CHUNKED_MAX_FRAME);
  char why[256] = "";
  if (buf == NULL) {
    log_warn("%s: raw body into \"%s\": out of memory", ss->peer, e->name);
    ss->failed = true;
    if (later)
      xs_final(ss);
    return;
  }
  xs_pipe_setup(ss, e);
  r = xs_body_into(ss, e, buf, CHUNKED_MAX_FRAME, 0, rq->content_length, why,
                   sizeof why);
  if (r == 0)
    r = xs_wait_writes(ss, why, sizeof why);
  free(buf);
  if (r == 0)
    r = e->ops->flush(e);
  ss->failed = r < 0;
  if (r < 0)
    log_warn("%s: raw body into \"%s\": %s", ss->peer, e->name,
             why[0] ? why : strerror(-r));
  else
    log_info("%s: raw body into \"%s\": %llu bytes, flushed", ss->peer,
             e->name, (unsigned long long)rq->content_length);
  if (later)
    xs_final(ss);
}

static void
xs_nbd(struct xsess *ss, const char *name)
{
  /* The path names the export: an empty name in the NBD handshake
   * means it on this connection (a client names another as it likes). */
  struct export *e = xs_export(ss, name);
  if (e == NULL) {
    xs_refuse(ss, 404, "Not Found", "no export \"%s\"", name);
    return;
  }
  xs_answer(ss, 200, "OK", "Transfer-encoding: nbd\r\n", NULL);
  /* The content length of 0 told nothing: NBD follows at once, inside
   * the HTTPS session when there is one (the connection takes it). */
  if (tls_is_tls(&ss->tp)) {
    if (server_adopt(ss->x->s, ss->fd, &ss->tp, e) == 0) {
      ss->tp.ops = NULL; /* the connection's now */
      ss->handed_over = true;
    }
    return;
  }
  ss->tp.ops->free(&ss->tp);
  ss->tp.ops = NULL;
  if (server_adopt(ss->x->s, ss->fd, NULL, e) == 0)
    ss->handed_over = true;
}

/* Whether the first byte from the client, before TLS starts, is an
 * ASCII capital (an HTTP method) where a ClientHello (0x16) belongs. */
static bool
xs_plain_at_https(struct xsess *ss, uint64_t deadline)
{
  struct pollfd pfd = { .fd = ss->fd, .events = POLLIN };
  int left = xs_left(deadline);
  if (left == 0 || poll(&pfd, 1, left) <= 0)
    return false; /* the handshake below times out and says so */
  unsigned char b;
  ssize_t n = recv(ss->fd, &b, 1, MSG_PEEK);
  return n == 1 && b >= 'A' && b <= 'Z';
}

static void
xs_http(struct xsess *ss)
{
  struct server *s = ss->x->s;
  uint64_t deadline = loop_now_ms() +
                      (uint64_t)(s->cfg.handshake_timeout > 0
                                     ? s->cfg.handshake_timeout : 30) * 1000;
  static __thread char head[HTTP_MAX_HEAD];
  if (s->tls && xs_plain_at_https(ss, deadline)) {
    /* Answered in plain text, as a client that sent plain text reads
     * it; its head is read first, so that the close sends no reset. */
    if (xs_read_head(ss, head, sizeof head, deadline) >= 0)
      xs_refuse(ss, 400, "Bad Request", "a plain HTTP request at an HTTPS "
                "port: use https://");
    return;
  }
  if (s->tls) {
    char err[256];
    bool ww;
    int r = tls_server_start(&ss->tp, s->tls, err, sizeof err);
    while (r == 0 && (r = tls_handshake_step(&ss->tp, &ww, err,
                                             sizeof err)) == -EAGAIN) {
      struct pollfd pfd = { .fd = ss->fd, .events = ww ? POLLOUT : POLLIN };
      int left = xs_left(deadline);
      if (left == 0 || poll(&pfd, 1, left) == 0) {
        snprintf(err, sizeof err, "timed out");
        r = -ETIMEDOUT;
        break;
      }
      r = 0;
    }
    if (r < 0) {
      log_warn("%s: https: TLS handshake: %s", ss->peer, err);
      return;
    }
    if (log_threshold >= LOG_DEBUG) {
      tls_describe(&ss->tp, err, sizeof err);
      log_debug("%s: https: TLS established: %s", ss->peer, err);
    }
  }
  ssize_t n = xs_read_head(ss, head, sizeof head, deadline);
  if (n < 0)
    return;
  struct http_request rq;
  char err[256];
  int r = http_parse_request(head, (size_t)n, &rq, err, sizeof err);
  if (r < 0) {
    xs_refuse(ss, r == -EMSGSIZE ? 414 : 400,
              r == -EMSGSIZE ? "URI Too Long" : "Bad Request", "%s", err);
    return;
  }
  if (rq.has_te) {
    xs_refuse(ss, 400, "Bad Request", "a Transfer-Encoding header: the "
              "body is raw (Content-Length) or Chunked (a 'chunked' key), "
              "never HTTP-encoded");
    return;
  }
  if (strcmp(rq.method, "PUT") != 0) {
    xs_refuse(ss, 405, "Method Not Allowed", "%s %s: only PUT is served",
              rq.method, rq.path);
    return;
  }
  if (server_stopping(s)) {
    /* An upload would be cut at the stop's deadline, whatever its size,
     * and the loops that would take an NBD connection drain and stop. */
    xs_refuse(ss, 503, "Service Unavailable", "the server is shutting "
              "down");
    return;
  }
  if (strcmp(rq.path, "/import_raw_vdi") == 0)
    xs_import(ss, &rq);
  else if (strncmp(rq.path, "/nbd/", 5) == 0)
    xs_nbd(ss, rq.path + 5);
  else if (strcmp(rq.path, "/nbd") == 0)
    xs_nbd(ss, "");
  else
    xs_refuse(ss, 404, "Not Found", "%s: the paths served are "
              "/import_raw_vdi and /nbd/NAME", rq.path);
}

/* ---- sessions ---- */

/* A session that went well closes in order: our side is shut (TLS
 * close_notify, FIN), then what the peer still sends is read and dropped
 * until its own close, for at most XS_LINGER_MS. Closing with its bytes
 * unread (a TLS sender's close_notify after the end marker) would send
 * a reset, which the sender rightly takes for a stream not stored. */
#define XS_LINGER_MS 1000

static void
xs_linger(struct xsess *ss)
{
  if (ss->tp.ops)
    (void)ss->tp.ops->shutdown(&ss->tp);
  else
    (void)shutdown(ss->fd, SHUT_WR);
  uint64_t start = loop_now_ms();
  char buf[4096];
  /* The bound holds while bytes keep coming too: a peer that never
   * stops sending must not hold this thread. */
  for (uint64_t spent; (spent = loop_now_ms() - start) < XS_LINGER_MS;) {
    ssize_t n = read(ss->fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return;
    if (n < 0) {
      struct pollfd pfd = { .fd = ss->fd, .events = POLLIN };
      (void)poll(&pfd, 1, (int)(XS_LINGER_MS - spent));
    }
  }
}

static void *
xs_thread(void *arg)
{
  struct xsess *ss = arg;
  struct xapi *x = ss->x;
  if (ss->kind == XAPI_HTTP) {
    xs_http(ss);
  } else {
    struct server *s = x->s;
    struct export *e = s->nexports ? s->exports[0] : NULL;
    if (e == NULL || e->read_only) {
      log_warn("%s: chunked: the default export is %s", ss->peer,
               e ? "read-only" : "missing");
      ss->failed = true; /* nothing stored: the sender must not think so */
    } else {
      ss->failed = xs_chunked(ss, e) < 0;
    }
  }
  if (!ss->failed && !ss->handed_over)
    xs_linger(ss);
  if (ss->tp.ops)
    ss->tp.ops->free(&ss->tp);
  (void)xs_wait_writes(ss, NULL, 0); /* workers hold pipes: wait */
  for (int i = 0; i < ss->npipes; i++) {
    close(ss->pipes[i].fd[0]);
    close(ss->pipes[i].fd[1]);
  }
  pthread_mutex_destroy(&ss->wlock);
  pthread_cond_destroy(&ss->wcond);
  /* Before the count below lets xapi_stop free x (and the server go):
   * nothing after the broadcast may touch either. */
  if (!ss->handed_over)
    server_release_slot(x->s);
  pthread_mutex_lock(&x->lock);
  if (ss->prev)
    ss->prev->next = ss->next;
  else
    x->sessions = ss->next;
  if (ss->next)
    ss->next->prev = ss->prev;
  if (!ss->handed_over) {
    if (ss->failed) {
      /* A reset, not a FIN: a sender waiting for the close after its
       * last frame learns that the stream was not stored. */
      struct linger lg = { .l_onoff = 1, .l_linger = 0 };
      (void)setsockopt(ss->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(ss->fd);
  }
  x->active--;
  pthread_cond_broadcast(&x->idle);
  pthread_mutex_unlock(&x->lock);
  free(ss);
  return NULL;
}

static void
xapi_accept(struct loop *l, int lfd, uint32_t events, void *arg)
{
  struct xapi *x = arg;
  (void)l;
  (void)events;
  enum xapi_kind kind = XAPI_HTTP;
  for (int i = 0; i < x->nfds; i++)
    if (x->fds[i] == lfd)
      kind = x->kinds[i];
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS ||
          err == ENOMEM) {
        if (!x->starved)
          log_warn("accept (%s): %s; pausing new connections until fds "
                   "are free", kind == XAPI_HTTP ? "http" : "chunked",
                   strerror(err));
        x->starved = true;
        if (x->paused_ms == 0) {
          for (int i = 0; i < x->nfds; i++)
            loop_mod(x->loop, x->fds[i], 0);
          x->paused_ms = loop_now_ms();
        }
      } else if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
        log_warn("accept (%s): %s", kind == XAPI_HTTP ? "http" : "chunked",
                 strerror(err));
      }
      return;
    }
    if (x->starved) {
      x->starved = false;
      log_info("accepting %s connections again",
               kind == XAPI_HTTP ? "http" : "chunked");
    }
    char peer[80];
    sock_peer_name(fd, peer, sizeof peer);
    if (server_take_slot(x->s) < 0) {
      log_warn("%s: refused: --max-connections reached", peer);
      close(fd);
      continue;
    }
    sock_set_nodelay(fd, true);
    struct xsess *ss = calloc(1, sizeof *ss);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&x->lock);
    bool ok = ss != NULL && !x->stopping;
    if (ok) {
      *ss = (struct xsess){ .x = x, .fd = fd, .kind = kind,
                            .next = x->sessions };
      pthread_mutex_init(&ss->wlock, NULL);
      pthread_cond_init(&ss->wcond, NULL);
      memcpy(ss->peer, peer, sizeof peer);
      transport_init_plain(&ss->tp, fd);
      if (x->sessions)
        x->sessions->prev = ss;
      x->sessions = ss;
      x->active++;
      ok = pthread_create(&t, &at, xs_thread, ss) == 0;
      if (!ok) {
        x->sessions = ss->next;
        if (x->sessions)
          x->sessions->prev = NULL;
        x->active--;
      }
    }
    pthread_mutex_unlock(&x->lock);
    pthread_attr_destroy(&at);
    if (!ok) {
      log_warn("%s: refused: cannot start a session thread", peer);
      free(ss);
      close(fd);
      server_release_slot(x->s);
    }
  }
}

static int
xapi_listen(struct xapi *x, const char *spec, enum xapi_kind kind,
            const char *what)
{
  char host[256], port[32];
  if (sock_split_hostport(spec, host, port, "") < 0 || port[0] == '\0') {
    log_error("bad %s address \"%s\": want HOST:PORT or [IPV6]:PORT", what,
              spec);
    return -EINVAL;
  }
  int room = (int)(sizeof x->fds / sizeof x->fds[0]) - x->nfds;
  int n = sock_listen_tcp(host, port, x->fds + x->nfds, room);
  if (n < 0) {
    if (sock_err_is_resolve(n))
      log_error("cannot resolve %s (%s): %s", host, what, sock_strerror(n));
    else
      log_error("cannot listen on %s port %s (%s): %s", host, port, what,
                strerror(-n));
    return n;
  }
  for (int i = 0; i < n; i++) {
    char name[64];
    x->kinds[x->nfds] = kind;
    sock_local_name(x->fds[x->nfds], name, sizeof name);
    log_info("listening on %s (%s)", name, what);
    int r = loop_add(x->loop, x->fds[x->nfds], EPOLLIN, xapi_accept, x);
    x->nfds++;
    if (r < 0) {
      log_error("cannot watch the %s listener: %s", what, strerror(-r));
      return r;
    }
  }
  return 0;
}

int
xapi_start(struct server *s, struct loop *l)
{
  if (s->cfg.http_listen == NULL && s->cfg.chunked_listen == NULL)
    return 0;
  struct xapi *x = calloc(1, sizeof *x);
  if (x == NULL)
    return -ENOMEM;
  x->s = s;
  x->loop = l;
  pthread_mutex_init(&x->lock, NULL);
  pthread_cond_init(&x->idle, NULL);
  s->xapi = x;
  int r = 0;
  if (s->cfg.http_listen)
    r = xapi_listen(x, s->cfg.http_listen, XAPI_HTTP,
                    s->tls ? "https" : "http");
  if (r == 0 && s->cfg.chunked_listen)
    r = xapi_listen(x, s->cfg.chunked_listen, XAPI_CHUNKED, "chunked");
  return r;
}

void
xapi_tick(struct server *s)
{
  struct xapi *x = s->xapi;
  if (x == NULL || x->paused_ms == 0 || loop_now_ms() - x->paused_ms < 1000)
    return;
  x->paused_ms = 0;
  for (int i = 0; i < x->nfds; i++)
    loop_mod(x->loop, x->fds[i], EPOLLIN);
}

void
xapi_stop_listening(struct server *s)
{
  struct xapi *x = s->xapi;
  if (x == NULL)
    return;
  for (int i = 0; i < x->nfds; i++) {
    loop_del(x->loop, x->fds[i]);
    close(x->fds[i]);
  }
  x->nfds = 0;
}

void
xapi_stop(struct server *s)
{
  struct xapi *x = s->xapi;
  if (x == NULL)
    return;
  xapi_stop_listening(s);
  pthread_mutex_lock(&x->lock);
  x->stopping = true;
  for (struct xsess *ss = x->sessions; ss; ss = ss->next)
    shutdown(ss->fd, SHUT_RDWR);
  while (x->active > 0)
    pthread_cond_wait(&x->idle, &x->lock);
  pthread_mutex_unlock(&x->lock);
  pthread_mutex_destroy(&x->lock);
  pthread_cond_destroy(&x->idle);
  free(x);
  s->xapi = NULL;
}
