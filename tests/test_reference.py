"""The reference loop itself (swcli/reference.py), the ground truth, against independent oracles."""

# The ground truth must be right before anything is checked against it. Oracles here: hand-computed
# cases, a scalar pure-Python transcription of the recurrence, and Biopython at temperature 0.

from __future__ import annotations

import math

import pytest
import torch

from swcli.reference import (
    SoftSmithWatermanReference,
    soft_smith_waterman_affine_reference,
    soft_smith_waterman_reference,
)
from swcli.testing import (
    AFFINE_GAPS,
    biopython_score,
    example_protein_pairs,
    random_lengths,
    random_protein_pairs,
    random_scores,
    related_protein_pairs,
    score_matrices,
)

ref = soft_smith_waterman_reference


def scalar_soft_smith_waterman(S, gap: float, t: float) -> float:
    """The recurrence, one pair, in plain Python floats (math.log/exp): independent of torch."""
    M = len(S)
    N = len(S[0]) if M else 0
    H = [[0.0] * (N + 1) for _ in range(M + 1)]
    best = 0.0
    for i in range(1, M + 1):
        for j in range(1, N + 1):
            x = (0.0, H[i - 1][j - 1] + S[i - 1][j - 1], H[i - 1][j] + gap, H[i][j - 1] + gap)
            m = max(x)
            H[i][j] = m if t == 0 else m + t * math.log(sum(math.exp((v - m) / t) for v in x))
            best = max(best, H[i][j])
    return best


# --------------------------------------------------------------------------------------------------
# Sizes zero


@pytest.mark.parametrize("t", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 0, 4), (2, 3, 0), (0, 0, 0)])
def test_zero_size_gives_zero(shape, t):
    S = torch.full(shape, 5.0, dtype=torch.float64)
    out = ref(S, -1.0, t)
    assert out.shape == (shape[0],)
    assert torch.equal(out, torch.zeros(shape[0], dtype=torch.float64))


@pytest.mark.parametrize("affine_gaps", [False, True], ids=["linear", "affine"])
@pytest.mark.parametrize("shape", [(2, 0, 4), (2, 3, 0)])
def test_zero_size_is_differentiable_with_zero_gradients(shape, affine_gaps):
    """No cells: the scores still depend on the inputs (each gradient 0), as on the engines, so a training
    step on such a batch runs."""
    S = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    gap = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1.0, 0.5], dtype=torch.float64, requires_grad=True)
    out = affine(S, gap, -0.5, t) if affine_gaps else ref(S, gap, t)
    grads = torch.autograd.grad(out.sum(), (S, gap, t))
    assert torch.equal(out, torch.zeros(2, dtype=torch.float64))
    assert grads[0].shape == shape and all(torch.equal(g, torch.zeros_like(g)) for g in grads)


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_zero_lengths_give_zero(t):
    S = torch.full((3, 4, 5), 7.0, dtype=torch.float64)
    out = ref(S, -1.0, t, torch.tensor([0, 4, 2]), torch.tensor([5, 0, 3]))
    assert out[0].item() == 0.0 and out[1].item() == 0.0
    assert out[2].item() > 7.0  # the non-empty pair still scores


# --------------------------------------------------------------------------------------------------
# Hand-computed cases


@pytest.mark.parametrize("s", [-3.0, -0.25, 0.0, 0.5, 2.0, 7.0])
@pytest.mark.parametrize("gap", [-1.0, -4.0])
def test_one_by_one_hard(s, gap):
    out = ref(torch.tensor([[[s]]], dtype=torch.float64), gap, 0.0)
    assert out.item() == max(0.0, s)


@pytest.mark.parametrize("s", [-3.0, 0.0, 2.0])
@pytest.mark.parametrize("gap", [-0.5, -4.0])
@pytest.mark.parametrize("t", [0.1, 1.0, 10.0])
def test_one_by_one_soft(s, gap, t):
    # H[1][1] = t log(e^0 + e^(s/t) + 2 e^(g/t)) (match from H00, delete from H01, insert from H10);
    # it is >= 0, so it is also the max over the table with its zero border.
    expected = t * math.log(1.0 + math.exp(s / t) + 2.0 * math.exp(gap / t))
    out = ref(torch.tensor([[[s]]], dtype=torch.float64), gap, t)
    assert out.item() == pytest.approx(expected, rel=1e-14, abs=1e-14)


def test_hand_cases_hard():
    # 1x3 [5, -10, 5], g = -1: H = 5, max(0, -10, -1, 4) = 4, max(0, 5, -1, 3) = 5.
    S = torch.tensor([[[5.0, -10.0, 5.0]]], dtype=torch.float64)
    assert ref(S, -1.0, 0.0).item() == 5.0
    # Query AB against target AXB, match 3, mismatch -5, g = -1: 3 + 3 - 1 through one gap.
    S = torch.tensor([[[3.0, -5.0, -5.0], [-5.0, -5.0, 3.0]]], dtype=torch.float64)
    assert ref(S, -1.0, 0.0).item() == 5.0
    # The same with a gap of -4 no longer pays: the best is a single match.
    assert ref(S, -4.0, 0.0).item() == 3.0
    # Diagonal [[1, -1], [-1, 1]]: H22 = H11 + 1 = 2.
    S = torch.tensor([[[1.0, -1.0], [-1.0, 1.0]]], dtype=torch.float64)
    assert ref(S, -1.0, 0.0).item() == 2.0
    # All negative: the empty alignment, 0.
    assert ref(-torch.ones(1, 3, 3, dtype=torch.float64), -1.0, 0.0).item() == 0.0


def test_two_by_two_soft_by_hand():
    s11, s12, s21, s22, g, t = 1.0, -1.0, -1.0, 1.0, -1.0, 1.0
    lse = lambda *x: t * math.log(sum(math.exp(v / t) for v in x))  # noqa: E731
    h11 = lse(0.0, s11, g, g)
    h12 = lse(0.0, s12, g, h11 + g)
    h21 = lse(0.0, s21, h11 + g, g)
    h22 = lse(0.0, h11 + s22, h12 + g, h21 + g)
    expected = max(0.0, h11, h12, h21, h22)
    S = torch.tensor([[[s11, s12], [s21, s22]]], dtype=torch.float64)
    assert ref(S, g, t).item() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 5.0])
def test_matches_scalar_transcription(t):
    S = random_scores((6, 7, 5), seed=11, scale=2.0)
    out = ref(S, -0.7, t)
    for b in range(S.shape[0]):
        expected = scalar_soft_smith_waterman(S[b].tolist(), -0.7, t)
        assert out[b].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------------------------------
# Lengths and padding


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_lengths_score_the_sliced_matrix(t):
    B, M, N = 7, 9, 11
    S = random_scores((B, M, N), seed=21)
    qlen = random_lengths(B, M, seed=22)
    tlen = random_lengths(B, N, seed=23)
    out = ref(S, -1.0, t, qlen, tlen)
    for b in range(B):
        alone = ref(S[b : b + 1, : qlen[b], : tlen[b]], -1.0, t)
        assert out[b].item() == alone.item(), f"pair {b} ({qlen[b]}x{tlen[b]})"


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_only_one_length_given(t):
    S = random_scores((3, 6, 8), seed=31)
    qlen = torch.tensor([2, 6, 4])
    out_q = ref(S, -1.0, t, query_lengths=qlen)
    out_t = ref(S, -1.0, t, target_lengths=qlen)
    for b in range(3):
        assert out_q[b].item() == ref(S[b : b + 1, : qlen[b]], -1.0, t).item()
        assert out_t[b].item() == ref(S[b : b + 1, :, : qlen[b]], -1.0, t).item()


@pytest.mark.parametrize("junk", [float("nan"), float("inf"), float("-inf"), 1e6])
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_padding_outside_the_window_is_ignored(junk, t):
    B, M, N = 5, 8, 9
    S = random_scores((B, M, N), seed=41)
    qlen = random_lengths(B, M, seed=42, low=1)
    tlen = random_lengths(B, N, seed=43, low=1)
    clean = ref(S, -1.0, t, qlen, tlen)
    padded = S.clone()
    rows = torch.arange(M).view(1, M, 1) >= qlen.view(B, 1, 1)
    cols = torch.arange(N).view(1, 1, N) >= tlen.view(B, 1, 1)
    padded[rows | cols] = junk
    assert (rows | cols).any()
    out = ref(padded, -1.0, t, qlen, tlen)
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)
    # nor the gradients: the padding's own are 0, the rest those of the clean matrix
    for run in (lambda S: ref(S, -1.0, t, qlen, tlen), lambda S: affine(S, -2.0, -0.5, t, qlen, tlen)):
        clean_S = S.clone().requires_grad_()
        (expected,) = torch.autograd.grad(run(clean_S).sum(), clean_S)
        junk_S = padded.clone().requires_grad_()
        (got,) = torch.autograd.grad(run(junk_S).sum(), junk_S)
        assert torch.equal(got, expected) and torch.equal(got[rows | cols], torch.zeros_like(got[rows | cols]))


def test_nan_inside_the_window_poisons_that_pair_only():
    S = random_scores((4, 5, 6), seed=51)
    S[2, 1, 3] = float("nan")
    out = ref(S, -1.0, 1.0)
    assert torch.isnan(out[2])
    assert torch.isfinite(out[[0, 1, 3]]).all()


# --------------------------------------------------------------------------------------------------
# Temperature 0 against Biopython: exact in float64


@pytest.mark.parametrize("gap", [-0.5, -1.0, -4.0])
def test_temperature_zero_equals_biopython(gap):
    pairs = random_protein_pairs(seed=61, count=6, min_length=1, max_length=40)
    pairs += related_protein_pairs(seed=62, count=6, min_length=20, max_length=40)
    S, qlen, tlen = score_matrices(pairs, pad=float("nan"))
    out = ref(S, gap, 0.0, qlen, tlen)
    for b, (q, t) in enumerate(pairs):
        assert out[b].item() == biopython_score(q, t, gap), f"pair {b}: {q} / {t}"


# --------------------------------------------------------------------------------------------------
# Properties of the ground truth


def test_soft_decreases_to_hard():
    S = random_scores((4, 10, 12), seed=71)
    hard = ref(S, -1.0, 0.0)
    previous = None
    for t in [2.0, 1.0, 0.1, 0.01]:
        soft = ref(S, -1.0, t)
        assert (soft >= hard).all()
        assert (soft - hard <= t * math.log(4.0) * (10 + 12)).all()
        if previous is not None:
            assert (soft <= previous).all()
        previous = soft


def test_reference_gradient_lies_in_unit_interval():
    S = random_scores((3, 6, 7), seed=81).requires_grad_()
    ref(S, -1.0, 1.0).sum().backward()
    assert (S.grad >= 0).all() and (S.grad <= 1).all()
    assert (S.grad > 0).any()


@pytest.mark.parametrize("gap_open,t", [(-1.0, 1.0), (-0.5, 0.0), (-4.0, 0.2)])
def test_seed_module_is_the_function(gap_open, t):
    S = random_scores((5, 6, 7), seed=91)
    module = SoftSmithWatermanReference() if (gap_open, t) == (-1.0, 1.0) else \
        SoftSmithWatermanReference(gap_open, t)
    assert torch.equal(module(S), ref(S, gap_open, t))


# --------------------------------------------------------------------------------------------------
# Affine gaps (soft Gotoh): the affine reference loop against its own oracles

affine = soft_smith_waterman_affine_reference


def scalar_soft_gotoh(S, gap_open: float, gap_extend: float, t: float) -> float:
    """The affine recurrence as written, nested soft maxima and all, one pair, in plain Python floats:
    independent of torch and of the reference's four-term form of X and Y."""
    inf = float("inf")

    def smax(*x):
        m = max(x)
        if t == 0 or m == -inf:
            return m
        return m + t * math.log(sum(math.exp((v - m) / t) for v in x))

    M = len(S)
    N = len(S[0]) if M else 0
    H = [[0.0] * (N + 1) for _ in range(M + 1)]
    match = [[-inf] * (N + 1) for _ in range(M + 1)]
    X = [[-inf] * (N + 1) for _ in range(M + 1)]
    Y = [[-inf] * (N + 1) for _ in range(M + 1)]
    best = 0.0
    for i in range(1, M + 1):
        for j in range(1, N + 1):
            match[i][j] = H[i - 1][j - 1] + S[i - 1][j - 1]
            X[i][j] = smax(smax(0.0, match[i][j - 1], Y[i][j - 1]) + gap_open, X[i][j - 1] + gap_extend)
            Y[i][j] = smax(smax(0.0, match[i - 1][j], X[i - 1][j]) + gap_open, Y[i - 1][j] + gap_extend)
            H[i][j] = smax(0.0, match[i][j], X[i][j], Y[i][j])
            best = max(best, H[i][j])
    return best


@pytest.mark.parametrize("t", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 0, 4), (2, 3, 0), (0, 0, 0)])
def test_affine_zero_size_gives_zero(shape, t):
    out = affine(torch.full(shape, 5.0, dtype=torch.float64), -3.0, -1.0, t)
    assert out.shape == (shape[0],) and torch.equal(out, torch.zeros(shape[0], dtype=torch.float64))


@pytest.mark.parametrize("s", [-3.0, 0.0, 2.0])
@pytest.mark.parametrize("t", [0.0, 0.1, 1.0, 10.0])
def test_affine_one_by_one(s, t):
    # X[1][1] = Y[1][1] = o (a gap opened from the start), so H[1][1] = smax(0, s, o, o): the linear cell
    # with g = o, whatever e.
    o = -2.0
    expected = max(0.0, s) if t == 0 else t * math.log(1.0 + math.exp(s / t) + 2.0 * math.exp(o / t))
    out = affine(torch.tensor([[[s]]], dtype=torch.float64), o, -0.5, t)
    assert out.item() == pytest.approx(expected, rel=1e-14, abs=1e-14)


def test_affine_hand_cases_hard():
    # Query AB against target AXXB, match 5, mismatch -10: A, a gap of 2, B scores 5 + o + e + 5.
    S = torch.tensor([[[5.0, -10.0, -10.0, -10.0], [-10.0, -10.0, -10.0, 5.0]]], dtype=torch.float64)
    assert affine(S, -3.0, -1.0, 0.0).item() == 6.0
    assert affine(S, -4.0, -0.5, 0.0).item() == 5.5
    # a linear gap of -3 a position does not pay for it: one match alone
    assert ref(S, -3.0, 0.0).item() == 5.0
    assert affine(S, -3.0, -3.0, 0.0).item() == 5.0
    # all negative: the empty alignment, 0
    assert affine(-torch.ones(1, 3, 3, dtype=torch.float64), -1.0, -0.5, 0.0).item() == 0.0


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("gap_open,gap_extend", [(-2.0, -0.5), (-1.0, -1.0), (-5.0, 0.0)])
def test_affine_matches_the_nested_recurrence(t, gap_open, gap_extend):
    S = random_scores((5, 7, 6), seed=111, scale=2.0)
    out = affine(S, gap_open, gap_extend, t)
    for b in range(S.shape[0]):
        expected = scalar_soft_gotoh(S[b].tolist(), gap_open, gap_extend, t)
        assert out[b].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("gap", [-0.5, -4.0])
def test_affine_with_equal_gaps_is_the_linear_recurrence(t, gap):
    S = random_scores((6, 8, 9), seed=121, scale=1.5)
    qlen, tlen = random_lengths(6, 8, seed=122), random_lengths(6, 9, seed=123)
    torch.testing.assert_close(affine(S, gap, gap, t, qlen, tlen), ref(S, gap, t, qlen, tlen), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_affine_lies_between_the_linear_scores_of_its_two_gaps(t):
    # Every alignment scores at least as much with (o, e) as with a linear o, and at most as much as with
    # a linear e (e >= o for every gap position after the first); the soft score is a sum over the same
    # alignments, so it keeps the order.
    S = random_scores((6, 9, 8), seed=131)
    low, mid, high = ref(S, -1.5, t), affine(S, -1.5, -0.3, t), ref(S, -0.3, t)
    assert (low <= mid + 1e-12).all() and (mid <= high + 1e-12).all()
    assert (mid < high).any()
    if t > 0:  # every alignment counts, so every pair's gaps do (at t = 0 only the best one's)
        assert (mid > low).all()


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_affine_lengths_score_the_sliced_matrix(t):
    B, M, N = 6, 8, 9
    S = random_scores((B, M, N), seed=141)
    qlen, tlen = random_lengths(B, M, seed=142), random_lengths(B, N, seed=143)
    out = affine(S, -2.0, -0.5, t, qlen, tlen)
    for b in range(B):
        assert out[b].item() == affine(S[b : b + 1, : qlen[b], : tlen[b]], -2.0, -0.5, t).item()


@pytest.mark.parametrize("junk", [float("nan"), float("inf"), 1e6])
def test_affine_padding_outside_the_window_is_ignored(junk):
    B, M, N = 4, 7, 8
    S = random_scores((B, M, N), seed=151)
    qlen, tlen = random_lengths(B, M, seed=152, low=1), random_lengths(B, N, seed=153, low=1)
    padded = S.clone()
    rows = torch.arange(M).view(1, M, 1) >= qlen.view(B, 1, 1)
    outside = rows | (torch.arange(N).view(1, 1, N) >= tlen.view(B, 1, 1))
    padded[outside] = junk
    assert torch.equal(affine(padded, -2.0, -0.5, 1.0, qlen, tlen), affine(S, -2.0, -0.5, 1.0, qlen, tlen))


def test_affine_nan_poisons_that_pair_only():
    S = random_scores((3, 5, 6), seed=161)
    S[1, 2, 3] = float("nan")
    out = affine(S, -2.0, -0.5, 1.0)
    assert torch.isnan(out[1]) and torch.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("gap_open,gap_extend", AFFINE_GAPS)
def test_affine_temperature_zero_equals_biopython(gap_open, gap_extend):
    # real proteins, cut short (the loop is slow), and mutated copies, whose alignments go through gaps
    pairs = [(q[:40], t[:40]) for q, t in example_protein_pairs(4, seed=171)]
    pairs += related_protein_pairs(seed=172, count=4, min_length=20, max_length=40)
    S, qlen, tlen = score_matrices(pairs, pad=float("nan"))
    out = affine(S, gap_open, gap_extend, 0.0, qlen, tlen)
    for b, (q, t) in enumerate(pairs):
        assert out[b].item() == biopython_score(q, t, gap_open, gap_extend=gap_extend), f"pair {b}: {q} / {t}"


def test_affine_soft_decreases_to_hard():
    S = random_scores((4, 9, 10), seed=181)
    hard = affine(S, -2.0, -0.5, 0.0)
    previous = None
    for t in [2.0, 1.0, 0.1, 0.01]:
        soft = affine(S, -2.0, -0.5, t)
        assert (soft >= hard).all()
        if previous is not None:
            assert (soft <= previous).all()
        previous = soft
    assert (previous - hard).abs().max().item() < 0.1


def test_affine_reference_gradient_lies_in_unit_interval():
    S = random_scores((3, 6, 7), seed=191).requires_grad_()
    affine(S, -2.0, -0.5, 1.0).sum().backward()
    assert (S.grad >= 0).all() and (S.grad <= 1).all() and (S.grad > 0).any()


@pytest.mark.parametrize("affine", [False, True], ids=["linear", "affine"])
@pytest.mark.parametrize("t", [0.0, 0.7])
def test_vmap_over_batches_is_each_batch_alone(affine, t):
    """torch.vmap over a batch of batches, with lengths and per-pair temperatures of their own: each
    batch's scores as the loop gives them alone (the loop writes no cell in place, which vmap refuses)."""
    S = random_scores((3, 4, 6, 5), seed=390)
    qlen = torch.stack([random_lengths(4, 6, seed=391 + v) for v in range(3)])
    temperature = torch.full((3, 4), t, dtype=torch.float64)
    temperature[:, 1] = 1.3

    def scores(S, qlen, temperature):
        if affine:
            return soft_smith_waterman_affine_reference(S, -2.0, -0.5, temperature, qlen)
        return ref(S, -1.0, temperature, qlen)

    batched = torch.vmap(scores)(S, qlen, temperature)
    alone = torch.stack([scores(S[v], qlen[v], temperature[v]) for v in range(3)])
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-12)
    assert batched[:, 1].gt(0).all()
