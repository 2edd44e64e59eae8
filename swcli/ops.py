"""The op: the swcli operators' schemas and registration, argument checks, and the public functions.

Layers, from the outside in: SoftSmithWaterman (nn.Module) -> soft_smith_waterman (checks arguments,
computes half precision in float32) -> the registered operators torch.ops.swcli.* -> the CPU or the CUDA
engine's kernel, which torch's dispatcher picks from the tensors' device. backend='reference' runs the
Python loop instead. Nothing here branches on the engine: both take the same arguments and return the
same values, and no backend ever falls back to another (a request that cannot run raises).

The operators (one schema each, CPU kernels in kernels/cpu, CUDA kernels in kernels/cuda):

* scores: the scores alone, for inference;
* scores_codes: the scores of pairs of sequence codes, looked up in a substitution matrix as the engine
  goes (the (B, M, N) score tensor is never built);
* scores_counted, scores_codes_counted: the same, and a (1,) int32 count of the pairs that the scaled
  sweep handed to log space (tests and tools);
* forward: the scores and what the backward needs (a flat state, the best cell, a count of pairs that
  left the scaled range); autograd is registered on it, with backward as its gradient;
* empty_launch: an empty CUDA kernel behind a (B,) allocation, the launch-overhead yardstick of bench;
* affine_scores, affine_scores_codes, affine_forward, affine_backward: the same roles with affine gaps
  (soft Gotoh: an open score for a gap's first position, an extension score for each further one; the
  recurrence is in swcli/reference.py). affine_forward returns the scores, the state its backward reads
  and the engine's record of each pair's best cell; autograd is registered on it, with affine_backward
  as its gradient.

Each has a fake kernel, so torch.compile, torch.export and meta tensors see one op with known shapes.
The keyword-only arguments are the engines' knobs for tests and tools: lane_columns (CUDA: columns per
lane, 0 = chosen by batch size) and scaled (allow the scaled-space sweep).

Gaps: `gap` is a linear gap score, added for every gap position. `gap_open` with `gap_extend` make the
gaps affine: gap_open is the score of a gap's first position, gap_extend of each further one, so a gap of
length k scores gap_open + (k - 1) gap_extend (BLAST's 11/1 is gap_open=-12, gap_extend=-1), and
gap_open <= gap_extend <= 0. The two kinds are exclusive: affine gaps take both keywords and no `gap`.
With gap_open == gap_extend == g the affine op computes the linear recurrence with gap g (to rounding).
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from swcli import _build
from swcli.reference import soft_smith_waterman_affine_reference, soft_smith_waterman_reference

BACKENDS = ("auto", "cuda", "cpu", "reference")

_DENSE = ("(Tensor S, Tensor? query_lengths, Tensor? target_lengths, float gap, float temperature, "
          "*, int lane_columns=0, bool scaled=True)")
_CODES = ("(Tensor query, Tensor target, Tensor matrix, Tensor? query_lengths, Tensor? target_lengths, float gap, "
          "float temperature, *, int lane_columns=0, bool scaled=True)")
SCHEMAS = {
    "scores": f"{_DENSE} -> Tensor",
    "scores_counted": f"{_DENSE} -> (Tensor, Tensor)",
    "scores_codes": f"{_CODES} -> Tensor",
    "scores_codes_counted": f"{_CODES} -> (Tensor, Tensor)",
    "forward": "(Tensor S, Tensor? query_lengths, Tensor? target_lengths, float gap, float temperature, "
               "bool by_rows, *, int lane_columns=0, bool scaled=True) -> (Tensor, Tensor, Tensor, Tensor)",
    "backward": "(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, Tensor? query_lengths, "
                "Tensor? target_lengths, float gap, float temperature, bool by_rows, *, int lane_columns=0) "
                "-> Tensor",
    "empty_launch": "(Tensor S) -> Tensor",
}

_AFFINE_DENSE = ("(Tensor S, Tensor? query_lengths, Tensor? target_lengths, float gap_open, float gap_extend, "
                 "float temperature, *, int lane_columns=0)")
_AFFINE_CODES = ("(Tensor query, Tensor target, Tensor matrix, Tensor? query_lengths, Tensor? target_lengths, "
                 "float gap_open, float gap_extend, float temperature, *, int lane_columns=0)")
SCHEMAS.update({
    "affine_scores": f"{_AFFINE_DENSE} -> Tensor",
    "affine_scores_codes": f"{_AFFINE_CODES} -> Tensor",
    "affine_forward": ("(Tensor S, Tensor? query_lengths, Tensor? target_lengths, float gap_open, float gap_extend, "
                       "float temperature, bool by_rows, *, int lane_columns=0) -> (Tensor, Tensor, Tensor, Tensor)"),
    "affine_backward": "(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, "
                       "Tensor? query_lengths, Tensor? target_lengths, float gap_open, float gap_extend, "
                       "float temperature, bool by_rows, *, int lane_columns=0) -> Tensor",
})

# Exact search scores at t = 0 in 16-bit lanes, CUDA only (kernels/cuda/search_s16.cu; search.ExactSearch).
SCHEMAS["search_scores_s16"] = ("(Tensor query, Tensor target, Tensor target_lengths, Tensor table, int gap_open, "
                                "int gap_extend, int limit) -> (Tensor, Tensor)")

_LIBRARY = torch.library.Library("swcli", "DEF")
for _name, _schema in SCHEMAS.items():
    _LIBRARY.define(_name + _schema)

# The overloads, looked up once: at small sizes the host's time per call sets the rate.
_scores = torch.ops.swcli.scores.default
_scores_codes = torch.ops.swcli.scores_codes.default
_forward = torch.ops.swcli.forward.default
_backward = torch.ops.swcli.backward.default
_affine_scores = torch.ops.swcli.affine_scores.default
_affine_scores_codes = torch.ops.swcli.affine_scores_codes.default
_affine_forward = torch.ops.swcli.affine_forward.default
_affine_backward = torch.ops.swcli.affine_backward.default


# --------------------------------------------------------------------------------------------------
# Engines: compiled at first use, loaded once per process.

_ENGINES = ("cpu", "cuda")  # built by _build.cpu_engine and _build.cuda_engine
_loaded: set[str] = set()
_cuda_ready = False  # the seed's fast path below reads this one flag instead of the set


def load_engine(device) -> None:
    """Build (or load from the cache) the engine that serves tensors on `device` ('cpu', 'cuda' or a
    torch.device), so its kernels are registered with the operators. Cheap once loaded."""
    global _cuda_ready
    kind = torch.device(device).type
    if kind in _loaded:
        return
    if kind not in _ENGINES:
        raise ValueError(f"swcli has no engine for {kind} tensors; use CPU or CUDA tensors, or backend='reference'")
    getattr(_build, f"{kind}_engine")()
    _loaded.add(kind)
    _cuda_ready = "cuda" in _loaded


def _load_engine_for(tensor: torch.Tensor) -> None:
    """The engine of a tensor's device, before an operator call. A graph being compiled cannot build one;
    the fake kernels (below) load it for the device the graph will run on."""
    kind = "cuda" if tensor.is_cuda else "cpu"
    if kind not in _loaded and not torch.compiler.is_compiling():  # the set first: no torch.device per call
        load_engine(kind)


def _load_engine_for_fake(device: torch.device) -> None:
    # A fake kernel runs when a graph that calls the operator is traced (torch.compile, export): the
    # graph will call the real kernel of this device, so its engine must be loaded by then.
    if device.type in _ENGINES:
        load_engine(device.type)


@torch.library.register_fake("swcli::scores")
def _scores_fake(S, query_lengths, target_lengths, gap, temperature, *, lane_columns=0, scaled=True):
    _load_engine_for_fake(S.device)
    return S.new_empty(S.shape[0])


@torch.library.register_fake("swcli::scores_counted")
def _scores_counted_fake(S, *args, **knobs):
    return _scores_fake(S, *args, **knobs), S.new_empty(1, dtype=torch.int32)


@torch.library.register_fake("swcli::scores_codes")
def _scores_codes_fake(query, target, matrix, query_lengths, target_lengths, gap, temperature, *, lane_columns=0,
                       scaled=True):
    _load_engine_for_fake(query.device)
    return query.new_empty(query.shape[0], dtype=torch.float32)


@torch.library.register_fake("swcli::scores_codes_counted")
def _scores_codes_counted_fake(query, *args, **knobs):
    return _scores_codes_fake(query, *args, **knobs), query.new_empty(1, dtype=torch.int32)


@torch.library.register_fake("swcli::forward")
def _forward_fake(S, query_lengths, target_lengths, gap, temperature, by_rows, *, lane_columns=0, scaled=True):
    _load_engine_for_fake(S.device)
    # The state's size depends on the engine's plan (the CPU's table has a zero border, CUDA's table
    # rounds its columns to the lanes, the rows keep every 8th row): only the engine knows it.
    state_size = torch.library.get_ctx().new_dynamic_size()
    B = S.shape[0]
    return (S.new_empty(B), S.new_empty(state_size), S.new_empty(B, dtype=torch.int64),
            S.new_empty(1, dtype=torch.int32))


@torch.library.register_fake("swcli::backward")
def _backward_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap, temperature, by_rows,
                   *, lane_columns=0):
    return S.new_empty(S.shape)


@torch.library.register_fake("swcli::empty_launch")
def _empty_launch_fake(S):
    return S.new_empty(S.shape[0])


def _save_for_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap, temperature, by_rows,
                       lane_columns):
    ctx.save_for_backward(S, query_lengths, target_lengths, state, best, failed)
    # the backward reads the state with the forward's columns per lane
    ctx.settings = (gap, temperature, by_rows, lane_columns)


def _gradient(ctx, grad_scores):
    """d score / d S: the soft-alignment posterior of the paths that end at the best cell, by the engine's
    backward from what its forward kept."""
    S, query_lengths, target_lengths, state, best, failed = ctx.saved_tensors
    gap, temperature, by_rows, lane_columns = ctx.settings
    return _backward(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap, temperature, by_rows,
                     lane_columns=lane_columns)


def _setup_forward_context(ctx, inputs, keyword_only_inputs, output):
    S, query_lengths, target_lengths, gap, temperature, by_rows = inputs
    _, state, best, failed = output
    ctx.mark_non_differentiable(state, best, failed)
    _save_for_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap, temperature, by_rows,
                       keyword_only_inputs["lane_columns"])


def _forward_gradient(ctx, grad_scores, _grad_state, _grad_best, _grad_failed):
    return _gradient(ctx, grad_scores), None, None, None, None, None


torch.library.register_autograd("swcli::forward", _forward_gradient, setup_context=_setup_forward_context)


class _ForwardWithGradient(torch.autograd.Function):
    """The registered autograd of the forward operator, as soft_smith_waterman calls it in eager mode: the
    same saved tensors and backward, without the registered formula's cost on the host (the dispatcher
    calls back into Python, which fills the schema's defaults and redispatches: about 30 us a call on a
    CPU, where this takes 10). In forward + backward that time is the GPU's too: the rows' backward
    waits for the forward before its launch, so the next step's host work finds the GPU idle. Compiled
    graphs and direct calls of the operator take the registered formula."""

    @staticmethod
    def forward(ctx, S, query_lengths, target_lengths, gap, temperature, by_rows):
        with torch._C._AutoDispatchBelowAutograd():
            scores, state, best, failed = _forward(S, query_lengths, target_lengths, gap, temperature, by_rows)
        _save_for_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap, temperature, by_rows, 0)
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        return _gradient(ctx, grad_scores), None, None, None, None, None


# --------------------------------------------------------------------------------------------------
# The affine operators: fake kernels and autograd, as the linear ones'.


@torch.library.register_fake("swcli::affine_scores")
def _affine_scores_fake(S, query_lengths, target_lengths, gap_open, gap_extend, temperature, *, lane_columns=0):
    _load_engine_for_fake(S.device)
    return S.new_empty(S.shape[0])


@torch.library.register_fake("swcli::affine_scores_codes")
def _affine_scores_codes_fake(query, target, matrix, query_lengths, target_lengths, gap_open, gap_extend,
                              temperature, *, lane_columns=0):
    _load_engine_for_fake(query.device)
    return query.new_empty(query.shape[0], dtype=torch.float32)


@torch.library.register_fake("swcli::affine_forward")
def _affine_forward_fake(S, query_lengths, target_lengths, gap_open, gap_extend, temperature, by_rows, *,
                         lane_columns=0):
    _load_engine_for_fake(S.device)
    # As the linear forward's: the state's layout is the engine's own (the CPU keeps three tables).
    state_size = torch.library.get_ctx().new_dynamic_size()
    B = S.shape[0]
    return (S.new_empty(B), S.new_empty(state_size), S.new_empty(B, dtype=torch.int64),
            S.new_empty(1, dtype=torch.int32))


@torch.library.register_fake("swcli::affine_backward")
def _affine_backward_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap_open, gap_extend,
                          temperature, by_rows, *, lane_columns=0):
    return S.new_empty(S.shape)


@torch.library.register_fake("swcli::search_scores_s16")
def _search_scores_s16_fake(query, target, target_lengths, table, gap_open, gap_extend, limit):
    return target.new_empty(target.shape[0], dtype=torch.int32), target.new_empty(1, dtype=torch.int32)


def _save_for_affine_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap_open, gap_extend,
                              temperature, by_rows, lane_columns):
    ctx.save_for_backward(S, query_lengths, target_lengths, state, best, failed)
    ctx.settings = (gap_open, gap_extend, temperature, by_rows, lane_columns)


def _affine_gradient(ctx, grad_scores):
    """d score / d S with affine gaps: the posterior of the match states on the paths that end at the best
    cell, by the engine's backward from what its forward kept."""
    S, query_lengths, target_lengths, state, best, failed = ctx.saved_tensors
    gap_open, gap_extend, temperature, by_rows, lane_columns = ctx.settings
    return _affine_backward(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap_open, gap_extend,
                            temperature, by_rows, lane_columns=lane_columns)


def _setup_affine_forward_context(ctx, inputs, keyword_only_inputs, output):
    S, query_lengths, target_lengths, gap_open, gap_extend, temperature, by_rows = inputs
    _, state, best, failed = output
    ctx.mark_non_differentiable(state, best, failed)
    _save_for_affine_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap_open, gap_extend,
                              temperature, by_rows, keyword_only_inputs["lane_columns"])


def _affine_forward_gradient(ctx, grad_scores, _grad_state, _grad_best, _grad_failed):
    return _affine_gradient(ctx, grad_scores), None, None, None, None, None, None


torch.library.register_autograd("swcli::affine_forward", _affine_forward_gradient,
                                setup_context=_setup_affine_forward_context)


class _AffineForwardWithGradient(torch.autograd.Function):
    """The registered autograd of affine_forward, as soft_smith_waterman calls it in eager mode (see
    _ForwardWithGradient for why): the same saved tensors and backward."""

    @staticmethod
    def forward(ctx, S, query_lengths, target_lengths, gap_open, gap_extend, temperature, by_rows):
        with torch._C._AutoDispatchBelowAutograd():
            scores, state, best, failed = _affine_forward(S, query_lengths, target_lengths, gap_open, gap_extend,
                                                          temperature, by_rows)
        _save_for_affine_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap_open, gap_extend,
                                  temperature, by_rows, 0)
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        return _affine_gradient(ctx, grad_scores), None, None, None, None, None, None


# --------------------------------------------------------------------------------------------------
# Checks


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
    """checks: (values, low, high, message): every entry of values must lie in [low, high]; message(lowest,
    highest) says what is wrong, and message(None, None) the rule alone. The smallest and largest entry of every non-empty tensor come from the
    device in one round trip, since each read waits for the device. A graph being compiled cannot read
    the device: there each check is queued on it (torch._assert_async), and a failure stops the graph's
    run with the message."""
    checks = [check for check in checks if check[0].numel()]
    if not checks:
        return
    if torch.compiler.is_compiling():
        for values, low, high, message in checks:
            torch._assert_async(((values >= low) & (values <= high)).all(), message(None, None))
        return
    extremes = torch.stack([x for values, *_ in checks for x in torch.aminmax(values)]).tolist()
    for k, (_, low, high, message) in enumerate(checks):
        lowest, highest = extremes[2 * k], extremes[2 * k + 1]
        if lowest < low or highest > high:
            raise ValueError(message(lowest, highest))


def _length_range(name: str, values: torch.Tensor, limit: int, dim: str):
    """The check that lengths lie in [0, limit] (for _check_ranges)."""
    rule = f"{name} must lie in [0, {limit}] ({dim} of the score matrix)"
    return values, 0, limit, lambda low, high: rule if low is None else f"{rule}, got min {low}, max {high}"


def _code_range(name: str, codes: torch.Tensor, K: int):
    """The check that codes index a K x K matrix (for _check_ranges)."""
    return codes, 0, K - 1, lambda low, high: (f"{name} holds a code outside the {K} x {K} matrix" if high is None
                                               else f"{name} holds code {high}, outside the {K} x {K} matrix")


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


def _check_gaps(gap, gap_open, gap_extend):
    """(gap, None) for a linear gap, or (None, (gap_open, gap_extend)) for affine gaps, checked (the rule
    is in the module docstring)."""
    if gap_open is None and gap_extend is None:
        return _check_number("gap", -1.0 if gap is None else gap), None
    if gap_open is None or gap_extend is None:
        given, missing = ("gap_open", "gap_extend") if gap_extend is None else ("gap_extend", "gap_open")
        raise ValueError(f"affine gaps need both gap_open and gap_extend: {given} was given without {missing} "
                         "(for a linear gap, give gap alone)")
    if gap is not None:
        raise ValueError("give either gap (a linear gap score) or gap_open and gap_extend (affine gaps), not both")
    gap_open = _check_number("gap_open", gap_open)
    gap_extend = _check_number("gap_extend", gap_extend)
    if gap_extend > 0:
        raise ValueError(f"gap_extend must be <= 0 (a score added for each further gap position), got {gap_extend}")
    if gap_open > gap_extend:
        raise ValueError(f"gap_open must be <= gap_extend (a gap's first position scores at most what each further "
                         f"one does), got gap_open={gap_open}, gap_extend={gap_extend}")
    return None, (gap_open, gap_extend)


def _check_arguments(temperature, backend: str, tensor: torch.Tensor, shape: tuple[int, int, int],
                     query_lengths, target_lengths, ranges=()):
    """The checks both entry points share besides the gaps': (temperature, resolved backend, qlen, tlen).
    `tensor` is the input whose device the lengths must match; `ranges` are the caller's own range
    checks, read from the device with the lengths' (see _check_ranges)."""
    temperature = _check_number("temperature", temperature)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is the exact hard maximum), got {temperature}")
    backend = _resolve_backend(backend, tensor)
    B, M, N = shape
    qlen = _check_lengths("query_lengths", query_lengths, B, tensor.device)
    tlen = _check_lengths("target_lengths", target_lengths, B, tensor.device)
    ranges = list(ranges)
    if qlen is not None:
        ranges.append(_length_range("query_lengths", qlen, M, "M"))
    if tlen is not None:
        ranges.append(_length_range("target_lengths", tlen, N, "N"))
    _check_ranges(ranges)
    return temperature, backend, qlen, tlen


def prepare_backend(backend: str) -> None:
    """Build (or load) the engine behind a resolved backend now, so a first compile or a build error
    comes before any output rather than in the middle of it."""
    if backend != "reference":
        load_engine(backend)


# --------------------------------------------------------------------------------------------------
# The gradient's scheme

# The gradient by rows (CUDA; docs/design.md): the forward keeps every 8th row of the DP instead of the
# table, and the backward computes the rows between again. A rows warp spans ROWS_WIDEST columns whatever
# N is, where the table's kernels take tiles of 128 columns and, with per-pair lengths, only the lengths'
# cells: below these widths the table is faster (docs/benchmarks/h200.md).
ROWS_WIDEST = 256
ROWS_NARROWEST = 129
ROWS_NARROWEST_WITH_LENGTHS = 193
# The largest |gap_open| log2(e) / t of the scaled affine cell (affine_shared_limit in kernels/cuda/affine.cuh).
AFFINE_SHARED_LIMIT = 100.0


def gradient_by_rows(S: torch.Tensor, lengths: bool, gap: float, temperature: float) -> bool:
    """Whether the gradient of this call goes by rows: float32 CUDA scores at t > 0 with gap <= 0, N
    between ROWS_NARROWEST (with lengths ROWS_NARROWEST_WITH_LENGTHS) and ROWS_WIDEST, and no CUDA graph
    being captured or compiled: the rows' backward reads one int from the device (how many pairs left
    the scaled range), which a capture does not allow, and a compiled graph may be replayed as one."""
    narrowest = ROWS_NARROWEST_WITH_LENGTHS if lengths else ROWS_NARROWEST
    return (S.is_cuda and S.dtype is torch.float32 and temperature > 0 and gap <= 0
            and narrowest <= S.shape[2] <= ROWS_WIDEST and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing())


def affine_gradient_by_rows(S: torch.Tensor, lengths: bool, gap_open: float, temperature: float) -> bool:
    """Whether an affine gradient goes by rows: float32 CUDA scores at t > 0 in the scaled affine form
    (|gap_open| log2(e) / t <= 100: a gap opening's factor 2^(gap_open log2(e) / t) at or above 2^-100,
    kernels/cuda/affine_scaled.cuh), N up to ROWS_WIDEST, outside CUDA graph capture and compilation (as
    gradient_by_rows). Unlike the linear table's, the affine state's path is slower at every width
    (docs/benchmarks/h200.md), with or without lengths."""
    return (S.is_cuda and S.dtype is torch.float32 and temperature > 0 and S.shape[2] <= ROWS_WIDEST
            and -gap_open * (1.4426950408889634 / temperature) <= AFFINE_SHARED_LIMIT  # as the engine rounds it
            and not torch.compiler.is_compiling() and not torch.cuda.is_current_stream_capturing())


# --------------------------------------------------------------------------------------------------
# The public functions


def soft_smith_waterman(
    score_matrix: torch.Tensor,
    gap: float | None = None,
    temperature: float = 1.0,
    query_lengths=None,
    target_lengths=None,
    backend: str = "auto",
    *,
    gap_open: float | None = None,
    gap_extend: float | None = None,
) -> torch.Tensor:
    """Soft Smith-Waterman local alignment scores, (B,), of a batch of score matrices (B, M, N).

    gap is the linear score added per gap position (normally negative; -1.0 when not given). With
    gap_open and gap_extend (and no gap) the gaps are affine, soft Gotoh: gap_open for a gap's first
    position, gap_extend for each further one, gap_open <= gap_extend <= 0. Temperature 0 is classic hard
    Smith-Waterman (Gotoh's with affine gaps). Pair b is scored on
    score_matrix[b, :query_lengths[b], :target_lengths[b]].
    backend: 'auto' (CUDA for GPU tensors, else the compiled CPU engine), 'cuda', 'cpu', or 'reference'
    (the Python loop). float16/bfloat16 are computed in float32; the result has the input's dtype.
    """
    if gap is None and gap_open is None and gap_extend is None:
        gap = -1.0
    if (_cuda_ready and type(gap) is float and type(temperature) is float and gap_open is None
            and gap_extend is None and query_lengths is None and target_lengths is None and backend == "auto"
            and type(score_matrix) is torch.Tensor and score_matrix.is_cuda and score_matrix.dtype is torch.float32
            and score_matrix.dim() == 3 and not score_matrix.requires_grad and temperature >= 0
            and math.isfinite(gap) and math.isfinite(temperature)):
        # Inference on full float32 pairs on the GPU with a linear gap, every argument checked as below but
        # in fewer steps: at small sizes (the seed's) the host's time per call sets the rate.
        return _scores(score_matrix, None, None, gap, temperature)
    if not isinstance(score_matrix, torch.Tensor):
        raise ValueError(f"score_matrix must be a torch.Tensor, got {type(score_matrix).__name__}")
    if score_matrix.dim() != 3:
        raise ValueError(f"score_matrix must be 3-D (B, M, N), got shape {tuple(score_matrix.shape)}")
    dtype = score_matrix.dtype
    if not dtype.is_floating_point:
        raise ValueError(f"score_matrix must be floating point, got dtype {dtype}")
    gap, affine = _check_gaps(gap, gap_open, gap_extend)
    temperature, backend, qlen, tlen = _check_arguments(
        temperature, backend, score_matrix, score_matrix.shape, query_lengths, target_lengths)

    S = score_matrix
    if dtype is torch.float16 or dtype is torch.bfloat16:
        S = S.float()
    if affine is not None:
        scores = _affine_scores_of(S, qlen, tlen, *affine, temperature, backend)
    elif backend == "reference":
        scores = soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    else:
        _load_engine_for(S)
        if torch.is_grad_enabled() and S.requires_grad:
            by_rows = gradient_by_rows(S, qlen is not None or tlen is not None, gap, temperature)
            if torch.compiler.is_compiling():
                scores = _forward(S, qlen, tlen, gap, temperature, by_rows)[0]
            else:
                scores = _ForwardWithGradient.apply(S, qlen, tlen, gap, temperature, by_rows)
        else:  # no gradient: no DP table, and none of autograd's overhead (it counts at small sizes)
            scores = _scores(S, qlen, tlen, gap, temperature)
    return scores if S is score_matrix else scores.to(dtype)


def _require_affine_kernels(tensor: torch.Tensor) -> None:
    """A clear error, instead of the dispatcher's, where the engine of a CUDA tensor has no affine kernels
    (the CUDA engine's are not written yet); checked once they are registered, so nothing changes then."""
    if tensor.is_cuda and not torch.compiler.is_compiling() and not torch._C._dispatch_has_kernel_for_dispatch_key(
            "swcli::affine_scores", "CUDA"):
        raise ValueError("affine gaps (gap_open, gap_extend) have no CUDA kernels yet: score CPU tensors, or use "
                         "backend='reference'")


def _affine_scores_of(S, qlen, tlen, gap_open: float, gap_extend: float, temperature: float,
                      backend: str) -> torch.Tensor:
    """soft_smith_waterman's affine scores of float32/float64 S, past its checks."""
    if backend == "reference":
        return soft_smith_waterman_affine_reference(S, gap_open, gap_extend, temperature, qlen, tlen)
    _load_engine_for(S)
    _require_affine_kernels(S)
    if torch.is_grad_enabled() and S.requires_grad:
        by_rows = affine_gradient_by_rows(S, qlen is not None or tlen is not None, gap_open, temperature)
        if torch.compiler.is_compiling():
            return _affine_forward(S, qlen, tlen, gap_open, gap_extend, temperature, by_rows)[0]
        return _AffineForwardWithGradient.apply(S, qlen, tlen, gap_open, gap_extend, temperature, by_rows)
    return _affine_scores(S, qlen, tlen, gap_open, gap_extend, temperature)


def soft_smith_waterman_codes(
    query_codes: torch.Tensor,
    target_codes: torch.Tensor,
    matrix: torch.Tensor,
    gap: float | None = None,
    temperature: float = 1.0,
    query_lengths=None,
    target_lengths=None,
    backend: str = "auto",
    *,
    gap_open: float | None = None,
    gap_extend: float | None = None,
) -> torch.Tensor:
    """Scores (B,) of pairs given as uint8 codes (B, M), (B, N) into a K x K substitution matrix.

    The gaps as in soft_smith_waterman: gap (linear, -1.0 when not given), or gap_open and gap_extend
    (affine). The compiled engines look each score up in the matrix as they go, so the (B, M, N) score
    tensor is never built (it would cost more than the alignment itself); backend='reference' builds it
    with a gather and runs the Python loop in the matrix's dtype. No gradient: use soft_smith_waterman for
    that.
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
    gap, affine = _check_gaps(gap, gap_open, gap_extend)
    temperature, backend, qlen, tlen = _check_arguments(
        temperature, backend, query_codes, (B, M, target_codes.shape[1]), query_lengths, target_lengths,
        (_code_range("query_codes", query_codes, K), _code_range("target_codes", target_codes, K)))
    gap_open, gap_extend = affine or (None, None)
    return score_checked_codes(query_codes, target_codes, matrix.to(query_codes.device), gap, temperature, qlen,
                               tlen, backend, gap_open=gap_open, gap_extend=gap_extend)


def score_checked_codes(query_codes, target_codes, matrix, gap: float | None, temperature: float, qlen, tlen,
                        backend: str, *, gap_open: float | None = None,
                        gap_extend: float | None = None) -> torch.Tensor:
    """soft_smith_waterman_codes past its checks, for callers whose codes, lengths (int64 on the codes'
    device, or None), matrix (on that device) and gaps are valid by construction: the pipeline's batches.
    Affine when gap_open and gap_extend are given (gap is then None), else linear with gap. On CUDA the
    checks wait for the device (the largest code, the lengths' range), and in the pipeline's scoring
    thread each wait can also wait for the GIL."""
    affine = gap_open is not None
    if backend == "reference":
        S = matrix[query_codes.long()[:, :, None], target_codes.long()[:, None, :]]
        if affine:
            return soft_smith_waterman_affine_reference(S, gap_open, gap_extend, temperature, qlen, tlen)
        return soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    _load_engine_for(query_codes)
    if affine:
        _require_affine_kernels(query_codes)
        return _affine_scores_codes(query_codes, target_codes, matrix, qlen, tlen, gap_open, gap_extend, temperature)
    return _scores_codes(query_codes, target_codes, matrix, qlen, tlen, gap, temperature)


class SoftSmithWaterman(nn.Module):
    """Drop-in for the reference module: same constructor, forward(score_matrix) -> (B,) scores.

    gap_open keeps the seed module's meaning, the linear gap score added for every gap position, unless
    gap_extend is given: then the gaps are affine, gap_open for a gap's first position and gap_extend
    for each further one (soft_smith_waterman's gap_open and gap_extend)."""

    def __init__(self, gap_open: float = -1.0, temperature: float = 1.0, backend: str = "auto", *,
                 gap_extend: float | None = None):
        super().__init__()
        self.gap_open = gap_open
        self.temperature = temperature
        self.backend = backend
        self.gap_extend = gap_extend

    def forward(self, score_matrix, query_lengths=None, target_lengths=None):
        if self.gap_extend is None:
            return soft_smith_waterman(score_matrix, self.gap_open, self.temperature,
                                       query_lengths, target_lengths, self.backend)
        return soft_smith_waterman(score_matrix, None, self.temperature, query_lengths, target_lengths, self.backend,
                                   gap_open=self.gap_open, gap_extend=self.gap_extend)

    def extra_repr(self) -> str:
        extend = "" if self.gap_extend is None else f", gap_extend={self.gap_extend}"
        return f"gap_open={self.gap_open}{extend}, temperature={self.temperature}, backend={self.backend!r}"
