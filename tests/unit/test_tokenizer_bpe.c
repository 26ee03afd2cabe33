/* test_tokenizer_bpe.c — byte-level BPE vocabularies through the kiln_tok_* dispatch
 * (src/tokenizer/tokenizer.c): loading tokenizer.json / GGUF / tokenizer directories, add_bos as the
 * configuration says, special tokens in text, pieces, and the save round trips (tokenizer.json ->
 * GGUF -> tokenizer.json) checked against references nobody here wrote: llama.cpp's qwen2 vocabulary
 * test vectors (ids the Hugging Face tokenizers give) and the tokenizer_config.json files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "testutil.h"

static const char *tmp_dir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kiln_test_tokbpe_XXXXXX", t && *t ? t : "/tmp");
        assert_non_null(mkdtemp(dir));
    }
    return dir;
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* llama.cpp's vocabulary test vectors (testutil.h) through kiln_tok_encode with add_bos = 0. */
static kiln_status tok_encode(const void *t, const char *text, size_t len, int32_t **ids, size_t *n) {
    return kiln_tok_encode(t, text, len, 0, ids, n);
}
static void check_vectors(const kiln_tokenizer *t, const char *name) { test_vocab_vectors(t, tok_encode, name); }

static kiln_tokenizer *load_shared(const char *name) {
    char tj[1024], tc[1024];
    snprintf(tj, sizeof tj, "%s/tokenizers/%s/tokenizer.json", test_shared_dir(), name);
    snprintf(tc, sizeof tc, "%s/tokenizers/%s/tokenizer_config.json", test_shared_dir(), name);
    kiln_tokenizer *t = NULL;
    if (kiln_tok_load_hf(tj, tc, &t) != KILN_OK) fail_msg("%s", kiln_last_error());
    return t;
}

static void test_qwen3_dispatch(void **state) {
    (void)state;
    kiln_tokenizer *t = load_shared("qwen3");
    check_vectors(t, "ggml-vocab-qwen2.gguf");
    /* tokenizer_config.json: bos_token null, eos_token "<|im_end|>" (151645 in its added tokens) */
    assert_int_equal(kiln_tok_bos(t), -1);
    assert_int_equal(kiln_tok_eos(t), 151645);
    assert_string_equal(kiln_tok_special_str(t, 1), "<|im_end|>");
    assert_true(kiln_tok_is_special(t, 151645));
    assert_non_null(kiln_tok_chat_template(t));
    /* no BOS even when asked: the configuration has none */
    int32_t *ids;
    size_t n;
    assert_int_equal(kiln_tok_encode(t, "Hello", 5, 1, &ids, &n), KILN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 9707); /* "Hello" in Qwen2's vocabulary (llama.cpp's qwen2 vectors) */
    free(ids);
    /* special tokens written in trusted text are those tokens; with parse_special = 0 they are text */
    const char *chat = "<|im_start|>user\nHi<|im_end|>";
    assert_int_equal(kiln_tok_encode(t, chat, strlen(chat), 0, &ids, &n), KILN_OK);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[n - 1], 151645);
    free(ids);
    assert_int_equal(kiln_tok_encode_ex(t, chat, strlen(chat), 0, 0, &ids, &n), KILN_OK);
    for (size_t i = 0; i < n; i++) assert_true(ids[i] < 151643);
    free(ids);
    /* pieces are raw bytes: "é" (C3 A9) may split across tokens, "<|im_end|>" is its text */
    size_t len;
    const char *p = kiln_tok_piece(t, -1, 151645, &len);
    assert_int_equal(len, 10);
    assert_memory_equal(p, "<|im_end|>", 10);
    assert_string_equal(kiln_tok_raw_piece(t, 9707), "Hello");
    assert_null(kiln_tok_piece(t, -1, kiln_tok_vocab_size(t), &len));
    /* invalid UTF-8 names its offset */
    assert_int_equal(kiln_tok_encode(t, "ab\xc3(", 4, 0, &ids, &n), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "offset 3"));
    kiln_tok_free(t);
}

static void test_deepseek_v3_bos(void **state) {
    (void)state;
    kiln_tokenizer *t = load_shared("deepseek-v3");
    /* tokenizer_config.json: add_bos_token true, bos "<｜begin▁of▁sentence｜>" = id 0 */
    assert_int_equal(kiln_tok_bos(t), 0);
    assert_int_equal(kiln_tok_eos(t), 1);
    assert_string_equal(kiln_tok_special_str(t, 0), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(kiln_tok_encode(t, "Hello world", 11, 1, &a, &na), KILN_OK);
    assert_int_equal(kiln_tok_encode(t, "Hello world", 11, 0, &b, &nb), KILN_OK);
    assert_int_equal(na, nb + 1);
    assert_int_equal(a[0], 0);
    assert_memory_equal(a + 1, b, nb * sizeof *b);
    free(a);
    free(b);
    kiln_tok_free(t);
}

/* kiln_tok_load_path on a file, a directory and a tokenizer_config.json picks the same vocabulary */
static void test_load_path(void **state) {
    (void)state;
    char p[1024];
    const char *const forms[] = {"qwen3/tokenizer.json", "qwen3", "qwen3/tokenizer_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/tokenizers/%s", test_shared_dir(), forms[i]);
        kiln_tokenizer *t;
        if (kiln_tok_load_path(p, &t) != KILN_OK) fail_msg("%s: %s", forms[i], kiln_last_error());
        assert_int_equal(kiln_tok_eos(t), 151645); /* tokenizer_config.json was found beside it */
        kiln_tok_free(t);
    }
    snprintf(p, sizeof p, "%s/tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf", test_shared_dir());
    kiln_tokenizer *t;
    if (kiln_tok_load_path(p, &t) != KILN_OK) fail_msg("%s", kiln_last_error());
    check_vectors(t, "ggml-vocab-gpt-2.gguf");
    kiln_tok_free(t);
    assert_int_equal(kiln_tok_load_path("/nonexistent/tokenizer.json", &t), KILN_ERR_IO);
    assert_non_null(strstr(kiln_last_error(), "/nonexistent/tokenizer.json"));
}

/* tokenizer.json -> GGUF (tokenizer.kiln.pipeline keeps the exact pre-tokenizer and NFC) ->
 * tokenizer.json written from the GGUF: every stage still reproduces the qwen2 vectors. */
static void test_save_roundtrip(void **state) {
    (void)state;
    kiln_tokenizer *t = load_shared("qwen3");
    char gpath[1024], dir[1024];
    snprintf(gpath, sizeof gpath, "%s/tok.gguf", tmp_dir());
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_tok_save_gguf(t, w);
    assert_int_equal(kiln_gguf_write(w, gpath), KILN_OK);
    kiln_gguf_writer_free(w);
    kiln_tok_free(t);

    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(gpath, NULL, &g), KILN_OK);
    kiln_tokenizer *t2;
    if (kiln_tok_load_gguf(g, &t2) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_gguf_close(g);
    check_vectors(t2, "ggml-vocab-qwen2.gguf");
    assert_int_equal(kiln_tok_eos(t2), 151645);
    assert_true(kiln_tok_is_special(t2, 151644));
    assert_non_null(kiln_tok_chat_template(t2));

    snprintf(dir, sizeof dir, "%s/hf", tmp_dir());
    mkdir(dir, 0755);
    if (kiln_tok_save_hf(t2, dir) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_tok_free(t2);
    kiln_tokenizer *t3;
    if (kiln_tok_load_path(dir, &t3) != KILN_OK) fail_msg("%s", kiln_last_error());
    check_vectors(t3, "ggml-vocab-qwen2.gguf");
    assert_int_equal(kiln_tok_eos(t3), 151645);
    assert_int_equal(kiln_tok_bos(t3), -1);
    kiln_tok_free(t3);

    /* a tokenizer.json-loaded vocabulary saves by copying its files */
    t = load_shared("deepseek-v3");
    snprintf(dir, sizeof dir, "%s/ds", tmp_dir());
    mkdir(dir, 0755);
    assert_int_equal(kiln_tok_save_hf(t, dir), KILN_OK);
    kiln_tok_free(t);
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/tokenizers/deepseek-v3/tokenizer.json", test_shared_dir());
    snprintf(b, sizeof b, "%s/tokenizer.json", dir);
    size_t na, nb;
    char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    assert_non_null(y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    assert_true(exists(b));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_dispatch),
        cmocka_unit_test(test_deepseek_v3_bos),
        cmocka_unit_test(test_load_path),
        cmocka_unit_test(test_save_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
