/* tls.c: the TLS transport over GnuTLS, and credential loading. See tls.h
 * for the send semantics, which everything here serves. */
#include "tls.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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
#define TLS_PSK_LINE_MAX 4096
#define TLS_PSK_KEY_MIN 4 /* bytes: GnuTLS clients take no shorter key */
/* TLS 1.2 and later only (§TLS versions). AEAD ciphers only, AES-GCM
 * first and the server's order winning: with AES-NI, GnuTLS runs
 * AES-128-GCM about ten times faster than ChaCha20 here, and a client
 * left to choose often picks the slow one. */
#define TLS_PRIO_BASE "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:" \
  "-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:" \
  "+AES-128-CCM:+AES-256-CCM:%SERVER_PRECEDENCE"
#define TLS_PRIO_PSK ":+ECDHE-PSK:+DHE-PSK:+PSK"
/* Anonymous key exchange exists in TLS 1.2 only. */
#define TLS_PRIO_ANON ":-VERS-TLS1.3:+ANON-ECDH:+ANON-DH"

/* A server's credentials, or a client's for one server: loaded once,
 * then shared, read-only, by every session that uses them. */
struct tls_creds {
  /* Server: --tls-certs and/or --tls-psk. Client: exactly one of x509,
   * psk_client and anon. */
  gnutls_certificate_credentials_t x509;
  gnutls_psk_server_credentials_t psk;
  gnutls_psk_client_credentials_t psk_client;
  gnutls_anon_client_credentials_t anon;
  gnutls_priority_t prio;
  bool verify_peer; /* server: demand a client certificate */
};

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

static void
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

/* The priority string both ends use: TLS 1.2 and 1.3, AEAD ciphers with
 * AES-GCM first, plus the PSK key exchanges when psk, or only TLS 1.2 and
 * the anonymous ones when anon; or the user's own, given. On failure
 * *prio is NULL, err says why, and the result is -EINVAL. */
static int
tls_priority(gnutls_priority_t *prio, bool psk, bool anon, const char *given,
             char *err, size_t errlen)
{
  const char *s = given  ? given
                  : psk  ? TLS_PRIO_BASE TLS_PRIO_PSK
                  : anon ? TLS_PRIO_BASE TLS_PRIO_ANON
                         : TLS_PRIO_BASE;
  int r = gnutls_priority_init(prio, s, NULL);
  if (r < 0) {
    *prio = NULL;
    tls_err(err, errlen, "TLS priority \"%s\": %s", s, gnutls_strerror(r));
    return -EINVAL;
  }
  return 0;
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

/* Fills buf with as many records as have arrived, so that a large
 * payload costs the caller one call rather than one per record. An error
 * after some bytes is kept for the next call; an EOF recurs by itself. */
static ssize_t
tls_recv(struct transport *t, void *buf, size_t len)
{
  struct tls_session *ts = t->priv;
  size_t done = 0;

  if (ts->rx_err) {
    int e = ts->rx_err;
    ts->rx_err = 0;
    return e;
  }
  while (done < len) {
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
  if (hangup) {
    /* A server with PSK alone shows no certificate to reject. */
    snprintf(extra, sizeof extra, " (the peer hung up%s)",
             ts->server && ts->x509 ? "; did it reject our certificate?"
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

void
tls_describe(struct transport *t, char *buf, size_t len)
{
  struct tls_session *ts = t->priv;
  const char *ver = gnutls_protocol_get_name(gnutls_protocol_get_version(ts->s));
  const char *cipher = gnutls_cipher_get_name(gnutls_cipher_get(ts->s));
  const char *who = "";
  char user[160] = "";
  if (gnutls_auth_get_type(ts->s) == GNUTLS_CRD_PSK) {
    const char *u = ts->server ? gnutls_psk_server_get_username(ts->s) : NULL;
    if (u) {
      snprintf(user, sizeof user, ", PSK user \"%.100s\"", u);
      who = user;
    } else {
      who = ", PSK";
    }
  } else if (gnutls_certificate_get_peers(ts->s, NULL)) {
    who = ", peer certificate verified";
  } else {
    who = ", X.509";
  }
  snprintf(buf, len, "%s %s%s", ver ? ver : "?", cipher ? cipher : "?", who);
}

/* ---- server credentials ---- */

static char *
tls_path(const char *dir, const char *name)
{
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* Checks a psktool file: "username:hexkey" lines. Returns 0 or -errno. */
static int
tls_psk_check(const char *file, char *err, size_t errlen)
{
  FILE *f = fopen(file, "r");
  if (f == NULL) {
    int e = errno;
    tls_err(err, errlen, "cannot read PSK file %s: %s", file, strerror(e));
    return -e;
  }
  char line[TLS_PSK_LINE_MAX];
  int lineno = 0, keys = 0, r = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strcspn(line, "\n");
    if (line[n] != '\n' && !feof(f)) {
      tls_err(err, errlen, "PSK file %s line %d: longer than %d bytes",
              file, lineno, TLS_PSK_LINE_MAX - 2);
      r = -EINVAL;
      break;
    }
    /* GnuTLS reads the server's file itself, and takes a carriage
     * return for part of the key: every handshake would then fail. */
    if (n > 0 && line[n - 1] == '\r') {
      tls_err(err, errlen, "PSK file %s line %d ends in a carriage return "
              "(DOS line ends?); write it with \\n line ends, as psktool "
              "does", file, lineno);
      r = -EINVAL;
      break;
    }
    line[n] = '\0';
    if (n == 0)
      continue;
    char *colon = strchr(line, ':');
    const char *hex = colon ? colon + 1 : "";
    size_t hl = strlen(hex);
    bool ok = colon && colon > line && hl > 0 && hl % 2 == 0;
    for (size_t i = 0; ok && i < hl; i++)
      ok = isxdigit((unsigned char)hex[i]);
    if (!ok) {
      tls_err(err, errlen, "PSK file %s line %d: expected "
              "\"username:hexkey\"", file, lineno);
      r = -EINVAL;
      break;
    }
    if (hl < 2 * TLS_PSK_KEY_MIN) {
      /* GnuTLS clients refuse them ("The request is invalid"). */
      tls_err(err, errlen, "PSK file %s line %d: a key of %zu bytes; at "
              "least %d are needed", file, lineno, hl / 2, TLS_PSK_KEY_MIN);
      r = -EINVAL;
      break;
    }
    keys++;
  }
  explicit_bzero(line, sizeof line);
  fclose(f);
  if (r == 0 && keys == 0) {
    tls_err(err, errlen, "PSK file %s holds no key", file);
    r = -EINVAL;
  }
  return r;
}

/* 0 when path can be read, else -errno (-ENOENT: there is none). GnuTLS
 * says only "Error while reading file", without the file or the reason. */
static int
tls_readable(const char *path)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  close(fd);
  return 0;
}

/* Both files of a certificate and its key can be read, or err says which
 * cannot, and why. */
static int
tls_pair_readable(const char *cert, const char *key, char *err,
                  size_t errlen)
{
  const char *path[2] = { cert, key };
  for (int i = 0; i < 2; i++) {
    int r = tls_readable(path[i]);
    if (r < 0) {
      tls_err(err, errlen, "cannot read %s: %s", path[i], strerror(-r));
      return r;
    }
  }
  return 0;
}

static int
tls_creds_load_x509(struct tls_creds *c, const char *dir, bool verify,
                    char *err, size_t errlen)
{
  char *ca = tls_path(dir, TLS_CA_CERT);
  char *cert = tls_path(dir, TLS_SERVER_CERT);
  char *key = tls_path(dir, TLS_SERVER_KEY);
  int ret = -ENOMEM, r;

  if (ca == NULL || cert == NULL || key == NULL)
    goto cleanup;
  r = gnutls_certificate_allocate_credentials(&c->x509);
  if (r < 0) {
    c->x509 = NULL;
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    goto cleanup;
  }
  ret = -EINVAL;
  if (tls_pair_readable(cert, key, err, errlen) < 0)
    goto cleanup;
  r = gnutls_certificate_set_x509_key_file(c->x509, cert, key,
                                           GNUTLS_X509_FMT_PEM);
  if (r < 0) {
    tls_err(err, errlen, "cannot load %s with key %s: %s", cert, key,
            gnutls_strerror(r));
    goto cleanup;
  }
  r = tls_readable(ca);
  if (r < 0 && r != -ENOENT) {
    tls_err(err, errlen, "cannot read CA certificate %s: %s", ca,
            strerror(-r));
    goto cleanup;
  }
  if (r == 0) {
    r = gnutls_certificate_set_x509_trust_file(c->x509, ca,
                                               GNUTLS_X509_FMT_PEM);
    if (r <= 0) {
      tls_err(err, errlen, "cannot load CA certificate %s: %s", ca,
              r < 0 ? gnutls_strerror(r) : "no certificate in it");
      goto cleanup;
    }
  } else if (verify) {
    tls_err(err, errlen, "--tls-verify-peer needs %s to check client "
            "certificates", ca);
    goto cleanup;
  }
  ret = 0;
cleanup:
  if (ret == -ENOMEM && err[0] == '\0')
    tls_err(err, errlen, "out of memory");
  free(ca);
  free(cert);
  free(key);
  return ret;
}

/* Empty credentials, and err cleared; NULL with err set. */
static struct tls_creds *
tls_creds_alloc(char *err, size_t errlen)
{
  if (errlen)
    err[0] = '\0';
  struct tls_creds *c = calloc(1, sizeof *c);
  if (c == NULL)
    tls_err(err, errlen, "out of memory");
  return c;
}

int
tls_creds_server_new(const struct tls_server_config *cfg,
                     struct tls_creds **out, char *err, size_t errlen)
{
  struct tls_creds *c = tls_creds_alloc(err, errlen);
  int r;

  if (c == NULL)
    return -ENOMEM;
  c->verify_peer = cfg->verify_peer;
  if (cfg->certs_dir == NULL && cfg->psk_file == NULL) {
    tls_err(err, errlen, "TLS needs credentials: --tls-certs DIR or "
            "--tls-psk FILE");
    r = -EINVAL;
    goto fail;
  }
  if (cfg->certs_dir) {
    r = tls_creds_load_x509(c, cfg->certs_dir, cfg->verify_peer, err, errlen);
    if (r < 0)
      goto fail;
  }
  if (cfg->psk_file) {
    r = tls_psk_check(cfg->psk_file, err, errlen);
    if (r < 0)
      goto fail;
    r = gnutls_psk_allocate_server_credentials(&c->psk);
    if (r >= 0)
      r = gnutls_psk_set_server_credentials_file(c->psk, cfg->psk_file);
    if (r < 0) {
      tls_err(err, errlen, "PSK file %s: %s", cfg->psk_file,
              gnutls_strerror(r));
      r = -EINVAL;
      goto fail;
    }
  }
  r = tls_priority(&c->prio, cfg->psk_file != NULL, false, NULL, err,
                   errlen);
  if (r < 0)
    goto fail;
  *out = c;
  return 0;
fail:
  tls_creds_free(c);
  return r;
}

void
tls_creds_free(struct tls_creds *c)
{
  if (c == NULL)
    return;
  if (c->x509)
    gnutls_certificate_free_credentials(c->x509);
  if (c->psk)
    gnutls_psk_free_server_credentials(c->psk);
  if (c->psk_client)
    gnutls_psk_free_client_credentials(c->psk_client);
  if (c->anon)
    gnutls_anon_free_client_credentials(c->anon);
  if (c->prio)
    gnutls_priority_deinit(c->prio);
  free(c);
}

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

/* Finds user's key in a psktool file; *key is a new hex string. */
static int
tls_psk_find(const char *file, const char *user, char **key, char *err,
             size_t errlen)
{
  int r = tls_psk_check(file, err, errlen);
  if (r < 0)
    return r;
  FILE *f = fopen(file, "r");
  if (f == NULL) {
    int e = errno;
    tls_err(err, errlen, "cannot read PSK file %s: %s", file, strerror(e));
    return -e;
  }
  char line[TLS_PSK_LINE_MAX];
  size_t ul = strlen(user);
  r = -ENOENT;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (strncmp(line, user, ul) == 0 && line[ul] == ':') {
      *key = strdup(line + ul + 1);
      r = *key ? 0 : -ENOMEM;
      break;
    }
  }
  explicit_bzero(line, sizeof line);
  fclose(f);
  if (r == -ENOENT) {
    char esc[LOG_ESCAPE_BUF]; /* the name comes from a URI: any bytes */
    tls_err(err, errlen, "PSK file %s has no key for user \"%s\"", file,
            log_escape(esc, user, strlen(user)));
  }
  return r;
}

/* X.509: the CA to check the server with (or the system's, or none
 * when nothing is checked), and a client certificate when the directory
 * has one. */
static int
tls_client_load_x509(gnutls_certificate_credentials_t x509,
                     const struct tls_client_config *cfg, char *err,
                     size_t errlen)
{
  int r;
  if (cfg->certs_dir == NULL) {
    if (!cfg->verify_peer)
      return 0;
    r = gnutls_certificate_set_x509_system_trust(x509);
    if (r <= 0) {
      tls_err(err, errlen, "no system CA certificates to verify the server "
              "with (give tls-certificates=DIR)");
      return -ENOENT;
    }
    return 0;
  }
  char *ca = tls_path(cfg->certs_dir, TLS_CA_CERT);
  char *cert = tls_path(cfg->certs_dir, TLS_CLIENT_CERT);
  char *key = tls_path(cfg->certs_dir, TLS_CLIENT_KEY);
  r = -ENOMEM;
  if (ca && cert && key) {
    r = tls_readable(ca);
    if (r < 0 && r != -ENOENT)
      tls_err(err, errlen, "cannot read CA certificate %s: %s", ca,
              strerror(-r));
    else if (r == 0) {
      int n = gnutls_certificate_set_x509_trust_file(x509, ca,
                                                     GNUTLS_X509_FMT_PEM);
      if (n <= 0) {
        tls_err(err, errlen, "cannot load CA certificate %s: %s", ca,
                n < 0 ? gnutls_strerror(n) : "no certificate in it");
        r = -EINVAL;
      }
    } else if (cfg->verify_peer) {
      tls_err(err, errlen, "no %s to verify the server with", ca);
    } else {
      r = 0;
    }
    /* A client certificate is optional; its key is not, once it is
     * there. */
    if (r == 0 && tls_readable(cert) != -ENOENT &&
        (r = tls_pair_readable(cert, key, err, errlen)) == 0) {
      int n = gnutls_certificate_set_x509_key_file(x509, cert, key,
                                                   GNUTLS_X509_FMT_PEM);
      if (n < 0) {
        tls_err(err, errlen, "cannot load %s with key %s: %s", cert, key,
                gnutls_strerror(n));
        r = -EINVAL;
      }
    }
  } else {
    tls_err(err, errlen, "out of memory");
  }
  free(ca);
  free(cert);
  free(key);
  return r;
}

/* PSK: the user's key from the psktool file. */
static int
tls_client_load_psk(gnutls_psk_client_credentials_t psk,
                    const struct tls_client_config *cfg, char *err,
                    size_t errlen)
{
  const char *user = cfg->username;
  if (user == NULL)
    user = getenv("LOGNAME");
  if (user == NULL)
    user = getlogin();
  if (user == NULL) {
    tls_err(err, errlen, "no PSK username (put it in the URI: "
            "nbds://USER@HOST/)");
    return -EINVAL;
  }
  char *hex = NULL;
  int r = tls_psk_find(cfg->psk_file, user, &hex, err, errlen);
  if (r < 0)
    return r;
  gnutls_datum_t key = { (unsigned char *)hex, (unsigned)strlen(hex) };
  r = gnutls_psk_set_client_credentials(psk, user, &key, GNUTLS_PSK_KEY_HEX);
  explicit_bzero(hex, strlen(hex));
  free(hex);
  if (r < 0) {
    tls_err(err, errlen, "PSK file %s: %s", cfg->psk_file,
            gnutls_strerror(r));
    return -EINVAL;
  }
  return 0;
}

int
tls_creds_client_new(const struct tls_client_config *cfg,
                     struct tls_creds **out, char *err, size_t errlen)
{
  struct tls_creds *c = tls_creds_alloc(err, errlen);
  int r;

  if (c == NULL)
    return -ENOMEM;
  if (cfg->anon)
    r = gnutls_anon_allocate_client_credentials(&c->anon);
  else if (cfg->psk_file)
    r = gnutls_psk_allocate_client_credentials(&c->psk_client);
  else
    r = gnutls_certificate_allocate_credentials(&c->x509);
  if (r < 0) {
    c->anon = NULL;
    c->psk_client = NULL;
    c->x509 = NULL;
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    r = -ENOMEM;
    goto fail;
  }
  if (c->psk_client)
    r = tls_client_load_psk(c->psk_client, cfg, err, errlen);
  else if (c->x509)
    r = tls_client_load_x509(c->x509, cfg, err, errlen);
  if (r < 0)
    goto fail;
  r = tls_priority(&c->prio, cfg->psk_file != NULL, cfg->anon,
                   cfg->priority, err, errlen);
  if (r < 0)
    goto fail;
  *out = c;
  return 0;
fail:
  tls_creds_free(c);
  return r;
}

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
    if (cfg->hostname && !tls_is_ip(cfg->hostname))
      gnutls_server_name_set(ts->s, GNUTLS_NAME_DNS, cfg->hostname,
                             strlen(cfg->hostname));
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
