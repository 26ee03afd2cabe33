/* fuzz_hf — a Hugging Face directory: config.json (every architecture kiln knows reads its own
 * fields) + model.safetensors, loaded and bound by kiln_model_load, then two tokens through the
 * forward pass when it loads. Input: config.json FUZZ_SPLIT model.safetensors [FUZZ_SPLIT
 * generation_config.json] (the third part, when there is one, is the directory's generation
 * config: end ids and sampling defaults). */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part p[3];
    const int parts = fuzz_split(data, size, p, 3);
    fuzz_dir_file("config.json", p[0].p, p[0].n, 1);
    fuzz_dir_file("model.safetensors", p[1].p, p[1].n, 1);
    fuzz_dir_file("generation_config.json", p[2].p, p[2].n, parts == 3);
    kiln_options o;
    fuzz_options(&o);
    kiln_model *m = NULL;
    if (fuzz_note("model_load", kiln_model_load(fuzz_dir(), &o, &m)) == KILN_OK) {
        fuzz_exercise_model(m, &o);
        kiln_model_free(m);
    }
    return 0;
}
