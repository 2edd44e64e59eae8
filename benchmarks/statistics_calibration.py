"""Karlin-Altschul calibration of swcli's E-values: lambda, K, alpha and beta against the published BLOSUM62
11/1 values, the fraction of unrelated pairs with E <= x, and ranking by E-value against ranking by score
in a search with planted homologs. CPU or GPU (the engine of --backend); results as text and JSON.

    python3 benchmarks/statistics_calibration.py proteins.fasta [--pairs 100000] [--backend cpu]

- calibration: `--pairs` pairs of two shuffled proteins of the FASTA (no homology), per-pair E-values
  (database size 1), BLOSUM62 with BLAST's 11/1 (-12/-1), at t = 0 and t = 1: swcli's E-values (with
  the length correction), and for comparison those of lambda and K fitted to the same random pairs
  without it (E = K m n exp(-lambda S));
- planted homologs: 20 queries; a database of 2,000 shuffled proteins, and for each query 5 shuffled
  proteins with a mutated piece of it planted inside (40 to 120 residues, 60% to 75% substitutions, 5%
  indels); the planted homologs in each query's top 10 by score and by E-value (which weighs the
  target's length).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from swcli.fasta import read_fasta
from swcli.pipeline import Settings, Stats, score_batches
from swcli.batching import Codes, make_batches
from swcli.scoring import load_matrix
from swcli import statistics

PUBLISHED = (0.267, 0.041, 1.9, -30.0)  # BLAST's lambda, K, alpha, beta for BLOSUM62 11/1
SHORT = 150  # the calibration is also split at this length of the shorter sequence


def uncorrected(settings) -> statistics.KarlinAltschul:
    """lambda and K fitted to the estimate's random pairs as they are, without a length correction."""
    scores, query_lengths, target_lengths, _ = statistics.random_scores(settings)
    step = statistics.lattice_step(settings.matrix, settings.gap_open, settings.gap_extend, settings.temperature)
    return statistics.KarlinAltschul(*statistics.fit_gumbel(scores + step / 2, query_lengths, target_lengths),
                                     "uncorrected")


def score_pairs(settings, sequences, pairs_a, pairs_b):
    """Scores of pairs (sequences[a], sequences[b]) given as code arrays."""
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sequences], out=offsets[1:])
    codes = Codes.of(np.concatenate(sequences), offsets, settings.device)
    batches = make_batches(codes, np.asarray(pairs_a), codes, np.asarray(pairs_b), settings.batch_cells,
                           settings.device)
    return score_batches(batches, len(pairs_a), settings, settings.matrix.tensor(device=settings.device),
                         Stats()).astype(np.float64)


def mutate(rng, seq, substitution, alphabet_codes):
    out = []
    for c in seq:
        r = rng.random()
        if r < 0.025:
            continue
        if r < 0.05:
            out.append(rng.choice(alphabet_codes))
        out.append(rng.choice(alphabet_codes) if rng.random() < substitution else c)
    return np.array(out or [seq[0]], dtype=np.uint8)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("fasta")
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--json", default="statistics_calibration.json")
    args = parser.parse_args()
    matrix = load_matrix("BLOSUM62").with_unknown_as("X")
    proteins = [np.frombuffer(matrix.encode(r.sequence, r.where), dtype=np.uint8) for r in read_fasta(args.fasta)]
    results = {"pairs": args.pairs, "fasta": args.fasta, "backend": args.backend}
    amino = np.array([matrix.alphabet.index(a) for a in statistics.ROBINSON_FREQUENCIES], dtype=np.uint8)
    for t in (0.0, 1.0):
        settings = Settings(matrix, None, t, args.backend, gap_open=-12.0, gap_extend=-1.0)
        started = time.perf_counter()
        ka = statistics.estimate(settings)
        estimate_seconds = time.perf_counter() - started
        rng = np.random.default_rng(7)  # the same pairs at each temperature
        # calibration: shuffled pairs
        a, b = rng.integers(0, len(proteins), args.pairs), rng.integers(0, len(proteins), args.pairs)
        shuffled = [rng.permutation(proteins[i]) for i in a] + [rng.permutation(proteins[i]) for i in b]
        index = np.arange(args.pairs)
        scores = score_pairs(settings, shuffled, index, index + args.pairs)
        m, n = np.array([len(s) for s in shuffled[:args.pairs]]), np.array([len(s) for s in shuffled[args.pairs:]])
        fractions = {str(x): float(np.mean(ka.evalues(scores, m, n) <= x)) for x in (0.1, 0.01, 0.001)}
        plain = uncorrected(settings)
        plain_fractions = {str(x): float(np.mean(plain.evalues(scores, m, n) <= x)) for x in (0.1, 0.01, 0.001)}
        # where the correction matters: pairs with a sequence shorter than SHORT residues, and the others
        short = np.minimum(m, n) < SHORT
        by_length = {name: {kind: {str(x): float(np.mean(law.evalues(scores[part], m[part], n[part]) <= x))
                                   for x in (0.1, 0.01)}
                            for kind, law in (("corrected", ka), ("uncorrected", plain))}
                     for name, part in ((f"shorter than {SHORT}", short), (f"both {SHORT} or longer", ~short))}
        # planted homologs
        queries = [proteins[i] for i in rng.choice(len(proteins), 20, replace=False)]
        database = [rng.permutation(proteins[i]) for i in rng.integers(0, len(proteins), 2000)]
        truth = []
        for q, query in enumerate(queries):
            for level in np.linspace(0.6, 0.75, 5):
                size = min(len(query), int(rng.integers(40, 121)))
                start = int(rng.integers(0, len(query) - size + 1))
                host = rng.permutation(proteins[int(rng.integers(0, len(proteins)))])
                cut = int(rng.integers(0, len(host) + 1))
                piece = mutate(rng, query[start:start + size], level, amino)
                database.append(np.concatenate([host[:cut], piece, host[cut:]]))
                truth.append(q)
        truth = np.array([-1] * 2000 + truth)
        sequences = queries + database
        qa = np.repeat(np.arange(20), len(database))
        tb = np.tile(np.arange(len(database)) + 20, 20)
        all_scores = score_pairs(settings, sequences, qa, tb).reshape(20, len(database))
        tlen = np.array([len(s) for s in database])
        found_score = found_evalue = 0
        for q in range(20):
            e = ka.evalues(all_scores[q], np.full(len(database), len(queries[q])), tlen, len(database))
            by_score = np.argsort(-all_scores[q], kind="stable")[:10]
            by_evalue = np.argsort(e, kind="stable")[:10]
            found_score += int(np.sum(truth[by_score] == q))
            found_evalue += int(np.sum(truth[by_evalue] == q))
        results[f"t={t:g}"] = {"lambda": ka.lambda_, "k": ka.k, "alpha": ka.alpha, "beta": ka.beta,
                               "estimate_seconds": estimate_seconds, "fraction_e_at_most": fractions,
                               "uncorrected": {"lambda": plain.lambda_, "k": plain.k,
                                               "fraction_e_at_most": plain_fractions},
                               "by_length": {name: {"pairs": int(np.count_nonzero(part)), **by_length[name]}
                                             for name, part in ((f"shorter than {SHORT}", short),
                                                                (f"both {SHORT} or longer", ~short))},
                               "planted_in_top10_by_score": found_score,
                               "planted_in_top10_by_evalue": found_evalue, "planted": 100}
        print(f"t = {t:g}: lambda {ka.lambda_:.4f} ({ka.lambda_ / PUBLISHED[0] - 1:+.1%} of 0.267), K {ka.k:.4f} "
              f"({ka.k / PUBLISHED[1] - 1:+.1%} of 0.041), alpha {ka.alpha:.3f} (1.9), beta {ka.beta:.2f} (-30), "
              f"estimated in {estimate_seconds:.1f} s; uncorrected fit: lambda {plain.lambda_:.4f}, K {plain.k:.4f}")
        for x, f in fractions.items():
            print(f"  E <= {x}: {f:.5f} of {args.pairs:,} shuffled pairs ({f / float(x):.3f} x); uncorrected "
                  f"{plain_fractions[x] / float(x):.3f} x")
        for name, kinds in by_length.items():
            print(f"  {name} ({results[f't={t:g}']['by_length'][name]['pairs']:,} pairs): " + "; ".join(
                f"{kind} " + ", ".join(f"E <= {x}: {f / float(x):.3f} x" for x, f in found.items())
                for kind, found in kinds.items()))
        print(f"  planted homologs in the top 10 of 20 queries (of 100): by score {found_score}, by E-value "
              f"{found_evalue}")
    with open(args.json, "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
