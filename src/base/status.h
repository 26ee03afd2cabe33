/* status.h — setting the per-thread error message behind kiln_last_error(). */
#ifndef KILN_BASE_STATUS_H
#define KILN_BASE_STATUS_H
#include "kiln.h"

/* Records a formatted one-line message for this thread and returns st, so callers can write
 * `return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': offset %zu past end", file, name, off);` */
kiln_status kiln_fail(kiln_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_clear_error(void);

#define KILN_TRY(expr) do { kiln_status st_ = (expr); if (st_ != KILN_OK) return st_; } while (0)
#endif
