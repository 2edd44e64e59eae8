"""Queries x database: every query against every database sequence, the best k of each kept on the device.

The database's sequences are cut, in their length order, into blocks of at most `max_cells` padded
cells per query residue (for the exact search kernel also at its tile widths: block_bounds). The blocks
are padded on the device from the sequences' flat codes (the host copies residues, never padding), once
while they fit `max_bytes`, else again for each query (the same result, streamed). Each query is scored
against each block through the codes operator, and only the best k of each block leave it, so no
(queries x database) score matrix ever exists.

Ties are broken by database order. Each score is packed with its sequence's database order into one
int64 key that orders by score, then by earlier sequence (`score_keys`), so torch.topk on keys picks
exactly the hits that a stable sort by database order and then by score would, without sorting a block.

On CUDA the host never waits for the device inside a query: query i + 1's blocks are queued before the
results of query i are read (`Searcher.step`), so the device goes from one query to the next. Within a
query, two streams take the kernel's launches in turn (`LaunchStreams`), so that one launch's last wave
shares the SMs with the next. The hits' details (--format-output) are computed in a worker thread
(details.InOrder) while the next queries are scored.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from itertools import chain
from dataclasses import dataclass, field

import numpy as np
import torch

from swcli import interrupt
from swcli.database import Database
from swcli.errors import DatabaseError, SwcliError
from swcli.ops import load_engine, score_checked_codes

# Padded target cells per block, per query residue: 64 MiB of codes. Fewer, larger blocks than 2^24 score
# faster on the GPU (docs/benchmarks/h200.md, "Block size"), mostly the op's sweep of long queries.
DEFAULT_MAX_CELLS = 1 << 26
DEFAULT_MAX_BYTES = 1 << 32  # padded blocks kept on the device beyond this are padded again per query
LOW = (1 << 32) - 1  # a key's low 32 bits: LOW - database order, so the earlier sequence has the larger key


@dataclass(frozen=True)
class Block:
    codes: torch.Tensor  # (n, width) uint8, padded with 0
    lengths: torch.Tensor  # (n,) int64
    tiebreak: torch.Tensor  # (owned rows,) int64: LOW - database order of each row, the low half of its key
    owned: slice | None = None  # a shard's rows of the block (the others have length 0); None: every row

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.lengths, self.tiebreak))


@dataclass(frozen=True)
class Hits:
    scores: torch.Tensor  # (k,) float32, descending (or by E-value, with evalues)
    targets: torch.Tensor  # (k,) int64 database order
    evalues: np.ndarray | None = None  # (k,) float64, ascending: hits ranked by E-value


@dataclass(frozen=True)
class EvalueCutoff:
    """--max-evalue (SSEARCH's -E): the hits of a query whose E-value passes `limit` are left out of its
    rows. statistics: the statistics.KarlinAltschul of the evalue column, so that a kept row never prints
    an E-value above the limit."""

    statistics: object
    limit: float

    def within(self, found: Hits, query_length: int, target_lengths: np.ndarray, searched: int) -> Hits:
        evalues = found.evalues if found.evalues is not None else self.statistics.evalues(
            found.scores.numpy().astype(np.float32), query_length, target_lengths, searched)
        keep = evalues <= self.limit
        if keep.all():
            return found
        kept = torch.from_numpy(np.flatnonzero(keep))
        return Hits(found.scores[kept], found.targets[kept], found.evalues[keep] if found.evalues is not None else None)


@dataclass
class SearchStats:
    """What a search did, for the progress bar and benchmarks. cells: qlen x tlen summed over every
    (query, database sequence) pair, the work whatever the padding. kernel_seconds: the scoring calls
    alone, a search kernel's flagged pairs scored again included (on CUDA the sum of CUDA-event intervals
    around them, read once per query; on the CPU the host clock around them). seconds: the whole run,
    queries read to output written."""

    queries: int = 0  # done so far
    total: int = 0  # queries read
    cells: int = 0
    kernel_seconds: float = 0.0
    seconds: float = 0.0
    sequences: int = 0
    residues: int = 0
    host_bytes: int = 0  # the database's arrays and ids on the host (memory-mapped for a prepared folder)
    rescored: int = 0  # pairs a search kernel flagged and the general op scored again (this process's)
    kernel: str = ""  # what scored the blocks (Searcher.kernel_name)
    device_bytes: int = 0  # the padded blocks kept on the device (0 when streamed)
    resident: bool = False
    started: float = field(default_factory=time.perf_counter)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def kernel_gcups(self) -> float:
        return self.cells / max(self.kernel_seconds, 1e-12) / 1e9

    @property
    def gcups(self) -> float:
        """End to end: cells over the whole run (over the time so far while it runs)."""
        return self.cells / max(self.seconds or self.elapsed, 1e-12) / 1e9


# --------------------------------------------------------------------------------------------------
# Keys: a score and a database order in one int64


def score_keys(scores: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as (score, then earlier database order): the float32 score's bits made to
    order as signed integers, above tiebreak (LOW - database order)."""
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0, which it equals
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # a negative float's magnitude bits, reversed
    return torch.add(tiebreak, ordered, alpha=1 << 32)  # one kernel, in int64


def hits_of(keys: torch.Tensor, ranks: torch.Tensor | None = None) -> Hits:
    """The scores and database orders packed in keys (score_keys' inverse); ranked by E-value, with the
    E-values exp(-R) of the keys' R (statistics.EvalueRanking)."""
    ordered = (keys >> 32).to(torch.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    evalues = np.exp(-ranks.cpu().numpy()) if ranks is not None else None
    return Hits(bits.view(torch.float32), LOW - (keys & LOW), evalues)


def top_keys(keys: torch.Tensor, top: int) -> torch.Tensor:
    """The `top` largest keys, descending: keys are distinct, so the choice among equal scores is exact."""
    return torch.topk(keys, min(top, keys.numel())).values


def merge_top(best: Hits | None, scores: torch.Tensor, targets: torch.Tensor, top: int) -> Hits:
    """The best `top` of the hits so far and new ones: by descending score, ties by database order."""
    keys = score_keys(scores, LOW - targets)
    if best is not None:
        keys = torch.cat([score_keys(best.scores, LOW - best.targets), keys])
    return hits_of(top_keys(keys, top))


# --------------------------------------------------------------------------------------------------
# Blocks


def block_bounds(database: Database, max_cells: int, classes: "TileClasses | None" = None) -> list[tuple[int, int]]:
    """[start, stop) ranges of the length order, each of at most max_cells padded cells (one sequence
    longer than that is a block of its own).

    classes: the tile widths of the search kernel that scores the blocks. A block's targets all pay the
    tile of its first (longest) sequence, so a block also ends where the lengths fall into a narrower
    class, once it holds classes.fill(width) rows: the targets that occupy the GPU once. A block of fewer
    leaves SMs idle for the whole query, which costs more than padding the next class to its tile."""
    return length_bounds(database.lengths, max_cells, classes)


def length_bounds(lengths: np.ndarray, max_cells: int, classes: "TileClasses | None" = None) -> list[tuple[int, int]]:
    """block_bounds of lengths in decreasing order (a database's, or one block's rows)."""
    ends = np.zeros(0, dtype=np.int64)  # the rows where a narrower class starts
    if classes is not None and len(lengths):
        ends = np.flatnonzero(np.diff(np.searchsorted(np.asarray(classes.widths), lengths))) + 1
    bounds, start = [], 0
    while start < len(lengths):
        width = max(int(lengths[start]), 1)  # longest first: the block's width is its first length
        stop = min(len(lengths), start + max(1, max_cells // width))
        if classes is not None:
            end = np.searchsorted(ends, start + max(classes.fill(width), 1))  # the first class end past the fill
            if end < len(ends):
                stop = min(stop, int(ends[end]))
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class TileClasses:
    """A search kernel's tile shapes as block_bounds uses them: widths, the single-tile widths G R in
    increasing order (a target longer than the last is swept tile after tile); fill(width), the targets
    one launch holds in flight on every SM of the device for the shape of that width."""

    shapes: tuple[tuple[int, int], ...]  # (G lanes a target or a pair of targets, R columns a lane)
    targets_per_group: int  # targets a group of G lanes holds at once
    threads_per_sm: int  # resident threads per SM (the kernel's launch bounds)
    sms: int  # the device's SMs
    waves: float  # a block ends at a class boundary once it holds this many launches' worth of targets

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(g * r for g, r in self.shapes)

    def fill(self, width: int) -> int:
        lanes = next((g for g, r in self.shapes if width <= g * r), self.shapes[-1][0])
        return int(self.waves * self.sms * self.threads_per_sm // lanes * self.targets_per_group)


def warp_columns(lanes: int, widest: int, most: int, step: int, fewest: int = 16) -> int:
    """The search kernels' columns a lane for a warp of groups of `lanes` lanes whose widest target is
    `widest` (warp_columns in kernels/cuda/common.cuh, which this mirrors for the benchmarks and tests): the
    narrowest tile that holds it, from 8 up to `most` by `step`; past the widest tile, the tiles of `fewest`
    or more columns a lane that pad the fewest columns, ties to the most."""
    if widest <= lanes * most:
        return -(-max(-(-widest // lanes), 8) // step) * step
    return min(range(most, fewest - 1, -step), key=lambda r: (-(-widest // (lanes * r)) * lanes * r, -r))


def _sms(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing a host array that may be read-only (a memory map, bytes): only ever read or
    copied, so from_numpy's warning about writes does not apply."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _to(tensor: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`. To CUDA through pinned memory, without waiting: a plain copy from
    pageable memory synchronises the stream, which would drain the queued work of the query before."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def make_block(database: Database, start: int, stop: int, device, flat: torch.Tensor | None = None,
               lengths: np.ndarray | None = None, owned: tuple[int, int] | None = None,
               flat_start: int = 0) -> Block:
    """Sequences start..stop-1 of the length order, padded on `device` from their flat codes: `flat`,
    the database's codes from residue flat_start on already there, or else this block's residues, copied
    now.

    owned: a shard's part [first, last) of the block (distributed.py): the block keeps its shape and its
    other rows get length 0, so that the engine call is the one a single process makes (the CUDA engine
    chooses its lanes by the batch's size) and the owned rows' scores are the same, bit for bit."""
    first, last = owned if owned is not None else (start, stop)
    lengths = (database.lengths if lengths is None else lengths)[start:stop]
    width = int(lengths[0]) if len(lengths) else 0  # longest first
    if owned is not None:
        lengths = lengths.copy()
        lengths[:first - start], lengths[last - start:] = 0, 0
    begin, end = int(database.offsets[first]), int(database.offsets[last])
    residues = (flat[begin - flat_start:end - flat_start] if flat is not None
                else _to(_tensor(np.asarray(database.codes[begin:end])), device))
    block_lengths = _to(torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)), device)
    tiebreak = _to(torch.from_numpy(LOW - np.asarray(database.index[first:last], dtype=np.int64)), device)
    inside = torch.arange(width, device=residues.device) < block_lengths[:, None]
    # row-major, the cells inside the lengths are the block's residues in order: one masked scatter
    codes = torch.zeros((stop - start, width), dtype=torch.uint8, device=residues.device)
    rows = slice(first - start, last - start) if owned is not None else None
    return Block(codes.masked_scatter_(inside, residues), block_lengths, tiebreak, rows)


# --------------------------------------------------------------------------------------------------
# The search


class SearchKernel:
    """What the two search kernels share: a block is scored in one launch (scores), and the search's
    blocks may end at the kernel's tile classes (classes)."""

    def classes(self, device) -> "TileClasses | None":
        """The tile classes the blocks end at (block_bounds); None: blocks by cells alone."""
        return None

    def scores(self, query: torch.Tensor, block: "Block") -> tuple[torch.Tensor, torch.Tensor]:
        """(scores (n,), -1 where the kernel's checks did not hold; their count (1,)), queued."""
        raise NotImplementedError


class ExactSearch(SearchKernel):
    """The exact 16-bit search kernel's set-up (kernels/cuda/search_s16.cu), for CUDA searches at t = 0
    whose matrix and gaps are integers small enough for 16-bit lanes: the table of score pairs, the
    largest score's limit, and the integer gaps. The table has a letter past the matrix, the padding,
    whose scores (the matrix's smallest, at most 0) never raise a best cell."""

    LARGEST = 1000  # the largest |score| and |gap| taken: far from the int16 range, so overflow is a long run
    # The kernel's launch classes (launch_lanes in common.cuh, at kMaxColumns of search_s16.cu): G lanes hold two targets,
    # at most R columns a lane (each warp takes the columns its own targets need); 2 blocks of 256 threads
    # an SM (its launch bounds).
    SHAPES = {False: ((8, 32), (16, 32), (32, 32)), True: ((8, 28), (16, 28), (32, 28))}
    FILL_WAVES = 1.0

    def __init__(self, matrix: torch.Tensor, gap_open: int, gap_extend: int):
        S = matrix.to(torch.int64)
        K = S.shape[0]
        padded = torch.cat([S, torch.full((K, 1), min(int(S.min()), 0), dtype=torch.int64, device=S.device)], 1)
        halves = padded & 0xFFFF
        pairs = halves[:, None, :] + (halves[:, :, None] << 16)  # [q, b, a] = (S[q][a], S[q][b]): low half a
        self.table = (pairs - ((pairs >> 31) << 32)).to(torch.int32)  # the same 32 bits, as int32
        self.limit = 32767 - max(int(S.max()), 0)
        self.gap_open, self.gap_extend = gap_open, gap_extend
        self.affine = gap_open != gap_extend

    @classmethod
    def of(cls, matrix: torch.Tensor, temperature: float, gap: float | None, gap_open: float | None,
           gap_extend: float | None) -> "ExactSearch | None":
        """The set-up where the kernel takes the search (matrix on a CUDA device), else None."""
        gaps = (gap, gap) if gap_open is None else (gap_open, gap_extend)
        if not matrix.is_cuda or temperature != 0 or matrix.shape[0] * (matrix.shape[0] + 1) ** 2 * 4 > 200_000:
            return None
        if not all(float(g).is_integer() and -cls.LARGEST <= g <= 0 for g in gaps) or gaps[0] > gaps[1]:
            return None  # (gap_open > gap_extend: the general path's checks say what is wrong)
        if not bool(((matrix == matrix.round()) & (matrix.abs() <= cls.LARGEST)).all()):
            return None
        load_engine("cuda")  # the kernel is the CUDA engine's: a library caller may not have loaded it
        return cls(matrix, int(gaps[0]), int(gaps[1]))

    def classes(self, device) -> TileClasses:
        return TileClasses(self.SHAPES[self.affine], 2, 512, _sms(device), self.FILL_WAVES)

    def scores(self, query: torch.Tensor, block: "Block") -> tuple[torch.Tensor, torch.Tensor]:
        """A block's (scores int32, -1 where 16 bits could not hold a pair; their count (1,)), queued, in one
        launch: the kernel takes its lanes from the codes' width, and the blocks end at its tile classes."""
        return torch.ops.swcli.search_scores_s16(query, block.codes, block.lengths, self.table, self.gap_open,
                                                 self.gap_extend, self.limit)


class SoftSearch(SearchKernel):
    """The soft search kernel's set-up (kernels/cuda/search_soft.cu), for CUDA searches at t > 0 in float32:
    the table of powers P = 2^(S c), c = log2(e) / t, the gap factors, and the limits of its scaled space,
    derived here from the matrix, t and the gaps so that the kernel's checks hold (its header says why):

    * upper U: one step's growth stays in the float range (the growth factor of a cell over its segment's
      largest value or its input, and for affine gaps X~ = X / O up to 2^(-o c) above H);
    * middle T: a segment rescaled lands at 2^T (DROP below), a linear one whose input passed 2^U at
      2^(2T - U); a segment with sigma > F whose first cell nears 2^-F is rescaled up, to 2^T;
    * floor F: a flushed term (under 2^-126) times the largest P stays under 2^-26 of a cell above 2^-F;
    * bound: the padding's cells are at most max(best inside, bound), 1 / (1 - 2G) (affine
      1 / (1 - 2 O / (1 - E + O))), so a best cell above it is a cell of the target.

    None (the general op then scores the search) where the kernel cannot hold the settings: a gap factor
    2G (affine O + E) past 0.9, where padding could pass the bound or grow; U under MIN_UPPER or F under
    MIN_FLOOR (low t or large scores); a matrix with NaN or +inf, or too many letters for the shared
    memory; or where a typical strong alignment would spread a segment's 8 cells past what the floor
    allows (plan's spread: such pairs would all be flagged and scored again)."""

    SEGMENT = 8  # columns a scale (the kernel's kSegment)
    # Columns a lane (the kernel's kColumns): a target takes whole lanes, after the one before it in its
    # warp's lanes.
    COLUMNS = {False: 32, True: 24}
    DROP = 24  # a segment rescaled lands at 2^(U - DROP)
    MIN_UPPER, MIN_FLOOR = 48, 24
    # The longest query it takes, by affine (None: every query); longer ones take the op's sweep for the
    # whole query, so that a query's blocks share one path. With either gaps the kernel is the faster for
    # every query (benchmarks/search_blocks.py --max-queries in docs/benchmarks/h200.md).
    MAX_QUERY = {False: None, True: None}
    LETTERS = 55  # the most letters it takes (table and ring: 34.6 KB a one-warp block, 6 an SM; 16 at 24 letters)

    def __init__(self, powers: torch.Tensor, settings: dict):
        self.powers = powers
        self.settings = settings

    @classmethod
    def plan(cls, matrix: torch.Tensor, temperature: float, gap: float | None, gap_open: float | None,
             gap_extend: float | None) -> dict | None:
        """The kernel's settings (the op's arguments but the tensors) and its powers as a float32 numpy
        table, or None where the kernel does not take the search (the class's docstring)."""
        affine = gap_open is not None
        gaps = (gap_open, gap_extend) if affine else (gap, gap)
        if not (temperature > 0 and math.isfinite(temperature)) or not all(
                g is not None and math.isfinite(g) and g <= 0 for g in gaps) or gaps[0] > gaps[1]:
            return None  # (the general path's checks say what is wrong)
        S = matrix.detach().to("cpu", torch.float64).numpy()
        K = S.shape[0]
        if K > cls.LETTERS or np.isnan(S).any() or (S == np.inf).any():
            return None
        c = math.log2(math.e) / temperature
        with np.errstate(over="ignore"):  # past the float range: refused just below
            powers = np.exp2(S * c).astype(np.float32)
        largest = float(powers.max())
        if not math.isfinite(largest) or largest <= 0:
            return None
        diagonal = max(float(np.mean(np.diag(S)[np.isfinite(np.diag(S))])) if np.isfinite(np.diag(S)).any() else 0.0,
                       0.0) * c
        if affine:
            o, e = 2.0 ** (gap_open * c), 2.0 ** (gap_extend * c)
            factors = (float(np.float32(o)), float(np.float32(e - o)))
            growth = (largest + 2) * (1 + o / (1 - e)) + 1 if e < 1 else math.inf
            above, bound = math.ceil(-gap_open * c), 1 / (1 - 2 * o / (1 - (e - o))) if o + e < 1 else math.inf
            holds = o + e <= 0.9
            spread = 7 * diagonal - (gap_open + 6 * gap_extend) * c  # a diagonal 7 rows on, against a gap down 7
        else:
            g = 2.0 ** (gap * c)
            factors = (float(np.float32(g)), 0.0)
            growth = (1 + largest + g) / (1 - g) + 1 if g < 1 else math.inf
            above, bound = 0, 1 / (1 - 2 * g) if 2 * g < 1 else math.inf
            holds = 2 * g <= 0.9
            spread = 7 * (diagonal - gap * c)
        if not holds:
            return None
        upper = 126 - (math.ceil(math.log2(growth)) + 1) - above
        middle = upper - cls.DROP
        floor = 100 - max(math.ceil(math.log2(largest)), 0)
        # A segment near the floor rises to 2^T: its cells must then fit in the T + F bits above 2^-F.
        if upper < cls.MIN_UPPER or floor < cls.MIN_FLOOR or spread > middle + floor:
            return None
        return {"powers": powers, "affine": affine, "gap_factor": factors[0], "extend_factor": factors[1],
                "temperature": float(temperature), "upper": upper, "middle": middle, "floor": floor,
                "bound": float(np.nextafter(np.float32(bound * (1 + 1e-5)), np.float32(np.inf)))}

    @classmethod
    def of(cls, matrix: torch.Tensor, temperature: float, gap: float | None, gap_open: float | None,
           gap_extend: float | None) -> "SoftSearch | None":
        """The set-up where the kernel takes the search (matrix on a CUDA device), else None."""
        if not matrix.is_cuda:
            return None
        plan = cls.plan(matrix, temperature, gap, gap_open, gap_extend)
        if plan is None:
            return None
        powers = torch.from_numpy(plan.pop("powers")).to(matrix.device)
        load_engine("cuda")  # the kernel is the CUDA engine's: a library caller may not have loaded it
        return cls(powers, plan)

    @property
    def max_query(self) -> int | None:
        """The longest query it takes with its gaps (MAX_QUERY); None: every query."""
        return self.MAX_QUERY[self.settings["affine"]]

    def scores(self, query: torch.Tensor, block: "Block") -> tuple[torch.Tensor, torch.Tensor]:
        """A block's (scores float32, -1 where the kernel's checks did not hold; their count (1,)), queued, in
        one launch whose warps (as many as the GPU holds) take the block's targets whatever their lengths
        (blocks by cells alone; fewer warps, each filling its last tile, were slower: an SM's warps wait on
        latencies more than on issue). A pair's score has the same bits whatever the launch (the kernel's
        header)."""
        s = self.settings
        return torch.ops.swcli.search_scores_soft(query, block.codes, block.lengths,
                                                  self.powers, 0, s["affine"], s["gap_factor"],
                                                  s["extend_factor"], s["temperature"], s["upper"], s["middle"],
                                                  s["floor"], s["bound"])


@dataclass
class Pending:
    """A query whose work is queued: its best keys (on the device), and the timing of its scoring calls
    (CUDA: event pairs, read once the keys are back; CPU: seconds). With a search kernel (ExactSearch,
    SoftSearch) also what its flagged pairs need: the query, and per block its scores and their count."""

    keys: torch.Tensor | None  # None: an empty database
    events: list = field(default_factory=list)
    seconds: float = 0.0
    query: torch.Tensor | None = None
    flagged: list = field(default_factory=list)  # (block, kernel scores (n,), count of pairs flagged (1,))
    table: torch.Tensor | None = None  # ranked by E-value: the query's table (statistics.EvalueRanking)
    ranks: torch.Tensor | None = None  # and the keys' R

    def kernel_seconds(self) -> float:
        """The seconds of the scoring calls (on CUDA, once the query's work is done)."""
        return self.seconds + sum(start.elapsed_time(end) for start, end in self.events) / 1e3


class LaunchStreams:
    """A query's kernel launches, taken in turn by a few CUDA streams. A launch's last wave of warps leaves
    SMs idle until its slowest warp ends; the next launch, on another stream, takes them meanwhile. Each
    launch waits for what the current stream queued before it (the query, the block), and the current
    stream waits for every launch (join) before their scores are read."""

    def __init__(self, device: torch.device, count: int):
        self.device = device
        self.streams = [torch.cuda.Stream(device) for _ in range(count)] if device.type == "cuda" and count > 1 else []
        self.turn = 0

    def run(self, launch):
        """launch() on the next stream (on the current one where there are none)."""
        if not self.streams:
            return launch()
        stream = self.streams[self.turn % len(self.streams)]
        self.turn += 1
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            return launch()

    def join(self) -> None:
        current = torch.cuda.current_stream(self.device) if self.streams else None
        for stream in self.streams:
            current.wait_stream(stream)


class Searcher:
    """One database on a device, ready for queries: its blocks padded once while they fit max_bytes."""

    STREAMS = 2  # the streams that take a query's launches in turn (LaunchStreams; 1: the current alone)

    def __init__(self, database: Database, matrix: torch.Tensor, gap: float | None, temperature: float, top: int,
                 backend: str, device=None, max_cells: int = DEFAULT_MAX_CELLS, max_bytes: int = DEFAULT_MAX_BYTES,
                 *, gap_open: float | None = None, gap_extend: float | None = None, rank=None,
                 rows: tuple[int, int] | None = None):
        """gap: the linear gap score; or gap_open with gap_extend, affine gaps (gap is then not used).
        rank: a statistics.KarlinAltschul to keep the best hits by E-value (None: by score). rows: a shard
        [first, last) of the length order (distributed.py), scored in the blocks of the whole database,
        cut to it (make_block's owned); None: every sequence."""
        if top < 1:
            raise ValueError(f"top must be at least 1, got {top}")
        if len(database) > LOW + 1:
            raise ValueError(f"{database.source}: {len(database):,} sequences; a search takes at most 2^32")
        self.database, self.gap, self.temperature, self.top = database, gap, temperature, top
        # The scoring calls' gap keywords: none for linear gaps, so that their calls stay what they were.
        self.affine = ({} if gap_open is None and gap_extend is None
                       else {"gap_open": gap_open, "gap_extend": gap_extend})
        self.backend, self.device = backend, torch.device(device or "cpu")
        if self.device.type == "cuda" and self.device.index is None:  # the device now current, for good
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.on_gpu = self.device.type == "cuda"
        self.matrix = matrix.to(self.device)
        # A search kernel scores whole blocks where it takes the settings (on CUDA): the exact 16-bit one at
        # t = 0, the soft one at t > 0; else the general op from codes.
        self.exact = self.soft = None
        if backend == "cuda" and self.on_gpu:
            self.exact = ExactSearch.of(self.matrix, temperature, gap, gap_open, gap_extend)
            if self.exact is None:
                self.soft = SoftSearch.of(self.matrix, temperature, gap, gap_open, gap_extend)
        self.kernel = self.exact or self.soft
        self.streams = LaunchStreams(self.device, self.STREAMS if self.kernel is not None else 0)
        self.rescored = 0  # pairs a search kernel flagged, scored again through the general op
        self.lengths = database.lengths
        self.bounds = block_bounds(database, max_cells, self.kernel.classes(self.device) if self.kernel else None)
        self.owned = [None] * len(self.bounds)
        if rows is not None:
            first, last = rows
            kept = [(start, stop) for start, stop in self.bounds if start < last and stop > first]
            self.bounds, self.owned = kept, [(max(start, first), min(stop, last)) for start, stop in kept]
        self.ranking = None
        if rank is not None:
            from swcli.statistics import EvalueRanking

            scored = [owned or bounds for bounds, owned in zip(self.bounds, self.owned)]  # the rows with candidates
            self.ranking = EvalueRanking(rank, self.lengths, scored, len(database), self.device)
        padded = sum((stop - start) * int(self.lengths[start]) for start, stop in self.bounds)
        self.resident = None
        # the residues of the rows scored (a shard's alone)
        spans = [owned or bounds for bounds, owned in zip(self.bounds, self.owned)]
        lo, hi = (int(database.offsets[spans[0][0]]), int(database.offsets[spans[-1][1]])) if spans else (0, 0)
        flat = None
        if padded <= max_bytes and self.bounds:
            flat = _tensor(np.asarray(database.codes[lo:hi])).to(self.device)  # once: a plain copy
            self.resident = [make_block(database, start, stop, self.device, flat, self.lengths, owned, lo)
                             for (start, stop), owned in zip(self.bounds, self.owned)]
        elif padded <= max_bytes:
            self.resident = []
        if self.kernel is not None and hi > lo:
            self.check_codes(database, flat, lo, hi)

    @property
    def kernel_name(self) -> str:
        """What scores the blocks, in words (records and benchmarks)."""
        if self.exact is not None:
            return "the exact 16-bit kernel"
        if self.soft is not None:
            limit = self.soft.max_query
            return "the soft search kernel" + (f" (queries of at most {limit:,} residues; the op's sweep from codes "
                                                "past that)" if limit is not None else "")
        return "the op's sweep from codes"

    def check_codes(self, database: Database, flat: torch.Tensor | None, lo: int, hi: int) -> None:
        """The search kernels index their tables by the residues' codes: every code of the residues scored
        [lo, hi) must be a letter of the matrix (a prepared database made for another matrix's alphabet
        is refused when it is opened; this is the check that its codes agree). On the device where the
        residues are there (one reduction, one read), else on the host, the span alone."""
        largest = int(flat.max()) if flat is not None else int(np.asarray(database.codes[lo:hi]).max())
        if largest >= len(self.matrix):
            raise SwcliError(f"{database.source}: a residue code past the {len(self.matrix)}-letter matrix "
                             "(the prepared database does not match it)")

    @property
    def device_bytes(self) -> int:
        """Bytes of the padded blocks kept on the device (0 when they are padded again per query)."""
        return sum(block.nbytes for block in self.resident) if self.resident is not None else 0

    def blocks(self) -> Iterator[Block]:
        if self.resident is not None:
            return iter(self.resident)
        return (make_block(self.database, start, stop, self.device, lengths=self.lengths, owned=owned)
                for (start, stop), owned in zip(self.bounds, self.owned))

    def launch(self, codes: bytes) -> Pending:
        """Queue one query (its codes) against every block and the choice of its best keys. On CUDA it
        returns once the work is queued; on the CPU once it is done."""
        query = torch.frombuffer(bytearray(codes), dtype=torch.uint8) if codes else torch.zeros(0, dtype=torch.uint8)
        query = _to(query, self.device)
        pending = Pending(None)
        if self.ranking is not None:
            pending.table = _to(torch.from_numpy(self.ranking.table(len(codes))), self.device)
        kernel = self.kernel_for(len(codes))
        candidates = []
        if kernel is None:
            for index, block in enumerate(self.blocks()):
                timing, rows = self.timing(), block.codes.shape[0]
                scores = score_checked_codes(query.expand(rows, -1), block.codes, self.matrix, self.gap,
                                             self.temperature, None, block.lengths, self.backend, **self.affine)
                timing(pending)
                candidates.append(self.candidates(pending, index, block, scores))
        else:
            # every launch queued before any block's top-k, so that launches follow each other on the streams;
            # blocks padded again for the query are made first, outside the scoring calls' time (each is
            # kept in pending.flagged until the query is finished anyway)
            blocks = list(self.blocks())
            timing = self.timing()
            scored = [(block, self.streams.run(lambda block=block: kernel.scores(query, block))) for block in blocks]
            self.streams.join()
            timing(pending)
            for index, (block, (found, flagged)) in enumerate(scored):
                pending.flagged.append((block, found, flagged))
                candidates.append(self.candidates(pending, index, block, found.float()))
        self.choose(pending, candidates)
        pending.query = query
        return pending

    def kernel_for(self, query_length: int):
        """The search kernel that scores a query of this length, or None for the op's sweep from codes."""
        if self.soft is not None and self.soft.max_query is not None and query_length > self.soft.max_query:
            return None
        return self.kernel

    def candidates(self, pending: Pending, index: int, block: Block, scores: torch.Tensor):
        """A block's best keys by score, or its best (R, keys) by E-value (of a shard's rows alone)."""
        if block.owned is not None:
            scores = scores[block.owned]
        keys = score_keys(scores, block.tiebreak)
        if pending.table is not None:
            return self.ranking.best(self.ranking.ranks(pending.table, scores, index), keys, self.top)
        return top_keys(keys, self.top) if len(keys) > self.top else keys

    def choose(self, pending: Pending, candidates: list) -> None:
        """The query's best keys (and R, by E-value) from its blocks' candidates."""
        if candidates and pending.table is not None:
            ranks, keys = zip(*candidates)
            pending.ranks, pending.keys = self.ranking.best(torch.cat(ranks), torch.cat(keys), self.top)
        elif candidates:
            pending.keys = top_keys(torch.cat(candidates), self.top)

    def rescore_flagged(self, pending: Pending) -> None:
        """Score the pairs a search kernel flagged (-1) again through the general op, and take the query's
        best keys again: the exact kernel's pairs past int16 (in float32, exact for integers below 2^24),
        the soft kernel's pairs its scaled space could not hold. Rare, so the work waits for the device
        here: the blocks' counts in one read, then each block with flagged pairs."""
        if not pending.flagged:
            return
        counts = torch.cat([count for _, _, count in pending.flagged]).tolist()  # one read for all blocks
        if not any(counts):
            return
        timing = self.timing()  # the scoring calls' time includes this rescoring
        candidates = []
        for index, ((block, scored, _), count) in enumerate(zip(pending.flagged, counts)):  # one entry per block
            scores = scored.float()
            if count:
                wide = (scored < 0).nonzero().flatten()
                scores[wide] = score_checked_codes(
                    pending.query.expand(len(wide), -1), block.codes[wide], self.matrix, self.gap, self.temperature,
                    None, block.lengths[wide], self.backend, **self.affine)
                self.rescored += len(wide)
            candidates.append(self.candidates(pending, index, block, scores))
        timing(pending)
        self.choose(pending, candidates)

    def timing(self):
        """Starts timing scoring calls; the returned function ends it and adds the interval to a pending
        query's: a pair of CUDA events (read once the query's work is done), or the host clock's seconds."""
        if self.on_gpu:
            started, finished = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            started.record(torch.cuda.current_stream(self.device))

            def end(pending: Pending) -> None:
                finished.record(torch.cuda.current_stream(self.device))
                pending.events.append((started, finished))
        else:
            began = time.perf_counter()

            def end(pending: Pending) -> None:
                pending.seconds += time.perf_counter() - began
        return end

    def finish(self, pending: Pending) -> tuple[Hits, float]:
        """A launched query's hits on the host, and the seconds of its scoring calls: the one wait for
        the device per query."""
        if pending.keys is None:  # an empty database
            return Hits(torch.zeros(0), torch.zeros(0, dtype=torch.int64)), pending.seconds
        self.rescore_flagged(pending)
        keys = pending.keys.cpu()  # waits for the query's work
        return hits_of(keys, pending.ranks), pending.kernel_seconds()

    def step(self, codes: bytes | None, pending: Pending | None) -> tuple[Pending | None, tuple[Hits, float] | None]:
        """Launch the next query (codes, or None at the end), then finish the one before (pending):
        the device has the next query's work while the host waits for, and writes, the last one's."""
        queued = self.launch(codes) if codes is not None else None
        return queued, (self.finish(pending) if pending is not None else None)

    def best(self, codes: bytes) -> Hits:
        """The best `top` hits of one query (its codes), on the host."""
        return self.finish(self.launch(codes))[0]


def search(query_codes: Iterable[bytes], database: Database, matrix: torch.Tensor, gap: float | None,
           temperature: float, top: int, backend: str, device=None, max_cells: int = DEFAULT_MAX_CELLS,
           max_bytes: int = DEFAULT_MAX_BYTES, *, gap_open: float | None = None,
           gap_extend: float | None = None, rank=None) -> Iterator[Hits]:
    """The best `top` hits of each query (codes into `matrix`, on `device`), in query order; gaps and
    rank as Searcher's."""
    searcher = Searcher(database, matrix, gap, temperature, top, backend, device, max_cells, max_bytes,
                        gap_open=gap_open, gap_extend=gap_extend, rank=rank)
    pending = None
    for codes in chain(query_codes, [None]):  # None: finish the last query
        pending, done = searcher.step(codes, pending)
        if done is not None:
            yield done[0]


def open_database(path: str, matrix) -> Database:
    """A database from a folder prepared by makedb (memory-mapped) or from a FASTA file (encoded now)."""
    from swcli import database
    from swcli.fasta import display_name, read_blocks

    if database.is_prepared(path):
        db = database.load(path)
        db.check_alphabet(matrix)
        db.check_unknown_as(matrix)
        return db
    if os.path.isdir(path):
        raise DatabaseError(f"{path}: a folder, but not a swcli database (no meta.json): give a FASTA file, or a "
                            "folder made by swcli makedb")
    return database.build_from_blocks(read_blocks(path), matrix, display_name(path))


class HitRows:
    """The TSV rows of each query's hits against db, in query order: (query, target, qlen, tlen, score)
    tuples, or with a details.Formatter its columns (bytes), formatted in a worker thread while the next
    queries are scored (details.InOrder)."""

    def __init__(self, db: Database, formatter=None, cutoff: EvalueCutoff | None = None):
        self.db, self.formatter, self.cutoff = db, formatter, cutoff
        self.length_of = np.empty(len(db), dtype=np.int64)
        self.length_of[db.index] = db.lengths
        self.position_of = self.background = None  # the length order of each database sequence, for the details
        if formatter is not None:
            from swcli.details import InOrder

            self.position_of = np.empty(len(db), dtype=np.int64)
            self.position_of[db.index] = np.arange(len(db))
            self.background = InOrder()

    def put(self, query, codes: bytes, found: Hits) -> list:
        """Queue one query's hits; returns the rows to write now (of this query, or the oldest queued). A
        score that is not finite is an error (output.overflow_error)."""
        finite = torch.isfinite(found.scores)
        if not bool(finite.all()):
            from swcli.output import overflow_error

            k = int(torch.nonzero(~finite)[0])
            raise overflow_error(query.id, self.db.ids[int(found.targets[k])], float(found.scores[k]))
        if self.cutoff is not None:
            found = self.cutoff.within(found, len(query.sequence), self.length_of[found.targets.numpy()], len(self.db))
        if self.background is not None:
            from swcli.details import hit_detail_rows

            return self.background.put(hit_detail_rows, self.formatter, query, codes, found, self.db,
                                       self.position_of)
        return [[(query.id, self.db.ids[target], len(query.sequence), int(self.length_of[target]), score)
                 for score, target in zip(found.scores.tolist(), found.targets.tolist())]]

    def drain(self) -> list:
        """The rows still queued, in order."""
        return self.background.drain() if self.background is not None else []

    def close(self, finished: bool) -> None:
        if self.background is not None:
            self.background.close(finished)


def write_hits(writer, rows) -> None:
    """Write HitRows' rows of one query: tuples, or formatted bytes."""
    if isinstance(rows, bytes):
        writer.write_bytes(rows)
    else:
        writer.write_rows(rows)


def search_rows(queries, query_codes: list[bytes], db: Database, settings, top: int,
                max_bytes: int = DEFAULT_MAX_BYTES, stats: SearchStats | None = None, formatter=None, rank=None,
                cutoff: EvalueCutoff | None = None):
    """TSV rows (query, target, qlen, tlen, score) of each query's best `top` hits, in query order; with
    a details.Formatter, each query's rows of its columns, formatted (bytes).

    queries: FASTA records, and query_codes their codes (the caller encodes them, checking every letter,
    before any output); settings: the pipeline's Settings (matrix, gaps, temperature, backend). The
    scoring runs in a worker thread, waited for in short steps (pipeline.wait_for), so a signal is
    honoured while an engine call runs; stats, if given, counts the queries, cells and kernel time. rank:
    a statistics.KarlinAltschul to keep and write the hits by E-value (None: by score). cutoff: the hits
    written are those of the best `top` within it (HitRows)."""
    from swcli.pipeline import counted_call, scoring_pool, wait_for

    stats = stats if stats is not None else SearchStats()
    rows_of = HitRows(db, formatter, cutoff)
    searcher = Searcher(db, settings.matrix.tensor(), settings.gap, settings.temperature, top, settings.backend,
                        settings.device, max_bytes=max_bytes, gap_open=settings.gap_open,
                        gap_extend=settings.gap_extend, rank=rank)
    stats.sequences, stats.residues, stats.kernel = len(db), db.residues, searcher.kernel_name
    stats.host_bytes, stats.device_bytes, stats.resident = db.nbytes, searcher.device_bytes, searcher.resident is not None
    pool = scoring_pool(searcher.device, "swcli-search")
    finished = False
    try:
        queries, pending = list(queries), None
        for k, codes in enumerate(chain(query_codes, [None])):  # None: finish the last query
            pending, done = wait_for(pool.submit(counted_call, searcher.step, codes, pending))
            if done is None:
                continue
            found, seconds = done
            query = queries[k - 1]
            stats.queries += 1
            stats.cells += len(query.sequence) * db.residues
            stats.kernel_seconds += seconds
            stats.rescored = searcher.rescored
            yield from rows_of.put(query, query_codes[k - 1], found)
        yield from rows_of.drain()
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)
        rows_of.close(finished)


def check_inputs(queries: str, database: str) -> None:
    if queries == database == "-":
        raise SwcliError("stdin ('-') can be read only once: give at most one of QUERIES and DATABASE as -")


def read_queries(queries: str, settings) -> tuple[list, list[bytes]]:
    """The query records and their codes, every letter checked (the queries are few: all before any output)."""
    from swcli.fasta import read_fasta

    records = list(read_fasta(queries))
    return records, [settings.matrix.encode(record.sequence, record.where) for record in records]


def read_inputs(queries: str, database: str, settings, warn=None,
                queries_read: tuple[list, list[bytes]] | None = None) -> tuple[list, list[bytes], Database]:
    """The query records and their codes (read_queries, or queries_read where the caller has them), and the
    database. warn(text), if given, hears of database ids that repeat (their hits cannot be told apart), and
    of queries or a database that look like nucleotides under a protein matrix."""
    from swcli import database as databases
    from swcli.fasta import display_name
    from swcli.scoring import NUCLEOTIDE_SAMPLE

    records, codes = queries_read if queries_read is not None else read_queries(queries, settings)
    db = open_database(database, settings.matrix)
    if warn is not None:
        query_sample = b"".join(codes)[:NUCLEOTIDE_SAMPLE]
        for said in (databases.duplicate_ids(db),
                     settings.matrix.nucleotide_warning(query_sample, display_name(queries)),
                     settings.matrix.nucleotide_warning(db.codes[:NUCLEOTIDE_SAMPLE], db.source)):
            if said is not None:
                warn(said)
    return records, codes, db


def run_search(queries: str, database: str, settings, output: str | None = None, *, top: int = 10,
               header: bool = True, max_bytes: int = DEFAULT_MAX_BYTES, progress=None,
               formatter=None, rank=None, warn=None,
               queries_read: tuple[list, list[bytes]] | None = None, cutoff: EvalueCutoff | None = None) -> SearchStats:
    """`swcli search` as a function: read and check the queries, open the database (a FASTA file or a
    makedb folder), search, write the TSV to `output` (None: stdout). settings: the pipeline's Settings,
    its engine already loaded, so that start-up stays out of the returned SearchStats (seconds run from
    the queries' reading to the output's completion). progress(total), if given, makes the bar.
    formatter: a details.Formatter for other columns than the default ones (computed for the hits only);
    rank: a statistics.KarlinAltschul to keep and write each query's hits by E-value (None: by score).
    warn(text): told of the database's repeated ids (read_inputs). queries_read: read_queries(queries,
    settings) where the caller already read them (their reading is then not in the seconds). cutoff: an
    EvalueCutoff the hits written are within."""
    from contextlib import nullcontext

    from swcli.output import COLUMNS, TsvWriter

    check_inputs(queries, database)
    stats = SearchStats()
    records, codes, db = read_inputs(queries, database, settings, warn, queries_read)
    stats.total = len(records)
    interrupt.check()
    columns = formatter.columns if formatter is not None else COLUMNS
    with (progress(len(records)) if progress else nullcontext()) as bar, TsvWriter(output, header, columns) as writer:
        for rows in search_rows(records, codes, db, settings, top, max_bytes, stats, formatter, rank, cutoff):
            write_hits(writer, rows)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{stats.gcups:.2f} GCUPS", refresh=False)
    stats.seconds = stats.elapsed
    return stats
