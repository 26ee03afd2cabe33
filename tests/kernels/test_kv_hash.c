/* test_kv_hash.c — the fused KV integrity hash (kv_isa.h hsum, docs/INTEGRITY.md "The content
 * hash"): on every ISA this CPU has, the attention kernel's per-page sums of the blocks it consumed must equal,
 * bit for bit, the hash this test computes itself from the definition — Σ key[w] × word[w] mod 2^64
 * over the little-endian 32-bit words of the rows the kernel read, w the word's index inside the
 * (page, head) slice — and the standalone slice hash (ktable mlh) must equal it on any length.
 *
 * Layouts: F32 / BF16 / FP8 rows, head dims 8, 24, 40, 64, 72, 128, 256 (not all multiples of the
 * 16- or 8-value vector chunks), separate V with another dim, the MLA layout (V a view of the K
 * row: only K hashed), page sizes 16, 7 and 1; ranges that start and end inside pages (context
 * splits, prefill tiles), query rows whose limits stop before the range's end, 1..8 query rows, a
 * scrambled block table. The reference never calls kiln code. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kv/kv_isa.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* The definition, written out: bytes [0, n) of d as words, a last partial word zero-padded. */
static uint64_t ref_hash(const uint8_t *d, size_t n, const uint32_t *key) {
    uint64_t h = 0;
    for (size_t w = 0; 4 * w < n; w++) {
        uint64_t x = 0;
        for (size_t b = 0; b < 4 && 4 * w + b < n; b++) x |= (uint64_t)d[4 * w + b] << (8 * b);
        h += (uint64_t)key[w] * x;
    }
    return h;
}

typedef struct { kiln_isa isa; kiln_kv_attend_fn attend; uint64_t (*mlh)(const uint8_t *, size_t, const uint32_t *); } isa_entry;

static int isa_list(isa_entry *out) {
    int n = 0;
    out[n++] = (isa_entry){KILN_ISA_SCALAR, kiln_kv_attend_scalar, kiln_kv_mlh_scalar};
    if (kiln_cpu_supports(KILN_ISA_AVX2)) out[n++] = (isa_entry){KILN_ISA_AVX2, kiln_kv_ktable_avx2.attend, kiln_kv_ktable_avx2.mlh};
    else fprintf(stderr, "skip avx2: not supported by this CPU\n");
    if (kiln_cpu_supports(KILN_ISA_AVX512)) out[n++] = (isa_entry){KILN_ISA_AVX512, kiln_kv_ktable_avx512.attend, kiln_kv_ktable_avx512.mlh};
    else fprintf(stderr, "skip avx512: not supported by this CPU\n");
    return n;
}

/* Values that are finite in every dtype (the kernel's arithmetic stays tame); the hash sees bytes. */
static void fill_rows(uint8_t *d, size_t n_vals, kiln_kv_dtype dt) {
    for (size_t i = 0; i < n_vals; i++) {
        float v = (float)((int)(rnd32() % 2001) - 1000) / 997.0f;
        if (dt == KILN_KV_F32) memcpy(d + 4 * i, &v, 4);
        else if (dt == KILN_KV_BF16) {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t b = (uint16_t)(u >> 16);
            memcpy(d + 2 * i, &b, 2);
        } else {
            uint8_t c = (uint8_t)(rnd32() & 0x7F);
            if ((c & 0x7F) == 0x7F) c = 0x3F; /* no NaN code */
            d[i] = (uint8_t)(c | (rnd32() & 0x80));
        }
    }
}

static void run_layout(const isa_entry *ie, kiln_kv_dtype dt, int kd, int vd, int shares, int pt) {
    const size_t es = dt == KILN_KV_F32 ? 4 : dt == KILN_KV_BF16 ? 2 : 1;
    const int H = 3, n_pages = 9, kvh = 1;
    const size_t row_k = (size_t)kd * es, row_v = shares ? row_k : (size_t)vd * es;
    const size_t head_k = row_k * (size_t)pt, head_v = row_v * (size_t)pt;
    uint8_t *kb = malloc(head_k * H * n_pages), *vb = shares ? kb : malloc(head_v * H * n_pages);
    fill_rows(kb, head_k * H * n_pages / es, dt);
    if (!shares) fill_rows(vb, head_v * H * n_pages / es, dt);
    size_t nkey = (head_k > head_v ? head_k : head_v) / 4 + 1 + 16;
    uint32_t *key = malloc(nkey * sizeof *key);
    for (size_t i = 0; i < nkey; i++) { /* keys in [1, 2^32), as the pool draws them */
        key[i] = rnd32() ^ (rnd32() << 16);
        if (!key[i]) key[i] = 1;
    }
    int32_t table[8];
    for (int i = 0; i < 8; i++) table[i] = (int32_t)((i * 5 + 3) % n_pages); /* scrambled, pages 0..8 */
    const int n_ctx = 8 * pt;
    float q[8][576], acc[8][576];
    for (int r = 0; r < 8; r++)
        for (int d = 0; d < kd; d++) q[r][d] = (float)((int)(rnd32() % 200) - 100) / 400.0f;
    const int ranges[][2] = {{0, n_ctx}, {0, 1}, {pt / 2, n_ctx - pt / 2}, {pt, 3 * pt + (pt > 1 ? 1 : 0)}, {n_ctx - 1, n_ctx}, {3, n_ctx}};
    for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
        int t0 = ranges[ri][0], t1 = ranges[ri][1];
        if (t0 >= t1 || t1 > n_ctx) continue;
        for (int R = 1; R <= 8; R += 3) {
            for (int early = 0; early < 2; early++) {
                kiln_kv_span sp;
                memset(&sp, 0, sizeof sp);
                sp.kbase = kb;
                sp.vbase = vb;
                sp.pages = table;
                sp.page_k = head_k * H;
                sp.page_v = shares ? head_k * H : head_v * H;
                sp.head_k = (size_t)kvh * head_k;
                sp.head_v = (size_t)kvh * (shares ? head_k : head_v);
                sp.row_k = row_k;
                sp.row_v = row_v;
                sp.page_tokens = pt;
                sp.k_dim = kd;
                sp.v_dim = vd;
                sp.dtype = dt;
                sp.kmul = 0.1f;
                sp.vmul = 1.0f;
                sp.prefetch = 1;
                sp.hkey = key;
                sp.hash_v = !shares;
                const int slot0 = t0 / pt, n_slots = (t1 - 1) / pt - slot0 + 1;
                uint64_t hs[2 * 64] = {0};
                sp.hsum = hs;
                sp.hslot0 = slot0;
                kiln_kv_rows rw;
                memset(&rw, 0, sizeof rw);
                rw.R = R;
                /* early: every row's limit stops before t1, so the kernel reads [t0, lim) only */
                const int lim = early && t1 - t0 > 1 ? t1 - (t1 - t0) / 2 : t1;
                for (int r = 0; r < R; r++) {
                    rw.q[r] = q[r];
                    rw.acc[r] = acc[r];
                    memset(acc[r], 0, sizeof acc[r]);
                    rw.lim[r] = r == 0 ? lim : t0 + 1 + (lim - t0 - 1) * r / 8;
                    rw.m[r] = -INFINITY;
                    rw.l[r] = 0.0f;
                }
                ie->attend(&sp, &rw, t0, t1);
                for (int s = 0; s < n_slots; s++) {
                    const int slot = slot0 + s, a = slot * pt > t0 ? slot * pt : t0;
                    const int b = (slot + 1) * pt < lim ? (slot + 1) * pt : lim;
                    uint64_t ek = 0, ev = 0;
                    if (b > a) {
                        const size_t o = (size_t)(a - slot * pt);
                        const uint8_t *ks = kb + (size_t)table[slot] * sp.page_k + sp.head_k;
                        ek = ref_hash(ks + o * row_k, (size_t)(b - a) * row_k, key + o * row_k / 4);
                        if (!shares) {
                            const uint8_t *vs = vb + (size_t)table[slot] * sp.page_v + sp.head_v;
                            ev = ref_hash(vs + o * row_v, (size_t)(b - a) * row_v, key + o * row_v / 4);
                        }
                    }
                    if (hs[2 * s] != ek || hs[2 * s + 1] != ev)
                        fprintf(stderr, "isa %s dt %d kd %d vd %d shares %d pt %d range [%d,%d) lim %d R %d slot %d: K %016llx vs %016llx, V %016llx vs %016llx\n",
                                kiln_isa_name(ie->isa), (int)dt, kd, vd, shares, pt, t0, t1, lim, R, slot, (unsigned long long)hs[2 * s],
                                (unsigned long long)ek, (unsigned long long)hs[2 * s + 1], (unsigned long long)ev);
                    assert_true(hs[2 * s] == ek);
                    assert_true(hs[2 * s + 1] == ev);
                }
            }
        }
    }
    /* the standalone slice hash, on every length up to a whole slice (partial words included) */
    const uint8_t *slice = kb + (size_t)table[2] * head_k * H + (size_t)kvh * head_k;
    for (size_t n = 0; n <= head_k; n += n < 64 ? 1 : 29) assert_true(ie->mlh(slice, n, key) == ref_hash(slice, n, key));
    free(key);
    if (!shares) free(vb);
    free(kb);
}

static void test_fused_hash_layouts(void **state) {
    (void)state;
    isa_entry isas[3];
    const int n = isa_list(isas);
    const kiln_kv_dtype dts[] = {KILN_KV_F32, KILN_KV_BF16, KILN_KV_FP8};
    const int dims[] = {8, 24, 40, 64, 72, 128, 256};
    const int pts[] = {16, 7, 1};
    int cases = 0;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < 3; d++)
            for (int p = 0; p < 3; p++) {
                for (int k = 0; k < (int)(sizeof dims / sizeof dims[0]); k++, cases++) run_layout(&isas[i], dts[d], dims[k], dims[k], 0, pts[p]);
                run_layout(&isas[i], dts[d], 64, 40, 0, pts[p]);   /* V of another dim */
                run_layout(&isas[i], dts[d], 576, 512, 1, pts[p]); /* MLA: V = the first 512 of the K row */
                cases += 2;
            }
    fprintf(stderr, "fused hash: %d layouts on %d ISAs equal the reference\n", cases / n, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fused_hash_layouts)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
