/* fuzz_gguf — a GGUF file: the reader (header, metadata, tensor infos), the tokenizer in its
 * metadata, then kiln_model_load (hyper-parameters, bind) and two tokens through the forward pass
 * when it loads. Input: the file's bytes. */
#include "fuzz_common.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfd(0, data, size);
    kiln_tensor_table tt = {0};
    kiln_gguf *g = NULL;
    if (fuzz_note("gguf_open", kiln_gguf_open(path, &tt, &g)) == KILN_OK) {
        for (int i = 0; i < kiln_gguf_n_kv(g); i++) {
            kiln_gguf_type ty;
            const char *k = kiln_gguf_key(g, i, &ty);
            uint64_t u; float f; const char *s; size_t l; kiln_gguf_type et; uint64_t n;
            (void)kiln_gguf_get_u64(g, k, &u);
            (void)kiln_gguf_get_f32(g, k, &f);
            (void)kiln_gguf_get_str(g, k, &s, &l);
            if (kiln_gguf_get_arr(g, k, &et, &n) == 0 && n > 0) {
                double d;
                (void)kiln_gguf_arr_str(g, k, n - 1, &s, &l);
                (void)kiln_gguf_arr_f64(g, k, n - 1, &d);
            }
        }
        kiln_tokenizer *tok = NULL;
        if (fuzz_note("tokenizer", kiln_tok_load_gguf(g, &tok)) == KILN_OK) kiln_tok_free(tok);
        kiln_gguf_close(g);
    }
    kiln_tt_free(&tt);
    kiln_options o;
    fuzz_options(&o);
    kiln_model *m = NULL;
    if (fuzz_note("model_load", kiln_model_load(path, &o, &m)) == KILN_OK) {
        fuzz_exercise_model(m, &o);
        kiln_model_free(m);
    }
    return 0;
}
