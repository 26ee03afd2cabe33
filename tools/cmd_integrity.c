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

void cli_print_integrity(FILE *f, const kiln_kv_integrity_stats *st) {
    if (st->mode == KILN_KV_INTEGRITY_OFF) return;
    fprintf(f, "kv integrity: %s, %llu page checks (%.1f MB hashed), %llu detections", kiln_kv_integrity_name(st->mode),
            (unsigned long long)st->checks, (double)st->bytes_verified / 1e6, (unsigned long long)st->detections);
    if (st->detections)
        fprintf(f, " (content %llu, scale %llu, wrong page %llu, stale page %llu)", (unsigned long long)st->detected[0],
                (unsigned long long)st->detected[1], (unsigned long long)st->detected[2], (unsigned long long)st->detected[3]);
    fprintf(f, ", %llu heals (%llu positions recomputed)", (unsigned long long)st->heals, (unsigned long long)st->healed_positions);
    uint64_t inj = 0, det = 0, bu = 0;
    for (int k = 0; k < KILN_KV_FAULT_KINDS; k++) inj += st->injected[k], det += st->injected_detected[k], bu += st->detected_before_use[k];
    if (inj) fprintf(f, "; injected %llu, detected %llu, before use %llu, false alarms %llu", (unsigned long long)inj, (unsigned long long)det,
                     (unsigned long long)bu, (unsigned long long)st->false_alarms);
    fprintf(f, "\n");
}

int cmd_bench_integrity(int argc, char **argv) { (void)argc; return cli_fail_msg(argv[0], "not implemented yet"); }
