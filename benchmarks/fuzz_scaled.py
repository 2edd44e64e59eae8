"""Fuzz of the scaled-space sweeps against float64 and against the log-space sweep, on random settings.

The CPU or CUDA engine's scaled sweep is checked against the float64 CPU engine over random shapes and
lengths, large scores, small temperatures and every gap; on CUDA, the codes path is also checked against
its own log-space sweep on protein pairs near the edge of the table of powers (2^(m c) <= 2^60: t down to
0.27 with BLOSUM62).

    python3 benchmarks/fuzz_scaled.py cpu [configurations [seed]]    # CPU engine, dense scores
    python3 benchmarks/fuzz_scaled.py cuda [configurations [seed]]   # CUDA: 4 and 1 columns per lane, dense and codes

Prints each configuration whose scaled result is further than 2e-6 (relative) from float64, with the
error of the float32 log-space sweep of 4-column lanes on the same input (float32's own drift), then a
summary line. On CUDA the 1-column log-space sweep is checked beside the scaled ones: it is what 1-column
lanes run wherever the scaled sweep does not apply.
"""

import random
import sys

import torch

from swcli.ops import load_engine
from swcli.testing import code_batch, random_protein_pairs, related_protein_pairs


def scores(S, qlen, tlen, gap, t, columns=0, scaled=True):
    """The engine's scores of S's device, through the operator with its knobs."""
    return torch.ops.swcli.scores(S, qlen, tlen, gap, t, lane_columns=columns, scaled=scaled)


def dense(engine: str, configurations: int, seed: int = 1) -> None:
    load_engine("cpu")
    cuda = engine == "cuda"
    if cuda:
        load_engine("cuda")
    rng = random.Random(seed)
    bad = beyond = worst = 0
    for trial in range(configurations):
        B = 1100 if cuda else rng.choice([1, 3, 17, 33, 64, 100])  # CUDA: enough pairs for 4 columns per lane
        M, N = rng.randint(1, 60 if cuda else 90), rng.randint(1, 140 if cuda else 130)
        t = rng.choice([0.05, 0.2, 0.4, 0.7, 1.0, 2.0, 10.0])
        gap = rng.choice([0.0, -0.1, -1.0, -4.0, -30.0])
        scale = rng.choice([0.1, 1.0, 5.0, 20.0])
        S = torch.randn(B, M, N, generator=torch.Generator().manual_seed(trial)) * scale
        q = torch.randint(0, M + 1, (B,), generator=torch.Generator().manual_seed(trial + 1))
        tl = torch.randint(0, N + 1, (B,), generator=torch.Generator().manual_seed(trial + 2))
        if cuda:  # the scaled sweeps of 4-column lanes and of 1-column lanes (one scale per warp, pairs of
            # one column tile; wider pairs take the 1-column log-space cell, checked on its own as well)
            def on_cuda(columns, sweep):
                return scores(S.cuda(), q.cuda(), tl.cuda(), gap, t, columns, sweep).cpu()
            scaled = {"4 columns": on_cuda(4, True), "1 column": on_cuda(1, True),
                      "1 column, log space": on_cuda(1, False)}
            log = on_cuda(4, False)
        else:
            scaled = {"": scores(S, q, tl, gap, t)}
            log = scores(S, q, tl, gap, t, scaled=False)
        exact = scores(S.double(), q, tl, gap, t, scaled=False)
        log_error = ((log.double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
        for name, out in scaled.items():
            error = ((out.double() - exact).abs() / exact.abs().clamp_min(1)).max().item()
            absolute = (out.double() - exact).abs().max().item()
            worst = max(worst, error)
            if error > 2e-6:
                bad += 1
                beyond += error > 2 * log_error
                print(f"trial {trial}: B={B} M={M} N={N} t={t} gap={gap} scale={scale} {name}: {error:.2e} "
                      f"(the log-space sweep: {log_error:.2e}); absolute {absolute:.2e}, scores up to "
                      f"{exact.abs().max().item():.3g}", flush=True)
    print(f"{engine} dense: {configurations} configurations, worst relative error {worst:.2e}, {bad} sweeps past "
          f"2e-6, {beyond} of them past 2x the log-space sweep's error")


def codes_near_the_cap() -> None:
    load_engine("cuda")
    pairs = related_protein_pairs(seed=1, count=900, min_length=20, max_length=400)
    pairs += random_protein_pairs(seed=2, count=300, min_length=5, max_length=400)
    query, target, qlen, tlen, matrix = code_batch(pairs, device="cuda")
    qlen, tlen, matrix = qlen.cuda(), tlen.cuda(), matrix.cuda()
    for t in (0.27, 0.3, 0.4, 0.5, 1.0):
        for gap in (-1.0, -4.0, -11.0):
            scaled = torch.ops.swcli.scores_codes(query, target, matrix, qlen, tlen, gap, t, lane_columns=4,
                                                  scaled=True).double()
            log = torch.ops.swcli.scores_codes(query, target, matrix, qlen, tlen, gap, t, lane_columns=4,
                                               scaled=False).double()
            error = ((scaled - log).abs() / log.abs().clamp_min(1)).max().item()
            print(f"cuda codes BLOSUM62 t={t} gap={gap}: {error:.2e}" + ("  past 2e-6" if error > 2e-6 else ""))


if __name__ == "__main__":
    engine = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    dense(engine, int(sys.argv[2]) if len(sys.argv) > 2 else 300, int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    if engine == "cuda":
        codes_near_the_cap()
