/* cmd_bench.c — `kiln bench MODEL [--weights f32,bf16,fp8,int4] [--prompt N] [--gen N] [--json]`:
 * for each weight format in one run (the model re-loaded and quantized in memory each time, every
 * linear layer including the output head): prompt tokens/s, batch-1 decode tokens/s, weight bytes
 * read per decode token, achieved GB/s, and the machine's read bandwidth measured by the bench itself
 * with the same thread count (best of the measurements taken before each configuration).
 * --scope experts quantizes only the routed experts of MoE models (the rest stays as stored); the bytes
 * per token then count only the experts a token is routed to (kiln_model_decode_weight_bytes).
 * Other benchmarks: --kv-context (tools/cmd_kv.c), --integrity, --server, --tokenizer. */
#include "cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char weights[16];
    double prompt_tps, decode_tps, gbps_measured;
    unsigned long long bytes_per_token;
    int kept;
} bench_row;

static kiln_status bench_one(const char *path, const kiln_options *o, const char *weights, const char *scope, int n_prompt, int n_gen,
                             uint64_t seed, bench_row *r) {
    kiln_model *m;
    kiln_status st0 = kiln_model_load(path, o, &m);
    if (st0) return st0;
    kiln_status st = KILN_OK;
    kiln_session *s = NULL;
    int32_t *toks = NULL;
    if (strcmp(weights, "native") != 0) {
        if ((st = kiln_model_requantize_scope(m, weights, scope, &r->kept))) goto out;
        if (strcmp(scope, "all") == 0 && (st = kiln_model_requantize_head(m, weights))) goto out;
    }
    r->bytes_per_token = kiln_model_decode_weight_bytes(m);
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    if ((st = kiln_session_create(m, o, &s))) goto out;
    toks = malloc(sizeof *toks * (size_t)n_prompt);
    uint64_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n_prompt; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; toks[i] = (int32_t)((x >> 33) % (uint64_t)info.vocab_size); }
    r->gbps_measured = kiln_memory_read_gbps(o->threads);
    double t0 = kiln_now();
    if ((st = kiln_session_eval(s, toks, n_prompt, NULL))) goto out;
    double t1 = kiln_now();
    const float *lg = kiln_session_logits(s);
    for (int i = 0; i < n_gen; i++) { /* greedy decode */
        int32_t best = 0;
        for (int v = 1; v < info.vocab_size; v++) if (lg[v] > lg[best]) best = v;
        if ((st = kiln_session_eval(s, &best, 1, NULL))) goto out;
        lg = kiln_session_logits(s);
    }
    double t2 = kiln_now();
    r->prompt_tps = n_prompt / (t1 - t0);
    r->decode_tps = n_gen / (t2 - t1);
out:
    free(toks);
    kiln_session_free(s);
    kiln_model_free(m);
    return st;
}

int cmd_bench(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *path = NULL, *weights = "f32,bf16,fp8,int4", *scope = "all";
    long n_prompt = 128, n_gen = 64, seed = 1;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "--prompt") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &n_prompt);
        else if (strcmp(k, "--gen") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &n_gen);
        else if (strcmp(k, "--seed") == 0) cli_long(&a, k, cli_value(&a), 0, 1L << 30, &seed);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (strcmp(k, "--scope") == 0) scope = cli_value(&a);
        else if (k[0] == '-') { fprintf(stderr, "kiln bench: error: unknown option '%s'\n", k); return 2; }
        else if (!path) path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!path) return cli_fail_msg("bench", "usage: kiln bench MODEL [--weights f32,bf16,fp8,int4|native] [--scope all|experts] [--prompt N] [--gen N] [--threads N] [--json]");
    char list[256];
    snprintf(list, sizeof list, "%s", weights ? weights : "");
    bench_row rows[16];
    int n = 0;
    double best_bw = 0;
    for (char *w = strtok(list, ","); w && n < 16; w = strtok(NULL, ",")) {
        if (strcmp(w, "f32") && strcmp(w, "bf16") && strcmp(w, "fp8") && strcmp(w, "int4") && strcmp(w, "native")) {
            fprintf(stderr, "kiln bench: error: option --weights: '%s' is not one of f32, bf16, fp8, int4, native\n", w);
            return 2;
        }
        bench_row *r = &rows[n];
        memset(r, 0, sizeof *r);
        snprintf(r->weights, sizeof r->weights, "%s", w);
        kiln_status st = bench_one(path, &o, w, scope ? scope : "all", (int)n_prompt, (int)n_gen, (uint64_t)seed, r);
        if (st) return cli_fail_status("bench", st);
        if (r->gbps_measured > best_bw) best_bw = r->gbps_measured;
        if (!json) fprintf(stderr, "bench: %s done (%.1f decode tok/s)\n", w, r->decode_tps);
        n++;
    }
    if (!json) {
        printf("model %s, scope %s, prompt %ld tokens, decode %ld tokens, threads %d, measured read bandwidth %.1f GB/s\n", path, scope,
               n_prompt, n_gen, o.threads, best_bw);
        printf("| weights | prompt tok/s | decode tok/s | weight MB/token | achieved GB/s | %% of measured | vs first |\n");
        printf("|---|---|---|---|---|---|---|\n");
    }
    for (int i = 0; i < n; i++) {
        bench_row *r = &rows[i];
        double achieved = (double)r->bytes_per_token * r->decode_tps / 1e9;
        if (json)
            printf("{\"weights\": \"%s\", \"prompt_tps\": %.3f, \"decode_tps\": %.3f, \"weight_bytes_per_token\": %llu, "
                   "\"achieved_gbps\": %.3f, \"measured_gbps\": %.3f, \"roofline_fraction\": %.4f, \"layers_kept\": %d}\n",
                   r->weights, r->prompt_tps, r->decode_tps, r->bytes_per_token, achieved, best_bw, achieved / best_bw, r->kept);
        else
            printf("| %s | %.1f | %.2f | %.1f | %.2f | %.0f%% | %.2fx |\n", r->weights, r->prompt_tps, r->decode_tps,
                   r->bytes_per_token / 1e6, achieved, 100 * achieved / best_bw, r->decode_tps / rows[0].decode_tps);
    }
    return 0;
}
