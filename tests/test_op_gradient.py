"""Gradients of the public op (its autograd Function) on every device, against autograd through the reference loop."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli.testing import (
    BACKENDS_FOR,
    TEMPERATURES,
    parametrize_device,
    parametrize_dtype,
    random_lengths,
    random_scores,
    reference_gradient,
    run,
    window_mask,
)

ssw = swcli.soft_smith_waterman


# --------------------------------------------------------------------------------------------------
# Gradients


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("gap", [-0.5, -1.0])
def test_gradient_matches_autograd_through_reference(gap, t, device):
    B, M, N = 6, 9, 8
    S = random_scores((B, M, N), seed=7000, device=device, scale=1.5)  # float64, no ties
    qlen = random_lengths(B, M, seed=7001)
    tlen = random_lengths(B, N, seed=7002)
    qlen[0], tlen[0] = M, N  # one full pair
    grad_out = random_scores((B,), seed=7003, device=device)
    S.requires_grad_()
    out = run(S, gap, t, qlen, tlen)
    (out * grad_out).sum().backward()
    expected_out, expected_grad = reference_gradient(S, gap, t, qlen, tlen, grad_out)
    torch.testing.assert_close(out.detach().cpu(), expected_out, rtol=0, atol=1e-9)
    assert S.grad.shape == S.shape and S.grad.dtype == S.dtype
    torch.testing.assert_close(S.grad.cpu(), expected_grad, rtol=0, atol=1e-9)
    assert (S.grad.cpu()[window_mask(B, M, N, qlen, tlen)] == 0).all()


@parametrize_device
def test_gradient_float32_close_to_reference(device):
    S = random_scores((16, 32, 32), seed=7100, dtype=torch.float32, device=device).requires_grad_()
    run(S, -1.0, 1.0).sum().backward()
    _, expected = reference_gradient(S, -1.0, 1.0, None, None, torch.ones(16))
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=1e-4)


@parametrize_device
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_gradcheck(with_lengths, device):
    S = random_scores((3, 4, 5), seed=7200, device=device).requires_grad_()
    qlen = torch.tensor([4, 2, 3]).to(device) if with_lengths else None
    tlen = torch.tensor([5, 5, 2]).to(device) if with_lengths else None
    backend = BACKENDS_FOR(device)
    assert torch.autograd.gradcheck(
        lambda x: ssw(x, -1.0, 1.0, qlen, tlen, backend=backend), (S,), eps=1e-6, atol=1e-6
    )


@parametrize_device
@parametrize_dtype
@pytest.mark.parametrize("t", TEMPERATURES)
def test_gradient_entries_in_unit_interval(t, dtype, device):
    B, M, N = 12, 15, 13
    S = random_scores((B, M, N), seed=7300, dtype=dtype, device=device).requires_grad_()
    qlen = random_lengths(B, M, seed=7301)
    run(S, -1.0, t, qlen).sum().backward()
    g = S.grad
    assert torch.isfinite(g).all()
    # [0, 1] up to rounding: the backward's weights exp((x - h) / t) carry the rounding of the stored
    # H divided by t (the float64 reference itself gives 1 + 1e-14 at small t).
    slack = 1e-12 if dtype == torch.float64 else 1e-5
    assert (g >= 0).all() and (g <= 1 + slack).all(), f"max entry {g.max().item()!r}"
    assert (g > 0).any()
    if t == 0:  # the hard gradient marks the matched cells of the best alignment
        assert ((g == 0) | (g == 1)).all()


@parametrize_device
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_gradient_goes_to_the_first_of_tied_best_cells(t, device):
    # With gap -1000 every gap term underflows, so H[i][j] = t log(1 + exp(H[i-1][j-1] + S) / t) and two
    # lone 5s give two bit-identical best cells, at (1, 3) and (3, 1) (1-based H indices). torch.max in
    # the reference takes the first in row-major order, (1, 3): the gradient must all go there.
    S = torch.full((1, 3, 3), -1000.0, dtype=torch.float64, device=device)
    S[0, 0, 2] = S[0, 2, 0] = 5.0
    S.requires_grad_()
    run(S, -1000.0, t).sum().backward()
    expected = torch.zeros(1, 3, 3, dtype=torch.float64)
    expected[0, 0, 2] = 1.0 if t == 0 else 1.0 / (1.0 + math.exp(-5.0))
    _, through_reference = reference_gradient(S, -1000.0, t, None, None, torch.ones(1))
    torch.testing.assert_close(through_reference, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(S.grad.cpu(), expected, rtol=0, atol=1e-12)


@parametrize_device
@parametrize_dtype
def test_gradient_with_minus_infinite_scores(dtype, device):
    # A -inf score forbids a match: its term weighs exp(-inf) = 0 in the reference, and exactly 0 in the
    # CPU engine's vector weights. The CUDA engine takes the match weight as what the other three leave
    # (1 - w_up - w_left - w_zero), so there it is 0 up to their rounding.
    S = random_scores((4, 12, 15), seed=7500, dtype=dtype, device=device, shift=0.5)
    S[:, 3:6, 2:9] = -math.inf
    S.requires_grad_()
    run(S, -1.0, 1.0).sum().backward()
    _, expected = reference_gradient(S, -1.0, 1.0, None, None, torch.ones(4))
    if torch.device(device).type == "cpu":
        assert (S.grad[:, 3:6, 2:9] == 0).all()
    tolerance = 1e-8 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(S.grad.cpu().double(), expected, rtol=0, atol=tolerance)


@parametrize_device
def test_gradient_of_empty_batches(device):
    for shape in [(0, 3, 4), (2, 0, 3), (2, 3, 0)]:
        S = torch.zeros(shape, dtype=torch.float64, device=device, requires_grad=True)
        run(S, -1.0, 1.0).sum().backward()
        assert S.grad.shape == shape and (S.grad == 0).all()


@parametrize_device
@parametrize_dtype
def test_no_grad(dtype, device):
    S = random_scores((5, 10, 9), seed=7400, dtype=dtype, device=device).requires_grad_()
    with torch.no_grad():
        quiet = run(S, -1.0, 1.0)
    assert not quiet.requires_grad and quiet.grad_fn is None
    plain = run(S.detach(), -1.0, 1.0)
    assert not plain.requires_grad
    tracked = run(S, -1.0, 1.0)
    assert tracked.requires_grad
    assert torch.equal(quiet, plain)
    # Keeping the DP table for the backward does not change the forward on the CPU, bit for bit: both take
    # the scaled sweep at t > 0 in float32. On CUDA the forward that keeps it is the log-space sweep, and
    # float32 scores without it take a scaled one: the same within float32's rounding.
    if device.type == "cpu" or dtype == torch.float64:
        assert torch.equal(quiet, tracked.detach())
    else:
        torch.testing.assert_close(quiet, tracked.detach(), rtol=1e-5, atol=1e-5)
