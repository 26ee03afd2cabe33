/* cmd_tokenize.c — placeholder until this subcommand lands. */
#include "cli.h"
int cmd_tokenize(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
int cmd_chat_template(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
int cmd_bench_tokenizer(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
