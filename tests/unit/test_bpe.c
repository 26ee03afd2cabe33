/* test_bpe.c — byte-level BPE (src/tokenizer/bpe.c) against references nobody here wrote:
 *   - llama.cpp's vocabulary test vectors (../shared/tokenizers/gguf-vocab: strings and the ids the
 *     Hugging Face tokenizers give them, no BOS) for the gpt-2, deepseek-llm and deepseek-coder GGUF
 *     vocabularies, and the qwen2 / deepseek-r1-qwen vectors with Qwen3's tokenizer.json;
 *   - the same gpt-2 vectors through a tiktoken file made from the GGUF vocabulary (tiktoken's
 *     r50k_base is GPT-2's vocabulary with ranks = ids);
 *   - Python's bytes.decode("utf-8", "replace") results for the streaming UTF-8 decoder;
 *   - bad input: invalid JSON, unknown pre-tokenizer / normalizer / model types, regexes PCRE2
 *     rejects, merges naming unknown tokens, invalid UTF-8 text, bad tiktoken lines, an unknown
 *     GGUF pre-tokenizer name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "tokenizer/bpe.h"
#include "testutil.h"

static char *tmp_path(const char *name) {
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kiln_test_bpe_XXXXXX", t && *t ? t : "/tmp");
        assert_non_null(mkdtemp(dir));
    }
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* llama.cpp's vocabulary test vectors (testutil.h) through kiln_bpe_encode, special tokens not parsed. */
static kiln_status bpe_encode(const void *b, const char *text, size_t len, int32_t **ids, size_t *n) {
    return kiln_bpe_encode(b, text, len, 0, ids, n);
}
static int check_vectors(const kiln_bpe *b, const char *name) { return test_vocab_vectors(b, bpe_encode, name); }

static kiln_bpe *load_gguf_vocab(const char *name, kiln_gguf **g) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/gguf-vocab/ggml-vocab-%s.gguf", test_shared_dir(), name);
    if (kiln_gguf_open(path, NULL, g) != KILN_OK) fail_msg("%s: %s", path, kiln_last_error());
    kiln_bpe *b = NULL;
    if (kiln_bpe_load_gguf(*g, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    return b;
}

static void test_gguf_vectors(void **state) {
    (void)state;
    static const char *const names[] = {"gpt-2", "deepseek-llm", "deepseek-coder"};
    for (int i = 0; i < 3; i++) {
        kiln_gguf *g;
        kiln_bpe *b = load_gguf_vocab(names[i], &g);
        char vec[128];
        snprintf(vec, sizeof vec, "ggml-vocab-%s.gguf", names[i]);
        check_vectors(b, vec);
        kiln_bpe_free(b);
        kiln_gguf_close(g);
    }
}

static void test_gguf_metadata(void **state) {
    (void)state;
    kiln_gguf *g;
    kiln_bpe *b = load_gguf_vocab("deepseek-llm", &g);
    /* values as stored in the file: bos 100000, eos 100001, add_bos true */
    assert_int_equal(kiln_bpe_vocab_size(b), 102400);
    assert_int_equal(kiln_bpe_bos(b), 100000);
    assert_int_equal(kiln_bpe_eos(b), 100001);
    assert_true(kiln_bpe_add_bos(b));
    assert_true(kiln_bpe_is_special(b, 100000));
    assert_false(kiln_bpe_is_special(b, 100014)); /* user-defined "ü" */
    size_t len;
    const char *pc = kiln_bpe_decode_piece(b, 100014, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(pc, "\xc3\xbc", 2);
    /* control tokens are text unless parse_special; then they are one id */
    const char *t = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
    int32_t *ids;
    size_t n;
    assert_int_equal(kiln_bpe_encode(b, t, strlen(t), 1, &ids, &n), KILN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 100000);
    free(ids);
    assert_int_equal(kiln_bpe_encode(b, t, strlen(t), 0, &ids, &n), KILN_OK);
    assert_true(n > 1);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 100000);
    char *dec;
    assert_int_equal(kiln_bpe_decode(b, ids, n, 0, &dec, &len), KILN_OK);
    assert_string_equal(dec, t);
    free(dec);
    free(ids);
    kiln_bpe_free(b);
    kiln_gguf_close(g);
}

static void test_qwen2_vectors(void **state) {
    (void)state;
    char tj[1024], tc[1024];
    snprintf(tj, sizeof tj, "%s/tokenizers/qwen3/tokenizer.json", test_shared_dir());
    snprintf(tc, sizeof tc, "%s/tokenizers/qwen3/tokenizer_config.json", test_shared_dir());
    kiln_bpe *b;
    if (kiln_bpe_load_hf_json(tj, tc, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    check_vectors(b, "ggml-vocab-qwen2.gguf");
    check_vectors(b, "ggml-vocab-deepseek-r1-qwen.gguf");
    /* tokenizer_config.json: eos_token "<|im_end|>", bos_token null, add_bos_token false */
    assert_int_equal(kiln_bpe_eos(b), kiln_bpe_token_id(b, "<|im_end|>", 10));
    assert_int_equal(kiln_bpe_eos(b), 151645);
    assert_int_equal(kiln_bpe_bos(b), -1);
    assert_false(kiln_bpe_add_bos(b));
    assert_non_null(kiln_bpe_chat_template(b));
    /* NFC: a decomposed "e + U+0301" encodes like the precomposed U+00E9 */
    int32_t *a, *c;
    size_t na, nc;
    assert_int_equal(kiln_bpe_encode(b, "caf\x65\xcc\x81", 6, 1, &a, &na), KILN_OK);
    assert_int_equal(kiln_bpe_encode(b, "caf\xc3\xa9", 5, 1, &c, &nc), KILN_OK);
    assert_int_equal(na, nc);
    assert_memory_equal(a, c, na * sizeof *a);
    free(a);
    free(c);
    kiln_bpe_free(b);
}

static void test_deepseek_v3_config(void **state) {
    (void)state;
    char tj[1024], tc[1024];
    snprintf(tj, sizeof tj, "%s/tokenizers/deepseek-v3/tokenizer.json", test_shared_dir());
    snprintf(tc, sizeof tc, "%s/tokenizers/deepseek-v3/tokenizer_config.json", test_shared_dir());
    kiln_bpe *b;
    if (kiln_bpe_load_hf_json(tj, tc, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    /* tokenizer.json added_tokens: id 0 = <｜begin▁of▁sentence｜>, 1 = <｜end▁of▁sentence｜>;
     * tokenizer_config.json: add_bos_token true */
    assert_int_equal(kiln_bpe_bos(b), 0);
    assert_int_equal(kiln_bpe_eos(b), 1);
    assert_true(kiln_bpe_add_bos(b));
    assert_string_equal(kiln_bpe_bos_str(b), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    assert_int_equal(kiln_bpe_vocab_size(b), 128815);
    /* decode(encode(x)) == x for text with every kind of character (no normalizer here) */
    const char *texts[] = {"Hello, world!  \n\n\tdef f(x):\n    return x ** 2  # \xe4\xb8\xad\xe6\x96\x87",
                           "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e 12345678 \xd0\x9f\xd1\x80\xd0\xb8",
                           "<\xef\xbd\x9c" "User\xef\xbd\x9c>hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"};
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t n, len;
        char *dec;
        assert_int_equal(kiln_bpe_encode(b, texts[i], strlen(texts[i]), 1, &ids, &n), KILN_OK);
        assert_int_equal(kiln_bpe_decode(b, ids, n, 0, &dec, &len), KILN_OK);
        assert_string_equal(dec, texts[i]);
        free(dec);
        free(ids);
    }
    kiln_bpe_free(b);
}

/* ---- tiktoken made from the GPT-2 GGUF vocabulary ---------------------------------------------- */
static void b64(const unsigned char *s, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = tab[v >> 18];
        out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = 0;
}

static void test_tiktoken_gpt2(void **state) {
    (void)state;
    /* GPT-2's bytes_to_unicode, inverted: visible Latin-1 bytes stand for themselves, the other 68
     * bytes for U+0100.. in byte order */
    int cp_byte[512];
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    int extra = 0;
    for (int bt = 0; bt < 256; bt++) {
        int vis = (bt >= 33 && bt <= 126) || (bt >= 161 && bt <= 172) || (bt >= 174);
        cp_byte[vis ? bt : 256 + extra++] = bt;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf", test_shared_dir());
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(path, NULL, &g), KILN_OK);
    kiln_gguf_type et;
    uint64_t n;
    assert_int_equal(kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), 0);
    char *tk = tmp_path("gpt2.tiktoken");
    FILE *f = fopen(tk, "w");
    assert_non_null(f);
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        assert_int_equal(kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len), 0);
        if (!strcmp(s, "<|endoftext|>")) continue; /* a special token, not a mergeable rank */
        unsigned char bytes[256];
        size_t nb = 0;
        for (size_t k = 0; k < len;) { /* UTF-8 decode (2-byte sequences at most here) */
            unsigned c = (unsigned char)s[k];
            unsigned cp = c < 0x80 ? c : ((c & 0x1F) << 6) | ((unsigned char)s[k + 1] & 0x3F);
            k += c < 0x80 ? 1 : 2;
            assert_true(cp < 512 && cp_byte[cp] >= 0);
            bytes[nb++] = (unsigned char)cp_byte[cp];
        }
        char enc[400];
        b64(bytes, nb, enc);
        fprintf(f, "%s %llu\n", enc, (unsigned long long)i);
    }
    fclose(f);
    kiln_gguf_close(g);
    kiln_bpe_added eot = {"<|endoftext|>", 50256, 1};
    kiln_bpe *b;
    if (kiln_bpe_load_tiktoken(tk, KILN_BPE_PATTERN_GPT2, &eot, 1, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    check_vectors(b, "ggml-vocab-gpt-2.gguf");
    int32_t *ids;
    size_t m;
    assert_int_equal(kiln_bpe_encode(b, "a<|endoftext|>", 14, 1, &ids, &m), KILN_OK);
    assert_int_equal(m, 2);
    assert_int_equal(ids[1], 50256);
    free(ids);
    kiln_bpe_free(b);
    unlink(tk);
    free(tk);
}

/* Kimi K2's pattern: the PCRE2 rewrite must compile and split as the original's intent on a few
 * hand-checked cases (Han runs apart from other letters, case-split words, 3-digit groups). */
static void test_kimi_pattern_splits(void **state) {
    (void)state;
    /* a vocabulary of all 256 bytes only: every piece comes out byte by byte, so the ids show the
     * pre-tokenizer's pieces only through decode; we check the pieces via a 1-token-per-piece
     * vocabulary instead: the tiktoken file holds exactly the expected pieces + all bytes */
    static const char *const pieces[] = {"\xe4\xb8\xad\xe6\x96\x87", "Hello", "World", " it's", "123", "45",
                                         "\xce\x9a\xce\xb1\xce\xbb\xce\xb7", " ", "\n\n", NULL};
    char *tk = tmp_path("kimi.tiktoken");
    FILE *f = fopen(tk, "w");
    assert_non_null(f);
    int rank = 0;
    for (int bt = 0; bt < 256; bt++) {
        unsigned char c = (unsigned char)bt;
        char enc[8];
        b64(&c, 1, enc);
        fprintf(f, "%s %d\n", enc, rank++);
    }
    for (int i = 0; pieces[i]; i++) {
        if (strlen(pieces[i]) == 1) continue;
        char enc[64];
        b64((const unsigned char *)pieces[i], strlen(pieces[i]), enc);
        fprintf(f, "%s %d\n", enc, rank++);
    }
    fclose(f);
    kiln_bpe *b;
    if (kiln_bpe_load_tiktoken(tk, NULL, NULL, 0, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    const char *text = "\xe4\xb8\xad\xe6\x96\x87HelloWorld it's12345\xce\x9a\xce\xb1\xce\xbb\xce\xb7\n\n";
    int32_t *ids;
    size_t n;
    assert_int_equal(kiln_bpe_encode(b, text, strlen(text), 1, &ids, &n), KILN_OK);
    /* 中文 | Hello | World | ' it's' | 123 | 45 | Καλη | \n\n */
    static const int expect[] = {256, 257, 258, 259, 260, 261, 262, 263};
    assert_int_equal(n, 8);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], expect[i]);
    free(ids);
    kiln_bpe_free(b);
    unlink(tk);
    free(tk);
}

/* ---- streaming UTF-8 ----------------------------------------------------------------------------- */
static void test_utf8_stream(void **state) {
    (void)state;
    /* a valid text pushed one byte at a time comes out whole, and never as a broken prefix */
    const char *t = "h\xc3\xa9llo \xf0\x9f\x98\x80 \xe4\xb8\x96\xe7\x95\x8c!";
    kiln_utf8_stream s;
    kiln_utf8_stream_init(&s);
    char out[256];
    size_t o = 0;
    for (size_t i = 0; t[i]; i++) {
        o += kiln_utf8_stream_push(&s, t + i, 1, out + o);
        assert_int_equal(kiln_utf8_validate(out, o), o);
    }
    o += kiln_utf8_stream_flush(&s, out + o);
    assert_int_equal(o, strlen(t));
    assert_memory_equal(out, t, o);
    /* invalid input: Python's bytes.decode("utf-8", "replace") */
    static const struct { const char *in; size_t n; const char *want; } cases[] = {
        {"a\xe2\x82" "b", 4, "a\xef\xbf\xbd" "b"},
        {"\xf0\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xff", 1, "\xef\xbf\xbd"},
        {"\xe2\x82", 2, "\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"x\x80\x80y", 4, "x\xef\xbf\xbd\xef\xbf\xbdy"},
        {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int split = 0; split < 2; split++) { /* whole, and byte by byte */
            kiln_utf8_stream_init(&s);
            o = 0;
            if (!split) o += kiln_utf8_stream_push(&s, cases[c].in, cases[c].n, out);
            else
                for (size_t i = 0; i < cases[c].n; i++) o += kiln_utf8_stream_push(&s, cases[c].in + i, 1, out + o);
            o += kiln_utf8_stream_flush(&s, out + o);
            out[o] = 0;
            if (strcmp(out, cases[c].want)) fail_msg("stream case %zu split %d", c, split);
        }
    }
}

/* ---- bad input ----------------------------------------------------------------------------------- */
static void expect_load_error(const char *json, kiln_status want, const char *const *needles) {
    kiln_bpe *b = (kiln_bpe *)1;
    kiln_status st = kiln_bpe_load_hf_json_buf(json, strlen(json), NULL, 0, "bad.json", &b);
    if (st != want) fail_msg("status %d (want %d) for %s: %s", st, want, json, kiln_last_error());
    assert_null(b);
    for (int i = 0; needles[i]; i++)
        if (!strstr(kiln_last_error(), needles[i]))
            fail_msg("error '%s' does not mention '%s'", kiln_last_error(), needles[i]);
}

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_bad_input(void **state) {
    (void)state;
    expect_load_error("{\"model\": ", KILN_ERR_FORMAT, (const char *[]){"bad.json", "invalid JSON", "line 1", NULL});
    expect_load_error("[1, 2]", KILN_ERR_FORMAT, (const char *[]){"top level", NULL});
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Frobnicate\"}}", KILN_ERR_UNSUPPORTED,
                      (const char *[]){"pre_tokenizer.type", "Frobnicate", NULL});
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
                      "{\"type\": \"ByteLevel\"}, {\"type\": \"Metaspace\"}]}}",
                      KILN_ERR_UNSUPPORTED, (const char *[]){"pre_tokenizer.pretokenizers[1].type", "Metaspace", NULL});
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\\\\p{L}+\"}, "
                      "\"behavior\": \"Isolated\", \"invert\": false}}",
                      KILN_ERR_FORMAT, (const char *[]){"pre_tokenizer.pattern.Regex", "PCRE2", "offset", NULL});
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                      "\"behavior\": \"Sideways\"}}",
                      KILN_ERR_FORMAT, (const char *[]){"pre_tokenizer.behavior", "Sideways", NULL});
    expect_load_error("{" MODEL ", \"normalizer\": {\"type\": \"BertNormalizer\"}}", KILN_ERR_UNSUPPORTED,
                      (const char *[]){"normalizer.type", "BertNormalizer", NULL});
    expect_load_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", KILN_ERR_UNSUPPORTED,
                      (const char *[]){"model.type", "Unigram", NULL});
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}}",
                      KILN_ERR_FORMAT, (const char *[]){"model.merges[0]", "'z'", NULL});
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                      KILN_ERR_FORMAT, (const char *[]){"model.merges[0]", "not in the vocabulary", NULL});
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
                      KILN_ERR_FORMAT, (const char *[]){"model.vocab['a']", NULL});
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}",
                      KILN_ERR_FORMAT, (const char *[]){"model.merges[0]", "left right", NULL});
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}",
                      KILN_ERR_FORMAT, (const char *[]){"added_tokens[0]", NULL});

    /* a good tiny tokenizer: invalid UTF-8 text is rejected with its byte offset */
    const char *good = "{" MODEL ", \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}";
    kiln_bpe *b;
    assert_int_equal(kiln_bpe_load_hf_json_buf(good, strlen(good), NULL, 0, "good.json", &b), KILN_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(kiln_bpe_encode(b, "ab", 2, 0, &ids, &n), KILN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    free(ids);
    assert_int_equal(kiln_bpe_encode(b, "ab\xff" "ab", 5, 0, &ids, &n), KILN_ERR_INVALID_ARG);
    assert_null(ids);
    assert_non_null(strstr(kiln_last_error(), "offset 2"));
    assert_int_equal(kiln_bpe_encode(b, "aaa\xe4\xb8", 5, 0, &ids, &n), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "offset 3"));
    assert_int_equal(kiln_bpe_encode(b, "\xed\xa0\x80", 3, 0, &ids, &n), KILN_ERR_INVALID_ARG); /* surrogate */
    /* "c" has no byte token in this vocabulary and there is no unk_token */
    assert_int_equal(kiln_bpe_encode(b, "abc", 3, 0, &ids, &n), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "0x63"));
    kiln_bpe_free(b);

    /* missing file, bad tiktoken lines */
    assert_int_equal(kiln_bpe_load_hf_json("/nonexistent/tokenizer.json", NULL, &b), KILN_ERR_IO);
    assert_non_null(strstr(kiln_last_error(), "/nonexistent/tokenizer.json"));
    char *tk = tmp_path("bad.tiktoken");
    FILE *f = fopen(tk, "w");
    fputs("YQ== 0\nYg== 1\n!!!! 2\n", f);
    fclose(f);
    assert_int_equal(kiln_bpe_load_tiktoken(tk, NULL, NULL, 0, &b), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "line 3"));
    f = fopen(tk, "w");
    fputs("YQ== 0\nYg== x\n", f);
    fclose(f);
    assert_int_equal(kiln_bpe_load_tiktoken(tk, NULL, NULL, 0, &b), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "line 2"));
    f = fopen(tk, "w");
    fputs("YQ== 0\nYg== 1\n", f);
    fclose(f);
    assert_int_equal(kiln_bpe_load_tiktoken(tk, "(unclosed", NULL, 0, &b), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "PCRE2"));
    unlink(tk);
    free(tk);
}

static void test_bad_gguf_pre(void **state) {
    (void)state;
    char *path = tmp_path("badpre.gguf");
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    const char *toks[] = {"a", "b", "ab"};
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    kiln_gguf_set_str(w, "tokenizer.ggml.pre", "frobnicator-9000");
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    assert_int_equal(kiln_gguf_write(w, path), KILN_OK);
    kiln_gguf_writer_free(w);
    kiln_gguf *g;
    assert_int_equal(kiln_gguf_open(path, NULL, &g), KILN_OK);
    kiln_bpe *b;
    assert_int_equal(kiln_bpe_load_gguf(g, &b), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(kiln_last_error(), "tokenizer.ggml.pre"));
    assert_non_null(strstr(kiln_last_error(), "frobnicator-9000"));
    kiln_gguf_close(g);
    /* not a byte-level vocabulary */
    w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    assert_int_equal(kiln_gguf_write(w, path), KILN_OK);
    kiln_gguf_writer_free(w);
    assert_int_equal(kiln_gguf_open(path, NULL, &g), KILN_OK);
    assert_int_equal(kiln_bpe_load_gguf(g, &b), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(kiln_last_error(), "tokenizer.ggml.model"));
    kiln_gguf_close(g);
    unlink(path);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_vectors),
        cmocka_unit_test(test_gguf_metadata),
        cmocka_unit_test(test_qwen2_vectors),
        cmocka_unit_test(test_deepseek_v3_config),
        cmocka_unit_test(test_tiktoken_gpt2),
        cmocka_unit_test(test_kimi_pattern_splits),
        cmocka_unit_test(test_utf8_stream),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_bad_gguf_pre),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
