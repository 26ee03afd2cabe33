/* bpe_gguf.c — kiln_bpe from GGUF metadata (tokenizer.ggml.model == "gpt2").
 *
 * Keys read: tokenizer.ggml.tokens (byte-level strings), token_type (1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte; control tokens become special added tokens, user-defined ones
 * non-special added tokens whose text is raw, not byte-level), merges ("left right" by rank),
 * pre (the pre-tokenizer name llama.cpp's converter recorded), bos/eos_token_id, add_bos_token,
 * add_eos_token, tokenizer.chat_template. Kept apart from bpe.c so that linking the BPE core does
 * not require the GGUF reader. */
#include "tokenizer/bpe_internal.h"
#include "base/status.h"
#include "format/gguf.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status load_gguf(kiln_bpe *b, const kiln_gguf *g) {
    const char *s;
    size_t len;
    if (kiln_gguf_get_str(g, "tokenizer.ggml.model", &s, &len))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.model: missing", b->name);
    if (len != 4 || memcmp(s, "gpt2", 4))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model: '%.*s' is not a byte-level BPE "
                         "(\"gpt2\") vocabulary", b->name, (int)len, s);
    char pre[64] = "default";
    int have_pre = 0;
    if (!kiln_gguf_get_str(g, "tokenizer.ggml.pre", &s, &len)) {
        if (len >= sizeof pre)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre: unknown pre-tokenizer type "
                             "'%.*s'", b->name, (int)len, s);
        memcpy(pre, s, len);
        pre[len] = 0;
        have_pre = 1;
    }
    if (have_pre && !(b->pre_name = kiln_bpe__strdup(pre, strlen(pre))))
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    /* kiln's own GGUFs carry the exact tokenizer.json pipeline; llama.cpp's name the pre-tokenizer */
    if (!kiln_gguf_get_str(g, "tokenizer.kiln.pipeline", &s, &len))
        KILN_TRY(kiln_bpe__parse_pipeline(b, s, len, "tokenizer.kiln.pipeline"));
    else
        KILN_TRY(kiln_bpe__set_pre_by_name(b, pre, "tokenizer.ggml.pre"));

    kiln_gguf_type et;
    uint64_t n_tok, n_type = 0, n_merge = 0;
    if (kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok) || et != KILN_GGUF_STRING)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens: missing or not a string array", b->name);
    if (!n_tok || n_tok > (1u << 28))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens: %llu tokens", b->name,
                         (unsigned long long)n_tok);
    int have_types = !kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n_type);
    if (have_types && n_type != n_tok)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type: %llu entries for %llu tokens",
                         b->name, (unsigned long long)n_type, (unsigned long long)n_tok);
    char field[96];
    /* vocabulary first (merges refer to it), added tokens after */
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < n_tok; i++) {
            double tv = 1;
            snprintf(field, sizeof field, "tokenizer.ggml.tokens[%llu]", (unsigned long long)i);
            if (have_types && kiln_gguf_arr_f64(g, "tokenizer.ggml.token_type", i, &tv))
                return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%llu]: not a number",
                                 b->name, (unsigned long long)i);
            int type = (int)tv, added = type == 3 || type == 4;
            if (added != pass) continue;
            if (kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len))
                return kiln_fail(KILN_ERR_FORMAT, "%s: %s: unreadable", b->name, field);
            if (!pass) KILN_TRY(kiln_bpe__set_vocab(b, (int32_t)i, s, len, BPE_TOK_BYTELEVEL, field));
            else KILN_TRY(kiln_bpe__add_added(b, (int32_t)i, s, len, type == 3, 0, 0, 0, field));
        }
        if (!pass) {
            KILN_TRY(kiln_bpe__index_vocab(b));
            if (!kiln_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merge) && et != KILN_GGUF_STRING)
                return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer.ggml.merges: not a string array", b->name);
            for (uint64_t i = 0; i < n_merge; i++) {
                snprintf(field, sizeof field, "tokenizer.ggml.merges[%llu]", (unsigned long long)i);
                if (kiln_gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, &len))
                    return kiln_fail(KILN_ERR_FORMAT, "%s: %s: unreadable", b->name, field);
                const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
                if (!sp)
                    return kiln_fail(KILN_ERR_FORMAT, "%s: %s: '%.*s' is not \"left right\"", b->name, field,
                                     (int)len, s);
                KILN_TRY(kiln_bpe__add_merge(b, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1,
                                             (int32_t)i, field));
            }
        }
    }
    uint64_t v;
    /* special ids: llama.cpp's "no token" sentinel (-1 / 0xFFFFFFFF) reads as none; any other id
     * outside the vocabulary is refused naming the key */
    static const char *const id_keys[2] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
    for (int k = 0; k < 2; k++) {
        int64_t id;
        if (kiln_gguf_get_token_id(g, id_keys[k], &id) != 0 || id == -1) continue;
        if (id < 0 || (uint64_t)id >= (uint64_t)n_tok)
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': token id %lld out of range (vocabulary of %llu)", b->name, id_keys[k],
                             (long long)id, (unsigned long long)n_tok);
        if (k == 0) b->bos = (int32_t)id;
        else b->eos = (int32_t)id;
    }
    if (!kiln_gguf_get_u64(g, "tokenizer.ggml.add_bos_token", &v)) b->add_bos = v != 0;
    if (!kiln_gguf_get_u64(g, "tokenizer.ggml.add_eos_token", &v)) b->add_eos = v != 0;
    if (!kiln_gguf_get_str(g, "tokenizer.chat_template", &s, &len)) {
        b->chat_template = kiln_bpe__strdup(s, len);
        if (!b->chat_template) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    }
    return kiln_bpe__finish(b);
}

kiln_status kiln_bpe_load_gguf(const kiln_gguf *g, kiln_bpe **out) {
    *out = NULL;
    if (!g) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_bpe_load_gguf: NULL file");
    const char *path = kiln_gguf_path(g);
    kiln_bpe *b = kiln_bpe__new(path ? path : "(gguf)");
    if (!b) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status st = load_gguf(b, g);
    if (st != KILN_OK) { kiln_bpe_free(b); return st; }
    *out = b;
    return KILN_OK;
}

kiln_status kiln_bpe_save_gguf(const kiln_bpe *b, kiln_gguf_writer *w) {
    if (b->tiktoken || !b->byte_level)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: a %s vocabulary cannot be stored as a GGUF \"gpt2\" tokenizer",
                         b->name, b->tiktoken ? "tiktoken" : "non-byte-level");
    size_t n = (size_t)b->n_vocab, nm = 0;
    const char **tok = calloc(n ? n : 1, sizeof *tok);
    int32_t *type = calloc(n ? n : 1, sizeof *type);
    char *unused = calloc(n ? n : 1, 24); /* placeholders for ids no token uses */
    bpe_merge_t *m = kiln_bpe__merges_sorted(b, &nm);
    const char **ms = calloc(nm ? nm : 1, sizeof *ms);
    char *mbuf = NULL;
    size_t mlen = 0;
    for (size_t i = 0; m && i < nm; i++) mlen += strlen(b->pool + b->str_off[m[i].l]) + strlen(b->pool + b->str_off[m[i].r]) + 2;
    mbuf = malloc(mlen ? mlen : 1);
    json_t *pipe = kiln_bpe__pipeline_json(b);
    char *pipe_s = pipe ? json_dumps(pipe, JSON_COMPACT) : NULL;
    json_decref(pipe);
    kiln_status st = KILN_OK;
    if (!tok || !type || !unused || !m || !ms || !mbuf || !pipe_s) {
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
        goto out;
    }
    for (size_t id = 0; id < n; id++) {
        uint8_t f = b->flags[id];
        if (!(f & BPE_F_PRESENT)) {
            snprintf(unused + 24 * id, 24, "[PAD%u]", (unsigned)id);
            tok[id] = unused + 24 * id;
            type[id] = 5;
            continue;
        }
        tok[id] = b->pool + b->str_off[id];
        type[id] = (f & BPE_F_ADDED) ? ((f & BPE_F_SPECIAL) ? 3 : 4) : 1;
    }
    char *p = mbuf;
    for (size_t i = 0; i < nm; i++) {
        ms[i] = p;
        p += sprintf(p, "%s %s", b->pool + b->str_off[m[i].l], b->pool + b->str_off[m[i].r]) + 1;
    }
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (b->pre_name) kiln_gguf_set_str(w, "tokenizer.ggml.pre", b->pre_name);
    kiln_gguf_set_str(w, "tokenizer.kiln.pipeline", pipe_s);
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", tok, n);
    kiln_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", type, n);
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.merges", ms, nm);
    if (b->bos >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)b->bos);
    if (b->eos >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)b->eos);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", b->add_bos);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", b->add_eos);
    if (b->chat_template) kiln_gguf_set_str(w, "tokenizer.chat_template", b->chat_template);
out:
    free(tok); free(type); free(unused); free(m); free(ms); free(mbuf); free(pipe_s);
    return st;
}
