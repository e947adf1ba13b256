/* fuzz-server.c: whole client sessions against our server, in process.
 * One server (one loop, two workers) serves a memory, a null and a file
 * export (on tmpfs where /dev/shm is) on a Unix socket for the whole run. Each input is the byte
 * stream a client sends after the greeting: the harness connects, sends
 * it, half-closes and reads until the server closes. The server must
 * close within 5 s of the input's end whatever it was (a hang fails the
 * run), and a crash, an overflow, a leak or undefined behaviour in any
 * of its threads fails it through the sanitizers. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz.h"
#include "server/server.h"
#include "util/log.h"

#define CLOSE_WITHIN_MS 5000

static char dir[] = "/tmp/nbdflow-fuzz-XXXXXX";
static char sock_path[100];
static char file_arg[120];

static void
cleanup(void)
{
  unlink(sock_path);
  unlink(file_arg + 5);
  rmdir(dir);
}

/* Runs the server for the whole process; it never returns. */
static void *
serve(void *arg)
{
  struct server_config cfg = {
    .unix_path = sock_path,
    .max_inflight = 16,
    .handshake_timeout = 10,
    .threads = 2,
    .loops = 1,
  };
  char *exports[] = { "memory:1M", "null=null:1G", file_arg };
  int r = server_run(&cfg, exports, 3);
  fprintf(stderr, "fuzz-server: the server stopped (%d)\n", r);
  abort();
  return arg;
}

static int
dial(void)
{
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  log_threshold = LOG_ERROR; /* every bad input is logged: keep it quiet */
  /* As nbdflow's main does: sendfile(2) to a closed socket cannot be
   * told not to raise it. */
  signal(SIGPIPE, SIG_IGN);
  CHECK(mkdtemp(dir) != NULL);
  atexit(cleanup);
  snprintf(sock_path, sizeof sock_path, "%s/s", dir);
  /* The file export lives on tmpfs where there is one, so that READ
   * replies take the sendfile path too. */
  int ffd = -1;
  if (access("/dev/shm", W_OK) == 0) {
    snprintf(file_arg, sizeof file_arg, "file=/dev/shm/nbdflow-fuzz-XXXXXX");
    ffd = mkstemp(file_arg + 5);
  }
  if (ffd < 0) {
    snprintf(file_arg, sizeof file_arg, "file=%s/f", dir);
    ffd = open(file_arg + 5, O_RDWR | O_CREAT | O_TRUNC, 0600);
  }
  CHECK(ffd >= 0 && ftruncate(ffd, 1 << 20) == 0);
  close(ffd);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, serve, NULL) == 0);
  for (int i = 0; i < 500; i++) { /* up to 5 s for the socket */
    int fd = dial();
    if (fd >= 0) {
      close(fd);
      /* The server holds the file open: a run that crashes leaves
       * nothing in /dev/shm. */
      unlink(file_arg + 5);
      return 0;
    }
    usleep(10000);
  }
  fprintf(stderr, "fuzz-server: the server did not start\n");
  abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  int fd = dial();
  CHECK(fd >= 0);
  /* The server answers while the input goes in: send and read in turn,
   * so that neither side waits on a full socket. */
  static uint8_t buf[1 << 16];
  size_t sent = 0;
  bool half_closed = false;
  int waited = 0;
  for (;;) {
    if (sent == size && !half_closed) {
      shutdown(fd, SHUT_WR);
      half_closed = true;
    }
    struct pollfd p = { .fd = fd, .events = POLLIN | (half_closed ? 0 : POLLOUT) };
    int n = poll(&p, 1, 100);
    CHECK(n >= 0 || errno == EINTR);
    if (n <= 0) {
      waited += 100;
      if (waited >= CLOSE_WITHIN_MS) {
        fprintf(stderr, "fuzz-server: no close %d ms after %zu of %zu "
                "bytes were sent\n", waited, sent, size);
        abort();
      }
      continue;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(fd, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno == ECONNRESET))
        break; /* the server closed */
      CHECK(r > 0 || errno == EINTR || errno == EAGAIN);
      waited = 0;
    }
    if (!half_closed && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
        sent = size; /* the server hung up first: read what it sent */
        half_closed = true;
      } else {
        CHECK(w >= 0 || errno == EAGAIN);
        if (w > 0)
          sent += (size_t)w;
      }
    }
  }
  close(fd);
  return 0;
}
