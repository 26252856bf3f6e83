"""Every training run of these tests keeps its machine GEMM decisions in a temporary cache folder, never in
the user's ``~/.cache/fastqa`` (subprocesses inherit the variable)."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def private_gemm_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTQA_CACHE_DIR", str(tmp_path_factory.mktemp("fastqa-cache")))
        yield
