/* bpe.c — merge-rank BPE: loading Hugging Face tokenizer.json and tiktoken files, the encoding
 * pipeline (added tokens -> normalizers -> pre-tokenizer splits -> merges), decoding and streaming
 * UTF-8 output. GGUF vocabularies are read in bpe_gguf.c through the builder declared in
 * bpe_internal.h. See bpe.h for the pipeline and its semantics.
 *
 * Sections: UTF-8 helpers; GPT-2 byte mapping; token storage and hash maps; regexes and
 * pre-tokenizer steps (incl. the llama.cpp pre-type table); added-token trie; tokenizer.json;
 * tiktoken; encoding; decoding and accessors. */
#include "tokenizer/bpe_internal.h"
#include "base/status.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <xxhash.h>

/* ================================================================================================
 * UTF-8 helpers
 * ============================================================================================== */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when it is not valid / complete. */
static int utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    int len; uint32_t v; unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        unsigned char d = s[i];
        if (d < lo || d > hi) return 0;
        lo = 0x80; hi = 0xBF;
        v = (v << 6) | (d & 0x3F);
    }
    *cp = v;
    return len;
}

size_t kiln_utf8_validate(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (p[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = utf8_seq(p + i, len - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return len;
}

/* Code point at s (input already validated). */
static int utf8_next(const char *s, size_t n, uint32_t *cp) {
    int l = utf8_seq((const unsigned char *)s, n, cp);
    if (!l) { *cp = (unsigned char)s[0]; l = 1; }
    return l;
}

void kiln_utf8_stream_init(kiln_utf8_stream *s) { memset(s, 0, sizeof *s); }

/* Emits the complete characters of (pending bytes ++ in); a valid but incomplete tail is kept in
 * s->pend unless `final`, invalid bytes become U+FFFD per maximal invalid subpart. */
static size_t stream_emit(kiln_utf8_stream *s, const unsigned char *in, size_t n, char *out,
                          int final) {
    size_t total = (size_t)s->npend + n, i = 0, o = 0;
#define SB(k) ((k) < (size_t)s->npend ? s->pend[(k)] : in[(k) - (size_t)s->npend])
    while (i < total) {
        unsigned char c = SB(i);
        if (c < 0x80) { out[o++] = (char)c; i++; continue; }
        int len; unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else { memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3; i++; continue; }
        size_t k = 1;
        while ((int)k < len && i + k < total) {
            unsigned char d = SB(i + k);
            if (d < lo || d > hi) break;
            lo = 0x80; hi = 0xBF;
            k++;
        }
        if ((int)k == len) {
            for (size_t j = 0; j < k; j++) out[o++] = (char)SB(i + j);
            i += k;
        } else if (i + k == total && !final) {
            /* a valid but incomplete tail: hold it back */
            unsigned char tmp[4];
            for (size_t j = 0; j < k; j++) tmp[j] = SB(i + j);
            memcpy(s->pend, tmp, k);
            s->npend = (int)k;
            return o;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3); o += 3;
            i += k;
        }
    }
    s->npend = 0;
    return o;
#undef SB
}

size_t kiln_utf8_stream_push(kiln_utf8_stream *s, const char *in, size_t n, char *out) {
    return stream_emit(s, (const unsigned char *)in, n, out, 0);
}

size_t kiln_utf8_stream_flush(kiln_utf8_stream *s, char *out) {
    if (!s->npend) return 0;
    return stream_emit(s, (const unsigned char *)"", 0, out, 1);
}

/* Unicode White_Space (what Rust's char::is_whitespace uses for added-token lstrip/rstrip). */
static int is_white(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ================================================================================================
 * GPT-2 byte <-> unicode mapping (bytes_to_unicode): printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in increasing byte order, so every byte has a visible character.
 * ============================================================================================== */
static uint16_t g_byte_cp[256];
static int16_t g_cp_byte[324];
static int g_bytemap_ready;

static void bytemap_init(void) {
    if (g_bytemap_ready) return; /* idempotent: concurrent first calls write identical values */
    int n = 0;
    for (int i = 0; i < 324; i++) g_cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = printable ? b : 256 + n++;
        g_byte_cp[b] = (uint16_t)cp;
        g_cp_byte[cp] = (int16_t)b;
    }
    g_bytemap_ready = 1;
}

/* Byte-level string -> bytes into out (room for len bytes). Returns the byte count, or -1 when a
 * character is outside the mapping (the string is then not byte-level encoded). */
static long bytelevel_decode(const char *s, size_t len, char *out) {
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s + i, len - i, &cp);
        if (!l || cp >= 324 || g_cp_byte[cp] < 0) return -1;
        out[o++] = (char)g_cp_byte[cp];
        i += (size_t)l;
    }
    return (long)o;
}

/* ================================================================================================
 * Token storage and hash maps
 * ============================================================================================== */
char *kiln_bpe__strdup(const char *s, size_t len) {
    char *d = malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = 0;
    return d;
}

kiln_bpe *kiln_bpe__new(const char *name) {
    bytemap_init();
    kiln_bpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->name = kiln_bpe__strdup(name ? name : "(memory)", strlen(name ? name : "(memory)"));
    b->bos = b->eos = b->unk_id = -1;
    for (int i = 0; i < 256; i++) b->byte_id[i] = b->byte_tok[i] = -1;
    if (!b->name) { free(b); return NULL; }
    return b;
}

/* Appends bytes (+ NUL) to the pool, returns the offset or UINT32_MAX on failure. */
static uint32_t pool_add(kiln_bpe *b, const char *s, size_t len) {
    if (b->pool_len + len + 1 > UINT32_MAX) return UINT32_MAX;
    if (b->pool_len + len + 1 > b->pool_cap) {
        size_t nc = b->pool_cap ? b->pool_cap * 2 : 1 << 16;
        while (nc < b->pool_len + len + 1) nc *= 2;
        char *np = realloc(b->pool, nc);
        if (!np) return UINT32_MAX;
        b->pool = np;
        b->pool_cap = nc;
    }
    uint32_t off = (uint32_t)b->pool_len;
    if (len) memcpy(b->pool + off, s, len);
    b->pool[off + len] = 0;
    b->pool_len += len + 1;
    return off;
}

static kiln_status ensure_id(kiln_bpe *b, int32_t id, const char *field) {
    if (id < 0 || id >= (1 << 28))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: token id %d out of range", b->name, field, (int)id);
    if (id < b->cap) { if (id >= b->n_vocab) b->n_vocab = id + 1; return KILN_OK; }
    int32_t nc = b->cap ? b->cap : 1024;
    while (nc <= id) nc *= 2;
#define GROW(arr) do { void *p_ = realloc(b->arr, (size_t)nc * sizeof *b->arr); \
        if (!p_) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name); \
        b->arr = p_; } while (0)
    GROW(mdl_off); GROW(mdl_len); GROW(pc_off); GROW(pc_len); GROW(str_off); GROW(flags);
#undef GROW
    memset(b->flags + b->cap, 0, (size_t)(nc - b->cap));
    b->cap = nc;
    if (id >= b->n_vocab) b->n_vocab = id + 1;
    return KILN_OK;
}

/* "<0xNN>" -> NN, else -1 */
static int byte_token_value(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else return -1;
    }
    return v;
}

kiln_status kiln_bpe__set_vocab(kiln_bpe *b, int32_t id, const char *s, size_t len, int kind,
                                const char *field) {
    KILN_TRY(ensure_id(b, id, field));
    if (b->flags[id] & BPE_F_VOCAB)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: token id %d given twice", b->name, field, (int)id);
    uint32_t so = pool_add(b, s, len);
    if (so == UINT32_MAX) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    uint32_t mo = so, ml = (uint32_t)len;
    if (kind == BPE_TOK_BYTELEVEL) {
        char stackbuf[256], *tmp = len <= sizeof stackbuf ? stackbuf : malloc(len);
        if (!tmp) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
        long bl = bytelevel_decode(s, len, tmp);
        if (bl >= 0) {
            mo = pool_add(b, tmp, (size_t)bl);
            ml = (uint32_t)bl;
        }
        if (tmp != stackbuf) free(tmp);
        if (mo == UINT32_MAX) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    }
    b->str_off[id] = so;
    b->mdl_off[id] = mo; b->mdl_len[id] = ml;
    b->pc_off[id] = mo; b->pc_len[id] = ml;
    if (kind == BPE_TOK_RAW && b->byte_fallback) {
        int v = byte_token_value(s, len);
        if (v >= 0) {
            char c = (char)v;
            uint32_t po = pool_add(b, &c, 1);
            if (po == UINT32_MAX) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
            b->pc_off[id] = po; b->pc_len[id] = 1;
            b->byte_tok[v] = id;
        }
    }
    b->flags[id] |= BPE_F_PRESENT | BPE_F_VOCAB;
    return KILN_OK;
}

static uint64_t hash_bytes(const char *s, size_t len) { return XXH3_64bits(s, len); }

static int32_t vmap_find(const kiln_bpe *b, const char *s, size_t len) {
    if (!b->vmap) return -1;
    uint64_t h = hash_bytes(s, len);
    for (uint32_t i = (uint32_t)h & b->vmap_mask;; i = (i + 1) & b->vmap_mask) {
        int32_t v = b->vmap[i];
        if (!v) return -1;
        int32_t id = v - 1;
        if (b->mdl_len[id] == len && !memcmp(b->pool + b->mdl_off[id], s, len)) return id;
    }
}

kiln_status kiln_bpe__index_vocab(kiln_bpe *b) {
    size_t n = 0;
    for (int32_t i = 0; i < b->n_vocab; i++) n += (b->flags[i] & BPE_F_VOCAB) != 0;
    uint32_t cap = 1024;
    while (cap < 2 * n + 16) cap *= 2;
    free(b->vmap);
    b->vmap = calloc(cap, sizeof *b->vmap);
    if (!b->vmap) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    b->vmap_mask = cap - 1;
    for (int32_t id = 0; id < b->n_vocab; id++) {
        if (!(b->flags[id] & BPE_F_VOCAB)) continue;
        const char *s = b->pool + b->mdl_off[id];
        size_t len = b->mdl_len[id];
        if (vmap_find(b, s, len) >= 0) continue; /* duplicate bytes: the lower id wins */
        uint64_t h = hash_bytes(s, len);
        uint32_t i = (uint32_t)h & b->vmap_mask;
        while (b->vmap[i]) i = (i + 1) & b->vmap_mask;
        b->vmap[i] = id + 1;
    }
    return KILN_OK;
}

static uint32_t pair_slot(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static int pmap_find(const kiln_bpe *b, int32_t l, int32_t r, int32_t *rank, int32_t *merged) {
    if (!b->pmap_n) return 0;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint32_t i = pair_slot(key, b->pmap_mask);; i = (i + 1) & b->pmap_mask) {
        if (b->prank[i] < 0) return 0;
        if (b->pkeys[i] == key) { *rank = b->prank[i]; *merged = b->pmerged[i]; return 1; }
    }
}

static kiln_status pmap_insert(kiln_bpe *b, int32_t l, int32_t r, int32_t rank, int32_t merged) {
    if ((b->pmap_n + 1) * 2 > (b->pmap_mask + 1) || !b->pkeys) {
        uint32_t oc = b->pkeys ? b->pmap_mask + 1 : 0, nc = oc ? oc * 2 : 1024;
        uint64_t *nk = malloc((size_t)nc * sizeof *nk);
        int32_t *nr = malloc((size_t)nc * sizeof *nr), *nm = malloc((size_t)nc * sizeof *nm);
        if (!nk || !nr || !nm) {
            free(nk); free(nr); free(nm);
            return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
        }
        for (uint32_t i = 0; i < nc; i++) nr[i] = -1;
        for (uint32_t i = 0; i < oc; i++) {
            if (b->prank[i] < 0) continue;
            uint32_t j = pair_slot(b->pkeys[i], nc - 1);
            while (nr[j] >= 0) j = (j + 1) & (nc - 1);
            nk[j] = b->pkeys[i]; nr[j] = b->prank[i]; nm[j] = b->pmerged[i];
        }
        free(b->pkeys); free(b->prank); free(b->pmerged);
        b->pkeys = nk; b->prank = nr; b->pmerged = nm;
        b->pmap_mask = nc - 1;
    }
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t i = pair_slot(key, b->pmap_mask);
    while (b->prank[i] >= 0) {
        if (b->pkeys[i] == key) { /* duplicate pair: the first (lowest) rank wins */
            if (rank < b->prank[i]) { b->prank[i] = rank; b->pmerged[i] = merged; }
            return KILN_OK;
        }
        i = (i + 1) & b->pmap_mask;
    }
    b->pkeys[i] = key; b->prank[i] = rank; b->pmerged[i] = merged;
    b->pmap_n++;
    return KILN_OK;
}

/* Vocabulary string (as stored in tokenizer.json / GGUF) -> id via its model bytes. */
static int32_t vocab_str_id(const kiln_bpe *b, const char *s, size_t len) {
    if (b->byte_level) {
        char stackbuf[256], *tmp = len <= sizeof stackbuf ? stackbuf : malloc(len);
        if (!tmp) return -1;
        long bl = bytelevel_decode(s, len, tmp);
        int32_t id = bl >= 0 ? vmap_find(b, tmp, (size_t)bl) : -1;
        if (tmp != stackbuf) free(tmp);
        if (id >= 0) return id;
    }
    return vmap_find(b, s, len);
}

kiln_status kiln_bpe__add_merge(kiln_bpe *b, const char *l, size_t ll, const char *r, size_t rl,
                                int32_t rank, const char *field) {
    int32_t li = vocab_str_id(b, l, ll), ri = vocab_str_id(b, r, rl);
    if (li < 0 || ri < 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: merge part '%.*s' is not in the vocabulary",
                         b->name, field, (int)(li < 0 ? ll : rl), li < 0 ? l : r);
    size_t a = b->mdl_len[li], c = b->mdl_len[ri];
    char stackbuf[512], *cat = a + c <= sizeof stackbuf ? stackbuf : malloc(a + c);
    if (!cat) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    memcpy(cat, b->pool + b->mdl_off[li], a);
    memcpy(cat + a, b->pool + b->mdl_off[ri], c);
    int32_t mi = vmap_find(b, cat, a + c);
    if (cat != stackbuf) free(cat);
    if (mi < 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: merge '%.*s %.*s' makes a token that is not in "
                         "the vocabulary", b->name, field, (int)ll, l, (int)rl, r);
    return pmap_insert(b, li, ri, rank, mi);
}

/* ================================================================================================
 * Regexes and pre-tokenizer steps
 * ============================================================================================== */
const char *const KILN_BPE_PATTERN_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const KILN_BPE_PATTERN_LLAMA3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const PATTERN_QWEN2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] = not (Ll N P S Z C) and not Han;
 * [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]       = not (Lu Lt N P S Z C) and not Han
 * (every code point has exactly one general category, unassigned ones are Cn). */
#define KIMI_UPPER "[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]"
#define KIMI_LOWER "[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{Han}]"
const char *const KILN_BPE_PATTERN_KIMI_K2 =
    "[\\p{Han}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "*" KIMI_LOWER "+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?" KIMI_UPPER "+" KIMI_LOWER "*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* DeepSeek-V3's three Split regexes (its tokenizer.json). */
static const char *const DSV3_SPLITS[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
/* DeepSeek LLM (7B/67B) Split regexes; the letter class is the cased letters (Lu/Ll/Lt) of the
 * Unicode version it was made with. */
static const char *const DSLLM_SPLITS[] = {
    "[\\r\\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}"
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}]+",
    "\\s?[\\x{21}-\\x{2F}\\x{3A}-\\x{7E}\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
    "\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}+",
    NULL};
static const char *const DSCODER_SPLITS[] = {
    "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}", NULL};

kiln_status kiln_bpe__regex(kiln_bpe *b, const char *pattern, size_t len, int literal,
                            const char *field, int *rx) {
    if (b->n_rx >= (int)(sizeof b->rx / sizeof b->rx[0]))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s: more than %d regexes", b->name, field,
                         (int)(sizeof b->rx / sizeof b->rx[0]));
    int err;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
    if (kiln_utf8_validate(pattern, len) != len)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: pattern is not valid UTF-8", b->name, field);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &eoff, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: PCRE2 rejects the regex at offset %zu: %s "
                         "(pattern: %.*s)", b->name, field, (size_t)eoff, (char *)msg,
                         (int)(len > 200 ? 200 : len), pattern);
    }
    bpe_regex *r = &b->rx[b->n_rx];
    r->code = code;
    r->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    r->src = kiln_bpe__strdup(pattern, len);
    r->src_len = len;
    r->literal = literal;
    if (!r->src) {
        pcre2_code_free(code);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    }
    *rx = b->n_rx++;
    return KILN_OK;
}

static kiln_status add_step(kiln_bpe *b, bpe_step st, const char *field) {
    if (b->n_steps >= BPE_MAX_STEPS)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s: more than %d pre-tokenizer steps", b->name,
                         field, BPE_MAX_STEPS);
    b->steps[b->n_steps++] = st;
    return KILN_OK;
}

kiln_status kiln_bpe__add_split(kiln_bpe *b, const char *pattern, int behavior, int invert,
                                const char *field) {
    bpe_step st = {PT_SPLIT, behavior, invert, 0, -1};
    KILN_TRY(kiln_bpe__regex(b, pattern, strlen(pattern), 0, field, &st.rx));
    return add_step(b, st, field);
}

kiln_status kiln_bpe__add_bytelevel(kiln_bpe *b, int add_prefix_space, int use_regex) {
    bpe_step st = {PT_BYTELEVEL, SB_ISOLATED, 0, add_prefix_space, -1};
    if (use_regex)
        KILN_TRY(kiln_bpe__regex(b, KILN_BPE_PATTERN_GPT2, strlen(KILN_BPE_PATTERN_GPT2), 0,
                                 "ByteLevel regex", &st.rx));
    b->byte_level = 1;
    return add_step(b, st, "ByteLevel");
}

static kiln_status add_splits(kiln_bpe *b, const char *const *list, const char *field) {
    for (int i = 0; list[i]; i++) KILN_TRY(kiln_bpe__add_split(b, list[i], SB_ISOLATED, 0, field));
    return KILN_OK;
}

kiln_status kiln_bpe__set_pre_by_name(kiln_bpe *b, const char *pre, const char *field) {
    /* llama.cpp's tokenizer.ggml.pre names -> the Split regexes of the original tokenizer.json,
     * followed by ByteLevel without regex (the byte mapping only). */
    static const char *const gpt2_names[] = {"default", "gpt-2", "gpt2", "mpt", "olmo", "jais",
                                             "trillion", NULL};
    static const char *const llama3_names[] = {"llama3", "llama-bpe", "llama-v3", "dbrx", "smaug-bpe",
                                               "chatglm-bpe", "glm4", NULL};
    static const char *const qwen2_names[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan",
                                              "megrez", NULL};
    for (int i = 0; gpt2_names[i]; i++)
        if (!strcmp(pre, gpt2_names[i])) return kiln_bpe__add_bytelevel(b, 0, 1);
    for (int i = 0; llama3_names[i]; i++)
        if (!strcmp(pre, llama3_names[i])) {
            KILN_TRY(kiln_bpe__add_split(b, KILN_BPE_PATTERN_LLAMA3, SB_ISOLATED, 0, field));
            return kiln_bpe__add_bytelevel(b, 0, 0);
        }
    for (int i = 0; qwen2_names[i]; i++)
        if (!strcmp(pre, qwen2_names[i])) {
            KILN_TRY(kiln_bpe__add_split(b, PATTERN_QWEN2, SB_ISOLATED, 0, field));
            return kiln_bpe__add_bytelevel(b, 0, 0);
        }
    const char *const *list = NULL;
    if (!strcmp(pre, "deepseek-llm")) list = DSLLM_SPLITS;
    else if (!strcmp(pre, "deepseek-coder")) list = DSCODER_SPLITS;
    else if (!strcmp(pre, "deepseek-v3") || !strcmp(pre, "deepseek3-llm")) list = DSV3_SPLITS;
    if (list) {
        KILN_TRY(add_splits(b, list, field));
        return kiln_bpe__add_bytelevel(b, 0, 0);
    }
    if (!strcmp(pre, "kimi-k2")) {
        KILN_TRY(kiln_bpe__add_split(b, KILN_BPE_PATTERN_KIMI_K2, SB_ISOLATED, 0, field));
        return kiln_bpe__add_bytelevel(b, 0, 0);
    }
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s: unknown pre-tokenizer type '%s'", b->name,
                     field, pre);
}

/* ================================================================================================
 * Added tokens: a byte trie for leftmost-longest matching before anything else
 * ============================================================================================== */
static int32_t trie_child(const kiln_bpe *b, int32_t node, uint8_t c) {
    for (int32_t ch = b->trie[node].child; ch >= 0; ch = b->trie[ch].sibling)
        if (b->trie[ch].byte == c) return ch;
    return -1;
}

static int32_t trie_new_node(kiln_bpe *b, uint8_t c) {
    if (b->n_trie == b->trie_cap) {
        size_t nc = b->trie_cap ? b->trie_cap * 2 : 256;
        bpe_trie_node *nt = realloc(b->trie, nc * sizeof *nt);
        if (!nt) return -1;
        b->trie = nt;
        b->trie_cap = nc;
    }
    bpe_trie_node *n = &b->trie[b->n_trie];
    n->child = n->sibling = n->added = -1;
    n->byte = c;
    return (int32_t)b->n_trie++;
}

kiln_status kiln_bpe__add_added(kiln_bpe *b, int32_t id, const char *s, size_t len, int special,
                                int lstrip, int rstrip, int single_word, const char *field) {
    if (!len) return kiln_fail(KILN_ERR_FORMAT, "%s: %s: empty added token", b->name, field);
    if (kiln_utf8_validate(s, len) != len)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: added token is not valid UTF-8", b->name, field);
    KILN_TRY(ensure_id(b, id, field));
    if (!b->trie && trie_new_node(b, 0) < 0) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        int32_t ch = trie_child(b, node, c);
        if (ch < 0) {
            ch = trie_new_node(b, c);
            if (ch < 0) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
            b->trie[ch].sibling = b->trie[node].child;
            b->trie[node].child = ch;
        }
        node = ch;
    }
    if (b->n_added == b->added_cap) {
        size_t nc = b->added_cap ? b->added_cap * 2 : 64;
        bpe_added *na = realloc(b->added, nc * sizeof *na);
        if (!na) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
        b->added = na;
        b->added_cap = nc;
    }
    /* the same content twice: the later entry wins, as a later insert into the HF added vocab */
    int32_t ai = b->trie[node].added >= 0 ? b->trie[node].added : (int32_t)b->n_added++;
    b->added[ai] = (bpe_added){id, (uint8_t)!!special, (uint8_t)!!lstrip, (uint8_t)!!rstrip,
                               (uint8_t)!!single_word};
    b->trie[node].added = ai;
    b->first_byte[(uint8_t)s[0]] = 1;
    /* added tokens decode to their content; their stored string is the content */
    uint32_t so = pool_add(b, s, len);
    if (so == UINT32_MAX) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    b->str_off[id] = so;
    b->pc_off[id] = so; b->pc_len[id] = (uint32_t)len;
    if (!(b->flags[id] & BPE_F_VOCAB)) { b->mdl_off[id] = so; b->mdl_len[id] = (uint32_t)len; }
    b->flags[id] = (uint8_t)((b->flags[id] & ~BPE_F_SPECIAL) | BPE_F_PRESENT | BPE_F_ADDED |
                             (special ? BPE_F_SPECIAL : 0));
    return KILN_OK;
}

kiln_status kiln_bpe__finish(kiln_bpe *b) {
    if (!b->vmap) KILN_TRY(kiln_bpe__index_vocab(b));
    if (b->byte_level) {
        for (int c = 0; c < 256; c++) {
            char ch = (char)c;
            b->byte_id[c] = vmap_find(b, &ch, 1);
        }
    }
    return KILN_OK;
}

/* ================================================================================================
 * tokenizer.json / tokenizer_config.json
 * ============================================================================================== */
static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}
static int jbool(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static kiln_status parse_pattern(kiln_bpe *b, json_t *o, const char *field, int *rx) {
    json_t *pat = json_object_get(o, "pattern");
    char f[256];
    json_t *s;
    if (json_is_object(pat) && json_is_string(s = json_object_get(pat, "Regex"))) {
        snprintf(f, sizeof f, "%s.pattern.Regex", field);
        return kiln_bpe__regex(b, json_string_value(s), json_string_length(s), 0, f, rx);
    }
    if (json_is_object(pat) && json_is_string(s = json_object_get(pat, "String"))) {
        snprintf(f, sizeof f, "%s.pattern.String", field);
        return kiln_bpe__regex(b, json_string_value(s), json_string_length(s), 1, f, rx);
    }
    return kiln_fail(KILN_ERR_FORMAT, "%s: %s.pattern: expected {\"Regex\": ...} or {\"String\": ...}",
                     b->name, field);
}

typedef kiln_status (*parse_fn)(kiln_bpe *b, json_t *o, const char *field, int depth);

/* What the pre-tokenizer and normalizer parsers share: the nesting limit, an object with a
 * "type"; a "Sequence" runs `self` over each element of its array `list_key` and sets *done. */
static kiln_status parse_type(kiln_bpe *b, json_t *o, const char *field, int depth, const char *list_key, parse_fn self,
                              const char **type, int *done) {
    *done = 0;
    if (depth > 8) return kiln_fail(KILN_ERR_FORMAT, "%s: %s: nested too deeply", b->name, field);
    if (!json_is_object(o)) return kiln_fail(KILN_ERR_FORMAT, "%s: %s: expected an object", b->name, field);
    *type = jstr(o, "type");
    if (!*type) return kiln_fail(KILN_ERR_FORMAT, "%s: %s.type: missing", b->name, field);
    if (strcmp(*type, "Sequence")) return KILN_OK;
    json_t *arr = json_object_get(o, list_key);
    if (!json_is_array(arr))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s.%s: expected an array", b->name, field, list_key);
    char f[256];
    for (size_t i = 0; i < json_array_size(arr); i++) {
        snprintf(f, sizeof f, "%s.%s[%zu]", field, list_key, i);
        KILN_TRY(self(b, json_array_get(arr, i), f, depth + 1));
    }
    *done = 1;
    return KILN_OK;
}

static kiln_status parse_pretok(kiln_bpe *b, json_t *o, const char *field, int depth) {
    const char *type;
    int done;
    KILN_TRY(parse_type(b, o, field, depth, "pretokenizers", parse_pretok, &type, &done));
    if (done) return KILN_OK;
    char f[256];
    if (!strcmp(type, "Split")) {
        bpe_step st = {PT_SPLIT, SB_ISOLATED, jbool(o, "invert", 0), 0, -1};
        const char *beh = jstr(o, "behavior");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        int found = -1;
        for (int i = 0; beh && i < 5; i++)
            if (!strcmp(beh, names[i])) found = i;
        if (found < 0)
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s.behavior: '%s' is not a split behavior",
                             b->name, field, beh ? beh : "(missing)");
        st.behavior = found;
        KILN_TRY(parse_pattern(b, o, field, &st.rx));
        return add_step(b, st, field);
    }
    if (!strcmp(type, "ByteLevel"))
        return kiln_bpe__add_bytelevel(b, jbool(o, "add_prefix_space", 1), jbool(o, "use_regex", 1));
    if (!strcmp(type, "Digits")) {
        int individual = jbool(o, "individual_digits", 0);
        bpe_step st = {PT_DIGITS, individual ? SB_ISOLATED : SB_CONTIGUOUS, 0, 0, -1};
        snprintf(f, sizeof f, "%s (Digits)", field);
        KILN_TRY(kiln_bpe__regex(b, "\\p{N}", 5, 0, f, &st.rx));
        return add_step(b, st, field);
    }
    if (!strcmp(type, "Whitespace")) { /* \w+|[^\w\s]+ kept, the rest removed */
        bpe_step st = {PT_SPLIT, SB_REMOVED, 1, 0, -1};
        KILN_TRY(kiln_bpe__regex(b, "\\w+|[^\\w\\s]+", 13, 0, field, &st.rx));
        return add_step(b, st, field);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        bpe_step st = {PT_SPLIT, SB_REMOVED, 0, 0, -1};
        KILN_TRY(kiln_bpe__regex(b, "\\s+", 3, 0, field, &st.rx));
        return add_step(b, st, field);
    }
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s.type: pre-tokenizer type '%s' is not supported",
                     b->name, field, type);
}

static kiln_status parse_normalizer(kiln_bpe *b, json_t *o, const char *field, int depth) {
    const char *type;
    int done;
    KILN_TRY(parse_type(b, o, field, depth, "normalizers", parse_normalizer, &type, &done));
    if (done) return KILN_OK;
    if (b->n_norms >= BPE_MAX_STEPS)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s: too many normalizers", b->name, field);
    bpe_norm *nm = &b->norms[b->n_norms];
    memset(nm, 0, sizeof *nm);
    nm->rx = -1;
    if (!strcmp(type, "NFC")) nm->type = NM_NFC;
    else if (!strcmp(type, "NFD")) nm->type = NM_NFD;
    else if (!strcmp(type, "NFKC")) nm->type = NM_NFKC;
    else if (!strcmp(type, "NFKD")) nm->type = NM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm->type = NM_LOWER;
    else if (!strcmp(type, "Replace")) {
        nm->type = NM_REPLACE;
        json_t *c = json_object_get(o, "content");
        if (!json_is_string(c))
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s.content: expected a string", b->name, field);
        KILN_TRY(parse_pattern(b, o, field, &nm->rx));
        nm->content = kiln_bpe__strdup(json_string_value(c), json_string_length(c));
        if (!nm->content) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    } else if (!strcmp(type, "Prepend")) {
        nm->type = NM_PREPEND;
        json_t *c = json_object_get(o, "prepend");
        if (!json_is_string(c))
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s.prepend: expected a string", b->name, field);
        nm->content = kiln_bpe__strdup(json_string_value(c), json_string_length(c));
        if (!nm->content) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", b->name);
    } else
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: %s.type: normalizer type '%s' is not supported",
                         b->name, field, type);
    b->n_norms++;
    return KILN_OK;
}

/* A token in tokenizer_config.json: a string, {"content": ...} or null. */
static const char *config_token(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return jstr(v, "content");
    return NULL;
}

int32_t kiln_bpe_token_id(const kiln_bpe *b, const char *s, size_t len) {
    if (!b || !s) return -1;
    if (b->trie && len) {
        int32_t node = 0;
        for (size_t i = 0; i < len && node >= 0; i++) node = trie_child(b, node, (uint8_t)s[i]);
        if (node >= 0 && b->trie[node].added >= 0) return b->added[b->trie[node].added].id;
    }
    int32_t id = vmap_find(b, s, len);
    if (id >= 0) return id;
    return b->byte_level ? vocab_str_id(b, s, len) : -1;
}

const char *kiln_bpe_config_chat_template(json_t *cfg) {
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *tmpl = NULL;
    if (json_is_string(ct)) tmpl = json_string_value(ct);
    else if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i);
            const char *nm = jstr(e, "name"), *t = jstr(e, "template");
            if (t && (!tmpl || (nm && !strcmp(nm, "default")))) tmpl = t;
        }
    }
    return tmpl;
}

/* bos/eos/add_bos/chat_template from a parsed tokenizer_config.json. */
static kiln_status apply_config(kiln_bpe *b, json_t *cfg, const char *cname) {
    if (!json_is_object(cfg))
        return kiln_fail(KILN_ERR_FORMAT, "%s: expected a JSON object at the top level", cname);
    const char *names[2] = {config_token(json_object_get(cfg, "bos_token")),
                            config_token(json_object_get(cfg, "eos_token"))};
    for (int k = 0; k < 2; k++) {
        if (!names[k]) continue;
        int32_t id = kiln_bpe_token_id(b, names[k], strlen(names[k]));
        if (id < 0)
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s: '%s' is not a token of %s", cname,
                             k ? "eos_token" : "bos_token", names[k], b->name);
        char *d = kiln_bpe__strdup(names[k], strlen(names[k]));
        if (!d) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", cname);
        if (k) { b->eos = id; free(b->eos_str); b->eos_str = d; }
        else { b->bos = id; free(b->bos_str); b->bos_str = d; }
    }
    json_t *v;
    if (json_is_boolean(v = json_object_get(cfg, "add_bos_token"))) b->add_bos = json_is_true(v);
    if (json_is_boolean(v = json_object_get(cfg, "add_eos_token"))) b->add_eos = json_is_true(v);
    if (b->bos < 0) b->add_bos = 0;
    if (b->eos < 0) b->add_eos = 0;
    const char *tmpl = kiln_bpe_config_chat_template(cfg);
    if (tmpl) {
        free(b->chat_template);
        b->chat_template = kiln_bpe__strdup(tmpl, strlen(tmpl));
        if (!b->chat_template) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", cname);
    }
    return KILN_OK;
}

/* TemplateProcessing {"single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": ...}],
 * "special_tokens": {"<s>": {"ids": [1]}}}: BOS/EOS added by the post-processor. Runs after the
 * vocabulary and added tokens are read, so an id can be checked against them (it is prepended to
 * every prompt: an id past the vocabulary would index past the embedding table). */
static kiln_status parse_post(kiln_bpe *b, json_t *pp, int depth) {
    if (!json_is_object(pp) || depth > 4) return KILN_OK;
    const char *type = jstr(pp, "type");
    if (!type) return KILN_OK;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) KILN_TRY(parse_post(b, json_array_get(arr, i), depth + 1));
        return KILN_OK;
    }
    if (strcmp(type, "TemplateProcessing")) return KILN_OK;
    json_t *single = json_object_get(pp, "single"), *sp = json_object_get(pp, "special_tokens");
    size_t n = json_array_size(single);
    for (int end = 0; end < 2 && n; end++) {
        json_t *item = json_array_get(single, end ? n - 1 : 0);
        json_t *st = json_object_get(item, "SpecialToken");
        const char *name = jstr(st, "id");
        if (!name) continue;
        json_t *ids = json_object_get(json_object_get(sp, name), "ids");
        json_t *id0 = json_array_get(ids, 0);
        if (!json_is_integer(id0)) continue;
        json_int_t id = json_integer_value(id0);
        if (id < 0 || id >= b->n_vocab || !(b->flags[id] & BPE_F_PRESENT))
            return kiln_fail(KILN_ERR_FORMAT, "%s: post_processor.special_tokens['%s'].ids[0] = %lld is not a token id (vocabulary %d)",
                             b->name, name, (long long)id, b->n_vocab);
        if (end) { b->eos = (int32_t)id; b->add_eos = 1; }
        else { b->bos = (int32_t)id; b->add_bos = 1; }
    }
    return KILN_OK;
}

static kiln_status load_hf(kiln_bpe *b, json_t *root) {
    if (!json_is_object(root))
        return kiln_fail(KILN_ERR_FORMAT, "%s: expected a JSON object at the top level", b->name);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return kiln_fail(KILN_ERR_FORMAT, "%s: model: missing or not an object", b->name);
    const char *mtype = jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE"))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: model.type: '%s' is not a BPE model", b->name, mtype);
    json_t *v;
    if (json_is_string(v = json_object_get(model, "continuing_subword_prefix")) && json_string_length(v))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: model.continuing_subword_prefix: '%s' is not supported",
                         b->name, json_string_value(v));
    if (json_is_string(v = json_object_get(model, "end_of_word_suffix")) && json_string_length(v))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: model.end_of_word_suffix: '%s' is not supported",
                         b->name, json_string_value(v));
    b->ignore_merges = jbool(model, "ignore_merges", 0);
    b->byte_fallback = jbool(model, "byte_fallback", 0);
    b->fuse_unk = jbool(model, "fuse_unk", 0);

    /* pipeline first: whether ByteLevel is present decides how vocabulary strings are read */
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) KILN_TRY(parse_normalizer(b, norm, "normalizer", 0));
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre)) KILN_TRY(parse_pretok(b, pre, "pre_tokenizer", 0));

    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab: missing or not an object", b->name);
    const char *key;
    json_t *val;
    int kind = b->byte_level ? BPE_TOK_BYTELEVEL : BPE_TOK_RAW;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val))
            return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab['%s']: expected an integer id", b->name, key);
        json_int_t id = json_integer_value(val);
        char f[64];
        snprintf(f, sizeof f, "model.vocab (id %lld)", (long long)id);
        if (id < 0 || id >= (1 << 28))
            return kiln_fail(KILN_ERR_FORMAT, "%s: model.vocab['%s']: id %lld out of range", b->name, key,
                             (long long)id);
        KILN_TRY(kiln_bpe__set_vocab(b, (int32_t)id, key, strlen(key), kind, f));
    }
    KILN_TRY(kiln_bpe__index_vocab(b));

    json_t *merges = json_object_get(model, "merges");
    if (merges && !json_is_array(merges))
        return kiln_fail(KILN_ERR_FORMAT, "%s: model.merges: expected an array", b->name);
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *m = json_array_get(merges, i);
        char f[64];
        snprintf(f, sizeof f, "model.merges[%zu]", i);
        if (json_is_string(m)) { /* "left right" */
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
            if (!sp) return kiln_fail(KILN_ERR_FORMAT, "%s: %s: '%s' is not \"left right\"", b->name, f, s);
            KILN_TRY(kiln_bpe__add_merge(b, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1,
                                         (int32_t)i, f));
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
            KILN_TRY(kiln_bpe__add_merge(b, json_string_value(l), json_string_length(l),
                                         json_string_value(r), json_string_length(r), (int32_t)i, f));
        } else
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s: expected \"left right\" or [left, right]", b->name, f);
    }

    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return kiln_fail(KILN_ERR_FORMAT, "%s: added_tokens: expected an array", b->name);
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        char f[64];
        snprintf(f, sizeof f, "added_tokens[%zu]", i);
        json_t *idv = json_object_get(a, "id"), *cv = json_object_get(a, "content");
        if (!json_is_integer(idv) || !json_is_string(cv))
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s: needs an integer id and a string content", b->name, f);
        KILN_TRY(kiln_bpe__add_added(b, (int32_t)json_integer_value(idv), json_string_value(cv),
                                     json_string_length(cv), jbool(a, "special", 0), jbool(a, "lstrip", 0),
                                     jbool(a, "rstrip", 0), jbool(a, "single_word", 0), f));
    }
    const char *unk = jstr(model, "unk_token");
    if (unk) b->unk_id = kiln_bpe_token_id(b, unk, strlen(unk));
    KILN_TRY(parse_post(b, json_object_get(root, "post_processor"), 0));
    return kiln_bpe__finish(b);
}

static kiln_status load_hf_common(json_t *root, json_t *cfg, const char *name, const char *cname,
                                  kiln_bpe **out) {
    kiln_bpe *b = kiln_bpe__new(name);
    if (!b) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", name);
    kiln_status st = load_hf(b, root);
    if (st == KILN_OK && cfg) st = apply_config(b, cfg, cname);
    if (st != KILN_OK) { kiln_bpe_free(b); return st; }
    *out = b;
    return KILN_OK;
}

kiln_status kiln_bpe_load_hf_json_buf(const char *json, size_t len, const char *config_json,
                                      size_t config_len, const char *name, kiln_bpe **out) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return kiln_fail(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d (byte %d): %s", name,
                         je.line, je.column, je.position, je.text);
    json_t *cfg = NULL;
    if (config_json) {
        cfg = json_loadb(config_json, config_len, 0, &je);
        if (!cfg) {
            json_decref(root);
            return kiln_fail(KILN_ERR_FORMAT, "tokenizer_config.json: invalid JSON at line %d column %d: %s",
                             je.line, je.column, je.text);
        }
    }
    kiln_status st = load_hf_common(root, cfg, name, "tokenizer_config.json", out);
    json_decref(root);
    json_decref(cfg);
    return st;
}

static json_t *load_json_file(const char *path, kiln_status *st) {
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root)
        *st = kiln_fail(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d (byte %d): %s", path,
                        je.line, je.column, je.position, je.text);
    return root;
}

kiln_status kiln_bpe_load_hf_json(const char *tokenizer_json_path, const char *tokenizer_config_path,
                                  kiln_bpe **out) {
    *out = NULL;
    kiln_status st = KILN_OK;
    json_t *root = load_json_file(tokenizer_json_path, &st);
    if (!root) return st;
    json_t *cfg = NULL;
    if (tokenizer_config_path) {
        cfg = load_json_file(tokenizer_config_path, &st);
        if (!cfg) { json_decref(root); return st; }
    }
    st = load_hf_common(root, cfg, tokenizer_json_path, tokenizer_config_path, out);
    json_decref(root);
    json_decref(cfg);
    return st;
}

/* ---- the pipeline as tokenizer.json objects (saving) ---------------------------------------- */
static json_t *pattern_json(const kiln_bpe *b, int rx) {
    const bpe_regex *r = &b->rx[rx];
    return json_pack("{s:s%}", r->literal ? "String" : "Regex", r->src, r->src_len);
}

json_t *kiln_bpe__pipeline_json(const kiln_bpe *b) {
    static const char *const beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
    static const char *const nname[] = {"NFC", "NFD", "NFKC", "NFKD", "Replace", "Prepend", "Lowercase"};
    json_t *norms = json_array(), *pres = json_array();
    for (int i = 0; norms && i < b->n_norms; i++) {
        const bpe_norm *nm = &b->norms[i];
        json_t *o = json_pack("{s:s}", "type", nname[nm->type]);
        if (o && nm->type == NM_REPLACE) {
            json_object_set_new(o, "pattern", pattern_json(b, nm->rx));
            json_object_set_new(o, "content", json_string(nm->content));
        } else if (o && nm->type == NM_PREPEND) {
            json_object_set_new(o, "prepend", json_string(nm->content));
        }
        json_array_append_new(norms, o);
    }
    for (int i = 0; pres && i < b->n_steps; i++) {
        const bpe_step *st = &b->steps[i];
        json_t *o = NULL;
        if (st->type == PT_SPLIT)
            o = json_pack("{s:s, s:o, s:s, s:b}", "type", "Split", "pattern", pattern_json(b, st->rx),
                          "behavior", beh[st->behavior], "invert", st->invert);
        else if (st->type == PT_BYTELEVEL)
            o = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                          st->add_prefix_space, "trim_offsets", 0, "use_regex", st->rx >= 0);
        else if (st->type == PT_DIGITS)
            o = json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", st->behavior == SB_ISOLATED);
        json_array_append_new(pres, o);
    }
    if (!norms || !pres) {
        json_decref(norms);
        json_decref(pres);
        return NULL;
    }
    return json_pack("{s:o, s:o}", "normalizer", json_pack("{s:s, s:o}", "type", "Sequence", "normalizers", norms),
                     "pre_tokenizer", json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", pres));
}

kiln_status kiln_bpe__parse_pipeline(kiln_bpe *b, const char *json, size_t len, const char *field) {
    json_error_t je;
    json_t *o = json_loadb(json, len, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s: not a JSON object (%s)", b->name, field, je.text);
    }
    b->n_norms = 0;
    b->n_steps = 0;
    kiln_status st = KILN_OK;
    json_t *v = json_object_get(o, "normalizer");
    if (v && !json_is_null(v)) st = parse_normalizer(b, v, field, 0);
    v = json_object_get(o, "pre_tokenizer");
    if (st == KILN_OK && v && !json_is_null(v)) st = parse_pretok(b, v, field, 0);
    json_decref(o);
    return st;
}

static kiln_status write_json(json_t *j, const char *path) {
    if (!j) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    int rc = json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
    if (rc) return kiln_fail(KILN_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return KILN_OK;
}

static int merge_cmp(const void *a, const void *b) {
    const bpe_merge_t *x = a, *y = b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

bpe_merge_t *kiln_bpe__merges_sorted(const kiln_bpe *b, size_t *n) {
    *n = 0;
    bpe_merge_t *m = malloc((b->pmap_n ? b->pmap_n : 1) * sizeof *m);
    if (!m) return NULL;
    for (uint32_t i = 0; b->pkeys && i <= b->pmap_mask; i++) {
        if (b->prank[i] < 0) continue;
        m[(*n)++] = (bpe_merge_t){b->prank[i], (int32_t)(b->pkeys[i] >> 32), (int32_t)(uint32_t)b->pkeys[i]};
    }
    qsort(m, *n, sizeof *m, merge_cmp);
    return m;
}

kiln_status kiln_bpe_save_hf(const kiln_bpe *b, const char *dir) {
    if (b->tiktoken || !b->byte_level)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: writing a tokenizer.json for a %s vocabulary is not supported",
                         b->name, b->tiktoken ? "tiktoken" : "non-byte-level");
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    size_t nm = 0;
    bpe_merge_t *m = kiln_bpe__merges_sorted(b, &nm);
    json_t *pipe = kiln_bpe__pipeline_json(b);
    if (!vocab || !merges || !added || !m || !pipe) {
        json_decref(vocab); json_decref(merges); json_decref(added); json_decref(pipe); free(m);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (int32_t id = 0; id < b->n_vocab; id++)
        if (b->flags[id] & BPE_F_VOCAB) json_object_set_new(vocab, b->pool + b->str_off[id], json_integer(id));
    for (size_t i = 0; i < nm; i++)
        json_array_append_new(merges, json_pack("[s,s]", b->pool + b->str_off[m[i].l], b->pool + b->str_off[m[i].r]));
    free(m);
    for (size_t i = 0; i < b->n_added; i++) {
        const bpe_added *a = &b->added[i];
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (int)a->id, "content",
                                               b->pool + b->str_off[a->id], "single_word", a->single_word, "lstrip",
                                               a->lstrip, "rstrip", a->rstrip, "normalized", 0, "special", a->special));
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:O, s:O, s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:n, s:n, "
                             "s:n, s:b, s:b, s:b, s:o, s:o}}",
                             "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
                             json_object_get(pipe, "normalizer"), "pre_tokenizer", json_object_get(pipe, "pre_tokenizer"),
                             "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                             "use_regex", 0, "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                             "end_of_word_suffix", "fuse_unk", b->fuse_unk, "byte_fallback", b->byte_fallback,
                             "ignore_merges", b->ignore_merges, "vocab", vocab, "merges", merges);
    json_decref(pipe);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    KILN_TRY(write_json(root, path));
    json_t *cfg = json_pack("{s:b, s:b, s:s}", "add_bos_token", b->add_bos, "add_eos_token", b->add_eos,
                            "tokenizer_class", "PreTrainedTokenizerFast");
    if (cfg) {
        const char *bs = kiln_bpe_bos_str(b), *es = kiln_bpe_eos_str(b);
        json_object_set_new(cfg, "bos_token", bs ? json_string(bs) : json_null());
        json_object_set_new(cfg, "eos_token", es ? json_string(es) : json_null());
        if (b->chat_template) json_object_set_new(cfg, "chat_template", json_string(b->chat_template));
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    return write_json(cfg, path);
}

/* ================================================================================================
 * tiktoken
 * ============================================================================================== */
static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with '=' padding; returns decoded length or -1. */
static long b64_decode(const char *s, size_t n, char *out) {
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    while (n && s[n - 1] == '=') n--;
    for (size_t i = 0; i < n; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; out[o++] = (char)((acc >> bits) & 0xFF); }
    }
    return (long)o;
}

static kiln_status load_tiktoken(kiln_bpe *b, const char *path, const char *pattern,
                                 const kiln_bpe_added *added, size_t n_added) {
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    kiln_status st = KILN_OK;
    char *buf = NULL;
    size_t bufcap = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (!len) continue;
        char *sp = memchr(line, ' ', len);
        if (!sp) { st = kiln_fail(KILN_ERR_FORMAT, "%s: line %zu: expected \"base64 rank\"", path, lineno); break; }
        size_t tl = (size_t)(sp - line);
        char *end;
        errno = 0;
        long rank = strtol(sp + 1, &end, 10);
        if (errno || end == sp + 1 || end != line + len || rank < 0 || rank >= (1 << 28)) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: line %zu: bad rank '%.*s'", path, lineno,
                           (int)(len - tl - 1), sp + 1);
            break;
        }
        if (tl + 4 > bufcap) {
            bufcap = tl + 64;
            char *nb = realloc(buf, bufcap);
            if (!nb) { st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path); break; }
            buf = nb;
        }
        long bl = b64_decode(line, tl, buf);
        if (bl <= 0) { st = kiln_fail(KILN_ERR_FORMAT, "%s: line %zu: bad base64 token", path, lineno); break; }
        char fld[64];
        snprintf(fld, sizeof fld, "line %zu", lineno);
        st = kiln_bpe__set_vocab(b, (int32_t)rank, buf, (size_t)bl, BPE_TOK_RAW, fld);
        if (st != KILN_OK) break;
    }
    free(line);
    free(buf);
    fclose(f);
    if (st != KILN_OK) return st;
    if (!lineno) return kiln_fail(KILN_ERR_FORMAT, "%s: empty tiktoken file", path);
    KILN_TRY(kiln_bpe__index_vocab(b));
    /* tiktoken merges by the rank of the joined bytes: every split of a token into two tokens is a
     * merge of that token's rank. */
    for (int32_t id = 0; id < b->n_vocab; id++) {
        if (!(b->flags[id] & BPE_F_VOCAB) || b->mdl_len[id] < 2) continue;
        const char *s = b->pool + b->mdl_off[id];
        size_t len = b->mdl_len[id];
        for (size_t k = 1; k < len; k++) {
            int32_t l = vmap_find(b, s, k), r = vmap_find(b, s + k, len - k);
            if (l >= 0 && r >= 0) KILN_TRY(pmap_insert(b, l, r, id, id));
        }
    }
    b->tiktoken = 1;
    b->ignore_merges = 1; /* a piece that is a whole token is taken as is */
    b->byte_level = 1;    /* initial symbols are single bytes */
    KILN_TRY(kiln_bpe__add_split(b, pattern ? pattern : KILN_BPE_PATTERN_KIMI_K2, SB_ISOLATED, 0,
                                 "pattern"));
    for (size_t i = 0; i < n_added; i++) {
        char fld[64];
        snprintf(fld, sizeof fld, "added token %zu", i);
        if (!added[i].content)
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %s: no content", path, fld);
        KILN_TRY(kiln_bpe__add_added(b, added[i].id, added[i].content, strlen(added[i].content),
                                     added[i].special, 0, 0, 0, fld));
    }
    return kiln_bpe__finish(b);
}

kiln_status kiln_bpe_load_tiktoken(const char *path, const char *pattern, const kiln_bpe_added *added,
                                   size_t n_added, kiln_bpe **out) {
    *out = NULL;
    kiln_bpe *b = kiln_bpe__new(path);
    if (!b) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    kiln_status st = load_tiktoken(b, path, pattern, added, n_added);
    if (st != KILN_OK) { kiln_bpe_free(b); return st; }
    *out = b;
    return KILN_OK;
}

kiln_status kiln_bpe_load_tiktoken_config(const char *tiktoken_path, const char *tokenizer_config_path,
                                          const char *pattern, kiln_bpe **out) {
    *out = NULL;
    kiln_status st = KILN_OK;
    json_t *cfg = load_json_file(tokenizer_config_path, &st);
    if (!cfg) return st;
    json_t *atd = json_object_get(cfg, "added_tokens_decoder");
    size_t n = json_is_object(atd) ? json_object_size(atd) : 0, i = 0;
    kiln_bpe_added *list = calloc(n ? n : 1, sizeof *list);
    if (!list) { json_decref(cfg); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    const char *key;
    json_t *val;
    json_object_foreach(atd, key, val) {
        char *end;
        long id = strtol(key, &end, 10);
        const char *content = jstr(val, "content");
        if (*end || end == key || id < 0 || !content) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: added_tokens_decoder['%s']: needs an integer key and a "
                           "content", tokenizer_config_path, key);
            break;
        }
        list[i++] = (kiln_bpe_added){content, (int32_t)id, jbool(val, "special", 1)};
    }
    kiln_bpe *b = NULL;
    if (st == KILN_OK) st = kiln_bpe_load_tiktoken(tiktoken_path, pattern, list, i, &b);
    if (st == KILN_OK) st = apply_config(b, cfg, tokenizer_config_path);
    free(list);
    json_decref(cfg);
    if (st != KILN_OK) { kiln_bpe_free(b); return st; }
    *out = b;
    return KILN_OK;
}

void kiln_bpe_free(kiln_bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_rx; i++) { pcre2_code_free(b->rx[i].code); free(b->rx[i].src); }
    free(b->pre_name);
    for (int i = 0; i < b->n_norms; i++) free(b->norms[i].content);
    free(b->name); free(b->mdl_off); free(b->mdl_len); free(b->pc_off); free(b->pc_len);
    free(b->str_off); free(b->flags); free(b->pool); free(b->vmap);
    free(b->pkeys); free(b->prank); free(b->pmerged);
    free(b->added); free(b->trie);
    free(b->chat_template); free(b->bos_str); free(b->eos_str);
    free(b);
}

/* ================================================================================================
 * Encoding
 * ============================================================================================== */
typedef struct { uint32_t s, e; uint8_t m; } span_t;
typedef struct { span_t *v; size_t n, cap; } span_vec;
typedef struct { int32_t rank, pos, lid, rid, merged; } cand_t;

/* Per-call cache of short pieces already merged (English text repeats words a lot). */
#define WC_MAX_KEY 32
typedef struct { uint64_t h; uint32_t koff, klen, ioff, ilen; } wc_entry;

typedef struct enc {
    const kiln_bpe *b;
    kiln_status st;
    int32_t *out;
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jst;
    span_vec lv[BPE_MAX_STEPS];
    char *tmp[BPE_MAX_STEPS];
    size_t tmpcap[BPE_MAX_STEPS];
    int32_t *sym, *prv, *nxt;
    size_t scap;
    cand_t *heap;
    size_t hn, hcap;
    /* word cache */
    wc_entry *wc;
    uint32_t wc_mask, wc_n;
    char *wkeys;
    size_t wkeys_n, wkeys_cap;
    int32_t *wids;
    size_t wids_n, wids_cap;
} enc;

static int enc_oom(enc *c) {
    c->st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory while encoding", c->b->name);
    return -1;
}

static int push_id(enc *c, int32_t id) {
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 256;
        int32_t *no = realloc(c->out, nc * sizeof *no);
        if (!no) return enc_oom(c);
        c->out = no;
        c->cap = nc;
    }
    c->out[c->n++] = id;
    return 0;
}

static int heap_push(enc *c, cand_t x) {
    if (c->hn == c->hcap) {
        size_t nc = c->hcap ? c->hcap * 2 : 64;
        cand_t *nh = realloc(c->heap, nc * sizeof *nh);
        if (!nh) return enc_oom(c);
        c->heap = nh;
        c->hcap = nc;
    }
    size_t i = c->hn++;
    while (i) {
        size_t p = (i - 1) / 2;
        cand_t *q = &c->heap[p];
        if (q->rank < x.rank || (q->rank == x.rank && q->pos < x.pos)) break;
        c->heap[i] = *q;
        i = p;
    }
    c->heap[i] = x;
    return 0;
}

static cand_t heap_pop(enc *c) {
    cand_t top = c->heap[0], x = c->heap[--c->hn];
    size_t i = 0, n = c->hn;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        cand_t *best = &x;
        if (l < n && (c->heap[l].rank < best->rank || (c->heap[l].rank == best->rank && c->heap[l].pos < best->pos))) { m = l; best = &c->heap[l]; }
        if (r < n && (c->heap[r].rank < best->rank || (c->heap[r].rank == best->rank && c->heap[r].pos < best->pos))) { m = r; best = &c->heap[r]; }
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = x;
    return top;
}

static int try_pair(enc *c, int32_t l, int32_t r) {
    int32_t rank, merged;
    if (!pmap_find(c->b, c->sym[l], c->sym[r], &rank, &merged)) return 0;
    return heap_push(c, (cand_t){rank, l, c->sym[l], c->sym[r], merged});
}

/* Merges one pre-tokenized piece and appends its ids. */
static int bpe_merge(enc *c, const char *p, size_t n) {
    const kiln_bpe *b = c->b;
    if (b->ignore_merges) {
        int32_t id = vmap_find(b, p, n);
        if (id >= 0) return push_id(c, id);
    }
    if (n > c->scap) {
        size_t nc = c->scap ? c->scap : 64;
        while (nc < n) nc *= 2;
        int32_t *a = realloc(c->sym, nc * sizeof *a);
        if (!a) return enc_oom(c);
        c->sym = a;
        a = realloc(c->prv, nc * sizeof *a);
        if (!a) return enc_oom(c);
        c->prv = a;
        a = realloc(c->nxt, nc * sizeof *a);
        if (!a) return enc_oom(c);
        c->nxt = a;
        c->scap = nc;
    }
    int32_t ns = 0;
    if (b->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = b->byte_id[(uint8_t)p[i]];
            if (id < 0) {
                if (b->unk_id < 0) {
                    c->st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: byte 0x%02x has no token and there is "
                                      "no unk_token", b->name, (uint8_t)p[i]);
                    return -1;
                }
                id = b->unk_id;
                if (b->fuse_unk && ns && c->sym[ns - 1] == id) continue;
            }
            c->sym[ns++] = id;
        }
    } else {
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int l = utf8_next(p + i, n - i, &cp);
            int32_t id = vmap_find(b, p + i, (size_t)l);
            if (id < 0 && b->byte_fallback) {
                int ok = 1;
                for (int k = 0; k < l; k++) ok &= b->byte_tok[(uint8_t)p[i + k]] >= 0;
                if (ok) {
                    for (int k = 0; k < l; k++) c->sym[ns++] = b->byte_tok[(uint8_t)p[i + k]];
                    i += (size_t)l;
                    continue;
                }
            }
            if (id < 0) {
                if (b->unk_id < 0) {
                    c->st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: character U+%04X has no token and "
                                      "there is no unk_token", b->name, cp);
                    return -1;
                }
                id = b->unk_id;
                if (b->fuse_unk && ns && c->sym[ns - 1] == id) { i += (size_t)l; continue; }
            }
            c->sym[ns++] = id;
            i += (size_t)l;
        }
    }
    if (ns == 1) return push_id(c, c->sym[0]);
    for (int32_t i = 0; i < ns; i++) { c->prv[i] = i - 1; c->nxt[i] = i + 1 < ns ? i + 1 : -1; }
    c->hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        if (try_pair(c, i, i + 1)) return -1;
    while (c->hn) {
        cand_t x = heap_pop(c);
        int32_t l = x.pos, r = c->nxt[l];
        /* stale candidates: the left symbol changed (or was absorbed) or its neighbour did */
        if (c->sym[l] != x.lid || r < 0 || c->sym[r] != x.rid || c->prv[l] == -2) continue;
        c->sym[l] = x.merged;
        c->nxt[l] = c->nxt[r];
        if (c->nxt[r] >= 0) c->prv[c->nxt[r]] = l;
        c->prv[r] = -2; /* dead */
        c->sym[r] = -1;
        if (c->prv[l] >= 0 && try_pair(c, c->prv[l], l)) return -1;
        if (c->nxt[l] >= 0 && try_pair(c, l, c->nxt[l])) return -1;
    }
    for (int32_t i = 0; i >= 0; i = c->nxt[i])
        if (push_id(c, c->sym[i])) return -1;
    return 0;
}

/* bpe_merge through the per-call word cache. */
static int bpe_piece(enc *c, const char *p, size_t n) {
    if (n > WC_MAX_KEY) return bpe_merge(c, p, n);
    uint64_t h = hash_bytes(p, n);
    if (c->wc) {
        for (uint32_t i = (uint32_t)h & c->wc_mask;; i = (i + 1) & c->wc_mask) {
            wc_entry *e = &c->wc[i];
            if (!e->klen) break;
            if (e->h == h && e->klen == n && !memcmp(c->wkeys + e->koff, p, n)) {
                for (uint32_t k = 0; k < e->ilen; k++)
                    if (push_id(c, c->wids[e->ioff + k])) return -1;
                return 0;
            }
        }
    }
    size_t before = c->n;
    if (bpe_merge(c, p, n)) return -1;
    /* insert (best effort: a full or failed cache only costs speed) */
    if (!c->wc) {
        c->wc = calloc(1u << 14, sizeof *c->wc);
        if (!c->wc) return 0;
        c->wc_mask = (1u << 14) - 1;
    }
    if ((c->wc_n + 1) * 2 > c->wc_mask + 1) return 0;
    size_t ni = c->n - before;
    if (c->wkeys_n + n > c->wkeys_cap) {
        size_t nc = c->wkeys_cap ? c->wkeys_cap * 2 : 1 << 16;
        char *nk = realloc(c->wkeys, nc);
        if (!nk) return 0;
        c->wkeys = nk;
        c->wkeys_cap = nc;
    }
    if (c->wids_n + ni > c->wids_cap) {
        size_t nc = c->wids_cap ? c->wids_cap * 2 : 1 << 14;
        while (nc < c->wids_n + ni) nc *= 2;
        int32_t *nw = realloc(c->wids, nc * sizeof *nw);
        if (!nw) return 0;
        c->wids = nw;
        c->wids_cap = nc;
    }
    uint32_t i = (uint32_t)h & c->wc_mask;
    while (c->wc[i].klen) i = (i + 1) & c->wc_mask;
    memcpy(c->wkeys + c->wkeys_n, p, n);
    memcpy(c->wids + c->wids_n, c->out + before, ni * sizeof *c->wids);
    c->wc[i] = (wc_entry){h, (uint32_t)c->wkeys_n, (uint32_t)n, (uint32_t)c->wids_n, (uint32_t)ni};
    c->wkeys_n += n;
    c->wids_n += ni;
    c->wc_n++;
    return 0;
}

static int span_add(enc *c, span_vec *v, uint32_t s, uint32_t e, int m) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        span_t *nv = realloc(v->v, nc * sizeof *nv);
        if (!nv) return enc_oom(c);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = (span_t){s, e, (uint8_t)m};
    return 0;
}

/* All matches of rx in p[0..n) as spans covering the whole string (gaps have m = 0). */
static int find_spans(enc *c, const bpe_regex *rx, const char *p, size_t n, span_vec *v) {
    v->n = 0;
    size_t pos = 0, prev = 0;
    while (pos < n) {
        int rc = rx->jit ? pcre2_jit_match(rx->code, (PCRE2_SPTR)p, n, pos, 0, c->md, c->mctx)
                         : pcre2_match(rx->code, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            c->st = kiln_fail(KILN_ERR_INTERNAL, "%s: regex match failed on a %zu-byte piece: %s",
                              c->b->name, n, (char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* empty match: step over one character, as Oniguruma's find_iter */
            uint32_t cp;
            pos = s + (size_t)utf8_next(p + s, n - s, &cp);
            continue;
        }
        if (s > prev && span_add(c, v, (uint32_t)prev, (uint32_t)s, 0)) return -1;
        if (span_add(c, v, (uint32_t)s, (uint32_t)e, 1)) return -1;
        prev = pos = e;
    }
    if (prev < n && span_add(c, v, (uint32_t)prev, (uint32_t)n, 0)) return -1;
    return 0;
}

/* Applies a split behavior in place (the Hugging Face SplitDelimiterBehavior semantics). */
static void apply_behavior(span_vec *v, int behavior, int invert) {
    if (invert)
        for (size_t i = 0; i < v->n; i++) v->v[i].m = !v->v[i].m;
    size_t o = 0;
    int prev_match = 0;
    switch (behavior) {
    case SB_ISOLATED: return;
    case SB_REMOVED:
        for (size_t i = 0; i < v->n; i++)
            if (!v->v[i].m) v->v[o++] = v->v[i];
        break;
    case SB_MERGED_PREV: /* a delimiter joins the piece before it */
        for (size_t i = 0; i < v->n; i++) {
            span_t x = v->v[i];
            if (x.m && !prev_match && o) v->v[o - 1].e = x.e;
            else v->v[o++] = x;
            prev_match = x.m;
        }
        break;
    case SB_MERGED_NEXT: { /* a delimiter joins the piece after it: scan backwards */
        size_t w = v->n;
        for (size_t i = v->n; i-- > 0;) {
            span_t x = v->v[i];
            if (x.m && !prev_match && w < v->n) v->v[w].s = x.s;
            else v->v[--w] = x;
            prev_match = x.m;
        }
        memmove(v->v, v->v + w, (v->n - w) * sizeof *v->v);
        o = v->n - w;
        break;
    }
    case SB_CONTIGUOUS: /* runs of delimiters (and runs of non-delimiters) join */
        for (size_t i = 0; i < v->n; i++) {
            span_t x = v->v[i];
            if (o && x.m == prev_match) v->v[o - 1].e = x.e;
            else v->v[o++] = x;
            prev_match = x.m;
        }
        break;
    }
    v->n = o;
}

static int run_steps(enc *c, int k, const char *p, size_t n) {
    if (!n) return 0;
    const kiln_bpe *b = c->b;
    if (k == b->n_steps) return bpe_piece(c, p, n);
    const bpe_step *st = &b->steps[k];
    if (st->type == PT_BYTELEVEL) {
        if (st->add_prefix_space && p[0] != ' ') {
            if (n + 1 > c->tmpcap[k]) {
                size_t nc = (n + 1) * 2;
                char *nt = realloc(c->tmp[k], nc);
                if (!nt) return enc_oom(c);
                c->tmp[k] = nt;
                c->tmpcap[k] = nc;
            }
            c->tmp[k][0] = ' ';
            memcpy(c->tmp[k] + 1, p, n);
            p = c->tmp[k];
            n++;
        }
        if (st->rx < 0) return run_steps(c, k + 1, p, n);
    }
    span_vec *v = &c->lv[k];
    if (find_spans(c, &b->rx[st->rx], p, n, v)) return -1;
    apply_behavior(v, st->behavior, st->invert);
    for (size_t i = 0; i < v->n; i++) {
        span_t x = v->v[i]; /* copy: deeper levels use their own vectors, this one stays put */
        if (run_steps(c, k + 1, p + x.s, x.e - x.s)) return -1;
    }
    return 0;
}

/* ICU normalization of UTF-8 text; *out is malloc'ed. */
static int icu_normalize(enc *c, int type, const char *p, size_t n, char **out, size_t *outn) {
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2 *nz = type == NM_NFC ? unorm2_getNFCInstance(&err)
                           : type == NM_NFD ? unorm2_getNFDInstance(&err)
                           : type == NM_NFKC ? unorm2_getNFKCInstance(&err)
                           : unorm2_getNFKDInstance(&err);
    if (U_FAILURE(err) || n > INT32_MAX / 4) goto fail;
    int32_t ulen = 0;
    UChar *u = malloc((n + 1) * sizeof *u);
    if (!u) return enc_oom(c);
    u_strFromUTF8(u, (int32_t)n + 1, &ulen, p, (int32_t)n, &err);
    if (U_FAILURE(err)) { free(u); goto fail; }
    if (unorm2_isNormalized(nz, u, ulen, &err) && U_SUCCESS(err)) {
        free(u);
        *out = NULL; /* unchanged */
        return 0;
    }
    err = U_ZERO_ERROR;
    int32_t cap = ulen * 2 + 16, nl = 0;
    UChar *w = NULL;
    for (int tries = 0; tries < 2; tries++) { /* second try with the preflighted length */
        free(w);
        w = malloc((size_t)cap * sizeof *w);
        if (!w) { free(u); return enc_oom(c); }
        err = U_ZERO_ERROR;
        nl = unorm2_normalize(nz, u, ulen, w, cap, &err);
        if (err != U_BUFFER_OVERFLOW_ERROR) break;
        cap = nl + 1;
    }
    free(u);
    if (U_FAILURE(err)) { free(w); goto fail; }
    int32_t blen = 0;
    char *o = malloc((size_t)nl * 3 + 1);
    if (!o) { free(w); return enc_oom(c); }
    u_strToUTF8(o, nl * 3 + 1, &blen, w, nl, &err);
    free(w);
    if (U_FAILURE(err)) { free(o); goto fail; }
    *out = o;
    *outn = (size_t)blen;
    return 0;
fail:
    c->st = kiln_fail(KILN_ERR_INTERNAL, "%s: ICU normalization failed: %s", c->b->name, u_errorName(err));
    return -1;
}

static int apply_norm(enc *c, const bpe_norm *nm, const char *p, size_t n, char **out, size_t *outn) {
    *out = NULL;
    switch (nm->type) {
    case NM_NFC: case NM_NFD: case NM_NFKC: case NM_NFKD: {
        size_t i = 0;
        while (i < n && (unsigned char)p[i] < 0x80) i++;
        if (i == n) return 0; /* ASCII is invariant under every normalization form */
        return icu_normalize(c, nm->type, p, n, out, outn);
    }
    case NM_PREPEND: {
        size_t pl = strlen(nm->content);
        char *o = malloc(n + pl + 1);
        if (!o) return enc_oom(c);
        memcpy(o, nm->content, pl);
        memcpy(o + pl, p, n);
        *out = o;
        *outn = n + pl;
        return 0;
    }
    case NM_REPLACE: {
        const bpe_regex *rx = &c->b->rx[nm->rx];
        PCRE2_SIZE cap = n * 2 + 64;
        for (int tries = 0; tries < 2; tries++) {
            char *o = malloc(cap + 1);
            if (!o) return enc_oom(c);
            PCRE2_SIZE ol = cap;
            int rc = pcre2_substitute(rx->code, (PCRE2_SPTR)p, n, 0,
                                      PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL |
                                      PCRE2_SUBSTITUTE_OVERFLOW_LENGTH | PCRE2_NO_UTF_CHECK,
                                      NULL, c->mctx, (PCRE2_SPTR)nm->content, strlen(nm->content),
                                      (PCRE2_UCHAR *)o, &ol);
            if (rc >= 0) { *out = o; *outn = ol; return 0; }
            free(o);
            if (rc != PCRE2_ERROR_NOMEMORY) break;
            cap = ol;
        }
        c->st = kiln_fail(KILN_ERR_INTERNAL, "%s: Replace normalizer failed", c->b->name);
        return -1;
    }
    case NM_LOWER: {
        UErrorCode err = U_ZERO_ERROR;
        int32_t ulen = 0;
        UChar *u = malloc((n + 1) * sizeof *u), *w = malloc((n * 3 + 16) * sizeof *w);
        char *o = malloc(n * 9 + 48);
        if (!u || !w || !o) { free(u); free(w); free(o); return enc_oom(c); }
        u_strFromUTF8(u, (int32_t)n + 1, &ulen, p, (int32_t)n, &err);
        int32_t wl = u_strToLower(w, (int32_t)n * 3 + 16, u, ulen, "", &err);
        int32_t bl = 0;
        u_strToUTF8(o, (int32_t)n * 9 + 48, &bl, w, wl, &err);
        free(u); free(w);
        if (U_FAILURE(err)) {
            free(o);
            c->st = kiln_fail(KILN_ERR_INTERNAL, "%s: Lowercase normalizer failed", c->b->name);
            return -1;
        }
        *out = o;
        *outn = (size_t)bl;
        return 0;
    }
    }
    return 0;
}

/* A stretch of text between added tokens: normalize, pre-tokenize, merge. */
static int encode_text(enc *c, const char *p, size_t n) {
    if (!n) return 0;
    char *owned = NULL;
    for (int i = 0; i < c->b->n_norms; i++) {
        char *o;
        size_t on = 0;
        if (apply_norm(c, &c->b->norms[i], p, n, &o, &on)) { free(owned); return -1; }
        if (o) { free(owned); owned = o; p = o; n = on; }
    }
    int rc = run_steps(c, 0, p, n);
    free(owned);
    return rc;
}

/* Is the code point before/after a word character (for single_word added tokens)? */
static int word_char_before(const char *t, size_t s) {
    if (!s) return 0;
    size_t i = s - 1;
    while (i > 0 && ((unsigned char)t[i] & 0xC0) == 0x80) i--;
    uint32_t cp;
    utf8_next(t + i, s - i, &cp);
    return u_isalnum((UChar32)cp) || cp == '_';
}
static int word_char_at(const char *t, size_t n, size_t e) {
    if (e >= n) return 0;
    uint32_t cp;
    utf8_next(t + e, n - e, &cp);
    return u_isalnum((UChar32)cp) || cp == '_';
}

/* Next added token at or after `from` (leftmost, then longest): its span [*s, *e) (widened by
 * lstrip/rstrip, never before `from`) and id. Returns 0 when none. */
static int next_added(const kiln_bpe *b, const char *t, size_t n, size_t from, int parse_special,
                      size_t *s, size_t *e, int32_t *id) {
    if (!b->trie) return 0;
    for (size_t i = from; i < n; i++) {
        if (!b->first_byte[(uint8_t)t[i]]) continue;
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            node = trie_child(b, node, (uint8_t)t[j]);
            if (node < 0) break;
            int32_t a = b->trie[node].added;
            if (a >= 0 && (parse_special || !b->added[a].special)) {
                const bpe_added *ad = &b->added[a];
                if (ad->single_word && (word_char_before(t, i) || word_char_at(t, n, j + 1))) continue;
                best = a;
                best_end = j + 1;
            }
        }
        if (best < 0) continue;
        const bpe_added *ad = &b->added[best];
        size_t ms = i, me = best_end;
        if (ad->lstrip)
            while (ms > from) {
                size_t k = ms - 1;
                while (k > from && ((unsigned char)t[k] & 0xC0) == 0x80) k--;
                uint32_t cp;
                utf8_next(t + k, ms - k, &cp);
                if (!is_white(cp)) break;
                ms = k;
            }
        if (ad->rstrip)
            while (me < n) {
                uint32_t cp;
                int l = utf8_next(t + me, n - me, &cp);
                if (!is_white(cp)) break;
                me += (size_t)l;
            }
        *s = ms;
        *e = me;
        *id = ad->id;
        return 1;
    }
    return 0;
}

kiln_status kiln_bpe_encode(const kiln_bpe *b, const char *text, size_t len, int parse_special,
                            int32_t **ids, size_t *n) {
    if (ids) *ids = NULL;
    if (n) *n = 0;
    if (!b || !ids || !n || (!text && len))
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_bpe_encode: NULL argument");
    size_t bad = kiln_utf8_validate(text, len);
    if (bad < len)
        return kiln_fail(KILN_ERR_INVALID_ARG, "text: invalid UTF-8 at byte offset %zu (byte 0x%02x)",
                         bad, (unsigned char)text[bad]);
    if (!len) return KILN_OK;
    enc c;
    memset(&c, 0, sizeof c);
    c.b = b;
    c.md = pcre2_match_data_create(1, NULL);
    c.mctx = pcre2_match_context_create(NULL);
    /* backtracking-heavy patterns on long pieces need more than the 32 KiB default JIT stack */
    c.jst = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    if (!c.md || !c.mctx || !c.jst) {
        enc_oom(&c);
        goto done;
    }
    pcre2_jit_stack_assign(c.mctx, NULL, c.jst);
    size_t pos = 0;
    while (pos < len) {
        size_t s = len, e = len;
        int32_t id = -1;
        int found = next_added(b, text, len, pos, parse_special, &s, &e, &id);
        if (encode_text(&c, text + pos, s - pos)) goto done;
        if (!found) break;
        if (push_id(&c, id)) goto done;
        pos = e;
    }
done:
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jst);
    for (int i = 0; i < BPE_MAX_STEPS; i++) { free(c.lv[i].v); free(c.tmp[i]); }
    free(c.sym); free(c.prv); free(c.nxt); free(c.heap);
    free(c.wc); free(c.wkeys); free(c.wids);
    if (c.st != KILN_OK) { free(c.out); return c.st; }
    *ids = c.out;
    *n = c.n;
    return KILN_OK;
}

/* ================================================================================================
 * Decoding and accessors
 * ============================================================================================== */
const char *kiln_bpe_decode_piece(const kiln_bpe *b, int32_t id, size_t *len) {
    if (len) *len = 0;
    if (!b || id < 0 || id >= b->n_vocab || !(b->flags[id] & BPE_F_PRESENT)) return NULL;
    if (len) *len = b->pc_len[id];
    return b->pool + b->pc_off[id];
}

const char *kiln_bpe_token_str(const kiln_bpe *b, int32_t id) {
    if (!b || id < 0 || id >= b->n_vocab || !(b->flags[id] & BPE_F_PRESENT)) return NULL;
    return b->pool + b->str_off[id];
}

kiln_status kiln_bpe_decode(const kiln_bpe *b, const int32_t *ids, size_t n, int skip_special,
                            char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    size_t cap = 64, o = 0;
    char *buf = malloc(cap);
    if (!buf) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_utf8_stream s;
    kiln_utf8_stream_init(&s);
    for (size_t i = 0; i <= n; i++) {
        size_t pl = 0;
        const char *pc = NULL;
        if (i < n) {
            pc = kiln_bpe_decode_piece(b, ids[i], &pl);
            if (!pc) {
                free(buf);
                return kiln_fail(KILN_ERR_INVALID_ARG, "decode: ids[%zu] = %d is not a token of %s", i,
                                 (int)ids[i], b->name);
            }
            if (skip_special && kiln_bpe_is_special(b, ids[i])) continue;
        }
        size_t need = o + 3 * (pl + 4) + 1;
        if (need > cap) {
            while (cap < need) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
            buf = nb;
        }
        o += i < n ? kiln_utf8_stream_push(&s, pc, pl, buf + o) : kiln_utf8_stream_flush(&s, buf + o);
    }
    buf[o] = 0;
    *out = buf;
    if (len) *len = o;
    return KILN_OK;
}

int kiln_bpe_vocab_size(const kiln_bpe *b) { return b ? b->n_vocab : 0; }
int kiln_bpe_bos(const kiln_bpe *b) { return b ? b->bos : -1; }
int kiln_bpe_eos(const kiln_bpe *b) { return b ? b->eos : -1; }
int kiln_bpe_add_bos(const kiln_bpe *b) { return b && b->bos >= 0 && b->add_bos; }
int kiln_bpe_add_eos(const kiln_bpe *b) { return b && b->eos >= 0 && b->add_eos; }
int kiln_bpe_is_special(const kiln_bpe *b, int32_t id) {
    return b && id >= 0 && id < b->n_vocab && (b->flags[id] & BPE_F_SPECIAL);
}
const char *kiln_bpe_chat_template(const kiln_bpe *b) { return b ? b->chat_template : NULL; }
const char *kiln_bpe_bos_str(const kiln_bpe *b) {
    if (!b) return NULL;
    return b->bos_str ? b->bos_str : kiln_bpe_token_str(b, b->bos);
}
const char *kiln_bpe_eos_str(const kiln_bpe *b) {
    if (!b) return NULL;
    return b->eos_str ? b->eos_str : kiln_bpe_token_str(b, b->eos);
}
