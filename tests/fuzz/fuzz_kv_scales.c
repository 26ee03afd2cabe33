/* fuzz_kv_scales — kv_scales.json (`kiln calibrate`'s FP8 KV scales, docs/KV.md): the file read
 * against a model of 2 layers × 2 KV heads of head dim 4, once with separate V scales and once with
 * V sharing K's (MLA), k_mean asked for both times. Input: the file's bytes. Anything but a valid
 * file must come back as an error naming the file and field, never a crash, an out-of-bounds write
 * into the [layers × heads] / [layers × heads × dim] arrays, or a leak. */
#include "fuzz_common.h"
#include "kv/kv_scales.h"
#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    enum { L = 2, H = 2, D = 4 };
    const char *path = fuzz_memfd(0, data, size);
    for (int shares = 0; shares < 2; shares++) {
        float ks[L * H], vs[L * H], km[L * H * D];
        int has_mean = 0, prerope = 0;
        if (fuzz_note("kv_scales", kiln_kv_scales_read_json_mode(path, L, H, D, shares, ks, vs, km, &has_mean, &prerope)) == KILN_OK) {
            /* a file that loads: every scale positive and finite (kv_scales.h's validation) */
            for (int i = 0; i < L * H; i++)
                if (!(ks[i] > 0.0f && ks[i] < INFINITY) || (!shares && !(vs[i] > 0.0f && vs[i] < INFINITY))) abort();
            for (int i = 0; has_mean && i < L * H * D; i++)
                if (!isfinite(km[i])) abort();
        }
    }
    return 0;
}
