"""fasta.py: streaming reading (plain, gzip, stdin), validation errors, and the three pairing modes."""

import gzip
import io
import sys

import pytest

from swcli.errors import FastaError, PairingError
from swcli.fasta import all_against_all, pairs_in_one_file, pairs_in_two_files, read_fasta


def write(path, text, compress=False):
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_reads_ids_and_wrapped_sequences(tmp_path):
    path = write(tmp_path / "a.fa", ">sp|P1|X first protein\nMKV\nLLA\n\n>b\nmkw\n")
    records = list(read_fasta(path))
    assert [(r.id, r.sequence, r.number) for r in records] == [("sp|P1|X", "MKVLLA", 1), ("b", "mkw", 2)]
    assert records[1].where() == f"{path}: record 2 (b)"


def test_gzip_is_detected_from_bytes_not_name(tmp_path):
    path = write(tmp_path / "plain_name.fa", ">a\nACD\n", compress=True)
    assert [r.sequence for r in read_fasta(path)] == ["ACD"]
    plain = write(tmp_path / "looks.gz", ">a\nACD\n")
    assert [r.sequence for r in read_fasta(plain)] == ["ACD"]


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(b">a\nAC\n>b\nDE\n"))))
    assert [r.id for r in read_fasta("-")] == ["a", "b"]


def test_gzip_stdin(monkeypatch):
    data = gzip.compress(b">a\nAC\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))
    assert [r.sequence for r in read_fasta("-")] == ["AC"]


def test_reading_is_lazy(tmp_path):
    path = write(tmp_path / "a.fa", ">a\nAC\n>b\n\n")  # the empty second record fails only when reached
    records = read_fasta(path)
    assert next(records).id == "a"
    with pytest.raises(FastaError):
        next(records)


@pytest.mark.parametrize("text, message", [
    ("", "no FASTA records"),
    ("\n\n", "no FASTA records"),
    ("@read1\nACGT\n+\nIIII\n", r"line 1: expected a FASTA header.*FASTQ"),
    ("some text\n>a\nAC\n", r"line 1: expected a FASTA header starting with '>' at the line's first character, "
                             r"found 'some text'"),
    ("  >a\nAC\n", r"line 1: expected a FASTA header starting with '>' at the line's first character, "
                   r"found '  >a'"),
    (">a\nAC\n>b\n>c\nDE\n", r"record 2 \(b\): empty sequence"),
    (">\nAC\n", "record 1: header has no identifier"),
])
def test_malformed_files(tmp_path, text, message):
    path = write(tmp_path / "bad.fa", text)
    with pytest.raises(FastaError, match=message) as info:
        list(read_fasta(path))
    assert str(info.value).startswith(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FastaError, match="no such file"):
        list(read_fasta(str(tmp_path / "missing.fa")))
    with pytest.raises(FastaError, match="is a directory"):
        list(read_fasta(str(tmp_path)))


def test_a_description_in_another_encoding_is_read(tmp_path):
    """Only the identifier is used (and written out): a Latin-1 byte in the description does not stop the
    file, while one in the identifier is refused, naming its byte."""
    path = tmp_path / "latin1.fa"
    path.write_bytes(b">sp|P1| M\xfcller kinase\nMKV\n>q2\tCa\xf1on\nAC\n")
    records = list(read_fasta(str(path)))
    assert [(r.id, r.sequence) for r in records] == [("sp|P1|", "MKV"), ("q2", "AC")]
    path.write_bytes(b">a\nMK\n>M\xfcller kinase\nMKV\n")
    with pytest.raises(FastaError, match=r"record 2: byte 3 of the header \(0xfc\), in its identifier, is not UTF-8"):
        list(read_fasta(str(path)))


def test_binary_and_truncated_gzip(tmp_path):
    binary = tmp_path / "binary.fa"
    binary.write_bytes(b">a\n\xff\xfe\x00\x81\n")
    with pytest.raises(FastaError, match="not a text file"):
        list(read_fasta(str(binary)))
    truncated = tmp_path / "cut.fa.gz"
    truncated.write_bytes(gzip.compress(b">a\n" + b"ACDEFGHIKL" * 1000)[:60])
    with pytest.raises(FastaError, match="gzip"):
        list(read_fasta(str(truncated)))


def test_pair_modes(tmp_path):
    q = write(tmp_path / "q.fa", ">q1\nAA\n>q2\nCC\n")
    t = write(tmp_path / "t.fa", ">t1\nDD\n>t2\nEE\n")
    assert [(a.id, b.id) for a, b in pairs_in_two_files(q, t)] == [("q1", "t1"), ("q2", "t2")]
    assert [(a.id, b.id) for a, b in pairs_in_one_file(q)] == [("q1", "q2")]
    assert [(a.id, b.id) for a, b in all_against_all(q, t)] == [
        ("q1", "t1"), ("q1", "t2"), ("q2", "t1"), ("q2", "t2")]
    assert len(list(all_against_all(q, q))) == 4


def test_unequal_counts_name_both_files(tmp_path):
    q = write(tmp_path / "q.fa", ">q1\nAA\n>q2\nCC\n>q3\nDD\n")
    t = write(tmp_path / "t.fa", ">t1\nDD\n")
    with pytest.raises(PairingError, match=rf"{t} has 1 records, {q} has 3"):
        list(pairs_in_two_files(q, t))
    with pytest.raises(PairingError, match=rf"{t} has 1 records, {q} has 3"):
        list(pairs_in_two_files(t, q))


def test_odd_count_in_one_file(tmp_path):
    path = write(tmp_path / "odd.fa", ">a\nAA\n>b\nCC\n>c\nDD\n")
    with pytest.raises(PairingError, match=r"odd number of records \(3\).*\(c\) has no partner"):
        list(pairs_in_one_file(path))


BOM = b"\xef\xbb\xbf"


def test_byte_order_mark_is_skipped_in_files_gzip_and_stdin(tmp_path, monkeypatch):
    data = BOM + b">a desc\r\nMK\r\n>b\nVW\n"
    plain = tmp_path / "bom.fa"
    plain.write_bytes(data)
    packed = tmp_path / "bom.fa.gz"
    packed.write_bytes(gzip.compress(data))
    for path in (plain, packed):
        assert [(r.id, r.sequence) for r in read_fasta(str(path))] == [("a", "MK"), ("b", "VW")]
    for raw in (data, gzip.compress(data)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(raw))))
        assert [r.id for r in read_fasta("-")] == ["a", "b"]


def test_byte_order_mark_elsewhere_is_not_skipped(tmp_path):
    path = tmp_path / "late.fa"
    path.write_bytes(b">a\nMK\n" + BOM + b">b\nVW\n")
    (record,) = read_fasta(str(path))  # the line does not start with '>': sequence text, refused when encoded
    assert record.sequence == "MK\ufeff>bVW"


@pytest.mark.parametrize("header, char, position", [
    (b"a\x00b", "\\x00", 2),
    (b"\x00", "\\x00", 1),
    (b"id\x7f desc", "\\x7f", 3),
    (b"id\x01", "\\x01", 3),
    ("\u0090id".encode(), "\\x90", 1),
])
def test_control_characters_in_ids_are_refused(tmp_path, header, char, position):
    path = tmp_path / "ctl.fa"
    path.write_bytes(b">ok\nMK\n>" + header + b"\nMK\n")
    with pytest.raises(FastaError) as info:
        list(read_fasta(str(path)))
    assert str(info.value) == (f"{path}: record 2: control character '{char}' at position {position} of the "
                               "header, in its identifier")


@pytest.mark.parametrize("header, expected_id", [
    (b"WP_1.1 prot [E. coli]\x01WP_2.1 prot [Shigella]", "WP_1.1"),  # NCBI nr's merged titles
    (b"id desc\x00", "id"),
    (b"id \x1b[31mred", "id"),
    (b"id\x0bx", "id"),  # a vertical tab is whitespace: it ends the id
    ("id \u0085x".encode(), "id"),
])
def test_control_characters_in_descriptions_are_kept(tmp_path, header, expected_id):
    """The description is not read (nor written), so what it holds does not matter, as for Biopython."""
    path = tmp_path / "desc.fa"
    path.write_bytes(b">ok\nMK\n>" + header + b"\nMKV\n")
    assert [(r.id, r.sequence) for r in read_fasta(str(path))] == [("ok", "MK"), (expected_id, "MKV")]


def test_a_tab_in_a_header_ends_the_id(tmp_path):
    # A tab is allowed in a header, and separates words like a space: the id, which the TSV prints, never
    # holds one, so it cannot shift the columns.
    path = write(tmp_path / "tab.fa", ">a\tdesc\nMK\n>b\tc d\nVW\n")
    assert [r.id for r in read_fasta(path)] == ["a", "b"]


# ------------------------------------------------------------------------ the bulk reader, by Biopython

def biopython_records(text: bytes):
    """(id, sequence) by SimpleFastaParser over the text in text mode, as the reader promises."""
    import io

    from Bio.SeqIO.FastaIO import SimpleFastaParser

    handle = io.TextIOWrapper(io.BytesIO(text), encoding="utf-8-sig", newline=None)
    return [(title.split(None, 1)[0], sequence) for title, sequence in SimpleFastaParser(handle)]


def messy_fasta(rng, count: int) -> bytes:
    """Records with every layout the reader must treat as Biopython does: wrapped lines of any width,
    CRLF and lone CR line ends, blanks and tabs at line ends, spaces inside a sequence, blank lines,
    descriptions after a space or a tab, leading blanks in a header, non-ASCII headers and letters."""
    letters = "ACDEFGHIKLMNPQRSTVWYacdxX*"
    parts = []
    for k in range(count):
        sequence = "".join(rng.choice(letters) for _ in range(rng.randint(1, 200)))
        if rng.random() < 0.05:
            sequence = sequence[:3] + "é" + sequence[3:]
        header = rng.choice([f"r{k}", f"r{k} a description", f"r{k}\tdesc", f"  r{k} lead", f"r{k}é ü",
                             f"sp|P{k}|X_HUMAN Protein"])
        end = rng.choice(["\n", "\n", "\r\n", "\r"])
        width = rng.choice([60, 7, 1000])
        lines = [sequence[i:i + width] + rng.choice(["", "", " ", "\t", " \t"]) for i in range(0, len(sequence), width)]
        lines = [line[:2] + " " + line[2:] if rng.random() < 0.1 else line for line in lines]
        parts.append(">" + header + end + end.join(lines) + end + ("\n" if rng.random() < 0.1 else ""))
    return ("\n \n" + "".join(parts)).encode()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_bytes", [16, 257, 1 << 22])
def test_bulk_reader_equals_simple_fasta_parser(tmp_path, seed, block_bytes):
    import random

    from swcli.fasta import read_blocks

    text = messy_fasta(random.Random(seed), 300)
    path = tmp_path / "messy.fa"
    path.write_bytes(text)
    got = [(b.id(k), b.sequence(k)) for b in read_blocks(str(path), block_bytes) for k in range(len(b))]
    assert got == biopython_records(text)
    numbers = [b.first + k for b in read_blocks(str(path), block_bytes) for k in range(len(b))]
    assert numbers == list(range(1, 301))


def test_a_record_longer_than_a_read_and_crlf_split_across_reads(tmp_path):
    from swcli.fasta import read_blocks

    text = b">long\r\n" + b"ACDEFGHIKL\r\n" * 5000 + b">b\r\nMK\r\n"
    path = tmp_path / "long.fa"
    path.write_bytes(text)
    for block_bytes in (11, 12, 13, 4096):
        blocks = list(read_blocks(str(path), block_bytes))
        assert [(b.id(k), b.sequence(k)) for b in blocks for k in range(len(b))] == biopython_records(text)


def test_blocks_are_checked_before_they_are_yielded_and_read_lazily(tmp_path):
    from swcli.fasta import read_blocks

    path = write(tmp_path / "a.fa", "".join(f">r{k}\nMKVL\n" for k in range(200)) + ">bad\n\n")
    blocks = read_blocks(path, block_bytes=64)
    assert next(blocks).id(0) == "r0"  # the empty last record fails only when its block is reached
    with pytest.raises(FastaError, match=r"record 201 \(bad\): empty sequence"):
        list(blocks)


def test_non_ascii_letters_keep_their_position_and_are_refused_when_encoded(tmp_path):
    from swcli.errors import AlphabetError
    from swcli.fasta import Records, read_blocks
    from swcli.scoring import load_matrix

    path = tmp_path / "u.fa"
    path.write_bytes(">a\nMK\n>b\nMKéV\n".encode())
    block = Records.concatenate(list(read_blocks(str(path))))
    assert block.sequence(1) == "MKéV" and block.lengths.tolist() == [2, 4]
    for matrix in (load_matrix("BLOSUM62"), load_matrix("BLOSUM62").with_unknown_as("X")):
        with pytest.raises(AlphabetError, match=rf"{path}: record 2 \(b\): invalid letter 'é' at position 3"):
            matrix.encode_records(block)


def test_pair_chunks_cut_anywhere_keep_the_pairs(tmp_path):
    from swcli.fasta import chunks_all_against_all, chunks_in_one_file, chunks_in_two_files

    q = write(tmp_path / "q.fa", "".join(f">q{k}\nMK{'V' * k}\n" for k in range(9)))
    t = write(tmp_path / "t.fa", "".join(f">t{k}\nWY{'L' * k}\n" for k in range(9)))

    def ids(chunks):
        return [(c.queries.id(int(i)), c.targets.id(int(j))) for c in chunks
                for i, j in zip(c.query_index, c.target_index)]

    for size in (1, 2, 4, 100):
        assert ids(chunks_in_two_files(q, t, size)) == [(f"q{k}", f"t{k}") for k in range(9)]
        assert ids(chunks_all_against_all(q, t, size)) == [(f"q{a}", f"t{b}") for a in range(9) for b in range(9)]
        pairs = ids(chunks_in_one_file(write(tmp_path / "e.fa", "".join(f">r{k}\nMK\n" for k in range(8))), size))
        assert pairs == [(f"r{2 * k}", f"r{2 * k + 1}") for k in range(4)]
        lengths = [(int(a), int(b)) for c in chunks_in_two_files(q, t, size)
                   for a, b in zip(c.query_lengths, c.target_lengths)]
        assert lengths == [(2 + k, 2 + k) for k in range(9)]


def test_text_with_no_newline_is_refused_without_reading_it_whole(monkeypatch):
    """A line before the first '>' that is not blank is an error as soon as it is seen, not at its end: a
    stream that never ends a line (/dev/zero, a binary file) is not held in memory."""
    class Endless(io.RawIOBase):
        read_bytes = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            buffer[:] = b"A" * len(buffer)
            Endless.read_bytes += len(buffer)
            assert Endless.read_bytes < 1 << 28, "read on past 256 MiB"
            return len(buffer)

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    with pytest.raises(FastaError, match=r"^<stdin>: line 1: expected a FASTA header starting with '>' at the "
                                         r"line's first character, found 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'$"):
        list(read_fasta("-"))
    assert Endless.read_bytes <= 1 << 24


def test_blank_lines_across_reads_before_the_first_record(tmp_path):
    path = write(tmp_path / "a.fa", " " * (9 << 20) + "\n" + "\n" * 5 + ">a\nAC\n")  # past two reads
    assert [r.sequence for r in read_fasta(path)] == ["AC"]
