"""cli.py: `swcli align` end to end against Biopython, the options, and every error path."""

# The commands run in-process through main(argv), which returns the exit code; a few run as real
# subprocesses to check what only a process shows (startup imports, the console entry point).

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swcli.testing import (biopython_score, random_protein_pairs, read_tsv, related_protein_pairs, run_cli,
                           subprocess_env, write_fasta)

EXAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "example.fasta")


run = run_cli


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


def test_stats_say_the_runs_work_once_the_output_is_in_place(pair_files, tmp_path, capsys):
    """--stats: one line on stderr, after the output file is complete, with the cells counted exactly
    (search: every query against every database residue; align: each pair's qlen x tlen)."""
    import re

    pairs, queries, targets = pair_files
    query_residues, target_residues = sum(len(q) for q, _ in pairs), sum(len(t) for _, t in pairs)
    for command, line in (
            (["search", queries, targets, "--backend", "cpu", "-t", "0"],
             rf"swcli: {len(pairs)} queries \({query_residues:,} residues\) x {len(pairs)} sequences "
             rf"\({target_residues:,} residues\): "
             rf"{query_residues * target_residues:,} cells in [\d.]+ s, [\d,.]+ GCUPS; "
             r"scoring calls [\d.]+ s \(the op's sweep from codes\)"),
            (["align", queries, targets, "--backend", "cpu", "-q"],
             rf"swcli: {len(pairs)} pairs: {sum(len(q) * len(t) for q, t in pairs):,} cells in [\d.]+ s, "
             r"[\d,.]+ GCUPS; scoring calls [\d.]+ s")):
        out_file = tmp_path / f"{command[0]}.tsv"
        code, out, err = run([*command, "-o", str(out_file), "--stats"], capsys)
        assert code == 0 and out == "" and re.fullmatch(line + "\n", err), err
        assert len(read_tsv(out_file.read_text())) == len(pairs) * (10 if command[0] == "search" else 1) + 1  # top 10
        code, _, err = run([*command, "-o", str(out_file)], capsys)
        assert code == 0 and "cells" not in err  # said only when asked


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


# ---------------------------------------------------------------------------------------- affine gaps


@pytest.mark.parametrize("gap_open, gap_extend", [(-12, -1), (-11, -1), (-10, -2)])
def test_affine_temperature_zero_equals_biopython(capsys, gap_open, gap_extend):
    from swcli.testing import example_protein_pairs

    code, out, _ = run(["align", EXAMPLE, "-t", "0", "--gap-open", str(gap_open), "--gap-extend", str(gap_extend),
                        "--backend", "cpu"], capsys)
    rows = read_tsv(out)[1:]
    pairs = example_protein_pairs()
    assert code == 0 and len(rows) == len(pairs) == 20
    for (q, t), row in zip(pairs, rows):
        assert row[2:4] == [str(len(q)), str(len(t))]
        assert float(row[4]) == biopython_score(q, t, gap_open, gap_extend=gap_extend)


def test_affine_reference_backend_agrees_and_is_biopython_at_zero(pair_files, capsys):
    pairs, queries, targets = pair_files
    gaps = ["--gap-open", "-11", "--gap-extend", "-1"]
    _, cpu, _ = run(["align", queries, targets, "-t", "0.5", "--backend", "cpu", "--no-header"] + gaps, capsys)
    code, ref, _ = run(["align", queries, targets, "-t", "0.5", "--backend", "reference", "--no-header"] + gaps,
                       capsys)
    assert code == 0
    for a, b in zip(read_tsv(cpu), read_tsv(ref), strict=True):
        assert a[:4] == b[:4] and abs(float(a[4]) - float(b[4])) <= 1e-4 * max(1.0, abs(float(b[4])))
    _, hard, _ = run(["align", queries, targets, "-t", "0", "--backend", "reference", "--no-header"] + gaps, capsys)
    for (q, t), row in zip(pairs, read_tsv(hard), strict=True):
        assert float(row[4]) == biopython_score(q, t, -11.0, gap_extend=-1.0)


@pytest.mark.parametrize("t", ["1", "0"])
def test_equal_open_and_extend_is_the_linear_gap_byte_for_byte(pair_files, capsys, t):
    _, queries, targets = pair_files
    _, linear, _ = run(["align", queries, targets, "-t", t, "--gap", "-4"], capsys)
    _, default, _ = run(["align", queries, targets, "-t", t], capsys)
    code, affine, _ = run(["align", queries, targets, "-t", t, "--gap-open", "-4", "--gap-extend", "-4"], capsys)
    assert code == 0 and affine == linear == default


@pytest.mark.parametrize("matrix, given, explicit", [
    ("BLOSUM62", ["--gap-open", "-12"], ["--gap-open", "-12", "--gap-extend", "-1"]),
    ("BLOSUM62", ["--gap-open", "-15"], ["--gap-open", "-15", "--gap-extend", "-1"]),
    # --gap-extend alone keeps BLAST's existence cost (11 for BLOSUM62) on top of it, as blastp -gapextend 2
    ("BLOSUM62", ["--gap-extend", "-2"], ["--gap-open", "-13", "--gap-extend", "-2"]),
    ("BLOSUM45", ["--gap-open", "-20"], ["--gap-open", "-20", "--gap-extend", "-2"]),
    ("pam30", ["--gap-extend", "-1"], ["--gap-open", "-10", "--gap-extend", "-1"]),
])
def test_one_affine_option_takes_blast_default_for_the_matrix(pair_files, capsys, matrix, given, explicit):
    _, queries, targets = pair_files
    code, alone, err = run(["align", queries, targets, "-t", "0", "-m", matrix] + given, capsys)
    _, both, _ = run(["align", queries, targets, "-t", "0", "-m", matrix] + explicit, capsys)
    _, linear, _ = run(["align", queries, targets, "-t", "0", "-m", matrix], capsys)
    assert code == 0 and err == "" and alone == both and alone != linear


def test_help_states_the_gap_conventions():
    from typer.testing import CliRunner

    from swcli.commands import app

    for command in ("align", "search", "verify"):
        text = " ".join(CliRunner().invoke(app, [command, "--help"], terminal_width=400).output.split())
        assert "--gap-open -12 --gap-extend -1" in text and "MMseqs2" in text and "extend_gap_score" in text


# ---------------------------------------------------------------------------------------------- errors

# The catalogue of bad inputs through the CLI is tests/test_bad_inputs.py.


# -------------------------------------------------------------------------------------- real processes

def test_help_is_fast_and_imports_no_torch():
    script = ("import sys\nfrom swcli.cli import main\ncode = main(['align', '--help'])\n"
              "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--temperature" in result.stdout and "open_gap_score" in result.stdout


def test_a_torch_without_the_registrations_is_named_on_import_and_by_the_cli():
    """torch.library.register_vmap removed, as in a torch older than 2.5: ImportError for the library, one
    line and exit 1 for the CLI."""
    older = "import torch\ndel torch.library.register_vmap\n"
    library = subprocess.run([sys.executable, "-c", older + "import swcli.ops"], capture_output=True, text=True,
                             timeout=120, env=subprocess_env())
    assert library.returncode == 1 and library.stderr.splitlines()[-1] == (
        f"swcli.errors.TorchVersionError: swcli needs torch >= 2.5 (torch.library.register_vmap); this is torch "
        f"{torch.__version__}")
    cli = subprocess.run([sys.executable, "-c", older + f"from swcli.cli import main\nraise SystemExit(main(['align', "
                          f"{EXAMPLE!r}, '--backend', 'cpu']))"], capture_output=True, text=True, timeout=120,
                         env=subprocess_env())
    assert cli.returncode == 1 and cli.stdout == "" and cli.stderr == (
        f"swcli: error: swcli needs torch >= 2.5 (torch.library.register_vmap); this is torch {torch.__version__}\n")


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


@pytest.mark.parametrize("options, code, message", [
    (["-t", "nan"], 2, "Invalid value for '--temperature': nan is not a finite number >= 0"),
    (["-t", "-1"], 2, "Invalid value for '--temperature': -1.0 is not a finite number >= 0"),
    (["--unknown-as", "J"], 2, "--unknown-as 'J' must be one letter of the BLOSUM62 alphabet"),
    (["--unknown-as", "XX"], 2, "--unknown-as 'XX' must be one letter"),
    (["-o", ""], 1, "-o is an empty path: give it a file name, or - for stdout"),
])
def test_bad_option_values_say_what_is_wrong(tmp_path, capsys, options, code, message):
    path = write_fasta(tmp_path / "x.fa", [("a", "MKVLAWY"), ("b", "MKVLAWF")])
    got, out, err = run(["align", path, *options], capsys)
    assert got == code and out == "" and message in err and err.count("\n") == 1


def test_verify_into_a_closed_pipe_exits_141_quietly(tmp_path):
    path = write_fasta(tmp_path / "x.fa", [("a", "MKVLAWY"), ("b", "MKVLAWF")])
    result = subprocess.run(f"{sys.executable} -m swcli verify {path} --backend cpu | true; "
                            "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True,
                            text=True, timeout=300, env=subprocess_env())
    assert result.stdout == "141\n" and result.stderr == ""


@pytest.mark.parametrize("argv", [["--help"], ["search", "--help"], ["--version"], []])
def test_help_into_a_closed_pipe_exits_141_quietly(argv):
    # the reader is gone before the child starts (about 0.2 s), so its first write breaks the pipe
    child = subprocess.Popen([sys.executable, "-m", "swcli", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=subprocess_env())
    child.stdout.close()
    assert child.wait(timeout=60) == 141 and child.stderr.read() == b""


def test_closed_stdout_is_a_one_line_error(tmp_path):
    path = write_fasta(tmp_path / "x.fa", [("a", "MKVLAWY"), ("b", "MKVLAWF")])
    result = subprocess.run(f"{sys.executable} -m swcli align {path} --backend cpu >&-", shell=True,
                            capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert result.returncode == 1
    assert result.stderr == "swcli: error: standard output is closed: give -o a file to write to\n"


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


# ------------------------------------------------------------------------------ bare, --version, inputs

def test_bare_swcli_prints_the_help_and_exits_0():
    result = subprocess.run([sys.executable, "-m", "swcli"], capture_output=True, text=True, timeout=60,
                            env=subprocess_env())
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Usage: swcli ") and "align" in result.stdout and "--version" in result.stdout


def test_version_is_fast_and_imports_no_torch():
    script = ("import sys\nfrom swcli.cli import main\ncode = main(['--version'])\n"
              "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=subprocess_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == "swcli 0.1.0\n"


@pytest.mark.parametrize("case", ["missing targets", "odd count", "unequal counts", "bad letter"])
def test_no_output_at_all_before_the_inputs_are_valid(tmp_path, capsys, case):
    good = write_fasta(tmp_path / "good.fa", [("a", "MKV"), ("b", "MKW")])
    three = write_fasta(tmp_path / "three.fa", [("a", "MKV"), ("b", "MKW"), ("c", "MK")])
    argv = {"missing targets": ["align", good, str(tmp_path / "nope.fa")],
            "odd count": ["align", three],
            "unequal counts": ["align", good, three],
            "bad letter": ["align", write_fasta(tmp_path / "j.fa", [("a", "MK"), ("b", "MKJ")])]}[case]
    code, out, err = run(argv, capsys)
    assert code == 1 and err.startswith("swcli: error: ") and err.count("\n") == 1
    assert out == ""  # not even the header


def test_the_suggested_unknown_as_works_with_every_matrix(tmp_path, capsys):
    import re
    import shlex

    from Bio.Align import substitution_matrices

    path = write_fasta(tmp_path / "dna.fa", [("a", "ACGTXACGT"), ("b", "ACGTNACGA")])
    code, _, err = run(["align", path, "-m", "NUC.4.4", "-t", "0"], capsys)
    assert code == 1 and "invalid letter 'X' at position 5" in err
    suggestion = re.search(r"use (--unknown-as \S+)", err)
    assert suggestion, err
    code, out, err = run(["align", path, "-m", "NUC.4.4", "-t", "0", "--no-header", *shlex.split(suggestion[1])],
                         capsys)
    assert code == 0 and err == "", err
    nuc = substitution_matrices.load("NUC.4.4")
    assert float(read_tsv(out)[0][4]) == biopython_score("ACGTNACGT", "ACGTNACGA", -4.0, nuc)


def test_the_progress_bar_counts_input_bytes_with_a_total(tmp_path, capsys, monkeypatch):
    import tqdm

    bars = []

    class Bar:
        def __init__(self, total=None, unit="it", **options):
            self.total, self.unit, self.n, self.updates = total, unit, 0, []
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            self.n += n
            self.updates.append(self.n)

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    from swcli import commands

    monkeypatch.setattr(commands, "_progress_shown", lambda quiet: True)  # as on a terminal
    queries = write_fasta(tmp_path / "q.fa", [(f"q{k}", "MKVLAWYPGH" * (k % 7 + 1)) for k in range(60)])
    targets = write_fasta(tmp_path / "t.fa.gz", [(f"t{k}", "MKWLAHYPGV" * (k % 5 + 1)) for k in range(60)],
                          compress=True)
    code, _, _ = run(["align", queries, targets, "--chunk-size", "7"], capsys)
    size = os.path.getsize(queries) + os.path.getsize(targets)
    assert code == 0 and len(bars) == 1
    bar = bars[0]
    assert bar.unit == "B" and bar.total == size and bar.n == size
    assert bar.updates == sorted(bar.updates) and len(bar.updates) > 2 and "60 pairs" in bar.postfix


def test_input_bytes_follow_the_open_file(tmp_path):
    from swcli.commands import InputBytes
    from swcli.fasta import read_blocks

    path = write_fasta(tmp_path / "x.fa", [(f"r{k}", "MKVLAWYPGH" * 200) for k in range(200)])
    measure = InputBytes.of([path])
    assert measure.total == os.path.getsize(path) and measure.done() == 0
    blocks = read_blocks(path, block_bytes=1 << 15)
    next(blocks)
    first = measure.done()
    for _ in range(6):
        next(blocks)
    assert 0 < first < measure.done() < measure.total
    assert InputBytes.of(["-"]) is None and InputBytes.of([path, "/dev/null"]) is None


# ---------------------------------------------------------------------------------- -o through the CLI

@pytest.mark.parametrize("case", ["align's queries", "align's targets", "search's database through a link",
                                  "a matrix file"])
def test_output_onto_an_input_is_refused_and_the_input_kept(tmp_path, capsys, case):
    queries = write_fasta(tmp_path / "q.fa", [("a", "MKVL"), ("b", "MKWL")])
    targets = write_fasta(tmp_path / "t.fa", [("c", "MKVLA"), ("d", "MKWLA")])
    matrix = tmp_path / "m.txt"
    matrix.write_text("   A  B\nA  1 -1\nB -1  1\n")
    (tmp_path / "link.fa").symlink_to(targets)
    argv, name, kept = {
        "align's queries": (["align", queries, "-o", queries], "QUERIES", queries),
        "align's targets": (["align", queries, targets, "-o", targets], "TARGETS", targets),
        "search's database through a link": (["search", queries, targets, "-o", str(tmp_path / "link.fa")],
                                             "DATABASE", targets),
        "a matrix file": (["align", queries, "-m", str(matrix), "-o", str(matrix)], "--matrix", str(matrix)),
    }[case]
    before = Path(kept).read_bytes()
    code, out, err = run(argv, capsys)
    assert code == 1 and out == ""
    assert err == f"swcli: error: {argv[-1]}: -o is the same file as {name}; the output would replace it\n"
    assert Path(kept).read_bytes() == before


def test_output_to_a_fifo_and_to_dev_null(tmp_path, capsys):
    import stat
    import threading

    path = write_fasta(tmp_path / "x.fa", [("a", "MKVL"), ("b", "MKWL")])
    _, expected, _ = run(["align", path], capsys)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    thread = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    thread.start()
    code, out, err = run(["align", path, "-o", str(fifo)], capsys)
    thread.join(timeout=10)
    assert code == 0 and out == "" and err == "" and received == [expected]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    code, _, _ = run(["align", path, "-o", "/dev/null"], capsys)
    assert code == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ------------------------------------------------------------------------ signals, in real processes

def slow_input(tmp_path, length=120_000, pairs=1):
    """Pairs that take seconds to score on the CPU (120,000 x 120,000 at t = 1: about 5 s on two cores;
    the engine sweeps a long pair at a few GCUPS)."""
    import random

    rng = random.Random(7)
    records = [(f"s{k}", "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(length)))
               for k in range(2 * pairs)]
    return write_fasta(tmp_path / f"slow{length}.fa", records)


@pytest.fixture(scope="module")
def engine_built():
    """The CPU engine and the host library in the cache first: a signal test must not land in (and
    leave) a first compile."""
    from swcli import _host
    from swcli.ops import prepare_backend

    prepare_backend("cpu")
    _host.load()


def start(argv, tmp_path):
    """`swcli align ...` in a real process, on the CPU engine: the slow pairs are sized for it (a GPU
    would score them in another time, in kernels that a signal does not cut short)."""
    return subprocess.Popen([sys.executable, "-m", "swcli", *argv, "--backend", "cpu"], env=subprocess_env(),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_temporary(folder, proc, limit=120):
    """Wait until the run has its temporary output file (imports and engine done, scoring begun)."""
    import time

    deadline = time.monotonic() + limit
    while not any(name.endswith(".part") for name in os.listdir(folder)):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be interrupted"
        time.sleep(0.02)


def handler_ready_seconds():
    """An upper bound on how long a new `python -m swcli` takes to install its signal handler: a process
    that starts the interpreter and imports swcli.cli (whose main installs the handler before anything
    else), and ends. A signal before that lands in the interpreter's own start, which no program catches."""
    import time

    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import swcli.cli"], check=True, env=subprocess_env())
    return time.monotonic() - started


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay", [0.05, 0.3, 0.7, 1.0, 1.5])
def test_an_early_signal_is_never_lost(tmp_path, engine_built, signal_name, delay):
    """Whenever the signal lands (imports, the engine load, reading, scoring): 130, one line, no
    traceback, the existing file byte for byte, nothing left beside it."""
    import signal
    import time

    if delay < 0.1 and handler_ready_seconds() > 0.5 * delay:  # half: a process's start varies from run to run
        pytest.skip("this machine starts Python too slowly: the signal would land before swcli's handler")
    path = slow_input(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    existing = out / "result.tsv"
    existing.write_bytes(b"old\tcontent\n" * 100)
    proc = start(["align", path, "-o", str(existing)], tmp_path)
    time.sleep(delay)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(getattr(signal, signal_name))
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr == "swcli: interrupted\n" and stdout == ""
    assert existing.read_bytes() == b"old\tcontent\n" * 100 and os.listdir(out) == ["result.tsv"]


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_does_not_wait_for_a_long_engine_call(tmp_path, engine_built, signal_name):
    """One 200,000 x 200,000 pair takes more than 10 s on this machine's CPU, in one engine call."""
    import signal
    import time

    path = slow_input(tmp_path, 200_000)
    out = tmp_path / "out"
    out.mkdir()
    existing = out / "result.tsv"
    existing.write_text("old\n")
    proc = start(["align", path, "-o", str(existing)], tmp_path)
    wait_for_temporary(out, proc)
    time.sleep(0.5)  # inside the engine call
    sent = time.monotonic()
    proc.send_signal(getattr(signal, signal_name))
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 2.0
    assert proc.returncode == 130 and stderr == "swcli: interrupted\n"
    assert existing.read_text() == "old\n" and os.listdir(out) == ["result.tsv"]


def test_an_error_does_not_wait_for_a_long_engine_call(tmp_path, engine_built):
    import time

    big = Path(slow_input(tmp_path, 200_000)).read_text()
    path = tmp_path / "late.fa"
    path.write_text(big + ">x\nMKV1\n>y\nMK\n")
    started = time.monotonic()
    proc = start(["align", str(path), "--chunk-size", "1", "-o", "out.tsv"], tmp_path)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "record 3 (x): invalid letter '1'" in stderr
    assert time.monotonic() - started < 6.0  # the call on the first pair takes more than 10 s
    assert sorted(os.listdir(tmp_path)) == ["late.fa", "slow200000.fa"]


def test_a_killed_run_leaves_a_temporary_that_the_next_run_removes(tmp_path, engine_built):
    import signal

    path = slow_input(tmp_path, 100_000)
    out = tmp_path / "out"
    out.mkdir()
    proc = start(["align", path, "-o", str(out / "result.tsv")], tmp_path)
    wait_for_temporary(out, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    left = os.listdir(out)
    assert len(left) == 1 and left[0].startswith(".result.tsv.swcli-") and left[0].endswith(f"-{proc.pid}.part")
    small = write_fasta(tmp_path / "x.fa", [("a", "MK"), ("b", "MK")])
    again = start(["align", small, "-o", str(out / "result.tsv")], tmp_path)
    again.communicate(timeout=120)
    assert again.returncode == 0 and os.listdir(out) == ["result.tsv"]


@pytest.mark.parametrize("doc", ["README.md", "docs/usage.md"])
def test_the_tsv_examples_in_the_docs_are_what_the_program_prints(capsys, doc):
    text = (Path(EXAMPLE).parent.parent / doc).read_text()
    blocks = [b for b in text.split("```") if b.lstrip("\n").startswith("query\ttarget")]
    assert blocks, f"{doc} shows no TSV"
    _, out, _ = run(["align", EXAMPLE], capsys)
    printed = out.splitlines()
    for block in blocks:
        lines = block.strip("\n").splitlines()
        assert lines == printed[: len(lines)], doc


def test_rows_on_stdout_stay_whole_when_interrupted(tmp_path, engine_built):
    import signal

    path = write_fasta(tmp_path / "x.fa", [(f"r{k}", "MKVLAWYPGHE" * 60) for k in range(6000)])
    proc = start(["align", path, "--chunk-size", "64"], tmp_path)
    first = [proc.stdout.readline() for _ in range(3)]  # rows are coming
    proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=60)
    lines = "".join(first) + rest
    assert proc.returncode == 130 and stderr == "swcli: interrupted\n"
    assert lines.endswith("\n") and len(lines.splitlines()) < 6001
    assert all(len(line.split("\t")) == 5 for line in lines.splitlines())


def test_a_signal_in_a_protected_section_waits_for_its_end(tmp_path, monkeypatch):
    """The handler itself, without a real signal: os._exit replaced by an exception."""
    from swcli import interrupt

    class Exited(BaseException):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(interrupt, "_received", None)
    temporary = tmp_path / ".out.tsv.swcli-host-1.part"
    temporary.write_text("partial\n")
    interrupt.register_temporary(str(temporary))
    try:
        with pytest.raises(Exited) as exited:
            with interrupt.protected():
                interrupt._handler(2, None)  # recorded; the section goes on
                assert temporary.exists() and interrupt.received() == 2
                (tmp_path / "done").write_text("the section ran to its end\n")
        assert exited.value.args == (130,)
        assert (tmp_path / "done").exists() and not temporary.exists()
        with pytest.raises(Exited):  # outside a section: at once
            interrupt._handler(15, None)
    finally:
        interrupt.unregister_temporary(str(temporary))


def _closed(fd: int) -> str:
    """The shell's redirection that closes descriptor fd for a command (subprocess cannot start a child
    with one of the three closed)."""
    return {0: "<&-", 1: ">&-", 2: "2>&-"}[fd]


def _run_closed(args, fd: int, tmp_path):
    """`python -m swcli ARGS` with descriptor fd closed: (exit code, stdout, stderr) as files caught them."""
    quoted = " ".join(f"'{a}'" for a in args)
    script = f"'{sys.executable}' -m swcli {quoted} {_closed(fd)}"
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    if fd != 1:
        script += f" >{out}"
    if fd != 2:
        script += f" 2>{err}"
    done = subprocess.run(["sh", "-c", script], env=subprocess_env(), timeout=300, cwd=tmp_path)
    read = lambda path: path.read_text() if path.exists() else ""  # noqa: E731
    return done.returncode, read(out), read(err)


def test_closed_standard_streams(tmp_path):
    path = write_fasta(tmp_path / "x.fa", [("a", "ACDEFG"), ("b", "ACDEF")])
    # stderr closed: the run does its work, its messages go nowhere
    code, out, _ = _run_closed(["align", path, "--backend", "cpu"], 2, tmp_path)
    assert code == 0 and out.splitlines()[1].startswith("a\tb\t6\t5\t"), out
    # stdin closed and read as '-': one line
    code, out, err = _run_closed(["align", "-", "--backend", "cpu"], 0, tmp_path)
    assert (code, out, err) == (1, "", "swcli: error: <stdin>: standard input is closed; give a file\n")
    # stdout closed: verify says so before its work
    code, _, err = _run_closed(["verify", path, "--backend", "cpu", "--sample", "1"], 1, tmp_path)
    assert (code, err) == (1, "swcli: error: standard output is closed: nowhere to write the report\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args", [["--version"], ["align", "--help"], ["verify", "{path}", "--backend", "cpu",
                                                                        "--sample", "1", "--quiet"]],
                         ids=["version", "help", "verify"])
def test_a_full_stdout_is_one_line(tmp_path, args):
    path = write_fasta(tmp_path / "x.fa", [("a", "ACDEFG"), ("b", "ACDEF")])
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "swcli", *(a.format(path=path) for a in args)],
                              env=subprocess_env(), timeout=300, stdout=full, stderr=subprocess.PIPE, text=True)
    assert (done.returncode, done.stderr) == (
        1, "swcli: error: stdout: cannot write output (No space left on device)\n")


def test_bench_refuses_an_empty_fasta_path(capsys):
    code, out, err = run(["bench", "--backend", "cpu", "--fasta", "", "--pairs", "1", "--repeats", "1"], capsys)
    assert (code, out, err) == (1, "", "swcli: error: an empty path was given for a FASTA file\n")


def test_a_temperature_under_float32s_normal_range_is_a_usage_error(tmp_path, capsys):
    path = write_fasta(tmp_path / "x.fa", [("a", "ACDEFG"), ("b", "ACDEF")])
    for t in ("1e-38", "5e-324"):
        code, out, err = run(["align", path, "-t", t, "--backend", "reference"], capsys)
        assert code == 2 and out == "" and "at least float32's smallest normal number" in err, err
    code, out, _ = run(["align", path, "-t", "2e-38", "--backend", "cpu", "--quiet"], capsys)
    assert code == 0 and out.count("\n") == 2


def test_a_bad_output_path_is_said_before_the_inputs_are_read(tmp_path, capsys):
    bad = write_fasta(tmp_path / "bad.fa", [("a", "ACJD"), ("b", "ACD")])
    target = str(tmp_path / "missing" / "out.tsv")
    for args in (["align", bad], ["search", bad, bad]):
        code, out, err = run([*args, "--backend", "cpu", "-o", target], capsys)
        assert code == 1 and out == "" and err == (
            f"swcli: error: {target}: cannot write output, directory {tmp_path / 'missing'} does not exist\n"), err
