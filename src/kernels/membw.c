/* membw.c — the machine's read bandwidth, measured the way a decode GEMV reads weights: each of
 * `threads` OpenMP threads streams its own contiguous part of one large buffer with the widest
 * vector loads of the current ISA (kiln_kernels_select). The best of several repetitions is
 * reported, after a warm-up pass that also faults the pages in. kiln bench divides a kernel's
 * achieved bytes/s by this figure. */
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

double kiln_measure_read_gbps(int threads, size_t bytes) {
    if (threads <= 0) threads = omp_get_max_threads();
    if (bytes == 0) bytes = (size_t)1 << 30;
    size_t per = (bytes / (size_t)threads) & ~(size_t)4095;
    if (per < 4096) per = 4096;
    bytes = per * (size_t)threads;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf) return 0.0;
    const kiln_ktable *t = kiln_ktable_current();
    uint64_t (*rd)(const void *, size_t) = t && t->read_sum ? t->read_sum : read_sum_scalar;
    double best = 0.0;
    for (int rep = 0; rep < 6; rep++) {
        uint64_t sink = 0;
        double t0 = 0;
        #pragma omp parallel num_threads(threads) reduction(^ : sink)
        {
            int id = omp_get_thread_num();
            uint8_t *mine = buf + per * (size_t)id;
            if (rep == 0) memset(mine, id + 1, per); /* first touch by the reading thread */
            #pragma omp barrier
            #pragma omp master
            t0 = now_s();
            #pragma omp barrier
            sink ^= rd(mine, per);
        }
        double dt = now_s() - t0;
        kiln_membw_sink ^= sink;
        if (rep > 0 && dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    free(buf);
    return best / 1e9;
}
