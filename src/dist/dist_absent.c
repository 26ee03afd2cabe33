/* dist_absent.c — dist.h in a build without MPI (libopenmpi-dev was missing when `make` ran; the
 * Makefile compiles this file instead of dist_mpi.c): one process, and starting several refused. */
#include "dist/dist.h"
#include "base/status.h"

kiln_status kiln_dist_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: this kiln was built without MPI (install libopenmpi-dev and openmpi-bin, then rebuild)");
}
int kiln_dist_rank(void) { return 0; }
int kiln_dist_size(void) { return 1; }
int kiln_dist_built(void) { return 0; }
void kiln_dist_allreduce_sum(void *ctx, float *x, int64_t n) { (void)ctx; (void)x; (void)n; }
kiln_status kiln_dist_bcast_i32(int32_t *v, int n) { (void)v; (void)n; return KILN_OK; }
kiln_status kiln_dist_agree(const char *what, const char *value) { (void)what; (void)value; return KILN_OK; }
void kiln_dist_finalize(void) {}
void kiln_dist_stats(double *seconds, unsigned long long *calls, unsigned long long *bytes) {
    *seconds = 0;
    *calls = *bytes = 0;
}
void kiln_dist_set_deadline(double seconds) { (void)seconds; }
int kiln_dist_failed(void) { return 0; }
const char *kiln_dist_failure(void) { return ""; }
void kiln_dist_abort(int code) { (void)code; }
void kiln_dist_gather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out) { (void)ctx; (void)part; (void)rows; (void)vocab; (void)out; }
void kiln_dist_allgather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out) { (void)ctx; (void)part; (void)rows; (void)vocab; (void)out; }
kiln_status kiln_dist_allreduce_min_i32(int32_t *v, int n) { (void)v; (void)n; return KILN_OK; }
kiln_status kiln_dist_allreduce_or_u32(uint32_t *v, int n) { (void)v; (void)n; return KILN_OK; }
kiln_status kiln_dist_bcast_msg(int32_t **buf, int *n, int *cap, double wait_s) { (void)buf; (void)n; (void)cap; (void)wait_s; return KILN_OK; }
