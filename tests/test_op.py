"""The public op soft_smith_waterman, its module, argument checks and reference backend, on every device."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import swcli
from swcli.reference import SoftSmithWatermanReference, soft_smith_waterman_reference
from swcli.testing import (
    BACKENDS_FOR,
    DEVICES,
    DTYPES,
    DTYPE_PARAMS,
    GAPS,
    TEMPERATURES,
    assert_close_to_reference,
    biopython_score,
    cuda,
    dtype_id,
    parametrize_device,
    parametrize_dtype,
    random_lengths,
    random_protein_pairs,
    random_scores,
    related_protein_pairs,
    requires_cuda,
    run,
    score_matrices,
    slow,
    window_mask,
)

ssw = swcli.soft_smith_waterman

# Parametrised over DEVICES and DTYPES; on each device the compiled backend is BACKENDS_FOR(device) ('cpu'
# here, 'cuda' on a GPU, where those cases carry the `cuda` marker).


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


# On CUDA one case (the drifted one) stays in the fast suite; the others are slow: each runs the reference
# loop on 60,000 cells, once per dtype.
LONG_FAST_ON_CUDA = (2, 200, 150, 1.0, -1.0)


def _long_params():
    params = []
    for B, M, N, t, gap in LONG_CASES:
        for device in DEVICES:
            for dtype in DTYPES:
                marks = [cuda, requires_cuda] if device.type == "cuda" else []
                if device.type == "cuda" and (B, M, N, t, gap) != LONG_FAST_ON_CUDA:
                    marks.append(slow)
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
    empty = torch.zeros(0, 6, 7, device=device)
    assert ssw(empty, -1.0, 1.0, [], (), backend=backend).shape == (0,)  # an empty list is no float tensor
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
    ({"query_lengths": torch.tensor([1, 2, 3], device="meta")},
     r"query_lengths is a meta tensor \(shapes alone, no values\), but the score matrix is on cpu"),
    ({"gap": torch.tensor(-1.0, device="meta")}, r"gap is a meta tensor"),
    ({"temperature": torch.ones(3, device="meta")}, r"temperature is a meta tensor"),
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
    """At construction, under the module's own names (gap_open, not the op's gap); and a value set later,
    at forward."""
    with pytest.raises(ValueError, match=r"temperature must be >= 0"):
        swcli.SoftSmithWaterman(temperature=-1.0)
    with pytest.raises(ValueError, match=r"unknown backend"):
        swcli.SoftSmithWaterman(backend="tpu")
    with pytest.raises(ValueError, match=r"^gap_open must be a finite number, got nan$"):
        swcli.SoftSmithWaterman(gap_open=float("nan"))
    with pytest.raises(ValueError, match=r"^temperature must be a finite number, got 'x'$"):
        swcli.SoftSmithWaterman(temperature="x")
    module = swcli.SoftSmithWaterman()
    module.gap_open = float("inf")
    with pytest.raises(ValueError, match=r"^gap_open must be a finite number, got inf$"):
        module(S_OK)
    module.gap_open = "-1"
    with pytest.raises(ValueError, match=r"^gap_open must be a finite number, got '-1'$"):
        module(S_OK)
    module.gap_open = -2  # an int is a number: the op's scores with -2.0
    torch.testing.assert_close(module(S_OK), swcli.soft_smith_waterman(S_OK, -2.0), rtol=0, atol=0)


def test_good_numbers_of_other_types_are_accepted():
    S = random_scores((2, 4, 5), seed=8500)
    expected = ssw(S, -1.0, 0.0)
    assert torch.equal(ssw(S, -1, 0), expected)  # ints
    assert torch.equal(ssw(S, np.float64(-1.0), np.float32(0.0)), expected)  # numpy scalars
    ok = ssw(torch.zeros(0, 3, 4), query_lengths=torch.zeros(0, dtype=torch.int64),
             target_lengths=torch.zeros(0, dtype=torch.int64))
    assert ok.shape == (0,)
