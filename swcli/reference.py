"""The Python double loop: the ground truth every engine is tested against.

The recurrence, for each pair with H[0][*] = H[*][0] = 0, a linear gap score g and temperature t:

    x = (0, H[i-1][j-1] + S[i-1][j-1], H[i-1][j] + g, H[i][j-1] + g)
    H[i][j] = t * logsumexp(x / t)   (t > 0),   max(x)   (t = 0, classic Smith-Waterman)
    score = the max over every cell of H, the zero border included (so score >= 0)

Slow on purpose: one cell at a time, batched over pairs, differentiable through autograd, which defines
the gradient. Do not optimise it; its value is that it is obviously the recurrence.
"""

from __future__ import annotations

import torch
from torch import nn


def soft_smith_waterman_reference(
    score_matrix: torch.Tensor,
    gap: float = -1.0,
    temperature: float = 1.0,
    query_lengths: torch.Tensor | None = None,
    target_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores (B,) of the soft Smith-Waterman recurrence; temperature 0 is the hard maximum.

    With lengths, pair b is scored on score_matrix[b, :query_lengths[b], :target_lengths[b]] only: a cell
    depends only on cells above and to its left, so that is the max of H over the same window.
    """
    B, M, N = score_matrix.shape
    H = torch.zeros(B, M + 1, N + 1, dtype=score_matrix.dtype, device=score_matrix.device)
    for i in range(1, M + 1):
        for j in range(1, N + 1):
            match = H[:, i - 1, j - 1] + score_matrix[:, i - 1, j - 1]
            delete = H[:, i - 1, j] + gap
            insert = H[:, i, j - 1] + gap
            zero = torch.zeros_like(match)
            stack = torch.stack([zero, match, delete, insert], dim=-1)
            if temperature == 0:
                H[:, i, j] = stack.max(dim=-1).values
            else:
                H[:, i, j] = temperature * torch.logsumexp(stack / temperature, dim=-1)
    if query_lengths is not None or target_lengths is not None:
        rows = torch.arange(M + 1, device=H.device).view(1, M + 1, 1)
        cols = torch.arange(N + 1, device=H.device).view(1, 1, N + 1)
        q = torch.full((B,), M) if query_lengths is None else query_lengths
        t = torch.full((B,), N) if target_lengths is None else target_lengths
        inside = (rows <= q.to(H.device).view(B, 1, 1)) & (cols <= t.to(H.device).view(B, 1, 1))
        H = H.masked_fill(~inside, float("-inf"))
    return H.reshape(B, (M + 1) * (N + 1)).max(dim=-1).values


class SoftSmithWatermanReference(nn.Module):
    """The seed module: forward(score_matrix) -> (B,) scores through the Python loop."""

    def __init__(self, gap_open: float = -1.0, temperature: float = 1.0):
        super().__init__()
        self.gap_open = gap_open
        self.temperature = temperature

    def forward(self, score_matrix: torch.Tensor) -> torch.Tensor:
        return soft_smith_waterman_reference(score_matrix, self.gap_open, self.temperature)
