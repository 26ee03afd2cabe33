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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP8_BLOCK 128

static kiln_status requant_one(struct kiln_model *m, kiln_weight *w, kiln_wformat fmt, int group, const char *name, int *n_kept) {
    if (!w->data || (w->fmt == fmt && (fmt != KILN_WF_INT4_GROUP || w->block == group))) return KILN_OK;
    if ((fmt == KILN_WF_INT4_GROUP || fmt == KILN_WF_Q8_0 || fmt == KILN_WF_Q4_0) && (w->cols % group) != 0) { /* blocks along cols */
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
    const int layout = kiln_weight_prefers_tiled(&nw, m->layout_isa);
    if (layout) (void)kiln_weight_tile(&nw, data, scales, layout);
    *w = nw;
    /* the bytes the kernels now read instead of the checksummed tensors: checked with them */
    char sn[140];
    (void)kiln_model_note_copy(m, name, data, (size_t)nw.rows * nw.row_bytes);
    snprintf(sn, sizeof sn, "%s (scales)", name);
    if (scales) (void)kiln_model_note_copy(m, sn, scales, kiln_weight_bytes(&nw) - (size_t)nw.rows * nw.row_bytes);
    return KILN_OK;
}

/* Every linear weight of every layer the forward pass multiplies by (kiln_arch_layer_linears:
 * attention projections, dense MLP, routed and shared experts; routers and MLA's kv_b kept as
 * stored), or only the routed experts. */
static kiln_status requant_layers(struct kiln_model *m, kiln_wformat fmt, int group, int experts_only, int *kept) {
    kiln_arch_model *am = m->arch_state;
    if (!am) return KILN_OK;
    const int E = am->hp.moe.n_experts;
    kiln_arch_linear *lin = malloc(((size_t)KILN_ARCH_DENSE_LINEARS + 3 * (size_t)E) * sizeof *lin);
    if (!lin) return kiln_fail(KILN_ERR_NOMEM, "requantize: out of memory");
    kiln_status st = KILN_OK;
    for (int l = 0; l < m->hp.n_layers && st == KILN_OK; l++) {
        const int nw = kiln_arch_layer_linears(&am->layers[l], E, lin);
        for (int i = 0; i < nw && st == KILN_OK; i++) {
            if (experts_only && lin[i].expert < 0) continue;
            char name[96];
            snprintf(name, sizeof name, "layer %d %s", l, lin[i].name);
            st = requant_one(m, lin[i].w, fmt, group, name, kept);
        }
    }
    free(lin);
    return st;
}

/* One quantized weight still in the mapped checkpoint → an owned copy in the tile layout
 * (kernels/gemv.h), or as it is for the formats whose kernels read the checkpoint layout from an
 * owned buffer faster (kiln_weight_prefers_owned: the GGUF blocks without a tile layout). Best effort: without memory it stays
 * as it is (correct, only slower). */
static void repack_one(struct kiln_model *m, kiln_weight *w, const char *name, uint64_t *bytes) {
    if (!w->data || w->tiled) return;
    const int tile = kiln_weight_prefers_tiled(w, m->layout_isa);
    if (!tile && !kiln_weight_prefers_owned(w, m->layout_isa)) return;
    const size_t db = (size_t)w->rows * w->row_bytes;
    const size_t sb = w->fmt == KILN_WF_INT4_GROUP ? 2 * (size_t)w->rows * (size_t)(w->cols / w->block) : 0;
    uint8_t *d = kiln_alloc64(db);
    void *s = sb ? kiln_alloc64(sb) : NULL;
    if (!d || (sb && !s)) { free(d); free(s); return; }
    if (sb) memcpy(s, w->scales, sb);
    kiln_weight nw = *w;
    nw.data = d;
    if (sb) nw.scales = s;
    if (!tile) memcpy(d, w->data, db);
    else if (kiln_weight_tile_copy(&nw, w->data, d, s, tile) != 0) { free(d); free(s); return; }
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
    kiln_arch_model *am = m->arch_state;
    const int E = am ? am->hp.moe.n_experts : 0;
    kiln_arch_linear *lin = am ? malloc(((size_t)KILN_ARCH_DENSE_LINEARS + 3 * (size_t)E) * sizeof *lin) : NULL;
    for (int l = 0; lin && l < m->hp.n_layers; l++) {
        const int nw = kiln_arch_layer_linears(&am->layers[l], E, lin);
        for (int i = 0; i < nw; i++) {
            char name[160];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, lin[i].name);
            repack_one(m, lin[i].w, name, &bytes);
        }
    }
    /* the MTP layers too (their drafts run every speculating step); their head and embedding are
     * the model's unless they ship their own, which stay as they are */
    for (int j = 0; lin && am && j < am->n_mtp; j++) {
        const int l = m->hp.n_layers + j, nw = kiln_arch_layer_linears(&am->mtp[j].L, E, lin);
        char name[160];
        for (int i = 0; i < nw; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, lin[i].name);
            repack_one(m, lin[i].w, name, &bytes);
        }
        snprintf(name, sizeof name, "model.layers.%d.eh_proj", l);
        repack_one(m, &am->mtp[j].eh, name, &bytes);
    }
    free(lin); /* without memory for the list nothing is repacked: correct, only slower */
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
    int group; /* INT4: the compressed-tensors group along the input dimension (int4 = int4-g32) */
    if (kiln_weights_name_parse(weights, &fmt, &group) != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of " KILN_WEIGHTS_NAMES, weights);
    int experts_only = scope && strcmp(scope, "experts") == 0;
    if (scope && !experts_only && strcmp(scope, "all") != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--scope '%s' is not all or experts", scope);
    const kiln_arch_model *am = m->arch_state;
    if (experts_only && (!am || am->hp.n_moe_layers == 0)) return kiln_fail(KILN_ERR_INVALID_ARG, "--scope experts: the model has no MoE experts");
    KILN_TRY(requant_layers(m, fmt, group, experts_only, &kept));
    if (n_kept) *n_kept = kept;
    return KILN_OK;
}

/* Sessions and engines of one model may be created from several threads at once: the first
 * repacks, the others wait for it (the repack rewrites weight handles they would read). */
static pthread_mutex_t repack_mu = PTHREAD_MUTEX_INITIALIZER;

void kiln_model_prepare_compute(kiln_model *m, const kiln_options *opts) {
    if (opts && opts->no_repack) return;
    pthread_mutex_lock(&repack_mu);
    if (m->repacked) { pthread_mutex_unlock(&repack_mu); return; }
    uint64_t b = kiln_model_repack(m);
    m->repacked = 1;
    pthread_mutex_unlock(&repack_mu);
    if (b && !(opts && opts->quiet))
        fprintf(stderr, "kiln: %.1f MB of quantized weights (FP8, INT4, GGUF blocks) copied into the kernels' tile layouts (Q4_1, Q5_0, Q5_1, IQ4_NL: as they are, onto huge pages) (--no-repack: compute on the mapped file)\n", (double)b / 1e6);
}
