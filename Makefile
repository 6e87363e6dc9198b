# The two commands a newcomer runs: `make demo` and `make test`. Each builds .venv on first use.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.stamp-install
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: setup demo test test-all bench lint clean

setup: $(STAMP)

# torch first and pinned: a bare range would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ssl_rec.cli.demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest -q -x

test-all: $(STAMP)
	$(PY) -m pytest -q --runslow

bench: $(STAMP)
	mkdir -p benchmarks/results
	$(PY) benchmarks/data.py --json benchmarks/results/data.json
	$(PY) benchmarks/embedding.py --json benchmarks/results/embedding.json
	$(PY) benchmarks/mixed_precision.py --json benchmarks/results/mixed_precision.json
	$(PY) benchmarks/label_efficiency.py --json benchmarks/results/label_efficiency.json
	$(PY) benchmarks/label_efficiency.py --preset hard --json benchmarks/results/label_efficiency_hard.json
	$(PY) benchmarks/real_data.py --json benchmarks/results/real_data.json
	$(PY) benchmarks/retrieval.py --json benchmarks/results/retrieval.json

lint: $(STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf runs .cache .pytest_cache
