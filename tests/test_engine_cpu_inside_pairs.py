"""The CPU engine's SIMD inside a pair: the striped int16 sweep (t = 0 from codes with an integer matrix
and gap) and the anti-diagonal strips (long pairs, t = 0 and t > 0), against Biopython, the float64
reference and the float64 engine; saturation, threads, padding, layouts and dtypes."""

from __future__ import annotations

import math
import random

import pytest
import torch

import swcli
from swcli.ops import load_engine, soft_smith_waterman_codes
from swcli.testing import (
    BLOSUM62,
    CpuEngineCalls,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    random_protein,
    random_protein_pairs,
    random_scores,
    related_protein_pairs,
    score_matrices,
)

ssw = swcli.soft_smith_waterman


class threads:
    """`with threads(n):` torch (and so the engine) runs on n threads inside."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.saved)


def long_pairs(seed: int):
    """Real-length pairs of every shape the kernels tell apart: both long (the striped sweep and the
    strips, either orientation), one side under 64 (across pairs), 1 x N and N x 1, empty."""
    rng = random.Random(seed)
    shapes = [(300, 300), (520, 130), (130, 700), (64, 64), (65, 1100), (1100, 70), (40, 900), (900, 31),
              (1, 500), (500, 1), (1, 1), (0, 80), (80, 0), (1031, 1030)]
    return [(random_protein(rng, q), random_protein(rng, t)) for q, t in shapes]


# --------------------------------------------------------------------------------------------------
# t = 0: exact scores (the striped int16 sweep, the hard strips, across pairs)


@pytest.mark.parametrize("gap", [-1.0, -4.0, -11.0])
def test_temperature_zero_equals_biopython_at_every_shape(gap):
    pairs = long_pairs(seed=20_000) + related_protein_pairs(seed=20_001, count=6, min_length=100, max_length=900)
    query, target, qlen, tlen, matrix = code_batch(pairs, pad_code=5)
    expected = [biopython_score(q, t, gap) if q and t else 0.0 for q, t in pairs]
    assert soft_smith_waterman_codes(query, target, matrix, gap, 0.0, qlen, tlen).tolist() == expected
    # dense scores: the hard strips and the sweep across pairs, the same floats
    S, _, _ = score_matrices(pairs, dtype=torch.float32)
    assert ssw(S, gap, 0.0, qlen, tlen, backend="cpu").tolist() == expected
    # a non-integer gap leaves the int16 sweep: the float sweeps from codes
    off = gap - 0.25
    assert soft_smith_waterman_codes(query, target, matrix, off, 0.0, qlen, tlen).tolist() == [
        biopython_score(q, t, off) if q and t else 0.0 for q, t in pairs]


def test_a_pair_past_ten_thousand_equals_biopython():
    rng = random.Random(20_100)
    query = random_protein(rng, 12_000)
    target = query[3_000:9_000] + random_protein(rng, 4_500)  # a long local alignment inside noise
    pairs = [(query, target)]
    q, t, qlen, tlen, matrix = code_batch(pairs)
    expected = biopython_score(query, target, -4.0)
    for n in (1, 2):
        with threads(n):
            assert soft_smith_waterman_codes(q, t, matrix, -4.0, 0.0, qlen, tlen).item() == expected


def test_a_search_query_shared_by_the_batch():
    rng = random.Random(20_200)
    query = random_protein(rng, 333)
    targets = [random_protein(rng, rng.randint(0, 700)) for _ in range(60)] + [query[20:300]]
    pairs = [(query, t) for t in targets]
    q, t, qlen, tlen, matrix = code_batch(pairs)
    shared = q[:1].expand_as(q)
    assert shared.stride(0) == 0
    out = soft_smith_waterman_codes(shared, t, matrix, -4.0, 0.0, qlen, tlen)
    assert out.tolist() == [biopython_score(query, s, -4.0) if s else 0.0 for s in targets]


@pytest.mark.parametrize("scale", [300, 3000])
def test_int16_saturation_is_scored_again_wider(scale):
    """BLOSUM62 x scale: scores past 32767 saturate int16; those pairs are scored again in float (exact
    below 2^24), the others keep their int16 scores. Self-alignments saturate, random pairs mostly not."""
    matrix = BLOSUM62 * scale
    pairs = related_protein_pairs(seed=20_300, count=4, min_length=200, max_length=1200, mutation_rate=0.1)
    pairs += random_protein_pairs(seed=20_301, count=4, min_length=100, max_length=400)
    pairs += [(pairs[0][0], pairs[0][0])]
    q, t, qlen, tlen, m = code_batch(pairs, matrix=matrix)
    gap = -4.0 * scale
    expected = [biopython_score(a, b, gap, matrix) for a, b in pairs]
    assert max(expected) > 32767 * 4  # several pairs saturated
    for n in (1, 2):
        with threads(n):
            out = soft_smith_waterman_codes(q, t, m, gap, 0.0, qlen, tlen)
        assert out.tolist() == expected


def test_entries_past_int16_take_the_float_sweeps():
    matrix = BLOSUM62 * 40_000  # entries up to 440,000: no int16 profile
    pairs = related_protein_pairs(seed=20_400, count=3, min_length=100, max_length=300)
    q, t, qlen, tlen, m = code_batch(pairs, matrix=matrix)
    expected = [biopython_score(a, b, -8.0, matrix) for a, b in pairs]
    assert soft_smith_waterman_codes(q, t, m, -8.0, 0.0, qlen, tlen).tolist() == expected


def test_a_positive_gap_takes_the_float_sweeps():
    pairs = random_protein_pairs(seed=20_500, count=4, min_length=100, max_length=200)
    q, t, qlen, tlen, m = code_batch(pairs)
    S, _, _ = score_matrices(pairs, dtype=torch.float64)
    out = soft_smith_waterman_codes(q, t, m, 0.5, 0.0, qlen, tlen)
    assert out.tolist() == ssw(S, 0.5, 0.0, qlen, tlen, backend="cpu").tolist()


@pytest.mark.parametrize("gap_open,gap_extend", [(-12.0, -1.0), (-10.0, -2.0), (-4.0, -4.0)])
def test_affine_temperature_zero_equals_biopython(gap_open, gap_extend):
    """Affine gaps at t = 0 from codes: the striped sweep with E and F (and its lazy F loop, which must
    carry a gap down past rows whose H it does not change), a shared query, and the short pairs across."""
    pairs = long_pairs(seed=20_600) + related_protein_pairs(seed=20_601, count=4, min_length=300, max_length=2500)
    q, t, qlen, tlen, m = code_batch(pairs, pad_code=3)
    out = soft_smith_waterman_codes(q, t, m, None, 0.0, qlen, tlen, gap_open=gap_open, gap_extend=gap_extend)
    expected = [biopython_score(a, b, gap_open, gap_extend=gap_extend) if a and b else 0.0 for a, b in pairs]
    assert out.tolist() == expected
    query = pairs[0][0]
    shared = [(query, b) for _, b in pairs]
    q, t, qlen, tlen, m = code_batch(shared)
    out = soft_smith_waterman_codes(q[:1].expand_as(q), t, m, None, 0.0, qlen, tlen, gap_open=gap_open,
                                    gap_extend=gap_extend)
    assert out.tolist() == [biopython_score(a, b, gap_open, gap_extend=gap_extend) if b else 0.0 for a, b in shared]


def test_affine_int16_saturation_is_scored_again_wider():
    matrix = BLOSUM62 * 300
    pairs = related_protein_pairs(seed=20_700, count=3, min_length=300, max_length=900, mutation_rate=0.1)
    pairs += random_protein_pairs(seed=20_701, count=3, min_length=100, max_length=300)
    q, t, qlen, tlen, m = code_batch(pairs, matrix=matrix)
    expected = [biopython_score(a, b, -3600.0, matrix, gap_extend=-300.0) for a, b in pairs]
    assert max(expected) > 32767 * 4
    out = soft_smith_waterman_codes(q, t, m, None, 0.0, qlen, tlen, gap_open=-3600.0, gap_extend=-300.0)
    assert out.tolist() == expected


def test_a_long_pair_on_threads_that_run_one_after_the_other():
    """torch asks for 2 threads but OpenMP gives 1 (OMP_THREAD_LIMIT=1): at::parallel_for then runs the
    threads' work in one thread, in order; the pair's strips and chunks must still all be swept (a strip
    fixed to a thread waited there for one that could not start). In a child process, with a time limit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    program = """
import random, torch
torch.set_num_threads(2)
from swcli.ops import soft_smith_waterman_codes as op
from swcli.testing import code_batch
rng = random.Random(3)
pairs = [tuple("".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(n)) for n in (1500, 1400))]
q, t, ql, tl, m = code_batch(pairs)
print(op(q, t, m, -4.0, 1.0).item(), op(q, t, m, -4.0, 0.0).item(), op(q, t, m, -4.25, 0.0).item())
"""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "OMP_THREAD_LIMIT": "1", "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with threads(1):
        rng = random.Random(3)
        pair = [tuple("".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(n)) for n in (1500, 1400))]
        q, t, qlen, tlen, m = code_batch(pair)
        expected = [soft_smith_waterman_codes(q, t, m, gap, temperature).item()
                    for gap, temperature in ((-4.0, 1.0), (-4.0, 0.0), (-4.25, 0.0))]
    assert [float(x) for x in done.stdout.split()] == expected


# --------------------------------------------------------------------------------------------------
# t > 0: the soft strips


class TestSoftStrips(CpuEngineCalls):
    """float32 at t > 0, long pairs: strips of 64 rows along anti-diagonals, an exponent per cell."""

    @pytest.mark.parametrize("t", [0.5, 1.0, 4.0])
    def test_close_to_the_float64_reference(self, t):
        # pairs the strips take (128 x 128, 64 x 500, both orientations) beside pairs across pairs
        rng = random.Random(20_600)
        shapes = [(128, 128), (64, 150), (150, 64), (3, 120), (1, 1)]
        pairs = [(random_protein(rng, a), random_protein(rng, b)) for a, b in shapes]
        S, qlen, tlen = score_matrices(pairs, dtype=torch.float32)
        out, to_log = self.dense(S, qlen, tlen, -4.0, t)
        assert to_log == 0
        assert_close_to_reference(out, S, -4.0, t, qlen, tlen)
        q, tg, ql, tl, m = code_batch(pairs)
        from_codes, _ = self.codes(q, tg, ql, tl, m, -4.0, t)
        assert_close_to_reference(from_codes, S, -4.0, t, qlen, tlen)

    @pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
    @pytest.mark.parametrize("gap", [-1.0, -4.0, -11.0])
    def test_closer_to_float64_than_log_space_on_long_related_pairs(self, gap, t):
        pairs = related_protein_pairs(seed=20_700, count=3, min_length=600, max_length=1500)
        pairs += random_protein_pairs(seed=20_701, count=2, min_length=300, max_length=1200)
        S, qlen, tlen = score_matrices(pairs, dtype=torch.float64)
        exact, _ = self.dense(S, qlen, tlen, gap, t)
        strips, _ = self.dense(S.float(), qlen, tlen, gap, t)  # dense: the strips for pairs of 2^20 cells
        log, _ = self.dense(S.float(), qlen, tlen, gap, t, scaled=False)
        relative = lambda x: ((x.double() - exact).abs() / exact.abs().clamp_min(1)).max().item()  # noqa: E731
        assert relative(strips) <= max(relative(log), 2e-7)
        q, tg, ql, tl, m = code_batch(pairs)
        assert relative(self.codes(q, tg, ql, tl, m, gap, t)[0]) <= max(relative(log), 2e-7)

    def test_a_pair_alone_padded_or_transposed_and_threads_give_the_same_bits(self):
        pairs = related_protein_pairs(seed=20_800, count=3, min_length=200, max_length=2500)
        S, qlen, tlen = score_matrices(pairs, dtype=torch.float32, pad=7.0)
        with threads(1):
            batch, _ = self.dense(S, qlen, tlen, -4.0, 1.0)
        for b in range(len(pairs)):
            alone = S[b : b + 1, : qlen[b], : tlen[b]].contiguous()
            for n in (1, 2):  # one thread, or the pair's strips relayed between two
                with threads(n):
                    assert self.dense(alone, None, None, -4.0, 1.0)[0].item() == batch[b].item()
            # a strided view: the same scores read with other strides
            wide = torch.zeros(1, alone.shape[2], alone.shape[1]).transpose(1, 2)
            wide.copy_(alone)
            assert not wide.is_contiguous()
            assert self.dense(wide, None, None, -4.0, 1.0)[0].item() == batch[b].item()

    def test_nan_and_infinite_scores_keep_their_meaning(self):
        # dense pairs take the strips from 2^20 cells
        B, M, N = 4, 1030, 1025
        S = random_scores((B, M, N), seed=20_900, dtype=torch.float32, scale=2.0)
        clean, _ = self.dense(S, None, None, -1.0, 1.0)
        S[1, 1000, 20] = float("nan")
        S[2, 3, 1020] = float("inf")
        S[3, 10:600, 10:600] = -float("inf")  # contributes nothing: stays in the strips
        out, _ = self.dense(S, None, None, -1.0, 1.0)
        assert out[0].item() == clean[0].item()
        assert math.isnan(out[1].item()) and out[2].item() == math.inf
        exact, _ = self.dense(S[3:].double(), None, None, -1.0, 1.0)
        torch.testing.assert_close(out[3:].double(), exact, rtol=1e-6, atol=1e-4)

    def test_scores_past_the_cells_range_leave_for_the_sweeps_across_pairs(self):
        # S c past 50 (a score of 40 at t = 0.5) in a pair the strips take: it is scored across pairs
        S = random_scores((2, 1030, 1025), seed=21_000, dtype=torch.float32)
        S[0, 700, 700] = 40.0
        out, _ = self.dense(S, None, None, -1.0, 0.5)
        exact, _ = self.dense(S.double(), None, None, -1.0, 0.5)
        torch.testing.assert_close(out.double(), exact, rtol=1e-6, atol=1e-4)
        # a matrix with an infinite entry keeps every pair of the call across pairs, with its meaning
        pairs = random_protein_pairs(seed=21_001, count=2, min_length=130, max_length=200)
        q, tg, ql, tl, m = code_batch(pairs)
        m[0, :] = -math.inf  # A scores -inf against everything
        S = m[q.long()[:, :, None], tg.long()[:, None, :]]
        torch.testing.assert_close(self.codes(q, tg, ql, tl, m, -1.0, 1.0)[0].double(),
                                   self.dense(S, ql, tl, -1.0, 1.0)[0], rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_dtype_on_a_long_pair(dtype):
    S = random_scores((1, 300, 257), seed=21_100, dtype=torch.float32, scale=1.5).to(dtype)
    out = ssw(S, -1.0, 1.0, backend="cpu")
    assert out.dtype == dtype
    exact = ssw(S.double(), -1.0, 1.0, backend="cpu")  # float64: the log-space sweep across pairs
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 0.5)  # half precision: the output rounding
    torch.testing.assert_close(out.double(), exact, rtol=0, atol=tolerance * max(1.0, exact.abs().max().item()))


# --------------------------------------------------------------------------------------------------
# Gradients of long pairs: the strips write the DP table the backward reads


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_gradient_of_a_long_pair_against_float64(t):
    """The float32 gradient within max(1e-4, twice the log-space float32 engine's error) of the float64
    engine's, on a pair too long for the reference loop (dense pairs take the strips from 2^20 cells),
    beside a short one; the scores the same bits as without gradient."""
    pairs = related_protein_pairs(seed=21_200, count=1, min_length=1100, max_length=1100)
    pairs += related_protein_pairs(seed=21_201, count=1, min_length=300, max_length=400)
    S, qlen, tlen = score_matrices(pairs, dtype=torch.float64)
    assert qlen[0] * tlen[0] >= 1 << 20
    grad_out = torch.tensor([1.0, 0.5], dtype=torch.float64)

    def gradient(S, **knobs):
        S = S.clone().requires_grad_()
        load_engine("cpu")
        scores, state, best, failed = torch.ops.swcli.forward(S, qlen, tlen, -4.0, t, False, **knobs)
        grad = torch.ops.swcli.backward(grad_out.to(S.dtype), S, state, best, failed, qlen, tlen, -4.0, t, False)
        return scores, grad

    exact_scores, exact = gradient(S)
    scores, grad = gradient(S.float())
    _, log_grad = gradient(S.float(), scaled=False)
    assert torch.equal(scores, ssw(S.float(), -4.0, t, qlen, tlen, backend="cpu"))
    if t == 0:
        assert torch.equal(grad.double(), exact)  # the indicator of the same alignment
    else:
        error = (grad.double() - exact).abs().max().item()
        assert error <= max(1e-4, 2 * (log_grad.double() - exact).abs().max().item())
    assert grad.min() >= 0  # and at most 1 + error: the float64 gradient's entries lie in [0, 1]
