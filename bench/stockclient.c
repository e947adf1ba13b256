/* stockclient.c: an NBD writer with the shape of the stock sparse_dd client.
 *
 * It reproduces, on purpose, the request pattern that stalls against a
 * server that delays its ACKs (FIELD-NOTES section 1):
 *   - Nagle stays on (TCP_NODELAY is never set, unless --nodelay is given
 *     as a contrast arm);
 *   - each WRITE request is sent as two write() calls, the 28-byte header
 *     first and then the payload;
 *   - exactly one request is in flight: the client waits for the reply
 *     before it writes the next header.
 *
 * It negotiates fixed newstyle with NBD_OPT_GO over blocking sockets, then
 * writes --request-size bytes at sequential offsets (wrapping at the export
 * size) until --count requests are done or --seconds have passed, whichever
 * comes first, and prints one line of key=value figures on stdout.
 *
 * This is a benchmark tool, not part of the product: it trusts its peer only
 * as far as needed to report a clean error instead of misbehaving. */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "net/sock.h"
#include "proto/nbd.h"
#include "proto/wire.h"
#include "util/size.h"

/* Largest option reply payload we accept during the handshake. */
#define STOCK_MAX_OPT_REPLY (64 * 1024)
/* A request slower than this counts as a stall in the summary. */
#define STOCK_STALL_MS 10.0
/* No single read or write may block longer than this. */
#define STOCK_IO_TIMEOUT_S 10

struct stock_opts {
  const char *tcp;    /* HOST:PORT, or NULL */
  const char *unix_path; /* or NULL */
  const char *export_name;
  uint64_t request_size;
  uint64_t count;
  double seconds;
  bool nodelay;
};

static double
stock_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One write() call per invocation of the caller's intent: loops only on a
 * short write, which a blocking socket produces only when interrupted. */
static int
stock_write_all(int fd, const void *buf, size_t len)
{
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int
stock_read_all(int fd, void *buf, size_t len)
{
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      return -ECONNRESET;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int
stock_connect(const struct stock_opts *o)
{
  int fd;
  if (o->unix_path) {
    fd = sock_connect_unix(o->unix_path, -1, NULL, NULL);
  } else {
    char host[256], port[32];
    if (sock_split_hostport(o->tcp, host, port, "10809") < 0)
      return -EINVAL;
    fd = sock_connect_tcp(host, port, -1, NULL, NULL);
  }
  if (fd < 0)
    return fd;
  struct timeval tv = { .tv_sec = STOCK_IO_TIMEOUT_S };
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (!o->unix_path) {
    /* Explicitly off: the stock shape is Nagle on. */
    int on = o->nodelay ? 1 : 0;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) < 0) {
      int err = -errno;
      close(fd);
      return err;
    }
  }
  return fd;
}

/* Handles one option reply of an NBD_OPT_GO. Returns 1 when more replies
 * follow, 0 on the final ACK, -errno on failure. */
static int
stock_go_reply(int fd, uint64_t *size, uint16_t *tflags)
{
  uint8_t hdr[NBD_OPT_REPLY_HDR_LEN];
  struct wire_opt_reply r;
  int err = stock_read_all(fd, hdr, sizeof hdr);
  if (err < 0)
    return err;
  if (wire_decode_opt_reply(hdr, &r) < 0 || r.option != NBD_OPT_GO) {
    fprintf(stderr, "stockclient: bad option reply header\n");
    return -EPROTO;
  }
  if (r.length > STOCK_MAX_OPT_REPLY) {
    fprintf(stderr, "stockclient: option reply of %u bytes\n", r.length);
    return -EPROTO;
  }
  uint8_t data[STOCK_MAX_OPT_REPLY];
  err = stock_read_all(fd, data, r.length);
  if (err < 0)
    return err;
  if (r.type == NBD_REP_ACK)
    return 0;
  if (r.type & NBD_REP_FLAG_ERROR) {
    fprintf(stderr, "stockclient: server refused NBD_OPT_GO: %s: %.*s\n",
            wire_rep_name(r.type), (int)r.length, (const char *)data);
    return -EPERM;
  }
  if (r.type == NBD_REP_INFO && r.length >= 12 &&
      wire_get16(data) == NBD_INFO_EXPORT) {
    *size = wire_get64(data + 2);
    *tflags = wire_get16(data + 10);
  }
  return 1;
}

/* Fixed newstyle handshake ending in NBD_OPT_GO. */
static int
stock_handshake(int fd, const char *name, uint64_t *size, uint16_t *tflags)
{
  uint8_t greet[NBD_GREETING_LEN];
  int err = stock_read_all(fd, greet, sizeof greet);
  if (err < 0)
    return err;
  if (wire_get64(greet) != NBD_INIT_PASSWD ||
      wire_get64(greet + 8) != NBD_IHAVEOPT) {
    fprintf(stderr, "stockclient: not a newstyle NBD server\n");
    return -EPROTO;
  }
  uint16_t hflags = wire_get16(greet + 16);
  uint8_t cflags[4];
  wire_put32(cflags, (hflags & NBD_FLAG_FIXED_NEWSTYLE ?
                      NBD_FLAG_C_FIXED_NEWSTYLE : 0) |
                     (hflags & NBD_FLAG_NO_ZEROES ? NBD_FLAG_C_NO_ZEROES : 0));
  err = stock_write_all(fd, cflags, sizeof cflags);
  if (err < 0)
    return err;

  uint32_t name_len = (uint32_t)strlen(name);
  if (name_len > 4096)
    return -ENAMETOOLONG;
  uint8_t opt[NBD_OPT_HDR_LEN + 4 + 4096 + 2];
  size_t dlen = wire_encode_info_req(opt + NBD_OPT_HDR_LEN, name, name_len,
                                     NULL, 0);
  wire_encode_opt(opt, NBD_OPT_GO, (uint32_t)dlen);
  err = stock_write_all(fd, opt, NBD_OPT_HDR_LEN + dlen);
  if (err < 0)
    return err;

  *size = 0;
  *tflags = 0;
  while ((err = stock_go_reply(fd, size, tflags)) > 0)
    ;
  return err;
}

/* One WRITE, the stock way: header write(), payload write(), wait. */
static int
stock_write_request(int fd, uint64_t cookie, uint64_t offset,
                    const uint8_t *payload, uint64_t len)
{
  uint8_t hdr[NBD_REQUEST_LEN];
  struct wire_request req = { .flags = 0, .type = NBD_CMD_WRITE,
                              .cookie = cookie, .offset = offset,
                              .length = len };
  wire_encode_request(hdr, false, &req);
  int err = stock_write_all(fd, hdr, sizeof hdr);
  if (err < 0)
    return err;
  err = stock_write_all(fd, payload, (size_t)len);
  if (err < 0)
    return err;

  uint8_t rep[NBD_SIMPLE_REPLY_LEN];
  struct wire_reply r;
  err = stock_read_all(fd, rep, sizeof rep);
  if (err < 0)
    return err;
  if (wire_decode_reply(rep, &r) < 0 || r.magic != NBD_SIMPLE_REPLY_MAGIC ||
      r.cookie != cookie) {
    fprintf(stderr, "stockclient: unexpected reply to request %llu\n",
            (unsigned long long)cookie);
    return -EPROTO;
  }
  if (r.error != 0) {
    fprintf(stderr, "stockclient: WRITE at %llu failed: NBD error %u\n",
            (unsigned long long)offset, r.error);
    int e = wire_nbd_to_errno(r.error);
    return e > 0 ? -e : -EIO;
  }
  return 0;
}

static int
stock_cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void
stock_print_summary(const struct stock_opts *o, double *lat_ms, uint64_t n,
                    double elapsed)
{
  uint64_t stalls = 0;
  for (uint64_t i = 0; i < n; i++)
    if (lat_ms[i] > STOCK_STALL_MS)
      stalls++;
  qsort(lat_ms, n, sizeof *lat_ms, stock_cmp_double);
  double p50 = n ? lat_ms[n / 2] : 0;
  double p99 = n ? lat_ms[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] : 0;
  double max = n ? lat_ms[n - 1] : 0;
  double rps = elapsed > 0 ? (double)n / elapsed : 0;
  printf("requests=%llu seconds=%.3f req_per_s=%.1f mib_per_s=%.2f "
         "request_size=%llu lat_p50_ms=%.3f lat_p99_ms=%.3f lat_max_ms=%.3f "
         "stalls_over_%.0fms=%llu nodelay=%d\n",
         (unsigned long long)n, elapsed, rps,
         rps * (double)o->request_size / (1024.0 * 1024.0),
         (unsigned long long)o->request_size, p50, p99, max, STOCK_STALL_MS,
         (unsigned long long)stalls, o->nodelay ? 1 : 0);
}

/* Runs the timed loop; returns 0 or -errno. */
static int
stock_run(const struct stock_opts *o, int fd, uint64_t export_size)
{
  uint64_t slots = export_size / o->request_size;
  if (slots == 0) {
    fprintf(stderr, "stockclient: export of %llu bytes is smaller than one "
            "request\n", (unsigned long long)export_size);
    return -EINVAL;
  }
  uint8_t *payload = malloc((size_t)o->request_size);
  double *lat_ms = malloc((size_t)o->count * sizeof *lat_ms);
  int err = 0;
  if (!payload || !lat_ms) {
    err = -ENOMEM;
    goto cleanup;
  }
  for (uint64_t i = 0; i < o->request_size; i++)
    payload[i] = (uint8_t)(i * 131 + 7);

  double start = stock_now(), end = start;
  uint64_t n = 0;
  while (n < o->count && end - start < o->seconds) {
    uint64_t offset = (n % slots) * o->request_size;
    double t0 = stock_now();
    err = stock_write_request(fd, n + 1, offset, payload, o->request_size);
    if (err < 0) {
      fprintf(stderr, "stockclient: request %llu: %s\n",
              (unsigned long long)n, strerror(-err));
      goto cleanup;
    }
    end = stock_now();
    lat_ms[n++] = (end - t0) * 1000.0;
  }
  stock_print_summary(o, lat_ms, n, end - start);

  uint8_t disc[NBD_REQUEST_LEN];
  struct wire_request req = { .type = NBD_CMD_DISC, .cookie = n + 1 };
  wire_encode_request(disc, false, &req);
  stock_write_all(fd, disc, sizeof disc);

cleanup:
  free(payload);
  free(lat_ms);
  return err;
}

static void
stock_usage(FILE *f)
{
  fprintf(f,
    "Usage: nbdflow-stockclient (--tcp HOST:PORT | --unix PATH) [OPTIONS]\n"
    "  --export NAME        export name (default: the default export)\n"
    "  --request-size SIZE  bytes per WRITE (default 512)\n"
    "  --count N            stop after N requests (default 1000000)\n"
    "  --seconds S          stop after S seconds (default 3)\n"
    "  --nodelay            set TCP_NODELAY (contrast arm; not the stock "
    "shape)\n");
}

static int
stock_parse(int argc, char **argv, struct stock_opts *o)
{
  static const struct option longopts[] = {
    { "tcp", required_argument, NULL, 't' },
    { "unix", required_argument, NULL, 'u' },
    { "export", required_argument, NULL, 'e' },
    { "request-size", required_argument, NULL, 's' },
    { "count", required_argument, NULL, 'n' },
    { "seconds", required_argument, NULL, 'S' },
    { "nodelay", no_argument, NULL, 'N' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 't': o->tcp = optarg; break;
    case 'u': o->unix_path = optarg; break;
    case 'e': o->export_name = optarg; break;
    case 's':
      if (size_parse(optarg, &o->request_size) < 0 || o->request_size == 0 ||
          o->request_size > 32 * 1024 * 1024) {
        fprintf(stderr, "stockclient: bad --request-size '%s'\n", optarg);
        return -1;
      }
      break;
    case 'n':
      o->count = strtoull(optarg, &end, 10);
      if (*end || o->count == 0 || o->count > 100000000) {
        fprintf(stderr, "stockclient: bad --count '%s'\n", optarg);
        return -1;
      }
      break;
    case 'S':
      o->seconds = strtod(optarg, &end);
      if (*end || !(o->seconds > 0 && o->seconds <= 3600)) {
        fprintf(stderr, "stockclient: bad --seconds '%s'\n", optarg);
        return -1;
      }
      break;
    case 'N': o->nodelay = true; break;
    case 'h': stock_usage(stdout); exit(0);
    default: return -1;
    }
  }
  if (optind != argc || (!o->tcp == !o->unix_path)) {
    stock_usage(stderr);
    return -1;
  }
  return 0;
}

int
main(int argc, char **argv)
{
  struct stock_opts o = { .export_name = "", .request_size = 512,
                          .count = 1000000, .seconds = 3 };
  if (stock_parse(argc, argv, &o) < 0)
    return 2;

  int fd = stock_connect(&o);
  if (fd < 0) {
    fprintf(stderr, "stockclient: connect to %s: %s\n",
            o.tcp ? o.tcp : o.unix_path, strerror(-fd));
    return 1;
  }
  uint64_t size;
  uint16_t tflags;
  int err = stock_handshake(fd, o.export_name, &size, &tflags);
  if (err < 0) {
    fprintf(stderr, "stockclient: handshake: %s\n", strerror(-err));
    close(fd);
    return 1;
  }
  if (tflags & NBD_FLAG_READ_ONLY) {
    fprintf(stderr, "stockclient: export is read-only\n");
    close(fd);
    return 1;
  }
  err = stock_run(&o, fd, size);
  close(fd);
  return err < 0 ? 1 : 0;
}
