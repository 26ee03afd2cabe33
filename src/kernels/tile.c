/* tile.c — the tile layouts of kiln_weight (see gemv.h): the permutations, their inverse for one
 * row, and the policy of which weights get which. */
#include "kernels/gemv.h"
#include "kernels/gemv_isa.h"
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

/* Offset of byte b of row j (0..3) inside its 4-row group, tile layout. */
static size_t tiled_offset(size_t rb, int j, size_t b) {
    const size_t n = rb / 64, t = rb % 64;
    if (b < 64 * n) return 256 * (b / 64) + 64 * (size_t)j + b % 64;
    return 256 * n + t * (size_t)j + (b - 64 * n);
}

/* ---- the 16-row block interleave of Q8_0 / Q4_0 (gemv.h) ---- */
static int q16_format(const kiln_weight *w) { return w->fmt == KILN_WF_Q8_0 || w->fmt == KILN_WF_Q4_0; }
/* Row j (0..15) of a 16-row group: its block b from the group's interleaved bytes g into blk (the
 * GGUF block: f16 d, then 32 int8 / 16 nibble bytes). */
static void q16_block_get(const uint8_t *g, int q8, int64_t b, int j, uint8_t *blk) {
    const size_t bb = q8 ? 34 : 18;
    const uint8_t *gb = g + (size_t)b * 16 * bb;
    memcpy(blk, gb + 2 * j, 2);
    const int nv = q8 ? 8 : 4;
    for (int k = 0; k < nv; k++)
        for (int i = 0; i < 4; i++) blk[2 + 4 * k + i] = (uint8_t)(gb[32 + 64 * k + 4 * j + i] ^ (q8 ? 0x80 : 0));
}
static void q16_block_put(uint8_t *g, int q8, int64_t b, int j, const uint8_t *blk) {
    const size_t bb = q8 ? 34 : 18;
    uint8_t *gb = g + (size_t)b * 16 * bb;
    memcpy(gb + 2 * j, blk, 2);
    const int nv = q8 ? 8 : 4;
    for (int k = 0; k < nv; k++)
        for (int i = 0; i < 4; i++) gb[32 + 64 * k + 4 * j + i] = (uint8_t)(blk[2 + 4 * k + i] ^ (q8 ? 0x80 : 0));
}

/* ---- INT4 group 32 in the Q4_0 16-row interleave (tiled = KILN_TILE_Q16, gemv.h) ----
 * Row j's 32-column block b, its 16 packed bytes in checkpoint order (byte m: column 2m in the low
 * nibble, 2m + 1 in the high one), to and from the group's 256 bytes of the block: vector k's bytes
 * 4j..4j+3 hold columns 4k..4k+3 (low nibbles) and 16 + 4k.. (high nibbles), as Q4_0's. */
static int nib(const uint8_t *p, int c) { return (p[c / 2] >> (4 * (c & 1))) & 15; }
static void i4q16_block_get(const uint8_t *g, int64_t b, int j, uint8_t *out) {
    const uint8_t *gb = g + (size_t)b * 256;
    memset(out, 0, 16);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) {
            const uint8_t v = gb[64 * k + 4 * j + i];
            const int c0 = 4 * k + i, c1 = 16 + 4 * k + i;
            out[c0 / 2] |= (uint8_t)((v & 15) << (4 * (c0 & 1)));
            out[c1 / 2] |= (uint8_t)((v >> 4) << (4 * (c1 & 1)));
        }
}
static void i4q16_block_put(uint8_t *g, int64_t b, int j, const uint8_t *in) {
    uint8_t *gb = g + (size_t)b * 256;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) gb[64 * k + 4 * j + i] = (uint8_t)(nib(in, 4 * k + i) | nib(in, 16 + 4 * k + i) << 4);
}
static int i4q16(const kiln_weight *w) { return w->fmt == KILN_WF_INT4_GROUP && w->tiled == KILN_TILE_Q16; }

/* ---- the 16-row super-block interleave of Q4_K / Q5_K / Q6_K (gemv.h) ----
 * Each field of a super-block (a range of its bytes) is cut into units of u bytes; the field of all
 * 16 rows is stored unit-major: unit c of rows 0..15 side by side (u·16 bytes), then unit c + 1 ...
 * so a field of n bytes per row takes 16·n bytes at 16 × its offset in the block. */
typedef struct { int start, len, unit; } k16_field;
static int k16_fields(kiln_wformat f, const k16_field **out) {
    static const k16_field q4k[] = {{0, 4, 2}, {4, 12, 1}, {16, 128, 4}};                   /* d dmin | scales | qs */
    static const k16_field q5k[] = {{0, 4, 2}, {4, 12, 1}, {16, 32, 4}, {48, 128, 4}};      /* ... | qh | qs */
    static const k16_field q6k[] = {{0, 128, 4}, {128, 64, 4}, {192, 16, 1}, {208, 2, 2}}; /* ql | qh | scales | d */
    static const k16_field q2k[] = {{0, 16, 1}, {16, 64, 4}, {80, 4, 2}};                  /* scales | qs | d dmin */
    static const k16_field q3k[] = {{0, 32, 4}, {32, 64, 4}, {96, 12, 1}, {108, 2, 2}};    /* hmask | qs | scales | d */
    static const k16_field iq4xs[] = {{0, 2, 2}, {2, 2, 2}, {4, 4, 1}, {8, 128, 4}};       /* d | scales_h | scales_l | qs */
    switch (f) {
    case KILN_WF_Q4_K: *out = q4k; return 3;
    case KILN_WF_Q5_K: *out = q5k; return 4;
    case KILN_WF_Q6_K: *out = q6k; return 4;
    case KILN_WF_Q2_K: *out = q2k; return 3;
    case KILN_WF_Q3_K: *out = q3k; return 4;
    case KILN_WF_IQ4_XS: *out = iq4xs; return 4;
    default: *out = NULL; return 0;
    }
}
static int k16_format(const kiln_weight *w) { const k16_field *fs; return k16_fields(w->fmt, &fs) > 0; }

/* Offset, inside its 16-row super-block run, of byte b of row j's block. */
static size_t k16_offset(const k16_field *fs, int nf, int j, int b) {
    for (int i = 0; i < nf; i++)
        if (b < fs[i].start + fs[i].len) {
            const int o = b - fs[i].start, u = fs[i].unit;
            return 16 * (size_t)fs[i].start + (size_t)(o / u) * 16 * (size_t)u + (size_t)j * (size_t)u + (size_t)(o % u);
        }
    return 0; /* not reached: the fields cover the block */
}

/* One 16-row group: the 16 checkpoint-layout rows at src → the interleave at dst (field by field,
 * unit by unit: k16_offset's order). */
static void k16_group_put(const kiln_weight *w, const uint8_t *src, uint8_t *dst) {
    const size_t rb = w->row_bytes;
    const k16_field *fs;
    const int nf = k16_fields(w->fmt, &fs), bb = (int)kiln_wf_block_bytes(w->fmt);
    for (int64_t s = 0; s < w->cols / 256; s++) {
        uint8_t *gs = dst + (size_t)s * 16 * (size_t)bb;
        for (int i = 0; i < nf; i++) {
            const int u = fs[i].unit, nu = fs[i].len / u;
            uint8_t *o = gs + 16 * (size_t)fs[i].start;
            const uint8_t *p0 = src + (size_t)s * (size_t)bb + (size_t)fs[i].start;
            for (int j = 0; j < 16; j++) { /* row j's units c at o + 16·u·c + u·j (constant sizes: plain moves) */
                const uint8_t *p = p0 + (size_t)j * rb;
                uint8_t *q = o + (size_t)u * (size_t)j;
                if (u == 4)
                    for (int c = 0; c < nu; c++) memcpy(q + 64 * (size_t)c, p + 4 * (size_t)c, 4);
                else if (u == 2)
                    for (int c = 0; c < nu; c++) memcpy(q + 32 * (size_t)c, p + 2 * (size_t)c, 2);
                else
                    for (int c = 0; c < nu; c++) q[16 * (size_t)c] = p[c];
            }
        }
    }
}

void kiln_weight_row_gather(const kiln_weight *w, int64_t r, uint8_t *out) {
    const size_t rb = w->row_bytes;
    if (w->tiled && k16_format(w)) {
        if (r >= (w->rows & ~(int64_t)15)) {
            memcpy(out, w->data + (size_t)r * rb, rb);
            return;
        }
        const k16_field *fs;
        const int nf = k16_fields(w->fmt, &fs), bb = (int)kiln_wf_block_bytes(w->fmt), j = (int)(r & 15);
        const uint8_t *g = w->data + (size_t)(r & ~(int64_t)15) * rb;
        for (int64_t s = 0; s < w->cols / 256; s++)
            for (int b = 0; b < bb; b++) out[(size_t)s * (size_t)bb + (size_t)b] = g[(size_t)s * 16 * (size_t)bb + k16_offset(fs, nf, j, b)];
        return;
    }
    if (i4q16(w)) {
        if (r >= (w->rows & ~(int64_t)15)) {
            memcpy(out, w->data + (size_t)r * rb, rb);
            return;
        }
        const uint8_t *g = w->data + (size_t)(r & ~(int64_t)15) * rb;
        for (int64_t b = 0; b < w->cols / 32; b++) i4q16_block_get(g, b, (int)(r & 15), out + 16 * (size_t)b);
        return;
    }
    if (w->tiled && q16_format(w)) {
        if (r >= (w->rows & ~(int64_t)15)) { /* past the last 16-row group: checkpoint layout */
            memcpy(out, w->data + (size_t)r * rb, rb);
            return;
        }
        const int q8 = w->fmt == KILN_WF_Q8_0;
        const size_t bb = q8 ? 34 : 18;
        const uint8_t *g = w->data + (size_t)(r & ~(int64_t)15) * rb;
        for (int64_t b = 0; b < w->cols / 32; b++) q16_block_get(g, q8, b, (int)(r & 15), out + (size_t)b * bb);
        return;
    }
    if (!w->tiled || r >= (w->rows & ~(int64_t)3)) {
        memcpy(out, w->data + (size_t)r * rb, rb);
        return;
    }
    const uint8_t *g = w->data + (size_t)(r & ~(int64_t)3) * rb;
    const int j = (int)(r & 3);
    const size_t n = rb / 64, t = rb % 64;
    for (size_t k = 0; k < n; k++) memcpy(out + 64 * k, g + 256 * k + 64 * (size_t)j, 64);
    if (t) memcpy(out + 64 * n, g + 256 * n + t * (size_t)j, t);
}

int64_t kiln_weight_int4_scale_index(const kiln_weight *w, int64_t r, int64_t gi) {
    const int64_t ng = w->cols / w->block;
    if (i4q16(w)) /* group q's block gi: its 16 rows' scales side by side */
        return r >= (w->rows & ~(int64_t)15) ? r * ng + gi : (r & ~(int64_t)15) * ng + 16 * gi + (r & 15);
    if (!w->tiled || r >= (w->rows & ~(int64_t)3)) return r * ng + gi;
    const int64_t u = w->block <= 128 ? 128 / w->block : 1, nb = ng / u, tg = ng % u, j = r & 3;
    const int64_t base = (r & ~(int64_t)3) * ng;
    if (gi < nb * u) return base + 4 * (gi / u) * u + j * u + gi % u;
    return base + 4 * nb * u + j * tg + (gi - nb * u);
}

/* INT4 group 32 into the 16-row interleave: each group's bytes and scales through scratch. */
static int tile_int4_q16(kiln_weight *w, uint8_t *data, uint16_t *S) {
    const size_t rb = w->row_bytes;
    const int64_t ng = w->cols / 32;
    uint8_t *tmp = malloc(16 * rb);
    uint16_t *stmp = malloc(sizeof *stmp * 16 * (size_t)ng);
    if (!tmp || !stmp) { free(tmp); free(stmp); return -1; }
    for (int64_t q = 0; q < w->rows / 16; q++) {
        uint8_t *g = data + (size_t)q * 16 * rb;
        uint16_t *sg = S + (size_t)q * 16 * (size_t)ng;
        memcpy(tmp, g, 16 * rb);
        memcpy(stmp, sg, sizeof *stmp * 16 * (size_t)ng);
        for (int j = 0; j < 16; j++)
            for (int64_t b = 0; b < ng; b++) {
                i4q16_block_put(g, b, j, tmp + (size_t)j * rb + 16 * (size_t)b);
                sg[16 * b + j] = stmp[(size_t)j * (size_t)ng + (size_t)b];
            }
    }
    free(tmp);
    free(stmp);
    w->tiled = KILN_TILE_Q16;
    return 0;
}

int kiln_weight_tile(kiln_weight *w, uint8_t *data, void *scales, int layout) {
    if (layout == KILN_TILE_Q16) {
        if (w->tiled || w->fmt != KILN_WF_INT4_GROUP || w->block != 32 || w->cols % 32 || w->rows < 16) return 0;
        return tile_int4_q16(w, data, scales);
    }
    if (w->tiled || w->rows < kiln_weight_tile_rows(w)) return 0;
    if (k16_format(w)) {
        uint8_t *tmp = malloc(16 * w->row_bytes);
        if (!tmp) return -1;
        for (int64_t q = 0; q < w->rows / 16; q++) {
            uint8_t *g = data + (size_t)q * 16 * w->row_bytes;
            memcpy(tmp, g, 16 * w->row_bytes);
            k16_group_put(w, tmp, g);
        }
        free(tmp);
        w->tiled = 1;
        return 0;
    }
    if (q16_format(w)) {
        const size_t rb = w->row_bytes, bb = w->fmt == KILN_WF_Q8_0 ? 34 : 18;
        uint8_t *tmp = malloc(16 * rb);
        if (!tmp) return -1;
        for (int64_t q = 0; q < w->rows / 16; q++) {
            uint8_t *g = data + (size_t)q * 16 * rb;
            memcpy(tmp, g, 16 * rb);
            for (int j = 0; j < 16; j++)
                for (int64_t b = 0; b < w->cols / 32; b++) q16_block_put(g, bb == 34, b, j, tmp + (size_t)j * rb + (size_t)b * bb);
        }
        free(tmp);
        w->tiled = 1;
        return 0;
    }
    const size_t rb = w->row_bytes;
    const int int4 = w->fmt == KILN_WF_INT4_GROUP;
    const int64_t ng = int4 ? w->cols / w->block : 0;
    uint8_t *tmp = malloc(4 * rb);
    uint16_t *stmp = int4 ? malloc(sizeof *stmp * 4 * (size_t)ng) : NULL;
    if (!tmp || (int4 && !stmp)) { free(tmp); free(stmp); return -1; }
    for (int64_t q = 0; q < w->rows / 4; q++) {
        uint8_t *g = data + (size_t)q * 4 * rb;
        memcpy(tmp, g, 4 * rb);
        for (int j = 0; j < 4; j++)
            for (size_t b = 0; b < rb; b += 64) {
                size_t len = rb - b < 64 ? rb - b : 64;
                memcpy(g + tiled_offset(rb, j, b), tmp + (size_t)j * rb + b, len);
            }
    }
    if (int4) {
        kiln_weight t = *w;
        t.tiled = 1;
        uint16_t *S = scales;
        for (int64_t q = 0; q < w->rows / 4; q++) {
            memcpy(stmp, S + 4 * q * ng, sizeof *stmp * 4 * (size_t)ng);
            for (int64_t j = 0; j < 4; j++)
                for (int64_t gi = 0; gi < ng; gi++) S[kiln_weight_int4_scale_index(&t, 4 * q + j, gi)] = stmp[j * ng + gi];
        }
    }
    free(tmp);
    free(stmp);
    w->tiled = 1;
    return 0;
}

/* Buffers of 2 MiB and more start on a 2 MiB boundary and are marked MADV_HUGEPAGE, so that with
 * transparent huge pages in `madvise` mode (Debian's default) the kernel backs them with 2 MiB
 * pages: a decode step streams every weight once, and with 4 KiB pages that is one TLB miss per
 * 4 KiB (113,000 per FP8 bench-500m token). Measured (bench-500m, 2 threads, `kiln bench
 * --weights fp8,int4 --repeat 5`, three alternating pairs, the bench's bandwidth buffer on the same
 * kind of pages): FP8 decode 65.7 / 69.5 / 78.2 → 86.9 / 79.7 / 90.8 tok/s, INT4 154.6 / 146.5 /
 * 129.2 → 159.4 / 151.4 / 154.1. KILN_THP=0 in the environment keeps 4 KiB pages. */
static int want_huge_pages(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KILN_THP");
        v = !(e && strcmp(e, "0") == 0);
    }
    return v;
}

void *kiln_alloc64(size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n >= huge && want_huge_pages()) {
        void *p = NULL;
        if (posix_memalign(&p, huge, n) != 0) return NULL;
        (void)madvise(p, n & ~(huge - 1), MADV_HUGEPAGE); /* advice only: without THP nothing changes */
        return p;
    }
    return aligned_alloc(64, (n + 63) & ~(size_t)63);
}

void kiln_prefault(void *p, size_t n) {
    if (!p || !n) return;
#ifdef MADV_POPULATE_WRITE
    /* page-aligned inner part in one call (Linux 5.14+); EINVAL on older kernels → touch below */
    const uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (e <= a || madvise((void *)a, e - a, MADV_POPULATE_WRITE) == 0) {
        ((volatile uint8_t *)p)[0] = ((volatile uint8_t *)p)[0];
        ((volatile uint8_t *)p)[n - 1] = ((volatile uint8_t *)p)[n - 1];
        return;
    }
#endif
    for (size_t i = 0; i < n; i += 4096) ((volatile uint8_t *)p)[i] = ((volatile uint8_t *)p)[i];
    ((volatile uint8_t *)p)[n - 1] = ((volatile uint8_t *)p)[n - 1];
}

int kiln_weight_tile_copy(kiln_weight *w, const uint8_t *src, uint8_t *data, void *scales, int layout) {
    if (!w->tiled && k16_format(w) && w->rows >= 16) {
        /* straight from src into data, groups spread over the OpenMP threads (a load-time pass over
         * the whole weight: one read and one write instead of a copy and a permutation in place) */
        const int64_t ng = w->rows / 16;
        const size_t gb = 16 * w->row_bytes;
#pragma omp parallel for schedule(static)
        for (int64_t q = 0; q < ng; q++) k16_group_put(w, src + (size_t)q * gb, data + (size_t)q * gb);
        memcpy(data + (size_t)ng * gb, src + (size_t)ng * gb, (size_t)(w->rows - 16 * ng) * w->row_bytes);
        w->tiled = 1;
        return 0;
    }
    memcpy(data, src, (size_t)w->rows * w->row_bytes);
    return kiln_weight_tile(w, data, scales, layout);
}

int kiln_weight_tile_rows(const kiln_weight *w) { return q16_format(w) || k16_format(w) || w->tiled == KILN_TILE_Q16 ? 16 : 4; }

int kiln_weight_prefers_tiled(const kiln_weight *w, kiln_isa isa) {
    kiln_kctx cx;
    kiln_kctx_init(&cx, isa, 1, KILN_FP8_AUTO);
    const kiln_ktable *t = cx.kt;
    if (t && w->fmt == KILN_WF_INT4_GROUP && t->int4_q16 && w->block == 32 && kiln_cx_matmul_is_fast(&cx, w))
        return w->rows >= 16 ? KILN_TILE_Q16 : 0;
    if (!t || !(t->tiled_mask & (1u << w->fmt)) || w->rows < kiln_weight_tile_rows(w) || !kiln_cx_matmul_is_fast(&cx, w)) return 0;
    if (w->fmt == KILN_WF_FP8_BLOCK) return w->block % 64 == 0; /* the fast FP8 kernel's blocks */
    return KILN_TILE_GROUPS;
}

/* The GGUF block kernels other than Q8_0 / Q4_0 read the checkpoint layout, one row after the other (a single sequential
 * stream already), but from a file mapping that is 4 KiB pages: one TLB miss per 4 KiB of a weight
 * streamed once per token. An owned copy from kiln_alloc64 sits on 2 MiB pages (as the tiled
 * formats' copies do). Measured: docs/BENCHMARKS.md, "GGUF K-quants" (--no-repack keeps the mapping). */
int kiln_weight_prefers_owned(const kiln_weight *w, kiln_isa isa) {
    switch (w->fmt) { /* the GGUF blocks read in checkpoint layout (Q8_0 / Q4_0 are tiled instead) */
    case KILN_WF_Q4_K: case KILN_WF_Q5_K: case KILN_WF_Q6_K: case KILN_WF_Q2_K: case KILN_WF_Q3_K: case KILN_WF_IQ4_XS:
    case KILN_WF_Q4_1: case KILN_WF_Q5_0: case KILN_WF_Q5_1: case KILN_WF_IQ4_NL: break;
    default: return 0;
    }
    kiln_kctx cx;
    kiln_kctx_init(&cx, isa, 1, KILN_FP8_AUTO);
    return cx.kt && cx.kt->gemv[w->fmt] && kiln_cx_matmul_is_fast(&cx, w);
}
