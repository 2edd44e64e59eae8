"""The CUDA affine kernels (kernels/cuda/affine*.cu): against the float64 reference loop and the CPU affine
engine, bit for bit at t = 0, across lane widths, tiles, transposed pairs, relayed pairs, the scaled sweep
and its fall back to log space, and CUDA graphs."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli.ops import load_engine, soft_smith_waterman_codes
from swcli.testing import (
    DTYPE_PARAMS,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    cuda,
    random_lengths,
    random_protein_pairs,
    random_scores,
    reference_gradient,
    related_protein_pairs,
    requires_cuda,
    score_matrices,
    slow,
    window_mask,
)

ssw = swcli.soft_smith_waterman
ops = torch.ops.swcli


def cpu_affine(S, o, e, t, qlen=None, tlen=None, grad_out=None):
    """(scores, gradient or None) of the CPU affine engine, in S's dtype."""
    X = S.detach().cpu().clone().requires_grad_(grad_out is not None)
    out = ssw(X, None, t, None if qlen is None else qlen.cpu(), None if tlen is None else tlen.cpu(), "cpu",
              gap_open=o, gap_extend=e)
    if grad_out is None:
        return out.detach(), None
    (out * grad_out.cpu().to(out.dtype)).sum().backward()
    return out.detach(), X.grad


def cuda_gradient(S, o, e, t, qlen, tlen, grad_out, lane_columns=0):
    """(scores, gradient) of the CUDA operators called directly, with lane_columns."""
    S = S.cuda().contiguous()
    q = None if qlen is None else qlen.cuda()
    n = None if tlen is None else tlen.cuda()
    scores, state, best, failed = ops.affine_forward(S, q, n, o, e, t, False, lane_columns=lane_columns)
    grad = ops.affine_backward(grad_out.cuda().to(S.dtype), S, state, best, failed, q, n, o, e, t, False,
                               lane_columns=lane_columns)
    return scores, grad


@cuda
@requires_cuda
class TestCudaAffine:
    device = torch.device("cuda")

    @pytest.fixture(autouse=True)
    def _engine(self):
        load_engine("cuda")

    # -- scores

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
    @pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1, 9), (3, 9, 1), (5, 13, 7), (2, 11, 140)],
                             ids=lambda s: "x".join(map(str, s)))
    def test_matches_reference(self, shape, t, dtype):
        B, M, N = shape
        S = random_scores(shape, seed=30_000 + M * N, dtype=dtype, device=self.device, scale=1.5)
        qlen, tlen = random_lengths(B, M, seed=30_001, low=1), random_lengths(B, N, seed=30_002, low=1)
        qlen[0], tlen[0] = M, N
        for lanes in (1, 4):  # 140 columns: 5 tiles of 1-column lanes, 2 of 4-column lanes
            out = ops.affine_scores(S, qlen.cuda(), tlen.cuda(), -2.0, -0.5, t, lane_columns=lanes)
            assert_close_to_reference(out, S, -2.0, t, qlen, tlen, gap_extend=-0.5)
            state_out = ops.affine_forward(S, qlen.cuda(), tlen.cuda(), -2.0, -0.5, t, False, lane_columns=lanes)[0]
            assert_close_to_reference(state_out, S, -2.0, t, qlen, tlen, gap_extend=-0.5)
            if t == 0 or lanes == 1 or dtype != torch.float32:  # else the scores take the scaled sweep
                assert torch.equal(state_out, out)  # the same sweep, with or without the state

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_codes_equal_dense_and_lane_widths_agree(self, t):
        # At t = 0 the same floats whatever the lane width, and transposed (codes, 4 or 8 columns per lane):
        # the cell is symmetric in X and Y; the CPU engine's floats exactly. At t = 1 the scaled sweep
        # (dense with 4 columns, codes with 4 and 8) rounds otherwise: each within 2e-6 of float64.
        pairs = random_protein_pairs(seed=30_100, count=120, min_length=1, max_length=300)
        pairs += related_protein_pairs(seed=30_101, count=40, min_length=100, max_length=400)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        S = table.float()[query.long()[:, :, None], target.long()[:, None, :]]
        q, n = qlen.cuda(), tlen.cuda()
        dense = ops.affine_scores(S, q, n, -11.0, -1.0, t, lane_columns=1)
        outs = {"dense 4": ops.affine_scores(S, q, n, -11.0, -1.0, t, lane_columns=4)}
        for lanes in (1, 4, 8):
            outs[f"codes {lanes}"] = ops.affine_scores_codes(query, target, table, q, n, -11.0, -1.0, t,
                                                             lane_columns=lanes)
        if t == 0:
            for name, out in outs.items():
                assert torch.equal(out, dense), name
            assert torch.equal(dense.cpu(), cpu_affine(S, -11.0, -1.0, 0.0, qlen, tlen)[0])
            assert dense[:10].tolist() == [biopython_score(a, b, -11.0, gap_extend=-1.0) for a, b in pairs[:10]]
        else:
            assert torch.equal(outs["codes 1"], dense)  # log space at every width
            exact = cpu_affine(S.double(), -11.0, -1.0, t, qlen, tlen)[0]
            for name, out in [("dense 1", dense), *outs.items()]:
                relative = ((out.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
                assert relative <= 2e-6, (name, relative)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_many_pairs_with_relayed_long_ones(self, t):
        # 2,000 pairs (more than 8 per SM: 4 and 8 columns per lane), of which 20 long ones (up to 1,200,
        # several tiles) get a block of warps that relay their tiles; each scores as the pair alone.
        pairs = random_protein_pairs(seed=30_200, count=1980, min_length=5, max_length=250)
        pairs += related_protein_pairs(seed=30_201, count=20, min_length=500, max_length=1200)
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(30_202)).tolist()
        pairs = [pairs[k] for k in order]
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        q, n = qlen.cuda(), tlen.cuda()
        batch = soft_smith_waterman_codes(query, target, table, None, t, q, n, gap_open=-11.0, gap_extend=-1.0)
        long = [b for b, (a, _) in enumerate(pairs) if len(a) >= 500][:6]
        for b in long + [0, 1]:
            a, c = int(qlen[b]), int(tlen[b])
            alone = soft_smith_waterman_codes(query[b:b + 1, :a], target[b:b + 1, :c], table, None, t,
                                              gap_open=-11.0, gap_extend=-1.0)
            if t == 0:
                assert batch[b].item() == alone.item(), b
            else:  # alone, a pair takes 1-column lanes in log space; in the batch the scaled sweep
                assert abs(batch[b].item() - alone.item()) <= 2e-6 * abs(alone.item()), b
        if t == 0:
            assert [batch[b].item() for b in long] == [biopython_score(*pairs[b], -11.0, gap_extend=-1.0)
                                                        for b in long]
        # the dense op with 4 columns per lane on the short pairs, against the CPU engine
        short = [b for b in range(len(pairs)) if len(pairs[b][0]) < 300 and len(pairs[b][1]) < 300][:1200]
        S, sq, sn = score_matrices([pairs[b] for b in short], dtype=torch.float32)
        out = ssw(S.cuda(), None, t, sq.cuda(), sn.cuda(), gap_open=-11.0, gap_extend=-1.0)
        if t == 0:
            assert torch.equal(out, batch[torch.tensor(short, device=self.device)])
            assert torch.equal(out.cpu(), cpu_affine(S, -11.0, -1.0, 0.0, sq, sn)[0])
        else:
            exact = cpu_affine(S.double(), -11.0, -1.0, t, sq, sn)[0]
            in_batch = batch[torch.tensor(short, device=self.device)]
            for got in (out, in_batch):
                assert ((got.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item() <= 2e-6

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_equal_gaps_are_the_linear_op(self, t):
        pairs = random_protein_pairs(seed=30_300, count=30, min_length=1, max_length=200)
        query, target, qlen, tlen, table = code_batch(pairs, device=self.device)
        q, n = qlen.cuda(), tlen.cuda()
        linear = soft_smith_waterman_codes(query, target, table, -4.0, t, q, n)
        affine = soft_smith_waterman_codes(query, target, table, None, t, q, n, gap_open=-4.0, gap_extend=-4.0)
        S, _, _ = score_matrices(pairs, device=self.device)  # float64, integer scores
        lin_S, aff_S = S.clone().requires_grad_(), S.clone().requires_grad_()
        lin = ssw(lin_S, -4.0, t, q, n)
        aff = ssw(aff_S, None, t, q, n, gap_open=-4.0, gap_extend=-4.0)
        lin.sum().backward()
        aff.sum().backward()
        if t == 0:
            assert torch.equal(affine, linear)
            assert torch.equal(aff, lin) and torch.equal(aff_S.grad, lin_S.grad)
        else:
            assert ((affine - linear).abs() / linear.abs().clamp_min(1)).max().item() <= 2e-6
            torch.testing.assert_close(aff, lin, rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(aff_S.grad, lin_S.grad, rtol=0, atol=1e-10)

    @pytest.mark.parametrize("t, scale, limit", [(1.0, 4.0, 20.0), (1.0, 20.0, 40.0), (0.16, 3.0, 6.0),
                                                 (0.7, 20.0, 40.0)],
                             ids=["moderate", "large-entries", "tiny-open-factor", "not-staged"])
    def test_scaled_sweep_and_its_fall_back(self, t, scale, limit):
        # Scores from codes in the scaled sweep (4 and 8 columns per lane, transposed pairs, several tiles)
        # and dense with 4 columns. Entries up to 40 at t = 1 are staged (powers up to 2^58); at t = 0.16
        # with o = -11 the open factor is 2^-99, a lane's cells spread past the scaled range and pairs fall
        # back to log space; at t = 0.7 entries near 40 pass 2^60 and nothing is staged. The same scores
        # to float32 rounding whichever sweep took them.
        g = torch.Generator().manual_seed(31_200 + int(scale))
        table = (torch.randn(24, 24, generator=g) * scale).round().clamp(-limit, limit)
        B, M, N = 96, 520, 300
        query = torch.randint(0, 24, (B, M), dtype=torch.uint8, generator=g)
        target = torch.randint(0, 24, (B, N), dtype=torch.uint8, generator=g)
        qlen, tlen = random_lengths(B, M, seed=31_201, low=1), random_lengths(B, N, seed=31_202, low=1)
        qlen[0], tlen[0] = M, N
        S = table.double()[query.long()[:, :, None], target.long()[:, None, :]]
        exact = cpu_affine(S, -11.0, -1.0, t, qlen, tlen)[0]
        q, n = qlen.cuda(), tlen.cuda()
        outs = {"dense 4": ops.affine_scores(S.float().cuda(), q, n, -11.0, -1.0, t, lane_columns=4)}
        for lanes in (4, 8):
            outs[f"codes {lanes}"] = ops.affine_scores_codes(query.cuda(), target.cuda(), table.cuda(), q, n, -11.0,
                                                             -1.0, t, lane_columns=lanes)
        for name, got in outs.items():
            relative = ((got.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
            assert relative <= 4e-6, (name, relative)

    def test_small_temperature_takes_separate_cells(self):
        # |o| c past the shared powers' limit (affine.cuh, kSharedLimit): three separate cells a cell
        pairs = related_protein_pairs(seed=30_400, count=12, min_length=20, max_length=150)
        S, qlen, tlen = score_matrices(pairs)
        grad_out = random_scores((len(pairs),), seed=30_401)
        for t in (0.05, 0.02):
            exact, exact_grad = cpu_affine(S, -12.0, -1.0, t, qlen, tlen, grad_out)
            for dtype, atol in ((torch.float64, 1e-9), (torch.float32, 2e-3)):
                out, grad = cuda_gradient(S.to(dtype), -12.0, -1.0, t, qlen, tlen, grad_out)
                relative = ((out.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
                assert relative <= (1e-12 if dtype == torch.float64 else 2e-6), (t, dtype, relative)
                torch.testing.assert_close(grad.cpu().double(), exact_grad.double(), rtol=0, atol=atol)

    # -- gradients

    @pytest.mark.parametrize("t", [0.5, 1.0])
    @pytest.mark.parametrize("lanes", [1, 4])
    def test_gradient_matches_reference(self, lanes, t):
        B, M, N = 3, 9, 70  # 3 tiles of 1-column lanes
        S = random_scores((B, M, N), seed=30_500, scale=1.5)
        qlen, tlen = torch.tensor([M, 6, 9]), torch.tensor([N, 40, 33])
        grad_out = random_scores((B,), seed=30_501)
        out, grad = cuda_gradient(S, -2.0, -0.5, t, qlen, tlen, grad_out, lanes)
        expected_out, expected = reference_gradient(S, -2.0, t, qlen, tlen, grad_out, gap_extend=-0.5)
        torch.testing.assert_close(out.cpu(), expected_out, rtol=0, atol=1e-9)
        torch.testing.assert_close(grad.cpu(), expected, rtol=0, atol=1e-9)

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
    @pytest.mark.parametrize("lanes", [1, 4])
    def test_gradient_matches_cpu_engine(self, lanes, t, dtype):
        # random per-pair lengths, tiles of both widths (300 columns), odd sizes; t = 0 exactly the CPU's
        # traceback (integer scores: many ties). At t > 0 the integer scores get noise: among integer
        # scores two cells' H may differ by less than float32 rounding, and float32 may then take another
        # best cell than float64 (the CPU engine in float32 does, by up to 2.5 in the gradient).
        B, M, N = 40, 45, 300
        pairs = related_protein_pairs(seed=30_600, count=B - 4, min_length=1, max_length=N)
        pairs += [("W", "W"), ("A", "ACDEFGHIK"), ("ACDEFGHIK", "A"), ("ACD" * 15, "KLM" * 100)]
        pairs = [(a[:M], b[:N]) for a, b in pairs]
        S, qlen, tlen = score_matrices(pairs, dtype=torch.float64)
        if t > 0:
            S = S + random_scores(S.shape, seed=30_602, scale=0.3)
        S = S.to(dtype)
        grad_out = random_scores((B,), seed=30_601, dtype=dtype)
        exact, exact_grad = cpu_affine(S.double(), -11.0, -1.0, t, qlen, tlen, grad_out.double())
        out, grad = cuda_gradient(S, -11.0, -1.0, t, qlen, tlen, grad_out, lanes)
        assert (grad.cpu()[window_mask(B, S.shape[1], S.shape[2], qlen, tlen)] == 0).all()
        if t == 0:
            single, single_grad = cpu_affine(S, -11.0, -1.0, 0.0, qlen, tlen, grad_out)
            assert torch.equal(out.cpu(), single) and torch.equal(grad.cpu(), single_grad)
        else:
            atol = 1e-9 if dtype == torch.float64 else 2e-4
            relative = ((out.cpu().double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
            assert relative <= (1e-12 if dtype == torch.float64 else 2e-6), relative
            torch.testing.assert_close(grad.cpu().double(), exact_grad, rtol=0, atol=atol)

    def test_gradient_of_many_pairs(self):
        # 2,000 pairs: 4 columns per lane, through autograd, against the CPU engine
        B, M, N = 2000, 24, 150
        S = random_scores((B, M, N), seed=30_700, dtype=torch.float32)
        qlen, tlen = random_lengths(B, M, seed=30_701), random_lengths(B, N, seed=30_702)
        X = S.cuda().requires_grad_()
        out = ssw(X, None, 1.0, qlen.cuda(), tlen.cuda(), gap_open=-2.0, gap_extend=-0.5)
        out.sum().backward()
        exact, exact_grad = cpu_affine(S.double(), -2.0, -0.5, 1.0, qlen, tlen, torch.ones(B, dtype=torch.float64))
        torch.testing.assert_close(out.detach().cpu().double(), exact, rtol=2e-6, atol=1e-4)
        torch.testing.assert_close(X.grad.cpu().double(), exact_grad, rtol=0, atol=2e-4)

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_non_contiguous_inputs(self, t):
        base = random_scores((6, 40, 150), seed=30_800, dtype=torch.float32, device=self.device)
        strided = base.transpose(1, 2)
        assert not strided.is_contiguous()
        assert torch.equal(ssw(strided, None, t, gap_open=-2.0, gap_extend=-0.5),
                           ssw(strided.contiguous(), None, t, gap_open=-2.0, gap_extend=-0.5))
        grad_out = random_scores((6,), seed=30_801, dtype=torch.float32, device=self.device)
        a, b = strided.detach().requires_grad_(), strided.detach().contiguous().requires_grad_()
        (ssw(a, None, t, gap_open=-2.0, gap_extend=-0.5) * grad_out).sum().backward()
        (ssw(b, None, t, gap_open=-2.0, gap_extend=-0.5) * grad_out).sum().backward()
        assert torch.equal(a.grad, b.grad)

    # -- streams and graphs

    def test_graph_capture(self):
        S = random_scores((64, 50, 70), seed=30_900, dtype=torch.float32, device=self.device)
        static = S.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ops.affine_scores(static, None, None, -11.0, -1.0, 1.0)  # warm-up outside the capture
            static_grad = static.clone().requires_grad_()
            ssw(static_grad, None, 1.0, gap_open=-11.0, gap_extend=-1.0).sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = ops.affine_scores(static, None, None, -11.0, -1.0, 1.0)
        step = torch.cuda.CUDAGraph()
        static_grad.grad = None
        with torch.cuda.graph(step):
            ssw(static_grad, None, 1.0, gap_open=-11.0, gap_extend=-1.0).sum().backward()
        fresh = random_scores((64, 50, 70), seed=30_901, dtype=torch.float32, device=self.device)
        static.copy_(fresh)
        with torch.no_grad():
            static_grad.copy_(fresh)
        graph.replay()
        step.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, ops.affine_scores(fresh, None, None, -11.0, -1.0, 1.0))
        # a capture takes the state's path (the rows' backward reads a count from the device): the same
        # floats as that path in eager mode, where the op would go by rows
        _, state, best, failed = ops.affine_forward(fresh, None, None, -11.0, -1.0, 1.0, False)
        ones = torch.ones(64, device=self.device)
        expected = ops.affine_backward(ones, fresh, state, best, failed, None, None, -11.0, -1.0, 1.0, False)
        assert torch.equal(static_grad.grad, expected)

    # -- errors

    def test_bad_arguments_raise(self):
        load_engine("cuda")
        S = random_scores((2, 5, 6), seed=31_000, dtype=torch.float32, device=self.device)
        q = torch.zeros(2, 5, dtype=torch.uint8, device=self.device)
        m = torch.zeros(24, 24, device=self.device)
        for gap_open, gap_extend in [(-1.0, -2.0), (-1.0, 0.5), (math.nan, -1.0), (-math.inf, -1.0)]:
            with pytest.raises(RuntimeError, match="gap_open <= gap_extend <= 0"):
                ops.affine_scores(S, None, None, gap_open, gap_extend, 1.0)
            with pytest.raises(RuntimeError, match="gap_open <= gap_extend <= 0"):
                ops.affine_scores_codes(q, q, m, None, None, gap_open, gap_extend, 1.0)
        for temperature in (-1.0, math.inf, math.nan):
            with pytest.raises(RuntimeError, match=r"temperature must be finite and >= 0, got"):
                ops.affine_forward(S, None, None, -2.0, -0.5, temperature, False)
        with pytest.raises(RuntimeError, match="lane_columns"):
            ops.affine_scores(S, None, None, -2.0, -0.5, 1.0, lane_columns=8)
        with pytest.raises(RuntimeError, match="lengths must be"):
            ops.affine_scores(S, torch.tensor([5, 5]), None, -2.0, -0.5, 1.0)
        with pytest.raises(RuntimeError, match="float32 or float64"):
            ops.affine_scores(S.half(), None, None, -2.0, -0.5, 1.0)
        _, state, best, failed = ops.affine_forward(S, None, None, -2.0, -0.5, 1.0, False)
        grad = torch.ones(2, device=self.device)
        with pytest.raises(RuntimeError, match="state does not match"):
            ops.affine_backward(grad, S, state[:-1], best, failed, None, None, -2.0, -0.5, 1.0, False)
        with pytest.raises(RuntimeError, match="state does not match"):
            ops.affine_backward(grad, S, state, best, failed, None, None, -2.0, -0.5, 1.0, False, lane_columns=4)
        with pytest.raises(RuntimeError, match="best does not match"):
            ops.affine_backward(grad, S, state, best[:1], failed, None, None, -2.0, -0.5, 1.0, False)

    # -- long pairs

    @slow
    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_pairs_past_1024(self, t):
        pairs = related_protein_pairs(seed=31_100, count=3, min_length=1100, max_length=1400)
        S, qlen, tlen = score_matrices(pairs, dtype=torch.float32)
        grad_out = torch.ones(len(pairs))
        exact, exact_grad = cpu_affine(S.double(), -11.0, -1.0, t, qlen, tlen, grad_out.double())
        for lanes in (1, 4):
            out, grad = cuda_gradient(S, -11.0, -1.0, t, qlen, tlen, grad_out, lanes)
            if t == 0:
                single, single_grad = cpu_affine(S, -11.0, -1.0, 0.0, qlen, tlen, grad_out)
                assert torch.equal(out.cpu(), single) and torch.equal(grad.cpu(), single_grad)
            else:
                assert ((out.cpu().double() - exact).abs() / exact.abs()).max().item() <= 2e-6
                torch.testing.assert_close(grad.cpu().double(), exact_grad, rtol=0, atol=2e-4)
        query, target, cq, cn, table = code_batch(pairs, device=self.device)
        for lanes in (1, 4, 8):
            codes = ops.affine_scores_codes(query, target, table, cq.cuda(), cn.cuda(), -11.0, -1.0, t,
                                            lane_columns=lanes)
            if t == 0 or lanes == 1:
                assert torch.equal(codes.cpu(), out.cpu())
            else:  # the scaled sweep
                assert ((codes.cpu().double() - exact).abs() / exact.abs()).max().item() <= 2e-6
