/* cmd_integrity.c — `kiln verify MODEL [--write]` (weight checksums against the manifest) and
 * `kiln bench --integrity` (KV integrity cost and detection campaign; lands with the KV seals). */
#include "kiln_test.h"
#include "cli.h"
#include <math.h>
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
    fprintf(f, ", %llu heals (%llu positions recomputed), %.1f ms in integrity code", (unsigned long long)st->heals,
            (unsigned long long)st->healed_positions, (double)st->integrity_ns / 1e6);
    uint64_t inj = 0, det = 0, bu = 0;
    for (int k = 0; k < KILN_KV_FAULT_KINDS; k++) inj += st->injected[k], det += st->injected_detected[k], bu += st->detected_before_use[k];
    if (inj) fprintf(f, "; injected %llu, detected %llu, before use %llu, false alarms %llu", (unsigned long long)inj, (unsigned long long)det,
                     (unsigned long long)bu, (unsigned long long)st->false_alarms);
    fprintf(f, "\n");
}

/* ---- kiln bench MODEL --integrity ----------------------------------------------------------------
 * Cost: one session per (KV dtype, integrity mode), all in one process. Per repeat: time to first
 * token of a --prompt-token prompt (prefill + the first greedy pick) in each mode, in rotating order;
 * then every cache is extended (kiln_session_kv_fill) so that --decode greedy steps end at --ctx
 * positions, and the decode steps run one token per mode in turn, each token timed (so load from
 * other processes falls on every mode alike); then one decode step's attention alone
 * (kiln_session_bench_attention: every page verified, as in a real step). Wall clock and process
 * CPU time (with --threads 1 the CPU time is the work, whatever share of a core the machine
 * granted). Decode: tokens/s of the median token, [slowest, fastest]; TTFT: median [min, max] of
 * the repeats. "best" compares the fastest token of each mode (interference only ever slows a
 * token down, so the minimum is the least disturbed estimate).
 * Detection: kiln_kv_integrity_campaign per fault kind (--faults N bit flips, N/10 of every other
 * kind) and a fault-free run of --clean-pages page verifications. */
#include <stdlib.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int argmax_(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
typedef struct { double med, lo, hi; } spread; /* median, min, max */
static spread spread_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    spread s = {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0], v[n - 1]};
    return s;
}

#define MAXR 32
typedef struct {
    kiln_kv_dtype dt;
    kiln_kv_integrity mode;
    kiln_session *s;
    double ttft[MAXR], cttft[MAXR], attn[MAXR], cattn[MAXR];
    double *tw, *tc;  /* every decode token's wall / CPU seconds */
    int n;
    spread dtw, dtc;  /* decode tokens/s: wall, CPU */
    int32_t tok;
    kiln_kv_integrity_stats s0;
    double vbytes;    /* bytes verified per decode step */
    double ins_tok;   /* ms in integrity code per decode step */
    double ins_ttft[MAXR]; /* ms in integrity code during the prompt */
    double pair_cost; /* median over decode tokens of (CPU time / the off token next to it) − 1, % */
} bvar;

int cmd_bench_integrity(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *model_path = NULL, *dts = "bf16,fp8", *modes_s = "off,detect,heal,strict";
    long ctx = 4096, prompt = 512, decode = 8, repeat = 3, faults = 100000, clean = 1000000;
    int json = 0, do_cost = 1, do_camp = 1, ctx_given = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--kv-dtype") == 0) { dts = cli_value(&a); continue; } /* a list here */
        if (strcmp(k, "--ctx") == 0 || strcmp(k, "--context") == 0 || strcmp(k, "--kv-context") == 0) { /* the bench's context */
            cli_long(&a, k, cli_value(&a), 2, 1 << 24, &ctx);
            ctx_given = 1;
            continue;
        }
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--integrity") == 0) continue;
        else if (strcmp(k, "--prompt") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 24, &prompt);
        else if (strcmp(k, "--decode") == 0) cli_long(&a, k, cli_value(&a), 1, 100000, &decode);
        else if (strcmp(k, "--repeat") == 0) cli_long(&a, k, cli_value(&a), 1, MAXR, &repeat);
        else if (strcmp(k, "--modes") == 0) modes_s = cli_value(&a);
        else if (strcmp(k, "--faults") == 0) cli_long(&a, k, cli_value(&a), 0, 100000000, &faults);
        else if (strcmp(k, "--clean-pages") == 0) cli_long(&a, k, cli_value(&a), 0, 1000000000, &clean);
        else if (strcmp(k, "--no-cost") == 0) do_cost = 0;
        else if (strcmp(k, "--no-campaign") == 0) do_camp = 0;
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln bench: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!model_path && do_cost)
        return cli_fail_msg("bench", "usage: kiln bench MODEL --integrity [--ctx N (4096)] [--prompt N (512)] [--decode N (8)] [--repeat R (3)] "
                                     "[--kv-dtype bf16,fp8] [--modes off,detect,heal,strict] [--faults N (100000)] [--clean-pages N (1000000)] "
                                     "[--no-cost] [--no-campaign] [--threads N] [--json]");
    if (prompt > ctx) prompt = ctx;
    /* variants: dtype × mode; "off" first is the reference */
    bvar vs[16];
    int nv = 0, ndt = 0, nmode = 0;
    kiln_kv_dtype dlist[4];
    kiln_kv_integrity mlist[4];
    for (const char *p = dts; p && *p && ndt < 4;) {
        size_t n = strcspn(p, ",");
        if (n == 4 && strncmp(p, "bf16", 4) == 0) dlist[ndt++] = KILN_KV_BF16;
        else if (n == 3 && strncmp(p, "fp8", 3) == 0) dlist[ndt++] = KILN_KV_FP8;
        else if (n == 3 && strncmp(p, "f32", 3) == 0) dlist[ndt++] = KILN_KV_F32;
        else return cli_fail_msg("bench", "--kv-dtype: a comma-separated list of f32, bf16, fp8");
        p += n + (p[n] == ',');
    }
    for (const char *p = modes_s; p && *p && nmode < 4;) {
        char w[16];
        size_t n = strcspn(p, ",");
        snprintf(w, sizeof w, "%.*s", (int)(n < 15 ? n : 15), p);
        if (kiln_kv_integrity_parse(w, &mlist[nmode]) != KILN_OK) return cli_fail_msg("bench", "--modes: a comma-separated list of off, detect, heal, strict");
        nmode++;
        p += n + (p[n] == ',');
    }
    if (!ndt || !nmode || mlist[0] != KILN_KV_INTEGRITY_OFF) return cli_fail_msg("bench", "--modes must start with off (the reference)");
    int rc = 0;
    kiln_model *m = NULL;
    kiln_model_info info;
    int32_t *ptoks = NULL;
    if (do_cost) {
        o.quiet = 1;
        kiln_status st = kiln_model_load(model_path, &o, &m);
        if (st) return cli_fail_status("bench", st);
        kiln_model_get_info(m, &info);
        if (!ctx_given && ctx + decode + 8 > info.max_context && info.max_context > decode + 16) {
            /* the default context does not fit this model: measure at the longest one that does */
            ctx = info.max_context - decode - 8;
            if (prompt > ctx) prompt = ctx;
            if (!json) printf("context %ld: the default 4096 + %ld decoded tokens exceed the model's context %d (--ctx sets it)\n", ctx, decode,
                              info.max_context);
        }
        if (ctx + decode + 8 > info.max_context) {
            char msg[300];
            snprintf(msg, sizeof msg, "--ctx %ld + %ld decoded tokens exceeds the model's context %d", ctx, decode, info.max_context);
            kiln_model_free(m);
            return cli_fail_msg("bench", msg);
        }
        ptoks = malloc((size_t)prompt * sizeof *ptoks);
        for (long i = 0; i < prompt; i++) ptoks[i] = (int32_t)((i == 0 && info.bos_id >= 0) ? info.bos_id : (1000 + 7919 * i) % info.vocab_size);
        for (int d = 0; d < ndt; d++)
            for (int k = 0; k < nmode; k++) {
                bvar *v = &vs[nv++];
                memset(v, 0, sizeof *v);
                v->dt = dlist[d];
                v->mode = mlist[k];
                kiln_options oo = o;
                oo.kv_dtype = v->dt;
                oo.kv_integrity = v->mode;
                oo.max_context = (int)(ctx + decode + 8);
                if ((st = kiln_session_create(m, &oo, &v->s))) { rc = cli_fail_status("bench", st); goto done; }
            }
        for (int i = 0; i < nv; i++) {
            vs[i].tw = malloc((size_t)(repeat * decode) * sizeof(double));
            vs[i].tc = malloc((size_t)(repeat * decode) * sizeof(double));
            if (!vs[i].tw || !vs[i].tc) { rc = cli_fail_msg("bench", "out of memory"); goto done; }
        }
        for (int r = 0; r < repeat; r++)
            for (int d = 0; d < ndt; d++) {
                bvar *vd = &vs[d * nmode];
                kiln_status st;
                /* time to first token, modes in rotating order; then each cache is extended so that the
                 * decode steps end at the context */
                for (int j = 0; j < nmode; j++) {
                    bvar *v = &vd[(j + r) % nmode];
                    kiln_session_reset(v->s);
                    kiln_kv_integrity_stats p0, p1;
                    kiln_session_kv_integrity(v->s, &p0);
                    double t0 = kiln_now(), c0 = cpu_now();
                    if ((st = kiln_session_eval(v->s, ptoks, (int)prompt, NULL))) { rc = cli_fail_status("bench", st); goto done; }
                    v->tok = (int32_t)argmax_(kiln_session_logits(v->s), info.vocab_size);
                    v->ttft[r] = 1e3 * (kiln_now() - t0);
                    v->cttft[r] = 1e3 * (cpu_now() - c0);
                    kiln_session_kv_integrity(v->s, &p1);
                    v->ins_ttft[r] = (double)(p1.integrity_ns - p0.integrity_ns) / 1e6;
                    if (ctx - decode > prompt && (st = kiln_session_kv_fill(v->s, (int)(ctx - decode)))) { rc = cli_fail_status("bench", st); goto done; }
                    kiln_session_kv_integrity(v->s, &v->s0);
                }
                /* decode: one token per mode in turn, each timed (interference hits every mode alike) */
                for (long i = 0; i < decode; i++)
                    for (int j = 0; j < nmode; j++) {
                        bvar *v = &vd[(j + i + r) % nmode];
                        double t0 = kiln_now(), c0 = cpu_now();
                        if ((st = kiln_session_eval(v->s, &v->tok, 1, NULL))) { rc = cli_fail_status("bench", st); goto done; }
                        v->tok = (int32_t)argmax_(kiln_session_logits(v->s), info.vocab_size);
                        v->tw[v->n] = kiln_now() - t0;
                        v->tc[v->n++] = cpu_now() - c0;
                    }
                for (int j = 0; j < nmode; j++) {
                    bvar *v = &vd[(j + r) % nmode];
                    kiln_kv_integrity_stats s1;
                    kiln_session_kv_integrity(v->s, &s1);
                    v->vbytes = (double)(s1.bytes_verified - v->s0.bytes_verified) / (double)decode;
                    v->ins_tok = (double)(s1.integrity_ns - v->s0.integrity_ns) / 1e6 / (double)decode;
                    double ca = cpu_now(), at = kiln_session_bench_attention(v->s, 1);
                    v->attn[r] = at > 0 ? 1e3 * at : NAN; /* -1: no dense attention to time (DSA models) */
                    v->cattn[r] = 1e3 * (cpu_now() - ca);
                    if (!json) fprintf(stderr, "kiln bench: repeat %d/%ld %s %s: TTFT %.0f ms\n", r + 1, repeat,
                                       v->dt == KILN_KV_FP8 ? "fp8" : v->dt == KILN_KV_BF16 ? "bf16" : "f32", kiln_kv_integrity_name(v->mode), v->ttft[r]);
                }
            }
        /* paired cost: each mode's k-th token against the off session's k-th token, which ran right
         * next to it (the median ratio cancels load that changes slowly) */
        for (int i = 0; i < nv; i++) {
            bvar *ref = &vs[i / nmode * nmode];
            double *rr = malloc((size_t)vs[i].n * sizeof *rr);
            if (!rr) { rc = cli_fail_msg("bench", "out of memory"); goto done; }
            for (int k = 0; k < vs[i].n; k++) rr[k] = vs[i].tc[k] / ref->tc[k];
            vs[i].pair_cost = 100.0 * (spread_of(rr, vs[i].n).med - 1.0);
            free(rr);
        }
        /* per-token times → tokens/s (the median token's rate; min / max from the slowest / fastest token) */
        for (int i = 0; i < nv; i++) {
            spread w = spread_of(vs[i].tw, vs[i].n), c = spread_of(vs[i].tc, vs[i].n);
            vs[i].dtw = (spread){1.0 / w.med, 1.0 / w.hi, 1.0 / w.lo};
            vs[i].dtc = (spread){1.0 / c.med, 1.0 / c.hi, 1.0 / c.lo};
        }
    }
    kiln_kv_campaign camp[KILN_KV_FAULT_KINDS + 1];
    int ncamp = 0;
    if (do_camp) {
        for (int k = -1; k < KILN_KV_FAULT_KINDS; k++) {
            uint64_t n = k < 0 ? (uint64_t)clean : k == KILN_KV_FAULT_BITFLIP ? (uint64_t)faults : (uint64_t)faults / 10;
            if (!n) continue;
            kiln_status st = kiln_kv_integrity_campaign(k, n, 1 + (uint64_t)k, &camp[ncamp]);
            if (st) { rc = cli_fail_status("bench", st); goto done; }
            ncamp++;
        }
    }
    const char *dn[4] = {"auto", "f32", "bf16", "fp8"};
    if (json) {
        printf("{\"model\": \"%s\", \"context\": %ld, \"prompt_tokens\": %ld, \"decode_tokens\": %ld, \"repeats\": %ld, \"threads\": %d, \"modes\": [",
               model_path ? model_path : "", ctx, prompt, decode, repeat, o.threads);
    } else if (do_cost) {
        printf("KV integrity cost, %s: decode at context %ld, TTFT of a %ld-token prompt, %ld decode steps; median [min, max] of %ld repeats "
               "(modes interleaved), threads %d; cost = vs off (median; 'best' = best run vs best run, CPU time)\n", model_path, ctx, prompt, decode,
               repeat, o.threads);
        printf("%-5s %-7s %24s %8s %26s %8s %22s %8s %8s %8s %11s %8s %12s %18s %18s\n", "kv", "mode", "decode tok/s", "cost", "TTFT ms", "cost",
               "decode tok/CPU-s", "cost", "best", "paired", "TTFT CPU-ms", "cost", "verified/tok", "integrity ms/tok", "integrity ms/TTFT");
    }
    for (int d = 0; do_cost && d < ndt; d++) {
        bvar *ref = &vs[d * nmode];
        spread rt = ref->dtw, rf = spread_of(ref->ttft, (int)repeat), rc_ = ref->dtc;
        for (int j = 0; j < nmode; j++) {
            bvar *v = &vs[d * nmode + j];
            spread t = v->dtw, f = spread_of(v->ttft, (int)repeat), c = v->dtc;
            spread cf = spread_of(v->cttft, (int)repeat), at = spread_of(v->attn, (int)repeat), cat = spread_of(v->cattn, (int)repeat);
            spread ins_f = spread_of(v->ins_ttft, (int)repeat);
            spread rcf = spread_of(ref->cttft, (int)repeat);
            double dcost = 100.0 * (rt.med / t.med - 1.0), fcost = 100.0 * (f.med / rf.med - 1.0), ccost = 100.0 * (rc_.med / c.med - 1.0);
            double bcost = 100.0 * (rc_.hi / c.hi - 1.0), cfcost = 100.0 * (cf.med / rcf.med - 1.0), cfbest = 100.0 * (cf.lo / rcf.lo - 1.0);
            if (json)
                printf("%s{\"kv_dtype\": \"%s\", \"mode\": \"%s\", \"decode_tps\": %.4f, \"decode_tps_min\": %.4f, \"decode_tps_max\": %.4f, "
                       "\"ttft_ms\": %.2f, \"ttft_ms_min\": %.2f, \"ttft_ms_max\": %.2f, \"decode_tps_cpu\": %.4f, \"decode_tps_cpu_min\": %.4f, "
                       "\"decode_tps_cpu_max\": %.4f, \"ttft_cpu_ms\": %.2f, \"attention_ms\": %.3f, \"attention_cpu_ms\": %.3f, "
                       "\"decode_cost_pct\": %.3f, \"ttft_cost_pct\": %.3f, \"decode_cpu_cost_pct\": %.3f, \"decode_cpu_best_cost_pct\": %.3f, "
                       "\"ttft_cpu_cost_pct\": %.3f, \"ttft_cpu_best_cost_pct\": %.3f, \"ttft_cpu_ms_min\": %.2f, \"verified_bytes_per_token\": %.0f, "
                       "\"decode_cpu_paired_cost_pct\": %.3f, \"integrity_ms_per_token\": %.4f, \"integrity_pct_of_token\": %.4f, \"integrity_ms_ttft\": %.3f, \"integrity_pct_of_ttft\": %.4f}",
                       d || j ? ", " : "", dn[v->dt], kiln_kv_integrity_name(v->mode), t.med, t.lo, t.hi, f.med, f.lo, f.hi, c.med, c.lo, c.hi,
                       cf.med, at.med, cat.med, dcost, fcost, ccost, bcost, cfcost, cfbest, cf.lo, v->vbytes, v->pair_cost, v->ins_tok,
                       100.0 * v->ins_tok / (1e3 / t.hi), ins_f.med, 100.0 * ins_f.med / f.lo);
            else
                printf("%-5s %-7s %8.3f [%6.3f, %6.3f] %+7.2f%% %8.0f [%7.0f, %7.0f] %+7.2f%% %6.3f [%6.3f,%6.3f] %+7.2f%% %+7.2f%% %+7.2f%% %11.0f %+7.2f%% "
                       "%9.1f MB %7.3f (%5.2f%%) %8.1f (%5.2f%%)\n",
                       dn[v->dt], kiln_kv_integrity_name(v->mode), t.med, t.lo, t.hi, j ? dcost : 0.0, f.med, f.lo, f.hi, j ? fcost : 0.0, c.med, c.lo,
                       c.hi, j ? ccost : 0.0, j ? bcost : 0.0, j ? v->pair_cost : 0.0, cf.med, j ? cfcost : 0.0, v->vbytes / 1e6, v->ins_tok, 100.0 * v->ins_tok / (1e3 / t.hi),
                       ins_f.med, 100.0 * ins_f.med / f.lo);
        }
    }
    if (json) printf("], \"faults\": [");
    else if (do_camp)
        printf("\nDetection campaign (kiln_kv_integrity_campaign: synthetic pool, 2 layers x K/V x 2 KV heads per page, injected one at a time, "
               "attention over every layer after each):\n%-12s %10s %10s %20s %13s %14s %9s\n", "fault", "injected", "detected", "detected_before_use",
               "false_alarms", "verifications", "seconds");
    for (int i = 0; i < ncamp; i++) {
        const char *name = camp[i].fault < 0 ? "none" : kiln_kv_fault_name((kiln_kv_fault)camp[i].fault);
        if (json)
            printf("%s{\"fault\": \"%s\", \"injected\": %llu, \"detected\": %llu, \"detected_before_use\": %llu, \"false_alarms\": %llu, "
                   "\"verifications\": %llu, \"page_verifications\": %llu, \"seconds\": %.3f}", i ? ", " : "", name,
                   (unsigned long long)camp[i].injected, (unsigned long long)camp[i].detected, (unsigned long long)camp[i].detected_before_use,
                   (unsigned long long)camp[i].false_alarms, (unsigned long long)camp[i].verifications, (unsigned long long)camp[i].page_verifications,
                   camp[i].seconds);
        else
            printf("%-12s %10llu %10llu %20llu %13llu %14llu %9.2f%s\n", name, (unsigned long long)camp[i].injected, (unsigned long long)camp[i].detected,
                   (unsigned long long)camp[i].detected_before_use, (unsigned long long)camp[i].false_alarms,
                   (unsigned long long)camp[i].verifications, camp[i].seconds, camp[i].fault < 0 ? "   (fault-free; page verifications above /8)" : "");
    }
    if (json) printf("]}\n");
done:
    for (int i = 0; i < nv; i++) {
        kiln_session_free(vs[i].s);
        free(vs[i].tw);
        free(vs[i].tc);
    }
    free(ptoks);
    kiln_model_free(m);
    return rc;
}
