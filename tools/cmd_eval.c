/* cmd_eval.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_eval(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
