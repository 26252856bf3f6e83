#!/usr/bin/env bash
# `make gpu-check`: the package scripts/gpu_check on a machine that already has torch and Triton (a GPU image):
# no virtualenv, no network, no C++ extension build (the GPU path does not use it) -- fastqa runs from this
# checkout, in seconds. OUT receives three files: summary.txt, summary.json and gpu-check.tgz (everything
# else: logs, the benchmark's results, the machine's nvidia-smi), so that a device call returning a few
# files brings all of it back.
#
#     scripts/gpu_check.sh OUT [gpu_check arguments...]          (PYTHON: the interpreter, default python3)
set -u
out=${1:?usage: scripts/gpu_check.sh OUT [gpu_check arguments]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 2
# The kernels ship as fastqa.triton_kernels (setup.py's package_dir); from a checkout, a link stands in for it
# while the check runs (removed after, so that a wheel built from this checkout never packs it twice).
if [ ! -e fastqa/triton_kernels ]; then
  ln -s ../triton_kernels fastqa/triton_kernels
  trap 'rm -f "$repo/fastqa/triton_kernels"' EXIT
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)/gpu-check
mkdir -p "$work" "$out"
python=${PYTHON:-python3}
{ nvidia-smi; "$python" -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; } \
  > "$work/machine.txt" 2>&1
"$python" scripts/gpu_check --out "$work" "$@"
cp "$work"/summary.txt "$work"/summary.json "$out"/ 2>/dev/null
tar czf "$out/gpu-check.tgz" -C "$(dirname "$work")" gpu-check
exit 0
