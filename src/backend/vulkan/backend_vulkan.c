/* backend_vulkan.c — the vulkan backend: the forward pass's ops as SPIR-V compute dispatches on one
 * Vulkan device (vk_device.h), tested on Mesa's lavapipe in `make test` and run unchanged on GPUs.
 *
 * What runs where (this first stage of docs/VULKAN.md):
 *   device   matmul / matmul_many / matmul_heads / grouped MoE experts for F32, F16, BF16, FP8 block,
 *            INT4 group, Q8_0, Q4_0 and every GGUF block quant kiln reads (Q4_K / Q5_K / Q6_K / Q2_K / Q3_K /
 *            IQ4_XS / Q4_1 / Q5_0 / Q5_1 / IQ4_NL, dequantized in registers), RMSNorm, RoPE, add, bias, SwiGLU,
 *            the MoE combine, attention over the KV pool's pages (kv_attend.comp: the pages read where they lie, through
 *            buffer device addresses, with the KV integrity hashes of what it reads);
 *   host     through the cpu backend's kernels on the same buffers: embedding rows, the RoPE table,
 *            MoE routing, the KV store with its seal update, argmax, DSA's sparse ops.
 *            `supports` reports these as 0.
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
 * Every op records its dispatches into one command buffer, submits it once and waits (a flush per
 * op, so a host-side op always sees finished results). Pointers an op gets that kiln_be_alloc did
 * not hand out (norm weights, biases, callers' own arrays) are staged through a host-visible arena
 * and copied back after the flush when the op writes them.
 *
 * Failure: when a dispatch or submit fails (device lost, out of memory), the backend reports it
 * once on stderr, marks itself failed and computes that op and every later one on the host. */
#include "backend/backend.h"
#include "backend/backend_common.h"
#include "backend/vulkan/backend_vulkan.h"
#include "backend/vulkan/vk_device.h"
#include "base/fp.h"
#include "base/status.h"
#include "kv/integrity.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;
    size_t size;
    kiln_vk_buf b;
    uint64_t addr;  /* device address of p (0 without buffer device addresses) */
} vk_alloc;

typedef struct {
    kiln_vk_buf data, scales;
    int64_t row0, rows;
} vk_chunk;

typedef struct {
    const void *data, *scales;
    kiln_wformat fmt;
    int64_t rows, cols;
    uint64_t fingerprint;
    int n_chunks;
    vk_chunk *chunks;
} vk_weight;

typedef struct {
    void *host;
    const uint8_t *staged;
    size_t bytes;
} vk_copyback;

/* What record_attend leaves for the check after the flush (KV integrity with device hashing). */
typedef struct {
    uint64_t *hs;    /* per owner token's sequence: [slots][KV heads][K, V] content-hash sums (copied back at the flush) */
    int64_t *hbase;  /* [n]: token i's first sum, or -1 when it is not its sequence's owner */
} att_hash;

/* A hashed attention whose seals are compared when its dispatch has run (at the flush that runs
 * it: backend.h deferred steps), against the integrity call it belonged to. */
typedef struct {
    const kiln_kv_pool *p;
    int layer, n;
    kiln_kv_seq **seq; /* copies of the call's arrays */
    int *pos;
    att_hash ah;
    kiln_kv_integ_call call;
} att_check;

/* A KV store the device writes (kv_store.comp), sealed on the host once its dispatch has run:
 * KV integrity's bookkeeping was done when it was recorded (kiln_kv_integ_store_begin), the seals
 * take the row hashes the shader computed (kiln_kv_integ_store_end) — or, when the flush failed,
 * the bookkeeping is undone so that the host can store the tokens again. */
typedef struct {
    kiln_kv_pool *p;
    int layer, n;
    kiln_kv_seq **seq; /* copies of the call's arrays */
    int *pos;
    kiln_kv_integ_pending *pend;
    uint64_t *hs;      /* [n][kinds][KV heads] row hashes (copied back at the flush) */
} st_seal;
static void st_seal_free(st_seal *c) { free(c->seq); free(c->pos); free(c->pend); free(c->hs); }

/* The device addresses of one MoE layer's experts: [gate | up | down][E][data lo, hi, scales lo, hi]
 * (matmul.comp BYID reads them), built when the layer first runs on the device. */
typedef struct moe_tab {
    const kiln_weight *gate, *up, *down;
    int E;
    uint64_t gen, fp_first, fp_last; /* weights_gen when built; fingerprints of gate[0] and down[E-1] */
    uint32_t *addr;
} moe_tab;

typedef struct {
    kiln_vk *vk;
    size_t align, max_range;
    uint32_t max_gx;
    vk_alloc *allocs;
    int n_allocs, cap_allocs;
    vk_weight *weights;
    int n_weights, cap_weights;
    int *widx;               /* open addressing over weights by (data, format, shape): index + 1, 0 = empty */
    size_t widx_cap;         /* a power of two, at least twice n_weights */
    kiln_vk_buf lut;         /* FP8 e4m3 byte → f32 */
    kiln_vk_buf arena;       /* staging for pointers kiln_be_alloc did not hand out */
    size_t arena_used;
    /* The k-th operand staged since the last flush goes to region k of the arena, whose size
     * (slot_cap[k], a power of two) only grows: a step of the same shape stages at the same offsets
     * and ranges whatever its tables' lengths (a decode step's page table grows by a word now and
     * then), so its dispatches bind the same ranges and the recorded command buffer is replayed
     * (vk_device.c). arena_need: the regions a flush used, the arena's size from the next flush. */
    size_t *slot_cap;
    int n_slot_cap, stage_k;
    size_t arena_need;
    size_t arena_failed;     /* an arena of this size could not be had: not asked for again up to it */
    kiln_vk_buf *extra;      /* staging buffers beyond the arena, freed at the flush */
    int n_extra, cap_extra;
    vk_copyback *cb;
    int n_cb, cap_cb;
    kiln_vk_buf att_part;    /* attention's per-split partial results (device-local, grown as needed) */
    kiln_vk_buf idx_scores;  /* the indexer's scores [group tokens][context] (device-local, grown as needed) */
    size_t idx_budget;       /* bytes of scores one scan may write: min(one binding, 256 MiB; KILN_VK_INDEX_BYTES) */
    att_check *checks;       /* hashed attentions recorded since the last flush */
    int n_checks, cap_checks;
    st_seal *seals;          /* device stores with KV integrity recorded since the last flush */
    int n_seals, cap_seals;
    struct moe_tab *moe_tabs; /* device addresses of MoE layers' experts (vk_moe_routed) */
    int n_moe_tabs, cap_moe_tabs;
    uint64_t weights_gen;    /* bumped whenever a device weight is freed (the address tables are rebuilt) */
    int route_ok;            /* the device's routing checked against the host's: 0 not yet, 1 equal, -1 not (host routes) */
    uint64_t w_total, w_uploaded; /* the model's weight bytes (expect_weights) and those on the device so far */
    int w_tenths;            /* tenths of w_total reported */
    int failed;
    /* Deferred steps (backend.h kiln_be_defer): while depth > 0 the device ops only record, and
     * what they recorded runs at the next flush — a host-side op (which reads their results), a
     * kiln_be_wait / kiln_be_end, a hashed attention. lost: a flush failed while deferring, so the
     * results of ops recorded since the previous flush never came (kiln_be_end reports it). */
    pthread_mutex_t allocs_mu; /* guards allocs / n_allocs / cap_allocs */
    int defer_depth, lost;
    int staged_any;          /* something was staged since the last flush ... */
    uint64_t staged_at;      /* ... last when n_dispatch had this value (a dispatch since: its operands were used) */
    int kv_host_said;        /* the KV-array fallback was reported */
    uint64_t n_dispatch, n_host; /* ops run on the device / ops `supports` calls native that fell back to the host */
} vk_state;

static vk_state *ST(const kiln_backend *be) { return (vk_state *)be->impl; }

/* ---- growable arrays ------------------------------------------------------------------------------ */
static int grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

static void fail_once(vk_state *s, const char *op) {
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
    const int ok = grow((void **)&s->allocs, &s->cap_allocs, s->n_allocs + 1, sizeof *s->allocs) == 0;
    if (ok) s->allocs[s->n_allocs++] = a;
    pthread_mutex_unlock(&s->allocs_mu);
    if (!ok) {
        kiln_vk_buf_destroy(s->vk, &a.b);
        return NULL;
    }
    return a.p;
}

static void *vk_be_alloc(const kiln_backend *be, size_t bytes) { return alloc_mapped(ST(be), bytes, 1, 1); }

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

/* A binding covering [ptr, ptr + bytes) and the element (float / word) offset of ptr inside it.
 * Buffers kiln_be_alloc handed out are bound in place; any other pointer is copied into staging
 * (and back after the flush when `written`). Returns -1 when the range cannot be bound (larger than
 * the device's maxStorageBufferRange): the caller computes on the host. */
typedef struct {
    kiln_vk_bind b;
    uint32_t off;
} vref;

static int flush(vk_state *s);

static int stage(vk_state *s, const void *ptr, size_t bytes, int written, vref *r) {
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
            if (flush(s) != 0) return -1;
            break;
        }
    }
    s->staged_any = 1;
    s->staged_at = s->n_dispatch;
    const int k = s->stage_k++;
    if (k >= s->n_slot_cap) {
        int cap = s->n_slot_cap;
        if (grow((void **)&s->slot_cap, &cap, k + 1, sizeof *s->slot_cap)) return -1;
        memset(s->slot_cap + s->n_slot_cap, 0, (size_t)(cap - s->n_slot_cap) * sizeof *s->slot_cap);
        s->n_slot_cap = cap;
    }
    if (s->slot_cap[k] < need) {
        size_t c = s->align;
        while (c < need) c *= 2;
        s->slot_cap[k] = c;
    }
    const size_t region = s->slot_cap[k];
    if (region <= s->max_range) s->arena_need += region; /* larger ones never fit one binding of the arena */
    kiln_vk_buf *buf;
    size_t at, range = region;
    if (s->arena.buf && s->arena_used + region <= s->arena.size && region <= s->max_range) {
        buf = &s->arena;
        at = s->arena_used;
        s->arena_used += region;
    } else {
        if (grow((void **)&s->extra, &s->cap_extra, s->n_extra + 1, sizeof *s->extra)) return -1;
        buf = &s->extra[s->n_extra];
        if (kiln_vk_buf_create(s->vk, need, 1, buf) != KILN_OK || !buf->map) { kiln_vk_buf_destroy(s->vk, buf); return -1; }
        s->n_extra++;
        at = 0;
        range = need;
    }
    memcpy(buf->map + at, ptr, bytes);
    if (written) {
        if (grow((void **)&s->cb, &s->cap_cb, s->n_cb + 1, sizeof *s->cb)) return -1;
        s->cb[s->n_cb++] = (vk_copyback){(void *)(uintptr_t)ptr, buf->map + at, bytes};
    }
    r->b = (kiln_vk_bind){buf->buf, at, (VkDeviceSize)range};
    r->off = 0;
    return 0;
}

static int resolve(vk_state *s, const void *ptr, size_t bytes, int written, vref *r) {
    const uint8_t *p = ptr;
    int found = 0, rc = 0;
    pthread_mutex_lock(&s->allocs_mu);
    for (int i = 0; i < s->n_allocs && !found; i++) {
        const vk_alloc *a = &s->allocs[i];
        if (p >= a->p && p < a->p + (a->size ? a->size : 1)) {
            found = 1;
            const size_t off = (size_t)(p - a->p), aligned = off / s->align * s->align, delta = off - aligned;
            size_t range = a->b.size - aligned;
            if (range > s->max_range) range = s->max_range & ~(size_t)3;
            if (delta + bytes > range || (delta & 3)) rc = -1;
            else {
                r->b = (kiln_vk_bind){a->b.buf, aligned, range};
                r->off = (uint32_t)(delta / 4);
            }
        }
    }
    pthread_mutex_unlock(&s->allocs_mu);
    return found ? rc : stage(s, ptr, bytes, written, r);
}

/* Submits and waits, then copies staged outputs back and resets the staging. -1 on a device error. */
static void check_hashes(const kiln_kv_pool *p, const kiln_kv_integ_call *call, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                         const att_hash *ah);

static int flush(vk_state *s) {
    const kiln_status st = kiln_vk_flush(s->vk);
    if (st != KILN_OK) {
        fail_once(s, "submit");
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
    for (int i = 0; i < s->n_checks; i++) {
        att_check *c = &s->checks[i];
        if (st == KILN_OK) check_hashes(c->p, &c->call, c->layer, c->n, c->seq, c->pos, &c->ah);
        free(c->seq);
        free(c->pos);
        free(c->ah.hs);
        free(c->ah.hbase);
    }
    s->n_checks = 0;
    s->n_cb = 0;
    for (int i = 0; i < s->n_extra; i++) kiln_vk_buf_destroy(s->vk, &s->extra[i]);
    s->n_extra = 0;
    if (s->arena_need > s->arena.size && s->arena_need > s->arena_failed) { /* the next flush's regions all in the arena (nothing recorded binds it now) */
        kiln_vk_buf bigger;
        if (kiln_vk_buf_create(s->vk, s->arena_need + s->arena_need / 4, 1, &bigger) == KILN_OK && bigger.map) {
            kiln_vk_buf_destroy(s->vk, &s->arena);
            s->arena = bigger;
        } else { /* keep the arena there is; not retried for this size or less */
            kiln_vk_buf_destroy(s->vk, &bigger);
            s->arena_failed = s->arena_need;
        }
    }
    s->arena_used = 0;
    s->arena_need = 0;
    s->stage_k = 0;
    s->staged_any = 0;
    return st == KILN_OK ? 0 : -1;
}

/* An op that cannot run on the device (an operand it cannot bind, a failed upload or dispatch):
 * what is recorded runs now — the earlier ops of a deferred step, and any dispatches this op
 * recorded before it failed, which only ever write its own outputs (every op resolves its in-place
 * operands before its first dispatch) — and then the host computes the whole op. */
static void abandon_op(vk_state *s, const char *op) {
    if (s->n_host++ == 0 && !s->failed)
        fprintf(stderr, "kiln: %s: %s ran on the host instead of the device (an operand larger than a storage-buffer binding, "
                        "or one a pending dispatch still writes); further ones are counted, not reported\n", kiln_vk_device_name(s->vk), op);
    (void)flush(s);
}

/* The end of a device op: submitted now, or inside a deferred step left recorded. */
static int done(vk_state *s) { return s->defer_depth > 0 ? 0 : flush(s); }
/* Before a host-side op: everything recorded must have run (the host reads its results and may
 * write what a recorded dispatch still has to read). */
static void host_first(vk_state *s) { (void)flush(s); }

#define abandon(s) abandon_op((s), __func__)

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

static kiln_vk_shader matmul_shader(kiln_wformat f) {
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
static uint64_t fingerprint(const kiln_weight *w) {
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
static const vk_weight *device_weight(vk_state *s, const kiln_weight *w) {
    const uint64_t fp = fingerprint(w);
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
    if (grow((void **)&s->weights, &s->cap_weights, s->n_weights + 1, sizeof *s->weights)) return NULL;
    vk_weight vw = {w->data, w->scales, w->fmt, w->rows, w->cols, fp, 0, NULL};
    const int n = (int)((w->rows + per - 1) / per);
    vw.chunks = calloc((size_t)n, sizeof *vw.chunks);
    if (!vw.chunks) return NULL;
    for (int c = 0; c < n; c++) {
        const int64_t r0 = (int64_t)c * per, rr = w->rows - r0 < per ? w->rows - r0 : per;
        vw.n_chunks = c + 1;
        if (upload_chunk(s, w, r0, rr, &vw.chunks[c]) != KILN_OK) {
            fail_once(s, "weight upload");
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
    return (kiln_vk_shader)(base + (matmul_shader(f) - KILN_VK_SH_matmul_f32));
}
typedef struct {
    uint32_t rows, cols, r0, n, x_off, x_stride, y_off, y_stride, block, scols, row_bytes;
    uint32_t x_hstride, y_hstride, h_rows; /* stacked heads (matmul.comp); 0 for a plain matmul */
    uint32_t x_div, tab_off, ids_off;      /* matmul_id (BYID) only */
    uint32_t ord_off;                      /* matmul8_id only: the expert-sorted tiles (moe_sort.comp) */
} mm_push;

/* Records Y[t, r] (t < n) = W · X[t] for w: X rows x_stride floats apart from x, Y rows y_stride
 * apart from y. -1 when something cannot be bound or uploaded (nothing of w recorded then... the
 * caller abandons the op and computes it on the host). */
/* Whether matmul.comp takes w: a format it has, columns in whole blocks. */
static int matmul_shape_ok(const kiln_weight *w) {
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

static int record_matmul(vk_state *s, const kiln_weight *w, const float *X, int64_t x_stride, float *Y, int64_t y_stride, int n) {
    if (n <= 0) return 0;
    if (!matmul_shape_ok(w)) return -1;
    const vk_weight *vw = device_weight(s, w);
    if (!vw) return -1;
    vref xr, yr;
    if (resolve(s, X, ((size_t)(n - 1) * (size_t)x_stride + (size_t)w->cols) * sizeof(float), 0, &xr)) return -1;
    if (resolve(s, Y, ((size_t)(n - 1) * (size_t)y_stride + (size_t)w->rows) * sizeof(float), 1, &yr)) return -1;
    const kiln_vk_bind lut = {s->lut.buf, 0, VK_WHOLE_SIZE};
    for (int c = 0; c < vw->n_chunks; c++) {
        const vk_chunk *ch = &vw->chunks[c];
        const kiln_vk_bind b[5] = {{ch->data.buf, 0, VK_WHOLE_SIZE}, {ch->scales.buf ? ch->scales.buf : ch->data.buf, 0, VK_WHOLE_SIZE}, xr.b, yr.b, lut};
        for (int64_t r = 0; r < ch->rows; r += s->max_gx) {
            const int64_t rr = ch->rows - r < (int64_t)s->max_gx ? ch->rows - r : (int64_t)s->max_gx;
            const int64_t B = w->block > 0 ? w->block : 1;
            const mm_push pc = {(uint32_t)rr, (uint32_t)w->cols, (uint32_t)r, (uint32_t)n, xr.off, (uint32_t)x_stride,
                                yr.off + (uint32_t)ch->row0, (uint32_t)y_stride, (uint32_t)B,
                                (uint32_t)(w->fmt == KILN_WF_FP8_BLOCK ? (w->cols + B - 1) / B : w->cols / B), (uint32_t)w->row_bytes, 0, 0, 0, 0, 0, 0, 0};
            s->n_dispatch++;
            int tt;
            const kiln_vk_shader sh = matmul_variant(w->fmt, n, &tt);
            if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, (uint32_t)((n + tt - 1) / tt), 1) != KILN_OK) {
                fail_once(s, "matmul dispatch");
                return -1;
            }
        }
    }
    return 0;
}

static void vk_matmul_many(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n) {
    vk_state *s = ST(be);
    for (int k = 0; k < nw; k++) {
        if (!fmt_on_device(w[k]->fmt)) { /* a format without a shader: the host kernels (supports says so) */
            host_first(s);
            kiln_backend_cpu_ops.matmul_many(be, &w[k], &Y[k], 1, X, n);
            continue;
        }
        if (s->failed || record_matmul(s, w[k], X, w[k]->cols, Y[k], w[k]->rows, n) != 0 || done(s) != 0) {
            abandon(s);
            kiln_backend_cpu_ops.matmul_many(be, &w[k], &Y[k], 1, X, n);
        }
    }
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
    if ((size_t)H * head_bytes > s->max_range) return 0;
    kiln_weight stack = *w0;
    stack.rows = (int64_t)H * w0->rows;
    const vk_weight *vw = device_weight(s, &stack);
    if (!vw || vw->n_chunks != 1) return vw ? 0 : -1;
    vref xr, yr;
    const size_t xbytes = ((size_t)(H - 1) * (size_t)x_head + (size_t)(n - 1) * (size_t)x_tok + (size_t)w0->cols) * sizeof(float);
    const size_t ybytes = ((size_t)(H - 1) * (size_t)y_head + (size_t)(n - 1) * (size_t)y_tok + (size_t)w0->rows) * sizeof(float);
    if (resolve(s, X, xbytes, 0, &xr) || resolve(s, Y, ybytes, 1, &yr)) return -1;
    const vk_chunk *ch = &vw->chunks[0];
    const kiln_vk_bind b[5] = {{ch->data.buf, 0, VK_WHOLE_SIZE}, {ch->data.buf, 0, VK_WHOLE_SIZE}, xr.b, yr.b, {s->lut.buf, 0, VK_WHOLE_SIZE}};
    for (int64_t r = 0; r < w0->rows; r += s->max_gx) {
        const int64_t rr = w0->rows - r < (int64_t)s->max_gx ? w0->rows - r : (int64_t)s->max_gx;
        const mm_push pc = {(uint32_t)rr, (uint32_t)w0->cols, (uint32_t)r, (uint32_t)n, xr.off, (uint32_t)x_tok, yr.off, (uint32_t)y_tok, 1,
                            (uint32_t)w0->cols, (uint32_t)w0->row_bytes, (uint32_t)x_head, (uint32_t)y_head, (uint32_t)w0->rows, 0, 0, 0, 0};
        s->n_dispatch++;
        int tt;
        const kiln_vk_shader sh = matmul_variant(w0->fmt, n, &tt);
        if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, (uint32_t)((n + tt - 1) / tt), (uint32_t)H) != KILN_OK) {
            fail_once(s, "matmul dispatch");
            return -1;
        }
    }
    return 1;
}

static void vk_matmul_heads(const kiln_backend *be, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head,
                            float *Y, int64_t y_tok, int64_t y_head, float *gin, float *gout) {
    vk_state *s = ST(be);
    const int stacked = s->failed ? -1 : record_heads_stacked(s, w, H, n, X, x_tok, x_head, Y, y_tok, y_head);
    if (stacked == 1 && done(s) == 0) return;
    int ok = !s->failed && stacked == 0;
    for (int h = 0; ok && h < H; h++)
        ok = record_matmul(s, &w[h], X + (size_t)h * (size_t)x_head, x_tok, Y + (size_t)h * (size_t)y_head, y_tok, n) == 0;
    if (ok && done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.matmul_heads(be, w, H, n, X, x_tok, x_head, Y, y_tok, y_head, gin, gout);
}

/* ---- element-wise ops ---------------------------------------------------------------------------- */
typedef struct { uint32_t len, a_off, b_off, base, width; } ew_push;

/* y = op(y, x) over len elements (width: add_bias's row width), in dispatches of ≤ max groups. */
static int record_ew(vk_state *s, kiln_vk_shader sh, float *y, const float *x, size_t x_len, int64_t len, int width) {
    if (len <= 0) return 0;
    if ((uint64_t)len > UINT32_MAX) return -1;
    vref yr, xr;
    if (resolve(s, y, (size_t)len * sizeof(float), 1, &yr) || resolve(s, x, x_len * sizeof(float), 0, &xr)) return -1;
    const kiln_vk_bind b[2] = {yr.b, xr.b};
    const uint64_t per = (uint64_t)s->max_gx * 256;
    for (uint64_t base = 0; base < (uint64_t)len; base += per) {
        const uint64_t cnt = (uint64_t)len - base < per ? (uint64_t)len - base : per;
        const ew_push pc = {(uint32_t)len, yr.off, xr.off, (uint32_t)base, (uint32_t)(width > 0 ? width : 1)};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, sh, b, 2, &pc, sizeof pc, (uint32_t)((cnt + 255) / 256), 1, 1) != KILN_OK) { fail_once(s, "dispatch"); return -1; }
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
        int ok = resolve(s, dst, dn * sizeof(float), 1, &dr) == 0 && resolve(s, src, sn * sizeof(float), 0, &sr) == 0;
        const uint32_t gy_max = kiln_vk_max_groups_y(s->vk), gx = (uint32_t)((width + 63) / 64) < 64u ? (uint32_t)((width + 63) / 64) : 64u;
        const kiln_vk_bind b[2] = {dr.b, sr.b};
        for (int r0 = 0; ok && r0 < rows; r0 += (int)gy_max) {
            const uint32_t gy = (uint32_t)(rows - r0) < gy_max ? (uint32_t)(rows - r0) : gy_max;
            const struct { uint32_t width, d_stride, s_stride, d_off, s_off, row0; } pc = {(uint32_t)width, (uint32_t)dst_stride, (uint32_t)src_stride,
                                                                                           dr.off, sr.off, (uint32_t)r0};
            s->n_dispatch++;
            if (kiln_vk_dispatch(s->vk, KILN_VK_SH_copy_rows, b, 2, &pc, sizeof pc, gx, gy, 1) != KILN_OK) {
                fail_once(s, "dispatch");
                ok = 0;
            }
        }
        if (ok && done(s) == 0) return;
        abandon(s);
    } else host_first(s);
    kiln_be_common_copy_rows(be, dst, dst_stride, src, src_stride, rows, width);
}

static void vk_add(const kiln_backend *be, float *y, const float *x, int64_t len) {
    vk_state *s = ST(be);
    if (!s->failed && record_ew(s, KILN_VK_SH_add, y, x, (size_t)len, len, 0) == 0 && done(s) == 0) return;
    abandon(s);
    kiln_be_common_add(be, y, x, len);
}

static void vk_add_bias(const kiln_backend *be, float *y, const float *b, int rows, int width) {
    vk_state *s = ST(be);
    if (!s->failed && record_ew(s, KILN_VK_SH_add_bias, y, b, (size_t)width, (int64_t)rows * width, width) == 0 && done(s) == 0) return;
    abandon(s);
    kiln_be_common_add_bias(be, y, b, rows, width);
}

static void vk_swiglu(const kiln_backend *be, float *g, const float *u, int64_t len) {
    vk_state *s = ST(be);
    if (!s->failed && record_ew(s, KILN_VK_SH_swiglu, g, u, (size_t)len, len, 0) == 0 && done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.swiglu(be, g, u, len);
}

typedef struct { uint32_t width, o_off, x_off, w_off; float eps; } norm_push;

static int record_rmsnorm(vk_state *s, float *out, const float *x, const float *w, int rows, int width, float eps) {
    if (rows <= 0 || width <= 0) return 0;
    const size_t bytes = (size_t)rows * (size_t)width * sizeof(float);
    vref orr, xr, wr;
    if (resolve(s, out, bytes, 1, &orr)) return -1;
    if (out == x) xr = orr;
    else if (resolve(s, x, bytes, 0, &xr)) return -1;
    if (resolve(s, w, (size_t)width * sizeof(float), 0, &wr)) return -1;
    const kiln_vk_bind b[3] = {orr.b, xr.b, wr.b};
    for (int r = 0; r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const norm_push pc = {(uint32_t)width, orr.off + (uint32_t)r * (uint32_t)width, xr.off + (uint32_t)r * (uint32_t)width, wr.off, eps};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_rmsnorm, b, 3, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { fail_once(s, "dispatch"); return -1; }
    }
    return 0;
}

static void vk_rmsnorm(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps) {
    vk_state *s = ST(be);
    if (!s->failed && record_rmsnorm(s, out, x, w, rows, width, eps) == 0 && done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.rmsnorm(be, out, x, w, rows, width, eps);
}

typedef struct { uint32_t x_off, row_stride, n_heads, head_stride, rot, neox, cs_off, pairs_total; } rope_push;

static void vk_rope(const kiln_backend *be, const kiln_rope *r, float *x, int n, int64_t row_stride, int n_heads, int head_stride,
                    const float *cs) {
    vk_state *s = ST(be);
    const uint64_t pairs = (uint64_t)n * (uint64_t)n_heads * (uint64_t)(r->rot_dim / 2);
    if (pairs == 0) return;
    int ok = !s->failed && pairs <= (uint64_t)s->max_gx * 64;
    vref xr, cr;
    const size_t xbytes = ((size_t)(n - 1) * (size_t)row_stride + (size_t)(n_heads - 1) * (size_t)head_stride + (size_t)r->rot_dim) * sizeof(float);
    if (ok) ok = resolve(s, x, xbytes, 1, &xr) == 0 && resolve(s, cs, (size_t)n * (size_t)r->rot_dim * sizeof(float), 0, &cr) == 0;
    if (ok) {
        const kiln_vk_bind b[2] = {xr.b, cr.b};
        const rope_push pc = {xr.off, (uint32_t)row_stride, (uint32_t)n_heads, (uint32_t)head_stride, (uint32_t)r->rot_dim,
                              r->style == KILN_ROPE_NEOX, cr.off, (uint32_t)pairs};
        s->n_dispatch++;
        ok = kiln_vk_dispatch(s->vk, KILN_VK_SH_rope, b, 2, &pc, sizeof pc, (uint32_t)((pairs + 63) / 64), 1, 1) == KILN_OK;
        if (!ok) fail_once(s, "dispatch");
    }
    if (ok && done(s) == 0) return;
    abandon(s);
    kiln_be_common_rope(be, r, x, n, row_stride, n_heads, head_stride, cs);
}

/* ---- MoE experts ----------------------------------------------------------------------------------- */
static int record_swiglu(vk_state *s, float *g, const float *u, int64_t len) { return record_ew(s, KILN_VK_SH_swiglu, g, u, (size_t)len, len, 0); }

static void vk_moe_experts(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down,
                           const int *active, int n_active, const int *offset, const float *xg, float *hg, float *ug, float *yg) {
    vk_state *s = ST(be);
    int ok = !s->failed;
    for (int a = 0; ok && a < n_active; a++) {
        const int e = active[a], off = offset[e], cnt = offset[e + 1] - offset[e];
        if (cnt <= 0) continue;
        const float *x = xg + (size_t)off * (size_t)c->dim;
        float *h = hg + (size_t)off * (size_t)c->ffn, *u = ug + (size_t)off * (size_t)c->ffn, *y = yg + (size_t)off * (size_t)c->dim;
        ok = record_matmul(s, &gate[e], x, c->dim, h, c->ffn, cnt) == 0 && record_matmul(s, &up[e], x, c->dim, u, c->ffn, cnt) == 0 &&
             record_swiglu(s, h, u, (int64_t)cnt * c->ffn) == 0 && record_matmul(s, &down[e], h, c->ffn, y, c->dim, cnt) == 0;
    }
    if (ok && done(s) == 0) return;
    abandon(s);
    kiln_backend_cpu_ops.moe_experts(be, c, gate, up, down, active, n_active, offset, xg, hg, ug, yg);
}

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
static uint64_t device_address(vk_state *s, const void *ptr, size_t bytes) {
    const uint8_t *p = ptr;
    uint64_t addr = 0;
    pthread_mutex_lock(&s->allocs_mu);
    for (int i = 0; i < s->n_allocs && !addr; i++) {
        const vk_alloc *a = &s->allocs[i];
        if (a->addr && p >= a->p && p + bytes <= a->p + a->size) addr = a->addr + (uint64_t)(p - a->p);
    }
    pthread_mutex_unlock(&s->allocs_mu);
    return addr;
}

/* Whether the shader computes this pool's attention: its layer arrays in device-addressable
 * buffers, rows of a plain layout (not DSA's compact rows, which only the sparse ops read; not
 * pre-RoPE K smoothing, whose per-score term the shader lacks), head sizes the shader holds. */
/* Whether layer `layer`'s K and V arrays lie whole in device-addressable buffers of ours, with page
 * strides the shaders' 32-bit push constants hold (the store and attention shaders' common need). */
static int arrays_on_device(vk_state *s, const kiln_kv_pool *p, int layer) {
    const size_t page_k = kiln_kv_page_k_at(p, layer), page_v = p->cfg.v_shares_k ? page_k : p->page_v;
    if (page_k > UINT32_MAX || p->page_v > UINT32_MAX) return 0;
    return device_address(s, p->k[layer], page_k * (size_t)p->n_pages) && device_address(s, p->v[layer], page_v * (size_t)p->n_pages);
}

static int attend_on_device(vk_state *s, const kiln_kv_pool *p, int layer, int n_heads) {
    const int H = p->cfg.n_kv_heads;
    if (s->failed || p->dsa_key_at || p->rope_cs || p->cfg.k_dim > 1024 || p->cfg.v_dim > 1024 || H <= 0 || n_heads % H) return 0;
    return arrays_on_device(s, p, layer);
}


/* The tokens of a call over their sequences' pages: first[i] = the first token of token i's
 * sequence (the block table is shared), reach[i] = the positions its sequence reads in this call,
 * hbase[i] = where the sums of the sequence's owner (with hashing: the first token with that reach)
 * start, -1 for the others; n_ent = block-table entries of the distinct sequences, n_sums = sums
 * (sums_per_slot per page slot of each owner), max_lim = the largest pos + 1. */
static void call_reach(int n, kiln_kv_seq *const *seq, const int *pos, int pt, int hashing, size_t sums_per_slot, int *first, int *reach,
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
    call_reach(n, seq, pos, pt, hashing, (size_t)H * 2, first, reach, ah->hbase, &n_ent, &n_sums, &max_lim);
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
     * 256 workgroups, no split under 256 positions; a split is whole 64-position blocks and whole
     * pages (one workgroup owns each page's hash sums) */
    const int rows = n * n_heads;
    int splits = 1;
    if (rows < 256 && max_lim >= 512) {
        splits = (256 + rows - 1) / rows;
        if (splits > max_lim / 256) splits = max_lim / 256;
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
            if (flush(s) != 0) { free(tab); return -1; } /* recorded dispatches may still use the old one */
            kiln_vk_buf_destroy(s->vk, &s->att_part);
            if (kiln_vk_buf_create(s->vk, need, 0, &s->att_part) != KILN_OK) { free(tab); fail_once(s, "attention scratch"); return -1; }
        }
    }
    vref qr, orr, tr, hr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0};
    int ok = resolve(s, q, (size_t)rows * (size_t)kd * sizeof(float), 0, &qr) == 0 &&
             resolve(s, out, (size_t)rows * (size_t)vd * sizeof(float), 1, &orr) == 0 && stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!n_sums || stage(s, ah->hs, n_sums * sizeof *ah->hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)n_heads > s->max_gx || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return -1;
    kiln_vk_bind part = orr.b;
    if (splits > 1) part = (kiln_vk_bind){s->att_part.buf, 0, VK_WHOLE_SIZE};
    const size_t page_k = kiln_kv_page_k_at(p, layer), page_v = p->cfg.v_shares_k ? page_k : p->page_v;
    const att_push pc = {.kaddr = device_address(s, p->k[layer], 1), .vaddr = device_address(s, p->v[layer], 1),
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
        fail_once(s, "attention dispatch");
        return -1;
    }
    if (splits > 1) {
        const merge_push mp = {(uint32_t)n_heads, (uint32_t)vd, (uint32_t)splits, orr.off};
        const kiln_vk_bind mb[2] = {part, orr.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_merge, mb, 2, &mp, sizeof mp, (uint32_t)n_heads, (uint32_t)n, 1) != KILN_OK) {
            fail_once(s, "attention merge dispatch");
            return -1;
        }
    }
    return 0;
}

/* The seals of what the shader read, compared with the sums it computed (one check per owner
 * token's sequence and KV head). */
static void check_hashes(const kiln_kv_pool *p, const kiln_kv_integ_call *call, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                         const att_hash *ah) {
    const int H = p->cfg.n_kv_heads;
    for (int i = 0; i < n; i++)
        if (ah->hbase[i] >= 0) /* slot sl's [K, V] sums of KV head h at hs[hbase + (sl·H + h)·2] */
            for (int h = 0; h < H; h++) kiln_kv_integ_check_sums(p, call, layer, seq[i], h, pos[i] + 1, ah->hs + ah->hbase[i] + 2 * (size_t)h, 2 * (size_t)H);
}

/* ---- host-side ops: the cpu backend's, on the mapped buffers ------------------------------------------ */
static void vk_embed(const kiln_backend *be, const kiln_weight *t, const int32_t *tok, int n, float *x) {
    host_first(ST(be));
    kiln_backend_cpu_ops.embed(be, t, tok, n, x);
}
static void vk_rope_table(const kiln_backend *be, const kiln_rope *r, const int *pos, int n, float *cs) {
    host_first(ST(be));
    kiln_backend_cpu_ops.rope_table(be, r, pos, n, cs);
}
static int vk_moe_route(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, int n, int *idx, float *wt, float *tmp) {
    host_first(ST(be));
    return kiln_backend_cpu_ops.moe_route(be, c, logits, bias, n, idx, wt, tmp);
}
/* ---- the routed experts on the device (moe_route.comp, matmul.comp BYID, moe_combine.comp) ------- */
/* The expert address table of a layer (built on first use: every expert uploaded, each one chunk);
 * NULL when some expert cannot be had that way (the caller takes the host-routed path). */
static const uint32_t *expert_addresses(vk_state *s, const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down, int E) {
    moe_tab *t = NULL;
    for (int i = 0; i < s->n_moe_tabs && !t; i++)
        if (s->moe_tabs[i].gate == gate && s->moe_tabs[i].up == up && s->moe_tabs[i].down == down && s->moe_tabs[i].E == E) t = &s->moe_tabs[i];
    if (t && t->gen == s->weights_gen && t->fp_first == fingerprint(&gate[0]) && t->fp_last == fingerprint(&down[E - 1])) return t->addr;
    if (!t) {
        if (grow((void **)&s->moe_tabs, &s->cap_moe_tabs, s->n_moe_tabs + 1, sizeof *s->moe_tabs)) return NULL;
        t = &s->moe_tabs[s->n_moe_tabs++];
        *t = (moe_tab){gate, up, down, E, 0, 0, 0, malloc((size_t)E * 12 * sizeof(uint32_t))};
        if (!t->addr) { s->n_moe_tabs--; return NULL; }
    }
    const kiln_weight *mats[3] = {gate, up, down};
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++) {
            const kiln_weight *w = &mats[m][e];
            if (w->fmt != mats[m][0].fmt || w->rows != mats[m][0].rows || w->cols != mats[m][0].cols || w->block != mats[m][0].block ||
                !matmul_shape_ok(w))
                return NULL;
            const vk_weight *vw = device_weight(s, w);
            if (!vw || vw->n_chunks != 1) return NULL;
            const uint64_t da = kiln_vk_buf_address(s->vk, &vw->chunks[0].data);
            const uint64_t sa = vw->chunks[0].scales.buf ? kiln_vk_buf_address(s->vk, &vw->chunks[0].scales) : 0;
            if (!da || (vw->chunks[0].scales.buf && !sa)) return NULL;
            uint32_t *a = t->addr + ((size_t)m * (size_t)E + (size_t)e) * 4;
            a[0] = (uint32_t)da; a[1] = (uint32_t)(da >> 32); a[2] = (uint32_t)sa; a[3] = (uint32_t)(sa >> 32);
        }
    t->gen = s->weights_gen;
    t->fp_first = fingerprint(&gate[0]);
    t->fp_last = fingerprint(&down[E - 1]);
    return t->addr;
}

/* The experts' matmul over the device's routing (Y row t = W_{ids[t]} · X row t / x_div): one workgroup per (row, entry) of the nk (token,
 * slot) entries, or — tiles > 0 — per (row, tile of 8 expert-sorted entries at ord_off). */
static int record_matmul_id(vk_state *s, const kiln_weight *w0, kiln_vk_bind tab, uint32_t tab_ids, uint32_t tab_off, vref xr, uint32_t x_stride,
                            uint32_t x_div, vref yr, uint32_t y_stride, int nk, uint32_t ord_off, uint32_t tiles) {
    const kiln_vk_bind lut = {s->lut.buf, 0, VK_WHOLE_SIZE};
    const kiln_vk_bind b[5] = {tab, lut, xr.b, yr.b, lut};
    const int64_t B = w0->block > 0 ? w0->block : 1;
    const kiln_vk_shader sh = (kiln_vk_shader)((tiles ? KILN_VK_SH_matmul8_id_f32 : KILN_VK_SH_matmul_id_f32) + (matmul_shader(w0->fmt) - KILN_VK_SH_matmul_f32));
    for (int64_t r = 0; r < w0->rows; r += s->max_gx) {
        const int64_t rr = w0->rows - r < (int64_t)s->max_gx ? w0->rows - r : (int64_t)s->max_gx;
        const mm_push pc = {(uint32_t)rr, (uint32_t)w0->cols, (uint32_t)r, (uint32_t)nk, xr.off, x_stride, yr.off, y_stride, (uint32_t)B,
                            (uint32_t)(w0->fmt == KILN_WF_FP8_BLOCK ? (w0->cols + B - 1) / B : w0->cols / B), (uint32_t)w0->row_bytes, 0, 0, 0,
                            x_div, tab_off, tab_ids, ord_off};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, sh, b, 5, &pc, sizeof pc, (uint32_t)rr, tiles ? tiles : (uint32_t)nk, 1) != KILN_OK) {
            fail_once(s, "expert matmul dispatch");
            return -1;
        }
    }
    return 0;
}

/* Up to MOE_BYID_MAX_TOKENS tokens the experts run by id on the device's own routing, one
 * workgroup per (row, (token, slot) entry) (decode, small batches, speculative verification). A
 * longer chunk (prefill), up to MOE_ROUTED_MAX_TOKENS, has its entries sorted by expert on the
 * device too (moe_sort.comp) and runs them in tiles of 8 entries of one expert (matmul8_id), so an
 * expert's weights are read once per 8 of its entries, as the host-grouped path did — without the
 * submit per MoE layer the host's routing needed. A token's floats are the same either way (the same
 * routing, the same per-token matmul operations, the same combine order). Longer chunks, or more
 * tiles than the device's workgroup grid holds: the host-routed path. */
#define MOE_BYID_MAX_TOKENS 16
#define MOE_ROUTED_MAX_TOKENS 8192

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
        fail_once(s, "routing dispatch");
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
    ok = ok && stage(s, logits, (size_t)T * E * sizeof(float), 0, &lr) == 0 && stage(s, tab, (2 * (size_t)T * K + E) * sizeof *tab, 1, &tr) == 0 &&
         record_route(s, &c, 1, lr, tr, tr.off + 2u * T * K, T) == 0 && flush(s) == 0;
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

/* backend.h moe_routed: routing, the experts by id and the combine, recorded on the device; -1
 * (nothing recorded) where the device cannot: no 64-bit floats or device addresses, more than 512
 * experts or 64 selected, an expert in several chunks. */
static int vk_moe_routed(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, const kiln_weight *gate,
                         const kiln_weight *up, const kiln_weight *down, const float *X, int n, float *hg, float *ug, float *yg, float *Y) {
    vk_state *s = ST(be);
    const int E = c->n_experts, K = c->n_used, D = c->dim, F = c->ffn, nk = n * K;
    if (s->failed || !kiln_vk_has_bda(s->vk) || !kiln_vk_has_f64(s->vk) || n <= 0 || n > MOE_ROUTED_MAX_TOKENS || E < 1 || E > 512 || K < 1 ||
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
    int ok = stage(s, tab, words * sizeof *tab, 0, &tr) == 0 && resolve(s, logits, (size_t)n * (size_t)E * sizeof(float), 0, &lr) == 0 &&
             resolve(s, X, (size_t)n * (size_t)D * sizeof(float), 0, &xr) == 0 &&
             resolve(s, hg, (size_t)nk * (size_t)F * sizeof(float), 1, &hr) == 0 && resolve(s, ug, (size_t)nk * (size_t)F * sizeof(float), 1, &ur) == 0 &&
             resolve(s, yg, (size_t)nk * (size_t)D * sizeof(float), 1, &gr) == 0 && resolve(s, Y, (size_t)n * (size_t)D * sizeof(float), 1, &yr) == 0;
    free(tab);
    /* the selection (ids, weights) into the table */
    ok = ok && record_route(s, c, bias != NULL, lr, tr, tr.off + 3u * (uint32_t)nk + 12u * (uint32_t)E, n) == 0;
    const uint32_t a0 = tr.off + 3u * (uint32_t)nk, ord = a0 + 13u * (uint32_t)E;
    if (ok && tiles) { /* the entries by expert (moe_sort.comp) */
        const struct { uint32_t nk, E, ids_off, ord_off, cap; } sp = {(uint32_t)nk, (uint32_t)E, tr.off, ord, 8u * tiles};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_sort, &tr.b, 1, &sp, sizeof sp, 1, 1, 1) != KILN_OK) { fail_once(s, "dispatch"); ok = 0; }
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
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_combine, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) != KILN_OK) { fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && done(s) == 0) return 0;
    abandon(s); /* what was recorded only wrote the scratch rows and Y, which the host path writes again */
    return -1;
}

/* The weighted combine on the device (moe_combine.comp; bit for bit the host's): the expert
 * outputs stay where the expert matmuls wrote them, and the step goes on without a submit. */
static void vk_moe_combine(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y) {
    vk_state *s = ST(be);
    if (n > 0 && K > 0 && dim > 0 && !s->failed && (uint32_t)n <= s->max_gx) {
        int max_slot = 0;
        for (int i = 0; i < n * K; i++) max_slot = slot[i] > max_slot ? slot[i] : max_slot;
        vref gr, yr, sr, wr;
        const size_t nk = (size_t)n * (size_t)K;
        if (resolve(s, yg, ((size_t)max_slot + 1) * (size_t)dim * sizeof(float), 0, &gr) == 0 &&
            resolve(s, Y, (size_t)n * (size_t)dim * sizeof(float), 1, &yr) == 0 && resolve(s, slot, nk * sizeof(int), 0, &sr) == 0 &&
            resolve(s, wt, nk * sizeof(float), 0, &wr) == 0) {
            const kiln_vk_bind b[4] = {gr.b, yr.b, sr.b, wr.b};
            const struct { uint32_t K, dim, g_off, y_off, s_off, w_off; } pc = {(uint32_t)K, (uint32_t)dim, gr.off, yr.off, sr.off, wr.off};
            s->n_dispatch++;
            if (kiln_vk_dispatch(s->vk, KILN_VK_SH_moe_combine, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) == KILN_OK) {
                if (done(s) == 0) return;
            } else fail_once(s, "dispatch");
        }
        abandon(s);
    } else host_first(s);
    kiln_backend_cpu_ops.moe_combine(be, n, K, dim, slot, wt, yg, Y);
}
/* ---- DeepSeek sparse attention (DSA): the indexer's norm and FP8 rounding, its scan and top-k, the
 * attention over the selected rows ----------------------------------------------------------------- */
static void vk_layernorm(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps) {
    vk_state *s = ST(be);
    if (rows <= 0 || width <= 0) return;
    const size_t bytes = (size_t)rows * (size_t)width * sizeof(float);
    vref orr, xr, wr, br;
    int ok = !s->failed && resolve(s, out, bytes, 1, &orr) == 0;
    if (ok) {
        if (out == x) xr = orr;
        else ok = resolve(s, x, bytes, 0, &xr) == 0;
    }
    ok = ok && resolve(s, w, (size_t)width * sizeof(float), 0, &wr) == 0;
    if (ok) {
        if (b) ok = resolve(s, b, (size_t)width * sizeof(float), 0, &br) == 0;
        else br = wr; /* bound but not read */
    }
    for (int r = 0; ok && r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const struct { uint32_t width, o_off, x_off, w_off, b_off, has_b; float eps; } pc = {
            (uint32_t)width, orr.off + (uint32_t)r * (uint32_t)width, xr.off + (uint32_t)r * (uint32_t)width, wr.off, br.off, b != NULL, eps};
        const kiln_vk_bind bd[4] = {orr.b, xr.b, wr.b, br.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, kiln_vk_has_f64(s->vk) ? KILN_VK_SH_layernorm64 : KILN_VK_SH_layernorm, bd, 4, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && done(s) == 0) return;
    if (!s->failed) abandon(s);
    else host_first(s);
    kiln_be_common_layernorm(be, out, x, w, b, rows, width, eps);
}

/* fp8_round.comp: widths of whole 128-value blocks; the rotation over at most 2,048 values (its
 * row in shared memory). */
static void vk_fp8_round(const kiln_backend *be, float *x, int rows, int width, int hadamard) {
    vk_state *s = ST(be);
    if (rows <= 0 || width <= 0) return;
    vref xr;
    int ok = !s->failed && width % 128 == 0 && (!hadamard || (width <= 2048 && (width & (width - 1)) == 0)) &&
             resolve(s, x, (size_t)rows * (size_t)width * sizeof(float), 1, &xr) == 0;
    for (int r = 0; ok && r < rows; r += (int)s->max_gx) {
        const int rr = rows - r < (int)s->max_gx ? rows - r : (int)s->max_gx;
        const struct { uint32_t width, x_off, hadamard; float norm; } pc = {(uint32_t)width, xr.off + (uint32_t)r * (uint32_t)width, hadamard != 0,
                                                                             hadamard ? 1.0f / sqrtf((float)width) : 1.0f};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_fp8_round, &xr.b, 1, &pc, sizeof pc, (uint32_t)rr, 1, 1) != KILN_OK) { fail_once(s, "dispatch"); ok = 0; }
    }
    if (ok && done(s) == 0) return;
    /* a shape the shader does not take is the host's by design, not a fallback */
    if (!s->failed && width % 128 == 0 && (!hadamard || (width <= 2048 && (width & (width - 1)) == 0))) abandon(s);
    else host_first(s);
    kiln_be_common_fp8_round(be, x, rows, width, hadamard);
}

/* Whether pointer p's [p, p + bytes) lies in a buffer kiln_be_alloc handed out (bound in place:
 * the indexer's selection is written by one dispatch and read by the next, within one step). */
static int ours(vk_state *s, const void *ptr, size_t bytes) {
    const uint8_t *p = ptr;
    int found = 0;
    pthread_mutex_lock(&s->allocs_mu);
    for (int i = 0; i < s->n_allocs && !found; i++) found = p >= s->allocs[i].p && p + bytes <= s->allocs[i].p + s->allocs[i].size;
    pthread_mutex_unlock(&s->allocs_mu);
    return found;
}

/* Whether the sparse ops of this layer run on the device: a DSA pool whose arrays the shaders
 * address, the indexer's selection arrays our buffers, and with KV integrity rows of whole words
 * (hashed where they are read). */
static int dsa_on_device(vk_state *s, const kiln_kv_pool *p, int layer, int n, const int32_t *sel, const int *nsel, int topk) {
    if (s->failed || !kiln_vk_has_bda(s->vk) || !p->dsa_key_at || n <= 0 || topk <= 0) return 0;
    if ((uint32_t)n > kiln_vk_max_groups_y(s->vk) || (uint32_t)n > s->max_gx) return 0;
    if (!ours(s, sel, (size_t)n * (size_t)topk * sizeof *sel) || !ours(s, nsel, (size_t)n * sizeof *nsel)) return 0;
    if (p->integ && !kiln_kv_integ_fusable(p)) return 0;
    return kiln_vk_has_bda(s->vk) && arrays_on_device(s, p, layer);
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
    call_reach(n, seq, pos, pt, hashing, 2, first, reach, *hbase, &n_ent, n_sums, max_lim); /* [slot][K, V] of the one KV head */
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
        if (flush(s) != 0) { free(tab); return -1; }
        kiln_vk_buf_destroy(s->vk, &s->idx_scores);
        size_t cap = 4096;
        while (cap < sbytes) cap *= 2;
        if (cap > s->idx_budget) cap = s->idx_budget & ~(size_t)3; /* never past one binding's range */
        if (kiln_vk_buf_create(s->vk, cap, 0, &s->idx_scores) != KILN_OK) { free(tab); fail_once(s, "indexer scratch"); return -1; }
    }
    vref qr = {{s->lut.buf, 0, VK_WHOLE_SIZE}, 0}, wr = qr, tr, hr = qr;
    int ok = (!qi || (resolve(s, qi, (size_t)n * (size_t)n_ih * (size_t)d * sizeof(float), 0, &qr) == 0 &&
                      resolve(s, w, (size_t)n * (size_t)n_ih * sizeof(float), 0, &wr) == 0)) &&
             stage(s, tab, words * sizeof *tab, 0, &tr) == 0 && (!n_sums || stage(s, ah->hs, n_sums * sizeof *ah->hs, 1, &hr) == 0);
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
        } pc = {device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer), (uint32_t)p->dsa_key_at,
                (uint32_t)pt, (uint32_t)unit, (uint32_t)p->n_pages, (uint32_t)d, (uint32_t)n_ih, qr.off, wr.off, 0, (uint32_t)max_lim, w_scale,
                qi != NULL, (uint32_t)hashing, 3u * (uint32_t)n, key_off, (uint32_t)t0};
        const kiln_vk_bind b[5] = {qr.b, wr.b, tr.b, sb, hr.b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_index, b, 5, &pc, sizeof pc, (uint32_t)units, (uint32_t)g, 1) != KILN_OK) {
            fail_once(s, "indexer dispatch");
            return -1;
        }
        if (!qi) continue;
        const struct { uint32_t topk, s_off, s_stride, sel_off, nsel_off, tok0; } tc = {(uint32_t)topk, 0, (uint32_t)max_lim, selr->off, nr->off, (uint32_t)t0};
        const kiln_vk_bind tb[4] = {sb, selr->b, tr.b, nr->b};
        s->n_dispatch++;
        if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_topk, tb, 4, &tc, sizeof tc, (uint32_t)g, 1, 1) != KILN_OK) {
            fail_once(s, "top-k dispatch");
            return -1;
        }
    }
    return 0;
}

/* A hashed pass recorded: its sums compared with the seals at the flush that runs it. Takes *ah. */
static int queue_check(vk_state *s, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, att_hash *ah) {
    att_check c = {p, layer, n, malloc((size_t)n * sizeof *c.seq), malloc((size_t)n * sizeof *c.pos), *ah, {0, 0}};
    kiln_kv_integ_call_state(p, &c.call);
    if (!c.seq || !c.pos || grow((void **)&s->checks, &s->cap_checks, s->n_checks + 1, sizeof *s->checks)) {
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
static void vk_kv_index_topk(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *qi,
                             int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel) {
    vk_state *s = ST(be);
    const int keyed = p->dsa_key_at && d == p->cfg.dsa_key && off == p->cfg.dsa_latent + p->cfg.dsa_rope && kiln_kv_dsa_has_key(&p->cfg, layer);
    if (n <= 0) return;
    if (!keyed || d % 128 || !dsa_on_device(s, p, layer, n, sel, nsel, topk)) {
        host_first(s);
        kiln_be_common_kv_index_topk(be, p, layer, n, seq, pos, qi, n_ih, d, off, w, w_scale, topk, sel, nsel);
        return;
    }
    const int hashing = kiln_kv_integ_fusable(p);
    if (hashing) kiln_kv_integ_begin_attend(p, layer, n, seq, pos); /* a new verification round for this layer */
    att_hash ah = {NULL, NULL};
    vref selr, nr;
    int ok = resolve(s, sel, (size_t)n * (size_t)topk * sizeof *sel, 1, &selr) == 0 && resolve(s, nsel, (size_t)n * sizeof *nsel, 1, &nr) == 0 &&
             record_index(s, p, layer, n, seq, pos, qi, n_ih, d, w, w_scale, topk, &selr, &nr, &ah) == 0;
    if (ok && hashing) ok = queue_check(s, p, layer, n, seq, pos, &ah) == 0;
    if (ok && !hashing) free(ah.hbase);
    if (ok && done(s) == 0) return;
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
static void vk_kv_attend_sparse(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                                const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify, float *out) {
    vk_state *s = ST(be);
    const int lat = p->cfg.dsa_latent, vd = p->cfg.v_dim;
    if (n <= 0) return;
    if (kq != lat + p->cfg.dsa_rope || kq > 1024 || vd > 1024 || vd > lat || n_heads <= 0 || (uint32_t)n_heads > s->max_gx ||
        !dsa_on_device(s, p, layer, n, sel, nsel, topk)) {
        host_first(s);
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
    ok = ok && tab && resolve(s, q, (size_t)n * (size_t)n_heads * (size_t)kq * sizeof(float), 0, &qr) == 0 &&
         resolve(s, out, (size_t)n * (size_t)n_heads * (size_t)vd * sizeof(float), 1, &orr) == 0 && stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
         resolve(s, sel, (size_t)n * (size_t)topk * sizeof *sel, 0, &selr) == 0 && resolve(s, nsel, (size_t)n * sizeof *nsel, 0, &nr) == 0;
    free(tab);
    if (ok) {
        const struct {
            uint64_t kaddr;
            uint32_t page_k, row_k, pt, n_pages;
            uint32_t lat, rope, rope_bf16, v_dim, n_heads;
            uint32_t topk, q_off, o_off, sel_off, nsel_off, ent_off;
            float scale;
        } pc = {device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer),
                (uint32_t)p->cfg.page_tokens, (uint32_t)p->n_pages, (uint32_t)lat, (uint32_t)p->cfg.dsa_rope, p->cfg.dtype == KILN_KV_BF16,
                (uint32_t)vd, (uint32_t)n_heads, (uint32_t)topk, qr.off, orr.off, selr.off, nr.off, 3u * (uint32_t)n, scale};
        const kiln_vk_bind b[5] = {qr.b, orr.b, tr.b, selr.b, nr.b};
        s->n_dispatch++;
        ok = kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_attend_sparse, b, 5, &pc, sizeof pc, (uint32_t)n_heads, (uint32_t)n, 1) == KILN_OK;
        if (!ok) fail_once(s, "sparse attention dispatch");
    }
    if (ok && done(s) == 0) return;
    abandon(s);
    free(ah.hs);
    free(ah.hbase);
    kiln_be_common_kv_attend_sparse(be, p, layer, n, seq, pos, sel, nsel, topk, q, n_heads, kq, scale, verify, out);
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
        if (kiln_kv_row_k_at(p, layer) % 4 || !arrays_on_device(s, p, layer) || (p->integ && !kiln_kv_integ_fusable(p))) return 0;
        return !p->integ || kiln_kv_integ_store_appends(p, seq, pos, n, layer);
    }
    if (p->k_mean && (c->dtype != KILN_KV_FP8 || c->v_shares_k)) return 0; /* key means: FP8 K arrays only (kv.c has_kmean) */
    if (c->dtype != KILN_KV_F32 && c->dtype != KILN_KV_BF16 && c->dtype != KILN_KV_FP8) return 0;
    const size_t rk = kiln_kv_row_k_at(p, layer), rv = c->v_shares_k ? rk : p->row_v, eb = p->elem_bytes;
    if (rk != (size_t)c->k_dim * eb || (!c->v_shares_k && rv != (size_t)c->v_dim * eb) || (rk & 3) || (rv & 3)) return 0;
    if (c->n_kv_heads <= 0 || !arrays_on_device(s, p, layer)) return 0;
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
    int ok = resolve(s, k, xbytes, 0, &xr) == 0 && stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!hashing || stage(s, *hs, (size_t)n * sizeof **hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)n > s->max_gx) return -1;
    const struct {
        uint64_t kaddr;
        uint32_t page_k, row_k;
        uint32_t lat, rope, key, rope_bf16;
        uint32_t x_tok, x_off;
        uint32_t key_off, hash;
    } pc = {device_address(s, p->k[layer], 1), (uint32_t)kiln_kv_page_k_at(p, layer), (uint32_t)kiln_kv_row_k_at(p, layer), (uint32_t)c->dsa_latent,
            (uint32_t)c->dsa_rope, has_key ? (uint32_t)c->dsa_key : 0u, c->dtype == KILN_KV_BF16, (uint32_t)k_tok, xr.off, 3u * (uint32_t)n,
            (uint32_t)hashing};
    const kiln_vk_bind b[4] = {xr.b, xr.b, tr.b, hr.b};
    s->n_dispatch++;
    if (kiln_vk_dispatch(s->vk, KILN_VK_SH_kv_store_dsa, b, 4, &pc, sizeof pc, (uint32_t)n, 1, 1) != KILN_OK) {
        fail_once(s, "KV store dispatch");
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
    int ok = resolve(s, k, kbytes, 0, &kr) == 0 && resolve(s, v, vbytes, 0, &vr) == 0 && stage(s, tab, words * sizeof *tab, 0, &tr) == 0 &&
             (!hashing || stage(s, *hs, (size_t)n * (size_t)nk * (size_t)H * sizeof **hs, 1, &hr) == 0);
    free(tab);
    if (!ok || (uint32_t)(nk * H) > s->max_gx || (uint32_t)n > kiln_vk_max_groups_y(s->vk)) return -1;
    const size_t page_k = kiln_kv_page_k_at(p, layer);
    const store_push pc = {.kaddr = device_address(s, p->k[layer], 1), .vaddr = device_address(s, p->v[layer], 1),
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
        fail_once(s, "KV store dispatch");
        return -1;
    }
    return 0;
}

/* The KV store on the device where store_on_device says so: the rows are written by the step's
 * recording, no submit of its own — the layer's attention follows in the same command buffer.
 * KV integrity: the stores' bookkeeping now, their seals from the shader's row hashes at the flush
 * that runs them (before the attentions' checks of that flush). Otherwise the host stores. */
static void vk_kv_store(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer, const float *k, int64_t k_tok,
                        const float *v, int64_t v_tok) {
    vk_state *s = ST(be);
    if (n <= 0) return;
    if (!store_on_device(s, p, layer, seq, pos, n)) {
        host_first(s);
        kiln_backend_cpu_ops.kv_store(be, p, seq, pos, n, layer, k, k_tok, v, v_tok);
        return;
    }
    st_seal c = {p, layer, n, NULL, NULL, NULL, NULL};
    if (p->integ) {
        c.seq = malloc((size_t)n * sizeof *c.seq);
        c.pos = malloc((size_t)n * sizeof *c.pos);
        c.pend = malloc((size_t)n * sizeof *c.pend);
        if (!c.seq || !c.pos || !c.pend || grow((void **)&s->seals, &s->cap_seals, s->n_seals + 1, sizeof *s->seals)) {
            st_seal_free(&c);
            host_first(s);
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
    if (ok && done(s) == 0) return;
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
static void vk_kv_attend(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *q,
                         int n_heads, float scale, float *out) {
    vk_state *s = ST(be);
    if (n <= 0) return;
    if (!attend_on_device(s, p, layer, n_heads)) {
        host_first(s);
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
        ok = c.seq && c.pos && grow((void **)&s->checks, &s->cap_checks, s->n_checks + 1, sizeof *s->checks) == 0;
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
    if (ok && done(s) == 0) return;
    abandon(s); /* runs what was recorded, copybacks into ah.hs included, before ah is freed */
    if (!ok) {
        free(ah.hs);
        free(ah.hbase);
    }
    kiln_backend_cpu_ops.kv_attend(be, p, layer, n, seq, pos, q, n_heads, scale, out);
}
static int64_t vk_argmax(const kiln_backend *be, const float *x, int64_t len) {
    host_first(ST(be));
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
    (void)flush(s);
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
    .add = vk_add,
    .copy_rows = vk_copy_rows,
    .add_bias = vk_add_bias,
    .swiglu = vk_swiglu,
    .matmul_many = vk_matmul_many,
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
};

/* ---- lifetime ------------------------------------------------------------------------------------ */
kiln_status kiln_backend_vulkan_open(kiln_backend *be, int device_index) {
    vk_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
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
    const char *ib = getenv("KILN_VK_INDEX_BYTES");
    if (ib) {
        char *end;
        errno = 0;
        const unsigned long long v = strtoull(ib, &end, 10);
        if (errno || end == ib || *end || v < 4 || v > s->idx_budget) {
            kiln_status est = kiln_fail(KILN_ERR_INVALID_ARG, "KILN_VK_INDEX_BYTES: '%s' is not a byte count from 4 to %zu", ib, s->idx_budget);
            kiln_vk_close(s->vk);
            pthread_mutex_destroy(&s->allocs_mu);
            free(s);
            return est;
        }
        s->idx_budget = (size_t)v & ~(size_t)3;
    }
    st = kiln_vk_buf_create(s->vk, 256 * sizeof(float), 0, &s->lut);
    if (st == KILN_OK) st = kiln_vk_upload(s->vk, &s->lut, 0, kiln_fp8_e4m3_table, 256 * sizeof(float));
    /* the staging arena is a convenience: without it (no memory for 4 MiB) every staged operand
     * gets a buffer of its own (stage) */
    if (st == KILN_OK && kiln_vk_buf_create(s->vk, (size_t)4 << 20, 1, &s->arena) != KILN_OK) memset(&s->arena, 0, sizeof s->arena);
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
    (void)flush(s); /* a step left open: its copybacks and checks run (or are dropped) and are freed */
    if (getenv("KILN_VK_STATS")) { /* how well the deferred steps batch (docs/VULKAN.md) */
        uint64_t rec = 0, rep = 0, prep = 0;
        kiln_vk_program_stats(s->vk, &rec, &rep, &prep);
        fprintf(stderr, "kiln: %s: %llu dispatches in %llu submits (%llu command buffers recorded, %llu replayed; host %.2f ms preparing them), "
                        "%llu native ops computed on the host\n",
                kiln_vk_device_name(s->vk), (unsigned long long)s->n_dispatch, (unsigned long long)kiln_vk_submits(s->vk), (unsigned long long)rec,
                (unsigned long long)rep, (double)prep / 1e6, (unsigned long long)s->n_host);
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
    kiln_vk_buf_destroy(s->vk, &s->arena);
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

int kiln_backend_vulkan_built(void) { return 1; }
