/* score.c — the pure scoring functions of the harness: log-probabilities, KL divergence, the
 * lm-evaluation-harness multiple-choice decision (acc / acc_norm), quantiles, and the GSM8K answer
 * filters (PCRE2 with the harness's own patterns, so the matches are the ones Python's re finds). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "eval/eval.h"
#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <string.h>

/* ---- probabilities ---------------------------------------------------------------------------------- */
static double log_sum_exp(const float *x, int n, double *max_out) {
    double mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    *max_out = mx;
    return log(s);
}

double eval_logprob(const float *logits, int vocab, int32_t target) {
    double mx;
    double lse = log_sum_exp(logits, vocab, &mx);
    return (double)logits[target] - mx - lse;
}

void eval_log_softmax(const float *logits, int vocab, float *out) {
    double mx;
    double lse = log_sum_exp(logits, vocab, &mx);
    for (int i = 0; i < vocab; i++) out[i] = (float)((double)logits[i] - mx - lse);
}

double eval_kl(const float *logp, const float *logq, int vocab) {
    double kl = 0;
    for (int i = 0; i < vocab; i++) {
        double lp = logp[i];
        if (lp == -INFINITY) continue; /* p = 0 contributes nothing */
        kl += exp(lp) * (lp - (double)logq[i]);
    }
    return kl > 0 ? kl : 0; /* rounding can leave -1e-17 for identical distributions */
}

int eval_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

void eval_mc_pick(const double *ll, const size_t *len, int n, int *pick, int *pick_norm) {
    int a = 0, b = 0;
    double bn = ll[0] / (double)(len[0] ? len[0] : 1);
    for (int i = 1; i < n; i++) {
        if (ll[i] > ll[a]) a = i;
        double v = ll[i] / (double)(len[i] ? len[i] : 1);
        if (v > bn) { bn = v; b = i; }
    }
    *pick = a;
    *pick_norm = b;
}

double eval_quantile_sorted(const double *sorted, size_t n, double q) {
    if (n == 0) return 0;
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    if (lo >= n - 1) return sorted[n - 1];
    double f = pos - (double)lo;
    return sorted[lo] + f * (sorted[lo + 1] - sorted[lo]);
}

double eval_acc_stderr(double p, long n) {
    if (n < 2) return 0;
    return sqrt(p * (1 - p) / (double)(n - 1));
}

/* ---- GSM8K ------------------------------------------------------------------------------------------ */
/* Every match of pattern in subject: calls found(ud, start, len) with the first non-empty capture
 * group (Python's findall + the harness's "first non-empty group of the tuple"). Returns matches. */
static int regex_each(const char *pattern, const char *subject, void (*found)(void *, const char *, size_t), void *ud) {
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &err, &eoff, NULL);
    if (!re) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(subject), off = 0;
    int count = 0;
    while (off <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)subject, len, off, 0, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        for (int g = 1; g < rc; g++)
            if (ov[2 * g] != PCRE2_UNSET && ov[2 * g + 1] > ov[2 * g]) { s = ov[2 * g]; e = ov[2 * g + 1]; break; }
        count++;
        if (found) found(ud, subject + s, e - s);
        off = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return count;
}

typedef struct { char *out; size_t cap; int first_only, have; } grab_t;
static void grab(void *ud, const char *s, size_t n) {
    grab_t *g = ud;
    if (g->first_only && g->have) return;
    /* strip() */
    while (n && isspace((unsigned char)*s)) { s++; n--; }
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n >= g->cap) n = g->cap - 1;
    memcpy(g->out, s, n);
    g->out[n] = 0;
    g->have = 1;
}

int eval_gsm8k_strict(const char *gen, eval_gsm_style style, char *out, size_t cap) {
    grab_t g = {out, cap, 1, 0};
    const char *pat = style == EVAL_GSM_COT ? "The answer is (\\-?[0-9\\.\\,]+)." : "#### (\\-?[0-9\\.\\,]+)";
    regex_each(pat, gen, grab, &g);
    return g.have;
}

int eval_gsm8k_flexible(const char *gen, char *out, size_t cap) {
    grab_t g = {out, cap, 0, 0};
    regex_each("(-?[$0-9.,]{2,})|(-?[0-9]+)", gen, grab, &g);
    return g.have;
}

void eval_gsm8k_normalize(char *s) {
    /* "(?s).*#### ": everything up to and including the last "#### " (greedy). */
    char *last = NULL;
    for (char *p = strstr(s, "#### "); p; p = strstr(p + 1, "#### ")) last = p;
    if (last) memmove(s, last + 5, strlen(last + 5) + 1);
    /* "," and "\$" removed everywhere (the harness applies "," first, then "$": same result). */
    char *w = s;
    for (char *p = s; *p; p++)
        if (*p != ',' && *p != '$') *w++ = *p;
    *w = 0;
    /* "\.$": Python's $ also matches before a final newline. */
    size_t n = strlen(s);
    if (n >= 1 && s[n - 1] == '.') s[n - 1] = 0;
    else if (n >= 2 && s[n - 1] == '\n' && s[n - 2] == '.') memmove(s + n - 2, s + n - 1, 2);
    for (char *p = s; *p; p++) *p = (char)tolower((unsigned char)*p);
}

int eval_gsm8k_target(const char *answer, char *out, size_t cap) {
    const char *last = NULL;
    for (const char *p = strstr(answer, "####"); p; p = strstr(p + 1, "####")) last = p;
    if (!last) return 0;
    const char *s = last + 4;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)*s)) { s++; n--; }
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n >= cap) n = cap - 1;
    memcpy(out, s, n);
    out[n] = 0;
    eval_gsm8k_normalize(out);
    return 1;
}

size_t eval_stop_at(const char *text, size_t len, const char *const *stops) {
    size_t best = len;
    for (int i = 0; stops[i]; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t p = 0; sl && p + sl <= len && p < best; p++)
            if (memcmp(text + p, stops[i], sl) == 0) { best = p; break; }
    }
    return best;
}
