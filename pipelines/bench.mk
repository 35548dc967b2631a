# pipelines/bench.mk: run rn's benchmarks (the `make bench-*` targets that the
# pipelines/bench-*.mk fragments define) and collect their summary lines,
#   <name>: rn=<value> peer=<value> ratio=<r>
# into one table.
#
#   RN_SRC      the rn source tree whose benchmarks run (default: the one these fragments
#               are in)
#   BENCHES     which ones (default: every bench-* target in $(RN_SRC)/pipelines/bench-*.mk)
#   BENCH_OUT   where the logs and the table go (default $(RUN)/bench, RUN as in common.mk)
#   BENCH_MAKEFLAGS  passed to each `make bench-*` (e.g. BENCH_LOADER_IMAGES=500)
#
#   $(BENCH_OUT)/bench-NAME.log   the full output of `make -C $(RN_SRC) bench-NAME`
#   $(BENCH_OUT)/bench.tsv        benchmark, name, rn, peer, ratio (tab separated, a header);
#                                 a benchmark that failed or printed no summary line gets a row
#                                 saying so, and the table is still made
#
# Targets: bench-table (runs the benchmarks whose logs are missing, then prints the table;
# remove a log, or make -B, to run it again). Benchmarks take minutes each and want the
# machine to themselves: they are never run by the tests.

ifndef RN_BENCH_MK
RN_BENCH_MK := 1
include $(dir $(lastword $(MAKEFILE_LIST)))common.mk

RN_SRC ?= $(abspath $(RN_PIPELINES)/..)
BENCHES ?= $(sort $(shell sed -n 's/^\(bench-[A-Za-z0-9_-]*\):.*/\1/p' $(wildcard $(RN_SRC)/pipelines/bench-*.mk) /dev/null))
BENCH_OUT ?= $(RUN)/bench
BENCH_MAKEFLAGS ?=

.PHONY: bench-table
bench-table: $(BENCH_OUT)/bench.tsv
	@column -t -s "$$(printf '\t')" $< 2>/dev/null || cat $<

$(BENCH_OUT)/bench.tsv: $(BENCHES:%=$(BENCH_OUT)/%.log)
	@{ printf 'benchmark\tname\trn\tpeer\tratio\n'; \
	  for f in $^; do b=$$(basename $$f .log); \
	    if [ -f $$f.failed ]; then printf '%s\t(failed: see %s)\t-\t-\t-\n' $$b $$f; continue; fi; \
	    sed -n 's/^\([A-Za-z0-9_.-]*\): rn=\([^ ]*\) peer=\([^ ]*\) ratio=\([^ ]*\)$$/\1\t\2\t\3\t\4/p' $$f | \
	      awk -v b=$$b 'BEGIN { FS = OFS = "\t" } { print b, $$0; n++ } END { if (!n) print b, "(no summary line)", "-", "-", "-" }'; \
	  done; } > $@.tmp && mv $@.tmp $@

# plain make, not $(MAKE): `make -n bench-table` must print the command, not run the
# benchmark; and without the caller's MAKEFLAGS, so its variables stay out of rn's Makefile
$(BENCH_OUT)/bench-%.log:
	@mkdir -p $(dir $@) && rm -f $@.failed
	@echo "bench.mk: make -C $(RN_SRC) bench-$* $(BENCH_MAKEFLAGS)"
	@env -u MAKEFLAGS -u MFLAGS make --no-print-directory -C $(RN_SRC) bench-$* $(BENCH_MAKEFLAGS) > $@.tmp 2>&1; rc=$$?; \
	  mv $@.tmp $@; grep -E '^[A-Za-z0-9_.-]+: rn=' $@ || true; \
	  if [ $$rc != 0 ]; then touch $@.failed; echo "bench.mk: bench-$* failed (exit $$rc): $@" >&2; fi

endif
