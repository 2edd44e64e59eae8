"""Gaps and temperature as tensors (0-d or one per pair), with gradients; the posterior; the learnable
module. The CPU engine against autograd through the float64 reference loop."""

from __future__ import annotations

import math

import pytest
import torch

import swcli
from swcli import ops
from swcli.ops import soft_smith_waterman_codes
from swcli.testing import (
    parameter_gradients,
    random_lengths,
    random_scores,
    reference_gradient,
    window_mask,
)

ssw = swcli.soft_smith_waterman
B, M, N = 6, 9, 8
KINDS = ["linear", "affine"]
FORMS = ["number", "0-d", "per-pair"]


def gap_values(kind: str, form: str, requires_grad: bool = True) -> dict:
    """The gaps of `kind` in `form`: numbers, 0-d tensors or (B,) tensors of distinct values."""
    values = {"gap": (-0.8, -1.3, -0.4)} if kind == "linear" else {"gap_open": (-2.0, -2.6, -1.6),
                                                                    "gap_extend": (-0.5, -0.9, -0.3)}
    out = {}
    for name, (value, low, high) in values.items():
        if form == "number":
            out[name] = value
        elif form == "0-d":
            out[name] = torch.tensor(value, dtype=torch.float64, requires_grad=requires_grad)
        else:
            out[name] = torch.linspace(low, high, B, dtype=torch.float64).requires_grad_(requires_grad)
    return out


def temperature_value(t: float, form: str, requires_grad: bool):
    if form == "number":
        return t
    if form == "0-d":
        return torch.tensor(t, dtype=torch.float64, requires_grad=requires_grad)
    return torch.linspace(0.5 * t, t, B, dtype=torch.float64).requires_grad_(requires_grad)


def padded_batch(seed: int):
    S = random_scores((B, M, N), seed=seed, scale=1.5)
    qlen = random_lengths(B, M, seed=seed + 1)
    tlen = random_lengths(B, N, seed=seed + 2)
    qlen[0], tlen[0] = M, N  # one full pair
    return S, qlen, tlen


# --------------------------------------------------------------------------------------------------
# Gradients by the gaps and the temperature


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
def test_gradients_match_autograd_through_reference(kind, form, t):
    S, qlen, tlen = padded_batch(seed=8000)
    grad_out = random_scores((B,), seed=8003)
    gaps = gap_values(kind, form)
    # d / dt is not defined at t = 0: there the temperature is a constant of the same form
    temperature = temperature_value(t, form, requires_grad=t > 0)
    cpu_scores, cpu = parameter_gradients(S, gaps, temperature, qlen, tlen, grad_out, backend="cpu")
    ref_scores, ref = parameter_gradients(S, gaps, temperature, qlen, tlen, grad_out, backend="reference")
    assert set(cpu) == set(ref) and len(cpu) == 1 + (form != "number") * (len(gaps) + (t > 0))
    torch.testing.assert_close(cpu_scores, ref_scores, rtol=0, atol=1e-9)
    for name in ref:
        assert cpu[name].shape == ref[name].shape
        torch.testing.assert_close(cpu[name], ref[name], rtol=0, atol=1e-9, msg=name)
    assert (cpu["S"][window_mask(B, M, N, qlen, tlen)] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_padding_is_never_read(kind):
    S, qlen, tlen = padded_batch(seed=8050)
    gaps = gap_values(kind, "per-pair")
    t = temperature_value(0.5, "0-d", requires_grad=True)
    scores, grads = parameter_gradients(S, gaps, t, qlen, tlen)
    S[window_mask(B, M, N, qlen, tlen)] = float("nan")
    nan_scores, nan_grads = parameter_gradients(S, gaps, t, qlen, tlen)
    assert torch.equal(scores, nan_scores)
    for name in grads:
        assert torch.equal(grads[name], nan_grads[name]), name


@pytest.mark.parametrize("kind", KINDS)
def test_hard_gap_gradients_count_the_best_alignments_gaps(kind):
    # At t = 0 the gradient is the count on one best alignment: whole numbers, the same as the reference's.
    S, qlen, tlen = padded_batch(seed=8100)
    gaps = gap_values(kind, "per-pair")
    _, grads = parameter_gradients(S, gaps, 0.0, qlen, tlen)
    _, ref = parameter_gradients(S, gaps, 0.0, qlen, tlen, backend="reference")
    for name in gaps:
        assert torch.equal(grads[name], grads[name].round()) and (grads[name] >= 0).all()
        assert torch.equal(grads[name], ref[name])
    assert any(grads[name].sum() > 0 for name in gaps)  # the case has gaps at all


@pytest.mark.parametrize("kind", KINDS)
def test_float32_gradients_close_to_reference(kind):
    S = random_scores((8, 24, 20), seed=8200, dtype=torch.float32)
    gaps = {name: torch.tensor(value, requires_grad=True) for name, value in gap_values(kind, "number").items()}
    t = torch.tensor(0.7, requires_grad=True)
    _, got = parameter_gradients(S, gaps, t)
    _, ref = parameter_gradients(S.double(), {k: v.double() for k, v in gaps.items()}, t.double(),
                                 backend="reference")
    for name in ref:
        # the expected counts and d/dt are sums over the cells: float32's rounding grows with their number
        torch.testing.assert_close(got[name].double(), ref[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_gradcheck_in_s_gaps_and_temperature(kind, with_lengths):
    S = random_scores((3, 4, 5), seed=8300)
    qlen = torch.tensor([4, 2, 3]) if with_lengths else None
    tlen = torch.tensor([5, 5, 2]) if with_lengths else None
    names = list(gap_values(kind, "number"))
    inputs = [S.clone().requires_grad_()]
    inputs += [torch.tensor([value, value - 0.3, value + 0.2], dtype=torch.float64, requires_grad=True)
               for value in gap_values(kind, "number").values()]
    inputs.append(torch.tensor(0.8, dtype=torch.float64, requires_grad=True))

    def scores(S, *rest):
        *gaps, t = rest
        return ssw(S, temperature=t, query_lengths=qlen, target_lengths=tlen, backend="cpu", **dict(zip(names, gaps)))

    assert torch.autograd.gradcheck(scores, tuple(inputs), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_score_is_homogeneous_of_degree_one(kind):
    # score(cS, c gaps, c t) = c score(S, gaps, t): the identity d score / d t is computed from.
    S, qlen, tlen = padded_batch(seed=8400)
    gaps = gap_values(kind, "per-pair", requires_grad=False)
    t = temperature_value(0.6, "per-pair", requires_grad=False)
    base = ssw(S, temperature=t, query_lengths=qlen, target_lengths=tlen, **gaps)
    for c in (0.5, 3.0):
        scaled = ssw(S * c, temperature=t * c, query_lengths=qlen, target_lengths=tlen,
                     **{name: value * c for name, value in gaps.items()})
        torch.testing.assert_close(scaled, base * c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_pairs_with_shared_values_score_as_alone(kind):
    # The engine groups pairs by their values: repeated values, in any order, give each pair's own score.
    S, qlen, tlen = padded_batch(seed=8500)
    pattern = torch.tensor([0, 1, 0, 2, 1, 0])
    gaps = {name: value[pattern] for name, value in gap_values(kind, "per-pair", requires_grad=False).items()}
    t = torch.tensor([1.0, 0.5, 0.0])[pattern].double()
    together = ssw(S, temperature=t, query_lengths=qlen, target_lengths=tlen, **gaps)
    for b in range(B):
        alone = ssw(S[b:b + 1], temperature=t[b].item(), query_lengths=qlen[b:b + 1], target_lengths=tlen[b:b + 1],
                    **{name: value[b].item() for name, value in gaps.items()})
        assert together[b].item() == alone.item()


def test_tensor_values_equal_numbers():
    S, qlen, tlen = padded_batch(seed=8600)
    for kind in KINDS:
        tensors = {name: torch.tensor(value) for name, value in gap_values(kind, "number").items()}  # float32
        numbers = {name: value.item() for name, value in tensors.items()}
        torch.testing.assert_close(ssw(S, temperature=torch.tensor(0.5), query_lengths=qlen, target_lengths=tlen,
                                       **tensors),
                                   ssw(S, temperature=0.5, query_lengths=qlen, target_lengths=tlen, **numbers),
                                   rtol=0, atol=1e-12)


def test_empty_batches_with_tensor_parameters():
    for shape in [(0, 3, 4), (2, 0, 3), (2, 3, 0)]:
        S = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        gap = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
        t = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
        out = ssw(S, gap, t)
        assert out.shape == (shape[0],) and (out == 0).all()
        grads = torch.autograd.grad(out.sum(), (S, gap, t), allow_unused=True)
        assert (grads[0] == 0).all() and grads[1] == 0 and grads[2] == 0


# --------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("bad, message", [
    (dict(gap=torch.ones(2, 3)), r"gap must be a number, a 0-d tensor or a \(6,\) tensor"),
    (dict(gap=torch.ones(5)), r"gap must be a number, a 0-d tensor or a \(6,\) tensor"),
    (dict(gap=torch.tensor(True)), "gap must hold real numbers"),
    (dict(gap=torch.tensor([-1.0, -1, float("nan"), -1, -1, -1])), "gap must be finite; pair 2 has gap = nan"),
    (dict(temperature=torch.tensor([1.0, 1, 1, 1, -0.5, 1])), "temperature must be finite and >= 0; pair 4"),
    (dict(gap=None, gap_open=torch.tensor(-1.0), gap_extend=torch.tensor([-2.0, -0.5, -0.5, -0.5, -0.5, -0.5])),
     "gap_open must be <= gap_extend; pair 0 has gap_open = -1, gap_extend = -2"),
    (dict(gap=None, gap_open=-2.0, gap_extend=torch.tensor(0.5)), "gap_extend must be <= 0"),
    (dict(temperature=torch.tensor(0.0, requires_grad=True)), "not defined at temperature 0"),
])
def test_bad_tensor_parameters_are_clear_errors(bad, message):
    S = random_scores((B, 4, 5), seed=8700)
    arguments = dict(gap=-1.0, temperature=1.0)
    arguments.update(bad)
    if arguments["gap"] is None:
        del arguments["gap"]
    with pytest.raises(ValueError, match=message):
        ssw(S, **arguments)


def test_codes_take_numbers_only():
    q = torch.zeros(2, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="gap must be a finite number here, got a tensor"):
        soft_smith_waterman_codes(q, q, torch.eye(4), torch.tensor(-1.0))


def test_engine_checks_per_pair_values_itself():
    """Called directly, past the Python checks, the engine names the pair whose value is wrong."""
    ops.load_engine("cpu")
    S = random_scores((3, 4, 5), seed=8800)
    good, t = torch.full((3,), -1.0, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"temperature\[1\] must be a finite number >= 0, got -1"):
        torch.ops.swcli.posterior_per_pair(S, None, None, good, torch.tensor([1.0, -1.0, 1.0]).double())
    with pytest.raises(RuntimeError, match=r"gap\[2\] must be a finite number, got inf"):
        torch.ops.swcli.scores_per_pair(S, None, None, torch.tensor([-1.0, -1, math.inf]).double(), t)
    with pytest.raises(RuntimeError, match=r"gap_open\[0\] must be <= gap_extend\[0\]"):
        torch.ops.swcli.affine_scores_per_pair(S, None, None, torch.full((3,), -0.5).double(), good, t)
    with pytest.raises(RuntimeError, match=r"gap_extend\[1\] must be a finite number <= 0"):
        torch.ops.swcli.affine_posterior_per_pair(S, None, None, good, torch.tensor([-1.0, 1.0, -1.0]).double(), t)
    with pytest.raises(RuntimeError, match=r"gap must be a floating-point CPU tensor of shape \(3,\)"):
        torch.ops.swcli.scores_per_pair(S, None, None, good[:2], t)


# --------------------------------------------------------------------------------------------------
# The eager gradient: the forward, then at backward time the engine's backward with the parameters' sums


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["0-d", "per-pair"])
@pytest.mark.parametrize("t", [0.0, 0.6])
def test_eager_gradients_equal_the_posterior_operators(kind, form, t):
    # Two ways to the same gradients: the eager path (forward, then backward_parameters with the incoming
    # gradient) and the posterior operators (the posterior and counts in the forward, scaled in Python).
    S, qlen, tlen = padded_batch(seed=8950)
    gaps = gap_values(kind, form)
    temperature = temperature_value(t, form, requires_grad=t > 0)
    grad_out = random_scores((B,), seed=8951)
    results = {}
    for path, node in (("eager", "_ParametersWithGradientBackward"), ("posterior", "_PosteriorWithGradientBackward")):
        S_in = S.clone().requires_grad_()
        inputs = {name: value.detach().clone().requires_grad_() for name, value in gaps.items()}
        t_in = temperature.detach().clone().requires_grad_(t > 0)
        out = ssw(S_in, temperature=t_in, query_lengths=qlen, target_lengths=tlen, return_posterior=path == "posterior",
                  **inputs)
        scores = out[0] if path == "posterior" else out
        assert type(scores.grad_fn).__name__ == node
        wrt = [S_in, *inputs.values()] + ([t_in] if t > 0 else [])
        results[path] = (scores.detach(), torch.autograd.grad((scores * grad_out).sum(), wrt))
    torch.testing.assert_close(results["eager"][0], results["posterior"][0], rtol=0, atol=1e-12)
    for eager, posterior in zip(results["eager"][1], results["posterior"][1]):
        torch.testing.assert_close(eager, posterior, rtol=0, atol=1e-10)


def test_backward_parameters_sums_are_the_gap_counts_and_the_inner_product():
    ops.load_engine("cpu")
    S, qlen, tlen = padded_batch(seed=8960)
    grad_out = random_scores((B,), seed=8961)
    for t in (0.0, 0.7):
        gap, open_, extend, temperature = (torch.full((B,), x, dtype=torch.float64) for x in (-0.8, -2.0, -0.5, t))
        _, state, best, failed = torch.ops.swcli.forward(S, qlen, tlen, -0.8, t, False)
        grad_S, sums = torch.ops.swcli.backward_parameters(grad_out, S, state, best, failed, qlen, tlen, -0.8, t,
                                                           False)
        assert torch.equal(grad_S, torch.ops.swcli.backward(grad_out, S, state, best, failed, qlen, tlen, -0.8, t,
                                                            False))
        _, posterior, count = torch.ops.swcli.posterior_per_pair(S, qlen, tlen, gap, temperature)
        assert sums.shape == (2, B)
        torch.testing.assert_close(sums[0], grad_out * count, rtol=0, atol=1e-12)
        torch.testing.assert_close(sums[1], (torch.where(grad_S == 0, 0, S * grad_S)).sum(dim=(1, 2)), rtol=0,
                                   atol=1e-12)
        _, state, best, failed = torch.ops.swcli.affine_forward(S, qlen, tlen, -2.0, -0.5, t, False)
        grad_S, sums = torch.ops.swcli.affine_backward_parameters(grad_out, S, state, best, failed, qlen, tlen, -2.0,
                                                                  -0.5, t, False)
        _, _, opened, extended = torch.ops.swcli.affine_posterior_per_pair(S, qlen, tlen, open_, extend, temperature)
        assert sums.shape == (3, B)
        torch.testing.assert_close(sums[:2], torch.stack([grad_out * opened, grad_out * extended]), rtol=0, atol=1e-12)
        torch.testing.assert_close(sums[2], (torch.where(grad_S == 0, 0, S * grad_S)).sum(dim=(1, 2)), rtol=0,
                                   atol=1e-12)


def test_groups_of_equal_values():
    host = torch.tensor([[-1.0, 1.0], [-1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    assert ops._groups(host, "cpu") == [(None, (-1.0, 1.0))]  # one value: the batch as it is, no copy
    host = torch.tensor([[-1.0, 1.0], [-2.0, 1.0], [-1.0, 1.0], [-1.0, 0.5]], dtype=torch.float64)
    groups = {key: index.tolist() for index, key in ops._groups(host, "cpu")}
    assert groups == {(-2.0, 1.0): [1], (-1.0, 0.5): [3], (-1.0, 1.0): [0, 2]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", ["one value", "repeated", "distinct"])
def test_kernels_by_groups_equal_the_cpu_engines(kind, pattern):
    # The CUDA engine's per-pair kernels are the engine operators with numbers, run by groups: on CPU
    # tensors they run the CPU engine's operators and must give the CPU kernels' results, bit for bit.
    S, qlen, tlen = padded_batch(seed=8970)
    index = {"one value": [0] * B, "repeated": [0, 1, 0, 2, 1, 0], "distinct": list(range(B))}[pattern]
    values = [value.detach()[index] for value in gap_values(kind, "per-pair").values()]
    values.append(torch.tensor([1.0, 0.5, 0.0, 0.3, 2.0, 0.7]).double()[index])
    posterior_op = torch.ops.swcli.posterior_per_pair if kind == "linear" else torch.ops.swcli.affine_posterior_per_pair
    scores_op = torch.ops.swcli.scores_per_pair if kind == "linear" else torch.ops.swcli.affine_scores_per_pair
    for got, expected in zip(ops._posterior_per_pair_by_groups(S, qlen, tlen, *values),
                             posterior_op(S, qlen, tlen, *values)):
        assert torch.equal(got, expected)
    assert torch.equal(ops._scores_per_pair_by_groups(S, qlen, tlen, *values), scores_op(S, qlen, tlen, *values))


def test_kernels_by_groups_check_values_as_the_cpu_engine():
    """The CUDA kernels' checks, run here on CPU tensors: the CPU engine's messages, the pair named."""
    S = random_scores((3, 4, 5), seed=8800)
    good, t = torch.full((3,), -1.0, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for kernel in (ops._posterior_per_pair_by_groups, ops._scores_per_pair_by_groups):
        with pytest.raises(RuntimeError, match=r"temperature\[1\] must be a finite number >= 0, got -1"):
            kernel(S, None, None, good, torch.tensor([1.0, -1.0, 1.0]).double())
        with pytest.raises(RuntimeError, match=r"gap\[2\] must be a finite number, got inf"):
            kernel(S, None, None, torch.tensor([-1.0, -1, math.inf]).double(), t)
        with pytest.raises(RuntimeError, match=r"gap_open\[0\] must be <= gap_extend\[0\], got -0.5 > -1"):
            kernel(S, None, None, torch.full((3,), -0.5).double(), good, t)
        with pytest.raises(RuntimeError, match=r"gap_extend\[1\] must be a finite number <= 0, got 1"):
            kernel(S, None, None, good, torch.tensor([-1.0, 1.0, -1.0]).double(), t)
        with pytest.raises(RuntimeError, match=r"gap must be a floating-point tensor of shape \(3,\) on the scores'"):
            kernel(S, None, None, good[:2], t)
        # an empty batch reads nothing
        empty = kernel(S[:0], None, None, good[:0], t[:0])
        assert (empty[0] if isinstance(empty, tuple) else empty).shape == (0,)


# --------------------------------------------------------------------------------------------------
# The posterior


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("tensors", [False, True], ids=["numbers", "tensors"])
@pytest.mark.parametrize("t", [0.0, 0.5])
def test_posterior_is_the_gradient(kind, backend, tensors, t):
    S, qlen, tlen = padded_batch(seed=8900)
    gaps = gap_values(kind, "0-d" if tensors else "number", requires_grad=False)
    temperature = torch.tensor(t) if tensors else t
    scores, posterior = ssw(S, temperature=temperature, query_lengths=qlen, target_lengths=tlen, backend=backend,
                            return_posterior=True, **gaps)
    gap, extend = (gaps["gap"], None) if kind == "linear" else (gaps["gap_open"], gaps["gap_extend"])
    as_number = (lambda x: x.item() if isinstance(x, torch.Tensor) else x)
    expected_scores, expected = reference_gradient(S, as_number(gap), t, qlen, tlen, torch.ones(B),
                                                   gap_extend=None if extend is None else as_number(extend))
    assert posterior.shape == S.shape and posterior.dtype == S.dtype and not posterior.requires_grad
    torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-9)
    torch.testing.assert_close(posterior, expected, rtol=0, atol=1e-9)
    assert (posterior[window_mask(B, M, N, qlen, tlen)] == 0).all()
    assert (posterior >= -1e-12).all() and (posterior <= 1 + 1e-12).all()


@pytest.mark.parametrize("tensors", [False, True], ids=["numbers", "tensors"])
def test_scores_with_posterior_stay_differentiable(tensors):
    S = random_scores((4, 7, 6), seed=9000).requires_grad_()
    gap = torch.tensor(-1.0, dtype=torch.float64) if tensors else -1.0
    scores, posterior = ssw(S, gap, 0.7, return_posterior=True)
    (grad,) = torch.autograd.grad(scores.sum(), S)
    torch.testing.assert_close(grad, posterior, rtol=0, atol=1e-12)
    with torch.no_grad():
        quiet_scores, quiet_posterior = ssw(S, gap, 0.7, return_posterior=True)
    assert not quiet_scores.requires_grad and torch.equal(quiet_posterior, posterior)


def test_posterior_of_half_precision_has_the_input_dtype():
    S = random_scores((2, 5, 6), seed=9100, dtype=torch.float16)
    scores, posterior = ssw(S, -1.0, 1.0, return_posterior=True)
    assert scores.dtype == posterior.dtype == torch.float16 and posterior.shape == S.shape


def test_reference_posterior_is_twice_differentiable():
    S = random_scores((2, 4, 5), seed=9200).requires_grad_()
    _, posterior = ssw(S, -1.0, 1.0, backend="reference", return_posterior=True)
    (second,) = torch.autograd.grad(posterior.sum(), S)
    assert second.shape == S.shape and second.abs().sum() > 0


@pytest.mark.parametrize("affine", [False, True])
def test_codes_posterior_equals_dense(affine):
    g = torch.Generator().manual_seed(9300)
    q = torch.randint(0, 4, (3, 7), generator=g, dtype=torch.uint8)
    t = torch.randint(0, 4, (3, 9), generator=g, dtype=torch.uint8)
    matrix = torch.randn(4, 4, generator=g)
    qlen, tlen = torch.tensor([7, 3, 5]), torch.tensor([9, 9, 2])
    gaps = dict(gap_open=-2.0, gap_extend=-0.5) if affine else dict(gap=-1.0)
    scores, posterior = soft_smith_waterman_codes(q, t, matrix, temperature=0.5, query_lengths=qlen,
                                                        target_lengths=tlen, return_posterior=True, **gaps)
    S = matrix[q.long()[:, :, None], t.long()[:, None, :]]
    dense_scores, dense = ssw(S, temperature=0.5, query_lengths=qlen, target_lengths=tlen, return_posterior=True,
                              **gaps)
    torch.testing.assert_close(posterior, dense, rtol=0, atol=0)
    torch.testing.assert_close(scores, dense_scores, rtol=0, atol=0)
    plain = soft_smith_waterman_codes(q, t, matrix, temperature=0.5, query_lengths=qlen, target_lengths=tlen,
                                            **gaps)
    torch.testing.assert_close(scores, plain, rtol=0, atol=1e-5)
    # one dtype rule with or without the posterior: float32 on the engines, the matrix's on the reference
    for dtype in (torch.float16, torch.float64):
        for backend, expected in (("cpu", torch.float32), ("reference", dtype)):
            kw = dict(temperature=0.5, query_lengths=qlen, target_lengths=tlen, backend=backend, **gaps)
            alone = soft_smith_waterman_codes(q, t, matrix.to(dtype), **kw)
            scores, posterior = soft_smith_waterman_codes(q, t, matrix.to(dtype), return_posterior=True, **kw)
            assert alone.dtype == scores.dtype == posterior.dtype == expected
            # (the reference's posterior call computes half precision in float32, as soft_smith_waterman does)
            torch.testing.assert_close(scores, alone, rtol=0, atol=1e-2 if expected == torch.float16 else 1e-5)


# --------------------------------------------------------------------------------------------------
# The learnable module


@pytest.mark.parametrize("affine", [False, True])
def test_learnable_module_holds_parameters_with_gradients(affine):
    extend = dict(gap_extend=-0.5) if affine else {}
    module = swcli.SoftSmithWaterman(gap_open=-2.0, temperature=0.8, learnable=True, **extend).double()
    names = dict(module.named_parameters())
    assert set(names) == ({"gap_open", "gap_extend", "log_temperature"} if affine else {"gap_open", "log_temperature"})
    assert module.temperature.item() == pytest.approx(0.8)
    S, qlen, tlen = padded_batch(seed=9400)
    out = module(S, qlen, tlen)
    out.sum().backward()
    gaps = {"gap_open": torch.tensor(-2.0), **({"gap_extend": torch.tensor(-0.5)} if affine else {})}
    if not affine:
        gaps = {"gap": gaps["gap_open"]}
    t = module.temperature.detach().clone()  # exp of the float32 log(0.8), in float64
    expected_scores, expected = parameter_gradients(
        S, {k: v.double().requires_grad_() for k, v in gaps.items()}, t.requires_grad_(), qlen, tlen,
        backend="reference")
    torch.testing.assert_close(out.detach(), expected_scores, rtol=0, atol=1e-9)
    torch.testing.assert_close(module.gap_open.grad, expected["gap_open" if affine else "gap"], rtol=0, atol=1e-9)
    # log parameter: d / d log t = t d / dt
    torch.testing.assert_close(module.log_temperature.grad, t * expected["temperature"], rtol=0, atol=1e-9)
    assert "learnable=" in repr(module)


def test_learnable_names_and_temperature_setter():
    module = swcli.SoftSmithWaterman(gap_open=-2.0, gap_extend=-0.5, learnable=("gap_extend",))
    assert [name for name, _ in module.named_parameters()] == ["gap_extend"]
    assert module.gap_open == -2.0 and module.temperature == 1.0
    module.temperature = 0.5
    assert module.temperature == 0.5
    learned = swcli.SoftSmithWaterman(learnable="temperature")
    learned.temperature = 2.0
    assert learned.temperature.item() == pytest.approx(2.0) and learned.log_temperature.item() == pytest.approx(
        math.log(2.0))
    plain = swcli.SoftSmithWaterman()
    assert list(plain.parameters()) == [] and "learnable" not in repr(plain)
    per_pair = swcli.SoftSmithWaterman(gap_open=torch.tensor([-1.0, -2.0]), temperature=torch.tensor([1.0, 0.5]))
    assert repr(per_pair) == ("SoftSmithWaterman(gap_open=tensor of shape (2,), temperature=tensor of shape (2,), "
                              "backend='auto')")


def test_learnable_module_under_parametrize():
    """Constraints through torch.nn.utils.parametrize (which moves a parameter out of _parameters): the
    module still reads its temperature and gaps, lists them as learnable, learns them, and sets the
    temperature through the parametrization's right_inverse."""
    from torch.nn.utils import parametrize

    class Clamped(torch.nn.Module):
        def forward(self, x):
            return x.clamp(max=0.0)

        def right_inverse(self, x):
            return x

    module = swcli.SoftSmithWaterman(gap_open=-2.0, gap_extend=-0.5, temperature=0.7, learnable=True).double()
    plain = swcli.SoftSmithWaterman(gap_open=-2.0, gap_extend=-0.5, temperature=0.7).double()
    parametrize.register_parametrization(module, "log_temperature", torch.nn.Identity())
    parametrize.register_parametrization(module, "gap_extend", Clamped())
    S = torch.randn(3, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(module(S), plain(S), rtol=1e-6, atol=0)  # log(0.7) was held in float32
    assert "learnable=('gap_open', 'gap_extend', 'temperature')" in repr(module)
    module(S).sum().backward()
    assert module.parametrizations.log_temperature.original.grad is not None
    assert module.parametrizations.gap_extend.original.grad is not None
    with pytest.raises(Exception, match="right_inverse"):  # Identity has none: torch's own error
        module.temperature = 2.0
    parametrize.remove_parametrizations(module, "log_temperature")
    parametrize.register_parametrization(module, "log_temperature", Clamped())  # t <= 1
    module.temperature = 0.5
    assert module.temperature.item() == pytest.approx(0.5)


def test_learnable_module_takes_one_value_tensors_and_names_an_underflowed_temperature():
    module = swcli.SoftSmithWaterman(gap_open=torch.tensor(-2.0), temperature=torch.tensor(0.5), learnable=True)
    assert isinstance(module.gap_open, torch.nn.Parameter) and module.gap_open.item() == -2.0
    assert module.temperature.item() == pytest.approx(0.5)
    module.temperature = torch.tensor(0.25)
    assert module.temperature.item() == pytest.approx(0.25)
    with torch.no_grad():
        module.log_temperature.fill_(-104.0)  # exp underflows to 0 in float32
    with pytest.raises(ValueError, match=r"a log_temperature under about -103 underflows to 0 in float32"):
        module(torch.randn(2, 4, 5))
    assert len(ops.TEMPERATURE_GRADIENT_AT_ZERO) < 255  # torch._assert_async's limit on CUDA


@pytest.mark.parametrize("arguments, message", [
    (dict(learnable=1), r"learnable is True, False, or names among gap_open, gap_extend, temperature; got 1"),
    (dict(temperature=0.0, learnable=True), "a learnable temperature must be > 0"),
    (dict(learnable=("gap_extend",)), "gap_extend can only be learned with affine gaps"),
    (dict(learnable=("gap",)), "learnable names one of gap_open, gap_extend, temperature"),
    (dict(gap_open=float("nan"), learnable=True), "gap_open must be a finite number"),
])
def test_learnable_module_errors(arguments, message):
    with pytest.raises(ValueError, match=message):
        swcli.SoftSmithWaterman(**arguments)


@pytest.mark.parametrize("arguments, message", [
    ({"gap": -1.0, "temperature": torch.tensor(-1.0)}, "temperature must be finite and >= 0"),
    ({"gap": None, "gap_open": torch.tensor(0.0), "gap_extend": -1.0}, "gap_open must be <= gap_extend"),
    ({"gap": torch.tensor([-1.0, -1.0, -1.0]), "temperature": 1.0}, r"a \(2,\) tensor"),
    ({"gap": torch.tensor(float("nan")), "temperature": 1.0}, "gap must be finite"),
    ({"gap": -1.0, "temperature": torch.tensor(0.0, requires_grad=True)}, "not defined at temperature 0"),
])
def test_the_reference_checks_tensor_parameters_as_the_engines(arguments, message):
    S = torch.randn(2, 4, 5)
    for backend in ("cpu", "reference"):
        with pytest.raises(ValueError, match=message):
            swcli.soft_smith_waterman(S, backend=backend, **arguments)


def test_fake_tensors_take_tensor_parameters():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert swcli.soft_smith_waterman(torch.randn(2, 4, 5), torch.tensor(-1.0), 0.5).shape == (2,)


def test_return_posterior_must_be_a_bool_and_the_learnable_temperature_positive():
    S = torch.randn(2, 4, 5)
    with pytest.raises(ValueError, match="return_posterior must be True or False"):
        swcli.soft_smith_waterman(S, -1.0, 1.0, return_posterior=1)
    codes = torch.zeros(2, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="return_posterior must be True or False"):
        soft_smith_waterman_codes(codes, codes, torch.zeros(24, 24), -1.0, 1.0, return_posterior="no")
    module = swcli.SoftSmithWaterman(gap_open=-1.0, temperature=1.0, learnable=True)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="a learnable temperature must be > 0"):
            module.temperature = bad
