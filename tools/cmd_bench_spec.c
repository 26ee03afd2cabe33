/* cmd_bench_spec.c — `kiln bench MODEL --spec off,ngram,oracle,wrong[,mtp] [--spec-k 1,2,4]
 * [--spec-ngram 3] [--weights W] [-p TEXT | --prompt N] [--gen N] [--repeat R] [--threads N] [--json]`:
 * speculative decoding's speed against plain decoding on one sequence (issue 25; docs/SPECULATIVE.md).
 * Each round runs every (drafter, k) back to back from the same prompt, greedy, through
 * kiln_spec_generate (`off` is the same loop with no drafts): tokens/s, drafted and accepted tokens,
 * tokens per verifying forward, and the paired ratio to `off` (per round, then the median over
 * rounds: adjacent windows of a shared host). The drafters beyond run / serve's are for measurement
 * only: `oracle` proposes the known greedy continuation (every draft right: the ceiling of a perfect
 * drafter) and `wrong` that continuation + 1 (every draft wrong: the worst-case overhead, the cost of
 * verifying k useless tokens). Every run's tokens must equal `off`'s (greedy speculation keeps the
 * output): a difference is reported as an error naming the drafter and position.
 * The prompt: -p TEXT (models with a tokenizer), else --prompt N tokens of an agent-like repetitive
 * context (a block of pseudo-random ids, then the block again with a few ids changed: what prompt
 * lookup is for). */
#include "kiln_test.h"
#include "cli.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_MODES = 8, MAX_KS = 6 };
/* --spec names, indexed by kiln_drafter_kind */
static const char *const drafter_names[] = {[KILN_DRAFT_NONE] = "off", [KILN_DRAFT_NGRAM] = "ngram", [KILN_DRAFT_MTP] = "mtp",
                                            [KILN_DRAFT_ORACLE] = "oracle", [KILN_DRAFT_WRONG] = "wrong"};
#define N_DRAFTERS ((int)(sizeof drafter_names / sizeof drafter_names[0]))

typedef struct {
    kiln_drafter_kind drafter;
    int k;
    double best_tps, *round_tps;
    kiln_spec_stats last;
} spec_row;

typedef struct {
    int32_t *out;
    long n, cap;
} collect;
static void collect_token(void *ud, int32_t tok, long generated) {
    (void)generated;
    collect *c = ud;
    if (c->n < c->cap) c->out[c->n] = tok;
    c->n++;
}

/* --spec LIST → drafter kinds; 0 (and an error naming the value) on an unknown name */
static int parse_modes(const char *list, kiln_drafter_kind *modes, int *n) {
    char buf[128];
    if (strlen(list) >= sizeof buf) return 0;
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    *n = 0;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < N_DRAFTERS; i++)
            if (strcmp(t, drafter_names[i]) == 0) found = i;
        if (found < 0 || *n == MAX_MODES) {
            fprintf(stderr, "kiln bench: error: option --spec: '%s' is not one of off, ngram, mtp, oracle, wrong (at most %d)\n", t, MAX_MODES);
            return 0;
        }
        modes[(*n)++] = (kiln_drafter_kind)found;
    }
    return *n > 0;
}

int cmd_bench_spec(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *path = NULL, *weights = NULL, *spec = NULL, *ks = "1", *text = NULL;
    long n_prompt = 256, n_gen = 64, repeat = 3, ngram = 3;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--spec") == 0) spec = cli_value(&a);
        else if (strcmp(k, "--spec-k") == 0) ks = cli_value(&a);
        else if (strcmp(k, "--spec-ngram") == 0) cli_long(&a, k, cli_value(&a), 1, 16, &ngram);
        else if (strcmp(k, "--weights") == 0) weights = cli_value(&a);
        else if (strcmp(k, "-p") == 0) text = cli_value(&a);
        else if (strcmp(k, "--prompt") == 0) cli_long(&a, k, cli_value(&a), 8, 1 << 16, &n_prompt);
        else if (strcmp(k, "--gen") == 0) cli_long(&a, k, cli_value(&a), 2, 1 << 16, &n_gen);
        else if (strcmp(k, "--repeat") == 0) cli_long(&a, k, cli_value(&a), 1, 1000, &repeat);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (k[0] == '-') { fprintf(stderr, "kiln bench: error: --spec: unknown option '%s'\n", k); return 2; }
        else if (!path) path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad || !spec || !ks) return 2;
    if (!path) return cli_fail_msg("bench", "usage: kiln bench MODEL --spec off,ngram,oracle,wrong[,mtp] [--spec-k 1,2,4] [--weights W] [-p TEXT | --prompt N] [--gen N] [--repeat R]");
    kiln_drafter_kind modes[MAX_MODES];
    int nm = 0, kv[MAX_KS], nk = 0, want_mtp = 0;
    if (!parse_modes(spec, modes, &nm)) return 2;
    {
        char buf[64];
        if (strlen(ks) >= sizeof buf) return cli_fail_msg("bench", "--spec-k: list longer than 63 characters");
        snprintf(buf, sizeof buf, "%s", ks);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            long v;
            if (nk == MAX_KS) return cli_fail_msg("bench", "--spec-k: at most 6 values");
            if (!cli_long(&a, "--spec-k", t, 1, 16, &v)) return 2;
            kv[nk++] = (int)v;
        }
        if (nk == 0) return cli_fail_msg("bench", "--spec-k: empty list");
    }
    /* rows: `off` once (first: the oracle and the ratios come from it), each other drafter × each k */
    spec_row rows[1 + MAX_MODES * MAX_KS];
    int nr = 0;
    memset(rows, 0, sizeof rows);
    rows[nr++] = (spec_row){.drafter = KILN_DRAFT_NONE, .k = 1};
    for (int i = 0; i < nm; i++) {
        if (modes[i] == KILN_DRAFT_NONE) continue;
        want_mtp |= modes[i] == KILN_DRAFT_MTP;
        for (int j = 0; j < nk; j++) rows[nr++] = (spec_row){.drafter = modes[i], .k = kv[j]};
    }
    kiln_model *m = NULL;
    kiln_session *s = NULL;
    kiln_sampler *smp = NULL;
    int32_t *prompt = NULL, *oracle = NULL, *got = NULL;
    int rc = 0;
    char err[256] = "";
#define FAIL(code, ...) (snprintf(err, sizeof err, __VA_ARGS__), (kiln_status)(code))
    kiln_status st = kiln_model_load(path, &o, &m);
    if (!st && weights && strcmp(weights, "native") != 0) {
        int kept = 0;
        st = kiln_model_requantize_scope(m, weights, "all", &kept);
        if (!st) st = kiln_model_requantize_head(m, weights);
    }
    kiln_model_info info;
    if (!st) {
        kiln_model_get_info(m, &info);
        st = kiln_session_create(m, &o, &s);
    }
    if (!st && want_mtp) st = kiln_session_spec_mtp(s);
    /* the prompt */
    int np = 0;
    if (!st && text) {
        if (!info.has_tokenizer) st = FAIL(KILN_ERR_INVALID_ARG, "-p: the model %s has no tokenizer (use --prompt N)", path);
        size_t need = 0;
        if (!st) st = kiln_tokenize(m, text, strlen(text), 1, NULL, 0, &need);
        if (!st && !(prompt = malloc((need + 1) * sizeof *prompt))) st = FAIL(KILN_ERR_NOMEM, "out of memory");
        if (!st) st = kiln_tokenize(m, text, strlen(text), 1, prompt, need, &need);
        np = (int)need;
        if (!st && np < 2) st = FAIL(KILN_ERR_INVALID_ARG, "-p: the prompt is %d token(s); at least 2 are needed", np);
    } else if (!st) {
        np = (int)n_prompt;
        if (!(prompt = malloc((size_t)np * sizeof *prompt))) st = FAIL(KILN_ERR_NOMEM, "out of memory");
        uint64_t x = 0x9E3779B97F4A7C15ull;
        const int half = np / 2;
        for (int i = 0; !st && i < np; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const int32_t r = (int32_t)((x >> 33) % (uint64_t)info.vocab_size);
            /* the second half repeats the first, one id in 16 changed (an edited copy of a file) */
            prompt[i] = i < half || (i - half) % 16 == 7 ? r : prompt[i - half];
        }
    }
    if (!st && np + n_gen + 16 > info.max_context)
        st = FAIL(KILN_ERR_INVALID_ARG, "prompt %d + --gen %ld tokens exceed the model's context %d", np, n_gen, info.max_context);
    if (!st && !(oracle = malloc((size_t)n_gen * sizeof *oracle))) st = FAIL(KILN_ERR_NOMEM, "out of memory");
    if (!st && !(got = malloc((size_t)n_gen * sizeof *got))) st = FAIL(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < nr; i++)
        if (!(rows[i].round_tps = calloc((size_t)repeat, sizeof(double)))) st = FAIL(KILN_ERR_NOMEM, "out of memory");
    /* the prompt but its last token; every run (the first too) then evaluates that token alone, so
     * all start from the same logits — a prefill's last row and a 1-token step's can differ in their
     * last bits (BF16 prefill GEMMs round activations), which a near-tie turns into another first
     * token (seen on a rewired glm4_moe_lite checkpoint) */
    if (!st && np > 1) st = kiln_session_eval(s, prompt, np - 1, NULL);
    kiln_sampling sp;
    kiln_sampling_default(&sp);
    sp.temperature = 0; /* greedy */
    long n_oracle = 0;
    for (long r = 0; !st && r < repeat; r++)
        for (int i = 0; !st && i < nr; i++) {
            /* back to the prompt: its last token evaluated (again) for the logits to start from */
            st = kiln_session_truncate(s, np - 1);
            if (!st) st = kiln_session_eval(s, &prompt[np - 1], 1, NULL);
            if (st) break;
            kiln_sampler_free(smp);
            smp = NULL;
            if ((st = kiln_sampler_create(&sp, info.vocab_size, &smp))) break;
            collect c = {r == 0 && i == 0 ? oracle : got, 0, n_gen};
            const kiln_spec_cfg cfg = {rows[i].drafter, rows[i].k, (int)ngram, info.vocab_size, oracle, (int)n_oracle};
            const kiln_spec_hooks hooks = {&c, collect_token, NULL, NULL, NULL, 0};
            const double t0 = kiln_now();
            st = kiln_spec_generate(s, smp, &info, prompt, np, n_gen, &cfg, &hooks, &rows[i].last);
            const double dt = kiln_now() - t0;
            if (st) break;
            const double tps = dt > 0 ? (double)rows[i].last.generated / dt : 0;
            rows[i].round_tps[r] = tps;
            if (tps > rows[i].best_tps) rows[i].best_tps = tps;
            if (r == 0 && i == 0) { n_oracle = c.n; continue; }
            if (c.n != n_oracle || memcmp(got, oracle, (size_t)(c.n < n_gen ? c.n : n_gen) * sizeof *got) != 0) {
                long at = 0;
                while (at < c.n && at < n_oracle && got[at] == oracle[at]) at++;
                st = FAIL(KILN_ERR_INTERNAL, "--spec %s k %d: greedy output differs from off at generated token %ld (%ld vs %ld tokens)",
                               drafter_names[rows[i].drafter],
                               rows[i].k, at, c.n, n_oracle);
            }
        }
    if (st) rc = err[0] ? cli_fail_msg("bench", err) : cli_fail_status("bench", st);
#undef FAIL
    else {
        if (!json)
            printf("kiln bench --spec: %s, prompt %d tokens, %ld generated (greedy; identical to off in every run), %ld rounds, threads %s\n"
                   "| drafter | k | tok/s (best) | vs off, paired median | drafted | accepted | acceptance | tokens per forward |\n"
                   "|---|---|---|---|---|---|---|---|\n",
                   weights ? weights : "native", np, n_oracle, repeat, o.threads > 0 ? (snprintf(err, sizeof err, "%d", o.threads), err) : "auto");
        for (int i = 0; i < nr; i++) {
            double *v = malloc((size_t)repeat * sizeof *v), q[3] = {0, 0, 0};
            if (v) {
                for (long r = 0; r < repeat; r++) v[r] = rows[0].round_tps[r] > 0 ? rows[i].round_tps[r] / rows[0].round_tps[r] : 0;
                cli_quartiles(v, repeat, q);
                free(v);
            }
            const double med = q[1];
            const kiln_spec_stats *l = &rows[i].last;
            const char *name = drafter_names[rows[i].drafter];
            const double acc = l->drafted ? (double)l->accepted / (double)l->drafted : 0, tpf = l->verifies ? (double)(l->accepted + l->verifies) / (double)l->verifies : 0;
            if (json)
                printf("{\"drafter\": \"%s\", \"k\": %d, \"best_tps\": %.3f, \"vs_off_paired_median\": %.4f, \"drafted\": %ld, \"accepted\": %ld, "
                       "\"acceptance\": %.4f, \"tokens_per_forward\": %.4f, \"generated\": %ld, \"verifies\": %ld}\n",
                       name, rows[i].drafter ? rows[i].k : 0, rows[i].best_tps, med, l->drafted, l->accepted, acc, tpf, l->generated, l->verifies);
            else if (!rows[i].drafter)
                printf("| off | — | %.2f | 1.000 | — | — | — | 1.00 |\n", rows[i].best_tps);
            else
                printf("| %s | %d | %.2f | %.3f | %ld | %ld | %.0f%% | %.2f |\n", name, rows[i].k, rows[i].best_tps, med, l->drafted, l->accepted, 100 * acc, tpf);
        }
    }
    for (int i = 0; i < nr; i++) free(rows[i].round_tps);
    free(prompt);
    free(oracle);
    free(got);
    kiln_sampler_free(smp);
    kiln_session_free(s);
    kiln_model_free(m);
    return rc;
}
