/* sock.c: see sock.h. */
#include "sock.h"
#include "loop.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int
sock_split_hostport(const char *s, char *host, char *port,
                    const char *default_port)
{
  const char *colon;

  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (end == NULL || (size_t)(end - s - 1) >= 256)
      return -EINVAL;
    memcpy(host, s + 1, (size_t)(end - s - 1));
    host[end - s - 1] = '\0';
    colon = end[1] == ':' ? end + 1 : NULL;
    if (end[1] != '\0' && colon == NULL)
      return -EINVAL;
  } else {
    colon = strrchr(s, ':');
    if (colon && strchr(s, ':') != colon)
      colon = NULL; /* a bare IPv6 address without port */
    size_t hl = colon ? (size_t)(colon - s) : strlen(s);
    if (hl >= 256)
      return -EINVAL;
    memcpy(host, s, hl);
    host[hl] = '\0';
  }
  const char *p = colon ? colon + 1 : default_port;
  if (strlen(p) >= 32 || *p == '\0')
    return -EINVAL;
  strcpy(port, p);
  return 0;
}

const char *
sock_strerror(int err)
{
  if (sock_err_is_resolve(err)) {
    /* glibc's EAI_* codes are negative; others' positive */
    int code = -err - SOCK_EAI_BASE;
    return gai_strerror(EAI_NONAME < 0 ? -code : code);
  }
  return strerror(-err);
}

int
sock_listen_tcp(const char *host, const char *port, int *fds, int max)
{
  struct addrinfo hints = { .ai_family = AF_UNSPEC,
                            .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
  struct addrinfo *ai, *a;
  int n = 0, err = -EADDRNOTAVAIL;

  int r = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
  if (r != 0)
    return r == EAI_SYSTEM ? -errno : SOCK_ERR_RESOLVE(r);
  for (a = ai; a && n < max; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
    if (fd < 0) {
      err = -errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ai_family == AF_INET6)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 128) < 0) {
      err = -errno;
      close(fd);
      continue;
    }
    fds[n++] = fd;
  }
  freeaddrinfo(ai);
  return n > 0 ? n : err;
}

static int
sock_unix_addr(const char *path, struct sockaddr_un *sun, socklen_t *len)
{
  size_t pl = strlen(path);
  memset(sun, 0, sizeof *sun);
  sun->sun_family = AF_UNIX;
  if (pl >= sizeof sun->sun_path)
    return -ENAMETOOLONG;
  memcpy(sun->sun_path, path, pl);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pl + 1);
  return 0;
}

int
sock_listen_unix(const char *path)
{
  struct sockaddr_un sun;
  socklen_t len;
  int r = sock_unix_addr(path, &sun, &len);
  if (r < 0)
    return r;
  /* What is there already: nothing, a socket left by a server that is
   * gone (removed), or one still served, or not a socket (kept: never
   * replace another server's socket or delete a file). */
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return -EEXIST;
    /* Non-blocking: a live server whose accept queue is full answers
     * EAGAIN instead of holding us up. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       0);
    if (probe < 0)
      return -errno;
    r = connect(probe, (struct sockaddr *)&sun, len);
    int err = errno;
    close(probe);
    if (r == 0 || err == EAGAIN || err == EINPROGRESS)
      return -EADDRINUSE;
    if (err != ECONNREFUSED)
      return -err;
    unlink(path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (bind(fd, (struct sockaddr *)&sun, len) < 0 || listen(fd, 128) < 0) {
    r = -errno;
    close(fd);
    return r;
  }
  return fd;
}

int
sock_activation_fds(int *fds, int max)
{
  const char *pid = getenv("LISTEN_PID");
  const char *nfds = getenv("LISTEN_FDS");
  if (pid == NULL || nfds == NULL || atol(pid) != (long)getpid())
    return 0;
  int n = atoi(nfds);
  if (n <= 0)
    return 0;
  if (n > max)
    n = max;
  for (int i = 0; i < n; i++) {
    fds[i] = 3 + i; /* SD_LISTEN_FDS_START */
    fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    sock_set_nonblock(fds[i], true);
  }
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return n;
}

/* The deadline of a wait of timeout_ms (< 0: none, as 0). */
static uint64_t
sock_deadline(int timeout_ms)
{
  return timeout_ms < 0 ? 0 : loop_now_ms() + (uint64_t)timeout_ms + 1;
}

/* Milliseconds left until deadline_ms (0: no limit, -1), at least 0. */
static int
sock_left_ms(uint64_t deadline_ms)
{
  if (deadline_ms == 0)
    return -1;
  uint64_t now = loop_now_ms();
  if (now >= deadline_ms)
    return 0;
  uint64_t left = deadline_ms - now;
  return left > INT32_MAX ? INT32_MAX : (int)left;
}

/* connect(2) that waits at most until deadline_ms (0: no limit), and
 * that a shutdown(2) from another thread ends at once. The socket is
 * non-blocking meanwhile, blocking again after. A TCP connect is waited
 * for with poll (a signal, a stop and a continue included). A Unix
 * listener whose queue is full says EAGAIN and offers nothing to wait
 * on, and a shutdown does not wake a blocking connect there: the connect
 * is tried again every 10 ms, each time after a look for the shutdown
 * (an unconnected Unix socket reports it as POLLRDHUP). */
static int
sock_connect_by(int fd, const struct sockaddr *sa, socklen_t len,
                uint64_t deadline_ms)
{
  int r = sock_set_nonblock(fd, true);
  if (r < 0)
    return r;
  bool is_unix = sa->sa_family == AF_UNIX;
  for (;;) {
    if (connect(fd, sa, len) == 0) {
      r = 0;
      break;
    }
    r = -errno;
    if (is_unix && r == -EAGAIN) {
      struct pollfd pfd = { .fd = fd, .events = POLLRDHUP };
      if (poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLRDHUP)) {
        r = -ECONNABORTED; /* shut down by another thread */
        break;
      }
      int left = sock_left_ms(deadline_ms);
      if (left == 0) {
        r = -ETIMEDOUT;
        break;
      }
      poll(NULL, 0, left < 0 || left > 10 ? 10 : left);
      continue;
    }
    if (!is_unix && (r == -EINPROGRESS || r == -EALREADY)) {
      struct pollfd pfd = { .fd = fd, .events = POLLOUT };
      int n = poll(&pfd, 1, sock_left_ms(deadline_ms));
      if (n < 0 && errno == EINTR)
        continue; /* connect again: EALREADY while it is under way */
      if (n == 0) {
        r = -ETIMEDOUT;
        break;
      }
      int err = 0;
      socklen_t el = sizeof err;
      if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
        r = -errno;
      else
        r = err ? -err : (pfd.revents & (POLLHUP | POLLERR)) ? -ECONNABORTED
                                                              : 0;
      break;
    }
    if (r == -EISCONN)
      r = 0; /* an interrupted connect completed meanwhile */
    break;
  }
  if (r == 0)
    r = sock_set_nonblock(fd, false);
  return r;
}

int
sock_connect_tcp(const char *host, const char *port, int timeout_ms,
                 sock_fd_fn on_fd, void *arg)
{
  uint64_t deadline = sock_deadline(timeout_ms);
  struct addrinfo hints = { .ai_family = AF_UNSPEC,
                            .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_NUMERICSERV };
  struct addrinfo *ai, *a;
  int err = -ECONNREFUSED;

  int r = getaddrinfo(host, port, &hints, &ai);
  if (r != 0)
    return r == EAI_SYSTEM ? -errno : SOCK_ERR_RESOLVE(r);
  for (a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                    a->ai_protocol);
    if (fd < 0) {
      err = -errno;
      continue;
    }
    if (on_fd)
      on_fd(arg, fd);
    err = sock_connect_by(fd, a->ai_addr, a->ai_addrlen, deadline);
    if (err == 0) {
      freeaddrinfo(ai);
      return fd;
    }
    if (on_fd)
      on_fd(arg, -1);
    close(fd);
  }
  freeaddrinfo(ai);
  return err;
}

int
sock_connect_unix(const char *path, int timeout_ms, sock_fd_fn on_fd,
                  void *arg)
{
  uint64_t deadline = sock_deadline(timeout_ms);
  struct sockaddr_un sun;
  socklen_t len;
  int r = sock_unix_addr(path, &sun, &len);
  if (r < 0)
    return r;
  if (path[0] == '\0')
    return -EINVAL;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  if (on_fd)
    on_fd(arg, fd);
  r = sock_connect_by(fd, (struct sockaddr *)&sun, len, deadline);
  if (r < 0) {
    if (on_fd)
      on_fd(arg, -1);
    close(fd);
    return r;
  }
  return fd;
}

int
sock_set_nonblock(int fd, bool on)
{
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0)
    return -errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, fl) < 0)
    return -errno;
  return 0;
}

static int
sock_setint(int fd, int level, int opt, int v)
{
  if (setsockopt(fd, level, opt, &v, sizeof v) < 0)
    return -errno;
  return 0;
}

int
sock_set_nodelay(int fd, bool on)
{
  return sock_setint(fd, IPPROTO_TCP, TCP_NODELAY, on);
}

int
sock_set_quickack(int fd)
{
  return sock_setint(fd, IPPROTO_TCP, TCP_QUICKACK, 1);
}

int
sock_set_keepalive(int fd)
{
  return sock_setint(fd, SOL_SOCKET, SO_KEEPALIVE, 1);
}

static int
sock_set_buf(int fd, int opt, int size, int *effective)
{
  int r = sock_setint(fd, SOL_SOCKET, opt, size);
  if (r < 0)
    return r;
  int got = 0;
  socklen_t gl = sizeof got;
  if (getsockopt(fd, SOL_SOCKET, opt, &got, &gl) < 0)
    return -errno;
  if (effective)
    *effective = got / 2; /* the kernel doubles it for bookkeeping */
  return 0;
}

int
sock_set_sndbuf(int fd, int size, int *effective)
{
  return sock_set_buf(fd, SO_SNDBUF, size, effective);
}

int
sock_set_sndbuf_force(int fd, int size, int *effective)
{
  /* SO_SNDBUFFORCE is set only: the result reads as SO_SNDBUF. */
  int r = sock_setint(fd, SOL_SOCKET, SO_SNDBUFFORCE, size);
  if (r == -EPERM)
    return sock_set_buf(fd, SO_SNDBUF, size, effective);
  if (r < 0)
    return r;
  int got = 0;
  socklen_t gl = sizeof got;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &gl) < 0)
    return -errno;
  if (effective)
    *effective = got / 2;
  return 0;
}

int
sock_set_rcvbuf(int fd, int size, int *effective)
{
  return sock_set_buf(fd, SO_RCVBUF, size, effective);
}

/* Figure number index (from 0) of a sysctl file, or 0. */
static uint64_t
sock_sysctl_num(const char *path, int index)
{
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return 0;
  unsigned long long v = 0;
  for (int i = 0; i <= index; i++)
    if (fscanf(f, "%llu", &v) != 1) {
      v = 0;
      break;
    }
  fclose(f);
  return v;
}

int
sock_tcp_autotune_max(uint64_t *send, uint64_t *recv)
{
  *send = sock_sysctl_num("/proc/sys/net/ipv4/tcp_wmem", 2);
  *recv = sock_sysctl_num("/proc/sys/net/ipv4/tcp_rmem", 2);
  return *send && *recv ? 0 : -ENOENT;
}

static int
sock_family(int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
    return -1;
  return ss.ss_family;
}

bool
sock_is_tcp(int fd)
{
  int f = sock_family(fd);
  return f == AF_INET || f == AF_INET6;
}

bool
sock_is_unix(int fd)
{
  return sock_family(fd) == AF_UNIX;
}

bool
sock_is_tcp_loopback(int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
    return false;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

/* "host:port" ("[host]:port" for IPv6) of ss, or other when it is not
 * an IP address. */
static void
sock_format(const struct sockaddr_storage *ss, char *buf, size_t len,
            const char *other)
{
  char host[INET6_ADDRSTRLEN];
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
  } else {
    snprintf(buf, len, "%s", other);
  }
}

void
sock_peer_name(int fd, char *buf, size_t len)
{
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char other[32];

  if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
    snprintf(buf, len, "fd %d", fd);
    return;
  }
  snprintf(other, sizeof other, "unix client (fd %d)", fd);
  sock_format(&ss, buf, len, other);
}

void
sock_local_name(int fd, char *buf, size_t len)
{
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;

  if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
    snprintf(buf, len, "fd %d", fd);
  else
    sock_format(&ss, buf, len, "a unix socket");
}

ssize_t
sock_splice_to_pipe(int fd, int pipefd, size_t len)
{
  for (;;) {
    ssize_t n = splice(fd, NULL, pipefd, NULL, len,
                       SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n >= 0)
      return n;
    if (errno != EINTR)
      return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

int
sock_pipe_sized(int fds[2], size_t size)
{
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0)
    return -errno;
  int got = fcntl(fds[1], F_SETPIPE_SZ, (int)size);
  if (got < 0 || (size_t)got < size) {
    int err = got < 0 ? errno : ENOBUFS;
    close(fds[0]);
    close(fds[1]);
    fds[0] = fds[1] = -1;
    return -err;
  }
  return 0;
}

size_t
sock_pipe_max_size(void)
{
  uint64_t v = sock_sysctl_num("/proc/sys/fs/pipe-max-size", 0);
  return v >= 4096 ? (size_t)v : (size_t)1 << 20;
}

void
sock_pipe_drain(int fd)
{
  char sink[4096];
  while (read(fd, sink, sizeof sink) > 0)
    ;
}

int
sock_readable_bytes(int fd)
{
  int n = 0;
  if (ioctl(fd, FIONREAD, &n) < 0)
    return -errno;
  return n;
}
