/* pool.h — kiln's own worker threads for the many short parallel sections of a decode step.
 *
 * Why not OpenMP there: a batch-1 decode step of bench-500m has ~46 parallel sections (four matmul
 * groups and one attention per layer, the LM head), each 20–500 µs long. With libgomp's passive
 * wait every section starts with a futex wake-up of each worker (tens of µs on a virtualized
 * 2-vCPU machine), and with its spinning wait the join waits for every thread to check in, so one
 * worker descheduled by a busy neighbour stalls every section (bench-500m INT4: 25 tok/s spinning
 * vs 62 passive beside one busy process). This pool spins briefly between sections (no wake-up on
 * the hot path) and its caller never waits for a worker that has not taken work: the work of a
 * section is claimed from shared atomic counters, the caller takes whatever is left, and the caller
 * waits only for the calls that already started.
 *
 * A section uses at most as many threads as the process has CPUs (sched_getaffinity): spinning
 * workers beyond that would take the caller's time slices.
 *
 * Linux only (futex). Nested use (from a pool worker, inside an OpenMP parallel region, or while
 * another thread runs a section) runs the section on the calling thread alone. */
#ifndef KILN_BASE_POOL_H
#define KILN_BASE_POOL_H
#include <stdint.h>

/* One parallel section: fn(arg, t) for t = 0 on the calling thread and t = 1 .. nthreads-1 on the
 * workers that pick it up in time. fn must claim its work from shared atomics so that the caller's
 * call alone completes the section (a late worker then finds nothing to do). Returns when the
 * caller's call and every worker call that started have returned. */
typedef void (*kiln_pool_fn)(void *arg, int thread);
void kiln_pool_run(kiln_pool_fn fn, void *arg, int nthreads);
/* The number of threads kiln_pool_run(…, nthreads) can use at most: nthreads capped at the CPUs
 * this process may run on (callers that split work per thread size it with this). */
int kiln_pool_width(int nthreads);

/* Dynamic loop over [0, n): body(arg, i) for every i exactly once, on up to nthreads threads. */
typedef void (*kiln_pool_body)(void *arg, int64_t i);
void kiln_pool_for(int64_t n, kiln_pool_body body, void *arg, int nthreads);

/* How long (µs) an idle worker spins for the next section before sleeping. Default 200, or the
 * environment variable KILN_SPIN_US (0 = sleep at once: every section then pays a futex wake-up). */
int kiln_pool_spin_us(void);
#endif
