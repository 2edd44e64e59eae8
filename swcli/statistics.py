"""Karlin-Altschul statistics: E-values and bit scores, with lambda and K estimated for each setting.

    E = searched x K m n exp(-lambda S)        bits = (lambda S - ln K) / ln 2

m and n are the query's and the target's lengths and `searched` the number of sequences the query was
compared with (1 for a pair of `align`, the database's sequences for `search`: as SSEARCH, the expected
number of unrelated sequences of that length that score S or more).

Published lambda and K cover a few hard affine settings; none cover linear gaps or soft scores. So the
program estimates them, once per (matrix, gaps, temperature), and caches them on disk: it scores
ESTIMATION_PAIRS pairs of random sequences drawn from the matrix's background frequencies, with lengths
log-uniform in LENGTHS, and fits the Gumbel law P(S >= s) = 1 - exp(-K m n exp(-lambda s)) to them by
maximum likelihood (K in closed form for each lambda, lambda by golden-section search on the profile
likelihood). Scores on a lattice (t = 0, integer matrix and gaps) are fitted at the middle of their
step: P(S >= s) for an integer s is then the fitted law at s.

The lengths absorb the edge effect in the fit, and no separate length correction is applied: over
100 to 2,000 residues the likelihood hardly changes with an Altschul-Gish correction of any size
(docs/benchmarks/statistics.md), while such a correction moved K far from the published value.

Some settings are not in the local regime at all: under BLOSUM62 with a linear gap of -4, the best
scores of unrelated sequences grow in proportion to their length, not its logarithm, and no lambda and K
describe them. The estimation checks the fit against the scores of the shortest and the longest random
pairs and refuses such a setting (SwcliError), unless --lambda and --k are given.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from swcli.errors import SwcliError

ESTIMATION_PAIRS = 10_000
LENGTHS = (100, 2000)
SEED = 0
METHOD = "gumbel-ml-1"  # part of the cache key: a change of method estimates again
EULER_GAMMA = 0.5772156649015329
# The 20 amino acids' background frequencies of BLAST (Robinson & Robinson, 1991), for protein matrices.
ROBINSON_FREQUENCIES = {
    "A": 0.07805, "R": 0.05129, "N": 0.04487, "D": 0.05364, "C": 0.01925, "Q": 0.04264, "E": 0.06295,
    "G": 0.07377, "H": 0.02199, "I": 0.05142, "L": 0.09019, "K": 0.05744, "M": 0.02243, "F": 0.03856,
    "P": 0.05203, "S": 0.07120, "T": 0.05841, "W": 0.01330, "Y": 0.03216, "V": 0.06441,
}


@dataclass(frozen=True)
class KarlinAltschul:
    lambda_: float
    k: float
    source: str  # how they were obtained, for the report line

    def evalues(self, scores, query_lengths, target_lengths, searched: int = 1) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float64)
        area = np.asarray(query_lengths, dtype=np.float64) * np.asarray(target_lengths, dtype=np.float64)
        return searched * self.k * area * np.exp(-self.lambda_ * scores)

    def bits(self, scores) -> np.ndarray:
        return (self.lambda_ * np.asarray(scores, dtype=np.float64) - math.log(self.k)) / math.log(2)

    def describe(self) -> str:
        return f"lambda {self.lambda_:.4g}, K {self.k:.4g} ({self.source})"


def background(matrix) -> tuple[np.ndarray, np.ndarray]:
    """The codes random sequences are drawn from, and their frequencies: BLAST's amino-acid frequencies
    for a matrix that scores the 20 amino acids, else the four nucleotides ACGT evenly for one that scores
    them (NUC.4.4), else every letter of the matrix evenly."""
    alphabet = matrix.alphabet.upper()
    for letters, weights in ((list(ROBINSON_FREQUENCIES), list(ROBINSON_FREQUENCIES.values())),
                             (list("ACGT"), [1.0] * 4)):
        if all(letter in alphabet for letter in letters):
            frequencies = np.array(weights) / sum(weights)
            return np.array([alphabet.index(letter) for letter in letters], dtype=np.uint8), frequencies
    return np.arange(len(alphabet), dtype=np.uint8), np.full(len(alphabet), 1 / len(alphabet))


def lattice_step(matrix, gap_open: float, gap_extend: float, temperature: float) -> float:
    """The spacing of the possible hard scores (the gcd of the integer scores and gaps), or 0 where the
    scores are not on a lattice (t > 0, or a score that is not an integer)."""
    values = [value for row in matrix.scores for value in row] + [gap_open, gap_extend]
    if temperature > 0 or any(value != int(value) for value in values):
        return 0.0
    return float(math.gcd(*(int(abs(value)) for value in values)) or 1)


def fit_gumbel(scores: np.ndarray, query_lengths: np.ndarray, target_lengths: np.ndarray) -> tuple[float, float]:
    """Maximum-likelihood lambda and K of P(S >= s) = 1 - exp(-K m n exp(-lambda s)): for a given lambda
    the likelihood is largest at K = count / sum(m n exp(-lambda S)), and lambda maximises the profile
    likelihood (golden-section search, bracketed by the moment estimate)."""
    scores = np.asarray(scores, dtype=np.float64)
    log_area = np.log(np.asarray(query_lengths, dtype=np.float64) * np.asarray(target_lengths, dtype=np.float64))
    shift = scores.mean()  # exponents relative to the mean score: no overflow

    def profile(lam: float) -> tuple[float, float]:
        exponent = log_area - lam * (scores - shift)
        top = exponent.max()
        log_k = math.log(len(scores)) - top - math.log(np.exp(exponent - top).sum()) + lam * shift
        log_x = log_k + log_area - lam * scores  # ln(K m n exp(-lambda S))
        return float(np.sum(math.log(lam) + log_x - np.exp(log_x))), log_k

    moment = math.pi / (math.sqrt(6) * max(scores.std(), 1e-12))  # a Gumbel's lambda from its spread
    low, high = moment / 5, moment * 5
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low + (1 - ratio) * (high - low), low + ratio * (high - low)
    fa, fb = profile(a)[0], profile(b)[0]
    for _ in range(80):
        if fa > fb:
            high, b, fb = b, a, fa
            a = low + (1 - ratio) * (high - low)
            fa = profile(a)[0]
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = profile(b)[0]
    lam = (low + high) / 2
    return lam, math.exp(profile(lam)[1])


def check_local(scores: np.ndarray, query_lengths: np.ndarray, target_lengths: np.ndarray, lam: float, k: float,
                what: str) -> None:
    """Refuse a fit that does not describe the scores: in the shortest and in the longest fifth of the
    pairs, the mean score must be within 0.5 / lambda (a factor e^0.5 in E) of the fitted law's mean,
    (ln(K m n) + gamma) / lambda. Scores that grow with the length itself fail this (the longest pairs
    of BLOSUM62 with a linear gap of -4 lie 1.7 / lambda above it; with BLAST's 11/1, 0.1 / lambda)."""
    area = np.asarray(query_lengths, dtype=np.float64) * np.asarray(target_lengths, dtype=np.float64)
    residual = lam * np.asarray(scores, dtype=np.float64) - (np.log(k * area) + EULER_GAMMA)
    order = np.argsort(area, kind="stable")
    fifth = max(1, len(order) // 5)
    shortest, longest = order[:fifth], order[-fifth:]
    if max(abs(residual[shortest].mean()), abs(residual[longest].mean())) > 0.5:
        raise SwcliError(
            f"E-values are not defined for {what}: the best scores of unrelated random sequences grow with their "
            f"length itself (mean {scores[shortest].mean():.1f} for the shortest fifth of the random pairs, "
            f"{scores[longest].mean():.1f} for the longest), not its logarithm, so Karlin-Altschul statistics do "
            "not hold; use affine gaps (e.g. --gap-open -12 --gap-extend -1) or a more negative --gap, or give "
            "--lambda and --k")


def random_pairs(matrix, count: int, lengths: tuple[int, int], seed: int):
    """count pairs of random sequences (codes drawn from `background`), lengths log-uniform in `lengths`:
    flat codes, offsets, and the query and target lengths."""
    rng = np.random.default_rng(seed)
    low, high = math.log(lengths[0]), math.log(lengths[1] + 1)
    sizes = np.exp(rng.uniform(low, high, 2 * count)).astype(np.int64)
    codes, frequencies = background(matrix)
    flat = codes[rng.choice(len(codes), int(sizes.sum()), p=frequencies)]
    offsets = np.zeros(2 * count + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return flat, offsets, sizes[:count], sizes[count:]


def random_scores(settings, count: int = ESTIMATION_PAIRS, lengths: tuple[int, int] = LENGTHS,
                  seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores of `random_pairs` under the settings (matrix, gaps, temperature, on its engine; the
    reference loop's runs use the CPU engine, which agrees with it to 1e-4), with their lengths."""
    from dataclasses import replace

    from swcli.batching import Codes, make_batches
    from swcli.pipeline import Stats, score_batches

    if settings.backend == "reference":
        settings = replace(settings, backend="cpu", max_cells=None)
    flat, offsets, query_lengths, target_lengths = random_pairs(settings.matrix, count, lengths, seed)
    codes = Codes.of(flat, offsets, settings.device)
    index = np.arange(count, dtype=np.int64)
    batches = make_batches(codes, index, codes, index + count, settings.batch_cells, settings.device)
    matrix = settings.matrix.tensor(device=settings.device)
    scores = score_batches(batches, count, settings, matrix, Stats()).astype(np.float64)
    return scores, query_lengths, target_lengths


def setting_name(settings) -> str:
    return f"{settings.matrix.name}, {settings.gaps.describe()}, t = {settings.temperature:g}"


def _gaps(settings) -> tuple[float, float]:
    gaps = settings.gaps
    return (gaps.gap_open, gaps.gap_extend) if gaps.affine else (gaps.gap, gaps.gap)


def estimate(settings, count: int = ESTIMATION_PAIRS, lengths: tuple[int, int] = LENGTHS,
             seed: int = SEED) -> KarlinAltschul:
    """lambda and K for the settings, fitted to the scores of `count` random pairs (no cache)."""
    scores, query_lengths, target_lengths = random_scores(settings, count, lengths, seed)
    step = lattice_step(settings.matrix, *_gaps(settings), settings.temperature)
    lam, k = fit_gumbel(scores + step / 2, query_lengths, target_lengths)
    check_local(scores + step / 2, query_lengths, target_lengths, lam, k, setting_name(settings))
    return KarlinAltschul(lam, k, f"estimated from {count:,} random pairs of {lengths[0]} to {lengths[1]} residues")


def cache_path(settings, count: int, lengths: tuple[int, int], seed: int) -> Path:
    """The cache file of a setting: under the engines' cache folder, named by a hash of everything the
    estimate depends on (the matrix's scores and alphabet, the gaps, the temperature, the sample, the
    method)."""
    from swcli._build import cache_root

    key = json.dumps([METHOD, settings.matrix.alphabet, settings.matrix.scores, _gaps(settings),
                      settings.temperature, count, list(lengths), seed])
    return cache_root() / "statistics" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def parameters(settings, lambda_: float | None = None, k: float | None = None, count: int | None = None,
               lengths: tuple[int, int] = LENGTHS, seed: int = SEED) -> KarlinAltschul:
    """The run's lambda and K: as given (--lambda, --k), else from the cache, else estimated now (one
    line on stderr says so) from `count` pairs (ESTIMATION_PAIRS) and cached."""
    count = ESTIMATION_PAIRS if count is None else count
    if lambda_ is not None and k is not None:
        return KarlinAltschul(lambda_, k, "given")
    path = cache_path(settings, count, lengths, seed)
    try:
        saved = json.loads(path.read_text())
        return KarlinAltschul(float(saved["lambda_"]), float(saved["k"]), saved["source"] + ", cached")
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: estimate again
    print(f"swcli: estimating Karlin-Altschul lambda and K for {setting_name(settings)} from {count:,} random "
          f"pairs (once per setting; cached in {path.parent})", file=sys.stderr, flush=True)
    started = time.perf_counter()
    found = estimate(settings, count, lengths, seed)
    record = {**asdict(found), "setting": setting_name(settings), "seconds": round(time.perf_counter() - started, 2)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, path)  # whole or absent: a reader never sees half a file
    except OSError as exc:
        print(f"swcli: could not cache the estimate in {path.parent} ({exc.strerror}); it is used for this run",
              file=sys.stderr, flush=True)
    return found
