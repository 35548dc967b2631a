# make bench-cpu: ResNet-50 training and eval on the CPU against PyTorch (tests/bench/cpu.sh).
.PHONY: bench-cpu
bench-cpu: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/bench/cpu.sh
