"""Ahead-of-time compile check of every Triton kernel of fastqa for real GPU targets, on a machine without a GPU.

``make gpu-compile`` runs this under the pinned Triton (3.6.0, the GPU machine's version) installed in
``.venv/triton-3.6.0`` and put first on PYTHONPATH, with TRITON_INTERPRET unset; ``make test-gpu-compile`` runs it through
tests/test_gpu_compile.py. docs/gpu-compile.md describes the check and carries its table.

1. Record, do not launch: every kernel module's ``launch`` (``triton_kernels/_common.py``, the one launch path of
   every kernel) is replaced by a recorder, and the ops' Triton launchers (the custom ops
   ``torch.ops.fastqa_triton.*``) are called on CPU tensors (uninitialised: nothing launches, and the launchers
   read no values on the host) for the models' shapes (``model_cases``: QANet ``paper`` d 128 and ``small`` d 64,
   ConvS2S ``tutorial`` H 512 and ``small`` H 256; e.g. x [32, 400, 128] into the K 7 encoder conv, c [32, 400,
   128] and q [32, 50, 128] into context-query attention, x [64, 30, 512] into the K 3 GLU conv) and for edge
   shapes and flags the ops accept (``edge_cases``), each in float32 (torch's float32 matmul precision "highest"
   and "high": TF32x3 and TF32 dots), bfloat16 and float16.
2. Specialise each recorded launch as Triton's JIT would on a GPU (its own binder: argument types, ints equal to 1,
   divisibility by 16, constexprs) for every configuration of the kernel's autotuning space (``Autotuner.configs``;
   a plain ``triton.jit`` kernel: the launch options its launcher passes), and evaluate each launch grid (limits
   2^31 - 1, 65535, 65535).
3. Compile each distinct specialisation for sm_90 (H100 / H200) and sm_80 (A100) with
   ``triton.compile(ASTSource(...), target=GPUTarget(...))`` in worker processes (a compiler abort is reported as
   that unit's error): PTX, then a cubin by the ptxas of the Triton wheel, whose ``-v`` log gives registers per
   thread and spill bytes; ``metadata.shared`` the shared memory; ``occupancy`` the theoretical occupancy.

Exit code 1 on what ``findings`` calls failures: a compile error, shared memory over the per-block limit (232448
bytes on sm_90, 166912 on sm_80) in a configuration the models reach or in a default configuration, registers no
block can hold, spills in a configuration the models reach (the autotuner's space after its pruning for the
models' shapes, in the dtypes they run there), a grid out of range, a kernel no case launched. Spills at edge
shapes, and other configurations over the shared memory limit at edge shapes, are reported only.

The benchmark's registered op cases (``registered_cases``) are recorded too, as edge cases.

Results are cached in ``.venv/gpu-compile-cache.json``, keyed on the Triton version and, per target, on a hash of
(kernel, its source with dependencies and line, signature, constexprs, specialisation attributes, options): a
rerun compiles only what changed. ``--write-docs`` writes the table into docs/gpu-compile.md and the summary into
docs/backends.md (between ``<!-- gpu-compile ... -->`` markers); ``--json`` writes every result.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: the benchmarks package (the registered op cases) lives here
    sys.path.insert(0, str(ROOT))
EXPECTED_TRITON = "3.6.0"
DEFAULT_CACHE = ROOT / ".venv" / "gpu-compile-cache.json"
TABLE_DOC = ROOT / "docs" / "gpu-compile.md"
SUMMARY_DOC = ROOT / "docs" / "backends.md"
TABLE_MARKERS = ("<!-- gpu-compile table: begin -->", "<!-- gpu-compile table: end -->")
SUMMARY_MARKERS = ("<!-- gpu-compile summary: begin -->", "<!-- gpu-compile summary: end -->")
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclasses.dataclass(frozen=True)
class Target:
    name: str              # "sm_90"
    capability: int        # 90
    smem_per_block: int    # bytes a block may use
    smem_per_sm: int       # bytes per SM (1 KB of it reserved per resident block)


TARGETS = (Target("sm_90", 90, 232448, 233472), Target("sm_80", 80, 166912, 167936))


# --------------------------------------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One call pattern of an op: ``run(dtype)`` calls the custom ops; ``models`` names the presets that call
    it (empty: an edge case of the op only), in ``model_dtypes`` (training runs fp32, bf16 or fp16; QA
    evaluation and serving on a GPU run under bf16 autocast); other dtypes count as edge cases."""
    name: str
    models: tuple[str, ...]
    run: Callable[[Any], None]
    model_dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")


def _t(*shape: int, dtype: Any = None) -> Any:
    import torch
    return torch.empty(shape, dtype=dtype)


def _param_dtype(dtype: Any, fp32_params: bool) -> Any:
    """The parameters' dtype of a case: float32 (the models' master weights under autocast, which the
    launchers take as they are) or the activations' dtype (a model cast to bf16 / fp16 as a whole)."""
    import torch
    return torch.float32 if fp32_params else dtype


def _dwsep(B: int, L: int, C_in: int, C_out: int, K: int, *, ln: bool, relu: bool, residual: bool,
           mask: bool = False, dw_bias: bool = False, pw_bias: bool = True, causal: bool = False,
           backward: bool = True, fp32_params: bool = True) -> Callable[[Any], None]:
    """dwsep_conv1d / ln_dwsep_conv1d forward (and backward) on x [B, L, C_in], K taps."""
    def run(dtype: Any) -> None:
        import torch
        ops = torch.ops.fastqa_triton
        pdt = _param_dtype(dtype, fp32_params)
        x, dww, pww = _t(B, L, C_in, dtype=dtype), _t(C_in, 1, K, dtype=pdt), _t(C_out, C_in, 1, dtype=pdt)
        dwb = _t(C_in, dtype=pdt) if dw_bias else None
        pwb = _t(C_out, dtype=pdt) if pw_bias else None
        res = _t(B, L, C_out, dtype=dtype) if residual else None
        pad = K - 1 if causal else (K - 1) // 2
        if ln:
            lnw, m = _t(C_in, dtype=pdt), (torch.ones(B, L, dtype=torch.bool) if mask else None)
            y, aux, stats = ops.ln_dwsep_conv1d_fwd(x, lnw, lnw, 1e-5, dww, dwb, pww, pwb, res, m, pad, relu)
            if backward:
                ops.ln_dwsep_conv1d_bwd(y, x, lnw, lnw, dww, dwb, pww, pwb, aux, stats, m, pad, relu)
        else:
            y, aux = ops.dwsep_conv1d_fwd(x, dww, dwb, pww, pwb, res, pad, relu)
            if backward:
                ops.dwsep_conv1d_bwd(y, x, dww, dwb, pww, pwb, aux, pad, relu)
    return run


def _cqa(B: int, n: int, m: int, d: int, *, bias: bool = True, backward: bool = True,
         fp32_params: bool = True) -> Callable[[Any], None]:
    """context_query_attention forward (and backward): c [B, n, d], q [B, m, d]."""
    def run(dtype: Any) -> None:
        import torch
        ops = torch.ops.fastqa_triton
        pdt = _param_dtype(dtype, fp32_params)
        c, q, w = _t(B, n, d, dtype=dtype), _t(B, m, d, dtype=dtype), _t(3 * d, dtype=pdt)
        b = _t(1, dtype=pdt) if bias else None
        cm, qm = torch.ones(B, n, dtype=torch.bool), torch.ones(B, m, dtype=torch.bool)
        out, lse_r, lse_c = ops.context_query_attention_fwd(c, q, cm, qm, w, b)
        if backward:
            ops.context_query_attention_bwd(out, c, q, cm, qm, w, b, out, lse_r, lse_c)
    return run


def _trilinear(B: int, n: int, m: int, d: int, *, bias: bool, fp32_params: bool = True) -> Callable[[Any], None]:
    """trilinear_similarity forward and backward: s [B, n, m]."""
    def run(dtype: Any) -> None:
        import torch
        ops = torch.ops.fastqa_triton
        pdt = _param_dtype(dtype, fp32_params)
        c, q, w = _t(B, n, d, dtype=dtype), _t(B, m, d, dtype=dtype), _t(3 * d, dtype=pdt)
        b = _t(1, dtype=pdt) if bias else None
        s = ops.trilinear_similarity_fwd(c, q, w, b)
        ops.trilinear_similarity_bwd(s, c, q, w, b)
    return run


def _glu(B: int, T: int, H: int, K: int, *, causal: bool, mask: bool, residual: bool, bias: bool = True,
         scale: float = 0.5 ** 0.5, fp32_params: bool = True) -> Callable[[Any], None]:
    """glu_conv1d forward and backward: x [B, T, H], weight [2H, H, K]."""
    def run(dtype: Any) -> None:
        import torch
        ops = torch.ops.fastqa_triton
        pdt = _param_dtype(dtype, fp32_params)
        x, w = _t(B, T, H, dtype=dtype), _t(2 * H, H, K, dtype=pdt)
        b = _t(2 * H, dtype=pdt) if bias else None
        m = torch.ones(B, T, dtype=torch.bool) if mask else None
        pad = K - 1 if causal else (K - 1) // 2
        y, aux = ops.glu_conv1d_fwd(x, w, b, m, pad, residual, scale)
        ops.glu_conv1d_bwd(y, x, w, m, aux, pad, residual, scale, bias)
    return run


def _glu_step(B: int, H: int, K: int, *, residual: bool, bias: bool = True,
              fp32_params: bool = True) -> Callable[[Any], None]:
    """glu_conv1d_step: x_t [B, H], state [B, K-1, H]."""
    def run(dtype: Any) -> None:
        import torch
        pdt = _param_dtype(dtype, fp32_params)
        b = _t(2 * H, dtype=pdt) if bias else None
        torch.ops.fastqa_triton.glu_conv1d_step(_t(B, H, dtype=dtype), _t(B, K - 1, H, dtype=dtype),
                                                _t(2 * H, H, K, dtype=pdt), b, residual, 1.0)
    return run


def _dropout(shape: tuple[int, ...], *, residual: bool, scale: bool) -> Callable[[Any], None]:
    """dropout_add (its backward is the same kernel without the residual)."""
    def run(dtype: Any) -> None:
        import torch
        res = _t(*shape, dtype=dtype) if residual else None
        s = _t(shape[0], dtype=dtype) if scale else None
        seed = torch.tensor([1234], dtype=torch.int64)
        torch.ops.fastqa_triton.dropout_add(_t(*shape, dtype=dtype), res, s, 0.1, seed)
    return run


def _presets() -> tuple[dict[str, Any], dict[str, Any]]:
    """The models' presets as their config classes declare them: ``qanet-<preset>`` -> QANetConfig,
    ``convs2s-<preset>`` -> ConvS2SConfig."""
    from fastqa.models.convs2s import ConvS2SConfig
    from fastqa.models.qanet import QANetConfig

    vocab = 1000  # the vocabularies' sizes a preset leaves to the data; no kernel launch depends on them
    return ({f"qanet-{name}": QANetConfig.from_preset(name, word_vocab_size=vocab, char_vocab_size=vocab)
             for name in QANetConfig.PRESETS},
            {f"convs2s-{name}": ConvS2SConfig.from_preset(name, src_vocab_size=vocab, tgt_vocab_size=vocab)
             for name in ConvS2SConfig.PRESETS})


def model_cases() -> list[Case]:
    """What QANet (fastqa/models/qanet: presets ``paper``, ``small``) and ConvS2S (fastqa/models/convs2s: presets
    ``tutorial``, ``small``) launch, at the training shapes every op check takes (``benchmarks.cases``: QANet
    batch 32, context 400, questions of 50; ConvS2S batch 64, 30 tokens) and the widths and kernels of each
    preset: also questions of 9 words, and in evaluation (bf16) of 100 words (a question's length sets the row
    kernels' BLOCK_M); QANet's kernels K = 5 (resize conv, model encoder) and 7 (embedding encoder), ConvS2S's
    K = 3, and decoding steps of 1, 5, 64 and 320 rows. Parameters in float32 (autocast's master weights, which
    the launchers take as they are); ``edge_cases`` has them in the activations' dtype too."""
    from benchmarks.cases import CONVS2S_BATCH, QANET_BATCH

    B, n, m_train = QANET_BATCH["B"], QANET_BATCH["n"], QANET_BATCH["m"]
    Bt, T = CONVS2S_BATCH["B"], CONVS2S_BATCH["T"]
    cases = []
    qanet, convs2s = _presets()
    for model, c in qanet.items():
        d, only = c.d_model, (model,)
        resize_in, K = c.word_dim + c.char_channels + int(c.word_match), c.emb_resize_kernel  # the resize conv's
        cases.append(Case(f"{model}: resize conv C_in {resize_in} K{K}", only,
                          _dwsep(B, n, resize_in, d, K, ln=False, relu=False, residual=False)))
        for K, part in ((c.emb_conv_kernel, "embedding"), (c.model_conv_kernel, "model")):
            for L in (n, m_train):  # the context's and the question's encoders
                for residual in (False, True):  # training adds the residual after dropout, evaluation in the kernel
                    cases.append(Case(f"{model}: {part} encoder conv K{K} L{L} residual={residual}", only,
                                      _dwsep(B, L, d, d, K, ln=True, relu=True, residual=residual, mask=True)))
        for m in (m_train, 9):  # training: questions cut to m_train words
            cases.append(Case(f"{model}: context-query attention m{m}", only, _cqa(B, n, m, d)))
        # Evaluation and serving (bf16 autocast): questions are not cut.
        cases.append(Case(f"{model}: evaluation, 100-word questions", only, _cqa(B, 700, 100, d, backward=False),
                          ("bf16",)))
        cases.append(Case(f"{model}: serving one question", only, _cqa(1, 173, 11, d, backward=False), ("bf16",)))
    for model, c in convs2s.items():
        only, H, K = (model,), c.hidden_dim, c.kernel_size
        cases.append(Case(f"{model}: encoder GLU conv", only, _glu(Bt, T, H, K, causal=False, mask=True,
                                                                    residual=False)))
        cases.append(Case(f"{model}: decoder GLU conv", only, _glu(Bt, T, H, K, causal=True, mask=False,
                                                                    residual=False, scale=1.0)))
        for rows in (1, 5, Bt, 320):
            cases.append(Case(f"{model}: decoding step B{rows}", only, _glu_step(rows, H, K, residual=False)))
    everyone = tuple(qanet) + tuple(convs2s)
    for residual in (False, True):
        for scale in (False, True):
            cases.append(Case(f"dropout_add residual={residual} scale={scale}", everyone,
                              _dropout((B, n, 128), residual=residual, scale=scale)))
    return cases


def registered_cases() -> list[Case]:
    """The benchmark's registered op cases (``benchmarks/cases.py``) of the ops with Triton kernels, at their
    shapes and flags, counted as edge cases (spills there are reported, not failures); the ops whose GPU path is
    torch's own (linear, self-attention, decode-time attention) launch no kernel of fastqa's."""
    from benchmarks import cases as _registered  # noqa: F401 -- registers the cases
    from benchmarks.registry import OpCase, select

    def dwsep(s: dict) -> Callable[[Any], None]:
        return _dwsep(s["B"], s["L"], s["C_in"], s["C_out"], s["K"], ln=False, relu=s["relu_residual"],
                      residual=s["relu_residual"])

    adapters: dict[str, Callable[[dict], Callable[[Any], None]]] = {
        "dwsep_conv1d": dwsep,
        "ln_dwsep_conv1d": lambda s: _dwsep(s["B"], s["L"], s["C"], s["C"], s["K"], ln=True, relu=True, residual=True),
        "context_query_attention": lambda s: _cqa(s["B"], s["n"], s["m"], s["d"]),
        "glu_conv1d": lambda s: _glu(s["B"], s["T"], s["H"], s["K"], causal=s["causal"], mask=not s["causal"],
                                     residual=False),
        "glu_conv1d_step": lambda s: _glu_step(s["B"], s["H"], s["K"], residual=False),
    }
    return [Case(f"benchmark case {c.id}", (), adapters[c.op](c.shape))
            for c in select() if isinstance(c, OpCase) and c.op in adapters]


def edge_cases() -> list[Case]:
    """Shapes and flags the ops accept that the models do not use: other K (constexpr in dwsep), depthwise bias,
    no pointwise bias, ReLU and residual without the LayerNorm, causal padding, no mask, wide and narrow
    features (the whole-row LayerNorm kernels and context-query attention tile the whole feature dimension),
    no attention bias, trilinear similarity, GLU with residual, without bias or mask, and a single row; steps with
    K 1 and 2 at channel counts no tile divides; the models' shapes with the parameters in the activations'
    dtype."""
    return [
        Case("dwsep K3 relu residual dw_bias no pw_bias causal", (),
             _dwsep(8, 77, 96, 48, 3, ln=False, relu=True, residual=True, dw_bias=True, pw_bias=False, causal=True)),
        Case("dwsep K1", (), _dwsep(4, 64, 64, 64, 1, ln=False, relu=False, residual=False)),
        Case("dwsep K9 relu", (), _dwsep(4, 64, 256, 256, 9, ln=False, relu=True, residual=False)),
        Case("ln_dwsep K3 no relu no mask dw_bias", (),
             _dwsep(4, 50, 32, 32, 3, ln=True, relu=False, residual=False, dw_bias=True, pw_bias=False)),
        Case("ln_dwsep C_in 16", (), _dwsep(2, 33, 16, 16, 5, ln=True, relu=True, residual=True, mask=True)),
        Case("ln_dwsep C_in 256", (), _dwsep(2, 64, 256, 256, 7, ln=True, relu=True, residual=True, mask=True)),
        Case("cqa d16", (), _cqa(2, 40, 7, 16)),
        Case("cqa d256", (), _cqa(2, 300, 40, 256)),
        Case("cqa d128 no bias m1", (), _cqa(2, 100, 1, 128, bias=False)),
        Case("trilinear d128 bias", (), _trilinear(4, 400, 50, 128, bias=True)),
        Case("trilinear d64 no bias", (), _trilinear(4, 100, 30, 64, bias=False)),
        Case("glu residual bias mask K5", (), _glu(8, 20, 128, 5, causal=False, mask=True, residual=True)),
        Case("glu no bias no mask causal H100", (), _glu(8, 17, 100, 3, causal=True, mask=False, residual=False,
                                                        bias=False)),
        Case("glu step residual no bias K5", (), _glu_step(16, 128, 5, residual=True, bias=False)),
        Case("glu step K1 H100", (), _glu_step(3, 100, 1, residual=True)),
        Case("glu step K2 H36 B33", (), _glu_step(33, 36, 2, residual=False)),
        # Parameters in the activations' dtype (a model cast as a whole): the models' shapes.
        Case("ln_dwsep params in the input dtype", (),
             _dwsep(32, 400, 128, 128, 7, ln=True, relu=True, residual=True, mask=True, fp32_params=False)),
        Case("dwsep params in the input dtype", (),
             _dwsep(32, 400, 500, 128, 5, ln=False, relu=False, residual=False, fp32_params=False)),
        Case("cqa params in the input dtype", (), _cqa(32, 400, 50, 128, fp32_params=False)),
        Case("trilinear params in the input dtype", (), _trilinear(4, 400, 50, 128, bias=True, fp32_params=False)),
        Case("glu params in the input dtype", (), _glu(64, 30, 512, 3, causal=True, mask=False, residual=False,
                                                       fp32_params=False)),
        Case("glu step params in the input dtype", (), _glu_step(64, 512, 3, residual=False, fp32_params=False)),
    ]


# ------------------------------------------------------------------------------------------------- recording
@dataclasses.dataclass
class Launch:
    kernel: Any            # a triton Autotuner or JITFunction
    grid: Any
    args: tuple
    kwargs: dict
    case: Case
    dtype: str             # "fp32" / "bf16" / "fp16"


def kernel_modules() -> list[Any]:
    """The kernel modules of fastqa.triton_kernels, each checked to launch through ``_common.launch`` only."""
    import fastqa.triton_kernels as package
    from fastqa.triton_kernels import _common

    modules = [m for name, m in sorted(sys.modules.items())
               if name.startswith(package.__name__ + ".") and m is not None and name != _common.__name__]
    for m in modules:
        launcher = vars(m).get("launch")
        if launcher is not None and launcher is not _common.launch:
            raise RuntimeError(f"{m.__name__}.launch is not _common.launch")
    return modules


def kernels(modules: list[Any]) -> dict[str, Any]:
    """Every launchable kernel by "<module>.<jit function name>": the autotuned ones, and plain ``triton.jit``
    kernels (named ``*_kernel``) that no autotuner wraps. Helpers (jit functions kernels call) are left out."""
    import triton
    found, wrapped = {}, set()
    for m in modules:
        for value in vars(m).values():
            if isinstance(value, triton.runtime.Autotuner):
                found[_name(value)] = value
                wrapped.add(id(value.fn))
    for m in modules:
        for attr, value in vars(m).items():
            if (isinstance(value, triton.runtime.JITFunction) and attr.endswith("_kernel") and id(value) not in wrapped
                    and value.__module__ == m.__name__):
                found[_name(value)] = value
    return found


def _jit(kernel: Any) -> Any:
    """The JITFunction of a kernel (an Autotuner wraps one)."""
    return kernel.fn if hasattr(kernel, "configs") else kernel


def _name(kernel: Any) -> str:
    fn = _jit(kernel)
    return f"{fn.__module__.rpartition('.')[2]}.{fn.__name__}"


@contextlib.contextmanager
def recording(modules: list[Any], sink: list, context: dict) -> Iterator[None]:
    """Replace ``launch`` in every kernel module by a recorder appending ``Launch``es to ``sink``."""
    def record(kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
        sink.append(Launch(kernel, grid, args, kwargs, context["case"], context["dtype"]))
    saved = {m: m.launch for m in modules if hasattr(m, "launch")}
    for m in saved:
        m.launch = record
    try:
        yield
    finally:
        for m, launcher in saved.items():
            m.launch = launcher


def record_launches(modules: list[Any], cases: list[Case]) -> list[Launch]:
    """Run every case in float32 (matmul precision "highest" and "high"), bfloat16 and float16."""
    import torch
    variants = [(torch.float32, "fp32", "highest"), (torch.float32, "fp32", "high"),
                (torch.bfloat16, "bf16", None), (torch.float16, "fp16", None)]
    launches: list[Launch] = []
    context: dict = {}
    before = torch.get_float32_matmul_precision()
    with recording(modules, launches, context):
        try:
            for case in cases:
                for dtype, label, precision in variants:
                    if precision is not None:
                        torch.set_float32_matmul_precision(precision)
                    context.update(case=case, dtype=label)
                    case.run(dtype)
        finally:
            torch.set_float32_matmul_precision(before)
    return launches


# ------------------------------------------------------------------------------------------------ specialising
@dataclasses.dataclass
class Unit:
    """One compile: a kernel specialised for one configuration (and its reach: cases, models)."""
    kernel: str
    fn: Any
    config: tuple           # the block sizes, warps, stages (autotuning-row order)
    dtype: str
    variant: str            # the constexprs other than the configuration's, e.g. "K=7 HAS_LN=True ..."
    signature: dict
    constexprs: dict
    attrs: dict             # Triton's specialisation attributes (divisibility by 16 of pointers and ints)
    kwargs: dict            # the launch options (num_warps, num_stages, ...), parsed per target
    key: str = ""
    default: bool = False   # the first configuration of the space (or a plain kernel's only one)
    models: set = dataclasses.field(default_factory=set)
    cases: set = dataclasses.field(default_factory=set)


def _configs(kernel: Any, launch_kwargs: dict) -> list[tuple[tuple, dict]]:
    """(row, launch kwargs) per configuration: the autotuning space, or the plain kernel's launch options."""
    if hasattr(kernel, "configs"):
        return [(tuple(c.kwargs.values()) + (c.num_warps, c.num_stages), c.all_kwargs()) for c in kernel.configs]
    blocks = tuple(v for k, v in launch_kwargs.items() if k.startswith("BLOCK"))
    return [(blocks + (launch_kwargs.get("num_warps", 4), launch_kwargs.get("num_stages", 3)), {})]


def _model_configs(kernel: Any, launch: Launch) -> Optional[list]:
    """The configurations the autotuner keeps for this launch after its early pruning (None: all of them)."""
    prune = getattr(kernel, "early_config_prune", None)
    if not prune:
        return None
    kept = prune(kernel.configs, dict(zip(kernel.arg_names, launch.args)), **launch.kwargs)
    return [tuple(c.kwargs.values()) + (c.num_warps, c.num_stages) for c in kept]


def _stable(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _check_grid(grid: Any, meta: dict) -> Optional[str]:
    g = tuple(grid(meta) if callable(grid) else grid)
    if not 1 <= len(g) <= 3 or any(not isinstance(v, int) or v < 1 or v > lim for v, lim in zip(g, GRID_LIMITS)):
        return f"grid {g} out of range (limits {GRID_LIMITS})"
    return None


def specialise(launches: list[Launch]) -> tuple[dict[str, Unit], list[str]]:
    """Distinct compile units over every launch and configuration, and grid errors."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", TARGETS[0].capability, 32))
    binders: dict[int, Any] = {}
    units: dict[str, Unit] = {}
    grid_errors: list[str] = []
    for launch in launches:
        kernel, fn = launch.kernel, _jit(launch.kernel)
        binder = binders.setdefault(id(fn), create_function_from_signature(fn.signature, fn.params, backend))
        models = launch.case.models if launch.dtype in launch.case.model_dtypes else ()
        reachable = _model_configs(kernel, launch) if models else []
        block_names = set(kernel.configs[0].kwargs) if hasattr(kernel, "configs") else set()
        for i, (row, config_kwargs) in enumerate(_configs(kernel, launch.kwargs)):
            kwargs = dict(launch.kwargs, **config_kwargs)
            kwargs["debug"] = fn.debug or knobs.runtime.debug
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
            bound, spec, opts = binder(*launch.args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
            err = _check_grid(launch.grid, dict(bound))
            if err:
                grid_errors.append(f"{_name(kernel)} {row} [{launch.case.name}, {launch.dtype}]: {err}")
            named = {fn.arg_names[path[0]]: v for path, v in constexprs.items() if len(path) == 1}
            variant = " ".join(f"{k}={_stable(v)}" for k, v in named.items() if k not in block_names)
            opt = {k: v for k, v in sorted(options.__dict__.items()) if k not in ("extern_libs", "arch")}
            key = hashlib.sha256(json.dumps(
                [_name(kernel), fn.cache_key, signature, {str(k): _stable(v) for k, v in constexprs.items()},
                 {str(k): v for k, v in attrs.items()}, {k: _stable(v) for k, v in opt.items()}],
                sort_keys=True).encode()).hexdigest()
            unit = units.get(key)
            if unit is None:
                unit = units[key] = Unit(_name(kernel), fn, row, launch.dtype, variant, signature, constexprs, attrs,
                                         kwargs, key, default=i == 0)
            unit.cases.add(launch.case.name)
            if models and (reachable is None or row in reachable):
                unit.models.update(models)
    return units, grid_errors


# -------------------------------------------------------------------------------------------------- compiling
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


def occupancy(regs: int, shared: int, num_warps: int, target: Target) -> tuple[float, str]:
    """Theoretical occupancy (resident warps / 64) and what limits it."""
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    limits = {"blocks": 32, "warps": 64 // num_warps,
              "registers": (65536 // regs_per_warp) // num_warps,
              "shared": target.smem_per_sm // (shared + 1024)}
    limiter = min(limits, key=lambda k: limits[k])
    return limits[limiter] * num_warps / 64, limiter


def compile_unit(unit: Unit, target: Target) -> dict:
    """Compile one unit for one target: registers, spills, shared memory, occupancy, or the error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    start = time.time()
    gpu = GPUTarget("cuda", target.capability, 32)
    log = io.StringIO()
    with tempfile.TemporaryFile(mode="w+", errors="replace") as diagnostics:
        try:
            options = make_backend(gpu).parse_options(dict(unit.kwargs))
            # ptxas -v output (knobs.nvidia.dump_ptxas_log) comes on stdout, MLIR's diagnostics on descriptor 2.
            with contextlib.redirect_stdout(log), _fd2_to(diagnostics):
                compiled = triton.compile(ASTSource(unit.fn, unit.signature, unit.constexprs, unit.attrs),
                                          target=gpu, options=options.__dict__)
        except Exception as exc:  # noqa: BLE001 -- any compile failure is a finding
            diagnostics.seek(0)
            details = [ln for ln in diagnostics.read().splitlines() if "error" in ln.lower()]
            return {"error": _error_text("\n".join([f"{type(exc).__name__}: {exc}"] + details)),
                    "seconds": time.time() - start}
    text = log.getvalue()
    regs = max((int(r) for r in _REGS.findall(text)), default=-1)
    spills = [(int(s), int(ld)) for s, ld in _SPILL.findall(text)]
    shared = int(compiled.metadata.shared)
    occ, limiter = occupancy(regs, shared, options.num_warps, target)
    return {"regs": regs, "spill_stores": sum(s for s, _ in spills), "spill_loads": sum(ld for _, ld in spills),
            "stack": max((int(s) for s in _STACK.findall(text)), default=0), "shared": shared,
            "occupancy": occ, "limiter": limiter, "seconds": time.time() - start}


@contextlib.contextmanager
def _fd2_to(file: Any) -> Iterator[None]:
    """File descriptor 2 (where C++ writes its diagnostics) redirected to ``file`` inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _error_text(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-8:])[:2000]


def cache_key(unit: Unit, target: Target) -> str:
    return f"{unit.key}:{target.name}"


def _worker(conn: Any, jobs: list[tuple[Unit, Target]], stderr_path: str) -> None:
    """Compile ``jobs`` in this (forked) process, sending (index, result) after each; a compiler crash (an LLVM
    abort) ends the process, and the parent reports the job it was on."""
    from triton import knobs
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    knobs.nvidia.dump_ptxas_log = True
    for i, (unit, target) in enumerate(jobs):
        conn.send((i, compile_unit(unit, target)))
    conn.close()


def _run_jobs(jobs: list[tuple[Unit, Target]], n_procs: int, on_result: Callable[[int, dict], None]) -> None:
    """Compile ``jobs`` in ``n_procs`` forked workers, calling ``on_result(index, result)`` for each; a worker that
    dies is restarted after the job it died on, which is reported as a compile error with the end of its stderr."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("fork")
    results: list[Optional[dict]] = [None] * len(jobs)
    started = [0]
    pending = [list(range(w, len(jobs), n_procs)) for w in range(n_procs)]
    running: dict[Any, tuple[Any, list[int], str]] = {}
    tmp = tempfile.mkdtemp(prefix="fastqa-gpu-compile-workers-")

    def start(indices: list[int], w: int) -> None:
        parent, child = ctx.Pipe(duplex=False)
        started[0] += 1
        err = os.path.join(tmp, f"worker{started[0]}.err")
        proc = ctx.Process(target=_worker, args=(child, [jobs[i] for i in indices], err), daemon=True)
        proc.start()
        child.close()
        running[parent] = (proc, indices, err)

    try:
        for w, indices in enumerate(pending):
            if indices:
                start(indices, w)
        while running:
            for conn in wait(list(running)):
                proc, indices, err = running[conn]
                try:
                    i, result = conn.recv()
                except EOFError:
                    proc.join()
                    del running[conn]
                    left = [j for j in indices if results[j] is None]
                    if left:  # died on left[0]
                        tail = Path(err).read_text(errors="replace") if os.path.exists(err) else ""
                        results[left[0]] = {"error": _error_text(f"compiler process died (exit code {proc.exitcode})"
                                                                 f": {tail}"), "seconds": 0.0}
                        on_result(left[0], results[left[0]])
                        if left[1:]:
                            start(left[1:], 0)
                    continue
                results[indices[i]] = result
                on_result(indices[i], result)
    finally:
        for proc, _, _ in running.values():
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def compile_all(units: dict[str, Unit], cache_path: Optional[Path], n_procs: int,
                progress: bool) -> dict[tuple[str, str], dict]:
    """Every unit for every target, through the cache (keyed by Triton version, unit and target)."""
    import triton

    cache: dict = {}
    if cache_path is not None and cache_path.exists():
        try:
            cache = json.loads(cache_path.read_text())
        except ValueError:
            cache = {}
    if cache.get("triton") != triton.__version__:
        cache = {"triton": triton.__version__, "results": {}}
    todo = [(u, t) for u in units.values() for t in TARGETS if cache_key(u, t) not in cache["results"]]
    if progress and todo:
        print(f"  {len(todo)} compiles not in the cache, {n_procs} processes", file=sys.stderr, flush=True)
    saved = [time.time(), 0]

    def on_result(i: int, result: dict) -> None:
        unit, target = todo[i]
        cache["results"][cache_key(unit, target)] = result
        saved[1] += 1
        if progress and (saved[1] % 100 == 0 or saved[1] == len(todo)):
            print(f"  compiled {saved[1]}/{len(todo)}", file=sys.stderr, flush=True)
        if cache_path is not None and (time.time() - saved[0] > 60 or saved[1] == len(todo)):
            _save(cache_path, cache)
            saved[0] = time.time()

    if todo:
        _run_jobs(todo, max(1, n_procs), on_result)
    return {(u.key, t.name): cache["results"][cache_key(u, t)] for u in units.values() for t in TARGETS}


def _save(path: Path, cache: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache))
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------- report
def findings(units: dict[str, Unit], results: dict, grid_errors: list[str], uncovered: list[str]) -> dict:
    """What fails the check: compile errors; shared memory over the per-block limit in a configuration the models
    reach or in a default (first) configuration at any shape (``FASTQA_TRITON_AUTOTUNE=0`` runs it); more
    registers than a block of its warps can have (no block fits an SM); spills the models reach; grids out of
    range; kernels no case launched. Reported only: spills at edge shapes, and shared memory over the limit in
    other configurations at edge shapes (Triton raises OutOfResources when loading them, which the autotuner
    takes as "skip this configuration")."""
    out: dict[str, list[str]] = {"compile_errors": [], "shared_memory": [], "registers": [], "model_spills": [],
                                 "grid": sorted(set(grid_errors)), "uncovered": uncovered,
                                 "model_minor_spills": [], "edge_spills": [], "edge_shared_memory": []}
    for unit in sorted(units.values(), key=lambda u: (u.kernel, u.config, u.dtype, u.variant)):
        reached = f" ({', '.join(sorted(unit.models))})" if unit.models else ""
        for target in TARGETS:
            r = results[unit.key, target.name]
            where = f"{unit.kernel} {unit.config} {unit.dtype} {target.name} [{unit.variant}]"
            if "error" in r:
                out["compile_errors"].append(f"{where}: {r['error']}")
                continue
            if r["shared"] > target.smem_per_block:
                kind = "shared_memory" if unit.models or unit.default else "edge_shared_memory"
                out[kind].append(f"{where}: {r['shared']} bytes > {target.smem_per_block}{reached}")
            if r["occupancy"] == 0 and r["limiter"] == "registers":
                out["registers"].append(f"{where}: {r['regs']} registers x {unit.kwargs.get('num_warps')} warps")
            if r["spill_stores"] or r["spill_loads"]:
                kind = "edge_spills" if not unit.models else \
                    "model_minor_spills" if r["spill_stores"] <= MINOR_SPILL_STORE_BYTES else "model_spills"
                out[kind].append(f"{where}: {r['regs']} registers, spills {r['spill_stores']} B stored / "
                                 f"{r['spill_loads']} B loaded{reached}")
    return out


#: Findings that do not fail the check.
REPORTED_ONLY = ("model_minor_spills", "edge_spills", "edge_shared_memory")
#: A spill of at most this many bytes stored per thread (a few registers' worth, kept in L1) is reported, not
#: failed, where the models reach it: the attention backward's fp32 column kernel spills 4-16 bytes in its one
#: configuration, and no configuration spills less.
MINOR_SPILL_STORE_BYTES = 16


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}"


def render_table(units: dict[str, Unit], results: dict, row_names: dict[str, tuple],
                 row_order: dict[str, list]) -> str:
    """Markdown: per kernel, one row per (configuration, dtype); per target the worst case over the variants
    (constexprs and shapes) the models reach -- over every variant compiled where the models reach none (models
    "-") -- most registers, spill bytes, shared memory, least occupancy; the last column: spills and shared
    memory over the limit at edge shapes only."""
    groups: dict[tuple, list[Unit]] = {}
    for u in units.values():
        groups.setdefault((u.kernel, u.config, u.dtype), []).append(u)
    dtype_order = {"fp32": 0, "bf16": 1, "fp16": 2}
    lines = []
    for kernel in sorted({k for k, _, _ in groups}):
        order = row_order.get(kernel, [])
        keys = sorted((key for key in groups if key[0] == kernel),
                      key=lambda k: (order.index(k[1]) if k[1] in order else len(order), dtype_order[k[2]]))
        lines += ["", f"### `{kernel}`", "", f"Configuration: ({', '.join(row_names[kernel])}).", "",
                  "| configuration | dtype | models | sm_90 regs | spills (B) | smem (KB) | occupancy | sm_80 regs "
                  "| spills (B) | smem (KB) | occupancy | edge shapes only |",
                  "|---|---|---|" + "---:|" * 8 + "---|"]
        for key in keys:
            model_units = [u for u in groups[key] if u.models]
            shown = model_units or groups[key]
            cells = [f"`{key[1]}`", key[2], "yes" if model_units else "-"]
            for target in TARGETS:
                rs = [results[u.key, target.name] for u in shown]
                if any("error" in r for r in rs):
                    cells += ["error", "", "", ""]
                    continue
                cells += [str(max(r["regs"] for r in rs)), str(max(r["spill_stores"] + r["spill_loads"] for r in rs)),
                          _kb(max(r["shared"] for r in rs)), f"{min(r['occupancy'] for r in rs):.3g}"]
            cells.append(_edge_note([u for u in groups[key] if not u.models], results) if model_units else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines).strip("\n")


def render_failures(units: dict[str, Unit], results: dict) -> str:
    """Markdown list of what fails the check, one line per (kernel, configuration, dtype): compile errors,
    shared memory over the limit where it fails, spills the models reach (worst over the variants)."""
    worst: dict[tuple, dict[str, list]] = {}
    cases: dict[tuple, set] = {}
    for u in units.values():
        precision = re.search(r"DOT_PRECISION=(\S+)", u.variant)
        dtype = u.dtype + (f" ({precision.group(1)})" if precision and u.dtype == "fp32" else "")
        for t in TARGETS:
            r = results[u.key, t.name]
            if "error" in r:
                problem = "does not compile"
            elif r["shared"] > t.smem_per_block and (u.models or u.default):
                problem = f"shared memory {r['shared']} B > {t.smem_per_block}"
            elif r["spill_stores"] > MINOR_SPILL_STORE_BYTES and u.models:
                problem = f"spills {r['spill_stores'] + r['spill_loads']} B"
            else:
                continue
            worst.setdefault((u.kernel, u.config, dtype), {}).setdefault(t.name, []).append(problem)
            cases.setdefault((u.kernel, u.config, dtype), set()).update(u.cases)
    lines = []
    for key, per_target in sorted(worst.items()):
        parts = []
        for target, problems in sorted(per_target.items()):
            spills = [int(p.split()[1]) for p in problems if p.startswith("spills")]
            other = sorted({p for p in problems if not p.startswith("spills")})
            parts.append(f"{target}: " + ", ".join(other + ([f"spills up to {max(spills)} B"] if spills else [])))
        lines.append(f"- `{key[0]}` `{key[1]}` {key[2]}: {'; '.join(parts)} (cases: {'; '.join(sorted(cases[key]))})")
    return "\n".join(lines) if lines else "None: every configuration the models reach compiles without spills."


def _edge_note(edge_units: list[Unit], results: dict) -> str:
    """What the edge shapes add to a row the models reach: worst spills, shared memory over the limit."""
    notes = []
    for target in TARGETS:
        rs = [results[u.key, target.name] for u in edge_units if "error" not in results[u.key, target.name]]
        spill = max((r["spill_stores"] + r["spill_loads"] for r in rs), default=0)
        if spill:
            notes.append(f"{target.name}: spills {spill} B")
        if any(r["shared"] > target.smem_per_block for r in rs):
            notes.append(f"{target.name}: smem over the limit")
    return "; ".join(notes)


def render_summary(stats: dict) -> str:
    """The paragraph docs/backends.md carries: what was compiled and what it found."""
    return (f"`make gpu-compile` compiled {stats['kernels']} Triton kernels with Triton {stats['triton']} for sm_90 "
            f"(H100, H200) and sm_80 (A100): {stats['signatures']} specialisations (kernel, configuration, argument "
            f"types, constexprs) of {stats['launches']} recorded launches at the models' shapes and edge shapes in "
            f"float32 (TF32x3 and TF32 dots), bfloat16 and float16, {stats['compiles']} compiles. Compile errors: "
            f"{stats['compile_errors']}; shared memory over the per-block limit where it fails: "
            f"{stats['shared_memory']}; spills in a configuration the models reach: {stats['model_spills']}; "
            f"reported only -- spills of at most {MINOR_SPILL_STORE_BYTES} bytes stored the models reach: "
            f"{stats['model_minor_spills']}, spills at edge shapes: {stats['edge_spills']}, shared memory over the "
            f"limit in "
            f"configurations the autotuner skips at edge shapes: {stats['edge_shared_memory']}. Registers, spills, "
            f"shared memory and occupancy per kernel, configuration, dtype and target: "
            f"[gpu-compile.md](gpu-compile.md).")


def _replace_block(text: str, markers: tuple[str, str], body: str) -> str:
    begin, end = markers
    if begin not in text or end not in text:
        raise ValueError(f"markers {begin!r} ... {end!r} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def block(path: Path, markers: tuple[str, str]) -> Optional[str]:
    """The text between the markers of a doc (None: no markers)."""
    text = path.read_text()
    if markers[0] not in text or markers[1] not in text:
        return None
    return text.split(markers[0], 1)[1].split(markers[1], 1)[0].strip("\n")


# ------------------------------------------------------------------------------------------------------ main
def _arguments(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="results cache (default: %(default)s)")
    parser.add_argument("--no-cache", action="store_true", help="compile everything, write no cache")
    parser.add_argument("--write-docs", action="store_true", help="write the table and summary into docs/")
    parser.add_argument("--check-docs", action="store_true", help="fail when the docs' table is not current")
    parser.add_argument("--json", type=Path, help="write the findings, totals and table here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (default: CPUs)")
    parser.add_argument("--only", help="a regular expression: check the kernels whose name it matches (no docs)")
    parser.add_argument("--expect-triton", default=EXPECTED_TRITON, help="required triton.__version__")
    return parser.parse_args(argv)


def _docs_table(units: dict, results: dict, all_kernels: dict, launches: list) -> str:
    """The docs' markdown: what fails the check, then every specialisation's resources by kernel."""
    row_names = {name: tuple(k.configs[0].kwargs) + ("warps", "stages") for name, k in all_kernels.items()
                 if hasattr(k, "configs")}
    for launch in launches:  # plain jit kernels: the block sizes their launcher passes
        row_names.setdefault(_name(launch.kernel), tuple(k for k in launch.kwargs if k.startswith("BLOCK"))
                             + ("warps", "stages"))
    row_order = {name: [row for row, _ in _configs(k, {})] for name, k in all_kernels.items() if hasattr(k, "configs")}
    return ("## What fails the check\n\n" + render_failures(units, results) + "\n\n## Resources\n\n"
            + render_table(units, results, row_names, row_order))


def _print_findings(found: dict, failed: dict, stats: dict, seconds: float, compile_seconds: float) -> None:
    """Every finding (the reported-only kinds' first ten) and the one-line verdict, on stderr."""
    for kind, items in found.items():
        if items:
            shown = items if kind not in REPORTED_ONLY else items[:10]
            print(f"\n{kind} ({len(items)}{'' if len(shown) == len(items) else ', the first 10; --json has all'}):",
                  file=sys.stderr)
            for item in shown:
                print(f"  {item}", file=sys.stderr)
    print(f"\ngpu_compile: {stats['kernels']} kernels, {stats['signatures']} specialisations, {stats['compiles']} "
          f"compiles ({compile_seconds:.0f} s of compile time when not cached); this run {seconds:.0f} s; "
          + ("FAILED: " + ", ".join(f"{k} {len(v)}" for k, v in failed.items()) if failed else "ok"),
          file=sys.stderr)


def main(argv: Optional[list[str]] = None) -> int:
    args = _arguments(argv)
    started = time.time()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("gpu_compile: TRITON_INTERPRET=1 is set; the check compiles for GPUs and needs it unset", file=sys.stderr)
        return 2
    triton_cache = tempfile.mkdtemp(prefix="fastqa-gpu-compile-")
    os.environ["TRITON_CACHE_DIR"] = triton_cache  # a fresh cache: every compile runs ptxas (its log is parsed)
    import triton
    if args.expect_triton and triton.__version__ != args.expect_triton:
        print(f"gpu_compile: triton {triton.__version__} from {triton.__file__}, expected {args.expect_triton} "
              "(run through `make gpu-compile`)", file=sys.stderr)
        return 2
    import fastqa.triton_kernels  # noqa: F401 -- registers the custom ops

    try:
        modules = kernel_modules()
        all_kernels = kernels(modules)
        cases = model_cases() + edge_cases() + registered_cases()
        launches = record_launches(modules, cases)
        launched = {_name(launch.kernel) for launch in launches}
        uncovered = sorted(set(all_kernels) - launched)
        units, grid_errors = specialise(launches)
        if args.only:
            units = {k: u for k, u in units.items() if re.search(args.only, u.kernel)}
            uncovered, args.write_docs, args.check_docs = [], False, False
        print(f"gpu_compile: triton {triton.__version__}, {len(launches)} launches of {len(launched)} kernels, "
              f"{len(units)} specialisations x {len(TARGETS)} targets", file=sys.stderr, flush=True)
        results = compile_all(units, None if args.no_cache else args.cache, args.jobs, progress=True)
    finally:
        shutil.rmtree(triton_cache, ignore_errors=True)

    found = findings(units, results, grid_errors, uncovered)
    table = _docs_table(units, results, all_kernels, launches)
    stats = {"triton": triton.__version__, "kernels": len(launched), "signatures": len(units),
             "launches": len(launches), "compiles": len(units) * len(TARGETS),
             **{k: len(v) for k, v in found.items()}}
    summary = render_summary(stats)
    seconds = time.time() - started
    compile_seconds = sum(r.get("seconds", 0.0) for r in results.values())

    failed = {k: v for k, v in found.items() if v and k not in REPORTED_ONLY}
    _print_findings(found, failed, stats, seconds, compile_seconds)

    docs_current = (block(TABLE_DOC, TABLE_MARKERS) == table if TABLE_DOC.exists() else False) and \
        block(SUMMARY_DOC, SUMMARY_MARKERS) == summary
    if args.write_docs:
        if not TABLE_DOC.exists():
            TABLE_DOC.write_text(f"# GPU compile check\n\n{TABLE_MARKERS[0]}\n{TABLE_MARKERS[1]}\n")
        TABLE_DOC.write_text(_replace_block(TABLE_DOC.read_text(), TABLE_MARKERS, table))
        SUMMARY_DOC.write_text(_replace_block(SUMMARY_DOC.read_text(), SUMMARY_MARKERS, summary))
        docs_current = True
    if args.json:
        units_out = [{"kernel": u.kernel, "config": list(u.config), "dtype": u.dtype, "variant": u.variant,
                      "models": sorted(u.models), "cases": sorted(u.cases),
                      **{t.name: results[u.key, t.name] for t in TARGETS}} for u in units.values()]
        args.json.write_text(json.dumps({"stats": stats, "findings": found, "docs_current": docs_current,
                                         "table": table, "summary": summary, "seconds": seconds,
                                         "compile_seconds": compile_seconds, "units": units_out}, indent=1))
    if args.check_docs and not docs_current:
        print("gpu_compile: docs/gpu-compile.md or docs/backends.md is not current: run `make gpu-compile`",
              file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
