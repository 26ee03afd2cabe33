/* cli.c — argument parsing and error printing shared by every kiln subcommand. */
#include "cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_fail_status(const char *what, kiln_status st) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln %s: error: %s%s%s\n", what, kiln_status_name(st), *msg ? ": " : "", msg);
    return 1;
}
int cli_fail_msg(const char *what, const char *msg) {
    fprintf(stderr, "kiln %s: error: %s\n", what, msg);
    return 2;
}

/* ---- argument helpers --------------------------------------------------------------------------- */
const char *cli_value(args_t *a) {
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "kiln %s: error: option %s needs a value\n", a->cmd, a->argv[a->i]);
        a->bad = 1;
        return NULL;
    }
    return a->argv[++a->i];
}

int cli_long(args_t *a, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "kiln %s: error: option %s: '%s' is not an integer in [%ld, %ld]\n", a->cmd, opt, s ? s : "", lo, hi);
        a->bad = 1;
        return 0;
    }
    *out = v;
    return 1;
}

int cli_float(args_t *a, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kiln %s: error: option %s: '%s' is not a number in [%g, %g]\n", a->cmd, opt, s ? s : "", lo, hi);
        a->bad = 1;
        return 0;
    }
    *out = v;
    return 1;
}

/* "512M", "2G", "1048576", "40%" (of available RAM). */
int cli_mem(args_t *a, const char *s, int64_t *out) {
    char *end;
    double v = s ? strtod(s, &end) : -1;
    if (!s || end == s || v <= 0) goto bad;
    double mul = 1;
    if (*end == '%') {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (v > 100 || end[1]) goto bad;
        *out = (int64_t)((double)pages * (double)psz * v / 100.0);
        return 1;
    }
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    default: goto bad;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b') end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
    if (*end) goto bad;
    *out = (int64_t)(v * mul);
    return 1;
bad:
    fprintf(stderr, "kiln %s: error: option --kv-mem: '%s' is not a size like 512M, 2G or 40%%\n", a->cmd, s ? s : "");
    a->bad = 1;
    return 0;
}

/* Options shared by every command that builds a session. Returns 1 if argv[a->i] was consumed. */
int cli_common_option(args_t *a, kiln_options *o) {
    const char *k = a->argv[a->i];
    long v;
    if (strcmp(k, "--no-repack") == 0) { o->no_repack = 1; return 1; }
    if (strcmp(k, "--threads") == 0) { if (cli_long(a, k, cli_value(a), 0, 1024, &v)) o->threads = (int)v; return 1; }
    if (strcmp(k, "--kv-mem") == 0) { cli_mem(a, cli_value(a), &o->kv_mem_bytes); return 1; }
    if (strcmp(k, "--kv-page") == 0) { if (cli_long(a, k, cli_value(a), 1, 4096, &v)) o->kv_page_tokens = (int)v; return 1; }
    if (strcmp(k, "--ctx") == 0) { if (cli_long(a, k, cli_value(a), 1, 1 << 24, &v)) o->max_context = (int)v; return 1; }
    if (strcmp(k, "--kv-dtype") == 0) {
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "auto") == 0) o->kv_dtype = KILN_KV_AUTO;
        else if (strcmp(s, "f32") == 0) o->kv_dtype = KILN_KV_F32;
        else if (strcmp(s, "bf16") == 0) o->kv_dtype = KILN_KV_BF16;
        else if (strcmp(s, "fp8") == 0) o->kv_dtype = KILN_KV_FP8;
        else { fprintf(stderr, "kiln %s: error: option --kv-dtype: '%s' is not one of auto, f32, bf16, fp8\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    /* KV cache scales (issue 4; docs/KV.md) */
    if (strcmp(k, "--kv-scale") == 0) {
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "static") == 0) o->kv_scale_mode = KILN_KV_SCALE_STATIC;
        else if (strcmp(s, "dynamic") == 0) o->kv_scale_mode = KILN_KV_SCALE_DYNAMIC;
        else { fprintf(stderr, "kiln %s: error: option --kv-scale: '%s' is not one of static, dynamic\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--kv-scales") == 0) { o->kv_scales_path = cli_value(a); return 1; }
    if (strcmp(k, "--kv-smooth") == 0) {
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "post") == 0) o->kv_smooth = KILN_KV_SMOOTH_DEFAULT;
        else if (strcmp(s, "prerope") == 0) o->kv_smooth = KILN_KV_SMOOTH_PREROPE;
        else if (strcmp(s, "off") == 0) o->kv_smooth = KILN_KV_SMOOTH_OFF;
        else { fprintf(stderr, "kiln %s: error: option --kv-smooth: '%s' is not one of post, prerope, off\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    /* KV integrity (issue 5; docs/INTEGRITY.md) */
    if (strcmp(k, "--kv-integrity") == 0) {
        const char *s = cli_value(a);
        if (s && kiln_kv_integrity_parse(s, &o->kv_integrity) != KILN_OK) {
            fprintf(stderr, "kiln %s: error: option --kv-integrity: '%s' is not one of off, detect, heal, strict\n", a->cmd, s);
            a->bad = 1;
        }
        return 1;
    }
    if (strcmp(k, "--inject-kv-faults") == 0) { o->kv_inject_faults = cli_value(a); return 1; }
    if (strcmp(k, "--isa") == 0) {
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "auto") == 0) o->isa = KILN_ISA_AUTO;
        else if (strcmp(s, "scalar") == 0) o->isa = KILN_ISA_SCALAR;
        else if (strcmp(s, "avx2") == 0) o->isa = KILN_ISA_AVX2;
        else if (strcmp(s, "avx512") == 0) o->isa = KILN_ISA_AVX512;
        else { fprintf(stderr, "kiln %s: error: option --isa: '%s' is not one of auto, scalar, avx2, avx512\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--backend") == 0) { /* compute backend (src/backend/backend.h) */
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "cpu") == 0) o->backend = KILN_BACKEND_CPU;
        else if (strcmp(s, "ref") == 0) o->backend = KILN_BACKEND_REF;
        else if (strcmp(s, "vulkan") == 0) o->backend = KILN_BACKEND_VULKAN;
        else { fprintf(stderr, "kiln %s: error: option --backend: '%s' is not one of cpu, ref, vulkan\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--device") == 0) { /* cpu | ref | vulkan[:N] (kiln inspect --devices lists N) */
        const char *s = cli_value(a);
        if (!s) return 1;
        char *end = NULL;
        if (strcmp(s, "cpu") == 0) o->backend = KILN_BACKEND_CPU;
        else if (strcmp(s, "ref") == 0) o->backend = KILN_BACKEND_REF;
        else if (strcmp(s, "vulkan") == 0) { o->backend = KILN_BACKEND_VULKAN; o->device_index = 0; }
        else if (strncmp(s, "vulkan:", 7) == 0 && s[7] >= '0' && s[7] <= '9' && (o->device_index = (int)strtol(s + 7, &end, 10), *end == 0) &&
                 o->device_index < 1000)
            o->backend = KILN_BACKEND_VULKAN;
        else { fprintf(stderr, "kiln %s: error: option --device: '%s' is not one of cpu, ref, vulkan, vulkan:N\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--fp8-gemv") == 0) { /* FP8 weight GEMV form (kernels/gemv.h: kiln_kctx) */
        const char *s = cli_value(a);
        if (!s) return 1;
        if (strcmp(s, "auto") == 0) o->fp8_gemv = 0;
        else if (strcmp(s, "exact") == 0) o->fp8_gemv = 1;
        else if (strcmp(s, "bf16") == 0) o->fp8_gemv = 2;
        else { fprintf(stderr, "kiln %s: error: option --fp8-gemv: '%s' is not one of auto, exact, bf16\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    return 0;
}

/* "1,2,3" → ids. */
int cli_ids(args_t *a, const char *s, int32_t **ids, int *n) {
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (p && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kiln %s: error: option --tokens: '%s' is not a comma-separated list of token ids\n", a->cmd, s);
            free(v);
            a->bad = 1;
            return 0;
        }
        if (k == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) { free(v); fprintf(stderr, "kiln %s: error: option --tokens: empty list\n", a->cmd); a->bad = 1; return 0; }
    *ids = v;
    *n = k;
    return 1;
}


int cli_tp_load(const char *cmd, int *argc, char ***argv, long tp, long ep, const char *model_path, kiln_options *o, kiln_model **m, int *rank) {
    kiln_status st = kiln_dist_init(argc, argv);
    if (st) return cli_fail_status(cmd, st);
    *rank = kiln_dist_rank();
    if (kiln_dist_size() != tp) {
        if (*rank == 0) fprintf(stderr, "kiln %s: error: --tp %ld needs %ld processes: start it with mpirun -np %ld (got %d)\n", cmd, tp, tp, tp, kiln_dist_size());
        kiln_dist_abort(2);
        return 2;
    }
    char v[64];
    snprintf(v, sizeof v, "%ld", tp);
    const kiln_kv_dtype dt = o->kv_dtype;
    char ev[64];
    snprintf(ev, sizeof ev, "%ld", ep);
    if ((st = kiln_dist_agree("--tp", v)) || (st = kiln_dist_agree("--ep", ev)) || (st = kiln_dist_agree("the model", model_path)) ||
        (st = kiln_dist_agree("--kv-dtype", dt == KILN_KV_FP8 ? "fp8" : dt == KILN_KV_BF16 ? "bf16" : dt == KILN_KV_F32 ? "f32" : "auto")) ||
        (st = kiln_dist_agree("--kv-integrity", o->kv_integrity == KILN_KV_INTEGRITY_DEFAULT ? "default" : kiln_kv_integrity_name(o->kv_integrity)))) {
        int rc = cli_fail_status(cmd, st);
        kiln_dist_abort(rc); /* (not a plain exit: with orte_abort_on_non_zero_status off, mpirun would report 0) */
        return rc;
    }
    if (*rank > 0) {
        o->quiet = 1;
        if (!freopen("/dev/null", "w", stdout)) { int rc = cli_fail_msg(cmd, "cannot silence a rank's output"); kiln_dist_abort(rc); return rc; }
    }
    st = kiln_model_load(model_path, o, m);
    if (st == KILN_OK && (st = kiln_model_shard(*m, *rank, (int)tp, (int)ep)) != KILN_OK) kiln_model_free(*m);
    if (st) { int rc = cli_fail_status(cmd, st); kiln_dist_abort(rc); return rc; }
    kiln_model_set_allreduce(*m, kiln_dist_allreduce_sum, NULL);
    kiln_model_set_logits_gather(*m, kiln_dist_gather_vocab, NULL);
    return 0;
}

/* ---- bench statistics ---- */
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* q[0], q[1], q[2] = the 25th percentile, median and 75th percentile of v[0..n) (zeros when n < 1
 * or out of memory). */
void cli_quartiles(const double *v, long n, double q[3]) {
    double *s = malloc((size_t)n * sizeof *s);
    if (!s || n < 1) { free(s); q[0] = q[1] = q[2] = 0; return; }
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    q[0] = s[n / 4];
    q[1] = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    q[2] = s[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
    free(s);
}
