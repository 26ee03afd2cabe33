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
#endif
