/* tokenizer.h — one interface over every tokenizer kind kiln reads:
 *   - SentencePiece-style BPE by piece scores (llama2.c tokenizer.bin; GGUF tokenizer.ggml.model
 *     "llama"), with byte fallback <0xNN> pieces;
 *   - byte-level BPE by merge rank (Hugging Face tokenizer.json; GGUF "gpt2"), pre-split by PCRE2
 *     regexes (added in tokenizer/bpe.c);
 *   - tiktoken vocabularies.
 * All text in and out is UTF-8; invalid UTF-8 input is rejected with KILN_ERR_INVALID_ARG. */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_tokenizer kiln_tokenizer;
struct kiln_gguf;

/* llama2.c tokenizer.bin: int32 max_token_length, then per piece: float32 score, int32 len, bytes.
 * vocab_size comes from the checkpoint header (<= 0: every entry in the file). BOS = 1, EOS = 2
 * (llama2.c convention). */
kiln_status kiln_tok_load_llama2c(const char *path, int vocab_size, kiln_tokenizer **out);
/* The tokenizer embedded in GGUF metadata (tokenizer.ggml.*). */
kiln_status kiln_tok_load_gguf(const struct kiln_gguf *g, kiln_tokenizer **out);
/* A Hugging Face tokenizer.json (+ tokenizer_config.json, may be NULL). */
kiln_status kiln_tok_load_hf(const char *tokenizer_json, const char *tokenizer_config,
                             kiln_tokenizer **out);
void kiln_tok_free(kiln_tokenizer *t);

int kiln_tok_vocab_size(const kiln_tokenizer *t);
int kiln_tok_bos(const kiln_tokenizer *t); /* -1 if none */
int kiln_tok_eos(const kiln_tokenizer *t); /* -1 if none */

/* Encodes text. *ids is malloc'ed (caller frees), *n its length. add_bos prepends BOS when the
 * tokenizer has one. */
kiln_status kiln_tok_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos,
                            int32_t **ids, size_t *n);
/* Bytes of `id` when it follows `prev` (SentencePiece drops the leading space of the first piece
 * after BOS; <0xNN> pieces become that byte). NULL for an out-of-range id. */
const char *kiln_tok_piece(const kiln_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The stored piece string of id (as in the vocabulary), NULL for out of range. */
const char *kiln_tok_raw_piece(const kiln_tokenizer *t, int32_t id);

/* Writes the tokenizer files of a Hugging Face directory (tokenizer.json, tokenizer_config.json)
 * that kiln_tok_load_hf reads back to the same tokenizer, plus (for SentencePiece vocabularies)
 * tokenizer.bin in llama2.c format. */
kiln_status kiln_tok_save_hf(const kiln_tokenizer *t, const char *dir);
/* Adds the tokenizer.ggml.* metadata to a GGUF being written. */
struct kiln_gguf_writer;
void kiln_tok_save_gguf(const kiln_tokenizer *t, struct kiln_gguf_writer *w);
#endif
