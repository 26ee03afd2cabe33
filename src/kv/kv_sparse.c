/* kv_sparse.c — DeepSeek sparse attention over the paged MLA pool (kv.h: kiln_kv_index_topk_cx,
 * kiln_kv_attend_sparse_cx; the model side is model/mla.c, the semantics docs/DSA.md).
 *
 * Row layout of a DSA pool (n_kv_heads 1, v_shares_k): the compact row of kv.h, one per token per
 * layer: [c (kv_lora_rank) as E4M3 codes + a scale per 128 | k_pe (qk_rope) in the pool's dtype |
 * indexer key (index_head_dim) as E4M3 codes + a scale per 128]. c and the indexer key are values
 * the model already rounded that way (act_quant), so the codes hold them exactly.
 *
 * The indexer scan reads the keys' codes where they lie (no dequantized copy) through the ISA's
 * kiln_kv_index_fn (kv_isa.h: one fixed summation order, the same bits on every ISA): Hi·d
 * multiply-adds per position. The sparse attention reads topk rows (dequantized by
 * kiln_kv_read_row_part) whatever the context length, so decode attention is flat in context length
 * beyond topk apart from the scan. Work is split over tokens (prefill) or heads (decode) on kiln's
 * worker pool. */
#include "kv/kv.h"
#include "kv/kv_isa.h"
#include "kv/integrity.h"
#include "base/fp.h"
#include "base/pool.h"
#include "base/status.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* cumulative wall time of the two ops, in nanoseconds (kiln_kv_sparse_times) */
static uint64_t index_ns, attend_ns;

void kiln_kv_sparse_times(double *index_s, double *attend_s) {
    *index_s = (double)__atomic_load_n(&index_ns, __ATOMIC_RELAXED) * 1e-9;
    *attend_s = (double)__atomic_load_n(&attend_ns, __ATOMIC_RELAXED) * 1e-9;
}

static void add_ns(uint64_t *ctr, double t0) { __atomic_fetch_add(ctr, (uint64_t)((kiln_now() - t0) * 1e9), __ATOMIC_RELAXED); }

/* ---- top-k: a min-heap of the kept positions, "worse" = lower score, or equal score and later position */

typedef struct { float s; int32_t t; } scored;

static int worse(scored a, scored b) { return a.s < b.s || (a.s == b.s && a.t > b.t); }

static void sift_down(scored *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(h[l], h[m])) m = l;
        if (r < n && worse(h[r], h[m])) m = r;
        if (m == i) return;
        scored x = h[i]; h[i] = h[m]; h[m] = x;
        i = m;
    }
}

static int cmp_pos(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The topk best of scores[0, n) that are not NaN / -inf (positions whose pages were not read), in
 * increasing position order; returns how many. heap: room for topk entries. */
static int select_topk(const float *scores, int n, int topk, scored *heap, int32_t *out) {
    int k = 0;
    for (int t = 0; t < n; t++) {
        float s = scores[t];
        if (!(s > -INFINITY)) continue; /* -inf and NaN */
        scored c = {s, t};
        if (k < topk) {
            heap[k++] = c;
            if (k == topk)
                for (int i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
        } else if (worse(heap[0], c)) {
            heap[0] = c;
            sift_down(heap, k, 0);
        }
    }
    for (int i = 0; i < k; i++) out[i] = heap[i].t;
    qsort(out, (size_t)k, sizeof *out, cmp_pos);
    return k;
}

/* ---- the indexer scan ---- */

#define SCAN_BLOCK 64    /* keys whose row pointers are gathered for one kernel call */
#define SCAN_CHUNK 512   /* positions per task: a decode context of 1k already keeps 2 threads busy */

/* The scalar kernel of kiln_kv_index_fn (kv_isa.h): the definition, written out. */
void kiln_kv_index_scores_scalar(const uint8_t *const *key, int n, int d, const float *qt, int hp, const float *w, int hi, float *scratch,
                                 float *score) {
    float *dot = scratch; /* [hi] */
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < hi; h++) {
            float dt = 0.0f;
            for (int b0 = 0; b0 < d; b0 += 128) {
                float part = 0.0f, sc;
                for (int e = b0; e < b0 + 128; e++) part = fmaf(qt[(size_t)e * hp + h], kiln_fp8_e4m3_to_f32(key[i][e]) * 0x1p-8f, part);
                memcpy(&sc, key[i] + d + b0 / 32, 4);
                dt = fmaf(sc * 256.0f, part, dt);
            }
            dot[h] = dt;
        }
        score[i] = kiln_kv_index_headsum(dot, w, hi);
    }
}

/* The integrity walker (kiln_kv_integ_attend) hands back the span it was given: the scan's state
 * starts with one, so the callback recovers it. */
typedef struct {
    kiln_kv_span sp;
    kiln_kv_index_fn kernel;
    const kiln_kv_pool *p;
    const kiln_kv_seq *s;
    int layer, Hi, hp, d;
    const float *qt, *w;  /* [d, hp] this token's queries transposed, [Hi] head weights × w_scale */
    float *scores;        /* [ctx] of this token */
    float *scratch;       /* KILN_KV_INDEX_SCRATCH(d, hp) */
} idx_scan;

static void scan_range(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) {
    (void)rw;
    const idx_scan *c = (const idx_scan *)sp;
    const kiln_kv_pool *p = c->p;
    const int pt = p->cfg.page_tokens;
    const uint8_t *key[2][SCAN_BLOCK];
    const size_t kbytes = (size_t)c->d + (size_t)c->d / 32;
    /* head 0's row of position pos: its indexer key (codes, then scales) */
    const size_t page_b = kiln_kv_page_k_at(p, c->layer), row_b = kiln_kv_row_k_at(p, c->layer);
#define KEY_AT(pos) (p->k[c->layer] + (size_t)c->s->pages[(pos) / pt] * page_b + (size_t)((pos) % pt) * row_b + p->dsa_key_at)
    for (int t = t0; t < t1 && t < t0 + SCAN_BLOCK; t++) key[0][t - t0] = KEY_AT(t);
    for (int b0 = t0, cur = 0; b0 < t1; b0 += SCAN_BLOCK, cur ^= 1) {
        const int B = t1 - b0 < SCAN_BLOCK ? t1 - b0 : SCAN_BLOCK;
        /* the next block's keys are scattered over the pool's pages: fetched while this one computes
         * (at 16k positions a layer's keys are ~2 MB, out of L2) */
        for (int t = b0 + B; t < t1 && t < b0 + B + SCAN_BLOCK; t++) {
            const uint8_t *k = key[cur ^ 1][t - b0 - B] = KEY_AT(t);
            for (size_t o = 0; o < kbytes; o += 64) __builtin_prefetch(k + o, 0, 3);
        }
        c->kernel(key[cur], B, c->d, c->qt, c->hp, c->w, c->Hi, c->scratch, c->scores + b0);
    }
#undef KEY_AT
}

typedef struct {
    const kiln_kctx *cx;
    const kiln_kv_pool *p;
    int layer, Hi, d, topk, n;
    kiln_kv_seq *const *seq;
    const int *pos;
    const float *qi;
    float *w;                 /* [n, Hi] head weights × w_scale */
    float **scores;           /* [n] → [pos + 1] */
    const int64_t *task0;     /* [n + 1] first task of each token */
    int32_t *sel;
    int *nsel;
} idx_job;

/* Task k: one SCAN_CHUNK of one token's context. */
static void scan_task(void *arg, int64_t k) {
    const idx_job *j = arg;
    int i = 0;
    while (j->task0[i + 1] <= k) i++;
    const int ctx = j->pos[i] + 1, t0 = (int)(k - j->task0[i]) * SCAN_CHUNK, t1 = t0 + SCAN_CHUNK < ctx ? t0 + SCAN_CHUNK : ctx;
    const int Hi = j->Hi, d = j->d, hp = (Hi + 15) / 16 * 16;
    const kiln_kv_ktable *tab = kiln_kv_table_for(j->cx->isa);
    idx_scan c;
    memset(&c, 0, sizeof c);
    c.kernel = tab ? tab->index_scores : kiln_kv_index_scores_scalar;
    c.p = j->p;
    c.s = j->seq[i];
    c.layer = j->layer;
    c.Hi = Hi;
    c.hp = hp;
    c.d = d;
    c.w = j->w + (size_t)i * Hi;
    c.scores = j->scores[i];
    float *qt = calloc((size_t)d * (size_t)hp, sizeof *qt);
    c.scratch = malloc(KILN_KV_INDEX_SCRATCH(d, hp) * sizeof *c.scratch);
    if (qt && c.scratch) { /* else the range stays -inf: never selected */
        const float *q = j->qi + (size_t)i * Hi * d;
        for (int h = 0; h < Hi; h++)
            for (int e = 0; e < d; e++) qt[(size_t)e * hp + h] = q[(size_t)h * d + e];
        c.qt = qt;
        if (j->p->integ) {
            kiln_kv_rows rw;
            memset(&rw, 0, sizeof rw);
            rw.R = 1;
            rw.lim[0] = ctx;
            kiln_kv_integ_attend(j->p, j->layer, c.s, 0, scan_range, &c.sp, &rw, t0, t1, 0);
        } else {
            scan_range(&c.sp, NULL, t0, t1);
        }
    }
    free(qt);
    free(c.scratch);
}

static void select_token(void *arg, int64_t i) {
    const idx_job *j = arg;
    scored *heap = malloc((size_t)j->topk * sizeof *heap);
    j->nsel[i] = heap ? select_topk(j->scores[i], j->pos[i] + 1, j->topk, heap, j->sel + (size_t)i * j->topk) : 0;
    free(heap);
}

void kiln_kv_index_topk_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                           const float *qi, int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel) {
    const double t0 = kiln_now();
    if (!p->dsa_key_at || d != p->cfg.dsa_key || off != p->cfg.dsa_latent + p->cfg.dsa_rope || !kiln_kv_dsa_has_key(&p->cfg, layer)) {
        /* not a DSA pool's keyed layer (mla.c checks the pool first): nothing to select */
        for (int i = 0; i < n; i++) nsel[i] = 0;
        return;
    }
    float **scores = calloc((size_t)n, sizeof *scores), *ws = malloc((size_t)n * (size_t)n_ih * sizeof *ws);
    int64_t *task0 = malloc(((size_t)n + 1) * sizeof *task0);
    int ok = scores && ws && task0;
    for (int i = 0; ok && i < n; i++) {
        ok = (scores[i] = malloc(((size_t)pos[i] + 1) * sizeof **scores)) != NULL;
        for (int t = 0; ok && t <= pos[i]; t++) scores[i][t] = -INFINITY;
    }
    if (ok) {
        task0[0] = 0;
        for (int i = 0; i < n; i++) task0[i + 1] = task0[i] + (pos[i] + SCAN_CHUNK) / SCAN_CHUNK;
        for (int i = 0; i < n * n_ih; i++) ws[i] = w[i] * w_scale;
        idx_job j = {.cx = cx, .p = p, .layer = layer, .Hi = n_ih, .d = d, .topk = topk, .n = n, .seq = seq, .pos = pos,
                     .qi = qi, .w = ws, .scores = scores, .task0 = task0, .sel = sel, .nsel = nsel};
        if (p->integ) kiln_kv_integ_begin_attend(p, layer, n, seq, pos); /* a new verification round for this layer */
        kiln_pool_for(task0[n], scan_task, &j, task0[n] > 1 ? cx->threads : 1);
        kiln_pool_for(n, select_token, &j, n > 1 ? cx->threads : 1);
    } else {
        for (int i = 0; i < n; i++) nsel[i] = 0; /* out of memory: nothing selected (the step attends to nothing) */
    }
    for (int i = 0; scores && i < n; i++) free(scores[i]);
    free(scores);
    free(ws);
    free(task0);
    add_ns(&index_ns, t0);
}

/* ---- sparse attention ---- */

typedef struct {
    kiln_kv_span sp;
    unsigned char *ok;
} mark_ctx;

static void mark_range(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) {
    (void)rw;
    const mark_ctx *c = (const mark_ctx *)sp;
    memset(c->ok + t0, 1, (size_t)(t1 - t0));
}

typedef struct {
    const kiln_kctx *cx;
    const kiln_kv_pool *p;
    int layer, topk, H, kq, vd;
    float scale;
    kiln_kv_seq *const *seq;
    const int32_t *sel;
    const int *nsel;
    const float *q;
    float *out;
    const float *rows; /* decode: the one token's gathered rows [nsel, kq] */
} sparse_job;

/* Gathers token i's selected rows into g [nsel[i], kq]. */
static void gather(const sparse_job *j, int64_t i, float *g) {
    const int32_t *s = j->sel + (size_t)i * j->topk;
    for (int k = 0; k < j->nsel[i]; k++) kiln_kv_read_row_part(j->p, j->seq[i], j->layer, s[k], 0, 0, j->kq, g + (size_t)k * j->kq);
}

/* Head h of token i over the gathered rows g; sc: scratch [nsel[i]]. */
static void attend_head(const sparse_job *j, int64_t i, int h, const float *g, float *sc) {
    const int m = j->nsel[i], kq = j->kq, vd = j->vd;
    const float *q = j->q + ((size_t)i * j->H + (size_t)h) * kq;
    float *o = j->out + ((size_t)i * j->H + (size_t)h) * vd;
    memset(o, 0, (size_t)vd * sizeof *o);
    if (m == 0) return;
    float mx = -INFINITY;
    for (int k = 0; k < m; k++) {
        sc[k] = kiln_cx_dot(j->cx, q, g + (size_t)k * kq, kq) * j->scale;
        mx = fmaxf(mx, sc[k]);
    }
    float sum = 0.0f;
    for (int k = 0; k < m; k++) {
        float e = expf(sc[k] - mx);
        sum += e;
        const float *r = g + (size_t)k * kq;
        for (int c = 0; c < vd; c++) o[c] += e * r[c];
    }
    float inv = 1.0f / sum;
    for (int c = 0; c < vd; c++) o[c] *= inv;
}

static void sparse_token(void *arg, int64_t i) {
    const sparse_job *j = arg;
    const int m = j->nsel[i];
    float *g = malloc(((size_t)(m > 0 ? m : 1) * j->kq + (size_t)(m > 0 ? m : 1)) * sizeof *g);
    if (!g) return;
    gather(j, i, g);
    for (int h = 0; h < j->H; h++) attend_head(j, i, h, g, g + (size_t)(m > 0 ? m : 1) * j->kq);
    free(g);
}

static void sparse_head(void *arg, int64_t h) {
    const sparse_job *j = arg;
    float *sc = malloc((size_t)(j->nsel[0] > 0 ? j->nsel[0] : 1) * sizeof *sc);
    if (!sc) return;
    attend_head(j, 0, (int)h, j->rows, sc);
    free(sc);
}

void kiln_kv_attend_sparse_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                              const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify,
                              float *out) {
    const double t0 = kiln_now();
    int *keep = NULL;
    int32_t *sel_ok = NULL;
    if (verify && p->integ) { /* this layer's pages were not read by an indexer scan in this step: verify them here */
        keep = malloc((size_t)n * sizeof *keep);
        sel_ok = malloc((size_t)n * (size_t)topk * sizeof *sel_ok);
        if (!keep || !sel_ok) { free(keep); free(sel_ok); return; }
        kiln_kv_integ_begin_attend(p, layer, n, seq, pos);
        for (int i = 0; i < n; i++) {
            const int ctx = pos[i] + 1;
            mark_ctx c;
            memset(&c, 0, sizeof c);
            c.ok = calloc((size_t)ctx, 1);
            if (!c.ok) { keep[i] = 0; continue; }
            kiln_kv_rows rw;
            memset(&rw, 0, sizeof rw);
            rw.R = 1;
            rw.lim[0] = ctx;
            kiln_kv_integ_attend(p, layer, seq[i], 0, mark_range, &c.sp, &rw, 0, ctx, 0);
            int k = 0;
            for (int e = 0; e < nsel[i]; e++) {
                int32_t t = sel[(size_t)i * topk + e];
                if (t >= 0 && t < ctx && c.ok[t]) sel_ok[(size_t)i * topk + k++] = t;
            }
            keep[i] = k;
            free(c.ok);
        }
        sel = sel_ok;
        nsel = keep;
    }
    sparse_job j = {.cx = cx, .p = p, .layer = layer, .topk = topk, .H = n_heads, .kq = kq, .vd = p->cfg.v_dim, .scale = scale, .seq = seq,
                    .sel = sel, .nsel = nsel, .q = q, .out = out};
    if (n == 1) { /* decode: gather once, heads in parallel */
        float *g = malloc((size_t)(nsel[0] > 0 ? nsel[0] : 1) * (size_t)kq * sizeof *g);
        if (g) {
            gather(&j, 0, g);
            j.rows = g;
            kiln_pool_for(n_heads, sparse_head, &j, cx->threads);
            free(g);
        }
    } else {
        kiln_pool_for(n, sparse_token, &j, cx->threads);
    }
    free(keep);
    free(sel_ok);
    add_ns(&attend_ns, t0);
}
