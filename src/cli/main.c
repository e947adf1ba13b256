/* main.c: the subcommand table. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cmd.h"
#include "util/log.h"

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
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0)
      return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "nbdflow: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
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
  signal(SIGPIPE, SIG_IGN);
  int rc = run(argc, argv);
  /* A command that failed has said why already. */
  if (rc == 0 && stdout_close() < 0)
    rc = 1;
  return rc;
}
