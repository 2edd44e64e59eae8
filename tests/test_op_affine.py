"""Affine gaps (soft Gotoh): soft_smith_waterman and soft_smith_waterman_codes with gap_open and gap_extend,
their operators (swcli::affine_*), against the affine reference loop, Biopython and the linear op."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli import ops
from swcli.ops import soft_smith_waterman_codes
from swcli.reference import soft_smith_waterman_affine_reference
from swcli.testing import (
    AFFINE_GAPS,
    BACKENDS_FOR,
    DEVICE_PARAMS,
    DTYPE_PARAMS,
    FLOAT32_MIN_ATOL,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    dtype_id,
    example_protein_pairs,
    parametrize_device,
    parametrize_dtype,
    random_lengths,
    random_scores,
    reference_gradient,
    related_protein_pairs,
    run,
    score_matrices,
    window_mask,
)

ssw = swcli.soft_smith_waterman

def affine_run(S, gap_open, gap_extend, t, qlen=None, tlen=None):
    return run(S, gap_open, t, qlen, tlen, gap_extend=gap_extend)


def affine_codes(query, target, matrix, gap_open, gap_extend, t, qlen=None, tlen=None, backend="auto"):
    return soft_smith_waterman_codes(query, target, matrix, None, t, qlen, tlen, backend, gap_open=gap_open,
                                     gap_extend=gap_extend)


# --------------------------------------------------------------------------------------------------
# Temperature 0 against Biopython: exact, on real proteins


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap_open,gap_extend", AFFINE_GAPS)
def test_temperature_zero_equals_biopython(gap_open, gap_extend, dtype, device):
    pairs = example_protein_pairs()  # the 20 pairs of data/example.fasta
    S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=device, pad=float("nan"))
    out = affine_run(S, gap_open, gap_extend, 0.0, qlen, tlen).cpu().tolist()
    expected = [biopython_score(q, t, gap_open, gap_extend=gap_extend) for q, t in pairs]
    bad = [(b, out[b], expected[b]) for b in range(len(pairs)) if out[b] != expected[b]]
    assert not bad, f"(pair, got, Biopython): {bad[:5]}"


@parametrize_device
@pytest.mark.parametrize("gap_open,gap_extend", AFFINE_GAPS)
@pytest.mark.parametrize("count", [1, 3, 150], ids=lambda c: f"{c}pairs")
def test_codes_temperature_zero_equals_biopython(count, gap_open, gap_extend, device):
    # real pairs (past the file's 20, two of its records drawn at random) and mutated copies, whose best
    # alignments go through gaps of several lengths
    pairs = example_protein_pairs(count, seed=20_000)
    if count > 3:
        pairs += related_protein_pairs(seed=20_001, count=20, min_length=30, max_length=300)
    query, target, qlen, tlen, matrix = code_batch(pairs, device=device, pad_code=23)
    out = affine_codes(query, target, matrix, gap_open, gap_extend, 0.0, qlen.to(device), tlen.to(device))
    assert out.dtype == torch.float32 and out.shape == (len(pairs),)
    expected = [biopython_score(q, t, gap_open, gap_extend=gap_extend) for q, t in pairs]
    assert out.cpu().tolist() == expected


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_codes_equal_dense_scores(t, device):
    # both take the same float32 products in log space: the same bits
    pairs = example_protein_pairs(40, seed=20_100)
    query, target, qlen, tlen, matrix = code_batch(pairs, device=device)
    S, _, _ = score_matrices(pairs, dtype=torch.float32, device=device)
    qlen, tlen = qlen.to(device), tlen.to(device)
    from_codes = affine_codes(query, target, matrix, -11.0, -1.0, t, qlen, tlen)
    dense = ssw(S, None, t, qlen, tlen, gap_open=-11.0, gap_extend=-1.0)
    assert torch.equal(from_codes, dense)


def test_codes_reference_backend_is_the_reference():
    pairs = related_protein_pairs(seed=20_200, count=4, min_length=5, max_length=20)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    S, _, _ = score_matrices(pairs)
    out = affine_codes(query, target, matrix, -3.0, -1.0, 0.5, qlen, tlen, backend="reference")
    assert out.dtype == torch.float64
    assert torch.equal(out, soft_smith_waterman_affine_reference(S, -3.0, -1.0, 0.5, qlen, tlen))


# --------------------------------------------------------------------------------------------------
# gap_open == gap_extend is the linear op


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 2.0])
def test_equal_gaps_are_the_linear_op_on_real_proteins(t, device):
    pairs = example_protein_pairs()[:8]
    S, qlen, tlen = score_matrices(pairs, device=device)  # float64
    qlen, tlen = qlen.to(device), tlen.to(device)
    linear_S, affine_S = S.clone().requires_grad_(), S.clone().requires_grad_()
    linear = ssw(linear_S, -4.0, t, qlen, tlen)
    affine = ssw(affine_S, None, t, qlen, tlen, gap_open=-4.0, gap_extend=-4.0)
    linear.sum().backward()
    affine.sum().backward()
    if t == 0:
        # integer scores: exact, and the ties broken alike (start, match, then the gap from above, then
        # the one from the left, in every state), so the same optimal alignment
        assert torch.equal(affine, linear) and torch.equal(affine_S.grad, linear_S.grad)
    else:  # the same function; X and Y group its terms differently, so to float64 rounding
        torch.testing.assert_close(affine, linear, rtol=1e-13, atol=1e-12)
        torch.testing.assert_close(affine_S.grad, linear_S.grad, rtol=0, atol=1e-11)
    # float32: within float32 rounding of scores up to about 1,000
    single = ssw(S.float(), None, t, qlen, tlen, gap_open=-4.0, gap_extend=-4.0).double()
    relative = ((single - linear.detach()).abs() / linear.detach().abs().clamp_min(1)).max().item()
    assert relative <= (0 if t == 0 else 2e-6), relative


@parametrize_device
@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_equal_gaps_give_the_linear_gradient_in_float32(t, device):
    # float32 against the float64 linear op: as close as the float32 linear op is (the tolerance rule of
    # swcli.testing: twice its error, at least 1e-4)
    S = random_scores((16, 32, 32), seed=20_300, dtype=torch.float32, device=device, scale=1.5)
    qlen, tlen = random_lengths(16, 32, seed=20_301, low=1), random_lengths(16, 32, seed=20_302, low=1)
    grad_out = random_scores((16,), seed=20_303, dtype=torch.float32, device=device)

    def scores_and_gradient(dtype, gap_extend):
        X = S.to(dtype).clone().requires_grad_()
        out = run(X, -1.0, t, qlen, tlen, gap_extend=gap_extend)
        (out * grad_out.to(dtype)).sum().backward()
        return out.detach().double(), X.grad.double()

    exact, exact_grad = scores_and_gradient(torch.float64, None)
    linear, linear_grad = scores_and_gradient(torch.float32, None)
    affine, affine_grad = scores_and_gradient(torch.float32, -1.0)
    bound = max(FLOAT32_MIN_ATOL, 2 * (linear - exact).abs().max().item())
    torch.testing.assert_close(affine, exact, rtol=0, atol=bound)
    bound = max(FLOAT32_MIN_ATOL, 2 * (linear_grad - exact_grad).abs().max().item())
    torch.testing.assert_close(affine_grad, exact_grad, rtol=0, atol=bound)


# --------------------------------------------------------------------------------------------------
# Against the float64 reference loop

SHAPES = [(0, 5, 7), (3, 0, 4), (3, 4, 0), (1, 1, 1), (4, 1, 9), (4, 9, 1), (5, 7, 13), (3, 13, 9),
          (40, 6, 5)]
GAP_PAIRS = [(-2.0, -0.5), (-3.0, 0.0)]  # open == extend: the linear op's tests above


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("gap_open,gap_extend", GAP_PAIRS)
@pytest.mark.parametrize("t", [0.0, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, t, gap_open, gap_extend, dtype, device):
    S = random_scores(shape, seed=21_000 + sum(shape), dtype=dtype, device=device, scale=1.5)
    assert_close_to_reference(affine_run(S, gap_open, gap_extend, t), S, gap_open, t, gap_extend=gap_extend)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_matches_reference_with_lengths(t, dtype, device):
    B, M, N = 37, 12, 9  # more pairs than one SIMD group of either dtype
    S = random_scores((B, M, N), seed=21_100, dtype=dtype, device=device, scale=1.5)
    qlen, tlen = random_lengths(B, M, seed=21_101), random_lengths(B, N, seed=21_102)
    out = affine_run(S, -2.0, -0.5, t, qlen, tlen)
    assert_close_to_reference(out, S, -2.0, t, qlen, tlen, gap_extend=-0.5)


@parametrize_device
@pytest.mark.parametrize("t,gap_open,gap_extend", [(0.5, -12.0, -1.0), (1.0, -12.0, -1.0), (2.0, -12.0, -1.0),
                                                   (1.0, -4.0, -4.0), (0.5, -10.0, -2.0)])
def test_float32_close_to_float64_on_real_proteins(t, gap_open, gap_extend, device):
    # The float64 engine is the reference loop to 1e-12 (above); the reference itself is too slow here.
    pairs = example_protein_pairs(16, seed=21_200)
    S, qlen, tlen = score_matrices(pairs, device=device)
    qlen, tlen = qlen.to(device), tlen.to(device)
    exact = ssw(S, None, t, qlen, tlen, gap_open=gap_open, gap_extend=gap_extend)
    single = ssw(S.float(), None, t, qlen, tlen, gap_open=gap_open, gap_extend=gap_extend).double()
    relative = ((single - exact).abs() / exact.abs().clamp_min(1)).max().item()
    assert relative <= 2e-6, relative


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_minus_infinite_scores(t, dtype, device):
    S = random_scores((6, 8, 9), seed=21_300, dtype=dtype, device=device, scale=2.0)
    S[S < -1.0] = float("-inf")
    S[3] = float("-inf")
    out = affine_run(S, -2.0, -0.5, t)
    assert torch.isfinite(out).all()
    assert_close_to_reference(out, S, -2.0, t, gap_extend=-0.5)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [1e-30, 1e-39])
def test_tiny_temperature_gives_the_hard_score(t, dtype, device):
    pairs = related_protein_pairs(seed=21_400, count=3, min_length=100, max_length=200)
    S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=device)
    hard = torch.tensor([biopython_score(q, s, -11.0, gap_extend=-1.0) for q, s in pairs], dtype=torch.float64)
    out = affine_run(S, -11.0, -1.0, t, qlen, tlen).cpu().double()
    torch.testing.assert_close(out, hard, rtol=0, atol=1e-9 if dtype == torch.float64 else 1e-2)


# --------------------------------------------------------------------------------------------------
# Gradients


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("gap_open,gap_extend", [(-2.0, -0.5), (-1.0, -1.0)])
def test_gradient_matches_autograd_through_reference(gap_open, gap_extend, t, device):
    B, M, N = 6, 9, 8
    S = random_scores((B, M, N), seed=22_000, device=device, scale=1.5)  # float64, no ties
    qlen, tlen = random_lengths(B, M, seed=22_001), random_lengths(B, N, seed=22_002)
    qlen[0], tlen[0] = M, N  # one full pair
    grad_out = random_scores((B,), seed=22_003, device=device)
    S.requires_grad_()
    out = affine_run(S, gap_open, gap_extend, t, qlen, tlen)
    (out * grad_out).sum().backward()
    expected_out, expected_grad = reference_gradient(S, gap_open, t, qlen, tlen, grad_out, gap_extend=gap_extend)
    torch.testing.assert_close(out.detach().cpu(), expected_out, rtol=0, atol=1e-9)
    assert S.grad.shape == S.shape and S.grad.dtype == S.dtype
    torch.testing.assert_close(S.grad.cpu(), expected_grad, rtol=0, atol=1e-9)
    assert (S.grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()


@parametrize_device
@pytest.mark.parametrize("gap_open,gap_extend", [(-4.0, -4.0), (-3.0, -1.0)])
def test_hard_gradient_breaks_ties_as_the_reference(gap_open, gap_extend, device):
    # Integer scores tie often: the engine's traceback must take the same optimal alignment as torch.max
    # in the reference (the first best cell in row-major order; start, match, Y, X in each state).
    pairs = [(q[:20], t[:20]) for q, t in example_protein_pairs(5, seed=22_100)]
    pairs += related_protein_pairs(seed=22_101, count=5, min_length=12, max_length=20)
    S, qlen, tlen = score_matrices(pairs, device=device)
    S.requires_grad_()
    affine_run(S, gap_open, gap_extend, 0.0, qlen, tlen).sum().backward()
    _, expected = reference_gradient(S, gap_open, 0.0, qlen, tlen, torch.ones(len(pairs)), gap_extend=gap_extend)
    assert torch.equal(S.grad.cpu(), expected)
    assert ((S.grad == 0) | (S.grad == 1)).all()


@parametrize_device
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("t", [0.5, 1.0])
def test_gradcheck(t, with_lengths, device):
    S = random_scores((3, 4, 5), seed=22_200, device=device).requires_grad_()
    qlen = torch.tensor([4, 2, 3]).to(device) if with_lengths else None
    tlen = torch.tensor([5, 5, 2]).to(device) if with_lengths else None
    backend = BACKENDS_FOR(device)
    assert torch.autograd.gradcheck(
        lambda x: ssw(x, None, t, qlen, tlen, backend, gap_open=-1.5, gap_extend=-0.5), (S,), eps=1e-6, atol=1e-6)


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 0.1, 1.0, 10.0])
def test_gradient_entries_in_unit_interval(t, dtype, device):
    B, M, N = 12, 15, 13
    S = random_scores((B, M, N), seed=22_300, dtype=dtype, device=device).requires_grad_()
    affine_run(S, -2.0, -0.5, t, random_lengths(B, M, seed=22_301)).sum().backward()
    g = S.grad
    slack = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.isfinite(g).all() and (g >= 0).all() and (g <= 1 + slack).all() and (g > 0).any()
    if t == 0:
        assert ((g == 0) | (g == 1)).all()


@parametrize_device
def test_gradient_float32_close_to_reference(device):
    S = random_scores((16, 32, 32), seed=22_400, dtype=torch.float32, device=device).requires_grad_()
    affine_run(S, -2.0, -0.5, 1.0).sum().backward()
    _, expected = reference_gradient(S, -2.0, 1.0, None, None, torch.ones(16), gap_extend=-0.5)
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=1e-4)


@parametrize_device
@parametrize_dtype
def test_gradient_with_minus_infinite_scores(dtype, device):
    S = random_scores((4, 12, 15), seed=22_500, dtype=dtype, device=device, shift=0.5)
    S[:, 3:6, 2:9] = -math.inf
    S.requires_grad_()
    affine_run(S, -2.0, -0.5, 1.0).sum().backward()
    _, expected = reference_gradient(S, -2.0, 1.0, None, None, torch.ones(4), gap_extend=-0.5)
    if torch.device(device).type == "cpu":
        assert (S.grad[:, 3:6, 2:9] == 0).all()
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=1e-8 if dtype == torch.float64 else 1e-4)


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_gradient_of_empty_batches_and_pairs(t, device):
    for shape in [(0, 3, 4), (2, 0, 3), (2, 3, 0)]:
        S = torch.zeros(shape, dtype=torch.float64, device=device, requires_grad=True)
        affine_run(S, -2.0, -0.5, t).sum().backward()
        assert S.grad.shape == shape and (S.grad == 0).all()
    # all negative at t = 0: the best cell is the zero border, and nothing flows into S
    S = torch.full((2, 4, 5), -3.0, dtype=torch.float64, device=device, requires_grad=True)
    out = affine_run(S, -2.0, -0.5, 0.0)
    out.sum().backward()
    assert (out == 0).all() and (S.grad == 0).all()


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_non_contiguous_gradient(t, device):
    base = random_scores((6, 11, 9), seed=22_600, device=device)
    grad_out = random_scores((6,), seed=22_601, device=device)
    strided = base.transpose(1, 2).detach().requires_grad_()
    (affine_run(strided, -2.0, -0.5, t) * grad_out).sum().backward()
    dense = strided.detach().contiguous().requires_grad_()
    (affine_run(dense, -2.0, -0.5, t) * grad_out).sum().backward()
    assert torch.equal(strided.grad, dense.grad)
    single = base[:1].detach().requires_grad_()
    affine_run(single.expand(4, 11, 9), -2.0, -0.5, t).sum().backward()
    alone = base[:1].detach().requires_grad_()
    affine_run(alone, -2.0, -0.5, t).sum().backward()
    torch.testing.assert_close(single.grad, 4 * alone.grad, rtol=0, atol=1e-12)


@parametrize_device
def test_no_grad_gives_the_same_scores(device):
    S = random_scores((5, 10, 9), seed=22_700, dtype=torch.float32, device=device).requires_grad_()
    with torch.no_grad():
        quiet = affine_run(S, -2.0, -0.5, 1.0)
    tracked = affine_run(S, -2.0, -0.5, 1.0)
    assert quiet.grad_fn is None and tracked.requires_grad
    if S.is_cuda:  # the scaled sweep without the gradient, the scaled rows with it: each rounds its own way
        torch.testing.assert_close(quiet, tracked.detach(), rtol=2e-6, atol=0)
    else:  # both the log-space sweep: the same bits
        assert torch.equal(quiet, tracked.detach())


# --------------------------------------------------------------------------------------------------
# Padding, layout, precision, determinism


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
@pytest.mark.parametrize("junk", ["random", "nan", "inf", "-inf", "huge"])
def test_padding_never_changes_a_score(junk, t, dtype, device):
    B, M, N = 45, 19, 23
    S = random_scores((B, M, N), seed=23_000, dtype=dtype, device=device)
    qlen, tlen = random_lengths(B, M, seed=23_001), random_lengths(B, N, seed=23_002)
    outside = window_mask(B, M, N, qlen, tlen).to(device)
    padded = S.clone()
    if junk == "random":
        noise = random_scores((B, M, N), seed=23_003, dtype=dtype, device=device, scale=50.0)
        padded[outside] = noise[outside]
    else:
        padded[outside] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": 1e30}[junk]
    out = affine_run(padded, -2.0, -0.5, t, qlen, tlen)
    assert torch.isfinite(out).all()
    assert torch.equal(out, affine_run(S, -2.0, -0.5, t, qlen, tlen))
    for b in range(B):
        alone = affine_run(S[b : b + 1, : qlen[b], : tlen[b]].contiguous(), -2.0, -0.5, t)
        assert out[b].item() == alone.item(), f"pair {b} ({qlen[b]}x{tlen[b]})"


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_padding_gets_no_gradient(t, device):
    B, M, N = 9, 10, 12
    S = random_scores((B, M, N), seed=23_100, device=device)
    qlen, tlen = random_lengths(B, M, seed=23_101), random_lengths(B, N, seed=23_102)
    outside = window_mask(B, M, N, qlen, tlen).to(device)
    padded = S.clone()
    padded[outside] = 1e3
    clean_S, padded_S = S.requires_grad_(), padded.requires_grad_()
    affine_run(clean_S, -2.0, -0.5, t, qlen, tlen).sum().backward()
    affine_run(padded_S, -2.0, -0.5, t, qlen, tlen).sum().backward()
    assert (padded_S.grad[outside] == 0).all()
    assert torch.equal(padded_S.grad, clean_S.grad)


@parametrize_device
@parametrize_dtype
def test_zero_lengths_give_zero(dtype, device):
    S = torch.full((4, 5, 6), 3.0, dtype=dtype, device=device)
    qlen, tlen = torch.tensor([0, 5, 0, 2]), torch.tensor([6, 0, 0, 3])
    for t in [0.0, 1.0]:
        out = affine_run(S, -2.0, -0.5, t, qlen, tlen)
        assert out[:3].tolist() == [0.0, 0.0, 0.0]
        assert out[3].item() >= 6.0


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_non_contiguous_inputs(t, dtype, device):
    base = random_scores((7, 13, 11), seed=23_200, dtype=dtype, device=device)
    big = random_scores((9, 30, 40), seed=23_201, dtype=dtype, device=device)
    qlen, tlen = torch.tensor([3, 13, 0, 7, 12]), torch.tensor([11, 2, 5, 11, 9])
    for S, lengths in [(base.transpose(1, 2), None), (big[1::2, ::2, 3::3], None),
                       (base[:1].expand(5, 13, 11), (qlen, tlen))]:
        assert not S.is_contiguous()
        args = lengths or (None, None)
        assert torch.equal(affine_run(S, -2.0, -0.5, t, *args), affine_run(S.contiguous(), -2.0, -0.5, t, *args))


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_codes_layout_and_padding_do_not_matter(t, device):
    pairs = related_protein_pairs(seed=23_300, count=40, min_length=1, max_length=60) + [("", "ACDE"), ("WKL", "")]
    query, target, qlen, tlen, matrix = code_batch(pairs, device=device)
    qlen, tlen = qlen.to(device), tlen.to(device)
    expected = affine_codes(query, target, matrix, -11.0, -1.0, t, qlen, tlen)
    empty = (qlen == 0) | (tlen == 0)
    assert empty.any() and (expected[empty] == 0).all()
    junk_q, junk_t, _, _, _ = code_batch(pairs, device=device, pad_code=22)
    assert torch.equal(affine_codes(junk_q, junk_t, matrix, -11.0, -1.0, t, qlen, tlen), expected)
    wide_q = torch.zeros(query.shape[0], 2 * query.shape[1], dtype=torch.uint8, device=device)
    wide_q[:, ::2] = query
    assert not wide_q[:, ::2].is_contiguous()
    assert torch.equal(affine_codes(wide_q[:, ::2], target, matrix, -11.0, -1.0, t, qlen, tlen), expected)
    assert torch.equal(affine_codes(query, target, matrix.float(), -11.0, -1.0, t, qlen, tlen), expected)
    # one query shared by every pair (stride 0, as a search passes it) scores as its copies
    shared = query[:1].expand(len(pairs), -1)
    assert torch.equal(affine_codes(shared, target, matrix, -11.0, -1.0, t, None, tlen),
                       affine_codes(shared.contiguous(), target, matrix, -11.0, -1.0, t, None, tlen))


@parametrize_device
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_half_precision_is_upcast(half, t, device):
    S = random_scores((5, 12, 10), seed=23_400, dtype=half, device=device)
    out = affine_run(S, -2.0, -0.5, t)
    assert out.dtype == half
    assert torch.equal(out, affine_run(S.float(), -2.0, -0.5, t).to(half))
    S.requires_grad_()
    affine_run(S, -2.0, -0.5, t).sum().backward()
    assert S.grad.dtype == half and (S.grad.float() >= 0).all() and (S.grad.float() <= 1).all()


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_nan_poisons_only_its_pair(t, dtype, device):
    S = random_scores((40, 8, 9), seed=23_500, dtype=dtype, device=device)
    clean = affine_run(S, -2.0, -0.5, t)
    poisoned = S.clone()
    poisoned[7, 3, 4] = poisoned[25, 7, 8] = poisoned[30, 0, 0] = math.nan
    out = affine_run(poisoned, -2.0, -0.5, t)
    nan = torch.isnan(out)
    assert nan.nonzero().flatten().tolist() == [7, 25, 30]
    assert torch.equal(out[~nan], clean[~nan])


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_deterministic_and_independent_of_batch(t, dtype, device):
    B, M, N = 70, 25, 21
    S = random_scores((B, M, N), seed=23_600, dtype=dtype, device=device)
    qlen, tlen = random_lengths(B, M, seed=23_601), random_lengths(B, N, seed=23_602)
    first = affine_run(S, -2.0, -0.5, t, qlen, tlen)
    assert torch.equal(first, affine_run(S, -2.0, -0.5, t, qlen, tlen))
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(23_603))
    shuffled = affine_run(S[perm.to(device)], -2.0, -0.5, t, qlen[perm], tlen[perm])
    assert torch.equal(shuffled, first[perm.to(device)])
    for b in [0, 17, 69]:
        assert affine_run(S[b : b + 1], -2.0, -0.5, t, qlen[b : b + 1], tlen[b : b + 1]).item() == first[b].item()
    if device.type == "cpu":
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(affine_run(S, -2.0, -0.5, t, qlen, tlen), first)
        finally:
            torch.set_num_threads(threads)


@parametrize_device
@parametrize_dtype
def test_soft_decreases_to_hard_and_scores_are_nonnegative(dtype, device):
    S = random_scores((9, 30, 20), seed=23_700, dtype=dtype, device=device, shift=-0.5)
    slack = 1e-9 if dtype == torch.float64 else 1e-4
    hard = affine_run(S, -2.0, -0.5, 0.0).double()
    assert (hard >= 0).all()
    previous = None
    for t in [1.0, 0.1, 0.01]:
        soft = affine_run(S, -2.0, -0.5, t).double()
        assert (soft >= hard - slack).all()
        if previous is not None:
            assert (soft <= previous + slack).all()
        previous = soft
    assert (previous - hard).abs().max().item() < 0.1


# --------------------------------------------------------------------------------------------------
# The module, the reference backend and the operators


def test_module_with_gap_extend_is_affine():
    S = random_scores((4, 6, 7), seed=24_000)
    qlen, tlen = torch.tensor([6, 3, 0, 5]), torch.tensor([7, 7, 2, 1])
    module = swcli.SoftSmithWaterman(gap_open=-3.0, temperature=0.5, gap_extend=-1.0)
    assert "gap_open=-3.0, gap_extend=-1.0" in repr(module)
    assert torch.equal(module(S, qlen, tlen), ssw(S, None, 0.5, qlen, tlen, gap_open=-3.0, gap_extend=-1.0))
    reference = swcli.SoftSmithWaterman(-3.0, 0.5, "reference", gap_extend=-1.0)
    expected = soft_smith_waterman_affine_reference(S, -3.0, -1.0, 0.5, qlen, tlen)
    assert torch.equal(reference(S, qlen, tlen), expected)
    torch.testing.assert_close(module(S, qlen, tlen), expected, rtol=0, atol=1e-9)
    # without gap_extend, gap_open is the seed module's linear gap
    linear = swcli.SoftSmithWaterman(gap_open=-3.0, temperature=0.5)
    assert "gap_extend" not in repr(linear)
    assert torch.equal(linear(S), ssw(S, -3.0, 0.5))


@pytest.mark.parametrize("dtype", DTYPE_PARAMS)
def test_reference_backend_is_the_reference(dtype):
    S = random_scores((5, 6, 7), seed=24_100, dtype=dtype)
    qlen, tlen = torch.tensor([6, 1, 0, 4, 6]), torch.tensor([7, 7, 3, 2, 5])
    out = ssw(S, None, 0.7, qlen, tlen, "reference", gap_open=-2.0, gap_extend=-0.5)
    assert torch.equal(out, soft_smith_waterman_affine_reference(S, -2.0, -0.5, 0.7, qlen, tlen))


def affine_operator_cases(device):
    """(operator, args, kwargs) of every affine operator on small random inputs, with and without lengths."""
    device = torch.device(device)
    S = random_scores((5, 7, 9), seed=24_200, dtype=torch.float32, device=device)
    Sg = S.clone().requires_grad_()
    qlen, tlen = random_lengths(5, 7, seed=24_201).to(device), random_lengths(5, 9, seed=24_202).to(device)
    g = torch.Generator().manual_seed(24_203)
    q = torch.randint(0, 24, (5, 7), generator=g, dtype=torch.uint8).to(device)
    t = torch.randint(0, 24, (5, 9), generator=g, dtype=torch.uint8).to(device)
    m = torch.randint(-4, 12, (24, 24), generator=g).float().to(device)
    S64 = Sg.detach().double().requires_grad_()
    grad = random_scores((5,), seed=24_204, dtype=torch.float32, device=device)
    _, state, best, failed = torch.ops.swcli.affine_forward(S, qlen, tlen, -2.0, -0.5, 1.0, False)
    _, state0, best0, failed0 = torch.ops.swcli.affine_forward(S, None, None, -2.0, -0.5, 0.0, False)
    cases = [
        (torch.ops.swcli.affine_scores.default, (S, qlen, tlen, -4.0, -4.0, 0.0), {}),
        (torch.ops.swcli.affine_scores.default, (S.double(), qlen, None, -2.0, -0.5, 0.5), {}),
        (torch.ops.swcli.affine_scores_codes.default, (q, t, m, None, tlen, -11.0, -1.0, 1.0), {}),
        (torch.ops.swcli.affine_forward.default, (Sg, None, None, -2.0, -0.5, 1.0, False), {}),
        (torch.ops.swcli.affine_forward.default, (S64, qlen, tlen, -1.0, -1.0, 0.0, False), {}),
        (torch.ops.swcli.affine_backward.default,
         (grad, S, state, best, failed, qlen, tlen, -2.0, -0.5, 1.0, False), {}),
        (torch.ops.swcli.affine_backward.default,
         (grad, S, state0, best0, failed0, None, None, -2.0, -0.5, 0.0, False), {}),
    ]
    if device.type == "cuda":  # the gradient by rows, a CUDA scheme
        _, kept, best_row, failed_rows = torch.ops.swcli.affine_forward(S, qlen, tlen, -2.0, -0.5, 1.0, True)
        cases += [
            (torch.ops.swcli.affine_forward.default, (Sg, qlen, tlen, -2.0, -0.5, 1.0, True), {}),
            (torch.ops.swcli.affine_backward.default,
             (grad, S, kept, best_row, failed_rows, qlen, tlen, -2.0, -0.5, 1.0, True), {}),
        ]
    return cases


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_opcheck_passes_for_every_affine_operator(device):
    for op, args, kwargs in affine_operator_cases(device):
        tests = None  # all of opcheck's
        if torch.device(device).type == "cuda" and op is torch.ops.swcli.affine_forward.default:
            # as the linear forward's: a CUDA state need not be written outside what the backward reads
            tests = ("test_schema", "test_autograd_registration", "test_faketensor")
        torch.library.opcheck(op, args, kwargs, **({} if tests is None else {"test_utils": tests}))


def test_affine_schemas_are_registered():
    for name in ("affine_scores", "affine_scores_codes", "affine_forward", "affine_backward"):
        assert str(getattr(torch.ops.swcli, name).default._schema) == f"swcli::{name}{ops.SCHEMAS[name]}"


class AffineAligner(torch.nn.Module):
    def __init__(self, temperature):
        super().__init__()
        self.align = swcli.SoftSmithWaterman(gap_open=-2.0, temperature=temperature, gap_extend=-0.5)

    def forward(self, x, y, qlen, tlen):
        return self.align(x @ y.transpose(1, 2), qlen, tlen)


@parametrize_device
@pytest.mark.parametrize("temperature", [1.0])  # the graph is the same at t = 0; compiling costs seconds
def test_compile_fullgraph_matches_eager(temperature, device):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(24_300)
    x = torch.randn(4, 13, 8, generator=g).to(device).requires_grad_()
    y = torch.randn(4, 40, 8, generator=g).to(device).requires_grad_()
    qlen = random_lengths(4, 13, seed=24_301, low=1).to(device)
    tlen = random_lengths(4, 40, seed=24_302, low=1).to(device)
    model = AffineAligner(temperature)
    eager = model(x, y, qlen, tlen)
    gx_eager, gy_eager = torch.autograd.grad(eager.sum(), (x, y))
    out = torch.compile(model, fullgraph=True)(x, y, qlen, tlen)
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(gx, gx_eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(gy, gy_eager, rtol=0, atol=1e-5)


def test_meta_tensors_give_shapes():
    S = torch.empty(6, 30, 40, device="meta")
    assert ssw(S, gap_open=-11.0, gap_extend=-1.0).shape == (6,)
    q = torch.empty(6, 30, dtype=torch.uint8, device="meta")
    t = torch.empty(6, 40, dtype=torch.uint8, device="meta")
    m = torch.empty(24, 24, device="meta")
    assert torch.ops.swcli.affine_scores_codes(q, t, m, None, None, -11.0, -1.0, 1.0).shape == (6,)


def test_cpu_engine_checks_the_gaps_itself():
    """Called directly, past the Python checks, the engine refuses gaps outside gap_open <= gap_extend <= 0."""
    ops.load_engine("cpu")
    S = random_scores((2, 5, 6), seed=24_400, dtype=torch.float32)
    q = torch.zeros(2, 5, dtype=torch.uint8)
    for gap_open, gap_extend in [(-1.0, -2.0), (-1.0, 0.5), (math.nan, -1.0), (-math.inf, -1.0)]:
        with pytest.raises(RuntimeError, match="gap_open <= gap_extend <= 0"):
            torch.ops.swcli.affine_scores(S, None, None, gap_open, gap_extend, 1.0)
        with pytest.raises(RuntimeError, match="gap_open <= gap_extend <= 0"):
            torch.ops.swcli.affine_scores_codes(q, q, torch.zeros(24, 24), None, None, gap_open, gap_extend, 1.0)
    with pytest.raises(RuntimeError, match="lane_columns"):
        torch.ops.swcli.affine_scores(S, None, None, -2.0, -0.5, 1.0, lane_columns=4)
    with pytest.raises(RuntimeError, match="query_lengths"):
        torch.ops.swcli.affine_forward(S, torch.tensor([6, 1]), None, -2.0, -0.5, 1.0, False)
    _, state, best, failed = torch.ops.swcli.affine_forward(S, None, None, -2.0, -0.5, 1.0, False)
    with pytest.raises(RuntimeError, match="state does not match"):
        torch.ops.swcli.affine_backward(torch.ones(2), S, state[:-1], best, failed, None, None, -2.0, -0.5, 1.0, False)
    with pytest.raises(RuntimeError, match="by rows is a CUDA scheme"):
        torch.ops.swcli.affine_forward(S, None, None, -2.0, -0.5, 1.0, True)
    with pytest.raises(RuntimeError, match="by rows is a CUDA scheme"):
        torch.ops.swcli.affine_backward(torch.ones(2), S, state, best, failed, None, None, -2.0, -0.5, 1.0, True)


# --------------------------------------------------------------------------------------------------
# Error paths: ValueError naming the problem

S_OK = torch.zeros(3, 5, 6)


@pytest.mark.parametrize("kwargs,message", [
    ({"gap_open": -1.0, "gap_extend": -2.0}, r"gap_open must be <= gap_extend .*got gap_open=-1.0, gap_extend=-2.0"),
    ({"gap_open": -1.0, "gap_extend": 0.5}, r"gap_extend must be <= 0 .*got 0.5"),
    ({"gap_open": 1.0, "gap_extend": 2.0}, r"gap_extend must be <= 0"),
    ({"gap_open": 0.5, "gap_extend": 0.0}, r"gap_open must be <= gap_extend"),
    ({"gap_open": math.nan, "gap_extend": -1.0}, r"gap_open must be a finite number, got nan"),
    ({"gap_open": -math.inf, "gap_extend": -1.0}, r"gap_open must be a finite number, got -inf"),
    ({"gap_open": -2.0, "gap_extend": math.nan}, r"gap_extend must be a finite number, got nan"),
    ({"gap_open": -2.0, "gap_extend": -math.inf}, r"gap_extend must be a finite number"),
    ({"gap_open": -2.0, "gap_extend": "-1"}, r"gap_extend must be a finite number"),
    ({"gap_open": True, "gap_extend": -1.0}, r"gap_open must be a finite number"),
    ({"gap_open": -2.0}, r"affine gaps need both gap_open and gap_extend: gap_open was given without gap_extend"),
    ({"gap_extend": -1.0}, r"affine gaps need both gap_open and gap_extend: gap_extend was given without gap_open"),
    ({"gap": -4.0, "gap_open": -11.0, "gap_extend": -1.0}, r"give either gap .* or gap_open and gap_extend"),
    ({"gap": -4.0, "gap_open": -11.0}, r"affine gaps need both"),
    ({"gap_open": -2.0, "gap_extend": -1.0, "temperature": -1.0}, r"temperature must be >= 0"),
    ({"gap_open": -2.0, "gap_extend": -1.0, "query_lengths": torch.tensor([1, 6, 2])},
     r"query_lengths must lie in \[0, 5\]"),
], ids=lambda x: repr(x)[:48] if isinstance(x, dict) else None)
def test_bad_gaps_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ssw(S_OK, **kwargs)
    query, target = torch.zeros(3, 5, dtype=torch.uint8), torch.zeros(3, 6, dtype=torch.uint8)
    with pytest.raises(ValueError, match=message):
        soft_smith_waterman_codes(query, target, torch.zeros(24, 24), **kwargs)


def test_module_checks_the_gaps():
    with pytest.raises(ValueError, match=r"gap_open must be <= gap_extend"):
        swcli.SoftSmithWaterman(gap_open=-1.0, gap_extend=-2.0)
    with pytest.raises(ValueError, match=r"gap_extend must be <= 0"):
        swcli.SoftSmithWaterman(gap_open=-1.0, gap_extend=1.0)
    with pytest.raises(ValueError, match=r"^gap_extend must be a finite number, got nan$"):
        swcli.SoftSmithWaterman(gap_open=-1.0, gap_extend=float("nan"))


def test_good_numbers_of_other_types_are_accepted():
    import numpy as np

    S = random_scores((2, 4, 5), seed=24_500)
    expected = ssw(S, None, 0.0, gap_open=-2.0, gap_extend=-1.0)
    assert torch.equal(ssw(S, None, 0, gap_open=-2, gap_extend=-1), expected)
    assert torch.equal(ssw(S, None, np.float32(0.0), gap_open=np.float64(-2.0), gap_extend=np.int64(-1)), expected)
    # the linear default is untouched: gap -1 when no gap is given
    assert torch.equal(ssw(S), ssw(S, -1.0, 1.0))
