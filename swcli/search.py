"""Queries x database: every query against every database sequence, the best k of each kept on the device.

The database's sequences are cut, in their length order, into blocks of at most `max_cells` padded
cells per query residue, padded once and kept on the device while they fit `max_bytes` (else padded
again for each query: the same result, streamed). Each query is scored against each block through the
codes operator, and its best k so far are merged with the block's on the device, so no (queries x
database) score matrix ever exists. Ties are broken by database order, as a stable sort by database
order and then by score gives them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from swcli.database import Database
from swcli.ops import score_checked_codes

DEFAULT_MAX_CELLS = 1 << 24  # padded target cells per block, per query residue: 16 MiB of codes
DEFAULT_MAX_BYTES = 1 << 32  # padded blocks kept on the device beyond this are padded again per query


@dataclass(frozen=True)
class Block:
    start: int  # the block's first sequence in the database's length order
    codes: torch.Tensor  # (n, width) uint8, padded with 0
    lengths: torch.Tensor  # (n,) int64
    order: torch.Tensor  # (n,) int64 database order of each row


@dataclass(frozen=True)
class Hits:
    scores: torch.Tensor  # (k,) float32, descending
    targets: torch.Tensor  # (k,) int64 database order


def block_bounds(database: Database, max_cells: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of the length order, each of at most max_cells padded cells (one sequence
    longer than that is a block of its own)."""
    lengths = database.lengths
    bounds, start = [], 0
    while start < len(lengths):
        width = max(int(lengths[start]), 1)  # longest first: the block's width is its first length
        rows = max(1, max_cells // width)
        stop = min(len(lengths), start + rows)
        bounds.append((start, stop))
        start = stop
    return bounds


def make_block(database: Database, start: int, stop: int, device) -> Block:
    codes, lengths = database.padded(start, stop)
    return Block(start, torch.from_numpy(codes).to(device), torch.from_numpy(lengths).to(device),
                 torch.from_numpy(np.ascontiguousarray(database.index[start:stop])).to(device))


def merge_top(best: Hits | None, scores: torch.Tensor, targets: torch.Tensor, top: int) -> Hits:
    """The best `top` of the hits so far and new ones: by descending score, ties by database order."""
    if best is not None:
        scores = torch.cat([best.scores, scores])
        targets = torch.cat([best.targets, targets])
    by_target = torch.argsort(targets, stable=True)
    scores, targets = scores[by_target], targets[by_target]
    by_score = torch.sort(scores, descending=True, stable=True).indices[:top]
    return Hits(scores[by_score], targets[by_score])


def search(query_codes: Iterator[bytes], database: Database, matrix: torch.Tensor, gap: float, temperature: float,
           top: int, backend: str, device=None, max_cells: int = DEFAULT_MAX_CELLS,
           max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[Hits]:
    """The best `top` hits of each query (codes into `matrix`, on `device`), in query order."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    bounds = block_bounds(database, max_cells)
    padded_bytes = sum((stop - start) * int(database.lengths[start]) for start, stop in bounds)
    resident = [make_block(database, start, stop, device) for start, stop in bounds] if padded_bytes <= max_bytes else None
    matrix = matrix.to(device)
    for codes in query_codes:
        query = torch.frombuffer(bytearray(codes), dtype=torch.uint8) if codes else torch.zeros(0, dtype=torch.uint8)
        query = query.to(device)
        best = None
        blocks = resident if resident is not None else (make_block(database, a, b, device) for a, b in bounds)
        for block in blocks:
            rows = block.codes.shape[0]
            scores = score_checked_codes(query.expand(rows, -1).contiguous(), block.codes, matrix, gap, temperature,
                                         None, block.lengths, backend)
            best = merge_top(best, scores, block.order, top)
        if best is None:  # an empty database
            best = Hits(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
        yield Hits(best.scores.cpu(), best.targets.cpu())
