/* pool.c — the decode-step worker pool (pool.h): one section at a time, published by bumping a
 * sequence number that idle workers spin on (then sleep on, as a futex, after kiln_pool_spin_us).
 *
 * Joining without waiting for latecomers: a worker announces itself (active += 1) and only then
 * checks that the section it saw is still open; the caller closes the section (open = 0) when its own
 * call returned, and then waits while active > 0. Both sides use sequentially consistent operations,
 * so either the caller sees the worker's announcement (and waits for it) or the worker sees the
 * section closed (and does not touch it): a worker never reads a section's fields after the caller
 * returned. */
#include "base/pool.h"
#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 256 /* threads per section, the caller included */

static struct {
    pthread_mutex_t grow;  /* serializes worker creation */
    _Atomic int running;   /* 1 while a section is in progress (one caller at a time) */
    _Atomic int n_workers; /* workers 1 .. n_workers exist */
    _Atomic uint32_t seq;  /* the latest section's number (never 0); workers wait for it to change */
    _Atomic uint32_t open; /* = seq while the section can be joined, 0 once the caller closed it */
    _Atomic int active;    /* workers that announced themselves for the current section */
    _Atomic int sleepers;  /* workers blocked in futex_wait on seq */
    kiln_pool_fn fn;       /* the section: written by the caller before seq is bumped */
    void *arg;
    int nthreads;
} pool = {.grow = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int in_worker;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

int kiln_pool_spin_us(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("KILN_SPIN_US");
        long x = e && *e ? strtol(e, NULL, 10) : 200;
        v = x < 0 ? 0 : x > 1000000 ? 1000000 : (int)x;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

/* Blocks until pool.seq differs from `seen`; returns the new value. */
static uint32_t wait_section(uint32_t seen) {
    const double deadline = now_us() + kiln_pool_spin_us();
    for (unsigned i = 1;; i++) {
        uint32_t s = atomic_load(&pool.seq);
        if (s != seen) return s;
        if (i % 64) {
            cpu_relax();
            continue;
        }
        if (now_us() < deadline) continue;
        atomic_fetch_add(&pool.sleepers, 1);
        if (atomic_load(&pool.seq) == seen)
            syscall(SYS_futex, (uint32_t *)&pool.seq, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        atomic_fetch_sub(&pool.sleepers, 1);
    }
}

static void *worker_main(void *p) {
    const int me = (int)(intptr_t)p;
    in_worker = 1;
    uint32_t seen = atomic_load(&pool.seq);
    for (;;) {
        const uint32_t s = wait_section(seen);
        seen = s;
        atomic_fetch_add(&pool.active, 1);
        if (atomic_load(&pool.open) == s && me < pool.nthreads) pool.fn(pool.arg, me);
        atomic_fetch_sub_explicit(&pool.active, 1, memory_order_release);
    }
    return NULL;
}

/* Creates workers up to `want` (1 .. want exist afterwards, or fewer if the system refuses). */
static void grow(int want) {
    pthread_mutex_lock(&pool.grow);
    int have = atomic_load(&pool.n_workers);
    if (have < want) {
        /* Workers block every signal: the server's handlers run on its own threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        for (; have < want; have++) {
            pthread_t t;
            if (pthread_create(&t, &at, worker_main, (void *)(intptr_t)(have + 1)) != 0) break;
        }
        pthread_attr_destroy(&at);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        atomic_store(&pool.n_workers, have);
    }
    pthread_mutex_unlock(&pool.grow);
}

/* CPUs this process may run on (sched_getaffinity), read once: more pool threads than that would
 * only spin against each other and against the caller. */
static int usable_cpus(void) {
    static _Atomic int cached = 0;
    int n = atomic_load_explicit(&cached, memory_order_relaxed);
    if (n == 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        atomic_store_explicit(&cached, n, memory_order_relaxed);
    }
    return n;
}

int kiln_pool_width(int nthreads) {
    if (nthreads > POOL_MAX) nthreads = POOL_MAX;
    if (nthreads > usable_cpus()) nthreads = usable_cpus();
    return nthreads;
}

void kiln_pool_run(kiln_pool_fn fn, void *arg, int nthreads) {
    nthreads = kiln_pool_width(nthreads);
    int idle = 0;
    if (nthreads <= 1 || in_worker || omp_in_parallel() || !atomic_compare_exchange_strong(&pool.running, &idle, 1)) {
        fn(arg, 0);
        return;
    }
    if (atomic_load(&pool.n_workers) < nthreads - 1) grow(nthreads - 1);
    pool.fn = fn;
    pool.arg = arg;
    pool.nthreads = nthreads;
    uint32_t s = atomic_load(&pool.seq) + 1;
    if (s == 0) s = 1;
    atomic_store(&pool.open, s);
    atomic_store(&pool.seq, s);
    if (atomic_load(&pool.sleepers) > 0) syscall(SYS_futex, (uint32_t *)&pool.seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    fn(arg, 0);
    atomic_store(&pool.open, 0);
    /* Only workers already inside fn are waited for; each is finishing the one piece it claimed. */
    for (unsigned i = 1; atomic_load_explicit(&pool.active, memory_order_acquire) > 0; i++) {
        if (i < 4096) cpu_relax();
        else sched_yield();
    }
    atomic_store(&pool.running, 0);
}

typedef struct {
    _Atomic int64_t next;
    int64_t n;
    kiln_pool_body body;
    void *arg;
} pool_for_job;

static void pool_for_fn(void *a, int thread) {
    (void)thread;
    pool_for_job *j = a;
    for (int64_t i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) j->body(j->arg, i);
}

void kiln_pool_for(int64_t n, kiln_pool_body body, void *arg, int nthreads) {
    if (n <= 0) return;
    pool_for_job j = {.n = n, .body = body, .arg = arg};
    atomic_init(&j.next, 0);
    kiln_pool_run(pool_for_fn, &j, nthreads > n ? (int)n : nthreads);
}
