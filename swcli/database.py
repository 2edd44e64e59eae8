"""A search database: every sequence encoded once into one flat uint8 array, ordered by length.

A database holds the codes of all its sequences back to back (`codes`), where sequence k of the length
order spans codes[offsets[k]:offsets[k + 1]] and `index[k]` is its place in the FASTA file (database
order, which breaks ties between equal scores). It is built from FASTA at the start of a search, or
prepared once by `swcli makedb` into a folder whose arrays are memory-mapped, so that repeated searches
start without reading or encoding the FASTA again.

The folder: codes.u8, offsets.i64, index.i64 (raw little-endian arrays), ids.txt (one id per line, in
database order) and meta.json (format, alphabet, the matrix and --unknown-as it was encoded with, counts,
and each other file's CRC-32, checked when the folder is opened: a change that keeps every file
well-formed, a code still a letter, would otherwise go unseen). It is written into a temporary folder
beside the destination and renamed into place, so a killed makedb leaves no half-written database: an
interrupted run removes its temporary folder, and the next makedb of the same name removes those of
processes that died.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swcli import interrupt
from swcli.errors import DatabaseError, SwcliError
from swcli.fasta import FastaRecord, Records, gather_ranges
from swcli.output import create_temporary, temporary_name
from swcli.scoring import SubstitutionMatrix, load_matrix

# 2: meta.json always keeps the CRC-32s, the matrix and --unknown-as (1 could lack the first two, and
# lacked the last: a folder of that format is made again, not guessed at).
FORMAT = "swcli-database-2"
FILES = ("codes.u8", "offsets.i64", "index.i64", "ids.txt", "meta.json")
CHECKED = FILES[:-1]  # the files whose CRC-32 meta.json keeps


@dataclass(frozen=True)
class Database:
    codes: np.ndarray  # (residues,) uint8, the sequences back to back in length order (longest first)
    offsets: np.ndarray  # (D + 1,) int64
    index: np.ndarray  # (D,) int64: database order of sequence k of the length order
    ids: list[str]  # in database order
    alphabet: str  # the alphabet the codes index (the matrix's)
    source: str  # what it was built from, for messages
    # The matrix it was encoded for: a Biopython name, or a matrix file's absolute path.
    matrix: str = ""
    unknown_as: str | None = None  # the letter that stood for the letters the matrix lacks, if one did

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
        """The codes index the matrix only if they were made with its alphabet. A --matrix value is suggested
        only where it loads, from this directory, a matrix that would be accepted: a hint that fails misleads."""
        if matrix.alphabet == self.alphabet:
            return
        kept = _matrix_option(self.matrix, self.alphabet)
        lost = "" if kept else ", not found here with that alphabet"
        made = f" (the matrix {self.matrix}{lost})" if self.matrix else ""
        search = f"search it with --matrix {kept}, or " if kept else ""
        again = _matrix_option(matrix.name, matrix.alphabet, matrix.scores)
        how = f"swcli makedb --matrix {again}" if again else "swcli makedb with the same --matrix"
        raise DatabaseError(
            f"{self.source}: encoded for the alphabet {self.alphabet}{made}, but the matrix {matrix.name} has "
            f"{matrix.alphabet}; {search}prepare it again with this matrix ({how})"
        )

    def check_unknown_as(self, matrix: SubstitutionMatrix) -> None:
        """The codes of letters the matrix lacks are the folder's --unknown-as: a search with another one, or
        none, would score its queries and the database's sequences by different rules. (A folder made without
        one holds no such letter, so any search's is its own.)"""
        def code(letter):
            return matrix.table[ord(letter)] if letter else None

        if self.unknown_as is None or code(matrix.unknown_as) == code(self.unknown_as):
            return
        folder = f"--unknown-as {shlex.quote(self.unknown_as)}"
        search = f"--unknown-as {shlex.quote(matrix.unknown_as)}" if matrix.unknown_as else "no --unknown-as"
        raise DatabaseError(f"{self.source}: prepared with {folder}, but this search has {search}; search it with "
                            f"{folder}, or prepare it again as this search encodes")


def _matrix_option(spec: str, alphabet: str, scores=None) -> str | None:
    """`spec` quoted for a shell if --matrix spec loads, here, a matrix of `alphabet` (and `scores` when given);
    else None. A file named without its folder (a search's --matrix) loads only from beside it."""
    if not spec:
        return None
    try:
        loaded = load_matrix(spec)
    except (SwcliError, OSError):
        return None
    if loaded.alphabet != alphabet or (scores is not None and loaded.scores != scores):
        return None
    return shlex.quote(spec)


def matrix_reference(spec: str, matrix: SubstitutionMatrix) -> str:
    """How a folder names the --matrix `spec` it is made with, so that a search from any directory can be told
    to use it: a matrix file by its absolute path (its name alone loads only beside it), else the name."""
    path = Path(spec)
    return str(path.resolve()) if path.is_file() else matrix.name


def build(records: Iterable[FastaRecord], matrix: SubstitutionMatrix, source: str) -> Database:
    """build_from_blocks for records given one by one (tests, a few sequences)."""
    return build_from_blocks([Records.from_records(list(records))], matrix, source)


def build_from_blocks(blocks: Iterable[Records], matrix: SubstitutionMatrix, source: str,
                      matrix_name: str | None = None) -> Database:
    """Encode every sequence once (letters checked as in align) and order them longest first: array
    operations over the blocks of fasta.read_blocks, no Python object per sequence but its id. The database
    names its matrix `matrix_name` (see matrix_reference), else the matrix's own name."""
    records = Records.concatenate(list(blocks) or [Records.from_records([])])
    codes = matrix.encode_records(records)
    lengths = records.lengths
    index = np.argsort(-lengths, kind="stable")  # longest first, database order among equal lengths
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths[index], out=offsets[1:])
    ordered = gather_ranges(codes, records.offsets[:-1][index], lengths[index])
    id_bytes, bounds = records.ids.tobytes(), records.id_offsets.tolist()
    ids = [id_bytes[a:b].decode() for a, b in zip(bounds, bounds[1:])]
    return Database(ordered, offsets, index.astype(np.int64), ids, matrix.alphabet, source,
                    matrix_name or matrix.name, matrix.unknown_as)


def duplicate_ids(database: Database) -> str | None:
    """A warning where ids repeat (hits on them cannot be told apart in the output), else None: the
    number of such ids and the first, with its first two record numbers."""
    seen: dict[str, int] = {}
    first, repeated = None, set()
    for number, name in enumerate(database.ids, 1):
        earlier = seen.setdefault(name, number)
        if earlier != number:
            repeated.add(name)
            first = first or (name, earlier, number)
    if first is None:
        return None
    name, a, b = first
    count = f"{len(repeated):,} ids appear" if len(repeated) > 1 else "1 id appears"
    return (f"{database.source}: {count} more than once ({name!r}: records {a} and {b}); "
            "the output cannot tell their hits apart")


def check_new_folder(folder: str | Path) -> Path:
    """The folder's parent, where makedb may create it: before the FASTA is read, so that a path that
    cannot be written is an error at once, not after the whole database was encoded."""
    if not str(folder).strip():
        raise DatabaseError("FOLDER is empty: give the path of the new folder")
    folder = Path(folder)
    try:
        taken = folder.exists() or folder.is_symlink()
    except OSError as exc:  # a folder above it that this user cannot search
        raise DatabaseError(f"{folder}: cannot create it ({exc.strerror or exc})") from None
    if taken:
        raise DatabaseError(f"{folder}: already exists; makedb writes a new folder and replaces nothing")
    parent = folder.parent  # as written: `missing/../db` needs `missing`, which resolve() would not see
    if not parent.is_dir():
        found = "is not a folder" if parent.exists() else "does not exist"
        raise DatabaseError(f"{folder}: {parent} {found}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DatabaseError(f"{folder}: cannot create it (the folder {parent} is not writable for this user)")
    return parent


def save(database: Database, folder: str | Path) -> None:
    """Write the database into `folder` (created; an existing folder is refused, never overwritten)."""
    folder = Path(folder)
    parent = check_new_folder(folder)
    if interrupt.is_registered(str(parent / temporary_name(folder.name))):
        raise DatabaseError(f"{folder}: this process is writing it already")
    try:
        staging, _ = create_temporary(str(parent), folder.name, lambda path: os.mkdir(path, 0o700))
    except OSError as exc:
        raise DatabaseError(f"{folder}: cannot create it ({exc.strerror})") from None
    staging = Path(staging)
    try:
        ids = "".join(f"{i}\n" for i in database.ids).encode("utf-8")
        checksums = {"codes.u8": _write_array(staging / "codes.u8", database.codes, "<u1"),
                     "offsets.i64": _write_array(staging / "offsets.i64", database.offsets, "<i8"),
                     "index.i64": _write_array(staging / "index.i64", database.index, "<i8"),
                     "ids.txt": zlib.crc32(ids)}
        (staging / "ids.txt").write_bytes(ids)
        meta = {"format": FORMAT, "alphabet": database.alphabet, "matrix": database.matrix,
                "unknown_as": database.unknown_as, "sequences": len(database), "residues": database.residues,
                "source": database.source, "crc32": checksums}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        os.chmod(staging, 0o755)
        if os.path.lexists(folder):  # made meanwhile: rename would replace an empty folder
            raise DatabaseError(f"{folder}: made while makedb ran; makedb writes a new folder and replaces nothing")
        os.rename(staging, folder)
    except OSError as exc:  # a full disk, a folder made meanwhile at the same path
        shutil.rmtree(staging, ignore_errors=True)
        raise DatabaseError(f"{folder}: cannot write the database ({exc.strerror or exc})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        interrupt.unregister_temporary(str(staging))


def _write_array(path: Path, array: np.ndarray, dtype: str) -> int:
    """Writes the array's bytes; returns their CRC-32."""
    # Through a file object rather than ndarray.tofile, whose short write on a full disk is an OSError
    # without its errno ("N requested and M written"), not "No space left on device".
    data = _bytes_of(np.ascontiguousarray(array, dtype=dtype))
    with open(path, "wb") as out:
        out.write(data)
    return zlib.crc32(data)


def _bytes_of(data) -> memoryview | bytes:
    """An array's bytes (bytes as they are), as written and as checksummed."""
    return data if isinstance(data, bytes) else memoryview(np.ascontiguousarray(data)).cast("B")


def is_prepared(path: str | Path) -> bool:
    """Whether `path` is a folder prepared by makedb (rather than a FASTA file)."""
    try:
        return (Path(path) / "meta.json").is_file()
    except OSError as exc:  # a folder this user cannot search, or one above it
        raise DatabaseError(f"{path}: cannot read ({exc.strerror or exc})") from None


def load(folder: str | Path) -> Database:
    """A prepared database, its arrays memory-mapped; every inconsistency is a DatabaseError."""
    try:
        return _load(Path(folder))
    except OSError as exc:  # a file this user cannot read, a folder it cannot search
        raise DatabaseError(f"{exc.filename or folder}: cannot read ({exc.strerror or exc})") from None


def _load(folder: Path) -> Database:
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise DatabaseError(f"{folder}: not a complete swcli database (missing {', '.join(missing)})")
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise DatabaseError(f"{folder}/meta.json: unreadable ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatabaseError(f"{folder}: format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                            f"expected {FORMAT!r}; prepare it again with swcli makedb")
    count, residues, alphabet = meta.get("sequences"), meta.get("residues"), meta.get("alphabet")
    if not (type(count) is int and type(residues) is int and count >= 0 and residues >= 0
            and isinstance(alphabet, str) and alphabet):
        raise DatabaseError(f"{folder}/meta.json: sequences {count!r}, residues {residues!r}, alphabet "
                            f"{alphabet!r}: not a count, a count and letters; prepare it again")
    matrix, unknown_as = meta.get("matrix"), meta.get("unknown_as", "")
    if not (isinstance(matrix, str) and matrix and (unknown_as is None or isinstance(unknown_as, str)
                                                    and len(unknown_as) == 1)):
        raise DatabaseError(f"{folder}/meta.json: matrix {matrix!r}, unknown_as {unknown_as!r}: not a matrix's "
                            "name and a letter or null; prepare it again")
    offsets = _array(folder / "offsets.i64", np.int64, count + 1)
    index = _array(folder / "index.i64", np.int64, count)
    codes = _array(folder / "codes.u8", np.uint8, residues)
    raw_ids = (folder / "ids.txt").read_bytes()
    try:
        ids = raw_ids.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError as exc:
        # Never guessed: older swcli wrote the ids in the locale's encoding, which the folder does not record.
        line = raw_ids.count(b"\n", 0, exc.start) + 1
        raise DatabaseError(
            f"{folder}/ids.txt: line {line} (the id of record {line}) is not UTF-8 (byte 0x{raw_ids[exc.start]:02x} "
            f"at offset {exc.start}): a damaged file, or ids in a locale's encoding from an older swcli; rebuild "
            "the folder with swcli makedb, which writes UTF-8") from None
    if len(ids) != count:
        raise DatabaseError(f"{folder}/ids.txt: {len(ids):,} lines, but meta.json counts {count:,} sequences; "
                            "prepare it again")
    lengths = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != residues or np.any(lengths < 1) or np.any(lengths[1:] > lengths[:-1]):
        raise DatabaseError(f"{folder}/offsets.i64: not the bounds of {count:,} sequences of decreasing length "
                            f"from 0 to the {residues:,} residues of meta.json; prepare it again")
    if not np.array_equal(np.sort(index), np.arange(count)):
        raise DatabaseError(f"{folder}/index.i64: not an order of the {count:,} sequences; prepare it again")
    if not all(ids):
        raise DatabaseError(f"{folder}/ids.txt: line {ids.index('') + 1} is empty; prepare it again")
    # Codes past the alphabet would index past the matrix: one pass over the (memory-mapped) codes.
    if residues and int(codes.max()) >= len(alphabet):
        at = int(np.flatnonzero(np.asarray(codes) >= len(alphabet))[0])
        raise DatabaseError(f"{folder}/codes.u8: byte {at} is code {int(codes[at])}, past the {len(alphabet)} "
                            "letters of its alphabet; prepare it again")
    _check_crc32(folder, meta, {"codes.u8": codes, "offsets.i64": offsets, "index.i64": index, "ids.txt": raw_ids})
    return Database(codes, offsets, index, ids, alphabet, str(folder), matrix, unknown_as)


def _check_crc32(folder: Path, meta: dict, contents: dict) -> None:
    """Each file's CRC-32 against the one makedb kept in meta.json, after the checks that name what is wrong."""
    kept = meta.get("crc32")
    if not (isinstance(kept, dict) and all(type(kept.get(name)) is int for name in CHECKED)):
        raise DatabaseError(f"{folder}/meta.json: its crc32 is not a CRC-32 for each of {', '.join(CHECKED)}; "
                            "prepare it again")
    for name in CHECKED:
        found = zlib.crc32(_bytes_of(contents[name]))
        if found != kept[name]:
            raise DatabaseError(f"{folder}/{name}: changed since makedb wrote it (CRC-32 {found:08x}, meta.json "
                                f"keeps {kept[name]:08x}); prepare it again")


def _array(path: Path, dtype, size: int) -> np.ndarray:
    expected = size * np.dtype(dtype).itemsize
    if path.stat().st_size != expected:
        raise DatabaseError(f"{path}: {path.stat().st_size} bytes, expected {expected}; prepare it again")
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(size,))
