# pipelines/common.mk: the variables every rn pipeline fragment shares (prep.mk, train.mk,
# eval.mk, plot.mk and bench.mk include it; include those, not this file). Set a variable
# before the include line or on the command line: the per-epoch rules are generated when
# train.mk is read, so EPOCHS in particular must be known by then.
#
#   RN_BIN      folder with the rn tools (default: build/bin of the rn source tree these
#               fragments are in; empty when they are installed elsewhere, meaning $PATH)
#   DATA        folder of the datasets (default data): $(DATA)/train.lmdb, $(DATA)/val.lmdb
#   TRAIN_LMDB, VAL_LMDB   the datasets themselves, when they are not in DATA
#   RUN         the run folder: checkpoints, logs, results, plots, the record of what was
#               run (default runs/$(ARCH))
#   ARCH        resnet18|34|50|101|152 (default resnet50)
#   CLASSES     classes of the new model (default: as many as TRAIN_LMDB has)
#   RECIPE      seed|torchvision|torchvision-v2|cifar|mlperf: rn-train --recipe (default none).
#               Its values of EPOCHS, BATCH, LR, LR_SCHEDULE, LR_STEP, LR_GAMMA, CROP, RESIZE,
#               VAL_CROP and VAL_RESIZE become those variables' defaults; every rn-train gets --recipe RECIPE
#               for the rest (momentum, wd, augmentation, ...), the variables override it, and
#               cosine and poly run over EPOCHS. Needs rn-train built when make starts
#   EPOCHS      epochs to train (default 30): epoch-001.pb ... epoch-$(EPOCHS).pb
#   BATCH       images per optimiser step (default 256)
#   ACCUM       micro-batches per step (rn-train --accum; default 1)
#   LR          base learning rate (default 0.01)
#   LR_SCHEDULE step|multistep|cosine|constant|poly|exp (default step); LR_STEP (default 10)
#               and LR_GAMMA (default 0.1) for step, LR_GAMMA for exp; LR_MILESTONES (e.g.
#               30,60,80) for multistep;
#               cosine and poly run over EPOCHS
#   AMP         mixed precision (fp16|bf16), passed as rn-train --amp only when set; needs
#               a GPU (the CPU backend computes in fp32 and refuses it)
#   DEVICE      auto|cpu|cuda|cuda:N (default auto)
#   WORKERS     loader threads (default 4); THREADS: CPU compute threads (default: all)
#   NPROC       processes rn-train and rn-eval run as (default 1: one process, no mpirun);
#               above 1, their command lines start with $(MPIRUN) -np $(NPROC) $(MPIFLAGS)
#               and each rank computes BATCH/NPROC images of a step (BATCH stays the
#               global batch: NPROC=N gives the run ACCUM=N gives in one process). WORKERS and
#               THREADS are per process
#   MPIRUN      the launcher (default mpirun); MPIFLAGS: its flags (default none; e.g.
#               --oversubscribe, --bind-to none, -H host1:4,host2:4)
#   CROP        training crop, and evaluation crop unless VAL_CROP says otherwise (default 224)
#   RESIZE      evaluation resize of the shorter side (default: rn's round(CROP*256/224);
#               0: none, for datasets already stored at CROP x CROP)
#   VAL_CROP, VAL_RESIZE   the evaluation transform of rn-eval and of rn-train's TRAIN_VAL
#               (rn-train --val-crop/--val-resize; default CROP and RESIZE, or the recipe's:
#               torchvision-v2 trains at 176 and evaluates at 232/224)
#   SEED        initialisation, data order and augmentation seed (default 0)
#   SAVE_EVERY  also save the epoch in progress every N steps (default: off); make
#               then resumes inside the epoch (see train.mk)
#   TRAIN_VAL   dataset rn-train evaluates after each epoch, for the logs and the
#               checkpoint history (default VAL_LMDB; empty: none)
#   TENSORBOARD folder for TensorBoard event files (rn-train --tensorboard; default: none),
#               e.g. $(RUN)/tb: every epoch's rn-train adds its file there, the val/ curves
#               come from TRAIN_VAL; watch with tensorboard --logdir $(RUN)/tb
#   INIT_FLAGS  how rn-init makes epoch-000.pb (default --arch $(ARCH) --classes $(CLASSES));
#               e.g. --from weights.safetensors --reset-fc 10 to fine-tune
#   TRAIN_FLAGS, EVAL_FLAGS, PREP_FLAGS   more flags for rn-train, rn-eval, rn-prep
#
# The fragments leave the default goal to the Makefile that includes them: a plain `make`
# makes that Makefile's first target (`all: eval plot` after the include lines), never a
# fragment's (each saves .DEFAULT_GOAL when it is read and puts it back at its end).
#
# Every rn command a fragment runs is appended to $(RUN)/commands.sh (to
# $(DATA)/commands.sh for rn-prep) as it was run, with the time; `make -n` prints them
# before anything runs.

ifndef RN_COMMON_MK
RN_COMMON_MK := 1

RN_PIPELINES := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
RN_BIN ?= $(if $(wildcard $(RN_PIPELINES)/../tools/rn-train.c),$(abspath $(RN_PIPELINES)/../build/bin))
RECIPE ?=
ifneq ($(strip $(RECIPE)),)
# the recipe's flags, read once: they give the defaults of the variables below
RN_RECIPE_LINE := $(shell $(if $(RN_BIN),$(RN_BIN)/)rn-train --recipe $(RECIPE) --print-recipe)
ifeq ($(RN_RECIPE_LINE),)
$(error RECIPE=$(RECIPE): 'rn-train --recipe $(RECIPE) --print-recipe' printed nothing (its message is above; build rn-train first))
endif
endif
# $(call rn_recipe,FLAG,DEFAULT): the value FLAG has in RECIPE's flags, else DEFAULT
rn_recipe = $(or $(subst <,,$(firstword $(filter <%,$(subst $(1) ,<,$(RN_RECIPE_LINE))))),$(2))
DATA ?= data
TRAIN_LMDB ?= $(DATA)/train.lmdb
VAL_LMDB ?= $(DATA)/val.lmdb
ARCH ?= resnet50
RUN ?= runs/$(ARCH)
CLASSES ?=
EPOCHS ?= $(call rn_recipe,--epochs,30)
BATCH ?= $(call rn_recipe,--batch,256)
ACCUM ?= 1
LR ?= $(call rn_recipe,--lr,0.01)
LR_SCHEDULE ?= $(call rn_recipe,--lr-schedule,step)
LR_STEP ?= $(call rn_recipe,--lr-step,10)
LR_GAMMA ?= $(call rn_recipe,--lr-gamma,0.1)
LR_MILESTONES ?=
AMP ?=
DEVICE ?= auto
WORKERS ?= 4
THREADS ?=
NPROC ?= 1
MPIRUN ?= mpirun
MPIFLAGS ?=
CROP ?= $(call rn_recipe,--crop,224)
RESIZE ?= $(call rn_recipe,--resize,)
VAL_CROP ?= $(call rn_recipe,--val-crop,$(CROP))
VAL_RESIZE ?= $(call rn_recipe,--val-resize,$(RESIZE))
SEED ?= 0
SAVE_EVERY ?=
TRAIN_VAL ?= $(VAL_LMDB)
TENSORBOARD ?=
INIT_FLAGS ?= --arch $(ARCH) --classes $(RN_CLASSES)
TRAIN_FLAGS ?=
EVAL_FLAGS ?=
PREP_FLAGS ?=

# a tool by name: $(RN)rn-train
RN = $(if $(RN_BIN),$(RN_BIN)/)
# the class count, from the training set when CLASSES is empty (read when the recipe runs)
RN_CLASSES = $(or $(CLASSES),$$(wc -l < $(TRAIN_LMDB)/classes.txt))
# $(call rn_log,LOGFILE) COMMAND...: append COMMAND to LOGFILE, then run it
rn_log = sh $(RN_PIPELINES)/logrun.sh $(1)
# epoch numbers as in the file names: 001 002 ... $(EPOCHS)
RN_EPOCHS := $(shell seq -f %03g 1 $(EPOCHS))
RN_LAST := $(lastword 000 $(RN_EPOCHS))
# 007 -> 7
rn_int = $(or $(patsubst 0%,%,$(patsubst 0%,%,$(patsubst 0%,%,$(1)))),0)
# what a tool's command line starts with: nothing for one process, else the launcher
RN_MPI = $(if $(filter-out 1,$(NPROC)),$(strip $(MPIRUN) -np $(NPROC) $(MPIFLAGS)) )
# flags rn-train and rn-eval share
RN_EVAL_T = --workers $(WORKERS) $(if $(THREADS),--threads $(THREADS)) --device $(DEVICE)
# rn-eval's transform, and rn-train's (its --val evaluates with rn-eval's)
RN_EVAL_X = --crop $(VAL_CROP) $(if $(VAL_RESIZE),--resize $(VAL_RESIZE))
RN_TRAIN_X = --crop $(CROP) $(if $(RESIZE),--resize $(RESIZE)) \
  --val-crop $(VAL_CROP) $(if $(VAL_RESIZE),--val-resize $(VAL_RESIZE))

endif
