"""The summary's header: versions (Python, torch, Triton, CUDA, ``fastqa.info()``), the device and the checkout,
read in the supervisor. Never raises: a part that cannot be read says why (torch, Triton, fastqa and the
benchmarks are imported inside guards, so that a broken one is reported rather than stopping the check)."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Sequence

from .common import REPO, short_error


def _run_quiet(cmd: Sequence[str], timeout: float = 10.0) -> str | None:
    """First lines of a tool's output (nvcc, nvidia-smi, git), or None where it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def collect_environment(device_arg: str) -> dict[str, Any]:
    """Versions, device and build: what the header of the summary shows. Never raises: a part that cannot
    be read says why."""
    env: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "platform": platform.platform(), "cpus": os.cpu_count(), "host": platform.node()}
    try:
        import torch
    except Exception as exc:  # without torch nothing else can run; the header says so
        env["torch_error"] = short_error(exc)
        return env
    env["torch"] = torch.__version__
    env["cuda_runtime"] = torch.version.cuda
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as exc:  # absent or broken: the Triton phases then fail and say why
        env["triton"] = None
        env["triton_error"] = short_error(exc)
    device = torch.device(device_arg)
    dev: dict[str, Any] = {"type": device.type}
    if device.type == "cuda":
        try:
            props = torch.cuda.get_device_properties(device)
            dev.update(name=props.name, capability=f"sm_{props.major}{props.minor}",
                       multiprocessors=props.multi_processor_count, memory_gib=round(props.total_memory / 2 ** 30, 1))
        except Exception as exc:
            dev["error"] = short_error(exc)
        dev["driver"] = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        nvcc = _run_quiet(["nvcc", "--version"])
        dev["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
        env["matmul_tf32"] = torch.backends.cuda.matmul.allow_tf32
        env["cudnn_tf32"] = torch.backends.cudnn.allow_tf32
    else:
        try:
            from benchmarks.measure import device_name
            dev["name"] = device_name(device)
        except Exception as exc:
            dev["name"] = f"{platform.processor() or 'CPU'} (benchmarks.measure unimportable: {short_error(exc)})"
        dev["threads"] = torch.get_num_threads()
    env["device"] = dev
    try:
        import fastqa
        env["fastqa"] = fastqa.info()
    except Exception as exc:
        env["fastqa"] = {"error": short_error(exc)}
    rev = _run_quiet(["git", "rev-parse", "--short", "HEAD"])
    if rev:
        dirty = _run_quiet(["git", "status", "--porcelain", "--untracked-files=no"])
        env["git"] = rev + (" (with uncommitted changes)" if dirty else "")
    return env


def environment_lines(env: dict[str, Any]) -> list[str]:
    """The header's lines (device, versions, fastqa, settings, source) of what ``collect_environment`` read."""
    dev = env.get("device", {})
    if dev.get("type") == "cuda" and dev.get("error"):
        dev_line = f"CUDA device unreadable: {dev['error']}"
    elif dev.get("type") == "cuda":
        dev_line = (f"{dev.get('name', '?')} ({dev.get('capability', '?')}, {dev.get('multiprocessors', '?')} SMs, "
                    f"{dev.get('memory_gib', '?')} GiB; driver {dev.get('driver') or '?'}; {dev.get('nvcc') or 'no nvcc'})")
    else:
        dev_line = f"{dev.get('name', '?')} (CPU, {dev.get('threads', '?')} torch threads)"
    fq = env.get("fastqa", {})
    if "error" in fq:
        fq_line = f"unimportable: {fq['error']}"
    else:
        backends = ", ".join(k for k, v in fq.get("backends", {}).items() if v)
        ext = fq.get("cpu_extension") or {}
        fq_line = (f"{fq.get('fastqa')}: backends {backends}; C++ extension "
                   + (f"built ({ext.get('simd')})" if ext else f"missing ({fq.get('cpu_extension_error')})"))
    cuda = (f"CUDA {env.get('cuda_runtime')}, cuDNN {env.get('cudnn')}" if env.get("cuda_runtime") else "no CUDA")
    lines = [f"device   : {dev_line}",
             f"versions : Python {env.get('python')}, torch {env.get('torch', env.get('torch_error'))} ({cuda}), "
             f"Triton {env.get('triton') or 'not installed'}",
             f"fastqa   : {fq_line}"]
    if "matmul_tf32" in env:
        lines.append(f"settings : torch matmul TF32 {env['matmul_tf32']}, cuDNN TF32 {env['cudnn_tf32']} (phase b turns both off)")
    if env.get("git"):
        lines.append(f"source   : git {env['git']}")
    return lines
