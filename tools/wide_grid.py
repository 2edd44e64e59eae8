"""How many pairs the CUDA codes kernel sends to log space with 8 columns per lane, by t and gap, and the
batch's time against 4 columns: the measurements behind kWideLimit and kScaledTopWide
(kernels/sw_cuda.cu, docs/benchmarks/h200.md, ninth record).

The kernel takes 8 columns only inside its limits, so run this in a tree where they are lifted, built by
tools/variants.sh on the GPU machine:

    mkdir -p .var/forced && git archive HEAD | tar -x -C .var/forced && cp -r .bench .var/forced/
    sed -i 's/kWideBias = 20;/kWideBias = 1000;/; s/kWideLimit = 32.0f;/kWideLimit = 1000.0f;/' \\
        .var/forced/kernels/sw_cuda.cu
    (device) WORKLOAD=none tools/variants.sh .var/forced && cd .var/forced && \\
        PYTHONPATH=/tmp/site:$PWD SWCLI_CACHE_DIR=/tmp/variants-cache/forced python3 tools/wide_grid.py

Per setting: log2 of the largest P (rounded up, as the kernel's bias) + 2 log2(1 / G), the pairs in log
space with 8 and 4 columns of 10,000 real pairs (.bench/proteins.fasta), of 1,000 related pairs and of
200 self-alignments, and the real batch's time with 8 columns over its time with 4.
"""

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from swcli._build import cuda_engine  # noqa: E402
from swcli.bench import cuda_seconds, log_space_pairs, real_batch  # noqa: E402
from swcli.fasta import read_fasta  # noqa: E402
from testing import code_batch, related_protein_pairs  # noqa: E402


def main() -> None:
    engine = cuda_engine()
    batch, table = real_batch(list(read_fasta(str(ROOT / ".bench/proteins.fasta"))), 10_000, "cuda")
    real = (batch.query_codes, batch.target_codes, batch.query_lengths, batch.target_lengths)

    def codes_of(pairs):
        query, target, qlen, tlen, matrix = code_batch(pairs, device="cuda")
        return (query, target, qlen.cuda(), tlen.cuda()), matrix.float().cuda()

    related, matrix = codes_of(related_protein_pairs(seed=3, count=1000, min_length=20, max_length=1500))
    selves, _ = codes_of([(q, q) for q, _ in related_protein_pairs(seed=9901, count=200, min_length=300,
                                                                   max_length=1500)])
    for t in (0.8, 0.9, 1.0, 1.2, 1.5):
        c = 1.4426950408889634 / t
        for gap in (-2.0, -4.0, -6.0, -8.0, -11.0):
            key = math.floor(11 * c) + 1 - 2 * gap * c  # BLOSUM62's largest entry is 11

            def in_log_space(codes, m, lanes):
                return log_space_pairs(lambda counter: engine.forward_codes(*codes, m, gap, t, lanes, True, counter))

            real8, real4 = in_log_space(real, table, 8), in_log_space(real, table, 4)
            related8, selves8 = in_log_space(related, matrix, 8), in_log_space(selves, matrix, 8)
            t8, t4 = (cuda_seconds(lambda lanes=lanes: engine.forward_codes(*real, table, gap, t, lanes, True, None),
                                   3, warmup=1) for lanes in (8, 4))
            print(f"t={t} gap={gap} key={key:.1f}: real 8 columns {real8}, 4 columns {real4}; related {related8}; "
                  f"self-alignments {selves8}; time 8/4 {t8 / t4:.3f}", flush=True)


if __name__ == "__main__":
    main()
