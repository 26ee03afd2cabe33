/* membw.c — the machine's read bandwidth, measured the way a decode GEMV reads weights: each of
 * `threads` OpenMP threads streams its own contiguous part of one large buffer with the widest
 * vector loads of the current ISA (kiln_kernels_select), after a warm-up pass that also faults the
 * pages in. Burst: the best of several 1 GiB passes; window: one timed read of a given length
 * (passes over the same 1 GiB), which kiln bench makes as long as its decode windows, so both sides of its roofline ratio are
 * sustained over the same amount of data (on a shared VM a 20 ms burst catches quiet moments a
 * 0.3 s decode window does not). */
#include "kiln_test.h"
#include "kernels/gemv.h"
#include "kernels/gemv_isa.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t read_sum_scalar(const void *p, size_t bytes) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) { a ^= q[i]; b ^= q[i + 1]; c ^= q[i + 2]; d ^= q[i + 3]; }
    return a ^ b ^ c ^ d;
}

volatile uint64_t kiln_membw_sink; /* keeps the reads observable */

/* One timed read of `window` bytes: each thread passes over its own part of buf (first touched by
 * that thread) until the threads together read at least `window` bytes. */
static double read_window(uint8_t *buf, size_t per, int threads, uint64_t window, int first_touch) {
    const kiln_ktable *t = kiln_ktable_current();
    uint64_t (*rd)(const void *, size_t) = t && t->read_sum ? t->read_sum : read_sum_scalar;
    const uint64_t total = (uint64_t)per * (uint64_t)threads;
    const uint64_t passes = window > total ? (window + total - 1) / total : 1;
    uint64_t sink = 0;
    double t0 = 0;
    #pragma omp parallel num_threads(threads) reduction(^ : sink)
    {
        int id = omp_get_thread_num();
        uint8_t *mine = buf + per * (size_t)id;
        if (first_touch) memset(mine, id + 1, per); /* first touch by the reading thread */
        #pragma omp barrier
        #pragma omp master
        t0 = now_s();
        #pragma omp barrier
        for (uint64_t p = 0; p < passes; p++) sink ^= rd(mine, per);
    }
    double dt = now_s() - t0;
    kiln_membw_sink ^= sink;
    return dt > 0 ? (double)(total * passes) / dt / 1e9 : 0.0;
}

struct kiln_membw {
    uint8_t *buf;
    size_t per; /* bytes per thread */
    int threads;
};

kiln_membw *kiln_membw_open(int threads, size_t bytes) {
    kiln_membw *mb = calloc(1, sizeof *mb);
    if (!mb) return NULL;
    mb->threads = threads > 0 ? threads : omp_get_max_threads();
    if (bytes == 0) bytes = (size_t)1 << 30;
    mb->per = (bytes / (size_t)mb->threads) & ~(size_t)4095;
    if (mb->per < 4096) mb->per = 4096;
    mb->buf = kiln_alloc64(mb->per * (size_t)mb->threads); /* the same kind of pages as the weights */
    if (!mb->buf) {
        free(mb);
        return NULL;
    }
    read_window(mb->buf, mb->per, mb->threads, 0, 1); /* faults the pages in, warms the prefetchers */
    return mb;
}

void kiln_membw_close(kiln_membw *mb) {
    if (!mb) return;
    free(mb->buf);
    free(mb);
}

double kiln_membw_burst_gbps(kiln_membw *mb) {
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double g = read_window(mb->buf, mb->per, mb->threads, 0, 0);
        if (g > best) best = g;
    }
    return best;
}

double kiln_membw_window_gbps(kiln_membw *mb, uint64_t window) { return read_window(mb->buf, mb->per, mb->threads, window, 0); }

/* ---- compute peak ------------------------------------------------------------------------------ */
int kiln_fp8_prompt_int8(kiln_isa isa, int fp8, int n) {
    kiln_kctx cx;
    kiln_kctx_init(&cx, isa, 1, fp8);
    const kiln_weight w = {.fmt = KILN_WF_FP8_BLOCK, .rows = 128, .cols = 4096, .block = 128, .row_bytes = 4096};
    return kiln_cx_fp8_int8(&cx, &w, n);
}

double kiln_compute_peak_gops(int kind, kiln_isa isa, int threads) {
    kiln_kctx cx;
    kiln_kctx_init(&cx, isa, threads, KILN_FP8_AUTO);
    /* bf16 dots only where the CPU has AVX512_BF16 (the table of the bf16 form): even the probe
     * call below would otherwise execute vdpbf16ps on a CPU without it */
    if (kind == KILN_PEAK_BF16 && !kiln_cx_fp8_rounds_x(&cx)) return 0.0;
    if (kind == KILN_PEAK_AMX_INT8) { /* the tiles, only where the interleave GEMM runs on them */
        if (cx.isa != KILN_ISA_AVX512 || !kiln_amx_in_use()) return 0.0;
        double best = 0;
        for (int rep = 0; rep < 3; rep++) {
            double macs = 0, t0 = now_s();
            #pragma omp parallel num_threads(cx.threads) reduction(+ : macs)
            macs += kiln_amx_peak_macs(200000);
            const double dt = now_s() - t0;
            if (dt > 0 && 2.0 * macs / dt / 1e9 > best) best = 2.0 * macs / dt / 1e9;
        }
        return best;
    }
    if (!cx.kt || !cx.kt->peak || cx.kt->peak(kind, 1) == 0) return 0.0;
    const int nt = cx.threads;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double macs = 0, t0 = now_s();
        #pragma omp parallel num_threads(nt) reduction(+ : macs)
        macs += cx.kt->peak(kind, 2000000);
        const double dt = now_s() - t0;
        if (dt > 0 && 2.0 * macs / dt / 1e9 > best) best = 2.0 * macs / dt / 1e9;
    }
    return best;
}
