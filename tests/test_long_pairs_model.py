"""The float64 model of the CUDA tiles of long pairs (tests/long_pairs_model.py) against the reference loop.

The model runs the kernels' plan (lanes, steps, the tiles' buffers, the launches by anti-diagonal, the
reverse sweep of the gradient) on tiles small enough that a pair of a few dozen cells holds many of them,
partial ones at its edges included. It runs on the CPU, so the plan the CUDA code follows is checked here
where it cannot run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from long_pairs_model import Shape, backward, forward, swept
from swcli.testing import random_lengths, random_scores, reference_gradient, window_mask

# Few lanes of few columns and few rows, so that small pairs hold many tiles and partial ones.
SHAPES = {
    "3 rows, 3 lanes of 2": Shape(rows=3, lanes=3, lane_columns=2),
    "4 rows, 2 lanes of 3": Shape(rows=4, lanes=2, lane_columns=3),
    "1 row, 1 lane of 1": Shape(rows=1, lanes=1, lane_columns=1),
    "5 rows, 4 lanes of 1": Shape(rows=5, lanes=4, lane_columns=1),
}


def model(S: torch.Tensor, qlen, tlen, gap: float, t: float, shape: Shape, grad=None):
    """(scores, gradient) of the model on S (B, M, N), full pairs where the lengths are None."""
    B, M, N = S.shape
    qlen = np.full(B, M) if qlen is None else qlen.numpy()
    tlen = np.full(B, N) if tlen is None else tlen.numpy()
    array = S.detach().double().numpy()
    scores, best_at, plan = forward(array, qlen, tlen, gap, t, shape)
    grad = np.ones(B) if grad is None else grad.numpy()
    return torch.from_numpy(scores), torch.from_numpy(backward(array, qlen, tlen, grad, plan, best_at))


def check(S, qlen, tlen, gap, t, shape, grad=None):
    B = S.shape[0]
    grad = torch.ones(B, dtype=torch.float64) if grad is None else grad
    scores, gradient = model(S, qlen, tlen, gap, t, shape, grad)
    expected_scores, expected_gradient = reference_gradient(S, gap, t, qlen, tlen, grad)
    torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-9)
    assert not gradient.isnan().any(), "a gradient element the model did not write"
    torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=1e-9)


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("t", [0.0, 0.5, 1.0, 3.0])
def test_model_matches_reference(shape, t):
    # M != N, lengths from 0 to the full size, tiles cut at every edge
    B, M, N = 4, 11, 14
    S = random_scores((B, M, N), seed=40 + int(10 * t), dtype=torch.float64, scale=2.0, shift=0.5)
    qlen, tlen = random_lengths(B, M, seed=41), random_lengths(B, N, seed=42)
    qlen[0], tlen[0] = M, N
    check(S, qlen, tlen, -1.0, t, shape, grad=torch.tensor([1.0, -0.5, 2.0, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("t", [0.0, 1.0])
@pytest.mark.parametrize("size", [(1, 17), (17, 1), (1, 1), (6, 6), (7, 7), (12, 13)],
                         ids=["1x17", "17x1", "1x1", "2x2 tiles", "one past 2x2 tiles", "12x13"])
def test_model_strips_and_tile_edges(size, t):
    shape = Shape(rows=3, lanes=3, lane_columns=2)  # tiles of 3 x 6
    S = random_scores((2, *size), seed=50, dtype=torch.float64, scale=2.0, shift=0.7)
    check(S, None, None, -0.5, t, shape)


def test_model_temperature_zero_ties():
    # Integer scores: many equal terms, where the gradient must follow the first maximal term in the order
    # zero, match, delete, insert, and end at the first best cell in row-major order, across tiles.
    g = torch.Generator().manual_seed(60)
    S = torch.randint(-2, 3, (3, 13, 16), generator=g).double()
    for shape in SHAPES.values():
        check(S, None, None, -1.0, 0.0, shape)


def test_model_nan_padding_never_reaches_a_cell():
    # Columns past a target in a lane's last columns are computed from the padding (NaN here) and must
    # pass nothing on: not to the scores, not to the gradient.
    shape = Shape(rows=3, lanes=3, lane_columns=2)
    B, M, N = 3, 10, 15
    S = random_scores((B, M, N), seed=70, dtype=torch.float64, scale=2.0, shift=0.5)
    qlen, tlen = torch.tensor([10, 7, 4]), torch.tensor([13, 9, 15])
    padded = S.clone()
    padded[window_mask(B, M, N, qlen, tlen)] = float("nan")
    for t in (0.0, 1.0):
        scores, gradient = model(padded, qlen, tlen, -1.0, t, shape)
        expected_scores, expected_gradient = reference_gradient(S, -1.0, t, qlen, tlen, torch.ones(B))
        torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-9)
        torch.testing.assert_close(gradient, expected_gradient, rtol=0, atol=1e-9)


def test_model_border_score_has_no_gradient():
    shape = Shape(rows=3, lanes=2, lane_columns=2)
    S = torch.full((2, 8, 9), -3.0, dtype=torch.float64)
    scores, gradient = model(S, None, None, -1.0, 0.0, shape)
    assert scores.tolist() == [0.0, 0.0]
    assert (gradient == 0).all()


def test_swept_region():
    # The backward writes rows up to the best cell's and columns up to the end of its tile column.
    shape = Shape(rows=4, lanes=2, lane_columns=3)
    assert swept(shape, 20, 15, 18, -1) == (0, 0)
    assert swept(shape, 20, 15, 18, 5 * 20 + 7) == (6, 12)
    assert swept(shape, 20, 15, 14, 5 * 20 + 13) == (6, 14)
