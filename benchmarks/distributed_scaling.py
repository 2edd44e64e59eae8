"""The search on several GPUs of one host: `torchrun --standalone --nproc-per-node N -m swcli search ...`
against the same command as one process, in one run on one machine, with CUDASW++4.0 on the same GPUs
(it takes every GPU it sees) for the side-by-side figure.

For each temperature, the commands run in turn (1 process, then N ranks, ...) after a warm-up of each,
against a database prepared once by `swcli makedb` (each rank memory-maps it). Two times per run: the
whole command (start-up included: Python, torch, the CUDA context, the engine's load, and torchrun's
own), and the search's own as `--stats` says it (queries read to output written, start-up excluded; the
merge of the ranks' hits included). The outputs are compared byte for byte with the one process's, and
the top scores at t = 0 with CUDASW++4.0's.

    python3 benchmarks/distributed_scaling.py QUERIES.fasta DB.fasta OUTDIR [--ranks 2] [--repeats 3]
            [--temperatures 0 1] [--gap -4] [--query-copies 1] [--backend cuda] [--peer .peer/peer-cudasw4]
            [--work DIR]

--query-copies N searches the queries N times over (ids suffixed), so that the search, not the start-up,
sets the time; the peer takes the same query file.

OUTDIR gets the JSON record (distributed_scaling.json); the TSVs and logs go to --work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_overhead import copied_fasta  # noqa: E402
from search_peer import compare_top, makedb, parse_peer_tsv, parse_swcli_tsv, run_peer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STATS = re.compile(r"^swcli: (\d[\d,]*) queries .*?: ([\d,]+) cells in ([\d.]+) s, ([\d,.]+) GCUPS; scoring calls "
                   r"([\d.]+) s", re.M)


def parse_stats(stderr: str) -> dict:
    """--stats' line: queries, cells, the search's seconds and GCUPS, and the (rank 0's) scoring calls."""
    found = STATS.search(stderr)
    if found is None:
        raise RuntimeError(f"no --stats line in: {stderr[-2000:]}")
    queries, cells, seconds, gcups, scoring = found.groups()
    return {"queries": int(queries.replace(",", "")), "cells": int(cells.replace(",", "")), "seconds": float(seconds),
            "gcups": float(gcups.replace(",", "")), "scoring_seconds": float(scoring)}


def run(command: list[str], env: dict) -> tuple[float, dict]:
    """(the whole command's seconds, its --stats) of a command that must succeed."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-3000:]}")
    return seconds, parse_stats(done.stderr)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries")
    parser.add_argument("database", help="a FASTA file (prepared once by swcli makedb)")
    parser.add_argument("outdir")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gap", type=float, default=-4.0)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--query-copies", type=int, default=1)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--peer", default=".peer/peer-cudasw4", help="CUDASW++4.0's script ('' to skip)")
    parser.add_argument("--peer-timeout", type=float, default=420.0)
    parser.add_argument("--work", default="/tmp/distributed_scaling")
    args = parser.parse_args(argv)
    work, outdir = Path(args.work), Path(args.outdir)
    work.mkdir(parents=True, exist_ok=True)
    outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    folder = work / "db.swcli"
    queries = copied_fasta(args.queries, args.query_copies, work / "queries.fasta")
    record = {"queries": args.queries, "query_copies": args.query_copies, "database": args.database,
              "ranks": args.ranks, "gap": args.gap, "top": args.top, "backend": args.backend, "repeats": args.repeats,
              "makedb": makedb(args.database, folder)}
    print(f"makedb: {record['makedb']['message']}", flush=True)
    common = ["-m", "swcli", "search", queries, str(folder), "--gap", f"{args.gap:g}", "--top", str(args.top),
              "--backend", args.backend, "-q", "--stats"]
    record["runs"] = []
    for t in args.temperatures:
        commands = {
            "1 process": [sys.executable, *common, "-t", f"{t:g}"],
            f"{args.ranks} ranks": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                    str(args.ranks), *common, "-t", f"{t:g}"],
        }
        times: dict[str, list] = {name: [] for name in commands}
        outputs = {name: work / f"t{t:g}_{k}.tsv" for k, name in enumerate(commands)}
        for repeat in range(args.repeats + 1):  # the first round warms up (engine build, page cache)
            for name, command in commands.items():
                whole, said = run([*command, "-o", str(outputs[name])], env)
                if repeat:
                    times[name].append({"whole_seconds": whole, **said})
        reference = outputs["1 process"].read_bytes()
        identical = all(path.read_bytes() == reference for path in outputs.values())
        if not identical:
            sys.exit(f"t = {t:g}: the outputs differ ({', '.join(map(str, outputs.values()))})")
        one = times["1 process"]
        for name, runs in times.items():
            whole = statistics.median(r["whole_seconds"] for r in runs)
            search = statistics.median(r["seconds"] for r in runs)
            entry = {"t": t, "command": name, "runs": runs, "whole_seconds": whole, "search_seconds": search,
                     "cells": runs[0]["cells"], "search_gcups": runs[0]["cells"] / search / 1e9,
                     "whole_speedup": statistics.median(r["whole_seconds"] for r in one) / whole,
                     "search_speedup": statistics.median(r["seconds"] for r in one) / search,
                     "output_identical": identical, "tsv": str(outputs[name])}
            record["runs"].append(entry)
            print(f"t = {t:g}, {name}: whole command {whole:.2f} s (x {entry['whole_speedup']:.2f}), search "
                  f"{search:.3f} s (x {entry['search_speedup']:.2f}, {entry['search_gcups']:,.1f} GCUPS)", flush=True)
    if args.peer:
        print(f"peer: {args.peer} on every visible GPU ...", flush=True)
        peer_work = work / "peer"
        peer_work.mkdir(exist_ok=True)
        record["cudasw4"] = run_peer(args.peer, queries, args.database, peer_work, args.peer_timeout,
                                     (args.gap, args.gap))
        exact = next((r for r in record["runs"] if r["t"] == 0 and r["command"] == "1 process"), None)
        if exact is not None and record["cudasw4"].get("tsv"):
            peer_top, bad = parse_peer_tsv(Path(record["cudasw4"]["tsv"]).read_text(errors="replace"))
            ours = parse_swcli_tsv(Path(exact["tsv"]).read_text(), args.top)
            record["top_scores"] = {"queries": len(ours), "mismatches": compare_top(ours, peer_top),
                                    "peer_unparsed_lines": bad}
    (outdir / "distributed_scaling.json").write_text(json.dumps(record, indent=1) + "\n")
    print()
    print("| t | command | whole command | x 1 process | search (--stats) | x 1 process | search GCUPS |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in record["runs"]:
        print(f"| {r['t']:g} | {r['command']} | {r['whole_seconds']:.2f} s | {r['whole_speedup']:.2f} | "
              f"{r['search_seconds']:.3f} s | {r['search_speedup']:.2f} | {r['search_gcups']:,.1f} |")
    peer = record.get("cudasw4")
    if peer is not None:
        print(f"| 0 | CUDASW++4.0, its makedb | - | - | {peer.get('total_seconds')} s | - | "
              f"{peer.get('total_gcups')} |")
        if "top_scores" in record:
            mismatched = len(record["top_scores"]["mismatches"])
            print(f"\ntop-{args.top} scores at t = 0 against CUDASW++4.0: "
                  f"{record['top_scores']['queries'] - mismatched}/{record['top_scores']['queries']} queries identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
