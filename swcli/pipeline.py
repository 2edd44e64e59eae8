"""read -> encode -> batch -> score, chunk by chunk: the loop behind `swcli align` and `swcli bench`.

Output order is input order: each chunk's scores are put back in place before its rows are yielded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from swcli.batching import DEFAULT_MAX_CELLS, chunked, make_batches
from swcli.fasta import FastaRecord
from swcli.ops import soft_smith_waterman_codes
from swcli.scoring import SubstitutionMatrix

DEFAULT_CHUNK_SIZE = 4096


@dataclass
class Settings:
    matrix: SubstitutionMatrix
    gap: float = -4.0
    temperature: float = 1.0
    backend: str = "cpu"  # a resolved backend: cpu, cuda or reference
    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_cells: int = DEFAULT_MAX_CELLS

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.backend == "cuda" else "cpu")


@dataclass
class Stats:
    """What a run did: for the progress bar and the benchmark's time-outside-the-kernel share."""

    pairs: int = 0
    cells: int = 0
    kernel_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


@dataclass(frozen=True)
class Alignment:
    query: FastaRecord
    target: FastaRecord
    score: float


def score_chunk(chunk: list[tuple[FastaRecord, FastaRecord]], settings: Settings, matrix: torch.Tensor,
                stats: Stats) -> list[float]:
    """Scores of one chunk of pairs, in the chunk's order."""
    encode = settings.matrix.encode
    query_codes = [encode(q.sequence, q.where()) for q, _ in chunk]
    target_codes = [encode(t.sequence, t.where()) for _, t in chunk]
    scores = [0.0] * len(chunk)
    for batch in make_batches(query_codes, target_codes, settings.max_cells, settings.device):
        started = time.perf_counter()
        values = soft_smith_waterman_codes(
            batch.query_codes, batch.target_codes, matrix, settings.gap, settings.temperature,
            batch.query_lengths, batch.target_lengths, settings.backend,
        ).tolist()  # .tolist() waits for the device, so the host clock covers the kernel
        stats.kernel_seconds += time.perf_counter() - started
        stats.cells += batch.cells
        for position, value in zip(batch.positions, values):
            scores[position] = value
    stats.pairs += len(chunk)
    return scores


def align(pairs: Iterable[tuple[FastaRecord, FastaRecord]], settings: Settings, stats: Stats | None = None,
          on_chunk=None) -> Iterator[Alignment]:
    """Alignments of the pairs, in input order, scored chunk by chunk; on_chunk(stats) after each."""
    stats = stats if stats is not None else Stats()
    matrix = settings.matrix.tensor(device=settings.device)
    for chunk in chunked(pairs, settings.chunk_size):
        scores = score_chunk(chunk, settings, matrix, stats)
        if on_chunk is not None:
            on_chunk(stats)
        for (query, target), score in zip(chunk, scores):
            yield Alignment(query, target, score)
