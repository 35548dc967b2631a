# make bench-gpu: ResNet-50 224x224 batch 256 training on one GPU, rn against PyTorch eager
# with channels_last and AMP, side by side (tests/bench/gpu.sh): synthetic input and the
# real loader on generated JPEGs, fp32/fp16/bf16, img/s, GPU busy share (NVML) and peak
# device memory; with 2+ GPUs, mpirun rn-train against torchrun DDP at N = 2..GPUs, fp16
# (gpu-train-ddp-N-fp16, gpu-scaling-N-fp16). Ends with "gpu-train-amp: rn=<img/s>
# peer=<img/s> ratio=<r>". Without a usable GPU it prints "bench-gpu: skipped: <why>"
# and exits 0. Knobs: BENCH_GPU_STEPS, BENCH_GPU_BATCH, BENCH_GPU_WORKERS, BENCH_GPU_IMAGES,
# BENCH_GPU_PRECISIONS, BENCH_GPU_TF32, BENCH_GPU_DIR, BENCH_GPU_DDP_N, ... (the script's
# header); BENCH_GPU_DRY=1 checks the script on the CPU.
# No `deps`: a lent GPU machine builds without Debian's packages (tests/gpu/device-run.sh).
.PHONY: bench-gpu
bench-gpu: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/bench/gpu.sh
