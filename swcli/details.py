"""The columns of --format-output: alignment coordinates, counts, CIGAR, aligned text, E-values, bits.

Only the columns asked for are computed, and only for the rows written (a search's top hits), so a run
of the default columns (query, target, qlen, tlen, score) does no more than before.

The alignment columns describe one optimal alignment at temperature 0 under the run's matrix and gaps,
whatever the temperature of the score: the hard Smith-Waterman (Gotoh) alignment that ends at the first
cell of largest score in row-major order, walked back with the engines' tie rule (design.md, section
7), computed from the sequences' codes by a C traceback over the rows' pairs, on several threads
(kernels/host/traceback.cpp). Identity compares codes: letters that the matrix scores as one letter
(upper and lower case, letters mapped by --unknown-as) count as identical.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from swcli import _host
from swcli._host import FIXED, GENERAL, INTEGER, SCORE, TEXT, Column

DEFAULT_COLUMNS = ("query", "target", "qlen", "tlen", "score")
# Every column, in MMseqs2's vocabulary, with what it is (for --help and the usage error).
COLUMNS = {
    "query": "query id",
    "target": "target id",
    "qlen": "query length",
    "tlen": "target length",
    "score": "the score (at the run's temperature)",
    "qstart": "first query residue of the alignment (1-based)",
    "qend": "last query residue (inclusive)",
    "tstart": "first target residue (1-based)",
    "tend": "last target residue (inclusive)",
    "alnlen": "alignment columns (aligned pairs and gap positions)",
    "nident": "identical aligned pairs",
    "fident": "nident / alnlen",
    "pident": "100 nident / alnlen",
    "mismatch": "aligned pairs that differ",
    "gapopen": "gaps (runs of gap positions on one side)",
    "gaps": "gap positions",
    "cigar": "CIGAR: M aligned, I query residue against a gap, D target residue against a gap",
    "qaln": "the aligned query, '-' at gaps",
    "taln": "the aligned target, '-' at gaps",
    "evalue": "E-value (Karlin-Altschul)",
    "bits": "bit score (Karlin-Altschul)",
}
ALIGNMENT_COLUMNS = frozenset(COLUMNS) - {"query", "target", "qlen", "tlen", "score", "evalue", "bits"}
STATISTICS_COLUMNS = frozenset({"evalue", "bits"})


def parse_columns(text: str) -> tuple[str, ...]:
    """--format-output's names, comma-separated, in the order given. Raises click's usage error (exit 2)
    naming the first bad one: unknown, empty or repeated."""
    from swcli.scoring import _usage_error as usage_error

    names = tuple(name.strip() for name in text.split(","))
    seen = set()
    for name in names:
        if name not in COLUMNS:
            what = "an empty name" if not name else f"unknown column {name!r}"
            raise usage_error(f"--format-output: {what}; the columns are {','.join(COLUMNS)}")
        if name in seen:
            raise usage_error(f"--format-output: column {name!r} is given twice")
        seen.add(name)
    return names


@dataclass
class Rows:
    """The pairs of rows to write, in columns. Ids: flat UTF-8 bytes with offsets, and the entry of each
    row. Codes: flat uint8 codes into the matrix, row k's sequence at codes[starts[k]:][:lengths[k]].
    searched: how many sequences each query was compared with (1 for align's pairs, the database's
    sequences for a search), the E-value's multiplier. evalues: the E-values a search ranked by, which
    the evalue column prints as they are."""

    query_ids: np.ndarray
    query_id_offsets: np.ndarray
    query_index: np.ndarray
    target_ids: np.ndarray
    target_id_offsets: np.ndarray
    target_index: np.ndarray
    query_codes: np.ndarray
    query_starts: np.ndarray
    query_lengths: np.ndarray
    target_codes: np.ndarray
    target_starts: np.ndarray
    target_lengths: np.ndarray
    scores: np.ndarray  # float32
    searched: int = 1
    evalues: np.ndarray | None = None  # float64, where a search ranked by E-value computed them

    def __len__(self) -> int:
        return len(self.scores)


def tracebacks(rows: Rows, matrix, gap_open: float, gap_extend: float, threads: int) -> _host.Tracebacks:
    """One optimal t = 0 alignment of each row's pair (gap_open == gap_extend: linear gaps)."""
    table = np.asarray(matrix.scores, dtype=np.float32)
    return _host.traceback(rows.query_codes, rows.query_starts, rows.query_lengths, rows.target_codes,
                           rows.target_starts, rows.target_lengths, table, gap_open, gap_extend, threads)


class Formatter:
    """TSV rows of the chosen columns. settings: the pipeline's Settings (matrix, gaps); statistics: a
    statistics.KarlinAltschul where evalue or bits are asked for; threads: for the traceback."""

    def __init__(self, columns: tuple[str, ...], settings, statistics=None, threads: int = 1):
        if STATISTICS_COLUMNS & set(columns) and statistics is None:
            raise ValueError("evalue and bits need Karlin-Altschul parameters")
        self.columns, self.settings, self.statistics, self.threads = columns, settings, statistics, threads
        gaps = settings.gaps
        self.gap_open = gaps.gap if not gaps.affine else gaps.gap_open
        self.gap_extend = gaps.gap if not gaps.affine else gaps.gap_extend

    def header(self) -> str:
        return "\t".join(self.columns)

    def rows(self, rows: Rows) -> bytes:
        """The TSV rows (no header) of `rows`, in their order."""
        alignments = None
        if ALIGNMENT_COLUMNS & set(self.columns):
            alignments = tracebacks(rows, self.settings.matrix, self.gap_open, self.gap_extend, self.threads)
        return _host.tsv_columns(len(rows), [self._column(name, rows, alignments) for name in self.columns])

    def _column(self, name: str, rows: Rows, alignments: _host.Tracebacks | None) -> Column:
        if name == "query":
            return Column(TEXT, rows.query_ids, rows.query_id_offsets, rows.query_index)
        if name == "target":
            return Column(TEXT, rows.target_ids, rows.target_id_offsets, rows.target_index)
        if name == "qlen":
            return Column(INTEGER, rows.query_lengths)
        if name == "tlen":
            return Column(INTEGER, rows.target_lengths)
        if name == "score":
            return Column(SCORE, rows.scores)
        if name == "evalue":
            values = rows.evalues if rows.evalues is not None else self.statistics.evalues(
                rows.scores, rows.query_lengths, rows.target_lengths, rows.searched)
            return Column(GENERAL, values, precision=3)
        if name == "bits":
            return Column(FIXED, self.statistics.bits(rows.scores), precision=1)
        return _alignment_column(name, rows, alignments, self.settings.matrix.alphabet)


def _alignment_column(name: str, rows: Rows, alignments: _host.Tracebacks, alphabet: str) -> Column:
    ends, counts = alignments.ends, alignments.counts
    where = {"qstart": 0, "qend": 1, "tstart": 2, "tend": 3}
    if name in where:
        return Column(INTEGER, ends[:, where[name]])
    identities, mismatches, gap_opens, gaps = counts.T
    length = alignments.op_lengths
    if name == "alnlen":
        return Column(INTEGER, length)
    if name == "nident":
        return Column(INTEGER, identities)
    if name == "mismatch":
        return Column(INTEGER, mismatches)
    if name == "gapopen":
        return Column(INTEGER, gap_opens)
    if name == "gaps":
        return Column(INTEGER, gaps)
    if name in ("fident", "pident"):
        # thousandths of nident / alnlen (tenths of a percent), rounded half up from the counts: a float
        # quotient rounds ties either way (23 / 80 = 0.2875 printed 0.287, 49 / 80 = 0.6125 printed 0.613)
        counts = identities.astype(np.int64)
        thousandths = (2000 * counts + length) // np.maximum(2 * length, 1)  # an empty alignment: 0
        return (Column(FIXED, thousandths / 1000, precision=3) if name == "fident"
                else Column(FIXED, thousandths / 10, precision=1))
    if name == "cigar":
        text, offsets = _host.cigars(alignments)
        return Column(TEXT, text, offsets)
    if name == "qaln":
        first = np.maximum(ends[:, 0] - 1, 0)
        text, offsets = _host.aligned_text(alignments, rows.query_codes, rows.query_starts, first, alphabet, b"I")
        return Column(TEXT, text, offsets)
    if name == "taln":
        first = np.maximum(ends[:, 2] - 1, 0)
        text, offsets = _host.aligned_text(alignments, rows.target_codes, rows.target_starts, first, alphabet, b"D")
        return Column(TEXT, text, offsets)
    raise AssertionError(f"column {name} has no formatter")


def _flat_ids(ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [i.encode() for i in ids]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded) or b"\0", dtype=np.uint8), offsets


def chunk_detail_rows(formatter: Formatter, chunk, scores: np.ndarray) -> bytes:
    """The rows of a fasta.PairChunk of align and its scores (in the chunk's order): the chunk's letters
    encoded once more on the host, for the traceback."""
    queries, targets = chunk.queries, chunk.targets
    matrix = formatter.settings.matrix
    query_codes = matrix.encode_records(queries) if ALIGNMENT_COLUMNS & set(formatter.columns) else queries.residues
    target_codes = query_codes if targets is queries else (
        matrix.encode_records(targets) if ALIGNMENT_COLUMNS & set(formatter.columns) else targets.residues)
    rows = Rows(queries.ids, queries.id_offsets, chunk.query_index, targets.ids, targets.id_offsets,
                chunk.target_index, query_codes, queries.offsets[chunk.query_index], chunk.query_lengths,
                target_codes, targets.offsets[chunk.target_index], chunk.target_lengths,
                np.asarray(scores, dtype=np.float32))
    return formatter.rows(rows)


def hit_detail_rows(formatter: Formatter, query, query_codes: bytes, hits, db, position_of: np.ndarray) -> bytes:
    """The rows of one query's hits (search.Hits, targets in database order) against `db`, whose sequence
    of database order d sits at length-order position position_of[d]."""
    targets = hits.targets.numpy()
    count = len(targets)
    query_ids, query_id_offsets = _flat_ids([query.id])
    target_ids, target_id_offsets = _flat_ids([db.ids[t] for t in targets.tolist()])
    positions = position_of[targets]
    codes = np.frombuffer(query_codes, dtype=np.uint8) if query_codes else np.zeros(1, dtype=np.uint8)
    rows = Rows(query_ids, query_id_offsets, np.zeros(count, dtype=np.int64), target_ids, target_id_offsets,
                np.arange(count, dtype=np.int64), codes, np.zeros(count, dtype=np.int64),
                np.full(count, len(query_codes), dtype=np.int64), np.asarray(db.codes), db.offsets[positions],
                db.lengths[positions], hits.scores.numpy().astype(np.float32), searched=len(db), evalues=hits.evalues)
    return formatter.rows(rows)


class InOrder:
    """Rows formatted in a worker thread while the caller goes on, handed back in the order queued.

    A search queues each query's rows here and launches the next query's scoring at once, so the device
    is never idle while the host computes tracebacks (the traceback releases the GIL and runs on its own
    threads). At most `depth` results wait, so memory stays bounded; waits go through pipeline.wait_for,
    so a signal is honoured, and the calls count as engine calls in progress (cli.main then does not
    wait for one at exit)."""

    def __init__(self, depth: int = 4):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swcli-details")
        self.pending = deque()
        self.depth = depth

    def put(self, function, *args) -> list[bytes]:
        """Queue function(*args); returns the oldest results that must now be taken to stay within depth."""
        from swcli.pipeline import counted_call, wait_for

        self.pending.append(self.pool.submit(counted_call, function, *args))
        return [wait_for(self.pending.popleft()) for _ in range(len(self.pending) - self.depth)]

    def drain(self) -> list[bytes]:
        """Every result still queued, in order."""
        from swcli.pipeline import wait_for

        done = []
        while self.pending:
            done.append(wait_for(self.pending.popleft()))
        return done

    def close(self, finished: bool) -> None:
        """Stop the worker: after a complete run, once idle; after an error or a signal, without waiting."""
        self.pool.shutdown(wait=finished, cancel_futures=True)
