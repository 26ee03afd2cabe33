/* test_weight_copies.c — the weight integrity check covers the bytes the kernels actually read:
 * weights requantized in memory and FP8/INT4 checkpoint weights repacked into the GEMV tile layout
 * at the first session are owned copies of (or derived from) the checksummed mapped tensors, so
 * kiln_model_check_weights re-checks each copy; a flipped bit in one is reported by name. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kiln.h"
#include "model/model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char model_dir[4096];

static int setup(void **state) {
    (void)state;
    const char *sh = getenv("SHARED");
    snprintf(model_dir, sizeof model_dir, "%s/models/stories260K", sh && *sh ? sh : "../shared");
    return access(model_dir, R_OK) == 0 ? 0 : -1;
}

/* Flips one bit of copy k, expects the check to fail naming it, flips it back. */
static void corrupt_and_detect(kiln_model *m, int k) {
    assert_true(k < m->n_copies);
    uint8_t *p = (uint8_t *)m->copies[k].data + m->copies[k].nbytes / 2;
    *p ^= 0x10;
    assert_int_equal(kiln_model_check_weights(m), KILN_ERR_INTEGRITY);
    assert_non_null(strstr(kiln_last_error(), m->copies[k].name));
    *p ^= 0x10;
    assert_int_equal(kiln_model_check_weights(m), KILN_OK);
}

static void test_requantized_copies(void **state) {
    (void)state;
    kiln_model *m;
    assert_int_equal(kiln_model_load(model_dir, NULL, &m), KILN_OK);
    assert_int_equal(m->n_copies, 0);
    int kept = 0;
    assert_int_equal(kiln_model_requantize(m, "int4", &kept), KILN_OK);
    /* 5 layers x 7 projections, down_proj (172 columns) kept: 30 weights, data + scales each */
    assert_int_equal(kept, 5);
    assert_int_equal(m->n_copies, 60);
    assert_int_equal(kiln_model_check_weights(m), KILN_OK);
    corrupt_and_detect(m, 0);
    corrupt_and_detect(m, 59);
    kiln_model_free(m);
}

static void test_repacked_copies(void **state) {
    (void)state;
    char tmpl[] = "/tmp/kiln_wcopies_XXXXXX", dir[4200];
    assert_non_null(mkdtemp(tmpl));
    snprintf(dir, sizeof dir, "%s/q", tmpl);
    kiln_model *m;
    assert_int_equal(kiln_model_load(model_dir, NULL, &m), KILN_OK);
    assert_int_equal(kiln_model_quantize_save(m, dir, "fp8", 128, "all", 0), KILN_OK);
    kiln_model_free(m);
    assert_int_equal(kiln_model_load(dir, NULL, &m), KILN_OK);
    kiln_options o;
    kiln_options_default(&o);
    o.quiet = 1;
    kiln_session *s;
    assert_int_equal(kiln_session_create(m, &o, &s), KILN_OK);
    if (m->n_copies == 0) { /* no kernels that read the tile layout on this CPU: nothing was copied */
        print_message("no repack on this CPU (no AVX-512): skipping the corruption check\n");
    } else {
        /* FP8 scales stay the mapped tensors (checked there): one copy per repacked weight */
        assert_int_equal(m->n_copies, 35);
        assert_int_equal(kiln_model_check_weights(m), KILN_OK);
        corrupt_and_detect(m, 3);
    }
    kiln_session_free(s);
    kiln_model_free(m);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requantized_copies),
        cmocka_unit_test(test_repacked_copies),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
