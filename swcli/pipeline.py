"""read -> encode -> batch -> score, chunk by chunk: the loop behind `swcli align` and `swcli bench`.

Output order is input order: each chunk's scores are put back in place before its rows are yielded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import torch

from swcli import interrupt
from swcli.batching import DEFAULT_MAX_CELLS, Batch, chunked, make_batches
from swcli.fasta import FastaRecord
from swcli.ops import score_checked_codes
from swcli.scoring import SubstitutionMatrix

DEFAULT_CHUNK_SIZE = 4096


@dataclass
class Settings:
    matrix: SubstitutionMatrix
    gap: float = -4.0
    temperature: float = 1.0
    backend: str = "cpu"  # a resolved backend: cpu, cuda or reference
    chunk_size: int = DEFAULT_CHUNK_SIZE
    # Padded cells per batch. None: no cap for the compiled engines, which look scores up from codes and
    # never build the (B, M, N) tensor (small batches would only leave SIMD lanes idle); the reference
    # builds it, so it gets DEFAULT_MAX_CELLS.
    max_cells: int | None = None

    @property
    def batch_cells(self) -> int:
        if self.max_cells is not None:
            return self.max_cells
        return DEFAULT_MAX_CELLS if self.backend == "reference" else 1 << 62

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.backend == "cuda" else "cpu")


@dataclass
class Stats:
    """What a run did: for the progress bar and the benchmark's share of time outside the scoring calls.
    On CUDA kernel_seconds sums CUDA-event intervals around each scoring call: the kernels, and what of
    the call's host work (the binding, a wait of the scoring thread for the GIL) the device waited for."""

    pairs: int = 0
    cells: int = 0
    kernel_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


@dataclass(slots=True)
class Alignment:
    query: FastaRecord
    target: FastaRecord
    score: float

    def row(self) -> tuple[str, str, int, int, float]:
        """The TSV fields: query, target, qlen, tlen, score."""
        return self.query.id, self.target.id, len(self.query.sequence), len(self.target.sequence), self.score


def encode_chunk(chunk: list[tuple[FastaRecord, FastaRecord]], settings: Settings) -> list[Batch]:
    """Codes of a chunk's pairs, in length-sorted padded batches on the compute device."""
    encode = settings.matrix.encode
    query_codes = [encode(q.sequence, q.where) for q, _ in chunk]
    target_codes = [encode(t.sequence, t.where) for _, t in chunk]
    return make_batches(query_codes, target_codes, settings.batch_cells, settings.device)


def score_batches(batches: list[Batch], count: int, settings: Settings, matrix: torch.Tensor,
                  stats: Stats, on_batch=None) -> list[float]:
    """Scores of a chunk's batches, put back in the chunk's order; on_batch(batch) after each."""
    scores = [0.0] * count
    on_gpu = settings.backend == "cuda"
    for batch in batches:
        if on_gpu:  # GPU time from CUDA events: the host clock would also count launch and copy waits
            started, finished = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            started.record()
        else:
            started = time.perf_counter()
        values = score_checked_codes(  # make_batches' codes and lengths are valid by construction
            batch.query_codes, batch.target_codes, matrix, settings.gap, settings.temperature,
            batch.query_lengths, batch.target_lengths, settings.backend,
        )
        if on_gpu:
            finished.record()
        values = values.tolist()  # waits for the device
        stats.kernel_seconds += (started.elapsed_time(finished) / 1e3 if on_gpu
                                 else time.perf_counter() - started)
        stats.cells += batch.cells
        for position, value in zip(batch.positions, values):
            scores[position] = value
        if on_batch is not None:
            on_batch(batch)
    return scores


def score_chunk(chunk: list[tuple[FastaRecord, FastaRecord]], settings: Settings, matrix: torch.Tensor,
                stats: Stats) -> list[float]:
    """Scores of one chunk of pairs, in the chunk's order, in this thread."""
    return score_batches(encode_chunk(chunk, settings), len(chunk), settings, matrix, stats)


def align(pairs: Iterable[tuple[FastaRecord, FastaRecord]], settings: Settings, stats: Stats | None = None,
          on_chunk=None) -> Iterator[Alignment]:
    """Alignments of the pairs, in input order, scored chunk by chunk; on_chunk(stats) after each."""
    for alignments in align_chunks(pairs, settings, stats, on_chunk):
        yield from alignments


def align_chunks(pairs: Iterable[tuple[FastaRecord, FastaRecord]], settings: Settings,
                 stats: Stats | None = None, on_chunk=None) -> Iterator[list[Alignment]]:
    """The alignments of each chunk of pairs, in input order; on_chunk(stats) after each chunk.

    The scores of chunk k are computed in a worker thread (the engines release the GIL) while this
    thread reads and encodes chunk k+1 and the caller writes the rows of chunk k-1: one chunk is
    scored at a time, and at most three are in memory. This thread waits for a chunk's scores in short
    timed waits, so that a signal handler (cli: swcli.interrupt) runs within a fraction of a second even
    while one long engine call runs. On an error, or when the caller stops early, the call in progress
    is not waited for: it cannot be stopped, and it ends on its own (or with the process: the CLI then
    leaves through os._exit, see scoring_in_progress).
    """
    stats = stats if stats is not None else Stats()
    matrix = settings.matrix.tensor(device=settings.device)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swcli-score")
    finished = False
    try:
        previous = None
        for chunk in chunked(pairs, settings.chunk_size):
            batches = encode_chunk(chunk, settings)
            scoring = pool.submit(counted_call, score_batches, batches, len(chunk), settings, matrix, stats)
            if previous is not None:
                yield _finish(*previous, stats, on_chunk)
            previous = (chunk, scoring)
        if previous is not None:
            yield _finish(*previous, stats, on_chunk)
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)


_running = 0  # engine calls in progress in scoring threads
_running_lock = threading.Lock()

WAIT_SECONDS = 0.1  # how long the main thread sleeps at a time while a chunk is scored


def counted_call(function, *args):
    """function(*args), counted as an engine call in progress (see scoring_in_progress)."""
    global _running
    with _running_lock:
        _running += 1
    try:
        return function(*args)
    finally:
        with _running_lock:
            _running -= 1


def scoring_in_progress() -> bool:
    """Whether a scoring thread is inside a call (after an error or a signal cut its chunk short): a
    process that ends normally would wait for it, at exit, for as long as the call takes."""
    return _running > 0


def wait_for(scoring: Future):
    """The result of a scoring thread's call, waited for in short steps that let a signal through."""
    while True:
        try:
            return scoring.result(timeout=WAIT_SECONDS)
        except FutureTimeout:
            interrupt.check()


def _finish(chunk, scoring: Future, stats: Stats, on_chunk) -> list[Alignment]:
    scores = wait_for(scoring)
    stats.pairs += len(chunk)
    if on_chunk is not None:
        on_chunk(stats)
    return [Alignment(query, target, score) for (query, target), score in zip(chunk, scores)]
