/* cmd_pending.c: subcommands whose implementation has not landed yet.
 * Each says so and fails; it never pretends to work. */
#include <stdio.h>

#include "cli/cmd.h"

static int
pending(const char *name)
{
  fprintf(stderr, "nbdflow: '%s' is not implemented yet\n", name);
  return 2;
}

int
cmd_copy(int argc, char **argv)
{
  (void)argc;
  (void)argv;
  return pending("copy");
}

int
cmd_info(int argc, char **argv)
{
  (void)argc;
  (void)argv;
  return pending("info");
}

int
cmd_sum(int argc, char **argv)
{
  (void)argc;
  (void)argv;
  return pending("sum");
}
