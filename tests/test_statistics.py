"""Karlin-Altschul statistics (swcli/statistics.py): the fit, the estimate, the regime check, the cache.
The 100,000-pair calibration is benchmarks/statistics_calibration.py's, with its record in
docs/benchmarks/statistics.md; these are the cheap checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swcli import statistics
from swcli.errors import SwcliError
from swcli.pipeline import Settings
from swcli.scoring import load_matrix
from swcli.testing import run_cli as cli
from swcli.testing import write_fasta

MATRIX = load_matrix("BLOSUM62")


def settings(**gaps) -> Settings:
    return Settings(MATRIX, backend="cpu", **gaps)


def test_the_fit_recovers_a_gumbel_law():
    rng = np.random.default_rng(3)
    m, n = rng.integers(50, 2000, 20000), rng.integers(50, 2000, 20000)
    lam, k = 0.3, 0.05
    scores = (np.log(k * m * n) - np.log(-np.log(rng.uniform(size=m.size)))) / lam  # P(S >= s) as in the docstring
    fitted_lambda, fitted_k = statistics.fit_gumbel(scores, m, n)
    assert fitted_lambda == pytest.approx(lam, rel=0.03)
    assert fitted_k == pytest.approx(k, rel=0.15)


def test_estimate_for_blast_gaps_is_near_the_published_values():
    found = statistics.estimate(settings(gap=None, gap_open=-12.0, gap_extend=-1.0, temperature=0.0), 1500)
    assert found.lambda_ == pytest.approx(0.267, rel=0.1)
    assert found.k == pytest.approx(0.041, rel=0.6)


def test_scores_growing_with_length_are_refused():
    with pytest.raises(SwcliError, match="E-values are not defined for BLOSUM62, linear gap -4, t = 0"):
        statistics.estimate(settings(gap=-4.0, temperature=0.0), 500)


def test_evalues_and_bits_follow_the_formulas():
    ka = statistics.KarlinAltschul(0.25, 0.04, "given")
    assert ka.evalues([40.0], [100], [300], 7)[0] == pytest.approx(7 * 0.04 * 100 * 300 * math.exp(-10))
    assert ka.bits([40.0])[0] == pytest.approx((10 - math.log(0.04)) / math.log(2))


def test_background_of_protein_and_nucleotide_matrices():
    codes, frequencies = statistics.background(MATRIX)
    assert len(codes) == 20 and frequencies.sum() == pytest.approx(1)
    codes, frequencies = statistics.background(load_matrix("NUC.4.4"))
    assert "".join(load_matrix("NUC.4.4").alphabet[c] for c in codes) == "ACGT"
    assert statistics.lattice_step(MATRIX, -12, -1, 0.0) == 1 and statistics.lattice_step(MATRIX, -12, -1, 1.0) == 0


def test_estimates_are_cached_per_setting(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: tmp_path / f"{s.temperature}.json")
    affine = settings(gap=None, gap_open=-12.0, gap_extend=-1.0, temperature=0.0)
    first = statistics.parameters(affine, count=300)
    assert "estimating Karlin-Altschul lambda and K" in capsys.readouterr().err
    again = statistics.parameters(affine, count=300)
    assert capsys.readouterr().err == "" and (again.lambda_, again.k) == (first.lambda_, first.k)
    assert "cached" in again.source
    assert statistics.parameters(affine, 0.3, 0.05) == statistics.KarlinAltschul(0.3, 0.05, "given")


def test_cli_refuses_evalues_where_they_do_not_hold(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: tmp_path / "cache.json")
    monkeypatch.setattr(statistics, "ESTIMATION_PAIRS", 400)
    fasta = write_fasta(tmp_path / "p.fa", [("a", "MKVLA"), ("b", "MKVLA")])
    out = tmp_path / "out.tsv"
    code, stdout, err = cli(["align", fasta, "--gap", "-4", "--format-output", "query,evalue", "-o", str(out),
                             "--backend", "cpu"], capsys)
    assert code == 1 and "E-values are not defined" in err and not out.exists()
    code, stdout, err = cli(["align", fasta, "--gap", "-4", "--format-output", "query,evalue", "--lambda", "0.2",
                             "--k", "0.01", "--backend", "cpu"], capsys)
    assert code == 0 and "lambda 0.2, K 0.01 (given)" in err
