/* hfconfig.h — validated reads of Hugging Face config.json fields. Errors name the file, the
 * field and the offending value. */
#ifndef KILN_FORMAT_HFCONFIG_H
#define KILN_FORMAT_HFCONFIG_H
#include "kiln.h"
#include <jansson.h>

/* Required integer field in [lo, hi]. */
kiln_status kiln_cfg_int(const json_t *cfg, const char *file, const char *key, long long lo, long long hi, int *out);
/* Optional integer: *out = def when absent or null. */
kiln_status kiln_cfg_int_opt(const json_t *cfg, const char *file, const char *key, long long lo, long long hi, int def, int *out);
/* Optional number (integer or real) in [lo, hi]; *out = def when absent or null. */
kiln_status kiln_cfg_num_opt(const json_t *cfg, const char *file, const char *key, double lo, double hi, double def, double *out);
/* Optional boolean. */
kiln_status kiln_cfg_bool_opt(const json_t *cfg, const char *file, const char *key, int def, int *out);
/* First integer of an int-or-list token-id field (bos_token_id, eos_token_id); *out = -1 when
 * absent or null. A value outside [0, 2^31) is an error naming the field, never cut to an int. */
kiln_status kiln_cfg_token_id(const json_t *cfg, const char *file, const char *key, int *out);
/* Every integer of an int-or-list token-id field, appended to ids[*n] (at most cap in all; ids
 * already there are not repeated). Each must be in [0, 2^31); more than cap distinct ids is an error
 * naming the field. */
kiln_status kiln_cfg_token_ids(const json_t *cfg, const char *file, const char *key, int *ids, int cap, int *n);
#endif
