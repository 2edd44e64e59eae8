"""The Python double loop: the ground truth every engine is tested against.

The recurrence, for each pair with H[0][*] = H[*][0] = 0, a linear gap score g and temperature t:

    x = (0, H[i-1][j-1] + S[i-1][j-1], H[i-1][j] + g, H[i][j-1] + g)
    H[i][j] = t * logsumexp(x / t)   (t > 0),   max(x)   (t = 0, classic Smith-Waterman)
    score = the max over every cell of H, the zero border included (so score >= 0)

Affine gaps (soft Gotoh), with an open score o (a gap's first position) and an extension score e (each
further one), o <= e <= 0, and smax_t(x...) = t * log(sum_k exp(x_k / t)) (max at t = 0):

    M[i][j] = H[i-1][j-1] + S[i-1][j-1]
    X[i][j] = smax_t(smax_t(0, M[i][j-1], Y[i][j-1]) + o, X[i][j-1] + e)     (a gap along the target)
    Y[i][j] = smax_t(smax_t(0, M[i-1][j], X[i-1][j]) + o, Y[i-1][j] + e)     (a gap along the query)
    H[i][j] = smax_t(0, M[i][j], X[i][j], Y[i][j])
    borders (row 0, column 0): H = 0, M = X = Y = -inf;  score = the max over every cell of H

Every local alignment is counted once: a gap opens from the start (the 0), from a match or from the other
gap, and extends only from itself. Each state is computed here as one smax of four terms: since
smax(a, b) + c = smax(a + c, b + c) and nested smax flatten,

    X[i][j] = smax_t(o, M[i][j-1] + o, Y[i][j-1] + o, X[i][j-1] + e)
    Y[i][j] = smax_t(o, M[i-1][j] + o, Y[i-1][j] + e, X[i-1][j] + o)

which is the same function, and the form the engines compute. The terms are stacked in one order for
every state, start, match, Y, X: at t = 0 it decides which of tied terms the gradient follows, and it is
the linear loop's order (zero, match, delete, insert). With o == e == g, X[i][j] = H[i][j-1] + g and
Y[i][j] = H[i-1][j] + g exactly (the four terms of X are those of H[i][j-1], each plus g), so H is the
linear recurrence above at every temperature; computed, the two agree to rounding.

Slow on purpose: one cell at a time, batched over pairs, differentiable through autograd, which defines
the gradient. Do not optimise it; its value is that it is obviously the recurrence.

The gaps and the temperature are numbers, or tensors (0-d, or (B,) with one value per pair): autograd
through the loop then also defines d score / d gap and d score / d temperature. A pair whose temperature
is 0 takes the hard maximum.
"""

from __future__ import annotations

import torch
from torch import nn


def _soft_max(stack: torch.Tensor, temperature) -> torch.Tensor:
    """t * logsumexp(stack / t) over the last dimension, max at t = 0; t a number or a (B,) tensor."""
    if not isinstance(temperature, torch.Tensor):
        if temperature == 0:
            return stack.max(dim=-1).values
        return temperature * torch.logsumexp(stack / temperature, dim=-1)
    # Per pair: the soft branch at t = 1 where t = 0, so that its (unused) gradient stays finite; a -inf
    # term (an affine state on the border) is divided as a 0 and put back, since d(x / t) / dt = -x / t^2
    # would make its zero weight's gradient 0 * inf = NaN.
    t = temperature.expand(stack.shape[0])
    safe = torch.where(t == 0, torch.ones_like(t), t)
    impossible = stack == float("-inf")
    scaled = torch.where(impossible, stack, torch.where(impossible, 0, stack) / safe[:, None])
    soft = safe * torch.logsumexp(scaled, dim=-1)
    return torch.where(t == 0, stack.max(dim=-1).values, soft)


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
    score_matrix = _padding_as_zero(score_matrix, query_lengths, target_lengths)
    # Cells are kept in lists, not written into a tensor in place: under torch.vmap a value batched by the
    # transform could not be written into a tensor created here, which is not.
    zero = score_matrix.new_zeros(B)
    H = _cells(zero, M, N)
    for i in range(1, M + 1):
        for j in range(1, N + 1):
            match = H[i - 1][j - 1] + score_matrix[:, i - 1, j - 1]
            delete = H[i - 1][j] + gap
            insert = H[i][j - 1] + gap
            stack = torch.stack([torch.zeros_like(match), match, delete, insert], dim=-1)
            H[i][j] = _soft_max(stack, temperature)
    H = _outside_lengths(_table(H), query_lengths, target_lengths)
    return _best(H, score_matrix, gap, temperature)


def _padding_as_zero(S: torch.Tensor, query_lengths, target_lengths) -> torch.Tensor:
    """S with 0 at every cell outside its pair's window. No cell inside reads them, so the scores are the
    same; but a NaN or an infinity there would reach every gradient through the soft maximum's backward
    (0 times NaN), though padding is no part of the pair."""
    if query_lengths is None and target_lengths is None:
        return S
    inside = _window(S.shape, query_lengths, target_lengths, S.device, border=0)
    return torch.where(inside, S, torch.zeros((), dtype=S.dtype, device=S.device))


def _window(shape, query_lengths, target_lengths, device, border: int) -> torch.Tensor:
    """(B, rows, cols) bools: True where row i and column j lie within pair b's window of qlen + border
    rows and tlen + border columns (border 1: a table of H with its zero row and column; a length None:
    every row, or every column)."""
    B, rows, cols = shape
    q = torch.full((B,), rows - border) if query_lengths is None else query_lengths
    t = torch.full((B,), cols - border) if target_lengths is None else target_lengths
    i = torch.arange(rows, device=device).view(1, rows, 1)
    j = torch.arange(cols, device=device).view(1, 1, cols)
    return (i < q.to(device).view(B, 1, 1) + border) & (j < t.to(device).view(B, 1, 1) + border)


def _best(H: torch.Tensor, S: torch.Tensor, *values) -> torch.Tensor:
    """The scores: the max of each pair's H. Where the pairs have no cells (M or N = 0) H is the border
    alone, which no input reaches, so a 0 times each input is added: the scores stay 0, differentiable, with
    zero gradients, as on the engines."""
    B, M1, N1 = H.shape
    scores = H.reshape(B, M1 * N1).max(dim=-1).values
    if M1 == 1 or N1 == 1:
        scores = scores + S.sum(dim=(1, 2))
        for value in values:
            if isinstance(value, torch.Tensor):
                scores = scores + 0 * value
    return scores


def _cells(border: torch.Tensor, M: int, N: int) -> list[list]:
    """Rows 0..M of cells 0..N: `border` in row 0 and column 0, the rest to be computed."""
    return [[border] * (N + 1)] + [[border] + [None] * N for _ in range(M)]


def _table(cells: list[list[torch.Tensor]]) -> torch.Tensor:
    """(B, M+1, N+1) from rows of (B,) cells, each broadcast to the batch (the border's plain zeros, where a
    transform batches the rest)."""
    return torch.stack([torch.stack(torch.broadcast_tensors(*row), dim=-1) for row in cells], dim=1)


def _outside_lengths(H: torch.Tensor, query_lengths, target_lengths) -> torch.Tensor:
    """H (B, M+1, N+1) with -inf at every cell outside its pair's (qlen, tlen) window. A cell depends only
    on cells above and to its left, so the max over the rest is pair b's score on S[b, :qlen, :tlen]."""
    if query_lengths is None and target_lengths is None:
        return H
    return H.masked_fill(~_window(H.shape, query_lengths, target_lengths, H.device, border=1), float("-inf"))


def soft_smith_waterman_affine_reference(
    score_matrix: torch.Tensor,
    gap_open: float,
    gap_extend: float,
    temperature: float = 1.0,
    query_lengths: torch.Tensor | None = None,
    target_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores (B,) of the soft Gotoh recurrence (affine gaps, module docstring); temperature 0 is the hard
    maximum, Gotoh's local alignment. gap_open is the score of a gap's first position, gap_extend of each
    further one. Lengths as in soft_smith_waterman_reference."""
    B, M, N = score_matrix.shape
    score_matrix = _padding_as_zero(score_matrix, query_lengths, target_lengths)
    zero = score_matrix.new_zeros(B)
    never = score_matrix.new_full((B,), float("-inf"))
    H = _cells(zero, M, N)  # in lists, as in the linear loop
    match, X, Y = _cells(never, M, N), _cells(never, M, N), _cells(never, M, N)

    def smax(*terms):
        terms = torch.broadcast_tensors(*terms)
        if isinstance(temperature, torch.Tensor):
            return _soft_max(torch.stack(terms, dim=-1), temperature)
        if temperature == 0:
            # The first largest term, or a NaN: the term torch.max(dim) picks, so autograd sends the
            # gradient to it alone. Pairwise, since on small tensors torch.max(dim) waits for the
            # thread pool on every call (0.1 to 1 ms a call on a busy 2-core machine, against 30 us).
            best = terms[0]
            for term in terms[1:]:
                best = torch.where((term > best) | torch.isnan(term), term, best)
            return best
        return temperature * torch.logsumexp(torch.stack(terms, dim=-1) / temperature, dim=-1)

    start = zero + gap_open  # the 0 of an opening, plus o
    for i in range(1, M + 1):
        for j in range(1, N + 1):
            match[i][j] = H[i - 1][j - 1] + score_matrix[:, i - 1, j - 1]
            X[i][j] = smax(start, match[i][j - 1] + gap_open, Y[i][j - 1] + gap_open, X[i][j - 1] + gap_extend)
            Y[i][j] = smax(start, match[i - 1][j] + gap_open, Y[i - 1][j] + gap_extend, X[i - 1][j] + gap_open)
            H[i][j] = smax(zero, match[i][j], Y[i][j], X[i][j])
    H = _outside_lengths(_table(H), query_lengths, target_lengths)
    return _best(H, score_matrix, gap_open, gap_extend, temperature)


class SoftSmithWatermanReference(nn.Module):
    """The seed module: forward(score_matrix) -> (B,) scores through the Python loop."""

    def __init__(self, gap_open: float = -1.0, temperature: float = 1.0):
        super().__init__()
        self.gap_open = gap_open
        self.temperature = temperature

    def forward(self, score_matrix: torch.Tensor) -> torch.Tensor:
        return soft_smith_waterman_reference(score_matrix, self.gap_open, self.temperature)
