/* dist.h — processes of one model over MPI (Open MPI; docs/SCALE.md): start-up, the collectives the
 * tensor-parallel forward pass and the generation loop need, and the start-up agreement check.
 * MPI's state is process-wide by nature (MPI_COMM_WORLD), so is this module's. A build without MPI
 * compiles dist_absent.c: one process, and --tp > 1 refused with a message saying how to get it. */
#ifndef KILN_DIST_DIST_H
#define KILN_DIST_DIST_H
#include "kiln.h"
#include <stdint.h>

/* The functions are public (include/kiln.h, "scale-out"): kiln_dist_init, kiln_dist_rank,
 * kiln_dist_size, kiln_dist_allreduce_sum, kiln_dist_bcast_i32, kiln_dist_agree, kiln_dist_finalize,
 * kiln_dist_built. */
/* Internal (engine/scheduler.c: `kiln serve` under mpirun, docs/SCALE.md). Each returns the
 * failure (also kept for kiln_dist_failed) when a rank did not take part within the deadline. */
/* v[0, n) = the element-wise minimum over the ranks. */
kiln_status kiln_dist_allreduce_min_i32(int32_t *v, int n);
/* v[0, n) = the bitwise or over the ranks. */
kiln_status kiln_dist_allreduce_or_u32(uint32_t *v, int n);
/* Rank 0's *n words at *buf to every rank; the others wait up to wait_s seconds (0 = forever,
 * sleeping between polls) for it to start, grow *buf (capacity *cap words, realloc'd) and set *n. */
kiln_status kiln_dist_bcast_msg(int32_t **buf, int *n, int *cap, double wait_s);
#endif
