"""The CUDA backward through the DP table (float64, t = 0, and float32 where the rows do not take it)."""

from __future__ import annotations

import pytest
import torch

import swcli
from swcli.testing import (
    DTYPE_PARAMS,
    CudaEngineCalls,
    cuda,
    random_lengths,
    random_scores,
    reference_gradient,
    requires_cuda,
    slow_unless,
    window_mask,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaBackwardTable(CudaEngineCalls):
    """Gradients through the kept DP table against autograd through the reference and the CPU engine."""

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_gradient_matches_reference(self, t):
        B, M, N = 6, 9, 8
        S = random_scores((B, M, N), seed=9400, device=self.device).requires_grad_()
        qlen = random_lengths(B, M, seed=9401)
        tlen = random_lengths(B, N, seed=9402)
        ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda").sum().backward()
        _, expected = reference_gradient(S, -1.0, t, qlen, tlen, torch.ones(B))
        torch.testing.assert_close(S.grad.cpu(), expected, rtol=0, atol=1e-9)

    # -- gradients

    @pytest.mark.parametrize("t", [0.1, 1.0, 10.0])
    @pytest.mark.parametrize("shape", slow_unless([(16, 32, 32), (6, 40, 170), (3, 150, 60)],
                                                  [(16, 32, 32), (6, 40, 170)]), ids=lambda s: "x".join(map(str, s)))
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

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    def test_high_scores_leave_the_4_column_lanes_finite(self, dtype):
        # A 4-column lane's columns past the target keep H from the padding, far below the last real
        # column's: their left weight there overflows to inf, and must not reach the real columns as
        # 0 * inf. A strong diagonal (scores to about 900) on targets whose length is not a multiple of 4.
        B, M, N = 1100, 100, 101
        S = torch.full((B, M, N), -1.0, dtype=dtype)
        S[:, torch.arange(M), torch.arange(M)] = 9.0
        tlen = torch.full((B,), N)
        tlen[::2] = 99
        expected = S.clone().requires_grad_()
        ssw(expected, -4.0, 1.0, None, tlen, backend="cpu").sum().backward()
        G = S.cuda().requires_grad_()
        ssw(G, -4.0, 1.0, None, tlen.cuda(), backend="cuda").sum().backward()
        assert torch.isfinite(G.grad).all()
        # float32 holds scores near 900 to 6e-5: the weights agree to about that, not to the last bit
        tolerance = {"rtol": 1e-3, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-7, "atol": 1e-9}
        torch.testing.assert_close(G.grad.cpu(), expected.grad, **tolerance)

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
