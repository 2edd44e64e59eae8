"""Bulk, streaming FASTA reading (plain or gzip, files or stdin) with validation, and pairing of records.

A file is read in large blocks of whole records and each block becomes one `Records`: the sequences'
letters back to back in one array, with offsets, and the ids likewise; no Python object per record on
the way from the file to the engine. The scan is one C pass per block (kernels/host/fasta_scan.cpp)
that applies Biopython's SimpleFastaParser rules to plain text and flags the records it cannot be sure
of (control characters, tabs in a sequence, non-ASCII bytes, a header that starts with a blank); those
are parsed again here with Biopython's exact rules, so the result is SimpleFastaParser's, record for
record. Text mode's newline handling is kept: "\\r\\n" and a lone "\\r" end a line.

Checked, with the file, the record number and the position in every message: text before the first
'>' (a FASTQ file would otherwise read as zero records), an empty file, an empty sequence, a header
with no id or an id with control characters (a NUL or an escape sequence would go into the TSV as it
is; a tab separates words like a space, so an id never holds one; the description is not read, so NCBI
nr's Ctrl-A there is kept), bytes that are not UTF-8.
A UTF-8 byte order mark at the start of the text (plain, gzip or stdin) is skipped.
"""

from __future__ import annotations

import gzip
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from swcli.errors import FastaError, PairingError

GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"
STDIN = "-"
BLOCK_BYTES = 1 << 22  # bytes read at a time; a block is whole records, so a longer record makes it longer
NOT_ASCII = 0x80  # the letter byte that stands for any non-ASCII character (refused when encoded)
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


class Records:
    """Consecutive records of one file, in columns: record k has id bytes ids[id_offsets[k]:id_offsets[k+1]]
    (UTF-8) and letters residues[offsets[k]:offsets[k+1]] (ASCII; NOT_ASCII for any other character, whose
    text is kept in `texts` for the error message), and is record number first + k of `source`."""

    __slots__ = ("source", "first", "ids", "id_offsets", "residues", "offsets", "texts")

    def __init__(self, source: str, first: int, ids: np.ndarray, id_offsets: np.ndarray, residues: np.ndarray,
                 offsets: np.ndarray, texts: dict[int, str] | None = None):
        self.source, self.first = source, first
        self.ids, self.id_offsets = ids, id_offsets
        self.residues, self.offsets = residues, offsets
        self.texts = texts or {}

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def id(self, k: int) -> str:
        return self.ids[self.id_offsets[k]:self.id_offsets[k + 1]].tobytes().decode()

    def sequence(self, k: int) -> str:
        if k in self.texts:
            return self.texts[k]
        return self.residues[self.offsets[k]:self.offsets[k + 1]].tobytes().decode("ascii")

    def where(self, k: int) -> str:
        """How errors name record k: file, record number and id."""
        return f"{self.source}: record {self.first + k} ({self.id(k)})"

    def record(self, k: int) -> FastaRecord:
        return FastaRecord(self.source, self.first + k, self.id(k), self.sequence(k))

    def split(self, n: int) -> tuple[Records, Records]:
        """The first n records and the rest (views of the same arrays)."""
        head_texts = {k: v for k, v in self.texts.items() if k < n}
        rest_texts = {k - n: v for k, v in self.texts.items() if k >= n}
        cut, id_cut = self.offsets[n], self.id_offsets[n]
        head = Records(self.source, self.first, self.ids[:id_cut], self.id_offsets[:n + 1],
                       self.residues[:cut], self.offsets[:n + 1], head_texts)
        rest = Records(self.source, self.first + n, self.ids[id_cut:], self.id_offsets[n:] - id_cut,
                       self.residues[cut:], self.offsets[n:] - cut, rest_texts)
        return head, rest

    @classmethod
    def concatenate(cls, parts: list[Records]) -> Records:
        """Consecutive blocks of one file as one."""
        if len(parts) == 1:
            return parts[0]
        texts, shift = {}, 0
        for part in parts:
            texts.update({k + shift: v for k, v in part.texts.items()})
            shift += len(part)
        return cls(parts[0].source, parts[0].first, np.concatenate([p.ids for p in parts]),
                   _join_offsets([p.id_offsets for p in parts]), np.concatenate([p.residues for p in parts]),
                   _join_offsets([p.offsets for p in parts]), texts)

    @classmethod
    def from_records(cls, records: list[FastaRecord]) -> Records:
        """Records in columns (for callers that hold FastaRecord objects: verify, bench, tests)."""
        ids = [r.id.encode() for r in records]
        letters = [_letters(r.sequence) for r in records]
        texts = {k: r.sequence for k, r in enumerate(records) if not r.sequence.isascii()}
        source = records[0].source if records else ""
        return cls(source, records[0].number if records else 1, _bytes_array(b"".join(ids)),
                   _offsets(map(len, ids), len(ids)), _bytes_array(b"".join(letters)),
                   _offsets(map(len, letters), len(letters)), texts)


def _bytes_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, dtype=np.uint8)


def _offsets(sizes, count: int) -> np.ndarray:
    """(count + 1) offsets of pieces of the given sizes (an array or an iterable), from 0."""
    offsets = np.zeros(count + 1, dtype=np.int64)
    if not isinstance(sizes, np.ndarray):
        sizes = np.fromiter(sizes, dtype=np.int64, count=count)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _join_offsets(parts: list[np.ndarray]) -> np.ndarray:
    joined, shift = [parts[0]], parts[0][-1]
    for offsets in parts[1:]:
        joined.append(offsets[1:] + shift)
        shift += offsets[-1]
    return np.concatenate(joined)


def _letters(sequence: str) -> bytes:
    """A sequence's letter bytes: ASCII as it is, any other character as NOT_ASCII (one byte each, so
    positions stay character positions)."""
    if sequence.isascii():
        return sequence.encode("ascii")
    return bytes(ord(c) if ord(c) < 128 else NOT_ASCII for c in sequence)


# ------------------------------------------------------------------------------------------- files

def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def open_binary(path: str):
    """A buffered binary handle on a file or stdin, with clear errors for missing files and folders."""
    if path == STDIN:
        if sys.stdin is None:
            raise FastaError("<stdin>: standard input is closed; give a file")
        return sys.stdin.buffer
    if path == "":
        raise FastaError("an empty path was given for a FASTA file")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FastaError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FastaError(f"{path}: is a directory, not a FASTA file") from None
    except OSError as exc:  # permission denied (on the file or a folder above it), ...
        raise FastaError(f"{path}: cannot open ({exc.strerror or exc})") from None


def _decompressed(raw) -> object:
    """The handle's bytes, gunzipped if they start as gzip does (the name does not matter)."""
    if not hasattr(raw, "peek"):
        import io

        raw = io.BufferedReader(raw)
    if raw.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def _record_texts(handle, size: int, name: str) -> Iterator[memoryview]:
    """Blocks of whole records, each starting at a '>' that starts a line, as views of one buffer that
    the file is read into (a view is valid until the next block is asked for). Line ends are made what
    text mode reads ("\r\n" and a lone "\r" become "\n"), a byte order mark at the very start is
    dropped, and the text before the first record must be blank lines."""
    buffer = bytearray(size)
    end = 0  # buffer[:end] holds text not yet yielded: the unfinished last record
    started, at_start, held_cr, line_number = False, True, False, 0
    while True:
        if len(buffer) - end < size // 2:  # a record longer than a read: room for the next one
            buffer.extend(bytes(max(size, len(buffer))))
        start = end
        if held_cr:  # a "\r" that ended the last read: it may be the first half of "\r\n"
            buffer[end] = 13
            end += 1
        read = handle.readinto(memoryview(buffer)[end:])
        end += read
        held_cr = read > 0 and buffer[end - 1] == 13
        end -= held_cr
        if buffer.find(b"\r", start, end) >= 0:
            text = bytes(buffer[start:end]).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            buffer[start:start + len(text)] = text
            end = start + len(text)
        if at_start and (end >= len(BOM) or read == 0):
            at_start = False
            if buffer.startswith(BOM):
                buffer[:end - len(BOM)] = buffer[len(BOM):end]
                end -= len(BOM)
                start = 0
        if not started:
            started, line_number, skipped = _skip_blank_lines(buffer, end, name, line_number, final=read == 0)
            if skipped:
                buffer[:end - skipped] = buffer[skipped:end]
                end -= skipped
            start = 0
        if read == 0:
            break
        if not started:
            continue
        cut = buffer.rfind(b"\n>", max(start - 1, 0), end)
        if cut >= 0:
            block = memoryview(buffer)[:cut + 1]
            yield block
            block.release()
            buffer[:end - cut - 1] = buffer[cut + 1:end]
            end -= cut + 1
    if held_cr:
        buffer[end] = 10
        end += 1
    if not started:
        raise FastaError(f"{name}: no FASTA records (the file is empty or holds blank lines only)")
    if end:
        block = memoryview(buffer)[:end]
        yield block
        block.release()


def _skip_blank_lines(buffer: bytearray, end: int, name: str, line_number: int,
                      final: bool) -> tuple[bool, int, int]:
    """The blank lines at the start of buffer[:end]: (whether a '>' follows them, lines seen so far, their
    bytes). A line with anything else is an error; `final`: no more bytes will come (a last line may
    lack its newline)."""
    skipped = 0
    while skipped < end and buffer[skipped] != ord(">"):
        newline = buffer.find(b"\n", skipped, end)
        unfinished = newline < 0 and not final
        if unfinished and not bytes(buffer[skipped:end]).strip():
            return False, line_number, skipped  # a blank line that goes on in the next read
        # (a line that is not blank is an error before its end: a file with no newline is not read whole)
        stop = end if newline < 0 else newline
        line_number += 1
        if unfinished:  # (its start, for the message: the rest may be megabytes)
            text = bytes(buffer[skipped:min(stop, skipped + 120)]).decode("utf-8", "replace")
        else:
            text = _decode(bytes(buffer[skipped:stop]), name, f"line {line_number}")
        if text.strip():
            hint = " (this looks like FASTQ)" if text.startswith("@") else ""
            raise FastaError(f"{name}: line {line_number}: expected a FASTA header starting with '>' at the "
                             f"line's first character, found {text.rstrip()[:30]!r}{hint}")
        skipped = stop + 1
    return skipped < end, line_number, min(skipped, end)


def _decode(data: bytes, name: str, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FastaError(f"{name}: {where}: not a text file (byte {exc.start + 1} is not UTF-8)") from None


def _exact_record(text: bytes, name: str, number: int) -> tuple[str, str]:
    """(id, sequence) of one record's text by SimpleFastaParser's own rules: the header rstripped, every
    sequence line rstripped, spaces removed; and the header checks."""
    data = bytes(text)
    header_end = data.find(b"\n") + 1 or len(data)
    try:
        lines = data[header_end:].decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise FastaError(f"{name}: record {number}: not a text file (byte {header_end + exc.start + 1} is not "
                         "UTF-8)") from None
    # The description is read by no one here, so a byte in another encoding there (a Latin-1 name) is
    # kept undecoded rather than refused; the identifier, which the output writes, must be UTF-8.
    title = data[1:header_end].decode("utf-8", "surrogateescape").rstrip()
    words = title.split(None, 1)
    if not words:
        raise FastaError(f"{name}: record {number}: header has no identifier")
    # Only the identifier is checked for control characters: the output writes it, but not the description,
    # where NCBI's nr joins the titles of merged entries with Ctrl-A.
    control = HEADER_CONTROL.search(words[0])
    if control is not None:
        at = title.index(words[0]) + control.start()
        raise FastaError(f"{name}: record {number}: control character {control.group()!r} at position "
                         f"{at + 1} of the header, in its identifier")
    undecoded = re.search("[\udc80-\udcff]", words[0])
    if undecoded is not None:
        before = title[:title.index(words[0]) + undecoded.start()].encode("utf-8", "surrogateescape")
        raise FastaError(f"{name}: record {number}: byte {len(before) + 2} of the header "
                         f"(0x{ord(undecoded.group()) - 0xdc00:02x}), in its identifier, is not UTF-8")
    return words[0], "".join(line.rstrip() for line in lines).replace(" ", "")


def _parse_block(text: memoryview, name: str, first: int, expected: int) -> Records:
    """One block of whole records as Records (none of which refers to the block), checked; `expected`
    is about how many records it holds."""
    from swcli import _host

    residues, ends, id_starts, id_ends, exact = _host.scan_fasta(text, expected)
    count = len(ends)
    starts = np.zeros(count + 1, dtype=np.int64)
    starts[1:] = ends
    id_lengths = id_ends - id_starts
    problems = np.flatnonzero(exact | (np.diff(starts) == 0))  # an empty id is flagged exact
    if len(problems) == 0:
        ids = gather_ranges(text, id_starts, id_lengths)
        return Records(name, first, ids, _offsets(id_lengths, count), residues, starts)
    # Records the scan was not sure of: parsed again one by one, and spliced in.
    record_starts = np.append(id_starts - 1, len(text))
    id_pieces, letter_pieces, texts = [], [], {}
    previous = 0
    lengths = np.diff(starts)
    for k in problems.tolist():
        if previous < k:
            id_pieces.append(gather_ranges(text, id_starts[previous:k], id_lengths[previous:k]))
            letter_pieces.append(residues[starts[previous]:starts[k]])
        if exact[k]:
            record_id, sequence = _exact_record(bytes(text[record_starts[k]:record_starts[k + 1]]), name,
                                                first + k)
        else:
            record_id, sequence = bytes(text[id_starts[k]:id_ends[k]]).decode(), None
        if sequence is None:
            letters = residues[starts[k]:starts[k + 1]].tobytes()
        else:
            letters = _letters(sequence)
            if not sequence.isascii():
                texts[k] = sequence
        if not letters:
            raise FastaError(f"{name}: record {first + k} ({record_id}): empty sequence")
        encoded_id = record_id.encode()
        id_pieces.append(_bytes_array(encoded_id))
        letter_pieces.append(_bytes_array(letters))
        lengths[k] = len(letters)
        id_lengths[k] = len(encoded_id)
        previous = k + 1
    if previous < count:
        id_pieces.append(gather_ranges(text, id_starts[previous:], id_lengths[previous:]))
        letter_pieces.append(residues[starts[previous]:])
    return Records(name, first, np.concatenate(id_pieces), _offsets(id_lengths, count),
                   np.concatenate(letter_pieces), _offsets(lengths, count), texts)


def gather_ranges(data, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes data[starts[k]:starts[k] + lengths[k]] for every k, back to back (data: an array or
    any buffer of bytes)."""
    total = int(lengths.sum())
    data = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if total == 0:
        return np.zeros(0, dtype=np.uint8)
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return data[shift + np.arange(total)]


def read_blocks(path: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Records]:
    """The records of one FASTA file in blocks of about block_bytes, each checked before it is yielded:
    the file is non-empty, FASTA, with no empty record and no bad header."""
    name = display_name(path)
    handle = open_binary(path)
    try:
        number, expected = 1, 1024
        for block in _record_texts(_decompressed(handle), block_bytes, name):
            records = _parse_block(block, name, number, expected)
            number += len(records)
            # room for as many records per byte as this block had, and a margin
            expected = max(1024, int(len(records) * (block_bytes / max(len(block), 1)) * 1.25))
            yield records
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise FastaError(f"{name}: corrupt or truncated gzip data ({exc})") from None
    finally:
        if path != STDIN:
            handle.close()


def read_fasta(path: str) -> Iterator[FastaRecord]:
    """The records of one FASTA file one at a time (for the few-record callers: queries, verify)."""
    for block in read_blocks(path):
        for k in range(len(block)):
            yield block.record(k)


# ----------------------------------------------------------------------------------------- pairing

@dataclass
class PairChunk:
    """Pairs k = (queries record query_index[k], targets record target_index[k]), in input order."""

    queries: Records
    query_index: np.ndarray
    targets: Records
    target_index: np.ndarray

    def __len__(self) -> int:
        return len(self.query_index)

    @property
    def query_lengths(self) -> np.ndarray:
        return self.queries.lengths[self.query_index]

    @property
    def target_lengths(self) -> np.ndarray:
        return self.targets.lengths[self.target_index]

    def pair(self, k: int) -> tuple[FastaRecord, FastaRecord]:
        return self.queries.record(int(self.query_index[k])), self.targets.record(int(self.target_index[k]))

    @classmethod
    def of(cls, pairs: list[tuple[FastaRecord, FastaRecord]]) -> PairChunk:
        index = np.arange(len(pairs), dtype=np.int64)
        return cls(Records.from_records([q for q, _ in pairs]), index,
                   Records.from_records([t for _, t in pairs]), index)


def prefetched(items: Iterator, depth: int = 2) -> Iterator:
    """The items of an iterator, produced up to `depth` ahead in a thread of their own: reading and
    scanning the next blocks (I/O, gunzip, the C scan: all release the GIL) overlap the consumer's work.
    An exception is raised where its item would have been."""
    import queue
    import threading

    slots: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((done, None))
        except BaseException as exc:  # handed to the consumer, raised there
            slots.put((done, exc))

    threading.Thread(target=produce, name="swcli-read", daemon=True).start()
    try:
        while True:
            item, exc = slots.get()
            if exc is not None:
                raise exc
            if item is done:
                return
            yield item
    finally:
        stop.set()


class RecordStream:
    """Records of one file taken n at a time, whatever the blocks they were read in (read ahead in a
    thread of their own)."""

    def __init__(self, path: str):
        self.path = path
        self._blocks = prefetched(read_blocks(path))
        self._buffer: list[Records] = []
        self._buffered = 0

    def take(self, n: int) -> Records | None:
        """The next n records (fewer at the end of the file), or None once it is read."""
        while self._buffered < n:
            block = next(self._blocks, None)
            if block is None:
                break
            self._buffer.append(block)
            self._buffered += len(block)
        if not self._buffer:
            return None
        head, rest = Records.concatenate(self._buffer).split(min(n, self._buffered))
        self._buffer, self._buffered = ([rest], len(rest)) if len(rest) else ([], 0)
        return head

    def count_rest(self) -> int:
        """How many records are left (read and checked to the end)."""
        count = self._buffered
        self._buffer, self._buffered = [], 0
        return count + sum(len(block) for block in self._blocks)


def chunks_in_two_files(queries: str, targets: str, size: int) -> Iterator[PairChunk]:
    """Record i of QUERIES with record i of TARGETS, `size` pairs at a time; unequal counts are an error."""
    left, right = RecordStream(queries), RecordStream(targets)
    done = 0
    while True:
        q, t = left.take(size), right.take(size)
        nq, nt = (len(q) if q is not None else 0), (len(t) if t is not None else 0)
        if nq != nt:
            shorter, longer, stream = (queries, targets, right) if nq < nt else (targets, queries, left)
            count, total = done + min(nq, nt), done + max(nq, nt) + stream.count_rest()
            raise PairingError(
                f"unequal record counts: {display_name(shorter)} has {count} records, "
                f"{display_name(longer)} has {total}; with two files, record i pairs with record i"
            )
        if nq == 0:
            return
        index = np.arange(nq, dtype=np.int64)
        yield PairChunk(q, index, t, index)
        done += nq


def chunks_in_one_file(path: str, size: int) -> Iterator[PairChunk]:
    """Records 1 with 2, 3 with 4, ..., `size` pairs at a time; an odd count is an error."""
    stream = RecordStream(path)
    while (records := stream.take(2 * size)) is not None:
        if len(records) % 2:
            last = len(records) - 1
            raise PairingError(
                f"{display_name(path)}: odd number of records ({records.first + last}); with one file, records "
                f"pair up 1 with 2, 3 with 4, ..., and the last one ({records.id(last)}) has no partner"
            )
        pairs = len(records) // 2
        yield PairChunk(records, np.arange(0, 2 * pairs, 2), records, np.arange(1, 2 * pairs, 2))


def chunks_all_against_all(queries: str, targets: str, size: int) -> Iterator[PairChunk]:
    """Every query against every target, `size` pairs at a time: targets are held in memory, queries
    streamed (one file: every record against every record)."""
    target_records = Records.concatenate(list(read_blocks(targets)))
    count = len(target_records)
    if queries == targets:
        blocks = iter([target_records])
    else:
        stream = RecordStream(queries)
        blocks = iter(lambda: stream.take(max(1, size // count)), None)
    for query_records in blocks:
        pairs = len(query_records) * count
        for start in range(0, pairs, size):
            flat = np.arange(start, min(pairs, start + size), dtype=np.int64)
            yield PairChunk(query_records, flat // count, target_records, flat % count)


RECORD_PAIRS_CHUNK = 4096  # pairs read at a time behind the record-by-record iterators below


def _pairs_of(chunks: Iterator[PairChunk]) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    for chunk in chunks:
        for k in range(len(chunk)):
            yield chunk.pair(k)


def pairs_in_two_files(queries: str, targets: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Record i of QUERIES with record i of TARGETS, as records (verify samples them one by one)."""
    return _pairs_of(chunks_in_two_files(queries, targets, RECORD_PAIRS_CHUNK))


def pairs_in_one_file(path: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Records 1 with 2, 3 with 4, ..., as records."""
    return _pairs_of(chunks_in_one_file(path, RECORD_PAIRS_CHUNK))


def all_against_all(queries: str, targets: str) -> Iterator[tuple[FastaRecord, FastaRecord]]:
    """Every query against every target, as records."""
    return _pairs_of(chunks_all_against_all(queries, targets, RECORD_PAIRS_CHUNK))
