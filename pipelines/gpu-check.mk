# make gpu-check [GPU_CHECK_OUT=DIR]: on a machine with an NVIDIA GPU, build there, then
# compare every CUDA op with the CPU op and 30 ResNet-50 training steps on GPU and CPU,
# train the same steps with rn-train --amp fp16 and bf16, run tests/amp.bats and check the
# memory plan (--micro-batch auto) on the device, and with 2 or more GPUs data-parallel
# training over NCCL against --accum (tests/gpu/gpu-check.sh says what exactly). Writes DIR/gpu-check.log and DIR/results.md.
# Without a usable GPU it prints "gpu-check: skipped: <why>" and exits 0 (77 with
# GPU_CHECK_STRICT=1, for callers that must tell a skip from a pass).
GPU_CHECK_OUT ?= gpu-check-out
# the make the script builds with, taken here so that the recipe does not name $(MAKE)
# (a recipe that does runs even under make -n)
GPU_CHECK_MAKE := $(MAKE)

gpu-check:
	@MAKE="$(GPU_CHECK_MAKE)" BUILD=$(BUILD) PYTHON=$(PYTHON) GPU_CHECK_OUT=$(GPU_CHECK_OUT) tests/gpu/gpu-check.sh
