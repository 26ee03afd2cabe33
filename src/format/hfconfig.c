/* hfconfig.c — validated config.json field reads. */
#include "format/hfconfig.h"
#include "base/status.h"

kiln_status kiln_cfg_int_opt(const json_t *cfg, const char *file, const char *key, long long lo, long long hi, int def, int *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) { *out = def; return KILN_OK; }
    if (!json_is_integer(v))
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be an integer", file, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %lld is out of range [%lld, %lld]", file, key, x, lo, hi);
    *out = (int)x;
    return KILN_OK;
}

kiln_status kiln_cfg_int(const json_t *cfg, const char *file, const char *key, long long lo, long long hi, int *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return kiln_fail(KILN_ERR_FORMAT, "%s: required field '%s' is missing", file, key);
    return kiln_cfg_int_opt(cfg, file, key, lo, hi, 0, out);
}

kiln_status kiln_cfg_num_opt(const json_t *cfg, const char *file, const char *key, double lo, double hi, double def, double *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) { *out = def; return KILN_OK; }
    if (!json_is_number(v)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be a number", file, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %g is out of range [%g, %g]", file, key, x, lo, hi);
    *out = x;
    return KILN_OK;
}

kiln_status kiln_cfg_bool_opt(const json_t *cfg, const char *file, const char *key, int def, int *out) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) { *out = def; return KILN_OK; }
    if (!json_is_boolean(v)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be true or false", file, key);
    *out = json_is_true(v);
    return KILN_OK;
}

kiln_status kiln_cfg_token_id(const json_t *cfg, const char *file, const char *key, int *out) {
    json_t *v = json_object_get(cfg, key);
    *out = -1;
    if (!v || json_is_null(v)) return KILN_OK;
    json_t *first = json_is_array(v) ? json_array_get(v, 0) : v;
    if (json_is_array(v) && json_array_size(v) == 0) return KILN_OK;
    if (!json_is_integer(first))
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be an integer or a list of integers", file, key);
    long long x = json_integer_value(first);
    if (x < 0 || x > 0x7fffffffLL)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %lld is not a token id", file, key, x);
    *out = (int)x;
    return KILN_OK;
}

kiln_status kiln_cfg_token_ids(const json_t *cfg, const char *file, const char *key, int *ids, int cap, int *n) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return KILN_OK;
    const size_t cnt = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < cnt; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be an integer or a list of integers", file, key);
        const long long x = json_integer_value(e);
        if (x < 0 || x > 0x7fffffffLL) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %lld is not a token id", file, key, x);
        int seen = 0;
        for (int k = 0; k < *n; k++) seen |= ids[k] == (int)x;
        if (seen) continue;
        if (*n == cap) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' lists more than %d distinct token ids", file, key, cap);
        ids[(*n)++] = (int)x;
    }
    return KILN_OK;
}
