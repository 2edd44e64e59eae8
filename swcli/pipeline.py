"""read -> encode -> batch -> score, chunk by chunk: the loop behind `swcli align` and `swcli bench`.

A chunk is columns (fasta.PairChunk): its sequences' codes go to the device back to back, are padded
into batches there, and come back as one array of scores per chunk, so the host's work per pair is a
few array operations. Output order is input order: each chunk's scores are put back in place before
its rows are yielded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from swcli import interrupt
from swcli.batching import DEFAULT_MAX_CELLS, Batch, Codes, chunked, make_batches
from swcli.fasta import FastaRecord, PairChunk, Records
from swcli.ops import score_checked_codes
from swcli.scoring import Gaps, SubstitutionMatrix

DEFAULT_CHUNK_SIZE = 16384


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
    # Affine gaps (soft Gotoh): the open and extend scores, both or neither (scoring.resolve_gaps makes them
    # from the options). None: linear gaps, with `gap`; given, `gap` is not used.
    gap_open: float | None = None
    gap_extend: float | None = None

    def __post_init__(self):
        if (self.gap_open is None) != (self.gap_extend is None):
            raise ValueError("affine gaps need both gap_open and gap_extend")

    @property
    def gaps(self) -> Gaps:
        if self.gap_open is None:
            return Gaps(self.gap)
        return Gaps(None, self.gap_open, self.gap_extend)

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


class _CodesOnDevice:
    """The codes of the last few Records blocks, on the compute device: a block that several chunks
    share (one file's records, the targets of --all-vs-all) is encoded and sent once."""

    def __init__(self, settings: Settings, keep: int = 2):
        self.settings, self.keep = settings, keep
        self._entries: list[tuple[Records, Codes]] = []  # the Records held, so their ids stay theirs

    def __call__(self, records: Records) -> Codes:
        for held, codes in self._entries:
            if held is records:
                return codes
        codes = Codes.of(self.settings.matrix.encode_records(records), records.offsets, self.settings.device)
        self._entries = [*self._entries[-(self.keep - 1):], (records, codes)]
        return codes


def encode_chunk(chunk: PairChunk | list[tuple[FastaRecord, FastaRecord]], settings: Settings,
                 codes: _CodesOnDevice | None = None) -> list[Batch]:
    """Codes of a chunk's pairs, in length-sorted padded batches on the compute device."""
    if not isinstance(chunk, PairChunk):
        chunk = PairChunk.of(chunk)
    codes = codes or _CodesOnDevice(settings)
    return make_batches(codes(chunk.queries), chunk.query_index, codes(chunk.targets), chunk.target_index,
                        settings.batch_cells, settings.device)


def score_batches(batches: list[Batch], count: int, settings: Settings, matrix: torch.Tensor,
                  stats: Stats, on_batch=None) -> np.ndarray:
    """Scores of a chunk's batches, put back in the chunk's order (on the device, then one copy to the
    host); on_batch(batch) after each."""
    on_gpu = settings.backend == "cuda"
    scores = torch.zeros(count, dtype=matrix.dtype, device=settings.device)
    marks = []
    for batch in batches:
        if on_gpu:  # GPU time from CUDA events: the host clock would also count launch and copy waits
            started, finished = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            started.record()
        else:
            started = time.perf_counter()
        values = score_checked_codes(  # make_batches' codes and lengths are valid by construction
            batch.query_codes, batch.target_codes, matrix, settings.gap, settings.temperature,
            batch.query_lengths, batch.target_lengths, settings.backend,
            gap_open=settings.gap_open, gap_extend=settings.gap_extend,
        )
        if on_gpu:
            finished.record()
            marks.append((started, finished))
        else:
            stats.kernel_seconds += time.perf_counter() - started
        scores[batch.positions_on_device] = values.to(scores.dtype)
        stats.cells += batch.cells
        if on_batch is not None:
            on_batch(batch)
    host = scores.cpu().numpy()  # waits for the device
    stats.kernel_seconds += sum(start.elapsed_time(end) for start, end in marks) / 1e3
    return host


def score_chunk(chunk: PairChunk | list[tuple[FastaRecord, FastaRecord]], settings: Settings,
                matrix: torch.Tensor, stats: Stats) -> np.ndarray:
    """Scores of one chunk of pairs, in the chunk's order, in this thread."""
    batches = encode_chunk(chunk, settings)
    return score_batches(batches, len(chunk), settings, matrix, stats)


def align(pairs: Iterable[tuple[FastaRecord, FastaRecord]], settings: Settings, stats: Stats | None = None,
          on_chunk=None) -> Iterator[Alignment]:
    """Alignments of record pairs, in input order, scored chunk by chunk; on_chunk(stats) after each."""
    chunks = (PairChunk.of(chunk) for chunk in chunked(pairs, settings.chunk_size))
    for chunk, scores in align_chunks(chunks, settings, stats, on_chunk):
        for k, score in enumerate(scores.tolist()):
            yield Alignment(*chunk.pair(k), score)


def align_chunks(chunks: Iterable[PairChunk], settings: Settings, stats: Stats | None = None,
                 on_chunk=None) -> Iterator[tuple[PairChunk, np.ndarray]]:
    """Each chunk of pairs with its scores (in the chunk's order), in input order; on_chunk(stats)
    after each chunk.

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
    codes = _CodesOnDevice(settings)
    pool = scoring_pool(settings.device, "swcli-score")
    finished = False
    try:
        previous = None
        for chunk in chunks:
            batches = encode_chunk(chunk, settings, codes)
            scoring = pool.submit(counted_call, score_batches, batches, len(chunk), settings, matrix, stats)
            if previous is not None:
                yield _finish(*previous, stats, on_chunk)
            previous = (chunk, scoring)
        if previous is not None:
            yield _finish(*previous, stats, on_chunk)
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)


def scoring_pool(device: torch.device, name: str) -> ThreadPoolExecutor:
    """The one worker thread of the engine calls, on this thread's GPU where the device is CUDA: the
    current CUDA device is a thread's own, and a new thread's is GPU 0, which a distributed rank on
    another GPU (distributed.py) must not touch (its CUDA events, streams and pinned buffers)."""
    setup = None
    if device.type == "cuda":
        setup = partial(torch.cuda.set_device, torch.cuda.current_device())
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=setup)


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


def _finish(chunk: PairChunk, scoring: Future, stats: Stats, on_chunk) -> tuple[PairChunk, np.ndarray]:
    scores = wait_for(scoring)
    stats.pairs += len(chunk)
    if on_chunk is not None:
        on_chunk(stats)
    return chunk, scores
