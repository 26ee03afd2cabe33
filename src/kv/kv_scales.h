/* kv_scales.h — FP8 KV scales: from checkpoint tensors and from kv_scales.json (internal).
 *
 * Scales are dequantization scales (value = fp8 × scale), per (layer, KV head), arrays
 * [n_layers × n_kv_heads] row-major by layer. */
#ifndef KILN_KV_SCALES_H
#define KILN_KV_SCALES_H
#include "kiln.h"
#include "format/tensor.h"
#include <stddef.h>

/* Checkpoint scales, the vLLM / SGLang convention: model.layers.N.self_attn.k_scale and .v_scale,
 * each a scalar ([] or [1], broadcast over heads) or [n_kv_heads]; F32, BF16 or F16. When
 * v_shares_k, only k_scale is needed (v_scale, if present, is ignored).
 * *found = 0 when no layer carries a k_scale; otherwise every layer must carry valid scales, or
 * the error names the missing / bad tensor. */
kiln_status kiln_kv_scales_from_checkpoint(const kiln_tensor_table *tt, const char *model_path, int n_layers, int n_kv_heads,
                                           int v_shares_k, float *k_scale, float *v_scale, int *found);

/* kv_scales.json (written by `kiln calibrate`, format in docs/KV.md):
 *   {"format": "kiln-kv-scales", "version": 1, "dtype": "fp8_e4m3",
 *    "num_layers": L, "num_kv_heads": H, "margin": 2.0, "tokens": N, "source": "...",
 *    "k_scale": [[H numbers] × L], "v_scale": [[H numbers] × L],
 *    "k_mean": [[[k_dim numbers] × H] × L]   (optional: K smoothing, see kv.h; k_scale then applies
 *                                              to K − k_mean)}
 * Validation: num_layers / num_kv_heads must equal the model's; each scale array has L rows of H
 * positive finite numbers, k_mean L × H rows of k_dim finite numbers; errors name the file and the
 * field (e.g. k_scale[3][1]). k_mean (when k_mean != NULL) is filled and *has_mean set when the file
 * has one. */
kiln_status kiln_kv_scales_read_json(const char *path, int n_layers, int n_kv_heads, int k_dim, int v_shares_k,
                                     float *k_scale, float *v_scale, float *k_mean, int *has_mean);
/* The same, also reporting the K smoothing mode: "k_smooth": "post" (or absent: files written before
 * the field) or "prerope" (k_mean is then the pre-RoPE mean, kv.h); *prerope = 1 for the latter. A
 * k_smooth without k_mean, or another value, is an error naming the field. */
kiln_status kiln_kv_scales_read_json_mode(const char *path, int n_layers, int n_kv_heads, int k_dim, int v_shares_k,
                                          float *k_scale, float *v_scale, float *k_mean, int *has_mean, int *prerope);
/* k_mean may be NULL (no smoothing). */
kiln_status kiln_kv_scales_write_json(const char *path, int n_layers, int n_kv_heads, int k_dim, const float *k_scale,
                                      const float *v_scale, const float *k_mean, float margin, const char *source,
                                      uint64_t n_tokens);
/* prerope = 1 records "k_smooth": "prerope" (k_mean then holds pre-RoPE means); 0 "post". */
kiln_status kiln_kv_scales_write_json_mode(const char *path, int n_layers, int n_kv_heads, int k_dim, const float *k_scale,
                                           const float *v_scale, const float *k_mean, float margin, const char *source,
                                           uint64_t n_tokens, int prerope);
#endif
