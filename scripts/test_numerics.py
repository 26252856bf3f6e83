"""``make test-numerics``: the tests that train or run a model, run again under perturbed arithmetic and
randomness, one perturbation at a time, so that no expectation rests on how one CPU happens to round.

    python scripts/test_numerics.py [--only NAME,...] [--list] [PATH ...] [-- PYTEST_ARG ...]

The perturbations (each a whole pytest run of PATHS, default ``DEFAULT_PATHS``, with these variables set):

    gemm-blas    every fastqa GEMM on BLAS (``FASTQA_CPU_GEMM=blas``) and, in turn,
    gemm-onednn  every one on oneDNN: the two engines round differently, and ``auto`` (the default) picks the
                 faster per machine, so another CPU multiplies on the other one (where the two run at nearly
                 the same speed, as on some, ``auto`` may pick either from one run to the next)
    onednn-avx2  oneDNN limited to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``) and used for every fastqa GEMM
                 (``FASTQA_CPU_GEMM=onednn``): the vector width and kernels of an older CPU
    aten-default torch's own CPU kernels without vector extensions (``ATEN_CPU_CAPABILITY=default``)
    seed         another seed for the toy models the test fixtures train (``FASTQA_TEST_SEED``, read by
                 ``tests/helpers.py``)

Every perturbation runs to the end (no ``-x``), so all failures show; the summary names each failing test
with the perturbation it failed under, and the exit status is 1 when any failed. An extension built without
``-march=native`` (``FASTQA_NATIVE=0``) is not among them: it is a second build of the extension and a copy
of the package to import it from, more than the perturbations above add.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The tests that train or run a model and check what it outputs.
DEFAULT_PATHS = ["tests/models", "tests/tasks", "tests/train", "tests/test_export.py"]
OTHER_SEED = "7"


def _onednn_engine() -> str:
    """Why fastqa cannot multiply on oneDNN here, or "" when it can."""
    code = ("import json; from fastqa._backend import cpu_gemm_info; i = cpu_gemm_info() or {}; "
            "print(json.dumps({'onednn': i.get('onednn_available'), 'error': i.get('error', '') if i else "
            "'the C++ extension is not built'}))")
    env = {k: v for k, v in os.environ.items() if k != "FASTQA_CPU_GEMM"}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             timeout=300, cwd=ROOT).stdout.strip().splitlines()[-1]
        info = json.loads(out)
    except (subprocess.SubprocessError, IndexError, ValueError) as e:
        return f"could not ask the extension about its GEMM engines ({e})"
    if info["error"]:
        return f"no C++ extension GEMM here ({info['error']})"
    return "" if info["onednn"] else "this torch has no usable oneDNN: BLAS is the only engine"


def perturbations() -> list[tuple[str, dict[str, str], str]]:
    """(name, the variables it sets, why it is skipped or "")."""
    no_onednn = _onednn_engine()
    return [
        ("gemm-blas", {"FASTQA_CPU_GEMM": "blas"}, ""),
        ("gemm-onednn", {"FASTQA_CPU_GEMM": "onednn"}, no_onednn),
        ("onednn-avx2", {"ONEDNN_MAX_CPU_ISA": "AVX2", **({} if no_onednn else {"FASTQA_CPU_GEMM": "onednn"})}, ""),
        ("aten-default", {"ATEN_CPU_CAPABILITY": "default"}, ""),
        ("seed", {"FASTQA_TEST_SEED": OTHER_SEED}, ""),
    ]


def _failures(log: str) -> list[str]:
    """The FAILED / ERROR lines of pytest's short summary (``-ra``)."""
    return [ln.strip() for ln in log.splitlines() if ln.startswith(("FAILED ", "ERROR "))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", default=DEFAULT_PATHS, help="test files or folders (default: %(default)s)")
    p.add_argument("--only", help="comma-separated perturbation names (default: all)")
    p.add_argument("--list", action="store_true", help="print the perturbations and exit")
    args = p.parse_args(argv)
    todo = perturbations()
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {name for name, _, _ in todo})
        if unknown:
            p.error(f"--only: unknown perturbation {', '.join(unknown)}; "
                    f"choose from {', '.join(name for name, _, _ in todo)}")
        todo = [t for t in todo if t[0] in names]
    if args.list:
        for name, env, why in todo:
            print(f"{name:13} {' '.join(f'{k}={v}' for k, v in env.items()) or '-'}{f'  (skipped: {why})' if why else ''}")
        return 0

    # SIGTERM (a CI job cancelled) unwinds like Ctrl-C, so the pytest under way is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    started = time.monotonic()
    for name, env, why in todo:
        setting = " ".join(f"{k}={v}" for k, v in env.items())
        if why:
            print(f"\n=== test-numerics: {name}: skipped ({why})", flush=True)
            results.append((name, setting, "skipped", 0.0, []))
            continue
        print(f"\n=== test-numerics: {name}: {setting} pytest {' '.join(args.paths)}", flush=True)
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", *args.paths, "-q", "-p", "no:cacheprovider", *extra]
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                lines.append(line)
            rc = proc.wait()
        finally:
            if proc.poll() is None:  # stopped (Ctrl-C, SIGTERM): the run of the perturbation stops too
                proc.terminate()
                proc.wait()
        failed = _failures("".join(lines))
        status = "passed" if rc == 0 else f"FAILED (pytest exit {rc})"
        results.append((name, setting, status, time.monotonic() - t0, failed))

    print(f"\n=== test-numerics summary ({(time.monotonic() - started) / 60:.1f} min)")
    for name, setting, status, seconds, failed in results:
        print(f"{name:13} {status:24} {seconds / 60:5.1f} min  {setting}")
        for f in failed:
            print(f"    [{name}] {f}")
    return 1 if any(r[2].startswith("FAILED") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
