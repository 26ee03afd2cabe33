/* vk_absent.c — the vulkan backend's entry points in a build without the Vulkan SDK (libvulkan-dev
 * and glslc were missing when `make` ran; the Makefile compiles this file instead of the others in
 * this folder): every call says how to get a build that has it. */
#include "backend/vulkan/backend_vulkan.h"
#include "base/status.h"

#define NO_VULKAN "this kiln was built without Vulkan (install libvulkan-dev and glslc, then rebuild: make clean && make)"

kiln_status kiln_backend_vulkan_open(kiln_backend *be, int device_index) {
    (void)be;
    (void)device_index;
    return kiln_fail(KILN_ERR_UNSUPPORTED, "--backend vulkan: " NO_VULKAN);
}
void kiln_backend_vulkan_close(kiln_backend *be) { (void)be; }
kiln_status kiln_backend_vulkan_list(FILE *f) {
    (void)f;
    return kiln_fail(KILN_ERR_UNSUPPORTED, NO_VULKAN);
}
/* never used: kiln_backend_vulkan_open fails first */
const kiln_backend_ops kiln_backend_vulkan_ops = {0};

int kiln_backend_vulkan_built(void) { return 0; }
void kiln_backend_vulkan_counts(const kiln_backend *be, uint64_t *dispatches, uint64_t *host_fallbacks) {
    (void)be;
    *dispatches = *host_fallbacks = 0;
}
int kiln_backend_vulkan_subgroups(const kiln_backend *be) {
    (void)be;
    return 0;
}
uint64_t kiln_backend_vulkan_gemv4_dispatches(const kiln_backend *be) {
    (void)be;
    return 0;
}
uint64_t kiln_backend_vulkan_pair_dispatches(const kiln_backend *be) {
    (void)be;
    return 0;
}
int kiln_backend_vulkan_f64(const kiln_backend *be) {
    (void)be;
    return 0;
}
void kiln_backend_vulkan_programs(const kiln_backend *be, uint64_t *recorded, uint64_t *replayed) {
    (void)be;
    *recorded = *replayed = 0;
}
kiln_status kiln_backend_vulkan_read_gbps(const kiln_backend *be, size_t bytes, int passes, double *gbps) {
    (void)be;
    (void)bytes;
    (void)passes;
    *gbps = 0.0;
    return kiln_fail(KILN_ERR_UNSUPPORTED, NO_VULKAN);
}
