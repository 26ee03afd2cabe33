/* requant.c — kiln_model_requantize: re-encodes, in memory, the linear layers of every transformer
 * block so that one checkpoint can be evaluated under several weight formats (`kiln eval
 * --weights`, `--matrix`). Each weight is dequantized row by row with the reference
 * kiln_weight_row_f32 and encoded again; the new buffers belong to the model. Embeddings and the
 * output head keep their stored dtype (the usual practice of weight-only quantization: Kimi K2's
 * INT4 release keeps lm_head in BF16). */
#include "eval/eval.h"
#include "base/fp.h"
#include "base/status.h"
#include "model/model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status to_bf16(struct kiln_model *m, kiln_weight *w, const char *name) {
    size_t rb = (size_t)w->cols * 2;
    uint16_t *d = malloc(rb * (size_t)w->rows);
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!d || !row) { free(d); free(row); return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name); }
    for (int64_t r = 0; r < w->rows; r++) {
        kiln_weight_row_f32(w, r, row);
        for (int64_t c = 0; c < w->cols; c++) d[(size_t)r * (size_t)w->cols + (size_t)c] = kiln_f32_to_bf16(row[c]);
    }
    free(row);
    if (!kiln_model_own(m, d)) return kiln_fail(KILN_ERR_NOMEM, "requantize %s: out of memory", name);
    w->fmt = KILN_WF_BF16;
    w->data = (const uint8_t *)d;
    w->row_bytes = rb;
    w->scales = NULL;
    w->block = 0;
    return KILN_OK;
}

kiln_status kiln_model_requantize(kiln_model *m, const char *weights) {
    if (!weights) return kiln_fail(KILN_ERR_INVALID_ARG, "requantize: no weight format");
    int bf16 = strcmp(weights, "bf16") == 0;
    if (strcmp(weights, "f32") == 0 || strcmp(weights, "auto") == 0) return KILN_OK;
    if (strcmp(weights, "fp8") == 0 || strcmp(weights, "int4") == 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--weights %s: in-memory %s quantization is not available yet (needs src/quant/quantize.h)", weights, weights);
    if (!bf16) return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of f32, bf16, fp8, int4", weights);
    for (int l = 0; l < m->hp.n_layers; l++) {
        kiln_layer *L = &m->layers[l];
        kiln_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        static const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        for (int i = 0; i < 7; i++) {
            kiln_weight *w = ws[i];
            if (!w->data || w->fmt == KILN_WF_BF16) continue;
            char name[64];
            snprintf(name, sizeof name, "layer %d %s", l, names[i]);
            KILN_TRY(to_bf16(m, w, name));
        }
    }
    return KILN_OK;
}
