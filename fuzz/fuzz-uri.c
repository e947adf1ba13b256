/* fuzz-uri.c: NBD URIs as a user or a script passes them (uri_parse,
 * uri_decode). A URI that parses must describe one transport completely;
 * one that fails must say why. */
#include <string.h>

#include "fuzz.h"
#include "proto/nbd_uri.h"
#include "util/uri.h"

static void
check_parsed(const char *s, const struct nbd_uri *u)
{
  CHECK(uri_is_uri(s));
  CHECK(u->export_name != NULL);
  if (u->unix_socket) {
    CHECK(u->socket != NULL && u->socket[0] != '\0');
    CHECK(u->host == NULL);
  } else {
    CHECK(u->host != NULL && u->port != NULL && u->socket == NULL);
    char *end;
    unsigned long port = strtoul(u->port, &end, 10);
    CHECK(*end == '\0' && port >= 1 && port <= 65535);
  }
  CHECK(u->tls_verify_peer >= -1 && u->tls_verify_peer <= 1);
}

static void
decode(const char *s, size_t len)
{
  for (int nul = 0; nul <= 1; nul++) {
    size_t out = 0;
    char *d = uri_decode(s, len, nul, &out);
    if (d == NULL)
      continue;
    CHECK(out <= len && d[out] == '\0');
    CHECK(nul || strlen(d) == out);
    free(d);
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = fuzz_cstr(data, size);
  decode(s, strlen(s)); /* its callers pass parts of C strings */
  struct nbd_uri u;
  char err[256];
  memset(err, 0x55, sizeof err);
  if (uri_parse(s, &u, err, sizeof err) == 0) {
    check_parsed(s, &u);
    uri_free(&u);
  } else {
    size_t n = strnlen(err, sizeof err);
    CHECK(n > 0 && n < sizeof err);
  }
  free(s);
  return 0;
}
