# pipelines/train.mk: one checkpoint per epoch, each made from the previous one.
#
#   $(RUN)/epoch-000.pb                rn-init $(INIT_FLAGS) --seed $(SEED)
#   $(RUN)/epoch-NNN.pb                rn-train --in epoch-(NNN-1).pb --epochs 1 ...
#   $(RUN)/epoch-NNN.jsonl             that epoch's log (rn-train --log): "step" and "epoch" lines
#   $(TENSORBOARD)/events.out.tfevents.*  with TENSORBOARD set: one TensorBoard event file per
#                                      rn-train, the same values as the logs (a resumed or
#                                      repeated epoch adds no step twice: see rn-train(1))
#   $(RUN)/commands.sh                 every command run, as run, with the time
#   $(RUN)/run.txt                     when and where the run started, the rn version, the settings
#   $(RUN)/train-data.json             the training set's identity (rn-info --json: count,
#                                      classes, sizes, mean/std, the rn-prep command)
#
# Variables (see common.mk): RN_BIN DATA TRAIN_LMDB VAL_LMDB RUN ARCH CLASSES EPOCHS BATCH
# ACCUM LR LR_SCHEDULE LR_STEP LR_GAMMA LR_MILESTONES AMP DEVICE WORKERS THREADS NPROC MPIRUN
# MPIFLAGS CROP RESIZE VAL_CROP VAL_RESIZE SEED SAVE_EVERY TRAIN_VAL TENSORBOARD INIT_FLAGS TRAIN_FLAGS; LOG_EVERY (steps per
# log line, default 20). NPROC > 1 runs rn-train as $(MPIRUN) -np $(NPROC) $(MPIFLAGS) rn-train.
# Targets: train (the last epoch), $(RUN)/epoch-NNN.pb.
#
# Resume: an interrupted run continues at the last finished epoch when make is run again.
# rn-train writes to epoch-NNN.pb.part and the file is renamed epoch-NNN.pb only once it
# holds the whole epoch; a .part left by a signal (rn-train saves at the next step boundary)
# or by SAVE_EVERY is continued exactly, mid-epoch. The learning rate is a function of the
# global step, stored in the checkpoint, and every epoch is run with the same flags, so the
# schedule is the one an uninterrupted `rn-train --epochs $(EPOCHS)` run follows.
# Raising EPOCHS later continues a finished run (with LR_SCHEDULE=cosine the earlier epochs
# followed the shorter schedule: start a new RUN for a clean cosine run).
# The dataset is checked against train-data.json before every epoch: a run never mixes data.

ifndef RN_TRAIN_MK
RN_TRAIN_MK := 1
# the includer's first target stays the default goal (see common.mk): the ones below do not take it
RN_TRAIN_GOAL := $(.DEFAULT_GOAL)
include $(dir $(lastword $(MAKEFILE_LIST)))common.mk

LOG_EVERY ?= 20

RN_TRAIN_FLAGS = --batch $(BATCH) $(if $(filter-out 1,$(ACCUM)),--accum $(ACCUM)) \
  --lr $(LR) --lr-schedule $(LR_SCHEDULE) \
  $(if $(filter step exp,$(LR_SCHEDULE)),$(if $(filter step,$(LR_SCHEDULE)),--lr-step $(LR_STEP) )--lr-gamma $(LR_GAMMA)) \
  $(if $(filter multistep,$(LR_SCHEDULE)),--lr-milestones $(LR_MILESTONES) --lr-gamma $(LR_GAMMA)) \
  $(if $(filter cosine poly,$(LR_SCHEDULE)),--lr-epochs $(EPOCHS)) \
  $(if $(AMP),--amp $(AMP)) --seed $(SEED) $(if $(SAVE_EVERY),--save-every $(SAVE_EVERY)) \
  $(if $(TRAIN_VAL),--val $(TRAIN_VAL)) --log-every $(LOG_EVERY) $(if $(TENSORBOARD),--tensorboard $(TENSORBOARD)) \
  $(RN_TRAIN_X) $(RN_EVAL_T) $(if $(RECIPE),--recipe $(RECIPE)) $(TRAIN_FLAGS)

# the top-level "epoch" of a checkpoint (the history's come later in the JSON)
rn_epoch_of = $(RN)rn-info --json $(1) | grep -o '"epoch":[0-9]*' | head -n 1 | cut -d: -f2

# $(call rn_check_data,NAME,DATASET): record DATASET's identity in $(RUN)/NAME-data.json the
# first time, and refuse to go on with a dataset that differs from it
define rn_check_data
mkdir -p $(RUN) && $(RN)rn-info --json $(2) > $(RUN)/$(1)-data.json.now && \
if [ ! -f $(RUN)/$(1)-data.json ]; then mv $(RUN)/$(1)-data.json.now $(RUN)/$(1)-data.json; \
elif cmp -s $(RUN)/$(1)-data.json.now $(RUN)/$(1)-data.json; then rm -f $(RUN)/$(1)-data.json.now; \
else echo "$(RUN): $(2) is not the dataset this run started with (compare $(RUN)/$(1)-data.json with $(RUN)/$(1)-data.json.now): use another RUN, or remove $(RUN)/$(1)-data.json to go on with the new one" >&2; exit 1; fi
endef

RN_RECORD_VARS := RECIPE ARCH CLASSES EPOCHS BATCH ACCUM LR LR_SCHEDULE LR_STEP LR_GAMMA LR_MILESTONES \
  AMP DEVICE WORKERS THREADS NPROC MPIRUN MPIFLAGS CROP RESIZE VAL_CROP VAL_RESIZE SEED SAVE_EVERY DATA TRAIN_LMDB VAL_LMDB TRAIN_VAL TENSORBOARD \
  INIT_FLAGS TRAIN_FLAGS EVAL_FLAGS RN_BIN

.PHONY: train
train: $(RUN)/epoch-$(RN_LAST).pb

$(RUN)/run.txt:
	@mkdir -p $(RUN)
	@{ echo "# rn run $(RUN): started $$(date -u +%Y-%m-%dT%H:%M:%SZ) on $$(hostname) in $(CURDIR)"; \
	  echo "# $$($(RN)rn-train --version)"; \
	  echo "# make $(MAKECMDGOALS) $(filter-out --%,$(MAKEFLAGS))"; \
	  $(foreach v,$(RN_RECORD_VARS),printf '%s=%s\n' '$(v)' '$(subst ','\'',$($(v)))';) \
	} > $@.tmp && mv $@.tmp $@

$(RUN)/epoch-000.pb: | $(TRAIN_LMDB) $(RUN)/run.txt
	@$(call rn_check_data,train,$(TRAIN_LMDB))
	$(call rn_log,$(RUN)/commands.sh) $(RN)rn-init $(INIT_FLAGS) --seed $(SEED) -o $@

# $(call rn_epoch_rule,NNN,PREVIOUS NNN)
define rn_epoch_rule
$(RUN)/epoch-$(1).pb: $(RUN)/epoch-$(2).pb | $(TRAIN_LMDB) $(TRAIN_VAL)
	@$$(call rn_check_data,train,$$(TRAIN_LMDB))
	@rm -f $$@; if [ -f $$@.part ]; then e=$$$$($$(call rn_epoch_of,$$@.part)); \
	  if [ "$$$$e" = $(call rn_int,$(1)) ]; then mv $$@.part $$@; \
	  else echo "train.mk: continuing epoch $(1) from $$@.part"; fi; \
	else rm -f $(RUN)/epoch-$(1).jsonl; fi
	[ -f $$@ ] || $$(call rn_log,$$(RUN)/commands.sh) $$(RN_MPI)$$(RN)rn-train --data $$(TRAIN_LMDB) \
	  --in $$(if $$(wildcard $$@.part),$$@.part,$$<) --out $$@.part --epochs 1 $$(RN_TRAIN_FLAGS) \
	  --log $(RUN)/epoch-$(1).jsonl
	@[ -f $$@ ] || { e=$$$$($$(call rn_epoch_of,$$@.part)); \
	  if [ "$$$$e" = $(call rn_int,$(1)) ]; then mv $$@.part $$@; \
	  else echo "train.mk: rn-train stopped inside epoch $(1) and saved it in $$@.part: run make again to continue" >&2; exit 1; fi; }
endef
$(foreach e,$(RN_EPOCHS),$(eval $(call rn_epoch_rule,$(e),$(word $(call rn_int,$(e)),000 $(RN_EPOCHS)))))

.DEFAULT_GOAL := $(RN_TRAIN_GOAL)

endif
