# pipelines/eval.mk: every epoch checkpoint evaluated on $(VAL_LMDB).
#
#   $(RUN)/eval/epoch-NNN.txt   rn-eval's line for epoch NNN: top1=... top5=... loss=... n=...
#   $(RUN)/results.tsv          one row per epoch: epoch, top1, top5 (or top-K), loss, n,
#                               checkpoint; tab separated, with a header
#   $(RUN)/best.pb              a symbolic link to the epoch with the best top-1 (the lower
#                               loss on a tie, then the earlier epoch)
#   $(RUN)/val-data.json        the validation set's identity, checked before every eval
#
# Variables (see common.mk): RN_BIN DATA VAL_LMDB RUN EPOCHS VAL_CROP VAL_RESIZE WORKERS THREADS
# DEVICE NPROC MPIRUN MPIFLAGS EVAL_FLAGS (e.g. --batch 256, --topk 1); EVAL_CMD, the
# command that evaluates the checkpoint $< and prints one line of key=value pairs, top-1
# first and loss third (default rn-eval, as $(MPIRUN) -np $(NPROC) $(MPIFLAGS) rn-eval when
# NPROC > 1; put your own evaluator here: it gets no launcher). Targets: eval (results.tsv and best.pb).
# Includes train.mk: evaluating an epoch that is not there yet trains it first.

ifndef RN_EVAL_MK
RN_EVAL_MK := 1
# the includer's first target stays the default goal (see common.mk): the ones below do not take it
RN_EVAL_GOAL := $(.DEFAULT_GOAL)
include $(dir $(lastword $(MAKEFILE_LIST)))train.mk

RN_EVALS := $(RN_EPOCHS:%=$(RUN)/eval/epoch-%.txt)
EVAL_CMD ?= $(RN_MPI)$(RN)rn-eval --data $(VAL_LMDB) --ckpt $< $(RN_EVAL_X) $(RN_EVAL_T) $(EVAL_FLAGS)

.PHONY: eval
eval: $(RUN)/results.tsv

$(RUN)/eval/epoch-%.txt: $(RUN)/epoch-%.pb | $(VAL_LMDB)
	@mkdir -p $(dir $@) && $(call rn_check_data,val,$(VAL_LMDB))
	$(call rn_log,$(RUN)/commands.sh) -o $@ $(EVAL_CMD)

$(RUN)/results.tsv: $(RN_EVALS)
	@awk 'FNR == 1 { e = FILENAME; sub(/.*epoch-/, "", e); sub(/\.txt$$/, "", e); \
	    if (!head++) { printf "epoch"; for (i = 1; i <= NF; i++) { split($$i, kv, "="); printf "\t%s", kv[1] } print "\tcheckpoint" } \
	    printf "%d", e; for (i = 1; i <= NF; i++) { split($$i, kv, "="); printf "\t%s", kv[2] } printf "\tepoch-%s.pb\n", e }' \
	  $^ > $@.tmp && mv $@.tmp $@
	@best=$$(awk -F'\t' 'NR > 1 && (b == "" || $$2 > t || ($$2 == t && $$4 < l)) { b = $$NF; t = $$2; l = $$4 } END { print b }' $@); \
	  ln -sfn $$best $(RUN)/best.pb.tmp && mv -fT $(RUN)/best.pb.tmp $(RUN)/best.pb && \
	  awk -F'\t' -v b=$$best 'NR == 1 { for (i = 1; i < NF; i++) h[i] = $$i } $$NF == b { printf "$(RUN)/best.pb -> %s:", b; for (i = 2; i < NF; i++) printf " %s=%s", h[i], $$i; print "" }' $@

.DEFAULT_GOAL := $(RN_EVAL_GOAL)

endif
