"""How many pairs the CUDA engine's scaled sweep sends to log space, by temperature and gap: 10,000 real
pairs from codes (BLOSUM62), then 8192 dense 64 x 64 pairs of random normal scores times 1, 3 and 10.
One line, to compare kernel variants (run it in each tree that tools/variants.sh built, with that tree's
SWCLI_CACHE_DIR). A pair in log space is correct but slower: a variant that holds less sends more.

    python3 tools/log_space_pairs.py
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
from swcli._build import cuda_engine  # noqa: E402
from swcli.bench import log_space_pairs, real_batch  # noqa: E402
from swcli.fasta import read_fasta  # noqa: E402


def main() -> None:
    engine = cuda_engine()
    batch, table = real_batch(list(read_fasta(str(ROOT / ".bench/proteins.fasta"))), 10_000, "cuda")
    counts = []
    for t in (0.27, 0.3, 0.4, 0.5, 1.0, 2.0):
        for gap in (-1.0, -4.0, -11.0):
            n = log_space_pairs(lambda counter: engine.forward_codes(
                batch.query_codes, batch.target_codes, batch.query_lengths, batch.target_lengths, table, gap, t,
                0, True, counter))
            counts.append(f"t={t}/g={gap:g}:{n}")
    S = torch.randn(8192, 64, 64, device="cuda")
    for scale in (1, 3, 10):
        for t in (0.3, 1.0):
            n = log_space_pairs(lambda counter: engine.forward(S * scale, None, None, -1.0, t, False, 4, True,
                                                               counter))
            counts.append(f"dense x{scale} t={t}:{n}")
    print(" ".join(counts))


if __name__ == "__main__":
    main()
