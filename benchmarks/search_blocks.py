"""How the search cuts its database into blocks and which blocks its kernels take, measured: the
scoring time of CUDASW++4.0's 20 queries against a database.

At t = 0 (the exact kernel): blocks cut by cells alone (every target takes the lanes a group of its
block's widest), or also at the kernel's tile classes once a block fills the GPU FILL_WAVES times
(block_bounds). At t = 1
(the soft kernel, blocks by cells alone): queries longer than SoftSearch.MAX_QUERY take the op's sweep,
for several limits (none: the kernel takes every query).

Each of these for every block size (--max-cells: padded target residues a block, Searcher's max_cells):
a launch per block and query, whose last wave of warps leaves SMs idle, so fewer and larger blocks leave
less idle; since each warp takes the columns its own targets need, a larger block costs memory (its codes
padded to its widest target) and, where it spans tile classes, its narrower targets' lanes, not columns.
(The soft kernel's warps take a block's targets end to end, whole lanes each.) --soft-drops sets how far
below its upper limit U a rescaled segment of the soft kernel lands (SoftSearch.DROP, in bits: the
larger, the fewer rescales where the sums grow along the query, as far as the plan's floor allows; where
it does not, the op's sweep takes the search, which the row says). --streams runs every setting with
that many streams taking a query's launches in turn (Searcher.STREAMS; 1: one stream, each launch's last
wave alone on the GPU).

For each setting: the blocks, the padded cells over the cells (what the tiles sweep, were the kernel to
take every block), and the CUDA-event time of the scoring calls over the 20 queries (Searcher.step, as
the search runs them; the second of two passes), and the pairs a search kernel flagged and the general op
scored again (both passes; their time is in the kernel time).

    python3 benchmarks/search_blocks.py QUERIES.fasta DB.fasta [--gaps linear|affine] [--waves 0 1 2]
                                        [--max-queries 1000 0] [--max-cells 16777216 67108864]
                                        [--soft-drops 24 40] [--streams 1 2]
    (max-queries 0: no limit)
"""

from __future__ import annotations

import argparse
import math
import sys

import torch


def swept_columns(lengths, start: int, stop: int, shapes, targets_per_group: int, step: int,
                  fewest: int = 16) -> int:
    """Columns a search kernel sweeps for a block: the launch's lanes a group G by the block's widest target
    (its first), then each warp (32 / G groups of targets_per_group targets) its tiles of warp_columns
    columns a lane (past one tile, at least `fewest`)."""
    from swcli.search import warp_columns

    G, most = next(((g, r) for g, r in shapes if int(lengths[start]) <= g * r), shapes[-1])
    per_warp = targets_per_group * (32 // G)
    total = 0
    for first in range(start, stop, per_warp):
        widest = int(lengths[first])  # longest first
        if widest == 0:
            break  # the rest are empty: their warps take no tile
        tile = G * warp_columns(G, widest, most, step, fewest)
        total += min(per_warp, stop - first) * math.ceil(widest / tile) * tile
    return total


def padded_cells(searcher, query_lengths) -> tuple[int, int]:
    """(cells swept by the tiles, cells) summed over the queries; the op's sweep (no search kernel) counts
    the cells alone."""
    from swcli.search import ExactSearch, SoftSearch

    kernel = searcher.kernel
    cells = int(searcher.lengths.sum()) * sum(query_lengths)
    if kernel is None:
        return cells, cells
    lengths = searcher.lengths
    if kernel is searcher.soft:  # whole lanes a target (a warp's last tile pads too: not counted here)
        columns = SoftSearch.COLUMNS[kernel.settings["affine"]]
        return int(-(-lengths // columns).sum()) * columns * sum(query_lengths), cells
    shapes, per_group, step, fewest = ExactSearch.SHAPES[kernel.affine], 2, 2, 16
    padded = sum(swept_columns(lengths, start, stop, shapes, per_group, step, fewest)
                 for start, stop in searcher.bounds)
    return padded * sum(query_lengths), cells


def kernel_seconds(searcher, queries) -> float:
    seconds = 0.0
    for _ in range(2):  # the first pass warms up
        seconds, pending = 0.0, None
        for codes in [*queries, None]:
            pending, done = searcher.step(codes, pending)
            if done is not None:
                seconds += done[1]
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries")
    parser.add_argument("database")
    parser.add_argument("--gaps", choices=("linear", "affine"), default="linear")
    parser.add_argument("--waves", type=float, nargs="*", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--max-queries", type=int, nargs="*", default=[1000, 2000, 0])
    parser.add_argument("--max-cells", type=int, nargs="*", default=None, help="(default: the search's)")
    parser.add_argument("--soft-drops", type=int, nargs="*", default=None,
                        help="SoftSearch.DROP for the t = 1 settings (default: the class's)")
    parser.add_argument("--streams", type=int, nargs="*", default=None,
                        help="Searcher.STREAMS, the streams that take a query's launches in turn, for every "
                             "setting (default: the class's)")
    args = parser.parse_args(argv)

    from swcli import database
    from swcli.fasta import read_fasta
    from swcli.ops import load_engine
    from swcli.scoring import load_matrix
    from swcli.search import DEFAULT_MAX_CELLS, ExactSearch, Searcher, SoftSearch

    device = torch.device("cuda")
    load_engine("cuda")
    matrix = load_matrix("BLOSUM62")
    db = database.build(read_fasta(args.database), matrix, args.database)
    queries = [matrix.encode(r.sequence, lambda: "query") for r in read_fasta(args.queries)]
    gaps = ({"gap": -4.0} if args.gaps == "linear" else {"gap": None, "gap_open": -11.0, "gap_extend": -1.0})
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {len(queries)} queries against "
          f"{len(db):,} sequences ({int(db.lengths.sum()):,} residues), BLOSUM62, gaps {args.gaps}")
    print("| t | max cells | setting | blocks | padded / cells | kernel time | kernel GCUPS | pairs scored again |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    chosen = (ExactSearch.FILL_WAVES, dict(SoftSearch.MAX_QUERY), SoftSearch.DROP)
    drops = args.soft_drops or [SoftSearch.DROP]
    settings = [(0.0, waves, None, None) for waves in [math.inf, *args.waves]]
    settings += [(1.0, None, limit, drop) for drop in drops for limit in args.max_queries]
    chosen_streams = Searcher.STREAMS
    for max_cells, t, waves, limit, drop, streams in (
            (max_cells, *setting, streams) for max_cells in args.max_cells or [DEFAULT_MAX_CELLS]
            for setting in settings for streams in args.streams or [Searcher.STREAMS]):
        Searcher.STREAMS = streams
        if waves is not None:
            ExactSearch.FILL_WAVES = 1e9 if waves == math.inf else waves
            label = "blocks by cells alone" if waves == math.inf else f"cut at classes, fill {waves:g}"
        else:
            SoftSearch.MAX_QUERY = {False: limit or None, True: limit or None}
            SoftSearch.DROP = drop
            label = (f"soft kernel for queries up to {limit:,} residues" if limit else
                     "soft kernel for every query")
            label += f", drop {drop}"
        if args.streams:
            label += f", {streams} stream{'s' if streams > 1 else ''}"
        searcher = Searcher(db, matrix.tensor(device=device), gaps.get("gap"), t, 10, "cuda", device, max_cells,
                            gap_open=gaps.get("gap_open"), gap_extend=gaps.get("gap_extend"))
        if t > 0 and searcher.soft is None:
            label += " (refused by the plan: the op's sweep)"
        swept, cells = padded_cells(searcher, [len(q) for q in queries])
        seconds = kernel_seconds(searcher, queries)
        print(f"| {t:g} | {max_cells:,} | {label} | {len(searcher.bounds)} | {swept / cells:.3f} | "
              f"{seconds:.3f} s | {cells / seconds / 1e9:,.1f} | {searcher.rescored:,} |", flush=True)
        ExactSearch.FILL_WAVES, SoftSearch.MAX_QUERY = chosen[0], dict(chosen[1])
        SoftSearch.DROP = chosen[2]
        Searcher.STREAMS = chosen_streams
    return 0


if __name__ == "__main__":
    sys.exit(main())
