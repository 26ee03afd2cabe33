/* dist_mpi.c — dist.h over Open MPI (MPI_COMM_WORLD, MPI_ERRORS_RETURN: a failed call returns and
 * is reported with the rank and the call, instead of MPI's default abort without context). */
#include "dist/dist.h"
#include "base/status.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int started, rank_, size_ = 1;
static double t_allreduce;              /* seconds inside MPI_Allreduce (kiln_dist_stats) */
static unsigned long long n_allreduce, b_allreduce;

static kiln_status mpi_fail(const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING] = "?";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return kiln_fail(KILN_ERR_IO, "MPI rank %d: %s failed: %s", rank_, call, msg);
}

kiln_status kiln_dist_init(int *argc, char ***argv) {
    if (started) return KILN_OK;
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return kiln_fail(KILN_ERR_IO, "MPI_Init_thread failed (error %d): start kiln with mpirun", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    started = 1;
    return KILN_OK;
}

int kiln_dist_rank(void) { return rank_; }
int kiln_dist_size(void) { return size_; }
int kiln_dist_built(void) { return 1; }

void kiln_dist_allreduce_sum(void *ctx, float *x, int64_t n) {
    (void)ctx;
    if (!started || size_ == 1) return;
    const double t0 = MPI_Wtime();
    n_allreduce++;
    b_allreduce += (unsigned long long)n * sizeof *x;
    while (n > 0) { /* MPI counts are int */
        const int k = n > (1 << 30) ? 1 << 30 : (int)n;
        int rc = MPI_Allreduce(MPI_IN_PLACE, x, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            mpi_fail("MPI_Allreduce", rc);
            fprintf(stderr, "kiln: %s\n", kiln_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        x += k;
        n -= k;
    }
    t_allreduce += MPI_Wtime() - t0;
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
    if (started) MPI_Finalize();
    started = 0;
}
