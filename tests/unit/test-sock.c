/* test-sock.c: sock_is_tcp_loopback over real connected sockets, each
 * made on this host: TCP to 127.0.0.1, 127.0.0.2, ::1 and ::ffff:127.0.0.1
 * say yes; a Unix socket pair and TCP to one of the host's own
 * non-loopback addresses (when it has one) say no. The copy takes its
 * data path from the answer (docs/copy-engine.md). */
#include "net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int failures;

/* Connects a TCP client to a listener bound to addr (port 0: any), both
 * of family fam; returns the client's fd, or -1 with why in *why. */
static int
tcp_pair(int fam, const char *addr, const char **why)
{
  struct sockaddr_storage ss;
  socklen_t len;
  memset(&ss, 0, sizeof ss);
  if (fam == AF_INET) {
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    in->sin_family = AF_INET;
    if (inet_pton(AF_INET, addr, &in->sin_addr) != 1)
      return *why = "bad address", -1;
    len = sizeof *in;
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    in6->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) != 1)
      return *why = "bad address", -1;
    len = sizeof *in6;
  }
  int l = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0)
    return *why = "no socket of this family", -1;
  if (fam == AF_INET6) {
    int off = 0; /* a v4-mapped peer needs a dual-stack listener */
    setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  }
  struct sockaddr_storage bound = ss;
  if (bind(l, (struct sockaddr *)&bound, len) < 0 || listen(l, 1) < 0) {
    close(l);
    return *why = "cannot bind or listen", -1;
  }
  socklen_t blen = sizeof bound;
  getsockname(l, (struct sockaddr *)&bound, &blen);
  int c = socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0 || connect(c, (struct sockaddr *)&bound, blen) < 0) {
    if (c >= 0)
      close(c);
    close(l);
    return *why = "cannot connect", -1;
  }
  int a = accept(l, NULL, NULL);
  if (a >= 0)
    close(a);
  close(l);
  return c;
}

/* expect FAM ADDR WANT: a connection to ADDR is loopback or not. An
 * address this host cannot use (no IPv6) is reported, not failed. */
static void
expect(int fam, const char *addr, bool want)
{
  const char *why = NULL;
  int fd = tcp_pair(fam, addr, &why);
  if (fd < 0) {
    printf("# %s: not checked: %s (%s)\n", addr, why, strerror(errno));
    return;
  }
  bool got = sock_is_tcp_loopback(fd);
  if (got != want) {
    fprintf(stderr, "test-sock: TCP to %s: loopback %s, expected %s\n",
            addr, got ? "yes" : "no", want ? "yes" : "no");
    failures++;
  } else {
    printf("ok: TCP to %s: loopback %s\n", addr, got ? "yes" : "no");
  }
  close(fd);
}

int
main(void)
{
  expect(AF_INET, "127.0.0.1", true);
  expect(AF_INET, "127.0.0.2", true);
  expect(AF_INET6, "::1", true);
  /* a dual-stack socket reached over IPv4 sees a v4-mapped peer */
  expect(AF_INET6, "::ffff:127.0.0.1", true);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0) {
    if (sock_is_tcp_loopback(sv[0])) {
      fprintf(stderr, "test-sock: a Unix socket pair counted as TCP\n");
      failures++;
    } else {
      printf("ok: Unix socket pair: not TCP loopback\n");
    }
    close(sv[0]);
    close(sv[1]);
  }

  /* The host's own non-loopback IPv4 address: the kernel routes it
   * through lo as well, but the peer is not a loopback address. */
  struct ifaddrs *ifa, *i;
  bool other = false;
  if (getifaddrs(&ifa) == 0) {
    for (i = ifa; i && !other; i = i->ifa_next) {
      if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
          (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
        continue;
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr,
                buf, sizeof buf);
      expect(AF_INET, buf, false);
      other = true;
    }
    freeifaddrs(ifa);
  }
  if (!other)
    printf("# no non-loopback IPv4 address is up: that case not checked\n");

  if (failures) {
    fprintf(stderr, "test-sock: %d failure(s)\n", failures);
    return 1;
  }
  printf("test-sock: all checks passed\n");
  return 0;
}
