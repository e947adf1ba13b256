/* test-uri.c: NBD URI parsing, including every example of the NBD URI
 * document's export-name table. Prints one ok / not ok line per case and
 * exits non-zero when any case fails. */
#include <stdio.h>
#include <string.h>

#include "proto/nbd_uri.h"
#include "util/uri.h"

static int failures;
static int count;

static void
check(bool cond, const char *what, const char *uri)
{
  count++;
  printf("%s %d - %s: %s\n", cond ? "ok" : "not ok", count, uri, what);
  if (!cond)
    failures++;
}

static bool
streq(const char *a, const char *b)
{
  if (a == NULL || b == NULL)
    return a == b;
  return strcmp(a, b) == 0;
}

/* Expects s to parse to the given fields (NULL host/socket = unset). */
static void
expect_ok(const char *s, bool tls, bool unix_socket, const char *host,
          const char *port, const char *sock, const char *name)
{
  struct nbd_uri u;
  char err[256];
  int r = uri_parse(s, &u, err, sizeof err);
  check(r == 0, r == 0 ? "parses" : err, s);
  if (r != 0)
    return;
  check(u.tls == tls && u.unix_socket == unix_socket, "scheme", s);
  check(streq(u.host, host), "host", s);
  check(streq(u.port, port), "port", s);
  check(streq(u.socket, sock), "socket", s);
  check(streq(u.export_name, name), "export name", s);
  uri_free(&u);
}

static void
expect_fail(const char *s, const char *why)
{
  struct nbd_uri u;
  char err[256];
  int r = uri_parse(s, &u, err, sizeof err);
  check(r != 0 && err[0] != '\0', why, s);
  if (r == 0)
    uri_free(&u);
}

int
main(void)
{
  /* The export-name table of the URI document. */
  expect_ok("nbd://example.com/disk", false, false, "example.com", "10809",
            NULL, "disk");
  expect_ok("nbd+unix:///disk?socket=sock", false, true, NULL, NULL, "sock",
            "disk");
  expect_ok("nbd://example.com/", false, false, "example.com", "10809", NULL,
            "");
  expect_ok("nbd://example.com", false, false, "example.com", "10809", NULL,
            "");
  expect_ok("nbd://example.com//disk", false, false, "example.com", "10809",
            NULL, "/disk");
  expect_ok("nbd://example.com/hello%20world", false, false, "example.com",
            "10809", NULL, "hello world");

  /* Ports, IPv6, userinfo, TLS schemes. */
  expect_ok("nbd://127.0.0.1:1234/x", false, false, "127.0.0.1", "1234",
            NULL, "x");
  expect_ok("nbd://[::1]:10810/", false, false, "::1", "10810", NULL, "");
  /* RFC 6874 zone: %25 stands for the '%' before the zone. */
  expect_ok("nbd://[fe80::1%25eth0]:10810/x", false, false, "fe80::1%eth0",
            "10810", NULL, "x");
  expect_ok("nbd://[fe80::1]", false, false, "fe80::1", "10809", NULL, "");
  expect_ok("nbd://alice@host:7/e", false, false, "host", "7", NULL, "e");
  expect_ok("nbd://host:/e", false, false, "host", "10809", NULL, "e");
  expect_ok("nbds://host/e?tls-type=psk&tls-verify-peer=0", true, false,
            "host", "10809", NULL, "e");
  expect_ok("nbds+unix:///?socket=/run/a%20b.sock", true, true, NULL, NULL,
            "/run/a b.sock", "");
  expect_ok("nbd+unix://?socket=s", false, true, NULL, NULL, "s", "");
  expect_ok("NBDS+Unix://?socket=s", true, true, NULL, NULL, "s", "");
  expect_ok("NBD://h/e", false, false, "h", "10809", NULL, "e");
  expect_ok("nbd://h/e?x-private=1", false, false, "h", "10809", NULL, "e");
  expect_ok("nbd:///e", false, false, "localhost", "10809", NULL, "e");

  {
    struct nbd_uri u;
    char err[256];
    int r = uri_parse("nbd://bob%40x@h/?tls-type=x509&tls-hostname=srv",
                      &u, err, sizeof err);
    check(r == 0 && streq(u.user, "bob@x") && streq(u.tls_type, "x509") &&
            streq(u.tls_hostname, "srv") && u.tls_verify_peer == -1,
          "userinfo and TLS parameters", "nbd://bob%40x@h/?...");
    if (r == 0)
      uri_free(&u);
  }
  {
    struct nbd_uri u;
    char err[256];
    int r = uri_parse("nbds://alice@h/?tls-psk-file=/k%20s.psk"
                      "&tls-certificates=d&tls-verify-peer=0",
                      &u, err, sizeof err);
    check(r == 0 && u.tls && streq(u.tls_psk_file, "/k s.psk") &&
            streq(u.tls_certificates, "d") && u.tls_verify_peer == 0,
          "libnbd's TLS credential parameters", "nbds://alice@h/?...");
    if (r == 0)
      uri_free(&u);
  }

  expect_fail("http://example.com/", "not an NBD scheme");
  expect_fail("nbd+unix:///disk", "unix URI without socket");
  expect_fail("nbd+unix://host/disk?socket=s", "unix URI with a host");
  expect_fail("nbd+unix://u@host/disk?socket=s", "unix URI with a host");
  {
    struct nbd_uri u;
    char err[256];
    int r = uri_parse("nbds+unix://al%69ce@/d?socket=s", &u, err, sizeof err);
    check(r == 0 && streq(u.user, "alice") && streq(u.socket, "s") &&
            streq(u.export_name, "d"),
          "unix URI with only a user", "nbds+unix://alice@/d?socket=s");
    if (r == 0)
      uri_free(&u);
  }
  expect_fail("nbd://host/disk?socket=s", "socket without unix scheme");
  expect_fail("nbd://host:0/", "port zero");
  expect_fail("nbd://host:65536/", "port too large");
  expect_fail("nbd://host:12a/", "port not a number");
  expect_fail("nbd://[::1/", "unterminated IPv6 literal");
  /* NBD's strings are UTF-8: a name that is not is refused, not sent. */
  expect_fail("nbd://h/a%FFb", "export name not UTF-8");
  expect_fail("nbd://h/%C0%80", "export name with an overlong NUL");
  expect_fail("nbd://h/%ED%A0%80", "export name with a surrogate");
  expect_ok("nbd://h/%C3%A9t%C3%A9", false, false, "h", "10809", NULL,
            "\xc3\xa9t\xc3\xa9");
  /* A parameter given twice: which one counts would be a guess. */
  expect_fail("nbd+unix:///?socket=/a&socket=/b", "socket given twice");
  expect_fail("nbds://h/?tls-psk-file=a;tls-psk-file=b", "psk file twice");
  expect_fail("nbds://h/?tls-verify-peer=0&tls-verify-peer=1",
              "tls-verify-peer given twice");
  expect_fail("nbd://[fe80::1%eth0]/", "bad IPv6 literal");
  /* Only the zone is decoded: an escape in the address, a raw '%', an
   * empty zone or a control byte in it are refused, not reinterpreted. */
  expect_fail("nbd://[2001:db8::1%32]/", "bad IPv6 literal");
  expect_fail("nbd://[%3a%3a1]/", "bad IPv6 literal");
  expect_fail("nbd://[fe80::1%3a%3a1]/", "bad IPv6 literal");
  expect_fail("nbd://[fe80::1%25]/", "bad IPv6 literal");
  expect_fail("nbd://[fe80::1%25a%0ab]/", "bad IPv6 literal");
  expect_fail("nbd://[]/", "bad IPv6 literal");
  expect_ok("nbd://[fe80::1%25eth%2D0]/", false, false, "fe80::1%eth-0",
            "10809", NULL, "");
  /* A host name decodes to no delimiter, control byte or space. */
  expect_fail("nbd://%3a/", "host decoding to ':'");
  expect_fail("nbd://ho%2fst/", "host decoding to '/'");
  expect_fail("nbd://ho%0ast/", "host decoding to a newline");
  expect_fail("nbd://ho%20st/", "host decoding to a space");
  expect_fail("nbd://ho%2540/", "host decoding to '%'");
  expect_ok("nbd://ex%61mple.org:10810/e", false, false, "example.org",
            "10810", NULL, "e");
  expect_fail("nbd://host/a%2", "truncated escape");
  expect_fail("nbd://host/a%zz", "bad escape");
  expect_fail("nbd://host/a%00b", "NUL in export name");
  expect_fail("nbd://host/?frobnicate=1", "unknown query parameter");
  expect_fail("nbd://host/?tls-verify-peer=2", "bad tls-verify-peer");
  expect_fail("nbd://host/?tls-verify-peer=1%00", "tls-verify-peer with a NUL");
  expect_fail("nbd+unix:///?socket=%00abstract", "abstract socket refused");
  expect_fail("nbd://host/e#frag", "fragment");
  expect_fail("nbd://host/my export", "unescaped space in the export name");
  expect_fail("nbd://host/e?tls-certificates=/a b", "unescaped space in a query");
  expect_fail("nbd+unix:///e?socket=/tmp/s\tx", "tab in a socket path");
  expect_ok("nbd://host/my%20export", false, false, "host", "10809", NULL,
            "my export");

  check(uri_is_uri("nbd+unix:///?socket=x") && uri_is_uri("nbds://h") &&
          uri_is_uri("NBD://h") && !uri_is_uri("disk.img") &&
          !uri_is_uri("/abs/disk.img") && !uri_is_uri("null:"),
        "uri_is_uri: URIs and file names", "(several)");
  /* Mistyped URIs are URIs (and fail to parse), never file names. */
  check(uri_is_uri("nbd:mem") && uri_is_uri("nbd+unix:mem") &&
          uri_is_uri("nbds:/h/x") && uri_is_uri("nbd+tcp://h/") &&
          uri_is_uri("http://h/x"),
        "uri_is_uri: mistyped URIs", "(several)");
  /* A colon in a plain file name does not make it a URI. */
  check(!uri_is_uri("backup:2024.img") && !uri_is_uri("nbdx:1") &&
          !uri_is_uri("2024:img") && !uri_is_uri("a b:c"),
        "uri_is_uri: names with a colon", "(several)");
  expect_fail("nbd:mem", "scheme without //");
  expect_fail("nbd+tcp://h/", "unknown nbd+ scheme");

  printf("1..%d\n", count);
  return failures ? 1 : 0;
}
