"""The registered operators (swcli/ops.py): schemas, fake kernels, autograd, torch.compile and meta tensors."""

from __future__ import annotations

import pytest
import torch

import swcli
from swcli import ops
from swcli.testing import DEVICE_PARAMS, cuda, random_lengths, random_scores, requires_cuda

BLOSUM_LIKE = torch.randint(-4, 12, (24, 24), generator=torch.Generator().manual_seed(3)).float()


def codes(B, L, seed, device):
    return torch.randint(0, 24, (B, L), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8).to(device)


def every_operator(device):
    """(operator, args, kwargs) of every engine operator on small random inputs, with and without lengths."""
    device = torch.device(device)
    ops.load_engine(device)
    S = random_scores((5, 7, 9), seed=1, dtype=torch.float32, device=device)
    Sg = S.clone().requires_grad_()
    qlen = random_lengths(5, 7, seed=2).to(device)
    tlen = random_lengths(5, 9, seed=3).to(device)
    q, t, m = codes(5, 7, 4, device), codes(5, 9, 5, device), BLOSUM_LIKE.to(device)
    cases = [
        (torch.ops.swcli.scores.default, (S, None, None, -1.0, 1.0), {}),
        (torch.ops.swcli.scores.default, (S, qlen, tlen, -2.0, 0.0), {}),
        (torch.ops.swcli.scores.default, (S.double(), qlen, None, -1.0, 0.5), {}),
        (torch.ops.swcli.scores_counted.default, (S, qlen, tlen, -1.0, 1.0), {}),
        (torch.ops.swcli.scores_codes.default, (q, t, m, None, None, -4.0, 1.0), {}),
        (torch.ops.swcli.scores_codes_counted.default, (q, t, m, None, tlen, -4.0, 1.0), {"scaled": False}),
        (torch.ops.swcli.scores_codes.default, (q, t, m, qlen, tlen, -4.0, 0.0), {}),
        (torch.ops.swcli.forward.default, (Sg, None, None, -1.0, 1.0, False), {}),
        (torch.ops.swcli.forward.default, (Sg, qlen, tlen, -1.0, 0.0, False), {}),
        (torch.ops.swcli.forward.default, (Sg.detach().double().requires_grad_(), qlen, tlen, -1.0, 0.7, False), {}),
    ]
    gap = torch.linspace(-2.0, -0.5, 5, device=device)
    temperature = torch.tensor([1.0, 0.5, 1.0, 0.0, 2.0], device=device)
    Sd = Sg.detach().double().requires_grad_()
    cases += [  # the per-pair operators
        (torch.ops.swcli.scores_per_pair.default, (S, qlen, tlen, gap, temperature), {}),
        (torch.ops.swcli.posterior_per_pair.default, (Sg, None, None, gap.clone().requires_grad_(), temperature), {}),
        (torch.ops.swcli.posterior_per_pair.default, (Sd, qlen, tlen, gap.double(), temperature.double()), {}),
        (torch.ops.swcli.affine_scores_per_pair.default, (S, qlen, tlen, gap - 1, gap, temperature), {}),
        (torch.ops.swcli.affine_posterior_per_pair.default, (Sd, qlen, None, (gap - 1).double(), gap.double(),
                                                             temperature.double().add(0.5).requires_grad_()), {}),
    ]
    ones = torch.ones(5, device=device)
    for t in (0.0, 0.7):  # the backward with the parameters' sums, from the forward's state
        _, state, best, failed = torch.ops.swcli.forward(S, qlen, tlen, -1.0, t, False)
        cases.append((torch.ops.swcli.backward_parameters.default,
                      (ones, S, state, best, failed, qlen, tlen, -1.0, t, False), {}))
        _, state, best, failed = torch.ops.swcli.affine_forward(S, qlen, tlen, -2.0, -0.5, t, False)
        cases.append((torch.ops.swcli.affine_backward_parameters.default,
                      (ones, S, state, best, failed, qlen, tlen, -2.0, -0.5, t, False), {}))
    if device.type == "cuda":
        wide = random_scores((3, 20, 200), seed=6, dtype=torch.float32, device=device).requires_grad_()
        cases.append((torch.ops.swcli.forward.default, (wide, None, None, -1.0, 1.0, True), {}))
        cases.append((torch.ops.swcli.empty_launch.default, (S,), {}))
        ones = torch.ones(3, device=device)
        _, kept, best_row, failed = torch.ops.swcli.forward(wide.detach(), None, None, -1.0, 1.0, True)
        cases.append((torch.ops.swcli.backward_parameters.default,
                      (ones, wide.detach(), kept, best_row, failed, None, None, -1.0, 1.0, True), {}))
        _, kept, best_row, failed = torch.ops.swcli.affine_forward(wide.detach(), None, None, -2.0, -0.5, 1.0, True)
        cases.append((torch.ops.swcli.affine_backward_parameters.default,
                      (ones, wide.detach(), kept, best_row, failed, None, None, -2.0, -0.5, 1.0, True), {}))
        # the gradient by rows with the values read on the device (a 0-d value expanded: stride 0)
        gap3 = torch.tensor([-1.0, -0.6, -1.4], device=device)
        t3 = torch.tensor(0.8, device=device).expand(3)
        # (no autograd of their own: _RowsPerPair calls them below autograd)
        cases.append((torch.ops.swcli.forward_per_pair.default, (wide.detach(), None, None, gap3, t3), {}))
        cases.append((torch.ops.swcli.affine_forward_per_pair.default, (wide.detach(), None, None, gap3 - 1, gap3,
                                                                        t3), {}))
        _, kept, best_row, failed = torch.ops.swcli.forward_per_pair(wide.detach(), None, None, gap3, t3)
        cases.append((torch.ops.swcli.backward_parameters_per_pair.default,
                      (ones, wide.detach(), kept, best_row, failed, None, None, gap3, t3), {}))
        _, kept, best_row, failed = torch.ops.swcli.affine_forward_per_pair(wide.detach(), None, None, gap3 - 1, gap3,
                                                                            t3)
        cases.append((torch.ops.swcli.affine_backward_parameters_per_pair.default,
                      (ones, wide.detach(), kept, best_row, failed, None, None, gap3 - 1, gap3, t3), {}))
    return cases


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_opcheck_passes_for_every_operator(device):
    for op, args, kwargs in every_operator(device):
        tests = None  # all of opcheck's
        if device.type == "cuda" and op in (torch.ops.swcli.forward.default, torch.ops.swcli.forward_per_pair.default,
                                            torch.ops.swcli.affine_forward_per_pair.default):
            # CUDA's state is written only where the backward reads it (the DP table inside each pair's
            # lengths, the kept rows without their padding), so two runs' states differ elsewhere, and
            # opcheck compares every output of two runs; the scores and gradient under torch.compile are
            # checked by test_compile_fullgraph_matches_eager.
            tests = ("test_schema", "test_autograd_registration", "test_faketensor")
        if op is torch.ops.swcli.empty_launch.default:  # its (B,) result is allocated, never written
            tests = ("test_schema", "test_faketensor")
        torch.library.opcheck(op, args, kwargs, **({} if tests is None else {"test_utils": tests}))


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_no_output_aliases_an_input_or_another_output(device):
    """torch.compile and torch.export assume a custom operator's outputs are fresh tensors. (The one-group
    per-pair cases matter on CUDA, where the operators run by groups in Python.)"""
    device = torch.device(device)
    S = random_scores((3, 6, 5), seed=7, dtype=torch.float64, device=device)
    one_value = torch.full((3,), -1.0, dtype=torch.float64, device=device)  # one group: no regrouping copies
    t = torch.full((3,), 0.8, dtype=torch.float64, device=device)
    cases = every_operator(device) + [
        (torch.ops.swcli.posterior_per_pair.default, (S, None, None, one_value, t), {}),
        (torch.ops.swcli.affine_posterior_per_pair.default, (S, None, None, one_value - 1, one_value, t), {})]
    for op, args, kwargs in cases:
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        outs = op(*args, **kwargs)
        outs = (outs,) if isinstance(outs, torch.Tensor) else outs
        outputs = [out.untyped_storage().data_ptr() for out in outs if out.numel()]
        assert len(set(outputs)) == len(outputs) and not inputs & set(outputs), op


def test_schemas_are_the_documented_ones():
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.swcli, name).default._schema) == f"swcli::{name}{schema}"


class Aligner(torch.nn.Module):
    """A module as a model builder writes it: scores from a projection, aligned by the op."""

    def __init__(self, temperature):
        super().__init__()
        self.align = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=temperature)

    def forward(self, x, y, qlen=None, tlen=None):
        return self.align(x @ y.transpose(1, 2), qlen, tlen)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_compile_fullgraph_matches_eager(device, temperature, with_lengths):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 13, 8, generator=g).to(device).requires_grad_()
    y = torch.randn(4, 150, 8, generator=g).to(device).requires_grad_()
    lengths = (random_lengths(4, 13, seed=12, low=1).to(device), random_lengths(4, 150, seed=13, low=1).to(device))
    args = (x, y, *lengths) if with_lengths else (x, y)
    model = Aligner(temperature)
    eager = model(*args)
    (gx_eager, gy_eager) = torch.autograd.grad(eager.sum(), (x, y))
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(*args)
    (gx, gy) = torch.autograd.grad(out.sum(), (x, y))
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(gx, gx_eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(gy, gy_eager, rtol=0, atol=1e-5)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_compiled_call_is_one_graph(device):
    torch._dynamo.reset()
    S = random_scores((3, 10, 12), seed=5, dtype=torch.float32, device=device)
    qlen = random_lengths(3, 10, seed=6).to(device)
    explanation = torch._dynamo.explain(lambda S, q: swcli.soft_smith_waterman(S, -1.0, 1.0, q))(S, qlen)
    assert explanation.graph_count == 1
    assert explanation.graph_break_count == 0


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_compiled_call_without_gradients_keeps_no_state(device):
    """A graph compiled where nothing requires grad holds the scores operator, as the eager call runs it,
    not the forward that keeps state for a gradient (whose scores may differ in the last bit)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    S = random_scores((3, 10, 12), seed=7, dtype=torch.float32, device=device)
    recorded = EagerAndRecordGraphs()
    torch.compile(lambda S, q: swcli.soft_smith_waterman(S, -1.0, 1.0, q), backend=recorded, fullgraph=True)(
        S, torch.tensor([10, 0, 3], device=device))
    code = recorded.graphs[0].code
    assert "swcli.scores.default" in code and "swcli.forward" not in code


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_compiled_graph_checks_lengths_on_the_device(device):
    torch._dynamo.reset()
    S = random_scores((3, 10, 12), seed=5, dtype=torch.float32, device=device)
    compiled = torch.compile(lambda S, q: swcli.soft_smith_waterman(S, -1.0, 1.0, q), fullgraph=True)
    good = torch.tensor([10, 0, 3], device=device)
    assert torch.equal(compiled(S, good), swcli.soft_smith_waterman(S, -1.0, 1.0, good))
    if device.type == "cpu":  # on CUDA a failed device-side assert ends the process's CUDA context
        # (named by its dimension: a size formatted while tracing would make it a constant of the graph)
        with pytest.raises(RuntimeError, match=r"^query_lengths must lie in \[0, M\] \(M: the score matrix's size\)$"):
            compiled(S, torch.tensor([11, 0, 3]))


def test_meta_and_fake_tensors_give_shapes():
    S = torch.empty(6, 30, 40, device="meta")
    assert swcli.soft_smith_waterman(S).shape == (6,)
    q = torch.empty(6, 30, dtype=torch.uint8, device="meta")
    t = torch.empty(6, 40, dtype=torch.uint8, device="meta")
    assert torch.ops.swcli.scores_codes(q, t, torch.empty(24, 24, device="meta"), None, None, -1.0, 1.0).shape == (6,)
    # the forward's state has a size only the engine knows: fake tensors (with a shape environment) hold it
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        scores, state, best, failed = torch.ops.swcli.forward(mode.from_tensor(torch.empty(6, 30, 40)), None, None,
                                                              -1.0, 1.0, False)
    assert scores.shape == (6,) and best.shape == (6,) and failed.shape == (1,) and state.dim() == 1


@cuda
@requires_cuda
def test_engines_take_the_same_arguments():
    """One interface: the same call gives the same scores on both engines."""
    device = torch.device("cuda")
    S = random_scores((6, 11, 17), seed=8, dtype=torch.float64, device=device)
    qlen = random_lengths(6, 11, seed=9).to(device)
    tlen = random_lengths(6, 17, seed=10).to(device)
    ops.load_engine(device)
    ops.load_engine("cpu")
    for t in (0.0, 1.0):
        here = torch.ops.swcli.scores(S, qlen, tlen, -1.0, t)
        cpu = torch.ops.swcli.scores(S.cpu(), qlen.cpu(), tlen.cpu(), -1.0, t)
        torch.testing.assert_close(here.cpu(), cpu, rtol=0, atol=1e-9)


def test_cpu_engine_rejects_cuda_knobs():
    ops.load_engine("cpu")
    S = random_scores((2, 5, 5), seed=1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="lane_columns"):
        torch.ops.swcli.scores(S, None, None, -1.0, 1.0, lane_columns=4)
    with pytest.raises(RuntimeError, match="by rows"):
        torch.ops.swcli.forward(S, None, None, -1.0, 1.0, True)


def test_cpu_engine_checks_lengths_itself():
    """Called directly, past the Python checks, the engine refuses lengths outside the matrix."""
    ops.load_engine("cpu")
    S = random_scores((2, 5, 6), seed=1, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="query_lengths"):
        torch.ops.swcli.scores(S, torch.tensor([6, 1]), None, -1.0, 1.0)
    with pytest.raises(RuntimeError, match="target_lengths"):
        torch.ops.swcli.scores(S, None, torch.tensor([-1, 1]), -1.0, 1.0)


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="no engine for xpu"):
        ops.load_engine("xpu")
