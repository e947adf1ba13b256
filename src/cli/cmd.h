/* cmd.h: the subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status. */
#ifndef NBDFLOW_CLI_CMD_H
#define NBDFLOW_CLI_CMD_H

#include <stdbool.h>
#include <stdio.h>

#include "util/log.h"

int cmd_serve(int argc, char **argv);
int cmd_copy(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_sum(int argc, char **argv);
int cmd_sparse_dd(int argc, char **argv);

/* After cmd_copy failed: a peer answered a request with an error (an NBD
 * error reply), rather than the copy failing otherwise. */
extern bool copy_peer_error;

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
  log_error("%s (see 'nbdflow %s --help')", what, cmd);
  return 2;
}

/* A malformed NBD URI among a command's names is a usage error, said
 * before anything is opened (the same line opening it would print).
 * Returns 0, or -1 after the line. Names that are not NBD URIs pass. */
int cmd_check_uri(const char *spec);

/* Ends the process by sig, after the command that caught it has cleaned
 * up: the caller sees death by the signal, not an exit status that
 * looks like it, so that a shell running commands in a loop stops at a
 * SIGINT as it does for any other program. Does not return. */
void cmd_die_by_signal(int sig) __attribute__((noreturn));

#endif
