"""The CUDA forward kernels on dense scores: long pairs, 1- and 4-column lanes, the scaled sweep and its fallback."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli.ops import soft_smith_waterman_codes
from swcli.testing import (
    DTYPES,
    DTYPE_PARAMS,
    CudaEngineCalls,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    cuda,
    dtype_id,
    random_lengths,
    random_scores,
    related_protein_pairs,
    requires_cuda,
    score_matrices,
    slow,
    slow_unless,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaForwardDense(CudaEngineCalls):
    """The dense forward (with and without the DP table) against Biopython, the reference and the CPU engine."""

    # float64 is slow: 2.5 GB of scores built on the host
    @pytest.mark.parametrize("dtype", slow_unless(DTYPES, [torch.float32]), ids=dtype_id)
    def test_temperature_zero_equals_biopython_long(self, dtype):
        pairs = related_protein_pairs(seed=9200, count=2, min_length=1500, max_length=1500)
        pairs += related_protein_pairs(seed=9201, count=1, min_length=10_200, max_length=10_200,
                                       mutation_rate=0.1)
        S, qlen, tlen = score_matrices(pairs, dtype=dtype, device=self.device)
        out = ssw(S, -4.0, 0.0, qlen.cuda(), tlen.cuda(), backend="cuda").cpu().tolist()
        assert out == [biopython_score(q, t, -4.0) for q, t in pairs]

    # -- no length cap: one warp per pair walks any number of column tiles and rows

    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("shape", slow_unless([(1, 20_000), (20_000, 1), (3, 9_000)], [(1, 20_000), (20_000, 1)]),
                             ids=["1x20000", "20000x1", "3x9000"])
    def test_thin_long_pairs(self, shape, t):
        S = random_scores((2, *shape), seed=9500, dtype=torch.float32, device=self.device)
        assert_close_to_reference(ssw(S, -1.0, t, backend="cuda"), S, -1.0, t)

    @slow  # the float64 CPU engine on one 5000 x 5000 pair: seconds on one core
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

    @slow  # 1.2e9 cells twice, and 4.9 GB of dense scores
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
        # (cell_from_up in kernels/cuda/common.cuh): a term past 2^128 makes the pair's best cell inf or NaN,
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

    # -- the scaled sweep (float at t > 0 with 4 columns per lane, dense and from codes, no DP table:
    #    kernels/cuda/forward_scaled.cuh), and its fallback to the log-space sweep

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

    # Settings of benchmarks/fuzz_scaled.py cuda (seed 1: trial, M, N, t, gap, scale; 1100 pairs) where the
    # scaled sweep was wrong. The first 7: a factor below the float range, flushed to 0 (a left neighbour
    # far below the lane's scale, the first tile's border), that times a large P was the largest term of
    # its cell: off by 4e-3 to 0.23 relative. The last 2: H small at a large t, where sigma + lg2(stored)
    # cancelled: 4.6e-6 and 1.07e-5.
    CUDA_FUZZ = [(7, 47, 8, 1.0, -0.1, 20.0), (61, 21, 11, 0.7, 0.0, 20.0), (280, 60, 33, 1.0, -1.0, 20.0),
                 (147, 14, 136, 0.2, -0.1, 5.0), (140, 53, 3, 0.4, -1.0, 20.0), (20, 33, 59, 0.05, -0.1, 1.0),
                 (88, 50, 39, 0.2, -1.0, 5.0), (3, 39, 1, 2.0, -4.0, 5.0), (187, 4, 24, 10.0, -30.0, 20.0)]

    def fuzz_setting_error(self, trial, M, N, t, gap, scale, **engine_options):
        """The largest relative error against float64 of one setting of benchmarks/fuzz_scaled.py cuda, drawn as
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

    # Settings of benchmarks/fuzz_scaled.py cuda (seed 1: trial, M, N, t, gap, scale; 1100 pairs) where the
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
