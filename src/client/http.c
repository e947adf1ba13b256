/* http.c: the HTTP(S) PUT that opens an upload to xapi's receivers.
 *
 * The request goes out and the whole answer's head is read before a byte
 * of data: a non-2xx answer is an error that quotes its status line; a
 * 2xx with "Transfer-Encoding: nbd" hands the socket over to NBD (the
 * handshake follows on it); any other 2xx expects the upload as a body
 * (Chunked frames). The head is read a byte at a time, so that nothing
 * after it (an NBD greeting that came in the same segment) is taken from
 * the socket: it is a few hundred bytes once per connection. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "client/client.h"
#include "net/loop.h"
#include "proto/http.h"

static int
http_left(uint64_t deadline)
{
  if (deadline == 0)
    return -1;
  uint64_t now = loop_now_ms();
  return now >= deadline ? 0 : (int)(deadline - now);
}

/* The start of a refusal's body (a receiver says why there), as one
 * printable line in out ("" when none came within 200 ms). */
static void
http_refusal_text(struct client_conn *c, char *out, size_t outlen)
{
  char body[200];
  size_t have = transport_recv_within(&c->tp, body, sizeof body, 200);
  size_t k = 0;
  for (size_t i = 0; i < have && body[i] != '\n' && body[i] != '\r' &&
                     k + 1 < outlen; i++)
    out[k++] = body[i] >= 0x20 && body[i] < 0x7f ? body[i] : '?';
  out[k] = '\0';
}

/* True, with why in msg, once the first have bytes of an answer cannot
 * begin an HTTP status line: a TLS record (an https port reached with
 * http://), an NBD greeting (an NBD port), or other bytes. Waiting for
 * the end of a head that never comes would take the whole timeout. */
static bool
http_not_http(const char *resp, size_t have, char *msg, size_t msglen)
{
  static const char http[] = "HTTP/", nbd[] = "NBDMAGIC";
  size_t k = have < 5 ? have : 5;
  if (memcmp(resp, http, k) == 0)
    return false;
  if (have < 8 && memcmp(resp, nbd, have) == 0)
    return false; /* perhaps an NBD greeting: read on to say so */
  const unsigned char *b = (const unsigned char *)resp;
  if (have >= 8 && memcmp(resp, nbd, 8) == 0)
    snprintf(msg, msglen, "the server sent an NBD greeting, not an HTTP "
             "answer: that port is an NBD server's (nbd://HOST:PORT/)");
  else if ((b[0] == 0x15 || b[0] == 0x16) && have < 2)
    return false;
  else if ((b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03)
    snprintf(msg, msglen, "the server answered in TLS, not plain HTTP: "
             "that port wants https://");
  else
    snprintf(msg, msglen, "the answer to the PUT is not HTTP: it begins "
             "with byte 0x%02x", b[0]);
  return true;
}

int
client_http_put(struct client_conn *c, const struct client_http *h,
                const struct tls_creds *creds, int timeout_ms)
{
  const struct http_url *u = h->url;
  uint64_t deadline = timeout_ms >= 0 ? loop_now_ms() + (uint64_t)timeout_ms
                                      : 0;
  char err[224];
  int r;
  if (h->tls_start) {
    r = tls_client_start(&c->tp, &h->tls, creds, http_left(deadline), err,
                         sizeof err);
    if (r < 0) {
      snprintf(c->errmsg, sizeof c->errmsg, "HTTPS with %s port %s: %s",
               u->host, u->port, err);
      return r;
    }
    c->info.tls = true;
  }
  char head[HTTP_MAX_TARGET + 1024];
  int n = http_put_head(head, sizeof head, u, h->chunked_cookie);
  if (n < 0) {
    snprintf(c->errmsg, sizeof c->errmsg, "the PUT request does not fit in "
             "%zu bytes (user name or path too long)", sizeof head);
    return n;
  }
  r = transport_send_buf(&c->tp, head, (size_t)n, 0, http_left(deadline));
  if (r < 0) {
    snprintf(c->errmsg, sizeof c->errmsg, "sending the PUT request: %s",
             strerror(-r));
    return r;
  }
  static __thread char resp[HTTP_MAX_HEAD];
  struct http_response rsp;
again:;
  size_t have = 0, end = 0;
  while (end == 0) {
    if (have == sizeof resp) {
      snprintf(c->errmsg, sizeof c->errmsg, "the server's answer has no "
               "end of head within %u bytes", HTTP_MAX_HEAD);
      return -EPROTO;
    }
    r = transport_recv_all(&c->tp, resp + have, 1, http_left(deadline));
    if (r == -ECONNRESET && have == 0) {
      snprintf(c->errmsg, sizeof c->errmsg, "the server closed the "
               "connection without answering the PUT");
      return -ECONNRESET;
    }
    if (r == -ECONNRESET) {
      snprintf(c->errmsg, sizeof c->errmsg, "the server closed the "
               "connection in the middle of its answer (%zu bytes)", have);
      return r;
    }
    if (r == -ETIMEDOUT) {
      snprintf(c->errmsg, sizeof c->errmsg, "no complete answer to the PUT "
               "within the timeout (%zu bytes came)", have);
      return r;
    }
    if (r < 0) {
      snprintf(c->errmsg, sizeof c->errmsg, "reading the answer to the PUT: "
               "%s", strerror(-r));
      return r;
    }
    have++;
    if (http_not_http(resp, have, c->errmsg, sizeof c->errmsg))
      return -EPROTO;
    end = http_head_end(resp, have);
  }
  r = http_parse_response(resp, end, &rsp, err, sizeof err);
  if (r < 0) {
    snprintf(c->errmsg, sizeof c->errmsg, "the answer to the PUT is not "
             "HTTP: %.200s", err);
    return r;
  }
  /* An interim answer (100 Continue, 102, 103) comes before the real
   * one, which HTTP says to wait for; 101 would switch protocols, which
   * we did not ask for, and counts as a refusal below. */
  if (rsp.status >= 100 && rsp.status <= 199 && rsp.status != 101)
    goto again;
  if (rsp.status < 200 || rsp.status > 299) {
    char why[128];
    http_refusal_text(c, why, sizeof why);
    snprintf(c->errmsg, sizeof c->errmsg, "the server refused the PUT: "
             "'%.100s'%s%.100s", rsp.status_line, why[0] ? ": " : "", why);
    return rsp.status == 401 || rsp.status == 403 ? -EACCES
           : rsp.status == 404                    ? -ENOENT
                                                  : -EPROTO;
  }
  if (rsp.te_nbd)
    return 0;
  if (h->need_nbd) {
    snprintf(c->errmsg, sizeof c->errmsg, "the server answered '%.100s' without "
             "'Transfer-Encoding: nbd': it expects the data as a body "
             "(--dst-protocol chunked), not NBD", rsp.status_line);
    return -EPROTO;
  }
  return 1;
}
