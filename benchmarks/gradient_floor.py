"""Memory floor of a gradient that recomputes H from S: its loads and stores alone, beside the engine's times.

gradient_floor.cu moves what such a backward moves over dense float S (B = 8192, 256 x 256: 2.15 GB) in
the wavefront kernels' skewed order (one row per lane), with no DP. It is timed beside torch's own copy,
sum and fill of the same tensor, which read and write coalesced, and beside the engine's forward and
forward + backward: how far the skewed order is from a coalesced read is why the gradient by rows reads
S in whole rows. Medians of 10 calls (CUDA events); needs a CUDA GPU and nvcc.

    python3 benchmarks/gradient_floor.py
"""

import os
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

import swcli
from swcli.bench import cuda_seconds

WRAPPER = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
void gradient_floor(const float* S, float* grad, int64_t B, int M, int N, int mode, cudaStream_t stream);
void run(torch::Tensor S, torch::Tensor grad, int64_t mode) {
  gradient_floor(S.data_ptr<float>(), grad.data_ptr<float>(), S.size(0), S.size(1), S.size(2), int(mode),
                 at::cuda::getCurrentCUDAStream());
}
"""


def main() -> None:
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    module = load_inline("gradient_floor", cpp_sources=WRAPPER,
                         cuda_sources=(Path(__file__).parent / "gradient_floor.cu").read_text(),
                         functions=["run"], extra_cuda_cflags=["-O3"])
    S = torch.randn(8192, 256, 256, device="cuda")
    grad = torch.empty_like(S)
    gb = S.numel() * 4 / 1e9

    def line(name: str, seconds: float, moved: float) -> None:
        print(f"{name:<44} {seconds * 1e3:7.3f} ms  {moved * gb / seconds / 1e3:5.2f} TB/s")

    line("torch copy (read + write)", cuda_seconds(lambda: grad.copy_(S), 10), 2)
    line("torch sum (read)", cuda_seconds(lambda: S.sum(), 10), 1)
    line("torch fill (write)", cuda_seconds(lambda: grad.fill_(1.0), 10), 1)
    for mode, name, moved in ((0, "floor: S skewed read + gradient lines", 2), (1, "floor: S skewed read only", 1),
                              (2, "floor: gradient lines only", 1)):
        line(name, cuda_seconds(lambda: module.run(S, grad, mode), 10), moved)
    line("engine forward alone (t=1)", cuda_seconds(lambda: swcli.soft_smith_waterman(S, -1.0, 1.0), 10), 1)
    Sg = S.clone().requires_grad_()

    def step():
        Sg.grad = None
        swcli.soft_smith_waterman(Sg, -1.0, 1.0).sum().backward()

    line("engine forward + backward (t=1)", cuda_seconds(step, 10), 4)


if __name__ == "__main__":
    main()
