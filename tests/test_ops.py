"""The op (swcli/ops.py) and its compiled engines, against the reference loop and Biopython.

Parametrised over testing.DEVICES and testing.DTYPES; on each device the compiled backend is
BACKENDS_FOR(device) ('cpu' here, 'cuda' on a GPU, where those cases carry the `cuda` marker).
"""

from __future__ import annotations

import functools
import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from Bio.Align import substitution_matrices

import swcli
from swcli import _build, ops
from swcli.ops import soft_smith_waterman_codes
from swcli.reference import SoftSmithWatermanReference, soft_smith_waterman_reference
from testing import (
    BACKENDS_FOR,
    BLOSUM62,
    DEVICES,
    DTYPES,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    cuda,
    device_id,
    dtype_id,
    random_lengths,
    random_protein_pairs,
    random_scores,
    reference,
    related_protein_pairs,
    requires_cuda,
    score_matrices,
)

ssw = swcli.soft_smith_waterman

DEVICE_PARAMS = [
    pytest.param(d, id=device_id(d), marks=[cuda, requires_cuda] if d.type == "cuda" else [])
    for d in DEVICES
]
DTYPE_PARAMS = [pytest.param(dt, id=dtype_id(dt)) for dt in DTYPES]
TEMPERATURES = [0.0, 0.1, 1.0, 10.0]
GAPS = [-0.5, -1.0, -4.0]

parametrize_device = pytest.mark.parametrize("device", DEVICE_PARAMS)
parametrize_dtype = pytest.mark.parametrize("dtype", DTYPE_PARAMS)


def run(S, gap=-1.0, t=1.0, qlen=None, tlen=None, backend=None):
    """The op on S's device with the compiled backend for that device (unless told otherwise)."""
    if backend is None:
        backend = BACKENDS_FOR(S.device)
    if qlen is not None:
        qlen = qlen.to(S.device)
    if tlen is not None:
        tlen = tlen.to(S.device)
    return ssw(S, gap, t, qlen, tlen, backend=backend)


def window_mask(B, M, N, qlen, tlen):
    """True outside each pair's (qlen, tlen) window."""
    rows = torch.arange(M).view(1, M, 1) >= qlen.cpu().view(B, 1, 1)
    cols = torch.arange(N).view(1, 1, N) >= tlen.cpu().view(B, 1, 1)
    return rows | cols


# --------------------------------------------------------------------------------------------------
# Against the float64 reference

SMALL_SHAPES = [(0, 5, 7), (3, 0, 4), (3, 4, 0), (1, 1, 1), (4, 1, 9), (4, 9, 1), (5, 7, 13),
                (3, 23, 17), (40, 12, 10)]


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap", GAPS)
@pytest.mark.parametrize("t", TEMPERATURES)
@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, t, gap, dtype, device):
    S = random_scores(shape, seed=1000 + sum(shape), dtype=dtype, device=device, scale=1.5)
    assert_close_to_reference(run(S, gap, t), S, gap, t)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap", GAPS)
@pytest.mark.parametrize("t", TEMPERATURES)
def test_matches_reference_with_lengths(t, gap, dtype, device):
    B, M, N = 37, 14, 11  # more pairs than one SIMD group of either dtype
    S = random_scores((B, M, N), seed=2000, dtype=dtype, device=device, scale=1.5)
    qlen = random_lengths(B, M, seed=2001)
    tlen = random_lengths(B, N, seed=2002)
    assert_close_to_reference(run(S, gap, t, qlen, tlen), S, gap, t, qlen, tlen)


# Long pairs: few, since the reference loop is slow. The float32 cases at t = 1, gap -1 and t = 10,
# gap -0.5 once drifted past the bound when the engine pre-scaled S and the gap by log2(e)/t.
LONG_CASES = [
    # (B, M, N, t, gap)
    (2, 200, 150, 0.1, -4.0),
    (2, 150, 200, 0.0, -1.0),
    (2, 200, 150, 1.0, -1.0),
    (2, 150, 200, 10.0, -0.5),
]


def _long_params():
    params = []
    for B, M, N, t, gap in LONG_CASES:
        for device in DEVICES:
            for dtype in DTYPES:
                marks = [cuda, requires_cuda] if device.type == "cuda" else []
                params.append(pytest.param((B, M, N), t, gap, dtype, device, marks=marks,
                                           id=f"{B}x{M}x{N}-t{t}-g{gap}-{dtype_id(dtype)}-{device.type}"))
    return params


@pytest.mark.parametrize("shape,t,gap,dtype,device", _long_params())
def test_matches_reference_long(shape, t, gap, dtype, device):
    S = random_scores(shape, seed=3000, dtype=dtype, device=device)
    assert_close_to_reference(run(S, gap, t), S, gap, t)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_matches_reference_with_minus_infinity(t, dtype, device):
    # -inf scores forbid a match; the zero term keeps every cell finite.
    S = random_scores((6, 8, 9), seed=3500, dtype=dtype, device=device, scale=2.0)
    S[S < -1.0] = float("-inf")
    S[3] = float("-inf")
    out = run(S, -1.0, t)
    assert torch.isfinite(out).all()
    assert_close_to_reference(out, S, -1.0, t)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap", [0.0, 0.5])
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_matches_reference_with_nonnegative_gap(t, gap, dtype, device):
    S = random_scores((5, 9, 8), seed=3600, dtype=dtype, device=device)
    assert_close_to_reference(run(S, gap, t), S, gap, t)


def _tiny_params():
    # 1e-36 and 1e-39 once overflowed to inf / NaN in float32 (log2(e)/t past the float range).
    params = []
    for t in [1e-30, 1e-36, 1e-39, 1e-46]:
        for device in DEVICES:
            for dtype in DTYPES:
                marks = [cuda, requires_cuda] if device.type == "cuda" else []
                params.append(pytest.param(t, dtype, device, marks=marks,
                                           id=f"t{t}-{dtype_id(dtype)}-{device.type}"))
    return params


@pytest.mark.parametrize("t,dtype,device", _tiny_params())
def test_tiny_temperature_gives_the_hard_score(t, dtype, device):
    # A valid temperature (finite, > 0): the soft score is within t log 4 (M + N) of the hard score.
    pairs = related_protein_pairs(seed=3700, count=3, min_length=100, max_length=300)
    S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=device)
    hard = torch.tensor([biopython_score(q, s, -4.0) for q, s in pairs], dtype=torch.float64)
    out = run(S, -4.0, t, qlen, tlen).cpu().double()
    assert torch.isfinite(out).all(), f"t={t}: {out.tolist()} (hard {hard.tolist()})"
    atol = 1e-9 if dtype == torch.float64 else 1e-2
    torch.testing.assert_close(out, hard, rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------------
# Padding invariance


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("junk", ["random", "nan", "inf", "-inf", "huge"])
def test_padding_never_changes_a_score(junk, t, dtype, device):
    B, M, N = 45, 19, 23
    S = random_scores((B, M, N), seed=4000, dtype=dtype, device=device)
    qlen = random_lengths(B, M, seed=4001)
    tlen = random_lengths(B, N, seed=4002)
    outside = window_mask(B, M, N, qlen, tlen).to(device)
    padded = S.clone()
    if junk == "random":
        noise = random_scores((B, M, N), seed=4003, dtype=dtype, device=device, scale=50.0)
        padded[outside] = noise[outside]
    else:
        padded[outside] = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
                           "huge": 1e30}[junk]
    out = run(padded, -1.0, t, qlen, tlen)
    assert torch.isfinite(out).all()
    # Bit for bit: the same lengths on the clean matrix, and each pair alone, unpadded.
    assert torch.equal(out, run(S, -1.0, t, qlen, tlen))
    for b in range(B):
        alone = run(S[b : b + 1, : qlen[b], : tlen[b]].contiguous(), -1.0, t)
        assert out[b].item() == alone.item() or (
            math.isnan(out[b].item()) and math.isnan(alone.item())
        ), f"pair {b} ({qlen[b]}x{tlen[b]}): {out[b].item()!r} padded vs {alone.item()!r} alone"


@parametrize_device
@parametrize_dtype
def test_zero_lengths_give_zero(dtype, device):
    S = torch.full((4, 5, 6), 3.0, dtype=dtype, device=device)
    qlen = torch.tensor([0, 5, 0, 2])
    tlen = torch.tensor([6, 0, 0, 3])
    for t in [0.0, 1.0]:
        out = run(S, -1.0, t, qlen, tlen)
        assert out[:3].tolist() == [0.0, 0.0, 0.0]
        assert out[3].item() >= 6.0  # two matches of 3 on the diagonal


@parametrize_device
def test_lengths_accept_lists_and_int32(device):
    S = random_scores((3, 6, 7), seed=4500, device=device)
    expected = run(S, -1.0, 1.0, torch.tensor([2, 6, 4]), torch.tensor([7, 1, 5]))
    backend = BACKENDS_FOR(device)
    assert torch.equal(ssw(S, -1.0, 1.0, [2, 6, 4], [7, 1, 5], backend=backend), expected)
    as_int32 = ssw(S, -1.0, 1.0, torch.tensor([2, 6, 4], dtype=torch.int32, device=device),
                   torch.tensor([7, 1, 5], dtype=torch.int32, device=device), backend=backend)
    assert torch.equal(as_int32, expected)
    strided = torch.tensor([2, 0, 6, 0, 4], device=device)[::2], torch.tensor([7, 1, 5], device=device)
    assert not strided[0].is_contiguous()
    assert torch.equal(ssw(S, -1.0, 1.0, *strided, backend=backend), expected)


# --------------------------------------------------------------------------------------------------
# Temperature 0 against Biopython: exact, in float32 and float64


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap", [-1.0, -4.0])
def test_temperature_zero_equals_biopython(gap, dtype, device):
    pairs = random_protein_pairs(seed=5000, count=20, min_length=1, max_length=120)
    pairs += related_protein_pairs(seed=5001, count=20, min_length=30, max_length=250)
    S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=device, pad=float("nan"))
    out = run(S, gap, 0.0, qlen, tlen)
    expected = [biopython_score(q, t, gap) for q, t in pairs]
    got = out.cpu().tolist()
    bad = [(b, got[b], expected[b]) for b in range(len(pairs)) if got[b] != expected[b]]
    assert not bad, f"(pair, got, Biopython): {bad[:5]}"


@parametrize_device
@parametrize_dtype
def test_temperature_zero_equals_biopython_past_1024(dtype, device):
    pairs = related_protein_pairs(seed=5100, count=1, min_length=1300, max_length=1300)
    pairs += random_protein_pairs(seed=5101, count=1, min_length=1030, max_length=1100)
    S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=device)
    assert max(S.shape[1:]) > 1024
    out = run(S, -4.0, 0.0, qlen, tlen).cpu().tolist()
    assert out == [biopython_score(q, t, -4.0) for q, t in pairs]


# --------------------------------------------------------------------------------------------------
# Properties


@parametrize_device
@parametrize_dtype
def test_soft_decreases_to_hard(dtype, device):
    B, M, N = 9, 30, 20
    S = random_scores((B, M, N), seed=6000, dtype=dtype, device=device)
    qlen = random_lengths(B, M, seed=6001, low=1)
    tlen = random_lengths(B, N, seed=6002, low=1)
    slack = 1e-9 if dtype == torch.float64 else 1e-4  # rounding, far below the steps
    hard = run(S, -1.0, 0.0, qlen, tlen).double()
    previous = None
    for t in [1.0, 0.1, 0.01, 0.001]:
        soft = run(S, -1.0, t, qlen, tlen).double()
        assert (soft >= hard - slack).all(), f"soft below hard at t={t}"
        # Each cell exceeds its hard max by at most t log 4, along a chain of at most qlen + tlen.
        bound = t * math.log(4.0) * (qlen + tlen).to(soft.device).double()
        assert (soft - hard <= bound + slack).all(), f"soft too far above hard at t={t}"
        if previous is not None:
            assert (soft <= previous + slack).all(), f"not decreasing at t={t}"
        previous = soft
    assert (previous - hard).abs().max().item() < 0.01  # t = 0.001: close to hard


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", TEMPERATURES)
def test_scores_are_nonnegative(t, dtype, device):
    S = random_scores((20, 9, 8), seed=6100, dtype=dtype, device=device, scale=2.0, shift=-4.0)
    out = run(S, -1.0, t)
    assert (out >= 0).all()
    if t == 0:
        assert (out == 0).any()  # some all-negative pairs give the empty alignment


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_non_contiguous_inputs(t, dtype, device):
    base = random_scores((7, 13, 11), seed=6200, dtype=dtype, device=device)
    transposed = base.transpose(1, 2)  # (7, 11, 13), strides permuted
    big = random_scores((9, 30, 40), seed=6201, dtype=dtype, device=device)
    sliced = big[1::2, ::2, 3::3]  # every stride != the contiguous one
    expanded = base[:1].expand(5, 13, 11)  # batch stride 0
    qlen = torch.tensor([3, 13, 0, 7, 12])
    tlen = torch.tensor([11, 2, 5, 11, 9])
    for S, lengths in [(transposed, None), (sliced, None), (expanded, (qlen, tlen))]:
        assert not S.is_contiguous()
        args = lengths or (None, None)
        assert torch.equal(run(S, -1.0, t, *args), run(S.contiguous(), -1.0, t, *args))


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_non_contiguous_gradient(t, device):
    base = random_scores((6, 11, 9), seed=6250, device=device)
    grad_out = random_scores((6,), seed=6251, device=device)
    strided = base.transpose(1, 2).detach().requires_grad_()
    (run(strided, -1.0, t) * grad_out).sum().backward()
    dense = strided.detach().contiguous().requires_grad_()
    (run(dense, -1.0, t) * grad_out).sum().backward()
    assert torch.equal(strided.grad, dense.grad)
    # through an expand (batch stride 0), the gradient is summed back onto the single matrix
    single = base[:1].detach().requires_grad_()
    run(single.expand(4, 11, 9), -1.0, t).sum().backward()
    alone = base[:1].detach().requires_grad_()
    run(alone, -1.0, t).sum().backward()
    torch.testing.assert_close(single.grad, 4 * alone.grad, rtol=0, atol=1e-12)


@parametrize_device
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_half_precision_is_upcast(half, t, device):
    S = random_scores((5, 12, 10), seed=6300, dtype=half, device=device)
    out = run(S, -1.0, t)
    assert out.dtype == half
    single = run(S.float(), -1.0, t)
    assert torch.equal(out, single.to(half))
    assert (out.float() - single).abs().max().item() <= 0.01 * single.abs().max().item()
    # and it is differentiable, with a gradient of the input's dtype
    S.requires_grad_()
    run(S, -1.0, t).sum().backward()
    assert S.grad.dtype == half and S.grad.shape == S.shape
    assert (S.grad.float() >= 0).all() and (S.grad.float() <= 1).all()


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_nan_poisons_only_its_pair(t, dtype, device):
    B = 40  # more than one SIMD group for both dtypes
    S = random_scores((B, 8, 9), seed=6400, dtype=dtype, device=device)
    clean = run(S, -1.0, t)
    poisoned = S.clone()
    poisoned[7, 3, 4] = float("nan")
    poisoned[25, 7, 8] = float("nan")  # the last cell
    poisoned[30, 0, 0] = float("nan")  # the first cell
    out = run(poisoned, -1.0, t)
    nan = torch.isnan(out).cpu()
    assert nan.nonzero().flatten().tolist() == [7, 25, 30]
    assert torch.equal(out[~nan.to(device)], clean[~nan.to(device)])


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_deterministic_and_independent_of_batch(t, dtype, device):
    B, M, N = 70, 25, 21
    S = random_scores((B, M, N), seed=6500, dtype=dtype, device=device)
    qlen = random_lengths(B, M, seed=6501)
    tlen = random_lengths(B, N, seed=6502)
    first = run(S, -1.0, t, qlen, tlen)
    assert torch.equal(first, run(S, -1.0, t, qlen, tlen))
    # a shuffled batch gives the shuffled scores, bit for bit
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(6503))
    shuffled = run(S[perm.to(device)], -1.0, t, qlen[perm], tlen[perm])
    assert torch.equal(shuffled, first[perm.to(device)])
    # a pair alone, or in a small batch, scores as inside the large one
    for b in [0, 17, 69]:
        alone = run(S[b : b + 1], -1.0, t, qlen[b : b + 1], tlen[b : b + 1])
        assert alone.item() == first[b].item()
    # and the thread count does not matter
    if device.type == "cpu":
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            single_threaded = run(S, -1.0, t, qlen, tlen)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(single_threaded, first)


# --------------------------------------------------------------------------------------------------
# Gradients


def reference_gradient(S, gap, t, qlen, tlen, grad_out):
    S64 = S.detach().cpu().double().requires_grad_()
    out = soft_smith_waterman_reference(S64, gap, t, qlen, tlen)
    (out * grad_out.cpu().double()).sum().backward()
    return out.detach(), S64.grad


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("gap", [-0.5, -1.0])
def test_gradient_matches_autograd_through_reference(gap, t, device):
    B, M, N = 6, 9, 8
    S = random_scores((B, M, N), seed=7000, device=device, scale=1.5)  # float64, no ties
    qlen = random_lengths(B, M, seed=7001)
    tlen = random_lengths(B, N, seed=7002)
    qlen[0], tlen[0] = M, N  # one full pair
    grad_out = random_scores((B,), seed=7003, device=device)
    S.requires_grad_()
    out = run(S, gap, t, qlen, tlen)
    (out * grad_out).sum().backward()
    expected_out, expected_grad = reference_gradient(S, gap, t, qlen, tlen, grad_out)
    torch.testing.assert_close(out.detach().cpu(), expected_out, rtol=0, atol=1e-9)
    assert S.grad.shape == S.shape and S.grad.dtype == S.dtype
    torch.testing.assert_close(S.grad.cpu(), expected_grad, rtol=0, atol=1e-9)
    assert (S.grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()


@parametrize_device
def test_gradient_float32_close_to_reference(device):
    S = random_scores((16, 32, 32), seed=7100, dtype=torch.float32, device=device).requires_grad_()
    run(S, -1.0, 1.0).sum().backward()
    _, expected = reference_gradient(S, -1.0, 1.0, None, None, torch.ones(16))
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=1e-4)


@parametrize_device
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_gradcheck(with_lengths, device):
    S = random_scores((3, 4, 5), seed=7200, device=device).requires_grad_()
    qlen = torch.tensor([4, 2, 3]).to(device) if with_lengths else None
    tlen = torch.tensor([5, 5, 2]).to(device) if with_lengths else None
    backend = BACKENDS_FOR(device)
    assert torch.autograd.gradcheck(
        lambda x: ssw(x, -1.0, 1.0, qlen, tlen, backend=backend), (S,), eps=1e-6, atol=1e-6
    )


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", TEMPERATURES)
def test_gradient_entries_in_unit_interval(t, dtype, device):
    B, M, N = 12, 15, 13
    S = random_scores((B, M, N), seed=7300, dtype=dtype, device=device).requires_grad_()
    qlen = random_lengths(B, M, seed=7301)
    run(S, -1.0, t, qlen).sum().backward()
    g = S.grad
    assert torch.isfinite(g).all()
    # [0, 1] up to rounding: the backward's weights exp((x - h) / t) carry the rounding of the stored
    # H divided by t (the float64 reference itself gives 1 + 1e-14 at small t).
    slack = 1e-12 if dtype == torch.float64 else 1e-5
    assert (g >= 0).all() and (g <= 1 + slack).all(), f"max entry {g.max().item()!r}"
    assert (g > 0).any()
    if t == 0:  # the hard gradient marks the matched cells of the best alignment
        assert ((g == 0) | (g == 1)).all()


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_gradient_goes_to_the_first_of_tied_best_cells(t, device):
    # With gap -1000 every gap term underflows, so H[i][j] = t log(1 + exp(H[i-1][j-1] + S) / t) and two
    # lone 5s give two bit-identical best cells, at (1, 3) and (3, 1) (1-based H indices). torch.max in
    # the reference takes the first in row-major order, (1, 3): the gradient must all go there.
    S = torch.full((1, 3, 3), -1000.0, dtype=torch.float64, device=device)
    S[0, 0, 2] = S[0, 2, 0] = 5.0
    S.requires_grad_()
    run(S, -1000.0, t).sum().backward()
    expected = torch.zeros(1, 3, 3, dtype=torch.float64)
    expected[0, 0, 2] = 1.0 if t == 0 else 1.0 / (1.0 + math.exp(-5.0))
    _, through_reference = reference_gradient(S, -1000.0, t, None, None, torch.ones(1))
    torch.testing.assert_close(through_reference, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(S.grad.cpu(), expected, rtol=0, atol=1e-12)


@parametrize_device
@parametrize_dtype
def test_gradient_with_minus_infinite_scores(dtype, device):
    # A -inf score forbids a match: its term weighs exp(-inf) = 0 in the reference, and exactly 0 in the
    # CPU engine's vector weights. The CUDA engine takes the match weight as what the other three leave
    # (1 - w_up - w_left - w_zero), so there it is 0 up to their rounding.
    S = random_scores((4, 12, 15), seed=7500, dtype=dtype, device=device, shift=0.5)
    S[:, 3:6, 2:9] = -math.inf
    S.requires_grad_()
    run(S, -1.0, 1.0).sum().backward()
    _, expected = reference_gradient(S, -1.0, 1.0, None, None, torch.ones(4))
    if torch.device(device).type == "cpu":
        assert (S.grad[:, 3:6, 2:9] == 0).all()
    tolerance = 1e-8 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=tolerance)


@parametrize_device
def test_gradient_of_empty_batches(device):
    for shape in [(0, 3, 4), (2, 0, 3), (2, 3, 0)]:
        S = torch.zeros(shape, dtype=torch.float64, device=device, requires_grad=True)
        run(S, -1.0, 1.0).sum().backward()
        assert S.grad.shape == shape and (S.grad == 0).all()


@parametrize_device
@parametrize_dtype
def test_no_grad(dtype, device):
    S = random_scores((5, 10, 9), seed=7400, dtype=dtype, device=device).requires_grad_()
    with torch.no_grad():
        quiet = run(S, -1.0, 1.0)
    assert not quiet.requires_grad and quiet.grad_fn is None
    plain = run(S.detach(), -1.0, 1.0)
    assert not plain.requires_grad
    tracked = run(S, -1.0, 1.0)
    assert tracked.requires_grad
    assert torch.equal(quiet, plain)
    # Keeping the DP table for the backward does not change the forward on the CPU, bit for bit: both take
    # the scaled sweep at t > 0 in float32. On CUDA the forward that keeps it is the log-space sweep, and
    # float32 scores without it take a scaled one: the same within float32's rounding.
    if device.type == "cpu" or dtype == torch.float64:
        assert torch.equal(quiet, tracked.detach())
    else:
        torch.testing.assert_close(quiet, tracked.detach(), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# The module and the reference backend


SEED_SETTINGS = [None, (-0.5, 0.1), (-4.0, 0.0), (-2.0, 2.0)]


@pytest.mark.parametrize("settings", SEED_SETTINGS, ids=lambda s: "defaults" if s is None else str(s))
def test_module_matches_seed_module(settings):
    S = random_scores((16, 32, 32), seed=8000, dtype=torch.float32)
    if settings is None:
        module, seed = swcli.SoftSmithWaterman(), SoftSmithWatermanReference()
    else:
        module, seed = swcli.SoftSmithWaterman(*settings), SoftSmithWatermanReference(*settings)
    assert isinstance(module, torch.nn.Module)
    out, expected = module(S), seed(S)
    assert out.shape == (16,) and out.dtype == torch.float32
    assert (out - expected).abs().max().item() <= 1e-4


def test_module_passes_lengths_and_backend():
    S = random_scores((4, 6, 7), seed=8100)
    qlen, tlen = torch.tensor([6, 3, 0, 5]), torch.tensor([7, 7, 2, 1])
    module = swcli.SoftSmithWaterman(gap_open=-0.5, temperature=0.3, backend="reference")
    assert "gap_open=-0.5" in repr(module) and "reference" in repr(module)
    expected = soft_smith_waterman_reference(S, -0.5, 0.3, qlen, tlen)
    assert torch.equal(module(S, qlen, tlen), expected)
    compiled = swcli.SoftSmithWaterman(gap_open=-0.5, temperature=0.3)
    torch.testing.assert_close(compiled(S, qlen, tlen), expected, rtol=0, atol=1e-9)


def test_package_exports_are_the_ops_kept_after_the_first_lookup():
    # swcli imports swcli.ops lazily (so that `swcli --help` needs no torch); the first lookup keeps the
    # result in the package, so that a loop calling swcli.soft_smith_waterman pays no import each call.
    from swcli import ops

    assert swcli.soft_smith_waterman is ops.soft_smith_waterman
    assert swcli.SoftSmithWaterman is ops.SoftSmithWaterman
    assert vars(swcli)["soft_smith_waterman"] is ops.soft_smith_waterman
    assert vars(swcli)["SoftSmithWaterman"] is ops.SoftSmithWaterman
    with pytest.raises(AttributeError, match="has no attribute 'soft_smith'"):
        swcli.soft_smith


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
@pytest.mark.parametrize("t", [0.0, 0.7])
def test_reference_backend_is_the_reference(t, dtype):
    S = random_scores((5, 6, 7), seed=8200, dtype=dtype)
    qlen, tlen = torch.tensor([6, 1, 0, 4, 6]), torch.tensor([7, 7, 3, 2, 5])
    out = ssw(S, -0.5, t, qlen, tlen, backend="reference")
    assert torch.equal(out, soft_smith_waterman_reference(S, -0.5, t, qlen, tlen))
    assert torch.equal(ssw(S, -0.5, t, backend="reference"), soft_smith_waterman_reference(S, -0.5, t))


def test_reference_backend_half_and_gradient():
    S = random_scores((3, 5, 4), seed=8300, dtype=torch.float16)
    out = ssw(S, -1.0, 1.0, backend="reference")
    assert out.dtype == torch.float16
    assert torch.equal(out, soft_smith_waterman_reference(S.float(), -1.0, 1.0).half())
    S64 = random_scores((2, 4, 5), seed=8301).requires_grad_()
    ssw(S64, -1.0, 1.0, backend="reference").sum().backward()
    assert (S64.grad > 0).any()


def test_auto_backend_on_cpu_is_the_cpu_engine():
    S = random_scores((6, 10, 12), seed=8400)
    assert torch.equal(ssw(S, -1.0, 0.5), ssw(S, -1.0, 0.5, backend="cpu"))
    assert torch.equal(ssw(S), ssw(S, -1.0, 1.0, backend="cpu"))  # the defaults are gap -1, t 1


# --------------------------------------------------------------------------------------------------
# Error paths: ValueError naming the problem


S_OK = torch.zeros(3, 5, 6)


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -0.5}, r"temperature must be >= 0"),
    ({"temperature": -1e-300}, r"temperature must be >= 0"),
    ({"temperature": float("nan")}, r"temperature must be a finite number"),
    ({"temperature": float("inf")}, r"temperature must be a finite number"),
    ({"temperature": "1.0"}, r"temperature must be a finite number"),
    ({"temperature": None}, r"temperature must be a finite number"),
    ({"gap": float("nan")}, r"gap must be a finite number"),
    ({"gap": float("-inf")}, r"gap must be a finite number"),
    ({"gap": True}, r"gap must be a finite number"),
    ({"backend": "gpu"}, r"unknown backend 'gpu'"),
    ({"backend": "CPU"}, r"unknown backend 'CPU'"),
    ({"backend": "cuda"}, r"backend='cuda' needs the score matrix on a CUDA device"),
    ({"query_lengths": torch.tensor([1, 2])}, r"query_lengths must have shape \(3,\)"),
    ({"query_lengths": torch.tensor([[1], [2], [3]])}, r"query_lengths must have shape \(3,\)"),
    ({"query_lengths": torch.tensor(3)}, r"query_lengths must have shape \(3,\)"),
    ({"target_lengths": torch.tensor([1, 2, 3, 4])}, r"target_lengths must have shape \(3,\)"),
    ({"query_lengths": torch.tensor([1, 6, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ({"target_lengths": torch.tensor([1, 7, 2])}, r"target_lengths must lie in \[0, 6\]"),
    ({"query_lengths": torch.tensor([1, -1, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ({"target_lengths": torch.tensor([-3, 1, 2])}, r"target_lengths must lie in \[0, 6\]"),
    ({"query_lengths": torch.tensor([1.0, 2.0, 3.0])}, r"query_lengths must hold integers"),
    ({"target_lengths": [1.5, 2.0, 3.0]}, r"target_lengths must hold integers"),
    ({"query_lengths": torch.tensor([True, False, True])}, r"query_lengths must hold integers"),
], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ssw(S_OK, **kwargs)


@pytest.mark.parametrize("S,message", [
    (torch.zeros(5, 6), r"must be 3-D \(B, M, N\), got shape \(5, 6\)"),
    (torch.zeros(2, 3, 5, 6), r"must be 3-D"),
    (torch.tensor(1.0), r"must be 3-D"),
    (np.zeros((3, 5, 6)), r"must be a torch.Tensor, got ndarray"),
    ([[[1.0]]], r"must be a torch.Tensor, got list"),
    (torch.zeros(3, 5, 6, dtype=torch.int64), r"must be floating point, got dtype torch.int64"),
    (torch.zeros(3, 5, 6, dtype=torch.uint8), r"must be floating point"),
    (torch.zeros(3, 5, 6, dtype=torch.bool), r"must be floating point"),
    (torch.zeros(3, 5, 6, dtype=torch.complex64), r"must be floating point"),
], ids=["2d", "4d", "0d", "numpy", "list", "int64", "uint8", "bool", "complex"])
def test_bad_score_matrix_raises(S, message):
    with pytest.raises(ValueError, match=message):
        ssw(S)


def test_module_checks_too():
    with pytest.raises(ValueError, match=r"temperature must be >= 0"):
        swcli.SoftSmithWaterman(temperature=-1.0)(S_OK)
    with pytest.raises(ValueError, match=r"unknown backend"):
        swcli.SoftSmithWaterman(backend="tpu")(S_OK)


def test_good_numbers_of_other_types_are_accepted():
    S = random_scores((2, 4, 5), seed=8500)
    expected = ssw(S, -1.0, 0.0)
    assert torch.equal(ssw(S, -1, 0), expected)  # ints
    assert torch.equal(ssw(S, np.float64(-1.0), np.float32(0.0)), expected)  # numpy scalars
    ok = ssw(torch.zeros(0, 3, 4), query_lengths=torch.zeros(0, dtype=torch.int64),
             target_lengths=torch.zeros(0, dtype=torch.int64))
    assert ok.shape == (0,)


# --------------------------------------------------------------------------------------------------
# The codes path (soft_smith_waterman_codes): scores looked up from uint8 codes and a K x K matrix


@pytest.mark.parametrize("t", TEMPERATURES)
def test_codes_equal_the_dense_float32_path(t):
    pairs = related_protein_pairs(seed=10_000, count=45, min_length=1, max_length=150)
    pairs += random_protein_pairs(seed=10_001, count=5, min_length=1, max_length=40)
    query, target, qlen, tlen, matrix = code_batch(pairs, pad_code=23)
    S, _, _ = score_matrices(pairs, dtype=torch.float32)
    out = soft_smith_waterman_codes(query, target, matrix, -1.0, t, qlen, tlen, backend="cpu")
    assert out.dtype == torch.float32 and out.shape == (len(pairs),)
    # In log space the same float32 products of score and scale, so the same bits as the dense engine.
    # The scaled sweep (t > 0) takes 2^(S c) from a table rounded once for codes, from a polynomial for
    # dense scores: within float32 rounding.
    engine = _build.cpu_engine()
    log_codes = engine.forward_codes(query, target, qlen, tlen, matrix, -1.0, t, False, None)
    log_dense, _ = engine.forward(S, qlen, tlen, -1.0, t, False, False, None)
    assert torch.equal(log_codes, log_dense)
    if t == 0:
        assert torch.equal(out, log_codes) and torch.equal(out, ssw(S, -1.0, t, qlen, tlen, backend="cpu"))
    else:
        torch.testing.assert_close(out, log_codes, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(ssw(S, -1.0, t, qlen, tlen, backend="cpu"), log_dense, rtol=1e-6, atol=1e-5)


class TestCpuScaledSweep:
    """float32 on the CPU without the DP table at t > 0: the scaled sweep (E = 2^(H c), scaled per block
    of 4 columns of a lane), and the log-space sweep for the pairs it cannot hold."""

    @staticmethod
    def dense(S, qlen, tlen, gap, t, scaled=True):
        counter = torch.zeros(1, dtype=torch.int64)
        scores, _ = _build.cpu_engine().forward(S, qlen, tlen, gap, t, False, scaled, counter)
        return scores, counter.item()

    @staticmethod
    def codes(query, target, qlen, tlen, matrix, gap, t, scaled=True):
        counter = torch.zeros(1, dtype=torch.int64)
        scores = _build.cpu_engine().forward_codes(query, target, qlen, tlen, matrix, gap, t, scaled, counter)
        return scores, counter.item()

    @pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
    def test_real_proteins_closer_to_float64_than_log_space(self, t):
        pairs = related_protein_pairs(seed=10_500, count=40, min_length=50, max_length=700)
        pairs += random_protein_pairs(seed=10_501, count=40, min_length=1, max_length=400)
        S, qlen, tlen = score_matrices(pairs)
        exact, _ = self.dense(S, qlen, tlen, -4.0, t)  # float64: the log-space sweep
        scaled, to_log = self.dense(S.float(), qlen, tlen, -4.0, t)
        log, _ = self.dense(S.float(), qlen, tlen, -4.0, t, scaled=False)
        assert to_log == 0
        scaled_error = (scaled.double() - exact).abs().max().item()
        log_error = (log.double() - exact).abs().max().item()
        assert scaled_error <= max(log_error, 1e-4), (scaled_error, log_error)
        query, target, ql, tl, matrix = code_batch(pairs)
        from_codes, to_log = self.codes(query, target, ql, tl, matrix, -4.0, t)
        assert to_log == 0
        assert (from_codes.double() - exact).abs().max().item() <= max(log_error, 1e-4)

    def test_short_and_long_targets_side_by_side(self):
        # One worker's 32 lanes sweep the same columns: lanes whose target ended copy their left value
        # along, through blocks wholly past their target, beside lanes with 480 columns to go.
        B, M, N = 64, 40, 480
        S = random_scores((B, M, N), seed=10_510, dtype=torch.float32, scale=2.0)
        qlen = random_lengths(B, M, seed=10_511, low=1)
        tlen = torch.tensor([1, 2, 3, 5, 8, 9, 17, 480] * 8)
        scaled, to_log = self.dense(S, qlen, tlen, -1.0, 1.0)
        assert to_log == 0
        assert_close_to_reference(scaled, S, -1.0, 1.0, qlen, tlen)

    def test_a_pair_it_cannot_hold_is_scored_in_log_space(self):
        # A +150 score spreads a block's values past 2^175: that pair, and only it, goes to log space,
        # whose bits it then has.
        B, M, N = 40, 30, 60
        S = random_scores((B, M, N), seed=10_520, dtype=torch.float32)
        S[7, 12, 20] = 150.0
        full_q, full_t = torch.full((B,), M), torch.full((B,), N)
        scaled, to_log = self.dense(S, full_q, full_t, -1.0, 1.0)
        log, _ = self.dense(S, full_q, full_t, -1.0, 1.0, scaled=False)
        assert to_log == 1
        assert scaled[7].item() == log[7].item()
        torch.testing.assert_close(scaled, log, rtol=1e-6, atol=1e-5)
        assert_close_to_reference(scaled, S, -1.0, 1.0, full_q, full_t)
        # the same bits again, whichever lanes and workers took the pairs
        assert torch.equal(self.dense(S, full_q, full_t, -1.0, 1.0)[0], scaled)

    def test_nan_and_infinite_scores(self):
        B, M, N = 40, 12, 20
        S = random_scores((B, M, N), seed=10_530, dtype=torch.float32)
        full_q, full_t = torch.full((B,), M), torch.full((B,), N)
        clean, _ = self.dense(S, full_q, full_t, -1.0, 1.0)
        S[3, 4, 5] = float("nan")  # fails the check: log space, where it reaches that pair's score only
        S[9, 2, 2] = float("inf")  # overflows: log space, score +inf
        S[20, 3:7, 4:9] = -float("inf")  # contributes nothing: stays scaled
        out, to_log = self.dense(S, full_q, full_t, -1.0, 1.0)
        assert to_log == 2 and math.isnan(out[3].item()) and out[9].item() == math.inf
        torch.testing.assert_close(out[20], self.dense(S, full_q, full_t, -1.0, 1.0, scaled=False)[0][20],
                                   rtol=1e-6, atol=1e-5)
        keep = (torch.arange(B) != 3) & (torch.arange(B) != 9) & (torch.arange(B) != 20)
        assert torch.equal(out[keep], clean[keep])

    # Settings drawn at random (seed, B, M, N, t, gap, scale of S) on which the scaled sweep once returned
    # wrong scores without noticing: large scores at small temperatures spread a block's values furthest,
    # and a term that a change of scale (or the zero term 2^-sigma, once sigma > 126) flushed to 0 could
    # be, times a large P, the largest of its cell; so could a change of scale past 2^-126 in one factor.
    # Off by 1e-2 to 0.16 relative, now within 2e-6.
    FLUSHED = [(1, 33, 61, 98, 0.7, 0.0, 20.0), (39, 17, 55, 55, 1.0, 0.0, 20.0), (63, 100, 10, 6, 0.05, -1.0, 5.0),
               (187, 64, 44, 125, 0.2, 0.0, 5.0), (239, 100, 65, 20, 0.7, -4.0, 20.0),
               (294, 64, 23, 9, 0.7, -0.1, 20.0), (280, 33, 33, 76, 1.0, -1.0, 20.0)]

    @pytest.mark.parametrize("seed, B, M, N, t, gap, scale", FLUSHED, ids=[f"seed{f[0]}" for f in FLUSHED])
    def test_terms_flushed_to_zero_fail_the_check(self, seed, B, M, N, t, gap, scale):
        S = random_scores((B, M, N), seed=seed, dtype=torch.float32, scale=scale)
        qlen, tlen = random_lengths(B, M, seed=seed + 1), random_lengths(B, N, seed=seed + 2)
        exact, _ = self.dense(S.double(), qlen, tlen, gap, t)
        scaled, _ = self.dense(S, qlen, tlen, gap, t)
        relative = ((scaled.double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
        assert relative <= 2e-6

    def test_calls_it_does_not_take(self):
        pairs = related_protein_pairs(seed=10_540, count=20, min_length=20, max_length=200)
        query, target, qlen, tlen, matrix = code_batch(pairs)
        S, _, _ = score_matrices(pairs, dtype=torch.float32)
        # a power 2^(m c) past 2^60 (t = 0.1: 2^(11 x 14.4)): the whole call in log space
        small_t, to_log = self.codes(query, target, qlen, tlen, matrix, -4.0, 0.1)
        assert to_log == 0
        assert torch.equal(small_t, self.codes(query, target, qlen, tlen, matrix, -4.0, 0.1, scaled=False)[0])
        # a positive gap, where each step can grow E
        for scores, log in [(self.codes(query, target, qlen, tlen, matrix, 0.5, 1.0),
                             self.codes(query, target, qlen, tlen, matrix, 0.5, 1.0, scaled=False)),
                            (self.dense(S, qlen, tlen, 0.5, 1.0), self.dense(S, qlen, tlen, 0.5, 1.0, scaled=False))]:
            assert scores[1] == 0 and torch.equal(scores[0], log[0])


@pytest.mark.parametrize("gap", [-1.0, -4.0])
def test_codes_temperature_zero_equals_biopython(gap):
    pairs = random_protein_pairs(seed=10_100, count=20, min_length=1, max_length=120)
    pairs += related_protein_pairs(seed=10_101, count=20, min_length=30, max_length=250)
    pairs += related_protein_pairs(seed=10_102, count=1, min_length=1200, max_length=1200)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    out = soft_smith_waterman_codes(query, target, matrix, gap, 0.0, qlen, tlen).tolist()
    assert out == [biopython_score(q, s, gap) for q, s in pairs]


@pytest.mark.parametrize("t", [0.1, 1.0])
def test_codes_match_reference(t):
    pairs = related_protein_pairs(seed=10_200, count=6, min_length=5, max_length=30)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    out = soft_smith_waterman_codes(query, target, matrix, -0.5, t, qlen, tlen)
    S, _, _ = score_matrices(pairs, dtype=torch.float32)
    assert_close_to_reference(out, S, -0.5, t, qlen, tlen)
    ref = soft_smith_waterman_codes(query, target, matrix, -0.5, t, qlen, tlen, backend="reference")
    assert ref.dtype == torch.float64  # the reference runs in the matrix's dtype
    assert torch.equal(ref, reference(S.double(), -0.5, t, qlen, tlen))


def test_codes_padding_and_layout_do_not_matter():
    pairs = related_protein_pairs(seed=10_300, count=40, min_length=0, max_length=60)
    query, target, qlen, tlen, matrix = code_batch(pairs, pad_code=0)
    expected = soft_smith_waterman_codes(query, target, matrix, -1.0, 1.0, qlen, tlen)
    empty_pairs = (qlen == 0) | (tlen == 0)
    assert empty_pairs.any() and (expected[empty_pairs] == 0).all()
    # other padding codes
    junk_q, junk_t, _, _, _ = code_batch(pairs, pad_code=22)
    assert torch.equal(soft_smith_waterman_codes(junk_q, junk_t, matrix, -1.0, 1.0, qlen, tlen), expected)
    # non-contiguous codes: columns of a wider tensor
    wide_q = torch.zeros(query.shape[0], 2 * query.shape[1], dtype=torch.uint8)
    wide_q[:, ::2] = query
    wide_t = torch.zeros(target.shape[1], target.shape[0], dtype=torch.uint8).T
    wide_t.copy_(target)
    assert not wide_q[:, ::2].is_contiguous() and not wide_t.is_contiguous()
    out = soft_smith_waterman_codes(wide_q[:, ::2], wide_t, matrix, -1.0, 1.0, qlen, tlen)
    assert torch.equal(out, expected)
    # a float32 matrix gives the same scores as the float64 one
    assert torch.equal(soft_smith_waterman_codes(query, target, matrix.float(), -1.0, 1.0, qlen, tlen),
                       expected)
    # and an empty batch
    empty = torch.zeros(0, 5, dtype=torch.uint8)
    assert soft_smith_waterman_codes(empty, empty, matrix).shape == (0,)


def _codes_ok():
    query = torch.zeros(3, 5, dtype=torch.uint8)
    target = torch.zeros(3, 6, dtype=torch.uint8)
    return query, target, torch.zeros(24, 24)


@pytest.mark.parametrize("change,message", [
    ({"query_codes": torch.zeros(3, 5, dtype=torch.int64)}, r"query_codes must be a 2-D uint8 tensor"),
    ({"target_codes": torch.zeros(3, 6, 1, dtype=torch.uint8)}, r"target_codes must be a 2-D uint8"),
    ({"target_codes": torch.zeros(4, 6, dtype=torch.uint8)}, r"hold 3 and 4 pairs"),
    ({"matrix": torch.zeros(24, 23)}, r"matrix must be a square floating-point tensor"),
    ({"matrix": torch.zeros(24, 24, dtype=torch.int64)}, r"matrix must be a square floating-point"),
    ({"matrix": torch.zeros(257, 257)}, r"at most 256 x 256"),
    ({"matrix": torch.zeros(0, 0)}, r"matrix must be a square floating-point tensor"),
    ({"query_codes": torch.full((3, 5), 24, dtype=torch.uint8)},
     r"query_codes holds code 24, outside the 24 x 24 matrix"),
    ({"target_codes": torch.full((3, 6), 30, dtype=torch.uint8)},
     r"target_codes holds code 30, outside the 24 x 24 matrix"),
    ({"temperature": -1.0}, r"temperature must be >= 0"),
    ({"gap": float("nan")}, r"gap must be a finite number"),
    ({"query_lengths": torch.tensor([1, 6, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ({"target_lengths": torch.tensor([1.0, 2.0, 3.0])}, r"target_lengths must hold integers"),
    ({"backend": "nope"}, r"unknown backend 'nope'"),
    ({"backend": "cuda"}, r"backend='cuda' needs the score matrix on a CUDA device"),
], ids=lambda x: next(iter(x)) if isinstance(x, dict) else None)
def test_codes_bad_arguments_raise(change, message):
    query, target, matrix = _codes_ok()
    kwargs = {"query_codes": query, "target_codes": target, "matrix": matrix, **change}
    with pytest.raises(ValueError, match=message):
        soft_smith_waterman_codes(**kwargs)


# --------------------------------------------------------------------------------------------------
# The GPU suite: backend='cuda' on CUDA tensors (skipped without a CUDA device)


@cuda
@requires_cuda
class TestCudaBackend:
    device = torch.device("cuda")

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", TEMPERATURES)
    def test_matches_reference(self, t, dtype):
        B, M, N = 37, 14, 11
        S = random_scores((B, M, N), seed=9000, dtype=dtype, device=self.device)
        qlen = random_lengths(B, M, seed=9001)
        tlen = random_lengths(B, N, seed=9002)
        out = ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        assert_close_to_reference(out, S, -1.0, t, qlen, tlen)

    def test_auto_uses_cuda(self):
        S = random_scores((4, 9, 8), seed=9100, device=self.device)
        out = ssw(S, -1.0, 1.0)
        assert out.device.type == "cuda"
        assert torch.equal(out, ssw(S, -1.0, 1.0, backend="cuda"))

    @pytest.mark.parametrize("kwargs,message", [
        ({"temperature": -0.5}, r"temperature must be >= 0"),
        ({"temperature": float("nan")}, r"temperature must be a finite number"),
        ({"temperature": float("inf")}, r"temperature must be a finite number"),
        ({"gap": float("nan")}, r"gap must be a finite number"),
        ({"gap": float("inf")}, r"gap must be a finite number"),
        ({"backend": "gpu"}, r"unknown backend 'gpu'"),
        ({"query_lengths": torch.tensor([1, 9, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
    def test_cuda_tensors_raise_the_errors_of_cpu_tensors(self, kwargs, message):
        S = torch.zeros(3, 5, 6, device=self.device)
        with pytest.raises(ValueError, match=message):
            ssw(S, **kwargs)
        with pytest.raises(ValueError, match=r"must be 3-D"):
            ssw(torch.zeros(5, 6, device=self.device))

    def test_every_entry_gives_the_same_scores(self):
        S = random_scores((9, 17, 40), seed=9150, dtype=torch.float32, device=self.device)
        general = ssw(S, -1.5, 0.7, backend="cuda")
        assert torch.equal(ssw(S, -1.5, 0.7), general)
        assert torch.equal(ssw(S, np.float64(-1.5), 0.7), general)  # any real number as the gap
        assert torch.equal(swcli.SoftSmithWaterman(-1.5, 0.7)(S), general)
        R = S.clone().requires_grad_()
        out = ssw(R, -1.5, 0.7)  # with a gradient: the forward that keeps H, in log space (see test_no_grad)
        assert out.grad_fn is not None
        torch.testing.assert_close(out.detach(), general, rtol=1e-5, atol=1e-5)

    def test_cpu_backend_refuses_cuda_tensors(self):
        with pytest.raises(ValueError, match=r"backend='cpu' needs the score matrix on the CPU"):
            ssw(torch.zeros(2, 3, 4, device=self.device), backend="cpu")

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    def test_temperature_zero_equals_biopython_long(self, dtype):
        pairs = related_protein_pairs(seed=9200, count=2, min_length=1500, max_length=1500)
        pairs += related_protein_pairs(seed=9201, count=1, min_length=10_200, max_length=10_200,
                                       mutation_rate=0.1)
        S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=self.device)
        out = ssw(S, -4.0, 0.0, qlen.cuda(), tlen.cuda(), backend="cuda").cpu().tolist()
        assert out == [biopython_score(q, t, -4.0) for q, t in pairs]

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_padding_and_nan(self, t):
        B, M, N = 45, 19, 23
        S = random_scores((B, M, N), seed=9300, device=self.device)
        qlen = random_lengths(B, M, seed=9301)
        tlen = random_lengths(B, N, seed=9302)
        padded = S.clone()
        padded[window_mask(B, M, N, qlen, tlen).cuda()] = float("nan")
        out = ssw(padded, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        assert torch.equal(out, ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda"))
        cpu = ssw(S.cpu(), -1.0, t, qlen, tlen, backend="cpu")
        torch.testing.assert_close(out.cpu(), cpu, rtol=0, atol=1e-9)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_matches_reference(self, t):
        B, M, N = 6, 9, 8
        S = random_scores((B, M, N), seed=9400, device=self.device).requires_grad_()
        qlen = random_lengths(B, M, seed=9401)
        tlen = random_lengths(B, N, seed=9402)
        ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda").sum().backward()
        _, expected = reference_gradient(S, -1.0, t, qlen, tlen, torch.ones(B))
        torch.testing.assert_close(S.grad.cpu(), expected, rtol=0, atol=1e-9)

    # -- no length cap: one warp per pair walks any number of column tiles and rows

    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("shape", [(1, 20_000), (20_000, 1), (3, 9_000)], ids=["1x20000", "20000x1", "3x9000"])
    def test_thin_long_pairs(self, shape, t):
        S = random_scores((2, *shape), seed=9500, dtype=torch.float32, device=self.device)
        assert_close_to_reference(ssw(S, -1.0, t, backend="cuda"), S, -1.0, t)

    def test_5000_by_5000(self):
        pairs = related_protein_pairs(seed=9510, count=1, min_length=5000, max_length=5000, mutation_rate=0.2)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]
        hard = ssw(S, -4.0, 0.0, backend="cuda")
        assert hard.item() == biopython_score(*pairs[0], -4.0)
        soft = ssw(S, -4.0, 1.0, backend="cuda").item()
        exact = ssw(S.double().cpu(), -4.0, 1.0, backend="cpu").item()
        single = ssw(S.cpu(), -4.0, 1.0, backend="cpu").item()
        # The score is about 2e4, built over 1e4 steps: float32 drifts by ~1e-5 relative (the reference
        # loop is too slow to run here, so the float32 CPU engine stands in for its own error).
        bound = max(2 * abs(single - exact), 1e-5 * abs(exact))
        assert abs(soft - exact) <= bound, (soft, exact, single)
        assert soft >= hard.item()

    def test_35000_by_35000(self):
        pairs = related_protein_pairs(seed=9520, count=1, min_length=35_000, max_length=35_000,
                                      mutation_rate=0.1)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        expected = biopython_score(*pairs[0], -4.0)
        codes = soft_smith_waterman_codes(query, target, table, -4.0, 0.0, backend="cuda")
        assert codes.item() == expected
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]  # 4.9 GB
        assert ssw(S, -4.0, 0.0, backend="cuda").item() == expected

    # -- same numbers as the CPU engine, on every path of the kernel (1 or 4 columns per lane; 8 for codes)

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("B", [5, 1100], ids=["1-column-lanes", "4-column-lanes"])
    def test_equals_cpu_engine(self, B, t, dtype):
        M, N = 37, 300  # several column tiles either way
        S = random_scores((B, M, N), seed=9600 + B, dtype=dtype)
        qlen, tlen = random_lengths(B, M, seed=9601), random_lengths(B, N, seed=9602)
        cpu = ssw(S, -1.0, t, qlen, tlen, backend="cpu")
        gpu = ssw(S.cuda(), -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        atol = 1e-9 if dtype == torch.float64 else 1e-4
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=atol)
        if t == 0 and dtype == torch.float64:
            assert torch.equal(gpu.cpu(), cpu)
        # full pairs too (no lengths), with N not a multiple of 4 (unaligned rows)
        S = random_scores((B, 9, 131), seed=9603, dtype=dtype)
        torch.testing.assert_close(ssw(S.cuda(), -1.0, t, backend="cuda").cpu(), ssw(S, -1.0, t, backend="cpu"),
                                   rtol=0, atol=atol)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_4_column_lanes_with_long_queries(self, t):
        # 4 columns per lane (B >= 8 per SM), queries of a few hundred rows over several column tiles.
        B, M, N = 1100, 260, 300
        S = random_scores((B, M, N), seed=9650, dtype=torch.float32)
        qlen, tlen = random_lengths(B, M, seed=9651, low=150), random_lengths(B, N, seed=9652, low=100)
        exact = ssw(S.double(), -1.0, t, qlen, tlen, backend="cpu")
        gpu = ssw(S.cuda(), -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda").cpu().double()
        bound = 1e-4 + 1e-5 * exact.abs()  # float32 over paths of a few hundred steps
        assert ((gpu - exact).abs() <= bound).all(), (gpu - exact).abs().max().item()
        codes = torch.randint(0, 20, (B, M), generator=torch.Generator().manual_seed(9653), dtype=torch.uint8)
        targets = torch.randint(0, 20, (B, N), generator=torch.Generator().manual_seed(9654), dtype=torch.uint8)
        table = torch.randn(20, 20, generator=torch.Generator().manual_seed(9655))
        dense = table[codes.long()[:, :, None], targets.long()[:, None, :]]
        from_codes = soft_smith_waterman_codes(codes.cuda(), targets.cuda(), table.cuda(), -1.0, t, qlen.cuda(),
                                               tlen.cuda(), backend="cuda")
        from_dense = ssw(dense.cuda(), -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        if t == 0:
            assert torch.equal(from_codes, from_dense)
        else:  # the scaled sweep: its own rounding, within the same bound
            exact = ssw(dense.double(), -1.0, t, qlen, tlen, backend="cpu")
            error = (from_codes.cpu().double() - exact).abs()
            assert (error <= 1e-4 + 1e-5 * exact.abs()).all(), error.max().item()

    @pytest.mark.parametrize("keep", [False, True], ids=["scores", "with-table"])
    def test_one_column_lanes_rescore_what_the_fast_cell_cannot_hold(self, keep):
        # Few pairs take 1-column lanes, whose float cell is taken relative to its delete term
        # (cell_from_up in kernels/sw_cuda.cu): a term past 2^128 makes the pair's best cell inf or NaN,
        # and the pair is scored again with the plain cell. Here a gap that overflows every pair's first
        # cell, and one pair with a spike of +150 among ordinary ones.
        S = random_scores((6, 40, 70), seed=9670, dtype=torch.float32)
        S[2, 10, 20] = 150.0
        for gap in (-1.0, -200.0):
            S64 = S.double().requires_grad_(keep)
            exact = ssw(S64, gap, 1.0, backend="cpu")
            x = S.cuda().requires_grad_(keep)  # a gradient to come: the forward keeps the DP table
            out = ssw(x, gap, 1.0)
            assert torch.isfinite(out).all()
            error = (out.detach().cpu().double() - exact.detach()).abs()
            assert (error <= 1e-4 + 1e-5 * exact.detach().abs()).all(), (gap, error.max().item())
            if keep:  # the table the backward reads is the one of the pass that gave the scores
                out.sum().backward()
                exact.sum().backward()
                assert (x.grad.cpu().double() - S64.grad).abs().max() <= 1e-4

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_long_pairs_share_a_block(self, t):
        # 1100 pairs (4 columns per lane) of which the 30 longest, up to 1500 x 1500 (12 tiles), each get
        # a block of warps that relay the pair's tiles (kernels/sw_cuda.cu, Relay). Each must score as
        # the same pair alone does (one warp), and as Biopython at t = 0.
        pairs = random_protein_pairs(seed=9660, count=1070, min_length=20, max_length=300)
        pairs += related_protein_pairs(seed=9661, count=30, min_length=600, max_length=1500)
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(9662)).tolist()
        pairs = [pairs[k] for k in order]
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        batch = soft_smith_waterman_codes(query, target, table, -4.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        long = [b for b, (q, _) in enumerate(pairs) if len(q) >= 600][:12]
        assert len(long) == 12
        for b in long + [0, 1]:
            q, n = int(qlen[b]), int(tlen[b])
            alone = soft_smith_waterman_codes(query[b:b + 1, :q], target[b:b + 1, :n], table, -4.0, t,
                                              backend="cuda").item()
            if t == 0:
                assert batch[b].item() == alone == biopython_score(*pairs[b], -4.0)
            else:  # the batch takes the scaled sweep, a pair alone (one column per lane) the log-space one
                assert abs(batch[b].item() - alone) <= 1e-4 + 1e-5 * abs(alone), (b, batch[b].item(), alone)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("B", [5, 1100], ids=["1-column-lanes", "4-column-lanes"])
    def test_codes_equal_dense_bit_for_bit(self, B, t):
        # The log-space sweep computes the same floats from codes as from dense scores. (At t > 0 with 4
        # columns per lane both take the scaled sweep: see the tests below.)
        pairs = random_protein_pairs(seed=9700 + B, count=B, min_length=1, max_length=200)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]
        dense, _ = self.dense_engine(S, qlen.cuda(), tlen.cuda(), -4.0, t, scaled=False, lane_columns=0)
        codes, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, t, scaled=False,
                                     lane_columns=0)
        assert torch.equal(dense, codes)
        if t == 0 or B == 5:  # what the public entries take here is that same sweep
            public = soft_smith_waterman_codes(query, target, table, -4.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
            assert torch.equal(public, codes)
            assert torch.equal(ssw(S, -4.0, t, qlen.cuda(), tlen.cuda(), backend="cuda"), codes)
        if t == 0:
            assert codes[:20].tolist() == [biopython_score(q, tt, -4.0) for q, tt in pairs[:20]]

    def test_engine_lane_columns(self):
        # 1, 4 and 8 columns per lane (8: scores from codes only) give Biopython's scores at t = 0.
        pairs = random_protein_pairs(seed=9710, count=3, min_length=1, max_length=40)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        for lanes in (1, 4, 8):
            codes, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, 0.0, lane_columns=lanes)
            assert codes.cpu().tolist() == [biopython_score(q, t, -4.0) for q, t in pairs]

    @staticmethod
    def transposed_by_kernel(q, n, R):
        """kernels/sw_cuda.cu, transposes: whether the codes kernels of R columns per lane score a q x n pair
        transposed."""
        def steps(rows, cols):
            return -(-cols // (32 * R)) * (rows - 1) + -(-cols // R)
        return R >= 4 and n <= q and steps(n, q) < steps(q, n)

    def check_codes_against_float64(self, query, target, lengths, matrix, t, lane_columns, full=False):
        """The codes engine (R columns per lane, gap -1) against the float64 CPU engine pair by pair, and
        at t = 0 against the float32 one, bit for bit."""
        qlen, tlen = torch.tensor([q for q, _ in lengths]), torch.tensor([n for _, n in lengths])
        out, _ = self.codes_engine(query.cuda(), target.cuda(), None if full else qlen.cuda(),
                                   None if full else tlen.cuda(), matrix.float().cuda(), -1.0, t,
                                   lane_columns=lane_columns)
        dense = [matrix[query[b, :q].long()][:, target[b, :n].long()][None] for b, (q, n) in enumerate(lengths)]
        exact = torch.cat([ssw(S, -1.0, t, backend="cpu") for S in dense])
        error = (out.cpu().double() - exact).abs()
        assert (error <= 1e-4 + 1e-5 * exact.abs()).all(), (error.max().item(), lengths[int(error.argmax())])
        if t == 0:
            assert torch.equal(out.cpu(), torch.cat([ssw(S.float(), -1.0, 0.0, backend="cpu") for S in dense]))

    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("lane_columns", [4, 8])
    def test_codes_pairs_scored_transposed(self, lane_columns, t):
        # With 4 or 8 columns per lane the codes kernels score a pair transposed where that takes fewer
        # steps and its target is not longer than its query (kernels/sw_cuda.cu, transposes): rows from
        # the target, the matrix read as [column code][row code]. A random asymmetric matrix shows a lookup
        # not transposed with its pair. Lengths: pairs transposed (512 x 300, 1000 x 60), long ones that
        # blocks of warps relay, transposed or not (1024 x 700, 700 x 1024), edges, and random ones.
        g = torch.Generator().manual_seed(9720 + lane_columns)
        K = 21
        matrix = torch.randn(K, K, generator=g, dtype=torch.float64) * 2
        assert not torch.equal(matrix, matrix.T)
        lengths = [(512, 300), (1000, 60), (1024, 700), (700, 1024), (300, 512), (257, 256), (1, 1), (40, 1),
                   (1, 40), (0, 5), (5, 0)]
        lengths += [tuple(torch.randint(1, 600, (2,), generator=g).tolist()) for _ in range(50)]
        flips = [self.transposed_by_kernel(q, n, lane_columns) for q, n in lengths]
        assert flips[:4] == [True, True, True, False] and 10 < sum(flips) < len(lengths) - 10
        B, M, N = len(lengths), max(q for q, _ in lengths), max(n for _, n in lengths)
        query = torch.randint(0, K, (B, M), generator=g, dtype=torch.uint8)
        target = torch.randint(0, K, (B, N), generator=g, dtype=torch.uint8)
        self.check_codes_against_float64(query, target, lengths, matrix, t, lane_columns)
        # Full pairs (no lengths) of 600 x 60, each transposed: 600 columns, more than a tile although N
        # is not, so the binding must still give the kernel its tile boundary buffer.
        assert self.transposed_by_kernel(600, 60, lane_columns)
        query = torch.randint(0, K, (6, 600), generator=g, dtype=torch.uint8)
        target = torch.randint(0, K, (6, 60), generator=g, dtype=torch.uint8)
        self.check_codes_against_float64(query, target, [(600, 60)] * 6, matrix, t, lane_columns, full=True)

    ENGINE_ERRORS = {
        "dense lane_columns 8": ("e.forward(S, None, None, -4.0, 1.0, False, 8, True, None)",
                                 r"lane_columns must be 0 \(automatic\), 1 or 4, got 8"),
        "codes lane_columns 3": ("e.forward_codes(q, q, None, None, m, -4.0, 1.0, 3, True, None)",
                                 r"lane_columns must be 0 \(automatic\), 1, 4 or 8, got 3"),
        "int32 lengths": ("e.forward_codes(q, q, n.int(), None, m, -4.0, 1.0, 0, True, None)",
                          "lengths must be contiguous int64 tensors"),
        "lengths on the CPU": ("e.forward(S, n.cpu(), None, -4.0, 1.0, False, 0, True, None)",
                               "lengths must be contiguous int64 tensors"),
        "int64 counter": ("e.forward(S, None, None, -4.0, 1.0, False, 0, True, n[:1])",
                          r"log_pairs must be a \(1,\) int32 tensor"),
        "S on the CPU": ("e.forward(S.cpu(), None, None, -4.0, 1.0, False, 0, True, None)",
                         "the CUDA engine needs a 3-D CUDA tensor"),
        "rows of float64": ("e.forward_rows(S.double(), None, None, -4.0, 1.0)",
                            "the gradient by rows takes float32 CUDA scores"),
        "rows at t = 0": ("e.forward_rows(S, None, None, -4.0, 0.0)", "the gradient by rows takes"),
        "rows kept wrong": ("e.backward_rows(n.float(), S, S[0], n, n[:1].int(), None, None, -4.0, 1.0)",
                            "kept rows do not match the score matrix"),
    }

    @pytest.mark.parametrize("case", list(ENGINE_ERRORS))
    def test_engine_bad_arguments_raise(self, case):
        # Each in a process of its own: on the H200 machine a failed check whose message had several parts
        # crashed the process (SIGSEGV) instead of raising (kernels/sw_cuda.cpp, top).
        call, message = self.ENGINE_ERRORS[case]
        code = ("import re, torch\nfrom swcli._build import cuda_engine\ne = cuda_engine()\n"
                "S = torch.randn(3, 10, 12, device='cuda'); q = torch.zeros(3, 10, dtype=torch.uint8, device='cuda')\n"
                "m = torch.randn(24, 24, device='cuda'); n = torch.full((3,), 10, device='cuda')\n"
                f"try:\n    {call}\nexcept RuntimeError as error:\n"
                f"    print('raised' if re.search({message!r}, str(error)) else 'other: ' + str(error)[:200])\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and run.stdout.strip() == "raised", (run.returncode, run.stdout, run.stderr[-500:])

    # -- the gradient by rows (float32, t > 0, gap <= 0, N <= 256: kernels/sw_cuda.cu), which autograd takes
    #    where it is faster (ops._by_rows): every 8th row kept, the rows between computed again in the
    #    backward. The kernels' tests call the engine, so that narrow shapes go by rows too.

    ROWS_SHAPES = {
        "300x256 full": ((40, 300, 256), False),  # 38 bands, every lane full
        "37x200 lengths": ((60, 37, 200), True),  # columns past the target in a lane (masked)
        "1x4": ((9, 1, 4), False),
        "20x8 full": ((9, 20, 8), False),  # 31 lanes past N, on S = 0
        "70x132 lengths": ((30, 70, 132), True),
        "17x12": ((25, 17, 12), False),  # N not a multiple of 8: masked
        "90x254": ((30, 90, 254), False),  # N not a multiple of 4: through the staging row
        "45x250 lengths": ((50, 45, 250), True),
        "33x7": ((20, 33, 7), False),
        "1x1": ((5, 1, 1), False),
    }

    @staticmethod
    def rows_gradient(S, qlen, tlen, gap, t, grad_out):
        """(scores, grad_S) of the engine's forward and backward by rows, asserting that the scaled rows
        hold every pair (no table needed)."""
        engine = _build.cuda_engine()
        assert engine.rows_take(S, gap, t)
        scores, kept, best_row, failed = engine.forward_rows(S, qlen, tlen, gap, t)
        assert failed.item() == 0
        return scores, engine.backward_rows(grad_out, S, kept, best_row, failed, qlen, tlen, gap, t)

    @pytest.mark.parametrize("shape", list(ROWS_SHAPES))
    @pytest.mark.parametrize("gap, t", [(-1.0, 1.0), (0.0, 2.0), (-3.0, 0.5)])
    def test_rows_gradient_matches_float64(self, shape, gap, t):
        (B, M, N), with_lengths = self.ROWS_SHAPES[shape]
        S = random_scores((B, M, N), seed=9990 + M, dtype=torch.float32)
        qlen = random_lengths(B, M, seed=9991) if with_lengths else None
        tlen = random_lengths(B, N, seed=9992) if with_lengths else None
        cuda_lengths = [x.cuda() if x is not None else None for x in (qlen, tlen)]
        padded = S.clone()
        if with_lengths:  # NaN in the padding changes nothing
            padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
        grad_out = random_scores((B,), seed=9993).abs() + 0.5
        out, grad = self.rows_gradient(padded.cuda(), *cuda_lengths, gap, t, grad_out.cuda().float())
        exact_S = S.double().requires_grad_()
        exact = ssw(exact_S, gap, t, qlen, tlen, backend="cpu")
        (exact * grad_out).sum().backward()
        torch.testing.assert_close(out.cpu().double(), exact.detach(), rtol=1e-6, atol=1e-4)
        # measured: 1e-6 at most (the DP table's path: 2e-5)
        torch.testing.assert_close(grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-5)
        assert (grad >= 0).all()
        if with_lengths:
            assert (grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()

    def test_rows_gradient_goes_to_the_first_of_tied_best_cells(self):
        # as test_gradient_goes_to_the_first_of_tied_best_cells, in float32 by rows: two lone 5s give
        # bit-identical best cells in rows 0 and 2; the first in row-major order takes the gradient
        S = torch.full((1, 3, 4), -1000.0, device=self.device)
        S[0, 0, 2] = S[0, 2, 0] = 5.0
        _, grad = self.rows_gradient(S, None, None, -1000.0, 1.0, torch.ones(1, device=self.device))
        expected = torch.zeros(1, 3, 4)
        expected[0, 0, 2] = 1.0 / (1.0 + math.exp(-5.0))
        torch.testing.assert_close(grad.cpu(), expected, rtol=0, atol=1e-6)

    @pytest.mark.parametrize("N", [200, 201], ids=["aligned", "unaligned"])
    def test_rows_past_the_scaled_range_take_the_table(self, N):
        # A +150 spike (P = 2^216) leaves the scaled range: the rows' forward scores that pair in log space
        # and counts it, the rows' backward then gives None, and the op's backward takes the DP table's
        # path for the batch.
        S = random_scores((10, 50, N), seed=9994, dtype=torch.float32)
        S[3, 20, 30] = 150.0
        engine = _build.cuda_engine()
        assert ops._by_rows(engine, S.cuda(), False, -1.0, 1.0)
        _, kept, best_row, failed = engine.forward_rows(S.cuda(), None, None, -1.0, 1.0)
        assert failed.item() == 1
        ones = torch.ones(10, device=self.device)
        assert engine.backward_rows(ones, S.cuda(), kept, best_row, failed, None, None, -1.0, 1.0) is None
        G = S.cuda().requires_grad_()
        out = ssw(G, -1.0, 1.0)
        out.sum().backward()
        exact_S = S.double().requires_grad_()
        exact = ssw(exact_S, -1.0, 1.0, backend="cpu")
        exact.sum().backward()
        torch.testing.assert_close(out.detach().cpu().double(), exact.detach(), rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(G.grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-4)

    def test_which_gradients_go_by_rows(self):
        engine = _build.cuda_engine()
        # what the engine can take
        S = torch.randn(3, 5, 12, device=self.device)
        assert engine.rows_take(S, -1.0, 1.0)
        assert not engine.rows_take(S.double(), -1.0, 1.0)  # float64: the table
        assert not engine.rows_take(S, -1.0, 0.0)  # t = 0: the table (argmax weights)
        assert not engine.rows_take(S, 0.5, 1.0)  # a positive gap: no scaled space
        assert not engine.rows_take(torch.randn(3, 5, 257, device=self.device), -1.0, 1.0)  # past 256 columns
        # what the op sends there: N wide enough to gain (ops.ROWS_NARROWEST), wider with lengths
        for N, lengths, by_rows in ((128, False, False), (129, False, True), (192, True, False), (193, True, True)):
            assert ops._by_rows(engine, torch.zeros(2, 3, N, device=self.device), lengths, -1.0, 1.0) == by_rows
        # Rows not 16-byte aligned go through a staging row: rows of 1,000 bytes, and a contiguous S 4 bytes
        # past an aligned address (N a multiple of 8: the only unmasked case it changes); a non-contiguous S
        # goes as an aligned copy. Through the op, against float64.
        wide = torch.randn(3, 5, 250, device=self.device)
        shifted = torch.randn(3 * 5 * 256 + 1, device=self.device)[1:].view(3, 5, 256)
        transposed = torch.randn(3, 200, 5, device=self.device).transpose(1, 2)
        for x in (wide, shifted, transposed):
            assert ops._by_rows(engine, x, False, -1.0, 1.0)
            G = x.detach().requires_grad_()
            ssw(G, -1.0, 1.0).sum().backward()
            exact_S = x.detach().cpu().double().requires_grad_()
            ssw(exact_S, -1.0, 1.0, backend="cpu").sum().backward()
            torch.testing.assert_close(G.grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-5)

    def test_rows_gradient_of_empty_batches(self):
        for shape in [(0, 3, 200), (2, 0, 200), (2, 3, 0)]:
            S = torch.zeros(shape, device=self.device)
            scores, grad = self.rows_gradient(S, None, None, -1.0, 1.0, torch.ones(shape[0], device=self.device))
            assert scores.shape == (shape[0],) and (scores == 0).all()
            assert grad.shape == shape and (grad == 0).all()
            G = S.requires_grad_()
            ssw(G, -1.0, 1.0).sum().backward()
            assert G.grad.shape == shape and (G.grad == 0).all()

    # -- the scaled sweep (float at t > 0 with 4 columns per lane, dense and from codes, no DP table:
    #    kernels/sw_cuda.cu), and its fallback to the log-space sweep

    def counted(self, engine_call):
        """(engine_call(counter), how many pairs that engine call scored in log space)."""
        counter = torch.zeros(1, dtype=torch.int32, device=self.device)
        out = engine_call(counter)
        return out, int(counter.item())

    def codes_engine(self, query, target, qlen, tlen, table, gap, t, scaled=True, lane_columns=4):
        """(scores, how many pairs the engine scored in log space) of one engine call."""
        return self.counted(lambda counter: _build.cuda_engine().forward_codes(
            query, target, qlen, tlen, table, gap, t, lane_columns, scaled, counter))

    def dense_engine(self, S, qlen, tlen, gap, t, scaled=True, lane_columns=4):
        """The same for dense scores (the forward without the DP table)."""
        return self.counted(lambda counter: _build.cuda_engine().forward(
            S, qlen, tlen, gap, t, False, lane_columns, scaled, counter)[0])

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def exact_scores_of(pairs, gap, t):
        """exact_scores for BLOSUM62, kept for the tests that share pairs and settings."""
        return TestCudaBackend.exact_scores(list(pairs), gap, t)

    @staticmethod
    def exact_scores(pairs, gap, t, matrix=BLOSUM62, cells=1 << 25):
        """The float64 CPU engine, in padded batches of pairs of similar size (of at most `cells` padded
        cells: one batch of the long pairs would not fit)."""
        order = sorted(range(len(pairs)), key=lambda b: max(len(pairs[b][0]), len(pairs[b][1])))
        scores = torch.empty(len(pairs), dtype=torch.float64)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order):
                side = max(len(pairs[order[end]][0]), len(pairs[order[end]][1]))
                if (end + 1 - start) * side * side > cells:
                    break
                end += 1
            batch = order[start:end]
            S, qlen, tlen = score_matrices([pairs[b] for b in batch], matrix)
            scores[batch] = ssw(S, gap, t, qlen, tlen, backend="cpu")
            start = end
        return scores

    # (gap, t) and whether 8 columns per lane take them (BLOSUM62: log2 of the largest P, 2^(11 / (t ln 2)),
    # rounded up, at most kWideBias = 20, and that plus -2 gap / (t ln 2) at most kWideLimit = 32 in
    # kernels/sw_cuda.cu)
    SCALED_SETTINGS = [(-4.0, 1.0, True), (-1.0, 1.0, True), (-11.0, 1.0, False), (-4.0, 2.0, True),
                       (-1.0, 0.5, False)]

    @pytest.mark.parametrize("lane_columns", [4, 8])
    @pytest.mark.parametrize("gap,t,wide", SCALED_SETTINGS)
    def test_scaled_sweep_matches_float64(self, gap, t, wide, lane_columns):
        # Real-like pairs: long related ones (12 tiles of 4 columns per lane, shared by a block of warps),
        # self-alignments (scores of several thousand), random ones, and 1 x N / N x 1; every pair takes
        # the scaled sweep. With 8 columns per lane where the setting allows them, else 4.
        rng = random.Random(9900)
        long = related_protein_pairs(seed=9901, count=40, min_length=300, max_length=1500)
        pairs = long + [(q, q) for q, _ in long[:10]]
        pairs += random_protein_pairs(seed=9902, count=1050, min_length=1, max_length=300)
        pairs += [("W", "ACDEFGHIKLMNPQRSTVWY" * 20), ("ACDEFGHIKLMNPQRSTVWY" * 20, "W"), ("A", "A")]
        rng.shuffle(pairs)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        out, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, gap, t,
                                              lane_columns=lane_columns)
        assert in_log_space == 0
        if lane_columns == 8:  # 4 columns per lane, where not wide: the same bits as asking for 4
            narrow, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, gap, t)
            assert torch.equal(out, narrow) != wide
        exact = self.exact_scores_of(tuple(pairs), gap, t)
        error = (out.cpu().double() - exact).abs()
        assert (error <= 1e-4 + 1e-5 * exact.abs()).all(), (error.max().item(), exact[error.argmax()].item())
        # and the log-space sweep on the same pairs
        log, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, gap, t, scaled=False)
        assert in_log_space == len(pairs)
        assert ((log.cpu().double() - exact).abs() <= 1e-4 + 1e-5 * exact.abs()).all()
        # the public entry (1103 pairs: 8 columns per lane); a long pair alone (one warp, not a block)
        # gives the same bits
        if lane_columns == 8:
            assert torch.equal(soft_smith_waterman_codes(query, target, table, gap, t, qlen.cuda(), tlen.cuda()), out)
        for b in [b for b, (q, _) in enumerate(pairs) if len(q) >= 600][:4]:
            q, n = int(qlen[b]), int(tlen[b])
            alone, _ = self.codes_engine(query[b:b + 1, :q], target[b:b + 1, :n], None, None, table, gap, t,
                                         lane_columns=lane_columns)
            assert torch.equal(alone, out[b:b + 1])

    def test_scaled_sweep_falls_back_to_log_space(self):
        # A matrix of +-40 with gap -200: along an alignment of identities the cells of a row fall by 200
        # per column, past what the scaled floats hold, so those pairs go through the log-space sweep
        # (and give its result); the random pairs around them stay scaled.
        letters = BLOSUM62.alphabet
        table = torch.full((len(letters), len(letters)), -40.0, dtype=torch.float64)
        table.fill_diagonal_(40.0)
        matrix = substitution_matrices.Array(alphabet=letters, dims=2, data=table.numpy())
        same = [(q, q) for q, _ in random_protein_pairs(seed=9910, count=50, min_length=100, max_length=300)]
        pairs = same + random_protein_pairs(seed=9911, count=1050, min_length=1, max_length=60)
        query, target, qlen, tlen, table = code_batch(pairs, matrix=matrix, device=self.device)
        out, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -200.0, 1.0)
        log, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -200.0, 1.0, scaled=False)
        assert len(same) <= in_log_space < len(pairs)
        assert torch.equal(out[:len(same)], log[:len(same)])
        exact = self.exact_scores(pairs, -200.0, 1.0, matrix)
        assert ((out.cpu().double() - exact).abs() <= 1e-4 + 1e-5 * exact.abs()).all()
        # a matrix whose powers 2^(m / (t ln 2)) pass 2^60 (here BLOSUM62 at t = 0.1), or a positive gap:
        # no pair is scaled, and the scores are the log-space sweep's
        query, target, qlen, tlen, table = code_batch(pairs[50:], device=self.device)
        for gap, t in [(-4.0, 0.1), (0.5, 1.0)]:
            out, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, gap, t)
            assert in_log_space == len(pairs) - 50
            log, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, gap, t, scaled=False)
            assert torch.equal(out, log)

    @pytest.mark.parametrize("scale,gap,t", [(1.0, -1.0, 1.0), (3.0, -1.0, 1.0), (1.0, -0.3, 0.3), (5.0, -4.0, 2.0)])
    def test_scaled_sweep_dense(self, scale, gap, t):
        # Random normal scores, lengths anywhere, 300 columns = 2 tiles of 128 and one of 44 (full pairs:
        # the last lanes of a tile past the matrix).
        B, M, N = 1100, 70, 300
        S = random_scores((B, M, N), seed=9930, dtype=torch.float32, scale=scale)
        qlen, tlen = random_lengths(B, M, seed=9931), random_lengths(B, N, seed=9932)
        exact = ssw(S.double(), gap, t, qlen, tlen, backend="cpu")
        for lengths in [(qlen.cuda(), tlen.cuda()), (None, None)]:
            out, in_log_space = self.dense_engine(S.cuda(), *lengths, gap, t)
            if scale == 1.0:
                assert in_log_space == 0
            assert in_log_space < B // 10
            if lengths[0] is None:
                exact = ssw(S.double(), gap, t, backend="cpu")
            error = (out.cpu().double() - exact).abs()
            assert (error <= 1e-4 + 1e-5 * exact.abs()).all(), error.max().item()
            assert torch.equal(ssw(S.cuda(), gap, t, *lengths), out)  # the op's own call

    def test_scaled_sweep_dense_falls_back(self):
        # Scores whose powers 2^(S / (t ln 2)) overflow, a NaN and an inf: those pairs, and only those,
        # go through the log-space sweep.
        B, M, N = 1100, 40, 150
        S = random_scores((B, M, N), seed=9940, dtype=torch.float32)
        S[:50, 10, 20] = 500.0
        S[60, 5, 5] = float("nan")
        S[70, 39, 149] = float("inf")
        exact = ssw(S.double(), -1.0, 1.0, backend="cpu")
        out, in_log_space = self.dense_engine(S.cuda(), None, None, -1.0, 1.0)
        assert in_log_space == 52
        log, _ = self.dense_engine(S.cuda(), None, None, -1.0, 1.0, scaled=False)
        spiked = [*range(50), 60, 70]
        torch.testing.assert_close(out[spiked], log[spiked], rtol=0, atol=0, equal_nan=True)  # the same bits
        assert math.isnan(out[60].item()) and out[70].item() == math.inf
        finite = torch.ones(B, dtype=torch.bool)
        finite[[60, 70]] = False
        assert ((out.cpu().double() - exact)[finite].abs() <= 1e-4 + 1e-5 * exact[finite].abs()).all()

    # Settings of tools/fuzz_scaled.py cuda (seed 1: trial, M, N, t, gap, scale; 1100 pairs) where the
    # scaled sweep was wrong. The first 7: a factor below the float range, flushed to 0 (a left neighbour
    # far below the lane's scale, the first tile's border), that times a large P was the largest term of
    # its cell: off by 4e-3 to 0.23 relative. The last 2: H small at a large t, where sigma + lg2(stored)
    # cancelled: 4.6e-6 and 1.07e-5.
    CUDA_FUZZ = [(7, 47, 8, 1.0, -0.1, 20.0), (61, 21, 11, 0.7, 0.0, 20.0), (280, 60, 33, 1.0, -1.0, 20.0),
                 (147, 14, 136, 0.2, -0.1, 5.0), (140, 53, 3, 0.4, -1.0, 20.0), (20, 33, 59, 0.05, -0.1, 1.0),
                 (88, 50, 39, 0.2, -1.0, 5.0), (3, 39, 1, 2.0, -4.0, 5.0), (187, 4, 24, 10.0, -30.0, 20.0)]

    def fuzz_setting_error(self, trial, M, N, t, gap, scale, **engine_options):
        """The largest relative error against float64 of one setting of tools/fuzz_scaled.py cuda, drawn as
        the fuzz draws it (1100 pairs), through dense_engine with engine_options."""
        B = 1100
        S = torch.randn(B, M, N, generator=torch.Generator().manual_seed(trial)) * scale
        qlen = torch.randint(0, M + 1, (B,), generator=torch.Generator().manual_seed(trial + 1))
        tlen = torch.randint(0, N + 1, (B,), generator=torch.Generator().manual_seed(trial + 2))
        exact = ssw(S.double(), gap, t, qlen, tlen, backend="cpu")
        out, _ = self.dense_engine(S.cuda(), qlen.cuda(), tlen.cuda(), gap, t, **engine_options)
        return ((out.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item()

    @pytest.mark.parametrize("trial, M, N, t, gap, scale", CUDA_FUZZ, ids=[f"trial{f[0]}" for f in CUDA_FUZZ])
    def test_scaled_sweep_fuzz_findings(self, trial, M, N, t, gap, scale):
        assert self.fuzz_setting_error(trial, M, N, t, gap, scale) <= 2e-6

    # Settings of tools/fuzz_scaled.py cuda (seed 1: trial, M, N, t, gap, scale; 1100 pairs) where the
    # 1-column log-space cell, then taken relative to the delete term up + gap, was 3.9e-6 to 7.9e-6
    # relative off: the rounding of up + gap (at the magnitude of the gap) went into every cell.
    ONE_COLUMN_FUZZ = [(13, 55, 130, 0.7, -30.0, 0.1), (22, 30, 69, 2.0, -30.0, 0.1), (32, 11, 41, 0.4, -30.0, 1.0)]

    @pytest.mark.parametrize("trial, M, N, t, gap, scale", ONE_COLUMN_FUZZ, ids=[f"trial{f[0]}" for f in ONE_COLUMN_FUZZ])
    def test_one_column_log_space_fuzz_findings(self, trial, M, N, t, gap, scale):
        assert self.fuzz_setting_error(trial, M, N, t, gap, scale, scaled=False, lane_columns=1) <= 2e-6

    @pytest.mark.parametrize("scale,gap,t", [(1.0, -1.0, 1.0), (3.0, -1.0, 1.0), (1.0, -0.3, 0.3), (5.0, -4.0, 2.0),
                                             (1.0, 0.0, 10.0)])
    def test_one_scale_sweep_dense(self, scale, gap, t):
        # 1-column lanes (the small batches) at t > 0: pairs of one column tile (at most 32 columns) take
        # the scaled sweep with one scale per warp, wider ones the log-space sweep (each counted). Random
        # normal scores, lengths anywhere.
        B, M = 60, 70
        for N in (32, 300):
            S = random_scores((B, M, N), seed=9935 + N, dtype=torch.float32, scale=scale)
            qlen, tlen = random_lengths(B, M, seed=9936), random_lengths(B, N, seed=9937)
            for lengths in [(qlen, tlen), (None, None)]:
                exact = ssw(S.double(), gap, t, *lengths, backend="cpu")
                on_gpu = [None if x is None else x.cuda() for x in lengths]
                out, in_log_space = self.dense_engine(S.cuda(), *on_gpu, gap, t, lane_columns=1)
                wide = int((tlen > 32).sum()) if lengths[0] is not None else (B if N > 32 else 0)
                if (scale, t) == (1.0, 1.0):
                    assert in_log_space == wide
                assert wide <= in_log_space
                error = (out.cpu().double() - exact).abs()
                assert (error <= 1e-4 + 1e-5 * exact.abs()).all(), error.max().item()
                assert torch.equal(ssw(S.cuda(), gap, t, *on_gpu), out)  # the op's own call (60 pairs: 1 column)
                log, in_log_space = self.dense_engine(S.cuda(), *on_gpu, gap, t, scaled=False, lane_columns=1)
                assert in_log_space == B
                assert ((log.cpu().double() - exact).abs() <= 1e-4 + 1e-5 * exact.abs()).all()

    def test_one_scale_sweep_rescales_and_gives_up(self):
        # 1-column lanes, one column tile: a value past 2^100 (E = 2^(H / (t ln 2))) turns the warp's values
        # down by 2^32, at most 3 times; past that (H above about 136 t), or at a NaN or an inf, the sweep
        # gives up and the pair is scored in log space. Alignments of 30 cells raised by 3.5 (H about 111:
        # 2 rescalings), 4 (123: 3) and 5 or 8 (152, 242: given up) among scores of scale 0.5 (H about 15).
        B, M, N, gap = 8, 100, 32, -2.0
        S = random_scores((B, M, N), seed=9945, dtype=torch.float32, scale=0.5)
        cells = torch.arange(30)
        for b, raise_by in enumerate([3.5, 4.0, 5.0, 8.0]):
            S[b, cells + 10, cells + 1] += raise_by
        S[4, 5, 5] = float("nan")
        S[5, 60, 20] = float("inf")
        S[6, 0, 0] = float("-inf")  # P = 0: stays scaled
        given_up = [2, 3, 4, 5]
        exact = ssw(S.double(), gap, 1.0, backend="cpu")
        assert 100 < exact[0] < 130 and 100 < exact[1] < 130 and exact[2] > 140 and exact[7] < 30
        out, in_log_space = self.dense_engine(S.cuda(), None, None, gap, 1.0, lane_columns=1)
        assert in_log_space == len(given_up)
        log, _ = self.dense_engine(S.cuda(), None, None, gap, 1.0, scaled=False, lane_columns=1)
        torch.testing.assert_close(out[given_up], log[given_up], rtol=0, atol=0, equal_nan=True)  # the same bits
        assert math.isnan(out[4].item()) and out[5].item() == math.inf
        finite = [b for b in range(B) if b not in (4, 5)]
        error = (out.cpu().double() - exact)[finite].abs()
        assert (error <= 1e-4 + 1e-5 * exact[finite].abs()).all(), error.max().item()

    def test_scaled_sweep_nan_in_the_matrix(self):
        # A NaN entry keeps the whole call in log space; it reaches only the pairs that use it.
        pairs = random_protein_pairs(seed=9920, count=1100, min_length=5, max_length=150)
        pairs = [(q.replace("W", "Y"), t.replace("W", "Y")) for q, t in pairs]
        pairs[7] = ("MKW" + pairs[7][0], "W" + pairs[7][1])
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        w = BLOSUM62.alphabet.index("W")
        clean, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, 1.0, scaled=False)
        table[w, w] = float("nan")
        out, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, 1.0)
        assert in_log_space == len(pairs)
        assert math.isnan(out[7].item())
        others = torch.arange(len(pairs)) != 7
        assert torch.equal(out[others.cuda()], clean[others.cuda()])

    def test_scaled_sweep_forbidden_substitution(self):
        # An entry of -inf (P = 0): P 2^-bias is not a normal float, so the whole call stays in log space
        # (the first column's diagonal factor, kept times 2^bias, could be large enough for a flushed
        # P 2^-bias to matter; for -inf itself nothing would be lost), and gives its scores.
        pairs = random_protein_pairs(seed=9925, count=1100, min_length=5, max_length=150)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        a, w = BLOSUM62.alphabet.index("A"), BLOSUM62.alphabet.index("W")
        table[a, w] = table[w, a] = -math.inf
        out, in_log_space = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, 1.0)
        assert in_log_space == len(pairs)
        log, _ = self.codes_engine(query, target, qlen.cuda(), tlen.cuda(), table, -4.0, 1.0, scaled=False)
        assert torch.equal(out, log)
        forbidding = substitution_matrices.Array(alphabet=BLOSUM62.alphabet, dims=2, data=table.cpu().double().numpy())
        exact = self.exact_scores(pairs, -4.0, 1.0, forbidding)
        assert ((out.cpu().double() - exact).abs() <= 1e-4 + 1e-5 * exact.abs()).all()

    def test_deterministic(self):
        S = random_scores((1200, 50, 170), seed=9800, dtype=torch.float32, device=self.device)
        qlen = random_lengths(1200, 50, seed=9801).cuda()
        first = ssw(S, -1.0, 1.0, qlen, random_lengths(1200, 170, seed=9802).cuda())
        again = ssw(S, -1.0, 1.0, qlen, random_lengths(1200, 170, seed=9802).cuda())
        assert torch.equal(first, again)

    @pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=dtype_id)
    def test_half_inputs(self, half):
        S = random_scores((7, 20, 30), seed=9900, dtype=torch.float32, device=self.device).to(half)
        out = ssw(S, -1.0, 1.0, backend="cuda")
        assert out.dtype == half and out.device.type == "cuda"
        assert torch.equal(out, ssw(S.float(), -1.0, 1.0, backend="cuda").to(half))

    def test_side_stream_and_graph_capture(self):
        S = random_scores((16, 32, 32), seed=9950, dtype=torch.float32, device=self.device)
        expected = ssw(S, -1.0, 1.0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = ssw(S, -1.0, 1.0)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, expected)
        static = S.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            ssw(static, -1.0, 1.0)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            captured = ssw(static, -1.0, 1.0)
        fresh = random_scores((16, 32, 32), seed=9951, dtype=torch.float32, device=self.device)
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, ssw(fresh, -1.0, 1.0))

    def test_gradient_in_a_captured_graph(self):
        # A training step captured whole. The rows' backward reads one int from the device, which a capture
        # does not allow, so under capture the op keeps the DP table (ops._forward); replayed on new
        # scores, the gradient is theirs.
        static = random_scores((16, 32, 160), seed=9952, dtype=torch.float32, device=self.device).requires_grad_()
        assert ops._by_rows(_build.cuda_engine(), static, False, -1.0, 1.0)  # outside a capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture (by rows)
                static.grad = None
                ssw(static, -1.0, 1.0).sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        static.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ssw(static, -1.0, 1.0).sum().backward()
        fresh = random_scores((16, 32, 160), seed=9953, dtype=torch.float32)
        with torch.no_grad():
            static.copy_(fresh.cuda())
        graph.replay()
        torch.cuda.synchronize()
        exact = fresh.double().requires_grad_()
        ssw(exact, -1.0, 1.0, backend="cpu").sum().backward()
        torch.testing.assert_close(static.grad.cpu().double(), exact.grad, rtol=0, atol=1e-4)

    # -- gradients

    @pytest.mark.parametrize("t", [0.1, 1.0, 10.0])
    @pytest.mark.parametrize("shape", [(16, 32, 32), (6, 40, 170), (3, 150, 60)], ids=lambda s: "x".join(map(str, s)))
    def test_gradient_float32(self, shape, t):
        B, M, N = shape
        S = random_scores(shape, seed=9960, dtype=torch.float32, device=self.device).requires_grad_()
        qlen, tlen = random_lengths(B, M, seed=9961, low=1), random_lengths(B, N, seed=9962, low=1)
        qlen[0], tlen[0] = M, N
        ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda").sum().backward()
        _, expected = reference_gradient(S, -1.0, t, qlen, tlen, torch.ones(B))
        torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=1e-4)
        assert (S.grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_4_column_lanes_equals_cpu(self, t):
        B, M, N = 1100, 20, 300
        S = random_scores((B, M, N), seed=9970).requires_grad_()
        qlen, tlen = random_lengths(B, M, seed=9971), random_lengths(B, N, seed=9972)
        weights = random_scores((B,), seed=9973)
        (ssw(S, -1.0, t, qlen, tlen, backend="cpu") * weights).sum().backward()
        G = S.detach().cuda().requires_grad_()
        (ssw(G, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda") * weights.cuda()).sum().backward()
        torch.testing.assert_close(G.grad.cpu(), S.grad, rtol=0, atol=1e-9)

    @pytest.mark.parametrize("N", [150, 152], ids=["rows-unaligned", "rows-16-byte-aligned"])
    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_ignores_nan_padding_4_column_lanes(self, t, dtype, N):
        # A 4-column lane can hold both the last columns of a target and columns past it; the forward
        # computes the latter from the padding of S, which may be NaN, and keeps them in its table. They
        # never reach a real cell: the backward reads them as zero, and passes no flow through them.
        B, M = 1100, 30
        S = random_scores((B, M, N), seed=9985, dtype=dtype)
        qlen, tlen = random_lengths(B, M, seed=9986, low=1), random_lengths(B, N, seed=9987, low=1)
        tlen[:8] = torch.tensor([5, 6, 7, 129, 130, 131, 145, 149])  # a last lane with 1 to 3 real columns
        padded = S.clone()
        padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
        grads = []
        for scores in (S, padded):
            G = scores.cuda().requires_grad_()
            ssw(G, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda").sum().backward()
            grads.append(G.grad.cpu())
        clean, from_nan = grads
        assert torch.isfinite(from_nan).all()
        assert torch.equal(from_nan, clean)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_float32_4_column_lanes(self, t):
        # float32 with 4 columns per lane: the forward that keeps H and the backward load their rows in
        # groups of 8 and 4 steps (DenseGroups, BackwardRows). Random lengths end the rows anywhere in a
        # group; 300 columns are 2 tiles of 128 and one of 44.
        B, M, N = 1100, 37, 300
        S = random_scores((B, M, N), seed=9980, dtype=torch.float32)
        qlen, tlen = random_lengths(B, M, seed=9981), random_lengths(B, N, seed=9982)
        G = S.cuda().requires_grad_()
        scores = ssw(G, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        # the forward that keeps H scores as the log-space one that does not (which the op takes at t = 0;
        # at t > 0 it takes the scaled sweep, within float32 rounding)
        log, _ = self.dense_engine(S.cuda(), qlen.cuda(), tlen.cuda(), -1.0, t, scaled=False)
        assert torch.equal(scores.detach(), log)
        plain = ssw(S.cuda(), -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        torch.testing.assert_close(plain, log, rtol=1e-6, atol=1e-5)
        scores.sum().backward()
        exact = S.double().requires_grad_()
        ssw(exact, -1.0, t, qlen, tlen, backend="cpu").sum().backward()
        torch.testing.assert_close(G.grad.cpu().double(), exact.grad, rtol=0, atol=1e-4)
        assert (G.grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_cuda_engine_without_a_gpu_is_an_error_not_a_fallback():
    from swcli import ops
    from swcli._build import BuildError

    with pytest.raises(BuildError, match="the CUDA engine needs a CUDA device, and torch sees none"):
        ops._engine("cuda")
