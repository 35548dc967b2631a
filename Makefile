# rn: ResNet training and testing as small Unix tools.
#   make            build librn and every tool into build/bin/
#   make test       install what the tests need (Debian, as root), build, run every test
#   make demo       the main job on an embedded default
#   make deps       install the Debian packages the build and tests need
#   make fuzz       libFuzzer+ASan+UBSan on every parser, FUZZ_SECONDS (60) each (clang, build-fuzz/)
#   make check-aarch64  the tools built for aarch64, run under qemu: the same bytes as here
# Options: USE_CUDA=auto|0|1 (default: auto, detected), CUDA_ARCH="80 90", CUDA=/usr/local/cuda,
#          USE_PNG=auto|0|1, USE_WEBP=auto|0|1 (PNG input through libspng, WebP through
#          libwebp; default: detected),
#          USE_MPI=auto|0|1 (default: auto; Open MPI for many processes), USE_NCCL=auto|0|1,
#          SANITIZE=1 (ASan+UBSan build in build-san/), PREFIX=/usr/local for install.

.DEFAULT_GOAL := all
SHELL := /bin/bash

VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GITREV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
PREFIX ?= /usr/local
PYTHON ?= /usr/bin/python3
CUDA ?= /usr/local/cuda
CUDA_ARCH ?= 80 90

ifeq ($(SANITIZE),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else
BUILD ?= build
SANFLAGS :=
OPT := -O2
endif

CC ?= cc
# OpenBLAS headers live in a Debian multiarch alternative folder.
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)

HASH := \#
space := $(eval) $(eval)
# libjpeg-turbo's libjpeg API (Debian: libjpeg62-turbo-dev) lets the loader decode only
# the rows and columns of a RandomResizedCrop window; without it TurboJPEG decodes whole
# images (same pixels, slower). USE_LIBJPEG=0|1 overrides the detection.
ifeq ($(origin USE_LIBJPEG),undefined)
USE_LIBJPEG := $(shell printf '$(HASH)include <stdio.h>\n$(HASH)include <jpeglib.h>\nint main(void){struct jpeg_decompress_struct c; JDIMENSION x = 0, w = 0; jpeg_crop_scanline(&c, &x, &w); return 0;}\n' | \
  $(CC) -x c - -ljpeg -o /dev/null 2>/dev/null && echo 1 || echo 0)
endif

# Image formats besides JPEG, each through its Debian library: PNG via libspng
# (libspng-dev), WebP via libwebp (libwebp-dev). USE_PNG=0|1 and USE_WEBP=0|1 override
# the detection; without one rn-prep and rn-predict skip those files and say why.
PNG_PROBE = $(shell printf '$(HASH)include <spng.h>\nint main(void){spng_ctx_free(spng_ctx_new(0)); return 0;}\n' | \
  $(CC) -x c - -lspng -o /dev/null 2>/dev/null && echo 1 || echo 0)
ifeq ($(filter-out auto,$(or $(USE_PNG),auto)),)
override USE_PNG := $(PNG_PROBE)
endif
WEBP_PROBE = $(shell printf '$(HASH)include <webp/decode.h>\nint main(void){return WebPGetDecoderVersion() == 0;}\n' | \
  $(CC) -x c - -lwebp -o /dev/null 2>/dev/null && echo 1 || echo 0)
ifeq ($(filter-out auto,$(or $(USE_WEBP),auto)),)
override USE_WEBP := $(WEBP_PROBE)
endif

# CUDA detection: nvcc, cuDNN and cuBLAS headers and libraries, and a tiny test compile.
ifeq ($(filter-out auto,$(or $(USE_CUDA),auto)),)
override USE_CUDA := $(shell test -x $(CUDA)/bin/nvcc && printf '$(HASH)include <cudnn.h>\n$(HASH)include <cublas_v2.h>\n$(HASH)include <cuda_runtime.h>\nint main(void){cublasHandle_t h; (void)h; return cudnnGetVersion()==0;}\n' | \
  $(CC) -x c - -I$(CUDA)/include -L$(CUDA)/lib64 -lcudnn -lcublas -lcudart -o /dev/null 2>/dev/null && echo 1 || echo 0)
endif

# Open MPI (Debian: libopenmpi-dev) starts and connects the processes of a
# many-device run (rn/dist.h); found through mpicc. USE_MPI=0|1 overrides.
# (USE_CUDA, USE_MPI, USE_NCCL: unset or auto detects)
MPICC ?= mpicc
ifeq ($(filter-out auto,$(or $(USE_MPI),auto)),)
override USE_MPI := $(shell printf '$(HASH)include <mpi.h>\nint main(void){return MPI_Init(0, 0);}\n' | \
  $(CC) -x c - $$($(MPICC) -showme:compile 2>/dev/null) $$($(MPICC) -showme:link 2>/dev/null) -o /dev/null 2>/dev/null && echo 1 || echo 0)
endif
# NCCL (in the CUDA toolkit) carries the GPU backend's collectives.
ifeq ($(filter-out auto,$(or $(USE_NCCL),auto)),)
override USE_NCCL := $(shell test -f $(CUDA)/include/nccl.h && ls $(CUDA)/lib64/libnccl.so* >/dev/null 2>&1 && echo 1 || echo 0)
endif

CPPFLAGS += -Iinclude -I$(BUILD)/gen -D_GNU_SOURCE -DRN_VERSION='"$(VERSION)+$(GITREV)"' $(BLAS_CFLAGS)
CFLAGS ?= $(OPT) -g
CFLAGS += -std=c11 -Wall -Wextra -Wno-unused-parameter -fopenmp -pthread $(SANFLAGS)
# --as-needed: tools that never call CUDA (rn-gpuinfo loads it at run time) must start
# on machines without the CUDA libraries
LDFLAGS += -fopenmp -pthread -Wl,--as-needed $(SANFLAGS)
LDLIBS += -lprotobuf-c -llmdb -lturbojpeg $(BLAS_LIBS) -ldl -lm
ifeq ($(USE_LIBJPEG),1)
CPPFLAGS += -DRN_HAVE_LIBJPEG=1
LDLIBS += -ljpeg
JPEG_SUMMARY := , libjpeg crop decoding
endif
IMG_FORMATS := JPEG
ifeq ($(USE_PNG),1)
CPPFLAGS += -DRN_HAVE_SPNG=1
LDLIBS += -lspng
IMG_FORMATS += PNG
else
SKIP_PNG := PNG: no libspng, make deps installs libspng-dev
endif
ifeq ($(USE_WEBP),1)
CPPFLAGS += -DRN_HAVE_WEBP=1
LDLIBS += -lwebp
IMG_FORMATS += WebP
else
SKIP_WEBP := WebP: no libwebp, make deps installs libwebp-dev
endif
IMG_SKIPPED := $(SKIP_PNG)$(if $(and $(SKIP_PNG),$(SKIP_WEBP)),; )$(SKIP_WEBP)
IMG_SUMMARY := , reads $(subst $(space),/,$(strip $(IMG_FORMATS))) images$(if $(IMG_SKIPPED), (skips $(IMG_SKIPPED)))
ifeq ($(USE_MPI),1)
CPPFLAGS += -DRN_HAVE_MPI=1 $(shell $(MPICC) -showme:compile)
LDLIBS += $(shell $(MPICC) -showme:link)
MPI_SUMMARY := , Open MPI (many processes)
else
MPI_SUMMARY := , no MPI (one process per run: make deps installs libopenmpi-dev)
endif

ifeq ($(USE_CUDA),1)
CPPFLAGS += -DRN_HAVE_CUDA=1 -I$(CUDA)/include -DRN_CUDA_ARCH='"$(CUDA_ARCH)"'
NVCC := $(CUDA)/bin/nvcc
NVCCFLAGS := -O2 -std=c++17 -Iinclude -I$(BUILD)/gen -DRN_HAVE_CUDA=1 \
  $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
  -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
# cuBLAS is not linked: lib/backend_cuda.cu opens it (dlopen) with the first CUDA context,
# so that processes without a GPU do not pay its start-up (about 0.35 s each)
LDLIBS += -L$(CUDA)/lib64 -Wl,-rpath,$(CUDA)/lib64 -lcudnn -lcudart -lstdc++
# NVTX v3 is header-only (ranges for rn-train --profile); in the toolkit since CUDA 10
ifneq ($(wildcard $(CUDA)/include/nvtx3/nvToolsExt.h),)
CPPFLAGS += -DRN_HAVE_NVTX=1
endif
ifeq ($(USE_NCCL),1)
NVCCFLAGS += -DRN_HAVE_NCCL=1
CPPFLAGS += -DRN_HAVE_NCCL=1
LDLIBS += -lnccl
NCCL_SUMMARY := , NCCL
endif
CU_SRC := $(wildcard lib/*.cu)
BUILD_SUMMARY := CUDA $(shell $(CUDA)/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') (sm $(CUDA_ARCH)), cuDNN, cuBLAS$(NCCL_SUMMARY): GPU and CPU backends
else
CU_SRC :=
BUILD_SUMMARY := no usable CUDA toolkit/cuDNN/cuBLAS under $(CUDA): CPU backend only
endif

# every message schema in proto/ (rn.proto: checkpoints; others: formats rn writes for
# outside readers) compiles to $(BUILD)/gen/NAME.pb-c.[ch] and links into librn
PROTOS := $(wildcard proto/*.proto)
PROTO_C := $(PROTOS:proto/%.proto=$(BUILD)/gen/%.pb-c.c)
PROTO_H := $(PROTOS:proto/%.proto=$(BUILD)/gen/%.pb-c.h)
LIB_SRC := $(wildcard lib/*.c)
LIB_OBJ := $(LIB_SRC:lib/%.c=$(BUILD)/obj/%.o) $(PROTOS:proto/%.proto=$(BUILD)/obj/%.pb-c.o) $(CU_SRC:lib/%.cu=$(BUILD)/obj/%.cu.o)
LIBRN := $(BUILD)/librn.a
TOOLS := $(patsubst tools/%.c,$(BUILD)/bin/%,$(wildcard tools/rn-*.c))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
PARITY_BIN := $(patsubst tests/parity/%.c,$(BUILD)/tests/parity_%,$(wildcard tests/parity/*.c))
# the fuzz harnesses built with a replay main(): make test runs tests/fuzz/regress/ through them
FUZZ_REPLAY_BIN := $(patsubst tests/fuzz/fuzz_%.c,$(BUILD)/tests/fuzzreplay_%,$(wildcard tests/fuzz/fuzz_*.c))
BENCH_BIN := $(patsubst tests/bench/%.c,$(BUILD)/tests/bench_%,$(wildcard tests/bench/*.c))
# rn's GEMM kernel alone (tests/xarch/gemm_forms.c), native and, where the cross compiler
# is installed, for aarch64 (static; tests/kernels.bats runs it under qemu-aarch64)
XARCH_CC ?= aarch64-linux-gnu-gcc
# (a cross compiler that links statically: Debian's libc6-dev-arm64-cross beside it)
XARCH_OK = $(shell printf 'int main(void){return 0;}\n' | $(XARCH_CC) -x c - -static -o /dev/null 2>/dev/null && echo 1)
XARCH_BIN := $(BUILD)/tests/gemm_forms $(if $(XARCH_OK),$(BUILD)/tests/gemm_forms.aarch64)

.PHONY: all summary fuzz deps onnxruntime test unit bats parity demo install clean format lint compile_commands.json bench bench-cpu bench-loader gpu-check check-aarch64

all: summary $(TOOLS) $(UNIT_BIN) $(PARITY_BIN) $(BENCH_BIN) $(FUZZ_REPLAY_BIN) $(XARCH_BIN)

summary:
	@echo "rn $(VERSION): $(BUILD_SUMMARY)$(JPEG_SUMMARY)$(IMG_SUMMARY)$(MPI_SUMMARY)"

$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen --proto_path=proto $<

$(BUILD)/obj/%.pb-c.o: $(BUILD)/gen/%.pb-c.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-extra -c $< -o $@

# Header dependencies come from the compiler (-MMD: $@.d lists the headers each file
# includes), so a header edit rebuilds what includes it and nothing else. A target whose
# .d is missing (a build from before) is rebuilt once: the empty rules below make it.
DEPFLAGS = -MMD -MP -MF $@.d -MT $@
DEPFILES := $(LIB_SRC:lib/%.c=$(BUILD)/obj/%.o.d) $(TOOLS:=.d) $(UNIT_BIN:=.d)
$(DEPFILES): ;

$(BUILD)/obj/%.o: lib/%.c $(PROTO_H) $(BUILD)/obj/%.o.d
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: lib/%.cu $(PROTO_H) $(wildcard include/rn/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIBRN): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/%: tools/%.c $(LIBRN) $(BUILD)/bin/%.d
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) $< $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/unit/%.c $(LIBRN) $(BUILD)/tests/%.d
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests/unit $(CFLAGS) $(DEPFLAGS) $< $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/tests/fuzzreplay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h $(LIBRN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $< tests/fuzz/replay.c $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

# parity harnesses and benchmark bodies: driven by scripts in tests/parity and tests/bench
$(BUILD)/tests/bench_%: tests/bench/%.c $(LIBRN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) $< $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/tests/parity_%: tests/parity/%.c $(LIBRN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) $< $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

GEMM_FORMS_SRC := tests/xarch/gemm_forms.c lib/backend_cpu_fused.c include/rn/backend_cpu_impl.h
$(BUILD)/tests/gemm_forms: $(GEMM_FORMS_SRC)
	@mkdir -p $(dir $@)
	$(CC) -Iinclude $(CFLAGS) $(filter %.c,$^) -lm -o $@

$(BUILD)/tests/gemm_forms.aarch64: $(GEMM_FORMS_SRC)
	@mkdir -p $(dir $@)
	$(XARCH_CC) -Iinclude -O2 -std=c11 -Wall -Wextra -static $(filter %.c,$^) -lm -o $@

-include $(wildcard $(DEPFILES) $(BUILD)/tests/bench_*.d $(BUILD)/tests/parity_*.d)

# Debian packages for the build and the tests; quick when all are present.
DEB_PKGS := libturbojpeg0-dev liblmdb-dev lmdb-utils libprotobuf-c-dev protobuf-c-compiler \
  libjpeg62-turbo-dev libspng-dev libwebp-dev libopenblas-dev bats bats-assert bats-support pkg-config python3-torch python3-torchvision \
  python3-numpy python3-pil python3-onnx dataset-fashion-mnist gnuplot-nox man-db libopenmpi-dev openmpi-bin \
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all $(words $(DEB_PKGS)) Debian packages present"; \
	elif [ "$$(id -u)" = 0 ]; then echo "deps: installing $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	else echo "deps: missing packages; run as root:"; echo "  apt-get update && apt-get install -y $$missing"; exit 1; fi

test: deps
	@$(MAKE) --no-print-directory all onnxruntime
	@BUILD=$(BUILD) PYTHON=$(PYTHON) RN_SANITIZE=$(SANITIZE:0=) tests/run.sh

# rn-prep to rn-eval built for aarch64 (in build-aarch64/) and run under qemu-aarch64
# beside this build: the same bytes (a minute; needs Debian's arm64 libraries, which the
# script names; exits 77 without them)
check-aarch64:
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/xarch/whole-run.sh

# onnxruntime's Node.js binding (npm; its Linux x64 CPU library ships in the package)
# in $(BUILD)/node: the outside runtime tests/export-onnx.bats runs rn-export's ONNX
# files on. Never fails the build: without npm or the registry those tests skip, saying so.
ORT_DIR := $(BUILD)/node
onnxruntime:
	@if [ -f $(ORT_DIR)/node_modules/onnxruntime-node/package.json ]; then echo "onnxruntime: onnxruntime-node present in $(ORT_DIR)"; \
	elif ! command -v npm >/dev/null; then mkdir -p $(ORT_DIR); echo "no npm (apt-get install npm)" > $(ORT_DIR)/install.log; \
	  echo "onnxruntime: no npm; the ONNX runtime tests will skip"; \
	elif mkdir -p $(ORT_DIR) && timeout 300 npm install --ignore-scripts --no-audit --no-fund --prefix $(ORT_DIR) onnxruntime-node > $(ORT_DIR)/install.log 2>&1; then \
	  echo "onnxruntime: onnxruntime-node installed in $(ORT_DIR)"; \
	else echo "onnxruntime: npm install onnxruntime-node failed (see $(ORT_DIR)/install.log); the ONNX runtime tests will skip"; fi

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) examples/demo.sh

install: all install-man install-pipelines
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/

# every benchmark, one table (minutes each; wants the machine to itself)
bench: all
	@$(MAKE) --no-print-directory -f pipelines/bench.mk bench-table RUN=$(BUILD)

format:
	clang-format -i lib/*.c include/rn/*.h tools/*.c tests/unit/*.c tests/unit/*.h $(wildcard lib/*.cu)

lint: $(PROTO_H)
	cppcheck --quiet --enable=warning,performance,portability --std=c11 -Iinclude -I$(BUILD)/gen \
	  --suppress=missingIncludeSystem lib tools
	clang-tidy --quiet $(LIB_SRC) $(wildcard tools/*.c) -- $(CPPFLAGS) -std=c11

compile_commands.json:
	$(MAKE) clean && bear -- $(MAKE) all

clean:
	rm -rf build build-san build-fuzz

# benchmark targets (make bench-*), one fragment per benchmark
-include $(wildcard pipelines/bench-*.mk) pipelines/gpu-check.mk
include pipelines/fuzz.mk
include man/man.mk
