/* vk_dsa.c — DeepSeek sparse attention (GLM-5.x, DeepSeek-V3.2) on the device: the indexer key's
 * LayerNorm and FP8 rounding, the indexer scan with KV integrity hashing and the top-k selection,
 * the sparse attention over the selected compact rows (docs/VULKAN.md "DSA"). */
#include "backend/vulkan/vk_internal.h"

/* ---- DeepSeek sparse attention (DSA): the indexer's norm and FP8 rounding, its scan and top-k, the
 * attention over the selected rows ----------------------------------------------------------------- */
void vk_layernorm(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps) {
    vk_state *s = ST(be);
    if (rows <= 0 || width <= 0) return;
    const size_t bytes = (size_t)rows * (size_t)width * sizeof(float);
    vref orr, xr, wr, br;
    int ok = !s->failed && vkb_resolve(s, out, bytes, 1, &orr) == 0;
    if (ok) {
        if (out == x) xr = orr;
        else ok = vkb_resolve(s, x, bytes, 0, &xr) == 0;
    }
    ok = ok && vkb_resolve(s, w, (size_t)width * sizeof(float), 0, &wr) == 0;
    if (ok) {
        if (b) ok = vkb_resolve(s, b, (size_t)width * sizeof(float), 0, &br) == 0;
        else br = wr; /* bound but not read */
    }
    for (int r = 0; ok && r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const struct { uint32_t width, o_off, x_off, w_off, b_off, has_b; float eps; } pc = {
            (uint32_t)width, orr.off + (uint32_t)r * (uint32_t)width, xr.off + (uint32_t)r * (uint32_t)width, wr.off, br.off, b != NULL, eps};
        const kiln_vk_bind bd[4] = {orr.b, xr.b, wr.b, br.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, kiln_vk_has_f64(s->vk) ? KILN_VK_SH_layernorm64 : KILN_VK_SH_layernorm, bd, 4, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && vkb_done(s) == 0) return;
    if (!s->failed) abandon(s);
    else vkb_host_first(s);
    kiln_be_common_layernorm(be, out, x, w, b, rows, width, eps);
}

/* The rows fp8_round.comp takes: widths of whole 128-value blocks; the rotation over at most 2,048
 * values, a power of two (its row in shared memory). */
static int fp8_round_shape(int width, int hadamard) {
    return width % 128 == 0 && (!hadamard || (width <= 2048 && (width & (width - 1)) == 0));
}

void vk_fp8_round(const kiln_backend *be, float *x, int rows, int width, int hadamard) {
    vk_state *s = ST(be);
    if (rows <= 0 || width <= 0) return;
    vref xr;
    int ok = !s->failed && fp8_round_shape(width, hadamard) &&
             vkb_resolve(s, x, (size_t)rows * (size_t)width * sizeof(float), 1, &xr) == 0;
    for (int r = 0; ok && r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const struct { uint32_t width, x_off, hadamard; float norm; } pc = {(uint32_t)width, xr.off + (uint32_t)r * (uint32_t)width, hadamard != 0,
                                                                             hadamard ? 1.0f / sqrtf((float)width) : 1.0f};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_fp8_round, &xr.b, 1, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && vkb_done(s) == 0) return;
    /* a shape the shader does not take is the host's by design, not a fallback */
    if (!s->failed && fp8_round_shape(width, hadamard)) abandon(s);
    else vkb_host_first(s);
    kiln_be_common_fp8_round(be, x, rows, width, hadamard);
}

/* Whether the sparse ops of this layer run on the device: a DSA pool whose arrays the shaders
 * address, the indexer's selection arrays our buffers, and with KV integrity rows of whole words
 * (hashed where they are read). */
static int dsa_on_device(vk_state *s, const kiln_kv_pool *p, int layer, int n, const int32_t *sel, const int *nsel, int topk) {
    if (s->failed || !kiln_vk_has_bda(s->vk) || !p->dsa_key_at || n <= 0 || topk <= 0) return 0;
    if ((uint32_t)n > kiln_vk_max_groups_y(s->vk) || (uint32_t)n > s->max_gx) return 0;
    vk_alloc a; /* the selection in our buffers, bound in place: written by one dispatch and read by the next, within one step */
    if (!vkb_find_alloc(s, sel, (size_t)n * (size_t)topk * sizeof *sel, &a) || !vkb_find_alloc(s, nsel, (size_t)n * sizeof *nsel, &a)) return 0;
    if (p->integ && !kiln_kv_integ_fusable(p)) return 0;
    return vkb_arrays_on_device(s, p, layer);
}

/* The table of kv_index.comp / kv_topk.comp / kv_attend_sparse.comp: [3n token words (block-table
 * start, pos + 1, hash base) | each distinct sequence's page ids | hash keys]; *hbase [n] and
 * *n_sums as record_attend's (the token that reads its sequence furthest owns its sums). */
static uint32_t *dsa_table(const kiln_kv_pool *p, int n, kiln_kv_seq *const *seq, const int *pos, int hashing, size_t *words, uint32_t *key_off,
                           int64_t **hbase, size_t *n_sums, int *max_lim) {
    const int pt = p->cfg.page_tokens;
    size_t n_keys = 0;
    const uint32_t *keys = hashing ? kiln_kv_integ_hash_keys(p, &n_keys) : NULL;
    int *first = malloc((size_t)n * sizeof *first), *reach = malloc((size_t)n * sizeof *reach);
    *hbase = malloc((size_t)n * sizeof **hbase);
    if (!first || !reach || !*hbase) { free(first); free(reach); free(*hbase); *hbase = NULL; return NULL; }
    size_t n_ent = 0;
    vkb_call_reach(n, seq, pos, pt, hashing, 2, first, reach, *hbase, &n_ent, n_sums, max_lim); /* [slot][K, V] of the one KV head */
    *words = 3 * (size_t)n + n_ent + n_keys;
    uint32_t *tab = malloc(*words * sizeof *tab);
    if (!tab) { free(first); free(reach); free(*hbase); *hbase = NULL; return NULL; }
    uint32_t ne = 0;
    for (int i = 0; i < n; i++) {
        if (first[i] < i) { tab[3 * i] = tab[3 * first[i]]; continue; }
        tab[3 * i] = ne;
        for (int sl = 0; sl < (reach[i] + pt - 1) / pt; sl++) {
            const int32_t pg = sl < seq[i]->n_pages ? seq[i]->pages[sl] : -1;
            tab[3 * (size_t)n + ne++] = pg >= 0 && pg < p->n_pages ? (uint32_t)pg : UINT32_MAX;
        }
    }
    for (int i = 0; i < n; i++) {
        tab[3 * i + 1] = (uint32_t)(pos[i] + 1);
        tab[3 * i + 2] = (*hbase)[i] >= 0 ? (uint32_t)(*hbase)[i] : UINT32_MAX;
    }
    *key_off = 3u * (uint32_t)n + ne;
    if (n_keys) memcpy(tab + *key_off, keys, n_keys * sizeof *tab);
    free(first);
    free(reach);
    return tab;
}

/* Records kv_index.comp over the n tokens, with KV integrity hashing every page read (*ah receives
 * the sums to check after the flush). qi not NULL: the scores go to s->idx_scores, and each group
 * of tokens whose [group × context] scores fit s->idx_budget is followed by its kv_topk.comp into
 * selr / nr (topk per token). The hashing owner of a sequence (call_reach) lies in one group, so
 * every page is hashed once whatever the grouping. qi NULL: one scan that only hashes. */
static int record_index(vk_state *s, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *qi, int n_ih,
                        int d, const float *w, float w_scale, int topk, const vref *selr, const vref *nr, att_hash *ah) {
    const int pt = p->cfg.page_tokens, hashing = kiln_kv_integ_fusable(p);
    size_t words = 0, n_sums = 0;
    uint32_t key_off = 0;
    int max_lim = 0;
    ah->hs = NULL;
    uint32_t *tab = dsa_table(p, n, seq, pos, hashing, &words, &key_off, &ah->hbase, &n_sums, &max_lim);
    if (!tab) return -1;
    if (n_sums && !(ah->hs = calloc(n_sums, sizeof *ah->hs))) { free(tab); return -1; }
    int64_t unit = 64;
    while (hashing && unit % pt) unit += 64; /* hashing, lcm(64, page_tokens): every page in one workgroup */
    const uint64_t units = ((uint64_t)max_lim + (uint64_t)unit - 1) / (uint64_t)unit;
    const size_t row_bytes = (size_t)max_lim * sizeof(float);
    const int group = qi ? (int)(s->idx_budget / row_bytes < (size_t)n ? s->idx_budget / row_bytes : (size_t)n) : n; /* tokens per scan */
    if (units > s->max_gx || unit > UINT32_MAX || group <= 0) { free(tab); return -1; }
    const size_t sbytes = (size_t)group * row_bytes;
    if (qi && s->idx_scores.size < sbytes) { /* grown before anything is staged: growing runs what is recorded */
        if (vkb_flush(s) != 0) { free(tab); return -1; }
        kiln_vk_buf_destroy(s->vk, &s->idx_scores);
        size_t cap = 4096;
        while (cap < sbytes) cap *= 2;
        if (cap > s->idx_budget) cap = s->idx_budget & ~(size_t)3; /* never past one binding's range */
        if (kiln_vk_buf_create(s->vk, cap, 0, &s->idx_scores) != KILN_OK) { free(tab); vkb_fail_once(s, "indexer scratch"); return -1; }
    }
    vref qr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0}, wr = qr, tr, hr = qr;
    int ok = (!qi || (vkb_resolve(s, qi, (size_t)n * (size_t)n_ih * (size_t)d * sizeof(float), 0, &qr) == 0 &&
                      vkb_resolve(s, w, (size_t)n * (size_t)n_ih * sizeof(float), 0, &wr) == 0)) &&
             vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 && (!n_sums || vkb_stage(s, ah->hs, n_sums * sizeof *ah->hs, 1, &hr) == 0);
    free(tab);
    if (!ok) return -1;
    const kiln_vk_bind sb = qi ? (kiln_vk_bind){s->idx_scores.buf, 0, VK_WHOLE_SIZE} : (kiln_vk_bind){s->lut.buf, 0, VK_WHOLE_SIZE};
    for (int t0 = 0; t0 < n; t0 += group) {
        const int g = n - t0 < group ? n - t0 : group;
        const struct {
            uint64_t kaddr;
            uint32_t page_k, row_k, key_at, pt, unit, n_pages;
            uint32_t d, hi, q_off, w_off, s_off, s_stride;
            float w_scale;
            uint32_t scores, hash, ent_off, key_off, tok0;
        } pc = {vkb_device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer), (uint32_t)p->dsa_key_at,
                (uint32_t)pt, (uint32_t)unit, (uint32_t)p->n_pages, (uint32_t)d, (uint32_t)n_ih, qr.off, wr.off, 0, (uint32_t)max_lim, w_scale,
                qi != NULL, (uint32_t)hashing, 3u * (uint32_t)n, key_off, (uint32_t)t0};
        const kiln_vk_bind b[5] = {qr.b, wr.b, tr.b, sb, hr.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_index, b, 5, &pc, sizeof pc, (uint32_t)units, (uint32_t)g, 1) != KILN_OK) {
            vkb_fail_once(s, "indexer dispatch");
            return -1;
        }
        if (!qi) continue;
        const struct { uint32_t topk, s_off, s_stride, sel_off, nsel_off, tok0; } tc = {(uint32_t)topk, 0, (uint32_t)max_lim, selr->off, nr->off, (uint32_t)t0};
        const kiln_vk_bind tb[4] = {sb, selr->b, tr.b, nr->b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_topk, tb, 4, &tc, sizeof tc, (uint32_t)g, 1, 1) != KILN_OK) {
            vkb_fail_once(s, "top-k dispatch");
            return -1;
        }
    }
    return 0;
}

/* A hashed pass recorded: its sums compared with the seals at the flush that runs it. Takes *ah. */
static int queue_check(vk_state *s, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, att_hash *ah) {
    att_check c = {p, layer, n, malloc((size_t)n * sizeof *c.seq), malloc((size_t)n * sizeof *c.pos), *ah, {0, 0}};
    kiln_kv_integ_call_state(p, &c.call);
    if (!c.seq || !c.pos || vkb_grow((void **)&s->checks, &s->cap_checks, s->n_checks + 1, sizeof *s->checks)) {
        free(c.seq);
        free(c.pos);
        return -1;
    }
    memcpy(c.seq, seq, (size_t)n * sizeof *c.seq);
    memcpy(c.pos, pos, (size_t)n * sizeof *c.pos);
    s->checks[s->n_checks++] = c;
    ah->hs = NULL;
    ah->hbase = NULL;
    return 0;
}

/* The indexer on the device: the scan (kv_index.comp, which with KV integrity also hashes every
 * page it reads: checked at the flush that runs it, as the attention's) and the selection
 * (kv_topk.comp) in the step's command buffer; the cpu backend's otherwise. */
void vk_kv_index_topk(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *qi,
                      int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel) {
    vk_state *s = ST(be);
    const int keyed = p->dsa_key_at && d == p->cfg.dsa_key && off == p->cfg.dsa_latent + p->cfg.dsa_rope && kiln_kv_dsa_has_key(&p->cfg, layer);
    if (n <= 0) return;
    if (!keyed || d % 128 || !dsa_on_device(s, p, layer, n, sel, nsel, topk)) {
        vkb_host_first(s);
        kiln_be_common_kv_index_topk(be, p, layer, n, seq, pos, qi, n_ih, d, off, w, w_scale, topk, sel, nsel);
        return;
    }
    const int hashing = kiln_kv_integ_fusable(p);
    if (hashing) kiln_kv_integ_begin_attend(p, layer, n, seq, pos); /* a new verification round for this layer */
    att_hash ah = {NULL, NULL};
    vref selr, nr;
    int ok = vkb_resolve(s, sel, (size_t)n * (size_t)topk * sizeof *sel, 1, &selr) == 0 && vkb_resolve(s, nsel, (size_t)n * sizeof *nsel, 1, &nr) == 0 &&
             record_index(s, p, layer, n, seq, pos, qi, n_ih, d, w, w_scale, topk, &selr, &nr, &ah) == 0;
    if (ok && hashing) ok = queue_check(s, p, layer, n, seq, pos, &ah) == 0;
    if (ok && !hashing) free(ah.hbase);
    if (ok && vkb_done(s) == 0) return;
    abandon(s); /* runs what was recorded, copybacks into ah.hs included, before it is freed */
    if (!ok) {
        free(ah.hs);
        free(ah.hbase);
    }
    kiln_be_common_kv_index_topk(be, p, layer, n, seq, pos, qi, n_ih, d, off, w, w_scale, topk, sel, nsel);
}

/* The sparse attention on the device (kv_attend_sparse.comp); verify (a layer that reuses another
 * layer's selection) with KV integrity: kv_index.comp first hashes every page of the contexts (no
 * scores), checked at the flush as the indexer's. The cpu backend's otherwise. */
void vk_kv_attend_sparse(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                         const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify, float *out) {
    vk_state *s = ST(be);
    const int lat = p->cfg.dsa_latent, vd = p->cfg.v_dim;
    if (n <= 0) return;
    if (kq != lat + p->cfg.dsa_rope || kq > 1024 || vd > 1024 || vd > lat || n_heads <= 0 || (uint32_t)n_heads > s->max_gx ||
        !dsa_on_device(s, p, layer, n, sel, nsel, topk)) {
        vkb_host_first(s);
        kiln_be_common_kv_attend_sparse(be, p, layer, n, seq, pos, sel, nsel, topk, q, n_heads, kq, scale, verify, out);
        return;
    }
    const int hashing = verify && kiln_kv_integ_fusable(p);
    att_hash ah = {NULL, NULL};
    int ok = 1;
    if (hashing) {
        kiln_kv_integ_begin_attend(p, layer, n, seq, pos);
        ok = record_index(s, p, layer, n, seq, pos, NULL, 0, 0, NULL, 0.0f, 0, NULL, NULL, &ah) == 0 && queue_check(s, p, layer, n, seq, pos, &ah) == 0;
    }
    size_t words = 0, n_sums = 0;
    uint32_t key_off = 0;
    int max_lim = 0;
    int64_t *hb = NULL;
    uint32_t *tab = ok ? dsa_table(p, n, seq, pos, 0, &words, &key_off, &hb, &n_sums, &max_lim) : NULL;
    free(hb);
    vref qr, orr, tr, selr, nr;
    ok = ok && tab && vkb_resolve(s, q, (size_t)n * (size_t)n_heads * (size_t)kq * sizeof(float), 0, &qr) == 0 &&
         vkb_resolve(s, out, (size_t)n * (size_t)n_heads * (size_t)vd * sizeof(float), 1, &orr) == 0 && vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
         vkb_resolve(s, sel, (size_t)n * (size_t)topk * sizeof *sel, 0, &selr) == 0 && vkb_resolve(s, nsel, (size_t)n * sizeof *nsel, 0, &nr) == 0;
    free(tab);
    if (ok) {
        const struct {
            uint64_t kaddr;
            uint32_t page_k, row_k, pt, n_pages;
            uint32_t lat, rope, rope_bf16, v_dim, n_heads;
            uint32_t topk, q_off, o_off, sel_off, nsel_off, ent_off;
            float scale;
        } pc = {vkb_device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer),
                (uint32_t)p->cfg.page_tokens, (uint32_t)p->n_pages, (uint32_t)lat, (uint32_t)p->cfg.dsa_rope, p->cfg.dtype == KILN_KV_BF16,
                (uint32_t)vd, (uint32_t)n_heads, (uint32_t)topk, qr.off, orr.off, selr.off, nr.off, 3u * (uint32_t)n, scale};
        const kiln_vk_bind b[5] = {qr.b, orr.b, tr.b, selr.b, nr.b};
        s->n_dispatch++;
        ok = kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_attend_sparse, b, 5, &pc, sizeof pc, (uint32_t)n_heads, (uint32_t)n, 1) == KILN_OK;
        if (!ok) vkb_fail_once(s, "sparse attention dispatch");
    }
    if (ok && vkb_done(s) == 0) return;
    abandon(s);
    free(ah.hs);
    free(ah.hbase);
    kiln_be_common_kv_attend_sparse(be, p, layer, n, seq, pos, sel, nsel, topk, q, n_heads, kq, scale, verify, out);
}

