"""Counts how many pairs the CUDA engine's scaled sweep hands to the log-space sweep, by temperature and gap.

Pairs: 10,000 random pairs of real proteins from codes (BLOSUM62, FASTA given or .bench/proteins.fasta),
then 8192 dense 64 x 64 pairs of random normal scores times 1, 3 and 10. A pair in log space is scored
correctly but more slowly, so a kernel change that makes the scaled sweep hold less range shows up here
as larger counts. Prints one line.

    python3 benchmarks/log_space_pairs.py [FASTA]
"""

import sys

import torch

from swcli.bench import log_space_pairs, real_batch
from swcli.fasta import read_fasta
from swcli.ops import load_engine


def main(fasta: str = ".bench/proteins.fasta") -> None:
    load_engine("cuda")
    batch, table = real_batch(list(read_fasta(fasta)), 10_000, "cuda")
    counts = []
    for t in (0.27, 0.3, 0.4, 0.5, 1.0, 2.0):
        for gap in (-1.0, -4.0, -11.0):
            n = log_space_pairs(lambda: torch.ops.swcli.scores_codes_counted(
                batch.query_codes, batch.target_codes, table, batch.query_lengths, batch.target_lengths, gap, t))
            counts.append(f"t={t}/g={gap:g}:{n}")
    S = torch.randn(8192, 64, 64, device="cuda")
    for scale in (1, 3, 10):
        for t in (0.3, 1.0):
            n = log_space_pairs(lambda: torch.ops.swcli.scores_counted(S * scale, None, None, -1.0, t,
                                                                       lane_columns=4))
            counts.append(f"dense x{scale} t={t}:{n}")
    print(" ".join(counts))


if __name__ == "__main__":
    main(*sys.argv[1:])
