/* vk_device.h — internal: one Vulkan device as the vulkan backend uses it (instance, device, one
 * compute queue, buffers, the compute pipelines of the embedded SPIR-V, and a command buffer that
 * collects dispatches until a flush submits them and waits).
 *
 * Every pipeline has the same layout: KILN_VK_BINDINGS storage buffers (binding i ↔ bufs[i]; an op
 * that reads fewer binds a small dummy buffer to the rest) and a uniform block of up to
 * KILN_VK_PUSH_BYTES of parameters at binding KILN_VK_BINDINGS, so one descriptor-set layout and one
 * pipeline layout serve every shader. */
#ifndef KILN_BACKEND_VK_DEVICE_H
#define KILN_BACKEND_VK_DEVICE_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#define VK_NO_PROTOTYPES /* vk_device.c looks the entry points up in the loader it opens at run time */
#include <vulkan/vulkan.h>

#define KILN_VK_BINDINGS 5
#define KILN_VK_PUSH_BYTES 128

/* The shaders (src/backend/vulkan/shaders/), one pipeline each; the Makefile's VK_SHADERS lists
 * the same names (build/vk_spirv.S embeds build/shaders/NAME.spv as kiln_spv_NAME). */
#define KILN_VK_SHADERS(X) \
    X(matmul_f32) X(matmul_f16) X(matmul_bf16) X(matmul_fp8) X(matmul_int4) X(matmul_q8_0) X(matmul_q4_0) X(matmul_q4_k) X(matmul_q5_k) X(matmul_q6_k) X(matmul_q2_k) X(matmul_q3_k) X(matmul_iq4_xs) X(matmul_q4_1) X(matmul_q5_0) X(matmul_q5_1) X(matmul_iq4_nl) \
    X(rmsnorm) X(add) X(add_bias) X(swiglu) X(swiglu_rows) X(rope) X(kv_merge) X(membw) X(moe_combine) X(copy_rows) X(moe_route) \
    X(matmul_id_f32) X(matmul_id_f16) X(matmul_id_bf16) X(matmul_id_fp8) X(matmul_id_int4) X(matmul_id_q8_0) X(matmul_id_q4_0) X(matmul_id_q4_k) \
    X(matmul_id_q5_k) X(matmul_id_q6_k) X(matmul_id_q2_k) X(matmul_id_q3_k) X(matmul_id_iq4_xs) X(matmul_id_q4_1) X(matmul_id_q5_0) \
    X(matmul_id_q5_1) X(matmul_id_iq4_nl) \
    X(matmul8_f32) X(matmul8_f16) X(matmul8_bf16) X(matmul8_fp8) X(matmul8_int4) X(matmul8_q8_0) X(matmul8_q4_0) X(matmul8_q4_k) \
    X(matmul8_q5_k) X(matmul8_q6_k) X(matmul8_q2_k) X(matmul8_q3_k) X(matmul8_iq4_xs) X(matmul8_q4_1) X(matmul8_q5_0) \
    X(matmul8_q5_1) X(matmul8_iq4_nl) X(kv_attend_f32) X(kv_attend_bf16) X(kv_attend_fp8) \
    X(kv_store_f32) X(kv_store_bf16) X(kv_store_fp8) \
    X(sgmatmul_f32) X(sgmatmul_f16) X(sgmatmul_bf16) X(sgmatmul_fp8) X(sgmatmul_int4) X(sgmatmul_q8_0) X(sgmatmul_q4_0) X(sgmatmul_q4_k) \
    X(sgmatmul_q5_k) X(sgmatmul_q6_k) X(sgmatmul_q2_k) X(sgmatmul_q3_k) X(sgmatmul_iq4_xs) X(sgmatmul_q4_1) X(sgmatmul_q5_0) X(sgmatmul_q5_1) \
    X(sgmatmul_iq4_nl) \
    X(sgmatmul_id_f32) X(sgmatmul_id_f16) X(sgmatmul_id_bf16) X(sgmatmul_id_fp8) X(sgmatmul_id_int4) X(sgmatmul_id_q8_0) X(sgmatmul_id_q4_0) \
    X(sgmatmul_id_q4_k) X(sgmatmul_id_q5_k) X(sgmatmul_id_q6_k) X(sgmatmul_id_q2_k) X(sgmatmul_id_q3_k) X(sgmatmul_id_iq4_xs) X(sgmatmul_id_q4_1) \
    X(sgmatmul_id_q5_0) X(sgmatmul_id_q5_1) X(sgmatmul_id_iq4_nl) \
    X(sgmatmul8_f32) X(sgmatmul8_f16) X(sgmatmul8_bf16) X(sgmatmul8_fp8) X(sgmatmul8_int4) X(sgmatmul8_q8_0) X(sgmatmul8_q4_0) X(sgmatmul8_q4_k) \
    X(sgmatmul8_q5_k) X(sgmatmul8_q6_k) X(sgmatmul8_q2_k) X(sgmatmul8_q3_k) X(sgmatmul8_iq4_xs) X(sgmatmul8_q4_1) X(sgmatmul8_q5_0) \
    X(sgmatmul8_q5_1) X(sgmatmul8_iq4_nl) X(sgrmsnorm) X(moe_sort) X(matmul4r_int4) X(sgmatmul4r_int4) \
    X(layernorm) X(layernorm64) X(fp8_round) X(kv_topk) X(kv_store_dsa) X(kv_index) X(kv_attend_sparse) \
    X(matmul8_id_f32) X(matmul8_id_f16) X(matmul8_id_bf16) X(matmul8_id_fp8) X(matmul8_id_int4) X(matmul8_id_q8_0) X(matmul8_id_q4_0) \
    X(matmul8_id_q4_k) X(matmul8_id_q5_k) X(matmul8_id_q6_k) X(matmul8_id_q2_k) X(matmul8_id_q3_k) X(matmul8_id_iq4_xs) X(matmul8_id_q4_1) \
    X(matmul8_id_q5_0) X(matmul8_id_q5_1) X(matmul8_id_iq4_nl) \
    X(sgmatmul8_id_f32) X(sgmatmul8_id_f16) X(sgmatmul8_id_bf16) X(sgmatmul8_id_fp8) X(sgmatmul8_id_int4) X(sgmatmul8_id_q8_0) \
    X(sgmatmul8_id_q4_0) X(sgmatmul8_id_q4_k) X(sgmatmul8_id_q5_k) X(sgmatmul8_id_q6_k) X(sgmatmul8_id_q2_k) X(sgmatmul8_id_q3_k) \
    X(sgmatmul8_id_iq4_xs) X(sgmatmul8_id_q4_1) X(sgmatmul8_id_q5_0) X(sgmatmul8_id_q5_1) X(sgmatmul8_id_iq4_nl) \
    X(matmul_pair_f32) X(matmul_pair_f16) X(matmul_pair_bf16) X(matmul_pair_fp8) X(matmul_pair_int4) X(matmul_pair_q8_0) \
    X(matmul_pair_q4_0) X(matmul_pair_q4_k) X(matmul_pair_q5_k) X(matmul_pair_q6_k) X(matmul_pair_q2_k) X(matmul_pair_q3_k) \
    X(matmul_pair_iq4_xs) X(matmul_pair_q4_1) X(matmul_pair_q5_0) X(matmul_pair_q5_1) X(matmul_pair_iq4_nl) X(sgmatmul_pair_f32) \
    X(sgmatmul_pair_f16) X(sgmatmul_pair_bf16) X(sgmatmul_pair_fp8) X(sgmatmul_pair_int4) X(sgmatmul_pair_q8_0) \
    X(sgmatmul_pair_q4_0) X(sgmatmul_pair_q4_k) X(sgmatmul_pair_q5_k) X(sgmatmul_pair_q6_k) X(sgmatmul_pair_q2_k) \
    X(sgmatmul_pair_q3_k) X(sgmatmul_pair_iq4_xs) X(sgmatmul_pair_q4_1) X(sgmatmul_pair_q5_0) X(sgmatmul_pair_q5_1) \
    X(sgmatmul_pair_iq4_nl)
typedef enum {
#define KILN_VK_ENUM(name) KILN_VK_SH_##name,
    KILN_VK_SHADERS(KILN_VK_ENUM)
#undef KILN_VK_ENUM
    KILN_VK_SH_COUNT
} kiln_vk_shader;

typedef struct kiln_vk_buf {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint8_t *map;   /* persistently mapped when host-visible, else NULL */
    size_t size;
} kiln_vk_buf;

/* One storage-buffer binding of a dispatch. */
typedef struct kiln_vk_bind {
    VkBuffer buf;
    VkDeviceSize offset, range;
} kiln_vk_bind;

typedef struct kiln_vk kiln_vk;

/* Opens physical device `index` (the order of `kiln inspect --devices`). Errors name the device
 * and what failed (no loader, no device, index out of range, no compute queue). */
kiln_status kiln_vk_open(int index, kiln_vk **out);
void kiln_vk_close(kiln_vk *vk);
/* "NAME (TYPE, driver D, Vulkan X.Y)" of the opened device. */
const char *kiln_vk_device_name(const kiln_vk *vk);
/* maxStorageBufferRange and minStorageBufferOffsetAlignment of the device. */
size_t kiln_vk_max_range(const kiln_vk *vk);
size_t kiln_vk_offset_align(const kiln_vk *vk);
/* maxComputeWorkGroupCount[0] and [1]. */
uint32_t kiln_vk_max_groups_x(const kiln_vk *vk);
uint32_t kiln_vk_max_groups_y(const kiln_vk *vk);
uint32_t kiln_vk_max_groups_z(const kiln_vk *vk);
/* Writes one line per physical device to f; KILN_ERR_UNSUPPORTED when there is no loader or no device. */
kiln_status kiln_vk_list(FILE *f);

/* A buffer of `bytes` (≥ 1): host_visible = 1 → host-visible coherent memory, mapped; 0 → device-
 * local memory (mapped too when the device has a heap that is both); KILN_VK_MEM_MAPPED_NEAR →
 * mapped, in device-local memory where a type is both and its heap holds it (a KV layer array: the
 * device reads it every step, the host on rare paths only), else in host memory. Errors name the
 * device and size. */
#define KILN_VK_MEM_MAPPED_NEAR 2
kiln_status kiln_vk_buf_create(kiln_vk *vk, size_t bytes, int host_visible, kiln_vk_buf *b);
/* 1 when the device is a discrete GPU with a memory type that is device-local, host-visible and
 * coherent in a device-local heap of at least 1 GiB (resizable BAR over the whole memory: the
 * H200's Vulkan driver shows its 140 GiB that way): activations belong there, next to the shaders
 * that read them, rather than in host memory across PCIe. */
int kiln_vk_mapped_vram(const kiln_vk *vk);
/* 1 when the device is a CPU implementation (lavapipe): the shaders run on the host's cores. */
int kiln_vk_is_cpu(const kiln_vk *vk);
void kiln_vk_buf_destroy(kiln_vk *vk, kiln_vk_buf *b);
/* 1 when buffers have device addresses (shaders may read them through 64-bit pointers:
 * GL_EXT_buffer_reference); kiln_vk_buf_address is then b's address, else 0. */
int kiln_vk_has_bda(const kiln_vk *vk);
/* 1 when shaders may use 64-bit floats (enabled with buffer device addresses where the device has them). */
int kiln_vk_has_f64(const kiln_vk *vk);
/* 1 when the reductions run on subgroup arithmetic: kiln_vk_dispatch replaces a shader that has an
 * "sg" variant (matmul*, rmsnorm) by it, on devices with subgroup arithmetic in compute shaders
 * unless KILN_VK_SUBGROUPS=0 was set at open; 0: the portable shared-memory tree sums. */
int kiln_vk_subgroups(const kiln_vk *vk);
/* Command buffers submitted so far. */
uint64_t kiln_vk_submits(const kiln_vk *vk);
/* Device time per shader so far (ns[i], dispatches n[i], names[i] for shader i), measured with
 * timestamp queries when KILN_VK_PROFILE was set at open and the device has compute timestamps;
 * returns 0 (all zero) otherwise. */
int kiln_vk_profile(const kiln_vk *vk, uint64_t ns[KILN_VK_SH_COUNT], uint64_t n[KILN_VK_SH_COUNT], const char **names);
uint64_t kiln_vk_buf_address(kiln_vk *vk, const kiln_vk_buf *b);
/* Copies bytes into b at offset: directly when mapped, otherwise through a staging buffer (one
 * submit, waited for). */
kiln_status kiln_vk_upload(kiln_vk *vk, kiln_vk_buf *b, size_t offset, const void *src, size_t bytes);

/* Adds one dispatch of `shader` to the step (bindings beyond n_bind get the dummy buffer; `push`,
 * at most KILN_VK_PUSH_BYTES, is what the shader reads as its uniform block `p` at binding
 * KILN_VK_BINDINGS), with a memory barrier after it, so that the next dispatch sees its writes.
 * The flush runs the step as a command buffer recorded once per sequence of pipelines and bindings
 * (vk_device.c: parameters and workgroup counts are read from a buffer, so a step of the same shape
 * replays the recorded one). */
kiln_status kiln_vk_dispatch(kiln_vk *vk, kiln_vk_shader shader, const kiln_vk_bind *binds, int n_bind, const void *push,
                             size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
/* The next dispatch added neither reads what the last one added writes nor writes what it reads or
 * writes: no barrier between the two (a GPU may run them at once; the barrier after the next covers
 * both). Applies to that one dispatch only; ignored when it starts a new step. */
void kiln_vk_next_independent(kiln_vk *vk);
/* Dispatches logged so far that had no barrier before them (kiln_vk_next_independent). */
uint64_t kiln_vk_independent_dispatches(const kiln_vk *vk);
/* Submits what was recorded since the last flush and waits for it (no-op when nothing was). */
kiln_status kiln_vk_flush(kiln_vk *vk);
/* Drops what was recorded since the last flush without running it. */
void kiln_vk_discard(kiln_vk *vk);
/* Command buffers recorded so far, flushes that replayed one recorded before, and the host's time
 * preparing steps (logging dispatches, finding or recording their command buffer; prep_ns may be NULL). */
void kiln_vk_program_stats(const kiln_vk *vk, uint64_t *recorded, uint64_t *reused, uint64_t *prep_ns);
#endif
