"""Compare CUDA engine builds of several trees in one process, their calls interleaved, so that the
GPU's clock and temperature drift the same for all (run after tools/variants.sh has built them, on the
GPU machine). Separate processes one after another differed by up to 8% on an unchanged kernel.

    python3 tools/ab_engines.py ROUNDS CACHE_DIR...     # e.g. /tmp/variants-cache/main ...

Each round times every engine on each workload (median of 5 calls, CUDA events): the dense t = 1
forward (8192 x 256 x 256) and 10,000 real-length pairs from codes at t = 1. Prints, per engine, the
median over rounds and the range, and the ratio of medians to the first engine.
"""

import importlib.util
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
from swcli.bench import cuda_seconds, real_batch  # noqa: E402
from swcli.fasta import read_fasta  # noqa: E402


def load(cache_dir: str):
    """The built CUDA engine in cache_dir (one swcli_cuda_* folder), as a module of its own name."""
    (so,) = Path(cache_dir).glob("swcli_cuda_*/swcli_cuda_*.so")
    spec = importlib.util.spec_from_file_location(so.stem, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(rounds: int, cache_dirs: list[str]) -> None:
    engines = {Path(d).name: load(d) for d in cache_dirs}
    S = torch.randn(8192, 256, 256, device="cuda")
    batch, table = real_batch(list(read_fasta(str(ROOT / ".bench/proteins.fasta"))), 10_000, "cuda")
    workloads = {
        "dense t=1": (S.numel(), lambda e: e.forward(S, None, None, -1.0, 1.0, False, 0, True, None)),
        "real t=1": (batch.cells, lambda e: e.forward_codes(batch.query_codes, batch.target_codes,
                                                             batch.query_lengths, batch.target_lengths, table,
                                                             -4.0, 1.0, 0, True, None)),
    }
    times = {(w, name): [] for w in workloads for name in engines}
    for _ in range(rounds):
        for w, (_, call) in workloads.items():
            for name, engine in engines.items():
                times[w, name].append(cuda_seconds(lambda: call(engine), 5, warmup=2))
    first = next(iter(engines))
    for w, (cells, _) in workloads.items():
        base = statistics.median(times[w, first])
        for name in engines:
            t = times[w, name]
            median = statistics.median(t)
            print(f"{w:<10} {name:<12} {cells / median / 1e9:7.1f} GCUPS (median of {rounds} rounds; "
                  f"{cells / max(t) / 1e9:.1f} to {cells / min(t) / 1e9:.1f}), {median / base:.3f}x {first}'s time")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
