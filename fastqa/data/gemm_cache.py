"""The CPU kernels' rounding decisions -- GEMM engines and bf16 routes -- made once per machine and reused by
every later training run.

Why: with ``FASTQA_CPU_GEMM=auto`` (the default) the C++ kernels time BLAS against torch's oneDNN -- once
for the process's engine and once per new GEMM shape -- and keep the faster one (``csrc/cpu/gemm.h``). The
two engines round differently, and on a machine where they run at nearly the same speed the timing can
come out either way, so two runs of the same command could train on different engines and their losses
part after a few steps.

The rule: the first training run on a machine measures, as before, and writes what it decided to a small
JSON file in the user's cache folder (``$FASTQA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastqa``, else
``~/.cache/fastqa``; the file is ``cpu-gemm.json``). Every later run restores those decisions before its
first step, so it multiplies each shape on the same engine and its losses are bit-identical. The entry's
key is what the decision depends on: the CPU model, its SIMD instruction sets, the torch version and the
thread count; a machine with another processor, another torch or another ``--threads`` measures afresh
and adds its own entry. Shapes first met later in a run (a longer batch, the evaluation's batches) are
measured when met and added to the entry at the next step boundary, so the next run restores them too.
Decisions already in the file are never replaced: the first measurement of a shape stays the machine's.

bfloat16 routes: a bf16 op with two ways to run (native bf16 products, or widened to float32 and run by the
float32 kernel; ``csrc/cpu/gemm.h``) times both the first time it meets a shape class and keeps the faster,
which makes bf16 no slower than float32 wherever the native route loses. The routes round differently, so they
follow the same rule: kept in the same entry (``routes``: op, shape class, threads, route), restored before the
first step, new ones added at step boundaries, saved in checkpoints with the GEMM plan.

What does not use the file: ``FASTQA_CPU_GEMM=blas|onednn`` (one engine everywhere, nothing to decide; the bf16
routes are then measured per process, still fixed within it and saved in checkpoints), a torch without usable
oneDNN (BLAS only), and a process without the C++ extension; ``FASTQA_CPU_BF16_ROUTE=native|widen`` forces a
route (nothing measured or recorded). A resumed run also
restores the checkpoint's own plan after this one, so ``--resume`` multiplies exactly as the interrupted
process did even if the machine's file was deleted or edited meanwhile. To measure again, delete the
file. If the cache folder cannot be written, training goes on with per-process measurement and a warning.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any, Iterator

import torch

from .._backend import cpu_gemm_info, cpu_gemm_plan, restore_cpu_gemm_plan
from ..data.files import atomic_write_json, user_cache_dir

try:
    import fcntl
except ImportError:  # Windows: concurrent writers may drop each other's new shapes (each still restores)
    fcntl = None  # type: ignore[assignment]

__all__ = ["CACHE_FILE", "machine_key", "MachineGemmPlan"]

log = logging.getLogger("fastqa.train")  # the training run's log: the cache is opened by the trainer

CACHE_FILE = "cpu-gemm.json"
FORMAT = "fastqa-cpu-gemm-2"
# Files of the first format hold a process engine chosen on one large product rather than on the kernels' tiles.
_OLD_FORMATS = ("fastqa-cpu-gemm-1",)
# The fields of a shape decision that identify the shape (the rest is the engine).
_SHAPE_KEY = ("m", "k", "n", "threads", "a", "w", "bias", "accumulate")
# The fields of a bf16 route decision that identify the op and shape class (the rest is the route).
_ROUTE_KEY = ("op", "shape", "threads")
_ROUTES = ("native", "widen")
# /proc/cpuinfo flags that name a SIMD instruction set (the rest -- virtualisation, power management,
# mitigations -- do not change which GEMM is faster and vary between kernels on the same chip).
_ISA_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx", "asimd", "sve", "neon")


def _cpu_model_and_isa() -> tuple[str, str]:
    model, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Hardware", "CPU part") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = sorted({w for w in value.split() if w.startswith(_ISA_PREFIXES)})
                if model and flags:
                    break
    except OSError:  # not Linux
        pass
    model = model or platform.processor() or platform.machine() or "unknown cpu"
    capability = torch.backends.cpu.get_cpu_capability()
    return model, " ".join([capability, *flags])


def machine_key(threads: int | None = None) -> str:
    """What a GEMM engine decision depends on, as one line: CPU model, SIMD sets, torch version, threads."""
    model, isa = _cpu_model_and_isa()
    threads = torch.get_num_threads() if threads is None else threads
    return f"{model} | {isa} | torch {torch.__version__} | threads {threads}"


def _shape_key(shape: dict) -> tuple:
    return tuple(shape[k] for k in _SHAPE_KEY)


def _decision(shape: dict) -> dict:
    """A shape decision as stored: the shape and its engine (no measured rates)."""
    return {k: shape[k] for k in (*_SHAPE_KEY, "engine")}


def _route_key(route: dict) -> tuple:
    return tuple(route[k] for k in _ROUTE_KEY)


def _route_decision(route: dict) -> dict:
    """A route decision as stored: the op, shape class and threads, and the route (no measured times)."""
    return {k: route[k] for k in (*_ROUTE_KEY, "route")}


def _valid_plan(plan: Any) -> bool:
    """An entry as written by record(); ``routes`` may be missing (entries written before bf16 routes existed)."""
    routes = plan.get("routes", []) if isinstance(plan, dict) else None
    return (isinstance(plan, dict) and plan.get("engine") in ("blas", "onednn")
            and isinstance(plan.get("shapes"), list)
            and all(isinstance(s, dict) and all(k in s for k in _SHAPE_KEY) and s.get("engine") in ("blas", "onednn")
                    for s in plan["shapes"])
            and isinstance(routes, list)
            and all(isinstance(r, dict) and all(k in r for k in _ROUTE_KEY) and r.get("route") in _ROUTES
                    for r in routes))


class MachineGemmPlan:
    """This machine's cached GEMM engine and bf16 route decisions for the current thread count: ``restore()``
    them into the process before training, ``record()`` the process's new ones at step boundaries. ``open()``
    returns None where there is nothing to decide (engine forced, no oneDNN, no extension)."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self._known = -1      # how many of this process's shape decisions the file holds (-1: no entry yet)
        self._known_routes = -1  # the same for its bf16 route decisions
        self._broken = False  # the cache folder could not be written: stop trying

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> "MachineGemmPlan | None":
        """The cache at ``path`` (default: ``user_cache_dir() / CACHE_FILE``) for this machine, or None."""
        # The first call of cpu_gemm_info measures the process's engine, which the first op would do anyway.
        info = cpu_gemm_info()
        if info is None or "error" in info or info.get("requested") != "auto" or not info.get("onednn_available"):
            return None
        return cls(Path(path) if path is not None else user_cache_dir() / CACHE_FILE, machine_key())

    def _read(self) -> dict:
        """The whole file ({} when missing); a damaged file is reported and treated as empty (it is a
        cache: the next write replaces it)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable GEMM plan cache (%s); measuring again", self.path, e)
            return {}
        if isinstance(data, dict) and data.get("format") in _OLD_FORMATS:
            log.info("%s: written by an earlier fastqa, which chose its engines another way; measuring again",
                     self.path)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("machines"), dict):
            log.warning("%s: not a fastqa GEMM plan cache; measuring again", self.path)
            return {}
        return data

    def cached(self) -> dict | None:
        """The plan stored for this machine key, or None."""
        plan = self._read().get("machines", {}).get(self.key)
        if plan is None:
            return None
        if not _valid_plan(plan):
            log.warning("%s: the entry for this machine is malformed; measuring again", self.path)
            return None
        return {"engine": plan["engine"], "shapes": [_decision(s) for s in plan["shapes"]],
                "routes": [_route_decision(r) for r in plan.get("routes", [])]}

    def restore(self) -> bool:
        """Make this process use the cached decisions; True when there were some."""
        plan = self.cached()
        if plan is None:
            return False
        try:
            restore_cpu_gemm_plan(plan)
        except Exception as e:  # a hand-edited entry with values of the wrong type: it is only a cache
            log.warning("%s: the entry for this machine cannot be restored (%s); measuring again", self.path, e)
            return False
        self._known, self._known_routes = len(plan["shapes"]), len(plan["routes"])
        log.debug("restored %d GEMM shape and %d bf16 route decisions from %s", len(plan["shapes"]),
                  len(plan["routes"]), self.path)
        return True

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Serialise read-merge-write among processes of this machine (two runs starting together)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def record(self) -> None:
        """Add the decisions this process made since the last call to the machine's entry (cheap when there
        are none). Never replaces a decision already in the file."""
        if self._broken:
            return
        plan = cpu_gemm_plan()
        if plan is None or (len(plan["shapes"]) <= self._known and len(plan["routes"]) <= self._known_routes):
            return
        try:
            with self._exclusive():
                data = self._read() or {"format": FORMAT, "machines": {}}
                entry = data["machines"].get(self.key)
                fresh = not _valid_plan(entry)
                if fresh:  # the first run on this machine: its process engine becomes the machine's
                    entry = {"engine": plan["engine"], "shapes": []}
                seen = {_shape_key(s) for s in entry["shapes"]}
                new = [s for s in plan["shapes"] if _shape_key(s) not in seen]
                routes = entry.get("routes", [])
                seen_routes = {_route_key(r) for r in routes}
                new_routes = [r for r in plan["routes"] if _route_key(r) not in seen_routes]
                if new or new_routes or fresh:
                    entry["shapes"] = entry["shapes"] + [_decision(s) for s in new]
                    entry["routes"] = routes + [_route_decision(r) for r in new_routes]
                    data["machines"][self.key] = entry
                    atomic_write_json(self.path, data)
        except OSError as e:
            self._broken = True
            log.warning("%s: cannot save the GEMM engine decisions (%s); the next run measures again and may "
                        "round differently", self.path, e.strerror or e)
            return
        self._known, self._known_routes = len(plan["shapes"]), len(plan["routes"])
