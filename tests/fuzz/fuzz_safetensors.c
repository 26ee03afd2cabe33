/* fuzz_safetensors — a safetensors file parsed from memory (header length, JSON header, dtypes,
 * shapes, offsets, overlap). Input: the file's bytes. */
#include "fuzz_common.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_mapping map = {.path = (char *)"fuzz.safetensors", .base = data, .size = size};
    kiln_tensor_table tt = {0};
    if (fuzz_note("parse", kiln_safetensors_parse(&map, &tt)) == KILN_OK) {
        for (int i = 0; i < tt.n; i++) {
            const kiln_tensor *t = &tt.v[i];
            if (kiln_tt_find(&tt, t->name) != t) abort(); /* names are unique and indexed */
            if (t->nbytes && (t->data < data || t->data + t->nbytes > data + size)) abort();
            (void)kiln_tensor_numel(t);
        }
    }
    kiln_tt_free(&tt);
    return 0;
}
