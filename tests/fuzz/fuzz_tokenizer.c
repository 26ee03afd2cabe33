/* fuzz_tokenizer — a Hugging Face tokenizer.json (+ tokenizer_config.json) or, when the first part
 * does not start with '{', a tiktoken rank file (+ its tokenizer_config.json); then the text
 * encoded with special tokens as text and as tokens, and every id decoded back.
 * Input: tokenizer.json FUZZ_SPLIT tokenizer_config.json (empty: none) FUZZ_SPLIT text. */
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part p[3];
    fuzz_split(data, size, p, 3);
    const char *tj = fuzz_memfd(0, p[0].p, p[0].n);
    const char *tc = p[1].n ? fuzz_memfd(1, p[1].p, p[1].n) : NULL;
    size_t lead = 0;
    while (lead < p[0].n && (p[0].p[lead] == ' ' || p[0].p[lead] == '\n' || p[0].p[lead] == '\t' || p[0].p[lead] == '\r')) lead++;
    kiln_tokenizer *t = NULL;
    kiln_status st = lead < p[0].n && p[0].p[lead] == '{' ? kiln_tok_load_hf(tj, tc, &t) : kiln_tok_load_tiktoken(tj, tc, &t);
    if (fuzz_note("load", st) != KILN_OK) return 0;
    const int vocab = kiln_tokenizer_vocab_size(t);
    (void)kiln_tokenizer_bos(t);
    (void)kiln_tokenizer_eos(t);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (fuzz_note("encode", kiln_tokenizer_encode(t, (const char *)p[2].p, p[2].n, 1, special, &ids, &n)) == KILN_OK) {
            for (size_t i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= vocab) abort(); /* an id outside the vocabulary */
                size_t l;
                (void)kiln_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &l);
                (void)kiln_tokenizer_token(t, ids[i]);
                (void)kiln_tokenizer_is_special(t, ids[i]);
            }
        }
        free(ids);
    }
    for (int32_t id = -1; id <= vocab && id < 64; id++) { size_t l; (void)kiln_tokenizer_piece(t, -1, id, &l); }
    kiln_tok_free(t);
    return 0;
}
