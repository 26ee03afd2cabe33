/* test_gguf.c — GGUF reader and writer.
 *   - parses llama.cpp's vocabulary files from ../shared (public facts: Llama's 32000 pieces start
 *     <unk> <s> </s> <0x00>; GPT-2 has 50257 tokens, 50000 merges, <|endoftext|> = 50256);
 *   - writer -> reader round trip, with the raw bytes checked by an independent little parser here
 *     (ne[] innermost first, 32-byte aligned data);
 *   - hostile files built byte by byte: truncation at every length, wrong magic, bad version,
 *     tensor data or shape past EOF, overlapping tensors, absurd counts and lengths, bad n_dims,
 *     unknown ggml types, misaligned offsets — each a clean error naming file and field. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "base/status.h"
#include "format/gguf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char shared_dir[1024];
static char tmpdir[1100];

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_shared_llama_spm(void **state) {
    (void)state;
    char p[1200];
    snprintf(p, sizeof p, "%s/tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf", shared_dir);
    if (!exists(p)) skip();
    kiln_tensor_table tt = {0};
    kiln_gguf *g;
    if (kiln_gguf_open(p, &tt, &g) != KILN_OK) fail_msg("%s", kiln_last_error());
    assert_int_equal(tt.n, 0); /* vocabulary-only file */
    assert_int_equal(kiln_gguf_version(g), 3);
    const char *s;
    size_t len;
    assert_int_equal(kiln_gguf_get_str(g, "general.architecture", &s, &len), 0);
    assert_string_equal(s, "llama");
    assert_int_equal(len, 5);
    assert_int_equal(kiln_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL), 0);
    assert_string_equal(s, "llama");
    uint64_t v;
    assert_int_equal(kiln_gguf_get_u64(g, "llama.vocab_size", &v), 0);
    assert_int_equal(v, 32000);
    assert_int_equal(kiln_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(kiln_gguf_get_u64(g, "tokenizer.ggml.add_bos_token", &v), 0); /* bool */
    assert_int_equal(v, 1);
    float f;
    assert_int_equal(kiln_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
    assert_true(f > 0.99e-5f && f < 1.01e-5f);
    kiln_gguf_type et;
    uint64_t n;
    assert_int_equal(kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(et, KILN_GGUF_STRING);
    assert_int_equal(n, 32000);
    const char *want[] = {"<unk>", "<s>", "</s>", "<0x00>"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, &s, &len), 0);
        assert_string_equal(s, want[i]);
    }
    assert_int_equal(kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", 32000, &s, &len), -1);
    double d;
    assert_int_equal(kiln_gguf_arr_f64(g, "tokenizer.ggml.token_type", 1, &d), 0);
    assert_true(d == 3.0); /* control */
    assert_int_equal(kiln_gguf_arr_f64(g, "tokenizer.ggml.token_type", 3, &d), 0);
    assert_true(d == 6.0); /* byte */
    assert_int_equal(kiln_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n), 0);
    assert_int_equal(et, KILN_GGUF_F32);
    /* wrong-type and missing lookups */
    assert_int_equal(kiln_gguf_get_u64(g, "general.architecture", &v), -1);
    assert_int_equal(kiln_gguf_get_str(g, "llama.vocab_size", &s, NULL), -1);
    assert_int_equal(kiln_gguf_get_u64(g, "no.such.key", &v), -1);
    kiln_gguf_close(g);
    kiln_tt_free(&tt);
}

static void test_shared_gpt2(void **state) {
    (void)state;
    char p[1200];
    snprintf(p, sizeof p, "%s/tokenizers/gguf-vocab/ggml-vocab-gpt-2.gguf", shared_dir);
    if (!exists(p)) skip();
    kiln_gguf *g;
    if (kiln_gguf_open(p, NULL, &g) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_gguf_type et;
    uint64_t n, v;
    assert_int_equal(kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(n, 50257);
    assert_int_equal(kiln_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n), 0);
    assert_int_equal(n, 50000);
    assert_int_equal(kiln_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &v), 0);
    assert_int_equal(v, 50256);
    const char *s;
    assert_int_equal(kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", 50256, &s, NULL), 0);
    assert_string_equal(s, "<|endoftext|>");
    kiln_gguf_close(g);
}

/* ---- independent raw GGUF builder ------------------------------------------------------------- */
typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
        assert_non_null(b->b);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
/* tensor info: ne innermost first */
static void tinfo(buf *b, const char *name, uint32_t ndims, const uint64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, ndims);
    for (uint32_t i = 0; i < ndims; i++) u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
}
static void pad(buf *b, size_t a) {
    while (b->n % a) {
        uint8_t z = 0;
        put(b, &z, 1);
    }
}
static void zeros(buf *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t z = (uint8_t)i;
        put(b, &z, 1);
    }
}

static const char *save(const buf *b, const char *name) {
    static char p[1300];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b->b, 1, b->n, f), b->n);
    fclose(f);
    return p;
}

/* Opens `path` expecting status `st` and a message holding the path and every given substring. */
static void expect_fail(const char *path, kiln_status st, const char *sub1, const char *sub2) {
    kiln_tensor_table tt = {0};
    kiln_gguf *g = (kiln_gguf *)1;
    kiln_status got = kiln_gguf_open(path, &tt, &g);
    const char *msg = kiln_last_error();
    if (got != st) fail_msg("%s: status %d, want %d (%s)", path, got, st, msg);
    assert_null(g);
    assert_int_equal(tt.n, 0);
    if (!strstr(msg, path)) fail_msg("message '%s' lacks the path", msg);
    if (sub1 && !strstr(msg, sub1)) fail_msg("message '%s' lacks '%s'", msg, sub1);
    if (sub2 && !strstr(msg, sub2)) fail_msg("message '%s' lacks '%s'", msg, sub2);
    kiln_tt_free(&tt);
}

/* A valid two-tensor file: w [4, 8] f32 at 0, b [8] f32 at 128. */
static buf good_file(void) {
    buf b = {0};
    header(&b, 3, 2, 1);
    str(&b, "general.architecture");
    u32(&b, KILN_GGUF_STRING);
    str(&b, "llama");
    uint64_t ne_w[2] = {8, 4}, ne_b[1] = {8};
    tinfo(&b, "blk.0.attn_q.weight", 2, ne_w, 0, 0);
    tinfo(&b, "blk.0.bias", 1, ne_b, 0, 128);
    pad(&b, 32);
    zeros(&b, 128 + 32);
    return b;
}

static void test_raw_good(void **state) {
    (void)state;
    buf b = good_file();
    const char *p = save(&b, "good.gguf");
    kiln_tensor_table tt = {0};
    kiln_gguf *g;
    if (kiln_gguf_open(p, &tt, &g) != KILN_OK) fail_msg("%s", kiln_last_error());
    assert_int_equal(tt.n, 2);
    const kiln_tensor *w = kiln_tt_find(&tt, "blk.0.attn_q.weight");
    assert_non_null(w);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 4); /* outermost first */
    assert_int_equal(w->shape[1], 8);
    assert_int_equal(w->dtype, KILN_DT_F32);
    assert_int_equal(w->nbytes, 128);
    size_t data_start = (b.n - 160);
    assert_int_equal(w->offset, data_start);
    assert_int_equal(kiln_gguf_data_offset(g), data_start);
    assert_memory_equal(w->data, b.b + data_start, 128);
    const kiln_tensor *bb = kiln_tt_find(&tt, "blk.0.bias");
    assert_int_equal(bb->offset, data_start + 128);
    assert_memory_equal(bb->data, b.b + data_start + 128, 32);
    kiln_gguf_close(g);
    kiln_tt_free(&tt);
    /* GGUF v2 has the same layout */
    memcpy(b.b + 4, &(uint32_t){2}, 4);
    p = save(&b, "v2.gguf");
    assert_int_equal(kiln_gguf_open(p, NULL, &g), KILN_OK);
    kiln_gguf_close(g);
    free(b.b);
}

static void test_truncated_everywhere(void **state) {
    (void)state;
    buf b = good_file();
    for (size_t cut = 0; cut < b.n; cut++) {
        buf t = {b.b, cut, cut};
        const char *p = save(&t, "trunc.gguf");
        kiln_tensor_table tt = {0};
        kiln_gguf *g;
        kiln_status st = kiln_gguf_open(p, &tt, &g);
        if (st == KILN_OK) fail_msg("truncated at %zu: opened", cut);
        assert_int_equal(st, KILN_ERR_FORMAT);
        if (!strstr(kiln_last_error(), p)) fail_msg("cut %zu: '%s' lacks the path", cut, kiln_last_error());
        assert_int_equal(tt.n, 0);
    }
    /* specific wording */
    buf t = {b.b, 10, 10};
    expect_fail(save(&t, "trunc.gguf"), KILN_ERR_FORMAT, "truncated at offset 8", "n_tensors");
    t.n = b.n - 1;
    expect_fail(save(&t, "trunc.gguf"), KILN_ERR_FORMAT, "tensor 'blk.0.bias'", "runs past end of file");
    free(b.b);
}

static void test_bad_magic_and_version(void **state) {
    (void)state;
    buf b = good_file();
    memcpy(b.b, "GGUX", 4);
    expect_fail(save(&b, "magic.gguf"), KILN_ERR_FORMAT, "magic", "offset 0");
    memcpy(b.b, "GGUF", 4);
    memcpy(b.b + 4, &(uint32_t){4}, 4);
    expect_fail(save(&b, "version.gguf"), KILN_ERR_UNSUPPORTED, "version", ": 4");
    free(b.b);
}

static void test_tensor_past_eof(void **state) {
    (void)state;
    uint64_t ne[2] = {8, 4};
    /* offset past EOF */
    buf b = {0};
    header(&b, 3, 1, 0);
    tinfo(&b, "blk.0.attn_q.weight", 2, ne, 0, 4096);
    pad(&b, 32);
    zeros(&b, 128);
    expect_fail(save(&b, "off.gguf"), KILN_ERR_FORMAT, "tensor 'blk.0.attn_q.weight': data [", "runs past end of file");
    free(b.b);
    /* shape past EOF */
    b = (buf){0};
    uint64_t big[2] = {8, 400000};
    header(&b, 3, 1, 0);
    tinfo(&b, "blk.0.attn_q.weight", 2, big, 0, 0);
    pad(&b, 32);
    zeros(&b, 128);
    expect_fail(save(&b, "shape.gguf"), KILN_ERR_FORMAT, "blk.0.attn_q.weight", "runs past end of file");
    free(b.b);
    /* absurd dimension */
    b = (buf){0};
    uint64_t huge[2] = {8, (uint64_t)1 << 62};
    header(&b, 3, 1, 0);
    tinfo(&b, "w", 2, huge, 0, 0);
    zeros(&b, 64);
    expect_fail(save(&b, "huge.gguf"), KILN_ERR_FORMAT, "tensor 'w': ne[1]", "out of range");
    free(b.b);
    /* element count overflow */
    b = (buf){0};
    uint64_t ov[4] = {1u << 30, 1u << 30, 1u << 30, 1u << 30};
    header(&b, 3, 1, 0);
    tinfo(&b, "w", 4, ov, 0, 0);
    zeros(&b, 64);
    expect_fail(save(&b, "ovf.gguf"), KILN_ERR_FORMAT, "tensor 'w'", "overflow");
    free(b.b);
}

static void test_overlap(void **state) {
    (void)state;
    uint64_t ne[1] = {32};
    buf b = {0};
    header(&b, 3, 2, 0);
    tinfo(&b, "a", 1, ne, 0, 0);
    tinfo(&b, "b", 1, ne, 0, 96); /* a is [0,128) -> b at 96 overlaps */
    pad(&b, 32);
    zeros(&b, 256);
    expect_fail(save(&b, "overlap.gguf"), KILN_ERR_FORMAT, "tensor 'b'", "overlaps tensor 'a'");
    free(b.b);
    /* duplicate names */
    b = (buf){0};
    header(&b, 3, 2, 0);
    tinfo(&b, "a", 1, ne, 0, 0);
    tinfo(&b, "a", 1, ne, 0, 128);
    pad(&b, 32);
    zeros(&b, 256);
    expect_fail(save(&b, "dup.gguf"), KILN_ERR_FORMAT, "'a'", "twice");
    free(b.b);
}

static void test_absurd_counts(void **state) {
    (void)state;
    buf b = {0};
    header(&b, 3, 0, (uint64_t)1 << 60);
    zeros(&b, 64);
    expect_fail(save(&b, "nkv.gguf"), KILN_ERR_FORMAT, "n_kv", "absurd");
    free(b.b);
    b = (buf){0};
    header(&b, 3, (uint64_t)1 << 40, 0);
    zeros(&b, 64);
    expect_fail(save(&b, "nt.gguf"), KILN_ERR_FORMAT, "n_tensors", "absurd");
    free(b.b);
    /* string length past EOF */
    b = (buf){0};
    header(&b, 3, 0, 1);
    str(&b, "general.name");
    u32(&b, KILN_GGUF_STRING);
    u64(&b, (uint64_t)1 << 50);
    put(&b, "abc", 3);
    expect_fail(save(&b, "strlen.gguf"), KILN_ERR_FORMAT, "general.name", "string length");
    free(b.b);
    /* array count past EOF */
    b = (buf){0};
    header(&b, 3, 0, 1);
    str(&b, "tokenizer.ggml.scores");
    u32(&b, KILN_GGUF_ARRAY);
    u32(&b, KILN_GGUF_F32);
    u64(&b, (uint64_t)1 << 40);
    zeros(&b, 16);
    expect_fail(save(&b, "arr.gguf"), KILN_ERR_FORMAT, "tokenizer.ggml.scores", "runs past end of file");
    free(b.b);
    /* string array count larger than the file could hold */
    b = (buf){0};
    header(&b, 3, 0, 1);
    str(&b, "tokenizer.ggml.tokens");
    u32(&b, KILN_GGUF_ARRAY);
    u32(&b, KILN_GGUF_STRING);
    u64(&b, (uint64_t)1 << 40);
    zeros(&b, 16);
    expect_fail(save(&b, "sarr.gguf"), KILN_ERR_FORMAT, "tokenizer.ggml.tokens", "array count");
    free(b.b);
    /* unknown value type */
    b = (buf){0};
    header(&b, 3, 0, 1);
    str(&b, "k");
    u32(&b, 99);
    zeros(&b, 16);
    expect_fail(save(&b, "vtype.gguf"), KILN_ERR_FORMAT, "key 'k'", "unknown value type 99");
    free(b.b);
    /* bad alignment value */
    b = (buf){0};
    header(&b, 3, 0, 1);
    str(&b, "general.alignment");
    u32(&b, KILN_GGUF_U32);
    u32(&b, 48);
    expect_fail(save(&b, "align.gguf"), KILN_ERR_FORMAT, "general.alignment", "48");
    free(b.b);
}

static void test_bad_tensor_info(void **state) {
    (void)state;
    uint64_t ne[5] = {32, 1, 1, 1, 1};
    buf b = {0};
    header(&b, 3, 1, 0);
    tinfo(&b, "t5", 5, ne, 0, 0);
    zeros(&b, 256);
    expect_fail(save(&b, "ndims.gguf"), KILN_ERR_FORMAT, "tensor 't5': n_dims", "5");
    free(b.b);
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "tq", 1, ne, 1000, 0);
    zeros(&b, 256);
    expect_fail(save(&b, "type.gguf"), KILN_ERR_FORMAT, "tensor 'tq'", "ggml type 1000");
    free(b.b);
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "tk", 1, (uint64_t[]){256}, 16 /* IQ2_XXS: a ggml type kiln does not read */, 0);
    zeros(&b, 256);
    expect_fail(save(&b, "iq2xxs.gguf"), KILN_ERR_UNSUPPORTED, "tensor 'tk' is IQ2_XXS", "ggml type 16");
    free(b.b);
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "tt", 1, (uint64_t[]){256}, 34 /* TQ1_0 */, 0);
    zeros(&b, 256);
    expect_fail(save(&b, "tq1.gguf"), KILN_ERR_UNSUPPORTED, "tensor 'tt' is TQ1_0", "kiln does not read");
    free(b.b);
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "tr", 1, (uint64_t[]){256}, 4 /* Q4_2: removed from ggml, no file holds it */, 0);
    zeros(&b, 256);
    expect_fail(save(&b, "q42.gguf"), KILN_ERR_FORMAT, "tensor 'tr'", "ggml type 4 at offset");
    free(b.b);
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "ta", 1, ne, 0, 4);
    pad(&b, 32);
    zeros(&b, 256);
    expect_fail(save(&b, "misal.gguf"), KILN_ERR_FORMAT, "tensor 'ta'", "alignment");
    free(b.b);
    /* Q8_0 rows must hold whole blocks */
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "q8", 1, (uint64_t[]){33}, 8, 0);
    pad(&b, 32);
    zeros(&b, 256);
    expect_fail(save(&b, "q8.gguf"), KILN_ERR_FORMAT, "tensor 'q8'", "block size");
    free(b.b);
    /* so must the K-quants' and IQ4_XS's (256) and IQ4_NL's (32) */
    static const struct { uint32_t type; uint64_t ne0; const char *name; } rows[] = {
        {10, 128, "q2_k block size 256"}, {11, 384, "q3_k block size 256"}, {23, 32, "iq4_xs block size 256"},
        {20, 48, "iq4_nl block size 32"}, {3, 16, "q4_1 block size 32"}, {6, 40, "q5_0 block size 32"}, {7, 8, "q5_1 block size 32"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        b = (buf){0};
        header(&b, 3, 1, 0);
        tinfo(&b, "kq", 1, (uint64_t[]){rows[i].ne0}, rows[i].type, 0);
        pad(&b, 32);
        zeros(&b, 1024);
        expect_fail(save(&b, "kq.gguf"), KILN_ERR_FORMAT, "tensor 'kq'", rows[i].name);
        free(b.b);
    }
    /* zero-sized dimension */
    b = (buf){0};
    header(&b, 3, 1, 0);
    tinfo(&b, "z", 2, (uint64_t[]){4, 0}, 0, 0);
    zeros(&b, 64);
    expect_fail(save(&b, "zero.gguf"), KILN_ERR_FORMAT, "tensor 'z': ne[1]", "out of range");
    free(b.b);
    expect_fail(save(&(buf){(uint8_t *)"", 0, 0}, "empty.gguf"), KILN_ERR_FORMAT, "empty", NULL);
}

/* ---- writer ----------------------------------------------------------------------------------- */
static void test_writer_roundtrip(void **state) {
    (void)state;
    char p[1300];
    snprintf(p, sizeof p, "%s/w.gguf", tmpdir);
    float a[3 * 5];
    for (int i = 0; i < 15; i++) a[i] = (float)i * 0.5f - 3.0f;
    uint16_t h[7];
    for (int i = 0; i < 7; i++) h[i] = (uint16_t)(0x3c00 + i); /* f16 */
    uint8_t q[2 * 34];
    for (int i = 0; i < 68; i++) q[i] = (uint8_t)(i * 7);
    uint16_t bf[2 * 2 * 3];
    for (int i = 0; i < 12; i++) bf[i] = (uint16_t)(0x3f80 + i);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "general.architecture", "llama");
    kiln_gguf_set_u32(w, "llama.block_count", 7);
    kiln_gguf_set_u64(w, "big", (uint64_t)1 << 40);
    kiln_gguf_set_f32(w, "llama.rope.freq_base", 10000.0f);
    kiln_gguf_set_bool(w, "flag", 1);
    kiln_gguf_set_u32(w, "llama.block_count", 8); /* replaces */
    const char *strs[] = {"a", "", "▁hello"};
    kiln_gguf_set_arr_str(w, "tokens", strs, 3);
    float fs[] = {1.5f, -2.0f};
    kiln_gguf_set_arr_f32(w, "scores", fs, 2);
    int32_t is[] = {1, -3, 6};
    kiln_gguf_set_arr_i32(w, "types", is, 3);
    kiln_gguf_add_tensor(w, "a", KILN_DT_F32, 2, (int64_t[]){3, 5}, a, sizeof a);
    kiln_gguf_add_tensor(w, "h", KILN_DT_F16, 1, (int64_t[]){7}, h, sizeof h);
    kiln_gguf_add_tensor(w, "q", KILN_DT_Q8_0, 2, (int64_t[]){2, 32}, q, sizeof q);
    kiln_gguf_add_tensor(w, "bf", KILN_DT_BF16, 3, (int64_t[]){2, 2, 3}, bf, sizeof bf);
    if (kiln_gguf_write(w, p) != KILN_OK) fail_msg("%s", kiln_last_error());
    kiln_gguf_writer_free(w);

    /* raw bytes: magic, version 3, counts, and tensor a's ne[] innermost first */
    FILE *f = fopen(p, "rb");
    uint8_t raw[4096];
    size_t n = fread(raw, 1, sizeof raw, f);
    fclose(f);
    assert_memory_equal(raw, "GGUF", 4);
    uint32_t ver;
    uint64_t nt, nkv;
    memcpy(&ver, raw + 4, 4);
    memcpy(&nt, raw + 8, 8);
    memcpy(&nkv, raw + 16, 8);
    assert_int_equal(ver, 3);
    assert_int_equal(nt, 4);
    assert_int_equal(nkv, 8);
    const uint8_t pat[] = {1, 0, 0, 0, 0, 0, 0, 0, 'a', 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0};
    assert_non_null(memmem(raw, n, pat, sizeof pat));

    kiln_tensor_table tt = {0};
    kiln_gguf *g;
    if (kiln_gguf_open(p, &tt, &g) != KILN_OK) fail_msg("%s", kiln_last_error());
    assert_int_equal(kiln_gguf_data_offset(g) % 32, 0);
    const char *s;
    uint64_t v;
    float fv;
    double d;
    assert_int_equal(kiln_gguf_get_str(g, "general.architecture", &s, NULL), 0);
    assert_string_equal(s, "llama");
    assert_int_equal(kiln_gguf_get_u64(g, "llama.block_count", &v), 0);
    assert_int_equal(v, 8);
    assert_int_equal(kiln_gguf_get_u64(g, "big", &v), 0);
    assert_int_equal(v, (uint64_t)1 << 40);
    assert_int_equal(kiln_gguf_get_f32(g, "llama.rope.freq_base", &fv), 0);
    assert_true(fv == 10000.0f);
    assert_int_equal(kiln_gguf_get_u64(g, "flag", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(kiln_gguf_arr_str(g, "tokens", 2, &s, NULL), 0);
    assert_string_equal(s, "▁hello");
    assert_int_equal(kiln_gguf_arr_str(g, "tokens", 1, &s, NULL), 0);
    assert_string_equal(s, "");
    assert_int_equal(kiln_gguf_arr_f64(g, "scores", 0, &d), 0);
    assert_true(d == 1.5);
    assert_int_equal(kiln_gguf_arr_f64(g, "types", 1, &d), 0);
    assert_true(d == -3.0);
    assert_int_equal(tt.n, 4);
    struct { const char *name; kiln_dtype dt; int nd; int64_t sh[3]; const void *data; size_t nb; } want[] = {
        {"a", KILN_DT_F32, 2, {3, 5}, a, sizeof a},
        {"h", KILN_DT_F16, 1, {7}, h, sizeof h},
        {"q", KILN_DT_Q8_0, 2, {2, 32}, q, sizeof q},
        {"bf", KILN_DT_BF16, 3, {2, 2, 3}, bf, sizeof bf},
    };
    for (int i = 0; i < 4; i++) {
        const kiln_tensor *t = kiln_tt_find(&tt, want[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, want[i].dt);
        assert_int_equal(t->ndim, want[i].nd);
        for (int k = 0; k < t->ndim; k++) assert_int_equal(t->shape[k], want[i].sh[k]);
        assert_int_equal(t->nbytes, want[i].nb);
        assert_memory_equal(t->data, want[i].data, want[i].nb);
        assert_int_equal((t->offset - kiln_gguf_data_offset(g)) % 32, 0);
        assert_int_equal(t->offset % 32, 0);
    }
    kiln_gguf_close(g);
    kiln_tt_free(&tt);

    /* misuse is reported at write time, naming the file and tensor */
    w = kiln_gguf_writer_new();
    kiln_gguf_add_tensor(w, "bad", KILN_DT_F32, 2, (int64_t[]){3, 5}, a, 12);
    assert_int_equal(kiln_gguf_write(w, p), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "bad"));
    assert_non_null(strstr(kiln_last_error(), p));
    kiln_gguf_writer_free(w);
    unlink(p);
}

static int setup(void **state) {
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kiln_ggufXXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const char *s = getenv("SHARED");
    snprintf(shared_dir, sizeof shared_dir, "%s", s && *s ? s : "../shared");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_llama_spm),
        cmocka_unit_test(test_shared_gpt2),
        cmocka_unit_test(test_raw_good),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_tensor_past_eof),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_absurd_counts),
        cmocka_unit_test(test_bad_tensor_info),
        cmocka_unit_test(test_writer_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
