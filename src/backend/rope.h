/* rope.h — rotary position embeddings for every architecture (llama, GLM, DeepSeek/Kimi): plain RoPE over the
 * first rot_dim dims of a head (partial rotary), in either pair layout, and YaRN frequency
 * scaling with its attention factor (DeepSeek-V3 / Kimi K2 rope_scaling {"type": "yarn"}).
 *
 * Frequencies follow Hugging Face's float32 formulas exactly:
 *   plain:  inv_freq[i] = 1 / theta^(2i / rot_dim),  i < rot_dim/2
 *   YaRN:   inv_freq[i] = interp[i]·(1 - e[i]) + extrap[i]·e[i], extrap = plain, interp = plain / factor,
 *           e[i] = 1 - clamp((i - low) / (high - low), 0, 1), where [low, high] is the correction range
 *           floor/ceil(rot·ln(orig_ctx / (beta·2π)) / (2·ln theta)) for beta_fast / beta_slow,
 *           clamped to [0, rot - 1].
 *   cos/sin are multiplied by mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor,
 *   mscale_all_dim) (1 without YaRN); the softmax scale gets yarn_get_mscale(factor, mscale_all_dim)²
 *   (kiln_yarn_softmax_factor). */
#ifndef KILN_BACKEND_ROPE_H
#define KILN_BACKEND_ROPE_H
#include "kiln.h"

/* How RoPE pairs the dimensions of a head.
 *   NEOX: pairs (i, i + rot/2) — Hugging Face "rotate_half" (LlamaForCausalLM, GLM-4 HF, DeepSeek).
 *   NORM: pairs (2i, 2i + 1)    — llama2.c, GGUF llama (llama.cpp permutes Q/K on conversion), and
 *         GLM's original chatglm layout. */
typedef enum { KILN_ROPE_NEOX = 0, KILN_ROPE_NORM = 1 } kiln_rope_style;

typedef struct kiln_yarn {
    int enabled;
    float factor;          /* context extension factor (> 1) */
    int orig_ctx;          /* original_max_position_embeddings */
    float beta_fast, beta_slow;
    float mscale, mscale_all_dim; /* 0 = absent */
    float attention_factor;       /* explicit rope_scaling.attention_factor, 0 = derive */
} kiln_yarn;

#define KILN_ROPE_MAX_HALF 512
typedef struct kiln_rope {
    int rot_dim;                  /* rotated dims per head (even, <= 2·KILN_ROPE_MAX_HALF) */
    kiln_rope_style style;        /* NORM: pairs (2i, 2i+1); NEOX: pairs (i, i + rot/2) */
    float theta;
    float mscale;                 /* cos/sin multiplier */
    float inv_freq[KILN_ROPE_MAX_HALF];
} kiln_rope;

/* 0.1·m·ln(s) + 1 for s > 1, else 1 (DeepSeek's yarn_get_mscale). */
float kiln_yarn_get_mscale(float scale, float m);
/* Softmax-scale multiplier of MLA under YaRN: get_mscale(factor, mscale_all_dim)² when mscale_all_dim
 * is set, else 1. */
float kiln_yarn_softmax_factor(const kiln_yarn *y);

kiln_status kiln_rope_init(kiln_rope *r, int rot_dim, float theta, kiln_rope_style style, const kiln_yarn *yarn);
/* cs[0 .. rot/2) = cos(pos·inv_freq)·mscale, cs[rot/2 .. rot) = sin(...)·mscale. */
void kiln_rope_table(const kiln_rope *r, int pos, float *cs);
/* Rotates the first rot_dim values of n_heads vectors that start at v + h·stride. */
void kiln_rope_apply(const kiln_rope *r, float *v, int n_heads, int stride, const float *cs);
#endif
