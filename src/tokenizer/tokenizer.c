/* tokenizer.c — the parts every tokenizer kind shares: the vocabulary object, piece -> id hashing,
 * UTF-8 validation, decoding of pieces, and dispatch to the kind's encoder / loader / saver. */
#include "tokenizer/tok_internal.h"
#include "base/status.h"
#include "format/gguf.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

kiln_tokenizer *kiln_tok_alloc(kiln_tok_kind kind, int n_vocab) {
    if (n_vocab <= 0) return NULL;
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)n_vocab, sizeof *t->piece_len);
    t->score = calloc((size_t)n_vocab, sizeof *t->score);
    t->type = calloc((size_t)n_vocab, sizeof *t->type);
    t->dec = calloc((size_t)n_vocab, sizeof *t->dec);
    t->dec_len = calloc((size_t)n_vocab, sizeof *t->dec_len);
    if (!t->piece || !t->piece_len || !t->score || !t->type || !t->dec || !t->dec_len) {
        kiln_tok_free(t);
        return NULL;
    }
    for (int i = 0; i < n_vocab; i++) t->type[i] = KILN_TT_NORMAL;
    t->bos = t->eos = t->unk = t->pad = -1;
    t->space = "\xe2\x96\x81";
    t->space_len = 3;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    return t;
}

void kiln_tok_free(kiln_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->piece) free(t->piece[i]);
        if (t->dec) free(t->dec[i]);
    }
    free(t->piece);
    free(t->piece_len);
    free(t->score);
    free(t->type);
    free(t->dec);
    free(t->dec_len);
    free(t->hash);
    /* BPE state: bpe.c frees its own impl in its case of this function */
    free(t);
}

int kiln_tok_set_piece(kiln_tokenizer *t, int i, const char *s, size_t len) {
    char *p = malloc(len + 1);
    if (!p) return -1;
    memcpy(p, s, len);
    p[len] = 0;
    free(t->piece[i]);
    t->piece[i] = p;
    t->piece_len[i] = (uint32_t)len;
    return 0;
}

static uint32_t hash_bytes(const char *s, size_t len) { return (uint32_t)XXH3_64bits(s, len); }

int32_t kiln_tok_lookup(const kiln_tokenizer *t, const char *s, size_t len) {
    if (!t->hash) return -1;
    uint32_t h = hash_bytes(s, len) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[h];
        if (id < 0) return -1;
        if (t->piece_len[id] == len && memcmp(t->piece[id], s, len) == 0) return id;
        h = (h + 1) & t->hash_mask;
    }
}

/* "<0xNN>" with two upper-case hex digits (SentencePiece's byte pieces) -> byte, else -1. */
static int byte_piece(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

kiln_status kiln_tok_finish(kiln_tokenizer *t, const char *what) {
    uint32_t size = 1;
    while (size < 2u * (uint32_t)t->n_vocab) size <<= 1;
    free(t->hash);
    t->hash = malloc(size * sizeof *t->hash);
    if (!t->hash) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", what);
    memset(t->hash, 0xff, size * sizeof *t->hash);
    t->hash_mask = size - 1;
    for (int i = 0; i < t->n_vocab; i++) {
        if (!t->piece[i]) return kiln_fail(KILN_ERR_FORMAT, "%s: token id %d has no piece", what, i);
        uint32_t h = hash_bytes(t->piece[i], t->piece_len[i]) & t->hash_mask;
        int dup = 0;
        while (t->hash[h] >= 0) {
            int32_t o = t->hash[h];
            /* duplicate pieces: the first id wins (as SentencePiece's own maps keep one) */
            if (t->piece_len[o] == t->piece_len[i] && memcmp(t->piece[o], t->piece[i], t->piece_len[i]) == 0) {
                dup = 1;
                break;
            }
            h = (h + 1) & t->hash_mask;
        }
        if (!dup) t->hash[h] = i;
    }
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->type[i] != KILN_TT_BYTE) continue;
        int b = byte_piece(t->piece[i], t->piece_len[i]);
        if (b >= 0 && t->byte_id[b] < 0) t->byte_id[b] = i;
    }
    /* decoded bytes (BPE fills its own before calling this) */
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->dec[i]) continue;
        const char *p = t->piece[i];
        size_t n = t->piece_len[i];
        char *d = malloc(n + 1);
        if (!d) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", what);
        size_t m = 0;
        int b = t->type[i] == KILN_TT_BYTE ? byte_piece(p, n) : -1;
        if (b >= 0) {
            d[m++] = (char)b;
        } else if (t->type[i] == KILN_TT_CONTROL) {
            /* control pieces (<s>, </s>) print as nothing */
        } else {
            for (size_t j = 0; j < n;) {
                if (t->space_len > 1 && j + t->space_len <= n && memcmp(p + j, t->space, t->space_len) == 0) {
                    d[m++] = ' ';
                    j += t->space_len;
                } else {
                    d[m++] = p[j++];
                }
            }
        }
        d[m] = 0;
        t->dec[i] = d;
        t->dec_len[i] = (uint32_t)m;
    }
    return KILN_OK;
}

int kiln_utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

int kiln_utf8_validate(const char *s, size_t len, size_t *bad_off) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned char c = u[i];
        if (c < 0x80) { i++; continue; }
        int n;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
        else { *bad_off = i; return -1; }
        if (len - i < (size_t)n) { *bad_off = i; return -1; }
        for (int k = 1; k < n; k++) {
            if ((u[i + k] & 0xc0) != 0x80) { *bad_off = i + k; return -1; }
            cp = (cp << 6) | (u[i + k] & 0x3f);
        }
        /* overlong 3/4-byte forms, UTF-16 surrogates, > U+10FFFF */
        if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) {
            *bad_off = i;
            return -1;
        }
        i += (size_t)n;
    }
    return 0;
}

int kiln_tok_vocab_size(const kiln_tokenizer *t) { return t->n_vocab; }
int kiln_tok_bos(const kiln_tokenizer *t) { return t->bos; }
int kiln_tok_eos(const kiln_tokenizer *t) { return t->eos; }

kiln_status kiln_tok_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                            size_t *n) {
    *ids = NULL;
    *n = 0;
    size_t bad;
    if (len && !text) return kiln_fail(KILN_ERR_INVALID_ARG, "text: NULL with length %zu", len);
    if (kiln_utf8_validate(text, len, &bad) != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "text: invalid UTF-8 at byte offset %zu (byte 0x%02x)", bad,
                         (unsigned char)text[bad]);
    int32_t *v = NULL;
    size_t m = 0;
    switch (t->kind) {
    case KILN_TOK_SPM: KILN_TRY(kiln_spm_encode(t, text, len, &v, &m)); break;
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "tokenizer kind %d cannot encode", (int)t->kind);
    }
    if (add_bos && t->bos >= 0) {
        int32_t *w = realloc(v, (m + 1) * sizeof *w);
        if (!w) {
            free(v);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory encoding %zu bytes", len);
        }
        memmove(w + 1, w, m * sizeof *w);
        w[0] = t->bos;
        v = w;
        m++;
    }
    if (!v) v = malloc(sizeof *v); /* never hand back NULL on success */
    if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    *ids = v;
    *n = m;
    return KILN_OK;
}

const char *kiln_tok_piece(const kiln_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    const char *d = t->dec[id];
    size_t n = t->dec_len[id];
    /* SentencePiece (and llama2.c run.c decode()) drop the leading space of the first piece after
     * BOS: it is the dummy prefix the encoder added. */
    if (t->kind == KILN_TOK_SPM && prev >= 0 && prev == t->bos && n > 0 && d[0] == ' ') {
        d++;
        n--;
    }
    if (len) *len = n;
    return d;
}

const char *kiln_tok_raw_piece(const kiln_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return t->piece[id];
}

kiln_status kiln_tok_load_gguf(const struct kiln_gguf *g, kiln_tokenizer **out) {
    *out = NULL;
    const char *model;
    if (kiln_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.model': missing (no embedded tokenizer)",
                         kiln_gguf_path(g));
    if (strcmp(model, "llama") == 0) return kiln_spm_load_gguf(g, out);
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: key 'tokenizer.ggml.model': tokenizer model '%s' is not supported",
                     kiln_gguf_path(g), model);
}

/* A tokenizer.json is "SentencePiece-style" (Llama / Mistral / TinyLlama) when its BPE model uses
 * byte fallback or its text is normalized / pre-tokenized with the ▁ space symbol. */
static int json_mentions_metaspace(json_t *j) {
    if (!j) return 0;
    if (json_is_object(j)) {
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "Metaspace") == 0) return 1;
        const char *content = json_string_value(json_object_get(j, "content"));
        if (type && strcmp(type, "Replace") == 0 && content && strcmp(content, "\xe2\x96\x81") == 0) return 1;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) if (json_mentions_metaspace(v)) return 1;
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) if (json_mentions_metaspace(v)) return 1;
    }
    return 0;
}

kiln_status kiln_tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, kiln_tokenizer **out) {
    *out = NULL;
    json_error_t err;
    json_t *root = json_load_file(tokenizer_json, 0, &err);
    if (!root)
        return kiln_fail(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", tokenizer_json, err.line,
                         err.column, err.text);
    kiln_status st;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model)) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'model': missing or not an object", tokenizer_json);
    } else if (!mtype || strcmp(mtype, "BPE") != 0) {
        st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'model.type': '%s' is not supported", tokenizer_json,
                       mtype ? mtype : "(missing)");
    } else if (json_is_true(json_object_get(model, "byte_fallback")) ||
               json_mentions_metaspace(json_object_get(root, "normalizer")) ||
               json_mentions_metaspace(json_object_get(root, "pre_tokenizer"))) {
        st = kiln_spm_load_hf(tokenizer_json, tokenizer_config, root, out);
    } else {
        st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: byte-level BPE tokenizer.json is not supported yet", tokenizer_json);
    }
    json_decref(root);
    return st;
}

kiln_status kiln_tok_save_hf(const kiln_tokenizer *t, const char *dir) {
    switch (t->kind) {
    case KILN_TOK_SPM: return kiln_spm_save_hf(t, dir);
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: saving tokenizer kind %d is not supported", dir, (int)t->kind);
    }
}

void kiln_tok_save_gguf(const kiln_tokenizer *t, struct kiln_gguf_writer *w) {
    switch (t->kind) {
    case KILN_TOK_SPM: kiln_spm_save_gguf(t, w); break;
    default: break;
    }
}
