/* cmd_integrity.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_bench_integrity(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
int cmd_verify(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
