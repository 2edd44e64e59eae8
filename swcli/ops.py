"""The functional op, its autograd.Function, the nn.Module, and backend dispatch.

Layers, from the outside in: SoftSmithWaterman (nn.Module) -> soft_smith_waterman (checks arguments,
picks the backend) -> _SoftSmithWatermanFunction (autograd) -> the compiled engine, or the reference loop.
No backend ever falls back to another: a request that cannot run raises.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from swcli import _build
from swcli.reference import soft_smith_waterman_reference

BACKENDS = ("auto", "cuda", "cpu", "reference")


def _check_number(name: str, value) -> float:
    if type(value) is float and math.isfinite(value):  # the common case, checked fast
        return value
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_lengths(name: str, lengths, size: int, device) -> torch.Tensor | None:
    """(B,) int64 lengths on `device`; None (every pair full) stays None. Their range is checked by
    _check_ranges, with every other range of the call."""
    if lengths is None:
        return None
    lengths = torch.as_tensor(lengths)
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {lengths.dtype}")
    if lengths.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), one length per pair, got {tuple(lengths.shape)}")
    return lengths.to(device=device, dtype=torch.int64).contiguous()


def _check_ranges(checks) -> None:
    """checks: (values, error) pairs, error(lowest, highest) -> message or None. The smallest and largest
    entry of every non-empty tensor come from the device in one round trip: each read waits for the
    device, and with one wait per check the checks took 450 us of a 3,140 us call of 10,000 protein pairs
    on the H200."""
    checks = [(values, error) for values, error in checks if values.numel()]
    if not checks:
        return
    extremes = torch.stack([x for values, _ in checks for x in torch.aminmax(values)]).tolist()
    for k, (_, error) in enumerate(checks):
        message = error(extremes[2 * k], extremes[2 * k + 1])
        if message:
            raise ValueError(message)


def _length_range(name: str, limit: int, dim: str):
    """The error of lengths outside [0, limit] (for _check_ranges)."""
    return lambda low, high: (f"{name} must lie in [0, {limit}] ({dim} of the score matrix), got min {low}, "
                              f"max {high}" if low < 0 or high > limit else None)


def _code_range(name: str, K: int):
    """The error of codes past a K x K matrix (for _check_ranges)."""
    return lambda low, high: f"{name} holds code {high}, outside the {K} x {K} matrix" if high >= K else None


def _resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    # tensor.is_cuda / is_cpu, not tensor.device.type: that one costs more than all the other checks
    # of a small call together
    if backend == "auto":
        return "cuda" if tensor.is_cuda else "cpu"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "cuda" and not tensor.is_cuda:
        raise ValueError(f"backend='cuda' needs the score matrix on a CUDA device, got {tensor.device}")
    if backend == "cpu" and not tensor.is_cpu:
        raise ValueError(f"backend='cpu' needs the score matrix on the CPU, got {tensor.device}; move it "
                         "with .cpu() or use backend='auto'")
    return backend


def _check_arguments(gap, temperature, backend: str, tensor: torch.Tensor, shape: tuple[int, int, int],
                     query_lengths, target_lengths, ranges=()):
    """The checks both entry points share: (gap, temperature, resolved backend, qlen, tlen). `tensor`
    is the input whose device the lengths must match; `ranges` are the caller's own (values, error)
    checks, read from the device with the lengths' (see _check_ranges)."""
    gap = _check_number("gap", gap)
    temperature = _check_number("temperature", temperature)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is the exact hard maximum), got {temperature}")
    backend = _resolve_backend(backend, tensor)
    B, M, N = shape
    qlen = _check_lengths("query_lengths", query_lengths, B, tensor.device)
    tlen = _check_lengths("target_lengths", target_lengths, B, tensor.device)
    ranges = list(ranges)
    if qlen is not None:
        ranges.append((qlen, _length_range("query_lengths", M, "M")))
    if tlen is not None:
        ranges.append((tlen, _length_range("target_lengths", N, "N")))
    _check_ranges(ranges)
    return gap, temperature, backend, qlen, tlen


def _engine(backend: str):
    """The compiled engine of a backend, built on first use (see _build)."""
    return _build.cpu_engine() if backend == "cpu" else _build.cuda_engine()


def _full(lengths: torch.Tensor | None, size: int, limit: int) -> torch.Tensor:
    """The CPU engine takes explicit lengths: None becomes `limit` for every pair."""
    return torch.full((size,), limit, dtype=torch.int64) if lengths is None else lengths


# The narrowest N whose gradient goes by rows. A rows warp spans 256 columns whatever N is, where the
# table's kernels take tiles of 128 columns and, with per-pair lengths, only the lengths' cells. Forward +
# backward of 8192 x 256 x N at t = 1 on the H200 (docs/benchmarks/h200.md), by rows through autograd /
# by the table's two engine calls: N = 100 2.30 / 1.36 ms, 128 1.78 / 1.36, 160 1.87 / 2.28, 200 1.99 /
# 2.53, 256 2.06 / 2.80, 250 (rows of 1,000 bytes) 3.72 / 5.09. With lengths drawn from half the size
# up: N = 160 2.24 / 1.76, 192 2.23 / 2.01, 250 3.52 / 3.80, 256 2.49 / 2.52 (a tie in time; the rows
# keep 0.14 floats per cell, the table 1).
ROWS_NARROWEST = 129
ROWS_NARROWEST_WITH_LENGTHS = 193


def _by_rows(engine, S: torch.Tensor, lengths: bool, gap: float, temperature: float) -> bool:
    """Whether the gradient goes by rows: the engine takes the call (float32, t > 0, gap <= 0, N <= 256),
    N is wide enough to gain from it (ROWS_NARROWEST), and no CUDA graph is being captured: the rows'
    backward reads one int from the device (below), which a capture does not allow."""
    narrowest = ROWS_NARROWEST_WITH_LENGTHS if lengths else ROWS_NARROWEST
    return (engine.rows_take(S, gap, temperature) and S.shape[2] >= narrowest
            and not torch.cuda.is_current_stream_capturing())


def _forward(backend: str, S: torch.Tensor, qlen, tlen, gap: float, temperature: float, keep: bool):
    """(scores, what the backward needs) from a compiled engine: the DP table H, and on CUDA the
    position of the best cell, which the CPU engine finds again in its backward; or, for the gradient by
    rows (CUDA), the kept rows, the best cell's row and the count of pairs that need the table instead."""
    if backend == "cpu":
        B, M, N = S.shape
        scores, dp = _engine("cpu").forward(S, _full(qlen, B, M), _full(tlen, B, N), gap, temperature, keep,
                                            True, None)
        return scores, (dp,)
    engine = _engine("cuda")
    if not keep and qlen is None and tlen is None:  # the lean binding: small calls are host-bound
        return engine.scores(S, gap, temperature), None
    # The gradient by rows: kept rows, not the table.
    if keep and _by_rows(engine, S, qlen is not None or tlen is not None, gap, temperature):
        scores, kept, best_row, failed = engine.forward_rows(S, qlen, tlen, gap, temperature)
        return scores, (kept, best_row, failed)
    scores, table, best_at = engine.forward(S, qlen, tlen, gap, temperature, keep, 0, True, None)
    return scores, (table, best_at)


def _backward(backend: str, grad, S, state, qlen, tlen, gap: float, temperature: float) -> torch.Tensor:
    if backend == "cpu":
        B, M, N = S.shape
        return _engine("cpu").backward(grad, S, *state, _full(qlen, B, M), _full(tlen, B, N), gap, temperature)
    engine = _engine("cuda")
    if len(state) == 3:  # the gradient by rows (sw_cuda.h)
        kept, best_row, failed = state
        # The engine reads the forward's count of failed pairs (one int from the device) after it has
        # queued everything but the kernel's launch. Read after the launch, while the backward runs, the
        # count left the host behind the device at the end (the autograd engine's work then no longer
        # overlaps the kernel): forward + backward took 2.47 instead of 2.04 ms on the H200 (8192 x 256 x 256).
        grad_S = engine.backward_rows(grad, S, kept, best_row, failed, qlen, tlen, gap, temperature)
        if grad_S is not None:
            return grad_S
        # Some pair's rows left the scaled range (its score came from log space): the DP table's path for
        # the batch, its table computed now.
        _, table, best_at = engine.forward(S, qlen, tlen, gap, temperature, True, 0, True, None)
        state = (table, best_at)
    return engine.backward(grad, S, *state, qlen, tlen, gap, temperature, 0)


def prepare_backend(backend: str) -> None:
    """Build (or load) the engine behind a resolved backend now, so a first compile or a build error
    comes before any output rather than in the middle of it."""
    if backend != "reference":
        _engine(backend)


class _SoftSmithWatermanFunction(torch.autograd.Function):
    """Compiled forward that keeps what the backward needs, and a hand-written backward. On CUDA, float32
    scores at t > 0 with 129 to 256 columns (193 to 256 with lengths) go by rows: the forward keeps every
    8th row of the DP (about 1/8 of a float per cell) and the backward computes the rows between again.
    Everything else keeps the DP table (one float per cell) and sweeps it back with the softmax (t > 0) or
    argmax (t = 0) weights of every cell."""

    @staticmethod
    def forward(ctx, S, query_lengths, target_lengths, gap, temperature, backend):
        scores, state = _forward(backend, S, query_lengths, target_lengths, gap, temperature, True)
        ctx.save_for_backward(S, query_lengths, target_lengths, *state)
        ctx.gap, ctx.temperature, ctx.backend = gap, temperature, backend
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        S, query_lengths, target_lengths, *state = ctx.saved_tensors
        grad_S = _backward(ctx.backend, grad_scores, S, state, query_lengths, target_lengths, ctx.gap,
                           ctx.temperature)
        return grad_S, None, None, None, None, None


def soft_smith_waterman(
    score_matrix: torch.Tensor,
    gap: float = -1.0,
    temperature: float = 1.0,
    query_lengths=None,
    target_lengths=None,
    backend: str = "auto",
) -> torch.Tensor:
    """Soft Smith-Waterman local alignment scores, (B,), of a batch of score matrices (B, M, N).

    gap is the linear score added per gap position (normally negative); temperature 0 is classic hard
    Smith-Waterman. Pair b is scored on score_matrix[b, :query_lengths[b], :target_lengths[b]].
    backend: 'auto' (CUDA for GPU tensors, else the compiled CPU engine), 'cuda', 'cpu', or 'reference'
    (the Python loop). float16/bfloat16 are computed in float32; the result has the input's dtype.
    """
    if (type(gap) is float and type(temperature) is float and query_lengths is None and target_lengths is None
            and backend == "auto" and type(score_matrix) is torch.Tensor and score_matrix.is_cuda
            and score_matrix.dtype is torch.float32 and score_matrix.dim() == 3 and not score_matrix.requires_grad
            and temperature >= 0 and math.isfinite(gap) and math.isfinite(temperature)):
        # Inference on full float32 pairs on the GPU, every argument checked as below but in fewer
        # steps: at small sizes (the seed) the host's time per call sets the rate.
        return _build.cuda_engine().scores(score_matrix, gap, temperature)
    if not isinstance(score_matrix, torch.Tensor):
        raise ValueError(f"score_matrix must be a torch.Tensor, got {type(score_matrix).__name__}")
    if score_matrix.dim() != 3:
        raise ValueError(f"score_matrix must be 3-D (B, M, N), got shape {tuple(score_matrix.shape)}")
    dtype = score_matrix.dtype
    if not dtype.is_floating_point:
        raise ValueError(f"score_matrix must be floating point, got dtype {dtype}")
    gap, temperature, backend, qlen, tlen = _check_arguments(
        gap, temperature, backend, score_matrix, score_matrix.shape, query_lengths, target_lengths)

    S = score_matrix
    if dtype is torch.float16 or dtype is torch.bfloat16:
        S = S.float()
    if backend == "reference":
        scores = soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    elif torch.is_grad_enabled() and S.requires_grad:
        scores = _SoftSmithWatermanFunction.apply(S, qlen, tlen, gap, temperature, backend)
    else:  # no gradient: no DP table, and none of autograd's overhead (it counts at small sizes)
        scores, _ = _forward(backend, S, qlen, tlen, gap, temperature, False)
    return scores if S is score_matrix else scores.to(dtype)


def soft_smith_waterman_codes(
    query_codes: torch.Tensor,
    target_codes: torch.Tensor,
    matrix: torch.Tensor,
    gap: float = -1.0,
    temperature: float = 1.0,
    query_lengths=None,
    target_lengths=None,
    backend: str = "auto",
) -> torch.Tensor:
    """Scores (B,) of pairs given as uint8 codes (B, M), (B, N) into a K x K substitution matrix.

    The compiled engines look each score up in the matrix as they go, so the (B, M, N) score tensor is
    never built (it would cost more than the alignment itself); backend='reference' builds it with a
    gather and runs the Python loop in the matrix's dtype. No gradient: use soft_smith_waterman for that.
    """
    for name, codes in (("query_codes", query_codes), ("target_codes", target_codes)):
        if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.dtype != torch.uint8:
            raise ValueError(f"{name} must be a 2-D uint8 tensor (B, length)")
    if query_codes.shape[0] != target_codes.shape[0]:
        raise ValueError(f"query_codes and target_codes hold {query_codes.shape[0]} and "
                         f"{target_codes.shape[0]} pairs")
    if (not isinstance(matrix, torch.Tensor) or matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]
            or not 0 < matrix.shape[0] <= 256 or not matrix.dtype.is_floating_point):
        raise ValueError("matrix must be a square floating-point tensor of at most 256 x 256")
    if target_codes.device != query_codes.device:
        raise ValueError(f"query_codes and target_codes are on {query_codes.device} and {target_codes.device}")
    K = matrix.shape[0]
    B, M = query_codes.shape
    gap, temperature, backend, qlen, tlen = _check_arguments(
        gap, temperature, backend, query_codes, (B, M, target_codes.shape[1]), query_lengths, target_lengths,
        ((query_codes, _code_range("query_codes", K)), (target_codes, _code_range("target_codes", K))))
    return score_checked_codes(query_codes, target_codes, matrix.to(query_codes.device), gap, temperature, qlen,
                               tlen, backend)


def score_checked_codes(query_codes, target_codes, matrix, gap: float, temperature: float, qlen, tlen,
                        backend: str) -> torch.Tensor:
    """soft_smith_waterman_codes past its checks, for callers whose codes, lengths (int64 on the codes'
    device, or None) and matrix (on that device) are valid by construction: the pipeline's batches. On
    CUDA the checks wait for the device (the largest code, the lengths' range), and in the pipeline's
    scoring thread each wait can also wait for the GIL."""
    B, M = query_codes.shape
    if backend == "reference":
        S = matrix[query_codes.long()[:, :, None], target_codes.long()[:, None, :]]
        return soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    if backend == "cpu":
        return _engine("cpu").forward_codes(query_codes, target_codes, _full(qlen, B, M),
                                            _full(tlen, B, target_codes.shape[1]), matrix, gap, temperature,
                                            True, None)
    return _engine("cuda").forward_codes(query_codes, target_codes, qlen, tlen, matrix, gap, temperature, 0, True,
                                         None)


class SoftSmithWaterman(nn.Module):
    """Drop-in for the reference module: same constructor, forward(score_matrix) -> (B,) scores."""

    def __init__(self, gap_open: float = -1.0, temperature: float = 1.0, backend: str = "auto"):
        super().__init__()
        self.gap_open = gap_open
        self.temperature = temperature
        self.backend = backend

    def forward(self, score_matrix, query_lengths=None, target_lengths=None):
        return soft_smith_waterman(score_matrix, self.gap_open, self.temperature,
                                   query_lengths, target_lengths, self.backend)

    def extra_repr(self) -> str:
        return f"gap_open={self.gap_open}, temperature={self.temperature}, backend={self.backend!r}"
