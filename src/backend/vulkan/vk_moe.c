/* vk_moe.c — MoE on the device: the grouped expert matmuls, the router (moe_route.comp, the host's
 * floats bit for bit), the entries sorted by expert (moe_sort.comp), the by-id matmuls and the
 * weighted combine (moe_combine.comp) (docs/VULKAN.md). */
#include "backend/vulkan/vk_internal.h"

/* ---- MoE experts ----------------------------------------------------------------------------------- */
static int record_swiglu(vk_state *s, float *g, const float *u, int64_t len) { return vkb_record_ew(s, KILN_VK_SH_swiglu, g, u, (size_t)len, len, 0); }

void vk_moe_experts(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down,
                    const int *active, int n_active, const int *offset, const float *xg, float *hg, float *ug, float *yg) {
    vk_state *s = ST(be);
    int ok = !s->failed;
    for (int a = 0; ok && a < n_active; a++) {
        const int e = active[a], off = offset[e], cnt = offset[e + 1] - offset[e];
        if (cnt <= 0) continue;
        const float *x = xg + (size_t)off * (size_t)c->dim;
        float *h = hg + (size_t)off * (size_t)c->ffn, *u = ug + (size_t)off * (size_t)c->ffn, *y = yg + (size_t)off * (size_t)c->dim;
        ok = vkb_record_matmul(s, &gate[e], x, c->dim, h, c->ffn, cnt) == 0 && vkb_record_matmul(s, &up[e], x, c->dim, u, c->ffn, cnt) == 0 &&
             record_swiglu(s, h, u, (int64_t)cnt * c->ffn) == 0 && vkb_record_matmul(s, &down[e], h, c->ffn, y, c->dim, cnt) == 0;
    }
    if (ok && vkb_done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.moe_experts(be, c, gate, up, down, active, n_active, offset, xg, hg, ug, yg);
}

/* ---- the routed experts on the device (moe_route.comp, matmul.comp BYID, moe_combine.comp) ------- */
/* The expert address table of a layer (built on first use: every expert uploaded, each one chunk);
 * NULL when some expert cannot be had that way (the caller takes the host-routed path). */
static const uint32_t *expert_addresses(vk_state *s, const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down, int E) {
    moe_tab *t = NULL;
    for (int i = 0; i < s->n_moe_tabs && !t; i++)
        if (s->moe_tabs[i].gate == gate && s->moe_tabs[i].up == up && s->moe_tabs[i].down == down && s->moe_tabs[i].E == E) t = &s->moe_tabs[i];
    if (t && t->gen == s->weights_gen && t->fp_first == vkb_fingerprint(&gate[0]) && t->fp_last == vkb_fingerprint(&down[E - 1])) return t->addr;
    if (!t) {
        if (vkb_grow((void **)&s->moe_tabs, &s->cap_moe_tabs, s->n_moe_tabs + 1, sizeof *s->moe_tabs)) return NULL;
        t = &s->moe_tabs[s->n_moe_tabs++];
        *t = (moe_tab){gate, up, down, E, 0, 0, 0, malloc((size_t)E * 12 * sizeof(uint32_t))};
        if (!t->addr) { s->n_moe_tabs--; return NULL; }
    }
    const kiln_weight *mats[3] = {gate, up, down};
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++) {
            const kiln_weight *w = &mats[m][e];
            if (w->fmt != mats[m][0].fmt || w->rows != mats[m][0].rows || w->cols != mats[m][0].cols || w->block != mats[m][0].block ||
                !vkb_matmul_shape_ok(w))
                return NULL;
            const vk_weight *vw = vkb_device_weight(s, w);
            if (!vw || vw->n_chunks != 1) return NULL;
            const uint64_t da = kiln_vk_buf_address(s->vk, &vw->chunks[0].data);
            const uint64_t sa = vw->chunks[0].scales.buf ? kiln_vk_buf_address(s->vk, &vw->chunks[0].scales) : 0;
            if (!da || (vw->chunks[0].scales.buf && !sa)) return NULL;
            uint32_t *a = t->addr + ((size_t)m * (size_t)E + (size_t)e) * 4;
            a[0] = (uint32_t)da; a[1] = (uint32_t)(da >> 32); a[2] = (uint32_t)sa; a[3] = (uint32_t)(sa >> 32);
        }
    t->gen = s->weights_gen;
    t->fp_first = vkb_fingerprint(&gate[0]);
    t->fp_last = vkb_fingerprint(&down[E - 1]);
    return t->addr;
}

/* The experts' matmul over the device's routing (Y row t = W_{ids[t]} · X row t / x_div): one workgroup per (row, entry) of the nk (token,
 * slot) entries, or — tiles > 0 — per (row, tile of 8 expert-sorted entries at ord_off). */
static int record_matmul_id(vk_state *s, const kiln_weight *w0, kiln_vk_bind tab, uint32_t tab_ids, uint32_t tab_off, vref xr, uint32_t x_stride,
                            uint32_t x_div, vref yr, uint32_t y_stride, int nk, uint32_t ord_off, uint32_t tiles) {
    const kiln_vk_bind lut = {s->lut.buf, 0, VK_WHOLE_SIZE};
    const kiln_vk_bind b[5] = {tab, lut, xr.b, yr.b, lut};
    const int64_t B = w0->block > 0 ? w0->block : 1;
    const kiln_vk_shader sh = (kiln_vk_shader)((tiles ? KILN_VK_SH_matmul8_id_f32 : KILN_VK_SH_matmul_id_f32) + (vkb_matmul_shader(w0->fmt) - KILN_VK_SH_matmul_f32));
    for (int64_t r = 0; r < w0->rows; r += s->max_gx) {
        const int64_t rr = w0->rows - r < (int64_t)s->max_gx ? w0->rows - r : (int64_t)s->max_gx;
        const mm_push pc = {.rows = (uint32_t)rr, .cols = (uint32_t)w0->cols, .r0 = (uint32_t)r, .n = (uint32_t)nk, .x_off = xr.off,
                            .x_stride = x_stride, .y_off = yr.off, .y_stride = y_stride, .block = (uint32_t)B,
                            .scols = (uint32_t)(w0->fmt == KILN_WF_FP8_BLOCK ? (w0->cols + B - 1) / B : w0->cols / B),
                            .row_bytes = (uint32_t)w0->row_bytes, .x_div = x_div, .tab_off = tab_off, .ids_off = tab_ids, .ord_off = ord_off};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, tiles ? tiles : (uint32_t)nk, 1) != KILN_OK) {
            vkb_fail_once(s, "expert matmul dispatch");
            return -1;
        }
    }
    return 0;
}


/* Records moe_route.comp for n tokens: logits from lr, the table at tr (ids at its start, weights
 * after n·K words, the bias at bias_off). */
static int record_route(vk_state *s, const kiln_moe_cfg *c, int has_bias, vref lr, vref tr, uint32_t bias_off, int n) {
    const uint32_t nk = (uint32_t)n * (uint32_t)c->n_used;
    const struct { uint32_t E, K, n_group, topk_group, norm, has_bias, l_off, ids_off, wt_off, bias_off; float routed_scale; } rp = {
        (uint32_t)c->n_experts, (uint32_t)c->n_used, (uint32_t)c->n_group, (uint32_t)c->topk_group, (uint32_t)c->norm_topk_prob, (uint32_t)has_bias,
        lr.off, tr.off, tr.off + nk, bias_off, c->routed_scale};
    const kiln_vk_bind rb[2] = {lr.b, tr.b};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_route, rb, 2, &rp, sizeof rp, (uint32_t)n, 1, 1) != KILN_OK) {
        vkb_fail_once(s, "routing dispatch");
        return -1;
    }
    return 0;
}

/* Once per backend: the router's selection computed by the device equals the host's on a sweep of
 * logits (near-equal values included), experts and weights bit for bit. Vulkan requires double
 * precision operations only as accurate as single precision; the shader's sigmoid and division
 * match the host where they are correctly rounded (lavapipe, NVIDIA), and a device where they are
 * not keeps routing on the host (said once). */
static int route_check(vk_state *s) {
    enum { T = 8, E = 512, K = 8 };
    const kiln_moe_cfg c = {.n_experts = E, .n_used = K, .n_group = 8, .topk_group = 4, .norm_topk_prob = 1, .routed_scale = 2.5f};
    float *logits = malloc((size_t)T * E * sizeof(float)), bias[E], tmp[E + 8], wt[K];
    uint32_t *tab = calloc(2 * (size_t)T * K + E, sizeof *tab);
    int ok = logits && tab, idx[K];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; ok && i < T * E; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const float u = (float)(r >> 40) / 16777216.0f; /* [0, 1) */
        logits[i] = i % 7 == 0 ? 0.25f + (float)(i % 3) * 1e-7f : (u - 0.5f) * (float)(4 << (i % 5)); /* near ties and wide magnitudes */
    }
    for (int e = 0; e < E; e++) { r = r * 6364136223846793005ull + 1442695040888963407ull; bias[e] = (float)(r >> 40) / 16777216.0f * 0.1f; }
    if (ok) memcpy(tab + 2 * (size_t)T * K, bias, sizeof bias);
    vref lr, tr;
    ok = ok && vkb_stage(s, logits, (size_t)T * E * sizeof(float), 0, &lr) == 0 && vkb_stage(s, tab, (2 * (size_t)T * K + E) * sizeof *tab, 1, &tr) == 0 &&
         record_route(s, &c, 1, lr, tr, tr.off + 2u * T * K, T) == 0 && vkb_flush(s) == 0;
    for (int t = 0; ok && t < T; t++) {
        kiln_moe_route(&c, logits + (size_t)t * E, bias, idx, wt, tmp);
        for (int j = 0; j < K; j++) ok &= tab[t * K + j] == (uint32_t)idx[j] && memcmp(&tab[T * K + t * K + j], &wt[j], 4) == 0;
    }
    free(logits);
    free(tab);
    if (!ok && !s->failed)
        fprintf(stderr, "kiln: %s: the device's MoE routing gave other experts or weights than the host's on the check's logits (its "
                        "double-precision arithmetic is not correctly rounded?); MoE layers route on the host\n", kiln_vk_device_name(s->vk));
    return ok ? 1 : -1;
}

/* One piece of a routed chunk (n ≤ s->moe_tokens tokens): routing, the experts by id and the
 * combine, recorded; -1 where the device cannot take it (nothing of it recorded, or abandoned). */
static int routed_piece(vk_state *s, const kiln_moe_cfg *c, const float *logits, const float *bias, const kiln_weight *gate, const kiln_weight *up,
                        const kiln_weight *down, const float *X, int n, float *hg, float *ug, float *yg, float *Y) {
    const int E = c->n_experts, K = c->n_used, D = c->dim, F = c->ffn, nk = n * K;
    if (s->failed || !kiln_vk_has_bda(s->vk) || !kiln_vk_has_f64(s->vk) || n <= 0 || n > s->moe_tokens || E < 1 || E > 512 || K < 1 ||
        K > 64 || K > E ||
        c->n_group > 64 || (c->n_group > 1 && E % c->n_group) || c->ep_size > 1 ||
        (n <= MOE_BYID_MAX_TOKENS && (uint32_t)nk > kiln_vk_max_groups_y(s->vk)) ||
        (uint32_t)n > s->max_gx)
        return -1;
    /* a prefill chunk: its entries sorted by expert into tiles of 8 (at most nk / 8 + E tiles) */
    const uint32_t tiles = n > MOE_BYID_MAX_TOKENS ? (uint32_t)((nk + 7) / 8 + E) : 0;
    if (tiles && tiles > kiln_vk_max_groups_y(s->vk)) return -1;
    if (!s->route_ok) s->route_ok = route_check(s);
    if (s->route_ok < 0) return -1;
    const uint32_t *addr = expert_addresses(s, gate, up, down, E);
    if (!addr) return -1;
    /* table: [ids nk | weights nk | slots nk | gate, up, down addresses 3 × 4E | bias E | sorted tiles 8·tiles] */
    const size_t words = 3 * (size_t)nk + 12 * (size_t)E + (size_t)E + 8 * (size_t)tiles;
    uint32_t *tab = calloc(words, sizeof *tab);
    if (!tab) return -1;
    for (int i = 0; i < nk; i++) tab[2 * (size_t)nk + (size_t)i] = (uint32_t)i; /* combine slot of (token, j): its own row of yg */
    memcpy(tab + 3 * (size_t)nk, addr, 12 * (size_t)E * sizeof *tab);
    if (bias) memcpy(tab + 3 * (size_t)nk + 12 * (size_t)E, bias, (size_t)E * sizeof *tab);
    vref tr, lr, xr, hr, ur, gr, yr;
    int ok = vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 && vkb_resolve(s, logits, (size_t)n * (size_t)E * sizeof(float), 0, &lr) == 0 &&
             vkb_resolve(s, X, (size_t)n * (size_t)D * sizeof(float), 0, &xr) == 0 &&
             vkb_resolve(s, hg, (size_t)nk * (size_t)F * sizeof(float), 1, &hr) == 0 && vkb_resolve(s, ug, (size_t)nk * (size_t)F * sizeof(float), 1, &ur) == 0 &&
             vkb_resolve(s, yg, (size_t)nk * (size_t)D * sizeof(float), 1, &gr) == 0 && vkb_resolve(s, Y, (size_t)n * (size_t)D * sizeof(float), 1, &yr) == 0;
    free(tab);
    /* the selection (ids, weights) into the table */
    ok = ok && record_route(s, c, bias != NULL, lr, tr, tr.off + 3u * (uint32_t)nk + 12u * (uint32_t)E, n) == 0;
    const uint32_t a0 = tr.off + 3u * (uint32_t)nk, ord = a0 + 13u * (uint32_t)E;
    if (ok && tiles) { /* the entries by expert (moe_sort.comp) */
        const struct { uint32_t nk, E, ids_off, ord_off, cap; } sp = {(uint32_t)nk, (uint32_t)E, tr.off, ord, 8u * tiles};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_sort, &tr.b, 1, &sp, sizeof sp, 1, 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); ok = 0; }
    }
    ok = ok && record_matmul_id(s, &gate[0], tr.b, tr.off, a0, xr, (uint32_t)D, (uint32_t)K, hr, (uint32_t)F, nk, ord, tiles) == 0 &&
         record_matmul_id(s, &up[0], tr.b, tr.off, a0 + 4u * (uint32_t)E, xr, (uint32_t)D, (uint32_t)K, ur, (uint32_t)F, nk, ord, tiles) == 0 &&
         record_swiglu(s, hg, ug, (int64_t)nk * F) == 0 &&
         record_matmul_id(s, &down[0], tr.b, tr.off, a0 + 8u * (uint32_t)E, hr, (uint32_t)F, 1u, gr, (uint32_t)D, nk, ord, tiles) == 0;
    if (ok) {
        const kiln_vk_bind b[4] = {gr.b, yr.b, tr.b, tr.b};
        const struct { uint32_t K, dim, g_off, y_off, s_off, w_off; } pc = {(uint32_t)K, (uint32_t)D, gr.off, yr.off, tr.off + 2u * (uint32_t)nk,
                                                                             tr.off + (uint32_t)nk};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_combine, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && vkb_done(s) == 0) return 0;
    abandon(s); /* what was recorded only wrote the scratch rows and Y, which the host path writes again */
    return -1;
}

/* backend.h moe_routed: routing, the experts by id and the combine, recorded on the device, in
 * pieces of at most s->moe_tokens tokens (a token's floats do not depend on the piece it is in: the
 * routing, the per-entry matmul operations and the combine order are its own); the scratch rows of
 * a piece are its tokens' rows of hg / ug / yg ([token][slot] order). -1 where the device cannot
 * take a piece: no 64-bit floats or device addresses, more than 512 experts or 64 selected, more
 * tiles than the workgroup grid holds; the caller's host path then writes all of Y again. */
int vk_moe_routed(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, const kiln_weight *gate,
                  const kiln_weight *up, const kiln_weight *down, const float *X, int n, float *hg, float *ug, float *yg, float *Y) {
    vk_state *s = ST(be);
    if (n <= 0) return -1;
    const size_t E = (size_t)c->n_experts, K = (size_t)c->n_used, D = (size_t)c->dim, F = (size_t)c->ffn;
    for (int t0 = 0; t0 < n; t0 += s->moe_tokens) {
        const int m = n - t0 < s->moe_tokens ? n - t0 : s->moe_tokens;
        const size_t t = (size_t)t0;
        if (routed_piece(s, c, logits + t * E, bias, gate, up, down, X + t * D, m, hg + t * K * F, ug + t * K * F, yg + t * K * D, Y + t * D) != 0) {
            if (t0 > 0) vkb_host_first(s); /* the earlier pieces run now, before the host path writes the same rows */
            return -1;
        }
    }
    return 0;
}

/* The weighted combine on the device (moe_combine.comp; bit for bit the host's): the expert
 * outputs stay where the expert matmuls wrote them, and the step goes on without a submit. */
void vk_moe_combine(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y) {
    vk_state *s = ST(be);
    if (n > 0 && K > 0 && dim > 0 && !s->failed && (uint32_t)n <= s->max_gx) {
        int max_slot = 0;
        for (int i = 0; i < n * K; i++) max_slot = slot[i] > max_slot ? slot[i] : max_slot;
        vref gr, yr, sr, wr;
        const size_t nk = (size_t)n * (size_t)K;
        if (vkb_resolve(s, yg, ((size_t)max_slot + 1) * (size_t)dim * sizeof(float), 0, &gr) == 0 &&
            vkb_resolve(s, Y, (size_t)n * (size_t)dim * sizeof(float), 1, &yr) == 0 && vkb_resolve(s, slot, nk * sizeof(int), 0, &sr) == 0 &&
            vkb_resolve(s, wt, nk * sizeof(float), 0, &wr) == 0) {
            const kiln_vk_bind b[4] = {gr.b, yr.b, sr.b, wr.b};
            const struct { uint32_t K, dim, g_off, y_off, s_off, w_off; } pc = {(uint32_t)K, (uint32_t)dim, gr.off, yr.off, sr.off, wr.off};
            s->n_dispatch++;
            if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_combine, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) == KILN_OK) {
                if (vkb_done(s) == 0) return;
            } else vkb_fail_once(s, "dispatch");
        }
        abandon(s);
    } else vkb_host_first(s);
    kiln_backend_cpu_ops.moe_combine(be, n, K, dim, slot, wt, yg, Y);
}

