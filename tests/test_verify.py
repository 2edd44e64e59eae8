"""verify.py and `swcli verify`: sampling, the report, and exit 1 when the backend is off."""

import re
from pathlib import Path

import swcli.pipeline
from swcli.cli import main
from swcli.fasta import FastaRecord
from swcli.verify import sample_pairs
from swcli.testing import write_fasta

EXAMPLE = str(Path(__file__).resolve().parent.parent / "data" / "example.fasta")


def fake_pairs(lengths):
    return [(FastaRecord("x", k, f"q{k}", "A" * n), FastaRecord("x", k, f"t{k}", "A")) for k, n in
            enumerate(lengths)]


def test_sample_is_uniform_ordered_and_reproducible():
    pairs = fake_pairs([1] * 1000)
    chosen, total, eligible = sample_pairs(iter(pairs), 10, seed=4)
    numbers = [n for n, _ in chosen]
    assert total == eligible == 1000 and len(chosen) == 10 and numbers == sorted(numbers)
    assert [pair for _, pair in chosen] == [pairs[n - 1] for n in numbers]
    assert sample_pairs(iter(pairs), 10, seed=4) == (chosen, total, eligible)
    assert sample_pairs(iter(pairs), 10, seed=5) != (chosen, total, eligible)
    everything, total, _ = sample_pairs(iter(pairs[:3]), 10, seed=0)
    assert [n for n, _ in everything] == [1, 2, 3] and total == 3
    # Uniform: over many seeds, early and late pairs are drawn alike.
    counts = [0, 0]
    for seed in range(300):
        for n, _ in sample_pairs(iter(pairs[:100]), 5, seed)[0]:
            counts[n > 50] += 1
    assert abs(counts[0] - counts[1]) < 0.15 * sum(counts)


def test_sample_skips_pairs_over_the_cell_limit():
    pairs = fake_pairs([5, 50, 7, 500, 9])
    chosen, total, eligible = sample_pairs(iter(pairs), 10, seed=0, max_cells=10)
    assert [n for n, _ in chosen] == [1, 3, 5] and total == 5 and eligible == 3


def test_verify_passes_on_the_cpu_engine(capsys):
    code = main(["verify", EXAMPLE, "--sample", "3", "--quiet", "-t", "1", "--backend", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "checked 3 of 20 pairs (20 within --max-cells 250000): backend cpu" in out
    assert "OK: tolerance 0.0001" in out
    assert "largest absolute difference" in out and "largest relative difference" in out
    # the scores as numbers (the engine's as the TSV writes it), not as numpy's reprs
    assert "np." not in out and re.search(r"\): -?[0-9.]+ vs reference -?[0-9.]+\n", out)


def test_verify_names_the_gaps_and_checks_affine_gaps_against_the_affine_loop(capsys):
    code = main(["verify", EXAMPLE, "--sample", "3", "--quiet", "-t", "0", "--backend", "cpu", "--max-cells", "20000"])
    assert code == 0 and "against the reference loop in float64, linear gap -4\n" in capsys.readouterr().out
    for t in ("0", "1"):
        code = main(["verify", EXAMPLE, "--sample", "3", "--quiet", "-t", t, "--backend", "cpu", "--max-cells",
                     "20000", "--gap-open", "-12", "--gap-extend", "-1"])
        out = capsys.readouterr().out
        assert code == 0 and "OK: tolerance 0.0001" in out
        assert "against the reference loop in float64, affine gaps: open -12, extend -1\n" in out
    # --gap-extend alone: BLAST's existence cost 11 for BLOSUM62 on top of it
    assert main(["verify", EXAMPLE, "--sample", "2", "--quiet", "--backend", "cpu", "--max-cells", "20000",
                 "--gap-extend", "-2"]) == 0
    assert "affine gaps: open -13, extend -2" in capsys.readouterr().out


class _Bar:
    """A progress bar that shows nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        pass


def test_verify_compares_affine_scores_with_the_affine_reference(monkeypatch):
    """Both sides get the run's gaps: the reference side is the affine loop, in float64."""
    import torch

    from swcli import verify
    from swcli.fasta import read_fasta
    from swcli.pipeline import Settings
    from swcli.scoring import load_matrix

    seen = []
    real = swcli.pipeline.score_checked_codes

    def recording(*args, **kwargs):
        seen.append((args[7], args[2].dtype, kwargs.get("gap_open"), kwargs.get("gap_extend")))
        return real(*args, **kwargs)

    monkeypatch.setattr(swcli.pipeline, "score_checked_codes", recording)
    records = list(read_fasta(EXAMPLE))
    pairs = list(zip(records[0::2], records[1::2]))
    settings = Settings(load_matrix("BLOSUM62"), None, 0.0, "cpu", gap_open=-12.0, gap_extend=-1.0)
    report = verify.verify_pairs(iter(pairs), settings, 2, 0, 20_000, lambda total: _Bar())
    assert report.worst_relative == 0.0 and report.gaps == "affine gaps: open -12, extend -1"
    assert ("cpu", torch.float32, -12.0, -1.0) in seen and ("reference", torch.float64, -12.0, -1.0) in seen


def test_verify_fails_when_the_backend_is_off(tmp_path, capsys, monkeypatch):
    real = swcli.pipeline.score_checked_codes

    def off_by_a_little(*args, **kwargs):
        scores = real(*args, **kwargs)
        backend = args[7] if len(args) > 7 else kwargs.get("backend")
        return scores if backend == "reference" else scores + 0.01

    monkeypatch.setattr(swcli.pipeline, "score_checked_codes", off_by_a_little)
    path = write_fasta(tmp_path / "x.fa", [("a", "MKVLAW"), ("b", "MKVIAW"), ("c", "WWPP"), ("d", "WWPA")])
    code = main(["verify", path, "--quiet", "-t", "0"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out and "pair 1 (a vs b" in out
    assert main(["verify", path, "--quiet", "-t", "0", "--tolerance", "0.1"]) == 0


def test_verify_refuses_when_no_pair_fits_the_limit(tmp_path, capsys):
    path = write_fasta(tmp_path / "x.fa", [("a", "MKVLAW"), ("b", "MKVIAW")])
    assert main(["verify", path, "--quiet", "--max-cells", "10"]) == 1
    assert "none of the 1 pairs has at most 10 cells" in capsys.readouterr().err


def test_verify_checks_the_letters_of_pairs_it_does_not_sample(tmp_path, capsys):
    # one pair sampled of two: the other's bad letter is still an error, as align's
    path = write_fasta(tmp_path / "x.fa", [("a", "ACDEFG"), ("b", "ACDEF"), ("c", "ACJD"), ("d", "ACD")])
    for extra in ([], ["--all-vs-all"]):
        assert main(["verify", path, "--quiet", "--backend", "cpu", "-t", "0", "--sample", "1", *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"swcli: error: {path}: record 3 (c): invalid letter 'J' at position 3 (not in the "
                       "BLOSUM62 alphabet ARNDCQEGHILKMFPSTWYVBZX*; use --unknown-as X to score unknown letters "
                       "as X)"), err
    # and the pairs over --max-cells, which the sample skips
    long = write_fasta(tmp_path / "y.fa", [("a", "ACD"), ("b", "ACD"), ("c", "ACDEFGHIK"), ("d", "ACJDEFGHI")])
    assert main(["verify", long, "--quiet", "--backend", "cpu", "-t", "0", "--max-cells", "20"]) == 1
    assert "record 4 (d): invalid letter 'J'" in capsys.readouterr().err
    assert main(["verify", long, "--quiet", "--backend", "cpu", "-t", "0", "--max-cells", "20",
                 "--unknown-as", "X"]) == 0
