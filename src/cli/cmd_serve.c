/* cmd_serve.c: nbdflow serve [OPTIONS] [NAME=]TARGET... */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "net/sock.h"
#include "proto/nbd.h"
#include "server/server.h"
#include "util/log.h"
#include "util/size.h"

static void
serve_usage(FILE *f)
{
  fprintf(f,
"Usage: nbdflow serve [OPTIONS] [NAME=]TARGET...\n"
"\n"
"Serve each TARGET as an NBD export. TARGET is a file or block device,\n"
"memory:SIZE (a RAM disk, zeroed) or null:SIZE (reads zeroes, discards\n"
"writes). SIZE takes K, M, G, T suffixes (powers of 1024). A dynamic\n"
"VHD or a qcow2 is found by its magic and served as its virtual disk with\n"
"its holes (a VHD read-write, a qcow2 read-only); vhd:PATH or qcow2:PATH\n"
"names the format, which a fixed VHD and a chain need (a probed image\n"
"never opens a parent), and raw:PATH serves the file as it is. The first\n"
"export is also the default export (the empty name); an export without\n"
"NAME= is named by TARGET as written.\n"
"\n"
"Options:\n"
"  -l, --listen HOST[:PORT]   TCP address (default 127.0.0.1:10809; port\n"
"                             10809 if not given; IPv6 as [::1]:10809)\n"
"  -u, --unix PATH            listen on a Unix socket instead\n"
"      --http HOST:PORT       also take xapi's uploads over HTTP (HTTPS with\n"
"                             --tls-certs): PUT /import_raw_vdi?vdi=NAME\n"
"                             (a Chunked or raw body into export NAME) and\n"
"                             PUT /nbd/NAME (answered with Transfer-encoding:\n"
"                             nbd, then NBD on the same connection)\n"
"      --chunked-listen HOST:PORT\n"
"                             also take raw Chunked streams, one per\n"
"                             connection, into the default export\n"
"  -r, --read-only            serve every export read-only\n"
"      --ignore-checksums     serve images whose checksums are wrong\n"
"      --max-connections N    refuse connections beyond N (default: no limit)\n"
"      --max-inflight N       requests in flight per connection (default %d);\n"
"                             their data is held to %u MiB per connection\n"
"      --handshake-timeout S  drop clients that have not finished the\n"
"                             handshake within S seconds (default 10, 0: off)\n"
"      --body-timeout S       end an --http or --chunked-listen upload whose\n"
"                             body sends nothing for S seconds (default 120,\n"
"                             0: off)\n"
"      --threads N            worker threads for export I/O (default 8)\n"
"      --loops N              event-loop threads that read and answer\n"
"                             clients (default: one per CPU, at most %d)\n"
"  -D, --description TEXT     a description of the exports, sent to clients\n"
"                             that ask for it (nbdinfo shows it)\n"
"  -P, --pidfile FILE         write the pid to FILE once listening\n"
"      --zero-copy            send READ data by sendfile(2) to TCP peers on\n"
"                             this host too (default there: from buffers,\n"
"                             measured faster; elsewhere sendfile when the\n"
"                             file is in memory)\n"
"      --stats                sample TCP_INFO every 200 ms and log a summary\n"
"                             per connection when it closes (stall %%, bytes\n"
"                             per segment, RTT, delivery rate; the TLS\n"
"                             version, cipher and authentication)\n"
"      --tls=off|on|require   TLS: never (default); offered (clients choose);\n"
"                             required before any option but STARTTLS\n"
"      --tls-certs DIR        X.509: DIR/ca-cert.pem, server-cert.pem and\n"
"                             server-key.pem\n"
"      --tls-psk FILE         pre-shared keys, username:hexkey lines (psktool)\n"
"      --tls-verify-peer      demand a client certificate signed by the CA\n"
"  -v, --verbose              log every connection\n"
"  -q, --quiet                log errors only\n"
"  -h, --help                 show this help\n"
"\n"
"Sockets passed by a service manager (LISTEN_FDS) replace --listen.\n"
"SIGTERM/SIGINT: stop accepting, answer requests in flight (at most 5 s),\n"
"then exit; a second signal exits at once.\n"
"\n"
"Exit status: 0 after a stop by SIGTERM or SIGINT; 1 when an export\n"
"cannot be opened or the address cannot be listened on;\n"
"2 for a usage error (an unknown option, a bad value, no export).\n",
          SERVER_DEFAULT_INFLIGHT, SERVER_CONN_BUDGET >> 20, SERVER_MAX_LOOPS);
}

static int
serve_int(const char *opt, const char *arg, int min, int max, int *out)
{
  uint64_t v; /* digits only: no sign, space or suffix */
  if (count_parse(arg, (uint64_t)max, &v) < 0 || v < (uint64_t)min) {
    log_error("%s: \"%s\" is not a number from %d to %d", opt, arg, min,
              max);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int
serve_tls_mode(const char *arg, enum tls_mode *mode)
{
  if (strcmp(arg, "off") == 0)
    *mode = TLS_OFF;
  else if (strcmp(arg, "on") == 0)
    *mode = TLS_ON;
  else if (strcmp(arg, "require") == 0)
    *mode = TLS_REQUIRE;
  else {
    log_error("--tls: \"%s\" is not off, on or require", arg);
    return -1;
  }
  return 0;
}

/* An address that cannot be one is a usage error, said before any
 * export is opened; one that does not resolve is found by listening.
 * OPT names the option; DEFPORT is the port when none is given, or NULL
 * where one is required. An empty host would be every interface: that
 * is never the default, so it is written out (0.0.0.0, [::]). */
static int
serve_listen_check(const char *opt, const char *spec, const char *defport)
{
  char host[256], port[32], *end;
  if (sock_split_hostport(spec, host, port, defport ? defport : "") < 0 ||
      port[0] == '\0') {
    log_error("bad %s address \"%s\": want HOST:PORT or [IPV6]:PORT%s", opt,
              spec, defport ? ", or HOST" : "");
    return -1;
  }
  if (host[0] == '\0') {
    log_error("bad %s address \"%s\": no host (127.0.0.1 for this machine "
              "alone; 0.0.0.0 or [::] for every interface)", opt, spec);
    return -1;
  }
  unsigned long pn = strtoul(port, &end, 10);
  if (port[0] < '0' || port[0] > '9' || *end || pn > 65535) {
    log_error("bad %s address \"%s\": the port must be a number from 0 to "
              "65535 (0: any free port)", opt, spec);
    return -1;
  }
  return 0;
}

/* The export arguments, before any is opened: each well formed, no
 * name twice (a client could reach only the first). */
static int
serve_exports_check(char **args, int n)
{
  char err[512];
  char(*names)[NBD_MAX_STRING + 1] = calloc((size_t)n, sizeof *names);
  if (names == NULL) {
    log_error("out of memory");
    return -1;
  }
  int r = 0;
  for (int i = 0; i < n && r == 0; i++) {
    r = export_check(args[i], names[i], sizeof names[i], err, sizeof err);
    if (r < 0)
      log_error("%s", err);
    for (int j = 0; j < i && r == 0; j++)
      if (strcmp(names[j], names[i]) == 0) {
        log_error("export name \"%s\" given twice", names[i]);
        r = -1;
      }
  }
  free(names);
  return r;
}

/* Credentials without TLS, or TLS without credentials, are mistakes the
 * user should hear about before a client does. */
static int
serve_tls_check(const struct server_config *cfg)
{
  bool creds = cfg->tls.certs_dir || cfg->tls.psk_file;
  if (cfg->tls_mode != TLS_OFF && !creds) {
    log_error("--tls=%s needs --tls-certs DIR or --tls-psk FILE",
              cfg->tls_mode == TLS_ON ? "on" : "require");
    return -1;
  }
  if (cfg->tls_mode == TLS_OFF && (creds || cfg->tls.verify_peer)) {
    log_error("TLS credentials or --tls-verify-peer given, but TLS is "
              "off: add --tls=on or --tls=require");
    return -1;
  }
  if (cfg->tls_mode == TLS_REQUIRE && cfg->chunked_listen) {
    /* Raw Chunked has no TLS of its own (vhd-tool's neither): it would
     * be the one unauthenticated way to write. */
    log_error("--chunked-listen takes plain Chunked streams, which "
              "--tls=require would not cover: use --http (HTTPS with TLS) "
              "or --tls=on");
    return -1;
  }
  if (cfg->tls.verify_peer && cfg->tls.certs_dir == NULL) {
    log_error("--tls-verify-peer checks X.509 client certificates: it "
              "needs --tls-certs DIR");
    return -1;
  }
  return 0;
}

int
cmd_serve(int argc, char **argv)
{
  enum { OPT_MAXCONN = 256, OPT_INFLIGHT, OPT_HSTIMEOUT, OPT_BODY_TIMEOUT,
         OPT_THREADS, OPT_LOOPS, OPT_STATS, OPT_TLS, OPT_TLS_CERTS,
         OPT_TLS_PSK, OPT_TLS_VERIFY,
         OPT_IGNORE_CHECKSUMS, OPT_HTTP, OPT_CHUNKED_LISTEN, OPT_ZERO_COPY };
  static const struct option opts[] = {
    { "listen", required_argument, NULL, 'l' },
    { "unix", required_argument, NULL, 'u' },
    { "read-only", no_argument, NULL, 'r' },
    { "ignore-checksums", no_argument, NULL, OPT_IGNORE_CHECKSUMS },
    { "http", required_argument, NULL, OPT_HTTP },
    { "chunked-listen", required_argument, NULL, OPT_CHUNKED_LISTEN },
    { "max-connections", required_argument, NULL, OPT_MAXCONN },
    { "max-inflight", required_argument, NULL, OPT_INFLIGHT },
    { "handshake-timeout", required_argument, NULL, OPT_HSTIMEOUT },
    { "body-timeout", required_argument, NULL, OPT_BODY_TIMEOUT },
    { "threads", required_argument, NULL, OPT_THREADS },
    { "loops", required_argument, NULL, OPT_LOOPS },
    { "description", required_argument, NULL, 'D' },
    { "pidfile", required_argument, NULL, 'P' },
    { "stats", no_argument, NULL, OPT_STATS },
    { "zero-copy", no_argument, NULL, OPT_ZERO_COPY },
    { "tls", required_argument, NULL, OPT_TLS },
    { "tls-certs", required_argument, NULL, OPT_TLS_CERTS },
    { "tls-psk", required_argument, NULL, OPT_TLS_PSK },
    { "tls-verify-peer", no_argument, NULL, OPT_TLS_VERIFY },
    { "verbose", no_argument, NULL, 'v' },
    { "quiet", no_argument, NULL, 'q' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  struct server_config cfg = {
    .max_inflight = SERVER_DEFAULT_INFLIGHT,
    .handshake_timeout = 10,
    .body_timeout = 120,
    .threads = 8,
  };
  int c, r = 0;

  optind = 1;
  while ((c = getopt_long(argc, argv, "l:u:rD:P:vqh", opts, NULL)) != -1) {
    switch (c) {
    case 'l':
      cfg.listen = optarg;
      break;
    case 'u':
      cfg.unix_path = optarg;
      break;
    case 'r':
      cfg.read_only = true;
      break;
    case OPT_HTTP:
      cfg.http_listen = optarg;
      break;
    case OPT_CHUNKED_LISTEN:
      cfg.chunked_listen = optarg;
      break;
    case OPT_IGNORE_CHECKSUMS:
      cfg.ignore_checksums = true;
      break;
    case OPT_MAXCONN:
      r = serve_int("--max-connections", optarg, 1, 1 << 20,
                    &cfg.max_connections);
      break;
    case OPT_INFLIGHT:
      r = serve_int("--max-inflight", optarg, 1, 4096, &cfg.max_inflight);
      break;
    case OPT_HSTIMEOUT:
      r = serve_int("--handshake-timeout", optarg, 0, 86400,
                    &cfg.handshake_timeout);
      break;
    case OPT_BODY_TIMEOUT:
      r = serve_int("--body-timeout", optarg, 0, 86400, &cfg.body_timeout);
      break;
    case OPT_THREADS:
      r = serve_int("--threads", optarg, 1, 256, &cfg.threads);
      break;
    case OPT_LOOPS:
      r = serve_int("--loops", optarg, 1, SERVER_MAX_LOOPS, &cfg.loops);
      break;
    case 'D':
      if (strlen(optarg) > NBD_MAX_STRING) {
        log_error("--description: longer than %d bytes", NBD_MAX_STRING);
        r = -1;
      }
      cfg.description = optarg;
      break;
    case 'P':
      cfg.pidfile = optarg;
      break;
    case OPT_STATS:
      cfg.stats = true;
      break;
    case OPT_ZERO_COPY:
      cfg.zero_copy = true;
      break;
    case OPT_TLS:
      r = serve_tls_mode(optarg, &cfg.tls_mode);
      break;
    case OPT_TLS_CERTS:
      cfg.tls.certs_dir = optarg;
      break;
    case OPT_TLS_PSK:
      cfg.tls.psk_file = optarg;
      break;
    case OPT_TLS_VERIFY:
      cfg.tls.verify_peer = true;
      break;
    case 'v':
      log_threshold = LOG_DEBUG;
      break;
    case 'q':
      log_threshold = LOG_ERROR;
      break;
    case 'h':
      serve_usage(stdout);
      return 0;
    default:
      return cmd_usage_hint("serve");
    }
    if (r < 0)
      return 2;
  }
  if (optind >= argc)
    return cmd_usage_error("serve", "no export given");
  if (cfg.listen && cfg.unix_path) {
    log_error("--listen and --unix exclude each other");
    return 2;
  }
  if ((cfg.listen && serve_listen_check("--listen", cfg.listen, "10809") <
                         0) ||
      (cfg.http_listen &&
       serve_listen_check("--http", cfg.http_listen, NULL) < 0) ||
      (cfg.chunked_listen &&
       serve_listen_check("--chunked-listen", cfg.chunked_listen, NULL) < 0))
    return 2;
  if (cfg.unix_path && cfg.unix_path[0] == '\0') {
    log_error("--unix: an empty path");
    return 2;
  }
  if (serve_tls_check(&cfg) < 0)
    return 2;
  if (serve_exports_check(argv + optind, argc - optind) < 0)
    return 2;
  return server_run(&cfg, argv + optind, argc - optind);
}
