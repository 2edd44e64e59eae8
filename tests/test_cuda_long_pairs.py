"""The CUDA engine's tiles of long pairs (kernels/cuda/long_pairs.cu): each pair's DP in tiles of 128 x 128 cells,
a warp a tile, launched by anti-diagonals of tiles. Scores and gradients against float64 (the one-warp sweeps in
float64, and the reference loop on small pairs), the one-warp sweeps at t = 0 (the same floats), Biopython; the
automatic choice, lengths and padding, and errors. The plan itself is checked on the CPU by
tests/test_long_pairs_model.py."""

from __future__ import annotations

import pytest
import torch

import swcli
from swcli.ops import LANE_COLUMNS_TILES, load_engine
from swcli.testing import (
    CudaEngineCalls,
    biopython_score,
    code_batch,
    cuda,
    random_scores,
    reference_gradient,
    related_protein_pairs,
    requires_cuda,
    slow,
    slow_unless,
    window_mask,
)

ssw = swcli.soft_smith_waterman
TILES = LANE_COLUMNS_TILES
TILE = 128  # rows and columns of a tile (sw_cuda_long_tile_rows / columns)


def scores(S, qlen, tlen, gap, t, lane_columns):
    """The dense operator called directly with lane_columns (TILES: by tiles; 1 or 4: one warp per pair)."""
    load_engine("cuda")
    return torch.ops.swcli.scores(S, qlen, tlen, gap, t, lane_columns=lane_columns)


def float64(S, qlen, tlen, gap, t):
    """The float64 scores of the one-warp sweep (float64 never takes tiles)."""
    return scores(S.double(), qlen, tlen, gap, t, 0)


def assert_as_accurate_as_today(got, today, exact):
    """got (float32, by tiles) within max(2 x today's largest error, 1e-4 + 1e-5 |exact|) of exact (float64), today
    being the one-warp sweep's float32 result on the same input: the tolerance rule of swcli/testing.py, with the
    sweep the engine took for these pairs before tiles standing in for the float32 reference loop (too slow here)."""
    got, today, exact = got.cpu().double(), today.cpu().double(), exact.cpu()
    assert torch.equal(got.isnan(), exact.isnan())
    finite = ~exact.isnan()
    err = (got - exact)[finite].abs()
    bound = torch.clamp(1e-4 + 1e-5 * exact[finite].abs(), min=2 * (today - exact)[finite].abs().max().item())
    assert (err <= bound).all(), f"error {err.max().item():.3g}, bound {bound.min().item():.3g}: {got} vs {exact}"


@cuda
@requires_cuda
class TestCudaLongPairs(CudaEngineCalls):

    # -- scores: tile edges, strips, lengths

    SHAPES = {  # (B, M, N): around one and two tiles, M != N, strips of one row or column
        "129x257": (3, 129, 257),
        "256x255": (2, 256, 255),
        "300x128": (2, 300, 128),
        "127x385": (2, 127, 385),
        "1x700": (2, 1, 700),
        "700x1": (2, 700, 1),
        "2x3000": (2, 2, 3000),
        "3000x131": (2, 3000, 131),
    }

    @pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
    @pytest.mark.parametrize("shape", slow_unless(list(SHAPES), ["129x257", "1x700", "700x1", "3000x131"]))
    def test_scores_around_tile_edges(self, shape, t):
        B, M, N = self.SHAPES[shape]
        S = random_scores((B, M, N), seed=31_000 + M + N, dtype=torch.float32, device=self.device, shift=0.3)
        tiles = scores(S, None, None, -1.0, t, TILES)
        one_warp = scores(S, None, None, -1.0, t, 1)
        if t == 0:  # max and add: the same floats in any order of the cells
            assert torch.equal(tiles, one_warp)
            assert torch.equal(tiles, scores(S, None, None, -1.0, t, 4))
            assert torch.equal(tiles.cpu(), ssw(S.cpu(), -1.0, t, backend="cpu"))
        else:
            assert_as_accurate_as_today(tiles, one_warp, float64(S, None, None, -1.0, t))

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_lengths_and_nan_padding(self, t):
        # Pairs of different lengths in one launch (a pair's tiles past its end return at once), one of them
        # empty; NaN padding never reaches a cell, and a pair's lane past its target computes columns from it.
        B, M, N = 5, 300, 420
        S = random_scores((B, M, N), seed=31_100, dtype=torch.float32, device=self.device, shift=0.3)
        qlen = torch.tensor([300, 129, 0, 255, 7]).cuda()
        tlen = torch.tensor([420, 131, 50, 258, 400]).cuda()
        padded = S.clone()
        padded[window_mask(B, M, N, qlen, tlen).cuda()] = float("nan")
        tiles = scores(padded, qlen, tlen, -1.0, t, TILES)
        assert torch.equal(tiles, scores(S, qlen, tlen, -1.0, t, TILES))
        assert tiles[2].item() == 0.0
        one_warp = scores(S, qlen, tlen, -1.0, t, 1)
        if t == 0:
            assert torch.equal(tiles, one_warp)
        else:
            assert_as_accurate_as_today(tiles, one_warp, float64(S, qlen, tlen, -1.0, t))

    def test_pair_alone_equals_pair_in_a_batch(self):
        # The tiles start at the pair's first cell whatever the batch's padding: the same floats alone.
        B, M, N = 3, 400, 500
        S = random_scores((B, M, N), seed=31_200, dtype=torch.float32, device=self.device, shift=0.3)
        qlen, tlen = torch.tensor([400, 301, 170]).cuda(), torch.tensor([333, 500, 260]).cuda()
        batch = scores(S, qlen, tlen, -1.0, 1.0, TILES)
        for b in range(B):
            alone = S[b:b + 1, :qlen[b], :tlen[b]].contiguous()
            assert torch.equal(scores(alone, None, None, -1.0, 1.0, TILES), batch[b:b + 1])

    def test_nan_and_border_scores(self):
        B, M, N = 3, 260, 300
        S = random_scores((B, M, N), seed=31_300, dtype=torch.float32, device=self.device)
        S[1] = -2.0  # at t = 0 no cell above the border: the score is 0
        S[2, 200, 17] = float("nan")
        for t in (0.0, 1.0):
            out = scores(S, None, None, -1.0, t, TILES)
            assert out[2].isnan().item() and not out[:2].isnan().any().item()
            assert torch.equal(out[:1], scores(S[:1].contiguous(), None, None, -1.0, t, TILES))
            assert out[1].item() == 0.0 if t == 0 else out[1].item() > 0.0

    def test_pairs_counted_in_log_space(self):
        # Every pair the tiles score at t > 0 is in log space (there is no scaled sweep); empty pairs count not.
        S = random_scores((3, 300, 300), seed=31_350, dtype=torch.float32, device=self.device)
        qlen = torch.tensor([300, 0, 5]).cuda()
        for t, expected in ((1.0, 2), (0.0, 0)):
            _, counted = torch.ops.swcli.scores_counted(S, qlen, None, -1.0, t, lane_columns=TILES)
            assert counted.item() == expected

    # -- the automatic choice

    def test_long_pairs_in_small_batches_take_tiles(self):
        # The forward's state tells the path: the tiles keep their last rows and columns, the table M x N.
        load_engine("cuda")
        cases = {(1, 1024, 1024): True, (2, 256, 4096): True, (256, 1024, 1024): True, (257, 1024, 1024): False,
                 (1, 255, 8192): False, (1, 512, 1024): False}
        for (B, M, N), takes in cases.items():
            S = torch.zeros(B, M, N, device=self.device)
            auto = torch.ops.swcli.forward(S, None, None, -1.0, 1.0, False)[1].numel()
            tiles = torch.ops.swcli.forward(S, None, None, -1.0, 1.0, False, lane_columns=TILES)[1].numel()
            assert (auto == tiles) == takes, (B, M, N, auto, tiles)
            assert tiles < B * M * N
        S = torch.zeros(1, 1024, 1024, device=self.device, dtype=torch.float64)  # float64: never tiles
        assert torch.ops.swcli.forward(S, None, None, -1.0, 1.0, False)[1].numel() == 1024 * 1024

    # -- gradients

    @pytest.mark.parametrize("t", slow_unless([0.0, 0.5, 1.0], [0.0, 1.0]))
    def test_gradient_matches_reference(self, t):
        # 2 x 2 tiles, the last ones partial, lengths, weights. At t = 0 integer scores, exact in float32 and
        # float64 alike, so that both take the same alignment (and its ties).
        B, M, N = 2, 140, 150
        if t == 0:
            S = torch.randint(-3, 4, (B, M, N), generator=torch.Generator().manual_seed(31_400)).float().cuda()
        else:
            S = random_scores((B, M, N), seed=31_401, dtype=torch.float32, device=self.device, shift=0.3)
        qlen, tlen = torch.tensor([140, 131]), torch.tensor([150, 129])
        weights = torch.tensor([1.0, -0.5])
        got_scores, _, grad = self.engine_gradient(S, qlen.cuda(), tlen.cuda(), -1.0, t, weights.cuda(), TILES)
        expected_scores, expected = reference_gradient(S, -1.0, t, qlen, tlen, weights)
        torch.testing.assert_close(got_scores.cpu().double(), expected_scores, rtol=0, atol=1e-4)
        torch.testing.assert_close(grad.cpu().double(), expected, rtol=0, atol=1e-9 if t == 0 else 1e-4)
        assert (grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()

    @pytest.mark.parametrize("t", [0.0, 1.0])
    @pytest.mark.parametrize("size", slow_unless([(1100, 1000), (2000, 1500)], [(1100, 1000)]),
                             ids=lambda s: "x".join(map(str, s)))
    def test_gradient_of_a_medium_pair(self, size, t):
        # The op takes tiles for it by itself (B = 1, 2^20 cells and more); the gradient against float64 (the
        # table's path in float64), as accurate as the float32 table's; at t = 0 the table's, exactly.
        M, N = size
        S = random_scores((1, M, N), seed=31_500, dtype=torch.float32, device=self.device, shift=0.2)
        grad_out = torch.tensor([1.5], device=self.device)
        G = S.clone().requires_grad_()
        (ssw(G, -1.0, t, backend="cuda") * grad_out).sum().backward()
        _, state, grad = self.engine_gradient(S, None, None, -1.0, t, grad_out, TILES)
        assert torch.equal(G.grad, grad)  # the op's path is the tiles'
        _, table_state, today = self.engine_gradient(S, None, None, -1.0, t, grad_out, 1)
        assert state.numel() < table_state.numel()
        if t == 0:
            assert torch.equal(grad, today)
            return
        _, _, exact = self.engine_gradient(S.double(), None, None, -1.0, t, grad_out.double(), 1)
        err = (grad.double() - exact).abs().max().item()
        assert err <= max(1e-4, 2 * (today.double() - exact).abs().max().item()), err

    def test_gradient_with_lengths_and_nan_padding(self):
        B, M, N = 3, 300, 420
        S = random_scores((B, M, N), seed=31_600, dtype=torch.float32, device=self.device, shift=0.3)
        qlen, tlen = torch.tensor([300, 170, 0]).cuda(), torch.tensor([258, 420, 9]).cuda()
        padded = S.clone()
        padded[window_mask(B, M, N, qlen, tlen).cuda()] = float("nan")
        ones = torch.ones(B, device=self.device)
        for t in (0.0, 1.0):
            _, _, grad = self.engine_gradient(padded, qlen, tlen, -1.0, t, ones, TILES)
            _, _, clean = self.engine_gradient(S, qlen, tlen, -1.0, t, ones, TILES)
            assert torch.equal(grad, clean)
            assert (grad[window_mask(B, M, N, qlen, tlen).cuda()] == 0).all()
            _, _, today = self.engine_gradient(S, qlen, tlen, -1.0, t, ones, 1)
            if t == 0:
                assert torch.equal(grad, today)
            else:
                assert (grad - today).abs().max().item() <= 1e-4

    def test_gradient_of_a_border_pair(self):
        B, M, N = 2, 260, 270
        S = random_scores((B, M, N), seed=31_700, dtype=torch.float32, device=self.device)
        S[0] = -1.0  # at t = 0 the score is the border: no gradient
        ones = torch.ones(B, device=self.device)
        for t in (0.0, 1.0):
            out, _, grad = self.engine_gradient(S, None, None, -1.0, t, ones, TILES)
            if t == 0:
                assert out[0].item() == 0.0 and (grad[0] == 0).all()
            _, _, alone = self.engine_gradient(S[1:].contiguous(), None, None, -1.0, t, ones[1:], TILES)
            assert torch.equal(grad[1:], alone)

    def test_scores_with_and_without_gradient_and_again(self):
        # One forward kernel with or without the state; the same bits every time.
        S = random_scores((2, 700, 650), seed=31_800, dtype=torch.float32, device=self.device, shift=0.2)
        ones = torch.ones(2, device=self.device)
        plain = scores(S, None, None, -1.0, 1.0, TILES)
        with_state, _, grad = self.engine_gradient(S, None, None, -1.0, 1.0, ones, TILES)
        again, _, grad_again = self.engine_gradient(S, None, None, -1.0, 1.0, ones, TILES)
        assert torch.equal(plain, with_state) and torch.equal(with_state, again) and torch.equal(grad, grad_again)

    # -- past 10,000

    def test_past_10000_against_biopython_and_float64(self):
        pairs = related_protein_pairs(seed=31_900, count=1, min_length=10_300, max_length=10_300, mutation_rate=0.15)
        pairs = [(pairs[0][0], pairs[0][1][:2_000])]
        query, target, _, _, table = code_batch(pairs, device=self.device)
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]
        assert ssw(S, -4.0, 0.0, backend="cuda").item() == biopython_score(*pairs[0], -4.0)  # the op: by tiles
        assert_as_accurate_as_today(scores(S, None, None, -4.0, 1.0, TILES), scores(S, None, None, -4.0, 1.0, 1),
                                    float64(S, None, None, -4.0, 1.0))

    @slow  # 1.2e8 cells: the float64 table's path on one warp takes seconds, and 1 GB of table
    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_12000_by_10000(self, t):
        pairs = related_protein_pairs(seed=32_000, count=1, min_length=12_000, max_length=12_000, mutation_rate=0.2)
        pairs = [(pairs[0][0], pairs[0][1][:10_000])]
        query, target, _, _, table = code_batch(pairs, device=self.device)
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]
        grad_out = torch.ones(1, device=self.device)
        got, _, grad = self.engine_gradient(S, None, None, -4.0, t, grad_out, 0)
        if t == 0:
            assert got.item() == biopython_score(*pairs[0], -4.0)
            assert torch.equal(grad, self.engine_gradient(S, None, None, -4.0, t, grad_out, 1)[2])
            return
        _, _, today = self.engine_gradient(S, None, None, -4.0, t, grad_out, 1)
        _, _, exact = self.engine_gradient(S.double(), None, None, -4.0, t, grad_out.double(), 1)
        err = (grad.double() - exact).abs().max().item()
        assert err <= max(1e-4, 2 * (today.double() - exact).abs().max().item()), err
