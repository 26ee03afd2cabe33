/* test_stories_logits.c — stories260K against llama2.c's reference outputs (../shared):
 * the full logits at each of the 256 positions of the reference greedy path from BOS must match
 * expected/greedy_logits_f32.bin within 1e-4 (max |diff|), on the fast kernels and on the scalar
 * reference kernels; the argmax at each position must be the reference's next token. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln.h"

#define NPOS 256
#define VOCAB 512

static char shared_dir[4096];
static int32_t ref_in[NPOS], ref_next[NPOS];
static float *ref_logits;

static int setup(void **state) {
    (void)state;
    const char *s = getenv("SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", s ? s : "../shared");
    char p[4200];
    snprintf(p, sizeof p, "%s/models/stories260K/expected/greedy_tokens.txt", shared_dir);
    FILE *f = fopen(p, "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", p); return -1; }
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < NPOS) {
        if (line[0] == '#') continue;
        int pos, in, next;
        float lg;
        if (sscanf(line, "%d %d %d %f", &pos, &in, &next, &lg) == 4) { ref_in[n] = in; ref_next[n] = next; n++; }
    }
    fclose(f);
    if (n != NPOS) return -1;
    snprintf(p, sizeof p, "%s/models/stories260K/expected/greedy_logits_f32.bin", shared_dir);
    f = fopen(p, "rb");
    if (!f) return -1;
    ref_logits = malloc(sizeof(float) * NPOS * VOCAB);
    size_t got = fread(ref_logits, sizeof(float), NPOS * VOCAB, f);
    fclose(f);
    return got == NPOS * VOCAB ? 0 : -1;
}

static int teardown(void **state) { (void)state; free(ref_logits); return 0; }

static void check_isa(kiln_isa isa, int one_by_one) {
    char p[4200];
    snprintf(p, sizeof p, "%s/models/stories260K", shared_dir);
    kiln_options o;
    kiln_options_default(&o);
    o.isa = isa;
    kiln_model *m;
    assert_int_equal(kiln_model_load(p, &o, &m), KILN_OK);
    kiln_session *s;
    assert_int_equal(kiln_session_create(m, &o, &s), KILN_OK);
    float *lg = malloc(sizeof(float) * NPOS * VOCAB);
    if (one_by_one) { /* decode path: one token at a time */
        for (int i = 0; i < NPOS; i++) {
            assert_int_equal(kiln_session_eval(s, &ref_in[i], 1, NULL), KILN_OK);
            memcpy(lg + (size_t)i * VOCAB, kiln_session_logits(s), sizeof(float) * VOCAB);
        }
    } else { /* prefill path: all positions in one call */
        assert_int_equal(kiln_session_eval(s, ref_in, NPOS, lg), KILN_OK);
    }
    double maxd = 0;
    int argmax_mismatch = 0;
    for (int i = 0; i < NPOS; i++) {
        int best = 0;
        for (int v = 0; v < VOCAB; v++) {
            double d = fabs((double)lg[i * VOCAB + v] - (double)ref_logits[i * VOCAB + v]);
            if (!(d <= maxd)) maxd = d; /* NaN propagates as a failure */
            if (lg[i * VOCAB + v] > lg[i * VOCAB + best]) best = v;
        }
        if (best != ref_next[i]) argmax_mismatch++;
    }
    printf("isa=%d %s: max |logit diff| = %.3g over %d positions, argmax mismatches %d\n", (int)isa,
           one_by_one ? "decode" : "prefill", maxd, NPOS, argmax_mismatch);
    assert_true(maxd <= 1e-4);
    assert_int_equal(argmax_mismatch, 0);
    free(lg);
    kiln_session_free(s);
    kiln_model_free(m);
}

static void test_fast_prefill(void **state) { (void)state; check_isa(KILN_ISA_AUTO, 0); }
static void test_fast_decode(void **state) { (void)state; check_isa(KILN_ISA_AUTO, 1); }
static void test_scalar_prefill(void **state) { (void)state; check_isa(KILN_ISA_SCALAR, 0); }
static void test_scalar_decode(void **state) { (void)state; check_isa(KILN_ISA_SCALAR, 1); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_prefill),
        cmocka_unit_test(test_fast_decode),
        cmocka_unit_test(test_scalar_prefill),
        cmocka_unit_test(test_scalar_decode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
