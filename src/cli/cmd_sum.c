/* cmd_sum.c: "nbdflow sum [--algo A] SRC": a digest of the whole image
 * content. Pieces are read in parallel and hashed in offset order; holes
 * are hashed as zeroes without being read. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cmd.h"
#include "copy/endpoint.h"
#include "copy/engine.h"
#include "format/image.h"
#include "net/loop.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/size.h"

static void
sum_usage(FILE *f)
{
  fprintf(f,
          "Usage: nbdflow sum [--algo ALGO] [--progress[=json]] "
          "[--connections N]\n"
          "                   [--timeout SECONDS] [-f FMT] "
          "[--ignore-checksums] SRC\n\n"
          "-f, --format FMT: raw, vhd, qcow2 or auto (files: auto, by the magic; a\n"
          "probed image never opens a parent); FMT:PATH too.\n"
          "An image's digest is its virtual disk's.\n"
          "Prints the digest of SRC's whole content, as the matching *sum\n"
          "tool prints it for the raw image. ALGO: %s\n"
          "(default xxh128, the fastest; sha256 equals sha256sum).\n"
          "--timeout: fail when an NBD server answers none of its requests\n"
          "in flight for this long (default %d, 0: wait forever); connecting\n"
          "and the handshake wait at most this, and 30 s at most.\n"
          "-h, --help: show this help.\n"
          "Exit status: 0 when the digest is printed; 1 on a failure (one\n"
          "line says why); 2 for a usage error; a SIGINT or SIGTERM ends it\n"
          "by that signal, after one line (a shell shows 130 or 143).\n",
          hash_names(), COPY_DEFAULT_TIMEOUT);
}

/* One line as sha256sum prints it: a name holding a backslash, a
 * newline or a carriage return is escaped and the line starts with a
 * backslash, so that "sha256sum -c" reads the name back. */
static void
sum_print(const char *hex, const char *name)
{
  bool esc = strpbrk(name, "\\\n\r") != NULL;
  printf("%s%s  ", esc ? "\\" : "", hex);
  for (const char *p = name; *p; p++) {
    if (!esc || (*p != '\\' && *p != '\n' && *p != '\r'))
      putchar(*p);
    else
      printf("\\%c", *p == '\\' ? '\\' : *p == '\n' ? 'n' : 'r');
  }
  putchar('\n');
}

int
cmd_sum(int argc, char **argv)
{
  static const struct option longopts[] = {
    { "algo", required_argument, NULL, 'a' },
    { "progress", optional_argument, NULL, 'p' },
    { "connections", required_argument, NULL, 'c' },
    { "timeout", required_argument, NULL, 'T' },
    { "format", required_argument, NULL, 'f' },
    { "ignore-checksums", no_argument, NULL, 'I' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  enum hash_algo algo = HASH_XXH128;
  enum image_format format = IMAGE_FORMAT_AUTO;
  bool ignore_checksums = false;
  struct copy_opts o = { .label = "sum",
                         .timeout_s = COPY_DEFAULT_TIMEOUT };
  unsigned conns = 0;
  uint64_t v;
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "hf:", longopts, NULL)) != -1) {
    switch (ch) {
    case 'f':
      if (image_format_parse(optarg, &format) < 0) {
        log_error("--format: raw, vhd, qcow2 or auto, not '%s'", optarg);
        return 2;
      }
      break;
    case 'I':
      ignore_checksums = true;
      break;
    case 'a':
      if (hash_parse(optarg, &algo) < 0) {
        log_error("--algo: unknown '%s' (known: %s)", optarg, hash_names());
        return 2;
      }
      break;
    case 'p':
      if (optarg != NULL && strcmp(optarg, "json") != 0) {
        log_error("--progress: expected nothing or =json, not '%s'", optarg);
        return 2;
      }
      o.progress = optarg ? COPY_PROGRESS_JSON : COPY_PROGRESS_BAR;
      break;
    case 'c':
      if (count_parse(optarg, 64, &v) < 0 || v == 0) {
        log_error("--connections: 1 to 64, not '%s'", optarg);
        return 2;
      }
      conns = (unsigned)v;
      break;
    case 'T':
      if (copy_timeout_parse(optarg, &o.timeout_s) < 0)
        return 2;
      break;
    case 'h':
      sum_usage(stdout);
      return 0;
    default:
      return cmd_usage_hint("sum");
    }
  }
  if (optind != argc - 1)
    return cmd_usage_error("sum", optind == argc ? "no SRC given"
                                                 : "one SRC only");
  const char *spec = argv[optind];
  if (cmd_check_uri(spec) < 0)
    return 2;
  int rc = 1;
  char err[512];
  struct endpoint_opts eo = { .connections = conns,
                              .timeout_s = o.timeout_s, .format = format,
                              .format_given = format != IMAGE_FORMAT_AUTO,
                              .ignore_checksums = ignore_checksums };
  if (endpoint_check(spec, &eo, err, sizeof err) < 0) {
    log_error("%s", err); /* what the command line alone shows */
    return 2;
  }
  struct hash_ctx h = { 0 };
  struct endpoint *src = NULL;
  struct ep_env env;
  bool env_ok = false;
  struct loop *loop = loop_new();
  if (loop == NULL || ep_env_init(&env, loop, 4) < 0) {
    log_error("cannot set up the event loop: %s", strerror(errno));
    goto out;
  }
  env_ok = true;
  if (endpoint_open(&env, spec, &eo, &src, err, sizeof err) < 0) {
    log_error("%s", err);
    goto out;
  }
  if (hash_init(&h, algo) < 0) {
    log_error("out of memory");
    goto out;
  }
  o.hash = &h;
  struct copy_stats st;
  if (copy_run(&env, src, NULL, &o, &st, err, sizeof err) < 0) {
    log_error("%s", err);
    goto out;
  }
  uint8_t d[HASH_MAX_DIGEST];
  char hex[2 * HASH_MAX_DIGEST + 1];
  hash_hex(d, hash_final(&h, d), hex);
  sum_print(hex, spec);
  rc = 0;
out:
  hash_discard(&h);
  if (env_ok)
    ep_env_fini(&env);
  endpoint_close(src);
  loop_free(loop);
  if (rc != 0 && copy_signal())
    cmd_die_by_signal(copy_signal());
  return rc;
}
