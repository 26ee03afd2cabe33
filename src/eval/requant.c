/* requant.c — kiln_model_requantize: re-encodes, in memory, the linear layers of every transformer
 * block so that one checkpoint can be evaluated under several weight formats (`kiln eval
 * --weights`, `--matrix`). Each weight goes through the quantiser (quant/quantize.h: dequantized
 * row by row with the reference kiln_weight_row_f32, then FP8 128×128 blocks / INT4 group-32
 * pack-quantized / BF16 / F32 in the checkpoint conventions); the new buffers belong to the model.
 * Embeddings and the output head keep their stored dtype (the usual practice of weight-only
 * quantization: Kimi K2's INT4 release keeps lm_head in BF16).
 *
 * INT4 needs the input dimension to be a multiple of the group (32): a weight whose columns are not
 * (stories260K's down_proj has 172) keeps its stored format and is counted in *n_kept. */
#include "eval/eval.h"
#include "base/status.h"
#include "model/model.h"
#include "quant/quantize.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INT4_GROUP 32
#define FP8_BLOCK 128

static kiln_status requant_one(struct kiln_model *m, kiln_weight *w, kiln_wformat fmt, const char *name, int *n_kept) {
    if (!w->data || w->fmt == fmt) return KILN_OK;
    if (fmt == KILN_WF_INT4_GROUP && (w->cols % INT4_GROUP) != 0) {
        (*n_kept)++;
        return KILN_OK;
    }
    kiln_weight nw;
    void *data = NULL, *scales = NULL;
    kiln_status st = kiln_quantize_weight(w, fmt, fmt == KILN_WF_INT4_GROUP ? INT4_GROUP : fmt == KILN_WF_FP8_BLOCK ? FP8_BLOCK : 0,
                                          &nw, &data, &scales);
    if (st) return kiln_fail(st, "requantize %s to %s: %s", name, kiln_wformat_name(fmt), kiln_last_error());
    if (!kiln_model_own(m, data)) { free(scales); return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name); }
    if (scales && !kiln_model_own(m, scales)) return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name);
    *w = nw;
    return KILN_OK;
}

kiln_status kiln_model_requantize(kiln_model *m, const char *weights, int *n_kept) {
    int kept = 0;
    if (n_kept) *n_kept = 0;
    if (!weights) return kiln_fail(KILN_ERR_INVALID_ARG, "requantize: no weight format");
    kiln_wformat fmt;
    if (strcmp(weights, "f32") == 0) fmt = KILN_WF_F32;
    else if (strcmp(weights, "bf16") == 0) fmt = KILN_WF_BF16;
    else if (strcmp(weights, "fp8") == 0) fmt = KILN_WF_FP8_BLOCK;
    else if (strcmp(weights, "int4") == 0) fmt = KILN_WF_INT4_GROUP;
    else return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of f32, bf16, fp8, int4", weights);
    if (m->arch)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--weights %s: in-memory requantization covers llama layers only so far (this model is %s)",
                         weights, m->hp.arch);
    for (int l = 0; l < m->hp.n_layers; l++) {
        kiln_layer *L = &m->layers[l];
        kiln_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        static const char *names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        for (int i = 0; i < 7; i++) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, names[i]);
            KILN_TRY(requant_one(m, ws[i], fmt, name, &kept));
        }
    }
    if (n_kept) *n_kept = kept;
    return KILN_OK;
}
