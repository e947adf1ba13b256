/* endpoint_chunked.c: a destination that sends xapi's Chunked frames
 * (proto/chunked.h) over a socket, a TLS session after an HTTP(S) PUT, a
 * pipe or a file.
 *
 * Every WRITE becomes frames of at most CHUNKED_MAX_FRAME, each header
 * leaving with its payload in one writev/sendmsg (never a lone 12-byte
 * write, which Nagle and delayed ACKs would stall). A ZERO is sent as
 * frames of zeroes: the receiver's disk is not known to read as zeroes
 * unless the user said so (--target-is-zero), and then the engine sends
 * no ZERO at all. The FLUSH that ends a copy sends the end marker. An op
 * completes when the socket (or pipe) has taken its bytes: that is what
 * progress counts here, as there is no reply.
 *
 * Ops run on the worker pool in the order submitted, one frame at a time
 * under the sender's lock, so frames never interleave, and the socket
 * buffer keeps several in flight. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <unistd.h>

#include "copy/endpoint.h"
#include "net/loop.h"
#include "net/sock.h"
#include "net/tcpinfo.h"
#include "net/tls.h"
#include "proto/chunked.h"
#include "proto/http.h"

#define CHUNKED_ZERO_PIECE (64u << 10)
/* The send buffer a TCP stream asks for (the kernel doubles it): room
 * for the 6.25 MB that 1 Gbit/s holds in flight at 50 ms. bench/,
 * section xapi, compares it with the 4 MiB used before. */
#define CHUNKED_SNDBUF (16 << 20)

static const uint8_t chunked_zeros[CHUNKED_ZERO_PIECE];

struct chunked_priv {
  struct client_conn conn;  /* the socket and its transport (plain or
                             * TLS); conn.tp.ops NULL for a pipe or file */
  bool own_fd;              /* close conn.fd at the end ("-": stdout) */
  bool split_writes;        /* diagnostics: header and payload apart */
  struct ep_http *http;     /* an http(s) URL's; owned, or NULL */
  int timeout_ms;           /* one frame's send; -1: none */
  struct workq_owner owner;
  pthread_mutex_t lock;     /* one frame on the wire at a time */
  int err;                  /* sticky: positive errno once broken */
  bool ended;               /* the end marker went out */
  uint64_t sent;            /* bytes the socket took, headers included */
  bool tcp;                 /* conn.fd is a TCP socket: diagnostics */
  struct tcpinfo_stats ti;  /* sampled on the loop thread */
};

/* Sends iov whole: on a socket through its transport, on a pipe or file
 * by writev. 0 or -errno. */
static int
chunked_send(struct chunked_priv *p, struct iovec *iov, int cnt)
{
  if (p->conn.tp.ops)
    return transport_send_all(&p->conn.tp, iov, cnt, 0, p->timeout_ms);
  while (cnt > 0) {
    ssize_t n = writev(p->conn.fd, iov, cnt);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd pfd = { .fd = p->conn.fd, .events = POLLOUT };
      if (poll(&pfd, 1, p->timeout_ms) == 0)
        return -ETIMEDOUT;
      continue;
    }
    if (n < 0)
      return -errno;
    cnt = transport_iov_advance(&iov, cnt, (size_t)n);
  }
  return 0;
}

/* One frame whose payload is len bytes of file_fd at file_off: the header
 * with MSG_MORE, so that the kernel joins it to the payload that
 * sendfile(2) appends from the page cache. Plain sockets only. */
static int
chunked_frame_file(struct chunked_priv *p, uint64_t off, int file_fd,
                   uint64_t file_off, uint32_t len)
{
  uint8_t hdr[CHUNKED_HEADER_LEN];
  struct iovec iov = { hdr, sizeof hdr };
  chunked_put(hdr, off, len);
  int r = transport_send_all(&p->conn.tp, &iov, 1, TRANSPORT_SEND_MORE,
                             p->timeout_ms);
  off_t pos = (off_t)file_off;
  uint32_t done = 0;
  while (r == 0 && done < len) {
    ssize_t n = sendfile(p->conn.fd, file_fd, &pos, len - done);
    if (n > 0) {
      done += (uint32_t)n;
    } else if (n == 0) {
      r = -EIO; /* the file is shorter than its map said */
    } else if (errno == EAGAIN) {
      struct pollfd pfd = { .fd = p->conn.fd, .events = POLLOUT };
      if (poll(&pfd, 1, p->timeout_ms) == 0)
        r = -ETIMEDOUT;
    } else if (errno != EINTR) {
      r = -errno;
    }
  }
  if (r == 0)
    p->sent += sizeof hdr + len;
  return r;
}

/* One frame of len bytes at off: from buf, or zeroes when buf is NULL. */
static int
chunked_frame(struct chunked_priv *p, uint64_t off, const uint8_t *buf,
              uint32_t len)
{
  uint8_t hdr[CHUNKED_HEADER_LEN];
  struct iovec iov[1 + CHUNKED_MAX_FRAME / CHUNKED_ZERO_PIECE];
  int cnt = 1;
  chunked_put(hdr, off, len);
  iov[0] = (struct iovec){ hdr, sizeof hdr };
  if (buf) {
    iov[cnt++] = (struct iovec){ (void *)buf, len };
  } else {
    for (uint32_t done = 0; done < len; done += CHUNKED_ZERO_PIECE) {
      uint32_t n = len - done < CHUNKED_ZERO_PIECE ? len - done
                                                   : CHUNKED_ZERO_PIECE;
      iov[cnt++] = (struct iovec){ (void *)chunked_zeros, n };
    }
  }
  int r;
  if (p->split_writes) { /* as stock senders do: a lone 12-byte write */
    r = chunked_send(p, iov, 1);
    if (r == 0)
      r = chunked_send(p, iov + 1, cnt - 1);
  } else {
    r = chunked_send(p, iov, cnt);
  }
  if (r == 0)
    p->sent += sizeof hdr + len;
  return r;
}

/* Whether the receiver has closed its side already (EOF, or TLS
 * close_notify): before the end marker, that says it stopped reading
 * early. What it may have said meanwhile is read and dropped. */
static bool
chunked_peer_closed(struct chunked_priv *p)
{
  uint8_t buf[4096];
  for (int i = 0; i < 256; i++) { /* at most 1 MiB of chatter */
    ssize_t n = p->conn.tp.ops->recv(&p->conn.tp, buf, sizeof buf);
    if (n > 0)
      continue;
    return n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR);
  }
  return false;
}

/* After the end marker on a connection: Chunked has no reply, but a
 * receiver closes the connection once the whole stream is stored (xapi
 * does, as xapi's sparse_dd waits for; nbdflow serve does after its
 * flush). One that stopped early resets it instead: closed with bytes
 * still unread, or on purpose after a failed write or flush. Without this
 * wait the frames that the socket buffers held would count as delivered,
 * and the copy would succeed with part of the disk lost. Our side is shut
 * first (FIN, or TLS close_notify), for a receiver that reads to the end
 * of the stream before it closes. 0 at an orderly close; -ECONNRESET (and
 * a sentence in errmsg) or another -errno. */
static int
chunked_await_close(struct chunked_priv *p, char *errmsg, size_t errlen)
{
  (void)p->conn.tp.ops->shutdown(&p->conn.tp);
  /* --timeout 0 waits forever, as everywhere. */
  uint64_t wait_ms = p->timeout_ms < 0 ? UINT64_MAX
                     : (uint64_t)p->timeout_ms * ENDPOINT_FLUSH_TIMEOUT_FACTOR;
  uint64_t start = loop_now_ms();
  uint8_t buf[4096];
  for (;;) {
    uint64_t now = loop_now_ms();
    if (now - start >= wait_ms) {
      snprintf(errmsg, errlen, "the receiver did not close the connection "
               "within %llu s of the end marker: whether it stored the "
               "stream is not known", (unsigned long long)(wait_ms / 1000));
      return -ETIMEDOUT;
    }
    ssize_t n = p->conn.tp.ops->recv(&p->conn.tp, buf, sizeof buf);
    if (n == 0)
      return 0;
    if (n > 0)
      continue; /* the receiver may say something: nothing depends on it */
    if (n != -EAGAIN && n != -EINTR) {
      snprintf(errmsg, errlen, "after the end marker the receiver %s: it "
               "did not store the whole stream (its log says why)",
               n == -ECONNRESET ? "reset the connection"
                                : "broke the connection");
      return (int)n;
    }
    uint64_t left = wait_ms - (loop_now_ms() - start);
    struct pollfd pfd = { .fd = p->conn.fd, .events = POLLIN };
    (void)poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
  }
}

static void
chunked_work(struct work *w)
{
  struct ep_op *op = (struct ep_op *)((char *)w - offsetof(struct ep_op, work));
  struct endpoint *e = op->ep;
  struct chunked_priv *p = e->priv;
  int r = 0;
  pthread_mutex_lock(&p->lock);
  if (p->err) {
    r = -p->err;
  } else if (p->ended) {
    r = -EPIPE;
    snprintf(op->errmsg, sizeof op->errmsg, "the stream has ended");
  } else if (op->type == EP_FLUSH) {
    uint8_t hdr[CHUNKED_HEADER_LEN] = { 0 };
    struct iovec iov = { hdr, sizeof hdr };
    if (p->conn.tp.ops && chunked_peer_closed(p)) {
      /* Its close after the end marker is what says all was stored. */
      r = -ECONNRESET;
      snprintf(op->errmsg, sizeof op->errmsg, "the receiver closed its "
               "side before the end of the stream: it did not take all of "
               "it");
    } else {
      r = chunked_send(p, &iov, 1);
    }
    if (r == 0) {
      p->ended = true;
      p->sent += sizeof hdr;
      if (p->conn.tp.ops)
        r = chunked_await_close(p, op->errmsg, sizeof op->errmsg);
    }
  } else {
    const uint8_t *buf = op->type == EP_WRITE ? op->buf : NULL;
    bool file = op->type == EP_WRITE && op->from_file;
    for (uint64_t done = 0; r == 0 && done < op->length;) {
      uint64_t n = op->length - done;
      if (n > CHUNKED_MAX_FRAME)
        n = CHUNKED_MAX_FRAME;
      if (file)
        r = chunked_frame_file(p, op->offset + done, op->file_fd,
                               op->file_off + done, (uint32_t)n);
      else
        r = chunked_frame(p, op->offset + done, buf ? buf + done : NULL,
                          (uint32_t)n);
      done += n;
    }
  }
  if (r < 0 && p->err == 0)
    p->err = -r;
  /* Every op the broken stream fails says why, not only the first: the
   * engine may report any of them. */
  if ((r == -EPIPE || r == -ECONNRESET) && op->errmsg[0] == '\0')
    snprintf(op->errmsg, sizeof op->errmsg, "the receiver closed the "
             "connection after %llu bytes of frames",
             (unsigned long long)p->sent);
  pthread_mutex_unlock(&p->lock);
  op->err = -r;
  ep_env_complete(e->env, op);
}

static int
chunked_submit(struct endpoint *e, struct ep_op *op)
{
  struct chunked_priv *p = e->priv;
  if (op->type != EP_WRITE && op->type != EP_ZERO && op->type != EP_FLUSH)
    return -EBADF;
  if (op->type == EP_WRITE && op->from_file && !e->can_send_file)
    return -EINVAL;
  op->work.fn = chunked_work;
  workq_push_owned(e->env->wq, &op->work, &p->owner);
  return 0;
}

static void
chunked_close(struct endpoint *e)
{
  struct chunked_priv *p = e->priv;
  if (p == NULL)
    return;
  if (p->own_fd) {
    client_drop_socket(&p->conn);
  } else if (p->conn.tp.ops) {
    p->conn.tp.ops->free(&p->conn.tp);
  }
  pthread_mutex_destroy(&p->lock);
  ep_http_free(p->http); /* after the TLS session that used its creds */
  free(p);
  e->priv = NULL;
}

/* The TCP diagnostics of the one connection, as the NBD endpoint gives
 * them (stalls, segments, RTT): TCP_INFO may be read from any thread. */
static double
chunked_sample_tcp(struct endpoint *e, uint64_t *samples)
{
  struct chunked_priv *p = e->priv;
  if (!p->tcp)
    return -1;
  tcpinfo_sample(&p->ti, p->conn.fd);
  *samples = p->ti.samples;
  return p->ti.samples ? 100.0 * (double)p->ti.stall_samples /
                             (double)p->ti.samples
                       : 0;
}

static uint32_t
chunked_sample_rtt(struct endpoint *e)
{
  struct chunked_priv *p = e->priv;
  return p->tcp && p->ti.samples ? p->ti.min_rtt_us : 0;
}

static int
chunked_tcp_json(struct endpoint *e, char *buf, size_t len)
{
  struct chunked_priv *p = e->priv;
  if (!p->tcp)
    return -1;
  tcpinfo_sample(&p->ti, p->conn.fd);
  if (p->ti.samples == 0)
    return -1;
  return tcpinfo_format_json(&p->ti, buf, len) < 0 ? -1 : 0;
}

/* An https URL's session: the one connection. */
static int
chunked_tls(struct endpoint *e, struct tls_params *out, bool *uniform)
{
  struct chunked_priv *p = e->priv;
  *uniform = true;
  return tls_params_get(&p->conn.tp, out) < 0 ? -1 : 0;
}

static const struct endpoint_ops chunked_ops = {
  .kind = "chunked",
  .submit = chunked_submit,
  .close = chunked_close,
  .sample_rtt = chunked_sample_rtt,
  .tcp_json = chunked_tcp_json,
  .tls = chunked_tls,
  .sample_tcp = chunked_sample_tcp,
};

int
endpoint_open_chunked(struct ep_env *env, const char *spec,
                      struct client_conn *conn, bool own_fd,
                      struct ep_http *http, const struct endpoint_opts *o,
                      struct endpoint **out, char *err, size_t errlen)
{
  struct chunked_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, spec, &chunked_ops, p) : NULL;
  if (e == NULL) {
    free(p);
    if (own_fd)
      client_drop_socket(conn);
    ep_http_free(http);
    snprintf(err, errlen, "%s: out of memory", spec);
    return -ENOMEM;
  }
  p->conn = *conn;
  p->own_fd = own_fd;
  p->http = http;
  p->split_writes = o->split_writes;
  p->timeout_ms = o->timeout_s ? (int)o->timeout_s * 1000 : -1;
  pthread_mutex_init(&p->lock, NULL);
  if (p->conn.tp.ops) {
    sock_set_nonblock(p->conn.fd, true);
    p->tcp = sock_is_tcp(p->conn.fd);
  }
  /* A plain socket takes payloads straight from the source's file. */
  e->can_send_file = p->conn.tp.ops == &transport_plain_ops &&
                     !p->split_writes;
  e->loopback = sock_is_tcp_loopback(p->conn.fd);
  if (p->tcp) {
    /* One connection carries the whole stream, and a frame is done when
     * the socket takes it: the send buffer is the window. Autotuning
     * stops at tcp_wmem's maximum (Linux's default: 4 MiB), under the
     * 6.25 MB that 1 Gbit/s holds in flight at 50 ms, and SO_SNDBUF at
     * wmem_max; the kernel counts each segment's overhead too.
     * CHUNKED_SNDBUF where the process may (root, as xapi's sparse_dd
     * runs), else wmem_max. */
    int eff;
    sock_set_sndbuf_force(p->conn.fd, CHUNKED_SNDBUF, &eff);
    tcpinfo_init(&p->ti);
    tcpinfo_sample(&p->ti, p->conn.fd);
  }
  e->writable = true;
  e->can_zero = true;      /* as frames of zeroes */
  e->can_flush = true;     /* the end marker */
  e->size = o->create_size;
  e->size_known = o->create_size != UINT64_MAX;
  e->align = CHUNKED_ALIGN;
  e->max_request = CHUNKED_MAX_FRAME;
  *out = e;
  return 0;
}

/* "chunked+tcp://HOST:PORT" or "chunked+unix:///PATH": connects. */
int
endpoint_chunked_addr(const char *spec, char *host, size_t hostlen,
                      const char **port, char *err, size_t errlen)
{
  if (strncmp(spec, "chunked+unix://", 15) == 0) {
    if (spec[15] != '/') {
      snprintf(err, errlen, "%s: chunked+unix:// takes an absolute path "
               "(chunked+unix:///PATH)", spec);
      return -EINVAL;
    }
    return 1;
  }
  const char *hp = spec + 14; /* "chunked+tcp://" */
  const char *end, *p;
  if (hp[0] == '[') {
    end = strchr(hp, ']');
    if (end == NULL || end[1] != ':' || (size_t)(end - hp - 1) >= hostlen) {
      snprintf(err, errlen, "%s: expected chunked+tcp://[ADDR]:PORT", spec);
      return -EINVAL;
    }
    memcpy(host, hp + 1, (size_t)(end - hp - 1));
    host[end - hp - 1] = '\0';
    p = end + 2;
  } else {
    end = strrchr(hp, ':');
    if (end == NULL || end == hp || (size_t)(end - hp) >= hostlen) {
      snprintf(err, errlen, "%s: expected chunked+tcp://HOST:PORT", spec);
      return -EINVAL;
    }
    memcpy(host, hp, (size_t)(end - hp));
    host[end - hp] = '\0';
    p = end + 1;
  }
  char *pend;
  unsigned long pv = strtoul(p, &pend, 10);
  if (*p < '0' || *p > '9' || *pend != '\0' || pv == 0 || pv > 65535) {
    snprintf(err, errlen, "%s: bad port '%s' (a number from 1 to 65535)",
             spec, p);
    return -EINVAL;
  }
  *port = p;
  return 0;
}

int
endpoint_open_chunked_socket(struct ep_env *env, const char *spec,
                             const struct endpoint_opts *o,
                             struct endpoint **out, char *err, size_t errlen)
{
  struct client_conn c;
  memset(&c, 0, sizeof c);
  int timeout = client_handshake_ms(o->timeout_s);
  int fd;
  char host[256];
  const char *port;
  int r = endpoint_chunked_addr(spec, host, sizeof host, &port, err, errlen);
  if (r < 0)
    return r;
  if (r == 1) {
    fd = sock_connect_unix(spec + 15, timeout, NULL, NULL);
    if (fd >= 0) {
      int eff;
      sock_set_sndbuf(fd, 4 << 20, &eff);
    }
  } else {
    fd = sock_connect_tcp(host, port, timeout, NULL, NULL);
    if (fd >= 0 && !o->nagle)
      sock_set_nodelay(fd, true);
  }
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s: %s", spec,
             sock_err_is_resolve(fd) ? "cannot resolve the host" : "connect",
             sock_strerror(fd));
    return fd;
  }
  c.fd = fd;
  transport_init_plain(&c.tp, fd);
  return endpoint_open_chunked(env, spec, &c, true, NULL, o, out, err,
                               errlen);
}

int
nbd_uri_from_http(const struct ep_http *x, const char *export_name,
                  struct nbd_uri *u, char *err, size_t errlen)
{
  memset(u, 0, sizeof *u);
  u->tls_verify_peer = -1;
  u->host = strdup(x->url->host);
  u->port = strdup(x->url->port);
  u->export_name = strdup(export_name ? export_name : "");
  if (u->host && u->port && u->export_name)
    return 0;
  uri_free(u);
  snprintf(err, errlen, "out of memory");
  return -ENOMEM;
}

void
ep_http_free(struct ep_http *x)
{
  if (x == NULL)
    return;
  client_drop_socket(&x->body);
  tls_creds_free(x->creds);
  if (x->url)
    http_url_free(x->url);
  free(x->url);
  free(x);
}

/* An http(s) URL: the PUT, then NBD on the same socket when the answer
 * says "Transfer-Encoding: nbd" (endpoint_nbd.c, which repeats the PUT
 * for every further connection), else Chunked frames as the body. */
int
endpoint_open_http(struct ep_env *env, const char *spec,
                   const struct endpoint_opts *o, struct endpoint **out,
                   char *err, size_t errlen)
{
  const char *name = o->shown ? o->shown : spec; /* for messages */
  if (!o->write) {
    snprintf(err, errlen, "%s: an http(s) URL is a destination only (xapi "
             "receives uploads there)", name);
    return -EINVAL;
  }
  struct ep_http *x = calloc(1, sizeof *x);
  struct http_url *u = calloc(1, sizeof *u);
  if (x == NULL || u == NULL) {
    free(x);
    free(u);
    snprintf(err, errlen, "%s: out of memory", name);
    return -ENOMEM;
  }
  x->body.fd = -1;
  char why[224];
  int r = http_url_parse(spec, u, why, sizeof why);
  if (r < 0) {
    free(u);
    free(x);
    snprintf(err, errlen, "%s: %s", name, why);
    return r;
  }
  x->url = u;
  x->h = (struct client_http){
    .url = u,
    .chunked_cookie = o->protocol != EP_PROTO_NBD,
    .need_nbd = o->protocol == EP_PROTO_NBD,
    .body = &x->body,
    .tls_start = u->tls,
    .tls = { .certs_dir = o->tls_certificates,
             .hostname = o->tls_chain_only ? NULL
                         : o->tls_server_name ? o->tls_server_name : u->host,
             .verify_peer = !o->no_tls_verify,
             .priority = o->tls_priority,
             .ca_file = o->tls_ca_file,
             .sni = o->tls_server_name ? o->tls_server_name : u->host },
  };
  if (u->tls &&
      (r = tls_creds_client_new(&x->h.tls, &x->creds, why, sizeof why)) < 0) {
    snprintf(err, errlen, "%s: TLS credentials: %s", name, why);
    ep_http_free(x);
    return r;
  }
  if (o->protocol == EP_PROTO_CHUNKED) {
    /* One connection, whose answer must expect the body. */
    struct client_conn c;
    memset(&c, 0, sizeof c);
    int fd = sock_connect_tcp(u->host, u->port,
                              client_handshake_ms(o->timeout_s), NULL, NULL);
    if (fd < 0) {
      if (sock_err_is_resolve(fd))
        snprintf(err, errlen, "%s: cannot resolve %s: %s", name, u->host,
                 sock_strerror(fd));
      else
        snprintf(err, errlen, "%s: connect to %s port %s: %s", name, u->host,
                 u->port, sock_strerror(fd));
      ep_http_free(x);
      return fd;
    }
    if (!o->nagle)
      sock_set_nodelay(fd, true);
    c.fd = fd;
    transport_init_plain(&c.tp, fd);
    r = client_http_put(&c, &x->h, x->creds,
                        client_handshake_ms(o->timeout_s));
    if (r == 0) {
      snprintf(c.errmsg, sizeof c.errmsg, "the server answered with "
               "'Transfer-Encoding: nbd': use --dst-protocol nbd (or "
               "auto)");
      r = -EPROTO;
    }
    if (r < 0) {
      snprintf(err, errlen, "%s: %s", name, c.errmsg);
      client_drop_socket(&c);
      ep_http_free(x);
      return r;
    }
    return endpoint_open_chunked(env, name, &c, true, x, o, out, err,
                                 errlen);
  }
  struct endpoint_opts no = *o;
  no.http = x;
  r = endpoint_open_nbd(env, name, &no, out, err, errlen);
  if (r != CLIENT_HTTP_BODY)
    return r; /* x belongs to the NBD endpoint, or was freed with it */
  /* The answer expects a body: Chunked on that connection. */
  struct client_conn c = x->body;
  memset(&x->body, 0, sizeof x->body);
  x->body.fd = -1;
  return endpoint_open_chunked(env, name, &c, true, x, o, out, err, errlen);
}
