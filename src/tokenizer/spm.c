/* spm.c — SentencePiece-style BPE: merges the adjacent pair whose concatenation is a vocabulary
 * piece with the highest score (ties: leftmost), then maps leftover characters to <0xNN> byte
 * pieces (byte fallback) or <unk>.
 *
 * One encoder serves llama2.c tokenizer.bin, GGUF tokenizer.ggml.model "llama" and Hugging Face
 * Llama tokenizer.json files. Semantics follow SentencePiece's BPE model (bpe_model.cc), which
 * llama.cpp's llm_tokenizer_spm and llama2.c's run.c encode() reproduce for ordinary text:
 *   - non-empty text gets the space symbol prepended (add_dummy_prefix / add_space_prefix) and
 *     every ' ' becomes the space symbol (U+2581 "▁"; llama2.c files store it as ' ');
 *   - the text is split into UTF-8 characters; pairs merge only into NORMAL / USER_DEFINED pieces.
 *     llama2.c's run.c (and llama.cpp) would also merge into control or byte pieces such as "<s>"
 *     or "<0x41>" when the text spells them out; SentencePiece never does, and Meta's ids follow
 *     SentencePiece, so kiln does too (documented choice; ordinary text is unaffected);
 *   - a final symbol that is not a piece becomes its bytes' <0xNN> pieces, or unk without them.
 * A literal U+2581 in the text is the same as a space (SentencePiece cannot tell them apart). */
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

/* ---- encoder ---------------------------------------------------------------------------------- */
typedef struct {
    int start, len, prev, next;
} sym;

typedef struct {
    float score;
    int left, right, size;
} bigram;

typedef struct {
    bigram *v;
    size_t n, cap;
} heap;

/* a before b in the queue: higher score, then the leftmost */
static int bg_before(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        bigram *v = realloc(h->v, cap * sizeof *v);
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(&b, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = b;
    return 0;
}

static bigram heap_pop(heap *h) {
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bigram *best = &last;
        if (l < h->n && bg_before(&h->v[l], best)) { m = l; best = &h->v[l]; }
        if (r < h->n && bg_before(&h->v[r], best)) { m = r; }
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static int mergeable(const kiln_tokenizer *t, int32_t id) {
    return id >= 0 && (t->type[id] == KILN_TT_NORMAL || t->type[id] == KILN_TT_USER_DEFINED);
}

static int try_bigram(const kiln_tokenizer *t, const char *s, const sym *sy, int left, int right, heap *h) {
    if (left < 0 || right < 0) return 0;
    int size = sy[left].len + sy[right].len;
    int32_t id = kiln_tok_lookup(t, s + sy[left].start, (size_t)size);
    if (!mergeable(t, id)) return 0;
    bigram b = {t->score[id], left, right, size};
    return heap_push(h, b);
}

/* One stretch of plain text; `prefix`: prepend the space symbol (add_space_prefix where the
 * stretch starts the text or follows a special token). */
static kiln_status spm_encode_plain(const kiln_tokenizer *t, const char *text, size_t len, int prefix, int32_t **ids,
                                    size_t *n) {
    *ids = NULL;
    *n = 0;
    if (len == 0) return KILN_OK; /* SentencePiece: "" encodes to nothing (no dummy prefix) */
    if (len > (size_t)1 << 28) return kiln_fail(KILN_ERR_INVALID_ARG, "text: %zu bytes is too long to encode", len);
    /* normalize: optional leading space symbol, ' ' -> space symbol (and U+2581 -> space symbol) */
    size_t cap = (len + 1) * 3 + t->space_len;
    char *s = malloc(cap);
    sym *sy = NULL;
    int32_t *out = NULL;
    heap h = {0};
    kiln_status st = KILN_OK;
    if (!s) goto oom;
    size_t m = 0;
    if (prefix) {
        memcpy(s, t->space, t->space_len);
        m = t->space_len;
    }
    for (size_t i = 0; i < len;) {
        if (text[i] == ' ') {
            memcpy(s + m, t->space, t->space_len);
            m += t->space_len;
            i++;
        } else if (i + 3 <= len && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            memcpy(s + m, t->space, t->space_len);
            m += t->space_len;
            i += 3;
        } else {
            s[m++] = text[i++];
        }
    }
    /* one symbol per UTF-8 character (the text was validated by the caller) */
    sy = malloc(m * sizeof *sy);
    if (!sy) goto oom;
    int ns = 0;
    for (size_t i = 0; i < m;) {
        int l = kiln_utf8_len((unsigned char)s[i]);
        if ((size_t)l > m - i) l = (int)(m - i);
        sy[ns].start = (int)i;
        sy[ns].len = l;
        sy[ns].prev = ns - 1;
        sy[ns].next = ns + 1;
        ns++;
        i += (size_t)l;
    }
    sy[ns - 1].next = -1;
    for (int i = 0; i + 1 < ns; i++)
        if (try_bigram(t, s, sy, i, i + 1, &h)) goto oom;
    while (h.n) {
        bigram b = heap_pop(&h);
        sym *l = &sy[b.left], *r = &sy[b.right];
        /* skip entries made stale by an earlier merge of either side */
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        if (try_bigram(t, s, sy, l->prev, b.left, &h)) goto oom;
        if (try_bigram(t, s, sy, b.left, l->next, &h)) goto oom;
    }
    /* output: pieces, else byte fallback, else unk */
    out = malloc(m * sizeof *out);
    if (!out) goto oom;
    size_t k = 0;
    for (int i = 0; i >= 0; i = sy[i].next) {
        int32_t id = kiln_tok_lookup(t, s + sy[i].start, (size_t)sy[i].len);
        if (id >= 0) {
            out[k++] = id;
            continue;
        }
        for (int j = 0; j < sy[i].len; j++) {
            int b = t->byte_id[(unsigned char)s[sy[i].start + j]];
            if (b < 0 && t->unk < 0) {
                st = kiln_fail(KILN_ERR_INVALID_ARG, "text: byte 0x%02x has no piece, no byte fallback and no unknown token",
                               (unsigned char)s[sy[i].start + j]);
                goto done;
            }
            if (b >= 0) out[k++] = b;
            else if (j == 0) out[k++] = t->unk; /* one unk per character */
        }
    }
    *ids = out;
    *n = k;
    out = NULL;
    goto done;
oom:
    st = kiln_fail(KILN_ERR_NOMEM, "out of memory encoding %zu bytes", len);
done:
    free(s);
    free(sy);
    free(h.v);
    free(out);
    return st;
}

/* ---- special tokens written in the text --------------------------------------------------------- */
/* llama.cpp's partition of the text (llama-vocab.cpp, tokenizer_st_partition), for GGUF and Hugging
 * Face vocabularies: the special tokens (CONTROL and UNKNOWN ones such as <s>, </s>, <unk>, only
 * with parse_special; USER_DEFINED ones always), longest text first, cut every plain stretch at
 * each of their occurrences, left to right. Each remaining plain stretch is encoded alone, with
 * the space symbol in front where it starts the text or follows a special token (llama.cpp's SPM
 * rule, and Hugging Face's Llama tokenizer with legacy = true, Llama 2's and Mistral's setting).
 * llama2.c tokenizer.bin files keep run.c's rule: no token is ever matched in text. */
typedef struct {
    size_t off, len;
    int32_t id; /* -1: plain text */
} frag;

static int by_length_desc(const void *a, const void *b, void *ctx) {
    const kiln_tokenizer *t = ctx;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->piece_len[x] != t->piece_len[y]) return t->piece_len[x] > t->piece_len[y] ? -1 : 1;
    return x < y ? -1 : x > y; /* equal lengths: the lower id first (deterministic) */
}

static int matched_in_text(const kiln_tokenizer *t, int32_t id, int parse_special) {
    if (t->piece_len[id] == 0) return 0;
    if (t->type[id] == KILN_TT_USER_DEFINED) return 1;
    return parse_special && (t->type[id] == KILN_TT_CONTROL || t->type[id] == KILN_TT_UNKNOWN);
}

static int frag_push(frag **v, size_t *n, size_t *cap, frag x) {
    if (*n == *cap) {
        size_t c = *cap * 2 + 8;
        frag *g = realloc(*v, c * sizeof *g);
        if (!g) return -1;
        *v = g;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}

/* Cuts every plain fragment of *f (n of them) at the occurrences of token id, left to right:
 * [plain before] [token] ... [plain rest], empty plain pieces dropped. *f is replaced. */
static kiln_status split_at(const kiln_tokenizer *t, const char *text, int32_t id, frag **f, size_t *nf) {
    const char *tok = t->piece[id];
    const size_t tl = t->piece_len[id];
    frag *g = NULL;
    size_t ng = 0, cap = 0;
    for (size_t i = 0; i < *nf; i++) {
        frag x = (*f)[i];
        if (x.id < 0) {
            const char *hit;
            while (x.len >= tl && (hit = memmem(text + x.off, x.len, tok, tl)) != NULL) {
                const size_t before = (size_t)(hit - (text + x.off));
                if ((before && frag_push(&g, &ng, &cap, (frag){x.off, before, -1})) ||
                    frag_push(&g, &ng, &cap, (frag){x.off + before, tl, id}))
                    goto oom;
                x.off += before + tl;
                x.len -= before + tl;
            }
            if (!x.len) continue;
        }
        if (frag_push(&g, &ng, &cap, x)) goto oom;
    }
    free(*f);
    *f = g;
    *nf = ng;
    return KILN_OK;
oom:
    free(g);
    return kiln_fail(KILN_ERR_NOMEM, "out of memory splitting text at special tokens");
}

kiln_status kiln_spm_index_special(kiln_tokenizer *t) {
    free(t->in_text);
    t->in_text = NULL;
    t->n_in_text = 0;
    if (t->source == KILN_TOK_SRC_LLAMA2C) return KILN_OK;
    size_t ns = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) ns += (size_t)matched_in_text(t, id, 1);
    if (!ns) return KILN_OK;
    if (!(t->in_text = malloc(ns * sizeof *t->in_text))) return kiln_fail(KILN_ERR_NOMEM, "out of memory indexing special tokens");
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (matched_in_text(t, id, 1)) t->in_text[t->n_in_text++] = id;
    qsort_r(t->in_text, ns, sizeof *t->in_text, by_length_desc, t);
    return KILN_OK;
}

kiln_status kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                            size_t *n) {
    *ids = NULL;
    *n = 0;
    size_t ns = 0; /* the special tokens this call matches: all indexed ones, or the user-defined ones */
    for (int i = 0; i < t->n_in_text; i++) ns += (size_t)matched_in_text(t, t->in_text[i], parse_special);
    if (!ns) return spm_encode_plain(t, text, len, t->add_space_prefix, ids, n);
    size_t nf = 1;
    frag *f = malloc(sizeof *f);
    int32_t *out = NULL;
    size_t k = 0, out_cap = 0;
    kiln_status st = KILN_OK;
    if (!f) {
        st = kiln_fail(KILN_ERR_NOMEM, "out of memory encoding %zu bytes", len);
        goto done;
    }
    f[0] = (frag){0, len, -1};
    for (int i = 0; i < t->n_in_text && st == KILN_OK; i++)
        if (matched_in_text(t, t->in_text[i], parse_special)) st = split_at(t, text, t->in_text[i], &f, &nf);
    int prev_special = 1;
    for (size_t i = 0; i < nf && st == KILN_OK; i++) {
        int32_t *v = NULL;
        size_t m = 0;
        if (f[i].id >= 0) {
            prev_special = 1;
            m = 1;
        } else {
            st = spm_encode_plain(t, text + f[i].off, f[i].len, t->add_space_prefix && prev_special, &v, &m);
            prev_special = 0;
            if (st != KILN_OK) break;
        }
        if (k + m > out_cap) {
            size_t c = (k + m) * 2 + 16;
            int32_t *g = realloc(out, c * sizeof *g);
            if (!g) {
                free(v);
                st = kiln_fail(KILN_ERR_NOMEM, "out of memory encoding %zu bytes", len);
                break;
            }
            out = g;
            out_cap = c;
        }
        if (f[i].id >= 0) out[k++] = f[i].id;
        else if (m) memcpy(out + k, v, m * sizeof *v), k += m;
        free(v);
    }
    if (st == KILN_OK) {
        *ids = out;
        *n = k;
        out = NULL;
    }
done:
    free(out);
    free(f);
    return st;
}

/* ---- llama2.c tokenizer.bin ------------------------------------------------------------------- */
/* vocab_size <= 0: read every entry in the file. */
kiln_status kiln_tok_load_llama2c(const char *path, int vocab_size, kiln_tokenizer **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    kiln_status st = KILN_OK;
    uint8_t *buf = NULL;
    kiln_tokenizer *t = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto ioerr;
    long fsz = ftell(f);
    if (fsz < 0 || fseek(f, 0, SEEK_SET) != 0) goto ioerr;
    uint64_t size = (uint64_t)fsz;
    buf = malloc(size ? size : 1);
    if (!buf) {
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(buf, 1, size, f) != size) goto ioerr;
    if (size < 4) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: truncated at offset 0: max_token_length needs 4 bytes (file size %llu)",
                       path, (unsigned long long)size);
        goto done;
    }
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 65536) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: max_token_length at offset 0: %d out of range (1..65536)", path, maxlen);
        goto done;
    }
    /* count entries (and bounds-check them) */
    uint64_t off = 4;
    int count = 0;
    while (off < size && (vocab_size <= 0 || count < vocab_size)) {
        int32_t len;
        if (size - off < 8) break;
        memcpy(&len, buf + off + 4, 4);
        if (len < 0 || (uint64_t)len > size - off - 8) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: token %d at offset %llu: length %d runs past end of file (size %llu)",
                           path, count, (unsigned long long)off, len, (unsigned long long)size);
            goto done;
        }
        off += 8 + (uint64_t)len;
        count++;
        if (count > (1 << 24)) break;
    }
    if (vocab_size > 0 && count < vocab_size) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: truncated at offset %llu: %d of vocab_size %d tokens present", path,
                       (unsigned long long)off, count, vocab_size);
        goto done;
    }
    if (count == 0) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: no tokens", path);
        goto done;
    }
    t = kiln_tok_alloc(KILN_TOK_SPM, count);
    if (!t) {
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    t->source = KILN_TOK_SRC_LLAMA2C;
    t->max_token_length = maxlen;
    t->space = " ";
    t->space_len = 1;
    off = 4;
    for (int i = 0; i < count; i++) {
        float sc;
        int32_t len;
        memcpy(&sc, buf + off, 4);
        memcpy(&len, buf + off + 4, 4);
        if (kiln_tok_set_piece(t, i, (const char *)buf + off + 8, (size_t)len)) {
            st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        t->score[i] = sc;
        off += 8 + (uint64_t)len;
    }
    /* llama2.c convention: 0 <unk>, 1 BOS, 2 EOS; byte pieces "<0xNN>" */
    t->unk = 0;
    t->bos = count > 1 ? 1 : -1;
    t->eos = count > 2 ? 2 : -1;
    t->add_bos = 1;
    t->add_space_prefix = 1;
    for (int i = 0; i < count; i++) {
        const char *p = t->piece[i];
        if (i == 0) t->type[i] = KILN_TT_UNKNOWN;
        else if (i == 1 || i == 2) t->type[i] = KILN_TT_CONTROL;
        else if (t->piece_len[i] == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>') t->type[i] = KILN_TT_BYTE;
    }
    st = kiln_tok_finish(t, path);
    goto done;
ioerr:
    st = kiln_fail(KILN_ERR_IO, "%s: read failed", path);
done:
    fclose(f);
    free(buf);
    if (st != KILN_OK) kiln_tok_free(t);
    else *out = t;
    return st;
}

/* ---- GGUF ------------------------------------------------------------------------------------- */
/* A special-token id key: absent → def (when inside the vocabulary); llama.cpp's "no token"
 * sentinel (-1 / 0xFFFFFFFF) → none (-1); any other id outside [0, n) is refused naming the key. */
static kiln_status gguf_id(const kiln_gguf *g, const char *key, int def, int n, int *out) {
    int64_t v;
    if (kiln_gguf_get_token_id(g, key, &v) != 0) {
        *out = def < n ? def : -1;
        return KILN_OK;
    }
    if (v == -1) {
        *out = -1;
        return KILN_OK;
    }
    if (v < 0 || v >= (int64_t)n)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': token id %lld out of range (vocabulary of %d)",
                         kiln_gguf_path(g), key, (long long)v, n);
    *out = (int)v;
    return KILN_OK;
}

kiln_status kiln_spm_load_gguf(const kiln_gguf *g, kiln_tokenizer **out) {
    *out = NULL;
    const char *path = kiln_gguf_path(g);
    kiln_gguf_type et;
    uint64_t n;
    if (kiln_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) != 0 || et != KILN_GGUF_STRING)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens': missing or not an array of strings", path);
    if (n == 0 || n > (1u << 24))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens': %llu tokens out of range", path,
                         (unsigned long long)n);
    uint64_t ns = 0, nt = 0;
    int has_scores = kiln_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &ns) == 0;
    if (has_scores && (ns != n || (et != KILN_GGUF_F32 && et != KILN_GGUF_F64)))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.scores': %llu entries of type %d for %llu tokens",
                         path, (unsigned long long)ns, (int)et, (unsigned long long)n);
    int has_types = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt) == 0;
    if (has_types && (nt != n || et == KILN_GGUF_STRING))
        return kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.token_type': %llu entries for %llu tokens", path,
                         (unsigned long long)nt, (unsigned long long)n);
    kiln_tokenizer *t = kiln_tok_alloc(KILN_TOK_SPM, (int)n);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    t->source = KILN_TOK_SRC_GGUF;
    kiln_status st = KILN_OK;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len);
        if (kiln_tok_set_piece(t, (int)i, s, len)) {
            st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        double v = 0;
        if (has_scores) kiln_gguf_arr_f64(g, "tokenizer.ggml.scores", i, &v);
        t->score[i] = (float)v;
        if (has_types) {
            kiln_gguf_arr_f64(g, "tokenizer.ggml.token_type", i, &v);
            if (v < KILN_TT_NORMAL || v > KILN_TT_BYTE) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: key 'tokenizer.ggml.token_type': element %llu is %g (must be 1..6)",
                               path, (unsigned long long)i, v);
                goto done;
            }
            t->type[i] = (int32_t)v;
        }
    }
    int n_i = (int)n;
    if ((st = gguf_id(g, "tokenizer.ggml.bos_token_id", 1, n_i, &t->bos))) goto done;
    if ((st = gguf_id(g, "tokenizer.ggml.eos_token_id", 2, n_i, &t->eos))) goto done;
    if ((st = gguf_id(g, "tokenizer.ggml.unknown_token_id", 0, n_i, &t->unk))) goto done;
    if ((st = gguf_id(g, "tokenizer.ggml.padding_token_id", n_i, n_i, &t->pad))) goto done;
    const char *tmpl;
    size_t tmpl_len;
    if (kiln_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tmpl_len) == 0 && /* Llama 2 / Mistral GGUFs carry one */
        !(t->chat_template = strndup(tmpl, tmpl_len))) {
        st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    uint64_t b;
    t->add_bos = kiln_gguf_get_u64(g, "tokenizer.ggml.add_bos_token", &b) == 0 ? (int)(b != 0) : 1;
    t->add_space_prefix = kiln_gguf_get_u64(g, "tokenizer.ggml.add_space_prefix", &b) == 0 ? (int)(b != 0) : 1;
    if (!has_types) {
        /* infer what token_type would have said */
        for (int i = 0; i < n_i; i++) {
            const char *p = t->piece[i];
            if (i == t->unk) t->type[i] = KILN_TT_UNKNOWN;
            else if (i == t->bos || i == t->eos) t->type[i] = KILN_TT_CONTROL;
            else if (t->piece_len[i] == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>') t->type[i] = KILN_TT_BYTE;
        }
    }
    st = kiln_tok_finish(t, path);
    if (st == KILN_OK) st = kiln_spm_index_special(t);
done:
    if (st != KILN_OK) kiln_tok_free(t);
    else *out = t;
    return st;
}

/* The piece of id in SentencePiece form (space symbol "▁"; llama2.c's "\n<s>\n" BOS/EOS texts as
 * "<s>"/"</s>"). Returns a malloc'ed NUL-terminated string. */
static char *sp_piece(const kiln_tokenizer *t, int id) {
    if (t->source == KILN_TOK_SRC_LLAMA2C) {
        if (id == t->bos && strcmp(t->piece[id], "\n<s>\n") == 0) return strdup("<s>");
        if (id == t->eos && strcmp(t->piece[id], "\n</s>\n") == 0) return strdup("</s>");
    }
    const char *p = t->piece[id];
    size_t n = t->piece_len[id];
    if (t->space_len != 1) return strdup(p);
    char *d = malloc(n * 3 + 1);
    if (!d) return NULL;
    size_t m = 0;
    for (size_t j = 0; j < n; j++) {
        if (p[j] == ' ') {
            memcpy(d + m, "\xe2\x96\x81", 3);
            m += 3;
        } else {
            d[m++] = p[j];
        }
    }
    d[m] = 0;
    return d;
}

/* The piece of id as llama2.c's tokenizer.py exports it: BOS "\n<s>\n", EOS "\n</s>\n", "▁" -> ' '. */
static char *l2c_piece(const kiln_tokenizer *t, int id, size_t *len) {
    if (t->source == KILN_TOK_SRC_LLAMA2C) {
        char *d = malloc(t->piece_len[id] + 1);
        if (!d) return NULL;
        memcpy(d, t->piece[id], t->piece_len[id] + 1);
        *len = t->piece_len[id];
        return d;
    }
    const char *p = id == t->bos ? "\n<s>\n" : id == t->eos ? "\n</s>\n" : t->piece[id];
    size_t n = id == t->bos || id == t->eos ? strlen(p) : t->piece_len[id];
    char *d = malloc(n + 1);
    if (!d) return NULL;
    size_t m = 0;
    for (size_t j = 0; j < n;) {
        if (j + 3 <= n && memcmp(p + j, "\xe2\x96\x81", 3) == 0) {
            d[m++] = ' ';
            j += 3;
        } else {
            d[m++] = p[j++];
        }
    }
    d[m] = 0;
    *len = m;
    return d;
}

void kiln_spm_save_gguf(const kiln_tokenizer *t, kiln_gguf_writer *w) {
    int n = t->n_vocab;
    char **toks = calloc((size_t)n, sizeof *toks);
    if (toks) {
        for (int i = 0; i < n; i++) toks[i] = sp_piece(t, i);
        kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n);
        for (int i = 0; i < n; i++) free(toks[i]);
        free(toks);
    } else {
        kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", NULL, 0);
    }
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_set_arr_f32(w, "tokenizer.ggml.scores", t->score, (uint64_t)n);
    kiln_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", t->type, (uint64_t)n);
    if (t->bos >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos);
    if (t->eos >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos);
    if (t->unk >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk);
    if (t->pad >= 0) kiln_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)t->pad);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", 0);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", t->add_space_prefix);
    if (t->chat_template) kiln_gguf_set_str(w, "tokenizer.chat_template", t->chat_template);
}

/* ---- Hugging Face tokenizer.json -------------------------------------------------------------- */
typedef struct {
    int l, r, piece;
    float score;
} merge;

static int merge_cmp(const void *a, const void *b) {
    /* transformers' SentencePieceExtractor: by the merged piece's score (descending), stable over
     * vocabulary order, and within one piece by (id of left, id of right) */
    const merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

static kiln_status write_json(json_t *j, const char *path) {
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    if (rc != 0) return kiln_fail(KILN_ERR_IO, "%s: cannot write", path);
    return KILN_OK;
}

kiln_status kiln_spm_save_hf(const kiln_tokenizer *t, const char *dir) {
    int n = t->n_vocab;
    char path[4096];
    kiln_status st = KILN_OK;
    char **sp = calloc((size_t)n, sizeof *sp);
    merge *mg = NULL;
    json_t *root = NULL;
    FILE *f = NULL;
    if (!sp) goto oom;
    for (int i = 0; i < n; i++)
        if (!(sp[i] = sp_piece(t, i))) goto oom;

    /* tokenizer.bin (llama2.c format) */
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    f = fopen(path, "wb");
    if (!f) {
        st = kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    {
        int32_t maxlen = t->max_token_length;
        int ok = 1;
        if (t->source != KILN_TOK_SRC_LLAMA2C) {
            maxlen = 0;
            for (int i = 0; i < n; i++) {
                size_t l;
                char *p = l2c_piece(t, i, &l);
                if (!p) goto oom;
                free(p);
                if ((int32_t)l > maxlen) maxlen = (int32_t)l;
            }
        }
        ok &= fwrite(&maxlen, 4, 1, f) == 1;
        for (int i = 0; i < n && ok; i++) {
            size_t l;
            char *p = l2c_piece(t, i, &l);
            if (!p) goto oom;
            int32_t l32 = (int32_t)l;
            ok &= fwrite(&t->score[i], 4, 1, f) == 1;
            ok &= fwrite(&l32, 4, 1, f) == 1;
            ok &= fwrite(p, 1, l, f) == l;
            free(p);
        }
        if (fclose(f) != 0) ok = 0;
        f = NULL;
        if (!ok) {
            st = kiln_fail(KILN_ERR_IO, "%s: write failed", path);
            goto done;
        }
    }

    /* tokenizer.json: vocab, merges derived from scores (as transformers' LlamaConverter does) */
    json_t *vocab = json_object();
    root = json_object();
    if (!vocab || !root) goto oom;
    for (int i = 0; i < n; i++) {
        if (json_object_get(vocab, sp[i])) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: token %d: piece '%s' appears twice; tokenizer.json cannot hold it",
                           dir, i, sp[i]);
            json_decref(vocab);
            goto done;
        }
        json_t *v = json_integer(i);
        if (!v || json_object_set_new(vocab, sp[i], v) != 0) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: token %d: piece is not valid UTF-8; tokenizer.json cannot hold it",
                           dir, i);
            json_decref(vocab);
            goto done;
        }
    }
    size_t nm = 0, capm = (size_t)n * 2 + 16;
    mg = malloc(capm * sizeof *mg);
    if (!mg) {
        json_decref(vocab);
        goto oom;
    }
    for (int i = 0; i < n; i++) {
        if (!mergeable(t, i)) continue;
        const char *p = sp[i];
        size_t len = strlen(p);
        for (size_t k = (size_t)kiln_utf8_len((unsigned char)p[0]); k < len; k += (size_t)kiln_utf8_len((unsigned char)p[k])) {
            json_t *a, *b;
            char *left = strndup(p, k);
            if (!left) {
                json_decref(vocab);
                goto oom;
            }
            a = json_object_get(vocab, left);
            b = json_object_get(vocab, p + k);
            free(left);
            if (!a || !b) continue;
            if (nm == capm) {
                capm *= 2;
                merge *m2 = realloc(mg, capm * sizeof *m2);
                if (!m2) {
                    json_decref(vocab);
                    goto oom;
                }
                mg = m2;
            }
            mg[nm++] = (merge){(int)json_integer_value(a), (int)json_integer_value(b), i, t->score[i]};
        }
    }
    qsort(mg, nm, sizeof *mg, merge_cmp);
    json_t *merges = json_array();
    for (size_t i = 0; i < nm; i++) {
        json_t *pair = json_array();
        json_array_append_new(pair, json_string(sp[mg[i].l]));
        json_array_append_new(pair, json_string(sp[mg[i].r]));
        json_array_append_new(merges, pair);
    }
    json_t *added = json_array();
    for (int i = 0; i < n; i++) {
        if (t->type[i] != KILN_TT_CONTROL && t->type[i] != KILN_TT_UNKNOWN && t->type[i] != KILN_TT_USER_DEFINED)
            continue;
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content", sp[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", t->type[i] != KILN_TT_USER_DEFINED));
    }
    json_t *norms = json_array();
    if (t->add_space_prefix) json_array_append_new(norms, json_pack("{s:s,s:s}", "type", "Prepend", "prepend", "\xe2\x96\x81"));
    json_array_append_new(norms, json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", " ", "content",
                                           "\xe2\x96\x81"));
    json_t *decs = json_array();
    json_array_append_new(decs, json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String", "\xe2\x96\x81",
                                          "content", " "));
    json_array_append_new(decs, json_pack("{s:s}", "type", "ByteFallback"));
    json_array_append_new(decs, json_pack("{s:s}", "type", "Fuse"));
    if (t->add_space_prefix)
        json_array_append_new(decs, json_pack("{s:s,s:s,s:i,s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0));
    json_t *post = json_null();
    if (t->add_bos && t->bos >= 0) {
        post = json_pack("{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:[{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i],s:[s]}}}",
                         "type", "TemplateProcessing",
                         "single", "SpecialToken", "id", sp[t->bos], "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                         "pair", "SpecialToken", "id", sp[t->bos], "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                         "SpecialToken", "id", sp[t->bos], "type_id", 1, "Sequence", "id", "B", "type_id", 1,
                         "special_tokens", sp[t->bos], "id", sp[t->bos], "ids", t->bos, "tokens", sp[t->bos]);
        if (!post) post = json_null();
    }
    json_t *model = json_pack("{s:s,s:n,s:s?,s:n,s:n,s:b,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout", "unk_token",
                              t->unk >= 0 ? sp[t->unk] : NULL, "continuing_subword_prefix", "end_of_word_suffix",
                              "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_pack("{s:s,s:o}", "type", "Sequence", "normalizers", norms));
    json_object_set_new(root, "pre_tokenizer", json_null());
    json_object_set_new(root, "post_processor", post);
    json_object_set_new(root, "decoder", json_pack("{s:s,s:o}", "type", "Sequence", "decoders", decs));
    if (!model) {
        st = kiln_fail(KILN_ERR_INTERNAL, "%s: building tokenizer.json failed", dir);
        goto done;
    }
    json_object_set_new(root, "model", model);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    st = write_json(root, path);
    root = NULL;
    if (st) goto done;

    json_t *cfg = json_object();
    json_object_set_new(cfg, "add_bos_token", json_boolean(t->add_bos));
    json_object_set_new(cfg, "add_eos_token", json_false());
    if (t->bos >= 0) json_object_set_new(cfg, "bos_token", json_string(sp[t->bos]));
    if (t->eos >= 0) json_object_set_new(cfg, "eos_token", json_string(sp[t->eos]));
    if (t->unk >= 0) json_object_set_new(cfg, "unk_token", json_string(sp[t->unk]));
    if (t->pad >= 0) json_object_set_new(cfg, "pad_token", json_string(sp[t->pad]));
    json_object_set_new(cfg, "add_space_prefix", json_boolean(t->add_space_prefix));
    json_object_set_new(cfg, "legacy", json_true());
    json_object_set_new(cfg, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(cfg, "tokenizer_class", json_string("LlamaTokenizer"));
    if (t->chat_template) json_object_set_new(cfg, "chat_template", json_string(t->chat_template));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    st = write_json(cfg, path);
    goto done;
oom:
    st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory writing tokenizer files", dir);
done:
    if (f) fclose(f);
    if (sp)
        for (int i = 0; i < n; i++) free(sp[i]);
    free(sp);
    free(mg);
    json_decref(root);
    return st;
}

/* Token name from tokenizer_config.json: a string or {"content": "..."}. */
static const char *cfg_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

/* Scores from a tokenizer.bin beside tokenizer.json, used when it describes the same vocabulary
 * (kiln writes one; it keeps SentencePiece's exact scores). Returns 0 when used. */
static int scores_from_bin(kiln_tokenizer *t, const char *tokenizer_json) {
    char path[4096];
    const char *slash = strrchr(tokenizer_json, '/');
    if (slash) snprintf(path, sizeof path, "%.*s/tokenizer.bin", (int)(slash - tokenizer_json), tokenizer_json);
    else snprintf(path, sizeof path, "tokenizer.bin");
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    kiln_tokenizer *b = NULL;
    if (kiln_tok_load_llama2c(path, t->n_vocab, &b) != KILN_OK) {
        kiln_clear_error();
        return -1;
    }
    int ok = b->n_vocab == t->n_vocab;
    for (int i = 0; ok && i < t->n_vocab; i++) {
        if (i == t->bos || i == t->eos) continue;
        size_t l;
        char *p = l2c_piece(t, i, &l);
        ok = p && l == b->piece_len[i] && memcmp(p, b->piece[i], l) == 0;
        free(p);
    }
    if (ok) memcpy(t->score, b->score, (size_t)t->n_vocab * sizeof *t->score);
    kiln_tok_free(b);
    return ok ? 0 : -1;
}

static int is_byte_piece(const char *p, size_t n) {
    return n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>';
}

kiln_status kiln_spm_load_hf(const char *tokenizer_json, const char *tokenizer_config, void *json_root,
                             kiln_tokenizer **out) {
    *out = NULL;
    json_t *root = json_root;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'model.vocab': missing or not an object", tokenizer_json);
    /* vocabulary size: largest id + 1 over vocab and added_tokens */
    long long max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'model.vocab': id of '%s' is not an integer in 0..2^24",
                             tokenizer_json, key);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24) ||
            !json_is_string(json_object_get(v, "content")))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'added_tokens[%zu]': bad id or content", tokenizer_json, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'model.vocab': empty", tokenizer_json);
    kiln_tokenizer *t = kiln_tok_alloc(KILN_TOK_SPM, (int)max_id + 1);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", tokenizer_json);
    t->source = KILN_TOK_SRC_HF;
    kiln_status st = KILN_OK;
    json_t *cfg = NULL;
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (kiln_tok_set_piece(t, id, key, strlen(key))) goto oom;
        if (is_byte_piece(key, strlen(key))) t->type[id] = KILN_TT_BYTE;
    }
    const char *unk_name = json_string_value(json_object_get(model, "unk_token"));
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        const char *c = json_string_value(json_object_get(v, "content"));
        if (!t->piece[id] && kiln_tok_set_piece(t, id, c, strlen(c))) goto oom;
        t->type[id] = json_is_true(json_object_get(v, "special")) ? KILN_TT_CONTROL : KILN_TT_USER_DEFINED;
        if (unk_name && strcmp(c, unk_name) == 0) t->type[id] = KILN_TT_UNKNOWN;
    }
    for (int k = 0; k < t->n_vocab; k++)
        if (!t->piece[k]) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'model.vocab': token id %d is missing (ids must be 0..%d)",
                           tokenizer_json, k, t->n_vocab - 1);
            goto done;
        }
    if ((st = kiln_tok_finish(t, tokenizer_json))) goto done;
    if (unk_name) t->unk = kiln_tok_lookup(t, unk_name, strlen(unk_name));
    if (t->unk >= 0 && t->type[t->unk] == KILN_TT_NORMAL) t->type[t->unk] = KILN_TT_UNKNOWN;

    /* tokenizer_config.json: special tokens and add_bos_token */
    const char *bos_name = "<s>", *eos_name = "</s>";
    t->add_bos = 1;
    if (tokenizer_config) {
        json_error_t err;
        struct stat sb;
        if (stat(tokenizer_config, &sb) == 0) {
            cfg = json_load_file(tokenizer_config, 0, &err);
            if (!cfg) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", tokenizer_config, err.line,
                               err.column, err.text);
                goto done;
            }
            if (cfg_token(cfg, "bos_token")) bos_name = cfg_token(cfg, "bos_token");
            if (cfg_token(cfg, "eos_token")) eos_name = cfg_token(cfg, "eos_token");
            json_t *ab = json_object_get(cfg, "add_bos_token");
            if (json_is_boolean(ab)) t->add_bos = json_is_true(ab);
            const char *pad = cfg_token(cfg, "pad_token");
            if (pad) t->pad = kiln_tok_lookup(t, pad, strlen(pad));
            const char *tmpl = kiln_bpe_config_chat_template(cfg);
            if (tmpl && !(t->chat_template = strdup(tmpl))) goto oom;
        }
    }
    t->bos = kiln_tok_lookup(t, bos_name, strlen(bos_name));
    t->eos = kiln_tok_lookup(t, eos_name, strlen(eos_name));
    if (t->bos >= 0 && t->type[t->bos] == KILN_TT_NORMAL) t->type[t->bos] = KILN_TT_CONTROL;
    if (t->eos >= 0 && t->type[t->eos] == KILN_TT_NORMAL) t->type[t->eos] = KILN_TT_CONTROL;
    /* the leading ▁: a Prepend normalizer, or a Metaspace pre-tokenizer that prepends */
    t->add_space_prefix = 0;
    json_t *norm = json_object_get(root, "normalizer");
    json_t *list = json_object_get(norm, "normalizers");
    if (!list) list = norm;
    if (json_is_object(list)) {
        const char *ty = json_string_value(json_object_get(list, "type"));
        if (ty && strcmp(ty, "Prepend") == 0) t->add_space_prefix = 1;
    } else {
        json_array_foreach(list, i, v) {
            const char *ty = json_string_value(json_object_get(v, "type"));
            if (ty && strcmp(ty, "Prepend") == 0) t->add_space_prefix = 1;
        }
    }
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pty = json_string_value(json_object_get(pre, "type"));
    if (pty && strcmp(pty, "Metaspace") == 0) {
        const char *scheme = json_string_value(json_object_get(pre, "prepend_scheme"));
        json_t *aps = json_object_get(pre, "add_prefix_space");
        if ((scheme && strcmp(scheme, "never") != 0) || json_is_true(aps)) t->add_space_prefix = 1;
    }

    /* scores: kiln's tokenizer.bin beside, else the merge ranks (rank r -> score -r) */
    if (scores_from_bin(t, tokenizer_json) != 0) {
        /* pieces no merge produces cannot be formed by merging under HF's BPE: lowest priority */
        for (int k = 0; k < t->n_vocab; k++) t->score[k] = -1e30f;
        char *seen = calloc((size_t)t->n_vocab, 1);
        if (!seen) goto oom;
        json_array_foreach(merges, i, v) {
            const char *l = NULL, *r = NULL;
            char *tmp = NULL;
            if (json_is_array(v) && json_array_size(v) == 2) {
                l = json_string_value(json_array_get(v, 0));
                r = json_string_value(json_array_get(v, 1));
            } else if (json_is_string(v)) {
                tmp = strdup(json_string_value(v));
                char *sp = tmp ? strchr(tmp, ' ') : NULL;
                if (sp) {
                    *sp = 0;
                    l = tmp;
                    r = sp + 1;
                }
            }
            if (!l || !r) {
                free(tmp);
                free(seen);
                st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'model.merges[%zu]': not a pair of pieces", tokenizer_json, i);
                goto done;
            }
            size_t ll = strlen(l), rl = strlen(r);
            char *cat = malloc(ll + rl + 1);
            if (!cat) {
                free(tmp);
                free(seen);
                goto oom;
            }
            memcpy(cat, l, ll);
            memcpy(cat + ll, r, rl + 1);
            int32_t id = kiln_tok_lookup(t, cat, ll + rl);
            free(cat);
            free(tmp);
            if (id >= 0 && !seen[id]) {
                seen[id] = 1;
                t->score[id] = -(float)i;
            }
        }
        free(seen);
    }
    st = kiln_spm_index_special(t); /* after the types bos / eos / unk were given above */
    goto done;
oom:
    st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", tokenizer_json);
done:
    json_decref(cfg);
    if (st != KILN_OK) kiln_tok_free(t);
    else *out = t;
    return st;
}
