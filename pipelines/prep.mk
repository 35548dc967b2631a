# pipelines/prep.mk: $(TRAIN_LMDB) and $(VAL_LMDB) from image folders with rn-prep.
#
#   TRAIN_SRC   training images: an ImageFolder (SRC/<class>/<file>.jpg) or a list file
#               of 'relative/path label' lines
#   VAL_SRC     validation images, same forms; labelled with the training set's class
#               list (rn-prep --classes $(TRAIN_LMDB)), so label i is the same class in both
#   PREP_FLAGS  rn-prep flags for both, e.g. --resize 256 (ImageNet), or
#               --resize 32 --center-crop 32 (small images stored at their final size)
#   VAL_PREP_FLAGS  rn-prep flags for the validation set (default $(PREP_FLAGS))
#   DATA, TRAIN_LMDB, VAL_LMDB, RN_BIN: see common.mk
#
# Targets: prep (both datasets). A dataset is made once; remove it to make it again.
# If the image folders are themselves made by your Makefile, add them as prerequisites:
#   $(TRAIN_LMDB): jpeg/train/.done
# The commands go to $(DATA)/commands.sh; each dataset also records its own rn-prep command
# line, counts and mean/std (rn-info $(TRAIN_LMDB)).

ifndef RN_PREP_MK
RN_PREP_MK := 1
# the includer's first target stays the default goal (see common.mk): the ones below do not take it
RN_PREP_GOAL := $(.DEFAULT_GOAL)
include $(dir $(lastword $(MAKEFILE_LIST)))common.mk

TRAIN_SRC ?=
VAL_SRC ?=
VAL_PREP_FLAGS ?= $(PREP_FLAGS)

.PHONY: prep
prep: $(TRAIN_LMDB) $(VAL_LMDB)

$(TRAIN_LMDB):
	@test -n "$(TRAIN_SRC)" || { echo "prep.mk: set TRAIN_SRC to the training images (an ImageFolder or a list file)" >&2; exit 2; }
	@mkdir -p $(dir $@)
	$(call rn_log,$(dir $@)commands.sh) $(RN)rn-prep $(PREP_FLAGS) $(TRAIN_SRC) $@

$(VAL_LMDB): | $(TRAIN_LMDB)
	@test -n "$(VAL_SRC)" || { echo "prep.mk: set VAL_SRC to the validation images (an ImageFolder or a list file)" >&2; exit 2; }
	@mkdir -p $(dir $@)
	$(call rn_log,$(dir $@)commands.sh) $(RN)rn-prep $(VAL_PREP_FLAGS) --classes $(TRAIN_LMDB) $(VAL_SRC) $@

.DEFAULT_GOAL := $(RN_PREP_GOAL)

endif
