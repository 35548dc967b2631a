# make bench-dist: data-parallel training on the CPU, rn-train under mpirun against PyTorch
# DDP (gloo), 2 ranks of one thread, ResNet-50 64x64 global batch 32 (tests/bench/dist.sh).
# Ends with "dist-cpu-2rank: rn=<img/s> peer=<img/s> ratio=<r>" and "dist-cpu-scaling:
# rn2rank=<img/s> rn1proc2thr=<img/s> ratio=<r>". Knobs: BENCH_DIST_NP (ranks, default 2),
# BENCH_DIST_STEPS (timed steps, default 6), BENCH_DIST_MPIFLAGS (default --bind-to none).
BENCH_DIST_NP ?= 2
BENCH_DIST_STEPS ?= 6
BENCH_DIST_MPIFLAGS ?=

.PHONY: bench-dist
bench-dist: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) NP=$(BENCH_DIST_NP) STEPS=$(BENCH_DIST_STEPS) \
	  $(if $(BENCH_DIST_MPIFLAGS),MPIFLAGS='$(BENCH_DIST_MPIFLAGS)') tests/bench/dist.sh
