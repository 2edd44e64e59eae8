"""torch's transforms of the op: torch.func (grad, jacrev, vmap), torch.compile, torch.export, meta and
fake tensors, torch.jit.trace and torch.jit.script, double backward and forward mode. Each works, with the
eager op's results, or raises the documented error."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import swcli
from swcli import ops
from swcli.testing import random_lengths, random_scores

ssw = swcli.soft_smith_waterman
KINDS = ["linear", "affine"]


def gaps_of(kind: str, value=None) -> dict:
    if kind == "linear":
        return {"gap": -1.0 if value is None else value}
    return {"gap_open": -2.0 if value is None else value, "gap_extend": -0.5}


def batch(seed: int, B=4, M=7, N=6, dtype=torch.float64):
    S = random_scores((B, M, N), seed=seed, dtype=dtype)
    return S, random_lengths(B, M, seed=seed + 1, low=1), random_lengths(B, N, seed=seed + 2, low=1)


# --------------------------------------------------------------------------------------------------
# torch.func


@pytest.mark.parametrize("kind", KINDS)
def test_func_grad_equals_autograd(kind):
    S, qlen, tlen = batch(100)
    gap = torch.tensor(-1.5 if kind == "linear" else -2.0, dtype=torch.float64)
    t = torch.tensor(0.7, dtype=torch.float64)
    extend = {} if kind == "linear" else {"gap_extend": -0.5}

    def loss(S, gap, t):
        gaps = {"gap": gap} if kind == "linear" else {"gap_open": gap}
        return ssw(S, temperature=t, query_lengths=qlen, target_lengths=tlen, **gaps, **extend).sum()

    got = torch.func.grad(loss, argnums=(0, 1, 2))(S, gap, t)
    inputs = [x.clone().requires_grad_() for x in (S, gap, t)]
    expected = torch.autograd.grad(loss(*inputs), inputs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_func_grad_with_number_gaps():
    S, qlen, tlen = batch(110)
    got = torch.func.grad(lambda S: ssw(S, -1.0, 0.5, qlen, tlen).sum())(S)
    Sg = S.clone().requires_grad_()
    (expected,) = torch.autograd.grad(ssw(Sg, -1.0, 0.5, qlen, tlen).sum(), Sg)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_jacrev_of_per_pair_gaps_is_diagonal_gap_counts():
    S, qlen, tlen = batch(120)
    gap = torch.tensor([-0.5, -1.0, -1.5, -2.0], dtype=torch.float64)
    jacobian = torch.func.jacrev(lambda g: ssw(S, g, 1.0, qlen, tlen))(gap)
    gap_r = gap.clone().requires_grad_()
    (counts,) = torch.autograd.grad(ssw(S, gap_r, 1.0, qlen, tlen).sum(), gap_r)
    torch.testing.assert_close(jacobian, torch.diag(counts), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_over_a_batch_of_batches(kind):
    V = 3
    S = random_scores((V, 4, 7, 6), seed=130)
    qlen = random_lengths(4, 7, seed=131)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no per-sample fallback ("performance drop")
        out = torch.vmap(lambda S: ssw(S, temperature=0.5, query_lengths=qlen, **gaps_of(kind)))(S)
        grads = torch.vmap(torch.func.grad(lambda S: ssw(S, temperature=0.5, query_lengths=qlen,
                                                         **gaps_of(kind)).sum()))(S)
    for v in range(V):
        Sv = S[v].clone().requires_grad_()
        expected = ssw(Sv, temperature=0.5, query_lengths=qlen, **gaps_of(kind))
        (expected_grad,) = torch.autograd.grad(expected.sum(), Sv)
        torch.testing.assert_close(out[v], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(grads[v], expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_carries_the_gradient_of_a_tensor_autograd_tracks_outside_it(kind):
    """vmap's batched tensor reads requires_grad False even where autograd outside the transform tracks
    the tensor it wraps: the scores still take the differentiable path, as backward(), grad and jacrev
    of the vmapped function show."""
    S = random_scores((2, 3, 4, 5), seed=135)
    f = torch.vmap(lambda S: ssw(S, temperature=0.8, **gaps_of(kind)))
    flat = S.reshape(6, 4, 5).clone().requires_grad_()
    (expected,) = torch.autograd.grad(ssw(flat, temperature=0.8, **gaps_of(kind)).sum(), flat)
    expected = expected.reshape(S.shape)
    leaf = S.clone().requires_grad_()
    f(leaf).sum().backward()
    torch.testing.assert_close(leaf.grad, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.func.grad(lambda S: f(S).sum())(S), expected, rtol=0, atol=1e-12)
    jacobian = torch.func.jacrev(f)(S)
    torch.testing.assert_close(jacobian.sum((0, 1)), expected, rtol=0, atol=1e-12)
    with torch.no_grad():
        assert not f(leaf).requires_grad


@pytest.mark.parametrize("kind", KINDS)
def test_forward_mode_derivatives_are_a_clear_error(kind):
    S = random_scores((2, 4, 5), seed=137)
    message = "no forward-mode derivative"
    with pytest.raises(RuntimeError, match=message):
        torch.func.jacfwd(lambda S: ssw(S, **gaps_of(kind)))(S)
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(lambda t: ssw(S, temperature=t, **gaps_of(kind)), (torch.tensor(1.0, dtype=S.dtype),),
                       (torch.tensor(1.0, dtype=S.dtype),))
    from torch.autograd import forward_ad
    with forward_ad.dual_level():
        with pytest.raises(RuntimeError, match=message):
            ssw(forward_ad.make_dual(S, torch.ones_like(S)), **gaps_of(kind))
        torch.testing.assert_close(ssw(S, **gaps_of(kind)), ssw(S.clone(), **gaps_of(kind)))  # no tangent


@pytest.mark.parametrize("kind", KINDS)
def test_forward_mode_over_other_inputs_runs(kind):
    """A jvp (or a dual level) that differentiates something other than the op's inputs is no forward-mode
    derivative of the op: it runs, a vmap inside the jvp included, and the tangent is the outside one's."""
    S = random_scores((2, 4, 5), seed=138)
    x, one = torch.tensor(2.0, dtype=S.dtype), torch.tensor(1.0, dtype=S.dtype)
    scores = ssw(S, **gaps_of(kind))
    _, tangent = torch.func.jvp(lambda x: x * ssw(S, **gaps_of(kind)), (x,), (one,))
    torch.testing.assert_close(tangent, scores, rtol=0, atol=0)
    _, tangent = torch.func.jvp(lambda x: x * torch.vmap(lambda s: ssw(s[None], **gaps_of(kind))[0])(S), (x,), (one,))
    torch.testing.assert_close(tangent, scores, rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="no forward-mode derivative"):
        torch.func.jvp(lambda S: torch.vmap(lambda s: ssw(s[None], **gaps_of(kind)))(S), (S,), (S,))
    leaf = S.clone().requires_grad_()
    (expected,) = torch.autograd.grad(ssw(leaf, **gaps_of(kind)).sum(), leaf)
    _, tangent = torch.func.jvp(lambda x: x * torch.func.grad(lambda S: ssw(S, **gaps_of(kind)).sum())(S), (x,), (one,))
    torch.testing.assert_close(tangent, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_reference_backend_takes_forward_mode(kind):
    """The reference loop is plain torch operations: jvp, jacfwd, forward_ad and hessian work on it, and
    agree with its reverse mode."""
    S = random_scores((2, 4, 5), seed=139)
    f = lambda S: ssw(S, temperature=0.9, backend="reference", **gaps_of(kind))  # noqa: E731
    jacobian = torch.func.jacrev(f)(S)
    torch.testing.assert_close(torch.func.jacfwd(f)(S), jacobian, rtol=1e-10, atol=1e-12)
    direction = random_scores((2, 4, 5), seed=140)
    _, tangent = torch.func.jvp(f, (S,), (direction,))
    torch.testing.assert_close(tangent, (jacobian * direction).sum((1, 2, 3)), rtol=1e-10, atol=1e-12)
    from torch.autograd import forward_ad
    with forward_ad.dual_level():
        dual_tangent = forward_ad.unpack_dual(f(forward_ad.make_dual(S, direction))).tangent
    torch.testing.assert_close(dual_tangent, tangent, rtol=1e-10, atol=1e-12)
    hessian = torch.func.hessian(lambda S: f(S).sum())(S)
    expected = torch.autograd.functional.hessian(lambda S: f(S).sum(), S)
    torch.testing.assert_close(hessian, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_over_batches_with_their_own_lengths(kind):
    """A batch of batches of padded pairs comes with lengths of its own: they are checked (all the batches'
    at once) and taken, scores and gradients as each batch alone gives them."""
    S = random_scores((3, 4, 7, 6), seed=150)
    qlen = torch.stack([random_lengths(4, 7, seed=151 + v) for v in range(3)])
    f = lambda S, q: ssw(S, temperature=0.7, query_lengths=q, **gaps_of(kind))  # noqa: E731
    out = torch.vmap(f)(S, qlen)
    grad = torch.func.grad(lambda S: torch.vmap(f)(S, qlen).sum())(S)
    for v in range(3):
        Sv = S[v].clone().requires_grad_()
        expected = f(Sv, qlen[v])
        torch.testing.assert_close(out[v], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad[v], torch.autograd.grad(expected.sum(), Sv)[0], rtol=0, atol=1e-12)
    bad = qlen.clone()
    bad[2, 1] = 8
    with pytest.raises(ValueError, match=r"query_lengths must lie in \[0, 7\] \(M of the score matrix\), got min 0, "
                                         r"max 8"):
        torch.vmap(f)(S, bad)


def test_vmap_over_per_pair_gaps():
    S, qlen, tlen = batch(140)
    gaps = torch.tensor([[-1.0], [-2.0], [-0.5]], dtype=torch.float64).expand(3, 4)
    out = torch.vmap(lambda g: ssw(S, g, 1.0, qlen, tlen))(gaps)
    for v in range(3):
        torch.testing.assert_close(out[v], ssw(S, gaps[v, 0].item(), 1.0, qlen, tlen), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# torch.compile, torch.export, meta tensors


@pytest.mark.parametrize("kind", KINDS)
def test_compile_learnable_module_matches_eager(kind):
    torch._dynamo.reset()
    S, qlen, tlen = batch(200)
    S.requires_grad_()
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=0.7, learnable=True, **extend).double()
    eager = module(S, qlen, tlen)
    eager_grads = torch.autograd.grad(eager.sum(), [S, *module.parameters()])
    compiled = torch.compile(module, fullgraph=True)
    out = compiled(S, qlen, tlen)
    grads = torch.autograd.grad(out.sum(), [S, *module.parameters()])
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-12)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_compiled_posterior_matches_eager():
    torch._dynamo.reset()
    S, qlen, tlen = batch(210)
    for gap in (-1.0, torch.tensor(-1.0, dtype=torch.float64)):
        def f(S):
            return ssw(S, gap, 0.5, qlen, tlen, return_posterior=True)

        got, expected = torch.compile(f, fullgraph=True)(S), f(S)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-12)


def test_compiled_temperature_gradient_at_zero_is_a_clear_error():
    torch._dynamo.reset()
    S, _, _ = batch(215)
    t = torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64, requires_grad=True)
    # The compiled graph may check it in its forward (the check reads the forward's inputs only) or its backward.
    with pytest.raises(RuntimeError, match="not defined at temperature 0"):
        out = torch.compile(lambda S, t: ssw(S, -1.0, t), fullgraph=True)(S, t)
        torch.autograd.grad(out.sum(), t)


def test_compile_before_any_eager_call(tmp_path):
    # The first call of a process compiled: the fake kernel loads the engine while dynamo traces.
    script = tmp_path / "first.py"
    script.write_text(
        "import torch, swcli\n"
        "S = torch.randn(3, 6, 5, dtype=torch.float64)\n"
        "out = torch.compile(lambda S: swcli.soft_smith_waterman(S, -1.0, 0.5), fullgraph=True)(S)\n"
        "assert torch.equal(out, swcli.soft_smith_waterman(S, -1.0, 0.5)), out\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(swcli.__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("kind", KINDS)
def test_export_learnable_module(kind):
    S, qlen, tlen = batch(220)
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=0.7, learnable=True, **extend).double()
    exported = torch.export.export(module, (S, qlen, tlen))
    S2, q2, t2 = batch(221)
    torch.testing.assert_close(exported.module()(S2, q2, t2), module(S2, q2, t2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_pair", [False, True], ids=["numbers", "tensors"])
def test_export_without_gradients_runs_with_them(kind, per_pair):
    """A program exported from an example that needs no gradient holds the differentiable operators: run
    with a score matrix that requires grad, it gives the eager op's gradient."""
    S, qlen, tlen = batch(225)
    gap = torch.full((4,), -1.5, dtype=torch.float64) if per_pair else -1.5

    class Scores(torch.nn.Module):
        def forward(self, S, qlen, tlen):
            return ssw(S, temperature=0.7, query_lengths=qlen, target_lengths=tlen, **gaps_of(kind, gap))

    exported = torch.export.export(Scores(), (S, qlen, tlen))
    S2, q2, t2 = batch(226)
    S2.requires_grad_()
    out, expected = exported.module()(S2, q2, t2), Scores()(S2, q2, t2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    (got,) = torch.autograd.grad(out.sum(), S2)
    (want,) = torch.autograd.grad(expected.sum(), S2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_export_with_dynamic_shapes_checks_lengths_by_the_dimension():
    """Lengths past the score matrix, in a program exported with symbolic sizes: refused, the message naming
    the dimension (not the trace's symbol for it)."""
    class Scores(torch.nn.Module):
        def forward(self, S, qlen):
            return ssw(S, -1.0, 1.0, qlen, None, backend="cpu")

    dim = torch.export.Dim
    exported = torch.export.export(Scores(), (torch.randn(3, 6, 7), torch.tensor([6, 2, 0])),
                                   dynamic_shapes=({0: dim("B"), 1: dim("M"), 2: dim("N")}, {0: dim("B")}))
    S = torch.randn(5, 9, 4)
    torch.testing.assert_close(exported.module()(S, torch.tensor([9, 1, 0, 3, 9])),
                               ssw(S, -1.0, 1.0, torch.tensor([9, 1, 0, 3, 9]), None, backend="cpu"), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"^query_lengths must lie in \[0, M\] \(M: the score matrix's size\)"):
        exported.module()(S, torch.tensor([10, 1, 0, 3, 9]))


@pytest.mark.parametrize("kind", KINDS)
def test_compile_fullgraph_takes_changed_gaps_and_temperature(kind):
    """A number that changes between calls compiles the graph again (a module's temperature set between
    calls too), with the new value's scores."""
    torch._dynamo.reset()
    S, qlen, tlen = batch(230)
    compiled = torch.compile(lambda S, g, t: ssw(S, temperature=t, **gaps_of(kind, g)), fullgraph=True)
    for g, t in ((-1.5, 1.0), (-2.5, 1.0), (-3.0, 0.5), (-3.0, 0.0)):
        torch.testing.assert_close(compiled(S, g, t), ssw(S, temperature=t, **gaps_of(kind, g)), rtol=0,
                                   atol=1e-12)
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, **extend).double()
    compiled_module = torch.compile(module, fullgraph=True)
    compiled_module(S)
    module.temperature = 2.0
    torch.testing.assert_close(compiled_module(S), ssw(S, temperature=2.0, **gaps_of(kind, -1.5)), rtol=0,
                               atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_compile_takes_tensor_gaps_and_temperatures_in_one_graph(kind):
    """0-d tensors that change between calls: one compilation for all of them, each call its own scores."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    S, qlen, tlen = batch(232)
    counter = CompileCounter()
    compiled = torch.compile(lambda S, g, t: ssw(S, temperature=t, **gaps_of(kind, g)), fullgraph=True,
                             backend=counter)
    for k in range(10):
        g, t = -1.0 - 0.25 * k, 0.9 ** k
        got = compiled(S, torch.tensor(g, dtype=S.dtype), torch.tensor(t, dtype=S.dtype))
        torch.testing.assert_close(got, ssw(S, temperature=t, **gaps_of(kind, g)), rtol=0, atol=1e-12)
    assert counter.frame_count == 1


def test_compile_with_lengths_keeps_the_sizes_symbolic():
    """Lengths checked against M and N under dynamic=True: one graph for every size, and lengths past a
    size still refused."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(lambda S, q: ssw(S, -1.0, 0.8, q, None, backend="cpu"), dynamic=True, backend=counter)
    for M in (5, 7, 9, 12):
        S = random_scores((3, M, 6), seed=233 + M, dtype=torch.float64)
        q = torch.tensor([M, 1, M - 2])
        torch.testing.assert_close(compiled(S, q), ssw(S, -1.0, 0.8, q, None, backend="cpu"), rtol=0, atol=1e-12)
    assert counter.frame_count == 1
    with pytest.raises(Exception, match=r"query_lengths must lie in \[0, M\]"):
        compiled(random_scores((3, 8, 6), seed=250, dtype=torch.float64), torch.tensor([9, 1, 1]))


def _transforms_in_graphs(kind):
    """torch.func gradients and torch.compile together, each as (name, run, expected)."""
    S = random_scores((2, 5, 4), seed=236, dtype=torch.float64)
    f = lambda S: torch.func.grad(lambda s: ssw(s, temperature=0.6, **gaps_of(kind)).sum())(S)  # noqa: E731
    S4 = random_scores((2, 2, 5, 4), seed=237, dtype=torch.float64)
    vmapped = lambda S: torch.func.vmap(lambda s: ssw(s, temperature=0.6, **gaps_of(kind)))(S).sum()  # noqa: E731

    def vmap_backward(compile_it):
        leaf = S4.clone().requires_grad_()
        (compile_it(vmapped) if compile_it else vmapped)(leaf).backward()
        return leaf.grad

    runs = [(f"compile(grad) {backend} fullgraph={full}",
             lambda b=backend, full=full: torch.compile(f, backend=b, fullgraph=full)(S), f(S))
            for backend in ("eager", "aot_eager") for full in (False, True)]
    runs.append(("grad(compile)", lambda: torch.func.grad(torch.compile(
        lambda s: ssw(s, temperature=0.6, **gaps_of(kind)).sum(), backend="eager"))(S), f(S)))
    runs += [(f"compile(vmap) then backward, fullgraph={full}",
              lambda full=full: vmap_backward(lambda g: torch.compile(g, backend="eager", fullgraph=full)),
              vmap_backward(None)) for full in (False, True)]
    return runs


@pytest.mark.parametrize("kind", KINDS)
def test_func_gradients_inside_compile_are_right_or_an_error(kind):
    """Inside a compiled graph a transform's tensors read requires_grad False: the call must not record the
    operators without gradient (a silent zero), so each combination gives eager's gradient or raises."""
    torch._dynamo.reset()
    outcomes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, run, expected in _transforms_in_graphs(kind):
            try:
                got = run()
            except Exception as exc:  # noqa: BLE001 (torch's own errors count too: what matters is no number)
                outcomes[name] = type(exc).__name__
                continue
            assert got is not None, name
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-10, msg=name)
            outcomes[name] = "same"
    assert len(outcomes) == 7, outcomes


def test_func_transform_inside_compile_scores_without_gradient():
    S = random_scores((3, 2, 6, 5), seed=239, dtype=torch.float64)
    with torch.no_grad():
        got = torch.compile(lambda S: torch.func.vmap(lambda s: ssw(s, -1.0, 0.6))(S), backend="eager",
                            fullgraph=True)(S)
    torch.testing.assert_close(got, torch.stack([ssw(s, -1.0, 0.6) for s in S]), rtol=0, atol=1e-12)
    # a learnable module, whose repr torch.compile traces
    module = swcli.SoftSmithWaterman(learnable=True).double()
    with torch.no_grad():
        got = torch.compile(lambda S: torch.func.vmap(module)(S), backend="eager", fullgraph=True)(S)
        torch.testing.assert_close(got, torch.stack([module(s) for s in S]), rtol=0, atol=1e-12)


def test_a_saved_program_runs_in_a_new_process_after_load_engine(tmp_path):
    class Scores(torch.nn.Module):
        def forward(self, S):
            return ssw(S, -1.0, 0.7, backend="cpu")

    S = random_scores((3, 6, 5), seed=240, dtype=torch.float64)
    torch.export.save(torch.export.export(Scores(), (S,)), tmp_path / "scores.pt2")
    torch.save(S, tmp_path / "S.pt")
    script = tmp_path / "run.py"
    script.write_text(
        "import sys, torch, swcli\n"
        "swcli.load_engine('cpu')\n"
        "program = torch.export.load(sys.argv[1] + '/scores.pt2').module()\n"
        "torch.save(program(torch.load(sys.argv[1] + '/S.pt')), sys.argv[1] + '/out.pt')\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(Path(swcli.__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), Scores()(S), rtol=0, atol=0)


def test_meta_tensors_with_tensor_parameters_and_gradients():
    S = torch.empty(6, 30, 40, device="meta", requires_grad=True)
    assert ssw(S).shape == (6,)
    assert ssw(S, gap_open=-2.0, gap_extend=-1.0).shape == (6,)
    gap = torch.empty((), device="meta", requires_grad=True)
    scores, posterior = ssw(S, gap, torch.empty(6, device="meta"), return_posterior=True)
    assert scores.shape == (6,) and posterior.shape == (6, 30, 40)
    # with lengths (on the CPU or meta too): their checks are queued, as in a compiled graph
    lengths = torch.tensor([1, 2, 3, 4, 5, 6])
    assert ssw(S, -1.0, 1.0, lengths, lengths.to("meta")).shape == (6,)
    assert ssw(S, gap_open=-2.0, gap_extend=-1.0, query_lengths=lengths).shape == (6,)


def test_fake_tensors_with_lengths():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        S, lengths = torch.empty(6, 30, 40), torch.tensor([1, 2, 3, 4, 5, 6])
        assert ssw(S, -1.0, 1.0, lengths).shape == (6,)
        assert ssw(S, gap_open=-2.0, gap_extend=-1.0, target_lengths=lengths).shape == (6,)


@pytest.mark.parametrize("kind", KINDS)
def test_fake_tensors_with_gradients_take_a_shape_environment(kind):
    """The forward's state has a size only the engine knows: fake tensors with a gradient give the shapes
    where the mode has a shape environment (as torch.compile's and torch.export's have)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()):
        S = torch.empty(3, 7, 9, requires_grad=True)
        scores = ssw(S, **gaps_of(kind))
        scores.sum().backward()
        assert scores.shape == (3,) and S.grad.shape == (3, 7, 9)


# --------------------------------------------------------------------------------------------------
# torch.jit


def _trace(fn, example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated; it still works
        return torch.jit.trace(fn, example)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("learnable", [False, True])
def test_jit_trace_runs_other_batches_with_gradients(kind, learnable):
    extend = {} if kind == "linear" else {"gap_extend": -0.5}
    module = swcli.SoftSmithWaterman(gap_open=-1.5, temperature=0.7, learnable=learnable, **extend).double()
    S, qlen, tlen = batch(300)
    traced = _trace(module, (S, qlen, tlen))  # traced without gradients
    if learnable:  # a step after the trace: the traced module reads the parameters, not their old values
        with torch.no_grad():
            for p in module.parameters():
                p.sub_(0.2)
    S2, q2, t2 = batch(301, B=7, M=5, N=9)
    S2.requires_grad_()
    out, expected = traced(S2, q2, t2), module(S2, q2, t2)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    inputs = [S2, *module.parameters()]
    for a, b in zip(torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(expected.sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_jit_trace_checks_lengths_when_run():
    S, qlen, tlen = batch(310)
    traced = _trace(lambda S, q, t: ssw(S, -1.0, 1.0, q, t), (S, qlen, tlen))
    with pytest.raises(RuntimeError, match=r"query_lengths must lie in \[0, M\] \(M = 7\), got 8"):
        traced(S, torch.tensor([8, 1, 1, 1]), tlen)


def test_jit_trace_of_the_posterior():
    S, qlen, tlen = batch(320)
    f = lambda S: ssw(S, -1.0, 0.5, return_posterior=True)  # noqa: E731
    traced = _trace(f, (S,))
    S2, _, _ = batch(321, B=2, M=9, N=3)
    for a, b in zip(traced(S2), f(S2)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_jit_script_is_a_clear_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match="SoftSmithWaterman cannot be compiled by torch.jit.script"):
            torch.jit.script(swcli.SoftSmithWaterman())
        with pytest.raises(RuntimeError, match="soft_smith_waterman cannot be compiled by torch.jit.script"):
            torch.jit.script(swcli.soft_smith_waterman)


# --------------------------------------------------------------------------------------------------
# Double backward


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tensors", [False, True], ids=["numbers", "tensors"])
def test_double_backward_is_a_clear_error(kind, tensors):
    S = random_scores((2, 4, 5), seed=400).requires_grad_()
    gaps = gaps_of(kind, torch.tensor(-2.0, dtype=torch.float64, requires_grad=True) if tensors else None)
    (grad,) = torch.autograd.grad(ssw(S, temperature=1.0, **gaps).sum(), S, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match=ops.NOT_TWICE_DIFFERENTIABLE.replace("(", r"\(").replace(")", r"\)")):
        torch.autograd.grad(grad.sum(), S)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.gradgradcheck(lambda S: ssw(S, temperature=1.0, backend="cpu", **gaps), (S,))


def test_nested_func_transforms_are_a_clear_error():
    S = random_scores((2, 4, 5), seed=410)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.func.grad(lambda S: torch.func.grad(lambda S: ssw(S).sum())(S).sum())(S)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.func.hessian(lambda g: ssw(S, g).sum())(torch.tensor(-1.0, dtype=torch.float64))
    x = torch.tensor(2.0, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.func.grad(lambda x: torch.func.grad(lambda S: ssw(S * x).sum())(S).sum())(x)
    # an outer grad that does not reach the op's inputs differentiates no gradient of it
    inner = torch.func.grad(lambda S: ssw(S).sum())(S)
    torch.testing.assert_close(torch.func.grad(lambda x: torch.func.grad(lambda S: ssw(S).sum())(S).sum() * x)(x),
                               inner.sum(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tensors", [False, True], ids=["numbers", "tensors"])
def test_autograd_over_a_func_grad_is_a_clear_error(kind, tensors):
    """Ordinary autograd differentiating what torch.func.grad returned: the op's part of it is not
    differentiable, so the outer backward raises where it would have dropped that part."""
    S = random_scores((2, 4, 5), seed=405).requires_grad_()
    gaps = gaps_of(kind, torch.tensor(-2.0, dtype=torch.float64) if tensors else None)
    inner = torch.func.grad(lambda S: ssw(S, temperature=1.0, backend="cpu", **gaps).sum() + (S ** 3).sum())(S)
    assert inner.requires_grad
    with pytest.raises(RuntimeError, match="not differentiable"):
        inner.sum().backward()
    # the first derivative is the eager one, and without a gradient outside, nothing is attached to it
    Sg = S.detach().clone().requires_grad_()
    expected = torch.autograd.grad(ssw(Sg, temperature=1.0, backend="cpu", **gaps).sum() + (Sg ** 3).sum(), Sg)[0]
    torch.testing.assert_close(inner.detach(), expected, rtol=0, atol=1e-12)
    with torch.no_grad():
        plain = torch.func.grad(lambda S: ssw(S, temperature=1.0, backend="cpu", **gaps).sum())(S)
    assert not plain.requires_grad
    plain = torch.func.grad(lambda S: ssw(S, temperature=1.0, backend="cpu", **gaps).sum())(S.detach())
    assert not plain.requires_grad
    # the same with vmap between: each batch's gradient, and the outer backward refused
    batched = torch.vmap(torch.func.grad(lambda S: ssw(S, temperature=1.0, backend="cpu", **gaps).sum()))(S[:, None])
    torch.testing.assert_close(batched[:, 0].detach(), torch.autograd.grad(
        ssw(Sg, temperature=1.0, backend="cpu", **gaps).sum(), Sg)[0], rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="not differentiable"):
        batched.sum().backward()


@pytest.mark.parametrize("kind", KINDS)
def test_functionalize(kind):
    """functionalize alone runs (scores and posterior as eager); under a gradient the engines' autograd
    Functions have no functionalize rule in PyTorch: a clear error, where the reference loop runs."""
    S = random_scores((2, 4, 5), seed=406)
    gaps = gaps_of(kind)
    torch.testing.assert_close(torch.func.functionalize(lambda S: ssw(S, **gaps))(S), ssw(S, **gaps),
                               rtol=0, atol=0)
    posterior = torch.func.functionalize(lambda S: ssw(S, return_posterior=True, **gaps)[1])(S)
    torch.testing.assert_close(posterior, ssw(S, return_posterior=True, **gaps)[1], rtol=0, atol=0)
    loss = lambda S: ssw(S, backend="cpu", **gaps).sum()  # noqa: E731
    for transform in (lambda f: torch.func.grad(torch.func.functionalize(f)),
                      lambda f: torch.func.functionalize(torch.func.grad(f))):
        with pytest.raises(RuntimeError, match="functionalize"):
            transform(loss)(S)
    got = torch.func.grad(torch.func.functionalize(lambda S: ssw(S, backend="reference", **gaps).sum()))(S)
    torch.testing.assert_close(got, torch.func.grad(loss)(S), rtol=1e-9, atol=1e-12)


def test_vmap_of_the_temperature_gradient():
    """vmap over grad by a tensor temperature: each value's d score / d t, and t = 0 a clear error."""
    S = random_scores((2, 4, 5), seed=407)
    t = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    for backend in ("cpu", "reference"):
        got = torch.vmap(torch.func.grad(lambda t: ssw(S, -1.0, t, backend=backend).sum()))(t)
        expected = [torch.func.grad(lambda t: ssw(S, -1.0, t, backend="reference").sum())(v) for v in t]
        torch.testing.assert_close(got, torch.stack(expected), rtol=1e-9, atol=1e-12)
    with pytest.raises(RuntimeError, match="temperature 0"):
        torch.vmap(torch.func.grad(lambda t: ssw(S, -1.0, t, backend="cpu").sum()))(torch.tensor([1.0, 0.0]))


def test_reference_backend_is_twice_differentiable():
    S = random_scores((2, 3, 4), seed=420).requires_grad_()
    gap = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda S, g: ssw(S, g, 1.0, backend="reference"), (S, gap))


def test_a_tensor_escaped_from_an_ended_transform_runs():
    """A tensor kept from inside a grad that has ended, then used under a vmap: no transform of its own is
    active, so nothing is refused, and the scores are those of the tensor it wraps."""
    S = random_scores((2, 4, 5), seed=141)
    leaked = []
    torch.func.grad(lambda S: (leaked.append(S), S.sum())[1])(S)
    out = torch.vmap(lambda s: ssw(leaked[0], backend="cpu") + s.sum())(S)
    torch.testing.assert_close(out, ssw(S, backend="cpu")[None] + S.sum((1, 2))[:, None], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_of_the_reference_posterior(kind):
    S = random_scores((3, 2, 5, 4), seed=241, dtype=torch.float64)
    got = torch.func.vmap(lambda s: ssw(s, temperature=0.8, backend="reference", return_posterior=True,
                                        **gaps_of(kind)))(S)
    for k in range(3):
        scores, posterior = ssw(S[k], temperature=0.8, backend="reference", return_posterior=True, **gaps_of(kind))
        torch.testing.assert_close(got[0][k], scores, rtol=0, atol=1e-12)
        torch.testing.assert_close(got[1][k], posterior, rtol=0, atol=1e-12)
    # and its gradient, through the transform
    grads = torch.func.grad(lambda s: torch.func.vmap(lambda x: ssw(
        x, temperature=0.8, backend="reference", return_posterior=True, **gaps_of(kind))[1].square().sum())(s).sum())(S)
    leaf = S.clone().requires_grad_()
    sum(ssw(leaf[k], temperature=0.8, backend="reference", return_posterior=True, **gaps_of(kind))[1].square().sum()
        for k in range(3)).backward()
    torch.testing.assert_close(grads, leaf.grad, rtol=0, atol=1e-10)


def test_the_reference_checks_its_values_where_they_cannot_be_read():
    # under torch.compile and torch.func the values are not read to the host: their rules run on the device
    S = random_scores((2, 3, 4), seed=242, dtype=torch.float64)
    bad = [({"gap": -0.7, "temperature": torch.tensor(-0.8)}, "temperature must be finite and >= 0"),
           ({"gap": torch.tensor(math.nan), "temperature": 1.0}, "gap must be finite"),
           ({"gap_open": torch.tensor(-0.5), "gap_extend": -1.0, "temperature": 1.0},
            "gap_open must be <= gap_extend")]
    for kwargs, rule in bad:
        with pytest.raises(ValueError, match=rule):
            ssw(S, backend="reference", **kwargs)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=rule):
            torch.compile(lambda s: ssw(s, backend="reference", **kwargs), backend="eager", fullgraph=True)(S)
        with pytest.raises(RuntimeError, match=rule):
            torch.func.vmap(lambda s: ssw(s, backend="reference", **kwargs))(S[None])
    t = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="not defined at temperature 0"):
        torch.compile(lambda s, t: ssw(s, -0.7, t, backend="reference").sum(), backend="eager",
                      fullgraph=True)(S, t).backward()
    good = torch.compile(lambda s, t: ssw(s, -0.7, t, backend="reference"), backend="eager", fullgraph=True)
    torch.testing.assert_close(good(S, torch.tensor(0.8, dtype=torch.float64)), ssw(S, -0.7, 0.8), rtol=0,
                               atol=1e-12)
