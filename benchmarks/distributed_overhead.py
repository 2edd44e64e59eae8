"""What torchrun costs one search: `python3 -m swcli search ...` against the same command under
`torchrun --standalone --nproc-per-node 1 -m swcli search ...` (its one rank runs the plain command:
a process group of one would only cost time), whole commands, start-up included. A third row runs the
distributed path of one rank without torchrun (RANK=0, WORLD_SIZE=1, LOCAL_RANK=0 and a free
MASTER_PORT set by hand, with --distributed on), which shows what swcli's process group and its
exchanges would cost on top of the plain command.

    python3 benchmarks/distributed_overhead.py QUERIES DATABASE [--backend auto] [--repeats 5]
            [--copies N] [--query-copies N] [--top 10] [-t 1] [--work DIR]
    python3 benchmarks/distributed_overhead.py --bare-only [--repeats 5]

DATABASE: a FASTA file or a makedb folder. --copies N searches a database of N copies of the FASTA's
sequences (ids suffixed) and --query-copies N the queries N times over, so that the search, not the
start-up, sets the time: torchrun's own start-up (its agent imports torch, then starts the worker) is a
fixed cost of about a second, so the ratio says something only where the search takes tens of seconds.

The commands run in turn (plain, by hand, torchrun, plain, ...) after one warm-up of each, their outputs
are compared byte for byte (every run's), and the medians, their differences and ratios to the plain
command are printed as a markdown table. A second table (alone with --bare-only) times what torchrun
costs with nothing to run, beside the import of torch that its agent makes: the part of its cost that
no command it starts can save.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def copied_fasta(source: str, copies: int, target: Path) -> str:
    """`copies` copies of a FASTA file's records, the k-th copy's ids suffixed with .k (k > 0)."""
    if copies == 1:
        return source
    sys.path.insert(0, str(REPO))
    from swcli.fasta import read_fasta

    records = list(read_fasta(source))
    with open(target, "w") as out:
        for copy in range(copies):
            suffix = f".{copy}" if copy else ""
            out.writelines(f">{r.id}{suffix}\n{r.sequence}\n" for r in records)
    return str(target)


def residues(path: str) -> tuple[int, int]:
    """(records, residues) of a FASTA file or a makedb folder."""
    folder = Path(path)
    if (folder / "meta.json").is_file():
        import json

        meta = json.loads((folder / "meta.json").read_text())
        return meta["sequences"], meta["residues"]
    sys.path.insert(0, str(REPO))
    from swcli.fasta import read_fasta

    lengths = [len(r.sequence) for r in read_fasta(path)]
    return len(lengths), sum(lengths)


def timed(command: list[str], env: dict) -> float:
    if "MASTER_PORT" in env:  # one rank by hand: a port of its own each time
        env = {**env, "MASTER_PORT": str(free_port())}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return seconds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def machine(backend: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = f"{cpu}, {os.cpu_count()} cores"
    if backend == "cuda" or (backend == "auto" and torch.cuda.is_available()):
        where = f"{torch.cuda.get_device_name()}; {where}"
    return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


def bare_costs(repeats: int) -> None:
    """torchrun's start and exit around commands that take no time, beside `import torch` alone and
    swcli's start: each command once to warm up, then `repeats` runs, as a markdown table."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    commands = {
        "python3 -c 'import torch'": [sys.executable, "-c", "import torch"],
        "python3 -m swcli --help": [sys.executable, "-m", "swcli", "--help"],
        "torchrun --standalone --nproc-per-node 1 --no-python true": [*torchrun, "--no-python", "true"],
        "torchrun --standalone --nproc-per-node 1 -m swcli --help": [*torchrun, "-m", "swcli", "--help"],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    print(f"\n{repeats} runs each after a warm-up\n")
    print("| command | median s | min s | max s |")
    print("| --- | --- | --- | --- |")
    for name, command in commands.items():
        times = [timed(command, env) for _ in range(repeats + 1)][1:]
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries", nargs="?")
    parser.add_argument("database", nargs="?")
    parser.add_argument("--bare-only", action="store_true", help="only torchrun's cost with nothing to run")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--copies", type=int, default=1, help="database copies (a FASTA database)")
    parser.add_argument("--query-copies", type=int, default=1)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("-t", "--temperature", default="1")
    parser.add_argument("--work", default=None, help="folder for the copies and outputs (default: a temporary one)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.bare_only and args.queries is not None:
        parser.error("--bare-only runs no search: give no QUERIES or DATABASE")
    if args.bare_only:
        print(machine(args.backend))
        bare_costs(args.repeats)
        return
    if args.database is None:
        parser.error("QUERIES and DATABASE are needed unless --bare-only")
    work = Path(args.work or tempfile.mkdtemp(prefix="distributed_overhead."))
    work.mkdir(parents=True, exist_ok=True)
    if args.copies > 1 and (Path(args.database) / "meta.json").is_file():
        sys.exit("--copies copies a FASTA database; give the FASTA, not the makedb folder")
    database = copied_fasta(args.database, args.copies, work / "database.fasta")
    queries = copied_fasta(args.queries, args.query_copies, work / "queries.fasta")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    search = ["-m", "swcli", "search", queries, database, "--backend", args.backend, "--top", str(args.top),
              "-t", args.temperature, "-q"]
    by_hand = {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "0"}
    commands = {  # name: (command, environment, output)
        "plain": ([sys.executable, *search], env, "plain.tsv"),
        "one rank's process group, without torchrun": ([sys.executable, *search, "--distributed", "on"], by_hand,
                                                       "by_hand.tsv"),
        "torchrun, 1 process": ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "1", *search], env, "torchrun.tsv"),
    }
    reference = work / "plain.tsv"
    times: dict[str, list[float]] = {name: [] for name in commands}
    for repeat in range(args.repeats + 1):  # the first round warms up (engine build, page cache)
        for name, (command, environment, output) in commands.items():
            out = work / output
            seconds = timed([*command, "-o", str(out)], environment)
            if repeat:
                times[name].append(seconds)
            if out != reference and not filecmp.cmp(out, reference, shallow=False):
                sys.exit(f"the outputs differ: {out} and {reference}")
    query_count, query_residues = residues(queries)
    sequences, db_residues = residues(database)
    medians = {name: statistics.median(values) for name, values in times.items()}
    plain = medians["plain"]
    print(f"{machine(args.backend)}\n{query_count:,} queries ({query_residues:,} residues) x {sequences:,} "
          f"sequences ({db_residues:,} residues), --backend {args.backend}, -t {args.temperature}, top {args.top}; "
          f"{args.repeats} runs each after a warm-up, outputs identical\n")
    print("| command | median s | min s | max s | median - plain | median / plain |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, values in times.items():
        print(f"| {name} | {medians[name]:.2f} | {min(values):.2f} | {max(values):.2f} | "
              f"{medians[name] - plain:+.2f} s | {medians[name] / plain:.3f} |")
    bare_costs(args.repeats)


if __name__ == "__main__":
    main()
