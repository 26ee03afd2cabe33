/* testutil.h — helpers shared by the tokenizer unit tests (header-only: every tests/unit/test_*.c
 * is its own binary, so these are static inline and cost nothing where unused).
 *   test_shared_dir     the shared data folder ($SHARED, default ../shared)
 *   test_slurp          a whole file, NUL-terminated
 *   test_vocab_vectors  llama.cpp's test-tokenizer-0 vectors through any encoder
 * Include after <cmocka.h> (it uses cmocka's assertions). */
#ifndef KILN_TESTS_TESTUTIL_H
#define KILN_TESTS_TESTUTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static inline const char *test_shared_dir(void) {
    const char *s = getenv("SHARED");
    return s && *s ? s : "../shared";
}

/* The file's bytes plus a terminating NUL (*n = the byte count), or NULL if it cannot be read. */
static inline char *test_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)sz, f) != (size_t)sz) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[sz] = 0; *n = (size_t)sz; }
    return buf;
}

/* Encodes text[0..len) without BOS; ids are malloc'd (the caller frees them). */
typedef kiln_status (*test_encode_fn)(const void *tok, const char *text, size_t len, int32_t **ids, size_t *n);

/* llama.cpp test-tokenizer-0 format: $SHARED/tokenizers/gguf-vocab/<name>.inp holds strings each
 * followed by "\n__ggml_vocab_test__\n"; <name>.out one line per string with " id id id" (the ids
 * the Hugging Face tokenizers give, no BOS). Every case must match; returns the number of cases
 * (at least 40). */
static inline int test_vocab_vectors(const void *tok, test_encode_fn encode, const char *name) {
    char path[1024];
    size_t ni, no;
    snprintf(path, sizeof path, "%s/tokenizers/gguf-vocab/%s.inp", test_shared_dir(), name);
    char *inp = test_slurp(path, &ni);
    snprintf(path, sizeof path, "%s/tokenizers/gguf-vocab/%s.out", test_shared_dir(), name);
    char *out = test_slurp(path, &no);
    assert_non_null(inp);
    assert_non_null(out);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *op = out;
    int cases = 0, fails = 0;
    for (char *e; (e = strstr(p, sep)); p = e + strlen(sep), cases++) {
        char *nl = strchr(op, '\n');
        assert_non_null(nl);
        *nl = 0;
        int32_t *ids;
        size_t n;
        assert_int_equal(encode(tok, p, (size_t)(e - p), &ids, &n), KILN_OK);
        char got[16384];
        size_t g = 0;
        got[0] = 0;
        for (size_t i = 0; i < n && g < sizeof got - 16; i++) g += (size_t)sprintf(got + g, " %d", ids[i]);
        if (strcmp(got, op)) {
            print_error("%s case %d '%.*s'\n  expected:%s\n  got:     %s\n", name, cases, (int)(e - p), p, op, got);
            fails++;
        }
        free(ids);
        op = nl + 1;
    }
    free(inp);
    free(out);
    assert_int_equal(fails, 0);
    assert_true(cases >= 40);
    return cases;
}
#endif
