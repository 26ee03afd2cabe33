/* backend_vulkan.c — the vulkan backend: the forward pass's ops as SPIR-V compute dispatches on one
 * Vulkan device (vk_device.h), tested on Mesa's lavapipe in `make test` and run unchanged on GPUs.
 * This file: the backend's buffers, staging and flush, the weights, matmul, the element-wise ops,
 * norms and RoPE, the ops table and the lifetime; vk_attend.c (attention, KV store), vk_moe.c (MoE)
 * and vk_dsa.c (sparse attention) share its machinery through vk_internal.h.
 *
 * What runs where (docs/VULKAN.md):
 *   device   matmul / matmul_many / matmul_heads / grouped MoE experts for F32, F16, BF16, FP8 block,
 *            INT4 group, Q8_0, Q4_0 and every GGUF block quant kiln reads (Q4_K / Q5_K / Q6_K / Q2_K / Q3_K /
 *            IQ4_XS / Q4_1 / Q5_0 / Q5_1 / IQ4_NL, dequantized in registers), RMSNorm, LayerNorm, RoPE, add,
 *            bias, SwiGLU, the routed MoE layer (routing, by-id matmuls, combine), attention over the
 *            KV pool's pages and the KV store (the pages read and written where they lie, through
 *            buffer device addresses, with the KV integrity hashes of what is read / written), DSA's
 *            indexer and sparse attention;
 *   host     through the cpu backend's kernels on the same buffers: embedding rows, the RoPE table,
 *            argmax, the stand-alone moe_route op, and any op whose shape or layout a
 *            shader does not take.
 * That split works because every buffer kiln_be_alloc hands out is host-visible device memory,
 * mapped for the buffer's life: the host-side ops read and write the same bytes the shaders do.
 *
 * Weights are uploaded once, at their first use, into device-local buffers (row-major, as
 * checkpoints store them: a weight kiln tiled for the CPU kernels is gathered back into row order),
 * in chunks of whole rows no larger than the device's maxStorageBufferRange (128 MiB on lavapipe)
 * and starting at a multiple of 128 rows (the FP8 scale blocks). The cache is keyed by the weight's
 * data pointer, shape and format, plus a fingerprint of 3 × 64 sampled bytes checked at every use,
 * so that a weight freed and another allocated at the same address is not served stale.
 *
 * Every op records its dispatches into the step's command buffer. Outside a deferred step it is
 * submitted and waited for at once; inside one (backend.h kiln_be_defer) what was recorded runs at
 * the next flush — a host-side op, which must see finished results, kiln_be_wait / kiln_be_end —
 * so a decode step is one submit, and a step of the same shape replays its recorded command
 * buffer (vk_device.c). Pointers an op gets that kiln_be_alloc did
 * not hand out (norm weights, biases, callers' own arrays) are staged through a host-visible arena
 * and copied back after the flush when the op writes them.
 *
 * Failure: when a dispatch or submit fails (device lost, out of memory), the backend reports it
 * once on stderr, marks itself failed and computes that op and every later one on the host. */
#include "backend/vulkan/vk_internal.h"

/* ---- growable arrays ------------------------------------------------------------------------------ */
int vkb_grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

void vkb_fail_once(vk_state *s, const char *op) {
    if (!s->failed) fprintf(stderr, "kiln: %s: %s failed (%s); computing on the host from now on\n", kiln_vk_device_name(s->vk), op, kiln_last_error());
    s->failed = 1;
    if (s->defer_depth > 0) s->lost = 1; /* what the step recorded so far may never run */
}

/* ---- buffers ------------------------------------------------------------------------------------- */
/* The buffer list is locked (allocs_mu): kiln_be_alloc / kiln_be_free may come from another
 * thread than the one computing (a request's MTP drafter freed where its last reference drops),
 * as the cpu backend's malloc / free may. */
static void *alloc_mapped(vk_state *s, size_t bytes, int zero, int where) {
    vk_alloc a = {0};
    if (kiln_vk_buf_create(s->vk, bytes ? bytes : 64, where, &a.b) != KILN_OK || !a.b.map) {
        kiln_vk_buf_destroy(s->vk, &a.b);
        return NULL;
    }
    a.p = a.b.map;
    a.size = bytes;
    a.addr = kiln_vk_buf_address(s->vk, &a.b);
    if (zero) memset(a.p, 0, bytes);
    pthread_mutex_lock(&s->allocs_mu);
    const int ok = vkb_grow((void **)&s->allocs, &s->cap_allocs, s->n_allocs + 1, sizeof *s->allocs) == 0;
    if (ok) s->allocs[s->n_allocs++] = a;
    pthread_mutex_unlock(&s->allocs_mu);
    if (!ok) {
        kiln_vk_buf_destroy(s->vk, &a.b);
        return NULL;
    }
    return a.p;
}

/* Activations: in mapped device-local memory on a discrete GPU whose whole memory is mappable
 * (KILN_VK_ACTIVATIONS=device, the default there), else host-visible host memory (=host; lavapipe,
 * integrated GPUs: the same memory either way). Measured on an H200 (docs/BENCHMARKS.md): with
 * activations in host memory every shader's reads of them cross PCIe — a 3,072-float RMSNorm took
 * 67 us. The host still writes them where an op runs on the host (writes to mapped VRAM are
 * posted); what it reads after each step comes from alloc_readback. */
static void *vk_be_alloc(const kiln_backend *be, size_t bytes) { return alloc_mapped(ST(be), bytes, 1, ST(be)->act_where); }
static void *vk_be_alloc_readback(const kiln_backend *be, size_t bytes) { return alloc_mapped(ST(be), bytes, 1, 1); }

/* A KV pool's layer array (backend.h kv_alloc): a host-visible buffer with a device address, which
 * the attention shader reads in place and the host-side KV ops (store with its seal, integrity
 * checks, prefix sharing) read and write through the mapping. Not zeroed: the pool writes every
 * position before anything reads it, and zeroing would commit the whole pool's memory at once.
 * NULL (the pool then takes host memory and attention over it runs on the host) without buffer
 * device addresses or when the device cannot give one allocation of that size. */
static void *vk_kv_alloc(const kiln_backend *be, size_t bytes) {
    vk_state *s = ST(be);
    if (!kiln_vk_has_bda(s->vk) || s->failed) return NULL;
    /* whole words: the shader reads a row's last byte in its word; device-local where it can be
     * mapped (the attention and store shaders read and write it every step) */
    void *p = alloc_mapped(s, (bytes + 3) & ~(size_t)3, 0, KILN_VK_MEM_MAPPED_NEAR);
    if (!p && !s->kv_host_said) {
        fprintf(stderr, "kiln: %s: a KV layer array of %zu bytes does not fit on the device (%s); such layers keep their KV in host memory "
                        "and attend on the host\n", kiln_vk_device_name(s->vk), bytes, kiln_last_error());
        s->kv_host_said = 1;
    }
    return p;
}

static void vk_be_free(const kiln_backend *be, void *p) {
    if (!p) return;
    vk_state *s = ST(be);
    kiln_vk_buf b = {0};
    pthread_mutex_lock(&s->allocs_mu);
    for (int i = 0; i < s->n_allocs; i++)
        if (s->allocs[i].p == p) {
            b = s->allocs[i].b;
            s->allocs[i] = s->allocs[--s->n_allocs];
            break;
        }
    pthread_mutex_unlock(&s->allocs_mu);
    if (b.buf) kiln_vk_buf_destroy(s->vk, &b);
}



int vkb_stage(vk_state *s, const void *ptr, size_t bytes, int written, vref *r) {
    const size_t need = (bytes + s->align + 3) & ~(size_t)3;
    if (need > s->max_range) return -1;
    /* a range a recorded dispatch still writes back (deferred step): copying it now would take
     * the host's stale bytes. What is recorded runs first — safe while no operand staged for the
     * dispatch being prepared waits to be used (a flush resets the staging); otherwise the op runs
     * on the host (abandon flushes first) */
    for (int i = 0; i < s->n_cb; i++) {
        const uint8_t *h = s->cb[i].host, *p = ptr;
        if (p < h + s->cb[i].bytes && h < p + bytes) {
            if (s->staged_any && s->staged_at == s->n_dispatch) return -1;
            if (vkb_flush(s) != 0) return -1;
            break;
        }
    }
    s->staged_any = 1;
    s->staged_at = s->n_dispatch;
    const int k = s->stage_k++;
    if (k >= s->n_slot_cap) {
        int cap = s->n_slot_cap;
        if (vkb_grow((void **)&s->slot_cap, &cap, k + 1, sizeof *s->slot_cap)) return -1;
        memset(s->slot_cap + s->n_slot_cap, 0, (size_t)(cap - s->n_slot_cap) * sizeof *s->slot_cap);
        s->n_slot_cap = cap;
    }
    if (s->slot_cap[k] < need) {
        size_t c = s->align;
        while (c < need) c *= 2;
        s->slot_cap[k] = c;
    }
    const size_t region = s->slot_cap[k];
    const int a = written ? ARENA_WRITTEN : ARENA_READ; /* the same for slot k in every step of one shape */
    if (region <= s->max_range) s->arena_need[a] += region; /* larger ones never fit one binding of the arena */
    kiln_vk_buf *buf;
    size_t at, range = region;
    if (s->arena[a].buf && s->arena_used[a] + region <= s->arena[a].size && region <= s->max_range) {
        buf = &s->arena[a];
        at = s->arena_used[a];
        s->arena_used[a] += region;
    } else {
        if (vkb_grow((void **)&s->extra, &s->cap_extra, s->n_extra + 1, sizeof *s->extra)) return -1;
        buf = &s->extra[s->n_extra];
        if (kiln_vk_buf_create(s->vk, need, written ? 1 : s->act_where, buf) != KILN_OK || !buf->map) { kiln_vk_buf_destroy(s->vk, buf); return -1; }
        s->n_extra++;
        at = 0;
        range = need;
    }
    memcpy(buf->map + at, ptr, bytes);
    if (written) {
        if (vkb_grow((void **)&s->cb, &s->cap_cb, s->n_cb + 1, sizeof *s->cb)) return -1;
        s->cb[s->n_cb++] = (vk_copyback){(void *)(uintptr_t)ptr, buf->map + at, bytes};
    }
    r->b = (kiln_vk_bind){buf->buf, at, (VkDeviceSize)range};
    r->off = 0;
    return 0;
}

/* The buffer kiln_be_alloc handed out that holds ptr (a copy in *a): 1, or 0 when none does.
 * bytes = 0: ptr inside it (or at the start of an empty one); otherwise [ptr, ptr + bytes) whole. */
int vkb_find_alloc(vk_state *s, const void *ptr, size_t bytes, vk_alloc *a) {
    const uint8_t *p = ptr;
    int found = 0;
    pthread_mutex_lock(&s->allocs_mu);
    for (int i = 0; i < s->n_allocs && !found; i++) {
        const vk_alloc *c = &s->allocs[i];
        found = p >= c->p && (bytes ? p + bytes <= c->p + c->size : p < c->p + (c->size ? c->size : 1));
        if (found) *a = *c;
    }
    pthread_mutex_unlock(&s->allocs_mu);
    return found;
}

int vkb_resolve(vk_state *s, const void *ptr, size_t bytes, int written, vref *r) {
    vk_alloc a;
    if (!vkb_find_alloc(s, ptr, 0, &a)) return vkb_stage(s, ptr, bytes, written, r);
    const size_t off = (size_t)((const uint8_t *)ptr - a.p), aligned = off / s->align * s->align, delta = off - aligned;
    size_t range = a.b.size - aligned;
    if (range > s->max_range) range = s->max_range & ~(size_t)3;
    if (delta + bytes > range || (delta & 3)) return -1;
    r->b = (kiln_vk_bind){a.b.buf, aligned, range};
    r->off = (uint32_t)(delta / 4);
    return 0;
}

/* Submits and waits, then copies staged outputs back and resets the staging. -1 on a device error. */

int vkb_flush(vk_state *s) {
    const kiln_status st = kiln_vk_flush(s->vk);
    if (st != KILN_OK) {
        vkb_fail_once(s, "submit");
        if (s->defer_depth > 0) s->lost = 1;
    }
    if (st == KILN_OK)
        for (int i = 0; i < s->n_cb; i++) memcpy(s->cb[i].host, s->cb[i].staged, s->cb[i].bytes);
    /* the stores' seals first (a step stores a layer before it attends over it), in the order the
     * stores were recorded; a failed submit: their bookkeeping undone, newest first */
    for (int k = 0; k < s->n_seals; k++) {
        st_seal *c = &s->seals[st == KILN_OK ? k : s->n_seals - 1 - k];
        const size_t per = (size_t)(c->p->cfg.v_shares_k ? 1 : 2) * (size_t)c->p->cfg.n_kv_heads;
        if (st == KILN_OK)
            for (int i = 0; i < c->n; i++) kiln_kv_integ_store_end(c->p, c->seq[i], c->layer, c->pos[i], c->hs + (size_t)i * per, &c->pend[i]);
        else
            for (int i = c->n - 1; i >= 0; i--) kiln_kv_integ_store_undo(c->p, c->seq[i], c->layer, &c->pend[i]);
    }
    for (int k = 0; k < s->n_seals; k++) st_seal_free(&s->seals[k]);
    s->n_seals = 0;
    /* the seals of what the attentions read, now that their sums are back (a failed submit: the
     * caller computes those attentions again, on the host, which verifies them itself) */
    if (st == KILN_OK && s->n_checks) vkb_check_all(s->checks, s->n_checks, s->host_threads);
    for (int i = 0; i < s->n_checks; i++) {
        att_check *c = &s->checks[i];
        free(c->seq);
        free(c->pos);
        free(c->ah.hs);
        free(c->ah.hbase);
    }
    s->n_checks = 0;
    s->n_cb = 0;
    for (int i = 0; i < s->n_extra; i++) kiln_vk_buf_destroy(s->vk, &s->extra[i]);
    s->n_extra = 0;
    for (int a = 0; a < 2; a++) {
        if (s->arena_need[a] > s->arena[a].size && s->arena_need[a] > s->arena_failed[a]) { /* the next flush's regions all in the arena (nothing recorded binds it now) */
            kiln_vk_buf bigger;
            const size_t want = s->arena_need[a] + s->arena_need[a] / 4;
            if (kiln_vk_buf_create(s->vk, want, a == ARENA_WRITTEN ? 1 : s->act_where, &bigger) == KILN_OK && bigger.map) {
                kiln_vk_buf_destroy(s->vk, &s->arena[a]);
                s->arena[a] = bigger;
            } else { /* keep the arena there is; not retried for this size or less */
                kiln_vk_buf_destroy(s->vk, &bigger);
                s->arena_failed[a] = s->arena_need[a];
            }
        }
        s->arena_used[a] = 0;
        s->arena_need[a] = 0;
    }
    s->stage_k = 0;
    s->staged_any = 0;
    return st == KILN_OK ? 0 : -1;
}

/* An op that cannot run on the device (an operand it cannot bind, a failed upload or dispatch):
 * what is recorded runs now — the earlier ops of a deferred step, and any dispatches this op
 * recorded before it failed, which only ever write its own outputs (every op resolves its in-place
 * operands before its first dispatch) — and then the host computes the whole op. */
void vkb_abandon_op(vk_state *s, const char *op) {
    if (s->n_host++ == 0 && !s->failed)
        fprintf(stderr, "kiln: %s: %s ran on the host instead of the device (an operand larger than a storage-buffer binding, "
                        "or one a pending dispatch still writes); further ones are counted, not reported\n", kiln_vk_device_name(s->vk), op);
    (void)vkb_flush(s);
}

/* The end of a device op: submitted now, or inside a deferred step left recorded. */
int vkb_done(vk_state *s) { return s->defer_depth > 0 ? 0 : vkb_flush(s); }

/* Before a host-side op: everything recorded must have run (the host reads its results and may
 * write what a recorded dispatch still has to read). */
void vkb_host_first(vk_state *s) { (void)vkb_flush(s); }

/* ---- weights ------------------------------------------------------------------------------------- */
static int fmt_on_device(kiln_wformat f) {
    switch (f) {
    case KILN_WF_F32: case KILN_WF_F16: case KILN_WF_BF16: case KILN_WF_FP8_BLOCK:
    case KILN_WF_INT4_GROUP: case KILN_WF_Q8_0: case KILN_WF_Q4_0:
    case KILN_WF_Q4_K: case KILN_WF_Q5_K: case KILN_WF_Q6_K: case KILN_WF_Q2_K: case KILN_WF_Q3_K: case KILN_WF_IQ4_XS:
    case KILN_WF_Q4_1: case KILN_WF_Q5_0: case KILN_WF_Q5_1: case KILN_WF_IQ4_NL: return 1;
    default: return 0;
    }
}

kiln_vk_shader vkb_matmul_shader(kiln_wformat f) {
    switch (f) {
    case KILN_WF_F16: return KILN_VK_SH_matmul_f16;
    case KILN_WF_BF16: return KILN_VK_SH_matmul_bf16;
    case KILN_WF_FP8_BLOCK: return KILN_VK_SH_matmul_fp8;
    case KILN_WF_INT4_GROUP: return KILN_VK_SH_matmul_int4;
    case KILN_WF_Q8_0: return KILN_VK_SH_matmul_q8_0;
    case KILN_WF_Q4_0: return KILN_VK_SH_matmul_q4_0;
    case KILN_WF_Q4_K: return KILN_VK_SH_matmul_q4_k;
    case KILN_WF_Q5_K: return KILN_VK_SH_matmul_q5_k;
    case KILN_WF_Q6_K: return KILN_VK_SH_matmul_q6_k;
    case KILN_WF_Q2_K: return KILN_VK_SH_matmul_q2_k;
    case KILN_WF_Q3_K: return KILN_VK_SH_matmul_q3_k;
    case KILN_WF_IQ4_XS: return KILN_VK_SH_matmul_iq4_xs;
    case KILN_WF_Q4_1: return KILN_VK_SH_matmul_q4_1;
    case KILN_WF_Q5_0: return KILN_VK_SH_matmul_q5_0;
    case KILN_WF_Q5_1: return KILN_VK_SH_matmul_q5_1;
    case KILN_WF_IQ4_NL: return KILN_VK_SH_matmul_iq4_nl;
    default: return KILN_VK_SH_matmul_f32;
    }
}

/* 64-bit FNV-1a over 64 bytes at the start, middle and end of the data (and the scales pointer). */
uint64_t vkb_fingerprint(const kiln_weight *w) {
    const size_t n = (size_t)w->rows * w->row_bytes;
    const size_t at[3] = {0, n / 2, n > 64 ? n - 64 : 0};
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)w->scales;
    for (int k = 0; k < 3; k++)
        for (size_t i = at[k]; i < at[k] + 64 && i < n; i++) h = (h ^ w->data[i]) * 1099511628211ull;
    return h;
}

static void weight_free(vk_state *s, vk_weight *vw) {
    s->weights_gen++;
    for (int c = 0; c < vw->n_chunks; c++) {
        kiln_vk_buf_destroy(s->vk, &vw->chunks[c].data);
        kiln_vk_buf_destroy(s->vk, &vw->chunks[c].scales);
    }
    free(vw->chunks);
    memset(vw, 0, sizeof *vw);
}

/* Uploads rows [row0, row0 + rows) of w into c: data row-major, scales as the shader reads them
 * (FP8: the chunk's scale-block rows; INT4: bf16 [rows, cols / group] in row order). */
static kiln_status upload_chunk(vk_state *s, const kiln_weight *w, int64_t row0, int64_t rows, vk_chunk *c) {
    c->row0 = row0;
    c->rows = rows;
    const size_t rb = w->row_bytes, bytes = (size_t)rows * rb;
    uint8_t *tmp = malloc(bytes + 4);
    if (!tmp) return kiln_fail(KILN_ERR_NOMEM, "vulkan: out of memory staging a weight chunk of %zu bytes", bytes);
    for (int64_t r = 0; r < rows; r++) kiln_weight_row_gather(w, row0 + r, tmp + (size_t)r * rb);
    kiln_status st = kiln_vk_buf_create(s->vk, (bytes + 3) & ~(size_t)3, 0, &c->data);
    if (st == KILN_OK) st = kiln_vk_upload(s->vk, &c->data, 0, tmp, bytes);
    free(tmp);
    if (st) return st;
    size_t sbytes = 0;
    void *sc = NULL;
    if (w->fmt == KILN_WF_FP8_BLOCK) {
        const int64_t B = w->block, scols = (w->cols + B - 1) / B, sr0 = row0 / B, sr1 = (row0 + rows + B - 1) / B;
        sbytes = (size_t)(sr1 - sr0) * (size_t)scols * sizeof(float);
        sc = malloc(sbytes);
        if (sc) memcpy(sc, (const float *)w->scales + (size_t)sr0 * (size_t)scols, sbytes);
    } else if (w->fmt == KILN_WF_INT4_GROUP) {
        const int64_t ng = w->cols / w->block;
        sbytes = (size_t)rows * (size_t)ng * 2;
        uint16_t *b = malloc(sbytes + 2);
        if (b)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t g = 0; g < ng; g++) b[r * ng + g] = ((const uint16_t *)w->scales)[kiln_weight_int4_scale_index(w, row0 + r, g)];
        sc = b;
    }
    if (sbytes) {
        if (!sc) return kiln_fail(KILN_ERR_NOMEM, "vulkan: out of memory staging %zu bytes of scales", sbytes);
        st = kiln_vk_buf_create(s->vk, (sbytes + 3) & ~(size_t)3, 0, &c->scales);
        if (st == KILN_OK) st = kiln_vk_upload(s->vk, &c->scales, 0, sc, sbytes);
        free(sc);
    }
    return st;
}

/* The weight cache's index: a model of Kimi K2's size has ~70,000 weights (384 experts × 3 × 61
 * layers), which a linear search per matmul would scan thousands of times per token. */
static size_t weight_slot(const vk_state *s, const void *data, kiln_wformat fmt, int64_t rows, int64_t cols) {
    uint64_t h = (uint64_t)(uintptr_t)data * 0x9e3779b97f4a7c15ull ^ (uint64_t)fmt << 56 ^ (uint64_t)rows * 0xff51afd7ed558ccdull ^ (uint64_t)cols;
    h ^= h >> 31;
    return (size_t)h & (s->widx_cap - 1);
}
static int weight_index_build(vk_state *s, size_t cap) {
    int *idx = calloc(cap, sizeof *idx);
    if (!idx) { /* no index at all rather than a stale one: lookups miss, and re-upload */
        free(s->widx);
        s->widx = NULL;
        s->widx_cap = 0;
        return -1;
    }
    free(s->widx);
    s->widx = idx;
    s->widx_cap = cap;
    for (int i = 0; i < s->n_weights; i++) {
        size_t h = weight_slot(s, s->weights[i].data, s->weights[i].fmt, s->weights[i].rows, s->weights[i].cols);
        while (s->widx[h]) h = (h + 1) & (cap - 1);
        s->widx[h] = i + 1;
    }
    return 0;
}
static int weight_find(const vk_state *s, const kiln_weight *w) {
    if (!s->widx_cap) return -1;
    for (size_t h = weight_slot(s, w->data, w->fmt, w->rows, w->cols); s->widx[h]; h = (h + 1) & (s->widx_cap - 1)) {
        const vk_weight *vw = &s->weights[s->widx[h] - 1];
        if (vw->data == w->data && vw->fmt == w->fmt && vw->rows == w->rows && vw->cols == w->cols) return s->widx[h] - 1;
    }
    return -1;
}

/* The device copy of w, uploaded at its first use; NULL when it cannot be (then: host). */
const vk_weight *vkb_device_weight(vk_state *s, const kiln_weight *w) {
    const uint64_t fp = vkb_fingerprint(w);
    const int i = weight_find(s, w);
    if (i >= 0) {
        vk_weight *vw = &s->weights[i];
        if (vw->fingerprint == fp && vw->scales == w->scales) return vw;
        weight_free(s, vw); /* the address now holds another weight */
        s->weights[i] = s->weights[--s->n_weights];
        if (weight_index_build(s, s->widx_cap)) return NULL; /* rare: rebuilt whole */
    }
    if (w->rows <= 0 || w->cols <= 0 || w->row_bytes == 0) return NULL;
    int64_t per = (int64_t)(s->max_range / w->row_bytes);
    if (per < w->rows) per = per / 128 * 128;
    if (per < 1) return NULL;
    if (w->fmt == KILN_WF_FP8_BLOCK && per < w->rows && (w->block <= 0 || per % w->block)) return NULL;
    if (vkb_grow((void **)&s->weights, &s->cap_weights, s->n_weights + 1, sizeof *s->weights)) return NULL;
    vk_weight vw = {w->data, w->scales, w->fmt, w->rows, w->cols, fp, 0, NULL};
    const int n = (int)((w->rows + per - 1) / per);
    vw.chunks = calloc((size_t)n, sizeof *vw.chunks);
    if (!vw.chunks) return NULL;
    for (int c = 0; c < n; c++) {
        const int64_t r0 = (int64_t)c * per, rr = w->rows - r0 < per ? w->rows - r0 : per;
        vw.n_chunks = c + 1;
        if (upload_chunk(s, w, r0, rr, &vw.chunks[c]) != KILN_OK) {
            vkb_fail_once(s, "weight upload");
            weight_free(s, &vw);
            return NULL;
        }
    }
    s->weights[s->n_weights++] = vw;
    /* weights go to the device at their first use: the first steps report the copy's progress */
    s->w_uploaded += (uint64_t)w->rows * (uint64_t)w->row_bytes;
    if (s->w_total) {
        int tenths = (int)(s->w_uploaded * 10 / s->w_total);
        if (tenths > 10) tenths = 10;
        if (tenths > s->w_tenths) {
            s->w_tenths = tenths;
            fprintf(stderr, "kiln: %s: weights on the device: %.0f of %.0f MiB (%d%%)\n", kiln_vk_device_name(s->vk), (double)s->w_uploaded / 1048576.0,
                    (double)s->w_total / 1048576.0, 10 * tenths);
        }
    }
    if ((size_t)s->n_weights * 2 > s->widx_cap) {
        if (weight_index_build(s, s->widx_cap ? s->widx_cap * 2 : 256)) { weight_free(s, &s->weights[--s->n_weights]); return NULL; }
    } else {
        size_t h = weight_slot(s, vw.data, vw.fmt, vw.rows, vw.cols);
        while (s->widx[h]) h = (h + 1) & (s->widx_cap - 1);
        s->widx[h] = s->n_weights;
    }
    return &s->weights[s->n_weights - 1];
}

/* ---- matmul -------------------------------------------------------------------------------------- */
/* The matmul variant for n tokens and its tokens per workgroup (matmul.comp TT): from 4 tokens on,
 * 8 per workgroup (a weight row read once per 8 tokens); decode and small batches 1 (the 8-token
 * variant's unused lanes cost a decode step about 2.5× on lavapipe). Both give the same floats. */
static kiln_vk_shader matmul_variant(kiln_wformat f, int n, int *tokens) {
    *tokens = n >= 4 ? 8 : 1;
    const kiln_vk_shader base = n >= 4 ? KILN_VK_SH_matmul8_f32 : KILN_VK_SH_matmul_f32;
    return (kiln_vk_shader)(base + (vkb_matmul_shader(f) - KILN_VK_SH_matmul_f32));
}

/* Records Y[t, r] (t < n) = W · X[t] for w: X rows x_stride floats apart from x, Y rows y_stride
 * apart from y. -1 when something cannot be bound or uploaded (nothing of w recorded then... the
 * caller abandons the op and computes it on the host). */
/* Whether matmul.comp takes w: a format it has, columns in whole blocks. */
int vkb_matmul_shape_ok(const kiln_weight *w) {
    if (!fmt_on_device(w->fmt)) return 0;
    if (w->fmt == KILN_WF_INT4_GROUP && (w->cols % 8 || w->block <= 0 || w->cols % w->block)) return 0;
    if ((w->fmt == KILN_WF_Q8_0 || w->fmt == KILN_WF_Q4_0 || w->fmt == KILN_WF_Q4_1 || w->fmt == KILN_WF_Q5_0 || w->fmt == KILN_WF_Q5_1 ||
         w->fmt == KILN_WF_IQ4_NL) && w->cols % 32)
        return 0;
    if ((w->fmt == KILN_WF_Q4_K || w->fmt == KILN_WF_Q5_K || w->fmt == KILN_WF_Q6_K || w->fmt == KILN_WF_Q2_K || w->fmt == KILN_WF_Q3_K ||
         w->fmt == KILN_WF_IQ4_XS) && w->cols % 256)
        return 0;
    return 1;
}

int vkb_record_matmul(vk_state *s, const kiln_weight *w, const float *X, int64_t x_stride, float *Y, int64_t y_stride, int n) {
    if (n <= 0) return 0;
    if (!vkb_matmul_shape_ok(w) || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return -1; /* token groups of 1 or 8 along y */
    const vk_weight *vw = vkb_device_weight(s, w);
    if (!vw) return -1;
    vref xr, yr;
    if (vkb_resolve(s, X, ((size_t)(n - 1) * (size_t)x_stride + (size_t)w->cols) * sizeof(float), 0, &xr)) return -1;
    if (vkb_resolve(s, Y, ((size_t)(n - 1) * (size_t)y_stride + (size_t)w->rows) * sizeof(float), 1, &yr)) return -1;
    const kiln_vk_bind lut = {s->lut.buf, 0, VK_WHOLE_SIZE};
    for (int c = 0; c < vw->n_chunks; c++) {
        const vk_chunk *ch = &vw->chunks[c];
        const kiln_vk_bind b[5] = {{ch->data.buf, 0, VK_WHOLE_SIZE}, {ch->scales.buf ? ch->scales.buf : ch->data.buf, 0, VK_WHOLE_SIZE}, xr.b, yr.b, lut};
        for (int64_t r = 0; r < ch->rows; r += s->max_gx) {
            const int64_t rr = ch->rows - r < (int64_t)s->max_gx ? ch->rows - r : (int64_t)s->max_gx;
            const int64_t B = w->block > 0 ? w->block : 1;
            const mm_push pc = {.rows = (uint32_t)rr, .cols = (uint32_t)w->cols, .r0 = (uint32_t)r, .n = (uint32_t)n, .x_off = xr.off,
                                .x_stride = (uint32_t)x_stride, .y_off = yr.off + (uint32_t)ch->row0, .y_stride = (uint32_t)y_stride,
                                .block = (uint32_t)B, .scols = (uint32_t)(w->fmt == KILN_WF_FP8_BLOCK ? (w->cols + B - 1) / B : w->cols / B),
                                .row_bytes = (uint32_t)w->row_bytes};
            s->n_dispatch++;
            int tt;
            kiln_vk_shader sh = matmul_variant(w->fmt, n, &tt);
            uint32_t groups_x = (uint32_t)rr;
            if (tt == 1 && w->fmt == KILN_WF_INT4_GROUP && s->gemv_rows == 4) { /* 4 rows per workgroup (matmul.comp ROWS4) */
                sh = KILN_VK_SH_matmul4r_int4;
                groups_x = (uint32_t)((rr + 3) / 4);
                s->n_gemv4++;
            }
            if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, groups_x, (uint32_t)((n + tt - 1) / tt), 1) != KILN_OK) {
                vkb_fail_once(s, "matmul dispatch");
                return -1;
            }
        }
    }
    return 0;
}

/* 1 when [a, a + an) and [b, b + bn) floats share memory. */
static int overlaps(const float *a, size_t an, const float *b, size_t bn) {
    const uintptr_t a0 = (uintptr_t)a, a1 = a0 + an * sizeof(float), b0 = (uintptr_t)b, b1 = b0 + bn * sizeof(float);
    return a0 < b1 && b0 < a1;
}

/* 1 when Y[k] [n, rows_k] shares memory with neither X [n, cols] nor an earlier Y[j]: weight k's
 * dispatches then need no barrier after weight k − 1's (the projections of one input run at once). */
static int independent_of_earlier(const kiln_weight *const *w, float *const *Y, int k, const float *X, int n) {
    const size_t yk = (size_t)n * (size_t)w[k]->rows;
    if (overlaps(Y[k], yk, X, (size_t)n * (size_t)w[k]->cols)) return 0;
    for (int j = 0; j < k; j++)
        if (overlaps(Y[k], yk, Y[j], (size_t)n * (size_t)w[j]->rows)) return 0;
    return 1;
}

static void vk_matmul_many(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n) {
    vk_state *s = ST(be);
    for (int k = 0; k < nw; k++) {
        if (!fmt_on_device(w[k]->fmt)) { /* a format without a shader: the host kernels (supports says so) */
            vkb_host_first(s);
            kiln_backend_cpu_ops.matmul_many(be, &w[k], &Y[k], 1, X, n);
            continue;
        }
        if (k > 0 && fmt_on_device(w[k - 1]->fmt) && !s->failed && independent_of_earlier(w, Y, k, X, n)) kiln_vk_next_independent(s->vk);
        if (s->failed || vkb_record_matmul(s, w[k], X, w[k]->cols, Y[k], w[k]->rows, n) != 0 || vkb_done(s) != 0) {
            abandon(s);
            kiln_backend_cpu_ops.matmul_many(be, &w[k], &Y[k], 1, X, n);
        }
    }
}

/* The row walks of copy_rows.comp and swiglu_rows.comp (the same parameters): rows of width values,
 * dst row i at dst_stride and src row i at src_stride floats, workgroup y = row within each pass of
 * at most the device's y-grid rows. 0 = recorded, -1 = not (a failed dispatch is reported). */
static int record_row_walk(vk_state *s, kiln_vk_shader sh, vref dr, int64_t dst_stride, vref sr, int64_t src_stride, int rows, int64_t width) {
    const uint32_t gy_max = kiln_vk_max_groups_y(s->vk), gx = (uint32_t)((width + 63) / 64) < 64u ? (uint32_t)((width + 63) / 64) : 64u;
    const kiln_vk_bind b[2] = {dr.b, sr.b};
    for (int r0 = 0; r0 < rows; r0 += (int)gy_max) {
        const uint32_t gy = (uint32_t)(rows - r0) < gy_max ? (uint32_t)(rows - r0) : gy_max;
        const struct { uint32_t width, d_stride, s_stride, d_off, s_off, row0; } pc = {(uint32_t)width, (uint32_t)dst_stride, (uint32_t)src_stride,
                                                                                       dr.off, sr.off, (uint32_t)r0};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, sh, b, 2, &pc, sizeof pc, gx, gy, 1) != KILN_OK) {
            vkb_fail_once(s, "dispatch");
            return -1;
        }
    }
    return 0;
}

/* ---- gate, up and SwiGLU in one dispatch (matmul.comp PAIR) ---------------------------------------- */
/* The chunk of vw holding weight row r; *in = r's row within it. */
static const vk_chunk *chunk_of(const vk_weight *vw, int64_t r, int64_t *in) {
    for (int c = 0; c < vw->n_chunks; c++)
        if (r >= vw->chunks[c].row0 && r < vw->chunks[c].row0 + vw->chunks[c].rows) {
            *in = r - vw->chunks[c].row0;
            return &vw->chunks[c];
        }
    return NULL;
}

/* Records G[t, r] = silu(gate row r · X[t]) · (up row u0 + r · X[t]) for t < n, r < F, one dispatch
 * per row range lying in one chunk of each weight (gw = uw and u0 = F: the fused gate_up weight).
 * 0 = recorded; 1 = not for the pair (nothing recorded: the unfused ops then); -1 = a dispatch failed. */
static int record_pair(vk_state *s, const kiln_weight *gw, const kiln_weight *uw, int64_t u0, int64_t F, const float *X, int n, float *G) {
    if (gw->fmt != uw->fmt || gw->cols != uw->cols || gw->block != uw->block || gw->row_bytes != uw->row_bytes || !vkb_matmul_shape_ok(gw) ||
        (uint32_t)n > kiln_vk_max_groups_y(s->vk))
        return 1;
    /* both checked (and uploaded) first: that may move s->weights, so the entries are found after, by
     * the index alone (no second fingerprint of either weight's bytes on the decode path) */
    if (!vkb_device_weight(s, gw) || !vkb_device_weight(s, uw)) return 1;
    const int g_at = weight_find(s, gw), u_at = weight_find(s, uw);
    if (g_at < 0 || u_at < 0) return 1;
    const vk_weight *vg = &s->weights[g_at], *vu = &s->weights[u_at];
    vref xr, yr;
    if (vkb_resolve(s, X, (size_t)n * (size_t)gw->cols * sizeof(float), 0, &xr)) return 1;
    if (vkb_resolve(s, G, (size_t)n * (size_t)F * sizeof(float), 1, &yr)) return 1;
    const kiln_vk_bind lut = {s->lut.buf, 0, VK_WHOLE_SIZE};
    const kiln_vk_bind b[5] = {lut, lut, xr.b, yr.b, lut}; /* the weights are read through their addresses */
    const int64_t B = gw->block > 0 ? gw->block : 1;
    const kiln_vk_shader sh = (kiln_vk_shader)(KILN_VK_SH_matmul_pair_f32 + (vkb_matmul_shader(gw->fmt) - KILN_VK_SH_matmul_f32));
    for (int64_t r = 0; r < F;) {
        int64_t gi, ui;
        const vk_chunk *cg = chunk_of(vg, r, &gi), *cu = chunk_of(vu, u0 + r, &ui);
        if (!cg || !cu) return r ? -1 : 1;
        int64_t rr = F - r;
        if (cg->rows - gi < rr) rr = cg->rows - gi;
        if (cu->rows - ui < rr) rr = cu->rows - ui;
        if ((int64_t)s->max_gx < rr) rr = (int64_t)s->max_gx;
        const uint64_t ga = kiln_vk_buf_address(s->vk, &cg->data), gsa = cg->scales.buf ? kiln_vk_buf_address(s->vk, &cg->scales) : 0;
        const uint64_t ua = kiln_vk_buf_address(s->vk, &cu->data), usa = cu->scales.buf ? kiln_vk_buf_address(s->vk, &cu->scales) : 0;
        if (!ga || !ua) return r ? -1 : 1;
        const mm_push pc = {.rows = (uint32_t)rr, .cols = (uint32_t)gw->cols, .r0 = (uint32_t)gi, .n = (uint32_t)n, .x_off = xr.off,
                            .x_stride = (uint32_t)gw->cols, .y_off = yr.off + (uint32_t)r, .y_stride = (uint32_t)F, .block = (uint32_t)B,
                            .scols = (uint32_t)(gw->fmt == KILN_WF_FP8_BLOCK ? (gw->cols + B - 1) / B : gw->cols / B),
                            .row_bytes = (uint32_t)gw->row_bytes, .g_wlo = (uint32_t)ga, .g_whi = (uint32_t)(ga >> 32), .g_slo = (uint32_t)gsa,
                            .g_shi = (uint32_t)(gsa >> 32), .u_wlo = (uint32_t)ua, .u_whi = (uint32_t)(ua >> 32), .u_slo = (uint32_t)usa,
                            .u_shi = (uint32_t)(usa >> 32), .r0u = (uint32_t)ui};
        s->n_dispatch++;
        s->n_pair++;
        if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, (uint32_t)n, 1) != KILN_OK) {
            vkb_fail_once(s, "gate/up matmul dispatch");
            return -1;
        }
        r += rr;
    }
    return 0;
}

/* The fused gate_up weight's matmul into scratch [n, 2F], then every row's SwiGLU into G [n, F] in
 * one dispatch (swiglu_rows.comp: the floats of a swiglu per row and copy_rows, which are n + 1
 * dispatches). 0 = recorded, -1 = not (the caller abandons the op). */
static int record_fused_rows(vk_state *s, const kiln_weight *gate_up, int64_t F, const float *X, int n, float *G, float *scratch) {
    if (vkb_record_matmul(s, gate_up, X, gate_up->cols, scratch, 2 * F, n) != 0) return -1;
    vref gr, sr;
    if ((uint64_t)n * (uint64_t)F * 2 > UINT32_MAX || vkb_resolve(s, G, (size_t)n * (size_t)F * sizeof(float), 1, &gr) ||
        vkb_resolve(s, scratch, (size_t)n * (size_t)F * 2 * sizeof(float), 0, &sr))
        return -1;
    return record_row_walk(s, KILN_VK_SH_swiglu_rows, gr, F, sr, 2 * F, n, F);
}

/* backend.h matmul_swiglu: in decode-sized steps (n < 4, where the matmuls take one token per
 * workgroup: PAIR is that variant's arithmetic) one dispatch per row range instead of gate, up and
 * swiglu.comp; the fused gate_up weight otherwise as its matmul and one swiglu_rows dispatch;
 * separate weights otherwise, or where the pair cannot be recorded (no device addresses, gate and
 * up in different formats or shapes, KILN_VK_FFN_PAIR=0), the unfused ops — the same floats in
 * every case. */
static void vk_matmul_swiglu(const kiln_backend *be, const kiln_weight *gate, const kiln_weight *up, const float *X, int n, float *G,
                             float *scratch) {
    vk_state *s = ST(be);
    const kiln_weight *uw = up ? up : gate;
    const int64_t F = up ? gate->rows : gate->rows / 2;
    const int shape_ok = n > 0 && F > 0 && (up ? up->rows == F : gate->rows == 2 * F);
    if (shape_ok && n < 4 && s->ffn_pair && !s->failed) {
        const int rc = record_pair(s, gate, uw, up ? 0 : F, F, X, n, G);
        if (rc == 0 && vkb_done(s) == 0) return;
        if (rc != 1) abandon(s); /* recorded in part, or the device failed: the host computes G (the ops below see s->failed) */
    }
    if (shape_ok && !up && !s->failed && fmt_on_device(gate->fmt)) {
        if (record_fused_rows(s, gate, F, X, n, G, scratch) == 0 && vkb_done(s) == 0) return;
        abandon(s);
    }
    kiln_be_matmul_swiglu_unfused(be, gate, up, X, n, G, scratch);
}

/* The H head weights as one dispatch when they are one array: the same float format and shape,
 * row-major, head h's rows right after head h − 1's (MLA's absorbed W_UKᵀ / W_UV are: mla.c), and
 * the stack fits one binding. 1 = recorded, 0 = not stackable (per-head dispatches), -1 = failed. */
static int record_heads_stacked(vk_state *s, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head, float *Y,
                                int64_t y_tok, int64_t y_head) {
    const kiln_weight *w0 = &w[0];
    if (H < 2 || n <= 0 || (uint32_t)H > kiln_vk_max_groups_z(s->vk) || w0->tiled ||
        (w0->fmt != KILN_WF_F32 && w0->fmt != KILN_WF_F16 && w0->fmt != KILN_WF_BF16))
        return 0;
    const size_t head_bytes = (size_t)w0->rows * w0->row_bytes;
    for (int h = 1; h < H; h++)
        if (w[h].fmt != w0->fmt || w[h].rows != w0->rows || w[h].cols != w0->cols || w[h].row_bytes != w0->row_bytes || w[h].tiled ||
            w[h].data != w0->data + (size_t)h * head_bytes)
            return 0;
    if ((size_t)H * head_bytes > s->max_range || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return 0;
    kiln_weight stack = *w0;
    stack.rows = (int64_t)H * w0->rows;
    const vk_weight *vw = vkb_device_weight(s, &stack);
    if (!vw || vw->n_chunks != 1) return vw ? 0 : -1;
    vref xr, yr;
    const size_t xbytes = ((size_t)(H - 1) * (size_t)x_head + (size_t)(n - 1) * (size_t)x_tok + (size_t)w0->cols) * sizeof(float);
    const size_t ybytes = ((size_t)(H - 1) * (size_t)y_head + (size_t)(n - 1) * (size_t)y_tok + (size_t)w0->rows) * sizeof(float);
    if (vkb_resolve(s, X, xbytes, 0, &xr) || vkb_resolve(s, Y, ybytes, 1, &yr)) return -1;
    const vk_chunk *ch = &vw->chunks[0];
    const kiln_vk_bind b[5] = {{ch->data.buf, 0, VK_WHOLE_SIZE}, {ch->data.buf, 0, VK_WHOLE_SIZE}, xr.b, yr.b, {s->lut.buf, 0, VK_WHOLE_SIZE}};
    for (int64_t r = 0; r < w0->rows; r += s->max_gx) {
        const int64_t rr = w0->rows - r < (int64_t)s->max_gx ? w0->rows - r : (int64_t)s->max_gx;
        const mm_push pc = {.rows = (uint32_t)rr, .cols = (uint32_t)w0->cols, .r0 = (uint32_t)r, .n = (uint32_t)n, .x_off = xr.off,
                            .x_stride = (uint32_t)x_tok, .y_off = yr.off, .y_stride = (uint32_t)y_tok, .block = 1, .scols = (uint32_t)w0->cols,
                            .row_bytes = (uint32_t)w0->row_bytes, .x_hstride = (uint32_t)x_head, .y_hstride = (uint32_t)y_head,
                            .h_rows = (uint32_t)w0->rows};
        s->n_dispatch++;
        int tt;
        const kiln_vk_shader sh = matmul_variant(w0->fmt, n, &tt);
        if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, (uint32_t)((n + tt - 1) / tt), (uint32_t)H) != KILN_OK) {
            vkb_fail_once(s, "matmul dispatch");
            return -1;
        }
    }
    return 1;
}

static void vk_matmul_heads(const kiln_backend *be, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head,
                            float *Y, int64_t y_tok, int64_t y_head, float *gin, float *gout) {
    vk_state *s = ST(be);
    const int stacked = s->failed ? -1 : record_heads_stacked(s, w, H, n, X, x_tok, x_head, Y, y_tok, y_head);
    if (stacked == 1 && vkb_done(s) == 0) return;
    int ok = !s->failed && stacked == 0;
    for (int h = 0; ok && h < H; h++)
        ok = vkb_record_matmul(s, &w[h], X + (size_t)h * (size_t)x_head, x_tok, Y + (size_t)h * (size_t)y_head, y_tok, n) == 0;
    if (ok && vkb_done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.matmul_heads(be, w, H, n, X, x_tok, x_head, Y, y_tok, y_head, gin, gout);
}

/* ---- element-wise ops ---------------------------------------------------------------------------- */
typedef struct { uint32_t len, a_off, b_off, base, width; } ew_push;

/* y = op(y, x) over len elements (width: add_bias's row width), in dispatches of ≤ max groups. */
int vkb_record_ew(vk_state *s, kiln_vk_shader sh, float *y, const float *x, size_t x_len, int64_t len, int width) {
    if (len <= 0) return 0;
    if ((uint64_t)len > UINT32_MAX) return -1;
    vref yr, xr;
    if (vkb_resolve(s, y, (size_t)len * sizeof(float), 1, &yr) || vkb_resolve(s, x, x_len * sizeof(float), 0, &xr)) return -1;
    const kiln_vk_bind b[2] = {yr.b, xr.b};
    const uint64_t per = (uint64_t)s->max_gx * 256;
    for (uint64_t base = 0; base < (uint64_t)len; base += per) {
        const uint64_t cnt = (uint64_t)len - base < per ? (uint64_t)len - base : per;
        const ew_push pc = {(uint32_t)len, yr.off, xr.off, (uint32_t)base, (uint32_t)(width > 0 ? width : 1)};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, sh, b, 2, &pc, sizeof pc, (uint32_t)((cnt + 255) / 256), 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); return -1; }
    }
    return 0;
}

/* Row copies on the device (copy_rows.comp), so that model code's splits need no submit. */
static void vk_copy_rows(const kiln_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows, int width) {
    vk_state *s = ST(be);
    if (rows <= 0 || width <= 0) return;
    const size_t dn = (size_t)(rows - 1) * (size_t)dst_stride + (size_t)width, sn = (size_t)(rows - 1) * (size_t)src_stride + (size_t)width;
    if (!s->failed && dst_stride >= 0 && src_stride >= 0 && dn <= UINT32_MAX && sn <= UINT32_MAX) {
        vref dr = {{0}, 0}, sr = {{0}, 0};
        const int ok = vkb_resolve(s, dst, dn * sizeof(float), 1, &dr) == 0 && vkb_resolve(s, src, sn * sizeof(float), 0, &sr) == 0 &&
                       record_row_walk(s, KILN_VK_SH_copy_rows, dr, dst_stride, sr, src_stride, rows, width) == 0;
        if (ok && vkb_done(s) == 0) return;
        abandon(s);
    } else vkb_host_first(s);
    kiln_be_common_copy_rows(be, dst, dst_stride, src, src_stride, rows, width);
}

static void vk_add(const kiln_backend *be, float *y, const float *x, int64_t len) {
    vk_state *s = ST(be);
    if (!s->failed && vkb_record_ew(s, KILN_VK_SH_add, y, x, (size_t)len, len, 0) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_be_common_add(be, y, x, len);
}

static void vk_add_bias(const kiln_backend *be, float *y, const float *b, int rows, int width) {
    vk_state *s = ST(be);
    if (!s->failed && vkb_record_ew(s, KILN_VK_SH_add_bias, y, b, (size_t)width, (int64_t)rows * width, width) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_be_common_add_bias(be, y, b, rows, width);
}

static void vk_swiglu(const kiln_backend *be, float *g, const float *u, int64_t len) {
    vk_state *s = ST(be);
    if (!s->failed && vkb_record_ew(s, KILN_VK_SH_swiglu, g, u, (size_t)len, len, 0) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.swiglu(be, g, u, len);
}

typedef struct { uint32_t width, o_off, x_off, w_off; float eps; uint32_t d_off, add; } norm_push;

/* out = rmsnorm(x) · w per row; with d (add_rmsnorm) x += d first, written back (rmsnorm.comp). */
static int record_rmsnorm(vk_state *s, float *out, const float *x, const float *d, const float *w, int rows, int width, float eps) {
    if (rows <= 0 || width <= 0) return 0;
    const size_t bytes = (size_t)rows * (size_t)width * sizeof(float);
    vref orr, xr, wr, dr;
    if (vkb_resolve(s, out, bytes, 1, &orr)) return -1;
    if (out == x) xr = orr;
    else if (vkb_resolve(s, x, bytes, d != NULL, &xr)) return -1;
    if (vkb_resolve(s, w, (size_t)width * sizeof(float), 0, &wr)) return -1;
    if (d && vkb_resolve(s, d, bytes, 0, &dr)) return -1;
    const kiln_vk_bind b[4] = {orr.b, xr.b, wr.b, d ? dr.b : xr.b};
    for (int r = 0; r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const uint32_t r_off = (uint32_t)r * (uint32_t)width;
        const norm_push pc = {(uint32_t)width, orr.off + r_off, xr.off + r_off, wr.off, eps, d ? dr.off + r_off : 0, d != NULL};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_rmsnorm, b, 4, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { vkb_fail_once(s, "dispatch"); return -1; }
    }
    return 0;
}

static void vk_rmsnorm(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps) {
    vk_state *s = ST(be);
    if (!s->failed && record_rmsnorm(s, out, x, NULL, w, rows, width, eps) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.rmsnorm(be, out, x, w, rows, width, eps);
}

static void vk_add_rmsnorm(const kiln_backend *be, float *x, const float *d, float *out, const float *w, int rows, int width, float eps) {
    vk_state *s = ST(be);
    if (!s->failed && record_rmsnorm(s, out, x, d, w, rows, width, eps) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_be_common_add(be, x, d, (int64_t)rows * width);
    kiln_backend_cpu_ops.rmsnorm(be, out, x, w, rows, width, eps);
}

typedef struct {
    uint32_t x_off, row_stride, n_heads, head_stride, rot, neox, cs_off, pairs_total;
    uint32_t pairs_a, x2_off, row_stride2, n_heads2;
} rope_push;

/* RoPE over x (n_heads, row_stride) and, when x2, over x2 (n_heads2, row_stride2) in the same
 * dispatch (rope.comp); 0 when recorded. */
static int record_rope(vk_state *s, const kiln_rope *r, float *x, int64_t row_stride, int n_heads, float *x2, int64_t row_stride2, int n_heads2,
                       int n, int head_stride, const float *cs) {
    const uint64_t pairs = (uint64_t)n * (uint64_t)n_heads * (uint64_t)(r->rot_dim / 2);
    const uint64_t pairs2 = x2 ? (uint64_t)n * (uint64_t)n_heads2 * (uint64_t)(r->rot_dim / 2) : 0;
    if (s->failed || pairs + pairs2 > (uint64_t)s->max_gx * 64) return -1;
    vref xr, cr, x2r;
    const size_t xbytes = ((size_t)(n - 1) * (size_t)row_stride + (size_t)(n_heads - 1) * (size_t)head_stride + (size_t)r->rot_dim) * sizeof(float);
    if (vkb_resolve(s, x, xbytes, 1, &xr) || vkb_resolve(s, cs, (size_t)n * (size_t)r->rot_dim * sizeof(float), 0, &cr)) return -1;
    if (x2) {
        const size_t x2bytes = ((size_t)(n - 1) * (size_t)row_stride2 + (size_t)(n_heads2 - 1) * (size_t)head_stride + (size_t)r->rot_dim) * sizeof(float);
        if (vkb_resolve(s, x2, x2bytes, 1, &x2r)) return -1;
    }
    const kiln_vk_bind b[3] = {xr.b, cr.b, x2 ? x2r.b : xr.b};
    const rope_push pc = {xr.off, (uint32_t)row_stride, (uint32_t)n_heads, (uint32_t)head_stride, (uint32_t)r->rot_dim, r->style == KILN_ROPE_NEOX,
                          cr.off, (uint32_t)(pairs + pairs2), (uint32_t)pairs, x2 ? x2r.off : 0, (uint32_t)row_stride2, (uint32_t)n_heads2};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, KILN_VK_SH_rope, b, 3, &pc, sizeof pc, (uint32_t)((pairs + pairs2 + 63) / 64), 1, 1) != KILN_OK) {
        vkb_fail_once(s, "dispatch");
        return -1;
    }
    return 0;
}

static void vk_rope(const kiln_backend *be, const kiln_rope *r, float *x, int n, int64_t row_stride, int n_heads, int head_stride,
                    const float *cs) {
    vk_state *s = ST(be);
    if ((uint64_t)n * (uint64_t)n_heads * (uint64_t)(r->rot_dim / 2) == 0) return;
    if (record_rope(s, r, x, row_stride, n_heads, NULL, 0, 0, n, head_stride, cs) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_be_common_rope(be, r, x, n, row_stride, n_heads, head_stride, cs);
}

static void vk_rope2(const kiln_backend *be, const kiln_rope *r, float *x, int64_t row_stride, int n_heads, float *x2, int64_t row_stride2,
                     int n_heads2, int n, int head_stride, const float *cs) {
    vk_state *s = ST(be);
    if (n <= 0 || r->rot_dim / 2 == 0 || n_heads <= 0 || n_heads2 <= 0) { /* nothing in one of them: rope on each */
        vk_rope(be, r, x, n, row_stride, n_heads, head_stride, cs);
        vk_rope(be, r, x2, n, row_stride2, n_heads2, head_stride, cs);
        return;
    }
    if (record_rope(s, r, x, row_stride, n_heads, x2, row_stride2, n_heads2, n, head_stride, cs) == 0 && vkb_done(s) == 0) return;
    abandon(s);
    kiln_be_common_rope(be, r, x, n, row_stride, n_heads, head_stride, cs);
    kiln_be_common_rope(be, r, x2, n, row_stride2, n_heads2, head_stride, cs);
}

/* ---- host-side ops: the cpu backend's, on the mapped buffers ------------------------------------------ */
static void vk_embed(const kiln_backend *be, const kiln_weight *t, const int32_t *tok, int n, float *x) {
    vkb_host_first(ST(be));
    kiln_backend_cpu_ops.embed(be, t, tok, n, x);
}
static void vk_rope_table(const kiln_backend *be, const kiln_rope *r, const int *pos, int n, float *cs) {
    vkb_host_first(ST(be));
    kiln_backend_cpu_ops.rope_table(be, r, pos, n, cs);
}
static int vk_moe_route(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, int n, int *idx, float *wt, float *tmp) {
    vkb_host_first(ST(be));
    return kiln_backend_cpu_ops.moe_route(be, c, logits, bias, n, idx, wt, tmp);
}

static int64_t vk_argmax(const kiln_backend *be, const float *x, int64_t len) {
    vkb_host_first(ST(be));
    return kiln_backend_cpu_ops.argmax(be, x, len);
}

static void vk_defer(const kiln_backend *be) { ST(be)->defer_depth++; }
static void vk_expect_weights(const kiln_backend *be, uint64_t bytes) {
    vk_state *s = ST(be);
    s->w_total = bytes >= ((uint64_t)256 << 20) ? bytes : 0; /* a small model's copy is over before a line could help */
    s->w_tenths = (int)(bytes ? (s->w_uploaded * 10 / bytes > 10 ? 10 : s->w_uploaded * 10 / bytes) : 0);
}
static int vk_sync(const kiln_backend *be, int end) {
    vk_state *s = ST(be);
    (void)vkb_flush(s);
    const int lost = s->lost;
    if (end && s->defer_depth > 0 && --s->defer_depth == 0) s->lost = 0;
    return lost;
}

static int vk_supports(const kiln_backend *be, kiln_op op, kiln_wformat fmt) {
    switch (op) {
    case KILN_OP_MATMUL:
    case KILN_OP_MATMUL_HEADS:
    case KILN_OP_MOE_EXPERTS: return fmt_on_device(fmt);
    case KILN_OP_RMSNORM:
    case KILN_OP_ROPE:
    case KILN_OP_ADD:
    case KILN_OP_SWIGLU:
    case KILN_OP_COPY_ROWS: return 1;
    case KILN_OP_KV_ATTEND:
    case KILN_OP_KV_STORE: return kiln_vk_has_bda(ST(be)->vk); /* over pools whose arrays came from kv_alloc */
    case KILN_OP_MOE_COMBINE:
    case KILN_OP_LAYERNORM:
    case KILN_OP_FP8_ROUND: return 1;
    case KILN_OP_KV_INDEX:
    case KILN_OP_KV_ATTEND_SPARSE: return kiln_vk_has_bda(ST(be)->vk); /* over DSA pools whose arrays came from kv_alloc */
    case KILN_OP_MOE_ROUTE: return kiln_vk_has_bda(ST(be)->vk) && kiln_vk_has_f64(ST(be)->vk); /* moe_routed */
    default: return 0;
    }
}

const kiln_backend_ops kiln_backend_vulkan_ops = {
    .supports = vk_supports,
    .alloc = vk_be_alloc,
    .free = vk_be_free,
    .embed = vk_embed,
    .rmsnorm = vk_rmsnorm,
    .rope_table = vk_rope_table,
    .rope = vk_rope,
    .rope2 = vk_rope2,
    .add = vk_add,
    .add_rmsnorm = vk_add_rmsnorm,
    .copy_rows = vk_copy_rows,
    .add_bias = vk_add_bias,
    .swiglu = vk_swiglu,
    .matmul_many = vk_matmul_many,
    .matmul_swiglu = vk_matmul_swiglu,
    .matmul_heads = vk_matmul_heads,
    .moe_route = vk_moe_route,
    .moe_experts = vk_moe_experts,
    .moe_combine = vk_moe_combine,
    .moe_routed = vk_moe_routed,
    .kv_store = vk_kv_store,
    .kv_attend = vk_kv_attend,
    .argmax = vk_argmax,
    .layernorm = vk_layernorm,
    .fp8_round = vk_fp8_round,
    .kv_index_topk = vk_kv_index_topk,
    .kv_attend_sparse = vk_kv_attend_sparse,
    .kv_alloc = vk_kv_alloc,
    .kv_free = vk_be_free,
    .defer = vk_defer,
    .sync = vk_sync,
    .expect_weights = vk_expect_weights,
    .alloc_readback = vk_be_alloc_readback,
};

/* ---- lifetime ------------------------------------------------------------------------------------ */
/* A count from the environment: *v = 0 where the variable is unset or empty (as KILN_VK_FAULT);
 * a value that is not a whole number from lo to hi is refused, naming the variable. */
static kiln_status env_count(const char *name, const char *what, unsigned long long lo, unsigned long long hi, unsigned long long *v) {
    *v = 0;
    const char *e = getenv(name);
    if (!e || !*e) return KILN_OK;
    char *end;
    errno = 0;
    const unsigned long long x = strtoull(e, &end, 10);
    if (errno || end == e || *end || x < lo || x > hi) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: '%s' is not %s from %llu to %llu", name, e, what, lo, hi);
    *v = x;
    return KILN_OK;
}

/* A choice from the environment: *idx = the index of the variable's value among values[0..n) (left
 * as it is where the variable is unset or empty); another value is refused, naming the variable and
 * the values it takes. */
static kiln_status env_choice(const char *name, const char *const *values, int n, int *idx) {
    const char *e = getenv(name);
    if (!e || !*e) return KILN_OK;
    for (int i = 0; i < n; i++)
        if (!strcmp(e, values[i])) { *idx = i; return KILN_OK; }
    return kiln_fail(KILN_ERR_INVALID_ARG, "%s: '%s' is not %s%s%s", name, e, values[0], n > 1 ? " or " : "", n > 1 ? values[1] : "");
}

kiln_status kiln_backend_vulkan_open(kiln_backend *be, int device_index) {
    vk_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->host_threads = be->cx.threads > 0 ? be->cx.threads : 1;
    pthread_mutex_init(&s->allocs_mu, NULL);
    kiln_status st = kiln_vk_open(device_index, &s->vk);
    if (st) { pthread_mutex_destroy(&s->allocs_mu); free(s); return st; }
    s->align = kiln_vk_offset_align(s->vk);
    if (s->align < 4) s->align = 4;
    s->max_range = kiln_vk_max_range(s->vk) & ~(size_t)255;
    s->max_gx = kiln_vk_max_groups_x(s->vk);
    if (s->max_gx > 65535) s->max_gx = 65535;
    /* The indexer's scores scratch: a 512-token chunk at 128k context is 256 MiB; longer chunks or
     * contexts scan in token groups (record_index). KILN_VK_INDEX_BYTES lowers it (tests force
     * groups with it). */
    s->idx_budget = s->max_range < ((size_t)256 << 20) ? s->max_range : (size_t)256 << 20;
    /* A prefill chunk's routed MoE runs on the device in pieces of at most MOE_ROUTED_MAX_TOKENS
     * tokens (vk_moe.c); KILN_VK_MOE_TOKENS lowers it (tests force pieces with it). */
    s->moe_tokens = MOE_ROUTED_MAX_TOKENS;
    unsigned long long v = 0;
    st = env_count("KILN_VK_INDEX_BYTES", "a byte count", 4, s->idx_budget, &v);
    if (st == KILN_OK && v) s->idx_budget = (size_t)v & ~(size_t)3;
    if (st == KILN_OK) st = env_count("KILN_VK_MOE_TOKENS", "a token count", 1, MOE_ROUTED_MAX_TOKENS, &v);
    if (st == KILN_OK && v) s->moe_tokens = (int)v;
    /* INT4 decode GEMV rows per workgroup (1, or 4: matmul.comp ROWS4, the same floats). 1: on an
     * H200 (docs/BENCHMARKS.md) the one-row GEMV with coalesced X decoded at 300-310 tok/s against
     * the 4-row one's 242 (a quarter of the workgroups: too few bytes in flight) */
    /* KILN_VK_FFN_PAIR: gate, up and SwiGLU in one decode dispatch (1) or three (0) — the same
     * floats. Default: 1 on a GPU with buffer device addresses (the pair reads the weights through
     * them: one dispatch and one barrier fewer per layer, to be measured there by gpu_check's A/B),
     * 0 on a CPU device: lavapipe's buffer-reference loads made the pair's dispatch 3× slower than
     * the three it replaces (tiny-llama-hd64 INT4, KILN_VK_PROFILE: 2,695 µs against 2 × 412 + 89) */
    static const char *const rows_v[] = {"1", "4"}, *const act_v[] = {"device", "host"}, *const pair_v[] = {"1", "0"};
    int rows_i = 0, act_i = kiln_vk_mapped_vram(s->vk) ? 0 : 1, pair_i = kiln_vk_is_cpu(s->vk) ? 1 : 0;
    if (st == KILN_OK) st = env_choice("KILN_VK_GEMV_ROWS", rows_v, 2, &rows_i);
    if (st == KILN_OK) st = env_choice("KILN_VK_ACTIVATIONS", act_v, 2, &act_i);
    if (st == KILN_OK) st = env_choice("KILN_VK_FFN_PAIR", pair_v, 2, &pair_i);
    s->gemv_rows = rows_i ? 4 : 1;
    s->ffn_pair = pair_i == 0 && kiln_vk_has_bda(s->vk);
    s->act_where = act_i == 0 ? KILN_VK_MEM_MAPPED_NEAR : 1;
    if (st) {
        kiln_vk_close(s->vk);
        pthread_mutex_destroy(&s->allocs_mu);
        free(s);
        return st;
    }
    st = kiln_vk_buf_create(s->vk, 256 * sizeof(float), 0, &s->lut);
    if (st == KILN_OK) st = kiln_vk_upload(s->vk, &s->lut, 0, kiln_fp8_e4m3_table, 256 * sizeof(float));
    /* the staging arena is a convenience: without it (no memory for 4 MiB) every staged operand
     * gets a buffer of its own (stage) */
    for (int a = 0; a < 2 && st == KILN_OK; a++)
        if (kiln_vk_buf_create(s->vk, (size_t)4 << 20, a == ARENA_WRITTEN ? 1 : s->act_where, &s->arena[a]) != KILN_OK) memset(&s->arena[a], 0, sizeof s->arena[a]);
    if (st) {
        kiln_vk_buf_destroy(s->vk, &s->lut);
        kiln_vk_close(s->vk);
        pthread_mutex_destroy(&s->allocs_mu);
        free(s);
        return st;
    }
    be->impl = s;
    be->device_name = kiln_vk_device_name(s->vk);
    return KILN_OK;
}

void kiln_backend_vulkan_close(kiln_backend *be) {
    vk_state *s = ST(be);
    if (!s) return;
    (void)vkb_flush(s); /* a step left open: its copybacks and checks run (or are dropped) and are freed */
    if (getenv("KILN_VK_STATS")) { /* how well the deferred steps batch (docs/VULKAN.md) */
        uint64_t rec = 0, rep = 0, prep = 0;
        kiln_vk_program_stats(s->vk, &rec, &rep, &prep);
        fprintf(stderr, "kiln: %s: %llu dispatches in %llu submits (%llu command buffers recorded, %llu replayed; host %.2f ms preparing them), "
                        "%llu native ops computed on the host\n",
                kiln_vk_device_name(s->vk), (unsigned long long)s->n_dispatch, (unsigned long long)kiln_vk_submits(s->vk), (unsigned long long)rec,
                (unsigned long long)rep, (double)prep / 1e6, (unsigned long long)s->n_host);
        fprintf(stderr, "kiln: %s: %llu of them with no barrier before them (independent of the dispatch before)\n",
                kiln_vk_device_name(s->vk), (unsigned long long)kiln_vk_independent_dispatches(s->vk));
        if (s->gemv_rows == 4)
            fprintf(stderr, "kiln: %s: %llu of them the 4-row INT4 GEMV (KILN_VK_GEMV_ROWS=4)\n", kiln_vk_device_name(s->vk), (unsigned long long)s->n_gemv4);
        if (s->n_pair)
            fprintf(stderr, "kiln: %s: %llu of them gate, up and SwiGLU in one (KILN_VK_FFN_PAIR=0: three)\n", kiln_vk_device_name(s->vk),
                    (unsigned long long)s->n_pair);
    }
    uint64_t ns[KILN_VK_SH_COUNT], cnt[KILN_VK_SH_COUNT], total = 0;
    const char *names[KILN_VK_SH_COUNT];
    if (getenv("KILN_VK_PROFILE") && kiln_vk_profile(s->vk, ns, cnt, names)) { /* device time per shader, largest first */
        for (int i = 0; i < KILN_VK_SH_COUNT; i++) total += ns[i];
        fprintf(stderr, "kiln: %s: device time %.3f ms (timestamp queries)\n", kiln_vk_device_name(s->vk), (double)total / 1e6);
        for (;;) {
            int best = -1;
            for (int i = 0; i < KILN_VK_SH_COUNT; i++)
                if (cnt[i] && (best < 0 || ns[i] > ns[best])) best = i;
            if (best < 0) break;
            fprintf(stderr, "  %-16s %10.3f ms %5.1f%%  %8llu dispatches  %9.1f us each\n", names[best], (double)ns[best] / 1e6,
                    total ? 100.0 * (double)ns[best] / (double)total : 0.0, (unsigned long long)cnt[best], (double)ns[best] / 1e3 / (double)cnt[best]);
            cnt[best] = 0;
        }
    }
    for (int i = 0; i < s->n_weights; i++) weight_free(s, &s->weights[i]);
    for (int i = 0; i < s->n_allocs; i++) kiln_vk_buf_destroy(s->vk, &s->allocs[i].b);
    for (int i = 0; i < s->n_extra; i++) kiln_vk_buf_destroy(s->vk, &s->extra[i]);
    kiln_vk_buf_destroy(s->vk, &s->lut);
    kiln_vk_buf_destroy(s->vk, &s->arena[0]);
    kiln_vk_buf_destroy(s->vk, &s->arena[1]);
    free(s->slot_cap);
    kiln_vk_buf_destroy(s->vk, &s->att_part);
    kiln_vk_buf_destroy(s->vk, &s->idx_scores);
    kiln_vk_close(s->vk);
    for (int i = 0; i < s->n_moe_tabs; i++) free(s->moe_tabs[i].addr);
    free(s->moe_tabs); free(s->seals);
    free(s->weights); free(s->widx); free(s->allocs); free(s->extra); free(s->cb); free(s->checks);
    pthread_mutex_destroy(&s->allocs_mu);
    free(s);
    be->impl = NULL;
}

kiln_status kiln_backend_vulkan_list(FILE *f) { return kiln_vk_list(f); }

/* The device's read bandwidth (membw.comp): a device buffer of `bytes` read `passes` times in one
 * submit (one dispatch per binding-sized chunk and pass), timed from submit to fence; the best of
 * three such submits, the first of which also warms the pipeline. */
kiln_status kiln_backend_vulkan_read_gbps(const kiln_backend *be, size_t bytes, int passes, double *gbps) {
    vk_state *s = ST(be);
    *gbps = 0.0;
    if (s->failed) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the device failed earlier", kiln_vk_device_name(s->vk));
    const size_t chunk = s->max_range & ~(size_t)((1u << 20) - 1);
    if (bytes < 16 || chunk == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "vulkan bandwidth: %zu bytes is too small", bytes);
    kiln_vk_buf src, out;
    KILN_TRY(kiln_vk_buf_create(s->vk, bytes, 0, &src));
    kiln_status st = kiln_vk_buf_create(s->vk, 1024, 0, &out);
    if (st) { kiln_vk_buf_destroy(s->vk, &src); return st; }
    const uint32_t per_wg = 4096; /* 64 KiB per workgroup */
    for (int rep = 0; rep < 3 && st == KILN_OK; rep++) {
        for (int pass = 0; pass < passes && st == KILN_OK; pass++)
            for (size_t off = 0; off < bytes && st == KILN_OK; off += chunk) {
                const size_t len = bytes - off < chunk ? bytes - off : chunk;
                const uint32_t n = (uint32_t)(len / 16), groups = (n + per_wg - 1) / per_wg;
                const struct { uint32_t n, per_wg; } pc = {n, per_wg};
                const kiln_vk_bind b[2] = {{src.buf, off, len & ~(size_t)15}, {out.buf, 0, VK_WHOLE_SIZE}};
                st = kiln_vk_dispatch(s->vk, KILN_VK_SH_membw, b, 2, &pc, sizeof pc, groups, 1, 1);
            }
        const double t0 = kiln_now();
        if (st == KILN_OK) st = kiln_vk_flush(s->vk);
        const double dt = kiln_now() - t0;
        if (st == KILN_OK && dt > 0 && (double)bytes * passes / dt / 1e9 > *gbps) *gbps = (double)bytes * passes / dt / 1e9;
    }
    kiln_vk_buf_destroy(s->vk, &src);
    kiln_vk_buf_destroy(s->vk, &out);
    return st;
}

uint64_t kiln_backend_vulkan_gemv4_dispatches(const kiln_backend *be) { return ST(be)->n_gemv4; }
uint64_t kiln_backend_vulkan_pair_dispatches(const kiln_backend *be) { return ST(be)->n_pair; }

void kiln_backend_vulkan_counts(const kiln_backend *be, uint64_t *dispatches, uint64_t *host_fallbacks) {
    const vk_state *s = ST(be);
    *dispatches = s ? s->n_dispatch : 0;
    *host_fallbacks = s ? s->n_host : 0;
}

void kiln_backend_vulkan_programs(const kiln_backend *be, uint64_t *recorded, uint64_t *replayed) {
    const vk_state *s = ST(be);
    *recorded = *replayed = 0;
    if (s) kiln_vk_program_stats(s->vk, recorded, replayed, NULL);
}

int kiln_backend_vulkan_subgroups(const kiln_backend *be) {
    const vk_state *s = ST(be);
    return s ? kiln_vk_subgroups(s->vk) : 0;
}

int kiln_backend_vulkan_f64(const kiln_backend *be) {
    const vk_state *s = ST(be);
    return s ? kiln_vk_has_f64(s->vk) : 0;
}

int kiln_backend_vulkan_built(void) { return 1; }

