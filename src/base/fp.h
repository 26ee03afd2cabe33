/* fp.h — scalar conversions between float32 and the narrow float formats kiln stores:
 * BF16, IEEE FP16 and FP8 E4M3 (OCP "fn" variant: no infinities, 0x7F/0xFF are NaN, max 448).
 * These are the reference conversions every SIMD path is tested against. */
#ifndef KILN_BASE_FP_H
#define KILN_BASE_FP_H
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline float kiln_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t kiln_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float kiln_bf16_to_f32(uint16_t h) { return kiln_bits_to_f32((uint32_t)h << 16); }
/* Round-to-nearest-even; NaN stays a (quiet) NaN. */
static inline uint16_t kiln_f32_to_bf16(float f) {
    uint32_t u = kiln_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float kiln_f16_to_f32(uint16_t h);
uint16_t kiln_f32_to_f16(float f);

/* FP8 E4M3FN: bias 7, 3 mantissa bits, max finite 448. Decoding is a table lookup. */
extern float kiln_fp8_e4m3_table[256];
static inline float kiln_fp8_e4m3_to_f32(uint8_t v) { return kiln_fp8_e4m3_table[v]; }
/* Saturating (|x| > 448 → ±448), round-to-nearest-even, NaN → 0x7F (the only NaN code; callers that
 * must never produce NaN check their inputs). */
uint8_t kiln_f32_to_fp8_e4m3(float f);

/* The power-of-two scale of one block of FP8 values as DeepSeek-V3.2's act_quant sets it (kernel.py,
 * scale_fmt "ue8m0"): 2^ceil(log2(max(amax, 1e-4) × (1/448))), the ceil taken from the float's bits
 * as its fast_log2_ceil / fast_pow2 do (the exponent, plus one when any mantissa bit is set).
 * amax: the block's largest |x| (NaN-free). */
static inline float kiln_fp8_block_scale(float amax) {
    const float a = (amax > 1e-4f ? amax : 1e-4f) * (1.0f / 448.0f);
    const uint32_t bits = kiln_f32_to_bits(a);
    const int e = (int)((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0);
    return kiln_bits_to_f32((uint32_t)(e + 127) << 23); /* e in [-22, 120] for a finite amax: a normal float */
}

void kiln_fp_init(void); /* fills the tables; idempotent, called by kiln_model_load */
#endif
