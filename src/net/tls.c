/* tls.c: the TLS session over GnuTLS, as a transport: its handshake, its
 * record I/O with the socket-side buffers, and corking. The credentials
 * it is started with are tls_creds.c's. See tls.h for the send
 * semantics, which everything here serves. */
#include "tls.h"
#include "tls_priv.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "net/loop.h"
#include "util/log.h"

#define TLS_RECORD_MAX 16384 /* the TLS maximum plaintext per record */

/* Socket-side buffers (bytes of records, never plaintext). The receive
 * buffer lets one recv(2) serve many records, where GnuTLS alone would
 * read each record with two (header, then body); the send buffer lets one
 * send(2) carry many records, where GnuTLS alone would send each on its
 * own. 128 KiB holds seven full records. */
#define TLS_RX_BUF (128 * 1024)
#define TLS_TX_BUF (128 * 1024)

/* One session: the transport's priv. */
struct tls_session {
  gnutls_session_t s;
  int fd;
  bool server;
  bool psk; /* PSK credentials are on the session */
  bool x509; /* a server with a certificate to show */
  bool handshake_done;
  bool gather; /* inside sendv/flush: the push may keep records in tx */
  bool held; /* the last send used MSG_MORE: the kernel may hold a tail */
  size_t rec_max; /* plaintext per record, at most TLS_RECORD_MAX */
  gnutls_typed_vdata_st vdata[2]; /* what the peer's certificate is
                                     checked against (tls_verify_as) */
  bool verify; /* the handshake checks the peer's certificate */
  /* Record buffer, owned by the session: plaintext of the record being
   * gathered or, when pending is set, of the record GnuTLS has encrypted
   * and needs gnutls_record_send to be repeated for. */
  uint8_t rec[TLS_RECORD_MAX];
  size_t rec_len;
  bool pending;
  /* Receiving side only (the pull function): bytes read from the socket
   * and not yet handed to GnuTLS are rx[rx_off, rx_len). epoll cannot see
   * them, so pending() counts them. */
  uint8_t *rx;
  size_t rx_off, rx_len;
  uint64_t rx_taken; /* bytes handed to GnuTLS so far: its progress */
  int rx_err; /* an error met after recv had bytes to return: next call */
  /* Sending side only (the push function): encrypted records accepted
   * from GnuTLS and not yet on the socket are tx[tx_off, tx_len). GnuTLS
   * counts them as sent; flush completes them. */
  uint8_t *tx;
  size_t tx_off, tx_len;
  /* The fatal alert the peer ended the session with (GnuTLS's static
   * name for it), or NULL: read by tls_peer_alert for error messages. */
  const char *peer_alert;
};

void
tls_err(char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;
  if (errlen == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- socket I/O under GnuTLS ---- */

/* Writes tx to the socket: 0 when it is empty, -EAGAIN when the socket is
 * full (the rest stays in tx), -errno. more: further bytes follow at once
 * (MSG_MORE, so the kernel builds full segments). */
static int
tls_tx_drain(struct tls_session *ts, bool more)
{
  int flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0);
  while (ts->tx_off < ts->tx_len) {
    ssize_t n = send(ts->fd, ts->tx + ts->tx_off, ts->tx_len - ts->tx_off,
                     flags);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    }
    ts->held = more;
    ts->tx_off += (size_t)n;
  }
  ts->tx_off = ts->tx_len = 0;
  return 0;
}

/* GnuTLS hands us each encrypted record here. Inside sendv/flush (gather
 * set) the record is copied into tx and counts as sent; tx goes to the
 * socket when the next record would not fit, and at the end of the
 * message. Elsewhere (handshake, alerts, close_notify) GnuTLS expects its
 * bytes on the wire when we say so: tx is written out first, then the
 * record straight from GnuTLS's memory. A refusal (-1, errno EAGAIN)
 * makes GnuTLS keep the record and report GNUTLS_E_AGAIN. */
static ssize_t
tls_push(gnutls_transport_ptr_t ptr, const giovec_t *iov, int iovcnt)
{
  struct tls_session *ts = ptr;
  size_t total = 0;
  int r;

  for (int i = 0; i < iovcnt; i++)
    total += iov[i].iov_len;
  if (ts->gather && total <= TLS_TX_BUF) {
    if (ts->tx_len + total > TLS_TX_BUF) {
      r = tls_tx_drain(ts, true);
      if (r < 0 && r != -EAGAIN) {
        errno = -r;
        return -1;
      }
      if (ts->tx_off > 0) { /* keep what the socket left at the front */
        memmove(ts->tx, ts->tx + ts->tx_off, ts->tx_len - ts->tx_off);
        ts->tx_len -= ts->tx_off;
        ts->tx_off = 0;
      }
      if (ts->tx_len + total > TLS_TX_BUF) {
        errno = EAGAIN;
        return -1;
      }
    }
    for (int i = 0; i < iovcnt; i++) {
      memcpy(ts->tx + ts->tx_len, iov[i].iov_base, iov[i].iov_len);
      ts->tx_len += iov[i].iov_len;
    }
    return (ssize_t)total;
  }
  r = tls_tx_drain(ts, true);
  if (r < 0) {
    errno = -r;
    return -1;
  }
  struct msghdr m = { .msg_iov = (struct iovec *)iov,
                      .msg_iovlen = (size_t)iovcnt };
  for (;;) {
    ssize_t n = sendmsg(ts->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      ts->held = false;
      return n;
    }
    if (errno != EINTR)
      return -1; /* GnuTLS reads errno */
  }
}

/* GnuTLS asks for a record header, then for its body: both are served
 * from rx, which one recv fills with as much as the socket holds. */
static ssize_t
tls_pull(gnutls_transport_ptr_t ptr, void *buf, size_t len)
{
  struct tls_session *ts = ptr;
  if (ts->rx_off == ts->rx_len) {
    ssize_t n;
    ts->rx_off = ts->rx_len = 0;
    do
      n = recv(ts->fd, ts->rx, TLS_RX_BUF, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
      return n; /* GnuTLS reads errno */
    ts->rx_len = (size_t)n;
  }
  size_t k = ts->rx_len - ts->rx_off;
  if (k > len)
    k = len;
  memcpy(buf, ts->rx + ts->rx_off, k);
  ts->rx_off += k;
  ts->rx_taken += k;
  return (ssize_t)k;
}

/* Why a client's handshake met no TLS at all, when the stream's first
 * bytes are still in rx and say so (an HTTP answer, an NBD greeting);
 * NULL otherwise. Only a hint for the error message. */
static const char *
tls_not_tls(const struct tls_session *ts)
{
  if (ts->server || ts->rx_taken > ts->rx_len)
    return NULL; /* rx[0] is not the stream's first byte */
  if (ts->rx_len >= 5 && memcmp(ts->rx, "HTTP/", 5) == 0)
    return "the peer answered in plain HTTP, not TLS: http://?";
  if (ts->rx_len >= 8 && memcmp(ts->rx, "NBDMAGIC", 8) == 0)
    return "the peer sent an NBD greeting, not TLS: an NBD port?";
  return NULL;
}

/* Calls to GnuTLS in a row that tls_again allows: a bound for a peer
 * that sends a flood of tiny records. Honest peers need a few. */
#define TLS_AGAIN_MAX 1024

/* GnuTLS answers AGAIN after each record of a handshake message split over
 * several records, and after a post-handshake message (a TLS 1.3 session
 * ticket or key update), even when what follows is already in rx, where
 * epoll cannot see it. True when GnuTLS should be called again at once:
 * it took bytes since taken_before, more wait in rx, and it is not
 * waiting to write. */
static bool
tls_again(struct tls_session *ts, uint64_t taken_before)
{
  return ts->rx_taken != taken_before && ts->rx_off < ts->rx_len &&
         gnutls_record_get_direction(ts->s) == 0;
}

static int
tls_pull_timeout(gnutls_transport_ptr_t ptr, unsigned int ms)
{
  struct tls_session *ts = ptr;
  if (ts->rx_off < ts->rx_len)
    return 1;
  struct pollfd p = { .fd = ts->fd, .events = POLLIN };
  int r = poll(&p, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int)ms);
  return r < 0 ? -1 : r;
}

/* Has the handshake verify the peer's certificate chain, its purpose
 * (GNUTLS_KP_TLS_WWW_SERVER or _CLIENT: a certificate issued to a client
 * cannot pose as a server) and, unless host is NULL, its name. GnuTLS
 * keeps pointers to the data, so it lives in ts; host must outlive ts. */
static void
tls_verify_as(struct tls_session *ts, const char *purpose, const char *host)
{
  unsigned n = 0;
  ts->vdata[n++] = (gnutls_typed_vdata_st){
    .type = GNUTLS_DT_KEY_PURPOSE_OID, .data = (unsigned char *)purpose };
  if (host)
    ts->vdata[n++] = (gnutls_typed_vdata_st){
      .type = GNUTLS_DT_DNS_HOSTNAME, .data = (unsigned char *)host };
  gnutls_session_set_verify_cert2(ts->s, ts->vdata, n, 0);
  ts->verify = true;
}

/* Maps a fatal GnuTLS result to -errno. */
static int
tls_errno(int r)
{
  switch (r) {
  case GNUTLS_E_PUSH_ERROR:
    return -EPIPE;
  case GNUTLS_E_PULL_ERROR:
    return -ECONNRESET;
  case GNUTLS_E_MEMORY_ERROR:
    return -ENOMEM;
  case GNUTLS_E_DECRYPTION_FAILED:
    return -EBADMSG;
  default:
    return -EPROTO;
  }
}

/* ---- the transport ---- */

/* One record's worth (or less) of plaintext. */
static ssize_t
tls_recv_record(struct tls_session *ts, void *buf, size_t len)
{
  /* Warning alerts are skipped; each one consumed input, and the bound
   * keeps a peer from holding the loop with a flood of them. */
  for (int i = 0, again = 0; i < 64; i++) {
    uint64_t taken = ts->rx_taken;
    ssize_t n = gnutls_record_recv(ts->s, buf, len);
    if (n >= 0)
      return n;
    if (n == GNUTLS_E_AGAIN) {
      if (!tls_again(ts, taken) || ++again > TLS_AGAIN_MAX)
        return -EAGAIN;
      i--; /* not an alert: the bound above is for those */
      continue;
    }
    if (n == GNUTLS_E_INTERRUPTED)
      continue;
    if (n == GNUTLS_E_PREMATURE_TERMINATION)
      return 0; /* closed without close_notify: an EOF like any other */
    if (n == GNUTLS_E_REHANDSHAKE) {
      log_debug("TLS: peer asked for renegotiation; refusing");
      return -EPROTO;
    }
    if (!gnutls_error_is_fatal((int)n))
      continue;
    if (n == GNUTLS_E_FATAL_ALERT_RECEIVED)
      ts->peer_alert = gnutls_alert_get_name(gnutls_alert_get(ts->s));
    log_debug("TLS receive: %s", gnutls_strerror((int)n));
    return tls_errno((int)n);
  }
  return -EPROTO;
}

/* Bytes of records one tls_recv takes at most: a peer sending records
 * of one byte would otherwise have a single call decrypt millions. */
#define TLS_RECV_WIRE_MAX (1024 * 1024)

/* Fills buf with as many records as have arrived, so that a large
 * payload costs the caller one call rather than one per record, up to
 * TLS_RECV_WIRE_MAX of them. An error after some bytes is kept for the
 * next call; an EOF recurs by itself. */
static ssize_t
tls_recv(struct transport *t, void *buf, size_t len)
{
  struct tls_session *ts = t->priv;
  size_t done = 0;
  uint64_t taken0 = ts->rx_taken;

  if (ts->rx_err) {
    int e = ts->rx_err;
    ts->rx_err = 0;
    return e;
  }
  while (done < len) {
    if (done > 0 && ts->rx_taken - taken0 >= TLS_RECV_WIRE_MAX)
      break;
    ssize_t n = tls_recv_record(ts, (uint8_t *)buf + done, len - done);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (done == 0)
      return n;
    if (n < 0 && n != -EAGAIN)
      ts->rx_err = (int)n;
    break;
  }
  return (ssize_t)done;
}

/* Completes what gnutls_record_send left: 0 when done, -EAGAIN, -errno. */
static int
tls_result(struct tls_session *ts, ssize_t r)
{
  if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED) {
    ts->pending = true;
    return -EAGAIN;
  }
  ts->pending = false;
  if (r < 0) {
    log_debug("TLS send: %s", gnutls_strerror((int)r));
    return tls_errno((int)r);
  }
  if ((size_t)r < ts->rec_len) /* only if the record limit shrank */
    memmove(ts->rec, ts->rec + r, ts->rec_len - (size_t)r);
  ts->rec_len -= (size_t)r;
  return 0;
}

/* Hands the record buffer to GnuTLS (all of it, in as few records as the
 * session allows). Under gather. */
static int
tls_send_rec(struct tls_session *ts)
{
  while (ts->rec_len > 0) {
    /* While pending, GnuTLS wants these very arguments again. */
    int r = tls_result(ts, gnutls_record_send(ts->s, ts->rec, ts->rec_len));
    if (r < 0)
      return r;
  }
  return 0;
}

/* sendv's work, under gather. */
static ssize_t
tls_sendv_gather(struct tls_session *ts, const struct iovec *iov, int iovcnt,
                 bool more_msg)
{
  size_t done = 0;
  int r;

  if (ts->pending) {
    r = tls_send_rec(ts);
    if (r < 0)
      return r;
  }
  for (int i = 0; i < iovcnt; i++) {
    const uint8_t *p = iov[i].iov_base;
    size_t n = iov[i].iov_len;
    while (n > 0) {
      if (ts->rec_len > 0 || n < ts->rec_max) {
        /* Gather small pieces (and the start of a payload after a
         * header) into one record. */
        size_t k = ts->rec_max - ts->rec_len;
        if (k > n)
          k = n;
        memcpy(ts->rec + ts->rec_len, p, k);
        ts->rec_len += k;
        p += k;
        n -= k;
        done += k;
        if (ts->rec_len < ts->rec_max)
          continue;
        r = tls_send_rec(ts);
        if (r == -EAGAIN)
          return (ssize_t)done; /* GnuTLS holds the record */
        if (r < 0)
          return r;
        continue;
      }
      /* A whole record straight from the caller's memory. */
      size_t k = ts->rec_max;
      ssize_t s = gnutls_record_send(ts->s, p, k);
      if (s == GNUTLS_E_AGAIN || s == GNUTLS_E_INTERRUPTED) {
        /* GnuTLS wants the same call repeated: keep a copy of the
         * arguments, so the caller's memory is free from now on. */
        memcpy(ts->rec, p, k);
        ts->rec_len = k;
        ts->pending = true;
        return (ssize_t)(done + k);
      }
      if (s < 0) {
        log_debug("TLS send: %s", gnutls_strerror((int)s));
        return tls_errno((int)s);
      }
      p += s;
      n -= (size_t)s;
      done += (size_t)s;
    }
  }
  if (!more_msg) {
    /* The message is complete: its last records go to the socket now,
     * as far as the socket takes them (flush does the rest). */
    r = tls_send_rec(ts);
    if (r == 0)
      r = tls_tx_drain(ts, false);
    if (r < 0 && r != -EAGAIN)
      return r;
  }
  return (ssize_t)done;
}

static ssize_t
tls_sendv(struct transport *t, const struct iovec *iov, int iovcnt,
          int flags)
{
  struct tls_session *ts = t->priv;
  ts->gather = true;
  ssize_t r = tls_sendv_gather(ts, iov, iovcnt, flags & TRANSPORT_SEND_MORE);
  ts->gather = false;
  return r;
}

static int
tls_flush(struct transport *t)
{
  struct tls_session *ts = t->priv;
  ts->gather = true;
  int r = tls_send_rec(ts);
  ts->gather = false;
  if (r == 0)
    r = tls_tx_drain(ts, false);
  if (r < 0)
    return r;
  if (ts->held) {
    /* Bytes went out with MSG_MORE and nothing followed: setting
     * TCP_NODELAY again pushes the kernel's queue (fails harmlessly on
     * Unix sockets, which ignore MSG_MORE anyway). */
    int one = 1;
    setsockopt(ts->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ts->held = false;
  }
  return 0;
}

static size_t
tls_pending(struct transport *t)
{
  struct tls_session *ts = t->priv;
  return gnutls_record_check_pending(ts->s) + (ts->rx_len - ts->rx_off);
}

static uint64_t
tls_wire_in(struct transport *t)
{
  struct tls_session *ts = t->priv;
  return ts->rx_taken;
}

static int
tls_shutdown(struct transport *t)
{
  struct tls_session *ts = t->priv;
  if (ts->handshake_done) {
    tls_flush(t);
    /* One try: close_notify is a courtesy, never worth blocking for. */
    gnutls_bye(ts->s, GNUTLS_SHUT_WR);
  }
  return shutdown(t->fd, SHUT_WR) < 0 ? -errno : 0;
}

static void
tls_session_free(struct tls_session *ts)
{
  if (ts->s)
    gnutls_deinit(ts->s);
  free(ts->rx);
  free(ts->tx);
  free(ts);
}

static void
tls_free(struct transport *t)
{
  tls_session_free(t->priv);
  t->priv = NULL;
}

static const struct transport_ops tls_ops = {
  .name = "tls",
  .recv = tls_recv,
  .sendv = tls_sendv,
  .flush = tls_flush,
  .pending = tls_pending,
  .wire_in = tls_wire_in,
  .shutdown = tls_shutdown,
  .free = tls_free,
};

bool
tls_is_tls(const struct transport *t)
{
  return t->ops == &tls_ops;
}

const char *
tls_peer_alert(const struct transport *t)
{
  if (!tls_is_tls(t) || t->priv == NULL)
    return NULL;
  return ((const struct tls_session *)t->priv)->peer_alert;
}

/* A session on fd, with our I/O functions; flags as gnutls_init's. */
static struct tls_session *
tls_session_new(int fd, unsigned flags, char *err, size_t errlen)
{
  struct tls_session *ts = calloc(1, sizeof *ts);
  if (ts)
    ts->rx = malloc(TLS_RX_BUF);
  if (ts && ts->rx)
    ts->tx = malloc(TLS_TX_BUF);
  if (ts == NULL || ts->tx == NULL) {
    tls_err(err, errlen, "out of memory");
    if (ts)
      free(ts->rx);
    free(ts);
    return NULL;
  }
  int r = gnutls_init(&ts->s, flags | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);
  if (r < 0) {
    tls_err(err, errlen, "gnutls_init: %s", gnutls_strerror(r));
    ts->s = NULL;
    tls_session_free(ts);
    return NULL;
  }
  ts->fd = fd;
  ts->server = flags & GNUTLS_SERVER;
  ts->rec_max = TLS_RECORD_MAX;
  gnutls_transport_set_ptr(ts->s, ts);
  gnutls_transport_set_vec_push_function(ts->s, tls_push);
  gnutls_transport_set_pull_function(ts->s, tls_pull);
  gnutls_transport_set_pull_timeout_function(ts->s, tls_pull_timeout);
  return ts;
}

/* A client with a PSK got the fatal alert a server sends for a key that
 * does not match or a user it does not know (GnuTLS: illegal parameter
 * for a TLS 1.3 binder that does not verify). */
static bool
tls_psk_refused(const struct tls_session *ts)
{
  if (ts->server || !ts->psk)
    return false;
  switch (gnutls_alert_get(ts->s)) {
  case GNUTLS_A_ILLEGAL_PARAMETER:
  case GNUTLS_A_DECRYPT_ERROR:
  case GNUTLS_A_BAD_RECORD_MAC:
  case GNUTLS_A_UNKNOWN_PSK_IDENTITY:
    return true;
  default:
    return false;
  }
}

int
tls_handshake_step(struct transport *t, bool *want_write, char *err,
                   size_t errlen)
{
  struct tls_session *ts = t->priv;
  int r;

  *want_write = false;
  for (int i = 0, again = 0; i < 16; i++) {
    uint64_t taken = ts->rx_taken;
    r = gnutls_handshake(ts->s);
    if (r == GNUTLS_E_SUCCESS) {
      size_t max = gnutls_record_get_max_size(ts->s);
      ts->rec_max = max > 0 && max < TLS_RECORD_MAX ? max : TLS_RECORD_MAX;
      ts->handshake_done = true;
      return 0;
    }
    if (r == GNUTLS_E_AGAIN) {
      if (tls_again(ts, taken) && ++again <= TLS_AGAIN_MAX) {
        i--; /* a message in several records: read on */
        continue;
      }
      *want_write = gnutls_record_get_direction(ts->s) == 1;
      return -EAGAIN;
    }
    if (gnutls_error_is_fatal(r))
      break;
  }
  char extra[512] = "";
  bool hangup = r == GNUTLS_E_PULL_ERROR || r == GNUTLS_E_PUSH_ERROR ||
                r == GNUTLS_E_PREMATURE_TERMINATION;
  /* Tell the peer why, so that its user sees more than a closed socket.
   * One try: the socket may be full, and this is a courtesy. */
  if (!hangup)
    gnutls_alert_send_appropriate(ts->s, r);
  const char *plain = tls_not_tls(ts);
  if (plain != NULL) {
    snprintf(extra, sizeof extra, " (%s)", plain);
  } else if (hangup) {
    /* A server with PSK alone shows no certificate to reject. */
    snprintf(extra, sizeof extra, " (the peer hung up%s)",
             ts->server && ts->x509 ? "; did it reject our certificate?"
             : !ts->server && ts->rx_taken == 0
                 ? " without a byte of TLS: is that port TLS at all?"
                 : "");
  } else if (r == GNUTLS_E_RECEIVED_ILLEGAL_PARAMETER && ts->psk) {
    /* TLS 1.3 reports a PSK binder that does not verify this way. */
    snprintf(extra, sizeof extra, " (with PSK: an unknown username, or "
             "another key)");
  } else if (r == GNUTLS_E_FATAL_ALERT_RECEIVED && tls_psk_refused(ts)) {
    /* GnuTLS's own words ("A TLS fatal alert has been received.
     * (Illegal parameter)") leave the user to guess which parameter. */
    tls_err(err, errlen, "the server rejected the PSK user name or key "
            "(its alert: %s)", gnutls_alert_get_name(gnutls_alert_get(ts->s)));
    return -EACCES;
  } else if (r == GNUTLS_E_FATAL_ALERT_RECEIVED) {
    snprintf(extra, sizeof extra, " (peer's alert: %s)",
             gnutls_alert_get_name(gnutls_alert_get(ts->s)));
  } else if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR ||
             r == GNUTLS_E_CERTIFICATE_ERROR) {
    gnutls_datum_t out = { NULL, 0 };
    unsigned status = gnutls_session_get_verify_cert_status(ts->s);
    if (gnutls_certificate_verification_status_print(
          status, GNUTLS_CRT_X509, &out, 0) == 0) {
      snprintf(extra, sizeof extra, " (%s)", (const char *)out.data);
      gnutls_free(out.data);
    }
  }
  tls_err(err, errlen, "%s%s", gnutls_strerror(r), extra);
  switch (r) {
  case GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR:
  case GNUTLS_E_CERTIFICATE_ERROR:
  case GNUTLS_E_NO_CERTIFICATE_FOUND:
  case GNUTLS_E_DECRYPTION_FAILED: /* a wrong PSK shows as this */
    return -EACCES;
  case GNUTLS_E_PULL_ERROR:
  case GNUTLS_E_PUSH_ERROR:
  case GNUTLS_E_PREMATURE_TERMINATION:
    return -ECONNRESET;
  default:
    return -EPROTO;
  }
}

int
tls_params_get(const struct transport *t, struct tls_params *p)
{
  if (!tls_is_tls(t) || t->priv == NULL)
    return -EINVAL;
  const struct tls_session *ts = t->priv;
  const char *ver = gnutls_protocol_get_name(gnutls_protocol_get_version(ts->s));
  const char *cipher = gnutls_cipher_get_name(gnutls_cipher_get(ts->s));
  p->version = ver ? ver : "?";
  p->cipher = cipher ? cipher : "?";
  switch (gnutls_auth_get_type(ts->s)) {
  case GNUTLS_CRD_PSK:
    p->auth = "psk";
    break;
  case GNUTLS_CRD_ANON:
    p->auth = "anon";
    break;
  default:
    /* A handshake that was told to verify (tls_verify_as) fails unless
     * the peer's certificate passed. */
    p->auth = ts->verify ? "x509-verified" : "x509";
    break;
  }
  return 0;
}

void
tls_describe(struct transport *t, char *buf, size_t len)
{
  struct tls_params p;
  char user[160] = "";
  if (tls_params_get(t, &p) < 0) {
    snprintf(buf, len, "no TLS");
    return;
  }
  const struct tls_session *ts = t->priv;
  if (ts->server && strcmp(p.auth, "psk") == 0) {
    const char *u = gnutls_psk_server_get_username(ts->s);
    if (u)
      snprintf(user, sizeof user, " user \"%.100s\"", u);
  }
  snprintf(buf, len, "%s %s, %s%s", p.version, p.cipher, p.auth, user);
}

/* ---- server side ---- */

int
tls_server_start(struct transport *t, const struct tls_creds *creds,
                 char *err, size_t errlen)
{
  struct tls_session *ts = tls_session_new(t->fd, GNUTLS_SERVER, err,
                                           errlen);
  if (ts == NULL)
    return -ENOMEM;
  int r = gnutls_priority_set(ts->s, creds->prio);
  if (r >= 0 && creds->x509) {
    r = gnutls_credentials_set(ts->s, GNUTLS_CRD_CERTIFICATE, creds->x509);
    ts->x509 = true;
    if (creds->verify_peer) {
      gnutls_certificate_server_set_request(ts->s, GNUTLS_CERT_REQUIRE);
      tls_verify_as(ts, GNUTLS_KP_TLS_WWW_CLIENT, NULL);
    } else {
      gnutls_certificate_server_set_request(ts->s, GNUTLS_CERT_IGNORE);
    }
  }
  if (r >= 0 && creds->psk) {
    r = gnutls_credentials_set(ts->s, GNUTLS_CRD_PSK, creds->psk);
    ts->psk = true;
  }
  if (r < 0) {
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    tls_session_free(ts);
    return -EPROTO;
  }
  t->ops = &tls_ops;
  t->priv = ts;
  return 0;
}

/* ---- client side ---- */

/* True when s is an IP literal (no SNI for those, RFC 6066). */
static bool
tls_is_ip(const char *s)
{
  struct in6_addr a6;
  struct in_addr a4;
  return inet_pton(AF_INET, s, &a4) == 1 || inet_pton(AF_INET6, s, &a6) == 1;
}

int
tls_client_start(struct transport *t, const struct tls_client_config *cfg,
                 const struct tls_creds *creds, int timeout_ms,
                 char *err, size_t errlen)
{
  uint64_t deadline = timeout_ms < 0 ? 0 : loop_now_ms() + (uint64_t)timeout_ms;
  struct tls_session *ts = tls_session_new(t->fd, GNUTLS_CLIENT, err, errlen);
  int r;

  if (ts == NULL)
    return -ENOMEM;
  r = gnutls_priority_set(ts->s, creds->prio);
  if (r >= 0 && creds->anon)
    r = gnutls_credentials_set(ts->s, GNUTLS_CRD_ANON, creds->anon);
  else if (r >= 0 && creds->psk_client)
    r = gnutls_credentials_set(ts->s, GNUTLS_CRD_PSK, creds->psk_client);
  else if (r >= 0)
    r = gnutls_credentials_set(ts->s, GNUTLS_CRD_CERTIFICATE, creds->x509);
  if (r < 0) {
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    r = -EPROTO;
    goto fail;
  }
  ts->psk = creds->psk_client != NULL;
  if (creds->x509) {
    if (cfg->verify_peer)
      tls_verify_as(ts, GNUTLS_KP_TLS_WWW_SERVER, cfg->hostname);
    const char *sni = cfg->sni ? cfg->sni : cfg->hostname;
    if (sni && !tls_is_ip(sni))
      gnutls_server_name_set(ts->s, GNUTLS_NAME_DNS, sni, strlen(sni));
  }

  struct transport tt = { .ops = &tls_ops, .fd = t->fd, .priv = ts };
  for (;;) {
    bool ww;
    r = tls_handshake_step(&tt, &ww, err, errlen);
    if (r != -EAGAIN)
      break;
    int ms = -1;
    if (deadline) {
      uint64_t now = loop_now_ms();
      if (now >= deadline) {
        tls_err(err, errlen, "TLS handshake timed out");
        r = -ETIMEDOUT;
        break;
      }
      ms = (int)(deadline - now);
    }
    struct pollfd p = { .fd = t->fd, .events = ww ? POLLOUT : POLLIN };
    if (poll(&p, 1, ms) < 0 && errno != EINTR) {
      r = -errno;
      tls_err(err, errlen, "poll: %s", strerror(errno));
      break;
    }
  }
  if (r < 0)
    goto fail;
  *t = tt;
  return 0;
fail:
  tls_session_free(ts);
  return r;
}
