"""The benchmark harness behind `swcli bench`: kernel times, throughput (GCUPS) and the end-to-end rate.

GCUPS = real cells (sum of qlen * tlen) per second / 1e9. CPU times are host-clock medians (the CPU
engine is synchronous); CUDA times are medians of CUDA-event intervals around each call, after warm-up,
or of CUDA graph replays.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swcli import ops
from swcli._files import packaged_file
from swcli.errors import SwcliError
from swcli.fasta import FastaRecord, chunks_in_one_file, read_fasta
from swcli.output import TsvWriter, chunk_rows
from swcli.pipeline import Settings, Stats, align_chunks
from swcli.reference import soft_smith_waterman_reference
from swcli.scoring import load_matrix

SEED_SHAPE = (16, 32, 32)

# The affine rows' gaps: BLAST's default 11/1 under BLOSUM62, as scores (a gap of length k scores
# -12 - (k - 1)), timed beside the linear gap -4 on the same inputs.
AFFINE_GAPS = {"gap_open": -12.0, "gap_extend": -1.0}
AFFINE_NOTE = "affine gaps -12/-1 (BLAST's 11/1)"


@dataclass
class Row:
    workload: str
    backend: str
    temperature: float
    pairs: int
    cells: int  # real cells per run
    seconds: float  # median per run
    note: str = ""

    @property
    def skipped(self) -> bool:
        """A row that says why a measurement was not made (its note), with no time."""
        return self.seconds == 0

    @property
    def gcups(self) -> float:
        return 0.0 if self.skipped else self.cells / self.seconds / 1e9

    def record(self) -> dict:
        return {**asdict(self), "gcups": self.gcups}


def median_seconds(run, repeats: int) -> float:
    """Median host-clock time of run() after one warm-up call (the engine is synchronous on the CPU)."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def seed_rows(backend: str, repeats: int) -> list[Row]:
    S = torch.randn(*SEED_SHAPE)
    cells = SEED_SHAPE[0] * SEED_SHAPE[1] * SEED_SHAPE[2]
    engine = median_seconds(lambda: ops.soft_smith_waterman(S, backend=backend), repeats)
    reference = median_seconds(lambda: soft_smith_waterman_reference(S), min(repeats, 3))
    return [
        Row("seed B=16 32x32", backend, 1.0, SEED_SHAPE[0], cells, engine),
        Row("seed B=16 32x32", "reference", 1.0, SEED_SHAPE[0], cells, reference,
            f"engine is {reference / engine:,.0f}x faster"),
    ]


def dense_rows(backend: str, repeats: int) -> list[Row]:
    B, M, N = 256, 256, 256
    S = torch.randn(B, M, N)
    workload = f"random B={B} {M}x{N}"
    rows = [Row(workload, backend, t, B, B * M * N,
                median_seconds(lambda: ops.soft_smith_waterman(S, temperature=t, backend=backend), repeats))
            for t in (1.0, 0.0)]
    return rows + affine_dense_rows(backend, S, workload, rows[0], lambda run: median_seconds(run, repeats))


def affine_dense_rows(backend: str, S: torch.Tensor, workload: str, linear_forward: Row, seconds,
                      few_seconds=None) -> list[Row]:
    """Dense S with affine gaps at t = 1 through the op: the forward (beside linear_forward, the linear
    op's on the same S) and forward + backward through autograd (beside that forward); seconds(run) times
    one run, and few_seconds(run), if given, the slower forward + backward (with fewer calls)."""
    few_seconds = few_seconds or seconds
    B, M, N = S.shape
    cells = B * M * N
    forward = seconds(lambda: ops.soft_smith_waterman(S, temperature=1.0, backend=backend, **AFFINE_GAPS))
    grad_S = S.clone().requires_grad_()
    ones = torch.ones(B, device=S.device)

    def forward_backward():
        grad_S.grad = None
        ops.soft_smith_waterman(grad_S, temperature=1.0, backend=backend, **AFFINE_GAPS).backward(ones)

    both = few_seconds(forward_backward)
    ratio = (cells / forward) / (linear_forward.cells / linear_forward.seconds)
    return [
        Row(f"affine {workload}", backend, 1.0, B, cells, forward,
            f"{AFFINE_NOTE}, forward; {ratio:.2f}x the linear forward's GCUPS"),
        Row(f"affine {workload}", backend, 1.0, B, cells, both,
            f"{AFFINE_NOTE}, forward + backward: {both / forward:.2f}x the affine forward alone"),
    ]


def random_pairs(records: list[FastaRecord], count: int, seed: int = 0) -> list[tuple[FastaRecord, FastaRecord]]:
    rng = random.Random(seed)
    return [(rng.choice(records), rng.choice(records)) for _ in range(count)]


def real_batch(records: list[FastaRecord], count: int, device=None):
    """(batch, BLOSUM62 as a tensor): `count` random pairs of `records` as codes, in one padded,
    length-sorted batch on `device`, as the code-lookup path (the CLI's) takes them."""
    from swcli.batching import batches_of

    matrix = load_matrix("BLOSUM62")
    pairs = random_pairs(records, count)
    q = [matrix.encode(a.sequence, a.where) for a, _ in pairs]
    t = [matrix.encode(b.sequence, b.where) for _, b in pairs]
    (batch,) = batches_of(q, t, max_cells=1 << 62, max_residues=1 << 62, device=device)
    return batch, matrix.tensor(device=device)


def real_rows(backend: str, records: list[FastaRecord], seconds, count: int) -> list[Row]:
    """Real-length pairs through the code-lookup path (the one the CLI uses): one padded, length-sorted
    batch on the backend's device, no I/O; seconds(run) times one run."""
    batch, table = real_batch(records, count, "cuda" if backend == "cuda" else None)
    rows = []
    for temperature in (1.0, 0.0):
        def run():
            ops.soft_smith_waterman_codes(batch.query_codes, batch.target_codes, table, -4.0, temperature,
                                          batch.query_lengths, batch.target_lengths, backend)

        workload, note = f"real pairs ({count})", "BLOSUM62, gap -4, codes looked up in the matrix"
        if backend != "cuda" or temperature == 0:
            rows.append(Row(workload, backend, temperature, count, batch.cells, seconds(run), note))
            continue
        ops.load_engine("cuda")

        def engine_call(scaled: bool, counted: bool = False):
            op = torch.ops.swcli.scores_codes_counted if counted else torch.ops.swcli.scores_codes
            return op(batch.query_codes, batch.target_codes, table, batch.query_lengths, batch.target_lengths, -4.0,
                      temperature, scaled=scaled)

        note += f"; {log_space_pairs(lambda: engine_call(True, counted=True))} pairs in log space"
        rows.append(Row(workload, backend, temperature, count, batch.cells, seconds(run), note))
        rows.append(Row(workload, "cuda-log", temperature, count, batch.cells, seconds(lambda: engine_call(False)),
                        "the same, every pair through the log-space sweep (operator call)"))
    linear = {row.temperature: row for row in rows if row.backend == backend}
    for temperature in (1.0, 0.0):
        def affine_run():
            ops.soft_smith_waterman_codes(batch.query_codes, batch.target_codes, table, None, temperature,
                                          batch.query_lengths, batch.target_lengths, backend, **AFFINE_GAPS)

        row = Row(f"affine real pairs ({count})", backend, temperature, count, batch.cells, seconds(affine_run))
        row.note = (f"BLOSUM62, {AFFINE_NOTE}, the same batch; {row.gcups / linear[temperature].gcups:.2f}x the "
                    "linear row's GCUPS")
        rows.append(row)
    return rows


def search_rows(backend: str, records: list[FastaRecord], residues: int, queries: int = 4) -> list[Row]:
    """`search`'s loop (Searcher: each query against every block, its best 10 on the device): the first
    `queries` records against the records repeated to about `residues` residues, BLOSUM62, top 10; linear
    gap -4 and affine -11/-1, at t = 0 (on CUDA the exact 16-bit kernel) and t = 1 (on CUDA the soft
    search kernel). Time: the scoring calls of every query (CUDA events, or the host clock on the CPU),
    after one untimed query; pairs a kernel flagged are scored again inside that time, and counted."""
    from swcli.database import build
    from swcli.search import Searcher

    matrix = load_matrix("BLOSUM62")
    copies = max(1, residues // max(1, sum(len(r.sequence) for r in records)))
    db = build([FastaRecord("bench", k + 1, f"s{k}", r.sequence)
                for k, r in enumerate(records * copies)], matrix, "bench")
    codes = [matrix.encode(r.sequence, r.where) for r in records[:queries]]
    cells = sum(len(c) for c in codes) * db.residues
    device = "cuda" if backend == "cuda" else "cpu"
    rows = []
    linear, affine = {"gap": -4.0}, {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}
    for temperature, gaps, note in ((0.0, linear, "gap -4"), (1.0, linear, "gap -4"), (0.0, affine, "affine -11/-1"),
                                    (1.0, affine, "affine -11/-1")):
        gaps = dict(gaps)
        searcher = Searcher(db, matrix.tensor(), gaps.pop("gap"), temperature, 10, backend, device, **gaps)
        searcher.best(codes[0])
        searcher.rescored = 0
        seconds = sum(searcher.finish(searcher.launch(c))[1] for c in codes)
        kernel = searcher.kernel_name
        if searcher.rescored:
            kernel += f", {searcher.rescored:,} pairs flagged and scored again"
        rows.append(Row(f"search ({len(db):,} sequences)", backend, temperature, len(codes) * len(db), cells,
                        seconds, f"BLOSUM62, {note}, {len(codes)} queries, top 10: {kernel}"))
    return rows


def log_space_pairs(counted_call) -> int:
    """How many pairs counted_call(), one call of a counted operator (scores_counted,
    scores_codes_counted), scored in log space rather than by the scaled sweep: 0 unless some pair holds a
    spread of scores that the scaled sweep's floats cannot."""
    return int(counted_call()[1].item())


def end_to_end_rows(backend: str, records: list[FastaRecord], count: int) -> list[Row]:
    """The whole `swcli align` loop on `count` real-length pairs: FASTA in, TSV out, one run each, after
    an untimed run on a few pairs at each temperature (the engine's build or load, CUDA's start and each
    kernel's first launch are paid once per process, not per temperature)."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        fasta, warmup = Path(folder) / "pairs.fasta", Path(folder) / "warmup.fasta"
        for path, n in ((fasta, count), (warmup, min(count, 64))):
            with open(path, "w") as handle:
                for a, b in random_pairs(records, n):
                    handle.write(f">{a.id}\n{a.sequence}\n>{b.id}\n{b.sequence}\n")
        settings = {t: Settings(load_matrix("BLOSUM62"), -4.0, t, backend) for t in (1.0, 0.0)}
        def align_file(path: Path, settings: Settings, stats: Stats) -> None:  # as `swcli align` does
            with TsvWriter(str(Path(folder) / "out.tsv")) as writer:
                for chunk, scores in align_chunks(chunks_in_one_file(str(path), settings.chunk_size), settings,
                                                  stats):
                    writer.write_bytes(chunk_rows(chunk, scores))

        for temperature in settings:
            align_file(warmup, settings[temperature], Stats())
        for temperature in settings:
            stats = Stats()
            align_file(fasta, settings[temperature], stats)
            total = stats.seconds
            outside = 1 - stats.kernel_seconds / total
            rows.append(Row(f"end-to-end ({count} pairs)", backend, temperature, count, stats.cells, total,
                            f"{count / total:,.0f} pairs/s, {outside:.0%} of the time outside the scoring "
                            "calls"))
    return rows


# --------------------------------------------------------------------------------------------------
# CUDA: every time from CUDA events around the call, median of `calls` calls after warm-up

# A kernel of one thread per pair, two DP rows in local arrays, took 113 us per seed-sized call on an
# H200: the yardstick the warp-per-pair kernels replaced. It is not built or run here, so the ratio to it
# means something on an H200 only.
NAIVE_SEED_MICROSECONDS = 113.0


def cuda_seconds(run, calls: int, warmup: int = 10) -> float:
    """Median over `calls` of the CUDA-event interval around one run(), after `warmup` runs."""
    return cuda_seconds_interleaved([run], calls, warmup)[0]


def cuda_seconds_interleaved(runs, calls: int, warmup: int = 10, warmup_seconds: float = 0.0) -> list[float]:
    """cuda_seconds of each of `runs`, measured call by call in turn (the order reversed every other round),
    so that a drift of the host's speed falls on each alike; warmed up for `warmup` rounds and at least
    `warmup_seconds`. Calls of the seed's size are host-bound, and the host's time per call keeps falling
    for a while as a process warms up: of two runs measured one after the other, the second would gain."""
    started = time.perf_counter()
    done = 0
    while done < warmup or time.perf_counter() - started < warmup_seconds:
        for run in runs:
            run()
        done += 1
    torch.cuda.synchronize()
    marks = [[] for _ in runs]
    for call in range(calls):
        for k in (range(len(runs)) if call % 2 == 0 else reversed(range(len(runs)))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runs[k]()
            end.record()
            marks[k].append((start, end))
    torch.cuda.synchronize()
    return [statistics.median(start.elapsed_time(end) for start, end in pairs) / 1e3 for pairs in marks]


def graph_seconds(run, calls_per_graph: int, replays: int) -> float:
    """Median time per call when `calls_per_graph` calls are captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            run()
    return cuda_seconds(graph.replay, replays, warmup=3) / calls_per_graph


def cuda_seed_rows(calls: int) -> list[Row]:
    ops.load_engine("cuda")
    # The overload itself, as ops.py calls its operators: resolving the packet's overload on every call
    # would add host time to the yardstick that the op does not pay.
    empty_launch = torch.ops.swcli.empty_launch.default
    S = torch.randn(*SEED_SHAPE, device="cuda")
    cells = SEED_SHAPE[0] * SEED_SHAPE[1] * SEED_SHAPE[2]
    # Host-bound: measured in turn, after a second of warm-up, since a few calls of warm-up at the start
    # of a process leave the host's time per call well above where it settles.
    op, empty = cuda_seconds_interleaved([lambda: ops.soft_smith_waterman(S, -1.0, 1.0),
                                          lambda: empty_launch(S)], calls, warmup_seconds=1.0)
    graph = graph_seconds(lambda: ops.soft_smith_waterman(S, -1.0, 1.0), 100, calls)
    reference = cuda_seconds(lambda: soft_smith_waterman_reference(S, -1.0, 1.0), 3, warmup=1)
    workload = "seed B=16 32x32"
    return [
        Row(workload, "cuda", 1.0, 16, cells, op,
            f"{op / empty:.3f}x the empty launch; {reference / op:,.0f}x the reference loop; "
            f"{NAIVE_SEED_MICROSECONDS * 1e-6 / op:.1f}x a one-thread-per-pair kernel (113 us on an H200, "
            "not run here)"),
        Row(workload, "empty", 1.0, 16, cells, empty, "an empty kernel through the same operator dispatch"),
        Row(workload, "graph", 1.0, 16, cells, graph, "per call, 100 calls per CUDA graph, replayed"),
        Row(workload, "reference", 1.0, 16, cells, reference, "the Python loop on the GPU"),
    ]


def cuda_dense_rows(calls: int, batch: int = 8192, size: int = 256) -> list[Row]:
    ops.load_engine("cuda")
    swcli_ops = torch.ops.swcli
    S = torch.randn(batch, size, size, device="cuda")
    cells = batch * size * size
    rows = []
    for t in (1.0, 0.0):
        forward = cuda_seconds(lambda: ops.soft_smith_waterman(S, -1.0, t), calls)
        note = "fp32 S, forward"
        if t > 0:
            in_log_space = log_space_pairs(lambda: swcli_ops.scores_counted(S, None, None, -1.0, t))
            note += f"; {in_log_space} pairs in log space"
        rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", t, batch, cells, forward, note))
        if t > 0:  # the same through the log-space sweep, for comparison
            log_space = cuda_seconds(lambda: swcli_ops.scores(S, None, None, -1.0, t, scaled=False), calls)
            rows.append(Row(f"dense B={batch} {size}x{size}", "cuda-log", t, batch, cells, log_space,
                            "the same, every pair through the log-space sweep (operator call)"))
    grad_S = S.clone().requires_grad_()
    ones = torch.ones(batch, device="cuda")

    def forward_backward():
        grad_S.grad = None
        ops.soft_smith_waterman(grad_S, -1.0, 1.0).backward(ones)

    few = max(calls // 10, 10)
    both = cuda_seconds(forward_backward, few, warmup=3)
    rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", 1.0, batch, cells, both,
                    f"forward + backward: {both / rows[0].seconds:.2f}x the forward alone"))
    # the two halves, straight through the operators (no autograd, no gradient allocation by autograd): the
    # gradient by rows that autograd takes here, and the DP table's path (the others: t = 0, float64, N > 256
    # or narrow, see ops.gradient_by_rows)
    kept_forward = cuda_seconds(lambda: swcli_ops.forward(S, None, None, -1.0, 1.0, True), few, warmup=3)
    _, kept, best_row, failed = swcli_ops.forward(S, None, None, -1.0, 1.0, True)
    kept_backward = cuda_seconds(
        lambda: swcli_ops.backward(ones, S, kept, best_row, failed, None, None, -1.0, 1.0, True), few, warmup=3)
    rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", 1.0, batch, cells, kept_forward,
                    f"forward that keeps every 8th row (operator call); {failed.item()} pairs past the scaled "
                    "range"))
    rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", 1.0, batch, cells, kept_backward,
                    "backward by rows alone (operator call)"))
    del kept, best_row, failed
    keeping = cuda_seconds(lambda: swcli_ops.forward(S, None, None, -1.0, 1.0, False), few, warmup=3)
    _, table, best_at, failed = swcli_ops.forward(S, None, None, -1.0, 1.0, False)
    backward = cuda_seconds(
        lambda: swcli_ops.backward(ones, S, table, best_at, failed, None, None, -1.0, 1.0, False), few, warmup=3)
    rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", 1.0, batch, cells, keeping,
                    "forward that keeps the DP table (operator call)"))
    rows.append(Row(f"dense B={batch} {size}x{size}", "cuda", 1.0, batch, cells, backward,
                    f"backward from the table alone (operator call); with that forward "
                    f"{(keeping + backward) / rows[0].seconds:.2f}x the forward alone"))
    del table, best_at, failed, grad_S
    return rows + affine_dense_rows("cuda", S, f"dense B={batch} {size}x{size}", rows[0],
                                    lambda run: cuda_seconds(run, calls),
                                    lambda run: cuda_seconds(run, few, warmup=3))


def gpu() -> str:
    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
            f"CUDA {torch.version.cuda}")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}")


def run_benchmarks(backend: str, fasta: str | None, pairs: int, repeats: int, as_json: bool) -> None:
    if backend == "reference":
        raise SwcliError("bench times an engine against the reference loop: choose --backend cpu or auto")
    records = list(read_fasta(fasta if fasta is not None else str(packaged_file("data", "example.fasta"))))
    if backend == "cuda":
        calls = max(repeats, 200)  # CUDA events are cheap: the median of many calls
        rows = (cuda_seed_rows(calls) + cuda_dense_rows(calls)
                + real_rows(backend, records, lambda run: cuda_seconds(run, calls), 10_000)
                + search_rows(backend, records, 20_000_000))
        where = f"{machine()}; GPU: {gpu()}"
    else:
        rows = (seed_rows(backend, repeats) + dense_rows(backend, repeats)
                + real_rows(backend, records, lambda run: median_seconds(run, repeats), 2048)
                + search_rows(backend, records, 100_000))
        where = machine()
    if pairs:
        rows += end_to_end_rows(backend, records, pairs)
    if as_json:
        print(json.dumps({"machine": where, "date": time.strftime("%Y-%m-%d"),
                          "rows": [r.record() for r in rows]}, indent=2))
        return
    print(f"machine: {where}")
    print(f"| {'workload':<28} | {'backend':<9} | {'t':>3} | {'time':>12} | {'GCUPS':>7} | note")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 5}|{'-' * 14}|{'-' * 9}|------")
    for r in rows:
        time_text = f"{r.seconds * 1e6:,.0f} us" if r.seconds < 0.1 else f"{r.seconds:.2f} s"
        gcups_text = f"{r.gcups:>7.3f}"
        if r.skipped:
            time_text, gcups_text = "-", "-"
        print(f"| {r.workload:<28} | {r.backend:<9} | {r.temperature:>3g} | {time_text:>12} | "
              f"{gcups_text:>7} | {r.note}")
