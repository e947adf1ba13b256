/* cmd.h: the subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status. */
#ifndef NBDFLOW_CLI_CMD_H
#define NBDFLOW_CLI_CMD_H

int cmd_serve(int argc, char **argv);
int cmd_copy(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_sum(int argc, char **argv);

#endif
