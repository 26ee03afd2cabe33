/* requant.c — kiln_model_requantize: re-encodes, in memory, the linear layers of every transformer
 * block so that one checkpoint can be evaluated under several weight formats (`kiln eval
 * --weights`, `--matrix`). Each weight goes through the quantiser (quant/quantize.h: dequantized
 * row by row with the reference kiln_weight_row_f32, then FP8 128×128 blocks / INT4 group-32
 * pack-quantized / BF16 / F32 in the checkpoint conventions); the new buffers belong to the model.
 * Embeddings and the output head keep their stored dtype (the usual practice of weight-only
 * quantization: Kimi K2's INT4 release keeps lm_head in BF16).
 *
 * INT4 (`int4` = `int4-g32`, or `int4-g128`) needs the input dimension to be a multiple of the group:
 * a weight whose columns are not (stories260K's down_proj has 172; none of its layers divide by 128)
 * keeps its stored format and is counted in *n_kept. */
#include "eval/eval.h"
#include "base/status.h"
#include "model/arch.h"
#include "model/model.h"
#include "quant/quantize.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP8_BLOCK 128

static kiln_status requant_one(struct kiln_model *m, kiln_weight *w, kiln_wformat fmt, int group, const char *name, int *n_kept) {
    if (!w->data || (w->fmt == fmt && (fmt != KILN_WF_INT4_GROUP || w->block == group))) return KILN_OK;
    if (fmt == KILN_WF_INT4_GROUP && (w->cols % group) != 0) {
        (*n_kept)++;
        return KILN_OK;
    }
    kiln_weight nw;
    void *data = NULL, *scales = NULL;
    kiln_status st = kiln_quantize_weight(w, fmt, fmt == KILN_WF_INT4_GROUP ? group : fmt == KILN_WF_FP8_BLOCK ? FP8_BLOCK : 0,
                                          &nw, &data, &scales);
    if (st) return kiln_fail(st, "requantize %s to %s: %s", name, kiln_wformat_name(fmt), kiln_last_error());
    if (!kiln_model_own(m, data)) { free(scales); return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name); }
    if (scales && !kiln_model_own(m, scales)) return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name);
    /* kiln owns these bytes, so the GEMV's 4-row tile layout costs one permutation here (gemv.h);
     * a failed scratch allocation just leaves the weight in checkpoint order. */
    if (kiln_weight_prefers_tiled(&nw)) (void)kiln_weight_tile(&nw, data, scales);
    *w = nw;
    /* the bytes the kernels now read instead of the checksummed tensors: checked with them */
    char sn[140];
    (void)kiln_model_note_copy(m, name, data, (size_t)nw.rows * nw.row_bytes);
    snprintf(sn, sizeof sn, "%s (scales)", name);
    if (scales) (void)kiln_model_note_copy(m, sn, scales, kiln_weight_bytes(&nw) - (size_t)nw.rows * nw.row_bytes);
    return KILN_OK;
}

/* The architectures of model/arch.h: every projection the forward pass multiplies by — attention
 * (fused QKV or q/k/v, o; MLA's q_a, q_b or q, kv_a, o), the dense MLP (fused gate_up or
 * gate/up/down), the routed experts and the shared experts. Kept as stored: MoE routers (routing
 * decisions are what quantization must not move; checkpoints keep them in BF16) and MLA's kv_b,
 * whose per-head absorbed float32 copies (built at load) are what attention reads. */
/* The linear weights of one arch layer that the forward pass multiplies by (see requant_arch),
 * with their checkpoint names; returns how many (≤ ARCH_LINEARS). */
#define ARCH_LINEARS 17
static int arch_layer_linears(kiln_arch_layer *L, kiln_weight **w, const char **n) {
    kiln_weight *ws[ARCH_LINEARS] = {&L->wqkv, &L->wq, &L->wk, &L->wv, &L->wo, &L->mla.wq_a, &L->mla.wq_b, &L->mla.wq,
                                     &L->mla.wkv_a, &L->mla.wo, &L->w_gate_up, &L->w_gate, &L->w_up, &L->w_down,
                                     &L->moe.sh_gate, &L->moe.sh_up, &L->moe.sh_down};
    static const char *names[ARCH_LINEARS] = {
        "self_attn.query_key_value", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.o_proj",
        "mlp.gate_up_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
        "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"};
    for (int i = 0; i < ARCH_LINEARS; i++) { w[i] = ws[i]; if (n) n[i] = names[i]; }
    return ARCH_LINEARS;
}

/* The architectures of model/arch.h: every projection the forward pass multiplies by — attention
 * (fused QKV or q/k/v, o; MLA's q_a, q_b or q, kv_a, o), the dense MLP (fused gate_up or
 * gate/up/down), the routed experts and the shared experts. Kept as stored: MoE routers (routing
 * decisions are what quantization must not move; checkpoints keep them in BF16) and MLA's kv_b,
 * whose per-head absorbed float32 copies (built at load) are what attention reads. */
static kiln_status requant_arch(struct kiln_model *m, kiln_wformat fmt, int group, int experts_only, int *kept) {
    kiln_arch_model *am = m->arch_state;
    if (!am) return KILN_OK;
    for (int l = 0; l < m->hp.n_layers; l++) {
        kiln_arch_layer *L = &am->layers[l];
        char name[96];
        kiln_weight *ws[ARCH_LINEARS];
        const char *names[ARCH_LINEARS];
        int nw = arch_layer_linears(L, ws, names);
        for (int i = 0; i < nw && !experts_only; i++) {
            snprintf(name, sizeof name, "layer %d %s", l, names[i]);
            KILN_TRY(requant_one(m, ws[i], fmt, group, name, kept));
        }
        if (L->is_moe && L->exp_w) /* gate[E], up[E], down[E]; moe.gate/up/down point into this array */
            for (int e = 0; e < 3 * am->hp.moe.n_experts; e++) {
                snprintf(name, sizeof name, "layer %d mlp.experts.%d.%s", l, e % am->hp.moe.n_experts,
                         e < am->hp.moe.n_experts ? "gate_proj" : e < 2 * am->hp.moe.n_experts ? "up_proj" : "down_proj");
                KILN_TRY(requant_one(m, &L->exp_w[e], fmt, group, name, kept));
            }
    }
    return KILN_OK;
}

/* One quantized weight still in the mapped checkpoint → an owned copy in the tile layout
 * (kernels/gemv.h). Best effort: without memory it stays as it is (correct, only slower). */
static void repack_one(struct kiln_model *m, kiln_weight *w, const char *name, uint64_t *bytes) {
    if (!w->data || w->tiled || !kiln_weight_prefers_tiled(w)) return;
    const size_t db = (size_t)w->rows * w->row_bytes;
    const size_t sb = w->fmt == KILN_WF_INT4_GROUP ? 2 * (size_t)w->rows * (size_t)(w->cols / w->block) : 0;
    uint8_t *d = kiln_alloc64(db);
    void *s = sb ? kiln_alloc64(sb) : NULL;
    if (!d || (sb && !s)) { free(d); free(s); return; }
    memcpy(d, w->data, db);
    if (sb) memcpy(s, w->scales, sb);
    kiln_weight nw = *w;
    nw.data = d;
    if (sb) nw.scales = s;
    if (kiln_weight_tile(&nw, d, s) != 0) { free(d); free(s); return; }
    if (!kiln_model_own(m, d)) { free(s); return; }
    if (s && !kiln_model_own(m, s)) return; /* d is owned (freed with the model); w unchanged */
    *w = nw;
    *bytes += db + sb;
    char sn[140];
    (void)kiln_model_note_copy(m, name, d, db);
    snprintf(sn, sizeof sn, "%s (scales)", name);
    if (s) (void)kiln_model_note_copy(m, sn, s, sb);
}

uint64_t kiln_model_repack(kiln_model *m) {
    uint64_t bytes = 0;
    char name[160];
    if (m->arch) {
        kiln_arch_model *am = m->arch_state;
        for (int l = 0; am && l < m->hp.n_layers; l++) {
            kiln_arch_layer *L = &am->layers[l];
            kiln_weight *ws[ARCH_LINEARS];
            const char *names[ARCH_LINEARS];
            int nw = arch_layer_linears(L, ws, names);
            for (int i = 0; i < nw; i++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", l, names[i]);
                repack_one(m, ws[i], name, &bytes);
            }
            if (L->is_moe && L->exp_w)
                for (int e = 0; e < 3 * am->hp.moe.n_experts; e++) {
                    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s", l, e % am->hp.moe.n_experts,
                             e < am->hp.moe.n_experts ? "gate_proj" : e < 2 * am->hp.moe.n_experts ? "up_proj" : "down_proj");
                    repack_one(m, &L->exp_w[e], name, &bytes);
                }
        }
    } else {
        static const char *names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        for (int l = 0; l < m->hp.n_layers; l++) {
            kiln_layer *L = &m->layers[l];
            kiln_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", l, names[i]);
                repack_one(m, ws[i], name, &bytes);
            }
        }
    }
    repack_one(m, &m->output, "lm_head", &bytes);
    return bytes;
}

kiln_status kiln_model_requantize(kiln_model *m, const char *weights, int *n_kept) {
    return kiln_model_requantize_scope(m, weights, "all", n_kept);
}

kiln_status kiln_model_requantize_scope(kiln_model *m, const char *weights, const char *scope, int *n_kept) {
    int kept = 0;
    if (n_kept) *n_kept = 0;
    if (!weights) return kiln_fail(KILN_ERR_INVALID_ARG, "requantize: no weight format");
    kiln_wformat fmt;
    int group = 32; /* INT4: the compressed-tensors group along the input dimension (int4 = int4-g32) */
    if (strcmp(weights, "f32") == 0) fmt = KILN_WF_F32;
    else if (strcmp(weights, "bf16") == 0) fmt = KILN_WF_BF16;
    else if (strcmp(weights, "fp8") == 0) fmt = KILN_WF_FP8_BLOCK;
    else if (strcmp(weights, "int4") == 0 || strcmp(weights, "int4-g32") == 0) fmt = KILN_WF_INT4_GROUP;
    else if (strcmp(weights, "int4-g128") == 0) { fmt = KILN_WF_INT4_GROUP; group = 128; }
    else return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of f32, bf16, fp8, int4 (= int4-g32), int4-g128", weights);
    int experts_only = scope && strcmp(scope, "experts") == 0;
    if (scope && !experts_only && strcmp(scope, "all") != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--scope '%s' is not all or experts", scope);
    if (experts_only && !m->arch) return kiln_fail(KILN_ERR_INVALID_ARG, "--scope experts: the model has no MoE experts");
    if (m->arch) {
        KILN_TRY(requant_arch(m, fmt, group, experts_only, &kept));
        if (n_kept) *n_kept = kept;
        return KILN_OK;
    }
    for (int l = 0; l < m->hp.n_layers; l++) {
        kiln_layer *L = &m->layers[l];
        kiln_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        static const char *names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        for (int i = 0; i < 7; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, names[i]);
            KILN_TRY(requant_one(m, ws[i], fmt, group, name, &kept));
        }
    }
    if (n_kept) *n_kept = kept;
    return KILN_OK;
}

void kiln_model_prepare_compute(kiln_model *m, const kiln_options *opts) {
    if (m->repacked || (opts && opts->no_repack)) return;
    m->repacked = 1;
    uint64_t b = kiln_model_repack(m);
    if (b && !(opts && opts->quiet))
        fprintf(stderr, "kiln: %.1f MB of FP8/INT4 weights copied into the GEMV tile layout (--no-repack: compute on the mapped file)\n", (double)b / 1e6);
}
