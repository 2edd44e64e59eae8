"""The CUDA affine gradient by rows (float32, t > 0 in the scaled form, N <= 256): kept rows of H and Y,
recomputed bands, the state's path for pairs the scaled rows cannot hold."""

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


def exact_gradient(S, gap_open, gap_extend, t, qlen, tlen, grad_out):
    """(scores, grad_S) of the CPU engine in float64: the oracle."""
    exact_S = S.double().requires_grad_()
    exact = ssw(exact_S, None, t, qlen, tlen, backend="cpu", gap_open=gap_open, gap_extend=gap_extend)
    (exact * grad_out.double()).sum().backward()
    return exact.detach(), exact_S.grad


@cuda
@requires_cuda
class TestCudaAffineBackwardRows(CudaEngineCalls):
    """The affine rows' forward and backward called on the engine, and which calls the op sends by rows."""

    # (open, extend, t): an ordinary setting, o == e (the linear op), e = 0 (E = 1: no decay along a gap),
    # BLAST's 11/1 on unit-scale scores, and a costlier opening at a lower temperature (|o| log2(e) / t = 17)
    SETTINGS = [(-2.0, -0.5, 1.0), (-1.0, -1.0, 1.0), (-3.0, 0.0, 0.5), (-12.0, -1.0, 1.0), (-6.0, -1.0, 0.5)]

    @pytest.mark.parametrize("shape", list(ROWS_SHAPES))
    @pytest.mark.parametrize("gap_open, gap_extend, t", SETTINGS)
    def test_rows_gradient_matches_float64(self, shape, gap_open, gap_extend, t):
        (B, M, N), with_lengths = ROWS_SHAPES[shape]
        S = random_scores((B, M, N), seed=31_000 + M, dtype=torch.float32)
        qlen = random_lengths(B, M, seed=31_001) if with_lengths else None
        tlen = random_lengths(B, N, seed=31_002) if with_lengths else None
        cuda_lengths = [x.cuda() if x is not None else None for x in (qlen, tlen)]
        padded = S.clone()
        if with_lengths:  # NaN in the padding changes nothing
            padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
        grad_out = random_scores((B,), seed=31_003).abs() + 0.5
        out, grad = self.affine_rows_gradient(padded.cuda(), *cuda_lengths, gap_open, gap_extend, t,
                                              grad_out.cuda().float())
        exact, exact_grad = exact_gradient(S, gap_open, gap_extend, t, qlen, tlen, grad_out)
        torch.testing.assert_close(out.cpu().double(), exact, rtol=1e-6, atol=1e-4)
        # measured: 1.2e-5 at most, 4.8e-6 relative (e = 0: sums along gaps that never decay)
        torch.testing.assert_close(grad.cpu().double(), exact_grad, rtol=1e-5, atol=1e-5)
        assert (grad >= 0).all()
        if with_lengths:
            assert (grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()

    def test_equal_gaps_give_the_linear_rows_gradient(self):
        S = random_scores((30, 120, 200), seed=31_010, dtype=torch.float32, device=self.device)
        ones = torch.ones(30, device=self.device)
        affine, affine_grad = self.affine_rows_gradient(S, None, None, -1.5, -1.5, 1.0, ones)
        linear, linear_grad = self.rows_gradient(S, None, None, -1.5, 1.0, ones)
        torch.testing.assert_close(affine, linear, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(affine_grad, linear_grad, rtol=0, atol=1e-6)

    def test_rows_gradient_goes_to_the_first_of_tied_best_cells(self):
        # two lone 5s give bit-identical best cells in rows 0 and 2; the first in row-major order takes the
        # gradient, and only its match: P(match) = e^5 / (1 + e^5), gap terms (e^-60 at most) aside
        S = torch.full((1, 3, 4), -1000.0, device=self.device)
        S[0, 0, 2] = S[0, 2, 0] = 5.0
        _, grad = self.affine_rows_gradient(S, None, None, -60.0, -1.0, 1.0, torch.ones(1, device=self.device))
        expected = torch.zeros(1, 3, 4)
        expected[0, 0, 2] = 1.0 / (1.0 + math.exp(-5.0))
        torch.testing.assert_close(grad.cpu(), expected, rtol=0, atol=1e-6)

    @pytest.mark.parametrize("N", [200, 201], ids=["aligned", "unaligned"])
    def test_rows_past_the_scaled_range_take_the_state(self, N):
        # A +150 spike (P = 2^216) leaves the scaled range: the rows' forward scores that pair in log space
        # and counts it, and the rows' backward takes the state's path for the batch.
        S = random_scores((10, 50, N), seed=31_020, dtype=torch.float32)
        S[3, 20, 30] = 150.0
        ops.load_engine("cuda")
        assert ops.affine_gradient_by_rows(S.cuda(), False, -2.0, 1.0)
        scores, kept, best_row, failed = torch.ops.swcli.affine_forward(S.cuda(), None, None, -2.0, -0.5, 1.0, True)
        assert failed.item() == 1
        ones = torch.ones(10, device=self.device)
        by_rows = torch.ops.swcli.affine_backward(ones, S.cuda(), kept, best_row, failed, None, None, -2.0, -0.5,
                                                  1.0, True)
        state_scores, state, best, none_failed = torch.ops.swcli.affine_forward(S.cuda(), None, None, -2.0, -0.5,
                                                                                1.0, False)
        by_state = torch.ops.swcli.affine_backward(ones, S.cuda(), state, best, none_failed, None, None, -2.0, -0.5,
                                                   1.0, False)
        assert torch.equal(by_rows, by_state)
        exact, exact_grad = exact_gradient(S, -2.0, -0.5, 1.0, None, None, torch.ones(10))
        torch.testing.assert_close(scores.cpu().double(), exact, rtol=1e-6, atol=1e-4)
        G = S.cuda().requires_grad_()
        ssw(G, None, 1.0, gap_open=-2.0, gap_extend=-0.5).sum().backward()
        torch.testing.assert_close(G.grad.cpu().double(), exact_grad, rtol=0, atol=1e-4)

    def test_near_the_scaled_forms_limit_through_the_op(self):
        # |o| log2(e) / t = 96: a row may spread past the scaled range within a lane (H[j+1] >= O H[j] only),
        # so some pairs take the state's path; scores and gradient match float64 either way
        S = random_scores((40, 120, 200), seed=31_030, dtype=torch.float32)
        assert ops.affine_gradient_by_rows(S.cuda(), False, -20.0, 0.3)
        G = S.cuda().requires_grad_()
        out = ssw(G, None, 0.3, gap_open=-20.0, gap_extend=-1.0)
        out.sum().backward()
        exact, exact_grad = exact_gradient(S, -20.0, -1.0, 0.3, None, None, torch.ones(40))
        torch.testing.assert_close(out.detach().cpu().double(), exact, rtol=1e-6, atol=1e-4)
        torch.testing.assert_close(G.grad.cpu().double(), exact_grad, rtol=1e-5, atol=1e-5)

    def test_which_gradients_go_by_rows(self):
        ops.load_engine("cuda")
        # what the engine can take: anything else by rows is an error, never a silent change of scheme
        S = torch.randn(3, 5, 12, device=self.device)
        torch.ops.swcli.affine_forward(S, None, None, -2.0, -0.5, 1.0, True)
        for refused in (S.double(), S.cpu()):
            with pytest.raises(RuntimeError, match="by rows"):
                torch.ops.swcli.affine_forward(refused, None, None, -2.0, -0.5, 1.0, True)
        # t = 0, and |o| log2(e) / t past 100 (the separate cells' form)
        for gap_open, t in ((-2.0, 0.0), (-100.0, 1.0)):
            with pytest.raises(RuntimeError, match="by rows"):
                torch.ops.swcli.affine_forward(S, None, None, gap_open, -0.5, t, True)
        with pytest.raises(RuntimeError, match="by rows"):  # past 256 columns
            torch.ops.swcli.affine_forward(torch.randn(3, 5, 257, device=self.device), None, None, -2.0, -0.5, 1.0,
                                           True)
        with pytest.raises(RuntimeError, match="gap_open <= gap_extend <= 0"):
            torch.ops.swcli.affine_forward(S, None, None, -0.5, -2.0, 1.0, True)
        # what the op sends there: every width up to 256, in the scaled form
        for N, lengths, by_rows in ((1, False, True), (32, True, True), (256, False, True), (257, False, False)):
            assert ops.affine_gradient_by_rows(torch.zeros(2, 3, N, device=self.device), lengths, -2.0, 1.0) == by_rows
        limit = 100.0 / math.log2(math.e)  # |o| / t at the scaled form's limit
        assert ops.affine_gradient_by_rows(torch.zeros(2, 3, 200, device=self.device), False, -limit * 0.99, 1.0)
        assert not ops.affine_gradient_by_rows(torch.zeros(2, 3, 200, device=self.device), False, -limit * 1.01, 1.0)
        assert not ops.affine_gradient_by_rows(torch.zeros(2, 3, 200, device=self.device), False, -2.0, 0.0)
        assert not ops.affine_gradient_by_rows(torch.zeros(2, 3, 200, device=self.device).double(), False, -2.0, 1.0)
        # through the op: rows of 1,000 bytes, an S 4 bytes past an aligned address, a non-contiguous S
        wide = torch.randn(3, 5, 250, device=self.device)
        shifted = torch.randn(3 * 5 * 256 + 1, device=self.device)[1:].view(3, 5, 256)
        transposed = torch.randn(3, 200, 5, device=self.device).transpose(1, 2)
        for x in (wide, shifted, transposed):
            assert ops.affine_gradient_by_rows(x, False, -2.0, 1.0)
            G = x.detach().requires_grad_()
            ssw(G, None, 1.0, gap_open=-2.0, gap_extend=-0.5).sum().backward()
            _, exact_grad = exact_gradient(x.detach().cpu(), -2.0, -0.5, 1.0, None, None, torch.ones(3))
            torch.testing.assert_close(G.grad.cpu().double(), exact_grad, rtol=0, atol=1e-5)

    def test_rows_gradient_of_empty_batches(self):
        for shape in [(0, 3, 200), (2, 0, 200), (2, 3, 0)]:
            S = torch.zeros(shape, device=self.device)
            scores, grad = self.affine_rows_gradient(S, None, None, -2.0, -0.5, 1.0,
                                                     torch.ones(shape[0], device=self.device))
            assert scores.shape == (shape[0],) and (scores == 0).all()
            assert grad.shape == shape and (grad == 0).all()
            G = S.requires_grad_()
            ssw(G, None, 1.0, gap_open=-2.0, gap_extend=-0.5).sum().backward()
            assert G.grad.shape == shape and (G.grad == 0).all()
