"""``make gpu-check``: prove the GPU path in one unattended command and write what it found.

    scripts/gpu_check.sh OUT [ARGS]                                # on a GPU image: no venv, no build (make gpu-check)
    python scripts/gpu_check --out gpu-check-results               # the same phases, from the checkout
    python scripts/gpu_check --tiny --out /tmp/gc                  # every phase on tiny shapes (CPU is fine)
    python scripts/gpu_check --phases b,c --budget-s 200           # some phases, a smaller global budget

Writes ``summary.txt`` and ``summary.json`` under ``--out`` (rewritten after every phase, so a run cut
short still leaves what it did), the phases' logs under ``--out/logs`` and the benchmark's results under
``--out/bench``. The header gives the versions (Python, torch, Triton, CUDA, ``fastqa.info()``) and the
device; then the phases, in the order of what they are worth:

  b  every op against the float64 reference (``fastqa.reference`` in float64 on the same device), fp32
     and bf16, at the models' shapes: max abs and relative error of the output and every gradient, and
     eager PyTorch's own error in the same dtype beside it
  f  per op, fastqa against eager: ms per call, the host's ms to issue it, and the kernels alone (a CUDA
     graph replayed): whether an op is bound by its launching or by its kernels
  c  QANet ``paper`` B32 train step and inference: fast layers vs reference layers vs torch.compile of
     the reference model, bf16 autocast and fp32: ms/step, the host's share, host syncs and kernel
     launches per step, and a host profile of the fast bf16 step
  d  ConvS2S ``tutorial``: train step, greedy and beam-5 translation of 200 generated sentences
     (incremental vs full recompute), sentences/s
  e  ``python -m benchmarks --quick`` on the device
  a  the GPU test classes: ``pytest -m gpu tests/ops -q -x`` (``-n`` when pytest-xdist is there)

Every phase runs in a process of its own (a CUDA error poisons the process that meets it, and a hung
kernel or compile can only be stopped from outside) under a time box: its budget, plus whatever the
global budget (``--budget-s``) has left over the later phases' budgets; a phase given its own
``--phase-budget`` gets exactly that. A phase whose box is under the least it needs is skipped with a
note; a phase that fails or overruns records what it finished and its error tail, and the run goes on.
Inside phases b, c, d and f each measured item is checked against the clock too, and items that do not
fit are recorded as skipped. The check exits 0 whatever the phases found (the summary says it), so a
command chained after it still runs. Triton kernels run their first configuration unless ``--autotune``.

``--tiny`` shrinks every shape and step count so that all phases run in seconds on a CPU (the device is
the CPU when there is no GPU): the test suite runs it.
"""
from __future__ import annotations

# The modules (this docstring is the --help text, so the layout is told here): supervisor (the command line,
# the phases in order, time boxes, child processes), child (a phase child and its Recorder), op_phases (b, f),
# model_phases (c, d), command_phases (a, e), measuring (the children's measurements; the timing itself is
# benchmarks.measure's), report (the targets, summary.txt), environment (the header), processes, common.

from .supervisor import KILL_GRACE_S, PHASE_KEYS, PHASES, main, parse_args, time_box

__all__ = ["KILL_GRACE_S", "PHASES", "PHASE_KEYS", "main", "parse_args", "time_box"]
