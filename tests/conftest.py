"""Test set-up shared by every test file (op tests and the model tests alike).

Triton kernels run in the interpreter on CPU tensors when there is no GPU: TRITON_INTERPRET must be
set before triton.jit decorates the kernels, so it is set here, before any fastqa import.

Fixtures: ``backend`` (every compiled backend usable here: "cpu" where fastqa._C is built, "triton"
where Triton runs), ``device`` (the device that backend's tensors live on) and ``dtype`` (float32);
``ieee_fp32`` (every test: TF32 off for cuDNN and cuBLAS, so fp32 references are IEEE fp32 on a GPU).
GPU-only tests are marked ``gpu`` (``pytest -m gpu`` selects them) and skip without CUDA.
The tolerance table is ``helpers.TOLERANCES`` (``from helpers import assert_close, TOLERANCES``).
"""
import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Caches (preprocessed data, the machine's GEMM decisions) go to a folder of the test run, not the user's.
os.environ.setdefault("FASTQA_CACHE_DIR", tempfile.mkdtemp(prefix="fastqa-test-cache-"))

torch.backends.cudnn.deterministic = True

from helpers import compiled_backends, device_of  # noqa: E402


@pytest.fixture(params=compiled_backends())
def backend(request) -> str:
    """Each compiled backend usable here ("cpu", "triton")."""
    return request.param


@pytest.fixture
def device(backend: str) -> torch.device:
    """Where ``backend``'s tensors live."""
    return device_of(backend)


@pytest.fixture
def dtype() -> torch.dtype:
    """The dtype op tests run in unless they sweep dtypes."""
    return torch.float32


@pytest.fixture(autouse=True)
def ieee_fp32():
    """fp32 references in IEEE fp32 on a GPU: cuDNN convolutions (the GLU and depthwise references) and cuBLAS
    matmuls may otherwise run on TF32 tensor cores (cuDNN does by default), whose 10-bit operands put the
    reference itself ~1e-3 off. Restored after each test."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(autouse=True, scope="module")
def one_thread_for_models(request):
    """Tests outside ``tests/ops`` run tiny models on one torch thread, so no op waits on a second core
    that another process keeps busy (on a loaded 2-core machine two threads made tiny steps much slower)."""
    if "ops" in request.path.parent.parts:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _serves_models(item) -> bool:
    """The ``fastqa serve`` tests that train two tiny models and serve them (tests/serve/test_api.py, test_page.py,
    test_bounds_api.py)."""
    return item.path.parent.name == "serve" and item.path.name in ("test_api.py", "test_page.py", "test_bounds_api.py")


def _needs_serve_extra(item) -> bool:
    """The ``fastqa serve`` tests that start a server (the batcher's and most command-line tests need no server)."""
    return _serves_models(item) or item.name in ("test_serve_on_a_port_in_use", "test_serve_a_folder_without_a_checkpoint")


# Optional packages (the `models`, `test` and `serve` extras) that a machine without registry access may lack:
# the tests that need one skip with a reason instead of failing. Keys: module; values: which tests need it.
_OPTIONAL = {
    "spacy": lambda item: "tasks" in item.path.parts or item.path.name == "test_lstm_readers.py" or _serves_models(item),
    "sacrebleu": lambda item: "tasks" in item.path.parts or _serves_models(item),
    "expecttest": lambda item: "opcheck" in item.name,
    "fastapi": _needs_serve_extra,
    "uvicorn": _needs_serve_extra,
    "prometheus_client": _needs_serve_extra,
}


def pytest_collection_modifyitems(config, items):
    import importlib.util

    missing = [name for name in _OPTIONAL if importlib.util.find_spec(name) is None]
    for item in items:
        for name in missing:
            if _OPTIONAL[name](item):
                item.add_marker(pytest.mark.skip(reason=f"needs the optional package {name!r} (not installed here)"))
    # The GPU compile check's tests last: their check runs in the background meanwhile (pytest_collection_finish).
    items[:] = [i for i in items if not _gpu_compile(i)] + [i for i in items if _gpu_compile(i)]


def _gpu_compile(item) -> bool:
    return item.path.name == "test_gpu_compile.py"


_GPU_COMPILE_MODULES: list = []


def pytest_collection_finish(session):
    """Start the GPU compile check (tests/test_gpu_compile.py) now, in the background, when this session runs a
    test that needs its report: it compiles on the core the other tests leave idle."""
    if session.config.option.collectonly:
        return
    for item in session.items:
        if _gpu_compile(item) and "report" in getattr(item, "fixturenames", ()):
            _GPU_COMPILE_MODULES.append(item.module)
            item.module.start()
            return


def pytest_sessionfinish(session, exitstatus):
    for module in _GPU_COMPILE_MODULES:
        module.stop()
