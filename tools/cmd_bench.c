/* cmd_bench.c — `kiln bench MODEL [--weights f32,bf16,fp8,int4] [--prompt N] [--gen N] [--repeat R] [--json]`:
 * (a GGUF file: its own format, `native`, first, then any --weights asked for; alone by default)
 * for each weight format in one run (the model re-loaded and quantized in memory each time, every
 * linear layer including the output head): prompt tokens/s, batch-1 decode tokens/s, weight bytes
 * read per decode token, achieved GB/s, and the machine's read bandwidth measured by the bench itself
 * with the same thread count: sustained over a window reading as many bytes as the longest decode
 * window (weight bytes per token × --gen), once per round, best round kept — the same length and
 * the same best-of-rounds as the decode figure it divides (a 1 GiB burst, also printed, catches
 * quiet moments of a shared machine that a decode window does not).
 * --scope experts quantizes only the routed experts of MoE models (the rest stays as stored); the bytes
 * per token then count only the experts a token is routed to (kiln_model_decode_weight_bytes).
 * Other benchmarks: --kv-context (tools/cmd_kv.c), --integrity, --server, --tokenizer. */
#include "kiln_test.h"
#include "cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char weights[16];
    char native[16]; /* --weights native: the model's own format (for the compute peak it is set against) */
    double prompt_tps, decode_tps, linear_tps;
    unsigned long long bytes_per_token;
    unsigned long long macs_per_token; /* linear-layer multiply-accumulates of one token */
    int kept;
    double *round_tps; /* [--repeat] each round's decode window (tokens/s), for the paired ratio */
    double paired;     /* median over rounds of this row's window / the first row's window of the same round */
    /* live state between rounds */
    kiln_model *m;
    kiln_session *s;
    int vocab, n_prompt;
    int32_t last; /* the prompt's last token */
} bench_row;

static void bench_close(bench_row *r) {
    kiln_session_free(r->s);
    kiln_model_free(r->m);
    r->s = NULL;
    r->m = NULL;
}

/* The peak a prompt of these weights is set against: the integer formats (INT4 and every GGUF block
 * type: q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k, iq4_nl, iq4_xs) multiply int8 dots; BF16 and FP8
 * bf16 pair dots where the bf16 peak exists (the BF16-dot GEMM); f32 FMA otherwise. */
/* amx: the AMX tile peak where the 16-row interleave GEMM runs on tiles (Q8_0, Q4_0, INT4 group 32), else 0 */
/* fp8_int8: FP8 prompts run on the int8 kernels here (kiln_fp8_prompt_int8), and so on AMX where the Q8_0 GEMM does */
static double row_peak(const char *weights, double f32, double int8, double bf16, double amx, int fp8_int8) {
    if (fp8_int8 && !strcmp(weights, "fp8")) return amx > 0 ? amx : int8;
    if (amx > 0 && (!strcmp(weights, "q8_0") || !strcmp(weights, "q4_0") || !strcmp(weights, "int4"))) return amx;
    if (!strncmp(weights, "int4", 4) || weights[0] == 'q' || !strncmp(weights, "iq4", 3)) return int8;
    if ((!strcmp(weights, "bf16") || !strcmp(weights, "fp8")) && bf16 > 0) return bf16;
    return f32;
}

/* Loads, quantizes and prefills one configuration (its prompt tokens/s measured here). */
static kiln_status bench_open(const char *path, const kiln_options *o, const char *weights, const char *scope, int n_prompt,
                              uint64_t seed, bench_row *r) {
    kiln_status st = kiln_model_load(path, o, &r->m);
    if (st) return st;
    int32_t *toks = NULL;
    if (strcmp(weights, "native") != 0) {
        if ((st = kiln_model_requantize_scope(r->m, weights, scope, &r->kept))) goto out;
        if (strcmp(scope, "all") == 0 && (st = kiln_model_requantize_head(r->m, weights))) goto out;
    }
    if (strcmp(weights, "native") == 0) snprintf(r->native, sizeof r->native, "%s", kiln_model_linear_format(r->m));
    r->bytes_per_token = kiln_model_decode_weight_bytes(r->m);
    r->macs_per_token = kiln_model_token_macs(r->m);
    kiln_model_info info;
    kiln_model_get_info(r->m, &info);
    r->vocab = info.vocab_size;
    if ((st = kiln_session_create(r->m, o, &r->s))) goto out;
    toks = malloc(sizeof *toks * (size_t)n_prompt);
    if (!toks) { st = KILN_ERR_NOMEM; goto out; }
    uint64_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n_prompt; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; toks[i] = (int32_t)((x >> 33) % (uint64_t)info.vocab_size); }
    if (o->backend == KILN_BACKEND_VULKAN) {
        /* A device's first steps copy the weights they read into its memory (the progress lines; the
         * conversion and upload of GBs take seconds) and create the pipelines they use: a few tokens
         * first, untimed (8: the prefill's tile variants too), then the session reset, so that
         * prompt tok/s is the prefill's. The GPU prefill figures before this (docs/BENCHMARKS.md,
         * H200 runs of 2026-12-04) included that copy. The cpu backend keeps its cold first prefill
         * (the figures compared with llama.cpp were taken so). */
        const int warm = n_prompt < 8 ? n_prompt : 8;
        if ((st = kiln_session_eval(r->s, toks, warm, NULL)) || (st = kiln_session_truncate(r->s, 0))) goto out;
    }
    double t0 = kiln_now();
    if ((st = kiln_session_eval(r->s, toks, n_prompt, NULL))) goto out;
    r->prompt_tps = n_prompt / (kiln_now() - t0);
    r->n_prompt = n_prompt;
    r->last = toks[n_prompt - 1];
out:
    free(toks);
    if (st) bench_close(r);
    return st;
}

/* One window of n_gen greedy decode steps; keeps the best tokens/s over windows. Every window
 * decodes positions [prompt, prompt + n_gen): the session is first rolled back to its prompt (the
 * prompt's last token evaluated again, untimed, for the logits to start from), so all rounds run
 * the same context lengths and best-of compares like with like (until commit 29e7d26 the context
 * grew by n_gen per round, and later rounds paid for longer attention). A KV cache with dynamic FP8
 * page scales cannot roll back exactly (kiln_session_truncate): its context keeps growing. */
static kiln_status bench_window(bench_row *r, int n_gen, double *tps_out) {
    if (kiln_session_length(r->s) > r->n_prompt) {
        kiln_status st = kiln_session_truncate(r->s, r->n_prompt - 1);
        if (st == KILN_OK) st = kiln_session_eval(r->s, &r->last, 1, NULL);
        else if (st == KILN_ERR_UNSUPPORTED) st = KILN_OK;
        if (st) return st;
    }
    const float *lg = kiln_session_logits(r->s);
    double t0 = kiln_now();
    for (int i = 0; i < n_gen; i++) {
        int32_t best = (int32_t)kiln_argmax(lg, r->vocab); /* greedy, as the sampler does */
        kiln_status st = kiln_session_eval(r->s, &best, 1, NULL);
        if (st) return st;
        lg = kiln_session_logits(r->s);
    }
    double tps = n_gen / (kiln_now() - t0);
    if (tps > r->decode_tps) r->decode_tps = tps;
    *tps_out = tps;
    return KILN_OK;
}

/* The paired ratio: for each round, this row's window over the first row's window of the same
 * round (adjacent in time, so a noisy spell of the shared host hits both), median over the rounds.
 * The ratio of the best windows (the table's "vs first") takes each side's luckiest moment, which on
 * a host whose bandwidth drifts 40-70 GB/s within a run need not be the same moment. Both are
 * printed; neither replaces the other. */
static double paired_ratio(const bench_row *r, const bench_row *first, long rounds) {
    double *v = malloc((size_t)(rounds > 0 ? rounds : 1) * sizeof *v), q[3];
    if (!v) return 0.0;
    for (long i = 0; i < rounds; i++) v[i] = first->round_tps[i] > 0 ? r->round_tps[i] / first->round_tps[i] : 0.0;
    cli_quartiles(v, rounds, q);
    free(v);
    return q[1];
}

int cmd_bench(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *path = NULL, *weights = NULL, *scope = "all";
    long n_prompt = 128, n_gen = 64, seed = 1, repeat = 5;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "--prompt") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &n_prompt);
        else if (strcmp(k, "--gen") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &n_gen);
        else if (strcmp(k, "--seed") == 0) cli_long(&a, k, cli_value(&a), 0, 1L << 30, &seed);
        else if (strcmp(k, "--repeat") == 0) cli_long(&a, k, cli_value(&a), 1, 1000, &repeat);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (strcmp(k, "--scope") == 0) scope = cli_value(&a);
        else if (k[0] == '-') { fprintf(stderr, "kiln bench: error: unknown option '%s'\n", k); return 2; }
        else if (!path) path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!path) return cli_fail_msg("bench", "usage: kiln bench MODEL [--weights f32,bf16,fp8,int4,int4-g128,q8_0,q4_0|native] [--scope all|experts] [--prompt N] [--gen N] [--repeat R (5)] [--threads N] [--json]");
    /* A GGUF file is measured as it is first (llama.cpp users compare files, not kiln's requantized
     * formats), then any --weights asked for; other checkpoints default to kiln's own formats. */
    const size_t pl = strlen(path);
    const int gguf = pl > 5 && strcmp(path + pl - 5, ".gguf") == 0;
    char list[256];
    if (gguf) {
        int has_native = 0;
        if (weights) {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", weights);
            for (char *w = strtok(tmp, ","); w; w = strtok(NULL, ",")) has_native |= strcmp(w, "native") == 0;
        }
        if (!weights) snprintf(list, sizeof list, "native");
        else if (has_native) snprintf(list, sizeof list, "%s", weights);
        else snprintf(list, sizeof list, "native,%s", weights);
    } else snprintf(list, sizeof list, "%s", weights ? weights : "f32,bf16,fp8,int4");
    bench_row rows[16];
    int n = 0;
    double best_bw = 0, best_burst = 0;
    for (char *w = strtok(list, ","); w && n < 16; w = strtok(NULL, ",")) {
        if (strcmp(w, "f32") && strcmp(w, "bf16") && strcmp(w, "fp8") && strcmp(w, "int4") && strcmp(w, "int4-g32") && strcmp(w, "int4-g128") &&
            strcmp(w, "q8_0") && strcmp(w, "q4_0") && strcmp(w, "native")) {
            fprintf(stderr, "kiln bench: error: option --weights: '%s' is not one of f32, bf16, fp8, int4 (= int4-g32), int4-g128, q8_0, q4_0, native\n", w);
            return 2;
        }
        memset(&rows[n], 0, sizeof rows[n]);
        snprintf(rows[n].weights, sizeof rows[n].weights, "%s", w);
        n++;
    }
    /* Every configuration is loaded and prefilled first; then --repeat rounds (default 5) each
     * measure the read bandwidth once and run one decode window of every configuration back to
     * back, then each configuration's linear-only replay; the best window of each is kept.
     * Configurations alternate and their windows are adjacent (the replays come after them), so a
     * noisy spell on this shared machine hits all of them rather than one, and best-of is taken on
     * both sides of every ratio (the bandwidth is the best of its own repetitions too). One round
     * alone is a coin toss on a shared host: bench-500m INT4/FP8 ratios of single rounds spread
     * over ±10% here. */
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kiln_status st = bench_open(path, &o, rows[i].weights, scope ? scope : "all", (int)n_prompt, (uint64_t)seed, &rows[i]);
        if (st) rc = cli_fail_status("bench", st);
        else if (!(rows[i].round_tps = calloc((size_t)repeat, sizeof(double)))) rc = cli_fail_msg("bench", "out of memory");
    }
    uint64_t window = 0; /* bytes of the longest decode window */
    for (int i = 0; i < n && !rc; i++)
        if (rows[i].bytes_per_token * (uint64_t)n_gen > window) window = rows[i].bytes_per_token * (uint64_t)n_gen;
    /* the bandwidth the decode reads from: the host's, or with --device vulkan the device's
     * (its weights and KV live there) */
    const int on_device = o.backend == KILN_BACKEND_VULKAN;
    kiln_membw *mb = rc || on_device ? NULL : kiln_membw_open(o.threads, 0);
    if (!rc && !on_device && !mb) rc = cli_fail_msg("bench", "out of memory for the 1 GiB bandwidth buffer");
    for (long r = 0; r < repeat && !rc; r++) {
        double bw = 0.0, burst = 0.0;
        if (on_device) {
            kiln_status st = kiln_device_read_gbps(&o, 0, &bw);
            if (st) { rc = cli_fail_status("bench", st); break; }
            burst = bw;
        } else {
            bw = kiln_membw_window_gbps(mb, window);
            burst = kiln_membw_burst_gbps(mb);
        }
        if (bw > best_bw) best_bw = bw;
        if (burst > best_burst) best_burst = burst;
        for (int i = 0; i < n && !rc; i++) {
            kiln_status st = bench_window(&rows[i], (int)n_gen, &rows[i].round_tps[r]);
            if (st) rc = cli_fail_status("bench", st);
        }
        for (int i = 0; i < n && !rc; i++) {
            double ls = kiln_model_bench_linear_step(rows[i].m, &o, (int)n_gen); /* a window of --gen steps */
            if (ls > 0 && 1.0 / ls > rows[i].linear_tps) rows[i].linear_tps = 1.0 / ls;
            if (!json && r == repeat - 1) fprintf(stderr, "bench: %s done (%.1f decode tok/s)\n", rows[i].weights, rows[i].decode_tps);
        }
    }
    if (mb) kiln_membw_close(mb);
    for (int i = 0; i < n && !rc; i++) rows[i].paired = paired_ratio(&rows[i], &rows[0], repeat);
    for (int i = 0; i < n; i++) {
        bench_close(&rows[i]);
        free(rows[i].round_tps);
    }
    if (rc) return rc;
    /* The compute peaks of this run's ISA and threads (register-only loops): the prompt's achieved
     * GFLOP/s is set against the peak of the instruction its GEMM multiplies with. */
    const double pk_f32 = kiln_compute_peak_gops(0, o.isa, o.threads), pk_int8 = kiln_compute_peak_gops(1, o.isa, o.threads),
                 pk_bf16 = o.fp8_gemv == 1 ? 0 : kiln_compute_peak_gops(2, o.isa, o.threads),
                 pk_amx = on_device ? 0 : kiln_compute_peak_gops(3, o.isa, o.threads);
    /* a prompt runs in forward calls of up to KILN_SESSION_CHUNK tokens */
    const int fp8_int8 = !on_device && kiln_fp8_prompt_int8(o.isa, o.fp8_gemv, n_prompt < KILN_SESSION_CHUNK ? (int)n_prompt : KILN_SESSION_CHUNK);
    if (!json) {
        if (on_device)
            printf("model %s, scope %s, prompt %ld tokens, decode %ld tokens (best of %ld windows), device vulkan:%d, measured device read "
                   "bandwidth %.1f GB/s (512 MiB read 8 times per submit, best of the rounds)\n",
                   path, scope, n_prompt, n_gen, repeat, o.device_index, best_bw);
        else
            printf("model %s, scope %s, prompt %ld tokens, decode %ld tokens (best of %ld windows), threads %d, measured read bandwidth %.1f GB/s "
                   "sustained over %.2f GB windows (1 GiB burst: %.1f GB/s)\n",
                   path, scope, n_prompt, n_gen, repeat, o.threads, best_bw, window / 1e9, best_burst);
        printf("compute peaks measured now: f32 FMA %.0f GFLOP/s, int8 dot %.0f GOPS, bf16 dot %.0f GFLOP/s (0: not on this ISA or --fp8-gemv exact), "
               "AMX int8 tiles %.0f GOPS (0: the GEMMs do not run on AMX here)\n",
               pk_f32, pk_int8, pk_bf16, pk_amx);
        printf("prompt GFLOP/s (linear layers, 2 × multiply-accumulates per token × prompt tok/s) against the peak of the GEMM's instruction:");
        for (int i = 0; i < n; i++) {
            const bench_row *r = &rows[i];
            const double g = 2.0 * (double)r->macs_per_token * r->prompt_tps / 1e9, pk = row_peak(r->native[0] ? r->native : r->weights, pk_f32, pk_int8, pk_bf16, pk_amx, fp8_int8);
            printf(" %s %.0f (%.0f%%)%s", r->weights, g, pk > 0 ? 100 * g / pk : 0.0, i + 1 < n ? "," : "\n");
        }
        printf("| weights | prompt tok/s | decode tok/s | weight MB/token | achieved GB/s | %% of measured | vs first | vs first, paired | linear layers only: steps/s, %% of measured |\n");
        printf("|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int i = 0; i < n; i++) {
        bench_row *r = &rows[i];
        double achieved = (double)r->bytes_per_token * r->decode_tps / 1e9, lin = (double)r->bytes_per_token * r->linear_tps / 1e9;
        if (json)
            printf("{\"weights\": \"%s\", \"prompt_tps\": %.3f, \"decode_tps\": %.3f, \"weight_bytes_per_token\": %llu, "
                   "\"achieved_gbps\": %.3f, \"measured_gbps\": %.3f, \"roofline_fraction\": %.4f, \"layers_kept\": %d, "
                   "\"linear_only_tps\": %.3f, \"linear_only_roofline_fraction\": %.4f, \"burst_gbps\": %.3f, \"burst_roofline_fraction\": %.4f, "
                   "\"vs_first\": %.4f, \"vs_first_paired_median\": %.4f, \"prompt_gflops\": %.2f, \"prompt_peak_fraction\": %.4f, "
                   "\"peak_f32_gflops\": %.1f, \"peak_int8_gops\": %.1f, \"peak_bf16_gflops\": %.1f, \"peak_amx_int8_gops\": %.1f}\n",
                   r->weights, r->prompt_tps, r->decode_tps, r->bytes_per_token, achieved, best_bw, achieved / best_bw, r->kept,
                   r->linear_tps, lin / best_bw, best_burst, achieved / best_burst, r->decode_tps / rows[0].decode_tps, r->paired,
                   2.0 * (double)r->macs_per_token * r->prompt_tps / 1e9,
                   row_peak(r->native[0] ? r->native : r->weights, pk_f32, pk_int8, pk_bf16, pk_amx, fp8_int8) > 0
                       ? 2.0 * (double)r->macs_per_token * r->prompt_tps / 1e9 / row_peak(r->native[0] ? r->native : r->weights, pk_f32, pk_int8, pk_bf16, pk_amx, fp8_int8) : 0.0,
                   pk_f32, pk_int8, pk_bf16, pk_amx);
        else if (r->linear_tps > 0)
            printf("| %s | %.1f | %.2f | %.1f | %.2f | %.0f%% | %.2fx | %.2fx | %.2f, %.0f%% |\n", r->weights, r->prompt_tps, r->decode_tps,
                   r->bytes_per_token / 1e6, achieved, 100 * achieved / best_bw, r->decode_tps / rows[0].decode_tps, r->paired,
                   r->linear_tps, 100 * lin / best_bw);
        else
            printf("| %s | %.1f | %.2f | %.1f | %.2f | %.0f%% | %.2fx | %.2fx | — |\n", r->weights, r->prompt_tps, r->decode_tps,
                   r->bytes_per_token / 1e6, achieved, 100 * achieved / best_bw, r->decode_tps / rows[0].decode_tps, r->paired);
    }
    return 0;
}

/* `kiln bench --gemv [--weights fp8,int4] [--shape 5632x2048,2048x5632] [--tokens 1] [--rounds 30] [--mb 128]
 * [--threads N] [--json]`: each weight format's batch-1 GEMV streaming rate alone, per weight shape
 * (kiln_gemv_bench_*): the GB/s of weight bytes (data + scales) a pass over ≥ --mb MB of copies of
 * the weight reads, and the machine's read bandwidth measured over the same bytes in the same round.
 * Rounds alternate every (shape, format) back to back, so the per-round ratio to the shape's first
 * format compares adjacent moments of a shared host; medians and quartiles over the rounds are
 * printed. What it answers: how fast a format's kernel streams per byte, without the rest of a decode
 * step (docs/BENCHMARKS.md, the INT4 vs FP8 per-byte figures). --tokens 1,2,4 adds a row per token
 * count: each pass then multiplies that many activation rows (a few-token step: speculative
 * verification, small decode batches), and its GB/s is still weight bytes over time, so the ratio of
 * a row to the shape's first row (tokens 1) is the inverse of the step's cost against the GEMV. */
typedef struct {
    char weights[16];
    long rows, cols, tokens;
    kiln_gemv_bench *b;
    double *gbps, *ratio; /* [rounds] */
} gemv_row;


int cmd_bench_gemv(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *weights = "fp8,int4", *shapes = "5632x2048,2048x5632", *tokens = "1";
    long rounds = 30, mb_per_pass = 128;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--gemv") == 0) continue;
        if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "--shape") == 0) shapes = cli_value(&a);
        else if (strcmp(k, "--tokens") == 0) tokens = cli_value(&a);
        else if (strcmp(k, "--rounds") == 0) cli_long(&a, k, cli_value(&a), 1, 100000, &rounds);
        else if (strcmp(k, "--mb") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 16, &mb_per_pass);
        else if (strcmp(k, "--json") == 0) json = 1;
        else { fprintf(stderr, "kiln bench: error: --gemv: unknown option or argument '%s'\n", k); return 2; }
    }
    if (a.bad || !weights || !shapes || !tokens) return 2;
    enum { MAXROWS = 32 };
    gemv_row rows[MAXROWS];
    int n = 0, nw = 0, nt = 0;
    long tok[16];
    char slist[256], wlist[256], tlist[256];
    if (strlen(shapes) >= sizeof slist || strlen(weights) >= sizeof wlist || strlen(tokens) >= sizeof tlist)
        return cli_fail_msg("bench", "--gemv: --shape, --weights or --tokens list longer than 255 characters");
    snprintf(tlist, sizeof tlist, "%s", tokens);
    char *tsave = NULL;
    for (char *t = strtok_r(tlist, ",", &tsave); t; t = strtok_r(NULL, ",", &tsave)) {
        if (nt == 16) return cli_fail_msg("bench", "--gemv: at most 16 --tokens values");
        if (!cli_long(&a, "--tokens", t, 1, 1024, &tok[nt])) return 2;
        nt++;
    }
    if (nt == 0) return cli_fail_msg("bench", "--gemv: empty --tokens list");
    snprintf(slist, sizeof slist, "%s", shapes);
    char *ssave = NULL, *wsave = NULL;
    for (char *sh = strtok_r(slist, ",", &ssave); sh; sh = strtok_r(NULL, ",", &ssave)) {
        long r = 0, c = 0;
        char tail = 0;
        if (sscanf(sh, "%ldx%ld%c", &r, &c, &tail) != 2 || r < 1 || c < 1) {
            fprintf(stderr, "kiln bench: error: option --shape: '%s' is not ROWSxCOLS (two positive integers, e.g. 5632x2048)\n", sh);
            return 2;
        }
        snprintf(wlist, sizeof wlist, "%s", weights);
        nw = 0;
        for (char *w = strtok_r(wlist, ",", &wsave); w; w = strtok_r(NULL, ",", &wsave))
            for (int ti = 0; ti < nt; ti++) {
                if (n == MAXROWS) { fprintf(stderr, "kiln bench: error: --gemv: at most %d (shape, weights, tokens) rows\n", MAXROWS); return 2; }
                memset(&rows[n], 0, sizeof rows[n]);
                snprintf(rows[n].weights, sizeof rows[n].weights, "%s", w);
                rows[n].rows = r;
                rows[n].cols = c;
                rows[n].tokens = tok[ti];
                n++;
                nw++;
            }
    }
    if (n == 0 || nw == 0) return cli_fail_msg("bench", "--gemv: no --shape or --weights given");
    int rc = 0;
    uint64_t pass = 0;
    for (int i = 0; i < n && !rc; i++) {
        kiln_status st = kiln_gemv_bench_open(rows[i].weights, rows[i].rows, rows[i].cols, (int)rows[i].tokens, (uint64_t)mb_per_pass << 20, &o,
                                                &rows[i].b);
        if (st) rc = cli_fail_status("bench", st);
        else if (!(rows[i].gbps = calloc((size_t)rounds, sizeof(double))) || !(rows[i].ratio = calloc((size_t)rounds, sizeof(double))))
            rc = cli_fail_msg("bench", "out of memory");
        else if (kiln_gemv_bench_bytes(rows[i].b) > pass) pass = kiln_gemv_bench_bytes(rows[i].b);
    }
    kiln_membw *mb = rc ? NULL : kiln_membw_open(o.threads, 0);
    if (!rc && !mb) rc = cli_fail_msg("bench", "out of memory for the 1 GiB bandwidth buffer");
    double best_bw = 0;
    for (int i = 0; i < n && !rc; i++) (void)kiln_gemv_bench_pass(rows[i].b); /* first touch, untimed */
    for (long r = 0; r < rounds && !rc; r++) {
        const double bw = kiln_membw_window_gbps(mb, pass);
        if (bw > best_bw) best_bw = bw;
        for (int i = 0; i < n; i++) rows[i].gbps[r] = kiln_gemv_bench_pass(rows[i].b);
        for (int i = 0; i < n; i++) { /* the shape's first format: the row nw·⌊i/nw⌋ */
            const double first = rows[i - i % nw].gbps[r];
            rows[i].ratio[r] = first > 0 ? rows[i].gbps[r] / first : 0.0;
        }
    }
    kiln_membw_close(mb);
    if (!rc && !json) {
        printf("kiln bench --gemv: %ld rounds, threads %d, >= %ld MB of weights per pass, measured read bandwidth %.1f GB/s (best round)\n",
               rounds, o.threads, mb_per_pass, best_bw);
        printf("| shape | weights | tokens | copies | MB per pass | GB/s median (p25-p75) | best GB/s | best, %% of measured | vs first row per round: median (p25-p75) |\n");
        printf("|---|---|---|---|---|---|---|---|---|\n");
    }
    for (int i = 0; i < n && !rc; i++) {
        double g[3], q[3], best = 0;
        cli_quartiles(rows[i].gbps, rounds, g);
        cli_quartiles(rows[i].ratio, rounds, q);
        for (long r = 0; r < rounds; r++) best = rows[i].gbps[r] > best ? rows[i].gbps[r] : best;
        const double mbp = kiln_gemv_bench_bytes(rows[i].b) / 1e6;
        if (json)
            printf("{\"shape\": \"%ldx%ld\", \"weights\": \"%s\", \"tokens\": %ld, \"copies\": %d, \"bytes_per_pass\": %llu, \"median_gbps\": %.3f, "
                   "\"p25_gbps\": %.3f, \"p75_gbps\": %.3f, \"best_gbps\": %.3f, \"measured_gbps\": %.3f, \"vs_first_median\": %.4f, "
                   "\"vs_first_p25\": %.4f, \"vs_first_p75\": %.4f}\n",
                   rows[i].rows, rows[i].cols, rows[i].weights, rows[i].tokens, kiln_gemv_bench_copies(rows[i].b),
                   (unsigned long long)kiln_gemv_bench_bytes(rows[i].b), g[1], g[0], g[2], best, best_bw, q[1], q[0], q[2]);
        else
            printf("| %ldx%ld | %s | %ld | %d | %.1f | %.1f (%.1f-%.1f) | %.1f | %.0f%% | %.3f (%.3f-%.3f) |\n", rows[i].rows, rows[i].cols,
                   rows[i].weights, rows[i].tokens, kiln_gemv_bench_copies(rows[i].b), mbp, g[1], g[0], g[2], best, best_bw > 0 ? 100 * best / best_bw : 0,
                   q[1], q[0], q[2]);
    }
    for (int i = 0; i < n; i++) {
        kiln_gemv_bench_close(rows[i].b);
        free(rows[i].gbps);
        free(rows[i].ratio);
    }
    return rc;
}

/* `kiln bench --attention [--kv-dtype bf16,fp8] [--ctx 4000] [--layers 16] [--kv-heads 8] [--head-dim
 * 128] [--rows 3] [--rounds 7] [--threads 1] [--isa ...] [--json]`: the attention kernels alone,
 * one thread unless --threads (each layer's heads spread over them, as in decode: the figure then
 * includes the threads' contention for memory) (kiln_attend_bench), over a cold synthetic KV of the 1.7B shape's geometry by default (16 layers,
 * 8 KV heads of 128, 3 query heads each), hashing off and on alternated round by round: ns per
 * position and KV head (median and quartiles), and the hash's cost per round. What it answers:
 * how fast the kernels walk a long context, and what the fused integrity hash adds to them, without
 * the weights' share of a decode step (docs/BENCHMARKS.md, "The attention kernels' prefetch"). */
int cmd_bench_attention(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *dtypes = "bf16,fp8";
    long ctx = 4000, layers = 16, kv_heads = 8, head_dim = 128, rows = 3, rounds = 7;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--attention") == 0) continue;
        if (strcmp(k, "--kv-dtype") == 0) dtypes = cli_value(&a);
        else if (strcmp(k, "--ctx") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &ctx);
        else if (strcmp(k, "--layers") == 0) cli_long(&a, k, cli_value(&a), 1, 256, &layers);
        else if (strcmp(k, "--kv-heads") == 0) cli_long(&a, k, cli_value(&a), 1, 256, &kv_heads);
        else if (strcmp(k, "--head-dim") == 0) cli_long(&a, k, cli_value(&a), 8, 256, &head_dim);
        else if (strcmp(k, "--rows") == 0) cli_long(&a, k, cli_value(&a), 1, 8, &rows);
        else if (strcmp(k, "--rounds") == 0) cli_long(&a, k, cli_value(&a), 1, 1000, &rounds);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (cli_common_option(&a, &o)) continue;
        else { fprintf(stderr, "kiln bench: error: --attention: unknown option or argument '%s'\n", k); return 2; }
    }
    if (a.bad || !dtypes) return 2;
    const int threads = o.threads > 0 ? o.threads : 1; /* one unless asked: the per-kernel figure */
    if (head_dim % 8) {
        fprintf(stderr, "kiln bench: error: --attention: --head-dim %ld is not a multiple of 8\n", head_dim);
        return 2;
    }
    double *off = malloc((size_t)rounds * sizeof *off), *on = malloc((size_t)rounds * sizeof *on), *cost = malloc((size_t)rounds * sizeof *cost);
    int rc = off && on && cost ? 0 : cli_fail_msg("bench", "--attention: out of memory");
    if (!rc && !json) {
        printf("kiln bench --attention: %d thread%s, %ld layers x %ld KV heads x %ld positions, head dim %ld, %ld query rows per call, pages shuffled, "
               "caches flushed before each pass, %ld rounds (hashing off then on)\n",
               threads, threads == 1 ? "" : "s", layers, kv_heads, ctx, head_dim, rows, rounds);
        printf("| KV | hashing off: ns per position and KV head, median (p25-p75) | hashing on | hash cost per round, median (p25-p75) |\n|---|---|---|---|\n");
    }
    char list[64];
    if (!rc && strlen(dtypes) >= sizeof list) rc = cli_fail_msg("bench", "--attention: --kv-dtype list too long");
    if (!rc) strcpy(list, dtypes);
    for (char *save = NULL, *t = rc ? NULL : strtok_r(list, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        const kiln_kv_dtype dt = strcmp(t, "bf16") == 0 ? KILN_KV_BF16 : strcmp(t, "fp8") == 0 ? KILN_KV_FP8 : strcmp(t, "f32") == 0 ? KILN_KV_F32 : KILN_KV_AUTO;
        if (dt == KILN_KV_AUTO) {
            fprintf(stderr, "kiln bench: error: --attention: --kv-dtype '%s' is not one of f32, bf16, fp8\n", t);
            rc = 2;
            break;
        }
        kiln_status st = kiln_attend_bench(o.isa, dt, (int)layers, (int)kv_heads, (int)head_dim, (int)ctx, (int)rows, (int)rounds, threads, off, on);
        if (st != KILN_OK) {
            fprintf(stderr, "kiln bench: error: --attention: %s\n", kiln_last_error());
            rc = 1;
            break;
        }
        for (long r = 0; r < rounds; r++) cost[r] = off[r] > 0 ? on[r] / off[r] - 1.0 : 0.0;
        double qo[3], qn[3], qc[3];
        cli_quartiles(off, rounds, qo);
        cli_quartiles(on, rounds, qn);
        cli_quartiles(cost, rounds, qc);
        if (json)
            printf("{\"kv\": \"%s\", \"ctx\": %ld, \"off_ns\": %.3f, \"off_p25\": %.3f, \"off_p75\": %.3f, \"on_ns\": %.3f, \"on_p25\": %.3f, "
                   "\"on_p75\": %.3f, \"cost\": %.4f, \"cost_p25\": %.4f, \"cost_p75\": %.4f, \"threads\": %d}\n",
                   t, ctx, qo[1], qo[0], qo[2], qn[1], qn[0], qn[2], qc[1], qc[0], qc[2], threads);
        else
            printf("| %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %+.1f%% (%+.1f%% to %+.1f%%) |\n", t, qo[1], qo[0], qo[2], qn[1], qn[0], qn[2],
                   100 * qc[1], 100 * qc[0], 100 * qc[2]);
    }
    free(off);
    free(on);
    free(cost);
    return rc;
}

/* `kiln bench MODEL --batch 1,4,16,32 [--weights fp8|int4|...|native] [--ctx 128] [--decode 16]
 * [--repeat R (3)] [--threads N] [--json]`: aggregate decode tokens/s of B sequences stepped
 * together (the server's batched decode: one weight read per step for all B tokens), each B the best
 * of R runs, B = 1 first so every ratio is measured in the same run. */
int cmd_bench_batch(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *path = NULL, *weights = "native", *list = NULL;
    long ctx = 128, steps = 16, repeat = 3;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--ctx") == 0) { /* each sequence's context here, not the --ctx cap of cli_common_option */
            cli_long(&a, k, cli_value(&a), 1, 1 << 20, &ctx);
            continue;
        }
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--batch") == 0) list = cli_value(&a);
        else if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "--decode") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 16, &steps);
        else if (strcmp(k, "--repeat") == 0) cli_long(&a, k, cli_value(&a), 1, 100, &repeat);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (k[0] == '-') { fprintf(stderr, "kiln bench: error: --batch: unknown option '%s'\n", k); return 2; }
        else path = k;
    }
    if (a.bad) return 2;
    if (!path || !list || !weights)
        return cli_fail_msg("bench", "usage: kiln bench MODEL --batch 1,4,16,32 [--weights fp8|int4|...|native] [--ctx 128] [--decode 16] [--repeat 3] [--threads N] [--json]");
    long bs[16];
    int nb = 0;
    char buf[256];
    if (strlen(list) >= sizeof buf) return cli_fail_msg("bench", "--batch: list longer than 255 characters");
    snprintf(buf, sizeof buf, "%s", list);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (nb == 16) return cli_fail_msg("bench", "--batch: at most 16 batch sizes");
        if (!cli_long(&a, "--batch", t, 1, 1024, &bs[nb])) return 2;
        nb++;
    }
    if (nb == 0) return cli_fail_msg("bench", "--batch: empty list");
    o.quiet = 1;
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(path, &o, &m);
    int kept = 0;
    if (st == KILN_OK && strcmp(weights, "native") != 0) st = kiln_model_requantize(m, weights, &kept);
    if (st == KILN_OK && strcmp(weights, "native") != 0) st = kiln_model_requantize_head(m, weights);
    double tps[16], one = 0;
    double t1 = 0;
    double ix = 0, at = 0; /* sparse attention per decode step, batch 1, of the fastest run */
    if (st == KILN_OK) st = kiln_bench_batched_decode(m, &o, 1, (int)ctx, (int)steps, &t1); /* batch 1, for the ratios */
    if (st == KILN_OK) kiln_bench_batched_sparse(&ix, &at);
    for (int r = 1; st == KILN_OK && r < repeat; r++) {
        double t;
        st = kiln_bench_batched_decode(m, &o, 1, (int)ctx, (int)steps, &t);
        if (t > t1) { t1 = t; kiln_bench_batched_sparse(&ix, &at); }
    }
    one = t1;
    for (int i = 0; st == KILN_OK && i < nb; i++) {
        tps[i] = 0;
        for (int r = 0; st == KILN_OK && r < repeat; r++) {
            double t;
            st = kiln_bench_batched_decode(m, &o, (int)bs[i], (int)ctx, (int)steps, &t);
            if (t > tps[i]) tps[i] = t;
        }
    }
    kiln_model_free(m);
    if (st) return cli_fail_status("bench", st);
    if (!json) {
        printf("model %s, weights %s, context %ld tokens per sequence, %ld decode steps (best of %ld), threads %d\n", path, weights, ctx, steps,
               repeat, o.threads);
        if (ix > 0 || at > 0)
            printf("sparse attention (batch 1, per decode step): indexer scan %.1f us, attention over the selection %.1f us\n", ix * 1e6, at * 1e6);
        printf("| batch | aggregate decode tok/s | per sequence tok/s | vs batch 1 |\n|---|---|---|---|\n");
    }
    for (int i = 0; i < nb; i++) {
        if (json)
            printf("{\"batch\": %ld, \"weights\": \"%s\", \"ctx\": %ld, \"aggregate_tps\": %.3f, \"per_sequence_tps\": %.3f, \"vs_batch1\": %.4f}\n",
                   bs[i], weights, ctx, tps[i], tps[i] / (double)bs[i], one > 0 ? tps[i] / one : 0.0);
        else
            printf("| %ld | %.1f | %.2f | %.2fx |\n", bs[i], tps[i], tps[i] / (double)bs[i], one > 0 ? tps[i] / one : 0.0);
    }
    return 0;
}
