"""The affine gradient by rows beside the state's path, by width: why every width up to 256 goes by rows.

Dense float32 S with 2^21 cells a row of pairs (B = 2^21 / N pairs of 256 x N), BLAST's 11/1 (-12/-1) at
t = 1, with and without per-pair lengths (drawn between half and all of M and N): the forward without
the gradient, and forward + backward through the operators by rows and by the state. Medians of 10 calls
(CUDA events). Needs a CUDA GPU.

    python3 benchmarks/affine_gradient_widths.py
"""

import torch

from swcli import ops
from swcli.bench import cuda_seconds

GAP_OPEN, GAP_EXTEND, T = -12.0, -1.0, 1.0
CASES = ((32, False), (64, False), (96, False), (128, False), (160, False), (256, False), (128, True), (192, True),
         (256, True))


def main() -> None:
    ops.load_engine("cuda")
    swcli_ops = torch.ops.swcli
    print("| N | lengths | pairs | forward | forward + backward by rows | by the state |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for N, lengths in CASES:
        B, M = 2 ** 21 // N, 256
        S = torch.randn(B, M, N, device="cuda")
        q = torch.randint(M // 2, M + 1, (B,), device="cuda") if lengths else None
        tl = torch.randint(N // 2, N + 1, (B,), device="cuda") if lengths else None
        grad = torch.ones(B, device="cuda")

        def both(by_rows: bool) -> None:
            _, state, best, failed = swcli_ops.affine_forward(S, q, tl, GAP_OPEN, GAP_EXTEND, T, by_rows)
            swcli_ops.affine_backward(grad, S, state, best, failed, q, tl, GAP_OPEN, GAP_EXTEND, T, by_rows)

        forward = cuda_seconds(lambda: swcli_ops.affine_scores(S, q, tl, GAP_OPEN, GAP_EXTEND, T), 10)
        rows, state = cuda_seconds(lambda: both(True), 10), cuda_seconds(lambda: both(False), 10)
        print(f"| {N} | {'yes' if lengths else 'no'} | {B:,} | {forward * 1e3:.3f} ms | {rows * 1e3:.3f} ms "
              f"({rows / forward:.2f}x) | {state * 1e3:.3f} ms ({state / forward:.2f}x) |")


if __name__ == "__main__":
    main()
