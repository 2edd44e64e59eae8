"""The host library (kernels/host): the bulk loops of the host pipeline, called through ctypes.

The loops that run per byte or per row are too slow in Python (or as numpy's several passes) for the
GPU's pace: scanning FASTA text (fasta.py), encoding letters (scoring.py), padding code rows for the
CPU engine (batching.py) and formatting TSV rows (output.py), and the alignment details of the rows written (details.py). They are plain C functions over numpy buffers, built
once like the engines (_build.py) and called through ctypes, which releases the GIL for the call, so a
scan or a format overlaps the scoring thread's work.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from swcli import _build

_POINTER = ctypes.c_void_p
_SIZE = ctypes.c_int64


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(_build.host_library().library))
    library.swcli_scan_fasta.restype = _SIZE
    library.swcli_scan_fasta.argtypes = [_POINTER, _SIZE, _POINTER, _POINTER, _POINTER, _POINTER, _POINTER, _SIZE]
    library.swcli_tsv_rows.restype = _SIZE
    library.swcli_tsv_rows.argtypes = [_SIZE, *[_POINTER] * 10, _SIZE]
    library.swcli_encode.restype = _SIZE
    library.swcli_encode.argtypes = [_POINTER, _SIZE, _POINTER, ctypes.c_uint8, _POINTER]
    library.swcli_pad_rows.restype = None
    library.swcli_pad_rows.argtypes = [_POINTER, _POINTER, _POINTER, _SIZE, _SIZE, _POINTER]
    library.swcli_traceback.restype = None
    library.swcli_traceback.argtypes = [_SIZE, *[_POINTER] * 7, _SIZE, ctypes.c_float, ctypes.c_float, _SIZE, _SIZE,
                                        _SIZE, *[_POINTER] * 6]
    library.swcli_cigars.restype = None
    library.swcli_cigars.argtypes = [_SIZE, *[_POINTER] * 5]
    library.swcli_aligned_text.restype = None
    library.swcli_aligned_text.argtypes = [_SIZE, *[_POINTER] * 7, ctypes.c_char, _POINTER, _POINTER]
    library.swcli_tsv_columns.restype = _SIZE
    library.swcli_tsv_columns.argtypes = [_SIZE, _SIZE, *[_POINTER] * 6, _SIZE]
    return library


def load() -> None:
    """Build (or load from the cache) the host library now, before any input is read."""
    _library()


def _address(array: np.ndarray) -> int:
    return array.ctypes.data


def scan_fasta(block, expected_records: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One pass over whole records (kernels/host/fasta_scan.cpp): the letters of all sequences, each
    record's end among them, its id's [start, end) in the block, and whether it needs the exact rules.
    `block` is any buffer of bytes; room is made for `expected_records` (more if there are more)."""
    data = np.frombuffer(block, dtype=np.uint8)
    residues = np.empty(len(data), dtype=np.uint8)
    capacity = expected_records
    while True:
        ends, id_starts, id_ends = (np.empty(capacity, dtype=np.int64) for _ in range(3))
        exact = np.empty(capacity, dtype=np.uint8)
        count = _library().swcli_scan_fasta(_address(data), len(data), _address(residues), _address(ends),
                                            _address(id_starts), _address(id_ends), _address(exact), capacity)
        if count >= 0:
            break
        capacity = bytes(block).count(b">")  # more records than expected: count them (at most one per '>')
    residue_count = int(ends[count - 1]) if count else 0
    return residues[:residue_count], ends[:count], id_starts[:count], id_ends[:count], exact[:count].view(bool)


def encode(letters: np.ndarray, table: bytes, invalid: int) -> tuple[np.ndarray, int]:
    """Codes of the letters through a 256-entry table (kernels/host/encode.cpp), and the index of the
    first letter coded `invalid` (-1 if none)."""
    codes = np.empty(len(letters), dtype=np.uint8)
    lookup = np.frombuffer(table, dtype=np.uint8)
    letters = np.ascontiguousarray(letters)
    first = _library().swcli_encode(_address(letters), len(letters), _address(lookup), invalid, _address(codes))
    return codes, first


def pad_rows(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """(rows, width) uint8: row r is flat[starts[r]:starts[r] + lengths[r]] then zeros (lengths <= width)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    out = np.empty((len(starts), width), dtype=np.uint8)
    _library().swcli_pad_rows(_address(flat), _address(starts), _address(lengths), len(starts), width, _address(out))
    return out


def tsv_rows(query_ids: np.ndarray, query_id_offsets: np.ndarray, query_index: np.ndarray,
             target_ids: np.ndarray, target_id_offsets: np.ndarray, target_index: np.ndarray,
             query_lengths: np.ndarray, target_lengths: np.ndarray, scores: np.ndarray) -> bytes:
    """The TSV rows of a chunk of pairs (kernels/host/tsv_rows.cpp), scores as output.format_score
    writes them. Ids are flat UTF-8 bytes with (n + 1) offsets; row k pairs query_index[k] with
    target_index[k]."""
    rows = len(scores)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in
              (query_id_offsets, query_index, target_id_offsets, target_index, query_lengths, target_lengths)]
    q_offsets, q_index, t_offsets, t_index, q_lengths, t_lengths = arrays
    values = np.ascontiguousarray(scores, dtype=np.float32)
    q_ids = np.ascontiguousarray(query_ids, dtype=np.uint8)
    t_ids = np.ascontiguousarray(target_ids, dtype=np.uint8)
    id_bytes = int(np.diff(q_offsets)[q_index].sum()) + int(np.diff(t_offsets)[t_index].sum()) if rows else 0
    capacity = id_bytes + 80 * rows
    out = np.empty(capacity, dtype=np.uint8)
    written = _library().swcli_tsv_rows(
        rows, _address(q_ids), _address(q_offsets), _address(q_index), _address(t_ids), _address(t_offsets),
        _address(t_index), _address(q_lengths), _address(t_lengths), _address(values), _address(out), capacity)
    assert written >= 0, "the rows fit their bound"
    return out[:written].tobytes()


def _int64(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.int64)


@dataclass(frozen=True)
class Tracebacks:
    """One optimal hard alignment per pair (kernels/host/traceback.cpp): scores (n,) float32; ends (n, 4)
    qstart, qend, tstart, tend, 1-based inclusive (0: the empty alignment); counts (n, 4) identities,
    mismatches, gap opens, gap positions; ops: the operations ('M', 'I', 'D') of pair k at
    ops[op_offsets[k]:op_offsets[k] + op_lengths[k]]."""

    scores: np.ndarray
    ends: np.ndarray
    counts: np.ndarray
    ops: np.ndarray
    op_offsets: np.ndarray
    op_lengths: np.ndarray


def traceback(query_codes: np.ndarray, query_starts, query_lengths, target_codes: np.ndarray, target_starts,
              target_lengths, matrix: np.ndarray, gap_open: float, gap_extend: float, threads: int,
              band_rows: int = 0, integer_sweep: bool = True) -> Tracebacks:
    """Pair k: query_codes[query_starts[k]:][:query_lengths[k]] against the target likewise, under
    `matrix` (K x K) and the gaps (equal: linear), on `threads` threads. band_rows: rows swept again at
    a time in the walk back (0: the library's choice; tests set it small). integer_sweep False: every
    pair on the float sweep, which the integer sweep must equal byte for byte (tests)."""
    query_starts, query_lengths = _int64(query_starts), _int64(query_lengths)
    target_starts, target_lengths = _int64(target_starts), _int64(target_lengths)
    pairs = len(query_starts)
    query_codes, target_codes = np.ascontiguousarray(query_codes), np.ascontiguousarray(target_codes)
    table = np.ascontiguousarray(matrix, dtype=np.float32)
    op_offsets = np.zeros(pairs + 1, dtype=np.int64)
    np.cumsum(query_lengths + target_lengths, out=op_offsets[1:])
    ops = np.empty(max(int(op_offsets[-1]), 1), dtype=np.uint8)
    scores = np.empty(pairs, dtype=np.float32)
    ends = np.empty((pairs, 4), dtype=np.int64)
    counts = np.empty((pairs, 4), dtype=np.int64)
    op_lengths = np.empty(pairs, dtype=np.int64)
    _library().swcli_traceback(
        pairs, _address(query_codes), _address(query_starts), _address(query_lengths), _address(target_codes),
        _address(target_starts), _address(target_lengths), _address(table), table.shape[0], gap_open, gap_extend,
        band_rows, int(integer_sweep), max(1, threads), _address(scores), _address(ends), _address(counts), _address(ops),
        _address(op_offsets), _address(op_lengths))
    return Tracebacks(scores, ends, counts, ops, op_offsets[:-1], op_lengths)


def cigars(alignments: Tracebacks) -> tuple[np.ndarray, np.ndarray]:
    """The CIGAR of each alignment as flat text and (n + 1) offsets ("*" for an empty one)."""
    pairs = len(alignments.op_lengths)
    out = np.empty(2 * int(alignments.op_lengths.sum()) + pairs + 1, dtype=np.uint8)
    offsets = np.empty(pairs + 1, dtype=np.int64)
    _library().swcli_cigars(pairs, _address(alignments.ops), _address(alignments.op_offsets),
                            _address(alignments.op_lengths), _address(out), _address(offsets))
    return out, offsets


def aligned_text(alignments: Tracebacks, codes: np.ndarray, starts, first, alphabet: str,
                 own: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One side of each alignment as letters of `alphabet` with '-' against gaps, flat, with (n + 1)
    offsets: codes[starts[k] + first[k]:] are its residues, and `own` (b"I" for the query, b"D" for the
    target) the operation that consumes this side alone."""
    pairs = len(alignments.op_lengths)
    offsets = np.zeros(pairs + 1, dtype=np.int64)
    np.cumsum(np.maximum(alignments.op_lengths, 1), out=offsets[1:])
    out = np.empty(max(int(offsets[-1]), 1), dtype=np.uint8)
    letters = np.frombuffer(alphabet.encode("ascii"), dtype=np.uint8)
    codes, starts, first = np.ascontiguousarray(codes), _int64(starts), _int64(first)
    _library().swcli_aligned_text(pairs, _address(alignments.ops), _address(alignments.op_offsets),
                                  _address(alignments.op_lengths), _address(codes), _address(starts),
                                  _address(first), _address(letters), own, _address(out), _address(offsets))
    return out, offsets


TEXT, INTEGER, SCORE, FIXED, GENERAL = range(5)  # swcli_tsv_columns' kinds of column


@dataclass(frozen=True)
class Column:
    """A TSV column for tsv_columns: kind TEXT (values: flat bytes, offsets (entries + 1), index: the entry
    of each row, None for row k = entry k), INTEGER (int64), SCORE (float32, as format_score), FIXED or
    GENERAL (float64 with `precision` decimals, or significant digits)."""

    kind: int
    values: np.ndarray
    offsets: np.ndarray | None = None
    index: np.ndarray | None = None
    precision: int = 0


def tsv_columns(rows: int, columns: list[Column]) -> bytes:
    """TSV rows of the columns (kernels/host/tsv_rows.cpp, swcli_tsv_columns), in bulk."""
    dtypes = {TEXT: np.uint8, INTEGER: np.int64, SCORE: np.float32, FIXED: np.float64, GENERAL: np.float64}
    held, capacity = [], rows * (len(columns) + 1) + 1
    for column in columns:
        values = np.ascontiguousarray(column.values, dtype=dtypes[column.kind])
        offsets = index = None
        if column.kind == TEXT:
            offsets = _int64(column.offsets)
            index = None if column.index is None else _int64(column.index)
            sizes = np.diff(offsets)
            capacity += int((sizes if index is None else sizes[index]).sum()) if rows else 0
        else:
            capacity += 66 * rows
        held.append((values, offsets, index))
    pointers = lambda arrays: (ctypes.c_void_p * max(len(arrays), 1))(  # noqa: E731
        *[None if a is None else _address(a) for a in arrays])
    kinds = np.array([c.kind for c in columns], dtype=np.int64)
    precision = np.array([c.precision for c in columns], dtype=np.int64)
    out = np.empty(capacity, dtype=np.uint8)
    written = _library().swcli_tsv_columns(
        rows, len(columns), _address(kinds), pointers([v for v, _, _ in held]), pointers([o for _, o, _ in held]),
        pointers([i for _, _, i in held]), _address(precision), _address(out), capacity)
    assert written >= 0, "the rows fit their bound"
    return out[:written].tobytes()
