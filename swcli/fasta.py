"""Streaming FASTA reading (plain or gzip, files or stdin) with validation, and pairing of records.

Records are parsed by Biopython's SimpleFastaParser one at a time, so memory does not grow with the
file. Biopython silently skips text before the first '>' (a FASTQ file would read as zero records), so
the first line is checked here. A UTF-8 byte order mark at the start of the text (plain, gzip or stdin)
is skipped. Headers may not hold control characters other than tab (a NUL or an escape sequence would
go into the TSV as it is); a tab separates words like a space, so an id never holds one.
"""

from __future__ import annotations

import gzip
import io
import itertools
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Imported here, not when the first record is read: importing Bio.SeqIO takes a while, and a Ctrl-C
# that lands inside it can be swallowed by an `except ImportError` deep in the standard library.
from Bio.SeqIO.FastaIO import SimpleFastaParser

from swcli.errors import FastaError, PairingError

GZIP_MAGIC = b"\x1f\x8b"
STDIN = "-"
# Control characters (Unicode category Cc: C0, DEL, C1) other than tab; newlines never reach a header.
HEADER_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


@dataclass(slots=True)
class FastaRecord:
    source: str  # the file name as given ('-' for stdin)
    number: int  # 1-based record number in its file
    id: str  # the first word of the header
    sequence: str

    def where(self) -> str:
        """How errors name this record: file, record number and id."""
        return f"{self.source}: record {self.number} ({self.id})"


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def open_binary(path: str):
    """A buffered binary handle on a file or stdin, with clear errors for missing files and folders."""
    if path == STDIN:
        return sys.stdin.buffer
    p = Path(path)
    if p.is_dir():
        raise FastaError(f"{path}: is a directory, not a FASTA file")
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise FastaError(f"{path}: no such file") from None
    except OSError as exc:
        raise FastaError(f"{path}: cannot open ({exc.strerror})") from None


def open_text(path: str) -> io.TextIOBase:
    """Text lines of a FASTA file; gzip is detected from the first bytes, not from the name."""
    raw = open_binary(path)
    if not hasattr(raw, "peek"):
        raw = io.BufferedReader(raw)
    if raw.peek(2)[:2] == GZIP_MAGIC:
        raw = gzip.GzipFile(fileobj=raw, mode="rb")
    # utf-8-sig: a byte order mark at the very start (as some Windows tools write) is skipped; one
    # anywhere else stays and fails as an invalid header or letter.
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)


def read_fasta(path: str) -> Iterator[FastaRecord]:
    """Yield the records of one FASTA file, checking that it is non-empty, FASTA, with no empty record."""
    name = display_name(path)
    handle = open_text(path)
    try:
        lines = iter(handle)
        number = 0
        for line_number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if not line.startswith(">"):
                hint = " (this looks like FASTQ)" if line.startswith("@") else ""
                raise FastaError(
                    f"{name}: line {line_number}: expected a FASTA header starting with '>', "
                    f"found {line.strip()[:30]!r}{hint}"
                )
            for number, (title, sequence) in enumerate(SimpleFastaParser(itertools.chain([line], lines)), 1):
                control = HEADER_CONTROL.search(title)
                if control is not None:
                    raise FastaError(
                        f"{name}: record {number}: control character {control.group()!r} at position "
                        f"{control.start() + 1} of the header (only tab is allowed there)"
                    )
                words = title.split(None, 1)
                if not words:
                    raise FastaError(f"{name}: record {number}: header has no identifier")
                record = FastaRecord(name, number, words[0], sequence)
                if not sequence:
                    raise FastaError(f"{record.where()}: empty sequence")
                yield record
            break
        if number == 0:
            raise FastaError(f"{name}: empty file, no FASTA records")
    except UnicodeDecodeError as exc:
        raise FastaError(f"{name}: not a text file (byte {exc.start} of a chunk is not UTF-8)") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise FastaError(f"{name}: corrupt or truncated gzip data ({exc})") from None
    finally:
        if path != STDIN:
            handle.close()


def pairs_in_two_files(queries: str, targets: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Record i of QUERIES with record i of TARGETS; unequal counts are an error."""
    left, right = read_fasta(queries), read_fasta(targets)
    for count in itertools.count():
        q, t = next(left, None), next(right, None)
        if q is None and t is None:
            return
        if q is None or t is None:
            shorter, longer, rest = (queries, targets, right) if q is None else (targets, queries, left)
            total = count + 1 + sum(1 for _ in rest)
            raise PairingError(
                f"unequal record counts: {display_name(shorter)} has {count} records, "
                f"{display_name(longer)} has {total}; with two files, record i pairs with record i"
            )
        yield q, t


def pairs_in_one_file(path: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Records 1 with 2, 3 with 4, ...; an odd count is an error."""
    records = read_fasta(path)
    for first in records:
        second = next(records, None)
        if second is None:
            raise PairingError(
                f"{display_name(path)}: odd number of records ({first.number}); with one file, records "
                f"pair up 1 with 2, 3 with 4, ..., and the last one ({first.id}) has no partner"
            )
        yield first, second


def all_against_all(queries: str, targets: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Every query against every target: targets are held in memory, queries streamed."""
    target_records = list(read_fasta(targets))
    query_records = target_records if queries == targets else read_fasta(queries)
    return ((q, t) for q in query_records for t in target_records)
