"""Chunks of pairs -> length-sorted, padded batches of codes on the compute device.

A chunk bounds how many pairs are in memory at once (so memory stays flat whatever the input size);
within a chunk, pairs are sorted by length so that each batch pads little, and each batch is cut to two
budgets: padded residues, b * (M + N), which bound the padded code tensors (and the engines' per-pair
rows) whatever the mix of lengths, so one huge pair among short ones gets a batch of its own instead of
widening every row of the chunk to its length; and padded cells, b * M * N, which bound the (B, M, N)
score tensor wherever one is built (the reference). A pair over either budget alone is a batch of one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

DEFAULT_MAX_CELLS = 1 << 26  # padded cells per batch: 256 MiB of float32 scores where S is built
# Padded residues per batch (query and target rows together): 16 MiB of uint8 codes on the host and as
# much on the device, plus what the engines keep per padded row (CUDA: a float per query residue for
# long targets). 4,096 pairs of proteins up to 2,048 residues each still fit in one batch.
DEFAULT_MAX_RESIDUES = 1 << 24


@dataclass
class Batch:
    positions: list[int]  # where each pair of the batch sits in its chunk
    query_codes: torch.Tensor  # (b, M) uint8, padded with code 0
    target_codes: torch.Tensor  # (b, N) uint8
    query_lengths: torch.Tensor  # (b,) int64
    target_lengths: torch.Tensor  # (b,) int64
    cells: int  # real (unpadded) cells, the work the batch stands for: counted on the host, as reading
    #             them from device lengths would wait for the device


def chunked(items: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of at most `size` items, read lazily."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def pad_codes(codes: list[bytes], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, longest) uint8 codes padded with 0, and the (b,) lengths: one memcpy-like slice per pair."""
    sizes = [len(c) for c in codes]
    width = max(sizes, default=0)
    padded = bytearray(len(codes) * width)
    for row, (c, size) in enumerate(zip(codes, sizes)):
        padded[row * width: row * width + size] = c
    lengths = torch.tensor(sizes, dtype=torch.int64)
    table = torch.frombuffer(padded, dtype=torch.uint8) if padded else torch.zeros(0, dtype=torch.uint8)
    return table.view(len(codes), width).to(device), lengths.to(device)


def make_batches(
    query_codes: list[bytes], target_codes: list[bytes], max_cells: int = DEFAULT_MAX_CELLS, device=None,
    max_residues: int = DEFAULT_MAX_RESIDUES,
) -> list[Batch]:
    """Sort the chunk's pairs by length and cut it into batches of at most max_cells padded cells
    (b * M * N) and at most max_residues padded residues (b * (M + N)); a pair over a budget by itself
    gets a batch of its own."""
    lengths = list(zip(map(len, query_codes), map(len, target_codes)))
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    rows = cols = 0
    for k in order:
        q, t = lengths[k]
        grown_rows, grown_cols = max(rows, q), max(cols, t)
        size = len(groups[-1]) + 1 if groups else 1
        if (groups and size * grown_rows * grown_cols <= max_cells
                and size * (grown_rows + grown_cols) <= max_residues):
            groups[-1].append(k)
            rows, cols = grown_rows, grown_cols
        else:
            groups.append([k])
            rows, cols = q, t
    batches = []
    for positions in groups:
        q_codes, q_lengths = pad_codes([query_codes[k] for k in positions], device)
        t_codes, t_lengths = pad_codes([target_codes[k] for k in positions], device)
        cells = sum(lengths[k][0] * lengths[k][1] for k in positions)
        batches.append(Batch(positions, q_codes, t_codes, q_lengths, t_lengths, cells))
    return batches
