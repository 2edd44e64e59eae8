"""Gaps and temperature as tensors on the CUDA engine: the per-pair operators and the backward with the
parameters' sums (backward_parameters, affine_backward_parameters). Gradients of S, the gaps and the
temperature against the CPU engine and against autograd through the float64 reference loop, on every
path of the CUDA backward (the DP table, the rows, the affine state and rows, the traceback at t = 0)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import swcli
from swcli import ops
from swcli.testing import (
    cuda,
    parameter_gradients,
    random_lengths,
    random_scores,
    requires_cuda,
    slow_unless,
    window_mask,
)

pytestmark = [cuda, requires_cuda]

ssw = swcli.soft_smith_waterman
KINDS = ["linear", "affine"]
FORMS = ["0-d", "per-pair equal", "per-pair distinct"]
# one (B,) value takes the path of a 0-d tensor (one group): in the long sweeps only
SWEPT_FORMS = slow_unless(FORMS, ("0-d", "per-pair distinct"))
# (B, M, N), lengths: which path the float32 gradient takes at t > 0 (ops.gradient_by_rows and
# affine_gradient_by_rows; float64 and t = 0 always take the table or the state)
SHAPES = {
    "9x8 lengths": ((6, 9, 8), True),  # narrow: the DP table (linear), the affine rows
    "50x200": ((10, 50, 200), False),  # the rows (linear from N = 129)
    "60x230 lengths": ((12, 60, 230), True),  # the rows with lengths (linear from 193), masked lanes
    "40x300": ((5, 40, 300), False),  # past the rows' 256 columns: the table or the state, three tiles
}


def gaps_of(kind: str, form: str, B: int, dtype=torch.float64) -> dict:
    """The gaps of `kind` in `form`, requiring grad: 0-d, (B,) of one value, or (B,) of distinct values."""
    base = {"gap": (-0.8, -1.4, -0.4)} if kind == "linear" else {"gap_open": (-2.0, -2.6, -1.6),
                                                                   "gap_extend": (-0.5, -0.9, -0.3)}
    out = {}
    for name, (value, low, high) in base.items():
        if form == "0-d":
            x = torch.tensor(value, dtype=dtype)
        elif form == "per-pair equal":
            x = torch.full((B,), value, dtype=dtype)
        else:
            x = torch.linspace(low, high, B, dtype=dtype)
        out[name] = x.requires_grad_()
    return out


def temperature_of(t: float, form: str, B: int, dtype=torch.float64):
    """The temperature in `form`, requiring grad where t > 0 (distinct values from t / 2 up to t)."""
    if form == "0-d":
        x = torch.tensor(t, dtype=dtype)
    elif form == "per-pair equal":
        x = torch.full((B,), t, dtype=dtype)
    else:
        x = torch.linspace(0.5 * t, t, B, dtype=dtype)
    return x.requires_grad_(t > 0)


def on(device, dtype, S, gaps, temperature, qlen, tlen):
    """The same inputs on `device` in `dtype` (the parameters requiring grad as given)."""
    def move(x):
        return x.detach().to(device=device, dtype=dtype).requires_grad_(x.requires_grad)

    lengths = [None if x is None else x.to(device) for x in (qlen, tlen)]
    return (S.to(device=device, dtype=dtype), {k: move(v) for k, v in gaps.items()}, move(temperature), *lengths)


def batch(shape_name: str, seed: int):
    (B, M, N), with_lengths = SHAPES[shape_name]
    S = random_scores((B, M, N), seed=seed, scale=1.5)
    qlen = random_lengths(B, M, seed=seed + 1, low=1) if with_lengths else None
    tlen = random_lengths(B, N, seed=seed + 2, low=1) if with_lengths else None
    if with_lengths:
        qlen[0], tlen[0] = M, N
    return S, qlen, tlen


def assert_float32_close(got: dict, exact: dict, single: dict, name: str):
    """A float32 gradient within twice the CPU engine's own float32 error on the same input (the rule of
    swcli.testing for the scores, applied to each gradient, entry by entry) plus 1e-4 and 1e-4 of the value:
    the gap counts and d / dt are sums over the cells, whose rounding grows with their number; at t = 0 a
    near tie that float32 breaks the other way moves a count by a whole number in both engines."""
    error32 = (single[name].double() - exact[name]).abs()
    bound = 2 * error32 + 1e-4 * exact[name].abs() + 1e-4
    err = (got[name].double() - exact[name]).abs()
    assert (err <= bound).all(), (f"{name}: error {err.max().item():.3g} past the bound at "
                                  f"{int((err - bound).argmax())} (value {exact[name].abs().max().item():.4g})")


# --------------------------------------------------------------------------------------------------
# Against the CPU engine: every path of the CUDA backward, float32 and float64


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("form", SWEPT_FORMS)
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
def test_gradients_match_the_cpu_engine(kind, shape, form, t):
    S, qlen, tlen = batch(shape, seed=12000)
    B = S.shape[0]
    gaps, temperature = gaps_of(kind, form, B), temperature_of(t, form, B)
    grad_out = random_scores((B,), seed=12003).abs() + 0.5
    exact_scores, exact = parameter_gradients(S, gaps, temperature, qlen, tlen, grad_out, backend="cpu")
    single_scores, single = parameter_gradients(*on("cpu", torch.float32, S, gaps, temperature, qlen, tlen),
                                                grad_out.float(), backend="cpu")
    assert set(exact) == {"S", *gaps} | ({"temperature"} if t > 0 else set())
    for dtype in (torch.float64, torch.float32):
        S_in, gaps_in, t_in, q_in, t_len = on("cuda", dtype, S, gaps, temperature, qlen, tlen)
        scores, got = parameter_gradients(S_in, gaps_in, t_in, q_in, t_len, grad_out.to("cuda", dtype))
        got = {name: x.cpu() for name, x in got.items()}
        assert set(got) == set(exact) and all(got[name].dtype == dtype for name in got)
        if dtype == torch.float64:
            torch.testing.assert_close(scores.cpu(), exact_scores, rtol=1e-12, atol=1e-9)
            for name in exact:
                torch.testing.assert_close(got[name], exact[name], rtol=1e-9, atol=1e-9, msg=name)
            continue
        torch.testing.assert_close(scores.cpu().double(), exact_scores, rtol=1e-6, atol=1e-4)
        for name in exact:
            assert_float32_close(got, exact, single, name)
        if qlen is not None:
            assert (got["S"][window_mask(*S.shape, qlen, tlen)] == 0).all()


def test_paths_of_the_cases():
    """The float32 cases above at t > 0 take the paths their names say."""
    for name, expected in (("9x8 lengths", False), ("50x200", True), ("60x230 lengths", True), ("40x300", False)):
        S, qlen, tlen = batch(name, seed=12000)
        assert ops.gradient_by_rows(S.float().cuda(), qlen is not None, -0.8, 0.3) == expected, name
        # the affine gradient by rows takes every N up to 256
        assert ops.affine_gradient_by_rows(S.float().cuda(), qlen is not None, -2.0, 0.3) == (S.shape[2] <= 256), name


# --------------------------------------------------------------------------------------------------
# Against autograd through the float64 reference loop


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", SWEPT_FORMS)
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
def test_float64_gradients_match_autograd_through_reference(kind, form, t):
    S, qlen, tlen = batch("9x8 lengths", seed=12100)
    B = S.shape[0]
    gaps, temperature = gaps_of(kind, form, B), temperature_of(t, form, B)
    grad_out = random_scores((B,), seed=12103)
    ref_scores, ref = parameter_gradients(S, gaps, temperature, qlen, tlen, grad_out, backend="reference")
    scores, got = parameter_gradients(*on("cuda", torch.float64, S, gaps, temperature, qlen, tlen), grad_out.cuda())
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=0, atol=1e-9)
    assert set(got) == set(ref)
    for name in ref:
        torch.testing.assert_close(got[name].cpu(), ref[name], rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(8, 24, 20), (3, 6, 140)], ids=["table", "rows"])
def test_float32_gradients_close_to_reference(kind, shape):
    # 140 columns: the linear gradient by rows (the affine one takes both), at the reference loop's cost
    S = random_scores(shape, seed=12200, dtype=torch.float32)
    gaps = {name: torch.tensor(value, requires_grad=True) for name, value in
            ({"gap": -0.8} if kind == "linear" else {"gap_open": -2.0, "gap_extend": -0.5}).items()}
    t = torch.tensor(0.7, requires_grad=True)
    if shape[2] == 140:
        assert ops.gradient_by_rows(S.cuda(), False, -0.8, 0.7)
    _, got = parameter_gradients(S.cuda(), {k: v.detach().cuda().requires_grad_() for k, v in gaps.items()},
                                 t.detach().cuda().requires_grad_())
    _, ref = parameter_gradients(S.double(), {k: v.double() for k, v in gaps.items()}, t.double(),
                                 backend="reference")
    for name in ref:
        torch.testing.assert_close(got[name].cpu().double(), ref[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_in_s_gaps_and_temperature(kind):
    S = random_scores((3, 4, 5), seed=12300, device="cuda")
    qlen, tlen = torch.tensor([4, 2, 3], device="cuda"), torch.tensor([5, 5, 2], device="cuda")
    names = ["gap"] if kind == "linear" else ["gap_open", "gap_extend"]
    starts = [-0.8] if kind == "linear" else [-2.0, -0.5]
    inputs = [S.clone().requires_grad_()]
    inputs += [torch.tensor([x, x - 0.3, x + 0.2], dtype=torch.float64, device="cuda", requires_grad=True)
               for x in starts]
    inputs.append(torch.tensor(0.8, dtype=torch.float64, device="cuda", requires_grad=True))

    def scores(S, *rest):
        *gaps, t = rest
        return ssw(S, temperature=t, query_lengths=qlen, target_lengths=tlen, **dict(zip(names, gaps)))

    assert torch.autograd.gradcheck(scores, tuple(inputs), eps=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# Temperature 0, padding, empty batches


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_gap_gradients_count_the_best_alignments_gaps(kind, dtype):
    # t = 0: the counts on the alignment the traceback (affine) or the argmax backward (linear) takes: whole
    # numbers, the CPU engine's and the reference's
    S, qlen, tlen = batch("9x8 lengths", seed=12400)
    S = (S * 2).round()  # integer scores: float32 and float64 walk the same alignment
    B = S.shape[0]
    gaps = gaps_of(kind, "per-pair distinct", B)
    gaps = {name: value.detach().round().requires_grad_() for name, value in gaps.items()}
    got = parameter_gradients(*on("cuda", dtype, S, gaps, torch.tensor(0.0, dtype=torch.float64), qlen, tlen))[1]
    cpu = parameter_gradients(S, gaps, 0.0, qlen, tlen)[1]
    ref = parameter_gradients(S, gaps, 0.0, qlen, tlen, backend="reference")[1]
    for name in gaps:
        counts = got[name].cpu().double()
        assert torch.equal(counts, counts.round()) and (counts >= 0).all()
        assert torch.equal(counts, cpu[name]) and torch.equal(counts, ref[name]), name
    assert any(got[name].sum() > 0 for name in gaps)


@pytest.mark.parametrize("kind", KINDS)
def test_temperature_gradient_at_zero_is_a_clear_error(kind):
    S = random_scores((4, 6, 7), seed=12450, device="cuda")
    gaps = {"gap": -1.0} if kind == "linear" else {"gap_open": -2.0, "gap_extend": -0.5}
    for t in (torch.tensor(0.0, dtype=torch.float64), torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)):
        with pytest.raises(ValueError, match="not defined at temperature 0"):
            ssw(S, temperature=t.cuda().requires_grad_(), **gaps)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["9x8 lengths", "60x230 lengths"])
def test_padding_is_never_read(kind, shape):
    S, qlen, tlen = batch(shape, seed=12500)
    B = S.shape[0]
    gaps, t = gaps_of(kind, "per-pair distinct", B, torch.float32), torch.tensor(0.5, requires_grad=True)
    args = [(x.cuda() if x is not None else None) for x in (qlen, tlen)]
    S = S.float().cuda()
    scores, grads = parameter_gradients(S, {k: v.cuda() for k, v in gaps.items()}, t.cuda(), *args)
    S[window_mask(*S.shape, qlen, tlen).cuda()] = float("nan")
    nan_scores, nan_grads = parameter_gradients(S, {k: v.cuda() for k, v in gaps.items()}, t.cuda(), *args)
    assert torch.equal(scores, nan_scores)
    for name in grads:
        assert torch.equal(grads[name], nan_grads[name]), name


def test_empty_batches_with_tensor_parameters():
    for shape in [(0, 3, 4), (2, 0, 3), (2, 3, 0), (0, 3, 200)]:
        for gaps in ({"gap": -1.0}, {"gap_open": -2.0, "gap_extend": -1.0}):
            S = torch.zeros(shape, device="cuda", requires_grad=True)
            named = {k: torch.tensor(v, device="cuda", requires_grad=True) for k, v in gaps.items()}
            t = torch.tensor(1.0, device="cuda", requires_grad=True)
            out = ssw(S, temperature=t, **named)
            assert out.shape == (shape[0],) and (out == 0).all()
            grads = torch.autograd.grad(out.sum(), (S, *named.values(), t))
            assert grads[0].shape == shape and all((g == 0).all() for g in grads)


# --------------------------------------------------------------------------------------------------
# The operators called directly


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype, N, by_rows", [(torch.float32, 200, True), (torch.float32, 200, False),
                                               (torch.float64, 40, False), (torch.float32, 12, True)])
@pytest.mark.parametrize("t", [0.0, 0.6])
def test_backward_parameters_sums(kind, dtype, N, by_rows, t):
    """The backward with sums gives the plain backward's gradient (to rounding), and sums that are the gap
    counts (the posterior operators') and <S, grad_S>."""
    if by_rows and t == 0:
        return  # the rows are a scheme of t > 0
    ops.load_engine("cuda")
    S, qlen, tlen = random_scores((7, 30, N), seed=12600, dtype=dtype, device="cuda"), None, None
    if N == 12:  # lengths, and lanes past the target
        qlen, tlen = random_lengths(7, 30, seed=12601).cuda(), random_lengths(7, N, seed=12602).cuda()
    grad_out = (random_scores((7,), seed=12603, dtype=dtype) + 0.3).cuda()
    key = (-0.8,) if kind == "linear" else (-2.0, -0.5)
    forward = torch.ops.swcli.forward if kind == "linear" else torch.ops.swcli.affine_forward
    backward = torch.ops.swcli.backward if kind == "linear" else torch.ops.swcli.affine_backward
    with_sums = torch.ops.swcli.backward_parameters if kind == "linear" else torch.ops.swcli.affine_backward_parameters
    posterior = torch.ops.swcli.posterior_per_pair if kind == "linear" else torch.ops.swcli.affine_posterior_per_pair
    _, state, best, failed = forward(S, qlen, tlen, *key, t, by_rows)
    assert failed.item() == 0
    grad_S, sums = with_sums(grad_out, S, state, best, failed, qlen, tlen, *key, t, by_rows)
    # the same gradient, to rounding: the two instantiations are compiled apart, and nvcc may contract a
    # product and a sum into one FMA in one of them and not in the other (the affine state's kernel)
    plain = backward(grad_out, S, state, best, failed, qlen, tlen, *key, t, by_rows)
    exact = dict(rtol=1e-12, atol=1e-15) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_S, plain, **exact)
    assert sums.shape == (len(key) + 1, 7) and sums.dtype == dtype
    values = [torch.full((7,), x, dtype=dtype, device="cuda") for x in (*key, t)]
    counts = posterior(S, qlen, tlen, *values)[2:]
    # float32: the posterior operator may take the other path (rows or table) than the call here
    tolerance = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-3)
    for k, count in enumerate(counts):
        torch.testing.assert_close(sums[k], grad_out * count, **tolerance)
    inner = torch.where(grad_S == 0, 0, S.double() * grad_S.double()).sum(dim=(1, 2))
    torch.testing.assert_close(sums[-1].double(), inner, **tolerance)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_past_the_scaled_range_take_the_table_with_their_sums(kind):
    # a +150 spike leaves the scaled range: the backward by rows takes the table's (state's) path itself,
    # sums included, as the call without rows gives them
    ops.load_engine("cuda")
    S = random_scores((6, 40, 200), seed=12700, dtype=torch.float32, device="cuda")
    S[2, 10, 30] = 150.0
    key = (-1.0,) if kind == "linear" else (-2.0, -0.5)
    forward = torch.ops.swcli.forward if kind == "linear" else torch.ops.swcli.affine_forward
    with_sums = torch.ops.swcli.backward_parameters if kind == "linear" else torch.ops.swcli.affine_backward_parameters
    ones = torch.ones(6, device="cuda")
    _, kept, best_row, failed = forward(S, None, None, *key, 1.0, True)
    assert failed.item() == 1
    by_rows = with_sums(ones, S, kept, best_row, failed, None, None, *key, 1.0, True)
    _, state, best, none_failed = forward(S, None, None, *key, 1.0, False)
    by_state = with_sums(ones, S, state, best, none_failed, None, None, *key, 1.0, False)
    assert torch.equal(by_rows[0], by_state[0]) and torch.equal(by_rows[1], by_state[1])


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_long_pairs_on_tiles_give_the_gaps_and_t_their_gradients(t):
    # 2 pairs of 1100 x 1000 take the tiles of long pairs (ops.cpp tiles_take), whose backward sums nothing
    # for the parameters: their gradient takes the DP table's path, the same as the CPU engine's
    S = random_scores((2, 1100, 1000), seed=12750, scale=1.5)
    gaps, temperature = gaps_of("linear", "per-pair distinct", 2), temperature_of(t, "per-pair distinct", 2)
    grad_out = torch.tensor([0.7, 1.3], dtype=torch.float64)
    _, exact = parameter_gradients(S, gaps, temperature, None, None, grad_out, backend="cpu")
    _, single = parameter_gradients(*on("cpu", torch.float32, S, gaps, temperature, None, None), grad_out.float(),
                                    backend="cpu")
    S_in, gaps_in, t_in, _, _ = on("cuda", torch.float32, S, gaps, temperature, None, None)
    _, got = parameter_gradients(S_in, gaps_in, t_in, None, None, grad_out.to("cuda", torch.float32))
    got = {name: x.cpu() for name, x in got.items()}
    assert set(got) == set(exact) == {"S", "gap"} | ({"temperature"} if t > 0 else set())
    for name in ("gap", "temperature") if t > 0 else ("gap",):
        assert_float32_close(got, exact, single, name)
    assert (exact["gap"].abs() > 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_per_pair_operators_match_the_cpu_engine(kind):
    S, qlen, tlen = batch("9x8 lengths", seed=12800)
    B = S.shape[0]
    values = list(gaps_of(kind, "per-pair distinct", B).values())
    values = [v.detach()[[0, 1, 0, 3, 1, 5]] for v in values] + [torch.tensor([1.0, 0.5, 1.0, 0.0, 0.5, 2.0]).double()]
    names = ("scores_per_pair", "posterior_per_pair") if kind == "linear" else ("affine_scores_per_pair",
                                                                                 "affine_posterior_per_pair")
    ops.load_engine("cpu")
    ops.load_engine("cuda")
    on_cuda = [S.cuda(), qlen.cuda(), tlen.cuda(), *(v.cuda() for v in values)]
    for name in names:
        op = getattr(torch.ops.swcli, name)
        expected, got = op(S, qlen, tlen, *values), op(*on_cuda)
        for x, y in zip((got,) if isinstance(got, torch.Tensor) else got,
                        (expected,) if isinstance(expected, torch.Tensor) else expected):
            assert x.is_cuda
            torch.testing.assert_close(x.cpu(), y, rtol=1e-12, atol=1e-9, msg=name)


def test_per_pair_operators_check_values_naming_the_pair():
    """Called directly, past the Python checks, the CUDA kernels name the pair whose value is wrong, with the
    CPU engine's messages."""
    ops.load_engine("cuda")
    S = random_scores((3, 4, 5), seed=8800, device="cuda")
    good = torch.full((3,), -1.0, dtype=torch.float64, device="cuda")
    t = torch.ones(3, dtype=torch.float64, device="cuda")
    with pytest.raises(RuntimeError, match=r"temperature\[1\] must be a finite number >= 0, got -1"):
        torch.ops.swcli.posterior_per_pair(S, None, None, good, torch.tensor([1.0, -1.0, 1.0]).double().cuda())
    with pytest.raises(RuntimeError, match=r"gap\[2\] must be a finite number, got inf"):
        torch.ops.swcli.scores_per_pair(S, None, None, torch.tensor([-1.0, -1, math.inf]).double().cuda(), t)
    with pytest.raises(RuntimeError, match=r"gap_open\[0\] must be <= gap_extend\[0\]"):
        torch.ops.swcli.affine_scores_per_pair(S, None, None, torch.full((3,), -0.5).double().cuda(), good, t)
    with pytest.raises(RuntimeError, match=r"gap_extend\[1\] must be a finite number <= 0, got 1"):
        torch.ops.swcli.affine_posterior_per_pair(S, None, None, good, torch.tensor([-1.0, 1.0, -1.0]).double().cuda(),
                                                  t)
    with pytest.raises(RuntimeError, match=r"gap must be a floating-point tensor of shape \(3,\) on the scores'"):
        torch.ops.swcli.scores_per_pair(S, None, None, good.cpu(), t)
    # through soft_smith_waterman: its own checks, the pair named
    with pytest.raises(ValueError, match="gap must be finite; pair 2 has gap = nan"):
        ssw(S, torch.tensor([-1.0, -1.0, float("nan")], device="cuda"), 1.0)


# --------------------------------------------------------------------------------------------------
# Values read on the device: the gradient by rows of a differentiable call (ops._RowsPerPair)


def device_rows_batch(kind: str, seed: int, with_lengths: bool = False):
    """A float32 batch the gradient by rows takes (10 x 50 x 200; with lengths 60 x 230), distinct values
    per pair requiring grad, and a gradient to seed: (S, gaps, temperature, qlen, tlen, grad_out) on CUDA."""
    B, M, N = (10, 60, 230) if with_lengths else (10, 50, 200)
    S = random_scores((B, M, N), seed=seed, scale=1.5, dtype=torch.float32, device="cuda")
    qlen = random_lengths(B, M, seed=seed + 1, low=1).cuda() if with_lengths else None
    tlen = random_lengths(B, N, seed=seed + 2, low=1).cuda() if with_lengths else None
    gaps = {name: value.detach().float().cuda().requires_grad_() for name, value in
            gaps_of(kind, "per-pair distinct", B).items()}
    temperature = temperature_of(0.8, "per-pair distinct", B, torch.float32).detach().cuda().requires_grad_()
    grad_out = (random_scores((B,), seed=seed + 3).abs() + 0.5).float().cuda()
    return S, gaps, temperature, qlen, tlen, grad_out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_values_read_on_the_device_match_the_groups_and_are_never_copied(kind, with_lengths, monkeypatch):
    """Distinct (B,) values requiring grad take the rows with the values read by the kernels: no host copy
    (a read would fail here), and the scores and gradients of the path by groups of equal values."""
    S, gaps, t, qlen, tlen, grad_out = device_rows_batch(kind, 13000, with_lengths)
    every_value_a_tensor = (None,) * (len(gaps) + 1)
    assert ops._rows_per_pair_take(S, with_lengths, every_value_a_tensor)
    with monkeypatch.context() as patch:
        patch.setattr(ops, "_host_values", lambda *a: pytest.fail("the values were read to the host"))
        scores, got = parameter_gradients(S, gaps, t, qlen, tlen, grad_out)
    with monkeypatch.context() as patch:
        patch.setattr(ops, "_rows_per_pair_take", lambda *a: False)
        by_groups_scores, by_groups = parameter_gradients(S, gaps, t, qlen, tlen, grad_out)
    assert set(got) == {"S", *gaps, "temperature"}
    torch.testing.assert_close(scores, by_groups_scores, rtol=1e-6, atol=1e-6)
    for name in got:
        torch.testing.assert_close(got[name], by_groups[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t_grad", [False, True])
def test_values_read_on_the_device_outside_the_rows_match_the_cpu_engine(kind, t_grad):
    """Pairs whose values the rows do not take (t = 0, a gap > 0, affine gaps past the shared form) are
    scored in the forward by the sweep they need and counted; the backward takes the DP table's path by
    groups, the temperature's gradient included where it requires grad (then no pair at t = 0). Scores and
    gradients as the CPU engine's (float64)."""
    S, gaps, t, qlen, tlen, grad_out = device_rows_batch(kind, 13100)
    t = t.detach().clone()
    if not t_grad:
        t[1] = 0.0  # the exact sweep
    t[4] = 0.02  # affine: |gap_open| log2(e) / t past 100, the separate form; linear: the rows still
    t.requires_grad_(t_grad)
    if kind == "linear":
        gaps["gap"].data[6] = 0.3  # a gap > 0: log space
    _, state, best, failed = torch.ops.swcli.forward_per_pair(S, None, None, gaps["gap"], t) if kind == "linear" \
        else torch.ops.swcli.affine_forward_per_pair(S, None, None, gaps["gap_open"], gaps["gap_extend"], t)
    assert failed.item() >= (1 if t_grad else 2)  # (linear at t = 0.02 may leave the scaled range too)
    scores, got = parameter_gradients(S, gaps, t, qlen, tlen, grad_out)
    exact_scores, exact = parameter_gradients(*on("cpu", torch.float64, S, gaps, t, None, None),
                                              grad_out.double().cpu(), backend="cpu")
    single_scores, single = parameter_gradients(*on("cpu", torch.float32, S, gaps, t, None, None),
                                                grad_out.cpu(), backend="cpu")
    assert set(got) == set(exact) == {"S", *gaps} | ({"temperature"} if t_grad else set())
    torch.testing.assert_close(scores.double().cpu(), exact_scores, rtol=1e-5, atol=1e-4)  # float32 sums
    for name in exact:
        assert_float32_close({k: v.cpu() for k, v in got.items()}, exact, single, name)


@pytest.mark.parametrize("kind", KINDS)
def test_values_read_on_the_device_at_any_stride(kind):
    """(B,) values with a stride of 2 and 0-d values (expanded: stride 0) are read where they are."""
    S, gaps, t, qlen, tlen, grad_out = device_rows_batch(kind, 13150)
    # columns of (B, 2) leaves: views of stride 2, taken as they are (parameter_gradients would clone them)
    bases = {name: torch.stack([value.detach(), torch.full_like(value, 7.0)], 1).requires_grad_()
             for name, value in gaps.items()}
    strided = {name: base[:, 0] for name, base in bases.items()}
    assert all(value.stride(0) == 2 for value in strided.values())
    S_in, t_in = S.detach().clone().requires_grad_(), t.detach().clone().requires_grad_()
    scores = ssw(S_in, temperature=t_in, **strided)
    grads = torch.autograd.grad((scores * grad_out).sum(), [S_in, t_in, *bases.values()])
    same_scores, same = parameter_gradients(S, gaps, t, qlen, tlen, grad_out)
    assert torch.equal(scores.detach(), same_scores)
    assert torch.equal(grads[0], same["S"]) and torch.equal(grads[1], same["temperature"])
    for grad, name in zip(grads[2:], bases):
        assert torch.equal(grad[:, 0], same[name]) and (grad[:, 1] == 0).all()
    zero_d = {name: value.detach()[2].clone().requires_grad_() for name, value in gaps.items()}
    t0 = t.detach()[2].clone().requires_grad_()
    scores, got = parameter_gradients(S, zero_d, t0, qlen, tlen, grad_out)
    full = {name: value.detach().expand(10).contiguous().requires_grad_() for name, value in zero_d.items()}
    full_scores, full_got = parameter_gradients(S, full, t0.detach().expand(10).contiguous().requires_grad_(), qlen,
                                                tlen, grad_out)
    assert torch.equal(scores, full_scores) and torch.equal(got["S"], full_got["S"])
    for name in zero_d:
        torch.testing.assert_close(got[name], full_got[name].sum(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_values_the_numbers_send_off_the_rows_take_the_groups(kind):
    """Where the numbers given already put every pair off the rows (t = 0; a linear gap > 0; affine gaps
    past the shared form), or M is 0, the values are read to the host: the path by groups, checked first."""
    S = random_scores((6, 40, 200), seed=13170, dtype=torch.float32, device="cuda").requires_grad_()
    tensor = torch.full((6,), -1.0, device="cuda", requires_grad=True)
    calls = ([dict(gap=tensor, temperature=0.0), dict(gap=0.5, temperature=tensor.detach().abs())]
             if kind == "linear" else
             [dict(gap_open=-2.0, gap_extend=tensor, temperature=0.0),
              dict(gap_open=-30.0, gap_extend=tensor, temperature=0.2)])
    for call in calls:
        assert type(ssw(S, **call).grad_fn).__name__ == "_ParametersWithGradientBackward"
    bad = torch.tensor([-1.0, float("nan"), -1.0, -1.0], device="cuda", requires_grad=True)
    empty = torch.zeros(4, 0, 200, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="pair 1 has"):
        ssw(empty, bad, 1.0) if kind == "linear" else ssw(empty, gap_open=bad - 1, gap_extend=bad, temperature=1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_values_read_on_the_device_score_nan_and_fail_at_backward(kind):
    """The forward does not wait for the values: a pair whose value breaks a rule scores NaN, and the backward
    (which reads the failed count) raises, naming the pair as the checks before a forward do."""
    name = "gap" if kind == "linear" else "gap_extend"
    for broken, value, message in ((name, float("nan"), f"{name} must be finite; pair 3 has"),
                                   ("temperature", -0.5, "temperature must be finite and >= 0; pair 3 has"),
                                   ("temperature", 0.0, "not defined at temperature 0")):
        S, gaps, t, qlen, tlen, grad_out = device_rows_batch(kind, 13200)
        target = t if broken == "temperature" else gaps[broken]
        target.data[3] = value
        scores = ssw(S.requires_grad_(), temperature=t, **gaps)
        assert (scores[3].isnan().item() if value != 0.0 else scores[3].isfinite().item())
        assert scores[torch.arange(10, device="cuda") != 3].isfinite().all()
        with pytest.raises(ValueError, match=message):
            scores.sum().backward()
    if kind == "affine":  # gap_open > gap_extend
        S, gaps, t, qlen, tlen, grad_out = device_rows_batch(kind, 13200)
        gaps["gap_open"].data[5] = 0.0
        scores = ssw(S, temperature=t, **gaps)
        assert scores[5].isnan()
        with pytest.raises(ValueError, match="gap_open must be <= gap_extend; pair 5 has"):
            scores.sum().backward()


def test_tensor_values_cannot_be_captured_in_a_cuda_graph():
    S = random_scores((3, 4, 5), seed=12900, dtype=torch.float32, device="cuda")
    gap = torch.tensor(-1.0, device="cuda")
    ssw(S, gap, 1.0)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="a CUDA graph being captured does not allow"):
        with torch.cuda.graph(graph):
            ssw(S, gap, 1.0)


# --------------------------------------------------------------------------------------------------
# The learnable module and torch's transforms on CUDA


@pytest.mark.parametrize("affine", [False, True])
def test_learnable_module_on_cuda_matches_the_cpu(affine):
    extend = {"gap_extend": -0.5} if affine else {}
    S, qlen, tlen = batch("60x230 lengths", seed=13000)
    results = {}
    for device in ("cpu", "cuda"):
        module = swcli.SoftSmithWaterman(gap_open=-2.0, temperature=0.8, learnable=True, **extend).to(device)
        S_in = S.float().to(device).requires_grad_()
        out = module(S_in, qlen.to(device), tlen.to(device))
        # on CUDA the rows read the parameters on the device (230 columns with lengths: the gradient by rows)
        node = "_RowsPerPairBackward" if device == "cuda" else "_ParametersWithGradientBackward"
        assert type(out.grad_fn).__name__ == node
        out.sum().backward()
        results[device] = (out.detach().cpu(), S_in.grad.cpu(), {n: p.grad.cpu() for n, p in module.named_parameters()})
    torch.testing.assert_close(results["cuda"][0], results["cpu"][0], rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(results["cuda"][1], results["cpu"][1], rtol=0, atol=1e-4)
    for name, grad in results["cpu"][2].items():
        torch.testing.assert_close(results["cuda"][2][name], grad, rtol=2e-3, atol=2e-3, msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_func_grad_jacrev_and_vmap(kind):
    S = random_scores((4, 7, 6), seed=13100, device="cuda")
    qlen = random_lengths(4, 7, seed=13101, low=1).cuda()
    extend = {} if kind == "linear" else {"gap_extend": -0.5}

    def loss(S, gap, t):
        gaps = {"gap": gap} if kind == "linear" else {"gap_open": gap}
        return ssw(S, temperature=t, query_lengths=qlen, **gaps, **extend).sum()

    gap = torch.tensor(-1.5 if kind == "linear" else -2.0, dtype=torch.float64, device="cuda")
    t = torch.tensor(0.7, dtype=torch.float64, device="cuda")
    got = torch.func.grad(loss, argnums=(0, 1, 2))(S, gap, t)
    inputs = [x.clone().requires_grad_() for x in (S, gap, t)]
    for a, b in zip(got, torch.autograd.grad(loss(*inputs), inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    def scores_with(per_pair_gap):
        return ssw(S, temperature=1.0, query_lengths=qlen, **{"gap" if kind == "linear" else "gap_open": per_pair_gap},
                   **extend)

    per_pair = torch.tensor([-2.5, -2.0, -3.0, -2.2], dtype=torch.float64, device="cuda")
    jacobian = torch.func.jacrev(scores_with)(per_pair)
    g = per_pair.clone().requires_grad_()
    (counts,) = torch.autograd.grad(scores_with(g).sum(), g)
    torch.testing.assert_close(jacobian, torch.diag(counts), rtol=0, atol=1e-12)
    V = random_scores((3, 4, 7, 6), seed=13102, device="cuda")
    with_gaps = {"gap": -1.0} if kind == "linear" else {"gap_open": -2.0, "gap_extend": -0.5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one engine call, no per-sample fallback
        out = torch.vmap(lambda S: ssw(S, temperature=0.5, query_lengths=qlen, **with_gaps))(V)
    for v in range(3):
        torch.testing.assert_close(out[v], ssw(V[v], temperature=0.5, query_lengths=qlen, **with_gaps), rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_compile_and_export_of_the_learnable_module(kind):
    torch._dynamo.reset()
    S = random_scores((4, 7, 6), seed=13200, device="cuda").requires_grad_()
    qlen = random_lengths(4, 7, seed=13201, low=1).cuda()
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=0.7, learnable=True, **extend).double().cuda()
    eager = module(S, qlen)
    eager_grads = torch.autograd.grad(eager.sum(), [S, *module.parameters()])
    out = torch.compile(module, fullgraph=True)(S, qlen)
    grads = torch.autograd.grad(out.sum(), [S, *module.parameters()])
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-12)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    exported = torch.export.export(module, (S.detach(), qlen))
    torch.testing.assert_close(exported.module()(S.detach(), qlen), module(S.detach(), qlen), rtol=0, atol=1e-12)


def test_return_posterior_with_tensor_parameters():
    S, qlen, tlen = batch("60x230 lengths", seed=13300)
    gap, t = torch.tensor(-1.0, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)
    expected = ssw(S, gap, t, qlen, tlen, return_posterior=True)
    got = ssw(S.cuda(), gap.cuda(), t.cuda(), qlen.cuda(), tlen.cuda(), return_posterior=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_jit_trace_of_the_learnable_module_runs_other_batches(kind):
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=0.7, learnable=True, **extend).double().cuda()
    S = random_scores((4, 7, 6), seed=13400, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated, and warns of what a trace freezes
        traced = torch.jit.trace(module, (S,))
    S2 = random_scores((7, 5, 9), seed=13401, device="cuda").requires_grad_()
    out, expected = traced(S2), module(S2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    inputs = [S2, *module.parameters()]
    for a, b in zip(torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(expected.sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_double_backward_is_a_clear_error():
    S = random_scores((2, 4, 5), seed=13500, device="cuda").requires_grad_()
    gap = torch.tensor(-2.0, dtype=torch.float64, device="cuda", requires_grad=True)
    (grad,) = torch.autograd.grad(ssw(S, gap, 1.0).sum(), S, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.grad(grad.sum(), gap)


@pytest.mark.parametrize("N", [40, 200])  # the DP table's backward, and the rows'
def test_minus_inf_scores_leave_the_temperature_gradient_finite(N):
    # a block of -inf (a masked region): its cells' posterior is 0, but the linear CUDA kernels take the
    # match weight as what the other weights leave, about 1e-8; <S, grad_S> must not make that -inf
    S = random_scores((6, 30, N), seed=12900, scale=1.5)
    S[:, 5:12, 10:25] = float("-inf")
    gaps, temperature = gaps_of("linear", "0-d", 6), temperature_of(1.0, "0-d", 6)
    _, exact = parameter_gradients(S, gaps, temperature, None, None, None, backend="cpu")
    _, single = parameter_gradients(*on("cpu", torch.float32, S, gaps, temperature, None, None), None, backend="cpu")
    _, got = parameter_gradients(*on("cuda", torch.float32, S, gaps, temperature, None, None), None)
    got = {name: x.cpu() for name, x in got.items()}
    assert torch.isfinite(got["temperature"]).all() and torch.isfinite(got["gap"]).all()
    for name in ("gap", "temperature"):
        assert_float32_close(got, exact, single, name)


def test_backward_operators_check_grad_scores():
    ops.load_engine("cuda")
    S = random_scores((4, 20, 200), seed=12950, dtype=torch.float32, device="cuda")
    for by_rows in (False, True):
        _, state, best, failed = torch.ops.swcli.forward(S, None, None, -1.0, 1.0, by_rows)
        for grad in (torch.ones(4), torch.ones(3, device="cuda")):
            with pytest.raises(RuntimeError, match=r"grad_scores must hold 4 values on the scores' device"):
                torch.ops.swcli.backward_parameters(grad, S, state, best, failed, None, None, -1.0, 1.0, by_rows)
