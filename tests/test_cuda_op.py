"""The op on CUDA tensors: dispatch, the op's and the engine binding's argument errors, no CPU fallback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import swcli
from swcli.testing import (
    DTYPE_PARAMS,
    TEMPERATURES,
    CudaEngineCalls,
    assert_close_to_reference,
    cuda,
    dtype_id,
    random_lengths,
    random_scores,
    requires_cuda,
    slow_unless,
    window_mask,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaOp(CudaEngineCalls):
    """backend='cuda' on CUDA tensors through the public entries (skipped without a CUDA device)."""

    @pytest.mark.parametrize("dtype", DTYPE_PARAMS)
    @pytest.mark.parametrize("t", TEMPERATURES)
    def test_matches_reference(self, t, dtype):
        B, M, N = 37, 14, 11
        S = random_scores((B, M, N), seed=9000, dtype=dtype, device=self.device)
        qlen = random_lengths(B, M, seed=9001)
        tlen = random_lengths(B, N, seed=9002)
        out = ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        assert_close_to_reference(out, S, -1.0, t, qlen, tlen)

    def test_auto_uses_cuda(self):
        S = random_scores((4, 9, 8), seed=9100, device=self.device)
        out = ssw(S, -1.0, 1.0)
        assert out.device.type == "cuda"
        assert torch.equal(out, ssw(S, -1.0, 1.0, backend="cuda"))

    @pytest.mark.parametrize("kwargs,message", [
        ({"temperature": -0.5}, r"temperature must be >= 0"),
        ({"temperature": float("nan")}, r"temperature must be a finite number"),
        ({"temperature": float("inf")}, r"temperature must be a finite number"),
        ({"gap": float("nan")}, r"gap must be a finite number"),
        ({"gap": float("inf")}, r"gap must be a finite number"),
        ({"backend": "gpu"}, r"unknown backend 'gpu'"),
        ({"query_lengths": torch.tensor([1, 9, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ], ids=lambda x: repr(x)[:40] if isinstance(x, dict) else None)
    def test_cuda_tensors_raise_the_errors_of_cpu_tensors(self, kwargs, message):
        S = torch.zeros(3, 5, 6, device=self.device)
        with pytest.raises(ValueError, match=message):
            ssw(S, **kwargs)
        with pytest.raises(ValueError, match=r"must be 3-D"):
            ssw(torch.zeros(5, 6, device=self.device))

    def test_every_entry_gives_the_same_scores(self):
        S = random_scores((9, 17, 40), seed=9150, dtype=torch.float32, device=self.device)
        general = ssw(S, -1.5, 0.7, backend="cuda")
        assert torch.equal(ssw(S, -1.5, 0.7), general)
        assert torch.equal(ssw(S, np.float64(-1.5), 0.7), general)  # any real number as the gap
        assert torch.equal(swcli.SoftSmithWaterman(-1.5, 0.7)(S), general)
        R = S.clone().requires_grad_()
        out = ssw(R, -1.5, 0.7)  # with a gradient: the forward that keeps H, in log space (see test_no_grad)
        assert out.grad_fn is not None
        torch.testing.assert_close(out.detach(), general, rtol=1e-5, atol=1e-5)

    def test_cpu_backend_refuses_cuda_tensors(self):
        with pytest.raises(ValueError, match=r"backend='cpu' needs the score matrix on the CPU"):
            ssw(torch.zeros(2, 3, 4, device=self.device), backend="cpu")

    @pytest.mark.parametrize("t", [0.0, 1.0])
    def test_padding_and_nan(self, t):
        B, M, N = 45, 19, 23
        S = random_scores((B, M, N), seed=9300, device=self.device)
        qlen = random_lengths(B, M, seed=9301)
        tlen = random_lengths(B, N, seed=9302)
        padded = S.clone()
        padded[window_mask(B, M, N, qlen, tlen).cuda()] = float("nan")
        out = ssw(padded, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda")
        assert torch.equal(out, ssw(S, -1.0, t, qlen.cuda(), tlen.cuda(), backend="cuda"))
        cpu = ssw(S.cpu(), -1.0, t, qlen, tlen, backend="cpu")
        torch.testing.assert_close(out.cpu(), cpu, rtol=0, atol=1e-9)

    def test_deterministic(self):
        S = random_scores((1200, 50, 170), seed=9800, dtype=torch.float32, device=self.device)
        qlen = random_lengths(1200, 50, seed=9801).cuda()
        first = ssw(S, -1.0, 1.0, qlen, random_lengths(1200, 170, seed=9802).cuda())
        again = ssw(S, -1.0, 1.0, qlen, random_lengths(1200, 170, seed=9802).cuda())
        assert torch.equal(first, again)

    @pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=dtype_id)
    def test_half_inputs(self, half):
        S = random_scores((7, 20, 30), seed=9900, dtype=torch.float32, device=self.device).to(half)
        out = ssw(S, -1.0, 1.0, backend="cuda")
        assert out.dtype == half and out.device.type == "cuda"
        assert torch.equal(out, ssw(S.float(), -1.0, 1.0, backend="cuda").to(half))

    ENGINE_ERRORS = {
        "dense lane_columns 8": ("swcli.scores(S, None, None, -4.0, 1.0, lane_columns=8)",
                                 r"lane_columns must be 0 \(automatic\), 1, 4 or -1 \(tiles of long pairs\), got 8"),
        "codes lane_columns 3": ("swcli.scores_codes(q, q, m, None, None, -4.0, 1.0, lane_columns=3)",
                                 r"lane_columns must be 0 \(automatic\), 1, 4 or 8, got 3"),
        "int32 lengths": ("swcli.scores_codes(q, q, m, n.int(), None, -4.0, 1.0)",
                          "lengths must be contiguous int64 tensors"),
        "lengths on the CPU": ("swcli.scores(S, n.cpu(), None, -4.0, 1.0)", "lengths must be contiguous int64 tensors"),
        "S on the CPU": ("swcli.scores(S.cpu(), n, None, -4.0, 1.0)", "the CUDA engine needs a 3-D CUDA tensor"),
        "rows of float64": ("swcli.forward(S.double(), None, None, -4.0, 1.0, True)",
                            "the gradient by rows takes float32 CUDA scores"),
        "rows at t = 0": ("swcli.forward(S, None, None, -4.0, 0.0, True)", "the gradient by rows takes"),
        "rows kept wrong": ("swcli.backward(n.float(), S, S[0].reshape(-1), n, n[:1].int(), None, None, -4.0, 1.0, True)",
                            "kept rows do not match the score matrix"),
        "table wrong": ("swcli.backward(n.float(), S, S[0].reshape(-1), n, n[:1].int(), None, None, -4.0, 1.0, False)",
                        "the DP table does not match the score matrix"),
        "tiles of float64": ("swcli.scores(S.double(), None, None, -4.0, 1.0, lane_columns=-1)",
                             r"lane_columns -1 \(tiles of long pairs\) takes float32 scores, got Double"),
        "tiles state wrong": ("swcli.backward(n.float(), S, S[0].reshape(-1), n, n[:1].int(), None, None, -4.0, 1.0, "
                              "False, lane_columns=-1)", "state does not match the score matrix: it must be the state "
                              "of the forward by tiles"),
        "affine tiles": ("swcli.affine_scores(S, None, None, -4.0, -1.0, 1.0, lane_columns=-1)",
                         r"lane_columns must be 0 \(automatic\), 1 or 4, got -1"),
        "codes tiles": ("swcli.scores_codes(q, q, m, None, None, -4.0, 1.0, lane_columns=-1)",
                        r"lane_columns must be 0 \(automatic\), 1, 4 or 8, got -1"),
    }

    # Each case starts a process (torch, a CUDA context, the engine): one case of each engine entry (dense,
    # codes, rows) stays in the fast suite, the others are slow.
    @pytest.mark.parametrize("case", slow_unless(list(ENGINE_ERRORS), ["dense lane_columns 8", "codes lane_columns 3",
                                                                       "rows kept wrong"]))
    def test_engine_bad_arguments_raise(self, case):
        # Each in a process of its own: on the H200 machine a failed check whose message had several parts
        # crashed the process (SIGSEGV) instead of raising (kernels/cuda/ops.cpp, top).
        call, message = self.ENGINE_ERRORS[case]
        code = ("import re, torch\nfrom swcli.ops import load_engine\nload_engine('cuda')\nswcli = torch.ops.swcli\n"
                "S = torch.randn(3, 10, 12, device='cuda'); q = torch.zeros(3, 10, dtype=torch.uint8, device='cuda')\n"
                "m = torch.randn(24, 24, device='cuda'); n = torch.full((3,), 10, device='cuda')\n"
                f"try:\n    {call}\nexcept RuntimeError as error:\n"
                f"    print('raised' if re.search({message!r}, str(error)) else 'other: ' + str(error)[:200])\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and run.stdout.strip() == "raised", (run.returncode, run.stdout, run.stderr[-500:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_cuda_engine_without_a_gpu_is_an_error_not_a_fallback():
    from swcli import ops
    from swcli._build import BuildError

    with pytest.raises(BuildError, match="the CUDA engine needs a CUDA device, and torch sees none"):
        ops.load_engine("cuda")
