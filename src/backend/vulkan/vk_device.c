/* vk_device.c — one Vulkan device for the vulkan backend: instance and device selection, buffers,
 * the compute pipelines of the embedded SPIR-V (created on first use: a driver compiles SPIR-V when
 * the pipeline is made, lavapipe through LLVM, so unused shaders cost nothing), descriptor sets from
 * pools owned by recorded programs, and one command buffer submitted per flush.
 *
 * Recorded once, replayed (issue 26: "command buffers recorded once per step shape and reused").
 * A dispatch does not go into a command buffer when it is asked for: it is appended to the step's
 * log (pipeline and the buffers it binds), and its parameters and workgroup counts are written into
 * its slot of the parameter buffer (slot k of a flush: a uniform block the shader reads as `p`, and
 * the VkDispatchIndirectCommand behind it). The flush looks the log up among the programs recorded
 * before: a program is a command buffer with one descriptor set per dispatch that binds slot k's
 * parameters and dispatches indirectly from slot k's counts. The same sequence of pipelines and
 * bindings — a decode step of the same batch shape: positions, context lengths, page tables and KV
 * addresses travel in the parameters or in staged tables — submits the recorded command buffer
 * again: no descriptor set is allocated or written and nothing is recorded. Another sequence is
 * recorded once and kept (the least recently used of PROGRAMS is dropped). A program is dropped
 * when a buffer it binds is destroyed. KILN_VK_REUSE=0 records every flush afresh (the A/B control
 * of docs/VULKAN.md); so does profiling, whose timestamps follow the log. */
#include "backend/vulkan/vk_device.h"
#include "base/status.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The Vulkan loader is opened at run time (dlopen), not linked: the same binary starts on a machine
 * without libvulkan (where --device cpu is all there is) and says what is missing only when a
 * Vulkan device is asked for. Every entry point kiln calls is looked up once (the loader exports
 * the core ones, as it does for linking). KILN_VULKAN_LOADER names another loader file (tests use
 * a missing one to check the error). */
#define KILN_VK_FNS(X) \
    X(vkCmdWriteTimestamp) X(vkCmdResetQueryPool) X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkGetQueryPoolResults) \
    X(vkAllocateCommandBuffers) X(vkAllocateDescriptorSets) X(vkAllocateMemory) X(vkBeginCommandBuffer) X(vkBindBufferMemory) \
    X(vkCmdBindDescriptorSets) X(vkCmdBindPipeline) X(vkCmdCopyBuffer) X(vkCmdDispatchIndirect) X(vkCmdPipelineBarrier) \
    X(vkFreeCommandBuffers) X(vkCreateBuffer) X(vkCreateCommandPool) X(vkCreateComputePipelines) X(vkCreateDescriptorPool) \
    X(vkCreateDescriptorSetLayout) X(vkCreateDevice) X(vkCreateFence) X(vkCreateInstance) X(vkCreatePipelineLayout) \
    X(vkCreateShaderModule) X(vkDestroyBuffer) X(vkDestroyCommandPool) X(vkDestroyDescriptorPool) X(vkDestroyDescriptorSetLayout) \
    X(vkDestroyDevice) X(vkDestroyFence) X(vkDestroyPipeline) X(vkDestroyPipelineLayout) \
    X(vkDestroyShaderModule) X(vkDeviceWaitIdle) X(vkEndCommandBuffer) X(vkEnumeratePhysicalDevices) X(vkFreeMemory) \
    X(vkGetBufferMemoryRequirements) X(vkGetDeviceQueue) X(vkGetPhysicalDeviceFeatures2) X(vkEnumerateDeviceExtensionProperties) \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceProperties) X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkMapMemory) X(vkQueueSubmit) X(vkResetCommandBuffer) X(vkResetFences) X(vkUnmapMemory) \
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

#define PROF_QUERIES 4096
_Static_assert(KILN_VK_SH_COUNT <= 256, "shader ids are stored in bytes (q_shader, variant)");
/* the shaders' names (errors, profiles, and the sg* variants found by name) */
static const char *const shader_names[KILN_VK_SH_COUNT] = {
#define KILN_VK_NAME(name) #name,
    KILN_VK_SHADERS(KILN_VK_NAME)
#undef KILN_VK_NAME
};
/* parameter slots per chunk of the parameter buffer (chunks are added as a flush needs them) */
#define SLOTS_PER_CHUNK 512
/* programs kept: decode steps of every batch size a server sees, prefill chunk shapes, MTP steps */
#define PROGRAMS 64
/* the binding of a dispatch's parameters (the uniform block `p` of every shader) */
#define PARAM_BINDING KILN_VK_BINDINGS

/* One dispatch of a log or program: the pipeline and what it binds (the key of a program; the
 * parameters and counts are not part of it). memcmp-compared: built from a zeroed value. */
typedef struct {
    uint32_t shader;
    uint32_t independent; /* 1: no barrier between the previous dispatch and this one (kiln_vk_next_independent) */
    kiln_vk_bind b[KILN_VK_BINDINGS];
} vk_entry;

/* A recorded command buffer: n dispatches, their descriptor sets in `pool`. */
typedef struct {
    vk_entry *e;
    int n;
    uint64_t key;           /* hash of e[0..n) */
    VkBuffer *bufs;         /* the distinct buffers it binds (dropped when one is destroyed) */
    int n_bufs;
    VkCommandBuffer cmd;
    VkDescriptorPool pool;
    uint64_t used;          /* the flush that last submitted it (least recently used goes first) */
    int dead;               /* a buffer it binds was destroyed: freed at the next flush */
} vk_program;

struct kiln_vk {
    VkInstance instance;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDevice dev;
    uint32_t queue_family;
    VkQueue queue;
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;    /* one-time copies (staged uploads) */
    VkFence fence;
    int recording, recorded;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    /* the dispatches since the last flush, and their key so far */
    vk_entry *log;
    int n_log, cap_log;
    uint64_t log_key;
    int next_independent; /* the next dispatch logged does not depend on the last one */
    uint64_t n_independent; /* dispatches logged with no barrier before them */
    /* parameter slots: chunk c holds slots [c·SLOTS_PER_CHUNK, (c+1)·SLOTS_PER_CHUNK) of a flush,
     * `pstride` bytes each: KILN_VK_PUSH_BYTES of parameters, then the indirect counts */
    kiln_vk_buf *pchunks;
    int n_pchunks;
    size_t pstride;
    /* recorded programs; prog_mu guards their dead flags and buffer lists (a buffer may be
     * destroyed on another thread than the one computing) */
    vk_program progs[PROGRAMS];
    int n_progs;
    pthread_mutex_t prog_mu;
    int reuse;
    /* the subgroup variant of each shader (its own id where it has none); identity when the device
     * has no subgroup arithmetic or KILN_VK_SUBGROUPS=0 */
    uint8_t variant[KILN_VK_SH_COUNT];
    int subgroups;
    int size_control, full_subgroups; /* Vulkan 1.3 subgroupSizeControl / computeFullSubgroups enabled */
    uint32_t sg_size;       /* the subgroup size the sg* pipelines require (0: not required: fixed by the device) */
    uint64_t flushes, recorded_programs, reused_programs;
    uint64_t prep_ns;       /* host time preparing steps: logging dispatches, finding or recording programs (not the device's run) */
    VkPipeline pipes[KILN_VK_SH_COUNT];
    kiln_vk_buf dummy;
    kiln_vk_buf upload_stage; /* kiln_vk_upload's staging buffer (device memory the host cannot map), kept between uploads */
    int bda;        /* buffer device addresses and 64-bit shader integers enabled (Vulkan 1.2 devices that have both) */
    int f64;        /* 64-bit shader floats enabled (with bda) */
    /* Injected device faults (KILN_VK_FAULT, tests of the failure paths): the submit numbered
     * lost_at (1-based) and every later one fail as VK_ERROR_DEVICE_LOST; buffers of oom_bytes or
     * more fail as VK_ERROR_OUT_OF_DEVICE_MEMORY. 0 = none. */
    uint64_t lost_at, submits;
    size_t oom_bytes;
    /* KILN_VK_UNMAPPED=1: device buffers are not mapped even where their memory could be, so every
     * upload goes through a staging buffer and a copy, as on a discrete GPU whose device-local
     * memory the host cannot map (tests run lavapipe, whose memory is all mappable, that way) */
    int unmapped;
    /* a submit failed (device lost): every later flush fails too, so that no caller takes the
     * results of work that was dropped for one it did not run itself (an upload's or a full
     * descriptor pool's flush in the middle of a deferred step) */
    int dead;
    /* Device time per shader (KILN_VK_PROFILE): a timestamp after each dispatch (dispatches are
     * serialised by their barriers, so consecutive stamps bound one dispatch), read at the flush. */
    VkQueryPool qpool;
    uint32_t n_q;
    uint8_t q_shader[PROF_QUERIES]; /* shader ids fit a byte: _Static_assert below */
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

/* One instance per process, created at the first use and never destroyed: creating one loads and
 * initialises every installed driver (tens of milliseconds on GPU drivers, for each backend a test
 * or a server opens), and destroying the last one unloads them, after which what a driver never
 * freed (lavapipe's LLVM) is reported by LeakSanitizer as leaks from unknown modules. The devices
 * are per backend and destroyed with it. */
static pthread_once_t instance_once = PTHREAD_ONCE_INIT;
static VkInstance process_instance;
static char instance_error[512];

static void create_process_instance(void) {
    /* 1.3: the highest version kiln uses (subgroup size control where the device has it); a device
     * of a lower version gets its own (the effective version is the lower of the two) */
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "kiln", .apiVersion = VK_API_VERSION_1_3};
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vkCreateInstance(&ci, NULL, &process_instance);
    if (r != VK_SUCCESS) {
        process_instance = VK_NULL_HANDLE;
        snprintf(instance_error, sizeof instance_error, "vulkan: cannot create an instance: %s (VkResult %d); install a Vulkan driver "
                 "(Debian: mesa-vulkan-drivers) or use --backend cpu", vk_result_name(r), (int)r);
    }
}

static kiln_status instance(VkInstance *out) {
    KILN_TRY(loader());
    pthread_once(&instance_once, create_process_instance);
    *out = process_instance;
    return instance_error[0] ? kiln_fail(KILN_ERR_UNSUPPORTED, "%s", instance_error) : KILN_OK;
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

static void memory_flags(VkMemoryPropertyFlags fl, char *out, size_t n) {
    snprintf(out, n, "%s%s%s%s", fl & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT ? "+device-local" : "",
             fl & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT ? "+host-visible" : "", fl & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT ? "+coherent" : "",
             fl & VK_MEMORY_PROPERTY_HOST_CACHED_BIT ? "+cached" : "");
    if (!out[0]) snprintf(out, n, "+none");
}

/* What decides where kiln puts things on a device and which shader variants it runs, under the
 * device's line of `kiln inspect --devices` (indented: the device lines stay "vulkan:N ..."):
 * the memory heaps and types (KV arrays want a device-local type the host maps: docs/VULKAN.md),
 * subgroup sizes and their control, 64-bit floats and integers, buffer device addresses, and
 * whether VK_KHR_cooperative_matrix is there. A first run on a new GPU records it
 * (scripts/gpu_check.sh: devices.txt). */
static void describe_details(FILE *f, VkPhysicalDevice pd, const VkPhysicalDeviceProperties *p) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    char fl[80];
    fprintf(f, "    memory heaps:");
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        fprintf(f, " %u: %.1f GiB%s;", h, (double)mp.memoryHeaps[h].size / (double)(1u << 30),
                mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT ? " device-local" : "");
    fprintf(f, "\n    memory types:");
    for (uint32_t t = 0; t < mp.memoryTypeCount; t++) {
        memory_flags(mp.memoryTypes[t].propertyFlags, fl, sizeof fl);
        fprintf(f, " %s (heap %u);", fl + 1, mp.memoryTypes[t].heapIndex);
    }
    fprintf(f, "\n");
    if (p->apiVersion < VK_API_VERSION_1_2) return;
    VkPhysicalDeviceVulkan13Properties p13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_PROPERTIES};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = p->apiVersion >= VK_API_VERSION_1_3 ? &p13 : NULL};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    VkPhysicalDeviceVulkan13Features f13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = p->apiVersion >= VK_API_VERSION_1_3 ? &f13 : NULL};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    int coop = 0;
    uint32_t ne = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, NULL) == VK_SUCCESS && ne) {
        VkExtensionProperties *ex = calloc(ne, sizeof *ex);
        if (ex && vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, ex) == VK_SUCCESS)
            for (uint32_t i = 0; i < ne; i++) coop |= strcmp(ex[i].extensionName, "VK_KHR_cooperative_matrix") == 0;
        free(ex);
    }
    fprintf(f, "    subgroups: %u", sg.subgroupSize);
    if (p->apiVersion >= VK_API_VERSION_1_3)
        fprintf(f, " (sizes %u..%u, size control %s, full subgroups %s)", p13.minSubgroupSize, p13.maxSubgroupSize,
                f13.subgroupSizeControl ? "yes" : "no", f13.computeFullSubgroups ? "yes" : "no");
    fprintf(f, "; float64 %s; int64 %s; buffer device address %s; VK_KHR_cooperative_matrix %s; max workgroups x %u\n",
            f2.features.shaderFloat64 ? "yes" : "no", f2.features.shaderInt64 ? "yes" : "no", f12.bufferDeviceAddress ? "yes" : "no", coop ? "yes" : "no",
            p->limits.maxComputeWorkGroupCount[0]);
}

kiln_status kiln_vk_list(FILE *f) {
    VkInstance inst;
    kiln_status st = instance(&inst);
    if (st) return st;
    uint32_t n = 0;
    vkEnumeratePhysicalDevices(inst, &n, NULL);
    VkPhysicalDevice *pd = calloc(n ? n : 1, sizeof *pd);
    if (!pd) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    vkEnumeratePhysicalDevices(inst, &n, pd);
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pd[i], &p);
        char d[400];
        describe(&p, d, sizeof d);
        fprintf(f, "vulkan:%u  %s\n", i, d);
        describe_details(f, pd[i], &p);
    }
    free(pd);
    if (n == 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "vulkan: the loader found no device");
    return KILN_OK;
}

/* An on/off environment switch: unset, "1" → 1; "0" → 0; anything else is refused, naming it. */
static kiln_status env_switch(const char *name, int *on) {
    const char *v = getenv(name);
    *on = 1;
    if (!v || strcmp(v, "1") == 0) return KILN_OK;
    if (strcmp(v, "0") == 0) { *on = 0; return KILN_OK; }
    return kiln_fail(KILN_ERR_INVALID_ARG, "%s: '%s' is not 0 or 1", name, v);
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
    VkPhysicalDeviceVulkan13Features f13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = vk->props.apiVersion >= VK_API_VERSION_1_3 ? &f13 : NULL};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    if (vk->props.apiVersion >= VK_API_VERSION_1_2) vkGetPhysicalDeviceFeatures2(vk->phys, &f2);
    /* A subgroup size fixed per pipeline (Vulkan 1.3 subgroupSizeControl): the sg* shaders sum per
     * subgroup, so their last bits depend on its size, and one token's floats must not depend on
     * which matmul variant ran (Intel and some AMD drivers pick the size per pipeline). */
    vk->size_control = f13.subgroupSizeControl == VK_TRUE;
    vk->full_subgroups = vk->size_control && f13.computeFullSubgroups == VK_TRUE;
    vk->bda = vk->props.apiVersion >= VK_API_VERSION_1_2 && f12.bufferDeviceAddress && f2.features.shaderInt64 && vkGetBufferDeviceAddress;
    VkPhysicalDeviceVulkan13Features on13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES, .subgroupSizeControl = VK_TRUE,
                                             .computeFullSubgroups = vk->full_subgroups ? VK_TRUE : VK_FALSE};
    VkPhysicalDeviceVulkan12Features on12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .bufferDeviceAddress = VK_TRUE,
                                             .pNext = vk->size_control ? &on13 : NULL};
    /* 64-bit floats where the device has them: the MoE router's sigmoid in double precision, the
     * host's floats bit for bit (moe_route.comp, layernorm64). KILN_VK_F64=0: as a device without
     * them (the op test runs the float paths with it). */
    int f64_on;
    const kiln_status est = env_switch("KILN_VK_F64", &f64_on);
    if (est) return est;
    vk->f64 = vk->bda && f2.features.shaderFloat64 && f64_on;
    VkPhysicalDeviceFeatures2 on2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &on12,
                                     .features = {.shaderInt64 = VK_TRUE, .shaderFloat64 = vk->f64 ? VK_TRUE : VK_FALSE}};
    if (!vk->bda) vk->size_control = vk->full_subgroups = 0; /* the feature chain below goes with buffer device addresses */
    const VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = vk->bda ? &on2 : NULL, .queueCreateInfoCount = 1,
                                    .pQueueCreateInfos = &qci};
    VkResult r = vkCreateDevice(vk->phys, &dci, NULL, &vk->dev);
    if (r != VK_SUCCESS) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: cannot create the device: %s", vk->name, vk_result_name(r));
    vkGetDeviceQueue(vk->dev, vk->queue_family, 0, &vk->queue);
    return KILN_OK;
}

static void program_free(kiln_vk *vk, vk_program *pg);

static kiln_status setup_commands(kiln_vk *vk) {
    const VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                         .queueFamilyIndex = vk->queue_family};
    if (vkCreateCommandPool(vk->dev, &pci, NULL, &vk->cmd_pool) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a command pool", vk->name);
    const VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->cmd_pool,
                                            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (vkAllocateCommandBuffers(vk->dev, &ai, &vk->cmd) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot allocate a command buffer", vk->name);
    const VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (vkCreateFence(vk->dev, &fci, NULL, &vk->fence) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a fence", vk->name);

    /* bindings 0 .. KILN_VK_BINDINGS-1: storage buffers; PARAM_BINDING: the dispatch's parameters */
    VkDescriptorSetLayoutBinding b[KILN_VK_BINDINGS + 1];
    for (int i = 0; i <= KILN_VK_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
                                              .descriptorType = i == PARAM_BINDING ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = KILN_VK_BINDINGS + 1,
                                                 .pBindings = b};
    if (vkCreateDescriptorSetLayout(vk->dev, &lci, NULL, &vk->set_layout) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a descriptor set layout", vk->name);
    const VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1, .pSetLayouts = &vk->set_layout};
    if (vkCreatePipelineLayout(vk->dev, &plci, NULL, &vk->pipe_layout) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot create a pipeline layout", vk->name);
    /* a slot: the parameters, then the indirect counts; a multiple of the uniform offset alignment */
    size_t ua = (size_t)vk->props.limits.minUniformBufferOffsetAlignment;
    if (ua < 16) ua = 16;
    vk->pstride = (KILN_VK_PUSH_BYTES + sizeof(VkDispatchIndirectCommand) + ua - 1) / ua * ua;
    if (vk->props.limits.maxUniformBufferRange < KILN_VK_PUSH_BYTES)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: uniform buffers of %u bytes are too small for a dispatch's %d bytes of parameters", vk->name,
                         vk->props.limits.maxUniformBufferRange, KILN_VK_PUSH_BYTES);
    int on;
    kiln_status est = env_switch("KILN_VK_REUSE", &on);
    if (est) return est;
    vk->reuse = on;
    /* subgroup arithmetic in compute shaders (Vulkan 1.1 properties): the sg* reductions */
    for (int i = 0; i < KILN_VK_SH_COUNT; i++) vk->variant[i] = (uint8_t)i;
    VkPhysicalDeviceSubgroupProperties sgp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sgp};
    if ((est = env_switch("KILN_VK_SUBGROUPS", &on)) != KILN_OK) return est;
    if (vk->props.apiVersion >= VK_API_VERSION_1_1 && on) {
        vkGetPhysicalDeviceProperties2(vk->phys, &p2);
        vk->subgroups = (sgp.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sgp.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                        sgp.subgroupSize >= 1 && sgp.subgroupSize <= 64;
    }
    if (vk->subgroups && vk->props.apiVersion >= VK_API_VERSION_1_3) {
        /* the sg* pipelines at the device's default size where it can be required; a device that
         * varies it without letting it be fixed keeps the portable tree sums */
        VkPhysicalDeviceVulkan13Properties p13 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_PROPERTIES};
        VkPhysicalDeviceProperties2 q2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &p13};
        vkGetPhysicalDeviceProperties2(vk->phys, &q2);
        const int varies = p13.minSubgroupSize != p13.maxSubgroupSize;
        if (vk->size_control && (p13.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && sgp.subgroupSize >= p13.minSubgroupSize &&
            sgp.subgroupSize <= p13.maxSubgroupSize)
            vk->sg_size = sgp.subgroupSize;
        else if (varies)
            vk->subgroups = 0;
    }
    for (int i = 0; vk->subgroups && i < KILN_VK_SH_COUNT; i++)
        for (int j = 0; j < KILN_VK_SH_COUNT; j++)
            if (strncmp(shader_names[j], "sg", 2) == 0 && strcmp(shader_names[j] + 2, shader_names[i]) == 0) vk->variant[i] = (uint8_t)j;
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
    pthread_mutex_init(&vk->prog_mu, NULL);
    kiln_status fst = parse_faults(vk);
    if (fst == KILN_OK && getenv("KILN_VK_UNMAPPED")) fst = env_switch("KILN_VK_UNMAPPED", &vk->unmapped); /* unset: 0 */
    if (fst) { free(vk); return fst; }
    kiln_status st = instance(&vk->instance);
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
        for (int i = 0; i < vk->n_progs; i++) program_free(vk, &vk->progs[i]);
        vk->n_progs = 0;
        kiln_vk_buf_destroy(vk, &vk->dummy);
        kiln_vk_buf_destroy(vk, &vk->upload_stage);
        for (int i = 0; i < vk->n_pchunks; i++) kiln_vk_buf_destroy(vk, &vk->pchunks[i]);
        free(vk->pchunks);
        if (vk->pipe_layout) vkDestroyPipelineLayout(vk->dev, vk->pipe_layout, NULL);
        if (vk->set_layout) vkDestroyDescriptorSetLayout(vk->dev, vk->set_layout, NULL);
        if (vk->fence) vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->qpool) vkDestroyQueryPool(vk->dev, vk->qpool, NULL);
        if (vk->cmd_pool) vkDestroyCommandPool(vk->dev, vk->cmd_pool, NULL);
        vkDestroyDevice(vk->dev, NULL);
    }
    free(vk->log);
    pthread_mutex_destroy(&vk->prog_mu);
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

static kiln_status buf_create(kiln_vk *vk, size_t bytes, int host_visible, VkBufferUsageFlags usage, kiln_vk_buf *b) {
    memset(b, 0, sizeof *b);
    if (bytes == 0) bytes = 4;
    const VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes,
                                    .usage = usage | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                             VK_BUFFER_USAGE_TRANSFER_DST_BIT | (vk->bda ? VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT : 0),
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
    if ((vk->memprops.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && !(host_visible == 0 && vk->unmapped)) {
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

kiln_status kiln_vk_buf_create(kiln_vk *vk, size_t bytes, int host_visible, kiln_vk_buf *b) { return buf_create(vk, bytes, host_visible, 0, b); }

int kiln_vk_mapped_vram(const kiln_vk *vk) {
    if (vk->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) return 0;
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    for (uint32_t i = 0; i < vk->memprops.memoryTypeCount; i++) {
        const VkMemoryType *t = &vk->memprops.memoryTypes[i];
        const VkMemoryHeap *h = &vk->memprops.memoryHeaps[t->heapIndex];
        if ((t->propertyFlags & want) == want && (h->flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && h->size >= ((VkDeviceSize)1 << 30)) return 1;
    }
    return 0;
}

int kiln_vk_is_cpu(const kiln_vk *vk) { return vk->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU; }
int kiln_vk_has_bda(const kiln_vk *vk) { return vk->bda; }
int kiln_vk_subgroups(const kiln_vk *vk) { return vk->subgroups; }
int kiln_vk_has_f64(const kiln_vk *vk) { return vk->f64; }
uint64_t kiln_vk_submits(const kiln_vk *vk) { return vk->submits; }

uint64_t kiln_vk_buf_address(kiln_vk *vk, const kiln_vk_buf *b) {
    if (!vk->bda || !b->buf) return 0;
    const VkBufferDeviceAddressInfo ai = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = b->buf};
    return (uint64_t)vkGetBufferDeviceAddress(vk->dev, &ai);
}

void kiln_vk_buf_destroy(kiln_vk *vk, kiln_vk_buf *b) {
    if (b->buf) { /* the programs that bind it can never run again (a new buffer may get its handle) */
        pthread_mutex_lock(&vk->prog_mu);
        for (int i = 0; i < vk->n_progs; i++)
            for (int j = 0; j < vk->progs[i].n_bufs && !vk->progs[i].dead; j++)
                if (vk->progs[i].bufs[j] == b->buf) vk->progs[i].dead = 1;
        pthread_mutex_unlock(&vk->prog_mu);
    }
    if (b->map) vkUnmapMemory(vk->dev, b->mem);
    if (b->buf) vkDestroyBuffer(vk->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(vk->dev, b->mem, NULL);
    memset(b, 0, sizeof *b);
}

/* The one-time command buffer of a staged upload's copy. */
static kiln_status begin(kiln_vk *vk) {
    if (vk->recording) return KILN_OK;
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (vkBeginCommandBuffer(vk->cmd, &bi) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot begin a command buffer", vk->name);
    vk->recording = 1;
    vk->recorded = 0;
    return KILN_OK;
}

/* Reads the stamps of the command buffer that just completed into the per-shader totals. */
static void read_stamps(kiln_vk *vk) {
    const uint32_t nq = vk->n_q;
    vk->n_q = 0;
    if (!vk->qpool || nq < 2) return;
    uint64_t t[PROF_QUERIES];
    if (vkGetQueryPoolResults(vk->dev, vk->qpool, 0, nq, sizeof t, t, sizeof t[0], VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    for (uint32_t i = 1; i < nq; i++) {
        vk->prof_ns[vk->q_shader[i]] += (uint64_t)((double)(t[i] - t[i - 1]) * vk->ts_ns);
        vk->prof_n[vk->q_shader[i]]++;
    }
}

int kiln_vk_profile(const kiln_vk *vk, uint64_t ns[KILN_VK_SH_COUNT], uint64_t n[KILN_VK_SH_COUNT], const char **names) {
    for (int i = 0; i < KILN_VK_SH_COUNT; i++) {
        ns[i] = vk->prof_ns[i];
        n[i] = vk->prof_n[i];
        names[i] = shader_names[i];
    }
    return vk->qpool != VK_NULL_HANDLE;
}

/* Staging pieces of at most 64 MiB: a weight larger than that is copied in several (one staging
 * buffer for the whole load instead of an allocation per weight: a checkpoint has thousands). */
#define UPLOAD_STAGE_MAX ((size_t)64 << 20)

kiln_status kiln_vk_upload(kiln_vk *vk, kiln_vk_buf *b, size_t offset, const void *src, size_t bytes) {
    if (b->map) {
        memcpy(b->map + offset, src, bytes);
        return KILN_OK;
    }
    kiln_status st = kiln_vk_flush(vk);
    if (st) return st;
    const size_t piece = bytes < UPLOAD_STAGE_MAX ? bytes : UPLOAD_STAGE_MAX;
    if (vk->upload_stage.size < piece) {
        kiln_vk_buf_destroy(vk, &vk->upload_stage);
        size_t cap = 1 << 20;
        while (cap < piece) cap *= 2;
        if (cap > UPLOAD_STAGE_MAX) cap = UPLOAD_STAGE_MAX;
        st = kiln_vk_buf_create(vk, cap, 1, &vk->upload_stage);
        if (st == KILN_OK && !vk->upload_stage.map) st = kiln_fail(KILN_ERR_INTERNAL, "%s: the upload staging buffer is not mapped", vk->name);
        if (st) { kiln_vk_buf_destroy(vk, &vk->upload_stage); return st; }
    }
    for (size_t done = 0; done < bytes && st == KILN_OK; done += piece) {
        const size_t n = bytes - done < piece ? bytes - done : piece;
        memcpy(vk->upload_stage.map, (const uint8_t *)src + done, n);
        st = begin(vk);
        if (st == KILN_OK) {
            const VkBufferCopy region = {.srcOffset = 0, .dstOffset = offset + done, .size = n};
            vkCmdCopyBuffer(vk->cmd, vk->upload_stage.buf, b->buf, 1, &region);
            vk->recorded = 1;
            st = kiln_vk_flush(vk); /* the staging buffer is written again by the next piece */
        }
    }
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
    const VkShaderModuleCreateInfo mci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                          .codeSize = (size_t)(end[s] - (const uint8_t *)code[s]), .pCode = code[s]};
    VkShaderModule mod;
    if (vkCreateShaderModule(vk->dev, &mci, NULL, &mod) != VK_SUCCESS)
        return kiln_fail(KILN_ERR_INTERNAL, "%s: shader %s: cannot create the module", vk->name, shader_names[s]);
    /* the sg* shaders (workgroups of 64) at one required subgroup size, in full subgroups */
    const int sized = vk->sg_size && strncmp(shader_names[s], "sg", 2) == 0;
    const VkPipelineShaderStageRequiredSubgroupSizeCreateInfo rss = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO,
                                                                      .requiredSubgroupSize = vk->sg_size};
    const VkComputePipelineCreateInfo cpci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .pNext = sized ? &rss : NULL,
                  .flags = sized && vk->full_subgroups ? VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT : 0,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = mod, .pName = "main"},
        .layout = vk->pipe_layout};
    VkResult r = vkCreateComputePipelines(vk->dev, VK_NULL_HANDLE, 1, &cpci, NULL, &vk->pipes[s]);
    vkDestroyShaderModule(vk->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        vk->pipes[s] = VK_NULL_HANDLE;
        return kiln_fail(KILN_ERR_INTERNAL, "%s: shader %s: cannot create the pipeline: %s", vk->name, shader_names[s], vk_result_name(r));
    }
    *out = vk->pipes[s];
    return KILN_OK;
}

/* The chunk of the parameter buffer holding slot k, added when first needed; NULL when the device
 * gives no memory for it. */
static kiln_vk_buf *param_chunk(kiln_vk *vk, int k) {
    const int c = k / SLOTS_PER_CHUNK;
    if (c < vk->n_pchunks) return &vk->pchunks[c];
    kiln_vk_buf *grown = realloc(vk->pchunks, (size_t)(c + 1) * sizeof *grown);
    if (!grown) return NULL;
    vk->pchunks = grown;
    /* mapped device-local memory where the device has it (the shaders read every slot each step;
     * the host only writes them), else host memory */
    if (buf_create(vk, SLOTS_PER_CHUNK * vk->pstride, KILN_VK_MEM_MAPPED_NEAR, VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT,
                   &vk->pchunks[c]) != KILN_OK || !vk->pchunks[c].map) {
        kiln_vk_buf_destroy(vk, &vk->pchunks[c]);
        return NULL;
    }
    vk->n_pchunks = c + 1;
    return &vk->pchunks[c];
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t entry_hash(uint64_t h, const vk_entry *e) { /* FNV-1a over the entry's 64-bit words */
    uint64_t w[sizeof *e / 8];
    memcpy(w, e, sizeof w);
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h;
}

void kiln_vk_next_independent(kiln_vk *vk) { vk->next_independent = 1; }

kiln_status kiln_vk_dispatch(kiln_vk *vk, kiln_vk_shader shader, const kiln_vk_bind *binds, int n_bind, const void *push, size_t push_bytes,
                             uint32_t gx, uint32_t gy, uint32_t gz) {
    if (gx == 0 || gy == 0 || gz == 0) return KILN_OK;
    VkPipeline pipe = VK_NULL_HANDLE;
    kiln_status st = KILN_ERR_INTERNAL;
    if (vk->variant[shader] != shader) { /* the subgroup variant; a driver that refuses one gets the portable shaders from then on */
        st = pipeline(vk, (kiln_vk_shader)vk->variant[shader], &pipe);
        if (st == KILN_OK) shader = (kiln_vk_shader)vk->variant[shader];
        else { /* all of them: the one-entry and tile matmuls of a token must stay alike (same floats) */
            fprintf(stderr, "kiln: %s: the subgroup variant %s was refused (%s); the portable shaders run from now on\n", vk->name,
                    shader_names[vk->variant[shader]], kiln_last_error());
            for (int i = 0; i < KILN_VK_SH_COUNT; i++) vk->variant[i] = (uint8_t)i;
            vk->subgroups = 0;
        }
    }
    if (st != KILN_OK) st = pipeline(vk, shader, &pipe); /* made now, so that a shader the driver refuses fails its op */
    if (st) return st;
    const uint64_t t0 = now_ns();
    if (vk->n_log == vk->cap_log) {
        const int cap = vk->cap_log ? 2 * vk->cap_log : 256;
        vk_entry *grown = realloc(vk->log, (size_t)cap * sizeof *grown);
        if (!grown) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory for the step's dispatch log", vk->name);
        vk->log = grown;
        vk->cap_log = cap;
    }
    const int k = vk->n_log;
    kiln_vk_buf *chunk = param_chunk(vk, k);
    if (!chunk) return kiln_fail(KILN_ERR_NOMEM, "%s: cannot allocate the parameter buffer of dispatch %d", vk->name, k);
    uint8_t *slot = chunk->map + (size_t)(k % SLOTS_PER_CHUNK) * vk->pstride;
    memset(slot, 0, KILN_VK_PUSH_BYTES);
    memcpy(slot, push, push_bytes < KILN_VK_PUSH_BYTES ? push_bytes : KILN_VK_PUSH_BYTES);
    const VkDispatchIndirectCommand groups = {gx, gy, gz};
    memcpy(slot + KILN_VK_PUSH_BYTES, &groups, sizeof groups);
    vk_entry *e = &vk->log[k];
    memset(e, 0, sizeof *e);
    e->shader = (uint32_t)shader;
    e->independent = k > 0 && vk->next_independent;
    vk->n_independent += e->independent;
    vk->next_independent = 0;
    for (int i = 0; i < KILN_VK_BINDINGS; i++) e->b[i] = i < n_bind ? binds[i] : (kiln_vk_bind){vk->dummy.buf, 0, VK_WHOLE_SIZE};
    vk->log_key = entry_hash(k ? vk->log_key : 0xcbf29ce484222325ull, e);
    vk->n_log++;
    vk->prep_ns += now_ns() - t0;
    return KILN_OK;
}

static void program_free(kiln_vk *vk, vk_program *pg) {
    if (pg->cmd) vkFreeCommandBuffers(vk->dev, vk->cmd_pool, 1, &pg->cmd);
    if (pg->pool) vkDestroyDescriptorPool(vk->dev, pg->pool, NULL);
    free(pg->e);
    free(pg->bufs);
    memset(pg, 0, sizeof *pg);
}

static int cmp_handle(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t) * (const VkBuffer *)a, y = (uintptr_t) * (const VkBuffer *)b;
    return x < y ? -1 : x > y;
}

/* Records the log as a program: a descriptor set per dispatch (its bindings and its parameter
 * slot), each dispatch indirect from its slot's counts, a barrier after each. */
static kiln_status program_record(kiln_vk *vk, vk_program *pg) {
    const int n = vk->n_log;
    memset(pg, 0, sizeof *pg);
    pg->e = malloc((size_t)n * sizeof *pg->e);
    pg->bufs = malloc((size_t)n * (KILN_VK_BINDINGS + 1) * sizeof *pg->bufs);
    VkDescriptorSet *sets = malloc((size_t)n * sizeof *sets);
    if (!pg->e || !pg->bufs || !sets) { free(sets); program_free(vk, pg); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    memcpy(pg->e, vk->log, (size_t)n * sizeof *pg->e);
    pg->n = n;
    pg->key = vk->log_key;
    int nb = 0; /* the distinct buffers: sorted, then unique */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < KILN_VK_BINDINGS; i++) pg->bufs[nb++] = pg->e[k].b[i].buf;
    qsort(pg->bufs, (size_t)nb, sizeof *pg->bufs, cmp_handle);
    for (int j = 0; j < nb; j++)
        if (pg->n_bufs == 0 || pg->bufs[pg->n_bufs - 1] != pg->bufs[j]) pg->bufs[pg->n_bufs++] = pg->bufs[j];
    const VkDescriptorPoolSize ps[2] = {{.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = (uint32_t)n * KILN_VK_BINDINGS},
                                        {.type = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, .descriptorCount = (uint32_t)n}};
    const VkDescriptorPoolCreateInfo dpci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = (uint32_t)n, .poolSizeCount = 2,
                                             .pPoolSizes = ps};
    const VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = vk->cmd_pool,
                                            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (vkCreateDescriptorPool(vk->dev, &dpci, NULL, &pg->pool) != VK_SUCCESS || vkAllocateCommandBuffers(vk->dev, &ai, &pg->cmd) != VK_SUCCESS) {
        free(sets);
        program_free(vk, pg);
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot allocate a step of %d dispatches (descriptor pool or command buffer)", vk->name, n);
    }
    for (int k = 0; k < n; k++) {
        const VkDescriptorSetAllocateInfo dai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = pg->pool,
                                                 .descriptorSetCount = 1, .pSetLayouts = &vk->set_layout};
        if (vkAllocateDescriptorSets(vk->dev, &dai, &sets[k]) != VK_SUCCESS) {
            free(sets);
            program_free(vk, pg);
            return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot allocate a descriptor set", vk->name);
        }
        VkDescriptorBufferInfo bi[KILN_VK_BINDINGS + 1];
        VkWriteDescriptorSet wr[KILN_VK_BINDINGS + 1];
        for (int i = 0; i < KILN_VK_BINDINGS; i++) bi[i] = (VkDescriptorBufferInfo){pg->e[k].b[i].buf, pg->e[k].b[i].offset, pg->e[k].b[i].range};
        bi[PARAM_BINDING] = (VkDescriptorBufferInfo){vk->pchunks[k / SLOTS_PER_CHUNK].buf, (VkDeviceSize)(k % SLOTS_PER_CHUNK) * vk->pstride,
                                                     KILN_VK_PUSH_BYTES};
        for (int i = 0; i <= KILN_VK_BINDINGS; i++)
            wr[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = sets[k], .dstBinding = (uint32_t)i,
                                           .descriptorCount = 1,
                                           .descriptorType = i == PARAM_BINDING ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &bi[i]};
        vkUpdateDescriptorSets(vk->dev, KILN_VK_BINDINGS + 1, wr, 0, NULL);
    }
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (vkBeginCommandBuffer(pg->cmd, &bi) != VK_SUCCESS) {
        free(sets);
        program_free(vk, pg);
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot begin a command buffer", vk->name);
    }
    uint32_t nq = 0; /* timestamps recorded (vk->n_q once the command buffer is complete) */
    if (vk->qpool) {
        vkCmdResetQueryPool(pg->cmd, vk->qpool, 0, PROF_QUERIES);
        vkCmdWriteTimestamp(pg->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, vk->qpool, 0);
        nq = 1;
    }
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT};
    for (int k = 0; k < n; k++) {
        if (k == 0 || pg->e[k].shader != pg->e[k - 1].shader)
            vkCmdBindPipeline(pg->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->pipes[pg->e[k].shader]);
        vkCmdBindDescriptorSets(pg->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->pipe_layout, 0, 1, &sets[k], 0, NULL);
        vkCmdDispatchIndirect(pg->cmd, vk->pchunks[k / SLOTS_PER_CHUNK].buf, (VkDeviceSize)(k % SLOTS_PER_CHUNK) * vk->pstride + KILN_VK_PUSH_BYTES);
        /* the barrier after k, unless k + 1 is independent of it: then k + 1's barrier covers both
         * (its first scope is every command before it), and the GPU may run the two at once */
        if (k + 1 < n && pg->e[k + 1].independent) {
            if (vk->qpool && nq < PROF_QUERIES) {
                vkCmdWriteTimestamp(pg->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->qpool, nq);
                vk->q_shader[nq++] = (uint8_t)pg->e[k].shader;
            }
            continue;
        }
        vkCmdPipelineBarrier(pg->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        if (vk->qpool && nq < PROF_QUERIES) {
            vkCmdWriteTimestamp(pg->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->qpool, nq);
            vk->q_shader[nq++] = (uint8_t)pg->e[k].shader;
        }
    }
    free(sets);
    if (vkEndCommandBuffer(pg->cmd) != VK_SUCCESS) {
        program_free(vk, pg);
        return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot end the command buffer", vk->name);
    }
    vk->n_q = nq;
    return KILN_OK;
}

/* Submits cmd and waits; a failure marks the device dead. */
static kiln_status submit_wait(kiln_vk *vk, VkCommandBuffer cmd) {
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
    VkResult r = ++vk->submits >= vk->lost_at && vk->lost_at ? VK_ERROR_DEVICE_LOST : vkQueueSubmit(vk->queue, 1, &si, vk->fence);
    if (r == VK_SUCCESS) r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
    vkResetFences(vk->dev, 1, &vk->fence);
    if (r != VK_SUCCESS) {
        vk->dead = 1;
        return kiln_fail(KILN_ERR_INTERNAL, "%s: submit failed: %s", vk->name, vk_result_name(r));
    }
    read_stamps(vk);
    return KILN_OK;
}

/* Runs the log: the program recorded for the same dispatches and bindings, else a new one. Only
 * this (the computing) thread records, frees or submits programs; another thread may only mark one
 * dead (kiln_vk_buf_destroy), under prog_mu. */
static kiln_status run_log(kiln_vk *vk) {
    const uint64_t t0 = now_ns();
    vk->flushes++;
    pthread_mutex_lock(&vk->prog_mu);
    for (int i = 0; i < vk->n_progs;) /* programs a destroyed buffer made unusable */
        if (vk->progs[i].dead) {
            program_free(vk, &vk->progs[i]);
            vk->progs[i] = vk->progs[--vk->n_progs];
        } else i++;
    vk_program *pg = NULL;
    for (int i = 0; i < vk->n_progs && !pg; i++)
        if (vk->progs[i].n == vk->n_log && vk->progs[i].key == vk->log_key && memcmp(vk->progs[i].e, vk->log, (size_t)vk->n_log * sizeof *vk->log) == 0)
            pg = &vk->progs[i];
    kiln_status st = KILN_OK;
    vk_program fresh;
    if (pg) vk->reused_programs++;
    else {
        st = program_record(vk, &fresh);
        if (st != KILN_OK && vk->n_progs > 0) { /* descriptor or command memory held by kept programs: drop them all, once */
            for (int i = 0; i < vk->n_progs; i++) program_free(vk, &vk->progs[i]);
            vk->n_progs = 0;
            st = program_record(vk, &fresh);
        }
        if (st == KILN_OK) {
            vk->recorded_programs++;
            if (!vk->reuse || vk->qpool) pg = &fresh; /* submitted once, then freed */
            else {
                if (vk->n_progs == PROGRAMS) { /* the least recently used makes room */
                    int lru = 0;
                    for (int i = 1; i < vk->n_progs; i++)
                        if (vk->progs[i].used < vk->progs[lru].used) lru = i;
                    program_free(vk, &vk->progs[lru]);
                    vk->progs[lru] = vk->progs[--vk->n_progs];
                }
                vk->progs[vk->n_progs] = fresh;
                pg = &vk->progs[vk->n_progs++];
            }
        }
    }
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    if (st == KILN_OK) {
        pg->used = vk->flushes;
        cmd = pg->cmd;
    }
    /* the submit and its wait outside the lock: a buffer freed on another thread meanwhile only
     * marks programs dead (freed at the next flush, here) */
    pthread_mutex_unlock(&vk->prog_mu);
    vk->prep_ns += now_ns() - t0;
    if (st == KILN_OK) st = submit_wait(vk, cmd);
    if (pg == &fresh) program_free(vk, &fresh);
    vk->n_log = 0;
    return st;
}

kiln_status kiln_vk_flush(kiln_vk *vk) {
    if (vk->dead) {
        kiln_vk_discard(vk);
        return kiln_fail(KILN_ERR_INTERNAL, "%s: the device failed earlier (device lost)", vk->name);
    }
    kiln_status st = vk->n_log ? run_log(vk) : KILN_OK;
    if (!vk->recording) return st;
    vk->recording = 0; /* a one-time copy (kiln_vk_upload) */
    if (vkEndCommandBuffer(vk->cmd) != VK_SUCCESS) return kiln_fail(KILN_ERR_INTERNAL, "%s: cannot end the command buffer", vk->name);
    if (st == KILN_OK && vk->recorded) st = submit_wait(vk, vk->cmd);
    vkResetCommandBuffer(vk->cmd, 0);
    vk->recorded = 0;
    return st;
}

void kiln_vk_discard(kiln_vk *vk) {
    vk->n_log = 0;
    if (!vk->recording) return;
    vk->recording = 0;
    vkEndCommandBuffer(vk->cmd);
    vkResetCommandBuffer(vk->cmd, 0);
    vk->recorded = 0;
}

uint64_t kiln_vk_independent_dispatches(const kiln_vk *vk) { return vk->n_independent; }

void kiln_vk_program_stats(const kiln_vk *vk, uint64_t *recorded, uint64_t *reused, uint64_t *prep_ns) {
    *recorded = vk->recorded_programs;
    *reused = vk->reused_programs;
    if (prep_ns) *prep_ns = vk->prep_ns;
}
