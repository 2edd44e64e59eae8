"""The CUDA forward kernels on codes (uint8 pairs and a K x K matrix): relay blocks, lanes, transposes, scaled sweep."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch
from Bio.Align import substitution_matrices

import swcli
from swcli.ops import soft_smith_waterman_codes
from swcli.testing import (
    BLOSUM62,
    CudaEngineCalls,
    biopython_score,
    code_batch,
    cuda,
    random_protein_pairs,
    related_protein_pairs,
    requires_cuda,
    score_matrices,
    slow_unless,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaForwardCodes(CudaEngineCalls):
    """The codes forward against dense scores, Biopython and the float64 CPU engine."""

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_long_pairs_share_a_block(self, t):
        # 1100 pairs (4 columns per lane) of which the 30 longest, up to 1500 x 1500 (12 tiles), each get
        # a block of warps that relay the pair's tiles (kernels/cuda/forward_log.cuh, Relay). Each must score as
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
        """kernels/cuda/common.cuh, transposes: whether the codes kernels of R columns per lane score a q x n pair
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
        # steps and its target is not longer than its query (kernels/cuda/common.cuh, transposes): rows from
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

    # -- the scaled sweep (float at t > 0 with 4 columns per lane, dense and from codes, no DP table:
    #    kernels/cuda/forward_scaled.cuh), and its fallback to the log-space sweep

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def exact_scores_of(pairs, gap, t):
        """exact_scores for BLOSUM62, kept for the tests that share pairs and settings."""
        return TestCudaForwardCodes.exact_scores(list(pairs), gap, t)

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
    # kernels/cuda/forward_scaled.cuh)
    SCALED_SETTINGS = [(-4.0, 1.0, True), (-1.0, 1.0, True), (-11.0, 1.0, False), (-4.0, 2.0, True),
                       (-1.0, 0.5, False)]

    @pytest.mark.parametrize("lane_columns", [4, 8])
    @pytest.mark.parametrize("gap,t,wide", slow_unless(SCALED_SETTINGS, [(-4.0, 1.0, True), (-11.0, 1.0, False)],
                                                       several=True))
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
