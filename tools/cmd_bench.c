/* cmd_bench.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_bench(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
