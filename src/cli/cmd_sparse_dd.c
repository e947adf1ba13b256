/* cmd_sparse_dd.c: xapi's sparse_dd command line, run as a copy.
 *
 * xapi starts sparse_dd for storage migration and VDI copies as
 *   sparse_dd -machine -src SRC -dest DEST -size BYTES [-prezeroed]
 *     [-base BASE] [-dest-proto nbd|chunked|none] [-nbd-export NAME]
 *     [-good-ciphersuites S] [-legacy-ciphersuites S] [-ssl-legacy]
 *     [-encryption-mode always|never|user]
 * and reads its progress from stdout: with -machine, Chunked frames whose
 * payload is "Progress: N", closed by the end header. Exit status 5 says
 * that the NBD server answered with an error; any other failure is 1
 * (usage errors 2).
 *
 * Each option becomes the copy option that does the same (docs/copy.md
 * has the table); the progress comes from copy's --progress=FD lines
 * ("N/100") through a pipe, turned into frames by a thread. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "proto/chunked.h"
#include "util/size.h"

#define SPARSE_DD_NBD_ERROR 5

static void
sparse_dd_usage(FILE *f)
{
  fprintf(f,
"Usage: nbdflow sparse_dd -src SRC -dest DEST -size BYTES [-machine]\n"
"         [-prezeroed] [-base BASE] [-dest-proto nbd|chunked|none]\n"
"         [-nbd-export NAME] [-encryption-mode always|never|user]\n"
"         [-good-ciphersuites S] [-legacy-ciphersuites S] [-ssl-legacy]\n"
"\n"
"xapi's sparse_dd command line, run as 'nbdflow copy':\n"
"  -src SRC            a file, block device or NBD URI\n"
"  -dest DEST          a file (or file://PATH), an NBD URI, or an http(s)\n"
"                      URL (a PUT, then NBD or Chunked as the answer says)\n"
"  -size BYTES         the size to copy: must be the source's\n"
"  -prezeroed          the destination reads as zeroes: skip zero ranges\n"
"                      (copy --target-is-zero)\n"
"  -dest-proto P       nbd or chunked (copy --dst-protocol); none: the raw\n"
"                      bytes, into a file only\n"
"  -nbd-export NAME    the export an NBD destination asks for\n"
"  -encryption-mode M  always: http becomes https; never: https becomes\n"
"                      http; user (the default): as written\n"
"  -machine            progress on stdout as Chunked frames 'Progress: N'\n"
"  -good-ciphersuites, -legacy-ciphersuites, -ssl-legacy: accepted; TLS\n"
"                      uses GnuTLS's default priority (docs/copy.md)\n"
"  -base BASE          the destination holds BASE: send only the blocks\n"
"                      where SRC differs (copy --base)\n"
"\n"
"Exit status: 0 copied; 5 the NBD server answered with an error; 2 usage\n"
"error; 1 any other failure.\n");
}

struct progress_relay {
  int rfd;
  bool machine;
  bool tty;     /* without -machine: a percentage on a terminal only */
};

/* Writes one frame of progress (or the end header when text is NULL). */
static void
sparse_dd_frame(const char *text)
{
  uint8_t hdr[CHUNKED_HEADER_LEN];
  size_t n = text ? strlen(text) : 0;
  chunked_put(hdr, 0, (uint32_t)n);
  fwrite(hdr, 1, sizeof hdr, stdout);
  if (n)
    fwrite(text, 1, n, stdout);
  fflush(stdout);
}

static void *
sparse_dd_relay(void *arg)
{
  struct progress_relay *pr = arg;
  FILE *f = fdopen(pr->rfd, "r");
  char line[64];
  int last = -1;
  while (f && fgets(line, sizeof line, f)) {
    int pct;
    if (sscanf(line, "%d/100", &pct) != 1 || pct == last)
      continue;
    last = pct;
    if (pr->machine) {
      char text[32];
      snprintf(text, sizeof text, "Progress: %d", pct);
      sparse_dd_frame(text);
    } else if (pr->tty) {
      fprintf(stderr, "\r%3d%%", pct);
    }
  }
  if (f)
    fclose(f);
  if (pr->machine)
    sparse_dd_frame(NULL);
  else if (last >= 0 && pr->tty)
    fprintf(stderr, "\n");
  return NULL;
}

/* "file://PATH" is a path; http(s) follows -encryption-mode. Returns a
 * string to free, or NULL after a message. */
static char *
sparse_dd_dest(const char *d, const char *mode)
{
  if (strncmp(d, "file://", 7) == 0)
    return strdup(d + 7);
  bool http = strncmp(d, "http://", 7) == 0;
  bool https = strncmp(d, "https://", 8) == 0;
  char *out = NULL;
  if (strcmp(mode, "always") == 0 && http) {
    if (asprintf(&out, "https://%s", d + 7) < 0)
      out = NULL;
  } else if (strcmp(mode, "never") == 0 && https) {
    if (asprintf(&out, "http://%s", d + 8) < 0)
      out = NULL;
  } else {
    out = strdup(d);
  }
  return out;
}

int
cmd_sparse_dd(int argc, char **argv)
{
  const char *src = NULL, *dest = NULL, *size_s = NULL, *proto = NULL;
  const char *export_name = NULL, *mode = "user", *base = NULL;
  bool machine = false, prezeroed = false;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    bool has_arg = i + 1 < argc;
    if (strcmp(o, "-help") == 0 || strcmp(o, "--help") == 0 ||
        strcmp(o, "-h") == 0) {
      sparse_dd_usage(stdout);
      return 0;
    } else if (strcmp(o, "-machine") == 0) {
      machine = true;
    } else if (strcmp(o, "-prezeroed") == 0) {
      prezeroed = true;
    } else if (strcmp(o, "-ssl-legacy") == 0) {
      /* GnuTLS's default priority decides (docs/copy.md). */
    } else if (!has_arg &&
               (strcmp(o, "-src") == 0 || strcmp(o, "-dest") == 0 ||
                strcmp(o, "-size") == 0 || strcmp(o, "-base") == 0 ||
                strcmp(o, "-dest-proto") == 0 ||
                strcmp(o, "-nbd-export") == 0 ||
                strcmp(o, "-encryption-mode") == 0 ||
                strcmp(o, "-good-ciphersuites") == 0 ||
                strcmp(o, "-legacy-ciphersuites") == 0)) {
      char what[96];
      snprintf(what, sizeof what, "%s needs a value", o);
      return cmd_usage_error("sparse_dd", what);
    } else if (strcmp(o, "-src") == 0) {
      src = argv[++i];
    } else if (strcmp(o, "-dest") == 0) {
      dest = argv[++i];
    } else if (strcmp(o, "-size") == 0) {
      size_s = argv[++i];
    } else if (strcmp(o, "-base") == 0) {
      base = argv[++i];
    } else if (strcmp(o, "-dest-proto") == 0) {
      proto = argv[++i];
    } else if (strcmp(o, "-nbd-export") == 0) {
      export_name = argv[++i];
    } else if (strcmp(o, "-encryption-mode") == 0) {
      mode = argv[++i];
    } else if (strcmp(o, "-good-ciphersuites") == 0 ||
               strcmp(o, "-legacy-ciphersuites") == 0) {
      i++; /* OpenSSL syntax: GnuTLS's default priority decides */
    } else {
      char what[160];
      snprintf(what, sizeof what, "unknown option '%.100s'", o);
      return cmd_usage_error("sparse_dd", what);
    }
  }
  if (src == NULL || dest == NULL || size_s == NULL)
    return cmd_usage_error("sparse_dd", "-src, -dest and -size are needed");
  uint64_t size;
  if (size_parse(size_s, &size) < 0)
    return cmd_usage_error("sparse_dd", "-size: a number of bytes");
  if (strcmp(mode, "always") != 0 && strcmp(mode, "never") != 0 &&
      strcmp(mode, "user") != 0)
    return cmd_usage_error("sparse_dd", "-encryption-mode: always, never "
                           "or user");
  const char *dst_proto = "auto";
  if (proto && strcmp(proto, "nbd") == 0)
    dst_proto = "nbd";
  else if (proto && strcmp(proto, "chunked") == 0)
    dst_proto = "chunked";
  else if (proto && strcmp(proto, "none") != 0)
    return cmd_usage_error("sparse_dd", "-dest-proto: nbd, chunked or none");
  char *d = sparse_dd_dest(dest, mode);
  if (d == NULL) {
    log_error("out of memory");
    return 1;
  }
  if (proto && strcmp(proto, "none") == 0 &&
      (strstr(d, "://") != NULL)) {
    log_error("%s: -dest-proto none sends raw bytes, to a file only", d);
    free(d);
    return 2;
  }
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) < 0) {
    log_error("pipe: %s", strerror(errno));
    free(d);
    return 1;
  }
  struct progress_relay pr = { .rfd = pfd[0], .machine = machine,
                               .tty = isatty(STDERR_FILENO) };
  pthread_t t;
  if (pthread_create(&t, NULL, sparse_dd_relay, &pr) != 0) {
    log_error("cannot start the progress thread");
    close(pfd[0]);
    close(pfd[1]);
    free(d);
    return 1;
  }
  char progress[32], proto_opt[32], export_opt[300], size_opt[40];
  char *base_opt = NULL;
  snprintf(progress, sizeof progress, "--progress=%d", pfd[1]);
  snprintf(proto_opt, sizeof proto_opt, "--dst-protocol=%s", dst_proto);
  snprintf(size_opt, sizeof size_opt, "--expect-size=%llu",
           (unsigned long long)size);
  char *cargv[16];
  int cargc = 0;
  cargv[cargc++] = "copy";
  cargv[cargc++] = progress;
  cargv[cargc++] = proto_opt;
  cargv[cargc++] = size_opt;
  if (prezeroed)
    cargv[cargc++] = "--target-is-zero";
  if (base) {
    if (asprintf(&base_opt, "--base=%s", base) < 0) {
      log_error("out of memory");
      close(pfd[1]);
      pthread_join(t, NULL);
      free(d);
      return 1;
    }
    cargv[cargc++] = base_opt;
  }
  if (export_name) {
    snprintf(export_opt, sizeof export_opt, "--nbd-export=%s", export_name);
    cargv[cargc++] = export_opt;
  }
  cargv[cargc++] = "--";
  cargv[cargc++] = (char *)src;
  cargv[cargc++] = d;
  cargv[cargc] = NULL;
  int rc = cmd_copy(cargc, cargv);
  close(pfd[1]);
  pthread_join(t, NULL);
  free(d);
  free(base_opt);
  if (rc != 0 && rc != 2 && copy_peer_error)
    return SPARSE_DD_NBD_ERROR;
  return rc;
}
