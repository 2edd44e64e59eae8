"""The CPU engine called directly (past the op): codes against dense scores, and the float32 scaled sweep."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli import ops
from swcli.ops import soft_smith_waterman_codes
from swcli.testing import (
    TEMPERATURES,
    CpuEngineCalls,
    assert_close_to_reference,
    code_batch,
    random_lengths,
    random_protein_pairs,
    random_scores,
    related_protein_pairs,
    score_matrices,
)

ssw = swcli.soft_smith_waterman


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
    ops.load_engine("cpu")
    log_codes = torch.ops.swcli.scores_codes(query, target, matrix, qlen, tlen, -1.0, t, scaled=False)
    log_dense = torch.ops.swcli.scores(S, qlen, tlen, -1.0, t, scaled=False)
    assert torch.equal(log_codes, log_dense)
    if t == 0:
        assert torch.equal(out, log_codes) and torch.equal(out, ssw(S, -1.0, t, qlen, tlen, backend="cpu"))
    else:
        torch.testing.assert_close(out, log_codes, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(ssw(S, -1.0, t, qlen, tlen, backend="cpu"), log_dense, rtol=1e-6, atol=1e-5)


class TestCpuScaledSweep(CpuEngineCalls):
    """float32 on the CPU without the DP table at t > 0: the scaled sweep (E = 2^(H c), scaled per block
    of 4 columns of a lane), and the log-space sweep for the pairs it cannot hold."""

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


@pytest.mark.parametrize("temperature", [-1.0, math.inf, math.nan])
def test_the_operators_refuse_a_temperature_that_is_not_finite_and_non_negative(temperature):
    # called directly, past soft_smith_waterman's checks (a scripted module, a saved program)
    ops.load_engine("cpu")
    S = random_scores((2, 4, 5), seed=41)
    with pytest.raises(RuntimeError, match=r"temperature must be finite and >= 0, got"):
        torch.ops.swcli.scores(S, None, None, -1.0, temperature)
    with pytest.raises(RuntimeError, match=r"temperature must be finite and >= 0, got"):
        torch.ops.swcli.affine_scores(S, None, None, -2.0, -0.5, temperature)
