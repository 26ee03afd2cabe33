/* tok_internal.h — the kiln_tokenizer object shared by every tokenizer kind.
 *
 * A tokenizer is a vocabulary (piece bytes, per-id token type and score, a piece -> id hash) plus a
 * kind. tokenizer.c owns the common parts (UTF-8 validation, piece lookup, decoding, dispatch);
 * each kind implements its encoder and its own loaders/savers:
 *   KILN_TOK_SPM  spm.c: SentencePiece-style BPE by piece score (llama2.c tokenizer.bin, GGUF
 *                 "llama", Hugging Face Llama tokenizer.json)
 *   KILN_TOK_BPE  bpe.c: byte-level BPE by merge rank (tokenizer.json, GGUF "gpt2"); it keeps its
 *                 private state behind `impl` and adds its cases to the switches in tokenizer.c. */
#ifndef KILN_TOK_INTERNAL_H
#define KILN_TOK_INTERNAL_H
#include "tokenizer/tokenizer.h"
#include <stdint.h>
#include <stddef.h>

typedef enum { KILN_TOK_SPM = 1, KILN_TOK_BPE = 2 } kiln_tok_kind;

/* Where an SPM vocabulary came from: decides the space symbol its pieces use and how the
 * llama2.c-specific quirks (BOS/EOS piece text) are handled when saving. */
typedef enum { KILN_TOK_SRC_LLAMA2C = 1, KILN_TOK_SRC_GGUF, KILN_TOK_SRC_HF } kiln_tok_source;

/* SentencePiece / llama.cpp token types (tokenizer.ggml.token_type values). */
enum {
    KILN_TT_NORMAL = 1, KILN_TT_UNKNOWN = 2, KILN_TT_CONTROL = 3, KILN_TT_USER_DEFINED = 4,
    KILN_TT_UNUSED = 5, KILN_TT_BYTE = 6
};

struct kiln_tokenizer {
    kiln_tok_kind kind;
    kiln_tok_source source;
    int n_vocab;
    char **piece;        /* raw piece bytes as stored (NUL-terminated; may hold other NULs) */
    uint32_t *piece_len;
    float *score;        /* SPM: merge priority (higher first) */
    int32_t *type;       /* KILN_TT_* */
    char **dec;          /* decoded bytes of each id (spaces restored, <0xNN> -> byte, control -> "") */
    uint32_t *dec_len;
    /* piece -> id (open addressing, size a power of two, -1 = empty) */
    int32_t *hash;
    uint32_t hash_mask;
    int bos, eos, unk, pad; /* -1 when absent */
    int add_bos;            /* tokenizer's default (HF add_bos_token / GGUF add_bos_token) */
    int add_space_prefix;   /* SPM: prepend the space symbol to non-empty text */
    /* SPM: the space symbol of the pieces: "▁" (U+2581, 3 bytes) or " " (llama2.c files) */
    const char *space;
    size_t space_len;
    int byte_id[256];       /* id of the <0xNN> piece per byte, -1 if absent */
    int max_token_length;   /* llama2.c header value (kept for exact re-export) */
    void *impl;             /* kind-private state (BPE: the kiln_bpe) */
    char *chat_template;    /* SPM: GGUF tokenizer.chat_template / tokenizer_config.json's (NULL: none;
                             * BPE keeps its own in impl) */
    int32_t *in_text;       /* SPM: the ids matched in text (kiln_spm_index_special), longest first */
    int n_in_text;
    /* BPE: the files it was loaded from, copied by kiln_tok_save_hf (NULL when absent):
     * [0] tokenizer.json or tiktoken.model, [1] tokenizer_config.json, [2] chat_template.jinja */
    char *src_file[3];
};

/* tokenizer.c */
kiln_tokenizer *kiln_tok_alloc(kiln_tok_kind kind, int n_vocab);
/* Sets piece i (copied). Returns non-zero on allocation failure. */
int kiln_tok_set_piece(kiln_tokenizer *t, int i, const char *s, size_t len);
/* Builds the hash, byte_id[] and decoded pieces once every piece/type is set. */
kiln_status kiln_tok_finish(kiln_tokenizer *t, const char *what);
int32_t kiln_tok_lookup(const kiln_tokenizer *t, const char *s, size_t len); /* -1 if absent */
/* UTF-8 validation: kiln_utf8_validate in tokenizer/bpe.h (returns the offset of the first bad
 * sequence, len when valid). */
/* Bytes in the UTF-8 sequence starting with lead byte c (1 for invalid leads). */
int kiln_utf8_len(unsigned char c);

/* spm.c */
/* parse_special: match control / unknown tokens written in the text (user-defined ones always);
 * llama2.c vocabularies match none (spm.c). */
kiln_status kiln_spm_encode(const kiln_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                            size_t *n);
/* Indexes the control / unknown / user-defined tokens that kiln_spm_encode matches in text (none
 * for llama2.c files); the loaders call it once the token types are final. */
kiln_status kiln_spm_index_special(kiln_tokenizer *t);
kiln_status kiln_spm_load_gguf(const struct kiln_gguf *g, kiln_tokenizer **out);
kiln_status kiln_spm_load_hf(const char *tokenizer_json, const char *tokenizer_config, void *json_root,
                             kiln_tokenizer **out);
kiln_status kiln_spm_save_hf(const kiln_tokenizer *t, const char *dir);
void kiln_spm_save_gguf(const kiln_tokenizer *t, struct kiln_gguf_writer *w);
#endif
