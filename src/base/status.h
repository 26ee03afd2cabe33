/* status.h — setting the per-thread error message behind kiln_last_error(). */
#ifndef KILN_BASE_STATUS_H
#define KILN_BASE_STATUS_H
#include "kiln.h"

/* Records a formatted one-line message for this thread and returns st, so callers can write
 * `return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': offset %zu past end", file, name, off);` */
kiln_status kiln_fail(kiln_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_clear_error(void);
/* KILN_ERR_NOMEM naming what was being built, from which file, and the size asked:
 * "FILE: WHAT: out of memory (asked for N bytes)". A size read from a file is the usual cause. */
kiln_status kiln_fail_oom(const char *file, const char *what, unsigned long long bytes);

#define KILN_TRY(expr) do { kiln_status st_ = (expr); if (st_ != KILN_OK) return st_; } while (0)
/* Monotonic wall clock in seconds (also in kiln_test.h, for the tools). */
double kiln_now(void);
#endif
