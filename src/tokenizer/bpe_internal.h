/* bpe_internal.h — the kiln_bpe structure and its builder, shared by bpe.c (tokenizer.json,
 * tiktoken, encoding) and bpe_gguf.c (GGUF metadata). Not for other modules: use bpe.h. */
#ifndef KILN_TOKENIZER_BPE_INTERNAL_H
#define KILN_TOKENIZER_BPE_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "tokenizer/bpe.h"

/* token flags */
enum { BPE_F_PRESENT = 1, BPE_F_VOCAB = 2, BPE_F_ADDED = 4, BPE_F_SPECIAL = 8 };
/* how a vocabulary string is turned into the bytes the model merges */
enum { BPE_TOK_BYTELEVEL = 0, /* GPT-2 byte-to-unicode encoded ("Ġthe") */
       BPE_TOK_RAW = 1 };     /* the string is the bytes (tiktoken, non-byte-level BPE) */

/* pre-tokenizer steps */
enum { PT_SPLIT, PT_BYTELEVEL, PT_DIGITS };
enum { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };
typedef struct bpe_regex {
    pcre2_code *code;
    int jit;     /* JIT-compiled: use pcre2_jit_match */
    char *src;   /* the pattern as given (kept for saving the pipeline) */
    size_t src_len;
    int literal; /* a {"String": ...} pattern */
} bpe_regex;
typedef struct bpe_step {
    int type;
    int behavior, invert;   /* PT_SPLIT / PT_DIGITS */
    int add_prefix_space;   /* PT_BYTELEVEL */
    int rx;                 /* index into kiln_bpe.rx, -1 when none */
} bpe_step;

/* normalizers */
enum { NM_NFC, NM_NFD, NM_NFKC, NM_NFKD, NM_REPLACE, NM_PREPEND, NM_LOWER };
typedef struct bpe_norm {
    int type;
    int rx;            /* NM_REPLACE: pattern */
    char *content;     /* NM_REPLACE: replacement; NM_PREPEND: prefix */
} bpe_norm;

typedef struct bpe_added {
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word;
} bpe_added;
typedef struct bpe_trie_node {
    int32_t child, sibling; /* first child / next sibling node index, -1 = none */
    int32_t added;          /* index into kiln_bpe.added, -1 = no token ends here */
    uint8_t byte;
} bpe_trie_node;

#define BPE_MAX_STEPS 16

struct kiln_bpe {
    char *name; /* source file, for messages */
    int32_t n_vocab, cap;
    uint32_t *mdl_off, *mdl_len; /* bytes the model merges (vocab key) */
    uint32_t *pc_off, *pc_len;   /* decoded bytes */
    uint32_t *str_off;           /* stored string, NUL-terminated */
    uint8_t *flags;
    char *pool;
    size_t pool_len, pool_cap;
    /* model-bytes -> id over BPE_F_VOCAB tokens (open addressing, id + 1, 0 = empty) */
    int32_t *vmap;
    uint32_t vmap_mask;
    /* (left id, right id) -> rank, merged id */
    uint64_t *pkeys;
    int32_t *prank, *pmerged;
    uint32_t pmap_mask, pmap_n;
    int32_t byte_id[256]; /* byte-level: the token of each single byte */
    int byte_level, ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;
    int32_t byte_tok[256]; /* byte_fallback: <0xNN> tokens, -1 if absent */
    /* added tokens */
    bpe_added *added;
    size_t n_added, added_cap;
    bpe_trie_node *trie;
    size_t n_trie, trie_cap;
    uint8_t first_byte[256]; /* 1 when some added token starts with this byte */
    /* pipeline */
    bpe_norm norms[BPE_MAX_STEPS];
    int n_norms;
    bpe_step steps[BPE_MAX_STEPS];
    int n_steps;
    bpe_regex rx[2 * BPE_MAX_STEPS];
    int n_rx;
    int tiktoken;  /* loaded from a tiktoken rank file (vocabulary strings are raw bytes) */
    char *pre_name; /* GGUF tokenizer.ggml.pre it was loaded with, NULL otherwise */
    /* configuration */
    int32_t bos, eos;
    int add_bos, add_eos;
    char *chat_template, *bos_str, *eos_str;
};

kiln_bpe *kiln_bpe__new(const char *name);
/* Registers token `id` with stored string s. kind: BPE_TOK_BYTELEVEL / BPE_TOK_RAW for vocabulary
 * tokens; added tokens use kiln_bpe__add_added (which may also name an id already in the vocab). */
kiln_status kiln_bpe__set_vocab(kiln_bpe *b, int32_t id, const char *s, size_t len, int kind,
                                const char *field);
kiln_status kiln_bpe__add_added(kiln_bpe *b, int32_t id, const char *s, size_t len, int special,
                                int lstrip, int rstrip, int single_word, const char *field);
/* Builds the vocabulary map; call after all kiln_bpe__set_vocab and before merges. */
kiln_status kiln_bpe__index_vocab(kiln_bpe *b);
/* One merge "left right" (vocabulary strings, GGUF / old tokenizer.json style) or as two parts. */
kiln_status kiln_bpe__add_merge(kiln_bpe *b, const char *l, size_t ll, const char *r, size_t rl,
                                int32_t rank, const char *field);
/* Compiles a regex (field names the source in messages); returns its index via *rx. */
kiln_status kiln_bpe__regex(kiln_bpe *b, const char *pattern, size_t len, int literal,
                            const char *field, int *rx);
kiln_status kiln_bpe__add_split(kiln_bpe *b, const char *pattern, int behavior, int invert,
                                const char *field);
kiln_status kiln_bpe__add_bytelevel(kiln_bpe *b, int add_prefix_space, int use_regex);
/* The Split sequence that llama.cpp associates with a GGUF tokenizer.ggml.pre name. */
kiln_status kiln_bpe__set_pre_by_name(kiln_bpe *b, const char *pre, const char *field);
/* Final checks (byte tokens, trie); call last. */
kiln_status kiln_bpe__finish(kiln_bpe *b);
char *kiln_bpe__strdup(const char *s, size_t len);
/* The normalizer and pre-tokenizer as tokenizer.json objects: {"normalizer": ..., "pre_tokenizer":
 * ...} (new reference; NULL on allocation failure). */
struct json_t;
struct json_t *kiln_bpe__pipeline_json(const kiln_bpe *b);
/* Builds the normalizer and pre-tokenizer from such an object (serialized), replacing the ones
 * set so far. field names the source in messages. */
/* The merges in rank order (malloc'ed, *n entries; NULL when out of memory). */
typedef struct { int32_t rank, l, r; } bpe_merge_t;
bpe_merge_t *kiln_bpe__merges_sorted(const kiln_bpe *b, size_t *n);
kiln_status kiln_bpe__parse_pipeline(kiln_bpe *b, const char *json, size_t len, const char *field);
#endif
