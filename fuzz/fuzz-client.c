/* fuzz-client.c: our NBD client against a server that sends anything.
 * The input's first byte chooses what the client asks for (bit 0
 * extended headers, bit 1 structured replies, bit 2 base:allocation,
 * bit 3 NBD_OPT_LIST); the rest is the byte stream a fake server sends
 * from its greeting on, before it half-closes and reads the client out.
 * The client connects, then sends a READ of up to 64 KiB and, when it
 * has a context, a BLOCK_STATUS. Whatever the stream, the client must be
 * done within 2 s of its end, a READ reported whole must have been
 * covered by the reply, and a block status reported good must hold at
 * least one extent, none of length 0, the ones before the last inside
 * the request; a failed connect must say why. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client.h"
#include "net/loop.h"
#include "fuzz.h"
#include "util/log.h"
#include "proto/nbd_uri.h"

#define MAX_EXTENTS 64
#define REPLY_MS 2000

static char dir[] = "/tmp/nbdflow-fuzz-XXXXXX";
static bool verbose; /* FUZZ_VERBOSE set: say how each input ended */
static char sock_path[100];
static int listen_fd = -1;

struct fake {
  const uint8_t *data;
  size_t size;
};

static void
cleanup(void)
{
  unlink(sock_path);
  rmdir(dir);
}

/* The fake server: sends the stream while reading what the client sends
 * (so that neither side blocks on a full socket), half-closes, then
 * reads until the client has closed. */
static void *
fake_server(void *arg)
{
  struct fake *f = arg;
  int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return NULL; /* the client never connected */
  static uint8_t sink[1 << 16];
  size_t sent = 0;
  bool half = false;
  for (;;) {
    if (sent == f->size && !half) {
      shutdown(fd, SHUT_WR);
      half = true;
    }
    struct pollfd p = { .fd = fd, .events = POLLIN | (half ? 0 : POLLOUT) };
    if (poll(&p, 1, -1) < 0 && errno != EINTR)
      break;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(fd, sink, sizeof sink);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
        break;
    }
    if (!half && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, f->data + sent, f->size - sent,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        break;
      if (w > 0)
        sent += (size_t)w;
    }
  }
  close(fd);
  return NULL;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  log_threshold = LOG_ERROR;
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  CHECK(mkdtemp(dir) != NULL);
  atexit(cleanup);
  snprintf(sock_path, sizeof sock_path, "%s/s", dir);
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock_path);
  listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(listen_fd >= 0);
  CHECK(bind(listen_fd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(listen_fd, 4) == 0);
  return 0;
}

static void
check_status(const struct client_req *r)
{
  CHECK(r->nextents >= 1 && r->nextents <= MAX_EXTENTS);
  uint64_t sum = 0;
  for (size_t i = 0; i < r->nextents; i++) {
    CHECK(r->extents[i].length > 0);
    CHECK(sum < r->length); /* only the last may reach past the end */
    sum += r->extents[i].length > r->length ? r->length
                                            : r->extents[i].length;
  }
}

/* Runs the connection until every request given is complete. The fake
 * server's stream ends in a half-close, so the client must be done well
 * within REPLY_MS whatever the stream held. */
static void
run(struct client_conn *c, struct client_req **rs, int n)
{
  uint64_t deadline = loop_now_ms() + REPLY_MS;
  for (;;) {
    bool done = true;
    for (int i = 0; i < n; i++)
      done = done && rs[i]->completed;
    if (done)
      return;
    uint64_t now = loop_now_ms();
    if (now >= deadline) {
      fprintf(stderr, "fuzz-client: requests still open %d ms after the "
              "server's stream ended\n", REPLY_MS);
      abort();
    }
    struct pollfd p = { .fd = c->fd,
                        .events = POLLIN |
                                  (client_wants_write(c) ? POLLOUT : 0) };
    int k = poll(&p, 1, (int)(deadline - now));
    CHECK(k >= 0 || errno == EINTR);
    if (k > 0)
      client_on_events(c, (uint32_t)p.revents);
  }
}

static const char *
outcome(const struct client_req *r)
{
  return !r->completed ? "not sent" : r->err ? strerror(r->err) : "ok";
}

/* A READ of up to 64 KiB and, with a context, a BLOCK_STATUS, both in
 * flight at once (the stream holds the replies before the requests
 * leave, as a pipelining server's may). */
static void
requests(struct client_conn *c, bool status)
{
  static uint8_t buf[64 << 10];
  struct client_extent ext[MAX_EXTENTS];
  uint64_t size = c->info.size;
  if (size == 0)
    return;
  struct client_req r = {
    .type = NBD_CMD_READ,
    .length = size < sizeof buf ? size : sizeof buf,
    .buf = buf,
  };
  struct client_req s = {
    .type = NBD_CMD_BLOCK_STATUS,
    .length = size < (1u << 20) ? size : (1u << 20),
    .extents = ext,
    .max_extents = MAX_EXTENTS,
  };
  struct client_req *rs[2];
  int n = 0;
  if (client_submit(c, &r) == 0)
    rs[n++] = &r;
  if (status && client_submit(c, &s) == 0)
    rs[n++] = &s;
  run(c, rs, n);
  if (verbose)
    fprintf(stderr, "READ: %s %s; BLOCK_STATUS: %s, %zu extents %s; %s\n",
            outcome(&r), r.errmsg, outcome(&s), s.nextents, s.errmsg,
            c->errmsg);
  if (r.completed && r.err == 0)
    CHECK(r.covered == r.length);
  if (s.completed && s.err == 0)
    check_status(&s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  uint8_t sel = data[0];
  struct fake f = { .data = data + 1, .size = size - 1 };
  pthread_t t;
  CHECK(pthread_create(&t, NULL, fake_server, &f) == 0);

  char text[160], err[256];
  snprintf(text, sizeof text, "nbd+unix:///?socket=%s", sock_path);
  struct nbd_uri u;
  CHECK(uri_parse(text, &u, err, sizeof err) == 0);
  struct client_opts o = {
    .export_name = "",
    .want_extended = sel & 1,
    .want_structured = (sel & 2) != 0,
    .want_allocation = (sel & 4) != 0,
    .want_list = (sel & 8) != 0,
    .timeout_ms = REPLY_MS,
  };
  struct client_conn c;
  if (client_connect(&c, &u, &o) == 0) {
    if (verbose)
      fprintf(stderr, "connected: size %llu, structured %d, extended %d, "
              "allocation %d\n", (unsigned long long)c.info.size,
              c.info.structured, c.info.extended, c.info.allocation);
    requests(&c, c.info.allocation);
    client_close(&c);
  } else {
    if (verbose)
      fprintf(stderr, "connect failed: %s\n", c.errmsg);
    CHECK(c.errmsg[0] != '\0'); /* a failure says why */
  }
  uri_free(&u);
  CHECK(pthread_join(t, NULL) == 0);
  return 0;
}
