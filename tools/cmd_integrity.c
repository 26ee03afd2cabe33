/* cmd_integrity.c — `kiln verify MODEL [--write]` (weight checksums against the manifest) and
 * `kiln bench --integrity` (KV integrity cost and detection campaign; lands with the KV seals). */
#include "cli.h"
#include <stdio.h>
#include <string.h>

int cmd_verify(int argc, char **argv) {
    const char *path = NULL;
    int write = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--write") == 0) write = 1;
        else if (argv[i][0] == '-') { fprintf(stderr, "kiln verify: error: unknown option '%s'\n", argv[i]); return 2; }
        else path = argv[i];
    }
    if (!path) return cli_fail_msg("verify", "usage: kiln verify MODEL [--write]");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(path, &o, &m);
    if (st) return cli_fail_status("verify", st);
    int bad = 0;
    st = kiln_model_verify(m, write, stdout, &bad);
    kiln_model_free(m);
    if (st) return cli_fail_status("verify", st);
    if (bad) { fprintf(stderr, "kiln verify: error: %d tensors do not match the manifest\n", bad); return 1; }
    return 0;
}

int cmd_bench_integrity(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
