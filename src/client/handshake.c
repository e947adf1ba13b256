/* handshake.c: the client side of the NBD handshake (fixed newstyle with
 * GO/INFO, STRUCTURED_REPLY or EXTENDED_HEADERS, SET_META_CONTEXT, LIST;
 * EXPORT_NAME fallback; oldstyle). Blocking, with a deadline, over the
 * connection's transport table. */
#include "client/client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/loop.h"
#include "net/sock.h"
#include "net/tls.h"
#include "proto/wire.h"
#include "util/log.h"

struct hs {
  struct client_conn *c;
  const struct client_opts *o;
  const struct nbd_uri *u;
  uint64_t deadline; /* loop_now_ms() value, 0 for none */
  bool fixed;        /* fixed newstyle on both sides */
  bool no_zeroes;
  bool in_step;      /* an error reply was read whole: NBD_OPT_ABORT may end */
  uint8_t *payload;  /* last option reply payload, owned by hs */
};

static int
hs_fail(struct hs *h, int err, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->c->errmsg, sizeof h->c->errmsg, fmt, ap);
  va_end(ap);
  return err;
}

/* Copies a string the server sent, or fails: a name "MUST NOT contain NUL
 * characters" (§Conventions), and a copy cut at one would name an export
 * other than the one the server meant. */
static int
hs_strdup(struct hs *h, char **out, const uint8_t *p, size_t len,
          const char *what)
{
  if (memchr(p, 0, len) != NULL)
    return hs_fail(h, -EPROTO, "handshake: %s holds a NUL byte", what);
  *out = strndup((const char *)p, len);
  return *out ? 0 : hs_fail(h, -ENOMEM, "out of memory");
}

static int
hs_left(struct hs *h)
{
  if (h->deadline == 0)
    return -1;
  uint64_t now = loop_now_ms();
  return now >= h->deadline ? 0 : (int)(h->deadline - now);
}

static int
hs_send(struct hs *h, const void *buf, size_t len, int flags)
{
  int r = transport_send_buf(&h->c->tp, buf, len, flags, hs_left(h));
  if (r < 0)
    return hs_fail(h, r, "handshake: send failed: %s", strerror(-r));
  return 0;
}

/* Says why a read of the handshake failed with r (-errno). */
static int
hs_recv_failed(struct hs *h, int r)
{
  /* Under TLS 1.3 a server checks our certificate after our side of the
   * TLS handshake is over, so its refusal arrives here, as an alert. */
  const char *alert = r < 0 ? tls_peer_alert(&h->c->tp) : NULL;
  if (alert != NULL)
    return hs_fail(h, r, "handshake: the server ended the TLS session "
                   "with a fatal alert: %s", alert);
  return hs_fail(h, r, "handshake: %s",
                 r == -ECONNRESET ? "server closed the connection"
                                  : strerror(-r));
}

static int
hs_recv(struct hs *h, void *buf, size_t len)
{
  int r = transport_recv_all(&h->c->tp, buf, len, hs_left(h));
  return r < 0 ? hs_recv_failed(h, r) : 0;
}

/* Sends one option: header corked onto its data. */
static int
hs_send_opt(struct hs *h, uint32_t opt, const void *data, uint32_t len)
{
  uint8_t hdr[NBD_OPT_HDR_LEN];
  wire_encode_opt(hdr, opt, len);
  struct iovec iov[2] = { { hdr, sizeof hdr }, { (void *)data, len } };
  int r = transport_send_all(&h->c->tp, iov, len ? 2 : 1, 0, hs_left(h));
  if (r < 0)
    return hs_fail(h, r, "handshake: sending %s: %s", wire_opt_name(opt),
                   strerror(-r));
  return 0;
}

/* Reads one option reply for opt into *rep and h->payload. */
static int
hs_recv_reply(struct hs *h, uint32_t opt, struct wire_opt_reply *rep)
{
  uint8_t hdr[NBD_OPT_REPLY_HDR_LEN];
  int r = hs_recv(h, hdr, sizeof hdr);
  if (r < 0)
    return r;
  if (wire_decode_opt_reply(hdr, rep) < 0)
    return hs_fail(h, -EPROTO, "handshake: bad option reply magic");
  if (rep->option != opt)
    return hs_fail(h, -EPROTO, "handshake: reply for option %u to %s",
                   rep->option, wire_opt_name(opt));
  if (rep->length > CLIENT_MAX_OPT_REPLY)
    return hs_fail(h, -EPROTO, "handshake: %s reply of %u bytes is too long",
                   wire_opt_name(opt), rep->length);
  free(h->payload);
  h->payload = malloc(rep->length + 1);
  if (h->payload == NULL)
    return hs_fail(h, -ENOMEM, "out of memory");
  h->payload[rep->length] = 0;
  return hs_recv(h, h->payload, rep->length);
}

/* Error replies carry an optional human-readable message. */
static int
hs_reply_error(struct hs *h, uint32_t opt, const struct wire_opt_reply *rep)
{
  int err = rep->type == NBD_REP_ERR_UNSUP ? -ENOTSUP
          : rep->type == NBD_REP_ERR_UNKNOWN ? -ENOENT
          : rep->type == NBD_REP_ERR_POLICY ? -EPERM
          : rep->type == NBD_REP_ERR_TLS_REQD ? -EACCES
          : rep->type == NBD_REP_ERR_SHUTDOWN ? -ESHUTDOWN
          : -EINVAL;
  h->in_step = true;
  char why[LOG_ESCAPE_BUF]; /* the server's text, made safe to print */
  if (rep->type == NBD_REP_ERR_TLS_REQD && !h->u->tls)
    return hs_fail(h, err, "the server requires TLS: use an nbds:// URI "
                   "(with ?tls-certificates=DIR or ?tls-psk-file=FILE); it "
                   "refused %s in clear: %s%s%s", wire_opt_name(opt),
                   wire_rep_name(rep->type), rep->length ? ": " : "",
                   log_escape(why, h->payload, rep->length));
  return hs_fail(h, err, "server refused %s: %s%s%s", wire_opt_name(opt),
                 wire_rep_name(rep->type), rep->length ? ": " : "",
                 log_escape(why, h->payload, rep->length));
}

/* Options that are answered by a single ACK (STRUCTURED_REPLY,
 * EXTENDED_HEADERS). Returns 1 on ACK, 0 on an error reply. */
static int
hs_simple_opt(struct hs *h, uint32_t opt)
{
  struct wire_opt_reply rep;
  int r = hs_send_opt(h, opt, NULL, 0);
  if (r < 0)
    return r;
  r = hs_recv_reply(h, opt, &rep);
  if (r < 0)
    return r;
  if (rep.type == NBD_REP_ACK)
    return 1;
  if (rep.type == NBD_REP_ERR_SHUTDOWN)
    return hs_reply_error(h, opt, &rep);
  if (rep.type & NBD_REP_FLAG_ERROR)
    return 0;
  return hs_fail(h, -EPROTO, "handshake: unexpected reply to %s: %s (0x%x)",
                 wire_opt_name(opt), wire_rep_name(rep.type), rep.type);
}

/* What a LIST may make us keep: names are strings (at most
 * NBD_MAX_STRING bytes, §Conventions), and all of them together at most
 * this, far beyond any real server's list; a server could otherwise hold
 * 100000 replies of 64 KiB over us. */
#define HS_MAX_LIST_BYTES (16u << 20)

static int
hs_list(struct hs *h)
{
  struct client_info *in = &h->c->info;
  struct wire_opt_reply rep;
  size_t kept = 0;
  int r = hs_send_opt(h, NBD_OPT_LIST, NULL, 0);
  for (unsigned n = 0; r == 0 && n < 100000; n++) {
    r = hs_recv_reply(h, NBD_OPT_LIST, &rep);
    if (r < 0)
      return r;
    if (rep.type == NBD_REP_ACK)
      return 0;
    if (rep.type == NBD_REP_ERR_SHUTDOWN)
      return hs_reply_error(h, NBD_OPT_LIST, &rep);
    if (rep.type & NBD_REP_FLAG_ERROR)
      return 0; /* listing refused: not fatal for info */
    struct wire_rep_server srv;
    if (rep.type != NBD_REP_SERVER ||
        wire_decode_rep_server(h->payload, rep.length, &srv) < 0)
      return hs_fail(h, -EPROTO, "handshake: malformed LIST reply");
    if (srv.name_len > NBD_MAX_STRING)
      return hs_fail(h, -EPROTO, "handshake: LIST name of %u bytes, longer "
                     "than a string may be (%d)", (unsigned)srv.name_len,
                     NBD_MAX_STRING);
    kept += srv.name_len + sizeof(char *);
    if (kept > HS_MAX_LIST_BYTES)
      return hs_fail(h, -EPROTO, "handshake: LIST names beyond %u bytes "
                     "in all", HS_MAX_LIST_BYTES);
    char **v = realloc(in->exports, (in->nexports + 1) * sizeof *v);
    if (v == NULL)
      return hs_fail(h, -ENOMEM, "out of memory");
    in->exports = v;
    r = hs_strdup(h, &v[in->nexports], srv.name, srv.name_len,
                  "a LIST reply's export name");
    if (r < 0)
      return r;
    in->nexports++;
  }
  return r < 0 ? r : hs_fail(h, -EPROTO, "handshake: endless LIST reply");
}

static int
hs_set_meta(struct hs *h)
{
  const char *name = h->o->export_name;
  const char *const q[] = { NBD_META_BASE_ALLOCATION };
  uint32_t nlen = (uint32_t)strlen(name);
  uint8_t *buf = malloc(8 + nlen + 4 + strlen(q[0]));
  struct wire_opt_reply rep;
  if (buf == NULL)
    return hs_fail(h, -ENOMEM, "out of memory");
  size_t len = wire_encode_meta_req(buf, name, nlen, q, 1);
  int r = hs_send_opt(h, NBD_OPT_SET_META_CONTEXT, buf, (uint32_t)len);
  free(buf);
  for (unsigned n = 0; r == 0 && n < 1000; n++) {
    r = hs_recv_reply(h, NBD_OPT_SET_META_CONTEXT, &rep);
    if (r < 0)
      return r;
    if (rep.type == NBD_REP_ERR_SHUTDOWN)
      return hs_reply_error(h, NBD_OPT_SET_META_CONTEXT, &rep);
    if (rep.type & NBD_REP_FLAG_ERROR) {
      /* A failed SET leaves no context selected, whatever it replied
       * before (§NBD_OPT_SET_META_CONTEXT): copies then treat
       * everything as data. */
      h->c->info.allocation = false;
      return 0;
    }
    if (rep.type == NBD_REP_ACK)
      return 0;
    struct wire_rep_meta m;
    if (rep.type != NBD_REP_META_CONTEXT ||
        wire_decode_rep_meta(h->payload, rep.length, &m) < 0)
      return hs_fail(h, -EPROTO, "handshake: malformed META_CONTEXT reply");
    if (m.name_len == strlen(NBD_META_BASE_ALLOCATION) &&
        memcmp(m.name, NBD_META_BASE_ALLOCATION, m.name_len) == 0) {
      h->c->info.allocation = true;
      h->c->info.allocation_id = m.id;
    }
  }
  return r < 0 ? r : hs_fail(h, -EPROTO, "handshake: endless META reply");
}

/* Stores one NBD_REP_INFO item: 0, or -EPROTO (after hs_fail) when a known
 * item has the wrong length: "length MUST be 12" for NBD_INFO_EXPORT and 14
 * for NBD_INFO_BLOCK_SIZE (§NBD_REP_INFO). Skipping such an item would
 * leave the export's size at 0, and a copy of nothing would succeed.
 * *type receives the item's type. */
static int
hs_info_item(struct hs *h, const uint8_t *p, uint32_t len, uint16_t *type)
{
  struct client_info *in = &h->c->info;
  struct wire_info_item it;
  int bad = wire_decode_info_item(p, len, &it);
  *type = it.type;
  if (bad < 0)
    return hs_fail(h, -EPROTO, "handshake: %s of %u bytes",
                   it.type == NBD_INFO_EXPORT ? "NBD_INFO_EXPORT"
                                              : "NBD_INFO_BLOCK_SIZE",
                   (unsigned)len);
  if (it.type == NBD_INFO_EXPORT) {
    in->size = it.size;
    in->tflags = it.tflags;
  } else if (it.type == NBD_INFO_BLOCK_SIZE) {
    in->has_block_size = true;
    in->min_block = it.minimum;
    in->pref_block = it.preferred;
    in->max_block = it.maximum;
  } else if ((it.type == NBD_INFO_NAME && !in->name) ||
             (it.type == NBD_INFO_DESCRIPTION && !in->description)) {
    const char *what = it.type == NBD_INFO_NAME ? "NBD_INFO_NAME"
                                                : "NBD_INFO_DESCRIPTION";
    /* Only shown, never used to address the export: one holding a NUL
     * is left out (the caller may say so) rather than failing a copy. */
    char **dst = it.type == NBD_INFO_NAME ? &in->name : &in->description;
    if (memchr(it.text, 0, it.text_len) != NULL) {
      in->dropped = what;
      return 0;
    }
    *dst = strndup((const char *)it.text, it.text_len);
    return *dst ? 0 : hs_fail(h, -ENOMEM, "out of memory");
  } /* unknown items are ignored (§NBD_REP_INFO) */
  return 0;
}

/* GO: returns 0 when transmission starts, -ENOTSUP when the server does not
 * know GO (caller falls back to EXPORT_NAME), other -errno on failure. */
static int
hs_go(struct hs *h)
{
  const char *name = h->o->export_name;
  uint32_t nlen = (uint32_t)strlen(name);
  const uint16_t reqs[] = { NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME,
                            NBD_INFO_DESCRIPTION };
  uint8_t *buf = malloc(6 + nlen + sizeof reqs);
  struct wire_opt_reply rep;
  bool got_export = false;
  if (buf == NULL)
    return hs_fail(h, -ENOMEM, "out of memory");
  size_t len = wire_encode_info_req(buf, name, nlen, reqs, 3);
  int r = hs_send_opt(h, NBD_OPT_GO, buf, (uint32_t)len);
  free(buf);
  for (unsigned n = 0; r == 0 && n < 1000; n++) {
    r = hs_recv_reply(h, NBD_OPT_GO, &rep);
    if (r < 0)
      return r;
    if (rep.type == NBD_REP_INFO) {
      if (rep.length < 2)
        return hs_fail(h, -EPROTO, "handshake: empty NBD_REP_INFO");
      uint16_t type;
      r = hs_info_item(h, h->payload, rep.length, &type);
      got_export |= type == NBD_INFO_EXPORT;
      continue;
    }
    if (rep.type == NBD_REP_ACK) {
      if (!got_export)
        return hs_fail(h, -EPROTO, "handshake: GO acknowledged without "
                                   "NBD_INFO_EXPORT");
      return 0;
    }
    if (rep.type == NBD_REP_ERR_UNSUP && !h->c->info.extended)
      return -ENOTSUP;
    if (rep.type & NBD_REP_FLAG_ERROR)
      return hs_reply_error(h, NBD_OPT_GO, &rep);
    return hs_fail(h, -EPROTO, "handshake: unexpected reply to GO: %s (0x%x)",
                   wire_rep_name(rep.type), rep.type);
  }
  return r < 0 ? r : hs_fail(h, -EPROTO, "handshake: endless GO reply");
}

/* EXPORT_NAME: no option reply; failure is a closed connection. */
static int
hs_export_name(struct hs *h)
{
  const char *name = h->o->export_name;
  uint8_t buf[NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN];
  int r = hs_send_opt(h, NBD_OPT_EXPORT_NAME, name, (uint32_t)strlen(name));
  if (r < 0)
    return r;
  size_t len = NBD_EXPORT_NAME_REPLY_LEN + (h->no_zeroes ? 0 : NBD_ZEROES_LEN);
  r = hs_recv(h, buf, len);
  if (r < 0)
    return hs_fail(h, r, "server refused export \"%s\" (%s)", name,
                   r == -ECONNRESET ? "connection closed" : strerror(-r));
  wire_decode_export_name_reply(buf, &h->c->info.size, &h->c->info.tflags);
  return 0;
}

static int
hs_oldstyle(struct hs *h)
{
  uint8_t buf[NBD_OLDSTYLE_LEN - 16];
  int r = hs_recv(h, buf, sizeof buf);
  if (r < 0)
    return r;
  h->c->info.protocol = "oldstyle";
  wire_decode_oldstyle(buf, &h->c->info.size, &h->c->info.tflags);
  return 0;
}

/* The TLS settings an nbds URI asks for. */
static void
hs_tls_config(const struct nbd_uri *u, struct tls_client_config *cfg)
{
  *cfg = (struct tls_client_config){
    .certs_dir = u->tls_certificates,
    .psk_file = u->tls_psk_file,
    .anon = u->tls_type && strcmp(u->tls_type, "anon") == 0,
    .username = u->user,
    .hostname = u->tls_hostname ? u->tls_hostname
                                : u->unix_socket ? NULL : u->host,
    .verify_peer = u->tls_verify_peer != 0,
  };
}

/* The TLS query parameters of an nbds URI agree: 0, or -errno with the
 * reason in err. */
static int
client_check_tls_params(const struct nbd_uri *u, char *err, size_t errlen)
{
  const char *t = u->tls_type;
  if (!u->tls) {
    /* The nbd and nbd+unix schemes never use TLS here (as with libnbd).
     * A user who gave credentials meant to encrypt: going on in
     * plaintext would send the image in the clear without a word. */
    const char *given = u->tls_type           ? "tls-type"
                        : u->tls_psk_file     ? "tls-psk-file"
                        : u->tls_certificates ? "tls-certificates"
                        : u->tls_hostname     ? "tls-hostname"
                        : u->tls_verify_peer >= 0 ? "tls-verify-peer"
                                                  : NULL;
    if (given == NULL)
      return 0;
    const char *scheme = u->unix_socket ? "nbd+unix" : "nbd";
    snprintf(err, errlen,
             "%s in an %s:// URI, which never uses TLS: use nbds%s:// to "
             "encrypt, or drop it", given, scheme,
             u->unix_socket ? "+unix" : "");
    return -EINVAL;
  }
  if (t == NULL)
    return 0;
  if (strcmp(t, "x509") == 0) {
    /* A PSK file would win, and no certificate would be checked. */
    if (u->tls_psk_file == NULL)
      return 0;
    snprintf(err, errlen,
             "tls-type=x509 checks certificates: drop tls-psk-file");
    return -EINVAL;
  }
  if (strcmp(t, "psk") == 0) {
    if (u->tls_psk_file)
      return 0;
    snprintf(err, errlen, "tls-type=psk needs tls-psk-file=FILE");
    return -EINVAL;
  }
  if (strcmp(t, "anon") != 0) {
    snprintf(err, errlen,
             "tls-type=%s is not supported (anon, x509 or psk)", t);
    return -ENOTSUP;
  }
  /* Anonymous TLS checks no one: asking for a check, or giving
   * credentials or a name to check, means the user wanted something
   * else. */
  const char *drop = u->tls_verify_peer == 1 ? "tls-verify-peer=1"
                     : u->tls_psk_file       ? "tls-psk-file"
                     : u->tls_certificates   ? "tls-certificates"
                     : u->tls_hostname       ? "tls-hostname"
                                             : NULL;
  if (drop == NULL)
    return 0;
  snprintf(err, errlen, "tls-type=anon authenticates no one: drop %s", drop);
  return -EINVAL;
}

int
client_tls_load(const struct nbd_uri *u, struct tls_creds **out,
                char *err, size_t errlen)
{
  *out = NULL;
  int r = client_check_tls_params(u, err, errlen);
  if (r < 0 || !u->tls)
    return r;
  struct tls_client_config cfg;
  char why[224]; /* room for the prefix */
  hs_tls_config(u, &cfg);
  r = tls_creds_client_new(&cfg, out, why, sizeof why);
  if (r < 0)
    snprintf(err, errlen, "TLS credentials: %s", why);
  return r;
}

/* nbds URIs: STARTTLS, then the TLS handshake on the same fd. Any answer
 * but ACK ends the connection: falling back to plaintext is what a
 * man in the middle would want (§Protocol downgrade attacks). */
static int
hs_starttls(struct hs *h)
{
  const struct nbd_uri *u = h->u;
  struct wire_opt_reply rep;
  char err[256];

  bool anon = u->tls_type && strcmp(u->tls_type, "anon") == 0;
  int r = hs_send_opt(h, NBD_OPT_STARTTLS, NULL, 0);
  if (r < 0)
    return r;
  r = hs_recv_reply(h, NBD_OPT_STARTTLS, &rep);
  if (r < 0)
    return r;
  if (rep.type & NBD_REP_FLAG_ERROR) {
    hs_reply_error(h, NBD_OPT_STARTTLS, &rep);
    size_t n = strlen(h->c->errmsg);
    snprintf(h->c->errmsg + n, sizeof h->c->errmsg - n,
             "; an nbds URI never continues in clear");
    return -EACCES;
  }
  if (rep.type != NBD_REP_ACK)
    return hs_fail(h, -EPROTO,
                   "handshake: unexpected reply to STARTTLS: %s (0x%x)",
                   wire_rep_name(rep.type), rep.type);
  struct tls_client_config cfg;
  hs_tls_config(u, &cfg);
  r = tls_client_start(&h->c->tp, &cfg, h->o->tls_creds, hs_left(h), err,
                       sizeof err);
  if (r < 0)
    return hs_fail(h, r, "TLS with the server failed: %s%s", err,
                   anon ? " (does the server offer anonymous TLS?)" : "");
  h->c->info.tls = true;
  return 0;
}

/* Everything after the greeting of a newstyle server. */
static int
hs_newstyle(struct hs *h)
{
  struct client_conn *c = h->c;
  uint8_t b[4];
  int r = hs_recv(h, b, 2);
  if (r < 0)
    return r;
  uint16_t hflags = wire_decode_hflags(b);
  h->fixed = hflags & NBD_FLAG_FIXED_NEWSTYLE;
  h->no_zeroes = hflags & NBD_FLAG_NO_ZEROES;
  uint32_t cflags = (h->fixed ? NBD_FLAG_C_FIXED_NEWSTYLE : 0) |
                    (h->no_zeroes ? NBD_FLAG_C_NO_ZEROES : 0);
  wire_encode_cflags(b, cflags);
  r = hs_send(h, b, 4, 0);
  if (r < 0)
    return r;
  c->info.protocol = h->fixed ? "newstyle-fixed" : "newstyle";
  if (!h->fixed && h->u->tls)
    return hs_fail(h, -EACCES, "the server offers no TLS (newstyle without "
                   "the fixed flag); an nbds URI never continues in clear");
  if (!h->fixed && h->o->list_only)
    return 0; /* no listing without options; nothing selected */
  if (!h->fixed)
    return hs_export_name(h);

  /* STARTTLS first, so that no option travels in clear; everything below
   * then runs inside TLS unchanged. */
  if (h->u->tls && (r = hs_starttls(h)) < 0)
    return r;

  if (h->o->want_list && (r = hs_list(h)) < 0)
    return r;
  if (h->o->want_extended) {
    r = hs_simple_opt(h, NBD_OPT_EXTENDED_HEADERS);
    if (r < 0)
      return r;
    c->info.extended = c->info.structured = r == 1;
  }
  if (!c->info.extended && h->o->want_structured) {
    r = hs_simple_opt(h, NBD_OPT_STRUCTURED_REPLY);
    if (r < 0)
      return r;
    c->info.structured = r == 1;
  }
  if (h->o->list_only) {
    h->in_step = true; /* ended below with NBD_OPT_ABORT */
    return 0;
  }
  if (c->info.structured && h->o->want_allocation &&
      (r = hs_set_meta(h)) < 0)
    return r;
  r = hs_go(h);
  if (r == -ENOTSUP && !c->info.extended) {
    /* Contexts belong to GO-era servers; structured replies, once
     * acknowledged, stay on whatever selects the export. Never after
     * extended headers: the spec forbids EXPORT_NAME then, and the
     * refusal (its message already recorded) ends the handshake. */
    c->info.allocation = false;
    return hs_export_name(h);
  }
  return r;
}

/* A peer that is not an NBD server, named by the bytes it sent first
 * (b, n of them) when they begin a protocol a wrong host or port often
 * reaches; NULL otherwise. */
static const char *
hs_foreign_peer(const uint8_t *b, size_t n)
{
  if (n >= 5 && memcmp(b, "HTTP/", 5) == 0)
    return "an HTTP server";
  if (n >= 4 && memcmp(b, "SSH-", 4) == 0)
    return "an SSH server";
  return NULL;
}

/* A greeting that does not start with the magic: what the peer is, with
 * the bytes it sent (up to 16; a few more are waited for, briefly, when
 * fewer than a protocol's banner came). */
static int
hs_bad_greeting(struct hs *h, uint8_t b[16], size_t have)
{
  if (have < 5) {
    int left = hs_left(h);
    int ms = left < 0 || left > 200 ? 200 : left;
    if (transport_recv_all(&h->c->tp, b + have, 5 - have, ms) == 0)
      have = 5;
  }
  ssize_t n = have == 5 ? h->c->tp.ops->recv(&h->c->tp, b + 5, 11) : 0;
  if (n > 0) /* what else has come: shown, not waited for */
    have += (size_t)n;
  char seen[LOG_ESCAPE_BUF];
  log_escape(seen, b, have);
  const char *what = hs_foreign_peer(b, have);
  if (what)
    return hs_fail(h, -EPROTO, "the peer is %s, not an NBD server (it sent "
                   "\"%s\")", what, seen);
  return hs_fail(h, -EPROTO, "not an NBD server (bad greeting magic: it "
                 "sent \"%s\")", seen);
}

/* Reads the server's 16 greeting bytes. The magic is checked byte by
 * byte as it arrives, so that a peer speaking another protocol is named
 * at once; a peer that sends nothing at all (an HTTP server waits for a
 * request) is named when the time limit ends. */
static int
hs_recv_greeting(struct hs *h, uint8_t b[16])
{
  for (size_t have = 0; have < 8; have++) {
    int r = transport_recv_all(&h->c->tp, b + have, 1, hs_left(h));
    if (r == -ETIMEDOUT && h->o->timeout_ms >= 0)
      return hs_fail(h, r, "handshake: no NBD greeting within %d s%s: the "
                     "peer may not be an NBD server (an NBD server speaks "
                     "first)", (h->o->timeout_ms + 999) / 1000,
                     have ? " (only part of one)" : "");
    if (r == -ECONNRESET)
      return hs_fail(h, r, "handshake: the peer closed the connection "
                     "without %s NBD greeting", have ? "a whole" : "an");
    if (r < 0)
      return hs_recv_failed(h, r);
    if (!wire_greeting_prefix_ok(b, have + 1))
      return hs_bad_greeting(h, b, have + 1);
  }
  return hs_recv(h, b + 8, 8);
}

static int
hs_run(struct hs *h)
{
  uint8_t b[16];
  int r = hs_recv_greeting(h, b);
  if (r < 0)
    return r;
  enum wire_greeting_style style = wire_decode_greeting(b);
  if (style == WIRE_GREETING_OLDSTYLE && h->u->tls)
    return hs_fail(h, -EACCES, "oldstyle server: it cannot do TLS, and an "
                   "nbds URI never continues in clear");
  if (style == WIRE_GREETING_OLDSTYLE)
    return hs_oldstyle(h);
  if (style != WIRE_GREETING_NEWSTYLE)
    return hs_fail(h, -EPROTO, "not an NBD server (bad second magic)");
  return hs_newstyle(h);
}

/* Ends option haggling as §Termination of the session asks of a client
 * that gives up there: NBD_OPT_ABORT, then the ACK or the server's close,
 * waited for one second at most. Failures here change nothing: the
 * caller's error (in c->errmsg) stands. */
static void
hs_abort(struct hs *h)
{
  char keep[sizeof h->c->errmsg];
  struct wire_opt_reply rep;
  memcpy(keep, h->c->errmsg, sizeof keep);
  h->deadline = loop_now_ms() + 1000;
  if (hs_send_opt(h, NBD_OPT_ABORT, NULL, 0) == 0)
    (void)hs_recv_reply(h, NBD_OPT_ABORT, &rep);
  memcpy(h->c->errmsg, keep, sizeof keep);
}

/* Applies the protocol's defaults to block sizes the server did not send,
 * and refuses ones that break §Size constraints' MUSTs: a minimum that
 * is not a power of 2 up to 64 KiB, or a maximum under the minimum (0
 * aside, taken as not given). A client that asked for them "MUST abide
 * by" them, and the engine's alignment assumes a power of 2; replacing
 * them, as before, sent requests the server forbids. A preferred size is
 * only advice: a bad one is replaced.
 * What the server sent stays in *_sent, for `info` to show. 0, or
 * -EPROTO with c->errmsg set. */
static int
hs_fix_block_sizes(struct client_conn *c)
{
  struct client_info *in = &c->info;
  if (!in->has_block_size) {
    in->min_block = 1;
    in->pref_block = 4096;
    in->max_block = NBD_MAX_PAYLOAD_DEFAULT;
    return 0;
  }
  in->min_sent = in->min_block;
  in->pref_sent = in->pref_block;
  in->max_sent = in->max_block;
  if (in->min_block == 0 || in->min_block > 65536 ||
      (in->min_block & (in->min_block - 1))) {
    snprintf(c->errmsg, sizeof c->errmsg, "the server advertises a minimum "
             "block size of %u, which the spec requires to be a power of 2 "
             "from 1 to 65536: refusing the export", in->min_block);
    return -EPROTO;
  }
  /* The maximum need not be a power of 2, nor (§Size constraints) a
   * multiple of the minimum: the largest multiple below it is the limit
   * a request of whole minimum blocks can keep. */
  if (in->max_block == 0) {
    in->max_block = NBD_MAX_PAYLOAD_DEFAULT; /* as if not given */
  } else if (in->max_block < in->min_block) {
    snprintf(c->errmsg, sizeof c->errmsg, "the server advertises a maximum "
             "block size of %u, under its minimum of %u, which the spec "
             "forbids: refusing the export", in->max_block, in->min_block);
    return -EPROTO;
  } else if (in->max_block != UINT32_MAX) {
    in->max_block -= in->max_block % in->min_block;
  }
  if (in->pref_block < in->min_block ||
      (in->pref_block & (in->pref_block - 1)))
    in->pref_block = in->min_block;
  while (in->pref_block > in->max_block && in->pref_block > in->min_block)
    in->pref_block /= 2;
  return 0;
}

/* The export's size, before anything is read or written for it: one
 * past 2^63-1 is no disk's (off_t, and so every file and device, stops
 * there; nbdkit and qemu-nbd serve no more), and reading it as real fills
 * a destination without end. One that is not a multiple of the minimum
 * block size leaves its last bytes out of reach (§Size constraints: the
 * size "SHOULD be an integer multiple of that block size, since
 * otherwise, the client would be unable to access the final few bytes"),
 * so a copy of it could never be whole. 0, or -EPROTO with c->errmsg set.
 * After hs_fix_block_sizes. */
static int
hs_check_size(struct client_conn *c)
{
  const struct client_info *in = &c->info;
  if (in->size > (uint64_t)INT64_MAX) {
    snprintf(c->errmsg, sizeof c->errmsg, "the server advertises an export "
             "size of %llu bytes, more than any disk can hold (the limit is "
             "2^63-1): refusing it", (unsigned long long)in->size);
    return -EPROTO;
  }
  if (in->size % in->min_block) {
    snprintf(c->errmsg, sizeof c->errmsg, "export size %llu is not a "
             "multiple of its minimum block size %u: its last %llu bytes "
             "cannot be addressed", (unsigned long long)in->size,
             in->min_block, (unsigned long long)(in->size % in->min_block));
    return -EPROTO;
  }
  return 0;
}

/* nagle: leave Nagle's algorithm on (a diagnostic option). */
static int
client_open_socket(struct client_conn *c, const struct nbd_uri *u,
                   const struct client_opts *o)
{
  int fd;
  if (u->unix_socket)
    fd = sock_connect_unix(u->socket, o->timeout_ms, o->on_socket,
                           o->on_socket_arg);
  else
    fd = sock_connect_tcp(u->host, u->port, o->timeout_ms, o->on_socket,
                          o->on_socket_arg);
  if (fd < 0 && sock_err_is_resolve(fd)) {
    snprintf(c->errmsg, sizeof c->errmsg, "cannot resolve %s: %s", u->host,
             sock_strerror(fd));
    return -EHOSTUNREACH; /* callers see errnos only */
  }
  if (fd < 0) {
    if (u->unix_socket)
      snprintf(c->errmsg, sizeof c->errmsg, "connect to unix socket %s: %s",
               u->socket, strerror(-fd));
    else
      snprintf(c->errmsg, sizeof c->errmsg, "connect to %s port %s: %s",
               u->host, u->port, strerror(-fd));
    return fd;
  }
  if (u->unix_socket) {
    /* Unix sockets default to ~208 KiB of send buffer, which throttles
     * 2 MiB requests; ask for more (the kernel may clip it). */
    int eff;
    sock_set_sndbuf(fd, 4 << 20, &eff);
    sock_set_rcvbuf(fd, 4 << 20, &eff);
  } else if (!o->nagle) {
    sock_set_nodelay(fd, true);
  }
  c->fd = fd;
  transport_init_plain(&c->tp, fd);
  return 0;
}

int
client_connect(struct client_conn *c, const struct nbd_uri *u,
               const struct client_opts *o)
{
  memset(c, 0, sizeof *c);
  c->fd = -1;
  /* The time limit covers the connect and the handshake together. */
  struct hs h = { .c = c, .o = o, .u = u };
  if (o->timeout_ms >= 0)
    h.deadline = loop_now_ms() + (uint64_t)o->timeout_ms;
  if ((u->tls || (o->http && o->http->tls_start)) && o->tls_creds == NULL) {
    snprintf(c->errmsg, sizeof c->errmsg, "no TLS credentials loaded");
    return -EINVAL;
  }
  int r = client_open_socket(c, u, o); /* publishes the socket */
  if (r < 0)
    return r;
  c->split_writes = o->split_writes;
  r = o->http ? client_http_put(c, o->http, o->tls_creds, hs_left(&h)) : 0;
  if (r > 0 && o->http->body && o->http->body->fd < 0) {
    /* The caller sends a body on this connection, as it is now. */
    if (o->on_socket)
      o->on_socket(o->on_socket_arg, -1);
    *o->http->body = *c;
    memset(c, 0, sizeof *c);
    c->fd = -1;
    snprintf(c->errmsg, sizeof c->errmsg, "the server expects a body");
    return CLIENT_HTTP_BODY;
  }
  if (r > 0) {
    snprintf(c->errmsg, sizeof c->errmsg, "the server expects a body, "
             "not NBD, on an extra connection");
    r = -EPROTO;
  }
  if (r == 0)
    r = hs_run(&h);
  if (h.in_step && (r < 0 || o->list_only))
    hs_abort(&h);
  free(h.payload);
  if (r == 0 && o->list_only) {
    /* Nothing was selected: the socket goes, what was learnt stays. */
    if (o->on_socket)
      o->on_socket(o->on_socket_arg, -1);
    client_drop_socket(c);
    return 0;
  }
  if (r == 0 && (r = sock_set_nonblock(c->fd, true)) < 0)
    snprintf(c->errmsg, sizeof c->errmsg, "set non-blocking: %s",
             strerror(-r));
  bool in_transmission = r == 0;
  if (r == 0) {
    r = hs_fix_block_sizes(c);
    if (r == 0)
      r = hs_check_size(c);
  }
  if (o->on_socket)
    o->on_socket(o->on_socket_arg, -1);
  if (r < 0) {
    char msg[sizeof c->errmsg];
    memcpy(msg, c->errmsg, sizeof msg);
    /* Transmission never began (no NBD_CMD_DISC), or it did, and the
     * export is refused: then it ends with NBD_CMD_DISC. */
    c->fatal = in_transmission ? 0 : -r;
    client_close(c);
    memcpy(c->errmsg, msg, sizeof msg);
    return r;
  }
  /* §Transmission flags: NBD_FLAG_HAS_FLAGS "MUST always be 1". Without
   * it the other bits come from a server that predates them and carry no
   * promise: nothing optional is used, and no write is refused here. */
  c->info.tflags_sent = c->info.tflags;
  if (!(c->info.tflags & NBD_FLAG_HAS_FLAGS))
    c->info.tflags = 0;
  return 0;
}
