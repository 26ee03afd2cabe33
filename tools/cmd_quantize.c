/* cmd_quantize.c — `kiln quantize IN OUT --weights fp8|int4 [--group 32|128] [--scope all|mlp|experts]`. */
#include "kiln_test.h"
#include "cli.h"
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cmd_quantize(int argc, char **argv) {
    args_t a = {argc, argv, 0, "quantize", 0};
    const char *in = NULL, *out = NULL, *weights = NULL, *scope = "all";
    long group = 32;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "--group") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &group);
        else if (strcmp(k, "--scope") == 0) scope = cli_value(&a);
        else if (k[0] == '-') { fprintf(stderr, "kiln quantize: error: unknown option '%s'\n", k); return 2; }
        else if (!in) in = k;
        else if (!out) out = k;
        else { fprintf(stderr, "kiln quantize: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!in || !out || !weights)
        return cli_fail_msg("quantize", "usage: kiln quantize IN OUT --weights fp8|int4 [--group 32|128] [--scope all|mlp|experts]");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(in, &o, &m);
    if (st) return cli_fail_status("quantize", st);
    double t0 = kiln_now();
    st = kiln_model_quantize_save(m, out, weights, (int)group, scope, isatty(2));
    kiln_model_free(m);
    if (st) return cli_fail_status("quantize", st);
    fprintf(stderr, "wrote %s (%s%s, scope %s) in %.1f s\n", out, weights, strcmp(weights, "int4") == 0 ? (group == 32 ? " g32" : " g128") : "",
            scope, kiln_now() - t0);
    return 0;
}
