/* test_backend_isolation.c — compute settings belong to a backend object, not to the process: two
 * sessions of one model in one process, one on the best ISA this CPU has with 2 threads and the
 * bf16-dot FP8 GEMV, the other on the scalar kernels with 1 thread and the exact FP8 GEMV (or the
 * ref backend), run at the same time on two threads; each must produce exactly (bit for bit) the
 * logits it produces when it runs alone. Before the backend seam, ISA, thread count and FP8 form
 * were process globals that the second session's creation switched under the first.
 *
 * Model: tiny-llama-hd64 from ../shared (a trained Llama, head_dim 64, GQA 2:1), its linear layers
 * requantized to FP8 in memory so that the FP8 form matters; prompt of 40 tokens, then 24 greedy
 * decode steps; every step's logits are compared. The two settings must also give different logits
 * (else the test could not tell whether the settings were applied at all). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kiln.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT 40
#define DECODE 24
#define VOCAB 512
#define ROWS (PROMPT + DECODE)

static kiln_model *model;

typedef struct {
    kiln_options o;
    float *logits; /* [ROWS × VOCAB]: every prompt row, then each decode step's row */
    kiln_status st;
} run_t;

static int64_t argmax(const float *x, int n) {
    int64_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void *run(void *arg) {
    run_t *r = arg;
    kiln_session *s = NULL;
    r->st = kiln_session_create(model, &r->o, &s);
    if (r->st != KILN_OK) return NULL;
    int32_t toks[PROMPT];
    for (int i = 0; i < PROMPT; i++) toks[i] = i == 0 ? 1 : (int32_t)((i * 37 + 11) % VOCAB);
    r->st = kiln_session_eval(s, toks, PROMPT, r->logits);
    for (int d = 0; d < DECODE && r->st == KILN_OK; d++) {
        const float *last = r->logits + (size_t)(PROMPT + d - 1) * VOCAB;
        int32_t next = (int32_t)argmax(last, VOCAB);
        r->st = kiln_session_eval(s, &next, 1, r->logits + (size_t)(PROMPT + d) * VOCAB);
    }
    kiln_session_free(s);
    return NULL;
}

static run_t make_run(kiln_isa isa, int threads, int fp8, kiln_backend_kind be) {
    run_t r;
    kiln_options_default(&r.o);
    r.o.isa = isa;
    r.o.threads = threads;
    r.o.fp8_gemv = fp8;
    r.o.backend = be;
    r.o.quiet = 1;
    r.logits = calloc((size_t)ROWS * VOCAB, sizeof(float));
    assert_non_null(r.logits);
    r.st = KILN_OK;
    return r;
}

static void pair(kiln_options *a_opts, kiln_options *b_opts) {
    run_t a = make_run(a_opts->isa, a_opts->threads, a_opts->fp8_gemv, a_opts->backend);
    run_t b = make_run(b_opts->isa, b_opts->threads, b_opts->fp8_gemv, b_opts->backend);
    run_t a2 = a, b2 = b;
    a2.logits = calloc((size_t)ROWS * VOCAB, sizeof(float));
    b2.logits = calloc((size_t)ROWS * VOCAB, sizeof(float));
    assert_non_null(a2.logits);
    assert_non_null(b2.logits);
    /* each alone */
    run(&a);
    run(&b);
    assert_int_equal(a.st, KILN_OK);
    assert_int_equal(b.st, KILN_OK);
    assert_true(memcmp(a.logits, b.logits, (size_t)ROWS * VOCAB * sizeof(float)) != 0);
    /* both at once: B's session is created while A's computes, and the other way round */
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, run, &a2), 0);
    assert_int_equal(pthread_create(&tb, NULL, run, &b2), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a2.st, KILN_OK);
    assert_int_equal(b2.st, KILN_OK);
    assert_memory_equal(a2.logits, a.logits, (size_t)ROWS * VOCAB * sizeof(float));
    assert_memory_equal(b2.logits, b.logits, (size_t)ROWS * VOCAB * sizeof(float));
    free(a.logits); free(b.logits); free(a2.logits); free(b2.logits);
}

static void test_isa_threads_fp8(void **state) {
    (void)state;
    kiln_options a, b;
    kiln_options_default(&a);
    kiln_options_default(&b);
    a.isa = KILN_ISA_AUTO; a.threads = 2; a.fp8_gemv = 2; a.backend = KILN_BACKEND_CPU;
    b.isa = KILN_ISA_SCALAR; b.threads = 1; b.fp8_gemv = 1; b.backend = KILN_BACKEND_CPU;
    pair(&a, &b);
}

static void test_cpu_and_ref_backends(void **state) {
    (void)state;
    kiln_options a, b;
    kiln_options_default(&a);
    kiln_options_default(&b);
    a.threads = 2; a.backend = KILN_BACKEND_CPU;
    b.backend = KILN_BACKEND_REF;
    pair(&a, &b);
}

static int setup(void **state) {
    (void)state;
    const char *shared = getenv("SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/tiny-llama-hd64/model.bin", shared ? shared : "../shared");
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "skip: %s not found\n", path); exit(77); }
    fclose(f);
    kiln_options o;
    kiln_options_default(&o);
    o.quiet = 1;
    if (kiln_model_load(path, &o, &model) != KILN_OK) { fprintf(stderr, "%s\n", kiln_last_error()); return -1; }
    int kept = 0;
    if (kiln_model_requantize(model, "fp8", &kept) != KILN_OK) { fprintf(stderr, "%s\n", kiln_last_error()); return -1; }
    return kept == 0 ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    kiln_model_free(model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_isa_threads_fp8), cmocka_unit_test(test_cpu_and_ref_backends)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
