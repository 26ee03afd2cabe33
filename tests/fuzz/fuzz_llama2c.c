/* fuzz_llama2c — a llama2.c checkpoint and the tokenizer.bin beside it: header, stacked weights,
 * the tokenizer's pieces and scores; then two tokens through the forward pass and the tokenizer
 * on a short text when it loads. Also the tokenizer.bin alone (kiln_tok_load_llama2c with every
 * entry in the file). Input: checkpoint FUZZ_SPLIT tokenizer.bin (no second part: no tokenizer). */
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part p[2];
    int n = fuzz_split(data, size, p, 2);
    fuzz_dir_file("model.bin", p[0].p, p[0].n, 1);
    fuzz_dir_file("tokenizer.bin", p[1].p, p[1].n, n > 1);
    kiln_options o;
    fuzz_options(&o);
    kiln_model *m = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/model.bin", fuzz_dir());
    if (fuzz_note("model_load", kiln_model_load(path, &o, &m)) == KILN_OK) {
        fuzz_exercise_model(m, &o);
        kiln_model_free(m);
    }
    if (n > 1) {
        kiln_tokenizer *t = NULL;
        if (fuzz_note("tokenizer", kiln_tok_load_llama2c(fuzz_memfd(0, p[1].p, p[1].n), 0, &t)) == KILN_OK) {
            static const char text[] = "Once upon a time \xe2\x80\x94 <0x41> \xf0\x9f\x98\x80";
            int32_t *ids = NULL;
            size_t k = 0;
            if (kiln_tokenizer_encode(t, text, sizeof text - 1, 1, 0, &ids, &k) == KILN_OK)
                for (size_t i = 0; i < k; i++) { size_t l; (void)kiln_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &l); }
            free(ids);
            kiln_tok_free(t);
        }
    }
    return 0;
}
