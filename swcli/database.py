"""A search database: every sequence encoded once into one flat uint8 array, ordered by length.

A database holds the codes of all its sequences back to back (`codes`), where sequence k of the length
order spans codes[offsets[k]:offsets[k + 1]] and `index[k]` is its place in the FASTA file (database
order, which breaks ties between equal scores). It is built from FASTA at the start of a search, or
prepared once by `swcli makedb` into a folder whose arrays are memory-mapped, so that repeated searches
start without reading or encoding the FASTA again.

The folder: codes.u8, offsets.i64, index.i64 (raw little-endian arrays), ids.txt (one id per line, in
database order) and meta.json (format, alphabet, counts). It is written into a temporary folder beside
the destination and renamed into place, so a killed makedb leaves no half-written database.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swcli.errors import DatabaseError
from swcli.fasta import FastaRecord, Records, gather_ranges
from swcli.scoring import SubstitutionMatrix

FORMAT = "swcli-database-1"
FILES = ("codes.u8", "offsets.i64", "index.i64", "ids.txt", "meta.json")


@dataclass(frozen=True)
class Database:
    codes: np.ndarray  # (residues,) uint8, the sequences back to back in length order (longest first)
    offsets: np.ndarray  # (D + 1,) int64
    index: np.ndarray  # (D,) int64: database order of sequence k of the length order
    ids: list[str]  # in database order
    alphabet: str  # the alphabet the codes index (the matrix's)
    source: str  # what it was built from, for messages
    matrix: str = ""  # the name of the matrix it was encoded for (older folders: unknown)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """(D,) int64 lengths in length order."""
        return np.diff(self.offsets)

    @property
    def residues(self) -> int:
        return int(self.offsets[-1])

    @property
    def nbytes(self) -> int:
        """Host bytes of its arrays and ids, about the prepared folder's size (an id a line, ASCII)."""
        ids = sum(map(len, self.ids)) + len(self.ids)
        return int(self.codes.nbytes + self.offsets.nbytes + self.index.nbytes) + ids

    def padded(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequences start..stop-1 of the length order as (n, longest) uint8 codes padded with 0, and
        their (n,) lengths: one strided copy, no loop over sequences."""
        lengths = self.lengths[start:stop]
        width = int(lengths.max(initial=0))
        begin = self.offsets[start:stop]
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        where = np.where(inside, begin[:, None] + columns[None, :], 0)
        block = np.asarray(self.codes)[where] if self.residues else np.zeros(where.shape, np.uint8)
        return np.where(inside, block, 0).astype(np.uint8), lengths

    def check_alphabet(self, matrix: SubstitutionMatrix) -> None:
        """The codes index the matrix only if they were made with its alphabet."""
        if matrix.alphabet != self.alphabet:
            made = f" (the matrix {self.matrix})" if self.matrix else ""
            search = f"search it with --matrix {self.matrix}, or " if self.matrix else ""
            raise DatabaseError(
                f"{self.source}: encoded for the alphabet {self.alphabet}{made}, but the matrix {matrix.name} has "
                f"{matrix.alphabet}; {search}prepare it again with this matrix (swcli makedb --matrix {matrix.name})"
            )


def build(records: Iterable[FastaRecord], matrix: SubstitutionMatrix, source: str) -> Database:
    """build_from_blocks for records given one by one (tests, a few sequences)."""
    return build_from_blocks([Records.from_records(list(records))], matrix, source)


def build_from_blocks(blocks: Iterable[Records], matrix: SubstitutionMatrix, source: str) -> Database:
    """Encode every sequence once (letters checked as in align) and order them longest first: array
    operations over the blocks of fasta.read_blocks, no Python object per sequence but its id."""
    records = Records.concatenate(list(blocks) or [Records.from_records([])])
    codes = matrix.encode_records(records)
    lengths = records.lengths
    index = np.argsort(-lengths, kind="stable")  # longest first, database order among equal lengths
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths[index], out=offsets[1:])
    ordered = gather_ranges(codes, records.offsets[:-1][index], lengths[index])
    id_bytes, bounds = records.ids.tobytes(), records.id_offsets.tolist()
    ids = [id_bytes[a:b].decode() for a, b in zip(bounds, bounds[1:])]
    return Database(ordered, offsets, index.astype(np.int64), ids, matrix.alphabet, source, matrix.name)


def save(database: Database, folder: str | Path) -> None:
    """Write the database into `folder` (created; an existing folder is refused, never overwritten)."""
    folder = Path(folder)
    if folder.exists():
        raise DatabaseError(f"{folder}: already exists; makedb writes a new folder and replaces nothing")
    parent = folder.resolve().parent
    if not parent.is_dir():
        raise DatabaseError(f"{folder}: the folder {parent} does not exist")
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".part", dir=parent))
    try:
        database.codes.astype("<u1").tofile(staging / "codes.u8")
        database.offsets.astype("<i8").tofile(staging / "offsets.i64")
        database.index.astype("<i8").tofile(staging / "index.i64")
        (staging / "ids.txt").write_text("".join(f"{i}\n" for i in database.ids), encoding="utf-8")
        meta = {"format": FORMAT, "alphabet": database.alphabet, "matrix": database.matrix,
                "sequences": len(database), "residues": database.residues, "source": database.source}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        os.chmod(staging, 0o755)
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def is_prepared(path: str | Path) -> bool:
    """Whether `path` is a folder prepared by makedb (rather than a FASTA file)."""
    return (Path(path) / "meta.json").is_file()


def load(folder: str | Path) -> Database:
    """A prepared database, its arrays memory-mapped; every inconsistency is a DatabaseError."""
    folder = Path(folder)
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise DatabaseError(f"{folder}: not a complete swcli database (missing {', '.join(missing)})")
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise DatabaseError(f"{folder}/meta.json: unreadable ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatabaseError(f"{folder}: format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                            f"expected {FORMAT!r}; prepare it again with swcli makedb")
    count, residues, alphabet = meta.get("sequences"), meta.get("residues"), meta.get("alphabet")
    if not (type(count) is int and type(residues) is int and count >= 0 and residues >= 0
            and isinstance(alphabet, str) and alphabet):
        raise DatabaseError(f"{folder}/meta.json: sequences {count!r}, residues {residues!r}, alphabet "
                            f"{alphabet!r}: not a count, a count and letters; prepare it again")
    offsets = _array(folder / "offsets.i64", np.int64, count + 1)
    index = _array(folder / "index.i64", np.int64, count)
    codes = _array(folder / "codes.u8", np.uint8, residues)
    try:
        ids = (folder / "ids.txt").read_bytes().decode().split("\n")[:-1]
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"{folder}/ids.txt: not UTF-8 (byte {exc.start}); prepare it again") from None
    lengths = np.diff(offsets)
    if (len(ids) != count or offsets[0] != 0 or offsets[-1] != residues or np.any(lengths < 1)
            or np.any(lengths[1:] > lengths[:-1]) or not np.array_equal(np.sort(index), np.arange(count))):
        raise DatabaseError(f"{folder}: its files disagree (ids, offsets, index); prepare it again")
    if not all(ids):
        raise DatabaseError(f"{folder}/ids.txt: line {ids.index('') + 1} is empty; prepare it again")
    # Codes past the alphabet would index past the matrix: one pass over the (memory-mapped) codes.
    if residues and int(codes.max()) >= len(alphabet):
        at = int(np.flatnonzero(np.asarray(codes) >= len(alphabet))[0])
        raise DatabaseError(f"{folder}/codes.u8: byte {at} is code {int(codes[at])}, past the {len(alphabet)} "
                            "letters of its alphabet; prepare it again")
    return Database(codes, offsets, index, ids, alphabet, str(folder), str(meta.get("matrix") or ""))


def _array(path: Path, dtype, size: int) -> np.ndarray:
    expected = size * np.dtype(dtype).itemsize
    if path.stat().st_size != expected:
        raise DatabaseError(f"{path}: {path.stat().st_size} bytes, expected {expected}; prepare it again")
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(size,))
