/* bpe.h — merge-rank BPE tokenizers: Hugging Face tokenizer.json (model.type "BPE", byte-level or
 * not), GGUF vocabularies with tokenizer.ggml.model "gpt2", and tiktoken rank files (Kimi K2's
 * tiktoken.model). A self-contained module: the tokenizer dispatch (tokenizer.c) wraps a kiln_bpe.
 *
 * Encoding pipeline (the Hugging Face `tokenizers` order):
 *   1. added/special tokens are matched first on the raw text (leftmost, then longest) and are
 *      never split; with parse_special = 0 only the non-special added tokens are matched and the
 *      special ones are encoded as plain text (llama.cpp's "user-defined" vs "control" tokens);
 *   2. each stretch of text between them is normalized (NFC/NFD/NFKC/NFKD via ICU, Replace,
 *      Prepend, Lowercase, Sequence);
 *   3. pre-tokenized: Split regexes (PCRE2, UTF + Unicode properties, JIT), ByteLevel (GPT-2 byte to
 *      unicode mapping, optional prefix space / GPT-2 regex), Digits, Whitespace, Sequence;
 *   4. each piece is merged by merge rank (a min-heap over adjacent pairs, pair -> rank hash map).
 * All text in and out is UTF-8; invalid UTF-8 input fails with KILN_ERR_INVALID_ARG and the byte
 * offset. A kiln_bpe is read-only after loading: encode may run on several threads at once. */
#ifndef KILN_TOKENIZER_BPE_H
#define KILN_TOKENIZER_BPE_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_bpe kiln_bpe;
struct kiln_gguf;

/* ---- loading ---------------------------------------------------------------------------------- */
/* A Hugging Face tokenizer.json, plus tokenizer_config.json (may be NULL) for bos_token / eos_token
 * / add_bos_token / add_eos_token / chat_template. */
kiln_status kiln_bpe_load_hf_json(const char *tokenizer_json_path, const char *tokenizer_config_path,
                                  kiln_bpe **out);
/* The same from memory (config may be NULL); `name` is used in error messages. */
kiln_status kiln_bpe_load_hf_json_buf(const char *json, size_t len, const char *config_json,
                                      size_t config_len, const char *name, kiln_bpe **out);

/* GGUF metadata with tokenizer.ggml.model == "gpt2": tokens, token_type (3 = control -> special
 * added token, 4 = user-defined -> non-special added token), merges, bos/eos ids, add_bos_token,
 * chat_template, and tokenizer.ggml.pre naming the pre-tokenizer regexes of the original
 * tokenizer.json (gpt-2/default, llama3/llama-bpe, qwen2, deepseek-llm, deepseek-coder, deepseek-v3,
 * chatglm-bpe/glm4, kimi-k2, ...). Lives in bpe_gguf.c. */
kiln_status kiln_bpe_load_gguf(const struct kiln_gguf *g, kiln_bpe **out);

/* An added token for the tiktoken loader (content is raw UTF-8 text). */
typedef struct kiln_bpe_added {
    const char *content;
    int32_t id;
    int special;
} kiln_bpe_added;

/* Kimi K2's split pattern (tokenization_kimi.py), rewritten for PCRE2: the `[A&&[^\p{Han}]]` class
 * intersections become classes of the complementary general categories. */
extern const char *const KILN_BPE_PATTERN_KIMI_K2;
/* The cl100k / o200k-era GPT-4 pattern family used by llama3, GLM-4 (chatglm-bpe). */
extern const char *const KILN_BPE_PATTERN_LLAMA3;
/* The original GPT-2 pattern (r50k / p50k tiktoken encodings; ByteLevel use_regex). */
extern const char *const KILN_BPE_PATTERN_GPT2;

/* A tiktoken file: one "base64(token bytes) rank" per line; ranks are the token ids and merge
 * priorities (tiktoken's algorithm: repeatedly join the adjacent pair whose concatenation has the
 * lowest rank; a whole piece found in the vocabulary is taken as is). pattern: the split regex
 * (PCRE2 syntax; NULL = KILN_BPE_PATTERN_KIMI_K2). added: special / added tokens (may be NULL). */
kiln_status kiln_bpe_load_tiktoken(const char *path, const char *pattern, const kiln_bpe_added *added,
                                   size_t n_added, kiln_bpe **out);
/* tiktoken file + a tokenizer_config.json whose added_tokens_decoder ({"163584": {"content":
 * "[BOS]", "special": true}, ...}) lists the added tokens, and whose bos_token / eos_token /
 * chat_template are used as for kiln_bpe_load_hf_json (Kimi K2's layout). */
kiln_status kiln_bpe_load_tiktoken_config(const char *tiktoken_path, const char *tokenizer_config_path,
                                          const char *pattern, kiln_bpe **out);
void kiln_bpe_free(kiln_bpe *b);

/* ---- saving ----------------------------------------------------------------------------------- */
/* Writes dir/tokenizer.json (model, merges, added tokens, normalizer, pre-tokenizer) and
 * dir/tokenizer_config.json (bos/eos, add_bos/add_eos, chat_template) describing this tokenizer,
 * which kiln_bpe_load_hf_json reads back to the same encoder. Not for tiktoken vocabularies (copy
 * their files instead): KILN_ERR_UNSUPPORTED. */
kiln_status kiln_bpe_save_hf(const kiln_bpe *b, const char *dir);
/* Adds tokenizer.ggml.* keys (model "gpt2", tokens, token_type, merges, bos/eos, add_bos/add_eos,
 * chat_template; tokenizer.ggml.pre when it was loaded from a GGUF) and tokenizer.kiln.pipeline
 * (the tokenizer.json normalizer + pre-tokenizer as JSON text, which kiln_bpe_load_gguf prefers
 * over tokenizer.ggml.pre). Byte-level vocabularies only (KILN_ERR_UNSUPPORTED otherwise, nothing
 * written). In bpe_gguf.c. */
struct kiln_gguf_writer;
kiln_status kiln_bpe_save_gguf(const kiln_bpe *b, struct kiln_gguf_writer *w);

/* ---- encoding / decoding ---------------------------------------------------------------------- */
/* Encodes text (no BOS/EOS is added: see kiln_bpe_add_bos). *ids is malloc'ed (caller frees; NULL
 * with *n = 0 for empty text). parse_special: match special tokens written in the text. */
kiln_status kiln_bpe_encode(const kiln_bpe *b, const char *text, size_t len, int parse_special,
                            int32_t **ids, size_t *n);
/* The raw bytes of token id (byte-level decoded; added tokens as written; <0xNN> byte-fallback
 * tokens as that byte). NULL for an id that is out of range or unused. */
const char *kiln_bpe_decode_piece(const kiln_bpe *b, int32_t id, size_t *len);
/* The token as stored in the vocabulary ("Ġthe", "<|im_end|>"), NUL-terminated; NULL if unused. */
const char *kiln_bpe_token_str(const kiln_bpe *b, int32_t id);
/* The id of a token by its raw content (added tokens first, then the vocabulary), -1 if none. */
int32_t kiln_bpe_token_id(const kiln_bpe *b, const char *content, size_t len);
/* Decodes ids into one malloc'ed NUL-terminated string (skip_special drops special tokens). Bytes
 * that do not form valid UTF-8 are replaced by U+FFFD, as the streaming decoder does. */
kiln_status kiln_bpe_decode(const kiln_bpe *b, const int32_t *ids, size_t n, int skip_special,
                            char **out, size_t *len);

int kiln_bpe_vocab_size(const kiln_bpe *b);   /* highest id + 1 */
int kiln_bpe_bos(const kiln_bpe *b);          /* -1 if none */
int kiln_bpe_eos(const kiln_bpe *b);          /* -1 if none */
int kiln_bpe_add_bos(const kiln_bpe *b);      /* prepend BOS by default (config / post-processor) */
int kiln_bpe_add_eos(const kiln_bpe *b);
int kiln_bpe_is_special(const kiln_bpe *b, int32_t id); /* special added / control token */
/* tokenizer_config.json chat_template (the "default" one when a list) or GGUF
 * tokenizer.chat_template; NULL if none. Owned by the kiln_bpe. */
const char *kiln_bpe_chat_template(const kiln_bpe *b);
/* A parsed tokenizer_config.json's chat_template: the string, or from a list of {"name",
 * "template"} entries the one named "default" (else the first); NULL if none. Points into cfg.
 * Shared with the SentencePiece loader (spm.c). */
struct json_t;
const char *kiln_bpe_config_chat_template(struct json_t *cfg);
/* The bos_token / eos_token strings (for rendering chat templates); NULL if none. */
const char *kiln_bpe_bos_str(const kiln_bpe *b);
const char *kiln_bpe_eos_str(const kiln_bpe *b);

/* ---- streaming detokenization ----------------------------------------------------------------- */
/* Feeds token bytes in, gets only complete UTF-8 characters out: the incomplete tail of a multi-byte
 * sequence is held back until the next push; bytes that can never become valid UTF-8 come out as
 * U+FFFD (EF BF BD), one per maximal invalid subpart, as Python's bytes.decode(errors="replace"). */
typedef struct kiln_utf8_stream {
    unsigned char pend[4];
    int npend;
} kiln_utf8_stream;
void kiln_utf8_stream_init(kiln_utf8_stream *s);
/* out must have room for 3 * (n + 4) bytes; returns the number of bytes written. */
size_t kiln_utf8_stream_push(kiln_utf8_stream *s, const char *in, size_t n, char *out);
/* End of stream: a held-back incomplete sequence becomes U+FFFD. out: room for 3 bytes. */
size_t kiln_utf8_stream_flush(kiln_utf8_stream *s, char *out);

/* Checks that s[0..len) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
 * Returns len when valid, else the byte offset of the first bad sequence. */
size_t kiln_utf8_validate(const char *s, size_t len);
#endif
