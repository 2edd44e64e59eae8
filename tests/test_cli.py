"""cli.py: `swcli align` end to end against Biopython, the options, and every error path."""

# The commands run in-process through main(argv), which returns the exit code; a few run as real
# subprocesses to check what only a process shows (startup imports, the console entry point).

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swcli.cli import main
from swcli.testing import biopython_score, random_protein_pairs, read_tsv, related_protein_pairs, write_fasta

EXAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "example.fasta")


def subprocess_env() -> dict:
    """The environment for `python -m swcli` in a child: this checkout first, the caller's path kept."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH", "")])}


def run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def pair_files(tmp_path):
    pairs = related_protein_pairs(11, 6, 5, 80) + random_protein_pairs(12, 6, 1, 60)
    queries = write_fasta(tmp_path / "q.fa", [(f"q{k}", q) for k, (q, _) in enumerate(pairs)])
    targets = write_fasta(tmp_path / "t.fa", [(f"t{k}", t) for k, (_, t) in enumerate(pairs)])
    return pairs, queries, targets


def test_example_data(capsys):
    code, out, err = run(["align", EXAMPLE, "--quiet"], capsys)
    rows = read_tsv(out)
    assert code == 0 and err == ""
    assert rows[0] == ["query", "target", "qlen", "tlen", "score"]
    assert len(rows) == 21
    assert rows[1][:4] == ["tr|A7TBS3|A7TBS3_NEMVE", "tr|H6QJ35|H6QJ35_RICMA", "57", "361"]
    assert all(float(r[4]) > 0 for r in rows[1:])


@pytest.mark.parametrize("gap, matrix", [(-4.0, "BLOSUM62"), (-1.0, "BLOSUM62"), (-2.0, "BLOSUM45")])
def test_temperature_zero_equals_biopython(pair_files, capsys, gap, matrix):
    from Bio.Align import substitution_matrices

    pairs, queries, targets = pair_files
    code, out, _ = run(["align", queries, targets, "-t", "0", "--gap", str(gap), "-m", matrix], capsys)
    rows = read_tsv(out)[1:]
    assert code == 0 and len(rows) == len(pairs)
    bio = substitution_matrices.load(matrix)
    for k, ((q, t), row) in enumerate(zip(pairs, rows)):
        assert row[:4] == [f"q{k}", f"t{k}", str(len(q)), str(len(t))]
        assert float(row[4]) == biopython_score(q, t, gap, bio)


def test_soft_scores_match_the_library(pair_files, capsys):
    from swcli import soft_smith_waterman
    from swcli.testing import score_matrices

    pairs, queries, targets = pair_files
    _, out, _ = run(["align", queries, targets, "-t", "0.5", "--gap", "-3"], capsys)
    S, qlen, tlen = score_matrices(pairs)
    expected = soft_smith_waterman(S, -3.0, 0.5, qlen, tlen, backend="reference")
    got = torch.tensor([float(r[4]) for r in read_tsv(out)[1:]], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_order_is_input_order_whatever_the_chunk_size(pair_files, capsys):
    _, queries, targets = pair_files
    _, whole, _ = run(["align", queries, targets], capsys)
    _, chunked, _ = run(["align", queries, targets, "--chunk-size", "3"], capsys)
    assert whole == chunked


def test_single_file_pairs_and_all_vs_all(tmp_path, capsys):
    path = write_fasta(tmp_path / "x.fa", [("a", "MKV"), ("b", "MKW"), ("c", "WWW"), ("d", "MKVW")])
    _, out, _ = run(["align", path, "--no-header"], capsys)
    assert [r[:2] for r in read_tsv(out)] == [["a", "b"], ["c", "d"]]
    _, out, _ = run(["align", path, "--all-vs-all", "--no-header"], capsys)
    assert len(read_tsv(out)) == 16
    other = write_fasta(tmp_path / "y.fa", [("y1", "MK"), ("y2", "VV")])
    _, out, _ = run(["align", path, other, "--all-vs-all", "--no-header"], capsys)
    assert [r[:2] for r in read_tsv(out)][:3] == [["a", "y1"], ["a", "y2"], ["b", "y1"]]


def test_gzip_stdin_and_output_file(tmp_path, capsys, monkeypatch):
    import io

    path = write_fasta(tmp_path / "x.fa.gz", [("a", "MKVL"), ("b", "MKWL")], compress=True)
    _, from_file, _ = run(["align", path], capsys)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(Path(path).read_bytes()))))
    out_path = tmp_path / "out.tsv"
    code, out, _ = run(["align", "-", "-o", str(out_path)], capsys)
    assert code == 0 and out == "" and out_path.read_text() == from_file


def test_unknown_as_and_lowercase(tmp_path, capsys):
    path = write_fasta(tmp_path / "x.fa", [("a", "mkvJl"), ("b", "MKVXL")])
    code, out, _ = run(["align", path, "-t", "0", "--unknown-as", "X", "--no-header"], capsys)
    from Bio.Align import substitution_matrices

    assert code == 0
    assert float(read_tsv(out)[0][4]) == biopython_score("MKVXL", "MKVXL", -4.0,
                                                         substitution_matrices.load("BLOSUM62"))


def test_reference_backend_agrees(pair_files, capsys):
    _, queries, targets = pair_files
    _, cpu, _ = run(["align", queries, targets, "--backend", "cpu", "--no-header"], capsys)
    _, ref, _ = run(["align", queries, targets, "--backend", "reference", "--no-header"], capsys)
    for a, b in zip(read_tsv(cpu), read_tsv(ref)):
        assert a[:4] == b[:4] and abs(float(a[4]) - float(b[4])) <= 1e-4 * max(1.0, abs(float(b[4])))


# ---------------------------------------------------------------------------------------------- errors

def bad_inputs(tmp_path):
    good = write_fasta(tmp_path / "good.fa", [("a", "MKV"), ("b", "MKW")])
    three = write_fasta(tmp_path / "three.fa", [("a", "MKV"), ("b", "MKW"), ("c", "MK")])
    empty = tmp_path / "empty.fa"
    empty.write_text("")
    fastq = tmp_path / "reads.fq"
    fastq.write_text("@r1\nACGT\n+\nIIII\n")
    return {
        "missing file": (["align", str(tmp_path / "nope.fa")], 1, "nope.fa: no such file"),
        "directory": (["align", str(tmp_path)], 1, "is a directory"),
        "empty file": (["align", str(empty)], 1, "empty.fa: empty file"),
        "fastq": (["align", str(fastq)], 1, "reads.fq: line 1: expected a FASTA header"),
        "empty sequence": (["align", write_fasta(tmp_path / "e.fa", [("a", "MK"), ("b", "")])], 1,
                           r"e.fa: record 2 \(b\): empty sequence"),
        "invalid letter": (["align", write_fasta(tmp_path / "j.fa", [("a", "MK"), ("b", "MKJV")])], 1,
                           r"j.fa: record 2 \(b\): invalid letter 'J' at position 3"),
        "unequal counts": (["align", three, good], 1, "unequal record counts"),
        "odd count": (["align", three], 1, r"odd number of records \(3\)"),
        "unknown matrix": (["align", good, "-m", "BLOSUM99"], 1, "unknown matrix 'BLOSUM99'.*BLOSUM62, BLOSUM80"),
        "negative temperature": (["align", good, "-t", "-1"], 2, "--temperature"),
        "positive gap": (["align", good, "--gap", "4"], 2, "--gap"),
        "unknown option": (["align", good, "--frobnicate"], 2, "No such option"),
        "stdin twice": (["align", "-", "-"], 1, "stdin"),
        "bad unknown-as": (["align", good, "--unknown-as", "J"], 1, "--unknown-as 'J'"),
    }


ERROR_CASES = ["missing file", "directory", "empty file", "fastq", "empty sequence", "invalid letter",
               "unequal counts", "odd count", "unknown matrix", "negative temperature", "positive gap",
               "unknown option", "stdin twice", "bad unknown-as"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_error_paths(tmp_path, capsys, case):
    cases = bad_inputs(tmp_path)
    assert sorted(cases) == sorted(ERROR_CASES)
    argv, expected_code, message = cases[case]
    out_path = tmp_path / "out" / "result.tsv"
    out_path.parent.mkdir()
    code, out, err = run(argv + ["-o", str(out_path)], capsys)
    assert code == expected_code
    assert err.count("\n") == 1 and err.startswith("swcli: ")
    assert __import__("re").search(message, err), err
    assert "Traceback" not in err and out == ""
    assert list(out_path.parent.iterdir()) == []


def test_error_after_output_started_leaves_no_file(tmp_path, capsys):
    records = [(f"r{k}", "MKVLA") for k in range(9)] + [("bad", "MKV1"), ("r9", "MK")]
    path = write_fasta(tmp_path / "x.fa", records)
    out_path = tmp_path / "result.tsv"
    code, _, err = run(["align", path, "--chunk-size", "1", "-o", str(out_path)], capsys)
    assert code == 1 and "record 10 (bad): invalid letter '1' at position 4" in err
    assert list(tmp_path.iterdir()) == [Path(path)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_backend_without_gpu(tmp_path, capsys):
    path = write_fasta(tmp_path / "x.fa", [("a", "MK"), ("b", "MK")])
    code, _, err = run(["align", path, "--backend", "cuda"], capsys)
    assert code == 1 and "no CUDA device" in err


# -------------------------------------------------------------------------------------- real processes

def test_help_is_fast_and_imports_no_torch():
    script = ("import sys\nfrom swcli.cli import main\ncode = main(['align', '--help'])\n"
              "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--temperature" in result.stdout and "open_gap_score" in result.stdout


def test_module_entry_point_exit_codes(tmp_path):
    env = subprocess_env()
    ok = subprocess.run([sys.executable, "-m", "swcli", "align", EXAMPLE, "-t", "0"], capture_output=True,
                        text=True, timeout=300, env=env)
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 21
    missing = subprocess.run([sys.executable, "-m", "swcli", "align", str(tmp_path / "x.fa")],
                             capture_output=True, text=True, timeout=300, env=env)
    assert missing.returncode == 1 and missing.stderr.strip().endswith("no such file")
    usage = subprocess.run([sys.executable, "-m", "swcli", "align"], capture_output=True, text=True,
                           timeout=300, env=env)
    assert usage.returncode == 2 and "usage error" in usage.stderr


def test_broken_pipe_is_quiet(tmp_path):
    path = write_fasta(tmp_path / "x.fa", [(f"r{k}", "MKVLAWY" * 3) for k in range(4000)])
    env = subprocess_env()
    result = subprocess.run(f"{sys.executable} -m swcli align {path} -t 0 | head -1", shell=True,
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.stdout == "query\ttarget\tqlen\ttlen\tscore\n"
    assert result.stderr == ""


def test_engine_build_failure_is_one_line_before_any_output(tmp_path, capsys, monkeypatch):
    import swcli._build
    import swcli.ops

    def no_compiler():
        raise swcli._build.BuildError("no C++ compiler found (looked for 'c++'; set CXX or install g++)")

    monkeypatch.setattr(swcli._build, "cpu_engine", no_compiler)
    monkeypatch.setattr(swcli.ops, "_loaded", set())  # as in a new process: no engine loaded yet
    path = write_fasta(tmp_path / "x.fa", [("a", "MK"), ("b", "MK")])
    code, out, err = run(["align", path, "--backend", "cpu"], capsys)
    assert code == 1 and out == ""
    assert err == "swcli: error: no C++ compiler found (looked for 'c++'; set CXX or install g++)\n"


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_interrupted_run_leaves_no_file(tmp_path, signal_name):
    import signal
    import time

    path = write_fasta(tmp_path / "x.fa", [(f"r{k}", "MKVLAWYPGHE" * 40) for k in range(40000)])
    out_path = tmp_path / "out" / "result.tsv"
    out_path.parent.mkdir()
    env = subprocess_env()
    proc = subprocess.Popen([sys.executable, "-m", "swcli", "align", path, "-o", str(out_path),
                             "--chunk-size", "256"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out_path.parent.iterdir()) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # wait until the output is being written
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(getattr(signal, signal_name))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "swcli: interrupted" in err and "Traceback" not in err
    assert list(out_path.parent.iterdir()) == []
