# pipelines/plot.mk: $(RUN)/curves.png, the run's curves drawn by gnuplot (Debian's
# gnuplot-nox) from the rn-train logs $(RUN)/epoch-*.jsonl: training loss and learning rate
# against the step, top-1/top-5 and loss against the epoch (from rn-train --val, and from
# $(RUN)/results.tsv when eval.mk made it). The work is in pipelines/curves.sh.
#
# Variables: RUN, EPOCHS and the rest of train.mk's (see common.mk).
# Targets: plot ($(RUN)/curves.png once every epoch is trained, and evaluated when eval.mk
# is included too), plot-now (curves of whatever is logged so far: run it from a second
# terminal while a long run trains).

ifndef RN_PLOT_MK
RN_PLOT_MK := 1
# the includer's first target stays the default goal (see common.mk): the ones below do not take it
RN_PLOT_GOAL := $(.DEFAULT_GOAL)
include $(dir $(lastword $(MAKEFILE_LIST)))train.mk

.PHONY: plot plot-now
plot: $(RUN)/curves.png

$(RUN)/curves.png: $(RN_EPOCHS:%=$(RUN)/epoch-%.pb) $(if $(RN_EVALS),$(RUN)/results.tsv)
	sh $(RN_PIPELINES)/curves.sh $(RUN) $@

plot-now:
	sh $(RN_PIPELINES)/curves.sh $(RUN) $(RUN)/curves.png

.DEFAULT_GOAL := $(RN_PLOT_GOAL)

endif
