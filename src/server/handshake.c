/* handshake.c: fixed newstyle negotiation, one function per option
 * (§Handshake, §Option types). Runs on the loop thread only. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "util/log.h"


static enum hs_progress handshake_tls_begin(struct conn *c);


void
handshake_queue(struct conn *c, const void *p, size_t len)
{
  if (c->hs_out_len + len > c->hs_out_cap) {
    size_t cap = c->hs_out_cap ? c->hs_out_cap : 1024;
    while (cap < c->hs_out_len + len)
      cap *= 2;
    uint8_t *n = realloc(c->hs_out, cap);
    if (n == NULL) { /* handshake_option sees this and closes */
      c->hs_failed = true;
      return;
    }
    c->hs_out = n;
    c->hs_out_cap = cap;
  }
  memcpy(c->hs_out + c->hs_out_len, p, len);
  c->hs_out_len += len;
}

enum hs_progress
handshake_flush(struct conn *c)
{
  while (c->hs_out_len > 0) {
    struct iovec iov = { .iov_base = c->hs_out, .iov_len = c->hs_out_len };
    ssize_t n = c->t.ops->sendv(&c->t, &iov, 1, 0);
    if (n == -EAGAIN)
      break;
    if (n < 0) {
      /* After a refusal the client often just leaves: the refusal's line
       * already says what went wrong. After ABORT it may leave without
       * reading the answer (§NBD_OPT_ABORT): nothing went wrong. */
      if (conn_nlogged(c) > 0 || c->opt.option == NBD_OPT_ABORT)
        log_debug("%s: client gone during the handshake (send: %s)",
                  c->peer, strerror((int)-n));
      else
        log_warn("%s: client gone during the handshake (send: %s)",
                 c->peer, strerror((int)-n));
      return HS_CLOSE;
    }
    memmove(c->hs_out, c->hs_out + n, c->hs_out_len - (size_t)n);
    c->hs_out_len -= (size_t)n;
  }
  if (c->hs_out_len == 0) {
    int r = c->t.ops->flush(&c->t);
    if (r < 0 && r != -EAGAIN)
      return HS_CLOSE;
    if (r == -EAGAIN) {
      pthread_mutex_lock(&c->lock);
      c->want_out = true;
      conn_update_events(c);
      pthread_mutex_unlock(&c->lock);
      return HS_WAIT;
    }
  }
  pthread_mutex_lock(&c->lock);
  c->want_out = c->hs_out_len > 0;
  conn_update_events(c);
  pthread_mutex_unlock(&c->lock);
  if (c->hs_out_len == 0 && c->state == CS_CLOSING && c->exp == NULL)
    return HS_CLOSE; /* ABORT acknowledged: now close */
  if (c->hs_out_len == 0 && c->tls_starting)
    return handshake_tls_begin(c) == HS_CLOSE ? HS_CLOSE : HS_DONE;
  return c->hs_out_len == 0 ? HS_DONE : HS_WAIT;
}

void
handshake_start(struct conn *c)
{
  uint8_t g[NBD_GREETING_LEN];
  wire_encode_greeting(g, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  handshake_queue(c, g, sizeof g);
  conn_expect(c, CS_CLIENT_FLAGS, c->msg, 4);
  if (handshake_flush(c) == HS_CLOSE)
    conn_close(c, NULL);
}

int
handshake_flags(struct conn *c)
{
  c->cflags = wire_decode_cflags(c->msg);
  uint32_t known = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;
  if (c->cflags & ~known) {
    /* Text or a TLS record where four flag bytes belong: name the
     * protocol that reached the NBD port. */
    const uint8_t *m = c->msg;
    bool text = true;
    for (int i = 0; i < 4; i++)
      text = text && ((m[i] >= 'A' && m[i] <= 'Z') || m[i] == ' ');
    conn_log(c, "unknown client flags 0x%x%s", c->cflags & ~known,
             text ? " (text: an HTTP client at the NBD port?)"
             : m[0] == 0x16 && m[1] == 0x03
                 ? " (a TLS handshake: NBD starts TLS inside its own "
                   "negotiation, nbds://)"
                 : "");
    return -1;
  }
  conn_expect(c, CS_OPT_HDR, c->msg, NBD_OPT_HDR_LEN);
  return 0;
}

static void
opt_reply(struct conn *c, uint32_t type, const void *data, size_t len)
{
  uint8_t h[NBD_OPT_REPLY_HDR_LEN];
  wire_encode_opt_reply(h, c->opt.option, type, (uint32_t)len);
  handshake_queue(c, h, sizeof h);
  if (len)
    handshake_queue(c, data, len);
}

/* An error reply with a message for the client, and one log line. */
static void
opt_error(struct conn *c, uint32_t type, const char *fmt, ...)
{
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0)
    n = 0;
  if ((size_t)n >= sizeof msg)
    n = sizeof msg - 1;
  /* Clients ask INFO, then GO, for the same missing export: one line. */
  uint32_t h = 2166136261u ^ type;
  for (int i = 0; i < n; i++)
    h = (h ^ (uint8_t)msg[i]) * 16777619u;
  if (conn_nlogged(c) == 0 || h != c->last_refusal)
    conn_log(c, "option %s: %s: %s", wire_opt_name(c->opt.option),
             wire_rep_name(type), msg);
  c->last_refusal = h;
  opt_reply(c, type, msg, (size_t)n);
}

static void
transmission_start(struct conn *c, struct export *e)
{
  c->exp = e;
  c->deadline_ms = 0;
  if (c->meta_export != e)
    c->meta_base_allocation = false;
  log_debug("%s: export \"%s\": transmission, %s replies", c->peer, e->name,
            c->extended ? "extended" : c->structured ? "structured"
                                                     : "simple");
  conn_expect(c, CS_REQ_HDR, c->msg, wire_request_len(c->extended));
}

/* The export a client's name means on c: the empty name is the one the
 * HTTP path named (PUT /nbd/NAME), else the server's first. */
static struct export *
conn_find_export(struct conn *c, const uint8_t *name, size_t len)
{
  if (len == 0 && c->dflt_export)
    return c->dflt_export;
  return server_find_export(c->srv, name, len);
}

static int
opt_export_name(struct conn *c, const uint8_t *data, uint32_t len)
{
  if (len > NBD_MAX_STRING) {
    conn_log(c, "EXPORT_NAME: name of %u bytes is longer than %d", len,
           NBD_MAX_STRING);
    return -1; /* EXPORT_NAME cannot be answered with an error */
  }
  struct export *e = conn_find_export(c, data, len);
  if (e == NULL) {
    char esc[LOG_ESCAPE_BUF];
    conn_log(c, "EXPORT_NAME: no export \"%s\"", log_escape(esc, data, len));
    return -1;
  }
  uint8_t r[NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN];
  size_t n = wire_encode_export_name_reply(
    r, e->size, export_tflags(e, c->structured),
    !(c->cflags & NBD_FLAG_C_NO_ZEROES));
  handshake_queue(c, r, n);
  transmission_start(c, e);
  return 0;
}

static void
opt_list(struct conn *c)
{
  struct server *s = c->srv;
  if (c->opt.length) {
    opt_error(c, NBD_REP_ERR_INVALID, "LIST takes no data");
    return;
  }
  for (int i = 0; i < s->nexports; i++) {
    struct export *e = s->exports[i];
    size_t nl = strlen(e->name), dl = e->description ? strlen(e->description)
                                                     : 0;
    uint8_t *p = malloc(4 + nl + dl);
    if (p == NULL)
      continue;
    size_t n = wire_encode_rep_server(p, e->name, (uint32_t)nl,
                                      e->description, (uint32_t)dl);
    opt_reply(c, NBD_REP_SERVER, p, n);
    free(p);
  }
  opt_reply(c, NBD_REP_ACK, NULL, 0);
}

/* STARTTLS (§NBD_OPT_STARTTLS, §TLS support). NOTLS mode refuses with
 * ERR_POLICY; otherwise the ACK goes out in clear and TLS starts once it
 * has left (handshake_flush). */
static void
opt_starttls(struct conn *c)
{
  if (c->opt.length) {
    opt_error(c, NBD_REP_ERR_INVALID, "STARTTLS takes no data");
    return;
  }
  if (c->srv->tls == NULL) {
    opt_error(c, NBD_REP_ERR_POLICY, "TLS is not configured on this server");
    return;
  }
  if (c->tls) {
    opt_error(c, NBD_REP_ERR_INVALID, "TLS is already on");
    return;
  }
  opt_reply(c, NBD_REP_ACK, NULL, 0);
  /* Nothing negotiated in clear survives the upgrade. */
  c->structured = false;
  c->extended = false;
  c->meta_export = NULL;
  c->meta_base_allocation = false;
  c->tls_starting = true;
}

/* FORCEDTLS before TLS (§FORCEDTLS mode): only STARTTLS and ABORT are
 * served. Returns true when the option was answered (or must close the
 * connection: *r = -1). */
static bool
opt_tls_required(struct conn *c, int *r)
{
  if (c->srv->cfg.tls_mode != TLS_REQUIRE || c->tls ||
      c->opt.option == NBD_OPT_STARTTLS || c->opt.option == NBD_OPT_ABORT)
    return false;
  if (c->opt.option == NBD_OPT_EXPORT_NAME) {
    conn_log(c, "EXPORT_NAME before STARTTLS, but TLS is required");
    *r = -1; /* EXPORT_NAME cannot be answered with an error */
    return true;
  }
  /* One line per connection: a clear client would otherwise log one
   * for each option it tries. */
  static const char msg[] = "TLS is required: send STARTTLS first";
  if (!c->tls_refused) {
    c->tls_refused = true;
    conn_log(c, "option %s in clear: %s", wire_opt_name(c->opt.option), msg);
  }
  opt_reply(c, NBD_REP_ERR_TLS_REQD, msg, sizeof msg - 1);
  return true;
}

/* The ACK to STARTTLS has left: switch the transport to TLS. Returns as
 * handshake_tls_step. */
static enum hs_progress
handshake_tls_begin(struct conn *c)
{
  char err[256];

  c->tls_starting = false;
  if (c->in_off < c->in_len) {
    /* Plaintext sent behind STARTTLS before our ACK could be an injected
     * command; it must never reach TLS or the option parser. */
    log_warn("%s: %zu bytes sent in clear behind STARTTLS; closing the "
             "connection", c->peer, c->in_len - c->in_off);
    return HS_CLOSE;
  }
  if (tls_server_start(&c->t, c->srv->tls, err, sizeof err) < 0) {
    log_warn("%s: cannot start TLS: %s; closing the connection", c->peer,
             err);
    return HS_CLOSE;
  }
  c->state = CS_TLS_HANDSHAKE;
  return handshake_tls_step(c);
}

enum hs_progress
handshake_tls_step(struct conn *c)
{
  char err[512];
  bool want_write;

  int r = tls_handshake_step(&c->t, &want_write, err, sizeof err);
  if (r == -EAGAIN) {
    pthread_mutex_lock(&c->lock);
    c->want_out = want_write;
    conn_update_events(c);
    pthread_mutex_unlock(&c->lock);
    return HS_WAIT;
  }
  if (r < 0) {
    log_warn("%s: TLS handshake failed: %s; closing the connection",
             c->peer, err);
    return HS_CLOSE;
  }
  c->tls = true;
  conn_expect(c, CS_OPT_HDR, c->msg, NBD_OPT_HDR_LEN);
  if (log_threshold >= LOG_DEBUG) {
    char esc[LOG_ESCAPE_BUF];
    tls_describe(&c->t, err, sizeof err); /* holds the client's username */
    log_debug("%s: TLS established: %s", c->peer,
              log_escape(esc, err, strlen(err)));
  }
  pthread_mutex_lock(&c->lock);
  c->want_out = false;
  conn_update_events(c);
  pthread_mutex_unlock(&c->lock);
  return HS_DONE;
}

/* An NBD_REP_INFO of NAME or DESCRIPTION (len <= NBD_MAX_STRING). */
static void
info_text_reply(struct conn *c, uint16_t type, const char *text, size_t len)
{
  uint8_t buf[2 + NBD_MAX_STRING];
  opt_reply(c, NBD_REP_INFO, buf,
            wire_encode_info_text(buf, type, text, len));
}

static int
opt_info_go(struct conn *c, const uint8_t *data, uint32_t len)
{
  struct wire_info_req ir;
  bool go = c->opt.option == NBD_OPT_GO;

  if (wire_decode_info_req(data, len, &ir) < 0) {
    opt_error(c, NBD_REP_ERR_INVALID, "malformed request (%u bytes)", len);
    return 0;
  }
  if (ir.name_len > NBD_MAX_STRING) {
    opt_error(c, NBD_REP_ERR_INVALID, "export name of %u bytes is longer "
              "than %d", ir.name_len, NBD_MAX_STRING);
    return 0;
  }
  struct export *e = conn_find_export(c, ir.name, ir.name_len);
  if (e == NULL) {
    char esc[LOG_ESCAPE_BUF];
    opt_error(c, NBD_REP_ERR_UNKNOWN, "no export \"%s\"",
              log_escape(esc, ir.name, ir.name_len));
    return 0;
  }
  bool want_name = false, want_desc = false, want_sizes = false;
  for (uint16_t i = 0; i < ir.nreqs; i++) {
    uint16_t t = wire_info_req_code(&ir, i);
    want_name |= t == NBD_INFO_NAME;
    want_desc |= t == NBD_INFO_DESCRIPTION;
    want_sizes |= t == NBD_INFO_BLOCK_SIZE;
  }
  uint8_t p[14];
  opt_reply(c, NBD_REP_INFO, p,
            wire_encode_info_export(p, e->size,
                                    export_tflags(e, c->structured)));
  if (want_name)
    info_text_reply(c, NBD_INFO_NAME, e->name, strlen(e->name));
  if (want_desc && e->description)
    info_text_reply(c, NBD_INFO_DESCRIPTION, e->description,
                    strlen(e->description));
  opt_reply(c, NBD_REP_INFO, p,
            wire_encode_info_block_size(p, e->min_block ? e->min_block : 1,
                                        SERVER_PREFERRED_BLOCK,
                                        SERVER_MAX_PAYLOAD));
  opt_reply(c, NBD_REP_ACK, NULL, 0);
  if (go) {
    /* §Size constraints: a GO that asks for them "MUST abide by the
     * size constraints it receives"; any other client may not know
     * them (SERVER_MAX_UNSIZED). */
    c->sizes_agreed = want_sizes;
    transmission_start(c, e);
  }
  return 0;
}

static void
opt_structured_reply(struct conn *c)
{
  if (c->opt.length)
    opt_error(c, NBD_REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
  else if (c->extended)
    opt_error(c, NBD_REP_ERR_EXT_HEADER_REQD,
              "extended headers are already on");
  else if (c->structured)
    opt_error(c, NBD_REP_ERR_INVALID, "structured replies are already on");
  else {
    c->structured = true;
    opt_reply(c, NBD_REP_ACK, NULL, 0);
  }
}

static void
opt_extended_headers(struct conn *c)
{
  if (c->opt.length)
    opt_error(c, NBD_REP_ERR_INVALID, "EXTENDED_HEADERS takes no data");
  else if (c->extended)
    opt_error(c, NBD_REP_ERR_INVALID, "extended headers are already on");
  else {
    c->extended = true;
    c->structured = true; /* every reply is now a chunk */
    opt_reply(c, NBD_REP_ACK, NULL, 0);
  }
}

static bool
meta_is(const uint8_t *q, uint32_t ql, const char *s)
{
  return ql == strlen(s) && memcmp(q, s, ql) == 0;
}

static void
meta_context_reply(struct conn *c, uint32_t id)
{
  const char *name = NBD_META_BASE_ALLOCATION;
  uint8_t p[4 + sizeof NBD_META_BASE_ALLOCATION];
  opt_reply(c, NBD_REP_META_CONTEXT, p,
            wire_encode_rep_meta(p, id, name, (uint32_t)strlen(name)));
}

static void
opt_meta_context(struct conn *c, const uint8_t *data, uint32_t len)
{
  bool set = c->opt.option == NBD_OPT_SET_META_CONTEXT;
  struct wire_meta_req mr;

  if (!c->structured) {
    opt_error(c, NBD_REP_ERR_INVALID, "structured replies not negotiated");
    return;
  }
  if (wire_decode_meta_req(data, len, &mr) < 0) {
    opt_error(c, NBD_REP_ERR_INVALID, "malformed request (%u bytes)", len);
    return;
  }
  if (mr.name_len > NBD_MAX_STRING) {
    opt_error(c, NBD_REP_ERR_INVALID, "export name of %u bytes is longer "
              "than %d", mr.name_len, NBD_MAX_STRING);
    return;
  }
  struct export *e = conn_find_export(c, mr.name, mr.name_len);
  if (e == NULL) {
    char esc[LOG_ESCAPE_BUF];
    opt_error(c, NBD_REP_ERR_UNKNOWN, "no export \"%s\"",
              log_escape(esc, mr.name, mr.name_len));
    return;
  }
  bool hit = !set && mr.nqueries == 0; /* LIST with no query: all */
  const uint8_t *q;
  uint32_t ql;
  while (wire_meta_next(&mr, &q, &ql)) {
    if (meta_is(q, ql, NBD_META_BASE_ALLOCATION) ||
        (!set && meta_is(q, ql, "base:")))
      hit = true;
  }
  if (hit)
    meta_context_reply(c, set ? 1 : 0);
  if (set) {
    c->meta_export = e;
    c->meta_base_allocation = hit;
  }
  opt_reply(c, NBD_REP_ACK, NULL, 0);
}

/* The options whose handlers read their data (and so cannot take data
 * that was dropped for its size). */
static bool
opt_reads_data(uint32_t option)
{
  switch (option) {
  case NBD_OPT_EXPORT_NAME:
  case NBD_OPT_INFO:
  case NBD_OPT_GO:
  case NBD_OPT_LIST_META_CONTEXT:
  case NBD_OPT_SET_META_CONTEXT:
    return true;
  default:
    return false;
  }
}

int
handshake_option_oversized(struct conn *c)
{
  uint32_t len = c->opt.length;
  if (c->opt.option == NBD_OPT_EXPORT_NAME ||
      !(c->cflags & NBD_FLAG_C_FIXED_NEWSTYLE)) {
    /* No error reply exists for them: the close is the answer. */
    conn_log(c, "option %s announces %u bytes of data, more than the %u "
             "any option may have; closing the connection",
             wire_opt_name(c->opt.option), len, SERVER_MAX_OPTION_DROP);
    return -1;
  }
  /* The answer the option would have had whatever its data, where the
   * spec makes one a MUST: ABORT's ACK (§NBD_OPT_ABORT: its data is to
   * be ignored), and ERR_TLS_REQD for any option before STARTTLS when
   * TLS is required (§FORCEDTLS mode). The close follows all the same. */
  int r = 0;
  if (c->opt.option == NBD_OPT_ABORT)
    opt_reply(c, NBD_REP_ACK, NULL, 0);
  else if (!opt_tls_required(c, &r))
    opt_error(c, NBD_REP_ERR_TOO_BIG, "option data of %u bytes is beyond "
              "the %u bytes any option may have; closing the connection",
              len, SERVER_MAX_OPTION_DROP);
  if (r < 0 || c->hs_failed)
    return -1;
  /* The data is never read: the stream cannot go on. handshake_flush
   * closes once the reply is out, as after ABORT. */
  c->state = CS_CLOSING;
  c->dst = NULL;
  return handshake_flush(c) == HS_CLOSE ? -1 : 0;
}

int
handshake_option(struct conn *c)
{
  const uint8_t *data = c->state == CS_OPT_DATA ? c->opt_buf : NULL;
  uint32_t len = c->opt.length;
  int r = 0;

  if (!(c->cflags & NBD_FLAG_C_FIXED_NEWSTYLE) &&
      c->opt.option != NBD_OPT_EXPORT_NAME) {
    conn_log(c, "option %s from a client without fixed newstyle",
           wire_opt_name(c->opt.option));
    return -1; /* unfixed newstyle has no way to answer */
  }
  if (c->opt.option == NBD_OPT_SET_META_CONTEXT) {
    /* §NBD_OPT_SET_META_CONTEXT: it "replaces all previously-set
     * metadata contexts (including when this command fails)", however it
     * fails: data too long, shutting down, TLS required. */
    c->meta_export = NULL;
    c->meta_base_allocation = false;
  }
  if (server_stopping(c->srv) && c->opt.option != NBD_OPT_ABORT) {
    /* §Option haggling: while shutting down, refuse further options. */
    if (c->opt.option == NBD_OPT_EXPORT_NAME)
      return -1; /* cannot be answered with an error */
    opt_error(c, NBD_REP_ERR_SHUTDOWN, "the server is shutting down");
  } else if (opt_tls_required(c, &r)) {
    /* answered; an over-long option's data was dropped already */
  } else if (c->state == CS_OPT_DISCARD && opt_reads_data(c->opt.option)) {
    /* The others are answered below as with any data: ABORT's ACK is a
     * MUST, an unknown option gets ERR_UNSUP (§Option types: MUST), and
     * the options that take no data look at its length alone. */
    if (c->opt.option == NBD_OPT_EXPORT_NAME) {
      conn_log(c, "EXPORT_NAME of %u bytes is too long", len);
      return -1;
    }
    opt_error(c, NBD_REP_ERR_TOO_BIG, "option data of %u bytes exceeds the "
              "%u-byte limit", len, SERVER_MAX_OPTION);
  } else {
    switch (c->opt.option) {
    case NBD_OPT_EXPORT_NAME:
      r = opt_export_name(c, data, len);
      break;
    case NBD_OPT_ABORT:
      opt_reply(c, NBD_REP_ACK, NULL, 0);
      c->state = CS_CLOSING;
      break;
    case NBD_OPT_LIST:
      opt_list(c);
      break;
    case NBD_OPT_STARTTLS:
      opt_starttls(c);
      break;
    case NBD_OPT_INFO:
    case NBD_OPT_GO:
      r = opt_info_go(c, data, len);
      break;
    case NBD_OPT_STRUCTURED_REPLY:
      opt_structured_reply(c);
      break;
    case NBD_OPT_EXTENDED_HEADERS:
      opt_extended_headers(c);
      break;
    case NBD_OPT_LIST_META_CONTEXT:
    case NBD_OPT_SET_META_CONTEXT:
      opt_meta_context(c, data, len);
      break;
    default:
      opt_error(c, NBD_REP_ERR_UNSUP, "option %u is not supported",
                c->opt.option);
      break;
    }
  }
  free(c->opt_buf);
  c->opt_buf = NULL;
  if (r < 0 || c->hs_failed)
    return -1;
  if (c->exp == NULL && c->state != CS_CLOSING)
    conn_expect(c, CS_OPT_HDR, c->msg, NBD_OPT_HDR_LEN);
  if (c->state == CS_CLOSING)
    c->dst = NULL;
  return handshake_flush(c) == HS_CLOSE ? -1 : 0;
}
