/* status.c — per-thread error messages and status names. */
#include "kiln_test.h"
#include "base/status.h"
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static _Thread_local char last_error[1024];

kiln_status kiln_fail(kiln_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

kiln_status kiln_fail_oom(const char *file, const char *what, unsigned long long bytes) {
    return kiln_fail(KILN_ERR_NOMEM, "%s: %s: out of memory (asked for %llu bytes)", file ? file : "?", what, bytes);
}

void kiln_clear_error(void) { last_error[0] = 0; }
const char *kiln_last_error(void) { return last_error; }

const char *kiln_status_name(kiln_status st) {
    switch (st) {
    case KILN_OK: return "ok";
    case KILN_ERR_IO: return "io error";
    case KILN_ERR_FORMAT: return "format error";
    case KILN_ERR_INVALID_ARG: return "invalid argument";
    case KILN_ERR_NOMEM: return "out of memory";
    case KILN_ERR_UNSUPPORTED: return "unsupported";
    case KILN_ERR_KV_EXHAUSTED: return "KV budget exhausted";
    case KILN_ERR_INTEGRITY: return "integrity check failed";
    case KILN_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

double kiln_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
