"""The catalogue of bad inputs, through the real CLI entry (main(argv), as tests/test_cli.py calls it).

One table, one test: each row is (name, files to create, argv, exit code, message fragment). For a bad
input the run must exit with the code the docs give (1 bad data or a runtime problem, 2 a command line
that does not parse), print one line on stderr starting with 'swcli:' that holds the fragment, print
nothing on stdout, and leave no output file: with `-o` to a new path the path does not exist afterwards,
and with `-o` to an existing file that file is untouched. A few good rows (a byte order mark, unknown
letters mapped with --unknown-as, a long record among short ones) exit 0 with the TSV in the file.

The module-level checks (fasta.py, scoring.py, _build.py) keep their own unit tests; this is the view
from the command line.
"""

from __future__ import annotations

import gzip
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from swcli import _build
from swcli.testing import run_cli as run  # main(argv) -> (exit code, stdout, stderr)

DIRECTORY = object()  # in Row.files: make a folder there
NO_COMPILER = "swcli-test-no-such-compiler"
HEADER = "query\ttarget\tqlen\ttlen\tscore"

def fasta(*records: tuple[str, str]) -> bytes:
    return "".join(f">{name}\n{sequence}\n" for name, sequence in records).encode()


GOOD = fasta(("a", "MKV"), ("b", "MKW"))
THREE = fasta(("a", "MKV"), ("b", "MKW"), ("c", "MK"))
BOM = b"\xef\xbb\xbf"


@dataclass
class Row:
    name: str
    files: dict  # name -> bytes (gzip-compressed where the name ends in .gz), or DIRECTORY
    argv: list[str]  # paths relative to the test's folder (the working directory)
    code: int
    message: str | None  # a fragment of the one stderr line; None for a good row (exit 0, stderr empty)
    stdin: bytes | None = None
    env: dict = field(default_factory=dict)  # CXX / SWCLI_CACHE_DIR: the engine is built afresh
    marks: tuple = ()


ROWS = [
    # input files
    Row("missing file", {}, ["align", "nope.fa"], 1, "swcli: error: nope.fa: no such file"),
    Row("directory as input", {"folder": DIRECTORY}, ["align", "folder"], 1, "folder: is a directory"),
    Row("empty file", {"empty.fa": b""}, ["align", "empty.fa"], 1,
        "empty.fa: no FASTA records (the file is empty or holds blank lines only)"),
    Row("blank lines only", {"blank.fa": b"\n\n  \n"}, ["align", "blank.fa"], 1, "blank.fa: no FASTA records"),
    Row("empty gzip file", {"empty.fa.gz": b""}, ["align", "empty.fa.gz"], 1, "empty.fa.gz: no FASTA records"),
    Row("empty stdin", {}, ["align", "-"], 1, "<stdin>: no FASTA records", stdin=b""),
    Row("text before the first '>'", {"text.fa": b"some text\n>a\nMK\n>b\nMK\n"}, ["align", "text.fa"], 1,
        "text.fa: line 1: expected a FASTA header starting with '>' at the line's first character, "
        "found 'some text'"),
    Row("FASTQ", {"reads.fq": b"@r1\nACGT\n+\nIIII\n"}, ["align", "reads.fq"], 1,
        "reads.fq: line 1: expected a FASTA header starting with '>' at the line's first character, "
        "found '@r1' (this looks like FASTQ)"),
    Row("empty sequence", {"e.fa": fasta(("a", "MK"), ("b", ""))}, ["align", "e.fa"], 1,
        "e.fa: record 2 (b): empty sequence"),
    Row("header without an id", {"h.fa": b">a\nMK\n>\nMK\n"}, ["align", "h.fa"], 1,
        "h.fa: record 2: header has no identifier"),
    Row("binary file", {"bin.fa": b">a\n\xff\xfe\x00\x81\n"}, ["align", "bin.fa"], 1,
        "bin.fa: record 1: not a text file (byte 4 is not UTF-8)"),
    Row("identifier not in UTF-8", {"id.fa": b">a\nMK\n> b\xe9c Latin-1\nMK\n"}, ["align", "id.fa"], 1,
        "id.fa: record 2: byte 4 of the header (0xe9), in its identifier, is not UTF-8"),
    Row("description in Latin-1 (good)", {"desc.fa": b">a M\xfcller\nMK\n>b\nMK\n"}, ["align", "desc.fa"], 0, None),
    Row("truncated gzip", {"cut.fa": gzip.compress(b">a\n" + b"ACDEFGHIKL" * 1000)[:60]}, ["align", "cut.fa"], 1,
        "cut.fa: corrupt or truncated gzip data"),
    # headers (item D)
    Row("NUL in an id", {"nul.fa": b">a\nMK\n>b\x00c\nMK\n"}, ["align", "nul.fa"], 1,
        "nul.fa: record 2: control character '\\x00' at position 2 of the header, in its identifier"),
    Row("escape sequence in an id", {"esc.fa": b">a\x1b[31m\nMK\n>b\nMK\n"}, ["align", "esc.fa"], 1,
        "esc.fa: record 1: control character '\\x1b' at position 2 of the header, in its identifier"),
    Row("Ctrl-A in a description (good, NCBI nr)", {"nr.fa": b">a x\x01b y\nMK\n>b\nMK\n"}, ["align", "nr.fa"],
        0, None),
    Row("BOM, plain (good)", {"bom.fa": BOM + GOOD}, ["align", "bom.fa"], 0, None),
    Row("BOM, gzip (good)", {"bom.fa.gz": BOM + GOOD}, ["align", "bom.fa.gz"], 0, None),
    Row("BOM, stdin (good)", {}, ["align", "-"], 0, None, stdin=BOM + GOOD),
    Row("BOM, gzip stdin (good)", {}, ["align", "-"], 0, None, stdin=gzip.compress(BOM + GOOD)),
    Row("tab in a header ends the id (good)", {"tab.fa": b">a\tx y\nMKV\n>b\tz\nMKW\n"}, ["align", "tab.fa"], 0,
        None),
    # pairing
    Row("unequal record counts", {"three.fa": THREE, "good.fa": GOOD}, ["align", "three.fa", "good.fa"], 1,
        "unequal record counts: good.fa has 2 records, three.fa has 3"),
    Row("odd count in one file", {"three.fa": THREE}, ["align", "three.fa"], 1,
        "three.fa: odd number of records (3)"),
    Row("stdin twice", {}, ["align", "-", "-"], 1, "stdin ('-') can be read only once", stdin=GOOD),
    # letters and matrices (item C)
    Row("search: stdin twice", {}, ["search", "-", "-"], 1, "stdin ('-') can be read only once", stdin=GOOD),
    Row("search: a missing database", {"good.fa": GOOD}, ["search", "good.fa", "nope.db"], 1,
        "nope.db: no such file"),
    Row("search: an incomplete database folder", {"good.fa": GOOD, "db/meta.json": b"{}"},
        ["search", "good.fa", "db"], 1, "not a complete swcli database (missing codes.u8"),
    Row("search: --top 0", {"good.fa": GOOD}, ["search", "good.fa", "good.fa", "--top", "0"], 2, "--top"),
    Row("makedb: an existing folder", {"good.fa": GOOD, "db/keep": b"mine"}, ["makedb", "good.fa", "db"], 1,
        "db: already exists"),
    Row("makedb: a bad letter", {"j.fa": fasta(("a", "MK"), ("b", "MKJV"))}, ["makedb", "j.fa", "new.db"], 1,
        "j.fa: record 2 (b): invalid letter 'J' at position 3"),
    Row("unknown letter", {"j.fa": fasta(("a", "MK"), ("b", "MKJV"))}, ["align", "j.fa"], 1,
        "j.fa: record 2 (b): invalid letter 'J' at position 3 (not in the BLOSUM62 alphabet"),
    Row("unknown letter with --unknown-as X (good)", {"j.fa": fasta(("a", "MK"), ("b", "MKJV"))},
        ["align", "j.fa", "--unknown-as", "X"], 0, None),
    Row("--unknown-as outside the alphabet", {"good.fa": GOOD}, ["align", "good.fa", "--unknown-as", "J"], 2,
        "--unknown-as 'J' must be one letter of the BLOSUM62 alphabet"),
    Row("unknown letter after output started", {"late.fa": fasta(*[(f"r{k}", "MKVLA") for k in range(9)],
                                                                 ("bad", "MKV1"), ("r9", "MK"))},
        ["align", "late.fa", "--chunk-size", "1"], 1, "late.fa: record 10 (bad): invalid letter '1' at position 4"),
    Row("unknown matrix name", {"good.fa": GOOD}, ["align", "good.fa", "-m", "BLOSUM99"], 1,
        "unknown matrix 'BLOSUM99': not a file, and not one of Biopython's: "),
    Row("unreadable matrix file", {"good.fa": GOOD, "junk.mat": b"this is not a matrix\n1 2 3\n"},
        ["align", "good.fa", "-m", "junk.mat"], 1,
        "junk.mat: line 1: the header should be distinct letters, one a column, got 'this is not a matrix'"),
    Row("NaN in a matrix file", {"good.fa": GOOD, "nan.mat": b"   M  K  V  W\nM 1 0 0 0\nK 0 1 nan 0\n"
                                                            b"V 0 0 1 0\nW 0 0 0 1\n"},
        ["align", "good.fa", "-m", "nan.mat"], 1, "nan.mat: the score of row K, column V is nan"),
    Row("inf in a matrix file", {"good.fa": GOOD, "inf.mat": b"   M  K  V  W\nM inf 0 0 0\nK 0 1 0 0\n"
                                                            b"V 0 0 1 0\nW 0 0 0 1\n"},
        ["align", "good.fa", "-m", "inf.mat"], 1, "inf.mat: the score of row M, column M is inf"),
    # option values (item C)
    Row("--temperature -1", {"good.fa": GOOD}, ["align", "good.fa", "--temperature", "-1"], 2,
        "swcli: usage error: Invalid value for '--temperature'"),
    Row("--temperature inf", {"good.fa": GOOD}, ["align", "good.fa", "--temperature", "inf"], 2,
        "Invalid value for '--temperature': inf is not a finite number"),
    Row("--temperature nan", {"good.fa": GOOD}, ["align", "good.fa", "-t", "nan"], 2,
        "Invalid value for '--temperature'"),
    Row("verify --temperature inf", {"good.fa": GOOD}, ["verify", "good.fa", "-t", "inf"], 2,
        "Invalid value for '--temperature': inf is not a finite number"),
    Row("--gap 4 (a positive gap)", {"good.fa": GOOD}, ["align", "good.fa", "--gap", "4"], 2,
        "Invalid value for '--gap'"),
    Row("--gap -inf", {"good.fa": GOOD}, ["align", "good.fa", "--gap", "-inf"], 2,
        "Invalid value for '--gap': -inf is not a finite gap score"),
    Row("--gap nan", {"good.fa": GOOD}, ["align", "good.fa", "--gap", "nan"], 2,
        "Invalid value for '--gap': nan is not a finite gap score <= 0"),
    Row("--temperature past float32", {"good.fa": GOOD}, ["align", "good.fa", "-t", "1e300"], 2,
        "Invalid value for '--temperature': 1e+300 is not a finite number >= 0 within float32's range"),
    Row("a score past float32", {"good.fa": GOOD}, ["align", "good.fa", "-t", "1e38", "--backend", "cpu"], 1,
        "swcli: error: query a, target b: the score is inf, past float32's range; use a smaller temperature"),
    Row("a hit's score past float32", {"good.fa": GOOD},
        ["search", "good.fa", "good.fa", "-t", "1e38", "--backend", "cpu"], 1,
        "swcli: error: query a, target "),
    Row("verify --tolerance nan", {"good.fa": GOOD}, ["verify", "good.fa", "--tolerance", "nan"], 2,
        "Invalid value for '--tolerance': nan is not a finite number >= 0"),
    # affine gaps: each value checked as --gap is, then how the options combine
    Row("--gap with --gap-open", {"good.fa": GOOD}, ["align", "good.fa", "--gap", "-4", "--gap-open", "-12"], 2,
        "swcli: usage error: --gap and --gap-open exclude each other"),
    Row("--gap with --gap-extend", {"good.fa": GOOD}, ["align", "good.fa", "--gap-extend", "-1", "--gap", "-4"], 2,
        "--gap and --gap-extend exclude each other"),
    Row("--gap-open 1 (a positive score)", {"good.fa": GOOD}, ["align", "good.fa", "--gap-open", "1"], 2,
        "Invalid value for '--gap-open': 1.0 is not a finite gap score <= 0"),
    Row("--gap-open -inf", {"good.fa": GOOD}, ["align", "good.fa", "--gap-open", "-inf", "--gap-extend", "-1"], 2,
        "Invalid value for '--gap-open': -inf is not a finite gap score"),
    Row("--gap-extend 0.5", {"good.fa": GOOD}, ["align", "good.fa", "--gap-open", "-12", "--gap-extend", "0.5"], 2,
        "Invalid value for '--gap-extend': 0.5 is not a finite gap score <= 0"),
    Row("--gap-extend nan", {"good.fa": GOOD}, ["align", "good.fa", "--gap-extend", "nan"], 2,
        "Invalid value for '--gap-extend': nan is not a finite gap score"),
    Row("--gap-open above --gap-extend", {"good.fa": GOOD},
        ["align", "good.fa", "--gap-open", "-1", "--gap-extend", "-2"], 2,
        "Invalid value for '--gap-open': -1.0 is not <= --gap-extend -2: a gap's first position scores at most"),
    Row("--gap-open above the matrix's default extension", {"good.fa": GOOD},
        ["align", "good.fa", "--gap-open", "-0.5"], 2,
        "-0.5 is not <= --gap-extend -1 (--gap-extend -1 from BLOSUM62's BLAST default 11/1)"),
    Row("--gap-open alone, a matrix without BLAST defaults", {"good.fa": GOOD},
        ["align", "good.fa", "-m", "NUC.4.4", "--gap-open", "-5"], 2,
        "--gap-open without --gap-extend: matrix NUC.4.4 has no BLAST default gap costs"),
    Row("--gap-extend alone, a matrix file", {"good.fa": GOOD, "BLOSUM62": b"   M  K  V  W\nM 1 0 0 0\nK 0 1 0 0\n"
                                                                         b"V 0 0 1 0\nW 0 0 0 1\n"},
        ["align", "good.fa", "-m", "BLOSUM62", "--gap-extend", "-1"], 2,
        "--gap-extend without --gap-open: a matrix file has no BLAST default gap costs"),
    Row("a matrix file with both affine options (good)", {"good.fa": GOOD, "id.mat": b"   M  K  V  W\nM 1 0 0 0\n"
                                                          b"K 0 1 0 0\nV 0 0 1 0\nW 0 0 0 1\n"},
        ["align", "good.fa", "-m", "id.mat", "--gap-open", "-3", "--gap-extend", "-1"], 0, None),
    Row("affine gaps (good)", {"good.fa": GOOD}, ["align", "good.fa", "--gap-open", "-12", "--gap-extend", "-1"], 0,
        None),
    Row("verify: --gap with --gap-open", {"good.fa": GOOD}, ["verify", "good.fa", "--gap", "-4", "--gap-open", "-9"],
        2, "--gap and --gap-open exclude each other"),
    Row("verify: --gap-extend -inf", {"good.fa": GOOD}, ["verify", "good.fa", "--gap-extend", "-inf"], 2,
        "Invalid value for '--gap-extend': -inf is not a finite gap score"),
    Row("search: --gap-open above --gap-extend", {"good.fa": GOOD},
        ["search", "good.fa", "good.fa", "--gap-open", "-2", "--gap-extend", "-3"], 2,
        "Invalid value for '--gap-open': -2.0 is not <= --gap-extend -3"),
    Row("search: --gap with --gap-extend", {"good.fa": GOOD},
        ["search", "good.fa", "good.fa", "--gap", "-1", "--gap-extend", "-1"], 2,
        "--gap and --gap-extend exclude each other"),
    Row("--chunk-size 0", {"good.fa": GOOD}, ["align", "good.fa", "--chunk-size", "0"], 2,
        "Invalid value for '--chunk-size'"),
    Row("unknown option", {"good.fa": GOOD}, ["align", "good.fa", "--frobnicate"], 2, "No such option"),
    Row("missing argument", {}, ["align"], 2, "Missing argument 'QUERIES'"),
    # the engine (item B)
    Row("--backend cuda without a GPU", {"good.fa": GOOD}, ["align", "good.fa", "--backend", "cuda"], 1,
        "--backend cuda: no CUDA device is available",
        marks=(pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),)),
    Row("a compiler that fails (CXX=false)", {"good.fa": GOOD}, ["align", "good.fa", "--backend", "cpu"], 1,
        "swcli: error: the C++ compiler 'false' (", env={"CXX": "false", "SWCLI_CACHE_DIR": "cache"}),
    Row("no compiler and no built engine", {"good.fa": GOOD}, ["align", "good.fa", "--backend", "cpu"], 1,
        f"no C++ compiler found (looked for '{NO_COMPILER}'", env={"CXX": NO_COMPILER, "SWCLI_CACHE_DIR": "cache"}),
    Row("an unwritable kernel cache", {"good.fa": GOOD, "blocker": b"a file"},
        ["align", "good.fa", "--backend", "cpu"], 1,
        "blocker/cache (Not a directory); point SWCLI_CACHE_DIR at a writable folder",
        env={"SWCLI_CACHE_DIR": "blocker/cache"}),
    # memory (item A): a long record among short ones is scored in a batch of its own
    Row("a long record among short ones (good)",
        {"long.fa": fasta(*[(f"r{k}", "MKVLAW" * 20) for k in range(200)], ("long", "MKVLAWYPGH" * 2000),
                          ("short", "MKV"))}, ["align", "long.fa"], 0, None),
]


def make_files(folder: Path, files: dict) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIRECTORY:
            path.mkdir()
        else:
            path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)


def run_row(row: Row, argv: list[str], capsys, monkeypatch):
    if row.stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(row.stdin))))
    return run(argv, capsys)


def listing(folder: Path) -> dict:
    """The files under folder (the kernel cache aside), with their times and sizes."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in folder.rglob("*") if not p.is_dir() and "cache" not in p.relative_to(folder).parts}


@pytest.fixture(scope="module", autouse=True)
def built_cpu_engine():
    """The CPU engine and the host library built before the first row: on a cold cache the first command
    would otherwise print the first-compile line beside its error (the rows check that the error is the
    only line)."""
    from swcli import _host
    from swcli.ops import load_engine

    load_engine("cpu")
    _host.load()


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name, marks=row.marks) for row in ROWS])
def test_bad_input(row: Row, tmp_path, capsys, monkeypatch):
    make_files(tmp_path, row.files)
    monkeypatch.chdir(tmp_path)
    if row.env:  # the engine is built afresh in this process, under the row's environment
        import swcli.ops

        for name, value in row.env.items():
            monkeypatch.setenv(name, str(tmp_path / value) if name == "SWCLI_CACHE_DIR" else value)
        monkeypatch.setattr(swcli.ops, "_loaded", set())
        monkeypatch.setattr(_build, "cpu_engine", lambda: _build.build("cpu", "cpu", _build.CPU_FLAGS, ["-fopenmp"]))

    if row.argv[0] not in ("align", "search"):  # verify and makedb have no -o: nothing may change
        before = listing(tmp_path)
        code, out, err = run_row(row, row.argv, capsys, monkeypatch)
        assert code == row.code and out == "" and err.count("\n") == 1 and row.message in err, err
        assert listing(tmp_path) == before and [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
        return

    # -o to a new path
    (tmp_path / "out").mkdir()
    code, out, err = run_row(row, row.argv + ["-o", "out/result.tsv"], capsys, monkeypatch)
    assert code == row.code, err
    assert out == ""
    if row.message is None:
        assert err == ""
        lines = (tmp_path / "out" / "result.tsv").read_text().splitlines()
        assert lines[0] == HEADER and len(lines) > 1
        assert os.listdir(tmp_path / "out") == ["result.tsv"]
        return
    assert err.count("\n") == 1 and err.startswith("swcli: ") and err.endswith("\n"), err
    assert row.message in err, err
    assert "Traceback" not in err
    assert os.listdir(tmp_path / "out") == []  # no file, no temporary file left

    # -o to an existing file: untouched, and nothing else left beside it
    existing = tmp_path / "out" / "existing.tsv"
    existing.write_text("keep me\n")
    os.utime(existing, ns=(1_000_000_000, 1_000_000_000))
    before = listing(tmp_path)
    code, out, err = run_row(row, row.argv + ["-o", "out/existing.tsv"], capsys, monkeypatch)
    assert code == row.code and out == "" and err.count("\n") == 1 and row.message in err, err
    assert existing.read_text() == "keep me\n"
    assert listing(tmp_path) == before
