"""The cost of a distributed search's exchange per query, alone: the all-gather of each rank's best keys
and their merge (distributed.Group.send_keys and merged_keys), as `swcli search` does it per query.

    torchrun --standalone --nproc-per-node N benchmarks/distributed_exchange.py [--top 10] [--count 1000] [--warm-up 100]
             [--device cpu|cuda]

Rank 0 prints the median over 5 rounds of --count exchanges (after 100 for warm-up), in microseconds.
On cuda each rank uses cuda:LOCAL_RANK and the keys travel through NCCL; on cpu through gloo.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from swcli import distributed, launch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--warm-up", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if launch.find() is None:
        sys.exit("run it under torchrun: torchrun --standalone --nproc-per-node N benchmarks/distributed_exchange.py")
    group = distributed.start(mode="on")  # one rank too: its exchange is what is measured
    device = torch.device("cuda") if args.device == "cuda" else torch.device("cpu")
    keys = torch.arange(args.top, dtype=torch.int64, device=device)

    def exchange() -> None:
        group.merged_keys(group.send_keys(keys, None, None, args.top, False, device), None, args.top, False)

    for _ in range(args.warm_up):
        exchange()
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(args.count):
            exchange()
        rounds.append((time.perf_counter() - started) / args.count)
    if group.leader:
        print(f"{group.size} ranks, {args.device}, top {args.top}: {statistics.median(rounds) * 1e6:.0f} us per "
              f"exchange (median of 5 x {args.count}; rounds {min(rounds) * 1e6:.0f}-{max(rounds) * 1e6:.0f} us)")


if __name__ == "__main__":
    main()
