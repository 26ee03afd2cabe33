/* vk_device.c — one Vulkan device for the vulkan backend: instance and device selection, buffers,
 * the compute pipelines of the embedded SPIR-V (created on first use: a driver compiles SPIR-V when
 * the pipeline is made, lavapipe through LLVM, so unused shaders cost nothing), descriptor sets from
 * a pool that is reset at every flush, and one command buffer submitted per flush. */
#include "backend/vulkan/vk_device.h"
#include "base/status.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The Vulkan loader is opened at run time (dlopen), not linked: the same binary starts on a machine
 * without libvulkan (where --device cpu is all there is) and says what is missing only when a
 * Vulkan device is asked for. Every entry point kiln calls is looked up once (the loader exports
 * the core ones, as it does for linking). KILN_VULKAN_LOADER names another loader file (tests use
 * a missing one to check the error). */
#define KILN_VK_FNS(X) \
    X(vkCmdWriteTimestamp) X(vkCmdResetQueryPool) X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkGetQueryPoolResults) \
    X(vkAllocateCommandBuffers) X(vkAllocateDescriptorSets) X(vkAllocateMemory) X(vkBeginCommandBuffer) X(vkBindBufferMemory) \
    X(vkCmdBindDescriptorSets) X(vkCmdBindPipeline) X(vkCmdCopyBuffer) X(vkCmdDispatch) X(vkCmdPipelineBarrier) \
    X(vkCmdPushConstants) X(vkCreateBuffer) X(vkCreateCommandPool) X(vkCreateComputePipelines) X(vkCreateDescriptorPool) \
    X(vkCreateDescriptorSetLayout) X(vkCreateDevice) X(vkCreateFence) X(vkCreateInstance) X(vkCreatePipelineLayout) \
    X(vkCreateShaderModule) X(vkDestroyBuffer) X(vkDestroyCommandPool) X(vkDestroyDescriptorPool) X(vkDestroyDescriptorSetLayout) \
    X(vkDestroyDevice) X(vkDestroyFence) X(vkDestroyInstance) X(vkDestroyPipeline) X(vkDestroyPipelineLayout) \
    X(vkDestroyShaderModule) X(vkDeviceWaitIdle) X(vkEndCommandBuffer) X(vkEnumeratePhysicalDevices) X(vkFreeMemory) \
    X(vkGetBufferMemoryRequirements) X(vkGetDeviceQueue) X(vkGetPhysicalDeviceFeatures2) \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceProperties) X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkMapMemory) X(vkQueueSubmit) X(vkResetCommandBuffer) X(vkResetDescriptorPool) X(vkResetFences) X(vkUnmapMemory) \
    X(vkUpdateDescriptorSets) X(vkWaitForFences)
#define KILN_VK_DECL(name) static PFN_##name name;
KILN_VK_FNS(KILN_VK_DECL)
#undef KILN_VK_DECL
/* Vulkan 1.2: looked up without requiring it (a 1.1 loader runs kiln without device addresses) */
static PFN_vkGetBufferDeviceAddress vkGetBufferDeviceAddress;

static pthread_once_t loader_once = PTHREAD_ONCE_INIT;
static char loader_error[512];

static void load_loader(void) {
    const char *file = getenv("KILN_VULKAN_LOADER");
    if (!file || !*file) file = "libvulkan.so.1";
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(loader_error, sizeof loader_error, "vulkan: cannot load the Vulkan loader %s (%s); install libvulkan1 and a driver "
                 "(Debian: mesa-vulkan-drivers for lavapipe) or use --device cpu", file, dlerror());
        return;
    }
#define KILN_VK_LOAD(name)                                                                                                      \
    if (!loader_error[0] && !(name = (PFN_##name)dlsym(lib, #name)))                                                            \
        snprintf(loader_error, sizeof loader_error, "vulkan: the loader %s lacks %s (Vulkan 1.2 or newer is needed); use --device cpu", file, #name);
    KILN_VK_FNS(KILN_VK_LOAD)
#undef KILN_VK_LOAD
    vkGetBufferDeviceAddress = (PFN_vkGetBufferDeviceAddress)dlsym(lib, "vkGetBufferDeviceAddress");
}

static kiln_status loader(void) {
    pthread_once(&loader_once, load_loader);
    return loader_error[0] ? kiln_fail(KILN_ERR_UNSUPPORTED, "%s", loader_error) : KILN_OK;
}

/* The SPIR-V the build embeds (build/vk_spirv.S): kiln_spv_NAME .. kiln_spv_NAME_end. */
#define KILN_VK_EXTERN(name) extern const uint32_t kiln_spv_##name[]; extern const uint8_t kiln_spv_##name##_end[];
KILN_VK_SHADERS(KILN_VK_EXTERN)
#undef KILN_VK_EXTERN

#define SETS_PER_POOL 512
#define PROF_QUERIES 4096

struct kiln_vk {
    VkInstance instance;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDevice dev;
    uint32_t queue_family;
    VkQueue queue;
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    int recording, recorded;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    /* descriptor pools of SETS_PER_POOL sets, chained: a step of more dispatches than one pool
     * holds takes the next pool (made when first needed) instead of submitting early; all are reset
     * at the flush */
    VkDescriptorPool *desc_pools;
    int n_desc_pools, cur_pool, sets_used;
    VkPipeline pipes[KILN_VK_SH_COUNT];
    kiln_vk_buf dummy;
    int bda;        /* buffer device addresses and 64-bit shader integers enabled (Vulkan 1.2 devices that have both) */
    int f64;        /* 64-bit shader floats enabled (with bda) */
    /* Injected device faults (KILN_VK_FAULT, tests of the failure paths): the submit numbered
     * lost_at (1-based) and every later one fail as VK_ERROR_DEVICE_LOST; buffers of oom_bytes or
     * more fail as VK_ERROR_OUT_OF_DEVICE_MEMORY. 0 = none. */
    uint64_t lost_at, submits;
    size_t oom_bytes;
    /* a submit failed (device lost): every later flush fails too, so that no caller takes the
     * results of work that was dropped for one it did not run itself (an upload's or a full
     * descriptor pool's flush in the middle of a deferred step) */
    int dead;
    /* Device time per shader (KILN_VK_PROFILE): a timestamp after each dispatch (dispatches are
     * serialised by their barriers, so consecutive stamps bound one dispatch), read at the flush. */
    VkQueryPool qpool;
    uint32_t n_q;
    uint8_t q_shader[PROF_QUERIES];
    double ts_ns;                   /* nanoseconds per timestamp tick */
    uint64_t prof_ns[KILN_VK_SH_COUNT], prof_n[KILN_VK_SH_COUNT];
    char name[440];
};

static const char *vk_result_name(VkResult r) {
    switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "out of host memory";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case VK_ERROR_INITIALIZATION_FAILED: return "initialization failed";
    case VK_ERROR_DEVICE_LOST: return "device lost";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "incompatible driver (no Vulkan implementation found)";
    case VK_ERROR_LAYER_NOT_PRESENT: return "layer not present";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "extension not present";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "feature not present";
    case VK_ERROR_TOO_MANY_OBJECTS: return "too many objects";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "out of pool memory";
    default: return "error";
    }
}

static kiln_status create_instance(VkInstance *out) {
    KILN_TRY(loader());
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kiln", .apiVersion = VK_API_VERSION_1_2};
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "vulkan: cannot create an instance: %s (VkResult %d); install a Vulkan driver "
                                               "(Debian: mesa-vulkan-drivers) or use --backend cpu", vk_result_name(r), (int)r);
    return KILN_OK;
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

static void describe(const VkPhysicalDeviceProperties *p, char *out, size_t n) {
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE + 1];
    snprintf(name, sizeof name, "%.200s", p->deviceName);
    snprintf(out, n, "%.200s (%s, Vulkan %u.%u, max storage buffer %u MiB)", name, type_name(p->deviceType), VK_API_VERSION_MAJOR(p->apiVersion),
             VK_API_VERSION_MINOR(p->apiVersion), p->limits.maxStorageBufferRange >> 20);
}

kiln_status kiln_vk_list(FILE *f) {
    VkInstance inst;
    kiln_status st = create_instance(&inst);
    if (st) return st;
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(inst, &n, NULL);
    VkPhysicalDevice *pd = calloc(n ? n : 1, sizeof *pd);
    if (!pd) { vkDestroyInstance(inst, NULL); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    vkEnumeratePhysicalDevices(inst, &n, pd);
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pd[i], &p);
        char d[400];
        describe(&p, d, sizeof d);
        fprintf(f, "vulkan:%u  %s\n", i, d);
    }
    free(pd);
    vkDestroyInstance(inst, NULL);
    if (n == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "vulkan: the loader found no device");
    return KILN_OK;
}

static kiln_status setup_device(kiln_vk *vk, int index) {
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(vk->instance, &n, NULL);
    if (n == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "vulkan: the loader found no device (install mesa-vulkan-drivers for lavapipe, or a GPU driver)");
    if (index < 0 || (uint32_t)index >= n)
        return kiln_fail(KILN_ERR_INVALID_ARG, "vulkan: device index %d is out of range: %u device%s (kiln inspect --devices lists them)", index, n,
                         n == 1 ? "" : "s");
    VkPhysicalDevice *pd = calloc(n, sizeof *pd);
    if (!pd) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    vkEnumeratePhysicalDevices(vk->instance, &n, pd);
    vk->phys = pd[index];
    free(pd);
    vkGetPhysicalDeviceProperties(vk->phys, &vk->props);
    vkGetPhysicalDeviceMemoryProperties(vk->phys, &vk->memprops);
    char d[400];
    describe(&vk->props, d, sizeof d);
    snprintf(vk->name, sizeof vk->name, "vulkan:%d %s", index, d);

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, NULL);
    VkQueueFamilyProperties *qf = calloc(nq ? nq : 1, sizeof *qf);
    if (!qf) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, qf);
    int fam = -1;
    for (uint32_t i = 0; i < nq && fam < 0; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) fam = (int)i;
    free(qf);
    if (fam < 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: no compute queue", vk->name);
    vk->queue_family = (uint32_t)fam;
    const float prio = 1.0f;
    const VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = vk->queue_family, .queueCount = 1,
                                         .pQueuePriorities = &prio};
    /* Buffer device addresses (core in Vulkan 1.2) let the attention shader read a KV layer array
     * of any size through a 64-bit pointer: a pool's array is usually larger than one storage-buffer
     * binding (maxStorageBufferRange: 128 MiB on lavapipe). Enabled where the device has it and
     * 64-bit integers (the pointer arithmetic); without them attention runs on the host. */
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    if (vk->props.apiVersion >= VK_API_VERSION_1_2) vkGetPhysicalDeviceFeatures2(vk->phys, &f2);
    vk->bda = vk->props.apiVersion >= VK_API_VERSION_1_2 && f12.bufferDeviceAddress && f2.features.shaderInt64 && vkGetBufferDeviceAddress;
    VkPhysicalDeviceVulkan12Features on12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .bufferDeviceAddress = VK_TRUE};
    /* 64-bit floats where the device has them: the MoE router's sigmoid in double precision, the
     * host's floats bit for bit (moe_route.comp) */
    vk->f64 = vk->bda && f2.features.shaderFloat64;
    VkPhysicalDeviceFeatures2 on2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &on12,
                                     .features = {.shaderInt64 = VK_TRUE, .shaderFloat64 = vk->f64 ? VK_TRUE : VK_FALSE}};
    const VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = vk->bda ? &on2 : NULL, .queueCreateInfoCount = 1,
                                    .pQueueCreateInfos = &qci};
    VkResult r = vkCreateDevice(vk->phys, &dci, NULL, &vk->dev);
    if (r != VK_SUCCESS) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: cannot create the device: %s", vk->name, vk_result_name(r));
    vkGetDeviceQueue(vk->dev, vk->queue_family, 0, &vk->queue);
    return KILN_OK;
}

/* One more descriptor pool in the chain; -1 when the device gives none. */
static int add_desc_pool(kiln_vk *vk) {
    VkDescriptorPool *grown = realloc(vk->desc_pools, (size_t)(vk->n_desc_pools + 1) * sizeof *grown);
    if (!grown) return -1;
    vk->desc_pools = grown;
    const VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = SETS_PER_POOL * KILN_VK_BINDINGS};
    const VkDescriptorPoolCreateInfo dpci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = SETS_PER_POOL, .poolSizeCount = 1, .pPoolSizes = &ps};
    if (vkCreateDescriptorPool(vk->dev, &dpci, NULL, &vk->desc_pools[vk->n_desc_pools]) != VK_SUCCESS) return -1;
    vk->n_desc_pools++;
    return 0;
}
/* Every pool used since the last flush back to empty. */
static void reset_desc_pools(kiln_vk *vk) {
    for (int i = 0; i <= vk->cur_pool && i < vk->n_desc_pools; i++) vkResetDescriptorPool(vk->dev, vk->desc_pools[i], 0);
    vk->cur_pool = 0;
    vk->sets_used = 0;
}

static kiln_status setup_commands(kiln_vk *vk) {
    const VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                         .queueFamilyIndex = vk->queue_family};
    if (vkCreateCommandPool(vk->dev, &pci, NULL, &vk->cmd_pool) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a command pool", vk->name);
    const VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->cmd_pool,
                                            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (vkAllocateCommandBuffers(vk->dev, &ai, &vk->cmd) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot allocate a command buffer", vk->name);
    const VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (vkCreateFence(vk->dev, &fci, NULL, &vk->fence) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a fence", vk->name);

    VkDescriptorSetLayoutBinding b[KILN_VK_BINDINGS];
    for (int i = 0; i < KILN_VK_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = 1,
                                              .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = KILN_VK_BINDINGS, .pBindings = b};
    if (vkCreateDescriptorSetLayout(vk->dev, &lci, NULL, &vk->set_layout) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a descriptor set layout", vk->name);
    const VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = KILN_VK_PUSH_BYTES};
    const VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1, .pSetLayouts = &vk->set_layout,
                                             .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    if (vkCreatePipelineLayout(vk->dev, &plci, NULL, &vk->pipe_layout) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a pipeline layout", vk->name);
    if (add_desc_pool(vk) != 0) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a descriptor pool", vk->name);
    return kiln_vk_buf_create(vk, 256, 1, &vk->dummy);
}

/* KILN_VK_FAULT="lost:N" and / or "oom:BYTES" (comma-separated). */
static kiln_status parse_faults(kiln_vk *vk) {
    const char *f = getenv("KILN_VK_FAULT");
    if (!f || !*f) return KILN_OK;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", f);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        if (strncmp(t, "lost:", 5) == 0) {
            unsigned long long v = strtoull(t + 5, &end, 10);
            if (end && !*end && v > 0) { vk->lost_at = v; continue; }
        } else if (strncmp(t, "oom:", 4) == 0) {
            unsigned long long v = strtoull(t + 4, &end, 10);
            if (end && !*end && v > 0) { vk->oom_bytes = (size_t)v; continue; }
        }
        return kiln_fail(KILN_ERR_INVALID_ARG, "KILN_VK_FAULT: '%s' is not lost:N or oom:BYTES (N, BYTES positive integers)", t);
    }
    return KILN_OK;
}

kiln_status kiln_vk_open(int index, kiln_vk **out) {
    *out = NULL;
    kiln_vk *vk = calloc(1, sizeof *vk);
    if (!vk) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status fst = parse_faults(vk);
    if (fst) { free(vk); return fst; }
    kiln_status st = create_instance(&vk->instance);
    if (st == KILN_OK) st = setup_device(vk, index);
    if (st == KILN_OK) st = setup_commands(vk);
    if (st != KILN_OK) { kiln_vk_close(vk); return st; }
    if (getenv("KILN_VK_PROFILE") && vk->props.limits.timestampComputeAndGraphics) {
        const VkQueryPoolCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = PROF_QUERIES};
        if (vkCreateQueryPool(vk->dev, &qci, NULL, &vk->qpool) != VK_SUCCESS) vk->qpool = VK_NULL_HANDLE;
        vk->ts_ns = vk->props.limits.timestampPeriod;
    }
    *out = vk;
    return KILN_OK;
}

void kiln_vk_close(kiln_vk *vk) {
    if (!vk) return;
    if (vk->dev) {
        vkDeviceWaitIdle(vk->dev);
        for (int i = 0; i < KILN_VK_SH_COUNT; i++)
            if (vk->pipes[i]) vkDestroyPipeline(vk->dev, vk->pipes[i], NULL);
        kiln_vk_buf_destroy(vk, &vk->dummy);
        for (int i = 0; i < vk->n_desc_pools; i++) vkDestroyDescriptorPool(vk->dev, vk->desc_pools[i], NULL);
        free(vk->desc_pools);
        if (vk->pipe_layout) vkDestroyPipelineLayout(vk->dev, vk->pipe_layout, NULL);
        if (vk->set_layout) vkDestroyDescriptorSetLayout(vk->dev, vk->set_layout, NULL);
        if (vk->fence) vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->qpool) vkDestroyQueryPool(vk->dev, vk->qpool, NULL);
        if (vk->cmd_pool) vkDestroyCommandPool(vk->dev, vk->cmd_pool, NULL);
        vkDestroyDevice(vk->dev, NULL);
    }
    if (vk->instance) vkDestroyInstance(vk->instance, NULL);
    free(vk);
}

const char *kiln_vk_device_name(const kiln_vk *vk) { return vk->name; }
size_t kiln_vk_max_range(const kiln_vk *vk) { return vk->props.limits.maxStorageBufferRange; }
size_t kiln_vk_offset_align(const kiln_vk *vk) {
    const size_t a = (size_t)vk->props.limits.minStorageBufferOffsetAlignment;
    return a ? a : 1;
}
uint32_t kiln_vk_max_groups_x(const kiln_vk *vk) { return vk->props.limits.maxComputeWorkGroupCount[0]; }
uint32_t kiln_vk_max_groups_y(const kiln_vk *vk) { return vk->props.limits.maxComputeWorkGroupCount[1]; }
uint32_t kiln_vk_max_groups_z(const kiln_vk *vk) { return vk->props.limits.maxComputeWorkGroupCount[2]; }

/* ---- buffers ------------------------------------------------------------------------------------- */
static int find_memory(const kiln_vk *vk, uint32_t type_bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < vk->memprops.memoryTypeCount; i++)
        if ((type_bits & (1u << i)) && (vk->memprops.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

kiln_status kiln_vk_buf_create(kiln_vk *vk, size_t bytes, int host_visible, kiln_vk_buf *b) {
    memset(b, 0, sizeof *b);
    if (bytes == 0) bytes = 4;
    const VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                                    .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                             (vk->bda ? VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT : 0),
                                    .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (vk->oom_bytes && bytes >= vk->oom_bytes)
        return kiln_fail(KILN_ERR_NOMEM, "%s: cannot allocate %zu bytes of %s memory: %s (injected: KILN_VK_FAULT)", vk->name, bytes,
                         host_visible ? "host-visible" : "device", vk_result_name(VK_ERROR_OUT_OF_DEVICE_MEMORY));
    VkResult r = vkCreateBuffer(vk->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) return kiln_fail(KILN_ERR_NOMEM, "%s: cannot create a buffer of %zu bytes: %s", vk->name, bytes, vk_result_name(r));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(vk->dev, b->buf, &req);
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int type = -1;
    if (host_visible == KILN_VK_MEM_MAPPED_NEAR) {
        /* device-local and mapped (resizable BAR, unified memory) where there is such a type; should
         * its heap not hold this buffer, the allocation below retries in host memory */
        type = find_memory(vk, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | hv);
        if (type < 0) type = find_memory(vk, req.memoryTypeBits, hv | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
        if (type < 0) type = find_memory(vk, req.memoryTypeBits, hv);
    } else if (host_visible) {
        /* host-cached first: the host-side ops (attention, sampling) read these buffers */
        type = find_memory(vk, req.memoryTypeBits, hv | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
        if (type < 0) type = find_memory(vk, req.memoryTypeBits, hv);
    } else {
        type = find_memory(vk, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | hv);
        if (type < 0) type = find_memory(vk, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
        if (type < 0) type = find_memory(vk, req.memoryTypeBits, hv);
    }
    if (type < 0) {
        vkDestroyBuffer(vk->dev, b->buf, NULL);
        b->buf = VK_NULL_HANDLE;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: no memory type for a %s buffer of %zu bytes", vk->name, host_visible ? "host-visible" : "device", bytes);
    }
    const VkMemoryAllocateFlagsInfo maf = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO, .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    const VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = vk->bda ? &maf : NULL, .allocationSize = req.size,
                                      .memoryTypeIndex = (uint32_t)type};
    r = vkAllocateMemory(vk->dev, &mai, NULL, &b->mem);
    /* a preferred device-local + host-visible type lives in a small heap without resizable BAR
     * (~256 MiB), which KV arrays may have filled: device buffers retry in plain device-local
     * memory (uploads go through staging), KV arrays in host memory */
    if (r != VK_SUCCESS && host_visible != 1 &&
        (vk->memprops.memoryTypes[type].propertyFlags & (VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) ==
            (VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) {
        int other = -1;
        if (host_visible == KILN_VK_MEM_MAPPED_NEAR) {
            other = find_memory(vk, req.memoryTypeBits, hv | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
            if (other < 0) other = find_memory(vk, req.memoryTypeBits, hv);
        } else {
            for (uint32_t t = 0; t < vk->memprops.memoryTypeCount && other < 0; t++)
                if ((req.memoryTypeBits & (1u << t)) && (vk->memprops.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) &&
                    !(vk->memprops.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
                    other = (int)t;
        }
        if (other >= 0 && other != type) {
            const VkMemoryAllocateInfo mai2 = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = vk->bda ? &maf : NULL,
                                               .allocationSize = req.size, .memoryTypeIndex = (uint32_t)other};
            r = vkAllocateMemory(vk->dev, &mai2, NULL, &b->mem);
            if (r == VK_SUCCESS) type = other;
        }
    }
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(vk->dev, b->buf, NULL);
        b->buf = VK_NULL_HANDLE;
        return kiln_fail(KILN_ERR_NOMEM, "%s: cannot allocate %zu bytes of %s memory: %s", vk->name, bytes, host_visible ? "host-visible" : "device",
                         vk_result_name(r));
    }
    vkBindBufferMemory(vk->dev, b->buf, b->mem, 0);
    if (vk->memprops.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        void *p = NULL;
        if (vkMapMemory(vk->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &p) != VK_SUCCESS) {
            kiln_vk_buf_destroy(vk, b);
            return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot map a buffer of %zu bytes", vk->name, bytes);
        }
        b->map = p;
    }
    b->size = bytes;
    return KILN_OK;
}

int kiln_vk_has_bda(const kiln_vk *vk) { return vk->bda; }
int kiln_vk_has_f64(const kiln_vk *vk) { return vk->f64; }
uint64_t kiln_vk_submits(const kiln_vk *vk) { return vk->submits; }

uint64_t kiln_vk_buf_address(kiln_vk *vk, const kiln_vk_buf *b) {
    if (!vk->bda || !b->buf) return 0;
    const VkBufferDeviceAddressInfo ai = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = b->buf};
    return (uint64_t)vkGetBufferDeviceAddress(vk->dev, &ai);
}

void kiln_vk_buf_destroy(kiln_vk *vk, kiln_vk_buf *b) {
    if (b->map) vkUnmapMemory(vk->dev, b->mem);
    if (b->buf) vkDestroyBuffer(vk->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(vk->dev, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

static kiln_status begin(kiln_vk *vk) {
    if (vk->recording) return KILN_OK;
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (vkBeginCommandBuffer(vk->cmd, &bi) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot begin a command buffer", vk->name);
    vk->recording = 1;
    vk->recorded = 0;
    if (vk->qpool) {
        vkCmdResetQueryPool(vk->cmd, vk->qpool, 0, PROF_QUERIES);
        vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, vk->qpool, 0);
        vk->n_q = 1;
    }
    return KILN_OK;
}

/* Reads the stamps of the command buffer that just completed into the per-shader totals. */
static void read_stamps(kiln_vk *vk) {
    if (!vk->qpool || vk->n_q < 2) return;
    uint64_t t[PROF_QUERIES];
    if (vkGetQueryPoolResults(vk->dev, vk->qpool, 0, vk->n_q, sizeof t, t, sizeof t[0], VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    for (uint32_t i = 1; i < vk->n_q; i++) {
        vk->prof_ns[vk->q_shader[i]] += (uint64_t)((double)(t[i] - t[i - 1]) * vk->ts_ns);
        vk->prof_n[vk->q_shader[i]]++;
    }
}

int kiln_vk_profile(const kiln_vk *vk, uint64_t ns[KILN_VK_SH_COUNT], uint64_t n[KILN_VK_SH_COUNT], const char **names) {
    static const char *const nm[KILN_VK_SH_COUNT] = {
#define KILN_VK_NM(name) #name,
        KILN_VK_SHADERS(KILN_VK_NM)
#undef KILN_VK_NM
    };
    for (int i = 0; i < KILN_VK_SH_COUNT; i++) {
        ns[i] = vk->prof_ns[i];
        n[i] = vk->prof_n[i];
        names[i] = nm[i];
    }
    return vk->qpool != VK_NULL_HANDLE;
}

kiln_status kiln_vk_upload(kiln_vk *vk, kiln_vk_buf *b, size_t offset, const void *src, size_t bytes) {
    if (b->map) {
        memcpy(b->map + offset, src, bytes);
        return KILN_OK;
    }
    kiln_status st = kiln_vk_flush(vk);
    if (st) return st;
    kiln_vk_buf stage;
    st = kiln_vk_buf_create(vk, bytes, 1, &stage);
    if (st) return st;
    memcpy(stage.map, src, bytes);
    st = begin(vk);
    if (st == KILN_OK) {
        const VkBufferCopy region = {.srcOffset = 0, .dstOffset = offset, .size = bytes};
        vkCmdCopyBuffer(vk->cmd, stage.buf, b->buf, 1, &region);
        vk->recorded = 1;
        st = kiln_vk_flush(vk);
    }
    kiln_vk_buf_destroy(vk, &stage);
    return st;
}

/* ---- pipelines and dispatch ---------------------------------------------------------------------- */
static kiln_status pipeline(kiln_vk *vk, kiln_vk_shader s, VkPipeline *out) {
    if (vk->pipes[s]) { *out = vk->pipes[s]; return KILN_OK; }
    static const uint32_t *const code[KILN_VK_SH_COUNT] = {
#define KILN_VK_CODE(name) kiln_spv_##name,
        KILN_VK_SHADERS(KILN_VK_CODE)
#undef KILN_VK_CODE
    };
    static const uint8_t *const end[KILN_VK_SH_COUNT] = {
#define KILN_VK_END(name) kiln_spv_##name##_end,
        KILN_VK_SHADERS(KILN_VK_END)
#undef KILN_VK_END
    };
    static const char *const names[KILN_VK_SH_COUNT] = {
#define KILN_VK_NAME(name) #name,
        KILN_VK_SHADERS(KILN_VK_NAME)
#undef KILN_VK_NAME
    };
    const VkShaderModuleCreateInfo mci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                          .codeSize = (size_t)(end[s] - (const uint8_t *)code[s]), .pCode = code[s]};
    VkShaderModule mod;
    if (vkCreateShaderModule(vk->dev, &mci, NULL, &mod) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: shader %s: cannot create the module", vk->name, names[s]);
    const VkComputePipelineCreateInfo cpci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = mod, .pName = "main"},
        .layout = vk->pipe_layout};
    VkResult r = vkCreateComputePipelines(vk->dev, VK_NULL_HANDLE, 1, &cpci, NULL, &vk->pipes[s]);
    vkDestroyShaderModule(vk->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        vk->pipes[s] = VK_NULL_HANDLE;
        return kiln_fail(KILN_ERR_INTERNAL, "%s: shader %s: cannot create the pipeline: %s", vk->name, names[s], vk_result_name(r));
    }
    *out = vk->pipes[s];
    return KILN_OK;
}

kiln_status kiln_vk_dispatch(kiln_vk *vk, kiln_vk_shader shader, const kiln_vk_bind *binds, int n_bind, const void *push, size_t push_bytes,
                             uint32_t gx, uint32_t gy, uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return KILN_OK;
    VkPipeline pipe = VK_NULL_HANDLE;
    kiln_status st = pipeline(vk, shader, &pipe);
    if (st) return st;
    if (vk->sets_used == SETS_PER_POOL) { /* the next pool of the chain (a new one if need be; if none can be had, submit what is recorded) */
        if (vk->cur_pool + 1 < vk->n_desc_pools || add_desc_pool(vk) == 0) {
            vk->cur_pool++;
            vk->sets_used = 0;
        } else if ((st = kiln_vk_flush(vk)) != KILN_OK) return st;
    }
    if ((st = begin(vk)) != KILN_OK) return st;
    VkDescriptorSet set;
    const VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = vk->desc_pools[vk->cur_pool],
                                             .descriptorSetCount = 1, .pSetLayouts = &vk->set_layout};
    if (vkAllocateDescriptorSets(vk->dev, &dai, &set) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot allocate a descriptor set", vk->name);
    vk->sets_used++;
    VkDescriptorBufferInfo bi[KILN_VK_BINDINGS];
    VkWriteDescriptorSet wr[KILN_VK_BINDINGS];
    for (int i = 0; i < KILN_VK_BINDINGS; i++) {
        if (i < n_bind) bi[i] = (VkDescriptorBufferInfo){.buffer = binds[i].buf, .offset = binds[i].offset, .range = binds[i].range};
        else bi[i] = (VkDescriptorBufferInfo){.buffer = vk->dummy.buf, .offset = 0, .range = VK_WHOLE_SIZE};
        wr[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = (uint32_t)i, .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i]};
    }
    vkUpdateDescriptorSets(vk->dev, KILN_VK_BINDINGS, wr, 0, NULL);
    vkCmdBindPipeline(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdBindDescriptorSets(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->pipe_layout, 0, 1, &set, 0, NULL);
    uint8_t pc[KILN_VK_PUSH_BYTES] = {0};
    memcpy(pc, push, push_bytes < sizeof pc ? push_bytes : sizeof pc);
    vkCmdPushConstants(vk->cmd, vk->pipe_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, KILN_VK_PUSH_BYTES, pc);
    vkCmdDispatch(vk->cmd, gx, gy, gz);
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(vk->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                         NULL, 0, NULL);
    if (vk->qpool && vk->n_q < PROF_QUERIES) {
        vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->qpool, vk->n_q);
        vk->q_shader[vk->n_q++] = (uint8_t)shader;
    }
    vk->recorded = 1;
    return KILN_OK;
}

kiln_status kiln_vk_flush(kiln_vk *vk) {
    if (vk->dead) {
        kiln_vk_discard(vk);
        return kiln_fail(KILN_ERR_INTERNAL, "%s: the device failed earlier (device lost)", vk->name);
    }
    if (!vk->recording) return KILN_OK;
    vk->recording = 0;
    if (vkEndCommandBuffer(vk->cmd) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot end the command buffer", vk->name);
    kiln_status st = KILN_OK;
    if (vk->recorded) {
        const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &vk->cmd};
        VkResult r = ++vk->submits >= vk->lost_at && vk->lost_at ? VK_ERROR_DEVICE_LOST : vkQueueSubmit(vk->queue, 1, &si, vk->fence);
        if (r == VK_SUCCESS) r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
        if (r != VK_SUCCESS) {
            st = kiln_fail(KILN_ERR_INTERNAL, "%s: submit failed: %s", vk->name, vk_result_name(r));
            vk->dead = 1;
        } else read_stamps(vk);
        vkResetFences(vk->dev, 1, &vk->fence);
    }
    vkResetCommandBuffer(vk->cmd, 0);
    reset_desc_pools(vk);
    vk->recorded = 0;
    return st;
}

void kiln_vk_discard(kiln_vk *vk) {
    if (!vk->recording) return;
    vk->recording = 0;
    vkEndCommandBuffer(vk->cmd);
    vkResetCommandBuffer(vk->cmd, 0);
    reset_desc_pools(vk);
    vk->recorded = 0;
}
