/* cmd.h: the subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status. */
#ifndef NBDFLOW_CLI_CMD_H
#define NBDFLOW_CLI_CMD_H

#include <stdio.h>

#include "util/log.h"

int cmd_serve(int argc, char **argv);
int cmd_copy(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_sum(int argc, char **argv);

/* After getopt has named a bad option on stderr: where the help is, and
 * the exit status of a usage error. */
static inline int
cmd_usage_hint(const char *cmd)
{
  fprintf(stderr, "Try 'nbdflow %s --help'.\n", cmd);
  return 2;
}

/* A usage error in one line, what is wrong and where the help is; the
 * exit status of a usage error. */
static inline int
cmd_usage_error(const char *cmd, const char *what)
{
  log_error("%s: %s (see 'nbdflow %s --help')", cmd, what, cmd);
  return 2;
}

#endif
