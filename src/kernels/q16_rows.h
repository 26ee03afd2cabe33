/* q16_rows.h — the row walk of the Q8_0 / Q4_0 16-row interleave kernels (kernels/gemv.h), shared by
 * gemv_avx2.c and gemv_avx512.c, which include it after defining:
 *   Q16_ROWS                     the function's name;
 *   Q16_GROUP(f, w, q, xp, xpb, n, Y, ldy)   group q (rows 16q..16q+15) for n tokens into Y;
 *   Q16_NT                       tokens per register tile of Q16_GROUP;
 *   Q16_X_BYTES                  prepared activation bytes a token block may hold (L2-sized);
 *   Q16_REST(f, w, xp, xpb, n, Y, ldy, yoff, r0, r1)  the rows past the last whole group (rows % 16,
 *                                checkpoint layout) with the row-major kernel.
 * Q16_ROWS(f, w, xp, xpb, n, Y, ldy, yoff, r0, r1): rows [r0, r1) for n tokens, Y[t·ldy + r − yoff]:
 * whole groups straight into Y, in blocks of tokens whose prepared rows fit Q16_X_BYTES (so a group's
 * weights stay in L1 / L2 across the block); a group cut by r0 or r1 through a 16 × Q16_NT scratch
 * with the same arithmetic, so every row gives the same result whichever range computes it. */
AI void Q16_ROWS(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0,
                 int64_t r1) {
    const int64_t gend = w->rows & ~(int64_t)15;
    int tb = (int)(Q16_X_BYTES / (xpb ? xpb : 1));
    tb = tb < Q16_NT ? Q16_NT : tb - tb % Q16_NT;
    int64_t r = r0;
    while (r < r1 && r < gend) {
        const int64_t q = r / 16, e = (q + 1) * 16 < r1 ? (q + 1) * 16 : r1;
        if (r == 16 * q && e == 16 * (q + 1)) {
            int64_t qe = q + 1; /* a run of whole groups */
            while (16 * (qe + 1) <= r1 && 16 * (qe + 1) <= gend) qe++;
            for (int t0 = 0; t0 < n; t0 += tb) {
                const int nt = n - t0 < tb ? n - t0 : tb;
                for (int64_t k = q; k < qe; k++)
                    Q16_GROUP(f, w, k, xp + (size_t)t0 * xpb, xpb, nt, Y + (size_t)t0 * (size_t)ldy + 16 * k - yoff, ldy);
            }
            r = 16 * qe;
            continue;
        }
        float tmp[16 * Q16_NT];
        for (int t0 = 0; t0 < n; t0 += Q16_NT) {
            const int nt = n - t0 < Q16_NT ? n - t0 : Q16_NT;
            Q16_GROUP(f, w, q, xp + (size_t)t0 * xpb, xpb, nt, tmp, 16);
            for (int t = 0; t < nt; t++)
                for (int64_t k = r; k < e; k++) Y[(size_t)(t0 + t) * (size_t)ldy + (size_t)(k - yoff)] = tmp[16 * t + (k - 16 * q)];
        }
        r = e;
    }
    if (r < r1) Q16_REST(f, w, xp, xpb, n, Y, ldy, yoff, r, r1);
}
