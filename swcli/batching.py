"""A chunk of pairs -> length-sorted, padded batches of codes on the compute device.

A chunk bounds how many pairs are in memory at once (so memory stays flat whatever the input size);
within a chunk, pairs are sorted by length so that each batch pads little, and each batch is cut to two
budgets: padded residues, b * (M + N), which bound the padded code tensors (and the engines' per-pair
rows) whatever the mix of lengths, so one huge pair among short ones gets a batch of its own instead of
widening every row of the chunk to its length; and padded cells, b * M * N, which bound the (B, M, N)
score tensor wherever one is built (the reference). A pair over either budget alone is a batch of one.

The codes of a chunk's sequences travel to the device once, back to back (`Codes`); each batch's padded
(b, M) rows are gathered from them there (on a GPU the host pads nothing; on the CPU a C loop copies
each row once).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_MAX_CELLS = 1 << 26  # padded cells per batch: 256 MiB of float32 scores where S is built
# Padded residues per batch (query and target rows together): 16 MiB of uint8 codes on the device, plus
# what the engines keep per padded row (CUDA: a float per query residue for long targets), and the
# gather's index. 4,096 pairs of proteins up to 2,048 residues each still fit in one batch.
DEFAULT_MAX_RESIDUES = 1 << 24
_FIRST_WINDOW = 4096  # pairs looked at when a batch is cut; doubled while they all fit


@dataclass(frozen=True)
class Codes:
    """Sequences' codes back to back on the compute device, and where each one starts (on the host)."""

    flat: torch.Tensor  # (total,) uint8
    offsets: np.ndarray  # (n + 1,) int64

    @classmethod
    def of(cls, codes: np.ndarray, offsets: np.ndarray, device=None) -> Codes:
        return cls(torch.from_numpy(codes).to(device), offsets)

    @classmethod
    def of_list(cls, codes: list[bytes], device=None) -> Codes:
        """From one bytes object per sequence (tests, bench)."""
        offsets = np.zeros(len(codes) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in codes], out=offsets[1:])
        flat = np.frombuffer(bytearray(b"".join(codes)), dtype=np.uint8)
        return cls.of(flat, offsets, device)


@dataclass
class Batch:
    positions: np.ndarray  # (b,) int64: where each pair of the batch sits in its chunk
    positions_on_device: torch.Tensor  # the same, on the compute device (the scores are put back there)
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


def plan_batches(query_lengths: np.ndarray, target_lengths: np.ndarray, max_cells: int = DEFAULT_MAX_CELLS,
                 max_residues: int = DEFAULT_MAX_RESIDUES) -> list[np.ndarray]:
    """The pairs sorted by (query, target) length and cut, greedily in that order, into groups of at
    most max_cells padded cells (b * M * N) and max_residues padded residues (b * (M + N)); a pair over
    a budget by itself is a group of its own. Each group holds positions into the inputs."""
    order = np.lexsort((target_lengths, query_lengths))
    rows_sorted = query_lengths[order].astype(np.float64)  # float: the products below cannot overflow
    cols_sorted = target_lengths[order].astype(np.float64)
    groups, start, n = [], 0, len(order)
    while start < n:
        window = _FIRST_WINDOW
        while True:
            stop = min(n, start + window)
            rows = rows_sorted[start:stop]  # non-decreasing: the last one is the batch's M
            cols = np.maximum.accumulate(cols_sorted[start:stop])
            size = np.arange(1, stop - start + 1, dtype=np.float64)
            fits = (size * rows * cols <= max_cells) & (size * (rows + cols) <= max_residues)
            if not fits.all() or stop == n:
                break
            window *= 2
        count = max(1, len(fits) if fits.all() else int(np.argmin(fits)))  # fits is True, then False
        groups.append(order[start:start + count])
        start += count
    return groups


def pad_rows(codes: Codes, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(b, width) uint8 on the codes' device: row r holds codes.flat[starts[r]:starts[r] + lengths[r]],
    then zeros. On the CPU a copy per row (kernels/host/pad_rows.cpp); on a GPU tensor operations."""
    if width == 0 or codes.flat.numel() == 0:
        return codes.flat.new_zeros((len(starts), width))
    if codes.flat.device.type == "cpu":
        from swcli import _host

        return torch.from_numpy(_host.pad_rows(codes.flat.numpy(), starts.numpy(), lengths.numpy(), width))
    return gather_rows(codes.flat, starts, lengths, width)


def gather_rows(flat: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """pad_rows as tensor operations: one gather of (b, width) codes, then zeros past each length."""
    index_type = torch.int32 if flat.numel() < 2**31 else torch.int64  # half the gather's index
    columns = torch.arange(width, dtype=index_type, device=flat.device)
    index = starts.to(index_type)[:, None] + columns
    inside = columns < lengths[:, None]
    index = torch.where(inside, index, 0)
    return torch.where(inside, flat.index_select(0, index.view(-1)).view(len(starts), width), 0)


def make_batches(queries: Codes, query_index: np.ndarray, targets: Codes, target_index: np.ndarray,
                 max_cells: int = DEFAULT_MAX_CELLS, device=None,
                 max_residues: int = DEFAULT_MAX_RESIDUES) -> list[Batch]:
    """The pairs (queries sequence query_index[k], targets sequence target_index[k]) in length-sorted,
    padded batches on `device` (plan_batches). The codes must already be on that device."""
    q_starts, q_lengths = queries.offsets[query_index], np.diff(queries.offsets)[query_index]
    t_starts, t_lengths = targets.offsets[target_index], np.diff(targets.offsets)[target_index]
    batches = []
    for positions in plan_batches(q_lengths, t_lengths, max_cells, max_residues):
        columns = np.stack([positions, q_starts[positions], q_lengths[positions], t_starts[positions],
                            t_lengths[positions]])
        on_device = torch.from_numpy(columns).to(device)  # one copy for the five columns
        where, qs, ql, ts, tl = on_device
        width_q, width_t = int(q_lengths[positions].max()), int(t_lengths[positions].max())
        cells = int((q_lengths[positions] * t_lengths[positions]).sum())
        batches.append(Batch(positions, where, pad_rows(queries, qs, ql, width_q), pad_rows(targets, ts, tl, width_t),
                             ql, tl, cells))
    return batches


def batches_of(query_codes: list[bytes], target_codes: list[bytes], max_cells: int = DEFAULT_MAX_CELLS,
               device=None, max_residues: int = DEFAULT_MAX_RESIDUES) -> list[Batch]:
    """make_batches for pairs k = (query_codes[k], target_codes[k]) given as bytes (tests, bench)."""
    index = np.arange(len(query_codes), dtype=np.int64)
    return make_batches(Codes.of_list(query_codes, device), index, Codes.of_list(target_codes, device), index,
                        max_cells, device, max_residues)
