/* main.c: the subcommand table. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "util/log.h"
#include "proto/nbd_uri.h"

struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
};

static const struct command commands[] = {
  { "serve", cmd_serve, "serve files, memory or null exports over NBD" },
  { "copy", cmd_copy, "copy an image between files and NBD servers" },
  { "info", cmd_info, "show an export's size, flags and allocation map" },
  { "sum", cmd_sum, "checksum the whole content of an image" },
  { "sparse_dd", cmd_sparse_dd,
    "xapi's sparse_dd command line, run as a copy" },
};

static void
usage(FILE *f)
{
  fprintf(f, "Usage: nbdflow COMMAND [OPTIONS] ...\n\nCommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].help);
  fprintf(f, "\nRun 'nbdflow COMMAND --help' for a command's options.\n");
}

static int
run(int argc, char **argv)
{
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("nbdflow 0.1.0\n");
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name) != 0)
      continue;
    /* Every line the command prints, getopt's too (it names argv[0]),
     * starts "nbdflow COMMAND:". */
    static char prefix[32];
    snprintf(prefix, sizeof prefix, "nbdflow %s", commands[i].name);
    log_prefix = prefix;
    argv[1] = prefix;
    return commands[i].fn(argc - 1, argv + 1);
  }
  log_error("unknown command '%s'", argv[1]);
  usage(stderr);
  return 2;
}

int
cmd_check_uri(const char *spec)
{
  struct nbd_uri u;
  char err[256];
  if (!uri_is_uri(spec) || strncasecmp(spec, "nbd", 3) != 0)
    return 0;
  if (uri_parse(spec, &u, err, sizeof err) < 0) {
    log_error("%s", err); /* it names the URI */
    return -1;
  }
  uri_free(&u);
  return 0;
}

void
cmd_die_by_signal(int sig)
{
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  signal(sig, SIG_DFL);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  raise(sig);
  _exit(128 + sig); /* only if the signal could not end us */
}

/* A report or digest that could not be written (a full disk, a closed
 * pipe) is a failure, not a success with nothing to show. */
static int
stdout_close(void)
{
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout))
    return 0;
  log_error("writing to stdout: %s", strerror(errno ? errno : EIO));
  return -1;
}

int
main(int argc, char **argv)
{
  /* Descriptors 0 to 2 started closed would go to the first files we
   * open: log lines written "to stderr" would land in an export, a
   * progress line in a destination. They are held by /dev/null opened
   * the other way (stdin for writing, stdout and stderr for reading), so
   * that using one still fails with EBADF, as on a closed descriptor: an
   * image for a closed stdout is an error, not discarded. */
  for (int fd = 0; fd <= 2; fd++) /* in order: open takes the lowest */
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF &&
        open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY) != fd)
      return 1; /* nowhere to say it, and nothing safe to open */
  signal(SIGPIPE, SIG_IGN);
  /* A file size limit (ulimit -f) is an error of the write (EFBIG),
   * reported like a full disk, not a death without a word. */
  signal(SIGXFSZ, SIG_IGN);
  /* A write that fails in the middle leaves no errno to report at the
   * end (stdio keeps only a flag): a help or a report held whole until
   * the final flush fails there, naming its reason. */
  static char outbuf[1 << 16]; /* glibc sizes its own by st_blksize */
  if (!isatty(STDOUT_FILENO))
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
  int rc = run(argc, argv);
  /* A command that failed has said why already. */
  if (rc == 0 && stdout_close() < 0)
    rc = 1;
  return rc;
}
