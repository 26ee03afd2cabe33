/* tokenizer.c — the parts every tokenizer kind shares: the vocabulary object, piece -> id hashing,
 * UTF-8 validation, decoding of pieces, and dispatch to the kind's encoder / loader / saver. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/bpe.h"
#include "base/status.h"
#include "format/gguf.h"
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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
    if (t->kind == KILN_TOK_BPE) kiln_bpe_free(t->impl);
    for (int i = 0; i < 3; i++) free(t->src_file[i]);
    free(t->chat_template);
    free(t->in_text);
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

/* 0 if s[0..len) is valid UTF-8, else -1 with *bad_off = the offset of the first bad byte (the
 * continuation byte at fault, not the start of its sequence: messages point at the byte). */
static int utf8_check(const char *s, size_t len, size_t *bad_off) {
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

/* BPE tokenizers keep their vocabulary in the kiln_bpe (t->impl); the shared fields of the
 * kiln_tokenizer that they use are kind, n_vocab, bos, eos, add_bos and src_file[]. */
int kiln_tok_vocab_size(const kiln_tokenizer *t) { return t->n_vocab; }
int kiln_tok_bos(const kiln_tokenizer *t) { return t->bos; }
int kiln_tok_eos(const kiln_tokenizer *t) { return t->eos; }

int kiln_tok_is_special(const kiln_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return 0;
    if (t->kind == KILN_TOK_BPE) return kiln_bpe_is_special(t->impl, id);
    return t->type[id] == KILN_TT_CONTROL;
}

const char *kiln_tok_chat_template(const kiln_tokenizer *t) {
    return t->kind == KILN_TOK_BPE ? kiln_bpe_chat_template(t->impl) : t->chat_template;
}

const char *kiln_tok_special_str(const kiln_tokenizer *t, int eos) {
    if (t->kind == KILN_TOK_BPE) return eos ? kiln_bpe_eos_str(t->impl) : kiln_bpe_bos_str(t->impl);
    int id = eos ? t->eos : t->bos;
    return id >= 0 && id < t->n_vocab ? t->piece[id] : NULL;
}

kiln_status kiln_tok_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
                            size_t *n) {
    return kiln_tok_encode_ex(t, text, len, add_bos, 1, ids, n);
}

kiln_status kiln_tok_encode_ex(const kiln_tokenizer *t, const char *text, size_t len, int add_bos,
                               int parse_special, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (len && !text) return kiln_fail(KILN_ERR_INVALID_ARG, "text: NULL with length %zu", len);
    size_t bad;
    if (utf8_check(text, len, &bad) != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "text: invalid UTF-8 at byte offset %zu (byte 0x%02x)", bad,
                         (unsigned char)text[bad]);
    int32_t *v = NULL;
    size_t m = 0;
    int bos = -1;
    switch (t->kind) {
    case KILN_TOK_SPM:
        KILN_TRY(kiln_spm_encode(t, text, len, parse_special, &v, &m));
        if (add_bos) bos = t->bos;
        break;
    case KILN_TOK_BPE:
        KILN_TRY(kiln_bpe_encode(t->impl, text, len, parse_special, &v, &m));
        /* byte-level vocabularies get BOS only when their configuration asks for it (DeepSeek: yes;
         * Qwen, GPT-2: no), as Hugging Face's add_special_tokens=True does */
        if (add_bos && t->add_bos) bos = t->bos;
        break;
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "tokenizer kind %d cannot encode", (int)t->kind);
    }
    if (bos >= 0) {
        int32_t *w = realloc(v, (m + 1) * sizeof *w);
        if (!w) {
            free(v);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory encoding %zu bytes", len);
        }
        memmove(w + 1, w, m * sizeof *w);
        w[0] = bos;
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
    if (len) *len = 0;
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (t->kind == KILN_TOK_BPE) {
        const char *p = kiln_bpe_decode_piece(t->impl, id, len);
        return p ? p : ""; /* an id inside the vocabulary's range that no token uses: no bytes */
    }
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
    if (t->kind == KILN_TOK_BPE) return kiln_bpe_token_str(t->impl, id);
    return t->piece[id];
}

/* ---- loading ------------------------------------------------------------------------------------ */
/* Wraps a loaded kiln_bpe (taking ownership) and records the files it came from. */
static kiln_status wrap_bpe(kiln_bpe *b, const char *f0, const char *f1, const char *f2, kiln_tokenizer **out) {
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        kiln_bpe_free(b);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    t->kind = KILN_TOK_BPE;
    t->impl = b;
    t->n_vocab = kiln_bpe_vocab_size(b);
    t->bos = kiln_bpe_bos(b);
    t->eos = kiln_bpe_eos(b);
    t->add_bos = kiln_bpe_add_bos(b);
    t->unk = t->pad = -1;
    const char *f[3] = {f0, f1, f2};
    for (int i = 0; i < 3; i++) {
        if (!f[i]) continue;
        t->src_file[i] = strdup(f[i]);
        if (!t->src_file[i]) {
            kiln_tok_free(t);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        }
    }
    *out = t;
    return KILN_OK;
}

static int file_exists(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* dirname(path)/name into buf; returns buf, or NULL if that file does not exist. */
static const char *sibling(const char *path, const char *name, char *buf, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(buf, cap, "%.*s/%s", (int)(slash - path), path, name);
    else snprintf(buf, cap, "%s", name);
    return file_exists(buf) ? buf : NULL;
}

kiln_status kiln_tok_load_gguf(const struct kiln_gguf *g, kiln_tokenizer **out) {
    *out = NULL;
    const char *model;
    if (kiln_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.model': missing (no embedded tokenizer)",
                         kiln_gguf_path(g));
    if (strcmp(model, "llama") == 0) return kiln_spm_load_gguf(g, out);
    if (strcmp(model, "gpt2") == 0) {
        kiln_bpe *b;
        KILN_TRY(kiln_bpe_load_gguf(g, &b));
        return wrap_bpe(b, NULL, NULL, NULL, out);
    }
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: key 'tokenizer.ggml.model': tokenizer model '%s' is not supported",
                     kiln_gguf_path(g), model);
}

kiln_status kiln_tok_load_tiktoken(const char *tiktoken_model, const char *tokenizer_config, kiln_tokenizer **out) {
    *out = NULL;
    if (!tokenizer_config)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: a tiktoken vocabulary needs the tokenizer_config.json beside it "
                         "(its added_tokens_decoder lists the special tokens)", tiktoken_model);
    kiln_bpe *b;
    KILN_TRY(kiln_bpe_load_tiktoken_config(tiktoken_model, tokenizer_config, NULL, &b));
    char jb[4200];
    return wrap_bpe(b, tiktoken_model, tokenizer_config, sibling(tiktoken_model, "chat_template.jinja", jb, sizeof jb),
                    out);
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
        return kiln_fail(file_exists(tokenizer_json) ? KILN_ERR_FORMAT : KILN_ERR_IO,
                         "%s: invalid JSON at line %d column %d: %s", tokenizer_json, err.line, err.column, err.text);
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
        /* byte-level (or plain merge-rank) BPE: bpe.c parses the file itself */
        json_decref(root);
        root = NULL;
        kiln_bpe *b;
        char jb[4200];
        st = kiln_bpe_load_hf_json(tokenizer_json, tokenizer_config, &b);
        if (st == KILN_OK)
            st = wrap_bpe(b, tokenizer_json, tokenizer_config,
                          sibling(tokenizer_json, "chat_template.jinja", jb, sizeof jb), out);
    }
    json_decref(root);
    return st;
}

kiln_status kiln_tok_load_path(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path ? path : "(null)", strerror(errno));
    char a[4200], c[4200];
    if (S_ISDIR(st.st_mode)) {
        snprintf(c, sizeof c, "%s/tokenizer_config.json", path);
        const char *cfg = file_exists(c) ? c : NULL;
        snprintf(a, sizeof a, "%s/tokenizer.json", path);
        if (file_exists(a)) return kiln_tok_load_hf(a, cfg, out);
        snprintf(a, sizeof a, "%s/tiktoken.model", path);
        if (file_exists(a)) return kiln_tok_load_tiktoken(a, cfg, out);
        snprintf(a, sizeof a, "%s/tokenizer.bin", path);
        if (file_exists(a)) return kiln_tok_load_llama2c(a, 0, out);
        return kiln_fail(KILN_ERR_IO, "%s: no tokenizer.json, tiktoken.model or tokenizer.bin in this directory", path);
    }
    size_t n = strlen(path);
    const char *cfg = sibling(path, "tokenizer_config.json", c, sizeof c);
    if (n >= 5 && strcmp(path + n - 5, ".gguf") == 0) {
        struct kiln_gguf *g;
        KILN_TRY(kiln_gguf_open(path, NULL, &g));
        kiln_status s = kiln_tok_load_gguf(g, out);
        kiln_gguf_close(g);
        return s;
    }
    if (n >= 4 && strcmp(path + n - 4, ".bin") == 0) return kiln_tok_load_llama2c(path, 0, out);
    /* JSON (tokenizer.json) starts with '{'; anything else is read as a tiktoken rank file */
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int ch;
    while ((ch = fgetc(f)) == ' ' || ch == '\n' || ch == '\r' || ch == '\t') {}
    fclose(f);
    if (ch != '{') return kiln_tok_load_tiktoken(path, cfg, out);
    struct stat cs;
    if (cfg && stat(cfg, &cs) == 0 && cs.st_ino == st.st_ino && cs.st_dev == st.st_dev) {
        /* tokenizer_config.json itself: use the vocabulary beside it */
        const char *v = sibling(path, "tokenizer.json", a, sizeof a);
        if (v) return kiln_tok_load_hf(v, cfg, out);
        if ((v = sibling(path, "tiktoken.model", a, sizeof a))) return kiln_tok_load_tiktoken(v, cfg, out);
        return kiln_fail(KILN_ERR_IO, "%s: no tokenizer.json or tiktoken.model beside it", path);
    }
    return kiln_tok_load_hf(path, cfg, out);
}

/* ---- saving ------------------------------------------------------------------------------------- */
/* Copies src to dir/name (nothing to do when they are the same file). */
static kiln_status copy_file(const char *src, const char *dir, const char *name) {
    char dst[4200];
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    struct stat a, b;
    if (stat(src, &a) == 0 && stat(dst, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return KILN_OK;
    FILE *in = fopen(src, "rb");
    if (!in) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int bad = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            bad = 1;
            break;
        }
    if (ferror(in)) bad = 1;
    fclose(in);
    if (fclose(out) != 0) bad = 1;
    if (bad) return kiln_fail(KILN_ERR_IO, "%s: copying %s failed: %s", dst, src, strerror(errno));
    return KILN_OK;
}

static kiln_status bpe_save_hf(const kiln_tokenizer *t, const char *dir) {
    if (!t->src_file[0]) return kiln_bpe_save_hf(t->impl, dir); /* a GGUF vocabulary: written out */
    size_t n = strlen(t->src_file[0]);
    int json = n >= 5 && strcmp(t->src_file[0] + n - 5, ".json") == 0;
    KILN_TRY(copy_file(t->src_file[0], dir, json ? "tokenizer.json" : "tiktoken.model"));
    if (t->src_file[1]) KILN_TRY(copy_file(t->src_file[1], dir, "tokenizer_config.json"));
    if (t->src_file[2]) KILN_TRY(copy_file(t->src_file[2], dir, "chat_template.jinja"));
    return KILN_OK;
}

kiln_status kiln_tok_save_hf(const kiln_tokenizer *t, const char *dir) {
    switch (t->kind) {
    case KILN_TOK_SPM: return kiln_spm_save_hf(t, dir);
    case KILN_TOK_BPE: return bpe_save_hf(t, dir);
    default: return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: saving tokenizer kind %d is not supported", dir, (int)t->kind);
    }
}

void kiln_tok_save_gguf(const kiln_tokenizer *t, struct kiln_gguf_writer *w) {
    switch (t->kind) {
    case KILN_TOK_SPM: kiln_spm_save_gguf(t, w); break;
    /* a vocabulary GGUF cannot hold (tiktoken ranks) is left out: the GGUF then has no tokenizer */
    case KILN_TOK_BPE: (void)kiln_bpe_save_gguf(t->impl, w); break;
    default: break;
    }
}
