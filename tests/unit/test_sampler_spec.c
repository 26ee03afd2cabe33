/* test_sampler_spec.c — speculative decoding's verification rule (kiln_sample_verify,
 * src/engine/sampler.c; docs/SPECULATIVE.md): whatever the draft, the returned token must follow
 * the target distribution exactly, and the draft must be kept with probability p(draft).
 *
 * The target distribution is computed here from its definition (logit bias, softmax at the
 * temperature, top-k, then top-p over the sorted probabilities, then min-p relative to the most
 * likely token; renormalised), in double. 200,000 draws per case; every outcome's frequency must be
 * within 5 standard deviations (sqrt(p(1 − p)/N)) of its probability, so a wrong rule (e.g. the
 * residual not renormalised, or the draft never resampled) fails by tens of deviations. Greedy:
 * the argmax whatever the draft, accepted exactly when the draft is the argmax. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kiln.h"

#define V 8
#define N 200000

static const float LOGITS[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.6f};

/* The target distribution of LOGITS under p (biases added first). */
static void target(const kiln_sampling *p, double *prob) {
    double l[V], e[V], sum = 0;
    int order[V];
    for (int i = 0; i < V; i++) l[i] = LOGITS[i];
    for (int i = 0; i < p->n_logit_bias; i++) l[p->logit_bias_ids[i]] += p->logit_bias[i];
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) sum += (e[i] = exp((l[i] - mx) / p->temperature));
    for (int i = 0; i < V; i++) { e[i] /= sum; order[i] = i; }
    for (int i = 0; i < V; i++) /* descending by probability, lower id first on ties */
        for (int j = i + 1; j < V; j++)
            if (e[order[j]] > e[order[i]] || (e[order[j]] == e[order[i]] && order[j] < order[i])) {
                int t = order[i]; order[i] = order[j]; order[j] = t;
            }
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    if (p->top_p < 1.0f) {
        double c = 0;
        for (int i = 0; i < n; i++) { c += e[order[i]]; if (c >= p->top_p) { n = i + 1; break; } }
    }
    if (p->min_p > 0)
        for (int i = 1; i < n; i++)
            if (e[order[i]] < p->min_p * e[order[0]]) { n = i; break; }
    double kept = 0;
    for (int i = 0; i < n; i++) kept += e[order[i]];
    memset(prob, 0, V * sizeof *prob);
    for (int i = 0; i < n; i++) prob[order[i]] = e[order[i]] / kept;
}

static void check_draws(const kiln_sampling *p, int32_t draft) {
    double prob[V];
    target(p, prob);
    kiln_sampler *s = NULL;
    assert_int_equal(kiln_sampler_create(p, V, &s), KILN_OK);
    long count[V] = {0}, kept = 0;
    for (int i = 0; i < N; i++) {
        int acc = -1;
        const int32_t t = kiln_sample_verify(s, LOGITS, draft, &acc);
        assert_true(t >= 0 && t < V);
        assert_true(acc == 0 || acc == 1);
        if (acc) assert_int_equal(t, draft);
        count[t]++;
        kept += acc;
    }
    for (int i = 0; i < V; i++) {
        const double f = (double)count[i] / N, sd = sqrt(prob[i] * (1 - prob[i]) / N);
        if (!(fabs(f - prob[i]) <= 5 * sd + 1e-12)) {
            fprintf(stderr, "draft %d: token %d drawn %.5f of the time, target probability %.5f (5 sd = %.5f)\n", draft, i, f, prob[i], 5 * sd);
            fail();
        }
    }
    /* the draft is kept exactly when kept: with probability p(draft) */
    const double fk = (double)kept / N, sdk = sqrt(prob[draft] * (1 - prob[draft]) / N);
    assert_true(fabs(fk - prob[draft]) <= 5 * sdk + 1e-12);
    kiln_sampler_free(s);
}

static void test_verify_temperature(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0.8f;
    for (int32_t d = 0; d < V; d++) check_draws(&p, d); /* likely, unlikely, every draft */
}

static void test_verify_filters(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 1.3f;
    p.top_k = 5;
    p.top_p = 0.9f;
    check_draws(&p, 7); /* the most likely token */
    check_draws(&p, 3); /* inside the kept set */
    check_draws(&p, 6); /* cut by top-k: never kept, p is unchanged */
    kiln_sampling_default(&p);
    p.temperature = 1.0f;
    p.min_p = 0.2f;
    check_draws(&p, 1);
    check_draws(&p, 5);
}

static void test_verify_processors(void **st) {
    (void)st;
    const int32_t ids[2] = {4, 7};
    const float bias[2] = {2.5f, -3.0f}; /* token 4 becomes the most likely, 7 falls */
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0.9f;
    p.n_logit_bias = 2;
    p.logit_bias_ids = ids;
    p.logit_bias = bias;
    check_draws(&p, 4);
    check_draws(&p, 7);
}

static void test_verify_greedy(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0.0f;
    kiln_sampler *s = NULL;
    assert_int_equal(kiln_sampler_create(&p, V, &s), KILN_OK);
    for (int32_t d = 0; d < V; d++) {
        int acc = -1;
        assert_int_equal(kiln_sample_verify(s, LOGITS, d, &acc), 7);
        assert_int_equal(acc, d == 7);
    }
    kiln_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_temperature), cmocka_unit_test(test_verify_filters), cmocka_unit_test(test_verify_processors),
        cmocka_unit_test(test_verify_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
