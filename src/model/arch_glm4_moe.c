/* arch_glm4_moe.c — GLM-4.5 / 4.6 / 4.7 (model_type "glm4_moe", Glm4MoeForCausalLM).
 *
 * Attention: GQA with q/k/v biases (attention_bias), optional per-head RMSNorm of q and k before
 * RoPE (use_qk_norm: self_attn.q_norm / k_norm [head_dim]), RoPE on the first
 * head_dim·partial_rotary_factor dims in the rotate_half layout (pairs (i, i + rot/2)).
 * Layers [0, first_k_dense_replace) have a dense SwiGLU MLP (mlp.{gate,up,down}_proj of
 * intermediate_size); the rest are MoE (mlp.gate [E, hidden] + mlp.gate.e_score_correction_bias,
 * mlp.experts.E.{gate,up,down}_proj of moe_intermediate_size, mlp.shared_experts.* of
 * moe_intermediate_size × n_shared_experts), routed as in moe.h.
 * MTP (next-n) layers: model.layers.{num_hidden_layers ...} hold num_nextn_predict_layers extra
 * blocks (eh_proj, enorm, hnorm, shared_head, plus a decoder layer). Their shapes are checked at
 * load (kiln_arch_check_mtp) when present; they are not run. */
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include <stdio.h>
#include <string.h>

static kiln_status glm4_moe_read(struct kiln_model *m, json_t *cfg, const char *file) {
    kiln_arch_model *am = kiln_arch_state_new(m);
    if (!am) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    double theta;
    int rot;
    KILN_TRY(kiln_arch_read_gqa(m, cfg, file, 0, &theta, &rot));
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "use_qk_norm", 0, &am->hp.qk_norm));
    m->hp.rope_style = KILN_ROPE_NEOX;
    KILN_TRY(kiln_arch_finish_gqa(m, cfg, file, theta, rot));
    return kiln_arch_read_moe(m, cfg, file);
}

/* Layer l (a decoder layer, or an MTP layer past num_hidden_layers: MoE) into L. */
static kiln_status glm4_moe_layer(struct kiln_model *m, int l, kiln_arch_layer *L) {
    kiln_arch_hp *ah = &((kiln_arch_model *)m->arch_state)->hp;
    const int64_t D = m->hp.dim, hd = m->hp.head_dim;
    char n[192], mp[96];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    KILN_TRY(kiln_arch_vec(m, P("input_layernorm.weight"), D, &L->attn_norm));
    KILN_TRY(kiln_arch_vec(m, P("post_attention_layernorm.weight"), D, &L->ffn_norm));
    KILN_TRY(kiln_arch_bind_self_attn(m, P("self_attn."), L));
    if (ah->qk_norm) {
        KILN_TRY(kiln_arch_vec(m, P("self_attn.q_norm.weight"), hd, &L->q_norm));
        KILN_TRY(kiln_arch_vec(m, P("self_attn.k_norm.weight"), hd, &L->k_norm));
    }
#undef P
    snprintf(mp, sizeof mp, "model.layers.%d.mlp.", l);
    if (l >= m->hp.n_layers ? kiln_arch_mtp_is_moe(m, mp) : ah->is_moe[l]) return kiln_arch_bind_moe(m, mp, L);
    return kiln_arch_bind_mlp(m, mp, m->hp.ffn_dim, L);
}

static kiln_status glm4_moe_bind(struct kiln_model *m) {
    kiln_arch_model *am = m->arch_state;
    KILN_TRY(kiln_arch_bind_ends(m, "model.embed_tokens.weight", "model.norm.weight", "lm_head"));
    KILN_TRY(kiln_arch_layers_new(m, am));
    for (int l = 0; l < m->hp.n_layers; l++) KILN_TRY(glm4_moe_layer(m, l, &am->layers[l]));
    return kiln_arch_check_mtp(m, "model.", glm4_moe_layer);
}

const kiln_arch kiln_arch_glm4_moe = {"glm4_moe", {"glm4_moe"}, {"Glm4MoeForCausalLM"}, glm4_moe_read, glm4_moe_bind, kiln_mkmodel_arch, "glm4moe", NULL, 0};
