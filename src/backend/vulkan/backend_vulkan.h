/* backend_vulkan.h — internal: opening and closing the vulkan backend's device state on a backend
 * object (backend.c calls these for KILN_BACKEND_VULKAN). A build without the Vulkan SDK compiles
 * vk_absent.c instead, whose functions say so. */
#ifndef KILN_BACKEND_VULKAN_H
#define KILN_BACKEND_VULKAN_H
#include "backend/backend.h"
#include <stdint.h>
#include <stdio.h>

/* Opens Vulkan device `device_index` for be (be->impl, be->device_name); errors name the device. */
kiln_status kiln_backend_vulkan_open(kiln_backend *be, int device_index);
void kiln_backend_vulkan_close(kiln_backend *be);
/* One line per Vulkan device ("vulkan:N  NAME (TYPE, ...)"). */
kiln_status kiln_backend_vulkan_list(FILE *f);
extern const kiln_backend_ops kiln_backend_vulkan_ops;
/* Dispatches recorded so far, and calls of ops `supports` reports native that were computed on
 * the host instead (a binding too large, a failed upload or submit): tests check the latter is 0. */
void kiln_backend_vulkan_counts(const kiln_backend *be, uint64_t *dispatches, uint64_t *host_fallbacks);
/* 1 when the device's reductions run on subgroup arithmetic (vk_device.h kiln_vk_subgroups). */
int kiln_backend_vulkan_subgroups(const kiln_backend *be);
/* Dispatches of the 4-row INT4 decode GEMV (KILN_VK_GEMV_ROWS=4) so far. */
uint64_t kiln_backend_vulkan_gemv4_dispatches(const kiln_backend *be);
/* Dispatches of gate, up and SwiGLU in one (matmul.comp PAIR) so far: tests check that the pair ran. */
uint64_t kiln_backend_vulkan_pair_dispatches(const kiln_backend *be);
/* 1 when the device's shaders use 64-bit floats (the router's sigmoid, layernorm64). */
int kiln_backend_vulkan_f64(const kiln_backend *be);
/* Command buffers recorded so far, and flushes that replayed one recorded before (vk_device.c). */
void kiln_backend_vulkan_programs(const kiln_backend *be, uint64_t *recorded, uint64_t *replayed);
/* The device's read bandwidth in GB/s (1e9 B/s): a device buffer of `bytes` read `passes` times
 * per timed submit, best of three submits (backend_vulkan.c). */
kiln_status kiln_backend_vulkan_read_gbps(const kiln_backend *be, size_t bytes, int passes, double *gbps);
/* 1 when this build has the vulkan backend (the Vulkan SDK was there at build time). */
int kiln_backend_vulkan_built(void);
#endif
