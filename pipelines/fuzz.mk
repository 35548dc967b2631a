# make fuzz: every harness in tests/fuzz/fuzz_*.c under libFuzzer with ASan+UBSan, for
# FUZZ_SECONDS each (default 60), against a clang-built, CPU-only librn in build-fuzz/.
# Corpora in build-fuzz/corpus/NAME/ start from files the tools write (a checkpoint from
# rn-init, its safetensors from rn-export, a dataset from rn-prep: its records, __info__
# and classes.txt, a list file, JPEGs from tests/data/mkimages.py, PNGs, WebPs, PPM/PGMs and
# BMPs from tests/data/mkformats.py). A crash, timeout or
# out-of-memory input is copied to tests/fuzz/regress/NAME/, which make test replays.
# One libFuzzer process at a time (no -jobs: that would log to ./fuzz-N.log instead).
# Installs clang (as root) only when this target runs.
FUZZ_SECONDS ?= 60
# FUZZ_RUNS=N also stops a harness after N executions (the closing run of issue 13:
# make fuzz FUZZ_SECONDS=600 FUZZ_RUNS=1000000)
FUZZ_RUNS ?= -1
FUZZ_BUILD := build-fuzz
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
# inputs a harness reads: a checkpoint or safetensors header needs room; the rest is small
FUZZ_MAXLEN_ckpt := 1048576
FUZZ_MAXLEN_safetensors := 262144
FUZZ_MAXLEN_jpeg := 131072
FUZZ_MAXLEN_imgfile := 131072
FUZZ_MAXLEN_sample := 131072
FUZZ_MAXLEN_cli := 256
rparen := )
FUZZ_CASE := $(foreach n,$(FUZZ_NAMES),$(if $(FUZZ_MAXLEN_$(n)),$(n)$(rparen) max=$(FUZZ_MAXLEN_$(n));;))
FUZZ_SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -Wno-pass-failed

.PHONY: fuzz fuzz-build fuzz-seeds
fuzz: fuzz-build fuzz-seeds
	@total=0; for n in $(FUZZ_NAMES); do \
	  c=$(FUZZ_BUILD)/corpus/$$n; a=$(FUZZ_BUILD)/artifacts/$$n; mkdir -p $$c $$a; \
	  max=65536; case $$n in $(FUZZ_CASE) esac; \
	  $(FUZZ_BUILD)/fuzz/fuzz_$$n $$c -max_total_time=$(FUZZ_SECONDS) -runs=$(FUZZ_RUNS) -max_len=$$max -rss_limit_mb=2048 \
	    -timeout=10 -print_final_stats=1 -artifact_prefix=$$a/ >$(FUZZ_BUILD)/fuzz-$$n.log 2>&1; \
	  execs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_BUILD)/fuzz-$$n.log); \
	  secs=$$(sed -n 's/^stat::.*//;s/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' $(FUZZ_BUILD)/fuzz-$$n.log); \
	  found=$$(ls $$a | wc -l); total=$$((total + found)); \
	  echo "fuzz $$n: $${execs:-?} executions in $${secs:-?} s, $$found crash/timeout/oom inputs (log $(FUZZ_BUILD)/fuzz-$$n.log)"; \
	  if [ $$found -gt 0 ]; then mkdir -p tests/fuzz/regress/$$n; cp $$a/* tests/fuzz/regress/$$n/; fi; \
	done; \
	if [ $$total -gt 0 ]; then echo "fuzz: $$total inputs copied to tests/fuzz/regress/: fix the bugs, then commit them (make test replays them)"; exit 1; fi

# clang only for this target (make deps does not install it)
fuzz-build:
	@command -v clang >/dev/null || if [ "$$(id -u)" = 0 ]; then echo "fuzz: installing clang"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang; \
	else echo "fuzz: clang is missing; run as root: apt-get install -y clang" >&2; exit 1; fi
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang USE_CUDA=0 SANITIZE=1 \
	  SANFLAGS="$(FUZZ_SANFLAGS) -fsanitize=fuzzer-no-link" \
	  $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz/fuzz_%) $(FUZZ_BUILD)/bin/rn-init $(FUZZ_BUILD)/bin/rn-export $(FUZZ_BUILD)/bin/rn-prep

$(FUZZ_BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(LIBRN)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer $< $(LIBRN) $(LDFLAGS) $(LDLIBS) -o $@

# seeds: what the tools write, plus the committed seeds and regression inputs. The jpeg
# and sample harnesses read 8 parameter bytes before their input, imgfile 1.
FUZZ_W := $(FUZZ_BUILD)/seeds
FUZZ_BIN_DIR := $(FUZZ_BUILD)/bin
fuzz-seeds: fuzz-build
	@set -e; w=$(FUZZ_W); c=$(FUZZ_BUILD)/corpus; rm -rf $$w; mkdir -p $$w; \
	for n in $(FUZZ_NAMES); do mkdir -p $$c/$$n; \
	  for d in tests/fuzz/seeds/$$n tests/fuzz/regress/$$n; do [ -d $$d ] && cp $$d/* $$c/$$n/ 2>/dev/null || true; done; done; \
	$(FUZZ_BIN_DIR)/rn-init --arch resnet18 --classes 2 -o $$w/init.pb >/dev/null; \
	$(FUZZ_BIN_DIR)/rn-export $$w/init.pb $$w/init.safetensors >/dev/null; \
	head -c $(FUZZ_MAXLEN_ckpt) $$w/init.pb >$$c/ckpt/init-head.pb; \
	$(PYTHON) tests/fuzz/ckpt_seed.py $$w/init.pb $$c/ckpt/init-nodata.pb 0 0; \
	$(PYTHON) tests/fuzz/ckpt_seed.py $$w/init.pb $$c/ckpt/init-cut.pb 16 3; \
	head -c $(FUZZ_MAXLEN_safetensors) $$w/init.safetensors >$$c/safetensors/init-head.safetensors; \
	$(PYTHON) tests/fuzz/st_seed.py $$w/init.safetensors $$c/safetensors; \
	$(PYTHON) tests/data/mkimages.py folder $$w/img --classes 2 --per-class 3 --size 40x30 --vary --seed 1 >/dev/null; \
	$(PYTHON) tests/data/mkimages.py broken $$w/broken >/dev/null; \
	$(PYTHON) tests/data/mkimages.py list $$w/img $$w/list.txt >/dev/null; \
	$(PYTHON) tests/data/mkformats.py png $$w/png --size 13 >/dev/null; \
	$(PYTHON) tests/data/mkformats.py pngbroken $$w/pngbad >/dev/null; \
	$(PYTHON) tests/data/mkformats.py webp $$w/webp --size 13 >/dev/null; \
	$(PYTHON) tests/data/mkformats.py webpbroken $$w/webpbad >/dev/null; \
	$(PYTHON) tests/data/mkformats.py pnm $$w/pnm --size 13 >/dev/null; \
	$(PYTHON) tests/data/mkformats.py bmp $$w/bmp --size 13 >/dev/null; \
	for f in $$(find $$w/png $$w/pngbad $$w/webp $$w/webpbad $$w/pnm $$w/bmp -type f -size -100k); do \
	  for p in 00 01; do { printf "\x$$p"; cat $$f; } >$$c/imgfile/$$p-$$(basename $$f); done; done; \
	cp $$w/list.txt $$c/list/; \
	ASAN_OPTIONS=detect_leaks=0 $(FUZZ_BIN_DIR)/rn-prep $$w/img $$w/ds.lmdb >/dev/null 2>&1; \
	ASAN_OPTIONS=detect_leaks=0 $(FUZZ_BIN_DIR)/rn-prep --gray --resize 20 $$w/img $$w/gray.lmdb >/dev/null 2>&1; \
	cp $$w/ds.lmdb/classes.txt $$c/classes/; \
	for f in $$(find $$w/img $$w/broken -name '*.jpg' -size -100k); do \
	  for p in 00000000 03ff8040 c0ffee11; do { printf "$$(echo $$p | sed 's/../\\x&/g')"; printf '\x20\x10\x00\x00'; cat $$f; } \
	    >$$c/jpeg/$$p-$$(basename $$f); done; done; \
	for ds in ds gray; do mdb_dump $$w/$$ds.lmdb | $(PYTHON) -c 'import sys,binascii; \
	l=[x.strip() for x in sys.stdin]; l=l[l.index("HEADER=END")+1:]; \
	kv=[(binascii.unhexlify(l[i]),binascii.unhexlify(l[i+1])) for i in range(0,len(l)-1,2) if l[i]!="DATA=END"]; \
	d=sys.argv[1]; p=sys.argv[2]; \
	[open(d+"/info/"+p+".info","wb").write(v) for k,v in kv if k==b"__info__"]; \
	[open(d+"/sample/"+p+"-"+k.decode()+"-"+m,"wb").write(binascii.unhexlify(m)+v) \
	 for k,v in kv if k!=b"__info__" for m in ("0001000000000000","1101ff0000000000","3710000102030400","2d40c00000000001")]' $$c $$ds; done; \
	echo "fuzz: seeds in $$c ($$(ls $$c/* | wc -l) files)"
