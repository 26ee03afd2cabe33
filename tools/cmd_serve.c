/* cmd_serve.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_serve(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
int cmd_bench_server(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
