/* test_eval.c — the evaluation harness (src/eval) on hand-made cases whose answers are worked out
 * by hand in the comments, not by the code under test:
 *   - scorers: log-probabilities, KL of known distributions, quantiles, the acc / acc_norm choice;
 *   - GSM8K answer extraction and normalisation on tricky strings (the lm-evaluation-harness
 *     regexes), stop strings;
 *   - prompt formats: MMLU against a hand-written expected string, ARC / PIQA / OpenBookQA /
 *     Winogrande (partial evaluation) examples from JSON, malformed objects rejected;
 *   - the runners on fake models (a byte tokenizer, logits given in closed form): perplexity of a
 *     uniform model = vocabulary size, of a model that gives the right token probability 1/2 = 2,
 *     KL and top-1 agreement through a saved baseline file, multiple choice acc / acc_norm with a
 *     malformed line skipped (or failing under strict), MMLU macro / micro averages, GSM8K
 *     generation with strict / flexible extraction; prefix reuse counted;
 *   - kiln_session_truncate on stories260K against a fresh session (skipped without ../shared). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "eval/eval.h"
#include "base/status.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char shared_dir[1024];
static char tmpdir[1100];

/* ---- scorers ----------------------------------------------------------------------------------- */
static void test_logprob(void **state) {
    (void)state;
    float z[7] = {0};
    /* uniform over 7: log(1/7) */
    assert_true(fabs(eval_logprob(z, 7, 3) - log(1.0 / 7)) < 1e-12);
    /* logits (ln 1, ln 2, ln 5) = probabilities (0.125, 0.25, 0.625) */
    float l[3] = {0, (float)log(2.0), (float)log(5.0)};
    assert_true(fabs(eval_logprob(l, 3, 2) - log(0.625)) < 1e-6);
    /* a large shift changes nothing (max subtracted) */
    float s[3] = {1000, 1000 + (float)log(2.0), 1000 + (float)log(5.0)};
    assert_true(fabs(eval_logprob(s, 3, 0) - log(0.125)) < 1e-4);
    float out[3];
    eval_log_softmax(l, 3, out);
    assert_true(fabs(out[1] - log(0.25)) < 1e-6);
}

static void test_kl_known(void **state) {
    (void)state;
    /* P = (1/2, 1/4, 1/4), Q = (1/4, 1/2, 1/4):
     * KL(P||Q) = 1/2 ln 2 + 1/4 ln(1/2) + 0 = 1/4 ln 2;  KL(Q||P) = 1/4 ln(1/2) + 1/2 ln 2 = 1/4 ln 2 */
    float p[3] = {(float)log(0.5), (float)log(0.25), (float)log(0.25)};
    float q[3] = {(float)log(0.25), (float)log(0.5), (float)log(0.25)};
    assert_true(fabs(eval_kl(p, q, 3) - 0.25 * log(2.0)) < 1e-7);
    assert_true(fabs(eval_kl(q, p, 3) - 0.25 * log(2.0)) < 1e-7);
    assert_true(eval_kl(p, p, 3) == 0.0);
    /* P = (1, 0): only the first term; KL = ln(1 / q0) with q0 = 0.25 */
    float p1[2] = {0, -INFINITY}, q1[2] = {(float)log(0.25), (float)log(0.75)};
    assert_true(fabs(eval_kl(p1, q1, 2) - log(4.0)) < 1e-6);
    float t[5] = {1, 3, 3, -2, 0};
    assert_int_equal(eval_argmax(t, 5), 1); /* first of the tied maxima */
}

static void test_quantiles(void **state) {
    (void)state;
    double a[4] = {1, 2, 3, 4};
    assert_true(fabs(eval_quantile_sorted(a, 4, 0.5) - 2.5) < 1e-12);   /* numpy.median */
    assert_true(fabs(eval_quantile_sorted(a, 4, 0.99) - 3.97) < 1e-12); /* 0.99·3 = 2.97 → 3 + 0.97 */
    assert_true(eval_quantile_sorted(a, 4, 1.0) == 4);
    double b[3] = {0, 10, 20};
    assert_true(eval_quantile_sorted(b, 3, 0.5) == 10);
    assert_true(eval_quantile_sorted(b, 1, 0.99) == 0);
    assert_true(eval_quantile_sorted(b, 0, 0.5) == 0);
    /* lm-eval stderr: p = 0.5 over 5 → sqrt(0.25 / 4) = 0.25 */
    assert_true(fabs(eval_acc_stderr(0.5, 5) - 0.25) < 1e-12);
}

static void test_mc_pick(void **state) {
    (void)state;
    /* ll -10 over 10 bytes (-1/byte) vs -12 over 20 bytes (-0.6/byte): acc picks 0, acc_norm 1 */
    double ll[2] = {-10, -12};
    size_t len[2] = {10, 20};
    int a, b;
    eval_mc_pick(ll, len, 2, &a, &b);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    /* ties go to the first choice (numpy.argmax) */
    double t[3] = {-3, -1, -1};
    size_t tl[3] = {1, 1, 1};
    eval_mc_pick(t, tl, 3, &a, &b);
    assert_int_equal(a, 1);
    assert_int_equal(b, 1);
}

/* ---- GSM8K -------------------------------------------------------------------------------------- */
static void check_strict(const char *gen, eval_gsm_style st, const char *want) {
    char out[64];
    int got = eval_gsm8k_strict(gen, st, out, sizeof out);
    if (!want) { assert_int_equal(got, 0); return; }
    assert_int_equal(got, 1);
    eval_gsm8k_normalize(out);
    assert_string_equal(out, want);
}
static void check_flex(const char *gen, const char *want) {
    char out[64];
    int got = eval_gsm8k_flexible(gen, out, sizeof out);
    if (!want) { assert_int_equal(got, 0); return; }
    assert_int_equal(got, 1);
    eval_gsm8k_normalize(out);
    assert_string_equal(out, want);
}

static void test_gsm8k_extract(void **state) {
    (void)state;
    /* "The answer is (\-?[0-9\.\,]+)." — the final "." is any character: "1,234." is matched as
     * "1,234" + "." at the end of the text; commas and the trailing period are then ignored. */
    check_strict("So 1000 + 234 = 1234. The answer is 1,234.", EVAL_GSM_COT, "1234");
    check_strict("The answer is 9.\n\nQ: next", EVAL_GSM_COT, "9"); /* group "9." then "\n"; "." dropped */
    check_strict("The answer is -3.", EVAL_GSM_COT, "-3");
    check_strict("The answer is 5 and The answer is 6.", EVAL_GSM_COT, "5"); /* first match */
    check_strict("The answer is $18.", EVAL_GSM_COT, NULL); /* "$" is not in the class */
    check_strict("the answer is 4.", EVAL_GSM_COT, NULL);   /* case matters in the pattern */
    check_strict("He pays 3 + 4 = 7\n#### 72", EVAL_GSM_HASH, "72");
    check_strict("#### -3.5", EVAL_GSM_HASH, "-3.5");
    check_strict("The answer is 72.", EVAL_GSM_HASH, NULL);
    /* flexible: last match of (-?[$0-9.,]{2,})|(-?[0-9]+): "3" (second group), "12," then "-15." */
    check_flex("I have 3 apples and 12, pears, total -15.", "-15");
    check_flex("costs $1,000.50 in total", "1000.50");
    check_flex("answer: 7", "7");
    check_flex("The answer is $18.00.", "18.00"); /* only one trailing period is ignored */
    check_flex("no numbers here", NULL);
    check_flex("x = 4\n#### 40", "40");
    char t[32];
    assert_int_equal(eval_gsm8k_target("a\n#### 1,000", t, sizeof t), 1);
    assert_string_equal(t, "1000");
    assert_int_equal(eval_gsm8k_target("no marker", t, sizeof t), 0);
    char n[] = "Step #### 42";
    eval_gsm8k_normalize(n);
    assert_string_equal(n, "42");
    char u[] = "ABC.\n";
    eval_gsm8k_normalize(u);
    assert_string_equal(u, "abc\n");
    static const char *const stops[] = {"Q:", "</s>", NULL};
    const char *g = " The answer is 5.\n\nQ: What";
    assert_int_equal(eval_stop_at(g, strlen(g), stops), 19);
    assert_int_equal(eval_stop_at("abc", 3, stops), 3);
}

/* ---- prompts ------------------------------------------------------------------------------------ */
static void test_mmlu_prompt(void **state) {
    (void)state;
    char q1[] = "What is 1+1?", q2[] = "  Which is a fruit?\n", q3[] = "Pick C.";
    eval_mmlu_row shots[2] = {{q1, {"1", "2", "3", "4"}, 1}, {q2, {"apple", "rock", "car", "sky"}, 0}};
    eval_mmlu_row q = {q3, {"a", "b", "c", "d"}, 2};
    char *p = eval_mmlu_prompt("high_school_biology", shots, 2, &q);
    const char *want =
        "The following are multiple choice questions (with answers) about high school biology.\n\n"
        "What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
        "Which is a fruit?\nA. apple\nB. rock\nC. car\nD. sky\nAnswer: A\n\n"
        "Pick C.\nA. a\nB. b\nC. c\nD. d\nAnswer:";
    assert_string_equal(p, want);
    free(p);
    p = eval_mmlu_prompt("anatomy", NULL, 0, &q);
    assert_string_equal(p, "The following are multiple choice questions (with answers) about anatomy.\n\n"
                           "Pick C.\nA. a\nB. b\nC. c\nD. d\nAnswer:");
    free(p);
}

static eval_mc mc_of(const char *task, const char *json, int expect_ok, const char *why_has) {
    json_error_t e;
    json_t *o = json_loads(json, 0, &e);
    assert_non_null(o);
    eval_mc m;
    char why[256] = "";
    int ok = eval_mc_from_json(task, o, &m, why, sizeof why);
    json_decref(o);
    assert_int_equal(ok, expect_ok);
    if (why_has) assert_non_null(strstr(why, why_has));
    return m;
}

static void test_mc_formats(void **state) {
    (void)state;
    eval_mc m = mc_of("arc_easy", "{\"query\": \"Question: Which?\", \"choices\": [\"a b\", \"cc\"], \"gold\": 1}", 1, NULL);
    assert_int_equal(m.n_choices, 2);
    assert_int_equal(m.gold, 1);
    assert_string_equal(m.ctx[0], "Question: Which?\nAnswer:");
    assert_string_equal(m.ctx[1], "Question: Which?\nAnswer:");
    assert_string_equal(m.cont[0], " a b");
    assert_int_equal(m.norm_len[0], 3);
    eval_mc_free(&m);
    m = mc_of("piqa", "{\"query\": \"Question: dresser\\n\", \"choices\": [\"x\", \"y\"], \"gold\": 0}", 1, NULL);
    assert_string_equal(m.ctx[1], "Question: dresser\nAnswer:");
    assert_string_equal(m.cont[1], " y");
    eval_mc_free(&m);
    m = mc_of("openbook_qa", "{\"query\": \"Predators eat\", \"choices\": [\"lions\", \"bunnies\"], \"gold\": 1}", 1, NULL);
    assert_string_equal(m.ctx[0], "Predators eat");
    assert_string_equal(m.cont[1], " bunnies");
    assert_int_equal(m.norm_len[1], 7);
    eval_mc_free(&m);
    /* winogrande: the option fills the blank in the context; the rest of the sentence is scored */
    m = mc_of("winogrande", "{\"context_options\": [\"Sarah beat Maria so Sarah\", \"Sarah beat Maria so Maria\"], "
                            "\"continuation\": \"was sad.\", \"gold\": 1}", 1, NULL);
    assert_string_equal(m.ctx[0], "Sarah beat Maria so Sarah");
    assert_string_equal(m.ctx[1], "Sarah beat Maria so Maria");
    assert_string_equal(m.cont[0], " was sad.");
    assert_string_equal(m.cont[1], " was sad.");
    eval_mc_free(&m);
    /* UTF-8 choice: acc_norm length counts bytes ("é" is 2) */
    m = mc_of("openbook_qa", "{\"query\": \"q\", \"choices\": [\"caf\\u00e9\", \"x\"], \"gold\": 0}", 1, NULL);
    assert_int_equal(m.norm_len[0], 5);
    eval_mc_free(&m);
    mc_of("arc_easy", "{\"query\": \"q\", \"choices\": [\"a\", \"b\"], \"gold\": 2}", 0, "gold");
    mc_of("arc_easy", "{\"query\": \"q\", \"choices\": [\"a\"], \"gold\": 0}", 0, "choices");
    mc_of("arc_easy", "{\"query\": 5, \"choices\": [\"a\", \"b\"], \"gold\": 0}", 0, "query");
    mc_of("piqa", "{\"query\": \"q\", \"choices\": [\"a\", 3], \"gold\": 0}", 0, "choices\"[1]");
    mc_of("winogrande", "{\"context_options\": [\"a\", \"b\"], \"gold\": 0}", 0, "continuation");
    mc_of("arc_easy", "[1, 2]", 0, "object");
}

/* ---- the fake model ------------------------------------------------------------------------------ */
/* Byte tokenizer: token = byte + 3; 1 = BOS, 2 = EOS. Logits come from fake.fn(history). */
#define FV 259
typedef struct fake {
    int32_t hist[65536];
    int len;
    long evaluated; /* tokens run through eval (to count prefix reuse) */
    int refuse;     /* truncate to 0 < n < len fails with UNSUPPORTED (like dynamic FP8 KV) */
    void (*fn)(const struct fake *f, float *logits);
    float last[FV];
} fake;

static kiln_status f_tokenize(void *ctx, const char *text, size_t len, int add_bos, int32_t **ids, int *n) {
    (void)ctx;
    int32_t *v = malloc((len + 1) * sizeof *v);
    int k = 0;
    if (add_bos) v[k++] = 1;
    for (size_t i = 0; i < len; i++) v[k++] = (unsigned char)text[i] + 3;
    *ids = v;
    *n = k;
    return KILN_OK;
}
static const char *f_piece(void *ctx, int32_t prev, int32_t id, size_t *len) {
    (void)ctx;
    (void)prev;
    static char bytes[256];
    static int init;
    if (!init) { for (int i = 0; i < 256; i++) bytes[i] = (char)i; init = 1; }
    if (id < 3 || id >= FV) { *len = 0; return id >= 0 && id < FV ? "" : NULL; }
    *len = 1;
    return &bytes[id - 3];
}
static kiln_status f_eval(void *ctx, const int32_t *tok, int n, float *logits) {
    fake *f = ctx;
    for (int i = 0; i < n; i++) {
        f->hist[f->len++] = tok[i];
        f->evaluated++;
        f->fn(f, logits ? logits + (size_t)i * FV : f->last);
        if (logits && i == n - 1) memcpy(f->last, logits + (size_t)i * FV, sizeof f->last);
    }
    return KILN_OK;
}
static const float *f_last(void *ctx) { return ((fake *)ctx)->last; }
static kiln_status f_truncate(void *ctx, int n) {
    fake *f = ctx;
    assert_true(n >= 0 && n <= f->len);
    if (f->refuse && n > 0 && n < f->len) return kiln_fail(KILN_ERR_UNSUPPORTED, "fake: no roll-back");
    f->len = n;
    return KILN_OK;
}

static void fake_lm(eval_lm *lm, fake *f, int n_ctx) {
    memset(lm, 0, sizeof *lm);
    lm->ctx = f;
    lm->vocab = FV;
    lm->n_ctx = n_ctx;
    lm->bos = 1;
    lm->eos = 2;
    lm->tokenize = f_tokenize;
    lm->piece = f_piece;
    lm->eval = f_eval;
    lm->last_logits = f_last;
    lm->truncate = f_truncate;
}

static void fn_uniform(const fake *f, float *lg) { (void)f; memset(lg, 0, FV * sizeof *lg); }

/* Next letter of the chain: letter index (prev · 7 + 3) mod 26, as a token. */
static int32_t chain_next(int32_t prev) { return 'a' + (prev * 7 + 3) % 26 + 3; }
/* The right next token gets logit ln(V − 1), every other 0: p = (V−1) / (2(V−1)) = 1/2. */
static void fn_half(const fake *f, float *lg) {
    memset(lg, 0, FV * sizeof *lg);
    lg[chain_next(f->hist[f->len - 1])] = (float)log(FV - 1.0);
}
/* Token 5 gets ln 3: q5 = 3 / (V + 2), others 1 / (V + 2). */
static void fn_peak5(const fake *f, float *lg) {
    (void)f;
    memset(lg, 0, FV * sizeof *lg);
    lg[5] = (float)log(3.0);
}
/* 'x' gets ln 3 (p = 3/(V+2)); everything else 1/(V+2). */
static void fn_likes_x(const fake *f, float *lg) {
    (void)f;
    memset(lg, 0, FV * sizeof *lg);
    lg['x' + 3] = (float)log(3.0);
}
/* 'C' gets ln 3 (MMLU: always answers C). */
static void fn_likes_C(const fake *f, float *lg) {
    (void)f;
    memset(lg, 0, FV * sizeof *lg);
    lg['C' + 3] = (float)log(3.0);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}
static void mkdirs(const char *p) {
    char b[1200];
    snprintf(b, sizeof b, "%s", p);
    for (char *s = b + 1; *s; s++)
        if (*s == '/') { *s = 0; mkdir(b, 0755); *s = '/'; }
    mkdir(b, 0755);
}

static const kiln_eval_metric *metric(const eval_results *r, const char *sub, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->m[i].sub, sub) == 0 && strcmp(r->m[i].name, name) == 0) return &r->m[i];
    fail_msg("metric %s/%s missing", sub, name);
    return NULL;
}

/* warnings captured */
static char warned[4096];
static void cap_warn(void *ud, const char *msg) {
    (void)ud;
    strncat(warned, msg, sizeof warned - strlen(warned) - 2);
    strcat(warned, "\n");
}

static void params(kiln_eval_params *p) {
    kiln_eval_params_default(p);
    p->data_dir = tmpdir;
    p->warn = cap_warn;
    warned[0] = 0;
}

/* ---- perplexity / KL ----------------------------------------------------------------------------- */
static void test_ppl_uniform(void **state) {
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/text.txt", tmpdir);
    write_file(path, "Once upon a time there was a tiny model that knew nothing at all about words.\r\nThe end.\n");
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_uniform;
    eval_lm lm;
    fake_lm(&lm, &f, 16); /* windows of 16 tokens, stride 8: many windows */
    kiln_eval_params p;
    params(&p);
    eval_results r = {0};
    char task[1300];
    snprintf(task, sizeof task, "ppl:%s", path);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    /* the text is 88 bytes with CRLF read as LF (87), plus BOS: 88 tokens, 87 scored */
    assert_int_equal(metric(&r, "", "ppl")->n, 87);
    assert_true(fabs(metric(&r, "", "ppl")->value - FV) < 1e-6 * FV);
    free(r.m);
    eval_lm_release(&lm);
}

static void test_ppl_half(void **state) {
    (void)state;
    char text[301], path[1200];
    int32_t prev = 1; /* BOS */
    for (int i = 0; i < 300; i++) { prev = chain_next(prev); text[i] = (char)(prev - 3); }
    text[300] = 0;
    snprintf(path, sizeof path, "%s/chain.txt", tmpdir);
    write_file(path, text);
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_half;
    eval_lm lm;
    fake_lm(&lm, &f, 64);
    kiln_eval_params p;
    params(&p);
    p.stride = 25;
    eval_results r = {0};
    char task[1300];
    snprintf(task, sizeof task, "ppl:%s", path);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    assert_int_equal(metric(&r, "", "ppl")->n, 300); /* every text token once */
    assert_true(fabs(metric(&r, "", "ppl")->value - 2.0) < 1e-6);
    assert_true(fabs(metric(&r, "", "nll")->value - log(2.0)) < 1e-7);
    /* windows of 64 tokens every 25 over 301 tokens start at 0, 25, ..., 250 (the one at 250 ends
     * at the text's end): 11 windows. A window's input is its tokens but the last (only a target):
     * 10 × 63 + (301 − 250 − 1) = 680 tokens run. The chain's letters repeat every 12, which does
     * not divide 25, so consecutive windows differ at their first token and nothing is reused. */
    assert_int_equal(f.evaluated, 680);
    free(r.m);
    /* --max-tokens: the first 101 tokens (BOS + 100) */
    p.max_tokens = 101;
    r = (eval_results){0};
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    assert_int_equal(metric(&r, "", "ppl")->n, 100);
    free(r.m);
    eval_lm_release(&lm);
}

static void test_kl_files(void **state) {
    (void)state;
    char text[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    char path[1200], base[1200];
    snprintf(path, sizeof path, "%s/kl.txt", tmpdir);
    snprintf(base, sizeof base, "%s/base.logits", tmpdir);
    write_file(path, text);
    char task[1300];
    snprintf(task, sizeof task, "kl:%s", path);
    static fake f;
    memset(&f, 0, sizeof f);
    eval_lm lm;
    kiln_eval_params p;
    eval_results r = {0};
    /* kl without a file is a usage error */
    params(&p);
    f.fn = fn_uniform;
    fake_lm(&lm, &f, 16);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "--save-logits"));
    /* baseline: uniform */
    p.save_logits = base;
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    free(r.m);
    r = (eval_results){0};
    eval_lm_release(&lm);
    /* comparison: token 5 boosted to 3/(V+2), others 1/(V+2):
     * KL(U || Q) = Σ 1/V · ln((1/V) / q_i) = ln((V+2)/V) − (1/V) ln 3 at every position */
    memset(&f, 0, sizeof f);
    f.fn = fn_peak5;
    fake_lm(&lm, &f, 16);
    params(&p);
    p.baseline_logits = base;
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    double want = log((FV + 2.0) / FV) - log(3.0) / FV;
    assert_int_equal(metric(&r, "", "kl_mean")->n, 36);
    /* Log-probabilities are stored as float32: each is off by at most half an ulp of |ln p| < 8,
     * 2^-21 ≈ 4.8e-7, so Σ p_i (lp_i − lq_i) is off by at most 2 × 4.8e-7 ≈ 1e-6. */
    assert_true(fabs(metric(&r, "", "kl_mean")->value - want) < 1e-6);
    assert_true(fabs(metric(&r, "", "kl_median")->value - want) < 1e-6);
    assert_true(fabs(metric(&r, "", "kl_p99")->value - want) < 1e-6);
    /* argmax: uniform → token 0 (first), boosted → token 5: never agree */
    assert_true(metric(&r, "", "top1_agree")->value == 0);
    assert_true(fabs(metric(&r, "", "ppl_baseline")->value - FV) < 1e-5 * FV);
    free(r.m);
    r = (eval_results){0};
    eval_lm_release(&lm);
    /* the baseline against itself: KL 0, full agreement */
    memset(&f, 0, sizeof f);
    f.fn = fn_uniform;
    fake_lm(&lm, &f, 16);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_OK);
    assert_true(metric(&r, "", "kl_mean")->value == 0);
    assert_true(metric(&r, "", "top1_agree")->value == 1);
    free(r.m);
    r = (eval_results){0};
    eval_lm_release(&lm);
    /* a different window is refused (the positions would not be the same predictions) */
    memset(&f, 0, sizeof f);
    f.fn = fn_uniform;
    fake_lm(&lm, &f, 32);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "window"));
    eval_lm_release(&lm);
    /* a file that is not a logits file */
    p.baseline_logits = path;
    fake_lm(&lm, &f, 16);
    assert_int_equal(eval_run_task(&lm, task, &p, &r), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "magic"));
    eval_lm_release(&lm);
}

/* ---- multiple choice ---------------------------------------------------------------------------- */
static void test_mc_run(void **state) {
    (void)state;
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/arc", tmpdir);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/arc_easy.jsonl", dir);
    /* a = ln(3/(V+2)) for 'x', b = ln(1/(V+2)) otherwise (the leading space is a b):
     * ex 1: "xyyyyy" ll = a + 6b, "y" ll = 2b → acc picks "y" (a + 4b < 0);
     *       per byte (a + 6b)/6 vs 2b/1 → a/6 > b → acc_norm picks "xyyyyy" = gold.
     * ex 2: "y" 2b vs "x" a + b → both pick "x" = gold.
     * acc = 1/2, acc_norm = 2/2. Line 3 is malformed JSON, line 4 a bad gold. */
    write_file(path,
               "{\"query\": \"Question: one?\", \"choices\": [\"xyyyyy\", \"y\"], \"gold\": 0}\n"
               "{\"query\": \"Question: two?\", \"choices\": [\"y\", \"x\"], \"gold\": 1}\n"
               "{\"query\": \"Question: broken\", \"choices\": [\n"
               "{\"query\": \"Question: three?\", \"choices\": [\"y\", \"x\"], \"gold\": 7}\n"
               "\n");
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_likes_x;
    eval_lm lm;
    fake_lm(&lm, &f, 256);
    kiln_eval_params p;
    params(&p);
    eval_results r = {0};
    assert_int_equal(eval_run_task(&lm, "arc_easy", &p, &r), KILN_OK);
    assert_int_equal(metric(&r, "", "acc")->n, 2);
    assert_true(metric(&r, "", "acc")->value == 0.5);
    assert_true(metric(&r, "", "acc_norm")->value == 1.0);
    char want[1400];
    snprintf(want, sizeof want, "%s:3: invalid JSON", path);
    assert_non_null(strstr(warned, want));
    snprintf(want, sizeof want, "%s:4: field \"gold\" = 7", path);
    assert_non_null(strstr(warned, want));
    /* prefix reuse. Example 1: context "<s>Question: one?\nAnswer:" = 23 tokens; " xyyyyy" runs
     * 23 + 7 − 1 = 29 tokens (a continuation's last token is never an input); " y" rolls back to
     * 22 and runs the context's last token and " " = 2. Example 2 shares "<s>Question: " (11
     * tokens) with what the session holds: " y" runs 24 − 11 = 13, " x" 2 more. Total 46. */
    assert_int_equal(f.evaluated, 46);
    free(r.m);
    /* strict: the first malformed line fails with file:line */
    r = (eval_results){0};
    p.strict = 1;
    assert_int_equal(eval_run_task(&lm, "arc_easy", &p, &r), KILN_ERR_FORMAT);
    snprintf(want, sizeof want, "%s:3:", path);
    assert_non_null(strstr(kiln_last_error(), want));
    free(r.m);
    /* --limit 1 and --shots 1: the first example becomes the shot, the second is scored */
    r = (eval_results){0};
    params(&p);
    p.limit = 1;
    p.shots = 1;
    assert_int_equal(eval_run_task(&lm, "arc_easy", &p, &r), KILN_OK);
    assert_int_equal(metric(&r, "", "acc")->n, 1);
    assert_true(metric(&r, "", "acc")->value == 1.0);
    free(r.m);
    eval_lm_release(&lm);
    /* unknown task: lists the known ones */
    assert_int_equal(kiln_eval_check_task("arc_medium"), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "arc_easy"));
    assert_non_null(strstr(kiln_last_error(), "gsm8k"));
    assert_int_equal(kiln_eval_check_task("ppl:"), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_eval_check_task("kl"), KILN_OK);
}

static void test_mc_reuse_exact(void **state) {
    (void)state;
    /* One 3-choice question; openbook_qa uses the query as the context: "Question: Q?\nAnswer:"
     * is 20 bytes, with BOS 21 tokens. " x": input = context + " x" minus its last token = 22
     * tokens, all run; " yy": rolled back to 20 tokens, runs the context's last token, " ", "y" = 3;
     * " z": rolled back to 20, runs the context's last token and " " = 2. Total 27. */
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/more", tmpdir);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/openbook_qa.jsonl", dir);
    write_file(path, "{\"query\": \"Question: Q?\\nAnswer:\", \"choices\": [\"x\", \"yy\", \"z\"], \"gold\": 0}\n");
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_likes_x;
    eval_lm lm;
    fake_lm(&lm, &f, 256);
    kiln_eval_params p;
    params(&p);
    eval_results r = {0};
    assert_int_equal(eval_run_task(&lm, "openbook_qa", &p, &r), KILN_OK);
    assert_int_equal(f.evaluated, 27);
    assert_true(metric(&r, "", "acc")->value == 1.0);
    free(r.m);
    eval_lm_release(&lm);
    /* a backend that cannot roll back: every choice from scratch, 22 + 23 + 22 = 67, same result */
    memset(&f, 0, sizeof f);
    f.fn = fn_likes_x;
    f.refuse = 1;
    fake_lm(&lm, &f, 256);
    r = (eval_results){0};
    assert_int_equal(eval_run_task(&lm, "openbook_qa", &p, &r), KILN_OK);
    assert_int_equal(f.evaluated, 67);
    assert_true(metric(&r, "", "acc")->value == 1.0);
    free(r.m);
    eval_lm_release(&lm);
}

static void test_mmlu_run(void **state) {
    (void)state;
    char d[1200], p1[1300];
    snprintf(d, sizeof d, "%s/mmlu/dev", tmpdir);
    mkdirs(d);
    snprintf(d, sizeof d, "%s/mmlu/test", tmpdir);
    mkdirs(d);
    /* dev rows with quoted fields (a comma, a doubled quote, a newline) */
    snprintf(p1, sizeof p1, "%s/mmlu/dev/alpha_dev.csv", tmpdir);
    write_file(p1, "\"Q1, with comma\",a,b,c,d,A\n\"He said \"\"hi\"\"\nthen\",a,b,c,d,B\n");
    snprintf(p1, sizeof p1, "%s/mmlu/dev/beta_dev.csv", tmpdir);
    write_file(p1, "q,a,b,c,d,C\nq2,a,b,c,d,D\n");
    /* subject alpha: golds C, A (+ a 5-field line skipped) → 1/2; beta: gold C → 1/1.
     * macro = (0.5 + 1)/2 = 0.75, micro = 2/3. */
    snprintf(p1, sizeof p1, "%s/mmlu/test/alpha_test.csv", tmpdir);
    write_file(p1, "t1,a,b,c,d,C\nbad,a,b,c,D\nt2,a,b,c,d,A\n");
    snprintf(p1, sizeof p1, "%s/mmlu/test/beta_test.csv", tmpdir);
    write_file(p1, "t3,a,b,c,d,C\n");
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_likes_C;
    eval_lm lm;
    fake_lm(&lm, &f, 4096);
    kiln_eval_params p;
    params(&p);
    p.shots = 2;
    eval_results r = {0};
    assert_int_equal(eval_run_task(&lm, "mmlu", &p, &r), KILN_OK);
    assert_true(fabs(metric(&r, "", "acc")->value - 0.75) < 1e-12);
    assert_true(fabs(metric(&r, "", "acc_micro")->value - 2.0 / 3) < 1e-12);
    assert_int_equal(metric(&r, "", "acc")->n, 3);
    assert_true(metric(&r, "alpha", "acc")->value == 0.5);
    assert_true(metric(&r, "beta", "acc")->value == 1.0);
    snprintf(p1, sizeof p1, "%s/mmlu/test/alpha_test.csv:2: 5 fields", tmpdir);
    assert_non_null(strstr(warned, p1));
    free(r.m);
    eval_lm_release(&lm);
}

/* ---- GSM8K --------------------------------------------------------------------------------------- */
/* Writes SCRIPT one byte per step after the last "A:" of the history (the question's). */
static const char *SCRIPT = " 3 + 15 = 18. The answer is 18.\n\nQ: more";
static void fn_script(const fake *f, float *lg) {
    memset(lg, 0, FV * sizeof *lg);
    int k = -1;
    for (int i = f->len - 2; i >= 0; i--)
        if (f->hist[i] == 'A' + 3 && f->hist[i + 1] == ':' + 3) { k = f->len - (i + 2); break; }
    int c = k >= 0 && (size_t)k < strlen(SCRIPT) ? (unsigned char)SCRIPT[k] + 3 : 2;
    lg[c] = 10;
}

static void test_gsm8k_run(void **state) {
    (void)state;
    char d[1200], p1[1300];
    snprintf(d, sizeof d, "%s/gsm8k", tmpdir);
    mkdirs(d);
    snprintf(p1, sizeof p1, "%s/gsm8k/test.jsonl", tmpdir);
    write_file(p1, "{\"question\": \"What is 3 + 15?\", \"answer\": \"3 + 15 = 18\\n#### 18\"}\n"
                   "{\"question\": \"no final answer\", \"answer\": \"42\"}\n"
                   "{\"question\": \"What is 4 + 16?\", \"answer\": \"#### 20\"}\n");
    static fake f;
    memset(&f, 0, sizeof f);
    f.fn = fn_script;
    eval_lm lm;
    fake_lm(&lm, &f, 8192);
    kiln_eval_params p;
    params(&p);
    eval_results r = {0};
    assert_int_equal(eval_run_task(&lm, "gsm8k", &p, &r), KILN_OK);
    /* generation stops at "Q:"; "18" is right for question 1, wrong for question 3 */
    assert_int_equal(metric(&r, "", "exact_match_strict")->n, 2);
    assert_true(metric(&r, "", "exact_match_strict")->value == 0.5);
    assert_true(metric(&r, "", "exact_match_flexible")->value == 0.5);
    snprintf(p1, sizeof p1, "%s/gsm8k/test.jsonl:2: field \"answer\" has no", tmpdir);
    assert_non_null(strstr(warned, p1));
    /* the 8 exemplars ("Q: {q}\nA: {a}\n\n" each, 9 bytes of framing) are a prefix shared by both
     * questions: run once, not twice */
    long prefix = 0;
    for (int i = 0; i < EVAL_GSM8K_COT_N; i++) prefix += 9 + (long)strlen(eval_gsm8k_cot_q[i]) + (long)strlen(eval_gsm8k_cot_a[i]);
    assert_true(prefix > 1400);
    assert_true(f.evaluated > prefix && f.evaluated < prefix + 300);
    free(r.m);
    eval_lm_release(&lm);
}

/* ---- kiln_session_truncate against a fresh session --------------------------------------------- */
/* Rolling back then extending equals a fresh session (F32 and FP8 with static scales: page contents
 * depend on their own rows only); dynamic FP8 scales refuse a partial roll-back. */
static void truncate_case(const char *path, kiln_kv_dtype kv, kiln_kv_scale_mode mode) {
    kiln_options o;
    kiln_options_default(&o);
    o.threads = 1;
    o.quiet = 1;
    o.kv_dtype = kv;
    o.kv_scale_mode = mode;
    kiln_model *m;
    assert_int_equal(kiln_model_load(path, &o, &m), KILN_OK);
    kiln_session *a, *b;
    assert_int_equal(kiln_session_create(m, &o, &a), KILN_OK);
    assert_int_equal(kiln_session_create(m, &o, &b), KILN_OK);
    int32_t t1[40], t2[10];
    for (int i = 0; i < 40; i++) t1[i] = 1 + (i * 37) % 500;
    for (int i = 0; i < 10; i++) t2[i] = 3 + (i * 91) % 500;
    float *la = malloc(10 * 512 * sizeof *la), *lb = malloc(31 * 512 * sizeof *lb);
    /* a: 40 tokens, back to 21 (mid-page: pages of 16), then 10 more */
    assert_int_equal(kiln_session_eval(a, t1, 40, NULL), KILN_OK);
    if (kv == KILN_KV_FP8 && mode == KILN_KV_SCALE_DYNAMIC) {
        assert_int_equal(kiln_session_truncate(a, 21), KILN_ERR_UNSUPPORTED);
        assert_int_equal(kiln_session_length(a), 40);
        assert_int_equal(kiln_session_truncate(a, 40), KILN_OK); /* no-op */
    } else {
        assert_int_equal(kiln_session_truncate(a, 21), KILN_OK);
        assert_int_equal(kiln_session_length(a), 21);
        assert_int_equal(kiln_session_eval(a, t2, 10, la), KILN_OK);
        /* b: the same 31 tokens from scratch */
        int32_t all[31];
        memcpy(all, t1, 21 * sizeof *all);
        memcpy(all + 21, t2, 10 * sizeof *all);
        assert_int_equal(kiln_session_eval(b, all, 31, lb), KILN_OK);
        double md = 0;
        for (int i = 0; i < 10 * 512; i++) {
            double d = fabs((double)la[i] - (double)lb[(size_t)21 * 512 + i]);
            if (d > md) md = d;
        }
        assert_true(md < 1e-4);
        assert_int_equal(kiln_session_truncate(a, 32), KILN_ERR_INVALID_ARG); /* beyond the length */
    }
    assert_int_equal(kiln_session_truncate(a, 0), KILN_OK);
    assert_int_equal(kiln_session_length(a), 0);
    free(la);
    free(lb);
    kiln_session_free(a);
    kiln_session_free(b);
    kiln_model_free(m);
}

static void test_session_truncate(void **state) {
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/models/stories260K", shared_dir);
    struct stat sb;
    if (stat(path, &sb) != 0) skip();
    truncate_case(path, KILN_KV_F32, KILN_KV_SCALE_STATIC);
    truncate_case(path, KILN_KV_FP8, KILN_KV_SCALE_STATIC);
    truncate_case(path, KILN_KV_FP8, KILN_KV_SCALE_DYNAMIC);
}

int main(void) {
    const char *sh = getenv("SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", sh && *sh ? sh : "../shared");
    const char *td = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kiln-test-eval-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logprob),        cmocka_unit_test(test_kl_known),
        cmocka_unit_test(test_quantiles),      cmocka_unit_test(test_mc_pick),
        cmocka_unit_test(test_gsm8k_extract),  cmocka_unit_test(test_mmlu_prompt),
        cmocka_unit_test(test_mc_formats),     cmocka_unit_test(test_ppl_uniform),
        cmocka_unit_test(test_ppl_half),       cmocka_unit_test(test_kl_files),
        cmocka_unit_test(test_mc_run),         cmocka_unit_test(test_mc_reuse_exact),
        cmocka_unit_test(test_mmlu_run),       cmocka_unit_test(test_gsm8k_run),
        cmocka_unit_test(test_session_truncate),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
