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
* backward_parameters: backward, and per pair (a (2, B) tensor) the incoming gradient times d score / d gap
  and <S, grad_S>, which the gradients of the gap and the temperature take (_gradients_from_sums);
* empty_launch: an empty CUDA kernel behind a (B,) allocation, the launch-overhead yardstick of bench;
* affine_scores, affine_scores_codes, affine_forward, affine_backward: the same roles with affine gaps
  (soft Gotoh: an open score for a gap's first position, an extension score for each further one; the
  recurrence is in swcli/reference.py). affine_forward returns the scores, the state its backward reads
  and the engine's record of each pair's best cell; autograd is registered on it, with affine_backward
  as its gradient; affine_backward_parameters is backward_parameters' twin, its sums (3, B) those of
  gap_open, gap_extend and <S, grad_S>.
* scores_per_pair, posterior_per_pair, affine_scores_per_pair, affine_posterior_per_pair: the gaps and
  the temperature as (B,) tensors, one value per pair, for model builders who learn them. The posterior
  operators return the scores, d score[b] / d S[b] (the soft alignment, S's shape) and d score[b] / d gap
  for each gap score (B,): the expected number of gap positions (linear), of gap openings and of
  extensions (affine). Their autograd scales these by the incoming gradient and takes d score / d t
  from them (see _per_pair_gradients). The CPU engine's kernels are in kernels/cpu; the CUDA engine's
  are here (_scores_per_pair_by_groups, _posterior_per_pair_by_groups): its operators with numbers, run
  once per group of pairs with equal values. In eager mode soft_smith_waterman takes neither for a
  gradient: it runs forward and, at backward time, backward_parameters (_ParametersWithGradient).
* forward_per_pair, backward_parameters_per_pair, affine_forward_per_pair,
  affine_backward_parameters_per_pair (CUDA only): the gradient by rows with the (B,) values read by the
  kernels on the device, which soft_smith_waterman takes in eager mode where the rows take the scores
  (_RowsPerPair): no copy of the values to the host before the forward.

Each has a fake kernel, so torch.compile, torch.export and meta tensors see one op with known shapes
(but for backward_parameters_per_pair's gradient where the forward counted a failed pair: a (0,) tensor,
which only eager calls meet).
The keyword-only arguments are the engines' knobs for tests and tools: lane_columns (CUDA: columns per
lane, 0 = chosen by batch size; the dense linear operators also take LANE_COLUMNS_TILES, -1: each pair's DP in
tiles swept by many warps, which 0 chooses for long pairs in small batches, kernels/cuda/long_pairs.cu) and
scaled (allow the scaled-space sweep).

Gaps: `gap` is a linear gap score, added for every gap position. `gap_open` with `gap_extend` make the
gaps affine: gap_open is the score of a gap's first position, gap_extend of each further one, so a gap of
length k scores gap_open + (k - 1) gap_extend (BLAST's 11/1 is gap_open=-12, gap_extend=-1), and
gap_open <= gap_extend <= 0. The two kinds are exclusive: affine gaps take both keywords and no `gap`.
With gap_open == gap_extend == g the affine op computes the linear recurrence with gap g (to rounding).
"""

from __future__ import annotations

import contextlib
import math
from numbers import Real

import numpy as np
import torch
from torch import nn
from torch.autograd import forward_ad
from torch.nn.utils import parametrize

from swcli import _build
from swcli.errors import TorchVersionError
from swcli.reference import soft_smith_waterman_affine_reference, soft_smith_waterman_reference

# register_fake and register_autograd came with torch 2.4, register_vmap with 2.5: an older torch fails
# here with its version named, not on an attribute further down.
if not hasattr(torch.library, "register_vmap"):
    raise TorchVersionError(f"swcli needs torch >= 2.5 (torch.library.register_vmap); this is torch "
                            f"{torch.__version__}")

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
    "backward_parameters": "(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, "
                           "Tensor? query_lengths, Tensor? target_lengths, float gap, float temperature, bool by_rows, "
                           "*, int lane_columns=0) -> (Tensor, Tensor)",
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
    "affine_backward_parameters": "(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, "
                                  "Tensor? query_lengths, Tensor? target_lengths, float gap_open, float gap_extend, "
                                  "float temperature, bool by_rows, *, int lane_columns=0) -> (Tensor, Tensor)",
})

_PER_PAIR = "(Tensor S, Tensor? query_lengths, Tensor? target_lengths, Tensor gap, Tensor temperature)"
_AFFINE_PER_PAIR = ("(Tensor S, Tensor? query_lengths, Tensor? target_lengths, Tensor gap_open, Tensor gap_extend, "
                    "Tensor temperature)")
SCHEMAS.update({
    "scores_per_pair": f"{_PER_PAIR} -> Tensor",
    "posterior_per_pair": f"{_PER_PAIR} -> (Tensor, Tensor, Tensor)",
    "affine_scores_per_pair": f"{_AFFINE_PER_PAIR} -> Tensor",
    "affine_posterior_per_pair": f"{_AFFINE_PER_PAIR} -> (Tensor, Tensor, Tensor, Tensor)",
})

# The gradient by rows with the gaps and the temperature read on the device, CUDA only (kernels/cuda/ops.cpp:
# op_forward_per_pair; _RowsPerPair below): (B,) float32 values, any stride; grad_S is a (0,) tensor where the
# forward counted a failed pair.
SCHEMAS.update({
    "forward_per_pair": f"{_PER_PAIR} -> (Tensor, Tensor, Tensor, Tensor)",
    "backward_parameters_per_pair": ("(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, "
                                     "Tensor? query_lengths, Tensor? target_lengths, Tensor gap, Tensor temperature) "
                                     "-> (Tensor, Tensor)"),
    "affine_forward_per_pair": f"{_AFFINE_PER_PAIR} -> (Tensor, Tensor, Tensor, Tensor)",
    "affine_backward_parameters_per_pair": ("(Tensor grad_scores, Tensor S, Tensor state, Tensor best, Tensor failed, "
                                            "Tensor? query_lengths, Tensor? target_lengths, Tensor gap_open, "
                                            "Tensor gap_extend, Tensor temperature) -> (Tensor, Tensor)"),
})

# Exact search scores at t = 0 in 16-bit lanes, CUDA only (kernels/cuda/search_s16.cu; search.ExactSearch).
SCHEMAS["search_scores_s16"] = ("(Tensor query, Tensor target, Tensor target_lengths, Tensor table, int gap_open, "
                                "int gap_extend, int limit) -> (Tensor, Tensor)")

# Soft search scores at t > 0 in float32, CUDA only (kernels/cuda/search_soft.cu; search.SoftSearch).
SCHEMAS["search_scores_soft"] = ("(Tensor query, Tensor target, Tensor target_lengths, Tensor powers, int warps, "
                                 "bool affine, float gap_factor, float extend_factor, float temperature, int upper, "
                                 "int middle, int floor, float bound) -> (Tensor, Tensor)")

# lane_columns of the CUDA engine's dense linear operators (scores, forward, backward) that asks for tiles of
# long pairs at any size (tests, tools); 0 takes them for long pairs in small batches (kernels/cuda/ops.cpp,
# tiles_take; docs/design.md section 4).
LANE_COLUMNS_TILES = -1

_LIBRARY = torch.library.Library("swcli", "DEF")
for _name, _schema in SCHEMAS.items():
    _LIBRARY.define(_name + _schema)

# The overloads, looked up once: at small sizes the host's time per call sets the rate.
_scores = torch.ops.swcli.scores.default
_scores_codes = torch.ops.swcli.scores_codes.default
_forward = torch.ops.swcli.forward.default
_backward = torch.ops.swcli.backward.default
_backward_parameters = torch.ops.swcli.backward_parameters.default
_affine_scores = torch.ops.swcli.affine_scores.default
_affine_scores_codes = torch.ops.swcli.affine_scores_codes.default
_affine_forward = torch.ops.swcli.affine_forward.default
_affine_backward = torch.ops.swcli.affine_backward.default
_affine_backward_parameters = torch.ops.swcli.affine_backward_parameters.default
_scores_per_pair = torch.ops.swcli.scores_per_pair.default
_posterior_per_pair = torch.ops.swcli.posterior_per_pair.default
_affine_scores_per_pair = torch.ops.swcli.affine_scores_per_pair.default
_affine_posterior_per_pair = torch.ops.swcli.affine_posterior_per_pair.default
_forward_per_pair = torch.ops.swcli.forward_per_pair.default
_backward_parameters_per_pair = torch.ops.swcli.backward_parameters_per_pair.default
_affine_forward_per_pair = torch.ops.swcli.affine_forward_per_pair.default
_affine_backward_parameters_per_pair = torch.ops.swcli.affine_backward_parameters_per_pair.default


# --------------------------------------------------------------------------------------------------
# Engines: compiled at first use, loaded once per process.

_ENGINES = ("cpu", "cuda")  # built by _build.cpu_engine and _build.cuda_engine
_loaded: set[str] = set()
_cuda_ready = False  # the seed's fast path below reads this one flag instead of the set


def load_engine(device) -> None:
    """Build (or load from the cache) the engine that serves tensors on `device` ('cpu', 'cuda' or a
    torch.device), so its kernels are registered with the operators. Cheap once loaded. The op's functions
    call it themselves; a program that calls the operators without them (one saved by torch.export or
    torch.jit and loaded in a new process, a scripted module) needs it first."""
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
    # Compiling first: dynamo would guard the graph on the set, which the fake kernel changes while it traces
    # (the guard then fails on the frame that made it). The set next: no torch.device per call.
    if not torch.compiler.is_compiling():
        kind = "cuda" if tensor.is_cuda else "cpu"
        if kind not in _loaded:
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


def _state_size(S, tables: int):
    """The size of a forward's state: only the engine knows it (the CPU's table has a zero border, CUDA's
    table rounds its columns to the lanes, the rows keep every 8th row), so a traced graph holds a dynamic
    size. Meta tensors run no engine and have no shape environment: they get the CPU's size."""
    if S.device.type == "meta":
        B, M, N = S.shape
        return tables * B * (M + 1) * (N + 1)
    return torch.library.get_ctx().new_dynamic_size()


def _forward_outputs_fake(S, tables: int):
    """A forward's (scores, state, best, failed) that keeps `tables` tables of state (_state_size)."""
    _load_engine_for_fake(S.device)
    B = S.shape[0]
    return (S.new_empty(B), S.new_empty(_state_size(S, tables)), S.new_empty(B, dtype=torch.int64),
            S.new_empty(1, dtype=torch.int32))


@torch.library.register_fake("swcli::forward")
def _forward_fake(S, query_lengths, target_lengths, gap, temperature, by_rows, *, lane_columns=0, scaled=True):
    return _forward_outputs_fake(S, 1)


@torch.library.register_fake("swcli::backward")
def _backward_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap, temperature, by_rows,
                   *, lane_columns=0):
    return S.new_empty(S.shape)


@torch.library.register_fake("swcli::backward_parameters")
def _backward_parameters_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap, temperature,
                              by_rows, *, lane_columns=0):
    return S.new_empty(S.shape), S.new_empty(2, S.shape[0])


@torch.library.register_fake("swcli::empty_launch")
def _empty_launch_fake(S):
    return S.new_empty(S.shape[0])


def _save_for_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap, temperature, by_rows,
                       lane_columns):
    ctx.save_for_backward(S, query_lengths, target_lengths, state, best, failed)
    # the backward reads the state with the forward's columns per lane
    ctx.settings = (gap, temperature, by_rows, lane_columns)


NOT_TWICE_DIFFERENTIABLE = (
    "swcli: the compiled engines' gradient is not differentiable (no double backward, no Hessian): use "
    "backend='reference' for second derivatives")
NO_FORWARD_MODE = (
    "swcli: the op has no forward-mode derivative (torch.func.jvp, jacfwd, torch.autograd.forward_ad): its "
    "gradient is reverse mode; use backward(), torch.func.grad, vjp or jacrev")


def _refuse_forward_mode(*tensors) -> None:
    """NO_FORWARD_MODE where an input carries a forward-mode tangent: the compiled engines' operators have
    no formula for one, and the output's tangent would otherwise come out as zero; NOT_TWICE_DIFFERENTIABLE
    where two torch.func transforms differentiate the inputs at once (grad of grad, hessian): the inner
    gradient would be a constant to the outer one. The reference loop is plain torch operations and takes
    every mode, so it is not refused."""
    kinds = _differentiating_transforms(tensors)
    if len(kinds) > 1:
        raise RuntimeError(NOT_TWICE_DIFFERENTIABLE)
    if kinds and kinds[0] == "forward" or _has_dual_tangent(tensors):
        raise RuntimeError(NO_FORWARD_MODE)


def _differentiating_transforms(tensors) -> list[str]:
    """'forward' (jvp, jacfwd) or 'reverse' (grad, vjp, jacrev) for each torch.func transform level that
    differentiates one of the tensors. A tensor is wrapped at the level of every transform it meets, even
    one that does not differentiate it (a vmap inside a jvp wraps what it takes from outside), so the test
    is its tangent or requires_grad at that level, which show only while that transform is the innermost:
    the transforms inside it are set aside meanwhile."""
    functorch = torch._C._functorch
    if not _in_functorch():
        return []
    levels = {}
    for x in tensors:
        if not isinstance(x, torch.Tensor):
            continue
        with contextlib.ExitStack() as set_aside:
            while functorch.is_functorch_wrapped_tensor(x):
                level = functorch.maybe_get_level(x)
                while (top := functorch.peek_interpreter_stack()) is not None and top.level() > level:
                    set_aside.enter_context(torch._functorch.pyfunctorch.temporarily_pop_interpreter_stack())
                if top is None or top.level() != level:  # a wrapper whose transform has ended (escaped it)
                    break
                key = top.key()
                if key == functorch.TransformType.Jvp and forward_ad.unpack_dual(x).tangent is not None:
                    levels[level] = "forward"
                elif key == functorch.TransformType.Grad and x.requires_grad:
                    levels[level] = "reverse"
                x = functorch.get_unwrapped(x)
    return list(levels.values())


def _has_dual_tangent(tensors) -> bool:
    """Whether a tensor carries torch.autograd.forward_ad's tangent (on the tensor itself, under any
    torch.func wrappers)."""
    if forward_ad._current_level < 0:
        return False
    with torch._C._DisableFuncTorch():
        for x in tensors:
            if isinstance(x, torch.Tensor):
                while torch._C._functorch.is_functorch_wrapped_tensor(x):
                    x = torch._C._functorch.get_unwrapped(x)
                if forward_ad.unpack_dual(x).tangent is not None:
                    return True
    return False


class _NotTwiceDifferentiable(torch.autograd.Function):
    """A gradient as it is (a view), whose own gradient raises NOT_TWICE_DIFFERENTIABLE: under torch.func
    transforms, the form of _once_differentiable's error node. Applied at every level, it raises wherever
    one differentiates the gradient, ordinary autograd outside the transform included."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad, *inputs):
        return grad.view_as(grad)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *_grads):
        raise RuntimeError(NOT_TWICE_DIFFERENTIABLE)


def _once_differentiable(inputs, *grads):
    """The gradients, made to raise NOT_TWICE_DIFFERENTIABLE if a double backward reaches them: where the
    backward runs with grad mode on (create_graph=True, torch.func.grad) they would otherwise come back as
    constants, and a second derivative through them would be silently wrong (zero). The error node takes
    the op's inputs that require grad (and the incoming gradient) as its own, so that differentiating the
    gradients by any of them runs it; torch.autograd.function.once_differentiable's node hangs off new
    leaves, which autograd prunes. Under torch.func transforms the node is _NotTwiceDifferentiable, for the
    ordinary autograd outside them (nested transforms are refused up front: _refuse_forward_mode)."""
    if not torch.is_grad_enabled():
        return grads
    present = [g for g in grads if g is not None]
    if _in_functorch():
        connected = [x for x in inputs if isinstance(x, torch.Tensor) and _needs_grad(x)]
        if not present or not connected:
            return grads
        return tuple(None if g is None else _NotTwiceDifferentiable.apply(g, *connected) for g in grads)
    connected = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    if not present or not connected:
        return grads
    delayed = torch._C._functions.DelayedError(NOT_TWICE_DIFFERENTIABLE.encode(), len(present) + len(connected))
    aliased = iter(delayed(*[g.detach().requires_grad_() for g in present], *connected)[:len(present)])
    return tuple(None if g is None else next(aliased) for g in grads)


def _gradient(ctx, grad_scores):
    """d score / d S: the soft-alignment posterior of the paths that end at the best cell, by the engine's
    backward from what its forward kept."""
    S, query_lengths, target_lengths, state, best, failed = ctx.saved_tensors
    gap, temperature, by_rows, lane_columns = ctx.settings
    with torch.no_grad():
        grad = _backward(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap, temperature,
                         by_rows, lane_columns=lane_columns)
    return _once_differentiable((S, grad_scores), grad)[0]


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
    # As the linear forward's: the state's layout is the engine's own (the CPU keeps three tables).
    return _forward_outputs_fake(S, 3)


@torch.library.register_fake("swcli::affine_backward")
def _affine_backward_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap_open, gap_extend,
                          temperature, by_rows, *, lane_columns=0):
    return S.new_empty(S.shape)


@torch.library.register_fake("swcli::affine_backward_parameters")
def _affine_backward_parameters_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap_open,
                                     gap_extend, temperature, by_rows, *, lane_columns=0):
    return S.new_empty(S.shape), S.new_empty(3, S.shape[0])


@torch.library.register_fake("swcli::search_scores_s16")
def _search_scores_s16_fake(query, target, target_lengths, table, gap_open, gap_extend, limit):
    return target.new_empty(target.shape[0], dtype=torch.int32), target.new_empty(1, dtype=torch.int32)


@torch.library.register_fake("swcli::search_scores_soft")
def _search_scores_soft_fake(query, target, target_lengths, powers, warps, affine, gap_factor, extend_factor,
                             temperature, upper, middle, floor, bound):
    return target.new_empty(target.shape[0], dtype=torch.float32), target.new_empty(1, dtype=torch.int32)


def _save_for_affine_gradient(ctx, S, query_lengths, target_lengths, state, best, failed, gap_open, gap_extend,
                              temperature, by_rows, lane_columns):
    ctx.save_for_backward(S, query_lengths, target_lengths, state, best, failed)
    ctx.settings = (gap_open, gap_extend, temperature, by_rows, lane_columns)


def _affine_gradient(ctx, grad_scores):
    """d score / d S with affine gaps: the posterior of the match states on the paths that end at the best
    cell, by the engine's backward from what its forward kept."""
    S, query_lengths, target_lengths, state, best, failed = ctx.saved_tensors
    gap_open, gap_extend, temperature, by_rows, lane_columns = ctx.settings
    with torch.no_grad():
        grad = _affine_backward(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap_open,
                                gap_extend, temperature, by_rows, lane_columns=lane_columns)
    return _once_differentiable((S, grad_scores), grad)[0]


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
    def backward(ctx, grad_scores):
        return _affine_gradient(ctx, grad_scores), None, None, None, None, None, None


# --------------------------------------------------------------------------------------------------
# Per-pair gaps and temperatures, and the posterior: fake kernels, autograd, vmap.


@torch.library.register_fake("swcli::scores_per_pair")
def _scores_per_pair_fake(S, query_lengths, target_lengths, gap, temperature):
    _load_engine_for_fake(S.device)
    return S.new_empty(S.shape[0])


@torch.library.register_fake("swcli::posterior_per_pair")
def _posterior_per_pair_fake(S, query_lengths, target_lengths, gap, temperature):
    _load_engine_for_fake(S.device)
    return S.new_empty(S.shape[0]), S.new_empty(S.shape), S.new_empty(S.shape[0])


@torch.library.register_fake("swcli::affine_scores_per_pair")
def _affine_scores_per_pair_fake(S, query_lengths, target_lengths, gap_open, gap_extend, temperature):
    _load_engine_for_fake(S.device)
    return S.new_empty(S.shape[0])


@torch.library.register_fake("swcli::affine_posterior_per_pair")
def _affine_posterior_per_pair_fake(S, query_lengths, target_lengths, gap_open, gap_extend, temperature):
    _load_engine_for_fake(S.device)
    B = S.shape[0]
    return S.new_empty(B), S.new_empty(S.shape), S.new_empty(B), S.new_empty(B)


@torch.library.register_fake("swcli::forward_per_pair")
def _forward_per_pair_fake(S, query_lengths, target_lengths, gap, temperature):
    return _forward_outputs_fake(S, 1)


@torch.library.register_fake("swcli::affine_forward_per_pair")
def _affine_forward_per_pair_fake(S, query_lengths, target_lengths, gap_open, gap_extend, temperature):
    return _forward_outputs_fake(S, 2)


@torch.library.register_fake("swcli::backward_parameters_per_pair")
def _backward_parameters_per_pair_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap,
                                       temperature):
    # the gradient's shape where no pair failed: the (0,) tensor of a failed count is the eager path's alone
    return _backward_parameters_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths, gap,
                                     temperature, True)


@torch.library.register_fake("swcli::affine_backward_parameters_per_pair")
def _affine_backward_parameters_per_pair_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths,
                                              gap_open, gap_extend, temperature):
    return _affine_backward_parameters_fake(grad_scores, S, state, best, failed, query_lengths, target_lengths,
                                            gap_open, gap_extend, temperature, True)


# At most 254 characters: torch._assert_async takes no longer message on CUDA.
TEMPERATURE_GRADIENT_AT_ZERO = (
    "d score / d temperature is not defined at temperature 0 (the hard maximum): keep it > 0 where it "
    "requires grad (SoftSmithWaterman(learnable=True) holds log(t); a log_temperature under about -103 "
    "underflows to 0 in float32)")


def _gradients_from_sums(grad_scores, scores, values, flows, inner, needs):
    """The gradients of sum(grad_scores * scores) by each gap and by the temperature (values: the gaps, then
    the temperature, (B,) each; None where `needs`, a flag a value, says no), from per-pair sums that carry
    grad_scores already: flows[k] = grad_scores d score / d gap_k (what flowed along the gap edges) and
    inner = <S, grad_S>. The temperature's comes from Euler's identity: the score is homogeneous of degree
    1, score(cS, c gaps, c t) = c score(S, gaps, t) for c > 0, so its derivative in c at c = 1 is the score
    itself, and at t > 0

        t d score / d t = score - <S, d score / d S> - sum over the gaps of gap * d score / d gap.

    A pair whose incoming gradient is 0 gets 0 (its sums are 0), whatever its score (a NaN in S included)."""
    *gaps, temperature = values
    *need_gaps, need_t = needs
    grad_gaps = [flow if need else None for flow, need in zip(flows, need_gaps)]
    if not need_t:
        return grad_gaps, None
    euler = grad_scores * scores - inner
    for gap, flow in zip(gaps, flows):
        euler = euler - gap * flow
    return grad_gaps, torch.where(grad_scores == 0, 0, euler / temperature)


def _per_pair_gradients(grad_scores, S, values, scores, posterior, counts, needs):
    """(grad_S, grad_t, grad_gaps) of sum(grad_scores * scores) by S and by the values (the gaps, then the
    temperature; None where `needs`, S's flag then one a value, says no), from what a posterior operator
    returned: d score / d S = posterior, d score / d gap = its count. The sums of _gradients_from_sums are
    taken here, on (B, M, N) tensors: the price of a posterior computed in the forward."""
    need_S, *need_values = needs
    g = grad_scores
    zero = g == 0
    grad_S = torch.where(zero[:, None, None], 0, g[:, None, None] * posterior) if need_S else None
    flows = [torch.where(zero, 0, g * count) for count in counts]
    inner = None
    if need_values[-1]:
        # on the tensor under torch.func's wrappers: vmap has no batching rule for the assertion
        torch._assert_async((_unwrapped(values[-1]) > 0).all(), TEMPERATURE_GRADIENT_AT_ZERO)
        # <S, posterior> over the cells the alignment can use: S outside the lengths, or -inf, must not
        # turn 0 into NaN or inf (a -inf cell's posterior is 0, but the CUDA engine's, the remainder of the
        # other weights, is a rounding error of about 1e-8)
        unused = (posterior == 0) | (S == float("-inf"))
        inner = torch.where(zero, 0, g * torch.where(unused, 0, S * posterior).sum(dim=(1, 2)))
    grad_gaps, grad_t = _gradients_from_sums(g, scores, values, flows, inner, need_values)
    return grad_S, grad_t, grad_gaps


def _setup_posterior_context(ctx, inputs, output):
    S, _, _, *rest = inputs
    *gaps, temperature = rest
    scores, posterior, *counts = output
    ctx.mark_non_differentiable(posterior, *counts)
    ctx.save_for_backward(S, temperature, scores, posterior, *gaps, *counts)
    ctx.gap_count = len(gaps)


def _posterior_backward(ctx, grad_scores, *_grad_rest):
    S, temperature, scores, posterior, *rest = ctx.saved_tensors
    gaps, counts = rest[:ctx.gap_count], rest[ctx.gap_count:]
    needs = ctx.needs_input_grad
    with torch.no_grad():
        grad_S, grad_t, grad_gaps = _per_pair_gradients(grad_scores, S, (*gaps, temperature), scores, posterior,
                                                        counts, (needs[0], *needs[3:]))
    grad_S, grad_t, *grad_gaps = _once_differentiable((S, temperature, *gaps, grad_scores), grad_S, grad_t,
                                                      *grad_gaps)
    return grad_S, None, None, *grad_gaps, grad_t


for _name in ("posterior_per_pair", "affine_posterior_per_pair"):
    torch.library.register_autograd(f"swcli::{_name}", _posterior_backward, setup_context=_setup_posterior_context)


def _flatten_vmapped(info, in_dims, args):
    """The arguments of a per-pair call under torch.vmap as one batch of V * B pairs: each tensor with its
    vmapped dimension moved first (or expanded, where it has none) and merged with the pairs'."""
    V = info.batch_size
    flat = []
    for arg, dim in zip(args, in_dims):
        if not isinstance(arg, torch.Tensor):
            flat.append(arg)
            continue
        arg = arg.unsqueeze(0).expand(V, *arg.shape) if dim is None else arg.movedim(dim, 0)
        flat.append(arg.reshape(V * arg.shape[1], *arg.shape[2:]))
    return flat


def _unflatten_vmapped(info, outputs):
    V = info.batch_size
    single = isinstance(outputs, torch.Tensor)
    outputs = (outputs,) if single else tuple(outputs)
    outputs = tuple(out.reshape(V, out.shape[0] // V, *out.shape[1:]) for out in outputs)
    return (outputs[0], 0) if single else (outputs, (0,) * len(outputs))


def _vmap_per_pair(op):
    def rule(info, in_dims, *args):
        return _unflatten_vmapped(info, op(*_flatten_vmapped(info, in_dims, args)))
    return rule


for _name in ("scores_per_pair", "affine_scores_per_pair", "posterior_per_pair", "affine_posterior_per_pair"):
    torch.library.register_vmap(f"swcli::{_name}", _vmap_per_pair(getattr(torch.ops.swcli, _name).default))


class _PosteriorWithGradient(torch.autograd.Function):
    """A posterior operator with its autograd, as soft_smith_waterman calls it in eager mode: the registered
    formula's forward, setup_context and backward, in the form torch.func's transforms take (grad,
    jacrev, vmap over a leading batch of batches). The backward is a scaling of what the forward
    computed: no engine runs in it."""

    @staticmethod
    def forward(S, query_lengths, target_lengths, *gaps_and_temperature):
        op = _posterior_per_pair if len(gaps_and_temperature) == 2 else _affine_posterior_per_pair
        with torch._C._AutoDispatchBelowAutograd():
            return op(S, query_lengths, target_lengths, *gaps_and_temperature)

    setup_context = staticmethod(_setup_posterior_context)
    backward = staticmethod(_posterior_backward)

    @staticmethod
    def vmap(info, in_dims, *args):
        flat = _flatten_vmapped(info, in_dims, args)
        return _unflatten_vmapped(info, _PosteriorWithGradient.apply(*flat))


# The engines' sweeps hold one gap and one temperature a launch (a register splat across lanes that align
# different pairs), so per-pair values run in groups of pairs with equal values: one group, on the tensors
# as given, for one value a batch (a number or a 0-d tensor); a gathered copy of its pairs for each group
# where the values differ.


def _groups(host: torch.Tensor, device) -> list:
    """The pairs grouped by their values (host: (B, k) float64, on the CPU): [(index, key)], index the
    group's pairs in batch order on `device`, or None where one group holds the batch; key its values."""
    values = host.numpy()
    if (values == values[0]).all():
        return [(None, tuple(values[0].tolist()))]
    keys, inverse = torch.unique(host, dim=0, return_inverse=True)
    indices = torch.split(torch.argsort(inverse, stable=True), torch.bincount(inverse, minlength=len(keys)).tolist())
    return [(index.to(device), tuple(key)) for key, index in zip(keys.tolist(), indices)]


def _select_pairs(index, *tensors):
    """The pairs `index` of each tensor (None stays None)."""
    return tuple(None if x is None else x.index_select(0, index) for x in tensors)


def _in_batch_order(B: int, groups, parts):
    """The groups' outputs (parts: for each group, in order, tensors whose first dimension is its pairs)
    put back in the order of the batch's B pairs; one group's as they are. parts may be a generator: each
    group's outputs are placed before the next group's are computed."""
    outputs = None
    for (index, _), part in zip(groups, parts):
        if index is None:
            return part
        if outputs is None:
            outputs = [x.new_zeros((B, *x.shape[1:])) for x in part]
        for out, x in zip(outputs, part):
            out.index_copy_(0, index, x)
    return outputs


def _by_groups(S, qlen, tlen, groups, run):
    """run(S, qlen, tlen, key) -> tensors whose first dimension is the pair, for each group (_groups), put
    back in batch order. One group runs on the tensors as given."""
    return _in_batch_order(S.shape[0], groups, (run(*((S, qlen, tlen) if index is None else
                                                      _select_pairs(index, S, qlen, tlen)), key)
                                                for index, key in groups))


def _forward_keeping_state(S, qlen, tlen, key, rows: bool = True):
    """(scores, state, best, failed, by_rows): the engine's forward that keeps what its backward reads, with
    the values of `key`, (gap, temperature) or (gap_open, gap_extend, temperature), by rows where faster
    (and `rows`)."""
    *gaps, temperature = key
    lengths = qlen is not None or tlen is not None
    if len(gaps) == 1:
        by_rows = rows and gradient_by_rows(S, lengths, gaps[0], temperature)
        return (*_forward(S, qlen, tlen, gaps[0], temperature, by_rows), by_rows)
    by_rows = rows and affine_gradient_by_rows(S, lengths, gaps[0], temperature)
    return (*_affine_forward(S, qlen, tlen, *gaps, temperature, by_rows), by_rows)


def _backward_with_sums(grad_scores, S, qlen, tlen, key, state, best, failed, by_rows):
    """(grad_S, sums) of the engine's backward from _forward_keeping_state's state: sums (k, B) holds
    grad_scores d score / d each gap and, last, <S, grad_S> (backward_parameters)."""
    op = _backward_parameters if len(key) == 2 else _affine_backward_parameters
    return op(grad_scores, S, state, best, failed, qlen, tlen, *key, by_rows)


def _backward_by_groups(grad_scores, B: int, groups, backward):
    """(grad_S, sums (k, B)) put together from each group's backward(k, its grad_scores, index, key) ->
    (grad_S, sums (k, pairs)), in batch order (_in_batch_order)."""
    def part(k, index, key):
        g = grad_scores if index is None else grad_scores.index_select(0, index)
        grad, sums = backward(k, g, index, key)
        return grad, sums.T

    grad_S, sums = _in_batch_order(B, groups, (part(k, index, key) for k, (index, key) in enumerate(groups)))
    return grad_S, sums.T


def _gradients_with_values(grad_scores, S, scores, values, grad_S, sums, needs_S: bool, needs_values):
    """(grad_S, grad_gaps, grad_t) from the backward's grad_S and sums (k, B), once differentiable."""
    with torch.no_grad():
        grad_gaps, grad_t = _gradients_from_sums(grad_scores, scores, values, sums[:-1], sums[-1], needs_values)
    grad_S, grad_t, *grad_gaps = _once_differentiable((S, *values, grad_scores), grad_S if needs_S else None,
                                                      grad_t, *grad_gaps)
    return grad_S, grad_gaps, grad_t


class _ParametersWithGradient(torch.autograd.Function):
    """The scores with the gaps and the temperature as (B,) tensors, differentiable in S, the gaps and the
    temperature, as soft_smith_waterman runs them in eager mode: the engine's forward that keeps its state,
    for each group of pairs with equal values, and at backward time the engine's backward with the incoming
    gradient, which also sums per pair what the gradients of the gaps and the temperature take
    (backward_parameters, _gradients_from_sums). As the gradient of S alone, with a few (B,) operations
    more: no pass over a (B, M, N) tensor outside the kernels."""

    @staticmethod
    def forward(ctx, S, query_lengths, target_lengths, groups, *values):
        states = []  # each group's (state, best, failed, by_rows) and gathered pairs (None: the batch as given)

        def run(s, q, t, key):
            part_scores, *state = _forward_keeping_state(s, q, t, key)
            states.append((state, None if s is S else (s, q, t)))
            return [part_scores]

        with torch._C._AutoDispatchBelowAutograd():
            scores, = _by_groups(S, query_lengths, target_lengths, groups, run)
        # The groups' states and gathered pairs go through save_for_backward, as the inputs do, so that
        # autograd frees them after the backward (and sees them: saved-tensor hooks, retain_graph)
        saved = [tensor for state, selected in states for tensor in (*state[:3], *(selected or (None,) * 3))]
        ctx.save_for_backward(S, query_lengths, target_lengths, scores, *values, *saved)
        ctx.parts = [(index, key, state[3], selected is not None)
                     for (index, key), (state, selected) in zip(groups, states)]
        ctx.value_count = len(values)
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        S, query_lengths, target_lengths, scores, *rest = ctx.saved_tensors
        values, saved = rest[:ctx.value_count], rest[ctx.value_count:]
        needs = ctx.needs_input_grad

        def backward(k, g, index, key):
            """The group's (grad_S, sums), from its saved state."""
            _, _, by_rows, gathered = ctx.parts[k]
            state = (*saved[6 * k:6 * k + 3], by_rows)
            selected = tuple(saved[6 * k + 3:6 * k + 6]) if gathered else (S, query_lengths, target_lengths)
            return _backward_with_sums(g, *selected, key, *state)

        with torch.no_grad():
            groups = [(index, key) for index, key, _, _ in ctx.parts]
            grad_S, sums = _backward_by_groups(grad_scores, S.shape[0], groups, backward)
        grad_S, grad_gaps, grad_t = _gradients_with_values(grad_scores, S, scores, values, grad_S, sums, needs[0],
                                                           needs[4:])
        return grad_S, None, None, None, *grad_gaps, grad_t


def _rows_per_pair_take(S: torch.Tensor, lengths: bool, known) -> bool:
    """Whether a differentiable call with tensor gaps or temperature goes by rows with the values read on
    the device (_RowsPerPair): in eager mode, for pairs of at least one cell (an empty M or N launches no
    kernel, so nothing would check the values), where the gradient by rows takes the call with the numbers
    given (known: the gaps' and t's, None for a tensor), a tensor's values standing in as ones the rows
    take (gap 0, t infinite): the numbers must not send every pair off the rows."""
    if not (S.shape[0] and S.shape[1] and S.shape[2]) or _in_functorch():
        return False
    *gaps, t = known
    gaps, t = [0.0 if gap is None else gap for gap in gaps], math.inf if t is None else t
    rows = gradient_by_rows if len(gaps) == 1 else affine_gradient_by_rows
    # (the rules first: they refuse a graph being compiled, which must not reach the fake-mode lookup)
    return rows(S, lengths, gaps[0], t) and torch._guards.detect_fake_mode(S) is None


class _RowsPerPair(torch.autograd.Function):
    """The scores with the gaps and the temperature as (B,) CUDA tensors, differentiable in all of them, by
    the gradient by rows with the values read by the kernels (forward_per_pair, backward_parameters_per_pair):
    as _ParametersWithGradient, without the copy of the values to the host before the forward. A learned
    gap or temperature is updated on the device by the step before; that copy waited for it, and the GPU
    then idled while the host launched the forward.

    The forward scores every pair, each by the sweep its values need, and counts the pairs the rows could
    not take (the scaled range, t = 0, a gap > 0, affine gaps outside the shared form) and those whose values
    are not valid, which score NaN. The backward reads that count, as the gradient by rows always does;
    where it is not 0 it reads the values, raises naming the first pair that breaks a rule, and takes the
    DP table's path by groups of equal values (_grouped_gradient)."""

    @staticmethod
    def forward(ctx, S, query_lengths, target_lengths, *values):
        op = _forward_per_pair if len(values) == 2 else _affine_forward_per_pair
        with torch._C._AutoDispatchBelowAutograd():
            scores, state, best, failed = op(S, query_lengths, target_lengths, *values)
        ctx.save_for_backward(S, query_lengths, target_lengths, scores, state, best, failed, *values)
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        S, query_lengths, target_lengths, scores, state, best, failed, *values = ctx.saved_tensors
        needs = ctx.needs_input_grad
        op = _backward_parameters_per_pair if len(values) == 2 else _affine_backward_parameters_per_pair
        with torch.no_grad():
            grad_S, sums = op(grad_scores, S, state, best, failed, query_lengths, target_lengths, *values)
            if grad_S.dim() != 3:  # some pair failed: its values are read, checked, and its gradient redone
                grad_S, sums = _grouped_gradient(grad_scores, S, query_lengths, target_lengths, values, needs[-1])
        grad_S, grad_gaps, grad_t = _gradients_with_values(grad_scores, S, scores, values, grad_S, sums, needs[0],
                                                           needs[3:])
        return grad_S, None, None, *grad_gaps, grad_t


def _grouped_gradient(grad_scores, S, qlen, tlen, values, temperature_needs_grad: bool):
    """(grad_S, sums (k, B)) of the engine's backward with the parameters' sums, by groups of pairs with equal
    values: the values read to the host and checked (_check_per_pair_values), each group's forward that
    keeps the DP table (the rows failed some pair of the batch: not tried again), then its backward."""
    host = _checked_host_values(values, [None] * len(values), S.dtype, temperature_needs_grad)

    def backward(k, g, index, key):
        s, q, t = (S, qlen, tlen) if index is None else _select_pairs(index, S, qlen, tlen)
        _, state, best, failed, by_rows = _forward_keeping_state(s, q, t, key, rows=False)
        return _backward_with_sums(g, s, q, t, key, state, best, failed, by_rows)

    return _backward_by_groups(grad_scores, S.shape[0], _groups(host, S.device), backward)


# The per-pair operators' kernels by groups, on the engines' operators with numbers: the CUDA engine's
# (registered below). They read the values to the host, one copy, as the engine needs them to launch.

_VALUE_NAMES = {2: ("gap", "temperature"), 3: ("gap_open", "gap_extend", "temperature")}
CAPTURED_VALUES = (
    "tensor gaps or temperature on CUDA are read to the host to launch the engine (a launch holds one gap and one "
    "temperature), which a CUDA graph being captured does not allow: give Python numbers there")


def _engine_groups(S: torch.Tensor, values) -> list:
    """The groups (_groups) of the values an operator was given, checked as the CPU engine checks them
    (kernels/cpu/ops.cpp: per_pair_values, affine_keys), naming the first pair that breaks a rule: the
    operators can be called past soft_smith_waterman's checks."""
    B, names = S.shape[0], _VALUE_NAMES[len(values)]
    for name, value in zip(names, values):
        if not (value.is_floating_point() and tuple(value.shape) == (B,) and value.device == S.device):
            raise RuntimeError(f"{name} must be a floating-point tensor of shape ({B},) on the scores' device, one "
                               "per pair")
    if not B:  # nothing to read; any valid values
        return [(None, (-1.0,) * (len(values) - 1) + (1.0,))]
    if S.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(CAPTURED_VALUES)
    host = torch.stack([value.detach().to(torch.float64) for value in values], 1).cpu()
    for column, name in zip(host.unbind(1), names):
        nonnegative, nonpositive = name == "temperature", name in ("gap_open", "gap_extend")
        broken = ~torch.isfinite(column)
        if nonnegative or nonpositive:
            broken |= column < 0 if nonnegative else column > 0
        if broken.any():
            b = int(broken.nonzero()[0])
            raise RuntimeError(f"{name}[{b}] must be a finite number{' >= 0' if nonnegative else ''}"
                               f"{' <= 0' if nonpositive else ''}, got {column[b].item():g}")
    if len(names) == 3 and (host[:, 0] > host[:, 1]).any():
        b = int((host[:, 0] > host[:, 1]).nonzero()[0])
        raise RuntimeError(f"gap_open[{b}] must be <= gap_extend[{b}], got {host[b, 0].item():g} > "
                           f"{host[b, 1].item():g}")
    return _groups(host, S.device)


def _scores_of_groups(S, query_lengths, target_lengths, groups):
    """The scores (B,) by the engine's scores operator, once for each group (_groups)."""
    def run(s, q, t, key):
        *gaps, temperature = key
        if len(gaps) == 1:
            return (_scores(s, q, t, gaps[0], temperature),)
        return (_affine_scores(s, q, t, *gaps, temperature),)

    with torch.no_grad():
        return _by_groups(S, query_lengths, target_lengths, groups, run)[0]


def _scores_per_pair_by_groups(S, query_lengths, target_lengths, *values):
    """scores_per_pair and affine_scores_per_pair: the scores operator of each group."""
    _load_engine_for(S)
    return _scores_of_groups(S, query_lengths, target_lengths, _engine_groups(S, values))


def _posterior_per_pair_by_groups(S, query_lengths, target_lengths, *values):
    """posterior_per_pair and affine_posterior_per_pair: for each group, the forward that keeps the state
    and the backward from a gradient of 1 with the gap sums: (scores, posterior, one count a gap)."""
    _load_engine_for(S)

    def run(s, q, t, key):
        scores, state, best, failed, by_rows = _forward_keeping_state(s, q, t, key)
        posterior, sums = _backward_with_sums(torch.ones_like(scores), s, q, t, key, state, best, failed, by_rows)
        # each count its own tensor: a custom operator's outputs may not alias one another
        return (scores, posterior, *(count.clone() for count in sums[:-1]))

    groups = _engine_groups(S, values)
    with torch.no_grad():
        return tuple(_by_groups(S, query_lengths, target_lengths, groups, run))


for _name in ("scores_per_pair", "affine_scores_per_pair"):
    _LIBRARY.impl(_name, _scores_per_pair_by_groups, "CUDA")
for _name in ("posterior_per_pair", "affine_posterior_per_pair"):
    _LIBRARY.impl(_name, _posterior_per_pair_by_groups, "CUDA")


# --------------------------------------------------------------------------------------------------
# Checks


def _check_number(name: str, value) -> float:
    # The common case, checked fast; by comparisons rather than math.isfinite, which torch.compile cannot
    # trace on a float it made symbolic (a value that changed between calls).
    if type(value) is float and -math.inf < value < math.inf:
        return value
    if isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a finite number here, got a tensor; tensors (0-d or one value per "
                         "pair, with gradients) go to soft_smith_waterman")
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_parameter(name: str, value, tensors: bool):
    """A number checked by _check_number, or with `tensors` a tensor as given (checked per pair by
    _per_pair_parameters)."""
    return value if tensors and isinstance(value, torch.Tensor) else _check_number(name, value)


def _check_lengths(name: str, lengths, size: int, device) -> torch.Tensor | None:
    """(B,) int64 lengths on `device`; None (every pair full) stays None. Their range is checked by
    _check_ranges, with every other range of the call."""
    if lengths is None:
        return None
    if isinstance(lengths, (list, tuple)) and len(lengths) == 0:  # torch would make it float
        lengths = torch.zeros(0, dtype=torch.int64)
    lengths = torch.as_tensor(lengths)
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {lengths.dtype}")
    if lengths.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), one length per pair, got {tuple(lengths.shape)}")
    _check_movable(name, lengths, device)
    return lengths.to(device=device, dtype=torch.int64).contiguous()


def _check_movable(name: str, tensor: torch.Tensor, device) -> None:
    """A tensor is moved to the score matrix's device, but for a meta tensor (no values to move) where the
    score matrix has values."""
    if tensor.is_meta and torch.device(device).type != "meta":
        raise ValueError(f"{name} is a meta tensor (shapes alone, no values), but the score matrix is on {device}")


def _check_ranges(checks) -> None:
    """checks: (values, low, high, message): every entry of values must lie in [low, high]; message(lowest,
    highest) says what is wrong, and message(None, None) the rule alone. The smallest and largest entry of every non-empty tensor come from the
    device in one round trip, since each read waits for the device. A graph being compiled cannot read
    the device: there each check is queued on it (torch._assert_async), and a failure stops the graph's
    run with the message."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing()  # (an empty check holds: no filter to trace)
            or any(_holds_no_data(values) for values, *_ in checks)):
        for values, low, high, message in checks:
            torch._assert_async(((values >= low) & (values <= high)).all(), message(None, None))
        return
    if _in_functorch():  # the tensors a vmap batches hold no data of their own: check all they wrap
        checks = [(_unwrapped(values), *rest) for values, *rest in checks]
    checks = [check for check in checks if check[0].numel()]
    if not checks:
        return
    extremes = torch.stack([x for values, *_ in checks for x in torch.aminmax(values)]).tolist()
    for k, (_, low, high, message) in enumerate(checks):
        lowest, highest = extremes[2 * k], extremes[2 * k + 1]
        if lowest < low or highest > high:
            raise ValueError(message(lowest, highest))


def _holds_no_data(x: torch.Tensor) -> bool:
    """A meta or fake tensor: shapes alone, so its checks are queued as a graph's are. (A plain tensor, the
    common case, is told by its type alone: a fake one is a subclass.)"""
    if x.is_meta:
        return True
    if type(x) is torch.Tensor:
        return False
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(x)


def _unwrapped(x: torch.Tensor) -> torch.Tensor:
    """The plain tensor under torch.func's wrappers (vmap's batches, grad's tracking, functionalize's)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(x):
        x = functorch.get_unwrapped(x)
    return x


def _length_range(name: str, values: torch.Tensor, limit: int, dim: str):
    """The check that lengths lie in [0, limit] (for _check_ranges)."""
    # A symbolic size (torch.export's dynamic shapes) prints as its symbol: the rule names the dimension then.
    # While torch.compile traces, a size may read as an int, and formatting it would make it a constant of
    # the graph (a compilation for each size): the rule names the dimension there too.
    rule = (f"{name} must lie in [0, {limit}] ({dim} of the score matrix)"
            if type(limit) is int and not torch.compiler.is_compiling()
            else f"{name} must lie in [0, {dim}] ({dim}: the score matrix's size)")
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


def _check_gaps(gap, gap_open, gap_extend, tensors: bool = False):
    """(gap, None) for a linear gap, or (None, (gap_open, gap_extend)) for affine gaps, checked (the rule
    is in the module docstring). With `tensors`, tensor gaps pass as given, for _per_pair_parameters."""
    if gap_open is None and gap_extend is None:
        return _check_parameter("gap", -1.0 if gap is None else gap, tensors), None
    if gap_open is None or gap_extend is None:
        given, missing = ("gap_open", "gap_extend") if gap_extend is None else ("gap_extend", "gap_open")
        raise ValueError(f"affine gaps need both gap_open and gap_extend: {given} was given without {missing} "
                         "(for a linear gap, give gap alone)")
    if gap is not None:
        raise ValueError("give either gap (a linear gap score) or gap_open and gap_extend (affine gaps), not both")
    gap_open = _check_parameter("gap_open", gap_open, tensors)
    gap_extend = _check_parameter("gap_extend", gap_extend, tensors)
    if isinstance(gap_open, torch.Tensor) or isinstance(gap_extend, torch.Tensor):
        return None, (gap_open, gap_extend)
    if gap_extend > 0:
        raise ValueError(f"gap_extend must be <= 0 (a score added for each further gap position), got {gap_extend}")
    if gap_open > gap_extend:
        raise ValueError(f"gap_open must be <= gap_extend (a gap's first position scores at most what each further "
                         f"one does), got gap_open={gap_open}, gap_extend={gap_extend}")
    return None, (gap_open, gap_extend)


def _check_arguments(temperature, backend: str, tensor: torch.Tensor, shape: tuple[int, int, int],
                     query_lengths, target_lengths, ranges=(), tensors: bool = False):
    """The checks both entry points share besides the gaps': (temperature, resolved backend, qlen, tlen).
    `tensor` is the input whose device the lengths must match; `ranges` are the caller's own range
    checks, read from the device with the lengths' (see _check_ranges). With `tensors`, a tensor
    temperature passes as given, for _per_pair_parameters."""
    temperature = _check_parameter("temperature", temperature, tensors)
    if not isinstance(temperature, torch.Tensor) and temperature < 0:
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


def _rows_allowed(S: torch.Tensor, temperature: float, narrowest: int) -> bool:
    """What both gradients by rows need: float32 CUDA scores at t > 0, N between narrowest and
    ROWS_WIDEST, and no CUDA graph being captured, compiled or traced: the rows' backward reads one int
    from the device (how many pairs left the scaled range), which a capture does not allow, a compiled
    graph may be replayed as one, and a traced graph may run at other widths."""
    return (S.is_cuda and S.dtype is torch.float32 and temperature > 0 and narrowest <= S.shape[2] <= ROWS_WIDEST
            and not _capturing_graph() and not torch.cuda.is_current_stream_capturing())


def gradient_by_rows(S: torch.Tensor, lengths: bool, gap: float, temperature: float) -> bool:
    """Whether the gradient of this call goes by rows: _rows_allowed with gap <= 0, N from
    ROWS_NARROWEST (with lengths ROWS_NARROWEST_WITH_LENGTHS)."""
    narrowest = ROWS_NARROWEST_WITH_LENGTHS if lengths else ROWS_NARROWEST
    return gap <= 0 and _rows_allowed(S, temperature, narrowest)


def affine_gradient_by_rows(S: torch.Tensor, lengths: bool, gap_open: float, temperature: float) -> bool:
    """Whether an affine gradient goes by rows: _rows_allowed at every N, in the scaled affine form
    (|gap_open| log2(e) / t <= 100: a gap opening's factor 2^(gap_open log2(e) / t) at or above 2^-100,
    kernels/cuda/affine_scaled.cuh). Unlike the linear table's, the affine state's path is slower at every
    width (docs/benchmarks/h200.md), with or without lengths."""
    return (_rows_allowed(S, temperature, 0)
            and -gap_open * (1.4426950408889634 / temperature) <= AFFINE_SHARED_LIMIT)  # as the engine rounds it


# --------------------------------------------------------------------------------------------------
# The public functions


def _holding_gradient() -> bool:
    """Whether the graph being captured is kept to run elsewhere (torch.jit.trace, torch.export): it then
    holds the differentiable operators whatever the example's requires_grad was, since it may run with a
    score matrix that requires grad. (torch.compile guards on requires_grad and compiles again.)"""
    # The flag behind torch.compiler.is_exporting(): under torch.compile, some releases' Dynamo answer that
    # call True (from its table of tracing-state functions), which would put the gradient's operators in
    # every compiled graph.
    return torch.jit.is_tracing() or getattr(torch.compiler, "_is_exporting_flag", False)


def _capturing_graph() -> bool:
    """Whether a graph is being captured from this call (torch.compile, torch.export, torch.jit.trace):
    then the operators are called with their registered autograd, so that the graph holds them and
    differentiates them wherever it runs, and no value is read from a tensor (a read would be frozen
    into the graph, or break it)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _in_functorch() -> bool:
    """Whether a torch.func transform (grad, vjp, jacrev, vmap) is active: its wrapped tensors take only
    autograd Functions written for them, which the per-pair path has (_PosteriorWithGradient)."""
    # (torch.compile traces no functorch internals; a compiled graph under a transform is functorch's own)
    return not torch.compiler.is_compiling() and torch._C._functorch.peek_interpreter_stack() is not None


NO_TRANSFORM_IN_GRAPH = (
    "swcli: torch.compile cannot differentiate the compiled engines inside a torch.func transform (grad, "
    "vjp, jacrev, vmap): the transform's tensors read requires_grad False there, so no gradient would reach "
    "them; use the transform without torch.compile, run it under torch.no_grad() where no gradient is "
    "wanted, or use backend='reference'")


def _refuse_transform_in_graph() -> None:
    """torch.compile inlines torch.func transforms, and inside them a tensor the transform (or autograd
    outside a vmap) differentiates reads requires_grad False: the inference operators would then be
    recorded, and the gradient silently be zero. So a differentiable call there is an error."""
    if (torch.compiler.is_compiling() and torch.is_grad_enabled()
            and torch._C._functorch.maybe_current_level() is not None):
        raise RuntimeError(NO_TRANSFORM_IN_GRAPH)


NO_FUNCTIONALIZE = (
    "swcli: the compiled engines' gradient does not run under torch.func.functionalize (PyTorch has no "
    "functionalize rule for autograd Functions); use backend='reference' there")


def _under_functionalize() -> bool:
    """Whether torch.func.functionalize is among the active transforms."""
    functionalize = torch._C._functorch.TransformType.Functionalize
    return any(level.key() == functionalize
               for level in torch._functorch.pyfunctorch.retrieve_all_functorch_interpreters())


def _needs_grad(x: torch.Tensor) -> bool:
    """x.requires_grad, seen through torch.func's wrappers: a tensor batched by vmap reads False there even
    where autograd outside the transform tracks the tensor it wraps."""
    if not _in_functorch():
        return x.requires_grad
    functorch = torch._C._functorch
    while not x.requires_grad:
        if not functorch.is_functorch_wrapped_tensor(x):
            return False
        x = functorch.get_unwrapped(x)
    return True


def soft_smith_waterman(
    score_matrix: torch.Tensor,
    gap: float | torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    query_lengths=None,
    target_lengths=None,
    backend: str = "auto",
    *,
    gap_open: float | torch.Tensor | None = None,
    gap_extend: float | torch.Tensor | None = None,
    return_posterior: bool = False,
):
    """Soft Smith-Waterman local alignment scores, (B,), of a batch of score matrices (B, M, N).

    gap is the linear score added per gap position (normally negative, though any finite value is scored;
    -1.0 when not given). With
    gap_open and gap_extend (and no gap) the gaps are affine, soft Gotoh: gap_open for a gap's first
    position, gap_extend for each further one, gap_open <= gap_extend <= 0. Temperature 0 is classic hard
    Smith-Waterman (Gotoh's with affine gaps). Pair b is scored on
    score_matrix[b, :query_lengths[b], :target_lengths[b]].

    The gaps and the temperature are Python numbers, or tensors: 0-d (one value for the batch) or (B,)
    (one per pair), differentiable where they require grad (d score / d gap is the expected number of gap
    positions of the soft alignment; d score / d t needs t > 0), on every backend. The compiled engines take
    d score / d t from Euler's identity, (score - <S, posterior> - gap terms) / t, a difference that loses
    digits as t shrinks (docs/usage.md gives how many). A differentiable call on
    float32 CUDA scores that the gradient by rows takes has its kernels read the values on the device, a
    pair's own each (a pair whose value breaks a rule scores NaN, and the backward raises naming it);
    elsewhere the engines read tensor values to the host (one copy; not inside a CUDA graph being
    captured) and run once per group of pairs with equal values: one group, at full speed, for a 0-d tensor.

    return_posterior: return (scores, posterior), the posterior being d score[b] / d S[b] (S's shape):
    the soft alignment, each entry the probability that the cell is matched (the best alignment's match
    cells at t = 0), 0 outside each pair's lengths. The compiled engines compute it by their backward
    from the forward's state, with no second forward; it carries no gradient of its own (a second
    derivative: backend='reference').

    backend: 'auto' (CUDA for GPU tensors, else the compiled CPU engine), 'cuda', 'cpu', or 'reference'
    (the Python loop). float16/bfloat16 are computed in float32; the results have the input's dtype.
    """
    if gap is None and gap_open is None and gap_extend is None:
        gap = -1.0
    if (_cuda_ready and type(gap) is float and type(temperature) is float and gap_open is None
            and gap_extend is None and query_lengths is None and target_lengths is None and backend == "auto"
            and type(score_matrix) is torch.Tensor and score_matrix.is_cuda and score_matrix.dtype is torch.float32
            and score_matrix.dim() == 3 and not score_matrix.requires_grad and temperature >= 0
            and -math.inf < gap < math.inf and temperature < math.inf and not return_posterior
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling() and forward_ad._current_level < 0):
        # Inference on full float32 pairs on the GPU with a linear gap, every argument checked as below but
        # in fewer steps: at small sizes (the seed's) the host's time per call sets the rate.
        return _scores(score_matrix, None, None, gap, temperature)
    if not isinstance(score_matrix, torch.Tensor):
        raise ValueError(f"score_matrix must be a torch.Tensor, got {type(score_matrix).__name__}")
    if not isinstance(return_posterior, bool):
        raise ValueError(f"return_posterior must be True or False, got {return_posterior!r}")
    if score_matrix.dim() != 3:
        raise ValueError(f"score_matrix must be 3-D (B, M, N), got shape {tuple(score_matrix.shape)}")
    dtype = score_matrix.dtype
    if not dtype.is_floating_point:
        raise ValueError(f"score_matrix must be floating point, got dtype {dtype}")
    gap, affine = _check_gaps(gap, gap_open, gap_extend, tensors=True)
    temperature, backend, qlen, tlen = _check_arguments(
        temperature, backend, score_matrix, score_matrix.shape, query_lengths, target_lengths, tensors=True)

    if backend != "reference":
        _refuse_forward_mode(score_matrix, gap, gap_open, gap_extend, temperature)
        _refuse_transform_in_graph()
    S = score_matrix
    if dtype is torch.float16 or dtype is torch.bfloat16:
        S = S.float()
    gaps = (gap,) if affine is None else affine
    # Under a torch.func transform, numbers too: only these operators carry gradients to the gaps and t
    # there, and have a vmap rule that takes a batch of batches in one call.
    if any(isinstance(x, torch.Tensor) for x in (*gaps, temperature)) or _in_functorch():
        scores, posterior = _per_pair_scores(S, qlen, tlen, gaps, temperature, backend, return_posterior)
    elif return_posterior:
        scores, posterior = _scores_and_posterior(S, qlen, tlen, gaps, temperature, backend)
    elif affine is not None:
        scores = _affine_scores_of(S, qlen, tlen, *affine, temperature, backend)
    elif backend == "reference":
        scores = soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    else:
        _load_engine_for(S)
        if _holding_gradient() or (torch.is_grad_enabled() and S.requires_grad):
            by_rows = gradient_by_rows(S, qlen is not None or tlen is not None, gap, temperature)
            if _capturing_graph():
                scores = _forward(S, qlen, tlen, gap, temperature, by_rows)[0]
            else:
                scores = _ForwardWithGradient.apply(S, qlen, tlen, gap, temperature, by_rows)
        else:  # no gradient: no DP table, and none of autograd's overhead (it counts at small sizes)
            scores = _scores(S, qlen, tlen, gap, temperature)
    if S is not score_matrix:
        scores = scores.to(dtype)
        if return_posterior:
            posterior = posterior.to(dtype)
    return (scores, posterior) if return_posterior else scores


def _affine_scores_of(S, qlen, tlen, gap_open: float, gap_extend: float, temperature: float,
                      backend: str) -> torch.Tensor:
    """soft_smith_waterman's affine scores of float32/float64 S, past its checks."""
    if backend == "reference":
        return soft_smith_waterman_affine_reference(S, gap_open, gap_extend, temperature, qlen, tlen)
    _load_engine_for(S)
    if _holding_gradient() or (torch.is_grad_enabled() and S.requires_grad):
        by_rows = affine_gradient_by_rows(S, qlen is not None or tlen is not None, gap_open, temperature)
        if _capturing_graph():
            return _affine_forward(S, qlen, tlen, gap_open, gap_extend, temperature, by_rows)[0]
        return _AffineForwardWithGradient.apply(S, qlen, tlen, gap_open, gap_extend, temperature, by_rows)
    return _affine_scores(S, qlen, tlen, gap_open, gap_extend, temperature)


def _reference_scores_and_posterior(S, qlen, tlen, gaps, temperature):
    """The reference loop's scores and d score / d S by autograd through it; the posterior is itself
    differentiable where the scores are (create_graph), so second derivatives work here."""
    def scores_of(S_in):
        if len(gaps) == 1:
            return soft_smith_waterman_reference(S_in, gaps[0], temperature, qlen, tlen)
        return soft_smith_waterman_affine_reference(S_in, *gaps, temperature, qlen, tlen)

    if _in_functorch():  # a transform's tensors take no requires_grad_(): its own vjp, differentiable there
        scores, pullback = torch.func.vjp(scores_of, S)
        return scores, pullback(torch.ones_like(scores))[0]
    differentiable = torch.is_grad_enabled() and (
        S.requires_grad or any(isinstance(x, torch.Tensor) and x.requires_grad for x in (*gaps, temperature)))
    with torch.enable_grad():
        S_in = S if S.requires_grad else S.detach().requires_grad_()
        scores = scores_of(S_in)
        (posterior,) = torch.autograd.grad(scores.sum(), S_in, create_graph=differentiable)
    if not differentiable:
        scores, posterior = scores.detach(), posterior.detach()
    return scores, posterior


def _scores_and_posterior(S, qlen, tlen, gaps, temperature: float, backend: str):
    """(scores, posterior) with numbers for the gaps and the temperature: the engine's forward that keeps
    its state (differentiable, as for a gradient), then its backward from a gradient of 1 per pair on
    that state. The scores' own gradient, if asked for, runs the backward again; with tensor gaps the
    per-pair operators return the posterior with the scores, and the gradient is a scaling of it."""
    if backend == "reference":
        return _reference_scores_and_posterior(S, qlen, tlen, gaps, temperature)
    _load_engine_for(S)
    key = (*gaps, temperature)
    scores, state, best, failed, by_rows = _forward_keeping_state(S, qlen, tlen, key)
    ones = torch.ones(S.shape[0], dtype=S.dtype, device=S.device)
    backward = _backward if len(gaps) == 1 else _affine_backward
    with torch.no_grad():
        posterior = backward(ones, S.detach(), state, best, failed, qlen, tlen, *key, by_rows)
    return scores, posterior


def _per_pair_parameters(S, gaps, temperature):
    """(values, host): the gaps and the temperature as (B,) tensors in S's dtype on its device, each from a
    number, a 0-d tensor (expanded: its gradient is the sum over the pairs) or a (B,) tensor; and their
    values on the host, (B, k) float64, read in one copy from the device and checked. host is None where
    nothing can be read: in a graph being captured or compiled and under torch.func transforms (the engine
    checks the values itself there), for meta and fake tensors and for an empty batch."""
    values, known = _per_pair_values(S, gaps, temperature)
    return values, _read_per_pair_values(S, values, known, temperature)


def _per_pair_values(S, gaps, temperature):
    """(values, known): _per_pair_parameters' values, checked for their shapes and dtypes, not read; known
    holds the numbers given (None for a tensor)."""
    B = S.shape[0]
    values, known = [], []
    for name, value in zip(_VALUE_NAMES[len(gaps) + 1], (*gaps, temperature)):
        if not isinstance(value, torch.Tensor):
            values.append(torch.full((), value, dtype=S.dtype, device=S.device).expand(B))
            known.append(value)
            continue
        if value.dim() != 0 and tuple(value.shape) != (B,):
            raise ValueError(f"{name} must be a number, a 0-d tensor or a ({B},) tensor with one value per pair, "
                             f"got shape {tuple(value.shape)}")
        if value.dtype == torch.bool or value.dtype.is_complex:
            raise ValueError(f"{name} must hold real numbers, got dtype {value.dtype}")
        _check_movable(name, value, S.device)
        values.append(value.to(device=S.device, dtype=S.dtype).expand(B))
        known.append(None)
    return values, known


def _read_per_pair_values(S, values, known, temperature) -> torch.Tensor | None:
    """_per_pair_parameters' host values (None where nothing can be read), checked."""
    if (_capturing_graph() or _in_functorch() or S.device.type == "meta" or not S.shape[0]
            or torch._guards.detect_fake_mode(S) is not None):
        return None
    if S.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError(CAPTURED_VALUES)
    return _checked_host_values(values, known, S.dtype, torch.is_grad_enabled()
                                and isinstance(temperature, torch.Tensor) and temperature.requires_grad)


def _checked_host_values(values, known, dtype, needs_positive_temperature: bool) -> torch.Tensor:
    """_host_values, checked by the per-pair rules (_check_per_pair_values)."""
    host = _host_values(values, known, dtype)
    _check_per_pair_values(_VALUE_NAMES[len(values)][:-1], host, needs_positive_temperature)
    return host


def _host_values(values, known, dtype) -> torch.Tensor:
    """(B, k) float64 on the CPU: the numbers given, rounded to `dtype` as the values on the device are,
    and the tensors read from the device in one copy, an expanded one (a 0-d tensor given) as one value."""
    B = values[0].shape[0]
    reads = [value[:1] if value.stride(0) == 0 else value for value, x in zip(values, known) if x is None]
    read = torch.cat([r.detach() for r in reads]).to("cpu", torch.float64) if reads else None
    columns, at = [], 0
    for value, x in zip(values, known):
        if x is not None:
            columns.append(torch.full((B,), x, dtype=dtype).to(torch.float64))
            continue
        n = 1 if value.stride(0) == 0 else B
        columns.append(read[at:at + n].expand(B))
        at += n
    return torch.stack(columns, 1)


def _check_per_pair_values(names, host: torch.Tensor, needs_positive_temperature: bool) -> None:
    """The rules of the per-pair values, host (B, k) float64 on the CPU (the gaps' as for numbers;
    t >= 0, and t > 0 where it requires grad); the first pair that breaks one is named. In numpy: the
    host's time here is the device's idle time before the forward."""
    values = host.numpy()
    with np.errstate(invalid="ignore"):
        rules = _per_pair_rules(names, values.T, needs_positive_temperature, np.isfinite)
    broken = ~np.stack([ok for ok, _ in rules])  # (rules, B)
    if not broken.any():
        return
    rule, pair = divmod(int(np.flatnonzero(broken)[0]), broken.shape[1])
    shown = ", ".join(f"{name} = {v[pair]:g}" for name, v in zip((*names, "temperature"), values.T))
    raise ValueError(f"{rules[rule][1]}; pair {pair} has {shown}")


def _assert_per_pair_values(names, values, needs_positive_temperature: bool) -> None:
    """_check_per_pair_values' rules, queued on the values' device (torch._assert_async), where they cannot
    be read: a failure stops the run with the rule (the pair is not named)."""
    if _in_functorch():  # the tensors a vmap batches hold no data of their own: check all they wrap
        values = [_unwrapped(v) for v in values]
    for holds, rule in _per_pair_rules(names, values, needs_positive_temperature, torch.isfinite):
        torch._assert_async(holds.all(), rule)


def _per_pair_rules(names, values, needs_positive_temperature: bool, isfinite):
    """(holds, rule) of the per-pair values (the gaps', then the temperature's), as arrays or tensors:
    isfinite is numpy's or torch's."""
    *gaps, temperature = values
    rules = [(isfinite(v), f"{name} must be finite") for name, v in zip(names, gaps)]
    rules.append((isfinite(temperature) & (temperature >= 0), "temperature must be finite and >= 0"))
    if len(gaps) == 2:
        rules.append((gaps[1] <= 0, "gap_extend must be <= 0"))
        rules.append((gaps[0] <= gaps[1], "gap_open must be <= gap_extend"))
    if needs_positive_temperature:
        rules.append((temperature > 0, TEMPERATURE_GRADIENT_AT_ZERO))
    return rules


def _per_pair_scores(S, qlen, tlen, gaps, temperature, backend: str, return_posterior: bool):
    """(scores, posterior or None) where a gap or the temperature is a tensor (or a torch.func transform is
    active): differentiable in S, the gaps and the temperature. In eager mode the engine's forward that keeps
    its state, and its backward with the sums the gaps and the temperature take, at backward time: by rows
    with the values read on the device where the rows take the scores (_RowsPerPair), else by groups of
    equal values read to the host (_ParametersWithGradient); with return_posterior, under torch.func
    transforms and in captured graphs the posterior operators, whose backward is a scaling of what they
    return."""
    if backend == "reference":
        values, host = _per_pair_parameters(S, gaps, temperature)  # their checks, as for the engines
        if host is None:  # nothing could be read (a graph being compiled, a transform): no engine checks them
            _assert_per_pair_values(_VALUE_NAMES[len(values)][:-1], values, isinstance(temperature, torch.Tensor)
                                    and torch.is_grad_enabled() and _needs_grad(temperature))
        if return_posterior:
            return _reference_scores_and_posterior(S, qlen, tlen, gaps, temperature)
        if len(gaps) == 1:
            return soft_smith_waterman_reference(S, gaps[0], temperature, qlen, tlen), None
        return soft_smith_waterman_affine_reference(S, *gaps, temperature, qlen, tlen), None
    _load_engine_for(S)
    values, known = _per_pair_values(S, gaps, temperature)
    differentiable = torch.is_grad_enabled() and (_needs_grad(S) or any(_needs_grad(v) for v in values))
    if differentiable and not return_posterior and _rows_per_pair_take(S, qlen is not None or tlen is not None,
                                                                       known):
        return _RowsPerPair.apply(S, qlen, tlen, *values), None
    host = _read_per_pair_values(S, values, known, temperature)
    if not (return_posterior or differentiable or _holding_gradient()):
        if host is not None:  # the values read already: the engine's scores by groups, no second read
            return _scores_of_groups(S, qlen, tlen, _groups(host, S.device)), None
        op = _scores_per_pair if len(gaps) == 1 else _affine_scores_per_pair
        return op(S, qlen, tlen, *values), None
    if _capturing_graph() or not (differentiable or _holding_gradient()):  # the posterior alone: no autograd
        op = _posterior_per_pair if len(gaps) == 1 else _affine_posterior_per_pair
        scores, posterior, *_ = op(S, qlen, tlen, *values)
        return scores, posterior
    if _under_functionalize():
        raise RuntimeError(NO_FUNCTIONALIZE)
    if return_posterior or host is None:
        scores, posterior, *_ = _PosteriorWithGradient.apply(S, qlen, tlen, *values)
        return scores, posterior
    return _ParametersWithGradient.apply(S, qlen, tlen, _groups(host, S.device), *values), None


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
    return_posterior: bool = False,
):
    """Scores (B,) of pairs given as uint8 codes (B, M), (B, N) into a K x K substitution matrix.

    The gaps as in soft_smith_waterman: gap (linear, -1.0 when not given), or gap_open and gap_extend
    (affine), Python numbers. The compiled engines look each score up in the matrix as they go, so the
    (B, M, N) score tensor is never built (it would cost more than the alignment itself); backend='reference'
    builds it with a gather and runs the Python loop in the matrix's dtype. The engines compute in float32
    and return float32 scores (the matrix is cast to float32: substitution scores are small numbers that
    float32 holds exactly), the reference the matrix's dtype. No gradient (a matrix that requires grad
    is refused where grad mode is on): use soft_smith_waterman for that. return_posterior: (scores,
    posterior) as soft_smith_waterman returns them; the posterior is (B, M, N) anyway, so the scores are
    gathered into S for it and scored densely.
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
    if matrix.requires_grad and torch.is_grad_enabled():  # its gradient would be dropped without a word
        raise ValueError("soft_smith_waterman_codes has no gradient, and matrix requires grad: score "
                         "soft_smith_waterman(matrix[query][:, target], ...) to learn the matrix, or pass "
                         "matrix.detach()")
    if target_codes.device != query_codes.device:
        raise ValueError(f"query_codes and target_codes are on {query_codes.device} and {target_codes.device}")
    K = matrix.shape[0]
    B, M = query_codes.shape
    gap, affine = _check_gaps(gap, gap_open, gap_extend)
    temperature, backend, qlen, tlen = _check_arguments(
        temperature, backend, query_codes, (B, M, target_codes.shape[1]), query_lengths, target_lengths,
        (_code_range("query_codes", query_codes, K), _code_range("target_codes", target_codes, K)))
    gap_open, gap_extend = affine or (None, None)
    if not isinstance(return_posterior, bool):
        raise ValueError(f"return_posterior must be True or False, got {return_posterior!r}")
    if return_posterior:
        # in float32 on the engines, as their codes operators compute (the reference: the matrix's dtype)
        matrix = matrix.to(query_codes.device, dtype=matrix.dtype if backend == "reference" else torch.float32)
        S = matrix[query_codes.long()[:, :, None], target_codes.long()[:, None, :]]
        with torch.no_grad():
            return soft_smith_waterman(S, gap, temperature, qlen, tlen, backend, gap_open=gap_open,
                                       gap_extend=gap_extend, return_posterior=True)
    with torch.no_grad():  # (the engines' codes operators have no gradient; nor, then, do their scores)
        return score_checked_codes(query_codes, target_codes, matrix.to(query_codes.device), gap, temperature,
                                   qlen, tlen, backend, gap_open=gap_open, gap_extend=gap_extend)


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
        return _affine_scores_codes(query_codes, target_codes, matrix, qlen, tlen, gap_open, gap_extend, temperature)
    return _scores_codes(query_codes, target_codes, matrix, qlen, tlen, gap, temperature)


LEARNABLE = ("gap_open", "gap_extend", "temperature")


class SoftSmithWaterman(nn.Module):
    """Drop-in for the reference module: same constructor, forward(score_matrix) -> (B,) scores.

    gap_open keeps the seed module's meaning, the linear gap score added for every gap position, unless
    gap_extend is given: then the gaps are affine, gap_open for a gap's first position and gap_extend
    for each further one (soft_smith_waterman's gap_open and gap_extend).

    learnable: True (every one), or the names among gap_open, gap_extend and temperature to hold as
    nn.Parameters (0-d, in the default dtype), learned with the module's other parameters. The gaps are
    held as they are (an affine step that leaves gap_open <= gap_extend <= 0 makes the next forward raise:
    clamp them after a step if the optimiser may cross those bounds); the temperature is held as its log,
    the parameter log_temperature, so that it stays > 0 (temperature 0, the hard maximum, has no
    gradient in t), and the temperature attribute reads exp(log_temperature).
    """

    def __init__(self, gap_open: float = -1.0, temperature: float = 1.0, backend: str = "auto", *,
                 gap_extend: float | None = None, learnable: bool | tuple[str, ...] = False):
        super().__init__()
        # Checked now, under the module's own names, rather than at the first forward.
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if gap_extend is None:
            _check_parameter("gap_open", gap_open, tensors=True)
        else:
            _check_gaps(None, gap_open, gap_extend, tensors=True)
        if not isinstance(_check_parameter("temperature", temperature, tensors=True), torch.Tensor) and temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is the exact hard maximum), got {temperature}")
        self.backend = backend
        names = _learnable_names(learnable, affine=gap_extend is not None)
        for name, value in (("gap_open", gap_open), ("gap_extend", gap_extend)):
            if name in names:
                self.register_parameter(name, nn.Parameter(torch.tensor(_initial_value(name, value))))
            else:
                setattr(self, name, value)
        if "temperature" in names:
            temperature = _initial_value("temperature", temperature)
            if temperature <= 0:
                raise ValueError(f"a learnable temperature must be > 0 (it is held as its log), got {temperature}")
            self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))
        else:
            self._temperature = temperature

    def _learns(self, name: str) -> bool:
        """Whether the module holds `name` as a parameter: registered, or under torch.nn.utils.parametrize
        (a constraint put on it), which moves it out of _parameters."""
        return name in self._parameters or parametrize.is_parametrized(self, name)

    @property
    def temperature(self):
        """The temperature: a number, or exp(log_temperature) where it is learnable (a 0-d tensor)."""
        if self._learns("log_temperature"):
            return self.log_temperature.exp()
        return self._temperature

    @temperature.setter
    def temperature(self, value) -> None:
        if not self._learns("log_temperature"):
            self._temperature = value
            return
        value = _initial_value("temperature", value)
        if not value > 0:
            raise ValueError(f"a learnable temperature must be > 0 (it is held as its log), got {value}")
        if parametrize.is_parametrized(self, "log_temperature"):  # through the parametrization's right_inverse
            self.log_temperature = torch.tensor(math.log(value), dtype=self.log_temperature.dtype,
                                                device=self.log_temperature.device)
        else:
            with torch.no_grad():
                self.log_temperature.fill_(math.log(value))

    def forward(self, score_matrix, query_lengths=None, target_lengths=None):
        if self.gap_extend is None:
            gap = self.gap_open
            if not isinstance(gap, torch.Tensor):
                gap = _check_number("gap_open", gap)  # its error under the module's name (the op's says gap)
            return soft_smith_waterman(score_matrix, gap, self.temperature,
                                       query_lengths, target_lengths, self.backend)
        return soft_smith_waterman(score_matrix, None, self.temperature, query_lengths, target_lengths, self.backend,
                                   gap_open=self.gap_open, gap_extend=self.gap_extend)

    def extra_repr(self) -> str:
        def shown(value):
            if not isinstance(value, torch.Tensor):
                return f"{value}"
            if value.numel() != 1 or torch.compiler.is_compiling():  # (torch.compile may trace the repr)
                return f"tensor of shape {tuple(value.shape)}"
            return f"{value.item():g}"

        extend = "" if self.gap_extend is None else f", gap_extend={shown(self.gap_extend)}"
        learned = [name for name in LEARNABLE if self._learns(name) or self._learns(f"log_{name}")]
        learnable = f", learnable={tuple(learned)}" if learned else ""
        return (f"gap_open={shown(self.gap_open)}{extend}, temperature={shown(self.temperature)}, "
                f"backend={self.backend!r}{learnable}")

    def __prepare_scriptable__(self):
        raise _not_scriptable("SoftSmithWaterman")


def _initial_value(name: str, value) -> float:
    """A learnable parameter's value as given: a number, or a tensor of one value (its value taken; the
    parameter is the module's own)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.item()
    return _check_number(name, value)


def _learnable_names(learnable, affine: bool) -> tuple[str, ...]:
    """The names SoftSmithWaterman(learnable=...) holds as parameters, checked."""
    if learnable is True:
        return LEARNABLE if affine else ("gap_open", "temperature")
    if learnable is False or learnable is None:
        return ()
    if not isinstance(learnable, (str, tuple, list, set, frozenset)):
        raise ValueError(f"learnable is True, False, or names among {', '.join(LEARNABLE)}; got {learnable!r}")
    names = (learnable,) if isinstance(learnable, str) else tuple(learnable)
    for name in names:
        if name not in LEARNABLE:
            raise ValueError(f"learnable names one of {', '.join(LEARNABLE)}, got {name!r}")
        if name == "gap_extend" and not affine:
            raise ValueError("gap_extend can only be learned with affine gaps: give gap_extend a value")
    return names


def _not_scriptable(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what} cannot be compiled by torch.jit.script: it is Python that checks its arguments and picks an "
        "engine. Use torch.compile or torch.export, or torch.jit.trace; a scripted module may call the "
        "operators torch.ops.swcli.* directly (swcli/ops.py lists their schemas), once swcli.load_engine('cpu' "
        "or 'cuda') has registered their kernels in the process")


def _refuse_script():
    raise _not_scriptable("soft_smith_waterman")


# torch.jit.script calls an object's __prepare_scriptable__ first: a clear error instead of TorchScript's
# complaint about the signature.
soft_smith_waterman.__prepare_scriptable__ = _refuse_script
soft_smith_waterman_codes.__prepare_scriptable__ = _refuse_script
