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
/* First integer of an int-or-list field (eos_token_id); def when absent. */
int kiln_cfg_first_int(const json_t *cfg, const char *key, int def);
#endif
