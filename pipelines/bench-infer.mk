# make bench-infer: ResNet-50 inference at 224 on the CPU, batch 32 (img/s) and batch 1
# (ms), rn's inference path against onnxruntime (Node.js binding) and PyTorch on the same
# random weights and threads (tests/bench/infer.sh). Lines infer-cpu-b32,
# infer-cpu-b1-ms (ratio peer/rn: above 1 is rn ahead) and their -torch rows. Knobs:
# BENCH_INFER_THREADS, BENCH_INFER_ROUNDS.
BENCH_INFER_THREADS ?= 2
BENCH_INFER_ROUNDS ?= 2

.PHONY: bench-infer
bench-infer: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) THREADS=$(BENCH_INFER_THREADS) ROUNDS=$(BENCH_INFER_ROUNDS) tests/bench/infer.sh
