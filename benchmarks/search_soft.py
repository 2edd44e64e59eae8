"""The soft search kernel (kernels/cuda/search_soft.cu) block by block: its GCUPS for each length class,
beside the exact 16-bit kernel at t = 0 and the general op's sweep from codes at t = 1 on the same blocks,
the pairs it flags, and its accuracy against float64, on one GPU.

The database: mutated copies of real proteins (35% substitutions, 5% indels, as the search benchmark's
make-db), cut into blocks of targets of one length class each: up to 64, 128, 192, 256, 384, 512, 768,
1024 columns, then 1,025 to 2,048. Queries:
real proteins of QUERY_LENGTHS residues (cut from longer ones). Each row: one query against one block,
the median of REPEATS CUDA-event timings of the scoring call alone, cells = query length x the block's
residues (not its padding).

    python3 benchmarks/search_soft.py PROTEINS.fasta [--json OUT.json] [--repeats 5] [--gaps linear|affine]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch

CLASSES = [(1, 64), (65, 128), (129, 192), (193, 256), (257, 384), (385, 512), (513, 768), (769, 1024),
           (1025, 2048)]
QUERY_LENGTHS = [150, 500, 2000]
AA = "ARNDCQEGHILKMFPSTWYV"


def mutate(rng: random.Random, s: str) -> str:
    out = []
    for c in s:
        r = rng.random()
        if r < 0.025:
            continue
        if r < 0.05:
            out.append(rng.choice(AA))
        out.append(rng.choice(AA) if rng.random() < 0.35 else c)
    return "".join(out) or "A"


def class_block(rng: random.Random, proteins: list[str], low: int, high: int, residues: int, matrix, device):
    """Targets with lengths in [low, high], longest first, about `residues` residues: mutated copies of
    the proteins, cut or joined to a length drawn in the class."""
    pool = "".join(proteins)
    targets, total = [], 0
    while total < residues:
        length = rng.randint(low, high)
        start = rng.randrange(0, len(pool) - length)
        targets.append(mutate(rng, pool[start:start + length])[:high] or "A")
        total += len(targets[-1])
    targets.sort(key=len, reverse=True)
    width = len(targets[0])
    codes = torch.zeros((len(targets), width), dtype=torch.uint8)
    for b, s in enumerate(targets):
        codes[b, :len(s)] = torch.tensor(list(matrix.encode(s, lambda: "target")), dtype=torch.uint8)
    lengths = torch.tensor([len(s) for s in targets], dtype=torch.int64)
    return codes.to(device), lengths.to(device), total


def timed(call, repeats: int) -> float:
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("proteins")
    parser.add_argument("--json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gaps", choices=("linear", "affine"), default="linear")
    parser.add_argument("--residues", type=int, default=4_000_000, help="residues a block")
    args = parser.parse_args(argv)

    from swcli.fasta import read_fasta
    from swcli.ops import load_engine, score_checked_codes, soft_smith_waterman
    from swcli.scoring import load_matrix
    from swcli.search import Block, ExactSearch, SoftSearch

    device = torch.device("cuda")
    load_engine("cuda")
    matrix = load_matrix("BLOSUM62")
    S = matrix.tensor(device=device)
    gaps = ({"gap": -4.0, "gap_open": None, "gap_extend": None} if args.gaps == "linear"
            else {"gap": None, "gap_open": -11.0, "gap_extend": -1.0})
    op_gaps = {} if gaps["gap"] is not None else {"gap_open": gaps["gap_open"], "gap_extend": gaps["gap_extend"]}
    soft = SoftSearch.of(S, 1.0, **gaps)
    exact = ExactSearch.of(S, 0.0, **gaps)
    proteins = [r.sequence for r in read_fasta(args.proteins) if set(r.sequence) <= set(AA)]
    rng = random.Random(0)
    queries = []
    for length in QUERY_LENGTHS:
        source = rng.choice([p for p in proteins if len(p) >= min(length, max(map(len, proteins)))])
        while len(source) < length:
            source += rng.choice(proteins)
        queries.append(torch.tensor(list(matrix.encode(source[:length], lambda: "query")), dtype=torch.uint8,
                                    device=device))
    rows = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gaps {args.gaps}, {args.residues:,} residues a "
          f"block, median of {args.repeats}", flush=True)
    print("| targets | width | query | soft t=1 GCUPS | flagged | op t=1 GCUPS | exact t=0 GCUPS | max rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for low, high in CLASSES:
        codes, lengths, residues = class_block(rng, proteins, low, high, args.residues, matrix, device)
        block = Block(codes, lengths, torch.zeros_like(lengths))
        for query in queries:
            cells = len(query) * residues
            soft_seconds = timed(lambda: soft.scores(query, block), args.repeats)
            scores, flagged = soft.scores(query, block)
            op_seconds = timed(lambda: score_checked_codes(query.expand(len(lengths), -1), codes, S, gaps["gap"], 1.0,
                                                           None, lengths, "cuda", **op_gaps), args.repeats)
            exact_seconds = timed(lambda: exact.scores(query, block), args.repeats) if exact is not None else None
            # accuracy on a sample of the block, against float64 dense scores
            sample = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(1))[:32].to(device)
            width = int(lengths[sample].max())
            dense = S.double()[query.long()[None, :, None], codes[sample, :width].long()[:, None, :]]
            reference = soft_smith_waterman(dense, gaps["gap"], 1.0, None, lengths[sample], **op_gaps)
            kept = scores[sample] >= 0
            error = ((scores[sample][kept].double() - reference[kept]).abs() / reference[kept]).max().item()
            row = {"class": [low, high], "width": int(codes.shape[1]), "targets": len(lengths), "residues": residues,
                   "query": len(query), "soft_seconds": soft_seconds, "soft_gcups": cells / soft_seconds / 1e9,
                   "flagged": int(flagged.item()), "op_seconds": op_seconds, "op_gcups": cells / op_seconds / 1e9,
                   "exact_seconds": exact_seconds,
                   "exact_gcups": cells / exact_seconds / 1e9 if exact_seconds else None, "max_relative_error": error}
            rows.append(row)
            exact_text = f"{row['exact_gcups']:,.0f}" if exact_seconds else "-"
            print(f"| {low}-{high} | {row['width']} | {len(query)} | {row['soft_gcups']:,.0f} | {row['flagged']} | "
                  f"{row['op_gcups']:,.0f} | {exact_text} | {error:.1e} |", flush=True)
    total_cells = sum(r["query"] * r["residues"] for r in rows)
    summary = {"soft_gcups": total_cells / sum(r["soft_seconds"] for r in rows) / 1e9,
               "op_gcups": total_cells / sum(r["op_seconds"] for r in rows) / 1e9,
               "max_relative_error": max(r["max_relative_error"] for r in rows),
               "flagged": sum(r["flagged"] for r in rows)}
    print(f"all rows: soft {summary['soft_gcups']:,.0f} GCUPS, op {summary['op_gcups']:,.0f} GCUPS, flagged "
          f"{summary['flagged']}, largest relative error {summary['max_relative_error']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "gaps": args.gaps,
                       "date": time.strftime("%Y-%m-%d"), "rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
