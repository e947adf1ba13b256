/* ceiling.c: the bare file -> socket -> file data path, as a ceiling for
 * what nbdflow's pair (nbdflow copy into nbdflow serve) could reach on the
 * same machine. bench/run's section ceiling runs it beside the pair.
 *
 *   nbdflow-ceiling --tcp|--unix [--piece-size N] [--in-flight N] SRC DST
 *
 * One process, two threads joined by one connected stream socket:
 *   - the sender (main thread) walks SRC in pieces (--piece-size, 2 MiB);
 *     each piece is a 28-byte header (the layout of an NBD request header,
 *     with a magic of its own) sent with MSG_MORE, then its payload sent
 *     by sendfile(2) from SRC's page cache, so that the kernel joins the
 *     two as it joins an NBD WRITE's. At most --in-flight pieces (8) are
 *     unacknowledged: with that many out, the sender reads a reply before
 *     the next header.
 *   - the receiver reads a header, moves the payload with splice(2) from
 *     the socket into a pipe and from the pipe into DST at the header's
 *     offset, in rounds of at most the pipe's size, then sends a 16-byte
 *     reply (the layout of an NBD simple reply): the piece has then been
 *     written into DST.
 * Nothing else: no event loop, no second connection, no buffer in user
 * space. The sockets block; a blocking sendfile returns when the whole
 * piece is in the socket.
 *
 * Sockets are set as nbdflow sets its own (src/client/handshake.c for the
 * copy's side, src/server/conn.c for the server's), so that the two
 * compare on the same buffers:
 *   --tcp: a listener on 127.0.0.1, port chosen by the kernel; TCP_NODELAY
 *     on both ends (nbdflow's default; its --nagle is a diagnostic),
 *     SO_KEEPALIVE on the receiver; buffer sizes left to the kernel's
 *     autotuning (nbdflow sets none over TCP).
 *   --unix: a socketpair(2) (the same stream socket a bound path gives);
 *     the sender asks SO_SNDBUF and SO_RCVBUF of 4 MiB, the receiver
 *     SO_SNDBUF of 2 MiB (the kernel may clip either to net.core.*mem_max).
 * The pipe is as large as a piece, at most fs.pipe-max-size (the limit of
 * a process without CAP_SYS_RESOURCE): nbdflow serve sizes its payload
 * pipes the same way.
 *
 * DST is written in place at the pieces' offsets (created if missing,
 * never truncated), as a server writes into the file it serves. The
 * program checks nothing of what it copied: bench/run compares DST with
 * SRC byte for byte afterwards, as after every copy.
 *
 * On success it prints one line on stdout, key=value pairs separated by
 * spaces:
 *   bytes=B seconds=S user_s=U sys_s=Y cpu_s=C sender_cpu_s=T
 *   receiver_cpu_s=R transport=tcp|unix piece=P in_flight=N pipe=Z
 * seconds from before the first header to after the last reply; user_s
 * and sys_s from getrusage(2) of the whole process, cpu_s their sum;
 * sender_cpu_s and receiver_cpu_s each thread's own CPU clock. On
 * loopback the kernel receives a segment in its sender's context, so
 * receiving counts partly as the sender's. On failure it names the
 * operation on stderr and exits 1.
 *
 * This is a benchmark tool, not part of the product: its peer is itself. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CEIL_REQ_MAGIC   0x6365696cu /* "ceil" */
#define CEIL_REPLY_MAGIC 0x6c696563u
#define CEIL_REQ_LEN     28 /* magic, flags, type, cookie, offset, length */
#define CEIL_REPLY_LEN   16 /* magic, error, cookie */
#define CEIL_TYPE_WRITE  1
/* nbdflow copy's buffers on a Unix socket, and nbdflow serve's
 * SERVER_UNIX_SNDBUF. */
#define CEIL_UNIX_SNDBUF     (4 << 20)
#define CEIL_UNIX_RCVBUF     (4 << 20)
#define CEIL_UNIX_SRV_SNDBUF (2 << 20)
#define CEIL_PIPE_DEFAULT    (1u << 20) /* fs.pipe-max-size's default */

struct ceil_opts {
  bool tcp;
  uint32_t piece;     /* bytes a header announces, at most */
  unsigned in_flight; /* pieces sent and not yet acknowledged, at most */
  const char *src, *dst;
};

/* What the receiver thread works with, and what it leaves. The sender
 * owns nothing of it; main reads result and cpu_s after the join. */
struct ceil_receiver {
  int sock;
  int dst_fd;
  int pipe_rd, pipe_wr;
  size_t pipe_size;
  uint32_t piece;
  int result; /* 0, or -errno of the failed operation (named on stderr) */
  double cpu_s;
};

static double
ceil_clock(clockid_t id)
{
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
ceil_put32(uint8_t *p, uint32_t v)
{
  v = htonl(v);
  memcpy(p, &v, 4);
}

static uint32_t
ceil_get32(const uint8_t *p)
{
  uint32_t v;
  memcpy(&v, p, 4);
  return ntohl(v);
}

static void
ceil_put64(uint8_t *p, uint64_t v)
{
  ceil_put32(p, (uint32_t)(v >> 32));
  ceil_put32(p + 4, (uint32_t)v);
}

static uint64_t
ceil_get64(const uint8_t *p)
{
  return (uint64_t)ceil_get32(p) << 32 | ceil_get32(p + 4);
}

/* Reads exactly len bytes. Returns 0, -EPIPE on end of stream after some
 * of them, 1 on end of stream before any, or -errno. */
static int
ceil_recv_all(int fd, uint8_t *buf, size_t len)
{
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(fd, buf + got, len - got, MSG_WAITALL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    if (n == 0)
      return got == 0 ? 1 : -EPIPE;
    got += (size_t)n;
  }
  return 0;
}

static int
ceil_send_all(int fd, const uint8_t *buf, size_t len, int flags)
{
  while (len > 0) {
    ssize_t n = send(fd, buf, len, flags | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -errno;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* ---- the receiver ---- */

/* Moves len payload bytes from the socket into DST at off: socket ->
 * pipe, at most the pipe's size, then pipe -> file until the pipe is
 * empty again, so that a blocking splice into the pipe never waits on a
 * pipe only this thread drains. */
static int
ceil_splice_piece(struct ceil_receiver *rc, uint64_t off, uint32_t len)
{
  loff_t pos = (loff_t)off;
  while (len > 0) {
    size_t want = len < rc->pipe_size ? len : rc->pipe_size;
    ssize_t in = splice(rc->sock, NULL, rc->pipe_wr, NULL, want, SPLICE_F_MOVE);
    if (in < 0 && errno == EINTR)
      continue;
    if (in < 0) {
      fprintf(stderr, "ceiling: splice from the socket: %s\n", strerror(errno));
      return -errno;
    }
    if (in == 0) {
      fprintf(stderr, "ceiling: stream ended inside a piece at %llu\n",
              (unsigned long long)pos);
      return -EPIPE;
    }
    size_t left = (size_t)in;
    while (left > 0) {
      ssize_t out
          = splice(rc->pipe_rd, NULL, rc->dst_fd, &pos, left, SPLICE_F_MOVE);
      if (out < 0 && errno == EINTR)
        continue;
      if (out <= 0) {
        int err = out < 0 ? errno : EIO;
        fprintf(stderr, "ceiling: splice into the file at %llu: %s\n",
                (unsigned long long)pos, strerror(err));
        return -err;
      }
      left -= (size_t)out;
    }
    len -= (uint32_t)in;
  }
  return 0;
}

/* One header, its payload, its reply. Returns 0, 1 at the end of the
 * stream, or -errno. */
static int
ceil_receive_one(struct ceil_receiver *rc)
{
  uint8_t h[CEIL_REQ_LEN], rep[CEIL_REPLY_LEN];
  int r = ceil_recv_all(rc->sock, h, sizeof h);
  if (r == 1)
    return 1;
  if (r < 0) {
    fprintf(stderr, "ceiling: reading a header: %s\n", strerror(-r));
    return r;
  }
  uint32_t magic = ceil_get32(h), len = ceil_get32(h + 24);
  uint64_t off = ceil_get64(h + 16);
  if (magic != CEIL_REQ_MAGIC || len == 0 || len > rc->piece) {
    fprintf(stderr, "ceiling: bad header: magic 0x%08x, length %u\n", magic,
            len);
    return -EPROTO;
  }
  r = ceil_splice_piece(rc, off, len);
  if (r < 0)
    return r;
  ceil_put32(rep, CEIL_REPLY_MAGIC);
  ceil_put32(rep + 4, 0);
  memcpy(rep + 8, h + 8, 8); /* the cookie, as it came */
  r = ceil_send_all(rc->sock, rep, sizeof rep, 0);
  if (r < 0)
    fprintf(stderr, "ceiling: sending a reply: %s\n", strerror(-r));
  return r;
}

/* The receiver thread: pieces until the sender shuts its side down. On a
 * failure it shuts the socket down, so the sender's next call fails
 * instead of waiting for a reply that will not come. */
static void *
ceil_receiver_main(void *arg)
{
  struct ceil_receiver *rc = arg;
  int r;
  while ((r = ceil_receive_one(rc)) == 0)
    ;
  rc->result = r < 0 ? r : 0;
  if (r < 0)
    shutdown(rc->sock, SHUT_RDWR);
  rc->cpu_s = ceil_clock(CLOCK_THREAD_CPUTIME_ID);
  return NULL;
}

/* ---- the sender ---- */

/* Reads one reply; replies come in the order of the pieces. */
static int
ceil_read_reply(int fd, uint64_t want_cookie)
{
  uint8_t rep[CEIL_REPLY_LEN];
  int r = ceil_recv_all(fd, rep, sizeof rep);
  if (r != 0) {
    fprintf(stderr, "ceiling: reading a reply: %s\n",
            strerror(r == 1 ? EPIPE : -r));
    return r == 1 ? -EPIPE : r;
  }
  if (ceil_get32(rep) != CEIL_REPLY_MAGIC || ceil_get32(rep + 4) != 0
      || ceil_get64(rep + 8) != want_cookie) {
    fprintf(stderr, "ceiling: bad reply to piece %llu\n",
            (unsigned long long)want_cookie);
    return -EPROTO;
  }
  return 0;
}

/* Sends one piece: its header corked, then its payload from the file. */
static int
ceil_send_piece(int sock, int src_fd, uint64_t cookie, uint64_t off,
                uint32_t len)
{
  uint8_t h[CEIL_REQ_LEN];
  ceil_put32(h, CEIL_REQ_MAGIC);
  memset(h + 4, 0, 2); /* flags */
  h[6] = 0;
  h[7] = CEIL_TYPE_WRITE;
  ceil_put64(h + 8, cookie);
  ceil_put64(h + 16, off);
  ceil_put32(h + 24, len);
  int r = ceil_send_all(sock, h, sizeof h, MSG_MORE);
  if (r < 0) {
    fprintf(stderr, "ceiling: sending a header: %s\n", strerror(-r));
    return r;
  }
  off_t pos = (off_t)off;
  size_t left = len;
  while (left > 0) {
    ssize_t n = sendfile(sock, src_fd, &pos, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO; /* 0: the source shrank */
      fprintf(stderr, "ceiling: sendfile at %llu: %s\n",
              (unsigned long long)pos, strerror(err));
      return -err;
    }
    left -= (size_t)n;
  }
  return 0;
}

/* Sends SRC's size bytes in pieces, at most in_flight unacknowledged,
 * and waits for every reply. */
static int
ceil_send(int sock, int src_fd, uint64_t size, const struct ceil_opts *o)
{
  uint64_t sent = 0, acked = 0; /* pieces, counted as cookies */
  for (uint64_t off = 0; off < size; off += o->piece) {
    if (sent - acked == o->in_flight) {
      int r = ceil_read_reply(sock, acked);
      if (r < 0)
        return r;
      acked++;
    }
    uint32_t len = size - off < o->piece ? (uint32_t)(size - off) : o->piece;
    int r = ceil_send_piece(sock, src_fd, sent, off, len);
    if (r < 0)
      return r;
    sent++;
  }
  while (acked < sent) {
    int r = ceil_read_reply(sock, acked);
    if (r < 0)
      return r;
    acked++;
  }
  return 0;
}

/* ---- set-up ---- */

static int
ceil_setint(int fd, int level, int opt, int v, const char *what)
{
  if (setsockopt(fd, level, opt, &v, sizeof v) == 0)
    return 0;
  fprintf(stderr, "ceiling: setsockopt %s: %s\n", what, strerror(errno));
  return -errno;
}

/* A connected pair of TCP sockets over 127.0.0.1: fds[0] the sender's,
 * fds[1] the receiver's. */
static int
ceil_tcp_pair(int fds[2])
{
  struct sockaddr_in a
      = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
  socklen_t al = sizeof a;
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int r = -1;
  fds[0] = fds[1] = -1;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0
      || listen(ls, 1) < 0 || getsockname(ls, (struct sockaddr *)&a, &al) < 0)
    goto cleanup;
  fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fds[0] < 0 || connect(fds[0], (struct sockaddr *)&a, sizeof a) < 0)
    goto cleanup;
  fds[1] = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
  if (fds[1] < 0)
    goto cleanup;
  r = 0;
cleanup:
  if (r < 0)
    fprintf(stderr, "ceiling: TCP connection over 127.0.0.1: %s\n",
            strerror(errno));
  if (ls >= 0)
    close(ls);
  return r;
}

/* The connected pair, with the socket options of nbdflow's two ends. */
static int
ceil_connect(bool tcp, int fds[2])
{
  if (tcp) {
    if (ceil_tcp_pair(fds) < 0)
      return -1;
    if (ceil_setint(fds[0], IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY") < 0
        || ceil_setint(fds[1], IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY") < 0
        || ceil_setint(fds[1], SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE") < 0)
      return -1;
    return 0;
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0) {
    fprintf(stderr, "ceiling: socketpair: %s\n", strerror(errno));
    return -1;
  }
  if (ceil_setint(fds[0], SOL_SOCKET, SO_SNDBUF, CEIL_UNIX_SNDBUF, "SO_SNDBUF")
          < 0
      || ceil_setint(fds[0], SOL_SOCKET, SO_RCVBUF, CEIL_UNIX_RCVBUF,
                     "SO_RCVBUF")
             < 0
      || ceil_setint(fds[1], SOL_SOCKET, SO_SNDBUF, CEIL_UNIX_SRV_SNDBUF,
                     "SO_SNDBUF")
             < 0)
    return -1;
  return 0;
}

/* The receiver's pipe: as large as a piece, at most fs.pipe-max-size. */
static int
ceil_pipe(struct ceil_receiver *rc)
{
  unsigned long max = CEIL_PIPE_DEFAULT;
  FILE *f = fopen("/proc/sys/fs/pipe-max-size", "re");
  if (f) {
    if (fscanf(f, "%lu", &max) != 1 || max < 4096)
      max = CEIL_PIPE_DEFAULT;
    fclose(f);
  }
  size_t want = rc->piece < max ? rc->piece : (size_t)max;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) {
    fprintf(stderr, "ceiling: pipe: %s\n", strerror(errno));
    return -1;
  }
  int got = fcntl(fds[1], F_SETPIPE_SZ, (int)want);
  if (got < 0) {
    fprintf(stderr, "ceiling: pipe of %zu bytes: %s\n", want, strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  rc->pipe_rd = fds[0];
  rc->pipe_wr = fds[1];
  rc->pipe_size = (size_t)got;
  return 0;
}

/* ---- command line ---- */

/* A size in bytes with an optional K or M suffix (powers of 1024). */
static bool
ceil_parse_size(const char *s, uint64_t *out)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return false;
  if (*end == 'K' || *end == 'k')
    v <<= 10, end++;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, end++;
  *out = v;
  return *end == '\0';
}

static void
ceil_usage(FILE *f)
{
  fprintf(f, "usage: nbdflow-ceiling --tcp|--unix [--piece-size N] "
             "[--in-flight N] SRC DST\n"
             "Copies SRC into DST over a socket to itself by sendfile and "
             "splice;\nsee the top of bench/ceiling.c.\n");
}

static int
ceil_parse(int argc, char **argv, struct ceil_opts *o)
{
  static const struct option lo[] = {
    { "tcp", no_argument, NULL, 't' },
    { "unix", no_argument, NULL, 'u' },
    { "piece-size", required_argument, NULL, 'p' },
    { "in-flight", required_argument, NULL, 'n' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int transports = 0, c;
  uint64_t v;
  *o = (struct ceil_opts){ .piece = 2u << 20, .in_flight = 8 };
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 't':
    case 'u':
      o->tcp = c == 't';
      transports++;
      break;
    case 'p':
      if (!ceil_parse_size(optarg, &v) || v == 0 || v > (256u << 20)) {
        fprintf(stderr, "ceiling: --piece-size '%s': 1 to 256M\n", optarg);
        return -1;
      }
      o->piece = (uint32_t)v;
      break;
    case 'n':
      if (!ceil_parse_size(optarg, &v) || v == 0 || v > 1024) {
        fprintf(stderr, "ceiling: --in-flight '%s': 1 to 1024\n", optarg);
        return -1;
      }
      o->in_flight = (unsigned)v;
      break;
    case 'h':
      ceil_usage(stdout);
      exit(0);
    default:
      ceil_usage(stderr);
      return -1;
    }
  }
  if (transports != 1 || argc - optind != 2) {
    ceil_usage(stderr);
    return -1;
  }
  o->src = argv[optind];
  o->dst = argv[optind + 1];
  return 0;
}

/* ---- main ---- */

static void
ceil_report(const struct ceil_opts *o, uint64_t size, double secs,
            double sender_cpu, const struct ceil_receiver *rc)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double usr = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
  double sys = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
  printf("bytes=%llu seconds=%.4f user_s=%.3f sys_s=%.3f cpu_s=%.3f "
         "sender_cpu_s=%.3f receiver_cpu_s=%.3f transport=%s piece=%u "
         "in_flight=%u pipe=%zu\n",
         (unsigned long long)size, secs, usr, sys, usr + sys, sender_cpu,
         rc->cpu_s, o->tcp ? "tcp" : "unix", o->piece, o->in_flight,
         rc->pipe_size);
}

int
main(int argc, char **argv)
{
  struct ceil_opts o;
  struct ceil_receiver rc
      = { .sock = -1, .dst_fd = -1, .pipe_rd = -1, .pipe_wr = -1 };
  int src_fd = -1, fds[2] = { -1, -1 }, status = 1, r;
  bool started = false;
  pthread_t th;
  struct stat st;
  double t0, t1, sender_cpu;

  if (ceil_parse(argc, argv, &o) < 0)
    return 2;
  /* A receiver that failed shuts the socket down: the sender's sendfile
   * then fails with EPIPE instead of killing the process unexplained. */
  signal(SIGPIPE, SIG_IGN);
  rc.piece = o.piece;
  src_fd = open(o.src, O_RDONLY | O_CLOEXEC);
  if (src_fd < 0 || fstat(src_fd, &st) < 0) {
    fprintf(stderr, "ceiling: source %s: %s\n", o.src, strerror(errno));
    goto cleanup;
  }
  rc.dst_fd = open(o.dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (rc.dst_fd < 0) {
    fprintf(stderr, "ceiling: destination %s: %s\n", o.dst, strerror(errno));
    goto cleanup;
  }
  if (ceil_pipe(&rc) < 0 || ceil_connect(o.tcp, fds) < 0)
    goto cleanup;
  rc.sock = fds[1];
  t0 = ceil_clock(CLOCK_MONOTONIC);
  r = pthread_create(&th, NULL, ceil_receiver_main, &rc);
  if (r != 0) {
    fprintf(stderr, "ceiling: receiver thread: %s\n", strerror(r));
    goto cleanup;
  }
  started = true;
  r = ceil_send(fds[0], src_fd, (uint64_t)st.st_size, &o);
  t1 = ceil_clock(CLOCK_MONOTONIC);
  sender_cpu = ceil_clock(CLOCK_THREAD_CPUTIME_ID);
  /* The end of the stream ends the receiver; after a failure, shut down
   * both ways so that it does not wait for a header. */
  shutdown(fds[0], r < 0 ? SHUT_RDWR : SHUT_WR);
  pthread_join(th, NULL);
  started = false;
  if (r < 0 || rc.result < 0)
    goto cleanup;
  ceil_report(&o, (uint64_t)st.st_size, t1 - t0, sender_cpu, &rc);
  status = 0;
cleanup:
  if (started) {
    shutdown(fds[0], SHUT_RDWR);
    pthread_join(th, NULL);
  }
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  if (rc.pipe_rd >= 0)
    close(rc.pipe_rd);
  if (rc.pipe_wr >= 0)
    close(rc.pipe_wr);
  if (rc.dst_fd >= 0)
    close(rc.dst_fd);
  if (src_fd >= 0)
    close(src_fd);
  return status;
}
