/* cmd_quantize.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_quantize(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
