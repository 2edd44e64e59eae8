"""What --format-output's details cost in a search: `swcli search` with the default columns against all 21
columns, and all 21 columns with the hits ranked by E-value (--rank evalue), the same queries and
database, on whatever device torch sees (or --backend).

    python3 benchmarks/details_speed.py QUERIES DATABASE [--top 10] [--repeats 3] [--backend auto]
            [--gap -4 | --gap-open -12 --gap-extend -1] [-t 0]

DATABASE: a FASTA file or a makedb folder. Every run goes through search.run_search in this process after
a warm-up (the engine built, the database read once), the three kinds in turn in each repeat, so that a
change in the machine's load falls on all of them; E-values use fixed lambda, K, alpha and beta (BLAST's
for BLOSUM62 11/1; their estimation is once per setting, cached, and timed apart: `estimate` in the table
for affine gaps). Prints the medians of the wall-clock time and of the process's CPU time (every thread:
the scoring, the tracebacks), and their ratios to the score-only run: on a shared machine the CPU time
is the steadier measure of the work the details add.
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
    given = KarlinAltschul(0.267, 0.041, "given", 1.9, -30.0)
    everything = Formatter(tuple(COLUMNS), settings, given, torch.get_num_threads())
    kinds = {"score only": (None, None), "all 21 columns": (everything, None),
             "all 21 columns, --rank evalue": (everything, given)}
    times = {name: [] for name in kinds}
    cpu_times = {name: [] for name in kinds}
    for repeat in range(args.repeats + 1):  # the first: the warm-up
        for name, (formatter, rank) in kinds.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            run_search(args.queries, args.database, settings, os.devnull, top=args.top, formatter=formatter, rank=rank)
            if repeat:
                times[name].append(time.perf_counter() - started)
                cpu_times[name].append(time.process_time() - cpu_started)
    rows = {name: stats_module.median(seconds) for name, seconds in times.items()}
    cpu = {name: stats_module.median(seconds) for name, seconds in cpu_times.items()}
    if settings.gap_open is not None:
        from swcli.statistics import estimate

        started = time.perf_counter()
        estimate(settings)
        rows["estimate (once per setting)"] = time.perf_counter() - started
    device = torch.cuda.get_device_name() if backend == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"| {device}, {settings.gaps.describe()}, t = {args.temperature:g}, top {args.top} | seconds | CPU seconds |")
    print("| --- | --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} | {cpu[name]:.3f} |" if name in cpu else f"| {name} | {seconds:.3f} | |")
    for name in ("all 21 columns", "all 21 columns, --rank evalue"):
        ratio, cpu_ratio = rows[name] / rows["score only"], cpu[name] / cpu["score only"]
        print(f"{name} / score only: {ratio:.3f} ({ratio - 1:+.1%}); CPU time {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()
