/* kv_setup.h — building a KV pool configuration for a model (internal): the layout from the
 * model's hyper-parameters, the budget, and the FP8 scales with their source.
 *
 * Scale sources for FP8 with static scales, first match wins:
 *   1. opts->kv_scales_path (an explicit kv_scales.json);
 *   2. the checkpoint's model.layers.N.self_attn.k_scale / v_scale tensors;
 *   3. kv_scales.json beside the model (written by `kiln calibrate`);
 *   4. a built-in calibration pass: KILN_KV_CALIB_TOKENS tokens of a fixed English text (or, for a
 *      model without a tokenizer, a fixed pseudo-random token sequence) through the model with an
 *      F32 cache; scale = max(amax, 1e-6) × KILN_KV_MARGIN / 448 per (layer, KV head).
 * Calibrated sources (3, 4) also give K smoothing means (kv.h) unless V shares the K row (MLA);
 * checkpoint scales follow the vLLM convention exactly (no means).
 * Never a silent 1.0. Any bad input found on the way is an error (no fall-through). */
#ifndef KILN_ENGINE_KV_SETUP_H
#define KILN_ENGINE_KV_SETUP_H
#include "kv/kv.h"

struct kiln_model;

#define KILN_KV_MARGIN 2.0f
#define KILN_KV_CALIB_TOKENS 256

typedef struct kiln_kv_setup {
    kiln_kv_config cfg;       /* ready for kiln_kv_pool_create (k_scale / v_scale point below) */
    float *k_scale, *v_scale; /* owned; NULL unless FP8 static with scales resolved */
    float *k_mean;            /* owned K smoothing means, or NULL */
    char source[512];         /* human-readable scale source */
    int calib_tokens;         /* tokens the built-in calibration ran (0 = none) */
    int budget_capped;        /* the default budget was cut to a quarter of available memory */
    int dsa_fp8_asked;        /* DSA model with --kv-dtype fp8: the compact FP8 rows, rope part bf16 */
} kiln_kv_setup;

/* The pool dtype for kv_dtype `asked` (AUTO resolved from the model); on DSA models fp8 means the
 * compact rows with a bf16 rope part (*dsa_fp8 = 1; docs/DSA.md). */
kiln_kv_dtype kiln_kv_pool_dtype(const struct kiln_model *m, kiln_kv_dtype asked, int *dsa_fp8);
/* n_layers, n_kv_heads, k_dim = head_dim, v_dim = kv_v_dim (0 → head_dim), v_shares_k, and the
 * DSA compact row's parts. */
void kiln_kv_layout_for_model(const struct kiln_model *m, kiln_kv_config *c);

/* The default budget (no --kv-mem): want_bytes, capped at a quarter of the memory available now
 * (sysconf _SC_AVPHYS_PAGES) so that a file claiming a huge context cannot make kiln reserve more
 * than the machine has; never below the pool's fixed bytes plus one page. Sets *capped. */
int64_t kiln_kv_default_budget(const kiln_kv_config *c, int64_t want_bytes, int *capped);

/* Everything but the pool: dtype resolved (AUTO → model), page size, budget (0 → n_ctx tokens'
 * worth of pages, through kiln_kv_default_budget), FP8 scales. run_calibration = 0 never runs the model (the source then says a
 * calibration would run at session start). */
kiln_status kiln_kv_setup_for_model(struct kiln_model *m, const kiln_options *o, int n_ctx, int run_calibration,
                                    kiln_kv_setup *out);
void kiln_kv_setup_free(kiln_kv_setup *s);
#endif
