/* cmd_copy.c: "nbdflow copy [OPTIONS] SRC DST". Opens both endpoints,
 * runs the engine, optionally verifies by reading the destination back
 * over fresh connections, and reports.
 *
 * Over 1000 lines on purpose: most of it is copy's option table, help
 * text and the checks between options (which formats, protocols and
 * retry settings go together). They read best side by side; the work
 * itself is in src/copy/. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli/cmd.h"
#include "copy/endpoint.h"
#include "copy/engine.h"
#include "copy/journal.h"
#include "format/image.h"
#include "format/target.h"
#include "net/loop.h"
#include "proto/http.h"
#include "proto/nbd.h"
#include "proto/nbd_uri.h"
#include "util/log.h"
#include "util/size.h"
#include "util/text.h"

struct copy_args {
  const char *src, *dst;
  const char *dst_open; /* DST as given, to open; dst hides its password */
  unsigned connections;
  bool verify, json;
  bool no_space_check;      /* --no-space-check */
  bool nagle, split_writes; /* diagnostics, for every NBD endpoint */
  bool synchronous;
  unsigned conn_requests;  /* nbdcopy's -R: per connection; 0: unset */
  uint64_t conn_queue;     /* nbdcopy's --queue-size: per connection */
  struct copy_opts o;
  enum image_format src_format, dst_format;
  bool src_format_given;
  bool ignore_checksums;
  unsigned retry;            /* --retry N: attempts in a row; 0: off */
  unsigned retry_delay_ms;   /* --retry N,DELAY */
  bool retry_errors;         /* --retry-errors */
  const char *checkpoint;    /* --checkpoint FILE, or NULL */
  unsigned checkpoint_s;     /* --checkpoint-interval */
  enum ep_protocol dst_protocol; /* --dst-protocol */
  const char *nbd_export;        /* --nbd-export */
  bool dst_fill_export;          /* it names an NBD URI DST's export */
  const char *tls_certificates;  /* --tls-certificates (https) */
  bool no_tls_verify;            /* --tls-verify-peer=false */
  bool tls_chain_only;           /* --tls-verify-peer=chain */
  const char *tls_ca_file;       /* --tls-ca-file (https) */
  const char *tls_server_name;   /* --tls-server-name (https) */
  const char *tls_priority;      /* --tls-priority (https) */
  uint64_t expect_size;          /* --expect-size (sparse_dd's -size) */
  const char *base;              /* --base: DST already holds it */
  bool expect_size_given;
  uint64_t dst_size;             /* --dst-size (sparse_dd's -size) */
  bool dst_size_given;
};

static void
copy_usage(FILE *f)
{
  fprintf(f,
    "Usage: nbdflow copy [OPTIONS] SRC DST\n\n"
    "SRC and DST: a file or block device, an NBD URI (nbd://HOST[:PORT]/NAME,\n"
    "nbd+unix:///NAME?socket=PATH; with TLS nbds:// and nbds+unix://, the\n"
    "credentials in ?tls-certificates=DIR or ?tls-psk-file=FILE), '-' for\n"
    "stdin/stdout, null: (DST only), or a generated SRC: pattern:SIZE,\n"
    "random:SIZE[:SEED], zero:SIZE, sparse:SIZE[:PERIOD[:DATA]]. A file may\n"
    "be named vhd:PATH, qcow2:PATH or raw:PATH to give its format. DST may\n"
    "also be xapi's: http(s)://HOST[:PORT]/PATH (a PUT; NBD follows when\n"
    "the answer says 'Transfer-encoding: nbd', else Chunked frames),\n"
    "chunked+tcp://HOST:PORT or chunked+unix:///PATH.\n\n"
    "  --dst-protocol P       auto (default), nbd, or chunked (xapi's frames;\n"
    "                         also into a file or '-'); counted as sent when\n"
    "                         the socket takes them: there is no reply\n"
    "  --nbd-export NAME      the export an http(s) DST's NBD session asks for\n"
    "                         (default: the empty name), or an NBD URI's\n"
    "                         when it names none\n"
    "  --tls-certificates DIR https: ca-cert.pem to check the server with\n"
    "                         (default: the system's trusted CAs)\n"
    "  --tls-verify-peer false  https: accept any server certificate;\n"
    "                         chain: check its chain, not its name\n"
    "  --tls-ca-file FILE     https: the CAs (PEM) to check the server with\n"
    "  --tls-server-name NAME https: the name sent (SNI) and checked, not\n"
    "                         the URL's host\n"
    "  --tls-priority PRIO    https: a GnuTLS priority string in place of\n"
    "                         ours (TLS 1.2 and 1.3, AEAD ciphers)\n"
    "  --expect-size BYTES    refuse to start unless SRC has this size\n"
    "  --dst-size BYTES       DST holds BYTES: refuse to start when SRC is\n"
    "                         larger (sparse_dd's -size)\n"
    "  --base BASE            DST already holds BASE: send only the 1 MiB\n"
    "                         blocks where SRC differs, from SRC's VHD chain\n"
    "                         when BASE is a parent in it, else compared\n"
    "                         first (sparse_dd's -base)\n"
    "  --src-format FMT       raw, vhd, qcow2 or auto (default for files: auto, by\n"
    "                         the magic; a probed image never opens a\n"
    "                         parent: name the format to allow it)\n"
    "  --dst-format FMT       raw (default), vhd or qcow2: a dynamic VHD or\n"
    "                         a qcow2 v3 image written in one forward pass,\n"
    "                         to a file or '-'\n"
    "  --ignore-checksums     read an image whose checksums are wrong\n"
    "  -C, --connections N    NBD connections per endpoint (default: %d when\n"
    "                         the server advertises multi-conn, over TCP\n"
    "                         growing to %d while the window needs them;\n"
    "                         to a loopback address, one unless timing\n"
    "                         finds all clearly faster; else 1)\n"
    "  --request-size SIZE    largest read/write (default 512K)\n"
    "  --inflight SIZE        bytes in flight (default: adaptive, 2 x\n"
    "                         bandwidth x RTT, at least 8 requests, cap 256M)\n"
    "  --allocated            write every byte, zeroes included\n"
    "  --destination-is-zero  skip zero ranges: DST already reads as zeroes\n"
    "                         (also --target-is-zero)\n"
    "  --no-flush             do not flush DST at the end (--flush: the\n"
    "                         default)\n"
    "  --no-extents           read all of SRC, ignoring what it reports as\n"
    "                         holes (zeroes are still detected)\n"
    "  -S, --sparse 0         write data as read: no zero detection (any\n"
    "                         other size leaves detection on)\n"
    "  --no-zero-copy         read data into buffers even where the kernel\n"
    "                         could send it from the file (sendfile)\n"
    "  --zero-copy            sendfile over TCP to a loopback address too\n"
    "                         (default there: the faster of the two, timed\n"
    "                         at the start of a copy of 256 MiB or more)\n"
    "  --no-space-check       copy into a file even when its file system has\n"
    "                         less room than SRC's allocated bytes\n"
    "  --verify               hash SRC while copying, read DST back, compare\n"
    "  --timeout SECONDS      fail when an NBD server answers none of its\n"
    "                         requests in flight for this long (default %d,\n"
    "                         0: wait forever); connecting and the\n"
    "                         handshake wait at most this, and 30 s at most\n"
    "  -p, --progress[=json]  a bar on a terminal (lines in a log), or JSON\n"
    "                         lines; --progress=FD writes \"N/100\" lines to\n"
    "                         file descriptor FD, as nbdcopy does\n"
    "  --synchronous          one request at a time on one connection\n"
    "  -R, --requests N       nbdcopy's requests in flight per connection:\n"
    "                         N x the connections, in all (-C, else 4; 1\n"
    "                         when a server lacks multi-conn or no side\n"
    "                         is NBD)\n"
    "  --queue-size SIZE      nbdcopy's bytes in flight per connection:\n"
    "                         SIZE x the same count, in all\n"
    "  -T, --threads N        accepted for nbdcopy command lines; no effect\n"
    "  --json                 final report as JSON on stdout\n"
    "  --rate LIMIT           send data at LIMIT bytes a second at most, over\n"
    "                         all connections (64M: 64 MiB/s)\n"
    "  --retry N[,DELAY]      reconnect a lost NBD connection, N attempts in\n"
    "                         a row, after DELAY s (1), doubling\n"
    "  --retry-errors         with --retry: also resend a request the\n"
    "                         server failed with EIO, ENOMEM or ENOSPC\n"
    "  --checkpoint FILE      keep how far DST holds SRC in FILE; rerun to\n"
    "                         continue (--checkpoint-interval S, 10)\n"
    "  -h, --help             show this help\n"
    "\nDiagnostic options (reproduce stock clients; slow on purpose):\n"
    "  --nagle                leave Nagle's algorithm on (no TCP_NODELAY)\n"
    "  --max-requests N       at most N requests in flight over all\n"
    "                         connections (1: wait for each reply)\n"
    "  --split-writes         send each write's header and payload in two\n"
    "                         separate writes\n"
    "  The stock sparse_dd shape is --nagle --max-requests 1 --split-writes\n"
    "  --connections 1.\n"
    "\nExit status: 0 when every byte landed (and matched, with --verify);\n"
    "1 on a failure (one line says why); 2 for a usage error (an unknown\n"
    "option, a bad value, a missing name). SIGINT or SIGTERM stops the\n"
    "copy with one line saying how far it got, then ends the process by\n"
    "that signal (a shell shows 130 or 143; a loop of copies stops).\n",
    ENDPOINT_AUTO_CONNECTIONS, ENDPOINT_MAX_CONNECTIONS, COPY_DEFAULT_TIMEOUT);
}

static int
copy_parse_size(const char *opt, const char *v, uint64_t *out)
{
  if (size_parse(v, out) < 0 || *out == 0) {
    log_error("%s: bad size '%s'", opt, v);
    return -1;
  }
  return 0;
}

/* getopt codes of the options that have no short form. */
enum {
  OPT_CONNECTIONS = 256, OPT_REQUEST_SIZE, OPT_INFLIGHT, OPT_ALLOCATED,
  OPT_DST_IS_ZERO, OPT_FLUSH, OPT_NO_FLUSH, OPT_NO_EXTENTS, OPT_NO_ZERO_COPY,
  OPT_ZERO_COPY,
  OPT_VERIFY, OPT_TIMEOUT, OPT_JSON, OPT_NAGLE, OPT_MAX_REQUESTS,
  OPT_SPLIT_WRITES, OPT_SYNCHRONOUS, OPT_QUEUE_SIZE, OPT_SRC_FORMAT,
  OPT_DST_FORMAT, OPT_IGNORE_CHECKSUMS, OPT_DST_PROTOCOL, OPT_NBD_EXPORT,
  OPT_TLS_CERTIFICATES, OPT_TLS_VERIFY_PEER, OPT_EXPECT_SIZE, OPT_BASE,
  OPT_TLS_PRIORITY, OPT_NO_SPACE_CHECK, OPT_RATE, OPT_TLS_CA_FILE,
  OPT_TLS_SERVER_NAME, OPT_DST_SIZE,
};

/* getopt codes of the resuming options. */
enum { OPT_RETRY = 512, OPT_RETRY_ERRORS, OPT_CHECKPOINT,
       OPT_CHECKPOINT_INTERVAL };

/* --retry's wait before its first attempt, its most attempts, and
 * --checkpoint's interval, when not given. */
#define COPY_RETRY_DELAY_MS 1000
#define COPY_RETRY_MAX 1000
#define COPY_CHECKPOINT_S 10

/* --retry N[,DELAY]: N attempts (1 to COPY_RETRY_MAX), DELAY seconds (a
 * decimal, 0 to 3600). */
static int
copy_parse_retry(const char *v, struct copy_args *a)
{
  char *end;
  errno = 0;
  unsigned long n = strtoul(v, &end, 10);
  double d = COPY_RETRY_DELAY_MS / 1000.0;
  if (errno || v[0] < '0' || v[0] > '9' || n == 0 || n > COPY_RETRY_MAX)
    goto bad;
  if (*end == ',') {
    const char *ds = end + 1;
    errno = 0;
    d = strtod(ds, &end);
    if (errno || !((*ds >= '0' && *ds <= '9') || *ds == '.') ||
        !(d >= 0 && d <= 3600))
      goto bad;
  }
  if (*end != '\0')
    goto bad;
  a->retry = (unsigned)n;
  a->retry_delay_ms = (unsigned)(d * 1000 + 0.5);
  return 0;
bad:
  log_error("--retry: N[,DELAY] (N attempts, 1 to %d; DELAY seconds, 0 "
            "to 3600), not '%s'", COPY_RETRY_MAX, v);
  return -1;
}

/* --progress: nothing (a bar), "json", or nbdcopy's file descriptor. */
static int
copy_parse_progress(const char *v, struct copy_opts *o)
{
  char *end;
  long fd;
  if (v == NULL) {
    o->progress = COPY_PROGRESS_BAR;
    return 0;
  }
  if (strcmp(v, "json") == 0) {
    o->progress = COPY_PROGRESS_JSON;
    return 0;
  }
  errno = 0;
  fd = strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || fd < 0 || fd > INT_MAX) {
    log_error("--progress: expected nothing, =json or =FD (a file "
              "descriptor number), not '%s'", v);
    return -1;
  }
  int fl = fd > STDIN_FILENO ? fcntl((int)fd, F_GETFL) : -1;
  if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY) {
    log_error("--progress=%ld: %s", fd,
              fd > STDIN_FILENO && fl < 0 ? "no such open file descriptor"
                                          : "not a descriptor to write to");
    return -1;
  }
  o->progress = COPY_PROGRESS_FD;
  o->progress_fd = (int)fd;
  return 0;
}

/* nbdcopy counts -R and --queue-size per connection and opens the same
 * number on both sides: -C (default 4), or 1 when either NBD side lacks
 * multi-conn. Our window is one for the whole copy, so it gets N times
 * that count; a copy without an NBD side counts one. Connections added
 * later over TCP share the window. An explicit --max-requests or
 * --inflight, our own totals, bounds it when smaller, and so does the
 * largest window (COPY_INFLIGHT_MAX). */
/* What a regular file at path (or a new one there) may grow to: the
 * room left on its file system plus the blocks it already holds. 0, or
 * -1 when path is not a regular file or its file system cannot say. */
static int
copy_room(const char *path, uint64_t *room)
{
  struct stat sd;
  struct statvfs fs;
  uint64_t held = 0;
  if (stat(path, &sd) == 0) {
    if (!S_ISREG(sd.st_mode))
      return -1;
    held = (uint64_t)sd.st_blocks * 512;
  }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else
    slash[slash == dir] = '\0'; /* "/x" keeps "/" */
  if (statvfs(dir, &fs) < 0)
    return -1;
  *room = (uint64_t)fs.f_bavail * fs.f_frsize + held;
  return 0;
}

/* A local file SRC copied into a regular file DST: refused, before DST
 * is opened (or made), when DST's file system has less room than SRC has
 * allocated, beyond what DST already holds (a rewrite reuses its
 * blocks). Allocated bytes bound what a copy writes from above: a source
 * whose allocated blocks hold zeroes may fit after all, which
 * --no-space-check lets the copy find out. Nothing is checked where the
 * data cannot be known (an NBD source, a pipe) or DST is no regular
 * file. 0, or -1 after the line. */
static int
copy_space_check(const struct copy_args *a, const struct endpoint *src)
{
  struct target ts, td;
  struct stat ss;
  if (a->no_space_check || !src->size_known)
    return 0;
  target_parse(a->src, false, &ts);
  target_parse(a->dst, false, &td);
  if (ts.kind != TARGET_FILE || td.kind != TARGET_FILE ||
      stat(ts.arg, &ss) < 0 || !S_ISREG(ss.st_mode))
    return 0;
  uint64_t room;
  if (copy_room(td.arg, &room) < 0)
    return 0;
  uint64_t need = (uint64_t)ss.st_blocks * 512;
  if (need > src->size)
    need = src->size;
  if (need <= room)
    return 0;
  log_error("%s: its file system has room for %llu bytes, and %s has %llu "
            "bytes allocated: the copy would not fit (--no-space-check to "
            "try anyway, if much of it is zeroes)", td.arg,
            (unsigned long long)room, a->src, (unsigned long long)need);
  return -1;
}

static void
copy_per_connection(struct copy_args *a, const struct endpoint *src,
                    const struct endpoint *dst)
{
  bool src_nbd = strcmp(src->ops->kind, "nbd") == 0;
  bool dst_nbd = strcmp(dst->ops->kind, "nbd") == 0;
  bool one = (!src_nbd && !dst_nbd) || (src_nbd && !src->multi_conn) ||
             (dst_nbd && !dst->multi_conn);
  uint64_t conns = one              ? 1
                   : a->connections ? a->connections
                                    : ENDPOINT_AUTO_CONNECTIONS;
  if (a->synchronous)
    return; /* one request, one connection: nbdcopy's rule too */
  if (a->conn_requests) {
    uint64_t n = a->conn_requests * conns;
    a->o.request_limit = n > 65536 ? 65536 : (unsigned)n;
  }
  if (a->conn_queue) {
    uint64_t n = a->conn_queue > COPY_INFLIGHT_MAX / conns
                     ? COPY_INFLIGHT_MAX
                     : a->conn_queue * conns;
    if (a->o.inflight == 0 || n < a->o.inflight)
      a->o.inflight = n;
  }
}

/* DESTINATION is a chunked+tcp:// or chunked+unix:// URI. */
static bool
copy_dst_chunked_uri(const struct copy_args *a)
{
  return strncmp(a->dst, "chunked+tcp://", 14) == 0 ||
         strncmp(a->dst, "chunked+unix://", 15) == 0;
}

/* DESTINATION takes Chunked frames, as far as the command line says (an
 * http(s) one may still ask for them in its answer). */
static bool
copy_dst_chunked(const struct copy_args *a)
{
  return copy_dst_chunked_uri(a) || a->dst_protocol == EP_PROTO_CHUNKED;
}

/* Frames have no reply and no read-back, and the end marker is the
 * final flush: --verify and --no-flush make no sense for them. */
static void
copy_chunked_refusal(const struct copy_args *a)
{
  log_error("%s: %s", a->dst, a->verify
                ? "a Chunked stream cannot be read back to verify: check "
                  "the receiver's copy (nbdflow sum)"
                : "--no-flush would leave the Chunked stream without its "
                  "end marker");
}

/* "-", or a format prefix before it ("vhd:-"): stdin or stdout. */
static bool
copy_is_pipe(const char *spec)
{
  struct target t;
  target_parse(spec, false, &t);
  return t.kind == TARGET_PIPE;
}

static int
copy_parse(int argc, char **argv, struct copy_args *a)
{
  static const struct option longopts[] = {
    { "connections", required_argument, NULL, OPT_CONNECTIONS },
    { "request-size", required_argument, NULL, OPT_REQUEST_SIZE },
    { "inflight", required_argument, NULL, OPT_INFLIGHT },
    { "allocated", no_argument, NULL, OPT_ALLOCATED },
    { "destination-is-zero", no_argument, NULL, OPT_DST_IS_ZERO },
    { "target-is-zero", no_argument, NULL, OPT_DST_IS_ZERO },
    { "flush", no_argument, NULL, OPT_FLUSH },
    { "no-flush", no_argument, NULL, OPT_NO_FLUSH },
    { "no-extents", no_argument, NULL, OPT_NO_EXTENTS },
    { "sparse", required_argument, NULL, 'S' },
    { "no-zero-copy", no_argument, NULL, OPT_NO_ZERO_COPY },
    { "zero-copy", no_argument, NULL, OPT_ZERO_COPY },
    { "verify", no_argument, NULL, OPT_VERIFY },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "progress", optional_argument, NULL, 'p' },
    { "json", no_argument, NULL, OPT_JSON },
    { "synchronous", no_argument, NULL, OPT_SYNCHRONOUS },
    { "requests", required_argument, NULL, 'R' },
    { "queue-size", required_argument, NULL, OPT_QUEUE_SIZE },
    { "threads", required_argument, NULL, 'T' },
    { "nagle", no_argument, NULL, OPT_NAGLE },
    { "max-requests", required_argument, NULL, OPT_MAX_REQUESTS },
    { "split-writes", no_argument, NULL, OPT_SPLIT_WRITES },
    { "src-format", required_argument, NULL, OPT_SRC_FORMAT },
    { "dst-format", required_argument, NULL, OPT_DST_FORMAT },
    { "ignore-checksums", no_argument, NULL, OPT_IGNORE_CHECKSUMS },
    { "retry", required_argument, NULL, OPT_RETRY },
    { "retry-errors", no_argument, NULL, OPT_RETRY_ERRORS },
    { "checkpoint", required_argument, NULL, OPT_CHECKPOINT },
    { "checkpoint-interval", required_argument, NULL,
      OPT_CHECKPOINT_INTERVAL },
    { "dst-protocol", required_argument, NULL, OPT_DST_PROTOCOL },
    { "expect-size", required_argument, NULL, OPT_EXPECT_SIZE },
    { "dst-size", required_argument, NULL, OPT_DST_SIZE },
    { "base", required_argument, NULL, OPT_BASE },
    { "nbd-export", required_argument, NULL, OPT_NBD_EXPORT },
    { "tls-certificates", required_argument, NULL, OPT_TLS_CERTIFICATES },
    { "tls-verify-peer", required_argument, NULL, OPT_TLS_VERIFY_PEER },
    { "tls-priority", required_argument, NULL, OPT_TLS_PRIORITY },
    { "tls-ca-file", required_argument, NULL, OPT_TLS_CA_FILE },
    { "tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME },
    { "no-space-check", no_argument, NULL, OPT_NO_SPACE_CHECK },
    { "rate", required_argument, NULL, OPT_RATE },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int ch;
  uint64_t v;
  optind = 1;
  /* Short options as nbdcopy spells them. */
  while ((ch = getopt_long(argc, argv, "hC:pR:S:T:", longopts, NULL)) != -1) {
    switch (ch) {
    case 'C':
    case OPT_CONNECTIONS:
      if (count_parse(optarg, 64, &v) < 0 || v == 0) {
        log_error("--connections: 1 to 64, not '%s'", optarg);
        return 2;
      }
      a->connections = (unsigned)v;
      break;
    case OPT_REQUEST_SIZE:
      if (copy_parse_size("--request-size", optarg, &a->o.request_size) < 0)
        return 2;
      if (a->o.request_size > (32u << 20)) {
        log_error("--request-size: at most 32M");
        return 2;
      }
      break;
    case OPT_INFLIGHT:
      if (copy_parse_size("--inflight", optarg, &a->o.inflight) < 0)
        return 2;
      if (a->o.inflight > COPY_INFLIGHT_MAX) {
        log_error("--inflight: at most 16G, not '%s'", optarg);
        return 2;
      }
      break;
    case OPT_ALLOCATED:
      a->o.allocated = true;
      break;
    case OPT_DST_IS_ZERO:
      a->o.dst_is_zero = true;
      break;
    case OPT_FLUSH: /* the default; nbdcopy's spelling */
      a->o.no_flush = false;
      break;
    case OPT_NO_FLUSH:
      a->o.no_flush = true;
      break;
    case OPT_NO_EXTENTS:
      a->o.no_extents = true;
      break;
    case 'S':
      /* nbdcopy's zero detection block: 0 turns detection off; any other
       * size leaves it on (we look at whole requests, and at 4 KiB blocks
       * written into a new file). */
      if (size_parse(optarg, &v) < 0) {
        log_error("--sparse: bad size '%s'", optarg);
        return 2;
      }
      a->o.no_zero_detect = v == 0;
      break;
    case OPT_NO_ZERO_COPY: /* the last of the two wins */
      a->o.no_zero_copy = true;
      a->o.zero_copy = false;
      break;
    case OPT_ZERO_COPY:
      a->o.zero_copy = true;
      a->o.no_zero_copy = false;
      break;
    case OPT_VERIFY:
      a->verify = true;
      break;
    case OPT_TIMEOUT:
      if (copy_timeout_parse(optarg, &a->o.timeout_s) < 0)
        return 2;
      break;
    case 'p':
      if (copy_parse_progress(optarg, &a->o) < 0)
        return 2;
      break;
    case OPT_JSON:
      a->json = true;
      break;
    case OPT_SYNCHRONOUS:
      a->synchronous = true;
      break;
    case 'T':
      /* nbdcopy's thread count: one event loop does our copying, so the
       * number is checked and has no effect. */
      if (count_parse(optarg, 1024, &v) < 0) {
        log_error("--threads: 0 to 1024, not '%s'", optarg);
        return 2;
      }
      break;
    case 'R':
      if (count_parse(optarg, 65536, &v) < 0 || v == 0) {
        log_error("--requests: 1 to 65536, not '%s'", optarg);
        return 2;
      }
      a->conn_requests = (unsigned)v;
      break;
    case OPT_QUEUE_SIZE:
      if (copy_parse_size("--queue-size", optarg, &a->conn_queue) < 0)
        return 2;
      break;
    case OPT_NAGLE:
      a->nagle = true;
      break;
    case OPT_MAX_REQUESTS:
      if (count_parse(optarg, 65536, &v) < 0 || v == 0) {
        log_error("--max-requests: 1 to 65536, not '%s'", optarg);
        return 2;
      }
      a->o.max_requests = (unsigned)v;
      break;
    case OPT_SPLIT_WRITES:
      a->split_writes = true;
      break;
    case OPT_SRC_FORMAT:
      if (image_format_parse(optarg, &a->src_format) < 0) {
        log_error("--src-format: raw, vhd, qcow2 or auto, not '%s'",
                  optarg);
        return 2;
      }
      a->src_format_given = a->src_format != IMAGE_FORMAT_AUTO;
      break;
    case OPT_DST_FORMAT:
      if (image_format_parse(optarg, &a->dst_format) < 0 ||
          a->dst_format == IMAGE_FORMAT_AUTO) {
        log_error("--dst-format: raw, vhd or qcow2, not '%s'", optarg);
        return 2;
      }
      break;
    case OPT_IGNORE_CHECKSUMS:
      a->ignore_checksums = true;
      break;
    case OPT_RETRY:
      if (copy_parse_retry(optarg, a) < 0)
        return 2;
      break;
    case OPT_RETRY_ERRORS:
      a->retry_errors = true;
      break;
    case OPT_CHECKPOINT:
      if (optarg[0] == '\0') {
        log_error("--checkpoint: a file name, not ''");
        return 2;
      }
      a->checkpoint = optarg;
      break;
    case OPT_CHECKPOINT_INTERVAL:
      if (count_parse(optarg, 86400, &v) < 0 || v == 0) {
        log_error("--checkpoint-interval: whole seconds, 1 to 86400, not "
                  "'%s'", optarg);
        return 2;
      }
      a->checkpoint_s = (unsigned)v;
      break;
    case OPT_DST_PROTOCOL:
      if (strcmp(optarg, "auto") == 0)
        a->dst_protocol = EP_PROTO_AUTO;
      else if (strcmp(optarg, "nbd") == 0)
        a->dst_protocol = EP_PROTO_NBD;
      else if (strcmp(optarg, "chunked") == 0)
        a->dst_protocol = EP_PROTO_CHUNKED;
      else {
        log_error("--dst-protocol: auto, nbd or chunked, not '%s'", optarg);
        return 2;
      }
      break;
    case OPT_NBD_EXPORT:
      /* Checked as a URI's export name is: NBD's strings are UTF-8. */
      if (strlen(optarg) > NBD_MAX_STRING || !text_utf8_valid(optarg)) {
        log_error("--nbd-export: the name is not UTF-8 text of at most "
                  "%d bytes, as NBD requires", NBD_MAX_STRING);
        return 2;
      }
      a->nbd_export = optarg;
      break;
    case OPT_BASE:
      a->base = optarg;
      break;
    case OPT_DST_SIZE:
      /* A file's size is an off_t: larger is no size a DST can have. */
      if (size_parse(optarg, &a->dst_size) < 0 ||
          a->dst_size > (uint64_t)INT64_MAX) {
        log_error("--dst-size: bad size '%s'", optarg);
        return 2;
      }
      a->dst_size_given = true;
      break;
    case OPT_EXPECT_SIZE:
      if (size_parse(optarg, &a->expect_size) < 0) {
        log_error("--expect-size: bad size '%s'", optarg);
        return 2;
      }
      a->expect_size_given = true;
      break;
    case OPT_TLS_CERTIFICATES:
      a->tls_certificates = optarg;
      break;
    case OPT_TLS_PRIORITY:
      a->tls_priority = optarg;
      break;
    case OPT_TLS_CA_FILE:
      a->tls_ca_file = optarg;
      break;
    case OPT_TLS_SERVER_NAME:
      a->tls_server_name = optarg;
      break;
    case OPT_NO_SPACE_CHECK:
      a->no_space_check = true;
      break;
    case OPT_RATE:
      if (size_parse(optarg, &a->o.rate) < 0 || a->o.rate < 4096) {
        log_error("--rate: bytes a second with K, M or G (64M: 64 MiB/s), "
                  "4K at least, not '%s'", optarg);
        return 2;
      }
      break;
    case OPT_TLS_VERIFY_PEER:
      a->no_tls_verify = a->tls_chain_only = false;
      if (strcmp(optarg, "false") == 0 || strcmp(optarg, "0") == 0)
        a->no_tls_verify = true;
      else if (strcmp(optarg, "chain") == 0)
        a->tls_chain_only = true;
      else if (strcmp(optarg, "true") != 0 && strcmp(optarg, "1") != 0) {
        log_error("--tls-verify-peer: true, false or chain, not '%s'",
                  optarg);
        return 2;
      }
      break;
    case 'h':
      copy_usage(stdout);
      return 0;
    default:
      return cmd_usage_hint("copy");
    }
  }
  if (a->synchronous) {
    /* nbdcopy's one request at a time, on one connection each side. */
    a->o.max_requests = 1;
    a->connections = 1;
  }
  if (optind != argc - 2) {
    char what[256];
    if (optind == argc)
      snprintf(what, sizeof what, "no SOURCE or DESTINATION given");
    else if (optind == argc - 1)
      snprintf(what, sizeof what, "no DESTINATION given after '%s'",
               argv[optind]);
    else
      snprintf(what, sizeof what, "one SOURCE and one DESTINATION, not %d "
               "names ('%s' is extra)", argc - optind, argv[optind + 2]);
    return cmd_usage_error("copy", what);
  }
  a->src = argv[optind];
  a->dst = argv[optind + 1];
  bool dst_http = http_url_is_http(a->dst);
  bool dst_chunked = copy_dst_chunked_uri(a);
  bool dst_nbd = !dst_http && !dst_chunked && uri_is_uri(a->dst);
  if (a->nbd_export && !dst_http && !dst_nbd) {
    log_error("--nbd-export names the export of an http(s) or NBD "
              "DESTINATION; '%s' is neither", a->dst);
    return 2;
  }
  if (a->nbd_export && dst_nbd) {
    /* It fills in a URI's empty export name; two names are a mistake. */
    struct nbd_uri u;
    char err[256];
    if (uri_parse(a->dst, &u, err, sizeof err) == 0) {
      bool two = u.export_name[0] && strcmp(u.export_name, a->nbd_export);
      a->dst_fill_export = u.export_name[0] == '\0';
      if (two)
        log_error("DESTINATION '%s' names export \"%s\" and --nbd-export "
                  "\"%s\": give one", a->dst, u.export_name,
                  a->nbd_export);
      uri_free(&u);
      if (two)
        return 2;
    }
  }
  if ((a->tls_certificates || a->tls_priority || a->no_tls_verify ||
       a->tls_chain_only || a->tls_ca_file || a->tls_server_name) &&
      strncasecmp(a->dst, "https://", 8) != 0) {
    /* Silently unused, they would leave the user believing they hold. */
    log_error("%s applies to an https:// DESTINATION, not '%s'%s",
              a->tls_priority       ? "--tls-priority"
              : a->tls_certificates ? "--tls-certificates"
              : a->tls_ca_file      ? "--tls-ca-file"
              : a->tls_server_name  ? "--tls-server-name"
                                    : "--tls-verify-peer",
              a->dst,
              strncasecmp(a->dst, "nbds", 4) == 0
                  ? " (an nbds:// URI takes its TLS settings as parameters: "
                    "tls-certificates=DIR, tls-verify-peer=0...)"
                  : "");
    return 2;
  }
  if (a->dst_protocol == EP_PROTO_NBD && !dst_http && !dst_nbd) {
    log_error("--dst-protocol nbd: DESTINATION '%s' is not an http(s) URL "
              "or an NBD URI", a->dst);
    return 2;
  }
  if (a->dst_protocol == EP_PROTO_CHUNKED && dst_nbd) {
    log_error("--dst-protocol chunked: Chunked frames go to a file, '-', "
              "chunked+tcp://, chunked+unix:// or an http(s) URL, not to "
              "NBD URI '%s'", a->dst);
    return 2;
  }
  if (copy_dst_chunked(a) && (a->verify || a->o.no_flush)) {
    /* Before DST is opened: a file would be truncated, a receiver left
     * with a stream that ends without its marker. */
    copy_chunked_refusal(a);
    return 2;
  }
  if (a->o.allocated && a->o.dst_is_zero) {
    log_error("--allocated writes every zero range and "
              "--destination-is-zero skips them: use one or the other");
    return 2;
  }
  bool dst_pipe = copy_is_pipe(a->dst), src_pipe = copy_is_pipe(a->src);
  if (a->o.progress == COPY_PROGRESS_FD && a->o.progress_fd == STDOUT_FILENO &&
      dst_pipe) {
    log_error("--progress=1 writes to stdout, where DESTINATION '%s' "
              "writes the image: use another descriptor", a->dst);
    return 2;
  }
  if (a->json && dst_pipe) {
    /* The image goes to stdout; a report after it would corrupt it. */
    log_error("--json writes its report to stdout, where DESTINATION '%s' "
              "writes the image: use one or the other", a->dst);
    return 2;
  }
  if (a->checkpoint_s && !a->checkpoint) {
    log_error("--checkpoint-interval sets how often --checkpoint FILE is "
              "written: give --checkpoint too");
    return 2;
  }
  if (a->retry_errors && a->retry == 0) {
    log_error("--retry-errors resends failed requests as often as --retry "
              "N allows: give --retry too");
    return 2;
  }
  if (a->checkpoint && (src_pipe || dst_pipe || a->o.no_flush)) {
    log_error("--checkpoint needs a source and a destination that can be "
              "written again where it stopped (not '-'), and the flushes "
              "that --no-flush turns off");
    return 2;
  }
  if (a->verify && (strcmp(a->dst, "null:") == 0 || dst_pipe || src_pipe)) {
    log_error("--verify needs a source and a destination that can be read "
              "back (not '-' or null:)");
    return 2;
  }
  struct target vt;
  struct stat vst;
  target_parse(a->dst, false, &vt);
  if (a->verify && vt.kind == TARGET_FILE && stat(vt.arg, &vst) == 0 &&
      (S_ISFIFO(vst.st_mode) || S_ISCHR(vst.st_mode))) {
    /* Before it is opened: opening a FIFO waits for its reader. */
    log_error("%s is a %s and cannot be read back: --verify needs a file, "
              "a block device or an NBD server", a->dst,
              S_ISFIFO(vst.st_mode) ? "FIFO" : "character device");
    return 2;
  }
  if (a->verify && dst_http) {
    /* The upload's NBD session ends with the copy; the URL opens no
     * other. */
    log_error("--verify: an http(s) DESTINATION is an upload that cannot "
              "be read back: check the receiver's copy with 'nbdflow sum'");
    return 2;
  }
  return -1;
}

static enum image_format copy_dst_format(const struct copy_args *a);

/* path (may be NULL) is the file st names. */
static bool
copy_same_file(const char *path, const struct stat *st)
{
  struct stat x;
  return path && stat(path, &x) == 0 && x.st_dev == st->st_dev &&
         x.st_ino == st->st_ino;
}

/* DST must not be a file that SRC's image reads through (a parent, a
 * backing file), nor SRC's own file where a format is involved: an image
 * written as a stream truncates its file first, and the bytes written
 * there are not the bytes read. A raw file copied onto itself is left as
 * it was (each block is written back where it was read), so it is let
 * through. 0, or -1 after a message. */
static int
copy_check_dst_apart(const struct copy_args *a, struct endpoint *src)
{
  struct target dt, st;
  struct stat d;
  target_parse(a->dst, false, &dt);
  if (dt.kind != TARGET_FILE || stat(dt.arg, &d) < 0 ||
      !(S_ISREG(d.st_mode) || S_ISBLK(d.st_mode)))
    return 0;
  target_parse(a->src, true, &st);
  struct image *img = endpoint_image(src);
  bool raw = img == NULL && copy_dst_format(a) <= IMAGE_FORMAT_RAW;
  const char *hit = !raw && st.kind == TARGET_FILE &&
                            copy_same_file(st.arg, &d)
                        ? "SOURCE itself"
                        : NULL;
  if (hit == NULL && img && img->ops->info) {
    struct image_info in;
    img->ops->info(img, &in, false);
    for (int i = 0; i < in.nparents && hit == NULL; i++)
      if (copy_same_file(in.parents[i], &d))
        hit = "a file that SOURCE's image reads (a parent or backing file)";
  }
  if (hit == NULL)
    return 0;
  log_error("DESTINATION %s is %s: writing it would destroy what is being "
            "copied", a->dst, hit);
  return -1;
}

/* One event loop, worker pool and pair of endpoints. */
struct copy_session {
  struct loop *loop;
  struct ep_env env;
  bool env_ok;
  struct endpoint *src, *dst;
  struct endpoint *base; /* --base, until a delta endpoint owns it */
};

static int
copy_session_open(struct copy_session *s)
{
  memset(s, 0, sizeof *s);
  s->loop = loop_new();
  if (s->loop == NULL || ep_env_init(&s->env, s->loop, 4) < 0) {
    log_error("cannot set up the event loop: %s", strerror(errno));
    return -1;
  }
  s->env_ok = true;
  return 0;
}

static void
copy_session_close(struct copy_session *s)
{
  if (s->env_ok)
    ep_env_fini(&s->env); /* joins workers before endpoints go away */
  endpoint_close(s->src);
  endpoint_close(s->dst);
  endpoint_close(s->base);
  loop_free(s->loop);
}

/* One side's "tls" in the report: null without TLS. */
static void
copy_json_tls(const struct copy_tls *t)
{
  if (!t->on) {
    fputs("null", stdout);
    return;
  }
  fputs("{\"version\": ", stdout);
  text_json_str(stdout, t->p.version);
  fputs(", \"cipher\": ", stdout);
  text_json_str(stdout, t->p.cipher);
  fputs(", \"auth\": ", stdout);
  text_json_str(stdout, t->p.auth);
  printf(", \"uniform\": %s}", t->uniform ? "true" : "false");
}

static void
copy_report_json(const struct copy_args *a, const struct copy_stats *st,
                 bool verified)
{
  double mibs = st->seconds > 0 ? (double)(st->done - st->resumed) /
                                      1048576.0 / st->seconds
                                : 0;
  /* Names come from the command line: any bytes at all. */
  fputs("{\"source\": ", stdout);
  text_json_str(stdout, a->src);
  fputs(", \"destination\": ", stdout);
  text_json_str(stdout, a->dst);
  printf(", \"bytes_total\": %llu, \"bytes_copied\": %llu, "
         "\"bytes_zeroed\": %llu, \"bytes_skipped\": %llu, "
         "\"seconds\": %.3f, \"mib_per_s\": %.1f, \"requests\": %llu, "
         "\"connections\": {\"source\": %u, \"destination\": %u}, "
         "\"request_size\": %llu, \"opening_request\": %llu, "
         "\"window_bytes\": %llu, \"request_limit\": %u, "
         "\"peak_inflight_bytes\": %llu, \"peak_depth\": %u, "
         "\"data_path\": \"%s\", \"verified\": %s, "
         "\"diagnostic\": {\"nagle\": %s, \"split_writes\": %s, "
         "\"max_requests\": %u}, \"reconnects\": %llu, "
         "\"bytes_resent\": %llu, \"bytes_resumed\": %llu, "
         "\"rate_limit\": %llu, ",
         (unsigned long long)st->total,
         (unsigned long long)st->copied, (unsigned long long)st->zeroed,
         (unsigned long long)st->skipped, st->seconds, mibs,
         (unsigned long long)st->requests, st->src_connections,
         st->dst_connections, (unsigned long long)st->request_size,
         (unsigned long long)st->opening_request,
         (unsigned long long)st->window, a->o.request_limit,
         (unsigned long long)st->peak_inflight, st->peak_depth,
         st->data_path ? st->data_path : "buffer", verified ? "true" : "false",
         a->nagle ? "true" : "false", a->split_writes ? "true" : "false",
         a->o.max_requests, (unsigned long long)st->reconnects,
         (unsigned long long)st->resent, (unsigned long long)st->resumed,
         (unsigned long long)a->o.rate);
  fputs("\"data_path_probe\": ", stdout);
  if (st->probed)
    printf("{\"turns\": %u, \"of\": %u, \"turn_bytes\": %llu, "
           "\"sendfile_ms\": %.1f, \"buffer_ms\": %.1f}", st->probe_turns,
           st->probe_of,
           (unsigned long long)st->probe_turn_bytes,
           (double)st->probe_us[0] / 1e3, (double)st->probe_us[1] / 1e3);
  else
    fputs("null", stdout);
  fputs(", \"connection_probe\": ", stdout);
  if (st->conn_probed)
    printf("{\"turns\": %u, \"of\": %u, \"turn_bytes\": %llu, "
           "\"all_ms\": %.1f, \"one_ms\": %.1f, \"chose\": \"%s\"}",
           st->conn_probe_turns, st->conn_probe_of,
           (unsigned long long)st->probe_turn_bytes,
           (double)st->conn_probe_us[0] / 1e3,
           (double)st->conn_probe_us[1] / 1e3, st->conn_choice);
  else
    fputs("null", stdout);
  fputs(", \"tls\": {\"source\": ", stdout);
  copy_json_tls(&st->src_tls);
  fputs(", \"destination\": ", stdout);
  copy_json_tls(&st->dst_tls);
  printf("}%s%s%s%s}\n",
         st->tcp_json[0] ? ", \"tcp\": " : "",
         st->tcp_json,
         st->tcp_json_each[0] ? ", \"tcp_per_connection\": " : "",
         st->tcp_json_each);
}

/* A pipe's length shows only at its end. When the copy from standard
 * input stopped because the destination was full, whatever input is left
 * did not land: that is a failure, not a copy of the first bytes. 0 when
 * standard input is at its end, 1 (after the error line) otherwise. */
static int
copy_input_left(const char *dst, uint64_t dst_size)
{
  char c;
  ssize_t n;
  do
    n = read(STDIN_FILENO, &c, 1);
  while (n < 0 && errno == EINTR);
  if (n == 0)
    return 0;
  if (n < 0)
    log_error("standard input, after %llu bytes: %s",
              (unsigned long long)dst_size, strerror(errno));
  else
    log_error("standard input is longer than %s (%llu bytes): the rest "
              "was not copied", dst, (unsigned long long)dst_size);
  return 1;
}

/* Reads DST back over a fresh session and compares chunk digests. */
static int
copy_verify(struct copy_args *a, const struct copy_chunks *want,
            uint64_t size)
{
  struct copy_session s;
  char err[512];
  struct copy_chunks got = { 0 };
  struct copy_stats st;
  int rc = 1;
  if (size == 0)
    return 0; /* nothing was copied, so nothing can differ */
  if (copy_session_open(&s) < 0)
    goto out;
  struct endpoint_opts eo = { .write = false, .as_dst = true,
                              .connections = a->connections,
                              .timeout_s = a->o.timeout_s,
                              .retry = a->retry,
                              .retry_delay_ms = a->retry_delay_ms,
                              .format = a->dst_format,
                              .format_given = a->dst_format != 0,
                              .shown = a->dst };
  if (endpoint_open(&s.env, a->dst_open, &eo, &s.src, err, sizeof err) <
      0) {
    log_error("verify: %s", err);
    goto out;
  }
  struct copy_opts o = { .request_size = a->o.request_size,
                         .inflight = a->o.inflight, .max_bytes = size,
                         .timeout_s = a->o.timeout_s,
                         .progress = a->o.progress == COPY_PROGRESS_FD
                                     ? COPY_PROGRESS_NONE : a->o.progress,
                         .label = "verify",
                         .chunks = &got };
  if (copy_run(&s.env, s.src, NULL, &o, &st, err, sizeof err) < 0) {
    log_error("verify: %s", err);
    goto out;
  }
  if (size > 0 && st.done != size) {
    log_error("verify: read back %llu bytes of %s, expected %llu",
              (unsigned long long)st.done, a->dst, (unsigned long long)size);
    goto out;
  }
  for (uint64_t i = 0; i < want->n || i < got.n; i++) {
    if (i < want->n && i < got.n && want->d[i] == got.d[i])
      continue;
    uint64_t off = i * COPY_CHUNK;
    uint64_t end = off + COPY_CHUNK < size ? off + COPY_CHUNK : size;
    log_error("verify: %s differs from %s in bytes %llu to %llu (length "
              "%llu)", a->dst, a->src, (unsigned long long)off,
              (unsigned long long)end, (unsigned long long)(end - off));
    goto out;
  }
  rc = 0;
out:
  copy_chunks_free(&got);
  copy_session_close(&s);
  return rc;
}

/* Which blocks of the source hold data, for a destination format that
 * writes its block table before the blocks (a VHD). */
struct copy_alloc {
  uint8_t *bits;  /* one bit per block, LSB first; owned */
  uint32_t block;
  uint64_t blocks;
};

static enum image_format
copy_dst_format(const struct copy_args *a)
{
  struct target t;
  target_parse(a->dst, false, &t);
  return t.format_given ? t.format : a->dst_format;
}

/* DST is an image written from scratch as a stream (a new file or '-'):
 * nothing of it exists before the copy writes it. */
static bool
copy_dst_is_new_image(const struct copy_args *a)
{
  struct target t;
  target_parse(a->dst, false, &t);
  enum image_format f = copy_dst_format(a);
  return f > IMAGE_FORMAT_RAW &&
         (t.kind == TARGET_PIPE ||
          (t.kind == TARGET_FILE && !endpoint_image_exists(t.arg, f)));
}

/* DST cannot already hold a --base: a new image, a raw file that does
 * not exist or is empty, raw bytes to '-', a FIFO or a character device
 * (written in order, so every skipped block would read as zeroes), or a
 * fresh memory: disk. Chunked
 * frames are not: the receiver applies them to what it holds. */
static bool
copy_dst_holds_nothing(const struct copy_args *a)
{
  if (copy_dst_chunked(a))
    return false;
  if (copy_dst_is_new_image(a))
    return true;
  struct target t;
  struct stat st;
  target_parse(a->dst, false, &t);
  switch (t.kind) {
  case TARGET_PIPE:
  case TARGET_MEMORY:
    return true;
  case TARGET_FILE:
    if (stat(t.arg, &st) < 0)
      return errno == ENOENT;
    /* A FIFO or character device is written in order, as '-' is. */
    return (S_ISREG(st.st_mode) && st.st_size == 0) ||
           S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode);
  default:
    return false;
  }
}

/* An image to a new file holds a whole block for each block with data
 * (a VHD's 2 MiB for one byte), which the source's allocated bytes do not
 * bound: once the scan has counted them, a file system without room for
 * that many is refused before the file is made. Returns 0, or -1 after
 * the error. */
static int
copy_image_space_check(const struct copy_args *a, const struct copy_alloc *al)
{
  struct target td;
  uint64_t room, n = 0;
  target_parse(a->dst, false, &td);
  if (a->no_space_check || td.kind != TARGET_FILE ||
      copy_room(td.arg, &room) < 0)
    return 0;
  for (uint64_t b = 0; b < al->blocks; b++)
    n += al->bits[b / 8] >> (b % 8) & 1;
  uint64_t need = n * al->block;
  if (need <= room)
    return 0;
  log_error("%s: its file system has room for %llu bytes, and the %s "
            "image needs at least %llu (%llu blocks of %u bytes hold "
            "data): the copy would not fit (--no-space-check to try "
            "anyway)", td.arg, (unsigned long long)room,
            image_format_name(copy_dst_format(a)), (unsigned long long)need,
            (unsigned long long)n, al->block);
  return -1;
}

/* The block size of the destination's allocation map: 0 when it needs
 * none. */
static uint32_t
copy_alloc_block(const struct copy_args *a)
{
  /* An existing image is written in place: no table leaves first. */
  return copy_dst_is_new_image(a) ? image_writer_block(copy_dst_format(a))
                                  : 0;
}

static void
copy_alloc_add(void *arg, uint64_t off, uint64_t len, bool zero)
{
  struct copy_alloc *al = arg;
  if (zero || len == 0)
    return;
  for (uint64_t b = off / al->block; b <= (off + len - 1) / al->block &&
                                     b < al->blocks; b++)
    al->bits[b / 8] |= (uint8_t)(1u << (b % 8));
}

/* Which blocks of the source hold data, before the copy: a format whose
 * tables leave first must know. The source is read once for it (holes
 * skipped, in parallel, as a copy with no destination), so that blocks
 * of zeroes stay unallocated too; with --sparse=0 (no zero detection)
 * only its extents are asked. The format's size limit is checked first,
 * so that nothing is created for a source too large. */
static int
copy_alloc_scan(const struct copy_args *a, struct copy_session *s,
                struct copy_alloc *al, enum image_format f, uint32_t block)
{
  char err[512];
  if (!s->src->size_known)
    return 0; /* the destination refuses it, saying why */
  /* Too large for the format: said before the source is walked. */
  struct image_writer *w;
  if (image_writer_new(f, s->src->size, NULL, &w, err, sizeof err) < 0) {
    log_error("%s: %s", s->src->name, err);
    return -1;
  }
  image_writer_free(w);
  al->block = block;
  al->blocks = (s->src->size + al->block - 1) / al->block;
  if ((al->bits = calloc(al->blocks / 8 + 1, 1)) == NULL) {
    log_error("out of memory");
    return -1;
  }
  if (a->o.no_zero_detect) {
    if (endpoint_scan(&s->env, s->src, copy_alloc_add, al, err,
                      sizeof err) < 0) {
      log_error("%s", err);
      return -1;
    }
    return 0;
  }
  struct copy_opts o = { .request_size = a->o.request_size,
                         .inflight = a->o.inflight,
                         .timeout_s = a->o.timeout_s,
                         .no_extents = a->o.no_extents,
                         .progress = a->o.progress == COPY_PROGRESS_FD
                                     ? COPY_PROGRESS_NONE : a->o.progress,
                         .label = "scan",
                         .data_map = al->bits, .data_map_block = block };
  struct copy_stats st;
  if (copy_run(&s->env, s->src, NULL, &o, &st, err, sizeof err) < 0) {
    log_error("looking for the data of %s: %s", s->src->name, err);
    return -1;
  }
  return 0;
}

/* --checkpoint: opens (or starts) the journal for this pair and sets
 * where the copy begins and how it records its progress. A destination
 * written as a stream (a VHD or qcow2 writer, Chunked) cannot be
 * continued. Returns 0, or -1 after the error line. */
static int
copy_checkpoint_commit(void *arg, uint64_t below, char *err, size_t errlen)
{
  return journal_commit(arg, below, err, errlen);
}

/* The journal's source side: SRC's name, size and identity, and for an
 * image with parents (a differencing VHD, a qcow2 with a backing file)
 * the identity of each of them too, folded into the recorded time, so
 * that a parent replaced between runs is caught like a changed source. */
static int
copy_journal_src(const struct copy_args *a, const struct copy_session *s,
                 struct journal_side *side, char *err, size_t errlen)
{
  int r = journal_side_init(side, a->src, true, s->src->size, err, errlen);
  struct image *img = endpoint_image(s->src);
  if (r < 0 || img == NULL || img->ops->info == NULL)
    return r;
  struct image_info in;
  img->ops->info(img, &in, false);
  for (int i = 0; i < in.nparents; i++) {
    struct stat st;
    uint64_t id[4] = { (uint64_t)i, 0, 0, 0 };
    if (stat(in.parents[i], &st) == 0) {
      id[1] = (uint64_t)st.st_dev;
      id[2] = (uint64_t)st.st_ino;
      id[3] = (uint64_t)st.st_mtim.tv_sec * 1000000000 +
              (uint64_t)st.st_mtim.tv_nsec;
    }
    /* Kept a non-negative number, as the journal records times. */
    side->mtime_ns = (int64_t)(((uint64_t)side->mtime_ns ^
                                XXH3_64bits(id, sizeof id)) & INT64_MAX);
  }
  return 0;
}

static void
copy_checkpoint_stream(const struct copy_args *a)
{
  log_error("--checkpoint: %s is written as a stream, which cannot be "
            "continued where it stopped", a->dst);
}

/* --checkpoint's refusals that need no open DESTINATION, made before it
 * is opened (a file is then truncated or created): a stream, a journal
 * that names another copy or does not parse, one that cannot be
 * created. Returns 0, or -1 after the error. */
static int
copy_checkpoint_precheck(const struct copy_args *a,
                         const struct copy_session *s, uint32_t alloc_block,
                         uint64_t *dst_size)
{
  char err[512];
  struct journal_side src;
  if (alloc_block || !s->src->size_known || copy_dst_chunked(a)) {
    copy_checkpoint_stream(a);
    return -1;
  }
  if (copy_journal_src(a, s, &src, err, sizeof err) < 0 ||
      journal_precheck(a->checkpoint, &src, a->dst,
                       copy_dst_format(a) <= IMAGE_FORMAT_RAW, dst_size,
                       err, sizeof err) < 0) {
    log_error("%s", err);
    return -1;
  }
  return 0;
}

static int
copy_checkpoint_open(struct copy_args *a, struct copy_session *s,
                     uint32_t alloc_block, struct journal **out)
{
  char err[512];
  struct journal_side src, dst;
  uint64_t done;
  if (alloc_block || !s->src->size_known ||
      strcmp(s->dst->ops->kind, "chunked") == 0 ||
      strcmp(s->dst->ops->kind, "pipe") == 0) {
    copy_checkpoint_stream(a);
    return -1;
  }
  if (copy_journal_src(a, s, &src, err, sizeof err) < 0 ||
      journal_side_init(&dst, a->dst, false, s->dst->size, err,
                        sizeof err) < 0 ||
      journal_open(a->checkpoint, &src, &dst, out, &done, err,
                   sizeof err) < 0) {
    log_error("%s", err);
    return -1;
  }
  if (done % COPY_CHUNK && done != s->src->size) {
    /* The engine records whole chunks only: a resumed --verify joins
     * the digests of the part before. */
    log_error("--checkpoint %s: offset %llu is not a multiple of %llu",
              a->checkpoint, (unsigned long long)done,
              (unsigned long long)COPY_CHUNK);
    return -1;
  }
  if (done)
    log_info("%s: continuing at byte %llu of %llu", a->checkpoint,
             (unsigned long long)done, (unsigned long long)s->src->size);
  a->o.start = done;
  a->o.checkpoint = copy_checkpoint_commit;
  a->o.checkpoint_arg = *out;
  a->o.checkpoint_us = (uint64_t)(a->checkpoint_s ? a->checkpoint_s
                                                  : COPY_CHECKPOINT_S) *
                       1000000;
  return 0;
}

/* A resumed --verify: the digests of the source before the copy's start,
 * read now, so that the whole destination is compared at the end. */
static int
copy_hash_prefix(const struct copy_args *a, struct copy_session *s,
                 struct copy_chunks *out)
{
  char err[512];
  struct copy_stats st;
  struct copy_opts o = { .request_size = a->o.request_size,
                         .inflight = a->o.inflight, .max_bytes = a->o.start,
                         .timeout_s = a->o.timeout_s,
                         .progress = a->o.progress == COPY_PROGRESS_FD
                                     ? COPY_PROGRESS_NONE : a->o.progress,
                         .label = "hash", .chunks = out };
  if (copy_run(&s->env, s->src, NULL, &o, &st, err, sizeof err) < 0) {
    log_error("reading %s before the resumed part: %s", a->src, err);
    return -1;
  }
  return 0;
}

/* Appends rest's digests to all's. Returns 0, or -1 after the error. */
static int
copy_chunks_join(struct copy_chunks *all, const struct copy_chunks *rest)
{
  uint64_t n = all->n + rest->n;
  uint64_t *d = realloc(all->d, (n ? n : 1) * sizeof *d);
  if (d == NULL) {
    log_error("out of memory");
    return -1;
  }
  memcpy(d + all->n, rest->d, rest->n * sizeof *d);
  all->d = d;
  all->n = all->cap = n;
  return 0;
}

bool copy_peer_error;

/* SOURCE, DESTINATION and --base as endpoint_open will take them: what
 * the command line alone shows to be wrong is a usage error, said before
 * anything is opened. */
static int
copy_check_targets(const struct copy_args *a, char *err, size_t errlen)
{
  struct endpoint_opts so = { .format = a->src_format,
                              .format_given = a->src_format_given };
  struct endpoint_opts dopt = { .write = true, .shown = a->dst,
                                .format = a->dst_format,
                                .format_given =
                                    a->dst_format != IMAGE_FORMAT_AUTO,
                                .protocol = a->dst_protocol };
  if (endpoint_check(a->src, &so, err, errlen) < 0 ||
      endpoint_check(a->dst_open, &dopt, err, errlen) < 0)
    return -1;
  if (a->base && errlen > 8 &&
      endpoint_check(a->base, &so, err + 8, errlen - 8) < 0) {
    memcpy(err, "--base: ", 8);
    return -1;
  }
  return 0;
}

int
cmd_copy(int argc, char **argv)
{
  struct copy_args a = { 0 };
  a.o.label = "copy";
  a.o.timeout_s = COPY_DEFAULT_TIMEOUT;
  int rc = copy_parse(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (cmd_check_uri(a.src) < 0 || cmd_check_uri(a.dst) < 0)
    return 2;
  /* An http(s) URL's password goes to the server, never into a message
   * or the report: those name DST with "***" in its place. */
  char *dst_shown = http_url_redacted(a.dst);
  a.dst_open = a.dst;
  if (dst_shown)
    a.dst = dst_shown;
  /* --nbd-export fills in an NBD URI's empty export name: from here on
   * DST names the export itself, for the journal, --verify and messages. */
  char *dst_named = NULL;
  if (a.dst_fill_export) {
    if ((dst_named = uri_with_export(a.dst, a.nbd_export)) == NULL) {
      log_error("out of memory");
      free(dst_shown);
      return 1;
    }
    a.dst = a.dst_open = dst_named;
    a.nbd_export = NULL;
  }
  rc = 1;
  struct copy_session s;
  struct copy_chunks chunks = { 0 };
  struct copy_alloc alloc = { 0 };
  struct copy_chunks rest = { 0 }; /* a resumed --verify: from start on */
  struct journal *journal = NULL;
  struct copy_stats st;
  char err[512];
  if (copy_session_open(&s) < 0)
    goto out;
  if (copy_check_targets(&a, err, sizeof err) < 0) {
    log_error("%s", err);
    rc = 2;
    goto out;
  }
  struct endpoint_opts so = { .write = false, .connections = a.connections,
                              .no_extents = a.o.no_extents,
                              .nagle = a.nagle,
                              .split_writes = a.split_writes,
                              .timeout_s = a.o.timeout_s,
                              .retry = a.retry,
                              .retry_delay_ms = a.retry_delay_ms,
                              .retry_errors = a.retry_errors,
                              .format = a.src_format,
                              .format_given = a.src_format_given,
                              .ignore_checksums = a.ignore_checksums };
  if (endpoint_open(&s.env, a.src, &so, &s.src, err, sizeof err) < 0) {
    log_error("%s", err);
    goto out;
  }
  if (copy_check_dst_apart(&a, s.src) < 0)
    goto out;
  if (a.expect_size_given &&
      (!s.src->size_known || s.src->size != a.expect_size)) {
    /* Both front ends reach here: name copy's option and sparse_dd's.
     * Before --base's comparison, which reads both in full. */
    log_error("%s is %llu bytes, not the %llu expected (--expect-size, "
              "sparse_dd's -size): nothing copied", a.src,
              (unsigned long long)s.src->size,
              (unsigned long long)a.expect_size);
    goto out;
  }
  if (a.dst_size_given && s.src->size_known && s.src->size > a.dst_size) {
    /* Said before the destination is opened, and before --base reads. */
    log_error("%s is %llu bytes, more than the %llu DESTINATION holds "
              "(--dst-size, sparse_dd's -size): nothing copied", a.src,
              (unsigned long long)s.src->size,
              (unsigned long long)a.dst_size);
    goto out;
  }
  if (a.base) {
    /* DST holds BASE: only the blocks where SRC differs are sent, data
     * whole (a changed block of zeroes is written too), the rest skipped
     * as a destination that already reads right. */
    struct endpoint *delta;
    if (copy_dst_holds_nothing(&a)) {
      /* Only the blocks that differ would be written: nothing holds BASE
       * under them. Said before DST is opened (and created). */
      log_error("--base %s: DESTINATION %s %s, so it cannot already hold "
                "BASE", a.base, a.dst,
                copy_dst_is_new_image(&a) ? "is a new image written from "
                                            "scratch"
                                          : "is new, empty or a stream");
      goto out;
    }
    if (endpoint_open(&s.env, a.base, &so, &s.base, err, sizeof err) < 0) {
      log_error("--base: %s", err);
      goto out;
    }
    struct target bt;
    target_parse(a.base, false, &bt);
    if (endpoint_open_delta(&s.env, s.src, s.base,
                            bt.kind == TARGET_FILE ? bt.arg : NULL, &delta,
                            err, sizeof err) < 0) {
      log_error("%s", err);
      goto out;
    }
    s.src = delta;
    s.base = NULL; /* the delta's now */
    a.o.dst_is_zero = true;
    a.o.no_zero_detect = true;
    log_info("--base %s: %llu bytes differ (%s)", a.base,
             (unsigned long long)endpoint_delta_changed(delta),
             endpoint_delta_by_chain(delta)
                 ? "by the image chain: the base was not read"
                 : "compared block by block");
  }
  if (copy_space_check(&a, s.src) < 0)
    goto out;
  uint32_t alloc_block = copy_alloc_block(&a);
  uint64_t resumed_size = UINT64_MAX; /* DST's, from the journal */
  if (a.checkpoint &&
      copy_checkpoint_precheck(&a, &s, alloc_block, &resumed_size) < 0)
    goto out; /* before the scan of the source, and DST's open */
  if (alloc_block) {
    struct target dt;
    target_parse(a.dst, false, &dt);
    if (endpoint_image_out_check(a.dst, dt.kind == TARGET_FILE ? dt.arg
                                                               : NULL,
                                 copy_dst_format(&a), err, sizeof err) < 0) {
      log_error("%s", err); /* before the scan reads the whole source */
      goto out;
    }
  }
  if (alloc_block &&
      copy_alloc_scan(&a, &s, &alloc, copy_dst_format(&a), alloc_block) < 0)
    goto out;
  if (alloc_block && copy_image_space_check(&a, &alloc) < 0)
    goto out;
  struct endpoint_opts dopt = {
    .write = true, .connections = a.connections, .allocated = a.o.allocated,
    .shown = a.dst,
    .dense = a.o.no_zero_detect,
    .nagle = a.nagle, .split_writes = a.split_writes,
    .timeout_s = a.o.timeout_s,
    .retry = a.retry, .retry_delay_ms = a.retry_delay_ms,
    .retry_errors = a.retry_errors,
    /* A raw DST holds --dst-size when given (a pipe's input that is
     * longer then fails, copy_input_left), else the source's size; a
     * resumed copy's keeps the size its journal holds, which the
     * precheck found it has. */
    .create_size = resumed_size != UINT64_MAX          ? resumed_size
                 : a.dst_size_given && !alloc_block ? a.dst_size
                 : s.src->size_known                ? s.src->size
                                                    : UINT64_MAX,
    .format = a.dst_format,
    .format_given = a.dst_format != IMAGE_FORMAT_AUTO,
    .alloc = alloc.bits,
    .alloc_block = alloc.block,
    .protocol = a.dst_protocol,
    .nbd_export = a.nbd_export,
    .tls_certificates = a.tls_certificates,
    .no_tls_verify = a.no_tls_verify,
    .tls_chain_only = a.tls_chain_only,
    .tls_ca_file = a.tls_ca_file,
    .tls_server_name = a.tls_server_name,
    .tls_priority = a.tls_priority,
  };
  if (endpoint_open(&s.env, a.dst_open, &dopt, &s.dst, err, sizeof err) <
      0) {
    log_error("%s", err);
    goto out;
  }

  if (s.src->size_known && s.dst->size_known && s.dst->size < s.src->size) {
    log_error("%s (%llu bytes) is smaller than %s (%llu bytes)", a.dst,
              (unsigned long long)s.dst->size, a.src,
              (unsigned long long)s.src->size);
    goto out;
  }
  if (strcmp(s.dst->ops->kind, "chunked") == 0 &&
      (a.verify || a.o.no_flush)) {
    /* An http(s) DESTINATION whose answer asked for a Chunked body:
     * known only now. */
    copy_chunked_refusal(&a);
    rc = 2;
    goto out;
  }
  copy_per_connection(&a, s.src, s.dst);
  if (a.checkpoint && copy_checkpoint_open(&a, &s, alloc_block, &journal) < 0)
    goto out;
  if (a.verify && a.o.start && copy_hash_prefix(&a, &s, &chunks) < 0)
    goto out;
  if (a.verify)
    a.o.chunks = a.o.start ? &rest : &chunks;
  if (copy_run(&s.env, s.src, s.dst, &a.o, &st, err, sizeof err) < 0) {
    log_error("%s", err);
    goto out;
  }
  if (a.o.chunks == &rest && copy_chunks_join(&chunks, &rest) < 0)
    goto out;
  if (!s.src->size_known && s.dst->size_known &&
      copy_input_left(a.dst, s.dst->size) != 0)
    goto out;
  uint64_t size = st.total;
  copy_session_close(&s);
  s.env_ok = false;
  s.src = s.dst = NULL;
  s.loop = NULL;
  if (a.verify && copy_verify(&a, &chunks, size) != 0)
    goto out;
  if (a.json)
    copy_report_json(&a, &st, a.verify);
  if (a.o.progress == COPY_PROGRESS_FD) /* only now is all of it done */
    (void)dprintf(a.o.progress_fd, "100/100\n");
  rc = 0;
out:
  copy_peer_error = rc != 0 && (endpoint_peer_error(s.src) ||
                                endpoint_peer_error(s.dst) ||
                                endpoint_peer_error(s.base));
  copy_chunks_free(&chunks);
  copy_chunks_free(&rest);
  copy_session_close(&s);
  journal_free(journal);
  free(alloc.bits);
  free(dst_named);
  free(dst_shown);
  if (rc != 0 && copy_signal())
    cmd_die_by_signal(copy_signal()); /* so that a calling loop stops */
  return rc;
}
