/* test_tokenizer_npm.c — kiln's BPE against an independent implementation: the npm package
 * @huggingface/tokenizers (pure-JS port of Hugging Face tokenizers), run by scripts/hf_tokenize.mjs
 * on the same tokenizer.json. Both encode >= 250 varied strings (code, CJK, emoji, numbers, runs of
 * whitespace and newlines, special tokens, mixed scripts) and the first 64 KiB of WikiText-2 with
 * DeepSeek-V3's and Qwen3's tokenizers; the ids must be identical. Also prints both encoders'
 * speed on the same English text (information only: no timing is asserted).
 *
 * Exit 77 (skip) only when node is not installed; a missing node_modules is installed with
 * `npm ci` from the repository's package-lock.json. Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tokenizer/bpe.h"

static const char *shared_dir(void) {
    const char *s = getenv("SHARED");
    return s && *s ? s : "../shared";
}

static char g_tmpdir[512];

/* ---- the strings ------------------------------------------------------------------------------- */
static const char *const FIXED[] = {
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n \n ", "\t\t\n  \t", "\u3000", "\u00a0x",
    "Hello world", " Hello world", "Hello World!", "Hello, y'all! How're you? I'm fine, he'd've said.",
    "HELLO THERE'S 'LL 'VE", "don't won't can't shouldn't've",
    "The quick brown fox jumps over the lazy dog.",
    "3", "33", "333", "3333", "33333", "1234567890", "3.14159265358979", "1,000,000.00", "-42", "+7e-10",
    "0x1F2E3D", "v1.2.3-rc4", "2024-06-30T12:34:56Z", "$19.99 (USD) 50% off!", "١٢٣٤٥", "Ⅻ ⅻ ½ ²³",
    "中文测试", "我想在apple工作1314151天～", "日本語のテキストとカタカナ", "ひらがなカタカナ漢字", "한국어 텍스트입니다",
    "混合 mixed 文字 text 123 数字", "「引用」『二重』【括弧】", "。、，！？：；",
    "😀", "😀😃😄😁", "👍🏽", "🇺🇸🇯🇵", "👨‍👩‍👧‍👦 family", "❤️‍🔥", "✅ done", "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅",
    "Привет, мир!", "Ελληνικά κείμενα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ภาษาไทย", "Tiếng Việt có dấu",
    "naïve café résumé", "Ünïcödé Straße", "ﬁﬂ ligatures", "e\u0301 combining", "Ω K Å", "ǅǈǋ titlecase",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "std::vector<std::pair<int, float>> v; v.emplace_back(1, 2.0f);",
    "const f = async (x) => { await x?.y ?? z; };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2, {\"nested\": null}], \"b\": true}",
    "<div class=\"a\">&amp;&lt;&gt;</div>", "https://example.com/path?q=1&r=two#frag",
    "user@example.com", "#!/bin/bash\nset -euo pipefail\n", "x = y ** 2 // 3 % 4 ^ 5 | 6 & ~7",
    "    indented\n        more\n    less", "line1\n\n\n\nline5", "trailing spaces   ", "   leading spaces",
    "tabs\tin\tbetween", "a  b   c    d     e", "!!!!!!", "...", "?!?!", "---===+++", "@#$%^&*()_+",
    "'''quoted'''", "“smart quotes” ‘single’", "em—dash en–dash", "→ ⇒ ∀x ∃y ∑∫√∞", "█▓▒░", "©®™",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>Hi<｜Assistant｜>Hello<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```<｜tool▁call▁end｜>",
    "<think>\nreasoning\n</think>\n\nanswer", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<|im_start|><|im_end|>", "text<|im_end|>text", "< |im_end| >", "<｜User", "<think",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    NULL};

static const char *const FRAGS[] = {
    "Hello", " world", "  ", "\n", "\n\n", "\r\n", "\t", "   \n  ", "12345", "3.14", "1,000", "0x1F", "中文",
    "测试一下", "日本語", "ひらがな", "カタカナ", "한국어", "😀", "👍🏽", "🇺🇸", "👨‍👩‍👧", "def f(x):\n    return x*2",
    "{\"a\": [1, 2]}", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁sep｜>", "<think>",
    "</think>", "<|im_start|>", "<|im_end|>", "Ünïcödé", "naïve", "Привет", "مرحبا", "नमस्ते", "'s", "'LL",
    "don't", "...", "!!!", "$$$", "a+b=c", "x_y-z", "@user", "#tag", "http://a.b/c?d=e", "\u00a0", "\u3000",
    "ﬁ", "Ⅻ", "½", "²³", "١٢٣", "e\u0301", "©®™", "—", "“q”", "C++", "std::map<K,V>", "fn main() {}",
    "λx.x", "∑∫", "█▓", "    ", "\n    ", "999999", "A", "a", " ", ".", ",", "(", ")", "ÀÉÎ", "Ελλάδα",
    NULL};

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 2685821657736338717ull) >> 32);
}

/* The test strings as a JSON array (also written to the file the reference reads). */
static json_t *make_strings(void) {
    json_t *a = json_array();
    for (int i = 0; FIXED[i]; i++) json_array_append_new(a, json_string(FIXED[i]));
    int nf = 0;
    while (FRAGS[nf]) nf++;
    for (int i = 0; i < 160; i++) {
        char buf[2048];
        size_t o = 0;
        int k = 2 + (int)(rnd() % 7);
        for (int j = 0; j < k; j++) {
            const char *f = FRAGS[rnd() % (uint32_t)nf];
            size_t l = strlen(f);
            if (o + l >= sizeof buf) break;
            memcpy(buf + o, f, l);
            o += l;
        }
        buf[o] = 0;
        json_array_append_new(a, json_string(buf));
    }
    /* long runs */
    char big[4096];
    memset(big, ' ', 300); big[300] = 0;
    json_array_append_new(a, json_string(big));
    memset(big, '\n', 120); big[120] = 0;
    json_array_append_new(a, json_string(big));
    memset(big, '7', 200); big[200] = 0;
    json_array_append_new(a, json_string(big));
    big[0] = 0;
    for (int i = 0; i < 60; i++) strcat(big, "😀");
    json_array_append_new(a, json_string(big));
    big[0] = 0;
    for (int i = 0; i < 100; i++) strcat(big, "中");
    json_array_append_new(a, json_string(big));
    return a;
}

static int run_capture(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; (got = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += got;
        if (cap - n < 4096) { cap *= 2; buf = realloc(buf, cap); }
    }
    buf[n] = 0;
    *out = buf;
    return pclose(p);
}

/* Ensures node_modules holds the reference package; installs it from the lockfile if not. */
static void ensure_npm_package(void) {
    if (access("node_modules/@huggingface/tokenizers/package.json", R_OK) == 0) return;
    assert_int_equal(access("package-lock.json", R_OK), 0); /* run from the repository root */
    int rc = system("npm ci --no-audit --no-fund --loglevel=error >&2");
    if (rc != 0) fail_msg("npm ci failed (rc %d): cannot install @huggingface/tokenizers", rc);
    assert_int_equal(access("node_modules/@huggingface/tokenizers/package.json", R_OK), 0);
}

static void compare_family(const char *family) {
    ensure_npm_package();
    char dir[1024], tj[1100], tc[1100], strs_path[1100], cmd[4096];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", shared_dir(), family);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    snprintf(strs_path, sizeof strs_path, "%s/strings_%s.json", g_tmpdir, family);

    json_t *strings = make_strings();
    /* plus the first 64 KiB of WikiText-2 (cut at a line end) as one long text */
    char wiki[1100];
    snprintf(wiki, sizeof wiki, "%s/data/wikitext-2-raw/wiki.test.raw", shared_dir());
    FILE *wf = fopen(wiki, "rb");
    if (wf) {
        char *buf = malloc(65536 + 1);
        size_t n = fread(buf, 1, 65536, wf);
        fclose(wf);
        while (n && buf[n - 1] != '\n') n--;
        json_array_append_new(strings, json_stringn(buf, n));
        free(buf);
    }
    assert_true(json_array_size(strings) >= 250);
    assert_int_equal(json_dump_file(strings, strs_path, 0), 0);

    snprintf(cmd, sizeof cmd, "node scripts/hf_tokenize.mjs '%s' '%s'", dir, strs_path);
    char *out;
    int rc = run_capture(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d", cmd, rc);
    json_error_t je;
    json_t *ref = json_loads(out, 0, &je);
    free(out);
    if (!json_is_array(ref)) fail_msg("reference output is not a JSON array: %s", je.text);
    assert_int_equal(json_array_size(ref), json_array_size(strings));

    kiln_bpe *b;
    if (kiln_bpe_load_hf_json(tj, tc, &b) != KILN_OK) fail_msg("%s", kiln_last_error());
    int mismatches = 0;
    size_t total_ids = 0;
    for (size_t i = 0; i < json_array_size(strings); i++) {
        json_t *s = json_array_get(strings, i), *e = json_array_get(ref, i);
        int32_t *ids;
        size_t n;
        if (kiln_bpe_encode(b, json_string_value(s), json_string_length(s), 1, &ids, &n) != KILN_OK)
            fail_msg("string %zu: %s", i, kiln_last_error());
        int same = json_array_size(e) == n;
        for (size_t k = 0; same && k < n; k++) same = json_integer_value(json_array_get(e, k)) == ids[k];
        if (!same) {
            mismatches++;
            char *js = json_dumps(s, JSON_ENCODE_ANY);
            print_error("%s: string %zu %.200s: npm %zu ids, kiln %zu ids\n", family, i, js, json_array_size(e), n);
            free(js);
        }
        total_ids += n;
        free(ids);
    }
    print_message("%s: %zu strings, %zu ids, %d mismatches\n", family, json_array_size(strings), total_ids, mismatches);
    assert_int_equal(mismatches, 0);
    kiln_bpe_free(b);
    json_decref(ref);
    json_decref(strings);
}

static void test_deepseek_v3_vs_npm(void **state) { (void)state; compare_family("deepseek-v3"); }
static void test_qwen3_vs_npm(void **state) { (void)state; compare_family("qwen3"); }

/* Both encoders' throughput on the same English text (printed, not asserted). */
static void test_speed_report(void **state) {
    (void)state;
    ensure_npm_package();
    char wiki[1100], dir[1100], tj[1200], cmd[4096];
    snprintf(wiki, sizeof wiki, "%s/data/wikitext-2-raw/wiki.test.raw", shared_dir());
    snprintf(dir, sizeof dir, "%s/tokenizers/deepseek-v3", shared_dir());
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    FILE *f = fopen(wiki, "rb");
    if (!f) { print_message("no %s: speed report skipped\n", wiki); return; }
    size_t cap = 256 * 1024;
    char *text = malloc(cap);
    size_t n = fread(text, 1, cap, f);
    fclose(f);
    while (n && text[n - 1] != '\n') n--;
    char sample[1100];
    snprintf(sample, sizeof sample, "%s/english.txt", g_tmpdir);
    f = fopen(sample, "wb");
    fwrite(text, 1, n, f);
    fclose(f);

    kiln_bpe *b;
    assert_int_equal(kiln_bpe_load_hf_json(tj, NULL, &b), KILN_OK);
    struct timespec t0, t1;
    int32_t *ids;
    size_t nid;
    int reps = 0;
    double dt = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        assert_int_equal(kiln_bpe_encode(b, text, n, 0, &ids, &nid), KILN_OK);
        free(ids);
        reps++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    } while (dt < 0.5);
    double kiln_mbs = (double)n * reps / dt / 1e6;
    kiln_bpe_free(b);

    snprintf(cmd, sizeof cmd, "node scripts/hf_tokenize.mjs '%s' --bench '%s' 1", dir, sample);
    char *out;
    int rc = run_capture(cmd, &out);
    if (rc != 0) fail_msg("%s: exit %d", cmd, rc);
    json_t *r = json_loads(out, 0, NULL);
    free(out);
    double npm_mbs = json_real_value(json_object_get(r, "mb_per_s"));
    print_message("encode speed, DeepSeek-V3 tokenizer, %zu bytes of English (WikiText-2), one core:\n"
                  "  kiln %.2f MB/s, @huggingface/tokenizers (node) %.2f MB/s, ratio %.1fx\n",
                  n, kiln_mbs, npm_mbs, npm_mbs > 0 ? kiln_mbs / npm_mbs : 0.0);
    json_decref(r);
    free(text);
    unlink(sample);
}

int main(void) {
    if (system("node --version >/dev/null 2>&1") != 0) {
        printf("node is not installed: skipping the npm tokenizer comparison\n");
        return 77;
    }
    const char *t = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/kiln_test_npm_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_tmpdir)) { perror("mkdtemp"); return 1; }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_v3_vs_npm),
        cmocka_unit_test(test_qwen3_vs_npm),
        cmocka_unit_test(test_speed_report),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmpdir);
    return rc;
}
