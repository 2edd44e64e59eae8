"""Workloads for profiling the CUDA engine: `python3 benchmarks/profile_workloads.py WORKLOAD [ARGS]`.

tools/h200.sh runs them in its profile (under ncu), steps and host stages.

  kernels: one call each of the dense 8192 x 256 x 256 forward (t = 1, 0), the seed (16 x 32 x 32),
           10,000 real-length pairs from codes, and a dense forward + backward, for ncu to capture.
  train:   only the dense forward that keeps H and the backward (a smaller ncu report).
  latency: the seed's kernel (1-column lanes, 16 pairs) on 256 x 256 pairs, long enough for the
           profiler's PC sampling to show where each wavefront step waits; then the seed itself.
  steps:   seed-shaped batches (B = 16) of growing size in CUDA graph replay: the slope is the time of
           one wavefront step, the intercept the fixed cost of a launch; then the SM clock while the
           seed kernel runs back to back.
  host:    host time per call (no synchronisation inside the loop) of the op, the scores operator (its
           packet and its overload) and the empty launch at the seed size: when the host is slower than
           the kernel, this is the rate.
  forward: the seed in CUDA graph replay, the dense t = 1 forward and 10,000 real-length pairs from
           codes at t = 1 and 0, 20 calls each (medians of CUDA events): one line, to compare kernel
           variants of the forward.
  rows [N [lengths]]: the gradient by rows (dense float, 8192 x 256 x N, N = 256 unless given, t = 1;
           with `lengths`, random lengths from half the size up): the forward alone, the rows' forward
           and backward, forward + backward through autograd, and the DP table's forward and backward
           for comparison, 10 calls each: one line.
  gradient: swcli bench's dense rows (forward, forward + backward, the forward that keeps H, the
           backward) with 10 calls each, and a checksum of the gradient: one line, to compare kernel
           variants.
  learnable: forward + .sum().backward() of 8192 x 256 x 256 float32 at t = 1, the gradient of S alone
           against S's with the gaps' and the temperature's (0-d tensors that require grad), linear gap -1
           and affine -12/-1, interleaved call by call (medians of 20 CUDA-event intervals); then the
           backward operators alone on one forward's state (backward, backward_parameters, and
           backward_parameters_per_pair with the values read on the device): a table.
"""

import sys
import time

import torch

import swcli
from swcli.bench import real_batch
from swcli.fasta import read_fasta
from swcli.ops import load_engine, soft_smith_waterman_codes


def kernels() -> None:
    S = torch.randn(8192, 256, 256, device="cuda")
    for t in (1.0, 0.0):
        swcli.soft_smith_waterman(S, -1.0, t)
    swcli.soft_smith_waterman(torch.randn(16, 32, 32, device="cuda"), -1.0, 1.0)
    batch, table = real_batch(list(read_fasta(".bench/proteins.fasta")), 10_000, "cuda")
    soft_smith_waterman_codes(batch.query_codes, batch.target_codes, table, -4.0, 1.0,
                              batch.query_lengths, batch.target_lengths, "cuda")
    S.requires_grad_()
    swcli.soft_smith_waterman(S, -1.0, 1.0).sum().backward()  # the forward that keeps H, the backward
    torch.cuda.synchronize()


def train() -> None:
    S = torch.randn(8192, 256, 256, device="cuda", requires_grad=True)
    swcli.soft_smith_waterman(S, -1.0, 1.0).sum().backward()
    torch.cuda.synchronize()


def latency() -> None:
    for n in (256, 32):
        swcli.soft_smith_waterman(torch.randn(16, n, n, device="cuda"), -1.0, 1.0)
    torch.cuda.synchronize()


def steps() -> None:
    from swcli.bench import graph_seconds

    for n in (8, 16, 32, 64, 128, 256):
        S = torch.randn(16, n, n, device="cuda")
        seconds = graph_seconds(lambda: swcli.soft_smith_waterman(S, -1.0, 1.0), 50, 50)
        print(f"B=16 {n}x{n}: {2 * n - 1} steps, {seconds * 1e6:.2f} us per call in graph replay")
    # the SM clock while the seed kernel runs back to back: is a step slow, or the clock low?
    import subprocess
    import threading

    S = torch.randn(16, 32, 32, device="cuda")
    clocks = []

    def sample() -> None:
        for _ in range(5):
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
            clocks.append(out)

    sampler = threading.Thread(target=sample)
    sampler.start()
    while sampler.is_alive():
        graph_seconds(lambda: swcli.soft_smith_waterman(S, -1.0, 1.0), 1000, 3)
    print("SM clock while the seed kernel runs back to back:", ", ".join(clocks))


def host() -> None:
    load_engine("cuda")
    S = torch.randn(16, 32, 32, device="cuda")
    calls = {
        "op soft_smith_waterman": lambda: swcli.soft_smith_waterman(S, -1.0, 1.0),
        "swcli.scores": lambda: torch.ops.swcli.scores(S, None, None, -1.0, 1.0),
        "swcli.scores.default": lambda: torch.ops.swcli.scores.default(S, None, None, -1.0, 1.0),
        "swcli.empty_launch.default": lambda: torch.ops.swcli.empty_launch.default(S),
    }
    for name, call in calls.items():
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        n = 5000
        started = time.perf_counter()
        for _ in range(n):
            call()
        host_us = (time.perf_counter() - started) / n * 1e6
        torch.cuda.synchronize()
        total_us = (time.perf_counter() - started) / n * 1e6
        print(f"{name:<26} host {host_us:6.1f} us/call, with the device drained {total_us:6.1f} us/call")
    # kernel time alone: the operator call in CUDA graph replay, as swcli bench times it
    from swcli.bench import graph_seconds

    seconds = graph_seconds(calls["swcli.scores.default"], 200, 10)
    print(f"graph replay: {seconds * 1e6:.2f} us per seed call")


def gradient() -> None:
    from swcli.bench import cuda_dense_rows

    torch.manual_seed(0)
    rows = cuda_dense_rows(10)
    S = torch.randn(8192, 256, 256, device="cuda", requires_grad=True)
    swcli.soft_smith_waterman(S, -1.0, 1.0).sum().backward()
    print("; ".join(f"t={r.temperature:g} {r.note}: {r.seconds * 1e6:.1f} us" for r in rows)
          + f"; gradient sum {S.grad.double().sum().item():.6f}")


def forward() -> None:
    from swcli.bench import cuda_seconds, graph_seconds

    seed = torch.randn(16, 32, 32, device="cuda")
    graph = graph_seconds(lambda: swcli.soft_smith_waterman(seed, -1.0, 1.0), 100, 50)
    S = torch.randn(8192, 256, 256, device="cuda")
    dense = cuda_seconds(lambda: swcli.soft_smith_waterman(S, -1.0, 1.0), 20)
    batch, table = real_batch(list(read_fasta(".bench/proteins.fasta")), 10_000, "cuda")
    real = {t: cuda_seconds(lambda: soft_smith_waterman_codes(batch.query_codes, batch.target_codes, table, -4.0, t,
                                                              batch.query_lengths, batch.target_lengths, "cuda"), 20)
            for t in (1.0, 0.0)}
    print(f"seed graph replay {graph * 1e6:.2f} us; dense t=1 forward {dense * 1e6:.1f} us "
          f"({S.numel() / dense / 1e9:.1f} GCUPS); real pairs "
          + ", ".join(f"t={t:g} {s * 1e6:.1f} us ({batch.cells / s / 1e9:.1f} GCUPS)" for t, s in real.items()))


def rows(N: str = "256", lengths: str = "") -> None:
    from swcli.bench import cuda_seconds

    load_engine("cuda")
    op = torch.ops.swcli
    torch.manual_seed(0)
    B, M, N = 8192, 256, int(N)
    S = torch.randn(B, M, N, device="cuda")
    q = torch.randint(M // 2, M + 1, (B,), device="cuda") if lengths else None
    t = torch.randint(N // 2, N + 1, (B,), device="cuda") if lengths else None
    ones = torch.ones(B, device="cuda")
    alone = cuda_seconds(lambda: swcli.soft_smith_waterman(S, -1.0, 1.0, q, t), 10)
    forward = cuda_seconds(lambda: op.forward(S, q, t, -1.0, 1.0, True), 10)
    _, kept, best_row, failed = op.forward(S, q, t, -1.0, 1.0, True)
    backward = cuda_seconds(lambda: op.backward(ones, S, kept, best_row, failed, q, t, -1.0, 1.0, True), 10)
    X = S.clone().requires_grad_()

    def step():
        X.grad = None
        swcli.soft_smith_waterman(X, -1.0, 1.0, q, t).sum().backward()

    both = cuda_seconds(step, 10)
    keeping = cuda_seconds(lambda: swcli.soft_smith_waterman(X, -1.0, 1.0, q, t), 10)
    _, table, best_at, table_failed = op.forward(S, q, t, -1.0, 1.0, False)
    table_forward = cuda_seconds(lambda: op.forward(S, q, t, -1.0, 1.0, False), 10)
    table_backward = cuda_seconds(
        lambda: op.backward(ones, S, table, best_at, table_failed, q, t, -1.0, 1.0, False), 10)
    print(f"N = {N}{' with lengths' if lengths else ''}: forward alone {alone * 1e3:.3f} ms; "
          f"rows forward {forward * 1e3:.3f} ms, backward {backward * 1e3:.3f} ms; "
          f"forward + backward {both * 1e3:.3f} ms = {both / alone:.2f}x (autograd forward {keeping * 1e3:.3f} ms); "
          f"failed {failed.item()}; gradient sum {X.grad.double().sum().item():.6f}; the table's forward "
          f"{table_forward * 1e3:.3f} ms, backward {table_backward * 1e3:.3f} ms = "
          f"{(table_forward + table_backward) / alone:.2f}x")


def learnable() -> None:
    from swcli.bench import cuda_seconds_interleaved
    from swcli.ops import affine_gradient_by_rows, gradient_by_rows

    load_engine("cuda")
    op = torch.ops.swcli
    torch.manual_seed(0)
    B, M, N, t = 8192, 256, 256, 1.0
    X = torch.randn(B, M, N, device="cuda").requires_grad_()
    ones = torch.ones(B, device="cuda")
    print(f"forward + backward, {B} x {M} x {N} float32, t = {t:g}: the gradient of S alone, and with the gaps' "
          "and the temperature's (0-d tensors); medians of 20 CUDA-event intervals, interleaved")
    print(f"{'gaps':<14} {'S alone':>9} {'S, gaps, t':>11} {'ratio':>6}   {'backward kernels: plain':>23} "
          f"{'with sums':>9} {'ratio':>6} {'per pair':>13}  by rows; S's gradient")
    for label, gaps in (("linear -1", {"gap": -1.0}), ("affine -12/-1", {"gap_open": -12.0, "gap_extend": -1.0})):
        parameters = {name: torch.tensor(value, device="cuda", requires_grad=True) for name, value in gaps.items()}
        temperature = torch.tensor(t, device="cuda", requires_grad=True)

        def s_alone():
            X.grad = None
            swcli.soft_smith_waterman(X, temperature=t, **gaps).sum().backward()

        def with_parameters():
            X.grad = temperature.grad = None
            for parameter in parameters.values():
                parameter.grad = None
            swcli.soft_smith_waterman(X, temperature=temperature, **parameters).sum().backward()

        plain, learned = cuda_seconds_interleaved([s_alone, with_parameters], 20)
        s_alone()
        alone = X.grad.clone()
        with_parameters()
        same = "the same" if torch.equal(alone, X.grad) else "DIFFERENT"
        del alone
        # the two backward operators alone, on the state of one forward
        S = X.detach()
        values = [torch.full((B,), value, device="cuda") for value in (*gaps.values(), t)]
        if len(gaps) == 1:
            by_rows = gradient_by_rows(S, False, gaps["gap"], t)
            _, state, best, failed = op.forward(S, None, None, gaps["gap"], t, by_rows)
            args = (ones, S, state, best, failed, None, None, gaps["gap"], t, by_rows)
            _, *kept = op.forward_per_pair(S, None, None, *values)
            kernels = [lambda a=args: op.backward(*a), lambda a=args: op.backward_parameters(*a),
                       lambda a=(ones, S, *kept, None, None, *values): op.backward_parameters_per_pair(*a)]
        else:
            by_rows = affine_gradient_by_rows(S, False, gaps["gap_open"], t)
            _, state, best, failed = op.affine_forward(S, None, None, gaps["gap_open"], gaps["gap_extend"], t, by_rows)
            args = (ones, S, state, best, failed, None, None, gaps["gap_open"], gaps["gap_extend"], t, by_rows)
            _, *kept = op.affine_forward_per_pair(S, None, None, *values)
            kernels = [lambda a=args: op.affine_backward(*a), lambda a=args: op.affine_backward_parameters(*a),
                       lambda a=(ones, S, *kept, None, None, *values): op.affine_backward_parameters_per_pair(*a)]
        backward, with_sums, per_pair = cuda_seconds_interleaved(kernels, 20)
        rows = f"yes, {failed.item()} pairs failed" if by_rows else "no"
        print(f"{label:<14} {plain * 1e3:>6.3f} ms {learned * 1e3:>8.3f} ms {learned / plain:>5.2f}x   "
              f"{backward * 1e3:>20.3f} ms {with_sums * 1e3:>6.3f} ms {with_sums / backward:>5.2f}x "
              f"{per_pair * 1e3:>10.3f} ms  {rows}; {same}")


if __name__ == "__main__":
    {"kernels": kernels, "train": train, "latency": latency, "steps": steps, "host": host,
     "gradient": gradient, "forward": forward, "rows": rows, "learnable": learnable}[sys.argv[1]](*sys.argv[2:])
