"""The CUDA gradient by rows (float32, t > 0, N <= 256): kept rows, recomputed bands, fallback to the table."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli import ops
from swcli.testing import (
    ROWS_SHAPES,
    CudaEngineCalls,
    cuda,
    random_lengths,
    random_scores,
    requires_cuda,
    window_mask,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaBackwardRows(CudaEngineCalls):
    """The rows' forward and backward called on the engine, and which calls the op sends by rows."""

    # -- the gradient by rows (float32, t > 0, gap <= 0, N <= 256: kernels/cuda/backward_rows.cu), which autograd takes
    #    where it is faster (ops.gradient_by_rows): every 8th row kept, the rows between computed again in the
    #    backward. The kernels' tests call the engine, so that narrow shapes go by rows too.

    @pytest.mark.parametrize("shape", list(ROWS_SHAPES))
    @pytest.mark.parametrize("gap, t", [(-1.0, 1.0), (0.0, 2.0), (-3.0, 0.5)])
    def test_rows_gradient_matches_float64(self, shape, gap, t):
        (B, M, N), with_lengths = ROWS_SHAPES[shape]
        S = random_scores((B, M, N), seed=9990 + M, dtype=torch.float32)
        qlen = random_lengths(B, M, seed=9991) if with_lengths else None
        tlen = random_lengths(B, N, seed=9992) if with_lengths else None
        cuda_lengths = [x.cuda() if x is not None else None for x in (qlen, tlen)]
        padded = S.clone()
        if with_lengths:  # NaN in the padding changes nothing
            padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
        grad_out = random_scores((B,), seed=9993).abs() + 0.5
        out, grad = self.rows_gradient(padded.cuda(), *cuda_lengths, gap, t, grad_out.cuda().float())
        exact_S = S.double().requires_grad_()
        exact = ssw(exact_S, gap, t, qlen, tlen, backend="cpu")
        (exact * grad_out).sum().backward()
        torch.testing.assert_close(out.cpu().double(), exact.detach(), rtol=1e-6, atol=1e-4)
        # measured: 1e-6 at most (the DP table's path: 2e-5)
        torch.testing.assert_close(grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-5)
        assert (grad >= 0).all()
        if with_lengths:
            assert (grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()

    def test_rows_gradient_goes_to_the_first_of_tied_best_cells(self):
        # as test_gradient_goes_to_the_first_of_tied_best_cells, in float32 by rows: two lone 5s give
        # bit-identical best cells in rows 0 and 2; the first in row-major order takes the gradient
        S = torch.full((1, 3, 4), -1000.0, device=self.device)
        S[0, 0, 2] = S[0, 2, 0] = 5.0
        _, grad = self.rows_gradient(S, None, None, -1000.0, 1.0, torch.ones(1, device=self.device))
        expected = torch.zeros(1, 3, 4)
        expected[0, 0, 2] = 1.0 / (1.0 + math.exp(-5.0))
        torch.testing.assert_close(grad.cpu(), expected, rtol=0, atol=1e-6)

    @pytest.mark.parametrize("N", [200, 201], ids=["aligned", "unaligned"])
    def test_rows_past_the_scaled_range_take_the_table(self, N):
        # A +150 spike (P = 2^216) leaves the scaled range: the rows' forward scores that pair in log space
        # and counts it, the rows' backward then gives None, and the op's backward takes the DP table's
        # path for the batch.
        S = random_scores((10, 50, N), seed=9994, dtype=torch.float32)
        S[3, 20, 30] = 150.0
        ops.load_engine("cuda")
        assert ops.gradient_by_rows(S.cuda(), False, -1.0, 1.0)
        _, kept, best_row, failed = torch.ops.swcli.forward(S.cuda(), None, None, -1.0, 1.0, True)
        assert failed.item() == 1
        # the engine's backward by rows takes the table's path itself, computing the table again
        ones = torch.ones(10, device=self.device)
        by_rows = torch.ops.swcli.backward(ones, S.cuda(), kept, best_row, failed, None, None, -1.0, 1.0, True)
        _, table, best_at, none_failed = torch.ops.swcli.forward(S.cuda(), None, None, -1.0, 1.0, False)
        by_table = torch.ops.swcli.backward(ones, S.cuda(), table, best_at, none_failed, None, None, -1.0, 1.0, False)
        assert torch.equal(by_rows, by_table)
        G = S.cuda().requires_grad_()
        out = ssw(G, -1.0, 1.0)
        out.sum().backward()
        exact_S = S.double().requires_grad_()
        exact = ssw(exact_S, -1.0, 1.0, backend="cpu")
        exact.sum().backward()
        torch.testing.assert_close(out.detach().cpu().double(), exact.detach(), rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(G.grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-4)

    def test_which_gradients_go_by_rows(self):
        ops.load_engine("cuda")
        # what the engine can take: anything else by rows is an error, never a silent change of scheme
        S = torch.randn(3, 5, 12, device=self.device)
        torch.ops.swcli.forward(S, None, None, -1.0, 1.0, True)
        for refused in (S.double(), S.cpu()):  # float64 and the CPU: the table
            with pytest.raises(RuntimeError, match="by rows"):
                torch.ops.swcli.forward(refused, None, None, -1.0, 1.0, True)
        for gap, t in ((-1.0, 0.0), (0.5, 1.0)):  # t = 0 (argmax weights); a positive gap (no scaled space)
            with pytest.raises(RuntimeError, match="by rows"):
                torch.ops.swcli.forward(S, None, None, gap, t, True)
        with pytest.raises(RuntimeError, match="by rows"):  # past 256 columns
            torch.ops.swcli.forward(torch.randn(3, 5, 257, device=self.device), None, None, -1.0, 1.0, True)
        # what the op sends there: N wide enough to gain (ops.ROWS_NARROWEST), wider with lengths
        for N, lengths, by_rows in ((128, False, False), (129, False, True), (192, True, False), (193, True, True),
                                    (256, False, True), (257, False, False)):
            assert ops.gradient_by_rows(torch.zeros(2, 3, N, device=self.device), lengths, -1.0, 1.0) == by_rows
        assert not ops.gradient_by_rows(torch.zeros(2, 3, 200, device=self.device).double(), False, -1.0, 1.0)
        assert not ops.gradient_by_rows(torch.zeros(2, 3, 200, device=self.device), False, -1.0, 0.0)
        assert not ops.gradient_by_rows(torch.zeros(2, 3, 200), False, -1.0, 1.0)
        # Rows not 16-byte aligned go through a staging row: rows of 1,000 bytes, and a contiguous S 4 bytes
        # past an aligned address (N a multiple of 8: the only unmasked case it changes); a non-contiguous S
        # goes as an aligned copy. Through the op, against float64.
        wide = torch.randn(3, 5, 250, device=self.device)
        shifted = torch.randn(3 * 5 * 256 + 1, device=self.device)[1:].view(3, 5, 256)
        transposed = torch.randn(3, 200, 5, device=self.device).transpose(1, 2)
        for x in (wide, shifted, transposed):
            assert ops.gradient_by_rows(x, False, -1.0, 1.0)
            G = x.detach().requires_grad_()
            ssw(G, -1.0, 1.0).sum().backward()
            exact_S = x.detach().cpu().double().requires_grad_()
            ssw(exact_S, -1.0, 1.0, backend="cpu").sum().backward()
            torch.testing.assert_close(G.grad.cpu().double(), exact_S.grad, rtol=0, atol=1e-5)

    def test_rows_gradient_of_empty_batches(self):
        for shape in [(0, 3, 200), (2, 0, 200), (2, 3, 0)]:
            S = torch.zeros(shape, device=self.device)
            scores, grad = self.rows_gradient(S, None, None, -1.0, 1.0, torch.ones(shape[0], device=self.device))
            assert scores.shape == (shape[0],) and (scores == 0).all()
            assert grad.shape == shape and (grad == 0).all()
            G = S.requires_grad_()
            ssw(G, -1.0, 1.0).sum().backward()
            assert G.grad.shape == shape and (G.grad == 0).all()
