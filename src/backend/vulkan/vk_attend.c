/* vk_attend.c — attention over the KV pool's pages on the device (kv_attend.comp, split over the
 * context and merged by kv_merge.comp for long sequences) and the KV store (kv_store.comp,
 * kv_store_dsa.comp), both with KV integrity: the shaders hash what they read / write, the host
 * compares with the seals at the flush (vk_internal.h, docs/VULKAN.md). */
#include "backend/vulkan/vk_internal.h"
#include "base/pool.h"

/* ---- attention over KV pages (kv_attend.comp, kv_merge.comp) ---------------------------------------- */
typedef struct {
    uint64_t kaddr, vaddr;
    uint32_t page_k, page_v, head_k, head_v, row_k, row_v;
    uint32_t pt, k_dim, v_dim, n_heads, group, splits, chunk;
    uint32_t q_off, o_off, ent_off, ent_stride, sc_off, n_pages;
    float scale;
    uint32_t hash, key_off, kv_heads;
} att_push;
_Static_assert(sizeof(att_push) <= KILN_VK_PUSH_BYTES, "kv_attend push constants");
typedef struct { uint32_t n_heads, v_dim, splits, o_off; } merge_push;

/* Device address of [ptr, ptr + bytes) when it lies inside one buffer of ours; 0 otherwise. */
uint64_t vkb_device_address(vk_state *s, const void *ptr, size_t bytes) {
    vk_alloc a;
    return vkb_find_alloc(s, ptr, bytes, &a) && a.addr ? a.addr + (uint64_t)((const uint8_t *)ptr - a.p) : 0;
}

/* Whether layer `layer`'s K and V arrays lie whole in device-addressable buffers of ours, with page
 * strides the shaders' 32-bit push constants hold (the store and attention shaders' common need). */
int vkb_arrays_on_device(vk_state *s, const kiln_kv_pool *p, int layer) {
    const size_t page_k = kiln_kv_page_k_at(p, layer), page_v = p->cfg.v_shares_k ? page_k : p->page_v;
    if (page_k > UINT32_MAX || p->page_v > UINT32_MAX) return 0;
    return vkb_device_address(s, p->k[layer], page_k * (size_t)p->n_pages) && vkb_device_address(s, p->v[layer], page_v * (size_t)p->n_pages);
}

/* Whether the shader computes this pool's attention: its layer arrays in device-addressable
 * buffers, rows of a plain layout (not DSA's compact rows, which only the sparse ops read; not
 * pre-RoPE K smoothing, whose per-score term the shader lacks), head sizes the shader holds. */
static int attend_on_device(vk_state *s, const kiln_kv_pool *p, int layer, int n_heads) {
    const int H = p->cfg.n_kv_heads;
    if (s->failed || p->dsa_key_at || p->rope_cs || p->cfg.k_dim > 1024 || p->cfg.v_dim > 1024 || H <= 0 || n_heads % H) return 0;
    return vkb_arrays_on_device(s, p, layer);
}

/* The tokens of a call over their sequences' pages: first[i] = the first token of token i's
 * sequence (the block table is shared), reach[i] = the positions its sequence reads in this call,
 * hbase[i] = where the sums of the sequence's owner (with hashing: the first token with that reach)
 * start, -1 for the others; n_ent = block-table entries of the distinct sequences, n_sums = sums
 * (sums_per_slot per page slot of each owner), max_lim = the largest pos + 1. */
void vkb_call_reach(int n, kiln_kv_seq *const *seq, const int *pos, int pt, int hashing, size_t sums_per_slot, int *first, int *reach,
                    int64_t *hbase, size_t *n_ent, size_t *n_sums, int *max_lim) {
    *n_ent = *n_sums = 0;
    *max_lim = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (seq[k] != seq[i]) k++;
        first[i] = k;
        if (k == i) {
            reach[i] = 0;
            for (int j = i; j < n; j++)
                if (seq[j] == seq[i] && pos[j] + 1 > reach[i]) reach[i] = pos[j] + 1;
            *n_ent += (size_t)((reach[i] + pt - 1) / pt);
        } else reach[i] = reach[k];
        if (pos[i] + 1 > *max_lim) *max_lim = pos[i] + 1;
    }
    for (int i = 0; i < n; i++) {
        int owner = hashing && pos[i] + 1 == reach[i];
        for (int j = first[i]; owner && j < i; j++) owner = !(seq[j] == seq[i] && pos[j] + 1 == reach[i]);
        hbase[i] = owner ? (int64_t)*n_sums : -1;
        if (owner) *n_sums += (size_t)((reach[i] + pt - 1) / pt) * sums_per_slot;
    }
}

/* Records the attention of the n tokens: one dispatch of kv_attend (and one of kv_merge when the
 * context is split); with KV integrity on a pool of whole-word rows, the shader also hashes the
 * pages it reads (ah->hs; checked by vk_kv_attend after the flush). -1 when something cannot be
 * bound (the caller computes on the host). */
static int record_attend(vk_state *s, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *q,
                         int n_heads, float scale, float *out, att_hash *ah) {
    const int H = p->cfg.n_kv_heads, kd = p->cfg.k_dim, vd = p->cfg.v_dim, pt = p->cfg.page_tokens;
    const int dyn = p->dscale != NULL, nk = p->cfg.v_shares_k ? 1 : 2;
    const uint32_t stride = dyn ? 1u + 2u * (uint32_t)H : 1u;
    const int hashing = kiln_kv_integ_fusable(p);
    size_t n_keys = 0;
    const uint32_t *keys = hashing ? kiln_kv_integ_hash_keys(p, &n_keys) : NULL;
    int *first = malloc((size_t)n * sizeof *first), *reach = malloc((size_t)n * sizeof *reach);
    ah->hbase = malloc((size_t)n * sizeof *ah->hbase);
    ah->hs = NULL;
    if (!first || !reach || !ah->hbase) { free(first); free(reach); return -1; }
    size_t n_ent = 0, n_sums = 0;
    int max_lim = 0;
    vkb_call_reach(n, seq, pos, pt, hashing, (size_t)H * 2, first, reach, ah->hbase, &n_ent, &n_sums, &max_lim);
    /* table: [3n token words | entries of each distinct sequence | 2H static factors | hash keys] */
    const size_t words = 3 * (size_t)n + n_ent * stride + 2 * (size_t)H + n_keys;
    uint32_t *tab = malloc(words * sizeof *tab);
    uint32_t *ent_start = malloc((size_t)n * sizeof *ent_start);
    if (n_sums) ah->hs = calloc(n_sums, sizeof *ah->hs);
    if (!tab || !ent_start || (n_sums && !ah->hs)) { free(tab); free(ent_start); free(first); free(reach); return -1; }
    uint32_t ne = 0;
    const float *dbase = dyn ? p->dscale + (size_t)layer * (size_t)p->n_pages * (size_t)nk * (size_t)H : NULL;
    for (int i = 0; i < n; i++) {
        if (first[i] < i) { ent_start[i] = ent_start[first[i]]; continue; }
        ent_start[i] = ne;
        uint32_t *e = tab + 3 * (size_t)n + ne;
        const int slots = (reach[i] + pt - 1) / pt;
        for (int sl = 0; sl < slots; sl++, e += stride) {
            const int32_t pg = sl < seq[i]->n_pages ? seq[i]->pages[sl] : -1;
            e[0] = pg >= 0 && pg < p->n_pages ? (uint32_t)pg : UINT32_MAX;
            for (int h = 0; dyn && h < H; h++) {
                const float ks = e[0] == UINT32_MAX ? 0.0f : dbase[((size_t)pg * (size_t)nk) * (size_t)H + (size_t)h];
                const float vs = e[0] == UINT32_MAX ? 0.0f : dbase[((size_t)pg * (size_t)nk + (size_t)(nk - 1)) * (size_t)H + (size_t)h];
                memcpy(&e[1 + 2 * h], &ks, 4);
                memcpy(&e[2 + 2 * h], &vs, 4);
            }
        }
        ne += (uint32_t)slots * stride;
    }
    for (int i = 0; i < n; i++) {
        tab[3 * i] = ent_start[i];
        tab[3 * i + 1] = (uint32_t)(pos[i] + 1);
        tab[3 * i + 2] = ah->hbase[i] >= 0 ? (uint32_t)ah->hbase[i] : UINT32_MAX;
    }
    free(ent_start);
    free(first);
    free(reach);
    const uint32_t sc_off = 3u * (uint32_t)n + ne, key_off = sc_off + 2u * (uint32_t)H;
    for (int h = 0; h < H; h++) {
        const float ks = p->k_scale ? p->k_scale[(size_t)layer * H + h] : 1.0f, vs = p->v_scale ? p->v_scale[(size_t)layer * H + h] : 1.0f;
        memcpy(&tab[sc_off + 2 * h], &ks, 4);
        memcpy(&tab[sc_off + 2 * h + 1], &vs, 4);
    }
    if (n_keys) memcpy(tab + key_off, keys, n_keys * sizeof *tab);
    /* context splits (flash-decoding) when the query rows alone would leave a GPU mostly idle: about
     * 256 workgroups, splits of at least 64 positions from 128 on; a split is whole 64-position
     * blocks and whole pages (one workgroup owns each page's hash sums). (Was: 256 positions a split
     * from 512 on. On an H200 the 1.7B shape decoded at 145-152 tok/s at 512 positions of context,
     * two splits of 24 heads, and at 185 tok/s at 4,000, eleven splits: a workgroup's blocks run one
     * after another, so a long split is latency.) */
    const int rows = n * n_heads;
    int splits = 1;
    if (rows < 256 && max_lim >= 128) {
        splits = (256 + rows - 1) / rows;
        if (splits > max_lim / 64) splits = max_lim / 64;
        if (splits < 1) splits = 1;
    }
    int64_t unit = 64;
    while (unit % pt) unit += 64; /* lcm(64, page_tokens) */
    const int64_t per = ((max_lim + splits - 1) / splits + unit - 1) / unit * unit;
    if (per > UINT32_MAX) { free(tab); return -1; }
    if (splits > 1) { /* the partials' buffer, grown before anything is staged: growing runs what is recorded */
        const size_t need = (size_t)rows * (size_t)splits * (size_t)(vd + 2) * sizeof(float);
        if (need > s->max_range) { free(tab); return -1; }
        if (s->att_part.size < need) {
            /* grown once for any split count of these rows (at most rows + 255 partial rows): a growth
             * submits what the step recorded so far, and the splits grow with the context */
            const size_t cap = (size_t)(rows + 255) * (size_t)(vd + 2) * sizeof(float);
            if (vkb_flush(s) != 0) { free(tab); return -1; } /* recorded dispatches may still use the old one */
            kiln_vk_buf_destroy(s->vk, &s->att_part);
            if (kiln_vk_buf_create(s->vk, cap > need && cap <= s->max_range ? cap : need, 0, &s->att_part) != KILN_OK) {
                free(tab);
                vkb_fail_once(s, "attention scratch");
                return -1;
            }
        }
    }
    vref qr, orr, tr, hr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0};
    int ok = vkb_resolve(s, q, (size_t)rows * (size_t)kd * sizeof(float), 0, &qr) == 0 &&
             vkb_resolve(s, out, (size_t)rows * (size_t)vd * sizeof(float), 1, &orr) == 0 && vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!n_sums || vkb_stage(s, ah->hs, n_sums * sizeof *ah->hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)n_heads > s->max_gx || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return -1;
    kiln_vk_bind part = orr.b;
    if (splits > 1) part = (kiln_vk_bind){s->att_part.buf, 0, VK_WHOLE_SIZE};
    const size_t page_k = kiln_kv_page_k_at(p, layer), page_v = p->cfg.v_shares_k ? page_k : p->page_v;
    const att_push pc = {.kaddr = vkb_device_address(s, p->k[layer], 1), .vaddr = vkb_device_address(s, p->v[layer], 1),
                         .page_k = (uint32_t)page_k, .page_v = (uint32_t)page_v,
                         .head_k = (uint32_t)kiln_kv_head_k_at(p, layer), .head_v = (uint32_t)(p->cfg.v_shares_k ? kiln_kv_head_k_at(p, layer) : p->head_v),
                         .row_k = (uint32_t)kiln_kv_row_k_at(p, layer), .row_v = (uint32_t)(p->cfg.v_shares_k ? kiln_kv_row_k_at(p, layer) : p->row_v),
                         .pt = (uint32_t)pt, .k_dim = (uint32_t)kd, .v_dim = (uint32_t)vd, .n_heads = (uint32_t)n_heads,
                         .group = (uint32_t)(n_heads / H), .splits = (uint32_t)splits, .chunk = (uint32_t)per, .q_off = qr.off, .o_off = orr.off,
                         .ent_off = 3u * (uint32_t)n, .ent_stride = stride, .sc_off = sc_off, .n_pages = (uint32_t)p->n_pages, .scale = scale,
                         .hash = hashing ? (uint32_t)nk : 0u, .key_off = key_off, .kv_heads = (uint32_t)H};
    const kiln_vk_shader sh = p->cfg.dtype == KILN_KV_FP8 ? KILN_VK_SH_kv_attend_fp8 : p->cfg.dtype == KILN_KV_BF16 ? KILN_VK_SH_kv_attend_bf16
                                                                                                                  : KILN_VK_SH_kv_attend_f32;
    const kiln_vk_bind b[5] = {qr.b, part, tr.b, {s->lut.buf, 0, VK_WHOLE_SIZE}, hr.b};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)n_heads, (uint32_t)n, (uint32_t)splits) != KILN_OK) {
        vkb_fail_once(s, "attention dispatch");
        return -1;
    }
    if (splits > 1) {
        const merge_push mp = {(uint32_t)n_heads, (uint32_t)vd, (uint32_t)splits, orr.off};
        const kiln_vk_bind mb[2] = {part, orr.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_merge, mb, 2, &mp, sizeof mp, (uint32_t)n_heads, (uint32_t)n, 1) != KILN_OK) {
            vkb_fail_once(s, "attention merge dispatch");
            return -1;
        }
    }
    return 0;
}

/* The seals of what the shaders read since the last flush, compared with the sums they computed:
 * one comparison task per (hashed attention, owner token's sequence, KV head), spread over the
 * backend's host threads (kiln_kv_integ_check_sums is thread-safe: the CPU backend's attention
 * tasks call it concurrently). The comparisons run after the device has finished and before the
 * step's logits are returned: on one host thread they were 1.0 ms of a 9 ms decode step at 4,000
 * positions on an H200 (16 layers × 8 KV heads × 250 pages × K, V: 64,000 seals). */
typedef struct {
    const att_check *checks;
    const int32_t (*task)[2]; /* [check, token] of each owner token */
    int H;                    /* the most KV heads of the checks' pools: task t is (t / H, head t % H) */
} check_job;

/* Token i's sequence (an owner: hbase[i] ≥ 0), KV head h of check c: slot sl's [K, V] sums at
 * hs[hbase + (sl·H + h)·2]. */
static void check_head(const att_check *c, int i, int h) {
    const int H = c->p->cfg.n_kv_heads;
    if (h < H) kiln_kv_integ_check_sums(c->p, &c->call, c->layer, c->seq[i], h, c->pos[i] + 1, c->ah.hs + c->ah.hbase[i] + 2 * (size_t)h, 2 * (size_t)H);
}

static void check_one(void *arg, int64_t t) {
    const check_job *j = arg;
    const int64_t pair = t / j->H;
    check_head(&j->checks[j->task[pair][0]], j->task[pair][1], (int)(t % j->H));
}

void vkb_check_all(const att_check *checks, int n_checks, int threads) {
    size_t n_pairs = 0;
    int H = 1;
    for (int k = 0; k < n_checks; k++) {
        for (int i = 0; i < checks[k].n; i++) n_pairs += checks[k].ah.hbase[i] >= 0;
        if (checks[k].p->cfg.n_kv_heads > H) H = checks[k].p->cfg.n_kv_heads;
    }
    int32_t(*task)[2] = malloc((n_pairs ? n_pairs : 1) * sizeof *task);
    if (!task) { /* no memory for the task list: the same comparisons on this thread */
        for (int k = 0; k < n_checks; k++)
            for (int i = 0; i < checks[k].n; i++)
                for (int h = 0; checks[k].ah.hbase[i] >= 0 && h < H; h++) check_head(&checks[k], i, h);
        return;
    }
    size_t m = 0;
    for (int k = 0; k < n_checks; k++)
        for (int i = 0; i < checks[k].n; i++)
            if (checks[k].ah.hbase[i] >= 0) {
                task[m][0] = k;
                task[m][1] = i;
                m++;
            }
    check_job j = {checks, (const int32_t(*)[2])task, H};
    kiln_pool_for((int64_t)n_pairs * H, check_one, &j, threads);
    free(task);
}

/* ---- the KV store on the device (kv_store.comp) --------------------------------------------------- */
typedef struct {
    uint64_t kaddr, vaddr;
    uint32_t page_k, head_k, row_k, page_v, head_v, row_v;
    uint32_t k_dim, v_dim, kv_heads, kinds;
    uint32_t k_tok, v_tok, k_off, v_off;
    uint32_t sc_off, key_off, hash, mu_off;
} store_push;
_Static_assert(sizeof(store_push) <= KILN_VK_PUSH_BYTES, "kv_store push constants");

/* Whether the shader stores this pool's rows: its arrays device-addressable, a plain layout whose
 * rows are exactly the converted values in whole 32-bit words (F32, BF16, FP8 with static scales
 * and post-RoPE K smoothing: not DSA's compact rows, not pre-RoPE smoothing (a rotated mean per
 * position), not dynamic page scales, which re-quantize a page's rows when they grow). KV integrity on: every token a plain append (kiln_kv_integ_store_appends);
 * the rest — a rewrite after a rollback, a detection to handle — stores on the host. */
static int store_on_device(vk_state *s, kiln_kv_pool *p, int layer, kiln_kv_seq *const *seq, const int *pos, int n) {
    const kiln_kv_config *c = &p->cfg;
    if (s->failed || !kiln_vk_has_bda(s->vk) || p->dscale || p->rope_cs) return 0;
    if (p->dsa_key_at) { /* DSA's compact rows (kv_store_dsa.comp): whole words by construction (kv.c checks the sizes) */
        if (kiln_kv_row_k_at(p, layer) % 4 || !vkb_arrays_on_device(s, p, layer) || (p->integ && !kiln_kv_integ_fusable(p))) return 0;
        return !p->integ || kiln_kv_integ_store_appends(p, seq, pos, n, layer);
    }
    if (p->k_mean && (c->dtype != KILN_KV_FP8 || c->v_shares_k)) return 0; /* key means: FP8 K arrays only (kv.c has_kmean) */
    if (c->dtype != KILN_KV_F32 && c->dtype != KILN_KV_BF16 && c->dtype != KILN_KV_FP8) return 0;
    const size_t rk = kiln_kv_row_k_at(p, layer), rv = c->v_shares_k ? rk : p->row_v, eb = p->elem_bytes;
    if (rk != (size_t)c->k_dim * eb || (!c->v_shares_k && rv != (size_t)c->v_dim * eb) || (rk & 3) || (rv & 3)) return 0;
    if (c->n_kv_heads <= 0 || !vkb_arrays_on_device(s, p, layer)) return 0;
    if (p->integ && !kiln_kv_integ_fusable(p)) return 0;
    return !p->integ || kiln_kv_integ_store_appends(p, seq, pos, n, layer);
}

/* Records the store of the n tokens (one dispatch; with KV integrity the shader hashes each row it
 * writes into *hs, [n][kinds][KV heads], and leaves unwritten the row of an armed lost write,
 * pend[i].lost). -1 when something cannot be bound. */
/* The store shaders' token words: token i's page at tab[3i] (UINT32_MAX: none of the pool), its
 * row in the page at [3i + 1], the unit of its armed lost write at [3i + 2] (UINT32_MAX: none). */
static void store_token_words(const kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, const kiln_kv_integ_pending *pend,
                              uint32_t *tab) {
    const int pt = p->cfg.page_tokens;
    for (int i = 0; i < n; i++) {
        const int slot = pos[i] / pt;
        const int32_t pg = pos[i] >= 0 && slot < seq[i]->n_pages ? seq[i]->pages[slot] : -1;
        tab[3 * i] = pg >= 0 && pg < p->n_pages ? (uint32_t)pg : UINT32_MAX;
        tab[3 * i + 1] = (uint32_t)(pos[i] % pt);
        tab[3 * i + 2] = pend && pend[i].lost >= 0 ? (uint32_t)pend[i].lost : UINT32_MAX;
    }
}

/* Records the store of n DSA compact rows (kv_store_dsa.comp; with KV integrity each row's hash into
 * (*hs)[i]). -1 when something cannot be bound. */
static int record_store_dsa(vk_state *s, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer, const float *k, int64_t k_tok,
                            const kiln_kv_integ_pending *pend, uint64_t **hs) {
    const kiln_kv_config *c = &p->cfg;
    const int hashing = p->integ != NULL;
    size_t n_keys = 0;
    const uint32_t *keys = hashing ? kiln_kv_integ_hash_keys(p, &n_keys) : NULL;
    const size_t words = 3 * (size_t)n + n_keys;
    uint32_t *tab = malloc(words * sizeof *tab);
    *hs = hashing ? calloc((size_t)n, sizeof **hs) : NULL;
    if (!tab || (hashing && !*hs)) { free(tab); return -1; }
    store_token_words(p, seq, pos, n, pend, tab);
    if (n_keys) memcpy(tab + 3 * (size_t)n, keys, n_keys * sizeof *tab);
    const int has_key = kiln_kv_dsa_has_key(c, layer);
    const size_t xbytes = ((size_t)(n - 1) * (size_t)k_tok + (size_t)(c->dsa_latent + c->dsa_rope + (has_key ? c->dsa_key : 0))) * sizeof(float);
    vref xr, tr, hr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0};
    int ok = vkb_resolve(s, k, xbytes, 0, &xr) == 0 && vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!hashing || vkb_stage(s, *hs, (size_t)n * sizeof **hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)n > s->max_gx) return -1;
    const struct {
        uint64_t kaddr;
        uint32_t page_k, row_k;
        uint32_t lat, rope, key, rope_bf16;
        uint32_t x_tok, x_off;
        uint32_t key_off, hash;
    } pc = {vkb_device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer), (uint32_t)c->dsa_latent,
            (uint32_t)c->dsa_rope, has_key ? (uint32_t)c->dsa_key : 0u, c->dtype == KILN_KV_BF16, (uint32_t)k_tok, xr.off, 3u * (uint32_t)n,
            (uint32_t)hashing};
    const kiln_vk_bind b[4] = {xr.b, xr.b, tr.b, hr.b};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_store_dsa, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) != KILN_OK) {
        vkb_fail_once(s, "KV store dispatch");
        return -1;
    }
    return 0;
}

static int record_store(vk_state *s, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer, const float *k, int64_t k_tok,
                        const float *v, int64_t v_tok, const kiln_kv_integ_pending *pend, uint64_t **hs) {
    const kiln_kv_config *c = &p->cfg;
    if (p->dsa_key_at) return record_store_dsa(s, p, seq, pos, n, layer, k, k_tok, pend, hs);
    const int H = c->n_kv_heads, nk = c->v_shares_k ? 1 : 2, hashing = p->integ != NULL;
    size_t n_keys = 0;
    const uint32_t *keys = hashing ? kiln_kv_integ_hash_keys(p, &n_keys) : NULL;
    if (!v || c->v_shares_k) { v = k; v_tok = k_tok; }
    /* table: [3n token words | 2H FP8 factors | hash keys | the layer's key means, H × k_dim]; the
     * factors and means read after the integrity checks of the stores' begin (a corrupted static
     * scale or mean is restored before it is used) */
    const size_t n_mu = p->k_mean ? (size_t)H * (size_t)c->k_dim : 0;
    const size_t words = 3 * (size_t)n + 2 * (size_t)H + n_keys + n_mu;
    uint32_t *tab = malloc(words * sizeof *tab);
    *hs = hashing ? calloc((size_t)n * (size_t)nk * (size_t)H, sizeof **hs) : NULL;
    if (!tab || (hashing && !*hs)) { free(tab); return -1; }
    store_token_words(p, seq, pos, n, pend, tab);
    const uint32_t sc_off = 3u * (uint32_t)n, key_off = sc_off + 2u * (uint32_t)H;
    for (int h = 0; h < H; h++) {
        float fk = 1.0f, fv = 1.0f;
        if (c->dtype == KILN_KV_FP8) {
            fk = 1.0f / p->k_scale[(size_t)layer * H + h];
            fv = c->v_shares_k ? fk : 1.0f / p->v_scale[(size_t)layer * H + h];
        }
        memcpy(&tab[sc_off + 2 * h], &fk, 4);
        memcpy(&tab[sc_off + 2 * h + 1], &fv, 4);
    }
    if (n_keys) memcpy(tab + key_off, keys, n_keys * sizeof *tab);
    const uint32_t mu_off = n_mu ? key_off + (uint32_t)n_keys : 0u;
    if (n_mu) memcpy(tab + mu_off, p->k_mean + (size_t)layer * n_mu, n_mu * sizeof *tab);
    const size_t kbytes = ((size_t)(n - 1) * (size_t)k_tok + (size_t)H * (size_t)c->k_dim) * sizeof(float);
    const size_t vbytes = ((size_t)(n - 1) * (size_t)v_tok + (size_t)H * (size_t)(c->v_shares_k ? c->k_dim : c->v_dim)) * sizeof(float);
    vref kr, vr, tr, hr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0};
    int ok = vkb_resolve(s, k, kbytes, 0, &kr) == 0 && vkb_resolve(s, v, vbytes, 0, &vr) == 0 && vkb_stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!hashing || vkb_stage(s, *hs, (size_t)n * (size_t)nk * (size_t)H * sizeof **hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)(nk * H) > s->max_gx || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return -1;
    const size_t page_k = kiln_kv_page_k_at(p, layer);
    const store_push pc = {.kaddr = vkb_device_address(s, p->k[layer], 1), .vaddr = vkb_device_address(s, p->v[layer], 1),
                           .page_k = (uint32_t)page_k, .head_k = (uint32_t)kiln_kv_head_k_at(p, layer), .row_k = (uint32_t)kiln_kv_row_k_at(p, layer),
                           .page_v = (uint32_t)(c->v_shares_k ? page_k : p->page_v), .head_v = (uint32_t)(c->v_shares_k ? kiln_kv_head_k_at(p, layer) : p->head_v),
                           .row_v = (uint32_t)(c->v_shares_k ? kiln_kv_row_k_at(p, layer) : p->row_v),
                           .k_dim = (uint32_t)c->k_dim, .v_dim = (uint32_t)(c->v_shares_k ? c->k_dim : c->v_dim), .kv_heads = (uint32_t)H,
                           .kinds = (uint32_t)nk, .k_tok = (uint32_t)k_tok, .v_tok = (uint32_t)v_tok, .k_off = kr.off, .v_off = vr.off,
                           .sc_off = sc_off, .key_off = key_off, .hash = (uint32_t)hashing, .mu_off = mu_off};
    const kiln_vk_shader sh = c->dtype == KILN_KV_FP8 ? KILN_VK_SH_kv_store_fp8 : c->dtype == KILN_KV_BF16 ? KILN_VK_SH_kv_store_bf16
                                                                                                          : KILN_VK_SH_kv_store_f32;
    const kiln_vk_bind b[4] = {kr.b, vr.b, tr.b, hr.b};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, sh, b, 4, &pc, sizeof pc, (uint32_t)(nk * H), (uint32_t)n, 1) != KILN_OK) {
        vkb_fail_once(s, "KV store dispatch");
        return -1;
    }
    return 0;
}

/* The KV store on the device where store_on_device says so: the rows are written by the step's
 * recording, no submit of its own — the layer's attention follows in the same command buffer.
 * KV integrity: the stores' bookkeeping now, their seals from the shader's row hashes at the flush
 * that runs them (before the attentions' checks of that flush). Otherwise the host stores. */
void vk_kv_store(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer, const float *k, int64_t k_tok,
                 const float *v, int64_t v_tok) {
    vk_state *s = ST(be);
    if (n <= 0) return;
    if (!store_on_device(s, p, layer, seq, pos, n)) {
        vkb_host_first(s);
        kiln_backend_cpu_ops.kv_store(be, p, seq, pos, n, layer, k, k_tok, v, v_tok);
        return;
    }
    st_seal c = {p, layer, n, NULL, NULL, NULL, NULL};
    if (p->integ) {
        c.seq = malloc((size_t)n * sizeof *c.seq);
        c.pos = malloc((size_t)n * sizeof *c.pos);
        c.pend = malloc((size_t)n * sizeof *c.pend);
        if (!c.seq || !c.pos || !c.pend || vkb_grow((void **)&s->seals, &s->cap_seals, s->n_seals + 1, sizeof *s->seals)) {
            st_seal_free(&c);
            vkb_host_first(s);
            kiln_backend_cpu_ops.kv_store(be, p, seq, pos, n, layer, k, k_tok, v, v_tok);
            return;
        }
        memcpy(c.seq, seq, (size_t)n * sizeof *c.seq);
        memcpy(c.pos, pos, (size_t)n * sizeof *c.pos);
        for (int i = 0; i < n; i++) kiln_kv_integ_store_begin(p, seq[i], layer, pos[i], &c.pend[i]);
    }
    const int ok = record_store(s, p, seq, pos, n, layer, k, k_tok, v, v_tok, c.pend, &c.hs) == 0;
    for (int i = 0; ok && i < n; i++) {
        const int slot = pos[i] / p->cfg.page_tokens;
        const int32_t pg = slot < seq[i]->n_pages ? seq[i]->pages[slot] : -1;
        if (pos[i] % p->cfg.page_tokens == p->cfg.page_tokens - 1 && layer == p->cfg.n_layers - 1 && pg >= 0 && pg < p->n_pages)
            p->pages[pg].flags |= KILN_KV_PAGE_SEALED;
    }
    if (ok && p->integ) s->seals[s->n_seals++] = c; /* sealed (or undone) at the flush that runs it */
    if (ok && vkb_done(s) == 0) return;
    /* not recorded: its bookkeeping undone (the host stores it below); recorded but the flush
     * failed: undone there */
    for (int i = n - 1; !ok && p->integ && i >= 0; i--) kiln_kv_integ_store_undo(p, seq[i], layer, &c.pend[i]);
    abandon(s); /* runs what was recorded, copybacks into c.hs included, before it is freed */
    if (!ok) st_seal_free(&c);
    kiln_backend_cpu_ops.kv_store(be, p, seq, pos, n, layer, k, k_tok, v, v_tok);
}
/* Attention on the device where the pool's pages are device-addressable (attend_on_device). KV
 * integrity: the shader hashes the pages as it reads them and the host compares the sums with the
 * seals right after the flush, before this op returns (kiln_kv_integ_check_sums: the detections of
 * the cpu backend's fused check; in heal / strict mode the caller discards the step of a sequence
 * that failed); pools whose rows are not whole words are verified on the host first
 * (kiln_kv_verify_attend_cx). Other pools: the cpu backend's kernels. */
void vk_kv_attend(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *q,
                  int n_heads, float scale, float *out) {
    vk_state *s = ST(be);
    if (n <= 0) return;
    if (!attend_on_device(s, p, layer, n_heads)) {
        vkb_host_first(s);
        kiln_backend_cpu_ops.kv_attend(be, p, layer, n, seq, pos, q, n_heads, scale, out);
        return;
    }
    const int fused = kiln_kv_integ_fusable(p);
    if (p->integ && !fused) kiln_kv_verify_attend_cx(&be->cx, p, layer, n, seq, pos); /* rows of partial words: hashed on the host first */
    att_hash ah = {NULL, NULL};
    /* hashed: the seals are compared at the flush that runs the dispatch (the step's end at the
     * latest, before its logits are returned), against this call's integrity state */
    if (fused) kiln_kv_integ_begin_attend(p, layer, n, seq, pos);
    int ok = record_attend(s, p, layer, n, seq, pos, q, n_heads, scale, out, &ah) == 0;
    if (ok && fused) {
        att_check c = {p, layer, n, malloc((size_t)n * sizeof *c.seq), malloc((size_t)n * sizeof *c.pos), ah, {0, 0}};
        kiln_kv_integ_call_state(p, &c.call);
        ok = c.seq && c.pos && vkb_grow((void **)&s->checks, &s->cap_checks, s->n_checks + 1, sizeof *s->checks) == 0;
        if (ok) {
            memcpy(c.seq, seq, (size_t)n * sizeof *c.seq);
            memcpy(c.pos, pos, (size_t)n * sizeof *c.pos);
            s->checks[s->n_checks++] = c;
        } else {
            free(c.seq);
            free(c.pos);
        }
    }
    if (ok && !fused) free(ah.hbase); /* no sums (hs is NULL): nothing of it is pending */
    if (ok && vkb_done(s) == 0) return;
    abandon(s); /* runs what was recorded, copybacks into ah.hs included, before ah is freed */
    if (!ok) {
        free(ah.hs);
        free(ah.hbase);
    }
    kiln_backend_cpu_ops.kv_attend(be, p, layer, n, seq, pos, q, n_heads, scale, out);
}

