/* transport.c: plain transport and the blocking helpers. See transport.h. */
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "loop.h"
#include "sock.h"

static ssize_t
plain_recv(struct transport *t, void *buf, size_t len)
{
  for (;;) {
    ssize_t n = recv(t->fd, buf, len, MSG_DONTWAIT);
    if (n >= 0)
      return n;
    if (errno == EINTR)
      continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

static ssize_t
plain_sendv(struct transport *t, const struct iovec *iov, int iovcnt,
            int flags)
{
  struct msghdr msg = { .msg_iov = (struct iovec *)iov,
                        .msg_iovlen = (size_t)iovcnt };
  int mf = MSG_NOSIGNAL | MSG_DONTWAIT;
  if (flags & TRANSPORT_SEND_MORE)
    mf |= MSG_MORE;
  for (;;) {
    ssize_t n = sendmsg(t->fd, &msg, mf);
    if (n >= 0)
      return n;
    if (errno == EINTR)
      continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

static int
plain_flush(struct transport *t)
{
  (void)t;
  return 0;
}

static size_t
plain_pending(struct transport *t)
{
  (void)t;
  return 0;
}

static int
plain_shutdown(struct transport *t)
{
  return shutdown(t->fd, SHUT_WR) < 0 ? -errno : 0;
}

static void
plain_free(struct transport *t)
{
  (void)t;
}

const struct transport_ops transport_plain_ops = {
  .name = "plain",
  .recv = plain_recv,
  .sendv = plain_sendv,
  .flush = plain_flush,
  .pending = plain_pending,
  .shutdown = plain_shutdown,
  .free = plain_free,
};

void
transport_init_plain(struct transport *t, int fd)
{
  t->ops = &transport_plain_ops;
  t->fd = fd;
  t->priv = NULL;
}

int
transport_iov_advance(struct iovec **iov, int iovcnt, size_t n)
{
  while (iovcnt > 0 && n >= (*iov)->iov_len) {
    n -= (*iov)->iov_len;
    (*iov)++;
    iovcnt--;
  }
  if (iovcnt > 0) {
    (*iov)->iov_base = (char *)(*iov)->iov_base + n;
    (*iov)->iov_len -= n;
  }
  return iovcnt;
}

/* Waits for fd to be ready; returns 0, -ETIMEDOUT or -errno. deadline is
 * a loop_now_ms() value or 0 for none. */
static int
transport_wait(int fd, short events, uint64_t deadline)
{
  for (;;) {
    int ms = -1;
    if (deadline) {
      uint64_t now = loop_now_ms();
      if (now >= deadline)
        return -ETIMEDOUT;
      ms = (int)(deadline - now);
    }
    struct pollfd p = { .fd = fd, .events = events };
    int r = poll(&p, 1, ms);
    if (r > 0)
      return 0;
    if (r == 0)
      return -ETIMEDOUT;
    if (errno != EINTR)
      return -errno;
  }
}

static uint64_t
transport_deadline(int timeout_ms)
{
  return timeout_ms < 0 ? 0 : loop_now_ms() + (uint64_t)timeout_ms;
}

int
transport_send_all(struct transport *t, struct iovec *iov, int iovcnt,
                   int flags, int timeout_ms)
{
  uint64_t deadline = transport_deadline(timeout_ms);
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      iov++;
      iovcnt--;
      continue;
    }
    ssize_t n = t->ops->sendv(t, iov, iovcnt, flags);
    if (n == -EAGAIN) {
      int r = transport_wait(t->fd, POLLOUT, deadline);
      if (r < 0)
        return r;
      continue;
    }
    if (n < 0)
      return (int)n;
    iovcnt = transport_iov_advance(&iov, iovcnt, (size_t)n);
  }
  if (flags & TRANSPORT_SEND_MORE)
    return 0;
  for (;;) {
    int r = t->ops->flush(t);
    if (r != -EAGAIN)
      return r;
    r = transport_wait(t->fd, POLLOUT, deadline);
    if (r < 0)
      return r;
  }
}

int
transport_send_buf(struct transport *t, const void *buf, size_t len,
                   int flags, int timeout_ms)
{
  struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
  return transport_send_all(t, &iov, 1, flags, timeout_ms);
}

/* recv_all's work; with idle, the time limit starts again with every
 * byte that comes. *got (when not NULL): the bytes read, on failure too. */
static int
recv_exact(struct transport *t, void *buf, size_t len, int timeout_ms,
           bool idle, size_t *got)
{
  uint64_t deadline = transport_deadline(timeout_ms);
  char *p = buf;
  if (got)
    *got = 0;
  while (len > 0) {
    ssize_t n = t->ops->recv(t, p, len);
    if (n == -EAGAIN) {
      /* Acknowledge what came so far before waiting: a peer with Nagle
       * on holds the rest of a message written in two parts until then,
       * and our delayed ACK would cost it ~40 ms (nbd-server's option
       * errors: a header, then the text). Not TCP: fails, harmless. */
      (void)sock_set_quickack(t->fd);
      int r = transport_wait(t->fd, POLLIN, deadline);
      if (r < 0)
        return r;
      continue;
    }
    if (n < 0)
      return (int)n;
    if (n == 0)
      return -ECONNRESET;
    p += n;
    len -= (size_t)n;
    if (got)
      *got += (size_t)n;
    if (idle)
      deadline = transport_deadline(timeout_ms);
  }
  return 0;
}

int
transport_recv_all(struct transport *t, void *buf, size_t len,
                   int timeout_ms)
{
  return recv_exact(t, buf, len, timeout_ms, false, NULL);
}

int
transport_recv_idle(struct transport *t, void *buf, size_t len,
                    int idle_ms, size_t *got)
{
  return recv_exact(t, buf, len, idle_ms, true, got);
}

size_t
transport_recv_within(struct transport *t, void *buf, size_t len,
                      int timeout_ms)
{
  uint64_t end = loop_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
  size_t have = 0;
  while (have < len) {
    ssize_t n = t->ops->recv(t, (char *)buf + have, len - have);
    if (n > 0) {
      have += (size_t)n;
      continue;
    }
    uint64_t now = loop_now_ms();
    if (n != -EAGAIN || now >= end)
      break;
    struct pollfd p = { .fd = t->fd, .events = POLLIN };
    (void)poll(&p, 1, (int)(end - now));
  }
  return have;
}
