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
                 torch.from_numpy(np.array(database.index[start:stop])).to(device))


def merge_top(best: Hits | None, scores: torch.Tensor, targets: torch.Tensor, top: int) -> Hits:
    """The best `top` of the hits so far and new ones: by descending score, ties by database order."""
    if best is not None:
        scores = torch.cat([best.scores, scores])
        targets = torch.cat([best.targets, targets])
    by_target = torch.argsort(targets, stable=True)
    scores, targets = scores[by_target], targets[by_target]
    by_score = torch.sort(scores, descending=True, stable=True).indices[:top]
    return Hits(scores[by_score], targets[by_score])


class Searcher:
    """One database on a device, ready for queries: its blocks padded once while they fit max_bytes."""

    def __init__(self, database: Database, matrix: torch.Tensor, gap: float, temperature: float, top: int,
                 backend: str, device=None, max_cells: int = DEFAULT_MAX_CELLS, max_bytes: int = DEFAULT_MAX_BYTES):
        if top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        self.database, self.gap, self.temperature, self.top = database, gap, temperature, top
        self.backend, self.device = backend, device
        self.matrix = matrix.to(device)
        self.bounds = block_bounds(database, max_cells)
        padded = sum((stop - start) * int(database.lengths[start]) for start, stop in self.bounds)
        self.resident = ([make_block(database, start, stop, device) for start, stop in self.bounds]
                         if padded <= max_bytes else None)

    def blocks(self) -> Iterator[Block]:
        if self.resident is not None:
            return iter(self.resident)
        return (make_block(self.database, start, stop, self.device) for start, stop in self.bounds)

    def best(self, codes: bytes) -> Hits:
        """The best `top` hits of one query (its codes), on the host."""
        query = torch.frombuffer(bytearray(codes), dtype=torch.uint8) if codes else torch.zeros(0, dtype=torch.uint8)
        query = query.to(self.device)
        best = None
        for block in self.blocks():
            rows = block.codes.shape[0]
            scores = score_checked_codes(query.expand(rows, -1), block.codes, self.matrix, self.gap,
                                         self.temperature, None, block.lengths, self.backend)
            best = merge_top(best, scores, block.order, self.top)
        if best is None:  # an empty database
            return Hits(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
        return Hits(best.scores.cpu(), best.targets.cpu())


def search(query_codes: Iterator[bytes], database: Database, matrix: torch.Tensor, gap: float, temperature: float,
           top: int, backend: str, device=None, max_cells: int = DEFAULT_MAX_CELLS,
           max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[Hits]:
    """The best `top` hits of each query (codes into `matrix`, on `device`), in query order."""
    searcher = Searcher(database, matrix, gap, temperature, top, backend, device, max_cells, max_bytes)
    for codes in query_codes:
        yield searcher.best(codes)


def open_database(path: str, matrix) -> Database:
    """A database from a folder prepared by makedb (memory-mapped) or from a FASTA file (encoded now)."""
    from swcli import database
    from swcli.fasta import display_name, read_fasta

    if database.is_prepared(path):
        db = database.load(path)
        db.check_alphabet(matrix)
        return db
    return database.build(read_fasta(path), matrix, display_name(path))


def search_rows(queries, query_codes: list[bytes], db: Database, settings, top: int,
                max_bytes: int = DEFAULT_MAX_BYTES):
    """TSV rows (query, target, qlen, tlen, score) of each query's best `top` hits, in query order.

    queries: FASTA records, and query_codes their codes (the caller encodes them, checking every letter,
    before any output); settings: the pipeline's Settings (matrix, gap, temperature, backend). Each
    query is scored in a worker thread, waited for in short steps (pipeline.wait_for), so a signal is
    honoured while an engine call runs."""
    from concurrent.futures import ThreadPoolExecutor

    from swcli.pipeline import counted_call, wait_for

    length_of = np.empty(len(db), dtype=np.int64)
    length_of[db.index] = db.lengths
    searcher = Searcher(db, settings.matrix.tensor(), settings.gap, settings.temperature, top, settings.backend,
                        settings.device, max_bytes=max_bytes)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swcli-search")
    finished = False
    try:
        for query, codes in zip(queries, query_codes):
            found = wait_for(pool.submit(counted_call, searcher.best, codes))
            yield [(query.id, db.ids[target], len(query.sequence), int(length_of[target]), score)
                   for score, target in zip(found.scores.tolist(), found.targets.tolist())]
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)
