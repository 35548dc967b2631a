# make bench-loader: the rn loader against torchvision's DataLoader + ImageFolder + PIL on
# generated 500x375 JPEGs, same transform and worker count; also rn-prep's img/s, and
# "prep-png: rn=<img/s> peer=<img/s> ratio=<r>": rn-prep on the same images as PNGs against
# ImageFolder + PIL (decode, Resize(256), CenterCrop(224)) at the same threads, and
# "loader-ta: rn=<img/s> peer=<img/s> ratio=<r>": both loaders with TrivialAugmentWide and
# RandomErasing(0.1) added (rn-load --augment rrc,flip,ta_wide,erase=0.1).
# Ends with "loader: rn=<img/s> peer=<img/s> ratio=<r>". Knobs: BENCH_LOADER_IMAGES,
# BENCH_LOADER_WORKERS, BENCH_LOADER_BATCH.
BENCH_LOADER_IMAGES ?= 1000
BENCH_LOADER_WORKERS ?= 2
BENCH_LOADER_BATCH ?= 64

bench-loader: all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) IMAGES=$(BENCH_LOADER_IMAGES) WORKERS=$(BENCH_LOADER_WORKERS) \
	  BATCH=$(BENCH_LOADER_BATCH) tests/bench/loader.sh
