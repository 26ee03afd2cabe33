/* test_pool.c — the decode worker pool (base/pool.h): every index of a section runs exactly once,
 * whichever threads join; nested and concurrent callers fall back to the calling thread; sections
 * follow each other with no lost or repeated work (many short sections, as in a decode step). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "base/pool.h"
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    _Atomic int *hits;
    _Atomic int threads_seen; /* bit t set when thread t ran an item */
} count_job;

static void count_item(void *arg, int64_t i) {
    count_job *j = arg;
    atomic_fetch_add(&j->hits[i], 1);
}

static void run_and_check(int64_t n, int nthreads) {
    _Atomic int *hits = calloc((size_t)n, sizeof *hits);
    assert_non_null(hits);
    count_job j = {.hits = hits};
    kiln_pool_for(n, count_item, &j, nthreads);
    for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), 1);
    free(hits);
}

static void test_each_index_once(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 2, 3, 7, 64, 1000, 100000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int nt = 1; nt <= 4; nt++) run_and_check(sizes[s], nt);
}

/* Thousands of back-to-back short sections: the worker hand-off (spin, sleep after the spin limit)
 * must never lose or repeat an item. */
static void test_many_sections(void **state) {
    (void)state;
    for (int r = 0; r < 3000; r++) run_and_check(1 + r % 17, 2);
}

/* A section whose items take long enough that the workers join: the per-thread sums are complete
 * whatever the split. */
typedef struct {
    _Atomic int64_t sum;
} sum_job;
static void slow_item(void *arg, int64_t i) {
    sum_job *j = arg;
    volatile double x = 0;
    for (int k = 0; k < 2000; k++) x += k * 1e-9;
    (void)x;
    atomic_fetch_add(&j->sum, i);
}
static void test_workers_join(void **state) {
    (void)state;
    sum_job j;
    atomic_init(&j.sum, 0);
    kiln_pool_for(5000, slow_item, &j, 4);
    assert_int_equal(atomic_load(&j.sum), (int64_t)5000 * 4999 / 2);
}

/* The workers do join: thread 0 waits (up to 10 s) until another thread has run part of the
 * section, then they share the rest. */
typedef struct {
    _Atomic int64_t next;
    _Atomic int mask;
    _Atomic int64_t done;
} join_job;
static void join_fn(void *arg, int thread) {
    join_job *j = arg;
    if (thread == 0)
        for (int k = 0; k < 10000000 && !(atomic_load(&j->mask) & ~1); k++) usleep(1);
    for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < 1000;) {
        atomic_fetch_or(&j->mask, 1 << thread);
        atomic_fetch_add(&j->done, 1);
    }
}
static void test_worker_participates(void **state) {
    (void)state;
    cpu_set_t set; /* the pool uses at most as many threads as the process has CPUs */
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < 2) skip();
    join_job j;
    atomic_init(&j.next, 0);
    atomic_init(&j.mask, 0);
    atomic_init(&j.done, 0);
    kiln_pool_run(join_fn, &j, 2);
    assert_int_equal(atomic_load(&j.done), 1000);
    assert_true(atomic_load(&j.mask) & 2); /* worker 1 ran items */
}

/* A section started from inside another one (a pool worker or the caller) runs inline. */
static void nested_item(void *arg, int64_t i) {
    (void)i;
    count_job *outer = arg;
    _Atomic int hits[5] = {0};
    count_job inner = {.hits = hits};
    kiln_pool_for(5, count_item, &inner, 2);
    for (int k = 0; k < 5; k++) assert_int_equal(atomic_load(&hits[k]), 1);
    atomic_fetch_add(&outer->hits[0], 1);
}
static void test_nested(void **state) {
    (void)state;
    _Atomic int hits[1] = {0};
    count_job j = {.hits = hits};
    kiln_pool_for(64, nested_item, &j, 2);
    assert_int_equal(atomic_load(&hits[0]), 64);
    /* from an OpenMP parallel region: inline on each OpenMP thread */
    _Atomic int total = 0, team = 0;
    #pragma omp parallel num_threads(2)
    {
        #pragma omp single
        atomic_store(&team, omp_get_num_threads());
        _Atomic int h[9] = {0};
        count_job k = {.hits = h};
        kiln_pool_for(9, count_item, &k, 2);
        int ok = 1;
        for (int i = 0; i < 9; i++) ok &= atomic_load(&h[i]) == 1;
        atomic_fetch_add(&total, ok);
    }
    assert_int_equal(atomic_load(&total), atomic_load(&team));
}

/* Two application threads running sections at once: one gets the pool, the other runs inline. */
static void *caller_thread(void *arg) {
    int *ok = arg;
    *ok = 1;
    for (int r = 0; r < 500 && *ok; r++) {
        _Atomic int hits[33] = {0};
        count_job j = {.hits = hits};
        kiln_pool_for(33, count_item, &j, 2);
        for (int i = 0; i < 33; i++) *ok &= atomic_load(&hits[i]) == 1;
    }
    return NULL;
}
static void test_concurrent_callers(void **state) {
    (void)state;
    pthread_t a, b;
    int oka = 0, okb = 0;
    assert_int_equal(pthread_create(&a, NULL, caller_thread, &oka), 0);
    assert_int_equal(pthread_create(&b, NULL, caller_thread, &okb), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    assert_true(oka);
    assert_true(okb);
}

int main(void) {
    /* Short spin so that the sleep/wake path is exercised between sections too. */
    setenv("KILN_SPIN_US", "20", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_index_once),   cmocka_unit_test(test_many_sections),
        cmocka_unit_test(test_workers_join),      cmocka_unit_test(test_nested),
        cmocka_unit_test(test_concurrent_callers), cmocka_unit_test(test_worker_participates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
