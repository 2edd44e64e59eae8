"""The CUDA op on a side stream and under CUDA graph capture, forward and training step."""

from __future__ import annotations

import torch

import swcli
from swcli import ops
from swcli.testing import (
    CudaEngineCalls,
    cuda,
    random_scores,
    requires_cuda,
)

ssw = swcli.soft_smith_waterman


@cuda
@requires_cuda
class TestCudaGraphsStreams(CudaEngineCalls):
    """Launches on the current stream; capture and replay give the scores and gradients of the new inputs."""

    def test_side_stream_and_graph_capture(self):
        S = random_scores((16, 32, 32), seed=9950, dtype=torch.float32, device=self.device)
        expected = ssw(S, -1.0, 1.0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = ssw(S, -1.0, 1.0)
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(on_side, expected)
        static = S.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            ssw(static, -1.0, 1.0)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            captured = ssw(static, -1.0, 1.0)
        fresh = random_scores((16, 32, 32), seed=9951, dtype=torch.float32, device=self.device)
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, ssw(fresh, -1.0, 1.0))

    def test_gradient_in_a_captured_graph(self):
        # A training step captured whole. The rows' backward reads one int from the device, which a capture
        # does not allow, so under capture the op keeps the DP table (ops._forward); replayed on new
        # scores, the gradient is theirs.
        static = random_scores((16, 32, 160), seed=9952, dtype=torch.float32, device=self.device).requires_grad_()
        assert ops.gradient_by_rows(static, False, -1.0, 1.0)  # outside a capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture (by rows)
                static.grad = None
                ssw(static, -1.0, 1.0).sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        static.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ssw(static, -1.0, 1.0).sum().backward()
        fresh = random_scores((16, 32, 160), seed=9953, dtype=torch.float32)
        with torch.no_grad():
            static.copy_(fresh.cuda())
        graph.replay()
        torch.cuda.synchronize()
        exact = fresh.double().requires_grad_()
        ssw(exact, -1.0, 1.0, backend="cpu").sum().backward()
        torch.testing.assert_close(static.grad.cpu().double(), exact.grad, rtol=0, atol=1e-4)
