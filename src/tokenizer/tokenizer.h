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
/* A tiktoken rank file (Kimi K2's tiktoken.model) + the tokenizer_config.json listing its special
 * tokens (added_tokens_decoder), bos/eos and chat template. */
kiln_status kiln_tok_load_tiktoken(const char *tiktoken_model, const char *tokenizer_config,
                                   kiln_tokenizer **out);
/* Any tokenizer file or directory: a directory with tokenizer.json / tiktoken.model /
 * tokenizer.bin; a tokenizer.json or tokenizer_config.json (the vocabulary beside it is used);
 * a .gguf; a llama2.c .bin; otherwise a tiktoken rank file. tokenizer_config.json beside the file
 * is used when present. */
kiln_status kiln_tok_load_path(const char *path, kiln_tokenizer **out);
void kiln_tok_free(kiln_tokenizer *t);

int kiln_tok_vocab_size(const kiln_tokenizer *t);
int kiln_tok_bos(const kiln_tokenizer *t); /* -1 if none */
int kiln_tok_eos(const kiln_tokenizer *t); /* -1 if none */

/* Encodes text. *ids is malloc'ed (caller frees), *n its length. add_bos = "add the special
 * tokens the tokenizer adds by default" (Hugging Face add_special_tokens=True): SentencePiece
 * vocabularies prepend BOS when they have one; byte-level BPE ones only when their configuration
 * says so (tokenizer_config.json add_bos_token / GGUF add_bos_token / a TemplateProcessing
 * post-processor: DeepSeek yes, Qwen / GPT-2 no). A rendered chat prompt already holds its BOS
 * text: encode it with add_bos = 0.
 * Special tokens written in the text (e.g. "<|im_start|>" in a rendered chat template) are
 * matched as those tokens, as Hugging Face does by default: text from trusted prompts. */
kiln_status kiln_tok_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos,
                            int32_t **ids, size_t *n);
/* The same with parse_special = 0 for untrusted text (a user's message): special tokens written in
 * it are encoded as plain text, so the text cannot forge control tokens. (llama2.c SentencePiece
 * files never match special tokens in text; GGUF / Hugging Face ones follow llama.cpp: spm.c.) */
kiln_status kiln_tok_encode_ex(const kiln_tokenizer *t, const char *text, size_t len, int add_bos,
                               int parse_special, int32_t **ids, size_t *n);
/* 1 for special / control tokens (<|im_end|>, <s>). */
int kiln_tok_is_special(const kiln_tokenizer *t, int32_t id);
/* The chat template that came with the vocabulary (tokenizer_config.json chat_template, GGUF
 * tokenizer.chat_template), NULL if none known (llama2.c vocabularies have none). */
const char *kiln_tok_chat_template(const kiln_tokenizer *t);
/* The BOS (eos = 0) / EOS (eos = 1) token's text, NULL if none. */
const char *kiln_tok_special_str(const kiln_tokenizer *t, int eos);
/* Bytes of `id` when it follows `prev` (SentencePiece drops the leading space of the first piece
 * after BOS; <0xNN> pieces become that byte; byte-level BPE pieces are their raw bytes, which may
 * end inside a UTF-8 character: see kiln_utf8_stream in tokenizer/bpe.h; special tokens of BPE
 * vocabularies are their text). NULL for an out-of-range id, "" for an unused id in range. */
const char *kiln_tok_piece(const kiln_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The stored piece string of id (as in the vocabulary), NULL for out of range. */
const char *kiln_tok_raw_piece(const kiln_tokenizer *t, int32_t id);

/* Writes the tokenizer files of a Hugging Face directory (tokenizer.json, tokenizer_config.json)
 * that kiln_tok_load_hf reads back to the same tokenizer, plus (for SentencePiece vocabularies)
 * tokenizer.bin in llama2.c format. BPE vocabularies loaded from files copy them (tokenizer.json or
 * tiktoken.model, tokenizer_config.json, chat_template.jinja); GGUF ones are written out. */
kiln_status kiln_tok_save_hf(const kiln_tokenizer *t, const char *dir);
/* Adds the tokenizer.ggml.* metadata to a GGUF being written. */
struct kiln_gguf_writer;
void kiln_tok_save_gguf(const kiln_tokenizer *t, struct kiln_gguf_writer *w);
#endif
