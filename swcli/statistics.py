"""Karlin-Altschul statistics: E-values and bit scores, with lambda, K and the length correction estimated
for each setting.

    E = searched x K m' n' exp(-lambda S)        bits = (lambda S - ln K) / ln 2

m' and n' are the query's and the target's effective lengths and `searched` the number of sequences the
query was compared with (1 for a pair of `align`, the database's sequences for `search`: as SSEARCH, the
expected number of unrelated sequences of that length that score S or more).

**Length correction.** An alignment cannot start near the end of a sequence, so the lengths are cut
by the expected length l of an alignment that scores about ln(K m n) / lambda: m' = m - l, n' = n - l,
with l BLAST's length adjustment (BLAST_ComputeLengthAdjustment, for one pair): the fixed point of

    l = (alpha / lambda) ln(K (m - l) (n - l)) + beta,     0 <= l,  K (m - l) (n - l) >= max(m, n)

(not rounded down to a whole number as BLAST does). alpha / lambda and beta are what BLAST tabulates
for its gapped settings (1 / H and 0 without gaps: l = ln(K m n) / H with H the relative entropy);
here they are the least-squares line of the optimal alignments' lengths (mean of the query's and the
target's extent) against their scores in nats (lambda S), over the random pairs' alignments. A search
corrects each target's length by its own l, where BLAST cuts the database's total length by one l
computed from it, since swcli's E-value is per target. Without alpha and beta (--lambda and --k given
alone) no correction is made: m' = m, n' = n.

**Estimation.** Published lambda and K cover a few hard affine settings; none cover linear gaps or soft
scores. So the program estimates them, once per (matrix, gaps, temperature), and caches them on disk: it
scores ESTIMATION_PAIRS pairs of random sequences, with lengths log-uniform in LENGTHS, each sequence's
letters drawn from its own composition, a Dirichlet draw of concentration COMPOSITION_CONCENTRATION
around the matrix's background frequencies (real proteins' compositions spread so: about 90 to 140 for
the sets of docs/benchmarks/statistics.md; at a fixed composition, unrelated real proteins score above
the law fitted to random ones). It fits the Gumbel law P(S >= s) = 1 - exp(-K m' n' exp(-lambda s)) to
them by maximum likelihood (K in closed form for each lambda, lambda by golden-section search on the
profile likelihood), the effective lengths from alpha and beta fitted to the hard alignments of the
first CORRECTION_PAIRS pairs (kernels/host/traceback.cpp), refitting both in turn until they settle.
Scores on a lattice (t = 0, integer matrix and gaps) are fitted at the middle of their step: P(S >= s)
for an integer s is then the fitted law at s. For BLOSUM62 with BLAST's 11/1 at t = 0 this gives lambda
0.266, K 0.038, alpha 1.66, beta -26 (BLAST's table: 0.267, 0.041, 1.9, -30; docs/benchmarks/statistics.md).

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
CORRECTION_PAIRS = 2_000  # of them, aligned for the length correction's alpha and beta
LENGTHS = (100, 2000)
SEED = 0
COMPOSITION_CONCENTRATION = 100.0
METHOD = "gumbel-ml-2"  # part of the cache key: a change of method estimates again
REFITS = 8  # rounds of (alpha, beta) then (lambda, K): they settle within 3
EULER_GAMMA = 0.5772156649015329
# The 20 amino acids' background frequencies of BLAST (Robinson & Robinson, 1991), for protein matrices.
ROBINSON_FREQUENCIES = {
    "A": 0.07805, "R": 0.05129, "N": 0.04487, "D": 0.05364, "C": 0.01925, "Q": 0.04264, "E": 0.06295,
    "G": 0.07377, "H": 0.02199, "I": 0.05142, "L": 0.09019, "K": 0.05744, "M": 0.02243, "F": 0.03856,
    "P": 0.05203, "S": 0.07120, "T": 0.05841, "W": 0.01330, "Y": 0.03216, "V": 0.06441,
}


def effective_lengths(query_lengths, target_lengths, k: float, alpha_lambda: float, beta: float):
    """m - l and n - l for BLAST's length adjustment l of each pair (the module's docstring): bisection
    on the fixed point (the right side falls as l grows), within [0, l_max] where l_max is the largest l
    with K (m - l)(n - l) >= max(m, n) (0 where even l = 0 fails that)."""
    m, n, l, _ = _length_adjustment(query_lengths, target_lengths, k, alpha_lambda, beta)
    return m - l, n - l


def _length_adjustment(query_lengths, target_lengths, k: float, alpha_lambda: float, beta: float):
    """(m, n, l, capped): effective_lengths' adjustment l, and where it is l_max (the fixed point lies past
    it), so that K (m - l)(n - l) is max(m, n) exactly there, not to within float64's last bits."""
    m = np.asarray(query_lengths, dtype=np.float64)
    n = np.asarray(target_lengths, dtype=np.float64)
    m, n = np.broadcast_arrays(m, n)
    c = m * n - np.maximum(m, n) / k  # l_max: the smaller root of l^2 - (m + n) l + c
    with np.errstate(invalid="ignore", divide="ignore"):
        limit = np.where(c > 0, 2 * c / ((m + n) + np.sqrt(np.maximum((m + n) ** 2 - 4 * c, 0.0))), 0.0)
        capped = (c > 0) & (alpha_lambda * np.log(k * (m - limit) * (n - limit)) + beta >= limit)
        low, high = np.zeros_like(limit), limit
        for _ in range(60):  # 2^-60 of l_max: exact to float64
            middle = (low + high) / 2
            below = alpha_lambda * np.log(k * (m - middle) * (n - middle)) + beta >= middle
            low, high = np.where(below, middle, low), np.where(below, high, middle)
    return m, n, np.where(capped, limit, low), capped


@dataclass(frozen=True)
class KarlinAltschul:
    lambda_: float
    k: float
    source: str  # how they were obtained, for the report line
    alpha: float | None = None  # the length correction's alpha and beta (BLAST's units); None: no correction
    beta: float | None = None
    # The database sequences an E-value counts in place of those searched (SSEARCH's -Z): a database searched
    # in parts gets the E-values of the whole. None: those searched.
    database_sequences: int | None = None

    @property
    def corrected(self) -> bool:
        return self.alpha is not None

    def lengths(self, query_lengths, target_lengths) -> tuple[np.ndarray, np.ndarray]:
        """The effective lengths m' and n' (the lengths themselves without a correction)."""
        m, n, l, _ = self._adjustment(query_lengths, target_lengths)
        return m - l, n - l

    def _adjustment(self, query_lengths, target_lengths):
        """(m, n, l, capped) as _length_adjustment gives them; without a correction l is 0, never capped."""
        if self.corrected:
            return _length_adjustment(query_lengths, target_lengths, self.k, self.alpha / self.lambda_, self.beta)
        m, n = np.broadcast_arrays(np.asarray(query_lengths, dtype=np.float64),
                                   np.asarray(target_lengths, dtype=np.float64))
        return m, n, np.zeros_like(m), np.zeros(m.shape, dtype=bool)

    def log_space(self, query_lengths, target_lengths, searched: int = 1) -> np.ndarray:
        """ln(searched K m' n'): the E-value is exp(log_space - lambda S) (-inf for a length 0: E = 0).
        Where the length adjustment is capped, K m' n' is max(m, n) itself: pairs of one score there have
        the same E-value to the bit, so --rank evalue keeps them in database order."""
        m, n, l, capped = self._adjustment(query_lengths, target_lengths)
        if self.database_sequences is not None:
            searched = self.database_sequences
        if searched <= 0:  # nothing searched: E = 0
            return np.full(m.shape, -math.inf)
        with np.errstate(divide="ignore"):
            return np.where(capped, math.log(searched) + np.log(np.maximum(m, n)),
                            math.log(searched * self.k) + np.log(m - l) + np.log(n - l))

    def evalues(self, scores, query_lengths, target_lengths, searched: int = 1) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float64)
        return np.exp(self.log_space(query_lengths, target_lengths, searched) - self.lambda_ * scores)

    def bits(self, scores) -> np.ndarray:
        return (self.lambda_ * np.asarray(scores, dtype=np.float64) - math.log(self.k)) / math.log(2)

    def describe(self) -> str:
        correction = (f", length correction alpha {self.alpha:.4g}, beta {self.beta:.4g}" if self.corrected
                      else ", no length correction")
        counted = (f"; E-values for {self.database_sequences:,} database sequences (given)"
                   if self.database_sequences is not None else "")
        return f"lambda {self.lambda_:.4g}, K {self.k:.4g}{correction} ({self.source}){counted}"


class EvalueRanking:
    """A search's best hits by E-value, exactly, on the search's device (search.Searcher's `rank`).

    For a query of length m, a target of length n and score S has the E-value exp(-R), with R = lambda S
    - ln(searched K m' n'). The second term depends on n only: it is computed once per query on the host
    for the database's distinct lengths (`table`), and looked up on the device, so R is computed for
    every database sequence (in float64) and the best `top` are taken by R, then by score, then by
    database order (`best`): the same hits, in the same order, as ranking every sequence's E-value.
    The rows then print exp(-R) of these same R. (Keeping the best k by score on the device would not
    do: a lower score of a shorter target can have the smaller E-value.)"""

    def __init__(self, statistics: KarlinAltschul, lengths: np.ndarray, bounds: list[tuple[int, int]],
                 searched: int, device):
        """lengths: the database's lengths in its length order, cut into blocks at `bounds`."""
        import torch

        self.statistics, self.searched = statistics, searched
        self.distinct, classes = np.unique(np.asarray(lengths), return_inverse=True)
        classes = torch.from_numpy(classes.astype(np.int64).ravel())
        self.classes = [classes[start:stop].to(device) for start, stop in bounds]  # per block: index into table

    def table(self, query_length: int) -> np.ndarray:
        """ln(searched K m' n') of each distinct database length n, for a query of length m."""
        return self.statistics.log_space(query_length, self.distinct, self.searched)

    def ranks(self, table, scores, block: int):
        """R of a block's rows: its scores (float32, on the device) and the query's table there."""
        return scores.double() * self.statistics.lambda_ - table[self.classes[block]]

    @staticmethod
    def best(ranks, keys, top: int):
        """The `top` best (ranks, keys), by rank descending, then key (search.score_keys: score, then
        earlier database order): a sort by key, then a stable sort by rank."""
        import torch

        by_key = torch.sort(keys, descending=True).indices  # keys are distinct: no tie to keep in order
        order = by_key[torch.sort(ranks[by_key], descending=True, stable=True).indices[:top]]
        return ranks[order], keys[order]


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


class StatisticsUndefined(SwcliError):
    """Karlin-Altschul statistics do not hold for the setting (check_local): kept in the cache too, so
    that the next run says so at once instead of estimating again. The cache keeps the random pairs' mean
    scores, not the message: one cache entry serves every name of the setting (a matrix under another
    name, linear gaps given as affine ones), and the message names the setting as the current run gave it."""

    @classmethod
    def of(cls, what: str, shortest: float, longest: float, affine: bool) -> StatisticsUndefined:
        """The refusal for the setting named `what` (with affine gaps or not), whose shortest and longest
        fifths of the random pairs have these mean scores."""
        remedy = ("more negative gap scores, or a matrix whose expected score on unrelated letters is negative"
                  if affine else "affine gaps (e.g. --gap-open -12 --gap-extend -1) or a more negative --gap")
        refusal = cls(
            f"E-values are not defined for {what}: the best scores of unrelated random sequences grow with their "
            f"length itself (mean {shortest:.1f} for the shortest fifth of the random pairs, {longest:.1f} for the "
            f"longest), not its logarithm, so Karlin-Altschul statistics do not hold; use {remedy}, or give "
            "--lambda and --k")
        refusal.shortest, refusal.longest = shortest, longest
        return refusal


def check_local(scores: np.ndarray, query_lengths: np.ndarray, target_lengths: np.ndarray, lam: float, k: float,
                what: str, affine: bool = False) -> None:
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
        raise StatisticsUndefined.of(what, float(scores[shortest].mean()), float(scores[longest].mean()), affine)


def random_pairs(matrix, count: int, lengths: tuple[int, int], seed: int):
    """count pairs of random sequences, lengths log-uniform in `lengths`, each sequence's codes drawn from
    its own composition (a Dirichlet draw of concentration COMPOSITION_CONCENTRATION around `background`):
    flat codes, offsets, and the query and target lengths."""
    rng = np.random.default_rng(seed)
    low, high = math.log(lengths[0]), math.log(lengths[1] + 1)
    sizes = np.exp(rng.uniform(low, high, 2 * count)).astype(np.int64)
    codes, frequencies = background(matrix)
    cumulative = np.cumsum(rng.dirichlet(COMPOSITION_CONCENTRATION * frequencies, 2 * count), axis=1)
    offsets = np.zeros(2 * count + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    uniform = rng.random(int(offsets[-1]))
    picks = np.empty(len(uniform), dtype=np.int64)
    for r in range(2 * count):  # inverse CDF of each sequence's own composition
        picks[offsets[r]:offsets[r + 1]] = np.searchsorted(cumulative[r], uniform[offsets[r]:offsets[r + 1]], "right")
    flat = codes[np.minimum(picks, len(codes) - 1)]
    return flat, offsets, sizes[:count], sizes[count:]


def random_scores(settings, count: int = ESTIMATION_PAIRS, lengths: tuple[int, int] = LENGTHS,
                  seed: int = SEED, aligned: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scores of `random_pairs` under the settings (matrix, gaps, temperature, on its engine; the
    reference loop's runs use the CPU engine, which agrees with it to 1e-4), their lengths, and the
    extents of the t = 0 alignments of the first `aligned` pairs: the mean of the alignment's query and
    target residues (0 for the empty alignment)."""
    from dataclasses import replace

    import torch

    from swcli import _host
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
    aligned = min(aligned, count)
    found = _host.traceback(flat, offsets[:aligned], query_lengths[:aligned], flat, offsets[count:count + aligned],
                            target_lengths[:aligned], np.asarray(settings.matrix.scores, dtype=np.float32),
                            *_gaps(settings), torch.get_num_threads())
    ends = found.ends.astype(np.float64)
    extents = np.where(ends[:, 1] > 0, (ends[:, 1] - ends[:, 0] + ends[:, 3] - ends[:, 2]) / 2 + 1, 0.0)
    return scores, query_lengths, target_lengths, extents


def fit_corrected(scores: np.ndarray, query_lengths: np.ndarray, target_lengths: np.ndarray,
                  aligned_scores: np.ndarray, extents: np.ndarray) -> tuple[float, float, float | None, float | None]:
    """lambda, K, alpha and beta of the law with BLAST's length correction (the module's docstring):
    alpha / lambda and beta the line of the alignments' extents against their scores in nats, the law
    fitted to the effective lengths, in turn, REFITS times. alpha and beta are None where the alignments
    give no rising line (too few of them)."""
    lam, k = fit_gumbel(scores, query_lengths, target_lengths)
    nonempty = extents > 0
    if np.count_nonzero(nonempty) < 10:
        return lam, k, None, None
    for _ in range(REFITS):
        slope, beta = np.polyfit(lam * aligned_scores[nonempty], extents[nonempty], 1)
        if not slope > 0:
            return fit_gumbel(scores, query_lengths, target_lengths) + (None, None)
        lam, k = fit_gumbel(scores, *effective_lengths(query_lengths, target_lengths, k, slope, beta))
    return lam, k, float(lam * slope), float(beta)


def setting_name(settings) -> str:
    return f"{settings.matrix.name}, {settings.gaps.describe()}, t = {settings.temperature:g}"


def _gaps(settings) -> tuple[float, float]:
    gaps = settings.gaps
    return (gaps.gap_open, gaps.gap_extend) if gaps.affine else (gaps.gap, gaps.gap)


def estimate(settings, count: int = ESTIMATION_PAIRS, lengths: tuple[int, int] = LENGTHS,
             seed: int = SEED) -> KarlinAltschul:
    """lambda, K and the length correction for the settings, fitted to `count` random pairs (no cache).
    The regime check runs on the uncorrected fit, which its bounds were set on."""
    scores, query_lengths, target_lengths, extents = random_scores(settings, count, lengths, seed, CORRECTION_PAIRS)
    step = lattice_step(settings.matrix, *_gaps(settings), settings.temperature)
    shifted = scores + step / 2
    check_local(shifted, query_lengths, target_lengths, *fit_gumbel(shifted, query_lengths, target_lengths),
                setting_name(settings), settings.gaps.affine)
    lam, k, alpha, beta = fit_corrected(shifted, query_lengths, target_lengths, scores[:len(extents)], extents)
    return KarlinAltschul(lam, k, f"estimated from {count:,} random pairs of {lengths[0]} to {lengths[1]} residues",
                          alpha, beta)


def cache_path(settings, count: int, lengths: tuple[int, int], seed: int) -> Path:
    """The cache file of a setting: under the engines' cache folder, named by a hash of everything the
    estimate depends on (the matrix's scores and alphabet, the gaps, the temperature, the sample, the
    method)."""
    from swcli._build import cache_root

    key = json.dumps([METHOD, settings.matrix.alphabet, settings.matrix.scores, _gaps(settings),
                      settings.temperature, count, list(lengths), seed])
    return cache_root() / "statistics" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def parameters(settings, lambda_: float | None = None, k: float | None = None, count: int | None = None,
               lengths: tuple[int, int] = LENGTHS, seed: int = SEED, alpha: float | None = None,
               beta: float | None = None) -> KarlinAltschul:
    """The run's lambda, K and length correction: as given (--lambda, --k, and --alpha with --beta for a
    correction), else from the cache, else estimated now (one line on stderr says so) from `count` pairs
    (ESTIMATION_PAIRS) and cached."""
    count = ESTIMATION_PAIRS if count is None else count
    if lambda_ is not None and k is not None:
        return KarlinAltschul(lambda_, k, "given", alpha, beta)
    path = cache_path(settings, count, lengths, seed)
    cached = _cached(path)
    if isinstance(cached, tuple):  # a kept refusal's mean scores: named as this run names the setting
        raise StatisticsUndefined.of(setting_name(settings), *cached, settings.gaps.affine)
    if cached is not None:
        return cached
    print(f"swcli: estimating Karlin-Altschul lambda and K for {setting_name(settings)} from {count:,} random "
          f"pairs (once per setting; cached in {path.parent})", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        found = estimate(settings, count, lengths, seed)
    except StatisticsUndefined as exc:
        _cache(path, {"undefined": {"shortest": exc.shortest, "longest": exc.longest},
                      "setting": setting_name(settings)})
        raise
    _cache(path, {**asdict(found), "setting": setting_name(settings),
                  "seconds": round(time.perf_counter() - started, 2)})
    return found


def _cached(path) -> KarlinAltschul | tuple[float, float] | None:
    """The cache's entry: its lambda and K, or the refusal it keeps (the shortest and the longest pairs' mean
    scores); None where there is none yet, or it is unreadable or out of range (then estimated again). A
    refusal kept as a message alone, which named the setting as the run that cached it did, is estimated
    again too."""
    try:
        saved = json.loads(path.read_text())
        if "undefined" in saved:
            means = float(saved["undefined"]["shortest"]), float(saved["undefined"]["longest"])
            return means if all(math.isfinite(mean) for mean in means) else None
        lam, k = float(saved["lambda_"]), float(saved["k"])
        correction = [None if saved[name] is None else float(saved[name]) for name in ("alpha", "beta")]
        if not (0 < lam < math.inf and 0 < k < math.inf
                and all(c is None or -math.inf < c < math.inf for c in correction)):
            return None
        return KarlinAltschul(lam, k, str(saved["source"]) + ", cached", *correction)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _cache(path, record: dict) -> None:
    """Keep an estimate, or a refusal (a record with "undefined"), for the next runs; where the cache
    cannot be written, the run goes on as it would and says that the next run estimates again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, path)  # whole or absent: a reader never sees half a file
    except OSError as exc:
        where = f"in {path.parent} ({exc.strerror or exc})"
        if "undefined" in record:  # there is no estimate to use: this run stops at the refusal that follows
            told = f"could not cache that E-values are not defined for this setting {where}"
        else:
            told = f"could not cache the estimate {where}; it is used for this run"
        print(f"swcli: {told}, and the next run with this setting estimates again", file=sys.stderr, flush=True)
