/* test_backend_isolation.c — compute settings belong to a backend object, not to the process: two
 * sessions of one model in one process, one on the best ISA this CPU has with 2 threads and the
 * bf16-dot FP8 GEMV, the other on the scalar kernels with 1 thread and the exact FP8 GEMV (or the
 * ref backend), run at the same time on two threads; each must produce exactly (bit for bit) the
 * logits it produces when it runs alone. Before the backend seam, ISA, thread count and FP8 form
 * were process globals that the second session's creation switched under the first.
 *
 * Model: tiny-llama-hd64 from ../shared (a trained Llama, head_dim 64, GQA 2:1), its linear layers
 * requantized to FP8 in memory so that the FP8 form matters; prompt of 40 tokens, then 24 greedy
 * decode steps; every step's logits are compared. Further pairs differ in one setting only (the FP8
 * form; the thread count, on a synthetic llama with 600 positions so that attention's context split
 * depends on it) and the cpu / ref backends. The two runs of a pair must give different logits
 * (else the test could not tell whether the setting was applied at all). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kiln.h"
#include "kernels/gemv.h"
#include "kv/kv.h"
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DECODE 24

static kiln_model *model;      /* tiny-llama-hd64, FP8 weights */
static kiln_model *long_model; /* a synthetic llama (kiln_mkmodel preset small: 2,048 positions) */

typedef struct {
    kiln_model *m;
    int prompt, vocab, rows; /* rows = prompt + DECODE */
    kiln_options o;
    float *logits; /* [rows × vocab]: every prompt row, then each decode step's row */
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
    r->st = kiln_session_create(r->m, &r->o, &s);
    if (r->st != KILN_OK) return NULL;
    int32_t *toks = malloc((size_t)r->prompt * sizeof *toks);
    if (!toks) { r->st = KILN_ERR_NOMEM; kiln_session_free(s); return NULL; }
    for (int i = 0; i < r->prompt; i++) toks[i] = i == 0 ? 1 : (int32_t)((i * 37 + 11) % r->vocab);
    r->st = kiln_session_eval(s, toks, r->prompt, r->logits);
    for (int d = 0; d < DECODE && r->st == KILN_OK; d++) {
        const float *last = r->logits + (size_t)(r->prompt + d - 1) * (size_t)r->vocab;
        int32_t next = (int32_t)argmax(last, r->vocab);
        r->st = kiln_session_eval(s, &next, 1, r->logits + (size_t)(r->prompt + d) * (size_t)r->vocab);
    }
    free(toks);
    kiln_session_free(s);
    /* a thread that computed frees its grow-only kernel and attention scratch before it ends (as the
     * engine's scheduler thread does at stop) */
    kiln_kernels_thread_scratch_free();
    kiln_kv_thread_scratch_free();
    return NULL;
}

static run_t make_run(kiln_model *m, int prompt, const kiln_options *o) {
    run_t r;
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    r.m = m;
    r.prompt = prompt;
    r.vocab = info.vocab_size;
    r.rows = prompt + DECODE;
    r.o = *o;
    r.o.quiet = 1;
    r.logits = calloc((size_t)r.rows * (size_t)r.vocab, sizeof(float));
    assert_non_null(r.logits);
    r.st = KILN_OK;
    return r;
}

/* Each alone, then both at once on two threads: bit-identical to alone; the two must differ. */
static void pair_on(kiln_model *m, int prompt, kiln_options *a_opts, kiln_options *b_opts) {
    run_t a = make_run(m, prompt, a_opts), b = make_run(m, prompt, b_opts);
    run_t a2 = make_run(m, prompt, a_opts), b2 = make_run(m, prompt, b_opts);
    const size_t bytes = (size_t)a.rows * (size_t)a.vocab * sizeof(float);
    /* each alone */
    run(&a);
    run(&b);
    assert_int_equal(a.st, KILN_OK);
    assert_int_equal(b.st, KILN_OK);
    assert_true(memcmp(a.logits, b.logits, bytes) != 0);
    /* both at once: B's session is created while A's computes, and the other way round */
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, run, &a2), 0);
    assert_int_equal(pthread_create(&tb, NULL, run, &b2), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a2.st, KILN_OK);
    assert_int_equal(b2.st, KILN_OK);
    assert_memory_equal(a2.logits, a.logits, bytes);
    assert_memory_equal(b2.logits, b.logits, bytes);
    free(a.logits); free(b.logits); free(a2.logits); free(b2.logits);
}
static void pair(kiln_options *a_opts, kiln_options *b_opts) { pair_on(model, 40, a_opts, b_opts); }

static void test_isa_threads_fp8(void **state) {
    (void)state;
    kiln_options a, b;
    kiln_options_default(&a);
    kiln_options_default(&b);
    a.isa = KILN_ISA_AUTO; a.threads = 2; a.fp8_gemv = 2; a.backend = KILN_BACKEND_CPU;
    b.isa = KILN_ISA_SCALAR; b.threads = 1; b.fp8_gemv = 1; b.backend = KILN_BACKEND_CPU;
    pair(&a, &b);
}

/* One setting apart at a time, so that a leak of that setting alone would show. */
static void test_fp8_form_only(void **state) {
    (void)state;
    kiln_options a, b;
    kiln_options_default(&a);
    kiln_options_default(&b);
    a.threads = b.threads = 2;
    a.fp8_gemv = 2; /* bf16 activations (AVX512_BF16 CPUs; elsewhere both forms are the exact one) */
    b.fp8_gemv = 1;
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "skip part: no AVX512_BF16 here, the two FP8 forms are one\n");
        return;
    }
    pair(&a, &b);
}
/* Threads only: with 600 positions of context, decode attention splits the context over the
 * threads (kv.c), so 1 and 2 threads sum in different orders and give different logits. */
static void test_threads_only(void **state) {
    (void)state;
    kiln_options a, b;
    kiln_options_default(&a);
    kiln_options_default(&b);
    a.threads = 2;
    b.threads = 1;
    pair_on(long_model, 600, &a, &b);
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
    if (kept != 0) return -1;
    char dir[] = "/tmp/kiln_isolation_XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char mp[64];
    snprintf(mp, sizeof mp, "%s/m", dir);
    if (kiln_mkmodel("llama", "preset=small", "f32", 7, mp) != KILN_OK || kiln_model_load(mp, &o, &long_model) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return -1;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); /* the model is mapped; its files may go */
    return system(cmd) == 0 ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    kiln_model_free(model);
    kiln_model_free(long_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_isa_threads_fp8), cmocka_unit_test(test_fp8_form_only),
                                       cmocka_unit_test(test_threads_only), cmocka_unit_test(test_cpu_and_ref_backends)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
