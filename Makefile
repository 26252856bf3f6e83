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
# The Triton of the GPU machine's image, for `make gpu-compile` only (the venv's own triton runs the interpreter
# tests): installed into a private folder that scripts/gpu_compile.py finds first on PYTHONPATH.
TRITON_PIN := 3.6.0
TRITON_PIN_DIR := $(VENV)/triton-$(TRITON_PIN)
GPU_COMPILE_ARGS ?=
LINT_PATHS := fastqa triton_kernels benchmarks tests scripts setup.py
EXT_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') CMakeLists.txt setup.py pyproject.toml

.PHONY: test test-quick test-gpu-compile test-numerics lint wheel-check bench bench-models bench-bf16 gpu-check gpu-compile triton-pin install clean

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
	$(PY) scripts/setup_env.py pip-build --no-build-isolation --no-deps -e .
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

# The test suite but the GPU compile check (about 15 minutes from a fresh clone on 2 cores).
test: lint
	$(PY) -m pytest tests --ignore=tests/test_gpu_compile.py $(PYTEST_ARGS)

# The GPU compile check as a test (tests/test_gpu_compile.py: every Triton kernel compiled for sm_90 and sm_80 under
# the pinned Triton, no spills where the models run, the docs' table current): about 11 minutes on a cold cache,
# seconds on a warm one. CI runs it after `make test`.
test-gpu-compile: install triton-pin
	$(PY) -m pytest tests/test_gpu_compile.py -q $(PYTEST_ARGS)

# What a change to one op or one command needs first (about a minute on 2 cores; the whole suite about 15):
# lint, the layering, the argument checks, the conventions every op shares, backend selection, the command line
# (one-line usage errors, bounds) and the set-up. TESTS= adds the changed op's or command's own file:
# make test-quick TESTS=tests/ops/test_glu_conv1d.py
QUICK_TESTS := tests/test_layering.py tests/test_checks.py tests/ops/test_op_conventions.py tests/ops/test_backend.py \
  tests/test_cli.py tests/test_usage_errors.py tests/test_bounds.py tests/test_setup_env.py
TESTS ?=
test-quick: lint
	$(PY) -m pytest $(QUICK_TESTS) $(TESTS) -q $(PYTEST_ARGS)

# The model, task and train tests again under perturbed arithmetic and randomness, one perturbation at a time
# (every GEMM on BLAS, then on oneDNN; oneDNN limited to AVX2; torch's kernels without vector extensions;
# another seed for the toy models), each run to the end, the summary naming the perturbation of each
# failure (scripts/test_numerics.py; about 18 minutes on 2 cores). NUMERICS_ARGS="--only seed" picks some.
NUMERICS_ARGS ?=
test-numerics: install
	$(PY) scripts/test_numerics.py $(NUMERICS_ARGS)

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

# The model cases (QANet train step / inference, ConvS2S translation and train step): tens of minutes.
bench-models: install
	$(PY) -m benchmarks --models --ops qanet qa_readers convs2s_translate convs2s_train_step $(BENCH_ARGS)

# bf16 against fp32 on the CPU, interleaved in one process: every fused op's cases and the model cases.
bench-bf16: install
	$(PY) -m benchmarks.cpu_bf16 --models --threads 2 --out bench-results/cpu-bf16.json $(BENCH_ARGS)

# The GPU path end to end on a CUDA machine whose python3 has torch and Triton (a GPU image): no venv, no
# network, no extension build; at most --budget-s (default 400 s) of phases. $(OUT)/ gets summary.txt,
# summary.json and gpu-check.tgz. docs/development.md gives the device call.
gpu-check:
	PYTHON=$(PYTHON) scripts/gpu_check.sh $(OUT) $(GPU_CHECK_ARGS)

# triton==$(TRITON_PIN) in $(TRITON_PIN_DIR), once (pip's --target folder, no dependencies: torch is the venv's).
$(TRITON_PIN_DIR)/.installed: | $(PY)
	rm -rf $(TRITON_PIN_DIR)
	$(PY) -m pip install -q --no-deps --target $(TRITON_PIN_DIR) triton==$(TRITON_PIN)
	PYTHONPATH=$(TRITON_PIN_DIR) $(PY) -c "import triton, sys; sys.exit(triton.__version__ != '$(TRITON_PIN)')"
	@touch $@

# For `make test`: without registry access the install fails and tests/test_gpu_compile.py says so (it fails
# under CI=true and skips elsewhere), so the failure does not stop the other tests here.
triton-pin: | $(PY)
	@$(MAKE) -s --no-print-directory $(TRITON_PIN_DIR)/.installed \
	  || echo "fastqa: could not install triton==$(TRITON_PIN) into $(TRITON_PIN_DIR): tests/test_gpu_compile.py cannot run"

# Every Triton kernel compiled without a GPU for sm_90 and sm_80 under triton==$(TRITON_PIN): fails on compile
# errors, shared memory over the limit and spills the models can reach; writes the resource table into
# docs/gpu-compile.md (results cached in $(VENV)/gpu-compile-cache.json). scripts/gpu_compile.py --help.
gpu-compile: install $(TRITON_PIN_DIR)/.installed
	env -u TRITON_INTERPRET PYTHONPATH=$(TRITON_PIN_DIR)$${PYTHONPATH:+:$$PYTHONPATH} \
	  $(PY) scripts/gpu_compile.py --expect-triton $(TRITON_PIN) --write-docs $(GPU_COMPILE_ARGS)

clean:
	rm -rf build $(VENV) fastqa/_C*.so *.egg-info
