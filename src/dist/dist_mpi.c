/* dist_mpi.c — dist.h over Open MPI (MPI_COMM_WORLD, MPI_ERRORS_RETURN: a failed call returns and
 * is reported with the rank and the call, instead of MPI's default abort without context). */
#include "dist/dist.h"
#include "base/status.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

static int started, rank_, size_ = 1;
static double t_allreduce;              /* seconds inside MPI_Allreduce (kiln_dist_stats) */
static unsigned long long n_allreduce, b_allreduce;
static double deadline_s;               /* a collective not done after this many seconds = a lost rank (0: wait forever) */
static int failed;                      /* a collective missed its deadline or failed: no more MPI calls but MPI_Abort */
static char failure[256];

static kiln_status mpi_fail(const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING] = "?";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return kiln_fail(KILN_ERR_IO, "MPI rank %d: %s failed: %s", rank_, call, msg);
}

kiln_status kiln_dist_init(int *argc, char ***argv) {
    if (started) return KILN_OK;
    int provided = 0;
    /* SERIALIZED: `kiln serve` makes its MPI calls on the scheduler thread, not the one that
     * started MPI (never two at once) */
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return kiln_fail(KILN_ERR_IO, "MPI_Init_thread failed (error %d): start kiln with mpirun", rc);
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return kiln_fail(KILN_ERR_UNSUPPORTED, "this MPI library gives thread level %d, kiln needs MPI_THREAD_SERIALIZED (%d)", provided, MPI_THREAD_SERIALIZED);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    started = 1;
    return KILN_OK;
}

int kiln_dist_rank(void) { return rank_; }
int kiln_dist_size(void) { return size_; }
int kiln_dist_built(void) { return 1; }

void kiln_dist_set_deadline(double seconds) { deadline_s = seconds > 0 ? seconds : 0; }
int kiln_dist_failed(void) { return failed; }
const char *kiln_dist_failure(void) { return failed ? failure : ""; }

static void mark_failed(const char *what) {
    if (failed) return;
    failed = 1;
    snprintf(failure, sizeof failure, "rank %d: %s", rank_, what);
    fprintf(stderr, "kiln: tensor parallel: %s\n", failure);
}

/* Completes rq by polling: spins for spin_s (yielding the CPU between tests after 50 µs), then
 * sleeps between tests with a growing pause up to max_pause_us (an idle follower sleeps). A sleep
 * costs its wake-up latency on every late collective, so a step's collectives spin for 20 ms —
 * measured on the 2-vCPU dev VM: sleeping after 200 µs cost 40% of --tp 2 decode speed — while a
 * follower waiting for rank 0's next step message sleeps after 200 µs: meanwhile rank 0 runs HTTP,
 * sampling and the clients, and on a shared host a spinning follower takes their CPU (measured:
 * spinning there too cost `kiln bench --server --tp 2` a third at concurrency 1). Gives up after
 * wait_s seconds (0 = never): 1 when done, 0 when it gave up, -1 on an MPI error. */
static int wait_request(MPI_Request *rq, double wait_s, double spin_s, long max_pause_us, const char *call) {
    const double t0 = MPI_Wtime();
    long pause_us = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) { mpi_fail(call, rc); mark_failed(kiln_last_error()); return -1; }
        if (done) return 1;
        double dt = MPI_Wtime() - t0;
        if (wait_s > 0 && dt > wait_s) return 0;
        if (dt < spin_s) { /* a step's peers are usually microseconds to milliseconds away */
            if (dt > 5e-5) sched_yield(); /* oversubscribed hosts: let the rank we wait for run */
            continue;
        }
        pause_us = pause_us < 10 ? 10 : pause_us * 2 > max_pause_us ? max_pause_us : pause_us * 2;
        struct timespec ts = {0, pause_us * 1000};
        nanosleep(&ts, NULL);
    }
}

/* A collective of this step that did not finish: the job cannot go on (some rank is dead or hung,
 * and an unfinished collective cannot be cancelled); the caller reports, kiln_dist_abort ends it. */
static int step_wait(MPI_Request *rq, const char *call) {
    int r = wait_request(rq, deadline_s, 0.02, 1000, call);
    if (r == 0) {
        char what[200];
        snprintf(what, sizeof what, "%s did not complete within %g s (--tp-timeout): a rank is dead or hung", call, deadline_s);
        mark_failed(what);
    }
    return r == 1;
}

void kiln_dist_allreduce_sum(void *ctx, float *x, int64_t n) {
    (void)ctx;
    if (!started || size_ == 1 || failed) return;
    const double t0 = MPI_Wtime();
    n_allreduce++;
    b_allreduce += (unsigned long long)n * sizeof *x;
    while (n > 0 && !failed) { /* MPI counts are int */
        const int k = n > (1 << 30) ? 1 << 30 : (int)n;
        MPI_Request rq;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, x, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &rq);
        if (rc != MPI_SUCCESS) { mpi_fail("MPI_Iallreduce", rc); mark_failed(kiln_last_error()); break; }
        /* a failed sum leaves x as it is: the caller checks kiln_dist_failed() after the step and
         * discards its output (kiln run aborts; kiln serve answers its requests with errors) */
        if (!step_wait(&rq, "MPI_Allreduce")) break;
        x += k;
        n -= k;
    }
    t_allreduce += MPI_Wtime() - t0;
}

/* Rank r's part [rows, n_r] of the logits (columns [lo_r, lo_r + n_r), lo_r = r·vocab/N) to rank 0
 * (all = 0) or to every rank (all = 1), assembled into out [rows, vocab]. */
static void gather_vocab(const float *part, int rows, int64_t vocab, float *out, int all) {
    if (!started || size_ == 1 || failed) return;
    const double t0 = MPI_Wtime();
    static float *tmp;        /* the parts rank after rank (grown, kept: one per process) */
    static size_t tmp_cap;
    static int *counts, *displs;
    if (!counts) {
        counts = malloc((size_t)size_ * sizeof *counts);
        displs = malloc((size_t)size_ * sizeof *displs);
        if (!counts || !displs) { mark_failed("out of memory for the logits gather"); return; }
    }
    for (int r = 0; r < size_; r++) {
        const int64_t lo = vocab * r / size_, hi = vocab * (r + 1) / size_;
        counts[r] = (int)((hi - lo) * rows);
        displs[r] = (int)(lo * rows);
    }
    const int receives = all || rank_ == 0;
    if (receives && (size_t)vocab * (size_t)rows > tmp_cap) {
        float *p = realloc(tmp, (size_t)vocab * (size_t)rows * sizeof *p);
        if (!p) { mark_failed("out of memory for the logits gather"); return; }
        tmp = p;
        tmp_cap = (size_t)vocab * (size_t)rows;
    }
    MPI_Request rq;
    int rc = all ? MPI_Iallgatherv(part, counts[rank_], MPI_FLOAT, tmp, counts, displs, MPI_FLOAT, MPI_COMM_WORLD, &rq)
                 : MPI_Igatherv(part, counts[rank_], MPI_FLOAT, tmp, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD, &rq);
    if (rc != MPI_SUCCESS) { mpi_fail(all ? "MPI_Iallgatherv" : "MPI_Igatherv", rc); mark_failed(kiln_last_error()); return; }
    if (step_wait(&rq, all ? "MPI_Allgatherv (logits)" : "MPI_Gatherv (logits)") && receives)
        for (int r = 0; r < size_; r++) { /* rank r's [rows, n_r] block → columns [lo, lo + n_r) of each row */
            const int64_t lo = vocab * r / size_, n = vocab * (r + 1) / size_ - lo;
            for (int i = 0; i < rows; i++)
                memcpy(out + (size_t)i * (size_t)vocab + (size_t)lo, tmp + (size_t)displs[r] + (size_t)i * (size_t)n, (size_t)n * sizeof *out);
        }
    t_allreduce += MPI_Wtime() - t0;
}

void kiln_dist_gather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out) { (void)ctx; gather_vocab(part, rows, vocab, out, 0); }
void kiln_dist_allgather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out) { (void)ctx; gather_vocab(part, rows, vocab, out, 1); }

/* An in-place all-reduce of n ints under the step deadline. */
static kiln_status allreduce_int(void *v, int n, MPI_Datatype type, MPI_Op op, const char *what) {
    if (!started || size_ == 1) return KILN_OK;
    if (failed) return kiln_fail(KILN_ERR_IO, "%s", failure);
    MPI_Request rq;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, n, type, op, MPI_COMM_WORLD, &rq);
    if (rc != MPI_SUCCESS) { mpi_fail("MPI_Iallreduce", rc); mark_failed(kiln_last_error()); }
    else step_wait(&rq, what);
    return failed ? kiln_fail(KILN_ERR_IO, "%s", failure) : KILN_OK;
}
kiln_status kiln_dist_allreduce_min_i32(int32_t *v, int n) { return allreduce_int(v, n, MPI_INT32_T, MPI_MIN, "MPI_Allreduce (min)"); }
kiln_status kiln_dist_allreduce_or_u32(uint32_t *v, int n) { return allreduce_int(v, n, MPI_UINT32_T, MPI_BOR, "MPI_Allreduce (or)"); }

/* Rank 0's message of n words to every rank: first its length, then the words. The others wait up
 * to wait_s (0 = forever) for the length, sleeping between tests (an idle server's ranks sleep
 * here), and grow *buf to fit. */
kiln_status kiln_dist_bcast_msg(int32_t **buf, int *n, int *cap, double wait_s) {
    if (!started || size_ == 1) return KILN_OK;
    if (failed) return kiln_fail(KILN_ERR_IO, "%s", failure);
    int32_t len = rank_ == 0 ? *n : 0;
    MPI_Request rq;
    int rc = MPI_Ibcast(&len, 1, MPI_INT32_T, 0, MPI_COMM_WORLD, &rq);
    if (rc != MPI_SUCCESS) { mpi_fail("MPI_Ibcast", rc); mark_failed(kiln_last_error()); return kiln_fail(KILN_ERR_IO, "%s", failure); }
    if (rank_ == 0) step_wait(&rq, "MPI_Bcast (step)");
    else {
        int r = wait_request(&rq, wait_s, 2e-4, 2000, "MPI_Ibcast");
        if (r == 0) {
            char what[200];
            snprintf(what, sizeof what, "no message from rank 0 within %g s (it sends one at least every second): rank 0 is dead or hung", wait_s);
            mark_failed(what);
        }
    }
    if (failed) return kiln_fail(KILN_ERR_IO, "%s", failure);
    if (rank_ != 0) {
        if (len < 0) return kiln_fail(KILN_ERR_INTERNAL, "rank 0 sent a message of %d words", (int)len);
        if (len > *cap) {
            int32_t *p = realloc(*buf, (size_t)len * sizeof *p);
            if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory for a message of %d words from rank 0", (int)len);
            *buf = p;
            *cap = len;
        }
        *n = len;
    }
    if (len == 0) return KILN_OK;
    rc = MPI_Ibcast(*buf, len, MPI_INT32_T, 0, MPI_COMM_WORLD, &rq);
    if (rc != MPI_SUCCESS) { mpi_fail("MPI_Ibcast", rc); mark_failed(kiln_last_error()); }
    else step_wait(&rq, "MPI_Bcast (step words)");
    return failed ? kiln_fail(KILN_ERR_IO, "%s", failure) : KILN_OK;
}

void kiln_dist_abort(int code) {
    if (started) MPI_Abort(MPI_COMM_WORLD, code);
}

void kiln_dist_stats(double *seconds, unsigned long long *calls, unsigned long long *bytes) {
    *seconds = t_allreduce;
    *calls = n_allreduce;
    *bytes = b_allreduce;
}

kiln_status kiln_dist_bcast_i32(int32_t *v, int n) {
    if (!started || size_ == 1) return KILN_OK;
    int rc = MPI_Bcast(v, n, MPI_INT32_T, 0, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? KILN_OK : mpi_fail("MPI_Bcast", rc);
}

kiln_status kiln_dist_agree(const char *what, const char *value) {
    if (!started || size_ == 1) return KILN_OK;
    char mine[256] = {0};
    snprintf(mine, sizeof mine, "%s", value);
    char *all = calloc((size_t)size_, sizeof mine);
    if (!all) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    int rc = MPI_Allgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, MPI_COMM_WORLD);
    kiln_status st = rc == MPI_SUCCESS ? KILN_OK : mpi_fail("MPI_Allgather", rc);
    for (int r = 1; st == KILN_OK && r < size_; r++)
        if (strcmp(all + (size_t)r * sizeof mine, all) != 0)
            st = kiln_fail(KILN_ERR_INVALID_ARG, "rank %d was started with %s '%s' but rank 0 with '%s'", r, what, all + (size_t)r * sizeof mine, all);
    free(all);
    return st;
}

void kiln_dist_finalize(void) {
    if (started && failed) MPI_Abort(MPI_COMM_WORLD, 1); /* the others may never reach MPI_Finalize */
    if (started) MPI_Finalize();
    started = 0;
}
