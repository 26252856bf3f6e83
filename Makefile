# The README's two commands: `make bench` (main job) and `make test`. Both set up .venv on a fresh
# machine, idempotently: the venv sees system site-packages so an installed torch is reused, and
# torch==2.13.0 (CPU build) is installed only when no torch is importable at all.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?=
PYTEST_ARGS ?=
EXT_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') CMakeLists.txt setup.py pyproject.toml

.PHONY: test bench bench-models install clean

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(VENV)/.torch-ok: | $(PY)
	@$(PY) -c "import torch; print('fastqa: reusing torch', torch.__version__)" 2>/dev/null \
	  || $(PY) -m pip install torch==2.13.0
	@touch $@

$(VENV)/.build-deps-ok: $(VENV)/.torch-ok
	$(PY) -m pip install -q "setuptools>=77" wheel "pybind11>=2.10" "cmake>=3.18" ninja
	@touch $@

# Editable install: Python edits need nothing; C++ edits rebuild through CMake + Ninja (incremental).
$(VENV)/.fastqa-installed: $(VENV)/.build-deps-ok $(EXT_SOURCES)
	$(PY) -m pip install -q --no-build-isolation -e ".[test,bench,triton,models]"
	@touch $@

install: $(VENV)/.fastqa-installed

test: install
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: install
	$(PY) -m benchmarks $(BENCH_ARGS)

# The model cases (QANet train step / inference, ConvS2S translation and train step): tens of minutes.
bench-models: install
	$(PY) -m benchmarks --models --ops qanet qa_readers convs2s_translate convs2s_train_step $(BENCH_ARGS)

clean:
	rm -rf build $(VENV) fastqa/_C*.so *.egg-info
