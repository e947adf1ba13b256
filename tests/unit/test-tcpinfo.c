/* test-tcpinfo.c: the TCP_INFO sampler over a real loopback TCP pair, and
 * its derived figures and formats over a hand-filled summary.
 *
 * Asserts sanity only (counts, MSS, bytes per segment, well-formed JSON
 * with the expected keys), never timings: the machine is shared. */
#include "net/tcpinfo.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
              #cond);                                                 \
      failures++;                                                     \
    }                                                                 \
  } while (0)

/* A minimal validator for the JSON this module writes: one flat object
 * whose values are numbers or null. Returns true when s is exactly such
 * an object with no duplicate keys; counts the keys into *nkeys. */
static bool
json_flat_object_ok(const char *s, int *nkeys)
{
  char keys[64][48];
  int n = 0;

  if (*s++ != '{')
    return false;
  if (*s == '}')
    return s[1] == '\0' && (*nkeys = 0, true);
  for (;;) {
    if (*s++ != '"')
      return false;
    const char *end = strchr(s, '"');
    if (end == NULL || end == s || (size_t)(end - s) >= sizeof keys[0]
        || n == 64)
      return false;
    memcpy(keys[n], s, (size_t)(end - s));
    keys[n][end - s] = '\0';
    for (int i = 0; i < n; i++)
      if (strcmp(keys[i], keys[n]) == 0)
        return false;
    n++;
    s = end + 1;
    if (*s++ != ':')
      return false;
    if (strncmp(s, "null", 4) == 0) {
      s += 4;
    } else {
      char *num_end;
      if (*s != '-' && (*s < '0' || *s > '9'))
        return false;
      strtod(s, &num_end);
      if (num_end == s)
        return false;
      s = num_end;
    }
    if (*s == '}') {
      *nkeys = n;
      return s[1] == '\0';
    }
    if (*s++ != ',')
      return false;
  }
}

/* The numeric value of "key" in flat JSON object s, or -1 when missing
 * or null. */
static double
json_get(const char *s, const char *key)
{
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(s, pat);
  if (p == NULL)
    return -1.0;
  p += strlen(pat);
  if (strncmp(p, "null", 4) == 0)
    return -1.0;
  return strtod(p, NULL);
}

static const char *const expected_keys[] = {
  "samples", "stall_samples", "stall_pct", "mss", "bytes_per_seg",
  "bytes_per_seg_pct_mss", "inflight_segs_avg", "inflight_bytes_avg",
  "rtt_us", "rttvar_us", "delivery_rate_bps", "sndbuf_limited_pct",
  "rwnd_limited_pct", "retrans_segs",
};

static void
check_json(const char *json)
{
  int nkeys = 0;
  if (!json_flat_object_ok(json, &nkeys)) {
    fprintf(stderr, "malformed JSON: %s\n", json);
    failures++;
    return;
  }
  for (size_t i = 0; i < sizeof expected_keys / sizeof expected_keys[0];
       i++) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", expected_keys[i]);
    if (strstr(json, pat) == NULL) {
      fprintf(stderr, "JSON lacks key %s: %s\n", expected_keys[i], json);
      failures++;
    }
  }
}

/* A connected loopback TCP pair; returns 0 or -1. */
static int
tcp_pair(int *client, int *server)
{
  struct sockaddr_in a = { .sin_family = AF_INET };
  socklen_t alen = sizeof a;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);

  *client = *server = -1;
  if (lfd < 0)
    return -1;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0
      || listen(lfd, 1) < 0
      || getsockname(lfd, (struct sockaddr *)&a, &alen) < 0)
    goto fail;
  *client = socket(AF_INET, SOCK_STREAM, 0);
  if (*client < 0 || connect(*client, (struct sockaddr *)&a, sizeof a) < 0)
    goto fail;
  *server = accept(lfd, NULL, NULL);
  if (*server < 0)
    goto fail;
  close(lfd);
  return 0;

fail:
  perror("tcp_pair");
  close(lfd);
  if (*client >= 0)
    close(*client);
  return -1;
}

static int
recv_exact(int fd, char *buf, size_t len)
{
  while (len > 0) {
    ssize_t n = recv(fd, buf, len, 0);
    if (n <= 0)
      return -1;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Sends 64 chunks of 64 KiB client -> server, sampling both ends after
 * each chunk, and checks what the samples say. */
static void
test_loopback(void)
{
  enum { CHUNK = 64 * 1024, CHUNKS = 64 };
  static char out[CHUNK], in[CHUNK];
  struct tcpinfo_stats cs, ss;
  int c, s;
  char json[1024], line[512];

  if (tcp_pair(&c, &s) < 0) {
    failures++;
    return;
  }
  tcpinfo_init(&cs);
  tcpinfo_init(&ss);
  CHECK(tcpinfo_sample(&cs, c) == 0);
  CHECK(tcpinfo_sample(&ss, s) == 0);

  for (size_t i = 0; i < sizeof out; i++)
    out[i] = (char)(i * 7 + 1);
  for (int i = 0; i < CHUNKS; i++) {
    /* 64 KiB fits the loopback send buffer, so one blocking send
     * returns before the peer reads. */
    if (send(c, out, sizeof out, 0) != (ssize_t)sizeof out
        || recv_exact(s, in, sizeof in) < 0) {
      perror("transfer");
      failures++;
      break;
    }
    CHECK(memcmp(in, out, sizeof in) == 0);
    CHECK(tcpinfo_sample(&cs, c) == 0);
    CHECK(tcpinfo_sample(&ss, s) == 0);
  }

  CHECK(cs.samples == CHUNKS + 1);
  CHECK(cs.errors == 0);
  CHECK(cs.stall_samples <= cs.samples);
  CHECK(cs.snd_mss > 0);
  CHECK(cs.last.bytes_sent - cs.first.bytes_sent
        >= (uint64_t)CHUNK * CHUNKS);
  double bps = tcpinfo_bytes_per_seg(&cs);
  CHECK(bps > 0.0);
  /* A segment never carries more than the MSS (GSO super-packets are
   * counted as the segments they stand for). */
  CHECK(bps <= cs.snd_mss + 0.5);
  CHECK(ss.last.bytes_received - ss.first.bytes_received
        >= (uint64_t)CHUNK * CHUNKS);

  int n = tcpinfo_format_json(&cs, json, sizeof json);
  CHECK(n > 0 && (size_t)n == strlen(json));
  check_json(json);
  CHECK(json_get(json, "samples") == CHUNKS + 1);
  CHECK(json_get(json, "mss") > 0);
  CHECK(json_get(json, "bytes_per_seg") > 0);
  CHECK(json_get(json, "bytes_sent") >= (double)CHUNK * CHUNKS);
  n = tcpinfo_format_json(&ss, json, sizeof json);
  CHECK(n > 0);
  check_json(json);
  CHECK(json_get(json, "bytes_received") >= (double)CHUNK * CHUNKS);

  n = tcpinfo_format_line(&cs, line, sizeof line);
  CHECK(n > 0 && strncmp(line, "samples 65, stall ", 18) == 0);
  CHECK(strchr(line, '\n') == NULL);
  printf("client: %s\n", line);
  tcpinfo_format_line(&ss, line, sizeof line);
  printf("server: %s\n", line);

  close(c);
  close(s);
}

/* Derived figures from a summary filled by hand: exact values. */
static void
test_derived(void)
{
  struct tcpinfo_stats s;
  char json[1024];

  tcpinfo_init(&s);
  CHECK(tcpinfo_stall_pct(&s) == 0.0);
  CHECK(tcpinfo_bytes_per_seg(&s) == 0.0);
  CHECK(tcpinfo_format_json(&s, json, sizeof json) > 0);
  check_json(json);

  s.samples = 8;
  s.stall_samples = 2;
  s.have_notsent = s.have_delivery = s.have_limited = 1;
  s.have_bytes_sent = s.have_snd_wnd = 1;
  s.snd_mss = 1000;
  s.first.bytes_sent = 5000;
  s.last.bytes_sent = 5000 + 250 * 400;
  s.first.data_segs_out = 10;
  s.last.data_segs_out = 10 + 400;
  s.first.busy_us = 1000;
  s.last.busy_us = 1000 + 200000;
  s.last.sndbuf_limited_us = 50000;
  s.last.rwnd_limited_us = 20000;
  s.unacked_sum = 8 * 3;
  s.delivery_rate = 125000000; /* bytes/s = 1 Gbit/s */

  CHECK(tcpinfo_stall_pct(&s) == 25.0);
  CHECK(tcpinfo_bytes_per_seg(&s) == 250.0);
  CHECK(tcpinfo_format_json(&s, json, sizeof json) > 0);
  check_json(json);
  CHECK(json_get(json, "stall_pct") == 25.0);
  CHECK(json_get(json, "bytes_per_seg") == 250.0);
  CHECK(json_get(json, "bytes_per_seg_pct_mss") == 25.0);
  CHECK(json_get(json, "sndbuf_limited_pct") == 25.0);
  CHECK(json_get(json, "rwnd_limited_pct") == 10.0);
  CHECK(json_get(json, "inflight_segs_avg") == 3.0);
  CHECK(json_get(json, "delivery_rate_bps") == 1e9);

  /* An old kernel without the newer fields: those print as null. */
  s.have_limited = s.have_delivery = 0;
  CHECK(tcpinfo_format_json(&s, json, sizeof json) > 0);
  check_json(json);
  CHECK(strstr(json, "\"sndbuf_limited_pct\":null") != NULL);
  CHECK(strstr(json, "\"delivery_rate_bps\":null") != NULL);
}

/* Every counter at its maximum still fits the documented 1024 bytes, and
 * a short buffer is reported, not overrun. */
static void
test_bounds(void)
{
  struct tcpinfo_stats s;
  char json[1024], small[40];

  memset(&s, 0xff, sizeof s);
  s.first = (struct tcpinfo_counters){ 0 };
  int n = tcpinfo_format_json(&s, json, sizeof json);
  CHECK(n > 0);
  if (n > 0)
    check_json(json);
  CHECK(tcpinfo_format_line(&s, json, sizeof json) > 0);

  memset(small, 'x', sizeof small);
  CHECK(tcpinfo_format_json(&s, small, sizeof small - 1) == -ENOSPC);
  CHECK(small[sizeof small - 1] == 'x');
  CHECK(tcpinfo_format_json(&s, small, 0) == -ENOSPC);
}

/* A socket that is not TCP fails cleanly and is counted. */
static void
test_not_tcp(void)
{
  struct tcpinfo_stats s;
  int sv[2];

  tcpinfo_init(&s);
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) {
    perror("socketpair");
    failures++;
    return;
  }
  CHECK(tcpinfo_sample(&s, sv[0]) < 0);
  CHECK(s.errors == 1 && s.samples == 0);
  CHECK(tcpinfo_sample(&s, -1) == -EBADF);
  close(sv[0]);
  close(sv[1]);
}

int
main(void)
{
  test_loopback();
  test_derived();
  test_bounds();
  test_not_tcp();
  if (failures) {
    fprintf(stderr, "test-tcpinfo: %d failure(s)\n", failures);
    return 1;
  }
  printf("test-tcpinfo: ok\n");
  return 0;
}
