"""kernels/cuda/long_pairs.cu's own source, run on the CPU by a lockstep emulation of the CUDA features it uses
(tests/cuda_emulation), against the CPU engine: its scores and gradients, at tile edges, with lengths and NaN
padding, at t = 0 (the same floats as the CPU engine's float32 sweep) and t > 0 (within float32 of its float64
one). No GPU runs here, so this is where the kernels' index arithmetic and their launches' order meet the
recurrence before the GPU suite (tests/test_cuda_long_pairs.py) runs them for real. The emulation computes ex2
and lg2 with exp2f and log2f, and runs blocks one after another: it says nothing of the device's rounding of
those, nor of races between blocks (the tiles of one launch share no element they write)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import swcli
from swcli.testing import window_mask

sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_emulation"))
from emulate import EmulatedLongPairs, build  # noqa: E402


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> EmulatedLongPairs:
    return EmulatedLongPairs(build(tmp_path_factory.mktemp("emulated_long_pairs")))


def cpu_gradient(S: torch.Tensor, qlen, tlen, gap: float, t: float, grad: torch.Tensor):
    """(scores, gradient) of the CPU engine, in S's dtype."""
    S = S.detach().clone().requires_grad_()
    out = swcli.soft_smith_waterman(S, gap, t, qlen, tlen, backend="cpu")
    (out * grad.to(S.dtype)).sum().backward()
    return out.detach(), S.grad


def check(tiles, S, qlen, tlen, gap, t, grad=None, given=None):
    """The emulated tiles' scores and gradient of `given` (S, or S with NaN padding) against the CPU engine's of
    S: equal to its float32 ones at t = 0, within float32 of its float64 ones at t > 0. Returns the scores."""
    B = S.shape[0]
    grad = torch.ones(B) if grad is None else grad
    given = S if given is None else given
    q = None if qlen is None else qlen.numpy()
    n = None if tlen is None else tlen.numpy()
    scores, best_at, state, _ = tiles.forward(given.numpy(), q, n, gap, t)
    grad_S = tiles.backward(grad.numpy(), given.numpy(), q, n, state, best_at, gap, t)
    assert not np.isnan(grad_S).any(), f"gradient elements left unwritten: {np.argwhere(np.isnan(grad_S))[:4]}"
    if t == 0:
        expected, expected_grad = cpu_gradient(S.float(), qlen, tlen, gap, t, grad)
        assert np.array_equal(scores, expected.numpy(), equal_nan=True)
        assert np.array_equal(grad_S, expected_grad.numpy())
    else:
        expected, expected_grad = cpu_gradient(S.double(), qlen, tlen, gap, t, grad)
        np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-6, atol=1e-4)
        np.testing.assert_allclose(grad_S, expected_grad.numpy(), rtol=0, atol=1e-4)
    return scores


def scores_of(shape, seed, shift=0.3):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) + shift


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_lengths_nan_padding_and_weights(tiles, t):
    # 2 x 3 tiles, partial at the right and the bottom; pairs of a tile and a half, and of a few rows; rows of S
    # not 16-byte aligned (270: one value at a time)
    B, M, N = 3, 140, 270
    S = scores_of((B, M, N), 100)
    qlen, tlen = torch.tensor([140, 129, 5]), torch.tensor([270, 131, 259])
    padded = S.clone()
    padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
    check(tiles, S, qlen, tlen, -1.0, t, torch.tensor([1.0, -0.5, 2.0]), given=padded)


@pytest.mark.parametrize("t", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(2, 150, 272), (2, 1, 300), (2, 300, 1), (1, 129, 129), (2, 100, 100), (1, 256, 384)],
                         ids=["aligned rows", "1x300", "300x1", "one past a tile", "one tile", "whole tiles"])
def test_shapes(tiles, shape, t):
    check(tiles, scores_of(shape, 200 + sum(shape)), None, None, -1.0, t)


def test_temperature_zero_ties(tiles):
    # Integer scores: many equal terms and equal cells, across tiles; the gradient follows the CPU engine's
    # alignment (the first maximal term in the order zero, match, delete, insert; the first best cell).
    S = torch.randint(-3, 4, (2, 131, 260), generator=torch.Generator().manual_seed(300)).float()
    check(tiles, S, None, None, -1.0, 0.0)


def test_border_and_nan_pairs(tiles):
    S = scores_of((3, 140, 150), 400)
    S[0] = -2.0  # at t = 0 the score is the border: 0, no gradient
    out = check(tiles, S, None, None, -1.0, 0.0)
    assert out[0] == 0.0
    S[1, 130, 7] = float("nan")  # that pair's score only
    scores, _, _, _ = tiles.forward(S.numpy(), None, None, -1.0, 1.0)
    alone, _, _, _ = tiles.forward(S[2:].contiguous().numpy(), None, None, -1.0, 1.0)
    assert np.isnan(scores[1]) and scores[2] == alone[0]


def test_pairs_counted_in_log_space(tiles):
    S = scores_of((3, 130, 140), 500)
    qlen = np.array([130, 0, 3])
    assert tiles.forward(S.numpy(), qlen, None, -1.0, 1.0)[3] == 2
    assert tiles.forward(S.numpy(), qlen, None, -1.0, 0.0)[3] == 0
