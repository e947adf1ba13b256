/* cmd_serve.c: placeholder until the server lands. */
#include <stdio.h>

#include "cli/cmd.h"

int
cmd_serve(int argc, char **argv)
{
  (void)argc;
  (void)argv;
  fprintf(stderr, "nbdflow: 'serve' is not implemented yet\n");
  return 2;
}
