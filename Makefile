# kiln — plain GNU Makefile.
#   make            release build: ./kiln and build/libkiln.a
#   make test       unit + kernel + model + integrity + server tests (scripts/run_tests.sh)
#   make check      the C tests under ASan + UBSan
#   make bench      benchmarks (never part of make test)
# SIMD kernels live in files named *_avx2.c / *_avxvnni.c / *_avx512.c, compiled with those ISA flags only; the
# code in them runs only when kiln_kernels_select() has seen the CPU support it at run time.
MAKEFLAGS += -j$(shell nproc)
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
# AMX (src/kernels/q16_amx_avx512.c) is inline assembly: an assembler older than binutils 2.36 does
# not know the tile instructions, and kiln then builds without the AMX path (KILN_NO_AMX_ASM: the
# vpdpbusd GEMMs everywhere) rather than failing.
HAVE_AMX_AS := $(shell printf 'tilerelease\n' | $(CC) -x assembler -c -o /dev/null - 2>/dev/null && echo 1)
CFLAGS_AMX  := $(if $(HAVE_AMX_AS),,-DKILN_NO_AMX_ASM)
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -Isrc -Itools -fopenmp -g $(OPT) \
              $(shell pkg-config --cflags jansson libpcre2-8 icu-uc 2>/dev/null) $(CFLAGS_VK) $(CFLAGS_MPI) $(CFLAGS_AMX)
LIBS    = -fopenmp -lmvec -lm -lpthread $(shell pkg-config --libs jansson libpcre2-8 libmicrohttpd icu-uc 2>/dev/null) -lxxhash $(LIBS_VK) $(LIBS_MPI)
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16

SRCS     := $(shell find src -name '*.c' | sort)

# The vulkan backend (src/backend/vulkan/, docs/VULKAN.md) when the Vulkan headers and loader
# (libvulkan-dev, headers 1.3 or later: Vulkan 1.3 structures) and glslc are installed; otherwise
# vk_absent.c, whose calls say how to get it.
# Shaders: GLSL compiled to SPIR-V at build time, embedded by $(BUILD)/vk_spirv.S (.incbin); the
# matmul shader once per weight format (-DFMT=N, N as in matmul.comp).
HAVE_VULKAN := $(shell pkg-config --atleast-version=1.3 vulkan 2>/dev/null && command -v glslc >/dev/null 2>&1 && echo 1)
VK_DIR       := src/backend/vulkan
VK_MATMULS   := f32:0 f16:1 bf16:2 fp8:3 int4:4 q8_0:5 q4_0:6 q4_k:7 q5_k:8 q6_k:9 q2_k:10 q3_k:11 iq4_xs:12 q4_1:13 q5_0:14 q5_1:15 iq4_nl:16
VK_PLAIN     := rmsnorm add add_bias swiglu swiglu_rows rope kv_merge membw moe_combine copy_rows moe_route moe_sort layernorm fp8_round kv_topk
# DeepSeek sparse attention's KV-page shaders: Vulkan 1.2 SPIR-V (buffer device addresses)
VK_PLAIN12   := kv_store_dsa kv_index kv_attend_sparse
# what the shaders #include
VK_INC       := $(wildcard $(VK_DIR)/shaders/*.glsl)
# attention over KV pages and the KV store, once per stored dtype (-DDT=N); Vulkan 1.2 SPIR-V
# (buffer device addresses)
VK_ATTENDS   := f32:0 bf16:1 fp8:2
VK_SPVS      := $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/matmul_$(word 1,$(subst :, ,$(m))).spv) $(VK_PLAIN:%=$(BUILD)/shaders/%.spv) \
                $(VK_PLAIN12:%=$(BUILD)/shaders/%.spv) \
                $(foreach m,$(VK_ATTENDS),$(BUILD)/shaders/kv_attend_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_ATTENDS),$(BUILD)/shaders/kv_store_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/matmul_id_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/matmul8_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/sgmatmul_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/sgmatmul_id_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/sgmatmul8_$(word 1,$(subst :, ,$(m))).spv) $(BUILD)/shaders/sgrmsnorm.spv $(BUILD)/shaders/layernorm64.spv \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/matmul8_id_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/sgmatmul8_id_$(word 1,$(subst :, ,$(m))).spv) \
                $(BUILD)/shaders/matmul4r_int4.spv $(BUILD)/shaders/sgmatmul4r_int4.spv \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/matmul_pair_$(word 1,$(subst :, ,$(m))).spv) \
                $(foreach m,$(VK_MATMULS),$(BUILD)/shaders/sgmatmul_pair_$(word 1,$(subst :, ,$(m))).spv)
ifeq ($(HAVE_VULKAN),1)
SRCS     := $(filter-out $(VK_DIR)/vk_absent.c,$(SRCS))
VK_OBJS  := $(BUILD)/vk_spirv.o
CFLAGS_VK := $(shell pkg-config --cflags vulkan)
LIBS_VK  := -ldl # the loader is opened at run time (vk_device.c), not linked
else
$(info kiln: building without the vulkan backend (libvulkan-dev 1.3+ or glslc missing): cpu and ref backends only)
SRCS     := $(filter-out $(VK_DIR)/vk_device.c $(VK_DIR)/backend_vulkan.c $(VK_DIR)/vk_attend.c $(VK_DIR)/vk_moe.c $(VK_DIR)/vk_dsa.c,$(SRCS))
VK_OBJS  :=
endif
# Scale-out over MPI (src/dist/, docs/SCALE.md) when Open MPI's headers are there (libopenmpi-dev);
# otherwise dist_absent.c, whose --tp says how to get it.
HAVE_MPI := $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1)
ifeq ($(HAVE_MPI),1)
SRCS     := $(filter-out src/dist/dist_absent.c,$(SRCS))
CFLAGS_MPI := $(shell pkg-config --cflags ompi-c)
LIBS_MPI := $(shell pkg-config --libs ompi-c)
else
$(info kiln: building without MPI (libopenmpi-dev missing): --tp needs it)
SRCS     := $(filter-out src/dist/dist_mpi.c,$(SRCS))
endif
OBJS     := $(SRCS:%.c=$(BUILD)/%.o) $(VK_OBJS)
TOOL_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/*.c)))
TEST_SRCS := $(shell find tests/unit tests/kernels tests/ops tests/models tests/integrity -name 'test_*.c' 2>/dev/null | sort)
TEST_BINS := $(TEST_SRCS:%.c=$(BUILD)/%)

KILN_BIN ?= kiln

all: $(KILN_BIN)

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) $(EXTRA_CFLAGS) $(ISA_EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avxvnni.o: %_avxvnni.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) -mavxvnni $(EXTRA_CFLAGS) $(ISA_EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX512_FLAGS) $(EXTRA_CFLAGS) $(ISA_EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@

# subgroup variants (-DSG: reductions by subgroup arithmetic), chosen at run time where the device
# has it (vk_device.c); the portable tree-sum shaders stay for the rest
# gate, up and SwiGLU in one dispatch (-DPAIR, one token per workgroup: decode; weights through
# device addresses)
$(BUILD)/shaders/sgmatmul_pair_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DSG -DPAIR -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/matmul_pair_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DPAIR -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/sgmatmul8_id_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DSG -DBYID -DTT8 -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/sgmatmul_id_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DSG -DBYID -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/sgmatmul8_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DSG -DTT8 -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/sgmatmul_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DSG -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
# INT4 decode with 4 weight rows per workgroup (-DROWS4: X loaded once for the 4; KILN_VK_GEMV_ROWS=4)
$(BUILD)/shaders/sgmatmul4r_int4.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DSG -DROWS4 -DFMT=4 $< -o $@
$(BUILD)/shaders/matmul4r_int4.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DROWS4 -DFMT=4 $< -o $@
$(BUILD)/shaders/layernorm64.spv: $(VK_DIR)/shaders/layernorm.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DF64 $< -o $@
$(BUILD)/shaders/sgrmsnorm.spv: $(VK_DIR)/shaders/rmsnorm.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DSG $< -o $@
# the MoE experts' matmul over the device's routing (-DBYID: weights through device addresses),
# and over expert-sorted tiles of 8 entries (-DBYID -DTT8: prefill chunks)
$(BUILD)/shaders/matmul8_id_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DBYID -DTT8 -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/matmul_id_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DBYID -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
# ... and with 8 tokens per workgroup (-DTT8) for n >= 4
$(BUILD)/shaders/matmul8_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DTT8 -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/matmul_%.spv: $(VK_DIR)/shaders/matmul.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 -DFMT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_MATMULS)))) $< -o $@
$(BUILD)/shaders/kv_attend_%.spv: $(VK_DIR)/shaders/kv_attend.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DDT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_ATTENDS)))) $< -o $@
$(BUILD)/shaders/kv_store_%.spv: $(VK_DIR)/shaders/kv_store.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 -DDT=$(word 2,$(subst :, ,$(filter $*:%,$(VK_ATTENDS)))) $< -o $@
$(VK_PLAIN12:%=$(BUILD)/shaders/%.spv): $(BUILD)/shaders/%.spv: $(VK_DIR)/shaders/%.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.2 $< -o $@
$(BUILD)/shaders/%.spv: $(VK_DIR)/shaders/%.comp $(VK_INC)
	@mkdir -p $(dir $@)
	glslc -O --target-env=vulkan1.1 $< -o $@
# kiln_spv_NAME .. kiln_spv_NAME_end for each shader (vk_device.h: KILN_VK_SHADERS)
$(BUILD)/vk_spirv.S: $(VK_SPVS) Makefile
	@mkdir -p $(dir $@)
	@{ printf '/* generated by the Makefile: the SPIR-V of src/backend/vulkan/shaders */\n.section .rodata\n'; \
	  for f in $(VK_SPVS); do n=$$(basename $$f .spv); \
	    printf '.balign 4\n.global kiln_spv_%s\n.global kiln_spv_%s_end\nkiln_spv_%s:\n.incbin "%s"\nkiln_spv_%s_end:\n' $$n $$n $$n $$f $$n; done; \
	  printf '.section .note.GNU-stack,"",@progbits\n'; } > $@
$(BUILD)/vk_spirv.o: $(BUILD)/vk_spirv.S
	$(CC) -c $< -o $@

$(BUILD)/libkiln.a: $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(KILN_BIN): $(TOOL_OBJS) $(BUILD)/libkiln.a
	$(CC) $(EXTRA_LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libkiln.a
	$(CC) $(EXTRA_LDFLAGS) -o $@ $^ $(LIBS) -lcmocka

tests: $(TEST_BINS)

test: $(KILN_BIN) tests
	BUILD=$(BUILD) KILN=$(KILN_BIN) bash scripts/run_tests.sh

# Sanitizer build in its own tree; runs the C unit/kernel tests and the CLI bad-input tests.
check:
	$(MAKE) BUILD=build/asan OPT=-O1 EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	        EXTRA_LDFLAGS="-fsanitize=address,undefined" KILN_BIN=build/asan/kiln build/asan/kiln tests
	BUILD=build/asan KILN=build/asan/kiln KILN_CHECK=1 bash scripts/run_tests.sh

bench: $(KILN_BIN)
	bash scripts/bench.sh

clean:
	rm -rf build kiln

.PHONY: all test tests check bench clean

# ---- fuzzing (tests/fuzz/, docs/RELIABILITY.md) ----------------------------------------------------
#   make fuzz          the libFuzzer targets (clang -fsanitize=fuzzer,address,undefined, in build/fuzz),
#                      each run FUZZ_SECONDS (default 600), FUZZ_JOBS at a time (default: the CPU count)
#   make fuzz-build    only build them
#   make tests         also builds the same targets with tests/fuzz/driver_main.c (replay binaries,
#                      $(BUILD)/tests/fuzz/fuzz_*), which tests/fuzz/test_fuzz_replay.sh runs on the corpora
FUZZ_TARGETS := gguf safetensors hf llama2c tokenizer encode chat_template openai kv_scales eval
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build/fuzz
FUZZ_SECONDS ?= 600
FUZZ_JOBS    ?= $(shell nproc)
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_REPLAY_BINS := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/fuzz_%)
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)

tests: $(FUZZ_REPLAY_BINS)
$(BUILD)/tests/fuzz/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/tests/fuzz/driver_main.o $(BUILD)/libkiln.a
	$(CC) $(EXTRA_LDFLAGS) -o $@ $^ $(LIBS)
# libFuzzer binaries: linked in a sub-make whose BUILD is $(FUZZ_BUILD) (library and objects built
# by the rules above with clang and the fuzzer's coverage instrumentation)
$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/tests/fuzz/fuzz_%.o $(FUZZ_BUILD)/libkiln.a
	$(CC) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(LIBS)
# ISA_EXTRA_CFLAGS: the SIMD kernel files of the libFuzzer build carry no sanitizer and no coverage
# instrumentation: no fuzz target reaches them (the targets are parsers), and clang's instrumented
# compile of their fully unrolled intrinsic code dominated the build — gemv_avx512.c alone took 164 s
# at -O1 with ASan (more than 11 minutes with UBSan too) against 13 s uninstrumented (2026-12-04,
# 2 cores; the short libFuzzer run of make test builds this tree, tests/fuzz/test_fuzz_replay.sh).
# Their index arithmetic keeps ASan + UBSan in `make check` (gcc), and the scalar reference kernels
# are instrumented in both.
fuzz-build:
	$(MAKE) CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) OPT="-O1 -gline-tables-only" \
	        EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" ISA_EXTRA_CFLAGS="-fno-sanitize=all" $(FUZZ_BINS)
fuzz: fuzz-build $(KILN_BIN)
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) KILN=$(KILN_BIN) \
	        bash tests/fuzz/run_fuzz.sh $(FUZZ_TARGETS)
.PHONY: fuzz fuzz-build
.PRECIOUS: $(FUZZ_BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/%.o
-include $(FUZZ_REPLAY_BINS:=.d) $(BUILD)/tests/fuzz/driver_main.d $(FUZZ_BINS:$(FUZZ_BUILD)/%=$(FUZZ_BUILD)/tests/fuzz/%.d)
-include $(OBJS:.o=.d) $(TEST_BINS:=.d) $(TOOL_OBJS:.o=.d)
