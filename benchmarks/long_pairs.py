"""Long pairs on CUDA by tiles (kernels/cuda/long_pairs.cu) beside one warp per pair, in one run.

1. One 35,000 x 35,000 pair and one 12,000 x 10,000 pair of random proteins (uniform over the 20 amino acids,
   seeded; BLOSUM62, linear gap -4; dense float32 S gathered on the GPU, 4.9 GB and 0.48 GB): the forward by
   tiles (what the op takes for them) and by one warp per pair (lane_columns 1: what it took before tiles), at
   t = 1 and t = 0. For 12,000 x 10,000 also forward + backward by tiles and by the DP table on one warp, with
   their ratio to the forward by tiles alone. The t = 0 scores of both paths are checked equal, and the t = 1
   ones are printed with their difference.
2. The limits of the automatic choice (kernels/cuda/ops.cpp, tiles_take: at most 256 pairs, both sides at least
   256, at least 2^20 cells): the forward at t = 1 by tiles and by one warp per pair, for B pairs of M x N of
   random normal scores on both sides of them.

Times are medians of CUDA-event intervals over --repeats calls after warm-up calls (one call, after one, for
the one-warp sweeps of the 35,000 pair, which take seconds); GCUPS = cells / s / 1e9. Prints markdown tables;
--out writes the figures as JSON. Needs a CUDA GPU with about 12 GB free.

    python3 benchmarks/long_pairs.py [--out FILE] [--repeats 5] [--skip-limits]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from swcli import ops
from swcli.bench import cuda_seconds
from swcli.testing import BLOSUM62

GAP = -4.0
TILES = ops.LANE_COLUMNS_TILES
LIMIT_CASES = [(B, M, N) for B in (1, 16, 64, 256, 512) for M, N in ((512, 512), (1024, 1024), (2048, 2048))]
LIMIT_CASES += [(1, 256, 4096), (1, 128, 8192), (16, 256, 4096), (1, 4096, 256)]


def protein_scores(M: int, N: int, seed: int) -> torch.Tensor:
    """(1, M, N) float32 BLOSUM62 scores of two random proteins, gathered on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    alphabet = [BLOSUM62.alphabet.index(a) for a in "ACDEFGHIKLMNPQRSTVWY"]
    letters = torch.tensor(alphabet, device="cuda")
    query = letters[torch.randint(0, 20, (M,), device="cuda", generator=g)]
    target = letters[torch.randint(0, 20, (N,), device="cuda", generator=g)]
    table = torch.tensor(np.asarray(BLOSUM62), dtype=torch.float32, device="cuda")
    return table[query[:, None], target[None, :]].unsqueeze(0).contiguous()


def seconds(run, repeats: int, slow: bool = False) -> float:
    return cuda_seconds(run, 1, warmup=1) if slow else cuda_seconds(run, repeats, warmup=2)


def long_pair_rows(M: int, N: int, repeats: int, gradient: bool) -> list[dict]:
    swcli_ops = torch.ops.swcli
    S = protein_scores(M, N, seed=M + N)
    cells = M * N
    ones = torch.ones(1, device="cuda")
    rows = []

    def row(path: str, t: float, s: float, note: str = "") -> None:
        rows.append({"workload": f"{M:,} x {N:,}", "path": path, "temperature": t, "seconds": s,
                     "gcups": cells / s / 1e9, "note": note})

    def forward_backward(t: float, lanes: int) -> None:
        _, state, best, failed = swcli_ops.forward(S, None, None, GAP, t, False, lane_columns=lanes)
        swcli_ops.backward(ones, S, state, best, failed, None, None, GAP, t, False, lane_columns=lanes)

    for t in (1.0, 0.0):
        by_tiles = swcli_ops.scores(S, None, None, GAP, t)  # the op's own choice
        one_warp = swcli_ops.scores(S, None, None, GAP, t, lane_columns=1)
        if t == 0:
            assert torch.equal(by_tiles, one_warp), (by_tiles.item(), one_warp.item())
        forward = seconds(lambda: swcli_ops.scores(S, None, None, GAP, t), repeats)
        row("tiles", t, forward, f"forward; score {by_tiles.item():.6g}")
        slow = cells > 5e8
        row("one warp", t, seconds(lambda: swcli_ops.scores(S, None, None, GAP, t, lane_columns=1), repeats, slow),
            f"forward, lane_columns 1; score {one_warp.item():.6g} (difference {by_tiles.item() - one_warp.item():.3g})")
        if gradient:
            both = seconds(lambda: forward_backward(t, 0), repeats)
            row("tiles", t, both, f"forward + backward: {both / forward:.2f}x the forward")
            table = seconds(lambda: forward_backward(t, 1), repeats, slow=True)
            row("one warp", t, table, f"forward + backward by the DP table: {table / forward:.2f}x the forward by tiles")
    return rows


def limit_rows(repeats: int) -> list[dict]:
    swcli_ops = torch.ops.swcli
    rows = []
    for B, M, N in LIMIT_CASES:
        S = torch.randn(B, M, N, device="cuda", generator=torch.Generator(device="cuda").manual_seed(B + M + N))
        tiles = seconds(lambda: swcli_ops.scores(S, None, None, -1.0, 1.0, lane_columns=TILES), repeats)
        one_warp = seconds(lambda: swcli_ops.scores(S, None, None, -1.0, 1.0, lane_columns=1), repeats)
        # the op's choice: its forward's state is the tiles' where it takes them
        state = swcli_ops.forward(S, None, None, -1.0, 1.0, False)[1].numel()
        takes = state == swcli_ops.forward(S, None, None, -1.0, 1.0, False, lane_columns=TILES)[1].numel()
        rows.append({"B": B, "M": M, "N": N, "tiles": tiles, "one_warp": one_warp,
                     "gcups_tiles": B * M * N / tiles / 1e9, "gcups_one_warp": B * M * N / one_warp / 1e9,
                     "op_takes_tiles": takes})
        del S
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-limits", action="store_true", help="only the two long pairs")
    args = parser.parse_args()
    ops.load_engine("cuda")
    machine = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(machine)
    rows = long_pair_rows(12_000, 10_000, args.repeats, gradient=True)
    rows += long_pair_rows(35_000, 35_000, args.repeats, gradient=False)
    torch.cuda.empty_cache()
    print("\n| pair | path | t | time | GCUPS | note |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['workload']} | {r['path']} | {r['temperature']:g} | {r['seconds'] * 1e3:,.2f} ms | "
              f"{r['gcups']:,.1f} | {r['note']} |")
    limits = [] if args.skip_limits else limit_rows(args.repeats)
    if limits:
        print("\n| B | M x N | by tiles | one warp per pair | tiles / one warp | the op takes |\n"
              "| ---: | --- | ---: | ---: | ---: | --- |")
        for r in limits:
            print(f"| {r['B']} | {r['M']} x {r['N']} | {r['tiles'] * 1e3:,.3f} ms ({r['gcups_tiles']:,.1f} GCUPS) | "
                  f"{r['one_warp'] * 1e3:,.3f} ms ({r['gcups_one_warp']:,.1f} GCUPS) | {r['tiles'] / r['one_warp']:.2f} | "
                  f"{'tiles' if r['op_takes_tiles'] else 'one warp'} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "rows": rows, "limits": limits}, f, indent=1)


if __name__ == "__main__":
    main()
