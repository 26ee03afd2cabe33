/* test_tokenizer_spm.c — SentencePiece-style tokenizers against independent references:
 *   - Meta's Llama-2 ids (expected_ids.jsonl, BOS included) with llama2.c's tokenizer.bin;
 *   - llama.cpp's test vectors for ggml-vocab-llama-spm.gguf (.inp/.out, no BOS), and
 *     llama-tokenize's ids for special tokens written in the text;
 *   - llama2.c run.c's encode() of "Once upon a time" with stories260K's tok512.bin, whose ids
 *     [1, 403, 407, 261, 378] are also the start of the reference greedy path (greedy_tokens.txt);
 *   - invalid UTF-8 rejection; save/load round trips through HF files and GGUF metadata. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "base/status.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char shared_dir[1024];

static const char *shared(const char *rel, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", shared_dir, rel);
    return buf;
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static void expect_ids_ex(const kiln_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                          const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n;
    kiln_status st = kiln_tok_encode_ex(t, text, len, add_bos, parse_special, &ids, &n);
    if (st != KILN_OK) fail_msg("encode failed: %s", kiln_last_error());
    int same = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same) {
        fprintf(stderr, "text [%.*s]\n got:", (int)len, text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\nwant:");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    assert_true(same);
}

static void expect_ids(const kiln_tokenizer *t, const char *text, size_t len, int add_bos, const int32_t *want,
                       size_t n_want) {
    expect_ids_ex(t, text, len, add_bos, 1, want, n_want);
}

static void test_llama2_expected_ids(void **state) {
    (void)state;
    char p1[1200], p2[1200];
    if (!exists(shared("models/llama2-tokenizer/tokenizer.bin", p1, sizeof p1))) skip();
    kiln_tokenizer *t;
    assert_int_equal(kiln_tok_load_llama2c(p1, 32000, &t), KILN_OK);
    assert_int_equal(kiln_tok_vocab_size(t), 32000);
    assert_int_equal(kiln_tok_bos(t), 1);
    assert_int_equal(kiln_tok_eos(t), 2);
    FILE *f = fopen(shared("models/llama2-tokenizer/expected_ids.jsonl", p2, sizeof p2), "r");
    assert_non_null(f);
    char line[65536];
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        assert_non_null(j);
        const char *text = json_string_value(json_object_get(j, "text"));
        json_t *ids = json_object_get(j, "ids");
        size_t n = json_array_size(ids);
        int32_t *want = malloc((n + 1) * sizeof *want);
        for (size_t i = 0; i < n; i++) want[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        expect_ids(t, text, strlen(text), 1, want, n);
        free(want);
        json_decref(j);
        cases++;
    }
    fclose(f);
    assert_true(cases >= 5);
    kiln_tok_free(t);
}

/* Splits llama.cpp's .inp file into its test strings (separator "\n__ggml_vocab_test__\n"). */
static int split_inp(char *buf, char **out, int max) {
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep);
    int n = 0;
    char *p = buf;
    for (;;) {
        char *q = strstr(p, sep);
        if (!q) break;
        *q = 0;
        assert_true(n < max);
        out[n++] = p;
        p = q + sl;
    }
    return n;
}

static void test_llama_spm_vectors(void **state) {
    (void)state;
    char p[1200], pi[1200], po[1200];
    if (!exists(shared("tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf", p, sizeof p))) skip();
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(p, NULL, &g), KILN_OK);
    kiln_tokenizer *t;
    if (kiln_tok_load_gguf(g, &t) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_gguf_close(g); /* the tokenizer owns copies of everything */
    assert_int_equal(kiln_tok_vocab_size(t), 32000);
    char *inp = slurp(shared("tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf.inp", pi, sizeof pi), NULL);
    char *outf = slurp(shared("tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf.out", po, sizeof po), NULL);
    assert_non_null(inp);
    assert_non_null(outf);
    char *texts[256];
    int n = split_inp(inp, texts, 256);
    assert_true(n > 30);
    char *line = outf;
    for (int k = 0; k < n; k++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        int32_t want[4096];
        size_t nw = 0;
        for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " ")) want[nw++] = (int32_t)atoi(tok);
        expect_ids(t, texts[k], strlen(texts[k]), 0, want, nw);
        line = nl + 1;
    }
    assert_int_equal(*line, 0); /* one output line per input */
    free(inp);
    free(outf);
    kiln_tok_free(t);
}

/* ../shared's ggml-vocab-llama-spm.gguf vocabulary, NULL when ../shared lacks it. */
static kiln_tokenizer *load_llama_spm_gguf(void) {
    char p[4096];
    if (!exists(shared("tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf", p, sizeof p))) return NULL;
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(p, NULL, &g), KILN_OK);
    kiln_tokenizer *t;
    if (kiln_tok_load_gguf(g, &t) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_gguf_close(g); /* the tokenizer owns copies of everything */
    return t;
}

/* Special tokens written in the text of a GGUF SentencePiece vocabulary (a rendered Llama 2 /
 * Mistral chat template holds "<s>" and "</s>"). Expected ids: llama.cpp's llama-tokenize
 * (commit de3ff81) on ggml-vocab-llama-spm.gguf with --no-bos, with and without
 * --no-parse-special: control tokens cut the text, the stretch after one gets the space symbol in
 * front, and without parse_special they are plain text. */
static void test_llama_spm_special_in_text(void **state) {
    (void)state;
    kiln_tokenizer *t = load_llama_spm_gguf();
    if (!t) skip();
    static const struct {
        const char *text;
        int32_t special[32], plain[32];
        size_t n_special, n_plain;
    } cases[] = {
        {"<s>[INST] Hi there [/INST] Hello!</s><s>[INST] again [/INST]",
         {1, 518, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962, 15043, 29991, 2, 1, 518, 25580, 29962, 1449, 518, 29914, 25580, 29962},
         {529, 29879, 24566, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962, 15043, 29991, 829, 29879, 5299, 29879, 24566, 25580, 29962,
          1449, 518, 29914, 25580, 29962},
         22, 25},
        {"\xe3\x82\xa2</s>--", {29871, 30310, 2, 1192}, {29871, 30310, 829, 29879, 29958, 489}, 4, 6},
        {" lead</s> trail <unk>x", {29871, 3275, 2, 29871, 26203, 29871, 0, 921},
         {29871, 3275, 829, 29879, 29958, 26203, 529, 2960, 29958, 29916}, 8, 10},
        {"</s></s>a", {2, 2, 263}, {1533, 29879, 2565, 29879, 29958, 29874}, 3, 6},
        {"x<s>", {921, 1}, {921, 29966, 29879, 29958}, 2, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_ids_ex(t, cases[i].text, strlen(cases[i].text), 0, 1, cases[i].special, cases[i].n_special);
        expect_ids_ex(t, cases[i].text, strlen(cases[i].text), 0, 0, cases[i].plain, cases[i].n_plain);
    }
    kiln_tok_free(t);
}

static void test_stories260k_once_upon(void **state) {
    (void)state;
    char p[1200];
    if (!exists(shared("models/stories260K/tok512.bin", p, sizeof p))) skip();
    kiln_tokenizer *t;
    assert_int_equal(kiln_tok_load_llama2c(p, 512, &t), KILN_OK);
    const char *text = "Once upon a time";
    const int32_t want[] = {1, 403, 407, 261, 378};
    expect_ids(t, text, strlen(text), 1, want, 5);
    /* decoding the ids back (run.c decode(): leading space dropped after BOS) gives the text */
    char buf[256];
    size_t m = 0;
    for (int i = 1; i < 5; i++) {
        size_t l;
        const char *s = kiln_tok_piece(t, want[i - 1], want[i], &l);
        assert_non_null(s);
        memcpy(buf + m, s, l);
        m += l;
    }
    buf[m] = 0;
    assert_string_equal(buf, text);
    /* byte pieces decode to the raw byte; control pieces to nothing; bad ids to NULL */
    size_t l;
    const char *s = kiln_tok_piece(t, 5, 3 + 0x0A, &l);
    assert_int_equal(l, 1);
    assert_int_equal(s[0], '\n');
    assert_null(kiln_tok_piece(t, 1, 512, &l));
    assert_null(kiln_tok_piece(t, 1, -1, &l));
    assert_string_equal(kiln_tok_raw_piece(t, 259), " t");
    /* empty text: BOS only, or nothing */
    expect_ids(t, "", 0, 1, want, 1);
    expect_ids(t, "", 0, 0, want, 0);
    kiln_tok_free(t);
}

static void test_invalid_utf8(void **state) {
    (void)state;
    char p[1200];
    if (!exists(shared("models/stories260K/tok512.bin", p, sizeof p))) skip();
    kiln_tokenizer *t;
    assert_int_equal(kiln_tok_load_llama2c(p, 512, &t), KILN_OK);
    struct { const char *s; size_t off; } bad[] = {
        {"ab\xff", 2},           /* invalid lead byte */
        {"Once \xc3(", 6},       /* bad continuation */
        {"x\xe2\x82", 1},        /* truncated sequence */
        {"\xc0\xaf", 0},         /* overlong */
        {"ok \xed\xa0\x80", 3},  /* UTF-16 surrogate */
        {"\xf4\x90\x80\x80", 0}, /* > U+10FFFF */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = NULL;
        size_t n;
        assert_int_equal(kiln_tok_encode(t, bad[i].s, strlen(bad[i].s), 1, &ids, &n), KILN_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", bad[i].off);
        if (!strstr(kiln_last_error(), want)) fail_msg("message '%s' lacks '%s'", kiln_last_error(), want);
        assert_non_null(strstr(kiln_last_error(), "UTF-8"));
        assert_null(ids);
    }
    kiln_tok_free(t);
}

static void test_bad_tokenizer_bin(void **state) {
    (void)state;
    char dir[] = "/tmp/kiln_tokXXXXXX";
    const char *tmp = getenv("TMPDIR");
    char tdir[1100];
    snprintf(tdir, sizeof tdir, "%s/kiln_tokXXXXXX", tmp ? tmp : "/tmp");
    char *d = mkdtemp(tmp ? tdir : dir);
    assert_non_null(d);
    char path[1200];
    snprintf(path, sizeof path, "%s/bad.bin", d);
    /* header + one entry whose length runs past the end */
    FILE *f = fopen(path, "wb");
    int32_t maxlen = 8, len = 100;
    float sc = 0;
    fwrite(&maxlen, 4, 1, f);
    fwrite(&sc, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite("abc", 1, 3, f);
    fclose(f);
    kiln_tokenizer *t = NULL;
    assert_int_equal(kiln_tok_load_llama2c(path, 1, &t), KILN_ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(kiln_last_error(), path));
    assert_non_null(strstr(kiln_last_error(), "offset 4"));
    /* too few entries for the vocabulary size */
    f = fopen(path, "wb");
    len = 1;
    fwrite(&maxlen, 4, 1, f);
    fwrite(&sc, 4, 1, f);
    fwrite(&len, 4, 1, f);
    fwrite("a", 1, 1, f);
    fclose(f);
    assert_int_equal(kiln_tok_load_llama2c(path, 512, &t), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "vocab_size 512"));
    snprintf(path, sizeof path, "%s/missing.bin", d);
    assert_int_equal(kiln_tok_load_llama2c(path, 512, &t), KILN_ERR_IO);
    assert_non_null(strstr(kiln_last_error(), path));
    snprintf(path, sizeof path, "%s/bad.bin", d);
    unlink(path);
    rmdir(d);
}

/* Texts for the round trips: ordinary prose, whitespace runs, byte fallback, CJK, emoji. */
static const char *rt_texts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "  leading spaces and trailing  ",
    "\t\n\nnewlines\tand tabs\n",
    "Führer 4 ½ months ▁ literal",
    "🚀 (normal) 😶‍🌫️ 我想在apple工作1314151天～",
    "3333333 ''''```\"\"\"......!!!!!!??????",
    "",
};

static void encode_all(const kiln_tokenizer *t, int32_t **ids, size_t *n) {
    for (size_t i = 0; i < sizeof rt_texts / sizeof rt_texts[0]; i++)
        assert_int_equal(kiln_tok_encode(t, rt_texts[i], strlen(rt_texts[i]), 1, &ids[i], &n[i]), KILN_OK);
}

static void compare_all(const kiln_tokenizer *a, const kiln_tokenizer *b) {
    enum { N = sizeof rt_texts / sizeof rt_texts[0] };
    int32_t *ia[N], *ib[N];
    size_t na[N], nb[N];
    encode_all(a, ia, na);
    encode_all(b, ib, nb);
    for (int i = 0; i < N; i++) {
        assert_int_equal(na[i], nb[i]);
        assert_memory_equal(ia[i], ib[i], na[i] * sizeof(int32_t));
        /* and the same decoded text */
        for (size_t k = 1; k < na[i]; k++) {
            size_t la, lb;
            const char *pa = kiln_tok_piece(a, ia[i][k - 1], ia[i][k], &la);
            const char *pb = kiln_tok_piece(b, ib[i][k - 1], ib[i][k], &lb);
            assert_int_equal(la, lb);
            assert_memory_equal(pa, pb, la);
        }
        free(ia[i]);
        free(ib[i]);
    }
    assert_int_equal(kiln_tok_vocab_size(a), kiln_tok_vocab_size(b));
    assert_int_equal(kiln_tok_bos(a), kiln_tok_bos(b));
    assert_int_equal(kiln_tok_eos(a), kiln_tok_eos(b));
}

static char *make_tmpdir(void) {
    const char *tmp = getenv("TMPDIR");
    char buf[1100];
    snprintf(buf, sizeof buf, "%s/kiln_tokrtXXXXXX", tmp ? tmp : "/tmp");
    char *d = mkdtemp(buf);
    assert_non_null(d);
    return strdup(d);
}

static void rm_rf(const char *dir) {
    const char *names[] = {"tokenizer.bin", "tokenizer.json", "tokenizer_config.json", "tok.gguf"};
    char p[1200];
    for (size_t i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void roundtrip(const kiln_tokenizer *t) {
    char *d = make_tmpdir();
    char j[1200], c[1200], b[1200];
    /* HF directory: tokenizer.json + tokenizer_config.json (+ tokenizer.bin) */
    if (kiln_tok_save_hf(t, d) != KILN_OK) fail_msg("save_hf: %s", kiln_last_error());
    snprintf(j, sizeof j, "%s/tokenizer.json", d);
    snprintf(c, sizeof c, "%s/tokenizer_config.json", d);
    snprintf(b, sizeof b, "%s/tokenizer.bin", d);
    kiln_tokenizer *h;
    if (kiln_tok_load_hf(j, c, &h) != KILN_OK) fail_msg("load_hf: %s", kiln_last_error());
    compare_all(t, h);
    kiln_tok_free(h);
    /* the tokenizer.bin written beside loads as a llama2.c tokenizer too */
    kiln_tokenizer *l;
    assert_int_equal(kiln_tok_load_llama2c(b, kiln_tok_vocab_size(t), &l), KILN_OK);
    compare_all(t, l);
    kiln_tok_free(l);
    /* without tokenizer.bin the scores come from tokenizer.json's merges */
    unlink(b);
    if (kiln_tok_load_hf(j, c, &h) != KILN_OK) fail_msg("load_hf (merges): %s", kiln_last_error());
    compare_all(t, h);
    kiln_tok_free(h);
    /* GGUF metadata */
    char gp[1200];
    snprintf(gp, sizeof gp, "%s/tok.gguf", d);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "general.architecture", "llama");
    kiln_tok_save_gguf(t, w);
    assert_int_equal(kiln_gguf_write(w, gp), KILN_OK);
    kiln_gguf_writer_free(w);
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(gp, NULL, &g), KILN_OK);
    kiln_tokenizer *k;
    if (kiln_tok_load_gguf(g, &k) != KILN_OK) fail_msg("load_gguf: %s", kiln_last_error());
    kiln_gguf_close(g);
    compare_all(t, k);
    kiln_tok_free(k);
    rm_rf(d);
    free(d);
}

static void test_roundtrip_llama2c(void **state) {
    (void)state;
    char p[1200];
    if (!exists(shared("models/stories260K/tok512.bin", p, sizeof p))) skip();
    kiln_tokenizer *t;
    assert_int_equal(kiln_tok_load_llama2c(p, 512, &t), KILN_OK);
    roundtrip(t);
    /* save_hf keeps tokenizer.bin an exact copy of a llama2.c original */
    char *d = make_tmpdir();
    assert_int_equal(kiln_tok_save_hf(t, d), KILN_OK);
    char b[1200];
    snprintf(b, sizeof b, "%s/tokenizer.bin", d);
    size_t la, lb;
    char *x = slurp(p, &la), *y = slurp(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(x, y, la);
    free(x);
    free(y);
    rm_rf(d);
    free(d);
    kiln_tok_free(t);
}

static void test_roundtrip_llama2_32k(void **state) {
    (void)state;
    char p[1200];
    if (!exists(shared("models/llama2-tokenizer/tokenizer.bin", p, sizeof p))) skip();
    kiln_tokenizer *t;
    assert_int_equal(kiln_tok_load_llama2c(p, 32000, &t), KILN_OK);
    roundtrip(t);
    kiln_tok_free(t);
}

static void test_roundtrip_gguf_vocab(void **state) {
    (void)state;
    kiln_tokenizer *t = load_llama_spm_gguf();
    if (!t) skip();
    roundtrip(t);
    kiln_tok_free(t);
}

/* The same vocabulary stored two ways (llama2.c file, GGUF) encodes identically. */
static void test_llama2c_matches_gguf(void **state) {
    (void)state;
    char p[1200], q[1200];
    if (!exists(shared("models/llama2-tokenizer/tokenizer.bin", p, sizeof p)) ||
        !exists(shared("tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf", q, sizeof q)))
        skip();
    kiln_tokenizer *a, *b;
    assert_int_equal(kiln_tok_load_llama2c(p, 32000, &a), KILN_OK);
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(q, NULL, &g), KILN_OK);
    assert_int_equal(kiln_tok_load_gguf(g, &b), KILN_OK);
    kiln_gguf_close(g);
    compare_all(a, b);
    kiln_tok_free(a);
    kiln_tok_free(b);
}

int main(void) {
    const char *s = getenv("SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", s && *s ? s : "../shared");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2_expected_ids),
        cmocka_unit_test(test_llama_spm_vectors),
        cmocka_unit_test(test_llama_spm_special_in_text),
        cmocka_unit_test(test_stories260k_once_upon),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_bad_tokenizer_bin),
        cmocka_unit_test(test_roundtrip_llama2c),
        cmocka_unit_test(test_roundtrip_llama2_32k),
        cmocka_unit_test(test_roundtrip_gguf_vocab),
        cmocka_unit_test(test_llama2c_matches_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
