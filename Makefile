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
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude -Isrc -Itools -fopenmp -g $(OPT) \
              $(shell pkg-config --cflags jansson libpcre2-8 icu-uc 2>/dev/null)
LIBS    = -fopenmp -lmvec -lm -lpthread $(shell pkg-config --libs jansson libpcre2-8 libmicrohttpd icu-uc 2>/dev/null) -lxxhash
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16

SRCS     := $(shell find src -name '*.c' | sort)
OBJS     := $(SRCS:%.c=$(BUILD)/%.o)
TOOL_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/*.c)))
TEST_SRCS := $(shell find tests/unit tests/kernels tests/ops tests/models tests/integrity -name 'test_*.c' 2>/dev/null | sort)
TEST_BINS := $(TEST_SRCS:%.c=$(BUILD)/%)

KILN_BIN ?= kiln

all: $(KILN_BIN)

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avxvnni.o: %_avxvnni.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX2_FLAGS) -mavxvnni $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(AVX512_FLAGS) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@

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
FUZZ_TARGETS := gguf safetensors hf llama2c tokenizer encode chat_template openai
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
fuzz-build:
	$(MAKE) CC=$(FUZZ_CC) BUILD=$(FUZZ_BUILD) OPT="-O1 -gline-tables-only" \
	        EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" $(FUZZ_BINS)
fuzz: fuzz-build $(KILN_BIN)
	FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) KILN=$(KILN_BIN) \
	        bash tests/fuzz/run_fuzz.sh $(FUZZ_TARGETS)
.PHONY: fuzz fuzz-build
.PRECIOUS: $(FUZZ_BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/%.o
-include $(FUZZ_REPLAY_BINS:=.d) $(BUILD)/tests/fuzz/driver_main.d $(FUZZ_BINS:$(FUZZ_BUILD)/%=$(FUZZ_BUILD)/tests/fuzz/%.d)
-include $(OBJS:.o=.d) $(TEST_BINS:=.d) $(TOOL_OBJS:.o=.d)
