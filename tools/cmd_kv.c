/* cmd_kv.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_calibrate(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
int cmd_inspect_kv(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
