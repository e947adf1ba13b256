/* transport.h: the table of byte-moving functions under a connection.
 *
 * Protocol code calls only these; it never asks whether TLS is on. The
 * plain transport is installed at accept/connect time and swapped for the
 * TLS one after STARTTLS. All functions are non-blocking unless named
 * _all; the _all helpers wait with poll(2) up to a timeout.
 *
 * Corking: TRANSPORT_SEND_MORE says "more of this message follows soon";
 * the plain transport turns it into MSG_MORE, TLS into record corking. */
#ifndef NBDFLOW_NET_TRANSPORT_H
#define NBDFLOW_NET_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define TRANSPORT_SEND_MORE 1

struct transport;

struct transport_ops {
  const char *name;
  /* Bytes read, 0 at orderly EOF, -EAGAIN when nothing is ready, -errno. */
  ssize_t (*recv)(struct transport *t, void *buf, size_t len);
  /* Bytes accepted (possibly fewer than offered), -EAGAIN, -errno. */
  ssize_t (*sendv)(struct transport *t, const struct iovec *iov, int iovcnt,
                   int flags);
  /* Pushes out anything the transport buffered: 0 when done, -EAGAIN
   * while the socket is full, -errno. */
  int (*flush)(struct transport *t);
  /* Bytes already decoded and waiting inside the transport, which epoll
   * cannot see (TLS). */
  size_t (*pending)(struct transport *t);
  /* Optional: bytes taken from the socket so far, framing included, where
   * they differ from what recv returns (TLS: a record of one byte costs
   * a whole record's work). A reader's fair share counts these. */
  uint64_t (*wire_in)(struct transport *t);
  /* Orderly end (TLS close_notify, then shutdown(2)). */
  int (*shutdown)(struct transport *t);
  /* Frees the transport's state; does not close fd. */
  void (*free)(struct transport *t);
};

struct transport {
  const struct transport_ops *ops;
  int fd;     /* owned by whoever created the transport */
  void *priv; /* transport-specific state, owned by the transport */
};

/* t->ops->wire_in, or 0 for a transport whose recv counts its wire. */
static inline uint64_t
transport_wire_in(struct transport *t)
{
  return t->ops->wire_in ? t->ops->wire_in(t) : 0;
}

/* Plain sockets. t->fd must be set; priv is unused. */
extern const struct transport_ops transport_plain_ops;
void transport_init_plain(struct transport *t, int fd);

/* Loop until every byte of iov is sent, polling on EAGAIN for at most
 * timeout_ms in total (-1: forever). iov is modified. Returns 0, -ETIMEDOUT
 * or -errno. */
int transport_send_all(struct transport *t, struct iovec *iov, int iovcnt,
                       int flags, int timeout_ms);
int transport_send_buf(struct transport *t, const void *buf, size_t len,
                       int flags, int timeout_ms);
/* Reads exactly len bytes. Returns 0, -ECONNRESET on EOF before len,
 * -ETIMEDOUT or -errno. Over TCP, each wait first sends the ACK of what
 * arrived (TCP_QUICKACK). */
int transport_recv_all(struct transport *t, void *buf, size_t len,
                       int timeout_ms);
/* As recv_all, but idle_ms limits each wait for more, not the whole;
 * *got is what was read, on failure too. */
int transport_recv_idle(struct transport *t, void *buf, size_t len,
                        int idle_ms, size_t *got);
/* What comes within timeout_ms, up to len bytes: the count read (less
 * than len at EOF, on an error, or when the time is up). */
size_t transport_recv_within(struct transport *t, void *buf, size_t len,
                             int timeout_ms);

/* Advances iov past n sent bytes; returns the new iovcnt. */
int transport_iov_advance(struct iovec **iov, int iovcnt, size_t n);

#endif
