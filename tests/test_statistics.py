"""Karlin-Altschul statistics (swcli/statistics.py): the fit, the estimate, the regime check, the cache.
The 100,000-pair calibration is benchmarks/statistics_calibration.py's, with its record in
docs/benchmarks/statistics.md; these are the cheap checks."""

from __future__ import annotations

import json
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
    """BLAST's table for BLOSUM62 11/1: lambda 0.267, K 0.041, alpha 1.9, beta -30 (alpha / lambda 7.1)."""
    found = statistics.estimate(settings(gap=None, gap_open=-12.0, gap_extend=-1.0, temperature=0.0), 1500)
    assert found.lambda_ == pytest.approx(0.267, rel=0.1)
    assert found.k == pytest.approx(0.041, rel=0.6)
    assert 3 < found.alpha / found.lambda_ < 12 and -60 < found.beta < 0


def test_effective_lengths_are_blast_length_adjustment():
    """The fixed point l = (alpha / lambda) ln(K (m - l)(n - l)) + beta, kept where K m' n' >= max(m, n),
    and 0 where the right side is negative at l = 0."""
    rng = np.random.default_rng(4)
    m, n = rng.integers(1, 3000, 500), rng.integers(1, 3000, 500)
    k, slope, beta = 0.041, 7.1, -30.0
    m2, n2 = statistics.effective_lengths(m, n, k, slope, beta)
    ell = m - m2
    assert np.allclose(n - n2, ell) and np.all(ell >= 0)
    at_fixed_point = (ell > 0) & (k * m2 * n2 > np.maximum(m, n) * (1 + 1e-9))
    assert np.allclose(ell[at_fixed_point], slope * np.log(k * m2 * n2)[at_fixed_point] + beta, atol=1e-6)
    capped = (ell > 0) & ~at_fixed_point
    assert np.allclose(k * m2[capped] * n2[capped], np.maximum(m, n)[capped])
    assert np.all(ell[slope * np.log(k * m * n) + beta <= 0] == 0)
    assert at_fixed_point.sum() > 100 and capped.sum() > 5  # both cases are exercised
    # a second oracle: plain iteration l <- f(l), a contraction for long sequences
    ell_300 = 0.0
    for _ in range(200):
        ell_300 = slope * math.log(k * (300 - ell_300) ** 2) + beta
    (m300,), _ = statistics.effective_lengths([300], [300], k, slope, beta)
    assert 300 - m300 == pytest.approx(ell_300, abs=1e-9) and 26 < ell_300 < 28


def test_capped_lengths_give_equal_evalues_to_the_bit_and_rank_in_database_order():
    """Where the adjustment is capped, K m' n' is max(m, n): a query of 300 and targets of 25, 30 and 35
    (all capped with alpha 1.9, beta -30) with one score have one E-value, and --rank evalue keeps them in
    database order (by float64 noise in the last bit they were not)."""
    import torch

    ka = statistics.KarlinAltschul(0.267, 0.041, "given", 1.9, -30.0)
    space = ka.log_space(300, np.array([25, 30, 35]), searched=3)
    assert space[0] == space[1] == space[2] == math.log(3 * 300)
    ranking = statistics.EvalueRanking(ka, np.array([25, 30, 35]), [(0, 3)], 3, "cpu")
    ranks = ranking.ranks(torch.from_numpy(ranking.table(300)), torch.full((3,), 55.0), 0)
    assert ranks[0] == ranks[1] == ranks[2]
    # uncapped pairs keep the fixed point's lengths
    long = ka.log_space(300, np.array([2000]))
    m2, n2 = statistics.effective_lengths([300], [2000], 0.041, 1.9 / 0.267, -30.0)
    assert long[0] == pytest.approx(math.log(0.041) + math.log(m2[0]) + math.log(n2[0]), rel=1e-15)


def test_the_corrected_fit_recovers_a_law_with_edge_effects():
    """Scores drawn from the corrected law, and alignment lengths on its line: fit_corrected gives back
    lambda, K, alpha and beta."""
    rng = np.random.default_rng(5)
    m, n = rng.integers(100, 2000, 20000), rng.integers(100, 2000, 20000)
    lam, k, slope, beta = 0.27, 0.04, 7.0, -30.0
    m2, n2 = statistics.effective_lengths(m, n, k, slope, beta)
    scores = (np.log(k * m2 * n2) - np.log(-np.log(rng.uniform(size=m.size)))) / lam
    extents = slope * lam * scores[:2000] + beta + rng.normal(0, 5, 2000)
    found = statistics.fit_corrected(scores, m, n, scores[:2000], extents)
    assert found[0] == pytest.approx(lam, rel=0.03) and found[1] == pytest.approx(k, rel=0.2)
    assert found[2] / found[0] == pytest.approx(slope, rel=0.1) and found[3] == pytest.approx(beta, abs=6)
    assert statistics.fit_corrected(scores, m, n, scores[:5], extents[:5])[2:] == (None, None)


def test_scores_growing_with_length_are_refused():
    with pytest.raises(SwcliError, match="E-values are not defined for BLOSUM62, linear gap -4, t = 0"):
        statistics.estimate(settings(gap=-4.0, temperature=0.0), 500)


def test_evalues_and_bits_follow_the_formulas():
    ka = statistics.KarlinAltschul(0.25, 0.04, "given")
    assert ka.evalues([40.0], [100], [300], 7)[0] == pytest.approx(7 * 0.04 * 100 * 300 * math.exp(-10))
    assert ka.bits([40.0])[0] == pytest.approx((10 - math.log(0.04)) / math.log(2))
    corrected = statistics.KarlinAltschul(0.25, 0.04, "given", 1.9, -30.0)
    (m2,), (n2,) = statistics.effective_lengths([100], [300], 0.04, 1.9 / 0.25, -30.0)
    assert 0 < m2 < 100 and n2 == 300 - (100 - m2)
    assert corrected.evalues([40.0], [100], [300], 7)[0] == pytest.approx(7 * 0.04 * m2 * n2 * math.exp(-10))
    assert corrected.bits([40.0]) == ka.bits([40.0])  # bits do not depend on lengths
    assert corrected.evalues([0.0], [0], [300])[0] == 0  # an empty query: no search space


def test_random_sequences_vary_in_composition_around_the_background():
    flat, offsets, query_lengths, target_lengths = statistics.random_pairs(MATRIX, 400, (100, 2000), 3)
    codes, frequencies = statistics.background(MATRIX)
    counts = np.stack([np.bincount(flat[offsets[r]:offsets[r + 1]], minlength=len(MATRIX.alphabet))[codes]
                       for r in range(800)])
    shares = counts / counts.sum(1, keepdims=True)
    assert np.allclose(shares.mean(0), frequencies, atol=0.005)
    # a sequence's share of a letter varies about as Dirichlet(100 p) draws do, past multinomial sampling
    sampling = frequencies * (1 - frequencies) * np.mean(1 / counts.sum(1))
    concentration = np.sum(frequencies * (1 - frequencies)) / np.sum(shares.var(0) - sampling) - 1
    assert 60 < concentration < 160
    assert len(flat) == offsets[-1] == query_lengths.sum() + target_lengths.sum()


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
    assert "cached" in again.source and (again.alpha, again.beta) == (first.alpha, first.beta)
    assert first.corrected
    assert statistics.parameters(affine, 0.3, 0.05) == statistics.KarlinAltschul(0.3, 0.05, "given")
    given = statistics.parameters(affine, 0.3, 0.05, alpha=1.9, beta=-30.0)
    assert (given.alpha, given.beta) == (1.9, -30.0) and "alpha 1.9, beta -30" in given.describe()


@pytest.mark.parametrize("saved", [{"lambda_": -1, "k": -1}, {"lambda_": 0.3, "k": float("inf")},
                                   {"lambda_": 0.3, "k": 0.04, "alpha": float("nan"), "beta": 1.0}, {"k": 0.04},
                                   [1, 2], {"lambda_": "x", "k": 0.04}])
def test_a_damaged_cache_entry_is_estimated_again(tmp_path, monkeypatch, capsys, saved):
    path = tmp_path / "0.0.json"
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: path)
    if isinstance(saved, dict):
        saved = {"alpha": None, "beta": None, "source": "estimated", **saved}
    path.write_text(json.dumps(saved))
    affine = settings(gap=None, gap_open=-12.0, gap_extend=-1.0, temperature=0.0)
    found = statistics.parameters(affine, count=300)
    assert "estimating Karlin-Altschul lambda and K" in capsys.readouterr().err
    assert found.lambda_ > 0 and found.k > 0 and json.loads(path.read_text())["lambda_"] == found.lambda_


def test_cli_refuses_evalues_where_they_do_not_hold(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: tmp_path / "cache.json")
    monkeypatch.setattr(statistics, "ESTIMATION_PAIRS", 400)
    fasta = write_fasta(tmp_path / "p.fa", [("a", "MKVLA"), ("b", "MKVLA")])
    out = tmp_path / "out.tsv"
    code, stdout, err = cli(["align", fasta, "--gap", "-4", "--format-output", "query,evalue", "-o", str(out),
                             "--backend", "cpu"], capsys)
    assert code == 1 and "E-values are not defined" in err and not out.exists()
    assert "estimating" in err
    # the refusal is cached too: the next run says it at once, without estimating again
    code, stdout, again = cli(["align", fasta, "--gap", "-4", "--format-output", "query,evalue", "-o", str(out),
                               "--backend", "cpu"], capsys)
    assert code == 1 and "estimating" not in again and again.splitlines()[-1] == err.splitlines()[-1]
    code, stdout, err = cli(["align", fasta, "--gap", "-4", "--format-output", "query,evalue", "--lambda", "0.2",
                             "--k", "0.01", "--backend", "cpu"], capsys)
    assert code == 0 and "lambda 0.2, K 0.01, no length correction (given)" in err


def test_a_cached_refusal_names_the_setting_as_the_current_run_gives_it(tmp_path, monkeypatch, capsys):
    """One cache entry serves a setting under all its names (the key is the scores and the gaps' values):
    the matrix from a file of another name, a linear gap given as affine gaps of the same scores. The kept
    refusal names the setting as the run that reads it does, with the first run's mean scores."""
    from dataclasses import replace

    monkeypatch.setenv("SWCLI_CACHE_DIR", str(tmp_path))
    linear = settings(gap=-4.0, temperature=0.0)
    with pytest.raises(statistics.StatisticsUndefined) as first:
        statistics.parameters(linear, count=300)
    assert "E-values are not defined for BLOSUM62, linear gap -4, t = 0:" in str(first.value)
    assert "estimating" in capsys.readouterr().err
    renamed = Settings(replace(MATRIX, name="my62.txt"), gap=None, gap_open=-4.0, gap_extend=-4.0,
                       temperature=0.0, backend="cpu")
    assert statistics.cache_path(renamed, 300, statistics.LENGTHS, 0) == statistics.cache_path(
        linear, 300, statistics.LENGTHS, 0)
    with pytest.raises(statistics.StatisticsUndefined) as again:
        statistics.parameters(renamed, count=300)
    assert capsys.readouterr().err == ""  # from the cache, not estimated again
    # the same message, means included, but for the setting as this run names it (and its remedy)
    linear_remedy = "affine gaps (e.g. --gap-open -12 --gap-extend -1) or a more negative --gap"
    affine_remedy = "more negative gap scores, or a matrix whose expected score on unrelated letters is negative"
    assert linear_remedy in str(first.value)
    assert str(again.value) == str(first.value).replace(
        "BLOSUM62, linear gap -4, t = 0:", "my62.txt, affine gaps: open -4, extend -4, t = 0:").replace(
        linear_remedy, affine_remedy)
    assert "for my62.txt, affine gaps: open -4, extend -4, t = 0:" in str(again.value)


def test_a_refusal_kept_as_a_message_alone_is_estimated_again(tmp_path, monkeypatch, capsys):
    """An entry that keeps the refusal's words, not its mean scores, cannot name another setting: it is
    estimated again, and kept in the form that can."""
    path = tmp_path / "cache.json"
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: path)
    path.write_text(json.dumps({"undefined": "E-values are not defined for FIRST: ...", "setting": "FIRST"}))
    with pytest.raises(statistics.StatisticsUndefined, match="^E-values are not defined for BLOSUM62, linear gap"):
        statistics.parameters(settings(gap=-4.0, temperature=0.0), count=300)
    assert "estimating" in capsys.readouterr().err
    kept = json.loads(path.read_text())["undefined"]
    assert set(kept) == {"shortest", "longest"} and kept["longest"] > kept["shortest"]


@pytest.mark.parametrize("gap", [-4.0, None])
def test_a_cache_that_cannot_be_written_says_what_it_could_not_keep(tmp_path, monkeypatch, capsys, gap):
    """A refusal is no estimate that this run could use: the warning says which of the two was not kept."""
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache's folder would be
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: blocked / "cache.json")
    if gap is None:
        found = statistics.parameters(settings(gap=None, gap_open=-12.0, gap_extend=-1.0, temperature=0.0),
                                      count=300)
        assert found.lambda_ > 0
        told = "could not cache the estimate in"
    else:
        with pytest.raises(statistics.StatisticsUndefined):
            statistics.parameters(settings(gap=gap, temperature=0.0), count=300)
        told = "could not cache that E-values are not defined for this setting in"
    warning = capsys.readouterr().err.splitlines()[-1]
    assert warning.startswith(f"swcli: {told} {tmp_path}")
    assert ("it is used for this run" in warning) == (gap is None)
    assert warning.endswith("and the next run with this setting estimates again")


@pytest.mark.parametrize("case", ["missing", "letter", "all-vs-all", "empty"])
def test_align_says_a_bad_input_before_lambda_and_k_are_estimated(tmp_path, monkeypatch, capsys, case):
    """The first chunk is read and its letters checked before the estimate, which can take a minute."""
    def parameters(*args, **kwargs):
        raise AssertionError("lambda and K estimated before the first pairs were read")

    monkeypatch.setattr(statistics, "parameters", parameters)
    good = write_fasta(tmp_path / "good.fa", [("a", "MKVLA"), ("b", "WWKLA")])
    bad = write_fasta(tmp_path / "bad.fa", [("t", "MKV1A"), ("u", "MKVLA")])
    empty = tmp_path / "empty.fa"
    empty.write_text("")
    targets = {"missing": [str(tmp_path / "none.fa")], "letter": [bad], "all-vs-all": [bad, "--all-vs-all"],
               "empty": [str(empty)]}[case]
    out = tmp_path / "out.tsv"
    code, stdout, err = cli(["align", good, *targets, "--gap", "-4", "-t", "0", "--format-output", "query,evalue",
                             "-o", str(out), "--backend", "cpu"], capsys)
    expected = {"missing": f"{tmp_path / 'none.fa'}: no such file", "empty": f"{empty}: no FASTA records"}.get(
        case, f"{bad}: record 1 (t): invalid letter '1' at position 4")
    assert code == 1 and stdout == "" and err.startswith(f"swcli: error: {expected}") and not out.exists()

