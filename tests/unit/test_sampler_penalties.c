/* test_sampler_penalties.c — the sampler's logit processors (src/engine/sampler.c): logit bias,
 * repetition penalty (prompt + generated), frequency and presence penalty (generated only), in
 * vLLM's order, checked against values worked out by hand in this file; greedy and seeded sampling
 * through kiln_sample with processors equal the plain sampler on hand-processed logits; and with
 * the new fields at zero the sampler is the old one. */
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

static kiln_sampler *mk(const kiln_sampling *p) {
    kiln_sampler *s = NULL;
    assert_int_equal(kiln_sampler_create(p, V, &s), KILN_OK);
    return s;
}

/* frequency 0.5, presence 0.25; generated 2, 2, 5 → logit[2] -= 0.5·2 + 0.25 = 1.25, logit[5] -= 0.75 */
static void test_frequency_presence(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    kiln_sampler *s = mk(&p);
    const int32_t prompt[] = {1, 3}; /* the prompt does not count for these two */
    assert_int_equal(kiln_sampler_prompt(s, prompt, 2), KILN_OK);
    kiln_sampler_accept(s, 2);
    kiln_sampler_accept(s, 2);
    kiln_sampler_accept(s, 5);
    float lg[V] = {0.5f, 1.0f, 3.0f, -2.0f, 0.0f, 2.0f, -0.5f, 4.0f};
    const float want[V] = {0.5f, 1.0f, 1.75f, -2.0f, 0.0f, 1.25f, -0.5f, 4.0f};
    kiln_sampler_apply(s, lg);
    for (int i = 0; i < V; i++) assert_float_equal(lg[i], want[i], 1e-6);
    kiln_sampler_free(s);
}

/* repetition 2: prompt {1, 3}, generated {6}: 1.0 → 0.5, -2 → -4, -0.5 → -1; others unchanged */
static void test_repetition(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.repetition_penalty = 2.0f;
    kiln_sampler *s = mk(&p);
    const int32_t prompt[] = {1, 3, 1};
    assert_int_equal(kiln_sampler_prompt(s, prompt, 3), KILN_OK);
    kiln_sampler_accept(s, 6);
    kiln_sampler_accept(s, 6); /* once per distinct token, not per occurrence */
    float lg[V] = {0.5f, 1.0f, 3.0f, -2.0f, 0.0f, 2.0f, -0.5f, 4.0f};
    const float want[V] = {0.5f, 0.5f, 3.0f, -4.0f, 0.0f, 2.0f, -1.0f, 4.0f};
    kiln_sampler_apply(s, lg);
    for (int i = 0; i < V; i++) assert_float_equal(lg[i], want[i], 1e-6);
    kiln_sampler_free(s);
}

/* all together, vLLM order: bias, then repetition, then frequency / presence.
 * token 2: 3 + 1 (bias) = 4 → /2 = 2 → − (1·1 + 0.5) = 0.5
 * token 4: 0 − 1 (bias) = −1 → not seen → −1
 * token 1: prompt only: 1 / 2 = 0.5 */
static void test_combined_order(void **st) {
    (void)st;
    const int32_t ids[] = {2, 4};
    const float b[] = {1.0f, -1.0f};
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 1.0f;
    p.presence_penalty = 0.5f;
    p.n_logit_bias = 2;
    p.logit_bias_ids = ids;
    p.logit_bias = b;
    kiln_sampler *s = mk(&p);
    const int32_t prompt[] = {1};
    assert_int_equal(kiln_sampler_prompt(s, prompt, 1), KILN_OK);
    kiln_sampler_accept(s, 2);
    float lg[V] = {0.5f, 1.0f, 3.0f, -2.0f, 0.0f, 2.0f, -0.5f, 4.0f};
    const float want[V] = {0.5f, 0.5f, 0.5f, -2.0f, -1.0f, 2.0f, -0.5f, 4.0f};
    kiln_sampler_apply(s, lg);
    for (int i = 0; i < V; i++) assert_float_equal(lg[i], want[i], 1e-6);
    kiln_sampler_free(s);
}

/* greedy with a large frequency penalty never repeats a token while unseen ones remain, where the
 * plain greedy sampler repeats the argmax forever */
static void test_greedy_no_repeat(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0;
    kiln_sampler *plain = mk(&p);
    p.frequency_penalty = 2.0f;
    p.presence_penalty = 2.0f;
    kiln_sampler *pen = mk(&p);
    const float lg[V] = {0.25f, 0.5f, 1.5f, -1.0f, 0.0f, 1.0f, -0.25f, 2.0f};
    /* hand-derived: a token once generated drops by 4, below every unseen one (≥ −1): 7 (2), then
     * 2 (1.5 vs 2 − 4), 5 (1), 1 (0.5), 0 (0.25), 4 (0), 6 (−0.25), 3 (−1) */
    const int32_t want[V] = {7, 2, 5, 1, 0, 4, 6, 3};
    for (int i = 0; i < V; i++) {
        assert_int_equal(kiln_sample(plain, lg), 7);
        assert_int_equal(kiln_sample(pen, lg), want[i]);
    }
    kiln_sampler_free(plain);
    kiln_sampler_free(pen);
}

/* Seeded temperature / top-p sampling with processors = the plain sampler (same seed) fed the
 * logits processed by hand from the history; and with the new fields zero, kiln_sample is the
 * old sampler (same tokens as a sampler whose new fields were never set). */
static void test_seeded_equivalence(void **st) {
    (void)st;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = 1234;
    kiln_sampler *plain = mk(&p);
    kiln_sampling q = p;
    q.frequency_penalty = 0.7f;
    q.presence_penalty = -0.3f;
    q.repetition_penalty = 1.3f;
    kiln_sampler *pen = mk(&q);
    const int32_t prompt[] = {0, 7};
    assert_int_equal(kiln_sampler_prompt(pen, prompt, 2), KILN_OK);
    int count[V] = {0}, inprompt[V] = {1, 0, 0, 0, 0, 0, 0, 1};
    uint64_t x = 99;
    for (int step = 0; step < 200; step++) {
        float lg[V], ref[V];
        for (int i = 0; i < V; i++) { /* arbitrary logits in [-3, 3) */
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((x >> 40) % 6000) / 1000.0f - 3.0f;
        }
        for (int i = 0; i < V; i++) {
            float v = lg[i];
            if (inprompt[i] || count[i]) v = v > 0 ? v / 1.3f : v * 1.3f;
            if (count[i]) v -= 0.7f * (float)count[i] + -0.3f;
            ref[i] = v;
        }
        int32_t a = kiln_sample(pen, lg), b = kiln_sample(plain, ref);
        assert_int_equal(a, b);
        count[a]++;
    }
    kiln_sampler_free(plain);
    kiln_sampler_free(pen);
    /* zero fields (and repetition 1) = the old sampler, bit for bit */
    kiln_sampling d;
    kiln_sampling_default(&d);
    d.temperature = 1.1f;
    d.top_k = 5;
    d.seed = 7;
    kiln_sampling e = d;
    e.repetition_penalty = 1.0f;
    kiln_sampler *s1 = mk(&d), *s2 = mk(&e);
    float lg[V] = {0.5f, 1.0f, 3.0f, -2.0f, 0.0f, 2.0f, -0.5f, 4.0f};
    for (int i = 0; i < 100; i++) assert_int_equal(kiln_sample(s1, lg), kiln_sample(s2, lg));
    float before[V];
    memcpy(before, lg, sizeof lg);
    kiln_sampler_apply(s2, lg);
    assert_memory_equal(before, lg, sizeof lg);
    kiln_sampler_free(s1);
    kiln_sampler_free(s2);
}

/* logit bias +100 forces a token at temperature 0, −100 bans the argmax */
static void test_bias_greedy(void **st) {
    (void)st;
    const float lg[V] = {0.5f, 1.0f, 3.0f, -2.0f, 0.0f, 2.0f, -0.5f, 4.0f};
    const int32_t ids[] = {3};
    const float up[] = {100.0f}, down[] = {-100.0f};
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.temperature = 0;
    p.n_logit_bias = 1;
    p.logit_bias_ids = ids;
    p.logit_bias = up;
    kiln_sampler *s = mk(&p);
    assert_int_equal(kiln_sample(s, lg), 3);
    kiln_sampler_free(s);
    const int32_t top[] = {7};
    p.logit_bias_ids = top;
    p.logit_bias = down;
    s = mk(&p);
    assert_int_equal(kiln_sample(s, lg), 2);
    kiln_sampler_free(s);
}

/* min_p: with probabilities softmax(0, -1, -2, -3, ...) the second token's is e^-1 ≈ 0.368 of the
 * first's and the third's e^-2 ≈ 0.135: min_p 0.3 keeps tokens 0 and 1 only, min_p 0.5 token 0
 * only; over 400 seeds, min_p 0.3 samples both of them and nothing else, min_p 0 also others. */
static void test_min_p(void **st) {
    (void)st;
    float lg[V];
    for (int i = 0; i < V; i++) lg[i] = -(float)i;
    int seen[3][V];
    const float mp[3] = {0.0f, 0.3f, 0.5f};
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < 3; k++)
        for (uint64_t seed = 1; seed <= 400; seed++) {
            kiln_sampling p;
            kiln_sampling_default(&p);
            p.min_p = mp[k];
            p.seed = seed;
            kiln_sampler *s = mk(&p);
            seen[k][kiln_sample(s, lg)]++;
            kiln_sampler_free(s);
        }
    int others0 = 0;
    for (int i = 2; i < V; i++) others0 += seen[0][i];
    assert_true(others0 > 0);
    assert_true(seen[1][0] > 0 && seen[1][1] > 0);
    for (int i = 2; i < V; i++) assert_int_equal(seen[1][i], 0);
    assert_int_equal(seen[2][0], 400);
}

static void test_bad_args(void **st) {
    (void)st;
    kiln_sampler *s = NULL;
    kiln_sampling p;
    kiln_sampling_default(&p);
    p.repetition_penalty = -1.0f;
    assert_int_equal(kiln_sampler_create(&p, V, &s), KILN_ERR_INVALID_ARG);
    kiln_sampling_default(&p);
    p.frequency_penalty = NAN;
    assert_int_equal(kiln_sampler_create(&p, V, &s), KILN_ERR_INVALID_ARG);
    const int32_t ids[] = {V};
    const float b[] = {1.0f};
    kiln_sampling_default(&p);
    p.n_logit_bias = 1;
    p.logit_bias_ids = ids;
    p.logit_bias = b;
    assert_int_equal(kiln_sampler_create(&p, V, &s), KILN_ERR_INVALID_ARG);
    kiln_sampling_default(&p);
    p.min_p = 1.5f;
    assert_int_equal(kiln_sampler_create(&p, V, &s), KILN_ERR_INVALID_ARG);
    assert_null(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frequency_presence), cmocka_unit_test(test_repetition), cmocka_unit_test(test_combined_order),
        cmocka_unit_test(test_greedy_no_repeat), cmocka_unit_test(test_seeded_equivalence), cmocka_unit_test(test_bias_greedy),
        cmocka_unit_test(test_bad_args), cmocka_unit_test(test_min_p),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
