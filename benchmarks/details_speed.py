"""What --format-output's details cost in a search: `swcli search` with the default columns against all 21
columns, the same queries and database, on whatever device torch sees (or --backend).

    python3 benchmarks/details_speed.py QUERIES DATABASE [--top 10] [--repeats 3] [--backend auto]
            [--gap -4 | --gap-open -12 --gap-extend -1] [-t 0]

DATABASE: a FASTA file or a makedb folder. Both runs go through search.run_search in this process after
a warm-up (the engine built, the database read once); E-values use fixed lambda and K (their estimation
is once per setting, cached, and timed apart: `estimate` in the table for affine gaps). Prints the
medians and the ratio (all columns / score only).
"""

from __future__ import annotations

import argparse
import os
import statistics as stats_module
import time

import torch

from swcli import _host
from swcli.details import COLUMNS, Formatter
from swcli.pipeline import Settings
from swcli.scoring import load_matrix
from swcli.search import run_search
from swcli.statistics import KarlinAltschul


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("queries")
    parser.add_argument("database")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--gap", type=float, default=None)
    parser.add_argument("--gap-open", type=float, default=None)
    parser.add_argument("--gap-extend", type=float, default=None)
    parser.add_argument("-t", "--temperature", type=float, default=0.0)
    args = parser.parse_args()
    backend = args.backend if args.backend != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gap = args.gap if args.gap_open is None else None
    settings = Settings(load_matrix("BLOSUM62"), -4.0 if gap is None and args.gap_open is None else gap,
                        args.temperature, backend, gap_open=args.gap_open, gap_extend=args.gap_extend)
    _host.load()
    everything = Formatter(tuple(COLUMNS), settings, KarlinAltschul(0.267, 0.041, "given"), torch.get_num_threads())
    rows = {}
    for name, formatter in (("score only", None), ("all 21 columns", everything)):
        run_search(args.queries, args.database, settings, os.devnull, top=args.top, formatter=formatter)  # warm-up
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            run_search(args.queries, args.database, settings, os.devnull, top=args.top, formatter=formatter)
            times.append(time.perf_counter() - started)
        rows[name] = stats_module.median(times)
    if settings.gap_open is not None:
        from swcli.statistics import estimate

        started = time.perf_counter()
        estimate(settings)
        rows["estimate (once per setting)"] = time.perf_counter() - started
    device = torch.cuda.get_device_name() if backend == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"| {device}, {settings.gaps.describe()}, t = {args.temperature:g}, top {args.top} | seconds |")
    print("| --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} |")
    ratio = rows["all 21 columns"] / rows["score only"]
    print(f"\nall columns / score only: {ratio:.3f} ({ratio - 1:+.1%})")


if __name__ == "__main__":
    main()
