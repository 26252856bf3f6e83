# `make test` and `make bench` set up .venv on a fresh machine, idempotently, and reuse an installed torch:
# the venv sees the packages of the interpreter that made it (also when that interpreter is itself a
# virtualenv holding a preinstalled CUDA torch), and torch==2.13.0 (the CPU build) is installed only when no
# torch is importable at all. Nothing already present is reinstalled, so the set-up runs offline once its
# packages are there; optional packages that cannot be installed are listed and their tests skip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?=
PYTEST_ARGS ?=
OUT ?= gpu-check-results
GPU_CHECK_ARGS ?=
EXTRAS := test bench triton models serve
LINT_PATHS := fastqa triton_kernels benchmarks tests scripts setup.py
EXT_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') CMakeLists.txt setup.py pyproject.toml

.PHONY: test lint wheel-check bench bench-models gpu-check install clean

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PYTHON) scripts/setup_env.py link-host $(VENV)

$(VENV)/.torch-ok: | $(PY)
	@$(PY) -c "import torch; print('fastqa: reusing torch', torch.__version__)" 2>/dev/null \
	  || $(PY) -m pip install torch==2.13.0
	@touch $@

$(VENV)/.build-deps-ok: $(VENV)/.torch-ok
	$(PY) scripts/setup_env.py require "setuptools>=77" wheel "pybind11>=2.10" "cmake>=3.18" ninja
	@touch $@

# Editable install: Python edits need nothing; C++ edits rebuild through CMake + Ninja (incremental).
$(VENV)/.fastqa-installed: $(VENV)/.build-deps-ok $(EXT_SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(PY) scripts/setup_env.py optional $(EXTRAS)
	@touch $@

install: $(VENV)/.fastqa-installed

# Static checks (pyflakes rules and the error-prone pycodestyle ones; pyproject.toml [tool.ruff]).
lint: install
	@if $(PY) -m ruff --version >/dev/null 2>&1; then $(PY) -m ruff check $(LINT_PATHS); \
	  else echo "fastqa: ruff is not installed here; static checks skipped"; fi

# The wheel built the README's way, installed into a fresh venv, used from there (tests/test_wheel.py).
wheel-check: install
	$(PY) -m pytest tests/test_wheel.py -q $(PYTEST_ARGS)

test: lint
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

# The model cases (QANet train step / inference, ConvS2S translation and train step): tens of minutes.
bench-models: install
	$(PY) -m benchmarks --models --ops qanet qa_readers convs2s_translate convs2s_train_step $(BENCH_ARGS)

# The GPU path end to end on a CUDA machine (at most 8 minutes on one H100): summary under $(OUT)/;
# e.g. GPU_CHECK_ARGS="--budget-s 400" where the set-up shares the time limit.
gpu-check: install
	$(PY) scripts/gpu_check.py --out $(OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf build $(VENV) fastqa/_C*.so *.egg-info
