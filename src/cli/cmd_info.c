/* cmd_info.c: "nbdflow info TARGET [--json] [--map] [--list]": an
 * export's size, flags, block sizes, meta contexts and allocation map, in
 * the spirit of nbdinfo. TARGET is an NBD URI or a local file. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "client/client.h"
#include "copy/endpoint.h"
#include "copy/engine.h"
#include "copy/nbd_io.h"
#include "format/image.h"
#include "format/target.h"
#include "proto/nbd.h"
#include "util/log.h"
#include "util/size.h"
#include "util/fileio.h"
#include "util/text.h"
#include "proto/nbd_uri.h"

struct info_args {
  /* Where the report goes until it is complete: a spool file, copied to
   * stdout only when the command succeeds, so that a map or list cut
   * short by an error never reads as a whole one (for --json, never as
   * valid JSON missing its end). */
  FILE *out;
  const char *target;
  bool json, map, list;
  bool check;         /* --check: the image's structures */
  bool check_dirty;   /* --check found errors: the report still shows */
  unsigned timeout_s; /* per block status request; 0: wait forever */
  enum image_format format; /* -f; a vhd: or raw: prefix wins */
  bool ignore_checksums;
};

/* One run of the allocation map, merged with equal neighbours. */
struct info_map {
  FILE *out;
  bool json;
  bool any;
  uint64_t off, len;
  uint32_t type;
};

/* A server's string on a terminal: control characters (C0, DEL, C1),
 * backslashes, double quotes (names are shown quoted) and bytes that are
 * not UTF-8 are shown as \xNN, so a name or description cannot move the
 * cursor, clear the screen, forge a line or seem to end early. UTF-8
 * text passes as it is. */
static void
info_text_str(FILE *out, const char *s)
{
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = *p < 0x80 ? 1 : text_utf8_len(p);
    if (n == 2 && p[0] == 0xc2 && p[1] <= 0x9f)
      n = 0; /* a C1 control: both bytes escaped */
    if (n == 0 || *p < 0x20 || *p == 0x7f || *p == '\\' || *p == '"') {
      fprintf(out, "\\x%02x", *p);
      p++;
    } else {
      fwrite(p, 1, n, out);
      p += n;
    }
  }
}

static const char *
info_type_name(uint32_t t)
{
  switch (t & 3) {
  case 0:
    return "data";
  case NBD_STATE_HOLE:
    return "hole";
  case NBD_STATE_ZERO:
    return "zero";
  default:
    return "hole,zero";
  }
}

static void
info_map_emit(struct info_map *m)
{
  if (m->len == 0)
    return;
  if (m->json)
    fprintf(m->out,
            "%s{ \"offset\": %llu, \"length\": %llu, \"type\": %u, "
            "\"description\": \"%s\" }",
            m->any ? ",\n" : "[\n", (unsigned long long)m->off,
            (unsigned long long)m->len, m->type, info_type_name(m->type));
  else
    fprintf(m->out, "%12llu %12llu %4u  %s\n", (unsigned long long)m->off,
            (unsigned long long)m->len, m->type, info_type_name(m->type));
  m->any = true;
}

static void
info_map_add(struct info_map *m, uint64_t len, uint32_t type)
{
  type &= NBD_STATE_HOLE | NBD_STATE_ZERO;
  if (m->len && m->type == type) {
    m->len += len;
    return;
  }
  info_map_emit(m);
  m->off += m->len;
  m->len = len;
  m->type = type;
}

static void
info_map_end(struct info_map *m)
{
  info_map_emit(m);
  if (m->json)
    fprintf(m->out, m->any ? "\n]\n" : "[]\n");
}

static int
info_map_nbd(FILE *out, struct client_conn *c, bool json, unsigned timeout_s)
{
  struct info_map m = { .out = out, .json = json };
  struct client_extent ext[1024];
  uint64_t off = 0, size = c->info.size, span = ENDPOINT_STATUS_SPAN;
  if (!c->info.allocation) {
    info_map_add(&m, size, 0); /* no context: all data, the safe answer */
    info_map_end(&m);
    return 0;
  }
  while (off < size) {
    uint64_t len = size - off;
    if (len > span)
      len = span;
    struct client_req r = { .type = NBD_CMD_BLOCK_STATUS, .offset = off,
                            .length = len, .extents = ext,
                            .max_extents = 1024 };
    int err = client_run(c, &r, timeout_s ? (int)timeout_s * 1000 : -1);
    if (err < 0) {
      /* The server's message, or why the connection died. */
      const char *why = r.errmsg[0] ? r.errmsg : c->errmsg;
      log_error("block status at offset %llu: %s%s%s",
                (unsigned long long)off, strerror(-err),
                why[0] ? ": " : "", why);
      return err;
    }
    if (r.nextents == 0) {
      log_error("block status at offset %llu: empty reply",
                (unsigned long long)off);
      return -EPROTO;
    }
    uint64_t from = off;
    for (size_t i = 0; i < r.nextents && off < size; i++) {
      uint64_t l = ext[i].length;
      if (l > size - off)
        l = size - off;
      info_map_add(&m, l, ext[i].flags);
      off += l;
    }
    span = client_status_span(span, r.extents_dropped,
                              r.nextents <= r.max_extents / 2, off - from,
                              c->info.min_block, ENDPOINT_STATUS_SPAN);
  }
  info_map_end(&m);
  return 0;
}

static int
info_map_file(FILE *out, int fd, uint64_t size, bool json)
{
  struct info_map m = { .out = out, .json = json };
  uint64_t off = 0;
  while (off < size) {
    struct file_run e;
    int r = file_run_at(fd, off, size, &e);
    if (r == -ENXIO) {
      log_error("offset %llu: the file shrank below %llu bytes while it "
                "was read", (unsigned long long)off,
                (unsigned long long)size);
      return -EIO;
    }
    if (r < 0) {
      log_error("seek at offset %llu: %s", (unsigned long long)off,
                strerror(-r));
      return r;
    }
    info_map_add(&m, e.length,
                 e.hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0);
    off += e.length;
  }
  info_map_end(&m);
  return 0;
}

static void
info_flag(FILE *out, bool json, const char *name, bool v)
{
  if (json)
    fprintf(out, ",\n\t\"%s\": %s", name, v ? "true" : "false");
  else
    fprintf(out, "\t%s: %s\n", name, v ? "true" : "false");
}

/* The lines before the exports: how the session was negotiated, and with
 * --list the names the server listed. */
static void
info_print_head(FILE *out, const struct client_conn *c, bool json)
{
  const struct client_info *in = &c->info;
  if (!json) {
    fprintf(out, "protocol: %s %s TLS%s\n", in->protocol,
            in->tls ? "with" : "without",
            in->extended     ? ", using extended packets"
            : in->structured ? ", using structured packets"
                             : "");
    return;
  }
  fprintf(out,
          "{\n\"protocol\": \"%s\",\n\"TLS\": %s,\n\"structured\": %s,\n",
          in->protocol, in->tls ? "true" : "false",
          in->structured ? "true" : "false");
  fprintf(out, "\"extended\": %s,\n", in->extended ? "true" : "false");
  if (in->nexports) {
    fprintf(out, "\"export-names\": [");
    for (size_t i = 0; i < in->nexports; i++) {
      fprintf(out, i ? ", " : " ");
      text_json_str(out, in->exports[i]);
    }
    fprintf(out, " ],\n");
  }
  fprintf(out, "\"exports\": [\n");
}

/* "export-size: N", and the size in its largest whole unit when it has
 * one ("(64M)"), as nbdinfo prints it; a file's size and an export's
 * alike. */
static void
info_text_size(FILE *out, uint64_t size)
{
  char sz[32];
  size_format_exact(size, sz, sizeof sz);
  fprintf(out, "\texport-size: %llu", (unsigned long long)size);
  if (size >= 1024 && size % 1024 == 0)
    fprintf(out, " (%s)", sz);
  fputc('\n', out);
}

static void
info_print_tail(FILE *out, bool json)
{
  if (json)
    fprintf(out, " ]\n}\n");
}

/* One export, as the connection c to it learnt it; uri reaches it. */
static void
info_print_export(FILE *out, const struct client_conn *c, const char *uri,
                  bool json)
{
  const struct client_info *in = &c->info;
  uint16_t f = in->tflags;
  char sz[32];
  size_format_exact(in->size, sz, sizeof sz);
  if (json) {
    fprintf(out, "\t{\n\t\"export-name\": ");
    text_json_str(out, in->name ? in->name : "");
    if (in->description) {
      fprintf(out, ",\n\t\"description\": ");
      text_json_str(out, in->description);
    }
    fprintf(out, ",\n\t\"uri\": ");
    text_json_str(out, uri);
    fprintf(out, ",\n\t\"contexts\": [%s]",
            in->allocation ? " \"base:allocation\" " : "");
  } else {
    fprintf(out, "export=\"");
    info_text_str(out, in->name ? in->name : "");
    fprintf(out, "\":\n");
    if (in->description) {
      fprintf(out, "\tdescription: ");
      info_text_str(out, in->description);
      fputc('\n', out);
    }
    info_text_size(out, in->size);
    fprintf(out, "\turi: ");
    info_text_str(out, uri);
    fputc('\n', out);
    fprintf(out, "\tcontexts:\n%s",
            in->allocation ? "\t\tbase:allocation\n" : "");
  }
  info_flag(out, json, "is_rotational", f & NBD_FLAG_ROTATIONAL);
  info_flag(out, json, "is_read_only", f & NBD_FLAG_READ_ONLY);
  info_flag(out, json, "can_cache", f & NBD_FLAG_SEND_CACHE);
  info_flag(out, json, "can_df", f & NBD_FLAG_SEND_DF);
  info_flag(out, json, "can_fast_zero", f & NBD_FLAG_SEND_FAST_ZERO);
  info_flag(out, json, "can_flush", f & NBD_FLAG_SEND_FLUSH);
  info_flag(out, json, "can_fua", f & NBD_FLAG_SEND_FUA);
  info_flag(out, json, "can_multi_conn", f & NBD_FLAG_CAN_MULTI_CONN);
  info_flag(out, json, "can_trim", f & NBD_FLAG_SEND_TRIM);
  info_flag(out, json, "can_zero", f & NBD_FLAG_SEND_WRITE_ZEROES);
  if (json) {
    if (in->has_block_size)
      fprintf(out,
              ",\n\t\"block_size_minimum\": %u,\n\t\"block_size_preferred\": "
              "%u,\n\t\"block_size_maximum\": %u",
              in->min_sent, in->pref_sent, in->max_sent);
    fprintf(out, ",\n\t\"transmission_flags\": %u", f);
    fprintf(out,
            ",\n\t\"export-size\": %llu,\n\t\"export-size-str\": \"%s\"\n\t}",
            (unsigned long long)in->size, sz);
  } else {
    if (in->has_block_size)
      fprintf(out,
              "\tblock_size_minimum: %u\n\tblock_size_preferred: %u\n"
              "\tblock_size_maximum: %u\n",
              in->min_sent, in->pref_sent, in->max_sent);
    fprintf(out, "\ttransmission_flags: 0x%04x\n", f);
  }
}

static void
info_warn_dropped(const struct client_conn *c, const char *uri)
{
  if (c->info.dropped)
    log_warn("%s: the server's %s holds a NUL byte, which the spec "
             "forbids: not shown", uri, c->info.dropped);
  if (!(c->info.tflags_sent & NBD_FLAG_HAS_FLAGS))
    log_warn("%s: the server's transmission flags 0x%04x lack "
             "NBD_FLAG_HAS_FLAGS, which the spec requires: ignored", uri,
             c->info.tflags_sent);
}

/* --list: every listed export's details, each from a connection of its
 * own, as nbdinfo --list shows them. 0, or -1 after one line. */
static int
info_list_nbd(const struct info_args *a, const struct client_conn *first,
              const struct tls_creds *tls)
{
  for (size_t i = 0; i < first->info.nexports; i++) {
    const char *name = first->info.exports[i];
    char *uri = uri_with_export(a->target, name);
    struct nbd_uri u;
    char err[256];
    if (uri == NULL || uri_parse(uri, &u, err, sizeof err) < 0) {
      log_error("%s: export %zu of the list: %s", a->target, i + 1,
                uri ? err : "out of memory");
      free(uri);
      return -1;
    }
    struct client_opts o = { .export_name = name,
                             .want_extended = true,
                             .want_structured = true,
                             .want_allocation = true,
                             .timeout_ms = client_handshake_ms(a->timeout_s),
                             .tls_creds = tls };
    struct client_conn c;
    int r = client_connect(&c, &u, &o);
    if (r < 0) {
      log_error("%s: %s", uri, c.errmsg);
    } else {
      info_warn_dropped(&c, uri);
      if (i > 0 && a->json)
        fputs(",\n", a->out);
      info_print_export(a->out, &c, uri, a->json);
      client_close(&c);
    }
    uri_free(&u);
    free(uri);
    if (r < 0)
      return -1;
  }
  return 0;
}

/* The report of u, whose TLS credentials (NULL for a plain URI) every
 * connection shares: 0, or -1 after one line. */
static int
info_nbd_report(const struct info_args *a, const struct nbd_uri *u,
                const struct tls_creds *tls)
{
  struct client_opts o = { .export_name = u->export_name,
                           .want_extended = true,
                           .want_structured = true,
                           .want_allocation = true,
                           .timeout_ms = client_handshake_ms(a->timeout_s),
                           .tls_creds = tls };
  struct client_conn c, lc;
  int r = 0;
  if (a->list) {
    /* The listing connection ends with NBD_OPT_ABORT before any export
     * is opened: a server with no default export lists its others, and
     * one that takes a single client at a time has it free again. */
    struct client_opts lo = o;
    lo.want_list = lo.list_only = true;
    if (client_connect(&lc, u, &lo) < 0) {
      log_error("%s: %s", a->target, lc.errmsg);
      return -1;
    }
    info_print_head(a->out, &lc, a->json);
    if (lc.info.nexports > 0) {
      r = info_list_nbd(a, &lc, tls);
      if (r == 0)
        info_print_tail(a->out, a->json);
      client_close(&lc);
      return r;
    }
    client_close(&lc); /* nothing listed: the URI's export alone */
  }
  r = client_connect(&c, u, &o);
  if (r < 0) {
    log_error("%s: %s", a->target, c.errmsg);
    return -1;
  }
  info_warn_dropped(&c, a->target);
  if (a->map) {
    r = info_map_nbd(a->out, &c, a->json, a->timeout_s);
  } else {
    if (!a->list)
      info_print_head(a->out, &c, a->json);
    info_print_export(a->out, &c, a->target, a->json);
    info_print_tail(a->out, a->json);
  }
  client_close(&c);
  return r < 0 ? -1 : 0;
}

static int
info_nbd(const struct info_args *a)
{
  struct nbd_uri u;
  char err[256];
  if (uri_parse(a->target, &u, err, sizeof err) < 0) {
    log_error("%s", err);
    return 1;
  }
  /* Loaded once, for the listing and every export's connection. */
  struct tls_creds *tls;
  int r = client_tls_load(&u, &tls, err, sizeof err);
  if (r < 0)
    log_error("%s: %s", a->target, err);
  else
    r = info_nbd_report(a, &u, tls);
  tls_creds_free(tls);
  uri_free(&u);
  return r < 0 ? 1 : 0;
}

/* The map of an image in a format, from the format's own extents. */
static int
info_map_image(FILE *out, struct image *img, bool json)
{
  struct info_map m = { .out = out, .json = json };
  struct image_extent ext[1024];
  uint64_t off = 0;
  while (off < img->size) {
    char why[200] = "";
    int n = img->ops->extents(img, off, img->size - off, ext, 1024, why,
                              sizeof why);
    if (n <= 0) {
      log_error("%s: allocation at offset %llu: %s", img->path,
                (unsigned long long)off,
                why[0] ? why : strerror(n < 0 ? -n : EPROTO));
      return n < 0 ? n : -EPROTO;
    }
    for (int i = 0; i < n && off < img->size; i++) {
      uint64_t l = ext[i].length;
      if (l > img->size - off)
        l = img->size - off;
      info_map_add(&m, l, ext[i].flags); /* IMAGE_* are NBD's bits */
      off += l;
    }
  }
  info_map_end(&m);
  return 0;
}

/* over_nbd: the image is an NBD export's bytes (-f with a URI). */
static void
info_print_image(FILE *out, struct image *img, const char *target, bool json,
                 bool over_nbd)
{
  struct image_info in;
  char sz[32];
  img->ops->info(img, &in, true);
  size_format_exact(img->size, sz, sizeof sz);
  if (!json) {
    fprintf(out, "%s: ", over_nbd ? "export" : "file");
    info_text_str(out, target);
    fprintf(out, "\n\tformat: %s\n\tdisk-type: %s\n", in.format,
            in.disk_type);
    info_text_size(out, img->size);
    if (in.block_size)
      fprintf(out, "\tblock-size: %u\n", in.block_size);
    fprintf(out, "\tallocated: %llu\n", (unsigned long long)in.allocated);
    if (in.creator[0]) {
      fprintf(out, "\tcreator: ");
      info_text_str(out, in.creator);
      fputc('\n', out);
    }
    for (int i = 0; i < in.nparents; i++) {
      fprintf(out, "\tparent: ");
      info_text_str(out, in.parents[i]);
      fputc('\n', out);
    }
    return;
  }
  fprintf(out, "{\n\"protocol\": \"%s\",\n\"exports\": [\n\t{\n\t\"uri\": ",
          over_nbd ? "nbd" : "file");
  text_json_str(out, target);
  fprintf(out, ",\n\t\"format\": \"%s\",\n\t\"disk-type\": \"%s\"",
          in.format, in.disk_type);
  fprintf(out, ",\n\t\"block-size\": %u,\n\t\"allocated\": %llu",
          in.block_size, (unsigned long long)in.allocated);
  fprintf(out, ",\n\t\"creator\": ");
  text_json_str(out, in.creator);
  fprintf(out, ",\n\t\"parents\": [");
  for (int i = 0; i < in.nparents; i++) {
    fprintf(out, i ? ", " : " ");
    text_json_str(out, in.parents[i]);
  }
  fprintf(out, "%s],\n\t\"export-size\": %llu,\n\t\"export-size-str\": "
          "\"%s\"\n\t} ]\n}\n", in.nparents ? " " : "",
          (unsigned long long)img->size, sz);
}

/* An image that an NBD export holds as raw bytes, read through the
 * format layer (-f names it: an export is never probed). */
static int
info_nbd_image(const struct info_args *a)
{
  struct image_io *io;
  struct image *img;
  char err[512];
  struct image_opts io_opts = { .format = a->format, .format_given = true,
                                .ignore_checksums = a->ignore_checksums };
  if (nbd_io_open(a->target, a->timeout_s, &io, err, sizeof err) < 0 ||
      image_open_io(io, a->target, &io_opts, &img, err, sizeof err) < 0) {
    log_error("%s", err);
    return 1;
  }
  int r = 0;
  if (a->map)
    r = info_map_image(a->out, img, a->json);
  else
    info_print_image(a->out, img, a->target, a->json, true);
  image_close(img);
  return r < 0 ? 1 : 0;
}

static void
info_check_report(void *ctx, bool error, const char *msg)
{
  fprintf(ctx, "\t%s: ", error ? "error" : "note");
  info_text_str(ctx, msg);
  fputc('\n', ctx);
}

/* --check of an image file: one line per finding, then the verdict; 0
 * when clean (notes such as lost space allowed), 1 otherwise. */
static int
info_check(struct info_args *a)
{
  struct target t;
  target_parse(a->target, false, &t);
  if (t.kind != TARGET_FILE || uri_is_uri(a->target))
    t.arg = a->target;
  struct image_opts io = {
    .format = t.format_given ? t.format : a->format,
    .format_given = t.format_given || a->format != IMAGE_FORMAT_AUTO,
    .check = true,
  };
  struct image *img;
  char err[512];
  int r = image_open(t.arg, &io, &img, err, sizeof err);
  if (r < 0) {
    log_error("%s", err);
    return 1;
  }
  if (img == NULL || img->ops->check == NULL) {
    if (img)
      log_error("--check: %s is %s, which --check does not read yet "
                "(qemu-img check does)", t.arg, img->ops->name);
    else
      log_error("--check: %s is a raw file, which has no tables to check",
                t.arg);
    image_close(img);
    return 1;
  }
  struct image_check c = { .report = info_check_report, .ctx = a->out };
  fprintf(a->out, "check: ");
  info_text_str(a->out, a->target);
  fprintf(a->out, "\n\tformat: %s\n", img->ops->name);
  r = img->ops->check(img, &c);
  image_close(img);
  if (r < 0) {
    log_error("--check: reading %s: %s", t.arg, strerror(-r));
    return 1;
  }
  fprintf(a->out, "\tlost-bytes: %llu\n\tresult: ",
          (unsigned long long)c.lost);
  if (c.errors == 0) {
    fprintf(a->out, "clean\n");
    return 0;
  }
  fprintf(a->out, "%llu error%s\n", (unsigned long long)c.errors,
          c.errors == 1 ? "" : "s");
  a->check_dirty = true;
  return 1;
}

static int
info_file(const struct info_args *a)
{
  struct target t;
  target_parse(a->target, false, &t); /* checked by cmd_info */
  if (t.kind != TARGET_FILE)
    t.arg = a->target; /* "null:x", "memory:x", "-": a file of that name */
  struct image_opts io = {
    .format = t.format_given ? t.format : a->format,
    .format_given = t.format_given || a->format != IMAGE_FORMAT_AUTO,
    .ignore_checksums = a->ignore_checksums,
  };
  struct image *img;
  char err[512];
  int r = image_open(t.arg, &io, &img, err, sizeof err);
  if (r < 0) {
    log_error("%s", err);
    return 1;
  }
  if (img) {
    if (a->map)
      r = info_map_image(a->out, img, a->json);
    else
      info_print_image(a->out, img, a->target, a->json, false);
    image_close(img);
    return r < 0 ? 1 : 0;
  }
  /* O_NONBLOCK: opening a FIFO to read would wait for a writer. */
  int fd = open(t.arg, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  uint64_t size;
  char sz[32];
  struct stat st;
  if (fd < 0) {
    log_error("open %s: %s", t.arg, strerror(errno));
    return 1;
  }
  if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
    log_error("%s is a named pipe: it has no size to show", t.arg);
    close(fd);
    return 1;
  }
  (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  r = file_size(fd, &size);
  if (r < 0) {
    log_error("size of %s: %s", t.arg, strerror(-r));
    close(fd);
    return 1;
  }
  if (a->map)
    r = info_map_file(a->out, fd, size, a->json);
  else if (a->json) {
    fprintf(a->out,
            "{\n\"protocol\": \"file\",\n\"exports\": [\n\t{\n\t\"uri\": ");
    text_json_str(a->out, a->target);
    fprintf(a->out,
            ",\n\t\"format\": \"raw\",\n\t\"export-size\": %llu,\n\t"
            "\"export-size-str\": \"%s\"\n\t} ]\n}\n",
            (unsigned long long)size, size_format_exact(size, sz, sizeof sz));
  } else {
    fprintf(a->out, "file: ");
    info_text_str(a->out, a->target);
    fprintf(a->out, "\n\tformat: raw\n");
    info_text_size(a->out, size);
  }
  close(fd);
  return r < 0 ? 1 : 0;
}

static void
info_usage(FILE *f)
{
  fprintf(f,
          "Usage: nbdflow info [-f FMT] [--json] [--map] [--list] [--check]\n"
          "                    [--timeout SECONDS] TARGET\n\n"
          "TARGET is an NBD URI (nbd://HOST[:PORT]/EXPORT,\n"
          "nbd+unix:///EXPORT?socket=PATH) or a local file or block device\n"
          "(vhd:PATH, qcow2:PATH or raw:PATH gives its format).\n\n"
          "  -f, --format FMT  raw, vhd, qcow2 or auto (default: auto, by the\n"
          "           magic; a probed image never opens a parent)\n"
          "  --ignore-checksums  read an image whose checksums are wrong\n"
          "  --check  check an image file's structures (a VHD's footers,\n"
          "           BAT, bitmaps, overlaps, lost space); exit status 0\n"
          "           when it is clean\n"
          "  --json   machine-readable output\n"
          "  --map    print the allocation map (base:allocation or\n"
          "           SEEK_DATA/SEEK_HOLE) instead of the summary\n"
          "  --list   show every export the server lists (NBD_OPT_LIST),\n"
          "           each from a connection of its own\n"
          "  --timeout SECONDS  with --map: fail when a block status\n"
          "           request gets no reply for this long (default %d,\n"
          "           0: wait forever); connecting and the handshake\n"
          "           wait at most this, and 30 s at most\n"
          "  -h, --help  show this help\n\n"
          "Exit status: 0 when the report is printed (with --check: the\n"
          "image is clean); 1 on a failure, or an image --check finds\n"
          "damaged (one line says why); 2 for a usage error (an unknown\n"
          "option, a bad value, no TARGET).\n",
          COPY_DEFAULT_TIMEOUT);
}

/* The spool: an unlinked file in $TMPDIR (default /tmp), whose name goes
 * to dir for messages. NULL, with errno, when none can be made. */
static FILE *
info_spool_open(const char **dir)
{
  const char *d = getenv("TMPDIR");
  char path[4096];
  *dir = d && d[0] ? d : "/tmp";
  if (snprintf(path, sizeof path, "%s/nbdflow-info.XXXXXX", *dir) >=
      (int)sizeof path) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  int fd = mkstemp(path);
  if (fd < 0)
    return NULL;
  unlink(path);
  FILE *f = fdopen(fd, "w+");
  if (f == NULL) {
    int e = errno;
    close(fd);
    errno = e;
  }
  return f;
}

/* Copies the finished report from the spool to stdout: 0, or 1 after one
 * line. A spool that lost a write fails here, before anything is shown. */
static int
info_flush_spool(FILE *spool, const char *dir)
{
  char buf[65536];
  size_t n;
  if (fflush(spool) != 0 || ferror(spool) || fseek(spool, 0, SEEK_SET) != 0) {
    log_error("spooling the report in %s: %s (TMPDIR chooses the "
              "directory)", dir, strerror(errno));
    return 1;
  }
  while ((n = fread(buf, 1, sizeof buf, spool)) > 0)
    if (fwrite(buf, 1, n, stdout) != n)
      break; /* the caller's fflush/ferror check names it */
  if (ferror(spool)) {
    log_error("reading back the report spooled in %s: %s", dir,
              strerror(errno));
    return 1;
  }
  return 0;
}

int
cmd_info(int argc, char **argv)
{
  static const struct option longopts[] = {
    { "json", no_argument, NULL, 'j' }, { "map", no_argument, NULL, 'm' },
    { "list", no_argument, NULL, 'l' }, { "help", no_argument, NULL, 'h' },
    { "timeout", required_argument, NULL, 'T' },
    { "format", required_argument, NULL, 'f' },
    { "ignore-checksums", no_argument, NULL, 'I' },
    { "check", no_argument, NULL, 'C' }, { NULL, 0, NULL, 0 },
  };
  struct info_args a = { .timeout_s = COPY_DEFAULT_TIMEOUT };
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "hf:", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f':
      if (image_format_parse(optarg, &a.format) < 0) {
        log_error("--format: raw, vhd, qcow2 or auto, not '%s'", optarg);
        return 2;
      }
      break;
    case 'I':
      a.ignore_checksums = true;
      break;
    case 'C':
      a.check = true;
      break;
    case 'j':
      a.json = true;
      break;
    case 'm':
      a.map = true;
      break;
    case 'l':
      a.list = true;
      break;
    case 'T':
      if (copy_timeout_parse(optarg, &a.timeout_s) < 0)
        return 2;
      break;
    case 'h':
      info_usage(stdout);
      return 0;
    default:
      return cmd_usage_hint("info");
    }
  }
  if (optind != argc - 1)
    return cmd_usage_error("info", optind == argc ? "no TARGET given"
                                                  : "one TARGET only");
  a.target = argv[optind];
  if (cmd_check_uri(a.target) < 0)
    return 2;
  if (uri_is_uri(a.target)) {
    /* info reads NBD exports and files: another URL (http://) is a
     * usage error, named as opening it would. */
    struct nbd_uri u;
    char err[256];
    if (uri_parse(a.target, &u, err, sizeof err) < 0) {
      log_error("%s", err);
      return 2;
    }
    uri_free(&u);
  } else {
    /* What the command line alone shows is wrong with a file TARGET. */
    struct target t;
    char why[512];
    target_parse(a.target, false, &t);
    if (target_check_prefix(&t, a.target, why, sizeof why) < 0) {
      log_error("%s", why);
      return 2;
    }
    if (a.target[0] == '\0' || (t.format_given && t.arg[0] == '\0')) {
      log_error("TARGET '%s' names no file", a.target);
      return 2;
    }
    if (t.format_given && a.format != IMAGE_FORMAT_AUTO &&
        a.format != t.format) {
      log_error("%s names the format %s, and -f %s another: give one",
                a.target, image_format_name(t.format),
                image_format_name(a.format));
      return 2;
    }
    if (a.list) {
      log_error("--list asks a server for its exports: %s is not an NBD "
                "URI", a.target);
      return 2;
    }
  }
  if (a.list && uri_is_uri(a.target) && a.format > IMAGE_FORMAT_RAW) {
    log_error("--list shows the server's exports: -f %s reads one",
              image_format_name(a.format));
    return 2;
  }
  if (a.check && (a.list || a.map || a.json || uri_is_uri(a.target))) {
    log_error("--check checks an image file, alone: not with --list, "
              "--map, --json or an NBD URI");
    return 2;
  }
  if (a.list && a.map) {
    log_error("--list and --map do not go together: --map shows one "
              "export's map");
    return 2;
  }
  const char *dir;
  a.out = info_spool_open(&dir);
  if (a.out == NULL) {
    log_warn("no spool file in %s for the report (%s): writing it as it "
             "comes", dir, strerror(errno));
    a.out = stdout;
  }
  int rc = a.check                        ? info_check(&a)
           : !uri_is_uri(a.target)        ? info_file(&a)
           : a.format > IMAGE_FORMAT_RAW ? info_nbd_image(&a)
                                         : info_nbd(&a);
  if (a.out != stdout) {
    if (rc == 0 || a.check_dirty) {
      int f = info_flush_spool(a.out, dir);
      rc = f ? f : rc;
    }
    fclose(a.out);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    log_error("writing the report: %s", strerror(errno));
    rc = 1;
  }
  return rc;
}
