"""The op cases of the benchmark, registered on import.

Shapes are the models' (QANet's and ConvS2S's own sizes). Inputs are drawn once on the CPU in float64 from a seeded generator, with
weights scaled like their layers' initialisation so outputs stay O(1) and errors are comparable.
FLOPs count multiply-adds twice and only the GEMM-like terms (elementwise work is noise next to
them); a backward costs twice its forward.
"""
from __future__ import annotations

import torch

from fastqa import reference as ref

from .registry import OpCase, OpInputs, register


#: The models' training shapes every op check takes (the benchmark's cases, the GPU check's op phases, the GPU
#: compile check): QANet's batch and its context and question limits; ConvS2S's batch, sentence length, target
#: vocabulary (Multi30k's, the tutorial preset's) and beam. The widths, heads and kernels are the presets'.
QANET_BATCH = {"B": 32, "n": 400, "m": 50}
CONVS2S_BATCH = {"B": 64, "T": 30, "V": 5893, "beam": 5}


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def _lengths_mask(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """[B, L] bool padding mask, lengths uniform in [L/2, L], the first row full (as in a padded batch)."""
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=gen)
    lengths[0] = length
    return torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)


def _fwd_bwd(fwd_flops: float):
    return lambda mode: fwd_flops * (3.0 if mode == "fwd+bwd" else 1.0)


# --- depthwise-separable conv1d -------------------------------------------------------------------

def dwsep_case(B: int, L: int, C_in: int, C_out: int, K: int, *, relu_residual: bool,
               quick: bool = False) -> OpCase:
    def make_inputs(gen: torch.Generator) -> OpInputs:
        kwargs = {"activation": "relu" if relu_residual else None}
        if relu_residual:
            kwargs["residual"] = _randn(gen, B, L, C_out)
        args = (_randn(gen, B, L, C_in), _randn(gen, C_in, 1, K, scale=K ** -0.5),
                _randn(gen, C_out, C_in, 1, scale=C_in ** -0.5), _randn(gen, C_out, scale=0.1))
        return OpInputs(args, kwargs, (0, 1, 2, 3) + (("residual",) if relu_residual else ()))

    chans = f"C{C_in}" if C_in == C_out else f"C{C_in}-{C_out}"
    return OpCase(
        op="dwsep_conv1d", name=f"B{B}_L{L}_{chans}_K{K}" + ("_relu_res" if relu_residual else ""),
        shape={"B": B, "L": L, "C_in": C_in, "C_out": C_out, "K": K, "relu_residual": relu_residual},
        make_inputs=make_inputs, reference=ref.dwsep_conv1d, fastqa_fn="dwsep_conv1d",
        flops=_fwd_bwd(2.0 * B * L * C_in * (K + C_out)), quick=quick)


def ln_dwsep_case(B: int, L: int, C: int, K: int, *, quick: bool = False) -> OpCase:
    """QANet's whole conv sublayer: LayerNorm -> depthwise-separable conv -> ReLU -> + its own input."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, L, C), 1.0 + _randn(gen, C, scale=0.1), _randn(gen, C, scale=0.1),
                _randn(gen, C, 1, K, scale=K ** -0.5), _randn(gen, C, C, 1, scale=C ** -0.5), _randn(gen, C, scale=0.1))
        return OpInputs(args, {"activation": "relu"}, (0, 1, 2, 3, 4, 5))

    def residual_is_x(fn):
        # The residual is the sublayer's own input, the same tensor, as QANet passes it.
        return lambda x, *rest, **kw: fn(x, *rest, residual=x, **kw)

    return OpCase(
        op="ln_dwsep_conv1d", name=f"B{B}_L{L}_C{C}_K{K}_relu_res", shape={"B": B, "L": L, "C": C, "K": K},
        make_inputs=make_inputs, reference=ref.ln_dwsep_conv1d, fastqa_fn="ln_dwsep_conv1d",
        program=residual_is_x, flops=_fwd_bwd(2.0 * B * L * C * (K + C)), quick=quick)


# --- context-query attention ----------------------------------------------------------------------

def cqa_case(B: int, n: int, m: int, d: int, *, quick: bool = False) -> OpCase:
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, n, d), _randn(gen, B, m, d), _lengths_mask(gen, B, n), _lengths_mask(gen, B, m),
                _randn(gen, 3 * d, scale=(3 * d) ** -0.5), _randn(gen, 1, scale=0.1))
        return OpInputs(args, {}, (0, 1, 4, 5))

    # S (c∘w)qᵀ, A = S̄Q, S̿ᵀC, S̄(S̿ᵀC): four [n, m, d] products; plus c·w_c and q·w_q.
    fwd = 2.0 * B * d * (4 * n * m + n + m)
    # Naive: [B, n, m, 3d] concatenation plus its c∘q part in the forward; its gradients in the backward.
    naive_elems = float(B * n * m * d)
    return OpCase(
        op="context_query_attention", name=f"B{B}_n{n}_m{m}_d{d}", shape={"B": B, "n": n, "m": m, "d": d},
        make_inputs=make_inputs, reference=ref.context_query_attention, fastqa_fn="context_query_attention",
        flops=_fwd_bwd(fwd), naive=ref.context_query_attention_naive,
        naive_bytes=lambda mode: 4 * naive_elems * (10 if mode == "fwd+bwd" else 4), quick=quick)


def trilinear_case(B: int, n: int, m: int, d: int, *, quick: bool = False) -> OpCase:
    """The similarity matrix alone, S = w·[c; q; c∘q] + b -> [B, n, m] (not registered: the fused attention
    case times it; gpu_check compares it with its reference)."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, n, d), _randn(gen, B, m, d), _randn(gen, 3 * d, scale=(3 * d) ** -0.5),
                _randn(gen, 1, scale=0.1))
        return OpInputs(args, {}, (0, 1, 2, 3))

    return OpCase(
        op="trilinear_similarity", name=f"B{B}_n{n}_m{m}_d{d}", shape={"B": B, "n": n, "m": m, "d": d},
        make_inputs=make_inputs, reference=ref.trilinear_similarity, fastqa_fn="trilinear_similarity",
        flops=_fwd_bwd(2.0 * B * n * m * d), quick=quick)


# --- self-attention -------------------------------------------------------------------------------

def self_attention_case(B: int, L: int, d: int, heads: int, *, quick: bool = False) -> OpCase:
    """QANet's encoder self-attention on the fused qkv projection [B, L, 3d], with a padding mask."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        return OpInputs((_randn(gen, B, L, 3 * d), _lengths_mask(gen, B, L)), {"heads": heads}, (0,))

    return OpCase(
        op="self_attention", name=f"B{B}_L{L}_d{d}_h{heads}", shape={"B": B, "L": L, "d": d, "heads": heads},
        make_inputs=make_inputs, reference=ref.self_attention, fastqa_fn="self_attention",
        flops=_fwd_bwd(4.0 * B * L * L * d), quick=quick)  # q kᵀ and p v, every key (padding included)


def packed_self_attention_case(lengths: tuple[int, ...], d: int, heads: int, *, quick: bool = False) -> OpCase:
    """A packed batch's self-attention (not registered): the sequences of ``lengths`` one after another in one
    row, attended apart (``segments``), as the models pack a padded batch's real positions."""
    total = sum(lengths)

    def make_inputs(gen: torch.Generator) -> OpInputs:
        mask = torch.ones(1, total, dtype=torch.bool)
        return OpInputs((_randn(gen, 1, total, 3 * d), mask), {"heads": heads, "segments": list(lengths)}, (0,))

    return OpCase(
        op="self_attention", name=f"packed{len(lengths)}_L{total}_d{d}_h{heads}",
        shape={"lengths": list(lengths), "d": d, "heads": heads},
        make_inputs=make_inputs, reference=ref.self_attention, fastqa_fn="self_attention",
        flops=_fwd_bwd(4.0 * sum(n * n for n in lengths) * d), quick=quick)


# --- linear map -----------------------------------------------------------------------------------

def linear_case(rows: tuple[int, ...], K: int, N: int, *, what: str, quick: bool = False) -> OpCase:
    """nn.Linear on [*rows, K] -> [*rows, N] (fastqa.linear: each product on the GEMM engine measured
    fastest for its shape)."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        return OpInputs((_randn(gen, *rows, K), _randn(gen, N, K, scale=K ** -0.5), _randn(gen, N, scale=0.1)),
                        {}, (0, 1, 2))

    m = 1
    for r in rows:
        m *= r
    return OpCase(
        op="linear", name=f"{what}_M{m}_K{K}_N{N}", shape={"rows": list(rows), "K": K, "N": N},
        make_inputs=make_inputs, reference=ref.linear, fastqa_fn="linear",
        flops=_fwd_bwd(2.0 * m * K * N), quick=quick)


def linear_argmax_case(M: int, K: int, N: int, *, quick: bool = False) -> OpCase:
    """Greedy decoding's next token: argmax over N of [M, K] x [K, N] + b, pad and sos excluded."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        return OpInputs((_randn(gen, M, K), _randn(gen, N, K, scale=K ** -0.5), _randn(gen, N, scale=0.1)),
                        {"exclude": [0, 2]}, ())

    return OpCase(
        op="linear_argmax", name=f"vocab_M{M}_K{K}_N{N}", shape={"M": M, "K": K, "N": N},
        make_inputs=make_inputs, reference=ref.linear_argmax, fastqa_fn="linear_argmax",
        flops=_fwd_bwd(2.0 * M * K * N), modes=("fwd",), quick=quick)


# --- decode-time attention ------------------------------------------------------------------------

def decode_attention_case(B: int, R: int, S: int, E: int, *, quick: bool = False) -> OpCase:
    """One ConvS2S decoding step's attention: R rows per sentence over its S source positions, lengths
    uniform in [S/2, S] (fastqa.decode_attention reads the real positions only)."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, R, E), _randn(gen, B, S, E, scale=E ** -0.5), _randn(gen, B, S, E))
        return OpInputs(args, {"mask": _lengths_mask(gen, B, S), "scale": 0.5 ** 0.5}, ())

    return OpCase(
        op="decode_attention", name=f"B{B}_R{R}_S{S}_E{E}", shape={"B": B, "R": R, "S": S, "E": E},
        make_inputs=make_inputs, reference=ref.decode_attention, fastqa_fn="decode_attention",
        program=_both_outputs, flops=_fwd_bwd(4.0 * B * R * S * E), modes=("fwd",), quick=quick)


def _both_outputs(op):
    """(out, weights) as one flat tensor, so that the suite compares both."""
    return lambda *args, **kwargs: torch.cat([t.flatten() for t in op(*args, **kwargs)])


# --- seeded dropout + residual ---------------------------------------------------------------------

def dropout_add_case(B: int, L: int, C: int, p: float = 0.1, *, quick: bool = False) -> OpCase:
    """A sublayer's output dropped (counter-based mask of a fixed seed), scaled per example (stochastic
    depth: some examples' sublayer dropped whole) and added to its residual (not registered)."""
    def make_inputs(gen: torch.Generator) -> OpInputs:
        survive = (torch.rand(B, generator=gen, dtype=torch.float64) < 0.9).double() / 0.9
        kwargs = {"residual": _randn(gen, B, L, C), "example_scale": survive}
        return OpInputs((_randn(gen, B, L, C), p, 0x5EED_F00D_1234), kwargs, (0, "residual"))

    return OpCase(
        op="dropout_add", name=f"B{B}_L{L}_C{C}_p{p:g}", shape={"B": B, "L": L, "C": C, "p": p},
        make_inputs=make_inputs, reference=ref.dropout_add, fastqa_fn="dropout_add",
        flops=lambda mode: 0.0, quick=quick)


# --- GLU convolution ------------------------------------------------------------------------------

def glu_case(B: int, H: int, T: int, K: int, *, causal: bool, quick: bool = False) -> OpCase:
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, T, H), _randn(gen, 2 * H, H, K, scale=(H * K) ** -0.5), _randn(gen, 2 * H, scale=0.1))
        kwargs = {"causal": causal}
        if not causal:  # the centred op is the encoder's, which zeroes padded positions
            kwargs["mask"] = _lengths_mask(gen, B, T)
        return OpInputs(args, kwargs, (0, 1, 2))

    return OpCase(
        op="glu_conv1d", name=f"{'causal' if causal else 'centred'}_B{B}_H{H}_T{T}_K{K}",
        shape={"B": B, "H": H, "T": T, "K": K, "causal": causal},
        make_inputs=make_inputs, reference=ref.glu_conv1d, fastqa_fn="glu_conv1d",
        flops=_fwd_bwd(4.0 * B * T * H * H * K), naive=ref.glu_conv1d_naive if causal else None, quick=quick)


def _decode(step):
    """The decoding program around a one-step op: T steps with a rolling [B, K-1, H] state."""
    def decode(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        state = x.new_zeros(x.shape[0], weight.shape[-1] - 1, x.shape[2])
        ys = []
        for t in range(x.shape[1]):
            y, state = step(x[:, t], state, weight, bias)
            ys.append(y)
        return torch.stack(ys, dim=1)
    return decode


def _recompute(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Decoding without a state: re-run the causal op over the whole prefix at every step."""
    return torch.stack([ref.glu_conv1d(x[:, : t + 1], weight, bias, causal=True)[:, -1]
                        for t in range(x.shape[1])], dim=1)


def glu_step_case(B: int, H: int, K: int, steps: int = 50, *, quick: bool = False) -> OpCase:
    def make_inputs(gen: torch.Generator) -> OpInputs:
        args = (_randn(gen, B, steps, H), _randn(gen, 2 * H, H, K, scale=(H * K) ** -0.5), _randn(gen, 2 * H, scale=0.1))
        return OpInputs(args, {}, ())

    return OpCase(
        op="glu_conv1d_step", name=f"decode{steps}_B{B}_H{H}_K{K}", shape={"B": B, "H": H, "K": K, "steps": steps},
        make_inputs=make_inputs, reference=ref.glu_conv1d_step, fastqa_fn="glu_conv1d_step",
        program=_decode, flops=_fwd_bwd(4.0 * B * steps * H * H * K), naive=_recompute,
        modes=("fwd",), quick=quick)


for _case in (
    dwsep_case(32, 400, 128, 128, 7, relu_residual=True, quick=True),
    dwsep_case(32, 50, 128, 128, 7, relu_residual=False),
    dwsep_case(32, 400, 500, 128, 5, relu_residual=False),
    dwsep_case(64, 400, 128, 128, 7, relu_residual=False),
    ln_dwsep_case(32, 400, 128, 7),  # QANet's encoder conv sublayer
    cqa_case(32, 400, 50, 128),
    cqa_case(8, 400, 50, 128, quick=True),
    cqa_case(32, 1000, 100, 128),
    self_attention_case(32, 400, 128, 8),  # QANet paper: the context's encoder blocks
    self_attention_case(8, 400, 128, 8, quick=True),
    linear_case((200,), 256, 5893, what="vocab"),         # ConvS2S's output projection, a decode step of 200
    linear_case((32, 400), 128, 128, what="ffn"),         # QANet's feed-forward layer, context side
    linear_case((8, 400), 128, 128, what="ffn", quick=True),
    linear_argmax_case(200, 256, 5893),                   # ConvS2S greedy decoding, 200 sentences
    decode_attention_case(200, 1, 30, 256),               # a greedy step of 200 sentences (small preset)
    decode_attention_case(40, 5, 30, 256, quick=True),    # a beam-5 step of 40 sentences
    *(glu_case(B, H, T, K, causal=causal, quick=causal and (B, H, T, K) == (64, 256, 50, 5))
      for causal in (True, False) for B, H, T, K in ((128, 512, 30, 3), (32, 512, 100, 3), (64, 256, 50, 5))),
    glu_step_case(64, 512, 3),  # ConvS2S decoder width, 64 sentences
    glu_step_case(8, 256, 3, quick=True),
):
    register(_case)
