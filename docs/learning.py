"""Learning through the op: recover a hidden substitution matrix from alignment scores.

soft_smith_waterman is differentiable with respect to its (B, M, N) score matrix, and a score matrix
built from a K x K substitution matrix by a gather, W[query_codes[:, :, None], target_codes[:, None, :]],
passes that gradient on to W. So W can be fitted by gradient descent like any other parameter.

Here a hidden symmetric 4 x 4 DNA matrix scores 64 sequence pairs (half of them related by mutation, so
their best alignments are long and non-trivial); starting from zeros, Adam fits a matrix whose scores
match those targets (mean squared error), and the fitted matrix comes out close to the hidden one.
Temperature 1 (soft) makes every cell of every alignment contribute to the score, so every entry of W
gets a gradient; at temperature 0 only the cells of the single best alignment would.

Runs on the CPU in a few seconds: python3 docs/learning.py (the first call of backend="cpu" compiles
the engine once, about 40 s, and caches it in ~/.cache/swcli).
"""

from __future__ import annotations

import torch

from swcli import soft_smith_waterman

ALPHABET = "ACGT"
GAP = -2.0
TEMPERATURE = 1.0

# The hidden matrix: positive on the diagonal, negative elsewhere, transitions (A<->G, C<->T) milder.
TRUE_MATRIX = torch.tensor([
    [2.0, -1.5, -0.5, -1.0],
    [-1.5, 2.5, -1.0, -0.5],
    [-0.5, -1.0, 1.5, -1.5],
    [-1.0, -0.5, -1.5, 3.0],
], dtype=torch.float64)


def make_pairs(n_pairs: int, generator: torch.Generator):
    """Random pairs of codes 0..3, zero-padded: (query (B, M), target (B, N), query_lengths, target_lengths).

    Every other target is a mutated copy of its query (some letters substituted, some deleted), so the
    data holds long alignments of matching and mismatching letters, not only short chance matches.
    """
    queries, targets = [], []
    for b in range(n_pairs):
        length = int(torch.randint(10, 31, (1,), generator=generator))
        query = torch.randint(0, 4, (length,), generator=generator)
        if b % 2 == 0:
            target = query.clone()
            substituted = torch.rand(length, generator=generator) < 0.3
            target[substituted] = torch.randint(0, 4, (int(substituted.sum()),), generator=generator)
            target = target[torch.rand(length, generator=generator) >= 0.1]  # delete ~10% of letters
        else:
            target = torch.randint(0, 4, (int(torch.randint(10, 31, (1,), generator=generator)),),
                                   generator=generator)
        queries.append(query)
        targets.append(target)
    query_lengths = torch.tensor([len(q) for q in queries])
    target_lengths = torch.tensor([len(t) for t in targets])
    pad = torch.nn.utils.rnn.pad_sequence  # padding is never read: the lengths mask it out
    return pad(queries, batch_first=True), pad(targets, batch_first=True), query_lengths, target_lengths


def scores(matrix: torch.Tensor, query, target, query_lengths, target_lengths) -> torch.Tensor:
    """(B,) soft Smith-Waterman scores of the pairs under a K x K substitution matrix."""
    score_matrix = matrix[query[:, :, None], target[:, None, :]]  # (B, M, N), differentiable in matrix
    return soft_smith_waterman(score_matrix, gap=GAP, temperature=TEMPERATURE, query_lengths=query_lengths,
                               target_lengths=target_lengths, backend="cpu")


def fit(steps: int = 500, seed: int = 0, n_pairs: int = 64, lr: float = 0.3, log_every: int = 0):
    """Fit a symmetric matrix to the scores TRUE_MATRIX gives; (learned, true, first_loss, final_loss).

    The parameter W is unconstrained; the matrix used is (W + W.T) / 2, so it is symmetric by
    construction, as substitution matrices are. log_every > 0 prints the loss every that many steps.
    """
    generator = torch.Generator().manual_seed(seed)
    query, target, query_lengths, target_lengths = make_pairs(n_pairs, generator)
    with torch.no_grad():
        target_scores = scores(TRUE_MATRIX, query, target, query_lengths, target_lengths)

    W = torch.zeros(4, 4, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([W], lr=lr)
    first_loss = None
    for step in range(steps + 1):
        matrix = (W + W.T) / 2
        loss = torch.mean((scores(matrix, query, target, query_lengths, target_lengths) - target_scores) ** 2)
        if first_loss is None:
            first_loss = loss.item()
        if log_every and step % log_every == 0:
            print(f"step {step:4d}  loss {loss.item():.3e}")
        if step == steps:  # the last loss is measured, not stepped past
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ((W + W.T) / 2).detach(), TRUE_MATRIX.clone(), first_loss, loss.item()


def _show(name: str, matrix: torch.Tensor) -> None:
    print(f"{name}:\n     " + "      ".join(ALPHABET))
    for letter, row in zip(ALPHABET, matrix.tolist()):
        print(f"  {letter} " + " ".join(f"{value:6.2f}" for value in row))


if __name__ == "__main__":
    learned, true, first_loss, final_loss = fit(log_every=100)
    _show("learned", learned)
    _show("true", true)
    print(f"loss {first_loss:.3e} -> {final_loss:.3e}; max |learned - true| = "
          f"{(learned - true).abs().max().item():.4f}")
