"""The host library (kernels/host): the bulk loops of the host pipeline, called through ctypes.

The loops that run per byte or per row are too slow in Python (or as numpy's several passes) for the
GPU's pace: scanning FASTA text (fasta.py), encoding letters (scoring.py), padding code rows for the
CPU engine (batching.py) and formatting TSV rows (output.py). They are plain C functions over numpy buffers, built
once like the engines (_build.py) and called through ctypes, which releases the GIL for the call, so a
scan or a format overlaps the scoring thread's work.
"""

from __future__ import annotations

import ctypes
import functools

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
